-- flowlane SQL Core 0014: each rule once.
-- Drafted by `python -m flowlane.core.draft_migration` from the engine source
-- (flowlane/core/engine); reviewed, and the view and the column defaults written by hand.
--
--   * a step's effective options (its own, else its flow's), the claim visibility (timeout
--     + 2 s) and the stall threshold (timeout + 30 s) were written out in claim_tasks,
--     _start_tasks, extend_leases, _fail_batch, _record_attempt, requeue_stalled_tasks and
--     _effective_timeout: they are the view flowlane.step_options now, which the planner
--     expands into each statement that joins it (the set-based statements keep their plans);
--     _effective_timeout goes, and _stall_deadline takes the stall threshold, not the timeout.
--   * a flow option's default (3 attempts, 5 s base delay, 60 s timeout) was written in
--     create_flow and in flowlane.flows' column defaults: both take it from
--     _flow_option_default now.

drop function flowlane._effective_timeout(text,text);

drop function flowlane._stall_deadline(flowlane.step_tasks,integer);

-- A step's options: its own where its definition sets them, else its flow's (see the engine
-- source for the rules it holds)
create view flowlane.step_options as
select o.flow_slug, o.step_slug, o.timeout, o.max_attempts, o.base_delay,
       o.timeout + 2 as claim_visibility,
       o.timeout + 30 as stall_after
from (select s.flow_slug, s.step_slug,
             coalesce(s.opt_timeout, f.opt_timeout) as timeout,
             coalesce(s.opt_max_attempts, f.opt_max_attempts) as max_attempts,
             coalesce(s.opt_base_delay, f.opt_base_delay) as base_delay
      from flowlane.steps s join flowlane.flows f on f.flow_slug = s.flow_slug) o;

-- a flow option's value when the flow's definition leaves it out: the column defaults of
-- flowlane.flows and create_flow take it from here, and a test holds it equal to the
-- compiler's defaults
create or replace function flowlane._flow_option_default(option text) returns int
language sql immutable parallel safe
set search_path = ''
as $$
  select case option when 'max_attempts' then 3 when 'base_delay' then 5 when 'timeout' then 60 end
$$;

-- two transactions applying the same flow file raced between the existence
-- check and the insert and one failed on flows_slug_ci_unique; the lock on
-- the lowercase slug makes the second wait and then find the first's rows
create or replace function flowlane.create_flow(
  flow_slug text,
  max_attempts int = null,
  base_delay int = null,
  timeout int = null,
  queue_mode text = 'flow'
) returns flowlane.flows
language plpgsql volatile
set search_path = ''
as $$
declare
  v_flow flowlane.flows;
  v_other text;
  v_mode text := coalesce(create_flow.queue_mode, 'flow');
begin
  perform flowlane._check_slug('flow', create_flow.flow_slug);
  if v_mode not in ('flow', 'per-step', 'explicit') then
    raise exception 'flow "%": queue_mode must be flow, per-step or explicit, not %',
      create_flow.flow_slug, quote_literal(v_mode) using errcode = '22023';
  end if;
  if v_mode = 'flow' and length(create_flow.flow_slug) > 47 then
    raise exception 'flow "%": with queue_mode flow the queue is the lowercase flow slug, which must have at most 47 characters (the PGMQ limit)',
      create_flow.flow_slug using errcode = '22023', hint = 'use a shorter slug, or per-step/explicit queues';
  end if;
  perform pg_advisory_xact_lock(hashtext('flowlane.flow'), hashtext(lower(create_flow.flow_slug)));
  select f.flow_slug into v_other from flowlane.flows f
  where lower(f.flow_slug) = lower(create_flow.flow_slug) and f.flow_slug <> create_flow.flow_slug;
  if found then
    raise exception 'flow slug "%" conflicts with existing flow "%" (flow slugs are unique case-insensitively)',
      create_flow.flow_slug, v_other using errcode = '23505';
  end if;
  select * into v_flow from flowlane.flows f where f.flow_slug = create_flow.flow_slug for update;
  if found and v_flow.queue_mode <> v_mode then
    raise exception 'FLOWLANE_SHAPE_MISMATCH: flow "%" exists with queue_mode %, not %',
      create_flow.flow_slug, v_flow.queue_mode, v_mode
      using errcode = '23514',
            hint = 'the queue mode is part of the flow''s shape; create a new flow version (a new slug)';
  end if;
  insert into flowlane.flows as f (flow_slug, opt_max_attempts, opt_base_delay, opt_timeout, queue_mode)
  values (create_flow.flow_slug, coalesce(max_attempts, flowlane._flow_option_default('max_attempts')),
          coalesce(base_delay, flowlane._flow_option_default('base_delay')),
          coalesce(timeout, flowlane._flow_option_default('timeout')), v_mode)
  on conflict on constraint flows_pkey do update
    set opt_max_attempts = excluded.opt_max_attempts,
        opt_base_delay = excluded.opt_base_delay,
        opt_timeout = excluded.opt_timeout
  returning * into v_flow;
  return v_flow;
