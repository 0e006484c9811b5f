-- flowlane SQL Core 0018: retention, metrics and traces.
-- Drafted by `python -m flowlane.core.draft_migration` from the engine source; reviewed by a person.
--
-- A flow keeps its finished runs for opt_retention seconds (null: for ever); prune_runs deletes
-- one bounded batch of older runs with their steps, tasks, attempts and queue messages, and
-- prunable_runs says what it would delete. create_flow takes the option (a new argument, so
-- the old signature is dropped first). queue_metrics is what a metrics scrape reads, per
-- queue, in one statement. runs.trace_parent keeps the W3C trace context a run was started
-- in (the transaction's flowlane.traceparent setting), for the spans of its tasks.

-- hand-written
-- existing flows get the default retention (30 days, the value _flow_option_default gives
-- once replaced below); new rows take the column default from that function
alter table flowlane.flows add column opt_retention int default 2592000;
alter table flowlane.flows alter column opt_retention set default flowlane._flow_option_default('retention');
alter table flowlane.flows add constraint flows_retention_positive
  check ((opt_retention is null) or (opt_retention >= 1));
create index runs_prune_idx on flowlane.runs (flow_slug, started_at) where (status <> 'started');
alter table flowlane.runs add column trace_parent text;
-- end of hand-written

drop function flowlane.create_flow(text,integer,integer,integer,text);

-- a flow option's value when the flow's definition leaves it out: the column defaults of
-- flowlane.flows and create_flow take it from here, and a test holds it equal to the
-- compiler's defaults
create or replace function flowlane._flow_option_default(option text) returns int
language sql immutable parallel safe
set search_path = ''
as $$
  select case option when 'max_attempts' then 3 when 'base_delay' then 5 when 'timeout' then 60
                     when 'retention' then 2592000 end
$$;

-- two transactions applying the same flow file raced between the existence
-- check and the insert and one failed on flows_slug_ci_unique; the lock on
-- the lowercase slug makes the second wait and then find the first's rows.
-- retention: seconds a finished run is kept; null keeps runs for ever (so, unlike
-- the other options, leaving it out is what gives the default)
create or replace function flowlane.create_flow(
  flow_slug text,
  max_attempts int = null,
  base_delay int = null,
  timeout int = null,
  queue_mode text = 'flow',
  retention int = flowlane._flow_option_default('retention')
) returns flowlane.flows
language plpgsql volatile
set search_path = ''
as $$
declare
  v_flow flowlane.flows;
  v_other text;
  v_mode text := coalesce(create_flow.queue_mode, 'flow');
begin
  perform flowlane._check_slug('flow', create_flow.flow_slug);
  if v_mode not in ('flow', 'per-step', 'explicit') then
    raise exception 'flow "%": queue_mode must be flow, per-step or explicit, not %',
      create_flow.flow_slug, quote_literal(v_mode) using errcode = '22023';
  end if;
  if v_mode = 'flow' and length(create_flow.flow_slug) > 47 then
    raise exception 'flow "%": with queue_mode flow the queue is the lowercase flow slug, which must have at most 47 characters (the PGMQ limit)',
      create_flow.flow_slug using errcode = '22023', hint = 'use a shorter slug, or per-step/explicit queues';
  end if;
  perform pg_advisory_xact_lock(hashtext('flowlane.flow'), hashtext(lower(create_flow.flow_slug)));
  select f.flow_slug into v_other from flowlane.flows f
  where lower(f.flow_slug) = lower(create_flow.flow_slug) and f.flow_slug <> create_flow.flow_slug;
  if found then
    raise exception 'flow slug "%" conflicts with existing flow "%" (flow slugs are unique case-insensitively)',
      create_flow.flow_slug, v_other using errcode = '23505';
  end if;
  select * into v_flow from flowlane.flows f where f.flow_slug = create_flow.flow_slug for update;
  if found and v_flow.queue_mode <> v_mode then
    raise exception 'FLOWLANE_SHAPE_MISMATCH: flow "%" exists with queue_mode %, not %',
      create_flow.flow_slug, v_flow.queue_mode, v_mode
      using errcode = '23514',
            hint = 'the queue mode is part of the flow''s shape; create a new flow version (a new slug)';
  end if;
  if create_flow.retention is not null and create_flow.retention < 1 then
    raise exception 'flow "%": retention must be at least 1 second (null keeps runs for ever), got %',
      create_flow.flow_slug, create_flow.retention using errcode = '22023';
  end if;
  insert into flowlane.flows as f (flow_slug, opt_max_attempts, opt_base_delay, opt_timeout, queue_mode,
                                   opt_retention)
  values (create_flow.flow_slug, coalesce(max_attempts, flowlane._flow_option_default('max_attempts')),
          coalesce(base_delay, flowlane._flow_option_default('base_delay')),
          coalesce(timeout, flowlane._flow_option_default('timeout')), v_mode, create_flow.retention)
  on conflict on constraint flows_pkey do update
    set opt_max_attempts = excluded.opt_max_attempts,
        opt_base_delay = excluded.opt_base_delay,
        opt_timeout = excluded.opt_timeout,
        opt_retention = excluded.opt_retention
  returning * into v_flow;
  return v_flow;
end;
$$;

-- new runs of one concrete flow (inputs checked by the caller); returns them in input order
create or replace function flowlane._create_runs(p_flow text, p_inputs jsonb[], p_run_ids uuid[])
returns setof flowlane.runs
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_ids uuid[];
begin
  v_ids := array(select coalesce(p_run_ids[i], gen_random_uuid()) from generate_subscripts(p_inputs, 1) i order by i);
  insert into flowlane.runs (run_id, flow_slug, input, remaining_steps, trace_parent)
  select v_ids[i], p_flow, p_inputs[i], (select count(*) from flowlane.steps s where s.flow_slug = p_flow),
         flowlane._trace_parent()
  from generate_subscripts(p_inputs, 1) i order by i;
  insert into flowlane.step_states (flow_slug, run_id, step_slug, remaining_deps, initial_tasks)
  select p_flow, v_ids[i], s.step_slug, s.deps_count,
         case when s.step_type = 'single' then 1
              when s.deps_count = 0 and jsonb_typeof(p_inputs[i]) = 'array' then jsonb_array_length(p_inputs[i])
              else null end
  from generate_subscripts(p_inputs, 1) i, flowlane.steps s
  where s.flow_slug = p_flow
  order by v_ids[i], s.step_slug;
  perform flowlane._progress_runs(v_ids);
  return query select r.* from unnest(v_ids) with ordinality as u (run_id, ord)
               join flowlane.runs r on r.run_id = u.run_id and r.run_id = any (v_ids) order by u.ord;
end;
$$;

create or replace function flowlane._check_prune_args(p_now timestamptz, p_older_than int, p_batch int) returns void
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
-- narrows to those flows; p_limit null = all
create or replace function flowlane._prunable_runs(p_now timestamptz, p_flows text[], p_older_than int, p_limit int)
returns table (run_id uuid, flow_slug text, ended_at timestamptz)
language sql stable
set search_path = ''
as $$
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
    order by r.started_at
    limit p_limit
  ) r
  where c.cutoff is not null and (p_flows is null or f.flow_slug = any (p_flows))
  limit p_limit
