-- ==> aliases.sql <==
-- flowlane-compiled: {"format":2,"kind":"aliases"}
-- aliases; do not edit: change the YAML and run `flowlane compile`
begin;

commit;
-- ==> flows/thumbnails.sql <==
-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"c32077da44d5a0322bbf6100bba367f3b8d2eda30f5a8e9a64c23abc1e7d84aa","slug":"thumbnails"}
-- flow thumbnails from queue_archive.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'thumbnails',
  shape => '{"queue_mode":"explicit","steps":[{"if":null,"needs":[],"queue":"thumbnail_fetch","slug":"fetch","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["fetch"],"queue":"thumbnail_resize","slug":"resize","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["resize"],"queue":"thumbnail_store","slug":"store","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'thumbnails';

select flowlane.create_flow(
  flow_slug => 'thumbnails',
  max_attempts => 3,
  base_delay => 5,
  timeout => 60,
  queue_mode => 'explicit'
);

select flowlane.add_step(
  flow_slug => 'thumbnails',
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
  queue_name => 'thumbnail_fetch'
);

select flowlane.add_step(
  flow_slug => 'thumbnails',
  step_slug => 'resize',
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
  queue_name => 'thumbnail_resize'
);

select flowlane.add_step(
  flow_slug => 'thumbnails',
  step_slug => 'store',
  deps_slugs => array['resize']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'thumbnail_store'
);

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'thumbnails',
  shape => '{"queue_mode":"explicit","steps":[{"if":null,"needs":[],"queue":"thumbnail_fetch","slug":"fetch","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["fetch"],"queue":"thumbnail_resize","slug":"resize","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["resize"],"queue":"thumbnail_store","slug":"store","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
-- ==> queues.sql <==
-- flowlane-compiled: {"format":2,"kind":"queues"}
-- queue limits; do not edit: change the YAML and run `flowlane compile`
begin;

-- queue thumbnail_fetch from queue_archive.yaml
select flowlane.set_queue_limits(
  queue_name => 'thumbnail_fetch',
  concurrency => null,
  rate_limit => null,
  rate_per => null,
  archive => false
);

-- queue thumbnail_resize from queue_archive.yaml
select flowlane.set_queue_limits(
  queue_name => 'thumbnail_resize',
  concurrency => 4,
  rate_limit => null,
  rate_per => null,
  archive => false
);

-- queue thumbnail_store from queue_archive.yaml
select flowlane.set_queue_limits(
  queue_name => 'thumbnail_store',
  concurrency => 2,
  rate_limit => null,
  rate_per => null
);

-- queues no longer declared lose their limits
select flowlane.keep_only_queue_limits(array['thumbnail_fetch', 'thumbnail_resize', 'thumbnail_store']::text[]);

commit;
