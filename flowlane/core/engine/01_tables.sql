-- Tables and their indexes, in the order their foreign keys need. A table changes only through
-- a migration a person writes (ALTER TABLE): the drafting tool flags the difference.

create table flowlane.queues (
  queue_name text not null,
  ownership text default 'owned' not null,
  owner_flow_slug text,
  created_at timestamptz default now() not null,
  pgmq_queue_name text not null,
  adopted_at timestamptz,
  prioritized boolean default false not null,
  archive_messages boolean default true not null,
  constraint queues_pkey primary key (queue_name),
  constraint queues_name_canonical check (flowlane.is_valid_queue_name(queue_name)),
  constraint queues_owner_iff_owned check ((ownership = 'owned') = (owner_flow_slug is not null)),
  constraint queues_ownership_valid check (ownership in ('owned', 'shared')),
  constraint queues_pgmq_spelling check (lower(pgmq_queue_name) = queue_name)
);

create index queues_owner_idx on flowlane.queues (owner_flow_slug);

create table flowlane.flows (
  flow_slug text not null,
  opt_max_attempts int default flowlane._flow_option_default('max_attempts') not null,
  opt_base_delay int default flowlane._flow_option_default('base_delay') not null,
  opt_timeout int default flowlane._flow_option_default('timeout') not null,
  created_at timestamptz default now() not null,
  queue_mode text default 'flow' not null,
  shape_sealed_at timestamptz,
  opt_retention int default flowlane._flow_option_default('retention'),
  opt_deadline int,
  opt_dedup_key text,
  opt_concurrency_limit int,
  opt_concurrency_key text,
  opt_priority int,
  opt_concurrency_when_full text default 'queue' not null,
  opt_debounce_key text,
  opt_debounce_period int,
  opt_debounce_max_wait int,
  opt_on_failure text,
  opt_on_failure_on_cancel boolean default false not null,
  constraint flows_pkey primary key (flow_slug),
  constraint flows_base_delay_nonnegative check (opt_base_delay >= 0),
  constraint flows_deadline_positive check ((opt_deadline is null) or (opt_deadline >= 1)),
  constraint flows_dedup_key_pointer check ((opt_dedup_key is null) or (opt_dedup_key ~ '^(/([^~/]|~[01])*)+$')),
  constraint flows_max_attempts_positive check (opt_max_attempts >= 1),
  constraint flows_queue_mode_valid check (queue_mode in ('flow', 'per-step', 'explicit')),
  constraint flows_retention_positive check ((opt_retention is null) or (opt_retention >= 1)),
  constraint flows_slug_valid check (flowlane.is_valid_slug(flow_slug)),
  constraint flows_timeout_at_most_2147483617 check (opt_timeout <= 2147483617),
  constraint flows_timeout_positive check (opt_timeout >= 1),
  constraint flows_concurrency_limit_positive check ((opt_concurrency_limit is null) or (opt_concurrency_limit >= 1)),
  constraint flows_concurrency_key_pointer check ((opt_concurrency_key is null) or (opt_concurrency_key ~ '^(/([^~/]|~[01])*)+$')),
  constraint flows_concurrency_key_needs_limit check ((opt_concurrency_key is null) or (opt_concurrency_limit is not null)),
  constraint flows_priority_range check ((opt_priority is null) or (opt_priority between -1000 and 1000)),
  constraint flows_concurrency_when_full_valid check (opt_concurrency_when_full in ('queue', 'replace_waiting', 'cancel_running')),
  constraint flows_debounce_period_positive check ((opt_debounce_period is null) or (opt_debounce_period >= 1)),
  constraint flows_debounce_key_pointer check ((opt_debounce_key is null) or (opt_debounce_key ~ '^(/([^~/]|~[01])*)+$')),
  constraint flows_debounce_needs_period check (((opt_debounce_key is null) and (opt_debounce_max_wait is null)) or (opt_debounce_period is not null)),
  constraint flows_debounce_max_wait_covers_period check ((opt_debounce_max_wait is null) or (opt_debounce_max_wait >= opt_debounce_period)),
  constraint flows_on_failure_slug check ((opt_on_failure is null) or flowlane.is_valid_slug(opt_on_failure))
);

create unique index flows_slug_ci_unique on flowlane.flows (lower(flow_slug));

