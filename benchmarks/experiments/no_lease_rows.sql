-- An experiment for worker_throughput.py --after-sql, never a migration: what a task would
-- cost without the lease row its claim inserts and its completion deletes. Stalled
-- recovery, flow control's concurrency limits and retention read the rows these triggers
-- keep, so a database changed by it serves benchmarks only.
drop trigger step_tasks_leases_on_insert on flowlane.step_tasks;
drop trigger step_tasks_leases_on_update on flowlane.step_tasks;
drop trigger step_tasks_leases_on_delete on flowlane.step_tasks;
