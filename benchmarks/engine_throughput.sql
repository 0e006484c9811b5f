-- Named statements for benchmarks/engine_throughput.py (same format as flowlane/core/sql).

-- name: create_queue
select pgmq.create(%(queue)s)

-- name: send
select pgmq.send(%(queue)s, %(body)s)

-- name: read
select msg_id from pgmq.read(%(queue)s, 30, %(qty)s)

-- name: archive
select pgmq.archive(%(queue)s, %(msg_id)s::bigint)

-- name: create_flow
select flowlane.create_flow(%(flow)s)

-- name: add_step
select flowlane.add_step(%(flow)s, %(step)s, %(deps)s)

-- name: start_flow
select run_id from flowlane.start_flow(%(flow)s, %(input)s)

-- name: start_tasks
select run_id, step_slug, task_index, attempt
from flowlane.start_tasks(%(queue)s, %(msg_ids)s, %(worker_id)s,
                          (select jsonb_agg(jsonb_build_array(flow_slug, step_slug))
                           from flowlane.steps where queue_name = %(queue)s))
where outcome = 'claimed'

-- name: complete_task
select status from flowlane.complete_task(%(run_id)s, %(step)s, %(task_index)s, %(output)s,
                                          %(worker_id)s, %(attempt)s)

-- name: completed_runs
select count(*) from flowlane.runs where flow_slug = %(flow)s and status = 'completed'

-- name: migration_versions
select string_agg(version, ',' order by version) from flowlane.schema_migrations
