-- Queries of worker deployments, queues and rollouts (flowlane/app/fleet.py).

-- name: fleet_deployments
select d.deployment_name, d.queue_name, d.enabled, d.reason, d.changed_at,
       coalesce(jsonb_agg(jsonb_build_object(
                  'worker_id', w.worker_id,
                  'worker_name', w.worker_name,
                  'heartbeat_age', round(extract(epoch from flowlane._now() - w.last_heartbeat_at)::numeric, 1),
                  'deprecated', w.deprecated_at is not null,
                  'live', flowlane.worker_is_live(w),
                  'pairs', w.supported_pairs) order by w.started_at, w.worker_id)
                filter (where w.worker_id is not null), '[]'::jsonb) as workers
from flowlane.worker_deployments d
left join flowlane.workers w on w.deployment_name = d.deployment_name and w.stopped_at is null
group by d.deployment_name
order by d.deployment_name collate "C"

-- name: fleet_drain_status
select alias, flow_slug, started_runs, active_tasks, drained
from flowlane.drain_status()

-- name: fleet_set_enabled
select deployment_name, queue_name, enabled, reason, changed_at
from flowlane.set_deployment_enabled(%(deployment)s, %(enabled)s, %(reason)s)

-- name: fleet_queues
select q.queue_name, q.ownership, q.owner_flow_slug, q.pgmq_queue_name, q.adopted_at,
       m.queue_length as depth, m.oldest_msg_age_sec as oldest_age,
       (select count(*) from flowlane.workers w
         where w.queue_name = q.queue_name and flowlane.worker_is_live(w)) as live_workers,
       (select coalesce(jsonb_agg(jsonb_build_object(
                 'deployment', x.deployment_name, 'reason', x.reason, 'hint', x.hint,
                 'age', extract(epoch from flowlane._now() - x.refused_at))
               order by x.deployment_name collate "C"), '[]')
        from flowlane.worker_refusals x where x.queue_name = q.queue_name) as refusals,
       q.archive_messages, l.concurrency, l.started, l.rate_limit, l.rate_per, l.waiting_for
from flowlane.queues q
cross join lateral pgmq.metrics(q.pgmq_queue_name) m
left join flowlane.queue_flow_control() l on l.queue_name = q.queue_name
order by q.queue_name collate "C"

-- name: fleet_adopt_queue
select queue_name, ownership, pgmq_queue_name, adopted_at
from flowlane.adopt_queue(%(queue_name)s)

-- name: fleet_deployments_on_queues
select d.deployment_name
from flowlane.worker_deployments d
where d.queue_name = any (%(queues)s::text[])
order by d.deployment_name collate "C"

-- name: fleet_unfinished_rollout
select rollout_id, deployments, previously_enabled
from flowlane.rollouts
where finished_at is null

-- name: fleet_begin_rollout
select rollout_id, deployments, previously_enabled
from flowlane.begin_rollout(%(deployments)s::text[])

-- name: fleet_finish_rollout
select rollout_id, deployments, previously_enabled
from flowlane.finish_rollout(%(rollout_id)s)

-- name: fleet_live_workers
select w.worker_id, w.deployment_name
from flowlane.workers w
where w.deployment_name = any (%(deployments)s::text[]) and flowlane.worker_is_live(w)
order by w.deployment_name collate "C", w.worker_id

-- name: fleet_live_workers_on_queues
-- the live workers serving any of these queues: what a `serve` about to start would double
select w.queue_name, coalesce(w.deployment_name, w.worker_name) as deployment, count(*) as workers,
       round(min(extract(epoch from flowlane._now() - w.last_heartbeat_at))::numeric, 1) as heartbeat_age
from flowlane.workers w
where w.queue_name = any (%(queues)s::text[]) and w.deprecated_at is null and flowlane.worker_is_live(w)
group by 1, 2
order by w.queue_name collate "C", 2

-- name: fleet_waiting_queues
-- the queues holding queued tasks of started runs (one run's, or every run's), with their
-- live workers, disabled deployments and workers that refused to start: why the work waits
select t.queue_name, count(*) as queued_tasks,
       (select count(*) from flowlane.workers w
         where w.queue_name = t.queue_name and w.deprecated_at is null and flowlane.worker_is_live(w)) as live_workers,
       array(select d.deployment_name || ': ' || coalesce(d.reason, 'no reason given')
             from flowlane.worker_deployments d
             where d.queue_name = t.queue_name and not d.enabled
             order by d.deployment_name collate "C") as disabled,
       (select coalesce(jsonb_agg(jsonb_build_object(
                 'deployment', x.deployment_name, 'reason', x.reason, 'hint', x.hint,
                 'age', extract(epoch from flowlane._now() - x.refused_at))
               order by x.deployment_name collate "C"), '[]')
        from flowlane.worker_refusals x where x.queue_name = t.queue_name) as refusals
from flowlane.step_tasks t
join flowlane.runs r on r.run_id = t.run_id
where r.status = 'started' and t.status = 'queued'
  and (%(run_id)s::uuid is null or t.run_id = %(run_id)s::uuid)
group by t.queue_name
order by t.queue_name collate "C"

-- name: fleet_live_worker_pairs
-- the (flow, step) pairs the live workers of each queue serve, by deployment
select w.queue_name, coalesce(w.deployment_name, w.worker_name) as deployment,
       jsonb_agg(distinct p) as pairs
from flowlane.workers w
cross join lateral jsonb_array_elements(w.supported_pairs) p
where w.deprecated_at is null and flowlane.worker_is_live(w)
group by w.queue_name, coalesce(w.deployment_name, w.worker_name)
order by 1, 2
