-- ==> aliases.sql <==
-- flowlane-compiled: {"format":2,"kind":"aliases"}
-- aliases; do not edit: change the YAML and run `flowlane compile`
begin;

commit;
-- ==> flows/callbacks.sql <==
-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"52a7a2d1e14b1b22dd41e71ed46068962dfb792d6ac1ea67263eb04b6c87365e","slug":"callbacks"}
-- flow callbacks from wait_steps_explicit_queues.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'callbacks',
  shape => '{"queue_mode":"explicit","steps":[{"if":null,"needs":[],"queue":"outbound","slug":"send","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["send"],"queue":null,"slug":"reply","type":"wait","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["reply"],"queue":"outbound","slug":"record","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'callbacks';

select flowlane.create_flow(
  flow_slug => 'callbacks',
  max_attempts => 3,
  base_delay => 5,
  timeout => 60,
  queue_mode => 'explicit'
);

select flowlane.add_step(
  flow_slug => 'callbacks',
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
  queue_name => 'outbound'
);

select flowlane.add_step(
  flow_slug => 'callbacks',
  step_slug => 'reply',
  deps_slugs => array['send']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'wait',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => null
);

select flowlane.add_step(
  flow_slug => 'callbacks',
  step_slug => 'record',
  deps_slugs => array['reply']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'outbound'
);

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'callbacks',
  shape => '{"queue_mode":"explicit","steps":[{"if":null,"needs":[],"queue":"outbound","slug":"send","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["send"],"queue":null,"slug":"reply","type":"wait","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["reply"],"queue":"outbound","slug":"record","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
