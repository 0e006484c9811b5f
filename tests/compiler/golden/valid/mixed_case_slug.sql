-- ==> aliases.sql <==
-- flowlane-compiled: {"format":2,"kind":"aliases"}
-- aliases; do not edit: change the YAML and run `flowlane compile`
begin;

commit;
-- ==> flows/BillingFlow.sql <==
-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"84b6c500c7e585843a2272d87c4d2a291f7eefe3f874ed7daad128936a7aec44","slug":"BillingFlow"}
-- flow BillingFlow from mixed_case_slug.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'BillingFlow',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"billingflow","slug":"Charge","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'BillingFlow';

select flowlane.create_flow(
  flow_slug => 'BillingFlow',
  max_attempts => 3,
  base_delay => 5,
  timeout => 60,
  queue_mode => 'flow'
);

select flowlane.add_step(
  flow_slug => 'BillingFlow',
  step_slug => 'Charge',
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
  queue_name => 'billingflow'
);

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'BillingFlow',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"billingflow","slug":"Charge","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
