-- Child flows: a step with a child flow (steps.child_flow, a flow slug or alias resolved
-- when the step starts) has no handler, no queue and no task. When it starts it starts a
-- run of that flow with the step's input (a map step: one child run per element), linked
-- by runs.parent_run_id, parent_step_slug and parent_task_index. The step completes with
-- the child's output (a map step: the array of its children's outputs, in element order).
-- A child that fails or is cancelled is an attempt of its element: another child starts
-- while the step has attempts left (max_attempts), else when_exhausted applies. A parent
-- that fails or is cancelled cancels its started children (and those held for their key).
--
-- Both directions are row triggers on runs.status: whichever function ends a run (a
-- completion, a failure, cancel_run, a deadline) reports it, once, in its transaction.
-- Lock order: a child's end locks the child's run, then its parent's run and step state.

-- the started steps among p_started that have a child flow: one child run per task
create function flowlane._start_children(p_started flowlane.step_states[]) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_task record;
begin
  for v_task in
    select st.run_id, st.step_slug, k as task_index
    from unnest(p_started) st
    join flowlane.steps s on s.flow_slug = st.flow_slug and s.step_slug = st.step_slug
    cross join lateral generate_series(0, st.initial_tasks - 1) as k
    where s.child_flow is not null
    order by st.run_id, s.step_index, k
  loop
    perform flowlane._start_child(v_task.run_id, v_task.step_slug, v_task.task_index);
  end loop;
end;
$$;

-- one child run for task p_index of a child-flow step (its input is what a handler would
-- get). A child that cannot start (no such flow, an input it refuses) is a failed attempt.
create function flowlane._start_child(p_run_id uuid, p_step_slug text, p_index int) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_named text;
  v_flow text;
  v_task flowlane.step_tasks;
  v_input jsonb;
  v_child flowlane.runs;
begin
  perform 1 from flowlane.step_states ss join flowlane.runs r on r.run_id = ss.run_id
  where ss.run_id = p_run_id and ss.step_slug = p_step_slug and ss.status = 'started' and r.status = 'started';
  if not found then
    return;  -- an earlier child of the step could not start and ended the step or the run
  end if;
  select s.child_flow, r.flow_slug into v_named, v_task.flow_slug from flowlane.runs r
  join flowlane.steps s on s.flow_slug = r.flow_slug and s.step_slug = p_step_slug
  where r.run_id = p_run_id;
  v_task.run_id := p_run_id;
  v_task.step_slug := p_step_slug;
  v_task.task_index := p_index;
  select c.input into v_input from flowlane._claimed_inputs(array[v_task]) c;
  begin
    v_flow := flowlane.resolve_flow(v_named);
    perform flowlane._check_start_input(v_flow, v_input,
      format('child flow %s of step %s', v_flow, p_step_slug));
    select * into v_child from flowlane._create_runs(v_flow, array[v_input], array[null::uuid]);
  exception when others then
    perform flowlane._child_step_exhausted(p_run_id, p_step_slug,
      format('cannot start child flow %s: %s', v_named, sqlerrm));
    return;
  end;
  update flowlane.runs r
     set parent_run_id = p_run_id, parent_step_slug = p_step_slug, parent_task_index = p_index
   where r.run_id = v_child.run_id
  returning * into v_child;
  -- (a child of a flow with a concurrency limit may wait for its key: it has not ended)
  if v_child.status not in ('started', 'waiting') then  -- it ended while it was created, before it had a parent
    perform flowlane._child_ended(v_child);
  end if;
end;
$$;

create function flowlane._report_to_parent() returns trigger
language plpgsql volatile
set search_path = ''
as $$
begin
  perform flowlane._child_ended(new);
  return null;
end;
$$;

create trigger runs_report_to_parent
  after update of status on flowlane.runs
  for each row
  when (old.status in ('started', 'waiting') and new.status not in ('started', 'waiting')
        and new.parent_run_id is not null)
  execute function flowlane._report_to_parent();

