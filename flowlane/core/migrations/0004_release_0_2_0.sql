-- flowlane SQL Core 0004: release 0.2.0.
-- Drafted by `python -m flowlane.core.draft_migration` from the engine source; reviewed by a person.
--
-- Data contracts read a count (minLength, maxLength, minItems, maxItems) written as a whole
-- number with a fraction, 2.0, as the count 2, as JSON Schema does and as _contract_problem
-- already accepted: set_contract and contract_violation failed on it with "invalid input
-- syntax for type integer". The counts go through the new _contract_count, and a count that
-- is not a whole number is named with its value. Only functions change: stored contracts and
-- their compiled checks stay as they are (a whole count compiles to the same text, so the same
-- _contract_check_<md5> function). The previous release's workers keep running: none of the
-- functions they call while claiming, completing or failing changes.
--
-- Events in: a run records what started it when that is not a call (runs.origin, a new
-- nullable column: existing runs keep null). `kind: trigger` documents are recorded in the new
-- table triggers by set_trigger, which creates statement-level triggers on the application's
-- tables; those start runs through _start_from_events and the new _new_runs / _new_run, which
-- take each run's origin. _create_runs and _start_one_run keep their signatures and call them
-- with no origin, so calls of the previous release's functions in flight while this migration
-- commits keep working. Refusals a trigger records go to the new table trigger_refusals.
-- The input contract's fast verdict moves into _refused_inputs, shared by _check_contract_inputs
-- and the triggers. No function the previous release's workers call changes its signature.
--
-- Webhooks: start_flow records the origin its transaction names in the setting flowlane.origin
-- (the new _call_origin; the webhook endpoint names itself and the delivery there). Its
-- signature is kept, and without the setting a run's origin is null, as before.

-- == Written by hand: tables, types and data that the functions need ==

-- events in:
alter table flowlane.runs add column origin jsonb;

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

create table flowlane.trigger_refusals (
  refusal_id bigint generated always as identity not null,
  trigger_name text not null,
  refused_at timestamptz default now() not null,
  event jsonb not null,
  error text not null,
  constraint trigger_refusals_pkey primary key (refusal_id)
);

create index trigger_refusals_trigger_idx on flowlane.trigger_refusals (trigger_name, refused_at desc);

create index runs_trigger_idx on flowlane.runs ((origin ->> 'trigger')) where (origin ? 'trigger');

-- == Drafted from the engine source by `python -m flowlane.core.draft_migration`; redrafted, never edited ==

set local check_function_bodies = off;

-- step_tasks has no index on flow_slug (one would cost every enqueue): its
-- rows are found through the flow's runs (primary key prefix), so deleting a
-- small flow costs the same next to 10k or 100k other tasks
-- (benchmarks/recovery_scaling.py)
create or replace function flowlane.delete_flow_and_data(flow_slug text) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_runs uuid[];
  v_active flowlane.step_tasks[];
  v_trigger text;
begin
  -- a trigger starting a missing flow would fail every write of its table
  select t.trigger_name into v_trigger from flowlane.triggers t
  where t.flow_name = delete_flow_and_data.flow_slug order by t.trigger_name limit 1;
  if found then
    raise exception 'flow "%" is started by trigger "%"', delete_flow_and_data.flow_slug, v_trigger
      using errcode = '2BP01', hint = 'remove the trigger''s document and apply, or point it at another flow';
  end if;
  v_runs := array(select r.run_id from flowlane.runs r where r.flow_slug = delete_flow_and_data.flow_slug
                  order by r.run_id for update);
  select coalesce(array_agg(t order by t.queue_name, t.message_id), '{}') into v_active
  from flowlane.step_tasks t
  where t.run_id = any (v_runs) and t.status in ('queued', 'started');
  perform flowlane._archive_tasks(v_active);
  delete from flowlane.step_tasks t where t.run_id = any (v_runs);
  delete from flowlane.step_states ss where ss.run_id = any (v_runs);
  delete from flowlane.runs r where r.run_id = any (v_runs);
  delete from flowlane.deps d where d.flow_slug = delete_flow_and_data.flow_slug;
  delete from flowlane.steps s where s.flow_slug = delete_flow_and_data.flow_slug;
  delete from flowlane.flows f where f.flow_slug = delete_flow_and_data.flow_slug;
end;
$$;

