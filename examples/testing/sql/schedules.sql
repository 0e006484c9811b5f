-- flowlane-compiled: {"format":2,"kind":"schedules"}
-- schedules; do not edit: change the YAML and run `flowlane compile`
begin;

-- schedule nightly_report from flows/report.yaml
select flowlane.set_schedule(
  schedule_name => 'nightly_report',
  flow_name => 'report',
  input => '{}'::jsonb,
  cron => '0 3 * * *',
  cron_minutes => array[0]::int[],
  cron_hours => array[3]::int[],
  cron_days => null,
  cron_months => array[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]::int[],
  cron_weekdays => null,
  timezone => 'UTC',
  overlap => 'skip',
  catch_up => 'latest'
);

-- schedules no longer declared stop firing (their runs keep the schedule's name)
select flowlane.keep_only_schedules(array['nightly_report']::text[]);

commit;