$$;

-- what a prune would delete now, per flow (read only)
create or replace function flowlane.prunable_runs(
  p_now timestamptz = now(), p_flows text[] = null, p_older_than int = null
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
create or replace function flowlane._delete_messages(p_queue text, p_ids bigint[]) returns int
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
create or replace function flowlane.prune_runs(
  p_now timestamptz = now(), p_flows text[] = null, p_older_than int = null, p_batch int = 500
) returns table (runs_deleted int, steps_deleted int, tasks_deleted int, attempts_deleted int,
                 messages_deleted int)
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_runs uuid[];
  v_group record;
begin
  perform flowlane._check_prune_args(p_now, p_older_than, p_batch);
  v_runs := array(
    select r.run_id from flowlane.runs r
    where r.run_id = any (array(select p.run_id from flowlane._prunable_runs(p_now, p_flows, p_older_than, p_batch) p))
      and r.status <> 'started'
    order by r.run_id
    for update skip locked);
  messages_deleted := 0;
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
  delete from flowlane.task_leases l where l.run_id = any (v_runs);
  delete from flowlane.step_tasks t where t.run_id = any (v_runs);
  get diagnostics tasks_deleted = row_count;
  delete from flowlane.step_states ss where ss.run_id = any (v_runs);
  get diagnostics steps_deleted = row_count;
  delete from flowlane.runs r where r.run_id = any (v_runs);
  get diagnostics runs_deleted = row_count;
  return next;
end;
$$;

create or replace function flowlane.queue_metrics(p_stale_after int = 30)
returns table (queue_name text, depth bigint, oldest_age_seconds int, live_workers bigint,
               disabled_deployments bigint)
language sql stable
set search_path = ''
as $$
  select q.queue_name, m.queue_length, coalesce(m.oldest_msg_age_sec, 0),
         (select count(*) from flowlane.workers w
          where w.queue_name = q.queue_name and w.stopped_at is null
            and w.last_heartbeat_at > now() - make_interval(secs => p_stale_after)),
         (select count(*) from flowlane.worker_deployments d
          where d.queue_name = q.queue_name and not d.enabled)
  from flowlane.queues q
  cross join lateral pgmq.metrics(q.pgmq_queue_name) m
  order by q.queue_name
$$;

-- the transaction's trace context, checked; null when none is set
create or replace function flowlane._trace_parent() returns text
language plpgsql stable
set search_path = ''
as $$
declare
  v_value text := nullif(current_setting('flowlane.traceparent', true), '');
begin
  if v_value is not null and v_value !~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$' then
    raise exception 'flowlane.traceparent must be a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>), got %',
      quote_literal(left(v_value, 100)) using errcode = '22023';
  end if;
  return v_value;
end;
$$;

-- the trace contexts of the given runs (those started inside a trace)
create or replace function flowlane.trace_parents(run_ids uuid[])
returns table (run_id uuid, trace_parent text)
language sql stable
set search_path = ''
as $$
  select r.run_id, r.trace_parent from flowlane.runs r
  where r.run_id = any (run_ids) and r.trace_parent is not null
$$;
