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
-- Worker liveness is one rule, flowlane.worker_is_live (not stopped, a heartbeat within
-- flowlane.worker_stale_after(), 30 s), read by worker list, queue list, run, the console, the
-- metrics and serve; `worker list` counted a worker dead for minutes as live. queue_metrics
-- keeps its argument for the previous release's callers and no longer reads it. Only
-- functions change.

-- == Written by hand: tables, types and data that the functions need ==

-- == Drafted from the engine source by `python -m flowlane.core.draft_migration`; redrafted, never edited ==

set local check_function_bodies = off;

-- how long a worker counts as live after its last heartbeat (it beats every 5 s): the one
-- stale window of every reader (flowlane.defaults.STALE_AFTER names the same number)
create or replace function flowlane.worker_stale_after() returns interval
language sql immutable parallel safe
set search_path = ''
as $$ select interval '30 seconds' $$;

-- the one liveness rule: a worker is live while it has not stopped and its heartbeat is
-- within the stale window (worker list, queue list, run, the console, the metrics, serve)
create or replace function flowlane.worker_is_live(w flowlane.workers) returns boolean
language sql stable parallel safe
set search_path = ''
as $$ select w.stopped_at is null and w.last_heartbeat_at > now() - flowlane.worker_stale_after() $$;

-- (p_stale_after is no longer read: it is kept for the previous release's callers; liveness
-- is flowlane.worker_is_live)
create or replace function flowlane.queue_metrics(p_stale_after int = 30)
returns table (queue_name text, depth bigint, oldest_age_seconds int, live_workers bigint,
               disabled_deployments bigint)
language sql stable
set search_path = ''
as $$
  select q.queue_name, m.queue_length, coalesce(m.oldest_msg_age_sec, 0),
         (select count(*) from flowlane.workers w
          where w.queue_name = q.queue_name and flowlane.worker_is_live(w)),
         (select count(*) from flowlane.worker_deployments d
          where d.queue_name = q.queue_name and not d.enabled)
  from flowlane.queues q
  cross join lateral pgmq.metrics(q.pgmq_queue_name) m
  order by q.queue_name
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

-- == Written by hand: what calls the functions (checks, defaults, triggers, data) ==