end;
$$;

create or replace function flowlane.claim_tasks(queue_name text, qty int, worker_id uuid, supported_pairs jsonb)
returns setof flowlane.claim_record
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_lease int;
  v_ids bigint[];
  v_later bigint[];
begin
  perform flowlane._check_queue_argument('claim_tasks', claim_tasks.queue_name);
  if qty is null or qty < 1 then
    raise exception 'claim_tasks: qty must be at least 1' using errcode = '22023';
  end if;
  select coalesce(max(o.claim_visibility), 0) into v_lease
  from flowlane._pairs(supported_pairs) p
  join flowlane.step_options o on o.flow_slug = p.flow_slug and o.step_slug = p.step_slug;
  select coalesce(array_agg(m.msg_id) filter (where m.enqueued_at <= now()), '{}'),
         coalesce(array_agg(m.msg_id) filter (where m.enqueued_at > now()), '{}')
    into v_ids, v_later
  from pgmq.read(claim_tasks.queue_name, v_lease, qty) m;
  if cardinality(v_later) > 0 then
    -- enqueued by a transaction that committed after this one began (the read takes a
    -- new snapshot): a claim now would start the task before it was queued. Visible
    -- again at once; the next poll, a new transaction, claims it.
    perform pgmq.set_vt(claim_tasks.queue_name, v_later, 0);
  end if;
  if cardinality(v_ids) = 0 then
    return;
  end if;
  return query
    with c as (
      select * from flowlane._start_tasks(claim_tasks.queue_name, v_ids, claim_tasks.worker_id, supported_pairs,
                                          v_lease)
    )
    select c.outcome, c.flow_slug, c.step_slug, c.queue_name, c.run_id, c.task_index, c.input,
           case when row_number() over (partition by c.run_id order by c.msg_id) = 1 then c.flow_input end,
           c.attempt, c.msg_id
    from c
    union all
    -- a refused batch: the other messages read, handed back visible with it (ids only)
    select 'handed_back', null, null, claim_tasks.queue_name, null, null, null, null, null, m.id
    from unnest(v_ids) as m (id)
    where exists (select 1 from c where c.outcome = 'unsupported')
      and not exists (select 1 from c where c.msg_id = m.id)
    order by 10;
end;
$$;

-- 0011's _start_tasks; the tasks to hide and to return are read from the unnested claim, the
-- leases looked up once per (flow, step), the inputs from _claimed_inputs
create or replace function flowlane._start_tasks(p_queue text, p_msg_ids bigint[], p_worker_id uuid, p_pairs jsonb,
                                      p_read_vt int)
returns setof flowlane.claim_record
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_ids bigint[];
  v_batch flowlane._claim_item[];
  v_duplicates flowlane.step_tasks[];
  v_claimed flowlane.step_tasks[];
  v_hide flowlane.step_tasks[];
  v_offsets int[];
  v_updated int;
