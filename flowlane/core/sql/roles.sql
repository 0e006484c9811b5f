-- Least privilege (docs/security.md): roles flowlane_worker and flowlane_admin.
-- Applied by `flowlane db migrate --roles`, and again by every later `migrate` of a database
-- that has them: a migration's `create or replace function` resets SECURITY DEFINER, so the
-- privileges are re-asserted after every migration. Idempotent.

-- name: roles_applied
select case when exists (select 1 from pg_roles where rolname = 'flowlane_worker')
                 and to_regnamespace('flowlane') is not null
            then has_schema_privilege('flowlane_worker', 'flowlane', 'USAGE')
            else false end as applied

-- name: apply_roles
do $roles$
declare
  -- every public function (no leading _) is in exactly one class; tests/core/test_roles.py
  -- fails on a function in none, and this block refuses to run with one
  v_worker constant text[] := array[
    'register_worker', 'heartbeat', 'mark_worker_stopped', 'enable_queue_notify',
    'start_tasks', 'claim_tasks', 'complete_task', 'complete_tasks', 'fail_task', 'fail_tasks',
    'fail_task_detailed',
    'extend_leases', 'requeue_stalled_tasks',
    'set_deployment_enabled',  -- a worker disables its own deployment on unsupported work (6.4)
    'record_worker_refusal',
    'maintenance_tick'];  -- schedules, delayed runs, deadlines, retention: see 15_time.sql
  v_read constant text[] := array[
    'verify_flow', 'coverage', 'drain_status', 'get_flow_shape', 'get_run_with_states',
    'get_run_attempts', 'get_run_waits', 'get_run_family', 'stuck_runs', 'json_limits', 'json_depth_exceeds',
    'calculate_retry_delay', 'is_valid_slug', 'is_valid_queue_name',
    'is_valid_deployment_name', 'resolve_flow', 'prunable_runs', 'queue_metrics',
    'trace_parents', 'queue_depth', 'run_deadline', 'contract_keywords', 'contract_violation',
    'run_holds', 'queue_flow_control', 'trigger_activity',
    'listen_run_finished', 'unlisten_run_finished'];  -- Client.wait, run durations
  v_admin constant text[] := array[
    'create_flow', 'add_step', 'ensure_flow_shape', 'ensure_flow_compiled', 'set_alias', 'set_contract',
    'delete_flow_and_data', 'adopt_queue', 'begin_rollout', 'finish_rollout',
    'start_flow', 'start_flows', 'start_ready_steps', 'cancel_run', 'retry_run', 'signal', 'expire_waits',
    'set_schedule', 'keep_only_schedules', 'set_schedule_paused', 'trigger_schedule',
    'set_queue_limits', 'keep_only_queue_limits', 'set_trigger', 'keep_only_triggers',
    'prune_runs'];  -- `flowlane prune`; workers prune through maintenance_tick
  -- claim_tasks, fail_tasks and start_flows: the set-based engine (0009)
  v_unclassified text;
  v_fn record;
  v_queue text;
begin
  select string_agg(distinct p.proname, ', ') into v_unclassified
  from pg_proc p
  where p.pronamespace = 'flowlane'::regnamespace and p.prokind = 'f' and p.proname !~ '^_'
    and p.prorettype <> 'trigger'::regtype
    and p.proname <> all (v_worker || v_read || v_admin);
  if v_unclassified is not null then
    raise exception 'flowlane functions without a privilege class: %', v_unclassified
      using errcode = '55000',
            hint = 'add each to the worker, read or admin list of flowlane/core/sql/roles.sql';
  end if;

  -- roles are cluster-wide: created once, never altered (an operator may have tuned them)
  if not exists (select 1 from pg_roles where rolname = 'flowlane_worker') then
    create role flowlane_worker nologin;
  end if;
  if not exists (select 1 from pg_roles where rolname = 'flowlane_admin') then
    create role flowlane_admin nologin;
  end if;

  revoke all on schema flowlane from public;
  revoke all on all tables in schema flowlane from public;
  revoke all on all sequences in schema flowlane from public;
  revoke all on all functions in schema flowlane from public;
  alter default privileges in schema flowlane revoke execute on functions from public;
  grant usage on schema flowlane to flowlane_worker, flowlane_admin;

  -- the roles hold no table write privilege: every change goes through a function that runs
  -- as its owner, with search_path pinned to '' (its body is fully schema-qualified)
  for v_fn in
    select p.oid::regprocedure as signature, p.proname as name
    from pg_proc p
    where p.pronamespace = 'flowlane'::regnamespace and p.prokind = 'f'
      and p.proname !~ '^_' and p.prorettype <> 'trigger'::regtype
  loop
    execute format('alter function %s security definer set search_path = %L', v_fn.signature, '');
    if v_fn.name = any (v_worker || v_read) then
      execute format('grant execute on function %s to flowlane_worker, flowlane_admin',
                     v_fn.signature);
    else
      execute format('grant execute on function %s to flowlane_admin', v_fn.signature);
    end if;
  end loop;

  -- create_flow's retention argument defaults to this function's value, computed as the caller
  grant execute on function flowlane._flow_option_default(text) to flowlane_admin;
  grant select on flowlane.worker_deployments to flowlane_worker;  -- the startup check
  grant select on all tables in schema flowlane to flowlane_admin;  -- inspection, plan, verify

  -- workers read their queues with pgmq.read (an update of the message's visibility)
  grant usage on schema pgmq to flowlane_worker, flowlane_admin;
  for v_queue in select coalesce(q.pgmq_queue_name, q.queue_name) from flowlane.queues q loop
    perform flowlane._grant_queue_to_roles(v_queue);
  end loop;
end
$roles$;

-- name: apply_roles_queue_grants
-- a queue registered later (add_step, adopt_queue) is granted when its transaction commits
-- (the PGMQ table is created after the registry row)
create or replace function flowlane._grant_queue_to_roles(p_queue text)
returns void
language plpgsql
security definer
set search_path = ''
as $$
begin
  if to_regclass(format('pgmq.%I', 'q_' || p_queue)) is not null then
    execute format('grant select, update on pgmq.%I to flowlane_worker', 'q_' || p_queue);
    execute format('grant select on pgmq.%I to flowlane_admin', 'q_' || p_queue);
  end if;
end;
$$;

create or replace function flowlane._grant_registered_queue()
returns trigger
language plpgsql
security definer
set search_path = ''
as $$
begin
  perform flowlane._grant_queue_to_roles(coalesce(new.pgmq_queue_name, new.queue_name));
  return null;
end;
$$;

revoke all on function flowlane._grant_queue_to_roles(text) from public;
revoke all on function flowlane._grant_registered_queue() from public;

drop trigger if exists grant_registered_queue on flowlane.queues;
create constraint trigger grant_registered_queue
after insert on flowlane.queues
deferrable initially deferred
for each row execute function flowlane._grant_registered_queue();
