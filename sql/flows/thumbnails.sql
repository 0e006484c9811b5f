-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"0846da06b9e9403c7b60e85558b6b4486ff3079b18846ffed0d72c45b9178227","slug":"thumbnails"}
-- flow thumbnails from flows/per_step.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'thumbnails',
  shape => '{"queue_mode":"per-step","steps":[{"if":null,"needs":[],"queue":"thumbnails__download","slug":"download","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["download"],"queue":"thumbnails__resize","slug":"resize","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["resize"],"queue":"thumbnails__publish","slug":"publish","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'thumbnails';

select flowlane.create_flow(
  flow_slug => 'thumbnails',
  max_attempts => 3,
  base_delay => 5,
  timeout => 60,
  queue_mode => 'per-step'
);

select flowlane.add_step(
  flow_slug => 'thumbnails',
  step_slug => 'download',
  deps_slugs => array[]::text[],
  max_attempts => null,
  base_delay => null,
  timeout => 120,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'thumbnails__download'
);

select flowlane.add_step(
  flow_slug => 'thumbnails',
  step_slug => 'resize',
  deps_slugs => array['download']::text[],
  max_attempts => 5,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'thumbnails__resize'
);

select flowlane.add_step(
  flow_slug => 'thumbnails',
  step_slug => 'publish',
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
  queue_name => 'thumbnails__publish'
);

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'thumbnails',
  shape => '{"queue_mode":"per-step","steps":[{"if":null,"needs":[],"queue":"thumbnails__download","slug":"download","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["download"],"queue":"thumbnails__resize","slug":"resize","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["resize"],"queue":"thumbnails__publish","slug":"publish","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
