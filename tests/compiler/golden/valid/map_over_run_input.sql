-- ==> aliases.sql <==
-- flowlane-compiled: {"format":2,"kind":"aliases"}
-- aliases; do not edit: change the YAML and run `flowlane compile`
begin;

commit;
-- ==> flows/mapper.sql <==
-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"66554045f3b3db83b54f85f98b970b2eb10927ee2bdd15ae74a4a55858449875","slug":"mapper"}
-- flow mapper from map_over_run_input.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'mapper',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"mapper","slug":"each","type":"map","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["each"],"queue":"mapper","slug":"sum","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'mapper';

select flowlane.create_flow(
  flow_slug => 'mapper',
  max_attempts => 3,
  base_delay => 5,
  timeout => 60,
  queue_mode => 'flow'
);

select flowlane.add_step(
  flow_slug => 'mapper',
  step_slug => 'each',
  deps_slugs => array[]::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'map',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'mapper'
);

select flowlane.add_step(
  flow_slug => 'mapper',
  step_slug => 'sum',
  deps_slugs => array['each']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'mapper'
);

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'mapper',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"mapper","slug":"each","type":"map","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["each"],"queue":"mapper","slug":"sum","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
