-- flowlane SQL Core 0006: reliability under load and poison input (docs/reliability.md).
--
-- LOCK ORDER. Every engine function takes row locks in this order, and within
-- one table in key order:
--
--   1. flowlane.runs          (run_id)
--   2. flowlane.step_states   (run_id, step_slug)
--   3. flowlane.step_tasks    (run_id, step_slug, task_index)
--   4. PGMQ message rows      (queue_name, msg_id), through _archive_tasks / _set_tasks_vt
--
-- complete_task / fail_task lock run, step state, task (_lock_task), then
-- children by slug; complete_tasks sorts its batch by (run_id, step_slug,
-- task_index); start_tasks takes its runs FOR SHARE in run_id order before
-- the tasks. Background functions never wait on an engine row lock:
-- requeue_stalled_tasks and extend_leases take run, step state and task
-- with SKIP LOCKED (a row busy elsewhere is handled on the next call).
-- No function takes a lock on a row shared by every writer: enqueueing
-- (pgmq.send / send_batch) only inserts, and the insert notification below
-- updates nothing.
--
-- This migration:
--  1. insert notifications without a hot row (replaces pgmq.enable_notify_insert);
--  2. leases extended by the worker while a result is pending (extend_leases);
--  3. a stall counts as a failed attempt; exhaustion applies when_exhausted;
--     stuck_runs() lists runs that nothing can move;
--  4. limits on run inputs (depth, size), enforced where they enter;
--  5. create_flow serialises concurrent applies of one slug;
--     calculate_retry_delay never overflows.

-- ---------------------------------------------------------------------------
-- 1. insert notifications
-- ---------------------------------------------------------------------------

-- pgmq.enable_notify_insert installs a row trigger that updates one row of
-- pgmq.notify_insert_throttle per queue on every insert: every enqueue
-- (start_flow, complete_task starting dependents) serialised on that row
-- while holding run locks, which deadlocked under load. This trigger is per
-- statement and writes nothing; PostgreSQL folds identical notifications of
-- one transaction into one. Same channel as PGMQ's: pgmq.q_<queue>.INSERT.
create function flowlane._notify_queue_insert() returns trigger
language plpgsql volatile
set search_path = ''
as $$
begin
  perform pg_notify('pgmq.' || tg_table_name || '.INSERT', null);
  return null;
end;
$$;

-- idempotent; true when it installed the trigger. Drops PGMQ's throttled
-- trigger on the queue if present.
create function flowlane.enable_queue_notify(queue_name text) returns boolean
language plpgsql volatile
set search_path = ''
as $$
declare
  v_pgmq text;  -- PGMQ's spelling (PGMQ folds case in table names; an adopted queue may differ)
  v_table text;
begin
  select m.queue_name into v_pgmq from pgmq.meta m
  where lower(m.queue_name) = lower(enable_queue_notify.queue_name)
  order by m.queue_name = enable_queue_notify.queue_name desc, m.queue_name limit 1;
  if not found then
    raise exception 'enable_queue_notify: queue % does not exist', coalesce(quote_literal(queue_name), 'NULL')
      using errcode = '22023';
  end if;
  v_table := pgmq.format_table_name(v_pgmq, 'q');
  -- replicas starting together: one installs the trigger, the others then see it
  perform pg_advisory_xact_lock(hashtext('flowlane.notify_insert'), hashtext(v_table));
  if exists (select 1 from pgmq.list_notify_insert_throttles() t where t.queue_name = v_pgmq) then
    perform pgmq.disable_notify_insert(v_pgmq);
  end if;
  if exists (select 1 from pg_catalog.pg_trigger tg
             where tg.tgrelid = format('pgmq.%I', v_table)::regclass
               and tg.tgname = 'flowlane_notify_insert') then
    return false;
  end if;
  execute format('create trigger flowlane_notify_insert after insert on pgmq.%I '
                 'for each statement execute function flowlane._notify_queue_insert()', v_table);
  return true;
end;
$$;

-- queues that had PGMQ's throttled trigger get flowlane's instead
select flowlane.enable_queue_notify(t.queue_name)
from pgmq.list_notify_insert_throttles() t
order by t.queue_name;

-- ---------------------------------------------------------------------------
-- 2. leases
-- ---------------------------------------------------------------------------

-- the last time the owning worker extended the lease (null: never since the claim)
alter table flowlane.step_tasks add column lease_renewed_at timestamptz;

-- the stall deadline of a started task (0005: after its claim): effective
-- timeout + 30 s after the later of its claim and its last lease extension
create or replace function flowlane._stall_deadline(p_task flowlane.step_tasks, p_timeout int) returns timestamptz
language sql immutable
set search_path = ''
as $$
  select greatest(p_task.started_at, p_task.lease_renewed_at) + make_interval(secs => p_timeout + 30)
