-- flowlane SQL Core 0024: flow control.
-- Drafted by `python -m flowlane.core.draft_migration` from the engine source; reviewed.
--
-- Concurrency limits per key on flows (started runs; the others wait, status waiting with
-- hold_seq, FIFO per key) and on steps (sent tasks; the others wait in held_tasks without a
-- PGMQ message), a physical queue's concurrency and rate limit across all workers
-- (queue_limits, enforced inside claim_tasks), and priorities (runs.priority, carried in the
-- task's message; a queue that has seen one is read in priority order). A slot is freed, and
-- the next held run or task begun, by the transaction that ends the run or task: statement
-- triggers on runs and step_tasks follow every path that ends one. task_leases records each
-- started task's queue (what a queue's concurrency counts). See 19_flow_control.sql.

-- hand-written
alter table flowlane.flows add column opt_concurrency_limit int;
alter table flowlane.flows add column opt_concurrency_key text;
alter table flowlane.flows add column opt_priority int;
alter table flowlane.flows add constraint flows_concurrency_limit_positive
  check ((opt_concurrency_limit is null) or (opt_concurrency_limit >= 1));
alter table flowlane.flows add constraint flows_concurrency_key_pointer
  check ((opt_concurrency_key is null) or (opt_concurrency_key ~ '^(/([^~/]|~[01])*)+$'));
alter table flowlane.flows add constraint flows_concurrency_key_needs_limit
  check ((opt_concurrency_key is null) or (opt_concurrency_limit is not null));
alter table flowlane.flows add constraint flows_priority_range
  check ((opt_priority is null) or (opt_priority between -1000 and 1000));

alter table flowlane.steps add column opt_concurrency_limit int;
alter table flowlane.steps add column opt_concurrency_key text;
alter table flowlane.steps add constraint steps_concurrency_limit_positive
  check ((opt_concurrency_limit is null) or (opt_concurrency_limit >= 1));
alter table flowlane.steps add constraint steps_concurrency_key_pointer
  check ((opt_concurrency_key is null) or (opt_concurrency_key ~ '^(/([^~/]|~[01])*)+$'));
alter table flowlane.steps add constraint steps_concurrency_key_needs_limit
  check ((opt_concurrency_key is null) or (opt_concurrency_limit is not null));
alter table flowlane.steps add constraint steps_concurrency_needs_tasks
  check ((opt_concurrency_limit is null) or (queue_name is not null));

alter table flowlane.queues add column prioritized boolean default false not null;

alter table flowlane.runs add column concurrency_key text;
alter table flowlane.runs add column hold_seq bigint;
alter table flowlane.runs add column priority int default 0 not null;
alter table flowlane.runs drop constraint runs_waiting_has_start_at;
alter table flowlane.runs add constraint runs_waiting_has_reason
  check ((status <> 'waiting') or (start_at is not null) or (hold_seq is not null));
alter table flowlane.runs add constraint runs_held_has_key
  check ((hold_seq is null) or (concurrency_key is not null));
alter table flowlane.runs add constraint runs_priority_range check (priority between -1000 and 1000);
drop index flowlane.runs_waiting_idx;
create index runs_waiting_idx on flowlane.runs (start_at) where ((status = 'waiting') and (hold_seq is null));
create index runs_slots_idx on flowlane.runs (flow_slug, concurrency_key)
  where ((status = 'started') and (concurrency_key is not null));
create index runs_held_idx on flowlane.runs (flow_slug, concurrency_key, hold_seq)
  where ((status = 'waiting') and (hold_seq is not null));

alter table flowlane.task_leases add column queue_name text;
update flowlane.task_leases l set queue_name = t.queue_name
  from flowlane.step_tasks t
 where t.run_id = l.run_id and t.step_slug = l.step_slug and t.task_index = l.task_index;
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
  constraint queue_limits_pkey primary key (queue_name),
  constraint queue_limits_concurrency_positive check ((concurrency is null) or (concurrency >= 1)),
  constraint queue_limits_rate_positive check ((rate_limit is null) or ((rate_limit >= 1) and (rate_per >= 1))),
  constraint queue_limits_rate_complete check ((rate_limit is null) = (rate_per is null)),
  constraint queue_limits_some_limit check ((concurrency is not null) or (rate_limit is not null)),
  constraint queue_limits_queue_name_fkey foreign key (queue_name) references flowlane.queues(queue_name) on delete cascade
);

