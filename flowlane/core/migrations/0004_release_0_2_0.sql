-- flowlane SQL Core 0004: release 0.2.0.
-- Drafted by `python -m flowlane.core.draft_migration` from the engine source; reviewed by a person.
--
-- Data contracts read a count (minLength, maxLength, minItems, maxItems) written as a whole
-- number with a fraction, 2.0, as the count 2, as JSON Schema does and as _contract_problem
-- already accepted: set_contract and contract_violation failed on it with "invalid input
-- syntax for type integer". The counts go through the new _contract_count, and a count that
-- is not a whole number is named with its value. Only functions change: stored contracts and
-- their compiled checks stay as they are (a whole count compiles to the same text, so the same
-- _contract_check_<md5> function). The previous release's workers keep running: none of the
-- functions they call while claiming, completing or failing changes.
--
-- definitions_fingerprint (read class): a text that changes whenever flowlane_definitions is
-- notified, which `flowlane serve` polls where it cannot LISTEN (through a transaction-mode
-- pooler, a DSN with pooler=transaction). A new function only; nothing else changes.
--
-- Every result is fenced by its claim: complete_task, fail_task and fail_task_detailed, and
-- every item of complete_tasks and fail_tasks, need the worker_id and attempt of the claim
-- they answer (a result without them completed or failed whatever task it named). An operator
-- who must end a task by hand calls the new override_task, which records who and why in the
-- task's attempt history (outcome 'overridden') and clears the task's last_worker_id, so that
-- the worker's own result is rejected. The previous release's workers always send both.
--
-- Worker liveness is one rule, flowlane.worker_is_live (not stopped, a heartbeat within
-- flowlane.worker_stale_after(), 30 s), read by worker list, queue list, run, the console, the
-- metrics and serve; `worker list` counted a worker dead for minutes as live. queue_metrics
-- keeps its argument for the previous release's callers and no longer reads it. Only
-- functions change.
--
-- A failed or completed run reruns from a step (retry_run_from): the step and every step
-- that depends on it run again, the other steps keep their outputs. retry_run keeps its
-- signature and behaviour; its body is split into helpers both share. The attempt history
-- (task_attempts) gains the outcome 'superseded' and an output column: a rerun step's
-- completed tasks are recorded there, with their output, before they are replaced. Existing
-- rows are unchanged (their output is null). retry_runs and cancel_runs retry or cancel a
-- bounded batch of runs in one call, passing over those no longer in a state that allows it
-- (`flowlane retry|cancel` with a filter calls them once per batch and transaction).
--
-- The engine reads the time through one clock: the new _now() and _clock_timestamp() (plain SQL
-- functions, inlined by the planner: the same plans as now() and clock_timestamp()) replace the
-- built-ins wherever the engine records a time or compares with one (the time columns keep
-- their defaults, now(), the same time: no table is altered). A queue message's visibility
-- stays on PostgreSQL's clock. The test
-- databases of flowlane's pytest plugin replace _now() with one that the test moves; nothing
-- in a database migrated by flowlane can move it. The functions the previous release's
-- workers call keep their signatures; their new bodies return the same times.
--
-- Events in: a run records what started it when that is not a call (runs.origin, a new
-- nullable column: existing runs keep null). `kind: trigger` documents are recorded in the new
-- table triggers by set_trigger, which creates statement-level triggers on the application's
-- tables; those start runs through _start_from_events and the new _new_runs / _new_run, which
-- take each run's origin. _create_runs and _start_one_run keep their signatures and call them
-- with no origin, so calls of the previous release's functions in flight while this migration
-- commits keep working. Refusals a trigger records go to the new table trigger_refusals.
-- The input contract's fast verdict moves into _refused_inputs, shared by _check_contract_inputs
-- and the triggers. No function the previous release's workers call changes its signature.
--
-- A flow's concurrency says what a full key does with a new run (flows.opt_concurrency_when_full,
-- create_flow's concurrency_when_full): queue, as before and the default for existing flows;
-- replace_waiting, the new run replaces the key's waiting runs; cancel_running, the new run
-- cancels the key's oldest started run. create_flow gains the argument (a drop and a create:
-- compiled files of 0.1.0 call it by name and keep working; ensure_flow_compiled, which calls
-- it, is called by people and tools applying flows, never by workers); the functions that
-- start runs or begin due ones apply the choice. Workers call none of the changed functions.
--
-- A held run begun by the end of another run, in a transaction that began before the held
-- run was created, failed that transaction on step_states_started_after_created: its steps
-- now start at the later of the two times (_start_ready_steps' body; its signature is kept).
--
-- Webhooks: start_flow records the origin its transaction names in the setting flowlane.origin
-- (the new _call_origin; the webhook endpoint names itself and the delivery there). Its
-- signature is kept, and without the setting a run's origin is null, as before.
--
-- Claims wait for no run or task row: _start_tasks locks its tasks through the new
-- _lock_claimable_tasks (for update skip locked; runs and step states read unlocked) and
-- _claim_one does the same, so a claim, which holds its queue messages first, no longer
-- deadlocks with a completion, failure or cancel that holds the run and archives the
-- messages. Signatures are kept: a claim of the previous release in flight while this
-- commits finishes with its old bodies.
--
-- The rules the one-item and batch paths of claims and results share are new one-line
-- functions both call (_result_owns, _retries, _step_output, _dependent_tasks, _claimable);
-- the bodies that call them change, their signatures and results do not.

-- Notifications that do not serialise commits: a queue has at most one notifying transaction
-- in flight. _notify_queue_insert (the queues' insert trigger) sends no notification while
-- another transaction's notification of the queue is on its way, and holds one of the queue's
-- inserter locks (advisory, shared; the new _queue_inserter_locks names them) until its
-- transaction ends; the new await_queue_inserts waits for those, and a worker calls it before
-- it waits for a notification, then claims once more. Only functions change. The previous
-- release's workers do not call it: on a queue where starts overlap, one of theirs may find a
-- start only at its next poll (poll_interval).

-- A flow may debounce its starts (flows.opt_debounce_key, opt_debounce_period,
-- opt_debounce_max_wait; create_flow's debounce_key, debounce_period, debounce_max_wait):
-- start_flow and start_flows collapse the starts of one key into a pending run (runs.debounce_key,
-- debounce_since; one per flow and key, runs_debounce_pending_unique) that the maintenance tick
-- begins, with the last start's input, when a period passes without another start or the
-- maximum wait is reached. run_holds shows it as debounced. New nullable columns only: no
-- existing row changes. Workers call none of the changed functions.
--
-- A flow's failure handler: create_flow takes on_failure (a flow or alias, started once with the
-- failure as its input when a run of the flow fails or passes its deadline) and
-- on_failure_on_cancel (also when it is cancelled), kept in two new columns of flows; runs gain
-- failure_of, the run a failure handler's run handles (unique: one per run). A trigger on runs
-- starts it. Existing flows have none; existing runs handle no failure. create_flow changes its
-- signature (two arguments with defaults); the functions workers call do not change.

-- Compensation: add_step takes compensate (a flow or alias, kept in steps.opt_compensate);
-- when a run fails, a run of it starts for each completed step that names one, with the
-- step's input and output, in reverse dependency order, each recorded once in the new table
-- compensations. runs gain compensation (running, completed, stopped) and compensation_of (the
-- run a compensation's run compensates); retry_compensation resumes a stopped chain, and
-- get_run_compensations lists a run's compensations. A compensated run is not retried
-- (retry_run, retry_run_from and retry_runs refuse or pass over it). add_step changes its
-- signature (one argument with a default); the functions workers call do not change.
--
-- Retention keeps a failure handler's run and a compensation's run while the run they handle
-- is kept (_prunable_runs): by their own flow's shorter retention they were pruned first,
-- leaving the failed run without the link to its handler and a stopped compensation without
-- the run `retry --compensation` retries. Only a function changes.

-- A step may cache its tasks' outputs (steps.opt_cache_ttl, opt_cache_key, opt_cache_fingerprint;
-- add_step's cache_ttl, cache_key, cache_fingerprint): a completed task's output is kept in the
-- new table step_cache under the key of its input and the step's fingerprint until its time to
-- live passes, and a task of the step whose key has an entry when the step starts completes at
-- once with it, without a queue message (step_tasks.message_id becomes nullable) and without a
-- worker (step_tasks.cached, a new column, false for every existing task). The maintenance tick
-- deletes expired entries; retry_run_from deletes the entries of the steps it reruns, and
-- delete_flow_and_data those of its flow.
-- add_step changes its signature (three arguments with defaults);
-- the functions workers call keep theirs, and a step without a cache is completed as before.

-- A queue's archive may be turned off (`archive: false` in its `kind: queue` document): the
-- messages of its ended tasks (completed, failed, skipped, cancelled, recovered, their flow
-- deleted) are then deleted instead of archived, by the new _end_queue_messages, which
-- _archive_tasks, _complete_one and the claims' terminal path call, and the new queue
-- operation _queue_delete_batch (written by _write_queue_ops for every registered queue).
-- queues gains archive_messages (true for every existing queue: archived, as before);
-- set_queue_limits gains the argument archive (a drop and a create: compiled files of 0.1.0
-- call it by name with four arguments and keep working, archive true), and
-- keep_only_queue_limits turns the archive of undeclared queues on again. The functions workers
-- call keep their signatures.
--
-- The started tasks are read from step_tasks itself, through the new partial index
-- step_tasks_started_idx (queue_name, where status = 'started'): stalled recovery
-- (requeue_stalled_tasks) and a queue's concurrency limit (_open_queue_gate,
-- queue_flow_control) read it, and the table task_leases, with the three triggers and the
-- function _track_leases that kept it, is dropped. A task started before the upgrade is in the
-- index, so it is recovered as before. The wake of a limited queue's workers when a started
-- task ends moves to the new trigger step_tasks_wake_freed_queues (_wake_freed_queues). The
-- index is built inside the migration's transaction: writes to step_tasks wait for it. The
-- functions the previous release's workers call keep their signatures.

-- A batch of completions does less for the same result (_complete_batch, _steps_done): the
-- dependents of its completed steps are read once, and those it makes ready start in the
-- update that counts their deps when each is a plain task step (a queue, no condition, tasks
-- to run), as a single completion already did, instead of a second update through
-- _progress_runs, which now runs only where a ready dependent has a condition, no task or no
-- queue; a batch of leaf steps updates no dependent; a batch whose every item completed its
-- task returns the rows its update returned instead of reading them again. Only functions
-- change; their signatures stay.
--
-- Time-ordered run ids: a run the engine starts without an id given gets one from the new
-- _uuid_v7 (a UUID of version 7: the time in milliseconds, then random bits) instead of
-- gen_random_uuid(), and so does the default of runs.run_id. A new run's index entries land
-- on the rightmost pages of the primary keys of runs, step_states and step_tasks, which stay
-- in shared buffers however long the history grows; a random id reads and dirties a page
-- anywhere in them. Existing runs keep their ids; ids given by callers are kept as given. Only
-- the two functions that make runs change, with their signatures; workers call neither.

-- Plans that do not depend on what the tables held when they were made: _enqueue_started bounds
-- the runs it joins by `run_id = any` (its batch's ids), and the lease trigger _track_leases
-- the leases it deletes, running with enable_seqscan = off (and jit = off). Planned while runs or task_leases
-- held a few rows, each read the whole table on every later start, claim or completion. Only
-- the two function bodies change; the trigger keeps its function.

-- A step's state in its task: a root step of one task (no dependency, single, no concurrency
-- limit, no cache: the new _state_in_task) of a run that begins at its start (started alone or
-- with others, no later start_at, no flow concurrency limit; root steps with a queue, no
-- condition, no map over an empty array: the new _starts_plainly) writes no step_states row;
-- its task holds the state (step_tasks.step_started_at, a new nullable column: the step's
-- start, null for every existing task) and the new view all_step_states reads every step's
-- state from both tables. Waiting, held and debounced runs keep a row for every step.
-- A failure, skip, cancel or retry of such a run writes the state into step_states first (the
-- new _unfold_step_states). step_tasks' foreign key points at runs instead of step_states (a
-- task's step may have no row). Runs in flight keep a row for every step, which every path
-- reads as before. The console's steps of a run read all_step_states; the previous
-- release's workers read step states only for wait steps and failed steps, which keep rows.
-- Function signatures are kept; _start_tasks, _claim_one, _lock_one, _lock_and_classify,
-- _complete_one, _complete_batch, _new_run and _new_runs change their bodies. The new
-- _enqueue_steps and _send_step_tasks are told whether the steps keep their states in their
-- tasks (no row looked up per task sent); _enqueue_started and _send_tasks, which the previous
-- release's functions call while this migration commits, send through them the tasks of steps
-- that have rows.

-- Run indexes: a flow's runs are one index, runs_flow_idx on (flow_slug, started_at, run_id),
-- in place of runs_flow_idx (flow_slug) and runs_prune_idx (flow_slug, started_at, of the
-- finished runs only): retention reads a flow's oldest runs from it, the lists filtered by flow
-- their newest (a backward scan, in their order), and the foreign key's check of a deleted flow
-- its runs. A run's end writes one index entry less (it is not a HOT update: its status is in
-- index keys and predicates), and so does the start of a run that waits. The index is built
-- inside the migration's transaction: starts and ends of runs wait for it (a few seconds per
-- million runs). Only indexes change.

-- == Written by hand: tables, types and data that the functions need ==

-- fenced results and rerun from a step: the attempt history records an operator's
-- completion by hand ('overridden') and a rerun step's completed tasks with their output
-- ('superseded')
alter table flowlane.task_attempts add column output jsonb;
alter table flowlane.task_attempts drop constraint task_attempts_outcome_valid,
  add constraint task_attempts_outcome_valid
  check (outcome in ('retry', 'failed', 'stalled', 'overridden', 'superseded'));

-- events in:
alter table flowlane.runs add column origin jsonb;

create table flowlane.triggers (
  trigger_name text not null,
  flow_name text not null,
  table_name text not null,
  events text[] not null,
  when_pattern jsonb,
  unless_pattern jsonb,
  input_map jsonb,
  key_pointer text,
  on_refused text default 'fail' not null,
  row_key text[],
  created_at timestamptz default now() not null,
  updated_at timestamptz default now() not null,
  constraint triggers_pkey primary key (trigger_name),
  constraint triggers_events_valid check (cardinality(events) > 0 and events <@ array['insert', 'update', 'delete']),
  constraint triggers_name_valid check (flowlane.is_valid_slug(trigger_name)),
  constraint triggers_on_refused_valid check (on_refused in ('fail', 'record'))
);

create table flowlane.trigger_refusals (
  refusal_id bigint generated always as identity not null,
  trigger_name text not null,
  refused_at timestamptz default now() not null,
  event jsonb not null,
  error text not null,
  constraint trigger_refusals_pkey primary key (refusal_id)
);

create index trigger_refusals_trigger_idx on flowlane.trigger_refusals (trigger_name, refused_at desc);

create index runs_trigger_idx on flowlane.runs ((origin ->> 'trigger')) where (origin ? 'trigger');

-- concurrency when_full:
alter table flowlane.flows add column opt_concurrency_when_full text default 'queue' not null;
alter table flowlane.flows add constraint flows_concurrency_when_full_valid
  check (opt_concurrency_when_full in ('queue', 'replace_waiting', 'cancel_running'));

-- debounce:
alter table flowlane.flows add column opt_debounce_key text, add column opt_debounce_period int,
  add column opt_debounce_max_wait int;
alter table flowlane.flows
  add constraint flows_debounce_period_positive check ((opt_debounce_period is null) or (opt_debounce_period >= 1)),
  add constraint flows_debounce_key_pointer check ((opt_debounce_key is null) or (opt_debounce_key ~ '^(/([^~/]|~[01])*)+$')),
  add constraint flows_debounce_needs_period check (((opt_debounce_key is null) and (opt_debounce_max_wait is null)) or (opt_debounce_period is not null)),
  add constraint flows_debounce_max_wait_covers_period check ((opt_debounce_max_wait is null) or (opt_debounce_max_wait >= opt_debounce_period));
alter table flowlane.runs add column debounce_key text, add column debounce_since timestamptz;
create unique index runs_debounce_pending_unique on flowlane.runs (flow_slug, debounce_key)
  where ((debounce_key is not null) and (status = 'waiting') and (hold_seq is null));

-- failure handlers: the flow a flow's failures start, and the run a handler's run handles
alter table flowlane.flows add column opt_on_failure text,
  add column opt_on_failure_on_cancel boolean default false not null,
  add constraint flows_on_failure_slug check ((opt_on_failure is null) or flowlane.is_valid_slug(opt_on_failure));
alter table flowlane.runs add column failure_of uuid;
-- a run's failure handler run (20_on_failure.sql): at most one per failed run
create unique index runs_failure_of_unique on flowlane.runs (failure_of) where (failure_of is not null);

-- compensation: what a step names, what a run's compensation is, and each compensation
alter table flowlane.steps add column opt_compensate text,
  add constraint steps_compensate_slug check ((opt_compensate is null) or flowlane.is_valid_slug(opt_compensate));
-- (runs keep their one CHECK, runs_rules: compensation is written by 21_compensation.sql only)
alter table flowlane.runs add column compensation text, add column compensation_of uuid;
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

-- step cache: each cached step's options, the tasks completed from the cache (no message),
-- and the entries
alter table flowlane.steps add column opt_cache_ttl int, add column opt_cache_key text[],
  add column opt_cache_fingerprint text,
  add constraint steps_cache_ttl_positive check ((opt_cache_ttl is null) or (opt_cache_ttl >= 1)),
  add constraint steps_cache_needs_ttl check ((opt_cache_ttl is not null) or ((opt_cache_key is null) and (opt_cache_fingerprint is null))),
  add constraint steps_cache_needs_tasks check ((opt_cache_ttl is null) or (queue_name is not null));
-- (a task has a queue message unless it completed from the cache: only 23_cache.sql inserts
-- one without; the message id stays an immutable identity once written)
alter table flowlane.step_tasks alter column message_id drop not null,
  add column cached boolean default false not null;
create table flowlane.step_cache (
  flow_slug text not null,
  step_slug text not null,
  fingerprint text not null,
  key_hash text not null,
  output jsonb,
  created_at timestamptz default now() not null,
  expires_at timestamptz not null,
  constraint step_cache_pkey primary key (flow_slug, step_slug, fingerprint, key_hash),
  constraint step_cache_expires_after_created check (expires_at > created_at)
);
create index step_cache_expires_idx on flowlane.step_cache (expires_at);

-- queue archive: whether a queue's ended messages are archived (the default, every existing
-- queue) or deleted
alter table flowlane.queues add column archive_messages boolean default true not null;

-- task leases: the started tasks are read from step_tasks through a partial index, which
-- replaces the table of leases and the triggers that kept it (a started task is in the index
-- as it was in the table: recoverable as before)
drop trigger step_tasks_leases_on_insert on flowlane.step_tasks;
drop trigger step_tasks_leases_on_update on flowlane.step_tasks;
drop trigger step_tasks_leases_on_delete on flowlane.step_tasks;
drop table flowlane.task_leases;
create index step_tasks_started_idx on flowlane.step_tasks (queue_name) where (status = 'started');

-- step state in the task: a root step of one task started with its run keeps its state in its
-- task (step_started_at); the view all_step_states reads every step's state. The tasks of runs
-- in flight keep step_started_at null: their steps keep their rows, which every path reads.
alter table flowlane.step_tasks add column step_started_at timestamptz;
alter table flowlane.step_tasks drop constraint step_tasks_run_id_step_slug_fkey,
  add constraint step_tasks_run_id_fkey foreign key (run_id) references flowlane.runs(run_id);
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

-- run indexes: runs_flow_idx (flow_slug) and runs_prune_idx (flow_slug, started_at, finished
-- runs) become one index, runs_flow_idx on (flow_slug, started_at, run_id)
drop index flowlane.runs_prune_idx;
drop index flowlane.runs_flow_idx;
create index runs_flow_idx on flowlane.runs (flow_slug, started_at, run_id);

-- == Drafted from the engine source by `python -m flowlane.core.draft_migration`; redrafted, never edited ==

set local check_function_bodies = off;

drop function flowlane._track_leases();

-- REVIEW: flowlane.add_step(text,text,text[],integer,integer,integer,integer,text,jsonb,jsonb,text,text,text,text,integer,text) is called by flowlane.ensure_flow_compiled(text,jsonb): a call in flight when this migration commits runs their old bodies to the end and fails without it; keep the signature while the previous release's workers may call them (CONTRIBUTING, rules for migrations)

drop function flowlane.add_step(text,text,text[],integer,integer,integer,integer,text,jsonb,jsonb,text,text,text,text,integer,text);

-- REVIEW: flowlane.create_flow(text,integer,integer,integer,text,integer,integer,text,integer,text,integer) is called by flowlane.ensure_flow_compiled(text,jsonb): a call in flight when this migration commits runs their old bodies to the end and fails without it; keep the signature while the previous release's workers may call them (CONTRIBUTING, rules for migrations)

drop function flowlane.create_flow(text,integer,integer,integer,text,integer,integer,text,integer,text,integer);

-- REVIEW: flowlane.expire_waits(timestamp with time zone) is called by flowlane.maintenance_tick(timestamp with time zone): a call in flight when this migration commits runs their old bodies to the end and fails without it; keep the signature while the previous release's workers may call them (CONTRIBUTING, rules for migrations)

drop function flowlane.expire_waits(timestamp with time zone);

drop function flowlane.maintenance_tick(timestamp with time zone);

drop function flowlane.prunable_runs(timestamp with time zone,text[],integer);

-- REVIEW: flowlane.prune_runs(timestamp with time zone,text[],integer,integer) is called by flowlane.maintenance_tick(timestamp with time zone): a call in flight when this migration commits runs their old bodies to the end and fails without it; keep the signature while the previous release's workers may call them (CONTRIBUTING, rules for migrations)

drop function flowlane.prune_runs(timestamp with time zone,text[],integer,integer);

drop function flowlane.set_queue_limits(text,integer,integer,integer);

