-- flowlane SQL Core 0038: the functions a task's cycle calls are PL/pgSQL, planned once.
-- A language sql function with SET clauses (every function here pins its search_path) is never
-- inlined, and before PostgreSQL 18 it parses and plans its statement on every call. On
-- PostgreSQL 15 such functions cost a cycle of start, claim, completion and tick about 3.9 ms
-- of 12: the claim's inputs alone 1.6 ms of a 3.5 ms claim, retention's lookup 1.2 ms of every
-- tick. These fifteen are now PL/pgSQL, whose statements are planned once per connection; the
-- same signatures and results.

create or replace function flowlane.is_valid_queue_name(queue_name text) returns boolean
language plpgsql immutable parallel safe
set search_path = ''
as $$
begin
  return queue_name is not null
     and length(queue_name) between 1 and 47
     and queue_name ~ '^[a-z][a-z0-9_]*$'
     and right(queue_name, 1) <> '_';
end;
$$;

create or replace function flowlane.json_limits() returns jsonb
language plpgsql immutable parallel safe
set search_path = ''
as $$ begin return '{"max_depth": 100, "max_bytes": 67108864}'::jsonb; end $$;

-- the queue a task's message lives on: its immutable snapshot
create or replace function flowlane._task_queue(task flowlane.step_tasks) returns text
language plpgsql stable
set search_path = ''
as $$ begin return task.queue_name; end $$;

-- the value a step's condition is tested against: the run input for a root
-- step, {dep: output} of its completed deps otherwise
create or replace function flowlane._condition_subject(p_run_id uuid, p_step_slug text) returns jsonb
language plpgsql stable
set search_path = ''
as $$
begin
  return (
    select case when s.deps_count = 0 then r.input else
      coalesce((select jsonb_object_agg(d.dep_slug, ps.output)
                from flowlane.deps d
                join flowlane.step_states ps on ps.run_id = p_run_id and ps.step_slug = d.dep_slug
                where d.flow_slug = s.flow_slug and d.step_slug = s.step_slug and ps.status = 'completed'),
               '{}'::jsonb) end
    from flowlane.runs r
    join flowlane.steps s on s.flow_slug = r.flow_slug and s.step_slug = p_step_slug
    where r.run_id = p_run_id);
end;
$$;

-- the rows of a claim of the messages read: the claimed tasks (a run's input on its first row
-- only) and, for a refused batch, the other messages read, handed back visible (ids only)
create or replace function flowlane._claim_batch(p_queue text, p_ids bigint[], p_worker_id uuid, p_flows text[],
                                      p_steps text[], p_lease int, p_started_at timestamptz)
returns setof flowlane.claim_record
language plpgsql volatile
set search_path = ''
as $$
begin
  return query
  with c as (
    select * from flowlane._start_tasks(p_queue, p_ids, p_worker_id, p_flows, p_steps, p_lease, p_started_at)
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
  order by 10;
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
    on r.run_id = t.run_id and r.run_id = any (array(select x.run_id from unnest(p_tasks) x))
  join flowlane.steps s on s.flow_slug = r.flow_slug and s.step_slug = t.step_slug;
end;
$$;

create or replace function flowlane.complete_task(
  run_id uuid, step_slug text, task_index int, output jsonb, worker_id uuid = null, attempt int = null
) returns setof flowlane.step_tasks
language plpgsql volatile
set search_path = ''
as $$
begin
  return query select * from flowlane._complete_batch(array[row(0, complete_task.run_id, complete_task.step_slug,
    complete_task.task_index, complete_task.output, complete_task.worker_id, complete_task.attempt,
    null, null, null)::flowlane._result_item]);
end;
$$;

create or replace function flowlane._sequential_runs(p_classes flowlane._result_class[], p_enders flowlane._result_class[])
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
   and t.run_id = any (array(select j.run_id from unnest(p_items) j))
  order by i.run_id, i.step_slug, i.task_index, i.pos;
end;
$$;

create or replace function flowlane.fail_task(
  run_id uuid, step_slug text, task_index int, error_message text, worker_id uuid = null, attempt int = null
) returns setof flowlane.step_tasks
language plpgsql volatile
set search_path = ''
as $$
begin
  return query select * from flowlane.fail_task_detailed(fail_task.run_id, fail_task.step_slug,
    fail_task.task_index, fail_task.error_message, fail_task.worker_id, fail_task.attempt);
end;
$$;

create or replace function flowlane.fail_task_detailed(
  run_id uuid, step_slug text, task_index int, error_message text, worker_id uuid = null, attempt int = null,
  error_type text = null, traceback text = null
) returns setof flowlane.step_tasks
language plpgsql volatile
set search_path = ''
as $$
begin
  return query select * from flowlane._fail_batch(array[row(0, fail_task_detailed.run_id,
    fail_task_detailed.step_slug, fail_task_detailed.task_index, null, fail_task_detailed.worker_id,
    fail_task_detailed.attempt, fail_task_detailed.error_message, fail_task_detailed.error_type,
    fail_task_detailed.traceback)::flowlane._result_item]);
end;
$$;

-- 2^attempts overflowed numeric for attempts near 2^31; the delay is capped
-- at 2147483647 s, reached from attempts = 31 on for any base_delay >= 1
create or replace function flowlane.calculate_retry_delay(base_delay int, attempts int) returns int
language plpgsql immutable parallel safe
set search_path = ''
as $$
begin
  return case
    when coalesce(base_delay, 0) <= 0 then 0
    when attempts >= 31 then 2147483647
    else least(floor(base_delay * power(2::numeric, greatest(attempts, 0))), 2147483647)::int
  end;
end;
$$;

-- finished runs that ended before p_now minus their flow's retention (p_older_than seconds,
-- when given, in place of every flow's retention), oldest first within a flow; p_flows
-- narrows to those flows; p_limit null = all
create or replace function flowlane._prunable_runs(p_now timestamptz, p_flows text[], p_older_than int, p_limit int)
returns table (run_id uuid, flow_slug text, ended_at timestamptz)
language plpgsql stable
set search_path = ''
as $$
begin
  return query
  select r.run_id, r.flow_slug, r.ended_at
  from flowlane.flows f
  cross join lateral (
    select p_now - make_interval(secs => coalesce(p_older_than, f.opt_retention)) as cutoff
  ) c
  cross join lateral (
    -- started_at <= ended time, so the index range on started_at holds every candidate
    select r.run_id, r.flow_slug, coalesce(r.completed_at, r.failed_at, r.cancelled_at) as ended_at
    from flowlane.runs r
    where r.flow_slug = f.flow_slug and r.status <> 'started' and r.started_at < c.cutoff
      and coalesce(r.completed_at, r.failed_at, r.cancelled_at) < c.cutoff
    order by r.started_at
    limit p_limit
  ) r
  where c.cutoff is not null and (p_flows is null or f.flow_slug = any (p_flows))
  limit p_limit;
end;
$$;

-- when a run of the flow that begins at p_started has to be finished (null: no deadline)
create or replace function flowlane._run_deadline(p_flow text, p_started timestamptz) returns timestamptz
language plpgsql stable
set search_path = ''
as $$
begin
  return (select p_started + make_interval(secs => f.opt_deadline) from flowlane.flows f where f.flow_slug = p_flow);
end;
$$;

-- when a run has to be finished: a claimed task's handler reads it (ctx.deadline)
create or replace function flowlane.run_deadline(run_id uuid) returns timestamptz
language plpgsql stable
set search_path = ''
as $$
begin
  return (select r.deadline_at from flowlane.runs r where r.run_id = run_deadline.run_id);
end;
$$;
