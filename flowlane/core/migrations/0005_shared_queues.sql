-- flowlane SQL Core 0005: shared queues made safe (seed 02, SQL side).
--
-- 1. start_tasks(queue_name, msg_ids, worker_id, supported_pairs) replaces the
--    three-argument form. The whole batch is locked and classified before any
--    change: a message of a supported (flow, step) pair whose task is queued is
--    claimed; one whose task is already started is a benign duplicate (no
--    attempt, hidden until stalled recovery may take it); one whose task is
--    terminal is archived. A message with no task on this queue (foreign) or
--    of a pair the caller does not support is unsupported work: then nothing
--    is claimed, the whole batch becomes visible again, no attempt is consumed,
--    and the call returns one 'unsupported' row per such message (identities,
--    never bodies) so the worker can stop.
-- 2. Worker deployments: a persistent enabled flag per deployment name, which
--    register_worker checks, so that a supervisor restarting a worker that hit
--    unsupported work is refused until an operator enables it again.
-- 3. coverage(queue, pairs): the (flow, step) pairs routed to a queue that a
--    worker must serve and does not; drain_status() says when a draining
--    version can no longer reach any queue.
-- 4. verify_flow(slug, shape): the worker's read-only startup check. Workers
--    never write definitions; missing flows are created by the reviewed SQL.
-- 5. adopt_queue(name): explicit adoption of an existing PGMQ queue.
-- 6. Rollouts: begin_rollout / finish_rollout fence a deploy by disabling the
--    affected deployments and re-enabling exactly those enabled before.
--
-- Lock order (every function here): runs, then step_tasks, keys sorted;
-- a deployment row before the workers rows that reference it.

-- ---------------------------------------------------------------------------
-- (flow, step) pairs as arguments: a JSON array of [flow_slug, step_slug]
-- ---------------------------------------------------------------------------

create function flowlane._pairs(supported_pairs jsonb)
returns table (flow_slug text, step_slug text)
language plpgsql immutable
set search_path = ''
as $$
declare
  v_item jsonb;
  v_pos int;
begin
  if supported_pairs is null or jsonb_typeof(supported_pairs) <> 'array' then
    raise exception 'supported_pairs must be a JSON array of [flow_slug, step_slug] pairs, got %',
      coalesce(jsonb_typeof(supported_pairs), 'null') using errcode = '22023';
  end if;
  for v_item, v_pos in select e, o - 1 from jsonb_array_elements(supported_pairs) with ordinality as a (e, o) loop
    if jsonb_typeof(v_item) <> 'array' or jsonb_array_length(v_item) <> 2
       or jsonb_typeof(v_item -> 0) <> 'string' or jsonb_typeof(v_item -> 1) <> 'string'
       or not flowlane.is_valid_slug(v_item ->> 0) or not flowlane.is_valid_slug(v_item ->> 1) then
      raise exception 'supported_pairs item % must be a pair of slugs [flow_slug, step_slug], got %',
        v_pos, left(v_item::text, 200) using errcode = '22023';
    end if;
  end loop;
  return query
    select distinct e ->> 0, e ->> 1 from jsonb_array_elements(supported_pairs) e order by 1, 2;
end;
$$;

create function flowlane._check_queue_argument(p_function text, p_queue text) returns void
language plpgsql immutable
set search_path = ''
as $$
begin
  if not flowlane.is_valid_queue_name(p_queue) then
    raise exception '%: invalid queue name %', p_function, coalesce(quote_literal(p_queue), 'NULL')
      using errcode = '22023',
            hint = 'a queue name matches ^[a-z][a-z0-9_]*$ and has at most 47 characters';
  end if;
end;
$$;

-- ---------------------------------------------------------------------------
-- queue registry: PGMQ's exact spelling, adoption
-- ---------------------------------------------------------------------------

