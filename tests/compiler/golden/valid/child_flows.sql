-- ==> aliases.sql <==
-- flowlane-compiled: {"format":2,"kind":"aliases"}
-- aliases; do not edit: change the YAML and run `flowlane compile`
begin;

-- alias invoicing from child_flows.yaml
select flowlane.set_alias(
  alias => 'invoicing',
  flow_slug => 'invoicing_v1',
  draining => array[]::text[]
);

commit;
-- ==> flows/invoicing_v1.sql <==
-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"45e99132ec317ecd0cb2927d3848e6c5a5218ef0ca1f3f7a09886614f87f7419","slug":"invoicing_v1"}
-- flow invoicing_v1 from child_flows.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'invoicing_v1',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"invoicing_v1","slug":"bill","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'invoicing_v1';

select flowlane.create_flow(
  flow_slug => 'invoicing_v1',
  max_attempts => 3,
  base_delay => 5,
  timeout => 60,
  queue_mode => 'flow'
);

select flowlane.add_step(
  flow_slug => 'invoicing_v1',
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
  queue_name => 'invoicing_v1'
);

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'invoicing_v1',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"invoicing_v1","slug":"bill","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
-- ==> flows/orders.sql <==
-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"1240fa5894da94a3409e1244771813ba211dd81fb1bad55576714d45788aa636","slug":"orders"}
-- flow orders from child_flows.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'orders',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"orders","slug":"split","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"flow":"pack_line","if":null,"needs":["split"],"queue":null,"slug":"each","type":"map","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"flow":"invoicing","if":null,"needs":["each"],"queue":null,"slug":"invoice","type":"single","unless":null,"when_exhausted":"skip","when_unmet":"skip"}]}'::jsonb
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
  step_slug => 'split',
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
  step_slug => 'each',
  deps_slugs => array['split']::text[],
  max_attempts => 2,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'map',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => null,
  child_flow => 'pack_line'
);

select flowlane.add_step(
  flow_slug => 'orders',
  step_slug => 'invoice',
  deps_slugs => array['each']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'skip',
  queue_name => null,
  child_flow => 'invoicing'
);

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'orders',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"orders","slug":"split","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"flow":"pack_line","if":null,"needs":["split"],"queue":null,"slug":"each","type":"map","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"flow":"invoicing","if":null,"needs":["each"],"queue":null,"slug":"invoice","type":"single","unless":null,"when_exhausted":"skip","when_unmet":"skip"}]}'::jsonb
);

commit;
-- ==> flows/pack_line.sql <==
-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"538afd69d4739bca7c4396cbda50e0e282d69695b901548e96eda1fbc56ccb37","slug":"pack_line"}
-- flow pack_line from child_flows.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'pack_line',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"pack_line","slug":"pack","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'pack_line';

select flowlane.create_flow(
  flow_slug => 'pack_line',
  max_attempts => 3,
  base_delay => 5,
  timeout => 60,
  queue_mode => 'flow'
);

select flowlane.add_step(
  flow_slug => 'pack_line',
  step_slug => 'pack',
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
  queue_name => 'pack_line'
);

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'pack_line',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"pack_line","slug":"pack","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
