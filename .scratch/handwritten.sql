-- hand-written
alter table flowlane.steps alter column queue_name drop not null;
alter table flowlane.steps drop constraint steps_type_valid;
alter table flowlane.steps add constraint steps_type_valid check (step_type in ('single', 'map', 'wait'));
alter table flowlane.steps
  add constraint steps_queue_unless_wait check ((queue_name is null) = (step_type = 'wait'));
alter table flowlane.step_states drop constraint step_states_skip_reason_valid;
alter table flowlane.step_states add constraint step_states_skip_reason_valid
  check ((skip_reason is null) or (skip_reason in ('condition_unmet', 'handler_failed', 'dependency_skipped', 'wait_timeout')));

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
