-- Reading a run for the console and the CLI.

create function flowlane.get_run_with_states(run_id uuid) returns jsonb
language sql stable
set search_path = ''
as $$
  select jsonb_build_object(
    'run', to_jsonb(r),
    'steps', coalesce((select jsonb_agg(to_jsonb(ss) order by s.step_index)
                       from flowlane.all_step_states ss
                       join flowlane.steps s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
                       where ss.run_id = r.run_id), '[]'::jsonb),
    'tasks', coalesce((select jsonb_agg(to_jsonb(t) order by s.step_index, t.task_index)
                       from flowlane.step_tasks t
                       join flowlane.steps s on s.flow_slug = t.flow_slug and s.step_slug = t.step_slug
                       where t.run_id = r.run_id), '[]'::jsonb))
  from flowlane.runs r
  where r.run_id = get_run_with_states.run_id
$$;

-- the attempt history of a run, oldest first (for `flowlane run` and Client.get_run)
create function flowlane.get_run_attempts(run_id uuid) returns jsonb
language sql stable
set search_path = ''
as $$
  select coalesce(jsonb_agg(to_jsonb(a) - 'id' order by a.id), '[]'::jsonb)
  from flowlane.task_attempts a
  where a.run_id = get_run_attempts.run_id
$$;