begin
  perform flowlane._check_queue_argument('start_tasks', p_queue);
  if p_worker_id is null then
    raise exception 'start_tasks: worker_id is required (it fences the results of the claimed tasks)'
      using errcode = '22023';
  end if;
  if p_msg_ids is null or array_position(p_msg_ids, null) is not null then
    raise exception 'start_tasks: msg_ids must be an array of message ids without nulls' using errcode = '22023';
  end if;
  perform flowlane._pairs(p_pairs);  -- validates before anything is locked
  v_ids := array(select distinct m from unnest(p_msg_ids) m order by m);
  if cardinality(v_ids) = 0 then
    return;
  end if;

  -- lock order: runs (shared: claims do not block each other), then the batch's tasks
  perform 1 from flowlane.runs r
  where r.run_id in (select t.run_id from flowlane.step_tasks t
                     where t.queue_name = p_queue and t.message_id = any (v_ids))
  order by r.run_id
  for share;
  perform 1 from flowlane.step_tasks t
  where t.queue_name = p_queue and t.message_id = any (v_ids)
  order by t.run_id, t.step_slug, t.task_index
  for update;

  -- classify every message before any change
  select array_agg(row(b.msg_id, t, t.run_id is not null and p.flow_slug is not null,
                       t.status = 'queued' and r.status = 'started' and ss.status = 'started'
                   )::flowlane._claim_item order by b.msg_id)
    into v_batch
  from unnest(v_ids) as b (msg_id)
  left join flowlane.step_tasks t
    on t.queue_name = p_queue and t.message_id = b.msg_id and t.message_id = any (v_ids)
  left join flowlane._pairs(p_pairs) p on p.flow_slug = t.flow_slug and p.step_slug = t.step_slug
  left join flowlane.runs r on r.run_id = t.run_id
  left join flowlane.step_states ss on ss.run_id = t.run_id and ss.step_slug = t.step_slug;

  if exists (select 1 from unnest(v_batch) c where not c.supported) then
    perform pgmq.set_vt(p_queue, v_ids, 0);
    return query
      select 'unsupported', (c.task).flow_slug, (c.task).step_slug, p_queue, (c.task).run_id,
             (c.task).task_index, null::jsonb, null::jsonb, null::int, c.msg_id
      from unnest(v_batch) c where not c.supported order by c.msg_id;
    return;
  end if;

  -- terminal tasks: their message is archived (idempotent)
  if exists (select 1 from unnest(v_batch) c
             where (c.task).status in ('completed', 'failed', 'skipped', 'cancelled')) then
    perform pgmq.archive(p_queue, array(
      select c.msg_id from unnest(v_batch) c
      where (c.task).status in ('completed', 'failed', 'skipped', 'cancelled') order by c.msg_id));
  end if;
  -- still started (a visible duplicate): no attempt; hidden until stalled recovery may take it
  if exists (select 1 from unnest(v_batch) c where (c.task).status = 'started') then
    select array_agg(c.task order by c.msg_id),
           array_agg(greatest(1, ceil(extract(epoch from
                       flowlane._stall_deadline(c.task, o.stall_after) - clock_timestamp()))::int) order by c.msg_id)
      into v_duplicates, v_offsets
    from unnest(v_batch) c
    join flowlane.step_options o on o.flow_slug = (c.task).flow_slug and o.step_slug = (c.task).step_slug
    where (c.task).status = 'started';
    perform flowlane._set_tasks_vt(v_duplicates, v_offsets);
  end if;

  with claimed as (
    update flowlane.step_tasks t
       set status = 'started', attempts_count = t.attempts_count + 1, started_at = now(),
           last_worker_id = p_worker_id
      from unnest(v_batch) c
     where c.claimable and t.run_id = (c.task).run_id and t.step_slug = (c.task).step_slug
       and t.task_index = (c.task).task_index
    returning t
  ) select coalesce(array_agg(c.t order by (c.t).message_id), '{}') into v_claimed from claimed c;

  if cardinality(v_claimed) = 0 then
    return;
  end if;
  select coalesce(array_agg(c order by c.message_id), '{}'), coalesce(array_agg(l.lease order by c.message_id), '{}')
    into v_hide, v_offsets
  from unnest(v_claimed) c
  join (select o.flow_slug, o.step_slug, o.claim_visibility as lease
        from (select distinct x.flow_slug, x.step_slug from unnest(v_claimed) x) p
        join flowlane.step_options o on o.flow_slug = p.flow_slug and o.step_slug = p.step_slug) l
    on l.flow_slug = c.flow_slug and l.step_slug = c.step_slug
  where p_read_vt is null or l.lease > p_read_vt;
  if cardinality(v_hide) > 0 then
    v_updated := flowlane._set_tasks_vt(v_hide, v_offsets);
    if v_updated <> cardinality(v_hide) then
      raise exception 'claim aborted: % tasks claimed but % queue messages got their visibility extended',
        cardinality(v_hide), v_updated
        using errcode = '40001', hint = 'a task''s message is missing from its queue; the claim was rolled back';
    end if;
  end if;

  return query
    select 'claimed', c.flow_slug, c.step_slug, c.queue_name, c.run_id, c.task_index,
           i.input, i.flow_input, c.attempts_count, c.message_id
    from unnest(v_claimed) c
    join flowlane._claimed_inputs(v_claimed) i
      on i.run_id = c.run_id and i.step_slug = c.step_slug and i.task_index = c.task_index
    order by c.message_id;
