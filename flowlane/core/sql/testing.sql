-- The queries of flowlane's pytest plugin (flowlane/testing), on its test databases.

-- name: testing_busy
select b.queue_name, b.line from flowlane_testing.busy() b

-- name: testing_tick
select flowlane.maintenance_tick() as done

-- name: testing_now
select flowlane._now() as now

-- name: testing_advance
select flowlane_testing.advance(%(seconds)s::float8) as now

-- name: testing_runs
-- every run (of a flow or alias when named), in the order they started
select r.run_id::text as run_id from flowlane.runs r
where %(flow)s::text is null or r.called_as = %(flow)s or r.flow_slug = %(flow)s
order by r.started_at, r.run_id
