-- What a metrics scrape reads from the database, in one statement: per queue its depth and
-- oldest message's age (pgmq.metrics), its live workers and its disabled deployments.

-- (p_stale_after is no longer read: it is kept for the previous release's callers; liveness
-- is flowlane.worker_is_live)
create function flowlane.queue_metrics(p_stale_after int = 30)
returns table (queue_name text, depth bigint, oldest_age_seconds int, live_workers bigint,
               disabled_deployments bigint)
language sql stable
set search_path = ''
as $$
  select q.queue_name, m.queue_length, coalesce(m.oldest_msg_age_sec, 0),
         (select count(*) from flowlane.workers w
          where w.queue_name = q.queue_name and flowlane.worker_is_live(w)),
         (select count(*) from flowlane.worker_deployments d
          where d.queue_name = q.queue_name and not d.enabled)
  from flowlane.queues q
  cross join lateral pgmq.metrics(q.pgmq_queue_name) m
  order by q.queue_name
$$;

-- every PGMQ queue's counts, registered in flowlane or not (the console lists both): the roles
-- that read them get the counts through the owner, not the queues' messages
create function flowlane.pgmq_metrics() returns setof pgmq.metrics_result
language sql stable
set search_path = ''
as $$
  select * from pgmq.metrics_all()
$$;