-- The engine's clock: whatever the engine records or compares a time with reads it through
-- these two, never now() or clock_timestamp() directly (a queue message's visibility is the
-- exception: PGMQ keeps it on PostgreSQL's clock). They are plain SQL functions without
-- settings and with every name qualified, so that the planner inlines them into their callers:
-- the same plans and the same cost as the built-ins. Nothing in a database migrated by
-- flowlane can move them. The test databases of flowlane's pytest plugin (flowlane.testing),
-- throwaway copies of a template, replace _now() there with one that adds the test's offset,
-- and point the time columns' defaults (now(), the same time here) at these two.
-- (SQL-standard bodies: stored parsed, so that inlining them does not parse them again)
create or replace function flowlane._now() returns timestamptz
language sql stable parallel safe
return pg_catalog.now();

-- the engine's clock_timestamp(): its _now() plus the time since the transaction began
create or replace function flowlane._clock_timestamp() returns timestamptz
language sql volatile parallel safe
return flowlane._now() operator(pg_catalog.+) (pg_catalog.clock_timestamp() operator(pg_catalog.-) pg_catalog.now());

-- A new run's id: a UUID of version 7, its first 48 bits the engine's clock in milliseconds,
-- the rest random (a version 4 UUID's bits, with the version changed), so that the ids made one
-- after another sort together. A new run's entries in the primary keys of runs, step_states and
-- step_tasks then land on the few rightmost pages of each, which stay in shared buffers, and
-- its later lookups find them there: a random id lands on any page of an index the size of the
-- whole history, which shared buffers stop holding once the history grows. PostgreSQL 18's
-- uuidv7() makes ids of the same kind; this one runs on the older majors too. Without
-- settings, and inlined like the clock.
create or replace function flowlane._uuid_v7() returns uuid
language sql volatile parallel safe
return pg_catalog.encode(
  pg_catalog.set_bit(pg_catalog.set_bit(
    pg_catalog.overlay(pg_catalog.uuid_send(pg_catalog.gen_random_uuid()),
      pg_catalog.substr(pg_catalog.int8send(pg_catalog.floor(
        pg_catalog.date_part('epoch', flowlane._clock_timestamp()) operator(pg_catalog.*) 1000)::bigint), 3),
      1, 6),  -- bytes 1-6: the milliseconds
    52, 1), 53, 1),  -- the version's bits: 0100 (4) becomes 0111 (7)
  'hex')::uuid;

-- pgmq.enable_notify_insert installs a row trigger that updates one row of
-- pgmq.notify_insert_throttle per queue on every insert: every enqueue
-- (start_flow, complete_task starting dependents) serialised on that row
-- while holding run locks, which deadlocked under load. This trigger is per
-- statement and writes nothing; PostgreSQL folds identical notifications of
-- one transaction into one. Same channel as PGMQ's: pgmq.q_<queue>.INSERT.
--
-- A commit that notifies holds PostgreSQL's notification lock (one for the whole cluster)
-- through its WAL flush, so notifying commits flush one after another: under a steady rate
-- of starts they queued for it. So a queue has at most one notifying transaction in flight:
-- an insert while another transaction's notification of the queue is on its way (that one
-- holds the queue's notifier lock until it ends) sends none. Every inserting transaction holds
-- one of the queue's inserter locks (_queue_inserter_locks), shared, until it ends, and a
-- worker about to wait for a notification first waits for the holders of each in turn
-- (await_queue_inserts), then claims once more: woken by the notification that was on its
-- way, it finds the messages whose own was left out as soon as they are committed. While
-- workers wait for some inserter locks, inserts take another; an insert that can take none
-- notifies.
create or replace function flowlane._notify_queue_insert() returns trigger
language plpgsql volatile
set search_path = ''
as $$
declare
  v_queue constant int := hashtext(tg_table_name);
  v_lock int;
begin
  foreach v_lock in array flowlane._queue_inserter_locks() loop
    if pg_try_advisory_xact_lock_shared(v_lock, v_queue) then
      if pg_try_advisory_xact_lock(hashtext('flowlane.queue_notifier'), v_queue) then
        exit;  -- no notification of this queue is on its way: this one sends it
      end if;
      return null;  -- another transaction's notification of this queue is on its way
    end if;
  end loop;
  perform pg_notify('pgmq.' || tg_table_name || '.INSERT', null);
  return null;
end;
$$;

-- the first key of each inserter lock (the second is the queue's): more of them than the
-- workers of a queue that wait for them at once, so that an insert finds one free
create or replace function flowlane._queue_inserter_locks() returns int[]
language sql immutable
set search_path = ''
as $$
  select array[hashtext('flowlane.queue_inserters'), hashtext('flowlane.queue_inserters_2'),
               hashtext('flowlane.queue_inserters_3'), hashtext('flowlane.queue_inserters_4')]
$$;

-- what a worker calls before it waits for the queue's notification: wait (at most timeout_ms
-- for each inserter lock) until the transactions inserting into the queue have ended, so that
-- its next claim sees what they committed; false when a wait timed out (a long transaction
-- inserted: the worker cannot know whether a notification is on its way)
create or replace function flowlane.await_queue_inserts(queue_name text, timeout_ms integer default 50)
returns boolean
language plpgsql volatile
set search_path = ''
as $$
declare
  v_table text;
  v_settled boolean := true;
  v_lock int;
begin
  select pgmq.format_table_name(q.pgmq_queue_name, 'q') into v_table
  from flowlane.queues q where q.queue_name = await_queue_inserts.queue_name;
  if v_table is null then
    v_table := pgmq.format_table_name(await_queue_inserts.queue_name, 'q');
  end if;
  perform set_config('lock_timeout', greatest(1, timeout_ms) || 'ms', true);
  -- one lock after the other, never two held: inserts meanwhile take one not waited for.
  -- Each is a transaction lock taken in a block that always ends in an exception, whose
  -- rollback releases it: a session lock would outlive an error raised after its grant (a
  -- lock timeout firing as the lock is granted raises once it is held), and every insert
  -- and every other worker's wait would then find it taken until the connection closed.
  foreach v_lock in array flowlane._queue_inserter_locks() loop
    begin
      perform pg_advisory_xact_lock(v_lock, hashtext(v_table));
      raise exception using errcode = 'FLW01';  -- granted: the inserters before it have ended
    exception
      when lock_not_available then v_settled := false;
      when sqlstate 'FLW01' then null;
    end;
  end loop;
  return v_settled;
end;
$$;

create or replace function flowlane.adopt_queue(queue_name text) returns flowlane.queues
language plpgsql volatile
set search_path = ''
as $$
declare
  v_name text := lower(adopt_queue.queue_name);
  v_pgmq text;
  v_row flowlane.queues;
  v_foreign bigint;
  v_sample bigint[];
begin
  perform flowlane._check_queue_argument('adopt_queue', v_name);
  perform pg_advisory_xact_lock(hashtext('flowlane.queue:' || v_name));
  v_pgmq := flowlane._pgmq_queue(v_name);
  if v_pgmq is null then
    raise exception 'adopt_queue: there is no PGMQ queue named "%"', adopt_queue.queue_name
      using errcode = 'P0002',
            hint = 'adoption is for queues that exist already; flowlane creates the queues its flows route to when their SQL is applied';
  end if;
  select * into v_row from flowlane.queues q where q.queue_name = v_name for update;
  if found and v_row.ownership = 'owned' then
    raise exception 'adopt_queue: queue "%" is owned by flow "%"; an owned queue is never shared',
      v_name, v_row.owner_flow_slug using errcode = '42501';
  end if;
  if found then
    return v_row;  -- already shared: nothing to do
  end if;
  -- hold off senders while the messages are checked
  execute format('lock table pgmq.%I in share row exclusive mode', pgmq.format_table_name(v_pgmq, 'q'));
  execute format(
    'select count(*), (array_agg(m.msg_id order by m.msg_id))[1:5] from pgmq.%I m '
    'where not exists (select 1 from flowlane.step_tasks t where t.queue_name = $1 and t.message_id = m.msg_id)',
    pgmq.format_table_name(v_pgmq, 'q'))
    into v_foreign, v_sample using v_name;
  if v_foreign > 0 then
    raise exception 'adopt_queue: PGMQ queue "%" holds % message(s) that no flowlane task tracks (message ids %)',
      v_pgmq, v_foreign, array_to_string(v_sample, ', ')
      using errcode = '55000',
            hint = 'flowlane adopts only an empty queue or one whose every message belongs to a flowlane task; drain or move the other messages, then adopt again';
  end if;
  insert into flowlane.queues (queue_name, ownership, owner_flow_slug, pgmq_queue_name, adopted_at)
  values (v_name, 'shared', null, v_pgmq, flowlane._now())
  returning * into v_row;
  return v_row;
end;
$$;

-- end the messages of the given tasks, one call per queue in queue order, each queue's ids sorted
create or replace function flowlane._archive_tasks(tasks flowlane.step_tasks[]) returns int
language plpgsql volatile
set search_path = ''
as $$
declare
  v_group record;
  v_total int := 0;
begin
  for v_group in
    select flowlane._task_queue(t) as queue_name, array_agg(t.message_id order by t.message_id) as ids
    from unnest(tasks) as t
    where t.message_id is not null
    group by 1
    order by 1
  loop
    v_total := v_total + flowlane._end_queue_messages(v_group.queue_name, v_group.ids);
  end loop;
  return v_total;
end;
$$;

-- what becomes of a queue's messages whose task no longer needs them: archived (PGMQ's
-- archive table keeps them), or deleted where the queue's `kind: queue` document turns its
-- archive off (queues.archive_messages, written by set_queue_limits); returns how many ended
create or replace function flowlane._end_queue_messages(p_queue text, p_msg_ids bigint[]) returns int
language plpgsql volatile
set search_path = ''
as $$
declare
  v_n int;
begin
  if exists (select 1 from flowlane.queues q where q.queue_name = p_queue and not q.archive_messages) then
    select count(*) into v_n from flowlane._queue_delete_batch(p_queue, p_msg_ids);
  else
    select count(*) into v_n from flowlane._queue_archive_batch(p_queue, p_msg_ids);
  end if;
  return v_n;
end;
$$;

-- The queue operations: a claim's read, the archive of one message and of a batch, the
-- deletion of a batch, the visibility of a batch, a task's send and a batch's. PGMQ's
-- functions name the queue's table at run time, so they build and plan their statement on
-- every call (120-450 µs here, more than the statement itself). These seven are written by _write_queue_ops with one branch per
-- registered queue, each branch a static statement PL/pgSQL plans once per connection; a
-- queue without a branch (not registered, or its table made after the last rewrite) goes to
-- PGMQ's function. Each branch means what PGMQ's call means (tests/core/test_queue_ops.py
-- compares them).
create or replace function flowlane._write_queue_ops() returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_read text;
  v_archive text;
  v_send text;
  v_send_batch text;
  v_archive_batch text;
  v_delete_batch text;
  v_set_vt text;
  v_op record;
begin
  perform pg_advisory_xact_lock(hashtext('flowlane.queue_ops'));
  with queues as (
    select q.queue_name, pgmq.format_table_name(q.queue_name, 'q') as q_table,
           pgmq.format_table_name(q.queue_name, 'a') as a_table
    from flowlane.queues q
  )
  select
    string_agg(format($b$if p_queue = %L then
    v_ids := array(select q.msg_id from pgmq.%I q where q.vt <= clock_timestamp()
                   order by q.msg_id limit p_qty for update skip locked);
    return query
      update pgmq.%2$I m
         set last_read_at = clock_timestamp(), vt = clock_timestamp() + make_interval(secs => p_vt),
             read_ct = m.read_ct + 1
       where m.msg_id = any (v_ids)
      returning m.msg_id, m.read_ct, m.enqueued_at, m.last_read_at, m.vt, m.message, m.headers;
    return;
  end if;$b$, x.queue_name, x.q_table), E'\n  ' order by x.queue_name),
    string_agg(format($b$if p_queue = %L then
    with archived as (delete from pgmq.%I q where q.msg_id = p_msg_id
                      returning q.msg_id, q.vt, q.read_ct, q.enqueued_at, q.last_read_at, q.message, q.headers)
    insert into pgmq.%I (msg_id, vt, read_ct, enqueued_at, last_read_at, message, headers)
    select a.msg_id, a.vt, a.read_ct, a.enqueued_at, a.last_read_at, a.message, a.headers from archived a
    returning msg_id into v_id;
    return v_id is not null;
  end if;$b$, x.queue_name, x.q_table, x.a_table), E'\n  ' order by x.queue_name),
    string_agg(format($b$if p_queue = %L then
    insert into pgmq.%I (vt, message, headers)
    values (clock_timestamp() + make_interval(secs => p_delay), p_msg, null)
    returning msg_id into v_id;
    return v_id;
  end if;$b$, x.queue_name, x.q_table), E'\n  ' order by x.queue_name),
    string_agg(format($b$if p_queue = %L then
    return query
      insert into pgmq.%I (vt, message, headers)
      select v_vt, m.msg, null from unnest(p_msgs) as m (msg)
      returning msg_id;
    return;
  end if;$b$, x.queue_name, x.q_table), E'\n  ' order by x.queue_name),
    string_agg(format($b$if p_queue = %L then
    return query
      with archived as (delete from pgmq.%I q where q.msg_id = any (p_msg_ids)
                        returning q.msg_id, q.vt, q.read_ct, q.enqueued_at, q.last_read_at, q.message, q.headers)
      insert into pgmq.%I (msg_id, vt, read_ct, enqueued_at, last_read_at, message, headers)
      select a.msg_id, a.vt, a.read_ct, a.enqueued_at, a.last_read_at, a.message, a.headers from archived a
      returning msg_id;
    return;
  end if;$b$, x.queue_name, x.q_table, x.a_table), E'\n  ' order by x.queue_name),
    string_agg(format($b$if p_queue = %L then
    return query delete from pgmq.%I q where q.msg_id = any (p_msg_ids) returning q.msg_id;
    return;
  end if;$b$, x.queue_name, x.q_table), E'\n  ' order by x.queue_name),
    string_agg(format($b$if p_queue = %L then
    update pgmq.%I m set vt = clock_timestamp() + make_interval(secs => p_vt) where m.msg_id = any (p_msg_ids);
    get diagnostics v_n = row_count;
    return v_n;
  end if;$b$, x.queue_name, x.q_table), E'\n  ' order by x.queue_name)
    into v_read, v_archive, v_send, v_send_batch, v_archive_batch, v_delete_batch, v_set_vt
  from queues x
  where to_regclass(format('pgmq.%I', x.q_table)) is not null
    and to_regclass(format('pgmq.%I', x.a_table)) is not null;
  for v_op in
    select * from (values
      ($h$_queue_read(p_queue text, p_vt int, p_qty int) returns setof pgmq.message_record$h$,
       $l$v_ids bigint[];  -- two statements: a generic plan of PGMQ's one joins the whole queue$l$,
       v_read, $r$return query select * from pgmq.read(p_queue, p_vt, p_qty);$r$),
      ($h$_queue_archive(p_queue text, p_msg_id bigint) returns boolean$h$, $l$v_id bigint;$l$,
       v_archive, $r$return pgmq.archive(p_queue, p_msg_id);$r$),
      ($h$_queue_archive_batch(p_queue text, p_msg_ids bigint[]) returns setof bigint$h$, '',
       v_archive_batch, $r$return query select * from pgmq.archive(p_queue, p_msg_ids);$r$),
      ($h$_queue_delete_batch(p_queue text, p_msg_ids bigint[]) returns setof bigint$h$, '',
       v_delete_batch, $r$return query select * from pgmq.delete(p_queue, p_msg_ids);$r$),
      ($h$_queue_set_vt(p_queue text, p_msg_ids bigint[], p_vt int) returns int$h$, $l$v_n int;$l$,
       v_set_vt, $r$select count(*) into v_n from pgmq.set_vt(p_queue, p_msg_ids, p_vt);
  return v_n;$r$),
      ($h$_queue_send(p_queue text, p_msg jsonb, p_delay int) returns bigint$h$, $l$v_id bigint;$l$,
       v_send, $r$select m.id into v_id from pgmq.send(p_queue, p_msg, p_delay) m (id);
  return v_id;$r$),
      ($h$_queue_send_batch(p_queue text, p_msgs jsonb[], p_delay int) returns setof bigint$h$,
       $l$v_vt timestamptz := clock_timestamp() + make_interval(secs => p_delay);$l$,
       v_send_batch, $r$return query select * from pgmq.send_batch(p_queue, p_msgs, p_delay);$r$)
    ) as o (head, locals, branches, fallback)
  loop
    execute format($f$create or replace function flowlane.%s
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- a plan made while the queue was small stays on its keys
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
set plan_cache_mode = force_generic_plan
as $body$
declare
  %s
begin
  %s
  %s
end;
$body$;$f$, v_op.head, v_op.locals, coalesce(v_op.branches, ''), v_op.fallback);
  end loop;
end;
$$;

-- two transactions applying the same flow file raced between the existence
-- check and the insert and one failed on flows_slug_ci_unique; the lock on
-- the lowercase slug makes the second wait and then find the first's rows.
-- retention: seconds a finished run is kept; null keeps runs for ever (so, unlike
-- the other options, leaving it out is what gives the default)
create or replace function flowlane.create_flow(
  flow_slug text,
  max_attempts int = null,
  base_delay int = null,
  timeout int = null,
  queue_mode text = 'flow',
  retention int = flowlane._flow_option_default('retention'),
  deadline int = null,
  dedup_key text = null,
  concurrency_limit int = null,
  concurrency_key text = null,
  priority int = null,
  concurrency_when_full text = null,
  debounce_key text = null,
  debounce_period int = null,
  debounce_max_wait int = null,
  on_failure text = null,
  on_failure_on_cancel boolean = false
) returns flowlane.flows
language plpgsql volatile
set search_path = ''
as $$
declare
  v_flow flowlane.flows;
  v_old flowlane.flows;
  v_other text;
  v_mode text := coalesce(create_flow.queue_mode, 'flow');
begin
  perform flowlane._check_slug('flow', create_flow.flow_slug);
  if v_mode not in ('flow', 'per-step', 'explicit') then
    raise exception 'flow "%": queue_mode must be flow, per-step or explicit, not %',
      create_flow.flow_slug, quote_literal(v_mode) using errcode = '22023';
  end if;
  if v_mode = 'flow' and length(create_flow.flow_slug) > 47 then
    raise exception 'flow "%": with queue_mode flow the queue is the lowercase flow slug, which must have at most 47 characters (the PGMQ limit)',
      create_flow.flow_slug using errcode = '22023', hint = 'use a shorter slug, or per-step/explicit queues';
  end if;
  perform flowlane._check_start_options(create_flow.flow_slug, create_flow.deadline, create_flow.dedup_key);
  perform flowlane._check_flow_control_options(format('flow "%s"', create_flow.flow_slug),
    create_flow.concurrency_limit, create_flow.concurrency_key, create_flow.priority);
  perform flowlane._check_when_full(format('flow "%s"', create_flow.flow_slug), create_flow.concurrency_limit,
    create_flow.concurrency_when_full);
  perform flowlane._check_debounce(format('flow "%s"', create_flow.flow_slug), create_flow.debounce_key,
    create_flow.debounce_period, create_flow.debounce_max_wait);
  perform flowlane._check_on_failure(create_flow.flow_slug, create_flow.on_failure);
  perform pg_advisory_xact_lock(hashtext('flowlane.flow'), hashtext(lower(create_flow.flow_slug)));
  select f.flow_slug into v_other from flowlane.flows f
  where lower(f.flow_slug) = lower(create_flow.flow_slug) and f.flow_slug <> create_flow.flow_slug;
  if found then
    raise exception 'flow slug "%" conflicts with existing flow "%" (flow slugs are unique case-insensitively)',
      create_flow.flow_slug, v_other using errcode = '23505';
  end if;
  select * into v_flow from flowlane.flows f where f.flow_slug = create_flow.flow_slug for update;
  v_old := v_flow;
  if found and v_flow.queue_mode <> v_mode then
    raise exception 'FLOWLANE_SHAPE_MISMATCH: flow "%" exists with queue_mode %, not %',
      create_flow.flow_slug, v_flow.queue_mode, v_mode
      using errcode = '23514',
            hint = 'the queue mode is part of the flow''s shape; create a new flow version (a new slug)';
  end if;
  if create_flow.retention is not null and create_flow.retention < 1 then
    raise exception 'flow "%": retention must be at least 1 second (null keeps runs for ever), got %',
      create_flow.flow_slug, create_flow.retention using errcode = '22023';
  end if;
  insert into flowlane.flows as f (flow_slug, opt_max_attempts, opt_base_delay, opt_timeout, queue_mode,
                                   opt_retention, opt_deadline, opt_dedup_key, opt_concurrency_limit,
                                   opt_concurrency_key, opt_priority, opt_concurrency_when_full,
                                   opt_debounce_key, opt_debounce_period, opt_debounce_max_wait, opt_on_failure,
                                   opt_on_failure_on_cancel)
  values (create_flow.flow_slug, coalesce(max_attempts, flowlane._flow_option_default('max_attempts')),
          coalesce(base_delay, flowlane._flow_option_default('base_delay')),
          coalesce(timeout, flowlane._flow_option_default('timeout')), v_mode, create_flow.retention,
          create_flow.deadline, create_flow.dedup_key, create_flow.concurrency_limit,
          nullif(create_flow.concurrency_key, ''), create_flow.priority,
          coalesce(create_flow.concurrency_when_full, 'queue'),
          nullif(create_flow.debounce_key, ''), create_flow.debounce_period, create_flow.debounce_max_wait,
          create_flow.on_failure, coalesce(create_flow.on_failure_on_cancel, false))
  on conflict on constraint flows_pkey do update
    set opt_max_attempts = excluded.opt_max_attempts,
        opt_base_delay = excluded.opt_base_delay,
        opt_timeout = excluded.opt_timeout,
        opt_retention = excluded.opt_retention,
        opt_deadline = excluded.opt_deadline,
        opt_dedup_key = excluded.opt_dedup_key,
        opt_concurrency_limit = excluded.opt_concurrency_limit,
        opt_concurrency_key = excluded.opt_concurrency_key,
        opt_priority = excluded.opt_priority,
        opt_concurrency_when_full = excluded.opt_concurrency_when_full,
        opt_debounce_key = excluded.opt_debounce_key,
        opt_debounce_period = excluded.opt_debounce_period,
        opt_debounce_max_wait = excluded.opt_debounce_max_wait,
        opt_on_failure = excluded.opt_on_failure,
        opt_on_failure_on_cancel = excluded.opt_on_failure_on_cancel
  returning * into v_flow;
  if v_old.flow_slug is not null and (v_old.opt_concurrency_limit, v_old.opt_concurrency_key)
     is distinct from (v_flow.opt_concurrency_limit, v_flow.opt_concurrency_key) then
    perform flowlane._flow_limits_changed(v_flow.flow_slug);
  end if;
  return v_flow;
end;
$$;

create or replace function flowlane.add_step(
  flow_slug text,
  step_slug text,
  deps_slugs text[] = '{}',
  max_attempts int = null,
  base_delay int = null,
  timeout int = null,
  start_delay int = null,
  step_type text = 'single',
  required_input_pattern jsonb = null,
  forbidden_input_pattern jsonb = null,
  when_unmet text = 'skip',
  when_exhausted text = 'fail',
  queue_name text = null,
  child_flow text = null,
  concurrency_limit int = null,
  concurrency_key text = null,
  compensate text = null,
  cache_ttl int = null,
  cache_key text[] = null,
  cache_fingerprint text = null
) returns flowlane.steps
language plpgsql volatile
set search_path = ''
as $$
declare
  v_flow text := add_step.flow_slug;
  v_step text := add_step.step_slug;
  v_deps text[] := coalesce(deps_slugs, '{}');
  v_type text := coalesce(add_step.step_type, 'single');
  v_unmet text := coalesce(add_step.when_unmet, 'skip');
  v_exhausted text := coalesce(add_step.when_exhausted, 'fail');
  v_mode text;
  v_queue text;
  v_index int;
  v_existing flowlane.steps;
  v_existing_deps text[];
  v_sorted_deps text[];
  v_dep text;
  v_other text;
  v_row flowlane.steps;
begin
  select f.queue_mode into v_mode from flowlane.flows f where f.flow_slug = v_flow for update;
  if not found then
    raise exception 'unknown flow "%": create it with flowlane.create_flow first', v_flow
      using errcode = '23503';
  end if;
  perform flowlane._check_slug('step', v_step);
  if v_type not in ('single', 'map', 'wait') then
    raise exception 'step "%" of flow "%": step_type must be single, map or wait, not %', v_step, v_flow,
      quote_literal(v_type) using errcode = '22023';
  end if;
  if v_type = 'map' and cardinality(v_deps) > 1 then
    raise exception 'map step "%" of flow "%" has % dependencies: a map step has 0 (it maps the run input) or 1 (it maps that step''s output)',
      v_step, v_flow, cardinality(v_deps) using errcode = '22023';
  end if;
  if required_input_pattern is not null and jsonb_typeof(required_input_pattern) <> 'object' then
    raise exception 'step "%" of flow "%": required_input_pattern (if) must be a JSON object, got %',
      v_step, v_flow, jsonb_typeof(required_input_pattern) using errcode = '22023';
  end if;
  if forbidden_input_pattern is not null and jsonb_typeof(forbidden_input_pattern) <> 'object' then
    raise exception 'step "%" of flow "%": forbidden_input_pattern (unless) must be a JSON object, got %',
      v_step, v_flow, jsonb_typeof(forbidden_input_pattern) using errcode = '22023';
  end if;
  if v_unmet not in ('skip', 'skip-cascade', 'fail') then
    raise exception 'step "%" of flow "%": when_unmet must be skip, skip-cascade or fail, not %',
      v_step, v_flow, quote_literal(v_unmet) using errcode = '22023';
  end if;
  if v_unmet <> 'skip' and required_input_pattern is null and forbidden_input_pattern is null then
    raise exception 'step "%" of flow "%": when_unmet % is only meaningful with a condition (required_input_pattern or forbidden_input_pattern)',
      v_step, v_flow, v_unmet using errcode = '22023';
  end if;
  if v_exhausted not in ('fail', 'skip', 'skip-cascade') then
    raise exception 'step "%" of flow "%": when_exhausted must be fail, skip or skip-cascade, not %',
      v_step, v_flow, quote_literal(v_exhausted) using errcode = '22023';
  end if;
  if array_position(v_deps, null) is not null then
    raise exception 'step "%" of flow "%": a dependency slug is null', v_step, v_flow using errcode = '22023';
  end if;
  select array_agg(d order by d collate "C") into v_sorted_deps from (select distinct unnest(v_deps) as d) x;
  v_sorted_deps := coalesce(v_sorted_deps, '{}');
  if cardinality(v_sorted_deps) <> cardinality(v_deps) then
    raise exception 'step "%" of flow "%" lists a dependency twice: %', v_step, v_flow, v_deps
      using errcode = '22023';
  end if;

  select * into v_existing from flowlane.steps s where s.flow_slug = v_flow and s.step_slug = v_step;
  if found then
    v_index := v_existing.step_index;
  else
    select coalesce(max(s.step_index) + 1, 0) into v_index from flowlane.steps s where s.flow_slug = v_flow;
  end if;
  perform flowlane._check_child_flow(v_flow, v_step, v_type, add_step.child_flow);
  perform flowlane._check_flow_control_options(format('step "%s" of flow "%s"', v_step, v_flow),
    add_step.concurrency_limit, add_step.concurrency_key, null);
  if add_step.concurrency_limit is not null and (v_type = 'wait' or add_step.child_flow is not null) then
    raise exception 'step "%" of flow "%": a concurrency limit needs a step with a handler (a wait or child-flow step has no tasks)',
      v_step, v_flow using errcode = '22023';
  end if;
  perform flowlane._check_cache(format('step "%s" of flow "%s"', v_step, v_flow), add_step.cache_ttl,
    add_step.cache_key, v_type <> 'wait' and add_step.child_flow is null);
  v_queue := flowlane._step_queue(v_flow, v_step, v_index, v_mode, v_type, add_step.queue_name,
                                  add_step.child_flow);

  if v_existing.flow_slug is not null then
    select coalesce(array_agg(d.dep_slug order by d.dep_slug collate "C"), '{}') into v_existing_deps
    from flowlane.deps d where d.flow_slug = v_flow and d.step_slug = v_step;
    if v_existing.step_type <> v_type then
      perform flowlane._shape_mismatch(v_flow, v_step, 'step_type', v_existing.step_type, v_type);
    end if;
    if v_existing_deps <> v_sorted_deps then
      perform flowlane._shape_mismatch(v_flow, v_step, 'deps', v_existing_deps::text, v_sorted_deps::text);
    end if;
    if v_existing.required_input_pattern is distinct from required_input_pattern then
      perform flowlane._shape_mismatch(v_flow, v_step, 'required_input_pattern',
        v_existing.required_input_pattern::text, required_input_pattern::text);
    end if;
    if v_existing.forbidden_input_pattern is distinct from forbidden_input_pattern then
      perform flowlane._shape_mismatch(v_flow, v_step, 'forbidden_input_pattern',
        v_existing.forbidden_input_pattern::text, forbidden_input_pattern::text);
    end if;
    if v_existing.when_unmet <> v_unmet then
      perform flowlane._shape_mismatch(v_flow, v_step, 'when_unmet', v_existing.when_unmet, v_unmet);
    end if;
    if v_existing.when_exhausted <> v_exhausted then
      perform flowlane._shape_mismatch(v_flow, v_step, 'when_exhausted', v_existing.when_exhausted, v_exhausted);
    end if;
    if v_existing.queue_name is distinct from v_queue then
      perform flowlane._shape_mismatch(v_flow, v_step, 'queue_name', v_existing.queue_name, v_queue);
    end if;
    if v_existing.child_flow is distinct from add_step.child_flow then
      perform flowlane._shape_mismatch(v_flow, v_step, 'child_flow', v_existing.child_flow, add_step.child_flow);
    end if;
    if v_queue is not null then
      perform flowlane._ensure_queue(v_queue, v_flow, v_mode);
    end if;
    update flowlane.steps s
       set opt_max_attempts = max_attempts, opt_base_delay = base_delay,
           opt_timeout = timeout, opt_start_delay = start_delay,
           opt_concurrency_limit = add_step.concurrency_limit,
           opt_concurrency_key = nullif(add_step.concurrency_key, ''),
           opt_compensate = add_step.compensate,
           opt_cache_ttl = add_step.cache_ttl, opt_cache_key = add_step.cache_key,
           opt_cache_fingerprint = case when add_step.cache_ttl is not null then add_step.cache_fingerprint end
     where s.flow_slug = v_flow and s.step_slug = v_step
    returning * into v_row;
    if (v_existing.opt_concurrency_limit, v_existing.opt_concurrency_key)
       is distinct from (v_row.opt_concurrency_limit, v_row.opt_concurrency_key) then
      perform flowlane._step_limits_changed(v_flow, v_step);
    end if;
    return v_row;
  end if;

  select s.step_slug into v_other from flowlane.steps s
  where s.flow_slug = v_flow and lower(s.step_slug) = lower(v_step);
  if found then
    raise exception 'step slug "%" conflicts with existing step "%" of flow "%" (step slugs are unique case-insensitively within a flow)',
      v_step, v_other, v_flow using errcode = '23505';
  end if;
  foreach v_dep in array v_sorted_deps loop
    if v_dep = v_step then
      raise exception 'step "%" of flow "%" cannot depend on itself', v_step, v_flow using errcode = '22023';
    end if;
    if not exists (select 1 from flowlane.steps s where s.flow_slug = v_flow and s.step_slug = v_dep) then
      raise exception 'step "%" of flow "%" depends on unknown step "%" (add dependencies before the steps that need them)',
        v_step, v_flow, v_dep using errcode = '23503';
    end if;
  end loop;

  if exists (select 1 from flowlane.flows f where f.flow_slug = v_flow and f.shape_sealed_at is not null)
     or exists (select 1 from flowlane.runs r where r.flow_slug = v_flow) then
    raise exception 'FLOWLANE_SHAPE_MISMATCH: flow "%" is already applied and has no step "%"', v_flow, v_step
      using errcode = '23514',
            hint = 'the shape of a flow never changes once applied (verified or run); create a new flow version (a new slug)';
  end if;
  if v_queue is not null then
    perform flowlane._ensure_queue(v_queue, v_flow, v_mode);
  end if;
  insert into flowlane.steps (flow_slug, step_slug, step_type, step_index, deps_count,
    opt_max_attempts, opt_base_delay, opt_timeout, opt_start_delay,
    required_input_pattern, forbidden_input_pattern, when_unmet, when_exhausted, queue_name, child_flow,
    opt_concurrency_limit, opt_concurrency_key, opt_compensate, opt_cache_ttl, opt_cache_key, opt_cache_fingerprint)
  values (v_flow, v_step, v_type, v_index, cardinality(v_sorted_deps), max_attempts, base_delay, timeout,
    start_delay, required_input_pattern, forbidden_input_pattern, v_unmet, v_exhausted, v_queue,
    add_step.child_flow, add_step.concurrency_limit, nullif(add_step.concurrency_key, ''), add_step.compensate,
    add_step.cache_ttl, add_step.cache_key,
    case when add_step.cache_ttl is not null then add_step.cache_fingerprint end)
  returning * into v_row;
  insert into flowlane.deps (flow_slug, dep_slug, step_slug)
  select v_flow, d, v_step from unnest(v_sorted_deps) d;
  return v_row;
end;
$$;

create or replace function flowlane.ensure_flow_shape(flow_slug text, shape jsonb) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_db jsonb := flowlane.get_flow_shape(ensure_flow_shape.flow_slug);
  v_diff text[];
begin
  if v_db is null then
    raise exception 'FLOWLANE_SHAPE_MISMATCH: flow "%" does not exist in the database', ensure_flow_shape.flow_slug
      using errcode = '23514';
  end if;
  v_diff := flowlane._shape_differences(v_db, shape);
  if cardinality(v_diff) > 0 then
    raise exception 'FLOWLANE_SHAPE_MISMATCH: flow "%" has a different shape in the database', ensure_flow_shape.flow_slug
      using errcode = '23514',
            detail = array_to_string(v_diff, E'\n'),
            hint = 'a flow''s shape never changes once applied; give the changed flow a new slug (a new version)';
  end if;
  update flowlane.flows f set shape_sealed_at = flowlane._now()
   where f.flow_slug = ensure_flow_shape.flow_slug and f.shape_sealed_at is null;
end;
$$;

create or replace function flowlane.ensure_flow_compiled(flow_slug text, shape jsonb) returns jsonb
language plpgsql volatile
set search_path = ''
as $$
declare
  v_slug text := ensure_flow_compiled.flow_slug;
  v_step jsonb;
  v_diff text[];
begin
  perform pg_advisory_xact_lock(hashtext('flowlane.flow:' || lower(v_slug)));
  if not exists (select 1 from flowlane.flows f where f.flow_slug = v_slug) then
    -- validate the document before creating anything
    v_diff := flowlane._shape_differences(jsonb_build_object('queue_mode', shape -> 'queue_mode', 'steps', '[]'::jsonb), shape);
    perform flowlane.create_flow(v_slug, queue_mode => shape ->> 'queue_mode');
    for v_step in select e from jsonb_array_elements(shape -> 'steps') e loop
      perform flowlane.add_step(
        flow_slug => v_slug,
        step_slug => v_step ->> 'slug',
        deps_slugs => coalesce((select array_agg(n order by o) from jsonb_array_elements_text(v_step -> 'needs') with ordinality as x(n, o)), '{}'),
        step_type => coalesce(v_step ->> 'type', 'single'),
        required_input_pattern => nullif(v_step -> 'if', 'null'::jsonb),
        forbidden_input_pattern => nullif(v_step -> 'unless', 'null'::jsonb),
        when_unmet => coalesce(v_step ->> 'when_unmet', 'skip'),
        when_exhausted => coalesce(v_step ->> 'when_exhausted', 'fail'),
        queue_name => v_step ->> 'queue',
        child_flow => v_step ->> 'flow');
    end loop;
    perform flowlane._set_shape_contracts(v_slug, shape);
    v_diff := flowlane._shape_differences(flowlane.get_flow_shape(v_slug), shape);
    if cardinality(v_diff) > 0 then
      raise exception 'FLOWLANE_SHAPE_MISMATCH: the shape given for flow "%" is not what it compiles to', v_slug
        using errcode = '23514', detail = array_to_string(v_diff, E'\n'),
              hint = 'check the shape document (needs sorted by code point, defaults written out)';
    end if;
    update flowlane.flows f set shape_sealed_at = flowlane._now() where f.flow_slug = v_slug;
    return jsonb_build_object('status', 'compiled', 'differences', '[]'::jsonb);
  end if;
  v_diff := flowlane._shape_differences(flowlane.get_flow_shape(v_slug), shape);
  if cardinality(v_diff) = 0 then
    update flowlane.flows f set shape_sealed_at = flowlane._now()
     where f.flow_slug = v_slug and f.shape_sealed_at is null;
    return jsonb_build_object('status', 'verified', 'differences', '[]'::jsonb);
  end if;
  return jsonb_build_object('status', 'mismatch', 'differences', to_jsonb(v_diff));
end;
$$;

create or replace function flowlane.set_alias(alias text, flow_slug text, draining text[] = '{}')
returns flowlane.aliases
language plpgsql volatile
set search_path = ''
as $$
declare
  v_alias text := set_alias.alias;
  v_active text := set_alias.flow_slug;
  v_draining text[] := coalesce(set_alias.draining, '{}');
  v_row flowlane.aliases;
  v_missing text;
  v_other text;
begin
  perform flowlane._check_slug('alias', v_alias);
  perform pg_advisory_xact_lock(hashtext('flowlane.alias:' || lower(v_alias)));
  select f.flow_slug into v_other from flowlane.flows f where lower(f.flow_slug) = lower(v_alias);
  if found and not flowlane._alias_may_take_flow_name(v_alias, v_other, array[v_active] || v_draining) then
    raise exception 'alias "%" conflicts with flow "%" (flow and alias slugs share one namespace)',
      v_alias, v_other
      using errcode = '23505',
            hint = format('an alias may take the name of a flow only while it lists that flow, spelled the same, as its active or draining version (draining => array[%L])', v_other);
  end if;
  select a.alias into v_other from flowlane.aliases a
  where lower(a.alias) = lower(v_alias) and a.alias <> v_alias;
  if found then
    raise exception 'alias "%" conflicts with alias "%" (alias slugs are unique case-insensitively)',
      v_alias, v_other using errcode = '23505';
  end if;
  select s into v_missing from unnest(array[v_active] || v_draining) s
  where s is null or not exists (select 1 from flowlane.flows f where f.flow_slug = s)
  limit 1;
  if found then
    raise exception 'alias "%": flow "%" does not exist', v_alias, coalesce(v_missing, 'NULL')
      using errcode = 'P0002', hint = 'apply the compiled SQL of the flow before its alias';
  end if;
  if v_active = any (v_draining) or cardinality(v_draining) <> (select count(distinct d) from unnest(v_draining) d) then
    raise exception 'alias "%": a version is listed twice (active %, draining %)', v_alias, v_active, v_draining
      using errcode = '22023';
  end if;
  select * into v_row from flowlane.aliases a where a.alias = v_alias for update;
  if found and v_row.flow_slug = v_active and v_row.draining = v_draining then
    return v_row;  -- unchanged: no history row
  end if;
  insert into flowlane.aliases as a (alias, flow_slug, draining)
  values (v_alias, v_active, v_draining)
  on conflict on constraint aliases_pkey do update
    set flow_slug = excluded.flow_slug, draining = excluded.draining, updated_at = flowlane._clock_timestamp()
  returning * into v_row;
  insert into flowlane.alias_history (alias, flow_slug, draining)
  values (v_alias, v_active, v_draining);
  return v_row;
end;
$$;

create or replace function flowlane._flow_delete_keeps_aliases_sound() returns trigger
language plpgsql
set search_path = ''
as $$
declare
  v_aliases text;
begin
  select string_agg(a.alias, ', ' order by a.alias) into v_aliases
  from flowlane.aliases a where a.flow_slug = old.flow_slug;
  if v_aliases is not null then
    raise exception 'flow "%" is the active version of alias %', old.flow_slug, v_aliases
      using errcode = '23503',
            hint = 'move the alias to another version (flowlane.set_alias) before deleting the flow';
  end if;
  with changed as (
    update flowlane.aliases a
       set draining = array_remove(a.draining, old.flow_slug), updated_at = flowlane._clock_timestamp()
     where old.flow_slug = any (a.draining)
    returning a.alias, a.flow_slug, a.draining
  )
  insert into flowlane.alias_history (alias, flow_slug, draining)
  select c.alias, c.flow_slug, c.draining from changed c order by c.alias;
  return old;
end;
$$;

-- step_tasks has no index on flow_slug (one would cost every enqueue): its
-- rows are found through the flow's runs (primary key prefix), so deleting a
-- small flow costs the same next to 10k or 100k other tasks
-- (benchmarks/recovery_scaling.py)
create or replace function flowlane.delete_flow_and_data(flow_slug text) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_runs uuid[];
  v_active flowlane.step_tasks[];
  v_trigger text;
begin
  -- a trigger starting a missing flow would fail every write of its table
  select t.trigger_name into v_trigger from flowlane.triggers t
  where t.flow_name = delete_flow_and_data.flow_slug order by t.trigger_name limit 1;
  if found then
    raise exception 'flow "%" is started by trigger "%"', delete_flow_and_data.flow_slug, v_trigger
      using errcode = '2BP01', hint = 'remove the trigger''s document and apply, or point it at another flow';
  end if;
  v_runs := array(select r.run_id from flowlane.runs r where r.flow_slug = delete_flow_and_data.flow_slug
                  order by r.run_id for update);
  select coalesce(array_agg(t order by t.queue_name, t.message_id), '{}') into v_active
  from flowlane.step_tasks t
  where t.run_id = any (v_runs) and t.status in ('queued', 'started');
  perform flowlane._archive_tasks(v_active);
  delete from flowlane.step_tasks t where t.run_id = any (v_runs);
  delete from flowlane.step_states ss where ss.run_id = any (v_runs);
  delete from flowlane.runs r where r.run_id = any (v_runs);
  delete from flowlane.step_cache e where e.flow_slug = delete_flow_and_data.flow_slug;
  delete from flowlane.deps d where d.flow_slug = delete_flow_and_data.flow_slug;
  delete from flowlane.steps s where s.flow_slug = delete_flow_and_data.flow_slug;
  delete from flowlane.flows f where f.flow_slug = delete_flow_and_data.flow_slug;
end;
$$;

-- start_at: a later start (the run waits, cancellable, until the maintenance tick begins it);
-- idempotency_key (or the flow's dedup pointer into the input): a second start with the same
-- (called name, key) returns the first run
create or replace function flowlane.start_flow(flow_slug text, input jsonb, run_id uuid = null,
                                    start_at timestamptz = null, idempotency_key text = null,
                                    priority int = null)
returns flowlane.runs
language plpgsql volatile
set search_path = ''
as $$
declare
  v_flow text := flowlane.resolve_flow(start_flow.flow_slug);
  v_run flowlane.runs;
  v_key text;
  -- what started the run when that is not a plain call (runs.origin): a server that starts
  -- runs for others (the webhook endpoint) names itself for its transaction in the setting
  -- flowlane.origin, a JSON object such as {"webhook": name, "delivery": id}
  v_origin jsonb := nullif(current_setting('flowlane.origin', true), '')::jsonb;
begin
  perform flowlane._check_start_input(v_flow, input, format('start_flow(%s)', v_flow));
  perform flowlane._check_priority(format('start_flow(%s)', v_flow), start_flow.priority);
  v_key := flowlane._start_key(v_flow, input, start_flow.idempotency_key, format('start_flow(%s)', v_flow));
  if v_key is not null then
    v_run := flowlane._keyed_run(start_flow.flow_slug, v_key);
    if v_run.run_id is not null then
      return v_run;
    end if;
  end if;
  if start_flow.run_id is not null then
    -- a retried start with the same run id returns the existing run
    select * into v_run from flowlane.runs r where r.run_id = start_flow.run_id;
    if found then
      if v_run.flow_slug <> v_flow or v_run.input <> input then
        raise exception 'run % already exists for flow "%" with another flow or input', start_flow.run_id,
          v_run.flow_slug using errcode = '23505';
      end if;
      perform flowlane._found_run(v_run.run_id);
      return v_run;
    end if;
  end if;
  if v_key is null and start_flow.run_id is null and start_flow.start_at is null then
    v_run := flowlane._debounced_start(v_flow, input, start_flow.priority);
    if v_run.run_id is not null then
      return v_run;
    end if;
  end if;
  select * into v_run from flowlane._new_runs(v_flow, array[input], array[start_flow.run_id],
                                              start_flow.start_at, array[v_key], start_flow.flow_slug,
                                              start_flow.priority,
                                              array[case when jsonb_typeof(v_origin) = 'object' then v_origin end]);
  return v_run;
end;
$$;

-- many runs of one flow or alias in one call; returns the runs in input order.
-- All or nothing: a bad input raises naming its position and starts no run.
create or replace function flowlane.start_flows(flow_slug text, inputs jsonb[], start_at timestamptz = null,
                                     priority int = null)
returns setof flowlane.runs
language plpgsql volatile
set search_path = ''
as $$
declare
  v_flow text := flowlane.resolve_flow(start_flows.flow_slug);
  v_i int;
begin
  if inputs is null then
    raise exception 'start_flows(%): inputs must be an array of JSON values', v_flow using errcode = '22004';
  end if;
  if cardinality(inputs) = 0 then
    return;
  end if;
  perform flowlane._check_priority(format('start_flows(%s)', v_flow), start_flows.priority);
  for v_i in select i from generate_subscripts(inputs, 1) i
             where inputs[i] is null or jsonb_typeof(inputs[i]) <> 'array' order by i loop
    perform flowlane._check_start_input(v_flow, inputs[v_i], format('start_flows(%s): input %s', v_flow, v_i - 1));
  end loop;
  if exists (select 1 from flowlane.flows f where f.flow_slug = v_flow
             and (f.opt_dedup_key is not null or f.opt_debounce_period is not null)) then
    -- each input's key may name an earlier run (or an earlier input of this call)
    for v_i in select i from generate_subscripts(inputs, 1) i order by i loop
      return next flowlane.start_flow(start_flows.flow_slug, inputs[v_i], null, start_flows.start_at, null,
                                      start_flows.priority);
    end loop;
    return;
  end if;
  return query select * from flowlane._new_runs(v_flow, inputs, '{}', start_flows.start_at, null, null,
                                                start_flows.priority, null::jsonb[]);
end;
$$;

-- _new_runs and _new_run under their earlier names, without an origin: the calls of schedules
-- and child flows, and of the previous release's functions while a migration commits
create or replace function flowlane._create_runs(p_flow text, p_inputs jsonb[], p_run_ids uuid[],
                                      p_start_at timestamptz = null, p_keys text[] = null,
                                      p_called text = null, p_priority int = null)
returns setof flowlane.runs
language sql volatile
set search_path = ''
as $$
  select * from flowlane._new_runs(p_flow, p_inputs, p_run_ids, p_start_at, p_keys, p_called, p_priority,
                                   null::jsonb[])
$$;

create or replace function flowlane._start_one_run(p_flow flowlane.flows, p_input jsonb, p_run_id uuid,
                                        p_start_at timestamptz, p_key text, p_called text, p_priority int)
returns flowlane.runs
language sql volatile
set search_path = ''
as $$
  select * from flowlane._new_run(p_flow, p_input, p_run_id, p_start_at, p_key, p_called, p_priority,
                                  null::jsonb)
$$;

-- new runs of one concrete flow (inputs checked by the caller); returns them in input order
-- p_start_at in the future: the runs wait (status waiting) for the maintenance tick;
-- p_keys: each run's idempotency key within p_called (the name the caller started);
-- p_priority: the runs' priority (null: the flow's); p_origins: what started each run (null:
-- a call; see flowlane.runs.origin). A flow with a concurrency limit: under
-- the keys' locks, a run begins while its key has room and no run held before it; the
-- others are held (waiting, hold_seq in input order); then a full key replaces or cancels
-- as the flow says (_apply_when_full)
create or replace function flowlane._new_runs(p_flow text, p_inputs jsonb[], p_run_ids uuid[],
                                   p_start_at timestamptz, p_keys text[], p_called text, p_priority int,
                                   p_origins jsonb[])
returns setof flowlane.runs
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set plan_cache_mode = force_generic_plan
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_ids uuid[];
  v_waiting boolean := coalesce(p_start_at > flowlane._now(), false);
  v_flow flowlane.flows;
  v_slot_keys text[];
  v_begins boolean[];
  v_run flowlane.runs;
  v_plain boolean[];
  v_in_task flowlane.step_states[];
begin
  perform flowlane._check_contract_inputs(p_flow, p_inputs);
  select * into v_flow from flowlane.flows f where f.flow_slug = p_flow;
  if cardinality(p_inputs) = 1 and not v_waiting and v_flow.opt_concurrency_limit is null then
    v_run := flowlane._new_run(v_flow, p_inputs[1], p_run_ids[1], p_start_at, p_keys[1], p_called, p_priority,
                               p_origins[1]);
    if v_run.run_id is not null then
      return next v_run;
      return;
    end if;
  end if;
  v_ids := array(select coalesce(p_run_ids[i], flowlane._uuid_v7()) from generate_subscripts(p_inputs, 1) i order by i);
  if not v_waiting and v_flow.opt_concurrency_limit is null then
    -- the runs _new_run would have begun: their steps' states go where its would
    v_plain := array(select coalesce((select bool_and(flowlane._starts_plainly(s, p_inputs[i]))
                                      from flowlane.steps s where s.flow_slug = p_flow), false)
                     from generate_subscripts(p_inputs, 1) i order by i);
  end if;
  if v_flow.opt_concurrency_limit is not null then
    v_slot_keys := array(select flowlane._concurrency_key(v_flow.opt_concurrency_key, p_inputs[i])
                         from generate_subscripts(p_inputs, 1) i order by i);
  end if;
  if v_flow.opt_concurrency_limit is not null and not v_waiting then
    if v_flow.opt_concurrency_when_full = 'cancel_running' then
      perform flowlane._lock_started_runs(p_flow, v_slot_keys);
    end if;
    perform flowlane._lock_slots('run:' || p_flow, v_slot_keys);
    v_begins := array(
      select x.rank <= case when exists (select 1 from flowlane.runs h
                                         where h.flow_slug = p_flow and h.concurrency_key = x.key
                                           and h.status = 'waiting' and h.hold_seq is not null) then 0
                            else v_flow.opt_concurrency_limit - (
                              select count(*) from flowlane.runs r
                              where r.flow_slug = p_flow and r.concurrency_key = x.key and r.status = 'started') end
      from (select i, v_slot_keys[i] as key, row_number() over (partition by v_slot_keys[i] order by i) as rank
            from generate_subscripts(p_inputs, 1) i) x
      order by x.i);
  end if;
  insert into flowlane.runs (run_id, flow_slug, input, remaining_steps, trace_parent, status, start_at,
                             deadline_at, called_as, idempotency_key, priority, concurrency_key, hold_seq, origin)
  select v_ids[i], p_flow, p_inputs[i], (select count(*) from flowlane.steps s where s.flow_slug = p_flow),
         flowlane._trace_parent(),
         case when v_waiting or not coalesce(v_begins[i], true) then 'waiting' else 'started' end, p_start_at,
         case when v_waiting or not coalesce(v_begins[i], true) then null else flowlane._run_deadline(p_flow, flowlane._now()) end,
         case when p_keys[i] is not null then p_called end, p_keys[i],
         coalesce(p_priority, v_flow.opt_priority, 0), v_slot_keys[i],
         case when not v_waiting and not coalesce(v_begins[i], true) then nextval('flowlane.hold_seq') end,
         p_origins[i]
  from generate_subscripts(p_inputs, 1) i order by i;
  insert into flowlane.step_states (flow_slug, run_id, step_slug, remaining_deps, initial_tasks)
  select p_flow, v_ids[i], s.step_slug, s.deps_count,
         case when s.step_type <> 'map' then 1
              when s.deps_count = 0 and jsonb_typeof(p_inputs[i]) = 'array' then jsonb_array_length(p_inputs[i])
              else null end
  from generate_subscripts(p_inputs, 1) i, flowlane.steps s
  where s.flow_slug = p_flow and not (coalesce(v_plain[i], false) and flowlane._state_in_task(s))
  order by v_ids[i], s.step_slug;
  -- the steps whose states are in their tasks: started now, their tasks sent and marked by
  -- _send_step_tasks (no condition or empty map of these runs is resolved below)
  v_in_task := array(
    select row(p_flow, v_ids[i], s.step_slug, 'started', 0, 1, 1, null, null, null, flowlane._now(),
               flowlane._now(), null, null, null, null)::flowlane.step_states
    from generate_subscripts(p_inputs, 1) i, flowlane.steps s
    where s.flow_slug = p_flow and coalesce(v_plain[i], false) and flowlane._state_in_task(s)
    order by v_ids[i], s.step_index);
  if cardinality(v_in_task) > 0 then
    perform flowlane._enqueue_steps(v_in_task, true);
  end if;
  if not v_waiting then
    perform flowlane._progress_runs(array(select v_ids[i] from generate_subscripts(v_ids, 1) i
                                          where coalesce(v_begins[i], true) order by v_ids[i]));
  end if;
  if v_flow.opt_concurrency_limit is not null and not v_waiting then
    perform flowlane._apply_when_full(p_flow, v_ids);
  end if;
  return query select r.* from unnest(v_ids) with ordinality as u (run_id, ord)
               join flowlane.runs r
                 on r.run_id = u.run_id and r.run_id = any (array(select x from unnest(v_ids) x order by 1))
               order by u.ord;
end;
$$;

-- whether a step needs nothing resolved when its run starts with this input: a dependent step,
-- or a root step with a queue, no condition and, for a map, a non-empty input array. A run
-- whose steps all start plainly begins with its root steps started (_new_run) and may keep the
-- states of some in their tasks (_state_in_task)
create or replace function flowlane._starts_plainly(p_step flowlane.steps, p_input jsonb) returns boolean
language plpgsql immutable
set search_path = ''
as $$
begin
  return p_step.deps_count > 0
      or (p_step.queue_name is not null
          and p_step.required_input_pattern is null and p_step.forbidden_input_pattern is null
          and (p_step.step_type = 'single'
               or (p_step.step_type = 'map' and jsonb_typeof(p_input) = 'array' and jsonb_array_length(p_input) > 0)));
end;
$$;

-- whether a step of a run that begins now with every step starting plainly (_starts_plainly,
-- no flow concurrency limit) keeps its state in its task instead of a step_states row
-- (all_step_states, 01_tables.sql): a root step of one task, without a concurrency limit or a
-- cache
create or replace function flowlane._state_in_task(p_step flowlane.steps) returns boolean
language plpgsql immutable
set search_path = ''
as $$
begin
  return p_step.deps_count = 0 and p_step.step_type = 'single' and p_step.opt_concurrency_limit is null
     and p_step.opt_cache_ttl is null;
end;
$$;

-- _new_runs for one run that begins now, of a flow without a concurrency limit whose root
-- steps need nothing resolved first (a queue, no condition, no map over an empty input): the
-- run and its step states are written in their final state, root steps started, one
-- statement each, instead of the batch's generic statements. Null when the flow does not
-- qualify: the caller takes the batch path. tests/core/test_one_start.py and the differential
-- test (tests/core/test_differential.py) compare the two.
create or replace function flowlane._new_run(p_flow flowlane.flows, p_input jsonb, p_run_id uuid,
                                  p_start_at timestamptz, p_key text, p_called text, p_priority int,
                                  p_origin jsonb)
returns flowlane.runs
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set plan_cache_mode = force_generic_plan
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_steps int;
  v_plain boolean;
  v_elements int := case when jsonb_typeof(p_input) = 'array' then jsonb_array_length(p_input) end;
  v_run flowlane.runs;
  v_started flowlane.step_states[];
  v_in_task flowlane.step_states[];
begin
  select count(*), coalesce(bool_and(flowlane._starts_plainly(s, p_input)), false) into v_steps, v_plain
  from flowlane.steps s where s.flow_slug = (p_flow).flow_slug;
  if not v_plain then
    return null;
  end if;
  insert into flowlane.runs (run_id, flow_slug, input, remaining_steps, trace_parent, status, start_at, deadline_at,
                             called_as, idempotency_key, priority, origin)
  values (coalesce(p_run_id, flowlane._uuid_v7()), (p_flow).flow_slug, p_input, v_steps, flowlane._trace_parent(),
          'started', p_start_at, flowlane._run_deadline((p_flow).flow_slug, flowlane._now()),
          case when p_key is not null then p_called end, p_key, coalesce(p_priority, (p_flow).opt_priority, 0),
          p_origin)
  returning * into v_run;
  -- a step whose state is in its task (_state_in_task) gets no step_states row, and
  -- _send_step_tasks marks its task (step_started_at)
  with planned as (
    select s.flow_slug, s.step_slug, s.deps_count, t.tasks, flowlane._state_in_task(s) as in_task
    from flowlane.steps s
    cross join lateral (  -- a dependent map's count is known when its parent completes
      select case when s.step_type <> 'map' then 1 when s.deps_count = 0 then v_elements end as tasks) t
    where s.flow_slug = (p_flow).flow_slug
  ), written as (
    insert into flowlane.step_states as ss (flow_slug, run_id, step_slug, remaining_deps, initial_tasks, status,
                                            started_at, remaining_tasks)
    select p.flow_slug, v_run.run_id, p.step_slug, p.deps_count, p.tasks,
           case when p.deps_count = 0 then 'started' else 'created' end,
           case when p.deps_count = 0 then flowlane._now() end,
           case when p.deps_count = 0 then p.tasks end
    from planned p
    where not p.in_task
    order by p.step_slug
    returning ss
  ) select (select array_agg(w.ss) from written w where (w.ss).status = 'started'),
            (select array_agg(row(p.flow_slug, v_run.run_id, p.step_slug, 'started', 0, 1, 1, null, null, null,
                                  flowlane._now(), flowlane._now(), null, null, null, null)::flowlane.step_states)
             from planned p where p.in_task)
      into v_started, v_in_task;
  if v_started is not null then
    perform flowlane._enqueue_steps(v_started, false);
  end if;
  if v_in_task is not null then
    perform flowlane._enqueue_steps(v_in_task, true);
  end if;
  return v_run;
end;
$$;

-- resolve conditions and complete task-less steps until nothing changes;
-- false when the run failed (a when_unmet=fail condition)
create or replace function flowlane._advance(p_run_id uuid) returns boolean
language plpgsql volatile
set search_path = ''
as $$
declare
  v_run flowlane.runs;
  v_step flowlane.steps;
  v_cap int;
  v_i int := 0;
begin
  select * into v_run from flowlane.runs r where r.run_id = p_run_id;
  if v_run.status <> 'started' then
    return v_run.status <> 'failed';
  end if;
  select 2 * count(*) + 10 into v_cap from flowlane.steps s where s.flow_slug = v_run.flow_slug;
  loop
    v_i := v_i + 1;
    if v_i > v_cap then
      raise exception 'internal error: condition/empty-step resolution of run % did not converge after % iterations',
        p_run_id, v_cap;
    end if;
    -- first ready step whose condition is not met
    select s.* into v_step
    from flowlane.step_states ss
    join flowlane.steps s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
    where ss.run_id = p_run_id and ss.status = 'created' and ss.remaining_deps = 0
      and (s.required_input_pattern is not null or s.forbidden_input_pattern is not null)
      and not flowlane._condition_met(p_run_id, s.step_slug)
    order by s.step_index
    limit 1;
    if found then
      if v_step.when_unmet = 'fail' then
        update flowlane.step_states ss
           set status = 'failed', failed_at = flowlane._now(), error_message = 'condition not met'
         where ss.run_id = p_run_id and ss.step_slug = v_step.step_slug;
        perform flowlane._fail_run(p_run_id,
          format('step %s: condition not met (when_unmet = fail)', v_step.step_slug));
        return false;
      elsif v_step.when_unmet = 'skip-cascade' then
        perform flowlane._skip_cascade(p_run_id, v_step.step_slug, 'condition_unmet');
      else
        perform flowlane._skip_step(p_run_id, v_step.step_slug, 'condition_unmet');
      end if;
      continue;
    end if;
    -- first ready step without tasks (an empty map): completes at once with []
    select s.* into v_step
    from flowlane.step_states ss
    join flowlane.steps s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
    where ss.run_id = p_run_id and ss.status = 'created' and ss.remaining_deps = 0 and ss.initial_tasks = 0
    order by s.step_index
    limit 1;
    if found then
      perform flowlane._complete_step(p_run_id, v_step.step_slug, '[]'::jsonb);
      continue;
    end if;
    return true;
  end loop;
end;
$$;

-- the value a step's condition is tested against: the run input for a root
-- step, {dep: output} of its completed deps otherwise
create or replace function flowlane._condition_subject(p_run_id uuid, p_step_slug text) returns jsonb
language plpgsql stable
set search_path = ''
as $$
begin
  return (
    select case when s.deps_count = 0 then r.input else
      coalesce((select jsonb_object_agg(d.dep_slug, x.output)
                from flowlane.deps d
                -- its row, else the task that holds its state (all_step_states), looked up only
                -- when the row is missing
                cross join lateral (
                  select ps.output from flowlane.step_states ps
                  where ps.run_id = p_run_id and ps.step_slug = d.dep_slug and ps.status = 'completed'
                  union all
                  select pt.output from flowlane.step_tasks pt
                  where pt.run_id = p_run_id and pt.step_slug = d.dep_slug and pt.task_index = 0
                    and pt.step_started_at is not null and pt.status = 'completed'
                  limit 1) x
                where d.flow_slug = s.flow_slug and d.step_slug = s.step_slug),
               '{}'::jsonb) end
    from flowlane.runs r
    join flowlane.steps s on s.flow_slug = r.flow_slug and s.step_slug = p_step_slug
    where r.run_id = p_run_id);
end;
$$;

-- the ready steps of the given started runs (callers hold the run locks, or
-- the runs are new): one step_states update, one send_batch per (queue, start
-- delay) for all runs, one step_tasks insert per queue
create or replace function flowlane._start_ready_steps(p_run_ids uuid[]) returns void
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set plan_cache_mode = force_generic_plan
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_started flowlane.step_states[];
begin
  with ready as (
    select ss.run_id, ss.step_slug
    from flowlane.step_states ss
    join flowlane.runs r on r.run_id = ss.run_id and r.status = 'started' and r.run_id = any (p_run_ids)
    join flowlane.steps s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
    where ss.run_id = any (p_run_ids) and ss.status = 'created' and ss.remaining_deps = 0
      and ss.initial_tasks > 0
      -- _condition_met is a call per row (never inlined): only for a step with a condition
      and case when s.required_input_pattern is null and s.forbidden_input_pattern is null then true
               else flowlane._condition_met(ss.run_id, ss.step_slug) end
    order by ss.run_id, ss.step_slug
    for update of ss
  ), started as (
    update flowlane.step_states ss
       set status = 'started', remaining_tasks = ss.initial_tasks,
           -- (a held run begun by a transaction older than the start that created it)
           started_at = greatest(flowlane._now(), ss.created_at)
      from ready
     where ss.run_id = ready.run_id and ss.step_slug = ready.step_slug and ss.run_id = any (p_run_ids)
    returning ss
  ) select coalesce(array_agg(st.ss), '{}') into v_started from started st;
  if cardinality(v_started) > 0 then
    perform flowlane._enqueue_steps(v_started, false);
  end if;
end;
$$;

-- the tasks of steps just started (their runs' locks held): one _send_step_tasks per (queue, start
-- delay), which holds back those over a step's concurrency limit; wait and child-flow steps
-- begin instead. p_in_task: the steps keep their states in their tasks (_state_in_task), so
-- p_started are rows made for the call, not read from step_states
create or replace function flowlane._enqueue_steps(p_started flowlane.step_states[], p_in_task boolean) returns void
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set plan_cache_mode = force_generic_plan
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_group record;
begin
  for v_group in
    select s.queue_name, coalesce(s.opt_start_delay, 0) as start_delay,
           array_agg(jsonb_build_object('flow_slug', st.flow_slug, 'run_id', st.run_id,
                                        'step_slug', st.step_slug, 'task_index', k)
                     || case when r.priority <> 0 then jsonb_build_object('priority', r.priority)
                             else '{}'::jsonb end
                     order by st.run_id, s.step_index, k) as bodies,
           bool_or(s.opt_concurrency_limit is not null) as limited, bool_or(s.opt_cache_ttl is not null) as cached
    from unnest(p_started) st
    join flowlane.steps s on s.flow_slug = st.flow_slug and s.step_slug = st.step_slug
    join flowlane.runs r
      on r.run_id = st.run_id and r.run_id = any (array(select distinct x.run_id from unnest(p_started) x order by 1))
    cross join lateral generate_series(0, st.initial_tasks - 1) as k
    group by 1, 2
    order by 1, 2
  loop
    if v_group.queue_name is null then  -- wait and child-flow steps: no task (17_waits.sql, 18_children.sql)
      perform flowlane._begin_waits(p_started);
      perform flowlane._start_children(p_started);
      continue;
    end if;
    -- a cached step: tasks whose key has an entry complete at once (23_cache.sql)
    v_group.bodies := case when v_group.cached then flowlane._take_cached(v_group.bodies) else v_group.bodies end;
    -- a step with a concurrency limit: tasks over its key's limit are held (19_flow_control.sql)
    perform flowlane._send_step_tasks(v_group.queue_name,
      case when v_group.limited then flowlane._take_step_slots(v_group.bodies) else v_group.bodies end,
      v_group.start_delay, p_in_task);
  end loop;
end;
$$;

-- steps that have their step_states rows (the previous release's signature, which its
-- functions call while a migration commits)
create or replace function flowlane._enqueue_started(p_started flowlane.step_states[]) returns void
language plpgsql volatile
set search_path = ''
as $$
begin
  perform flowlane._enqueue_steps(p_started, false);
end;
$$;

create or replace function flowlane._complete_step(p_run_id uuid, p_step_slug text, p_output jsonb) returns void
language plpgsql volatile
set search_path = ''
as $$
begin
  update flowlane.step_states s
     set status = 'completed', output = p_output, remaining_tasks = 0,
         started_at = coalesce(s.started_at, flowlane._now()), completed_at = flowlane._now()
   where s.run_id = p_run_id and s.step_slug = p_step_slug and s.status in ('created', 'started');
  if not found then
    return;
  end if;
  update flowlane.runs r set remaining_steps = r.remaining_steps - 1 where r.run_id = p_run_id;
  perform flowlane._release_children(p_run_id, p_step_slug, p_output, false);
end;
$$;

-- release the children of a step that just became terminal (completed or skipped)
create or replace function flowlane._release_children(p_run_id uuid, p_step_slug text, p_output jsonb, p_skipped boolean)
returns void
language plpgsql volatile
set search_path = ''
as $$
begin
  perform 1 from flowlane.step_states cs
  where cs.run_id = p_run_id and cs.step_slug in (
    select d.step_slug from flowlane.deps d join flowlane.runs r on r.flow_slug = d.flow_slug
    where r.run_id = p_run_id and d.dep_slug = p_step_slug)
  order by cs.step_slug
  for update;

  update flowlane.step_states cs
     set remaining_deps = cs.remaining_deps - 1,
         initial_tasks = flowlane._dependent_tasks(cs.status, cs.initial_tasks, cst.step_type, p_output, p_skipped)
    from flowlane.deps d, flowlane.steps cst
   where cs.run_id = p_run_id
     and d.flow_slug = cs.flow_slug and d.dep_slug = p_step_slug and d.step_slug = cs.step_slug
     and cst.flow_slug = cs.flow_slug and cst.step_slug = cs.step_slug;
end;
$$;

-- skip one step (created or started): its unfinished tasks become skipped and
-- their messages are archived; children are released (a map child of a
-- skipped parent gets 0 tasks)
create or replace function flowlane._skip_step(p_run_id uuid, p_step_slug text, p_reason text) returns boolean
language plpgsql volatile
set search_path = ''
as $$
declare
  v_tasks flowlane.step_tasks[];
begin
  perform flowlane._unfold_step_states(p_run_id);
  update flowlane.step_states s
     set status = 'skipped', skip_reason = p_reason, skipped_at = flowlane._now(), remaining_tasks = null
   where s.run_id = p_run_id and s.step_slug = p_step_slug and s.status in ('created', 'started');
  if not found then
    return false;
  end if;
  with skipped as (
    update flowlane.step_tasks t set status = 'skipped', skipped_at = flowlane._now()
     where t.run_id = p_run_id and t.step_slug = p_step_slug and t.status in ('queued', 'started')
    returning t
  ) select coalesce(array_agg(k.t), '{}') into v_tasks from skipped k;
  perform flowlane._archive_tasks(v_tasks);
  update flowlane.runs r set remaining_steps = r.remaining_steps - 1 where r.run_id = p_run_id;
  perform flowlane._release_children(p_run_id, p_step_slug, null, true);
  return true;
end;
$$;

-- The states that tasks of a run hold for their steps (all_step_states, 01_tables.sql) are
-- written into step_states, as they read there, and the tasks no longer hold them: what changes
-- a step other than its task's start and completion (a failure, a skip, a cancel, a retry)
-- then finds its row. The caller holds the run's lock; the tasks are locked in key order.
create or replace function flowlane._unfold_step_states(p_run_id uuid) returns void
language plpgsql volatile
set search_path = ''
as $$
begin
  with held as (
    select t.run_id, t.step_slug, t.task_index from flowlane.step_tasks t
    where t.run_id = p_run_id and t.step_started_at is not null
    order by t.step_slug, t.task_index
    for update
  ), written as (
    insert into flowlane.step_states (flow_slug, run_id, step_slug, status, remaining_deps, initial_tasks,
                                      remaining_tasks, output, error_message, skip_reason, created_at, started_at,
                                      completed_at, failed_at, skipped_at, cancelled_at)
    select v.flow_slug, v.run_id, v.step_slug, v.status, v.remaining_deps, v.initial_tasks, v.remaining_tasks,
           v.output, v.error_message, v.skip_reason, v.created_at, v.started_at, v.completed_at, v.failed_at,
           v.skipped_at, v.cancelled_at
    from flowlane.all_step_states v
    join held h on h.run_id = v.run_id and h.step_slug = v.step_slug
    where v.run_id = p_run_id
    order by v.step_slug
  )
  update flowlane.step_tasks t set step_started_at = null
    from held h
   where t.run_id = h.run_id and t.step_slug = h.step_slug and t.task_index = h.task_index
     and t.run_id = p_run_id;
end;
$$;

-- run failed: cancel its unfinished tasks and archive their messages; its
-- unfinished steps end with it
create or replace function flowlane._fail_run(p_run_id uuid, p_error text) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_tasks flowlane.step_tasks[];
begin
  perform flowlane._unfold_step_states(p_run_id);
  update flowlane.runs r set status = 'failed', failed_at = flowlane._now(), error_message = p_error
   where r.run_id = p_run_id and r.status = 'started';
  with cancelled as (
    update flowlane.step_tasks t set status = 'cancelled', cancelled_at = flowlane._now()
     where t.run_id = p_run_id and t.status in ('queued', 'started')
    returning t
  ) select coalesce(array_agg(c.t), '{}') into v_tasks from cancelled c;
  perform flowlane._archive_tasks(v_tasks);
  perform flowlane._end_unfinished_steps(p_run_id);
end;
$$;

-- a run that ends before its steps do leaves no step waiting or running: each
-- becomes 'cancelled' with an end time, and started_at says whether it had
-- begun (a step that never started never will, unless retry_run reopens it)
create or replace function flowlane._end_unfinished_steps(p_run_id uuid) returns void
language sql volatile
set search_path = ''
as $$
  select flowlane._unfold_step_states(p_run_id);
  update flowlane.step_states ss
     set status = 'cancelled', cancelled_at = greatest(flowlane._now(), coalesce(ss.started_at, ss.created_at))
   where ss.run_id = p_run_id and ss.status in ('created', 'started');
$$;

-- (_steps_done completes a run the same way when its last step completes)
create or replace function flowlane._maybe_complete_runs(p_run_ids uuid[]) returns void
language sql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
  with done as (
    select r.run_id from flowlane.runs r
    where r.run_id = any (p_run_ids) and r.status = 'started' and r.remaining_steps = 0
  )
  update flowlane.runs r
     set status = 'completed', completed_at = flowlane._now(), output = coalesce(o.output, '{}'::jsonb)
    from done d
    left join flowlane._run_outputs(array(select k.run_id from done k)) o on o.run_id = d.run_id
   where r.run_id = d.run_id and r.run_id = any (p_run_ids)
     and r.status = 'started' and r.remaining_steps = 0  -- again on the row updated (a caller
                                                         -- may not hold the run's lock)
$$;

-- the outputs of completed runs: each run's completed leaf steps (the rule, in one place),
-- for a batch of runs in one statement
-- (plpgsql, not sql: a language sql function with set clauses plans its statement on every call)
create or replace function flowlane._run_outputs(p_run_ids uuid[]) returns table (run_id uuid, output jsonb)
language plpgsql stable
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set plan_cache_mode = force_generic_plan
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
begin
  if cardinality(p_run_ids) = 0 then
    return;
  end if;
  -- (the states of step_states and those tasks hold, all_step_states: each part by its own index)
  return query
  select x.run_id, jsonb_object_agg(x.step_slug, x.output)
  from (
    select ss.run_id, ss.flow_slug, ss.step_slug, ss.output
    from flowlane.step_states ss
    where ss.run_id = any (p_run_ids) and ss.status = 'completed'
    union all
    -- (task_index in the index condition: of a run's other tasks, a map's thousands, only
    -- the index entries are read)
    select t.run_id, t.flow_slug, t.step_slug, t.output
    from flowlane.step_tasks t
    where t.run_id = any (p_run_ids) and t.task_index = 0 and t.step_started_at is not null
      and t.status = 'completed'
  ) x
  where not exists (select 1 from flowlane.deps d where d.flow_slug = x.flow_slug and d.dep_slug = x.step_slug)
  group by x.run_id;
end;
$$;

-- the claim of a batch of read messages, classified as a whole before anything changes (a
-- batch with a message this worker cannot handle claims nothing); the tasks to hide and to
-- return are read from the unnested claim, the leases looked up once per (flow, step), the
-- inputs from _claimed_inputs. The worker's (flow, step) pairs come as two arrays, checked
-- by the caller (_pairs), like the queue's name and the worker id. p_read_vt: the visibility
-- claim_tasks read the messages with, the longest lease of the pairs it serves, which every
-- claimed task's lease fits in: the messages keep it. Null (start_tasks, whose caller read
-- the messages with a visibility of its own): each claimed task's message is hidden for its
-- lease (_hide_claimed).
create or replace function flowlane._start_tasks(p_queue text, p_msg_ids bigint[], p_worker_id uuid,
                                      p_flows text[], p_steps text[],
                                      p_read_vt int, p_started_at timestamptz = null)
returns setof flowlane.claim_record
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set plan_cache_mode = force_generic_plan
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_ids bigint[];
  v_locked bigint[];
  v_free bigint[];
  v_batch flowlane._claim_item[];
  v_duplicates flowlane.step_tasks[];
  v_claimed flowlane.step_tasks[];
  v_offsets int[];
begin
  if p_msg_ids is null or array_position(p_msg_ids, null) is not null then
    raise exception 'start_tasks: msg_ids must be an array of message ids without nulls' using errcode = '22023';
  end if;
  v_ids := array(select distinct m from unnest(p_msg_ids) m order by m);
  if cardinality(v_ids) = 0 then
    return;
  end if;

  -- a claim waits for no engine row (the lock order, README.md): the batch's tasks are locked
  -- skip locked, and a message whose task another transaction holds is left out of the
  -- claim and handed back visible rather than hidden for a lease (the holder may be a result
  -- it refuses, which leaves the message as it is); skip locked again, so a message the holder
  -- is writing is left to it
  v_locked := flowlane._lock_claimable_tasks(p_queue, v_ids);
  if cardinality(v_locked) < cardinality(v_ids) then
    execute format('select coalesce(array_agg(q.msg_id order by q.msg_id), ''{}'') from (select m.msg_id'
                   ' from pgmq.%I m where m.msg_id = any ($1) order by m.msg_id for update skip locked) q',
                   pgmq.format_table_name(p_queue, 'q'))
      into v_free using array(select m from unnest(v_ids) m where m <> all (v_locked));
    perform pgmq.set_vt(p_queue, v_free, 0);
  end if;
  v_ids := v_locked;
  if cardinality(v_ids) = 0 then
    return;
  end if;

  -- classify every message before any change
  select array_agg(row(b.msg_id, t, t.run_id is not null and p.flow_slug is not null,
                       flowlane._claimable(t.status, r.status,
                         -- (a step without a step_states row: its task holds its state, all_step_states)
                         coalesce(ss.status, case when t.step_started_at is null then null
                                                  when t.status = 'completed' then 'completed' else 'started' end))
                   )::flowlane._claim_item order by b.msg_id)
    into v_batch
  from unnest(v_ids) as b (msg_id)
  left join flowlane.step_tasks t
    on t.queue_name = p_queue and t.message_id = b.msg_id and t.message_id = any (v_ids)
   and t.message_id between v_ids[1] and v_ids[cardinality(v_ids)]
  left join unnest(p_flows, p_steps) as p (flow_slug, step_slug)
    on p.flow_slug = t.flow_slug and p.step_slug = t.step_slug
  left join flowlane.runs r on r.run_id = t.run_id
  left join flowlane.step_states ss on ss.run_id = t.run_id and ss.step_slug = t.step_slug;

  if exists (select 1 from unnest(v_batch) c where not c.supported) then
    perform pgmq.set_vt(p_queue, v_ids, 0);
    return query
      select 'unsupported', (c.task).flow_slug, (c.task).step_slug, p_queue, (c.task).run_id,
             (c.task).task_index, null::jsonb, null::jsonb, null::int, c.msg_id
      from unnest(v_batch) c where not c.supported order by c.msg_id;
    return;
  end if;

  -- terminal tasks: their message is ended (archived or deleted; idempotent)
  if exists (select 1 from unnest(v_batch) c
             where (c.task).status in ('completed', 'failed', 'skipped', 'cancelled')) then
    perform flowlane._end_queue_messages(p_queue, array(
      select c.msg_id from unnest(v_batch) c
      where (c.task).status in ('completed', 'failed', 'skipped', 'cancelled') order by c.msg_id));
  end if;
  -- still started (a visible duplicate): no attempt; hidden until stalled recovery may take it
  if exists (select 1 from unnest(v_batch) c where (c.task).status = 'started') then
    select array_agg(c.task order by c.msg_id),
           array_agg(greatest(1, ceil(extract(epoch from
                       flowlane._stall_deadline(c.task, o.stall_after) - flowlane._clock_timestamp()))::int) order by c.msg_id)
      into v_duplicates, v_offsets
    from unnest(v_batch) c
    join flowlane.step_options o on o.flow_slug = (c.task).flow_slug and o.step_slug = (c.task).step_slug
    where (c.task).status = 'started';
    perform flowlane._set_tasks_vt(v_duplicates, v_offsets);
  end if;

  with claimed as (
    update flowlane.step_tasks t
       set status = 'started', attempts_count = t.attempts_count + 1, started_at = coalesce(p_started_at, flowlane._now()),
           last_worker_id = p_worker_id
      from unnest(v_batch) c
     where c.claimable and t.run_id = (c.task).run_id and t.step_slug = (c.task).step_slug
       and t.task_index = (c.task).task_index
    returning t
  ) select coalesce(array_agg(c.t order by (c.t).message_id), '{}') into v_claimed from claimed c;

  if cardinality(v_claimed) = 0 then
    return;
  end if;
  if p_read_vt is null then
    perform flowlane._hide_claimed(v_claimed, p_read_vt);
  end if;

  return query
    select 'claimed', c.flow_slug, c.step_slug, c.queue_name, c.run_id, c.task_index,
           i.input, i.flow_input, c.attempts_count, c.message_id
    from unnest(v_claimed) c
    join flowlane._claimed_inputs(v_claimed) i
      on i.run_id = c.run_id and i.step_slug = c.step_slug and i.task_index = c.task_index
    order by c.message_id;
end;
$$;

-- The lock order's exception (README.md, "Lock order"): a claim holds queue messages before it
-- reaches their tasks (claim_tasks reads them in its own transaction), so it never waits for
-- an engine row. It locks the tasks of the messages p_ids (sorted) with skip locked and reads
-- their runs and step states without a lock: every end of a run or step changes its live
-- tasks, so a claim and an end meet on the task's row. Returns the messages whose task this
-- transaction now holds, and those with no task (foreign messages), in order; a message whose
-- task another transaction holds is left out.
create or replace function flowlane._lock_claimable_tasks(p_queue text, p_ids bigint[]) returns bigint[]
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set plan_cache_mode = force_generic_plan
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_locked bigint[];
begin
  v_locked := array(
    select t.message_id from flowlane.step_tasks t
    where t.queue_name = p_queue and t.message_id = any (p_ids)
      and t.message_id between p_ids[1] and p_ids[cardinality(p_ids)]
    order by t.run_id, t.step_slug, t.task_index
    for update skip locked);
  return array(
    select b.msg_id from unnest(p_ids) as b (msg_id)
    where b.msg_id = any (v_locked)
       or not exists (select 1 from flowlane.step_tasks t
                      where t.queue_name = p_queue and t.message_id = b.msg_id)
    order by 1);
end;
$$;

-- a claim starts a task that is queued in a started step of a started run (both claim paths,
-- _start_tasks and _claim_one)
create or replace function flowlane._claimable(p_task_status text, p_run_status text, p_step_status text) returns boolean
language plpgsql immutable
set search_path = ''
as $$
begin
  return coalesce(p_task_status = 'queued' and p_run_status = 'started' and p_step_status = 'started', false);
end;
$$;

-- the claim of one message, the common case (a worker's claim when one task is queued), without
-- the batch's machinery: the message's task when _start_tasks would claim it (the same locks in
-- the same order, the same classification), else null and no change, for the batch path to
-- decide (a foreign message, an unsupported pair, a duplicate, a task or run that has ended).
-- tests/core/test_claim_one.py holds the two paths equal.
create or replace function flowlane._claim_one(p_queue text, p_msg_id bigint, p_worker_id uuid, p_flows text[],
                                    p_steps text[], p_read_vt int, p_started_at timestamptz)
returns flowlane.claim_record
language plpgsql volatile
set search_path = ''
set plan_cache_mode = force_generic_plan
as $$
declare
  v_task flowlane.step_tasks;
  v_run_status text;
  v_step_status text;
  v_row flowlane.claim_record;
begin
  select t.* into v_task from flowlane.step_tasks t where t.queue_name = p_queue and t.message_id = p_msg_id;
  if not found or not exists (select 1 from unnest(p_flows, p_steps) as p (flow_slug, step_slug)
                              where p.flow_slug = v_task.flow_slug and p.step_slug = v_task.step_slug) then
    return null;
  end if;
  -- the task skip locked, its run and step state unlocked (_lock_claimable_tasks): a task
  -- another transaction holds is left to the batch path, which leaves it out
  select t.* into v_task from flowlane.step_tasks t
  where t.run_id = v_task.run_id and t.step_slug = v_task.step_slug and t.task_index = v_task.task_index
  for update skip locked;
  if not found then
    return null;
  end if;
  select r.status into v_run_status from flowlane.runs r where r.run_id = v_task.run_id;
  if v_task.step_started_at is not null then  -- the task holds its step's state (all_step_states)
    v_step_status := case when v_task.status = 'completed' then 'completed' else 'started' end;
  else
    select ss.status into v_step_status from flowlane.step_states ss
    where ss.run_id = v_task.run_id and ss.step_slug = v_task.step_slug;
  end if;
  if not flowlane._claimable(v_task.status, v_run_status, v_step_status) then
    return null;
  end if;
  update flowlane.step_tasks t
     set status = 'started', attempts_count = t.attempts_count + 1, started_at = coalesce(p_started_at, flowlane._now()),
         last_worker_id = p_worker_id
   where t.run_id = v_task.run_id and t.step_slug = v_task.step_slug and t.task_index = v_task.task_index
  returning t.* into v_task;
  if p_read_vt is null then
    perform flowlane._hide_claimed(array[v_task], p_read_vt);
  end if;
  select 'claimed', v_task.flow_slug, v_task.step_slug, v_task.queue_name, v_task.run_id, v_task.task_index,
         i.input, i.flow_input, v_task.attempts_count, v_task.message_id
    into v_row
  from flowlane._claimed_inputs(array[v_task]) i;
  return v_row;
end;
$$;

-- what claimed tasks are handed, for a batch in one statement: a task's input (the element
-- of the run input for a root map, of the parent's output for a dependent map; the run input
-- for a root single step; otherwise {dep: output} of the completed deps), and the run input
-- (of each task it reads run_id, flow_slug, step_slug and task_index)
create or replace function flowlane._claimed_inputs(p_tasks flowlane.step_tasks[])
returns table (run_id uuid, step_slug text, task_index int, input jsonb, flow_input jsonb)
language plpgsql stable
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
begin
  return query
  select t.run_id, t.step_slug, t.task_index,
         case
           when s.step_type = 'map' and s.deps_count = 0 then r.input -> t.task_index
           when s.step_type = 'map' then
             (select coalesce(ps.output, pt.output) -> t.task_index
              from flowlane.deps d
              left join flowlane.step_states ps on ps.run_id = t.run_id and ps.step_slug = d.dep_slug
              -- a parent whose task holds its state (all_step_states)
              left join flowlane.step_tasks pt
                on pt.run_id = t.run_id and pt.step_slug = d.dep_slug and pt.task_index = 0
               and pt.step_started_at is not null
              where d.flow_slug = s.flow_slug and d.step_slug = s.step_slug)
           when s.deps_count = 0 then r.input
           else flowlane._condition_subject(t.run_id, t.step_slug)
         end,
         r.input
  from unnest(p_tasks) t
  join flowlane.runs r
    on r.run_id = t.run_id and r.run_id = any (array(select distinct x.run_id from unnest(p_tasks) x order by 1))
  -- the step by the task's flow, not the run's: joined on r.flow_slug, a generic plan of
  -- PostgreSQL 15 reached the runs from the steps, through every run of the flow
  join flowlane.steps s on s.flow_slug = t.flow_slug and s.step_slug = t.step_slug;
end;
$$;

-- a started task that ends frees a slot of its queue's concurrency: the workers of each
-- limited queue that had one look again
create or replace function flowlane._wake_freed_queues() returns trigger
language plpgsql volatile
set search_path = ''
as $$
begin
  perform flowlane._wake_queue(l.queue_name)
  from flowlane.queue_limits l
  where l.concurrency is not null
    and exists (select 1 from old_tasks o join new_tasks n
                  on n.run_id = o.run_id and n.step_slug = o.step_slug and n.task_index = o.task_index
                where o.status = 'started' and n.status <> 'started' and o.queue_name = l.queue_name)
  order by l.queue_name;
  return null;
end;
$$;

-- called by a worker for the tasks it holds: items {run_id, step_slug,
-- task_index, attempt, running}. A task still owned by this worker and
-- attempt gets lease_renewed_at = flowlane._now() and its message hidden until the new
-- stall deadline. A running handler's lease is extended only within its
-- timeout (a hung handler is still recovered); a finished handler whose
-- result is not yet committed is always extended. Returns the tasks extended.
create or replace function flowlane.extend_leases(worker_id uuid, tasks jsonb) returns int
language plpgsql volatile
set search_path = ''
as $$
declare
  v_tasks flowlane.step_tasks[];
  v_offsets int[];
begin
  if tasks is null or jsonb_typeof(tasks) <> 'array' then
    raise exception 'extend_leases: tasks must be a JSON array of {run_id, step_slug, task_index, attempt, running}'
      using errcode = '22023';
  end if;
  with items as (
    select (e ->> 'run_id')::uuid as run_id, e ->> 'step_slug' as step_slug,
           (e ->> 'task_index')::int as task_index, (e ->> 'attempt')::int as attempt,
           coalesce((e ->> 'running')::boolean, false) as running
    from jsonb_array_elements(tasks) e
  ), locked as (
    select t.run_id, t.step_slug, t.task_index, o.stall_after
    from flowlane.step_tasks t
    join items i on i.run_id = t.run_id and i.step_slug = t.step_slug and i.task_index = t.task_index
    join flowlane.step_options o on o.flow_slug = t.flow_slug and o.step_slug = t.step_slug
    where t.status = 'started' and t.last_worker_id = extend_leases.worker_id
      and t.attempts_count = i.attempt
      and (not i.running or flowlane._now() < t.started_at + make_interval(secs => o.timeout))
    order by t.run_id, t.step_slug, t.task_index
    for update of t skip locked
  ), renewed as (
    update flowlane.step_tasks t set lease_renewed_at = flowlane._now()
      from locked l
     where t.run_id = l.run_id and t.step_slug = l.step_slug and t.task_index = l.task_index
    returning t, l.stall_after
  )
  select coalesce(array_agg(r.t), '{}'), coalesce(array_agg(r.stall_after), '{}')
    into v_tasks, v_offsets from renewed r;
  perform flowlane._set_tasks_vt(v_tasks, v_offsets);
  return cardinality(v_tasks);
end;
$$;

create or replace function flowlane.complete_task(
  run_id uuid, step_slug text, task_index int, output jsonb, worker_id uuid = null, attempt int = null
) returns setof flowlane.step_tasks
language plpgsql volatile
set search_path = ''
as $$
begin
  perform flowlane._require_claim('complete_task', complete_task.worker_id, complete_task.attempt);
  return query select * from flowlane._complete_batch(array[row(0, complete_task.run_id, complete_task.step_slug,
    complete_task.task_index, complete_task.output, complete_task.worker_id, complete_task.attempt,
    null, null, null)::flowlane._result_item]);
end;
$$;

-- a result is fenced by the claim it answers: the worker id and attempt are required (an
-- operator ends a task by hand with override_task, which is recorded)
create or replace function flowlane._require_claim(p_function text, p_worker_id uuid, p_attempt int) returns void
language plpgsql immutable
set search_path = ''
as $$
begin
  if p_worker_id is null or p_attempt is null then
    raise exception '%: a result needs the worker_id and attempt of its claim', p_function
      using errcode = '22023',
            hint = 'an operator completes a task by hand with flowlane.override_task(run_id, step_slug, '
                   'task_index, output, reason)';
  end if;
end;
$$;

-- the items of a complete_tasks/fail_tasks argument, validated together before
-- anything is locked; the first bad item raises with its position
create or replace function flowlane._result_items(p_function text, p_results jsonb, p_shape text)
returns flowlane._result_item[]
language plpgsql stable
set search_path = ''
as $$
declare
  v_bad record;
  v_key text;
  v_items flowlane._result_item[];
  v_misshapen boolean;
begin
  if p_results is null or jsonb_typeof(p_results) <> 'array' then
    raise exception '%: results must be a JSON array of %', p_function, p_shape using errcode = '22023';
  end if;
  -- every item in one pass: its casts are its check (a value that is not a uuid or an integer
  -- raises); only a batch with a bad item takes the exact check, item by item, in order
  begin
    select coalesce(array_agg(row(o - 1, (e ->> 'run_id')::uuid, e ->> 'step_slug', (e ->> 'task_index')::int,
                                  e -> 'output', (e ->> 'worker_id')::uuid, (e ->> 'attempt')::int,
                                  e ->> 'error_message', e ->> 'error_type', e ->> 'traceback'
                                 )::flowlane._result_item order by o), '{}'),
           coalesce(bool_or(jsonb_typeof(e) <> 'object'
                            or coalesce(jsonb_typeof(e -> 'run_id'), 'null') = 'null'
                            or coalesce(jsonb_typeof(e -> 'step_slug'), 'null') = 'null'
                            or coalesce(jsonb_typeof(e -> 'task_index'), 'null') = 'null'
                            or coalesce(jsonb_typeof(e -> 'worker_id'), 'null') = 'null'
                            or coalesce(jsonb_typeof(e -> 'attempt'), 'null') = 'null'), false)
      into v_items, v_misshapen
    from jsonb_array_elements(p_results) with ordinality as a (e, o);
  exception when invalid_text_representation or numeric_value_out_of_range then
    v_misshapen := true;
  end;
  if not v_misshapen then
    return v_items;
  end if;
  for v_bad in
    select e, o - 1 as pos from jsonb_array_elements(p_results) with ordinality as a (e, o) order by o
  loop
    if jsonb_typeof(v_bad.e) <> 'object' then
      raise exception '%: item % must be an object %, got %', p_function, v_bad.pos, p_shape,
        jsonb_typeof(v_bad.e) using errcode = '22023';
    end if;
    foreach v_key in array array['run_id', 'step_slug', 'task_index'] loop
      if coalesce(jsonb_typeof(v_bad.e -> v_key), 'null') = 'null' then
        raise exception '%: item % has no %', p_function, v_bad.pos, v_key using errcode = '22023';
      end if;
    end loop;
    foreach v_key in array array['run_id', 'worker_id', 'task_index', 'attempt'] loop
      begin
        if v_key in ('run_id', 'worker_id') then
          perform (v_bad.e ->> v_key)::uuid;
        else
          perform (v_bad.e ->> v_key)::int;
        end if;
      exception when invalid_text_representation or numeric_value_out_of_range then
        raise exception '%: item %: % must be %, got %', p_function, v_bad.pos, v_key,
          case when v_key in ('run_id', 'worker_id') then 'a uuid' else 'an integer' end,
          v_bad.e -> v_key using errcode = '22023';
      end;
    end loop;
    foreach v_key in array array['worker_id', 'attempt'] loop
      if coalesce(jsonb_typeof(v_bad.e -> v_key), 'null') = 'null' then
        raise exception '%: item % has no %', p_function, v_bad.pos, v_key using errcode = '22023',
          hint = 'a result is fenced by the worker_id and attempt of its claim';
      end if;
    end loop;
  end loop;
  raise exception '%: an item could not be read', p_function using errcode = 'XX000';
end;
$$;

-- a result acts on its task when the task, its run and its step are started and the result
-- answers the task's claim (its worker and attempt, where the result names them)
create or replace function flowlane._result_owns(p_item flowlane._result_item, p_task flowlane.step_tasks,
                                      p_run_status text, p_state_status text) returns boolean
language plpgsql immutable
set search_path = ''
as $$
begin
  return p_task.status = 'started' and p_run_status = 'started' and p_state_status = 'started'
     and (p_item.worker_id is null or p_task.last_worker_id is not distinct from p_item.worker_id)
     and (p_item.attempt is null or p_task.attempts_count is not distinct from p_item.attempt);
end;
$$;

-- a completed step's output: a single step's is its task's (p_output), a map step's the array
-- of its tasks' outputs in task order
create or replace function flowlane._step_output(p_run_id uuid, p_step_slug text, p_step_type text, p_output jsonb)
returns jsonb
language plpgsql stable
set search_path = ''
as $$
begin
  if p_step_type = 'single' then
    return p_output;
  end if;
  return (select coalesce(jsonb_agg(t.output order by t.task_index), '[]'::jsonb)
          from flowlane.step_tasks t
          where t.run_id = p_run_id and t.step_slug = p_step_slug);
end;
$$;

-- the tasks a dependent step will have, once a step it needs is done (p_skipped: skipped) with
-- p_output: a map step not yet sized takes the length of its parent's array (0 for a skipped
-- parent); any other step keeps what it has
create or replace function flowlane._dependent_tasks(p_status text, p_initial_tasks int, p_step_type text,
                                          p_output jsonb, p_skipped boolean) returns int
