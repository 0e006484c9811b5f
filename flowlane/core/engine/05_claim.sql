-- Claiming tasks: a worker reads messages from its queue and starts the tasks they name; a
-- started task holds a lease until its stall deadline.

create type flowlane.claim_record as (
  outcome text,         -- 'claimed' | 'unsupported' | 'handed_back' | 'at_capacity' | 'rate_limited'
  flow_slug text,       -- null for a foreign message (no task on this queue)
  step_slug text,
  queue_name text,
  run_id uuid,
  task_index int,
  input jsonb,
  flow_input jsonb,
  attempt int,
  msg_id bigint
);

create type flowlane._claim_item as (
  msg_id bigint,
  task flowlane.step_tasks,   -- null fields: no task on this queue has the message
  supported boolean,
  claimable boolean
);

-- A step's options: its own where its definition sets them, else its flow's. A claimed task's
-- message stays hidden for its timeout and 2 s (claim_visibility: the handler's result has
-- time to arrive); stalled recovery may take a started task stall_after seconds (its timeout
-- and 30 s) after its claim or its last lease extension (_stall_deadline). A view, so that
-- the planner expands it into each statement that joins it: set-based statements keep their
-- plans, and the rules are written here only.
create view flowlane.step_options as
select o.flow_slug, o.step_slug, o.timeout, o.max_attempts, o.base_delay,
       o.timeout + 2 as claim_visibility,
       o.timeout + 30 as stall_after
from (select s.flow_slug, s.step_slug,
             coalesce(s.opt_timeout, f.opt_timeout) as timeout,
             coalesce(s.opt_max_attempts, f.opt_max_attempts) as max_attempts,
             coalesce(s.opt_base_delay, f.opt_base_delay) as base_delay
      from flowlane.steps s join flowlane.flows f on f.flow_slug = s.flow_slug) o;

-- a worker's claim: read up to qty messages of its queue and start their tasks, in one round
-- trip; the claim keeps the visibility the read gave (see _start_tasks). A queue with limits
-- (19_flow_control.sql) reads at most what they allow; when they allow nothing the claim
-- returns one row instead: 'at_capacity' (the queue's concurrency is reached: a task's end
-- wakes the queue's listeners) or 'rate_limited' (input {"wait_ms": N}: no start is allowed
-- for N ms). A queue that has seen a priority is read in priority order.
create function flowlane.claim_tasks(queue_name text, qty int, worker_id uuid, supported_pairs jsonb)
returns setof flowlane.claim_record
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set plan_cache_mode = force_generic_plan
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_flows text[];
  v_steps text[];
  v_lease int;
  v_ids bigint[];
  v_later bigint[];
  v_gate flowlane._queue_gate;
  v_rows flowlane.claim_record[];
  v_one flowlane.claim_record;
