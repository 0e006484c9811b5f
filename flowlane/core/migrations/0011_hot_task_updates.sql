-- flowlane SQL Core 0011: HOT updates of step_tasks on the hot path (docs/runtime.md,
-- "Throughput"; figures in benchmarks/RESULTS.md, "HOT task updates").
--
-- PostgreSQL updates a row in place on its page (HOT: no new index entries) only when no
-- indexed column changes, partial-index predicates included. A claim set status and
-- started_at, which step_tasks_started_idx (started_at where status = 'started') and
-- step_tasks_active_idx (run_id, step_slug where status in ('queued', 'started')) index: no
-- claim was HOT, each wrote four index entries into tables that grow with all history
-- (measured with benchmarks/engine_throughput.py: 0 HOT updates of step_tasks).
--
--   * started tasks are listed in flowlane.task_leases (a row inserted when a task becomes
--     started, deleted when it stops being started; one trigger keeps it, whatever function
--     changes the status). requeue_stalled_tasks follows this table: its cost follows the work
--     in flight, not the history, as the partial index did.
--   * the two partial indexes go. Every remaining reader of active tasks filters on a run
--     (the primary key's prefix (run_id, step_slug) serves it) or reads a run's tasks anyway;
--     coverage and drain_status, which counted by queue or flow, now start from the started
--     runs (end of this file).
--   * what a claim changes (status, started_at, attempts_count, last_worker_id) and a lease
--     renewal or a retry (lease_renewed_at, status, error_message) is then in no index: these
--     updates are HOT. A completion still sets completed_at, which the console's throughput
--     chart indexes (0008, step_tasks_completed_idx): completions stay non-HOT, on purpose.
--
-- Fencing is unchanged (step_tasks.last_worker_id and attempts_count are still the owner);
-- the stall deadline is still 0006's _stall_deadline of the task row.
--
-- Also: claim_tasks reads its messages with the served pairs' longest lease (0009) and no
-- longer sets their visibility again at the claim (one pgmq.set_vt per claim saved);
-- start_tasks, whose caller read with an unknown visibility timeout, still sets it.

-- ---------------------------------------------------------------------------
-- leases: the started tasks
-- ---------------------------------------------------------------------------

create table flowlane.task_leases (
  run_id uuid not null,
  step_slug text not null,
  task_index int not null,
  started_at timestamptz not null,  -- the claim (a copy of step_tasks.started_at): a cheap first filter
  primary key (run_id, step_slug, task_index)
) with (
  -- every row is inserted and deleted within a task's life: vacuum often and cheaply
  -- (0010's settings for PGMQ's queue tables)
  autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_cost_delay = 0
);

comment on table flowlane.task_leases is
  'the started tasks (kept by trigger from step_tasks.status): what stalled recovery scans';

create function flowlane._track_lease() returns trigger
language plpgsql volatile
set search_path = ''
as $$
begin
  if tg_op <> 'INSERT' and old.status = 'started' then
    delete from flowlane.task_leases l
     where l.run_id = old.run_id and l.step_slug = old.step_slug and l.task_index = old.task_index;
  end if;
  if tg_op <> 'DELETE' and new.status = 'started' then
    insert into flowlane.task_leases (run_id, step_slug, task_index, started_at)
    values (new.run_id, new.step_slug, new.task_index, new.started_at);
  end if;
  return null;
end;
$$;

-- the WHEN clauses keep the trigger off every update that does not start or end a lease
create trigger step_tasks_lease_on_insert
  after insert on flowlane.step_tasks
  for each row when (new.status = 'started')
  execute function flowlane._track_lease();
create trigger step_tasks_lease_on_update
  after update of status, started_at on flowlane.step_tasks
  for each row when ((old.status = 'started' or new.status = 'started')
                     and (old.status is distinct from new.status or old.started_at is distinct from new.started_at))
  execute function flowlane._track_lease();
create trigger step_tasks_lease_on_delete
  after delete on flowlane.step_tasks
  for each row when (old.status = 'started')
  execute function flowlane._track_lease();

-- tasks started before this migration keep their lease (and their stall deadline)
insert into flowlane.task_leases (run_id, step_slug, task_index, started_at)
select t.run_id, t.step_slug, t.task_index, t.started_at
from flowlane.step_tasks t
where t.status = 'started'
order by 1, 2, 3;

-- room on every page for one more version of each of its rows: a claim of a batch updates
-- neighbouring rows (queued together) in one go, and at 0009's 80 % only the first few
-- found room on their page (benchmarks/engine_throughput.py: 17 % of the updates HOT at 80,
-- 47 % at 50, of at most 50: completions are not HOT). The price: finished tasks are stored
-- at half-full pages too.
alter table flowlane.step_tasks set (fillfactor = 50);

drop index flowlane.step_tasks_started_idx;
drop index flowlane.step_tasks_active_idx;

-- 0006's recovery, the candidates taken from the leases
create or replace function flowlane.requeue_stalled_tasks() returns int
language plpgsql volatile
set search_path = ''
as $$
declare
  v_cand record;
  v_task flowlane.step_tasks;
  v_requeued flowlane.step_tasks[] := '{}';
  v_handled int := 0;
begin
  for v_cand in
    select t.run_id, t.step_slug, t.task_index, coalesce(s.opt_timeout, f.opt_timeout) as timeout,
           coalesce(s.opt_max_attempts, f.opt_max_attempts) as max_attempts
    from flowlane.task_leases l
    join flowlane.step_tasks t on t.run_id = l.run_id and t.step_slug = l.step_slug and t.task_index = l.task_index
    join flowlane.steps s on s.flow_slug = t.flow_slug and s.step_slug = t.step_slug
    join flowlane.flows f on f.flow_slug = t.flow_slug
    where l.started_at < now() - make_interval(secs => coalesce(s.opt_timeout, f.opt_timeout) + 30)
      and t.status = 'started'
      and flowlane._stall_deadline(t, coalesce(s.opt_timeout, f.opt_timeout)) < now()
    order by t.run_id, t.step_slug, t.task_index
  loop
    -- lock order run -> step state -> task; skip what another transaction holds
    perform 1 from flowlane.runs r where r.run_id = v_cand.run_id and r.status = 'started'
      for update skip locked;
    continue when not found;
    perform 1 from flowlane.step_states ss
      where ss.run_id = v_cand.run_id and ss.step_slug = v_cand.step_slug and ss.status = 'started'
      for update skip locked;
    continue when not found;
    select * into v_task from flowlane.step_tasks t
     where t.run_id = v_cand.run_id and t.step_slug = v_cand.step_slug and t.task_index = v_cand.task_index
       and t.status = 'started' and flowlane._stall_deadline(t, v_cand.timeout) < now()
       for update skip locked;
    continue when not found;
    v_handled := v_handled + 1;
    if v_task.attempts_count >= v_cand.max_attempts then
      perform flowlane._exhaust_task(v_task,
        format('no result within %s s, %s attempts', v_cand.timeout, v_task.attempts_count));
    else
      update flowlane.step_tasks t
         set status = 'queued', started_at = null, last_worker_id = null, lease_renewed_at = null,
             requeued_count = t.requeued_count + 1, last_requeued_at = now(),
             error_message = format('no result within %s s (attempt %s)', v_cand.timeout, v_task.attempts_count)
       where t.run_id = v_task.run_id and t.step_slug = v_task.step_slug and t.task_index = v_task.task_index
      returning * into v_task;
      v_requeued := v_requeued || v_task;
    end if;
  end loop;
  perform flowlane._set_tasks_vt(v_requeued, array_fill(0, array[cardinality(v_requeued)]));
  return v_handled;
end;
$$;

-- ---------------------------------------------------------------------------
-- claims without a second visibility update
-- ---------------------------------------------------------------------------

-- 0005's start_tasks; p_read_vt: the visibility timeout the messages were read with
-- (claim_tasks), or null (the caller's own read: unknown). A claimed task's message must
-- stay hidden for its effective timeout + 2 s; it is set only where the read did not.
create function flowlane._start_tasks(p_queue text, p_msg_ids bigint[], p_worker_id uuid, p_pairs jsonb,
                                      p_read_vt int)
returns setof flowlane.claim_record
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in 0009's header
as $$
declare
  v_ids bigint[];
  v_batch flowlane._claim_item[];
  v_duplicates flowlane.step_tasks[];
  v_claimed flowlane.step_tasks[];
  v_hide flowlane.step_tasks[];
  v_offsets int[];
  v_updated int;
begin
  perform flowlane._check_queue_argument('start_tasks', p_queue);
  if p_worker_id is null then
    raise exception 'start_tasks: worker_id is required (it fences the results of the claimed tasks)'
      using errcode = '22023';
  end if;
  if p_msg_ids is null or array_position(p_msg_ids, null) is not null then
    raise exception 'start_tasks: msg_ids must be an array of message ids without nulls' using errcode = '22023';
  end if;
  perform flowlane._pairs(p_pairs);  -- validates before anything is locked
  v_ids := array(select distinct m from unnest(p_msg_ids) m order by m);
  if cardinality(v_ids) = 0 then
    return;
  end if;

  -- lock order: runs (shared: claims do not block each other), then the batch's tasks
  perform 1 from flowlane.runs r
  where r.run_id in (select t.run_id from flowlane.step_tasks t
                     where t.queue_name = p_queue and t.message_id = any (v_ids))
  order by r.run_id
  for share;
  perform 1 from flowlane.step_tasks t
  where t.queue_name = p_queue and t.message_id = any (v_ids)
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
  left join flowlane._pairs(p_pairs) p on p.flow_slug = t.flow_slug and p.step_slug = t.step_slug
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
                       flowlane._stall_deadline(c.task, flowlane._effective_timeout((c.task).flow_slug, (c.task).step_slug))
                       - clock_timestamp()))::int) order by c.msg_id)
      into v_duplicates, v_offsets
    from unnest(v_batch) c where (c.task).status = 'started';
    perform flowlane._set_tasks_vt(v_duplicates, v_offsets);
  end if;

  with claimed as (
    update flowlane.step_tasks t
       set status = 'started', attempts_count = t.attempts_count + 1, started_at = now(),
           last_worker_id = p_worker_id
      from unnest(v_batch) c
     where c.claimable and t.run_id = (c.task).run_id and t.step_slug = (c.task).step_slug
       and t.task_index = (c.task).task_index
    returning t
  ) select coalesce(array_agg(c.t order by (c.t).message_id), '{}') into v_claimed from claimed c;

  if cardinality(v_claimed) = 0 then
    return;
  end if;
  select coalesce(array_agg(h.task order by h.i), '{}'), coalesce(array_agg(h.lease order by h.i), '{}')
    into v_hide, v_offsets
  from (select i, v_claimed[i] as task,
               flowlane._effective_timeout((v_claimed[i]).flow_slug, (v_claimed[i]).step_slug) + 2 as lease
        from generate_subscripts(v_claimed, 1) as i) h
  where p_read_vt is null or h.lease > p_read_vt;
  if cardinality(v_hide) > 0 then
    v_updated := flowlane._set_tasks_vt(v_hide, v_offsets);
    if v_updated <> cardinality(v_hide) then
      raise exception 'claim aborted: % tasks claimed but % queue messages got their visibility extended',
        cardinality(v_hide), v_updated
        using errcode = '40001', hint = 'a task''s message is missing from its queue; the claim was rolled back';
    end if;
  end if;

  return query
    select 'claimed', (v_claimed[i]).flow_slug, (v_claimed[i]).step_slug, (v_claimed[i]).queue_name,
           (v_claimed[i]).run_id, (v_claimed[i]).task_index,
           flowlane._task_input((v_claimed[i]).run_id, (v_claimed[i]).step_slug, (v_claimed[i]).task_index),
           r.input, (v_claimed[i]).attempts_count, (v_claimed[i]).message_id
    from generate_subscripts(v_claimed, 1) as i
    join flowlane.runs r on r.run_id = (v_claimed[i]).run_id
    order by i;