end;
$$;

-- the stall deadline of a started task: its step's stall_after seconds (step_options) after
-- the later of its claim and its last lease extension
create or replace function flowlane._stall_deadline(p_task flowlane.step_tasks, p_stall_after int) returns timestamptz
language sql immutable
set search_path = ''
as $$
  select greatest(p_task.started_at, p_task.lease_renewed_at) + make_interval(secs => p_stall_after)
$$;

-- called by a worker for the tasks it holds: items {run_id, step_slug,
-- task_index, attempt, running}. A task still owned by this worker and
-- attempt gets lease_renewed_at = now() and its message hidden until the new
-- stall deadline. A running handler's lease is extended only within its
-- timeout (a hung handler is still recovered); a finished handler whose
-- result is not yet committed is always extended. Returns the tasks extended.
create or replace function flowlane.extend_leases(worker_id uuid, tasks jsonb) returns int
language plpgsql volatile
set search_path = ''
as $$
declare
  v_tasks flowlane.step_tasks[];
  v_offsets int[];
begin
  if tasks is null or jsonb_typeof(tasks) <> 'array' then
    raise exception 'extend_leases: tasks must be a JSON array of {run_id, step_slug, task_index, attempt, running}'
      using errcode = '22023';
  end if;
  with items as (
    select (e ->> 'run_id')::uuid as run_id, e ->> 'step_slug' as step_slug,
           (e ->> 'task_index')::int as task_index, (e ->> 'attempt')::int as attempt,
           coalesce((e ->> 'running')::boolean, false) as running
    from jsonb_array_elements(tasks) e
  ), locked as (
    select t.run_id, t.step_slug, t.task_index, o.stall_after
    from flowlane.step_tasks t
    join items i on i.run_id = t.run_id and i.step_slug = t.step_slug and i.task_index = t.task_index
    join flowlane.step_options o on o.flow_slug = t.flow_slug and o.step_slug = t.step_slug
    where t.status = 'started' and t.last_worker_id = extend_leases.worker_id
      and t.attempts_count = i.attempt
      and (not i.running or now() < t.started_at + make_interval(secs => o.timeout))
    order by t.run_id, t.step_slug, t.task_index
    for update of t skip locked
  ), renewed as (
    update flowlane.step_tasks t set lease_renewed_at = now()
      from locked l
     where t.run_id = l.run_id and t.step_slug = l.step_slug and t.task_index = l.task_index
    returning t, l.stall_after
  )
  select coalesce(array_agg(r.t), '{}'), coalesce(array_agg(r.stall_after), '{}')
    into v_tasks, v_offsets from renewed r;
  perform flowlane._set_tasks_vt(v_tasks, v_offsets);
  return cardinality(v_tasks);
