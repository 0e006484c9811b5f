-- flowlane SQL Core 0003: release 0.1.0.
-- Brings a database of the original core (0001 and 0002) to flowlane 0.1.0: aliases, shared
-- queues and worker deployments, leases and attempt history, cancelling and retrying runs,
-- schedules, keyed and delayed starts, deadlines, data contracts, wait steps, child flows and
-- flow control. Runs in flight finish on the new functions; the original core's workers must
-- be stopped first, since the calls they make (start_tasks by flow) are gone.

-- == Written by hand: tables, types and data that the functions need ==

-- Tables and types. Written by hand; the engine source's 01_tables.sql is what they reach.

-- Queues: the spelling PGMQ knows a queue by, adoption, and priority ordering.
alter table flowlane.queues
  add column pgmq_queue_name text,
  add column adopted_at timestamptz,
  add column prioritized boolean not null default false;
update flowlane.queues q
   set pgmq_queue_name = coalesce(
         (select l.queue_name from pgmq.list_queues() l
          where lower(l.queue_name) = q.queue_name order by l.queue_name limit 1),
         q.queue_name);
alter table flowlane.queues
  alter column pgmq_queue_name set not null,
  add constraint queues_pgmq_spelling check (lower(pgmq_queue_name) = queue_name);

-- Flows: bounded timeouts, retention (30 days for the flows that exist), deadlines,
-- keyed starts, concurrency and priority.
alter table flowlane.flows
  add column opt_retention int default 2592000,
  add column opt_deadline int,
  add column opt_dedup_key text,
  add column opt_concurrency_limit int,
  add column opt_concurrency_key text,
  add column opt_priority int,
  add constraint flows_timeout_at_most_2147483617 check (opt_timeout <= 2147483617),
  add constraint flows_retention_positive check ((opt_retention is null) or (opt_retention >= 1)),
  add constraint flows_deadline_positive check ((opt_deadline is null) or (opt_deadline >= 1)),
  add constraint flows_dedup_key_pointer
    check ((opt_dedup_key is null) or (opt_dedup_key ~ '^(/([^~/]|~[01])*)+$')),
  add constraint flows_concurrency_limit_positive
    check ((opt_concurrency_limit is null) or (opt_concurrency_limit >= 1)),
  add constraint flows_concurrency_key_pointer
    check ((opt_concurrency_key is null) or (opt_concurrency_key ~ '^(/([^~/]|~[01])*)+$')),
  add constraint flows_concurrency_key_needs_limit
    check ((opt_concurrency_key is null) or (opt_concurrency_limit is not null)),
  add constraint flows_priority_range check ((opt_priority is null) or (opt_priority between -1000 and 1000));

-- Steps: wait steps and child flows (no queue), step concurrency.
alter table flowlane.steps
  alter column queue_name drop not null,
  add column child_flow text,
  add column opt_concurrency_limit int,
  add column opt_concurrency_key text,
  drop constraint steps_type_valid,
  add constraint steps_type_valid check (step_type in ('single', 'map', 'wait')),
  add constraint steps_timeout_at_most_2147483617 check (opt_timeout is null or opt_timeout <= 2147483617),
  add constraint steps_queue_iff_handler
    check ((queue_name is null) = ((step_type = 'wait') or (child_flow is not null))),
  add constraint steps_child_flow_not_wait check ((child_flow is null) or (step_type <> 'wait')),
  add constraint steps_concurrency_limit_positive
    check ((opt_concurrency_limit is null) or (opt_concurrency_limit >= 1)),
  add constraint steps_concurrency_key_pointer
    check ((opt_concurrency_key is null) or (opt_concurrency_key ~ '^(/([^~/]|~[01])*)+$')),
  add constraint steps_concurrency_key_needs_limit
    check ((opt_concurrency_key is null) or (opt_concurrency_limit is not null)),
  add constraint steps_concurrency_needs_tasks
    check ((opt_concurrency_limit is null) or (queue_name is not null));

-- Aliases and their history.
create table flowlane.aliases (
  alias text primary key,
  flow_slug text not null references flowlane.flows (flow_slug),
  draining text[] not null default '{}',
  updated_at timestamptz not null default clock_timestamp(),
  constraint aliases_slug_valid check (flowlane.is_valid_slug(alias)),
  constraint aliases_active_not_draining check (not (flow_slug = any (draining))),
  constraint aliases_draining_no_nulls check (array_position(draining, null) is null)
);
create unique index aliases_slug_ci_unique on flowlane.aliases (lower(alias));
create table flowlane.alias_history (
  id bigint generated always as identity primary key,
  alias text not null,
  flow_slug text not null,
  draining text[] not null,
  changed_at timestamptz not null default clock_timestamp()
);
create index alias_history_alias_idx on flowlane.alias_history (alias, id);

-- Worker deployments, the workers' supported pairs, rollouts and refusals.
create table flowlane.worker_deployments (
  deployment_name text primary key,
  queue_name text not null references flowlane.queues (queue_name),
  enabled boolean not null default true,
  reason text,
  created_at timestamptz not null default now(),
  changed_at timestamptz not null default now()
);
create index worker_deployments_queue_idx on flowlane.worker_deployments (queue_name);
alter table flowlane.workers
  add column deployment_name text references flowlane.worker_deployments (deployment_name),
  add column supported_pairs jsonb not null default '[]';
create index workers_deployment_idx on flowlane.workers (deployment_name) where stopped_at is null;
create table flowlane.rollouts (
  rollout_id bigint generated always as identity primary key,
  deployments text[] not null,
  previously_enabled text[] not null,
  started_at timestamptz not null default now(),
  finished_at timestamptz
);
create unique index rollouts_one_unfinished on flowlane.rollouts ((true)) where finished_at is null;
create table flowlane.worker_refusals (
  queue_name text not null,
  deployment_name text not null,
  reason text not null,
  hint text,
  refused_at timestamptz default now() not null,
  constraint worker_refusals_pkey primary key (queue_name, deployment_name)
);

-- Runs: cancelling and retrying, traces, keyed and delayed starts, deadlines, schedules,
-- parents, concurrency keys and priority. Their rules become one check after the functions.
alter table flowlane.runs
  drop constraint runs_completed_after_start,
  drop constraint runs_completed_at,
  drop constraint runs_failed_after_start,
  drop constraint runs_failed_at,
  drop constraint runs_output_only_completed,
  drop constraint runs_remaining_steps_nonnegative,
  drop constraint runs_status_valid,
  add column cancelled_at timestamptz,
  add column cancel_reason text,
  add column retry_count int not null default 0,
  add column retried_at timestamptz,
  add column trace_parent text,
  add column called_as text,
  add column idempotency_key text,
  add column start_at timestamptz,
  add column deadline_at timestamptz,
  add column schedule_name text,
  add column schedule_slot timestamptz,
  add column parent_run_id uuid,
  add column parent_step_slug text,
  add column parent_task_index int,
  add column concurrency_key text,
  add column hold_seq bigint,
  add column priority int default 0 not null;
alter table flowlane.runs set (fillfactor = 85,
  autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);
drop index flowlane.runs_status_idx;
create index runs_started_idx on flowlane.runs (started_at desc, run_id);
create index runs_in_flight_idx on flowlane.runs (run_id) where status = 'started';
create index runs_ended_idx on flowlane.runs (status, started_at desc, run_id) where status <> 'started';
create index runs_prune_idx on flowlane.runs (flow_slug, started_at) where (status <> 'started');
create unique index runs_key_unique on flowlane.runs (called_as, idempotency_key)
  where (idempotency_key is not null);
create index runs_waiting_idx on flowlane.runs (start_at) where ((status = 'waiting') and (hold_seq is null));
create index runs_deadline_idx on flowlane.runs (deadline_at)
  where (status = 'started' and deadline_at is not null);
create unique index runs_schedule_slot_unique on flowlane.runs (schedule_name, schedule_slot)
  where (schedule_slot is not null);
create index runs_parent_idx on flowlane.runs (parent_run_id, parent_step_slug, parent_task_index)
  where (parent_run_id is not null);
create index runs_slots_idx on flowlane.runs (flow_slug, concurrency_key)
  where ((status = 'started') and (concurrency_key is not null));
create index runs_held_idx on flowlane.runs (flow_slug, concurrency_key, hold_seq)
  where ((status = 'waiting') and (hold_seq is not null));

-- Step states: cancelled steps. The steps of a failed run that never ran end as cancelled.
alter table flowlane.step_states
  drop constraint step_states_completed_after_started,
  drop constraint step_states_completed_at,
  drop constraint step_states_completed_no_remaining,
  drop constraint step_states_failed_after_created,
  drop constraint step_states_failed_at,
  drop constraint step_states_initial_tasks_nonnegative,
  drop constraint step_states_output_only_completed,
  drop constraint step_states_remaining_deps_nonnegative,
  drop constraint step_states_remaining_tasks_nonnegative,
  drop constraint step_states_skip_reason,
  drop constraint step_states_skip_reason_valid,
  drop constraint step_states_skipped_after_created,
  drop constraint step_states_skipped_at,
  drop constraint step_states_started_after_created,
  drop constraint step_states_started_sized,
  drop constraint step_states_status_valid,
  drop constraint step_states_unstarted_no_remaining,
  drop constraint step_states_flow_slug_fkey,
  add column cancelled_at timestamptz;
alter table flowlane.step_states set (autovacuum_vacuum_scale_factor = 0.02,
  autovacuum_analyze_scale_factor = 0.02, fillfactor = 50);
drop index flowlane.step_states_ready_idx;
update flowlane.step_states ss
   set status = 'cancelled', cancelled_at = greatest(r.failed_at, coalesce(ss.started_at, ss.created_at))
  from flowlane.runs r
 where r.run_id = ss.run_id and r.status = 'failed' and ss.status in ('created', 'started');

-- Step tasks: lease renewals; their rules become one check after the functions.
alter table flowlane.step_tasks
  drop constraint step_tasks_attempts_nonnegative,
  drop constraint step_tasks_cancelled_after_queued,
  drop constraint step_tasks_cancelled_at,
  drop constraint step_tasks_completed_after_started,
  drop constraint step_tasks_completed_at,
  drop constraint step_tasks_failed_after_queued,
  drop constraint step_tasks_failed_at,
  drop constraint step_tasks_output_only_done,
  drop constraint step_tasks_requeued_nonnegative,
  drop constraint step_tasks_skipped_after_queued,
  drop constraint step_tasks_skipped_at,
  drop constraint step_tasks_started_after_queued,
  drop constraint step_tasks_started_at,
  drop constraint step_tasks_status_valid,
  drop constraint step_tasks_task_index_nonnegative,
  drop constraint step_tasks_flow_slug_fkey,
  drop constraint step_tasks_run_id_fkey,
  add column lease_renewed_at timestamptz;
alter table flowlane.step_tasks set (autovacuum_vacuum_scale_factor = 0.02,
  autovacuum_analyze_scale_factor = 0.02, fillfactor = 50);
drop index flowlane.step_tasks_started_idx;
drop index flowlane.step_tasks_active_idx;
create index step_tasks_completed_brin on flowlane.step_tasks using brin (completed_at)
  with (autosummarize = on);

-- Attempt history, leases of started tasks, held tasks and step slots.
create table flowlane.task_attempts (
  id bigint generated always as identity primary key,
  run_id uuid not null references flowlane.runs (run_id) on delete cascade,
  step_slug text not null,
  task_index int not null,
  attempt int not null,
  retry_round int not null default 0,
  outcome text not null,
  worker_id uuid,
  error_type text,
  error_message text,
  traceback text,
  failed_at timestamptz not null default now(),
  constraint task_attempts_outcome_valid check (outcome in ('retry', 'failed', 'stalled')),
  constraint task_attempts_attempt_positive check (attempt >= 1),
  constraint task_attempts_bounded check (
    length(error_message) <= 4000 and length(traceback) <= 16000 and length(error_type) <= 200)
);
create index task_attempts_task_idx on flowlane.task_attempts (run_id, step_slug, task_index, id);
create table flowlane.task_leases (
  run_id uuid not null,
  step_slug text not null,
  task_index int not null,
  started_at timestamptz not null,
  queue_name text,
  primary key (run_id, step_slug, task_index)
) with (
  autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_cost_delay = 0
);
comment on table flowlane.task_leases is
  'the started tasks (kept by trigger from step_tasks.status): what stalled recovery scans';
create index task_leases_queue_idx on flowlane.task_leases (queue_name);
create sequence flowlane.hold_seq;
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
  constraint queue_limits_queue_name_fkey foreign key (queue_name)
    references flowlane.queues(queue_name) on delete cascade
);

-- Schedules.
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
  constraint schedules_cron_complete check ((cron is null) = (cron_minutes is null)
    and (cron is null) = (cron_hours is null) and (cron is null) = (cron_months is null)
    and ((cron is not null) or ((cron_days is null) and (cron_weekdays is null)))),
  constraint schedules_cron_or_every check ((cron is null) <> (every_seconds is null)),
  constraint schedules_every_positive check ((every_seconds is null) or (every_seconds >= 1)),
  constraint schedules_name_valid check (flowlane.is_valid_slug(schedule_name)),
  constraint schedules_overlap_valid check (overlap in ('skip', 'allow'))
);
create index schedules_next_slot_idx on flowlane.schedules (next_slot);
create table flowlane.schedule_overrides (
  schedule_name text not null,
  paused boolean default true not null,
  reason text,
  changed_at timestamptz default now() not null,
  constraint schedule_overrides_pkey primary key (schedule_name)
);

-- Data contracts, signals of wait steps and their deadlines.
create table flowlane.contracts (
  flow_slug text not null,
  step_slug text,
  schema jsonb not null,
  check_sql text not null,
  created_at timestamptz default now() not null,
  constraint contracts_flow_slug_fkey foreign key (flow_slug)
    references flowlane.flows(flow_slug) on delete cascade,
  constraint contracts_step_fkey foreign key (flow_slug, step_slug)
    references flowlane.steps(flow_slug, step_slug) on delete cascade
);
create unique index contracts_subject_unique on flowlane.contracts (flow_slug, coalesce(step_slug, ''));
create table flowlane.signals (
  run_id uuid not null,
  step_slug text not null,
  payload jsonb not null,
  received_at timestamptz default now() not null,
  applied_at timestamptz,
  constraint signals_pkey primary key (run_id, step_slug),
  constraint signals_applied_after_received check ((applied_at is null) or (applied_at >= received_at)),
  constraint signals_run_id_fkey foreign key (run_id) references flowlane.runs(run_id) on delete cascade
);
create table flowlane.wait_deadlines (
  run_id uuid not null,
  step_slug text not null,
  expires_at timestamptz not null,
  constraint wait_deadlines_pkey primary key (run_id, step_slug),
  constraint wait_deadlines_run_id_fkey foreign key (run_id) references flowlane.runs(run_id) on delete cascade
);
create index wait_deadlines_expiry_idx on flowlane.wait_deadlines (expires_at);

-- What a step's options resolve to.
create view flowlane.step_options as
select o.flow_slug, o.step_slug, o.timeout, o.max_attempts, o.base_delay,
       o.timeout + 2 as claim_visibility,
       o.timeout + 30 as stall_after
from (select s.flow_slug, s.step_slug,
             coalesce(s.opt_timeout, f.opt_timeout) as timeout,
             coalesce(s.opt_max_attempts, f.opt_max_attempts) as max_attempts,
             coalesce(s.opt_base_delay, f.opt_base_delay) as base_delay
      from flowlane.steps s join flowlane.flows f on f.flow_slug = s.flow_slug) o;

-- The engine's record types.
create type flowlane.claim_record as (
  outcome text,
  flow_slug text,
  step_slug text,
  queue_name text,
  run_id uuid,
  task_index int,
  input jsonb,
  flow_input jsonb,
  attempt int,
  msg_id bigint
);
create type flowlane._claim_item as (
  msg_id bigint,
  task flowlane.step_tasks,
  supported boolean,
  claimable boolean
);
create type flowlane._result_item as (
  pos int,
  run_id uuid,
  step_slug text,
  task_index int,
  output jsonb,
  worker_id uuid,
  attempt int,
  error_message text,
  error_type text,
  traceback text
);
create type flowlane._result_class as (
  item flowlane._result_item,
  task flowlane.step_tasks,
  run_status text,
  actionable boolean
);
create type flowlane._queue_gate as (
  queue_name text,
  allowed int,
  started_at timestamptz,
  reserved int,
  refusal flowlane.claim_record,
  prioritized boolean,
  limited boolean
);

-- == Drafted from the engine source by `python -m flowlane.core.draft_migration`; redrafted, never edited ==

set local check_function_bodies = off;

-- REVIEW: flowlane._effective_timeout(text,text) is called by flowlane.start_tasks(text,bigint[],uuid): a call in flight when this migration commits runs their old bodies to the end and fails without it; keep the signature while the previous release's workers may call them (CONTRIBUTING, rules for migrations)

drop function flowlane._effective_timeout(text,text);

-- REVIEW: flowlane._lock_task(uuid,text,integer,uuid,integer) is called by flowlane.complete_task(uuid,text,integer,jsonb,uuid,integer), flowlane.fail_task(uuid,text,integer,text,uuid,integer): a call in flight when this migration commits runs their old bodies to the end and fails without it; keep the signature while the previous release's workers may call them (CONTRIBUTING, rules for migrations)

drop function flowlane._lock_task(uuid,text,integer,uuid,integer);

-- REVIEW: flowlane._maybe_complete_run(uuid) is called by flowlane._progress(uuid): a call in flight when this migration commits runs their old bodies to the end and fails without it; keep the signature while the previous release's workers may call them (CONTRIBUTING, rules for migrations)

drop function flowlane._maybe_complete_run(uuid);

-- REVIEW: flowlane._task_input(uuid,text,integer) is called by flowlane.start_tasks(text,bigint[],uuid): a call in flight when this migration commits runs their old bodies to the end and fails without it; keep the signature while the previous release's workers may call them (CONTRIBUTING, rules for migrations)

drop function flowlane._task_input(uuid,text,integer);

-- REVIEW: flowlane.add_step(text,text,text[],integer,integer,integer,integer,text,jsonb,jsonb,text,text,text) is called by flowlane.ensure_flow_compiled(text,jsonb): a call in flight when this migration commits runs their old bodies to the end and fails without it; keep the signature while the previous release's workers may call them (CONTRIBUTING, rules for migrations)

drop function flowlane.add_step(text,text,text[],integer,integer,integer,integer,text,jsonb,jsonb,text,text,text);

-- REVIEW: flowlane.create_flow(text,integer,integer,integer,text) is called by flowlane.ensure_flow_compiled(text,jsonb): a call in flight when this migration commits runs their old bodies to the end and fails without it; keep the signature while the previous release's workers may call them (CONTRIBUTING, rules for migrations)

drop function flowlane.create_flow(text,integer,integer,integer,text);

drop function flowlane.register_worker(uuid,text,text);

drop function flowlane.start_flow(text,jsonb,uuid);

drop function flowlane.start_tasks(text,bigint[],uuid);

-- a flow option's value when the flow's definition leaves it out: the column defaults of
-- flowlane.flows and create_flow take it from here, and a test holds it equal to the
-- compiler's defaults
create or replace function flowlane._flow_option_default(option text) returns int
language sql immutable parallel safe
set search_path = ''
as $$
  select case option when 'max_attempts' then 3 when 'base_delay' then 5 when 'timeout' then 60
                     when 'retention' then 2592000 end
$$;

create or replace function flowlane.is_valid_queue_name(queue_name text) returns boolean
language plpgsql immutable parallel safe
set search_path = ''
as $$
begin
  return queue_name is not null
     and length(queue_name) between 1 and 47
     and queue_name ~ '^[a-z][a-z0-9_]*$'
     and right(queue_name, 1) <> '_';
end;
$$;

create or replace function flowlane._check_queue_argument(p_function text, p_queue text) returns void
language plpgsql immutable
set search_path = ''
as $$
begin
  if not flowlane.is_valid_queue_name(p_queue) then
    raise exception '%: invalid queue name %', p_function, coalesce(quote_literal(p_queue), 'NULL')
      using errcode = '22023',
            hint = 'a queue name matches ^[a-z][a-z0-9_]*$ and has at most 47 characters';
  end if;
end;
$$;

-- a claim's worker id fences the results of the tasks it claims: without one, nothing is claimed
create or replace function flowlane._check_worker_argument(p_function text, p_worker_id uuid) returns void
language plpgsql immutable
set search_path = ''
as $$
begin
  if p_worker_id is null then
    raise exception '%: worker_id is required (it fences the results of the claimed tasks)', p_function
      using errcode = '22023';
  end if;
end;
$$;

create or replace function flowlane.is_valid_deployment_name(deployment_name text) returns boolean
language sql immutable parallel safe
set search_path = ''
as $$
  select deployment_name is not null
     and length(deployment_name) between 1 and 128
     and deployment_name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]*$'
$$;

create or replace function flowlane._check_deployment_argument(p_function text, p_deployment text) returns void
language plpgsql immutable
set search_path = ''
as $$
begin
  if not flowlane.is_valid_deployment_name(p_deployment) then
    raise exception '%: invalid deployment name %', p_function, coalesce(quote_literal(p_deployment), 'NULL')
      using errcode = '22023', hint = 'a deployment name matches ^[A-Za-z0-9][A-Za-z0-9_.-]*$ (1..128 characters)';
  end if;
end;
$$;

create or replace function flowlane._pairs(supported_pairs jsonb)
returns table (flow_slug text, step_slug text)
language plpgsql stable
set search_path = ''
as $$
declare
  v_bad record;
