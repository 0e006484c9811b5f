-- flowlane SQL Core 0013: claims and completions whose cost follows the batch (docs/runtime.md,
-- "Throughput"; figures in benchmarks/RESULTS.md, "0013").
--
-- Measured with pg_stat_statements (track = all) and auto_explain over a worker's loop
-- (claim_tasks + complete_tasks, batches of 50, a backlog of queued one-step runs):
--
--   * a claim returned its tasks by joining runs to each task's subscript of the claimed
--     array: the planner could not use the key and hashed every run of the table, once per
--     claim. It now joins the unnested array with run_id = any (the batch's runs), reads the
--     claimed tasks' inputs in one statement (_claimed_inputs, 0001's _task_input per task
--     before) and looks the leases up once per (flow, step).
--   * a run's completion scanned runs_status_idx over every started run (the planner's
--     pick for status = 'started' and run_id = any (...)), and updated each run a second
--     time in the transaction, which also re-ran the foreign-key check on its flow. The
--     last step's completion now completes its run in the same update that counts the
--     steps down (_steps_done). runs_status_idx gives way to two partial indexes:
--     runs_in_flight_idx (run_id, of started runs), so that "status = 'started' and run_id =
--     any (...)" has a key on every index the planner may pick, and the started runs alone
--     (drain_status, coverage, stuck_runs) are still one index apart; runs_ended_idx
--     (status, started_at desc, run_id, of the other runs) for the console's runs list
--     filtered by status, which it now pages through in index order.
--   * started tasks' leases (0011) were kept by a row trigger: one PL/pgSQL call and one
--     statement per task, on every claim and every completion. Statement triggers with
--     transition tables keep them now: one insert or delete per statement.
--   * the outputs of the runs a batch completes are read in one statement (_run_outputs), and
--     flowlane_run_finished is notified from one trigger call per statement (same channel,
--     same payload: one notification per run).
--   * updates that complete a task or a step were never HOT: step_tasks_completed_idx
--     (0008, the console's throughput chart) indexes completed_at, and
--     step_states_ready_idx's predicate reads status. The chart's index is now BRIN
--     (PostgreSQL 16+ updates rows in place when only summarizing indexes' columns change);
--     the ready-steps index goes, since every reader of ready steps filters on run_id, the
--     primary key's prefix; step_states gets step_tasks' fillfactor (50).
--
-- The three new indexes are built plainly (a migration runs in one transaction): on a large
-- database the upgrade blocks writes to runs and step_tasks while they build, as 0008 did.
-- The new fillfactor applies to pages written from now on.

-- ---------------------------------------------------------------------------
-- leases: one statement per statement
-- ---------------------------------------------------------------------------

-- 0011's _track_lease per row; the same rule per statement: a task has a lease while it is
-- started, renewed (deleted and inserted again) when a started task gets a new started_at
create function flowlane._track_leases() returns trigger
language plpgsql volatile
set search_path = ''
as $$
begin
  -- (each statement names only the transition tables its event has)
  if tg_op = 'INSERT' then
    insert into flowlane.task_leases (run_id, step_slug, task_index, started_at)
    select n.run_id, n.step_slug, n.task_index, n.started_at
    from new_tasks n where n.status = 'started' order by 1, 2, 3;
  elsif tg_op = 'DELETE' then
    delete from flowlane.task_leases l
     using old_tasks o
     where o.status = 'started'
       and l.run_id = o.run_id and l.step_slug = o.step_slug and l.task_index = o.task_index;
  else
    delete from flowlane.task_leases l
     using old_tasks o join new_tasks n
           on n.run_id = o.run_id and n.step_slug = o.step_slug and n.task_index = o.task_index
     where o.status = 'started'
       and (n.status <> 'started' or n.started_at is distinct from o.started_at)
       and l.run_id = o.run_id and l.step_slug = o.step_slug and l.task_index = o.task_index;
    insert into flowlane.task_leases (run_id, step_slug, task_index, started_at)
    select n.run_id, n.step_slug, n.task_index, n.started_at
    from new_tasks n join old_tasks o
         on o.run_id = n.run_id and o.step_slug = n.step_slug and o.task_index = n.task_index
    where n.status = 'started'
      and (o.status <> 'started' or o.started_at is distinct from n.started_at)
    order by 1, 2, 3;
  end if;
  return null;
end;
$$;

drop trigger step_tasks_lease_on_insert on flowlane.step_tasks;
drop trigger step_tasks_lease_on_update on flowlane.step_tasks;
drop trigger step_tasks_lease_on_delete on flowlane.step_tasks;
drop function flowlane._track_lease();

create trigger step_tasks_leases_on_insert
  after insert on flowlane.step_tasks
  referencing new table as new_tasks
  for each statement execute function flowlane._track_leases();
create trigger step_tasks_leases_on_update
  after update on flowlane.step_tasks
  referencing old table as old_tasks new table as new_tasks
  for each statement execute function flowlane._track_leases();
create trigger step_tasks_leases_on_delete
  after delete on flowlane.step_tasks
  referencing old table as old_tasks
  for each statement execute function flowlane._track_leases();

-- ---------------------------------------------------------------------------
-- indexes: HOT completions, keyed lookups of started runs
-- ---------------------------------------------------------------------------

drop index flowlane.step_tasks_completed_idx;
-- a range is summarized by vacuum or, with autosummarize, once the next range starts filling;
-- the chart reads unsummarized ranges whole (the newest pages, where recent completions are)
create index step_tasks_completed_brin on flowlane.step_tasks using brin (completed_at)
  with (autosummarize = on);

drop index flowlane.step_states_ready_idx;
-- a step state is updated twice after its insert (started, then done): room on its page for
-- both versions, as 0011 gave step_tasks (at 0009's 80, about half of the completions found
-- room: tests/core/test_storage.py)
alter table flowlane.step_states set (fillfactor = 50);

drop index flowlane.runs_status_idx;
create index runs_in_flight_idx on flowlane.runs (run_id) where status = 'started';
create index runs_ended_idx on flowlane.runs (status, started_at desc, run_id) where status <> 'started';

-- ---------------------------------------------------------------------------
-- a run completes in the update that counts its last step down
-- ---------------------------------------------------------------------------

-- the outputs of completed runs: each run's completed leaf steps (0001's rule, in one place),
-- for a batch of runs in one statement
create function flowlane._run_outputs(p_run_ids uuid[]) returns table (run_id uuid, output jsonb)
language sql stable
set search_path = ''
set enable_seqscan = off  -- see "Plans" in 0009's header
as $$
  select ss.run_id, jsonb_object_agg(ss.step_slug, ss.output)
  from flowlane.step_states ss
  where ss.run_id = any (p_run_ids) and ss.status = 'completed'
    and not exists (select 1 from flowlane.deps d
                    where d.flow_slug = ss.flow_slug and d.dep_slug = ss.step_slug)
  group by ss.run_id
$$;

-- (_steps_done completes a run the same way when its last step completes)
create or replace function flowlane._maybe_complete_runs(p_run_ids uuid[]) returns void
language sql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in 0009's header
as $$
  with done as (
    select r.run_id from flowlane.runs r
    where r.run_id = any (p_run_ids) and r.status = 'started' and r.remaining_steps = 0
  )
  update flowlane.runs r
     set status = 'completed', completed_at = now(), output = coalesce(o.output, '{}'::jsonb)
    from done d
    left join flowlane._run_outputs(array(select k.run_id from done k)) o on o.run_id = d.run_id
   where r.run_id = d.run_id and r.run_id = any (p_run_ids)
     and r.status = 'started' and r.remaining_steps = 0  -- again on the row updated (a caller
                                                         -- may not hold the run's lock)
$$;

create or replace function flowlane._steps_done(p_steps flowlane.step_states[]) returns void
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in 0009's header
as $$
declare
  v_runs uuid[] := array(select distinct s.run_id from unnest(p_steps) s order by 1);
  v_started uuid[];
begin
  -- a run with no step left completes here (_maybe_complete_runs would update it again);
  -- the batch holds its runs' locks (_lock_and_classify), so counts reads what it updates
  with counts as (
    select s.run_id, count(*)::int as n, rr.status = 'started' and rr.remaining_steps = count(*) as last
    from unnest(p_steps) s
    join flowlane.runs rr on rr.run_id = s.run_id and rr.run_id = any (v_runs)
    group by s.run_id, rr.status, rr.remaining_steps
  ), updated as (
  update flowlane.runs r
     set remaining_steps = r.remaining_steps - c.n,
         status = case when c.last then 'completed' else r.status end,
         completed_at = case when c.last then now() else r.completed_at end,
         output = case when c.last then coalesce(o.output, '{}'::jsonb) else r.output end
    from counts c
    left join flowlane._run_outputs(array(select k.run_id from counts k where k.last)) o on o.run_id = c.run_id
   where r.run_id = c.run_id and r.run_id = any (v_runs)
  returning r.run_id, r.status
  ) select coalesce(array_agg(u.run_id order by u.run_id) filter (where u.status = 'started'), '{}')
      into v_started from updated u;
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
  if cardinality(v_started) > 0 then  -- a completed run has nothing left to start or skip
    perform flowlane._progress_runs(v_started);
  end if;
end;
$$;

-- 0007's notification per finished run, from one trigger call per statement (same channel,
-- same payload: the run's id)
create or replace function flowlane._notify_run_finished() returns trigger
language plpgsql volatile
set search_path = ''
as $$
begin
  perform pg_notify('flowlane_run_finished', n.run_id::text)
  from new_runs n join old_runs o on o.run_id = n.run_id
  where o.status = 'started' and n.status <> 'started'
  order by n.run_id;
  return null;
end;
$$;

drop trigger runs_notify_finished on flowlane.runs;
create trigger runs_notify_finished
  after update on flowlane.runs
  referencing old table as old_runs new table as new_runs
  for each statement execute function flowlane._notify_run_finished();

-- ---------------------------------------------------------------------------
-- claims: the claimed tasks and their runs joined by key
-- ---------------------------------------------------------------------------

-- what claimed tasks are handed, for a batch in one statement: 0001's _task_input (the element
-- of the run input for a root map, of the parent's output for a dependent map; the run input
-- for a root single step; otherwise {dep: output} of the completed deps), and the run input
create function flowlane._claimed_inputs(p_tasks flowlane.step_tasks[])
returns table (run_id uuid, step_slug text, task_index int, input jsonb, flow_input jsonb)
language sql stable
set search_path = ''
set enable_seqscan = off  -- see "Plans" in 0009's header
as $$
  select t.run_id, t.step_slug, t.task_index,
         case
           when s.step_type = 'map' and s.deps_count = 0 then r.input -> t.task_index
           when s.step_type = 'map' then
             (select ps.output -> t.task_index
              from flowlane.deps d
              join flowlane.step_states ps on ps.run_id = t.run_id and ps.step_slug = d.dep_slug
              where d.flow_slug = s.flow_slug and d.step_slug = s.step_slug)
           when s.deps_count = 0 then r.input
           else flowlane._condition_subject(t.run_id, t.step_slug)
         end,
         r.input
  from unnest(p_tasks) t
  join flowlane.runs r
    on r.run_id = t.run_id and r.run_id = any (array(select x.run_id from unnest(p_tasks) x))
  join flowlane.steps s on s.flow_slug = r.flow_slug and s.step_slug = t.step_slug
$$;

drop function flowlane._task_input(uuid, text, int);
-- callers gone since 0009 (complete_task/fail_task became one-item batches)
drop function flowlane._lock_task(uuid, text, int, uuid, int);
drop function flowlane._maybe_complete_run(uuid);

-- 0011's _start_tasks; the tasks to hide and to return are read from the unnested claim, the
-- leases looked up once per (flow, step), the inputs from _claimed_inputs
create or replace function flowlane._start_tasks(p_queue text, p_msg_ids bigint[], p_worker_id uuid, p_pairs jsonb,
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
  select coalesce(array_agg(c order by c.message_id), '{}'), coalesce(array_agg(l.lease order by c.message_id), '{}')
    into v_hide, v_offsets
  from unnest(v_claimed) c
  join (select p.flow_slug, p.step_slug, flowlane._effective_timeout(p.flow_slug, p.step_slug) + 2 as lease
        from (select distinct x.flow_slug, x.step_slug from unnest(v_claimed) x) p) l
    on l.flow_slug = c.flow_slug and l.step_slug = c.step_slug
  where p_read_vt is null or l.lease > p_read_vt;
  if cardinality(v_hide) > 0 then
    v_updated := flowlane._set_tasks_vt(v_hide, v_offsets);
    if v_updated <> cardinality(v_hide) then
      raise exception 'claim aborted: % tasks claimed but % queue messages got their visibility extended',
        cardinality(v_hide), v_updated
        using errcode = '40001', hint = 'a task''s message is missing from its queue; the claim was rolled back';
    end if;
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
