-- A flow's failure handler: a run of the flow it names (on_failure), started once when a run
-- of the flow fails or passes its deadline (and when it is cancelled, with on_failure_on_cancel),
-- in the transaction that ends the run. Its tasks are claimed, completed, failed and recovered
-- as any run's; it is linked to the run it handles by failure_of, and a failure handler's run
-- starts no failure handler of its own.

-- the flow a failure handler names: a slug (of a flow or an alias), not the flow itself
create function flowlane._check_on_failure(p_flow text, p_on_failure text) returns void
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
create function flowlane._failure_input(p_run flowlane.runs) returns jsonb
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
    'outputs', coalesce((select jsonb_object_agg(ss.step_slug, ss.output) from flowlane.all_step_states ss
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
create function flowlane._start_failure_handler() returns trigger
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

create trigger runs_start_failure_handler
  after update of status on flowlane.runs
  for each row
  when (old.status in ('started', 'waiting') and new.status in ('failed', 'cancelled') and new.failure_of is null)
  execute function flowlane._start_failure_handler();
