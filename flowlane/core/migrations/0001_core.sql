-- flowlane SQL Core 0001: the engine with one PGMQ queue per flow.
--
-- The queue of a flow is lower(flow_slug); create_flow creates it.
-- Row state is the truth; PGMQ messages are the lease and the wake-up.
-- Every function is `set search_path = ''` and fully schema-qualified.
-- Lock order everywhere: run, then step state, then children by slug.
-- Every PGMQ archive / set_vt goes through _archive_tasks / _set_tasks_vt,
-- which group the tasks by queue.

create schema if not exists flowlane;

-- ---------------------------------------------------------------------------
-- names
-- ---------------------------------------------------------------------------

create function flowlane.is_valid_slug(slug text) returns boolean
language sql immutable parallel safe
set search_path = ''
as $$
  select slug is not null
     and length(slug) between 1 and 128
     and slug ~ '^[a-zA-Z][a-zA-Z0-9_]*$'
     and position('__' in slug) = 0
     and right(slug, 1) <> '_'
     and lower(slug) <> 'run'
$$;

create function flowlane._check_slug(kind text, slug text) returns void
language plpgsql stable
set search_path = ''
as $$
begin
  if not flowlane.is_valid_slug(slug) then
    raise exception 'invalid % slug %: a slug matches ^[a-zA-Z][a-zA-Z0-9_]*$, has 1..128 characters, no "__", no trailing "_", and is not "run"',
      kind, coalesce(quote_literal(slug), 'NULL')
      using errcode = '22023';
  end if;
end;
$$;

-- ---------------------------------------------------------------------------
-- tables
-- ---------------------------------------------------------------------------

create table flowlane.flows (
  flow_slug text primary key,
  opt_max_attempts int not null default 3,
  opt_base_delay int not null default 5,
  opt_timeout int not null default 60,
  created_at timestamptz not null default now(),
  constraint flows_slug_valid check (flowlane.is_valid_slug(flow_slug)),
  constraint flows_max_attempts_positive check (opt_max_attempts >= 1),
  constraint flows_base_delay_nonnegative check (opt_base_delay >= 0),
  constraint flows_timeout_positive check (opt_timeout >= 1)
);
create unique index flows_slug_ci_unique on flowlane.flows (lower(flow_slug));

create table flowlane.steps (
  flow_slug text not null references flowlane.flows (flow_slug),
  step_slug text not null,
  step_type text not null default 'single',
  step_index int not null,
  deps_count int not null default 0,
  opt_max_attempts int,
  opt_base_delay int,
  opt_timeout int,
  opt_start_delay int,
  required_input_pattern jsonb,
  forbidden_input_pattern jsonb,
  when_unmet text not null default 'skip',
  when_exhausted text not null default 'fail',
  created_at timestamptz not null default now(),
  primary key (flow_slug, step_slug),
  constraint steps_index_unique unique (flow_slug, step_index),
  constraint steps_slug_valid check (flowlane.is_valid_slug(step_slug)),
  constraint steps_type_valid check (step_type in ('single', 'map')),
  constraint steps_index_nonnegative check (step_index >= 0),
  constraint steps_deps_count_nonnegative check (deps_count >= 0),
  constraint steps_map_deps check (step_type <> 'map' or deps_count <= 1),
  constraint steps_max_attempts_positive check (opt_max_attempts is null or opt_max_attempts >= 1),
  constraint steps_base_delay_nonnegative check (opt_base_delay is null or opt_base_delay >= 0),
  constraint steps_timeout_positive check (opt_timeout is null or opt_timeout >= 1),
  constraint steps_start_delay_nonnegative check (opt_start_delay is null or opt_start_delay >= 0),
  constraint steps_required_pattern_object check (
    required_input_pattern is null or jsonb_typeof(required_input_pattern) = 'object'),
  constraint steps_forbidden_pattern_object check (
    forbidden_input_pattern is null or jsonb_typeof(forbidden_input_pattern) = 'object'),
  constraint steps_when_unmet_valid check (when_unmet in ('skip', 'skip-cascade', 'fail')),
  constraint steps_when_exhausted_valid check (when_exhausted in ('fail', 'skip', 'skip-cascade')),
  constraint steps_when_unmet_needs_pattern check (
    when_unmet = 'skip' or required_input_pattern is not null or forbidden_input_pattern is not null)
);
create unique index steps_slug_ci_unique on flowlane.steps (flow_slug, lower(step_slug));

create table flowlane.deps (
  flow_slug text not null,
  dep_slug text not null,
  step_slug text not null,
  created_at timestamptz not null default now(),
  primary key (flow_slug, dep_slug, step_slug),
  foreign key (flow_slug, dep_slug) references flowlane.steps (flow_slug, step_slug),
  foreign key (flow_slug, step_slug) references flowlane.steps (flow_slug, step_slug),
  constraint deps_not_self check (dep_slug <> step_slug)
);
create index deps_child_idx on flowlane.deps (flow_slug, step_slug);

create table flowlane.workers (
  worker_id uuid primary key,
  queue_name text not null,
  worker_name text not null,
  started_at timestamptz not null default now(),
  last_heartbeat_at timestamptz not null default now(),
  deprecated_at timestamptz,
  stopped_at timestamptz,
  constraint workers_heartbeat_after_start check (last_heartbeat_at >= started_at),
  constraint workers_stopped_after_start check (stopped_at is null or stopped_at >= started_at)
);
create index workers_queue_idx on flowlane.workers (queue_name);

