-- Queues: the registry of PGMQ queues the engine sends to, and the grouped PGMQ operations on
-- a batch of tasks.

-- the PGMQ queue whose table a flowlane queue name maps to (PGMQ folds case)
create function flowlane._pgmq_queue(p_queue text) returns text
language sql stable
set search_path = ''
as $$
  select l.queue_name from pgmq.list_queues() l
  where lower(l.queue_name) = lower(p_queue)
  order by l.queue_name = p_queue desc, l.queue_name
  limit 1
$$;

-- the queue of a step of a flow in the given mode (explicit: the given name)
create function flowlane._resolve_queue(
  p_flow_slug text, p_step_slug text, p_step_index int, p_mode text, p_given text
) returns text
language plpgsql stable
set search_path = ''
as $$
declare
  v_queue text;
begin
  if p_mode = 'flow' then
    v_queue := lower(p_flow_slug);
  elsif p_mode = 'per-step' then
    v_queue := lower(p_flow_slug || '__' || p_step_slug);
    if length(v_queue) > 47 then
      v_queue := lower(p_flow_slug || '__' || p_step_index);
    end if;
    if length(v_queue) > 47 then
      raise exception 'step "%" of flow "%": the per-step queue name % is longer than 47 characters (the PGMQ limit)',
        p_step_slug, p_flow_slug, v_queue
        using errcode = '22023', hint = 'use a shorter flow slug, or explicit queue names';
    end if;
  else
    if p_given is null then
      raise exception 'step "%" of flow "%": the flow routes steps explicitly (queue_mode explicit), so queue_name is required',
        p_step_slug, p_flow_slug using errcode = '22023';
    end if;
    if p_given <> lower(p_given) and flowlane.is_valid_queue_name(lower(p_given))
       and position('__' in p_given) = 0 then
      raise exception 'step "%" of flow "%": queue name "%" is not canonical', p_step_slug, p_flow_slug, p_given
        using errcode = '22023', hint = format('queue names are lowercase: write "%s"', lower(p_given));
    end if;
    if not flowlane.is_valid_queue_name(p_given) or position('__' in p_given) > 0 then
      raise exception 'step "%" of flow "%": invalid queue name "%"', p_step_slug, p_flow_slug, p_given
        using errcode = '22023',
              hint = 'a queue name matches ^[a-z][a-z0-9_]*$, has at most 47 characters, no trailing "_", and no "__" (reserved for generated per-step queues)';
    end if;
    return p_given;
  end if;
  if p_given is not null and p_given <> v_queue then
    raise exception 'step "%" of flow "%": queue_mode % routes this step to queue "%", not "%"',
      p_step_slug, p_flow_slug, p_mode, v_queue, p_given using errcode = '22023';
  end if;
  return v_queue;
end;
$$;

create function flowlane._ensure_queue(p_queue text, p_flow_slug text, p_mode text) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_row flowlane.queues;
  v_ownership text := case when p_mode = 'explicit' then 'shared' else 'owned' end;
  v_pgmq text;
begin
  perform pg_advisory_xact_lock(hashtext('flowlane.queue:' || p_queue));
  select * into v_row from flowlane.queues q where q.queue_name = p_queue;
  v_pgmq := flowlane._pgmq_queue(p_queue);
  if found then
    if v_row.ownership = 'owned' and v_row.owner_flow_slug <> p_flow_slug then
      raise exception 'queue "%" is owned by flow "%" and cannot be used by flow "%"',
        p_queue, v_row.owner_flow_slug, p_flow_slug
        using errcode = '42501', hint = 'route this flow''s steps to another queue';
    end if;
    if v_row.ownership <> v_ownership then
      raise exception 'queue "%" is % but flow "%" (queue_mode %) needs it %',
        p_queue, v_row.ownership, p_flow_slug, p_mode, v_ownership
        using errcode = '42501',
              hint = 'a queue owned by one flow is never shared, and a shared queue is never owned';
    end if;
  else
    if v_pgmq is not null then
      raise exception 'PGMQ queue "%" already exists but is not registered with flowlane', v_pgmq
        using errcode = '42501',
              hint = format('flowlane never takes over a queue silently: adopt it with `flowlane queue adopt %s` '
                            '(flowlane.adopt_queue) or choose another queue name', p_queue);
    end if;
    insert into flowlane.queues (queue_name, ownership, owner_flow_slug, pgmq_queue_name)
    values (p_queue, v_ownership, case when v_ownership = 'owned' then p_flow_slug end, p_queue);
  end if;
  if v_pgmq is null then
    perform pgmq.create(p_queue);
  end if;