create table flowlane.steps (
  flow_slug text not null,
  step_slug text not null,
  step_type text default 'single' not null,
  step_index int not null,
  deps_count int default 0 not null,
  opt_max_attempts int,
  opt_base_delay int,
  opt_timeout int,
  opt_start_delay int,
  required_input_pattern jsonb,
  forbidden_input_pattern jsonb,
  when_unmet text default 'skip' not null,
  when_exhausted text default 'fail' not null,
  created_at timestamptz default now() not null,
  queue_name text,
  child_flow text,
  opt_concurrency_limit int,
  opt_concurrency_key text,
  opt_compensate text,
  opt_cache_ttl int,
  opt_cache_key text[],
  opt_cache_fingerprint text,
  constraint steps_index_unique unique (flow_slug, step_index),
  constraint steps_pkey primary key (flow_slug, step_slug),
  constraint steps_base_delay_nonnegative check ((opt_base_delay is null) or (opt_base_delay >= 0)),
  constraint steps_deps_count_nonnegative check (deps_count >= 0),
  constraint steps_forbidden_pattern_object check ((forbidden_input_pattern is null) or (jsonb_typeof(forbidden_input_pattern) = 'object')),
  constraint steps_index_nonnegative check (step_index >= 0),
  constraint steps_map_deps check ((step_type <> 'map') or (deps_count <= 1)),
  constraint steps_max_attempts_positive check ((opt_max_attempts is null) or (opt_max_attempts >= 1)),
  constraint steps_required_pattern_object check ((required_input_pattern is null) or (jsonb_typeof(required_input_pattern) = 'object')),
  constraint steps_slug_valid check (flowlane.is_valid_slug(step_slug)),
  constraint steps_start_delay_nonnegative check ((opt_start_delay is null) or (opt_start_delay >= 0)),
  constraint steps_timeout_at_most_2147483617 check ((opt_timeout is null) or (opt_timeout <= 2147483617)),
  constraint steps_timeout_positive check ((opt_timeout is null) or (opt_timeout >= 1)),
  constraint steps_type_valid check (step_type in ('single', 'map', 'wait')),
  constraint steps_queue_iff_handler check ((queue_name is null) = ((step_type = 'wait') or (child_flow is not null))),
  constraint steps_child_flow_not_wait check ((child_flow is null) or (step_type <> 'wait')),
  constraint steps_when_exhausted_valid check (when_exhausted in ('fail', 'skip', 'skip-cascade')),
  constraint steps_when_unmet_needs_pattern check ((when_unmet = 'skip') or (required_input_pattern is not null) or (forbidden_input_pattern is not null)),
  constraint steps_when_unmet_valid check (when_unmet in ('skip', 'skip-cascade', 'fail')),
  constraint steps_concurrency_limit_positive check ((opt_concurrency_limit is null) or (opt_concurrency_limit >= 1)),
  constraint steps_concurrency_key_pointer check ((opt_concurrency_key is null) or (opt_concurrency_key ~ '^(/([^~/]|~[01])*)+$')),
  constraint steps_concurrency_key_needs_limit check ((opt_concurrency_key is null) or (opt_concurrency_limit is not null)),
  constraint steps_concurrency_needs_tasks check ((opt_concurrency_limit is null) or (queue_name is not null)),
  constraint steps_compensate_slug check ((opt_compensate is null) or flowlane.is_valid_slug(opt_compensate)),
  constraint steps_cache_ttl_positive check ((opt_cache_ttl is null) or (opt_cache_ttl >= 1)),
  constraint steps_cache_needs_ttl check ((opt_cache_ttl is not null) or ((opt_cache_key is null) and (opt_cache_fingerprint is null))),
  constraint steps_cache_needs_tasks check ((opt_cache_ttl is null) or (queue_name is not null)),
  constraint steps_flow_slug_fkey foreign key (flow_slug) references flowlane.flows(flow_slug),
  constraint steps_queue_registered foreign key (queue_name) references flowlane.queues(queue_name)
);

create unique index steps_slug_ci_unique on flowlane.steps (flow_slug, lower(step_slug));

-- a flow's data contracts (16_contracts.sql): the run input's schema (step_slug null) and
-- each step's output schema, as written minus annotations (part of the shape), with the
-- SQL expression compiled from it once (_contract_sql), which start_flow and start_flows
-- evaluate over their inputs
create table flowlane.contracts (
  flow_slug text not null,
  step_slug text,
  schema jsonb not null,
  check_sql text not null,
  created_at timestamptz default now() not null,
  constraint contracts_flow_slug_fkey foreign key (flow_slug) references flowlane.flows(flow_slug) on delete cascade,
  constraint contracts_step_fkey foreign key (flow_slug, step_slug) references flowlane.steps(flow_slug, step_slug) on delete cascade
);