create table flowlane.runs (
  run_id uuid primary key default gen_random_uuid(),
  flow_slug text not null references flowlane.flows (flow_slug),
  status text not null default 'started',
  input jsonb not null,
  output jsonb,
  error_message text,
  remaining_steps int not null default 0,
  started_at timestamptz not null default now(),
  completed_at timestamptz,
  failed_at timestamptz,
  constraint runs_status_valid check (status in ('started', 'completed', 'failed')),
  constraint runs_remaining_steps_nonnegative check (remaining_steps >= 0),
  constraint runs_completed_at check ((status = 'completed') = (completed_at is not null)),
  constraint runs_failed_at check ((status = 'failed') = (failed_at is not null)),
  constraint runs_completed_after_start check (completed_at is null or completed_at >= started_at),
  constraint runs_failed_after_start check (failed_at is null or failed_at >= started_at),
  constraint runs_output_only_completed check (output is null or status = 'completed')
);
create index runs_flow_idx on flowlane.runs (flow_slug);
create index runs_status_idx on flowlane.runs (status);

create table flowlane.step_states (
  flow_slug text not null references flowlane.flows (flow_slug),
  run_id uuid not null references flowlane.runs (run_id),
  step_slug text not null,
  status text not null default 'created',
  remaining_deps int not null default 0,
  initial_tasks int,
  remaining_tasks int,
  output jsonb,
  error_message text,
  skip_reason text,
  created_at timestamptz not null default now(),
  started_at timestamptz,
  completed_at timestamptz,
  failed_at timestamptz,
  skipped_at timestamptz,
  primary key (run_id, step_slug),
  foreign key (flow_slug, step_slug) references flowlane.steps (flow_slug, step_slug),
  constraint step_states_status_valid check (
    status in ('created', 'started', 'completed', 'failed', 'skipped')),
  constraint step_states_remaining_deps_nonnegative check (remaining_deps >= 0),
  constraint step_states_initial_tasks_nonnegative check (initial_tasks is null or initial_tasks >= 0),
  constraint step_states_remaining_tasks_nonnegative check (remaining_tasks is null or remaining_tasks >= 0),
  constraint step_states_completed_no_remaining check (status <> 'completed' or remaining_tasks = 0),
  constraint step_states_started_sized check (
    status <> 'started' or (initial_tasks is not null and remaining_tasks is not null)),
  constraint step_states_unstarted_no_remaining check (
    status not in ('created', 'skipped') or remaining_tasks is null),
  constraint step_states_output_only_completed check (output is null or status = 'completed'),
  constraint step_states_skip_reason check ((status = 'skipped') = (skip_reason is not null)),
  constraint step_states_skip_reason_valid check (
    skip_reason is null or skip_reason in ('condition_unmet', 'handler_failed', 'dependency_skipped')),
  constraint step_states_completed_at check ((status = 'completed') = (completed_at is not null)),
  constraint step_states_failed_at check ((status = 'failed') = (failed_at is not null)),
  constraint step_states_skipped_at check ((status = 'skipped') = (skipped_at is not null)),
  constraint step_states_started_after_created check (started_at is null or started_at >= created_at),
  constraint step_states_completed_after_started check (
    completed_at is null or completed_at >= coalesce(started_at, created_at)),
  constraint step_states_failed_after_created check (
    failed_at is null or failed_at >= coalesce(started_at, created_at)),
  constraint step_states_skipped_after_created check (skipped_at is null or skipped_at >= created_at)
);
create index step_states_ready_idx on flowlane.step_states (run_id, status, remaining_deps)
  where status = 'created' and remaining_deps = 0;
create index step_states_flow_idx on flowlane.step_states (flow_slug);

create table flowlane.step_tasks (
  flow_slug text not null references flowlane.flows (flow_slug),
  run_id uuid not null references flowlane.runs (run_id),
  step_slug text not null,
  task_index int not null default 0,
  message_id bigint,
  status text not null default 'queued',
  attempts_count int not null default 0,
  error_message text,
  output jsonb,
  last_worker_id uuid,
  requeued_count int not null default 0,
  queued_at timestamptz not null default now(),
  started_at timestamptz,
  completed_at timestamptz,
  failed_at timestamptz,
  skipped_at timestamptz,
  cancelled_at timestamptz,
  last_requeued_at timestamptz,
  permanently_stalled_at timestamptz,
  primary key (run_id, step_slug, task_index),
  foreign key (run_id, step_slug) references flowlane.step_states (run_id, step_slug),
  constraint step_tasks_status_valid check (
    status in ('queued', 'started', 'completed', 'failed', 'skipped', 'cancelled')),
  constraint step_tasks_task_index_nonnegative check (task_index >= 0),
  constraint step_tasks_attempts_nonnegative check (attempts_count >= 0),
  constraint step_tasks_requeued_nonnegative check (requeued_count >= 0),
  constraint step_tasks_output_only_done check (output is null or status in ('completed', 'failed')),
  constraint step_tasks_started_at check (status <> 'started' or started_at is not null),
  constraint step_tasks_completed_at check ((status = 'completed') = (completed_at is not null)),
  constraint step_tasks_failed_at check ((status = 'failed') = (failed_at is not null)),
  constraint step_tasks_skipped_at check ((status = 'skipped') = (skipped_at is not null)),
  constraint step_tasks_cancelled_at check ((status = 'cancelled') = (cancelled_at is not null)),
  constraint step_tasks_started_after_queued check (started_at is null or started_at >= queued_at),
  constraint step_tasks_completed_after_started check (
    completed_at is null or completed_at >= coalesce(started_at, queued_at)),
  constraint step_tasks_failed_after_queued check (failed_at is null or failed_at >= queued_at),
  constraint step_tasks_skipped_after_queued check (skipped_at is null or skipped_at >= queued_at),
  constraint step_tasks_cancelled_after_queued check (cancelled_at is null or cancelled_at >= queued_at)
);
create index step_tasks_message_idx on flowlane.step_tasks (flow_slug, message_id);
create index step_tasks_started_idx on flowlane.step_tasks (started_at) where status = 'started';
create index step_tasks_active_idx on flowlane.step_tasks (run_id, step_slug)
  where status in ('queued', 'started');

create type flowlane.step_task_record as (
  flow_slug text,
  step_slug text,
  run_id uuid,
  task_index int,
  input jsonb,
  flow_input jsonb,
  attempt int,
  msg_id bigint
);

