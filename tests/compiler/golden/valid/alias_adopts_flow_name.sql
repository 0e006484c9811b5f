-- ==> aliases.sql <==
-- flowlane-compiled: {"format":2,"kind":"aliases"}
-- aliases; do not edit: change the YAML and run `flowlane compile`
begin;

-- alias hello from alias_adopts_flow_name.yaml
select flowlane.set_alias(
  alias => 'hello',
  flow_slug => 'hello_v2',
  draining => array['hello']::text[]
);

commit;
-- ==> flows/hello.sql <==
-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"edaf426bc7099e7ad3c1c53759cb32c2a9a34468504833d989263ba67f9a09d7","slug":"hello"}
-- flow hello from alias_adopts_flow_name.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'hello',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"hello","slug":"greet","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'hello';

select flowlane.create_flow(
  flow_slug => 'hello',
  max_attempts => 3,
  base_delay => 5,
  timeout => 60,
  queue_mode => 'flow'
);

select flowlane.add_step(
  flow_slug => 'hello',
  step_slug => 'greet',
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
  queue_name => 'hello'
);

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'hello',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"hello","slug":"greet","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
-- ==> flows/hello_v2.sql <==
-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"485fa00860e3cb95608df48840e29f148b6ca2f1ca65a77fc5cbc7978e69b6ab","slug":"hello_v2"}
-- flow hello_v2 from alias_adopts_flow_name.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'hello_v2',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"hello_v2","slug":"greet","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["greet"],"queue":"hello_v2","slug":"shout","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'hello_v2';

select flowlane.create_flow(
  flow_slug => 'hello_v2',
  max_attempts => 3,
  base_delay => 5,
  timeout => 60,
  queue_mode => 'flow'
);

select flowlane.add_step(
  flow_slug => 'hello_v2',
  step_slug => 'greet',
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
  queue_name => 'hello_v2'
);

select flowlane.add_step(
  flow_slug => 'hello_v2',
  step_slug => 'shout',
  deps_slugs => array['greet']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'hello_v2'
);

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'hello_v2',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"hello_v2","slug":"greet","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["greet"],"queue":"hello_v2","slug":"shout","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
