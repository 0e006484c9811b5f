-- Read queries of the console (`flowlane ui`, flowlane/app/console.py). Every list is bounded.

-- name: console_flows
select f.flow_slug, f.queue_mode, f.opt_max_attempts, f.opt_base_delay, f.opt_timeout, f.created_at,
       (select count(*) from flowlane.steps s where s.flow_slug = f.flow_slug) as steps,
       (select array_agg(distinct s.queue_name order by s.queue_name)
          from flowlane.steps s where s.flow_slug = f.flow_slug) as queues
from flowlane.flows f
order by f.flow_slug

-- name: console_aliases
select a.alias, a.flow_slug as active, a.draining, a.updated_at
from flowlane.aliases a
order by a.alias

-- name: console_alias_history
select h.alias, h.flow_slug as active, h.draining, h.changed_at
from flowlane.alias_history h
where h.alias = any(%(aliases)s::text[])
order by h.alias, h.id desc
limit 200

-- name: console_flow
select f.flow_slug, f.queue_mode, f.opt_max_attempts, f.opt_base_delay, f.opt_timeout, f.created_at,
       (select c.schema from flowlane.contracts c
         where c.flow_slug = f.flow_slug and coalesce(c.step_slug, '') = '') as input_schema
from flowlane.flows f
where f.flow_slug = %(flow_slug)s

-- name: console_flow_steps
select s.step_slug, s.step_index, s.step_type, s.queue_name, s.child_flow, s.when_unmet, s.when_exhausted,
       s.opt_max_attempts, s.opt_base_delay, s.opt_timeout, s.opt_start_delay,
       s.required_input_pattern, s.forbidden_input_pattern,
       (select c.schema from flowlane.contracts c
         where c.flow_slug = s.flow_slug and coalesce(c.step_slug, '') = s.step_slug) as output_schema,
       coalesce((select array_agg(d.dep_slug order by d.dep_slug) from flowlane.deps d
                 where d.flow_slug = s.flow_slug and d.step_slug = s.step_slug), '{}') as needs
from flowlane.steps s
where s.flow_slug = %(flow_slug)s
order by s.step_index

-- name: console_runs
-- keyset paging, newest first: (after_started_at, after_run_id) is the last row of the previous page
select r.run_id, r.flow_slug, r.status, r.remaining_steps, r.started_at,
       coalesce(r.completed_at, r.failed_at, r.cancelled_at) as ended_at, left(r.error_message, 200) as error_message
from flowlane.runs r
where (%(status)s::text is null or r.status = %(status)s::text)
  and (%(since)s::timestamptz is null or r.started_at >= %(since)s::timestamptz)
  and (%(until)s::timestamptz is null or r.started_at < %(until)s::timestamptz)
  and (%(after_started_at)s::timestamptz is null
       or (r.started_at, r.run_id) < (%(after_started_at)s::timestamptz, %(after_run_id)s::uuid))
order by r.started_at desc, r.run_id desc
limit %(limit)s

-- name: console_runs_of_flows
-- the same for some flows (an alias: its versions): one index range per flow, each cut at the page
-- size, then merged; "flow_slug = any(...)" would read and sort every run of those flows
select page.*
from unnest(%(flows)s::text[]) as f(flow_slug)
cross join lateral (
  select r.run_id, r.flow_slug, r.status, r.remaining_steps, r.started_at,
         coalesce(r.completed_at, r.failed_at, r.cancelled_at) as ended_at, left(r.error_message, 200) as error_message
  from flowlane.runs r
  where r.flow_slug = f.flow_slug
    and (%(status)s::text is null or r.status = %(status)s::text)
    and (%(since)s::timestamptz is null or r.started_at >= %(since)s::timestamptz)
    and (%(until)s::timestamptz is null or r.started_at < %(until)s::timestamptz)
    and (%(after_started_at)s::timestamptz is null
         or (r.started_at, r.run_id) < (%(after_started_at)s::timestamptz, %(after_run_id)s::uuid))
  order by r.started_at desc, r.run_id desc
  limit %(limit)s
) page
order by page.started_at desc, page.run_id desc
limit %(limit)s

-- name: console_run
select r.run_id, r.flow_slug, r.status, r.remaining_steps, r.started_at, r.completed_at, r.failed_at,
       coalesce(r.completed_at, r.failed_at, r.cancelled_at) as ended_at, r.error_message,
       r.cancel_reason, r.retry_count, r.retried_at, r.start_at, r.deadline_at, r.called_as,
       r.idempotency_key, r.schedule_name, r.schedule_slot, r.hold_seq is not null as held, r.compensation,
       octet_length(r.input::text) as input_bytes, octet_length(r.output::text) as output_bytes,
       r.origin, r.parent_run_id
