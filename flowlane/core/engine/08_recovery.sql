-- Recovery and run operations: stalled tasks, runs that nothing can move, cancelling and
-- retrying a run.

-- stalled recovery: the candidates are taken from the leases (task_leases), then each is
-- locked run -> step state -> task, skipping what another transaction holds, and checked again
create function flowlane.requeue_stalled_tasks() returns int
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
    select t.run_id, t.step_slug, t.task_index, o.timeout, o.max_attempts, o.stall_after
    from flowlane.task_leases l
    join flowlane.step_tasks t on t.run_id = l.run_id and t.step_slug = l.step_slug and t.task_index = l.task_index
    join flowlane.step_options o on o.flow_slug = t.flow_slug and o.step_slug = t.step_slug
    where l.started_at < flowlane._now() - make_interval(secs => o.stall_after)  -- the leases' index
      and t.status = 'started'
      and flowlane._stall_deadline(t, o.stall_after) < flowlane._now()
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
       and t.status = 'started' and flowlane._stall_deadline(t, v_cand.stall_after) < flowlane._now()
       for update skip locked;
    continue when not found;
    v_handled := v_handled + 1;
    if v_task.attempts_count >= v_cand.max_attempts then
      perform flowlane._exhaust_task(v_task,
        format('no result within %s s, %s attempts', v_cand.timeout, v_task.attempts_count));
    else
      update flowlane.step_tasks t
         set status = 'queued', started_at = null, last_worker_id = null, lease_renewed_at = null,
             requeued_count = t.requeued_count + 1, last_requeued_at = flowlane._now(),
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
-- run needs a queued task (visible, delayed or retry-delayed), a started
-- (leased) task whose message is still on its queue, or a held task
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
      and not flowlane._waits_outside_queues(r.run_id)
      -- a task held for its step's concurrency is sent when a task of its key ends
      and not exists (select 1 from flowlane.held_tasks h where h.run_id = r.run_id)
      and not exists (
        select 1 from flowlane.step_tasks t
        join unnest(v_live_queues, v_live_ids) as l(queue_name, msg_id)
          on l.queue_name = t.queue_name and l.msg_id = t.message_id
        where t.run_id = r.run_id and t.status in ('queued', 'started'))
    order by r.started_at, r.run_id;
end;
$$;

-- cancel a started (or waiting) run: its unfinished tasks and steps are cancelled and the
-- tasks' messages archived; later completions of those tasks are rejected (they are
-- terminal) and no further step starts. Cancelling a cancelled run returns it.
create function flowlane.cancel_run(run_id uuid, reason text = null) returns flowlane.runs
language plpgsql volatile
set search_path = ''
as $$
declare
  v_run flowlane.runs;
  v_tasks flowlane.step_tasks[];
begin
  select * into v_run from flowlane.runs r where r.run_id = cancel_run.run_id for update;
  if not found then
    raise exception 'no run %', cancel_run.run_id using errcode = 'P0002';
  end if;
  if v_run.status = 'cancelled' then
    return v_run;
  end if;
  if v_run.status not in ('started', 'waiting') then
    raise exception 'run % is already %: only a started or waiting run can be cancelled', v_run.run_id, v_run.status
      using errcode = '55000';
  end if;
  update flowlane.runs r
     set status = 'cancelled', cancelled_at = greatest(flowlane._now(), r.started_at),
         cancel_reason = left(coalesce(nullif(btrim(reason), ''), 'cancelled'), 1000)
   where r.run_id = v_run.run_id
  returning * into v_run;
  with cancelled as (
    update flowlane.step_tasks t set status = 'cancelled', cancelled_at = greatest(flowlane._now(), t.queued_at)
     where t.run_id = v_run.run_id and t.status in ('queued', 'started')
    returning t
  ) select coalesce(array_agg(c.t), '{}') into v_tasks from cancelled c;
  perform flowlane._archive_tasks(v_tasks);
  perform flowlane._end_unfinished_steps(v_run.run_id);
  return v_run;
