-- ==> aliases.sql <==
-- flowlane-compiled: {"format":2,"kind":"aliases"}
-- aliases; do not edit: change the YAML and run `flowlane compile`
begin;

commit;
-- ==> flows/anchors.sql <==
-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"f7fc11b90d04c2cb37e526f851887dbe12309b90eb81a8d52e648d9f8165d50c","slug":"anchors"}
-- flow anchors from anchors_for_repeated_conditions.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'anchors',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"anchors","slug":"fetch","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":{"fetch":{"urgent":true}},"needs":["fetch"],"queue":"anchors","slug":"a","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["fetch"],"queue":"anchors","slug":"b","type":"single","unless":{"fetch":{"urgent":true}},"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'anchors';

select flowlane.create_flow(
  flow_slug => 'anchors',
  max_attempts => 3,
  base_delay => 5,
  timeout => 60,
  queue_mode => 'flow'
);

select flowlane.add_step(
  flow_slug => 'anchors',
  step_slug => 'fetch',
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
  queue_name => 'anchors'
);

select flowlane.add_step(
  flow_slug => 'anchors',
  step_slug => 'a',
  deps_slugs => array['fetch']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => '{"fetch":{"urgent":true}}'::jsonb,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'anchors'
);

select flowlane.add_step(
  flow_slug => 'anchors',
  step_slug => 'b',
  deps_slugs => array['fetch']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => null,
  forbidden_input_pattern => '{"fetch":{"urgent":true}}'::jsonb,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'anchors'
);

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'anchors',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"anchors","slug":"fetch","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":{"fetch":{"urgent":true}},"needs":["fetch"],"queue":"anchors","slug":"a","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["fetch"],"queue":"anchors","slug":"b","type":"single","unless":{"fetch":{"urgent":true}},"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
