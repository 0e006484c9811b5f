-- Flow control: concurrency limits per key on flows (started runs) and steps (sent tasks),
-- a queue's concurrency and rate limit across all workers (enforced in claim_tasks), and
-- priorities (claims on a queue take higher priorities first). docs/flow-control-internals.md says
-- what each limit means; this file is how the SQL Core keeps them exactly.
--
-- Exactness: every change of the number of started runs (or sent tasks) of a key happens
-- under that key's transaction-scoped advisory lock (_lock_slots), and the count is read
-- after the lock is taken, in a new statement (READ COMMITTED: it sees every transaction
-- that held the lock before). A run that cannot begin waits (status waiting, hold_seq set)
-- and is begun by whichever transaction frees a slot of its key, in that transaction: the
-- run's end, by any path, is an update of runs.status, which a statement trigger follows
-- (_run_slots_freed); a task's end likewise (_step_slots_freed). Lock order: run keys
-- before step keys (a task's end takes its run's key first), keys sorted within a scope.

-- == options ==================================================================================

create function flowlane._check_priority(p_what text, p_priority int) returns void
language plpgsql immutable
set search_path = ''
as $$
begin
  if p_priority is not null and p_priority not between -1000 and 1000 then
    raise exception '%: priority must be from -1000 to 1000, not %', p_what, p_priority
      using errcode = '22023', hint = 'higher priorities are claimed first; the default is 0';
  end if;
end;
$$;

create function flowlane._check_flow_control_options(p_what text, p_limit int, p_key text, p_priority int)
returns void
language plpgsql immutable
set search_path = ''
as $$
begin
  if p_limit is not null and p_limit < 1 then
    raise exception '%: concurrency limit must be at least 1, not %', p_what, p_limit using errcode = '22023';
  end if;
  if nullif(p_key, '') is not null and p_limit is null then
    raise exception '%: a concurrency key needs a concurrency limit', p_what using errcode = '22023';
  end if;
  if nullif(p_key, '') is not null and p_key !~ '^(/([^~/]|~[01])*)+$' then
    raise exception '%: concurrency key % is not a JSON pointer into the run input', p_what, quote_literal(p_key)
      using errcode = '22023', hint = 'a JSON pointer starts with "/" (e.g. /customer_id); "~" is written ~0 and "/" inside a name ~1';
  end if;
  perform flowlane._check_priority(p_what, p_priority);
end;
$$;

-- what a full key does with a new run: queue (it waits its turn), replace_waiting (it replaces
-- the key's waiting runs), cancel_running (it cancels the key's oldest started runs)
create function flowlane._check_when_full(p_what text, p_limit int, p_when_full text) returns void
language plpgsql immutable
set search_path = ''
as $$
begin
  if p_when_full is not null and p_when_full not in ('queue', 'replace_waiting', 'cancel_running') then
    raise exception '%: concurrency when_full must be queue, replace_waiting or cancel_running, not %', p_what,
      quote_literal(p_when_full) using errcode = '22023';
  end if;
  if coalesce(p_when_full, 'queue') <> 'queue' and p_limit is null then
    raise exception '%: concurrency when_full % needs a concurrency limit', p_what, p_when_full
      using errcode = '22023';
  end if;
end;
$$;

-- a flow's debounce: a period of at least 1 second, an optional key pointer into the run
-- input and an optional maximum wait of at least the period
create function flowlane._check_debounce(p_what text, p_key text, p_period int, p_max_wait int) returns void
language plpgsql immutable
set search_path = ''
as $$
begin
  if p_period is null and (nullif(p_key, '') is not null or p_max_wait is not null) then
    raise exception '%: a debounce key or maximum wait needs a debounce period', p_what using errcode = '22023';
  end if;
  if p_period < 1 then
    raise exception '%: debounce period must be at least 1 second, not %', p_what, p_period using errcode = '22023';
  end if;
  if p_max_wait < p_period then
    raise exception '%: debounce maximum wait (% s) must be at least the period (% s)', p_what, p_max_wait, p_period
      using errcode = '22023';
  end if;
  if nullif(p_key, '') is not null and p_key !~ '^(/([^~/]|~[01])*)+$' then
    raise exception '%: debounce key % is not a JSON pointer into the run input', p_what, quote_literal(p_key)
      using errcode = '22023', hint = 'a JSON pointer starts with "/" (e.g. /customer_id); "~" is written ~0 and "/" inside a name ~1';
  end if;
end;
$$;

