-- Definitions: flows, steps and their shape, aliases; written only by reviewed compiled SQL.

-- two transactions applying the same flow file raced between the existence
-- check and the insert and one failed on flows_slug_ci_unique; the lock on
-- the lowercase slug makes the second wait and then find the first's rows.
-- retention: seconds a finished run is kept; null keeps runs for ever (so, unlike
-- the other options, leaving it out is what gives the default)
create function flowlane.create_flow(
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
  concurrency_when_full text = null,
  debounce_key text = null,
  debounce_period int = null,
  debounce_max_wait int = null,
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
  perform flowlane._check_when_full(format('flow "%s"', create_flow.flow_slug), create_flow.concurrency_limit,
    create_flow.concurrency_when_full);
  perform flowlane._check_debounce(format('flow "%s"', create_flow.flow_slug), create_flow.debounce_key,
    create_flow.debounce_period, create_flow.debounce_max_wait);
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
                                   opt_concurrency_key, opt_priority, opt_concurrency_when_full,
                                   opt_debounce_key, opt_debounce_period, opt_debounce_max_wait, opt_on_failure,
                                   opt_on_failure_on_cancel)
  values (create_flow.flow_slug, coalesce(max_attempts, flowlane._flow_option_default('max_attempts')),
          coalesce(base_delay, flowlane._flow_option_default('base_delay')),
          coalesce(timeout, flowlane._flow_option_default('timeout')), v_mode, create_flow.retention,
          create_flow.deadline, create_flow.dedup_key, create_flow.concurrency_limit,
          nullif(create_flow.concurrency_key, ''), create_flow.priority,
          coalesce(create_flow.concurrency_when_full, 'queue'),
          nullif(create_flow.debounce_key, ''), create_flow.debounce_period, create_flow.debounce_max_wait,
          create_flow.on_failure, coalesce(create_flow.on_failure_on_cancel, false))
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
        opt_concurrency_when_full = excluded.opt_concurrency_when_full,
        opt_debounce_key = excluded.opt_debounce_key,
        opt_debounce_period = excluded.opt_debounce_period,
        opt_debounce_max_wait = excluded.opt_debounce_max_wait,
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

create function flowlane._shape_mismatch(p_flow text, p_step text, p_field text, p_db text, p_given text)
returns void
language plpgsql stable
set search_path = ''
as $$
begin
  raise exception 'FLOWLANE_SHAPE_MISMATCH: step "%" of flow "%" already exists with a different %: % in the database, % given',
    p_step, p_flow, p_field, coalesce(p_db, 'null'), coalesce(p_given, 'null')
    using errcode = '23514',
          hint = 'the shape of a flow never changes once created; create a new flow version (a new slug)';
end;
$$;

create function flowlane.add_step(
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
  compensate text = null,
  cache_ttl int = null,
  cache_key text[] = null,
  cache_fingerprint text = null
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
  perform flowlane._check_cache(format('step "%s" of flow "%s"', v_step, v_flow), add_step.cache_ttl,
    add_step.cache_key, v_type <> 'wait' and add_step.child_flow is null);
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
           opt_compensate = add_step.compensate,
           opt_cache_ttl = add_step.cache_ttl, opt_cache_key = add_step.cache_key,
           opt_cache_fingerprint = case when add_step.cache_ttl is not null then add_step.cache_fingerprint end
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
    opt_concurrency_limit, opt_concurrency_key, opt_compensate, opt_cache_ttl, opt_cache_key, opt_cache_fingerprint)
  values (v_flow, v_step, v_type, v_index, cardinality(v_sorted_deps), max_attempts, base_delay, timeout,
    start_delay, required_input_pattern, forbidden_input_pattern, v_unmet, v_exhausted, v_queue,
    add_step.child_flow, add_step.concurrency_limit, nullif(add_step.concurrency_key, ''), add_step.compensate,
    add_step.cache_ttl, add_step.cache_key,
    case when add_step.cache_ttl is not null then add_step.cache_fingerprint end)
  returning * into v_row;
  insert into flowlane.deps (flow_slug, dep_slug, step_slug)
  select v_flow, d, v_step from unnest(v_sorted_deps) d;
  return v_row;
end;
$$;

