-- flowlane SQL Core 0015: a run that ends leaves no step waiting or running, and
-- definition changes are announced.
-- Drafted by `python -m flowlane.core.draft_migration` from the engine source; reviewed by a person.
--
-- A cancelled or failed run ends its unfinished steps: 'cancelled' with an end time
-- (started_at says whether the step had begun); retry_run reopens them. Every change of
-- flows, steps, dependencies, aliases, queues and deployments notifies the channel
-- flowlane_definitions, which workers and `flowlane serve` listen on.

alter table flowlane.step_states
  add column cancelled_at timestamptz,
  drop constraint step_states_status_valid,
  add constraint step_states_status_valid
    check (status in ('created', 'started', 'completed', 'failed', 'skipped', 'cancelled')),
  add constraint step_states_cancelled_at check ((status = 'cancelled') = (cancelled_at is not null)),
  add constraint step_states_cancelled_after_created
    check ((cancelled_at is null) or (cancelled_at >= coalesce(started_at, created_at)));

-- runs that ended before this migration: their unfinished steps end as they would now
update flowlane.step_states ss
   set status = 'cancelled', cancelled_at = greatest(coalesce(r.cancelled_at, r.failed_at), coalesce(ss.started_at, ss.created_at))
  from flowlane.runs r
 where r.run_id = ss.run_id and r.status in ('cancelled', 'failed') and ss.status in ('created', 'started');

-- Definition changes are announced: every row change of flows, steps,
-- dependencies, aliases or queues (and a worker deployment's existence or enabled
-- flag, 09_fleet.sql) notifies the channel flowlane_definitions with the table's
-- name, delivered when its transaction commits, once per table and transaction
-- (PostgreSQL folds repeats). Workers re-check their coverage when notified and
-- `flowlane serve` derives its set of workers again. Nothing here changes a definition.
create or replace function flowlane._notify_definitions_changed()
returns trigger
language plpgsql
set search_path = ''
as $$
begin
  perform pg_notify('flowlane_definitions', tg_table_name);
  return null;
end;
$$;

-- run failed: cancel its unfinished tasks and archive their messages; its
-- unfinished steps end with it
create or replace function flowlane._fail_run(p_run_id uuid, p_error text) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_tasks flowlane.step_tasks[];
begin
  update flowlane.runs r set status = 'failed', failed_at = now(), error_message = p_error
   where r.run_id = p_run_id and r.status = 'started';
  with cancelled as (
    update flowlane.step_tasks t set status = 'cancelled', cancelled_at = now()
     where t.run_id = p_run_id and t.status in ('queued', 'started')
    returning t
  ) select coalesce(array_agg(c.t), '{}') into v_tasks from cancelled c;
  perform flowlane._archive_tasks(v_tasks);
  perform flowlane._end_unfinished_steps(p_run_id);
end;
$$;

-- a run that ends before its steps do leaves no step waiting or running: each
-- becomes 'cancelled' with an end time, and started_at says whether it had
-- begun (a step that never started never will, unless retry_run reopens it)
create or replace function flowlane._end_unfinished_steps(p_run_id uuid) returns void
language sql volatile
set search_path = ''
as $$
  update flowlane.step_states ss
     set status = 'cancelled', cancelled_at = greatest(now(), coalesce(ss.started_at, ss.created_at))
   where ss.run_id = p_run_id and ss.status in ('created', 'started');
$$;

-- cancel a started run: its unfinished tasks and steps are cancelled and the
-- tasks' messages archived; later completions of those tasks are rejected (they are
-- terminal) and no further step starts. Cancelling a cancelled run returns it.
create or replace function flowlane.cancel_run(run_id uuid, reason text = null) returns flowlane.runs
language plpgsql volatile
set search_path = ''
as $$
declare
  v_run flowlane.runs;
  v_tasks flowlane.step_tasks[];
begin
  select * into v_run from flowlane.runs r where r.run_id = cancel_run.run_id for update;
  if not found then
    raise exception 'no run %', cancel_run.run_id using errcode = 'P0002';
  end if;
  if v_run.status = 'cancelled' then
    return v_run;
  end if;
  if v_run.status <> 'started' then
    raise exception 'run % is already %: only a started run can be cancelled', v_run.run_id, v_run.status
      using errcode = '55000';
  end if;
  update flowlane.runs r
     set status = 'cancelled', cancelled_at = greatest(now(), r.started_at),
         cancel_reason = left(coalesce(nullif(btrim(reason), ''), 'cancelled'), 1000)
   where r.run_id = v_run.run_id
  returning * into v_run;
  with cancelled as (
    update flowlane.step_tasks t set status = 'cancelled', cancelled_at = greatest(now(), t.queued_at)
     where t.run_id = v_run.run_id and t.status in ('queued', 'started')
    returning t
  ) select coalesce(array_agg(c.t), '{}') into v_tasks from cancelled c;
  perform flowlane._archive_tasks(v_tasks);
  perform flowlane._end_unfinished_steps(v_run.run_id);
  return v_run;
end;
$$;