-- start_at: a later start (the run waits, cancellable, until the maintenance tick begins it);
-- idempotency_key (or the flow's dedup pointer into the input): a second start with the same
-- (called name, key) returns the first run
create or replace function flowlane.start_flow(flow_slug text, input jsonb, run_id uuid = null,
                                    start_at timestamptz = null, idempotency_key text = null,
                                    priority int = null)
returns flowlane.runs
language plpgsql volatile
set search_path = ''
as $$
declare
  v_flow text := flowlane.resolve_flow(start_flow.flow_slug);
  v_run flowlane.runs;
  v_key text;
begin
  perform flowlane._check_start_input(v_flow, input, format('start_flow(%s)', v_flow));
  perform flowlane._check_priority(format('start_flow(%s)', v_flow), start_flow.priority);
  v_key := flowlane._start_key(v_flow, input, start_flow.idempotency_key, format('start_flow(%s)', v_flow));
  if v_key is not null then
    v_run := flowlane._keyed_run(start_flow.flow_slug, v_key);
    if v_run.run_id is not null then
      return v_run;
    end if;
  end if;
  if start_flow.run_id is not null then
    -- a retried start with the same run id returns the existing run
    select * into v_run from flowlane.runs r where r.run_id = start_flow.run_id;
    if found then
      if v_run.flow_slug <> v_flow or v_run.input <> input then
        raise exception 'run % already exists for flow "%" with another flow or input', start_flow.run_id,
          v_run.flow_slug using errcode = '23505';
      end if;
      perform flowlane._found_run(v_run.run_id);
      return v_run;
    end if;
  end if;
  select * into v_run from flowlane._new_runs(v_flow, array[input], array[start_flow.run_id],
                                              start_flow.start_at, array[v_key], start_flow.flow_slug,
                                              start_flow.priority, array[flowlane._call_origin()]);
  return v_run;
end;
$$;

-- what started a call's run (runs.origin): null for a plain call; a server that starts runs for
-- others (the webhook endpoint) names itself for its transaction in the setting flowlane.origin,
-- a JSON object such as {"webhook": name, "delivery": id}
create or replace function flowlane._call_origin() returns jsonb
language sql stable
set search_path = ''
as $$
  select case when jsonb_typeof(o) = 'object' then o end
  from (select nullif(current_setting('flowlane.origin', true), '')::jsonb as o) s
$$;

-- many runs of one flow or alias in one call; returns the runs in input order.
-- All or nothing: a bad input raises naming its position and starts no run.
create or replace function flowlane.start_flows(flow_slug text, inputs jsonb[], start_at timestamptz = null,
                                     priority int = null)
returns setof flowlane.runs
language plpgsql volatile
set search_path = ''
as $$
declare
  v_flow text := flowlane.resolve_flow(start_flows.flow_slug);
  v_i int;
begin
  if inputs is null then
    raise exception 'start_flows(%): inputs must be an array of JSON values', v_flow using errcode = '22004';
  end if;
  if cardinality(inputs) = 0 then
    return;
  end if;
  perform flowlane._check_priority(format('start_flows(%s)', v_flow), start_flows.priority);
  for v_i in select i from generate_subscripts(inputs, 1) i
             where inputs[i] is null or jsonb_typeof(inputs[i]) <> 'array' order by i loop
    perform flowlane._check_start_input(v_flow, inputs[v_i], format('start_flows(%s): input %s', v_flow, v_i - 1));
  end loop;
  if exists (select 1 from flowlane.flows f where f.flow_slug = v_flow and f.opt_dedup_key is not null) then
    -- each input's key may name an earlier run (or an earlier input of this call)
    for v_i in select i from generate_subscripts(inputs, 1) i order by i loop
      return next flowlane.start_flow(start_flows.flow_slug, inputs[v_i], null, start_flows.start_at, null,
                                      start_flows.priority);
    end loop;
    return;
  end if;
  return query select * from flowlane._new_runs(v_flow, inputs, '{}', start_flows.start_at, null, null,
                                                start_flows.priority, null::jsonb[]);
end;
$$;

-- _new_runs and _new_run under their earlier names, without an origin: the calls of schedules
-- and child flows, and of the previous release's functions while a migration commits
create or replace function flowlane._create_runs(p_flow text, p_inputs jsonb[], p_run_ids uuid[],
                                      p_start_at timestamptz = null, p_keys text[] = null,
                                      p_called text = null, p_priority int = null)
returns setof flowlane.runs
language sql volatile
set search_path = ''
as $$
  select * from flowlane._new_runs(p_flow, p_inputs, p_run_ids, p_start_at, p_keys, p_called, p_priority,
                                   null::jsonb[])
$$;

create or replace function flowlane._start_one_run(p_flow flowlane.flows, p_input jsonb, p_run_id uuid,
                                        p_start_at timestamptz, p_key text, p_called text, p_priority int)
returns flowlane.runs
language sql volatile
set search_path = ''
as $$
  select * from flowlane._new_run(p_flow, p_input, p_run_id, p_start_at, p_key, p_called, p_priority,
                                  null::jsonb)
$$;

-- new runs of one concrete flow (inputs checked by the caller); returns them in input order
-- p_start_at in the future: the runs wait (status waiting) for the maintenance tick;
-- p_keys: each run's idempotency key within p_called (the name the caller started);
-- p_priority: the runs' priority (null: the flow's); p_origins: what started each run (null:
-- a call; see flowlane.runs.origin). A flow with a concurrency limit: under
-- the keys' locks, a run begins while its key has room and no run held before it; the
-- others are held (waiting, hold_seq in input order)
create or replace function flowlane._new_runs(p_flow text, p_inputs jsonb[], p_run_ids uuid[],
                                   p_start_at timestamptz, p_keys text[], p_called text, p_priority int,
                                   p_origins jsonb[])
