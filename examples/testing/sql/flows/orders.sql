-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"adc8631d83f3d404a7067bf843b0dcf29a53d0aebc771a30ff76a9ce7bf921f0","slug":"orders"}
-- flow orders from flows/orders.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'orders',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"orders","slug":"validate","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["validate"],"queue":"orders","slug":"lines","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["lines"],"queue":"orders","slug":"price","type":"map","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["price"],"queue":"orders","slug":"total","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["total"],"queue":"orders","slug":"ship","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'orders';

select flowlane.create_flow(
  flow_slug => 'orders',
  max_attempts => 3,
  base_delay => 5,
  timeout => 60,
  queue_mode => 'flow'
);

select flowlane.add_step(
  flow_slug => 'orders',
  step_slug => 'validate',
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
  queue_name => 'orders'
);

select flowlane.add_step(
  flow_slug => 'orders',
  step_slug => 'lines',
  deps_slugs => array['validate']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'orders'
);

select flowlane.add_step(
  flow_slug => 'orders',
  step_slug => 'price',
  deps_slugs => array['lines']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'map',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'orders'
);

select flowlane.add_step(
  flow_slug => 'orders',
  step_slug => 'total',
  deps_slugs => array['price']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'orders'
);

select flowlane.add_step(
  flow_slug => 'orders',
  step_slug => 'ship',
  deps_slugs => array['total']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'orders'
);

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'orders',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"orders","slug":"validate","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["validate"],"queue":"orders","slug":"lines","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["lines"],"queue":"orders","slug":"price","type":"map","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["price"],"queue":"orders","slug":"total","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["total"],"queue":"orders","slug":"ship","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