create unique index contracts_subject_unique on flowlane.contracts (flow_slug, coalesce(step_slug, ''));

create table flowlane.deps (
  flow_slug text not null,
  dep_slug text not null,
  step_slug text not null,
  created_at timestamptz default now() not null,
  constraint deps_pkey primary key (flow_slug, dep_slug, step_slug),
  constraint deps_not_self check (dep_slug <> step_slug),
  constraint deps_flow_slug_dep_slug_fkey foreign key (flow_slug, dep_slug) references flowlane.steps(flow_slug, step_slug),
  constraint deps_flow_slug_step_slug_fkey foreign key (flow_slug, step_slug) references flowlane.steps(flow_slug, step_slug)
);

create index deps_child_idx on flowlane.deps (flow_slug, step_slug);

create table flowlane.aliases (
  alias text not null,
  flow_slug text not null,
  draining text[] default '{}'::text[] not null,
  updated_at timestamptz default clock_timestamp() not null,
  constraint aliases_pkey primary key (alias),
  constraint aliases_active_not_draining check (not (flow_slug = any (draining))),
  constraint aliases_draining_no_nulls check (array_position(draining, null) is null),
  constraint aliases_slug_valid check (flowlane.is_valid_slug(alias)),
  constraint aliases_flow_slug_fkey foreign key (flow_slug) references flowlane.flows(flow_slug)
);

create unique index aliases_slug_ci_unique on flowlane.aliases (lower(alias));

create table flowlane.alias_history (
  id bigint not null generated always as identity,
  alias text not null,
  flow_slug text not null,
  draining text[] not null,
  changed_at timestamptz default clock_timestamp() not null,
  constraint alias_history_pkey primary key (id)
);

create index alias_history_alias_idx on flowlane.alias_history (alias, id);

-- a row rule's failure, raised as the CHECK it stands for would be
create function flowlane._rule_broken(p_table text, p_rule text) returns void
language plpgsql immutable
set search_path = ''
as $$
begin
  raise exception 'new row for relation "%" violates check constraint "%"', p_table, p_rule
    using errcode = 'check_violation', schema = 'flowlane', table = p_table, constraint = p_table || '_rules';
end;
$$;

-- the rules a run keeps, as one CHECK (runs_rules) calling this function: why one, see
-- "Row rules" in flowlane/core/engine/README.md
create function flowlane._runs_rules(status text, started_at timestamptz, completed_at timestamptz,
                                     failed_at timestamptz, cancelled_at timestamptz, cancel_reason text,
                                     has_output boolean, remaining_steps int, retry_count int,
                                     called_as text, idempotency_key text, start_at timestamptz,
                                     schedule_name text, schedule_slot timestamptz, parent_run_id uuid,
                                     parent_step_slug text, parent_task_index int, concurrency_key text,
                                     hold_seq bigint, priority int)
returns boolean
language plpgsql immutable
set search_path = ''
as $$
declare
  v_broken text := case
    when not (status in ('waiting', 'started', 'completed', 'failed', 'cancelled')) then 'runs_status_valid'
    when not ((status = 'completed') = (completed_at is not null)) then 'runs_completed_at'
    when not ((status = 'failed') = (failed_at is not null)) then 'runs_failed_at'
    when not ((status = 'cancelled') = (cancelled_at is not null)) then 'runs_cancelled_at'
    when not ((completed_at is null) or (completed_at >= started_at)) then 'runs_completed_after_start'
    when not ((failed_at is null) or (failed_at >= started_at)) then 'runs_failed_after_start'
    when not ((cancelled_at is null) or (cancelled_at >= started_at)) then 'runs_cancelled_after_start'
    when not ((cancel_reason is null) or (status = 'cancelled')) then 'runs_cancel_reason_only_cancelled'
    when not (not has_output or (status = 'completed')) then 'runs_output_only_completed'
    when not (remaining_steps >= 0) then 'runs_remaining_steps_nonnegative'
    when not (retry_count >= 0) then 'runs_retry_count_nonnegative'
    when not ((idempotency_key is null) or (called_as is not null)) then 'runs_key_scoped'
    when not ((schedule_slot is null) or (schedule_name is not null)) then 'runs_schedule_slot_named'
    when not ((status <> 'waiting') or (start_at is not null) or (hold_seq is not null)) then 'runs_waiting_has_reason'
    when not ((hold_seq is null) or (concurrency_key is not null)) then 'runs_held_has_key'
    when not (priority between -1000 and 1000) then 'runs_priority_range'
    when not (((parent_run_id is null) = (parent_step_slug is null))
              and ((parent_run_id is null) = (parent_task_index is null))) then 'runs_parent_complete'
  end;
