-- flowlane SQL Core 0004: release 0.2.0.
-- Drafted by `python -m flowlane.core.draft_migration` from the engine source; reviewed by a person.
--
-- Data contracts read a count (minLength, maxLength, minItems, maxItems) written as a whole
-- number with a fraction, 2.0, as the count 2, as JSON Schema does and as _contract_problem
-- already accepted: set_contract and contract_violation failed on it with "invalid input
-- syntax for type integer". The counts go through the new _contract_count, and a count that
-- is not a whole number is named with its value. Only functions change: stored contracts and
-- their compiled checks stay as they are (a whole count compiles to the same text, so the same
-- _contract_check_<md5> function). The previous release's workers keep running: none of the
-- functions they call while claiming, completing or failing changes.
--
-- definitions_fingerprint (read class): a text that changes whenever flowlane_definitions is
-- notified, which `flowlane serve` polls where it cannot LISTEN (through a transaction-mode
-- pooler, a DSN with pooler=transaction). A new function only; nothing else changes.
--
-- Every result is fenced by its claim: complete_task, fail_task and fail_task_detailed, and
-- every item of complete_tasks and fail_tasks, need the worker_id and attempt of the claim
-- they answer (a result without them completed or failed whatever task it named). An operator
-- who must end a task by hand calls the new override_task, which records who and why in the
-- task's attempt history (outcome 'overridden') and clears the task's last_worker_id, so that
-- the worker's own result is rejected. The previous release's workers always send both.
--
-- Worker liveness is one rule, flowlane.worker_is_live (not stopped, a heartbeat within
-- flowlane.worker_stale_after(), 30 s), read by worker list, queue list, run, the console, the
-- metrics and serve; `worker list` counted a worker dead for minutes as live. queue_metrics
-- keeps its argument for the previous release's callers and no longer reads it. Only
-- functions change.
--
-- A failed or completed run reruns from a step (retry_run_from): the step and every step
-- that depends on it run again, the other steps keep their outputs. retry_run keeps its
-- signature and behaviour; its body is split into helpers both share. The attempt history
-- (task_attempts) gains the outcome 'superseded' and an output column: a rerun step's
-- completed tasks are recorded there, with their output, before they are replaced. Existing
-- rows are unchanged (their output is null). retry_runs and cancel_runs retry or cancel a
-- bounded batch of runs in one call, passing over those no longer in a state that allows it
-- (`flowlane retry|cancel` with a filter calls them once per batch and transaction).
-- A flow's failure handler: create_flow takes on_failure (a flow or alias, started once with the
-- failure as its input when a run of the flow fails or passes its deadline) and
-- on_failure_on_cancel (also when it is cancelled), kept in two new columns of flows; runs gain
-- failure_of, the run a failure handler's run handles (unique: one per run). A trigger on runs
-- starts it. Existing flows have none; existing runs handle no failure. create_flow changes its
-- signature (two arguments with defaults); the functions workers call do not change.

-- Compensation: add_step takes compensate (a flow or alias, kept in steps.opt_compensate);
-- when a run fails, a run of it starts for each completed step that names one, with the
-- step's input and output, in reverse dependency order, each recorded once in the new table
-- compensations. runs gain compensation (running, completed, stopped) and compensation_of (the
-- run a compensation's run compensates); retry_compensation resumes a stopped chain, and
-- get_run_compensations lists a run's compensations. A compensated run is not retried
-- (retry_run, retry_run_from and retry_runs refuse or pass over it). add_step changes its
-- signature (one argument with a default); the functions workers call do not change.

-- == Written by hand: tables, types and data that the functions need ==

-- fenced results and rerun from a step: the attempt history records an operator's
-- completion by hand ('overridden') and a rerun step's completed tasks with their output
-- ('superseded')
alter table flowlane.task_attempts add column output jsonb;
alter table flowlane.task_attempts drop constraint task_attempts_outcome_valid,
  add constraint task_attempts_outcome_valid
  check (outcome in ('retry', 'failed', 'stalled', 'overridden', 'superseded'));

-- failure handlers: the flow a flow's failures start, and the run a handler's run handles
alter table flowlane.flows add column opt_on_failure text,
  add column opt_on_failure_on_cancel boolean default false not null,
  add constraint flows_on_failure_slug check ((opt_on_failure is null) or flowlane.is_valid_slug(opt_on_failure));
alter table flowlane.runs add column failure_of uuid;
-- a run's failure handler run (20_on_failure.sql): at most one per failed run
create unique index runs_failure_of_unique on flowlane.runs (failure_of) where (failure_of is not null);

-- compensation: what a step names, what a run's compensation is, and each compensation
alter table flowlane.steps add column opt_compensate text,
  add constraint steps_compensate_slug check ((opt_compensate is null) or flowlane.is_valid_slug(opt_compensate));
-- (runs keep their one CHECK, runs_rules: compensation is written by 21_compensation.sql only)
alter table flowlane.runs add column compensation text, add column compensation_of uuid;
-- a failed run's compensations (21_compensation.sql): each completed step's with one, and
-- the run started for it
create table flowlane.compensations (
  run_id uuid not null,
  step_slug text not null,
  status text default 'pending' not null,
  compensation_run_id uuid,
  constraint compensations_pkey primary key (run_id, step_slug),
  constraint compensations_status_valid check (status in ('pending', 'started', 'completed', 'failed')),
  constraint compensations_run_fkey foreign key (run_id) references flowlane.runs(run_id) on delete cascade
);
create unique index compensations_run_idx on flowlane.compensations (compensation_run_id)
  where (compensation_run_id is not null);

-- == Drafted from the engine source by `python -m flowlane.core.draft_migration`; redrafted, never edited ==

set local check_function_bodies = off;

-- REVIEW: flowlane.add_step(text,text,text[],integer,integer,integer,integer,text,jsonb,jsonb,text,text,text,text,integer,text) is called by flowlane.ensure_flow_compiled(text,jsonb): a call in flight when this migration commits runs their old bodies to the end and fails without it; keep the signature while the previous release's workers may call them (CONTRIBUTING, rules for migrations)

drop function flowlane.add_step(text,text,text[],integer,integer,integer,integer,text,jsonb,jsonb,text,text,text,text,integer,text);

-- REVIEW: flowlane.create_flow(text,integer,integer,integer,text,integer,integer,text,integer,text,integer) is called by flowlane.ensure_flow_compiled(text,jsonb): a call in flight when this migration commits runs their old bodies to the end and fails without it; keep the signature while the previous release's workers may call them (CONTRIBUTING, rules for migrations)

drop function flowlane.create_flow(text,integer,integer,integer,text,integer,integer,text,integer,text,integer);

-- two transactions applying the same flow file raced between the existence
-- check and the insert and one failed on flows_slug_ci_unique; the lock on
-- the lowercase slug makes the second wait and then find the first's rows.
-- retention: seconds a finished run is kept; null keeps runs for ever (so, unlike
-- the other options, leaving it out is what gives the default)
create or replace function flowlane.create_flow(
  flow_slug text,
  max_attempts int = null,
  base_delay int = null,
  timeout int = null,
  queue_mode text = 'flow',
  retention int = flowlane._flow_option_default('retention'),
  deadline int = null,
  dedup_key text = null,
  concurrency_limit int = null,
  concurrency_key text = null,
  priority int = null,
  on_failure text = null,
  on_failure_on_cancel boolean = false
) returns flowlane.flows
language plpgsql volatile
set search_path = ''
as $$
declare
  v_flow flowlane.flows;
  v_old flowlane.flows;
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
  perform flowlane._check_start_options(create_flow.flow_slug, create_flow.deadline, create_flow.dedup_key);
  perform flowlane._check_flow_control_options(format('flow "%s"', create_flow.flow_slug),
    create_flow.concurrency_limit, create_flow.concurrency_key, create_flow.priority);
  perform flowlane._check_on_failure(create_flow.flow_slug, create_flow.on_failure);
  perform pg_advisory_xact_lock(hashtext('flowlane.flow'), hashtext(lower(create_flow.flow_slug)));
  select f.flow_slug into v_other from flowlane.flows f
  where lower(f.flow_slug) = lower(create_flow.flow_slug) and f.flow_slug <> create_flow.flow_slug;
  if found then
    raise exception 'flow slug "%" conflicts with existing flow "%" (flow slugs are unique case-insensitively)',
      create_flow.flow_slug, v_other using errcode = '23505';
  end if;
  select * into v_flow from flowlane.flows f where f.flow_slug = create_flow.flow_slug for update;
  v_old := v_flow;
  if found and v_flow.queue_mode <> v_mode then
    raise exception 'FLOWLANE_SHAPE_MISMATCH: flow "%" exists with queue_mode %, not %',
      create_flow.flow_slug, v_flow.queue_mode, v_mode
      using errcode = '23514',
            hint = 'the queue mode is part of the flow''s shape; create a new flow version (a new slug)';
  end if;
  if create_flow.retention is not null and create_flow.retention < 1 then
    raise exception 'flow "%": retention must be at least 1 second (null keeps runs for ever), got %',
      create_flow.flow_slug, create_flow.retention using errcode = '22023';
  end if;
  insert into flowlane.flows as f (flow_slug, opt_max_attempts, opt_base_delay, opt_timeout, queue_mode,
                                   opt_retention, opt_deadline, opt_dedup_key, opt_concurrency_limit,
                                   opt_concurrency_key, opt_priority, opt_on_failure, opt_on_failure_on_cancel)
  values (create_flow.flow_slug, coalesce(max_attempts, flowlane._flow_option_default('max_attempts')),
          coalesce(base_delay, flowlane._flow_option_default('base_delay')),
          coalesce(timeout, flowlane._flow_option_default('timeout')), v_mode, create_flow.retention,
          create_flow.deadline, create_flow.dedup_key, create_flow.concurrency_limit,
          nullif(create_flow.concurrency_key, ''), create_flow.priority, create_flow.on_failure,
          coalesce(create_flow.on_failure_on_cancel, false))
  on conflict on constraint flows_pkey do update
    set opt_max_attempts = excluded.opt_max_attempts,
        opt_base_delay = excluded.opt_base_delay,
        opt_timeout = excluded.opt_timeout,
        opt_retention = excluded.opt_retention,
        opt_deadline = excluded.opt_deadline,
        opt_dedup_key = excluded.opt_dedup_key,
        opt_concurrency_limit = excluded.opt_concurrency_limit,
        opt_concurrency_key = excluded.opt_concurrency_key,
        opt_priority = excluded.opt_priority,
        opt_on_failure = excluded.opt_on_failure,
        opt_on_failure_on_cancel = excluded.opt_on_failure_on_cancel
  returning * into v_flow;
  if v_old.flow_slug is not null and (v_old.opt_concurrency_limit, v_old.opt_concurrency_key)
     is distinct from (v_flow.opt_concurrency_limit, v_flow.opt_concurrency_key) then
    perform flowlane._flow_limits_changed(v_flow.flow_slug);
  end if;
  return v_flow;
end;
$$;

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
  queue_name text = null,
  child_flow text = null,
  concurrency_limit int = null,
  concurrency_key text = null,
  compensate text = null
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
  perform flowlane._check_child_flow(v_flow, v_step, v_type, add_step.child_flow);
  perform flowlane._check_flow_control_options(format('step "%s" of flow "%s"', v_step, v_flow),
    add_step.concurrency_limit, add_step.concurrency_key, null);
  if add_step.concurrency_limit is not null and (v_type = 'wait' or add_step.child_flow is not null) then
    raise exception 'step "%" of flow "%": a concurrency limit needs a step with a handler (a wait or child-flow step has no tasks)',
      v_step, v_flow using errcode = '22023';
  end if;
  v_queue := flowlane._step_queue(v_flow, v_step, v_index, v_mode, v_type, add_step.queue_name,
                                  add_step.child_flow);

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
    if v_existing.child_flow is distinct from add_step.child_flow then
      perform flowlane._shape_mismatch(v_flow, v_step, 'child_flow', v_existing.child_flow, add_step.child_flow);
    end if;
    if v_queue is not null then
      perform flowlane._ensure_queue(v_queue, v_flow, v_mode);
    end if;
    update flowlane.steps s
       set opt_max_attempts = max_attempts, opt_base_delay = base_delay,
           opt_timeout = timeout, opt_start_delay = start_delay,
           opt_concurrency_limit = add_step.concurrency_limit,
           opt_concurrency_key = nullif(add_step.concurrency_key, ''),
           opt_compensate = add_step.compensate
     where s.flow_slug = v_flow and s.step_slug = v_step
    returning * into v_row;
    if (v_existing.opt_concurrency_limit, v_existing.opt_concurrency_key)
       is distinct from (v_row.opt_concurrency_limit, v_row.opt_concurrency_key) then
      perform flowlane._step_limits_changed(v_flow, v_step);
    end if;
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
    required_input_pattern, forbidden_input_pattern, when_unmet, when_exhausted, queue_name, child_flow,
    opt_concurrency_limit, opt_concurrency_key, opt_compensate)
  values (v_flow, v_step, v_type, v_index, cardinality(v_sorted_deps), max_attempts, base_delay, timeout,
    start_delay, required_input_pattern, forbidden_input_pattern, v_unmet, v_exhausted, v_queue,
    add_step.child_flow, add_step.concurrency_limit, nullif(add_step.concurrency_key, ''), add_step.compensate)
  returning * into v_row;
  insert into flowlane.deps (flow_slug, dep_slug, step_slug)
  select v_flow, d, v_step from unnest(v_sorted_deps) d;
  return v_row;
