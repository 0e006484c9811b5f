-- ==> aliases.sql <==
-- flowlane-compiled: {"format":2,"kind":"aliases"}
-- aliases; do not edit: change the YAML and run `flowlane compile`
begin;

commit;
-- ==> flows/options.sql <==
-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"26f89e2314c79372d31f30de741d56df958b21f1867262c970de50db15bcfdaf","slug":"options"}
-- flow options from every_option.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'options',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"options","slug":"first","type":"single","unless":null,"when_exhausted":"skip-cascade","when_unmet":"skip"},{"if":{"first":{"ok":true}},"needs":["first"],"queue":"options","slug":"second","type":"single","unless":null,"when_exhausted":"skip","when_unmet":"fail"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'options';

select flowlane.create_flow(
  flow_slug => 'options',
  max_attempts => 7,
  base_delay => 0,
  timeout => 3,
  queue_mode => 'flow'
);

select flowlane.add_step(
  flow_slug => 'options',
  step_slug => 'first',
  deps_slugs => array[]::text[],
  max_attempts => 1,
  base_delay => 2,
  timeout => 300,
  start_delay => 15,
  step_type => 'single',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'skip-cascade',
  queue_name => 'options'
);

select flowlane.add_step(
  flow_slug => 'options',
  step_slug => 'second',
  deps_slugs => array['first']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => '{"first":{"ok":true}}'::jsonb,
  forbidden_input_pattern => null,
  when_unmet => 'fail',
  when_exhausted => 'skip',
  queue_name => 'options'
);

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'options',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"options","slug":"first","type":"single","unless":null,"when_exhausted":"skip-cascade","when_unmet":"skip"},{"if":{"first":{"ok":true}},"needs":["first"],"queue":"options","slug":"second","type":"single","unless":null,"when_exhausted":"skip","when_unmet":"fail"}]}'::jsonb
);

commit;
