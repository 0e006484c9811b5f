-- Queries of metrics and probes (flowlane/app/observability.py).

-- name: observability_ping
select 1

-- name: observability_queue_metrics
select queue_name, depth, oldest_age_seconds, live_workers, disabled_deployments
from flowlane.queue_metrics()

-- name: observability_listen_runs
-- the engine notifies each run that ends, with its id as the payload (to sessions that listen
-- through listen_run_finished)
select flowlane.listen_run_finished()

-- name: observability_run_durations
-- the runs of one batch of notifications that ended, by their key
select flow_slug, status,
       extract(epoch from coalesce(completed_at, failed_at, cancelled_at) - started_at)::float8 as seconds
from flowlane.runs
where run_id = any (%(run_ids)s::uuid[]) and status in ('completed', 'failed', 'cancelled')

-- name: observability_schedules
-- per schedule: whether an operator paused it, its latest fired slot and its next one
select s.schedule_name, coalesce(o.paused, false) as paused,
       extract(epoch from s.last_slot)::float8 as last_slot,
       extract(epoch from s.next_slot)::float8 as next_slot
from flowlane.schedules s
left join flowlane.schedule_overrides o on o.schedule_name = s.schedule_name
order by s.schedule_name

-- name: observability_statement_timeout
-- through a transaction-mode pooler (no startup options): for the current transaction only
select set_config('statement_timeout', %(milliseconds)s, true)
