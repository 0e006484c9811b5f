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

-- A flow may debounce its starts (flows.opt_debounce_key, opt_debounce_period,
-- opt_debounce_max_wait; create_flow's debounce_key, debounce_period, debounce_max_wait):
-- start_flow and start_flows collapse the starts of one key into a pending run (runs.debounce_key,
-- debounce_since; one per flow and key, runs_debounce_pending_unique) that the maintenance tick
-- begins, with the last start's input, when a period passes without another start or the
-- maximum wait is reached. run_holds shows it as debounced. New nullable columns only: no
-- existing row changes. Workers call none of the changed functions.

-- == Written by hand: tables, types and data that the functions need ==

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

-- == Drafted from the engine source by `python -m flowlane.core.draft_migration`; redrafted, never edited ==

set local check_function_bodies = off;

-- REVIEW: flowlane.create_flow(text,integer,integer,integer,text,integer,integer,text,integer,text,integer) is called by flowlane.ensure_flow_compiled(text,jsonb): a call in flight when this migration commits runs their old bodies to the end and fails without it; keep the signature while the previous release's workers may call them (CONTRIBUTING, rules for migrations)

drop function flowlane.create_flow(text,integer,integer,integer,text,integer,integer,text,integer,text,integer);

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
  debounce_max_wait int = null
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
                                   opt_debounce_key, opt_debounce_period, opt_debounce_max_wait)
  values (create_flow.flow_slug, coalesce(max_attempts, flowlane._flow_option_default('max_attempts')),
          coalesce(base_delay, flowlane._flow_option_default('base_delay')),
          coalesce(timeout, flowlane._flow_option_default('timeout')), v_mode, create_flow.retention,
          create_flow.deadline, create_flow.dedup_key, create_flow.concurrency_limit,
          nullif(create_flow.concurrency_key, ''), create_flow.priority,
          coalesce(create_flow.concurrency_when_full, 'queue'),
          nullif(create_flow.debounce_key, ''), create_flow.debounce_period, create_flow.debounce_max_wait)
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
        opt_debounce_max_wait = excluded.opt_debounce_max_wait
  returning * into v_flow;
  if v_old.flow_slug is not null and (v_old.opt_concurrency_limit, v_old.opt_concurrency_key)
     is distinct from (v_flow.opt_concurrency_limit, v_flow.opt_concurrency_key) then
    perform flowlane._flow_limits_changed(v_flow.flow_slug);
  end if;
  return v_flow;
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
  if v_key is null and start_flow.run_id is null and start_flow.start_at is null then
    v_run := flowlane._debounced_start(v_flow, input, start_flow.priority);
    if v_run.run_id is not null then
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
  if exists (select 1 from flowlane.flows f where f.flow_slug = v_flow
             and (f.opt_dedup_key is not null or f.opt_debounce_period is not null)) then
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
-- p_priority: the runs' priority (null: the flow's). A flow with a concurrency limit: under
-- the keys' locks, a run begins while its key has room and no run held before it; the
-- others are held (waiting, hold_seq in input order); then a full key replaces or cancels
-- as the flow says (_apply_when_full)
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
  if v_flow.opt_concurrency_limit is not null and not v_waiting then
    perform flowlane._apply_when_full(p_flow, v_ids);
  end if;
  return query select r.* from unnest(v_ids) with ordinality as u (run_id, ord)
               join flowlane.runs r
                 on r.run_id = u.run_id and r.run_id = any (array(select x from unnest(v_ids) x order by 1))
               order by u.ord;
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
           started_at = greatest(now(), ss.created_at)
      from ready
     where ss.run_id = ready.run_id and ss.step_slug = ready.step_slug and ss.run_id = any (p_run_ids)
    returning ss
  ) select coalesce(array_agg(st.ss), '{}') into v_started from started st;
  if cardinality(v_started) > 0 then
    perform flowlane._enqueue_started(v_started);
  end if;
end;
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
                                                   now() + make_interval(secs => v_flow.opt_debounce_period),
                                                   null, null, p_priority);
    update flowlane.runs r set debounce_key = v_key, debounce_since = now() where r.run_id = v_run.run_id
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
         start_at = least(now() + make_interval(secs => v_flow.opt_debounce_period),
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
                          greatest(round(extract(epoch from r.start_at - now()), 1), 0)) end, null
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

-- == Written by hand: what calls the functions (checks, defaults, triggers, data) ==
