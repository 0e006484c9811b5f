-- ==> aliases.sql <==
-- flowlane-compiled: {"format":2,"kind":"aliases"}
-- aliases; do not edit: change the YAML and run `flowlane compile`
begin;

commit;
-- ==> flows/out_of_order.sql <==
-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"043fd0b386ee0b42181f92bf3e9528caa8e6614647204a8c992d31045243942b","slug":"out_of_order"}
-- flow out_of_order from steps_declared_out_of_order.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'out_of_order',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"out_of_order","slug":"start","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["start"],"queue":"out_of_order","slug":"right","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["start"],"queue":"out_of_order","slug":"left","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["left","right"],"queue":"out_of_order","slug":"merge","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["merge"],"queue":"out_of_order","slug":"report","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'out_of_order';

select flowlane.create_flow(
  flow_slug => 'out_of_order',
  max_attempts => 3,
  base_delay => 5,
  timeout => 60,
  queue_mode => 'flow'
);

select flowlane.add_step(
  flow_slug => 'out_of_order',
  step_slug => 'start',
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
  queue_name => 'out_of_order'
);

select flowlane.add_step(
  flow_slug => 'out_of_order',
  step_slug => 'right',
  deps_slugs => array['start']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'out_of_order'
);

select flowlane.add_step(
  flow_slug => 'out_of_order',
  step_slug => 'left',
  deps_slugs => array['start']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'out_of_order'
);

select flowlane.add_step(
  flow_slug => 'out_of_order',
  step_slug => 'merge',
  deps_slugs => array['left', 'right']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'out_of_order'
);

select flowlane.add_step(
  flow_slug => 'out_of_order',
  step_slug => 'report',
  deps_slugs => array['merge']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'out_of_order'
);

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'out_of_order',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"out_of_order","slug":"start","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["start"],"queue":"out_of_order","slug":"right","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["start"],"queue":"out_of_order","slug":"left","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["left","right"],"queue":"out_of_order","slug":"merge","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["merge"],"queue":"out_of_order","slug":"report","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
