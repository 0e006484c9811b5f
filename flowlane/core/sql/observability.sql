-- Queries of metrics and probes (flowlane/app/observability.py).

-- name: observability_ping
select 1

-- name: observability_queue_metrics
select queue_name, depth, oldest_age_seconds, live_workers, disabled_deployments
from flowlane.queue_metrics(%(stale_after)s)
