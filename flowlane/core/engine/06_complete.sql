-- Completing tasks: a batch of results, fenced by worker and attempt, in one round trip; a
-- step completes with its last task, a run with its last step.
--
-- A batch of results is applied with one statement per table:
--
--   lock runs, step states, tasks of the batch (each in key order: the lock order)
--   classify every item (late, fenced, actionable), item by item
--   one update of step_tasks, one archive (or delete: _end_queue_messages) per queue
--   one update of step_states (remaining_tasks, and completion with the step output, merged)
--   one update of runs (remaining_steps; the last step's completion completes its run)
--   ready steps of every affected run started together: one send_batch per (queue, delay)
--
-- complete_task, fail_task and fail_task_detailed are the one-item case of the same code. A
-- batch means the same as its items applied one by one in key order (run_id, step_slug,
-- task_index): runs are independent, and a run with an item that ends it (a type violation,
-- an exhausted task, a run-failing condition) among several actionable items of the batch
-- applies them one by one (_sequential_runs, the rare path).

create type flowlane._result_item as (
  pos int,              -- 0-based position in the caller's array (for errors)
  run_id uuid,
  step_slug text,
  task_index int,
  output jsonb,         -- completions
  worker_id uuid,
  attempt int,
  error_message text,   -- failures
  error_type text,
  traceback text
);

create type flowlane._result_class as (
  item flowlane._result_item,
  task flowlane.step_tasks,     -- null fields: no such task
  run_status text,
  actionable boolean            -- started, owned by this worker/attempt, first such item of its task
);

create function flowlane.complete_tasks(results jsonb) returns setof flowlane.step_tasks
language plpgsql volatile
set search_path = ''
as $$
begin
  return query select * from flowlane._complete_batch(flowlane._result_items('complete_tasks', results,
    '{run_id, step_slug, task_index, output, worker_id, attempt}'));
end;
$$;

create function flowlane.complete_task(
  run_id uuid, step_slug text, task_index int, output jsonb, worker_id uuid = null, attempt int = null
) returns setof flowlane.step_tasks
language plpgsql volatile
set search_path = ''
as $$
begin
  perform flowlane._require_claim('complete_task', complete_task.worker_id, complete_task.attempt);
  return query select * from flowlane._complete_batch(array[row(0, complete_task.run_id, complete_task.step_slug,
    complete_task.task_index, complete_task.output, complete_task.worker_id, complete_task.attempt,
    null, null, null)::flowlane._result_item]);
end;
$$;

-- a result is fenced by the claim it answers: the worker id and attempt are required (an
-- operator ends a task by hand with override_task, which is recorded)
create function flowlane._require_claim(p_function text, p_worker_id uuid, p_attempt int) returns void
language plpgsql immutable
set search_path = ''
as $$
begin
  if p_worker_id is null or p_attempt is null then
    raise exception '%: a result needs the worker_id and attempt of its claim', p_function
      using errcode = '22023',
            hint = 'an operator completes a task by hand with flowlane.override_task(run_id, step_slug, '
                   'task_index, output, reason)';
  end if;
end;
$$;

-- the items of a complete_tasks/fail_tasks argument, validated together before
-- anything is locked; the first bad item raises with its position
create function flowlane._result_items(p_function text, p_results jsonb, p_shape text)
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
                            or coalesce(jsonb_typeof(e -> 'task_index'), 'null') = 'null'
                            or coalesce(jsonb_typeof(e -> 'worker_id'), 'null') = 'null'
                            or coalesce(jsonb_typeof(e -> 'attempt'), 'null') = 'null'), false)
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
    foreach v_key in array array['worker_id', 'attempt'] loop
      if coalesce(jsonb_typeof(v_bad.e -> v_key), 'null') = 'null' then
        raise exception '%: item % has no %', p_function, v_bad.pos, v_key using errcode = '22023',
          hint = 'a result is fenced by the worker_id and attempt of its claim';
      end if;
    end loop;
  end loop;
  raise exception '%: an item could not be read', p_function using errcode = 'XX000';
end;
$$;

-- The rules both result paths (a batch, _complete_one / _fail_one) apply, each written once.
-- One-line PL/pgSQL functions: planned once per connection, a few µs a call (see "Plans" in
-- flowlane/core/engine/README.md).

