-- flowlane SQL Core 0045: a worker's claim leaves its messages the visibility its read gave.
-- claim_tasks reads its messages with the longest lease of the pairs the worker serves, so
-- no claimed task's lease outlasts it; yet every claim asked _hide_claimed which tasks to
-- hide longer, a lookup of their leases that never found one. Only start_tasks, whose caller
-- read the messages with a visibility of its own, hides its claimed tasks for their lease
-- now. _hide_claimed keeps its signature: a claim that entered the previous bodies before
-- this migration commits still calls it. A single claim costs 0.91x of the backend CPU it
-- did on PostgreSQL 18 and 0.90x on 15, a claim of 100 0.96x (benchmarks/cycle_ab.py).

-- the claim of a batch of read messages, classified as a whole before anything changes (a
-- batch with a message this worker cannot handle claims nothing); the tasks to hide and to
-- return are read from the unnested claim, the leases looked up once per (flow, step), the
-- inputs from _claimed_inputs. The worker's (flow, step) pairs come as two arrays, checked
-- by the caller (_pairs), like the queue's name and the worker id. p_read_vt: the visibility
-- claim_tasks read the messages with, the longest lease of the pairs it serves, which every
-- claimed task's lease fits in: the messages keep it. Null (start_tasks, whose caller read
-- the messages with a visibility of its own): each claimed task's message is hidden for its
-- lease (_hide_claimed).
create or replace function flowlane._start_tasks(p_queue text, p_msg_ids bigint[], p_worker_id uuid,
                                      p_flows text[], p_steps text[],
                                      p_read_vt int, p_started_at timestamptz = null)
returns setof flowlane.claim_record
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set plan_cache_mode = force_generic_plan
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_ids bigint[];
  v_batch flowlane._claim_item[];
  v_duplicates flowlane.step_tasks[];
  v_claimed flowlane.step_tasks[];
  v_offsets int[];
begin
  if p_msg_ids is null or array_position(p_msg_ids, null) is not null then
    raise exception 'start_tasks: msg_ids must be an array of message ids without nulls' using errcode = '22023';
  end if;
  v_ids := array(select distinct m from unnest(p_msg_ids) m order by m);
  if cardinality(v_ids) = 0 then
    return;
  end if;

  -- lock order: runs (shared: claims do not block each other), then the batch's tasks
  perform 1 from flowlane.runs r
  where r.run_id in (select t.run_id from flowlane.step_tasks t
                     where t.queue_name = p_queue and t.message_id = any (v_ids)
                       and t.message_id between v_ids[1] and v_ids[cardinality(v_ids)])
  order by r.run_id
  for share;
  perform 1 from flowlane.step_tasks t
  where t.queue_name = p_queue and t.message_id = any (v_ids)
    and t.message_id between v_ids[1] and v_ids[cardinality(v_ids)]
  order by t.run_id, t.step_slug, t.task_index
  for update;

  -- classify every message before any change
  select array_agg(row(b.msg_id, t, t.run_id is not null and p.flow_slug is not null,
                       t.status = 'queued' and r.status = 'started' and ss.status = 'started'
                   )::flowlane._claim_item order by b.msg_id)
    into v_batch
  from unnest(v_ids) as b (msg_id)
  left join flowlane.step_tasks t
    on t.queue_name = p_queue and t.message_id = b.msg_id and t.message_id = any (v_ids)
   and t.message_id between v_ids[1] and v_ids[cardinality(v_ids)]
  left join unnest(p_flows, p_steps) as p (flow_slug, step_slug)
    on p.flow_slug = t.flow_slug and p.step_slug = t.step_slug
  left join flowlane.runs r on r.run_id = t.run_id
  left join flowlane.step_states ss on ss.run_id = t.run_id and ss.step_slug = t.step_slug;

  if exists (select 1 from unnest(v_batch) c where not c.supported) then
    perform pgmq.set_vt(p_queue, v_ids, 0);
    return query
      select 'unsupported', (c.task).flow_slug, (c.task).step_slug, p_queue, (c.task).run_id,
             (c.task).task_index, null::jsonb, null::jsonb, null::int, c.msg_id
      from unnest(v_batch) c where not c.supported order by c.msg_id;
    return;
  end if;

  -- terminal tasks: their message is archived (idempotent)
  if exists (select 1 from unnest(v_batch) c
             where (c.task).status in ('completed', 'failed', 'skipped', 'cancelled')) then
    perform pgmq.archive(p_queue, array(
      select c.msg_id from unnest(v_batch) c
      where (c.task).status in ('completed', 'failed', 'skipped', 'cancelled') order by c.msg_id));
  end if;
  -- still started (a visible duplicate): no attempt; hidden until stalled recovery may take it
  if exists (select 1 from unnest(v_batch) c where (c.task).status = 'started') then
    select array_agg(c.task order by c.msg_id),
           array_agg(greatest(1, ceil(extract(epoch from
                       flowlane._stall_deadline(c.task, o.stall_after) - clock_timestamp()))::int) order by c.msg_id)
      into v_duplicates, v_offsets
    from unnest(v_batch) c
    join flowlane.step_options o on o.flow_slug = (c.task).flow_slug and o.step_slug = (c.task).step_slug
    where (c.task).status = 'started';
    perform flowlane._set_tasks_vt(v_duplicates, v_offsets);
  end if;

  with claimed as (
    update flowlane.step_tasks t
       set status = 'started', attempts_count = t.attempts_count + 1, started_at = coalesce(p_started_at, now()),
           last_worker_id = p_worker_id
      from unnest(v_batch) c
     where c.claimable and t.run_id = (c.task).run_id and t.step_slug = (c.task).step_slug
       and t.task_index = (c.task).task_index
    returning t
  ) select coalesce(array_agg(c.t order by (c.t).message_id), '{}') into v_claimed from claimed c;

  if cardinality(v_claimed) = 0 then
    return;
  end if;
  if p_read_vt is null then
    perform flowlane._hide_claimed(v_claimed, p_read_vt);
  end if;

  return query
    select 'claimed', c.flow_slug, c.step_slug, c.queue_name, c.run_id, c.task_index,
           i.input, i.flow_input, c.attempts_count, c.message_id
    from unnest(v_claimed) c
    join flowlane._claimed_inputs(v_claimed) i
      on i.run_id = c.run_id and i.step_slug = c.step_slug and i.task_index = c.task_index
    order by c.message_id;