-- ---------------------------------------------------------------------------
-- private helpers: queues and messages
-- ---------------------------------------------------------------------------

-- the queue a task's message lives on (0001: the flow's queue)
create function flowlane._task_queue(task flowlane.step_tasks) returns text
language sql stable
set search_path = ''
as $$ select lower(($1).flow_slug) $$;

-- archive the messages of the given tasks, one pgmq.archive call per queue
create function flowlane._archive_tasks(tasks flowlane.step_tasks[]) returns int
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
    select count(*) into v_n from pgmq.archive(v_group.queue_name, v_group.ids);
    v_total := v_total + v_n;
  end loop;
  return v_total;
end;
$$;

-- set the visibility of the given tasks' messages to now + offsets[i] seconds;
-- grouped by (queue, offset); returns the number of messages updated
create function flowlane._set_tasks_vt(tasks flowlane.step_tasks[], offsets int[]) returns int
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
    select count(*) into v_n from pgmq.set_vt(v_group.queue_name, v_group.ids, v_group.vt_offset);
    v_total := v_total + v_n;
  end loop;
  return v_total;
end;
$$;

-- ---------------------------------------------------------------------------
-- public helpers
-- ---------------------------------------------------------------------------

create function flowlane.calculate_retry_delay(base_delay int, attempts int) returns int
language sql immutable parallel safe
set search_path = ''
as $$
  select least(floor(greatest(base_delay, 0) * power(2::numeric, greatest(attempts, 0))), 2147483647)::int
$$;

create function flowlane._effective_timeout(p_flow_slug text, p_step_slug text) returns int
language sql stable
set search_path = ''
as $$
  select coalesce(s.opt_timeout, f.opt_timeout)
  from flowlane.steps s join flowlane.flows f on f.flow_slug = s.flow_slug
  where s.flow_slug = p_flow_slug and s.step_slug = p_step_slug
$$;

-- ---------------------------------------------------------------------------
-- definitions
-- ---------------------------------------------------------------------------

create function flowlane.create_flow(
  flow_slug text,
  max_attempts int = null,
  base_delay int = null,
  timeout int = null
) returns flowlane.flows
language plpgsql volatile
set search_path = ''
as $$
declare
  v_flow flowlane.flows;
  v_other text;
  v_queue text := lower(create_flow.flow_slug);
begin
  perform flowlane._check_slug('flow', create_flow.flow_slug);
  select f.flow_slug into v_other from flowlane.flows f
  where lower(f.flow_slug) = lower(create_flow.flow_slug) and f.flow_slug <> create_flow.flow_slug;
  if found then
    raise exception 'flow slug "%" conflicts with existing flow "%" (flow slugs are unique case-insensitively)',
      create_flow.flow_slug, v_other using errcode = '23505';
  end if;
  insert into flowlane.flows as f (flow_slug, opt_max_attempts, opt_base_delay, opt_timeout)
  values (create_flow.flow_slug, coalesce(max_attempts, 3), coalesce(base_delay, 5), coalesce(timeout, 60))
  on conflict on constraint flows_pkey do update
    set opt_max_attempts = excluded.opt_max_attempts,
        opt_base_delay = excluded.opt_base_delay,
        opt_timeout = excluded.opt_timeout
  returning * into v_flow;
  if not exists (select 1 from pgmq.list_queues() q where q.queue_name = v_queue) then
    perform pgmq.create(v_queue);
  end if;
  return v_flow;
end;
$$;

create function flowlane._shape_mismatch(p_flow text, p_step text, p_field text, p_db text, p_given text)
returns void
language plpgsql stable
set search_path = ''
as $$
begin
  raise exception 'FLOWLANE_SHAPE_MISMATCH: step "%" of flow "%" already exists with a different %: % in the database, % given',
    p_step, p_flow, p_field, coalesce(p_db, 'null'), coalesce(p_given, 'null')
    using errcode = '23514',
          hint = 'the shape of a flow never changes once created; create a new flow version (a new slug)';
end;
$$;

