-- A test database's own schema, flowlane_testing, and its clock: installed by flowlane's pytest
-- plugin into its own template database, never by a migration. It replaces the engine's _now()
-- with one that adds the shift of flowlane_testing.clock, and points the time columns'
-- defaults at the engine's clock; advance() moves the clock forward, and brings the queue
-- messages that wait for a time (a retry's delay, a delayed send) nearer by the same amount,
-- since PGMQ keeps their visibility on PostgreSQL's clock.

create schema flowlane_testing;

create table flowlane_testing.clock (
  one_row boolean primary key default true check (one_row),
  shift interval not null default '0'
);

insert into flowlane_testing.clock default values;

create or replace function flowlane._now() returns timestamptz
language sql stable parallel safe
as $$ select pg_catalog.now() operator(pg_catalog.+) (select c.shift from flowlane_testing.clock c) $$;

-- the engine's tables default their time columns to now() and clock_timestamp(), which are
-- the clock's own times in a migrated database; here they follow the test's clock
do $$
declare
  v_column record;
begin
  for v_column in
    select c.oid::regclass as tab, a.attname, pg_get_expr(d.adbin, d.adrelid) as expr
    from pg_attrdef d
    join pg_class c on c.oid = d.adrelid
    join pg_attribute a on a.attrelid = d.adrelid and a.attnum = d.adnum
    where c.relnamespace = 'flowlane'::regnamespace
      and pg_get_expr(d.adbin, d.adrelid) in ('now()', 'clock_timestamp()')
  loop
    execute format('alter table %s alter column %I set default %s', v_column.tab, v_column.attname,
                   case v_column.expr when 'now()' then 'flowlane._now()' else 'flowlane._clock_timestamp()' end);
  end loop;
end;
$$;

-- moves the clock forward by p_seconds; returns the new time. Every queue's listeners are woken:
-- what waited for the time may be visible now
create function flowlane_testing.advance(p_seconds float8) returns timestamptz
language plpgsql volatile
set search_path = ''
as $$
declare
  v_queue record;
begin
  if p_seconds is null or p_seconds < 0 then
    raise exception 'the test clock moves forward only, not by % s', p_seconds using errcode = '22023';
  end if;
  update flowlane_testing.clock set shift = shift + make_interval(secs => p_seconds);
  for v_queue in
    select q.queue_name, coalesce(q.pgmq_queue_name, q.queue_name) as pgmq_name from flowlane.queues q
  loop
    execute format('update pgmq.%I set vt = vt - make_interval(secs => $1) where vt > pg_catalog.clock_timestamp()',
                   'q_' || v_queue.pgmq_name) using p_seconds;
    perform pg_notify('pgmq.q_' || v_queue.queue_name || '.INSERT', null);
  end loop;
  return flowlane._now();
end;
$$;

-- what keeps the runs busy: a row per queue with messages ready to claim (the queue and a line
-- saying so), and one for the tasks claimed and not yet reported (no queue); none when idle
create function flowlane_testing.busy() returns table (queue_name text, line text)
language plpgsql stable
set search_path = ''
as $$
declare
  v_queue record;
  v_n bigint;
begin
  select count(*) into v_n from flowlane.step_tasks t where t.status = 'started';
  if v_n > 0 then
    return query select null::text, format('%s task(s) started', v_n);
  end if;
  for v_queue in
    select q.queue_name, coalesce(q.pgmq_queue_name, q.queue_name) as pgmq_name from flowlane.queues q
    order by q.queue_name
  loop
    execute format('select count(*) from pgmq.%I where vt <= pg_catalog.clock_timestamp()', 'q_' || v_queue.pgmq_name)
      into v_n;
    if v_n > 0 then
      return query select v_queue.queue_name, format('%s message(s) ready on queue %s', v_n, v_queue.queue_name);
    end if;
  end loop;
end;
$$;