end;
$$;

create or replace function flowlane.complete_task(
  run_id uuid, step_slug text, task_index int, output jsonb, worker_id uuid = null, attempt int = null
) returns setof flowlane.step_tasks
language plpgsql volatile
set search_path = ''
as $$
begin
  perform flowlane._require_claim('complete_task', complete_task.worker_id, complete_task.attempt);
  return query select * from flowlane._complete_batch(array[row(0, complete_task.run_id, complete_task.step_slug,
    complete_task.task_index, complete_task.output, complete_task.worker_id, complete_task.attempt,
    null, null, null)::flowlane._result_item]);
end;
$$;

-- a result is fenced by the claim it answers: the worker id and attempt are required (an
-- operator ends a task by hand with override_task, which is recorded)
create or replace function flowlane._require_claim(p_function text, p_worker_id uuid, p_attempt int) returns void
language plpgsql immutable
set search_path = ''
as $$
begin
  if p_worker_id is null or p_attempt is null then
    raise exception '%: a result needs the worker_id and attempt of its claim', p_function
      using errcode = '22023',
            hint = 'an operator completes a task by hand with flowlane.override_task(run_id, step_slug, '
                   'task_index, output, reason)';
  end if;
end;
$$;

-- the items of a complete_tasks/fail_tasks argument, validated together before
-- anything is locked; the first bad item raises with its position
create or replace function flowlane._result_items(p_function text, p_results jsonb, p_shape text)
returns flowlane._result_item[]
language plpgsql stable
set search_path = ''
as $$
declare
  v_bad record;
  v_key text;
  v_items flowlane._result_item[];
  v_misshapen boolean;
begin
  if p_results is null or jsonb_typeof(p_results) <> 'array' then
    raise exception '%: results must be a JSON array of %', p_function, p_shape using errcode = '22023';
  end if;
  -- every item in one pass: its casts are its check (a value that is not a uuid or an integer
  -- raises); only a batch with a bad item takes the exact check, item by item, in order
  begin
    select coalesce(array_agg(row(o - 1, (e ->> 'run_id')::uuid, e ->> 'step_slug', (e ->> 'task_index')::int,
                                  e -> 'output', (e ->> 'worker_id')::uuid, (e ->> 'attempt')::int,
                                  e ->> 'error_message', e ->> 'error_type', e ->> 'traceback'
                                 )::flowlane._result_item order by o), '{}'),
           coalesce(bool_or(jsonb_typeof(e) <> 'object'
                            or coalesce(jsonb_typeof(e -> 'run_id'), 'null') = 'null'
                            or coalesce(jsonb_typeof(e -> 'step_slug'), 'null') = 'null'
                            or coalesce(jsonb_typeof(e -> 'task_index'), 'null') = 'null'
                            or coalesce(jsonb_typeof(e -> 'worker_id'), 'null') = 'null'
                            or coalesce(jsonb_typeof(e -> 'attempt'), 'null') = 'null'), false)
      into v_items, v_misshapen
    from jsonb_array_elements(p_results) with ordinality as a (e, o);
  exception when invalid_text_representation or numeric_value_out_of_range then
    v_misshapen := true;
  end;
  if not v_misshapen then
    return v_items;
  end if;
  for v_bad in
    select e, o - 1 as pos from jsonb_array_elements(p_results) with ordinality as a (e, o) order by o
  loop
    if jsonb_typeof(v_bad.e) <> 'object' then
      raise exception '%: item % must be an object %, got %', p_function, v_bad.pos, p_shape,
        jsonb_typeof(v_bad.e) using errcode = '22023';
    end if;
    foreach v_key in array array['run_id', 'step_slug', 'task_index'] loop
      if coalesce(jsonb_typeof(v_bad.e -> v_key), 'null') = 'null' then
        raise exception '%: item % has no %', p_function, v_bad.pos, v_key using errcode = '22023';
      end if;
    end loop;
    foreach v_key in array array['run_id', 'worker_id', 'task_index', 'attempt'] loop
      begin
        if v_key in ('run_id', 'worker_id') then
          perform (v_bad.e ->> v_key)::uuid;
        else
          perform (v_bad.e ->> v_key)::int;
        end if;
      exception when invalid_text_representation or numeric_value_out_of_range then
        raise exception '%: item %: % must be %, got %', p_function, v_bad.pos, v_key,
          case when v_key in ('run_id', 'worker_id') then 'a uuid' else 'an integer' end,
          v_bad.e -> v_key using errcode = '22023';
      end;
    end loop;
    foreach v_key in array array['worker_id', 'attempt'] loop
      if coalesce(jsonb_typeof(v_bad.e -> v_key), 'null') = 'null' then
        raise exception '%: item % has no %', p_function, v_bad.pos, v_key using errcode = '22023',
          hint = 'a result is fenced by the worker_id and attempt of its claim';
      end if;
    end loop;
  end loop;
  raise exception '%: an item could not be read', p_function using errcode = 'XX000';
