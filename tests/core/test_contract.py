"""The public function signatures and record type of docs/sql-api.md, as installed at head."""

from __future__ import annotations

import pytest

from tests.core.engine import Engine

pytestmark = pytest.mark.slow

EXPECTED = {
    "add_step": (
        (
            "flow_slug text, step_slug text, deps_slugs text[] DEFAULT '{}'::text[], "
            "max_attempts integer DEFAULT NULL::integer, base_delay integer DEFAULT NULL::integer, "
            "timeout integer DEFAULT NULL::integer, start_delay integer DEFAULT NULL::integer, "
            "step_type text DEFAULT 'single'::text, "
            "required_input_pattern jsonb DEFAULT NULL::jsonb, "
            "forbidden_input_pattern jsonb DEFAULT NULL::jsonb, "
            "when_unmet text DEFAULT 'skip'::text, "
            "when_exhausted text DEFAULT 'fail'::text, queue_name text DEFAULT NULL::text, "
            "child_flow text DEFAULT NULL::text, concurrency_limit integer DEFAULT NULL::integer, "
            "concurrency_key text DEFAULT NULL::text, compensate text DEFAULT NULL::text, "
            "cache_ttl integer DEFAULT NULL::integer, cache_key text[] DEFAULT NULL::text[], "
            "cache_fingerprint text DEFAULT NULL::text"
        ),
        "flowlane.steps",
    ),
    "await_queue_inserts": ("queue_name text, timeout_ms integer DEFAULT 50", "boolean"),
    "calculate_retry_delay": ("base_delay integer, attempts integer", "integer"),
    "complete_task": (
        (
            "run_id uuid, step_slug text, task_index integer, output jsonb, "
            "worker_id uuid DEFAULT NULL::uuid, attempt integer DEFAULT NULL::integer"
        ),
        "SETOF flowlane.step_tasks",
    ),
    "claim_tasks": (
        "queue_name text, qty integer, worker_id uuid, supported_pairs jsonb",
        "SETOF flowlane.claim_record",
    ),
    "complete_tasks": ("results jsonb", "SETOF flowlane.step_tasks"),
    "create_flow": (
        (
            "flow_slug text, max_attempts integer DEFAULT NULL::integer, "
            "base_delay integer DEFAULT NULL::integer, timeout integer DEFAULT NULL::integer, "
            "queue_mode text DEFAULT 'flow'::text, "
            "retention integer DEFAULT flowlane._flow_option_default('retention'::text), "
            "deadline integer DEFAULT NULL::integer, "
            "dedup_key text DEFAULT NULL::text, concurrency_limit integer DEFAULT NULL::integer, "
            "concurrency_key text DEFAULT NULL::text, priority integer DEFAULT NULL::integer, "
            "concurrency_when_full text DEFAULT NULL::text, debounce_key text DEFAULT NULL::text, "
            "debounce_period integer DEFAULT NULL::integer, debounce_max_wait integer DEFAULT NULL::integer, "
            "on_failure text DEFAULT NULL::text, on_failure_on_cancel boolean DEFAULT false"
        ),
        "flowlane.flows",
    ),
    "delete_flow_and_data": ("flow_slug text", "void"),
    "enable_queue_notify": ("queue_name text", "boolean"),
    "ensure_flow_compiled": ("flow_slug text, shape jsonb", "jsonb"),
    "ensure_flow_shape": ("flow_slug text, shape jsonb", "void"),
    "extend_leases": ("worker_id uuid, tasks jsonb", "integer"),
    "fail_tasks": ("results jsonb", "SETOF flowlane.step_tasks"),
    "fail_task": (
        (
            "run_id uuid, step_slug text, task_index integer, error_message text, "
            "worker_id uuid DEFAULT NULL::uuid, attempt integer DEFAULT NULL::integer"
        ),
        "SETOF flowlane.step_tasks",
    ),
    "get_flow_shape": ("flow_slug text", "jsonb"),
    "get_run_with_states": ("run_id uuid", "jsonb"),
    "heartbeat": ("worker_id uuid", "boolean"),
    "worker_is_live": ("w flowlane.workers", "boolean"),
    "worker_stale_after": ("", "interval"),
    "is_valid_queue_name": ("queue_name text", "boolean"),
    "is_valid_slug": ("slug text", "boolean"),
    "json_depth_exceeds": ("value jsonb, max_depth integer", "boolean"),
    "json_limits": ("", "jsonb"),
    "mark_worker_stopped": ("worker_id uuid", "void"),
    "register_worker": (
        "worker_id uuid, queue_name text, worker_name text, deployment_name text, supported_pairs jsonb",
        "flowlane.workers",
    ),
    "requeue_stalled_tasks": ("", "integer"),
    "resolve_flow": ("flow_slug_or_alias text", "text"),
    # aliases
    "set_alias": (
        "alias text, flow_slug text, draining text[] DEFAULT '{}'::text[]",
        "flowlane.aliases",
    ),
    "start_flows": (
        ("flow_slug text, inputs jsonb[], "
         "start_at timestamp with time zone DEFAULT NULL::timestamp with time zone, "
         "priority integer DEFAULT NULL::integer"),
        "SETOF flowlane.runs",
    ),
    "start_flow": (
        (
            "flow_slug text, input jsonb, run_id uuid DEFAULT NULL::uuid, "
            "start_at timestamp with time zone DEFAULT NULL::timestamp with time zone, "
            "idempotency_key text DEFAULT NULL::text, priority integer DEFAULT NULL::integer"
        ),
        "flowlane.runs",
    ),
    "start_ready_steps": ("run_id uuid", "void"),
    "stuck_runs": (
        "",
        "TABLE(run_id uuid, flow_slug text, started_at timestamp with time zone, reason text)",
    ),
    "start_tasks": (
        "queue_name text, msg_ids bigint[], worker_id uuid, supported_pairs jsonb",
        "SETOF flowlane.claim_record",
    ),
    # shared queues and worker deployments
    "adopt_queue": ("queue_name text", "flowlane.queues"),
    "begin_rollout": ("deployments text[]", "flowlane.rollouts"),
    "coverage": (
        "queue_name text, supported_pairs jsonb",
        "TABLE(flow_slug text, step_slug text, sources text[])",
    ),
    "definitions_fingerprint": ("", "text"),
    "drain_status": (
        "",
        "TABLE(alias text, flow_slug text, started_runs bigint, active_tasks bigint, drained boolean)",
    ),
    "finish_rollout": ("rollout_id bigint", "flowlane.rollouts"),
    "is_valid_deployment_name": ("deployment_name text", "boolean"),
    "record_worker_refusal": (
        "queue_name text, deployment_name text, reason text, hint text DEFAULT NULL::text",
        "flowlane.worker_refusals",
    ),
    "set_deployment_enabled": (
        "deployment_name text, enabled boolean, reason text DEFAULT NULL::text",
        "flowlane.worker_deployments",
    ),
    "verify_flow": ("flow_slug text, shape jsonb", "jsonb"),
    # run operations
    "cancel_run": ("run_id uuid, reason text DEFAULT NULL::text", "flowlane.runs"),
    "fail_task_detailed": (
        (
            "run_id uuid, step_slug text, task_index integer, error_message text, "
            "worker_id uuid DEFAULT NULL::uuid, attempt integer DEFAULT NULL::integer, "
            "error_type text DEFAULT NULL::text, traceback text DEFAULT NULL::text"
        ),
        "SETOF flowlane.step_tasks",
    ),
    "get_run_attempts": ("run_id uuid", "jsonb"),
    "get_run_waits": ("run_id uuid", "jsonb"),
    "get_run_compensations": ("run_id uuid", "jsonb"),
    "get_run_family": ("run_id uuid", "jsonb"),
    "signal": ("run_id uuid, step_slug text, payload jsonb DEFAULT '{}'::jsonb", "flowlane.signals"),
    "expire_waits": ("p_now timestamp with time zone DEFAULT flowlane._now()", "integer"),
    "retry_run": ("run_id uuid", "flowlane.runs"),
    "retry_compensation": ("run_id uuid", "flowlane.runs"),
    "retry_run_from": ("run_id uuid, step_slug text", "flowlane.runs"),
    "retry_runs": ("run_ids uuid[]", "SETOF uuid"),
    "cancel_runs": ("run_ids uuid[], reason text DEFAULT NULL::text", "SETOF uuid"),
    # retention, metrics and traces
    "override_task": (
        "run_id uuid, step_slug text, task_index integer, output jsonb, reason text",
        "SETOF flowlane.step_tasks",
    ),
    "pgmq_metrics": ("", "SETOF pgmq.metrics_result"),
    "prune_runs": (
        (
            "p_now timestamp with time zone DEFAULT flowlane._now(), p_flows text[] DEFAULT NULL::text[], "
            "p_older_than integer DEFAULT NULL::integer, p_batch integer DEFAULT 500"
        ),
        (
            "TABLE(runs_deleted integer, steps_deleted integer, tasks_deleted integer, "
            "attempts_deleted integer, messages_deleted integer)"
        ),
    ),
    "prunable_runs": (
        (
            "p_now timestamp with time zone DEFAULT flowlane._now(), p_flows text[] DEFAULT NULL::text[], "
            "p_older_than integer DEFAULT NULL::integer"
        ),
        "TABLE(flow_slug text, runs bigint, oldest_ended_at timestamp with time zone)",
    ),
    "queue_metrics": (
        "p_stale_after integer DEFAULT 30",
        (
            "TABLE(queue_name text, depth bigint, oldest_age_seconds integer, live_workers bigint, "
            "disabled_deployments bigint)"
        ),
    ),
    "trace_parents": (
        "run_ids uuid[]",
        "TABLE(run_id uuid, trace_parent text)",
    ),
    # queue depth
    "queue_depth": (
        "p_queue text",
        "bigint",
    ),
    # data contracts
    "set_contract": (
        "flow_slug text, step_slug text, schema jsonb",
        "void",
    ),
    "contract_violation": (
        "schema jsonb, instance jsonb",
        "jsonb",
    ),
    "contract_keywords": (
        "",
        "text[]",
    ),
    # single results and run listeners
    "listen_run_finished": ("", "void"),
    "unlisten_run_finished": ("", "void"),
    # time
    "maintenance_tick": ("p_now timestamp with time zone DEFAULT flowlane._now()", "jsonb"),
    "run_deadline": ("run_id uuid", "timestamp with time zone"),
    "set_schedule": (
        (
            "schedule_name text, flow_name text, input jsonb DEFAULT '{}'::jsonb, "
            "cron text DEFAULT NULL::text, cron_minutes integer[] DEFAULT NULL::integer[], "
            "cron_hours integer[] DEFAULT NULL::integer[], cron_days integer[] DEFAULT NULL::integer[], "
            "cron_months integer[] DEFAULT NULL::integer[], "
            "cron_weekdays integer[] DEFAULT NULL::integer[], every_seconds integer DEFAULT NULL::integer, "
            "timezone text DEFAULT 'UTC'::text, overlap text DEFAULT 'skip'::text, "
            "catch_up text DEFAULT 'latest'::text"
        ),
        "flowlane.schedules",
    ),
    "keep_only_schedules": ("schedule_names text[]", "text[]"),
    "set_schedule_paused": (
        "schedule_name text, paused boolean, reason text DEFAULT NULL::text", "flowlane.schedules"),
    "trigger_schedule": ("schedule_name text, input jsonb DEFAULT NULL::jsonb", "flowlane.runs"),
    # flow control
    "set_queue_limits": (
        ("queue_name text, concurrency integer, rate_limit integer, rate_per integer,"
         " archive boolean DEFAULT true"),
        "flowlane.queue_limits",
    ),
    "keep_only_queue_limits": ("queue_names text[]", "text[]"),
    "run_holds": (
        "run_ids uuid[]",
        "TABLE(run_id uuid, step_slug text, task_index integer, waiting_for text, place bigint)",
    ),
    "queue_flow_control": (
        "",
        (
            "TABLE(queue_name text, concurrency integer, started bigint, rate_limit integer, "
            "rate_per integer, tokens double precision, next_start_in double precision, waiting_for text)"
        ),
    ),
    # events in
    "set_trigger": (
        (
            "trigger_name text, flow_name text, table_name text, events text[], "
            "when_pattern jsonb DEFAULT NULL::jsonb, unless_pattern jsonb DEFAULT NULL::jsonb, "
            "input_map jsonb DEFAULT NULL::jsonb, key_pointer text DEFAULT NULL::text, "
            "on_refused text DEFAULT 'fail'::text"
        ),
        "flowlane.triggers",
    ),
    "keep_only_triggers": ("trigger_names text[]", "text[]"),
    "trigger_activity": (
        "",
        (
            "TABLE(trigger_name text, flow_name text, table_name text, events text[], on_refused text, "
            "runs bigint, runs_last_day bigint, last_run_at timestamp with time zone, refusals bigint, "
            "last_error text, last_error_at timestamp with time zone)"
        ),
    ),
}


