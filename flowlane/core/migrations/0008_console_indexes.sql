-- Indexes for `flowlane ui` (the console): keyset paging of the runs list, newest first,
-- with or without a flow or status filter, and the per-queue throughput of recent minutes.
-- Plain (not concurrent) index builds: a migration runs in one transaction; on a large
-- database they block writes to these tables while they build.

create index runs_keyset_idx on flowlane.runs (started_at, run_id);
create index runs_flow_keyset_idx on flowlane.runs (flow_slug, started_at, run_id);
create index runs_status_keyset_idx on flowlane.runs (status, started_at, run_id);

-- the 0001 single-column indexes are prefixes of the two above
drop index flowlane.runs_flow_idx;
drop index flowlane.runs_status_idx;
-- 0007's (started_at desc, run_id) serves "order by started_at desc, run_id desc" (flowlane runs,
-- the console) only with an extra sort of equal start times; runs_keyset_idx serves it exactly
drop index flowlane.runs_started_idx;

create index step_tasks_completed_idx on flowlane.step_tasks (completed_at, queue_name)
  where completed_at is not null;
