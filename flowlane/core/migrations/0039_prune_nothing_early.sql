-- flowlane SQL Core 0039: a prune that finds nothing to delete returns at once.
-- Every worker's maintenance tick calls prune_runs each second, and almost every call finds no
-- run past its retention; it still ran its five deletes (and their tables' statement
-- triggers) over an empty batch.

-- one batch: at most p_batch prunable runs (a run locked by a retry or a cancel right now is
-- left for a later batch) and everything they own; returns what it deleted
create or replace function flowlane.prune_runs(
  p_now timestamptz = now(), p_flows text[] = null, p_older_than int = null, p_batch int = 500
) returns table (runs_deleted int, steps_deleted int, tasks_deleted int, attempts_deleted int,
                 messages_deleted int)
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_runs uuid[];
  v_group record;
begin
  perform flowlane._check_prune_args(p_now, p_older_than, p_batch);
  v_runs := array(
    select r.run_id from flowlane.runs r
    where r.run_id = any (array(select p.run_id from flowlane._prunable_runs(p_now, p_flows, p_older_than, p_batch) p))
      and r.status <> 'started'
    order by r.run_id
    for update skip locked);
  messages_deleted := 0;
  if cardinality(v_runs) = 0 then  -- most ticks: five empty deletes cost more than the lookup
    runs_deleted := 0; steps_deleted := 0; tasks_deleted := 0; attempts_deleted := 0;
    return next;
    return;
  end if;
  for v_group in
    select t.queue_name, array_agg(t.message_id order by t.message_id) as ids
    from flowlane.step_tasks t
    where t.run_id = any (v_runs)
    group by t.queue_name
    order by t.queue_name
  loop
    messages_deleted := messages_deleted + flowlane._delete_messages(v_group.queue_name, v_group.ids);
  end loop;
  delete from flowlane.task_attempts a where a.run_id = any (v_runs);
  get diagnostics attempts_deleted = row_count;
  delete from flowlane.task_leases l where l.run_id = any (v_runs);
  delete from flowlane.step_tasks t where t.run_id = any (v_runs);
  get diagnostics tasks_deleted = row_count;
  delete from flowlane.step_states ss where ss.run_id = any (v_runs);
  get diagnostics steps_deleted = row_count;
  delete from flowlane.runs r where r.run_id = any (v_runs);
  get diagnostics runs_deleted = row_count;
  return next;
end;
$$;