begin
  perform flowlane._check_queue_argument('claim_tasks', claim_tasks.queue_name);
  perform flowlane._check_worker_argument('claim_tasks', claim_tasks.worker_id);
  if qty is null or qty < 1 then
    raise exception 'claim_tasks: qty must be at least 1' using errcode = '22023';
  end if;
  select coalesce(array_agg(p.flow_slug), '{}'), coalesce(array_agg(p.step_slug), '{}') into v_flows, v_steps
  from flowlane._pairs(supported_pairs) p;
  select coalesce(max(o.claim_visibility), 0) into v_lease
  from unnest(v_flows, v_steps) as p (flow_slug, step_slug)
  join flowlane.step_options o on o.flow_slug = p.flow_slug and o.step_slug = p.step_slug;
  v_gate := flowlane._open_queue_gate(claim_tasks.queue_name, qty);
  if (v_gate.refusal).outcome is not null then
    return next v_gate.refusal;
    return;
  end if;
  if coalesce(v_gate.prioritized, false) then
    select coalesce(array_agg(m.msg_id) filter (where m.enqueued_at <= now()), '{}'),
           coalesce(array_agg(m.msg_id) filter (where m.enqueued_at > now()), '{}')
      into v_ids, v_later
    from flowlane._read_by_priority(claim_tasks.queue_name, v_lease, v_gate.allowed) m;
  else
    select coalesce(array_agg(m.msg_id) filter (where m.enqueued_at <= now()), '{}'),
           coalesce(array_agg(m.msg_id) filter (where m.enqueued_at > now()), '{}')
      into v_ids, v_later
    from flowlane._queue_read(claim_tasks.queue_name, v_lease, v_gate.allowed) m;
  end if;
  if cardinality(v_later) > 0 then
    -- enqueued by a transaction that committed after this one began (the read takes a
    -- new snapshot): a claim now would start the task before it was queued. Visible
    -- again at once; the next poll, a new transaction, claims it.
    perform pgmq.set_vt(claim_tasks.queue_name, v_later, 0);
  end if;
  if cardinality(v_ids) = 0 then
    perform flowlane._close_queue_gate(v_gate, 0);
    return;
  end if;
  if cardinality(v_ids) = 1 then
    v_one := flowlane._claim_one(claim_tasks.queue_name, v_ids[1], claim_tasks.worker_id, v_flows, v_steps,
                                 v_lease, v_gate.started_at);
    if v_one.outcome is not null then
      if v_gate.limited then
        perform flowlane._close_queue_gate(v_gate, 1);
      end if;
      return next v_one;
      return;
    end if;
  end if;
  if not v_gate.limited then
    return query select * from flowlane._claim_batch(claim_tasks.queue_name, v_ids, claim_tasks.worker_id,
                                                     v_flows, v_steps, v_lease, null);
    return;
  end if;
  v_rows := array(select c from flowlane._claim_batch(claim_tasks.queue_name, v_ids, claim_tasks.worker_id,
                                                      v_flows, v_steps, v_lease, v_gate.started_at) c);
  perform flowlane._close_queue_gate(v_gate, (select count(*)::int from unnest(v_rows) r where r.outcome = 'claimed'));
  return query select * from unnest(v_rows);
end;
$$;

create function flowlane.start_tasks(queue_name text, msg_ids bigint[], worker_id uuid, supported_pairs jsonb)
returns setof flowlane.claim_record
language plpgsql volatile
set search_path = ''
set plan_cache_mode = force_generic_plan
as $$
declare
  v_flows text[];
  v_steps text[];
  v_gate flowlane._queue_gate;
  v_ids bigint[];
  v_rows flowlane.claim_record[];
  v_one flowlane.claim_record;
begin
  perform flowlane._check_queue_argument('start_tasks', start_tasks.queue_name);
  perform flowlane._check_worker_argument('start_tasks', start_tasks.worker_id);
  select coalesce(array_agg(p.flow_slug), '{}'), coalesce(array_agg(p.step_slug), '{}') into v_flows, v_steps
  from flowlane._pairs(supported_pairs) p;
  if not exists (select 1 from flowlane.queue_limits l where l.queue_name = start_tasks.queue_name) then
    if cardinality(msg_ids) = 1 and msg_ids[1] is not null then
      v_one := flowlane._claim_one(start_tasks.queue_name, msg_ids[1], worker_id, v_flows, v_steps, null, null);
      if v_one.outcome is not null then
        return next v_one;
        return;
      end if;
    end if;
    return query select * from flowlane._start_tasks(start_tasks.queue_name, msg_ids, worker_id, v_flows, v_steps, null);
    return;
  end if;
  -- a queue with limits: the first messages it allows start, the others are handed back visible
  v_gate := flowlane._open_queue_gate(start_tasks.queue_name, greatest(1, coalesce(cardinality(msg_ids), 0)));
  v_ids := array(select distinct m from unnest(msg_ids) m where m is not null order by m);
  if (v_gate.refusal).outcome is not null then
    perform pgmq.set_vt(start_tasks.queue_name, v_ids, 0);
    return next v_gate.refusal;
    return;
  end if;
  if cardinality(v_ids) > v_gate.allowed then
    perform pgmq.set_vt(start_tasks.queue_name, v_ids[v_gate.allowed + 1:], 0);
    v_ids := v_ids[1:v_gate.allowed];
  end if;
  select coalesce(array_agg(c), '{}') into v_rows
  from flowlane._start_tasks(start_tasks.queue_name, v_ids, worker_id, v_flows, v_steps, null, v_gate.started_at) c;
  perform flowlane._close_queue_gate(v_gate, (select count(*)::int from unnest(v_rows) r where r.outcome = 'claimed'));
  return query select * from unnest(v_rows);
