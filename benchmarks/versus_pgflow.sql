-- Named statements for benchmarks/versus_pgflow.py (same format as flowlane/core/sql): the
-- stand-ins its SQL Core needs outside its own schema, and the calls that drive it.

-- name: realtime_stand_in
-- The package's functions broadcast their events with realtime.send, which a plain PostgreSQL
-- does not have: a no-op of the same signature, so that no broadcast costs anything.
create schema if not exists realtime;
create or replace function realtime.send(payload jsonb, event text, topic text, private boolean)
returns void language sql as $$ select $$;

-- name: pgmq_extension_version
select extversion from pg_extension where extname = 'pgmq'

-- name: register_worker
insert into pgflow.workers (worker_id, queue_name, function_name)
values (%(worker_id)s, %(queue)s, 'versus_pgflow')

-- name: create_flow
select pgflow.create_flow(%(flow)s)

-- name: add_step
select pgflow.add_step(%(flow)s, %(step)s, %(deps)s::text[])

-- name: start_flow
select run_id from pgflow.start_flow(%(flow)s, %(input)s)

-- name: read
select msg_id from pgmq.read(%(queue)s, 30, %(qty)s)

-- name: start_tasks
select run_id, step_slug, task_index from pgflow.start_tasks(%(flow)s, %(msg_ids)s::bigint[], %(worker_id)s)

-- name: complete_task
select status from pgflow.complete_task(%(run_id)s, %(step)s, %(task_index)s, %(output)s)

-- name: unfinished_runs
select count(*) from pgflow.runs where flow_slug = %(flow)s and status <> 'completed'
