-- ==> aliases.sql <==
-- flowlane-compiled: {"format":2,"kind":"aliases"}
-- aliases; do not edit: change the YAML and run `flowlane compile`
begin;

commit;
-- ==> flows/media.sql <==
-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"4aa15ec09336f10cf0462d86d18445cc85080d58acefad2b1cd2cf17fed027f4","slug":"media"}
-- flow media from per_step_queues.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'media',
  shape => '{"queue_mode":"per-step","steps":[{"if":null,"needs":[],"queue":"media__download","slug":"download","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["download"],"queue":"media__resize","slug":"resize","type":"map","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'media';

select flowlane.create_flow(
  flow_slug => 'media',
  max_attempts => 3,
  base_delay => 5,
  timeout => 60,
  queue_mode => 'per-step'
);

select flowlane.add_step(
  flow_slug => 'media',
  step_slug => 'download',
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
  queue_name => 'media__download'
);

select flowlane.add_step(
  flow_slug => 'media',
  step_slug => 'resize',
  deps_slugs => array['download']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'map',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'media__resize'
);

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'media',
  shape => '{"queue_mode":"per-step","steps":[{"if":null,"needs":[],"queue":"media__download","slug":"download","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["download"],"queue":"media__resize","slug":"resize","type":"map","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
