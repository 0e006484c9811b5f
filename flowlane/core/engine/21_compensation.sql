-- Compensation: when a run fails, each of its completed steps that names a compensation (a
-- flow or alias, steps.opt_compensate) has a run of that flow started, with the step's input
-- and output, in reverse dependency order: a step's compensation starts once the compensations
-- of every step that depends on it, directly or not, have completed. Each is recorded in
-- flowlane.compensations, started once; the run's compensation says 'running', 'completed' or
-- 'stopped' (a compensation's run failed or was cancelled: nothing more starts until
-- retry_compensation).

-- what a step was handed as a whole: the run input for a root step, the output a map step
-- maps, otherwise {dep: output} of its needs
create function flowlane._step_input(p_run_id uuid, p_step_slug text) returns jsonb
language sql stable
set search_path = ''
as $$
  select case
           when s.deps_count = 0 then r.input
           when s.step_type = 'map' then
             (select ps.output from flowlane.deps d
              join flowlane.all_step_states ps on ps.run_id = r.run_id and ps.step_slug = d.dep_slug
              where d.flow_slug = s.flow_slug and d.step_slug = s.step_slug)
           else flowlane._condition_subject(r.run_id, s.step_slug)
         end
  from flowlane.runs r
  join flowlane.steps s on s.flow_slug = r.flow_slug and s.step_slug = p_step_slug
  where r.run_id = p_run_id;
$$;

-- a failed run's completed steps with a compensation, recorded once (a run retried and failed
-- again is not compensated twice); the first compensations start
create function flowlane._begin_compensation() returns trigger
language plpgsql volatile
set search_path = ''
as $$
begin
  if exists (select 1 from flowlane.compensations c where c.run_id = new.run_id) then
    return null;
  end if;
  insert into flowlane.compensations (run_id, step_slug)
  select ss.run_id, ss.step_slug from flowlane.all_step_states ss
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
create function flowlane._advance_compensation(p_run_id uuid) returns void
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
create function flowlane._start_compensation(p_run flowlane.runs, p_step_slug text, p_named text) returns void
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
    'output', (select ss.output from flowlane.all_step_states ss
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

create function flowlane._report_compensation() returns trigger
language plpgsql volatile
set search_path = ''
as $$
begin
  perform flowlane._compensation_ended(new);
  return null;
end;
$$;

-- a compensation's run ended: completed, the chain goes on; failed or cancelled, it stops
create function flowlane._compensation_ended(p_ended flowlane.runs) returns void
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
create function flowlane.retry_compensation(run_id uuid) returns flowlane.runs
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
create function flowlane.get_run_compensations(run_id uuid) returns jsonb
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
