-- Wait steps: a step of type wait has no handler, no queue and no task. It waits in the
-- SQL Core until a signal (flowlane.signal) brings its output; the signal completes it, in
-- the transaction that records the signal, and starts its dependents. A signal that comes
-- before its step is reached is kept and completes the step when it starts. A wait step
-- with a timeout that passes without a signal ends as its when_exhausted says
-- (expire_waits, called periodically).
--
-- Lock order: the run, then its step states (as everywhere else).

-- every signal a run's wait steps received: applied_at is when it completed its step
-- (null: kept until the step starts); one per step and run (a second one is refused)
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

-- when a waiting step with a timeout gives up; a row outlives its step (a signal, the run's
-- end) until expire_waits meets it
create table flowlane.wait_deadlines (
  run_id uuid not null,
  step_slug text not null,
  expires_at timestamptz not null,
  constraint wait_deadlines_pkey primary key (run_id, step_slug),
  constraint wait_deadlines_run_id_fkey foreign key (run_id) references flowlane.runs(run_id) on delete cascade
);

create index wait_deadlines_expiry_idx on flowlane.wait_deadlines (expires_at);

-- the queue of a new step: a wait step and a child-flow step have none (nothing is sent for
-- them, no worker serves them)
create function flowlane._step_queue(
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
create function flowlane._check_child_flow(p_flow text, p_step text, p_type text, p_child_flow text)
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
create function flowlane._waits_outside_queues(p_run_id uuid) returns boolean
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
create function flowlane._begin_waits(p_started flowlane.step_states[]) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_done flowlane.step_states[];
begin
  insert into flowlane.wait_deadlines as w (run_id, step_slug, expires_at)
  select st.run_id, st.step_slug, flowlane._now() + make_interval(secs => s.opt_timeout)
  from unnest(p_started) st
  join flowlane.steps s on s.flow_slug = st.flow_slug and s.step_slug = st.step_slug
  where s.step_type = 'wait' and s.opt_timeout is not null
  order by st.run_id, st.step_slug
  on conflict on constraint wait_deadlines_pkey do update set expires_at = excluded.expires_at;
  with kept as (
    update flowlane.signals g set applied_at = greatest(flowlane._now(), g.received_at)
      from unnest(p_started) st
      join flowlane.steps s on s.flow_slug = st.flow_slug and s.step_slug = st.step_slug
     where s.step_type = 'wait' and g.run_id = st.run_id and g.step_slug = st.step_slug
       and g.applied_at is null
    returning g.run_id, g.step_slug, g.payload
  ), done as (
    update flowlane.step_states ss
       set status = 'completed', output = k.payload, remaining_tasks = 0, completed_at = flowlane._now()
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
create function flowlane._reopen_waits(p_run_id uuid) returns void
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
-- a wait step's output_schema is the contract of the payload that completes it: a payload
-- it refuses is refused like a run input, naming the path, before anything changes
create function flowlane._check_signal_contract(p_flow text, p_step text, p_payload jsonb)
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

create function flowlane.signal(run_id uuid, step_slug text, payload jsonb = '{}')
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
  values (v_run.run_id, v_step.step_slug, payload, case when v_state.status = 'started' then flowlane._now() end)
  returning * into v_signal;
  if v_state.status = 'started' then
    update flowlane.step_states ss
       set status = 'completed', output = payload, remaining_tasks = 0, completed_at = flowlane._now()
     where ss.run_id = v_run.run_id and ss.step_slug = v_step.step_slug
    returning * into v_state;
    perform flowlane._steps_done(array[v_state]);
  end if;
  return v_signal;
end;
$$;


create function flowlane._wait_steps_hint(p_flow text) returns text
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
create function flowlane.expire_waits(p_now timestamptz = flowlane._now()) returns int
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
create function flowlane._give_up_step(p_run_id uuid, p_step_slug text, p_error text, p_reason text)
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
       set status = 'failed', failed_at = flowlane._now(), remaining_tasks = null, error_message = p_error
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
create function flowlane.get_run_waits(run_id uuid) returns jsonb
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
