-- Named statements for benchmarks/write_floor.py (same format as flowlane/core/sql): the
-- rows a one-step task changes from its claim to its completion, written with plain
-- statements, none of the engine's checks. A yardstick, never a way to run tasks.

-- name: read
select msg_id from pgmq.read('bench_one', 30, %(qty)s)

-- name: task_started
update flowlane.step_tasks t
   set status = 'started', started_at = now(), attempts_count = t.attempts_count + 1,
       last_worker_id = %(worker_id)s
 where t.queue_name = 'bench_one' and t.message_id = any (%(msg_ids)s::bigint[])
returning t.run_id

-- name: task_completed
update flowlane.step_tasks t
   set status = 'completed', completed_at = now(), output = '{}'
 where t.run_id = any (%(runs)s::uuid[]) and t.step_slug = 's0' and t.task_index = 0

-- name: archive
select pgmq.archive('bench_one', %(msg_ids)s::bigint[])

-- name: step_completed
update flowlane.step_states ss
   set status = 'completed', completed_at = now(), remaining_tasks = 0, output = '{}'
 where ss.run_id = any (%(runs)s::uuid[]) and ss.step_slug = 's0'

-- name: run_completed
update flowlane.runs r
   set status = 'completed', completed_at = now(), remaining_steps = 0, output = '{"s0": {}}'
 where r.run_id = any (%(runs)s::uuid[])
