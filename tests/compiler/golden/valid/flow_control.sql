-- ==> aliases.sql <==
-- flowlane-compiled: {"format":2,"kind":"aliases"}
-- aliases; do not edit: change the YAML and run `flowlane compile`
begin;

commit;
-- ==> flows/digests.sql <==
-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"694cc0ca07005d5f97138303a6ace8ee175510169f2b999663b51137cc6c7c13","slug":"digests"}
-- flow digests from flow_control.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'digests',
  shape => '{"queue_mode":"explicit","steps":[{"if":null,"needs":[],"queue":"deliver_slack_alerts","slug":"send","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'digests';

select flowlane.create_flow(
  flow_slug => 'digests',
  max_attempts => 3,
  base_delay => 5,
  timeout => 60,
  queue_mode => 'explicit',
  concurrency_limit => 3,
  concurrency_when_full => 'replace_waiting',
  debounce_period => 30,
  debounce_key => '/workspace',
  debounce_max_wait => 300
);

select flowlane.add_step(
  flow_slug => 'digests',
  step_slug => 'send',
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
  queue_name => 'deliver_slack_alerts',
  concurrency_limit => 1
);

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'digests',
  shape => '{"queue_mode":"explicit","steps":[{"if":null,"needs":[],"queue":"deliver_slack_alerts","slug":"send","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
-- ==> flows/slack_alerts.sql <==
-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"62343be27d1e8bd973ff69a97d5e94b64e9b1887e380a3c16168d5846b3ffc23","slug":"slack_alerts"}
-- flow slack_alerts from flow_control.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'slack_alerts',
  shape => '{"queue_mode":"explicit","steps":[{"if":null,"needs":[],"queue":"slack_render","slug":"render","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["render"],"queue":"deliver_slack_alerts","slug":"deliver","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'slack_alerts';

select flowlane.create_flow(
  flow_slug => 'slack_alerts',
  max_attempts => 3,
  base_delay => 5,
  timeout => 60,
  queue_mode => 'explicit',
  concurrency_limit => 1,
  concurrency_key => '/customer_id',
  priority => 10
);

select flowlane.add_step(
  flow_slug => 'slack_alerts',
  step_slug => 'render',
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
  queue_name => 'slack_render'
);

select flowlane.add_step(
  flow_slug => 'slack_alerts',
  step_slug => 'deliver',
  deps_slugs => array['render']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'deliver_slack_alerts',
  concurrency_limit => 2,
  concurrency_key => '/workspace/id'
);

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'slack_alerts',
  shape => '{"queue_mode":"explicit","steps":[{"if":null,"needs":[],"queue":"slack_render","slug":"render","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["render"],"queue":"deliver_slack_alerts","slug":"deliver","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
-- ==> queues.sql <==
-- flowlane-compiled: {"format":2,"kind":"queues"}
-- queue limits; do not edit: change the YAML and run `flowlane compile`
begin;

-- queue deliver_slack_alerts from flow_control.yaml
select flowlane.set_queue_limits(
  queue_name => 'deliver_slack_alerts',
  concurrency => 5,
  rate_limit => 1,
  rate_per => 1
);

-- queue slack_render from flow_control.yaml
select flowlane.set_queue_limits(
  queue_name => 'slack_render',
  concurrency => null,
  rate_limit => 600,
  rate_per => 60
);

-- queues no longer declared lose their limits
select flowlane.keep_only_queue_limits(array['deliver_slack_alerts', 'slack_render']::text[]);

commit;
