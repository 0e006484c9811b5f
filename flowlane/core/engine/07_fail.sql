-- Failing tasks: retry with backoff on the task's queue, or exhaust the task and apply
-- when_exhausted; every attempt is recorded.

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

create function flowlane.fail_task(
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

create function flowlane.fail_task_detailed(
  run_id uuid, step_slug text, task_index int, error_message text, worker_id uuid = null, attempt int = null,
  error_type text = null, traceback text = null
) returns setof flowlane.step_tasks
language plpgsql volatile
set search_path = ''
as $$
begin
  perform flowlane._require_claim('fail_task', fail_task_detailed.worker_id, fail_task_detailed.attempt);
  return query select * from flowlane._fail_batch(array[row(0, fail_task_detailed.run_id,
    fail_task_detailed.step_slug, fail_task_detailed.task_index, null, fail_task_detailed.worker_id,
    fail_task_detailed.attempt, fail_task_detailed.error_message, fail_task_detailed.error_type,
    fail_task_detailed.traceback)::flowlane._result_item]);
end;
$$;

create function flowlane._fail_batch(p_items flowlane._result_item[])
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
  where c.actionable and not flowlane._retries((c.task).attempts_count, o.max_attempts, (c.item).error_type);

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
create function flowlane._fail_one(p_item flowlane._result_item) returns flowlane.step_tasks
language plpgsql volatile
set search_path = ''
set plan_cache_mode = force_generic_plan
as $$
declare
  v_task flowlane.step_tasks := flowlane._lock_one(p_item);
  v_base_delay int;
  v_max_attempts int;
begin
  if v_task.run_id is null then
    return null;
  end if;
  select o.base_delay, o.max_attempts into v_base_delay, v_max_attempts from flowlane.step_options o
  where o.flow_slug = v_task.flow_slug and o.step_slug = v_task.step_slug;
  if not flowlane._retries(v_task.attempts_count, v_max_attempts, p_item.error_type) then
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
    perform flowlane._queue_set_vt(flowlane._task_queue(v_task), array[v_task.message_id],
                                   flowlane.calculate_retry_delay(v_base_delay, v_task.attempts_count));
  end if;
  return v_task;
end;
$$;

-- a failed attempt is retried while the task has attempts left; a wrong output is a bug in
-- the handler, not a hiccup: never retried (both result paths, _fail_batch and _fail_one)
create function flowlane._retries(p_attempts int, p_max_attempts int, p_error_type text) returns boolean
language plpgsql immutable
set search_path = ''
as $$
begin
  return coalesce(p_attempts < p_max_attempts, false) and p_error_type is distinct from 'OutputContractViolation';
end;
$$;

-- 2^attempts overflowed numeric for attempts near 2^31; the delay is capped
-- at 2147483647 s, reached from attempts = 31 on for any base_delay >= 1
create function flowlane.calculate_retry_delay(base_delay int, attempts int) returns int
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

-- a task out of attempts (fail_tasks or stalled recovery): failed, message
-- archived, when_exhausted applied. Caller holds the run, step state and task locks.
create function flowlane._exhaust_task(p_task flowlane.step_tasks, p_error text) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_task flowlane.step_tasks;
  v_mode text;
begin
  perform flowlane._unfold_step_states(p_task.run_id);
  update flowlane.step_tasks t
     set status = 'failed', failed_at = flowlane._now(), error_message = p_error
   where t.run_id = p_task.run_id and t.step_slug = p_task.step_slug and t.task_index = p_task.task_index
  returning * into v_task;
  perform flowlane._archive_tasks(array[v_task]);
  select s.when_exhausted into v_mode from flowlane.steps s
  where s.flow_slug = v_task.flow_slug and s.step_slug = v_task.step_slug;
  if v_mode = 'fail' then
    update flowlane.step_states ss
       set status = 'failed', failed_at = flowlane._now(), remaining_tasks = null, error_message = p_error
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

-- the attempt history takes an attempt's error type and traceback from
-- flowlane.attempt_details, {"<run_id>/<step_slug>/<task_index>": {type, traceback}}
-- (one setting for a whole batch), else from the single-task settings
-- (flowlane.attempt_error_type, flowlane.attempt_traceback)
create function flowlane._record_attempt() returns trigger
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
                        (select o.stall_after from flowlane.step_options o
                         where o.flow_slug = new.flow_slug and o.step_slug = new.step_slug));
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

create trigger step_tasks_attempt_history
  after update of status on flowlane.step_tasks
  for each row
  when (old.status = 'started' and new.status in ('queued', 'failed'))
  execute function flowlane._record_attempt();
