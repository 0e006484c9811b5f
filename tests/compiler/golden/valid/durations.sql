-- ==> aliases.sql <==
-- flowlane-compiled: {"format":2,"kind":"aliases"}
-- aliases; do not edit: change the YAML and run `flowlane compile`
begin;

commit;
-- ==> flows/durations.sql <==
-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"0396a1ac55682ff58efe404f2ce0257387a803810357cddfeb045ac7e87742a2","slug":"durations"}
-- flow durations from durations.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'durations',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"durations","slug":"fetch","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["fetch"],"queue":"durations","slug":"store","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'durations';

select flowlane.create_flow(
  flow_slug => 'durations',
  max_attempts => 3,
  base_delay => 10,
  timeout => 300,
  queue_mode => 'flow'
);

select flowlane.add_step(
  flow_slug => 'durations',
  step_slug => 'fetch',
  deps_slugs => array[]::text[],
  max_attempts => null,
  base_delay => null,
  timeout => 7200,
  start_delay => 86400,
  step_type => 'single',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'durations'
);

select flowlane.add_step(
  flow_slug => 'durations',
  step_slug => 'store',
  deps_slugs => array['fetch']::text[],
  max_attempts => null,
  base_delay => 0,
  timeout => 45,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'durations'
);

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'durations',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"durations","slug":"fetch","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["fetch"],"queue":"durations","slug":"store","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
