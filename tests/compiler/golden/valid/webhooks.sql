-- ==> aliases.sql <==
-- flowlane-compiled: {"format":2,"kind":"aliases"}
-- aliases; do not edit: change the YAML and run `flowlane compile`
begin;

-- alias pay from webhooks.yaml
select flowlane.set_alias(
  alias => 'pay',
  flow_slug => 'pay_v1',
  draining => array[]::text[]
);

commit;
-- ==> flows/pay_v1.sql <==
-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"db05da1772261525a20ed7098ef80866f4dc327564c7498fb19c287512a8fd94","slug":"pay_v1"}
-- flow pay_v1 from webhooks.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'pay_v1',
  shape => '{"input_schema":{"properties":{"order_id":{"type":"integer"}},"required":["order_id"],"type":"object"},"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"pay_v1","slug":"charge","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["charge"],"queue":null,"slug":"approve","type":"wait","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'pay_v1';

select flowlane.create_flow(
  flow_slug => 'pay_v1',
  max_attempts => 3,
  base_delay => 5,
  timeout => 60,
  queue_mode => 'flow'
);

select flowlane.add_step(
  flow_slug => 'pay_v1',
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
  queue_name => 'pay_v1'
);

select flowlane.add_step(
  flow_slug => 'pay_v1',
  step_slug => 'approve',
  deps_slugs => array['charge']::text[],
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

-- the run input's contract (start_flow and start_flows refuse an input it rejects)
select flowlane.set_contract(
  flow_slug => 'pay_v1',
  step_slug => null,
  schema => '{"properties":{"order_id":{"type":"integer"}},"required":["order_id"],"type":"object"}'::jsonb
);

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'pay_v1',
  shape => '{"input_schema":{"properties":{"order_id":{"type":"integer"}},"required":["order_id"],"type":"object"},"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"pay_v1","slug":"charge","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["charge"],"queue":null,"slug":"approve","type":"wait","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
