-- flowlane SQL Core 0042: a batch claim's lookups of its tasks by message stay in the batch's range.
-- _start_tasks finds the tasks of the messages it read with `queue_name = p_queue and
-- message_id = any (v_ids)`. In the generic plans of PostgreSQL 15 the array stayed a filter:
-- each of its three lookups read every task the queue had (completed ones too, until retention
-- prunes them), so a claim of 100 after 2,000 tasks cost 2.3x what it costs with this change,
-- and more as the table grew. The lookups now also say `message_id between` the batch's
-- first and last id, which every version's index scan uses: on 15 it reads the tasks in that
-- range only; on 18, where the array was already in the index condition, nothing changes.

-- the claim of a batch of read messages, classified as a whole before anything changes (a
-- batch with a message this worker cannot handle claims nothing); the tasks to hide and to
-- return are read from the unnested claim, the leases looked up once per (flow, step), the
-- inputs from _claimed_inputs. The worker's (flow, step) pairs come as two arrays, checked
-- by the caller (_pairs), like the queue's name and the worker id.
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
  perform flowlane._hide_claimed(v_claimed, p_read_vt);

  return query
    select 'claimed', c.flow_slug, c.step_slug, c.queue_name, c.run_id, c.task_index,
           i.input, i.flow_input, c.attempts_count, c.message_id
    from unnest(v_claimed) c
    join flowlane._claimed_inputs(v_claimed) i
      on i.run_id = c.run_id and i.step_slug = c.step_slug and i.task_index = c.task_index
    order by c.message_id;
end;
$$;
