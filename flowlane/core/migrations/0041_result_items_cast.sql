-- flowlane SQL Core 0041: complete_tasks and fail_tasks read their items by casting them.
-- Their argument was checked item by item with four regular expressions (a canonical uuid, a
-- nine-digit integer) before the items were cast: about 6 % of the server's CPU in a batch of
-- 100 completions. The casts are the check now, in one pass; a batch that has a bad item
-- (a cast refused, an item that is not an object or lacks a key) takes the exact check, item
-- by item in order, which raises for the first bad one with the same messages as before.

-- the items of a complete_tasks/fail_tasks argument, validated together before
-- anything is locked; the first bad item raises with its position
create or replace function flowlane._result_items(p_function text, p_results jsonb, p_shape text)
returns flowlane._result_item[]
language plpgsql stable
set search_path = ''
as $$
declare
  v_bad record;
  v_key text;
  v_items flowlane._result_item[];
  v_misshapen boolean;
begin
  if p_results is null or jsonb_typeof(p_results) <> 'array' then
    raise exception '%: results must be a JSON array of %', p_function, p_shape using errcode = '22023';
  end if;
  -- every item in one pass: its casts are its check (a value that is not a uuid or an integer
  -- raises); only a batch with a bad item takes the exact check, item by item, in order
  begin
    select coalesce(array_agg(row(o - 1, (e ->> 'run_id')::uuid, e ->> 'step_slug', (e ->> 'task_index')::int,
                                  e -> 'output', (e ->> 'worker_id')::uuid, (e ->> 'attempt')::int,
                                  e ->> 'error_message', e ->> 'error_type', e ->> 'traceback'
                                 )::flowlane._result_item order by o), '{}'),
           coalesce(bool_or(jsonb_typeof(e) <> 'object'
                            or coalesce(jsonb_typeof(e -> 'run_id'), 'null') = 'null'
                            or coalesce(jsonb_typeof(e -> 'step_slug'), 'null') = 'null'
                            or coalesce(jsonb_typeof(e -> 'task_index'), 'null') = 'null'), false)
      into v_items, v_misshapen
    from jsonb_array_elements(p_results) with ordinality as a (e, o);
  exception when invalid_text_representation or numeric_value_out_of_range then
    v_misshapen := true;
  end;
  if not v_misshapen then
    return v_items;
  end if;
  for v_bad in
    select e, o - 1 as pos from jsonb_array_elements(p_results) with ordinality as a (e, o) order by o
  loop
    if jsonb_typeof(v_bad.e) <> 'object' then
      raise exception '%: item % must be an object %, got %', p_function, v_bad.pos, p_shape,
        jsonb_typeof(v_bad.e) using errcode = '22023';
    end if;
    foreach v_key in array array['run_id', 'step_slug', 'task_index'] loop
      if coalesce(jsonb_typeof(v_bad.e -> v_key), 'null') = 'null' then
        raise exception '%: item % has no %', p_function, v_bad.pos, v_key using errcode = '22023';
      end if;
    end loop;
    foreach v_key in array array['run_id', 'worker_id', 'task_index', 'attempt'] loop
      begin
        if v_key in ('run_id', 'worker_id') then
          perform (v_bad.e ->> v_key)::uuid;
        else
          perform (v_bad.e ->> v_key)::int;
        end if;
      exception when invalid_text_representation or numeric_value_out_of_range then
        raise exception '%: item %: % must be %, got %', p_function, v_bad.pos, v_key,
          case when v_key in ('run_id', 'worker_id') then 'a uuid' else 'an integer' end,
          v_bad.e -> v_key using errcode = '22023';
      end;
    end loop;
  end loop;
  raise exception '%: an item could not be read', p_function using errcode = 'XX000';
end;
$$;