$$;

-- called by a worker for the tasks it holds: items {run_id, step_slug,
-- task_index, attempt, running}. A task still owned by this worker and
-- attempt gets lease_renewed_at = now() and its message hidden until the new
-- stall deadline. A running handler's lease is extended only within its
-- timeout (a hung handler is still recovered); a finished handler whose
-- result is not yet committed is always extended. Returns the tasks extended.
create function flowlane.extend_leases(worker_id uuid, tasks jsonb) returns int
language plpgsql volatile
set search_path = ''
as $$
declare
  v_tasks flowlane.step_tasks[];
  v_offsets int[];
begin
  if tasks is null or jsonb_typeof(tasks) <> 'array' then
    raise exception 'extend_leases: tasks must be a JSON array of {run_id, step_slug, task_index, attempt, running}'
      using errcode = '22023';
  end if;
  with items as (
    select (e ->> 'run_id')::uuid as run_id, e ->> 'step_slug' as step_slug,
           (e ->> 'task_index')::int as task_index, (e ->> 'attempt')::int as attempt,
           coalesce((e ->> 'running')::boolean, false) as running
    from jsonb_array_elements(tasks) e
  ), locked as (
    select t.run_id, t.step_slug, t.task_index, coalesce(s.opt_timeout, f.opt_timeout) as timeout
    from flowlane.step_tasks t
    join items i on i.run_id = t.run_id and i.step_slug = t.step_slug and i.task_index = t.task_index
    join flowlane.steps s on s.flow_slug = t.flow_slug and s.step_slug = t.step_slug
    join flowlane.flows f on f.flow_slug = t.flow_slug
    where t.status = 'started' and t.last_worker_id = extend_leases.worker_id
      and t.attempts_count = i.attempt
      and (not i.running or now() < t.started_at + make_interval(secs => coalesce(s.opt_timeout, f.opt_timeout)))
    order by t.run_id, t.step_slug, t.task_index
    for update of t skip locked
  ), renewed as (
    update flowlane.step_tasks t set lease_renewed_at = now()
      from locked l
     where t.run_id = l.run_id and t.step_slug = l.step_slug and t.task_index = l.task_index
    returning t, l.timeout
  )
  select coalesce(array_agg(r.t), '{}'), coalesce(array_agg(r.timeout + 30), '{}')
    into v_tasks, v_offsets from renewed r;
  perform flowlane._set_tasks_vt(v_tasks, v_offsets);
  return cardinality(v_tasks);
end;
$$;

-- ---------------------------------------------------------------------------
-- 3. stalls are failed attempts
-- ---------------------------------------------------------------------------

-- a task out of attempts: failed, message archived, when_exhausted applied
-- (the same outcome as fail_task's last attempt). Caller holds the run,
-- step state and task locks.
create function flowlane._exhaust_task(p_task flowlane.step_tasks, p_error text) returns void
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
      format('step %s task %s failed after %s attempts: %s', v_task.step_slug, v_task.task_index,
             v_task.attempts_count, p_error));
  elsif v_mode = 'skip-cascade' then
    perform flowlane._skip_cascade(v_task.run_id, v_task.step_slug, 'handler_failed');
    perform flowlane._progress(v_task.run_id);
  else
    perform flowlane._skip_step(v_task.run_id, v_task.step_slug, 'handler_failed');
    perform flowlane._progress(v_task.run_id);
  end if;
end;
$$;

-- a started task past its stall deadline consumed an attempt (counted at its
-- claim): with attempts left it is queued again and its message made visible
-- now; out of attempts it fails with "no result within N s, K attempts" and
-- when_exhausted applies. Returns the number of stalled tasks handled.
create or replace function flowlane.requeue_stalled_tasks() returns int
language plpgsql volatile
set search_path = ''
as $$
declare
  v_cand record;
  v_task flowlane.step_tasks;
  v_requeued flowlane.step_tasks[] := '{}';
  v_handled int := 0;
