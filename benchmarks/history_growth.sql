-- Named statements for benchmarks/history_growth.py (same format as flowlane/core/sql).
-- The loaded history is copies of one real finished one-step run of bench_one (the template,
-- started, claimed and completed by the engine): run id, input, message id and times
-- changed, every other column as the engine wrote it. Copy i started (runs - i + 1) x
-- 10 ms before the template, as 100 runs a second would have; its message id is the
-- queue's last one's + i, its run id history_run_id's. Each copy is made in a lateral join:
-- `(f(...)).*` in the select list would call f once per column.

-- name: history_run_id
-- copy i's run id: random, or time-ordered (UUID version 7) with the copy's start time, as
-- the engine's ids are; the same for the same i in every table
create or replace function pg_temp.history_run_id(i bigint, started_at timestamptz, time_ordered boolean)
returns uuid language sql immutable
return case when time_ordered
  then (lpad(to_hex(floor(extract(epoch from started_at) * 1000)::bigint), 12, '0')
        || '7' || substr(md5('history' || i), 14, 3) || '8' || substr(md5('history' || i), 18))::uuid
  else md5('history' || i)::uuid end

-- name: template
select r.run_id, t.message_id, r.started_at
from flowlane.runs r join flowlane.step_tasks t on t.run_id = r.run_id
where r.flow_slug = 'bench_one' and r.status = 'completed'
order by t.message_id desc
limit 1

-- name: load_runs
insert into flowlane.runs
select p.*
from flowlane.runs t
cross join generate_series(%(lo)s::bigint, %(hi)s::bigint) i
cross join lateral (select (%(runs)s - i + 1) * interval '10 ms' as shift) s
cross join lateral jsonb_populate_record(t, jsonb_build_object(
          'run_id', pg_temp.history_run_id(i, %(started_at)s::timestamptz - s.shift, %(time_ordered)s), 'input', jsonb_build_object('i', i),
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
          'run_id', pg_temp.history_run_id(i, %(started_at)s::timestamptz - s.shift, %(time_ordered)s), 'created_at', t.created_at - s.shift,
          'started_at', t.started_at - s.shift, 'completed_at', t.completed_at - s.shift)) p
where t.run_id = %(template)s

-- name: load_step_tasks
insert into flowlane.step_tasks
select p.*
from flowlane.step_tasks t
cross join generate_series(%(lo)s::bigint, %(hi)s::bigint) i
cross join lateral (select (%(runs)s - i + 1) * interval '10 ms' as shift) s
cross join lateral jsonb_populate_record(t, jsonb_build_object(
          'run_id', pg_temp.history_run_id(i, %(started_at)s::timestamptz - s.shift, %(time_ordered)s), 'message_id', %(last_message)s::bigint + i,
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
          'msg_id', %(last_message)s::bigint + i, 'message', t.message || jsonb_build_object('run_id', pg_temp.history_run_id(i, %(started_at)s::timestamptz - s.shift, %(time_ordered)s)),
          'enqueued_at', t.enqueued_at - s.shift, 'last_read_at', t.last_read_at - s.shift,
          'archived_at', t.archived_at - s.shift, 'vt', t.vt - s.shift)) p
where t.msg_id = %(message_id)s

-- name: last_message
select pg_sequence_last_value(pg_get_serial_sequence('pgmq.q_bench_one', 'msg_id')::regclass)

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

-- name: block_counts
-- this database's shared blocks found in shared buffers and read in (its own backend's counts
-- flushed by the statement before)
select blks_hit, blks_read from pg_stat_database where datname = current_database()

-- name: flush_stats
select pg_stat_force_next_flush()

-- name: prewarm
-- the tables' indexes, smallest first, then the tables, read into shared buffers up to 70 %
-- of them
select count(pg_prewarm(oid))
from (select c.oid, sum(pg_relation_size(c.oid)) over (order by c.relkind desc, pg_relation_size(c.oid), c.oid) as upto
      from pg_class c join pg_namespace n on n.oid = c.relnamespace
      where n.nspname in ('flowlane', 'pgmq') and c.relkind in ('r', 'i')) r
where upto < 0.7 * pg_size_bytes(current_setting('shared_buffers'))

-- name: block_differences
-- the statements run in both databases (matched by text: their ids differ with the tables'),
-- nested ones included, whose shared blocks per call differ most
with per as (
  select d.datname, s.query, sum(s.shared_blks_hit) as hit, sum(s.shared_blks_read) as read,
         sum(s.shared_blks_dirtied) as dirtied
  from pg_stat_statements s join pg_database d on d.oid = s.dbid
  where d.datname in ('history_empty', 'history_loaded')
  group by d.datname, s.query
)
select left(regexp_replace(l.query, '\s+', ' ', 'g'), 100),
       coalesce(e.hit, 0)::float8 / %(calls)s, coalesce(e.read, 0)::float8 / %(calls)s,
       l.hit::float8 / %(calls)s, l.read::float8 / %(calls)s, l.dirtied::float8 / %(calls)s
from per l left join per e on e.query = l.query and e.datname = 'history_empty'
where l.datname = 'history_loaded'
order by (l.hit + 10 * l.read) - coalesce(e.hit + 10 * e.read, 0) desc
limit 6

-- name: prune_batch
-- one batch of retention: the oldest finished runs, whatever their age
select runs_deleted from flowlane.prune_runs(p_older_than => 0, p_batch => %(batch)s)

-- name: vacuum_history
vacuum flowlane.runs, flowlane.step_states, flowlane.step_tasks, pgmq.a_bench_one

-- name: auto_explain
-- this session's statements and those they run, with their plans and buffers, into the log
load 'auto_explain';
set auto_explain.log_min_duration = 0;
set auto_explain.log_analyze = on;
set auto_explain.log_buffers = on;
set auto_explain.log_nested_statements = on;
set auto_explain.log_timing = off

-- name: purge_queue
select pgmq.purge_queue('bench_one')

-- name: hide_claimed
-- the claim case's tasks stay started: their messages, visible again once their lease has
-- passed, would come first in a later claim, which hands them back, and a claim of one would
-- take the same one for ever. Hidden for a day (those of tasks started a minute ago or more:
-- a prepared completion's are younger).
update pgmq.q_bench_one q set vt = clock_timestamp() + interval '1 day'
from flowlane.step_tasks t
where t.queue_name = 'bench_one' and t.message_id = q.msg_id and t.status = 'started'
  and t.started_at < now() - interval '1 minute' and q.vt < clock_timestamp() + interval '1 hour'
