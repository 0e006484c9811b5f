-- Events in: runs started by a change of a row in the application's tables (`kind: trigger`).
--
-- set_trigger (from the compiled triggers file) records a trigger and creates, on the
-- application's table, one statement-level PostgreSQL trigger per event with its transition
-- table(s). A statement that changes rows starts their runs as one set (_start_from_events ->
-- _new_runs), in the statement's transaction: a rollback starts nothing. _trigger_fire runs
-- as the flowlane owner (SECURITY DEFINER), so the application's role needs no right on the
-- flowlane schema, only the right to change its row.

create table flowlane.triggers (
  trigger_name text not null,
  flow_name text not null,
  table_name text not null,
  events text[] not null,
  when_pattern jsonb,
  unless_pattern jsonb,
  input_map jsonb,
  key_pointer text,
  on_refused text default 'fail' not null,
  row_key text[],
  created_at timestamptz default now() not null,
  updated_at timestamptz default now() not null,
  constraint triggers_pkey primary key (trigger_name),
  constraint triggers_events_valid check (cardinality(events) > 0 and events <@ array['insert', 'update', 'delete']),
  constraint triggers_name_valid check (flowlane.is_valid_slug(trigger_name)),
  constraint triggers_on_refused_valid check (on_refused in ('fail', 'record'))
);

-- the events a trigger with `on_refused: record` did not start a run for (the row committed)
create table flowlane.trigger_refusals (
  refusal_id bigint generated always as identity not null,
  trigger_name text not null,
  refused_at timestamptz default now() not null,
  event jsonb not null,
  error text not null,
  constraint trigger_refusals_pkey primary key (refusal_id)
);

create index trigger_refusals_trigger_idx on flowlane.trigger_refusals (trigger_name, refused_at desc);

-- the runs each trigger started (runs.origin ->> 'trigger'), for the listing of triggers
create index runs_trigger_idx on flowlane.runs ((origin ->> 'trigger')) where (origin ? 'trigger');

-- the name of the PostgreSQL trigger of one event of a flowlane trigger
create function flowlane._trigger_pg_name(p_trigger text, p_event text) returns text
language sql immutable
set search_path = ''
as $$ select 'flowlane_' || p_trigger || '_' || p_event $$;

-- records a trigger and (re)creates its PostgreSQL triggers; the same arguments again change
-- nothing. table_name: schema-qualified, kept as written; p_events: insert, update, delete; when_pattern / unless_pattern: the containment
-- patterns an event ({"op", "old", "new"}) must hold / must not hold; input_map: run input
-- field -> JSON pointer into the event (null: the new row, the old one for a delete);
-- key_pointer: the event's idempotency key; on_refused: fail (the statement fails) or record
create function flowlane.set_trigger(
  trigger_name text,
  flow_name text,
  table_name text,
  events text[],
  when_pattern jsonb = null,
  unless_pattern jsonb = null,
  input_map jsonb = null,
  key_pointer text = null,
  on_refused text = 'fail'
) returns flowlane.triggers
language plpgsql volatile
set search_path = ''
as $$
declare
  v_what text := format('trigger "%s"', set_trigger.trigger_name);
  v_table regclass := to_regclass(set_trigger.table_name);
  v_old flowlane.triggers;
  v_new flowlane.triggers;
begin
  perform flowlane._check_slug('trigger', set_trigger.trigger_name);
  perform flowlane.resolve_flow(set_trigger.flow_name);
  if v_table is null then
    raise exception '%: no table %', v_what, coalesce(quote_literal(set_trigger.table_name), 'NULL')
      using errcode = '42P01', hint = 'create the table before applying the trigger, and name it with its schema';
  end if;
  if events is null or cardinality(events) = 0
     or not events <@ array['insert', 'update', 'delete'] then
    raise exception '%: events are insert, update and delete, not %', v_what, coalesce(events::text, 'NULL')
      using errcode = '22023';
  end if;
  if length(flowlane._trigger_pg_name(set_trigger.trigger_name, 'delete')) > 63 then
    raise exception '%: a trigger name has at most 47 characters', v_what using errcode = '22023';
  end if;
  v_new := row(set_trigger.trigger_name, set_trigger.flow_name, set_trigger.table_name,
               array(select distinct e from unnest(events) e order by e), when_pattern, unless_pattern,
               input_map, key_pointer, on_refused, flowlane._primary_key(v_table), flowlane._now(), flowlane._now());
  perform flowlane._check_trigger_pointers(v_what, v_new);
  if 'update' = any (v_new.events) and v_new.row_key is null then
    raise exception '%: table % has no primary key, which pairs each updated row with its old values', v_what,
      v_table using errcode = '22023', hint = 'add a primary key, or trigger on insert and delete only';
  end if;
  select * into v_old from flowlane.triggers t where t.trigger_name = set_trigger.trigger_name for update;
  if found and (v_old.flow_name, v_old.table_name, v_old.events, v_old.when_pattern, v_old.unless_pattern,
                v_old.input_map, v_old.key_pointer, v_old.on_refused, v_old.row_key)
      is not distinct from (v_new.flow_name, v_new.table_name, v_new.events, v_new.when_pattern,
                            v_new.unless_pattern, v_new.input_map, v_new.key_pointer, v_new.on_refused,
                            v_new.row_key) then
    return v_old;  -- unchanged: applying the same file again writes nothing
  end if;
  if found then
    perform flowlane._drop_pg_triggers(v_old);
    v_new.created_at := v_old.created_at;
  end if;
  insert into flowlane.triggers as t values (v_new.*)
  on conflict on constraint triggers_pkey do update
    set flow_name = excluded.flow_name, table_name = excluded.table_name, events = excluded.events,
        when_pattern = excluded.when_pattern, unless_pattern = excluded.unless_pattern,
        input_map = excluded.input_map, key_pointer = excluded.key_pointer, on_refused = excluded.on_refused,
        row_key = excluded.row_key, updated_at = excluded.updated_at
  returning * into v_new;
  perform flowlane._create_pg_triggers(v_new);
  return v_new;
