-- ==> aliases.sql <==
-- flowlane-compiled: {"format":2,"kind":"aliases"}
-- aliases; do not edit: change the YAML and run `flowlane compile`
begin;

commit;
-- ==> flows/approvals.sql <==
-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"46c916dd6337e2d57242c7364cb8867b1b4553d5c9ce9de504ee1fb0db1d3b31","slug":"approvals"}
-- flow approvals from wait_steps.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'approvals',
  shape => '{"queue_mode":"per-step","steps":[{"if":null,"needs":[],"queue":"approvals__prepare","slug":"prepare","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["prepare"],"queue":null,"slug":"approve","type":"wait","unless":null,"when_exhausted":"skip-cascade","when_unmet":"skip"},{"if":{"approve":{"approved":true}},"needs":["approve"],"queue":"approvals__ship","slug":"ship","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":[],"queue":null,"slug":"paid","type":"wait","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'approvals';

select flowlane.create_flow(
  flow_slug => 'approvals',
  max_attempts => 3,
  base_delay => 5,
  timeout => 60,
  queue_mode => 'per-step'
);

select flowlane.add_step(
  flow_slug => 'approvals',
  step_slug => 'prepare',
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
  queue_name => 'approvals__prepare'
);

select flowlane.add_step(
  flow_slug => 'approvals',
  step_slug => 'approve',
  deps_slugs => array['prepare']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => 86400,
  start_delay => null,
  step_type => 'wait',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'skip-cascade',
  queue_name => null
);

select flowlane.add_step(
  flow_slug => 'approvals',
  step_slug => 'ship',
  deps_slugs => array['approve']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => '{"approve":{"approved":true}}'::jsonb,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'approvals__ship'
);

select flowlane.add_step(
  flow_slug => 'approvals',
  step_slug => 'paid',
  deps_slugs => array[]::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
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
  flow_slug => 'approvals',
  shape => '{"queue_mode":"per-step","steps":[{"if":null,"needs":[],"queue":"approvals__prepare","slug":"prepare","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["prepare"],"queue":null,"slug":"approve","type":"wait","unless":null,"when_exhausted":"skip-cascade","when_unmet":"skip"},{"if":{"approve":{"approved":true}},"needs":["approve"],"queue":"approvals__ship","slug":"ship","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":[],"queue":null,"slug":"paid","type":"wait","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