begin
  for v_cand in
    select t.run_id, t.step_slug, t.task_index, coalesce(s.opt_timeout, f.opt_timeout) as timeout,
           coalesce(s.opt_max_attempts, f.opt_max_attempts) as max_attempts
    from flowlane.step_tasks t
    join flowlane.steps s on s.flow_slug = t.flow_slug and s.step_slug = t.step_slug
    join flowlane.flows f on f.flow_slug = t.flow_slug
    where t.status = 'started'
      and t.started_at < now() - make_interval(secs => coalesce(s.opt_timeout, f.opt_timeout) + 30)
      and flowlane._stall_deadline(t, coalesce(s.opt_timeout, f.opt_timeout)) < now()
    order by t.run_id, t.step_slug, t.task_index
  loop
    -- lock order run -> step state -> task; skip what another transaction holds
    perform 1 from flowlane.runs r where r.run_id = v_cand.run_id and r.status = 'started'
      for update skip locked;
    continue when not found;
    perform 1 from flowlane.step_states ss
      where ss.run_id = v_cand.run_id and ss.step_slug = v_cand.step_slug and ss.status = 'started'
      for update skip locked;
    continue when not found;
    select * into v_task from flowlane.step_tasks t
     where t.run_id = v_cand.run_id and t.step_slug = v_cand.step_slug and t.task_index = v_cand.task_index
       and t.status = 'started' and flowlane._stall_deadline(t, v_cand.timeout) < now()
       for update skip locked;
    continue when not found;
    v_handled := v_handled + 1;
    if v_task.attempts_count >= v_cand.max_attempts then
      perform flowlane._exhaust_task(v_task,
        format('no result within %s s, %s attempts', v_cand.timeout, v_task.attempts_count));
    else
      update flowlane.step_tasks t
         set status = 'queued', started_at = null, last_worker_id = null, lease_renewed_at = null,
             requeued_count = t.requeued_count + 1, last_requeued_at = now(),
             error_message = format('no result within %s s (attempt %s)', v_cand.timeout, v_task.attempts_count)
       where t.run_id = v_task.run_id and t.step_slug = v_task.step_slug and t.task_index = v_task.task_index
      returning * into v_task;
      v_requeued := v_requeued || v_task;
    end if;
  end loop;
  perform flowlane._set_tasks_vt(v_requeued, array_fill(0, array[cardinality(v_requeued)]));
  return v_handled;
end;
$$;

-- runs that are started but have no task that can move them: every started
-- run needs a queued task (visible, delayed or retry-delayed) or a started
-- (leased) task whose message is still on its queue
create function flowlane.stuck_runs()
returns table (run_id uuid, flow_slug text, started_at timestamptz, reason text)
language plpgsql stable
set search_path = ''
as $$
declare
  v_queue record;
  v_ids bigint[];
  v_live_queues text[] := '{}';
  v_live_ids bigint[] := '{}';
begin
  for v_queue in
    select t.queue_name, array_agg(t.message_id) as ids
    from flowlane.step_tasks t join flowlane.runs r on r.run_id = t.run_id
    where r.status = 'started' and t.status in ('queued', 'started')
    group by t.queue_name order by t.queue_name
  loop
    execute format('select coalesce(array_agg(m.msg_id), ''{}'') from pgmq.%I m where m.msg_id = any($1)',
                   pgmq.format_table_name(v_queue.queue_name, 'q'))
      into v_ids using v_queue.ids;
    v_live_queues := v_live_queues || array_fill(v_queue.queue_name, array[cardinality(v_ids)]);
    v_live_ids := v_live_ids || v_ids;
  end loop;
  return query
    select r.run_id, r.flow_slug, r.started_at,
           case when exists (select 1 from flowlane.step_tasks t
                             where t.run_id = r.run_id and t.status in ('queued', 'started'))
                then 'its queued and started tasks have no message on their queue'
                else 'no queued or started task' end
    from flowlane.runs r
    where r.status = 'started'
      and not exists (
        select 1 from flowlane.step_tasks t
        join unnest(v_live_queues, v_live_ids) as l(queue_name, msg_id)
          on l.queue_name = t.queue_name and l.msg_id = t.message_id
        where t.run_id = r.run_id and t.status in ('queued', 'started'))
    order by r.started_at, r.run_id;
end;
$$;

-- tasks that 0001-0005 marked permanently stalled are started with no
-- message: their runs were stuck. They are out of attempts by now.
do $$
declare
  v_task flowlane.step_tasks;
begin
  for v_task in
    select t.* from flowlane.step_tasks t
    join flowlane.runs r on r.run_id = t.run_id and r.status = 'started'
    where t.status = 'started' and t.permanently_stalled_at is not null
    order by t.run_id, t.step_slug, t.task_index
  loop
    perform 1 from flowlane.runs r where r.run_id = v_task.run_id and r.status = 'started' for update;
    continue when not found;
    perform flowlane._exhaust_task(v_task,
      format('no result within %s s, %s attempts (marked permanently stalled before 0006)',
             flowlane._effective_timeout(v_task.flow_slug, v_task.step_slug), v_task.attempts_count));
  end loop;
end;
$$;

-- ---------------------------------------------------------------------------
-- 4. limits on JSON entering the engine (the worker checks outputs with the
-- same numbers: flowlane/runtime/limits.py, parity test in tests/core)
-- ---------------------------------------------------------------------------

