-- Retention: a finished run older than its flow's retention is deleted with its step states,
-- tasks, attempts and queue messages (archived or not). prune_runs deletes one bounded batch
-- per call, so each batch is one short transaction; callers (the maintenance tick, `flowlane
-- prune`) call it again while it deletes something.
-- A failure handler's run and a compensation's run are kept while the run they handle is kept
-- (its retention may be longer than theirs): its page links them, and `retry --compensation`
-- retries a failed compensation's run. Once it is gone they follow their own flow's retention.

create function flowlane._check_prune_args(p_now timestamptz, p_older_than int, p_batch int) returns void
language plpgsql immutable
set search_path = ''
as $$
begin
  if p_now is null then
    raise exception 'prune_runs: p_now must not be null' using errcode = '22004';
  end if;
  if p_older_than < 0 then
    raise exception 'prune_runs: p_older_than is seconds (>= 0), got %', p_older_than using errcode = '22023';
  end if;
  if p_batch is null or p_batch not between 1 and 10000 then
    raise exception 'prune_runs: p_batch must be between 1 and 10000 runs, got %', coalesce(p_batch::text, 'null')
      using errcode = '22023';
  end if;
end;
$$;

-- finished runs that ended before p_now minus their flow's retention (p_older_than seconds,
-- when given, in place of every flow's retention), oldest first within a flow; p_flows
-- narrows to those flows; p_limit null = all. A handler's run waits for the run it handles.
create function flowlane._prunable_runs(p_now timestamptz, p_flows text[], p_older_than int, p_limit int)
returns table (run_id uuid, flow_slug text, ended_at timestamptz)
language plpgsql stable
set search_path = ''
as $$
begin
  return query
  select r.run_id, r.flow_slug, r.ended_at
  from flowlane.flows f
  cross join lateral (
    select p_now - make_interval(secs => coalesce(p_older_than, f.opt_retention)) as cutoff
  ) c
  cross join lateral (
    -- started_at <= ended time, so the index range on started_at holds every candidate
    select r.run_id, r.flow_slug, coalesce(r.completed_at, r.failed_at, r.cancelled_at) as ended_at
    from flowlane.runs r
    where r.flow_slug = f.flow_slug and r.status <> 'started' and r.started_at < c.cutoff
      and coalesce(r.completed_at, r.failed_at, r.cancelled_at) < c.cutoff
      and not exists (select 1 from flowlane.runs h where h.run_id in (r.failure_of, r.compensation_of))
    order by r.started_at
    limit p_limit
  ) r
  where c.cutoff is not null and (p_flows is null or f.flow_slug = any (p_flows))
  limit p_limit;
end;
$$;

-- what a prune would delete now, per flow (read only)
create function flowlane.prunable_runs(
  p_now timestamptz = flowlane._now(), p_flows text[] = null, p_older_than int = null
) returns table (flow_slug text, runs bigint, oldest_ended_at timestamptz)
language plpgsql stable
set search_path = ''
as $$
begin
  perform flowlane._check_prune_args(p_now, p_older_than, 1);
  return query
    select p.flow_slug, count(*), min(p.ended_at)
    from flowlane._prunable_runs(p_now, p_flows, p_older_than, null) p
    group by p.flow_slug
    order by p.flow_slug;
end;
$$;

-- delete the messages of one queue with the given ids, from its archive and (left over from
-- a run that ended while they waited) from the queue itself
create function flowlane._delete_messages(p_queue text, p_ids bigint[]) returns int
language plpgsql volatile
set search_path = ''
as $$
declare
  v_pgmq text;
  v_archived int;
  v_queued int;
begin
  select q.pgmq_queue_name into v_pgmq from flowlane.queues q where q.queue_name = p_queue;
  if v_pgmq is null then
    return 0;
  end if;
  execute format('delete from pgmq.%I where msg_id = any ($1)', pgmq.format_table_name(v_pgmq, 'a'))
    using p_ids;
  get diagnostics v_archived = row_count;
  execute format('delete from pgmq.%I where msg_id = any ($1)', pgmq.format_table_name(v_pgmq, 'q'))
    using p_ids;
  get diagnostics v_queued = row_count;
  return v_archived + v_queued;
end;
$$;

-- one batch: at most p_batch prunable runs (a run locked by a retry or a cancel right now is
-- left for a later batch) and everything they own; returns what it deleted
create function flowlane.prune_runs(
  p_now timestamptz = flowlane._now(), p_flows text[] = null, p_older_than int = null, p_batch int = 500
) returns table (runs_deleted int, steps_deleted int, tasks_deleted int, attempts_deleted int,
                 messages_deleted int)
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_runs uuid[];
  v_group record;
  v_states_in_tasks int;
begin
  perform flowlane._check_prune_args(p_now, p_older_than, p_batch);
  v_runs := array(
    select r.run_id from flowlane.runs r
    where r.run_id = any (array(select p.run_id from flowlane._prunable_runs(p_now, p_flows, p_older_than, p_batch) p))
      and r.status <> 'started'
    order by r.run_id
    for update skip locked);
  messages_deleted := 0;
  if cardinality(v_runs) = 0 then  -- most ticks: five empty deletes cost more than the lookup
    runs_deleted := 0; steps_deleted := 0; tasks_deleted := 0; attempts_deleted := 0;
    return next;
    return;
  end if;
  for v_group in
    select t.queue_name, array_agg(t.message_id order by t.message_id) as ids
    from flowlane.step_tasks t
    where t.run_id = any (v_runs)
    group by t.queue_name
    order by t.queue_name
  loop
    messages_deleted := messages_deleted + flowlane._delete_messages(v_group.queue_name, v_group.ids);
  end loop;
  delete from flowlane.task_attempts a where a.run_id = any (v_runs);
  get diagnostics attempts_deleted = row_count;
  -- the steps deleted are the rows of step_states and the states tasks held (all_step_states)
  with gone as (
    delete from flowlane.step_tasks t where t.run_id = any (v_runs) returning t.step_started_at
  ) select count(*), count(g.step_started_at) into tasks_deleted, v_states_in_tasks from gone g;
  delete from flowlane.step_states ss where ss.run_id = any (v_runs);
  get diagnostics steps_deleted = row_count;
  steps_deleted := steps_deleted + v_states_in_tasks;
  delete from flowlane.runs r where r.run_id = any (v_runs);
  get diagnostics runs_deleted = row_count;
  return next;
end;
$$;