create type flowlane._queue_gate as (
  queue_name text,
  allowed int,
  started_at timestamptz,
  tokens double precision,
  refusal flowlane.claim_record,
  prioritized boolean,
  limited boolean
);
-- end of hand-written

drop function flowlane._create_runs(text,jsonb[],uuid[],timestamp with time zone,text[],text);

drop function flowlane._start_tasks(text,bigint[],uuid,jsonb,integer);

drop function flowlane.add_step(text,text,text[],integer,integer,integer,integer,text,jsonb,jsonb,text,text,text,text);

drop function flowlane.create_flow(text,integer,integer,integer,text,integer,integer,text);

drop function flowlane.start_flow(text,jsonb,uuid,timestamp with time zone,text);

drop function flowlane.start_flows(text,jsonb[],timestamp with time zone);

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

-- new runs of one concrete flow (inputs checked by the caller); returns them in input order
-- p_start_at in the future: the runs wait (status waiting) for the maintenance tick;
-- p_keys: each run's idempotency key within p_called (the name the caller started);
-- p_priority: the runs' priority (null: the flow's). A flow with a concurrency limit: each
-- run is created held for its key (waiting, hold_seq in input order), and those that have
-- room begin at once (_begin_new_held_runs), behind any held before them
create or replace function flowlane._create_runs(p_flow text, p_inputs jsonb[], p_run_ids uuid[],
                                      p_start_at timestamptz = null, p_keys text[] = null,
                                      p_called text = null, p_priority int = null)
returns setof flowlane.runs
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_ids uuid[];
  v_waiting boolean := coalesce(p_start_at > now(), false);
  v_flow flowlane.flows;
  v_held boolean;
begin
  perform flowlane._check_contract_inputs(p_flow, p_inputs);
  select * into v_flow from flowlane.flows f where f.flow_slug = p_flow;
  v_held := v_flow.opt_concurrency_limit is not null and not v_waiting;
  v_ids := array(select coalesce(p_run_ids[i], gen_random_uuid()) from generate_subscripts(p_inputs, 1) i order by i);
  insert into flowlane.runs (run_id, flow_slug, input, remaining_steps, trace_parent, status, start_at,
                             deadline_at, called_as, idempotency_key, priority, concurrency_key, hold_seq)
  select v_ids[i], p_flow, p_inputs[i], (select count(*) from flowlane.steps s where s.flow_slug = p_flow),
         flowlane._trace_parent(), case when v_waiting or v_held then 'waiting' else 'started' end, p_start_at,
         case when v_waiting or v_held then null else flowlane._run_deadline(p_flow, now()) end,
         case when p_keys[i] is not null then p_called end, p_keys[i],
         coalesce(p_priority, v_flow.opt_priority, 0),
         case when v_flow.opt_concurrency_limit is not null
              then flowlane._concurrency_key(v_flow.opt_concurrency_key, p_inputs[i]) end,
         case when v_held then nextval('flowlane.hold_seq') end
  from generate_subscripts(p_inputs, 1) i order by i;
  insert into flowlane.step_states (flow_slug, run_id, step_slug, remaining_deps, initial_tasks)
  select p_flow, v_ids[i], s.step_slug, s.deps_count,
         case when s.step_type <> 'map' then 1
              when s.deps_count = 0 and jsonb_typeof(p_inputs[i]) = 'array' then jsonb_array_length(p_inputs[i])
              else null end
  from generate_subscripts(p_inputs, 1) i, flowlane.steps s
  where s.flow_slug = p_flow
  order by v_ids[i], s.step_slug;
  if v_held then
    perform flowlane._begin_new_held_runs(v_ids);
  elsif not v_waiting then
    perform flowlane._progress_runs(v_ids);
  end if;
  return query select r.* from unnest(v_ids) with ordinality as u (run_id, ord)
               join flowlane.runs r on r.run_id = u.run_id and r.run_id = any (v_ids) order by u.ord;
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
as $$
declare
  v_started flowlane.step_states[];
  v_group record;
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
  if cardinality(v_started) = 0 then
    return;
  end if;
  for v_group in
    select s.queue_name, coalesce(s.opt_start_delay, 0) as start_delay,
           array_agg(jsonb_build_object('flow_slug', st.flow_slug, 'run_id', st.run_id,
                                        'step_slug', st.step_slug, 'task_index', k)
                     || case when r.priority <> 0 then jsonb_build_object('priority', r.priority)
                             else '{}'::jsonb end
                     order by st.run_id, s.step_index, k) as bodies,
           bool_or(s.opt_concurrency_limit is not null) as limited
    from unnest(v_started) st
    join flowlane.steps s on s.flow_slug = st.flow_slug and s.step_slug = st.step_slug
    join flowlane.runs r on r.run_id = st.run_id and r.run_id = any (p_run_ids)
    cross join lateral generate_series(0, st.initial_tasks - 1) as k
    group by 1, 2
    order by 1, 2
  loop
    if v_group.queue_name is null then  -- wait and child-flow steps: no task (17_waits.sql, 18_children.sql)
      perform flowlane._begin_waits(v_started);
      perform flowlane._start_children(v_started);
      continue;
    end if;
    -- a step with a concurrency limit: tasks over its key's limit are held (19_flow_control.sql)
    perform flowlane._send_tasks(v_group.queue_name,
      case when v_group.limited then flowlane._take_step_slots(v_group.bodies) else v_group.bodies end,
      v_group.start_delay);
  end loop;
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
as $$
declare
  v_lease int;
  v_ids bigint[];
  v_later bigint[];
  v_gate flowlane._queue_gate;
  v_rows flowlane.claim_record[];
