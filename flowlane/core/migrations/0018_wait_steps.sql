-- flowlane SQL Core 0018: wait steps.
-- Drafted by `python -m flowlane.core.draft_migration` from the engine source; reviewed.
--
-- A step of type wait has no handler, no queue and no task: a signal (flowlane.signal)
-- completes it with its payload; a signal that comes before the step starts is kept; a
-- timeout ends a step that waited too long (flowlane.expire_waits). steps.queue_name is
-- null exactly for wait steps; stuck_runs does not count a run that waits for a signal.

-- hand-written
alter table flowlane.steps alter column queue_name drop not null;
alter table flowlane.steps drop constraint steps_type_valid;
alter table flowlane.steps add constraint steps_type_valid check (step_type in ('single', 'map', 'wait'));
alter table flowlane.steps
  add constraint steps_queue_unless_wait check ((queue_name is null) = (step_type = 'wait'));
alter table flowlane.step_states drop constraint step_states_skip_reason_valid;
alter table flowlane.step_states add constraint step_states_skip_reason_valid
  check ((skip_reason is null) or (skip_reason in ('condition_unmet', 'handler_failed', 'dependency_skipped', 'wait_timeout')));

create table flowlane.signals (
  run_id uuid not null,
  step_slug text not null,
  payload jsonb not null,
  received_at timestamptz default now() not null,
  applied_at timestamptz,
  constraint signals_pkey primary key (run_id, step_slug),
  constraint signals_applied_after_received check ((applied_at is null) or (applied_at >= received_at)),
  constraint signals_run_id_fkey foreign key (run_id) references flowlane.runs(run_id) on delete cascade
);

create table flowlane.wait_deadlines (
  run_id uuid not null,
  step_slug text not null,
  expires_at timestamptz not null,
  constraint wait_deadlines_pkey primary key (run_id, step_slug),
  constraint wait_deadlines_run_id_fkey foreign key (run_id) references flowlane.runs(run_id) on delete cascade
);

create index wait_deadlines_expiry_idx on flowlane.wait_deadlines (expires_at);
-- end of hand-written

create or replace function flowlane.add_step(
  flow_slug text,
  step_slug text,
  deps_slugs text[] = '{}',
  max_attempts int = null,
  base_delay int = null,
  timeout int = null,
  start_delay int = null,
  step_type text = 'single',
  required_input_pattern jsonb = null,
  forbidden_input_pattern jsonb = null,
  when_unmet text = 'skip',
  when_exhausted text = 'fail',
  queue_name text = null
) returns flowlane.steps
language plpgsql volatile
set search_path = ''
as $$
declare
  v_flow text := add_step.flow_slug;
  v_step text := add_step.step_slug;
  v_deps text[] := coalesce(deps_slugs, '{}');
  v_type text := coalesce(add_step.step_type, 'single');
  v_unmet text := coalesce(add_step.when_unmet, 'skip');
  v_exhausted text := coalesce(add_step.when_exhausted, 'fail');
  v_mode text;
  v_queue text;
  v_index int;
  v_existing flowlane.steps;
  v_existing_deps text[];
  v_sorted_deps text[];
  v_dep text;
  v_other text;
  v_row flowlane.steps;
