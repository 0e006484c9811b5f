-- flowlane SQL Core 0036: two foreign keys that others already imply, dropped.
-- A task's (run, step) references its step state, whose run references the run; a step
-- state's (flow, step) references the step, whose flow references the flow. The direct keys
-- step_tasks -> runs and step_states -> flows allowed nothing the others refuse, yet each
-- cost a check per written row: a start of a root map of 10 checked its run 11 times.

alter table flowlane.step_tasks drop constraint step_tasks_run_id_fkey;

alter table flowlane.step_states drop constraint step_states_flow_slug_fkey;