begin
  perform flowlane._check_queue_argument('claim_tasks', claim_tasks.queue_name);
  if qty is null or qty < 1 then
    raise exception 'claim_tasks: qty must be at least 1' using errcode = '22023';
  end if;
  select coalesce(max(o.claim_visibility), 0) into v_lease
  from flowlane._pairs(supported_pairs) p
  join flowlane.step_options o on o.flow_slug = p.flow_slug and o.step_slug = p.step_slug;
  if exists (select 1 from flowlane.queues q
             where q.queue_name = claim_tasks.queue_name
               and (q.prioritized or exists (select 1 from flowlane.queue_limits l where l.queue_name = q.queue_name))) then
    v_gate := flowlane._open_queue_gate(claim_tasks.queue_name, qty);
    if (v_gate.refusal).outcome is not null then
      return next v_gate.refusal;
      return;
    end if;
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
    from pgmq.read(claim_tasks.queue_name, v_lease, coalesce(v_gate.allowed, qty)) m;
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
  if not coalesce(v_gate.limited, false) then
    return query select * from flowlane._claim_batch(claim_tasks.queue_name, v_ids, claim_tasks.worker_id,
                                                     supported_pairs, v_lease, null);
    return;
  end if;
  v_rows := array(select c from flowlane._claim_batch(claim_tasks.queue_name, v_ids, claim_tasks.worker_id,
                                                      supported_pairs, v_lease, v_gate.started_at) c);
  perform flowlane._close_queue_gate(v_gate, (select count(*)::int from unnest(v_rows) r where r.outcome = 'claimed'));
  return query select * from unnest(v_rows);
end;
$$;

create or replace function flowlane.start_tasks(queue_name text, msg_ids bigint[], worker_id uuid, supported_pairs jsonb)
returns setof flowlane.claim_record
language plpgsql volatile
set search_path = ''
as $$
declare
  v_gate flowlane._queue_gate;
  v_ids bigint[];
  v_rows flowlane.claim_record[];
begin
  perform flowlane._check_queue_argument('start_tasks', start_tasks.queue_name);
  if not exists (select 1 from flowlane.queue_limits l where l.queue_name = start_tasks.queue_name) then
    return query select * from flowlane._start_tasks(start_tasks.queue_name, msg_ids, worker_id, supported_pairs, null);
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
  from flowlane._start_tasks(start_tasks.queue_name, v_ids, worker_id, supported_pairs, null, v_gate.started_at) c;
  perform flowlane._close_queue_gate(v_gate, (select count(*)::int from unnest(v_rows) r where r.outcome = 'claimed'));
  return query select * from unnest(v_rows);
