-- flowlane SQL Core 0030: queue operations planned once.
-- PGMQ's read, archive, send and send_batch build and plan their statement on every call. A
-- claim's read, a single completion's archive and the sending of tasks now go through
-- _queue_read, _queue_archive, _queue_send and _queue_send_batch, written by
-- _write_queue_ops with one static branch per registered queue (planned once per
-- connection) and PGMQ's function for any other queue.
-- They are written here for the queues registered so far, and again whenever a queue is
-- registered (the constraint trigger queue_ops_registered, at commit).

-- The queue operations of the one-at-a-time paths and of sending tasks: a claim's read, a
-- completion's archive, a task's send and a batch's. PGMQ's functions name the queue's table
-- at run time, so they build and plan their statement on every call (120-250 µs here, more
-- than the statement itself). These four are written by _write_queue_ops with one branch per
-- registered queue, each branch a static statement PL/pgSQL plans once per connection; a
-- queue without a branch (not registered, or its table made after the last rewrite) goes to
-- PGMQ's function. Each branch means what PGMQ's call means (tests/core/test_queue_ops.py
-- compares them).
create or replace function flowlane._write_queue_ops() returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_read text;
  v_archive text;
  v_send text;
  v_send_batch text;
begin
  perform pg_advisory_xact_lock(hashtext('flowlane.queue_ops'));
  with queues as (
    select q.queue_name, pgmq.format_table_name(q.queue_name, 'q') as q_table,
           pgmq.format_table_name(q.queue_name, 'a') as a_table
    from flowlane.queues q
  )
  select
    string_agg(format($b$if p_queue = %L then
    v_ids := array(select q.msg_id from pgmq.%I q where q.vt <= clock_timestamp()
                   order by q.msg_id limit p_qty for update skip locked);
    return query
      update pgmq.%2$I m
         set last_read_at = clock_timestamp(), vt = clock_timestamp() + make_interval(secs => p_vt),
             read_ct = m.read_ct + 1
       where m.msg_id = any (v_ids)
      returning m.msg_id, m.read_ct, m.enqueued_at, m.last_read_at, m.vt, m.message, m.headers;
    return;
  end if;$b$, x.queue_name, x.q_table), E'\n  ' order by x.queue_name),
    string_agg(format($b$if p_queue = %L then
    with archived as (delete from pgmq.%I q where q.msg_id = p_msg_id
                      returning q.msg_id, q.vt, q.read_ct, q.enqueued_at, q.last_read_at, q.message, q.headers)
    insert into pgmq.%I (msg_id, vt, read_ct, enqueued_at, last_read_at, message, headers)
    select a.msg_id, a.vt, a.read_ct, a.enqueued_at, a.last_read_at, a.message, a.headers from archived a
    returning msg_id into v_id;
    return v_id is not null;
  end if;$b$, x.queue_name, x.q_table, x.a_table), E'\n  ' order by x.queue_name),
    string_agg(format($b$if p_queue = %L then
    insert into pgmq.%I (vt, message, headers)
    values (clock_timestamp() + make_interval(secs => p_delay), p_msg, null)
    returning msg_id into v_id;
    return v_id;
  end if;$b$, x.queue_name, x.q_table), E'\n  ' order by x.queue_name),
    string_agg(format($b$if p_queue = %L then
    return query
      insert into pgmq.%I (vt, message, headers)
      select v_vt, m.msg, null from unnest(p_msgs) as m (msg)
      returning msg_id;
    return;
  end if;$b$, x.queue_name, x.q_table), E'\n  ' order by x.queue_name)
    into v_read, v_archive, v_send, v_send_batch
  from queues x
  where to_regclass(format('pgmq.%I', x.q_table)) is not null
    and to_regclass(format('pgmq.%I', x.a_table)) is not null;
  execute format($f$
  create or replace function flowlane._queue_read(p_queue text, p_vt int, p_qty int)
returns setof pgmq.message_record
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- a plan made while the queue was small stays on its keys
set plan_cache_mode = force_generic_plan
as $body$
declare
  v_ids bigint[];  -- two statements: a generic plan of PGMQ's one joins the whole queue
begin
  %s
  return query select * from pgmq.read(p_queue, p_vt, p_qty);
end;
$body$;
  create or replace function flowlane._queue_archive(p_queue text, p_msg_id bigint) returns boolean
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- a plan made while the queue was small stays on its keys
set plan_cache_mode = force_generic_plan
as $body$
declare
  v_id bigint;
begin
  %s
  return pgmq.archive(p_queue, p_msg_id);
end;
$body$;
  create or replace function flowlane._queue_send(p_queue text, p_msg jsonb, p_delay int) returns bigint
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- a plan made while the queue was small stays on its keys
set plan_cache_mode = force_generic_plan
as $body$
declare
  v_id bigint;
begin
  %s
  select m.id into v_id from pgmq.send(p_queue, p_msg, p_delay) m (id);
  return v_id;
end;
$body$;
  create or replace function flowlane._queue_send_batch(p_queue text, p_msgs jsonb[], p_delay int)
returns setof bigint
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- a plan made while the queue was small stays on its keys
set plan_cache_mode = force_generic_plan
as $body$
declare
  v_vt timestamptz := clock_timestamp() + make_interval(secs => p_delay);
begin
  %s
  return query select * from pgmq.send_batch(p_queue, p_msgs, p_delay);
end;
$body$;$f$, coalesce(v_read, ''), coalesce(v_archive, ''), coalesce(v_send, ''), coalesce(v_send_batch, ''));
end;
$$;