end;
$$;

create function flowlane._tune_queue_table(p_queue text)
returns void
language plpgsql
security definer
set search_path = ''
as $$
begin
  if to_regclass(format('pgmq.%I', 'q_' || p_queue)) is not null then
    execute format('alter table pgmq.%I set (autovacuum_vacuum_scale_factor = 0, '
                   'autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_cost_delay = 0)',
                   'q_' || p_queue);
  end if;
exception when insufficient_privilege then
  null;  -- an adopted queue owned by another role keeps its owner's settings
end;
$$;

create function flowlane._tune_registered_queue()
returns trigger
language plpgsql
security definer
set search_path = ''
as $$
begin
  perform flowlane._tune_queue_table(coalesce(new.pgmq_queue_name, new.queue_name));
  return null;
end;
$$;

-- deferred: add_step registers the queue before pgmq.create makes its table
create constraint trigger tune_registered_queue
after insert on flowlane.queues
deferrable initially deferred
for each row execute function flowlane._tune_registered_queue();

-- pgmq.enable_notify_insert installs a row trigger that updates one row of
-- pgmq.notify_insert_throttle per queue on every insert: every enqueue
-- (start_flow, complete_task starting dependents) serialised on that row
-- while holding run locks, which deadlocked under load. This trigger is per
-- statement and writes nothing; PostgreSQL folds identical notifications of
-- one transaction into one. Same channel as PGMQ's: pgmq.q_<queue>.INSERT.
--
-- A commit that notifies holds PostgreSQL's notification lock (one for the whole cluster)
-- through its WAL flush, so notifying commits flush one after another: under a steady rate
-- of starts they queued for it. So a queue has at most one notifying transaction in flight:
-- an insert while another transaction's notification of the queue is on its way (that one
-- holds the queue's notifier lock until it ends) sends none. Every inserting transaction holds
-- one of the queue's inserter locks (_queue_inserter_locks), shared, until it ends, and a
-- worker about to wait for a notification first waits for the holders of each in turn
-- (await_queue_inserts), then claims once more: woken by the notification that was on its
-- way, it finds the messages whose own was left out as soon as they are committed. While
-- workers wait for some inserter locks, inserts take another; an insert that can take none
-- notifies.
create function flowlane._notify_queue_insert() returns trigger
language plpgsql volatile
set search_path = ''
as $$
declare
  v_queue constant int := hashtext(tg_table_name);
  v_lock int;
begin
  foreach v_lock in array flowlane._queue_inserter_locks() loop
    if pg_try_advisory_xact_lock_shared(v_lock, v_queue) then
      if pg_try_advisory_xact_lock(hashtext('flowlane.queue_notifier'), v_queue) then
        exit;  -- no notification of this queue is on its way: this one sends it
      end if;
      return null;  -- another transaction's notification of this queue is on its way
    end if;
  end loop;
  perform pg_notify('pgmq.' || tg_table_name || '.INSERT', null);
  return null;
end;
$$;

-- the first key of each inserter lock (the second is the queue's): more of them than the
-- workers of a queue that wait for them at once, so that an insert finds one free
create function flowlane._queue_inserter_locks() returns int[]
language sql immutable
set search_path = ''
as $$
  select array[hashtext('flowlane.queue_inserters'), hashtext('flowlane.queue_inserters_2'),
               hashtext('flowlane.queue_inserters_3'), hashtext('flowlane.queue_inserters_4')]
$$;

-- what a worker calls before it waits for the queue's notification: wait (at most timeout_ms
-- for each inserter lock) until the transactions inserting into the queue have ended, so that
-- its next claim sees what they committed; false when a wait timed out (a long transaction
-- inserted: the worker cannot know whether a notification is on its way)
create function flowlane.await_queue_inserts(queue_name text, timeout_ms integer default 50)
returns boolean
language plpgsql volatile
set search_path = ''
as $$
declare
  v_table text;
  v_settled boolean := true;
  v_lock int;
