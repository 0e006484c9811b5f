-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"83e445c3ec7738d6904078d4871b386690e5e86e6254b4aa2e2a465b090d39a2","slug":"diamond"}
-- flow diamond from flows/diamond.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'diamond',
  shape => '{"input_schema":{"additionalProperties":false,"properties":{"numbers":{"items":{"type":"integer"},"maxItems":1000,"type":"array"}},"required":["numbers"],"type":"object"},"queue_mode":"flow","steps":[{"if":null,"needs":[],"output_schema":{"items":{"type":"integer"},"type":"array"},"queue":"diamond","slug":"split","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["split"],"output_schema":{"type":"integer"},"queue":"diamond","slug":"square","type":"map","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["split"],"output_schema":{"properties":{"count":{"minimum":0,"type":"integer"}},"required":["count"],"type":"object"},"queue":"diamond","slug":"describe","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["describe","square"],"output_schema":{"additionalProperties":false,"properties":{"count":{"type":"integer"},"notify":{"type":"boolean"},"total":{"type":"integer"}},"required":["total","count","notify"],"type":"object"},"queue":"diamond","slug":"total","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":{"total":{"notify":true}},"needs":["total"],"output_schema":{"properties":{"message":{"type":"string"}},"required":["message"],"type":"object"},"queue":"diamond","slug":"notify","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'diamond';

select flowlane.create_flow(
  flow_slug => 'diamond',
  max_attempts => 3,
  base_delay => 1,
  timeout => 30,
  queue_mode => 'flow'
);

select flowlane.add_step(
  flow_slug => 'diamond',
  step_slug => 'split',
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
  queue_name => 'diamond'
);

select flowlane.add_step(
  flow_slug => 'diamond',
  step_slug => 'square',
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
  queue_name => 'diamond'
);

select flowlane.add_step(
  flow_slug => 'diamond',
  step_slug => 'describe',
  deps_slugs => array['split']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'diamond'
);

select flowlane.add_step(
  flow_slug => 'diamond',
  step_slug => 'total',
  deps_slugs => array['describe', 'square']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'diamond'
);

select flowlane.add_step(
  flow_slug => 'diamond',
  step_slug => 'notify',
  deps_slugs => array['total']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => '{"total":{"notify":true}}'::jsonb,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'diamond'
);

-- the run input's contract (start_flow and start_flows refuse an input it rejects)
select flowlane.set_contract(
  flow_slug => 'diamond',
  step_slug => null,
  schema => '{"additionalProperties":false,"properties":{"numbers":{"items":{"type":"integer"},"maxItems":1000,"type":"array"}},"required":["numbers"],"type":"object"}'::jsonb
);

-- the output contract of step split (workers check each output against it)
select flowlane.set_contract(
  flow_slug => 'diamond',
  step_slug => 'split',
  schema => '{"items":{"type":"integer"},"type":"array"}'::jsonb
);

-- the output contract of step square (workers check each output against it)
select flowlane.set_contract(
  flow_slug => 'diamond',
  step_slug => 'square',
  schema => '{"type":"integer"}'::jsonb
);

-- the output contract of step describe (workers check each output against it)
select flowlane.set_contract(
  flow_slug => 'diamond',
  step_slug => 'describe',
  schema => '{"properties":{"count":{"minimum":0,"type":"integer"}},"required":["count"],"type":"object"}'::jsonb
);

-- the output contract of step total (workers check each output against it)
select flowlane.set_contract(
  flow_slug => 'diamond',
  step_slug => 'total',
  schema => '{"additionalProperties":false,"properties":{"count":{"type":"integer"},"notify":{"type":"boolean"},"total":{"type":"integer"}},"required":["total","count","notify"],"type":"object"}'::jsonb
);

-- the output contract of step notify (workers check each output against it)
select flowlane.set_contract(
  flow_slug => 'diamond',
  step_slug => 'notify',
  schema => '{"properties":{"message":{"type":"string"}},"required":["message"],"type":"object"}'::jsonb
);

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'diamond',
  shape => '{"input_schema":{"additionalProperties":false,"properties":{"numbers":{"items":{"type":"integer"},"maxItems":1000,"type":"array"}},"required":["numbers"],"type":"object"},"queue_mode":"flow","steps":[{"if":null,"needs":[],"output_schema":{"items":{"type":"integer"},"type":"array"},"queue":"diamond","slug":"split","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["split"],"output_schema":{"type":"integer"},"queue":"diamond","slug":"square","type":"map","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["split"],"output_schema":{"properties":{"count":{"minimum":0,"type":"integer"}},"required":["count"],"type":"object"},"queue":"diamond","slug":"describe","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["describe","square"],"output_schema":{"additionalProperties":false,"properties":{"count":{"type":"integer"},"notify":{"type":"boolean"},"total":{"type":"integer"}},"required":["total","count","notify"],"type":"object"},"queue":"diamond","slug":"total","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":{"total":{"notify":true}},"needs":["total"],"output_schema":{"properties":{"message":{"type":"string"}},"required":["message"],"type":"object"},"queue":"diamond","slug":"notify","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