-- a queue registered (its PGMQ table made in the same transaction) gets its branches; as the
-- owner, like the other deferred triggers of flowlane.queues: it fires at commit, where the
-- role that registered the queue may not run _write_queue_ops
create or replace function flowlane._queue_ops_registered() returns trigger
language plpgsql volatile
security definer
set search_path = ''
as $$
begin
  perform flowlane._write_queue_ops();
  return null;
end;
$$;

-- a worker's claim: read up to qty messages of its queue and start their tasks, in one round
-- trip; the claim keeps the visibility the read gave (see _start_tasks). A queue with limits
-- (19_flow_control.sql) reads at most what they allow; when they allow nothing the claim
-- returns one row instead: 'at_capacity' (the queue's concurrency is reached: a task's end
-- wakes the queue's listeners) or 'rate_limited' (input {"wait_ms": N}: no start is allowed
-- for N ms). A queue that has seen a priority is read in priority order.
create or replace function flowlane.claim_tasks(queue_name text, qty int, worker_id uuid, supported_pairs jsonb)
returns setof flowlane.claim_record
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_lease int;
  v_ids bigint[];
  v_later bigint[];
  v_gate flowlane._queue_gate;
  v_rows flowlane.claim_record[];
begin
  perform flowlane._check_queue_argument('claim_tasks', claim_tasks.queue_name);
  if qty is null or qty < 1 then
    raise exception 'claim_tasks: qty must be at least 1' using errcode = '22023';
  end if;
  select coalesce(max(o.claim_visibility), 0) into v_lease
  from flowlane._pairs(supported_pairs) p
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
  if not v_gate.limited then
    return query select * from flowlane._claim_batch(claim_tasks.queue_name, v_ids, claim_tasks.worker_id,
                                                     supported_pairs, v_lease, null);
    return;
  end if;
  v_rows := array(select c from flowlane._claim_batch(claim_tasks.queue_name, v_ids, claim_tasks.worker_id,
                                                      supported_pairs, v_lease, v_gate.started_at) c);
  perform flowlane._close_queue_gate(v_gate, (select count(*)::int from unnest(v_rows) r where r.outcome = 'claimed'));
  return query select * from unnest(v_rows);
end;
$$;

