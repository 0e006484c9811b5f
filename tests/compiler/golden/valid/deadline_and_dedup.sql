-- ==> aliases.sql <==
-- flowlane-compiled: {"format":2,"kind":"aliases"}
-- aliases; do not edit: change the YAML and run `flowlane compile`
begin;

commit;
-- ==> flows/orders.sql <==
-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"db409be255f106ea66289c5e4bd30578ebe6433beb10e7a32225038ee69b6213","slug":"orders"}
-- flow orders from deadline_and_dedup.yaml; do not edit: change the YAML and run `flowlane compile`
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
  deadline => 7200,
  dedup_key => '/order/id'
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
