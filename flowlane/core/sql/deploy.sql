-- name: deploy_schema_ready
select to_regclass('flowlane.aliases') is not null
   and to_regprocedure('flowlane.verify_flow(text, jsonb)') is not null

-- name: deploy_flows
select f.flow_slug, f.opt_max_attempts, f.opt_base_delay, f.opt_timeout, f.opt_retention,
       f.opt_deadline, f.opt_dedup_key, f.opt_concurrency_limit, f.opt_concurrency_key, f.opt_priority,
       f.opt_concurrency_when_full, f.opt_debounce_key, f.opt_debounce_period, f.opt_debounce_max_wait,
       f.opt_on_failure, f.opt_on_failure_on_cancel
from flowlane.flows f
order by f.flow_slug collate "C"

-- name: deploy_existing_flows
select f.flow_slug from flowlane.flows f where f.flow_slug = any (%(slugs)s::text[])

-- name: deploy_shape_differences
-- the words of the worker's startup check (verify_flow) for every given {slug: shape}, and
-- the stored shape (to name the steps added, removed or moved by slug)
select given.key as flow_slug,
       flowlane.verify_flow(given.key, given.value) -> 'differences' as differences,
       flowlane.get_flow_shape(given.key) as stored_shape
from jsonb_each(%(shapes)s::jsonb) given

-- name: deploy_steps
select s.flow_slug, s.step_slug, s.opt_max_attempts, s.opt_base_delay, s.opt_timeout,
       s.opt_start_delay, s.opt_concurrency_limit, s.opt_concurrency_key, s.opt_compensate,
       s.opt_cache_ttl, s.opt_cache_key, s.opt_cache_fingerprint
from flowlane.steps s
order by s.flow_slug collate "C", s.step_index

-- name: deploy_aliases
select a.alias, a.flow_slug, a.draining
from flowlane.aliases a
order by a.alias collate "C"

-- name: deploy_schedules
select s.schedule_name, s.flow_name, s.cron, s.every_seconds, s.timezone, s.input, s.overlap,
       s.catch_up, coalesce(o.paused, false) as paused, o.reason as paused_reason
from flowlane.schedules s
left join flowlane.schedule_overrides o on o.schedule_name = s.schedule_name
order by s.schedule_name collate "C"

-- name: deploy_triggers
select t.trigger_name, t.flow_name, t.table_name, t.events, t.when_pattern, t.unless_pattern, t.input_map,
       t.key_pointer, t.on_refused
from flowlane.triggers t
order by t.trigger_name collate "C"

-- name: deploy_queue_limits
-- the queues a queues file set something on: limits, or the archive turned off
select q.queue_name, l.concurrency, l.rate_limit, l.rate_per, q.archive_messages as archive
from flowlane.queues q
left join flowlane.queue_limits l on l.queue_name = q.queue_name
where l.queue_name is not null or not q.archive_messages
order by q.queue_name collate "C"

-- name: deploy_lock
select pg_advisory_xact_lock(hashtext('flowlane.apply'))

-- name: deploy_lock_timeout
set local lock_timeout = '10s'
