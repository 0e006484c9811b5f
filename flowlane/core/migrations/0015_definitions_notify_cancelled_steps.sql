-- Two changes: definition changes are announced, and a cancelled run ends its steps.
--
-- Definition changes are announced: every row change of flows, steps,
-- dependencies, aliases, queues or a worker deployment's enabled flag notifies
-- the channel flowlane_definitions (payload: the table's name), delivered when its
-- transaction commits, once per table and transaction (PostgreSQL folds repeats). Workers re-check their
-- coverage when notified, instead of waiting for their periodic re-check, and stop
-- before they claim work of a (flow, step) they do not serve; `flowlane serve`
-- re-derives its set of workers. Nothing here changes a definition.

create function flowlane._notify_definitions_changed()
returns trigger
language plpgsql
set search_path = ''
as $$
begin
  perform pg_notify('flowlane_definitions', tg_table_name);
  return null;
end;
$$;

create trigger flows_notify_changed
after insert or update or delete on flowlane.flows
for each row execute function flowlane._notify_definitions_changed();

create trigger steps_notify_changed
after insert or update or delete on flowlane.steps
for each row execute function flowlane._notify_definitions_changed();

create trigger deps_notify_changed
after insert or update or delete on flowlane.deps
for each row execute function flowlane._notify_definitions_changed();

create trigger aliases_notify_changed
after insert or update or delete on flowlane.aliases
for each row execute function flowlane._notify_definitions_changed();

create trigger queues_notify_changed
after insert or update or delete on flowlane.queues
for each row execute function flowlane._notify_definitions_changed();

-- a worker's registration inserts nothing once its deployment exists: no notification
create trigger worker_deployments_notify_added
after insert or delete on flowlane.worker_deployments
for each row execute function flowlane._notify_definitions_changed();

create trigger worker_deployments_notify_enabled
after update of enabled on flowlane.worker_deployments
for each row when (old.enabled is distinct from new.enabled)
execute function flowlane._notify_definitions_changed();

-- A cancelled run is one consistent picture: its steps that had not finished end
-- 'cancelled' with an end time (a map step no longer stays 'started' with tasks
-- remaining while every task is cancelled, and a step that never started says that
-- the run ended before it could). Cancelling is final, so this happens at once, when
-- the run's status changes, beside cancel_run rather than inside it. A failed run
-- keeps its unfinished steps as they are: `retry_run` resumes them.

alter table flowlane.step_states
  add column cancelled_at timestamptz,
  drop constraint step_states_status_valid,
  add constraint step_states_status_valid
    check (status in ('created', 'started', 'completed', 'failed', 'skipped', 'cancelled')),
  add constraint step_states_cancelled_at check ((status = 'cancelled') = (cancelled_at is not null)),
  add constraint step_states_cancelled_after_created
    check (cancelled_at is null or cancelled_at >= coalesce(started_at, created_at));

create function flowlane._cancel_unfinished_steps()
returns trigger
language plpgsql
set search_path = ''
as $$
begin
  update flowlane.step_states ss
     set status = 'cancelled',
         cancelled_at = greatest(n.cancelled_at, coalesce(ss.started_at, ss.created_at))
    from new_runs n
    join old_runs o on o.run_id = n.run_id
   where ss.run_id = n.run_id and o.status = 'started' and n.status = 'cancelled'
     and ss.status in ('created', 'started');
  return null;
end;
$$;

create trigger runs_cancel_unfinished_steps
after update on flowlane.runs
referencing old table as old_runs new table as new_runs
for each statement execute function flowlane._cancel_unfinished_steps();