end;
$$;

-- the claim of a batch of read messages, classified as a whole before anything changes (a
-- batch with a message this worker cannot handle claims nothing); the tasks to hide and to
-- return are read from the unnested claim, the leases looked up once per (flow, step), the
-- inputs from _claimed_inputs. The worker's (flow, step) pairs come as two arrays, checked
-- by the caller (_pairs), like the queue's name and the worker id. p_read_vt: the visibility
-- claim_tasks read the messages with, the longest lease of the pairs it serves, which every
-- claimed task's lease fits in: the messages keep it. Null (start_tasks, whose caller read
-- the messages with a visibility of its own): each claimed task's message is hidden for its
-- lease (_hide_claimed).
create function flowlane._start_tasks(p_queue text, p_msg_ids bigint[], p_worker_id uuid,
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
  v_locked bigint[];
  v_free bigint[];
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

  -- a claim waits for no engine row (the lock order, README.md): the batch's tasks are locked
  -- skip locked, and a message whose task another transaction holds is left out of the
  -- claim and handed back visible rather than hidden for a lease (the holder may be a result
  -- it refuses, which leaves the message as it is); skip locked again, so a message the holder
  -- is writing is left to it
  v_locked := flowlane._lock_claimable_tasks(p_queue, v_ids);
  if cardinality(v_locked) < cardinality(v_ids) then
    execute format('select coalesce(array_agg(q.msg_id order by q.msg_id), ''{}'') from (select m.msg_id'
                   ' from pgmq.%I m where m.msg_id = any ($1) order by m.msg_id for update skip locked) q',
                   pgmq.format_table_name(p_queue, 'q'))
      into v_free using array(select m from unnest(v_ids) m where m <> all (v_locked));
    perform pgmq.set_vt(p_queue, v_free, 0);
  end if;
  v_ids := v_locked;
  if cardinality(v_ids) = 0 then
    return;
  end if;

  -- classify every message before any change
  select array_agg(row(b.msg_id, t, t.run_id is not null and p.flow_slug is not null,
                       flowlane._claimable(t.status, r.status,
                         -- (a step without a step_states row: its task holds its state, all_step_states)
                         coalesce(ss.status, case when t.step_started_at is null then null
                                                  when t.status = 'completed' then 'completed' else 'started' end))
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

  -- terminal tasks: their message is ended (archived or deleted; idempotent)
  if exists (select 1 from unnest(v_batch) c
             where (c.task).status in ('completed', 'failed', 'skipped', 'cancelled')) then
    perform flowlane._end_queue_messages(p_queue, array(
      select c.msg_id from unnest(v_batch) c
      where (c.task).status in ('completed', 'failed', 'skipped', 'cancelled') order by c.msg_id));
  end if;
  -- still started (a visible duplicate): no attempt; hidden until stalled recovery may take it
  if exists (select 1 from unnest(v_batch) c where (c.task).status = 'started') then
    select array_agg(c.task order by c.msg_id),
           array_agg(greatest(1, ceil(extract(epoch from
                       flowlane._stall_deadline(c.task, o.stall_after) - flowlane._clock_timestamp()))::int) order by c.msg_id)
      into v_duplicates, v_offsets
    from unnest(v_batch) c
    join flowlane.step_options o on o.flow_slug = (c.task).flow_slug and o.step_slug = (c.task).step_slug
    where (c.task).status = 'started';
    perform flowlane._set_tasks_vt(v_duplicates, v_offsets);
  end if;

  with claimed as (
    update flowlane.step_tasks t
       set status = 'started', attempts_count = t.attempts_count + 1, started_at = coalesce(p_started_at, flowlane._now()),
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

-- The lock order's exception (README.md, "Lock order"): a claim holds queue messages before it
-- reaches their tasks (claim_tasks reads them in its own transaction), so it never waits for
-- an engine row. It locks the tasks of the messages p_ids (sorted) with skip locked and reads
-- their runs and step states without a lock: every end of a run or step changes its live
-- tasks, so a claim and an end meet on the task's row. Returns the messages whose task this
-- transaction now holds, and those with no task (foreign messages), in order; a message whose
-- task another transaction holds is left out.
create function flowlane._lock_claimable_tasks(p_queue text, p_ids bigint[]) returns bigint[]
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set plan_cache_mode = force_generic_plan
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_locked bigint[];
begin
  v_locked := array(
    select t.message_id from flowlane.step_tasks t
    where t.queue_name = p_queue and t.message_id = any (p_ids)
      and t.message_id between p_ids[1] and p_ids[cardinality(p_ids)]
    order by t.run_id, t.step_slug, t.task_index
    for update skip locked);
  return array(
    select b.msg_id from unnest(p_ids) as b (msg_id)
    where b.msg_id = any (v_locked)
       or not exists (select 1 from flowlane.step_tasks t
                      where t.queue_name = p_queue and t.message_id = b.msg_id)
    order by 1);
end;
$$;

-- a claim starts a task that is queued in a started step of a started run (both claim paths,
-- _start_tasks and _claim_one)
create function flowlane._claimable(p_task_status text, p_run_status text, p_step_status text) returns boolean
language plpgsql immutable
set search_path = ''
as $$
begin
  return coalesce(p_task_status = 'queued' and p_run_status = 'started' and p_step_status = 'started', false);
end;
$$;

-- claimed tasks are hidden for their lease (claim_visibility) where it outlasts the visibility
-- their messages were read with (p_read_vt; null: start_tasks, whose caller read them)
create function flowlane._hide_claimed(p_claimed flowlane.step_tasks[], p_read_vt int) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_hide flowlane.step_tasks[];
  v_offsets int[];
  v_updated int;
begin
  select coalesce(array_agg(c order by c.message_id), '{}'), coalesce(array_agg(l.lease order by c.message_id), '{}')
    into v_hide, v_offsets
  from unnest(p_claimed) c
  join (select o.flow_slug, o.step_slug, o.claim_visibility as lease
        from (select distinct x.flow_slug, x.step_slug from unnest(p_claimed) x) p
        join flowlane.step_options o on o.flow_slug = p.flow_slug and o.step_slug = p.step_slug) l
    on l.flow_slug = c.flow_slug and l.step_slug = c.step_slug
  where p_read_vt is null or l.lease > p_read_vt;
  if cardinality(v_hide) = 0 then
    return;
  end if;
  v_updated := flowlane._set_tasks_vt(v_hide, v_offsets);
  if v_updated <> cardinality(v_hide) then
    raise exception 'claim aborted: % tasks claimed but % queue messages got their visibility extended',
      cardinality(v_hide), v_updated
      using errcode = '40001', hint = 'a task''s message is missing from its queue; the claim was rolled back';
  end if;
end;
$$;

-- the claim of one message, the common case (a worker's claim when one task is queued), without
-- the batch's machinery: the message's task when _start_tasks would claim it (the same locks in
-- the same order, the same classification), else null and no change, for the batch path to
-- decide (a foreign message, an unsupported pair, a duplicate, a task or run that has ended).
-- tests/core/test_claim_one.py holds the two paths equal.
create function flowlane._claim_one(p_queue text, p_msg_id bigint, p_worker_id uuid, p_flows text[],
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
  -- the task skip locked, its run and step state unlocked (_lock_claimable_tasks): a task
  -- another transaction holds is left to the batch path, which leaves it out
  select t.* into v_task from flowlane.step_tasks t
  where t.run_id = v_task.run_id and t.step_slug = v_task.step_slug and t.task_index = v_task.task_index
  for update skip locked;
  if not found then
    return null;
  end if;
  select r.status into v_run_status from flowlane.runs r where r.run_id = v_task.run_id;
  if v_task.step_started_at is not null then  -- the task holds its step's state (all_step_states)
    v_step_status := case when v_task.status = 'completed' then 'completed' else 'started' end;
  else
    select ss.status into v_step_status from flowlane.step_states ss
    where ss.run_id = v_task.run_id and ss.step_slug = v_task.step_slug;
  end if;
  if not flowlane._claimable(v_task.status, v_run_status, v_step_status) then
    return null;
  end if;
  update flowlane.step_tasks t
     set status = 'started', attempts_count = t.attempts_count + 1, started_at = coalesce(p_started_at, flowlane._now()),
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

-- the rows of a claim of the messages read: the claimed tasks (a run's input on its first row
-- only) and, for a refused batch, the other messages read, handed back visible (ids only)
create function flowlane._claim_batch(p_queue text, p_ids bigint[], p_worker_id uuid, p_flows text[],
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

-- the stall deadline of a started task: its step's stall_after seconds (step_options) after
-- the later of its claim and its last lease extension
create function flowlane._stall_deadline(p_task flowlane.step_tasks, p_stall_after int) returns timestamptz
language sql immutable
set search_path = ''
as $$
  select greatest(p_task.started_at, p_task.lease_renewed_at) + make_interval(secs => p_stall_after)
$$;

-- what claimed tasks are handed, for a batch in one statement: a task's input (the element
-- of the run input for a root map, of the parent's output for a dependent map; the run input
-- for a root single step; otherwise {dep: output} of the completed deps), and the run input
-- (of each task it reads run_id, flow_slug, step_slug and task_index)
create function flowlane._claimed_inputs(p_tasks flowlane.step_tasks[])
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
             (select coalesce(ps.output, pt.output) -> t.task_index
              from flowlane.deps d
              left join flowlane.step_states ps on ps.run_id = t.run_id and ps.step_slug = d.dep_slug
              -- a parent whose task holds its state (all_step_states)
              left join flowlane.step_tasks pt
                on pt.run_id = t.run_id and pt.step_slug = d.dep_slug and pt.task_index = 0
               and pt.step_started_at is not null
              where d.flow_slug = s.flow_slug and d.step_slug = s.step_slug)
           when s.deps_count = 0 then r.input
           else flowlane._condition_subject(t.run_id, t.step_slug)
         end,
         r.input
  from unnest(p_tasks) t
  join flowlane.runs r
    on r.run_id = t.run_id and r.run_id = any (array(select distinct x.run_id from unnest(p_tasks) x order by 1))
  -- the step by the task's flow, not the run's: joined on r.flow_slug, a generic plan of
  -- PostgreSQL 15 reached the runs from the steps, through every run of the flow
  join flowlane.steps s on s.flow_slug = t.flow_slug and s.step_slug = t.step_slug;
end;
$$;

-- a started task that ends frees a slot of its queue's concurrency: the workers of each
-- limited queue that had one look again
create function flowlane._wake_freed_queues() returns trigger
language plpgsql volatile
set search_path = ''
as $$
begin
  perform flowlane._wake_queue(l.queue_name)
  from flowlane.queue_limits l
  where l.concurrency is not null
    and exists (select 1 from old_tasks o join new_tasks n
                  on n.run_id = o.run_id and n.step_slug = o.step_slug and n.task_index = o.task_index
                where o.status = 'started' and n.status <> 'started' and o.queue_name = l.queue_name)
  order by l.queue_name;
  return null;
end;
$$;

create trigger step_tasks_wake_freed_queues
  after update on flowlane.step_tasks
  referencing old table as old_tasks new table as new_tasks
  for each statement execute function flowlane._wake_freed_queues();

-- called by a worker for the tasks it holds: items {run_id, step_slug,
-- task_index, attempt, running}. A task still owned by this worker and
-- attempt gets lease_renewed_at = flowlane._now() and its message hidden until the new
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
    select t.run_id, t.step_slug, t.task_index, o.stall_after
    from flowlane.step_tasks t
    join items i on i.run_id = t.run_id and i.step_slug = t.step_slug and i.task_index = t.task_index
    join flowlane.step_options o on o.flow_slug = t.flow_slug and o.step_slug = t.step_slug
    where t.status = 'started' and t.last_worker_id = extend_leases.worker_id
      and t.attempts_count = i.attempt
      and (not i.running or flowlane._now() < t.started_at + make_interval(secs => o.timeout))
    order by t.run_id, t.step_slug, t.task_index
    for update of t skip locked
  ), renewed as (
    update flowlane.step_tasks t set lease_renewed_at = flowlane._now()
      from locked l
     where t.run_id = l.run_id and t.step_slug = l.step_slug and t.task_index = l.task_index
    returning t, l.stall_after
  )
  select coalesce(array_agg(r.t), '{}'), coalesce(array_agg(r.stall_after), '{}')
    into v_tasks, v_offsets from renewed r;
  perform flowlane._set_tasks_vt(v_tasks, v_offsets);
  return cardinality(v_tasks);
end;
$$;