begin
  select f.queue_mode into v_mode from flowlane.flows f where f.flow_slug = v_flow for update;
  if not found then
    raise exception 'unknown flow "%": create it with flowlane.create_flow first', v_flow
      using errcode = '23503';
  end if;
  perform flowlane._check_slug('step', v_step);
  if v_type not in ('single', 'map', 'wait') then
    raise exception 'step "%" of flow "%": step_type must be single, map or wait, not %', v_step, v_flow,
      quote_literal(v_type) using errcode = '22023';
  end if;
  if v_type = 'map' and cardinality(v_deps) > 1 then
    raise exception 'map step "%" of flow "%" has % dependencies: a map step has 0 (it maps the run input) or 1 (it maps that step''s output)',
      v_step, v_flow, cardinality(v_deps) using errcode = '22023';
  end if;
  if required_input_pattern is not null and jsonb_typeof(required_input_pattern) <> 'object' then
    raise exception 'step "%" of flow "%": required_input_pattern (if) must be a JSON object, got %',
      v_step, v_flow, jsonb_typeof(required_input_pattern) using errcode = '22023';
  end if;
  if forbidden_input_pattern is not null and jsonb_typeof(forbidden_input_pattern) <> 'object' then
    raise exception 'step "%" of flow "%": forbidden_input_pattern (unless) must be a JSON object, got %',
      v_step, v_flow, jsonb_typeof(forbidden_input_pattern) using errcode = '22023';
  end if;
  if v_unmet not in ('skip', 'skip-cascade', 'fail') then
    raise exception 'step "%" of flow "%": when_unmet must be skip, skip-cascade or fail, not %',
      v_step, v_flow, quote_literal(v_unmet) using errcode = '22023';
  end if;
  if v_unmet <> 'skip' and required_input_pattern is null and forbidden_input_pattern is null then
    raise exception 'step "%" of flow "%": when_unmet % is only meaningful with a condition (required_input_pattern or forbidden_input_pattern)',
      v_step, v_flow, v_unmet using errcode = '22023';
  end if;
  if v_exhausted not in ('fail', 'skip', 'skip-cascade') then
    raise exception 'step "%" of flow "%": when_exhausted must be fail, skip or skip-cascade, not %',
      v_step, v_flow, quote_literal(v_exhausted) using errcode = '22023';
  end if;
  if array_position(v_deps, null) is not null then
    raise exception 'step "%" of flow "%": a dependency slug is null', v_step, v_flow using errcode = '22023';
  end if;
  select array_agg(d order by d collate "C") into v_sorted_deps from (select distinct unnest(v_deps) as d) x;
  v_sorted_deps := coalesce(v_sorted_deps, '{}');
  if cardinality(v_sorted_deps) <> cardinality(v_deps) then
    raise exception 'step "%" of flow "%" lists a dependency twice: %', v_step, v_flow, v_deps
      using errcode = '22023';
  end if;

  select * into v_existing from flowlane.steps s where s.flow_slug = v_flow and s.step_slug = v_step;
  if found then
    v_index := v_existing.step_index;
  else
    select coalesce(max(s.step_index) + 1, 0) into v_index from flowlane.steps s where s.flow_slug = v_flow;
  end if;
  v_queue := flowlane._step_queue(v_flow, v_step, v_index, v_mode, v_type, add_step.queue_name);

  if v_existing.flow_slug is not null then
    select coalesce(array_agg(d.dep_slug order by d.dep_slug collate "C"), '{}') into v_existing_deps
    from flowlane.deps d where d.flow_slug = v_flow and d.step_slug = v_step;
    if v_existing.step_type <> v_type then
      perform flowlane._shape_mismatch(v_flow, v_step, 'step_type', v_existing.step_type, v_type);
    end if;
    if v_existing_deps <> v_sorted_deps then
      perform flowlane._shape_mismatch(v_flow, v_step, 'deps', v_existing_deps::text, v_sorted_deps::text);
    end if;
    if v_existing.required_input_pattern is distinct from required_input_pattern then
      perform flowlane._shape_mismatch(v_flow, v_step, 'required_input_pattern',
        v_existing.required_input_pattern::text, required_input_pattern::text);
    end if;
    if v_existing.forbidden_input_pattern is distinct from forbidden_input_pattern then
      perform flowlane._shape_mismatch(v_flow, v_step, 'forbidden_input_pattern',
        v_existing.forbidden_input_pattern::text, forbidden_input_pattern::text);
    end if;
    if v_existing.when_unmet <> v_unmet then
      perform flowlane._shape_mismatch(v_flow, v_step, 'when_unmet', v_existing.when_unmet, v_unmet);
    end if;
    if v_existing.when_exhausted <> v_exhausted then
      perform flowlane._shape_mismatch(v_flow, v_step, 'when_exhausted', v_existing.when_exhausted, v_exhausted);
    end if;
    if v_existing.queue_name is distinct from v_queue then
      perform flowlane._shape_mismatch(v_flow, v_step, 'queue_name', v_existing.queue_name, v_queue);
    end if;
    if v_queue is not null then
      perform flowlane._ensure_queue(v_queue, v_flow, v_mode);
    end if;
    update flowlane.steps s
       set opt_max_attempts = max_attempts, opt_base_delay = base_delay,
           opt_timeout = timeout, opt_start_delay = start_delay
     where s.flow_slug = v_flow and s.step_slug = v_step
    returning * into v_row;
    return v_row;
  end if;

  select s.step_slug into v_other from flowlane.steps s
  where s.flow_slug = v_flow and lower(s.step_slug) = lower(v_step);
  if found then
    raise exception 'step slug "%" conflicts with existing step "%" of flow "%" (step slugs are unique case-insensitively within a flow)',
      v_step, v_other, v_flow using errcode = '23505';
  end if;
  foreach v_dep in array v_sorted_deps loop
    if v_dep = v_step then
      raise exception 'step "%" of flow "%" cannot depend on itself', v_step, v_flow using errcode = '22023';
    end if;
    if not exists (select 1 from flowlane.steps s where s.flow_slug = v_flow and s.step_slug = v_dep) then
      raise exception 'step "%" of flow "%" depends on unknown step "%" (add dependencies before the steps that need them)',
        v_step, v_flow, v_dep using errcode = '23503';
    end if;
  end loop;

  if exists (select 1 from flowlane.flows f where f.flow_slug = v_flow and f.shape_sealed_at is not null)
     or exists (select 1 from flowlane.runs r where r.flow_slug = v_flow) then
    raise exception 'FLOWLANE_SHAPE_MISMATCH: flow "%" is already applied and has no step "%"', v_flow, v_step
      using errcode = '23514',
            hint = 'the shape of a flow never changes once applied (verified or run); create a new flow version (a new slug)';
  end if;
  if v_queue is not null then
    perform flowlane._ensure_queue(v_queue, v_flow, v_mode);
  end if;
  insert into flowlane.steps (flow_slug, step_slug, step_type, step_index, deps_count,
    opt_max_attempts, opt_base_delay, opt_timeout, opt_start_delay,
    required_input_pattern, forbidden_input_pattern, when_unmet, when_exhausted, queue_name)
  values (v_flow, v_step, v_type, v_index, cardinality(v_sorted_deps), max_attempts, base_delay, timeout,
    start_delay, required_input_pattern, forbidden_input_pattern, v_unmet, v_exhausted, v_queue)
  returning * into v_row;
  insert into flowlane.deps (flow_slug, dep_slug, step_slug)
  select v_flow, d, v_step from unnest(v_sorted_deps) d;
  return v_row;
