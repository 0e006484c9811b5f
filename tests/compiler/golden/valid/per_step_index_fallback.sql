-- ==> aliases.sql <==
-- flowlane-compiled: {"format":2,"kind":"aliases"}
-- aliases; do not edit: change the YAML and run `flowlane compile`
begin;

commit;
-- ==> flows/a_rather_long_flow_slug_for_queues_x.sql <==
-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"16e90469261b5974d16f38dd8c905e8148068ba5fe86a186c1063ab4beb2b5d9","slug":"a_rather_long_flow_slug_for_queues_x"}
-- flow a_rather_long_flow_slug_for_queues_x from per_step_index_fallback.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'a_rather_long_flow_slug_for_queues_x',
  shape => '{"queue_mode":"per-step","steps":[{"if":null,"needs":[],"queue":"a_rather_long_flow_slug_for_queues_x__short","slug":"short","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["short"],"queue":"a_rather_long_flow_slug_for_queues_x__1","slug":"a_much_longer_step_name","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'a_rather_long_flow_slug_for_queues_x';

select flowlane.create_flow(
  flow_slug => 'a_rather_long_flow_slug_for_queues_x',
  max_attempts => 3,
  base_delay => 5,
  timeout => 60,
  queue_mode => 'per-step'
);

select flowlane.add_step(
  flow_slug => 'a_rather_long_flow_slug_for_queues_x',
  step_slug => 'short',
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
  queue_name => 'a_rather_long_flow_slug_for_queues_x__short'
);

select flowlane.add_step(
  flow_slug => 'a_rather_long_flow_slug_for_queues_x',
  step_slug => 'a_much_longer_step_name',
  deps_slugs => array['short']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'a_rather_long_flow_slug_for_queues_x__1'
);

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'a_rather_long_flow_slug_for_queues_x',
  shape => '{"queue_mode":"per-step","steps":[{"if":null,"needs":[],"queue":"a_rather_long_flow_slug_for_queues_x__short","slug":"short","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["short"],"queue":"a_rather_long_flow_slug_for_queues_x__1","slug":"a_much_longer_step_name","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