-- persisted identities never change: a row trigger that fires only when an
-- UPDATE names these columns (ordinary status/output updates never do)
create function flowlane._forbid_identity_change() returns trigger
language plpgsql
set search_path = ''
as $$
begin
  raise exception 'flowlane: %.% is an immutable identity and cannot be updated', tg_table_name, tg_argv[0]
    using errcode = '55000';
end;
$$;

create trigger steps_queue_immutable
  before update of queue_name on flowlane.steps
  for each row
  when (old.queue_name is distinct from new.queue_name)
  execute function flowlane._forbid_identity_change('queue_name');

create trigger step_tasks_queue_identity_immutable
  before update of queue_name, message_id on flowlane.step_tasks
  for each row
  when (old.queue_name is distinct from new.queue_name or old.message_id is distinct from new.message_id)
  execute function flowlane._forbid_identity_change('queue_name/message_id');

create function flowlane.get_flow_shape(flow_slug text) returns jsonb
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

create function flowlane._shape_text(v jsonb) returns text
language sql immutable
set search_path = ''
as $$
  select case when v is null then 'absent'
              when jsonb_typeof(v) = 'string' then v #>> '{}'
              else v::text end
$$;

-- readable differences between the stored shape and a given one
create function flowlane._shape_differences(p_db jsonb, p_given jsonb) returns text[]
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

create function flowlane.ensure_flow_shape(flow_slug text, shape jsonb) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_db jsonb := flowlane.get_flow_shape(ensure_flow_shape.flow_slug);
  v_diff text[];
begin
  if v_db is null then
    raise exception 'FLOWLANE_SHAPE_MISMATCH: flow "%" does not exist in the database', ensure_flow_shape.flow_slug
      using errcode = '23514';
  end if;
  v_diff := flowlane._shape_differences(v_db, shape);
  if cardinality(v_diff) > 0 then
    raise exception 'FLOWLANE_SHAPE_MISMATCH: flow "%" has a different shape in the database', ensure_flow_shape.flow_slug
      using errcode = '23514',
            detail = array_to_string(v_diff, E'\n'),
            hint = 'a flow''s shape never changes once applied; give the changed flow a new slug (a new version)';
  end if;
  update flowlane.flows f set shape_sealed_at = flowlane._now()
   where f.flow_slug = ensure_flow_shape.flow_slug and f.shape_sealed_at is null;
end;
$$;

create function flowlane.verify_flow(flow_slug text, shape jsonb) returns jsonb
language plpgsql stable
set search_path = ''
as $$
declare
  v_db jsonb := flowlane.get_flow_shape(verify_flow.flow_slug);
  v_diff text[];
begin
  if v_db is null then
    return jsonb_build_object('status', 'missing', 'differences', '[]'::jsonb);
  end if;
  v_diff := flowlane._shape_differences(v_db, shape);
  return jsonb_build_object('status', case when cardinality(v_diff) = 0 then 'verified' else 'mismatch' end,
                            'differences', to_jsonb(v_diff));
end;
$$;

create function flowlane.ensure_flow_compiled(flow_slug text, shape jsonb) returns jsonb
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
    update flowlane.flows f set shape_sealed_at = flowlane._now() where f.flow_slug = v_slug;
    return jsonb_build_object('status', 'compiled', 'differences', '[]'::jsonb);
  end if;
  v_diff := flowlane._shape_differences(flowlane.get_flow_shape(v_slug), shape);
  if cardinality(v_diff) = 0 then
    update flowlane.flows f set shape_sealed_at = flowlane._now()
     where f.flow_slug = v_slug and f.shape_sealed_at is null;
    return jsonb_build_object('status', 'verified', 'differences', '[]'::jsonb);
  end if;
  return jsonb_build_object('status', 'mismatch', 'differences', to_jsonb(v_diff));
end;
$$;

create function flowlane.resolve_flow(flow_slug_or_alias text) returns text
language plpgsql stable
set search_path = ''
as $$
declare
  v_slug text;
