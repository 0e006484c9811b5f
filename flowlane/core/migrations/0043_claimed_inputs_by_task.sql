-- flowlane SQL Core 0043: a claim finds its tasks' steps by the task's flow.
-- _claimed_inputs joined the claimed tasks' steps on the run's flow (s.flow_slug =
-- r.flow_slug). That let a generic plan reach the runs from the steps through runs_flow_idx:
-- every run of the flow, for every claimed task. PostgreSQL 15 took that plan when the runs
-- had been analyzed while there were none (as autovacuum does on a new database) and a few
-- thousand had been written since: a claim of 100 then read about 200,000 index entries of
-- runs, and the more runs the flow kept, the more. The step is now joined on the task's own
-- flow, so the runs are reached by their key only. A child-flow step's task, which
-- _start_child builds to ask for its input, carries its run's flow for that.

-- what claimed tasks are handed, for a batch in one statement: a task's input (the element
-- of the run input for a root map, of the parent's output for a dependent map; the run input
-- for a root single step; otherwise {dep: output} of the completed deps), and the run input
-- (of each task it reads run_id, flow_slug, step_slug and task_index)
create or replace function flowlane._claimed_inputs(p_tasks flowlane.step_tasks[])
returns table (run_id uuid, step_slug text, task_index int, input jsonb, flow_input jsonb)
language plpgsql stable
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
begin
  return query
  select t.run_id, t.step_slug, t.task_index,
         case
           when s.step_type = 'map' and s.deps_count = 0 then r.input -> t.task_index
           when s.step_type = 'map' then
             (select ps.output -> t.task_index
              from flowlane.deps d
              join flowlane.step_states ps on ps.run_id = t.run_id and ps.step_slug = d.dep_slug
              where d.flow_slug = s.flow_slug and d.step_slug = s.step_slug)
           when s.deps_count = 0 then r.input
           else flowlane._condition_subject(t.run_id, t.step_slug)
         end,
         r.input
  from unnest(p_tasks) t
  join flowlane.runs r
    on r.run_id = t.run_id and r.run_id = any (array(select distinct x.run_id from unnest(p_tasks) x order by 1))
  -- the step by the task's flow, not the run's: joined on r.flow_slug, a generic plan of
  -- PostgreSQL 15 reached the runs from the steps, through every run of the flow
  join flowlane.steps s on s.flow_slug = t.flow_slug and s.step_slug = t.step_slug;
end;
$$;

-- one child run for task p_index of a child-flow step (its input is what a handler would
-- get). A child that cannot start (no such flow, an input it refuses) is a failed attempt.
create or replace function flowlane._start_child(p_run_id uuid, p_step_slug text, p_index int) returns void
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
