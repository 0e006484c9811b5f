-- Time: idempotent and delayed starts, run deadlines, schedules, and the maintenance tick that
-- every worker, `serve` and console process calls.

-- the options of create_flow that shape how runs start and end
create function flowlane._check_start_options(p_flow text, p_deadline int, p_dedup_key text) returns void
language plpgsql immutable
set search_path = ''
as $$
begin
  if p_deadline is not null and p_deadline < 1 then
    raise exception 'flow "%": deadline must be at least 1 second, not %', p_flow, p_deadline
      using errcode = '22023';
  end if;
  if p_dedup_key is not null and p_dedup_key !~ '^(/([^~/]|~[01])*)+$' then
    raise exception 'flow "%": dedup key % is not a JSON pointer into the input', p_flow, quote_literal(p_dedup_key)
      using errcode = '22023', hint = 'a JSON pointer starts with "/" (e.g. /order/id); "~" is written ~0 and "/" inside a name ~1';
  end if;
end;
$$;

-- a JSON pointer (/a/b~1c) as a jsonb path ({a,b/c})
create function flowlane._pointer_path(p_pointer text) returns text[]
language sql immutable parallel safe
set search_path = ''
as $$
  select array(select replace(replace(part, '~1', '/'), '~0', '~')
               from unnest(string_to_array(substr(p_pointer, 2), '/')) with ordinality as u (part, n)
               order by n)
$$;

-- the idempotency key of a start: the caller's, else the value at the flow's dedup pointer
-- (a string as itself, any other JSON value as its text); null: no key
create function flowlane._start_key(p_flow text, p_input jsonb, p_key text, p_what text) returns text
language plpgsql stable
set search_path = ''
as $$
declare
  v_pointer text;
  v_value jsonb;
