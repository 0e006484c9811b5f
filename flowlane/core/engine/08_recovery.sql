-- Recovery and run operations: stalled tasks, runs that nothing can move, cancelling and
-- retrying a run.

-- stalled recovery: the candidates are the started tasks (step_tasks_started_idx), then each
-- is locked run -> step state -> task, skipping what another transaction holds, and checked again
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
    select t.run_id, t.step_slug, t.task_index, o.timeout, o.max_attempts, o.stall_after,
           t.step_started_at is not null as in_task
    from flowlane.step_tasks t
    join flowlane.step_options o on o.flow_slug = t.flow_slug and o.step_slug = t.step_slug
    where t.status = 'started'
      and flowlane._stall_deadline(t, o.stall_after) < flowlane._now()
    order by t.run_id, t.step_slug, t.task_index
  loop
    -- lock order run -> step state -> task; skip what another transaction holds
    perform 1 from flowlane.runs r where r.run_id = v_cand.run_id and r.status = 'started'
      for update skip locked;
    continue when not found;
    -- (a step without a step_states row: its task holds its state, and its lock is the task's)
    perform 1 from flowlane.step_states ss
      where ss.run_id = v_cand.run_id and ss.step_slug = v_cand.step_slug and ss.status = 'started'
      for update skip locked;
    continue when not found and not v_cand.in_task;
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
  v_run := flowlane._lock_run_to_retry(retry_run.run_id, array['failed']);
  perform flowlane._reopen_failed_steps(v_run.run_id);
  return flowlane._restart_run(v_run);
end;
$$;

-- rerun a failed or completed run from a step: the step and every step that depends on it,
-- transitively, run again from the beginning (map steps with all their tasks), with the
-- outputs of the other steps kept; on a failed run the failed steps are retried as
-- retry_run does. The completed tasks of the rerun steps stay in the attempt history
-- (outcome 'superseded', with their output), as do all their earlier attempts. A wait
-- step rerun completes again with the signal it received; a child-flow step is not rerun
-- (its child runs are runs of their own: retry them), so a rerun that would include one is
-- refused, as is a completed child run while its parent runs. The run waits for its flow's
-- concurrency limit like a retried one.
create function flowlane.retry_run_from(run_id uuid, step_slug text) returns flowlane.runs
language plpgsql volatile
set search_path = ''
as $$
declare
  v_run flowlane.runs;
  v_steps text[];
  v_child text;
begin
  v_run := flowlane._lock_run_to_retry(retry_run_from.run_id, array['failed', 'completed']);
  if not exists (select 1 from flowlane.steps s
                 where s.flow_slug = v_run.flow_slug and s.step_slug = retry_run_from.step_slug) then
    raise exception 'flow % of run % has no step %', v_run.flow_slug, v_run.run_id,
      quote_literal(retry_run_from.step_slug) using errcode = '22023';
  end if;
  if v_run.status = 'completed' and exists (select 1 from flowlane.runs p
                                            where p.run_id = v_run.parent_run_id and p.status in ('started', 'waiting')) then
    -- its parent's step has counted its output already
    raise exception 'run % is a child run whose parent run % is still running: it cannot be rerun now',
      v_run.run_id, v_run.parent_run_id using errcode = '55000',
      hint = 'rerun it once the parent run has ended, or rerun the parent from its child-flow step''s dependents';
  end if;
  v_steps := flowlane._dependents(v_run.flow_slug, retry_run_from.step_slug);
  select s.step_slug into v_child from flowlane.steps s
  where s.flow_slug = v_run.flow_slug and s.step_slug = any (v_steps) and s.child_flow is not null
  order by s.step_index limit 1;
  if found then
    raise exception 'run % cannot be rerun from step %: step % starts child runs, which are not rerun',
      v_run.run_id, retry_run_from.step_slug, v_child using errcode = '55000',
      hint = 'retry the child runs themselves, or rerun from a step after it';
  end if;
  perform 1 from flowlane.step_states ss where ss.run_id = v_run.run_id order by ss.step_slug for update;
  perform flowlane._forget_cached(v_run.run_id, v_steps);  -- (23_cache.sql)
  perform flowlane._reset_steps(v_run, v_steps);
  if v_run.status = 'failed' then
    perform flowlane._reopen_failed_steps(v_run.run_id);
  end if;
  perform flowlane._count_what_remains(v_run.run_id, v_steps);
  return flowlane._restart_run(v_run);
end;
$$;

-- a run locked for a retry, refused unless it is in one of the given states
create function flowlane._lock_run_to_retry(p_run_id uuid, p_states text[]) returns flowlane.runs
language plpgsql volatile
set search_path = ''
as $$
declare
  v_run flowlane.runs;
begin
  select * into v_run from flowlane.runs r where r.run_id = p_run_id for update;
  if not found then
    raise exception 'no run %', p_run_id using errcode = 'P0002';
  end if;
  if v_run.status <> all (p_states) then
    raise exception 'run % is %: only a % run can be retried', v_run.run_id, v_run.status,
      array_to_string(p_states, ' or ') using errcode = '55000';
  end if;
  if v_run.compensation is not null then
    raise exception 'run % has been compensated (compensation %): it is not retried', v_run.run_id,
      v_run.compensation using errcode = '55000',
      hint = 'start a new run; a stopped compensation resumes with flowlane.retry_compensation(run_id)';
  end if;
  perform flowlane._unfold_step_states(v_run.run_id);  -- a retry resets and restarts step_states rows
  return v_run;
end;
$$;

-- a step and every step that depends on it, transitively
create function flowlane._dependents(p_flow text, p_step text) returns text[]
language sql stable
set search_path = ''
as $$
  with recursive down(step_slug) as (
    select p_step
    union
    select d.step_slug from flowlane.deps d join down on d.dep_slug = down.step_slug
    where d.flow_slug = p_flow
  )
  select array_agg(down.step_slug order by down.step_slug) from down
$$;

-- the given steps of a locked run start again from nothing: their completed tasks are kept
-- in the attempt history as superseded, their tasks and held tasks go, a wait step's signal
-- is kept to complete it again, and each step is as a new run makes it (a map step over a
-- kept step's output gets its size from that output)
create function flowlane._reset_steps(p_run flowlane.runs, p_steps text[]) returns void
language plpgsql volatile
set search_path = ''
as $$
begin
  insert into flowlane.task_attempts
    (run_id, step_slug, task_index, attempt, retry_round, outcome, worker_id, output, failed_at)
  select t.run_id, t.step_slug, t.task_index, greatest(t.attempts_count, 1), p_run.retry_count, 'superseded',
         t.last_worker_id, t.output, t.completed_at
  from flowlane.step_tasks t
  join flowlane.steps s on s.flow_slug = t.flow_slug and s.step_slug = t.step_slug
  where t.run_id = p_run.run_id and t.step_slug = any (p_steps) and t.status = 'completed'
  order by s.step_index, t.task_index;
  delete from flowlane.held_tasks h where h.run_id = p_run.run_id and h.step_slug = any (p_steps);
  delete from flowlane.step_tasks t where t.run_id = p_run.run_id and t.step_slug = any (p_steps);
  update flowlane.signals g set applied_at = null
   where g.run_id = p_run.run_id and g.step_slug = any (p_steps);
  update flowlane.step_states ss
     set status = 'created', output = null, error_message = null, skip_reason = null, started_at = null,
         completed_at = null, failed_at = null, skipped_at = null, cancelled_at = null, remaining_tasks = null,
         initial_tasks = case when s.step_type <> 'map' then 1
                              when s.deps_count = 0 and jsonb_typeof(p_run.input) = 'array'
                                then jsonb_array_length(p_run.input) end
    from flowlane.steps s
   where ss.run_id = p_run.run_id and ss.step_slug = any (p_steps)
     and s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug;
  update flowlane.step_states ss
     set initial_tasks = case when ps.status = 'skipped' then 0 else jsonb_array_length(ps.output) end
    from flowlane.steps s, flowlane.deps d, flowlane.step_states ps
   where ss.run_id = p_run.run_id and ss.step_slug = any (p_steps)
     and s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug and s.step_type = 'map'
     and d.flow_slug = s.flow_slug and d.step_slug = s.step_slug
     and ps.run_id = ss.run_id and ps.step_slug = d.dep_slug
     and (ps.status = 'skipped' or (ps.status = 'completed' and jsonb_typeof(ps.output) = 'array'));
end;
$$;

-- the reset steps wait for their needs that have not completed (or been skipped), and the
-- run for each step that has not
create function flowlane._count_what_remains(p_run_id uuid, p_steps text[]) returns void
language sql volatile
set search_path = ''
as $$
  update flowlane.step_states ss
     set remaining_deps = (select count(*) from flowlane.deps d
                           join flowlane.step_states ps on ps.run_id = ss.run_id and ps.step_slug = d.dep_slug
                           where d.flow_slug = ss.flow_slug and d.step_slug = ss.step_slug
                             and ps.status not in ('completed', 'skipped'))
   where ss.run_id = p_run_id and ss.step_slug = any (p_steps);
  update flowlane.runs r
     set remaining_steps = (select count(*) from flowlane.step_states ss
                            where ss.run_id = r.run_id and ss.status not in ('completed', 'skipped'))
   where r.run_id = p_run_id;
$$;

-- the steps of a locked failed run that its failure ended start over (retry_run)
create function flowlane._reopen_failed_steps(p_run_id uuid) returns void
language plpgsql volatile
set search_path = ''
as $$
begin
  perform 1 from flowlane.step_states ss where ss.run_id = p_run_id order by ss.step_slug for update;

  -- steps the failure ended before they began wait for their needs again
  update flowlane.step_states ss
     set status = 'created', cancelled_at = null
   where ss.run_id = p_run_id and ss.status = 'cancelled' and ss.started_at is null;

  update flowlane.step_states ss
     set status = 'created', failed_at = null, error_message = null, remaining_tasks = null
   where ss.run_id = p_run_id and ss.status = 'failed'
     and not exists (select 1 from flowlane.step_tasks t
                     where t.run_id = ss.run_id and t.step_slug = ss.step_slug);
  perform flowlane._reopen_waits(p_run_id);
  delete from flowlane.held_tasks h where h.run_id = p_run_id;  -- held again when their steps restart
  -- unfinished tasks are replaced by fresh ones (a message id is an immutable identity);
  -- their attempts stay in flowlane.task_attempts
  delete from flowlane.step_tasks t
   using flowlane.step_states ss
   where t.run_id = p_run_id and ss.run_id = t.run_id and ss.step_slug = t.step_slug
     and ss.status in ('failed', 'started', 'cancelled') and t.status in ('failed', 'cancelled');
  update flowlane.step_states ss
     set status = 'started', failed_at = null, cancelled_at = null, error_message = null,
         started_at = coalesce(ss.started_at, flowlane._now()),
         remaining_tasks = ss.initial_tasks - (select count(*) from flowlane.step_tasks t
                                               where t.run_id = ss.run_id and t.step_slug = ss.step_slug
                                                 and t.status = 'completed')
   where ss.run_id = p_run_id and ss.status in ('failed', 'started', 'cancelled');
end;
$$;

-- a locked run whose steps were reopened starts again with a fresh deadline, or waits for its
-- key on a flow with a concurrency limit (its tasks are sent when it begins, _begin_held_runs)
create function flowlane._restart_run(p_run flowlane.runs) returns flowlane.runs
language plpgsql volatile
set search_path = ''
as $$
declare
  v_run flowlane.runs;
begin
  if p_run.concurrency_key is not null then
    update flowlane.runs r
       set status = 'waiting', failed_at = null, completed_at = null, output = null, error_message = null,
           deadline_at = null, retry_count = r.retry_count + 1, retried_at = flowlane._now(),
           hold_seq = nextval('flowlane.hold_seq')
     where r.run_id = p_run.run_id;
    perform flowlane._begin_new_held_runs(array[p_run.run_id]);
    select * into v_run from flowlane.runs r where r.run_id = p_run.run_id;
    return v_run;
  end if;
  update flowlane.runs r
     set status = 'started', failed_at = null, completed_at = null, output = null, error_message = null,
         retry_count = r.retry_count + 1, retried_at = flowlane._now(),
         deadline_at = flowlane._run_deadline(r.flow_slug, flowlane._now())  -- a fresh deadline from the retry
   where r.run_id = p_run.run_id;
  -- one send_batch per queue, tasks in step order (held for their slot on a limited step)
  perform flowlane._send_missing_tasks(p_run.run_id);
  perform flowlane._progress(p_run.run_id);
  select * into v_run from flowlane.runs r where r.run_id = p_run.run_id;
  return v_run;
end;
$$;

-- many runs at once (`flowlane retry|cancel` with a filter), one bounded batch per call and
-- transaction: each run is locked in id order and retried, or cancelled, if it is still in
-- a state that allows it (a run that changed since it was chosen is passed over); returns
-- the runs it changed
create function flowlane.retry_runs(run_ids uuid[]) returns setof uuid
language plpgsql volatile
set search_path = ''
as $$
declare
  v_id uuid;
begin
  perform flowlane._check_batch('retry_runs', run_ids);
  for v_id in
    select r.run_id from flowlane.runs r where r.run_id = any (run_ids) order by r.run_id for update
  loop
    continue when (select r.status <> 'failed' or r.compensation is not null
                   from flowlane.runs r where r.run_id = v_id);
    perform flowlane.retry_run(v_id);
    return next v_id;
  end loop;
end;
$$;

create function flowlane.cancel_runs(run_ids uuid[], reason text = null) returns setof uuid
language plpgsql volatile
set search_path = ''
as $$
declare
  v_id uuid;
begin
  perform flowlane._check_batch('cancel_runs', run_ids);
  for v_id in
    select r.run_id from flowlane.runs r where r.run_id = any (run_ids) order by r.run_id for update
  loop
    continue when (select r.status from flowlane.runs r where r.run_id = v_id) not in ('started', 'waiting');
    perform flowlane.cancel_run(v_id, reason);
    return next v_id;
  end loop;
end;
$$;

-- a batch is bounded: the locks of its runs are held until its transaction commits
create function flowlane._check_batch(p_function text, p_run_ids uuid[]) returns void
language plpgsql immutable
set search_path = ''
as $$
begin
  if cardinality(p_run_ids) > 1000 then
    raise exception '%: at most 1000 runs a call, got %', p_function, cardinality(p_run_ids)
      using errcode = '22023', hint = 'pass the runs in batches, one transaction each';
  end if;
end;
$$;
