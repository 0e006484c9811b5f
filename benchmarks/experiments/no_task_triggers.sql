-- An experiment for worker_throughput.py --after-sql, never a migration: what a task would
-- cost if its claim and completion fired no trigger but the leases' three
-- (no_lease_rows.sql drops those). Flow control's freed slots, the attempts' history, the
-- finished runs' notifications and child flows stop working on a database changed by it.
drop trigger step_tasks_slots_freed on flowlane.step_tasks;
drop trigger step_tasks_attempt_history on flowlane.step_tasks;
drop trigger runs_slots_freed on flowlane.runs;
drop trigger runs_notify_finished on flowlane.runs;
drop trigger runs_report_to_parent on flowlane.runs;
drop trigger runs_end_children on flowlane.runs;
drop trigger step_states_keep_skip_error on flowlane.step_states;
