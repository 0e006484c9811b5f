-- flowlane SQL Core 0027: the row rules of runs, step states and tasks as one CHECK per table.
-- PostgreSQL prepares every CHECK expression again for each statement that writes a table: the
-- 17, 19 and 15 rules of these three tables cost every one-row write about 90 µs, a single
-- start four such writes and a single completion five. Each table now has one CHECK calling a
-- PL/pgSQL function that holds the same rules, planned once per connection; a broken rule is
-- still named in the error. Existing rows kept the same rules, so adding the constraints
-- finds none that breaks them.

-- a row rule's failure, raised as the CHECK it stands for would be
create function flowlane._rule_broken(p_table text, p_rule text) returns void
language plpgsql immutable
set search_path = ''
as $$
begin
  raise exception 'new row for relation "%" violates check constraint "%"', p_table, p_rule
    using errcode = 'check_violation', schema = 'flowlane', table = p_table, constraint = p_table || '_rules';
end;
$$;

-- the rules a run keeps, as one CHECK (runs_rules) calling this function: why one, see
-- "Row rules" in flowlane/core/engine/README.md
create function flowlane._runs_rules(status text, started_at timestamptz, completed_at timestamptz,
                                     failed_at timestamptz, cancelled_at timestamptz, cancel_reason text,
                                     has_output boolean, remaining_steps int, retry_count int,
                                     called_as text, idempotency_key text, start_at timestamptz,
                                     schedule_name text, schedule_slot timestamptz, parent_run_id uuid,
                                     parent_step_slug text, parent_task_index int, concurrency_key text,
                                     hold_seq bigint, priority int)
returns boolean
language plpgsql immutable
set search_path = ''
as $$
declare
  v_broken text := case
    when not (status in ('waiting', 'started', 'completed', 'failed', 'cancelled')) then 'runs_status_valid'
    when not ((status = 'completed') = (completed_at is not null)) then 'runs_completed_at'
    when not ((status = 'failed') = (failed_at is not null)) then 'runs_failed_at'
    when not ((status = 'cancelled') = (cancelled_at is not null)) then 'runs_cancelled_at'
    when not ((completed_at is null) or (completed_at >= started_at)) then 'runs_completed_after_start'
    when not ((failed_at is null) or (failed_at >= started_at)) then 'runs_failed_after_start'
    when not ((cancelled_at is null) or (cancelled_at >= started_at)) then 'runs_cancelled_after_start'
    when not ((cancel_reason is null) or (status = 'cancelled')) then 'runs_cancel_reason_only_cancelled'
    when not (not has_output or (status = 'completed')) then 'runs_output_only_completed'
    when not (remaining_steps >= 0) then 'runs_remaining_steps_nonnegative'
    when not (retry_count >= 0) then 'runs_retry_count_nonnegative'
    when not ((idempotency_key is null) or (called_as is not null)) then 'runs_key_scoped'
    when not ((schedule_slot is null) or (schedule_name is not null)) then 'runs_schedule_slot_named'
    when not ((status <> 'waiting') or (start_at is not null) or (hold_seq is not null)) then 'runs_waiting_has_reason'
    when not ((hold_seq is null) or (concurrency_key is not null)) then 'runs_held_has_key'
    when not (priority between -1000 and 1000) then 'runs_priority_range'
    when not (((parent_run_id is null) = (parent_step_slug is null))
              and ((parent_run_id is null) = (parent_task_index is null))) then 'runs_parent_complete'
  end;
begin
  if v_broken is not null then
    perform flowlane._rule_broken('runs', v_broken);
  end if;
  return true;
end;
$$;

-- the rules a step state keeps (one CHECK, as for runs)
create function flowlane._step_states_rules(status text, remaining_deps int, initial_tasks int, remaining_tasks int,
                                            has_output boolean, skip_reason text, created_at timestamptz,
                                            started_at timestamptz, completed_at timestamptz,
                                            failed_at timestamptz, skipped_at timestamptz,
                                            cancelled_at timestamptz)
