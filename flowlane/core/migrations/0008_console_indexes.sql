-- Index for `flowlane ui` (the console): the queues page's chart counts the tasks each queue
-- completed per minute over the last minutes; without this index every view reads all tasks.
-- (The runs list pages through 0007's runs_started_idx and 0001's flow and status indexes:
-- measured with benchmarks/console_pages.py, keyset indexes of its own gained nothing.)
-- A plain (not concurrent) build: a migration runs in one transaction; on a large database it
-- blocks writes to step_tasks while it builds.

create index step_tasks_completed_idx on flowlane.step_tasks (completed_at, queue_name)
  where completed_at is not null;