end;
$$;

-- An operator completes a started task by hand: the task completes with the given output as
-- its worker's result would, the attempt history records who (the session's login) and why,
-- and the claim is taken from the worker (last_worker_id cleared), so that its own result,
-- when it comes, is rejected and counted as such by the worker.
create or replace function flowlane.override_task(
  run_id uuid, step_slug text, task_index int, output jsonb, reason text
) returns setof flowlane.step_tasks
language plpgsql volatile
set search_path = ''
as $$
declare
  v_task flowlane.step_tasks;
begin
  if nullif(btrim(override_task.reason), '') is null then
    raise exception 'override_task: a reason is required (it is recorded in the task''s history)'
      using errcode = '22023';
  end if;
  perform 1 from flowlane.runs r where r.run_id = override_task.run_id for update;
  perform 1 from flowlane.step_states ss
  where ss.run_id = override_task.run_id and ss.step_slug = override_task.step_slug for update;
  select t.* into v_task from flowlane.step_tasks t
  where t.run_id = override_task.run_id and t.step_slug = override_task.step_slug
    and t.task_index = override_task.task_index
  for update;
  if v_task.run_id is null or v_task.status <> 'started' then
    raise exception 'override_task: task %/%/% is %: only a started task is completed by hand',
      override_task.run_id, override_task.step_slug, override_task.task_index,
      coalesce(v_task.status, 'not found') using errcode = '55000';
  end if;
  perform flowlane._complete_batch(array[row(0, v_task.run_id, v_task.step_slug, v_task.task_index,
    override_task.output, v_task.last_worker_id, v_task.attempts_count, null, null, null)::flowlane._result_item]);
  insert into flowlane.task_attempts
    (run_id, step_slug, task_index, attempt, retry_round, outcome, worker_id, error_type, error_message)
  select v_task.run_id, v_task.step_slug, v_task.task_index, greatest(v_task.attempts_count, 1), r.retry_count,
         'overridden', v_task.last_worker_id, 'Override',
         left(format('completed by hand by %s: %s', session_user, override_task.reason), 4000)
  from flowlane.runs r where r.run_id = v_task.run_id;
  update flowlane.step_tasks t set last_worker_id = null
  where t.run_id = v_task.run_id and t.step_slug = v_task.step_slug and t.task_index = v_task.task_index;
  return query select t.* from flowlane.step_tasks t
  where t.run_id = v_task.run_id and t.step_slug = v_task.step_slug and t.task_index = v_task.task_index;
end;
$$;

create or replace function flowlane.fail_task_detailed(
  run_id uuid, step_slug text, task_index int, error_message text, worker_id uuid = null, attempt int = null,
  error_type text = null, traceback text = null
) returns setof flowlane.step_tasks
language plpgsql volatile
set search_path = ''
as $$
begin
  perform flowlane._require_claim('fail_task', fail_task_detailed.worker_id, fail_task_detailed.attempt);
  return query select * from flowlane._fail_batch(array[row(0, fail_task_detailed.run_id,
    fail_task_detailed.step_slug, fail_task_detailed.task_index, null, fail_task_detailed.worker_id,
    fail_task_detailed.attempt, fail_task_detailed.error_message, fail_task_detailed.error_type,
    fail_task_detailed.traceback)::flowlane._result_item]);
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
begin
  v_run := flowlane._lock_run_to_retry(retry_run.run_id, array['failed']);
  perform flowlane._reopen_failed_steps(v_run.run_id);
  return flowlane._restart_run(v_run);
end;
$$;

-- rerun a failed or completed run from a step: the step and every step that depends on it,
-- transitively, run again from the beginning (map steps with all their tasks), with the
-- outputs of the other steps kept; on a failed run the failed steps are retried as
-- retry_run does. The completed tasks of the rerun steps stay in the attempt history
-- (outcome 'superseded', with their output), as do all their earlier attempts. A wait
-- step rerun completes again with the signal it received; a child-flow step is not rerun
-- (its child runs are runs of their own: retry them), so a rerun that would include one is
-- refused, as is a completed child run while its parent runs. The run waits for its flow's
-- concurrency limit like a retried one.
create or replace function flowlane.retry_run_from(run_id uuid, step_slug text) returns flowlane.runs
language plpgsql volatile
set search_path = ''
as $$
declare
  v_run flowlane.runs;
  v_steps text[];
  v_child text;
begin
  v_run := flowlane._lock_run_to_retry(retry_run_from.run_id, array['failed', 'completed']);
  if not exists (select 1 from flowlane.steps s
                 where s.flow_slug = v_run.flow_slug and s.step_slug = retry_run_from.step_slug) then
    raise exception 'flow % of run % has no step %', v_run.flow_slug, v_run.run_id,
      quote_literal(retry_run_from.step_slug) using errcode = '22023';
  end if;
  if v_run.status = 'completed' and exists (select 1 from flowlane.runs p
                                            where p.run_id = v_run.parent_run_id and p.status in ('started', 'waiting')) then
    -- its parent's step has counted its output already
    raise exception 'run % is a child run whose parent run % is still running: it cannot be rerun now',
      v_run.run_id, v_run.parent_run_id using errcode = '55000',
      hint = 'rerun it once the parent run has ended, or rerun the parent from its child-flow step''s dependents';
  end if;
  v_steps := flowlane._dependents(v_run.flow_slug, retry_run_from.step_slug);
  select s.step_slug into v_child from flowlane.steps s
  where s.flow_slug = v_run.flow_slug and s.step_slug = any (v_steps) and s.child_flow is not null
  order by s.step_index limit 1;
  if found then
    raise exception 'run % cannot be rerun from step %: step % starts child runs, which are not rerun',
      v_run.run_id, retry_run_from.step_slug, v_child using errcode = '55000',
      hint = 'retry the child runs themselves, or rerun from a step after it';
  end if;
  perform 1 from flowlane.step_states ss where ss.run_id = v_run.run_id order by ss.step_slug for update;
  perform flowlane._reset_steps(v_run, v_steps);
  if v_run.status = 'failed' then
    perform flowlane._reopen_failed_steps(v_run.run_id);
  end if;
  perform flowlane._count_what_remains(v_run.run_id, v_steps);
  return flowlane._restart_run(v_run);
end;
$$;

-- a run locked for a retry, refused unless it is in one of the given states
create or replace function flowlane._lock_run_to_retry(p_run_id uuid, p_states text[]) returns flowlane.runs
language plpgsql volatile
set search_path = ''
as $$
declare
  v_run flowlane.runs;
begin
  select * into v_run from flowlane.runs r where r.run_id = p_run_id for update;
  if not found then
    raise exception 'no run %', p_run_id using errcode = 'P0002';
  end if;
  if v_run.status <> all (p_states) then
    raise exception 'run % is %: only a % run can be retried', v_run.run_id, v_run.status,
      array_to_string(p_states, ' or ') using errcode = '55000';
  end if;
  if v_run.compensation is not null then
    raise exception 'run % has been compensated (compensation %): it is not retried', v_run.run_id,
      v_run.compensation using errcode = '55000',
      hint = 'start a new run; a stopped compensation resumes with flowlane.retry_compensation(run_id)';
  end if;
  return v_run;
