-- Named statements for benchmarks/history_growth.py (same format as flowlane/core/sql).
-- The loaded history is copies of one real finished one-step run of bench_one (the template,
-- started, claimed and completed by the engine): run id, input, message id and times
-- changed, every other column as the engine wrote it. Copy i started (runs - i + 1) x
-- 10 ms before the template, as 100 runs a second would have; its message id is the
-- template's + i. Each copy is made in a lateral join: `(f(...)).*` in the select list
-- would call f once per column.

-- name: template
select r.run_id, t.message_id
from flowlane.runs r join flowlane.step_tasks t on t.run_id = r.run_id
where r.flow_slug = 'bench_one' and r.status = 'completed'

-- name: load_runs
insert into flowlane.runs
select p.*
from flowlane.runs t
cross join generate_series(%(lo)s::bigint, %(hi)s::bigint) i
cross join lateral (select (%(runs)s - i + 1) * interval '10 ms' as shift) s
cross join lateral jsonb_populate_record(t, jsonb_build_object(
          'run_id', md5('history' || i)::uuid, 'input', jsonb_build_object('i', i),
          'started_at', t.started_at - s.shift, 'completed_at', t.completed_at - s.shift,
          'deadline_at', t.deadline_at - s.shift)) p
where t.run_id = %(template)s

-- name: load_step_states
insert into flowlane.step_states
select p.*
from flowlane.step_states t
cross join generate_series(%(lo)s::bigint, %(hi)s::bigint) i
cross join lateral (select (%(runs)s - i + 1) * interval '10 ms' as shift) s
cross join lateral jsonb_populate_record(t, jsonb_build_object(
          'run_id', md5('history' || i)::uuid, 'created_at', t.created_at - s.shift,
          'started_at', t.started_at - s.shift, 'completed_at', t.completed_at - s.shift)) p
where t.run_id = %(template)s

-- name: load_step_tasks
insert into flowlane.step_tasks
select p.*
from flowlane.step_tasks t
cross join generate_series(%(lo)s::bigint, %(hi)s::bigint) i
cross join lateral (select (%(runs)s - i + 1) * interval '10 ms' as shift) s
cross join lateral jsonb_populate_record(t, jsonb_build_object(
          'run_id', md5('history' || i)::uuid, 'message_id', t.message_id + i,
          'queued_at', t.queued_at - s.shift, 'started_at', t.started_at - s.shift,
          'completed_at', t.completed_at - s.shift, 'lease_renewed_at', t.lease_renewed_at - s.shift)) p
where t.run_id = %(template)s

-- name: load_archive
insert into pgmq.a_bench_one
select p.*
from pgmq.a_bench_one t
cross join generate_series(%(lo)s::bigint, %(hi)s::bigint) i
cross join lateral (select (%(runs)s - i + 1) * interval '10 ms' as shift) s
cross join lateral jsonb_populate_record(t, jsonb_build_object(
          'msg_id', t.msg_id + i, 'message', t.message || jsonb_build_object('run_id', md5('history' || i)::uuid),
          'enqueued_at', t.enqueued_at - s.shift, 'last_read_at', t.last_read_at - s.shift,
          'archived_at', t.archived_at - s.shift, 'vt', t.vt - s.shift)) p
where t.msg_id = %(message_id)s

-- name: advance_messages
-- the queue's next message id comes after the loaded ones
select setval(pg_get_serial_sequence('pgmq.q_bench_one', 'msg_id'), %(last)s::bigint)

-- name: sizes
select c.oid::regclass::text, c.reltuples::bigint, pg_relation_size(c.oid), pg_indexes_size(c.oid),
       pg_total_relation_size(c.oid)
from pg_class c
where c.oid in ('flowlane.runs'::regclass, 'flowlane.step_states'::regclass, 'flowlane.step_tasks'::regclass,
                'pgmq.q_bench_one'::regclass, 'pgmq.a_bench_one'::regclass)
order by pg_total_relation_size(c.oid) desc

-- name: index_sizes
select i.indexrelid::regclass::text, pg_relation_size(i.indexrelid)
from pg_index i
where i.indrelid in ('flowlane.runs'::regclass, 'flowlane.step_states'::regclass, 'flowlane.step_tasks'::regclass,
                     'pgmq.a_bench_one'::regclass)
order by pg_relation_size(i.indexrelid) desc
