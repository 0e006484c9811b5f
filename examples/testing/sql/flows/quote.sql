-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"d976fcb7477f31073f03e04b83738aae0085ade1ddb4dbfc41bb33f7f53bb43e","slug":"quote"}
-- flow quote from flows/quote.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'quote',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"quote","slug":"offer","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["offer"],"queue":null,"slug":"accept","type":"wait","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'quote';

select flowlane.create_flow(
  flow_slug => 'quote',
  max_attempts => 3,
  base_delay => 5,
  timeout => 60,
  queue_mode => 'flow',
  deadline => 3600
);

select flowlane.add_step(
  flow_slug => 'quote',
  step_slug => 'offer',
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
  queue_name => 'quote'
);

select flowlane.add_step(
  flow_slug => 'quote',
  step_slug => 'accept',
  deps_slugs => array['offer']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => 86400,
  start_delay => null,
  step_type => 'wait',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => null
);

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'quote',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"quote","slug":"offer","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["offer"],"queue":null,"slug":"accept","type":"wait","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
