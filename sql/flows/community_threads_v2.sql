-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"90879420874af5c6ff7b98a37597a49b00c90d89a03a1ea12aebd4697cdf4301","slug":"community_threads_v2"}
-- flow community_threads_v2 from flows/community_threads.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'community_threads_v2',
  shape => '{"queue_mode":"explicit","steps":[{"if":null,"needs":[],"queue":"classify_threads","slug":"fetch","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["fetch"],"queue":"classify_threads","slug":"classify","type":"map","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":{"classify":[{"label":"question"}]},"needs":["classify","fetch"],"queue":"deliver_slack_alerts","slug":"deliver_slack","type":"single","unless":{"classify":[{"label":"spam"}]},"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'community_threads_v2';

select flowlane.create_flow(
  flow_slug => 'community_threads_v2',
  max_attempts => 3,
  base_delay => 5,
  timeout => 60,
  queue_mode => 'explicit'
);

select flowlane.add_step(
  flow_slug => 'community_threads_v2',
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
  queue_name => 'classify_threads'
);

select flowlane.add_step(
  flow_slug => 'community_threads_v2',
  step_slug => 'classify',
  deps_slugs => array['fetch']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => 120,
  start_delay => null,
  step_type => 'map',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'classify_threads'
);

select flowlane.add_step(
  flow_slug => 'community_threads_v2',
  step_slug => 'deliver_slack',
  deps_slugs => array['classify', 'fetch']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => '{"classify":[{"label":"question"}]}'::jsonb,
  forbidden_input_pattern => '{"classify":[{"label":"spam"}]}'::jsonb,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'deliver_slack_alerts'
);

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'community_threads_v2',
  shape => '{"queue_mode":"explicit","steps":[{"if":null,"needs":[],"queue":"classify_threads","slug":"fetch","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["fetch"],"queue":"classify_threads","slug":"classify","type":"map","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":{"classify":[{"label":"question"}]},"needs":["classify","fetch"],"queue":"deliver_slack_alerts","slug":"deliver_slack","type":"single","unless":{"classify":[{"label":"spam"}]},"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