begin
  if supported_pairs is null or jsonb_typeof(supported_pairs) <> 'array' then
    raise exception 'supported_pairs must be a JSON array of [flow_slug, step_slug] pairs, got %',
      coalesce(jsonb_typeof(supported_pairs), 'null') using errcode = '22023';
  end if;
  -- one statement for every pair; a pair that names a defined step is a pair of slugs (the
  -- rules of flowlane.steps), so only the others pay for the slug rule, which a worker that
  -- serves many steps would otherwise pay twice per pair on every claim
  select a.e as item, a.o - 1 as pos into v_bad
  from jsonb_array_elements(supported_pairs) with ordinality as a (e, o)
  where case when jsonb_typeof(a.e) <> 'array' then true
             when jsonb_array_length(a.e) <> 2 then true
             when jsonb_typeof(a.e -> 0) <> 'string' or jsonb_typeof(a.e -> 1) <> 'string' then true
             when exists (select 1 from flowlane.steps s where s.flow_slug = a.e ->> 0 and s.step_slug = a.e ->> 1)
               then false
             else not (flowlane.is_valid_slug(a.e ->> 0) and flowlane.is_valid_slug(a.e ->> 1)) end
  order by a.o
  limit 1;
  if found then
    raise exception 'supported_pairs item % must be a pair of slugs [flow_slug, step_slug], got %',
      v_bad.pos, left(v_bad.item::text, 200) using errcode = '22023';
  end if;
  return query
    select distinct e ->> 0, e ->> 1 from jsonb_array_elements(supported_pairs) e order by 1, 2;
end;
$$;

create or replace function flowlane.json_limits() returns jsonb
language plpgsql immutable parallel safe
set search_path = ''
as $$ begin return '{"max_depth": 100, "max_bytes": 67108864}'::jsonb; end $$;

-- depth: a scalar is 0, [] and {} are 1, [[1]] is 2
create or replace function flowlane.json_depth_exceeds(value jsonb, max_depth int) returns boolean
language sql immutable parallel safe
set search_path = ''
as $$
  with recursive walk(v, depth) as (
    select value, 1 where jsonb_typeof(value) in ('array', 'object')
    union all
    select c.v, w.depth + 1
    from walk w
    cross join lateral (
      select e as v from jsonb_array_elements(case when jsonb_typeof(w.v) = 'array' then w.v else '[]' end) e
      union all
      select o.value from jsonb_each(case when jsonb_typeof(w.v) = 'object' then w.v else '{}' end) o
    ) c
    where jsonb_typeof(c.v) in ('array', 'object') and w.depth <= max_depth
  )
  select exists (select 1 from walk where depth > max_depth)
$$;

-- a row rule's failure, raised as the CHECK it stands for would be
create or replace function flowlane._rule_broken(p_table text, p_rule text) returns void
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
create or replace function flowlane._runs_rules(status text, started_at timestamptz, completed_at timestamptz,
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

-- the rules a step state keeps (one CHECK, as for runs)
create or replace function flowlane._step_states_rules(status text, remaining_deps int, initial_tasks int, remaining_tasks int,
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

-- the rules a task keeps (one CHECK, as for runs)
create or replace function flowlane._step_tasks_rules(status text, task_index int, attempts_count int, requeued_count int,
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

-- the PGMQ queue whose table a flowlane queue name maps to (PGMQ folds case)
create or replace function flowlane._pgmq_queue(p_queue text) returns text
language sql stable
set search_path = ''
as $$
  select l.queue_name from pgmq.list_queues() l
  where lower(l.queue_name) = lower(p_queue)
  order by l.queue_name = p_queue desc, l.queue_name
  limit 1
$$;

create or replace function flowlane._ensure_queue(p_queue text, p_flow_slug text, p_mode text) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_row flowlane.queues;
  v_ownership text := case when p_mode = 'explicit' then 'shared' else 'owned' end;
  v_pgmq text;
begin
  perform pg_advisory_xact_lock(hashtext('flowlane.queue:' || p_queue));
  select * into v_row from flowlane.queues q where q.queue_name = p_queue;
  v_pgmq := flowlane._pgmq_queue(p_queue);
  if found then
    if v_row.ownership = 'owned' and v_row.owner_flow_slug <> p_flow_slug then
      raise exception 'queue "%" is owned by flow "%" and cannot be used by flow "%"',
        p_queue, v_row.owner_flow_slug, p_flow_slug
        using errcode = '42501', hint = 'route this flow''s steps to another queue';
    end if;
    if v_row.ownership <> v_ownership then
      raise exception 'queue "%" is % but flow "%" (queue_mode %) needs it %',
        p_queue, v_row.ownership, p_flow_slug, p_mode, v_ownership
        using errcode = '42501',
              hint = 'a queue owned by one flow is never shared, and a shared queue is never owned';
    end if;
  else
    if v_pgmq is not null then
      raise exception 'PGMQ queue "%" already exists but is not registered with flowlane', v_pgmq
        using errcode = '42501',
              hint = format('flowlane never takes over a queue silently: adopt it with `flowlane queue adopt %s` '
                            '(flowlane.adopt_queue) or choose another queue name', p_queue);
    end if;
    insert into flowlane.queues (queue_name, ownership, owner_flow_slug, pgmq_queue_name)
    values (p_queue, v_ownership, case when v_ownership = 'owned' then p_flow_slug end, p_queue);
  end if;
  if v_pgmq is null then
    perform pgmq.create(p_queue);
  end if;
end;
$$;

create or replace function flowlane._tune_queue_table(p_queue text)
returns void
language plpgsql
security definer
set search_path = ''
as $$
begin
  if to_regclass(format('pgmq.%I', 'q_' || p_queue)) is not null then
    execute format('alter table pgmq.%I set (autovacuum_vacuum_scale_factor = 0, '
                   'autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_cost_delay = 0)',
                   'q_' || p_queue);
  end if;
exception when insufficient_privilege then
  null;  -- an adopted queue owned by another role keeps its owner's settings
end;
$$;

create or replace function flowlane._tune_registered_queue()
returns trigger
language plpgsql
security definer
set search_path = ''
as $$
begin
  perform flowlane._tune_queue_table(coalesce(new.pgmq_queue_name, new.queue_name));
  return null;
end;
$$;

-- pgmq.enable_notify_insert installs a row trigger that updates one row of
-- pgmq.notify_insert_throttle per queue on every insert: every enqueue
-- (start_flow, complete_task starting dependents) serialised on that row
-- while holding run locks, which deadlocked under load. This trigger is per
-- statement and writes nothing; PostgreSQL folds identical notifications of
-- one transaction into one. Same channel as PGMQ's: pgmq.q_<queue>.INSERT.
create or replace function flowlane._notify_queue_insert() returns trigger
language plpgsql volatile
set search_path = ''
as $$
begin
  perform pg_notify('pgmq.' || tg_table_name || '.INSERT', null);
  return null;
end;
$$;

-- idempotent; true when it installed the trigger. Drops PGMQ's throttled
-- trigger on the queue if present.
create or replace function flowlane.enable_queue_notify(queue_name text) returns boolean
language plpgsql volatile
set search_path = ''
as $$
declare
  v_pgmq text;  -- PGMQ's spelling (PGMQ folds case in table names; an adopted queue may differ)
  v_table text;
begin
  select m.queue_name into v_pgmq from pgmq.meta m
  where lower(m.queue_name) = lower(enable_queue_notify.queue_name)
  order by m.queue_name = enable_queue_notify.queue_name desc, m.queue_name limit 1;
  if not found then
    raise exception 'enable_queue_notify: queue % does not exist', coalesce(quote_literal(queue_name), 'NULL')
      using errcode = '22023';
  end if;
  v_table := pgmq.format_table_name(v_pgmq, 'q');
  -- replicas starting together: one installs the trigger, the others then see it
  perform pg_advisory_xact_lock(hashtext('flowlane.notify_insert'), hashtext(v_table));
  if exists (select 1 from pgmq.list_notify_insert_throttles() t where t.queue_name = v_pgmq) then
    perform pgmq.disable_notify_insert(v_pgmq);
  end if;
  if exists (select 1 from pg_catalog.pg_trigger tg
             where tg.tgrelid = format('pgmq.%I', v_table)::regclass
               and tg.tgname = 'flowlane_notify_insert') then
    return false;
  end if;
  execute format('create trigger flowlane_notify_insert after insert on pgmq.%I '
                 'for each statement execute function flowlane._notify_queue_insert()', v_table);
  return true;
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
  values (v_name, 'shared', null, v_pgmq, now())
  returning * into v_row;
  return v_row;
end;
$$;

-- the queue a task's message lives on: its immutable snapshot
create or replace function flowlane._task_queue(task flowlane.step_tasks) returns text
language plpgsql stable
set search_path = ''
as $$ begin return task.queue_name; end $$;

-- archive the messages of the given tasks, one call per queue
create or replace function flowlane._archive_tasks(tasks flowlane.step_tasks[]) returns int
language plpgsql volatile
set search_path = ''
as $$
declare
  v_group record;
  v_total int := 0;
  v_n int;
begin
  for v_group in
    select flowlane._task_queue(t) as queue_name, array_agg(t.message_id order by t.message_id) as ids
    from unnest(tasks) as t
    where t.message_id is not null
    group by 1
    order by 1
  loop
    select count(*) into v_n from flowlane._queue_archive_batch(v_group.queue_name, v_group.ids);
    v_total := v_total + v_n;
  end loop;
  return v_total;
end;
$$;

-- set the visibility of the given tasks' messages to now + offsets[i] seconds;
-- grouped by (queue, offset); returns the number of messages updated
create or replace function flowlane._set_tasks_vt(tasks flowlane.step_tasks[], offsets int[]) returns int
language plpgsql volatile
set search_path = ''
as $$
declare
  v_group record;
  v_total int := 0;
  v_n int;
begin
  if coalesce(cardinality(tasks), 0) <> coalesce(cardinality(offsets), 0) then
    raise exception 'internal error: % tasks but % visibility offsets',
      coalesce(cardinality(tasks), 0), coalesce(cardinality(offsets), 0);
  end if;
  for v_group in
    select flowlane._task_queue(tasks[i]) as queue_name, offsets[i] as vt_offset,
           array_agg((tasks[i]).message_id order by (tasks[i]).message_id) as ids
    from generate_subscripts(tasks, 1) as i
    where (tasks[i]).message_id is not null
    group by 1, 2
    order by 1, 2
  loop
    v_n := flowlane._queue_set_vt(v_group.queue_name, v_group.ids, v_group.vt_offset);
    v_total := v_total + v_n;
  end loop;
  return v_total;
end;
$$;

-- The queue operations: a claim's read, the archive of one message and of a batch, the
-- visibility of a batch, a task's send and a batch's. PGMQ's functions name the queue's table
-- at run time, so they build and plan their statement on every call (120-450 µs here, more
-- than the statement itself). These six are written by _write_queue_ops with one branch per
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
    update pgmq.%I m set vt = clock_timestamp() + make_interval(secs => p_vt) where m.msg_id = any (p_msg_ids);
    get diagnostics v_n = row_count;
    return v_n;
  end if;$b$, x.queue_name, x.q_table), E'\n  ' order by x.queue_name)
    into v_read, v_archive, v_send, v_send_batch, v_archive_batch, v_set_vt
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

-- a queue registered (its PGMQ table made in the same transaction) gets its branches; as the
-- owner, like the other deferred triggers of flowlane.queues: it fires at commit, where the
-- role that registered the queue may not run _write_queue_ops
create or replace function flowlane._queue_ops_registered() returns trigger
language plpgsql volatile
security definer
set search_path = ''
as $$
begin
  perform flowlane._write_queue_ops();
  return null;
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
  priority int = null
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
                                   opt_concurrency_key, opt_priority)
  values (create_flow.flow_slug, coalesce(max_attempts, flowlane._flow_option_default('max_attempts')),
          coalesce(base_delay, flowlane._flow_option_default('base_delay')),
          coalesce(timeout, flowlane._flow_option_default('timeout')), v_mode, create_flow.retention,
          create_flow.deadline, create_flow.dedup_key, create_flow.concurrency_limit,
          nullif(create_flow.concurrency_key, ''), create_flow.priority)
  on conflict on constraint flows_pkey do update
    set opt_max_attempts = excluded.opt_max_attempts,
        opt_base_delay = excluded.opt_base_delay,
        opt_timeout = excluded.opt_timeout,
        opt_retention = excluded.opt_retention,
        opt_deadline = excluded.opt_deadline,
        opt_dedup_key = excluded.opt_dedup_key,
        opt_concurrency_limit = excluded.opt_concurrency_limit,
        opt_concurrency_key = excluded.opt_concurrency_key,
        opt_priority = excluded.opt_priority
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
  concurrency_key text = null
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
           opt_concurrency_key = nullif(add_step.concurrency_key, '')
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
    opt_concurrency_limit, opt_concurrency_key)
  values (v_flow, v_step, v_type, v_index, cardinality(v_sorted_deps), max_attempts, base_delay, timeout,
    start_delay, required_input_pattern, forbidden_input_pattern, v_unmet, v_exhausted, v_queue,
    add_step.child_flow, add_step.concurrency_limit, nullif(add_step.concurrency_key, ''))
  returning * into v_row;
  insert into flowlane.deps (flow_slug, dep_slug, step_slug)
  select v_flow, d, v_step from unnest(v_sorted_deps) d;
  return v_row;
end;
$$;

create or replace function flowlane.get_flow_shape(flow_slug text) returns jsonb
language sql stable
set search_path = ''
as $$
  select jsonb_build_object(
    'queue_mode', f.queue_mode,
    'steps', coalesce((
      select jsonb_agg(jsonb_build_object(
               'slug', s.step_slug,
               'type', s.step_type,
               'needs', coalesce((select jsonb_agg(d.dep_slug order by d.dep_slug collate "C")
                                  from flowlane.deps d
                                  where d.flow_slug = s.flow_slug and d.step_slug = s.step_slug), '[]'::jsonb),
               'if', s.required_input_pattern,
               'unless', s.forbidden_input_pattern,
               'when_unmet', s.when_unmet,
               'when_exhausted', s.when_exhausted,
               'queue', s.queue_name)
             || coalesce((select jsonb_build_object('output_schema', c.schema) from flowlane.contracts c
                          where c.flow_slug = s.flow_slug and coalesce(c.step_slug, '') = s.step_slug), '{}')
             -- a child-flow step's flow is part of its shape; other steps have no such key
             || case when s.child_flow is null then '{}'::jsonb
                     else jsonb_build_object('flow', s.child_flow) end
             order by s.step_index)
      from flowlane.steps s where s.flow_slug = f.flow_slug), '[]'::jsonb))
    || coalesce((select jsonb_build_object('input_schema', c.schema) from flowlane.contracts c
                 where c.flow_slug = f.flow_slug and coalesce(c.step_slug, '') = ''), '{}')
  from flowlane.flows f
  where f.flow_slug = get_flow_shape.flow_slug
$$;

-- readable differences between the stored shape and a given one
create or replace function flowlane._shape_differences(p_db jsonb, p_given jsonb) returns text[]
language plpgsql immutable
set search_path = ''
as $$
declare
  v_out text[] := '{}';
  v_db_steps jsonb := coalesce(p_db -> 'steps', '[]'::jsonb);
  v_given_steps jsonb := coalesce(p_given -> 'steps', '[]'::jsonb);
  v_n int;
  v_key text;
  v_db_step jsonb;
  v_given_step jsonb;
  v_label text;
begin
  if jsonb_typeof(p_given) is distinct from 'object' or jsonb_typeof(v_given_steps) <> 'array' then
    raise exception 'a flow shape is a JSON object with "queue_mode" and a "steps" array, got %',
      coalesce(left(p_given::text, 200), 'null') using errcode = '22023';
  end if;
  if (p_db -> 'queue_mode') is distinct from (p_given -> 'queue_mode') then
    v_out := v_out || format('queue_mode: %s in the database, %s in the given shape',
      flowlane._shape_text(p_db -> 'queue_mode'), flowlane._shape_text(p_given -> 'queue_mode'));
  end if;
  if (p_db -> 'input_schema') is distinct from (p_given -> 'input_schema') then
    v_out := v_out || format('input_schema: %s in the database, %s in the given shape',
      flowlane._shape_text(p_db -> 'input_schema'), flowlane._shape_text(p_given -> 'input_schema'));
  end if;
  for v_key in select k from jsonb_object_keys(p_given) k
               where k not in ('queue_mode', 'steps', 'input_schema') order by k loop
    v_out := v_out || format('unknown key %s in the given shape', v_key);
  end loop;
  if jsonb_array_length(v_db_steps) <> jsonb_array_length(v_given_steps) then
    v_out := v_out || format('step count: %s in the database, %s in the given shape',
      jsonb_array_length(v_db_steps), jsonb_array_length(v_given_steps));
  end if;
  v_n := greatest(jsonb_array_length(v_db_steps), jsonb_array_length(v_given_steps));
  for i in 0 .. v_n - 1 loop
    v_db_step := v_db_steps -> i;
    v_given_step := v_given_steps -> i;
    if v_db_step is null then
      v_out := v_out || format('step %s (%s): only in the given shape', i, flowlane._shape_text(v_given_step -> 'slug'));
      continue;
    elsif v_given_step is null then
      v_out := v_out || format('step %s (%s): only in the database', i, flowlane._shape_text(v_db_step -> 'slug'));
      continue;
    end if;
    if (v_db_step -> 'slug') is distinct from (v_given_step -> 'slug') then
      v_out := v_out || format('step %s: slug is %s in the database, %s in the given shape', i,
        flowlane._shape_text(v_db_step -> 'slug'), flowlane._shape_text(v_given_step -> 'slug'));
      continue;
    end if;
    v_label := format('step %s (%s)', i, flowlane._shape_text(v_db_step -> 'slug'));
    foreach v_key in array array['type', 'needs', 'if', 'unless', 'when_unmet', 'when_exhausted', 'queue', 'output_schema', 'flow'] loop
      if (v_db_step -> v_key) is distinct from (v_given_step -> v_key) then
        v_out := v_out || format('%s: %s is %s in the database, %s in the given shape', v_label, v_key,
          flowlane._shape_text(v_db_step -> v_key), flowlane._shape_text(v_given_step -> v_key));
      end if;
    end loop;
    for v_key in select k from jsonb_object_keys(v_given_step) k
                 where k not in ('slug', 'type', 'needs', 'if', 'unless', 'when_unmet', 'when_exhausted', 'queue', 'output_schema', 'flow')
                 order by k loop
      v_out := v_out || format('%s: unknown key %s in the given shape', v_label, v_key);
    end loop;
  end loop;
  return v_out;
end;
$$;

create or replace function flowlane.verify_flow(flow_slug text, shape jsonb) returns jsonb
language plpgsql stable
set search_path = ''
as $$
declare
  v_db jsonb := flowlane.get_flow_shape(verify_flow.flow_slug);
  v_diff text[];
begin
  if v_db is null then
    return jsonb_build_object('status', 'missing', 'differences', '[]'::jsonb);
  end if;
  v_diff := flowlane._shape_differences(v_db, shape);
  return jsonb_build_object('status', case when cardinality(v_diff) = 0 then 'verified' else 'mismatch' end,
                            'differences', to_jsonb(v_diff));
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
    update flowlane.flows f set shape_sealed_at = now() where f.flow_slug = v_slug;
    return jsonb_build_object('status', 'compiled', 'differences', '[]'::jsonb);
  end if;
  v_diff := flowlane._shape_differences(flowlane.get_flow_shape(v_slug), shape);
  if cardinality(v_diff) = 0 then
    update flowlane.flows f set shape_sealed_at = now()
     where f.flow_slug = v_slug and f.shape_sealed_at is null;
    return jsonb_build_object('status', 'verified', 'differences', '[]'::jsonb);
  end if;
  return jsonb_build_object('status', 'mismatch', 'differences', to_jsonb(v_diff));
end;
$$;

create or replace function flowlane.resolve_flow(flow_slug_or_alias text) returns text
language plpgsql stable
set search_path = ''
as $$
declare
  v_slug text;
begin
  select a.flow_slug into v_slug from flowlane.aliases a where a.alias = flow_slug_or_alias;
  if found then
    return v_slug;
  end if;
  select f.flow_slug into v_slug from flowlane.flows f where f.flow_slug = flow_slug_or_alias;
  if not found then
    raise exception 'unknown flow "%" (no flow or alias has this slug)', flow_slug_or_alias
      using errcode = 'P0002',
            hint = 'create the flow (apply its compiled SQL) or its alias before starting runs';
  end if;
  return v_slug;
end;
$$;

-- Flow and alias slugs share one case-insensitive namespace, with one exception: an alias
-- may take the name of a flow it lists as a version (active or draining), spelled the
-- same. The alias adopts the name: a project that started with a bare concrete slug
-- (`hello`) puts its next version behind an alias `hello` (active hello_v2, draining
-- hello) and callers keep their name, which now resolves to the alias (resolve_flow).
create or replace function flowlane._alias_may_take_flow_name(alias text, flow_slug text, versions text[])
returns boolean
language sql immutable
set search_path = ''
as $$
  select _alias_may_take_flow_name.alias = _alias_may_take_flow_name.flow_slug
     and _alias_may_take_flow_name.flow_slug = any (_alias_may_take_flow_name.versions)
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
    set flow_slug = excluded.flow_slug, draining = excluded.draining, updated_at = clock_timestamp()
  returning * into v_row;
  insert into flowlane.alias_history (alias, flow_slug, draining)
  values (v_alias, v_active, v_draining);
  return v_row;
end;
$$;