end;
$$;

create or replace function flowlane._fail_batch(p_items flowlane._result_item[])
returns setof flowlane.step_tasks
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_classes flowlane._result_class[];
  v_exhausted flowlane._result_class[];
  v_sequential uuid[];
  v_class flowlane._result_class;
  v_task flowlane.step_tasks;
  v_retried flowlane.step_tasks[];
  v_delays int[];
  v_runs uuid[] := array(select distinct i.run_id from unnest(p_items) i);
begin
  v_classes := flowlane._lock_and_classify(p_items);
  perform set_config('flowlane.attempt_details', coalesce((
    select jsonb_object_agg(format('%s/%s/%s', (c.task).run_id, (c.task).step_slug, (c.task).task_index),
                            jsonb_build_object('type', (c.item).error_type, 'traceback', (c.item).traceback))
    from unnest(v_classes) c where c.actionable), '{}')::text, true);

  select coalesce(array_agg(c order by (c.task).run_id, (c.task).step_slug, (c.task).task_index), '{}')
    into v_exhausted
  from unnest(v_classes) c
  join flowlane.step_options o on o.flow_slug = (c.task).flow_slug and o.step_slug = (c.task).step_slug
  where c.actionable and (c.task).attempts_count >= o.max_attempts;

  v_sequential := flowlane._sequential_runs(v_classes, v_exhausted);
  for v_class in
    select c.* from unnest(v_classes) c
    where c.actionable and (c.task).run_id = any (v_sequential)
    order by (c.task).run_id, (c.task).step_slug, (c.task).task_index
  loop
    perform flowlane._fail_batch(array[v_class.item]);
  end loop;

  -- retries: one update; the same message visible again after the backoff (one set_vt per queue and delay)
  with retried as (
    update flowlane.step_tasks t
       set status = 'queued', started_at = null, error_message = (c.item).error_message
      from unnest(v_classes) c
     where c.actionable and not (c.task).run_id = any (v_sequential)
       and not exists (select 1 from unnest(v_exhausted) e where (e.task).run_id = (c.task).run_id)
       and t.run_id = (c.task).run_id and t.step_slug = (c.task).step_slug and t.task_index = (c.task).task_index
       and t.run_id = any (v_runs)
    returning t
  ) select coalesce(array_agg(r.t), '{}'),
           coalesce(array_agg(flowlane.calculate_retry_delay(o.base_delay, (r.t).attempts_count)), '{}')
      into v_retried, v_delays
    from retried r
    join flowlane.step_options o on o.flow_slug = (r.t).flow_slug and o.step_slug = (r.t).step_slug;
  perform flowlane._set_tasks_vt(v_retried, v_delays);

  -- out of attempts: at most one per run here, and it is the run's only actionable item
  for v_class in
    select c.* from unnest(v_exhausted) c where not (c.task).run_id = any (v_sequential)
  loop
    perform flowlane._exhaust_task(v_class.task, (v_class.item).error_message);
  end loop;

  perform set_config('flowlane.attempt_details', '', true);
  return query select * from flowlane._batch_rows(p_items);
end;
$$;

-- the attempt history (0007) takes an attempt's error type and traceback from
-- flowlane.attempt_details, {"<run_id>/<step_slug>/<task_index>": {type, traceback}}
-- (one setting for a whole batch), else from 0007's single-task settings
create or replace function flowlane._record_attempt() returns trigger
language plpgsql volatile
set search_path = ''
as $$
declare
  v_stalled boolean := new.requeued_count > old.requeued_count;
  v_message text := new.error_message;
  v_details jsonb := nullif(current_setting('flowlane.attempt_details', true), '')::jsonb
                     -> format('%s/%s/%s', new.run_id, new.step_slug, new.task_index);