-- a result acts on its task when the task, its run and its step are started and the result
-- answers the task's claim (its worker and attempt, where the result names them)
create function flowlane._result_owns(p_item flowlane._result_item, p_task flowlane.step_tasks,
                                      p_run_status text, p_state_status text) returns boolean
language plpgsql immutable
set search_path = ''
as $$
begin
  return p_task.status = 'started' and p_run_status = 'started' and p_state_status = 'started'
     and (p_item.worker_id is null or p_task.last_worker_id is not distinct from p_item.worker_id)
     and (p_item.attempt is null or p_task.attempts_count is not distinct from p_item.attempt);
end;
$$;

-- a completed step's output: a single step's is its task's (p_output), a map step's the array
-- of its tasks' outputs in task order
create function flowlane._step_output(p_run_id uuid, p_step_slug text, p_step_type text, p_output jsonb)
returns jsonb
language plpgsql stable
set search_path = ''
as $$
begin
  if p_step_type = 'single' then
    return p_output;
  end if;
  return (select coalesce(jsonb_agg(t.output order by t.task_index), '[]'::jsonb)
          from flowlane.step_tasks t
          where t.run_id = p_run_id and t.step_slug = p_step_slug);
end;
$$;

-- the tasks a dependent step will have, once a step it needs is done (p_skipped: skipped) with
-- p_output: a map step not yet sized takes the length of its parent's array (0 for a skipped
-- parent); any other step keeps what it has
create function flowlane._dependent_tasks(p_status text, p_initial_tasks int, p_step_type text,
                                          p_output jsonb, p_skipped boolean) returns int
language plpgsql immutable
set search_path = ''
as $$
begin
  return case
    when p_status <> 'created' or p_initial_tasks is not null or p_step_type <> 'map' then p_initial_tasks
    when p_skipped then 0
    when jsonb_typeof(p_output) = 'array' then jsonb_array_length(p_output)
    else p_initial_tasks end;
end;
$$;

-- lock the batch's runs, step states and tasks (the lock order of docs/reliability.md; keys sorted) and classify every item
create function flowlane._lock_and_classify(p_items flowlane._result_item[])
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
    -- (a step without a step_states row: its task holds its state, all_step_states)
    select i, t, r.status as run_status,
           flowlane._result_owns(i, t, r.status,
             coalesce(ss.status, case when t.step_started_at is null then null
                                      when t.status = 'completed' then 'completed' else 'started' end)) as owns
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

create function flowlane._sequential_runs(p_classes flowlane._result_class[], p_enders flowlane._result_class[])
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

