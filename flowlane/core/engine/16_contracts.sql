-- Data contracts: a flow's input_schema and each step's output_schema, JSON Schema
-- (2020-12) restricted to a documented subset, written by reviewed SQL (set_contract) and
-- enforced where runs start (_check_contract_inputs, from _new_runs: every way of
-- starting a run passes there).
--
-- Each schema is compiled once, when it is stored, into one SQL boolean expression
-- (_contract_sql) of built-in operators and a function evaluating it; a start evaluates it
-- over all its inputs in one statement. An input it accepts is valid. Only an input it refuses is
-- walked again by contract_violation (plpgsql, slow), which names the JSON path and the rule
-- that failed. (A jsonpath predicate was tried first: PostgreSQL runs a regular expression
-- for every like_regex, and string lengths can only be written as one, ^.{0,500}$ costing
-- 200 us per value; the expression costs a fraction of a start.)

-- the keywords a contract may use: the enforced subset, then annotations (not enforced)
create function flowlane.contract_keywords() returns text[]
language sql immutable
set search_path = ''
as $$
  select array['type', 'properties', 'required', 'additionalProperties', 'items', 'enum', 'const',
               'minimum', 'maximum', 'exclusiveMinimum', 'exclusiveMaximum', 'minLength', 'maxLength',
               'pattern', 'minItems', 'maxItems', 'title', 'description', 'examples', '$comment']
$$;

-- a JSON pointer token: ~ and / escaped
create function flowlane._pointer_token(p_key text) returns text
language sql immutable
set search_path = ''
as $$ select replace(replace(p_key, '~', '~0'), '/', '~1') $$;

-- a value for a message: its JSON text, shortened
create function flowlane._contract_shown(p_value jsonb) returns text
language sql immutable
set search_path = ''
as $$
  select case when length(p_value::text) <= 60 then p_value::text else left(p_value::text, 57) || '...' end
$$;

-- the first problem of a schema as a contract (null when it is one): "<schema path>: what"
create function flowlane._contract_problem(p_schema jsonb, p_at text = '') returns text
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

create function flowlane._is_valid_regex(p_pattern text) returns boolean
language plpgsql immutable
set search_path = ''
as $$
begin
  perform '' ~ p_pattern;
  return true;
exception when invalid_regular_expression then
  return false;
end;
$$;

-- the tokens of a JSON pointer, unescaped ('' = the whole document)
create function flowlane._pointer_parts(p_pointer text) returns text[]
language sql immutable
set search_path = ''
as $$
  select coalesce(array(select replace(replace(t, '~1', '/'), '~0', '~')
                        from unnest(string_to_array(substr(p_pointer, 2), '/')) with ordinality u(t, o)
                        where p_pointer <> '' order by o), '{}')
$$;

