-- flowlane SQL Core 0040: the arrays of run ids that index scans filter on are sorted.
-- A join that looks rows up by key also filters on `run_id = any (<the batch's runs>)` (see
-- "Plans" in the engine's README). The index scan sorts that array again on every rescan, once
-- per row of the outer side: n log n comparisons each time for an unsorted array, n for a
-- sorted one. In a batch of 100 completions the sorting took about a sixth of the server's
-- CPU. The arrays that completions, failures, claims and batched starts built in the batch's
-- (random) order are now built in key order; nothing else changes.

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

-- what claimed tasks are handed, for a batch in one statement: a task's input (the element
-- of the run input for a root map, of the parent's output for a dependent map; the run input
-- for a root single step; otherwise {dep: output} of the completed deps), and the run input
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
  join flowlane.steps s on s.flow_slug = r.flow_slug and s.step_slug = t.step_slug;
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
