-- Fleet: workers, deployments, coverage of a queue's work, draining and rollouts.

-- how long a worker counts as live after its last heartbeat (it beats every 5 s): the one
-- stale window of every reader (flowlane.defaults.STALE_AFTER names the same number)
create function flowlane.worker_stale_after() returns interval
language sql immutable parallel safe
set search_path = ''
as $$ select interval '30 seconds' $$;

-- the one liveness rule: a worker is live while it has not stopped and its heartbeat is
-- within the stale window (worker list, queue list, run, the console, the metrics, serve)
create function flowlane.worker_is_live(w flowlane.workers) returns boolean
language sql stable parallel safe
set search_path = ''
as $$ select w.stopped_at is null and w.last_heartbeat_at > flowlane._now() - flowlane.worker_stale_after() $$;

-- register a worker of a deployment (created enabled on first use); refused
-- while the deployment is disabled
create function flowlane.register_worker(
  worker_id uuid, queue_name text, worker_name text, deployment_name text, supported_pairs jsonb
) returns flowlane.workers
language plpgsql volatile
set search_path = ''
as $$
declare
  v_deployment flowlane.worker_deployments;
  v_row flowlane.workers;
  v_pairs jsonb;
begin
  if register_worker.worker_id is null then
    raise exception 'register_worker: worker_id is required' using errcode = '22023';
  end if;
  perform flowlane._check_queue_argument('register_worker', register_worker.queue_name);
  perform flowlane._check_deployment_argument('register_worker', register_worker.deployment_name);
  select coalesce(jsonb_agg(jsonb_build_array(p.flow_slug, p.step_slug) order by p.flow_slug, p.step_slug), '[]')
    into v_pairs from flowlane._pairs(supported_pairs) p;
  if not exists (select 1 from flowlane.queues q where q.queue_name = register_worker.queue_name) then
    raise exception 'register_worker: queue "%" is not registered with flowlane', register_worker.queue_name
      using errcode = 'P0002', hint = 'apply the compiled SQL of the flows routed to it (`flowlane apply`)';
  end if;
  insert into flowlane.worker_deployments as d (deployment_name, queue_name)
  values (register_worker.deployment_name, register_worker.queue_name)
  on conflict on constraint worker_deployments_pkey do nothing;
  select * into v_deployment from flowlane.worker_deployments d
  where d.deployment_name = register_worker.deployment_name for update;
  if v_deployment.queue_name <> register_worker.queue_name then
    raise exception 'deployment "%" serves queue "%", not "%"', v_deployment.deployment_name,
      v_deployment.queue_name, register_worker.queue_name
      using errcode = '22023', hint = 'a deployment polls exactly one queue: give this worker another --name';
  end if;
  if not v_deployment.enabled then
    raise exception 'FLOWLANE_DEPLOYMENT_DISABLED: worker deployment "%" is disabled: %',
      v_deployment.deployment_name, coalesce(v_deployment.reason, 'no reason given')
      using errcode = '55000',
            hint = format('after fixing the cause, run `flowlane worker enable %s`', v_deployment.deployment_name);
  end if;
  insert into flowlane.workers as w (worker_id, queue_name, worker_name, deployment_name, supported_pairs)
  values (register_worker.worker_id, register_worker.queue_name, register_worker.worker_name,
          register_worker.deployment_name, v_pairs)
  on conflict on constraint workers_pkey do update
    set last_heartbeat_at = greatest(flowlane._now(), w.last_heartbeat_at)
  returning * into v_row;
  delete from flowlane.worker_refusals r where r.queue_name = register_worker.queue_name;
  return v_row;
end;
$$;

-- A worker that refuses to start (flows missing from the database, a shape that differs
-- from the YAML, a coverage gap, handlers that cannot be imported) records why, so that
-- whatever explains a wait (`run`, `runs`, `start --wait`, `queue list`, the console) can
-- name it. The latest refusal per deployment is kept; a worker registering on the queue
-- clears the queue's refusals (register_worker). Nothing here changes a definition.
create function flowlane.record_worker_refusal(
  queue_name text, deployment_name text, reason text, hint text = null
) returns flowlane.worker_refusals
language plpgsql volatile
set search_path = ''
as $$
declare
  v_row flowlane.worker_refusals;
