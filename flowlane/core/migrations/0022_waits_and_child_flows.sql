-- flowlane SQL Core 0022: wait steps and child flows.
-- Drafted by `python -m flowlane.core.draft_migration` from the engine source; reviewed.
--
-- A step of type wait has no handler, no queue and no task: a signal (flowlane.signal)
-- completes it with its payload; a signal that comes before the step starts is kept; a
-- timeout ends a step that waited too long (flowlane.expire_waits). A step with a child
-- flow (steps.child_flow) starts a run of that flow (one per element for a map step),
-- linked by runs.parent_*, and completes with its output; failures and cancellations go
-- both ways through row triggers on runs.status. steps.queue_name is null exactly for these
-- two kinds of step; stuck_runs does not count a run that waits for either.

-- hand-written
alter table flowlane.steps alter column queue_name drop not null;
alter table flowlane.steps add column child_flow text;
alter table flowlane.steps drop constraint steps_type_valid;
alter table flowlane.steps add constraint steps_type_valid check (step_type in ('single', 'map', 'wait'));
alter table flowlane.steps add constraint steps_queue_iff_handler
  check ((queue_name is null) = ((step_type = 'wait') or (child_flow is not null)));
alter table flowlane.steps add constraint steps_child_flow_not_wait
  check ((child_flow is null) or (step_type <> 'wait'));
alter table flowlane.step_states drop constraint step_states_skip_reason_valid;
alter table flowlane.step_states add constraint step_states_skip_reason_valid
  check ((skip_reason is null) or (skip_reason in ('condition_unmet', 'handler_failed', 'dependency_skipped', 'wait_timeout')));

alter table flowlane.runs add column parent_run_id uuid;
alter table flowlane.runs add column parent_step_slug text;
alter table flowlane.runs add column parent_task_index int;
alter table flowlane.runs add constraint runs_parent_complete
  check (((parent_run_id is null) = (parent_step_slug is null)) and ((parent_run_id is null) = (parent_task_index is null)));
create index runs_parent_idx on flowlane.runs (parent_run_id, parent_step_slug, parent_task_index)
  where (parent_run_id is not null);

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

drop function flowlane.add_step(text,text,text[],integer,integer,integer,integer,text,jsonb,jsonb,text,text,text);

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
  child_flow text = null
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
    required_input_pattern, forbidden_input_pattern, when_unmet, when_exhausted, queue_name, child_flow)
  values (v_flow, v_step, v_type, v_index, cardinality(v_sorted_deps), max_attempts, base_delay, timeout,
    start_delay, required_input_pattern, forbidden_input_pattern, v_unmet, v_exhausted, v_queue,
    add_step.child_flow)
  returning * into v_row;
  insert into flowlane.deps (flow_slug, dep_slug, step_slug)
  select v_flow, d, v_step from unnest(v_sorted_deps) d;
  return v_row;
end;
$$;

create or replace function flowlane.get_flow_shape(flow_slug text) returns jsonb
language sql stable
set search_path = ''
as $$
  select jsonb_build_object(
    'queue_mode', f.queue_mode,
    'steps', coalesce((
      select jsonb_agg(jsonb_build_object(
               'slug', s.step_slug,
               'type', s.step_type,
               'needs', coalesce((select jsonb_agg(d.dep_slug order by d.dep_slug collate "C")
                                  from flowlane.deps d
                                  where d.flow_slug = s.flow_slug and d.step_slug = s.step_slug), '[]'::jsonb),
               'if', s.required_input_pattern,
               'unless', s.forbidden_input_pattern,
               'when_unmet', s.when_unmet,
               'when_exhausted', s.when_exhausted,
               'queue', s.queue_name)
             || coalesce((select jsonb_build_object('output_schema', c.schema) from flowlane.contracts c
                          where c.flow_slug = s.flow_slug and coalesce(c.step_slug, '') = s.step_slug), '{}')
             -- a child-flow step's flow is part of its shape; other steps have no such key
             || case when s.child_flow is null then '{}'::jsonb
                     else jsonb_build_object('flow', s.child_flow) end
             order by s.step_index)
      from flowlane.steps s where s.flow_slug = f.flow_slug), '[]'::jsonb))
    || coalesce((select jsonb_build_object('input_schema', c.schema) from flowlane.contracts c
                 where c.flow_slug = f.flow_slug and coalesce(c.step_slug, '') = ''), '{}')
  from flowlane.flows f
  where f.flow_slug = get_flow_shape.flow_slug