end;
$$;

create or replace function flowlane.start_tasks(queue_name text, msg_ids bigint[], worker_id uuid, supported_pairs jsonb)
returns setof flowlane.claim_record
language sql volatile
set search_path = ''
as $$
  select * from flowlane._start_tasks(queue_name, msg_ids, worker_id, supported_pairs, null)
$$;

-- 0009's claim_tasks; the claim keeps the visibility the read gave (see _start_tasks)
create or replace function flowlane.claim_tasks(queue_name text, qty int, worker_id uuid, supported_pairs jsonb)
returns setof flowlane.claim_record
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in 0009's header
as $$
declare
  v_lease int;
  v_ids bigint[];
  v_later bigint[];
begin
  perform flowlane._check_queue_argument('claim_tasks', claim_tasks.queue_name);
  if qty is null or qty < 1 then
    raise exception 'claim_tasks: qty must be at least 1' using errcode = '22023';
  end if;
  select coalesce(max(coalesce(s.opt_timeout, f.opt_timeout)), 0) + 2 into v_lease
  from flowlane._pairs(supported_pairs) p
  join flowlane.steps s on s.flow_slug = p.flow_slug and s.step_slug = p.step_slug
  join flowlane.flows f on f.flow_slug = s.flow_slug;
  select coalesce(array_agg(m.msg_id) filter (where m.enqueued_at <= now()), '{}'),
         coalesce(array_agg(m.msg_id) filter (where m.enqueued_at > now()), '{}')
    into v_ids, v_later
  from pgmq.read(claim_tasks.queue_name, v_lease, qty) m;
  if cardinality(v_later) > 0 then
    -- enqueued by a transaction that committed after this one began (the read takes a
    -- new snapshot): a claim now would start the task before it was queued. Visible
    -- again at once; the next poll, a new transaction, claims it.
    perform pgmq.set_vt(claim_tasks.queue_name, v_later, 0);
  end if;
  if cardinality(v_ids) = 0 then
    return;
  end if;
  return query
    with c as (
      select * from flowlane._start_tasks(claim_tasks.queue_name, v_ids, claim_tasks.worker_id, supported_pairs,
                                          v_lease)
    )
    select c.outcome, c.flow_slug, c.step_slug, c.queue_name, c.run_id, c.task_index, c.input,
           case when row_number() over (partition by c.run_id order by c.msg_id) = 1 then c.flow_input end,
           c.attempt, c.msg_id
    from c
    union all
    -- a refused batch: the other messages read, handed back visible with it (ids only)
    select 'handed_back', null, null, claim_tasks.queue_name, null, null, null, null, null, m.id
    from unnest(v_ids) as m (id)
    where exists (select 1 from c where c.outcome = 'unsupported')
      and not exists (select 1 from c where c.msg_id = m.id)
    order by 10;
