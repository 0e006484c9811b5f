-- Queries of the Python worker runtime and client (flowlane/runtime/).

-- name: worker_verify_flow
select flowlane.verify_flow(%(flow_slug)s, %(shape)s::jsonb) as result

-- name: worker_coverage
select flow_slug, step_slug, sources
from flowlane.coverage(%(queue_name)s, %(pairs)s::jsonb)

-- name: worker_register
select worker_id
from flowlane.register_worker(%(worker_id)s::uuid, %(queue_name)s, %(worker_name)s,
                              %(deployment)s, %(pairs)s::jsonb)

-- name: worker_deployment
select enabled, reason from flowlane.worker_deployments where deployment_name = %(deployment)s

-- name: worker_disable_deployment
select enabled
from flowlane.set_deployment_enabled(%(deployment)s, false, %(reason)s)

-- name: worker_heartbeat
select flowlane.heartbeat(%(worker_id)s::uuid) as deprecated

-- name: worker_mark_stopped
select flowlane.mark_worker_stopped(%(worker_id)s::uuid)

-- name: worker_requeue_stalled
select flowlane.requeue_stalled_tasks() as requeued

-- name: worker_notify_lock
select pg_advisory_xact_lock(hashtext('flowlane.notify_insert'), hashtext(%(queue_name)s))

-- name: worker_notify_throttle
select throttle_interval_ms
from pgmq.list_notify_insert_throttles()
where queue_name = %(queue_name)s

-- name: worker_enable_notify
select pgmq.enable_notify_insert(%(queue_name)s, %(throttle_ms)s)

-- name: worker_listen
listen {channel}

-- name: worker_read
select msg_id from pgmq.read(%(queue_name)s, %(vt)s, %(qty)s)

-- name: worker_read_with_poll
select msg_id
from pgmq.read_with_poll(%(queue_name)s, %(vt)s, %(qty)s, %(max_poll_seconds)s, %(poll_interval_ms)s)

-- name: worker_start_tasks
select outcome, flow_slug, step_slug, queue_name, run_id, task_index, input, flow_input, attempt, msg_id
from flowlane.start_tasks(%(queue_name)s, %(msg_ids)s::bigint[], %(worker_id)s::uuid, %(pairs)s::jsonb)

-- name: worker_complete_tasks
select run_id, step_slug, task_index, status, attempts_count, last_worker_id, error_message
from flowlane.complete_tasks(%(results)s::jsonb)

-- name: worker_fail_task
select run_id, step_slug, task_index, status, attempts_count, last_worker_id, error_message
from flowlane.fail_task(%(run_id)s::uuid, %(step_slug)s, %(task_index)s, %(error_message)s,
                        %(worker_id)s::uuid, %(attempt)s)

-- name: client_start_flow
select run_id, flow_slug from flowlane.start_flow(%(flow)s, %(input)s::jsonb, %(run_id)s::uuid)

-- name: client_list_runs
select run_id, flow_slug, status, remaining_steps, started_at, completed_at, failed_at
from flowlane.runs
where (%(flow)s::text is null or flow_slug = %(flow)s::text)
  and (%(status)s::text is null or status = %(status)s::text)
order by started_at desc, run_id
limit %(limit)s

-- name: client_get_run
select flowlane.get_run_with_states(%(run_id)s::uuid) as run
