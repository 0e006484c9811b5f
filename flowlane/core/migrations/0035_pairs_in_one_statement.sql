-- flowlane SQL Core 0035: a worker's (flow, step) pairs checked in one statement.
-- _pairs (every claim, register_worker, coverage) checked each pair in a PL/pgSQL loop with
-- two calls of is_valid_slug, which its pinned search_path keeps from being inlined: a worker
-- serving 100 steps paid 200 calls on every claim. One statement now finds the first bad
-- pair; a pair that names a defined step needs no slug check. The errors are the same.

create or replace function flowlane._pairs(supported_pairs jsonb)
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