begin
  if v_stalled and new.error_message is not distinct from old.error_message then
    v_message := format('no result within %s s: the task was requeued by stalled recovery',
                        (select o.stall_after from flowlane.step_options o
                         where o.flow_slug = new.flow_slug and o.step_slug = new.step_slug));
  end if;
  insert into flowlane.task_attempts
    (run_id, step_slug, task_index, attempt, retry_round, outcome, worker_id, error_type, error_message, traceback)
  select new.run_id, new.step_slug, new.task_index, greatest(old.attempts_count, 1), r.retry_count,
         case when v_stalled then 'stalled' when new.status = 'failed' then 'failed' else 'retry' end,
         old.last_worker_id,
         case when v_stalled then 'Stalled'
              else left(nullif(coalesce(v_details ->> 'type',
                                        current_setting('flowlane.attempt_error_type', true)), ''), 200) end,
         left(v_message, 4000),
         case when v_stalled then null
              else left(nullif(coalesce(v_details ->> 'traceback',
                                        current_setting('flowlane.attempt_traceback', true)), ''), 16000) end
  from flowlane.runs r where r.run_id = new.run_id;
  return null;
end;
$$;

-- 0006's recovery, the candidates taken from the leases
create or replace function flowlane.requeue_stalled_tasks() returns int
language plpgsql volatile
set search_path = ''
as $$
declare
  v_cand record;
  v_task flowlane.step_tasks;
  v_requeued flowlane.step_tasks[] := '{}';
  v_handled int := 0;
begin
  for v_cand in
    select t.run_id, t.step_slug, t.task_index, o.timeout, o.max_attempts, o.stall_after
    from flowlane.task_leases l
    join flowlane.step_tasks t on t.run_id = l.run_id and t.step_slug = l.step_slug and t.task_index = l.task_index
    join flowlane.step_options o on o.flow_slug = t.flow_slug and o.step_slug = t.step_slug
    where l.started_at < now() - make_interval(secs => o.stall_after)  -- the leases' index
      and t.status = 'started'
      and flowlane._stall_deadline(t, o.stall_after) < now()
    order by t.run_id, t.step_slug, t.task_index
  loop
    -- lock order run -> step state -> task; skip what another transaction holds
    perform 1 from flowlane.runs r where r.run_id = v_cand.run_id and r.status = 'started'
      for update skip locked;
    continue when not found;
    perform 1 from flowlane.step_states ss
      where ss.run_id = v_cand.run_id and ss.step_slug = v_cand.step_slug and ss.status = 'started'
      for update skip locked;
    continue when not found;
    select * into v_task from flowlane.step_tasks t
     where t.run_id = v_cand.run_id and t.step_slug = v_cand.step_slug and t.task_index = v_cand.task_index
       and t.status = 'started' and flowlane._stall_deadline(t, v_cand.stall_after) < now()
       for update skip locked;
    continue when not found;
    v_handled := v_handled + 1;
    if v_task.attempts_count >= v_cand.max_attempts then
      perform flowlane._exhaust_task(v_task,
        format('no result within %s s, %s attempts', v_cand.timeout, v_task.attempts_count));
    else
      update flowlane.step_tasks t
         set status = 'queued', started_at = null, last_worker_id = null, lease_renewed_at = null,
             requeued_count = t.requeued_count + 1, last_requeued_at = now(),
             error_message = format('no result within %s s (attempt %s)', v_cand.timeout, v_task.attempts_count)
       where t.run_id = v_task.run_id and t.step_slug = v_task.step_slug and t.task_index = v_task.task_index
      returning * into v_task;
      v_requeued := v_requeued || v_task;
    end if;
  end loop;
  perform flowlane._set_tasks_vt(v_requeued, array_fill(0, array[cardinality(v_requeued)]));
  return v_handled;
end;
$$;

alter table flowlane.flows
  alter column opt_max_attempts set default flowlane._flow_option_default('max_attempts'),
  alter column opt_base_delay set default flowlane._flow_option_default('base_delay'),
  alter column opt_timeout set default flowlane._flow_option_default('timeout');
