-- ==> aliases.sql <==
-- flowlane-compiled: {"format":2,"kind":"aliases"}
-- aliases; do not edit: change the YAML and run `flowlane compile`
begin;

commit;
-- ==> flows/orders.sql <==
-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"d50b5b402d1433d7c6e42dee4c555f48d7d5dbab46121cd1736ed21bf6eeb94c","slug":"orders"}
-- flow orders from compensation.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'orders',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"orders","slug":"reserve","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["reserve"],"queue":"orders","slug":"charge","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["charge"],"queue":"orders","slug":"ship","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
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
  step_slug => 'reserve',
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
  queue_name => 'orders',
  compensate => 'release_stock'
);

select flowlane.add_step(
  flow_slug => 'orders',
  step_slug => 'charge',
  deps_slugs => array['reserve']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'orders',
  compensate => 'refund'
);

select flowlane.add_step(
  flow_slug => 'orders',
  step_slug => 'ship',
  deps_slugs => array['charge']::text[],
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
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"orders","slug":"reserve","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["reserve"],"queue":"orders","slug":"charge","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["charge"],"queue":"orders","slug":"ship","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
-- ==> flows/refund.sql <==
-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"eb79d16ba50021072f3eef3c18d706d4efd8651ed0a5e4b304f6f182a273e1fa","slug":"refund"}
-- flow refund from compensation.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'refund',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"refund","slug":"refund","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'refund';

select flowlane.create_flow(
  flow_slug => 'refund',
  max_attempts => 3,
  base_delay => 5,
  timeout => 60,
  queue_mode => 'flow'
);

select flowlane.add_step(
  flow_slug => 'refund',
  step_slug => 'refund',
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
  queue_name => 'refund'
);

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'refund',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"refund","slug":"refund","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
-- ==> flows/release_stock.sql <==
-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"58a4c2db5a482f403b50baf036d4f68835715d9242282ecbd217e9ad002fb5c4","slug":"release_stock"}
-- flow release_stock from compensation.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'release_stock',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"release_stock","slug":"release","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'release_stock';

select flowlane.create_flow(
  flow_slug => 'release_stock',
  max_attempts => 3,
  base_delay => 5,
  timeout => 60,
  queue_mode => 'flow'
);

select flowlane.add_step(
  flow_slug => 'release_stock',
  step_slug => 'release',
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
  queue_name => 'release_stock'
);

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'release_stock',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"release_stock","slug":"release","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