begin
  select a.flow_slug into v_slug from flowlane.aliases a where a.alias = flow_slug_or_alias;
  if found then
    return v_slug;
  end if;
  select f.flow_slug into v_slug from flowlane.flows f where f.flow_slug = flow_slug_or_alias;
  if not found then
    raise exception 'unknown flow "%" (no flow or alias has this slug)', flow_slug_or_alias
      using errcode = 'P0002',
            hint = 'create the flow (apply its compiled SQL) or its alias before starting runs';
  end if;
  return v_slug;
end;
$$;

-- Flow and alias slugs share one case-insensitive namespace, with one exception: an alias
-- may take the name of a flow it lists as a version (active or draining), spelled the
-- same. The alias adopts the name: a project that started with a bare concrete slug
-- (`hello`) puts its next version behind an alias `hello` (active hello_v2, draining
-- hello) and callers keep their name, which now resolves to the alias (resolve_flow).
create function flowlane._alias_may_take_flow_name(alias text, flow_slug text, versions text[])
returns boolean
language sql immutable
set search_path = ''
as $$
  select _alias_may_take_flow_name.alias = _alias_may_take_flow_name.flow_slug
     and _alias_may_take_flow_name.flow_slug = any (_alias_may_take_flow_name.versions)
$$;

create function flowlane.set_alias(alias text, flow_slug text, draining text[] = '{}')
returns flowlane.aliases
language plpgsql volatile
set search_path = ''
as $$
declare
  v_alias text := set_alias.alias;
  v_active text := set_alias.flow_slug;
  v_draining text[] := coalesce(set_alias.draining, '{}');
  v_row flowlane.aliases;
  v_missing text;
  v_other text;
begin
  perform flowlane._check_slug('alias', v_alias);
  perform pg_advisory_xact_lock(hashtext('flowlane.alias:' || lower(v_alias)));
  select f.flow_slug into v_other from flowlane.flows f where lower(f.flow_slug) = lower(v_alias);
  if found and not flowlane._alias_may_take_flow_name(v_alias, v_other, array[v_active] || v_draining) then
    raise exception 'alias "%" conflicts with flow "%" (flow and alias slugs share one namespace)',
      v_alias, v_other
      using errcode = '23505',
            hint = format('an alias may take the name of a flow only while it lists that flow, spelled the same, as its active or draining version (draining => array[%L])', v_other);
  end if;
  select a.alias into v_other from flowlane.aliases a
  where lower(a.alias) = lower(v_alias) and a.alias <> v_alias;
  if found then
    raise exception 'alias "%" conflicts with alias "%" (alias slugs are unique case-insensitively)',
      v_alias, v_other using errcode = '23505';
  end if;
  select s into v_missing from unnest(array[v_active] || v_draining) s
  where s is null or not exists (select 1 from flowlane.flows f where f.flow_slug = s)
  limit 1;
  if found then
    raise exception 'alias "%": flow "%" does not exist', v_alias, coalesce(v_missing, 'NULL')
      using errcode = 'P0002', hint = 'apply the compiled SQL of the flow before its alias';
  end if;
  if v_active = any (v_draining) or cardinality(v_draining) <> (select count(distinct d) from unnest(v_draining) d) then
    raise exception 'alias "%": a version is listed twice (active %, draining %)', v_alias, v_active, v_draining
      using errcode = '22023';
  end if;
  select * into v_row from flowlane.aliases a where a.alias = v_alias for update;
  if found and v_row.flow_slug = v_active and v_row.draining = v_draining then
    return v_row;  -- unchanged: no history row
  end if;
  insert into flowlane.aliases as a (alias, flow_slug, draining)
  values (v_alias, v_active, v_draining)
  on conflict on constraint aliases_pkey do update
    set flow_slug = excluded.flow_slug, draining = excluded.draining, updated_at = flowlane._clock_timestamp()
  returning * into v_row;
  insert into flowlane.alias_history (alias, flow_slug, draining)
  values (v_alias, v_active, v_draining);
  return v_row;
end;
$$;

