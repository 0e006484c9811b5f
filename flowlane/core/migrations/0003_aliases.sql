-- flowlane SQL Core 0003: aliases over concrete flow versions, with history.
--
-- An alias is a stable name: new runs of the alias start its active concrete
-- version; draining versions may still have runs executing. Every change of
-- an alias is recorded in alias_history. Flow slugs and alias slugs share one
-- case-insensitive namespace (checked both ways). Runs always record the
-- concrete slug: start_flow calls resolve_flow, replaced here.

create table flowlane.aliases (
  alias text primary key,
  flow_slug text not null references flowlane.flows (flow_slug),
  draining text[] not null default '{}',
  updated_at timestamptz not null default clock_timestamp(),
  constraint aliases_slug_valid check (flowlane.is_valid_slug(alias)),
  constraint aliases_active_not_draining check (not (flow_slug = any (draining))),
  constraint aliases_draining_no_nulls check (array_position(draining, null) is null)
);
create unique index aliases_slug_ci_unique on flowlane.aliases (lower(alias));

create table flowlane.alias_history (
  id bigint generated always as identity primary key,
  alias text not null,
  flow_slug text not null,
  draining text[] not null,
  changed_at timestamptz not null default clock_timestamp()
);
create index alias_history_alias_idx on flowlane.alias_history (alias, id);

-- a new flow may not take the name of an alias (case-insensitive)
create function flowlane._forbid_flow_named_like_alias() returns trigger
language plpgsql
set search_path = ''
as $$
declare
  v_alias text;
begin
  select a.alias into v_alias from flowlane.aliases a where lower(a.alias) = lower(new.flow_slug);
  if found then
    raise exception 'flow slug "%" conflicts with alias "%" (flow and alias slugs share one namespace)',
      new.flow_slug, v_alias using errcode = '23505';
  end if;
  return new;
end;
$$;

create trigger flows_not_named_like_alias
  before insert on flowlane.flows
  for each row execute function flowlane._forbid_flow_named_like_alias();

create function flowlane.set_alias(alias text, flow_slug text, draining text[] = '{}')
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
  if found then
    raise exception 'alias "%" conflicts with flow "%" (flow and alias slugs share one namespace)',
      v_alias, v_other using errcode = '23505';
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

create or replace function flowlane.resolve_flow(flow_slug_or_alias text) returns text
language plpgsql stable
set search_path = ''
as $$
declare
  v_slug text;
begin
  select a.flow_slug into v_slug from flowlane.aliases a where a.alias = flow_slug_or_alias;
  if found then
    return v_slug;
  end if;
  select f.flow_slug into v_slug from flowlane.flows f where f.flow_slug = flow_slug_or_alias;
  if not found then
    raise exception 'unknown flow "%" (no flow or alias has this slug)', flow_slug_or_alias
      using errcode = 'P0002',
            hint = 'create the flow (apply its compiled SQL) or its alias before starting runs';
  end if;
  return v_slug;
end;
$$;