begin
  perform flowlane._check_queue_argument('record_worker_refusal', record_worker_refusal.queue_name);
  perform flowlane._check_deployment_argument('record_worker_refusal', record_worker_refusal.deployment_name);
  if coalesce(btrim(record_worker_refusal.reason), '') = '' then
    raise exception 'record_worker_refusal: a reason is required' using errcode = '22023';
  end if;
  insert into flowlane.worker_refusals as r (queue_name, deployment_name, reason, hint)
  values (record_worker_refusal.queue_name, record_worker_refusal.deployment_name,
          left(record_worker_refusal.reason, 2000), left(record_worker_refusal.hint, 2000))
  on conflict on constraint worker_refusals_pkey do update
    set reason = excluded.reason, hint = excluded.hint, refused_at = flowlane._now()
  returning * into v_row;
  return v_row;
end;
$$;

create function flowlane.heartbeat(worker_id uuid) returns boolean
language sql volatile
set search_path = ''
as $$
  with hb as (
    update flowlane.workers w set last_heartbeat_at = greatest(flowlane._now(), w.last_heartbeat_at)
     where w.worker_id = heartbeat.worker_id
    returning w.deprecated_at is not null as deprecated
  ) select coalesce((select deprecated from hb), false)
$$;

create function flowlane.mark_worker_stopped(worker_id uuid) returns void
language sql volatile
set search_path = ''
as $$
  update flowlane.workers w set stopped_at = greatest(flowlane._now(), w.started_at)
   where w.worker_id = mark_worker_stopped.worker_id and w.stopped_at is null
$$;

create function flowlane.set_deployment_enabled(deployment_name text, enabled boolean, reason text = null)
returns flowlane.worker_deployments
language plpgsql volatile
set search_path = ''
as $$
declare
  v_row flowlane.worker_deployments;
  v_known text;
begin
  if set_deployment_enabled.enabled is null then
    raise exception 'set_deployment_enabled: enabled must be true or false' using errcode = '22023';
  end if;
  select * into v_row from flowlane.worker_deployments d
  where d.deployment_name = set_deployment_enabled.deployment_name for update;
  if not found then
    select string_agg(d.deployment_name, ', ' order by d.deployment_name) into v_known
    from flowlane.worker_deployments d;
    raise exception 'unknown worker deployment %', coalesce(quote_literal(set_deployment_enabled.deployment_name), 'NULL')
      using errcode = 'P0002',
            hint = format('deployments are recorded when their first worker starts; known: %s', coalesce(v_known, '(none)'));
  end if;
  if v_row.enabled = set_deployment_enabled.enabled
     and v_row.reason is not distinct from set_deployment_enabled.reason then
    return v_row;
  end if;
  update flowlane.worker_deployments d
     set enabled = set_deployment_enabled.enabled, reason = set_deployment_enabled.reason, changed_at = flowlane._now()
   where d.deployment_name = v_row.deployment_name
  returning * into v_row;
  return v_row;
end;
$$;

-- flows that new runs start: every alias's active version, and every flow
-- that no alias names (a plain flow is its own alias)
create function flowlane._active_targets() returns setof text
language sql stable
set search_path = ''
as $$
  select a.flow_slug from flowlane.aliases a
  union
  select f.flow_slug from flowlane.flows f
  where not exists (select 1 from flowlane.aliases a
                    where a.flow_slug = f.flow_slug or f.flow_slug = any (a.draining))
$$;

create function flowlane.coverage(queue_name text, supported_pairs jsonb)
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
    -- (each run's states by its id: a join on run_id would read every task that holds its
    -- step's state, all_step_states' second part being a subquery that takes no join key)
    cross join lateral (select v.flow_slug, v.step_slug from flowlane.all_step_states v
                        where v.run_id = r.run_id and v.status in ('created', 'started') offset 0) ss
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

create function flowlane.drain_status()
returns table (alias text, flow_slug text, started_runs bigint, active_tasks bigint, drained boolean)
language sql stable
set search_path = ''
as $$
  select a.alias, v.flow_slug, x.runs, x.tasks, x.runs = 0 and x.tasks = 0
  from flowlane.aliases a
  cross join lateral unnest(a.draining) as v (flow_slug)
  cross join lateral (
    -- a waiting run (a delayed start) will run this version too
    select (select count(*) from flowlane.runs r
             where r.flow_slug = v.flow_slug and r.status in ('started', 'waiting')) as runs,
           (select count(*) from flowlane.runs r
              join flowlane.step_tasks t on t.run_id = r.run_id
             where r.flow_slug = v.flow_slug and r.status = 'started'
               and t.status in ('queued', 'started')) as tasks
  ) x
  order by a.alias, v.flow_slug
$$;

-- record which deployments are enabled, disable them and deprecate their
-- live workers; an unfinished rollout is resumed (its record is kept, so a
-- re-run never enables what was disabled before the first run began)
create function flowlane.begin_rollout(deployments text[]) returns flowlane.rollouts
language plpgsql volatile
set search_path = ''
as $$
declare
  v_row flowlane.rollouts;
  v_wanted text[];
  v_unknown text;