-- a new flow may not take the name of an alias (case-insensitive); the flow an alias
-- adopted the name of is the one exception (create_flow's upsert when it is applied again)
create or replace function flowlane._forbid_flow_named_like_alias() returns trigger
language plpgsql
set search_path = ''
as $$
declare
  v_alias text;
begin
  select a.alias into v_alias from flowlane.aliases a
  where lower(a.alias) = lower(new.flow_slug)
    and not flowlane._alias_may_take_flow_name(a.alias, new.flow_slug, array[a.flow_slug] || a.draining);
  if found then
    raise exception 'flow slug "%" conflicts with alias "%" (flow and alias slugs share one namespace)',
      new.flow_slug, v_alias using errcode = '23505';
  end if;
  return new;
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
       set draining = array_remove(a.draining, old.flow_slug), updated_at = clock_timestamp()
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
begin
  v_runs := array(select r.run_id from flowlane.runs r where r.flow_slug = delete_flow_and_data.flow_slug
                  order by r.run_id for update);
  select coalesce(array_agg(t order by t.queue_name, t.message_id), '{}') into v_active
  from flowlane.step_tasks t
  where t.run_id = any (v_runs) and t.status in ('queued', 'started');
  perform flowlane._archive_tasks(v_active);
  delete from flowlane.step_tasks t where t.run_id = any (v_runs);
  delete from flowlane.step_states ss where ss.run_id = any (v_runs);
  delete from flowlane.runs r where r.run_id = any (v_runs);
  delete from flowlane.deps d where d.flow_slug = delete_flow_and_data.flow_slug;
  delete from flowlane.steps s where s.flow_slug = delete_flow_and_data.flow_slug;
  delete from flowlane.flows f where f.flow_slug = delete_flow_and_data.flow_slug;
end;
$$;

-- Definition changes are announced: every row change of flows, steps,
-- dependencies, aliases or queues (and a worker deployment's existence or enabled
-- flag, 09_fleet.sql) notifies the channel flowlane_definitions with the table's
-- name, delivered when its transaction commits, once per table and transaction
-- (PostgreSQL folds repeats). Workers re-check their coverage when notified and
-- `flowlane serve` derives its set of workers again. Nothing here changes a definition.
create or replace function flowlane._notify_definitions_changed()
returns trigger
language plpgsql
set search_path = ''
as $$
begin
  perform pg_notify('flowlane_definitions', tg_table_name);
  return null;
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
  select * into v_run from flowlane._create_runs(v_flow, array[input], array[start_flow.run_id],
                                                 start_flow.start_at, array[v_key], start_flow.flow_slug,
                                                 start_flow.priority);
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
  if exists (select 1 from flowlane.flows f where f.flow_slug = v_flow and f.opt_dedup_key is not null) then
    -- each input's key may name an earlier run (or an earlier input of this call)
    for v_i in select i from generate_subscripts(inputs, 1) i order by i loop
      return next flowlane.start_flow(start_flows.flow_slug, inputs[v_i], null, start_flows.start_at, null,
                                      start_flows.priority);
    end loop;
    return;
  end if;
  return query select * from flowlane._create_runs(v_flow, inputs, '{}', start_flows.start_at, null, null,
                                                   start_flows.priority);
end;
$$;

-- the checks of a run input that need the flow (null, root map needs an array); p_what names the input
create or replace function flowlane._check_start_input(p_flow text, p_input jsonb, p_what text) returns void
language plpgsql stable
set search_path = ''
as $$
declare
  v_root_map text;
begin
  if p_input is null then
    raise exception '%: input must not be null (use {} for no input)', p_what using errcode = '22004';
  end if;
  select s.step_slug into v_root_map from flowlane.steps s
  where s.flow_slug = p_flow and s.step_type = 'map' and s.deps_count = 0
  order by s.step_index limit 1;
  if found and jsonb_typeof(p_input) <> 'array' then
    raise exception '%: root map step "%" maps the run input, which must be a JSON array, got %',
      p_what, v_root_map, jsonb_typeof(p_input) using errcode = '22023';
  end if;
end;
$$;

-- new runs of one concrete flow (inputs checked by the caller); returns them in input order
-- p_start_at in the future: the runs wait (status waiting) for the maintenance tick;
-- p_keys: each run's idempotency key within p_called (the name the caller started);
-- p_priority: the runs' priority (null: the flow's). A flow with a concurrency limit: under
-- the keys' locks, a run begins while its key has room and no run held before it; the
-- others are held (waiting, hold_seq in input order)
create or replace function flowlane._create_runs(p_flow text, p_inputs jsonb[], p_run_ids uuid[],
                                      p_start_at timestamptz = null, p_keys text[] = null,
                                      p_called text = null, p_priority int = null)
returns setof flowlane.runs
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set plan_cache_mode = force_generic_plan
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_ids uuid[];
  v_waiting boolean := coalesce(p_start_at > now(), false);
  v_flow flowlane.flows;
  v_slot_keys text[];
  v_begins boolean[];
  v_run flowlane.runs;
begin
  perform flowlane._check_contract_inputs(p_flow, p_inputs);
  select * into v_flow from flowlane.flows f where f.flow_slug = p_flow;
  if cardinality(p_inputs) = 1 and not v_waiting and v_flow.opt_concurrency_limit is null then
    v_run := flowlane._start_one_run(v_flow, p_inputs[1], p_run_ids[1], p_start_at, p_keys[1], p_called, p_priority);
    if v_run.run_id is not null then
      return next v_run;
      return;
    end if;
  end if;
  v_ids := array(select coalesce(p_run_ids[i], gen_random_uuid()) from generate_subscripts(p_inputs, 1) i order by i);
  if v_flow.opt_concurrency_limit is not null then
    v_slot_keys := array(select flowlane._concurrency_key(v_flow.opt_concurrency_key, p_inputs[i])
                         from generate_subscripts(p_inputs, 1) i order by i);
  end if;
  if v_flow.opt_concurrency_limit is not null and not v_waiting then
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
                             deadline_at, called_as, idempotency_key, priority, concurrency_key, hold_seq)
  select v_ids[i], p_flow, p_inputs[i], (select count(*) from flowlane.steps s where s.flow_slug = p_flow),
         flowlane._trace_parent(),
         case when v_waiting or not coalesce(v_begins[i], true) then 'waiting' else 'started' end, p_start_at,
         case when v_waiting or not coalesce(v_begins[i], true) then null else flowlane._run_deadline(p_flow, now()) end,
         case when p_keys[i] is not null then p_called end, p_keys[i],
         coalesce(p_priority, v_flow.opt_priority, 0), v_slot_keys[i],
         case when not v_waiting and not coalesce(v_begins[i], true) then nextval('flowlane.hold_seq') end
  from generate_subscripts(p_inputs, 1) i order by i;
  insert into flowlane.step_states (flow_slug, run_id, step_slug, remaining_deps, initial_tasks)
  select p_flow, v_ids[i], s.step_slug, s.deps_count,
         case when s.step_type <> 'map' then 1
              when s.deps_count = 0 and jsonb_typeof(p_inputs[i]) = 'array' then jsonb_array_length(p_inputs[i])
              else null end
  from generate_subscripts(p_inputs, 1) i, flowlane.steps s
  where s.flow_slug = p_flow
  order by v_ids[i], s.step_slug;
  if not v_waiting then
    perform flowlane._progress_runs(array(select v_ids[i] from generate_subscripts(v_ids, 1) i
                                          where coalesce(v_begins[i], true) order by v_ids[i]));
  end if;
  return query select r.* from unnest(v_ids) with ordinality as u (run_id, ord)
               join flowlane.runs r
                 on r.run_id = u.run_id and r.run_id = any (array(select x from unnest(v_ids) x order by 1))
               order by u.ord;
end;
$$;

-- _create_runs for one run that begins now, of a flow without a concurrency limit whose root
-- steps need nothing resolved first (a queue, no condition, no map over an empty input): the
-- run and its step states are written in their final state, root steps started, one
-- statement each, instead of the batch's generic statements. Null when the flow does not
-- qualify: the caller takes the batch path. tests/core/test_one_start.py and the differential
-- test (tests/core/test_differential.py) compare the two.
create or replace function flowlane._start_one_run(p_flow flowlane.flows, p_input jsonb, p_run_id uuid,
                                        p_start_at timestamptz, p_key text, p_called text, p_priority int)
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
begin
  select count(*), coalesce(bool_and(s.deps_count > 0 or (s.queue_name is not null
                                     and s.required_input_pattern is null and s.forbidden_input_pattern is null
                                     and (s.step_type = 'single' or (s.step_type = 'map' and v_elements > 0)))), false)
    into v_steps, v_plain
  from flowlane.steps s where s.flow_slug = (p_flow).flow_slug;
  if not v_plain then
    return null;
  end if;
  insert into flowlane.runs (run_id, flow_slug, input, remaining_steps, trace_parent, status, start_at, deadline_at,
                             called_as, idempotency_key, priority)
  values (coalesce(p_run_id, gen_random_uuid()), (p_flow).flow_slug, p_input, v_steps, flowlane._trace_parent(),
          'started', p_start_at, flowlane._run_deadline((p_flow).flow_slug, now()),
          case when p_key is not null then p_called end, p_key, coalesce(p_priority, (p_flow).opt_priority, 0))
  returning * into v_run;
  with written as (
    insert into flowlane.step_states as ss (flow_slug, run_id, step_slug, remaining_deps, initial_tasks, status,
                                            started_at, remaining_tasks)
    select s.flow_slug, v_run.run_id, s.step_slug, s.deps_count, t.tasks,
           case when s.deps_count = 0 then 'started' else 'created' end,
           case when s.deps_count = 0 then now() end,
           case when s.deps_count = 0 then t.tasks end
    from flowlane.steps s
    cross join lateral (  -- a dependent map's count is known when its parent completes
      select case when s.step_type <> 'map' then 1 when s.deps_count = 0 then v_elements end as tasks) t
    where s.flow_slug = (p_flow).flow_slug
    order by s.step_slug
    returning ss
  ) select array_agg(w.ss) filter (where (w.ss).status = 'started') into v_started from written w;
  perform flowlane._enqueue_started(v_started);
  return v_run;
end;
$$;

create or replace function flowlane._check_run_input() returns trigger
language plpgsql volatile
set search_path = ''
as $$
begin
  perform flowlane._check_json_limits(new.input, format('start_flow(%s): the run input', new.flow_slug),
    'flatten the input; workers refuse JSON nested deeper than the limit');
  return new;
end;
$$;

-- the size and depth limits of JSON that comes in (a run input, a signal's payload);
-- p_what names it in the error ("start_flow(f): the run input")
create or replace function flowlane._check_json_limits(p_value jsonb, p_what text, p_flatten_hint text) returns void
language plpgsql immutable
set search_path = ''
as $$
declare
  v_max_depth int := (flowlane.json_limits() ->> 'max_depth')::int;
  v_max_bytes int := (flowlane.json_limits() ->> 'max_bytes')::int;
  v_text text := p_value::text;
  v_bytes int := octet_length(v_text);
begin
  if v_bytes > v_max_bytes then
    raise exception '% is % bytes of JSON, more than the limit of % bytes', p_what, v_bytes, v_max_bytes
      using errcode = '22023', hint = 'pass a reference (a URL, a storage key) instead of the data itself';
  end if;
  -- a value cannot be nested deeper than its text has '[' and '{': most never need the walk
  if length(v_text) - length(translate(v_text, '[{', '')) > v_max_depth
     and flowlane.json_depth_exceeds(p_value, v_max_depth) then
    raise exception '% is nested deeper than % levels', p_what, v_max_depth
      using errcode = '22023', hint = p_flatten_hint;
  end if;
end;
$$;

create or replace function flowlane._progress(p_run_id uuid) returns void
language sql volatile
set search_path = ''
as $$ select flowlane._progress_runs(array[p_run_id]) $$;

-- _progress for many runs: conditions and empty maps are resolved run by run
-- (_advance) only where a ready step has one; then ready steps start together
create or replace function flowlane._progress_runs(p_run_ids uuid[]) returns void
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set plan_cache_mode = force_generic_plan
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_run uuid;
begin
  for v_run in
    select distinct ss.run_id
    from flowlane.step_states ss
    join flowlane.steps s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
    where ss.run_id = any (p_run_ids) and ss.status = 'created' and ss.remaining_deps = 0
      and (ss.initial_tasks = 0 or s.required_input_pattern is not null or s.forbidden_input_pattern is not null)
    order by 1
  loop
    perform flowlane._advance(v_run);
  end loop;
  perform flowlane._start_ready_steps(p_run_ids);
  -- most calls (every start of a flow with steps) have no run to complete: ask first, in a
  -- statement planned once, instead of calling the update
  if exists (select 1 from flowlane.runs r
             where r.run_id = any (p_run_ids) and r.status = 'started' and r.remaining_steps = 0) then
    perform flowlane._maybe_complete_runs(p_run_ids);
  end if;
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
      coalesce((select jsonb_object_agg(d.dep_slug, ps.output)
                from flowlane.deps d
                join flowlane.step_states ps on ps.run_id = p_run_id and ps.step_slug = d.dep_slug
                where d.flow_slug = s.flow_slug and d.step_slug = s.step_slug and ps.status = 'completed'),
               '{}'::jsonb) end
    from flowlane.runs r
    join flowlane.steps s on s.flow_slug = r.flow_slug and s.step_slug = p_step_slug
    where r.run_id = p_run_id);
end;
$$;

-- public, unchanged contract: locks the run, starts its ready steps
create or replace function flowlane.start_ready_steps(run_id uuid) returns void
language plpgsql volatile
set search_path = ''
as $$
begin
  perform 1 from flowlane.runs r where r.run_id = start_ready_steps.run_id for update;
  perform flowlane._start_ready_steps(array[start_ready_steps.run_id]);
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
       set status = 'started', started_at = now(), remaining_tasks = ss.initial_tasks
      from ready
     where ss.run_id = ready.run_id and ss.step_slug = ready.step_slug and ss.run_id = any (p_run_ids)
    returning ss
  ) select coalesce(array_agg(st.ss), '{}') into v_started from started st;
  if cardinality(v_started) > 0 then
    perform flowlane._enqueue_started(v_started);
  end if;
end;
$$;

-- the tasks of steps just started (their runs' locks held): one _send_tasks per (queue, start
-- delay), which holds back those over a step's concurrency limit; wait and child-flow steps
-- begin instead
create or replace function flowlane._enqueue_started(p_started flowlane.step_states[]) returns void
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
           bool_or(s.opt_concurrency_limit is not null) as limited
    from unnest(p_started) st
    join flowlane.steps s on s.flow_slug = st.flow_slug and s.step_slug = st.step_slug
    join flowlane.runs r on r.run_id = st.run_id
    cross join lateral generate_series(0, st.initial_tasks - 1) as k
    group by 1, 2
    order by 1, 2
  loop
    if v_group.queue_name is null then  -- wait and child-flow steps: no task (17_waits.sql, 18_children.sql)
      perform flowlane._begin_waits(p_started);
      perform flowlane._start_children(p_started);
      continue;
    end if;
    -- a step with a concurrency limit: tasks over its key's limit are held (19_flow_control.sql)
    perform flowlane._send_tasks(v_group.queue_name,
      case when v_group.limited then flowlane._take_step_slots(v_group.bodies) else v_group.bodies end,
      v_group.start_delay);
  end loop;
end;
$$;

