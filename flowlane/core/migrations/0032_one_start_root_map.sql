-- flowlane SQL Core 0032: a single start of a flow whose root step maps its input.
-- _start_one_run also writes a run whose root steps include a map over a non-empty input
-- array: the map's step state starts with one task per element, sent by _enqueue_started as
-- on the batch path. An empty array (the map completes at once) still takes the batch path.

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
