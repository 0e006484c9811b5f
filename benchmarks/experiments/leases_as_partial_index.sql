-- An experiment for worker_throughput.py --after-sql, never a migration: the lease rows
-- replaced by what could read the started tasks instead, a partial index of step_tasks.
-- A claim and a completion change a task's status, so with it their updates are no
-- longer HOT. Nothing in the engine reads the index yet: it measures only the writes.
drop trigger step_tasks_leases_on_insert on flowlane.step_tasks;
drop trigger step_tasks_leases_on_update on flowlane.step_tasks;
drop trigger step_tasks_leases_on_delete on flowlane.step_tasks;
create index step_tasks_started_idx on flowlane.step_tasks (queue_name, started_at)
  where status = 'started';
