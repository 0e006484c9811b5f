-- flowlane SQL Core 0043: a claim finds its tasks' steps by the task's flow.
-- _claimed_inputs joined the claimed tasks' steps on the run's flow (s.flow_slug =
-- r.flow_slug). That let a generic plan reach the runs from the steps through runs_flow_idx:
-- every run of the flow, for every claimed task. PostgreSQL 15 took that plan when the runs
-- had been analyzed while there were none (as autovacuum does on a new database) and a few
-- thousand had been written since: a claim of 100 then read about 200,000 index entries of
-- runs, and the more runs the flow kept, the more. The step is now joined on the task's own
-- flow, so the runs are reached by their key only.

-- what claimed tasks are handed, for a batch in one statement: a task's input (the element
-- of the run input for a root map, of the parent's output for a dependent map; the run input
-- for a root single step; otherwise {dep: output} of the completed deps), and the run input
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