returns boolean
language plpgsql immutable
set search_path = ''
as $$
declare
  v_broken text := case
    when not (status in ('created', 'started', 'completed', 'failed', 'skipped', 'cancelled')) then 'step_states_status_valid'
    when not ((status = 'completed') = (completed_at is not null)) then 'step_states_completed_at'
    when not ((status = 'failed') = (failed_at is not null)) then 'step_states_failed_at'
    when not ((status = 'skipped') = (skipped_at is not null)) then 'step_states_skipped_at'
    when not ((status = 'cancelled') = (cancelled_at is not null)) then 'step_states_cancelled_at'
    when not ((started_at is null) or (started_at >= created_at)) then 'step_states_started_after_created'
    when not ((completed_at is null) or (completed_at >= coalesce(started_at, created_at))) then 'step_states_completed_after_started'
    when not ((failed_at is null) or (failed_at >= coalesce(started_at, created_at))) then 'step_states_failed_after_created'
    when not ((skipped_at is null) or (skipped_at >= created_at)) then 'step_states_skipped_after_created'
    when not ((cancelled_at is null) or (cancelled_at >= coalesce(started_at, created_at))) then 'step_states_cancelled_after_created'
    when not (remaining_deps >= 0) then 'step_states_remaining_deps_nonnegative'
    when not ((initial_tasks is null) or (initial_tasks >= 0)) then 'step_states_initial_tasks_nonnegative'
    when not ((remaining_tasks is null) or (remaining_tasks >= 0)) then 'step_states_remaining_tasks_nonnegative'
    when not ((status <> 'started') or ((initial_tasks is not null) and (remaining_tasks is not null))) then 'step_states_started_sized'
    when not ((status <> all (array['created', 'skipped'])) or (remaining_tasks is null)) then 'step_states_unstarted_no_remaining'
    when not ((status <> 'completed') or (remaining_tasks = 0)) then 'step_states_completed_no_remaining'
    when not (not has_output or (status = 'completed')) then 'step_states_output_only_completed'
    when not ((status = 'skipped') = (skip_reason is not null)) then 'step_states_skip_reason'
    when not ((skip_reason is null)
              or (skip_reason in ('condition_unmet', 'handler_failed', 'dependency_skipped', 'wait_timeout'))) then 'step_states_skip_reason_valid'
  end;
begin
  if v_broken is not null then
    perform flowlane._rule_broken('step_states', v_broken);
  end if;
  return true;
end;
$$;

-- the rules a task keeps (one CHECK, as for runs)
create function flowlane._step_tasks_rules(status text, task_index int, attempts_count int, requeued_count int,
                                           has_output boolean, queued_at timestamptz, started_at timestamptz,
                                           completed_at timestamptz, failed_at timestamptz,
                                           skipped_at timestamptz, cancelled_at timestamptz)
returns boolean
language plpgsql immutable
set search_path = ''
as $$
declare
  v_broken text := case
    when not (status in ('queued', 'started', 'completed', 'failed', 'skipped', 'cancelled')) then 'step_tasks_status_valid'
    when not ((status = 'completed') = (completed_at is not null)) then 'step_tasks_completed_at'
    when not ((status = 'failed') = (failed_at is not null)) then 'step_tasks_failed_at'
    when not ((status = 'skipped') = (skipped_at is not null)) then 'step_tasks_skipped_at'
    when not ((status = 'cancelled') = (cancelled_at is not null)) then 'step_tasks_cancelled_at'
    when not ((status <> 'started') or (started_at is not null)) then 'step_tasks_started_at'
    when not ((started_at is null) or (started_at >= queued_at)) then 'step_tasks_started_after_queued'
    when not ((completed_at is null) or (completed_at >= coalesce(started_at, queued_at))) then 'step_tasks_completed_after_started'
    when not ((failed_at is null) or (failed_at >= queued_at)) then 'step_tasks_failed_after_queued'
    when not ((skipped_at is null) or (skipped_at >= queued_at)) then 'step_tasks_skipped_after_queued'
    when not ((cancelled_at is null) or (cancelled_at >= queued_at)) then 'step_tasks_cancelled_after_queued'
    when not (not has_output or (status in ('completed', 'failed'))) then 'step_tasks_output_only_done'
    when not (task_index >= 0) then 'step_tasks_task_index_nonnegative'
    when not (attempts_count >= 0) then 'step_tasks_attempts_nonnegative'
    when not (requeued_count >= 0) then 'step_tasks_requeued_nonnegative'
  end;
