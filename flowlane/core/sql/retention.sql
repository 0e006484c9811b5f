-- Queries of retention (flowlane/app/retention.py and the worker's maintenance).

-- name: retention_prune_batch
select runs_deleted, steps_deleted, tasks_deleted, attempts_deleted, messages_deleted
from flowlane.prune_runs(p_flows => %(flows)s::text[], p_older_than => %(older_than)s::int)

-- name: retention_prunable
select flow_slug, runs, oldest_ended_at
from flowlane.prunable_runs(p_flows => %(flows)s::text[], p_older_than => %(older_than)s::int)
