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

-- name: worker_record_refusal
select queue_name
from flowlane.record_worker_refusal(%(queue_name)s, %(deployment)s, %(reason)s, %(hint)s)

-- name: worker_heartbeat
select flowlane.heartbeat(%(worker_id)s::uuid) as deprecated

-- name: worker_mark_stopped
select flowlane.mark_worker_stopped(%(worker_id)s::uuid)

-- name: worker_requeue_stalled
select flowlane.requeue_stalled_tasks() as requeued

-- name: worker_trace_parents
select run_id, trace_parent from flowlane.trace_parents(%(run_ids)s::uuid[])

-- name: client_start_origin
-- what the runs this transaction starts record as their origin (start_flow reads it)
select set_config('flowlane.origin', %(origin)s, true) as origin

-- name: client_trace_parent
-- the trace context the runs started next remember ('' for none): for the transaction
-- (local) or the session
select set_config('flowlane.traceparent', %(traceparent)s, %(local)s) as traceparent

-- name: maintenance_tick
-- {"fired": schedule runs started, "begun": delayed runs begun, "failed": runs past their deadline}
select flowlane.maintenance_tick() as done


-- name: worker_await_inserts
-- before waiting for a notification: the transactions inserting into the queue have ended
select flowlane.await_queue_inserts(%(queue_name)s, %(timeout_ms)s) as settled

-- name: worker_enable_notify
select flowlane.enable_queue_notify(%(queue_name)s) as installed

-- name: worker_extend_leases
select flowlane.extend_leases(%(worker_id)s::uuid, %(tasks)s::jsonb) as extended

-- name: worker_listen
listen {channel}

-- name: worker_read
select msg_id from pgmq.read(%(queue_name)s, %(vt)s, %(qty)s)

-- name: worker_read_with_poll
select msg_id
from pgmq.read_with_poll(%(queue_name)s, %(vt)s, %(qty)s, %(max_poll_seconds)s, %(poll_interval_ms)s)

-- name: worker_start_tasks
-- a claim commits without waiting for its WAL flush (this transaction only): lost in a crash,
-- its tasks are simply claimable again, and the result's commit, which does wait, makes the
-- claim durable first (WAL is flushed in order)
select c.outcome, c.flow_slug, c.step_slug, c.queue_name, c.run_id, c.task_index, c.input, c.flow_input,
       c.attempt, c.msg_id, case when c.outcome = 'claimed' then flowlane.run_deadline(c.run_id) end as deadline_at
from flowlane.start_tasks(%(queue_name)s, %(msg_ids)s::bigint[], %(worker_id)s::uuid, %(pairs)s::jsonb) c
where (select set_config('synchronous_commit', 'off', true)) = 'off'

-- name: worker_claim_tasks
-- (a claim commits without waiting for its WAL flush: see worker_start_tasks)
select c.outcome, c.flow_slug, c.step_slug, c.queue_name, c.run_id, c.task_index, c.input, c.flow_input,
       c.attempt, c.msg_id, case when c.outcome = 'claimed' then flowlane.run_deadline(c.run_id) end as deadline_at
from flowlane.claim_tasks(%(queue_name)s, %(qty)s, %(worker_id)s::uuid, %(pairs)s::jsonb) c
where (select set_config('synchronous_commit', 'off', true)) = 'off'

-- name: worker_complete_tasks
select run_id, step_slug, task_index, status, attempts_count, last_worker_id, error_message
from flowlane.complete_tasks(%(results)s::jsonb)

-- name: worker_fail_tasks
select run_id, step_slug, task_index, status, attempts_count, last_worker_id, error_message
from flowlane.fail_tasks(%(results)s::jsonb)

-- name: client_start_flow
-- start_at: a time, or a delay in seconds on the database's clock; existed: the start returned
-- an earlier run (its key's, its run id's, or the pending run of its debounce key), which
-- start_flow records in flowlane.found_run; debounced: the run waits for its key's starts to pause
select s.run_id, s.flow_slug, s.status, s.start_at,
       s.run_id::text is not distinct from current_setting('flowlane.found_run', true) as existed,
       s.debounce_key is not null and s.status = 'waiting' as debounced
