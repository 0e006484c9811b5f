-- flowlane SQL Core 0028: a single start written in its final state.
-- start_flow, and start_flows with one input, of a flow without a concurrency limit whose root
-- steps need nothing resolved first (no condition, no map over the input, a queue) write the
-- run and its step states as they end up, root steps started, one statement each
-- (_start_one_run), instead of the batch's generic statements: inserting the step states as
-- created, finding the ready ones and updating them. Any other start takes the batch path as
-- before. The result is the same rows, messages and notifications.

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
                                          where coalesce(v_begins[i], true) order by i));
  end if;
  return query select r.* from unnest(v_ids) with ordinality as u (run_id, ord)
               join flowlane.runs r on r.run_id = u.run_id and r.run_id = any (v_ids) order by u.ord;
end;
$$;

-- _create_runs for one run that begins now, of a flow without a concurrency limit whose root
-- steps need nothing resolved first (no condition, no map over the input, a queue): the run
-- and its step states are written in their final state, root steps started, one statement
-- each, instead of the batch's generic statements. Null when the flow does not qualify: the
-- caller takes the batch path. tests/core/test_one_start.py and the differential test
-- (tests/core/test_differential.py) compare the two.
create or replace function flowlane._start_one_run(p_flow flowlane.flows, p_input jsonb, p_run_id uuid,
                                        p_start_at timestamptz, p_key text, p_called text, p_priority int)
returns flowlane.runs
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set plan_cache_mode = force_generic_plan
as $$
declare
  v_steps int;
  v_plain boolean;
  v_run flowlane.runs;
  v_started flowlane.step_states[];
begin
  select count(*), coalesce(bool_and(s.deps_count > 0 or (s.step_type = 'single' and s.queue_name is not null
                                     and s.required_input_pattern is null and s.forbidden_input_pattern is null)), false)
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
    select s.flow_slug, v_run.run_id, s.step_slug, s.deps_count,
           case when s.step_type <> 'map' then 1 end,
           case when s.deps_count = 0 then 'started' else 'created' end,
           case when s.deps_count = 0 then now() end,
           case when s.deps_count = 0 then 1 end
    from flowlane.steps s where s.flow_slug = (p_flow).flow_slug
    order by s.step_slug
    returning ss
  ) select array_agg(w.ss) filter (where (w.ss).status = 'started') into v_started from written w;
  perform flowlane._enqueue_started(v_started);
  return v_run;
end;
$$;
