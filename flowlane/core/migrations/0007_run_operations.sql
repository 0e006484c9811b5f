-- flowlane SQL Core 0007: run operations and visible failures.
--
-- 1. Attempt history: every failed attempt of a task keeps its error type,
--    message and a bounded traceback in flowlane.task_attempts (not only the
--    latest error on the task row). Recorded by a row trigger on step_tasks,
--    so fail_task, complete_task's type check and stalled recovery all record
--    without being redefined. The worker passes the error type and traceback
--    through fail_task_detailed (transaction-local settings read by the trigger).
-- 2. when_exhausted: skip / skip-cascade keep the error that caused the skip
--    on the skipped step (step_states.error_message).
-- 3. Runs can be cancelled (status 'cancelled', cancel_run) and a failed run
--    can be retried (retry_run): its failed steps start over with a fresh
--    attempt budget while completed steps keep their outputs.
-- 4. A run that ends (completed, failed, cancelled) notifies channel
--    flowlane_run_finished with its run id, so clients wait without polling.
--
-- No existing function is redefined.

-- ---------------------------------------------------------------------------
-- runs: cancelled status, retry counter
-- ---------------------------------------------------------------------------

alter table flowlane.runs drop constraint runs_status_valid;
alter table flowlane.runs
  add constraint runs_status_valid check (status in ('started', 'completed', 'failed', 'cancelled'));
alter table flowlane.runs
  add column cancelled_at timestamptz,
  add column cancel_reason text,
  add column retry_count int not null default 0,
  add column retried_at timestamptz;
alter table flowlane.runs
  add constraint runs_cancelled_at check ((status = 'cancelled') = (cancelled_at is not null)),
  add constraint runs_cancelled_after_start check (cancelled_at is null or cancelled_at >= started_at),
  add constraint runs_cancel_reason_only_cancelled check (cancel_reason is null or status = 'cancelled'),
  add constraint runs_retry_count_nonnegative check (retry_count >= 0);

-- paging through runs: newest first
create index runs_started_idx on flowlane.runs (started_at desc, run_id);

-- ---------------------------------------------------------------------------
-- attempt history
-- ---------------------------------------------------------------------------

create table flowlane.task_attempts (
  id bigint generated always as identity primary key,
  run_id uuid not null references flowlane.runs (run_id) on delete cascade,
  step_slug text not null,
  task_index int not null,
  attempt int not null,
  retry_round int not null default 0,
  outcome text not null,
  worker_id uuid,
  error_type text,
  error_message text,
  traceback text,
  failed_at timestamptz not null default now(),
  constraint task_attempts_outcome_valid check (outcome in ('retry', 'failed', 'stalled')),
  constraint task_attempts_attempt_positive check (attempt >= 1),
  constraint task_attempts_bounded check (
    length(error_message) <= 4000 and length(traceback) <= 16000 and length(error_type) <= 200)
);
create index task_attempts_task_idx on flowlane.task_attempts (run_id, step_slug, task_index, id);

-- a started task left 'started' for queued/failed: one attempt ended without a result
create function flowlane._record_attempt() returns trigger
language plpgsql volatile
set search_path = ''
as $$
declare
  v_stalled boolean := new.requeued_count > old.requeued_count;
  v_message text := new.error_message;
begin
  if v_stalled and new.error_message is not distinct from old.error_message then
    v_message := format('no result within %s s: the task was requeued by stalled recovery',
                        flowlane._effective_timeout(new.flow_slug, new.step_slug) + 30);
  end if;
  insert into flowlane.task_attempts
    (run_id, step_slug, task_index, attempt, retry_round, outcome, worker_id, error_type, error_message, traceback)
  select new.run_id, new.step_slug, new.task_index, greatest(old.attempts_count, 1), r.retry_count,
         case when v_stalled then 'stalled' when new.status = 'failed' then 'failed' else 'retry' end,
         old.last_worker_id,
         case when v_stalled then 'Stalled'
              else left(nullif(current_setting('flowlane.attempt_error_type', true), ''), 200) end,
         left(v_message, 4000),
         case when v_stalled then null
              else left(nullif(current_setting('flowlane.attempt_traceback', true), ''), 16000) end
  from flowlane.runs r where r.run_id = new.run_id;
  return null;
