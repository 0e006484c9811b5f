-- ==> aliases.sql <==
-- flowlane-compiled: {"format":2,"kind":"aliases"}
-- aliases; do not edit: change the YAML and run `flowlane compile`
begin;

commit;
-- ==> flows/words.sql <==
-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"f90c76478219bf308bf0a4d7814af0741446dad486faa14108884b898205b347","slug":"words"}
-- flow words from yaml11_words_are_strings.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'words',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"words","slug":"on","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["on"],"queue":"words","slug":"yes","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["on"],"queue":"words","slug":"off","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":{"yes":{"answer":"no","code":"007","when":"2024-01-01"}},"needs":["off","yes"],"queue":"words","slug":"null","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'words';

select flowlane.create_flow(
  flow_slug => 'words',
  max_attempts => 3,
  base_delay => 5,
  timeout => 60,
  queue_mode => 'flow'
);

select flowlane.add_step(
  flow_slug => 'words',
  step_slug => 'on',
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
  queue_name => 'words'
);

select flowlane.add_step(
  flow_slug => 'words',
  step_slug => 'yes',
  deps_slugs => array['on']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'words'
);

select flowlane.add_step(
  flow_slug => 'words',
  step_slug => 'off',
  deps_slugs => array['on']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => null,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'words'
);

select flowlane.add_step(
  flow_slug => 'words',
  step_slug => 'null',
  deps_slugs => array['off', 'yes']::text[],
  max_attempts => null,
  base_delay => null,
  timeout => null,
  start_delay => null,
  step_type => 'single',
  required_input_pattern => '{"yes":{"answer":"no","code":"007","when":"2024-01-01"}}'::jsonb,
  forbidden_input_pattern => null,
  when_unmet => 'skip',
  when_exhausted => 'fail',
  queue_name => 'words'
);

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'words',
  shape => '{"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"words","slug":"on","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["on"],"queue":"words","slug":"yes","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":null,"needs":["on"],"queue":"words","slug":"off","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"},{"if":{"yes":{"answer":"no","code":"007","when":"2024-01-01"}},"needs":["off","yes"],"queue":"words","slug":"null","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