-- a new flow may not take the name of an alias (case-insensitive); the flow an alias
-- adopted the name of is the one exception (create_flow's upsert when it is applied again)
create function flowlane._forbid_flow_named_like_alias() returns trigger
language plpgsql
set search_path = ''
as $$
declare
  v_alias text;
begin
  select a.alias into v_alias from flowlane.aliases a
  where lower(a.alias) = lower(new.flow_slug)
    and not flowlane._alias_may_take_flow_name(a.alias, new.flow_slug, array[a.flow_slug] || a.draining);
  if found then
    raise exception 'flow slug "%" conflicts with alias "%" (flow and alias slugs share one namespace)',
      new.flow_slug, v_alias using errcode = '23505';
  end if;
  return new;
end;
$$;

create trigger flows_not_named_like_alias
  before insert on flowlane.flows
  for each row execute function flowlane._forbid_flow_named_like_alias();

create function flowlane._flow_delete_keeps_aliases_sound() returns trigger
language plpgsql
set search_path = ''
as $$
declare
  v_aliases text;
begin
  select string_agg(a.alias, ', ' order by a.alias) into v_aliases
  from flowlane.aliases a where a.flow_slug = old.flow_slug;
  if v_aliases is not null then
    raise exception 'flow "%" is the active version of alias %', old.flow_slug, v_aliases
      using errcode = '23503',
            hint = 'move the alias to another version (flowlane.set_alias) before deleting the flow';
  end if;
  with changed as (
    update flowlane.aliases a
       set draining = array_remove(a.draining, old.flow_slug), updated_at = flowlane._clock_timestamp()
     where old.flow_slug = any (a.draining)
    returning a.alias, a.flow_slug, a.draining
  )
  insert into flowlane.alias_history (alias, flow_slug, draining)
  select c.alias, c.flow_slug, c.draining from changed c order by c.alias;
  return old;
end;
$$;

create trigger flows_delete_keeps_aliases_sound
  before delete on flowlane.flows
  for each row execute function flowlane._flow_delete_keeps_aliases_sound();

-- step_tasks has no index on flow_slug (one would cost every enqueue): its
-- rows are found through the flow's runs (primary key prefix), so deleting a
-- small flow costs the same next to 10k or 100k other tasks
-- (benchmarks/recovery_scaling.py)
create function flowlane.delete_flow_and_data(flow_slug text) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_runs uuid[];
  v_active flowlane.step_tasks[];
  v_trigger text;
begin
  -- a trigger starting a missing flow would fail every write of its table
  select t.trigger_name into v_trigger from flowlane.triggers t
  where t.flow_name = delete_flow_and_data.flow_slug order by t.trigger_name limit 1;
  if found then
    raise exception 'flow "%" is started by trigger "%"', delete_flow_and_data.flow_slug, v_trigger
      using errcode = '2BP01', hint = 'remove the trigger''s document and apply, or point it at another flow';
  end if;
  v_runs := array(select r.run_id from flowlane.runs r where r.flow_slug = delete_flow_and_data.flow_slug
                  order by r.run_id for update);
  select coalesce(array_agg(t order by t.queue_name, t.message_id), '{}') into v_active
  from flowlane.step_tasks t
  where t.run_id = any (v_runs) and t.status in ('queued', 'started');
  perform flowlane._archive_tasks(v_active);
  delete from flowlane.step_tasks t where t.run_id = any (v_runs);
  delete from flowlane.step_states ss where ss.run_id = any (v_runs);
  delete from flowlane.runs r where r.run_id = any (v_runs);
  delete from flowlane.step_cache e where e.flow_slug = delete_flow_and_data.flow_slug;
  delete from flowlane.deps d where d.flow_slug = delete_flow_and_data.flow_slug;
  delete from flowlane.steps s where s.flow_slug = delete_flow_and_data.flow_slug;
  delete from flowlane.flows f where f.flow_slug = delete_flow_and_data.flow_slug;
end;
$$;

-- Definition changes are announced: every row change of flows, steps,
-- dependencies, aliases or queues (and a worker deployment's existence or enabled
-- flag, 09_fleet.sql) notifies the channel flowlane_definitions with the table's
-- name, delivered when its transaction commits, once per table and transaction
-- (PostgreSQL folds repeats). Workers re-check their coverage when notified and
-- `flowlane serve` derives its set of workers again. Nothing here changes a definition.
create function flowlane._notify_definitions_changed()
returns trigger
language plpgsql
set search_path = ''
as $$
begin
  perform pg_notify('flowlane_definitions', tg_table_name);
  return null;
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