end;
$$;

create trigger step_tasks_attempt_history
  after update of status on flowlane.step_tasks
  for each row
  when (old.status = 'started' and new.status in ('queued', 'failed'))
  execute function flowlane._record_attempt();

-- fail_task plus the error's type and traceback for the attempt history
create function flowlane.fail_task_detailed(
  run_id uuid, step_slug text, task_index int, error_message text,
  worker_id uuid = null, attempt int = null, error_type text = null, traceback text = null
) returns setof flowlane.step_tasks
language plpgsql volatile
set search_path = ''
as $$
begin
  perform set_config('flowlane.attempt_error_type', coalesce(error_type, ''), true),
          set_config('flowlane.attempt_traceback', coalesce(traceback, ''), true);
  return query select * from flowlane.fail_task(fail_task_detailed.run_id, fail_task_detailed.step_slug,
                                                fail_task_detailed.task_index, fail_task_detailed.error_message,
                                                fail_task_detailed.worker_id, fail_task_detailed.attempt);
  perform set_config('flowlane.attempt_error_type', '', true),
          set_config('flowlane.attempt_traceback', '', true);
end;
$$;

-- a step skipped because its handler failed keeps that failure's message
create function flowlane._keep_skip_error() returns trigger
language plpgsql volatile
set search_path = ''
as $$
begin
  select t.error_message into new.error_message
  from flowlane.step_tasks t
  where t.run_id = new.run_id and t.step_slug = new.step_slug and t.status = 'failed'
  order by t.failed_at desc, t.task_index
  limit 1;
  return new;
end;
$$;

create trigger step_states_keep_skip_error
  before update of status on flowlane.step_states
  for each row
  when (new.status = 'skipped' and new.skip_reason = 'handler_failed')
  execute function flowlane._keep_skip_error();

-- ---------------------------------------------------------------------------
-- run finished notifications
-- ---------------------------------------------------------------------------

create function flowlane._notify_run_finished() returns trigger
language plpgsql volatile
set search_path = ''
as $$
begin
  perform pg_notify('flowlane_run_finished', new.run_id::text);
  return null;
end;
$$;

create trigger runs_notify_finished
  after update of status on flowlane.runs
  for each row
  when (old.status = 'started' and new.status <> 'started')
  execute function flowlane._notify_run_finished();

-- ---------------------------------------------------------------------------
-- cancel and retry
-- ---------------------------------------------------------------------------

-- cancel a started run: its unfinished tasks are cancelled and their messages
-- archived; later completions of those tasks are rejected (they are
-- terminal) and no further step starts. Cancelling a cancelled run returns it.
create function flowlane.cancel_run(run_id uuid, reason text = null) returns flowlane.runs
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
  return v_run;
end;
$$;

-- resume a failed run: failed steps (and steps whose tasks were cancelled
-- when the run failed) start over with a fresh attempt budget; completed
-- steps and completed map tasks keep their outputs. A failed step that never
-- had tasks (a when_unmet = fail condition) is evaluated again.
create function flowlane.retry_run(run_id uuid) returns flowlane.runs
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
     and ss.status in ('failed', 'started') and t.status in ('failed', 'cancelled');
  update flowlane.step_states ss
     set status = 'started', failed_at = null, error_message = null,
         started_at = coalesce(ss.started_at, now()),
         remaining_tasks = ss.initial_tasks - (select count(*) from flowlane.step_tasks t
                                               where t.run_id = ss.run_id and t.step_slug = ss.step_slug
                                                 and t.status = 'completed')
   where ss.run_id = v_run.run_id and ss.status in ('failed', 'started');
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

-- the attempt history of a run, oldest first (for `flowlane run` and Client.get_run)
create function flowlane.get_run_attempts(run_id uuid) returns jsonb
language sql stable
set search_path = ''
as $$
  select coalesce(jsonb_agg(to_jsonb(a) - 'id' order by a.id), '[]'::jsonb)
  from flowlane.task_attempts a
  where a.run_id = get_run_attempts.run_id
$$;