$$;

-- readable differences between the stored shape and a given one
create or replace function flowlane._shape_differences(p_db jsonb, p_given jsonb) returns text[]
language plpgsql immutable
set search_path = ''
as $$
declare
  v_out text[] := '{}';
  v_db_steps jsonb := coalesce(p_db -> 'steps', '[]'::jsonb);
  v_given_steps jsonb := coalesce(p_given -> 'steps', '[]'::jsonb);
  v_n int;
  v_key text;
  v_db_step jsonb;
  v_given_step jsonb;
  v_label text;
begin
  if jsonb_typeof(p_given) is distinct from 'object' or jsonb_typeof(v_given_steps) <> 'array' then
    raise exception 'a flow shape is a JSON object with "queue_mode" and a "steps" array, got %',
      coalesce(left(p_given::text, 200), 'null') using errcode = '22023';
  end if;
  if (p_db -> 'queue_mode') is distinct from (p_given -> 'queue_mode') then
    v_out := v_out || format('queue_mode: %s in the database, %s in the given shape',
      flowlane._shape_text(p_db -> 'queue_mode'), flowlane._shape_text(p_given -> 'queue_mode'));
  end if;
  if (p_db -> 'input_schema') is distinct from (p_given -> 'input_schema') then
    v_out := v_out || format('input_schema: %s in the database, %s in the given shape',
      flowlane._shape_text(p_db -> 'input_schema'), flowlane._shape_text(p_given -> 'input_schema'));
  end if;
  for v_key in select k from jsonb_object_keys(p_given) k
               where k not in ('queue_mode', 'steps', 'input_schema') order by k loop
    v_out := v_out || format('unknown key %s in the given shape', v_key);
  end loop;
  if jsonb_array_length(v_db_steps) <> jsonb_array_length(v_given_steps) then
    v_out := v_out || format('step count: %s in the database, %s in the given shape',
      jsonb_array_length(v_db_steps), jsonb_array_length(v_given_steps));
  end if;
  v_n := greatest(jsonb_array_length(v_db_steps), jsonb_array_length(v_given_steps));
  for i in 0 .. v_n - 1 loop
    v_db_step := v_db_steps -> i;
    v_given_step := v_given_steps -> i;
    if v_db_step is null then
      v_out := v_out || format('step %s (%s): only in the given shape', i, flowlane._shape_text(v_given_step -> 'slug'));
      continue;
    elsif v_given_step is null then
      v_out := v_out || format('step %s (%s): only in the database', i, flowlane._shape_text(v_db_step -> 'slug'));
      continue;
    end if;
    if (v_db_step -> 'slug') is distinct from (v_given_step -> 'slug') then
      v_out := v_out || format('step %s: slug is %s in the database, %s in the given shape', i,
        flowlane._shape_text(v_db_step -> 'slug'), flowlane._shape_text(v_given_step -> 'slug'));
      continue;
    end if;
    v_label := format('step %s (%s)', i, flowlane._shape_text(v_db_step -> 'slug'));
    foreach v_key in array array['type', 'needs', 'if', 'unless', 'when_unmet', 'when_exhausted', 'queue', 'output_schema', 'flow'] loop
      if (v_db_step -> v_key) is distinct from (v_given_step -> v_key) then
        v_out := v_out || format('%s: %s is %s in the database, %s in the given shape', v_label, v_key,
          flowlane._shape_text(v_db_step -> v_key), flowlane._shape_text(v_given_step -> v_key));
      end if;
    end loop;
    for v_key in select k from jsonb_object_keys(v_given_step) k
                 where k not in ('slug', 'type', 'needs', 'if', 'unless', 'when_unmet', 'when_exhausted', 'queue', 'output_schema', 'flow')
                 order by k loop
      v_out := v_out || format('%s: unknown key %s in the given shape', v_label, v_key);
    end loop;
  end loop;
  return v_out;
end;
$$;

