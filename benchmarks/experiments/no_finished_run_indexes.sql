-- An experiment for worker_throughput.py --after-sql, never a migration: what a run's
-- completion would cost without the four secondary indexes a finished run enters (a
-- completion changes the run's status, so it is never a HOT update). Pruning, the
-- console's run lists and deleting a flow's data read them.
drop index flowlane.runs_ended_idx;
drop index flowlane.runs_prune_idx;
drop index flowlane.runs_started_idx;
drop index flowlane.runs_flow_idx;
