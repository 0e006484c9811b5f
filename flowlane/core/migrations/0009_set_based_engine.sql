-- flowlane SQL Core 0009: a set-based engine (docs/runtime.md, "Throughput").
--
-- (0008 holds the console's indexes.)
--
-- Before, complete_tasks looped over complete_task server-side (about 75
-- nested statements per task: one archive of a one-element array per task,
-- one send_batch per started step, step_states updated three times per task).
-- Now a batch of results is applied with one statement per table:
--
--   lock runs, step states, tasks of the batch (each in key order: 0006's lock order)
--   classify every item (late, fenced, actionable) as before, item by item
--   one update of step_tasks, one pgmq.archive per queue
--   one update of step_states (remaining_tasks, and completion with the step output, merged)
--   one update of runs (remaining_steps), one update releasing the children of every completed step
--   ready steps of every affected run started together: one send_batch per (queue, delay)
--
-- complete_task, fail_task and fail_task_detailed are the one-item case of the
-- same code. A batch means the same as its items applied one by one in key
-- order (run_id, step_slug, task_index): runs are independent, and a run with
-- an item that ends it (a type violation, an exhausted task) among several
-- actionable items of the batch applies them one by one (the rare path).
-- Plans: PL/pgSQL caches a generic plan per statement. Planned while the
-- tables were small, a lookup of a batch's rows became a sequential scan and
-- stayed one as the tables grew (per-task cost 1.7 -> 4.4 ms over a
-- benchmark's 5,000 runs). The batch functions run with enable_seqscan = off:
-- every statement reaches the batch's rows through a primary key (run_id =
-- any (batch runs)), so the cost follows the batch, never the tables.
--
-- Also: start_flows (many runs in one call), claim_tasks (read + claim in one
-- round trip, the run input once per run), fillfactor on the hot tables.

-- ---------------------------------------------------------------------------
-- batch items
-- ---------------------------------------------------------------------------

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
begin
  if p_results is null or jsonb_typeof(p_results) <> 'array' then
    raise exception '%: results must be a JSON array of %', p_function, p_shape using errcode = '22023';
  end if;
  -- fast check of every item in one pass; only a suspicious item gets the exact (slow) check
  for v_bad in
    select e, o - 1 as pos from jsonb_array_elements(p_results) with ordinality as a (e, o)
    where jsonb_typeof(e) <> 'object'
       or coalesce(jsonb_typeof(e -> 'run_id'), 'null') = 'null'
       or coalesce(jsonb_typeof(e -> 'step_slug'), 'null') = 'null'
       or coalesce(jsonb_typeof(e -> 'task_index'), 'null') = 'null'
       or (e ->> 'run_id') !~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
       or coalesce(e ->> 'worker_id', '00000000-0000-0000-0000-000000000000')
            !~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
       or (e ->> 'task_index') !~ '^-?[0-9]{1,9}$'
       or coalesce(e ->> 'attempt', '0') !~ '^-?[0-9]{1,9}$'
    order by o
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
  end loop;
  select coalesce(array_agg(row(o - 1, (e ->> 'run_id')::uuid, e ->> 'step_slug', (e ->> 'task_index')::int,
                                e -> 'output', (e ->> 'worker_id')::uuid, (e ->> 'attempt')::int,
                                e ->> 'error_message', e ->> 'error_type', e ->> 'traceback'
                               )::flowlane._result_item order by o), '{}')
    into v_items
  from jsonb_array_elements(p_results) with ordinality as a (e, o);
  return v_items;
end;
$$;

-- one item of a batch, classified under the batch's locks
create type flowlane._result_class as (
  item flowlane._result_item,
  task flowlane.step_tasks,     -- null fields: no such task
  run_status text,
  actionable boolean            -- started, owned by this worker/attempt, first such item of its task
);

-- lock the batch's runs, step states and tasks (0006's order; keys sorted) and classify every item
create function flowlane._lock_and_classify(p_items flowlane._result_item[])
returns flowlane._result_class[]
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in the header
as $$
declare
  v_classes flowlane._result_class[];
  -- every lookup below also filters on run_id = any (v_runs): an index path whose cost
  -- follows the batch, whatever the planner thinks of unnest()'s row count
  v_runs uuid[] := array(select distinct i.run_id from unnest(p_items) i);
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

-- the runs of a batch whose actionable items must apply one by one: a run with
-- more than one actionable item, one of which ends it (p_enders)
create function flowlane._sequential_runs(p_classes flowlane._result_class[], p_enders flowlane._result_class[])
returns uuid[]
language sql stable
set search_path = ''
as $$
  select coalesce(array_agg(distinct (e.task).run_id), '{}')
  from unnest(p_enders) e
  where (select count(*) from unnest(p_classes) c
         where c.actionable and (c.task).run_id = (e.task).run_id) > 1
$$;

-- ---------------------------------------------------------------------------
-- progress of many runs at once
-- ---------------------------------------------------------------------------

-- the ready steps of the given started runs (callers hold the run locks, or
-- the runs are new): one step_states update, one send_batch per (queue, start
-- delay) for all runs, one step_tasks insert per queue
create function flowlane._start_ready_steps(p_run_ids uuid[]) returns void
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in the header
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
    where ss.run_id = any (p_run_ids) and ss.status = 'created' and ss.remaining_deps = 0
      and ss.initial_tasks > 0 and flowlane._condition_met(ss.run_id, ss.step_slug)
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

-- public, unchanged contract: locks the run, starts its ready steps
create or replace function flowlane.start_ready_steps(run_id uuid) returns void
language plpgsql volatile
set search_path = ''
as $$
begin
  perform 1 from flowlane.runs r where r.run_id = start_ready_steps.run_id for update;
  perform flowlane._start_ready_steps(array[start_ready_steps.run_id]);
end;
$$;

create function flowlane._maybe_complete_runs(p_run_ids uuid[]) returns void
language sql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in the header
as $$
  update flowlane.runs r
     set status = 'completed', completed_at = now(),
         output = coalesce((
           select jsonb_object_agg(ss.step_slug, ss.output)
           from flowlane.step_states ss
           where ss.run_id = r.run_id and ss.status = 'completed'
             and not exists (select 1 from flowlane.deps d
                             where d.flow_slug = ss.flow_slug and d.dep_slug = ss.step_slug)
         ), '{}'::jsonb)
   where r.run_id = any (p_run_ids) and r.status = 'started' and r.remaining_steps = 0
$$;

create or replace function flowlane._maybe_complete_run(p_run_id uuid) returns void
language sql volatile
set search_path = ''
as $$ select flowlane._maybe_complete_runs(array[p_run_id]) $$;

-- _progress for many runs: conditions and empty maps are resolved run by run
-- (_advance) only where a ready step has one; then ready steps start together
create function flowlane._progress_runs(p_run_ids uuid[]) returns void
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in the header
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
  perform flowlane._maybe_complete_runs(p_run_ids);
end;
$$;

create or replace function flowlane._progress(p_run_id uuid) returns void
language sql volatile
set search_path = ''
as $$ select flowlane._progress_runs(array[p_run_id]) $$;

-- ---------------------------------------------------------------------------
-- completions
-- ---------------------------------------------------------------------------

create function flowlane._complete_batch(p_items flowlane._result_item[])
returns setof flowlane.step_tasks
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in the header
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
  with counts as (
    select d.run_id, d.step_slug, count(*)::int as n, (array_agg(d.output))[1] as output
    from unnest(v_done) d group by 1, 2
  ), updated as (
    update flowlane.step_states ss
       set remaining_tasks = ss.remaining_tasks - c.n,
           status = case when ss.remaining_tasks = c.n then 'completed' else ss.status end,
           completed_at = case when ss.remaining_tasks = c.n then now() end,
           output = case when ss.remaining_tasks <> c.n then null
                         when st.step_type = 'single' then c.output
                         else (select coalesce(jsonb_agg(t.output order by t.task_index), '[]'::jsonb)
                               from flowlane.step_tasks t
                               where t.run_id = ss.run_id and t.step_slug = ss.step_slug) end
      from counts c, flowlane.steps st
     where ss.run_id = c.run_id and ss.step_slug = c.step_slug and ss.run_id = any (v_runs)
       and st.flow_slug = ss.flow_slug and st.step_slug = ss.step_slug
    returning ss
  ) select coalesce(array_agg(u.ss) filter (where (u.ss).status = 'completed'), '{}') into v_steps from updated u;
  if cardinality(v_steps) > 0 then
    perform flowlane._steps_done(v_steps);
  end if;
  return query select * from flowlane._batch_rows(p_items);
end;
$$;

-- completed steps (their states already updated): runs' remaining steps, the
-- children released (map children sized from the parent's array), then the
-- affected runs progress together
create function flowlane._steps_done(p_steps flowlane.step_states[]) returns void
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in the header
as $$
declare
  v_runs uuid[] := array(select distinct s.run_id from unnest(p_steps) s order by 1);
begin
  update flowlane.runs r set remaining_steps = r.remaining_steps - c.n
    from (select s.run_id, count(*)::int as n from unnest(p_steps) s group by 1) c
   where r.run_id = c.run_id and r.run_id = any (v_runs);
  update flowlane.step_states cs
     set remaining_deps = cs.remaining_deps - x.n,
         initial_tasks = case
           when cs.status <> 'created' or cs.initial_tasks is not null or cst.step_type <> 'map' then cs.initial_tasks
           when jsonb_typeof(x.output) = 'array' then jsonb_array_length(x.output)
           else cs.initial_tasks end
    from (select p.run_id, d.step_slug, count(*)::int as n, (array_agg(p.output))[1] as output
          from unnest(p_steps) p
          join flowlane.deps d on d.flow_slug = p.flow_slug and d.dep_slug = p.step_slug
          group by 1, 2) x,
         flowlane.steps cst
   where cs.run_id = x.run_id and cs.step_slug = x.step_slug and cs.run_id = any (v_runs)
     and cst.flow_slug = cs.flow_slug and cst.step_slug = cs.step_slug;
  perform flowlane._progress_runs(v_runs);
end;
$$;

-- what a batch call returns: the task of every item (in key order), as it is now
create function flowlane._batch_rows(p_items flowlane._result_item[])
returns setof flowlane.step_tasks
language sql stable
set search_path = ''
set enable_seqscan = off  -- see "Plans" in the header
as $$
  select t.* from unnest(p_items) i
  join flowlane.step_tasks t on t.run_id = i.run_id and t.step_slug = i.step_slug and t.task_index = i.task_index
   and t.run_id = any (array(select j.run_id from unnest(p_items) j))
  order by i.run_id, i.step_slug, i.task_index, i.pos
$$;

create or replace function flowlane.complete_tasks(results jsonb) returns setof flowlane.step_tasks
language plpgsql volatile
set search_path = ''
as $$
begin
  return query select * from flowlane._complete_batch(flowlane._result_items('complete_tasks', results,
    '{run_id, step_slug, task_index, output, worker_id, attempt}'));
end;
$$;

create or replace function flowlane.complete_task(
  run_id uuid, step_slug text, task_index int, output jsonb, worker_id uuid = null, attempt int = null
) returns setof flowlane.step_tasks
language sql volatile
set search_path = ''
as $$
  select * from flowlane._complete_batch(array[row(0, run_id, step_slug, task_index, output, worker_id, attempt,
                                                   null, null, null)::flowlane._result_item])
$$;

-- ---------------------------------------------------------------------------
-- failures
-- ---------------------------------------------------------------------------

-- a task out of attempts (fail_tasks or stalled recovery): failed, message
-- archived, when_exhausted applied. Caller holds the run, step state and task locks.
create or replace function flowlane._exhaust_task(p_task flowlane.step_tasks, p_error text) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_task flowlane.step_tasks;
  v_mode text;
begin
  update flowlane.step_tasks t
     set status = 'failed', failed_at = now(), error_message = p_error
   where t.run_id = p_task.run_id and t.step_slug = p_task.step_slug and t.task_index = p_task.task_index
  returning * into v_task;
  perform flowlane._archive_tasks(array[v_task]);
  select s.when_exhausted into v_mode from flowlane.steps s
  where s.flow_slug = v_task.flow_slug and s.step_slug = v_task.step_slug;
  if v_mode = 'fail' then
    update flowlane.step_states ss
       set status = 'failed', failed_at = now(), remaining_tasks = null, error_message = p_error
     where ss.run_id = v_task.run_id and ss.step_slug = v_task.step_slug;
    perform flowlane._fail_run(v_task.run_id,
      format('step %s task %s failed after %s %s: %s', v_task.step_slug, v_task.task_index,
             v_task.attempts_count, case when v_task.attempts_count = 1 then 'attempt' else 'attempts' end, p_error));
  elsif v_mode = 'skip-cascade' then
    perform flowlane._skip_cascade(v_task.run_id, v_task.step_slug, 'handler_failed');
    perform flowlane._progress(v_task.run_id);
  else
    perform flowlane._skip_step(v_task.run_id, v_task.step_slug, 'handler_failed');
    perform flowlane._progress(v_task.run_id);
  end if;
end;
$$;

-- the attempt history (0007) takes an attempt's error type and traceback from
-- flowlane.attempt_details, {"<run_id>/<step_slug>/<task_index>": {type, traceback}}
-- (one setting for a whole batch), else from 0007's single-task settings
create or replace function flowlane._record_attempt() returns trigger
language plpgsql volatile
set search_path = ''
as $$
declare
  v_stalled boolean := new.requeued_count > old.requeued_count;
  v_message text := new.error_message;
  v_details jsonb := nullif(current_setting('flowlane.attempt_details', true), '')::jsonb
                     -> format('%s/%s/%s', new.run_id, new.step_slug, new.task_index);
begin
  if v_stalled and new.error_message is not distinct from old.error_message then
    v_message := format('no result within %s s: the task was requeued by stalled recovery',
                        flowlane._effective_timeout(new.flow_slug, new.step_slug) + 30);
  end if;
  insert into flowlane.task_attempts
    (run_id, step_slug, task_index, attempt, retry_round, outcome, worker_id, error_type, error_message, traceback)
  select new.run_id, new.step_slug, new.task_index, greatest(old.attempts_count, 1), r.retry_count,
         case when v_stalled then 'stalled' when new.status = 'failed' then 'failed' else 'retry' end,
         old.last_worker_id,
         case when v_stalled then 'Stalled'
              else left(nullif(coalesce(v_details ->> 'type',
                                        current_setting('flowlane.attempt_error_type', true)), ''), 200) end,
         left(v_message, 4000),
         case when v_stalled then null
              else left(nullif(coalesce(v_details ->> 'traceback',
                                        current_setting('flowlane.attempt_traceback', true)), ''), 16000) end
  from flowlane.runs r where r.run_id = new.run_id;
  return null;
end;
$$;

create function flowlane._fail_batch(p_items flowlane._result_item[])
returns setof flowlane.step_tasks
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in the header
as $$
declare
  v_classes flowlane._result_class[];
  v_exhausted flowlane._result_class[];
  v_sequential uuid[];
  v_class flowlane._result_class;
  v_task flowlane.step_tasks;
  v_retried flowlane.step_tasks[];
  v_delays int[];
  v_runs uuid[] := array(select distinct i.run_id from unnest(p_items) i);
begin
  v_classes := flowlane._lock_and_classify(p_items);
  perform set_config('flowlane.attempt_details', coalesce((
    select jsonb_object_agg(format('%s/%s/%s', (c.task).run_id, (c.task).step_slug, (c.task).task_index),
                            jsonb_build_object('type', (c.item).error_type, 'traceback', (c.item).traceback))
    from unnest(v_classes) c where c.actionable), '{}')::text, true);

  select coalesce(array_agg(c order by (c.task).run_id, (c.task).step_slug, (c.task).task_index), '{}')
    into v_exhausted
  from unnest(v_classes) c
  join flowlane.steps s on s.flow_slug = (c.task).flow_slug and s.step_slug = (c.task).step_slug
  join flowlane.flows f on f.flow_slug = (c.task).flow_slug
  where c.actionable and (c.task).attempts_count >= coalesce(s.opt_max_attempts, f.opt_max_attempts);

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
           coalesce(array_agg(flowlane.calculate_retry_delay(coalesce(s.opt_base_delay, f.opt_base_delay),
                                                             (r.t).attempts_count)), '{}')
      into v_retried, v_delays
    from retried r
    join flowlane.steps s on s.flow_slug = (r.t).flow_slug and s.step_slug = (r.t).step_slug
    join flowlane.flows f on f.flow_slug = (r.t).flow_slug;
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

-- a batch of failures in one round trip: items {run_id, step_slug, task_index,
-- error_message, worker_id, attempt, error_type, traceback}
create function flowlane.fail_tasks(results jsonb) returns setof flowlane.step_tasks
language plpgsql volatile
set search_path = ''
as $$
begin
  return query select * from flowlane._fail_batch(flowlane._result_items('fail_tasks', results,
    '{run_id, step_slug, task_index, error_message, worker_id, attempt, error_type, traceback}'));
end;
$$;

create or replace function flowlane.fail_task_detailed(
  run_id uuid, step_slug text, task_index int, error_message text, worker_id uuid = null, attempt int = null,
  error_type text = null, traceback text = null
) returns setof flowlane.step_tasks
language sql volatile
set search_path = ''
as $$
  select * from flowlane._fail_batch(array[row(0, run_id, step_slug, task_index, null, worker_id, attempt,
                                               error_message, error_type, traceback)::flowlane._result_item])
$$;

create or replace function flowlane.fail_task(
  run_id uuid, step_slug text, task_index int, error_message text, worker_id uuid = null, attempt int = null
) returns setof flowlane.step_tasks
language sql volatile
set search_path = ''
as $$
  select * from flowlane.fail_task_detailed(run_id, step_slug, task_index, error_message, worker_id, attempt)
$$;

-- ---------------------------------------------------------------------------
-- starts
-- ---------------------------------------------------------------------------

-- new runs of one concrete flow (inputs checked by the caller); returns them in input order
create function flowlane._create_runs(p_flow text, p_inputs jsonb[], p_run_ids uuid[])
returns setof flowlane.runs
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in the header
as $$
declare
  v_ids uuid[];
begin
  v_ids := array(select coalesce(p_run_ids[i], gen_random_uuid()) from generate_subscripts(p_inputs, 1) i order by i);
  insert into flowlane.runs (run_id, flow_slug, input, remaining_steps)
  select v_ids[i], p_flow, p_inputs[i], (select count(*) from flowlane.steps s where s.flow_slug = p_flow)
  from generate_subscripts(p_inputs, 1) i order by i;
  insert into flowlane.step_states (flow_slug, run_id, step_slug, remaining_deps, initial_tasks)
  select p_flow, v_ids[i], s.step_slug, s.deps_count,
         case when s.step_type = 'single' then 1
              when s.deps_count = 0 and jsonb_typeof(p_inputs[i]) = 'array' then jsonb_array_length(p_inputs[i])
              else null end
  from generate_subscripts(p_inputs, 1) i, flowlane.steps s
  where s.flow_slug = p_flow
  order by v_ids[i], s.step_slug;
  perform flowlane._progress_runs(v_ids);
  return query select r.* from unnest(v_ids) with ordinality as u (run_id, ord)
               join flowlane.runs r on r.run_id = u.run_id and r.run_id = any (v_ids) order by u.ord;
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

create or replace function flowlane.start_flow(flow_slug text, input jsonb, run_id uuid = null)
returns flowlane.runs
language plpgsql volatile
set search_path = ''
as $$
declare
  v_flow text := flowlane.resolve_flow(start_flow.flow_slug);
  v_run flowlane.runs;
begin
  perform flowlane._check_start_input(v_flow, input, format('start_flow(%s)', v_flow));
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
  select * into v_run from flowlane._create_runs(v_flow, array[input], array[start_flow.run_id]);
  return v_run;
end;
$$;

-- many runs of one flow or alias in one call; returns the runs in input order.
-- All or nothing: a bad input raises naming its position and starts no run.
create function flowlane.start_flows(flow_slug text, inputs jsonb[]) returns setof flowlane.runs
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
  for v_i in select i from generate_subscripts(inputs, 1) i
             where inputs[i] is null or jsonb_typeof(inputs[i]) <> 'array' order by i loop
    perform flowlane._check_start_input(v_flow, inputs[v_i], format('start_flows(%s): input %s', v_flow, v_i - 1));
  end loop;
  return query select * from flowlane._create_runs(v_flow, inputs, '{}');
end;
$$;

-- ---------------------------------------------------------------------------
-- claims
-- ---------------------------------------------------------------------------

-- read up to qty messages and claim them in one round trip, with start_tasks'
-- exact classification: with an unsupported message nothing is claimed, the
-- whole batch is visible again, and the rows are the 'unsupported' messages
-- plus one 'handed_back' row (msg_id only) per other message of the batch.
-- Messages are read with the longest claim lease of the served pairs, so none
-- becomes visible between the read and the claim. flow_input is sent once per
-- run and batch: null on the run's later rows (a run input is never SQL null).
create function flowlane.claim_tasks(queue_name text, qty int, worker_id uuid, supported_pairs jsonb)
returns setof flowlane.claim_record
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in the header
as $$
declare
  v_lease int;
  v_ids bigint[];
  v_later bigint[];
begin
  perform flowlane._check_queue_argument('claim_tasks', claim_tasks.queue_name);
  if qty is null or qty < 1 then
    raise exception 'claim_tasks: qty must be at least 1' using errcode = '22023';
  end if;
  perform flowlane._pairs(supported_pairs);
  select coalesce(max(coalesce(s.opt_timeout, f.opt_timeout)), 0) + 2 into v_lease
  from flowlane._pairs(supported_pairs) p
  join flowlane.steps s on s.flow_slug = p.flow_slug and s.step_slug = p.step_slug
  join flowlane.flows f on f.flow_slug = s.flow_slug;
  select coalesce(array_agg(m.msg_id) filter (where m.enqueued_at <= now()), '{}'),
         coalesce(array_agg(m.msg_id) filter (where m.enqueued_at > now()), '{}')
    into v_ids, v_later
  from pgmq.read(claim_tasks.queue_name, v_lease, qty) m;
  if cardinality(v_later) > 0 then
    -- enqueued by a transaction that committed after this one began (the read takes a
    -- new snapshot): a claim now would start the task before it was queued. Visible
    -- again at once; the next poll, a new transaction, claims it.
    perform pgmq.set_vt(claim_tasks.queue_name, v_later, 0);
  end if;
  if cardinality(v_ids) = 0 then
    return;
  end if;
  return query
    with c as (
      select * from flowlane.start_tasks(claim_tasks.queue_name, v_ids, claim_tasks.worker_id, supported_pairs)
    )
    select c.outcome, c.flow_slug, c.step_slug, c.queue_name, c.run_id, c.task_index, c.input,
           case when row_number() over (partition by c.run_id order by c.msg_id) = 1 then c.flow_input end,
           c.attempt, c.msg_id
    from c
    union all
    -- a refused batch: the other messages read, handed back visible with it (ids only)
    select 'handed_back', null, null, claim_tasks.queue_name, null, null, null, null, null, m.id
    from unnest(v_ids) as m (id)
    where exists (select 1 from c where c.outcome = 'unsupported')
      and not exists (select 1 from c where c.msg_id = m.id)
    order by 10;
end;
$$;

-- ---------------------------------------------------------------------------
-- storage
-- ---------------------------------------------------------------------------

-- room on each page for updated row versions (HOT where no indexed column changes)
alter table flowlane.step_tasks set (fillfactor = 80);
alter table flowlane.step_states set (fillfactor = 80);
alter table flowlane.runs set (fillfactor = 85);

-- ---------------------------------------------------------------------------
-- deletion in the flow's runs, not in the tables
-- ---------------------------------------------------------------------------

-- step_tasks has no index on flow_slug (one would cost every enqueue): its
-- rows are found through the flow's runs (primary key prefix), so deleting a
-- small flow costs the same next to 10k or 100k other tasks
-- (benchmarks/recovery_scaling.py)
create or replace function flowlane.delete_flow_and_data(flow_slug text) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_runs uuid[];
  v_active flowlane.step_tasks[];
begin
  v_runs := array(select r.run_id from flowlane.runs r where r.flow_slug = delete_flow_and_data.flow_slug
                  order by r.run_id for update);
  select coalesce(array_agg(t order by t.queue_name, t.message_id), '{}') into v_active
  from flowlane.step_tasks t
  where t.run_id = any (v_runs) and t.status in ('queued', 'started');
  perform flowlane._archive_tasks(v_active);
  delete from flowlane.step_tasks t where t.run_id = any (v_runs);
  delete from flowlane.step_states ss where ss.run_id = any (v_runs);
  delete from flowlane.runs r where r.run_id = any (v_runs);
  delete from flowlane.deps d where d.flow_slug = delete_flow_and_data.flow_slug;
  delete from flowlane.steps s where s.flow_slug = delete_flow_and_data.flow_slug;
  delete from flowlane.flows f where f.flow_slug = delete_flow_and_data.flow_slug;
end;
$$;

-- Deleting the flows row made PostgreSQL check that no step_tasks row still
-- references it: a sequential scan of step_tasks (no index on flow_slug). The
-- reference is redundant (a task's step state references its step, which
-- references its flow; its run references the flow) and its check also ran on
-- every task insert, so it goes.
alter table flowlane.step_tasks drop constraint step_tasks_flow_slug_fkey;
