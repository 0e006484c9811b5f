-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"4a92af6fa63b101cd0ff105e89f9119a37f2f4bb5d8d9d1dc956a8ee90faf700","slug":"diamond"}
-- flow diamond from flows/diamond.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'diamond',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"diamond","slug":"split","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["split"],"queue":"diamond","slug":"square","type":"map","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["split"],"queue":"diamond","slug":"describe","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["describe","square"],"queue":"diamond","slug":"total","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":{"total":{"notify":true}},"needs":["total"],"queue":"diamond","slug":"notify","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'diamond';

select flowlane.create_flow(
  flow_slug => 'diamond',
  max_attempts => 3,
  base_delay => 1,
  timeout => 30,
  queue_mode => 'flow'
);

select flowlane.add_step(
  flow_slug => 'diamond',
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
  queue_name => 'diamond'
);

select flowlane.add_step(
  flow_slug => 'diamond',
  step_slug => 'square',
  deps_slugs => array['split']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'map',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'diamond'
);

select flowlane.add_step(
  flow_slug => 'diamond',
  step_slug => 'describe',
  deps_slugs => array['split']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'diamond'
);

select flowlane.add_step(
  flow_slug => 'diamond',
  step_slug => 'total',
  deps_slugs => array['describe', 'square']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'diamond'
);

select flowlane.add_step(
  flow_slug => 'diamond',
  step_slug => 'notify',
  deps_slugs => array['total']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => '{"total":{"notify":true}}'::jsonb,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'diamond'
);

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'diamond',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"diamond","slug":"split","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["split"],"queue":"diamond","slug":"square","type":"map","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["split"],"queue":"diamond","slug":"describe","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["describe","square"],"queue":"diamond","slug":"total","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":{"total":{"notify":true}},"needs":["total"],"queue":"diamond","slug":"notify","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