-- a step skipped because its handler failed keeps that failure's message
create or replace function flowlane._keep_skip_error() returns trigger
language plpgsql volatile
set search_path = ''
as $$
begin
  select t.error_message into new.error_message
  from flowlane.step_tasks t
  where t.run_id = new.run_id and t.step_slug = new.step_slug and t.status = 'failed'
  order by t.failed_at desc, t.task_index
  limit 1;
  return new;
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
  update flowlane.runs r set status = 'failed', failed_at = now(), error_message = p_error
   where r.run_id = p_run_id and r.status = 'started';
  with cancelled as (
    update flowlane.step_tasks t set status = 'cancelled', cancelled_at = now()
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
  update flowlane.step_states ss
     set status = 'cancelled', cancelled_at = greatest(now(), coalesce(ss.started_at, ss.created_at))
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
     set status = 'completed', completed_at = now(), output = coalesce(o.output, '{}'::jsonb)
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
  return query
  select ss.run_id, jsonb_object_agg(ss.step_slug, ss.output)
  from flowlane.step_states ss
  where ss.run_id = any (p_run_ids) and ss.status = 'completed'
    and not exists (select 1 from flowlane.deps d
                    where d.flow_slug = ss.flow_slug and d.dep_slug = ss.step_slug)
  group by ss.run_id;
end;
$$;

-- flowlane_run_finished: a notification per finished run, from one trigger call per statement (same channel,
-- same payload: the run's id), while a session listens through listen_run_finished. Nobody
-- listening, none is sent: a commit that notifies holds the lock that serialises every
-- notifying commit in the cluster through its WAL flush, and starts (the queue's insert
-- notification) already take their turns there.
create or replace function flowlane._notify_run_finished() returns trigger
language plpgsql volatile
set search_path = ''
as $$
declare
  v_ended uuid[];
begin
  select array_agg(n.run_id order by n.run_id) into v_ended
  from new_runs n join old_runs o on o.run_id = n.run_id
  where o.status = 'started' and n.status <> 'started';
  if v_ended is null then
    return null;
  end if;
  -- held until this transaction ends (notifiers share it): a session that starts listening
  -- meanwhile waits for this commit, then reads the runs as ended
  perform pg_advisory_xact_lock_shared(hashtext('flowlane.run_finished_notifiers'), 0);
  -- free for an instant: no session listens (each holds it shared while it listens; this
  -- one's own shared hold would not conflict, hence the channel check)
  if not 'flowlane_run_finished' = any (array(select pg_listening_channels()))
     and pg_try_advisory_lock(hashtext('flowlane.run_finished_listeners'), 0) then
    perform pg_advisory_unlock(hashtext('flowlane.run_finished_listeners'), 0);
    return null;
  end if;
  perform pg_notify('flowlane_run_finished', e.run_id::text)
  from unnest(v_ended) with ordinality as e (run_id, ord)
  order by e.ord;
  return null;
end;
$$;

-- LISTEN flowlane_run_finished and count as a listener (the listeners' lock, shared, held by
-- the session until unlisten_run_finished or its end); then read the runs it waits for
create or replace function flowlane.listen_run_finished() returns void
language plpgsql volatile
set search_path = ''
as $$
begin
  if 'flowlane_run_finished' = any (array(select pg_listening_channels())) then
    return;
  end if;
  perform pg_advisory_lock_shared(hashtext('flowlane.run_finished_listeners'), 0);
  -- the runs that ended before this session counted may not have been notified: wait until
  -- their transactions end, so that reading them afterwards finds them ended
  perform pg_advisory_lock(hashtext('flowlane.run_finished_notifiers'), 0);
  perform pg_advisory_unlock(hashtext('flowlane.run_finished_notifiers'), 0);
  listen flowlane_run_finished;
end;
$$;

create or replace function flowlane.unlisten_run_finished() returns void
language plpgsql volatile
set search_path = ''
as $$
begin
  if not 'flowlane_run_finished' = any (array(select pg_listening_channels())) then
    return;
  end if;
  unlisten flowlane_run_finished;
  perform pg_advisory_unlock_shared(hashtext('flowlane.run_finished_listeners'), 0);
end;
$$;

-- a worker's claim: read up to qty messages of its queue and start their tasks, in one round
-- trip; the claim keeps the visibility the read gave (see _start_tasks). A queue with limits
-- (19_flow_control.sql) reads at most what they allow; when they allow nothing the claim
-- returns one row instead: 'at_capacity' (the queue's concurrency is reached: a task's end
-- wakes the queue's listeners) or 'rate_limited' (input {"wait_ms": N}: no start is allowed
-- for N ms). A queue that has seen a priority is read in priority order.
create or replace function flowlane.claim_tasks(queue_name text, qty int, worker_id uuid, supported_pairs jsonb)
returns setof flowlane.claim_record
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set plan_cache_mode = force_generic_plan
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_flows text[];
  v_steps text[];
  v_lease int;
  v_ids bigint[];
  v_later bigint[];
  v_gate flowlane._queue_gate;
  v_rows flowlane.claim_record[];
  v_one flowlane.claim_record;
begin
  perform flowlane._check_queue_argument('claim_tasks', claim_tasks.queue_name);
  perform flowlane._check_worker_argument('claim_tasks', claim_tasks.worker_id);
  if qty is null or qty < 1 then
    raise exception 'claim_tasks: qty must be at least 1' using errcode = '22023';
  end if;
  select coalesce(array_agg(p.flow_slug), '{}'), coalesce(array_agg(p.step_slug), '{}') into v_flows, v_steps
  from flowlane._pairs(supported_pairs) p;
  select coalesce(max(o.claim_visibility), 0) into v_lease
  from unnest(v_flows, v_steps) as p (flow_slug, step_slug)
  join flowlane.step_options o on o.flow_slug = p.flow_slug and o.step_slug = p.step_slug;
  v_gate := flowlane._open_queue_gate(claim_tasks.queue_name, qty);
  if (v_gate.refusal).outcome is not null then
    return next v_gate.refusal;
    return;
  end if;
  if coalesce(v_gate.prioritized, false) then
    select coalesce(array_agg(m.msg_id) filter (where m.enqueued_at <= now()), '{}'),
           coalesce(array_agg(m.msg_id) filter (where m.enqueued_at > now()), '{}')
      into v_ids, v_later
    from flowlane._read_by_priority(claim_tasks.queue_name, v_lease, v_gate.allowed) m;
  else
    select coalesce(array_agg(m.msg_id) filter (where m.enqueued_at <= now()), '{}'),
           coalesce(array_agg(m.msg_id) filter (where m.enqueued_at > now()), '{}')
      into v_ids, v_later
    from flowlane._queue_read(claim_tasks.queue_name, v_lease, v_gate.allowed) m;
  end if;
  if cardinality(v_later) > 0 then
    -- enqueued by a transaction that committed after this one began (the read takes a
    -- new snapshot): a claim now would start the task before it was queued. Visible
    -- again at once; the next poll, a new transaction, claims it.
    perform pgmq.set_vt(claim_tasks.queue_name, v_later, 0);
  end if;
  if cardinality(v_ids) = 0 then
    perform flowlane._close_queue_gate(v_gate, 0);
    return;
  end if;
  if cardinality(v_ids) = 1 then
    v_one := flowlane._claim_one(claim_tasks.queue_name, v_ids[1], claim_tasks.worker_id, v_flows, v_steps,
                                 v_lease, v_gate.started_at);
    if v_one.outcome is not null then
      if v_gate.limited then
        perform flowlane._close_queue_gate(v_gate, 1);
      end if;
      return next v_one;
      return;
    end if;
  end if;
  if not v_gate.limited then
    return query select * from flowlane._claim_batch(claim_tasks.queue_name, v_ids, claim_tasks.worker_id,
                                                     v_flows, v_steps, v_lease, null);
    return;
  end if;
  v_rows := array(select c from flowlane._claim_batch(claim_tasks.queue_name, v_ids, claim_tasks.worker_id,
                                                      v_flows, v_steps, v_lease, v_gate.started_at) c);
  perform flowlane._close_queue_gate(v_gate, (select count(*)::int from unnest(v_rows) r where r.outcome = 'claimed'));
  return query select * from unnest(v_rows);
end;
$$;

create or replace function flowlane.start_tasks(queue_name text, msg_ids bigint[], worker_id uuid, supported_pairs jsonb)
returns setof flowlane.claim_record
language plpgsql volatile
set search_path = ''
set plan_cache_mode = force_generic_plan
as $$
declare
  v_flows text[];
  v_steps text[];
  v_gate flowlane._queue_gate;
  v_ids bigint[];
  v_rows flowlane.claim_record[];
  v_one flowlane.claim_record;
begin
  perform flowlane._check_queue_argument('start_tasks', start_tasks.queue_name);
  perform flowlane._check_worker_argument('start_tasks', start_tasks.worker_id);
  select coalesce(array_agg(p.flow_slug), '{}'), coalesce(array_agg(p.step_slug), '{}') into v_flows, v_steps
  from flowlane._pairs(supported_pairs) p;
  if not exists (select 1 from flowlane.queue_limits l where l.queue_name = start_tasks.queue_name) then
    if cardinality(msg_ids) = 1 and msg_ids[1] is not null then
      v_one := flowlane._claim_one(start_tasks.queue_name, msg_ids[1], worker_id, v_flows, v_steps, null, null);
      if v_one.outcome is not null then
        return next v_one;
        return;
      end if;
    end if;
    return query select * from flowlane._start_tasks(start_tasks.queue_name, msg_ids, worker_id, v_flows, v_steps, null);
    return;
  end if;
  -- a queue with limits: the first messages it allows start, the others are handed back visible
  v_gate := flowlane._open_queue_gate(start_tasks.queue_name, greatest(1, coalesce(cardinality(msg_ids), 0)));
  v_ids := array(select distinct m from unnest(msg_ids) m where m is not null order by m);
  if (v_gate.refusal).outcome is not null then
    perform pgmq.set_vt(start_tasks.queue_name, v_ids, 0);
    return next v_gate.refusal;
    return;
  end if;
  if cardinality(v_ids) > v_gate.allowed then
    perform pgmq.set_vt(start_tasks.queue_name, v_ids[v_gate.allowed + 1:], 0);
    v_ids := v_ids[1:v_gate.allowed];
  end if;
  select coalesce(array_agg(c), '{}') into v_rows
  from flowlane._start_tasks(start_tasks.queue_name, v_ids, worker_id, v_flows, v_steps, null, v_gate.started_at) c;
  perform flowlane._close_queue_gate(v_gate, (select count(*)::int from unnest(v_rows) r where r.outcome = 'claimed'));
  return query select * from unnest(v_rows);
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

  -- lock order: runs (shared: claims do not block each other), then the batch's tasks
  perform 1 from flowlane.runs r
  where r.run_id in (select t.run_id from flowlane.step_tasks t
                     where t.queue_name = p_queue and t.message_id = any (v_ids)
                       and t.message_id between v_ids[1] and v_ids[cardinality(v_ids)])
  order by r.run_id
  for share;
  perform 1 from flowlane.step_tasks t
  where t.queue_name = p_queue and t.message_id = any (v_ids)
    and t.message_id between v_ids[1] and v_ids[cardinality(v_ids)]
  order by t.run_id, t.step_slug, t.task_index
  for update;

  -- classify every message before any change
  select array_agg(row(b.msg_id, t, t.run_id is not null and p.flow_slug is not null,
                       t.status = 'queued' and r.status = 'started' and ss.status = 'started'
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

  -- terminal tasks: their message is archived (idempotent)
  if exists (select 1 from unnest(v_batch) c
             where (c.task).status in ('completed', 'failed', 'skipped', 'cancelled')) then
    perform pgmq.archive(p_queue, array(
      select c.msg_id from unnest(v_batch) c
      where (c.task).status in ('completed', 'failed', 'skipped', 'cancelled') order by c.msg_id));
  end if;
  -- still started (a visible duplicate): no attempt; hidden until stalled recovery may take it
  if exists (select 1 from unnest(v_batch) c where (c.task).status = 'started') then
    select array_agg(c.task order by c.msg_id),
           array_agg(greatest(1, ceil(extract(epoch from
                       flowlane._stall_deadline(c.task, o.stall_after) - clock_timestamp()))::int) order by c.msg_id)
      into v_duplicates, v_offsets
    from unnest(v_batch) c
    join flowlane.step_options o on o.flow_slug = (c.task).flow_slug and o.step_slug = (c.task).step_slug
    where (c.task).status = 'started';
    perform flowlane._set_tasks_vt(v_duplicates, v_offsets);
  end if;

  with claimed as (
    update flowlane.step_tasks t
       set status = 'started', attempts_count = t.attempts_count + 1, started_at = coalesce(p_started_at, now()),
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

-- claimed tasks are hidden for their lease (claim_visibility) where it outlasts the visibility
-- their messages were read with (p_read_vt; null: start_tasks, whose caller read them)
create or replace function flowlane._hide_claimed(p_claimed flowlane.step_tasks[], p_read_vt int) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_hide flowlane.step_tasks[];
  v_offsets int[];
  v_updated int;
begin
  select coalesce(array_agg(c order by c.message_id), '{}'), coalesce(array_agg(l.lease order by c.message_id), '{}')
    into v_hide, v_offsets
  from unnest(p_claimed) c
  join (select o.flow_slug, o.step_slug, o.claim_visibility as lease
        from (select distinct x.flow_slug, x.step_slug from unnest(p_claimed) x) p
        join flowlane.step_options o on o.flow_slug = p.flow_slug and o.step_slug = p.step_slug) l
    on l.flow_slug = c.flow_slug and l.step_slug = c.step_slug
  where p_read_vt is null or l.lease > p_read_vt;
  if cardinality(v_hide) = 0 then
    return;
  end if;
  v_updated := flowlane._set_tasks_vt(v_hide, v_offsets);
  if v_updated <> cardinality(v_hide) then
    raise exception 'claim aborted: % tasks claimed but % queue messages got their visibility extended',
      cardinality(v_hide), v_updated
      using errcode = '40001', hint = 'a task''s message is missing from its queue; the claim was rolled back';
  end if;
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
  -- lock order: the run (shared), then the task
  select r.status into v_run_status from flowlane.runs r where r.run_id = v_task.run_id for share;
  select t.* into v_task from flowlane.step_tasks t
  where t.run_id = v_task.run_id and t.step_slug = v_task.step_slug and t.task_index = v_task.task_index
  for update;
  select ss.status into v_step_status from flowlane.step_states ss
  where ss.run_id = v_task.run_id and ss.step_slug = v_task.step_slug;
  if (v_task.status = 'queued' and v_run_status = 'started' and v_step_status = 'started') is not true then
    return null;
  end if;
  update flowlane.step_tasks t
     set status = 'started', attempts_count = t.attempts_count + 1, started_at = coalesce(p_started_at, now()),
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

-- the rows of a claim of the messages read: the claimed tasks (a run's input on its first row
-- only) and, for a refused batch, the other messages read, handed back visible (ids only)
create or replace function flowlane._claim_batch(p_queue text, p_ids bigint[], p_worker_id uuid, p_flows text[],
                                      p_steps text[], p_lease int, p_started_at timestamptz)
returns setof flowlane.claim_record
language plpgsql volatile
set search_path = ''
as $$
begin
  return query
  with c as (
    select * from flowlane._start_tasks(p_queue, p_ids, p_worker_id, p_flows, p_steps, p_lease, p_started_at)
  )
  select c.outcome, c.flow_slug, c.step_slug, c.queue_name, c.run_id, c.task_index, c.input,
         case when row_number() over (partition by c.run_id order by c.msg_id) = 1 then c.flow_input end,
         c.attempt, c.msg_id
  from c
  union all
  select 'handed_back', null, null, p_queue, null, null, null, null, null, m.id
  from unnest(p_ids) as m (id)
  where exists (select 1 from c where c.outcome = 'unsupported')
    and not exists (select 1 from c where c.msg_id = m.id)
  order by 10;
end;
$$;

-- the stall deadline of a started task: its step's stall_after seconds (step_options) after
-- the later of its claim and its last lease extension
create or replace function flowlane._stall_deadline(p_task flowlane.step_tasks, p_stall_after int) returns timestamptz
language sql immutable
set search_path = ''
as $$
  select greatest(p_task.started_at, p_task.lease_renewed_at) + make_interval(secs => p_stall_after)
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
             (select ps.output -> t.task_index
              from flowlane.deps d
              join flowlane.step_states ps on ps.run_id = t.run_id and ps.step_slug = d.dep_slug
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

-- the leases, kept per statement: a task has a lease while it is started, renewed (deleted and inserted again) when a started task gets a new started_at
create or replace function flowlane._track_leases() returns trigger
language plpgsql volatile
set search_path = ''
as $$
declare
  v_woken bigint;
begin
  -- (each statement names only the transition tables its event has)
  if tg_op = 'INSERT' then
    insert into flowlane.task_leases (run_id, step_slug, task_index, started_at, queue_name)
    select n.run_id, n.step_slug, n.task_index, n.started_at, n.queue_name
    from new_tasks n where n.status = 'started' order by 1, 2, 3;
  elsif tg_op = 'DELETE' then
    delete from flowlane.task_leases l
     using old_tasks o
     where o.status = 'started'
       and l.run_id = o.run_id and l.step_slug = o.step_slug and l.task_index = o.task_index;
  else
    -- a started task that ends frees a slot of its queue's concurrency: its workers look again
    with gone as (
      delete from flowlane.task_leases l
       using old_tasks o join new_tasks n
             on n.run_id = o.run_id and n.step_slug = o.step_slug and n.task_index = o.task_index
       where o.status = 'started'
         and (n.status <> 'started' or n.started_at is distinct from o.started_at)
         and l.run_id = o.run_id and l.step_slug = o.step_slug and l.task_index = o.task_index
      returning l.queue_name
    )
    select count(flowlane._wake_queue(g.queue_name)) into v_woken
    from (select distinct g.queue_name from gone g) g
    where exists (select 1 from flowlane.queue_limits q where q.queue_name = g.queue_name and q.concurrency is not null);
    insert into flowlane.task_leases (run_id, step_slug, task_index, started_at, queue_name)
    select n.run_id, n.step_slug, n.task_index, n.started_at, n.queue_name
    from new_tasks n join old_tasks o
         on o.run_id = n.run_id and o.step_slug = n.step_slug and o.task_index = n.task_index
    where n.status = 'started'
      and (o.status <> 'started' or o.started_at is distinct from n.started_at)
    order by 1, 2, 3;
  end if;
  return null;
end;
$$;

-- called by a worker for the tasks it holds: items {run_id, step_slug,
-- task_index, attempt, running}. A task still owned by this worker and
-- attempt gets lease_renewed_at = now() and its message hidden until the new
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
      and (not i.running or now() < t.started_at + make_interval(secs => o.timeout))
    order by t.run_id, t.step_slug, t.task_index
    for update of t skip locked
  ), renewed as (
    update flowlane.step_tasks t set lease_renewed_at = now()
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

create or replace function flowlane.complete_tasks(results jsonb) returns setof flowlane.step_tasks
language plpgsql volatile
set search_path = ''
as $$
begin
  return query select * from flowlane._complete_batch(flowlane._result_items('complete_tasks', results,
    '{run_id, step_slug, task_index, output, worker_id, attempt}'));
end;
$$;

create or replace function flowlane.complete_task(
  run_id uuid, step_slug text, task_index int, output jsonb, worker_id uuid = null, attempt int = null
) returns setof flowlane.step_tasks
language plpgsql volatile
set search_path = ''
as $$
begin
  return query select * from flowlane._complete_batch(array[row(0, complete_task.run_id, complete_task.step_slug,
    complete_task.task_index, complete_task.output, complete_task.worker_id, complete_task.attempt,
    null, null, null)::flowlane._result_item]);
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
                            or coalesce(jsonb_typeof(e -> 'task_index'), 'null') = 'null'), false)
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
  end loop;
  raise exception '%: an item could not be read', p_function using errcode = 'XX000';
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
    select i, t, r.status as run_status,
           t.status = 'started' and r.status = 'started' and ss.status = 'started'
             and (i.worker_id is null or t.last_worker_id is not distinct from i.worker_id)
             and (i.attempt is null or t.attempts_count = i.attempt) as owns
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

create or replace function flowlane._sequential_runs(p_classes flowlane._result_class[], p_enders flowlane._result_class[])
returns uuid[]
language plpgsql stable
set search_path = ''
as $$
begin
  return (select coalesce(array_agg(distinct e.run_id), '{}')
  from (
    select (x.task).run_id from unnest(p_enders) x
    union all
    select (c.task).run_id from unnest(p_classes) c
    where c.actionable and exists (
      select 1 from flowlane.steps s
      where s.flow_slug = (c.task).flow_slug
        and s.when_unmet = 'fail'
        and (s.required_input_pattern is not null or s.forbidden_input_pattern is not null))
  ) e
  where (select count(*) from unnest(p_classes) c
         where c.actionable and (c.task).run_id = e.run_id) > 1);
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
    update flowlane.step_tasks t
       set status = 'failed', failed_at = now(), output = (v_class.item).output,
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
       set status = 'failed', failed_at = now(), remaining_tasks = null, error_message = v_task.error_message
     where ss.run_id = v_task.run_id and ss.step_slug = v_task.step_slug;
    perform flowlane._fail_run(v_task.run_id, v_task.error_message);
  end loop;

  -- completions: one statement per table
  with done as (
    update flowlane.step_tasks t
       set status = 'completed', completed_at = now(), output = (c.item).output
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
    select d.run_id, d.step_slug, st.step_type, count(*)::int as n, (array_agg(d.output))[1] as output
    from unnest(v_done) d
    join flowlane.steps st on st.flow_slug = d.flow_slug and st.step_slug = d.step_slug
    group by 1, 2, 3
  ), updated as (
    update flowlane.step_states ss
       set remaining_tasks = ss.remaining_tasks - c.n,
           status = case when ss.remaining_tasks = c.n then 'completed' else ss.status end,
           completed_at = case when ss.remaining_tasks = c.n then now() end,
           output = case when ss.remaining_tasks <> c.n then null
                         when c.step_type = 'single' then c.output
                         else (select coalesce(jsonb_agg(t.output order by t.task_index), '[]'::jsonb)
                               from flowlane.step_tasks t
                               where t.run_id = ss.run_id and t.step_slug = ss.step_slug) end
      from counts c
     where ss.run_id = c.run_id and ss.step_slug = c.step_slug and ss.run_id = any (v_runs)
    returning ss
  ) select coalesce(array_agg(u.ss) filter (where (u.ss).status = 'completed'), '{}') into v_steps from updated u;
  if cardinality(v_steps) > 0 then
    perform flowlane._steps_done(v_steps);
  end if;
  return query select * from flowlane._batch_rows(p_items);
end;
$$;

-- what a batch call returns: the task of every item (in key order), as it is now
create or replace function flowlane._batch_rows(p_items flowlane._result_item[])
returns setof flowlane.step_tasks
language plpgsql stable
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
begin
  return query
  select t.* from unnest(p_items) i
  join flowlane.step_tasks t on t.run_id = i.run_id and t.step_slug = i.step_slug and t.task_index = i.task_index
   and t.run_id = any (array(select distinct j.run_id from unnest(p_items) j order by 1))
  order by i.run_id, i.step_slug, i.task_index, i.pos;
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
  if v_task.status = 'started' and v_run_status = 'started' and v_state_status = 'started'
     and (p_item.worker_id is null or v_task.last_worker_id is not distinct from p_item.worker_id)
     and (p_item.attempt is null or v_task.attempts_count is not distinct from p_item.attempt) then
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
  v_state flowlane.step_states;
begin
  if v_task.run_id is null then
    return null;
  end if;
  select s.step_type into v_step_type from flowlane.steps s
  where s.flow_slug = v_task.flow_slug and s.step_slug = v_task.step_slug;
  if v_step_type = 'single' and exists (  -- its output's type is checked by the batch path
       select 1 from flowlane.deps d
       join flowlane.steps ch on ch.flow_slug = d.flow_slug and ch.step_slug = d.step_slug and ch.step_type = 'map'
       where d.flow_slug = v_task.flow_slug and d.dep_slug = v_task.step_slug) then
    return null;
  end if;
  update flowlane.step_tasks t
     set status = 'completed', completed_at = now(), output = p_item.output
   where t.run_id = v_task.run_id and t.step_slug = v_task.step_slug and t.task_index = v_task.task_index
  returning t.* into v_task;
  if v_task.message_id is not null then
    perform flowlane._queue_archive(flowlane._task_queue(v_task), v_task.message_id);
  end if;
  update flowlane.step_states ss
     set remaining_tasks = ss.remaining_tasks - 1,
         status = case when ss.remaining_tasks = 1 then 'completed' else ss.status end,
         completed_at = case when ss.remaining_tasks = 1 then now() end,
         output = case when ss.remaining_tasks <> 1 then null
                       when v_step_type = 'single' then p_item.output
                       else (select coalesce(jsonb_agg(t.output order by t.task_index), '[]'::jsonb)
                             from flowlane.step_tasks t
                             where t.run_id = ss.run_id and t.step_slug = ss.step_slug) end
   where ss.run_id = v_task.run_id and ss.step_slug = v_task.step_slug
  returning ss.* into v_state;
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
         completed_at = case when r.remaining_steps = 1 then now() else r.completed_at end,
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
      select case
        when cs.status <> 'created' or cs.initial_tasks is not null or cst.step_type <> 'map' then cs.initial_tasks
        when jsonb_typeof(p_step.output) = 'array' then jsonb_array_length(p_step.output)
        else cs.initial_tasks end as tasks) t
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
           started_at = case when v_plain and cs.status = 'created' and cs.remaining_deps = 1 then now()
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
    perform flowlane._enqueue_started(v_started);
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
         completed_at = case when c.last then now() else r.completed_at end,
         output = case when c.last then coalesce(o.output, '{}'::jsonb) else r.output end
    from counts c
    left join flowlane._run_outputs(array(select k.run_id from counts k where k.last)) o on o.run_id = c.run_id
   where r.run_id = c.run_id and r.run_id = any (v_runs)
  returning r.run_id, r.status
  ) select coalesce(array_agg(u.run_id order by u.run_id) filter (where u.status = 'started'), '{}')
      into v_started from updated u;
  update flowlane.step_states cs
     set remaining_deps = cs.remaining_deps - x.n,
         initial_tasks = case
           when cs.status <> 'created' or cs.initial_tasks is not null or cst.step_type <> 'map' then cs.initial_tasks
           when jsonb_typeof(x.output) = 'array' then jsonb_array_length(x.output)
           else cs.initial_tasks end
    from (select p.run_id, d.step_slug, p.flow_slug, count(*)::int as n, (array_agg(p.output))[1] as output
          from unnest(p_steps) p
          join flowlane.deps d on d.flow_slug = p.flow_slug and d.dep_slug = p.step_slug
          group by 1, 2, 3) x,
         flowlane.steps cst
   where cs.run_id = x.run_id and cs.step_slug = x.step_slug and cs.run_id = any (v_runs)
     and cst.flow_slug = x.flow_slug and cst.step_slug = x.step_slug;
  if cardinality(v_started) > 0 then  -- a completed run has nothing left to start or skip
    perform flowlane._progress_runs(v_started);
  end if;
end;
$$;

-- a batch of failures in one round trip: items {run_id, step_slug, task_index,
-- error_message, worker_id, attempt, error_type, traceback}
create or replace function flowlane.fail_tasks(results jsonb) returns setof flowlane.step_tasks
language plpgsql volatile
set search_path = ''
as $$
begin
  return query select * from flowlane._fail_batch(flowlane._result_items('fail_tasks', results,
    '{run_id, step_slug, task_index, error_message, worker_id, attempt, error_type, traceback}'));
end;
$$;

create or replace function flowlane.fail_task(
  run_id uuid, step_slug text, task_index int, error_message text, worker_id uuid = null, attempt int = null
) returns setof flowlane.step_tasks
language plpgsql volatile
set search_path = ''
as $$
begin
  return query select * from flowlane.fail_task_detailed(fail_task.run_id, fail_task.step_slug,
    fail_task.task_index, fail_task.error_message, fail_task.worker_id, fail_task.attempt);
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
  where c.actionable and ((c.task).attempts_count >= o.max_attempts
                          -- a wrong output is a bug in the handler, not a hiccup: no retry
                          or (c.item).error_type is not distinct from 'OutputContractViolation');

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
begin
  if v_task.run_id is null then
    return null;
  end if;
  select o.base_delay into v_base_delay from flowlane.step_options o
  where o.flow_slug = v_task.flow_slug and o.step_slug = v_task.step_slug
    and v_task.attempts_count < o.max_attempts;
  if not found or p_item.error_type is not distinct from 'OutputContractViolation' then
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

-- 2^attempts overflowed numeric for attempts near 2^31; the delay is capped
-- at 2147483647 s, reached from attempts = 31 on for any base_delay >= 1
create or replace function flowlane.calculate_retry_delay(base_delay int, attempts int) returns int
language plpgsql immutable parallel safe
set search_path = ''
as $$
begin
  return case
    when coalesce(base_delay, 0) <= 0 then 0
    when attempts >= 31 then 2147483647
    else least(floor(base_delay * power(2::numeric, greatest(attempts, 0))), 2147483647)::int
  end;
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
  update flowlane.step_tasks t
     set status = 'failed', failed_at = now(), error_message = p_error
   where t.run_id = p_task.run_id and t.step_slug = p_task.step_slug and t.task_index = p_task.task_index
  returning * into v_task;
  perform flowlane._archive_tasks(array[v_task]);
  select s.when_exhausted into v_mode from flowlane.steps s
  where s.flow_slug = v_task.flow_slug and s.step_slug = v_task.step_slug;
  if v_mode = 'fail' then
    update flowlane.step_states ss
       set status = 'failed', failed_at = now(), remaining_tasks = null, error_message = p_error
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

-- the attempt history takes an attempt's error type and traceback from
-- flowlane.attempt_details, {"<run_id>/<step_slug>/<task_index>": {type, traceback}}
-- (one setting for a whole batch), else from the single-task settings
-- (flowlane.attempt_error_type, flowlane.attempt_traceback)
create or replace function flowlane._record_attempt() returns trigger
language plpgsql volatile
set search_path = ''
as $$
declare
  v_stalled boolean := new.requeued_count > old.requeued_count;
  v_message text := new.error_message;
  v_details jsonb := nullif(current_setting('flowlane.attempt_details', true), '')::jsonb
                     -> format('%s/%s/%s', new.run_id, new.step_slug, new.task_index);
begin
  if v_stalled and new.error_message is not distinct from old.error_message then
    v_message := format('no result within %s s: the task was requeued by stalled recovery',
                        (select o.stall_after from flowlane.step_options o
                         where o.flow_slug = new.flow_slug and o.step_slug = new.step_slug));
  end if;
  insert into flowlane.task_attempts
    (run_id, step_slug, task_index, attempt, retry_round, outcome, worker_id, error_type, error_message, traceback)
  select new.run_id, new.step_slug, new.task_index, greatest(old.attempts_count, 1), r.retry_count,
         case when v_stalled then 'stalled' when new.status = 'failed' then 'failed' else 'retry' end,
         old.last_worker_id,
         case when v_stalled then 'Stalled'
              else left(nullif(coalesce(v_details ->> 'type',
                                        current_setting('flowlane.attempt_error_type', true)), ''), 200) end,
         left(v_message, 4000),
         case when v_stalled then null
              else left(nullif(coalesce(v_details ->> 'traceback',
                                        current_setting('flowlane.attempt_traceback', true)), ''), 16000) end
  from flowlane.runs r where r.run_id = new.run_id;
  return null;
end;
$$;

-- stalled recovery: the candidates are taken from the leases (task_leases), then each is
-- locked run -> step state -> task, skipping what another transaction holds, and checked again
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
    select t.run_id, t.step_slug, t.task_index, o.timeout, o.max_attempts, o.stall_after
    from flowlane.task_leases l
    join flowlane.step_tasks t on t.run_id = l.run_id and t.step_slug = l.step_slug and t.task_index = l.task_index
    join flowlane.step_options o on o.flow_slug = t.flow_slug and o.step_slug = t.step_slug
    where l.started_at < now() - make_interval(secs => o.stall_after)  -- the leases' index
      and t.status = 'started'
      and flowlane._stall_deadline(t, o.stall_after) < now()
    order by t.run_id, t.step_slug, t.task_index
  loop
    -- lock order run -> step state -> task; skip what another transaction holds
    perform 1 from flowlane.runs r where r.run_id = v_cand.run_id and r.status = 'started'
      for update skip locked;
    continue when not found;
    perform 1 from flowlane.step_states ss
      where ss.run_id = v_cand.run_id and ss.step_slug = v_cand.step_slug and ss.status = 'started'
      for update skip locked;
    continue when not found;
    select * into v_task from flowlane.step_tasks t
     where t.run_id = v_cand.run_id and t.step_slug = v_cand.step_slug and t.task_index = v_cand.task_index
       and t.status = 'started' and flowlane._stall_deadline(t, v_cand.stall_after) < now()
       for update skip locked;
    continue when not found;
    v_handled := v_handled + 1;
    if v_task.attempts_count >= v_cand.max_attempts then
      perform flowlane._exhaust_task(v_task,
        format('no result within %s s, %s attempts', v_cand.timeout, v_task.attempts_count));
    else
      update flowlane.step_tasks t
         set status = 'queued', started_at = null, last_worker_id = null, lease_renewed_at = null,
             requeued_count = t.requeued_count + 1, last_requeued_at = now(),
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

-- runs that are started but have no task that can move them: every started
-- run needs a queued task (visible, delayed or retry-delayed), a started
-- (leased) task whose message is still on its queue, or a held task
create or replace function flowlane.stuck_runs()
returns table (run_id uuid, flow_slug text, started_at timestamptz, reason text)
language plpgsql stable
set search_path = ''
as $$
declare
  v_queue record;
  v_ids bigint[];
  v_live_queues text[] := '{}';
  v_live_ids bigint[] := '{}';
begin
  for v_queue in
    select t.queue_name, array_agg(t.message_id) as ids
    from flowlane.step_tasks t join flowlane.runs r on r.run_id = t.run_id
    where r.status = 'started' and t.status in ('queued', 'started')
    group by t.queue_name order by t.queue_name
  loop
    execute format('select coalesce(array_agg(m.msg_id), ''{}'') from pgmq.%I m where m.msg_id = any($1)',
                   pgmq.format_table_name(v_queue.queue_name, 'q'))
      into v_ids using v_queue.ids;
    v_live_queues := v_live_queues || array_fill(v_queue.queue_name, array[cardinality(v_ids)]);
    v_live_ids := v_live_ids || v_ids;
  end loop;
  return query
    select r.run_id, r.flow_slug, r.started_at,
           case when exists (select 1 from flowlane.step_tasks t
                             where t.run_id = r.run_id and t.status in ('queued', 'started'))
                then 'its queued and started tasks have no message on their queue'
                else 'no queued or started task' end
    from flowlane.runs r
    where r.status = 'started'
      and not flowlane._waits_outside_queues(r.run_id)
      -- a task held for its step's concurrency is sent when a task of its key ends
      and not exists (select 1 from flowlane.held_tasks h where h.run_id = r.run_id)
      and not exists (
        select 1 from flowlane.step_tasks t
        join unnest(v_live_queues, v_live_ids) as l(queue_name, msg_id)
          on l.queue_name = t.queue_name and l.msg_id = t.message_id
        where t.run_id = r.run_id and t.status in ('queued', 'started'))
    order by r.started_at, r.run_id;
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
     set status = 'cancelled', cancelled_at = greatest(now(), r.started_at),
         cancel_reason = left(coalesce(nullif(btrim(reason), ''), 'cancelled'), 1000)
   where r.run_id = v_run.run_id
  returning * into v_run;
  with cancelled as (
    update flowlane.step_tasks t set status = 'cancelled', cancelled_at = greatest(now(), t.queued_at)
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
  select * into v_run from flowlane.runs r where r.run_id = retry_run.run_id for update;
  if not found then
    raise exception 'no run %', retry_run.run_id using errcode = 'P0002';
  end if;
  if v_run.status <> 'failed' then
    raise exception 'run % is %: only a failed run can be retried', v_run.run_id, v_run.status
      using errcode = '55000';
  end if;
  perform 1 from flowlane.step_states ss where ss.run_id = v_run.run_id order by ss.step_slug for update;

  -- steps the failure ended before they began wait for their needs again
  update flowlane.step_states ss
     set status = 'created', cancelled_at = null
   where ss.run_id = v_run.run_id and ss.status = 'cancelled' and ss.started_at is null;

  update flowlane.step_states ss
     set status = 'created', failed_at = null, error_message = null, remaining_tasks = null
   where ss.run_id = v_run.run_id and ss.status = 'failed'
     and not exists (select 1 from flowlane.step_tasks t
                     where t.run_id = ss.run_id and t.step_slug = ss.step_slug);
  perform flowlane._reopen_waits(v_run.run_id);
  delete from flowlane.held_tasks h where h.run_id = v_run.run_id;  -- held again when their steps restart
  -- unfinished tasks are replaced by fresh ones (a message id is an immutable identity);
  -- their attempts stay in flowlane.task_attempts
  delete from flowlane.step_tasks t
   using flowlane.step_states ss
   where t.run_id = v_run.run_id and ss.run_id = t.run_id and ss.step_slug = t.step_slug
     and ss.status in ('failed', 'started', 'cancelled') and t.status in ('failed', 'cancelled');
  update flowlane.step_states ss
     set status = 'started', failed_at = null, cancelled_at = null, error_message = null,
         started_at = coalesce(ss.started_at, now()),
         remaining_tasks = ss.initial_tasks - (select count(*) from flowlane.step_tasks t
                                               where t.run_id = ss.run_id and t.step_slug = ss.step_slug
                                                 and t.status = 'completed')
   where ss.run_id = v_run.run_id and ss.status in ('failed', 'started', 'cancelled');
  if v_run.concurrency_key is not null then
    -- a flow with a concurrency limit: the retried run waits for its key like a new one
    -- (its tasks are sent when it begins, _begin_held_runs)
    update flowlane.runs r
       set status = 'waiting', failed_at = null, error_message = null, deadline_at = null,
           retry_count = r.retry_count + 1, retried_at = now(), hold_seq = nextval('flowlane.hold_seq')
     where r.run_id = v_run.run_id;
    perform flowlane._begin_new_held_runs(array[v_run.run_id]);
    select * into v_run from flowlane.runs r where r.run_id = v_run.run_id;
    return v_run;
  end if;
  update flowlane.runs r
     set status = 'started', failed_at = null, error_message = null,
         retry_count = r.retry_count + 1, retried_at = now(),
         deadline_at = flowlane._run_deadline(r.flow_slug, now())  -- a fresh deadline from the retry
   where r.run_id = v_run.run_id;
  -- one send_batch per queue, tasks in step order (held for their slot on a limited step)
  perform flowlane._send_missing_tasks(v_run.run_id);
  perform flowlane._progress(v_run.run_id);
  select * into v_run from flowlane.runs r where r.run_id = v_run.run_id;
  return v_run;
end;
$$;

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
    set last_heartbeat_at = greatest(now(), w.last_heartbeat_at)
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
    set reason = excluded.reason, hint = excluded.hint, refused_at = now()
  returning * into v_row;
  return v_row;
end;
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
     set enabled = set_deployment_enabled.enabled, reason = set_deployment_enabled.reason, changed_at = now()
   where d.deployment_name = v_row.deployment_name
  returning * into v_row;
  return v_row;
end;
$$;

-- flows that new runs start: every alias's active version, and every flow
-- that no alias names (a plain flow is its own alias)
create or replace function flowlane._active_targets() returns setof text
language sql stable
set search_path = ''
as $$
  select a.flow_slug from flowlane.aliases a
  union
  select f.flow_slug from flowlane.flows f
  where not exists (select 1 from flowlane.aliases a
                    where a.flow_slug = f.flow_slug or f.flow_slug = any (a.draining))
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
    join flowlane.step_states ss on ss.run_id = r.run_id and ss.status in ('created', 'started')
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

create or replace function flowlane.drain_status()
returns table (alias text, flow_slug text, started_runs bigint, active_tasks bigint, drained boolean)
language sql stable
set search_path = ''
as $$
  select a.alias, v.flow_slug, x.runs, x.tasks, x.runs = 0 and x.tasks = 0
  from flowlane.aliases a
  cross join lateral unnest(a.draining) as v (flow_slug)
  cross join lateral (
    -- a waiting run (a delayed start) will run this version too
    select (select count(*) from flowlane.runs r
             where r.flow_slug = v.flow_slug and r.status in ('started', 'waiting')) as runs,
           (select count(*) from flowlane.runs r
              join flowlane.step_tasks t on t.run_id = r.run_id
             where r.flow_slug = v.flow_slug and r.status = 'started'
               and t.status in ('queued', 'started')) as tasks
  ) x
  order by a.alias, v.flow_slug
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
     set enabled = false, reason = format('rollout %s in progress', v_row.rollout_id), changed_at = now()
   where w.deployment_name = any (v_wanted) and w.enabled;
  update flowlane.workers w set deprecated_at = now()
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
  update flowlane.worker_deployments w set enabled = true, reason = null, changed_at = now()
   where w.deployment_name = any (v_row.previously_enabled);
  update flowlane.rollouts r set finished_at = now() where r.rollout_id = v_row.rollout_id
  returning * into v_row;
  return v_row;
end;
$$;

-- the attempt history of a run, oldest first (for `flowlane run` and Client.get_run)
create or replace function flowlane.get_run_attempts(run_id uuid) returns jsonb
language sql stable
set search_path = ''
as $$
  select coalesce(jsonb_agg(to_jsonb(a) - 'id' order by a.id), '[]'::jsonb)
  from flowlane.task_attempts a
  where a.run_id = get_run_attempts.run_id
$$;

create or replace function flowlane._check_prune_args(p_now timestamptz, p_older_than int, p_batch int) returns void
language plpgsql immutable
set search_path = ''
as $$
begin
  if p_now is null then
    raise exception 'prune_runs: p_now must not be null' using errcode = '22004';
  end if;
  if p_older_than < 0 then
    raise exception 'prune_runs: p_older_than is seconds (>= 0), got %', p_older_than using errcode = '22023';
  end if;
  if p_batch is null or p_batch not between 1 and 10000 then
    raise exception 'prune_runs: p_batch must be between 1 and 10000 runs, got %', coalesce(p_batch::text, 'null')
      using errcode = '22023';
  end if;
end;
$$;

-- finished runs that ended before p_now minus their flow's retention (p_older_than seconds,
-- when given, in place of every flow's retention), oldest first within a flow; p_flows
-- narrows to those flows; p_limit null = all
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
    order by r.started_at
    limit p_limit
  ) r
  where c.cutoff is not null and (p_flows is null or f.flow_slug = any (p_flows))
  limit p_limit;
end;
$$;

-- what a prune would delete now, per flow (read only)
create or replace function flowlane.prunable_runs(
  p_now timestamptz = now(), p_flows text[] = null, p_older_than int = null
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

-- delete the messages of one queue with the given ids, from its archive and (left over from
-- a run that ended while they waited) from the queue itself
create or replace function flowlane._delete_messages(p_queue text, p_ids bigint[]) returns int
language plpgsql volatile
set search_path = ''
as $$
declare
  v_pgmq text;
  v_archived int;
  v_queued int;
begin
  select q.pgmq_queue_name into v_pgmq from flowlane.queues q where q.queue_name = p_queue;
  if v_pgmq is null then
    return 0;
  end if;
  execute format('delete from pgmq.%I where msg_id = any ($1)', pgmq.format_table_name(v_pgmq, 'a'))
    using p_ids;
  get diagnostics v_archived = row_count;
  execute format('delete from pgmq.%I where msg_id = any ($1)', pgmq.format_table_name(v_pgmq, 'q'))
    using p_ids;
  get diagnostics v_queued = row_count;
  return v_archived + v_queued;
end;
$$;

-- one batch: at most p_batch prunable runs (a run locked by a retry or a cancel right now is
-- left for a later batch) and everything they own; returns what it deleted
create or replace function flowlane.prune_runs(
  p_now timestamptz = now(), p_flows text[] = null, p_older_than int = null, p_batch int = 500
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
  delete from flowlane.task_leases l where l.run_id = any (v_runs);
  delete from flowlane.step_tasks t where t.run_id = any (v_runs);
  get diagnostics tasks_deleted = row_count;
  delete from flowlane.step_states ss where ss.run_id = any (v_runs);
  get diagnostics steps_deleted = row_count;
  delete from flowlane.runs r where r.run_id = any (v_runs);
  get diagnostics runs_deleted = row_count;
  return next;
end;
$$;

create or replace function flowlane.queue_metrics(p_stale_after int = 30)
returns table (queue_name text, depth bigint, oldest_age_seconds int, live_workers bigint,
               disabled_deployments bigint)
language sql stable
set search_path = ''
as $$
  select q.queue_name, m.queue_length, coalesce(m.oldest_msg_age_sec, 0),
         (select count(*) from flowlane.workers w
          where w.queue_name = q.queue_name and w.stopped_at is null
            and w.last_heartbeat_at > now() - make_interval(secs => p_stale_after)),
         (select count(*) from flowlane.worker_deployments d
          where d.queue_name = q.queue_name and not d.enabled)
  from flowlane.queues q
  cross join lateral pgmq.metrics(q.pgmq_queue_name) m
  order by q.queue_name
$$;

-- the transaction's trace context, checked; null when none is set
create or replace function flowlane._trace_parent() returns text
language plpgsql stable
set search_path = ''
as $$
declare
  v_value text := nullif(current_setting('flowlane.traceparent', true), '');
begin
  if v_value is not null and v_value !~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$' then
    raise exception 'flowlane.traceparent must be a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>), got %',
      quote_literal(left(v_value, 100)) using errcode = '22023';
  end if;
  return v_value;
end;
$$;

-- the trace contexts of the given runs (those started inside a trace)
create or replace function flowlane.trace_parents(run_ids uuid[])
returns table (run_id uuid, trace_parent text)
language sql stable
set search_path = ''
as $$
  select r.run_id, r.trace_parent from flowlane.runs r
  where r.run_id = any (run_ids) and r.trace_parent is not null
$$;

-- the messages of one queue that need a worker: visible now (waiting to be claimed) or read
-- and not yet archived (claimed, or waiting for a retry); a message sent with a start delay
-- counts once it is due. Two ranges of the queue table's vt index: the cost follows the
-- queue's own messages, never the history tables or the archive.
create or replace function flowlane.queue_depth(p_queue text) returns bigint
language plpgsql stable
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_table text;
  v_depth bigint;
begin
  select 'q_' || q.pgmq_queue_name into v_table from flowlane.queues q
  where q.queue_name = lower(p_queue);
  if v_table is null then
    raise exception 'queue_depth: queue "%" is not registered with flowlane', p_queue
      using errcode = 'P0002', hint = 'the queues: `flowlane queue list`';
  end if;
  execute format('select (select count(*) from pgmq.%1$I where vt <= now())'
                 ' + (select count(*) from pgmq.%1$I where vt > now() and read_ct > 0)', v_table)
    into v_depth;
  return v_depth;
end;
$$;

-- the options of create_flow that shape how runs start and end
create or replace function flowlane._check_start_options(p_flow text, p_deadline int, p_dedup_key text) returns void
language plpgsql immutable
set search_path = ''
as $$
begin
  if p_deadline is not null and p_deadline < 1 then
    raise exception 'flow "%": deadline must be at least 1 second, not %', p_flow, p_deadline
      using errcode = '22023';
  end if;
  if p_dedup_key is not null and p_dedup_key !~ '^(/([^~/]|~[01])*)+$' then
    raise exception 'flow "%": dedup key % is not a JSON pointer into the input', p_flow, quote_literal(p_dedup_key)
      using errcode = '22023', hint = 'a JSON pointer starts with "/" (e.g. /order/id); "~" is written ~0 and "/" inside a name ~1';
  end if;
end;
$$;

-- a JSON pointer (/a/b~1c) as a jsonb path ({a,b/c})
create or replace function flowlane._pointer_path(p_pointer text) returns text[]
language sql immutable parallel safe
set search_path = ''
as $$
  select array(select replace(replace(part, '~1', '/'), '~0', '~')
               from unnest(string_to_array(substr(p_pointer, 2), '/')) with ordinality as u (part, n)
               order by n)
$$;

-- the idempotency key of a start: the caller's, else the value at the flow's dedup pointer
-- (a string as itself, any other JSON value as its text); null: no key
create or replace function flowlane._start_key(p_flow text, p_input jsonb, p_key text, p_what text) returns text
language plpgsql stable
set search_path = ''
as $$
declare
  v_pointer text;
  v_value jsonb;
begin
  if p_key is not null then
    if length(p_key) not between 1 and 500 then
      raise exception '%: an idempotency key has 1 to 500 characters, not %', p_what, length(p_key)
        using errcode = '22023';
    end if;
    return p_key;
  end if;
  select f.opt_dedup_key into v_pointer from flowlane.flows f where f.flow_slug = p_flow;
  if v_pointer is null then
    return null;
  end if;
  v_value := p_input #> flowlane._pointer_path(v_pointer);
  if v_value is null or v_value = 'null'::jsonb then
    raise exception '%: the input has no value at the dedup key %', p_what, v_pointer
      using errcode = '22023', hint = 'the flow derives each run''s idempotency key from that field of its input';
  end if;
  return left(case jsonb_typeof(v_value) when 'string' then v_value #>> '{}' else v_value::text end, 500);
end;
$$;

-- a start that returns an earlier run says so to its caller: the transaction's setting
-- flowlane.found_run holds that run's id (`flowlane start` reports "already existed")
create or replace function flowlane._found_run(p_run_id uuid) returns void
language sql volatile
set search_path = ''
as $$ select set_config('flowlane.found_run', p_run_id::text, true); $$;

-- the run of an earlier start with this key under this name, or a null row; holds the key's
-- lock until the transaction ends, so that concurrent starts with one key create one run
create or replace function flowlane._keyed_run(p_called text, p_key text) returns flowlane.runs
language plpgsql volatile
set search_path = ''
as $$
declare
  v_run flowlane.runs;
begin
  perform pg_advisory_xact_lock(hashtext('flowlane.run_key:' || p_called), hashtext(p_key));
  select * into v_run from flowlane.runs r where r.called_as = p_called and r.idempotency_key = p_key;
  if found then
    perform flowlane._found_run(v_run.run_id);
  end if;
  return v_run;
end;
$$;

-- when a run of the flow that begins at p_started has to be finished (null: no deadline)
create or replace function flowlane._run_deadline(p_flow text, p_started timestamptz) returns timestamptz
language plpgsql stable
set search_path = ''
as $$
begin
  return (select p_started + make_interval(secs => f.opt_deadline) from flowlane.flows f where f.flow_slug = p_flow);
end;
$$;

-- when a run has to be finished: a claimed task's handler reads it (ctx.deadline)
create or replace function flowlane.run_deadline(run_id uuid) returns timestamptz
language plpgsql stable
set search_path = ''
as $$
begin
  return (select r.deadline_at from flowlane.runs r where r.run_id = run_deadline.run_id);
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
           started_at = now(),
           deadline_at = case when r.concurrency_key is null then flowlane._run_deadline(r.flow_slug, now()) end
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

-- started runs past their deadline fail: their queued messages are archived and their started
-- tasks fenced (cancelled, so that a late result is rejected); returns how many
create or replace function flowlane._fail_overdue_runs(p_now timestamptz) returns int
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_run record;
  v_n int := 0;
begin
  for v_run in
    select r.run_id, r.started_at, r.deadline_at from flowlane.runs r
    where r.status = 'started' and r.deadline_at <= p_now
    order by r.deadline_at, r.run_id
    for update skip locked
  loop
    perform flowlane._fail_run(v_run.run_id,
      format('deadline exceeded after %s s', round(extract(epoch from v_run.deadline_at - v_run.started_at))));
    v_n := v_n + 1;
  end loop;
  return v_n;
end;
$$;

-- does a day match a cron expression's day-of-month, month and weekday fields? As in cron, when
-- both day fields are restricted a day matching either one matches
create or replace function flowlane._cron_day_matches(p_day date, p_days int[], p_months int[], p_weekdays int[])
returns boolean
language sql immutable parallel safe
set search_path = ''
as $$
  select extract(month from p_day)::int = any (p_months)
     and case when p_days is null and p_weekdays is null then true
              when p_days is null then extract(dow from p_day)::int = any (p_weekdays)
              when p_weekdays is null then extract(day from p_day)::int = any (p_days)
              else extract(day from p_day)::int = any (p_days) or extract(dow from p_day)::int = any (p_weekdays)
         end
$$;

-- the schedule's nearest slot after p_at (p_forward), or at or before it. `every` slots are
-- whole multiples of the interval since 1970-01-01 00:00 UTC, in any zone. Cron slots are wall
-- times in the schedule's zone, turned into instants by PostgreSQL's rule: a wall time the
-- clocks skip (spring forward) is read with the offset before the change (02:30 fires at
-- 03:30 new time); a wall time that happens twice (fall back) fires once, at its second
-- occurrence (standard time).
create or replace function flowlane._schedule_slot(p_schedule flowlane.schedules, p_at timestamptz, p_forward boolean)
returns timestamptz
language plpgsql stable
set search_path = ''
as $$
declare
  s flowlane.schedules := p_schedule;
  v_epoch numeric;
  v_start date;
  v_day date;
  v_slot timestamptz;
begin
  if s.every_seconds is not null then
    v_epoch := floor(extract(epoch from p_at) / s.every_seconds) * s.every_seconds;
    return to_timestamp(case when p_forward then v_epoch + s.every_seconds else v_epoch end);
  end if;
  v_start := (p_at at time zone s.timezone)::date + case when p_forward then -1 else 1 end;
  -- a 29 February can be 8 years away
  for v_i in 0 .. 366 * 8 + 2 loop
    v_day := v_start + case when p_forward then v_i else -v_i end;
    continue when not flowlane._cron_day_matches(v_day, s.cron_days, s.cron_months, s.cron_weekdays);
    select case when p_forward then min(c.slot) else max(c.slot) end into v_slot
    from (select (v_day + make_interval(hours => h, mins => m)) at time zone s.timezone as slot
          from unnest(s.cron_hours) h, unnest(s.cron_minutes) m) c
    where case when p_forward then c.slot > p_at else c.slot <= p_at end;
    if v_slot is not null then
      return v_slot;
    end if;
  end loop;
  return null;
end;
$$;

-- a schedule's flow now (an alias: its active version), or null when neither exists
create or replace function flowlane._schedule_flow(p_name text) returns text
language sql stable
set search_path = ''
as $$
  select coalesce((select a.flow_slug from flowlane.aliases a where a.alias = p_name),
                  (select f.flow_slug from flowlane.flows f where f.flow_slug = p_name))
$$;

-- catch-up: at most this many missed slots start runs in one firing of a schedule (all)
create or replace function flowlane._catch_up_cap() returns int
language sql immutable parallel safe
set search_path = ''
as $$ select 100 $$;

-- catch_up none: a slot later than this (seconds) was missed, not late
create or replace function flowlane._catch_up_grace() returns int
language sql immutable parallel safe
set search_path = ''
as $$ select 60 $$;

-- the slots a due schedule starts runs for at p_now, by its pause, overlap and catch_up; none
-- while its flow is gone or refuses its input (a warning says so)
create or replace function flowlane._slots_to_fire(p_schedule flowlane.schedules, p_now timestamptz)
returns setof timestamptz
language plpgsql stable
set search_path = ''
as $$
declare
  s flowlane.schedules := p_schedule;
  v_latest timestamptz;
  v_slot timestamptz := s.next_slot;
  v_n int := 0;
begin
  if exists (select 1 from flowlane.schedule_overrides o where o.schedule_name = s.schedule_name and o.paused)
     or flowlane._schedule_flow(s.flow_name) is null
     or (s.overlap = 'skip' and exists (select 1 from flowlane.runs r
                                       where r.run_id = s.last_run_id and r.status in ('waiting', 'started'))) then
    return;
  end if;
  begin
    -- the checks every start makes (the flow behind an alias may have changed since apply)
    perform flowlane._check_start_input(flowlane._schedule_flow(s.flow_name), s.input,
                                        format('schedule "%s"', s.schedule_name));
  exception when others then
    raise warning '%: its slots start no run until its input or flow is fixed', sqlerrm;
    return;
  end;
  if s.catch_up = 'all' then
    -- oldest first; with overlap skip the first run would overlap the rest. A slot at or
    -- before the last one fired never fires again (whatever moved next_slot back)
    if v_slot <= s.last_slot then
      v_slot := flowlane._schedule_slot(s, s.last_slot, true);
    end if;
    while v_slot <= p_now and v_n < case when s.overlap = 'skip' then 1 else flowlane._catch_up_cap() end loop
      return next v_slot;
      v_n := v_n + 1;
      v_slot := flowlane._schedule_slot(s, v_slot, true);
    end loop;
    return;
  end if;
  v_latest := flowlane._schedule_slot(s, p_now, false);
  if v_latest <= s.last_slot then
    return;
  end if;
  if s.catch_up = 'latest' or p_now - v_latest <= make_interval(secs => flowlane._catch_up_grace()) then
    return next v_latest;
  end if;
end;
$$;

-- every due schedule starts its runs (one per slot, recorded with the run) and moves on to its
-- next slot. Each schedule is fired by one caller: the others skip it while it is locked and
-- find it no longer due once that caller commits. Runs of one flow start in one statement.
create or replace function flowlane._fire_schedules(p_now timestamptz) returns int
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_due flowlane.schedules[];
  v_names text[];
  v_slots timestamptz[];
  v_flows text[];
  v_inputs jsonb[];
  v_runs uuid[];
  v_ids uuid[];
  v_group record;
begin
  select coalesce(array_agg(d order by d.schedule_name), '{}') into v_due
  from (select * from flowlane.schedules s where s.next_slot <= p_now
        order by s.schedule_name for update skip locked) d;
  if cardinality(v_due) = 0 then
    return 0;
  end if;
  select coalesce(array_agg(d.schedule_name order by d.schedule_name, f.slot), '{}'),
         coalesce(array_agg(f.slot order by d.schedule_name, f.slot), '{}'),
         coalesce(array_agg(flowlane._schedule_flow(d.flow_name) order by d.schedule_name, f.slot), '{}'),
         coalesce(array_agg(d.input order by d.schedule_name, f.slot), '{}')
    into v_names, v_slots, v_flows, v_inputs
  from unnest(v_due) d cross join lateral flowlane._slots_to_fire(d, p_now) f (slot);
  v_runs := array_fill(null::uuid, array[cardinality(v_names)]);
  for v_group in
    select v_flows[i] as flow_slug, array_agg(i order by i) as idx
    from generate_subscripts(v_names, 1) i group by v_flows[i] order by 1
  loop
    -- (two statements: an update sees the runs only once the statement creating them is over)
    v_ids := array(select r.run_id
                   from flowlane._create_runs(v_group.flow_slug,
                          array(select v_inputs[k.i] from unnest(v_group.idx) with ordinality k (i, n) order by k.n),
                          '{}') with ordinality r
                   order by r.ordinality);
    update flowlane.runs r set schedule_name = v_names[u.i], schedule_slot = v_slots[u.i]
      from unnest(v_ids, v_group.idx) as u (run_id, i)
     where r.run_id = u.run_id;
    select array_agg(coalesce(u.run_id, v_runs[k]) order by k) into v_runs
    from generate_subscripts(v_names, 1) k
    left join unnest(v_ids, v_group.idx) as u (run_id, i) on u.i = k;
  end loop;
  update flowlane.schedules s
     set next_slot = flowlane._schedule_slot(s,
           case when s.catch_up = 'all' and l.fired >= flowlane._catch_up_cap() then l.last_slot else p_now end, true),
         last_slot = coalesce(l.last_slot, s.last_slot),
         last_run_id = coalesce(l.last_run, s.last_run_id)
    from unnest(v_due) d
    left join (select f.name, count(*) as fired, max(f.slot) as last_slot,
                      (array_agg(f.run_id order by f.slot desc))[1] as last_run
               from unnest(v_names, v_slots, v_runs) as f (name, slot, run_id) group by f.name) l
      on l.name = d.schedule_name
   where s.schedule_name = d.schedule_name;
  return cardinality(v_names);
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
               null, v_old.last_slot, v_old.last_run_id, coalesce(v_old.created_at, now()), now());
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
    v_new.next_slot := flowlane._schedule_slot(v_new, now(), true);
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

create or replace function flowlane._check_cron_field(p_what text, p_field text, p_values int[], p_min int, p_max int,
                                           p_any_allowed boolean) returns void
language plpgsql immutable
set search_path = ''
as $$
begin
  if p_values is null and p_any_allowed then
    return;
  end if;
  if p_values is null or cardinality(p_values) = 0 or array_position(p_values, null) is not null
     or exists (select 1 from unnest(p_values) v where v not between p_min and p_max) then
    raise exception '%: the cron % field must list values from % to %', p_what, p_field, p_min, p_max
      using errcode = '22023';
  end if;
end;
$$;

-- what a compiled schedule file ends with: the schedules it does not list are deleted (their
-- runs keep their schedule's name); returns the deleted names
create or replace function flowlane.keep_only_schedules(schedule_names text[]) returns text[]
language plpgsql volatile
set search_path = ''
as $$
declare
  v_deleted text[];
begin
  with gone as (
    delete from flowlane.schedules s where s.schedule_name <> all (coalesce(schedule_names, '{}'))
    returning s.schedule_name
  ) select coalesce(array_agg(g.schedule_name order by g.schedule_name), '{}') into v_deleted from gone g;
  return v_deleted;
end;
$$;

-- the schedule named, locked for an operator's action; an unknown name raises
create or replace function flowlane._locked_schedule(p_name text) returns flowlane.schedules
language plpgsql volatile
set search_path = ''
as $$
declare
  v_schedule flowlane.schedules;
begin
  select * into v_schedule from flowlane.schedules s where s.schedule_name = p_name for update;
  if not found then
    raise exception 'no schedule "%"', p_name using errcode = 'P0002',
      hint = '`flowlane schedules` lists the schedules';
  end if;
  return v_schedule;
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
  values (v_schedule.schedule_name, coalesce(set_schedule_paused.paused, true), left(reason, 1000), now())
  on conflict on constraint schedule_overrides_pkey do update
    set paused = excluded.paused, reason = excluded.reason, changed_at = excluded.changed_at;
  if not coalesce(set_schedule_paused.paused, true) then
    update flowlane.schedules s set next_slot = flowlane._schedule_slot(s, now(), true)
     where s.schedule_name = v_schedule.schedule_name and s.next_slot <= now()
    returning * into v_schedule;
  end if;
  return v_schedule;
end;
$$;

-- start a run of a schedule now, outside its slots (input: the schedule's unless given)
create or replace function flowlane.trigger_schedule(schedule_name text, input jsonb = null) returns flowlane.runs
language plpgsql volatile
set search_path = ''
as $$
declare
  v_schedule flowlane.schedules;
  v_run flowlane.runs;
begin
  v_schedule := flowlane._locked_schedule(trigger_schedule.schedule_name);
  v_run := flowlane.start_flow(v_schedule.flow_name, coalesce(trigger_schedule.input, v_schedule.input));
  update flowlane.runs r set schedule_name = v_schedule.schedule_name where r.run_id = v_run.run_id
  returning * into v_run;
  update flowlane.schedules s set last_run_id = v_run.run_id where s.schedule_name = v_schedule.schedule_name;
  return v_run;
end;
$$;

-- what every worker, `serve` and console process calls on its maintenance tick: each concern
-- is one function, safe with any number of callers at once. p_now: the time the tick acts
-- for (tests pass a later time instead of waiting).
create or replace function flowlane.maintenance_tick(p_now timestamptz = now()) returns jsonb
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
begin
  return jsonb_build_object('fired', v_fired, 'begun', v_begun, 'failed', v_failed,
                            'waits_expired', v_expired, 'released', v_released, 'pruned', v_pruned);
end;
$$;

-- the keywords a contract may use: the enforced subset, then annotations (not enforced)
create or replace function flowlane.contract_keywords() returns text[]
language sql immutable
set search_path = ''
as $$
  select array['type', 'properties', 'required', 'additionalProperties', 'items', 'enum', 'const',
               'minimum', 'maximum', 'exclusiveMinimum', 'exclusiveMaximum', 'minLength', 'maxLength',
               'pattern', 'minItems', 'maxItems', 'title', 'description', 'examples', '$comment']
$$;

-- a JSON pointer token: ~ and / escaped
create or replace function flowlane._pointer_token(p_key text) returns text
language sql immutable
set search_path = ''
as $$ select replace(replace(p_key, '~', '~0'), '/', '~1') $$;

-- a value for a message: its JSON text, shortened
create or replace function flowlane._contract_shown(p_value jsonb) returns text
language sql immutable
set search_path = ''
as $$
  select case when length(p_value::text) <= 60 then p_value::text else left(p_value::text, 57) || '...' end
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
        format('%s must be a whole number from 0', v_key)
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

create or replace function flowlane._is_valid_regex(p_pattern text) returns boolean
language plpgsql immutable
set search_path = ''
as $$
begin
  perform '' ~ p_pattern;
  return true;
exception when invalid_regular_expression then
  return false;
end;
$$;

-- the tokens of a JSON pointer, unescaped ('' = the whole document)
create or replace function flowlane._pointer_parts(p_pointer text) returns text[]
language sql immutable
set search_path = ''
as $$
  select coalesce(array(select replace(replace(t, '~1', '/'), '~0', '~')
                        from unnest(string_to_array(substr(p_pointer, 2), '/')) with ordinality u(t, o)
                        where p_pointer <> '' order by o), '{}')
$$;

-- the schema as a SQL boolean expression over the jsonb value ``p_x`` (an expression): true
-- only for a valid value (null is read as false: every negated part is coalesced). One
-- ``case jsonb_typeof(...)`` per schema; literals quoted with format's %L; numbers and counts
-- pass through numeric and int casts first.
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
        case when p_schema ? 'minLength' then format('length(%s #>> ''{}'') >= %s', p_x, (p_schema ->> 'minLength')::int) end,
        case when p_schema ? 'maxLength' then format('length(%s #>> ''{}'') <= %s', p_x, (p_schema ->> 'maxLength')::int) end,
        case when p_schema ? 'pattern' then format('(%s #>> ''{}'') ~ %L', p_x, p_schema ->> 'pattern') end], null);
    elsif v_type = 'array' then
      v_checks := array_remove(array[
        case when p_schema ? 'minItems' then format('jsonb_array_length(%s) >= %s', p_x, (p_schema ->> 'minItems')::int) end,
        case when p_schema ? 'maxItems' then format('jsonb_array_length(%s) <= %s', p_x, (p_schema ->> 'maxItems')::int) end,
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

-- the fast verdict on one value, compiled on the fly (what _check_contract_inputs decides
-- with the stored expression)
create or replace function flowlane._contract_fast_accepts(p_schema jsonb, p_value jsonb) returns boolean
language plpgsql immutable
set search_path = ''
as $$
declare
  v_ok boolean;
begin
  execute format('select coalesce(%s, false) from (select $1) u(v)', flowlane._contract_sql(p_schema, 'v'))
    into v_ok using p_value;
  return v_ok;
end;
$$;

create or replace function flowlane._contract_has_type(p_value jsonb, p_type text) returns boolean
language sql immutable
set search_path = ''
as $$
  select case p_type
    when 'integer' then jsonb_typeof(p_value) = 'number' and (p_value #>> '{}')::numeric = floor((p_value #>> '{}')::numeric)
    else jsonb_typeof(p_value) = p_type end
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
    if v_length < (p_schema ->> 'minLength')::bigint then
      return flowlane._contract_failure(p_at, p_schema_at, 'minLength', format('%s is shorter than %s characters', v_shown, p_schema -> 'minLength'));
    elsif v_length > (p_schema ->> 'maxLength')::bigint then
      return flowlane._contract_failure(p_at, p_schema_at, 'maxLength', format('%s is longer than %s characters', v_shown, p_schema -> 'maxLength'));
    elsif p_schema ? 'pattern' and not (p_value #>> '{}') ~ (p_schema ->> 'pattern') then
      return flowlane._contract_failure(p_at, p_schema_at, 'pattern', format('%s does not match the pattern %s', v_shown, p_schema -> 'pattern'));
    end if;
  elsif v_type = 'array' then
    if jsonb_array_length(p_value) < (p_schema ->> 'minItems')::bigint then
      return flowlane._contract_failure(p_at, p_schema_at, 'minItems', format('has fewer than %s items', p_schema -> 'minItems'));
    elsif jsonb_array_length(p_value) > (p_schema ->> 'maxItems')::bigint then
      return flowlane._contract_failure(p_at, p_schema_at, 'maxItems', format('has more than %s items', p_schema -> 'maxItems'));
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

-- why ``instance`` breaks ``schema``: {path, message, schema_path} of the first rule that
-- fails (JSON pointers), or null when it is valid
create or replace function flowlane.contract_violation(schema jsonb, instance jsonb) returns jsonb
language sql immutable
set search_path = ''
as $$ select flowlane._contract_violation(schema, instance, '', '') $$;

create or replace function flowlane._contract_failure(p_at text, p_schema_at text, p_keyword text, p_message text) returns jsonb
language sql immutable
set search_path = ''
as $$
  select jsonb_build_object('path', p_at, 'message', p_message,
                            'schema_path', p_schema_at || case when p_keyword = '' then '' else '/' || p_keyword end)
$$;

-- store a contract: the run input's (step_slug null) or a step's output. Part of the flow's
-- shape: once the flow is sealed (ensure_flow_shape) a contract is neither added nor changed.
create or replace function flowlane.set_contract(flow_slug text, step_slug text, schema jsonb) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_what text := case when set_contract.step_slug is null then 'input_schema'
                      else format('output_schema of step "%s"', set_contract.step_slug) end;
  v_sealed timestamptz;
  v_stored jsonb;
  v_problem text;
begin
  select f.shape_sealed_at into v_sealed from flowlane.flows f where f.flow_slug = set_contract.flow_slug for update;
  if not found then
    raise exception 'set_contract: flow "%" does not exist', set_contract.flow_slug using errcode = '22023',
      hint = 'create the flow (create_flow, add_step) before its contracts';
  end if;
  if set_contract.step_slug is not null and not exists (
       select 1 from flowlane.steps s where s.flow_slug = set_contract.flow_slug and s.step_slug = set_contract.step_slug) then
    raise exception 'set_contract: flow "%" has no step "%"', set_contract.flow_slug, set_contract.step_slug
      using errcode = '22023';
  end if;
  v_problem := flowlane._contract_problem(schema);
  if schema is null or v_problem is not null then
    raise exception 'set_contract: % of flow "%" is not a contract: %', v_what, set_contract.flow_slug,
      coalesce(v_problem, 'null') using errcode = '22023',
      hint = 'a contract is a JSON Schema using only ' || array_to_string(flowlane.contract_keywords(), ', ');
  end if;
  select c.schema into v_stored from flowlane.contracts c
  where c.flow_slug = set_contract.flow_slug and coalesce(c.step_slug, '') = coalesce(set_contract.step_slug, '');
  if found and v_stored = schema then
    return;
  end if;
  if found or v_sealed is not null then
    raise exception 'FLOWLANE_SHAPE_MISMATCH: flow "%" already exists with % %', set_contract.flow_slug,
      case when found then 'a different' else 'no' end, v_what
      using errcode = '23514',
            hint = 'contracts are part of the flow''s shape; create a new flow version (a new slug)';
  end if;
  insert into flowlane.contracts (flow_slug, step_slug, schema, check_sql)
  values (set_contract.flow_slug, set_contract.step_slug, schema, flowlane._contract_sql(schema, 'v'))
  returning check_sql into v_problem;
  perform flowlane._contract_check_function(v_problem);
end;
$$;

-- the name of the function that evaluates a compiled check (one per distinct expression)
create or replace function flowlane._contract_check_name(p_check_sql text) returns text
language sql immutable
set search_path = ''
as $$ select '_contract_check_' || md5(p_check_sql) $$;

-- create the function evaluating p_check_sql on v, once (plpgsql: its plan is made once per
-- connection, where a statement holding the expression was planned on every start, about
-- 1 ms for a 10-field schema). Its body is a quoted literal of _contract_sql's quoted parts.
create or replace function flowlane._contract_check_function(p_check_sql text) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_name text := flowlane._contract_check_name(p_check_sql);
begin
  perform pg_advisory_xact_lock(hashtext('flowlane.contract_check'), hashtext(v_name));
  if to_regprocedure(format('flowlane.%I(jsonb)', v_name)) is null then
    execute format('create function flowlane.%I(v jsonb) returns boolean language plpgsql immutable '
                   'set search_path = %L as %L', v_name, '',
                   format('begin return coalesce(%s, false); end;', p_check_sql));
  end if;
end;
$$;

-- refuse run inputs of p_flow that its input_schema rejects, before any run exists
create or replace function flowlane._check_contract_inputs(p_flow text, p_inputs jsonb[]) returns void
language plpgsql stable
set search_path = ''
as $$
declare
  v_contract flowlane.contracts;
  v_refused int[];
  v_i int;
  v_found jsonb;
begin
  select * into v_contract from flowlane.contracts c
  where c.flow_slug = p_flow and coalesce(c.step_slug, '') = '';
  if not found then
    return;
  end if;
  -- a few inputs: the check's function, planned once per connection; a batch: the expression
  -- itself, planned once for the batch (a function call per input cost more than that plan)
  execute format('select array(select u.i from unnest($1) with ordinality u(v, i) where not %s order by u.i)',
                 case when cardinality(p_inputs) < 16
                      then format('flowlane.%I(u.v)', flowlane._contract_check_name(v_contract.check_sql))
                      else format('coalesce(%s, false)', v_contract.check_sql) end)
    into v_refused using p_inputs;
  foreach v_i in array v_refused loop
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

-- the contracts a shape document holds (ensure_flow_compiled creates a flow from its shape)
create or replace function flowlane._set_shape_contracts(p_flow text, p_shape jsonb) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_step jsonb;
begin
  if p_shape ? 'input_schema' then
    perform flowlane.set_contract(p_flow, null, p_shape -> 'input_schema');
  end if;
  for v_step in select e from jsonb_array_elements(p_shape -> 'steps') e where e ? 'output_schema' loop
    perform flowlane.set_contract(p_flow, v_step ->> 'slug', v_step -> 'output_schema');
  end loop;
end;
$$;

-- the queue of a new step: a wait step and a child-flow step have none (nothing is sent for
-- them, no worker serves them)
create or replace function flowlane._step_queue(
  p_flow_slug text, p_step_slug text, p_step_index int, p_mode text, p_type text, p_given text,
  p_child_flow text
) returns text
language plpgsql stable
set search_path = ''
as $$
begin
  if p_type <> 'wait' and p_child_flow is null then
    return flowlane._resolve_queue(p_flow_slug, p_step_slug, p_step_index, p_mode, p_given);
  end if;
  if p_given is not null then
    raise exception 'step "%" of flow "%" is a % step: it has no handler and no queue, so queue_name must be null, not "%"',
      p_step_slug, p_flow_slug, case when p_type = 'wait' then 'wait' else 'child-flow' end, p_given
      using errcode = '22023', hint = 'a wait step completes with a signal, a child-flow step with its child run; no worker serves either';
  end if;
  return null;
end;
$$;

-- a child-flow step names a flow or alias (resolved when the step starts) and is not a wait step
create or replace function flowlane._check_child_flow(p_flow text, p_step text, p_type text, p_child_flow text)
returns void
language plpgsql immutable
set search_path = ''
as $$
begin
  if p_child_flow is null then
    return;
  end if;
  if p_type = 'wait' then
    raise exception 'step "%" of flow "%": a wait step cannot start a child flow', p_step, p_flow
      using errcode = '22023';
  end if;
  if not flowlane.is_valid_slug(p_child_flow) then
    raise exception 'step "%" of flow "%": child_flow % is not a flow or alias slug', p_step, p_flow,
      quote_literal(p_child_flow) using errcode = '22023';
  end if;
end;
$$;

-- a started run that waits for a signal or a child run is not stuck: what moves it comes
-- from outside its queues
create or replace function flowlane._waits_outside_queues(p_run_id uuid) returns boolean
language sql stable
set search_path = ''
as $$
  select exists (
    select 1 from flowlane.step_states ss
    join flowlane.steps s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
    where ss.run_id = p_run_id and ss.status = 'started' and s.queue_name is null)
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
  select st.run_id, st.step_slug, now() + make_interval(secs => s.opt_timeout)
  from unnest(p_started) st
  join flowlane.steps s on s.flow_slug = st.flow_slug and s.step_slug = st.step_slug
  where s.step_type = 'wait' and s.opt_timeout is not null
  order by st.run_id, st.step_slug
  on conflict on constraint wait_deadlines_pkey do update set expires_at = excluded.expires_at;
  with kept as (
    update flowlane.signals g set applied_at = greatest(now(), g.received_at)
      from unnest(p_started) st
      join flowlane.steps s on s.flow_slug = st.flow_slug and s.step_slug = st.step_slug
     where s.step_type = 'wait' and g.run_id = st.run_id and g.step_slug = st.step_slug
       and g.applied_at is null
    returning g.run_id, g.step_slug, g.payload
  ), done as (
    update flowlane.step_states ss
       set status = 'completed', output = k.payload, remaining_tasks = 0, completed_at = now()
      from kept k
     where ss.run_id = k.run_id and ss.step_slug = k.step_slug and ss.status = 'started'
    returning ss
  ) select coalesce(array_agg(d.ss order by (d.ss).run_id, (d.ss).step_slug), '{}') into v_done from done d;
  if cardinality(v_done) > 0 then
    perform flowlane._steps_done(v_done);
  end if;
end;
$$;

-- retry_run: a wait or child-flow step the run's failure ended while it waited starts
-- again from the beginning (a new wait; new child runs)
create or replace function flowlane._reopen_waits(p_run_id uuid) returns void
language sql volatile
set search_path = ''
as $$
  update flowlane.step_states ss
     set status = 'created', cancelled_at = null, started_at = null, remaining_tasks = null
    from flowlane.steps s
   where ss.run_id = p_run_id and ss.status = 'cancelled' and ss.started_at is not null
     and s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug and s.queue_name is null;
$$;

-- deliver a signal to a run's wait step: it completes the step with the payload as its
-- output (and starts what depends on it), or is kept until the step starts. Refused, with
-- nothing changed: an unknown run or step, a step that is not a wait step, a finished run, a
-- finished step, a step that already has a signal, a payload its step cannot give (not an
-- array for a step a map step maps). Returns the signal; applied_at null means kept.
-- a wait step's output_schema is the contract of the payload that completes it: a payload
-- it refuses is refused like a run input, naming the path, before anything changes
create or replace function flowlane._check_signal_contract(p_flow text, p_step text, p_payload jsonb)
returns void
language plpgsql stable
set search_path = ''
as $$
declare
  v_schema jsonb;
  v_found jsonb;
begin
  select c.schema into v_schema from flowlane.contracts c
  where c.flow_slug = p_flow and c.step_slug = p_step;
  if not found then
    return;
  end if;
  v_found := flowlane.contract_violation(v_schema, p_payload);
  if v_found is not null then
    raise exception 'signal: the payload does not match the output_schema of step "%" of flow "%": %: %',
      p_step, p_flow, coalesce(nullif(v_found ->> 'path', ''), '/'), v_found ->> 'message'
      using errcode = '22023',
            hint = 'send a payload the step''s output_schema accepts; this signal changed nothing';
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
  values (v_run.run_id, v_step.step_slug, payload, case when v_state.status = 'started' then now() end)
  returning * into v_signal;
  if v_state.status = 'started' then
    update flowlane.step_states ss
       set status = 'completed', output = payload, remaining_tasks = 0, completed_at = now()
     where ss.run_id = v_run.run_id and ss.step_slug = v_step.step_slug
    returning * into v_state;
    perform flowlane._steps_done(array[v_state]);
  end if;
  return v_signal;
end;
$$;

create or replace function flowlane._wait_steps_hint(p_flow text) returns text
language sql stable
set search_path = ''
as $$
  select coalesce('the wait steps of flow ' || p_flow || ': '
                  || string_agg(s.step_slug, ', ' order by s.step_index), 'flow ' || p_flow || ' has no wait step')
  from flowlane.steps s where s.flow_slug = p_flow and s.step_type = 'wait'
$$;

-- wait steps whose timeout passed by p_now without a signal end as their when_exhausted
-- says: fail (the run fails), skip or skip-cascade (the run goes on). Runs another
-- transaction holds are left for the next call. Returns how many steps it ended.
create or replace function flowlane.expire_waits(p_now timestamptz = now()) returns int
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
       set status = 'failed', failed_at = now(), remaining_tasks = null, error_message = p_error
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

-- the wait steps of a run for `flowlane run` and the console: each with its state, since
-- when it waits, when it gives up, and its signal (kept or applied)
create or replace function flowlane.get_run_waits(run_id uuid) returns jsonb
language sql stable
set search_path = ''
as $$
  select coalesce(jsonb_agg(jsonb_build_object(
           'step_slug', ss.step_slug,
           'status', ss.status,
           'waiting_since', case when ss.status = 'started' then ss.started_at end,
           'expires_at', case when ss.status = 'started' then w.expires_at end,
           'timeout', s.opt_timeout,
           'signal', case when g.run_id is not null then jsonb_build_object(
                       'payload', g.payload, 'received_at', g.received_at, 'applied_at', g.applied_at) end)
         order by s.step_index), '[]'::jsonb)
  from flowlane.runs r
  join flowlane.steps s on s.flow_slug = r.flow_slug and s.step_type = 'wait'
  join flowlane.step_states ss on ss.run_id = r.run_id and ss.step_slug = s.step_slug
  left join flowlane.wait_deadlines w on w.run_id = r.run_id and w.step_slug = s.step_slug
  left join flowlane.signals g on g.run_id = r.run_id and g.step_slug = s.step_slug
  where r.run_id = get_run_waits.run_id
$$;

-- the started steps among p_started that have a child flow: one child run per task
create or replace function flowlane._start_children(p_started flowlane.step_states[]) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_task record;
begin
  for v_task in
    select st.run_id, st.step_slug, k as task_index
    from unnest(p_started) st
    join flowlane.steps s on s.flow_slug = st.flow_slug and s.step_slug = st.step_slug
    cross join lateral generate_series(0, st.initial_tasks - 1) as k
    where s.child_flow is not null
    order by st.run_id, s.step_index, k
  loop
    perform flowlane._start_child(v_task.run_id, v_task.step_slug, v_task.task_index);
  end loop;
end;
$$;

-- one child run for task p_index of a child-flow step (its input is what a handler would
-- get). A child that cannot start (no such flow, an input it refuses) is a failed attempt.
create or replace function flowlane._start_child(p_run_id uuid, p_step_slug text, p_index int) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_named text;
  v_flow text;
  v_task flowlane.step_tasks;
  v_input jsonb;
  v_child flowlane.runs;
begin
  perform 1 from flowlane.step_states ss join flowlane.runs r on r.run_id = ss.run_id
  where ss.run_id = p_run_id and ss.step_slug = p_step_slug and ss.status = 'started' and r.status = 'started';
  if not found then
    return;  -- an earlier child of the step could not start and ended the step or the run
  end if;
  select s.child_flow, r.flow_slug into v_named, v_task.flow_slug from flowlane.runs r
  join flowlane.steps s on s.flow_slug = r.flow_slug and s.step_slug = p_step_slug
  where r.run_id = p_run_id;
  v_task.run_id := p_run_id;
  v_task.step_slug := p_step_slug;
  v_task.task_index := p_index;
  select c.input into v_input from flowlane._claimed_inputs(array[v_task]) c;
  begin
    v_flow := flowlane.resolve_flow(v_named);
    perform flowlane._check_start_input(v_flow, v_input,
      format('child flow %s of step %s', v_flow, p_step_slug));
    select * into v_child from flowlane._create_runs(v_flow, array[v_input], array[null::uuid]);
  exception when others then
    perform flowlane._child_step_exhausted(p_run_id, p_step_slug,
      format('cannot start child flow %s: %s', v_named, sqlerrm));
    return;
  end;
  update flowlane.runs r
     set parent_run_id = p_run_id, parent_step_slug = p_step_slug, parent_task_index = p_index
   where r.run_id = v_child.run_id
  returning * into v_child;
  -- (a child of a flow with a concurrency limit may wait for its key: it has not ended)
  if v_child.status not in ('started', 'waiting') then  -- it ended while it was created, before it had a parent
    perform flowlane._child_ended(v_child);
  end if;
end;
$$;

create or replace function flowlane._report_to_parent() returns trigger
language plpgsql volatile
set search_path = ''
as $$
begin
  perform flowlane._child_ended(new);
  return null;
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
           completed_at = case when ss.remaining_tasks = 1 then now() end,
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

-- a map step's output: its children's outputs in element order (the completed child of each)
create or replace function flowlane._children_outputs(p_run_id uuid, p_step_slug text) returns jsonb
language sql stable
set search_path = ''
as $$
  select coalesce(jsonb_agg(c.output order by c.parent_task_index), '[]'::jsonb)
  from flowlane.runs c
  where c.parent_run_id = p_run_id and c.parent_step_slug = p_step_slug and c.status = 'completed'
$$;

-- a child-flow step out of attempts: its other started children are cancelled and
-- when_exhausted applies (fail: the step and its run fail; skip, skip-cascade: the run goes on)
create or replace function flowlane._child_step_exhausted(p_run_id uuid, p_step_slug text, p_error text) returns void
language plpgsql volatile
set search_path = ''
as $$
begin
  -- (a failed run cancels all its children itself: runs_end_children)
  perform flowlane.cancel_run(c.run_id, format('step %s of parent run %s gave up', p_step_slug, p_run_id))
  from flowlane.runs c
  join flowlane.runs p on p.run_id = p_run_id
  join flowlane.steps s on s.flow_slug = p.flow_slug and s.step_slug = p_step_slug and s.when_exhausted <> 'fail'
  where c.parent_run_id = p_run_id and c.parent_step_slug = p_step_slug and c.status in ('started', 'waiting')
  order by c.run_id;
  perform flowlane._give_up_step(p_run_id, p_step_slug, p_error, 'handler_failed');
end;
$$;

-- a parent that fails or is cancelled cancels its started children (and those held for
-- their flow's concurrency key)
create or replace function flowlane._end_children() returns trigger
language plpgsql volatile
set search_path = ''
as $$
begin
  perform flowlane.cancel_run(c.run_id, format('parent run %s %s', new.run_id, new.status))
  from flowlane.runs c
  where c.parent_run_id = new.run_id and c.status in ('started', 'waiting')
  order by c.run_id;
  return null;
end;
$$;

-- a run's parent and children for `flowlane run` and the console
create or replace function flowlane.get_run_family(run_id uuid) returns jsonb
language sql stable
set search_path = ''
as $$
  select jsonb_build_object(
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

create or replace function flowlane._check_priority(p_what text, p_priority int) returns void
language plpgsql immutable
set search_path = ''
as $$
begin
  if p_priority is not null and p_priority not between -1000 and 1000 then
    raise exception '%: priority must be from -1000 to 1000, not %', p_what, p_priority
      using errcode = '22023', hint = 'higher priorities are claimed first; the default is 0';
  end if;
end;
$$;

create or replace function flowlane._check_flow_control_options(p_what text, p_limit int, p_key text, p_priority int)
returns void
language plpgsql immutable
set search_path = ''
as $$
begin
  if p_limit is not null and p_limit < 1 then
    raise exception '%: concurrency limit must be at least 1, not %', p_what, p_limit using errcode = '22023';
  end if;
  if nullif(p_key, '') is not null and p_limit is null then
    raise exception '%: a concurrency key needs a concurrency limit', p_what using errcode = '22023';
  end if;
  if nullif(p_key, '') is not null and p_key !~ '^(/([^~/]|~[01])*)+$' then
    raise exception '%: concurrency key % is not a JSON pointer into the run input', p_what, quote_literal(p_key)
      using errcode = '22023', hint = 'a JSON pointer starts with "/" (e.g. /customer_id); "~" is written ~0 and "/" inside a name ~1';
  end if;
  perform flowlane._check_priority(p_what, p_priority);
end;
$$;

-- the concurrency key of a run input: the value at the pointer (a string as itself, any other
-- JSON value as its text, a missing value as null); '' without a pointer (one key for all)
create or replace function flowlane._concurrency_key(p_pointer text, p_input jsonb) returns text
language sql immutable parallel safe
set search_path = ''
as $$
  select case when p_pointer is null then ''
              else coalesce((select case jsonb_typeof(v) when 'string' then v #>> '{}' else left(v::text, 500) end
                             from (select p_input #> flowlane._pointer_path(p_pointer) as v) x), 'null') end
$$;

-- how a key is shown: "customer_id=42" (the pointer's last name), the scope's name without a pointer
create or replace function flowlane._key_label(p_scope text, p_pointer text, p_key text) returns text
language sql immutable
set search_path = ''
as $$
  select case when p_pointer is null then p_scope
              else replace(replace(regexp_replace(p_pointer, '^.*/', ''), '~1', '/'), '~0', '~') || '=' || p_key end
$$;

-- the advisory locks of the keys of one scope ('run:FLOW' or 'step:FLOW/STEP'), in key order
create or replace function flowlane._lock_slots(p_scope text, p_keys text[]) returns void
language sql volatile
set search_path = ''
as $$
  select count(pg_advisory_xact_lock(hashtext('flowlane.slots:' || p_scope), hashtext(k)))
  from (select distinct k from unnest(p_keys) k where k is not null order by 1) x
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
       set status = 'started', hold_seq = null, started_at = greatest(now(), r.started_at),
           deadline_at = flowlane._run_deadline(r.flow_slug, greatest(now(), r.started_at))
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
    perform flowlane._begin_held_runs(v_group.flow_slug, v_group.keys);
  end loop;
end;
$$;

-- a run that stopped being started frees a slot of its key: the next held run begins
create or replace function flowlane._run_slots_freed() returns trigger
language plpgsql volatile
set search_path = ''
as $$
declare
  v_group record;
begin
  for v_group in
    select n.flow_slug, array_agg(distinct n.concurrency_key) as keys
    from new_runs n join old_runs o on o.run_id = n.run_id
    where o.status = 'started' and n.status <> 'started' and n.concurrency_key is not null
    group by n.flow_slug order by n.flow_slug
  loop
    perform flowlane._begin_held_runs(v_group.flow_slug, v_group.keys);
  end loop;
  return null;
end;
$$;

-- create_flow changed the flow's concurrency options: runs not yet ended take the key of
-- the current pointer (started runs without a limit: none), and held runs that now have room
-- begin (all of them once the limit is gone)
create or replace function flowlane._flow_limits_changed(p_flow text) returns void
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_flow flowlane.flows;
  v_keys text[];
begin
  select * into v_flow from flowlane.flows f where f.flow_slug = p_flow;
  if v_flow.opt_concurrency_limit is null then
    update flowlane.runs r set concurrency_key = null
     where r.flow_slug = p_flow and r.status = 'started' and r.concurrency_key is not null;
  else
    update flowlane.runs r set concurrency_key = flowlane._concurrency_key(v_flow.opt_concurrency_key, r.input)
     where r.flow_slug = p_flow and r.status in ('started', 'waiting')
       and r.concurrency_key is distinct from flowlane._concurrency_key(v_flow.opt_concurrency_key, r.input);
  end if;
  select coalesce(array_agg(distinct r.concurrency_key), '{}') into v_keys
  from flowlane.runs r
  where r.flow_slug = p_flow and r.status = 'waiting' and r.hold_seq is not null;
  perform flowlane._begin_held_runs(p_flow, v_keys);
end;
$$;

-- of tasks about to be sent (bodies {flow_slug, run_id, step_slug, task_index}), those of
-- steps with a concurrency limit take a free slot of their key (FIFO behind tasks already
-- held) or are held; returns the bodies to send now
create or replace function flowlane._take_step_slots(p_bodies jsonb[]) returns jsonb[]
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_group record;
  v_send jsonb[];
begin
  for v_group in
    select s.flow_slug, s.step_slug,
           array_agg(distinct flowlane._concurrency_key(s.opt_concurrency_key, r.input)) as keys
    from unnest(p_bodies) b
    join flowlane.steps s on s.flow_slug = b ->> 'flow_slug' and s.step_slug = b ->> 'step_slug'
    join flowlane.runs r on r.run_id = (b ->> 'run_id')::uuid
    where s.opt_concurrency_limit is not null
    group by 1, 2 order by 1, 2
  loop
    perform flowlane._lock_slots('step:' || v_group.flow_slug || '/' || v_group.step_slug, v_group.keys);
  end loop;
  -- (under the locks: the slots and held tasks of these keys are what earlier holders committed)
  with items as (
    select b.ord, b.body, s.flow_slug, s.step_slug, (b.body ->> 'run_id')::uuid as run_id,
           (b.body ->> 'task_index')::int as task_index, s.opt_concurrency_limit as lim,
           case when s.opt_concurrency_limit is not null
                then flowlane._concurrency_key(s.opt_concurrency_key, r.input) end as key
    from unnest(p_bodies) with ordinality b (body, ord)
    join flowlane.steps s on s.flow_slug = b.body ->> 'flow_slug' and s.step_slug = b.body ->> 'step_slug'
    join flowlane.runs r on r.run_id = (b.body ->> 'run_id')::uuid
  ), ranked as (
    select i.*,
           i.lim is null or (
             not exists (select 1 from flowlane.held_tasks h
                         where h.flow_slug = i.flow_slug and h.step_slug = i.step_slug and h.concurrency_key = i.key)
             and row_number() over (partition by i.flow_slug, i.step_slug, i.key order by i.ord)
                 <= i.lim - (select count(*) from flowlane.step_slots x
                             where x.flow_slug = i.flow_slug and x.step_slug = i.step_slug
                               and x.concurrency_key = i.key)) as send
    from items i
  ), slots as (
    insert into flowlane.step_slots (run_id, step_slug, task_index, flow_slug, concurrency_key)
    select k.run_id, k.step_slug, k.task_index, k.flow_slug, k.key from ranked k
    where k.send and k.key is not null order by 1, 2, 3
    returning 1
  ), held as (
    insert into flowlane.held_tasks (run_id, step_slug, task_index, flow_slug, concurrency_key)
    select k.run_id, k.step_slug, k.task_index, k.flow_slug, k.key from ranked k
    where not k.send order by k.ord
    returning 1
  )
  select coalesce(array_agg(k.body order by k.ord) filter (where k.send), '{}') into v_send
  from ranked k
  where (select count(*) from slots) + (select count(*) from held) >= 0;  -- (both inserts run)
  return v_send;
end;
$$;

-- send tasks (bodies) to one queue and record them; the bodies carry the run's priority
create or replace function flowlane._send_tasks(p_queue text, p_bodies jsonb[], p_delay int) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_n int;
begin
  if coalesce(cardinality(p_bodies), 0) = 0 then
    return;
  end if;
  if exists (select 1 from unnest(p_bodies) b where b ? 'priority') then
    perform flowlane._prioritize_queue(p_queue);
  end if;
  if cardinality(p_bodies) = 1 then  -- a single start or completion (02_queues.sql: _queue_send)
    insert into flowlane.step_tasks (flow_slug, run_id, step_slug, task_index, queue_name, message_id)
    values (p_bodies[1] ->> 'flow_slug', (p_bodies[1] ->> 'run_id')::uuid, p_bodies[1] ->> 'step_slug',
            (p_bodies[1] ->> 'task_index')::int, p_queue, flowlane._queue_send(p_queue, p_bodies[1], p_delay));
    return;
  end if;
  insert into flowlane.step_tasks (flow_slug, run_id, step_slug, task_index, queue_name, message_id)
  select b.body ->> 'flow_slug', (b.body ->> 'run_id')::uuid, b.body ->> 'step_slug',
         (b.body ->> 'task_index')::int, p_queue, m.id
  from flowlane._queue_send_batch(p_queue, p_bodies, p_delay) with ordinality as m (id, ord)
  join unnest(p_bodies) with ordinality as b (body, ord) on b.ord = m.ord;
  get diagnostics v_n = row_count;
  if v_n <> cardinality(p_bodies) then
    raise exception 'internal error: sent % messages to queue % for % tasks', v_n, p_queue, cardinality(p_bodies);
  end if;
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
  perform flowlane._send_tasks(v_step.queue_name, v_bodies, 0);
  return cardinality(v_bodies);
end;
$$;

-- a task that ended frees its step slot: the next held task of its key is sent
create or replace function flowlane._step_slots_freed() returns trigger
language plpgsql volatile
set search_path = ''
as $$
declare
  v_freed record;
  v_group record;
begin
  if not exists (select 1 from flowlane.step_slots) then
    return null;
  end if;
  with freed as (
    delete from flowlane.step_slots s
     using old_tasks o join new_tasks n
           on n.run_id = o.run_id and n.step_slug = o.step_slug and n.task_index = o.task_index
     where o.status in ('queued', 'started') and n.status not in ('queued', 'started')
       and s.run_id = o.run_id and s.step_slug = o.step_slug and s.task_index = o.task_index
    returning s.*
  )
  select coalesce(array_agg(f.flow_slug), '{}') as flows, coalesce(array_agg(f.step_slug), '{}') as steps,
         coalesce(array_agg(f.concurrency_key), '{}') as keys, coalesce(array_agg(r.concurrency_key), '{}') as run_keys
    into v_freed
  from freed f join flowlane.runs r on r.run_id = f.run_id;
  -- run keys first (the lock order): this transaction may end the runs too
  for v_group in
    select f.flow, array_agg(distinct f.run_key) as keys
    from unnest(v_freed.flows, v_freed.run_keys) f (flow, run_key)
    where f.run_key is not null group by 1 order by 1
  loop
    perform flowlane._lock_slots('run:' || v_group.flow, v_group.keys);
  end loop;
  for v_group in
    select f.flow, f.step, array_agg(distinct f.key) as keys
    from unnest(v_freed.flows, v_freed.steps, v_freed.keys) f (flow, step, key)
    group by 1, 2 order by 1, 2
  loop
    perform flowlane._release_held_tasks(v_group.flow, v_group.step, v_group.keys);
  end loop;
  return null;
end;
$$;

-- add_step changed a step's options: held tasks that now have room are sent
create or replace function flowlane._step_limits_changed(p_flow text, p_step text) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_step flowlane.steps;
  v_keys text[];
begin
  select * into v_step from flowlane.steps s where s.flow_slug = p_flow and s.step_slug = p_step;
  -- a new pointer: held and sent tasks take their key from it
  update flowlane.held_tasks h
     set concurrency_key = flowlane._concurrency_key(v_step.opt_concurrency_key, r.input)
    from flowlane.runs r
   where h.flow_slug = p_flow and h.step_slug = p_step and r.run_id = h.run_id
     and h.concurrency_key <> flowlane._concurrency_key(v_step.opt_concurrency_key, r.input);
  update flowlane.step_slots x
     set concurrency_key = flowlane._concurrency_key(v_step.opt_concurrency_key, r.input)
    from flowlane.runs r
   where x.flow_slug = p_flow and x.step_slug = p_step and r.run_id = x.run_id
     and x.concurrency_key <> flowlane._concurrency_key(v_step.opt_concurrency_key, r.input);
  select coalesce(array_agg(distinct h.concurrency_key), '{}') into v_keys
  from flowlane.held_tasks h where h.flow_slug = p_flow and h.step_slug = p_step;
  if cardinality(v_keys) > 0 then
    perform flowlane._release_held_tasks(p_flow, p_step, v_keys);
  end if;
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
    perform flowlane._send_tasks(v_group.queue_name,
      case when v_group.limited then flowlane._take_step_slots(v_group.bodies) else v_group.bodies end, 0);
  end loop;
end;
$$;

-- the first message with a priority on a queue switches its claims to the ordered read
-- (_read_by_priority) and gives its PGMQ table the index that read follows (built in the
-- sending transaction, once: it holds the queue's writers until that transaction commits)
create or replace function flowlane._prioritize_queue(p_queue text) returns void
language plpgsql volatile
security definer
set search_path = ''
as $$
declare
  v_pgmq text;
begin
  update flowlane.queues q set prioritized = true
   where q.queue_name = p_queue and not q.prioritized
  returning q.pgmq_queue_name into v_pgmq;
  if v_pgmq is not null then
    begin
      execute format('create index if not exists %I on pgmq.%I ((coalesce((message ->> ''priority'')::int, 0)) desc, msg_id)',
                     pgmq.format_table_name(v_pgmq, 'q') || '_priority_idx', pgmq.format_table_name(v_pgmq, 'q'));
    exception when insufficient_privilege then
      null;  -- an adopted queue owned by another role: read in order without the index
    end;
  end if;
end;
$$;

-- pgmq.read, in priority order (higher first, then message id): same visibility, same columns
create or replace function flowlane._read_by_priority(p_queue text, p_vt int, p_qty int)
returns setof pgmq.message_record
language plpgsql volatile
set search_path = ''
as $$
declare
  v_table text := pgmq.format_table_name(flowlane._pgmq_queue(p_queue), 'q');
begin
  return query execute format(
    'with cte as (select msg_id from pgmq.%I where vt <= clock_timestamp() '
    '             order by coalesce((message ->> ''priority'')::int, 0) desc, msg_id limit $1 for update skip locked) '
    'update pgmq.%I m set last_read_at = clock_timestamp(), vt = clock_timestamp() + $2, read_ct = read_ct + 1 '
    'from cte where m.msg_id = cte.msg_id '
    'returning m.msg_id, m.read_ct, m.enqueued_at, m.last_read_at, m.vt, m.message, m.headers',
    v_table, v_table) using p_qty, make_interval(secs => p_vt);
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
    select count(*) into v_started from flowlane.task_leases t where t.queue_name = p_queue;
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
    v_now := clock_timestamp();
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

-- the claim is over: the tokens it took and did not use go back to the bucket
create or replace function flowlane._close_queue_gate(p_gate flowlane._queue_gate, p_started int) returns void
language plpgsql volatile
set search_path = ''
as $$
begin
  if p_gate.reserved > p_started then
    update flowlane.queue_limits l set tokens = least(l.rate_limit, l.tokens + (p_gate.reserved - p_started))
     where l.queue_name = p_gate.queue_name;
  end if;
end;
$$;

-- what compiled queue files call: a queue's limits (null: no such limit; both null: none)
create or replace function flowlane.set_queue_limits(queue_name text, concurrency int, rate_limit int, rate_per int)
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
  if set_queue_limits.concurrency is null and set_queue_limits.rate_limit is null then
    delete from flowlane.queue_limits l where l.queue_name = set_queue_limits.queue_name;
    perform flowlane._wake_queue(set_queue_limits.queue_name);
    return null;
  end if;
  insert into flowlane.queue_limits as l (queue_name, concurrency, rate_limit, rate_per, tokens, refilled_at)
  values (set_queue_limits.queue_name, set_queue_limits.concurrency, set_queue_limits.rate_limit,
          set_queue_limits.rate_per, coalesce(set_queue_limits.rate_limit, 0), clock_timestamp())
  on conflict on constraint queue_limits_pkey do update
    set concurrency = excluded.concurrency, rate_limit = excluded.rate_limit, rate_per = excluded.rate_per,
        tokens = least(l.tokens, coalesce(excluded.rate_limit, 0)), updated_at = now()
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
-- (those queues behave as undeclared); returns their names
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
  return v_deleted;
end;
$$;

-- workers waiting on a queue look again (its insert channel, as a new message would)
create or replace function flowlane._wake_queue(p_queue text) returns void
language sql volatile
set search_path = ''
as $$
  select pg_notify('pgmq.' || pgmq.format_table_name(q.pgmq_queue_name, 'q') || '.INSERT', null)
  from flowlane.queues q where q.queue_name = p_queue
$$;

-- the rate limit's bucket at p_at: tokens (at most rate_limit: the burst), refilled at
-- rate_limit per rate_per seconds since refilled_at
create or replace function flowlane._bucket_tokens(p_limits flowlane.queue_limits, p_at timestamptz) returns double precision
language sql immutable
set search_path = ''
as $$
  select least(p_limits.rate_limit::double precision,
               p_limits.tokens + greatest(0, extract(epoch from p_at - p_limits.refilled_at))::double precision
                                 * p_limits.rate_limit / p_limits.rate_per)
$$;

-- seconds until the bucket holds a whole token again
create or replace function flowlane._next_start_in(p_limits flowlane.queue_limits, p_at timestamptz) returns double precision
language sql immutable
set search_path = ''
as $$
  select greatest(0, 1 - flowlane._bucket_tokens(p_limits, p_at)) * p_limits.rate_per / p_limits.rate_limit
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
         case when l.rate_limit is not null then flowlane._bucket_tokens(l, clock_timestamp()) end,
         case when l.rate_limit is not null then flowlane._next_start_in(l, clock_timestamp()) end,
         case when l.concurrency is not null and c.started >= l.concurrency
                then format('queue concurrency %s: %s of %s started', l.queue_name, c.started, l.concurrency)
              when l.rate_limit is not null and flowlane._bucket_tokens(l, clock_timestamp()) < 1
                then format('rate limit %s: next start in %s s', l.queue_name,
                            round(flowlane._next_start_in(l, clock_timestamp())::numeric, 1))
         end
  from flowlane.queue_limits l
  cross join lateral (select count(*) as started from flowlane.task_leases t where t.queue_name = l.queue_name) c
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
  select r.run_id, null, null, format('start at %s', r.start_at), null
  from flowlane.runs r
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

-- held runs and tasks whose key has room begin (the transaction that freed the slot begins
-- them already; this catches a slot freed while its next run was locked by another
-- transaction, or limits raised by hand); returns how many runs and tasks began
create or replace function flowlane._release_held(p_now timestamptz) returns int
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_group record;
  v_n int := 0;
begin
  for v_group in
    select r.flow_slug, array_agg(distinct r.concurrency_key) as keys
    from flowlane.runs r
    join flowlane.flows f on f.flow_slug = r.flow_slug
    where r.status = 'waiting' and r.hold_seq is not null
      and (f.opt_concurrency_limit is null
           or f.opt_concurrency_limit > (select count(*) from flowlane.runs s
                                         where s.flow_slug = r.flow_slug and s.concurrency_key = r.concurrency_key
                                           and s.status = 'started'))
    group by r.flow_slug order by r.flow_slug
  loop
    v_n := v_n + cardinality(flowlane._begin_held_runs(v_group.flow_slug, v_group.keys));
  end loop;
  for v_group in
    select h.flow_slug, h.step_slug, array_agg(distinct h.concurrency_key) as keys
    from flowlane.held_tasks h
    join flowlane.steps s on s.flow_slug = h.flow_slug and s.step_slug = h.step_slug
    where s.opt_concurrency_limit is null
       or s.opt_concurrency_limit > (select count(*) from flowlane.step_slots x
                                     where x.flow_slug = h.flow_slug and x.step_slug = h.step_slug
                                       and x.concurrency_key = h.concurrency_key)
       or not exists (select 1 from flowlane.runs r where r.run_id = h.run_id and r.status = 'started')
    group by 1, 2 order by 1, 2
  loop
    v_n := v_n + flowlane._release_held_tasks(v_group.flow_slug, v_group.step_slug, v_group.keys);
  end loop;
  return v_n;
end;
$$;

-- written at run time by the source, by a function that the part written by hand below calls: _queue_archive, _queue_archive_batch, _queue_read, _queue_send, _queue_send_batch, _queue_set_vt

-- == Written by hand: what calls the functions (checks, defaults, triggers, data) ==

-- Rules, defaults and triggers that call the functions above. Written by hand.
drop type flowlane.step_task_record;

alter table flowlane.flows
  alter column opt_max_attempts set default flowlane._flow_option_default('max_attempts'),
  alter column opt_base_delay set default flowlane._flow_option_default('base_delay'),
  alter column opt_timeout set default flowlane._flow_option_default('timeout'),
  alter column opt_retention set default flowlane._flow_option_default('retention');
alter table flowlane.runs add constraint runs_rules check (flowlane._runs_rules(status, started_at,
  completed_at, failed_at, cancelled_at, cancel_reason, output is not null, remaining_steps, retry_count,
  called_as, idempotency_key, start_at, schedule_name, schedule_slot, parent_run_id, parent_step_slug,
  parent_task_index, concurrency_key, hold_seq, priority));
alter table flowlane.step_states add constraint step_states_rules check (flowlane._step_states_rules(status,
  remaining_deps, initial_tasks, remaining_tasks, output is not null, skip_reason, created_at, started_at,
  completed_at, failed_at, skipped_at, cancelled_at));
alter table flowlane.step_tasks add constraint step_tasks_rules check (flowlane._step_tasks_rules(status,
  task_index, attempts_count, requeued_count, output is not null, queued_at, started_at, completed_at,
  failed_at, skipped_at, cancelled_at));
alter table flowlane.worker_deployments add constraint worker_deployments_name_valid
  check (flowlane.is_valid_deployment_name(deployment_name));

create constraint trigger tune_registered_queue
after insert on flowlane.queues
deferrable initially deferred
for each row execute function flowlane._tune_registered_queue();

create constraint trigger queue_ops_registered
after insert on flowlane.queues
deferrable initially deferred
for each row execute function flowlane._queue_ops_registered();

create trigger flows_not_named_like_alias
  before insert on flowlane.flows
  for each row execute function flowlane._forbid_flow_named_like_alias();

create trigger flows_delete_keeps_aliases_sound
  before delete on flowlane.flows
  for each row execute function flowlane._flow_delete_keeps_aliases_sound();

create trigger flows_notify_changed
after insert or update or delete on flowlane.flows
for each row execute function flowlane._notify_definitions_changed();

create trigger steps_notify_changed
after insert or update or delete on flowlane.steps
for each row execute function flowlane._notify_definitions_changed();

create trigger deps_notify_changed
after insert or update or delete on flowlane.deps
for each row execute function flowlane._notify_definitions_changed();

create trigger aliases_notify_changed
after insert or update or delete on flowlane.aliases
for each row execute function flowlane._notify_definitions_changed();

create trigger queues_notify_changed
after insert or update or delete on flowlane.queues
for each row execute function flowlane._notify_definitions_changed();

create trigger runs_input_limits before insert on flowlane.runs
for each row execute function flowlane._check_run_input();

create trigger step_states_keep_skip_error
  before update of status on flowlane.step_states
  for each row
  when (new.status = 'skipped' and new.skip_reason = 'handler_failed')
  execute function flowlane._keep_skip_error();

create trigger runs_notify_finished
  after update on flowlane.runs
  referencing old table as old_runs new table as new_runs
  for each statement execute function flowlane._notify_run_finished();

create trigger step_tasks_leases_on_insert
  after insert on flowlane.step_tasks
  referencing new table as new_tasks
  for each statement execute function flowlane._track_leases();

create trigger step_tasks_leases_on_update
  after update on flowlane.step_tasks
  referencing old table as old_tasks new table as new_tasks
  for each statement execute function flowlane._track_leases();

create trigger step_tasks_leases_on_delete
  after delete on flowlane.step_tasks
  referencing old table as old_tasks
  for each statement execute function flowlane._track_leases();

create trigger step_tasks_attempt_history
  after update of status on flowlane.step_tasks
  for each row
  when (old.status = 'started' and new.status in ('queued', 'failed'))
  execute function flowlane._record_attempt();

create trigger worker_deployments_notify_added
after insert or delete on flowlane.worker_deployments
for each row execute function flowlane._notify_definitions_changed();

create trigger worker_deployments_notify_enabled
after update of enabled on flowlane.worker_deployments
for each row when (old.enabled is distinct from new.enabled)
execute function flowlane._notify_definitions_changed();

create trigger runs_report_to_parent
  after update of status on flowlane.runs
  for each row
  when (old.status in ('started', 'waiting') and new.status not in ('started', 'waiting')
        and new.parent_run_id is not null)
  execute function flowlane._report_to_parent();

create trigger runs_end_children
  after update of status on flowlane.runs
  for each row
  when (old.status = 'started' and new.status in ('failed', 'cancelled'))
  execute function flowlane._end_children();

create trigger runs_slots_freed
  after update on flowlane.runs
  referencing old table as old_runs new table as new_runs
  for each statement execute function flowlane._run_slots_freed();

create trigger step_tasks_slots_freed
  after update on flowlane.step_tasks
  referencing old table as old_tasks new table as new_tasks
  for each statement execute function flowlane._step_slots_freed();

-- The queue operations the functions call, written for the queues.
select flowlane._write_queue_ops();

-- The tasks started before the upgrade hold leases: stalled recovery finds them.
insert into flowlane.task_leases (run_id, step_slug, task_index, started_at, queue_name)
select t.run_id, t.step_slug, t.task_index, t.started_at, t.queue_name
from flowlane.step_tasks t
where t.status = 'started'
order by 1, 2, 3;

-- A task the original core marked permanently stalled lost its message and would stay
-- started forever: it fails as exhausted, which ends its run as its step says (the run can
-- then be retried).
do $$
declare
  v_task flowlane.step_tasks;
begin
  for v_task in
    select t.* from flowlane.step_tasks t
    join flowlane.runs r on r.run_id = t.run_id and r.status = 'started'
    where t.status = 'started' and t.permanently_stalled_at is not null
    order by t.run_id, t.step_slug, t.task_index
  loop
    perform 1 from flowlane.runs r where r.run_id = v_task.run_id and r.status = 'started' for update;
    continue when not found;
    perform flowlane._exhaust_task(v_task, format(
      'no result within %s s, %s attempts (the original core stopped retrying it)',
      (select o.timeout from flowlane.step_options o
        where o.flow_slug = v_task.flow_slug and o.step_slug = v_task.step_slug),
      v_task.attempts_count));
  end loop;
end;
$$;

-- Queues that PGMQ's own insert notifications were enabled on get flowlane's instead.
select flowlane.enable_queue_notify(t.queue_name)
from pgmq.list_notify_insert_throttles() t
order by t.queue_name;

-- Queue tables tuned like new ones.
select flowlane._tune_queue_table(q.pgmq_queue_name)
from flowlane.queues q
order by q.queue_name;
