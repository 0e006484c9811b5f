-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"07cb12889c653fd3979418590543f7a1eac0c4d3590db1e896040b71534829a7","slug":"approval"}
-- flow approval from flows/approval.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'approval',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"approval","slug":"request","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["request"],"queue":null,"slug":"approve","type":"wait","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["approve"],"queue":"approval","slug":"notify","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'approval';

select flowlane.create_flow(
  flow_slug => 'approval',
  max_attempts => 3,
  base_delay => 5,
  timeout => 60,
  queue_mode => 'flow'
);

select flowlane.add_step(
  flow_slug => 'approval',
  step_slug => 'request',
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
  queue_name => 'approval'
);

select flowlane.add_step(
  flow_slug => 'approval',
  step_slug => 'approve',
  deps_slugs => array['request']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => 86400,
  start_delay => null,
  step_type => 'wait',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => null
);

select flowlane.add_step(
  flow_slug => 'approval',
  step_slug => 'notify',
  deps_slugs => array['approve']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'approval'
);

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'approval',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"approval","slug":"request","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["request"],"queue":null,"slug":"approve","type":"wait","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["approve"],"queue":"approval","slug":"notify","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