alter table flowlane.queues add column pgmq_queue_name text;
alter table flowlane.queues add column adopted_at timestamptz;
update flowlane.queues q
   set pgmq_queue_name = coalesce(
         (select l.queue_name from pgmq.list_queues() l
          where lower(l.queue_name) = q.queue_name order by l.queue_name limit 1),
         q.queue_name);
alter table flowlane.queues alter column pgmq_queue_name set not null;
alter table flowlane.queues add constraint queues_pgmq_spelling
  check (lower(pgmq_queue_name) = queue_name);

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

create or replace function flowlane._ensure_queue(p_queue text, p_flow_slug text, p_mode text) returns void
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
  values (v_name, 'shared', null, v_pgmq, now())
  returning * into v_row;
  return v_row;
end;
$$;

-- ---------------------------------------------------------------------------
-- worker deployments
-- ---------------------------------------------------------------------------

create function flowlane.is_valid_deployment_name(deployment_name text) returns boolean
language sql immutable parallel safe
set search_path = ''
as $$
  select deployment_name is not null
     and length(deployment_name) between 1 and 128
     and deployment_name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]*$'
$$;

create table flowlane.worker_deployments (
  deployment_name text primary key,
  queue_name text not null references flowlane.queues (queue_name),
  enabled boolean not null default true,
  reason text,
  created_at timestamptz not null default now(),
  changed_at timestamptz not null default now(),
  constraint worker_deployments_name_valid check (flowlane.is_valid_deployment_name(deployment_name))
);
create index worker_deployments_queue_idx on flowlane.worker_deployments (queue_name);

alter table flowlane.workers add column deployment_name text references flowlane.worker_deployments (deployment_name);
alter table flowlane.workers add column supported_pairs jsonb not null default '[]';
create index workers_deployment_idx on flowlane.workers (deployment_name) where stopped_at is null;

drop function flowlane.register_worker(uuid, text, text);

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
  if not flowlane.is_valid_deployment_name(register_worker.deployment_name) then
    raise exception 'register_worker: invalid deployment name %',
      coalesce(quote_literal(register_worker.deployment_name), 'NULL')
      using errcode = '22023', hint = 'a deployment name matches ^[A-Za-z0-9][A-Za-z0-9_.-]*$ (1..128 characters)';
  end if;
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
    set last_heartbeat_at = greatest(now(), w.last_heartbeat_at)
  returning * into v_row;
  return v_row;
end;
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
     set enabled = set_deployment_enabled.enabled, reason = set_deployment_enabled.reason, changed_at = now()
   where d.deployment_name = v_row.deployment_name
  returning * into v_row;
  return v_row;
end;
$$;

-- ---------------------------------------------------------------------------
-- startup checks: verify (read-only) and coverage
-- ---------------------------------------------------------------------------

create function flowlane.verify_flow(flow_slug text, shape jsonb) returns jsonb
language plpgsql stable
set search_path = ''
as $$
declare
  v_db jsonb := flowlane.get_flow_shape(verify_flow.flow_slug);
  v_diff text[];
begin
  if v_db is null then
    return jsonb_build_object('status', 'missing', 'differences', '[]'::jsonb);
  end if;
  v_diff := flowlane._shape_differences(v_db, shape);
  return jsonb_build_object('status', case when cardinality(v_diff) = 0 then 'verified' else 'mismatch' end,
                            'differences', to_jsonb(v_diff));
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
    join flowlane.step_states ss on ss.run_id = r.run_id and ss.status in ('created', 'started')
    join flowlane.steps s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
    where r.status = 'started' and s.queue_name = coverage.queue_name
    union all
    select distinct t.flow_slug, t.step_slug, 'task on the queue'
    from flowlane.step_tasks t
    where t.queue_name = coverage.queue_name and t.status in ('queued', 'started')
  )
  select r.flow_slug, r.step_slug, array_agg(distinct r.source order by r.source)
  from required r
  where not exists (select 1 from supported p where p.flow_slug = r.flow_slug and p.step_slug = r.step_slug)
  group by r.flow_slug, r.step_slug
  order by r.flow_slug, r.step_slug;