begin
  if deployments is null or array_position(deployments, null) is not null then
    raise exception 'begin_rollout: deployments must be an array of deployment names without nulls'
      using errcode = '22023';
  end if;
  v_wanted := array(select distinct d from unnest(deployments) d order by d);
  perform pg_advisory_xact_lock(hashtext('flowlane.rollout'));
  select * into v_row from flowlane.rollouts r where r.finished_at is null;
  if found and v_row.deployments <> v_wanted then
    raise exception 'rollout % is unfinished (deployments %); finish it before starting another',
      v_row.rollout_id, array_to_string(v_row.deployments, ', ')
      using errcode = '55000',
            hint = format('run the same rollout again: `flowlane rollout --deployments %s`',
                          array_to_string(v_row.deployments, ','));
  end if;
  select d into v_unknown from unnest(v_wanted) d
  where not exists (select 1 from flowlane.worker_deployments w where w.deployment_name = d) limit 1;
  if found then
    raise exception 'begin_rollout: unknown worker deployment "%"', v_unknown using errcode = 'P0002',
      hint = 'list deployments with `flowlane worker list`';
  end if;
  if v_row.rollout_id is null then
    insert into flowlane.rollouts (deployments, previously_enabled)
    select v_wanted, array(select w.deployment_name from flowlane.worker_deployments w
                           where w.deployment_name = any (v_wanted) and w.enabled
                           order by w.deployment_name)
    returning * into v_row;
  end if;
  perform 1 from flowlane.worker_deployments w where w.deployment_name = any (v_wanted)
  order by w.deployment_name for update;
  update flowlane.worker_deployments w
     set enabled = false, reason = format('rollout %s in progress', v_row.rollout_id), changed_at = flowlane._now()
   where w.deployment_name = any (v_wanted) and w.enabled;
  update flowlane.workers w set deprecated_at = flowlane._now()
   where w.deployment_name = any (v_wanted) and w.stopped_at is null and w.deprecated_at is null;
  return v_row;
end;
$$;

create function flowlane.finish_rollout(rollout_id bigint) returns flowlane.rollouts
language plpgsql volatile
set search_path = ''
as $$
declare
  v_row flowlane.rollouts;
begin
  perform pg_advisory_xact_lock(hashtext('flowlane.rollout'));
  select * into v_row from flowlane.rollouts r where r.rollout_id = finish_rollout.rollout_id for update;
  if not found then
    raise exception 'finish_rollout: unknown rollout %', finish_rollout.rollout_id using errcode = 'P0002';
  end if;
  if v_row.finished_at is not null then
    return v_row;
  end if;
  update flowlane.worker_deployments w set enabled = true, reason = null, changed_at = flowlane._now()
   where w.deployment_name = any (v_row.previously_enabled);
  update flowlane.rollouts r set finished_at = flowlane._now() where r.rollout_id = v_row.rollout_id
  returning * into v_row;
  return v_row;
end;
$$;

-- a deployment added, removed, enabled or disabled is a definition change for the
-- workers and serve (03_definitions.sql); a worker's registration inserts nothing
-- once its deployment exists, so it notifies no one
create trigger worker_deployments_notify_added
after insert or delete on flowlane.worker_deployments
for each row execute function flowlane._notify_definitions_changed();

create trigger worker_deployments_notify_enabled
after update of enabled on flowlane.worker_deployments
for each row when (old.enabled is distinct from new.enabled)
execute function flowlane._notify_definitions_changed();

-- What a process that cannot LISTEN polls instead of flowlane_definitions (through a
-- transaction-mode pooler a LISTEN stays in whichever server session ran it): a text that
-- changes whenever that channel is notified. A row's xmin is the transaction that last
-- wrote it; a deployment counts by its name and enabled flag, as its triggers do.
create function flowlane.definitions_fingerprint() returns text
language sql stable
set search_path = ''
as $$
  select md5(concat_ws('/',
    (select string_agg(f.xmin::text, ',' order by f.xmin::text) from flowlane.flows f),
    (select string_agg(s.xmin::text, ',' order by s.xmin::text) from flowlane.steps s),
    (select string_agg(d.xmin::text, ',' order by d.xmin::text) from flowlane.deps d),
    (select string_agg(a.xmin::text, ',' order by a.xmin::text) from flowlane.aliases a),
    (select string_agg(q.xmin::text, ',' order by q.xmin::text) from flowlane.queues q),
    (select string_agg(w.deployment_name || ':' || w.enabled, ',' order by w.deployment_name)
     from flowlane.worker_deployments w)))
$$;