create or replace function flowlane.ensure_flow_compiled(flow_slug text, shape jsonb) returns jsonb
language plpgsql volatile
set search_path = ''
as $$
declare
  v_slug text := ensure_flow_compiled.flow_slug;
  v_step jsonb;
  v_diff text[];
begin
  perform pg_advisory_xact_lock(hashtext('flowlane.flow:' || lower(v_slug)));
  if not exists (select 1 from flowlane.flows f where f.flow_slug = v_slug) then
    -- validate the document before creating anything
    v_diff := flowlane._shape_differences(jsonb_build_object('queue_mode', shape -> 'queue_mode', 'steps', '[]'::jsonb), shape);
    perform flowlane.create_flow(v_slug, queue_mode => shape ->> 'queue_mode');
    for v_step in select e from jsonb_array_elements(shape -> 'steps') e loop
      perform flowlane.add_step(
        flow_slug => v_slug,
        step_slug => v_step ->> 'slug',
        deps_slugs => coalesce((select array_agg(n order by o) from jsonb_array_elements_text(v_step -> 'needs') with ordinality as x(n, o)), '{}'),
        step_type => coalesce(v_step ->> 'type', 'single'),
        required_input_pattern => nullif(v_step -> 'if', 'null'::jsonb),
        forbidden_input_pattern => nullif(v_step -> 'unless', 'null'::jsonb),
        when_unmet => coalesce(v_step ->> 'when_unmet', 'skip'),
        when_exhausted => coalesce(v_step ->> 'when_exhausted', 'fail'),
        queue_name => v_step ->> 'queue',
        child_flow => v_step ->> 'flow');
    end loop;
    perform flowlane._set_shape_contracts(v_slug, shape);
    v_diff := flowlane._shape_differences(flowlane.get_flow_shape(v_slug), shape);
    if cardinality(v_diff) > 0 then
      raise exception 'FLOWLANE_SHAPE_MISMATCH: the shape given for flow "%" is not what it compiles to', v_slug
        using errcode = '23514', detail = array_to_string(v_diff, E'\n'),
              hint = 'check the shape document (needs sorted by code point, defaults written out)';
    end if;
    update flowlane.flows f set shape_sealed_at = now() where f.flow_slug = v_slug;
    return jsonb_build_object('status', 'compiled', 'differences', '[]'::jsonb);
  end if;
  v_diff := flowlane._shape_differences(flowlane.get_flow_shape(v_slug), shape);
  if cardinality(v_diff) = 0 then
    update flowlane.flows f set shape_sealed_at = now()
     where f.flow_slug = v_slug and f.shape_sealed_at is null;
    return jsonb_build_object('status', 'verified', 'differences', '[]'::jsonb);
  end if;
  return jsonb_build_object('status', 'mismatch', 'differences', to_jsonb(v_diff));
end;
$$;

-- new runs of one concrete flow (inputs checked by the caller); returns them in input order
-- p_start_at in the future: the runs wait (status waiting) for the maintenance tick;
-- p_keys: each run's idempotency key within p_called (the name the caller started)
create or replace function flowlane._create_runs(p_flow text, p_inputs jsonb[], p_run_ids uuid[],
                                      p_start_at timestamptz = null, p_keys text[] = null,
                                      p_called text = null)
returns setof flowlane.runs
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_ids uuid[];
  v_waiting boolean := coalesce(p_start_at > now(), false);
begin
  perform flowlane._check_contract_inputs(p_flow, p_inputs);
  v_ids := array(select coalesce(p_run_ids[i], gen_random_uuid()) from generate_subscripts(p_inputs, 1) i order by i);
  insert into flowlane.runs (run_id, flow_slug, input, remaining_steps, trace_parent, status, start_at,
                             deadline_at, called_as, idempotency_key)
  select v_ids[i], p_flow, p_inputs[i], (select count(*) from flowlane.steps s where s.flow_slug = p_flow),
         flowlane._trace_parent(), case when v_waiting then 'waiting' else 'started' end, p_start_at,
         case when v_waiting then null else flowlane._run_deadline(p_flow, now()) end,
         case when p_keys[i] is not null then p_called end, p_keys[i]
  from generate_subscripts(p_inputs, 1) i order by i;
  insert into flowlane.step_states (flow_slug, run_id, step_slug, remaining_deps, initial_tasks)
  select p_flow, v_ids[i], s.step_slug, s.deps_count,
         case when s.step_type <> 'map' then 1
              when s.deps_count = 0 and jsonb_typeof(p_inputs[i]) = 'array' then jsonb_array_length(p_inputs[i])
              else null end
  from generate_subscripts(p_inputs, 1) i, flowlane.steps s
  where s.flow_slug = p_flow
  order by v_ids[i], s.step_slug;
  if not v_waiting then
    perform flowlane._progress_runs(v_ids);
  end if;
  return query select r.* from unnest(v_ids) with ordinality as u (run_id, ord)
               join flowlane.runs r on r.run_id = u.run_id and r.run_id = any (v_ids) order by u.ord;
