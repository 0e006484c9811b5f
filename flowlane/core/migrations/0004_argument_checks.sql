-- flowlane SQL Core 0004: argument checks and invariants that 0001-0003 missed.
--
-- 1. A timeout is at most 2147483617 s. A claim sets the message visibility to
-- timeout + 2 s and stalled recovery waits timeout + 30 s, both int: with a
-- larger timeout every claim of the step failed with "integer out of range",
-- and once such a task was started requeue_stalled_tasks failed for every flow.
-- Existing rows are checked (a violating row already made its flow unusable).

alter table flowlane.flows
  add constraint flows_timeout_at_most_2147483617 check (opt_timeout <= 2147483617);
alter table flowlane.steps
  add constraint steps_timeout_at_most_2147483617 check (opt_timeout is null or opt_timeout <= 2147483617);

-- 2. complete_tasks validates the whole batch first. Before 0004 an item that was not an object, or lacked run_id, step_slug or
-- task_index, was silently ignored (complete_task with null keys matches no
-- task) while the valid items of the same batch completed, and a malformed
-- value surfaced as a bare cast error naming no item. Now every item is
-- checked before any completion; the first bad one raises 22023 naming its
-- position, and nothing of the batch is applied.

create or replace function flowlane.complete_tasks(results jsonb) returns setof flowlane.step_tasks
language plpgsql volatile
set search_path = ''
as $$
declare
  v_item record;
  v_elem jsonb;
  v_pos int;
  v_key text;
begin
  if results is null or jsonb_typeof(results) <> 'array' then
    raise exception 'complete_tasks: results must be a JSON array of {run_id, step_slug, task_index, output, worker_id, attempt}'
      using errcode = '22023';
  end if;
  for v_elem, v_pos in select e, o - 1 from jsonb_array_elements(results) with ordinality as a (e, o) loop
    if jsonb_typeof(v_elem) <> 'object' then
      raise exception 'complete_tasks: item % must be an object {run_id, step_slug, task_index, output, worker_id, attempt}, got %',
        v_pos, jsonb_typeof(v_elem) using errcode = '22023';
    end if;
    foreach v_key in array array['run_id', 'step_slug', 'task_index'] loop
      if coalesce(jsonb_typeof(v_elem -> v_key), 'null') = 'null' then
        raise exception 'complete_tasks: item % has no %', v_pos, v_key using errcode = '22023';
      end if;
    end loop;
    foreach v_key in array array['run_id', 'worker_id', 'task_index', 'attempt'] loop
      begin
        if v_key in ('run_id', 'worker_id') then
          perform (v_elem ->> v_key)::uuid;
        else
          perform (v_elem ->> v_key)::int;
        end if;
      exception when invalid_text_representation or numeric_value_out_of_range then
        raise exception 'complete_tasks: item %: % must be %, got %', v_pos, v_key,
          case when v_key in ('run_id', 'worker_id') then 'a uuid' else 'an integer' end,
          v_elem -> v_key using errcode = '22023';
      end;
    end loop;
  end loop;
  for v_item in
    select (e ->> 'run_id')::uuid as run_id, e ->> 'step_slug' as step_slug,
           (e ->> 'task_index')::int as task_index, e -> 'output' as output,
           (e ->> 'worker_id')::uuid as worker_id, (e ->> 'attempt')::int as attempt
    from jsonb_array_elements(results) e
    order by 1, 2, 3   -- fixed lock order across concurrent batches
  loop
    return query select * from flowlane.complete_task(v_item.run_id, v_item.step_slug, v_item.task_index,
                                                      v_item.output, v_item.worker_id, v_item.attempt);
  end loop;
end;
$$;

-- 3. Deleting a flow keeps aliases sound. The active version of an alias is
-- refused with a message that names the alias (before 0004: a bare foreign-key
-- violation); a draining version leaves the alias's draining list, with a
-- history row (before 0004 the alias kept naming a flow that no longer existed).

create function flowlane._flow_delete_keeps_aliases_sound() returns trigger
language plpgsql
set search_path = ''
as $$
declare
  v_aliases text;
begin
  select string_agg(a.alias, ', ' order by a.alias) into v_aliases
  from flowlane.aliases a where a.flow_slug = old.flow_slug;
  if v_aliases is not null then
    raise exception 'flow "%" is the active version of alias %', old.flow_slug, v_aliases
      using errcode = '23503',
            hint = 'move the alias to another version (flowlane.set_alias) before deleting the flow';
  end if;
  with changed as (
    update flowlane.aliases a
       set draining = array_remove(a.draining, old.flow_slug), updated_at = clock_timestamp()
     where old.flow_slug = any (a.draining)
    returning a.alias, a.flow_slug, a.draining
  )
  insert into flowlane.alias_history (alias, flow_slug, draining)
  select c.alias, c.flow_slug, c.draining from changed c order by c.alias;
  return old;
end;
$$;

create trigger flows_delete_keeps_aliases_sound
  before delete on flowlane.flows
  for each row execute function flowlane._flow_delete_keeps_aliases_sound();
