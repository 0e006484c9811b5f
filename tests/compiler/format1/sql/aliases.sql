-- flowlane compiled aliases; do not edit: change the YAML and run `flowlane compile`
begin;

commit;