end;
$$;

-- the claim of a batch of read messages, classified as a whole before anything changes (a
-- batch with a message this worker cannot handle claims nothing); the tasks to hide and to
-- return are read from the unnested claim, the leases looked up once per (flow, step), the
-- inputs from _claimed_inputs
create or replace function flowlane._start_tasks(p_queue text, p_msg_ids bigint[], p_worker_id uuid, p_pairs jsonb,
                                      p_read_vt int, p_started_at timestamptz = null)
returns setof flowlane.claim_record
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_ids bigint[];
  v_batch flowlane._claim_item[];
  v_duplicates flowlane.step_tasks[];
  v_claimed flowlane.step_tasks[];
  v_hide flowlane.step_tasks[];
  v_offsets int[];
  v_updated int;
begin
  perform flowlane._check_queue_argument('start_tasks', p_queue);
  if p_worker_id is null then
    raise exception 'start_tasks: worker_id is required (it fences the results of the claimed tasks)'
      using errcode = '22023';
  end if;
  if p_msg_ids is null or array_position(p_msg_ids, null) is not null then
    raise exception 'start_tasks: msg_ids must be an array of message ids without nulls' using errcode = '22023';
  end if;
  perform flowlane._pairs(p_pairs);  -- validates before anything is locked
  v_ids := array(select distinct m from unnest(p_msg_ids) m order by m);
  if cardinality(v_ids) = 0 then
    return;
  end if;

  -- lock order: runs (shared: claims do not block each other), then the batch's tasks
  perform 1 from flowlane.runs r
  where r.run_id in (select t.run_id from flowlane.step_tasks t
                     where t.queue_name = p_queue and t.message_id = any (v_ids))
  order by r.run_id
  for share;
  perform 1 from flowlane.step_tasks t
  where t.queue_name = p_queue and t.message_id = any (v_ids)
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
  left join flowlane._pairs(p_pairs) p on p.flow_slug = t.flow_slug and p.step_slug = t.step_slug
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
  select coalesce(array_agg(c order by c.message_id), '{}'), coalesce(array_agg(l.lease order by c.message_id), '{}')
    into v_hide, v_offsets
  from unnest(v_claimed) c
  join (select o.flow_slug, o.step_slug, o.claim_visibility as lease
        from (select distinct x.flow_slug, x.step_slug from unnest(v_claimed) x) p
        join flowlane.step_options o on o.flow_slug = p.flow_slug and o.step_slug = p.step_slug) l
    on l.flow_slug = c.flow_slug and l.step_slug = c.step_slug
  where p_read_vt is null or l.lease > p_read_vt;
  if cardinality(v_hide) > 0 then
    v_updated := flowlane._set_tasks_vt(v_hide, v_offsets);
    if v_updated <> cardinality(v_hide) then
      raise exception 'claim aborted: % tasks claimed but % queue messages got their visibility extended',
        cardinality(v_hide), v_updated
        using errcode = '40001', hint = 'a task''s message is missing from its queue; the claim was rolled back';
    end if;
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

-- the rows of a claim of the messages read: the claimed tasks (a run's input on its first row
-- only) and, for a refused batch, the other messages read, handed back visible (ids only)
create or replace function flowlane._claim_batch(p_queue text, p_ids bigint[], p_worker_id uuid, p_pairs jsonb,
                                      p_lease int, p_started_at timestamptz)