begin
  if v_broken is not null then
    perform flowlane._rule_broken('runs', v_broken);
  end if;
  return true;
end;
$$;

create table flowlane.runs (
  run_id uuid default flowlane._uuid_v7() not null,
  flow_slug text not null,
  status text default 'started' not null,
  input jsonb not null,
  output jsonb,
  error_message text,
  remaining_steps int default 0 not null,
  started_at timestamptz default now() not null,
  completed_at timestamptz,
  failed_at timestamptz,
  cancelled_at timestamptz,
  cancel_reason text,
  retry_count int default 0 not null,
  retried_at timestamptz,
  trace_parent text,
  called_as text,
  idempotency_key text,
  start_at timestamptz,
  deadline_at timestamptz,
  schedule_name text,
  schedule_slot timestamptz,
  parent_run_id uuid,
  parent_step_slug text,
  parent_task_index int,
  concurrency_key text,
  hold_seq bigint,
  priority int default 0 not null,
  origin jsonb,  -- what started a run, when not a call: {"trigger": name, "row": key} or {"webhook": ...}
  debounce_key text,
  debounce_since timestamptz,
  failure_of uuid,
  compensation text,  -- running, completed or stopped: written by 21_compensation.sql only
  compensation_of uuid,
  constraint runs_pkey primary key (run_id),
  constraint runs_rules check (flowlane._runs_rules(status, started_at, completed_at, failed_at, cancelled_at,
    cancel_reason, output is not null, remaining_steps, retry_count, called_as, idempotency_key, start_at,
    schedule_name, schedule_slot, parent_run_id, parent_step_slug, parent_task_index, concurrency_key, hold_seq,
    priority)),
  constraint runs_flow_slug_fkey foreign key (flow_slug) references flowlane.flows(flow_slug)
)
with (fillfactor='85', autovacuum_vacuum_scale_factor='0.02', autovacuum_analyze_scale_factor='0.02');

create index runs_ended_idx on flowlane.runs (status, started_at desc, run_id) where (status <> 'started');

-- a flow's runs by their start: what retention prunes (its finished runs, oldest first), a
-- flow's lists (newest first, a backward scan) and the foreign key's check when a flow is
-- deleted. One index for the three: a run's end writes one entry less
create index runs_flow_idx on flowlane.runs (flow_slug, started_at, run_id);

create index runs_in_flight_idx on flowlane.runs (run_id) where (status = 'started');

create index runs_started_idx on flowlane.runs (started_at desc, run_id);

-- a second start with the same (called name, key) finds the first run
create unique index runs_key_unique on flowlane.runs (called_as, idempotency_key) where (idempotency_key is not null);

-- the maintenance tick's probes: delayed runs that are due, started runs past their deadline
create index runs_waiting_idx on flowlane.runs (start_at) where ((status = 'waiting') and (hold_seq is null));

-- flow concurrency (19_flow_control.sql): the started runs of a key, and the runs held for it in order
create index runs_slots_idx on flowlane.runs (flow_slug, concurrency_key) where ((status = 'started') and (concurrency_key is not null));

-- the run a debounced flow's starts collapse into, per key: created waiting for its start_at
create unique index runs_debounce_pending_unique on flowlane.runs (flow_slug, debounce_key)
  where ((debounce_key is not null) and (status = 'waiting') and (hold_seq is null));

create index runs_held_idx on flowlane.runs (flow_slug, concurrency_key, hold_seq) where ((status = 'waiting') and (hold_seq is not null));

create index runs_deadline_idx on flowlane.runs (deadline_at) where (status = 'started' and deadline_at is not null);

-- one run per (schedule, slot), however many processes fire schedules at once
create unique index runs_schedule_slot_unique on flowlane.runs (schedule_name, schedule_slot) where (schedule_slot is not null);

-- a run's failure handler run (20_on_failure.sql): at most one per failed run
create unique index runs_failure_of_unique on flowlane.runs (failure_of) where (failure_of is not null);