-- _complete_batch of one item; null (nothing done) when it is not the plain case
create or replace function flowlane._complete_one(p_item flowlane._result_item) returns flowlane.step_tasks
language plpgsql volatile
set search_path = ''
set plan_cache_mode = force_generic_plan
as $$
declare
  v_task flowlane.step_tasks := flowlane._lock_one(p_item);
  v_step_type text;
  v_state flowlane.step_states;
begin
  if v_task.run_id is null then
    return null;
  end if;
  select s.step_type into v_step_type from flowlane.steps s
  where s.flow_slug = v_task.flow_slug and s.step_slug = v_task.step_slug;
  if v_step_type = 'single' and exists (  -- its output's type is checked by the batch path
       select 1 from flowlane.deps d
       join flowlane.steps ch on ch.flow_slug = d.flow_slug and ch.step_slug = d.step_slug and ch.step_type = 'map'
       where d.flow_slug = v_task.flow_slug and d.dep_slug = v_task.step_slug) then
    return null;
  end if;
  update flowlane.step_tasks t
     set status = 'completed', completed_at = now(), output = p_item.output
   where t.run_id = v_task.run_id and t.step_slug = v_task.step_slug and t.task_index = v_task.task_index
  returning t.* into v_task;
  if v_task.message_id is not null then
    perform flowlane._queue_archive(flowlane._task_queue(v_task), v_task.message_id);
  end if;
  update flowlane.step_states ss
     set remaining_tasks = ss.remaining_tasks - 1,
         status = case when ss.remaining_tasks = 1 then 'completed' else ss.status end,
         completed_at = case when ss.remaining_tasks = 1 then now() end,
         output = case when ss.remaining_tasks <> 1 then null
                       when v_step_type = 'single' then p_item.output
                       else (select coalesce(jsonb_agg(t.output order by t.task_index), '[]'::jsonb)
                             from flowlane.step_tasks t
                             where t.run_id = ss.run_id and t.step_slug = ss.step_slug) end
   where ss.run_id = v_task.run_id and ss.step_slug = v_task.step_slug
  returning ss.* into v_state;
  if v_state.status = 'completed' then
    perform flowlane._step_done_one(v_state);
  end if;
  return v_task;
end;
$$;

-- send tasks (bodies) to one queue and record them; the bodies carry the run's priority
create or replace function flowlane._send_tasks(p_queue text, p_bodies jsonb[], p_delay int) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_n int;
begin
  if coalesce(cardinality(p_bodies), 0) = 0 then
    return;
  end if;
  if exists (select 1 from unnest(p_bodies) b where b ? 'priority') then
    perform flowlane._prioritize_queue(p_queue);
  end if;
  if cardinality(p_bodies) = 1 then  -- a single start or completion (02_queues.sql: _queue_send)
    insert into flowlane.step_tasks (flow_slug, run_id, step_slug, task_index, queue_name, message_id)
    values (p_bodies[1] ->> 'flow_slug', (p_bodies[1] ->> 'run_id')::uuid, p_bodies[1] ->> 'step_slug',
            (p_bodies[1] ->> 'task_index')::int, p_queue, flowlane._queue_send(p_queue, p_bodies[1], p_delay));
    return;
  end if;
  insert into flowlane.step_tasks (flow_slug, run_id, step_slug, task_index, queue_name, message_id)
  select b.body ->> 'flow_slug', (b.body ->> 'run_id')::uuid, b.body ->> 'step_slug',
         (b.body ->> 'task_index')::int, p_queue, m.id
  from flowlane._queue_send_batch(p_queue, p_bodies, p_delay) with ordinality as m (id, ord)
  join unnest(p_bodies) with ordinality as b (body, ord) on b.ord = m.ord;
  get diagnostics v_n = row_count;
  if v_n <> cardinality(p_bodies) then
    raise exception 'internal error: sent % messages to queue % for % tasks', v_n, p_queue, cardinality(p_bodies);
  end if;
end;
$$;

select flowlane._write_queue_ops();

create constraint trigger queue_ops_registered
after insert on flowlane.queues
deferrable initially deferred
for each row execute function flowlane._queue_ops_registered();
