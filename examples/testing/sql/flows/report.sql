-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"c91b57344c97ba20b5ced23dae16ed86be0997f2a9284a0d0a7ac1ef3c049a76","slug":"report"}
-- flow report from flows/report.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'report',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"report","slug":"build","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'report';

select flowlane.create_flow(
  flow_slug => 'report',
  max_attempts => 3,
  base_delay => 5,
  timeout => 60,
  queue_mode => 'flow'
);

select flowlane.add_step(
  flow_slug => 'report',
  step_slug => 'build',
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
  queue_name => 'report'
);

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'report',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"report","slug":"build","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
