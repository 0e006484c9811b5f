-- ==> aliases.sql <==
-- flowlane-compiled: {"format":2,"kind":"aliases"}
-- aliases; do not edit: change the YAML and run `flowlane compile`
begin;

commit;
-- ==> flows/embeddings.sql <==
-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"c8bee830a69b16b641086cc315d7bcda65062df9af1c66894761acc0526666d0","slug":"embeddings"}
-- flow embeddings from step_cache.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'embeddings',
  shape => '{"input_schema":{"properties":{"lang":{"type":"string"},"url":{"type":"string"}},"type":"object"},"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"embeddings","slug":"fetch","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["fetch"],"queue":"embeddings","slug":"split","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["split"],"queue":"embeddings","slug":"embed","type":"map","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["embed"],"queue":"embeddings","slug":"report","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'embeddings';

select flowlane.create_flow(
  flow_slug => 'embeddings',
  max_attempts => 3,
  base_delay => 5,
  timeout => 60,
  queue_mode => 'flow'
);

select flowlane.add_step(
  flow_slug => 'embeddings',
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
  queue_name => 'embeddings',
  cache_ttl => 86400,
  cache_key => array['/url', '/lang']::text[],
  cache_fingerprint => 'f1d3f70b29953fd824dbbd4488d127a9'
);

select flowlane.add_step(
  flow_slug => 'embeddings',
  step_slug => 'split',
  deps_slugs => array['fetch']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'embeddings'
);

select flowlane.add_step(
  flow_slug => 'embeddings',
  step_slug => 'embed',
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
  queue_name => 'embeddings',
  cache_ttl => 604800,
  cache_fingerprint => '104833ad584a7252804f1fbe9fa481a2'
);

select flowlane.add_step(
  flow_slug => 'embeddings',
  step_slug => 'report',
  deps_slugs => array['embed']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'embeddings',
  cache_ttl => 3600,
  cache_key => array['/embed']::text[],
  cache_fingerprint => '26d1af5bac3a0fd82b59433f988c9923'
);

-- the run input's contract (start_flow and start_flows refuse an input it rejects)
select flowlane.set_contract(
  flow_slug => 'embeddings',
  step_slug => null,
  schema => '{"properties":{"lang":{"type":"string"},"url":{"type":"string"}},"type":"object"}'::jsonb
);

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'embeddings',
  shape => '{"input_schema":{"properties":{"lang":{"type":"string"},"url":{"type":"string"}},"type":"object"},"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"embeddings","slug":"fetch","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["fetch"],"queue":"embeddings","slug":"split","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["split"],"queue":"embeddings","slug":"embed","type":"map","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["embed"],"queue":"embeddings","slug":"report","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
