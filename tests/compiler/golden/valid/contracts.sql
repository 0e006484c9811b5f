-- ==> aliases.sql <==
-- flowlane-compiled: {"format":2,"kind":"aliases"}
-- aliases; do not edit: change the YAML and run `flowlane compile`
begin;

commit;
-- ==> flows/invoices.sql <==
-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"2ee58a6139307a885f9bddd6093ad51e4de80036644f582395a033f0dd0c39b3","slug":"invoices"}
-- flow invoices from contracts.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'invoices',
  shape => '{"input_schema":{"additionalProperties":false,"properties":{"customer":{"maxLength":64,"minLength":1,"pattern":"^[a-z]","type":"string"},"lines":{"items":{"properties":{"price":{"exclusiveMaximum":100000,"minimum":0,"type":"number"},"sku":{"type":"string"},"unit":{"enum":["piece","kg"]}},"required":["sku","price"],"type":"object"},"minItems":1,"type":"array"},"title":{"type":"string"}},"required":["customer","lines"],"type":"object"},"queue_mode":"flow","steps":[{"if":null,"needs":[],"output_schema":{"items":{"properties":{"total":{"type":"number"}},"required":["total"],"type":"object"},"type":"array"},"queue":"invoices","slug":"price","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["price"],"output_schema":{"const":1,"type":"integer"},"queue":"invoices","slug":"each_line","type":"map","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":{"each_line":[1]},"needs":["each_line","price"],"queue":"invoices","slug":"notify","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'invoices';

select flowlane.create_flow(
  flow_slug => 'invoices',
  max_attempts => 3,
  base_delay => 5,
  timeout => 60,
  queue_mode => 'flow'
);

select flowlane.add_step(
  flow_slug => 'invoices',
  step_slug => 'price',
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
  queue_name => 'invoices'
);

select flowlane.add_step(
  flow_slug => 'invoices',
  step_slug => 'each_line',
  deps_slugs => array['price']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'map',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'invoices'
);

select flowlane.add_step(
  flow_slug => 'invoices',
  step_slug => 'notify',
  deps_slugs => array['each_line', 'price']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => '{"each_line":[1]}'::jsonb,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'invoices'
);

-- the run input's contract (start_flow and start_flows refuse an input it rejects)
select flowlane.set_contract(
  flow_slug => 'invoices',
  step_slug => null,
  schema => '{"additionalProperties":false,"properties":{"customer":{"maxLength":64,"minLength":1,"pattern":"^[a-z]","type":"string"},"lines":{"items":{"properties":{"price":{"exclusiveMaximum":100000,"minimum":0,"type":"number"},"sku":{"type":"string"},"unit":{"enum":["piece","kg"]}},"required":["sku","price"],"type":"object"},"minItems":1,"type":"array"},"title":{"type":"string"}},"required":["customer","lines"],"type":"object"}'::jsonb
);

-- the output contract of step price (workers check each output against it)
select flowlane.set_contract(
  flow_slug => 'invoices',
  step_slug => 'price',
  schema => '{"items":{"properties":{"total":{"type":"number"}},"required":["total"],"type":"object"},"type":"array"}'::jsonb
);

-- the output contract of step each_line (workers check each output against it)
select flowlane.set_contract(
  flow_slug => 'invoices',
  step_slug => 'each_line',
  schema => '{"const":1,"type":"integer"}'::jsonb
);

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'invoices',
  shape => '{"input_schema":{"additionalProperties":false,"properties":{"customer":{"maxLength":64,"minLength":1,"pattern":"^[a-z]","type":"string"},"lines":{"items":{"properties":{"price":{"exclusiveMaximum":100000,"minimum":0,"type":"number"},"sku":{"type":"string"},"unit":{"enum":["piece","kg"]}},"required":["sku","price"],"type":"object"},"minItems":1,"type":"array"},"title":{"type":"string"}},"required":["customer","lines"],"type":"object"},"queue_mode":"flow","steps":[{"if":null,"needs":[],"output_schema":{"items":{"properties":{"total":{"type":"number"}},"required":["total"],"type":"object"},"type":"array"},"queue":"invoices","slug":"price","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["price"],"output_schema":{"const":1,"type":"integer"},"queue":"invoices","slug":"each_line","type":"map","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":{"each_line":[1]},"needs":["each_line","price"],"queue":"invoices","slug":"notify","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