create function flowlane._complete_batch(p_items flowlane._result_item[])
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
  v_cached boolean;
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
    perform flowlane._unfold_step_states((v_class.task).run_id);
    update flowlane.step_tasks t
       set status = 'failed', failed_at = flowlane._now(), output = (v_class.item).output,
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
       set status = 'failed', failed_at = flowlane._now(), remaining_tasks = null, error_message = v_task.error_message
     where ss.run_id = v_task.run_id and ss.step_slug = v_task.step_slug;
    perform flowlane._fail_run(v_task.run_id, v_task.error_message);
  end loop;

  -- completions: one statement per table
  with done as (
    update flowlane.step_tasks t
       set status = 'completed', completed_at = flowlane._now(), output = (c.item).output
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
    select d.run_id, d.step_slug, st.step_type, count(*)::int as n, (array_agg(d.output))[1] as output,
           st.opt_cache_ttl is not null as cached
    from unnest(v_done) d
    join flowlane.steps st on st.flow_slug = d.flow_slug and st.step_slug = d.step_slug
    where d.step_started_at is null  -- (a task that holds its step's state: below)
    group by 1, 2, 3, 6
  ), updated as (
    update flowlane.step_states ss
       set remaining_tasks = ss.remaining_tasks - c.n,
           status = case when ss.remaining_tasks = c.n then 'completed' else ss.status end,
           completed_at = case when ss.remaining_tasks = c.n then flowlane._now() end,
           output = case when ss.remaining_tasks = c.n
                         then flowlane._step_output(ss.run_id, ss.step_slug, c.step_type, c.output) end
      from counts c
     where ss.run_id = c.run_id and ss.step_slug = c.step_slug and ss.run_id = any (v_runs)
    returning ss, c.cached
  ) select coalesce(array_agg(u.ss) filter (where (u.ss).status = 'completed'), '{}')
           -- a task that holds its step's state (all_step_states) completed its step with it
           || array(select row(d.flow_slug, d.run_id, d.step_slug, 'completed', 0, 1, 0, d.output, null, null,
                               d.queued_at, d.step_started_at, d.completed_at, null, null, null)::flowlane.step_states
                    from unnest(v_done) d where d.step_started_at is not null),
           bool_or(u.cached)
      into v_steps, v_cached from updated u;
  if v_cached then  -- (23_cache.sql)
    perform flowlane._cache_outputs(v_done);
  end if;
  if cardinality(v_steps) > 0 then
    perform flowlane._steps_done(v_steps);
  end if;
  -- one distinct item per completed task: the rows the update returned are the tasks as they
  -- are now (nothing after it changes a completed task), in key order without reading them again
  if cardinality(v_done) = cardinality(p_items) then
    return query select d.* from unnest(v_done) d order by d.run_id, d.step_slug, d.task_index;
    return;
  end if;
  return query select * from flowlane._batch_rows(p_items);
end;
$$;

-- what a batch call returns: the task of every item (in key order), as it is now
create function flowlane._batch_rows(p_items flowlane._result_item[])
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

-- One result (complete_task, fail_task, a batch of one): the item's rows by key, one
-- statement per row, planned once per connection. The plain case only; anything else
-- (late, fenced or unknown, an output a map must check, a failure out of attempts) is
-- left to the batch path, which then finds the locks already held.

-- lock the item's run, step state and task (the lock order of _lock_and_classify);
-- the task when the item acts on it (started, owned by this worker and attempt), else null
create function flowlane._lock_one(p_item flowlane._result_item) returns flowlane.step_tasks
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
  if v_task.step_started_at is not null then  -- the task holds its step's state (all_step_states)
    v_state_status := case when v_task.status = 'completed' then 'completed' else 'started' end;
  end if;
  if flowlane._result_owns(p_item, v_task, v_run_status, v_state_status) then
    return v_task;
  end if;
  return null;
end;
$$;

-- _complete_batch of one item; null (nothing done) when it is not the plain case
create function flowlane._complete_one(p_item flowlane._result_item) returns flowlane.step_tasks
language plpgsql volatile
set search_path = ''
set plan_cache_mode = force_generic_plan
as $$
declare
  v_task flowlane.step_tasks := flowlane._lock_one(p_item);
  v_step_type text;
  v_cached boolean;
  v_state flowlane.step_states;
begin
  if v_task.run_id is null then
    return null;
  end if;
  select s.step_type, s.opt_cache_ttl is not null into v_step_type, v_cached from flowlane.steps s
  where s.flow_slug = v_task.flow_slug and s.step_slug = v_task.step_slug;
  if v_step_type = 'single' and exists (  -- its output's type is checked by the batch path
       select 1 from flowlane.deps d
       join flowlane.steps ch on ch.flow_slug = d.flow_slug and ch.step_slug = d.step_slug and ch.step_type = 'map'
       where d.flow_slug = v_task.flow_slug and d.dep_slug = v_task.step_slug) then
    return null;
  end if;
  update flowlane.step_tasks t
     set status = 'completed', completed_at = flowlane._now(), output = p_item.output
   where t.run_id = v_task.run_id and t.step_slug = v_task.step_slug and t.task_index = v_task.task_index
  returning t.* into v_task;
  if v_task.message_id is not null then
    perform flowlane._end_queue_messages(flowlane._task_queue(v_task), array[v_task.message_id]);
  end if;
  if v_cached then  -- (23_cache.sql)
    perform flowlane._cache_outputs(array[v_task]);
  end if;
  if v_task.step_started_at is not null then  -- the task holds its step's state: completed with it
    v_state := row(v_task.flow_slug, v_task.run_id, v_task.step_slug, 'completed', 0, 1, 0, v_task.output, null,
                   null, v_task.queued_at, v_task.step_started_at, v_task.completed_at, null, null, null);
  else
    update flowlane.step_states ss
       set remaining_tasks = ss.remaining_tasks - 1,
           status = case when ss.remaining_tasks = 1 then 'completed' else ss.status end,
           completed_at = case when ss.remaining_tasks = 1 then flowlane._now() end,
           output = case when ss.remaining_tasks = 1
                         then flowlane._step_output(ss.run_id, ss.step_slug, v_step_type, p_item.output) end
     where ss.run_id = v_task.run_id and ss.step_slug = v_task.step_slug
    returning ss.* into v_state;
  end if;
  if v_state.status = 'completed' then
    perform flowlane._step_done_one(v_state);
  end if;
  return v_task;
end;
$$;

-- _steps_done of one step of a started run whose lock the caller holds. The dependents it
-- makes ready are started in the same update when each is a plain task step (a queue, no
-- condition, tasks to run); any other one takes _progress_runs, as in the batch path.
create function flowlane._step_done_one(p_step flowlane.step_states) returns void
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
         completed_at = case when r.remaining_steps = 1 then flowlane._now() else r.completed_at end,
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
      select flowlane._dependent_tasks(cs.status, cs.initial_tasks, cst.step_type, p_step.output, false) as tasks) t
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
           started_at = case when v_plain and cs.status = 'created' and cs.remaining_deps = 1 then flowlane._now()
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
    perform flowlane._enqueue_steps(v_started, false);
  elsif v_ready > 0 then
    perform flowlane._progress_runs(array[p_step.run_id]);
  end if;
  -- no dependent made ready: nothing to start, skip or complete (the run's other ready
  -- steps were started when they became ready; its last step completed it above)