end;
$$;

-- new runs of one concrete flow (inputs checked by the caller); returns them in input order
create or replace function flowlane._create_runs(p_flow text, p_inputs jsonb[], p_run_ids uuid[])
returns setof flowlane.runs
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_ids uuid[];
begin
  v_ids := array(select coalesce(p_run_ids[i], gen_random_uuid()) from generate_subscripts(p_inputs, 1) i order by i);
  insert into flowlane.runs (run_id, flow_slug, input, remaining_steps)
  select v_ids[i], p_flow, p_inputs[i], (select count(*) from flowlane.steps s where s.flow_slug = p_flow)
  from generate_subscripts(p_inputs, 1) i order by i;
  insert into flowlane.step_states (flow_slug, run_id, step_slug, remaining_deps, initial_tasks)
  select p_flow, v_ids[i], s.step_slug, s.deps_count,
         case when s.step_type <> 'map' then 1
              when s.deps_count = 0 and jsonb_typeof(p_inputs[i]) = 'array' then jsonb_array_length(p_inputs[i])
              else null end
  from generate_subscripts(p_inputs, 1) i, flowlane.steps s
  where s.flow_slug = p_flow
  order by v_ids[i], s.step_slug;
  perform flowlane._progress_runs(v_ids);
  return query select r.* from unnest(v_ids) with ordinality as u (run_id, ord)
               join flowlane.runs r on r.run_id = u.run_id and r.run_id = any (v_ids) order by u.ord;
end;
$$;

-- the ready steps of the given started runs (callers hold the run locks, or
-- the runs are new): one step_states update, one send_batch per (queue, start
-- delay) for all runs, one step_tasks insert per queue
create or replace function flowlane._start_ready_steps(p_run_ids uuid[]) returns void
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set plan_cache_mode = force_generic_plan
as $$
declare
  v_started flowlane.step_states[];
  v_group record;
  v_n int;
