-- Named statements for benchmarks/engine_throughput.py (same format as flowlane/core/sql).

-- name: create_queue
select pgmq.create(%(queue)s)

-- name: send
select pgmq.send(%(queue)s, %(body)s)

-- name: send_batch
select pgmq.send_batch(%(queue)s, %(bodies)s::jsonb[])

-- name: read
select msg_id from pgmq.read(%(queue)s, 30, %(qty)s)

-- name: archive
select pgmq.archive(%(queue)s, %(msg_id)s::bigint)

-- name: archive_batch
select pgmq.archive(%(queue)s, %(msg_ids)s::bigint[])

-- name: create_flow
select flowlane.create_flow(%(flow)s)

-- name: add_step
select flowlane.add_step(%(flow)s, %(step)s, %(deps)s, step_type => %(step_type)s)

-- name: set_archive
select flowlane.set_queue_limits(%(queue)s, null, null, null, archive => %(archive)s)

-- name: start_flow
select run_id from flowlane.start_flow(%(flow)s, %(input)s)

-- name: start_flows
select count(*) from flowlane.start_flows(%(flow)s, %(inputs)s::jsonb[])

-- name: pairs
select jsonb_agg(jsonb_build_array(flow_slug, step_slug)) from flowlane.steps where queue_name = %(queue)s

-- name: start_tasks
select run_id, step_slug, task_index, attempt
from flowlane.start_tasks(%(queue)s, %(msg_ids)s, %(worker_id)s, %(pairs)s::jsonb)
where outcome = 'claimed'

-- name: claim_tasks
select run_id, step_slug, task_index, attempt
from flowlane.claim_tasks(%(queue)s, %(qty)s, %(worker_id)s, %(pairs)s::jsonb)
where outcome = 'claimed'

-- name: complete_task
select status from flowlane.complete_task(%(run_id)s, %(step)s, %(task_index)s, %(output)s,
                                          %(worker_id)s, %(attempt)s)

-- name: complete_tasks
select count(*) from flowlane.complete_tasks(%(results)s::jsonb)

-- name: unfinished_runs
select count(*) from flowlane.runs where flow_slug = %(flow)s and status <> 'completed'

-- name: has_function
select exists (select 1 from pg_proc where proname = %(name)s
               and pronamespace = 'flowlane'::regnamespace)

-- name: backend_pid
select pg_backend_pid()

-- name: statements_reset
select pg_stat_statements_reset()

-- name: statements_count
select coalesce(sum(calls), 0)::bigint from pg_stat_statements
where dbid = (select oid from pg_database where datname = current_database())
  and query !~* 'pg_stat_statements'

-- name: stats_flush
select pg_stat_force_next_flush()

-- name: task_updates
select n_tup_upd, n_tup_hot_upd from pg_stat_user_tables where relid = 'flowlane.step_tasks'::regclass