-- a count (minLength, maxLength, minItems, maxItems) as a number: JSON Schema reads 2.0 as the
-- count 2, so a whole number written with a fraction compares, compiles and is shown as 2
create function flowlane._contract_count(p_count jsonb) returns numeric
language sql immutable
set search_path = ''
as $$ select trim_scale((p_count #>> '{}')::numeric) $$;

-- the schema as a SQL boolean expression over the jsonb value ``p_x`` (an expression): true
-- only for a valid value (null is read as false: every negated part is coalesced). One
-- ``case jsonb_typeof(...)`` per schema; literals quoted with format's %L; numbers pass through
-- a numeric cast first, counts through _contract_count.
create function flowlane._contract_sql(p_schema jsonb, p_x text, p_depth int = 0) returns text
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

-- the fast verdict on one value, compiled on the fly (what _check_contract_inputs decides
-- with the stored expression)
create function flowlane._contract_fast_accepts(p_schema jsonb, p_value jsonb) returns boolean
language plpgsql immutable
set search_path = ''
as $$
declare
  v_ok boolean;
begin
  execute format('select coalesce(%s, false) from (select $1) u(v)', flowlane._contract_sql(p_schema, 'v'))
    into v_ok using p_value;
  return v_ok;
end;
$$;

create function flowlane._contract_has_type(p_value jsonb, p_type text) returns boolean
language sql immutable
set search_path = ''
as $$
  select case p_type
    when 'integer' then jsonb_typeof(p_value) = 'number' and (p_value #>> '{}')::numeric = floor((p_value #>> '{}')::numeric)
    else jsonb_typeof(p_value) = p_type end
$$;

create function flowlane._contract_violation(p_schema jsonb, p_value jsonb, p_at text, p_schema_at text)
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

-- why ``instance`` breaks ``schema``: {path, message, schema_path} of the first rule that
-- fails (JSON pointers), or null when it is valid
create function flowlane.contract_violation(schema jsonb, instance jsonb) returns jsonb
language sql immutable
set search_path = ''
as $$ select flowlane._contract_violation(schema, instance, '', '') $$;

create function flowlane._contract_failure(p_at text, p_schema_at text, p_keyword text, p_message text) returns jsonb
language sql immutable
set search_path = ''
as $$
  select jsonb_build_object('path', p_at, 'message', p_message,
                            'schema_path', p_schema_at || case when p_keyword = '' then '' else '/' || p_keyword end)
$$;

-- store a contract: the run input's (step_slug null) or a step's output. Part of the flow's
-- shape: once the flow is sealed (ensure_flow_shape) a contract is neither added nor changed.
create function flowlane.set_contract(flow_slug text, step_slug text, schema jsonb) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_what text := case when set_contract.step_slug is null then 'input_schema'
                      else format('output_schema of step "%s"', set_contract.step_slug) end;
  v_sealed timestamptz;
  v_stored jsonb;
  v_problem text;
begin
  select f.shape_sealed_at into v_sealed from flowlane.flows f where f.flow_slug = set_contract.flow_slug for update;
  if not found then
    raise exception 'set_contract: flow "%" does not exist', set_contract.flow_slug using errcode = '22023',
      hint = 'create the flow (create_flow, add_step) before its contracts';
  end if;
  if set_contract.step_slug is not null and not exists (
       select 1 from flowlane.steps s where s.flow_slug = set_contract.flow_slug and s.step_slug = set_contract.step_slug) then
    raise exception 'set_contract: flow "%" has no step "%"', set_contract.flow_slug, set_contract.step_slug
      using errcode = '22023';
  end if;
  v_problem := flowlane._contract_problem(schema);
  if schema is null or v_problem is not null then
    raise exception 'set_contract: % of flow "%" is not a contract: %', v_what, set_contract.flow_slug,
      coalesce(v_problem, 'null') using errcode = '22023',
      hint = 'a contract is a JSON Schema using only ' || array_to_string(flowlane.contract_keywords(), ', ');
  end if;
  select c.schema into v_stored from flowlane.contracts c
  where c.flow_slug = set_contract.flow_slug and coalesce(c.step_slug, '') = coalesce(set_contract.step_slug, '');
  if found and v_stored = schema then
    return;
  end if;
  if found or v_sealed is not null then
    raise exception 'FLOWLANE_SHAPE_MISMATCH: flow "%" already exists with % %', set_contract.flow_slug,
      case when found then 'a different' else 'no' end, v_what
      using errcode = '23514',
            hint = 'contracts are part of the flow''s shape; create a new flow version (a new slug)';
  end if;
  insert into flowlane.contracts (flow_slug, step_slug, schema, check_sql)
  values (set_contract.flow_slug, set_contract.step_slug, schema, flowlane._contract_sql(schema, 'v'))
  returning check_sql into v_problem;
  perform flowlane._contract_check_function(v_problem);
end;
$$;

-- the name of the function that evaluates a compiled check (one per distinct expression)
create function flowlane._contract_check_name(p_check_sql text) returns text
language sql immutable
set search_path = ''
as $$ select '_contract_check_' || md5(p_check_sql) $$;

-- create the function evaluating p_check_sql on v, once (plpgsql: its plan is made once per
-- connection, where a statement holding the expression was planned on every start, about
-- 1 ms for a 10-field schema). Its body is a quoted literal of _contract_sql's quoted parts.
create function flowlane._contract_check_function(p_check_sql text) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_name text := flowlane._contract_check_name(p_check_sql);
begin
  perform pg_advisory_xact_lock(hashtext('flowlane.contract_check'), hashtext(v_name));
  if to_regprocedure(format('flowlane.%I(jsonb)', v_name)) is null then
    execute format('create function flowlane.%I(v jsonb) returns boolean language plpgsql immutable '
                   'set search_path = %L as %L', v_name, '',
                   format('begin return coalesce(%s, false); end;', p_check_sql));
  end if;
end;
$$;

-- refuse run inputs of p_flow that its input_schema rejects, before any run exists
create function flowlane._check_contract_inputs(p_flow text, p_inputs jsonb[]) returns void
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
create function flowlane._refused_inputs(p_contract flowlane.contracts, p_inputs jsonb[]) returns int[]
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

-- the contracts a shape document holds (ensure_flow_compiled creates a flow from its shape)
create function flowlane._set_shape_contracts(p_flow text, p_shape jsonb) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_step jsonb;
begin
  if p_shape ? 'input_schema' then
    perform flowlane.set_contract(p_flow, null, p_shape -> 'input_schema');
  end if;
  for v_step in select e from jsonb_array_elements(p_shape -> 'steps') e where e ? 'output_schema' loop
    perform flowlane.set_contract(p_flow, v_step ->> 'slug', v_step -> 'output_schema');
  end loop;
end;
$$;
