-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"a311094021799c49ec5a66b46d59cd6f30f4623412db1b6f18289bce8266feaf","slug":"hello_world"}
-- flow hello_world from flows/hello_world.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'hello_world',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"hello_world","slug":"greet","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'hello_world';

select flowlane.create_flow(
  flow_slug => 'hello_world',
  max_attempts => 3,
  base_delay => 5,
  timeout => 60,
  queue_mode => 'flow'
);

select flowlane.add_step(
  flow_slug => 'hello_world',
  step_slug => 'greet',
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
  queue_name => 'hello_world'
);

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'hello_world',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"hello_world","slug":"greet","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