end;
$$;

-- ---------------------------------------------------------------------------
-- plans: generic, made once per session
-- ---------------------------------------------------------------------------

-- PL/pgSQL plans a statement with parameters afresh on each call while the planner
-- estimates a custom plan cheaper than the generic one. The three lookups of
-- _lock_and_classify always were: replanned on every complete_task, 0.45 ms of its 2.5 ms
-- of CPU (pg_stat_statements.track_planning). Their generic plans are safe: each joins the
-- batch's items to runs, step_states and step_tasks on full primary keys plus
-- run_id = any (batch runs), and every index of those tables that such a statement can use
-- (enable_seqscan = off, 0009) leads with run_id, so a generic plan reaches only the
-- batch's rows. Not so elsewhere: a generic plan of _steps_done's or start_tasks'
-- statements may scan a flow's or a queue's rows through step_states_flow_idx or
-- step_tasks_queue_message_unique (measured: 1 ms instead of 0.2 ms per task over 5,000
-- runs), so they keep PostgreSQL's choice.
alter function flowlane._lock_and_classify(flowlane._result_item[]) set plan_cache_mode = force_generic_plan;

-- ---------------------------------------------------------------------------
-- plans that follow the batch, whatever the statistics
-- ---------------------------------------------------------------------------

-- After five calls PL/pgSQL may keep a statement's generic plan. Planned before ANALYZE
-- had seen the tables (a worker's first calls after a burst of starts), two statements of
-- 0009 joined step_states to steps on flow_slug and read all of a flow's states through
-- step_states_flow_idx on every call: 1.1 to 3 ms per task instead of 0.2, growing with the
-- table (measured over 5,000 and 10,000 queued one-step runs). Both now reach step_states
-- only by (run_id, step_slug); the step's type comes from the batch's side of the join.
-- (start_tasks' classification above likewise looks tasks up by queue and message id.)

create or replace function flowlane._complete_batch(p_items flowlane._result_item[])
returns setof flowlane.step_tasks
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in the header
as $$
declare
  v_classes flowlane._result_class[];
  v_violations flowlane._result_class[];
  v_sequential uuid[];
  v_class flowlane._result_class;
  v_task flowlane.step_tasks;
  v_done flowlane.step_tasks[];
  v_steps flowlane.step_states[];
  v_runs uuid[] := array(select distinct i.run_id from unnest(p_items) i);
begin
  v_classes := flowlane._lock_and_classify(p_items);

  -- a single step feeding a map must output an array: such an item fails its run
  select coalesce(array_agg(c order by (c.task).run_id, (c.task).step_slug, (c.task).task_index), '{}')
    into v_violations
  from unnest(v_classes) c
  join flowlane.steps s on s.flow_slug = (c.task).flow_slug and s.step_slug = (c.task).step_slug
  where c.actionable and s.step_type = 'single'
    and jsonb_typeof(coalesce((c.item).output, 'null'::jsonb)) <> 'array'
    and exists (select 1 from flowlane.deps d
                join flowlane.steps ch on ch.flow_slug = d.flow_slug and ch.step_slug = d.step_slug
                                       and ch.step_type = 'map'
                join flowlane.step_states cs on cs.run_id = (c.task).run_id and cs.step_slug = d.step_slug
                where d.flow_slug = s.flow_slug and d.dep_slug = s.step_slug
                  and cs.status = 'created' and cs.initial_tasks is null);

  v_sequential := flowlane._sequential_runs(v_classes, v_violations);
  for v_class in
    select c.* from unnest(v_classes) c
    where c.actionable and (c.task).run_id = any (v_sequential)
    order by (c.task).run_id, (c.task).step_slug, (c.task).task_index
  loop
    perform flowlane._complete_batch(array[v_class.item]);
  end loop;

  -- the rest: at most one violation per run, and it is the run's only actionable item
  for v_class in
    select c.* from unnest(v_violations) c where not (c.task).run_id = any (v_sequential)
  loop
    update flowlane.step_tasks t
       set status = 'failed', failed_at = now(), output = (v_class.item).output,
           error_message = format('[TYPE_VIOLATION] step %s feeds map step %s and must output a JSON array, got %s',
             (v_class.task).step_slug,
             (select d.step_slug from flowlane.deps d
              join flowlane.steps ch on ch.flow_slug = d.flow_slug and ch.step_slug = d.step_slug and ch.step_type = 'map'
              join flowlane.step_states cs on cs.run_id = (v_class.task).run_id and cs.step_slug = d.step_slug
              where d.flow_slug = (v_class.task).flow_slug and d.dep_slug = (v_class.task).step_slug
                and cs.status = 'created' and cs.initial_tasks is null
              order by d.step_slug limit 1),
             jsonb_typeof(coalesce((v_class.item).output, 'null'::jsonb)))
     where t.run_id = (v_class.task).run_id and t.step_slug = (v_class.task).step_slug
       and t.task_index = (v_class.task).task_index
    returning * into v_task;
    perform flowlane._archive_tasks(array[v_task]);
    update flowlane.step_states ss
       set status = 'failed', failed_at = now(), remaining_tasks = null, error_message = v_task.error_message
     where ss.run_id = v_task.run_id and ss.step_slug = v_task.step_slug;
    perform flowlane._fail_run(v_task.run_id, v_task.error_message);
  end loop;

  -- completions: one statement per table
  with done as (
    update flowlane.step_tasks t
       set status = 'completed', completed_at = now(), output = (c.item).output
      from unnest(v_classes) c
     where c.actionable and not (c.task).run_id = any (v_sequential)
       and not exists (select 1 from unnest(v_violations) v where (v.task).run_id = (c.task).run_id)
       and t.run_id = (c.task).run_id and t.step_slug = (c.task).step_slug and t.task_index = (c.task).task_index
       and t.run_id = any (v_runs)
    returning t
  ) select coalesce(array_agg(d.t), '{}') into v_done from done d;
  if cardinality(v_done) = 0 then
    return query select * from flowlane._batch_rows(p_items);
    return;
  end if;
  perform flowlane._archive_tasks(v_done);

  -- step states: remaining tasks and, for the last task, completion with the step output (one update)
  -- (the step's type joins the batch's counts, not step_states: joined to step_states on
  -- flow_slug, a generic plan read every state of the flow through step_states_flow_idx)
  with counts as (
    select d.run_id, d.step_slug, st.step_type, count(*)::int as n, (array_agg(d.output))[1] as output
    from unnest(v_done) d
    join flowlane.steps st on st.flow_slug = d.flow_slug and st.step_slug = d.step_slug
    group by 1, 2, 3
  ), updated as (
    update flowlane.step_states ss
       set remaining_tasks = ss.remaining_tasks - c.n,
           status = case when ss.remaining_tasks = c.n then 'completed' else ss.status end,
           completed_at = case when ss.remaining_tasks = c.n then now() end,
           output = case when ss.remaining_tasks <> c.n then null
                         when c.step_type = 'single' then c.output
                         else (select coalesce(jsonb_agg(t.output order by t.task_index), '[]'::jsonb)
                               from flowlane.step_tasks t
                               where t.run_id = ss.run_id and t.step_slug = ss.step_slug) end
      from counts c
     where ss.run_id = c.run_id and ss.step_slug = c.step_slug and ss.run_id = any (v_runs)
    returning ss
  ) select coalesce(array_agg(u.ss) filter (where (u.ss).status = 'completed'), '{}') into v_steps from updated u;
  if cardinality(v_steps) > 0 then
    perform flowlane._steps_done(v_steps);
  end if;
  return query select * from flowlane._batch_rows(p_items);
end;
$$;


create or replace function flowlane._steps_done(p_steps flowlane.step_states[]) returns void
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in the header
as $$
declare
  v_runs uuid[] := array(select distinct s.run_id from unnest(p_steps) s order by 1);
begin
  update flowlane.runs r set remaining_steps = r.remaining_steps - c.n
    from (select s.run_id, count(*)::int as n from unnest(p_steps) s group by 1) c
   where r.run_id = c.run_id and r.run_id = any (v_runs);
  update flowlane.step_states cs
     set remaining_deps = cs.remaining_deps - x.n,
         initial_tasks = case
           when cs.status <> 'created' or cs.initial_tasks is not null or cst.step_type <> 'map' then cs.initial_tasks
           when jsonb_typeof(x.output) = 'array' then jsonb_array_length(x.output)
           else cs.initial_tasks end
    from (select p.run_id, d.step_slug, p.flow_slug, count(*)::int as n, (array_agg(p.output))[1] as output
          from unnest(p_steps) p
          join flowlane.deps d on d.flow_slug = p.flow_slug and d.dep_slug = p.step_slug
          group by 1, 2, 3) x,
         flowlane.steps cst
   where cs.run_id = x.run_id and cs.step_slug = x.step_slug and cs.run_id = any (v_runs)
     and cst.flow_slug = x.flow_slug and cst.step_slug = x.step_slug;
  perform flowlane._progress_runs(v_runs);
end;
$$;


-- ---------------------------------------------------------------------------
-- readers of active tasks reach them through their runs
-- ---------------------------------------------------------------------------

-- 0005's coverage and drain_status counted a queue's or a flow's queued and started tasks,
-- which step_tasks_active_idx served. A task is queued or started only while its run is
-- started (failing or cancelling a run cancels them; a run completes once every task is
-- done), so both now start from the started runs (runs_status_idx) and reach the tasks by
-- the primary key's run_id: their cost follows the runs in flight, not the history.

create or replace function flowlane.coverage(queue_name text, supported_pairs jsonb)
returns table (flow_slug text, step_slug text, sources text[])
language plpgsql stable
set search_path = ''
as $$
begin
  perform flowlane._check_queue_argument('coverage', coverage.queue_name);
  return query
  with supported as (
    select * from flowlane._pairs(supported_pairs)
  ), required as (
    select s.flow_slug, s.step_slug, 'active version' as source
    from flowlane.steps s
    where s.queue_name = coverage.queue_name and s.flow_slug in (select flowlane._active_targets())
    union all
    select distinct ss.flow_slug, ss.step_slug, 'started run'
    from flowlane.runs r
    join flowlane.step_states ss on ss.run_id = r.run_id and ss.status in ('created', 'started')
    join flowlane.steps s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
    where r.status = 'started' and s.queue_name = coverage.queue_name
    union all
    select distinct t.flow_slug, t.step_slug, 'task on the queue'
    from flowlane.runs r
    join flowlane.step_tasks t on t.run_id = r.run_id
    where r.status = 'started' and t.queue_name = coverage.queue_name and t.status in ('queued', 'started')
  )
  select r.flow_slug, r.step_slug, array_agg(distinct r.source order by r.source)
  from required r
  where not exists (select 1 from supported p where p.flow_slug = r.flow_slug and p.step_slug = r.step_slug)
  group by r.flow_slug, r.step_slug
  order by r.flow_slug, r.step_slug;
end;
$$;

create or replace function flowlane.drain_status()
returns table (alias text, flow_slug text, started_runs bigint, active_tasks bigint, drained boolean)
language sql stable
set search_path = ''
as $$
  select a.alias, v.flow_slug, x.runs, x.tasks, x.runs = 0 and x.tasks = 0
  from flowlane.aliases a
  cross join lateral unnest(a.draining) as v (flow_slug)
  cross join lateral (
    select (select count(*) from flowlane.runs r where r.flow_slug = v.flow_slug and r.status = 'started') as runs,
           (select count(*) from flowlane.runs r
              join flowlane.step_tasks t on t.run_id = r.run_id
             where r.flow_slug = v.flow_slug and r.status = 'started'
               and t.status in ('queued', 'started')) as tasks
  ) x
  order by a.alias, v.flow_slug
$$;
