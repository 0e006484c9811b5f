-- flowlane SQL Core 0029: one task, one send.
-- A single start or completion sends one task: _send_tasks now sends a lone task with
-- pgmq.send (two function layers) instead of pgmq.send_batch (four) and a join of the ids
-- to the bodies. The JSON limits of a run input or a signal's payload walk the value only
-- when its text has more '[' and '{' than the depth limit, which no shallower value has.

-- the size and depth limits of JSON that comes in (a run input, a signal's payload);
-- p_what names it in the error ("start_flow(f): the run input")
create or replace function flowlane._check_json_limits(p_value jsonb, p_what text, p_flatten_hint text) returns void
language plpgsql immutable
set search_path = ''
as $$
declare
  v_max_depth int := (flowlane.json_limits() ->> 'max_depth')::int;
  v_max_bytes int := (flowlane.json_limits() ->> 'max_bytes')::int;
  v_text text := p_value::text;
  v_bytes int := octet_length(v_text);
begin
  if v_bytes > v_max_bytes then
    raise exception '% is % bytes of JSON, more than the limit of % bytes', p_what, v_bytes, v_max_bytes
      using errcode = '22023', hint = 'pass a reference (a URL, a storage key) instead of the data itself';
  end if;
  -- a value cannot be nested deeper than its text has '[' and '{': most never need the walk
  if length(v_text) - length(translate(v_text, '[{', '')) > v_max_depth
     and flowlane.json_depth_exceeds(p_value, v_max_depth) then
    raise exception '% is nested deeper than % levels', p_what, v_max_depth
      using errcode = '22023', hint = p_flatten_hint;
  end if;
end;
$$;

-- send tasks (bodies) to one queue and record them; the bodies carry the run's priority
create or replace function flowlane._send_tasks(p_queue text, p_bodies jsonb[], p_delay int) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_n int;
begin
  if coalesce(cardinality(p_bodies), 0) = 0 then
    return;
  end if;
  if exists (select 1 from unnest(p_bodies) b where b ? 'priority') then
    perform flowlane._prioritize_queue(p_queue);
  end if;
  if cardinality(p_bodies) = 1 then  -- a single start or completion: fewer layers than send_batch's
    insert into flowlane.step_tasks (flow_slug, run_id, step_slug, task_index, queue_name, message_id)
    select p_bodies[1] ->> 'flow_slug', (p_bodies[1] ->> 'run_id')::uuid, p_bodies[1] ->> 'step_slug',
           (p_bodies[1] ->> 'task_index')::int, p_queue, m.id
    from pgmq.send(p_queue, p_bodies[1], p_delay) m (id);
    return;
  end if;
  insert into flowlane.step_tasks (flow_slug, run_id, step_slug, task_index, queue_name, message_id)
  select b.body ->> 'flow_slug', (b.body ->> 'run_id')::uuid, b.body ->> 'step_slug',
         (b.body ->> 'task_index')::int, p_queue, m.id
  from pgmq.send_batch(p_queue, p_bodies, p_delay) with ordinality as m (id, ord)
  join unnest(p_bodies) with ordinality as b (body, ord) on b.ord = m.ord;
  get diagnostics v_n = row_count;
  if v_n <> cardinality(p_bodies) then
    raise exception 'internal error: sent % messages to queue % for % tasks', v_n, p_queue, cardinality(p_bodies);
  end if;
end;
$$;