language plpgsql immutable
set search_path = ''
as $$
begin
  return case
    when p_status <> 'created' or p_initial_tasks is not null or p_step_type <> 'map' then p_initial_tasks
    when p_skipped then 0
    when jsonb_typeof(p_output) = 'array' then jsonb_array_length(p_output)
    else p_initial_tasks end;
end;
$$;

-- lock the batch's runs, step states and tasks (the lock order of docs/reliability.md; keys sorted) and classify every item
create or replace function flowlane._lock_and_classify(p_items flowlane._result_item[])
returns flowlane._result_class[]
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set plan_cache_mode = force_generic_plan
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_classes flowlane._result_class[];
  -- every lookup below also filters on run_id = any (v_runs): an index path whose cost
  -- follows the batch, whatever the planner thinks of unnest()'s row count
  v_runs uuid[] := array(select distinct i.run_id from unnest(p_items) i order by 1);
begin
  perform 1 from flowlane.runs r
  where r.run_id = any (v_runs)
  order by r.run_id for update;
  perform 1 from flowlane.step_states ss
  where ss.run_id = any (v_runs)
    and (ss.run_id, ss.step_slug) in (select i.run_id, i.step_slug from unnest(p_items) i)
  order by ss.run_id, ss.step_slug for update;
  perform 1 from flowlane.step_tasks t
  where t.run_id = any (v_runs)
    and (t.run_id, t.step_slug, t.task_index) in (select i.run_id, i.step_slug, i.task_index from unnest(p_items) i)
  order by t.run_id, t.step_slug, t.task_index for update;

  with classified as (
    -- (a step without a step_states row: its task holds its state, all_step_states)
    select i, t, r.status as run_status,
           flowlane._result_owns(i, t, r.status,
             coalesce(ss.status, case when t.step_started_at is null then null
                                      when t.status = 'completed' then 'completed' else 'started' end)) as owns
    from unnest(p_items) i
    left join flowlane.runs r on r.run_id = i.run_id and r.run_id = any (v_runs)
    left join flowlane.step_states ss
      on ss.run_id = i.run_id and ss.step_slug = i.step_slug and ss.run_id = any (v_runs)
    left join flowlane.step_tasks t
      on t.run_id = i.run_id and t.step_slug = i.step_slug and t.task_index = i.task_index
     and t.run_id = any (v_runs)
  ), ranked as (
    -- the same task twice in a batch: the first item that owns it acts, the next ones are late
    select c.*, c.owns and row_number() over (
             partition by (c.i).run_id, (c.i).step_slug, (c.i).task_index, c.owns order by (c.i).pos) = 1 as acts
    from classified c
  )
  select coalesce(array_agg(row(k.i, k.t, k.run_status, coalesce(k.acts, false))::flowlane._result_class
                            order by (k.i).run_id, (k.i).step_slug, (k.i).task_index, (k.i).pos), '{}')
    into v_classes
  from ranked k;

  -- late or duplicate callbacks: make sure the messages of terminal tasks are gone, change nothing
  perform flowlane._archive_tasks(array(
    select distinct on ((c.task).queue_name, (c.task).message_id) c.task from unnest(v_classes) c
    where (c.task).status in ('completed', 'failed', 'skipped', 'cancelled')));
  return v_classes;
