-- flowlane SQL Core 0023: wait payload contracts.
-- Drafted by `python -m flowlane.core.draft_migration` from the engine source; reviewed by a person.
-- A wait step's output_schema is the contract of the signal payload that completes it:
-- signal refuses a payload it rejects (22023, naming the path) before keeping or applying it.

-- deliver a signal to a run's wait step: it completes the step with the payload as its
-- output (and starts what depends on it), or is kept until the step starts. Refused, with
-- nothing changed: an unknown run or step, a step that is not a wait step, a finished run, a
-- finished step, a step that already has a signal, a payload its step cannot give (not an
-- array for a step a map step maps). Returns the signal; applied_at null means kept.
-- a wait step's output_schema is the contract of the payload that completes it: a payload
-- it refuses is refused like a run input, naming the path, before anything changes
create or replace function flowlane._check_signal_contract(p_flow text, p_step text, p_payload jsonb)
returns void
language plpgsql stable
set search_path = ''
as $$
declare
  v_schema jsonb;
  v_found jsonb;
begin
  select c.schema into v_schema from flowlane.contracts c
  where c.flow_slug = p_flow and c.step_slug = p_step;
  if not found then
    return;
  end if;
  v_found := flowlane.contract_violation(v_schema, p_payload);
  if v_found is not null then
    raise exception 'signal: the payload does not match the output_schema of step "%" of flow "%": %: %',
      p_step, p_flow, coalesce(nullif(v_found ->> 'path', ''), '/'), v_found ->> 'message'
      using errcode = '22023',
            hint = 'send a payload the step''s output_schema accepts; this signal changed nothing';
  end if;
end;
$$;

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
  perform flowlane._check_signal_contract(v_run.flow_slug, v_step.step_slug, payload);
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
