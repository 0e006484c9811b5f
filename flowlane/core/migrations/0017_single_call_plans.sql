-- flowlane SQL Core 0017: single call plans.
-- Drafted by `python -m flowlane.core.draft_migration` from the engine source
-- (flowlane/core/engine); reviewed. Functions only, no table changes.
--
-- A single start_flow, complete_task or fail_task ran the batch machinery for one item, and
-- several of its statements were planned again on every call (a custom plan for each
-- array argument; a language sql function with set clauses plans its statement each time):
--
--   * _start_ready_steps, _complete_batch and _steps_done use generic plans, made once per
--     connection (with enable_seqscan = off every lookup stays on a key, as
--     _lock_and_classify's already did);
--   * _run_outputs is plpgsql (its plan is cached) and returns at once for no runs;
--   * _start_ready_steps calls _condition_met (never inlined) only for a step with a
--     condition;
--   * _progress_runs calls _maybe_complete_runs only when one of its runs has no step left.

-- _progress for many runs: conditions and empty maps are resolved run by run
-- (_advance) only where a ready step has one; then ready steps start together
create or replace function flowlane._progress_runs(p_run_ids uuid[]) returns void
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
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
  v_n int;
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
                     order by st.run_id, s.step_index, k) as bodies
    from unnest(v_started) st
    join flowlane.steps s on s.flow_slug = st.flow_slug and s.step_slug = st.step_slug
    cross join lateral generate_series(0, st.initial_tasks - 1) as k
    group by 1, 2
    order by 1, 2
  loop
    insert into flowlane.step_tasks (flow_slug, run_id, step_slug, task_index, queue_name, message_id)
    select b.body ->> 'flow_slug', (b.body ->> 'run_id')::uuid, b.body ->> 'step_slug',
           (b.body ->> 'task_index')::int, v_group.queue_name, m.id
    from pgmq.send_batch(v_group.queue_name, v_group.bodies, v_group.start_delay) with ordinality as m (id, ord)
    join unnest(v_group.bodies) with ordinality as b (body, ord) on b.ord = m.ord;
    get diagnostics v_n = row_count;
    if v_n <> cardinality(v_group.bodies) then
      raise exception 'internal error: sent % messages to queue % for % tasks',
        v_n, v_group.queue_name, cardinality(v_group.bodies);
    end if;
  end loop;
end;
$$;

-- the outputs of completed runs: each run's completed leaf steps (the rule, in one place),
-- for a batch of runs in one statement
-- (plpgsql, not sql: a language sql function with set clauses plans its statement on every call)
create or replace function flowlane._run_outputs(p_run_ids uuid[]) returns table (run_id uuid, output jsonb)
language plpgsql stable
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set plan_cache_mode = force_generic_plan
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

create or replace function flowlane._complete_batch(p_items flowlane._result_item[])
returns setof flowlane.step_tasks
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set plan_cache_mode = force_generic_plan
as $$
declare
  v_classes flowlane._result_class[];
  v_violations flowlane._result_class[];
  v_sequential uuid[];
  v_class flowlane._result_class;
  v_task flowlane.step_tasks;
  v_done flowlane.step_tasks[];
  v_steps flowlane.step_states[];
  v_runs uuid[] := array(select distinct i.run_id from unnest(p_items) i);
begin
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

create or replace function flowlane._steps_done(p_steps flowlane.step_states[]) returns void
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set plan_cache_mode = force_generic_plan
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