from flowlane.start_flow(%(flow)s, %(input)s::jsonb, %(run_id)s::uuid,
                         coalesce(%(start_at)s::timestamptz, flowlane._now() + make_interval(secs => %(delay)s::float8)),
                         %(key)s::text, priority => %(priority)s::int) s

-- name: client_start_flows
select run_id from flowlane.start_flows(%(flow)s, %(inputs)s::jsonb[],
  coalesce(%(start_at)s::timestamptz, flowlane._now() + make_interval(secs => %(delay)s::float8)),
  priority => %(priority)s::int)

-- name: client_list_runs
-- newest first; a page ends with the run whose id is passed as %(before)s next time (what
-- its waiting runs wait for: run_waits, asked once for the page)
select r.run_id, r.flow_slug, r.status, r.remaining_steps, r.started_at, r.completed_at, r.failed_at,
       r.cancelled_at, r.start_at, r.hold_seq is not null as held
from flowlane.runs r
where (%(flows)s::text[] is null or r.flow_slug = any(%(flows)s::text[]))
  and (%(status)s::text is null or r.status = %(status)s::text)
  and (%(since)s::timestamptz is null or r.started_at >= %(since)s::timestamptz)
  and (%(parent)s::uuid is null or r.parent_run_id = %(parent)s::uuid)
  and (%(before)s::uuid is null or (r.started_at, r.run_id) < (
         select b.started_at, b.run_id from flowlane.runs b where b.run_id = %(before)s::uuid))
order by r.started_at desc, r.run_id desc
limit %(limit)s

-- name: run_waits
-- what each of the given runs waits for, one row per waiting thing: the one definition that
-- `flowlane runs`, `flowlane run` and the console's Runs and Run pages show. The run held
-- for its flow's concurrency or its delayed start, held tasks and tasks behind a queue's
-- limits (flowlane.run_holds); a wait step's signal (since when, and its timeout); a child
-- run of a step; a task started by a registered worker whose heartbeat is stale (or that
-- stopped), with the time stalled recovery hands it out again: its stall deadline, the later
-- of its claim and its last lease extension plus its step's stall_after
-- (flowlane.step_options and flowlane._stall_deadline). Times are UTC. step_slug and task_index are null for the run
-- itself; task_index is null for a whole step.
with given as (
  select r.run_id, r.flow_slug from flowlane.runs r
  where r.run_id = any (%(run_ids)s::uuid[]) and r.status in ('started', 'waiting')
), waits as (
  select h.run_id, h.step_slug, h.task_index, h.waiting_for, h.place
  from flowlane.run_holds(array(select g.run_id from given g)) h
  union all
  select ss.run_id, ss.step_slug, null,
         format('signal %%s since %%s UTC', ss.step_slug, to_char(ss.started_at at time zone 'UTC', 'YYYY-MM-DD HH24:MI:SS'))
         || coalesce(', times out at ' || to_char(w.expires_at at time zone 'UTC', 'YYYY-MM-DD HH24:MI:SS') || ' UTC', ''),
         null
  from given g
  join flowlane.steps s on s.flow_slug = g.flow_slug and s.step_type = 'wait'
  join flowlane.step_states ss on ss.run_id = g.run_id and ss.step_slug = s.step_slug and ss.status = 'started'
  left join flowlane.wait_deadlines w on w.run_id = ss.run_id and w.step_slug = ss.step_slug
  union all
  select c.parent_run_id, c.parent_step_slug, null,
         format('child run %%s (of step %%s)', c.run_id, c.parent_step_slug), null
  from flowlane.runs c
  where c.parent_run_id = any (array(select g.run_id from given g)) and c.status in ('started', 'waiting')
  union all
  select t.run_id, t.step_slug, t.task_index,
         format('task %%s[%%s] of stale worker %%s to be handed out again at %%s UTC',
                t.step_slug, t.task_index, left(t.last_worker_id::text, 8),
                to_char((greatest(t.started_at, t.lease_renewed_at) + make_interval(secs => o.stall_after))
                        at time zone 'UTC', 'YYYY-MM-DD HH24:MI:SS')),
         null
  from given g
  join flowlane.step_tasks t on t.run_id = g.run_id and t.status = 'started'
  join flowlane.step_options o on o.flow_slug = t.flow_slug and o.step_slug = t.step_slug
  join flowlane.workers k on k.worker_id = t.last_worker_id
  where not flowlane.worker_is_live(k)
)
select w.run_id::text as run_id, w.step_slug, w.task_index, w.waiting_for, w.place
from waits w
left join given g on g.run_id = w.run_id
left join flowlane.steps s on s.flow_slug = g.flow_slug and s.step_slug = w.step_slug
order by w.run_id, w.step_slug is not null, s.step_index, w.task_index nulls first, w.waiting_for

