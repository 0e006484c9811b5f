-- flowlane-compiled: {"format":2,"kind":"aliases"}
-- aliases; do not edit: change the YAML and run `flowlane compile`
begin;

-- alias community_threads from flows/community_threads.yaml
select flowlane.set_alias(
  alias => 'community_threads',
  flow_slug => 'community_threads_v2',
  draining => array['community_threads_v1']::text[]
);

commit;