returns setof flowlane.claim_record
language sql volatile
set search_path = ''
as $$
  with c as (
    select * from flowlane._start_tasks(p_queue, p_ids, p_worker_id, p_pairs, p_lease, p_started_at)
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
  order by 10
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

-- delayed runs whose time has come begin; returns how many. A run of a flow with a
-- concurrency limit is held for its key instead (in the order the runs became due), and
-- begins now if its key has room
create or replace function flowlane._begin_due_runs(p_now timestamptz) returns int
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_ids uuid[];
  v_held uuid[];
begin
  with due as (
    select r.run_id from flowlane.runs r
    where r.status = 'waiting' and r.start_at <= p_now and r.hold_seq is null
    order by r.start_at, r.run_id
    for update skip locked
  ), begun as (
    update flowlane.runs r
       set status = case when r.concurrency_key is null then 'started' else 'waiting' end,
           hold_seq = case when r.concurrency_key is null then null else nextval('flowlane.hold_seq') end,
           started_at = now(),
           deadline_at = case when r.concurrency_key is null then flowlane._run_deadline(r.flow_slug, now()) end
      from (select d.run_id from due d order by d.run_id) due where r.run_id = due.run_id
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
as $$
declare
  v_items record;
  v_send jsonb[];
begin
  create temporary table if not exists _flowlane_gate (
    ord int, body jsonb, flow_slug text, step_slug text, run_id uuid, task_index int,
    lim int, key text, send boolean) on commit drop;
  truncate _flowlane_gate;
  insert into _flowlane_gate
  select b.ord, b.body, s.flow_slug, s.step_slug, (b.body ->> 'run_id')::uuid, (b.body ->> 'task_index')::int,
         s.opt_concurrency_limit,
         case when s.opt_concurrency_limit is not null
              then flowlane._concurrency_key(s.opt_concurrency_key, r.input) end,
         s.opt_concurrency_limit is null
  from unnest(p_bodies) with ordinality b (body, ord)
  join flowlane.steps s on s.flow_slug = b.body ->> 'flow_slug' and s.step_slug = b.body ->> 'step_slug'
  join flowlane.runs r on r.run_id = (b.body ->> 'run_id')::uuid;
  for v_items in
    select g.flow_slug, g.step_slug, array_agg(distinct g.key) as keys
    from _flowlane_gate g where not g.send group by 1, 2 order by 1, 2
  loop
    perform flowlane._lock_slots('step:' || v_items.flow_slug || '/' || v_items.step_slug, v_items.keys);
  end loop;
  update _flowlane_gate g set send = true
    from (select x.ord, row_number() over (partition by x.flow_slug, x.step_slug, x.key order by x.ord) as rank,
                 x.lim - (select count(*) from flowlane.step_slots s
                          where s.flow_slug = x.flow_slug and s.step_slug = x.step_slug
                            and s.concurrency_key = x.key) as free,
                 exists (select 1 from flowlane.held_tasks h
                         where h.flow_slug = x.flow_slug and h.step_slug = x.step_slug
                           and h.concurrency_key = x.key) as queue_ahead
          from _flowlane_gate x where not x.send) f
   where g.ord = f.ord and not f.queue_ahead and f.rank <= f.free;
  insert into flowlane.step_slots (run_id, step_slug, task_index, flow_slug, concurrency_key)
  select g.run_id, g.step_slug, g.task_index, g.flow_slug, g.key from _flowlane_gate g
  where g.send and g.key is not null order by 1, 2, 3;
  insert into flowlane.held_tasks (run_id, step_slug, task_index, flow_slug, concurrency_key)
  select g.run_id, g.step_slug, g.task_index, g.flow_slug, g.key from _flowlane_gate g
  where not g.send order by g.ord;
  select coalesce(array_agg(g.body order by g.ord), '{}') into v_send from _flowlane_gate g where g.send;
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
  insert into flowlane.step_tasks (flow_slug, run_id, step_slug, task_index, queue_name, message_id)
  select b.body ->> 'flow_slug', (b.body ->> 'run_id')::uuid, b.body ->> 'step_slug',
         (b.body ->> 'task_index')::int, p_queue, m.id
  from pgmq.send_batch(p_queue, p_bodies, p_delay) with ordinality as m (id, ord)
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
  v_group record;
begin
  if not exists (select 1 from flowlane.step_slots) then
    return null;
  end if;
  create temporary table if not exists _flowlane_freed (flow_slug text, step_slug text, key text, run_key text)
    on commit drop;
  truncate _flowlane_freed;
  with freed as (
    delete from flowlane.step_slots s
     using old_tasks o join new_tasks n
           on n.run_id = o.run_id and n.step_slug = o.step_slug and n.task_index = o.task_index
     where o.status in ('queued', 'started') and n.status not in ('queued', 'started')
       and s.run_id = o.run_id and s.step_slug = o.step_slug and s.task_index = o.task_index
    returning s.*
  )
  insert into _flowlane_freed
  select f.flow_slug, f.step_slug, f.concurrency_key, r.concurrency_key
  from freed f join flowlane.runs r on r.run_id = f.run_id;
  -- run keys first (the lock order): this transaction may end the runs too
  for v_group in
    select f.flow_slug, array_agg(distinct f.run_key) as keys from _flowlane_freed f
    where f.run_key is not null group by 1 order by 1
  loop
    perform flowlane._lock_slots('run:' || v_group.flow_slug, v_group.keys);
  end loop;
  for v_group in
    select f.flow_slug, f.step_slug, array_agg(distinct f.key) as keys from _flowlane_freed f
    group by 1, 2 order by 1, 2
  loop
    perform flowlane._release_held_tasks(v_group.flow_slug, v_group.step_slug, v_group.keys);
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
-- (_read_by_priority) and gives its PGMQ table the index that read follows
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
    execute format('create index if not exists %I on pgmq.%I ((coalesce((message ->> ''priority'')::int, 0)) desc, msg_id)',
                   pgmq.format_table_name(v_pgmq, 'q') || '_priority_idx', pgmq.format_table_name(v_pgmq, 'q'));
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

-- lock the queue's limits (claims on a limited queue take turns: exact under any number of
-- claimers) and say how many tasks may start
create or replace function flowlane._open_queue_gate(p_queue text, p_qty int) returns flowlane._queue_gate
language plpgsql volatile
set search_path = ''
as $$
declare
  v_limits flowlane.queue_limits;
  v_gate flowlane._queue_gate;
  v_started int;
begin
  v_gate.queue_name := p_queue;
  v_gate.allowed := p_qty;
  v_gate.limited := false;
  select q.prioritized into v_gate.prioritized from flowlane.queues q where q.queue_name = p_queue;
  v_gate.prioritized := coalesce(v_gate.prioritized, false);
  select * into v_limits from flowlane.queue_limits l where l.queue_name = p_queue for update;
  if not found then
    return v_gate;
  end if;
  v_gate.limited := true;
  if v_limits.concurrency is not null then
    select count(*) into v_started from flowlane.task_leases t where t.queue_name = p_queue;
    v_gate.allowed := least(v_gate.allowed, v_limits.concurrency - v_started);
    if v_gate.allowed < 1 then
      v_gate.limited := false;  -- nothing to write back
      v_gate.refusal := row('at_capacity', null, null, p_queue, null, null,
                            jsonb_build_object('started', v_started, 'concurrency', v_limits.concurrency),
                            null, null, null)::flowlane.claim_record;
      return v_gate;
    end if;
  end if;
  if v_limits.rate_limit is not null then
    v_gate.started_at := greatest(clock_timestamp(), v_limits.refilled_at);
    v_gate.tokens := flowlane._bucket_tokens(v_limits, v_gate.started_at);
    if v_gate.tokens < 1 then
      v_gate.refusal := row('rate_limited', null, null, p_queue, null, null,
                            jsonb_build_object('wait_ms',
                              ceil(1000 * flowlane._next_start_in(v_limits, v_gate.started_at))::int),
                            null, null, null)::flowlane.claim_record;
      perform flowlane._close_queue_gate(v_gate, 0);
      return v_gate;
    end if;
    v_gate.allowed := least(v_gate.allowed, floor(v_gate.tokens)::int);
  end if;
  return v_gate;
end;
$$;

-- the claim is over: a rate-limited queue's bucket keeps what the claim started
create or replace function flowlane._close_queue_gate(p_gate flowlane._queue_gate, p_started int) returns void
language plpgsql volatile
set search_path = ''
as $$
begin
  if p_gate.limited and p_gate.tokens is not null then
    update flowlane.queue_limits l set tokens = p_gate.tokens - p_started, refilled_at = p_gate.started_at
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

-- hand-written: the triggers that need the functions above
create trigger runs_slots_freed
  after update on flowlane.runs
  referencing old table as old_runs new table as new_runs
  for each statement execute function flowlane._run_slots_freed();

create trigger step_tasks_slots_freed
  after update on flowlane.step_tasks
  referencing old table as old_tasks new table as new_tasks
  for each statement execute function flowlane._step_slots_freed();
