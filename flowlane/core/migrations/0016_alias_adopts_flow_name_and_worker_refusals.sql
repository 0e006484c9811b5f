-- flowlane SQL Core 0016: an alias may adopt the name of a flow it lists, and a worker
-- that refuses to start says why in the database.
-- Drafted by `python -m flowlane.core.draft_migration` from the engine source; reviewed by a person.
--
-- A project that started with a bare concrete slug (`hello`) gets its next version behind
-- an alias of the same name: set_alias accepts an alias named like a flow when it lists
-- that flow (spelled the same) as its active or draining version, and the trigger that
-- keeps flows from taking an alias's name lets that flow be applied again. Every other
-- clash of flow and alias names is still refused. resolve_flow already prefers the alias.
--
-- worker_refusals: the latest startup refusal per (queue, deployment), written by
-- record_worker_refusal (worker class) and cleared by register_worker for the queue. A
-- runtime record: no definition changes, no notification. register_worker and
-- record_worker_refusal check a deployment name through _check_deployment_argument.

create table flowlane.worker_refusals (
  queue_name text not null,
  deployment_name text not null,
  reason text not null,
  hint text,
  refused_at timestamptz default now() not null,
  constraint worker_refusals_pkey primary key (queue_name, deployment_name)
);

create or replace function flowlane._check_deployment_argument(p_function text, p_deployment text) returns void
language plpgsql immutable
set search_path = ''
as $$
begin
  if not flowlane.is_valid_deployment_name(p_deployment) then
    raise exception '%: invalid deployment name %', p_function, coalesce(quote_literal(p_deployment), 'NULL')
      using errcode = '22023', hint = 'a deployment name matches ^[A-Za-z0-9][A-Za-z0-9_.-]*$ (1..128 characters)';
  end if;
end;
$$;

-- Flow and alias slugs share one case-insensitive namespace, with one exception: an alias
-- may take the name of a flow it lists as a version (active or draining), spelled the
-- same. The alias adopts the name: a project that started with a bare concrete slug
-- (`hello`) puts its next version behind an alias `hello` (active hello_v2, draining
-- hello) and callers keep their name, which now resolves to the alias (resolve_flow).
create or replace function flowlane._alias_may_take_flow_name(alias text, flow_slug text, versions text[])
returns boolean
language sql immutable
set search_path = ''
as $$
  select _alias_may_take_flow_name.alias = _alias_may_take_flow_name.flow_slug
     and _alias_may_take_flow_name.flow_slug = any (_alias_may_take_flow_name.versions)
$$;

create or replace function flowlane.set_alias(alias text, flow_slug text, draining text[] = '{}')
returns flowlane.aliases
language plpgsql volatile
set search_path = ''
as $$
declare
  v_alias text := set_alias.alias;
  v_active text := set_alias.flow_slug;
  v_draining text[] := coalesce(set_alias.draining, '{}');
  v_row flowlane.aliases;
  v_missing text;
  v_other text;
begin
  perform flowlane._check_slug('alias', v_alias);
  perform pg_advisory_xact_lock(hashtext('flowlane.alias:' || lower(v_alias)));
  select f.flow_slug into v_other from flowlane.flows f where lower(f.flow_slug) = lower(v_alias);
  if found and not flowlane._alias_may_take_flow_name(v_alias, v_other, array[v_active] || v_draining) then
    raise exception 'alias "%" conflicts with flow "%" (flow and alias slugs share one namespace)',
      v_alias, v_other
      using errcode = '23505',
            hint = format('an alias may take the name of a flow only while it lists that flow, spelled the same, as its active or draining version (draining => array[%L])', v_other);
  end if;
  select a.alias into v_other from flowlane.aliases a
  where lower(a.alias) = lower(v_alias) and a.alias <> v_alias;
  if found then
    raise exception 'alias "%" conflicts with alias "%" (alias slugs are unique case-insensitively)',
      v_alias, v_other using errcode = '23505';
  end if;
  select s into v_missing from unnest(array[v_active] || v_draining) s
  where s is null or not exists (select 1 from flowlane.flows f where f.flow_slug = s)
  limit 1;
  if found then
    raise exception 'alias "%": flow "%" does not exist', v_alias, coalesce(v_missing, 'NULL')
      using errcode = 'P0002', hint = 'apply the compiled SQL of the flow before its alias';
  end if;
  if v_active = any (v_draining) or cardinality(v_draining) <> (select count(distinct d) from unnest(v_draining) d) then
    raise exception 'alias "%": a version is listed twice (active %, draining %)', v_alias, v_active, v_draining
      using errcode = '22023';
  end if;
  select * into v_row from flowlane.aliases a where a.alias = v_alias for update;
  if found and v_row.flow_slug = v_active and v_row.draining = v_draining then
    return v_row;  -- unchanged: no history row
  end if;
  insert into flowlane.aliases as a (alias, flow_slug, draining)
  values (v_alias, v_active, v_draining)
  on conflict on constraint aliases_pkey do update
    set flow_slug = excluded.flow_slug, draining = excluded.draining, updated_at = clock_timestamp()
  returning * into v_row;
  insert into flowlane.alias_history (alias, flow_slug, draining)
  values (v_alias, v_active, v_draining);
  return v_row;
end;
$$;

-- a new flow may not take the name of an alias (case-insensitive); the flow an alias
-- adopted the name of is the one exception (create_flow's upsert when it is applied again)
create or replace function flowlane._forbid_flow_named_like_alias() returns trigger
language plpgsql
set search_path = ''
as $$
declare
  v_alias text;
begin
  select a.alias into v_alias from flowlane.aliases a
  where lower(a.alias) = lower(new.flow_slug)
    and not flowlane._alias_may_take_flow_name(a.alias, new.flow_slug, array[a.flow_slug] || a.draining);
  if found then
    raise exception 'flow slug "%" conflicts with alias "%" (flow and alias slugs share one namespace)',
      new.flow_slug, v_alias using errcode = '23505';
  end if;
  return new;
end;
$$;

-- register a worker of a deployment (created enabled on first use); refused
-- while the deployment is disabled
create or replace function flowlane.register_worker(
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
    set last_heartbeat_at = greatest(now(), w.last_heartbeat_at)
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
create or replace function flowlane.record_worker_refusal(
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
    set reason = excluded.reason, hint = excluded.hint, refused_at = now()
  returning * into v_row;
  return v_row;
end;
$$;