end;
$$;

-- resume a failed run: failed steps (and steps the failure ended after they
-- started) start over with a fresh attempt budget; completed
-- steps and completed map tasks keep their outputs. A failed step that never
-- had tasks (a when_unmet = fail condition) is evaluated again, and steps the
-- failure ended before they began wait for their needs again.
create function flowlane.retry_run(run_id uuid) returns flowlane.runs
language plpgsql volatile
set search_path = ''
as $$
declare
  v_run flowlane.runs;
begin
  select * into v_run from flowlane.runs r where r.run_id = retry_run.run_id for update;
  if not found then
    raise exception 'no run %', retry_run.run_id using errcode = 'P0002';
  end if;
  if v_run.status <> 'failed' then
    raise exception 'run % is %: only a failed run can be retried', v_run.run_id, v_run.status
      using errcode = '55000';
  end if;
  perform 1 from flowlane.step_states ss where ss.run_id = v_run.run_id order by ss.step_slug for update;

  -- steps the failure ended before they began wait for their needs again
  update flowlane.step_states ss
     set status = 'created', cancelled_at = null
   where ss.run_id = v_run.run_id and ss.status = 'cancelled' and ss.started_at is null;

  update flowlane.step_states ss
     set status = 'created', failed_at = null, error_message = null, remaining_tasks = null
   where ss.run_id = v_run.run_id and ss.status = 'failed'
     and not exists (select 1 from flowlane.step_tasks t
                     where t.run_id = ss.run_id and t.step_slug = ss.step_slug);
  perform flowlane._reopen_waits(v_run.run_id);
  delete from flowlane.held_tasks h where h.run_id = v_run.run_id;  -- held again when their steps restart
  -- unfinished tasks are replaced by fresh ones (a message id is an immutable identity);
  -- their attempts stay in flowlane.task_attempts
  delete from flowlane.step_tasks t
   using flowlane.step_states ss
   where t.run_id = v_run.run_id and ss.run_id = t.run_id and ss.step_slug = t.step_slug
     and ss.status in ('failed', 'started', 'cancelled') and t.status in ('failed', 'cancelled');
  update flowlane.step_states ss
     set status = 'started', failed_at = null, cancelled_at = null, error_message = null,
         started_at = coalesce(ss.started_at, flowlane._now()),
         remaining_tasks = ss.initial_tasks - (select count(*) from flowlane.step_tasks t
                                               where t.run_id = ss.run_id and t.step_slug = ss.step_slug
                                                 and t.status = 'completed')
   where ss.run_id = v_run.run_id and ss.status in ('failed', 'started', 'cancelled');
  if v_run.concurrency_key is not null then
    -- a flow with a concurrency limit: the retried run waits for its key like a new one
    -- (its tasks are sent when it begins, _begin_held_runs)
    update flowlane.runs r
       set status = 'waiting', failed_at = null, error_message = null, deadline_at = null,
           retry_count = r.retry_count + 1, retried_at = flowlane._now(), hold_seq = nextval('flowlane.hold_seq')
     where r.run_id = v_run.run_id;
    perform flowlane._begin_new_held_runs(array[v_run.run_id]);
    select * into v_run from flowlane.runs r where r.run_id = v_run.run_id;
    return v_run;
  end if;
  update flowlane.runs r
     set status = 'started', failed_at = null, error_message = null,
         retry_count = r.retry_count + 1, retried_at = flowlane._now(),
         deadline_at = flowlane._run_deadline(r.flow_slug, flowlane._now())  -- a fresh deadline from the retry
   where r.run_id = v_run.run_id;
  -- one send_batch per queue, tasks in step order (held for their slot on a limited step)
  perform flowlane._send_missing_tasks(v_run.run_id);
  perform flowlane._progress(v_run.run_id);
  select * into v_run from flowlane.runs r where r.run_id = v_run.run_id;
  return v_run;
end;
$$;