-- a child run ended: its output completes its element (the step, with the last one), its
-- failure or cancellation is a failed attempt. Nothing when the parent run or step ended, or
-- the element already has a newer child (the child is late).
create function flowlane._child_ended(p_child flowlane.runs) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_parent flowlane.runs;
  v_state flowlane.step_states;
  v_step flowlane.steps;
  v_attempts int;
  v_max int;
  v_map text;
begin
  select * into v_parent from flowlane.runs r where r.run_id = p_child.parent_run_id for update;
  if not found or v_parent.status <> 'started' then
    return;
  end if;
  select * into v_state from flowlane.step_states ss
  where ss.run_id = v_parent.run_id and ss.step_slug = p_child.parent_step_slug for update;
  if v_state.status <> 'started' or exists (
       select 1 from flowlane.runs c
       where c.parent_run_id = v_parent.run_id and c.parent_step_slug = p_child.parent_step_slug
         and c.parent_task_index = p_child.parent_task_index and c.run_id <> p_child.run_id
         and c.status in ('started', 'completed')) then
    return;
  end if;
  select * into v_step from flowlane.steps s
  where s.flow_slug = v_parent.flow_slug and s.step_slug = p_child.parent_step_slug;
  if p_child.status = 'completed' and v_step.step_type <> 'map' then
    -- a run's output is an object of its last steps' outputs, never the array a map needs
    select d.step_slug into v_map from flowlane.deps d
    join flowlane.steps m on m.flow_slug = d.flow_slug and m.step_slug = d.step_slug and m.step_type = 'map'
    where d.flow_slug = v_step.flow_slug and d.dep_slug = v_step.step_slug
    order by d.step_slug limit 1;
    if found then
      perform flowlane._child_step_exhausted(v_parent.run_id, v_step.step_slug,
        format('[TYPE_VIOLATION] step %s feeds map step %s and must output a JSON array; a child run outputs an object',
               v_step.step_slug, v_map));
      return;
    end if;
  end if;
  if p_child.status = 'completed' then
    update flowlane.step_states ss
       set remaining_tasks = ss.remaining_tasks - 1,
           status = case when ss.remaining_tasks = 1 then 'completed' else ss.status end,
           completed_at = case when ss.remaining_tasks = 1 then flowlane._now() end,
           output = case when ss.remaining_tasks <> 1 then null
                         when v_step.step_type <> 'map' then p_child.output
                         else flowlane._children_outputs(v_parent.run_id, v_step.step_slug) end
     where ss.run_id = v_parent.run_id and ss.step_slug = v_step.step_slug
    returning * into v_state;
    if v_state.status = 'completed' then
      perform flowlane._steps_done(array[v_state]);
    end if;
    return;
  end if;
  select count(*) into v_attempts from flowlane.runs c
  where c.parent_run_id = v_parent.run_id and c.parent_step_slug = v_step.step_slug
    and c.parent_task_index = p_child.parent_task_index and c.started_at >= v_state.started_at;
  select o.max_attempts into v_max from flowlane.step_options o
  where o.flow_slug = v_step.flow_slug and o.step_slug = v_step.step_slug;
  if v_attempts < v_max then
    perform flowlane._start_child(v_parent.run_id, v_step.step_slug, p_child.parent_task_index);
    return;
  end if;
  perform flowlane._child_step_exhausted(v_parent.run_id, v_step.step_slug,
    format('child run %s (%s) %s after %s %s: %s', p_child.run_id, p_child.flow_slug, p_child.status,
           v_attempts, case when v_attempts = 1 then 'attempt' else 'attempts' end,
           coalesce(p_child.error_message, p_child.cancel_reason, 'no reason given')));
end;
$$;