end;
$$;

-- the columns of a table's primary key, in key order (null: none)
create function flowlane._primary_key(p_table regclass) returns text[]
language sql stable
set search_path = ''
as $$
  select array_agg(a.attname::text order by k.n)
  from pg_catalog.pg_index i
  cross join lateral unnest(i.indkey::int2[]) with ordinality k(attnum, n)
  join pg_catalog.pg_attribute a on a.attrelid = i.indrelid and a.attnum = k.attnum
  where i.indrelid = p_table and i.indisprimary
$$;

create function flowlane._check_trigger_pointers(p_what text, p_trigger flowlane.triggers) returns void
language plpgsql immutable
set search_path = ''
as $$
declare
  v_pointer text;
begin
  if jsonb_typeof(p_trigger.input_map) is distinct from 'object' and p_trigger.input_map is not null then
    raise exception '%: input_map must be an object of JSON pointers', p_what using errcode = '22023';
  end if;
  for v_pointer in select p from (select p_trigger.key_pointer as p
                                  union all select m.value #>> '{}' from jsonb_each(p_trigger.input_map) m) x
                   where x.p is not null loop
    if v_pointer !~ '^(/([^~/]|~[01])*)+$' then
      raise exception '%: % is not a JSON pointer', p_what, quote_literal(v_pointer)
        using errcode = '22023', hint = 'write /new/field or /old/field';
    end if;
  end loop;
  if p_trigger.on_refused is null or p_trigger.on_refused not in ('fail', 'record') then
    raise exception '%: on_refused must be fail or record, not %', p_what,
      coalesce(quote_literal(p_trigger.on_refused), 'NULL') using errcode = '22023';
  end if;
end;
$$;

create function flowlane._create_pg_triggers(p_trigger flowlane.triggers) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_event text;
begin
  foreach v_event in array p_trigger.events loop
    execute format('create trigger %I after %s on %s referencing %s for each statement '
                   'execute function flowlane._trigger_fire(%L)',
                   flowlane._trigger_pg_name(p_trigger.trigger_name, v_event), v_event, p_trigger.table_name::regclass,
                   case v_event when 'insert' then 'new table as flowlane_new'
                                when 'update' then 'old table as flowlane_old new table as flowlane_new'
                                else 'old table as flowlane_old' end,
                   p_trigger.trigger_name);
  end loop;
end;
$$;

create function flowlane._drop_pg_triggers(p_trigger flowlane.triggers) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_event text;
begin
  if to_regclass(p_trigger.table_name) is null then
    return;  -- the table is gone, and its triggers with it
  end if;
  foreach v_event in array p_trigger.events loop
    execute format('drop trigger if exists %I on %s',
                   flowlane._trigger_pg_name(p_trigger.trigger_name, v_event), p_trigger.table_name::regclass);
  end loop;
end;
$$;

-- removes the triggers not named (and their PostgreSQL triggers); returns the removed names
create function flowlane.keep_only_triggers(trigger_names text[]) returns text[]
language plpgsql volatile
set search_path = ''
as $$
declare
  v_trigger flowlane.triggers;
  v_removed text[] := '{}';
begin
  for v_trigger in select * from flowlane.triggers t
                   where t.trigger_name <> all (coalesce(trigger_names, '{}'))
                   order by t.trigger_name for update loop
    perform flowlane._drop_pg_triggers(v_trigger);
    delete from flowlane.trigger_refusals r where r.trigger_name = v_trigger.trigger_name;
    delete from flowlane.triggers t where t.trigger_name = v_trigger.trigger_name;
    v_removed := v_removed || v_trigger.trigger_name;
  end loop;
  return v_removed;
end;
$$;

-- the statement-level trigger function: the statement's events that pass the trigger's
-- patterns start their runs. Runs as the flowlane owner; the transition tables are the
-- statement's rows.
create function flowlane._trigger_fire() returns trigger
language plpgsql volatile
security definer
set search_path = ''
as $$
declare
  v_trigger flowlane.triggers;
  v_events jsonb[];
  v_inputs jsonb[];
  v_keys text[];
  v_origins jsonb[];
begin
  select * into v_trigger from flowlane.triggers t where t.trigger_name = tg_argv[0];
  if not found then
    raise exception 'flowlane trigger "%" on %.% is not recorded', tg_argv[0], tg_table_schema, tg_table_name
      using errcode = '55000', hint = 'apply the project again: its triggers file recreates or removes it';
  end if;
  execute flowlane._trigger_events_sql(v_trigger, lower(tg_op))
    into v_events, v_inputs, v_keys, v_origins using v_trigger.when_pattern, v_trigger.unless_pattern;
  if v_events is not null then
    perform flowlane._start_from_events(v_trigger, v_events, v_inputs, v_keys, v_origins);
  end if;
  return null;
end;
$$;

-- the query of a statement's events that hold the pattern $1 and not the pattern $2 (null: no
-- pattern), as four arrays in one order: each event {"op", "old", "new"} (rows as JSON), its
-- run input (the fields of input_map, a pointer that finds nothing giving null; else the row),
-- its idempotency key (`<trigger>:<value at key_pointer>`: a string as itself, other values as
-- JSON text) and its origin ({"trigger", "op", "row": the primary key's values}). Written once
-- per statement with the pointers as literal paths, so that no function is called per row. An
-- update pairs old and new rows by the primary key.
create function flowlane._trigger_events_sql(p_trigger flowlane.triggers, p_op text) returns text
language sql stable
set search_path = ''
as $$
  select format('select array_agg(x.e), array_agg(%s), array_agg(%s), array_agg(%s) from ('
                'select %s as e, %s as row_key from %s) x '
                'where ($1 is null or x.e @> $1) and ($2 is null or not x.e @> $2)',
                case when p_trigger.input_map is null
                     then format('x.e -> %L', case p_op when 'delete' then 'old' else 'new' end)
                     else (select format('jsonb_build_object(%s)', string_agg(
                                    format('%L, coalesce(x.e #> %L, ''null'')', m.key,
                                           flowlane._pointer_path(m.value #>> '{}')), ', ' order by m.key))
                           from jsonb_each(p_trigger.input_map) m) end,
                case when p_trigger.key_pointer is null then 'null::text'
                     else format('%L || (x.e #>> %L)', p_trigger.trigger_name || ':',
                                 flowlane._pointer_path(p_trigger.key_pointer)) end,
                format('jsonb_build_object(''trigger'', %L, ''op'', %L, ''row'', x.row_key)',
                       p_trigger.trigger_name, p_op),
                case p_op when 'insert' then 'jsonb_build_object(''op'', ''insert'', ''new'', to_jsonb(n))'
                          when 'update' then 'jsonb_build_object(''op'', ''update'', ''old'', to_jsonb(o), '
                                             '''new'', to_jsonb(n))'
                          else 'jsonb_build_object(''op'', ''delete'', ''old'', to_jsonb(o))' end,
                coalesce((select format('jsonb_build_object(%s)', string_agg(
                                   format('%L, %s.%I', c, case p_op when 'delete' then 'o' else 'n' end, c),
                                   ', ' order by k))
                          from unnest(p_trigger.row_key) with ordinality u(c, k)), 'null::jsonb'),
                case p_op when 'insert' then 'flowlane_new n'
                          when 'update' then format('flowlane_old o join flowlane_new n using (%s)',
                                                    (select string_agg(format('%I', c), ', ' order by k)
                                                     from unnest(p_trigger.row_key) with ordinality u(c, k)))
                          else 'flowlane_old o' end)
$$;

-- starts the runs of a statement's events as one set. With a key: an event whose key already
-- has a run under the flow name (as start_flow's keys), or repeats an earlier event of this
-- statement, starts nothing. An input the flow's contract refuses fails the statement
-- (on_refused fail) or is recorded in trigger_refusals (record).
create function flowlane._start_from_events(p_trigger flowlane.triggers, p_events jsonb[], p_inputs jsonb[],
                                            p_keys text[], p_origins jsonb[]) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_flow text := flowlane.resolve_flow(p_trigger.flow_name);
  v_kept int[];
  v_contract flowlane.contracts;
  v_refused int[];
begin
  if p_trigger.key_pointer is not null then
    v_kept := array(select x.i from (select i, row_number() over (partition by p_keys[i] order by i) as nth
                                     from generate_subscripts(p_keys, 1) i) x
                    where p_keys[x.i] is null
                       or (x.nth = 1 and not exists (select 1 from flowlane.runs r
                                                     where r.called_as = p_trigger.flow_name
                                                       and r.idempotency_key = p_keys[x.i]))
                    order by x.i);
  end if;
  select * into v_contract from flowlane.contracts c where c.flow_slug = v_flow and coalesce(c.step_slug, '') = '';
  if found then
    v_refused := array(select i from unnest(flowlane._refused_inputs(v_contract, p_inputs)) i
                       where v_kept is null or i = any (v_kept) order by i);
    if cardinality(v_refused) > 0 then
      perform flowlane._refuse_events(p_trigger, v_flow, v_contract, p_events, p_inputs, v_refused);
      v_kept := array(select i from generate_subscripts(p_inputs, 1) i
                      where (v_kept is null or i = any (v_kept)) and i <> all (v_refused) order by i);
    end if;
  end if;
  if v_kept is not null then
    if cardinality(v_kept) = 0 then
      return;
    end if;
    p_inputs := array(select p_inputs[i] from unnest(v_kept) with ordinality u(i, n) order by n);
    p_keys := array(select p_keys[i] from unnest(v_kept) with ordinality u(i, n) order by n);
    p_origins := array(select p_origins[i] from unnest(v_kept) with ordinality u(i, n) order by n);
  end if;
  perform flowlane._check_start_input(v_flow, p_inputs[1], format('trigger "%s"', p_trigger.trigger_name));
  perform from flowlane._new_runs(v_flow, p_inputs, '{}', null, p_keys, p_trigger.flow_name, null, p_origins);
end;
$$;

-- the refused events of a statement: on_refused fail raises for the first, naming the path
-- and the rule; record keeps each with its reason
create function flowlane._refuse_events(p_trigger flowlane.triggers, p_flow text, p_contract flowlane.contracts,
                                        p_events jsonb[], p_inputs jsonb[], p_refused int[]) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_i int;
  v_found jsonb;
  v_error text;
begin
  foreach v_i in array p_refused loop
    v_found := flowlane.contract_violation(p_contract.schema, p_inputs[v_i]);
    v_error := format('flow "%s" refuses the run input: %s: %s (the rule at input_schema%s)', p_flow,
                      coalesce(nullif(v_found ->> 'path', ''), '/'), v_found ->> 'message', v_found ->> 'schema_path');
    if p_trigger.on_refused = 'fail' then
      raise exception 'trigger "%" on %: %', p_trigger.trigger_name, p_trigger.table_name, v_error
        using errcode = '22023', detail = format('the row: %s', flowlane._contract_shown(
                                                   coalesce(p_events[v_i] -> 'new', p_events[v_i] -> 'old'))),
              hint = 'correct the row, or the trigger''s input, or declare on_refused: record to let such rows commit';
    end if;
    insert into flowlane.trigger_refusals (trigger_name, event, error)
    values (p_trigger.trigger_name, p_events[v_i], v_error);
  end loop;
end;
$$;

-- each trigger with what it started: runs, refusals, the latest refusal
create function flowlane.trigger_activity() returns table (
  trigger_name text, flow_name text, table_name text, events text[], on_refused text, runs bigint,
  runs_last_day bigint, last_run_at timestamptz, refusals bigint, last_error text, last_error_at timestamptz)
language sql stable
set search_path = ''
as $$
  select t.trigger_name, t.flow_name, t.table_name, t.events, t.on_refused,
         r.runs, r.runs_last_day, r.last_run_at, f.refusals, l.error, l.refused_at
  from flowlane.triggers t
  cross join lateral (select count(*) as runs, count(*) filter (where x.started_at > flowlane._now() - interval '1 day')
                             as runs_last_day, max(x.started_at) as last_run_at
                      from flowlane.runs x where x.origin ? 'trigger' and x.origin ->> 'trigger' = t.trigger_name) r
  cross join lateral (select count(*) as refusals from flowlane.trigger_refusals y
                      where y.trigger_name = t.trigger_name) f
  left join lateral (select z.error, z.refused_at from flowlane.trigger_refusals z
                     where z.trigger_name = t.trigger_name order by z.refused_at desc limit 1) l on true
  order by t.trigger_name
$$;