-- a failed run's compensations (21_compensation.sql): each completed step's with one, and
-- the run started for it
create table flowlane.compensations (
  run_id uuid not null,
  step_slug text not null,
  status text default 'pending' not null,
  compensation_run_id uuid,
  constraint compensations_pkey primary key (run_id, step_slug),
  constraint compensations_status_valid check (status in ('pending', 'started', 'completed', 'failed')),
  constraint compensations_run_fkey foreign key (run_id) references flowlane.runs(run_id) on delete cascade
);

create unique index compensations_run_idx on flowlane.compensations (compensation_run_id)
  where (compensation_run_id is not null);

create index runs_parent_idx on flowlane.runs (parent_run_id, parent_step_slug, parent_task_index) where (parent_run_id is not null);

-- the rules a step state keeps (one CHECK, as for runs)
create function flowlane._step_states_rules(status text, remaining_deps int, initial_tasks int, remaining_tasks int,
                                            has_output boolean, skip_reason text, created_at timestamptz,
                                            started_at timestamptz, completed_at timestamptz,
                                            failed_at timestamptz, skipped_at timestamptz,
                                            cancelled_at timestamptz)
returns boolean
language plpgsql immutable
set search_path = ''
as $$
declare
  v_broken text := case
    when not (status in ('created', 'started', 'completed', 'failed', 'skipped', 'cancelled')) then 'step_states_status_valid'
    when not ((status = 'completed') = (completed_at is not null)) then 'step_states_completed_at'
    when not ((status = 'failed') = (failed_at is not null)) then 'step_states_failed_at'
    when not ((status = 'skipped') = (skipped_at is not null)) then 'step_states_skipped_at'
    when not ((status = 'cancelled') = (cancelled_at is not null)) then 'step_states_cancelled_at'
    when not ((started_at is null) or (started_at >= created_at)) then 'step_states_started_after_created'
    when not ((completed_at is null) or (completed_at >= coalesce(started_at, created_at))) then 'step_states_completed_after_started'
    when not ((failed_at is null) or (failed_at >= coalesce(started_at, created_at))) then 'step_states_failed_after_created'
    when not ((skipped_at is null) or (skipped_at >= created_at)) then 'step_states_skipped_after_created'
    when not ((cancelled_at is null) or (cancelled_at >= coalesce(started_at, created_at))) then 'step_states_cancelled_after_created'
    when not (remaining_deps >= 0) then 'step_states_remaining_deps_nonnegative'
    when not ((initial_tasks is null) or (initial_tasks >= 0)) then 'step_states_initial_tasks_nonnegative'
    when not ((remaining_tasks is null) or (remaining_tasks >= 0)) then 'step_states_remaining_tasks_nonnegative'
    when not ((status <> 'started') or ((initial_tasks is not null) and (remaining_tasks is not null))) then 'step_states_started_sized'
    when not ((status <> all (array['created', 'skipped'])) or (remaining_tasks is null)) then 'step_states_unstarted_no_remaining'
    when not ((status <> 'completed') or (remaining_tasks = 0)) then 'step_states_completed_no_remaining'
    when not (not has_output or (status = 'completed')) then 'step_states_output_only_completed'
    when not ((status = 'skipped') = (skip_reason is not null)) then 'step_states_skip_reason'
    when not ((skip_reason is null)
              or (skip_reason in ('condition_unmet', 'handler_failed', 'dependency_skipped', 'wait_timeout'))) then 'step_states_skip_reason_valid'
  end;
begin
  if v_broken is not null then
    perform flowlane._rule_broken('step_states', v_broken);
  end if;
  return true;
end;
$$;

create table flowlane.step_states (
  flow_slug text not null,
  run_id uuid not null,
  step_slug text not null,
  status text default 'created' not null,
  remaining_deps int default 0 not null,
  initial_tasks int,
  remaining_tasks int,
  output jsonb,
  error_message text,
  skip_reason text,
  created_at timestamptz default now() not null,
  started_at timestamptz,
  completed_at timestamptz,
  failed_at timestamptz,
  skipped_at timestamptz,
  cancelled_at timestamptz,
  constraint step_states_pkey primary key (run_id, step_slug),
  constraint step_states_rules check (flowlane._step_states_rules(status, remaining_deps, initial_tasks,
    remaining_tasks, output is not null, skip_reason, created_at, started_at, completed_at, failed_at, skipped_at,
    cancelled_at)),
  constraint step_states_flow_slug_step_slug_fkey foreign key (flow_slug, step_slug) references flowlane.steps(flow_slug, step_slug),
  constraint step_states_run_id_fkey foreign key (run_id) references flowlane.runs(run_id)
)
with (autovacuum_vacuum_scale_factor='0.02', autovacuum_analyze_scale_factor='0.02', fillfactor='50');

