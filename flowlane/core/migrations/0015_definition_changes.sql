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