-- a map step's output: its children's outputs in element order (the completed child of each)
create function flowlane._children_outputs(p_run_id uuid, p_step_slug text) returns jsonb
language sql stable
set search_path = ''
as $$
  select coalesce(jsonb_agg(c.output order by c.parent_task_index), '[]'::jsonb)
  from flowlane.runs c
  where c.parent_run_id = p_run_id and c.parent_step_slug = p_step_slug and c.status = 'completed'
$$;

-- a child-flow step out of attempts: its other started children are cancelled and
-- when_exhausted applies (fail: the step and its run fail; skip, skip-cascade: the run goes on)
create function flowlane._child_step_exhausted(p_run_id uuid, p_step_slug text, p_error text) returns void
language plpgsql volatile
set search_path = ''
as $$
begin
  -- (a failed run cancels all its children itself: runs_end_children)
  perform flowlane.cancel_run(c.run_id, format('step %s of parent run %s gave up', p_step_slug, p_run_id))
  from flowlane.runs c
  join flowlane.runs p on p.run_id = p_run_id
  join flowlane.steps s on s.flow_slug = p.flow_slug and s.step_slug = p_step_slug and s.when_exhausted <> 'fail'
  where c.parent_run_id = p_run_id and c.parent_step_slug = p_step_slug and c.status in ('started', 'waiting')
  order by c.run_id;
  perform flowlane._give_up_step(p_run_id, p_step_slug, p_error, 'handler_failed');
end;
$$;

-- a parent that fails or is cancelled cancels its started children (and those held for
-- their flow's concurrency key)
create function flowlane._end_children() returns trigger
language plpgsql volatile
set search_path = ''
as $$
begin
  perform flowlane.cancel_run(c.run_id, format('parent run %s %s', new.run_id, new.status))
  from flowlane.runs c
  where c.parent_run_id = new.run_id and c.status in ('started', 'waiting')
  order by c.run_id;
  return null;
end;
$$;

create trigger runs_end_children
  after update of status on flowlane.runs
  for each row
  when (old.status = 'started' and new.status in ('failed', 'cancelled'))
  execute function flowlane._end_children();

-- a run's parent and children for `flowlane run` and the console, its failure handler's run
-- (or the run whose failure it handles, 20_on_failure.sql) and its compensations (or the run
-- and step it compensates, 21_compensation.sql)
create function flowlane.get_run_family(run_id uuid) returns jsonb
language sql stable
set search_path = ''
as $$
  select jsonb_build_object(
    'failure_handler', (select jsonb_build_object('run_id', h.run_id, 'flow_slug', h.flow_slug, 'status', h.status)
                        from flowlane.runs h where h.failure_of = r.run_id),
    'failure_of', (select jsonb_build_object('run_id', f.run_id, 'flow_slug', f.flow_slug, 'status', f.status)
                   from flowlane.runs f where f.run_id = r.failure_of),
    'compensations', flowlane.get_run_compensations(r.run_id),
    'compensation_of', (select jsonb_build_object('run_id', f.run_id, 'flow_slug', f.flow_slug, 'status', f.status,
                                                  'step_slug', c.step_slug)
                        from flowlane.runs f join flowlane.compensations c on c.run_id = f.run_id
                        where f.run_id = r.compensation_of and c.compensation_run_id = r.run_id),
    'parent', (select jsonb_build_object('run_id', p.run_id, 'flow_slug', p.flow_slug, 'status', p.status,
                                         'step_slug', r.parent_step_slug, 'task_index', r.parent_task_index)
               from flowlane.runs p where p.run_id = r.parent_run_id),
    'children', coalesce((select jsonb_agg(jsonb_build_object(
                            'run_id', c.run_id, 'flow_slug', c.flow_slug, 'status', c.status,
                            'step_slug', c.parent_step_slug, 'task_index', c.parent_task_index,
                            'started_at', c.started_at)
                          order by c.parent_step_slug, c.parent_task_index, c.started_at, c.run_id)
                          from flowlane.runs c where c.parent_run_id = r.run_id), '[]'::jsonb))
  from flowlane.runs r
  where r.run_id = get_run_family.run_id
$$;