begin
  if v_broken is not null then
    perform flowlane._rule_broken('step_tasks', v_broken);
  end if;
  return true;
end;
$$;

alter table flowlane.runs
  drop constraint runs_cancel_reason_only_cancelled,
  drop constraint runs_cancelled_after_start,
  drop constraint runs_cancelled_at,
  drop constraint runs_completed_after_start,
  drop constraint runs_completed_at,
  drop constraint runs_failed_after_start,
  drop constraint runs_failed_at,
  drop constraint runs_held_has_key,
  drop constraint runs_key_scoped,
  drop constraint runs_output_only_completed,
  drop constraint runs_parent_complete,
  drop constraint runs_priority_range,
  drop constraint runs_remaining_steps_nonnegative,
  drop constraint runs_retry_count_nonnegative,
  drop constraint runs_schedule_slot_named,
  drop constraint runs_status_valid,
  drop constraint runs_waiting_has_reason,
  add constraint runs_rules check (flowlane._runs_rules(status, started_at, completed_at, failed_at, cancelled_at,
    cancel_reason, output is not null, remaining_steps, retry_count, called_as, idempotency_key, start_at,
    schedule_name, schedule_slot, parent_run_id, parent_step_slug, parent_task_index, concurrency_key, hold_seq,
    priority));

alter table flowlane.step_states
  drop constraint step_states_cancelled_after_created,
  drop constraint step_states_cancelled_at,
  drop constraint step_states_completed_after_started,
  drop constraint step_states_completed_at,
  drop constraint step_states_completed_no_remaining,
  drop constraint step_states_failed_after_created,
  drop constraint step_states_failed_at,
  drop constraint step_states_initial_tasks_nonnegative,
  drop constraint step_states_output_only_completed,
  drop constraint step_states_remaining_deps_nonnegative,
  drop constraint step_states_remaining_tasks_nonnegative,
  drop constraint step_states_skip_reason,
  drop constraint step_states_skip_reason_valid,
  drop constraint step_states_skipped_after_created,
  drop constraint step_states_skipped_at,
  drop constraint step_states_started_after_created,
  drop constraint step_states_started_sized,
  drop constraint step_states_status_valid,
  drop constraint step_states_unstarted_no_remaining,
  add constraint step_states_rules check (flowlane._step_states_rules(status, remaining_deps, initial_tasks,
    remaining_tasks, output is not null, skip_reason, created_at, started_at, completed_at, failed_at, skipped_at,
    cancelled_at));

alter table flowlane.step_tasks
  drop constraint step_tasks_attempts_nonnegative,
  drop constraint step_tasks_cancelled_after_queued,
  drop constraint step_tasks_cancelled_at,
  drop constraint step_tasks_completed_after_started,
  drop constraint step_tasks_completed_at,
  drop constraint step_tasks_failed_after_queued,
  drop constraint step_tasks_failed_at,
  drop constraint step_tasks_output_only_done,
  drop constraint step_tasks_requeued_nonnegative,
  drop constraint step_tasks_skipped_after_queued,
  drop constraint step_tasks_skipped_at,
  drop constraint step_tasks_started_after_queued,
  drop constraint step_tasks_started_at,
  drop constraint step_tasks_status_valid,
  drop constraint step_tasks_task_index_nonnegative,
  add constraint step_tasks_rules check (flowlane._step_tasks_rules(status, task_index, attempts_count, requeued_count,
    output is not null, queued_at, started_at, completed_at, failed_at, skipped_at, cancelled_at));
