-- ==> aliases.sql <==
-- flowlane-compiled: {"format":2,"kind":"aliases"}
-- aliases; do not edit: change the YAML and run `flowlane compile`
begin;

-- alias invoices from schedules.yaml
select flowlane.set_alias(
  alias => 'invoices',
  flow_slug => 'invoices_v2',
  draining => array[]::text[]
);

commit;
-- ==> flows/invoices_v2.sql <==
-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"d430f705086a2ace8b6fd7224b957764173eac99df64d4c4f68d034c33d03862","slug":"invoices_v2"}
-- flow invoices_v2 from schedules.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'invoices_v2',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"invoices_v2","slug":"bill","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'invoices_v2';

select flowlane.create_flow(
  flow_slug => 'invoices_v2',
  max_attempts => 3,
  base_delay => 5,
  timeout => 60,
  queue_mode => 'flow'
);

select flowlane.add_step(
  flow_slug => 'invoices_v2',
  step_slug => 'bill',
  deps_slugs => array[]::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'invoices_v2'
);

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'invoices_v2',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"invoices_v2","slug":"bill","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
-- ==> schedules.sql <==
-- flowlane-compiled: {"format":2,"kind":"schedules"}
-- schedules; do not edit: change the YAML and run `flowlane compile`
begin;

-- schedule nightly_invoices from schedules.yaml
select flowlane.set_schedule(
  schedule_name => 'nightly_invoices',
  flow_name => 'invoices',
  input => '{"batch":"nightly"}'::jsonb,
  cron => '0 2 * * MON-FRI',
  cron_minutes => array[0]::int[],
  cron_hours => array[2]::int[],
  cron_days => null,
  cron_months => array[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]::int[],
  cron_weekdays => array[1, 2, 3, 4, 5]::int[],
  timezone => 'Europe/Berlin',
  overlap => 'skip',
  catch_up => 'latest'
);

-- schedule reminders from schedules.yaml
select flowlane.set_schedule(
  schedule_name => 'reminders',
  flow_name => 'invoices_v2',
  input => '{}'::jsonb,
  every_seconds => 600,
  timezone => 'UTC',
  overlap => 'allow',
  catch_up => 'all'
);

-- schedules no longer declared stop firing (their runs keep the schedule's name)
select flowlane.keep_only_schedules(array['nightly_invoices', 'reminders']::text[]);

commit;
