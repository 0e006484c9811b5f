-- Queries of benchmarks/console_pages.py: synthetic runs of flows/diamond.yaml, and the raw
-- baselines the console's pages are compared with.

-- name: seed_runs
-- run i started i * 26 s ago; every 50th is still running, every 1000th failed (the rare
-- failures an operator looks for), the rest completed
insert into flowlane.runs (run_id, flow_slug, status, input, output, error_message, remaining_steps,
                           started_at, completed_at, failed_at)
select md5('run' || i)::uuid, 'diamond', status, jsonb_build_object('numbers', jsonb_build_array(i, 2, 3)),
       case when status = 'completed' then '{"total": {"sum": 14}}'::jsonb end,
       case when status = 'failed' then 'step square task 1 failed after 3 attempts: ValueError: boom' end,
       case status when 'completed' then 0 when 'failed' then 2 else 3 end,
       t, case when status = 'completed' then t + interval '2 s' end,
       case when status = 'failed' then t + interval '2 s' end
from (select i, now() - make_interval(secs => i * 26) as t,
             case when i %% 1000 = 7 then 'failed' when i %% 50 = 0 then 'started' else 'completed' end as status
      from generate_series(1, %(runs)s) i) g

-- name: seed_step_states
insert into flowlane.step_states (flow_slug, run_id, step_slug, status, remaining_deps, initial_tasks,
                                  remaining_tasks, output, skip_reason, created_at, started_at,
                                  completed_at, failed_at, skipped_at)
select 'diamond', r.run_id, p.step_slug, p.step_status, 0,
       case when p.tasks > 0 then p.tasks end,
       case p.step_status when 'completed' then 0 when 'failed' then 0 when 'started' then p.tasks end,
       case when p.step_status = 'completed' then '{"ok": true}'::jsonb end,
       case when p.step_status = 'skipped' then 'condition_unmet' end,
       r.started_at, case when p.tasks > 0 then r.started_at end,
       case when p.step_status = 'completed' then r.started_at + interval '1 s' end,
       case when p.step_status = 'failed' then r.started_at + interval '1 s' end,
       case when p.step_status = 'skipped' then r.started_at + interval '1 s' end
from flowlane.runs r
join (values
  ('completed', 'split', 'completed', 1), ('completed', 'square', 'completed', 3),
  ('completed', 'describe', 'completed', 1), ('completed', 'total', 'completed', 1),
  ('completed', 'notify', 'skipped', 0),
  ('failed', 'split', 'completed', 1), ('failed', 'square', 'failed', 3),
  ('failed', 'describe', 'completed', 1), ('failed', 'total', 'created', 0), ('failed', 'notify', 'created', 0),
  ('started', 'split', 'completed', 1), ('started', 'square', 'started', 3),
  ('started', 'describe', 'completed', 1), ('started', 'total', 'created', 0), ('started', 'notify', 'created', 0)
) as p(run_status, step_slug, step_status, tasks) on p.run_status = r.status

-- name: seed_step_tasks
insert into flowlane.step_tasks (flow_slug, run_id, step_slug, task_index, queue_name, message_id, status,
                                 attempts_count, error_message, output, queued_at, started_at,
                                 completed_at, failed_at, cancelled_at)
select s.flow_slug, s.run_id, s.step_slug, k.task_index, 'diamond',
       row_number() over (), t.status, 1,
       case when t.status = 'failed' then 'ValueError: boom' end,
       case when t.status = 'completed' then '1'::jsonb end,
       s.created_at, s.created_at,
       case when t.status = 'completed' then s.created_at + interval '1 s' end,
       case when t.status = 'failed' then s.created_at + interval '1 s' end,
       case when t.status = 'cancelled' then s.created_at + interval '1 s' end
from flowlane.step_states s
cross join lateral generate_series(0, s.initial_tasks - 1) as k(task_index)
cross join lateral (select case
    when s.status <> 'failed' then s.status
    when k.task_index = 1 then 'failed'
    when k.task_index = 0 then 'completed'
    else 'cancelled' end as status) t
where s.initial_tasks > 0

-- name: analyze
-- the state autovacuum keeps the tables in (vacuum also summarizes the BRIN ranges of the
-- completed_at index; ranges filled since the last vacuum are read whole)
vacuum analyze flowlane.runs, flowlane.step_states, flowlane.step_tasks

-- name: raw_runs_first_page
select run_id, flow_slug, status, remaining_steps, started_at, completed_at, failed_at, error_message
from flowlane.runs
order by started_at desc, run_id desc
limit 50

-- name: raw_runs_of_flow
select run_id, flow_slug, status, remaining_steps, started_at, completed_at, failed_at, error_message
from flowlane.runs
where flow_slug = 'diamond'
order by started_at desc, run_id desc
limit 50

-- name: raw_runs_failed_page
select run_id, flow_slug, status, remaining_steps, started_at, completed_at, failed_at, error_message
from flowlane.runs
where status = 'failed'
order by started_at desc, run_id desc
limit 50

-- name: raw_runs_started_deep_page
select run_id, flow_slug, status, remaining_steps, started_at, completed_at, failed_at, error_message
from flowlane.runs
where status = 'started' and (started_at, run_id) < (%(after_started_at)s, %(after_run_id)s)
order by started_at desc, run_id desc
limit 50

-- name: raw_run
select * from flowlane.runs where run_id = %(run_id)s

-- name: raw_run_steps
select * from flowlane.step_states where run_id = %(run_id)s

-- name: raw_run_tasks
select * from flowlane.step_tasks where run_id = %(run_id)s

-- name: cursor_at
select started_at, run_id from flowlane.runs
where (%(status)s::text is null or status = %(status)s::text)
order by started_at desc, run_id desc
offset %(offset)s limit 1

-- name: a_failed_run
select run_id from flowlane.runs where status = 'failed' order by started_at desc limit 1 offset 10

-- name: raw_throughput
select k.queue_name, count(*) from flowlane.step_tasks k
where k.completed_at > now() - interval '15 minutes'
group by 1

-- name: drop_console_indexes
drop index flowlane.step_tasks_completed_brin;
analyze flowlane.step_tasks