begin
  with ready as (
    select ss.run_id, ss.step_slug
    from flowlane.step_states ss
    join flowlane.runs r on r.run_id = ss.run_id and r.status = 'started' and r.run_id = any (p_run_ids)
    join flowlane.steps s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
    where ss.run_id = any (p_run_ids) and ss.status = 'created' and ss.remaining_deps = 0
      and ss.initial_tasks > 0
      -- _condition_met is a call per row (never inlined): only for a step with a condition
      and case when s.required_input_pattern is null and s.forbidden_input_pattern is null then true
               else flowlane._condition_met(ss.run_id, ss.step_slug) end
    order by ss.run_id, ss.step_slug
    for update of ss
  ), started as (
    update flowlane.step_states ss
       set status = 'started', started_at = now(), remaining_tasks = ss.initial_tasks
      from ready
     where ss.run_id = ready.run_id and ss.step_slug = ready.step_slug and ss.run_id = any (p_run_ids)
    returning ss
  ) select coalesce(array_agg(st.ss), '{}') into v_started from started st;
  if cardinality(v_started) = 0 then
    return;
  end if;
  for v_group in
    select s.queue_name, coalesce(s.opt_start_delay, 0) as start_delay,
           array_agg(jsonb_build_object('flow_slug', st.flow_slug, 'run_id', st.run_id,
                                        'step_slug', st.step_slug, 'task_index', k)
                     order by st.run_id, s.step_index, k) as bodies
    from unnest(v_started) st
    join flowlane.steps s on s.flow_slug = st.flow_slug and s.step_slug = st.step_slug
    cross join lateral generate_series(0, st.initial_tasks - 1) as k
    group by 1, 2
    order by 1, 2
  loop
    if v_group.queue_name is null then  -- wait steps: no task (11_waits.sql)
      perform flowlane._begin_waits(v_started);
      continue;
    end if;
    insert into flowlane.step_tasks (flow_slug, run_id, step_slug, task_index, queue_name, message_id)
    select b.body ->> 'flow_slug', (b.body ->> 'run_id')::uuid, b.body ->> 'step_slug',
           (b.body ->> 'task_index')::int, v_group.queue_name, m.id
    from pgmq.send_batch(v_group.queue_name, v_group.bodies, v_group.start_delay) with ordinality as m (id, ord)
    join unnest(v_group.bodies) with ordinality as b (body, ord) on b.ord = m.ord;
    get diagnostics v_n = row_count;
    if v_n <> cardinality(v_group.bodies) then
      raise exception 'internal error: sent % messages to queue % for % tasks',
        v_n, v_group.queue_name, cardinality(v_group.bodies);
    end if;
  end loop;
end;
$$;

-- runs that are started but have no task that can move them: every started
-- run needs a queued task (visible, delayed or retry-delayed) or a started
-- (leased) task whose message is still on its queue
create or replace function flowlane.stuck_runs()
returns table (run_id uuid, flow_slug text, started_at timestamptz, reason text)
language plpgsql stable
set search_path = ''
as $$
declare
  v_queue record;
  v_ids bigint[];
  v_live_queues text[] := '{}';
  v_live_ids bigint[] := '{}';
begin
  for v_queue in
    select t.queue_name, array_agg(t.message_id) as ids
    from flowlane.step_tasks t join flowlane.runs r on r.run_id = t.run_id
    where r.status = 'started' and t.status in ('queued', 'started')
    group by t.queue_name order by t.queue_name
  loop
    execute format('select coalesce(array_agg(m.msg_id), ''{}'') from pgmq.%I m where m.msg_id = any($1)',
                   pgmq.format_table_name(v_queue.queue_name, 'q'))
      into v_ids using v_queue.ids;
    v_live_queues := v_live_queues || array_fill(v_queue.queue_name, array[cardinality(v_ids)]);
    v_live_ids := v_live_ids || v_ids;
  end loop;
  return query
    select r.run_id, r.flow_slug, r.started_at,
           case when exists (select 1 from flowlane.step_tasks t
                             where t.run_id = r.run_id and t.status in ('queued', 'started'))
                then 'its queued and started tasks have no message on their queue'
                else 'no queued or started task' end
    from flowlane.runs r
    where r.status = 'started'
      and not flowlane._waits_for_signal(r.run_id)
      and not exists (
        select 1 from flowlane.step_tasks t
        join unnest(v_live_queues, v_live_ids) as l(queue_name, msg_id)
          on l.queue_name = t.queue_name and l.msg_id = t.message_id
        where t.run_id = r.run_id and t.status in ('queued', 'started'))
    order by r.started_at, r.run_id;
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
  perform flowlane._reopen_waits(v_run.run_id);
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

