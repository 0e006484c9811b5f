-- 0010: autovacuum settings for the tables every task churns (benchmarks/bloat.py, figures in
-- benchmarks/RESULTS.md, "bloat.py"; docs/reliability.md, "Storage").
--
-- PGMQ queue tables are tiny but every message is inserted, updated by each read and claim,
-- and deleted by its archive: with the default threshold (50 + 20 % of live rows) their dead
-- rows are the bulk of the table between autovacuum visits. A fixed threshold and no cost delay
-- make each visit cheap and complete. The engine tables grow with history: 2 % instead of 20 %
-- keeps their dead rows proportional to the recent work rather than to all history.
-- fillfactor is left to 0009, which sets it on the same tables.

alter table flowlane.step_tasks set (
  autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);
alter table flowlane.step_states set (
  autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);
alter table flowlane.runs set (
  autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);

create function flowlane._tune_queue_table(p_queue text)
returns void
language plpgsql
security definer
set search_path = ''
as $$
begin
  if to_regclass(format('pgmq.%I', 'q_' || p_queue)) is not null then
    execute format('alter table pgmq.%I set (autovacuum_vacuum_scale_factor = 0, '
                   'autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_cost_delay = 0)',
                   'q_' || p_queue);
  end if;
exception when insufficient_privilege then
  null;  -- an adopted queue owned by another role keeps its owner's settings
end;
$$;

create function flowlane._tune_registered_queue()
returns trigger
language plpgsql
security definer
set search_path = ''
as $$
begin
  perform flowlane._tune_queue_table(coalesce(new.pgmq_queue_name, new.queue_name));
  return null;
end;
$$;

-- deferred: add_step registers the queue before pgmq.create makes its table
create constraint trigger tune_registered_queue
after insert on flowlane.queues
deferrable initially deferred
for each row execute function flowlane._tune_registered_queue();

select flowlane._tune_queue_table(coalesce(q.pgmq_queue_name, q.queue_name))
from flowlane.queues q
order by q.queue_name;
