-- flowlane SQL Core 0024: single results and run listeners.
-- Drafted by `python -m flowlane.core.draft_migration` from the engine source; reviewed by a person.
-- A single complete_task / fail_task (or a batch of one) takes its rows by key: the item's
-- run, step state and task locked and updated one statement each, its step's end and the
-- plain dependents it makes ready started in one update, without the batch's arrays;
-- anything but the plain case (late, fenced, an output a map checks, a failure out of
-- attempts, a dependent with a condition, no tasks or no queue) still goes the batch way.
-- _progress_runs and _create_runs were planned on every call: generic plans.
-- _enqueue_started is _start_ready_steps' second half, shared with the one-item path.
-- flowlane_run_finished is notified only while a session listens through the new
-- listen_run_finished (a plain LISTEN alone no longer makes runs notify).

-- new runs of one concrete flow (inputs checked by the caller); returns them in input order
-- p_start_at in the future: the runs wait (status waiting) for the maintenance tick;
-- p_keys: each run's idempotency key within p_called (the name the caller started)
create or replace function flowlane._create_runs(p_flow text, p_inputs jsonb[], p_run_ids uuid[],
                                      p_start_at timestamptz = null, p_keys text[] = null,
                                      p_called text = null)
returns setof flowlane.runs
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set plan_cache_mode = force_generic_plan
as $$
declare
  v_ids uuid[];
  v_waiting boolean := coalesce(p_start_at > now(), false);
begin
  perform flowlane._check_contract_inputs(p_flow, p_inputs);
  v_ids := array(select coalesce(p_run_ids[i], gen_random_uuid()) from generate_subscripts(p_inputs, 1) i order by i);
  insert into flowlane.runs (run_id, flow_slug, input, remaining_steps, trace_parent, status, start_at,
                             deadline_at, called_as, idempotency_key)
  select v_ids[i], p_flow, p_inputs[i], (select count(*) from flowlane.steps s where s.flow_slug = p_flow),
         flowlane._trace_parent(), case when v_waiting then 'waiting' else 'started' end, p_start_at,
         case when v_waiting then null else flowlane._run_deadline(p_flow, now()) end,
         case when p_keys[i] is not null then p_called end, p_keys[i]
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
    perform flowlane._progress_runs(v_ids);
  end if;
  return query select r.* from unnest(v_ids) with ordinality as u (run_id, ord)
               join flowlane.runs r on r.run_id = u.run_id and r.run_id = any (v_ids) order by u.ord;
end;
$$;

-- _progress for many runs: conditions and empty maps are resolved run by run
-- (_advance) only where a ready step has one; then ready steps start together
create or replace function flowlane._progress_runs(p_run_ids uuid[]) returns void
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set plan_cache_mode = force_generic_plan
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

-- the tasks of steps just started (their runs' locks held): one send_batch per (queue, start
-- delay), one step_tasks insert per queue; wait and child-flow steps begin instead
create or replace function flowlane._enqueue_started(p_started flowlane.step_states[]) returns void
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set plan_cache_mode = force_generic_plan
as $$
declare
  v_group record;
  v_n int;
begin
  for v_group in
    select s.queue_name, coalesce(s.opt_start_delay, 0) as start_delay,
           array_agg(jsonb_build_object('flow_slug', st.flow_slug, 'run_id', st.run_id,
                                        'step_slug', st.step_slug, 'task_index', k)
                     order by st.run_id, s.step_index, k) as bodies
    from unnest(p_started) st
    join flowlane.steps s on s.flow_slug = st.flow_slug and s.step_slug = st.step_slug
    cross join lateral generate_series(0, st.initial_tasks - 1) as k
    group by 1, 2
    order by 1, 2
  loop
    if v_group.queue_name is null then  -- wait and child-flow steps: no task (17_waits.sql, 18_children.sql)
      perform flowlane._begin_waits(p_started);
      perform flowlane._start_children(p_started);
      continue;
    end if;
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
  v_runs uuid[];
begin
  if cardinality(p_items) = 1 then  -- one result: the plain case costs what it does
    v_task := flowlane._complete_one(p_items[1]);
    if v_task.run_id is not null then
      return next v_task;
      return;
    end if;
  end if;
  v_runs := array(select distinct i.run_id from unnest(p_items) i);
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
    perform pgmq.archive(flowlane._task_queue(v_task), v_task.message_id);
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

create or replace function flowlane._fail_batch(p_items flowlane._result_item[])
returns setof flowlane.step_tasks
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
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
  v_runs := array(select distinct i.run_id from unnest(p_items) i);
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
    perform pgmq.set_vt(flowlane._task_queue(v_task), v_task.message_id,
                        flowlane.calculate_retry_delay(v_base_delay, v_task.attempts_count));
  end if;
  return v_task;
end;
$$;