create index step_states_flow_idx on flowlane.step_states (flow_slug);

-- the rules a task keeps (one CHECK, as for runs)
create function flowlane._step_tasks_rules(status text, task_index int, attempts_count int, requeued_count int,
                                           has_output boolean, queued_at timestamptz, started_at timestamptz,
                                           completed_at timestamptz, failed_at timestamptz,
                                           skipped_at timestamptz, cancelled_at timestamptz)
returns boolean
language plpgsql immutable
set search_path = ''
as $$
declare
  v_broken text := case
    when not (status in ('queued', 'started', 'completed', 'failed', 'skipped', 'cancelled')) then 'step_tasks_status_valid'
    when not ((status = 'completed') = (completed_at is not null)) then 'step_tasks_completed_at'
    when not ((status = 'failed') = (failed_at is not null)) then 'step_tasks_failed_at'
    when not ((status = 'skipped') = (skipped_at is not null)) then 'step_tasks_skipped_at'
    when not ((status = 'cancelled') = (cancelled_at is not null)) then 'step_tasks_cancelled_at'
    when not ((status <> 'started') or (started_at is not null)) then 'step_tasks_started_at'
    when not ((started_at is null) or (started_at >= queued_at)) then 'step_tasks_started_after_queued'
    when not ((completed_at is null) or (completed_at >= coalesce(started_at, queued_at))) then 'step_tasks_completed_after_started'
    when not ((failed_at is null) or (failed_at >= queued_at)) then 'step_tasks_failed_after_queued'
    when not ((skipped_at is null) or (skipped_at >= queued_at)) then 'step_tasks_skipped_after_queued'
    when not ((cancelled_at is null) or (cancelled_at >= queued_at)) then 'step_tasks_cancelled_after_queued'
    when not (not has_output or (status in ('completed', 'failed'))) then 'step_tasks_output_only_done'
    when not (task_index >= 0) then 'step_tasks_task_index_nonnegative'
    when not (attempts_count >= 0) then 'step_tasks_attempts_nonnegative'
    when not (requeued_count >= 0) then 'step_tasks_requeued_nonnegative'
  end;
begin
  if v_broken is not null then
    perform flowlane._rule_broken('step_tasks', v_broken);
  end if;
  return true;
end;
$$;

create table flowlane.step_tasks (
  flow_slug text not null,
  run_id uuid not null,
  step_slug text not null,
  task_index int default 0 not null,
  message_id bigint,
  status text default 'queued' not null,
  attempts_count int default 0 not null,
  error_message text,
  output jsonb,
  last_worker_id uuid,
  requeued_count int default 0 not null,
  queued_at timestamptz default now() not null,
  started_at timestamptz,
  completed_at timestamptz,
  failed_at timestamptz,
  skipped_at timestamptz,
  cancelled_at timestamptz,
  last_requeued_at timestamptz,
  permanently_stalled_at timestamptz,
  queue_name text not null,
  lease_renewed_at timestamptz,
  cached boolean default false not null,
  step_started_at timestamptz,
  constraint step_tasks_pkey primary key (run_id, step_slug, task_index),
  constraint step_tasks_queue_message_unique unique (queue_name, message_id),
  constraint step_tasks_rules check (flowlane._step_tasks_rules(status, task_index, attempts_count, requeued_count,
    output is not null, queued_at, started_at, completed_at, failed_at, skipped_at, cancelled_at)),
  constraint step_tasks_run_id_fkey foreign key (run_id) references flowlane.runs(run_id)
)
with (autovacuum_vacuum_scale_factor='0.02', autovacuum_analyze_scale_factor='0.02', fillfactor='50');

-- Every step's state: the rows of step_states, and the state a task holds for its step. A root
-- step of one task started with its run (_state_in_task, 04_runs.sql) writes no step_states row: its
-- task holds the state, and step_started_at (null for every other task) is when the step
-- started. Such a step is started until its task completes, then completed with the task's
-- output; any other change (a failure, a skip, a cancel, a retry) first writes the state into
-- step_states (_unfold_step_states), which this view's second part then leaves out.
create view flowlane.all_step_states as
select ss.flow_slug, ss.run_id, ss.step_slug, ss.status, ss.remaining_deps, ss.initial_tasks, ss.remaining_tasks,
       ss.output, ss.error_message, ss.skip_reason, ss.created_at, ss.started_at, ss.completed_at, ss.failed_at,
       ss.skipped_at, ss.cancelled_at