begin
  select pgmq.format_table_name(q.pgmq_queue_name, 'q') into v_table
  from flowlane.queues q where q.queue_name = await_queue_inserts.queue_name;
  if v_table is null then
    v_table := pgmq.format_table_name(await_queue_inserts.queue_name, 'q');
  end if;
  perform set_config('lock_timeout', greatest(1, timeout_ms) || 'ms', true);
  -- one lock after the other, never two held: inserts meanwhile take one not waited for.
  -- Each is a transaction lock taken in a block that always ends in an exception, whose
  -- rollback releases it: a session lock would outlive an error raised after its grant (a
  -- lock timeout firing as the lock is granted raises once it is held), and every insert
  -- and every other worker's wait would then find it taken until the connection closed.
  foreach v_lock in array flowlane._queue_inserter_locks() loop
    begin
      perform pg_advisory_xact_lock(v_lock, hashtext(v_table));
      raise exception using errcode = 'FLW01';  -- granted: the inserters before it have ended
    exception
      when lock_not_available then v_settled := false;
      when sqlstate 'FLW01' then null;
    end;
  end loop;
  return v_settled;
end;
$$;

-- idempotent; true when it installed the trigger. Drops PGMQ's throttled
-- trigger on the queue if present.
create function flowlane.enable_queue_notify(queue_name text) returns boolean
language plpgsql volatile
set search_path = ''
as $$
declare
  v_pgmq text;  -- PGMQ's spelling (PGMQ folds case in table names; an adopted queue may differ)
  v_table text;
begin
  select m.queue_name into v_pgmq from pgmq.meta m
  where lower(m.queue_name) = lower(enable_queue_notify.queue_name)
  order by m.queue_name = enable_queue_notify.queue_name desc, m.queue_name limit 1;
  if not found then
    raise exception 'enable_queue_notify: queue % does not exist', coalesce(quote_literal(queue_name), 'NULL')
      using errcode = '22023';
  end if;
  v_table := pgmq.format_table_name(v_pgmq, 'q');
  -- replicas starting together: one installs the trigger, the others then see it
  perform pg_advisory_xact_lock(hashtext('flowlane.notify_insert'), hashtext(v_table));
  if exists (select 1 from pgmq.list_notify_insert_throttles() t where t.queue_name = v_pgmq) then
    perform pgmq.disable_notify_insert(v_pgmq);
  end if;
  if exists (select 1 from pg_catalog.pg_trigger tg
             where tg.tgrelid = format('pgmq.%I', v_table)::regclass
               and tg.tgname = 'flowlane_notify_insert') then
    return false;
  end if;
  execute format('create trigger flowlane_notify_insert after insert on pgmq.%I '
                 'for each statement execute function flowlane._notify_queue_insert()', v_table);
  return true;
end;
$$;

create function flowlane.adopt_queue(queue_name text) returns flowlane.queues
language plpgsql volatile
set search_path = ''
as $$
declare
  v_name text := lower(adopt_queue.queue_name);
  v_pgmq text;
  v_row flowlane.queues;
  v_foreign bigint;
  v_sample bigint[];
begin
  perform flowlane._check_queue_argument('adopt_queue', v_name);
  perform pg_advisory_xact_lock(hashtext('flowlane.queue:' || v_name));
  v_pgmq := flowlane._pgmq_queue(v_name);
  if v_pgmq is null then
    raise exception 'adopt_queue: there is no PGMQ queue named "%"', adopt_queue.queue_name
      using errcode = 'P0002',
            hint = 'adoption is for queues that exist already; flowlane creates the queues its flows route to when their SQL is applied';
  end if;
  select * into v_row from flowlane.queues q where q.queue_name = v_name for update;
  if found and v_row.ownership = 'owned' then
    raise exception 'adopt_queue: queue "%" is owned by flow "%"; an owned queue is never shared',
      v_name, v_row.owner_flow_slug using errcode = '42501';
  end if;
  if found then
    return v_row;  -- already shared: nothing to do
  end if;
  -- hold off senders while the messages are checked
  execute format('lock table pgmq.%I in share row exclusive mode', pgmq.format_table_name(v_pgmq, 'q'));
  execute format(
    'select count(*), (array_agg(m.msg_id order by m.msg_id))[1:5] from pgmq.%I m '
    'where not exists (select 1 from flowlane.step_tasks t where t.queue_name = $1 and t.message_id = m.msg_id)',
    pgmq.format_table_name(v_pgmq, 'q'))
    into v_foreign, v_sample using v_name;
  if v_foreign > 0 then
    raise exception 'adopt_queue: PGMQ queue "%" holds % message(s) that no flowlane task tracks (message ids %)',
      v_pgmq, v_foreign, array_to_string(v_sample, ', ')
      using errcode = '55000',
            hint = 'flowlane adopts only an empty queue or one whose every message belongs to a flowlane task; drain or move the other messages, then adopt again';
  end if;
  insert into flowlane.queues (queue_name, ownership, owner_flow_slug, pgmq_queue_name, adopted_at)
  values (v_name, 'shared', null, v_pgmq, flowlane._now())
  returning * into v_row;
  return v_row;
