-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"cd1e803ed94ff921050ff64419eb52e94dcfb0247fd5d104b357ce74c4d715e1","slug":"community_threads_v1"}
-- flow community_threads_v1 from flows/community_threads.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'community_threads_v1',
  shape => '{"queue_mode":"explicit","steps":[{"if":null,"needs":[],"queue":"classify_threads","slug":"fetch","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["fetch"],"queue":"classify_threads","slug":"classify","type":"map","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["classify","fetch"],"queue":"deliver_slack_alerts","slug":"deliver_slack","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'community_threads_v1';

select flowlane.create_flow(
  flow_slug => 'community_threads_v1',
  max_attempts => 3,
  base_delay => 5,
  timeout => 60,
  queue_mode => 'explicit'
);

select flowlane.add_step(
  flow_slug => 'community_threads_v1',
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
  flow_slug => 'community_threads_v1',
  step_slug => 'classify',
  deps_slugs => array['fetch']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'map',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'classify_threads'
);

select flowlane.add_step(
  flow_slug => 'community_threads_v1',
  step_slug => 'deliver_slack',
  deps_slugs => array['classify', 'fetch']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'deliver_slack_alerts'
);

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'community_threads_v1',
  shape => '{"queue_mode":"explicit","steps":[{"if":null,"needs":[],"queue":"classify_threads","slug":"fetch","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["fetch"],"queue":"classify_threads","slug":"classify","type":"map","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["classify","fetch"],"queue":"deliver_slack_alerts","slug":"deliver_slack","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
