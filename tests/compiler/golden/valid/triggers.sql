-- ==> aliases.sql <==
-- flowlane-compiled: {"format":2,"kind":"aliases"}
-- aliases; do not edit: change the YAML and run `flowlane compile`
begin;

-- alias orders from triggers.yaml
select flowlane.set_alias(
  alias => 'orders',
  flow_slug => 'orders_v1',
  draining => array[]::text[]
);

commit;
-- ==> flows/orders_v1.sql <==
-- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"44d548884ac24e95b49ad7cc350818f276f4391ee33d45ea1a7140fe8fea2f7d","slug":"orders_v1"}
-- flow orders_v1 from triggers.yaml; do not edit: change the YAML and run `flowlane compile`
begin;

-- an existing flow must already have exactly this shape (a changed shape needs a new slug)
select flowlane.ensure_flow_shape(
  flow_slug => 'orders_v1',
  shape => '{"input_schema":{"properties":{"order_id":{"type":"integer"}},"required":["order_id"],"type":"object"},"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"orders_v1","slug":"charge","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
)
from flowlane.flows
where flow_slug = 'orders_v1';

select flowlane.create_flow(
  flow_slug => 'orders_v1',
  max_attempts => 3,
  base_delay => 5,
  timeout => 60,
  queue_mode => 'flow'
);

select flowlane.add_step(
  flow_slug => 'orders_v1',
  step_slug => 'charge',
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
  queue_name => 'orders_v1'
);

-- the run input's contract (start_flow and start_flows refuse an input it rejects)
select flowlane.set_contract(
  flow_slug => 'orders_v1',
  step_slug => null,
  schema => '{"properties":{"order_id":{"type":"integer"}},"required":["order_id"],"type":"object"}'::jsonb
);

-- the flow now has exactly this shape
select flowlane.ensure_flow_shape(
  flow_slug => 'orders_v1',
  shape => '{"input_schema":{"properties":{"order_id":{"type":"integer"}},"required":["order_id"],"type":"object"},"queue_mode":"flow","steps":[{"if":null,"needs":[],"queue":"orders_v1","slug":"charge","type":"single","unless":null,"when_exhausted":"fail","when_unmet":"skip"}]}'::jsonb
);

commit;
-- ==> triggers.sql <==
-- flowlane-compiled: {"format":2,"kind":"triggers"}
-- triggers; do not edit: change the YAML and run `flowlane compile`
begin;

-- trigger order_archived from triggers.yaml
select flowlane.set_trigger(
  trigger_name => 'order_archived',
  flow_name => 'orders_v1',
  table_name => 'public.orders',
  events => array['delete']::text[],
  when_pattern => null,
  unless_pattern => null,
  input_map => '{"order_id":"/old/id"}'::jsonb,
  key_pointer => null,
  on_refused => 'record'
);

-- trigger order_paid from triggers.yaml
select flowlane.set_trigger(
  trigger_name => 'order_paid',
  flow_name => 'orders',
  table_name => 'public.orders',
  events => array['insert', 'update']::text[],
  when_pattern => '{"new":{"status":"paid"}}'::jsonb,
  unless_pattern => '{"old":{"status":"paid"}}'::jsonb,
  input_map => '{"customer_id":"/new/customer_id","order_id":"/new/id"}'::jsonb,
  key_pointer => '/new/id',
  on_refused => 'fail'
);

-- triggers no longer declared are dropped from their tables
select flowlane.keep_only_triggers(array['order_archived', 'order_paid']::text[]);

commit;