create function flowlane.add_step(
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
  when_exhausted text = 'fail'
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
  v_existing flowlane.steps;
  v_existing_deps text[];
  v_sorted_deps text[];
  v_dep text;
  v_other text;
  v_row flowlane.steps;
begin
  perform 1 from flowlane.flows f where f.flow_slug = v_flow for update;
  if not found then
    raise exception 'unknown flow "%": create it with flowlane.create_flow first', v_flow
      using errcode = '23503';
  end if;
  perform flowlane._check_slug('step', v_step);
  if v_type not in ('single', 'map') then
    raise exception 'step "%" of flow "%": step_type must be single or map, not %', v_step, v_flow,
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
    update flowlane.steps s
       set opt_max_attempts = max_attempts, opt_base_delay = base_delay,
           opt_timeout = timeout, opt_start_delay = start_delay
     where s.flow_slug = v_flow and s.step_slug = v_step
    returning * into v_row;
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

  insert into flowlane.steps (flow_slug, step_slug, step_type, step_index, deps_count,
    opt_max_attempts, opt_base_delay, opt_timeout, opt_start_delay,
    required_input_pattern, forbidden_input_pattern, when_unmet, when_exhausted)
  values (v_flow, v_step, v_type,
    (select coalesce(max(s.step_index) + 1, 0) from flowlane.steps s where s.flow_slug = v_flow),
    cardinality(v_sorted_deps), max_attempts, base_delay, timeout, start_delay,
    required_input_pattern, forbidden_input_pattern, v_unmet, v_exhausted)
  returning * into v_row;
  insert into flowlane.deps (flow_slug, dep_slug, step_slug)
  select v_flow, d, v_step from unnest(v_sorted_deps) d;
  return v_row;
end;
$$;

create function flowlane.resolve_flow(flow_slug_or_alias text) returns text
language plpgsql stable
set search_path = ''
as $$
declare
  v_slug text;
begin
  select f.flow_slug into v_slug from flowlane.flows f where f.flow_slug = flow_slug_or_alias;
  if not found then
    raise exception 'unknown flow "%"', flow_slug_or_alias
      using errcode = 'P0002', hint = 'create the flow (apply its compiled SQL) before starting runs';
  end if;
  return v_slug;
end;
$$;

-- ---------------------------------------------------------------------------
-- run machinery (private)
-- ---------------------------------------------------------------------------

-- the value a step's condition is tested against: the run input for a root
-- step, {dep: output} of its completed deps otherwise
create function flowlane._condition_subject(p_run_id uuid, p_step_slug text) returns jsonb
language sql stable
set search_path = ''
as $$
  select case when s.deps_count = 0 then r.input else
    coalesce((select jsonb_object_agg(d.dep_slug, ps.output)
              from flowlane.deps d
              join flowlane.step_states ps on ps.run_id = p_run_id and ps.step_slug = d.dep_slug
              where d.flow_slug = s.flow_slug and d.step_slug = s.step_slug and ps.status = 'completed'),
             '{}'::jsonb) end
  from flowlane.runs r
  join flowlane.steps s on s.flow_slug = r.flow_slug and s.step_slug = p_step_slug
  where r.run_id = p_run_id
$$;

create function flowlane._condition_met(p_run_id uuid, p_step_slug text) returns boolean
language sql stable
set search_path = ''
as $$
  -- the subject (which may hold large outputs) is built only for a step with a condition
  select case
    when s.required_input_pattern is null and s.forbidden_input_pattern is null then true
    else (select (s.required_input_pattern is null or x.subj @> s.required_input_pattern)
             and (s.forbidden_input_pattern is null or not x.subj @> s.forbidden_input_pattern)
          from (select flowlane._condition_subject(p_run_id, p_step_slug) as subj) x)
  end
  from flowlane.runs r
  join flowlane.steps s on s.flow_slug = r.flow_slug and s.step_slug = p_step_slug
  where r.run_id = p_run_id
$$;

-- a task's input: the element of the run input (root map) or of the parent's
-- output (dependent map); the run input for a root single step; otherwise
-- {dep: output} of the completed deps (skipped deps are absent)
create function flowlane._task_input(p_run_id uuid, p_step_slug text, p_task_index int) returns jsonb
language sql stable
set search_path = ''
as $$
  select case
    when s.step_type = 'map' and s.deps_count = 0 then r.input -> p_task_index
    when s.step_type = 'map' then
      (select ps.output -> p_task_index
       from flowlane.deps d
       join flowlane.step_states ps on ps.run_id = p_run_id and ps.step_slug = d.dep_slug
       where d.flow_slug = s.flow_slug and d.step_slug = s.step_slug)
    when s.deps_count = 0 then r.input
    else flowlane._condition_subject(p_run_id, p_step_slug)
  end
  from flowlane.runs r
  join flowlane.steps s on s.flow_slug = r.flow_slug and s.step_slug = p_step_slug
  where r.run_id = p_run_id
$$;

-- run failed: cancel its unfinished tasks and archive their messages
create function flowlane._fail_run(p_run_id uuid, p_error text) returns void
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
end;
$$;

-- release the children of a step that just became terminal (completed or skipped)
create function flowlane._release_children(p_run_id uuid, p_step_slug text, p_output jsonb, p_skipped boolean)
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
         initial_tasks = case
           when cs.status <> 'created' or cs.initial_tasks is not null or cst.step_type <> 'map' then cs.initial_tasks
           when p_skipped then 0
           when jsonb_typeof(p_output) = 'array' then jsonb_array_length(p_output)
           else cs.initial_tasks end
    from flowlane.deps d, flowlane.steps cst
   where cs.run_id = p_run_id
     and d.flow_slug = cs.flow_slug and d.dep_slug = p_step_slug and d.step_slug = cs.step_slug
     and cst.flow_slug = cs.flow_slug and cst.step_slug = cs.step_slug;
end;
$$;

create function flowlane._complete_step(p_run_id uuid, p_step_slug text, p_output jsonb) returns void
language plpgsql volatile
set search_path = ''
as $$
begin
  update flowlane.step_states s
     set status = 'completed', output = p_output, remaining_tasks = 0,
         started_at = coalesce(s.started_at, now()), completed_at = now()
   where s.run_id = p_run_id and s.step_slug = p_step_slug and s.status in ('created', 'started');
  if not found then
    return;
  end if;
  update flowlane.runs r set remaining_steps = r.remaining_steps - 1 where r.run_id = p_run_id;
  perform flowlane._release_children(p_run_id, p_step_slug, p_output, false);
end;
$$;

-- skip one step (created or started): its unfinished tasks become skipped and
-- their messages are archived; children are released (a map child of a
-- skipped parent gets 0 tasks)
create function flowlane._skip_step(p_run_id uuid, p_step_slug text, p_reason text) returns boolean
language plpgsql volatile
set search_path = ''
as $$
declare
  v_tasks flowlane.step_tasks[];
begin
  update flowlane.step_states s
     set status = 'skipped', skip_reason = p_reason, skipped_at = now(), remaining_tasks = null
   where s.run_id = p_run_id and s.step_slug = p_step_slug and s.status in ('created', 'started');
  if not found then
    return false;
  end if;
  with skipped as (
    update flowlane.step_tasks t set status = 'skipped', skipped_at = now()
     where t.run_id = p_run_id and t.step_slug = p_step_slug and t.status in ('queued', 'started')
    returning t
  ) select coalesce(array_agg(k.t), '{}') into v_tasks from skipped k;
  perform flowlane._archive_tasks(v_tasks);
  update flowlane.runs r set remaining_steps = r.remaining_steps - 1 where r.run_id = p_run_id;
  perform flowlane._release_children(p_run_id, p_step_slug, null, true);
  return true;
end;
$$;

-- skip a step and every transitive dependent (reason dependency_skipped)
create function flowlane._skip_cascade(p_run_id uuid, p_step_slug text, p_reason text) returns int
language plpgsql volatile
set search_path = ''
as $$
declare
  v_flow text;
  v_step record;
  v_count int := 0;
begin
  select r.flow_slug into v_flow from flowlane.runs r where r.run_id = p_run_id;
  for v_step in
    with recursive down(step_slug) as (
      select p_step_slug
      union
      select d.step_slug from flowlane.deps d join down on d.dep_slug = down.step_slug
      where d.flow_slug = v_flow
    )
    select s.step_slug from down join flowlane.steps s on s.flow_slug = v_flow and s.step_slug = down.step_slug
    order by s.step_index
  loop
    if flowlane._skip_step(p_run_id, v_step.step_slug,
         case when v_step.step_slug = p_step_slug then p_reason else 'dependency_skipped' end) then
      v_count := v_count + 1;
    end if;
  end loop;
  return v_count;
end;
$$;

-- resolve conditions and complete task-less steps until nothing changes;
-- false when the run failed (a when_unmet=fail condition)
create function flowlane._advance(p_run_id uuid) returns boolean
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
           set status = 'failed', failed_at = now(), error_message = 'condition not met'
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

create function flowlane._maybe_complete_run(p_run_id uuid) returns void
language plpgsql volatile
set search_path = ''
as $$
begin
  update flowlane.runs r
     set status = 'completed', completed_at = now(),
         output = coalesce((
           select jsonb_object_agg(ss.step_slug, ss.output)
           from flowlane.step_states ss
           where ss.run_id = r.run_id and ss.status = 'completed'
             and not exists (select 1 from flowlane.deps d
                             where d.flow_slug = ss.flow_slug and d.dep_slug = ss.step_slug)
         ), '{}'::jsonb)
   where r.run_id = p_run_id and r.status = 'started' and r.remaining_steps = 0;
end;
$$;

create function flowlane._progress(p_run_id uuid) returns void
language plpgsql volatile
set search_path = ''
as $$
begin
  if flowlane._advance(p_run_id) then
    perform flowlane.start_ready_steps(p_run_id);
    perform flowlane._maybe_complete_run(p_run_id);
  end if;
end;
$$;

-- ---------------------------------------------------------------------------
-- runs
-- ---------------------------------------------------------------------------

create function flowlane.start_ready_steps(run_id uuid) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_run flowlane.runs;
  v_slugs text[];
  v_counts int[];
  v_delays int[];
  v_ids bigint[];
  v_queue text;
begin
  select * into v_run from flowlane.runs r where r.run_id = start_ready_steps.run_id for update;
  if not found or v_run.status <> 'started' then
    return;
  end if;
  v_queue := lower(v_run.flow_slug);
  with ready as (
    select ss.step_slug
    from flowlane.step_states ss
    where ss.run_id = v_run.run_id and ss.status = 'created' and ss.remaining_deps = 0
      and ss.initial_tasks > 0 and flowlane._condition_met(v_run.run_id, ss.step_slug)
    order by ss.step_slug
    for update
  ), started as (
    update flowlane.step_states ss
       set status = 'started', started_at = now(), remaining_tasks = ss.initial_tasks
      from ready
     where ss.run_id = v_run.run_id and ss.step_slug = ready.step_slug
    returning ss.step_slug, ss.initial_tasks
  )
  select coalesce(array_agg(st.step_slug order by s.step_index), '{}'),
         coalesce(array_agg(st.initial_tasks order by s.step_index), '{}'),
         coalesce(array_agg(coalesce(s.opt_start_delay, 0) order by s.step_index), '{}')
    into v_slugs, v_counts, v_delays
  from started st join flowlane.steps s on s.flow_slug = v_run.flow_slug and s.step_slug = st.step_slug;

  for i in 1 .. cardinality(v_slugs) loop
    select array_agg(m.id order by m.ord) into v_ids
    from pgmq.send_batch(v_queue,
           array(select jsonb_build_object('flow_slug', v_run.flow_slug, 'run_id', v_run.run_id,
                                           'step_slug', v_slugs[i], 'task_index', k)
                 from generate_series(0, v_counts[i] - 1) k order by k),
           v_delays[i]) with ordinality as m(id, ord);
    insert into flowlane.step_tasks (flow_slug, run_id, step_slug, task_index, message_id)
    select v_run.flow_slug, v_run.run_id, v_slugs[i], k - 1, v_ids[k]
    from generate_series(1, v_counts[i]) k;
  end loop;
end;
$$;

create function flowlane.start_flow(flow_slug text, input jsonb, run_id uuid = null) returns flowlane.runs
language plpgsql volatile
set search_path = ''
as $$
declare
  v_flow text := flowlane.resolve_flow(start_flow.flow_slug);
  v_root_map text;
  v_input_len int;
  v_run flowlane.runs;
begin
  if input is null then
    raise exception 'start_flow(%): input must not be null (use {} for no input)', v_flow
      using errcode = '22004';
  end if;
  if start_flow.run_id is not null then
    -- a retried start with the same run id returns the existing run
    select * into v_run from flowlane.runs r where r.run_id = start_flow.run_id;
    if found then
      if v_run.flow_slug <> v_flow or v_run.input <> input then
        raise exception 'run % already exists for flow "%" with another flow or input', start_flow.run_id,
          v_run.flow_slug using errcode = '23505';
      end if;
      return v_run;
    end if;
  end if;
  select s.step_slug into v_root_map from flowlane.steps s
  where s.flow_slug = v_flow and s.step_type = 'map' and s.deps_count = 0
  order by s.step_index limit 1;
  if found and jsonb_typeof(input) <> 'array' then
    raise exception 'start_flow(%): root map step "%" maps the run input, which must be a JSON array, got %',
      v_flow, v_root_map, jsonb_typeof(input) using errcode = '22023';
  end if;
  if jsonb_typeof(input) = 'array' then
    v_input_len := jsonb_array_length(input);
  end if;
  insert into flowlane.runs (run_id, flow_slug, input, remaining_steps)
  values (coalesce(start_flow.run_id, gen_random_uuid()), v_flow, input,
          (select count(*) from flowlane.steps s where s.flow_slug = v_flow))
  returning * into v_run;
  insert into flowlane.step_states (flow_slug, run_id, step_slug, remaining_deps, initial_tasks)
  select v_flow, v_run.run_id, s.step_slug, s.deps_count,
         case when s.step_type = 'single' then 1
              when s.deps_count = 0 then v_input_len
              else null end
  from flowlane.steps s where s.flow_slug = v_flow
  order by s.step_slug;
  perform flowlane._progress(v_run.run_id);
  select * into v_run from flowlane.runs r where r.run_id = v_run.run_id;
  return v_run;
end;
$$;

-- claim: only queued tasks of started runs and steps; guarded update; the
-- visibility update is counted and must match the claimed tasks
create function flowlane.start_tasks(flow_slug text, msg_ids bigint[], worker_id uuid)
returns setof flowlane.step_task_record
language plpgsql volatile
set search_path = ''
as $$
declare
  v_claimed flowlane.step_tasks[];
  v_offsets int[];
  v_updated int;
begin
  -- run locks first (shared: claims do not block each other), in a fixed order
  perform 1 from flowlane.runs r
  where r.run_id in (select t.run_id from flowlane.step_tasks t
                     where t.flow_slug = start_tasks.flow_slug and t.message_id = any(msg_ids)
                       and t.status = 'queued')
  order by r.run_id
  for share;

  with claimed as (
    update flowlane.step_tasks t
       set status = 'started', attempts_count = t.attempts_count + 1, started_at = now(),
           last_worker_id = start_tasks.worker_id
      from flowlane.runs r, flowlane.step_states ss
     where t.flow_slug = start_tasks.flow_slug and t.message_id = any(msg_ids) and t.status = 'queued'
       and r.run_id = t.run_id and r.status = 'started'
       and ss.run_id = t.run_id and ss.step_slug = t.step_slug and ss.status = 'started'
    returning t
  ) select coalesce(array_agg(c.t order by (c.t).message_id), '{}') into v_claimed from claimed c;

  if cardinality(v_claimed) = 0 then
    return;
  end if;
  select array_agg(flowlane._effective_timeout((v_claimed[i]).flow_slug, (v_claimed[i]).step_slug) + 2 order by i)
    into v_offsets from generate_subscripts(v_claimed, 1) as i;
  v_updated := flowlane._set_tasks_vt(v_claimed, v_offsets);
  if v_updated <> cardinality(v_claimed) then
    raise exception 'claim aborted: % tasks claimed but % queue messages got their visibility extended',
      cardinality(v_claimed), v_updated
      using errcode = '40001', hint = 'a task''s message is missing from its queue; the claim was rolled back';
  end if;

  return query
    select (v_claimed[i]).flow_slug, (v_claimed[i]).step_slug, (v_claimed[i]).run_id, (v_claimed[i]).task_index,
           flowlane._task_input((v_claimed[i]).run_id, (v_claimed[i]).step_slug, (v_claimed[i]).task_index),
           r.input, (v_claimed[i]).attempts_count, (v_claimed[i]).message_id
    from generate_subscripts(v_claimed, 1) as i
    join flowlane.runs r on r.run_id = (v_claimed[i]).run_id
    order by i;
end;
$$;

-- ---------------------------------------------------------------------------
-- callbacks
-- ---------------------------------------------------------------------------

-- shared prelude of complete/fail: lock run, step state, task (in that
-- order); decide whether the callback may act. Returns the task row and
-- whether it is actionable.
create function flowlane._lock_task(
  p_run_id uuid, p_step_slug text, p_task_index int, p_worker_id uuid, p_attempt int,
  out task flowlane.step_tasks, out actionable boolean
)
language plpgsql volatile
set search_path = ''
as $$
declare
  v_run_status text;
  v_step_status text;
begin
  actionable := false;
  select r.status into v_run_status from flowlane.runs r where r.run_id = p_run_id for update;
  if not found then
    return;
  end if;
  select ss.status into v_step_status from flowlane.step_states ss
  where ss.run_id = p_run_id and ss.step_slug = p_step_slug for update;
  select * into task from flowlane.step_tasks t
  where t.run_id = p_run_id and t.step_slug = p_step_slug and t.task_index = p_task_index for update;
  if not found then
    task := null;
    return;
  end if;
  if task.status in ('completed', 'failed', 'skipped', 'cancelled') then
    -- late or duplicate callback: make sure the message is gone, change nothing
    perform flowlane._archive_tasks(array[task]);
    return;
  end if;
  if task.status <> 'started' or v_run_status <> 'started' or v_step_status <> 'started' then
    return;
  end if;
  if (p_worker_id is not null and task.last_worker_id is distinct from p_worker_id)
     or (p_attempt is not null and task.attempts_count <> p_attempt) then
    return;  -- fenced: this worker/attempt no longer owns the task
  end if;
  actionable := true;
end;
$$;

create function flowlane.complete_task(
  run_id uuid, step_slug text, task_index int, output jsonb,
  worker_id uuid = null, attempt int = null
) returns setof flowlane.step_tasks
language plpgsql volatile
set search_path = ''
as $$
declare
  v_lock record;
  v_task flowlane.step_tasks;
  v_ok boolean;
  v_step flowlane.steps;
  v_remaining int;
  v_map_child text;
  v_step_output jsonb;
begin
  select * into v_lock
  from flowlane._lock_task(complete_task.run_id, complete_task.step_slug, complete_task.task_index,
                           complete_task.worker_id, complete_task.attempt);
  v_task := v_lock.task;
  v_ok := v_lock.actionable;
  if v_task.run_id is null then
    return;
  end if;
  if not v_ok then
    return next v_task;
    return;
  end if;
  select * into v_step from flowlane.steps s
  where s.flow_slug = v_task.flow_slug and s.step_slug = v_task.step_slug;

  -- a single step feeding a map must output an array
  if v_step.step_type = 'single' and jsonb_typeof(coalesce(output, 'null'::jsonb)) <> 'array' then
    select cs.step_slug into v_map_child
    from flowlane.deps d
    join flowlane.steps c on c.flow_slug = d.flow_slug and c.step_slug = d.step_slug and c.step_type = 'map'
    join flowlane.step_states cs on cs.run_id = v_task.run_id and cs.step_slug = d.step_slug
    where d.flow_slug = v_task.flow_slug and d.dep_slug = v_task.step_slug
      and cs.status = 'created' and cs.initial_tasks is null
    order by cs.step_slug limit 1;
    if found then
      update flowlane.step_tasks t
         set status = 'failed', failed_at = now(), output = complete_task.output,
             error_message = format('[TYPE_VIOLATION] step %s feeds map step %s and must output a JSON array, got %s',
                                    v_task.step_slug, v_map_child, jsonb_typeof(coalesce(complete_task.output, 'null'::jsonb)))
       where t.run_id = v_task.run_id and t.step_slug = v_task.step_slug and t.task_index = v_task.task_index
      returning * into v_task;
      perform flowlane._archive_tasks(array[v_task]);
      update flowlane.step_states ss
         set status = 'failed', failed_at = now(), remaining_tasks = null, error_message = v_task.error_message
       where ss.run_id = v_task.run_id and ss.step_slug = v_task.step_slug;
      perform flowlane._fail_run(v_task.run_id, v_task.error_message);
      return next v_task;
      return;
    end if;
  end if;

  update flowlane.step_tasks t
     set status = 'completed', completed_at = now(), output = complete_task.output
   where t.run_id = v_task.run_id and t.step_slug = v_task.step_slug and t.task_index = v_task.task_index
  returning * into v_task;
  perform flowlane._archive_tasks(array[v_task]);
  update flowlane.step_states ss set remaining_tasks = ss.remaining_tasks - 1
   where ss.run_id = v_task.run_id and ss.step_slug = v_task.step_slug
  returning ss.remaining_tasks into v_remaining;
  if v_remaining = 0 then
    if v_step.step_type = 'map' then
      select coalesce(jsonb_agg(t.output order by t.task_index), '[]'::jsonb) into v_step_output
      from flowlane.step_tasks t where t.run_id = v_task.run_id and t.step_slug = v_task.step_slug;
    else
      v_step_output := complete_task.output;
    end if;
    perform flowlane._complete_step(v_task.run_id, v_task.step_slug, v_step_output);
    perform flowlane._progress(v_task.run_id);
  end if;
  return next v_task;
end;
$$;

create function flowlane.complete_tasks(results jsonb) returns setof flowlane.step_tasks
language plpgsql volatile
set search_path = ''
as $$
declare
  v_item record;
begin
  if results is null or jsonb_typeof(results) <> 'array' then
    raise exception 'complete_tasks: results must be a JSON array of {run_id, step_slug, task_index, output, worker_id, attempt}'
      using errcode = '22023';
  end if;
  for v_item in
    select (e ->> 'run_id')::uuid as run_id, e ->> 'step_slug' as step_slug,
           (e ->> 'task_index')::int as task_index, e -> 'output' as output,
           (e ->> 'worker_id')::uuid as worker_id, (e ->> 'attempt')::int as attempt
    from jsonb_array_elements(results) e
    order by 1, 2, 3   -- fixed lock order across concurrent batches
  loop
    return query select * from flowlane.complete_task(v_item.run_id, v_item.step_slug, v_item.task_index,
                                                      v_item.output, v_item.worker_id, v_item.attempt);
  end loop;
end;
$$;

create function flowlane.fail_task(
  run_id uuid, step_slug text, task_index int, error_message text,
  worker_id uuid = null, attempt int = null
) returns setof flowlane.step_tasks
language plpgsql volatile
set search_path = ''
as $$
declare
  v_lock record;
  v_task flowlane.step_tasks;
  v_ok boolean;
  v_step flowlane.steps;
  v_flow flowlane.flows;
  v_max int;
  v_base int;
begin
  select * into v_lock
  from flowlane._lock_task(fail_task.run_id, fail_task.step_slug, fail_task.task_index,
                           fail_task.worker_id, fail_task.attempt);
  v_task := v_lock.task;
  v_ok := v_lock.actionable;
  if v_task.run_id is null then
    return;
  end if;
  if not v_ok then
    return next v_task;
    return;
  end if;
  select * into v_step from flowlane.steps s
  where s.flow_slug = v_task.flow_slug and s.step_slug = v_task.step_slug;
  select * into v_flow from flowlane.flows f where f.flow_slug = v_task.flow_slug;
  v_max := coalesce(v_step.opt_max_attempts, v_flow.opt_max_attempts);
  v_base := coalesce(v_step.opt_base_delay, v_flow.opt_base_delay);

  if v_task.attempts_count < v_max then
    -- retry: same message, visible again after the backoff
    update flowlane.step_tasks t
       set status = 'queued', started_at = null, error_message = fail_task.error_message
     where t.run_id = v_task.run_id and t.step_slug = v_task.step_slug and t.task_index = v_task.task_index
    returning * into v_task;
    perform flowlane._set_tasks_vt(array[v_task],
                                   array[flowlane.calculate_retry_delay(v_base, v_task.attempts_count)]);
    return next v_task;
    return;
  end if;

  update flowlane.step_tasks t
     set status = 'failed', failed_at = now(), error_message = fail_task.error_message
   where t.run_id = v_task.run_id and t.step_slug = v_task.step_slug and t.task_index = v_task.task_index
  returning * into v_task;
  perform flowlane._archive_tasks(array[v_task]);

  if v_step.when_exhausted = 'fail' then
    update flowlane.step_states ss
       set status = 'failed', failed_at = now(), remaining_tasks = null, error_message = fail_task.error_message
     where ss.run_id = v_task.run_id and ss.step_slug = v_task.step_slug;
    perform flowlane._fail_run(v_task.run_id,
      format('step %s task %s failed after %s attempts: %s', v_task.step_slug, v_task.task_index,
             v_task.attempts_count, fail_task.error_message));
  elsif v_step.when_exhausted = 'skip-cascade' then
    perform flowlane._skip_cascade(v_task.run_id, v_task.step_slug, 'handler_failed');
    perform flowlane._progress(v_task.run_id);
  else
    perform flowlane._skip_step(v_task.run_id, v_task.step_slug, 'handler_failed');
    perform flowlane._progress(v_task.run_id);
  end if;
  return next v_task;
end;
$$;

-- ---------------------------------------------------------------------------
-- recovery, deletion, inspection
-- ---------------------------------------------------------------------------

-- started tasks older than effective timeout + 30 s: requeue (message visible
-- now) at most 3 times, then mark permanently stalled and archive the message
create function flowlane.requeue_stalled_tasks() returns int
language plpgsql volatile
set search_path = ''
as $$
declare
  v_requeued flowlane.step_tasks[];
  v_stalled flowlane.step_tasks[];
begin
  with candidates as (
    select t.run_id, t.step_slug, t.task_index
    from flowlane.step_tasks t
    join flowlane.runs r on r.run_id = t.run_id and r.status = 'started'
    join flowlane.step_states ss on ss.run_id = t.run_id and ss.step_slug = t.step_slug and ss.status = 'started'
    join flowlane.steps s on s.flow_slug = t.flow_slug and s.step_slug = t.step_slug
    join flowlane.flows f on f.flow_slug = t.flow_slug
    where t.status = 'started' and t.permanently_stalled_at is null
      and t.started_at < now() - make_interval(secs => coalesce(s.opt_timeout, f.opt_timeout) + 30)
    order by t.run_id, t.step_slug, t.task_index
    for update of t skip locked
  ), requeued as (
    update flowlane.step_tasks t
       set status = 'queued', started_at = null, last_worker_id = null,
           requeued_count = t.requeued_count + 1, last_requeued_at = now()
      from candidates c
     where t.run_id = c.run_id and t.step_slug = c.step_slug and t.task_index = c.task_index
       and t.requeued_count < 3
    returning t
  ), stalled as (
    update flowlane.step_tasks t
       set permanently_stalled_at = now()
      from candidates c
     where t.run_id = c.run_id and t.step_slug = c.step_slug and t.task_index = c.task_index
       and t.requeued_count >= 3
    returning t
  )
  select (select coalesce(array_agg(q.t), '{}') from requeued q),
         (select coalesce(array_agg(p.t), '{}') from stalled p)
    into v_requeued, v_stalled;
  perform flowlane._set_tasks_vt(v_requeued, array_fill(0, array[cardinality(v_requeued)]));
  perform flowlane._archive_tasks(v_stalled);
  return cardinality(v_requeued);
end;
$$;

create function flowlane.delete_flow_and_data(flow_slug text) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_queue text := lower(delete_flow_and_data.flow_slug);
begin
  delete from flowlane.step_tasks t where t.flow_slug = delete_flow_and_data.flow_slug;
  delete from flowlane.step_states ss where ss.flow_slug = delete_flow_and_data.flow_slug;
  delete from flowlane.runs r where r.flow_slug = delete_flow_and_data.flow_slug;
  delete from flowlane.deps d where d.flow_slug = delete_flow_and_data.flow_slug;
  delete from flowlane.steps s where s.flow_slug = delete_flow_and_data.flow_slug;
  delete from flowlane.flows f where f.flow_slug = delete_flow_and_data.flow_slug;
  if exists (select 1 from pgmq.list_queues() q where q.queue_name = v_queue) then
    perform pgmq.drop_queue(v_queue);
  end if;
end;
$$;

create function flowlane.get_run_with_states(run_id uuid) returns jsonb
language sql stable
set search_path = ''
as $$
  select jsonb_build_object(
    'run', to_jsonb(r),
    'steps', coalesce((select jsonb_agg(to_jsonb(ss) order by s.step_index)
                       from flowlane.step_states ss
                       join flowlane.steps s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
                       where ss.run_id = r.run_id), '[]'::jsonb),
    'tasks', coalesce((select jsonb_agg(to_jsonb(t) order by s.step_index, t.task_index)
                       from flowlane.step_tasks t
                       join flowlane.steps s on s.flow_slug = t.flow_slug and s.step_slug = t.step_slug
                       where t.run_id = r.run_id), '[]'::jsonb))
  from flowlane.runs r
  where r.run_id = get_run_with_states.run_id
$$;

-- ---------------------------------------------------------------------------
-- workers
-- ---------------------------------------------------------------------------

create function flowlane.register_worker(worker_id uuid, queue_name text, worker_name text)
returns flowlane.workers
language sql volatile
set search_path = ''
as $$
  insert into flowlane.workers as w (worker_id, queue_name, worker_name)
  values (register_worker.worker_id, register_worker.queue_name, register_worker.worker_name)
  on conflict on constraint workers_pkey do update
    set last_heartbeat_at = greatest(now(), w.last_heartbeat_at)
  returning *
$$;

create function flowlane.heartbeat(worker_id uuid) returns boolean
language sql volatile
set search_path = ''
as $$
  with hb as (
    update flowlane.workers w set last_heartbeat_at = greatest(now(), w.last_heartbeat_at)
     where w.worker_id = heartbeat.worker_id
    returning w.deprecated_at is not null as deprecated
  ) select coalesce((select deprecated from hb), false)
$$;

create function flowlane.mark_worker_stopped(worker_id uuid) returns void
language sql volatile
set search_path = ''
as $$
  update flowlane.workers w set stopped_at = greatest(now(), w.started_at)
   where w.worker_id = mark_worker_stopped.worker_id and w.stopped_at is null
$$;