-- resume a failed run: failed steps (and steps the failure ended after they
-- started) start over with a fresh attempt budget; completed
-- steps and completed map tasks keep their outputs. A failed step that never
-- had tasks (a when_unmet = fail condition) is evaluated again, and steps the
-- failure ended before they began wait for their needs again.
create or replace function flowlane.retry_run(run_id uuid) returns flowlane.runs
language plpgsql volatile
set search_path = ''
as $$
declare
  v_run flowlane.runs;
  v_group record;
  v_ids bigint[];
begin
  select * into v_run from flowlane.runs r where r.run_id = retry_run.run_id for update;
  if not found then
    raise exception 'no run %', retry_run.run_id using errcode = 'P0002';
  end if;
  if v_run.status <> 'failed' then
    raise exception 'run % is %: only a failed run can be retried', v_run.run_id, v_run.status
      using errcode = '55000';
  end if;
  perform 1 from flowlane.step_states ss where ss.run_id = v_run.run_id order by ss.step_slug for update;

  -- steps the failure ended before they began wait for their needs again
  update flowlane.step_states ss
     set status = 'created', cancelled_at = null
   where ss.run_id = v_run.run_id and ss.status = 'cancelled' and ss.started_at is null;

  update flowlane.step_states ss
     set status = 'created', failed_at = null, error_message = null, remaining_tasks = null
   where ss.run_id = v_run.run_id and ss.status = 'failed'
     and not exists (select 1 from flowlane.step_tasks t
                     where t.run_id = ss.run_id and t.step_slug = ss.step_slug);
  -- unfinished tasks are replaced by fresh ones (a message id is an immutable identity);
  -- their attempts stay in flowlane.task_attempts
  delete from flowlane.step_tasks t
   using flowlane.step_states ss
   where t.run_id = v_run.run_id and ss.run_id = t.run_id and ss.step_slug = t.step_slug
     and ss.status in ('failed', 'started', 'cancelled') and t.status in ('failed', 'cancelled');
  update flowlane.step_states ss
     set status = 'started', failed_at = null, cancelled_at = null, error_message = null,
         started_at = coalesce(ss.started_at, now()),
         remaining_tasks = ss.initial_tasks - (select count(*) from flowlane.step_tasks t
                                               where t.run_id = ss.run_id and t.step_slug = ss.step_slug
                                                 and t.status = 'completed')
   where ss.run_id = v_run.run_id and ss.status in ('failed', 'started', 'cancelled');
  update flowlane.runs r
     set status = 'started', failed_at = null, error_message = null,
         retry_count = r.retry_count + 1, retried_at = now()
   where r.run_id = v_run.run_id;

  -- one send_batch per queue, tasks in step order
  for v_group in
    select s.queue_name,
           array_agg(ss.step_slug order by s.step_index, k) as slugs,
           array_agg(k order by s.step_index, k) as indexes
    from flowlane.step_states ss
    join flowlane.steps s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
    cross join lateral generate_series(0, ss.initial_tasks - 1) as k
    where ss.run_id = v_run.run_id and ss.status = 'started'
      and not exists (select 1 from flowlane.step_tasks t
                      where t.run_id = ss.run_id and t.step_slug = ss.step_slug and t.task_index = k)
    group by s.queue_name
    order by s.queue_name
  loop
    select array_agg(m.id order by m.ord) into v_ids
    from pgmq.send_batch(v_group.queue_name,
           array(select jsonb_build_object('flow_slug', v_run.flow_slug, 'run_id', v_run.run_id,
                                           'step_slug', v_group.slugs[j], 'task_index', v_group.indexes[j])
                 from generate_subscripts(v_group.slugs, 1) as j order by j),
           0) with ordinality as m(id, ord);
    insert into flowlane.step_tasks (flow_slug, run_id, step_slug, task_index, queue_name, message_id)
    select v_run.flow_slug, v_run.run_id, v_group.slugs[j], v_group.indexes[j], v_group.queue_name, v_ids[j]
    from generate_subscripts(v_group.slugs, 1) as j;
  end loop;
  perform flowlane._progress(v_run.run_id);
  select * into v_run from flowlane.runs r where r.run_id = v_run.run_id;
  return v_run;
end;
$$;

create trigger flows_notify_changed
after insert or update or delete on flowlane.flows
for each row execute function flowlane._notify_definitions_changed();

create trigger steps_notify_changed
after insert or update or delete on flowlane.steps
for each row execute function flowlane._notify_definitions_changed();

create trigger deps_notify_changed
after insert or update or delete on flowlane.deps
for each row execute function flowlane._notify_definitions_changed();

create trigger aliases_notify_changed
after insert or update or delete on flowlane.aliases
for each row execute function flowlane._notify_definitions_changed();

create trigger queues_notify_changed
after insert or update or delete on flowlane.queues
for each row execute function flowlane._notify_definitions_changed();

create trigger worker_deployments_notify_added
after insert or delete on flowlane.worker_deployments
for each row execute function flowlane._notify_definitions_changed();

create trigger worker_deployments_notify_enabled
after update of enabled on flowlane.worker_deployments
for each row when (old.enabled is distinct from new.enabled)
execute function flowlane._notify_definitions_changed();