from flowlane.step_states ss
union all
select t.flow_slug, t.run_id, t.step_slug, case when t.status = 'completed' then 'completed' else 'started' end,
       0, 1, case when t.status = 'completed' then 0 else 1 end,
       case when t.status = 'completed' then t.output end, null::text, null::text, t.queued_at, t.step_started_at,
       case when t.status = 'completed' then t.completed_at end, null::timestamptz, null::timestamptz,
       null::timestamptz
from flowlane.step_tasks t
where t.step_started_at is not null;

create index step_tasks_completed_brin on flowlane.step_tasks using brin (completed_at) with (autosummarize='on');

-- the started tasks, which stalled recovery (08_recovery.sql) and a queue's concurrency limit
-- (19_flow_control.sql) read: a few entries however long the history. Their claim and their
-- end are updates that write index entries (not HOT), which a table of leases wrote as a row
-- inserted and deleted
create index step_tasks_started_idx on flowlane.step_tasks (queue_name) where status = 'started';

create table flowlane.task_attempts (
  id bigint not null generated always as identity,
  run_id uuid not null,
  step_slug text not null,
  task_index int not null,
  attempt int not null,
  retry_round int default 0 not null,
  outcome text not null,
  worker_id uuid,
  error_type text,
  error_message text,
  traceback text,
  failed_at timestamptz default now() not null,
  output jsonb,
  constraint task_attempts_pkey primary key (id),
  constraint task_attempts_attempt_positive check (attempt >= 1),
  constraint task_attempts_bounded check ((length(error_message) <= 4000) and (length(traceback) <= 16000) and (length(error_type) <= 200)),
  constraint task_attempts_outcome_valid check (outcome in ('retry', 'failed', 'stalled', 'overridden', 'superseded')),
  constraint task_attempts_run_id_fkey foreign key (run_id) references flowlane.runs(run_id) on delete cascade
);

create index task_attempts_task_idx on flowlane.task_attempts (run_id, step_slug, task_index, id);

create table flowlane.worker_deployments (
  deployment_name text not null,
  queue_name text not null,
  enabled boolean default true not null,
  reason text,
  created_at timestamptz default now() not null,
  changed_at timestamptz default now() not null,
  constraint worker_deployments_pkey primary key (deployment_name),
  constraint worker_deployments_name_valid check (flowlane.is_valid_deployment_name(deployment_name)),
  constraint worker_deployments_queue_name_fkey foreign key (queue_name) references flowlane.queues(queue_name)
);

create index worker_deployments_queue_idx on flowlane.worker_deployments (queue_name);

create table flowlane.workers (
  worker_id uuid not null,
  queue_name text not null,
  worker_name text not null,
  started_at timestamptz default now() not null,
  last_heartbeat_at timestamptz default now() not null,
  deprecated_at timestamptz,
  stopped_at timestamptz,
  deployment_name text,
  supported_pairs jsonb default '[]'::jsonb not null,
  constraint workers_pkey primary key (worker_id),
  constraint workers_heartbeat_after_start check (last_heartbeat_at >= started_at),
  constraint workers_stopped_after_start check ((stopped_at is null) or (stopped_at >= started_at)),
  constraint workers_deployment_name_fkey foreign key (deployment_name) references flowlane.worker_deployments(deployment_name)
);

create index workers_deployment_idx on flowlane.workers (deployment_name) where (stopped_at is null);

create index workers_queue_idx on flowlane.workers (queue_name);

-- why the last worker of a deployment refused to start (a runtime record, never a
-- definition): no foreign key to the queue, which may not be registered yet
create table flowlane.worker_refusals (
  queue_name text not null,
  deployment_name text not null,
  reason text not null,
  hint text,
  refused_at timestamptz default now() not null,
  constraint worker_refusals_pkey primary key (queue_name, deployment_name)
);

create table flowlane.rollouts (
  rollout_id bigint not null generated always as identity,
  deployments text[] not null,
  previously_enabled text[] not null,
  started_at timestamptz default now() not null,
  finished_at timestamptz,
  constraint rollouts_pkey primary key (rollout_id)
);

create unique index rollouts_one_unfinished on flowlane.rollouts ((true)) where (finished_at is null);