-- the concurrency key of a run input: the value at the pointer (a string as itself, any other
-- JSON value as its text, a missing value as null); '' without a pointer (one key for all)
create function flowlane._concurrency_key(p_pointer text, p_input jsonb) returns text
language sql immutable parallel safe
set search_path = ''
as $$
  select case when p_pointer is null then ''
              else coalesce((select case jsonb_typeof(v) when 'string' then v #>> '{}' else left(v::text, 500) end
                             from (select p_input #> flowlane._pointer_path(p_pointer) as v) x), 'null') end
$$;

-- how a key is shown: "customer_id=42" (the pointer's last name), the scope's name without a pointer
create function flowlane._key_label(p_scope text, p_pointer text, p_key text) returns text
language sql immutable
set search_path = ''
as $$
  select case when p_pointer is null then p_scope
              else replace(replace(regexp_replace(p_pointer, '^.*/', ''), '~1', '/'), '~0', '~') || '=' || p_key end
$$;

-- the advisory locks of the keys of one scope ('run:FLOW' or 'step:FLOW/STEP'), in key order
create function flowlane._lock_slots(p_scope text, p_keys text[]) returns void
language sql volatile
set search_path = ''
as $$
  select count(pg_advisory_xact_lock(hashtext('flowlane.slots:' || p_scope), hashtext(k)))
  from (select distinct k from unnest(p_keys) k where k is not null order by 1) x
$$;

-- == flow concurrency ==========================================================================

-- the runs of a flow held for their key that may begin now, FIFO per key, begun; returns
-- them. The caller holds nothing of theirs; this takes the keys' locks.
create function flowlane._begin_held_runs(p_flow text, p_keys text[]) returns uuid[]
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_limit int;
  v_ids uuid[];
  v_retried uuid[];
begin
  if coalesce(cardinality(p_keys), 0) = 0 then
    return '{}';
  end if;
  select f.opt_concurrency_limit into v_limit from flowlane.flows f where f.flow_slug = p_flow;
  perform flowlane._lock_slots('run:' || p_flow, p_keys);
  -- (under the locks: every run held for these keys before is committed and seen here)
  if not exists (select 1 from flowlane.runs r
                 where r.flow_slug = p_flow and r.concurrency_key = any (p_keys) and r.status = 'waiting'
                   and r.hold_seq is not null) then
    return '{}';
  end if;
  with free as (
    select k.key, case when v_limit is null then 2147483647 else greatest(0, v_limit - (
             select count(*) from flowlane.runs r
             where r.flow_slug = p_flow and r.concurrency_key = k.key and r.status = 'started')) end as n
    from (select distinct key from unnest(p_keys) key where key is not null) k
  ), chosen as (
    select h.run_id
    from free cross join lateral (
      select r.run_id from flowlane.runs r
      where r.flow_slug = p_flow and r.concurrency_key = free.key and r.status = 'waiting'
        and r.hold_seq is not null
      order by r.hold_seq
      limit free.n
    ) h
    where free.n > 0
  ), locked as (
    select r.run_id from flowlane.runs r
    where r.run_id in (select c.run_id from chosen c) and r.status = 'waiting'
    order by r.run_id
    for update
  ), begun as (
    update flowlane.runs r
       set status = 'started', hold_seq = null, started_at = greatest(flowlane._now(), r.started_at),
           deadline_at = flowlane._run_deadline(r.flow_slug, greatest(flowlane._now(), r.started_at))
      from locked l
     where r.run_id = l.run_id and r.status = 'waiting'
    returning r.run_id, r.retry_count
  ) select coalesce(array_agg(b.run_id order by b.run_id), '{}'),
           coalesce(array_agg(b.run_id order by b.run_id) filter (where b.retry_count > 0), '{}')
      into v_ids, v_retried
    from begun b;
  if cardinality(v_ids) > 0 then
    -- a retried run held for its key sends the tasks retry_run did not
    perform flowlane._send_missing_tasks(x.id) from unnest(v_retried) x (id);
    perform flowlane._progress_runs(v_ids);
  end if;
  return v_ids;
end;
$$;

-- new runs of a limited flow (status waiting, hold_seq set by the caller) that may begin do;
-- called where runs are created or become due
create function flowlane._begin_new_held_runs(p_run_ids uuid[]) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_group record;
begin
  for v_group in
    select r.flow_slug, array_agg(distinct r.concurrency_key) as keys
    from flowlane.runs r
    where r.run_id = any (p_run_ids) and r.status = 'waiting' and r.hold_seq is not null
    group by r.flow_slug order by r.flow_slug
  loop
    if exists (select 1 from flowlane.flows f
               where f.flow_slug = v_group.flow_slug and f.opt_concurrency_when_full <> 'queue') then
      perform flowlane._lock_started_runs(v_group.flow_slug, v_group.keys);
      perform flowlane._lock_slots('run:' || v_group.flow_slug, v_group.keys);
      perform flowlane._apply_when_full(v_group.flow_slug, array(
        select r.run_id from flowlane.runs r where r.run_id = any (p_run_ids) and r.hold_seq is not null
        order by r.hold_seq));
    end if;
    perform flowlane._begin_held_runs(v_group.flow_slug, v_group.keys);
  end loop;
end;
$$;

-- the started runs of a flow's keys, locked (in run id order) before the keys' locks are taken:
-- a run's end locks its row and then its key, so a start that cancels started runs
-- (when_full cancel_running) takes them in the same order
create function flowlane._lock_started_runs(p_flow text, p_keys text[]) returns void
language sql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
  select count(*) from (
    select r.run_id from flowlane.runs r
    where r.flow_slug = p_flow and r.concurrency_key = any (p_keys) and r.status = 'started'
    order by r.run_id
    for update
  ) x
$$;

-- new runs (p_arrivals, oldest first) have joined their keys' lines: a flow whose full key
-- replaces or cancels does so. replace_waiting: of a key's waiting runs only the newest stays;
-- cancel_running: of a key's started and waiting runs only the newest `limit` stay (the end of
-- a started one begins the next waiting one). Newest: the arrivals in their order, then waiting
-- runs by hold_seq, then started runs by start. The caller holds the keys' locks (and, for
-- cancel_running, the started runs' rows: _lock_started_runs).
create function flowlane._apply_when_full(p_flow text, p_arrivals uuid[]) returns void
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_flow flowlane.flows;
  v_victim record;
  v_keys text[];
begin
  select * into v_flow from flowlane.flows f where f.flow_slug = p_flow;
  if v_flow.opt_concurrency_when_full = 'queue' or v_flow.opt_concurrency_limit is null then
    return;
  end if;
  v_keys := array(select distinct x.concurrency_key from flowlane.runs x
                  where x.run_id = any (p_arrivals) and x.concurrency_key is not null);
  for v_victim in
    with line as (
      select r.run_id, r.status, r.concurrency_key,
             row_number() over (
               partition by r.concurrency_key,
                            case when v_flow.opt_concurrency_when_full = 'replace_waiting' then r.status end
               order by a.ord desc nulls last, r.hold_seq desc nulls last, r.started_at desc, r.run_id desc) as newness,
             first_value(r.run_id) over (
               partition by r.concurrency_key
               order by a.ord desc nulls last, r.hold_seq desc nulls last, r.started_at desc, r.run_id desc) as newest
      from (select s.* from flowlane.runs s  -- (two arms: one partial index each)
            where s.flow_slug = p_flow and s.concurrency_key = any (v_keys) and s.status = 'started'
            union all
            select h.* from flowlane.runs h
            where h.flow_slug = p_flow and h.concurrency_key = any (v_keys) and h.status = 'waiting'
              and h.hold_seq is not null) r
      left join unnest(p_arrivals) with ordinality a (run_id, ord) on a.run_id = r.run_id
    )
    select l.run_id, l.newest, l.concurrency_key from line l
    where case v_flow.opt_concurrency_when_full
            when 'replace_waiting' then l.status = 'waiting' and l.newness > 1
            else l.newness > v_flow.opt_concurrency_limit end
    order by l.status = 'started', l.run_id  -- (waiting ones first: the end of a started one begins the next)
  loop
    perform flowlane.cancel_run(v_victim.run_id, format('superseded by run %s (concurrency %s, when_full %s)',
      v_victim.newest, flowlane._key_label(p_flow, v_flow.opt_concurrency_key, v_victim.concurrency_key),
      v_flow.opt_concurrency_when_full));
  end loop;
end;
$$;

-- a run that stopped being started frees a slot of its key: the next held run begins
create function flowlane._run_slots_freed() returns trigger
language plpgsql volatile
set search_path = ''
as $$
declare
  v_group record;
begin
  for v_group in
    select n.flow_slug, array_agg(distinct n.concurrency_key) as keys
    from new_runs n join old_runs o on o.run_id = n.run_id
    where o.status = 'started' and n.status <> 'started' and n.concurrency_key is not null
    group by n.flow_slug order by n.flow_slug
  loop
    perform flowlane._begin_held_runs(v_group.flow_slug, v_group.keys);
  end loop;
  return null;
end;
$$;

create trigger runs_slots_freed
  after update on flowlane.runs
  referencing old table as old_runs new table as new_runs
  for each statement execute function flowlane._run_slots_freed();

-- create_flow changed the flow's concurrency options: runs not yet ended take the key of
-- the current pointer (started runs without a limit: none), and held runs that now have room
-- begin (all of them once the limit is gone)
create function flowlane._flow_limits_changed(p_flow text) returns void
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_flow flowlane.flows;
  v_keys text[];
begin
  select * into v_flow from flowlane.flows f where f.flow_slug = p_flow;
  if v_flow.opt_concurrency_limit is null then
    update flowlane.runs r set concurrency_key = null
     where r.flow_slug = p_flow and r.status = 'started' and r.concurrency_key is not null;
  else
    update flowlane.runs r set concurrency_key = flowlane._concurrency_key(v_flow.opt_concurrency_key, r.input)
     where r.flow_slug = p_flow and r.status in ('started', 'waiting')
       and r.concurrency_key is distinct from flowlane._concurrency_key(v_flow.opt_concurrency_key, r.input);
  end if;
  select coalesce(array_agg(distinct r.concurrency_key), '{}') into v_keys
  from flowlane.runs r
  where r.flow_slug = p_flow and r.status = 'waiting' and r.hold_seq is not null;
  perform flowlane._begin_held_runs(p_flow, v_keys);
end;
$$;

-- == step concurrency ==========================================================================

-- of tasks about to be sent (bodies {flow_slug, run_id, step_slug, task_index}), those of
-- steps with a concurrency limit take a free slot of their key (FIFO behind tasks already
-- held) or are held; returns the bodies to send now
create function flowlane._take_step_slots(p_bodies jsonb[]) returns jsonb[]
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_group record;
  v_send jsonb[];
begin
  for v_group in
    select s.flow_slug, s.step_slug,
           array_agg(distinct flowlane._concurrency_key(s.opt_concurrency_key, r.input)) as keys
    from unnest(p_bodies) b
    join flowlane.steps s on s.flow_slug = b ->> 'flow_slug' and s.step_slug = b ->> 'step_slug'
    join flowlane.runs r on r.run_id = (b ->> 'run_id')::uuid
    where s.opt_concurrency_limit is not null
    group by 1, 2 order by 1, 2
  loop
    perform flowlane._lock_slots('step:' || v_group.flow_slug || '/' || v_group.step_slug, v_group.keys);
  end loop;
  -- (under the locks: the slots and held tasks of these keys are what earlier holders committed)
  with items as (
    select b.ord, b.body, s.flow_slug, s.step_slug, (b.body ->> 'run_id')::uuid as run_id,
           (b.body ->> 'task_index')::int as task_index, s.opt_concurrency_limit as lim,
           case when s.opt_concurrency_limit is not null
                then flowlane._concurrency_key(s.opt_concurrency_key, r.input) end as key
    from unnest(p_bodies) with ordinality b (body, ord)
    join flowlane.steps s on s.flow_slug = b.body ->> 'flow_slug' and s.step_slug = b.body ->> 'step_slug'
    join flowlane.runs r on r.run_id = (b.body ->> 'run_id')::uuid
  ), ranked as (
    select i.*,
           i.lim is null or (
             not exists (select 1 from flowlane.held_tasks h
                         where h.flow_slug = i.flow_slug and h.step_slug = i.step_slug and h.concurrency_key = i.key)
             and row_number() over (partition by i.flow_slug, i.step_slug, i.key order by i.ord)
                 <= i.lim - (select count(*) from flowlane.step_slots x
                             where x.flow_slug = i.flow_slug and x.step_slug = i.step_slug
                               and x.concurrency_key = i.key)) as send
    from items i
  ), slots as (
    insert into flowlane.step_slots (run_id, step_slug, task_index, flow_slug, concurrency_key)
    select k.run_id, k.step_slug, k.task_index, k.flow_slug, k.key from ranked k
    where k.send and k.key is not null order by 1, 2, 3
    returning 1
  ), held as (
    insert into flowlane.held_tasks (run_id, step_slug, task_index, flow_slug, concurrency_key)
    select k.run_id, k.step_slug, k.task_index, k.flow_slug, k.key from ranked k
    where not k.send order by k.ord
    returning 1
  )
  select coalesce(array_agg(k.body order by k.ord) filter (where k.send), '{}') into v_send
  from ranked k
  where (select count(*) from slots) + (select count(*) from held) >= 0;  -- (both inserts run)
  return v_send;
end;
$$;

-- send tasks (bodies) to one queue and record them; the bodies carry the run's priority.
-- p_in_task: their steps keep their states in their tasks (_state_in_task, 04_runs.sql), with no
-- step_states row: each task is marked, step_started_at its step's start, now
create function flowlane._send_step_tasks(p_queue text, p_bodies jsonb[], p_delay int, p_in_task boolean)
returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_n int;
  v_step_started timestamptz := case when p_in_task then flowlane._now() end;
begin
  if coalesce(cardinality(p_bodies), 0) = 0 then
    return;
  end if;
  if exists (select 1 from unnest(p_bodies) b where b ? 'priority') then
    perform flowlane._prioritize_queue(p_queue);
  end if;
  if cardinality(p_bodies) = 1 then  -- a single start or completion (02_queues.sql: _queue_send)
    insert into flowlane.step_tasks (flow_slug, run_id, step_slug, task_index, queue_name, message_id,
                                     step_started_at)
    values (p_bodies[1] ->> 'flow_slug', (p_bodies[1] ->> 'run_id')::uuid, p_bodies[1] ->> 'step_slug',
            (p_bodies[1] ->> 'task_index')::int, p_queue, flowlane._queue_send(p_queue, p_bodies[1], p_delay),
            v_step_started);
    return;
  end if;
  insert into flowlane.step_tasks (flow_slug, run_id, step_slug, task_index, queue_name, message_id, step_started_at)
  select b.body ->> 'flow_slug', (b.body ->> 'run_id')::uuid, b.body ->> 'step_slug',
         (b.body ->> 'task_index')::int, p_queue, m.id, v_step_started
  from flowlane._queue_send_batch(p_queue, p_bodies, p_delay) with ordinality as m (id, ord)
  join unnest(p_bodies) with ordinality as b (body, ord) on b.ord = m.ord;
  get diagnostics v_n = row_count;
  if v_n <> cardinality(p_bodies) then
    raise exception 'internal error: sent % messages to queue % for % tasks', v_n, p_queue, cardinality(p_bodies);
  end if;
end;
$$;

-- tasks of steps that have their step_states rows (the previous release's signature, which its
-- functions call while a migration commits)
create function flowlane._send_tasks(p_queue text, p_bodies jsonb[], p_delay int) returns void
language plpgsql volatile
set search_path = ''
as $$
begin
  perform flowlane._send_step_tasks(p_queue, p_bodies, p_delay, false);
end;
$$;

-- held tasks of one step whose keys have free slots are sent, FIFO per key; a held task whose
-- run or step no longer runs is dropped
create function flowlane._release_held_tasks(p_flow text, p_step text, p_keys text[]) returns int
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_step flowlane.steps;
  v_bodies jsonb[];
begin
  select * into v_step from flowlane.steps s where s.flow_slug = p_flow and s.step_slug = p_step;
  perform flowlane._lock_slots('step:' || p_flow || '/' || p_step, p_keys);
  delete from flowlane.held_tasks h
   where h.flow_slug = p_flow and h.step_slug = p_step and h.concurrency_key = any (p_keys)
     and not exists (select 1 from flowlane.runs r
                     join flowlane.step_states ss on ss.run_id = r.run_id and ss.step_slug = h.step_slug
                     where r.run_id = h.run_id and r.status = 'started' and ss.status = 'started');
  with free as (
    select k.key, case when v_step.opt_concurrency_limit is null then 2147483647
                       else greatest(0, v_step.opt_concurrency_limit - (
                         select count(*) from flowlane.step_slots s
                         where s.flow_slug = p_flow and s.step_slug = p_step and s.concurrency_key = k.key)) end as n
    from (select distinct key from unnest(p_keys) key where key is not null) k
  ), released as (
    delete from flowlane.held_tasks h
     using (select c.run_id, c.task_index from free
            cross join lateral (select x.run_id, x.task_index from flowlane.held_tasks x
                                where x.flow_slug = p_flow and x.step_slug = p_step and x.concurrency_key = free.key
                                order by x.hold_seq limit free.n) c
            where free.n > 0) c
     where h.run_id = c.run_id and h.step_slug = p_step and h.task_index = c.task_index
    returning h.*
  ), slots as (
    insert into flowlane.step_slots (run_id, step_slug, task_index, flow_slug, concurrency_key)
    select r.run_id, r.step_slug, r.task_index, r.flow_slug, r.concurrency_key from released r
    where v_step.opt_concurrency_limit is not null
    returning 1
  )
  select coalesce(array_agg(jsonb_build_object('flow_slug', x.flow_slug, 'run_id', x.run_id,
                                               'step_slug', x.step_slug, 'task_index', x.task_index)
                            || case when ru.priority <> 0 then jsonb_build_object('priority', ru.priority)
                                    else '{}'::jsonb end
                            order by x.hold_seq), '{}')
    into v_bodies
  from released x join flowlane.runs ru on ru.run_id = x.run_id
  where (select count(*) from slots) >= 0;
  perform flowlane._send_step_tasks(v_step.queue_name, v_bodies, 0, false);
  return cardinality(v_bodies);
end;
$$;

-- a task that ended frees its step slot: the next held task of its key is sent
create function flowlane._step_slots_freed() returns trigger
language plpgsql volatile
set search_path = ''
as $$
declare
  v_freed record;
  v_group record;
begin
  if not exists (select 1 from flowlane.step_slots) then
    return null;
  end if;
  with freed as (
    delete from flowlane.step_slots s
     using old_tasks o join new_tasks n
           on n.run_id = o.run_id and n.step_slug = o.step_slug and n.task_index = o.task_index
     where o.status in ('queued', 'started') and n.status not in ('queued', 'started')
       and s.run_id = o.run_id and s.step_slug = o.step_slug and s.task_index = o.task_index
    returning s.*
  )
  select coalesce(array_agg(f.flow_slug), '{}') as flows, coalesce(array_agg(f.step_slug), '{}') as steps,
         coalesce(array_agg(f.concurrency_key), '{}') as keys, coalesce(array_agg(r.concurrency_key), '{}') as run_keys
    into v_freed
  from freed f join flowlane.runs r on r.run_id = f.run_id;
  -- run keys first (the lock order): this transaction may end the runs too
  for v_group in
    select f.flow, array_agg(distinct f.run_key) as keys
    from unnest(v_freed.flows, v_freed.run_keys) f (flow, run_key)
    where f.run_key is not null group by 1 order by 1
  loop
    perform flowlane._lock_slots('run:' || v_group.flow, v_group.keys);
  end loop;
  for v_group in
    select f.flow, f.step, array_agg(distinct f.key) as keys
    from unnest(v_freed.flows, v_freed.steps, v_freed.keys) f (flow, step, key)
    group by 1, 2 order by 1, 2
  loop
    perform flowlane._release_held_tasks(v_group.flow, v_group.step, v_group.keys);
  end loop;
  return null;
end;
$$;

create trigger step_tasks_slots_freed
  after update on flowlane.step_tasks
  referencing old table as old_tasks new table as new_tasks
  for each statement execute function flowlane._step_slots_freed();

-- add_step changed a step's options: held tasks that now have room are sent
create function flowlane._step_limits_changed(p_flow text, p_step text) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_step flowlane.steps;
  v_keys text[];
begin
  select * into v_step from flowlane.steps s where s.flow_slug = p_flow and s.step_slug = p_step;
  -- a new pointer: held and sent tasks take their key from it
  update flowlane.held_tasks h
     set concurrency_key = flowlane._concurrency_key(v_step.opt_concurrency_key, r.input)
    from flowlane.runs r
   where h.flow_slug = p_flow and h.step_slug = p_step and r.run_id = h.run_id
     and h.concurrency_key <> flowlane._concurrency_key(v_step.opt_concurrency_key, r.input);
  update flowlane.step_slots x
     set concurrency_key = flowlane._concurrency_key(v_step.opt_concurrency_key, r.input)
    from flowlane.runs r
   where x.flow_slug = p_flow and x.step_slug = p_step and r.run_id = x.run_id
     and x.concurrency_key <> flowlane._concurrency_key(v_step.opt_concurrency_key, r.input);
  select coalesce(array_agg(distinct h.concurrency_key), '{}') into v_keys
  from flowlane.held_tasks h where h.flow_slug = p_flow and h.step_slug = p_step;
  if cardinality(v_keys) > 0 then
    perform flowlane._release_held_tasks(p_flow, p_step, v_keys);
  end if;
end;
$$;

-- the tasks of a run's started steps that have none (retry_run): sent, or held for their slot
create function flowlane._send_missing_tasks(p_run_id uuid) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_group record;
begin
  for v_group in
    select s.queue_name,
           array_agg(jsonb_build_object('flow_slug', r.flow_slug, 'run_id', r.run_id,
                                        'step_slug', ss.step_slug, 'task_index', k)
                     || case when r.priority <> 0 then jsonb_build_object('priority', r.priority) else '{}'::jsonb end
                     order by s.step_index, k) as bodies,
           bool_or(s.opt_concurrency_limit is not null) as limited
    from flowlane.step_states ss
    join flowlane.runs r on r.run_id = ss.run_id
    join flowlane.steps s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
    cross join lateral generate_series(0, ss.initial_tasks - 1) as k
    where ss.run_id = p_run_id and ss.status = 'started' and s.queue_name is not null
      and not exists (select 1 from flowlane.step_tasks t
                      where t.run_id = ss.run_id and t.step_slug = ss.step_slug and t.task_index = k)
      and not exists (select 1 from flowlane.held_tasks h
                      where h.run_id = ss.run_id and h.step_slug = ss.step_slug and h.task_index = k)
    group by s.queue_name
    order by s.queue_name
  loop
    perform flowlane._send_step_tasks(v_group.queue_name,
      case when v_group.limited then flowlane._take_step_slots(v_group.bodies) else v_group.bodies end, 0, false);
  end loop;
end;
$$;

-- == priorities ================================================================================

-- the first message with a priority on a queue switches its claims to the ordered read
-- (_read_by_priority) and gives its PGMQ table the index that read follows (built in the
-- sending transaction, once: it holds the queue's writers until that transaction commits)
create function flowlane._prioritize_queue(p_queue text) returns void
language plpgsql volatile
security definer
set search_path = ''
as $$
declare
  v_pgmq text;
begin
  update flowlane.queues q set prioritized = true
   where q.queue_name = p_queue and not q.prioritized
  returning q.pgmq_queue_name into v_pgmq;
  if v_pgmq is not null then
    begin
      execute format('create index if not exists %I on pgmq.%I ((coalesce((message ->> ''priority'')::int, 0)) desc, msg_id)',
                     pgmq.format_table_name(v_pgmq, 'q') || '_priority_idx', pgmq.format_table_name(v_pgmq, 'q'));
    exception when insufficient_privilege then
      null;  -- an adopted queue owned by another role: read in order without the index
    end;
  end if;
end;
$$;

-- pgmq.read, in priority order (higher first, then message id): same visibility, same columns
create function flowlane._read_by_priority(p_queue text, p_vt int, p_qty int)
returns setof pgmq.message_record
language plpgsql volatile
set search_path = ''
as $$
declare
  v_table text := pgmq.format_table_name(flowlane._pgmq_queue(p_queue), 'q');
begin
  return query execute format(
    'with cte as (select msg_id from pgmq.%I where vt <= clock_timestamp() '
    '             order by coalesce((message ->> ''priority'')::int, 0) desc, msg_id limit $1 for update skip locked) '
    'update pgmq.%I m set last_read_at = clock_timestamp(), vt = clock_timestamp() + $2, read_ct = read_ct + 1 '
    'from cte where m.msg_id = cte.msg_id '
    'returning m.msg_id, m.read_ct, m.enqueued_at, m.last_read_at, m.vt, m.message, m.headers',
    v_table, v_table) using p_qty, make_interval(secs => p_vt);
end;
$$;

-- == queue limits ==============================================================================

-- a claim's view of its queue's limits: how many messages it may read, the time its starts
-- are recorded at (a rate-limited queue: the bucket's clock), the tokens it took, the row to
-- return instead of reading (the limits allow nothing now), and whether to read in priority
-- order
create type flowlane._queue_gate as (
  queue_name text,
  allowed int,
  started_at timestamptz,
  reserved int,
  refusal flowlane.claim_record,
  prioritized boolean,
  limited boolean
);

-- say how many tasks may start. Claims on a queue with a concurrency limit take turns (its
-- limits row locked, then its started tasks counted: exact under any number of claimers); a
-- rate limit's tokens are taken up front, in the one statement that locks the row (the
-- claim gives back what it did not start, _close_queue_gate)
create function flowlane._open_queue_gate(p_queue text, p_qty int) returns flowlane._queue_gate
language plpgsql volatile
set search_path = ''
as $$
declare
  v_gate flowlane._queue_gate;
  v_limits flowlane.queue_limits;
  v_started int;
  v_now timestamptz;
begin
  v_gate.queue_name := p_queue;
  v_gate.allowed := p_qty;
  select coalesce(q.prioritized, false), l.queue_name is not null, l.concurrency, l.rate_limit
    into v_gate.prioritized, v_gate.limited, v_limits.concurrency, v_limits.rate_limit
  from flowlane.queues q left join flowlane.queue_limits l on l.queue_name = q.queue_name
  where q.queue_name = p_queue;
  v_gate.prioritized := coalesce(v_gate.prioritized, false);
  v_gate.limited := coalesce(v_gate.limited, false);
  if not v_gate.limited then
    return v_gate;
  end if;
  if v_limits.concurrency is not null then
    select * into v_limits from flowlane.queue_limits l where l.queue_name = p_queue for update;
    select count(*) into v_started from flowlane.step_tasks t where t.queue_name = p_queue and t.status = 'started';
    v_gate.allowed := least(v_gate.allowed, v_limits.concurrency - v_started);
    if v_gate.allowed < 1 then
      v_gate.refusal := row('at_capacity', null, null, p_queue, null, null,
                            jsonb_build_object('started', v_started, 'concurrency', v_limits.concurrency),
                            null, null, null)::flowlane.claim_record;
      return v_gate;
    end if;
  end if;
  if v_limits.rate_limit is not null then
    -- (the clock read before the row's lock: a claim that waited records its starts at the
    -- bucket's time, never earlier than the claim before it)
    v_now := flowlane._clock_timestamp();
    update flowlane.queue_limits l
       set refilled_at = greatest(v_now, l.refilled_at),
           last_grant = greatest(0, least(v_gate.allowed,
                          floor(flowlane._bucket_tokens(l, greatest(v_now, l.refilled_at)))))::int,
           tokens = flowlane._bucket_tokens(l, greatest(v_now, l.refilled_at))
                    - greatest(0, least(v_gate.allowed, floor(flowlane._bucket_tokens(l, greatest(v_now, l.refilled_at)))))
     where l.queue_name = p_queue
    returning * into v_limits;
    v_gate.started_at := v_limits.refilled_at;
    v_gate.reserved := v_limits.last_grant;
    v_gate.allowed := v_limits.last_grant;
    if v_gate.allowed < 1 then
      v_gate.refusal := row('rate_limited', null, null, p_queue, null, null,
                            jsonb_build_object('wait_ms',
                              ceil(1000 * flowlane._next_start_in(v_limits, v_limits.refilled_at))::int),
                            null, null, null)::flowlane.claim_record;
    end if;
  end if;
  return v_gate;
end;
$$;

-- the claim is over: the tokens it took and did not use go back to the bucket
create function flowlane._close_queue_gate(p_gate flowlane._queue_gate, p_started int) returns void
language plpgsql volatile
set search_path = ''
as $$
begin
  if p_gate.reserved > p_started then
    update flowlane.queue_limits l set tokens = least(l.rate_limit, l.tokens + (p_gate.reserved - p_started))
     where l.queue_name = p_gate.queue_name;
  end if;
end;
$$;

-- what compiled queue files call: a queue's limits (null: no such limit; both null: none)
-- and whether its ended messages are archived (the default) or deleted
create function flowlane.set_queue_limits(queue_name text, concurrency int, rate_limit int, rate_per int,
                                          archive boolean default true)
returns flowlane.queue_limits
language plpgsql volatile
set search_path = ''
as $$
declare
  v_row flowlane.queue_limits;
  v_what text := format('queue "%s"', set_queue_limits.queue_name);
begin
  perform flowlane._check_queue_argument('set_queue_limits', set_queue_limits.queue_name);
  if not exists (select 1 from flowlane.queues q where q.queue_name = set_queue_limits.queue_name) then
    raise exception '%: no such queue', v_what using errcode = 'P0002',
      hint = 'a queue exists once a flow routes a step to it (apply the flow first)';
  end if;
  if set_queue_limits.concurrency < 1 then
    raise exception '%: concurrency must be at least 1, not %', v_what, set_queue_limits.concurrency
      using errcode = '22023';
  end if;
  if (set_queue_limits.rate_limit is null) <> (set_queue_limits.rate_per is null) then
    raise exception '%: a rate limit needs both a limit and a period (per)', v_what using errcode = '22023';
  end if;
  if set_queue_limits.rate_limit < 1 or set_queue_limits.rate_per < 1 then
    raise exception '%: a rate limit is at least 1 start per at least 1 second', v_what using errcode = '22023';
  end if;
  if set_queue_limits.archive is null then
    raise exception '%: archive is true or false, not null', v_what using errcode = '22023';
  end if;
  update flowlane.queues q set archive_messages = set_queue_limits.archive
   where q.queue_name = set_queue_limits.queue_name and q.archive_messages <> set_queue_limits.archive;
  if set_queue_limits.concurrency is null and set_queue_limits.rate_limit is null then
    delete from flowlane.queue_limits l where l.queue_name = set_queue_limits.queue_name;
    perform flowlane._wake_queue(set_queue_limits.queue_name);
    return null;
  end if;
  insert into flowlane.queue_limits as l (queue_name, concurrency, rate_limit, rate_per, tokens, refilled_at)
  values (set_queue_limits.queue_name, set_queue_limits.concurrency, set_queue_limits.rate_limit,
          set_queue_limits.rate_per, coalesce(set_queue_limits.rate_limit, 0), flowlane._clock_timestamp())
  on conflict on constraint queue_limits_pkey do update
    set concurrency = excluded.concurrency, rate_limit = excluded.rate_limit, rate_per = excluded.rate_per,
        tokens = least(l.tokens, coalesce(excluded.rate_limit, 0)), updated_at = flowlane._now()
    where (l.concurrency, l.rate_limit, l.rate_per)
          is distinct from (excluded.concurrency, excluded.rate_limit, excluded.rate_per)
  returning * into v_row;
  if v_row.queue_name is null then  -- unchanged: applying the same file again writes nothing
    select * into v_row from flowlane.queue_limits l where l.queue_name = set_queue_limits.queue_name;
  else
    perform flowlane._wake_queue(set_queue_limits.queue_name);
  end if;
  return v_row;
end;
$$;

-- what a compiled queue file ends with: the limits of queues it does not declare are removed
-- and their archive is on again (those queues behave as undeclared); returns the names of
-- those that lost limits
create function flowlane.keep_only_queue_limits(queue_names text[]) returns text[]
language plpgsql volatile
set search_path = ''
as $$
declare
  v_deleted text[];
begin
  with gone as (
    delete from flowlane.queue_limits l where l.queue_name <> all (coalesce(queue_names, '{}'))
    returning l.queue_name
  ) select coalesce(array_agg(g.queue_name order by g.queue_name), '{}') into v_deleted from gone g;
  perform flowlane._wake_queue(d) from unnest(v_deleted) d;
  update flowlane.queues q set archive_messages = true
   where not q.archive_messages and q.queue_name <> all (coalesce(queue_names, '{}'));
  return v_deleted;
end;
$$;

-- workers waiting on a queue look again (its insert channel, as a new message would)
create function flowlane._wake_queue(p_queue text) returns void
language sql volatile
set search_path = ''
as $$
  select pg_notify('pgmq.' || pgmq.format_table_name(q.pgmq_queue_name, 'q') || '.INSERT', null)
  from flowlane.queues q where q.queue_name = p_queue
$$;

-- the rate limit's bucket at p_at: tokens (at most rate_limit: the burst), refilled at
-- rate_limit per rate_per seconds since refilled_at
create function flowlane._bucket_tokens(p_limits flowlane.queue_limits, p_at timestamptz) returns double precision
language sql immutable
set search_path = ''
as $$
  select least(p_limits.rate_limit::double precision,
               p_limits.tokens + greatest(0, extract(epoch from p_at - p_limits.refilled_at))::double precision
                                 * p_limits.rate_limit / p_limits.rate_per)
$$;

-- seconds until the bucket holds a whole token again
create function flowlane._next_start_in(p_limits flowlane.queue_limits, p_at timestamptz) returns double precision
language sql immutable
set search_path = ''
as $$
  select greatest(0, 1 - flowlane._bucket_tokens(p_limits, p_at)) * p_limits.rate_per / p_limits.rate_limit
$$;

-- == what waits, for display ==================================================================

-- every queue with limits: its limits, started tasks, bucket, and (when it holds claims back
-- now) what it waits for
create function flowlane.queue_flow_control()
returns table (queue_name text, concurrency int, started bigint, rate_limit int, rate_per int,
               tokens double precision, next_start_in double precision, waiting_for text)
language sql stable
set search_path = ''
as $$
  select l.queue_name, l.concurrency, c.started, l.rate_limit, l.rate_per,
         case when l.rate_limit is not null then flowlane._bucket_tokens(l, flowlane._clock_timestamp()) end,
         case when l.rate_limit is not null then flowlane._next_start_in(l, flowlane._clock_timestamp()) end,
         case when l.concurrency is not null and c.started >= l.concurrency
                then format('queue concurrency %s: %s of %s started', l.queue_name, c.started, l.concurrency)
              when l.rate_limit is not null and flowlane._bucket_tokens(l, flowlane._clock_timestamp()) < 1
                then format('rate limit %s: next start in %s s', l.queue_name,
                            round(flowlane._next_start_in(l, flowlane._clock_timestamp())::numeric, 1))
         end
  from flowlane.queue_limits l
  cross join lateral (select count(*) as started from flowlane.step_tasks t
                      where t.queue_name = l.queue_name and t.status = 'started') c
  order by l.queue_name
$$;

-- what each of the given runs, and each of their tasks, waits for: held runs (flow
-- concurrency, with their place in line), delayed runs, held tasks (step concurrency) and
-- queued tasks on a queue at its concurrency or rate limit. One row per waiting thing;
-- step_slug and task_index are null for the run itself.
create function flowlane.run_holds(run_ids uuid[])
returns table (run_id uuid, step_slug text, task_index int, waiting_for text, place bigint)
language sql stable
set search_path = ''
as $$
  select r.run_id, null::text, null::int,
         format('concurrency %s: %s of %s started',
                flowlane._key_label(r.flow_slug, f.opt_concurrency_key, r.concurrency_key),
                (select count(*) from flowlane.runs s
                 where s.flow_slug = r.flow_slug and s.concurrency_key = r.concurrency_key and s.status = 'started'),
                coalesce(f.opt_concurrency_limit::text, 'unlimited')),
         (select count(*) from flowlane.runs h
          where h.flow_slug = r.flow_slug and h.concurrency_key = r.concurrency_key and h.status = 'waiting'
            and h.hold_seq is not null and h.hold_seq <= r.hold_seq)
  from flowlane.runs r join flowlane.flows f on f.flow_slug = r.flow_slug
  where r.run_id = any (run_ids) and r.status = 'waiting' and r.hold_seq is not null
  union all
  select r.run_id, null, null,
         case when r.debounce_key is null then format('start at %s', r.start_at)
              else format('debounce %s: starts in %s s unless another arrives',
                          flowlane._key_label(r.flow_slug, f.opt_debounce_key, r.debounce_key),
                          greatest(round(extract(epoch from r.start_at - flowlane._now()), 1), 0)) end, null
  from flowlane.runs r join flowlane.flows f on f.flow_slug = r.flow_slug
  where r.run_id = any (run_ids) and r.status = 'waiting' and r.hold_seq is null
  union all
  select h.run_id, h.step_slug, h.task_index,
         format('step concurrency %s: %s of %s started',
                flowlane._key_label(h.step_slug, s.opt_concurrency_key, h.concurrency_key),
                (select count(*) from flowlane.step_slots x
                 where x.flow_slug = h.flow_slug and x.step_slug = h.step_slug and x.concurrency_key = h.concurrency_key),
                coalesce(s.opt_concurrency_limit::text, 'unlimited')),
         (select count(*) from flowlane.held_tasks y
          where y.flow_slug = h.flow_slug and y.step_slug = h.step_slug and y.concurrency_key = h.concurrency_key
            and y.hold_seq <= h.hold_seq)
  from flowlane.held_tasks h join flowlane.steps s on s.flow_slug = h.flow_slug and s.step_slug = h.step_slug
  join flowlane.runs hr on hr.run_id = h.run_id and hr.status = 'started'
  where h.run_id = any (run_ids)
  union all
  select t.run_id, t.step_slug, t.task_index, q.waiting_for, null
  from flowlane.step_tasks t
  join flowlane.queue_flow_control() q on q.queue_name = t.queue_name and q.waiting_for is not null
  where t.run_id = any (run_ids) and t.status = 'queued'
  order by 1, 2 nulls first, 3
$$;

-- == the maintenance tick's sweep ==============================================================

-- held runs and tasks whose key has room begin (the transaction that freed the slot begins
-- them already; this catches a slot freed while its next run was locked by another
-- transaction, or limits raised by hand); returns how many runs and tasks began
create function flowlane._release_held(p_now timestamptz) returns int
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_group record;
  v_n int := 0;
begin
  for v_group in
    select r.flow_slug, array_agg(distinct r.concurrency_key) as keys
    from flowlane.runs r
    join flowlane.flows f on f.flow_slug = r.flow_slug
    where r.status = 'waiting' and r.hold_seq is not null
      and (f.opt_concurrency_limit is null
           or f.opt_concurrency_limit > (select count(*) from flowlane.runs s
                                         where s.flow_slug = r.flow_slug and s.concurrency_key = r.concurrency_key
                                           and s.status = 'started'))
    group by r.flow_slug order by r.flow_slug
  loop
    v_n := v_n + cardinality(flowlane._begin_held_runs(v_group.flow_slug, v_group.keys));
  end loop;
  for v_group in
    select h.flow_slug, h.step_slug, array_agg(distinct h.concurrency_key) as keys
    from flowlane.held_tasks h
    join flowlane.steps s on s.flow_slug = h.flow_slug and s.step_slug = h.step_slug
    where s.opt_concurrency_limit is null
       or s.opt_concurrency_limit > (select count(*) from flowlane.step_slots x
                                     where x.flow_slug = h.flow_slug and x.step_slug = h.step_slug
                                       and x.concurrency_key = h.concurrency_key)
       or not exists (select 1 from flowlane.runs r where r.run_id = h.run_id and r.status = 'started')
    group by 1, 2 order by 1, 2
  loop
    v_n := v_n + flowlane._release_held_tasks(v_group.flow_slug, v_group.step_slug, v_group.keys);
  end loop;
  return v_n;
end;
$$;
