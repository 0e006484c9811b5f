-- Least privilege (docs/security.md): one role per responsibility, each granted the functions
-- of its classes. Applied by `flowlane db migrate --roles`, and again by every later `migrate`
-- of a database that has them: a migration's `create or replace function` resets SECURITY
-- DEFINER, so the privileges are re-asserted after every migration. Idempotent.

-- name: roles_applied
select case when exists (select 1 from pg_roles where rolname = 'flowlane_worker')
                 and to_regnamespace('flowlane') is not null
            then has_schema_privilege('flowlane_worker', 'flowlane', 'USAGE')
            else false end as applied

-- name: missing_roles
select array(select r from unnest(%(roles)s::text[]) r
             where not exists (select 1 from pg_roles p where p.rolname = r) order by r) as missing

-- name: apply_roles
do $roles$
declare
  -- every public function (no leading _) is in exactly one class; tests/core/test_roles.py
  -- fails on a function in none, and this block refuses to run with one
  v_classes constant jsonb := jsonb_build_object(
    'claim', array[  -- a worker's claims and its results, each fenced by its claim
      'register_worker', 'heartbeat', 'mark_worker_stopped', 'enable_queue_notify', 'await_queue_inserts',
      'start_tasks', 'claim_tasks', 'complete_task', 'complete_tasks', 'fail_task', 'fail_tasks',
      'fail_task_detailed', 'extend_leases', 'requeue_stalled_tasks', 'record_worker_refusal'],
    'tick', array['maintenance_tick'],  -- schedules, delayed runs, deadlines, retention: see 15_time.sql
    'fleet', array['set_deployment_enabled'],  -- a worker disables its own deployment on unsupported work
    'inspect', array[
      'verify_flow', 'coverage', 'drain_status', 'get_flow_shape', 'stuck_runs', 'json_limits',
      'json_depth_exceeds', 'calculate_retry_delay', 'is_valid_slug', 'is_valid_queue_name',
      'is_valid_deployment_name', 'resolve_flow', 'prunable_runs', 'queue_metrics', 'trace_parents',
      'queue_depth', 'run_deadline', 'contract_keywords', 'contract_violation', 'run_holds',
      'queue_flow_control', 'pgmq_metrics', 'worker_is_live', 'worker_stale_after',
      'definitions_fingerprint',  -- serve through a transaction-mode pooler
      'trigger_activity'],
    'runs', array['get_run_with_states', 'get_run_attempts', 'get_run_waits', 'get_run_family',
                   'get_run_compensations'],
    'wait', array['listen_run_finished', 'unlisten_run_finished'],  -- Client.wait, run durations
    'start', array['start_flow', 'start_flows'],
    'deploy', array[
      'create_flow', 'add_step', 'ensure_flow_shape', 'ensure_flow_compiled', 'set_alias', 'set_contract',
      'delete_flow_and_data', 'adopt_queue', 'begin_rollout', 'finish_rollout', 'set_schedule',
      'keep_only_schedules', 'set_queue_limits', 'keep_only_queue_limits', 'set_trigger',
      'keep_only_triggers'],
    'operate', array[
      'cancel_run', 'retry_run', 'signal', 'expire_waits', 'start_ready_steps', 'set_schedule_paused',
      'trigger_schedule', 'prune_runs', 'override_task', 'retry_run_from', 'retry_runs', 'cancel_runs',
      'retry_compensation']);
  -- the classes of each role; flowlane_admin is every responsibility but a worker's claims
  v_roles constant jsonb := jsonb_build_object(
    'flowlane_worker', array['claim', 'tick', 'fleet', 'inspect', 'runs', 'wait'],
    'flowlane_deployer', array['deploy', 'inspect'],
    'flowlane_operator', array['operate', 'fleet', 'inspect', 'runs', 'wait'],
    'flowlane_application', array['start', 'inspect', 'runs', 'wait'],
    'flowlane_console', array['inspect', 'runs', 'wait'],
    'flowlane_admin', array['deploy', 'operate', 'start', 'fleet', 'tick', 'inspect', 'runs', 'wait']);
  -- roles that read the tables (plan, verify, the console, `queue list`, what a run waits for)
  v_readers constant text[] := array['flowlane_deployer', 'flowlane_operator', 'flowlane_application',
                                     'flowlane_console', 'flowlane_admin'];
  v_required constant boolean := coalesce(current_setting('flowlane.roles_required', true), '') = 'on';
  v_classified text[] := array(select jsonb_array_elements_text(c) from jsonb_each(v_classes) e(k, c));
  v_can_create constant boolean := (select r.rolsuper or r.rolcreaterole from pg_roles r
                                    where r.rolname = current_user);
  v_missing text;
  v_role text;
  v_roles_present text[];
  v_unclassified text;
  v_fn record;
  v_queue text;