-- schedules: written only by reviewed compiled SQL (set_schedule); next_slot is the firing the
-- maintenance tick waits for, kept by the firing itself
create table flowlane.schedules (
  schedule_name text not null,
  flow_name text not null,
  cron text,
  cron_minutes int[],
  cron_hours int[],
  cron_days int[],
  cron_months int[],
  cron_weekdays int[],
  every_seconds int,
  timezone text default 'UTC' not null,
  input jsonb default '{}'::jsonb not null,
  overlap text default 'skip' not null,
  catch_up text default 'latest' not null,
  next_slot timestamptz not null,
  last_slot timestamptz,
  last_run_id uuid,
  created_at timestamptz default now() not null,
  updated_at timestamptz default now() not null,
  constraint schedules_pkey primary key (schedule_name),
  constraint schedules_catch_up_valid check (catch_up in ('latest', 'none', 'all')),
  constraint schedules_cron_complete check ((cron is null) = (cron_minutes is null) and (cron is null) = (cron_hours is null) and (cron is null) = (cron_months is null) and ((cron is not null) or ((cron_days is null) and (cron_weekdays is null)))),
  constraint schedules_cron_or_every check ((cron is null) <> (every_seconds is null)),
  constraint schedules_every_positive check ((every_seconds is null) or (every_seconds >= 1)),
  constraint schedules_name_valid check (flowlane.is_valid_slug(schedule_name)),
  constraint schedules_overlap_valid check (overlap in ('skip', 'allow'))
);

create index schedules_next_slot_idx on flowlane.schedules (next_slot);

-- an operator's pause of a schedule, apart from its definition (apply never touches it)
create table flowlane.schedule_overrides (
  schedule_name text not null,
  paused boolean default true not null,
  reason text,
  changed_at timestamptz default now() not null,
  constraint schedule_overrides_pkey primary key (schedule_name)
);

-- == flow control (19_flow_control.sql) ======================================================

-- the order of held runs and held tasks: first held, first begun (FIFO per key)
create sequence flowlane.hold_seq;

-- tasks of a step with a concurrency limit that wait for a slot of their key: no PGMQ message
-- yet (so no attempt, no lease, no stall); sent when a task of the same step and key ends
create table flowlane.held_tasks (
  run_id uuid not null,
  step_slug text not null,
  task_index int not null,
  flow_slug text not null,
  concurrency_key text not null,
  hold_seq bigint default nextval('flowlane.hold_seq') not null,
  held_at timestamptz default now() not null,
  constraint held_tasks_pkey primary key (run_id, step_slug, task_index),
  constraint held_tasks_run_id_fkey foreign key (run_id) references flowlane.runs(run_id) on delete cascade
);

create index held_tasks_order_idx on flowlane.held_tasks (flow_slug, step_slug, concurrency_key, hold_seq);

-- the sent, unfinished tasks of steps with a concurrency limit (a slot each), by key
create table flowlane.step_slots (
  run_id uuid not null,
  step_slug text not null,
  task_index int not null,
  flow_slug text not null,
  concurrency_key text not null,
  constraint step_slots_pkey primary key (run_id, step_slug, task_index),
  constraint step_slots_run_id_fkey foreign key (run_id) references flowlane.runs(run_id) on delete cascade
);

create index step_slots_key_idx on flowlane.step_slots (flow_slug, step_slug, concurrency_key);

-- a physical queue's limits across all workers, written only by reviewed compiled SQL
-- (set_queue_limits); tokens and refilled_at are the rate limit's bucket, kept by the claims
create table flowlane.queue_limits (
  queue_name text not null,
  concurrency int,
  rate_limit int,
  rate_per int,
  tokens double precision default 0 not null,
  refilled_at timestamptz default now() not null,
  updated_at timestamptz default now() not null,
  last_grant int default 0 not null,
  constraint queue_limits_pkey primary key (queue_name),
  constraint queue_limits_concurrency_positive check ((concurrency is null) or (concurrency >= 1)),
  constraint queue_limits_rate_positive check ((rate_limit is null) or ((rate_limit >= 1) and (rate_per >= 1))),
  constraint queue_limits_rate_complete check ((rate_limit is null) = (rate_per is null)),
  constraint queue_limits_some_limit check ((concurrency is not null) or (rate_limit is not null)),
  constraint queue_limits_queue_name_fkey foreign key (queue_name) references flowlane.queues(queue_name) on delete cascade
);
