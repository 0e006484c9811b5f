-- flowlane compiled flow quoting from flows/quoting.yaml; do not edit: change the YAML and run `flowlane compile`
-- shape sha256: be216b12118fbc51f2d324f415e1977e477df5048b62dc1802b95d331c5b4320
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'quoting',
  shape => E'{"queue_mode":"flow","steps":[{"if":{"backslash":"C:\\\\path\\\\n","comment":"-- not a comment */ /*","dollars":"$$ select 1; $$","nested":[1,2.5,true,null,{"k''ey":"v\\\\"}],"newline":"line1\\nline2","quote":"it''s","unicode":"café ☕ 𝄞"},"needs":[],"queue":"quoting","slug":"check","type":"single","unless":{"a''b":{"c\\\\d":"e"}},"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'quoting';

select flowlane.create_flow(
  flow_slug => 'quoting',
  max_attempts => 3,
  base_delay => 5,
  timeout => 60,
  queue_mode => 'flow'
);

select flowlane.add_step(
  flow_slug => 'quoting',
  step_slug => 'check',
  deps_slugs => array[]::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => E'{"backslash":"C:\\\\path\\\\n","comment":"-- not a comment */ /*","dollars":"$$ select 1; $$","nested":[1,2.5,true,null,{"k''ey":"v\\\\"}],"newline":"line1\\nline2","quote":"it''s","unicode":"café ☕ 𝄞"}'::jsonb,
  forbidden_input_pattern => E'{"a''b":{"c\\\\d":"e"}}'::jsonb,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'quoting'
);

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'quoting',
  shape => E'{"queue_mode":"flow","steps":[{"if":{"backslash":"C:\\\\path\\\\n","comment":"-- not a comment */ /*","dollars":"$$ select 1; $$","nested":[1,2.5,true,null,{"k''ey":"v\\\\"}],"newline":"line1\\nline2","quote":"it''s","unicode":"café ☕ 𝄞"},"needs":[],"queue":"quoting","slug":"check","type":"single","unless":{"a''b":{"c\\\\d":"e"}},"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