begin
  if p_key is not null then
    if length(p_key) not between 1 and 500 then
      raise exception '%: an idempotency key has 1 to 500 characters, not %', p_what, length(p_key)
        using errcode = '22023';
    end if;
    return p_key;
  end if;
  select f.opt_dedup_key into v_pointer from flowlane.flows f where f.flow_slug = p_flow;
  if v_pointer is null then
    return null;
  end if;
  v_value := p_input #> flowlane._pointer_path(v_pointer);
  if v_value is null or v_value = 'null'::jsonb then
    raise exception '%: the input has no value at the dedup key %', p_what, v_pointer
      using errcode = '22023', hint = 'the flow derives each run''s idempotency key from that field of its input';
  end if;
  return left(case jsonb_typeof(v_value) when 'string' then v_value #>> '{}' else v_value::text end, 500);
end;
$$;

-- a start that returns an earlier run says so to its caller: the transaction's setting
-- flowlane.found_run holds that run's id (`flowlane start` reports "already existed")
create function flowlane._found_run(p_run_id uuid) returns void
language sql volatile
set search_path = ''
as $$ select set_config('flowlane.found_run', p_run_id::text, true); $$;

-- the run of an earlier start with this key under this name, or a null row; holds the key's
-- lock until the transaction ends, so that concurrent starts with one key create one run
create function flowlane._keyed_run(p_called text, p_key text) returns flowlane.runs
language plpgsql volatile
set search_path = ''
as $$
declare
  v_run flowlane.runs;
begin
  perform pg_advisory_xact_lock(hashtext('flowlane.run_key:' || p_called), hashtext(p_key));
  select * into v_run from flowlane.runs r where r.called_as = p_called and r.idempotency_key = p_key;
  if found then
    perform flowlane._found_run(v_run.run_id);
  end if;
  return v_run;
end;
$$;

-- a start of a debounced flow (null row for a flow without debounce): under its key's lock,
-- it joins the key's pending run (created waiting, not yet begun by the maintenance tick),
-- which takes this input (and its concurrency key) and starts a period from now, or at its
-- first start plus the maximum wait if that is sooner; else a new pending run is created. A
-- joined start reports the run as found (flowlane.found_run: `existed` to the client).
create function flowlane._debounced_start(p_flow text, p_input jsonb, p_priority int) returns flowlane.runs
language plpgsql volatile
set search_path = ''
as $$
declare
  v_flow flowlane.flows;
  v_key text;
  v_run flowlane.runs;
begin
  select * into v_flow from flowlane.flows f where f.flow_slug = p_flow;
  if v_flow.opt_debounce_period is null then
    return null;
  end if;
  v_key := flowlane._concurrency_key(v_flow.opt_debounce_key, p_input);
  perform pg_advisory_xact_lock(hashtext('flowlane.debounce:' || p_flow), hashtext(v_key));
  -- (a row the tick is beginning is waited for and then no longer pending: a new run follows)
  select * into v_run from flowlane.runs r
  where r.flow_slug = p_flow and r.debounce_key = v_key and r.status = 'waiting' and r.hold_seq is null
  for update;
  if not found then
    select * into v_run from flowlane._create_runs(p_flow, array[p_input], array[null::uuid],
                                                   flowlane._now() + make_interval(secs => v_flow.opt_debounce_period),
                                                   null, null, p_priority);
    update flowlane.runs r set debounce_key = v_key, debounce_since = flowlane._now() where r.run_id = v_run.run_id
    returning * into v_run;
    return v_run;
  end if;
  perform flowlane._check_json_limits(p_input, format('start_flow(%s): the run input', p_flow),
    'flatten the input; workers refuse JSON nested deeper than the limit');
  perform flowlane._check_contract_inputs(p_flow, array[p_input]);
  update flowlane.runs r
     set input = p_input,
         concurrency_key = case when v_flow.opt_concurrency_limit is not null
                                then flowlane._concurrency_key(v_flow.opt_concurrency_key, p_input) end,
         priority = coalesce(p_priority, v_flow.opt_priority, 0),
         start_at = least(flowlane._now() + make_interval(secs => v_flow.opt_debounce_period),
                          r.debounce_since + make_interval(secs => v_flow.opt_debounce_max_wait))
   where r.run_id = v_run.run_id
  returning * into v_run;
  if jsonb_typeof(p_input) = 'array' then  -- a root map maps the input its run begins with
    update flowlane.step_states ss
       set initial_tasks = jsonb_array_length(p_input)
      from flowlane.steps s
     where ss.run_id = v_run.run_id and s.flow_slug = p_flow and s.step_slug = ss.step_slug
       and s.step_type = 'map' and s.deps_count = 0;
  end if;
  perform flowlane._found_run(v_run.run_id);
  return v_run;
end;
$$;

-- when a run of the flow that begins at p_started has to be finished (null: no deadline)
create function flowlane._run_deadline(p_flow text, p_started timestamptz) returns timestamptz
language plpgsql stable
set search_path = ''
as $$
begin
  return (select p_started + make_interval(secs => f.opt_deadline) from flowlane.flows f where f.flow_slug = p_flow);
end;
$$;

-- when a run has to be finished: a claimed task's handler reads it (ctx.deadline)
create function flowlane.run_deadline(run_id uuid) returns timestamptz
language plpgsql stable
set search_path = ''
as $$
begin
  return (select r.deadline_at from flowlane.runs r where r.run_id = run_deadline.run_id);
end;
$$;

-- delayed runs whose time has come begin; returns how many. A run of a flow with a
-- concurrency limit is held for its key instead (in the order the runs became due), and
-- begins now if its key has room
create function flowlane._begin_due_runs(p_now timestamptz) returns int
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_ids uuid[];
  v_held uuid[];
begin
  with due as (
    select r.run_id, r.start_at from flowlane.runs r
    where r.status = 'waiting' and r.start_at <= p_now and r.hold_seq is null
    order by r.start_at, r.run_id
    for update skip locked
  ), numbered as (  -- (the sequence is read after the sort: held in the order they became due)
    select d.run_id, nextval('flowlane.hold_seq') as seq from due d order by d.start_at, d.run_id
  ), begun as (
    update flowlane.runs r
       set status = case when r.concurrency_key is null then 'started' else 'waiting' end,
           hold_seq = case when r.concurrency_key is null then null else n.seq end,
           started_at = flowlane._now(),
           deadline_at = case when r.concurrency_key is null then flowlane._run_deadline(r.flow_slug, flowlane._now()) end
      from numbered n where r.run_id = n.run_id
    returning r.run_id, r.status
  ) select coalesce(array_agg(b.run_id order by b.run_id) filter (where b.status = 'started'), '{}'),
           coalesce(array_agg(b.run_id order by b.run_id) filter (where b.status = 'waiting'), '{}')
      into v_ids, v_held from begun b;
  if cardinality(v_ids) > 0 then
    perform flowlane._progress_runs(v_ids);
  end if;
  if cardinality(v_held) > 0 then
    perform flowlane._begin_new_held_runs(v_held);
  end if;
  return cardinality(v_ids) + cardinality(v_held);
end;
$$;

-- started runs past their deadline fail: their queued messages are archived and their started
-- tasks fenced (cancelled, so that a late result is rejected); returns how many
create function flowlane._fail_overdue_runs(p_now timestamptz) returns int
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_run record;
  v_n int := 0;
begin
  for v_run in
    select r.run_id, r.started_at, r.deadline_at from flowlane.runs r
    where r.status = 'started' and r.deadline_at <= p_now
    order by r.deadline_at, r.run_id
    for update skip locked
  loop
    perform flowlane._fail_run(v_run.run_id,
      format('deadline exceeded after %s s', round(extract(epoch from v_run.deadline_at - v_run.started_at))));
    v_n := v_n + 1;
  end loop;
  return v_n;
end;
$$;

-- == schedules ==================================================================================

-- does a day match a cron expression's day-of-month, month and weekday fields? As in cron, when
-- both day fields are restricted a day matching either one matches
create function flowlane._cron_day_matches(p_day date, p_days int[], p_months int[], p_weekdays int[])
returns boolean
language sql immutable parallel safe
set search_path = ''
as $$
  select extract(month from p_day)::int = any (p_months)
     and case when p_days is null and p_weekdays is null then true
              when p_days is null then extract(dow from p_day)::int = any (p_weekdays)
              when p_weekdays is null then extract(day from p_day)::int = any (p_days)
              else extract(day from p_day)::int = any (p_days) or extract(dow from p_day)::int = any (p_weekdays)
         end
$$;

-- the schedule's nearest slot after p_at (p_forward), or at or before it. `every` slots are
-- whole multiples of the interval since 1970-01-01 00:00 UTC, in any zone. Cron slots are wall
-- times in the schedule's zone, turned into instants by PostgreSQL's rule: a wall time the
-- clocks skip (spring forward) is read with the offset before the change (02:30 fires at
-- 03:30 new time); a wall time that happens twice (fall back) fires once, at its second
-- occurrence (standard time).
create function flowlane._schedule_slot(p_schedule flowlane.schedules, p_at timestamptz, p_forward boolean)
returns timestamptz
language plpgsql stable
set search_path = ''
as $$
declare
  s flowlane.schedules := p_schedule;
  v_epoch numeric;
  v_start date;
  v_day date;
  v_slot timestamptz;
begin
  if s.every_seconds is not null then
    v_epoch := floor(extract(epoch from p_at) / s.every_seconds) * s.every_seconds;
    return to_timestamp(case when p_forward then v_epoch + s.every_seconds else v_epoch end);
  end if;
  v_start := (p_at at time zone s.timezone)::date + case when p_forward then -1 else 1 end;
  -- a 29 February can be 8 years away
  for v_i in 0 .. 366 * 8 + 2 loop
    v_day := v_start + case when p_forward then v_i else -v_i end;
    continue when not flowlane._cron_day_matches(v_day, s.cron_days, s.cron_months, s.cron_weekdays);
    select case when p_forward then min(c.slot) else max(c.slot) end into v_slot
    from (select (v_day + make_interval(hours => h, mins => m)) at time zone s.timezone as slot
          from unnest(s.cron_hours) h, unnest(s.cron_minutes) m) c
    where case when p_forward then c.slot > p_at else c.slot <= p_at end;
    if v_slot is not null then
      return v_slot;
    end if;
  end loop;
  return null;
end;
$$;

-- a schedule's flow now (an alias: its active version), or null when neither exists
create function flowlane._schedule_flow(p_name text) returns text
language sql stable
set search_path = ''
as $$
  select coalesce((select a.flow_slug from flowlane.aliases a where a.alias = p_name),
                  (select f.flow_slug from flowlane.flows f where f.flow_slug = p_name))
$$;

-- catch-up: at most this many missed slots start runs in one firing of a schedule (all)
create function flowlane._catch_up_cap() returns int
language sql immutable parallel safe
set search_path = ''
as $$ select 100 $$;

-- catch_up none: a slot later than this (seconds) was missed, not late
create function flowlane._catch_up_grace() returns int
language sql immutable parallel safe
set search_path = ''
as $$ select 60 $$;

-- the slots a due schedule starts runs for at p_now, by its pause, overlap and catch_up; none
-- while its flow is gone or refuses its input (a warning says so)
create function flowlane._slots_to_fire(p_schedule flowlane.schedules, p_now timestamptz)
returns setof timestamptz
language plpgsql stable
set search_path = ''
as $$
declare
  s flowlane.schedules := p_schedule;
  v_latest timestamptz;
  v_slot timestamptz := s.next_slot;
  v_n int := 0;
begin
  if exists (select 1 from flowlane.schedule_overrides o where o.schedule_name = s.schedule_name and o.paused)
     or flowlane._schedule_flow(s.flow_name) is null
     or (s.overlap = 'skip' and exists (select 1 from flowlane.runs r
                                       where r.run_id = s.last_run_id and r.status in ('waiting', 'started'))) then
    return;
  end if;
  begin
    -- the checks every start makes (the flow behind an alias may have changed since apply)
    perform flowlane._check_start_input(flowlane._schedule_flow(s.flow_name), s.input,
                                        format('schedule "%s"', s.schedule_name));
  exception when others then
    raise warning '%: its slots start no run until its input or flow is fixed', sqlerrm;
    return;
  end;
  if s.catch_up = 'all' then
    -- oldest first; with overlap skip the first run would overlap the rest. A slot at or
    -- before the last one fired never fires again (whatever moved next_slot back)
    if v_slot <= s.last_slot then
      v_slot := flowlane._schedule_slot(s, s.last_slot, true);
    end if;
    while v_slot <= p_now and v_n < case when s.overlap = 'skip' then 1 else flowlane._catch_up_cap() end loop
      return next v_slot;
      v_n := v_n + 1;
      v_slot := flowlane._schedule_slot(s, v_slot, true);
    end loop;
    return;
  end if;
  v_latest := flowlane._schedule_slot(s, p_now, false);
  if v_latest <= s.last_slot then
    return;
  end if;
  if s.catch_up = 'latest' or p_now - v_latest <= make_interval(secs => flowlane._catch_up_grace()) then
    return next v_latest;
  end if;
end;
$$;

-- every due schedule starts its runs (one per slot, recorded with the run) and moves on to its
-- next slot. Each schedule is fired by one caller: the others skip it while it is locked and
-- find it no longer due once that caller commits. Runs of one flow start in one statement.
create function flowlane._fire_schedules(p_now timestamptz) returns int
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_due flowlane.schedules[];
  v_names text[];
  v_slots timestamptz[];
  v_flows text[];
  v_inputs jsonb[];
  v_runs uuid[];
  v_ids uuid[];
  v_group record;
begin
  select coalesce(array_agg(d order by d.schedule_name), '{}') into v_due
  from (select * from flowlane.schedules s where s.next_slot <= p_now
        order by s.schedule_name for update skip locked) d;
  if cardinality(v_due) = 0 then
    return 0;
  end if;
  select coalesce(array_agg(d.schedule_name order by d.schedule_name, f.slot), '{}'),
         coalesce(array_agg(f.slot order by d.schedule_name, f.slot), '{}'),
         coalesce(array_agg(flowlane._schedule_flow(d.flow_name) order by d.schedule_name, f.slot), '{}'),
         coalesce(array_agg(d.input order by d.schedule_name, f.slot), '{}')
    into v_names, v_slots, v_flows, v_inputs
  from unnest(v_due) d cross join lateral flowlane._slots_to_fire(d, p_now) f (slot);
  v_runs := array_fill(null::uuid, array[cardinality(v_names)]);
  for v_group in
    select v_flows[i] as flow_slug, array_agg(i order by i) as idx
    from generate_subscripts(v_names, 1) i group by v_flows[i] order by 1
  loop
    -- (two statements: an update sees the runs only once the statement creating them is over)
    v_ids := array(select r.run_id
                   from flowlane._create_runs(v_group.flow_slug,
                          array(select v_inputs[k.i] from unnest(v_group.idx) with ordinality k (i, n) order by k.n),
                          '{}') with ordinality r
                   order by r.ordinality);
    update flowlane.runs r set schedule_name = v_names[u.i], schedule_slot = v_slots[u.i]
      from unnest(v_ids, v_group.idx) as u (run_id, i)
     where r.run_id = u.run_id;
    select array_agg(coalesce(u.run_id, v_runs[k]) order by k) into v_runs
    from generate_subscripts(v_names, 1) k
    left join unnest(v_ids, v_group.idx) as u (run_id, i) on u.i = k;
  end loop;
  update flowlane.schedules s
     set next_slot = flowlane._schedule_slot(s,
           case when s.catch_up = 'all' and l.fired >= flowlane._catch_up_cap() then l.last_slot else p_now end, true),
         last_slot = coalesce(l.last_slot, s.last_slot),
         last_run_id = coalesce(l.last_run, s.last_run_id)
    from unnest(v_due) d
    left join (select f.name, count(*) as fired, max(f.slot) as last_slot,
                      (array_agg(f.run_id order by f.slot desc))[1] as last_run
               from unnest(v_names, v_slots, v_runs) as f (name, slot, run_id) group by f.name) l
      on l.name = d.schedule_name
   where s.schedule_name = d.schedule_name;
  return cardinality(v_names);
end;
$$;

-- what compiled schedule files call: create or change a schedule (an operator's pause stays).
-- A change of its timing starts it afresh from now; its firing history stays.
create function flowlane.set_schedule(
  schedule_name text,
  flow_name text,
  input jsonb = '{}',
  cron text = null,
  cron_minutes int[] = null,
  cron_hours int[] = null,
  cron_days int[] = null,
  cron_months int[] = null,
  cron_weekdays int[] = null,
  every_seconds int = null,
  timezone text = 'UTC',
  overlap text = 'skip',
  catch_up text = 'latest'
) returns flowlane.schedules
language plpgsql volatile
set search_path = ''
as $$
declare
  v_new flowlane.schedules;
  v_old flowlane.schedules;
  v_what text := format('schedule "%s"', set_schedule.schedule_name);
begin
  perform flowlane._check_slug('schedule', set_schedule.schedule_name);
  perform flowlane._check_start_input(flowlane.resolve_flow(set_schedule.flow_name), set_schedule.input, v_what);
  if (set_schedule.cron is null) = (set_schedule.every_seconds is null) then
    raise exception '%: give exactly one of cron and every_seconds', v_what using errcode = '22023';
  end if;
  if set_schedule.every_seconds < 1 then
    raise exception '%: every_seconds must be at least 1, not %', v_what, set_schedule.every_seconds
      using errcode = '22023';
  end if;
  if set_schedule.cron is not null then
    perform flowlane._check_cron_field(v_what, 'minute', cron_minutes, 0, 59, false);
    perform flowlane._check_cron_field(v_what, 'hour', cron_hours, 0, 23, false);
    perform flowlane._check_cron_field(v_what, 'day of month', cron_days, 1, 31, true);
    perform flowlane._check_cron_field(v_what, 'month', cron_months, 1, 12, false);
    perform flowlane._check_cron_field(v_what, 'day of week', cron_weekdays, 0, 6, true);
  end if;
  if not exists (select 1 from pg_catalog.pg_timezone_names z where z.name = set_schedule.timezone) then
    raise exception '%: unknown time zone %', v_what, coalesce(quote_literal(set_schedule.timezone), 'NULL')
      using errcode = '22023', hint = 'use an IANA name such as Europe/Berlin or UTC';
  end if;
  if overlap is null or overlap not in ('skip', 'allow') then
    raise exception '%: overlap must be skip or allow, not %', v_what, coalesce(quote_literal(overlap), 'NULL')
      using errcode = '22023';
  end if;
  if catch_up is null or catch_up not in ('latest', 'none', 'all') then
    raise exception '%: catch_up must be latest, none or all, not %', v_what,
      coalesce(quote_literal(catch_up), 'NULL') using errcode = '22023';
  end if;
  select * into v_old from flowlane.schedules s where s.schedule_name = set_schedule.schedule_name for update;
  v_new := row(set_schedule.schedule_name, set_schedule.flow_name, set_schedule.cron,
               cron_minutes, cron_hours, cron_days, cron_months, cron_weekdays, set_schedule.every_seconds,
               set_schedule.timezone, set_schedule.input, set_schedule.overlap, set_schedule.catch_up,
               null, v_old.last_slot, v_old.last_run_id, coalesce(v_old.created_at, flowlane._now()), flowlane._now());
  if v_old.schedule_name is not null and (v_old.cron, v_old.cron_minutes, v_old.cron_hours, v_old.cron_days,
       v_old.cron_months, v_old.cron_weekdays, v_old.every_seconds, v_old.timezone)
     is not distinct from (v_new.cron, v_new.cron_minutes, v_new.cron_hours, v_new.cron_days,
       v_new.cron_months, v_new.cron_weekdays, v_new.every_seconds, v_new.timezone) then
    v_new.next_slot := v_old.next_slot;
    if (v_new.flow_name, v_new.input, v_new.overlap, v_new.catch_up)
       is not distinct from (v_old.flow_name, v_old.input, v_old.overlap, v_old.catch_up) then
      return v_old;  -- unchanged: applying the same file again writes nothing
    end if;
  else
    v_new.next_slot := flowlane._schedule_slot(v_new, flowlane._now(), true);
  end if;
  if v_new.next_slot is null then
    raise exception '%: the cron expression % never fires', v_what, quote_literal(set_schedule.cron)
      using errcode = '22023', hint = 'a day of month the chosen months never have (31 in February) never comes';
  end if;
  insert into flowlane.schedules as s values (v_new.*)
  on conflict on constraint schedules_pkey do update
    set flow_name = excluded.flow_name, cron = excluded.cron, cron_minutes = excluded.cron_minutes,
        cron_hours = excluded.cron_hours, cron_days = excluded.cron_days, cron_months = excluded.cron_months,
        cron_weekdays = excluded.cron_weekdays, every_seconds = excluded.every_seconds,
        timezone = excluded.timezone, input = excluded.input, overlap = excluded.overlap,
        catch_up = excluded.catch_up, next_slot = excluded.next_slot, updated_at = excluded.updated_at
  returning * into v_new;
  return v_new;
end;
$$;

create function flowlane._check_cron_field(p_what text, p_field text, p_values int[], p_min int, p_max int,
                                           p_any_allowed boolean) returns void
language plpgsql immutable
set search_path = ''
as $$
begin
  if p_values is null and p_any_allowed then
    return;
  end if;
  if p_values is null or cardinality(p_values) = 0 or array_position(p_values, null) is not null
     or exists (select 1 from unnest(p_values) v where v not between p_min and p_max) then
    raise exception '%: the cron % field must list values from % to %', p_what, p_field, p_min, p_max
      using errcode = '22023';
  end if;
end;
$$;

-- what a compiled schedule file ends with: the schedules it does not list are deleted (their
-- runs keep their schedule's name); returns the deleted names
create function flowlane.keep_only_schedules(schedule_names text[]) returns text[]
language plpgsql volatile
set search_path = ''
as $$
declare
  v_deleted text[];
begin
  with gone as (
    delete from flowlane.schedules s where s.schedule_name <> all (coalesce(schedule_names, '{}'))
    returning s.schedule_name
  ) select coalesce(array_agg(g.schedule_name order by g.schedule_name), '{}') into v_deleted from gone g;
  return v_deleted;
end;
$$;

-- the schedule named, locked for an operator's action; an unknown name raises
create function flowlane._locked_schedule(p_name text) returns flowlane.schedules
language plpgsql volatile
set search_path = ''
as $$
declare
  v_schedule flowlane.schedules;
begin
  select * into v_schedule from flowlane.schedules s where s.schedule_name = p_name for update;
  if not found then
    raise exception 'no schedule "%"', p_name using errcode = 'P0002',
      hint = '`flowlane schedules` lists the schedules';
  end if;
  return v_schedule;
end;
$$;

-- an operator's pause or resume (recorded apart from the definition). A resumed schedule
-- starts afresh: the slots it missed while paused are not caught up.
create function flowlane.set_schedule_paused(schedule_name text, paused boolean, reason text = null)
returns flowlane.schedules
language plpgsql volatile
set search_path = ''
as $$
declare
  v_schedule flowlane.schedules;
begin
  v_schedule := flowlane._locked_schedule(set_schedule_paused.schedule_name);
  insert into flowlane.schedule_overrides as o (schedule_name, paused, reason, changed_at)
  values (v_schedule.schedule_name, coalesce(set_schedule_paused.paused, true), left(reason, 1000), flowlane._now())
  on conflict on constraint schedule_overrides_pkey do update
    set paused = excluded.paused, reason = excluded.reason, changed_at = excluded.changed_at;
  if not coalesce(set_schedule_paused.paused, true) then
    update flowlane.schedules s set next_slot = flowlane._schedule_slot(s, flowlane._now(), true)
     where s.schedule_name = v_schedule.schedule_name and s.next_slot <= flowlane._now()
    returning * into v_schedule;
  end if;
  return v_schedule;
end;
$$;

-- start a run of a schedule now, outside its slots (input: the schedule's unless given)
create function flowlane.trigger_schedule(schedule_name text, input jsonb = null) returns flowlane.runs
language plpgsql volatile
set search_path = ''
as $$
declare
  v_schedule flowlane.schedules;
  v_run flowlane.runs;
begin
  v_schedule := flowlane._locked_schedule(trigger_schedule.schedule_name);
  v_run := flowlane.start_flow(v_schedule.flow_name, coalesce(trigger_schedule.input, v_schedule.input));
  update flowlane.runs r set schedule_name = v_schedule.schedule_name where r.run_id = v_run.run_id
  returning * into v_run;
  update flowlane.schedules s set last_run_id = v_run.run_id where s.schedule_name = v_schedule.schedule_name;
  return v_run;
end;
$$;

-- == the maintenance tick ===================================================================

-- what every worker, `serve` and console process calls on its maintenance tick: each concern
-- is one function, safe with any number of callers at once. p_now: the time the tick acts
-- for (tests pass a later time instead of waiting).
create function flowlane.maintenance_tick(p_now timestamptz = flowlane._now()) returns jsonb
language plpgsql volatile
set search_path = ''
as $$
declare
  v_fired int := flowlane._fire_schedules(p_now);
  v_begun int := flowlane._begin_due_runs(p_now);
  v_failed int := flowlane._fail_overdue_runs(p_now);
  v_expired int := flowlane.expire_waits(p_now);
  v_released int := flowlane._release_held(p_now);
  v_pruned int := (select p.runs_deleted from flowlane.prune_runs(p_now) p);
  v_cache_pruned int := flowlane._prune_cache(p_now);  -- expired step cache entries (23_cache.sql)
begin
  return jsonb_build_object('fired', v_fired, 'begun', v_begun, 'failed', v_failed,
                            'waits_expired', v_expired, 'released', v_released, 'pruned', v_pruned,
                            'cache_pruned', v_cache_pruned);
end;
$$;