end;
$$;

-- the queue a task's message lives on: its immutable snapshot
create function flowlane._task_queue(task flowlane.step_tasks) returns text
language plpgsql stable
set search_path = ''
as $$ begin return task.queue_name; end $$;

-- end the messages of the given tasks, one call per queue in queue order, each queue's ids sorted
create function flowlane._archive_tasks(tasks flowlane.step_tasks[]) returns int
language plpgsql volatile
set search_path = ''
as $$
declare
  v_group record;
  v_total int := 0;
begin
  for v_group in
    select flowlane._task_queue(t) as queue_name, array_agg(t.message_id order by t.message_id) as ids
    from unnest(tasks) as t
    where t.message_id is not null
    group by 1
    order by 1
  loop
    v_total := v_total + flowlane._end_queue_messages(v_group.queue_name, v_group.ids);
  end loop;
  return v_total;
end;
$$;

-- what becomes of a queue's messages whose task no longer needs them: archived (PGMQ's
-- archive table keeps them), or deleted where the queue's `kind: queue` document turns its
-- archive off (queues.archive_messages, written by set_queue_limits); returns how many ended
create function flowlane._end_queue_messages(p_queue text, p_msg_ids bigint[]) returns int
language plpgsql volatile
set search_path = ''
as $$
declare
  v_n int;
begin
  if exists (select 1 from flowlane.queues q where q.queue_name = p_queue and not q.archive_messages) then
    select count(*) into v_n from flowlane._queue_delete_batch(p_queue, p_msg_ids);
  else
    select count(*) into v_n from flowlane._queue_archive_batch(p_queue, p_msg_ids);
  end if;
  return v_n;
end;
$$;

-- set the visibility of the given tasks' messages to now + offsets[i] seconds;
-- grouped by (queue, offset); returns the number of messages updated
create function flowlane._set_tasks_vt(tasks flowlane.step_tasks[], offsets int[]) returns int
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
-- deletion of a batch, the visibility of a batch, a task's send and a batch's. PGMQ's
-- functions name the queue's table at run time, so they build and plan their statement on
-- every call (120-450 µs here, more than the statement itself). These seven are written by _write_queue_ops with one branch per
-- registered queue, each branch a static statement PL/pgSQL plans once per connection; a
-- queue without a branch (not registered, or its table made after the last rewrite) goes to
-- PGMQ's function. Each branch means what PGMQ's call means (tests/core/test_queue_ops.py
-- compares them).
create function flowlane._write_queue_ops() returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_read text;
  v_archive text;
  v_send text;
  v_send_batch text;
  v_archive_batch text;
  v_delete_batch text;
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
    return query delete from pgmq.%I q where q.msg_id = any (p_msg_ids) returning q.msg_id;
    return;
  end if;$b$, x.queue_name, x.q_table), E'\n  ' order by x.queue_name),
    string_agg(format($b$if p_queue = %L then
    update pgmq.%I m set vt = clock_timestamp() + make_interval(secs => p_vt) where m.msg_id = any (p_msg_ids);
    get diagnostics v_n = row_count;
    return v_n;
  end if;$b$, x.queue_name, x.q_table), E'\n  ' order by x.queue_name)
    into v_read, v_archive, v_send, v_send_batch, v_archive_batch, v_delete_batch, v_set_vt
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
      ($h$_queue_delete_batch(p_queue text, p_msg_ids bigint[]) returns setof bigint$h$, '',
       v_delete_batch, $r$return query select * from pgmq.delete(p_queue, p_msg_ids);$r$),
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

select flowlane._write_queue_ops();

-- a queue registered (its PGMQ table made in the same transaction) gets its branches; as the
-- owner, like the other deferred triggers of flowlane.queues: it fires at commit, where the
-- role that registered the queue may not run _write_queue_ops
create function flowlane._queue_ops_registered() returns trigger
language plpgsql volatile
security definer
set search_path = ''
as $$
begin
  perform flowlane._write_queue_ops();
  return null;
end;
$$;

create constraint trigger queue_ops_registered
after insert on flowlane.queues
deferrable initially deferred
for each row execute function flowlane._queue_ops_registered();