end;
$$;

create function flowlane._steps_done(p_steps flowlane.step_states[]) returns void
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set plan_cache_mode = force_generic_plan
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_runs uuid[] := array(select distinct s.run_id from unnest(p_steps) s order by 1);
  v_started uuid[];
  v_dep_runs uuid[];
  v_dep_steps text[];
  v_dep_counts int[];
  v_dep_tasks int[];
  v_dep_ready boolean[];
  v_ready int;
  v_plain boolean;
  v_now_started flowlane.step_states[];
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
         completed_at = case when c.last then flowlane._now() else r.completed_at end,
         output = case when c.last then coalesce(o.output, '{}'::jsonb) else r.output end
    from counts c
    left join flowlane._run_outputs(array(select k.run_id from counts k where k.last)) o on o.run_id = c.run_id
   where r.run_id = c.run_id and r.run_id = any (v_runs)
  returning r.run_id, r.status
  ) select coalesce(array_agg(u.run_id order by u.run_id) filter (where u.status = 'started'), '{}')
      into v_started from updated u;
  -- each dependent's remaining deps and initial tasks once the batch's steps are done (a map
  -- child takes the length of its parent's array), and whether the ones it makes ready are
  -- all plain task steps (a queue, no condition, tasks to run): then they start in the same
  -- update, as in _step_done_one; any other one takes _progress_runs. A leaf step has none.
  select array_agg(c.run_id order by c.run_id, c.step_slug), array_agg(c.step_slug order by c.run_id, c.step_slug),
         array_agg(c.n order by c.run_id, c.step_slug), array_agg(c.tasks order by c.run_id, c.step_slug),
         array_agg(c.ready order by c.run_id, c.step_slug),
         count(*) filter (where c.ready), coalesce(bool_and(c.plain) filter (where c.ready), true)
    into v_dep_runs, v_dep_steps, v_dep_counts, v_dep_tasks, v_dep_ready, v_ready, v_plain
  from (
    select x.run_id, x.step_slug, x.n, t.tasks,
           x.run_id = any (v_started) and cs.status = 'created' and cs.remaining_deps = x.n as ready,
           x.task_step and t.tasks > 0 as plain
    -- (each lookup by its whole key: the step by the dependency's, the state without
    -- run_id = any (v_runs), with which a generic plan read every state of the batch's runs
    -- once per dependent)
    from (select p.run_id, d.step_slug, count(*)::int as n, (array_agg(p.output))[1] as output, cst.step_type,
                 cst.queue_name is not null and cst.required_input_pattern is null
                   and cst.forbidden_input_pattern is null as task_step
          from unnest(p_steps) p
          join flowlane.deps d on d.flow_slug = p.flow_slug and d.dep_slug = p.step_slug
          join flowlane.steps cst on cst.flow_slug = d.flow_slug and cst.step_slug = d.step_slug
          group by 1, 2, 5, 6) x
    join flowlane.step_states cs on cs.run_id = x.run_id and cs.step_slug = x.step_slug
    cross join lateral (
      select flowlane._dependent_tasks(cs.status, cs.initial_tasks, x.step_type, x.output, false) as tasks) t
  ) c;
  if v_dep_steps is null then  -- leaf steps: nothing to start (a run with no step left completed above)
    return;
  end if;
  v_plain := v_plain and v_ready > 0;
  with counted as (
    update flowlane.step_states cs
       set remaining_deps = cs.remaining_deps - x.n,
           initial_tasks = x.tasks,
           status = case when v_plain and x.ready then 'started' else cs.status end,
           -- (as _start_ready_steps: never before the state was created)
           started_at = case when v_plain and x.ready then greatest(flowlane._now(), cs.created_at)
                             else cs.started_at end,
           remaining_tasks = case when v_plain and x.ready then x.tasks else cs.remaining_tasks end
      from unnest(v_dep_runs, v_dep_steps, v_dep_counts, v_dep_tasks, v_dep_ready) as x (run_id, step_slug, n, tasks, ready)
     where cs.run_id = x.run_id and cs.step_slug = x.step_slug and cs.run_id = any (v_runs)
    returning cs, x.ready
  ) select coalesce(array_agg(c.cs order by (c.cs).run_id, (c.cs).step_slug) filter (where v_plain and c.ready), '{}')
      into v_now_started from counted c;
  if v_plain then
    perform flowlane._enqueue_steps(v_now_started, false);
  elsif v_ready > 0 then  -- a completed run has nothing left to start or skip
    perform flowlane._progress_runs(v_started);
  end if;
  -- no dependent made ready: nothing to start, skip or complete (the runs' other ready steps
  -- were started when they became ready)
end;
$$;

-- An operator completes a started task by hand: the task completes with the given output as
-- its worker's result would, the attempt history records who (the session's login) and why,
-- and the claim is taken from the worker (last_worker_id cleared), so that its own result,
-- when it comes, is rejected and counted as such by the worker.
create function flowlane.override_task(
  run_id uuid, step_slug text, task_index int, output jsonb, reason text
) returns setof flowlane.step_tasks
language plpgsql volatile
set search_path = ''
as $$
declare
  v_task flowlane.step_tasks;