end;
$$;

create or replace function flowlane._complete_batch(p_items flowlane._result_item[])
returns setof flowlane.step_tasks
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set plan_cache_mode = force_generic_plan
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_classes flowlane._result_class[];
  v_violations flowlane._result_class[];
  v_sequential uuid[];
  v_class flowlane._result_class;
  v_task flowlane.step_tasks;
  v_done flowlane.step_tasks[];
  v_steps flowlane.step_states[];
  v_cached boolean;
  v_runs uuid[];
begin
  if cardinality(p_items) = 1 then  -- one result: the plain case costs what it does
    v_task := flowlane._complete_one(p_items[1]);
    if v_task.run_id is not null then
      return next v_task;
      return;
    end if;
  end if;
  v_runs := array(select distinct i.run_id from unnest(p_items) i order by 1);
  v_classes := flowlane._lock_and_classify(p_items);

  -- a single step feeding a map must output an array: such an item fails its run
  select coalesce(array_agg(c order by (c.task).run_id, (c.task).step_slug, (c.task).task_index), '{}')
    into v_violations
  from unnest(v_classes) c
  join flowlane.steps s on s.flow_slug = (c.task).flow_slug and s.step_slug = (c.task).step_slug
  where c.actionable and s.step_type = 'single'
    and jsonb_typeof(coalesce((c.item).output, 'null'::jsonb)) <> 'array'
    and exists (select 1 from flowlane.deps d
                join flowlane.steps ch on ch.flow_slug = d.flow_slug and ch.step_slug = d.step_slug
                                       and ch.step_type = 'map'
                join flowlane.step_states cs on cs.run_id = (c.task).run_id and cs.step_slug = d.step_slug
                where d.flow_slug = s.flow_slug and d.dep_slug = s.step_slug
                  and cs.status = 'created' and cs.initial_tasks is null);

  v_sequential := flowlane._sequential_runs(v_classes, v_violations);
  for v_class in
    select c.* from unnest(v_classes) c
    where c.actionable and (c.task).run_id = any (v_sequential)
    order by (c.task).run_id, (c.task).step_slug, (c.task).task_index
  loop
    perform flowlane._complete_batch(array[v_class.item]);
  end loop;

  -- the rest: at most one violation per run, and it is the run's only actionable item
  for v_class in
    select c.* from unnest(v_violations) c where not (c.task).run_id = any (v_sequential)
  loop
    perform flowlane._unfold_step_states((v_class.task).run_id);
    update flowlane.step_tasks t
       set status = 'failed', failed_at = flowlane._now(), output = (v_class.item).output,
           error_message = format('[TYPE_VIOLATION] step %s feeds map step %s and must output a JSON array, got %s',
             (v_class.task).step_slug,
             (select d.step_slug from flowlane.deps d
              join flowlane.steps ch on ch.flow_slug = d.flow_slug and ch.step_slug = d.step_slug and ch.step_type = 'map'
              join flowlane.step_states cs on cs.run_id = (v_class.task).run_id and cs.step_slug = d.step_slug
              where d.flow_slug = (v_class.task).flow_slug and d.dep_slug = (v_class.task).step_slug
                and cs.status = 'created' and cs.initial_tasks is null
              order by d.step_slug limit 1),
             jsonb_typeof(coalesce((v_class.item).output, 'null'::jsonb)))
     where t.run_id = (v_class.task).run_id and t.step_slug = (v_class.task).step_slug
       and t.task_index = (v_class.task).task_index
    returning * into v_task;
    perform flowlane._archive_tasks(array[v_task]);
    update flowlane.step_states ss
       set status = 'failed', failed_at = flowlane._now(), remaining_tasks = null, error_message = v_task.error_message
     where ss.run_id = v_task.run_id and ss.step_slug = v_task.step_slug;
    perform flowlane._fail_run(v_task.run_id, v_task.error_message);
  end loop;

  -- completions: one statement per table
  with done as (
    update flowlane.step_tasks t
       set status = 'completed', completed_at = flowlane._now(), output = (c.item).output
      from unnest(v_classes) c
     where c.actionable and not (c.task).run_id = any (v_sequential)
       and not exists (select 1 from unnest(v_violations) v where (v.task).run_id = (c.task).run_id)
       and t.run_id = (c.task).run_id and t.step_slug = (c.task).step_slug and t.task_index = (c.task).task_index
       and t.run_id = any (v_runs)
    returning t
  ) select coalesce(array_agg(d.t), '{}') into v_done from done d;
  if cardinality(v_done) = 0 then
    return query select * from flowlane._batch_rows(p_items);
    return;
  end if;
  perform flowlane._archive_tasks(v_done);

  -- step states: remaining tasks and, for the last task, completion with the step output (one update)
  -- (the step's type joins the batch's counts, not step_states: joined to step_states on
  -- flow_slug, a generic plan read every state of the flow through step_states_flow_idx)
  with counts as (
    select d.run_id, d.step_slug, st.step_type, count(*)::int as n, (array_agg(d.output))[1] as output,
           st.opt_cache_ttl is not null as cached
    from unnest(v_done) d
    join flowlane.steps st on st.flow_slug = d.flow_slug and st.step_slug = d.step_slug
    where d.step_started_at is null  -- (a task that holds its step's state: below)
    group by 1, 2, 3, 6
  ), updated as (
    update flowlane.step_states ss
       set remaining_tasks = ss.remaining_tasks - c.n,
           status = case when ss.remaining_tasks = c.n then 'completed' else ss.status end,
           completed_at = case when ss.remaining_tasks = c.n then flowlane._now() end,
           output = case when ss.remaining_tasks = c.n
                         then flowlane._step_output(ss.run_id, ss.step_slug, c.step_type, c.output) end
      from counts c
     where ss.run_id = c.run_id and ss.step_slug = c.step_slug and ss.run_id = any (v_runs)
    returning ss, c.cached
  ) select coalesce(array_agg(u.ss) filter (where (u.ss).status = 'completed'), '{}')
           -- a task that holds its step's state (all_step_states) completed its step with it
           || array(select row(d.flow_slug, d.run_id, d.step_slug, 'completed', 0, 1, 0, d.output, null, null,
                               d.queued_at, d.step_started_at, d.completed_at, null, null, null)::flowlane.step_states
                    from unnest(v_done) d where d.step_started_at is not null),
           bool_or(u.cached)
      into v_steps, v_cached from updated u;
  if v_cached then  -- (23_cache.sql)
    perform flowlane._cache_outputs(v_done);
  end if;
  if cardinality(v_steps) > 0 then
    perform flowlane._steps_done(v_steps);
  end if;
  -- one distinct item per completed task: the rows the update returned are the tasks as they
  -- are now (nothing after it changes a completed task), in key order without reading them again
  if cardinality(v_done) = cardinality(p_items) then
    return query select d.* from unnest(v_done) d order by d.run_id, d.step_slug, d.task_index;
    return;
  end if;
  return query select * from flowlane._batch_rows(p_items);
end;
$$;

-- lock the item's run, step state and task (the lock order of _lock_and_classify);
-- the task when the item acts on it (started, owned by this worker and attempt), else null
create or replace function flowlane._lock_one(p_item flowlane._result_item) returns flowlane.step_tasks
language plpgsql volatile
set search_path = ''
set plan_cache_mode = force_generic_plan
as $$
declare
  v_run_status text;
  v_state_status text;
  v_task flowlane.step_tasks;
begin
  select r.status into v_run_status from flowlane.runs r where r.run_id = p_item.run_id for update;
  select ss.status into v_state_status from flowlane.step_states ss
  where ss.run_id = p_item.run_id and ss.step_slug = p_item.step_slug
  for update;
  select t.* into v_task from flowlane.step_tasks t
  where t.run_id = p_item.run_id and t.step_slug = p_item.step_slug and t.task_index = p_item.task_index
  for update;
  if v_task.step_started_at is not null then  -- the task holds its step's state (all_step_states)
    v_state_status := case when v_task.status = 'completed' then 'completed' else 'started' end;
  end if;
  if flowlane._result_owns(p_item, v_task, v_run_status, v_state_status) then
    return v_task;
  end if;
  return null;
end;
$$;

-- _complete_batch of one item; null (nothing done) when it is not the plain case
create or replace function flowlane._complete_one(p_item flowlane._result_item) returns flowlane.step_tasks
language plpgsql volatile
set search_path = ''
set plan_cache_mode = force_generic_plan
as $$
declare
  v_task flowlane.step_tasks := flowlane._lock_one(p_item);
  v_step_type text;
  v_cached boolean;
  v_state flowlane.step_states;
begin
  if v_task.run_id is null then
    return null;
  end if;
  select s.step_type, s.opt_cache_ttl is not null into v_step_type, v_cached from flowlane.steps s
  where s.flow_slug = v_task.flow_slug and s.step_slug = v_task.step_slug;
  if v_step_type = 'single' and exists (  -- its output's type is checked by the batch path
       select 1 from flowlane.deps d
       join flowlane.steps ch on ch.flow_slug = d.flow_slug and ch.step_slug = d.step_slug and ch.step_type = 'map'
       where d.flow_slug = v_task.flow_slug and d.dep_slug = v_task.step_slug) then
    return null;
  end if;
  update flowlane.step_tasks t
     set status = 'completed', completed_at = flowlane._now(), output = p_item.output
   where t.run_id = v_task.run_id and t.step_slug = v_task.step_slug and t.task_index = v_task.task_index
  returning t.* into v_task;
  if v_task.message_id is not null then
    perform flowlane._end_queue_messages(flowlane._task_queue(v_task), array[v_task.message_id]);
  end if;
  if v_cached then  -- (23_cache.sql)
    perform flowlane._cache_outputs(array[v_task]);
  end if;
  if v_task.step_started_at is not null then  -- the task holds its step's state: completed with it
    v_state := row(v_task.flow_slug, v_task.run_id, v_task.step_slug, 'completed', 0, 1, 0, v_task.output, null,
                   null, v_task.queued_at, v_task.step_started_at, v_task.completed_at, null, null, null);
  else
    update flowlane.step_states ss
       set remaining_tasks = ss.remaining_tasks - 1,
           status = case when ss.remaining_tasks = 1 then 'completed' else ss.status end,
           completed_at = case when ss.remaining_tasks = 1 then flowlane._now() end,
           output = case when ss.remaining_tasks = 1
                         then flowlane._step_output(ss.run_id, ss.step_slug, v_step_type, p_item.output) end
     where ss.run_id = v_task.run_id and ss.step_slug = v_task.step_slug
    returning ss.* into v_state;
  end if;
  if v_state.status = 'completed' then
    perform flowlane._step_done_one(v_state);
  end if;
  return v_task;
end;
$$;

-- _steps_done of one step of a started run whose lock the caller holds. The dependents it
-- makes ready are started in the same update when each is a plain task step (a queue, no
-- condition, tasks to run); any other one takes _progress_runs, as in the batch path.
create or replace function flowlane._step_done_one(p_step flowlane.step_states) returns void
language plpgsql volatile
set search_path = ''
set plan_cache_mode = force_generic_plan
as $$
declare
  v_status text;
  v_children text[];
  v_tasks int[];
  v_ready int;
  v_plain boolean;
  v_started flowlane.step_states[];
begin
  update flowlane.runs r
     set remaining_steps = r.remaining_steps - 1,
         status = case when r.remaining_steps = 1 then 'completed' else r.status end,
         completed_at = case when r.remaining_steps = 1 then flowlane._now() else r.completed_at end,
         output = case when r.remaining_steps = 1
                       then coalesce((select o.output from flowlane._run_outputs(array[r.run_id]) o), '{}'::jsonb)
                       else r.output end
   where r.run_id = p_step.run_id
  returning r.status into v_status;
  -- each dependent's initial_tasks once this step is done (a map child takes the length of
  -- its parent's array), and whether the ones it makes ready are all plain
  select array_agg(c.step_slug order by c.step_slug), array_agg(c.tasks order by c.step_slug),
         count(*) filter (where c.ready), coalesce(bool_and(c.plain) filter (where c.ready), true)
    into v_children, v_tasks, v_ready, v_plain
  from (
    select cs.step_slug, t.tasks,
           v_status = 'started' and cs.status = 'created' and cs.remaining_deps = 1 as ready,
           cst.queue_name is not null and cst.required_input_pattern is null
             and cst.forbidden_input_pattern is null and t.tasks > 0 as plain
    from flowlane.deps d
    join flowlane.steps cst on cst.flow_slug = d.flow_slug and cst.step_slug = d.step_slug
    join flowlane.step_states cs on cs.run_id = p_step.run_id and cs.step_slug = d.step_slug
    cross join lateral (
      select flowlane._dependent_tasks(cs.status, cs.initial_tasks, cst.step_type, p_step.output, false) as tasks) t
    where d.flow_slug = p_step.flow_slug and d.dep_slug = p_step.step_slug
  ) c;
  if v_children is null then  -- a leaf step
    return;
  end if;
  v_plain := v_plain and v_ready > 0;
  with counted as (
    update flowlane.step_states cs
       set remaining_deps = cs.remaining_deps - 1,
           initial_tasks = x.tasks,
           status = case when v_plain and cs.status = 'created' and cs.remaining_deps = 1 then 'started'
                         else cs.status end,
           started_at = case when v_plain and cs.status = 'created' and cs.remaining_deps = 1 then flowlane._now()
                             else cs.started_at end,
           remaining_tasks = case when v_plain and cs.status = 'created' and cs.remaining_deps = 1 then x.tasks
                                  else cs.remaining_tasks end
      from unnest(v_children, v_tasks) as x (step_slug, tasks)
     where cs.run_id = p_step.run_id and cs.step_slug = x.step_slug
    returning cs
  ) select coalesce(array_agg(c.cs order by (c.cs).step_slug)
                      filter (where v_plain and (c.cs).status = 'started' and (c.cs).remaining_deps = 0), '{}')
      into v_started from counted c;
  if v_plain then
    perform flowlane._enqueue_steps(v_started, false);
  elsif v_ready > 0 then
    perform flowlane._progress_runs(array[p_step.run_id]);
  end if;
  -- no dependent made ready: nothing to start, skip or complete (the run's other ready
  -- steps were started when they became ready; its last step completed it above)
end;
$$;

create or replace function flowlane._steps_done(p_steps flowlane.step_states[]) returns void
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set plan_cache_mode = force_generic_plan
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_runs uuid[] := array(select distinct s.run_id from unnest(p_steps) s order by 1);
  v_started uuid[];
  v_dep_runs uuid[];
  v_dep_steps text[];
  v_dep_counts int[];
  v_dep_tasks int[];
  v_dep_ready boolean[];
  v_ready int;
  v_plain boolean;
  v_now_started flowlane.step_states[];
begin
  -- a run with no step left completes here (_maybe_complete_runs would update it again);
  -- the batch holds its runs' locks (_lock_and_classify), so counts reads what it updates
  with counts as (
    select s.run_id, count(*)::int as n, rr.status = 'started' and rr.remaining_steps = count(*) as last
    from unnest(p_steps) s
    join flowlane.runs rr on rr.run_id = s.run_id and rr.run_id = any (v_runs)
    group by s.run_id, rr.status, rr.remaining_steps
  ), updated as (
  update flowlane.runs r
     set remaining_steps = r.remaining_steps - c.n,
         status = case when c.last then 'completed' else r.status end,
         completed_at = case when c.last then flowlane._now() else r.completed_at end,
         output = case when c.last then coalesce(o.output, '{}'::jsonb) else r.output end
    from counts c
    left join flowlane._run_outputs(array(select k.run_id from counts k where k.last)) o on o.run_id = c.run_id
   where r.run_id = c.run_id and r.run_id = any (v_runs)
  returning r.run_id, r.status
  ) select coalesce(array_agg(u.run_id order by u.run_id) filter (where u.status = 'started'), '{}')
      into v_started from updated u;
  -- each dependent's remaining deps and initial tasks once the batch's steps are done (a map
  -- child takes the length of its parent's array), and whether the ones it makes ready are
  -- all plain task steps (a queue, no condition, tasks to run): then they start in the same
  -- update, as in _step_done_one; any other one takes _progress_runs. A leaf step has none.
  select array_agg(c.run_id order by c.run_id, c.step_slug), array_agg(c.step_slug order by c.run_id, c.step_slug),
         array_agg(c.n order by c.run_id, c.step_slug), array_agg(c.tasks order by c.run_id, c.step_slug),
         array_agg(c.ready order by c.run_id, c.step_slug),
         count(*) filter (where c.ready), coalesce(bool_and(c.plain) filter (where c.ready), true)
    into v_dep_runs, v_dep_steps, v_dep_counts, v_dep_tasks, v_dep_ready, v_ready, v_plain
  from (
    select x.run_id, x.step_slug, x.n, t.tasks,
           x.run_id = any (v_started) and cs.status = 'created' and cs.remaining_deps = x.n as ready,
           x.task_step and t.tasks > 0 as plain
    -- (each lookup by its whole key: the step by the dependency's, the state without
    -- run_id = any (v_runs), with which a generic plan read every state of the batch's runs
    -- once per dependent)
    from (select p.run_id, d.step_slug, count(*)::int as n, (array_agg(p.output))[1] as output, cst.step_type,
                 cst.queue_name is not null and cst.required_input_pattern is null
                   and cst.forbidden_input_pattern is null as task_step
          from unnest(p_steps) p
          join flowlane.deps d on d.flow_slug = p.flow_slug and d.dep_slug = p.step_slug
          join flowlane.steps cst on cst.flow_slug = d.flow_slug and cst.step_slug = d.step_slug
          group by 1, 2, 5, 6) x
    join flowlane.step_states cs on cs.run_id = x.run_id and cs.step_slug = x.step_slug
    cross join lateral (
      select flowlane._dependent_tasks(cs.status, cs.initial_tasks, x.step_type, x.output, false) as tasks) t
  ) c;
  if v_dep_steps is null then  -- leaf steps: nothing to start (a run with no step left completed above)
    return;
  end if;
  v_plain := v_plain and v_ready > 0;
  with counted as (
    update flowlane.step_states cs
       set remaining_deps = cs.remaining_deps - x.n,
           initial_tasks = x.tasks,
           status = case when v_plain and x.ready then 'started' else cs.status end,
           -- (as _start_ready_steps: never before the state was created)
           started_at = case when v_plain and x.ready then greatest(flowlane._now(), cs.created_at)
                             else cs.started_at end,
           remaining_tasks = case when v_plain and x.ready then x.tasks else cs.remaining_tasks end
      from unnest(v_dep_runs, v_dep_steps, v_dep_counts, v_dep_tasks, v_dep_ready) as x (run_id, step_slug, n, tasks, ready)
     where cs.run_id = x.run_id and cs.step_slug = x.step_slug and cs.run_id = any (v_runs)
    returning cs, x.ready
  ) select coalesce(array_agg(c.cs order by (c.cs).run_id, (c.cs).step_slug) filter (where v_plain and c.ready), '{}')
      into v_now_started from counted c;
  if v_plain then
    perform flowlane._enqueue_steps(v_now_started, false);
  elsif v_ready > 0 then  -- a completed run has nothing left to start or skip
    perform flowlane._progress_runs(v_started);
  end if;
  -- no dependent made ready: nothing to start, skip or complete (the runs' other ready steps
  -- were started when they became ready)
end;
$$;

-- An operator completes a started task by hand: the task completes with the given output as
-- its worker's result would, the attempt history records who (the session's login) and why,
-- and the claim is taken from the worker (last_worker_id cleared), so that its own result,
-- when it comes, is rejected and counted as such by the worker.
create or replace function flowlane.override_task(
  run_id uuid, step_slug text, task_index int, output jsonb, reason text
) returns setof flowlane.step_tasks
language plpgsql volatile
set search_path = ''
as $$
declare
  v_task flowlane.step_tasks;
begin
  if nullif(btrim(override_task.reason), '') is null then
    raise exception 'override_task: a reason is required (it is recorded in the task''s history)'
      using errcode = '22023';
  end if;
  perform 1 from flowlane.runs r where r.run_id = override_task.run_id for update;
  perform 1 from flowlane.step_states ss
  where ss.run_id = override_task.run_id and ss.step_slug = override_task.step_slug for update;
  select t.* into v_task from flowlane.step_tasks t
  where t.run_id = override_task.run_id and t.step_slug = override_task.step_slug
    and t.task_index = override_task.task_index
  for update;
  if v_task.run_id is null or v_task.status <> 'started' then
    raise exception 'override_task: task %/%/% is %: only a started task is completed by hand',
      override_task.run_id, override_task.step_slug, override_task.task_index,
      coalesce(v_task.status, 'not found') using errcode = '55000';
  end if;
  perform flowlane._complete_batch(array[row(0, v_task.run_id, v_task.step_slug, v_task.task_index,
    override_task.output, v_task.last_worker_id, v_task.attempts_count, null, null, null)::flowlane._result_item]);
  insert into flowlane.task_attempts
    (run_id, step_slug, task_index, attempt, retry_round, outcome, worker_id, error_type, error_message)
  select v_task.run_id, v_task.step_slug, v_task.task_index, greatest(v_task.attempts_count, 1), r.retry_count,
         'overridden', v_task.last_worker_id, 'Override',
         left(format('completed by hand by %s: %s', session_user, override_task.reason), 4000)
  from flowlane.runs r where r.run_id = v_task.run_id;
  update flowlane.step_tasks t set last_worker_id = null
  where t.run_id = v_task.run_id and t.step_slug = v_task.step_slug and t.task_index = v_task.task_index;
  return query select t.* from flowlane.step_tasks t
  where t.run_id = v_task.run_id and t.step_slug = v_task.step_slug and t.task_index = v_task.task_index;
end;
$$;

create or replace function flowlane.fail_task_detailed(
  run_id uuid, step_slug text, task_index int, error_message text, worker_id uuid = null, attempt int = null,
  error_type text = null, traceback text = null
) returns setof flowlane.step_tasks
language plpgsql volatile
set search_path = ''
as $$
begin
  perform flowlane._require_claim('fail_task', fail_task_detailed.worker_id, fail_task_detailed.attempt);
  return query select * from flowlane._fail_batch(array[row(0, fail_task_detailed.run_id,
    fail_task_detailed.step_slug, fail_task_detailed.task_index, null, fail_task_detailed.worker_id,
    fail_task_detailed.attempt, fail_task_detailed.error_message, fail_task_detailed.error_type,
    fail_task_detailed.traceback)::flowlane._result_item]);
end;
$$;

create or replace function flowlane._fail_batch(p_items flowlane._result_item[])
returns setof flowlane.step_tasks
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_classes flowlane._result_class[];
  v_exhausted flowlane._result_class[];
  v_sequential uuid[];
  v_class flowlane._result_class;
  v_task flowlane.step_tasks;
  v_retried flowlane.step_tasks[];
  v_delays int[];
  v_runs uuid[];
begin
  if cardinality(p_items) = 1 then  -- one failure with attempts left: a retry, by key
    v_task := flowlane._fail_one(p_items[1]);
    if v_task.run_id is not null then
      return next v_task;
      return;
    end if;
  end if;
  v_runs := array(select distinct i.run_id from unnest(p_items) i order by 1);
  v_classes := flowlane._lock_and_classify(p_items);
  perform set_config('flowlane.attempt_details', coalesce((
    select jsonb_object_agg(format('%s/%s/%s', (c.task).run_id, (c.task).step_slug, (c.task).task_index),
                            jsonb_build_object('type', (c.item).error_type, 'traceback', (c.item).traceback))
    from unnest(v_classes) c where c.actionable), '{}')::text, true);

  select coalesce(array_agg(c order by (c.task).run_id, (c.task).step_slug, (c.task).task_index), '{}')
    into v_exhausted
  from unnest(v_classes) c
  join flowlane.step_options o on o.flow_slug = (c.task).flow_slug and o.step_slug = (c.task).step_slug
  where c.actionable and not flowlane._retries((c.task).attempts_count, o.max_attempts, (c.item).error_type);

  v_sequential := flowlane._sequential_runs(v_classes, v_exhausted);
  for v_class in
    select c.* from unnest(v_classes) c
    where c.actionable and (c.task).run_id = any (v_sequential)
    order by (c.task).run_id, (c.task).step_slug, (c.task).task_index
  loop
    perform flowlane._fail_batch(array[v_class.item]);
  end loop;

  -- retries: one update; the same message visible again after the backoff (one set_vt per queue and delay)
  with retried as (
    update flowlane.step_tasks t
       set status = 'queued', started_at = null, error_message = (c.item).error_message
      from unnest(v_classes) c
     where c.actionable and not (c.task).run_id = any (v_sequential)
       and not exists (select 1 from unnest(v_exhausted) e where (e.task).run_id = (c.task).run_id)
       and t.run_id = (c.task).run_id and t.step_slug = (c.task).step_slug and t.task_index = (c.task).task_index
       and t.run_id = any (v_runs)
    returning t
  ) select coalesce(array_agg(r.t), '{}'),
           coalesce(array_agg(flowlane.calculate_retry_delay(o.base_delay, (r.t).attempts_count)), '{}')
      into v_retried, v_delays
    from retried r
    join flowlane.step_options o on o.flow_slug = (r.t).flow_slug and o.step_slug = (r.t).step_slug;
  perform flowlane._set_tasks_vt(v_retried, v_delays);

  -- out of attempts: at most one per run here, and it is the run's only actionable item
  for v_class in
    select c.* from unnest(v_exhausted) c where not (c.task).run_id = any (v_sequential)
  loop
    perform flowlane._exhaust_task(v_class.task, (v_class.item).error_message);
  end loop;

  perform set_config('flowlane.attempt_details', '', true);
  return query select * from flowlane._batch_rows(p_items);
end;
$$;

-- _fail_batch of one item that retries (see _lock_one); null (nothing done) otherwise
create or replace function flowlane._fail_one(p_item flowlane._result_item) returns flowlane.step_tasks
language plpgsql volatile
set search_path = ''
set plan_cache_mode = force_generic_plan
as $$
declare
  v_task flowlane.step_tasks := flowlane._lock_one(p_item);
  v_base_delay int;
  v_max_attempts int;
begin
  if v_task.run_id is null then
    return null;
  end if;
  select o.base_delay, o.max_attempts into v_base_delay, v_max_attempts from flowlane.step_options o
  where o.flow_slug = v_task.flow_slug and o.step_slug = v_task.step_slug;
  if not flowlane._retries(v_task.attempts_count, v_max_attempts, p_item.error_type) then
    return null;  -- exhausted: when_exhausted is applied by the batch path
  end if;
  perform set_config('flowlane.attempt_details', jsonb_build_object(
    format('%s/%s/%s', v_task.run_id, v_task.step_slug, v_task.task_index),
    jsonb_build_object('type', p_item.error_type, 'traceback', p_item.traceback))::text, true);
  update flowlane.step_tasks t
     set status = 'queued', started_at = null, error_message = p_item.error_message
   where t.run_id = v_task.run_id and t.step_slug = v_task.step_slug and t.task_index = v_task.task_index
  returning t.* into v_task;
  perform set_config('flowlane.attempt_details', '', true);
  if v_task.message_id is not null then
    perform flowlane._queue_set_vt(flowlane._task_queue(v_task), array[v_task.message_id],
                                   flowlane.calculate_retry_delay(v_base_delay, v_task.attempts_count));
  end if;
  return v_task;
end;
$$;

-- a failed attempt is retried while the task has attempts left; a wrong output is a bug in
-- the handler, not a hiccup: never retried (both result paths, _fail_batch and _fail_one)
create or replace function flowlane._retries(p_attempts int, p_max_attempts int, p_error_type text) returns boolean
language plpgsql immutable
set search_path = ''
as $$
begin
  return coalesce(p_attempts < p_max_attempts, false) and p_error_type is distinct from 'OutputContractViolation';
end;
$$;

-- a task out of attempts (fail_tasks or stalled recovery): failed, message
-- archived, when_exhausted applied. Caller holds the run, step state and task locks.
create or replace function flowlane._exhaust_task(p_task flowlane.step_tasks, p_error text) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_task flowlane.step_tasks;
  v_mode text;
begin
  perform flowlane._unfold_step_states(p_task.run_id);
  update flowlane.step_tasks t
     set status = 'failed', failed_at = flowlane._now(), error_message = p_error
   where t.run_id = p_task.run_id and t.step_slug = p_task.step_slug and t.task_index = p_task.task_index
  returning * into v_task;
  perform flowlane._archive_tasks(array[v_task]);
  select s.when_exhausted into v_mode from flowlane.steps s
  where s.flow_slug = v_task.flow_slug and s.step_slug = v_task.step_slug;
  if v_mode = 'fail' then
    update flowlane.step_states ss
       set status = 'failed', failed_at = flowlane._now(), remaining_tasks = null, error_message = p_error
     where ss.run_id = v_task.run_id and ss.step_slug = v_task.step_slug;
    perform flowlane._fail_run(v_task.run_id,
      format('step %s task %s failed after %s %s: %s', v_task.step_slug, v_task.task_index,
             v_task.attempts_count, case when v_task.attempts_count = 1 then 'attempt' else 'attempts' end, p_error));
  elsif v_mode = 'skip-cascade' then
    perform flowlane._skip_cascade(v_task.run_id, v_task.step_slug, 'handler_failed');
    perform flowlane._progress(v_task.run_id);
  else
    perform flowlane._skip_step(v_task.run_id, v_task.step_slug, 'handler_failed');
    perform flowlane._progress(v_task.run_id);
  end if;
end;
$$;

-- stalled recovery: the candidates are the started tasks (step_tasks_started_idx), then each
-- is locked run -> step state -> task, skipping what another transaction holds, and checked again
create or replace function flowlane.requeue_stalled_tasks() returns int
language plpgsql volatile
set search_path = ''
as $$
declare
  v_cand record;
  v_task flowlane.step_tasks;
  v_requeued flowlane.step_tasks[] := '{}';
  v_handled int := 0;
begin
  for v_cand in
    select t.run_id, t.step_slug, t.task_index, o.timeout, o.max_attempts, o.stall_after,
           t.step_started_at is not null as in_task
    from flowlane.step_tasks t
    join flowlane.step_options o on o.flow_slug = t.flow_slug and o.step_slug = t.step_slug
    where t.status = 'started'
      and flowlane._stall_deadline(t, o.stall_after) < flowlane._now()
    order by t.run_id, t.step_slug, t.task_index
  loop
    -- lock order run -> step state -> task; skip what another transaction holds
    perform 1 from flowlane.runs r where r.run_id = v_cand.run_id and r.status = 'started'
      for update skip locked;
    continue when not found;
    -- (a step without a step_states row: its task holds its state, and its lock is the task's)
    perform 1 from flowlane.step_states ss
      where ss.run_id = v_cand.run_id and ss.step_slug = v_cand.step_slug and ss.status = 'started'
      for update skip locked;
    continue when not found and not v_cand.in_task;
    select * into v_task from flowlane.step_tasks t
     where t.run_id = v_cand.run_id and t.step_slug = v_cand.step_slug and t.task_index = v_cand.task_index
       and t.status = 'started' and flowlane._stall_deadline(t, v_cand.stall_after) < flowlane._now()
       for update skip locked;
    continue when not found;
    v_handled := v_handled + 1;
    if v_task.attempts_count >= v_cand.max_attempts then
      perform flowlane._exhaust_task(v_task,
        format('no result within %s s, %s attempts', v_cand.timeout, v_task.attempts_count));
    else
      update flowlane.step_tasks t
         set status = 'queued', started_at = null, last_worker_id = null, lease_renewed_at = null,
             requeued_count = t.requeued_count + 1, last_requeued_at = flowlane._now(),
             error_message = format('no result within %s s (attempt %s)', v_cand.timeout, v_task.attempts_count)
       where t.run_id = v_task.run_id and t.step_slug = v_task.step_slug and t.task_index = v_task.task_index
      returning * into v_task;
      v_requeued := v_requeued || v_task;
    end if;
  end loop;
  perform flowlane._set_tasks_vt(v_requeued, array_fill(0, array[cardinality(v_requeued)]));
  return v_handled;
end;
$$;

-- cancel a started (or waiting) run: its unfinished tasks and steps are cancelled and the
-- tasks' messages archived; later completions of those tasks are rejected (they are
-- terminal) and no further step starts. Cancelling a cancelled run returns it.
create or replace function flowlane.cancel_run(run_id uuid, reason text = null) returns flowlane.runs
language plpgsql volatile
set search_path = ''
as $$
declare
  v_run flowlane.runs;
  v_tasks flowlane.step_tasks[];
begin
  select * into v_run from flowlane.runs r where r.run_id = cancel_run.run_id for update;
  if not found then
    raise exception 'no run %', cancel_run.run_id using errcode = 'P0002';
  end if;
  if v_run.status = 'cancelled' then
    return v_run;
  end if;
  if v_run.status not in ('started', 'waiting') then
    raise exception 'run % is already %: only a started or waiting run can be cancelled', v_run.run_id, v_run.status
      using errcode = '55000';
  end if;
  update flowlane.runs r
     set status = 'cancelled', cancelled_at = greatest(flowlane._now(), r.started_at),
         cancel_reason = left(coalesce(nullif(btrim(reason), ''), 'cancelled'), 1000)
   where r.run_id = v_run.run_id
  returning * into v_run;
  with cancelled as (
    update flowlane.step_tasks t set status = 'cancelled', cancelled_at = greatest(flowlane._now(), t.queued_at)
     where t.run_id = v_run.run_id and t.status in ('queued', 'started')
    returning t
  ) select coalesce(array_agg(c.t), '{}') into v_tasks from cancelled c;
  perform flowlane._archive_tasks(v_tasks);
  perform flowlane._end_unfinished_steps(v_run.run_id);
  return v_run;
end;
$$;

-- resume a failed run: failed steps (and steps the failure ended after they
-- started) start over with a fresh attempt budget; completed
-- steps and completed map tasks keep their outputs. A failed step that never
-- had tasks (a when_unmet = fail condition) is evaluated again, and steps the
-- failure ended before they began wait for their needs again.
create or replace function flowlane.retry_run(run_id uuid) returns flowlane.runs
language plpgsql volatile
set search_path = ''
as $$
declare
  v_run flowlane.runs;
begin
  v_run := flowlane._lock_run_to_retry(retry_run.run_id, array['failed']);
  perform flowlane._reopen_failed_steps(v_run.run_id);
  return flowlane._restart_run(v_run);
end;
$$;

-- rerun a failed or completed run from a step: the step and every step that depends on it,
-- transitively, run again from the beginning (map steps with all their tasks), with the
-- outputs of the other steps kept; on a failed run the failed steps are retried as
-- retry_run does. The completed tasks of the rerun steps stay in the attempt history
-- (outcome 'superseded', with their output), as do all their earlier attempts. A wait
-- step rerun completes again with the signal it received; a child-flow step is not rerun
-- (its child runs are runs of their own: retry them), so a rerun that would include one is
-- refused, as is a completed child run while its parent runs. The run waits for its flow's
-- concurrency limit like a retried one.
create or replace function flowlane.retry_run_from(run_id uuid, step_slug text) returns flowlane.runs
language plpgsql volatile
set search_path = ''
as $$
declare
  v_run flowlane.runs;
  v_steps text[];
  v_child text;
begin
  v_run := flowlane._lock_run_to_retry(retry_run_from.run_id, array['failed', 'completed']);
  if not exists (select 1 from flowlane.steps s
                 where s.flow_slug = v_run.flow_slug and s.step_slug = retry_run_from.step_slug) then
    raise exception 'flow % of run % has no step %', v_run.flow_slug, v_run.run_id,
      quote_literal(retry_run_from.step_slug) using errcode = '22023';
  end if;
  if v_run.status = 'completed' and exists (select 1 from flowlane.runs p
                                            where p.run_id = v_run.parent_run_id and p.status in ('started', 'waiting')) then
    -- its parent's step has counted its output already
    raise exception 'run % is a child run whose parent run % is still running: it cannot be rerun now',
      v_run.run_id, v_run.parent_run_id using errcode = '55000',
      hint = 'rerun it once the parent run has ended, or rerun the parent from its child-flow step''s dependents';
  end if;
  v_steps := flowlane._dependents(v_run.flow_slug, retry_run_from.step_slug);
  select s.step_slug into v_child from flowlane.steps s
  where s.flow_slug = v_run.flow_slug and s.step_slug = any (v_steps) and s.child_flow is not null
  order by s.step_index limit 1;
  if found then
    raise exception 'run % cannot be rerun from step %: step % starts child runs, which are not rerun',
      v_run.run_id, retry_run_from.step_slug, v_child using errcode = '55000',
      hint = 'retry the child runs themselves, or rerun from a step after it';
  end if;
  perform 1 from flowlane.step_states ss where ss.run_id = v_run.run_id order by ss.step_slug for update;
  perform flowlane._forget_cached(v_run.run_id, v_steps);  -- (23_cache.sql)
  perform flowlane._reset_steps(v_run, v_steps);
  if v_run.status = 'failed' then
    perform flowlane._reopen_failed_steps(v_run.run_id);
  end if;
  perform flowlane._count_what_remains(v_run.run_id, v_steps);
  return flowlane._restart_run(v_run);
end;
$$;

-- a run locked for a retry, refused unless it is in one of the given states
create or replace function flowlane._lock_run_to_retry(p_run_id uuid, p_states text[]) returns flowlane.runs
language plpgsql volatile
set search_path = ''
as $$
declare
  v_run flowlane.runs;
begin
  select * into v_run from flowlane.runs r where r.run_id = p_run_id for update;
  if not found then
    raise exception 'no run %', p_run_id using errcode = 'P0002';
  end if;
  if v_run.status <> all (p_states) then
    raise exception 'run % is %: only a % run can be retried', v_run.run_id, v_run.status,
      array_to_string(p_states, ' or ') using errcode = '55000';
  end if;
  if v_run.compensation is not null then
    raise exception 'run % has been compensated (compensation %): it is not retried', v_run.run_id,
      v_run.compensation using errcode = '55000',
      hint = 'start a new run; a stopped compensation resumes with flowlane.retry_compensation(run_id)';
  end if;
  perform flowlane._unfold_step_states(v_run.run_id);  -- a retry resets and restarts step_states rows
  return v_run;
end;
$$;

-- a step and every step that depends on it, transitively
create or replace function flowlane._dependents(p_flow text, p_step text) returns text[]
language sql stable
set search_path = ''
as $$
  with recursive down(step_slug) as (
    select p_step
    union
    select d.step_slug from flowlane.deps d join down on d.dep_slug = down.step_slug
    where d.flow_slug = p_flow
  )
  select array_agg(down.step_slug order by down.step_slug) from down
$$;

-- the given steps of a locked run start again from nothing: their completed tasks are kept
-- in the attempt history as superseded, their tasks and held tasks go, a wait step's signal
-- is kept to complete it again, and each step is as a new run makes it (a map step over a
-- kept step's output gets its size from that output)
create or replace function flowlane._reset_steps(p_run flowlane.runs, p_steps text[]) returns void
language plpgsql volatile
set search_path = ''
as $$
begin
  insert into flowlane.task_attempts
    (run_id, step_slug, task_index, attempt, retry_round, outcome, worker_id, output, failed_at)
  select t.run_id, t.step_slug, t.task_index, greatest(t.attempts_count, 1), p_run.retry_count, 'superseded',
         t.last_worker_id, t.output, t.completed_at
  from flowlane.step_tasks t
  join flowlane.steps s on s.flow_slug = t.flow_slug and s.step_slug = t.step_slug
  where t.run_id = p_run.run_id and t.step_slug = any (p_steps) and t.status = 'completed'
  order by s.step_index, t.task_index;
  delete from flowlane.held_tasks h where h.run_id = p_run.run_id and h.step_slug = any (p_steps);
  delete from flowlane.step_tasks t where t.run_id = p_run.run_id and t.step_slug = any (p_steps);
  update flowlane.signals g set applied_at = null
   where g.run_id = p_run.run_id and g.step_slug = any (p_steps);
  update flowlane.step_states ss
     set status = 'created', output = null, error_message = null, skip_reason = null, started_at = null,
         completed_at = null, failed_at = null, skipped_at = null, cancelled_at = null, remaining_tasks = null,
         initial_tasks = case when s.step_type <> 'map' then 1
                              when s.deps_count = 0 and jsonb_typeof(p_run.input) = 'array'
                                then jsonb_array_length(p_run.input) end
    from flowlane.steps s
   where ss.run_id = p_run.run_id and ss.step_slug = any (p_steps)
     and s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug;
  update flowlane.step_states ss
     set initial_tasks = case when ps.status = 'skipped' then 0 else jsonb_array_length(ps.output) end
    from flowlane.steps s, flowlane.deps d, flowlane.step_states ps
   where ss.run_id = p_run.run_id and ss.step_slug = any (p_steps)
     and s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug and s.step_type = 'map'
     and d.flow_slug = s.flow_slug and d.step_slug = s.step_slug
     and ps.run_id = ss.run_id and ps.step_slug = d.dep_slug
     and (ps.status = 'skipped' or (ps.status = 'completed' and jsonb_typeof(ps.output) = 'array'));
end;
$$;

-- the reset steps wait for their needs that have not completed (or been skipped), and the
-- run for each step that has not
create or replace function flowlane._count_what_remains(p_run_id uuid, p_steps text[]) returns void
language sql volatile
set search_path = ''
as $$
  update flowlane.step_states ss
     set remaining_deps = (select count(*) from flowlane.deps d
                           join flowlane.step_states ps on ps.run_id = ss.run_id and ps.step_slug = d.dep_slug
                           where d.flow_slug = ss.flow_slug and d.step_slug = ss.step_slug
                             and ps.status not in ('completed', 'skipped'))
   where ss.run_id = p_run_id and ss.step_slug = any (p_steps);
  update flowlane.runs r
     set remaining_steps = (select count(*) from flowlane.step_states ss
                            where ss.run_id = r.run_id and ss.status not in ('completed', 'skipped'))
   where r.run_id = p_run_id;
$$;

-- the steps of a locked failed run that its failure ended start over (retry_run)
create or replace function flowlane._reopen_failed_steps(p_run_id uuid) returns void
language plpgsql volatile
set search_path = ''
as $$
begin
  perform 1 from flowlane.step_states ss where ss.run_id = p_run_id order by ss.step_slug for update;

  -- steps the failure ended before they began wait for their needs again
  update flowlane.step_states ss
     set status = 'created', cancelled_at = null
   where ss.run_id = p_run_id and ss.status = 'cancelled' and ss.started_at is null;

  update flowlane.step_states ss
     set status = 'created', failed_at = null, error_message = null, remaining_tasks = null
   where ss.run_id = p_run_id and ss.status = 'failed'
     and not exists (select 1 from flowlane.step_tasks t
                     where t.run_id = ss.run_id and t.step_slug = ss.step_slug);
  perform flowlane._reopen_waits(p_run_id);
  delete from flowlane.held_tasks h where h.run_id = p_run_id;  -- held again when their steps restart
  -- unfinished tasks are replaced by fresh ones (a message id is an immutable identity);
  -- their attempts stay in flowlane.task_attempts
  delete from flowlane.step_tasks t
   using flowlane.step_states ss
   where t.run_id = p_run_id and ss.run_id = t.run_id and ss.step_slug = t.step_slug
     and ss.status in ('failed', 'started', 'cancelled') and t.status in ('failed', 'cancelled');
  update flowlane.step_states ss
     set status = 'started', failed_at = null, cancelled_at = null, error_message = null,
         started_at = coalesce(ss.started_at, flowlane._now()),
         remaining_tasks = ss.initial_tasks - (select count(*) from flowlane.step_tasks t
                                               where t.run_id = ss.run_id and t.step_slug = ss.step_slug
                                                 and t.status = 'completed')
   where ss.run_id = p_run_id and ss.status in ('failed', 'started', 'cancelled');
end;
$$;

-- a locked run whose steps were reopened starts again with a fresh deadline, or waits for its
-- key on a flow with a concurrency limit (its tasks are sent when it begins, _begin_held_runs)
create or replace function flowlane._restart_run(p_run flowlane.runs) returns flowlane.runs
language plpgsql volatile
set search_path = ''
as $$
declare
  v_run flowlane.runs;
begin
  if p_run.concurrency_key is not null then
    update flowlane.runs r
       set status = 'waiting', failed_at = null, completed_at = null, output = null, error_message = null,
           deadline_at = null, retry_count = r.retry_count + 1, retried_at = flowlane._now(),
           hold_seq = nextval('flowlane.hold_seq')
     where r.run_id = p_run.run_id;
    perform flowlane._begin_new_held_runs(array[p_run.run_id]);
    select * into v_run from flowlane.runs r where r.run_id = p_run.run_id;
    return v_run;
  end if;
  update flowlane.runs r
     set status = 'started', failed_at = null, completed_at = null, output = null, error_message = null,
         retry_count = r.retry_count + 1, retried_at = flowlane._now(),
         deadline_at = flowlane._run_deadline(r.flow_slug, flowlane._now())  -- a fresh deadline from the retry
   where r.run_id = p_run.run_id;
  -- one send_batch per queue, tasks in step order (held for their slot on a limited step)
  perform flowlane._send_missing_tasks(p_run.run_id);
  perform flowlane._progress(p_run.run_id);
  select * into v_run from flowlane.runs r where r.run_id = p_run.run_id;
  return v_run;
end;
$$;

-- many runs at once (`flowlane retry|cancel` with a filter), one bounded batch per call and
-- transaction: each run is locked in id order and retried, or cancelled, if it is still in
-- a state that allows it (a run that changed since it was chosen is passed over); returns
-- the runs it changed
create or replace function flowlane.retry_runs(run_ids uuid[]) returns setof uuid
language plpgsql volatile
set search_path = ''
as $$
declare
  v_id uuid;
begin
  perform flowlane._check_batch('retry_runs', run_ids);
  for v_id in
    select r.run_id from flowlane.runs r where r.run_id = any (run_ids) order by r.run_id for update
  loop
    continue when (select r.status <> 'failed' or r.compensation is not null
                   from flowlane.runs r where r.run_id = v_id);
    perform flowlane.retry_run(v_id);
    return next v_id;
  end loop;
end;
$$;

create or replace function flowlane.cancel_runs(run_ids uuid[], reason text = null) returns setof uuid
language plpgsql volatile
set search_path = ''
as $$
declare
  v_id uuid;
begin
  perform flowlane._check_batch('cancel_runs', run_ids);
  for v_id in
    select r.run_id from flowlane.runs r where r.run_id = any (run_ids) order by r.run_id for update
  loop
    continue when (select r.status from flowlane.runs r where r.run_id = v_id) not in ('started', 'waiting');
    perform flowlane.cancel_run(v_id, reason);
    return next v_id;
  end loop;
end;
$$;

-- a batch is bounded: the locks of its runs are held until its transaction commits
create or replace function flowlane._check_batch(p_function text, p_run_ids uuid[]) returns void
language plpgsql immutable
set search_path = ''
as $$
begin
  if cardinality(p_run_ids) > 1000 then
    raise exception '%: at most 1000 runs a call, got %', p_function, cardinality(p_run_ids)
      using errcode = '22023', hint = 'pass the runs in batches, one transaction each';
  end if;
end;
$$;

-- how long a worker counts as live after its last heartbeat (it beats every 5 s): the one
-- stale window of every reader (flowlane.defaults.STALE_AFTER names the same number)
create or replace function flowlane.worker_stale_after() returns interval
language sql immutable parallel safe
set search_path = ''
as $$ select interval '30 seconds' $$;

-- the one liveness rule: a worker is live while it has not stopped and its heartbeat is
-- within the stale window (worker list, queue list, run, the console, the metrics, serve)
create or replace function flowlane.worker_is_live(w flowlane.workers) returns boolean
language sql stable parallel safe
set search_path = ''
as $$ select w.stopped_at is null and w.last_heartbeat_at > flowlane._now() - flowlane.worker_stale_after() $$;

-- register a worker of a deployment (created enabled on first use); refused
-- while the deployment is disabled
create or replace function flowlane.register_worker(
  worker_id uuid, queue_name text, worker_name text, deployment_name text, supported_pairs jsonb
) returns flowlane.workers
language plpgsql volatile
set search_path = ''
as $$
declare
  v_deployment flowlane.worker_deployments;
  v_row flowlane.workers;
  v_pairs jsonb;
begin
  if register_worker.worker_id is null then
    raise exception 'register_worker: worker_id is required' using errcode = '22023';
  end if;
  perform flowlane._check_queue_argument('register_worker', register_worker.queue_name);
  perform flowlane._check_deployment_argument('register_worker', register_worker.deployment_name);
  select coalesce(jsonb_agg(jsonb_build_array(p.flow_slug, p.step_slug) order by p.flow_slug, p.step_slug), '[]')
    into v_pairs from flowlane._pairs(supported_pairs) p;
  if not exists (select 1 from flowlane.queues q where q.queue_name = register_worker.queue_name) then
    raise exception 'register_worker: queue "%" is not registered with flowlane', register_worker.queue_name
      using errcode = 'P0002', hint = 'apply the compiled SQL of the flows routed to it (`flowlane apply`)';
  end if;
  insert into flowlane.worker_deployments as d (deployment_name, queue_name)
  values (register_worker.deployment_name, register_worker.queue_name)
  on conflict on constraint worker_deployments_pkey do nothing;
  select * into v_deployment from flowlane.worker_deployments d
  where d.deployment_name = register_worker.deployment_name for update;
  if v_deployment.queue_name <> register_worker.queue_name then
    raise exception 'deployment "%" serves queue "%", not "%"', v_deployment.deployment_name,
      v_deployment.queue_name, register_worker.queue_name
      using errcode = '22023', hint = 'a deployment polls exactly one queue: give this worker another --name';
  end if;
  if not v_deployment.enabled then
    raise exception 'FLOWLANE_DEPLOYMENT_DISABLED: worker deployment "%" is disabled: %',
      v_deployment.deployment_name, coalesce(v_deployment.reason, 'no reason given')
      using errcode = '55000',
            hint = format('after fixing the cause, run `flowlane worker enable %s`', v_deployment.deployment_name);
  end if;
  insert into flowlane.workers as w (worker_id, queue_name, worker_name, deployment_name, supported_pairs)
  values (register_worker.worker_id, register_worker.queue_name, register_worker.worker_name,
          register_worker.deployment_name, v_pairs)
  on conflict on constraint workers_pkey do update
    set last_heartbeat_at = greatest(flowlane._now(), w.last_heartbeat_at)
  returning * into v_row;
  delete from flowlane.worker_refusals r where r.queue_name = register_worker.queue_name;
  return v_row;
end;
$$;

-- A worker that refuses to start (flows missing from the database, a shape that differs
-- from the YAML, a coverage gap, handlers that cannot be imported) records why, so that
-- whatever explains a wait (`run`, `runs`, `start --wait`, `queue list`, the console) can
-- name it. The latest refusal per deployment is kept; a worker registering on the queue
-- clears the queue's refusals (register_worker). Nothing here changes a definition.
create or replace function flowlane.record_worker_refusal(
  queue_name text, deployment_name text, reason text, hint text = null
) returns flowlane.worker_refusals
language plpgsql volatile
set search_path = ''
as $$
declare
  v_row flowlane.worker_refusals;
begin
  perform flowlane._check_queue_argument('record_worker_refusal', record_worker_refusal.queue_name);
  perform flowlane._check_deployment_argument('record_worker_refusal', record_worker_refusal.deployment_name);
  if coalesce(btrim(record_worker_refusal.reason), '') = '' then
    raise exception 'record_worker_refusal: a reason is required' using errcode = '22023';
  end if;
  insert into flowlane.worker_refusals as r (queue_name, deployment_name, reason, hint)
  values (record_worker_refusal.queue_name, record_worker_refusal.deployment_name,
          left(record_worker_refusal.reason, 2000), left(record_worker_refusal.hint, 2000))
  on conflict on constraint worker_refusals_pkey do update
    set reason = excluded.reason, hint = excluded.hint, refused_at = flowlane._now()
  returning * into v_row;
  return v_row;
end;
$$;

create or replace function flowlane.heartbeat(worker_id uuid) returns boolean
language sql volatile
set search_path = ''
as $$
  with hb as (
    update flowlane.workers w set last_heartbeat_at = greatest(flowlane._now(), w.last_heartbeat_at)
     where w.worker_id = heartbeat.worker_id
    returning w.deprecated_at is not null as deprecated
  ) select coalesce((select deprecated from hb), false)
$$;

create or replace function flowlane.mark_worker_stopped(worker_id uuid) returns void
language sql volatile
set search_path = ''
as $$
  update flowlane.workers w set stopped_at = greatest(flowlane._now(), w.started_at)
   where w.worker_id = mark_worker_stopped.worker_id and w.stopped_at is null
$$;

create or replace function flowlane.set_deployment_enabled(deployment_name text, enabled boolean, reason text = null)
returns flowlane.worker_deployments
language plpgsql volatile
set search_path = ''
as $$
declare
  v_row flowlane.worker_deployments;
  v_known text;
begin
  if set_deployment_enabled.enabled is null then
    raise exception 'set_deployment_enabled: enabled must be true or false' using errcode = '22023';
  end if;
  select * into v_row from flowlane.worker_deployments d
  where d.deployment_name = set_deployment_enabled.deployment_name for update;
  if not found then
    select string_agg(d.deployment_name, ', ' order by d.deployment_name) into v_known
    from flowlane.worker_deployments d;
    raise exception 'unknown worker deployment %', coalesce(quote_literal(set_deployment_enabled.deployment_name), 'NULL')
      using errcode = 'P0002',
            hint = format('deployments are recorded when their first worker starts; known: %s', coalesce(v_known, '(none)'));
  end if;
  if v_row.enabled = set_deployment_enabled.enabled
     and v_row.reason is not distinct from set_deployment_enabled.reason then
    return v_row;
  end if;
  update flowlane.worker_deployments d
     set enabled = set_deployment_enabled.enabled, reason = set_deployment_enabled.reason, changed_at = flowlane._now()
   where d.deployment_name = v_row.deployment_name
  returning * into v_row;
  return v_row;
end;
$$;

create or replace function flowlane.coverage(queue_name text, supported_pairs jsonb)
returns table (flow_slug text, step_slug text, sources text[])
language plpgsql stable
set search_path = ''
as $$
begin
  perform flowlane._check_queue_argument('coverage', coverage.queue_name);
  return query
  with supported as (
    select * from flowlane._pairs(supported_pairs)
  ), required as (
    select s.flow_slug, s.step_slug, 'active version' as source
    from flowlane.steps s
    where s.queue_name = coverage.queue_name and s.flow_slug in (select flowlane._active_targets())
    union all
    select distinct ss.flow_slug, ss.step_slug, 'started run'
    from flowlane.runs r
    -- (each run's states by its id: a join on run_id would read every task that holds its
    -- step's state, all_step_states' second part being a subquery that takes no join key)
    cross join lateral (select v.flow_slug, v.step_slug from flowlane.all_step_states v
                        where v.run_id = r.run_id and v.status in ('created', 'started') offset 0) ss
    join flowlane.steps s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
    where r.status = 'started' and s.queue_name = coverage.queue_name
    union all
    select distinct t.flow_slug, t.step_slug, 'task on the queue'
    from flowlane.runs r
    join flowlane.step_tasks t on t.run_id = r.run_id
    where r.status = 'started' and t.queue_name = coverage.queue_name and t.status in ('queued', 'started')
  )
  select r.flow_slug, r.step_slug, array_agg(distinct r.source order by r.source)
  from required r
  where not exists (select 1 from supported p where p.flow_slug = r.flow_slug and p.step_slug = r.step_slug)
  group by r.flow_slug, r.step_slug
  order by r.flow_slug, r.step_slug;
end;
$$;

-- record which deployments are enabled, disable them and deprecate their
-- live workers; an unfinished rollout is resumed (its record is kept, so a
-- re-run never enables what was disabled before the first run began)
create or replace function flowlane.begin_rollout(deployments text[]) returns flowlane.rollouts
language plpgsql volatile
set search_path = ''
as $$
declare
  v_row flowlane.rollouts;
  v_wanted text[];
  v_unknown text;
begin
  if deployments is null or array_position(deployments, null) is not null then
    raise exception 'begin_rollout: deployments must be an array of deployment names without nulls'
      using errcode = '22023';
  end if;
  v_wanted := array(select distinct d from unnest(deployments) d order by d);
  perform pg_advisory_xact_lock(hashtext('flowlane.rollout'));
  select * into v_row from flowlane.rollouts r where r.finished_at is null;
  if found and v_row.deployments <> v_wanted then
    raise exception 'rollout % is unfinished (deployments %); finish it before starting another',
      v_row.rollout_id, array_to_string(v_row.deployments, ', ')
      using errcode = '55000',
            hint = format('run the same rollout again: `flowlane rollout --deployments %s`',
                          array_to_string(v_row.deployments, ','));
  end if;
  select d into v_unknown from unnest(v_wanted) d
  where not exists (select 1 from flowlane.worker_deployments w where w.deployment_name = d) limit 1;
  if found then
    raise exception 'begin_rollout: unknown worker deployment "%"', v_unknown using errcode = 'P0002',
      hint = 'list deployments with `flowlane worker list`';
  end if;
  if v_row.rollout_id is null then
    insert into flowlane.rollouts (deployments, previously_enabled)
    select v_wanted, array(select w.deployment_name from flowlane.worker_deployments w
                           where w.deployment_name = any (v_wanted) and w.enabled
                           order by w.deployment_name)
    returning * into v_row;
  end if;
  perform 1 from flowlane.worker_deployments w where w.deployment_name = any (v_wanted)
  order by w.deployment_name for update;
  update flowlane.worker_deployments w
     set enabled = false, reason = format('rollout %s in progress', v_row.rollout_id), changed_at = flowlane._now()
   where w.deployment_name = any (v_wanted) and w.enabled;
  update flowlane.workers w set deprecated_at = flowlane._now()
   where w.deployment_name = any (v_wanted) and w.stopped_at is null and w.deprecated_at is null;
  return v_row;
end;
$$;

create or replace function flowlane.finish_rollout(rollout_id bigint) returns flowlane.rollouts
language plpgsql volatile
set search_path = ''
as $$
declare
  v_row flowlane.rollouts;
begin
  perform pg_advisory_xact_lock(hashtext('flowlane.rollout'));
  select * into v_row from flowlane.rollouts r where r.rollout_id = finish_rollout.rollout_id for update;
  if not found then
    raise exception 'finish_rollout: unknown rollout %', finish_rollout.rollout_id using errcode = 'P0002';
  end if;
  if v_row.finished_at is not null then
    return v_row;
  end if;
  update flowlane.worker_deployments w set enabled = true, reason = null, changed_at = flowlane._now()
   where w.deployment_name = any (v_row.previously_enabled);
  update flowlane.rollouts r set finished_at = flowlane._now() where r.rollout_id = v_row.rollout_id
  returning * into v_row;
  return v_row;
end;
$$;

-- What a process that cannot LISTEN polls instead of flowlane_definitions (through a
-- transaction-mode pooler a LISTEN stays in whichever server session ran it): a text that
-- changes whenever that channel is notified. A row's xmin is the transaction that last
-- wrote it; a deployment counts by its name and enabled flag, as its triggers do.
create or replace function flowlane.definitions_fingerprint() returns text
language sql stable
set search_path = ''
as $$
  select md5(concat_ws('/',
    (select string_agg(f.xmin::text, ',' order by f.xmin::text) from flowlane.flows f),
    (select string_agg(s.xmin::text, ',' order by s.xmin::text) from flowlane.steps s),
    (select string_agg(d.xmin::text, ',' order by d.xmin::text) from flowlane.deps d),
    (select string_agg(a.xmin::text, ',' order by a.xmin::text) from flowlane.aliases a),
    (select string_agg(q.xmin::text, ',' order by q.xmin::text) from flowlane.queues q),
    (select string_agg(w.deployment_name || ':' || w.enabled, ',' order by w.deployment_name)
     from flowlane.worker_deployments w)))
$$;

create or replace function flowlane.get_run_with_states(run_id uuid) returns jsonb
language sql stable
set search_path = ''
as $$
  select jsonb_build_object(
    'run', to_jsonb(r),
    'steps', coalesce((select jsonb_agg(to_jsonb(ss) order by s.step_index)
                       from flowlane.all_step_states ss
                       join flowlane.steps s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
                       where ss.run_id = r.run_id), '[]'::jsonb),
    'tasks', coalesce((select jsonb_agg(to_jsonb(t) order by s.step_index, t.task_index)
                       from flowlane.step_tasks t
                       join flowlane.steps s on s.flow_slug = t.flow_slug and s.step_slug = t.step_slug
                       where t.run_id = r.run_id), '[]'::jsonb))
  from flowlane.runs r
  where r.run_id = get_run_with_states.run_id
$$;

-- finished runs that ended before p_now minus their flow's retention (p_older_than seconds,
-- when given, in place of every flow's retention), oldest first within a flow; p_flows
-- narrows to those flows; p_limit null = all. A handler's run waits for the run it handles.
create or replace function flowlane._prunable_runs(p_now timestamptz, p_flows text[], p_older_than int, p_limit int)
returns table (run_id uuid, flow_slug text, ended_at timestamptz)
language plpgsql stable
set search_path = ''
as $$
begin
  return query
  select r.run_id, r.flow_slug, r.ended_at
  from flowlane.flows f
  cross join lateral (
    select p_now - make_interval(secs => coalesce(p_older_than, f.opt_retention)) as cutoff
  ) c
  cross join lateral (
    -- started_at <= ended time, so the index range on started_at holds every candidate
    select r.run_id, r.flow_slug, coalesce(r.completed_at, r.failed_at, r.cancelled_at) as ended_at
    from flowlane.runs r
    where r.flow_slug = f.flow_slug and r.status <> 'started' and r.started_at < c.cutoff
      and coalesce(r.completed_at, r.failed_at, r.cancelled_at) < c.cutoff
      and not exists (select 1 from flowlane.runs h where h.run_id in (r.failure_of, r.compensation_of))
    order by r.started_at
    limit p_limit
  ) r
  where c.cutoff is not null and (p_flows is null or f.flow_slug = any (p_flows))
  limit p_limit;
end;
$$;

-- what a prune would delete now, per flow (read only)
create or replace function flowlane.prunable_runs(
  p_now timestamptz = flowlane._now(), p_flows text[] = null, p_older_than int = null
) returns table (flow_slug text, runs bigint, oldest_ended_at timestamptz)
language plpgsql stable
set search_path = ''
as $$
begin
  perform flowlane._check_prune_args(p_now, p_older_than, 1);
  return query
    select p.flow_slug, count(*), min(p.ended_at)
    from flowlane._prunable_runs(p_now, p_flows, p_older_than, null) p
    group by p.flow_slug
    order by p.flow_slug;
end;
$$;

-- one batch: at most p_batch prunable runs (a run locked by a retry or a cancel right now is
-- left for a later batch) and everything they own; returns what it deleted
create or replace function flowlane.prune_runs(
  p_now timestamptz = flowlane._now(), p_flows text[] = null, p_older_than int = null, p_batch int = 500
) returns table (runs_deleted int, steps_deleted int, tasks_deleted int, attempts_deleted int,
                 messages_deleted int)
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_runs uuid[];
  v_group record;
  v_states_in_tasks int;
begin
  perform flowlane._check_prune_args(p_now, p_older_than, p_batch);
  v_runs := array(
    select r.run_id from flowlane.runs r
    where r.run_id = any (array(select p.run_id from flowlane._prunable_runs(p_now, p_flows, p_older_than, p_batch) p))
      and r.status <> 'started'
    order by r.run_id
    for update skip locked);
  messages_deleted := 0;
  if cardinality(v_runs) = 0 then  -- most ticks: five empty deletes cost more than the lookup
    runs_deleted := 0; steps_deleted := 0; tasks_deleted := 0; attempts_deleted := 0;
    return next;
    return;
  end if;
  for v_group in
    select t.queue_name, array_agg(t.message_id order by t.message_id) as ids
    from flowlane.step_tasks t
    where t.run_id = any (v_runs)
    group by t.queue_name
    order by t.queue_name
  loop
    messages_deleted := messages_deleted + flowlane._delete_messages(v_group.queue_name, v_group.ids);
  end loop;
  delete from flowlane.task_attempts a where a.run_id = any (v_runs);
  get diagnostics attempts_deleted = row_count;
  -- the steps deleted are the rows of step_states and the states tasks held (all_step_states)
  with gone as (
    delete from flowlane.step_tasks t where t.run_id = any (v_runs) returning t.step_started_at
  ) select count(*), count(g.step_started_at) into tasks_deleted, v_states_in_tasks from gone g;
  delete from flowlane.step_states ss where ss.run_id = any (v_runs);
  get diagnostics steps_deleted = row_count;
  steps_deleted := steps_deleted + v_states_in_tasks;
  delete from flowlane.runs r where r.run_id = any (v_runs);
  get diagnostics runs_deleted = row_count;
  return next;
end;
$$;

-- (p_stale_after is no longer read: it is kept for the previous release's callers; liveness
-- is flowlane.worker_is_live)
create or replace function flowlane.queue_metrics(p_stale_after int = 30)
returns table (queue_name text, depth bigint, oldest_age_seconds int, live_workers bigint,
               disabled_deployments bigint)
language sql stable
set search_path = ''
as $$
  select q.queue_name, m.queue_length, coalesce(m.oldest_msg_age_sec, 0),
         (select count(*) from flowlane.workers w
          where w.queue_name = q.queue_name and flowlane.worker_is_live(w)),
         (select count(*) from flowlane.worker_deployments d
          where d.queue_name = q.queue_name and not d.enabled)
  from flowlane.queues q
  cross join lateral pgmq.metrics(q.pgmq_queue_name) m
  order by q.queue_name
$$;

-- every PGMQ queue's counts, registered in flowlane or not (the console lists both): the roles
-- that read them get the counts through the owner, not the queues' messages
create or replace function flowlane.pgmq_metrics() returns setof pgmq.metrics_result
language sql stable
set search_path = ''
as $$
  select * from pgmq.metrics_all()
$$;

-- a start of a debounced flow (null row for a flow without debounce): under its key's lock,
-- it joins the key's pending run (created waiting, not yet begun by the maintenance tick),
-- which takes this input (and its concurrency key) and starts a period from now, or at its
-- first start plus the maximum wait if that is sooner; else a new pending run is created. A
-- joined start reports the run as found (flowlane.found_run: `existed` to the client).
create or replace function flowlane._debounced_start(p_flow text, p_input jsonb, p_priority int) returns flowlane.runs
language plpgsql volatile
set search_path = ''
as $$
declare
  v_flow flowlane.flows;
  v_key text;
  v_run flowlane.runs;
begin
  select * into v_flow from flowlane.flows f where f.flow_slug = p_flow;
  if v_flow.opt_debounce_period is null then
    return null;
  end if;
  v_key := flowlane._concurrency_key(v_flow.opt_debounce_key, p_input);
  perform pg_advisory_xact_lock(hashtext('flowlane.debounce:' || p_flow), hashtext(v_key));
  -- (a row the tick is beginning is waited for and then no longer pending: a new run follows)
  select * into v_run from flowlane.runs r
  where r.flow_slug = p_flow and r.debounce_key = v_key and r.status = 'waiting' and r.hold_seq is null
  for update;
  if not found then
    select * into v_run from flowlane._create_runs(p_flow, array[p_input], array[null::uuid],
                                                   flowlane._now() + make_interval(secs => v_flow.opt_debounce_period),
                                                   null, null, p_priority);
    update flowlane.runs r set debounce_key = v_key, debounce_since = flowlane._now() where r.run_id = v_run.run_id
    returning * into v_run;
    return v_run;
  end if;
  perform flowlane._check_json_limits(p_input, format('start_flow(%s): the run input', p_flow),
    'flatten the input; workers refuse JSON nested deeper than the limit');
  perform flowlane._check_contract_inputs(p_flow, array[p_input]);
  update flowlane.runs r
     set input = p_input,
         concurrency_key = case when v_flow.opt_concurrency_limit is not null
                                then flowlane._concurrency_key(v_flow.opt_concurrency_key, p_input) end,
         priority = coalesce(p_priority, v_flow.opt_priority, 0),
         start_at = least(flowlane._now() + make_interval(secs => v_flow.opt_debounce_period),
                          r.debounce_since + make_interval(secs => v_flow.opt_debounce_max_wait))
   where r.run_id = v_run.run_id
  returning * into v_run;
  if jsonb_typeof(p_input) = 'array' then  -- a root map maps the input its run begins with
    update flowlane.step_states ss
       set initial_tasks = jsonb_array_length(p_input)
      from flowlane.steps s
     where ss.run_id = v_run.run_id and s.flow_slug = p_flow and s.step_slug = ss.step_slug
       and s.step_type = 'map' and s.deps_count = 0;
  end if;
  perform flowlane._found_run(v_run.run_id);
  return v_run;
end;
$$;

-- delayed runs whose time has come begin; returns how many. A run of a flow with a
-- concurrency limit is held for its key instead (in the order the runs became due), and
-- begins now if its key has room
create or replace function flowlane._begin_due_runs(p_now timestamptz) returns int
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_ids uuid[];
  v_held uuid[];
begin
  with due as (
    select r.run_id, r.start_at from flowlane.runs r
    where r.status = 'waiting' and r.start_at <= p_now and r.hold_seq is null
    order by r.start_at, r.run_id
    for update skip locked
  ), numbered as (  -- (the sequence is read after the sort: held in the order they became due)
    select d.run_id, nextval('flowlane.hold_seq') as seq from due d order by d.start_at, d.run_id
  ), begun as (
    update flowlane.runs r
       set status = case when r.concurrency_key is null then 'started' else 'waiting' end,
           hold_seq = case when r.concurrency_key is null then null else n.seq end,
           started_at = flowlane._now(),
           deadline_at = case when r.concurrency_key is null then flowlane._run_deadline(r.flow_slug, flowlane._now()) end
      from numbered n where r.run_id = n.run_id
    returning r.run_id, r.status
  ) select coalesce(array_agg(b.run_id order by b.run_id) filter (where b.status = 'started'), '{}'),
           coalesce(array_agg(b.run_id order by b.run_id) filter (where b.status = 'waiting'), '{}')
      into v_ids, v_held from begun b;
  if cardinality(v_ids) > 0 then
    perform flowlane._progress_runs(v_ids);
  end if;
  if cardinality(v_held) > 0 then
    perform flowlane._begin_new_held_runs(v_held);
  end if;
  return cardinality(v_ids) + cardinality(v_held);
end;
$$;

-- what compiled schedule files call: create or change a schedule (an operator's pause stays).
-- A change of its timing starts it afresh from now; its firing history stays.
create or replace function flowlane.set_schedule(
  schedule_name text,
  flow_name text,
  input jsonb = '{}',
  cron text = null,
  cron_minutes int[] = null,
  cron_hours int[] = null,
  cron_days int[] = null,
  cron_months int[] = null,
  cron_weekdays int[] = null,
  every_seconds int = null,
  timezone text = 'UTC',
  overlap text = 'skip',
  catch_up text = 'latest'
) returns flowlane.schedules
language plpgsql volatile
set search_path = ''
as $$
declare
  v_new flowlane.schedules;
  v_old flowlane.schedules;
  v_what text := format('schedule "%s"', set_schedule.schedule_name);
begin
  perform flowlane._check_slug('schedule', set_schedule.schedule_name);
  perform flowlane._check_start_input(flowlane.resolve_flow(set_schedule.flow_name), set_schedule.input, v_what);
  if (set_schedule.cron is null) = (set_schedule.every_seconds is null) then
    raise exception '%: give exactly one of cron and every_seconds', v_what using errcode = '22023';
  end if;
  if set_schedule.every_seconds < 1 then
    raise exception '%: every_seconds must be at least 1, not %', v_what, set_schedule.every_seconds
      using errcode = '22023';
  end if;
  if set_schedule.cron is not null then
    perform flowlane._check_cron_field(v_what, 'minute', cron_minutes, 0, 59, false);
    perform flowlane._check_cron_field(v_what, 'hour', cron_hours, 0, 23, false);
    perform flowlane._check_cron_field(v_what, 'day of month', cron_days, 1, 31, true);
    perform flowlane._check_cron_field(v_what, 'month', cron_months, 1, 12, false);
    perform flowlane._check_cron_field(v_what, 'day of week', cron_weekdays, 0, 6, true);
  end if;
  if not exists (select 1 from pg_catalog.pg_timezone_names z where z.name = set_schedule.timezone) then
    raise exception '%: unknown time zone %', v_what, coalesce(quote_literal(set_schedule.timezone), 'NULL')
      using errcode = '22023', hint = 'use an IANA name such as Europe/Berlin or UTC';
  end if;
  if overlap is null or overlap not in ('skip', 'allow') then
    raise exception '%: overlap must be skip or allow, not %', v_what, coalesce(quote_literal(overlap), 'NULL')
      using errcode = '22023';
  end if;
  if catch_up is null or catch_up not in ('latest', 'none', 'all') then
    raise exception '%: catch_up must be latest, none or all, not %', v_what,
      coalesce(quote_literal(catch_up), 'NULL') using errcode = '22023';
  end if;
  select * into v_old from flowlane.schedules s where s.schedule_name = set_schedule.schedule_name for update;
  v_new := row(set_schedule.schedule_name, set_schedule.flow_name, set_schedule.cron,
               cron_minutes, cron_hours, cron_days, cron_months, cron_weekdays, set_schedule.every_seconds,
               set_schedule.timezone, set_schedule.input, set_schedule.overlap, set_schedule.catch_up,
               null, v_old.last_slot, v_old.last_run_id, coalesce(v_old.created_at, flowlane._now()), flowlane._now());
  if v_old.schedule_name is not null and (v_old.cron, v_old.cron_minutes, v_old.cron_hours, v_old.cron_days,
       v_old.cron_months, v_old.cron_weekdays, v_old.every_seconds, v_old.timezone)
     is not distinct from (v_new.cron, v_new.cron_minutes, v_new.cron_hours, v_new.cron_days,
       v_new.cron_months, v_new.cron_weekdays, v_new.every_seconds, v_new.timezone) then
    v_new.next_slot := v_old.next_slot;
    if (v_new.flow_name, v_new.input, v_new.overlap, v_new.catch_up)
       is not distinct from (v_old.flow_name, v_old.input, v_old.overlap, v_old.catch_up) then
      return v_old;  -- unchanged: applying the same file again writes nothing
    end if;
  else
    v_new.next_slot := flowlane._schedule_slot(v_new, flowlane._now(), true);
  end if;
  if v_new.next_slot is null then
    raise exception '%: the cron expression % never fires', v_what, quote_literal(set_schedule.cron)
      using errcode = '22023', hint = 'a day of month the chosen months never have (31 in February) never comes';
  end if;
  insert into flowlane.schedules as s values (v_new.*)
  on conflict on constraint schedules_pkey do update
    set flow_name = excluded.flow_name, cron = excluded.cron, cron_minutes = excluded.cron_minutes,
        cron_hours = excluded.cron_hours, cron_days = excluded.cron_days, cron_months = excluded.cron_months,
        cron_weekdays = excluded.cron_weekdays, every_seconds = excluded.every_seconds,
        timezone = excluded.timezone, input = excluded.input, overlap = excluded.overlap,
        catch_up = excluded.catch_up, next_slot = excluded.next_slot, updated_at = excluded.updated_at
  returning * into v_new;
  return v_new;
end;
$$;

-- an operator's pause or resume (recorded apart from the definition). A resumed schedule
-- starts afresh: the slots it missed while paused are not caught up.
create or replace function flowlane.set_schedule_paused(schedule_name text, paused boolean, reason text = null)
returns flowlane.schedules
language plpgsql volatile
set search_path = ''
as $$
declare
  v_schedule flowlane.schedules;
begin
  v_schedule := flowlane._locked_schedule(set_schedule_paused.schedule_name);
  insert into flowlane.schedule_overrides as o (schedule_name, paused, reason, changed_at)
  values (v_schedule.schedule_name, coalesce(set_schedule_paused.paused, true), left(reason, 1000), flowlane._now())
  on conflict on constraint schedule_overrides_pkey do update
    set paused = excluded.paused, reason = excluded.reason, changed_at = excluded.changed_at;
  if not coalesce(set_schedule_paused.paused, true) then
    update flowlane.schedules s set next_slot = flowlane._schedule_slot(s, flowlane._now(), true)
     where s.schedule_name = v_schedule.schedule_name and s.next_slot <= flowlane._now()
    returning * into v_schedule;
  end if;
  return v_schedule;
end;
$$;

-- what every worker, `serve` and console process calls on its maintenance tick: each concern
-- is one function, safe with any number of callers at once. p_now: the time the tick acts
-- for (tests pass a later time instead of waiting).
create or replace function flowlane.maintenance_tick(p_now timestamptz = flowlane._now()) returns jsonb
language plpgsql volatile
set search_path = ''
as $$
declare
  v_fired int := flowlane._fire_schedules(p_now);
  v_begun int := flowlane._begin_due_runs(p_now);
  v_failed int := flowlane._fail_overdue_runs(p_now);
  v_expired int := flowlane.expire_waits(p_now);
  v_released int := flowlane._release_held(p_now);
  v_pruned int := (select p.runs_deleted from flowlane.prune_runs(p_now) p);
  v_cache_pruned int := flowlane._prune_cache(p_now);  -- expired step cache entries (23_cache.sql)
begin
  return jsonb_build_object('fired', v_fired, 'begun', v_begun, 'failed', v_failed,
                            'waits_expired', v_expired, 'released', v_released, 'pruned', v_pruned,
                            'cache_pruned', v_cache_pruned);
end;
$$;

-- the first problem of a schema as a contract (null when it is one): "<schema path>: what"
create or replace function flowlane._contract_problem(p_schema jsonb, p_at text = '') returns text
language plpgsql immutable
set search_path = ''
as $$
declare
  v_key text;
  v_value jsonb;
  v_found text;
begin
  if jsonb_typeof(p_schema) = 'boolean' then
    return null;
  end if;
  if jsonb_typeof(p_schema) is distinct from 'object' then
    return format('%s: a schema is a JSON object or a boolean, got %s', coalesce(nullif(p_at, ''), '/'),
                  coalesce(jsonb_typeof(p_schema), 'null'));
  end if;
  for v_key, v_value in select e.key, e.value from jsonb_each(p_schema) e order by e.key loop
    v_found := case
      when not v_key = any (flowlane.contract_keywords()) then
        format('keyword %s is outside the supported subset', v_key)
      when v_key = 'type' and not (
             (jsonb_typeof(v_value) = 'string' and v_value #>> '{}' in ('null', 'boolean', 'object', 'array', 'number', 'integer', 'string'))
             or (jsonb_typeof(v_value) = 'array' and jsonb_array_length(v_value) > 0 and not exists (
                   select 1 from jsonb_array_elements(v_value) t
                   where jsonb_typeof(t) <> 'string'
                      or t #>> '{}' not in ('null', 'boolean', 'object', 'array', 'number', 'integer', 'string')))) then
        'type must be a type name or a non-empty array of them'
      when v_key in ('properties') and jsonb_typeof(v_value) <> 'object' then
        'properties must be an object of schemas'
      when v_key = 'required' and (jsonb_typeof(v_value) <> 'array'
             or exists (select 1 from jsonb_array_elements(v_value) t where jsonb_typeof(t) <> 'string')) then
        'required must be an array of property names'
      when v_key in ('enum') and jsonb_typeof(v_value) <> 'array' then
        'enum must be an array'
      when v_key in ('minimum', 'maximum', 'exclusiveMinimum', 'exclusiveMaximum') and jsonb_typeof(v_value) <> 'number' then
        format('%s must be a number', v_key)
      when v_key in ('minLength', 'maxLength', 'minItems', 'maxItems') and not (
             jsonb_typeof(v_value) = 'number' and (v_value #>> '{}')::numeric >= 0
             and (v_value #>> '{}')::numeric = floor((v_value #>> '{}')::numeric)
             and (v_value #>> '{}')::numeric <= 2147483647) then
        format('%s must be a whole number from 0, got %s', v_key, v_value)
      when v_key = 'pattern' and jsonb_typeof(v_value) <> 'string' then
        'pattern must be a string'
      when v_key = 'pattern' and not flowlane._is_valid_regex(v_value #>> '{}') then
        'pattern is not a regular expression PostgreSQL can evaluate'
      else null end;
    if v_found is not null then
      return format('%s/%s: %s', p_at, flowlane._pointer_token(v_key), v_found);
    end if;
    if v_key in ('items', 'additionalProperties') then
      v_found := flowlane._contract_problem(v_value, p_at || '/' || v_key);
    elsif v_key = 'properties' then
      select flowlane._contract_problem(e.value, p_at || '/properties/' || flowlane._pointer_token(e.key)) into v_found
      from jsonb_each(v_value) e
      where flowlane._contract_problem(e.value, p_at || '/properties/' || flowlane._pointer_token(e.key)) is not null
      order by e.key limit 1;
    end if;
    if v_found is not null then
      return v_found;
    end if;
  end loop;
  return null;
end;
$$;

-- a count (minLength, maxLength, minItems, maxItems) as a number: JSON Schema reads 2.0 as the
-- count 2, so a whole number written with a fraction compares, compiles and is shown as 2
create or replace function flowlane._contract_count(p_count jsonb) returns numeric
language sql immutable
set search_path = ''
as $$ select trim_scale((p_count #>> '{}')::numeric) $$;

-- the schema as a SQL boolean expression over the jsonb value ``p_x`` (an expression): true
-- only for a valid value (null is read as false: every negated part is coalesced). One
-- ``case jsonb_typeof(...)`` per schema; literals quoted with format's %L; numbers pass through
-- a numeric cast first, counts through _contract_count.
create or replace function flowlane._contract_sql(p_schema jsonb, p_x text, p_depth int = 0) returns text
language plpgsql immutable
set search_path = ''
as $$
declare
  v_types text[];
  v_branches text[] := '{}';
  v_type text;
  v_checks text[];
  v_key text;
  v_value jsonb;
  v_e text := 'e' || p_depth;
  v_known text[] := array(select jsonb_object_keys(coalesce(p_schema -> 'properties', '{}')) order by 1);
  v_required text[] := array(select jsonb_array_elements_text(coalesce(p_schema -> 'required', '[]')));
  v_out text;
begin
  if p_schema = 'true'::jsonb or p_schema = '{}'::jsonb then
    return 'true';
  elsif p_schema = 'false'::jsonb then
    return 'false';
  end if;
  v_types := case when jsonb_typeof(p_schema -> 'type') = 'array' then array(select jsonb_array_elements_text(p_schema -> 'type'))
                  when p_schema ? 'type' then array[p_schema ->> 'type'] end;
  foreach v_type in array array['object', 'array', 'string', 'number', 'boolean', 'null'] loop
    if v_types is not null and not v_type = any (v_types) and not (v_type = 'number' and 'integer' = any (v_types)) then
      v_branches := v_branches || format('when %L then false', v_type);
      continue;
    end if;
    v_checks := '{}';
    if v_type = 'number' then
      if v_types is not null and not 'number' = any (v_types) then
        -- jsonb prints numbers without exponent: no '.' is an integer (1.0 is one too)
        v_checks := v_checks || format('(strpos((%1$s)::text, ''.'') = 0 or (%1$s)::numeric = trunc((%1$s)::numeric))', p_x);
      end if;
      v_checks := v_checks || array_remove(array[
        case when p_schema ? 'minimum' then format('(%s)::numeric >= %s', p_x, (p_schema ->> 'minimum')::numeric) end,
        case when p_schema ? 'maximum' then format('(%s)::numeric <= %s', p_x, (p_schema ->> 'maximum')::numeric) end,
        case when p_schema ? 'exclusiveMinimum' then format('(%s)::numeric > %s', p_x, (p_schema ->> 'exclusiveMinimum')::numeric) end,
        case when p_schema ? 'exclusiveMaximum' then format('(%s)::numeric < %s', p_x, (p_schema ->> 'exclusiveMaximum')::numeric) end], null);
    elsif v_type = 'string' then
      v_checks := array_remove(array[
        case when p_schema ? 'minLength' then format('length(%s #>> ''{}'') >= %s', p_x, flowlane._contract_count(p_schema -> 'minLength')) end,
        case when p_schema ? 'maxLength' then format('length(%s #>> ''{}'') <= %s', p_x, flowlane._contract_count(p_schema -> 'maxLength')) end,
        case when p_schema ? 'pattern' then format('(%s #>> ''{}'') ~ %L', p_x, p_schema ->> 'pattern') end], null);
    elsif v_type = 'array' then
      v_checks := array_remove(array[
        case when p_schema ? 'minItems' then format('jsonb_array_length(%s) >= %s', p_x, flowlane._contract_count(p_schema -> 'minItems')) end,
        case when p_schema ? 'maxItems' then format('jsonb_array_length(%s) <= %s', p_x, flowlane._contract_count(p_schema -> 'maxItems')) end,
        case when p_schema ? 'items' and p_schema -> 'items' not in ('true', '{}') then
          format('not exists (select from jsonb_array_elements(%s) %s where not coalesce(%s, false))', p_x, v_e,
                 flowlane._contract_sql(p_schema -> 'items', v_e || '.value', p_depth + 1)) end], null);
    elsif v_type = 'object' then
      if cardinality(v_required) > 0 then
        v_checks := v_checks || format('%s ?& %L::text[]', p_x, v_required);
      end if;
      for v_key, v_value in select e.key, e.value from jsonb_each(p_schema -> 'properties') e order by e.key loop
        continue when v_value in ('true', '{}');
        v_out := flowlane._contract_sql(v_value, format('(%s -> %L)', p_x, v_key), p_depth + 1);
        v_checks := v_checks || case when v_key = any (v_required) then format('coalesce(%s, false)', v_out)
                                     else format('(not %s ? %L or coalesce(%s, false))', p_x, v_key, v_out) end;
      end loop;
      if p_schema -> 'additionalProperties' = 'false'::jsonb then
        v_checks := v_checks || format('(%s - %L::text[]) = ''{}''::jsonb', p_x, v_known);
      elsif p_schema ? 'additionalProperties' and p_schema -> 'additionalProperties' not in ('true', '{}') then
        v_checks := v_checks || format('not exists (select from jsonb_each(%s) %s where not %s.key = any (%L::text[]) and not coalesce(%s, false))',
          p_x, v_e, v_e, v_known, flowlane._contract_sql(p_schema -> 'additionalProperties', v_e || '.value', p_depth + 1));
      end if;
    end if;
    v_branches := v_branches || format('when %L then %s', v_type,
                                       case when cardinality(v_checks) = 0 then 'true' else array_to_string(v_checks, ' and ') end);
  end loop;
  v_out := format('case jsonb_typeof(%s) %s end', p_x, array_to_string(v_branches, ' '));
  if v_out = format('case jsonb_typeof(%s) when ''object'' then true when ''array'' then true when ''string'' then true when ''number'' then true when ''boolean'' then true when ''null'' then true end', p_x) then
    v_out := 'true';
  end if;
  if p_schema ? 'enum' then
    v_out := v_out || format(' and %s = any (%L::jsonb[])', p_x, array(select e from jsonb_array_elements(p_schema -> 'enum') e));
  end if;
  if p_schema ? 'const' then
    v_out := v_out || format(' and %s = %L::jsonb', p_x, p_schema -> 'const');
  end if;
  return '(' || v_out || ')';
end;
$$;

create or replace function flowlane._contract_violation(p_schema jsonb, p_value jsonb, p_at text, p_schema_at text)
returns jsonb
language plpgsql immutable
set search_path = ''
as $$
declare
  v_type text := jsonb_typeof(p_value);
  v_number numeric;
  v_length bigint;
  v_key text;
  v_sub jsonb;
  v_i int;
  v_found jsonb;
  v_shown text := flowlane._contract_shown(p_value);
begin
  if p_schema = 'false'::jsonb then
    return flowlane._contract_failure(p_at, p_schema_at, '', format('%s is not allowed here', v_shown));
  elsif jsonb_typeof(p_schema) <> 'object' then
    return null;
  end if;
  if p_schema ? 'type' and not exists (
       select 1 from jsonb_array_elements_text(case when jsonb_typeof(p_schema -> 'type') = 'array' then p_schema -> 'type'
                                                    else jsonb_build_array(p_schema -> 'type') end) t
       where flowlane._contract_has_type(p_value, t)) then
    return flowlane._contract_failure(p_at, p_schema_at, 'type', format('%s is not of type %s', v_shown,
      (select string_agg(t, ' or ') from jsonb_array_elements_text(case when jsonb_typeof(p_schema -> 'type') = 'array'
        then p_schema -> 'type' else jsonb_build_array(p_schema -> 'type') end) t)));
  end if;
  if p_schema ? 'enum' and not exists (select 1 from jsonb_array_elements(p_schema -> 'enum') e where e = p_value) then
    return flowlane._contract_failure(p_at, p_schema_at, 'enum', format('%s is not one of %s', v_shown, p_schema -> 'enum'));
  end if;
  if p_schema ? 'const' and (p_schema -> 'const') <> p_value then
    return flowlane._contract_failure(p_at, p_schema_at, 'const', format('%s is not %s', v_shown, p_schema -> 'const'));
  end if;
  if v_type = 'number' then
    v_number := (p_value #>> '{}')::numeric;
    if v_number < (p_schema ->> 'minimum')::numeric then
      return flowlane._contract_failure(p_at, p_schema_at, 'minimum', format('%s is less than the minimum %s', v_shown, p_schema -> 'minimum'));
    elsif v_number > (p_schema ->> 'maximum')::numeric then
      return flowlane._contract_failure(p_at, p_schema_at, 'maximum', format('%s is greater than the maximum %s', v_shown, p_schema -> 'maximum'));
    elsif v_number <= (p_schema ->> 'exclusiveMinimum')::numeric then
      return flowlane._contract_failure(p_at, p_schema_at, 'exclusiveMinimum', format('%s is not greater than %s', v_shown, p_schema -> 'exclusiveMinimum'));
    elsif v_number >= (p_schema ->> 'exclusiveMaximum')::numeric then
      return flowlane._contract_failure(p_at, p_schema_at, 'exclusiveMaximum', format('%s is not less than %s', v_shown, p_schema -> 'exclusiveMaximum'));
    end if;
  elsif v_type = 'string' then
    v_length := length(p_value #>> '{}');
    if v_length < flowlane._contract_count(p_schema -> 'minLength') then
      return flowlane._contract_failure(p_at, p_schema_at, 'minLength', format('%s is shorter than %s characters', v_shown, flowlane._contract_count(p_schema -> 'minLength')));
    elsif v_length > flowlane._contract_count(p_schema -> 'maxLength') then
      return flowlane._contract_failure(p_at, p_schema_at, 'maxLength', format('%s is longer than %s characters', v_shown, flowlane._contract_count(p_schema -> 'maxLength')));
    elsif p_schema ? 'pattern' and not (p_value #>> '{}') ~ (p_schema ->> 'pattern') then
      return flowlane._contract_failure(p_at, p_schema_at, 'pattern', format('%s does not match the pattern %s', v_shown, p_schema -> 'pattern'));
    end if;
  elsif v_type = 'array' then
    if jsonb_array_length(p_value) < flowlane._contract_count(p_schema -> 'minItems') then
      return flowlane._contract_failure(p_at, p_schema_at, 'minItems', format('has fewer than %s items', flowlane._contract_count(p_schema -> 'minItems')));
    elsif jsonb_array_length(p_value) > flowlane._contract_count(p_schema -> 'maxItems') then
      return flowlane._contract_failure(p_at, p_schema_at, 'maxItems', format('has more than %s items', flowlane._contract_count(p_schema -> 'maxItems')));
    end if;
    if p_schema ? 'items' then
      for v_i in 0 .. jsonb_array_length(p_value) - 1 loop
        v_found := flowlane._contract_violation(p_schema -> 'items', p_value -> v_i, p_at || '/' || v_i, p_schema_at || '/items');
        if v_found is not null then
          return v_found;
        end if;
      end loop;
    end if;
  elsif v_type = 'object' then
    select k into v_key from jsonb_array_elements_text(p_schema -> 'required') with ordinality r(k, o)
    where not p_value ? k order by o limit 1;
    if found then
      return flowlane._contract_failure(p_at, p_schema_at, 'required', format('required property %s is missing', to_jsonb(v_key)));
    end if;
    for v_key, v_sub in select e.key, e.value from jsonb_each(p_schema -> 'properties') e
                        where p_value ? e.key order by e.key loop
      v_found := flowlane._contract_violation(v_sub, p_value -> v_key, p_at || '/' || flowlane._pointer_token(v_key),
                                              p_schema_at || '/properties/' || flowlane._pointer_token(v_key));
      if v_found is not null then
        return v_found;
      end if;
    end loop;
    if p_schema ? 'additionalProperties' then
      for v_key in select k from jsonb_object_keys(p_value) k
                   where not coalesce(p_schema -> 'properties', '{}') ? k order by k loop
        if p_schema -> 'additionalProperties' = 'false'::jsonb then
          return flowlane._contract_failure(p_at, p_schema_at, 'additionalProperties',
            format('property %s is not allowed (additionalProperties is false)', to_jsonb(v_key)));
        end if;
        v_found := flowlane._contract_violation(p_schema -> 'additionalProperties', p_value -> v_key,
          p_at || '/' || flowlane._pointer_token(v_key), p_schema_at || '/additionalProperties');
        if v_found is not null then
          return v_found;
        end if;
      end loop;
    end if;
  end if;
  return null;
end;
$$;

-- refuse run inputs of p_flow that its input_schema rejects, before any run exists
create or replace function flowlane._check_contract_inputs(p_flow text, p_inputs jsonb[]) returns void
language plpgsql stable
set search_path = ''
as $$
declare
  v_contract flowlane.contracts;
  v_i int;
  v_found jsonb;
begin
  select * into v_contract from flowlane.contracts c
  where c.flow_slug = p_flow and coalesce(c.step_slug, '') = '';
  if not found then
    return;
  end if;
  foreach v_i in array flowlane._refused_inputs(v_contract, p_inputs) loop
    v_found := flowlane.contract_violation(v_contract.schema, p_inputs[v_i]);
    if v_found is not null then
      raise exception 'flow "%": the run input% does not match the flow''s input_schema: %: %', p_flow,
        case when cardinality(p_inputs) > 1 then format(' %s', v_i - 1) else '' end,
        coalesce(nullif(v_found ->> 'path', ''), '/'), v_found ->> 'message'
        using errcode = '22023',
              detail = format('the rule at input_schema%s of %s', v_found ->> 'schema_path',
                              flowlane._contract_shown(v_contract.schema #> flowlane._pointer_parts(
                                regexp_replace(v_found ->> 'schema_path', '/[^/]*$', '')))),
              hint = 'correct the input, or start a flow version whose input_schema accepts it';
    end if;
  end loop;
end;
$$;

-- the positions (from 1) of the inputs a flow's input contract refuses, by the fast verdict
create or replace function flowlane._refused_inputs(p_contract flowlane.contracts, p_inputs jsonb[]) returns int[]
language plpgsql stable
set search_path = ''
as $$
declare
  v_refused int[];
begin
  -- a few inputs: the check's function, planned once per connection; a batch: the expression
  -- itself, planned once for the batch (a function call per input cost more than that plan)
  execute format('select array(select u.i from unnest($1) with ordinality u(v, i) where not %s order by u.i)',
                 case when cardinality(p_inputs) < 16
                      then format('flowlane.%I(u.v)', flowlane._contract_check_name(p_contract.check_sql))
                      else format('coalesce(%s, false)', p_contract.check_sql) end)
    into v_refused using p_inputs;
  return v_refused;
end;
$$;

-- the wait steps among steps that just started (callers hold their runs' locks): each gets
-- its deadline, and a kept signal completes its step at once
create or replace function flowlane._begin_waits(p_started flowlane.step_states[]) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_done flowlane.step_states[];
begin
  insert into flowlane.wait_deadlines as w (run_id, step_slug, expires_at)
  select st.run_id, st.step_slug, flowlane._now() + make_interval(secs => s.opt_timeout)
  from unnest(p_started) st
  join flowlane.steps s on s.flow_slug = st.flow_slug and s.step_slug = st.step_slug
  where s.step_type = 'wait' and s.opt_timeout is not null
  order by st.run_id, st.step_slug
  on conflict on constraint wait_deadlines_pkey do update set expires_at = excluded.expires_at;
  with kept as (
    update flowlane.signals g set applied_at = greatest(flowlane._now(), g.received_at)
      from unnest(p_started) st
      join flowlane.steps s on s.flow_slug = st.flow_slug and s.step_slug = st.step_slug
     where s.step_type = 'wait' and g.run_id = st.run_id and g.step_slug = st.step_slug
       and g.applied_at is null
    returning g.run_id, g.step_slug, g.payload
  ), done as (
    update flowlane.step_states ss
       set status = 'completed', output = k.payload, remaining_tasks = 0, completed_at = flowlane._now()
      from kept k
     where ss.run_id = k.run_id and ss.step_slug = k.step_slug and ss.status = 'started'
    returning ss
  ) select coalesce(array_agg(d.ss order by (d.ss).run_id, (d.ss).step_slug), '{}') into v_done from done d;
  if cardinality(v_done) > 0 then
    perform flowlane._steps_done(v_done);
  end if;
end;
$$;

create or replace function flowlane.signal(run_id uuid, step_slug text, payload jsonb = '{}')
returns flowlane.signals
language plpgsql volatile
set search_path = ''
as $$
declare
  v_run flowlane.runs;
  v_step flowlane.steps;
  v_state flowlane.step_states;
  v_signal flowlane.signals;
  v_map text;
begin
  if signal.run_id is null or signal.step_slug is null then
    raise exception 'signal: run_id and step_slug must not be null' using errcode = '22004';
  end if;
  if payload is null then
    raise exception 'signal: payload must not be null (use {} for no payload)' using errcode = '22004';
  end if;
  perform flowlane._check_json_limits(payload, 'signal: the payload', 'flatten the payload');
  select * into v_run from flowlane.runs r where r.run_id = signal.run_id for update;
  if not found then
    raise exception 'signal: no run %', signal.run_id using errcode = 'P0002';
  end if;
  select * into v_step from flowlane.steps s where s.flow_slug = v_run.flow_slug and s.step_slug = signal.step_slug;
  if not found then
    raise exception 'signal: flow "%" of run % has no step "%"', v_run.flow_slug, v_run.run_id, signal.step_slug
      using errcode = 'P0002', hint = flowlane._wait_steps_hint(v_run.flow_slug);
  end if;
  if v_step.step_type <> 'wait' then
    raise exception 'signal: step "%" of flow "%" is not a wait step: it completes when its handler returns',
      v_step.step_slug, v_run.flow_slug
      using errcode = '42809', hint = flowlane._wait_steps_hint(v_run.flow_slug);
  end if;
  if v_run.status <> 'started' then
    raise exception 'signal: run % is %: a finished run takes no signal', v_run.run_id, v_run.status
      using errcode = '55000';
  end if;
  select d.step_slug into v_map from flowlane.deps d
  join flowlane.steps m on m.flow_slug = d.flow_slug and m.step_slug = d.step_slug and m.step_type = 'map'
  where d.flow_slug = v_run.flow_slug and d.dep_slug = v_step.step_slug;
  if found and jsonb_typeof(payload) <> 'array' then
    raise exception 'signal: step "%" feeds map step "%", so its payload must be a JSON array, got %',
      v_step.step_slug, v_map, jsonb_typeof(payload) using errcode = '22023';
  end if;
  perform flowlane._check_signal_contract(v_run.flow_slug, v_step.step_slug, payload);
  select * into v_state from flowlane.step_states ss
  where ss.run_id = v_run.run_id and ss.step_slug = v_step.step_slug for update;
  select * into v_signal from flowlane.signals g where g.run_id = v_run.run_id and g.step_slug = v_step.step_slug;
  if found then
    raise exception 'signal: step "%" of run % already has a signal, received at % (%)', v_step.step_slug,
      v_run.run_id, v_signal.received_at,
      case when v_signal.applied_at is null then 'kept until the step starts' else 'it completed the step' end
      using errcode = '55000', hint = 'a wait step takes one signal; this one changed nothing';
  end if;
  if v_state.status not in ('created', 'started') then
    raise exception 'signal: step "%" of run % is already %: it takes no signal', v_step.step_slug,
      v_run.run_id, v_state.status using errcode = '55000';
  end if;
  insert into flowlane.signals (run_id, step_slug, payload, applied_at)
  values (v_run.run_id, v_step.step_slug, payload, case when v_state.status = 'started' then flowlane._now() end)
  returning * into v_signal;
  if v_state.status = 'started' then
    update flowlane.step_states ss
       set status = 'completed', output = payload, remaining_tasks = 0, completed_at = flowlane._now()
     where ss.run_id = v_run.run_id and ss.step_slug = v_step.step_slug
    returning * into v_state;
    perform flowlane._steps_done(array[v_state]);
  end if;
  return v_signal;
end;
$$;

-- wait steps whose timeout passed by p_now without a signal end as their when_exhausted
-- says: fail (the run fails), skip or skip-cascade (the run goes on). Runs another
-- transaction holds are left for the next call. Returns how many steps it ended.
create or replace function flowlane.expire_waits(p_now timestamptz = flowlane._now()) returns int
language plpgsql volatile
set search_path = ''
as $$
declare
  v_due record;
  v_step flowlane.steps;
  v_ended int := 0;
begin
  for v_due in
    select w.run_id, w.step_slug from flowlane.wait_deadlines w
    where w.expires_at <= p_now
    order by w.expires_at, w.run_id, w.step_slug
    limit 1000
  loop
    perform 1 from flowlane.runs r where r.run_id = v_due.run_id for update skip locked;
    continue when not found;
    perform 1 from flowlane.wait_deadlines w
    where w.run_id = v_due.run_id and w.step_slug = v_due.step_slug and w.expires_at <= p_now;
    continue when not found;  -- a retry gave the step a new deadline meanwhile
    delete from flowlane.wait_deadlines w where w.run_id = v_due.run_id and w.step_slug = v_due.step_slug;
    select s.* into v_step from flowlane.step_states ss
    join flowlane.runs r on r.run_id = ss.run_id and r.status = 'started'
    join flowlane.steps s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
    where ss.run_id = v_due.run_id and ss.step_slug = v_due.step_slug and ss.status = 'started'
    for update of ss;
    continue when not found;  -- signalled, or its run ended
    v_ended := v_ended + 1;
    perform flowlane._give_up_step(v_due.run_id, v_due.step_slug,
      format('no signal within %s s', v_step.opt_timeout), 'wait_timeout');
  end loop;
  return v_ended;
end;
$$;

-- a wait or child-flow step that gave up (its caller holds the run) ends as its
-- when_exhausted says: fail (the step and its run fail with p_error), skip or skip-cascade
-- (skipped with p_reason and p_error; the run goes on)
create or replace function flowlane._give_up_step(p_run_id uuid, p_step_slug text, p_error text, p_reason text)
returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_mode text;
begin
  select s.when_exhausted into v_mode from flowlane.runs r
  join flowlane.steps s on s.flow_slug = r.flow_slug and s.step_slug = p_step_slug
  where r.run_id = p_run_id;
  if v_mode = 'fail' then
    update flowlane.step_states ss
       set status = 'failed', failed_at = flowlane._now(), remaining_tasks = null, error_message = p_error
     where ss.run_id = p_run_id and ss.step_slug = p_step_slug;
    perform flowlane._fail_run(p_run_id, format('step %s: %s', p_step_slug, p_error));
    return;
  end if;
  if v_mode = 'skip-cascade' then
    perform flowlane._skip_cascade(p_run_id, p_step_slug, p_reason);
  else
    perform flowlane._skip_step(p_run_id, p_step_slug, p_reason);
  end if;
  update flowlane.step_states ss set error_message = p_error
   where ss.run_id = p_run_id and ss.step_slug = p_step_slug;
  perform flowlane._progress(p_run_id);
end;
$$;

-- a child run ended: its output completes its element (the step, with the last one), its
-- failure or cancellation is a failed attempt. Nothing when the parent run or step ended, or
-- the element already has a newer child (the child is late).
create or replace function flowlane._child_ended(p_child flowlane.runs) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_parent flowlane.runs;
  v_state flowlane.step_states;
  v_step flowlane.steps;
  v_attempts int;
  v_max int;
  v_map text;
begin
  select * into v_parent from flowlane.runs r where r.run_id = p_child.parent_run_id for update;
  if not found or v_parent.status <> 'started' then
    return;
  end if;
  select * into v_state from flowlane.step_states ss
  where ss.run_id = v_parent.run_id and ss.step_slug = p_child.parent_step_slug for update;
  if v_state.status <> 'started' or exists (
       select 1 from flowlane.runs c
       where c.parent_run_id = v_parent.run_id and c.parent_step_slug = p_child.parent_step_slug
         and c.parent_task_index = p_child.parent_task_index and c.run_id <> p_child.run_id
         and c.status in ('started', 'completed')) then
    return;
  end if;
  select * into v_step from flowlane.steps s
  where s.flow_slug = v_parent.flow_slug and s.step_slug = p_child.parent_step_slug;
  if p_child.status = 'completed' and v_step.step_type <> 'map' then
    -- a run's output is an object of its last steps' outputs, never the array a map needs
    select d.step_slug into v_map from flowlane.deps d
    join flowlane.steps m on m.flow_slug = d.flow_slug and m.step_slug = d.step_slug and m.step_type = 'map'
    where d.flow_slug = v_step.flow_slug and d.dep_slug = v_step.step_slug
    order by d.step_slug limit 1;
    if found then
      perform flowlane._child_step_exhausted(v_parent.run_id, v_step.step_slug,
        format('[TYPE_VIOLATION] step %s feeds map step %s and must output a JSON array; a child run outputs an object',
               v_step.step_slug, v_map));
      return;
    end if;
  end if;
  if p_child.status = 'completed' then
    update flowlane.step_states ss
       set remaining_tasks = ss.remaining_tasks - 1,
           status = case when ss.remaining_tasks = 1 then 'completed' else ss.status end,
           completed_at = case when ss.remaining_tasks = 1 then flowlane._now() end,
           output = case when ss.remaining_tasks <> 1 then null
                         when v_step.step_type <> 'map' then p_child.output
                         else flowlane._children_outputs(v_parent.run_id, v_step.step_slug) end
     where ss.run_id = v_parent.run_id and ss.step_slug = v_step.step_slug
    returning * into v_state;
    if v_state.status = 'completed' then
      perform flowlane._steps_done(array[v_state]);
    end if;
    return;
  end if;
  select count(*) into v_attempts from flowlane.runs c
  where c.parent_run_id = v_parent.run_id and c.parent_step_slug = v_step.step_slug
    and c.parent_task_index = p_child.parent_task_index and c.started_at >= v_state.started_at;
  select o.max_attempts into v_max from flowlane.step_options o
  where o.flow_slug = v_step.flow_slug and o.step_slug = v_step.step_slug;
  if v_attempts < v_max then
    perform flowlane._start_child(v_parent.run_id, v_step.step_slug, p_child.parent_task_index);
    return;
  end if;
  perform flowlane._child_step_exhausted(v_parent.run_id, v_step.step_slug,
    format('child run %s (%s) %s after %s %s: %s', p_child.run_id, p_child.flow_slug, p_child.status,
           v_attempts, case when v_attempts = 1 then 'attempt' else 'attempts' end,
           coalesce(p_child.error_message, p_child.cancel_reason, 'no reason given')));
end;
$$;

-- a run's parent and children for `flowlane run` and the console, its failure handler's run
-- (or the run whose failure it handles, 20_on_failure.sql) and its compensations (or the run
-- and step it compensates, 21_compensation.sql)
create or replace function flowlane.get_run_family(run_id uuid) returns jsonb
language sql stable
set search_path = ''
as $$
  select jsonb_build_object(
    'failure_handler', (select jsonb_build_object('run_id', h.run_id, 'flow_slug', h.flow_slug, 'status', h.status)
                        from flowlane.runs h where h.failure_of = r.run_id),
    'failure_of', (select jsonb_build_object('run_id', f.run_id, 'flow_slug', f.flow_slug, 'status', f.status)
                   from flowlane.runs f where f.run_id = r.failure_of),
    'compensations', flowlane.get_run_compensations(r.run_id),
    'compensation_of', (select jsonb_build_object('run_id', f.run_id, 'flow_slug', f.flow_slug, 'status', f.status,
                                                  'step_slug', c.step_slug)
                        from flowlane.runs f join flowlane.compensations c on c.run_id = f.run_id
                        where f.run_id = r.compensation_of and c.compensation_run_id = r.run_id),
    'parent', (select jsonb_build_object('run_id', p.run_id, 'flow_slug', p.flow_slug, 'status', p.status,
                                         'step_slug', r.parent_step_slug, 'task_index', r.parent_task_index)
               from flowlane.runs p where p.run_id = r.parent_run_id),
    'children', coalesce((select jsonb_agg(jsonb_build_object(
                            'run_id', c.run_id, 'flow_slug', c.flow_slug, 'status', c.status,
                            'step_slug', c.parent_step_slug, 'task_index', c.parent_task_index,
                            'started_at', c.started_at)
                          order by c.parent_step_slug, c.parent_task_index, c.started_at, c.run_id)
                          from flowlane.runs c where c.parent_run_id = r.run_id), '[]'::jsonb))
  from flowlane.runs r
  where r.run_id = get_run_family.run_id
$$;

-- what a full key does with a new run: queue (it waits its turn), replace_waiting (it replaces
-- the key's waiting runs), cancel_running (it cancels the key's oldest started runs)
create or replace function flowlane._check_when_full(p_what text, p_limit int, p_when_full text) returns void
language plpgsql immutable
set search_path = ''
as $$
begin
  if p_when_full is not null and p_when_full not in ('queue', 'replace_waiting', 'cancel_running') then
    raise exception '%: concurrency when_full must be queue, replace_waiting or cancel_running, not %', p_what,
      quote_literal(p_when_full) using errcode = '22023';
  end if;
  if coalesce(p_when_full, 'queue') <> 'queue' and p_limit is null then
    raise exception '%: concurrency when_full % needs a concurrency limit', p_what, p_when_full
      using errcode = '22023';
  end if;
end;
$$;

-- a flow's debounce: a period of at least 1 second, an optional key pointer into the run
-- input and an optional maximum wait of at least the period
create or replace function flowlane._check_debounce(p_what text, p_key text, p_period int, p_max_wait int) returns void
language plpgsql immutable
set search_path = ''
as $$
begin
  if p_period is null and (nullif(p_key, '') is not null or p_max_wait is not null) then
    raise exception '%: a debounce key or maximum wait needs a debounce period', p_what using errcode = '22023';
  end if;
  if p_period < 1 then
    raise exception '%: debounce period must be at least 1 second, not %', p_what, p_period using errcode = '22023';
  end if;
  if p_max_wait < p_period then
    raise exception '%: debounce maximum wait (% s) must be at least the period (% s)', p_what, p_max_wait, p_period
      using errcode = '22023';
  end if;
  if nullif(p_key, '') is not null and p_key !~ '^(/([^~/]|~[01])*)+$' then
    raise exception '%: debounce key % is not a JSON pointer into the run input', p_what, quote_literal(p_key)
      using errcode = '22023', hint = 'a JSON pointer starts with "/" (e.g. /customer_id); "~" is written ~0 and "/" inside a name ~1';
  end if;
end;
$$;

-- the runs of a flow held for their key that may begin now, FIFO per key, begun; returns
-- them. The caller holds nothing of theirs; this takes the keys' locks.
create or replace function flowlane._begin_held_runs(p_flow text, p_keys text[]) returns uuid[]
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_limit int;
  v_ids uuid[];
  v_retried uuid[];
begin
  if coalesce(cardinality(p_keys), 0) = 0 then
    return '{}';
  end if;
  select f.opt_concurrency_limit into v_limit from flowlane.flows f where f.flow_slug = p_flow;
  perform flowlane._lock_slots('run:' || p_flow, p_keys);
  -- (under the locks: every run held for these keys before is committed and seen here)
  if not exists (select 1 from flowlane.runs r
                 where r.flow_slug = p_flow and r.concurrency_key = any (p_keys) and r.status = 'waiting'
                   and r.hold_seq is not null) then
    return '{}';
  end if;
  with free as (
    select k.key, case when v_limit is null then 2147483647 else greatest(0, v_limit - (
             select count(*) from flowlane.runs r
             where r.flow_slug = p_flow and r.concurrency_key = k.key and r.status = 'started')) end as n
    from (select distinct key from unnest(p_keys) key where key is not null) k
  ), chosen as (
    select h.run_id
    from free cross join lateral (
      select r.run_id from flowlane.runs r
      where r.flow_slug = p_flow and r.concurrency_key = free.key and r.status = 'waiting'
        and r.hold_seq is not null
      order by r.hold_seq
      limit free.n
    ) h
    where free.n > 0
  ), locked as (
    select r.run_id from flowlane.runs r
    where r.run_id in (select c.run_id from chosen c) and r.status = 'waiting'
    order by r.run_id
    for update
  ), begun as (
    update flowlane.runs r
       set status = 'started', hold_seq = null, started_at = greatest(flowlane._now(), r.started_at),
           deadline_at = flowlane._run_deadline(r.flow_slug, greatest(flowlane._now(), r.started_at))
      from locked l
     where r.run_id = l.run_id and r.status = 'waiting'
    returning r.run_id, r.retry_count
  ) select coalesce(array_agg(b.run_id order by b.run_id), '{}'),
           coalesce(array_agg(b.run_id order by b.run_id) filter (where b.retry_count > 0), '{}')
      into v_ids, v_retried
    from begun b;
  if cardinality(v_ids) > 0 then
    -- a retried run held for its key sends the tasks retry_run did not
    perform flowlane._send_missing_tasks(x.id) from unnest(v_retried) x (id);
    perform flowlane._progress_runs(v_ids);
  end if;
  return v_ids;
end;
$$;

-- new runs of a limited flow (status waiting, hold_seq set by the caller) that may begin do;
-- called where runs are created or become due
create or replace function flowlane._begin_new_held_runs(p_run_ids uuid[]) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_group record;
begin
  for v_group in
    select r.flow_slug, array_agg(distinct r.concurrency_key) as keys
    from flowlane.runs r
    where r.run_id = any (p_run_ids) and r.status = 'waiting' and r.hold_seq is not null
    group by r.flow_slug order by r.flow_slug
  loop
    if exists (select 1 from flowlane.flows f
               where f.flow_slug = v_group.flow_slug and f.opt_concurrency_when_full <> 'queue') then
      perform flowlane._lock_started_runs(v_group.flow_slug, v_group.keys);
      perform flowlane._lock_slots('run:' || v_group.flow_slug, v_group.keys);
      perform flowlane._apply_when_full(v_group.flow_slug, array(
        select r.run_id from flowlane.runs r where r.run_id = any (p_run_ids) and r.hold_seq is not null
        order by r.hold_seq));
    end if;
    perform flowlane._begin_held_runs(v_group.flow_slug, v_group.keys);
  end loop;
end;
$$;

-- the started runs of a flow's keys, locked (in run id order) before the keys' locks are taken:
-- a run's end locks its row and then its key, so a start that cancels started runs
-- (when_full cancel_running) takes them in the same order
create or replace function flowlane._lock_started_runs(p_flow text, p_keys text[]) returns void
language sql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
  select count(*) from (
    select r.run_id from flowlane.runs r
    where r.flow_slug = p_flow and r.concurrency_key = any (p_keys) and r.status = 'started'
    order by r.run_id
    for update
  ) x
$$;

-- new runs (p_arrivals, oldest first) have joined their keys' lines: a flow whose full key
-- replaces or cancels does so. replace_waiting: of a key's waiting runs only the newest stays;
-- cancel_running: of a key's started and waiting runs only the newest `limit` stay (the end of
-- a started one begins the next waiting one). Newest: the arrivals in their order, then waiting
-- runs by hold_seq, then started runs by start. The caller holds the keys' locks (and, for
-- cancel_running, the started runs' rows: _lock_started_runs).
create or replace function flowlane._apply_when_full(p_flow text, p_arrivals uuid[]) returns void
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_flow flowlane.flows;
  v_victim record;
  v_keys text[];
begin
  select * into v_flow from flowlane.flows f where f.flow_slug = p_flow;
  if v_flow.opt_concurrency_when_full = 'queue' or v_flow.opt_concurrency_limit is null then
    return;
  end if;
  v_keys := array(select distinct x.concurrency_key from flowlane.runs x
                  where x.run_id = any (p_arrivals) and x.concurrency_key is not null);
  for v_victim in
    with line as (
      select r.run_id, r.status, r.concurrency_key,
             row_number() over (
               partition by r.concurrency_key,
                            case when v_flow.opt_concurrency_when_full = 'replace_waiting' then r.status end
               order by a.ord desc nulls last, r.hold_seq desc nulls last, r.started_at desc, r.run_id desc) as newness,
             first_value(r.run_id) over (
               partition by r.concurrency_key
               order by a.ord desc nulls last, r.hold_seq desc nulls last, r.started_at desc, r.run_id desc) as newest
      from (select s.* from flowlane.runs s  -- (two arms: one partial index each)
            where s.flow_slug = p_flow and s.concurrency_key = any (v_keys) and s.status = 'started'
            union all
            select h.* from flowlane.runs h
            where h.flow_slug = p_flow and h.concurrency_key = any (v_keys) and h.status = 'waiting'
              and h.hold_seq is not null) r
      left join unnest(p_arrivals) with ordinality a (run_id, ord) on a.run_id = r.run_id
    )
    select l.run_id, l.newest, l.concurrency_key from line l
    where case v_flow.opt_concurrency_when_full
            when 'replace_waiting' then l.status = 'waiting' and l.newness > 1
            else l.newness > v_flow.opt_concurrency_limit end
    order by l.status = 'started', l.run_id  -- (waiting ones first: the end of a started one begins the next)
  loop
    perform flowlane.cancel_run(v_victim.run_id, format('superseded by run %s (concurrency %s, when_full %s)',
      v_victim.newest, flowlane._key_label(p_flow, v_flow.opt_concurrency_key, v_victim.concurrency_key),
      v_flow.opt_concurrency_when_full));
  end loop;
end;
$$;

-- send tasks (bodies) to one queue and record them; the bodies carry the run's priority.
-- p_in_task: their steps keep their states in their tasks (_state_in_task, 04_runs.sql), with no
-- step_states row: each task is marked, step_started_at its step's start, now
create or replace function flowlane._send_step_tasks(p_queue text, p_bodies jsonb[], p_delay int, p_in_task boolean)
returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_n int;
  v_step_started timestamptz := case when p_in_task then flowlane._now() end;
begin
  if coalesce(cardinality(p_bodies), 0) = 0 then
    return;
  end if;
  if exists (select 1 from unnest(p_bodies) b where b ? 'priority') then
    perform flowlane._prioritize_queue(p_queue);
  end if;
  if cardinality(p_bodies) = 1 then  -- a single start or completion (02_queues.sql: _queue_send)
    insert into flowlane.step_tasks (flow_slug, run_id, step_slug, task_index, queue_name, message_id,
                                     step_started_at)
    values (p_bodies[1] ->> 'flow_slug', (p_bodies[1] ->> 'run_id')::uuid, p_bodies[1] ->> 'step_slug',
            (p_bodies[1] ->> 'task_index')::int, p_queue, flowlane._queue_send(p_queue, p_bodies[1], p_delay),
            v_step_started);
    return;
  end if;
  insert into flowlane.step_tasks (flow_slug, run_id, step_slug, task_index, queue_name, message_id, step_started_at)
  select b.body ->> 'flow_slug', (b.body ->> 'run_id')::uuid, b.body ->> 'step_slug',
         (b.body ->> 'task_index')::int, p_queue, m.id, v_step_started
  from flowlane._queue_send_batch(p_queue, p_bodies, p_delay) with ordinality as m (id, ord)
  join unnest(p_bodies) with ordinality as b (body, ord) on b.ord = m.ord;
  get diagnostics v_n = row_count;
  if v_n <> cardinality(p_bodies) then
    raise exception 'internal error: sent % messages to queue % for % tasks', v_n, p_queue, cardinality(p_bodies);
  end if;
end;
$$;

-- tasks of steps that have their step_states rows (the previous release's signature, which its
-- functions call while a migration commits)
create or replace function flowlane._send_tasks(p_queue text, p_bodies jsonb[], p_delay int) returns void
language plpgsql volatile
set search_path = ''
as $$
begin
  perform flowlane._send_step_tasks(p_queue, p_bodies, p_delay, false);
end;
$$;

-- held tasks of one step whose keys have free slots are sent, FIFO per key; a held task whose
-- run or step no longer runs is dropped
create or replace function flowlane._release_held_tasks(p_flow text, p_step text, p_keys text[]) returns int
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_step flowlane.steps;
  v_bodies jsonb[];
begin
  select * into v_step from flowlane.steps s where s.flow_slug = p_flow and s.step_slug = p_step;
  perform flowlane._lock_slots('step:' || p_flow || '/' || p_step, p_keys);
  delete from flowlane.held_tasks h
   where h.flow_slug = p_flow and h.step_slug = p_step and h.concurrency_key = any (p_keys)
     and not exists (select 1 from flowlane.runs r
                     join flowlane.step_states ss on ss.run_id = r.run_id and ss.step_slug = h.step_slug
                     where r.run_id = h.run_id and r.status = 'started' and ss.status = 'started');
  with free as (
    select k.key, case when v_step.opt_concurrency_limit is null then 2147483647
                       else greatest(0, v_step.opt_concurrency_limit - (
                         select count(*) from flowlane.step_slots s
                         where s.flow_slug = p_flow and s.step_slug = p_step and s.concurrency_key = k.key)) end as n
    from (select distinct key from unnest(p_keys) key where key is not null) k
  ), released as (
    delete from flowlane.held_tasks h
     using (select c.run_id, c.task_index from free
            cross join lateral (select x.run_id, x.task_index from flowlane.held_tasks x
                                where x.flow_slug = p_flow and x.step_slug = p_step and x.concurrency_key = free.key
                                order by x.hold_seq limit free.n) c
            where free.n > 0) c
     where h.run_id = c.run_id and h.step_slug = p_step and h.task_index = c.task_index
    returning h.*
  ), slots as (
    insert into flowlane.step_slots (run_id, step_slug, task_index, flow_slug, concurrency_key)
    select r.run_id, r.step_slug, r.task_index, r.flow_slug, r.concurrency_key from released r
    where v_step.opt_concurrency_limit is not null
    returning 1
  )
  select coalesce(array_agg(jsonb_build_object('flow_slug', x.flow_slug, 'run_id', x.run_id,
                                               'step_slug', x.step_slug, 'task_index', x.task_index)
                            || case when ru.priority <> 0 then jsonb_build_object('priority', ru.priority)
                                    else '{}'::jsonb end
                            order by x.hold_seq), '{}')
    into v_bodies
  from released x join flowlane.runs ru on ru.run_id = x.run_id
  where (select count(*) from slots) >= 0;
  perform flowlane._send_step_tasks(v_step.queue_name, v_bodies, 0, false);
  return cardinality(v_bodies);
end;
$$;

-- the tasks of a run's started steps that have none (retry_run): sent, or held for their slot
create or replace function flowlane._send_missing_tasks(p_run_id uuid) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_group record;
begin
  for v_group in
    select s.queue_name,
           array_agg(jsonb_build_object('flow_slug', r.flow_slug, 'run_id', r.run_id,
                                        'step_slug', ss.step_slug, 'task_index', k)
                     || case when r.priority <> 0 then jsonb_build_object('priority', r.priority) else '{}'::jsonb end
                     order by s.step_index, k) as bodies,
           bool_or(s.opt_concurrency_limit is not null) as limited
    from flowlane.step_states ss
    join flowlane.runs r on r.run_id = ss.run_id
    join flowlane.steps s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
    cross join lateral generate_series(0, ss.initial_tasks - 1) as k
    where ss.run_id = p_run_id and ss.status = 'started' and s.queue_name is not null
      and not exists (select 1 from flowlane.step_tasks t
                      where t.run_id = ss.run_id and t.step_slug = ss.step_slug and t.task_index = k)
      and not exists (select 1 from flowlane.held_tasks h
                      where h.run_id = ss.run_id and h.step_slug = ss.step_slug and h.task_index = k)
    group by s.queue_name
    order by s.queue_name
  loop
    perform flowlane._send_step_tasks(v_group.queue_name,
      case when v_group.limited then flowlane._take_step_slots(v_group.bodies) else v_group.bodies end, 0, false);
  end loop;
end;
$$;

-- say how many tasks may start. Claims on a queue with a concurrency limit take turns (its
-- limits row locked, then its started tasks counted: exact under any number of claimers); a
-- rate limit's tokens are taken up front, in the one statement that locks the row (the
-- claim gives back what it did not start, _close_queue_gate)
create or replace function flowlane._open_queue_gate(p_queue text, p_qty int) returns flowlane._queue_gate
language plpgsql volatile
set search_path = ''
as $$
declare
  v_gate flowlane._queue_gate;
  v_limits flowlane.queue_limits;
  v_started int;
  v_now timestamptz;
begin
  v_gate.queue_name := p_queue;
  v_gate.allowed := p_qty;
  select coalesce(q.prioritized, false), l.queue_name is not null, l.concurrency, l.rate_limit
    into v_gate.prioritized, v_gate.limited, v_limits.concurrency, v_limits.rate_limit
  from flowlane.queues q left join flowlane.queue_limits l on l.queue_name = q.queue_name
  where q.queue_name = p_queue;
  v_gate.prioritized := coalesce(v_gate.prioritized, false);
  v_gate.limited := coalesce(v_gate.limited, false);
  if not v_gate.limited then
    return v_gate;
  end if;
  if v_limits.concurrency is not null then
    select * into v_limits from flowlane.queue_limits l where l.queue_name = p_queue for update;
    select count(*) into v_started from flowlane.step_tasks t where t.queue_name = p_queue and t.status = 'started';
    v_gate.allowed := least(v_gate.allowed, v_limits.concurrency - v_started);
    if v_gate.allowed < 1 then
      v_gate.refusal := row('at_capacity', null, null, p_queue, null, null,
                            jsonb_build_object('started', v_started, 'concurrency', v_limits.concurrency),
                            null, null, null)::flowlane.claim_record;
      return v_gate;
    end if;
  end if;
  if v_limits.rate_limit is not null then
    -- (the clock read before the row's lock: a claim that waited records its starts at the
    -- bucket's time, never earlier than the claim before it)
    v_now := flowlane._clock_timestamp();
    update flowlane.queue_limits l
       set refilled_at = greatest(v_now, l.refilled_at),
           last_grant = greatest(0, least(v_gate.allowed,
                          floor(flowlane._bucket_tokens(l, greatest(v_now, l.refilled_at)))))::int,
           tokens = flowlane._bucket_tokens(l, greatest(v_now, l.refilled_at))
                    - greatest(0, least(v_gate.allowed, floor(flowlane._bucket_tokens(l, greatest(v_now, l.refilled_at)))))
     where l.queue_name = p_queue
    returning * into v_limits;
    v_gate.started_at := v_limits.refilled_at;
    v_gate.reserved := v_limits.last_grant;
    v_gate.allowed := v_limits.last_grant;
    if v_gate.allowed < 1 then
      v_gate.refusal := row('rate_limited', null, null, p_queue, null, null,
                            jsonb_build_object('wait_ms',
                              ceil(1000 * flowlane._next_start_in(v_limits, v_limits.refilled_at))::int),
                            null, null, null)::flowlane.claim_record;
    end if;
  end if;
  return v_gate;
end;
$$;

-- what compiled queue files call: a queue's limits (null: no such limit; both null: none)
-- and whether its ended messages are archived (the default) or deleted
create or replace function flowlane.set_queue_limits(queue_name text, concurrency int, rate_limit int, rate_per int,
                                          archive boolean default true)
returns flowlane.queue_limits
language plpgsql volatile
set search_path = ''
as $$
declare
  v_row flowlane.queue_limits;
  v_what text := format('queue "%s"', set_queue_limits.queue_name);
begin
  perform flowlane._check_queue_argument('set_queue_limits', set_queue_limits.queue_name);
  if not exists (select 1 from flowlane.queues q where q.queue_name = set_queue_limits.queue_name) then
    raise exception '%: no such queue', v_what using errcode = 'P0002',
      hint = 'a queue exists once a flow routes a step to it (apply the flow first)';
  end if;
  if set_queue_limits.concurrency < 1 then
    raise exception '%: concurrency must be at least 1, not %', v_what, set_queue_limits.concurrency
      using errcode = '22023';
  end if;
  if (set_queue_limits.rate_limit is null) <> (set_queue_limits.rate_per is null) then
    raise exception '%: a rate limit needs both a limit and a period (per)', v_what using errcode = '22023';
  end if;
  if set_queue_limits.rate_limit < 1 or set_queue_limits.rate_per < 1 then
    raise exception '%: a rate limit is at least 1 start per at least 1 second', v_what using errcode = '22023';
  end if;
  if set_queue_limits.archive is null then
    raise exception '%: archive is true or false, not null', v_what using errcode = '22023';
  end if;
  update flowlane.queues q set archive_messages = set_queue_limits.archive
   where q.queue_name = set_queue_limits.queue_name and q.archive_messages <> set_queue_limits.archive;
  if set_queue_limits.concurrency is null and set_queue_limits.rate_limit is null then
    delete from flowlane.queue_limits l where l.queue_name = set_queue_limits.queue_name;
    perform flowlane._wake_queue(set_queue_limits.queue_name);
    return null;
  end if;
  insert into flowlane.queue_limits as l (queue_name, concurrency, rate_limit, rate_per, tokens, refilled_at)
  values (set_queue_limits.queue_name, set_queue_limits.concurrency, set_queue_limits.rate_limit,
          set_queue_limits.rate_per, coalesce(set_queue_limits.rate_limit, 0), flowlane._clock_timestamp())
  on conflict on constraint queue_limits_pkey do update
    set concurrency = excluded.concurrency, rate_limit = excluded.rate_limit, rate_per = excluded.rate_per,
        tokens = least(l.tokens, coalesce(excluded.rate_limit, 0)), updated_at = flowlane._now()
    where (l.concurrency, l.rate_limit, l.rate_per)
          is distinct from (excluded.concurrency, excluded.rate_limit, excluded.rate_per)
  returning * into v_row;
  if v_row.queue_name is null then  -- unchanged: applying the same file again writes nothing
    select * into v_row from flowlane.queue_limits l where l.queue_name = set_queue_limits.queue_name;
  else
    perform flowlane._wake_queue(set_queue_limits.queue_name);
  end if;
  return v_row;
end;
$$;

-- what a compiled queue file ends with: the limits of queues it does not declare are removed
-- and their archive is on again (those queues behave as undeclared); returns the names of
-- those that lost limits
create or replace function flowlane.keep_only_queue_limits(queue_names text[]) returns text[]
language plpgsql volatile
set search_path = ''
as $$
declare
  v_deleted text[];
begin
  with gone as (
    delete from flowlane.queue_limits l where l.queue_name <> all (coalesce(queue_names, '{}'))
    returning l.queue_name
  ) select coalesce(array_agg(g.queue_name order by g.queue_name), '{}') into v_deleted from gone g;
  perform flowlane._wake_queue(d) from unnest(v_deleted) d;
  update flowlane.queues q set archive_messages = true
   where not q.archive_messages and q.queue_name <> all (coalesce(queue_names, '{}'));
  return v_deleted;
end;
$$;

-- every queue with limits: its limits, started tasks, bucket, and (when it holds claims back
-- now) what it waits for
create or replace function flowlane.queue_flow_control()
returns table (queue_name text, concurrency int, started bigint, rate_limit int, rate_per int,
               tokens double precision, next_start_in double precision, waiting_for text)
language sql stable
set search_path = ''
as $$
  select l.queue_name, l.concurrency, c.started, l.rate_limit, l.rate_per,
         case when l.rate_limit is not null then flowlane._bucket_tokens(l, flowlane._clock_timestamp()) end,
         case when l.rate_limit is not null then flowlane._next_start_in(l, flowlane._clock_timestamp()) end,
         case when l.concurrency is not null and c.started >= l.concurrency
                then format('queue concurrency %s: %s of %s started', l.queue_name, c.started, l.concurrency)
              when l.rate_limit is not null and flowlane._bucket_tokens(l, flowlane._clock_timestamp()) < 1
                then format('rate limit %s: next start in %s s', l.queue_name,
                            round(flowlane._next_start_in(l, flowlane._clock_timestamp())::numeric, 1))
         end
  from flowlane.queue_limits l
  cross join lateral (select count(*) as started from flowlane.step_tasks t
                      where t.queue_name = l.queue_name and t.status = 'started') c
  order by l.queue_name
$$;

-- what each of the given runs, and each of their tasks, waits for: held runs (flow
-- concurrency, with their place in line), delayed runs, held tasks (step concurrency) and
-- queued tasks on a queue at its concurrency or rate limit. One row per waiting thing;
-- step_slug and task_index are null for the run itself.
create or replace function flowlane.run_holds(run_ids uuid[])
returns table (run_id uuid, step_slug text, task_index int, waiting_for text, place bigint)
language sql stable
set search_path = ''
as $$
  select r.run_id, null::text, null::int,
         format('concurrency %s: %s of %s started',
                flowlane._key_label(r.flow_slug, f.opt_concurrency_key, r.concurrency_key),
                (select count(*) from flowlane.runs s
                 where s.flow_slug = r.flow_slug and s.concurrency_key = r.concurrency_key and s.status = 'started'),
                coalesce(f.opt_concurrency_limit::text, 'unlimited')),
         (select count(*) from flowlane.runs h
          where h.flow_slug = r.flow_slug and h.concurrency_key = r.concurrency_key and h.status = 'waiting'
            and h.hold_seq is not null and h.hold_seq <= r.hold_seq)
  from flowlane.runs r join flowlane.flows f on f.flow_slug = r.flow_slug
  where r.run_id = any (run_ids) and r.status = 'waiting' and r.hold_seq is not null
  union all
  select r.run_id, null, null,
         case when r.debounce_key is null then format('start at %s', r.start_at)
              else format('debounce %s: starts in %s s unless another arrives',
                          flowlane._key_label(r.flow_slug, f.opt_debounce_key, r.debounce_key),
                          greatest(round(extract(epoch from r.start_at - flowlane._now()), 1), 0)) end, null
  from flowlane.runs r join flowlane.flows f on f.flow_slug = r.flow_slug
  where r.run_id = any (run_ids) and r.status = 'waiting' and r.hold_seq is null
  union all
  select h.run_id, h.step_slug, h.task_index,
         format('step concurrency %s: %s of %s started',
                flowlane._key_label(h.step_slug, s.opt_concurrency_key, h.concurrency_key),
                (select count(*) from flowlane.step_slots x
                 where x.flow_slug = h.flow_slug and x.step_slug = h.step_slug and x.concurrency_key = h.concurrency_key),
                coalesce(s.opt_concurrency_limit::text, 'unlimited')),
         (select count(*) from flowlane.held_tasks y
          where y.flow_slug = h.flow_slug and y.step_slug = h.step_slug and y.concurrency_key = h.concurrency_key
            and y.hold_seq <= h.hold_seq)
  from flowlane.held_tasks h join flowlane.steps s on s.flow_slug = h.flow_slug and s.step_slug = h.step_slug
  join flowlane.runs hr on hr.run_id = h.run_id and hr.status = 'started'
  where h.run_id = any (run_ids)
  union all
  select t.run_id, t.step_slug, t.task_index, q.waiting_for, null
  from flowlane.step_tasks t
  join flowlane.queue_flow_control() q on q.queue_name = t.queue_name and q.waiting_for is not null
  where t.run_id = any (run_ids) and t.status = 'queued'
  order by 1, 2 nulls first, 3
$$;

-- the flow a failure handler names: a slug (of a flow or an alias), not the flow itself
create or replace function flowlane._check_on_failure(p_flow text, p_on_failure text) returns void
language plpgsql immutable
set search_path = ''
as $$
begin
  if p_on_failure is null then
    return;
  end if;
  perform flowlane._check_slug('on_failure flow', p_on_failure);
  if lower(p_on_failure) = lower(p_flow) then
    raise exception 'flow "%": on_failure names the flow itself', p_flow
      using errcode = '22023', hint = 'a failure handler is another flow (its own failure starts nothing more)';
  end if;
end;
$$;

-- what a failure handler's run gets as its input
create or replace function flowlane._failure_input(p_run flowlane.runs) returns jsonb
language sql stable
set search_path = ''
as $$
  select jsonb_build_object(
    'run_id', p_run.run_id,
    'flow', p_run.flow_slug,
    'status', p_run.status,
    'error', coalesce(p_run.error_message, p_run.cancel_reason),
    'failed_step', f.step_slug,
    'step_error', f.error_message,
    'outputs', coalesce((select jsonb_object_agg(ss.step_slug, ss.output) from flowlane.all_step_states ss
                         where ss.run_id = p_run.run_id and ss.status = 'completed'), '{}'::jsonb),
    'input', p_run.input)
  from (select null) n
  left join lateral (select ss.step_slug, ss.error_message from flowlane.step_states ss
                     where ss.run_id = p_run.run_id and ss.status = 'failed'
                     order by ss.failed_at, ss.step_slug limit 1) f on true;
$$;

-- a run of the flow's failure handler for a run that has just failed (or been cancelled),
-- once per run: a run retried that fails again does not start a second one. A handler that
-- cannot start (its flow gone, an input its contract refuses) leaves the failure as it is and
-- says so in the run's error message.
create or replace function flowlane._start_failure_handler() returns trigger
language plpgsql volatile
set search_path = ''
as $$
declare
  v_named text;
  v_on_cancel boolean;
  v_flow text;
  v_handler flowlane.runs;
begin
  select f.opt_on_failure, f.opt_on_failure_on_cancel into v_named, v_on_cancel
  from flowlane.flows f where f.flow_slug = new.flow_slug;
  if v_named is null or (new.status = 'cancelled' and not v_on_cancel)
     or exists (select 1 from flowlane.runs r where r.failure_of = new.run_id) then
    return null;
  end if;
  begin
    v_flow := flowlane.resolve_flow(v_named);
    perform flowlane._check_start_input(v_flow, flowlane._failure_input(new),
      format('failure handler %s of run %s', v_flow, new.run_id));
    select * into v_handler from flowlane._create_runs(v_flow, array[flowlane._failure_input(new)],
                                                       array[null::uuid]);
    update flowlane.runs r set failure_of = new.run_id where r.run_id = v_handler.run_id;
  exception when others then
    update flowlane.runs r
       set error_message = left(concat_ws('; ', r.error_message,
                                          format('failure handler %s could not start: %s', v_named, sqlerrm)), 4000)
     where r.run_id = new.run_id;
  end;
  return null;
end;
$$;

-- what a step was handed as a whole: the run input for a root step, the output a map step
-- maps, otherwise {dep: output} of its needs
create or replace function flowlane._step_input(p_run_id uuid, p_step_slug text) returns jsonb
language sql stable
set search_path = ''
as $$
  select case
           when s.deps_count = 0 then r.input
           when s.step_type = 'map' then
             (select ps.output from flowlane.deps d
              join flowlane.all_step_states ps on ps.run_id = r.run_id and ps.step_slug = d.dep_slug
              where d.flow_slug = s.flow_slug and d.step_slug = s.step_slug)
           else flowlane._condition_subject(r.run_id, s.step_slug)
         end
  from flowlane.runs r
  join flowlane.steps s on s.flow_slug = r.flow_slug and s.step_slug = p_step_slug
  where r.run_id = p_run_id;
$$;

-- a failed run's completed steps with a compensation, recorded once (a run retried and failed
-- again is not compensated twice); the first compensations start
create or replace function flowlane._begin_compensation() returns trigger
language plpgsql volatile
set search_path = ''
as $$
begin
  if exists (select 1 from flowlane.compensations c where c.run_id = new.run_id) then
    return null;
  end if;
  insert into flowlane.compensations (run_id, step_slug)
  select ss.run_id, ss.step_slug from flowlane.all_step_states ss
  join flowlane.steps s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
  where ss.run_id = new.run_id and ss.status = 'completed' and s.opt_compensate is not null;
  if found then
    update flowlane.runs r set compensation = 'running' where r.run_id = new.run_id;
    perform flowlane._advance_compensation(new.run_id);
  end if;
  return null;
end;
$$;

-- start every pending compensation of a run whose dependents' compensations have completed;
-- the run's compensation is 'completed' once all of them are. Nothing while it is stopped.
create or replace function flowlane._advance_compensation(p_run_id uuid) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_run flowlane.runs;
  v_step record;
begin
  select * into v_run from flowlane.runs r where r.run_id = p_run_id for update;
  if v_run.compensation is distinct from 'running' then
    return;
  end if;
  for v_step in
    select c.step_slug, s.opt_compensate from flowlane.compensations c
    join flowlane.steps s on s.flow_slug = v_run.flow_slug and s.step_slug = c.step_slug
    where c.run_id = p_run_id and c.status = 'pending'
      and not exists (select 1 from flowlane.compensations o
                      where o.run_id = p_run_id and o.status <> 'completed' and o.step_slug <> c.step_slug
                        and o.step_slug = any (flowlane._dependents(v_run.flow_slug, c.step_slug)))
    order by s.step_index desc
    for update of c
  loop
    perform flowlane._start_compensation(v_run, v_step.step_slug, v_step.opt_compensate);
    if (select r.compensation from flowlane.runs r where r.run_id = p_run_id) <> 'running' then
      return;  -- one could not start: the chain stops
    end if;
  end loop;
  if not exists (select 1 from flowlane.compensations c where c.run_id = p_run_id and c.status <> 'completed') then
    update flowlane.runs r set compensation = 'completed' where r.run_id = p_run_id;
  end if;
end;
$$;

-- one step's compensation run; one that cannot start (its flow gone, an input its contract
-- refuses) fails the compensation and stops the chain, saying why in the run's error message
create or replace function flowlane._start_compensation(p_run flowlane.runs, p_step_slug text, p_named text) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_flow text;
  v_input jsonb;
  v_started flowlane.runs;
begin
  v_input := jsonb_build_object('run_id', p_run.run_id, 'flow', p_run.flow_slug, 'step', p_step_slug,
    'input', flowlane._step_input(p_run.run_id, p_step_slug),
    'output', (select ss.output from flowlane.all_step_states ss
               where ss.run_id = p_run.run_id and ss.step_slug = p_step_slug));
  begin
    v_flow := flowlane.resolve_flow(p_named);
    perform flowlane._check_start_input(v_flow, v_input,
      format('compensation %s of step %s of run %s', v_flow, p_step_slug, p_run.run_id));
    select * into v_started from flowlane._create_runs(v_flow, array[v_input], array[null::uuid]);
  exception when others then
    update flowlane.compensations c set status = 'failed'
     where c.run_id = p_run.run_id and c.step_slug = p_step_slug;
    update flowlane.runs r
       set compensation = 'stopped',
           error_message = left(concat_ws('; ', r.error_message,
             format('compensation %s of step %s could not start: %s', p_named, p_step_slug, sqlerrm)), 4000)
     where r.run_id = p_run.run_id;
    return;
  end;
  update flowlane.compensations c set status = 'started', compensation_run_id = v_started.run_id
   where c.run_id = p_run.run_id and c.step_slug = p_step_slug;
  update flowlane.runs r set compensation_of = p_run.run_id where r.run_id = v_started.run_id
  returning * into v_started;
  if v_started.status not in ('started', 'waiting') then  -- it ended while it was created
    perform flowlane._compensation_ended(v_started);
  end if;
end;
$$;

create or replace function flowlane._report_compensation() returns trigger
language plpgsql volatile
set search_path = ''
as $$
begin
  perform flowlane._compensation_ended(new);
  return null;
end;
$$;

-- a compensation's run ended: completed, the chain goes on; failed or cancelled, it stops
create or replace function flowlane._compensation_ended(p_ended flowlane.runs) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_step text;
begin
  update flowlane.compensations c
     set status = case when p_ended.status = 'completed' then 'completed' else 'failed' end
   where c.compensation_run_id = p_ended.run_id and c.status = 'started'
  returning c.step_slug into v_step;
  if v_step is null then
    return;
  end if;
  if p_ended.status = 'completed' then
    perform flowlane._advance_compensation(p_ended.compensation_of);
  else
    update flowlane.runs r set compensation = 'stopped'
     where r.run_id = p_ended.compensation_of and r.compensation = 'running';
  end if;
end;
$$;

-- resume a stopped compensation: each failed compensation's run is retried (one that was
-- cancelled, or never started, starts again), and the chain goes on from there
create or replace function flowlane.retry_compensation(run_id uuid) returns flowlane.runs
language plpgsql volatile
set search_path = ''
as $$
declare
  v_run flowlane.runs;
  v_failed flowlane.compensations;
begin
  select * into v_run from flowlane.runs r where r.run_id = retry_compensation.run_id for update;
  if not found then
    raise exception 'no run %', retry_compensation.run_id using errcode = 'P0002';
  end if;
  if v_run.compensation is distinct from 'stopped' then
    raise exception 'run % has no stopped compensation (compensation: %)', v_run.run_id,
      coalesce(v_run.compensation, 'none') using errcode = '55000';
  end if;
  update flowlane.runs r set compensation = 'running' where r.run_id = v_run.run_id;
  for v_failed in
    select * from flowlane.compensations c where c.run_id = v_run.run_id and c.status = 'failed'
    order by c.step_slug for update
  loop
    if (select r.status from flowlane.runs r where r.run_id = v_failed.compensation_run_id) = 'failed' then
      perform flowlane.retry_run(v_failed.compensation_run_id);
      update flowlane.compensations c set status = 'started'
       where c.run_id = v_failed.run_id and c.step_slug = v_failed.step_slug;
    else
      update flowlane.compensations c set status = 'pending', compensation_run_id = null
       where c.run_id = v_failed.run_id and c.step_slug = v_failed.step_slug;
    end if;
  end loop;
  perform flowlane._advance_compensation(v_run.run_id);
  select * into v_run from flowlane.runs r where r.run_id = v_run.run_id;
  return v_run;
end;
$$;

-- the compensations of a run, in the order they start, for `flowlane run` and the console
create or replace function flowlane.get_run_compensations(run_id uuid) returns jsonb
language sql stable
set search_path = ''
as $$
  select coalesce(jsonb_agg(jsonb_build_object(
           'step_slug', c.step_slug, 'status', c.status, 'run_id', c.compensation_run_id,
           'flow_slug', x.flow_slug, 'run_status', x.status) order by s.step_index desc), '[]'::jsonb)
  from flowlane.compensations c
  join flowlane.runs r on r.run_id = c.run_id
  join flowlane.steps s on s.flow_slug = r.flow_slug and s.step_slug = c.step_slug
  left join flowlane.runs x on x.run_id = c.compensation_run_id
  where c.run_id = get_run_compensations.run_id
$$;

-- the name of the PostgreSQL trigger of one event of a flowlane trigger
create or replace function flowlane._trigger_pg_name(p_trigger text, p_event text) returns text
language sql immutable
set search_path = ''
as $$ select 'flowlane_' || p_trigger || '_' || p_event $$;

-- records a trigger and (re)creates its PostgreSQL triggers; the same arguments again change
-- nothing. table_name: schema-qualified, kept as written; p_events: insert, update, delete; when_pattern / unless_pattern: the containment
-- patterns an event ({"op", "old", "new"}) must hold / must not hold; input_map: run input
-- field -> JSON pointer into the event (null: the new row, the old one for a delete);
-- key_pointer: the event's idempotency key; on_refused: fail (the statement fails) or record
create or replace function flowlane.set_trigger(
  trigger_name text,
  flow_name text,
  table_name text,
  events text[],
  when_pattern jsonb = null,
  unless_pattern jsonb = null,
  input_map jsonb = null,
  key_pointer text = null,
  on_refused text = 'fail'
) returns flowlane.triggers
language plpgsql volatile
set search_path = ''
as $$
declare
  v_what text := format('trigger "%s"', set_trigger.trigger_name);
  v_table regclass := to_regclass(set_trigger.table_name);
  v_old flowlane.triggers;
  v_new flowlane.triggers;
begin
  perform flowlane._check_slug('trigger', set_trigger.trigger_name);
  perform flowlane.resolve_flow(set_trigger.flow_name);
  if v_table is null then
    raise exception '%: no table %', v_what, coalesce(quote_literal(set_trigger.table_name), 'NULL')
      using errcode = '42P01', hint = 'create the table before applying the trigger, and name it with its schema';
  end if;
  if events is null or cardinality(events) = 0
     or not events <@ array['insert', 'update', 'delete'] then
    raise exception '%: events are insert, update and delete, not %', v_what, coalesce(events::text, 'NULL')
      using errcode = '22023';
  end if;
  if length(flowlane._trigger_pg_name(set_trigger.trigger_name, 'delete')) > 63 then
    raise exception '%: a trigger name has at most 47 characters', v_what using errcode = '22023';
  end if;
  v_new := row(set_trigger.trigger_name, set_trigger.flow_name, set_trigger.table_name,
               array(select distinct e from unnest(events) e order by e), when_pattern, unless_pattern,
               input_map, key_pointer, on_refused, flowlane._primary_key(v_table), flowlane._now(), flowlane._now());
  perform flowlane._check_trigger_pointers(v_what, v_new);
  if 'update' = any (v_new.events) and v_new.row_key is null then
    raise exception '%: table % has no primary key, which pairs each updated row with its old values', v_what,
      v_table using errcode = '22023', hint = 'add a primary key, or trigger on insert and delete only';
  end if;
  select * into v_old from flowlane.triggers t where t.trigger_name = set_trigger.trigger_name for update;
  if found and (v_old.flow_name, v_old.table_name, v_old.events, v_old.when_pattern, v_old.unless_pattern,
                v_old.input_map, v_old.key_pointer, v_old.on_refused, v_old.row_key)
      is not distinct from (v_new.flow_name, v_new.table_name, v_new.events, v_new.when_pattern,
                            v_new.unless_pattern, v_new.input_map, v_new.key_pointer, v_new.on_refused,
                            v_new.row_key) then
    return v_old;  -- unchanged: applying the same file again writes nothing
  end if;
  if found then
    perform flowlane._drop_pg_triggers(v_old);
    v_new.created_at := v_old.created_at;
  end if;
  insert into flowlane.triggers as t values (v_new.*)
  on conflict on constraint triggers_pkey do update
    set flow_name = excluded.flow_name, table_name = excluded.table_name, events = excluded.events,
        when_pattern = excluded.when_pattern, unless_pattern = excluded.unless_pattern,
        input_map = excluded.input_map, key_pointer = excluded.key_pointer, on_refused = excluded.on_refused,
        row_key = excluded.row_key, updated_at = excluded.updated_at
  returning * into v_new;
  perform flowlane._create_pg_triggers(v_new);
  return v_new;
end;
$$;

-- the columns of a table's primary key, in key order (null: none)
create or replace function flowlane._primary_key(p_table regclass) returns text[]
language sql stable
set search_path = ''
as $$
  select array_agg(a.attname::text order by k.n)
  from pg_catalog.pg_index i
  cross join lateral unnest(i.indkey::int2[]) with ordinality k(attnum, n)
  join pg_catalog.pg_attribute a on a.attrelid = i.indrelid and a.attnum = k.attnum
  where i.indrelid = p_table and i.indisprimary
$$;

create or replace function flowlane._check_trigger_pointers(p_what text, p_trigger flowlane.triggers) returns void
language plpgsql immutable
set search_path = ''
as $$
declare
  v_pointer text;
begin
  if jsonb_typeof(p_trigger.input_map) is distinct from 'object' and p_trigger.input_map is not null then
    raise exception '%: input_map must be an object of JSON pointers', p_what using errcode = '22023';
  end if;
  for v_pointer in select p from (select p_trigger.key_pointer as p
                                  union all select m.value #>> '{}' from jsonb_each(p_trigger.input_map) m) x
                   where x.p is not null loop
    if v_pointer !~ '^(/([^~/]|~[01])*)+$' then
      raise exception '%: % is not a JSON pointer', p_what, quote_literal(v_pointer)
        using errcode = '22023', hint = 'write /new/field or /old/field';
    end if;
  end loop;
  if p_trigger.on_refused is null or p_trigger.on_refused not in ('fail', 'record') then
    raise exception '%: on_refused must be fail or record, not %', p_what,
      coalesce(quote_literal(p_trigger.on_refused), 'NULL') using errcode = '22023';
  end if;
end;
$$;

create or replace function flowlane._create_pg_triggers(p_trigger flowlane.triggers) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_event text;
begin
  foreach v_event in array p_trigger.events loop
    execute format('create trigger %I after %s on %s referencing %s for each statement '
                   'execute function flowlane._trigger_fire(%L)',
                   flowlane._trigger_pg_name(p_trigger.trigger_name, v_event), v_event, p_trigger.table_name::regclass,
                   case v_event when 'insert' then 'new table as flowlane_new'
                                when 'update' then 'old table as flowlane_old new table as flowlane_new'
                                else 'old table as flowlane_old' end,
                   p_trigger.trigger_name);
  end loop;
end;
$$;

create or replace function flowlane._drop_pg_triggers(p_trigger flowlane.triggers) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_event text;
begin
  if to_regclass(p_trigger.table_name) is null then
    return;  -- the table is gone, and its triggers with it
  end if;
  foreach v_event in array p_trigger.events loop
    execute format('drop trigger if exists %I on %s',
                   flowlane._trigger_pg_name(p_trigger.trigger_name, v_event), p_trigger.table_name::regclass);
  end loop;
end;
$$;

-- removes the triggers not named (and their PostgreSQL triggers); returns the removed names
create or replace function flowlane.keep_only_triggers(trigger_names text[]) returns text[]
language plpgsql volatile
set search_path = ''
as $$
declare
  v_trigger flowlane.triggers;
  v_removed text[] := '{}';
begin
  for v_trigger in select * from flowlane.triggers t
                   where t.trigger_name <> all (coalesce(trigger_names, '{}'))
                   order by t.trigger_name for update loop
    perform flowlane._drop_pg_triggers(v_trigger);
    delete from flowlane.trigger_refusals r where r.trigger_name = v_trigger.trigger_name;
    delete from flowlane.triggers t where t.trigger_name = v_trigger.trigger_name;
    v_removed := v_removed || v_trigger.trigger_name;
  end loop;
  return v_removed;
end;
$$;

-- the statement-level trigger function: the statement's events that pass the trigger's
-- patterns start their runs. Runs as the flowlane owner; the transition tables are the
-- statement's rows.
create or replace function flowlane._trigger_fire() returns trigger
language plpgsql volatile
security definer
set search_path = ''
as $$
declare
  v_trigger flowlane.triggers;
  v_events jsonb[];
  v_inputs jsonb[];
  v_keys text[];
  v_origins jsonb[];
begin
  select * into v_trigger from flowlane.triggers t where t.trigger_name = tg_argv[0];
  if not found then
    raise exception 'flowlane trigger "%" on %.% is not recorded', tg_argv[0], tg_table_schema, tg_table_name
      using errcode = '55000', hint = 'apply the project again: its triggers file recreates or removes it';
  end if;
  execute flowlane._trigger_events_sql(v_trigger, lower(tg_op))
    into v_events, v_inputs, v_keys, v_origins using v_trigger.when_pattern, v_trigger.unless_pattern;
  if v_events is not null then
    perform flowlane._start_from_events(v_trigger, v_events, v_inputs, v_keys, v_origins);
  end if;
  return null;
end;
$$;

-- the query of a statement's events that hold the pattern $1 and not the pattern $2 (null: no
-- pattern), as four arrays in one order: each event {"op", "old", "new"} (rows as JSON), its
-- run input (the fields of input_map, a pointer that finds nothing giving null; else the row),
-- its idempotency key (`<trigger>:<value at key_pointer>`: a string as itself, other values as
-- JSON text) and its origin ({"trigger", "op", "row": the primary key's values}). Written once
-- per statement with the pointers as literal paths, so that no function is called per row. An
-- update pairs old and new rows by the primary key.
create or replace function flowlane._trigger_events_sql(p_trigger flowlane.triggers, p_op text) returns text
language sql stable
set search_path = ''
as $$
  select format('select array_agg(x.e), array_agg(%s), array_agg(%s), array_agg(%s) from ('
                'select %s as e, %s as row_key from %s) x '
                'where ($1 is null or x.e @> $1) and ($2 is null or not x.e @> $2)',
                case when p_trigger.input_map is null
                     then format('x.e -> %L', case p_op when 'delete' then 'old' else 'new' end)
                     else (select format('jsonb_build_object(%s)', string_agg(
                                    format('%L, coalesce(x.e #> %L, ''null'')', m.key,
                                           flowlane._pointer_path(m.value #>> '{}')), ', ' order by m.key))
                           from jsonb_each(p_trigger.input_map) m) end,
                case when p_trigger.key_pointer is null then 'null::text'
                     else format('%L || (x.e #>> %L)', p_trigger.trigger_name || ':',
                                 flowlane._pointer_path(p_trigger.key_pointer)) end,
                format('jsonb_build_object(''trigger'', %L, ''op'', %L, ''row'', x.row_key)',
                       p_trigger.trigger_name, p_op),
                case p_op when 'insert' then 'jsonb_build_object(''op'', ''insert'', ''new'', to_jsonb(n))'
                          when 'update' then 'jsonb_build_object(''op'', ''update'', ''old'', to_jsonb(o), '
                                             '''new'', to_jsonb(n))'
                          else 'jsonb_build_object(''op'', ''delete'', ''old'', to_jsonb(o))' end,
                coalesce((select format('jsonb_build_object(%s)', string_agg(
                                   format('%L, %s.%I', c, case p_op when 'delete' then 'o' else 'n' end, c),
                                   ', ' order by k))
                          from unnest(p_trigger.row_key) with ordinality u(c, k)), 'null::jsonb'),
                case p_op when 'insert' then 'flowlane_new n'
                          when 'update' then format('flowlane_old o join flowlane_new n using (%s)',
                                                    (select string_agg(format('%I', c), ', ' order by k)
                                                     from unnest(p_trigger.row_key) with ordinality u(c, k)))
                          else 'flowlane_old o' end)
$$;

-- starts the runs of a statement's events as one set. With a key: an event whose key already
-- has a run under the flow name (as start_flow's keys), or repeats an earlier event of this
-- statement, starts nothing. An input the flow's contract refuses fails the statement
-- (on_refused fail) or is recorded in trigger_refusals (record).
create or replace function flowlane._start_from_events(p_trigger flowlane.triggers, p_events jsonb[], p_inputs jsonb[],
                                            p_keys text[], p_origins jsonb[]) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_flow text := flowlane.resolve_flow(p_trigger.flow_name);
  v_kept int[];
  v_contract flowlane.contracts;
  v_refused int[];
begin
  if p_trigger.key_pointer is not null then
    v_kept := array(select x.i from (select i, row_number() over (partition by p_keys[i] order by i) as nth
                                     from generate_subscripts(p_keys, 1) i) x
                    where p_keys[x.i] is null
                       or (x.nth = 1 and not exists (select 1 from flowlane.runs r
                                                     where r.called_as = p_trigger.flow_name
                                                       and r.idempotency_key = p_keys[x.i]))
                    order by x.i);
  end if;
  select * into v_contract from flowlane.contracts c where c.flow_slug = v_flow and coalesce(c.step_slug, '') = '';
  if found then
    v_refused := array(select i from unnest(flowlane._refused_inputs(v_contract, p_inputs)) i
                       where v_kept is null or i = any (v_kept) order by i);
    if cardinality(v_refused) > 0 then
      perform flowlane._refuse_events(p_trigger, v_flow, v_contract, p_events, p_inputs, v_refused);
      v_kept := array(select i from generate_subscripts(p_inputs, 1) i
                      where (v_kept is null or i = any (v_kept)) and i <> all (v_refused) order by i);
    end if;
  end if;
  if v_kept is not null then
    if cardinality(v_kept) = 0 then
      return;
    end if;
    p_inputs := array(select p_inputs[i] from unnest(v_kept) with ordinality u(i, n) order by n);
    p_keys := array(select p_keys[i] from unnest(v_kept) with ordinality u(i, n) order by n);
    p_origins := array(select p_origins[i] from unnest(v_kept) with ordinality u(i, n) order by n);
  end if;
  perform flowlane._check_start_input(v_flow, p_inputs[1], format('trigger "%s"', p_trigger.trigger_name));
  perform from flowlane._new_runs(v_flow, p_inputs, '{}', null, p_keys, p_trigger.flow_name, null, p_origins);
end;
$$;

-- the refused events of a statement: on_refused fail raises for the first, naming the path
-- and the rule; record keeps each with its reason
create or replace function flowlane._refuse_events(p_trigger flowlane.triggers, p_flow text, p_contract flowlane.contracts,
                                        p_events jsonb[], p_inputs jsonb[], p_refused int[]) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_i int;
  v_found jsonb;
  v_error text;
begin
  foreach v_i in array p_refused loop
    v_found := flowlane.contract_violation(p_contract.schema, p_inputs[v_i]);
    v_error := format('flow "%s" refuses the run input: %s: %s (the rule at input_schema%s)', p_flow,
                      coalesce(nullif(v_found ->> 'path', ''), '/'), v_found ->> 'message', v_found ->> 'schema_path');
    if p_trigger.on_refused = 'fail' then
      raise exception 'trigger "%" on %: %', p_trigger.trigger_name, p_trigger.table_name, v_error
        using errcode = '22023', detail = format('the row: %s', flowlane._contract_shown(
                                                   coalesce(p_events[v_i] -> 'new', p_events[v_i] -> 'old'))),
              hint = 'correct the row, or the trigger''s input, or declare on_refused: record to let such rows commit';
    end if;
    insert into flowlane.trigger_refusals (trigger_name, event, error)
    values (p_trigger.trigger_name, p_events[v_i], v_error);
  end loop;
end;
$$;

-- each trigger with what it started: runs, refusals, the latest refusal
create or replace function flowlane.trigger_activity() returns table (
  trigger_name text, flow_name text, table_name text, events text[], on_refused text, runs bigint,
  runs_last_day bigint, last_run_at timestamptz, refusals bigint, last_error text, last_error_at timestamptz)
language sql stable
set search_path = ''
as $$
  select t.trigger_name, t.flow_name, t.table_name, t.events, t.on_refused,
         r.runs, r.runs_last_day, r.last_run_at, f.refusals, l.error, l.refused_at
  from flowlane.triggers t
  cross join lateral (select count(*) as runs, count(*) filter (where x.started_at > flowlane._now() - interval '1 day')
                             as runs_last_day, max(x.started_at) as last_run_at
                      from flowlane.runs x where x.origin ? 'trigger' and x.origin ->> 'trigger' = t.trigger_name) r
  cross join lateral (select count(*) as refusals from flowlane.trigger_refusals y
                      where y.trigger_name = t.trigger_name) f
  left join lateral (select z.error, z.refused_at from flowlane.trigger_refusals z
                     where z.trigger_name = t.trigger_name order by z.refused_at desc limit 1) l on true
  order by t.trigger_name
$$;

-- a step's cache: a time to live of at least 1 second, for a step with tasks (a handler); its key
-- pointers are JSON pointers into the step's input
create or replace function flowlane._check_cache(p_what text, p_ttl int, p_key text[], p_has_tasks boolean) returns void
language plpgsql immutable
set search_path = ''
as $$
begin
  if p_ttl is null and p_key is not null then
    raise exception '%: a cache key needs a cache ttl', p_what using errcode = '22023';
  end if;
  if p_ttl < 1 then
    raise exception '%: cache ttl must be at least 1 second, not %', p_what, p_ttl using errcode = '22023';
  end if;
  if p_ttl is not null and not p_has_tasks then
    raise exception '%: a cache needs a step with a handler (a wait or child-flow step has no tasks)', p_what
      using errcode = '22023';
  end if;
  if cardinality(p_key) = 0 or exists (select 1 from unnest(p_key) k where k is null or k !~ '^(/([^~/]|~[01])*)+$') then
    raise exception '%: cache key % is not a list of JSON pointers into the step''s input', p_what,
      quote_literal(p_key::text)
      using errcode = '22023', hint = 'a JSON pointer starts with "/" (e.g. /url); "~" is written ~0 and "/" inside a name ~1';
  end if;
end;
$$;

-- the hash of a task's cache key: its whole input without pointers, else the values at the
-- pointers in their order (a missing value is null)
create or replace function flowlane._cache_key_hash(p_pointers text[], p_input jsonb) returns text
language plpgsql immutable
set search_path = ''
as $$
begin
  return encode(sha256(convert_to((
    case when p_pointers is null then coalesce(p_input, 'null'::jsonb)
         else (select jsonb_agg(coalesce(p_input #> flowlane._pointer_path(u.p), 'null'::jsonb) order by u.o)
               from unnest(p_pointers) with ordinality u (p, o)) end)::text, 'UTF8')), 'hex');
end;
$$;

-- of the tasks about to be sent (bodies {flow_slug, run_id, step_slug, task_index}) of cached
-- steps (their runs' locks held), those whose key has an unexpired entry are recorded as started
-- without a message and completed with the entry's output; returns the bodies to send
create or replace function flowlane._take_cached(p_bodies jsonb[]) returns jsonb[]
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_hits flowlane._result_item[];
  v_send jsonb[];
begin
  with tasks as (
    select b.ord, b.body, jsonb_populate_record(null::flowlane.step_tasks, b.body) as t
    from unnest(p_bodies) with ordinality b (body, ord)
  ), keyed as materialized (  -- (each key computed once: the entries are then found by their primary key)
    select k.ord, k.body, (k.t).flow_slug, (k.t).run_id, (k.t).step_slug, (k.t).task_index, s.queue_name,
           coalesce(s.opt_cache_fingerprint, '') as fingerprint,
           case when s.opt_cache_ttl is not null then flowlane._cache_key_hash(s.opt_cache_key, i.input) end as key_hash
    from tasks k
    join flowlane.steps s on s.flow_slug = (k.t).flow_slug and s.step_slug = (k.t).step_slug
    -- (the inputs of the cached steps' tasks only: a queue's tasks may be of several steps)
    left join flowlane._claimed_inputs(array(
      select x.t from tasks x
      join flowlane.steps c on c.flow_slug = (x.t).flow_slug and c.step_slug = (x.t).step_slug
      where c.opt_cache_ttl is not null)) i
      on i.run_id = (k.t).run_id and i.step_slug = (k.t).step_slug and i.task_index = (k.t).task_index
  ), found as (
    select k.*, e.output, e.flow_slug is not null as hit
    from keyed k
    left join flowlane.step_cache e
      on e.flow_slug = k.flow_slug and e.step_slug = k.step_slug and e.fingerprint = k.fingerprint
     and e.key_hash = k.key_hash and e.expires_at > flowlane._now()
  ), started as (
    insert into flowlane.step_tasks (flow_slug, run_id, step_slug, task_index, queue_name, message_id, status,
                                     queued_at, started_at, cached)
    select f.flow_slug, f.run_id, f.step_slug, f.task_index, f.queue_name, null, 'started',
           flowlane._now(), flowlane._now(), true
    from found f where f.hit
    order by f.run_id, f.step_slug, f.task_index
    returning 1
  )
  select coalesce(array_agg(row(f.ord - 1, f.run_id, f.step_slug, f.task_index, f.output, null, null, null, null,
                                null)::flowlane._result_item order by f.ord) filter (where f.hit), '{}'),
         coalesce(array_agg(f.body order by f.ord) filter (where not f.hit), '{}')
    into v_hits, v_send
  from found f
  where (select count(*) from started) >= 0;  -- (the insert runs first)
  if cardinality(v_hits) > 0 then
    perform flowlane._complete_batch(v_hits);
  end if;
  return v_send;
end;
$$;

-- completed tasks (their runs' locks held) of cached steps, by their handler or an operator:
-- each output is kept under its input's key, unless an unexpired entry has the key already (the
-- first completion wins: runs that reach the step with the same key before it completes each
-- run the handler); an expired entry is replaced
create or replace function flowlane._cache_outputs(p_tasks flowlane.step_tasks[]) returns void
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
begin
  insert into flowlane.step_cache as e (flow_slug, step_slug, fingerprint, key_hash, output, created_at, expires_at)
  select distinct on (1, 2, 3, 4) t.flow_slug, t.step_slug, coalesce(s.opt_cache_fingerprint, ''),
         flowlane._cache_key_hash(s.opt_cache_key, i.input), t.output, flowlane._now(),
         flowlane._now() + make_interval(secs => s.opt_cache_ttl)
  from unnest(p_tasks) t
  join flowlane.steps s on s.flow_slug = t.flow_slug and s.step_slug = t.step_slug and s.opt_cache_ttl is not null
  join flowlane._claimed_inputs(p_tasks) i
    on i.run_id = t.run_id and i.step_slug = t.step_slug and i.task_index = t.task_index
  where t.status = 'completed' and not t.cached
  order by 1, 2, 3, 4, t.run_id, t.task_index
  on conflict on constraint step_cache_pkey do update
    set output = excluded.output, created_at = excluded.created_at, expires_at = excluded.expires_at
    where e.expires_at <= flowlane._now();
end;
$$;

-- one bounded batch of expired entries deleted (the maintenance tick); how many
create or replace function flowlane._prune_cache(p_now timestamptz) returns int
language plpgsql volatile
set search_path = ''
as $$
declare
  v_n int;
begin
  delete from flowlane.step_cache e
   where (e.flow_slug, e.step_slug, e.fingerprint, e.key_hash) in (
     select x.flow_slug, x.step_slug, x.fingerprint, x.key_hash from flowlane.step_cache x
     where x.expires_at <= p_now order by x.expires_at limit 10000
     for update skip locked);
  get diagnostics v_n = row_count;
  return v_n;
end;
$$;

-- a rerun from a step (retry_run_from) runs the handlers of the steps it resets again: the
-- entries their completed tasks are keyed under go first (p_steps of the locked run p_run_id)
create or replace function flowlane._forget_cached(p_run_id uuid, p_steps text[]) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_tasks flowlane.step_tasks[];
begin
  select coalesce(array_agg(t order by t.step_slug, t.task_index), '{}') into v_tasks
  from flowlane.step_tasks t
  join flowlane.steps s on s.flow_slug = t.flow_slug and s.step_slug = t.step_slug and s.opt_cache_ttl is not null
  where t.run_id = p_run_id and t.step_slug = any (p_steps) and t.status = 'completed';
  if cardinality(v_tasks) = 0 then
    return;
  end if;
  with keyed as materialized (
    select s.flow_slug, s.step_slug, coalesce(s.opt_cache_fingerprint, '') as fingerprint,
           flowlane._cache_key_hash(s.opt_cache_key, i.input) as key_hash
    from flowlane._claimed_inputs(v_tasks) i
    join flowlane.runs r on r.run_id = i.run_id
    join flowlane.steps s on s.flow_slug = r.flow_slug and s.step_slug = i.step_slug
  )
  delete from flowlane.step_cache e
   using keyed k
   where e.flow_slug = k.flow_slug and e.step_slug = k.step_slug and e.fingerprint = k.fingerprint
     and e.key_hash = k.key_hash;
end;
$$;

-- written at run time by the source, by a function that the part written by hand below calls: _queue_delete_batch

-- == Written by hand: what calls the functions (checks, defaults, triggers, data) ==

-- failure handlers: a run that fails (or is cancelled) starts its flow's failure handler
create trigger runs_start_failure_handler
  after update of status on flowlane.runs
  for each row
  when (old.status in ('started', 'waiting') and new.status in ('failed', 'cancelled') and new.failure_of is null)
  execute function flowlane._start_failure_handler();

-- compensation: a failed run starts its compensations, a compensation's run that ends moves
-- the chain on or stops it
create trigger runs_begin_compensation
  after update of status on flowlane.runs
  for each row
  when (old.status in ('started', 'waiting') and new.status = 'failed'
        and new.compensation_of is null and new.failure_of is null)
  execute function flowlane._begin_compensation();

create trigger runs_report_compensation
  after update of status on flowlane.runs
  for each row
  when (old.status in ('started', 'waiting') and new.status in ('completed', 'failed', 'cancelled')
        and new.compensation_of is not null)
  execute function flowlane._report_compensation();

-- queue archive: the queue operations gain _queue_delete_batch, written for every registered queue
select flowlane._write_queue_ops();

-- task leases: a started task that ends wakes the workers of its queue when the queue has a
-- concurrency limit (the triggers of the leases did)
create trigger step_tasks_wake_freed_queues
  after update on flowlane.step_tasks
  referencing old table as old_tasks new table as new_tasks
  for each statement execute function flowlane._wake_freed_queues();

-- time-ordered run ids: the column's default makes them too
alter table flowlane.runs alter column run_id set default flowlane._uuid_v7();