end;
$$;

-- per alias and draining version: what still runs; drained = nothing can reach a queue
create function flowlane.drain_status()
returns table (alias text, flow_slug text, started_runs bigint, active_tasks bigint, drained boolean)
language sql stable
set search_path = ''
as $$
  select a.alias, v.flow_slug, x.runs, x.tasks, x.runs = 0 and x.tasks = 0
  from flowlane.aliases a
  cross join lateral unnest(a.draining) as v (flow_slug)
  cross join lateral (
    select (select count(*) from flowlane.runs r where r.flow_slug = v.flow_slug and r.status = 'started') as runs,
           (select count(*) from flowlane.step_tasks t
             where t.flow_slug = v.flow_slug and t.status in ('queued', 'started')) as tasks
  ) x
  order by a.alias, v.flow_slug
$$;

-- ---------------------------------------------------------------------------
-- claiming with supported pairs
-- ---------------------------------------------------------------------------

drop function flowlane.start_tasks(text, bigint[], uuid);
drop type flowlane.step_task_record;
create type flowlane.claim_record as (
  outcome text,         -- 'claimed' | 'unsupported'
  flow_slug text,       -- null for a foreign message (no task on this queue)
  step_slug text,
  queue_name text,
  run_id uuid,
  task_index int,
  input jsonb,
  flow_input jsonb,
  attempt int,
  msg_id bigint
);

-- when stalled recovery may take a started task: effective timeout + 30 s after its claim
create function flowlane._stall_deadline(p_task flowlane.step_tasks, p_timeout int) returns timestamptz
language sql immutable
set search_path = ''
as $$
  select p_task.started_at + make_interval(secs => p_timeout + 30)
$$;

-- one message of a batch, classified before anything changes
create type flowlane._claim_item as (
  msg_id bigint,
  task flowlane.step_tasks,   -- null fields: no task on this queue has the message
  supported boolean,
  claimable boolean
);

create function flowlane.start_tasks(queue_name text, msg_ids bigint[], worker_id uuid, supported_pairs jsonb)
returns setof flowlane.claim_record
language plpgsql volatile
set search_path = ''
as $$
declare
  v_queue text := start_tasks.queue_name;
  v_ids bigint[];
  v_batch flowlane._claim_item[];
  v_duplicates flowlane.step_tasks[];
  v_claimed flowlane.step_tasks[];
  v_offsets int[];
  v_updated int;