begin
  select string_agg(distinct p.proname, ', ') into v_unclassified
  from pg_proc p
  where p.pronamespace = 'flowlane'::regnamespace and p.prokind = 'f' and p.proname !~ '^_'
    and p.prorettype <> 'trigger'::regtype
    and p.proname <> all (v_classified);
  if v_unclassified is not null then
    raise exception 'flowlane functions without a privilege class: %', v_unclassified
      using errcode = '55000',
            hint = 'add each to a class of flowlane/core/sql/roles.sql';
  end if;

  -- roles are cluster-wide: created once, never altered (an operator may have tuned them); an
  -- owner that may not create roles has a role administrator create them (`flowlane db roles`)
  for v_role in select jsonb_object_keys(v_roles) loop
    if not exists (select 1 from pg_roles where rolname = v_role) and v_can_create then
      execute format('create role %I nologin', v_role);
    end if;
  end loop;
  select string_agg(r, ', ' order by r) into v_missing from jsonb_object_keys(v_roles) r
  where not exists (select 1 from pg_roles p where p.rolname = r);
  if v_missing is not null and v_required then
    raise exception 'roles % do not exist, and % may not create roles', v_missing, current_user
      using errcode = '42501',
            hint = 'have a superuser or a role administrator run the statements `flowlane db roles` '
                   'prints, then migrate again';
  end if;
  v_roles_present := array(select r from jsonb_object_keys(v_roles) r
                           where exists (select 1 from pg_roles p where p.rolname = r));

  revoke all on schema flowlane from public;
  revoke all on all tables in schema flowlane from public;
  revoke all on all sequences in schema flowlane from public;
  revoke all on all functions in schema flowlane from public;
  alter default privileges in schema flowlane revoke execute on functions from public;

  -- the roles hold no table write privilege: every change goes through a function that runs
  -- as its owner, with search_path pinned to '' (its body is fully schema-qualified)
  for v_fn in
    select p.oid::regprocedure as signature, p.proname as name
    from pg_proc p
    where p.pronamespace = 'flowlane'::regnamespace and p.prokind = 'f'
      and p.proname !~ '^_' and p.prorettype <> 'trigger'::regtype
  loop
    execute format('alter function %s security definer set search_path = %L', v_fn.signature, '');
  end loop;

  foreach v_role in array v_roles_present loop
    -- a role's grants are exactly its classes': what an earlier version granted is taken back
    execute format('revoke all on all functions in schema flowlane from %I', v_role);
    execute format('revoke all on all tables in schema flowlane from %I', v_role);
    execute format('grant usage on schema flowlane, pgmq to %I', v_role);
    for v_fn in
      select p.oid::regprocedure as signature
      from pg_proc p
      where p.pronamespace = 'flowlane'::regnamespace and p.prokind = 'f' and p.proname !~ '^_'
        and p.proname in (select jsonb_array_elements_text(v_classes -> c)
                          from jsonb_array_elements_text(v_roles -> v_role) c)
    loop
      execute format('grant execute on function %s to %I', v_fn.signature, v_role);
    end loop;
    if v_role = any (v_readers) then
      execute format('grant select on all tables in schema flowlane to %I', v_role);
    end if;
  end loop;

  -- create_flow's retention argument defaults to this function's value, computed as the caller
  foreach v_role in array array['flowlane_deployer', 'flowlane_admin'] loop
    if v_role = any (v_roles_present) then
      execute format('grant execute on function flowlane._flow_option_default(text) to %I', v_role);
    end if;
  end loop;
  if 'flowlane_worker' = any (v_roles_present) then
    grant select on flowlane.worker_deployments to flowlane_worker;  -- the startup check
  end if;
  -- the engine's clock, inlined into the runtime's and the console's queries as their caller;
  -- the queues' inserter locks, read by the insert trigger as whoever inserts
  foreach v_role in array v_roles_present loop
    execute format('grant execute on function flowlane._now(), flowlane._clock_timestamp(), '
                   'flowlane._queue_inserter_locks() to %I', v_role);
  end loop;

  for v_queue in select coalesce(q.pgmq_queue_name, q.queue_name) from flowlane.queues q loop
    perform flowlane._grant_queue_to_roles(v_queue);
  end loop;
end
$roles$;

-- name: apply_roles_queue_grants
-- a queue registered later (add_step, adopt_queue) is granted when its transaction commits
-- (the PGMQ table is created after the registry row): workers read it with pgmq.read (an
-- update of the message's visibility), the readers' pgmq.metrics reads its table and sequence
create or replace function flowlane._grant_queue_to_roles(p_queue text)
returns void
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_table constant text := format('pgmq.%I', 'q_' || p_queue);
  v_role text;
begin
  if to_regclass(v_table) is null then
    return;
  end if;
  if exists (select 1 from pg_roles where rolname = 'flowlane_worker') then
    execute format('grant select, update on %s to flowlane_worker', v_table);
  end if;
  foreach v_role in array array['flowlane_deployer', 'flowlane_operator', 'flowlane_console',
                                'flowlane_admin'] loop
    if exists (select 1 from pg_roles where rolname = v_role) then
      execute format('grant select on %s to %I', v_table, v_role);
      execute format('grant select on sequence %s to %I', pg_get_serial_sequence(v_table, 'msg_id'), v_role);
    end if;
  end loop;
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
