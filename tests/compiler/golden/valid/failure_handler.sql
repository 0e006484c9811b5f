-- ==> aliases.sql <==
-- flowlane-compiled: {"format":2,"kind":"aliases"}
-- aliases; do not edit: change the YAML and run `flowlane compile`
begin;

-- alias undo_order from failure_handler.yaml
select flowlane.set_alias(
  alias => 'undo_order',
  flow_slug => 'undo_order_v1',
  draining => array[]::text[]
);

commit;
-- ==> flows/orders.sql <==
-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"db409be255f106ea66289c5e4bd30578ebe6433beb10e7a32225038ee69b6213","slug":"orders"}
-- flow orders from failure_handler.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'orders',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"orders","slug":"charge","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'orders';

select flowlane.create_flow(
  flow_slug => 'orders',
  max_attempts => 3,
  base_delay => 5,
  timeout => 60,
  queue_mode => 'flow',
  on_failure => 'undo_order'
);

select flowlane.add_step(
  flow_slug => 'orders',
  step_slug => 'charge',
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

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'orders',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"orders","slug":"charge","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
-- ==> flows/refunds.sql <==
-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"66e1c95e52573cede2e2a6cd173cfe12a0279fb6bfbf90bc0fba0cea6ace1f8e","slug":"refunds"}
-- flow refunds from failure_handler.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'refunds',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"refunds","slug":"refund","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'refunds';

select flowlane.create_flow(
  flow_slug => 'refunds',
  max_attempts => 3,
  base_delay => 5,
  timeout => 60,
  queue_mode => 'flow',
  on_failure => 'undo_order',
  on_failure_on_cancel => true
);

select flowlane.add_step(
  flow_slug => 'refunds',
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
  queue_name => 'refunds'
);

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'refunds',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"refunds","slug":"refund","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
-- ==> flows/undo_order_v1.sql <==
-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"f829f10d2adad6cb9d2e23d571851b707e63f55179f19fbe2d871fee481091d2","slug":"undo_order_v1"}
-- flow undo_order_v1 from failure_handler.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'undo_order_v1',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"undo_order_v1","slug":"report","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'undo_order_v1';

select flowlane.create_flow(
  flow_slug => 'undo_order_v1',
  max_attempts => 3,
  base_delay => 5,
  timeout => 60,
  queue_mode => 'flow'
);

select flowlane.add_step(
  flow_slug => 'undo_order_v1',
  step_slug => 'report',
  deps_slugs => array[]::text[],
  max_attempts => 5,
  base_delay => null,
  timeout => 120,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'undo_order_v1'
);

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'undo_order_v1',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"undo_order_v1","slug":"report","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