begin
  perform flowlane._check_queue_argument('start_tasks', v_queue);
  if start_tasks.worker_id is null then
    raise exception 'start_tasks: worker_id is required (it fences the results of the claimed tasks)'
      using errcode = '22023';
  end if;
  if msg_ids is null or array_position(msg_ids, null) is not null then
    raise exception 'start_tasks: msg_ids must be an array of message ids without nulls' using errcode = '22023';
  end if;
  perform flowlane._pairs(supported_pairs);  -- validates before anything is locked
  v_ids := array(select distinct m from unnest(msg_ids) m order by m);
  if cardinality(v_ids) = 0 then
    return;
  end if;

  -- lock order: runs (shared: claims do not block each other), then the batch's tasks
  perform 1 from flowlane.runs r
  where r.run_id in (select t.run_id from flowlane.step_tasks t
                     where t.queue_name = v_queue and t.message_id = any (v_ids))
  order by r.run_id
  for share;
  perform 1 from flowlane.step_tasks t
  where t.queue_name = v_queue and t.message_id = any (v_ids)
  order by t.run_id, t.step_slug, t.task_index
  for update;

  -- classify every message before any change
  select array_agg(row(b.msg_id, t, t.run_id is not null and p.flow_slug is not null,
                       t.status = 'queued' and r.status = 'started' and ss.status = 'started'
                   )::flowlane._claim_item order by b.msg_id)
    into v_batch
  from unnest(v_ids) as b (msg_id)
  left join flowlane.step_tasks t on t.queue_name = v_queue and t.message_id = b.msg_id
  left join flowlane._pairs(supported_pairs) p on p.flow_slug = t.flow_slug and p.step_slug = t.step_slug
  left join flowlane.runs r on r.run_id = t.run_id
  left join flowlane.step_states ss on ss.run_id = t.run_id and ss.step_slug = t.step_slug;

  if exists (select 1 from unnest(v_batch) c where not c.supported) then
    perform pgmq.set_vt(v_queue, v_ids, 0);
    return query
      select 'unsupported', (c.task).flow_slug, (c.task).step_slug, v_queue, (c.task).run_id,
             (c.task).task_index, null::jsonb, null::jsonb, null::int, c.msg_id
      from unnest(v_batch) c where not c.supported order by c.msg_id;
    return;
  end if;

  -- terminal tasks: their message is archived (idempotent)
  perform pgmq.archive(v_queue, array(
    select c.msg_id from unnest(v_batch) c
    where (c.task).status in ('completed', 'failed', 'skipped', 'cancelled') order by c.msg_id));
  -- still started (a visible duplicate): no attempt; hidden until stalled recovery may take it
  select coalesce(array_agg(c.task order by c.msg_id), '{}'),
         coalesce(array_agg(greatest(1, ceil(extract(epoch from
                              flowlane._stall_deadline(c.task, flowlane._effective_timeout((c.task).flow_slug, (c.task).step_slug))
                              - clock_timestamp()))::int)
                            order by c.msg_id), '{}')
    into v_duplicates, v_offsets
  from unnest(v_batch) c where (c.task).status = 'started';
  perform flowlane._set_tasks_vt(v_duplicates, v_offsets);

  with claimed as (
    update flowlane.step_tasks t
       set status = 'started', attempts_count = t.attempts_count + 1, started_at = now(),
           last_worker_id = start_tasks.worker_id
      from unnest(v_batch) c
     where c.claimable and t.run_id = (c.task).run_id and t.step_slug = (c.task).step_slug
       and t.task_index = (c.task).task_index
    returning t
  ) select coalesce(array_agg(c.t order by (c.t).message_id), '{}') into v_claimed from claimed c;

  if cardinality(v_claimed) = 0 then
    return;
  end if;
  select array_agg(flowlane._effective_timeout((v_claimed[i]).flow_slug, (v_claimed[i]).step_slug) + 2 order by i)
    into v_offsets from generate_subscripts(v_claimed, 1) as i;
  v_updated := flowlane._set_tasks_vt(v_claimed, v_offsets);
  if v_updated <> cardinality(v_claimed) then
    raise exception 'claim aborted: % tasks claimed but % queue messages got their visibility extended',
      cardinality(v_claimed), v_updated
      using errcode = '40001', hint = 'a task''s message is missing from its queue; the claim was rolled back';
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

-- ---------------------------------------------------------------------------
-- fenced rollouts
-- ---------------------------------------------------------------------------

create table flowlane.rollouts (
  rollout_id bigint generated always as identity primary key,
  deployments text[] not null,
  previously_enabled text[] not null,
  started_at timestamptz not null default now(),
  finished_at timestamptz
);
create unique index rollouts_one_unfinished on flowlane.rollouts ((true)) where finished_at is null;

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
     set enabled = false, reason = format('rollout %s in progress', v_row.rollout_id), changed_at = now()
   where w.deployment_name = any (v_wanted) and w.enabled;
  update flowlane.workers w set deprecated_at = now()
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
  update flowlane.worker_deployments w set enabled = true, reason = null, changed_at = now()
   where w.deployment_name = any (v_row.previously_enabled);
  update flowlane.rollouts r set finished_at = now() where r.rollout_id = v_row.rollout_id
  returning * into v_row;
  return v_row;
end;
$$;