end;
$$;

-- the claim of one message, the common case (a worker's claim when one task is queued), without
-- the batch's machinery: the message's task when _start_tasks would claim it (the same locks in
-- the same order, the same classification), else null and no change, for the batch path to
-- decide (a foreign message, an unsupported pair, a duplicate, a task or run that has ended).
-- tests/core/test_claim_one.py holds the two paths equal.
create or replace function flowlane._claim_one(p_queue text, p_msg_id bigint, p_worker_id uuid, p_flows text[],
                                    p_steps text[], p_read_vt int, p_started_at timestamptz)
returns flowlane.claim_record
language plpgsql volatile
set search_path = ''
set plan_cache_mode = force_generic_plan
as $$
declare
  v_task flowlane.step_tasks;
  v_run_status text;
  v_step_status text;
  v_row flowlane.claim_record;
begin
  select t.* into v_task from flowlane.step_tasks t where t.queue_name = p_queue and t.message_id = p_msg_id;
  if not found or not exists (select 1 from unnest(p_flows, p_steps) as p (flow_slug, step_slug)
                              where p.flow_slug = v_task.flow_slug and p.step_slug = v_task.step_slug) then
    return null;
  end if;
  -- lock order: the run (shared), then the task
  select r.status into v_run_status from flowlane.runs r where r.run_id = v_task.run_id for share;
  select t.* into v_task from flowlane.step_tasks t
  where t.run_id = v_task.run_id and t.step_slug = v_task.step_slug and t.task_index = v_task.task_index
  for update;
  select ss.status into v_step_status from flowlane.step_states ss
  where ss.run_id = v_task.run_id and ss.step_slug = v_task.step_slug;
  if (v_task.status = 'queued' and v_run_status = 'started' and v_step_status = 'started') is not true then
    return null;
  end if;
  update flowlane.step_tasks t
     set status = 'started', attempts_count = t.attempts_count + 1, started_at = coalesce(p_started_at, now()),
         last_worker_id = p_worker_id
   where t.run_id = v_task.run_id and t.step_slug = v_task.step_slug and t.task_index = v_task.task_index
  returning t.* into v_task;
  if p_read_vt is null then
    perform flowlane._hide_claimed(array[v_task], p_read_vt);
  end if;
  select 'claimed', v_task.flow_slug, v_task.step_slug, v_task.queue_name, v_task.run_id, v_task.task_index,
         i.input, i.flow_input, v_task.attempts_count, v_task.message_id
    into v_row
  from flowlane._claimed_inputs(array[v_task]) i;
  return v_row;
end;
$$;
