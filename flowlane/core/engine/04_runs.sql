-- Runs: starting a run, starting the steps that are ready, a step's conditions, skips and
-- failures, and a run's end.

-- start_at: a later start (the run waits, cancellable, until the maintenance tick begins it);
-- idempotency_key (or the flow's dedup pointer into the input): a second start with the same
-- (called name, key) returns the first run
create function flowlane.start_flow(flow_slug text, input jsonb, run_id uuid = null,
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
create function flowlane.start_flows(flow_slug text, inputs jsonb[], start_at timestamptz = null,
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

-- the checks of a run input that need the flow (null, root map needs an array); p_what names the input
create function flowlane._check_start_input(p_flow text, p_input jsonb, p_what text) returns void
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

-- _new_runs and _new_run under their earlier names, without an origin: the calls of schedules
-- and child flows, and of the previous release's functions while a migration commits
create function flowlane._create_runs(p_flow text, p_inputs jsonb[], p_run_ids uuid[],
                                      p_start_at timestamptz = null, p_keys text[] = null,
                                      p_called text = null, p_priority int = null)
returns setof flowlane.runs
language sql volatile
set search_path = ''
as $$
  select * from flowlane._new_runs(p_flow, p_inputs, p_run_ids, p_start_at, p_keys, p_called, p_priority,
                                   null::jsonb[])
$$;

create function flowlane._start_one_run(p_flow flowlane.flows, p_input jsonb, p_run_id uuid,
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
create function flowlane._new_runs(p_flow text, p_inputs jsonb[], p_run_ids uuid[],
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
create function flowlane._starts_plainly(p_step flowlane.steps, p_input jsonb) returns boolean
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
create function flowlane._state_in_task(p_step flowlane.steps) returns boolean
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
create function flowlane._new_run(p_flow flowlane.flows, p_input jsonb, p_run_id uuid,
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

create function flowlane._check_run_input() returns trigger
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
create function flowlane._check_json_limits(p_value jsonb, p_what text, p_flatten_hint text) returns void
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

create trigger runs_input_limits before insert on flowlane.runs
for each row execute function flowlane._check_run_input();

create function flowlane._progress(p_run_id uuid) returns void
language sql volatile
set search_path = ''
as $$ select flowlane._progress_runs(array[p_run_id]) $$;

-- _progress for many runs: conditions and empty maps are resolved run by run
-- (_advance) only where a ready step has one; then ready steps start together
create function flowlane._progress_runs(p_run_ids uuid[]) returns void
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
create function flowlane._condition_subject(p_run_id uuid, p_step_slug text) returns jsonb
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

-- public, unchanged contract: locks the run, starts its ready steps
create function flowlane.start_ready_steps(run_id uuid) returns void
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
create function flowlane._start_ready_steps(p_run_ids uuid[]) returns void
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
create function flowlane._enqueue_steps(p_started flowlane.step_states[], p_in_task boolean) returns void
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
create function flowlane._enqueue_started(p_started flowlane.step_states[]) returns void
language plpgsql volatile
set search_path = ''
as $$
begin
  perform flowlane._enqueue_steps(p_started, false);
end;
$$;

create function flowlane._complete_step(p_run_id uuid, p_step_slug text, p_output jsonb) returns void
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
create function flowlane._skip_step(p_run_id uuid, p_step_slug text, p_reason text) returns boolean
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

-- a step skipped because its handler failed keeps that failure's message
create function flowlane._keep_skip_error() returns trigger
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

create trigger step_states_keep_skip_error
  before update of status on flowlane.step_states
  for each row
  when (new.status = 'skipped' and new.skip_reason = 'handler_failed')
  execute function flowlane._keep_skip_error();

-- The states that tasks of a run hold for their steps (all_step_states, 01_tables.sql) are
-- written into step_states, as they read there, and the tasks no longer hold them: what changes
-- a step other than its task's start and completion (a failure, a skip, a cancel, a retry)
-- then finds its row. The caller holds the run's lock; the tasks are locked in key order.
create function flowlane._unfold_step_states(p_run_id uuid) returns void
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
create function flowlane._fail_run(p_run_id uuid, p_error text) returns void
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
create function flowlane._end_unfinished_steps(p_run_id uuid) returns void
language sql volatile
set search_path = ''
as $$
  select flowlane._unfold_step_states(p_run_id);
  update flowlane.step_states ss
     set status = 'cancelled', cancelled_at = greatest(flowlane._now(), coalesce(ss.started_at, ss.created_at))
   where ss.run_id = p_run_id and ss.status in ('created', 'started');
$$;

-- (_steps_done completes a run the same way when its last step completes)
create function flowlane._maybe_complete_runs(p_run_ids uuid[]) returns void
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
create function flowlane._run_outputs(p_run_ids uuid[]) returns table (run_id uuid, output jsonb)
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

-- flowlane_run_finished: a notification per finished run, from one trigger call per statement (same channel,
-- same payload: the run's id), while a session listens through listen_run_finished. Nobody
-- listening, none is sent: a commit that notifies holds the lock that serialises every
-- notifying commit in the cluster through its WAL flush, and starts (the queue's insert
-- notification) already take their turns there.
create function flowlane._notify_run_finished() returns trigger
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
create function flowlane.listen_run_finished() returns void
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

create function flowlane.unlisten_run_finished() returns void
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

create trigger runs_notify_finished
  after update on flowlane.runs
  referencing old table as old_runs new table as new_runs
  for each statement execute function flowlane._notify_run_finished();