from flowlane.runs r
where r.run_id = %(run_id)s::uuid

-- name: console_run_steps
select s.step_slug, s.step_index, s.step_type, s.queue_name, s.child_flow,
       o.max_attempts, o.timeout,
       st.status, st.initial_tasks, st.remaining_tasks, st.remaining_deps, st.error_message, st.skip_reason,
       st.created_at, st.started_at, coalesce(st.completed_at, st.failed_at, st.skipped_at, st.cancelled_at) as ended_at,
       octet_length(st.output::text) as output_bytes,
       t.tasks, t.queued, t.started, t.completed, t.failed, t.skipped, t.cancelled, t.attempts,
       t.requeued, t.cached,
       w.expires_at as wait_expires_at, g.received_at as signal_received_at,
       g.applied_at as signal_applied_at, g.payload ->> 'by' as decided_by,
       g.payload ->> 'at' as decided_at, g.payload ->> 'comment' as decision_comment,
       case when jsonb_typeof(g.payload -> 'approved') = 'boolean'
            then (g.payload ->> 'approved')::boolean end as approved
from flowlane.runs r
join flowlane.steps s on s.flow_slug = r.flow_slug
join flowlane.step_options o on o.flow_slug = s.flow_slug and o.step_slug = s.step_slug
left join flowlane.all_step_states st on st.run_id = r.run_id and st.step_slug = s.step_slug
left join flowlane.wait_deadlines w on w.run_id = r.run_id and w.step_slug = s.step_slug
left join flowlane.signals g on g.run_id = r.run_id and g.step_slug = s.step_slug
left join lateral (
  select count(*) as tasks,
         count(*) filter (where k.status = 'queued') as queued,
         count(*) filter (where k.status = 'started') as started,
         count(*) filter (where k.status = 'completed') as completed,
         count(*) filter (where k.status = 'failed') as failed,
         count(*) filter (where k.status = 'skipped') as skipped,
         count(*) filter (where k.status = 'cancelled') as cancelled,
         coalesce(sum(k.attempts_count), 0) as attempts,
         coalesce(sum(k.requeued_count), 0) as requeued,
         count(*) filter (where k.cached) as cached
  from flowlane.step_tasks k
  where k.run_id = r.run_id and k.step_slug = s.step_slug
) t on true
where r.run_id = %(run_id)s::uuid
order by s.step_index

-- name: console_run_tasks
-- per step the tasks worth looking at first (failed, then running, then by index), bounded
select step_slug, task_index, status, attempts_count, error_message, queue_name, message_id,
       last_worker_id, queued_at, started_at, ended_at, output_bytes, cached
from (
  select k.step_slug, k.task_index, k.status, k.attempts_count, k.error_message, k.queue_name,
         k.message_id, k.cached, k.last_worker_id, k.queued_at, k.started_at,
         coalesce(k.completed_at, k.failed_at, k.skipped_at, k.cancelled_at) as ended_at,
         octet_length(k.output::text) as output_bytes,
         row_number() over (partition by k.step_slug
                            order by k.status = 'failed' desc, k.error_message is not null desc,
                                     k.status = 'started' desc, k.task_index) as rank
  from flowlane.step_tasks k
  where k.run_id = %(run_id)s::uuid
) ranked
where rank <= %(per_step)s
order by step_slug, rank

-- name: console_run_attempts
-- the failed and stalled attempts of a run (the attempt history), the latest ones per step, oldest first
select step_slug, task_index, attempt, retry_round, outcome, worker_id, error_type, error_message,
       traceback, failed_at
from (
  select a.*, row_number() over (partition by a.step_slug order by a.id desc) as latest
  from flowlane.task_attempts a
  where a.run_id = %(run_id)s::uuid
) recent
where latest <= %(per_step)s
order by step_slug, id

-- name: console_run_input
select left(r.input::text, %(limit)s) as text, octet_length(r.input::text) as bytes
from flowlane.runs r where r.run_id = %(run_id)s::uuid

-- name: console_run_output
select left(r.output::text, %(limit)s) as text, octet_length(r.output::text) as bytes
from flowlane.runs r where r.run_id = %(run_id)s::uuid

-- name: console_step_output
select left(s.output::text, %(limit)s) as text, octet_length(s.output::text) as bytes
from flowlane.all_step_states s where s.run_id = %(run_id)s::uuid and s.step_slug = %(step_slug)s