returns setof flowlane.runs
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set plan_cache_mode = force_generic_plan
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_ids uuid[];
  v_waiting boolean := coalesce(p_start_at > now(), false);
  v_flow flowlane.flows;
  v_slot_keys text[];
  v_begins boolean[];
  v_run flowlane.runs;
begin
  perform flowlane._check_contract_inputs(p_flow, p_inputs);
  select * into v_flow from flowlane.flows f where f.flow_slug = p_flow;
  if cardinality(p_inputs) = 1 and not v_waiting and v_flow.opt_concurrency_limit is null then
    v_run := flowlane._new_run(v_flow, p_inputs[1], p_run_ids[1], p_start_at, p_keys[1], p_called, p_priority,
                               p_origins[1]);
    if v_run.run_id is not null then
      return next v_run;
      return;
    end if;
  end if;
  v_ids := array(select coalesce(p_run_ids[i], gen_random_uuid()) from generate_subscripts(p_inputs, 1) i order by i);
  if v_flow.opt_concurrency_limit is not null then
    v_slot_keys := array(select flowlane._concurrency_key(v_flow.opt_concurrency_key, p_inputs[i])
                         from generate_subscripts(p_inputs, 1) i order by i);
  end if;
  if v_flow.opt_concurrency_limit is not null and not v_waiting then
    perform flowlane._lock_slots('run:' || p_flow, v_slot_keys);
    v_begins := array(
      select x.rank <= case when exists (select 1 from flowlane.runs h
                                         where h.flow_slug = p_flow and h.concurrency_key = x.key
                                           and h.status = 'waiting' and h.hold_seq is not null) then 0
                            else v_flow.opt_concurrency_limit - (
                              select count(*) from flowlane.runs r
                              where r.flow_slug = p_flow and r.concurrency_key = x.key and r.status = 'started') end
      from (select i, v_slot_keys[i] as key, row_number() over (partition by v_slot_keys[i] order by i) as rank
            from generate_subscripts(p_inputs, 1) i) x
      order by x.i);
  end if;
  insert into flowlane.runs (run_id, flow_slug, input, remaining_steps, trace_parent, status, start_at,
                             deadline_at, called_as, idempotency_key, priority, concurrency_key, hold_seq, origin)
  select v_ids[i], p_flow, p_inputs[i], (select count(*) from flowlane.steps s where s.flow_slug = p_flow),
         flowlane._trace_parent(),
         case when v_waiting or not coalesce(v_begins[i], true) then 'waiting' else 'started' end, p_start_at,
         case when v_waiting or not coalesce(v_begins[i], true) then null else flowlane._run_deadline(p_flow, now()) end,
         case when p_keys[i] is not null then p_called end, p_keys[i],
         coalesce(p_priority, v_flow.opt_priority, 0), v_slot_keys[i],
         case when not v_waiting and not coalesce(v_begins[i], true) then nextval('flowlane.hold_seq') end,
         p_origins[i]
  from generate_subscripts(p_inputs, 1) i order by i;
  insert into flowlane.step_states (flow_slug, run_id, step_slug, remaining_deps, initial_tasks)
  select p_flow, v_ids[i], s.step_slug, s.deps_count,
         case when s.step_type <> 'map' then 1
              when s.deps_count = 0 and jsonb_typeof(p_inputs[i]) = 'array' then jsonb_array_length(p_inputs[i])
              else null end
  from generate_subscripts(p_inputs, 1) i, flowlane.steps s
  where s.flow_slug = p_flow
  order by v_ids[i], s.step_slug;
  if not v_waiting then
    perform flowlane._progress_runs(array(select v_ids[i] from generate_subscripts(v_ids, 1) i
                                          where coalesce(v_begins[i], true) order by v_ids[i]));
  end if;
  return query select r.* from unnest(v_ids) with ordinality as u (run_id, ord)
               join flowlane.runs r
                 on r.run_id = u.run_id and r.run_id = any (array(select x from unnest(v_ids) x order by 1))
               order by u.ord;
end;
$$;

-- _new_runs for one run that begins now, of a flow without a concurrency limit whose root
-- steps need nothing resolved first (a queue, no condition, no map over an empty input): the
-- run and its step states are written in their final state, root steps started, one
-- statement each, instead of the batch's generic statements. Null when the flow does not
-- qualify: the caller takes the batch path. tests/core/test_one_start.py and the differential
-- test (tests/core/test_differential.py) compare the two.
create or replace function flowlane._new_run(p_flow flowlane.flows, p_input jsonb, p_run_id uuid,
                                  p_start_at timestamptz, p_key text, p_called text, p_priority int,
                                  p_origin jsonb)