begin
  if nullif(btrim(override_task.reason), '') is null then
    raise exception 'override_task: a reason is required (it is recorded in the task''s history)'
      using errcode = '22023';
  end if;
  perform 1 from flowlane.runs r where r.run_id = override_task.run_id for update;
  perform 1 from flowlane.step_states ss
  where ss.run_id = override_task.run_id and ss.step_slug = override_task.step_slug for update;
  select t.* into v_task from flowlane.step_tasks t
  where t.run_id = override_task.run_id and t.step_slug = override_task.step_slug
    and t.task_index = override_task.task_index
  for update;
  if v_task.run_id is null or v_task.status <> 'started' then
    raise exception 'override_task: task %/%/% is %: only a started task is completed by hand',
      override_task.run_id, override_task.step_slug, override_task.task_index,
      coalesce(v_task.status, 'not found') using errcode = '55000';
  end if;
  perform flowlane._complete_batch(array[row(0, v_task.run_id, v_task.step_slug, v_task.task_index,
    override_task.output, v_task.last_worker_id, v_task.attempts_count, null, null, null)::flowlane._result_item]);
  insert into flowlane.task_attempts
    (run_id, step_slug, task_index, attempt, retry_round, outcome, worker_id, error_type, error_message)
  select v_task.run_id, v_task.step_slug, v_task.task_index, greatest(v_task.attempts_count, 1), r.retry_count,
         'overridden', v_task.last_worker_id, 'Override',
         left(format('completed by hand by %s: %s', session_user, override_task.reason), 4000)
  from flowlane.runs r where r.run_id = v_task.run_id;
  update flowlane.step_tasks t set last_worker_id = null
  where t.run_id = v_task.run_id and t.step_slug = v_task.step_slug and t.task_index = v_task.task_index;
  return query select t.* from flowlane.step_tasks t
  where t.run_id = v_task.run_id and t.step_slug = v_task.step_slug and t.task_index = v_task.task_index;
end;
$$;