end;
$$;

create or replace function flowlane._check_run_input() returns trigger
language plpgsql volatile
set search_path = ''
as $$
begin
  perform flowlane._check_json_limits(new.input, format('start_flow(%s): the run input', new.flow_slug),
    'flatten the input; workers refuse JSON nested deeper than the limit');
  return new;
end;
$$;

-- the size and depth limits of JSON that comes in (a run input, a signal's payload);
-- p_what names it in the error ("start_flow(f): the run input")
create or replace function flowlane._check_json_limits(p_value jsonb, p_what text, p_flatten_hint text) returns void
language plpgsql immutable
set search_path = ''
as $$
declare
  v_max_depth int := (flowlane.json_limits() ->> 'max_depth')::int;
  v_max_bytes int := (flowlane.json_limits() ->> 'max_bytes')::int;
  v_bytes int := octet_length(p_value::text);
begin
  if v_bytes > v_max_bytes then
    raise exception '% is % bytes of JSON, more than the limit of % bytes', p_what, v_bytes, v_max_bytes
      using errcode = '22023', hint = 'pass a reference (a URL, a storage key) instead of the data itself';
  end if;
  if flowlane.json_depth_exceeds(p_value, v_max_depth) then
    raise exception '% is nested deeper than % levels', p_what, v_max_depth
      using errcode = '22023', hint = p_flatten_hint;
  end if;
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
    if v_group.queue_name is null then  -- wait and child-flow steps: no task (17_waits.sql, 18_children.sql)
      perform flowlane._begin_waits(v_started);
      perform flowlane._start_children(v_started);
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
      and not flowlane._waits_outside_queues(r.run_id)
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
         retry_count = r.retry_count + 1, retried_at = now(),
         deadline_at = flowlane._run_deadline(r.flow_slug, now())  -- a fresh deadline from the retry
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

-- what every worker, `serve` and console process calls on its maintenance tick: each concern
-- is one function, safe with any number of callers at once. p_now: the time the tick acts
-- for (tests pass a later time instead of waiting).
create or replace function flowlane.maintenance_tick(p_now timestamptz = now()) returns jsonb
language plpgsql volatile
set search_path = ''
as $$
declare
  v_fired int := flowlane._fire_schedules(p_now);
  v_begun int := flowlane._begin_due_runs(p_now);
  v_failed int := flowlane._fail_overdue_runs(p_now);
  v_expired int := flowlane.expire_waits(p_now);
  v_pruned int := (select p.runs_deleted from flowlane.prune_runs(p_now) p);
begin
  return jsonb_build_object('fired', v_fired, 'begun', v_begun, 'failed', v_failed,
                            'waits_expired', v_expired, 'pruned', v_pruned);
end;
$$;

-- the queue of a new step: a wait step and a child-flow step have none (nothing is sent for
-- them, no worker serves them)
create or replace function flowlane._step_queue(
  p_flow_slug text, p_step_slug text, p_step_index int, p_mode text, p_type text, p_given text,
  p_child_flow text
) returns text
language plpgsql stable
set search_path = ''
as $$
begin
  if p_type <> 'wait' and p_child_flow is null then
    return flowlane._resolve_queue(p_flow_slug, p_step_slug, p_step_index, p_mode, p_given);
  end if;
  if p_given is not null then
    raise exception 'step "%" of flow "%" is a % step: it has no handler and no queue, so queue_name must be null, not "%"',
      p_step_slug, p_flow_slug, case when p_type = 'wait' then 'wait' else 'child-flow' end, p_given
      using errcode = '22023', hint = 'a wait step completes with a signal, a child-flow step with its child run; no worker serves either';
  end if;
  return null;
end;
$$;

-- a child-flow step names a flow or alias (resolved when the step starts) and is not a wait step
create or replace function flowlane._check_child_flow(p_flow text, p_step text, p_type text, p_child_flow text)
returns void
language plpgsql immutable
set search_path = ''
as $$
begin
  if p_child_flow is null then
    return;
  end if;
  if p_type = 'wait' then
    raise exception 'step "%" of flow "%": a wait step cannot start a child flow', p_step, p_flow
      using errcode = '22023';
  end if;
  if not flowlane.is_valid_slug(p_child_flow) then
    raise exception 'step "%" of flow "%": child_flow % is not a flow or alias slug', p_step, p_flow,
      quote_literal(p_child_flow) using errcode = '22023';
  end if;
end;
$$;

-- a started run that waits for a signal or a child run is not stuck: what moves it comes
-- from outside its queues
create or replace function flowlane._waits_outside_queues(p_run_id uuid) returns boolean
language sql stable
set search_path = ''
as $$
  select exists (
    select 1 from flowlane.step_states ss
    join flowlane.steps s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
    where ss.run_id = p_run_id and ss.status = 'started' and s.queue_name is null)
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

-- retry_run: a wait or child-flow step the run's failure ended while it waited starts
-- again from the beginning (a new wait; new child runs)
create or replace function flowlane._reopen_waits(p_run_id uuid) returns void
language sql volatile
set search_path = ''
as $$
  update flowlane.step_states ss
     set status = 'created', cancelled_at = null, started_at = null, remaining_tasks = null
    from flowlane.steps s
   where ss.run_id = p_run_id and ss.status = 'cancelled' and ss.started_at is not null
     and s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug and s.queue_name is null;
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
  perform flowlane._check_json_limits(payload, 'signal: the payload', 'flatten the payload');
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
    perform flowlane._give_up_step(v_due.run_id, v_due.step_slug,
      format('no signal within %s s', v_step.opt_timeout), 'wait_timeout');
  end loop;
  return v_ended;
end;
$$;

-- a wait or child-flow step that gave up (its caller holds the run) ends as its
-- when_exhausted says: fail (the step and its run fail with p_error), skip or skip-cascade
-- (skipped with p_reason and p_error; the run goes on)
create or replace function flowlane._give_up_step(p_run_id uuid, p_step_slug text, p_error text, p_reason text)
returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_mode text;
begin
  select s.when_exhausted into v_mode from flowlane.runs r
  join flowlane.steps s on s.flow_slug = r.flow_slug and s.step_slug = p_step_slug
  where r.run_id = p_run_id;
  if v_mode = 'fail' then
    update flowlane.step_states ss
       set status = 'failed', failed_at = now(), remaining_tasks = null, error_message = p_error
     where ss.run_id = p_run_id and ss.step_slug = p_step_slug;
    perform flowlane._fail_run(p_run_id, format('step %s: %s', p_step_slug, p_error));
    return;
  end if;
  if v_mode = 'skip-cascade' then
    perform flowlane._skip_cascade(p_run_id, p_step_slug, p_reason);
  else
    perform flowlane._skip_step(p_run_id, p_step_slug, p_reason);
  end if;
  update flowlane.step_states ss set error_message = p_error
   where ss.run_id = p_run_id and ss.step_slug = p_step_slug;
  perform flowlane._progress(p_run_id);
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

-- the started steps among p_started that have a child flow: one child run per task
create or replace function flowlane._start_children(p_started flowlane.step_states[]) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_task record;
begin
  for v_task in
    select st.run_id, st.step_slug, k as task_index
    from unnest(p_started) st
    join flowlane.steps s on s.flow_slug = st.flow_slug and s.step_slug = st.step_slug
    cross join lateral generate_series(0, st.initial_tasks - 1) as k
    where s.child_flow is not null
    order by st.run_id, s.step_index, k
  loop
    perform flowlane._start_child(v_task.run_id, v_task.step_slug, v_task.task_index);
  end loop;
end;
$$;

-- one child run for task p_index of a child-flow step (its input is what a handler would
-- get). A child that cannot start (no such flow, an input it refuses) is a failed attempt.
create or replace function flowlane._start_child(p_run_id uuid, p_step_slug text, p_index int) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_named text;
  v_flow text;
  v_task flowlane.step_tasks;
  v_input jsonb;
  v_child flowlane.runs;
begin
  perform 1 from flowlane.step_states ss join flowlane.runs r on r.run_id = ss.run_id
  where ss.run_id = p_run_id and ss.step_slug = p_step_slug and ss.status = 'started' and r.status = 'started';
  if not found then
    return;  -- an earlier child of the step could not start and ended the step or the run
  end if;
  select s.child_flow into v_named from flowlane.runs r
  join flowlane.steps s on s.flow_slug = r.flow_slug and s.step_slug = p_step_slug
  where r.run_id = p_run_id;
  v_task.run_id := p_run_id;
  v_task.step_slug := p_step_slug;
  v_task.task_index := p_index;
  select c.input into v_input from flowlane._claimed_inputs(array[v_task]) c;
  begin
    v_flow := flowlane.resolve_flow(v_named);
    perform flowlane._check_start_input(v_flow, v_input,
      format('child flow %s of step %s', v_flow, p_step_slug));
    select * into v_child from flowlane._create_runs(v_flow, array[v_input], array[null::uuid]);
  exception when others then
    perform flowlane._child_step_exhausted(p_run_id, p_step_slug,
      format('cannot start child flow %s: %s', v_named, sqlerrm));
    return;
  end;
  update flowlane.runs r
     set parent_run_id = p_run_id, parent_step_slug = p_step_slug, parent_task_index = p_index
   where r.run_id = v_child.run_id
  returning * into v_child;
  if v_child.status <> 'started' then  -- it ended while it was created, before it had a parent
    perform flowlane._child_ended(v_child);
  end if;
end;
$$;

create or replace function flowlane._report_to_parent() returns trigger
language plpgsql volatile
set search_path = ''
as $$
begin
  perform flowlane._child_ended(new);
  return null;
end;
$$;

-- a child run ended: its output completes its element (the step, with the last one), its
-- failure or cancellation is a failed attempt. Nothing when the parent run or step ended, or
-- the element already has a newer child (the child is late).
create or replace function flowlane._child_ended(p_child flowlane.runs) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_parent flowlane.runs;
  v_state flowlane.step_states;
  v_step flowlane.steps;
  v_attempts int;
  v_max int;
  v_map text;
begin
  select * into v_parent from flowlane.runs r where r.run_id = p_child.parent_run_id for update;
  if not found or v_parent.status <> 'started' then
    return;
  end if;
  select * into v_state from flowlane.step_states ss
  where ss.run_id = v_parent.run_id and ss.step_slug = p_child.parent_step_slug for update;
  if v_state.status <> 'started' or exists (
       select 1 from flowlane.runs c
       where c.parent_run_id = v_parent.run_id and c.parent_step_slug = p_child.parent_step_slug
         and c.parent_task_index = p_child.parent_task_index and c.run_id <> p_child.run_id
         and c.status in ('started', 'completed')) then
    return;
  end if;
  select * into v_step from flowlane.steps s
  where s.flow_slug = v_parent.flow_slug and s.step_slug = p_child.parent_step_slug;
  if p_child.status = 'completed' and v_step.step_type <> 'map' then
    -- a run's output is an object of its last steps' outputs, never the array a map needs
    select d.step_slug into v_map from flowlane.deps d
    join flowlane.steps m on m.flow_slug = d.flow_slug and m.step_slug = d.step_slug and m.step_type = 'map'
    where d.flow_slug = v_step.flow_slug and d.dep_slug = v_step.step_slug
    order by d.step_slug limit 1;
    if found then
      perform flowlane._child_step_exhausted(v_parent.run_id, v_step.step_slug,
        format('[TYPE_VIOLATION] step %s feeds map step %s and must output a JSON array; a child run outputs an object',
               v_step.step_slug, v_map));
      return;
    end if;
  end if;
  if p_child.status = 'completed' then
    update flowlane.step_states ss
       set remaining_tasks = ss.remaining_tasks - 1,
           status = case when ss.remaining_tasks = 1 then 'completed' else ss.status end,
           completed_at = case when ss.remaining_tasks = 1 then now() end,
           output = case when ss.remaining_tasks <> 1 then null
                         when v_step.step_type <> 'map' then p_child.output
                         else flowlane._children_outputs(v_parent.run_id, v_step.step_slug) end
     where ss.run_id = v_parent.run_id and ss.step_slug = v_step.step_slug
    returning * into v_state;
    if v_state.status = 'completed' then
      perform flowlane._steps_done(array[v_state]);
    end if;
    return;
  end if;
  select count(*) into v_attempts from flowlane.runs c
  where c.parent_run_id = v_parent.run_id and c.parent_step_slug = v_step.step_slug
    and c.parent_task_index = p_child.parent_task_index and c.started_at >= v_state.started_at;
  select o.max_attempts into v_max from flowlane.step_options o
  where o.flow_slug = v_step.flow_slug and o.step_slug = v_step.step_slug;
  if v_attempts < v_max then
    perform flowlane._start_child(v_parent.run_id, v_step.step_slug, p_child.parent_task_index);
    return;
  end if;
  perform flowlane._child_step_exhausted(v_parent.run_id, v_step.step_slug,
    format('child run %s (%s) %s after %s %s: %s', p_child.run_id, p_child.flow_slug, p_child.status,
           v_attempts, case when v_attempts = 1 then 'attempt' else 'attempts' end,
           coalesce(p_child.error_message, p_child.cancel_reason, 'no reason given')));
end;
$$;

-- a map step's output: its children's outputs in element order (the completed child of each)
create or replace function flowlane._children_outputs(p_run_id uuid, p_step_slug text) returns jsonb
language sql stable
set search_path = ''
as $$
  select coalesce(jsonb_agg(c.output order by c.parent_task_index), '[]'::jsonb)
  from flowlane.runs c
  where c.parent_run_id = p_run_id and c.parent_step_slug = p_step_slug and c.status = 'completed'
$$;

-- a child-flow step out of attempts: its other started children are cancelled and
-- when_exhausted applies (fail: the step and its run fail; skip, skip-cascade: the run goes on)
create or replace function flowlane._child_step_exhausted(p_run_id uuid, p_step_slug text, p_error text) returns void
language plpgsql volatile
set search_path = ''
as $$
begin
  -- (a failed run cancels all its children itself: runs_end_children)
  perform flowlane.cancel_run(c.run_id, format('step %s of parent run %s gave up', p_step_slug, p_run_id))
  from flowlane.runs c
  join flowlane.runs p on p.run_id = p_run_id
  join flowlane.steps s on s.flow_slug = p.flow_slug and s.step_slug = p_step_slug and s.when_exhausted <> 'fail'
  where c.parent_run_id = p_run_id and c.parent_step_slug = p_step_slug and c.status = 'started'
  order by c.run_id;
  perform flowlane._give_up_step(p_run_id, p_step_slug, p_error, 'handler_failed');
end;
$$;

-- a parent that fails or is cancelled cancels its started children
create or replace function flowlane._end_children() returns trigger
language plpgsql volatile
set search_path = ''
as $$
begin
  perform flowlane.cancel_run(c.run_id, format('parent run %s %s', new.run_id, new.status))
  from flowlane.runs c
  where c.parent_run_id = new.run_id and c.status = 'started'
  order by c.run_id;
  return null;
end;
$$;

-- a run's parent and children for `flowlane run` and the console
create or replace function flowlane.get_run_family(run_id uuid) returns jsonb
language sql stable
set search_path = ''
as $$
  select jsonb_build_object(
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


-- hand-written (triggers, after the functions they call)
create trigger runs_report_to_parent
  after update of status on flowlane.runs
  for each row
  when (old.status = 'started' and new.status <> 'started' and new.parent_run_id is not null)
  execute function flowlane._report_to_parent();

create trigger runs_end_children
  after update of status on flowlane.runs
  for each row
  when (old.status = 'started' and new.status in ('failed', 'cancelled'))
  execute function flowlane._end_children();
-- end of hand-written
