-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"1b21eb7d2dc0ff772d89719336053bffbe765032f59453bd2fb56533982a2355","slug":"forum_digest"}
-- flow forum_digest from flows/community_threads.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'forum_digest',
  shape => '{"queue_mode":"explicit","steps":[{"if":null,"needs":[],"queue":"classify_threads","slug":"collect","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["collect"],"queue":"classify_threads","slug":"summarise","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'forum_digest';

select flowlane.create_flow(
  flow_slug => 'forum_digest',
  max_attempts => 3,
  base_delay => 5,
  timeout => 60,
  queue_mode => 'explicit'
);

select flowlane.add_step(
  flow_slug => 'forum_digest',
  step_slug => 'collect',
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
  queue_name => 'classify_threads'
);

select flowlane.add_step(
  flow_slug => 'forum_digest',
  step_slug => 'summarise',
  deps_slugs => array['collect']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'classify_threads'
);

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'forum_digest',
  shape => '{"queue_mode":"explicit","steps":[{"if":null,"needs":[],"queue":"classify_threads","slug":"collect","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["collect"],"queue":"classify_threads","slug":"summarise","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