end;
$$;

-- a step and every step that depends on it, transitively
create or replace function flowlane._dependents(p_flow text, p_step text) returns text[]
language sql stable
set search_path = ''
as $$
  with recursive down(step_slug) as (
    select p_step
    union
    select d.step_slug from flowlane.deps d join down on d.dep_slug = down.step_slug
    where d.flow_slug = p_flow
  )
  select array_agg(down.step_slug order by down.step_slug) from down
$$;

-- the given steps of a locked run start again from nothing: their completed tasks are kept
-- in the attempt history as superseded, their tasks and held tasks go, a wait step's signal
-- is kept to complete it again, and each step is as a new run makes it (a map step over a
-- kept step's output gets its size from that output)
create or replace function flowlane._reset_steps(p_run flowlane.runs, p_steps text[]) returns void
language plpgsql volatile
set search_path = ''
as $$
begin
  insert into flowlane.task_attempts
    (run_id, step_slug, task_index, attempt, retry_round, outcome, worker_id, output, failed_at)
  select t.run_id, t.step_slug, t.task_index, greatest(t.attempts_count, 1), p_run.retry_count, 'superseded',
         t.last_worker_id, t.output, t.completed_at
  from flowlane.step_tasks t
  join flowlane.steps s on s.flow_slug = t.flow_slug and s.step_slug = t.step_slug
  where t.run_id = p_run.run_id and t.step_slug = any (p_steps) and t.status = 'completed'
  order by s.step_index, t.task_index;
  delete from flowlane.held_tasks h where h.run_id = p_run.run_id and h.step_slug = any (p_steps);
  delete from flowlane.step_tasks t where t.run_id = p_run.run_id and t.step_slug = any (p_steps);
  update flowlane.signals g set applied_at = null
   where g.run_id = p_run.run_id and g.step_slug = any (p_steps);
  update flowlane.step_states ss
     set status = 'created', output = null, error_message = null, skip_reason = null, started_at = null,
         completed_at = null, failed_at = null, skipped_at = null, cancelled_at = null, remaining_tasks = null,
         initial_tasks = case when s.step_type <> 'map' then 1
                              when s.deps_count = 0 and jsonb_typeof(p_run.input) = 'array'
                                then jsonb_array_length(p_run.input) end
    from flowlane.steps s
   where ss.run_id = p_run.run_id and ss.step_slug = any (p_steps)
     and s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug;
  update flowlane.step_states ss
     set initial_tasks = case when ps.status = 'skipped' then 0 else jsonb_array_length(ps.output) end
    from flowlane.steps s, flowlane.deps d, flowlane.step_states ps
   where ss.run_id = p_run.run_id and ss.step_slug = any (p_steps)
     and s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug and s.step_type = 'map'
     and d.flow_slug = s.flow_slug and d.step_slug = s.step_slug
     and ps.run_id = ss.run_id and ps.step_slug = d.dep_slug
     and (ps.status = 'skipped' or (ps.status = 'completed' and jsonb_typeof(ps.output) = 'array'));
end;
$$;

-- the reset steps wait for their needs that have not completed (or been skipped), and the
-- run for each step that has not
create or replace function flowlane._count_what_remains(p_run_id uuid, p_steps text[]) returns void
language sql volatile
set search_path = ''
as $$
  update flowlane.step_states ss
     set remaining_deps = (select count(*) from flowlane.deps d
                           join flowlane.step_states ps on ps.run_id = ss.run_id and ps.step_slug = d.dep_slug
                           where d.flow_slug = ss.flow_slug and d.step_slug = ss.step_slug
                             and ps.status not in ('completed', 'skipped'))
   where ss.run_id = p_run_id and ss.step_slug = any (p_steps);
  update flowlane.runs r
     set remaining_steps = (select count(*) from flowlane.step_states ss
                            where ss.run_id = r.run_id and ss.status not in ('completed', 'skipped'))
   where r.run_id = p_run_id;
$$;

-- the steps of a locked failed run that its failure ended start over (retry_run)
create or replace function flowlane._reopen_failed_steps(p_run_id uuid) returns void
language plpgsql volatile
set search_path = ''
as $$
begin
  perform 1 from flowlane.step_states ss where ss.run_id = p_run_id order by ss.step_slug for update;

  -- steps the failure ended before they began wait for their needs again
  update flowlane.step_states ss
     set status = 'created', cancelled_at = null
   where ss.run_id = p_run_id and ss.status = 'cancelled' and ss.started_at is null;

  update flowlane.step_states ss
     set status = 'created', failed_at = null, error_message = null, remaining_tasks = null
   where ss.run_id = p_run_id and ss.status = 'failed'
     and not exists (select 1 from flowlane.step_tasks t
                     where t.run_id = ss.run_id and t.step_slug = ss.step_slug);
  perform flowlane._reopen_waits(p_run_id);
  delete from flowlane.held_tasks h where h.run_id = p_run_id;  -- held again when their steps restart
  -- unfinished tasks are replaced by fresh ones (a message id is an immutable identity);
  -- their attempts stay in flowlane.task_attempts
  delete from flowlane.step_tasks t
   using flowlane.step_states ss
   where t.run_id = p_run_id and ss.run_id = t.run_id and ss.step_slug = t.step_slug
     and ss.status in ('failed', 'started', 'cancelled') and t.status in ('failed', 'cancelled');
  update flowlane.step_states ss
     set status = 'started', failed_at = null, cancelled_at = null, error_message = null,
         started_at = coalesce(ss.started_at, now()),
         remaining_tasks = ss.initial_tasks - (select count(*) from flowlane.step_tasks t
                                               where t.run_id = ss.run_id and t.step_slug = ss.step_slug
                                                 and t.status = 'completed')
   where ss.run_id = p_run_id and ss.status in ('failed', 'started', 'cancelled');
end;
$$;

-- a locked run whose steps were reopened starts again with a fresh deadline, or waits for its
-- key on a flow with a concurrency limit (its tasks are sent when it begins, _begin_held_runs)
create or replace function flowlane._restart_run(p_run flowlane.runs) returns flowlane.runs
language plpgsql volatile
set search_path = ''
as $$
declare
  v_run flowlane.runs;
begin
  if p_run.concurrency_key is not null then
    update flowlane.runs r
       set status = 'waiting', failed_at = null, completed_at = null, output = null, error_message = null,
           deadline_at = null, retry_count = r.retry_count + 1, retried_at = now(),
           hold_seq = nextval('flowlane.hold_seq')
     where r.run_id = p_run.run_id;
    perform flowlane._begin_new_held_runs(array[p_run.run_id]);
    select * into v_run from flowlane.runs r where r.run_id = p_run.run_id;
    return v_run;
  end if;
  update flowlane.runs r
     set status = 'started', failed_at = null, completed_at = null, output = null, error_message = null,
         retry_count = r.retry_count + 1, retried_at = now(),
         deadline_at = flowlane._run_deadline(r.flow_slug, now())  -- a fresh deadline from the retry
   where r.run_id = p_run.run_id;
  -- one send_batch per queue, tasks in step order (held for their slot on a limited step)
  perform flowlane._send_missing_tasks(p_run.run_id);
  perform flowlane._progress(p_run.run_id);
  select * into v_run from flowlane.runs r where r.run_id = p_run.run_id;
  return v_run;
end;
$$;

-- many runs at once (`flowlane retry|cancel` with a filter), one bounded batch per call and
-- transaction: each run is locked in id order and retried, or cancelled, if it is still in
-- a state that allows it (a run that changed since it was chosen is passed over); returns
-- the runs it changed
create or replace function flowlane.retry_runs(run_ids uuid[]) returns setof uuid
language plpgsql volatile
set search_path = ''
as $$
declare
  v_id uuid;
begin
  perform flowlane._check_batch('retry_runs', run_ids);
  for v_id in
    select r.run_id from flowlane.runs r where r.run_id = any (run_ids) order by r.run_id for update
  loop
    continue when (select r.status <> 'failed' or r.compensation is not null
                   from flowlane.runs r where r.run_id = v_id);
    perform flowlane.retry_run(v_id);
    return next v_id;
  end loop;
end;
$$;

create or replace function flowlane.cancel_runs(run_ids uuid[], reason text = null) returns setof uuid
language plpgsql volatile
set search_path = ''
as $$
declare
  v_id uuid;
begin
  perform flowlane._check_batch('cancel_runs', run_ids);
  for v_id in
    select r.run_id from flowlane.runs r where r.run_id = any (run_ids) order by r.run_id for update
  loop
    continue when (select r.status from flowlane.runs r where r.run_id = v_id) not in ('started', 'waiting');
    perform flowlane.cancel_run(v_id, reason);
    return next v_id;
  end loop;
end;
$$;

-- a batch is bounded: the locks of its runs are held until its transaction commits
create or replace function flowlane._check_batch(p_function text, p_run_ids uuid[]) returns void
language plpgsql immutable
set search_path = ''
as $$
begin
  if cardinality(p_run_ids) > 1000 then
    raise exception '%: at most 1000 runs a call, got %', p_function, cardinality(p_run_ids)
      using errcode = '22023', hint = 'pass the runs in batches, one transaction each';
  end if;
end;
$$;

-- how long a worker counts as live after its last heartbeat (it beats every 5 s): the one
-- stale window of every reader (flowlane.defaults.STALE_AFTER names the same number)
create or replace function flowlane.worker_stale_after() returns interval
language sql immutable parallel safe
set search_path = ''
as $$ select interval '30 seconds' $$;

-- the one liveness rule: a worker is live while it has not stopped and its heartbeat is
-- within the stale window (worker list, queue list, run, the console, the metrics, serve)
create or replace function flowlane.worker_is_live(w flowlane.workers) returns boolean
language sql stable parallel safe
set search_path = ''
as $$ select w.stopped_at is null and w.last_heartbeat_at > now() - flowlane.worker_stale_after() $$;

-- What a process that cannot LISTEN polls instead of flowlane_definitions (through a
-- transaction-mode pooler a LISTEN stays in whichever server session ran it): a text that
-- changes whenever that channel is notified. A row's xmin is the transaction that last
-- wrote it; a deployment counts by its name and enabled flag, as its triggers do.
create or replace function flowlane.definitions_fingerprint() returns text
language sql stable
set search_path = ''
as $$
  select md5(concat_ws('/',
    (select string_agg(f.xmin::text, ',' order by f.xmin::text) from flowlane.flows f),
    (select string_agg(s.xmin::text, ',' order by s.xmin::text) from flowlane.steps s),
    (select string_agg(d.xmin::text, ',' order by d.xmin::text) from flowlane.deps d),
    (select string_agg(a.xmin::text, ',' order by a.xmin::text) from flowlane.aliases a),
    (select string_agg(q.xmin::text, ',' order by q.xmin::text) from flowlane.queues q),
    (select string_agg(w.deployment_name || ':' || w.enabled, ',' order by w.deployment_name)
     from flowlane.worker_deployments w)))
$$;

-- (p_stale_after is no longer read: it is kept for the previous release's callers; liveness
-- is flowlane.worker_is_live)
create or replace function flowlane.queue_metrics(p_stale_after int = 30)
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
create or replace function flowlane.pgmq_metrics() returns setof pgmq.metrics_result
language sql stable
set search_path = ''
as $$
  select * from pgmq.metrics_all()
$$;

-- the first problem of a schema as a contract (null when it is one): "<schema path>: what"
create or replace function flowlane._contract_problem(p_schema jsonb, p_at text = '') returns text
language plpgsql immutable
set search_path = ''
as $$
declare
  v_key text;
  v_value jsonb;
  v_found text;
begin
  if jsonb_typeof(p_schema) = 'boolean' then
    return null;
  end if;
  if jsonb_typeof(p_schema) is distinct from 'object' then
    return format('%s: a schema is a JSON object or a boolean, got %s', coalesce(nullif(p_at, ''), '/'),
                  coalesce(jsonb_typeof(p_schema), 'null'));
  end if;
  for v_key, v_value in select e.key, e.value from jsonb_each(p_schema) e order by e.key loop
    v_found := case
      when not v_key = any (flowlane.contract_keywords()) then
        format('keyword %s is outside the supported subset', v_key)
      when v_key = 'type' and not (
             (jsonb_typeof(v_value) = 'string' and v_value #>> '{}' in ('null', 'boolean', 'object', 'array', 'number', 'integer', 'string'))
             or (jsonb_typeof(v_value) = 'array' and jsonb_array_length(v_value) > 0 and not exists (
                   select 1 from jsonb_array_elements(v_value) t
                   where jsonb_typeof(t) <> 'string'
                      or t #>> '{}' not in ('null', 'boolean', 'object', 'array', 'number', 'integer', 'string')))) then
        'type must be a type name or a non-empty array of them'
      when v_key in ('properties') and jsonb_typeof(v_value) <> 'object' then
        'properties must be an object of schemas'
      when v_key = 'required' and (jsonb_typeof(v_value) <> 'array'
             or exists (select 1 from jsonb_array_elements(v_value) t where jsonb_typeof(t) <> 'string')) then
        'required must be an array of property names'
      when v_key in ('enum') and jsonb_typeof(v_value) <> 'array' then
        'enum must be an array'
      when v_key in ('minimum', 'maximum', 'exclusiveMinimum', 'exclusiveMaximum') and jsonb_typeof(v_value) <> 'number' then
        format('%s must be a number', v_key)
      when v_key in ('minLength', 'maxLength', 'minItems', 'maxItems') and not (
             jsonb_typeof(v_value) = 'number' and (v_value #>> '{}')::numeric >= 0
             and (v_value #>> '{}')::numeric = floor((v_value #>> '{}')::numeric)
             and (v_value #>> '{}')::numeric <= 2147483647) then
        format('%s must be a whole number from 0, got %s', v_key, v_value)
      when v_key = 'pattern' and jsonb_typeof(v_value) <> 'string' then
        'pattern must be a string'
      when v_key = 'pattern' and not flowlane._is_valid_regex(v_value #>> '{}') then
        'pattern is not a regular expression PostgreSQL can evaluate'
      else null end;
    if v_found is not null then
      return format('%s/%s: %s', p_at, flowlane._pointer_token(v_key), v_found);
    end if;
    if v_key in ('items', 'additionalProperties') then
      v_found := flowlane._contract_problem(v_value, p_at || '/' || v_key);
    elsif v_key = 'properties' then
      select flowlane._contract_problem(e.value, p_at || '/properties/' || flowlane._pointer_token(e.key)) into v_found
      from jsonb_each(v_value) e
      where flowlane._contract_problem(e.value, p_at || '/properties/' || flowlane._pointer_token(e.key)) is not null
      order by e.key limit 1;
    end if;
    if v_found is not null then
      return v_found;
    end if;
  end loop;
  return null;
end;
$$;

-- a count (minLength, maxLength, minItems, maxItems) as a number: JSON Schema reads 2.0 as the
-- count 2, so a whole number written with a fraction compares, compiles and is shown as 2
create or replace function flowlane._contract_count(p_count jsonb) returns numeric
language sql immutable
set search_path = ''
as $$ select trim_scale((p_count #>> '{}')::numeric) $$;

-- the schema as a SQL boolean expression over the jsonb value ``p_x`` (an expression): true
-- only for a valid value (null is read as false: every negated part is coalesced). One
-- ``case jsonb_typeof(...)`` per schema; literals quoted with format's %L; numbers pass through
-- a numeric cast first, counts through _contract_count.
create or replace function flowlane._contract_sql(p_schema jsonb, p_x text, p_depth int = 0) returns text
language plpgsql immutable
set search_path = ''
as $$
declare
  v_types text[];
  v_branches text[] := '{}';
  v_type text;
  v_checks text[];
  v_key text;
  v_value jsonb;
  v_e text := 'e' || p_depth;
  v_known text[] := array(select jsonb_object_keys(coalesce(p_schema -> 'properties', '{}')) order by 1);
  v_required text[] := array(select jsonb_array_elements_text(coalesce(p_schema -> 'required', '[]')));
  v_out text;
begin
  if p_schema = 'true'::jsonb or p_schema = '{}'::jsonb then
    return 'true';
  elsif p_schema = 'false'::jsonb then
    return 'false';
  end if;
  v_types := case when jsonb_typeof(p_schema -> 'type') = 'array' then array(select jsonb_array_elements_text(p_schema -> 'type'))
                  when p_schema ? 'type' then array[p_schema ->> 'type'] end;
  foreach v_type in array array['object', 'array', 'string', 'number', 'boolean', 'null'] loop
    if v_types is not null and not v_type = any (v_types) and not (v_type = 'number' and 'integer' = any (v_types)) then
      v_branches := v_branches || format('when %L then false', v_type);
      continue;
    end if;
    v_checks := '{}';
    if v_type = 'number' then
      if v_types is not null and not 'number' = any (v_types) then
        -- jsonb prints numbers without exponent: no '.' is an integer (1.0 is one too)
        v_checks := v_checks || format('(strpos((%1$s)::text, ''.'') = 0 or (%1$s)::numeric = trunc((%1$s)::numeric))', p_x);
      end if;
      v_checks := v_checks || array_remove(array[
        case when p_schema ? 'minimum' then format('(%s)::numeric >= %s', p_x, (p_schema ->> 'minimum')::numeric) end,
        case when p_schema ? 'maximum' then format('(%s)::numeric <= %s', p_x, (p_schema ->> 'maximum')::numeric) end,
        case when p_schema ? 'exclusiveMinimum' then format('(%s)::numeric > %s', p_x, (p_schema ->> 'exclusiveMinimum')::numeric) end,
        case when p_schema ? 'exclusiveMaximum' then format('(%s)::numeric < %s', p_x, (p_schema ->> 'exclusiveMaximum')::numeric) end], null);
    elsif v_type = 'string' then
      v_checks := array_remove(array[
        case when p_schema ? 'minLength' then format('length(%s #>> ''{}'') >= %s', p_x, flowlane._contract_count(p_schema -> 'minLength')) end,
        case when p_schema ? 'maxLength' then format('length(%s #>> ''{}'') <= %s', p_x, flowlane._contract_count(p_schema -> 'maxLength')) end,
        case when p_schema ? 'pattern' then format('(%s #>> ''{}'') ~ %L', p_x, p_schema ->> 'pattern') end], null);
    elsif v_type = 'array' then
      v_checks := array_remove(array[
        case when p_schema ? 'minItems' then format('jsonb_array_length(%s) >= %s', p_x, flowlane._contract_count(p_schema -> 'minItems')) end,
        case when p_schema ? 'maxItems' then format('jsonb_array_length(%s) <= %s', p_x, flowlane._contract_count(p_schema -> 'maxItems')) end,
        case when p_schema ? 'items' and p_schema -> 'items' not in ('true', '{}') then
          format('not exists (select from jsonb_array_elements(%s) %s where not coalesce(%s, false))', p_x, v_e,
                 flowlane._contract_sql(p_schema -> 'items', v_e || '.value', p_depth + 1)) end], null);
    elsif v_type = 'object' then
      if cardinality(v_required) > 0 then
        v_checks := v_checks || format('%s ?& %L::text[]', p_x, v_required);
      end if;
      for v_key, v_value in select e.key, e.value from jsonb_each(p_schema -> 'properties') e order by e.key loop
        continue when v_value in ('true', '{}');
        v_out := flowlane._contract_sql(v_value, format('(%s -> %L)', p_x, v_key), p_depth + 1);
        v_checks := v_checks || case when v_key = any (v_required) then format('coalesce(%s, false)', v_out)
                                     else format('(not %s ? %L or coalesce(%s, false))', p_x, v_key, v_out) end;
      end loop;
      if p_schema -> 'additionalProperties' = 'false'::jsonb then
        v_checks := v_checks || format('(%s - %L::text[]) = ''{}''::jsonb', p_x, v_known);
      elsif p_schema ? 'additionalProperties' and p_schema -> 'additionalProperties' not in ('true', '{}') then
        v_checks := v_checks || format('not exists (select from jsonb_each(%s) %s where not %s.key = any (%L::text[]) and not coalesce(%s, false))',
          p_x, v_e, v_e, v_known, flowlane._contract_sql(p_schema -> 'additionalProperties', v_e || '.value', p_depth + 1));
      end if;
    end if;
    v_branches := v_branches || format('when %L then %s', v_type,
                                       case when cardinality(v_checks) = 0 then 'true' else array_to_string(v_checks, ' and ') end);
  end loop;
  v_out := format('case jsonb_typeof(%s) %s end', p_x, array_to_string(v_branches, ' '));
  if v_out = format('case jsonb_typeof(%s) when ''object'' then true when ''array'' then true when ''string'' then true when ''number'' then true when ''boolean'' then true when ''null'' then true end', p_x) then
    v_out := 'true';
  end if;
  if p_schema ? 'enum' then
    v_out := v_out || format(' and %s = any (%L::jsonb[])', p_x, array(select e from jsonb_array_elements(p_schema -> 'enum') e));
  end if;
  if p_schema ? 'const' then
    v_out := v_out || format(' and %s = %L::jsonb', p_x, p_schema -> 'const');
  end if;
  return '(' || v_out || ')';
end;
$$;

create or replace function flowlane._contract_violation(p_schema jsonb, p_value jsonb, p_at text, p_schema_at text)
returns jsonb
language plpgsql immutable
set search_path = ''
as $$
declare
  v_type text := jsonb_typeof(p_value);
  v_number numeric;
  v_length bigint;
  v_key text;
  v_sub jsonb;
  v_i int;
  v_found jsonb;
  v_shown text := flowlane._contract_shown(p_value);
begin
  if p_schema = 'false'::jsonb then
    return flowlane._contract_failure(p_at, p_schema_at, '', format('%s is not allowed here', v_shown));
  elsif jsonb_typeof(p_schema) <> 'object' then
    return null;
  end if;
  if p_schema ? 'type' and not exists (
       select 1 from jsonb_array_elements_text(case when jsonb_typeof(p_schema -> 'type') = 'array' then p_schema -> 'type'
                                                    else jsonb_build_array(p_schema -> 'type') end) t
       where flowlane._contract_has_type(p_value, t)) then
    return flowlane._contract_failure(p_at, p_schema_at, 'type', format('%s is not of type %s', v_shown,
      (select string_agg(t, ' or ') from jsonb_array_elements_text(case when jsonb_typeof(p_schema -> 'type') = 'array'
        then p_schema -> 'type' else jsonb_build_array(p_schema -> 'type') end) t)));
  end if;
  if p_schema ? 'enum' and not exists (select 1 from jsonb_array_elements(p_schema -> 'enum') e where e = p_value) then
    return flowlane._contract_failure(p_at, p_schema_at, 'enum', format('%s is not one of %s', v_shown, p_schema -> 'enum'));
  end if;
  if p_schema ? 'const' and (p_schema -> 'const') <> p_value then
    return flowlane._contract_failure(p_at, p_schema_at, 'const', format('%s is not %s', v_shown, p_schema -> 'const'));
  end if;
  if v_type = 'number' then
    v_number := (p_value #>> '{}')::numeric;
    if v_number < (p_schema ->> 'minimum')::numeric then
      return flowlane._contract_failure(p_at, p_schema_at, 'minimum', format('%s is less than the minimum %s', v_shown, p_schema -> 'minimum'));
    elsif v_number > (p_schema ->> 'maximum')::numeric then
      return flowlane._contract_failure(p_at, p_schema_at, 'maximum', format('%s is greater than the maximum %s', v_shown, p_schema -> 'maximum'));
    elsif v_number <= (p_schema ->> 'exclusiveMinimum')::numeric then
      return flowlane._contract_failure(p_at, p_schema_at, 'exclusiveMinimum', format('%s is not greater than %s', v_shown, p_schema -> 'exclusiveMinimum'));
    elsif v_number >= (p_schema ->> 'exclusiveMaximum')::numeric then
      return flowlane._contract_failure(p_at, p_schema_at, 'exclusiveMaximum', format('%s is not less than %s', v_shown, p_schema -> 'exclusiveMaximum'));
    end if;
  elsif v_type = 'string' then
    v_length := length(p_value #>> '{}');
    if v_length < flowlane._contract_count(p_schema -> 'minLength') then
      return flowlane._contract_failure(p_at, p_schema_at, 'minLength', format('%s is shorter than %s characters', v_shown, flowlane._contract_count(p_schema -> 'minLength')));
    elsif v_length > flowlane._contract_count(p_schema -> 'maxLength') then
      return flowlane._contract_failure(p_at, p_schema_at, 'maxLength', format('%s is longer than %s characters', v_shown, flowlane._contract_count(p_schema -> 'maxLength')));
    elsif p_schema ? 'pattern' and not (p_value #>> '{}') ~ (p_schema ->> 'pattern') then
      return flowlane._contract_failure(p_at, p_schema_at, 'pattern', format('%s does not match the pattern %s', v_shown, p_schema -> 'pattern'));
    end if;
  elsif v_type = 'array' then
    if jsonb_array_length(p_value) < flowlane._contract_count(p_schema -> 'minItems') then
      return flowlane._contract_failure(p_at, p_schema_at, 'minItems', format('has fewer than %s items', flowlane._contract_count(p_schema -> 'minItems')));
    elsif jsonb_array_length(p_value) > flowlane._contract_count(p_schema -> 'maxItems') then
      return flowlane._contract_failure(p_at, p_schema_at, 'maxItems', format('has more than %s items', flowlane._contract_count(p_schema -> 'maxItems')));
    end if;
    if p_schema ? 'items' then
      for v_i in 0 .. jsonb_array_length(p_value) - 1 loop
        v_found := flowlane._contract_violation(p_schema -> 'items', p_value -> v_i, p_at || '/' || v_i, p_schema_at || '/items');
        if v_found is not null then
          return v_found;
        end if;
      end loop;
    end if;
  elsif v_type = 'object' then
    select k into v_key from jsonb_array_elements_text(p_schema -> 'required') with ordinality r(k, o)
    where not p_value ? k order by o limit 1;
    if found then
      return flowlane._contract_failure(p_at, p_schema_at, 'required', format('required property %s is missing', to_jsonb(v_key)));
    end if;
    for v_key, v_sub in select e.key, e.value from jsonb_each(p_schema -> 'properties') e
                        where p_value ? e.key order by e.key loop
      v_found := flowlane._contract_violation(v_sub, p_value -> v_key, p_at || '/' || flowlane._pointer_token(v_key),
                                              p_schema_at || '/properties/' || flowlane._pointer_token(v_key));
      if v_found is not null then
        return v_found;
      end if;
    end loop;
    if p_schema ? 'additionalProperties' then
      for v_key in select k from jsonb_object_keys(p_value) k
                   where not coalesce(p_schema -> 'properties', '{}') ? k order by k loop
        if p_schema -> 'additionalProperties' = 'false'::jsonb then
          return flowlane._contract_failure(p_at, p_schema_at, 'additionalProperties',
            format('property %s is not allowed (additionalProperties is false)', to_jsonb(v_key)));
        end if;
        v_found := flowlane._contract_violation(p_schema -> 'additionalProperties', p_value -> v_key,
          p_at || '/' || flowlane._pointer_token(v_key), p_schema_at || '/additionalProperties');
        if v_found is not null then
          return v_found;
        end if;
      end loop;
    end if;
  end if;
  return null;
end;
$$;

-- a run's parent and children for `flowlane run` and the console, its failure handler's run
-- (or the run whose failure it handles, 20_on_failure.sql) and its compensations (or the run
-- and step it compensates, 21_compensation.sql)
create or replace function flowlane.get_run_family(run_id uuid) returns jsonb
language sql stable
set search_path = ''
as $$
  select jsonb_build_object(
    'failure_handler', (select jsonb_build_object('run_id', h.run_id, 'flow_slug', h.flow_slug, 'status', h.status)
                        from flowlane.runs h where h.failure_of = r.run_id),
    'failure_of', (select jsonb_build_object('run_id', f.run_id, 'flow_slug', f.flow_slug, 'status', f.status)
                   from flowlane.runs f where f.run_id = r.failure_of),
    'compensations', flowlane.get_run_compensations(r.run_id),
    'compensation_of', (select jsonb_build_object('run_id', f.run_id, 'flow_slug', f.flow_slug, 'status', f.status,
                                                  'step_slug', c.step_slug)
                        from flowlane.runs f join flowlane.compensations c on c.run_id = f.run_id
                        where f.run_id = r.compensation_of and c.compensation_run_id = r.run_id),
    'parent', (select jsonb_build_object('run_id', p.run_id, 'flow_slug', p.flow_slug, 'status', p.status,
                                         'step_slug', r.parent_step_slug, 'task_index', r.parent_task_index)
               from flowlane.runs p where p.run_id = r.parent_run_id),
    'children', coalesce((select jsonb_agg(jsonb_build_object(
                            'run_id', c.run_id, 'flow_slug', c.flow_slug, 'status', c.status,
                            'step_slug', c.parent_step_slug, 'task_index', c.parent_task_index,
                            'started_at', c.started_at)
                          order by c.parent_step_slug, c.parent_task_index, c.started_at, c.run_id)
                          from flowlane.runs c where c.parent_run_id = r.run_id), '[]'::jsonb))
  from flowlane.runs r
  where r.run_id = get_run_family.run_id
$$;

-- the flow a failure handler names: a slug (of a flow or an alias), not the flow itself
create or replace function flowlane._check_on_failure(p_flow text, p_on_failure text) returns void
language plpgsql immutable
set search_path = ''
as $$
begin
  if p_on_failure is null then
    return;
  end if;
  perform flowlane._check_slug('on_failure flow', p_on_failure);
  if lower(p_on_failure) = lower(p_flow) then
    raise exception 'flow "%": on_failure names the flow itself', p_flow
      using errcode = '22023', hint = 'a failure handler is another flow (its own failure starts nothing more)';
  end if;
end;
$$;

-- what a failure handler's run gets as its input
create or replace function flowlane._failure_input(p_run flowlane.runs) returns jsonb
language sql stable
set search_path = ''
as $$
  select jsonb_build_object(
    'run_id', p_run.run_id,
    'flow', p_run.flow_slug,
    'status', p_run.status,
    'error', coalesce(p_run.error_message, p_run.cancel_reason),
    'failed_step', f.step_slug,
    'step_error', f.error_message,
    'outputs', coalesce((select jsonb_object_agg(ss.step_slug, ss.output) from flowlane.step_states ss
                         where ss.run_id = p_run.run_id and ss.status = 'completed'), '{}'::jsonb),
    'input', p_run.input)
  from (select null) n
  left join lateral (select ss.step_slug, ss.error_message from flowlane.step_states ss
                     where ss.run_id = p_run.run_id and ss.status = 'failed'
                     order by ss.failed_at, ss.step_slug limit 1) f on true;
$$;

-- a run of the flow's failure handler for a run that has just failed (or been cancelled),
-- once per run: a run retried that fails again does not start a second one. A handler that
-- cannot start (its flow gone, an input its contract refuses) leaves the failure as it is and
-- says so in the run's error message.
create or replace function flowlane._start_failure_handler() returns trigger
language plpgsql volatile
set search_path = ''
as $$
declare
  v_named text;
  v_on_cancel boolean;
  v_flow text;
  v_handler flowlane.runs;
begin
  select f.opt_on_failure, f.opt_on_failure_on_cancel into v_named, v_on_cancel
  from flowlane.flows f where f.flow_slug = new.flow_slug;
  if v_named is null or (new.status = 'cancelled' and not v_on_cancel)
     or exists (select 1 from flowlane.runs r where r.failure_of = new.run_id) then
    return null;
  end if;
  begin
    v_flow := flowlane.resolve_flow(v_named);
    perform flowlane._check_start_input(v_flow, flowlane._failure_input(new),
      format('failure handler %s of run %s', v_flow, new.run_id));
    select * into v_handler from flowlane._create_runs(v_flow, array[flowlane._failure_input(new)],
                                                       array[null::uuid]);
    update flowlane.runs r set failure_of = new.run_id where r.run_id = v_handler.run_id;
  exception when others then
    update flowlane.runs r
       set error_message = left(concat_ws('; ', r.error_message,
                                          format('failure handler %s could not start: %s', v_named, sqlerrm)), 4000)
     where r.run_id = new.run_id;
  end;
  return null;
end;
$$;

-- what a step was handed as a whole: the run input for a root step, the output a map step
-- maps, otherwise {dep: output} of its needs
create or replace function flowlane._step_input(p_run_id uuid, p_step_slug text) returns jsonb
language sql stable
set search_path = ''
as $$
  select case
           when s.deps_count = 0 then r.input
           when s.step_type = 'map' then
             (select ps.output from flowlane.deps d
              join flowlane.step_states ps on ps.run_id = r.run_id and ps.step_slug = d.dep_slug
              where d.flow_slug = s.flow_slug and d.step_slug = s.step_slug)
           else flowlane._condition_subject(r.run_id, s.step_slug)
         end
  from flowlane.runs r
  join flowlane.steps s on s.flow_slug = r.flow_slug and s.step_slug = p_step_slug
  where r.run_id = p_run_id;
$$;

-- a failed run's completed steps with a compensation, recorded once (a run retried and failed
-- again is not compensated twice); the first compensations start
create or replace function flowlane._begin_compensation() returns trigger
language plpgsql volatile
set search_path = ''
as $$
begin
  if exists (select 1 from flowlane.compensations c where c.run_id = new.run_id) then
    return null;
  end if;
  insert into flowlane.compensations (run_id, step_slug)
  select ss.run_id, ss.step_slug from flowlane.step_states ss
  join flowlane.steps s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
  where ss.run_id = new.run_id and ss.status = 'completed' and s.opt_compensate is not null;
  if found then
    update flowlane.runs r set compensation = 'running' where r.run_id = new.run_id;
    perform flowlane._advance_compensation(new.run_id);
  end if;
  return null;
end;
$$;

-- start every pending compensation of a run whose dependents' compensations have completed;
-- the run's compensation is 'completed' once all of them are. Nothing while it is stopped.
create or replace function flowlane._advance_compensation(p_run_id uuid) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_run flowlane.runs;
  v_step record;
begin
  select * into v_run from flowlane.runs r where r.run_id = p_run_id for update;
  if v_run.compensation is distinct from 'running' then
    return;
  end if;
  for v_step in
    select c.step_slug, s.opt_compensate from flowlane.compensations c
    join flowlane.steps s on s.flow_slug = v_run.flow_slug and s.step_slug = c.step_slug
    where c.run_id = p_run_id and c.status = 'pending'
      and not exists (select 1 from flowlane.compensations o
                      where o.run_id = p_run_id and o.status <> 'completed' and o.step_slug <> c.step_slug
                        and o.step_slug = any (flowlane._dependents(v_run.flow_slug, c.step_slug)))
    order by s.step_index desc
    for update of c
  loop
    perform flowlane._start_compensation(v_run, v_step.step_slug, v_step.opt_compensate);
    if (select r.compensation from flowlane.runs r where r.run_id = p_run_id) <> 'running' then
      return;  -- one could not start: the chain stops
    end if;
  end loop;
  if not exists (select 1 from flowlane.compensations c where c.run_id = p_run_id and c.status <> 'completed') then
    update flowlane.runs r set compensation = 'completed' where r.run_id = p_run_id;
  end if;
end;
$$;

-- one step's compensation run; one that cannot start (its flow gone, an input its contract
-- refuses) fails the compensation and stops the chain, saying why in the run's error message
create or replace function flowlane._start_compensation(p_run flowlane.runs, p_step_slug text, p_named text) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_flow text;
  v_input jsonb;
  v_started flowlane.runs;
begin
  v_input := jsonb_build_object('run_id', p_run.run_id, 'flow', p_run.flow_slug, 'step', p_step_slug,
    'input', flowlane._step_input(p_run.run_id, p_step_slug),
    'output', (select ss.output from flowlane.step_states ss
               where ss.run_id = p_run.run_id and ss.step_slug = p_step_slug));
  begin
    v_flow := flowlane.resolve_flow(p_named);
    perform flowlane._check_start_input(v_flow, v_input,
      format('compensation %s of step %s of run %s', v_flow, p_step_slug, p_run.run_id));
    select * into v_started from flowlane._create_runs(v_flow, array[v_input], array[null::uuid]);
  exception when others then
    update flowlane.compensations c set status = 'failed'
     where c.run_id = p_run.run_id and c.step_slug = p_step_slug;
    update flowlane.runs r
       set compensation = 'stopped',
           error_message = left(concat_ws('; ', r.error_message,
             format('compensation %s of step %s could not start: %s', p_named, p_step_slug, sqlerrm)), 4000)
     where r.run_id = p_run.run_id;
    return;
  end;
  update flowlane.compensations c set status = 'started', compensation_run_id = v_started.run_id
   where c.run_id = p_run.run_id and c.step_slug = p_step_slug;
  update flowlane.runs r set compensation_of = p_run.run_id where r.run_id = v_started.run_id
  returning * into v_started;
  if v_started.status not in ('started', 'waiting') then  -- it ended while it was created
    perform flowlane._compensation_ended(v_started);
  end if;
end;
$$;

create or replace function flowlane._report_compensation() returns trigger
language plpgsql volatile
set search_path = ''
as $$
begin
  perform flowlane._compensation_ended(new);
  return null;
end;
$$;

-- a compensation's run ended: completed, the chain goes on; failed or cancelled, it stops
create or replace function flowlane._compensation_ended(p_ended flowlane.runs) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_step text;
begin
  update flowlane.compensations c
     set status = case when p_ended.status = 'completed' then 'completed' else 'failed' end
   where c.compensation_run_id = p_ended.run_id and c.status = 'started'
  returning c.step_slug into v_step;
  if v_step is null then
    return;
  end if;
  if p_ended.status = 'completed' then
    perform flowlane._advance_compensation(p_ended.compensation_of);
  else
    update flowlane.runs r set compensation = 'stopped'
     where r.run_id = p_ended.compensation_of and r.compensation = 'running';
  end if;
end;
$$;

-- resume a stopped compensation: each failed compensation's run is retried (one that was
-- cancelled, or never started, starts again), and the chain goes on from there
create or replace function flowlane.retry_compensation(run_id uuid) returns flowlane.runs
language plpgsql volatile
set search_path = ''
as $$
declare
  v_run flowlane.runs;
  v_failed flowlane.compensations;
begin
  select * into v_run from flowlane.runs r where r.run_id = retry_compensation.run_id for update;
  if not found then
    raise exception 'no run %', retry_compensation.run_id using errcode = 'P0002';
  end if;
  if v_run.compensation is distinct from 'stopped' then
    raise exception 'run % has no stopped compensation (compensation: %)', v_run.run_id,
      coalesce(v_run.compensation, 'none') using errcode = '55000';
  end if;
  update flowlane.runs r set compensation = 'running' where r.run_id = v_run.run_id;
  for v_failed in
    select * from flowlane.compensations c where c.run_id = v_run.run_id and c.status = 'failed'
    order by c.step_slug for update
  loop
    if (select r.status from flowlane.runs r where r.run_id = v_failed.compensation_run_id) = 'failed' then
      perform flowlane.retry_run(v_failed.compensation_run_id);
      update flowlane.compensations c set status = 'started'
       where c.run_id = v_failed.run_id and c.step_slug = v_failed.step_slug;
    else
      update flowlane.compensations c set status = 'pending', compensation_run_id = null
       where c.run_id = v_failed.run_id and c.step_slug = v_failed.step_slug;
    end if;
  end loop;
  perform flowlane._advance_compensation(v_run.run_id);
  select * into v_run from flowlane.runs r where r.run_id = v_run.run_id;
  return v_run;
end;
$$;

-- the compensations of a run, in the order they start, for `flowlane run` and the console
create or replace function flowlane.get_run_compensations(run_id uuid) returns jsonb
language sql stable
set search_path = ''
as $$
  select coalesce(jsonb_agg(jsonb_build_object(
           'step_slug', c.step_slug, 'status', c.status, 'run_id', c.compensation_run_id,
           'flow_slug', x.flow_slug, 'run_status', x.status) order by s.step_index desc), '[]'::jsonb)
  from flowlane.compensations c
  join flowlane.runs r on r.run_id = c.run_id
  join flowlane.steps s on s.flow_slug = r.flow_slug and s.step_slug = c.step_slug
  left join flowlane.runs x on x.run_id = c.compensation_run_id
  where c.run_id = get_run_compensations.run_id
$$;

-- == Written by hand: what calls the functions (checks, defaults, triggers, data) ==

-- failure handlers: a run that fails (or is cancelled) starts its flow's failure handler
create trigger runs_start_failure_handler
  after update of status on flowlane.runs
  for each row
  when (old.status in ('started', 'waiting') and new.status in ('failed', 'cancelled') and new.failure_of is null)
  execute function flowlane._start_failure_handler();

-- compensation: a failed run starts its compensations, a compensation's run that ends moves
-- the chain on or stops it
create trigger runs_begin_compensation
  after update of status on flowlane.runs
  for each row
  when (old.status in ('started', 'waiting') and new.status = 'failed'
        and new.compensation_of is null and new.failure_of is null)
  execute function flowlane._begin_compensation();

create trigger runs_report_compensation
  after update of status on flowlane.runs
  for each row
  when (old.status in ('started', 'waiting') and new.status in ('completed', 'failed', 'cancelled')
        and new.compensation_of is not null)
  execute function flowlane._report_compensation();
