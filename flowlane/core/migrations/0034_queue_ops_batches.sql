-- flowlane SQL Core 0034: the batch archive and visibility change planned once.
-- _write_queue_ops also writes _queue_archive_batch and _queue_set_vt, one static branch per
-- registered queue, as for the other queue operations. _archive_tasks (a batch completion,
-- cancellations) and _set_tasks_vt (retries, claims, recovery) call them instead of
-- pgmq.archive and pgmq.set_vt, which build and plan their statement on every call.

-- archive the messages of the given tasks, one call per queue
create or replace function flowlane._archive_tasks(tasks flowlane.step_tasks[]) returns int
language plpgsql volatile
set search_path = ''
as $$
declare
  v_group record;
  v_total int := 0;
  v_n int;
begin
  for v_group in
    select flowlane._task_queue(t) as queue_name, array_agg(t.message_id order by t.message_id) as ids
    from unnest(tasks) as t
    where t.message_id is not null
    group by 1
    order by 1
  loop
    select count(*) into v_n from flowlane._queue_archive_batch(v_group.queue_name, v_group.ids);
    v_total := v_total + v_n;
  end loop;
  return v_total;
end;
$$;

-- set the visibility of the given tasks' messages to now + offsets[i] seconds;
-- grouped by (queue, offset); returns the number of messages updated
create or replace function flowlane._set_tasks_vt(tasks flowlane.step_tasks[], offsets int[]) returns int
language plpgsql volatile
set search_path = ''
as $$
declare
  v_group record;
  v_total int := 0;
  v_n int;
begin
  if coalesce(cardinality(tasks), 0) <> coalesce(cardinality(offsets), 0) then
    raise exception 'internal error: % tasks but % visibility offsets',
      coalesce(cardinality(tasks), 0), coalesce(cardinality(offsets), 0);
  end if;
  for v_group in
    select flowlane._task_queue(tasks[i]) as queue_name, offsets[i] as vt_offset,
           array_agg((tasks[i]).message_id order by (tasks[i]).message_id) as ids
    from generate_subscripts(tasks, 1) as i
    where (tasks[i]).message_id is not null
    group by 1, 2
    order by 1, 2
  loop
    v_n := flowlane._queue_set_vt(v_group.queue_name, v_group.ids, v_group.vt_offset);
    v_total := v_total + v_n;
  end loop;
  return v_total;
end;
$$;

-- The queue operations: a claim's read, the archive of one message and of a batch, the
-- visibility of a batch, a task's send and a batch's. PGMQ's functions name the queue's table
-- at run time, so they build and plan their statement on every call (120-450 µs here, more
-- than the statement itself). These six are written by _write_queue_ops with one branch per
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
  v_archive_batch text;
  v_set_vt text;
  v_op record;
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
  end if;$b$, x.queue_name, x.q_table), E'\n  ' order by x.queue_name),
    string_agg(format($b$if p_queue = %L then
    return query
      with archived as (delete from pgmq.%I q where q.msg_id = any (p_msg_ids)
                        returning q.msg_id, q.vt, q.read_ct, q.enqueued_at, q.last_read_at, q.message, q.headers)
      insert into pgmq.%I (msg_id, vt, read_ct, enqueued_at, last_read_at, message, headers)
      select a.msg_id, a.vt, a.read_ct, a.enqueued_at, a.last_read_at, a.message, a.headers from archived a
      returning msg_id;
    return;
  end if;$b$, x.queue_name, x.q_table, x.a_table), E'\n  ' order by x.queue_name),
    string_agg(format($b$if p_queue = %L then
    update pgmq.%I m set vt = clock_timestamp() + make_interval(secs => p_vt) where m.msg_id = any (p_msg_ids);
    get diagnostics v_n = row_count;
    return v_n;
  end if;$b$, x.queue_name, x.q_table), E'\n  ' order by x.queue_name)
    into v_read, v_archive, v_send, v_send_batch, v_archive_batch, v_set_vt
  from queues x
  where to_regclass(format('pgmq.%I', x.q_table)) is not null
    and to_regclass(format('pgmq.%I', x.a_table)) is not null;
  for v_op in
    select * from (values
      ($h$_queue_read(p_queue text, p_vt int, p_qty int) returns setof pgmq.message_record$h$,
       $l$v_ids bigint[];  -- two statements: a generic plan of PGMQ's one joins the whole queue$l$,
       v_read, $r$return query select * from pgmq.read(p_queue, p_vt, p_qty);$r$),
      ($h$_queue_archive(p_queue text, p_msg_id bigint) returns boolean$h$, $l$v_id bigint;$l$,
       v_archive, $r$return pgmq.archive(p_queue, p_msg_id);$r$),
      ($h$_queue_archive_batch(p_queue text, p_msg_ids bigint[]) returns setof bigint$h$, '',
       v_archive_batch, $r$return query select * from pgmq.archive(p_queue, p_msg_ids);$r$),
      ($h$_queue_set_vt(p_queue text, p_msg_ids bigint[], p_vt int) returns int$h$, $l$v_n int;$l$,
       v_set_vt, $r$select count(*) into v_n from pgmq.set_vt(p_queue, p_msg_ids, p_vt);
  return v_n;$r$),
      ($h$_queue_send(p_queue text, p_msg jsonb, p_delay int) returns bigint$h$, $l$v_id bigint;$l$,
       v_send, $r$select m.id into v_id from pgmq.send(p_queue, p_msg, p_delay) m (id);
  return v_id;$r$),
      ($h$_queue_send_batch(p_queue text, p_msgs jsonb[], p_delay int) returns setof bigint$h$,
       $l$v_vt timestamptz := clock_timestamp() + make_interval(secs => p_delay);$l$,
       v_send_batch, $r$return query select * from pgmq.send_batch(p_queue, p_msgs, p_delay);$r$)
    ) as o (head, locals, branches, fallback)
  loop
    execute format($f$create or replace function flowlane.%s
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- a plan made while the queue was small stays on its keys
set plan_cache_mode = force_generic_plan
as $body$
declare
  %s
begin
  %s
  %s
end;
$body$;$f$, v_op.head, v_op.locals, coalesce(v_op.branches, ''), v_op.fallback);
  end loop;
end;
$$;

select flowlane._write_queue_ops();