-- the queue of a new step: a wait step has none (nothing is sent for it, no worker serves it)
create or replace function flowlane._step_queue(
  p_flow_slug text, p_step_slug text, p_step_index int, p_mode text, p_type text, p_given text
) returns text
language plpgsql stable
set search_path = ''
as $$
begin
  if p_type <> 'wait' then
    return flowlane._resolve_queue(p_flow_slug, p_step_slug, p_step_index, p_mode, p_given);
  end if;
  if p_given is not null then
    raise exception 'step "%" of flow "%" is a wait step: it has no handler and no queue, so queue_name must be null, not "%"',
      p_step_slug, p_flow_slug, p_given
      using errcode = '22023', hint = 'a wait step completes with a signal (flowlane.signal); no worker serves it';
  end if;
  return null;
end;
$$;

-- a started run that waits for a signal is not stuck: what moves it comes from outside
create or replace function flowlane._waits_for_signal(p_run_id uuid) returns boolean
language sql stable
set search_path = ''
as $$
  select exists (
    select 1 from flowlane.step_states ss
    join flowlane.steps s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
    where ss.run_id = p_run_id and ss.status = 'started' and s.step_type = 'wait')
$$;

-- the wait steps among steps that just started (callers hold their runs' locks): each gets
-- its deadline, and a kept signal completes its step at once
create or replace function flowlane._begin_waits(p_started flowlane.step_states[]) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_done flowlane.step_states[];
begin
  insert into flowlane.wait_deadlines as w (run_id, step_slug, expires_at)
  select st.run_id, st.step_slug, now() + make_interval(secs => s.opt_timeout)
  from unnest(p_started) st
  join flowlane.steps s on s.flow_slug = st.flow_slug and s.step_slug = st.step_slug
  where s.step_type = 'wait' and s.opt_timeout is not null
  order by st.run_id, st.step_slug
  on conflict on constraint wait_deadlines_pkey do update set expires_at = excluded.expires_at;
  with kept as (
    update flowlane.signals g set applied_at = greatest(now(), g.received_at)
      from unnest(p_started) st
      join flowlane.steps s on s.flow_slug = st.flow_slug and s.step_slug = st.step_slug
     where s.step_type = 'wait' and g.run_id = st.run_id and g.step_slug = st.step_slug
       and g.applied_at is null
    returning g.run_id, g.step_slug, g.payload
  ), done as (
    update flowlane.step_states ss
       set status = 'completed', output = k.payload, remaining_tasks = 0, completed_at = now()
      from kept k
     where ss.run_id = k.run_id and ss.step_slug = k.step_slug and ss.status = 'started'
    returning ss
  ) select coalesce(array_agg(d.ss order by (d.ss).run_id, (d.ss).step_slug), '{}') into v_done from done d;
  if cardinality(v_done) > 0 then
    perform flowlane._steps_done(v_done);
  end if;
end;
$$;

-- retry_run: a wait step the run's failure ended while it waited waits again, from the start
create or replace function flowlane._reopen_waits(p_run_id uuid) returns void
language sql volatile
set search_path = ''
as $$
  update flowlane.step_states ss
     set status = 'created', cancelled_at = null, started_at = null, remaining_tasks = null
    from flowlane.steps s
   where ss.run_id = p_run_id and ss.status = 'cancelled' and ss.started_at is not null
     and s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug and s.step_type = 'wait';
$$;

-- deliver a signal to a run's wait step: it completes the step with the payload as its
-- output (and starts what depends on it), or is kept until the step starts. Refused, with
-- nothing changed: an unknown run or step, a step that is not a wait step, a finished run, a
-- finished step, a step that already has a signal, a payload its step cannot give (not an
-- array for a step a map step maps). Returns the signal; applied_at null means kept.
create or replace function flowlane.signal(run_id uuid, step_slug text, payload jsonb = '{}')
returns flowlane.signals
language plpgsql volatile
set search_path = ''
as $$
declare
  v_run flowlane.runs;
  v_step flowlane.steps;
  v_state flowlane.step_states;
  v_signal flowlane.signals;
  v_map text;
begin
  if signal.run_id is null or signal.step_slug is null then
    raise exception 'signal: run_id and step_slug must not be null' using errcode = '22004';
  end if;
  if payload is null then
    raise exception 'signal: payload must not be null (use {} for no payload)' using errcode = '22004';
  end if;
  perform flowlane._check_signal_payload(payload);
  select * into v_run from flowlane.runs r where r.run_id = signal.run_id for update;
  if not found then
    raise exception 'signal: no run %', signal.run_id using errcode = 'P0002';
  end if;
  select * into v_step from flowlane.steps s where s.flow_slug = v_run.flow_slug and s.step_slug = signal.step_slug;
  if not found then
    raise exception 'signal: flow "%" of run % has no step "%"', v_run.flow_slug, v_run.run_id, signal.step_slug
      using errcode = 'P0002', hint = flowlane._wait_steps_hint(v_run.flow_slug);
  end if;
  if v_step.step_type <> 'wait' then
    raise exception 'signal: step "%" of flow "%" is not a wait step: it completes when its handler returns',
      v_step.step_slug, v_run.flow_slug
      using errcode = '42809', hint = flowlane._wait_steps_hint(v_run.flow_slug);
  end if;
  if v_run.status <> 'started' then
    raise exception 'signal: run % is %: a finished run takes no signal', v_run.run_id, v_run.status
      using errcode = '55000';
  end if;
  select d.step_slug into v_map from flowlane.deps d
  join flowlane.steps m on m.flow_slug = d.flow_slug and m.step_slug = d.step_slug and m.step_type = 'map'
  where d.flow_slug = v_run.flow_slug and d.dep_slug = v_step.step_slug;
  if found and jsonb_typeof(payload) <> 'array' then
    raise exception 'signal: step "%" feeds map step "%", so its payload must be a JSON array, got %',
      v_step.step_slug, v_map, jsonb_typeof(payload) using errcode = '22023';
  end if;
  select * into v_state from flowlane.step_states ss
  where ss.run_id = v_run.run_id and ss.step_slug = v_step.step_slug for update;
  select * into v_signal from flowlane.signals g where g.run_id = v_run.run_id and g.step_slug = v_step.step_slug;
  if found then
    raise exception 'signal: step "%" of run % already has a signal, received at % (%)', v_step.step_slug,
      v_run.run_id, v_signal.received_at,
      case when v_signal.applied_at is null then 'kept until the step starts' else 'it completed the step' end
      using errcode = '55000', hint = 'a wait step takes one signal; this one changed nothing';
  end if;
  if v_state.status not in ('created', 'started') then
    raise exception 'signal: step "%" of run % is already %: it takes no signal', v_step.step_slug,
      v_run.run_id, v_state.status using errcode = '55000';
  end if;
  insert into flowlane.signals (run_id, step_slug, payload, applied_at)
  values (v_run.run_id, v_step.step_slug, payload, case when v_state.status = 'started' then now() end)
  returning * into v_signal;
  if v_state.status = 'started' then
    update flowlane.step_states ss
       set status = 'completed', output = payload, remaining_tasks = 0, completed_at = now()
     where ss.run_id = v_run.run_id and ss.step_slug = v_step.step_slug
    returning * into v_state;
    perform flowlane._steps_done(array[v_state]);
  end if;
  return v_signal;
end;
$$;

create or replace function flowlane._check_signal_payload(p_payload jsonb) returns void
language plpgsql immutable
set search_path = ''
as $$
declare
  v_max_depth int := (flowlane.json_limits() ->> 'max_depth')::int;
  v_max_bytes int := (flowlane.json_limits() ->> 'max_bytes')::int;
  v_bytes int := octet_length(p_payload::text);
begin
  if v_bytes > v_max_bytes then
    raise exception 'signal: the payload is % bytes of JSON, more than the limit of % bytes', v_bytes, v_max_bytes
      using errcode = '22023', hint = 'pass a reference (a URL, a storage key) instead of the data itself';
  end if;
  if flowlane.json_depth_exceeds(p_payload, v_max_depth) then
    raise exception 'signal: the payload is nested deeper than % levels', v_max_depth
      using errcode = '22023', hint = 'flatten the payload';
  end if;
end;
$$;

create or replace function flowlane._wait_steps_hint(p_flow text) returns text
language sql stable
set search_path = ''
as $$
  select coalesce('the wait steps of flow ' || p_flow || ': '
                  || string_agg(s.step_slug, ', ' order by s.step_index), 'flow ' || p_flow || ' has no wait step')
  from flowlane.steps s where s.flow_slug = p_flow and s.step_type = 'wait'
$$;

-- wait steps whose timeout passed by p_now without a signal end as their when_exhausted
-- says: fail (the run fails), skip or skip-cascade (the run goes on). Runs another
-- transaction holds are left for the next call. Returns how many steps it ended.
create or replace function flowlane.expire_waits(p_now timestamptz = now()) returns int
language plpgsql volatile
set search_path = ''
as $$
declare
  v_due record;
  v_step flowlane.steps;
  v_error text;
  v_ended int := 0;
begin
  for v_due in
    select w.run_id, w.step_slug from flowlane.wait_deadlines w
    where w.expires_at <= p_now
    order by w.expires_at, w.run_id, w.step_slug
    limit 1000
  loop
    perform 1 from flowlane.runs r where r.run_id = v_due.run_id for update skip locked;
    continue when not found;
    perform 1 from flowlane.wait_deadlines w
    where w.run_id = v_due.run_id and w.step_slug = v_due.step_slug and w.expires_at <= p_now;
    continue when not found;  -- a retry gave the step a new deadline meanwhile
    delete from flowlane.wait_deadlines w where w.run_id = v_due.run_id and w.step_slug = v_due.step_slug;
    select s.* into v_step from flowlane.step_states ss
    join flowlane.runs r on r.run_id = ss.run_id and r.status = 'started'
    join flowlane.steps s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
    where ss.run_id = v_due.run_id and ss.step_slug = v_due.step_slug and ss.status = 'started'
    for update of ss;
    continue when not found;  -- signalled, or its run ended
    v_ended := v_ended + 1;
    v_error := format('no signal within %s s', v_step.opt_timeout);
    if v_step.when_exhausted = 'fail' then
      update flowlane.step_states ss
         set status = 'failed', failed_at = now(), remaining_tasks = null, error_message = v_error
       where ss.run_id = v_due.run_id and ss.step_slug = v_due.step_slug;
      perform flowlane._fail_run(v_due.run_id, format('step %s: %s', v_due.step_slug, v_error));
    else
      if v_step.when_exhausted = 'skip-cascade' then
        perform flowlane._skip_cascade(v_due.run_id, v_due.step_slug, 'wait_timeout');
      else
        perform flowlane._skip_step(v_due.run_id, v_due.step_slug, 'wait_timeout');
      end if;
      update flowlane.step_states ss set error_message = v_error
       where ss.run_id = v_due.run_id and ss.step_slug = v_due.step_slug;
      perform flowlane._progress(v_due.run_id);
    end if;
  end loop;
  return v_ended;
end;
$$;

-- the wait steps of a run for `flowlane run` and the console: each with its state, since
-- when it waits, when it gives up, and its signal (kept or applied)
create or replace function flowlane.get_run_waits(run_id uuid) returns jsonb
language sql stable
set search_path = ''
as $$
  select coalesce(jsonb_agg(jsonb_build_object(
           'step_slug', ss.step_slug,
           'status', ss.status,
           'waiting_since', case when ss.status = 'started' then ss.started_at end,
           'expires_at', case when ss.status = 'started' then w.expires_at end,
           'timeout', s.opt_timeout,
           'signal', case when g.run_id is not null then jsonb_build_object(
                       'payload', g.payload, 'received_at', g.received_at, 'applied_at', g.applied_at) end)
         order by s.step_index), '[]'::jsonb)
  from flowlane.runs r
  join flowlane.steps s on s.flow_slug = r.flow_slug and s.step_type = 'wait'
  join flowlane.step_states ss on ss.run_id = r.run_id and ss.step_slug = s.step_slug
  left join flowlane.wait_deadlines w on w.run_id = r.run_id and w.step_slug = s.step_slug
  left join flowlane.signals g on g.run_id = r.run_id and g.step_slug = s.step_slug
  where r.run_id = get_run_waits.run_id
$$;