-- name: console_task_output
select left(k.output::text, %(limit)s) as text, octet_length(k.output::text) as bytes
from flowlane.step_tasks k
where k.run_id = %(run_id)s::uuid and k.step_slug = %(step_slug)s and k.task_index = %(task_index)s

-- name: console_queues
-- the registry and PGMQ side by side: a queue may be registered, in PGMQ only (not adopted), or both
select coalesce(q.queue_name, m.queue_name) as queue_name, q.ownership, q.owner_flow_slug, q.adopted_at,
       q.queue_name is not null as registered, m.queue_name is not null as in_pgmq,
       m.queue_length, m.queue_visible_length, m.oldest_msg_age_sec, m.total_messages,
       (select count(*) from flowlane.steps s where s.queue_name = q.queue_name) as routed_steps,
       (select count(*) from flowlane.workers w
         where w.queue_name = q.queue_name and flowlane.worker_is_live(w)) as live_workers,
       q.archive_messages, l.concurrency, l.started, l.rate_limit, l.rate_per, l.waiting_for
from flowlane.queues q
full join flowlane.pgmq_metrics() m on m.queue_name = q.pgmq_queue_name
left join flowlane.queue_flow_control() l on l.queue_name = q.queue_name
order by 1

-- name: console_queue_throughput
-- tasks completed per queue and minute over the last minutes (minute 0 = the current one)
select k.queue_name,
       floor(extract(epoch from flowlane._now() - k.completed_at) / 60)::int as minutes_ago,
       count(*) as completed
from flowlane.step_tasks k
where k.completed_at is not null and k.completed_at > flowlane._now() - make_interval(mins => %(minutes)s)
group by 1, 2

-- name: console_queue_routes
select s.queue_name, s.flow_slug, s.step_slug
from flowlane.steps s
order by s.queue_name, s.flow_slug, s.step_index

-- name: console_workers
select w.worker_id, w.worker_name, w.deployment_name, w.queue_name, w.supported_pairs,
       w.started_at, w.last_heartbeat_at,
       extract(epoch from flowlane._now() - w.last_heartbeat_at)::float8 as heartbeat_age,
       w.deprecated_at, w.stopped_at, flowlane.worker_is_live(w) as live
from flowlane.workers w
order by w.stopped_at is not null, w.last_heartbeat_at desc
limit %(limit)s

-- name: console_deployments
select d.deployment_name, d.queue_name, d.enabled, d.reason, d.created_at, d.changed_at,
       count(w.worker_id) filter (where flowlane.worker_is_live(w))
         as live_workers
from flowlane.worker_deployments d
left join flowlane.workers w on w.deployment_name = d.deployment_name
group by d.deployment_name
order by d.deployment_name collate "C"

-- name: console_pause_schedule
select schedule_name from flowlane.set_schedule_paused(%(schedule)s, true, %(reason)s)

-- name: console_resume_schedule
select schedule_name from flowlane.set_schedule_paused(%(schedule)s, false)

-- name: console_trigger_schedule
select run_id from flowlane.trigger_schedule(%(schedule)s)

-- name: console_decide
-- approve or reject from the console: a signal {approved, by, at, comment} to a wait step
select run_id from flowlane.signal(%(run_id)s::uuid, %(step)s, jsonb_build_object(
  'approved', %(approved)s::boolean, 'by', %(by)s::text, 'at', flowlane._now(),
  'comment', nullif(%(comment)s::text, '')))

-- name: console_run_family
select flowlane.get_run_family(%(run_id)s::uuid) as family

-- name: console_failures
-- the runs that failed in the last hours, grouped by flow, failed step and error type (the type of
-- that step's last failed attempt in the run's last round, as client_matching_runs filters;
-- none: the run failed without one, such as at its deadline), per hour before now
select f.flow_slug, f.step_slug, f.error_type,
       floor(extract(epoch from (flowlane._now() - f.failed_at)) / 3600)::int as hours_ago,
       count(*) as runs, min(f.failed_at) as first_failed_at, max(f.failed_at) as last_failed_at
from (
  select r.flow_slug, r.failed_at, ss.step_slug,
         (select a.error_type from flowlane.task_attempts a
          where a.run_id = r.run_id and a.step_slug = ss.step_slug and a.retry_round = r.retry_count
            and a.outcome = 'failed'
          order by a.id desc limit 1) as error_type
  from flowlane.runs r
  left join flowlane.step_states ss on ss.run_id = r.run_id and ss.status = 'failed'
  where r.status = 'failed' and r.failed_at >= flowlane._now() - make_interval(hours => %(hours)s::int)
) f
group by 1, 2, 3, 4
