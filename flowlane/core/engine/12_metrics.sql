-- What a metrics scrape reads from the database, in one statement: per queue its depth and
-- oldest message's age (pgmq.metrics), its live workers and its disabled deployments.

create function flowlane.queue_metrics(p_stale_after int = 30)
returns table (queue_name text, depth bigint, oldest_age_seconds int, live_workers bigint,
               disabled_deployments bigint)
language sql stable
set search_path = ''
as $$
  select q.queue_name, m.queue_length, coalesce(m.oldest_msg_age_sec, 0),
         (select count(*) from flowlane.workers w
          where w.queue_name = q.queue_name and w.stopped_at is null
            and w.last_heartbeat_at > flowlane._now() - make_interval(secs => p_stale_after)),
         (select count(*) from flowlane.worker_deployments d
          where d.queue_name = q.queue_name and not d.enabled)
  from flowlane.queues q
  cross join lateral pgmq.metrics(q.pgmq_queue_name) m
  order by q.queue_name
$$;