returns flowlane.runs
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set plan_cache_mode = force_generic_plan
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_steps int;
  v_plain boolean;
  v_elements int := case when jsonb_typeof(p_input) = 'array' then jsonb_array_length(p_input) end;
  v_run flowlane.runs;
  v_started flowlane.step_states[];
begin
  select count(*), coalesce(bool_and(s.deps_count > 0 or (s.queue_name is not null
                                     and s.required_input_pattern is null and s.forbidden_input_pattern is null
                                     and (s.step_type = 'single' or (s.step_type = 'map' and v_elements > 0)))), false)
    into v_steps, v_plain
  from flowlane.steps s where s.flow_slug = (p_flow).flow_slug;
  if not v_plain then
    return null;
  end if;
  insert into flowlane.runs (run_id, flow_slug, input, remaining_steps, trace_parent, status, start_at, deadline_at,
                             called_as, idempotency_key, priority, origin)
  values (coalesce(p_run_id, gen_random_uuid()), (p_flow).flow_slug, p_input, v_steps, flowlane._trace_parent(),
          'started', p_start_at, flowlane._run_deadline((p_flow).flow_slug, now()),
          case when p_key is not null then p_called end, p_key, coalesce(p_priority, (p_flow).opt_priority, 0),
          p_origin)
  returning * into v_run;
  with written as (
    insert into flowlane.step_states as ss (flow_slug, run_id, step_slug, remaining_deps, initial_tasks, status,
                                            started_at, remaining_tasks)
    select s.flow_slug, v_run.run_id, s.step_slug, s.deps_count, t.tasks,
           case when s.deps_count = 0 then 'started' else 'created' end,
           case when s.deps_count = 0 then now() end,
           case when s.deps_count = 0 then t.tasks end
    from flowlane.steps s
    cross join lateral (  -- a dependent map's count is known when its parent completes
      select case when s.step_type <> 'map' then 1 when s.deps_count = 0 then v_elements end as tasks) t
    where s.flow_slug = (p_flow).flow_slug
    order by s.step_slug
    returning ss
  ) select array_agg(w.ss) filter (where (w.ss).status = 'started') into v_started from written w;
  perform flowlane._enqueue_started(v_started);
  return v_run;
end;
$$;

-- the first problem of a schema as a contract (null when it is one): "<schema path>: what"
create or replace function flowlane._contract_problem(p_schema jsonb, p_at text = '') returns text
language plpgsql immutable
set search_path = ''
as $$
declare
  v_key text;
  v_value jsonb;
  v_found text;
