-- flowlane SQL Core 0044: a single failure that retries hides its message through the queue's
-- static statement. _fail_one called PGMQ's set_vt, which builds and plans its UPDATE on
-- every call: a fifth of a fail_task that retries (280 of 1,400 µs of functions' own time).
-- It now calls _queue_set_vt, as the batch path does, planned once per connection; a queue
-- without a branch still goes to PGMQ's function.

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
    perform flowlane._queue_set_vt(flowlane._task_queue(v_task), array[v_task.message_id],
                                   flowlane.calculate_retry_delay(v_base_delay, v_task.attempts_count));
  end if;
  return v_task;
end;
$$;