def test_public_function_signatures(engine: Engine) -> None:
    rows = engine.rows(
        "select p.proname, pg_get_function_arguments(p.oid) as args, "
        "pg_get_function_result(p.oid) as result from pg_proc p "
        "where p.pronamespace = 'flowlane'::regnamespace and p.proname !~ '^_' order by 1, 2"
    )
    found = {r["proname"]: (r["args"], r["result"]) for r in rows}
    assert len(rows) == len(found), "no public function is overloaded"
    assert found == EXPECTED


def test_claim_record_fields(engine: Engine) -> None:
    fields = engine.rows(
        "select a.attname, format_type(a.atttypid, a.atttypmod) as type "
        "from pg_attribute a "
        "where a.attrelid = 'flowlane.claim_record'::regclass and a.attnum > 0 "
        "order by a.attnum"
    )
    assert [(f["attname"], f["type"]) for f in fields] == [
        ("outcome", "text"),
        ("flow_slug", "text"),
        ("step_slug", "text"),
        ("queue_name", "text"),
        ("run_id", "uuid"),
        ("task_index", "integer"),
        ("input", "jsonb"),
        ("flow_input", "jsonb"),
        ("attempt", "integer"),
        ("msg_id", "bigint"),
    ]


def test_task_statuses(engine: Engine) -> None:
    source = engine.scalar("select pg_get_functiondef('flowlane._step_tasks_rules'::regproc)")
    (rule,) = [line for line in source.splitlines() if "'step_tasks_status_valid'" in line]
    for status in ("queued", "started", "completed", "failed", "skipped", "cancelled"):
        assert f"'{status}'" in rule