begin
  if jsonb_typeof(p_schema) = 'boolean' then
    return null;
  end if;
  if jsonb_typeof(p_schema) is distinct from 'object' then
    return format('%s: a schema is a JSON object or a boolean, got %s', coalesce(nullif(p_at, ''), '/'),
                  coalesce(jsonb_typeof(p_schema), 'null'));
  end if;
  for v_key, v_value in select e.key, e.value from jsonb_each(p_schema) e order by e.key loop
    v_found := case
      when not v_key = any (flowlane.contract_keywords()) then
        format('keyword %s is outside the supported subset', v_key)
      when v_key = 'type' and not (
             (jsonb_typeof(v_value) = 'string' and v_value #>> '{}' in ('null', 'boolean', 'object', 'array', 'number', 'integer', 'string'))
             or (jsonb_typeof(v_value) = 'array' and jsonb_array_length(v_value) > 0 and not exists (
                   select 1 from jsonb_array_elements(v_value) t
                   where jsonb_typeof(t) <> 'string'
                      or t #>> '{}' not in ('null', 'boolean', 'object', 'array', 'number', 'integer', 'string')))) then
        'type must be a type name or a non-empty array of them'
      when v_key in ('properties') and jsonb_typeof(v_value) <> 'object' then
        'properties must be an object of schemas'
      when v_key = 'required' and (jsonb_typeof(v_value) <> 'array'
             or exists (select 1 from jsonb_array_elements(v_value) t where jsonb_typeof(t) <> 'string')) then
        'required must be an array of property names'
      when v_key in ('enum') and jsonb_typeof(v_value) <> 'array' then
        'enum must be an array'
      when v_key in ('minimum', 'maximum', 'exclusiveMinimum', 'exclusiveMaximum') and jsonb_typeof(v_value) <> 'number' then
        format('%s must be a number', v_key)
      when v_key in ('minLength', 'maxLength', 'minItems', 'maxItems') and not (
             jsonb_typeof(v_value) = 'number' and (v_value #>> '{}')::numeric >= 0
             and (v_value #>> '{}')::numeric = floor((v_value #>> '{}')::numeric)
             and (v_value #>> '{}')::numeric <= 2147483647) then
        format('%s must be a whole number from 0, got %s', v_key, v_value)
      when v_key = 'pattern' and jsonb_typeof(v_value) <> 'string' then
        'pattern must be a string'
      when v_key = 'pattern' and not flowlane._is_valid_regex(v_value #>> '{}') then
        'pattern is not a regular expression PostgreSQL can evaluate'
      else null end;
    if v_found is not null then
      return format('%s/%s: %s', p_at, flowlane._pointer_token(v_key), v_found);
    end if;
    if v_key in ('items', 'additionalProperties') then
      v_found := flowlane._contract_problem(v_value, p_at || '/' || v_key);
    elsif v_key = 'properties' then
      select flowlane._contract_problem(e.value, p_at || '/properties/' || flowlane._pointer_token(e.key)) into v_found
      from jsonb_each(v_value) e
      where flowlane._contract_problem(e.value, p_at || '/properties/' || flowlane._pointer_token(e.key)) is not null
      order by e.key limit 1;
    end if;
    if v_found is not null then
      return v_found;
    end if;
  end loop;
  return null;
end;
$$;

-- a count (minLength, maxLength, minItems, maxItems) as a number: JSON Schema reads 2.0 as the
-- count 2, so a whole number written with a fraction compares, compiles and is shown as 2
create or replace function flowlane._contract_count(p_count jsonb) returns numeric
language sql immutable
set search_path = ''
as $$ select trim_scale((p_count #>> '{}')::numeric) $$;

-- the schema as a SQL boolean expression over the jsonb value ``p_x`` (an expression): true
-- only for a valid value (null is read as false: every negated part is coalesced). One
-- ``case jsonb_typeof(...)`` per schema; literals quoted with format's %L; numbers pass through
-- a numeric cast first, counts through _contract_count.
create or replace function flowlane._contract_sql(p_schema jsonb, p_x text, p_depth int = 0) returns text
language plpgsql immutable
set search_path = ''
as $$
declare
  v_types text[];
  v_branches text[] := '{}';
  v_type text;
  v_checks text[];
  v_key text;
  v_value jsonb;
  v_e text := 'e' || p_depth;
  v_known text[] := array(select jsonb_object_keys(coalesce(p_schema -> 'properties', '{}')) order by 1);
  v_required text[] := array(select jsonb_array_elements_text(coalesce(p_schema -> 'required', '[]')));
  v_out text;
begin
  if p_schema = 'true'::jsonb or p_schema = '{}'::jsonb then
    return 'true';
  elsif p_schema = 'false'::jsonb then
    return 'false';
  end if;
  v_types := case when jsonb_typeof(p_schema -> 'type') = 'array' then array(select jsonb_array_elements_text(p_schema -> 'type'))
                  when p_schema ? 'type' then array[p_schema ->> 'type'] end;
  foreach v_type in array array['object', 'array', 'string', 'number', 'boolean', 'null'] loop
    if v_types is not null and not v_type = any (v_types) and not (v_type = 'number' and 'integer' = any (v_types)) then
      v_branches := v_branches || format('when %L then false', v_type);
      continue;
    end if;
    v_checks := '{}';
    if v_type = 'number' then
      if v_types is not null and not 'number' = any (v_types) then
        -- jsonb prints numbers without exponent: no '.' is an integer (1.0 is one too)
        v_checks := v_checks || format('(strpos((%1$s)::text, ''.'') = 0 or (%1$s)::numeric = trunc((%1$s)::numeric))', p_x);
      end if;
      v_checks := v_checks || array_remove(array[
        case when p_schema ? 'minimum' then format('(%s)::numeric >= %s', p_x, (p_schema ->> 'minimum')::numeric) end,
        case when p_schema ? 'maximum' then format('(%s)::numeric <= %s', p_x, (p_schema ->> 'maximum')::numeric) end,
        case when p_schema ? 'exclusiveMinimum' then format('(%s)::numeric > %s', p_x, (p_schema ->> 'exclusiveMinimum')::numeric) end,
        case when p_schema ? 'exclusiveMaximum' then format('(%s)::numeric < %s', p_x, (p_schema ->> 'exclusiveMaximum')::numeric) end], null);
    elsif v_type = 'string' then
      v_checks := array_remove(array[
        case when p_schema ? 'minLength' then format('length(%s #>> ''{}'') >= %s', p_x, flowlane._contract_count(p_schema -> 'minLength')) end,
        case when p_schema ? 'maxLength' then format('length(%s #>> ''{}'') <= %s', p_x, flowlane._contract_count(p_schema -> 'maxLength')) end,
        case when p_schema ? 'pattern' then format('(%s #>> ''{}'') ~ %L', p_x, p_schema ->> 'pattern') end], null);
    elsif v_type = 'array' then
      v_checks := array_remove(array[
        case when p_schema ? 'minItems' then format('jsonb_array_length(%s) >= %s', p_x, flowlane._contract_count(p_schema -> 'minItems')) end,
        case when p_schema ? 'maxItems' then format('jsonb_array_length(%s) <= %s', p_x, flowlane._contract_count(p_schema -> 'maxItems')) end,
        case when p_schema ? 'items' and p_schema -> 'items' not in ('true', '{}') then
          format('not exists (select from jsonb_array_elements(%s) %s where not coalesce(%s, false))', p_x, v_e,
                 flowlane._contract_sql(p_schema -> 'items', v_e || '.value', p_depth + 1)) end], null);
    elsif v_type = 'object' then
      if cardinality(v_required) > 0 then
        v_checks := v_checks || format('%s ?& %L::text[]', p_x, v_required);
      end if;
      for v_key, v_value in select e.key, e.value from jsonb_each(p_schema -> 'properties') e order by e.key loop
        continue when v_value in ('true', '{}');
        v_out := flowlane._contract_sql(v_value, format('(%s -> %L)', p_x, v_key), p_depth + 1);
        v_checks := v_checks || case when v_key = any (v_required) then format('coalesce(%s, false)', v_out)
                                     else format('(not %s ? %L or coalesce(%s, false))', p_x, v_key, v_out) end;
      end loop;
      if p_schema -> 'additionalProperties' = 'false'::jsonb then
        v_checks := v_checks || format('(%s - %L::text[]) = ''{}''::jsonb', p_x, v_known);
      elsif p_schema ? 'additionalProperties' and p_schema -> 'additionalProperties' not in ('true', '{}') then
        v_checks := v_checks || format('not exists (select from jsonb_each(%s) %s where not %s.key = any (%L::text[]) and not coalesce(%s, false))',
          p_x, v_e, v_e, v_known, flowlane._contract_sql(p_schema -> 'additionalProperties', v_e || '.value', p_depth + 1));
      end if;
    end if;
    v_branches := v_branches || format('when %L then %s', v_type,
                                       case when cardinality(v_checks) = 0 then 'true' else array_to_string(v_checks, ' and ') end);
  end loop;
  v_out := format('case jsonb_typeof(%s) %s end', p_x, array_to_string(v_branches, ' '));
  if v_out = format('case jsonb_typeof(%s) when ''object'' then true when ''array'' then true when ''string'' then true when ''number'' then true when ''boolean'' then true when ''null'' then true end', p_x) then
    v_out := 'true';
  end if;
  if p_schema ? 'enum' then
    v_out := v_out || format(' and %s = any (%L::jsonb[])', p_x, array(select e from jsonb_array_elements(p_schema -> 'enum') e));
  end if;
  if p_schema ? 'const' then
    v_out := v_out || format(' and %s = %L::jsonb', p_x, p_schema -> 'const');
  end if;
  return '(' || v_out || ')';
end;
$$;

create or replace function flowlane._contract_violation(p_schema jsonb, p_value jsonb, p_at text, p_schema_at text)
returns jsonb
language plpgsql immutable
set search_path = ''
as $$
declare
  v_type text := jsonb_typeof(p_value);
  v_number numeric;
  v_length bigint;
  v_key text;
  v_sub jsonb;
  v_i int;
  v_found jsonb;
  v_shown text := flowlane._contract_shown(p_value);
begin
  if p_schema = 'false'::jsonb then
    return flowlane._contract_failure(p_at, p_schema_at, '', format('%s is not allowed here', v_shown));
  elsif jsonb_typeof(p_schema) <> 'object' then
    return null;
  end if;
  if p_schema ? 'type' and not exists (
       select 1 from jsonb_array_elements_text(case when jsonb_typeof(p_schema -> 'type') = 'array' then p_schema -> 'type'
                                                    else jsonb_build_array(p_schema -> 'type') end) t
       where flowlane._contract_has_type(p_value, t)) then
    return flowlane._contract_failure(p_at, p_schema_at, 'type', format('%s is not of type %s', v_shown,
      (select string_agg(t, ' or ') from jsonb_array_elements_text(case when jsonb_typeof(p_schema -> 'type') = 'array'
        then p_schema -> 'type' else jsonb_build_array(p_schema -> 'type') end) t)));
  end if;
  if p_schema ? 'enum' and not exists (select 1 from jsonb_array_elements(p_schema -> 'enum') e where e = p_value) then
    return flowlane._contract_failure(p_at, p_schema_at, 'enum', format('%s is not one of %s', v_shown, p_schema -> 'enum'));
  end if;
  if p_schema ? 'const' and (p_schema -> 'const') <> p_value then
    return flowlane._contract_failure(p_at, p_schema_at, 'const', format('%s is not %s', v_shown, p_schema -> 'const'));
  end if;
  if v_type = 'number' then
    v_number := (p_value #>> '{}')::numeric;
    if v_number < (p_schema ->> 'minimum')::numeric then
      return flowlane._contract_failure(p_at, p_schema_at, 'minimum', format('%s is less than the minimum %s', v_shown, p_schema -> 'minimum'));
    elsif v_number > (p_schema ->> 'maximum')::numeric then
      return flowlane._contract_failure(p_at, p_schema_at, 'maximum', format('%s is greater than the maximum %s', v_shown, p_schema -> 'maximum'));
    elsif v_number <= (p_schema ->> 'exclusiveMinimum')::numeric then
      return flowlane._contract_failure(p_at, p_schema_at, 'exclusiveMinimum', format('%s is not greater than %s', v_shown, p_schema -> 'exclusiveMinimum'));
    elsif v_number >= (p_schema ->> 'exclusiveMaximum')::numeric then
      return flowlane._contract_failure(p_at, p_schema_at, 'exclusiveMaximum', format('%s is not less than %s', v_shown, p_schema -> 'exclusiveMaximum'));
    end if;
  elsif v_type = 'string' then
    v_length := length(p_value #>> '{}');
    if v_length < flowlane._contract_count(p_schema -> 'minLength') then
      return flowlane._contract_failure(p_at, p_schema_at, 'minLength', format('%s is shorter than %s characters', v_shown, flowlane._contract_count(p_schema -> 'minLength')));
    elsif v_length > flowlane._contract_count(p_schema -> 'maxLength') then
      return flowlane._contract_failure(p_at, p_schema_at, 'maxLength', format('%s is longer than %s characters', v_shown, flowlane._contract_count(p_schema -> 'maxLength')));
    elsif p_schema ? 'pattern' and not (p_value #>> '{}') ~ (p_schema ->> 'pattern') then
      return flowlane._contract_failure(p_at, p_schema_at, 'pattern', format('%s does not match the pattern %s', v_shown, p_schema -> 'pattern'));
    end if;
  elsif v_type = 'array' then
    if jsonb_array_length(p_value) < flowlane._contract_count(p_schema -> 'minItems') then
      return flowlane._contract_failure(p_at, p_schema_at, 'minItems', format('has fewer than %s items', flowlane._contract_count(p_schema -> 'minItems')));
    elsif jsonb_array_length(p_value) > flowlane._contract_count(p_schema -> 'maxItems') then
      return flowlane._contract_failure(p_at, p_schema_at, 'maxItems', format('has more than %s items', flowlane._contract_count(p_schema -> 'maxItems')));
    end if;
    if p_schema ? 'items' then
      for v_i in 0 .. jsonb_array_length(p_value) - 1 loop
        v_found := flowlane._contract_violation(p_schema -> 'items', p_value -> v_i, p_at || '/' || v_i, p_schema_at || '/items');
        if v_found is not null then
          return v_found;
        end if;
      end loop;
    end if;
  elsif v_type = 'object' then
    select k into v_key from jsonb_array_elements_text(p_schema -> 'required') with ordinality r(k, o)
    where not p_value ? k order by o limit 1;
    if found then
      return flowlane._contract_failure(p_at, p_schema_at, 'required', format('required property %s is missing', to_jsonb(v_key)));
    end if;
    for v_key, v_sub in select e.key, e.value from jsonb_each(p_schema -> 'properties') e
                        where p_value ? e.key order by e.key loop
      v_found := flowlane._contract_violation(v_sub, p_value -> v_key, p_at || '/' || flowlane._pointer_token(v_key),
                                              p_schema_at || '/properties/' || flowlane._pointer_token(v_key));
      if v_found is not null then
        return v_found;
      end if;
    end loop;
    if p_schema ? 'additionalProperties' then
      for v_key in select k from jsonb_object_keys(p_value) k
                   where not coalesce(p_schema -> 'properties', '{}') ? k order by k loop
        if p_schema -> 'additionalProperties' = 'false'::jsonb then
          return flowlane._contract_failure(p_at, p_schema_at, 'additionalProperties',
            format('property %s is not allowed (additionalProperties is false)', to_jsonb(v_key)));
        end if;
        v_found := flowlane._contract_violation(p_schema -> 'additionalProperties', p_value -> v_key,
          p_at || '/' || flowlane._pointer_token(v_key), p_schema_at || '/additionalProperties');
        if v_found is not null then
          return v_found;
        end if;
      end loop;
    end if;
  end if;
  return null;
end;
$$;

-- refuse run inputs of p_flow that its input_schema rejects, before any run exists
create or replace function flowlane._check_contract_inputs(p_flow text, p_inputs jsonb[]) returns void
language plpgsql stable
set search_path = ''
as $$
declare
  v_contract flowlane.contracts;
  v_i int;
  v_found jsonb;
begin
  select * into v_contract from flowlane.contracts c
  where c.flow_slug = p_flow and coalesce(c.step_slug, '') = '';
  if not found then
    return;
  end if;
  foreach v_i in array flowlane._refused_inputs(v_contract, p_inputs) loop
    v_found := flowlane.contract_violation(v_contract.schema, p_inputs[v_i]);
    if v_found is not null then
      raise exception 'flow "%": the run input% does not match the flow''s input_schema: %: %', p_flow,
        case when cardinality(p_inputs) > 1 then format(' %s', v_i - 1) else '' end,
        coalesce(nullif(v_found ->> 'path', ''), '/'), v_found ->> 'message'
        using errcode = '22023',
              detail = format('the rule at input_schema%s of %s', v_found ->> 'schema_path',
                              flowlane._contract_shown(v_contract.schema #> flowlane._pointer_parts(
                                regexp_replace(v_found ->> 'schema_path', '/[^/]*$', '')))),
              hint = 'correct the input, or start a flow version whose input_schema accepts it';
    end if;
  end loop;
end;
$$;

-- the positions (from 1) of the inputs a flow's input contract refuses, by the fast verdict
create or replace function flowlane._refused_inputs(p_contract flowlane.contracts, p_inputs jsonb[]) returns int[]
language plpgsql stable
set search_path = ''
as $$
declare
  v_refused int[];
begin
  -- a few inputs: the check's function, planned once per connection; a batch: the expression
  -- itself, planned once for the batch (a function call per input cost more than that plan)
  execute format('select array(select u.i from unnest($1) with ordinality u(v, i) where not %s order by u.i)',
                 case when cardinality(p_inputs) < 16
                      then format('flowlane.%I(u.v)', flowlane._contract_check_name(p_contract.check_sql))
                      else format('coalesce(%s, false)', p_contract.check_sql) end)
    into v_refused using p_inputs;
  return v_refused;
end;
$$;

-- the name of the PostgreSQL trigger of one event of a flowlane trigger
create or replace function flowlane._trigger_pg_name(p_trigger text, p_event text) returns text
language sql immutable
set search_path = ''
as $$ select 'flowlane_' || p_trigger || '_' || p_event $$;

-- records a trigger and (re)creates its PostgreSQL triggers; the same arguments again change
-- nothing. table_name: schema-qualified, kept as written; p_events: insert, update, delete; when_pattern / unless_pattern: the containment
-- patterns an event ({"op", "old", "new"}) must hold / must not hold; input_map: run input
-- field -> JSON pointer into the event (null: the new row, the old one for a delete);
-- key_pointer: the event's idempotency key; on_refused: fail (the statement fails) or record
create or replace function flowlane.set_trigger(
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
               input_map, key_pointer, on_refused, flowlane._primary_key(v_table), now(), now());
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
create or replace function flowlane._primary_key(p_table regclass) returns text[]
language sql stable
set search_path = ''
as $$
  select array_agg(a.attname::text order by k.n)
  from pg_catalog.pg_index i
  cross join lateral unnest(i.indkey::int2[]) with ordinality k(attnum, n)
  join pg_catalog.pg_attribute a on a.attrelid = i.indrelid and a.attnum = k.attnum
  where i.indrelid = p_table and i.indisprimary
$$;

create or replace function flowlane._check_trigger_pointers(p_what text, p_trigger flowlane.triggers) returns void
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

create or replace function flowlane._create_pg_triggers(p_trigger flowlane.triggers) returns void
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

create or replace function flowlane._drop_pg_triggers(p_trigger flowlane.triggers) returns void
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
create or replace function flowlane.keep_only_triggers(trigger_names text[]) returns text[]
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
create or replace function flowlane._trigger_fire() returns trigger
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
create or replace function flowlane._trigger_events_sql(p_trigger flowlane.triggers, p_op text) returns text
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
create or replace function flowlane._start_from_events(p_trigger flowlane.triggers, p_events jsonb[], p_inputs jsonb[],
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
create or replace function flowlane._refuse_events(p_trigger flowlane.triggers, p_flow text, p_contract flowlane.contracts,
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
create or replace function flowlane.trigger_activity() returns table (
  trigger_name text, flow_name text, table_name text, events text[], on_refused text, runs bigint,
  runs_last_day bigint, last_run_at timestamptz, refusals bigint, last_error text, last_error_at timestamptz)
language sql stable
set search_path = ''
as $$
  select t.trigger_name, t.flow_name, t.table_name, t.events, t.on_refused,
         r.runs, r.runs_last_day, r.last_run_at, f.refusals, l.error, l.refused_at
  from flowlane.triggers t
  cross join lateral (select count(*) as runs, count(*) filter (where x.started_at > now() - interval '1 day')
                             as runs_last_day, max(x.started_at) as last_run_at
                      from flowlane.runs x where x.origin ? 'trigger' and x.origin ->> 'trigger' = t.trigger_name) r
  cross join lateral (select count(*) as refusals from flowlane.trigger_refusals y
                      where y.trigger_name = t.trigger_name) f
  left join lateral (select z.error, z.refused_at from flowlane.trigger_refusals z
                     where z.trigger_name = t.trigger_name order by z.refused_at desc limit 1) l on true
  order by t.trigger_name
$$;

-- == Written by hand: what calls the functions (checks, defaults, triggers, data) ==
