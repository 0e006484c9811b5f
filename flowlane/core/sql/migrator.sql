-- name: migrate_lock
select pg_advisory_lock(hashtext('flowlane.migrate'))

-- name: migrate_unlock
select pg_advisory_unlock(hashtext('flowlane.migrate'))

-- name: pgmq_schema_exists
select exists (select 1 from pg_namespace where nspname = 'pgmq')

-- name: pgmq_installed
select to_regprocedure('pgmq.create(text)') is not null
   and to_regprocedure('pgmq.send(text, jsonb, integer)') is not null

-- name: pgmq_extension_available
select exists (select 1 from pg_available_extensions where name = 'pgmq')

-- name: create_pgmq_extension
create extension if not exists pgmq

-- name: bootstrap_migrations_table
create schema if not exists flowlane;
create table if not exists flowlane.schema_migrations (
  version text primary key check (version ~ '^[0-9]{4}$'),
  name text not null,
  checksum text not null check (checksum ~ '^[0-9a-f]{64}$'),
  applied_at timestamptz not null default clock_timestamp()
)

-- name: migrations_table_exists
select to_regclass('flowlane.schema_migrations') is not null

-- name: applied_migrations
select version, name, checksum, applied_at
from flowlane.schema_migrations
order by version

-- name: record_migration
insert into flowlane.schema_migrations (version, name, checksum)
values (%(version)s, %(name)s, %(checksum)s)

-- name: engine_functions
select p.oid::regprocedure::text as identity, p.proname::text as name,
       pg_get_function_arguments(p.oid) as arguments,
       pg_get_function_result(p.oid) as result, pg_get_functiondef(p.oid) as definition
from pg_proc p
where p.pronamespace = 'flowlane'::regnamespace
order by 1

-- name: drop_flowlane_and_pgmq
drop schema if exists flowlane cascade;
drop extension if exists pgmq cascade;
drop schema if exists pgmq cascade
