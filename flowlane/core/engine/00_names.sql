-- Names, value limits and option defaults: the rules the tables' constraints and defaults and
-- every public function's argument checks use.

create schema if not exists flowlane;

-- The engine's clock: whatever the engine records or compares a time with reads it through
-- these two, never now() or clock_timestamp() directly (a queue message's visibility is the
-- exception: PGMQ keeps it on PostgreSQL's clock). They are plain SQL functions without
-- settings and with every name qualified, so that the planner inlines them into their callers:
-- the same plans and the same cost as the built-ins. Nothing in a database migrated by
-- flowlane can move them. The test databases of flowlane's pytest plugin (flowlane.testing),
-- throwaway copies of a template, replace _now() there with one that adds the test's offset,
-- and point the time columns' defaults (now(), the same time here) at these two.
-- (SQL-standard bodies: stored parsed, so that inlining them does not parse them again)
create function flowlane._now() returns timestamptz
language sql stable parallel safe
return pg_catalog.now();

-- the engine's clock_timestamp(): its _now() plus the time since the transaction began
create function flowlane._clock_timestamp() returns timestamptz
language sql volatile parallel safe
return flowlane._now() operator(pg_catalog.+) (pg_catalog.clock_timestamp() operator(pg_catalog.-) pg_catalog.now());

-- A new run's id: a UUID of version 7, its first 48 bits the engine's clock in milliseconds,
-- the rest random (a version 4 UUID's bits, with the version changed), so that the ids made one
-- after another sort together. A new run's entries in the primary keys of runs, step_states and
-- step_tasks then land on the few rightmost pages of each, which stay in shared buffers, and
-- its later lookups find them there: a random id lands on any page of an index the size of the
-- whole history, which shared buffers stop holding once the history grows. PostgreSQL 18's
-- uuidv7() makes ids of the same kind; this one runs on the older majors too. Without
-- settings, and inlined like the clock.
create function flowlane._uuid_v7() returns uuid
language sql volatile parallel safe
return pg_catalog.encode(
  pg_catalog.set_bit(pg_catalog.set_bit(
    pg_catalog.overlay(pg_catalog.uuid_send(pg_catalog.gen_random_uuid()),
      pg_catalog.substr(pg_catalog.int8send(pg_catalog.floor(
        pg_catalog.date_part('epoch', flowlane._clock_timestamp()) operator(pg_catalog.*) 1000)::bigint), 3),
      1, 6),  -- bytes 1-6: the milliseconds
    52, 1), 53, 1),  -- the version's bits: 0100 (4) becomes 0111 (7)
  'hex')::uuid;

-- a flow option's value when the flow's definition leaves it out: the column defaults of
-- flowlane.flows and create_flow take it from here, and a test holds it equal to the
-- compiler's defaults
create function flowlane._flow_option_default(option text) returns int
language sql immutable parallel safe
set search_path = ''
as $$
  select case option when 'max_attempts' then 3 when 'base_delay' then 5 when 'timeout' then 60
                     when 'retention' then 2592000 end
$$;

create function flowlane.is_valid_slug(slug text) returns boolean
language sql immutable parallel safe
set search_path = ''
as $$
  select slug is not null
     and length(slug) between 1 and 128
     and slug ~ '^[a-zA-Z][a-zA-Z0-9_]*$'
     and position('__' in slug) = 0
     and right(slug, 1) <> '_'
     and lower(slug) <> 'run'
$$;

create function flowlane._check_slug(kind text, slug text) returns void
language plpgsql stable
set search_path = ''
as $$
begin
  if not flowlane.is_valid_slug(slug) then
    raise exception 'invalid % slug %: a slug matches ^[a-zA-Z][a-zA-Z0-9_]*$, has 1..128 characters, no "__", no trailing "_", and is not "run"',
      kind, coalesce(quote_literal(slug), 'NULL')
      using errcode = '22023';
  end if;
end;
$$;

create function flowlane.is_valid_queue_name(queue_name text) returns boolean
language plpgsql immutable parallel safe
set search_path = ''
as $$
begin
  return queue_name is not null
     and length(queue_name) between 1 and 47
     and queue_name ~ '^[a-z][a-z0-9_]*$'
     and right(queue_name, 1) <> '_';
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

-- a claim's worker id fences the results of the tasks it claims: without one, nothing is claimed
create function flowlane._check_worker_argument(p_function text, p_worker_id uuid) returns void
language plpgsql immutable
set search_path = ''
as $$
begin
  if p_worker_id is null then
    raise exception '%: worker_id is required (it fences the results of the claimed tasks)', p_function
      using errcode = '22023';
  end if;
end;
$$;

create function flowlane.is_valid_deployment_name(deployment_name text) returns boolean
language sql immutable parallel safe
set search_path = ''
as $$
  select deployment_name is not null
     and length(deployment_name) between 1 and 128
     and deployment_name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]*$'
$$;

create function flowlane._check_deployment_argument(p_function text, p_deployment text) returns void
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

create function flowlane._pairs(supported_pairs jsonb)
returns table (flow_slug text, step_slug text)
language plpgsql stable
set search_path = ''
as $$
declare
  v_bad record;
begin
  if supported_pairs is null or jsonb_typeof(supported_pairs) <> 'array' then
    raise exception 'supported_pairs must be a JSON array of [flow_slug, step_slug] pairs, got %',
      coalesce(jsonb_typeof(supported_pairs), 'null') using errcode = '22023';
  end if;
  -- one statement for every pair; a pair that names a defined step is a pair of slugs (the
  -- rules of flowlane.steps), so only the others pay for the slug rule, which a worker that
  -- serves many steps would otherwise pay twice per pair on every claim
  select a.e as item, a.o - 1 as pos into v_bad
  from jsonb_array_elements(supported_pairs) with ordinality as a (e, o)
  where case when jsonb_typeof(a.e) <> 'array' then true
             when jsonb_array_length(a.e) <> 2 then true
             when jsonb_typeof(a.e -> 0) <> 'string' or jsonb_typeof(a.e -> 1) <> 'string' then true
             when exists (select 1 from flowlane.steps s where s.flow_slug = a.e ->> 0 and s.step_slug = a.e ->> 1)
               then false
             else not (flowlane.is_valid_slug(a.e ->> 0) and flowlane.is_valid_slug(a.e ->> 1)) end
  order by a.o
  limit 1;
  if found then
    raise exception 'supported_pairs item % must be a pair of slugs [flow_slug, step_slug], got %',
      v_bad.pos, left(v_bad.item::text, 200) using errcode = '22023';
  end if;
  return query
    select distinct e ->> 0, e ->> 1 from jsonb_array_elements(supported_pairs) e order by 1, 2;
end;
$$;

create function flowlane.json_limits() returns jsonb
language plpgsql immutable parallel safe
set search_path = ''
as $$ begin return '{"max_depth": 100, "max_bytes": 67108864}'::jsonb; end $$;

-- depth: a scalar is 0, [] and {} are 1, [[1]] is 2
create function flowlane.json_depth_exceeds(value jsonb, max_depth int) returns boolean
language sql immutable parallel safe
set search_path = ''
as $$
  with recursive walk(v, depth) as (
    select value, 1 where jsonb_typeof(value) in ('array', 'object')
    union all
    select c.v, w.depth + 1
    from walk w
    cross join lateral (
      select e as v from jsonb_array_elements(case when jsonb_typeof(w.v) = 'array' then w.v else '[]' end) e
      union all
      select o.value from jsonb_each(case when jsonb_typeof(w.v) = 'object' then w.v else '{}' end) o
    ) c
    where jsonb_typeof(c.v) in ('array', 'object') and w.depth <= max_depth
  )
  select exists (select 1 from walk where depth > max_depth)
$$;