create function flowlane.json_limits() returns jsonb
language sql immutable parallel safe
set search_path = ''
as $$ select '{"max_depth": 100, "max_bytes": 67108864}'::jsonb $$;

-- depth: a scalar is 0, [] and {} are 1, [[1]] is 2
create function flowlane.json_depth_exceeds(value jsonb, max_depth int) returns boolean
language sql immutable parallel safe
set search_path = ''
as $$
  with recursive walk(v, depth) as (
    select value, 1 where jsonb_typeof(value) in ('array', 'object')
    union all
    select c.v, w.depth + 1
    from walk w
    cross join lateral (
      select e as v from jsonb_array_elements(case when jsonb_typeof(w.v) = 'array' then w.v else '[]' end) e
      union all
      select o.value from jsonb_each(case when jsonb_typeof(w.v) = 'object' then w.v else '{}' end) o
    ) c
    where jsonb_typeof(c.v) in ('array', 'object') and w.depth <= max_depth
  )
  select exists (select 1 from walk where depth > max_depth)
$$;

create function flowlane._check_run_input() returns trigger
language plpgsql volatile
set search_path = ''
as $$
declare
  v_max_depth int := (flowlane.json_limits() ->> 'max_depth')::int;
  v_max_bytes int := (flowlane.json_limits() ->> 'max_bytes')::int;
  v_bytes int := octet_length(new.input::text);
begin
  if v_bytes > v_max_bytes then
    raise exception 'start_flow(%): the run input is % bytes of JSON, more than the limit of % bytes',
      new.flow_slug, v_bytes, v_max_bytes
      using errcode = '22023', hint = 'pass a reference (a URL, a storage key) instead of the data itself';
  end if;
  if flowlane.json_depth_exceeds(new.input, v_max_depth) then
    raise exception 'start_flow(%): the run input is nested deeper than % levels', new.flow_slug, v_max_depth
      using errcode = '22023', hint = 'flatten the input; workers refuse JSON nested deeper than the limit';
  end if;
  return new;
end;
$$;

create trigger runs_input_limits before insert on flowlane.runs
for each row execute function flowlane._check_run_input();

-- ---------------------------------------------------------------------------
-- 5. definitions and arithmetic
-- ---------------------------------------------------------------------------

-- two transactions applying the same flow file raced between the existence
-- check and the insert and one failed on flows_slug_ci_unique; the lock on
-- the lowercase slug makes the second wait and then find the first's rows
create or replace function flowlane.create_flow(
  flow_slug text,
  max_attempts int = null,
  base_delay int = null,
  timeout int = null,
  queue_mode text = 'flow'
) returns flowlane.flows
language plpgsql volatile
set search_path = ''
as $$
declare
  v_flow flowlane.flows;
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
  perform pg_advisory_xact_lock(hashtext('flowlane.flow'), hashtext(lower(create_flow.flow_slug)));
  select f.flow_slug into v_other from flowlane.flows f
  where lower(f.flow_slug) = lower(create_flow.flow_slug) and f.flow_slug <> create_flow.flow_slug;
  if found then
    raise exception 'flow slug "%" conflicts with existing flow "%" (flow slugs are unique case-insensitively)',
      create_flow.flow_slug, v_other using errcode = '23505';
  end if;
  select * into v_flow from flowlane.flows f where f.flow_slug = create_flow.flow_slug for update;
  if found and v_flow.queue_mode <> v_mode then
    raise exception 'FLOWLANE_SHAPE_MISMATCH: flow "%" exists with queue_mode %, not %',
      create_flow.flow_slug, v_flow.queue_mode, v_mode
      using errcode = '23514',
            hint = 'the queue mode is part of the flow''s shape; create a new flow version (a new slug)';
  end if;
  insert into flowlane.flows as f (flow_slug, opt_max_attempts, opt_base_delay, opt_timeout, queue_mode)
  values (create_flow.flow_slug, coalesce(max_attempts, 3), coalesce(base_delay, 5), coalesce(timeout, 60), v_mode)
  on conflict on constraint flows_pkey do update
    set opt_max_attempts = excluded.opt_max_attempts,
        opt_base_delay = excluded.opt_base_delay,
        opt_timeout = excluded.opt_timeout
  returning * into v_flow;
  return v_flow;
end;
$$;

-- 2^attempts overflowed numeric for attempts near 2^31; the delay is capped
-- at 2147483647 s, reached from attempts = 31 on for any base_delay >= 1
create or replace function flowlane.calculate_retry_delay(base_delay int, attempts int) returns int
language sql immutable parallel safe
set search_path = ''
as $$
  select case
    when coalesce(base_delay, 0) <= 0 then 0
    when attempts >= 31 then 2147483647
    else least(floor(base_delay * power(2::numeric, greatest(attempts, 0))), 2147483647)::int
  end
$$;
