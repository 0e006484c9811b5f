-- ==> aliases.sql <==
-- flowlane-compiled: {"format":2,"kind":"aliases"}
-- aliases; do not edit: change the YAML and run `flowlane compile`
begin;

-- alias threads from versions_alias_workers.yaml
select flowlane.set_alias(
  alias => 'threads',
  flow_slug => 'threads_v2',
  draining => array['threads_v1']::text[]
);

commit;
-- ==> flows/threads_v1.sql <==
-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"67efe34b2fbe07f8be5b5e3d778fc679c16fc7925efb8c20702f8d86e28cb053","slug":"threads_v1"}
-- flow threads_v1 from versions_alias_workers.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'threads_v1',
  shape => '{"queue_mode":"explicit","steps":[{"if":null,"needs":[],"queue":"threads_work","slug":"fetch","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["fetch"],"queue":"threads_alerts","slug":"notify","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'threads_v1';

select flowlane.create_flow(
  flow_slug => 'threads_v1',
  max_attempts => 3,
  base_delay => 5,
  timeout => 60,
  queue_mode => 'explicit'
);

select flowlane.add_step(
  flow_slug => 'threads_v1',
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
  queue_name => 'threads_work'
);

select flowlane.add_step(
  flow_slug => 'threads_v1',
  step_slug => 'notify',
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
  queue_name => 'threads_alerts'
);

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'threads_v1',
  shape => '{"queue_mode":"explicit","steps":[{"if":null,"needs":[],"queue":"threads_work","slug":"fetch","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["fetch"],"queue":"threads_alerts","slug":"notify","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
-- ==> flows/threads_v2.sql <==
-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"753f0667d396414d14b4137a7cdfdb6aa10a4e5ee06fb957f6d20f0b2f6aa228","slug":"threads_v2"}
-- flow threads_v2 from versions_alias_workers.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'threads_v2',
  shape => '{"queue_mode":"explicit","steps":[{"if":null,"needs":[],"queue":"threads_work","slug":"fetch","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["fetch"],"queue":"threads_work","slug":"classify","type":"map","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":{"fetch":{"urgent":true}},"needs":["classify","fetch"],"queue":"threads_alerts","slug":"notify","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'threads_v2';

select flowlane.create_flow(
  flow_slug => 'threads_v2',
  max_attempts => 3,
  base_delay => 5,
  timeout => 60,
  queue_mode => 'explicit'
);

select flowlane.add_step(
  flow_slug => 'threads_v2',
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
  queue_name => 'threads_work'
);

select flowlane.add_step(
  flow_slug => 'threads_v2',
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
  queue_name => 'threads_work'
);

select flowlane.add_step(
  flow_slug => 'threads_v2',
  step_slug => 'notify',
  deps_slugs => array['classify', 'fetch']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => '{"fetch":{"urgent":true}}'::jsonb,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'threads_alerts'
);

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'threads_v2',
  shape => '{"queue_mode":"explicit","steps":[{"if":null,"needs":[],"queue":"threads_work","slug":"fetch","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["fetch"],"queue":"threads_work","slug":"classify","type":"map","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":{"fetch":{"urgent":true}},"needs":["classify","fetch"],"queue":"threads_alerts","slug":"notify","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
