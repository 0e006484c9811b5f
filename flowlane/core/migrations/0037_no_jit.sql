-- flowlane SQL Core 0037: no JIT compilation in the functions that plan on keys.
-- The functions that run with enable_seqscan = off (see "Plans" in the engine's README) reach
-- rows through keys, yet a statement can keep a sequential scan where no key serves it (the
-- flows table, a handful of rows). Before PostgreSQL 18 a disabled scan is priced 10^10, past
-- jit_above_cost, so wherever JIT is available (Debian's and most packaged servers) such a
-- statement was compiled on every execution: retention's lookup of prunable runs, which every
-- maintenance tick runs, spent about 0.5 s compiling a query that reads three rows. These
-- functions, and the queue operations written by _write_queue_ops, now run with jit = off.

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
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
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

alter function flowlane._batch_rows(flowlane._result_item[]) set jit = off;
alter function flowlane._begin_due_runs(timestamp with time zone) set jit = off;
alter function flowlane._begin_held_runs(text,text[]) set jit = off;
alter function flowlane._claimed_inputs(flowlane.step_tasks[]) set jit = off;
alter function flowlane._complete_batch(flowlane._result_item[]) set jit = off;
alter function flowlane._create_runs(text,jsonb[],uuid[],timestamp with time zone,text[],text,integer) set jit = off;
alter function flowlane._enqueue_started(flowlane.step_states[]) set jit = off;
alter function flowlane._fail_batch(flowlane._result_item[]) set jit = off;
alter function flowlane._fail_overdue_runs(timestamp with time zone) set jit = off;
alter function flowlane._fire_schedules(timestamp with time zone) set jit = off;
alter function flowlane._flow_limits_changed(text) set jit = off;
alter function flowlane._lock_and_classify(flowlane._result_item[]) set jit = off;
alter function flowlane._maybe_complete_runs(uuid[]) set jit = off;
alter function flowlane._progress_runs(uuid[]) set jit = off;
alter function flowlane._release_held(timestamp with time zone) set jit = off;
alter function flowlane._release_held_tasks(text,text,text[]) set jit = off;
alter function flowlane._run_outputs(uuid[]) set jit = off;
alter function flowlane._start_one_run(flowlane.flows,jsonb,uuid,timestamp with time zone,text,text,integer) set jit = off;
alter function flowlane._start_ready_steps(uuid[]) set jit = off;
alter function flowlane._start_tasks(text,bigint[],uuid,text[],text[],integer,timestamp with time zone) set jit = off;
alter function flowlane._steps_done(flowlane.step_states[]) set jit = off;
alter function flowlane._take_step_slots(jsonb[]) set jit = off;
alter function flowlane.claim_tasks(text,integer,uuid,jsonb) set jit = off;
alter function flowlane.prune_runs(timestamp with time zone,text[],integer,integer) set jit = off;
alter function flowlane.queue_depth(text) set jit = off;

-- the queue operations, written again with the setting
select flowlane._write_queue_ops();