-- name: client_triggers
-- every trigger with the runs it started (in all, in the last day, the latest) and its refusals
select * from flowlane.trigger_activity()

-- name: client_webhook_activity
-- what each webhook did: the runs it started (in all, in the last day, the latest) and the
-- signals it sent (their payload's `by` is "webhook <name> delivery <id>")
with started as (
  select r.origin ->> 'webhook' as webhook_name, count(*) as runs,
         count(*) filter (where r.started_at > flowlane._now() - interval '1 day') as runs_last_day,
         max(r.started_at) as last_at
  from flowlane.runs r where r.origin ? 'webhook'
  group by 1
), signalled as (
  select split_part(g.payload ->> 'by', ' ', 2) as webhook_name, count(*) as signals,
         count(*) filter (where g.received_at > flowlane._now() - interval '1 day') as signals_last_day,
         max(g.received_at) as last_at
  from flowlane.signals g where jsonb_typeof(g.payload) = 'object' and g.payload ->> 'by' like 'webhook %% delivery %%'
  group by 1
)
select coalesce(s.webhook_name, g.webhook_name) as webhook_name,
       coalesce(s.runs, 0) as runs, coalesce(s.runs_last_day, 0) as runs_last_day,
       coalesce(g.signals, 0) as signals, coalesce(g.signals_last_day, 0) as signals_last_day,
       greatest(s.last_at, g.last_at) as last_at
from started s full join signalled g on g.webhook_name = s.webhook_name
order by coalesce(s.webhook_name, g.webhook_name) collate "C"

-- name: client_schedules
-- every schedule: its next firing (UTC and wall time in its zone), its last run, its pause
select s.schedule_name, s.flow_name, s.cron, s.every_seconds, s.timezone, s.overlap, s.catch_up,
       s.next_slot, (s.next_slot at time zone s.timezone)::text as next_local, s.last_slot,
       s.last_run_id, r.status as last_status, coalesce(o.paused, false) as paused,
       o.reason as paused_reason, o.changed_at as paused_at
from flowlane.schedules s
left join flowlane.runs r on r.run_id = s.last_run_id
left join flowlane.schedule_overrides o on o.schedule_name = s.schedule_name
order by s.schedule_name collate "C"

-- name: client_pause_schedule
select schedule_name, next_slot from flowlane.set_schedule_paused(%(name)s, %(paused)s, %(reason)s)

-- name: client_trigger_schedule
select run_id, flow_slug from flowlane.trigger_schedule(%(name)s, %(input)s::jsonb)

-- name: client_run_exists
select exists (select 1 from flowlane.runs r where r.run_id = %(run_id)s::uuid) as found

-- name: client_runs_by_prefix
-- the run ids that start with a prefix: those between its lowest and its highest UUID (a range
-- of the primary key), a few of them (one is the answer; more name an ambiguous prefix)
select r.run_id, r.flow_slug, r.status, r.started_at
from flowlane.runs r
where r.run_id between %(low)s::uuid and %(high)s::uuid
order by r.run_id
limit %(limit)s

-- name: client_flow_filter
-- every version an alias points or pointed at, else a concrete flow (an alias comes first,
-- as in resolve_flow: it may have adopted the name of a flow it lists); all names otherwise
select coalesce(
         (select array_agg(distinct v.flow_slug order by v.flow_slug)
          from (select a.flow_slug from flowlane.aliases a where a.alias = %(flow)s
                union all
                select unnest(a.draining) from flowlane.aliases a where a.alias = %(flow)s
                union all
                select h.flow_slug from flowlane.alias_history h where h.alias = %(flow)s) v),
         (select array[f.flow_slug] from flowlane.flows f where f.flow_slug = %(flow)s)
       ) as flows,
       array(select f.flow_slug from flowlane.flows f
             union select a.alias from flowlane.aliases a order by 1) as known

-- name: client_listen_finished
-- notified by the SQL Core with the run id when a run ends, while a session listens
-- this way (0024)
select flowlane.listen_run_finished()

-- name: client_unlisten_finished
select flowlane.unlisten_run_finished()

-- name: client_cancel_run
select * from flowlane.cancel_run(%(run_id)s::uuid, %(reason)s)

-- name: client_retry_run
select * from flowlane.retry_run(%(run_id)s::uuid)

-- name: client_retry_compensation
select * from flowlane.retry_compensation(%(run_id)s::uuid)

-- name: client_retry_run_from
select * from flowlane.retry_run_from(%(run_id)s::uuid, %(step_slug)s)
-- name: client_stuck_runs
select run_id, flow_slug, started_at, reason from flowlane.stuck_runs()

-- name: client_get_run
select flowlane.get_run_with_states(%(run_id)s::uuid)
       || jsonb_build_object('attempts', flowlane.get_run_attempts(%(run_id)s::uuid),
                             'waits', flowlane.get_run_waits(%(run_id)s::uuid))
       || flowlane.get_run_family(%(run_id)s::uuid) as run

-- name: client_signal
select run_id, step_slug, payload, received_at, applied_at
from flowlane.signal(%(run_id)s::uuid, %(step)s, %(payload)s::jsonb)

-- name: listen_definitions
-- every change of flows, steps, aliases, queues or deployments (migration 0015)
listen flowlane_definitions

-- name: definitions_fingerprint
-- changes whenever flowlane_definitions is notified: polled where a LISTEN cannot work
select flowlane.definitions_fingerprint() as fingerprint

-- name: client_now
select flowlane._now() as now

-- name: client_matching_runs
-- the runs a bulk retry or cancel takes (`flowlane retry|cancel` with a filter), oldest first,
-- a page after the (started_at, run_id) given: of the given flows, in one of the given
-- states, failed in a step, with an error type in the failed attempts of their last round (of
-- that step, when one is given: console_failures groups by both) or a text in their error,
-- started in a time range
select r.run_id, r.flow_slug, r.status, r.started_at, left(r.error_message, 200) as error_message
from flowlane.runs r
where r.status = any (%(statuses)s::text[])
  and (%(flows)s::text[] is null or r.flow_slug = any (%(flows)s::text[]))
  and (%(since)s::timestamptz is null or r.started_at >= %(since)s::timestamptz)
  and (%(until)s::timestamptz is null or r.started_at < %(until)s::timestamptz)
  and (%(step)s::text is null or exists (
         select 1 from flowlane.step_states ss
         where ss.run_id = r.run_id and ss.step_slug = %(step)s::text and ss.status = 'failed'))
  and (%(error_type)s::text is null or exists (
         select 1 from flowlane.task_attempts a
         where a.run_id = r.run_id and a.retry_round = r.retry_count and a.outcome = 'failed'
           and a.error_type = %(error_type)s::text
           and (%(step)s::text is null or a.step_slug = %(step)s::text)))
  and (%(error)s::text is null or strpos(lower(r.error_message), lower(%(error)s::text)) > 0)
  and (%(after_at)s::timestamptz is null or (r.started_at, r.run_id) > (%(after_at)s::timestamptz, %(after_id)s::uuid))
order by r.started_at, r.run_id
limit %(limit)s

-- name: client_retry_runs
select run_id from flowlane.retry_runs(%(run_ids)s::uuid[]) as x (run_id)

-- name: client_cancel_runs
select run_id from flowlane.cancel_runs(%(run_ids)s::uuid[], %(reason)s) as x (run_id)
