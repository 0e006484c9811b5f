-- Autoscaling: how much work a queue holds for its workers, read by KEDA's postgresql scaler
-- (the ScaledObjects `flowlane manifests kubernetes` writes) and by monitoring.

-- the messages of one queue that need a worker: visible now (waiting to be claimed) or read
-- and not yet archived (claimed, or waiting for a retry); a message sent with a start delay
-- counts once it is due. Two ranges of the queue table's vt index: the cost follows the
-- queue's own messages, never the history tables or the archive.
create function flowlane.queue_depth(p_queue text) returns bigint
language plpgsql stable
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_table text;
  v_depth bigint;
begin
  select 'q_' || q.pgmq_queue_name into v_table from flowlane.queues q
  where q.queue_name = lower(p_queue);
  if v_table is null then
    raise exception 'queue_depth: queue "%" is not registered with flowlane', p_queue
      using errcode = 'P0002', hint = 'the queues: `flowlane queue list`';
  end if;
  execute format('select (select count(*) from pgmq.%1$I where vt <= now())'
                 ' + (select count(*) from pgmq.%1$I where vt > now() and read_ct > 0)', v_table)
    into v_depth;
  return v_depth;
end;
$$;
