-- flowlane SQL Core 0002: queue identity (seed 01).
--
-- Message identity is (queue_name, message_id). Every step stores its
-- resolved queue, every task snapshots it, and every PGMQ operation runs on
-- the task's snapshot, grouped by queue. create_flow no longer performs queue
-- DDL: add_step resolves, validates, provisions and registers the queue.
-- A queue is never dropped by flowlane.
--
-- The upgrade preflight runs before any mutation; the migrator applies this
-- file in one transaction, so a failed preflight leaves the database as it was.

-- ---------------------------------------------------------------------------
-- upgrade preflight (no mutation above this line)
-- ---------------------------------------------------------------------------

do $preflight$
declare
  v_total bigint;
  v_by_status text;
  v_sample text;
begin
  select count(*) into v_total from flowlane.step_tasks t where t.message_id is null;
  if v_total > 0 then
    select string_agg(format('%s=%s', x.status, x.n), ', ' order by x.status) into v_by_status
    from (select t.status, count(*) as n from flowlane.step_tasks t
          where t.message_id is null group by t.status) x;
    select string_agg(format('(run_id=%s, step_slug=%s, task_index=%s, status=%s)',
                             x.run_id, x.step_slug, x.task_index, x.status), '; ') into v_sample
    from (select t.run_id, t.step_slug, t.task_index, t.status from flowlane.step_tasks t
          where t.message_id is null order by t.run_id, t.step_slug, t.task_index limit 5) x;
    raise exception 'flowlane upgrade preflight failed: % task(s) have no message_id and cannot be mapped to a queue message', v_total
      using errcode = '55000',
            detail = format('tasks without message_id by status: %s. sample task keys (at most 5): %s',
                            v_by_status, v_sample),
            hint = 'see docs/upgrade-repair.md for how to inspect and repair these tasks, then run the migration again; nothing was changed';
  end if;

  select count(*) into v_total from (
    select lower(t.flow_slug), t.message_id from flowlane.step_tasks t
    group by 1, 2 having count(*) > 1) d;
  if v_total > 0 then
    select string_agg(format('(queue=%s, message_id=%s, tasks=%s)', x.q, x.message_id, x.n), '; ') into v_sample
    from (select lower(t.flow_slug) as q, t.message_id, count(*) as n from flowlane.step_tasks t
          group by 1, 2 having count(*) > 1 order by 1, 2 limit 5) x;
    raise exception 'flowlane upgrade preflight failed: % queue message(s) are referenced by more than one task', v_total
      using errcode = '55000',
            detail = format('sample (at most 5): %s', v_sample),
            hint = 'see docs/upgrade-repair.md (duplicate message identities), then run the migration again; nothing was changed';
  end if;
end;
$preflight$;

-- ---------------------------------------------------------------------------
-- queue registry and queue identity columns
-- ---------------------------------------------------------------------------

create function flowlane.is_valid_queue_name(queue_name text) returns boolean
language sql immutable parallel safe
set search_path = ''
as $$
  select queue_name is not null
     and length(queue_name) between 1 and 47
     and queue_name ~ '^[a-z][a-z0-9_]*$'
     and right(queue_name, 1) <> '_'
$$;

create table flowlane.queues (
  queue_name text primary key,
  ownership text not null default 'owned',
  owner_flow_slug text,
  created_at timestamptz not null default now(),
  constraint queues_name_canonical check (flowlane.is_valid_queue_name(queue_name)),
  constraint queues_ownership_valid check (ownership in ('owned', 'shared')),
  constraint queues_owner_iff_owned check ((ownership = 'owned') = (owner_flow_slug is not null))
);
create index queues_owner_idx on flowlane.queues (owner_flow_slug);

insert into flowlane.queues (queue_name, ownership, owner_flow_slug)
select lower(f.flow_slug), 'owned', f.flow_slug from flowlane.flows f
order by f.flow_slug;

-- every registered queue exists in PGMQ (0001 created them; recreate any lost one)
do $ensure$
declare
  v_queue text;
begin
  for v_queue in
    select q.queue_name from flowlane.queues q
    where not exists (select 1 from pgmq.list_queues() l where l.queue_name = q.queue_name)
    order by 1
  loop
    perform pgmq.create(v_queue);
  end loop;
end;
$ensure$;

alter table flowlane.flows add column queue_mode text not null default 'flow'
  constraint flows_queue_mode_valid check (queue_mode in ('flow', 'per-step', 'explicit'));

-- a flow's shape is sealed once it was verified (ensure_flow_shape /
-- ensure_flow_compiled) or has runs: add_step then refuses new steps. Flows
-- that exist at upgrade time were applied under 0001: they are sealed.
alter table flowlane.flows add column shape_sealed_at timestamptz;
update flowlane.flows f set shape_sealed_at = now();

alter table flowlane.steps add column queue_name text;
update flowlane.steps s set queue_name = lower(s.flow_slug);
alter table flowlane.steps alter column queue_name set not null;
alter table flowlane.steps add constraint steps_queue_registered
  foreign key (queue_name) references flowlane.queues (queue_name);

alter table flowlane.step_tasks add column queue_name text;
update flowlane.step_tasks t set queue_name = lower(t.flow_slug);
alter table flowlane.step_tasks alter column queue_name set not null;
alter table flowlane.step_tasks alter column message_id set not null;
drop index flowlane.step_tasks_message_idx;
alter table flowlane.step_tasks add constraint step_tasks_queue_message_unique unique (queue_name, message_id);

-- persisted identities never change: a row trigger that fires only when an
-- UPDATE names these columns (ordinary status/output updates never do)
create function flowlane._forbid_identity_change() returns trigger
language plpgsql
set search_path = ''
as $$
begin
  raise exception 'flowlane: %.% is an immutable identity and cannot be updated', tg_table_name, tg_argv[0]
    using errcode = '55000';
end;
$$;

create trigger step_tasks_queue_identity_immutable
  before update of queue_name, message_id on flowlane.step_tasks
  for each row
  when (old.queue_name is distinct from new.queue_name or old.message_id is distinct from new.message_id)
  execute function flowlane._forbid_identity_change('queue_name/message_id');

create trigger steps_queue_immutable
  before update of queue_name on flowlane.steps
  for each row
  when (old.queue_name is distinct from new.queue_name)
  execute function flowlane._forbid_identity_change('queue_name');

-- ---------------------------------------------------------------------------
-- queue helpers
-- ---------------------------------------------------------------------------

-- the queue a task's message lives on: its immutable snapshot
create or replace function flowlane._task_queue(task flowlane.step_tasks) returns text
language sql stable
set search_path = ''
as $$ select ($1).queue_name $$;

-- the queue of a step of a flow in the given mode (explicit: the given name)
create function flowlane._resolve_queue(
  p_flow_slug text, p_step_slug text, p_step_index int, p_mode text, p_given text
) returns text
language plpgsql stable
set search_path = ''
as $$
declare
  v_queue text;
begin
  if p_mode = 'flow' then
    v_queue := lower(p_flow_slug);
  elsif p_mode = 'per-step' then
    v_queue := lower(p_flow_slug || '__' || p_step_slug);
    if length(v_queue) > 47 then
      v_queue := lower(p_flow_slug || '__' || p_step_index);
    end if;
    if length(v_queue) > 47 then
      raise exception 'step "%" of flow "%": the per-step queue name % is longer than 47 characters (the PGMQ limit)',
        p_step_slug, p_flow_slug, v_queue
        using errcode = '22023', hint = 'use a shorter flow slug, or explicit queue names';
    end if;
  else
    if p_given is null then
      raise exception 'step "%" of flow "%": the flow routes steps explicitly (queue_mode explicit), so queue_name is required',
        p_step_slug, p_flow_slug using errcode = '22023';
    end if;
    if p_given <> lower(p_given) and flowlane.is_valid_queue_name(lower(p_given))
       and position('__' in p_given) = 0 then
      raise exception 'step "%" of flow "%": queue name "%" is not canonical', p_step_slug, p_flow_slug, p_given
        using errcode = '22023', hint = format('queue names are lowercase: write "%s"', lower(p_given));
    end if;
    if not flowlane.is_valid_queue_name(p_given) or position('__' in p_given) > 0 then
      raise exception 'step "%" of flow "%": invalid queue name "%"', p_step_slug, p_flow_slug, p_given
        using errcode = '22023',
              hint = 'a queue name matches ^[a-z][a-z0-9_]*$, has at most 47 characters, no trailing "_", and no "__" (reserved for generated per-step queues)';
    end if;
    return p_given;
  end if;
  if p_given is not null and p_given <> v_queue then
    raise exception 'step "%" of flow "%": queue_mode % routes this step to queue "%", not "%"',
      p_step_slug, p_flow_slug, p_mode, v_queue, p_given using errcode = '22023';
  end if;
  return v_queue;
end;
$$;

-- register (idempotently) and provision the PGMQ queue of a step
create function flowlane._ensure_queue(p_queue text, p_flow_slug text, p_mode text) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_row flowlane.queues;
  v_ownership text := case when p_mode = 'explicit' then 'shared' else 'owned' end;
begin
  perform pg_advisory_xact_lock(hashtext('flowlane.queue:' || p_queue));
  select * into v_row from flowlane.queues q where q.queue_name = p_queue;
  if found then
    if v_row.ownership = 'owned' and v_row.owner_flow_slug <> p_flow_slug then
      raise exception 'queue "%" is owned by flow "%" and cannot be used by flow "%"',
        p_queue, v_row.owner_flow_slug, p_flow_slug
        using errcode = '42501', hint = 'route this flow''s steps to another queue';
    end if;
    if v_row.ownership <> v_ownership then
      raise exception 'queue "%" is % but flow "%" (queue_mode %) needs it %',
        p_queue, v_row.ownership, p_flow_slug, p_mode, v_ownership
        using errcode = '42501',
              hint = 'a queue owned by one flow is never shared, and a shared queue is never owned';
    end if;
  else
    if exists (select 1 from pgmq.list_queues() l where l.queue_name = p_queue) then
      raise exception 'PGMQ queue "%" already exists but is not registered with flowlane', p_queue
        using errcode = '42501',
              hint = 'flowlane never takes over a queue it did not create; adopt it explicitly or choose another queue name';
    end if;
    insert into flowlane.queues (queue_name, ownership, owner_flow_slug)
    values (p_queue, v_ownership, case when v_ownership = 'owned' then p_flow_slug end);
  end if;
  if not exists (select 1 from pgmq.list_queues() l where l.queue_name = p_queue) then
    perform pgmq.create(p_queue);
  end if;
end;
$$;

-- ---------------------------------------------------------------------------
-- definitions
-- ---------------------------------------------------------------------------

drop function flowlane.create_flow(text, int, int, int);

create function flowlane.create_flow(
  flow_slug text,
  max_attempts int = null,
  base_delay int = null,
  timeout int = null,
  queue_mode text = 'flow'
) returns flowlane.flows
language plpgsql volatile
set search_path = ''
as $$
declare
  v_flow flowlane.flows;
  v_other text;
  v_mode text := coalesce(create_flow.queue_mode, 'flow');
begin
  perform flowlane._check_slug('flow', create_flow.flow_slug);
  if v_mode not in ('flow', 'per-step', 'explicit') then
    raise exception 'flow "%": queue_mode must be flow, per-step or explicit, not %',
      create_flow.flow_slug, quote_literal(v_mode) using errcode = '22023';
  end if;
  if v_mode = 'flow' and length(create_flow.flow_slug) > 47 then
    raise exception 'flow "%": with queue_mode flow the queue is the lowercase flow slug, which must have at most 47 characters (the PGMQ limit)',
      create_flow.flow_slug using errcode = '22023', hint = 'use a shorter slug, or per-step/explicit queues';
  end if;
  select f.flow_slug into v_other from flowlane.flows f
  where lower(f.flow_slug) = lower(create_flow.flow_slug) and f.flow_slug <> create_flow.flow_slug;
  if found then
    raise exception 'flow slug "%" conflicts with existing flow "%" (flow slugs are unique case-insensitively)',
      create_flow.flow_slug, v_other using errcode = '23505';
  end if;
  select * into v_flow from flowlane.flows f where f.flow_slug = create_flow.flow_slug for update;
  if found and v_flow.queue_mode <> v_mode then
    raise exception 'FLOWLANE_SHAPE_MISMATCH: flow "%" exists with queue_mode %, not %',
      create_flow.flow_slug, v_flow.queue_mode, v_mode
      using errcode = '23514',
            hint = 'the queue mode is part of the flow''s shape; create a new flow version (a new slug)';
  end if;
  insert into flowlane.flows as f (flow_slug, opt_max_attempts, opt_base_delay, opt_timeout, queue_mode)
  values (create_flow.flow_slug, coalesce(max_attempts, 3), coalesce(base_delay, 5), coalesce(timeout, 60), v_mode)
  on conflict on constraint flows_pkey do update
    set opt_max_attempts = excluded.opt_max_attempts,
        opt_base_delay = excluded.opt_base_delay,
        opt_timeout = excluded.opt_timeout
  returning * into v_flow;
  return v_flow;
end;
$$;

drop function flowlane.add_step(text, text, text[], int, int, int, int, text, jsonb, jsonb, text, text);

create function flowlane.add_step(
  flow_slug text,
  step_slug text,
  deps_slugs text[] = '{}',
  max_attempts int = null,
  base_delay int = null,
  timeout int = null,
  start_delay int = null,
  step_type text = 'single',
  required_input_pattern jsonb = null,
  forbidden_input_pattern jsonb = null,
  when_unmet text = 'skip',
  when_exhausted text = 'fail',
  queue_name text = null
) returns flowlane.steps
language plpgsql volatile
set search_path = ''
as $$
declare
  v_flow text := add_step.flow_slug;
  v_step text := add_step.step_slug;
  v_deps text[] := coalesce(deps_slugs, '{}');
  v_type text := coalesce(add_step.step_type, 'single');
  v_unmet text := coalesce(add_step.when_unmet, 'skip');
  v_exhausted text := coalesce(add_step.when_exhausted, 'fail');
  v_mode text;
  v_queue text;
  v_index int;
  v_existing flowlane.steps;
  v_existing_deps text[];
  v_sorted_deps text[];
  v_dep text;
  v_other text;
  v_row flowlane.steps;
begin
  select f.queue_mode into v_mode from flowlane.flows f where f.flow_slug = v_flow for update;
  if not found then
    raise exception 'unknown flow "%": create it with flowlane.create_flow first', v_flow
      using errcode = '23503';
  end if;
  perform flowlane._check_slug('step', v_step);
  if v_type not in ('single', 'map') then
    raise exception 'step "%" of flow "%": step_type must be single or map, not %', v_step, v_flow,
      quote_literal(v_type) using errcode = '22023';
  end if;
  if v_type = 'map' and cardinality(v_deps) > 1 then
    raise exception 'map step "%" of flow "%" has % dependencies: a map step has 0 (it maps the run input) or 1 (it maps that step''s output)',
      v_step, v_flow, cardinality(v_deps) using errcode = '22023';
  end if;
  if required_input_pattern is not null and jsonb_typeof(required_input_pattern) <> 'object' then
    raise exception 'step "%" of flow "%": required_input_pattern (if) must be a JSON object, got %',
      v_step, v_flow, jsonb_typeof(required_input_pattern) using errcode = '22023';
  end if;
  if forbidden_input_pattern is not null and jsonb_typeof(forbidden_input_pattern) <> 'object' then
    raise exception 'step "%" of flow "%": forbidden_input_pattern (unless) must be a JSON object, got %',
      v_step, v_flow, jsonb_typeof(forbidden_input_pattern) using errcode = '22023';
  end if;
  if v_unmet not in ('skip', 'skip-cascade', 'fail') then
    raise exception 'step "%" of flow "%": when_unmet must be skip, skip-cascade or fail, not %',
      v_step, v_flow, quote_literal(v_unmet) using errcode = '22023';
  end if;
  if v_unmet <> 'skip' and required_input_pattern is null and forbidden_input_pattern is null then
    raise exception 'step "%" of flow "%": when_unmet % is only meaningful with a condition (required_input_pattern or forbidden_input_pattern)',
      v_step, v_flow, v_unmet using errcode = '22023';
  end if;
  if v_exhausted not in ('fail', 'skip', 'skip-cascade') then
    raise exception 'step "%" of flow "%": when_exhausted must be fail, skip or skip-cascade, not %',
      v_step, v_flow, quote_literal(v_exhausted) using errcode = '22023';
  end if;
  if array_position(v_deps, null) is not null then
    raise exception 'step "%" of flow "%": a dependency slug is null', v_step, v_flow using errcode = '22023';
  end if;
  select array_agg(d order by d collate "C") into v_sorted_deps from (select distinct unnest(v_deps) as d) x;
  v_sorted_deps := coalesce(v_sorted_deps, '{}');
  if cardinality(v_sorted_deps) <> cardinality(v_deps) then
    raise exception 'step "%" of flow "%" lists a dependency twice: %', v_step, v_flow, v_deps
      using errcode = '22023';
  end if;

  select * into v_existing from flowlane.steps s where s.flow_slug = v_flow and s.step_slug = v_step;
  if found then
    v_index := v_existing.step_index;
  else
    select coalesce(max(s.step_index) + 1, 0) into v_index from flowlane.steps s where s.flow_slug = v_flow;
  end if;
  v_queue := flowlane._resolve_queue(v_flow, v_step, v_index, v_mode, add_step.queue_name);

  if v_existing.flow_slug is not null then
    select coalesce(array_agg(d.dep_slug order by d.dep_slug collate "C"), '{}') into v_existing_deps
    from flowlane.deps d where d.flow_slug = v_flow and d.step_slug = v_step;
    if v_existing.step_type <> v_type then
      perform flowlane._shape_mismatch(v_flow, v_step, 'step_type', v_existing.step_type, v_type);
    end if;
    if v_existing_deps <> v_sorted_deps then
      perform flowlane._shape_mismatch(v_flow, v_step, 'deps', v_existing_deps::text, v_sorted_deps::text);
    end if;
    if v_existing.required_input_pattern is distinct from required_input_pattern then
      perform flowlane._shape_mismatch(v_flow, v_step, 'required_input_pattern',
        v_existing.required_input_pattern::text, required_input_pattern::text);
    end if;
    if v_existing.forbidden_input_pattern is distinct from forbidden_input_pattern then
      perform flowlane._shape_mismatch(v_flow, v_step, 'forbidden_input_pattern',
        v_existing.forbidden_input_pattern::text, forbidden_input_pattern::text);
    end if;
    if v_existing.when_unmet <> v_unmet then
      perform flowlane._shape_mismatch(v_flow, v_step, 'when_unmet', v_existing.when_unmet, v_unmet);
    end if;
    if v_existing.when_exhausted <> v_exhausted then
      perform flowlane._shape_mismatch(v_flow, v_step, 'when_exhausted', v_existing.when_exhausted, v_exhausted);
    end if;
    if v_existing.queue_name <> v_queue then
      perform flowlane._shape_mismatch(v_flow, v_step, 'queue_name', v_existing.queue_name, v_queue);
    end if;
    perform flowlane._ensure_queue(v_queue, v_flow, v_mode);
    update flowlane.steps s
       set opt_max_attempts = max_attempts, opt_base_delay = base_delay,
           opt_timeout = timeout, opt_start_delay = start_delay
     where s.flow_slug = v_flow and s.step_slug = v_step
    returning * into v_row;
    return v_row;
  end if;

  select s.step_slug into v_other from flowlane.steps s
  where s.flow_slug = v_flow and lower(s.step_slug) = lower(v_step);
  if found then
    raise exception 'step slug "%" conflicts with existing step "%" of flow "%" (step slugs are unique case-insensitively within a flow)',
      v_step, v_other, v_flow using errcode = '23505';
  end if;
  foreach v_dep in array v_sorted_deps loop
    if v_dep = v_step then
      raise exception 'step "%" of flow "%" cannot depend on itself', v_step, v_flow using errcode = '22023';
    end if;
    if not exists (select 1 from flowlane.steps s where s.flow_slug = v_flow and s.step_slug = v_dep) then
      raise exception 'step "%" of flow "%" depends on unknown step "%" (add dependencies before the steps that need them)',
        v_step, v_flow, v_dep using errcode = '23503';
    end if;
  end loop;

  if exists (select 1 from flowlane.flows f where f.flow_slug = v_flow and f.shape_sealed_at is not null)
     or exists (select 1 from flowlane.runs r where r.flow_slug = v_flow) then
    raise exception 'FLOWLANE_SHAPE_MISMATCH: flow "%" is already applied and has no step "%"', v_flow, v_step
      using errcode = '23514',
            hint = 'the shape of a flow never changes once applied (verified or run); create a new flow version (a new slug)';
  end if;
  perform flowlane._ensure_queue(v_queue, v_flow, v_mode);
  insert into flowlane.steps (flow_slug, step_slug, step_type, step_index, deps_count,
    opt_max_attempts, opt_base_delay, opt_timeout, opt_start_delay,
    required_input_pattern, forbidden_input_pattern, when_unmet, when_exhausted, queue_name)
  values (v_flow, v_step, v_type, v_index, cardinality(v_sorted_deps), max_attempts, base_delay, timeout,
    start_delay, required_input_pattern, forbidden_input_pattern, v_unmet, v_exhausted, v_queue)
  returning * into v_row;
  insert into flowlane.deps (flow_slug, dep_slug, step_slug)
  select v_flow, d, v_step from unnest(v_sorted_deps) d;
  return v_row;
end;
$$;

-- ---------------------------------------------------------------------------
-- runs: sends grouped by queue, queue snapshot on every task, no queue DDL
-- ---------------------------------------------------------------------------

create or replace function flowlane.start_ready_steps(run_id uuid) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_run flowlane.runs;
  v_slugs text[];
  v_counts int[];
  v_queues text[];
  v_delays int[];
  v_group record;
  v_item_slugs text[];
  v_item_index int[];
  v_ids bigint[];
begin
  select * into v_run from flowlane.runs r where r.run_id = start_ready_steps.run_id for update;
  if not found or v_run.status <> 'started' then
    return;
  end if;
  with ready as (
    select ss.step_slug
    from flowlane.step_states ss
    where ss.run_id = v_run.run_id and ss.status = 'created' and ss.remaining_deps = 0
      and ss.initial_tasks > 0 and flowlane._condition_met(v_run.run_id, ss.step_slug)
    order by ss.step_slug
    for update
  ), started as (
    update flowlane.step_states ss
       set status = 'started', started_at = now(), remaining_tasks = ss.initial_tasks
      from ready
     where ss.run_id = v_run.run_id and ss.step_slug = ready.step_slug
    returning ss.step_slug, ss.initial_tasks
  )
  select coalesce(array_agg(st.step_slug order by s.step_index), '{}'),
         coalesce(array_agg(st.initial_tasks order by s.step_index), '{}'),
         coalesce(array_agg(s.queue_name order by s.step_index), '{}'),
         coalesce(array_agg(coalesce(s.opt_start_delay, 0) order by s.step_index), '{}')
    into v_slugs, v_counts, v_queues, v_delays
  from started st join flowlane.steps s on s.flow_slug = v_run.flow_slug and s.step_slug = st.step_slug;

  -- one send_batch per (queue, start delay), steps in step_index order
  for v_group in
    select v_queues[i] as queue_name, v_delays[i] as start_delay, array_agg(i order by i) as steps
    from generate_subscripts(v_slugs, 1) as i
    group by 1, 2
    order by 1, 2
  loop
    select array_agg(v_slugs[i] order by i, k), array_agg(k order by i, k)
      into v_item_slugs, v_item_index
    from unnest(v_group.steps) as i
    cross join lateral generate_series(0, v_counts[i] - 1) as k;

    select array_agg(m.id order by m.ord) into v_ids
    from pgmq.send_batch(v_group.queue_name,
           array(select jsonb_build_object('flow_slug', v_run.flow_slug, 'run_id', v_run.run_id,
                                           'step_slug', v_item_slugs[j], 'task_index', v_item_index[j])
                 from generate_subscripts(v_item_slugs, 1) as j order by j),
           v_group.start_delay) with ordinality as m(id, ord);
    if coalesce(cardinality(v_ids), 0) <> cardinality(v_item_slugs) then
      raise exception 'internal error: sent % messages to queue % for % tasks',
        coalesce(cardinality(v_ids), 0), v_group.queue_name, cardinality(v_item_slugs);
    end if;
    insert into flowlane.step_tasks (flow_slug, run_id, step_slug, task_index, queue_name, message_id)
    select v_run.flow_slug, v_run.run_id, v_item_slugs[j], v_item_index[j], v_group.queue_name, v_ids[j]
    from generate_subscripts(v_item_slugs, 1) as j;
  end loop;
end;
$$;

-- claim: the queue is separate from the flow; a batch may hold tasks of
-- several flows that share the queue
drop function flowlane.start_tasks(text, bigint[], uuid);
drop type flowlane.step_task_record;
create type flowlane.step_task_record as (
  flow_slug text,
  step_slug text,
  queue_name text,
  run_id uuid,
  task_index int,
  input jsonb,
  flow_input jsonb,
  attempt int,
  msg_id bigint
);

create function flowlane.start_tasks(queue_name text, msg_ids bigint[], worker_id uuid)
returns setof flowlane.step_task_record
language plpgsql volatile
set search_path = ''
as $$
declare
  v_claimed flowlane.step_tasks[];
  v_offsets int[];
  v_updated int;
begin
  -- run locks first (shared: claims do not block each other), in a fixed order
  perform 1 from flowlane.runs r
  where r.run_id in (select t.run_id from flowlane.step_tasks t
                     where t.queue_name = start_tasks.queue_name and t.message_id = any(msg_ids)
                       and t.status = 'queued')
  order by r.run_id
  for share;

  with claimed as (
    update flowlane.step_tasks t
       set status = 'started', attempts_count = t.attempts_count + 1, started_at = now(),
           last_worker_id = start_tasks.worker_id
      from flowlane.runs r, flowlane.step_states ss
     where t.queue_name = start_tasks.queue_name and t.message_id = any(msg_ids) and t.status = 'queued'
       and r.run_id = t.run_id and r.status = 'started'
       and ss.run_id = t.run_id and ss.step_slug = t.step_slug and ss.status = 'started'
    returning t
  ) select coalesce(array_agg(c.t order by (c.t).message_id), '{}') into v_claimed from claimed c;

  if cardinality(v_claimed) = 0 then
    return;
  end if;
  select array_agg(flowlane._effective_timeout((v_claimed[i]).flow_slug, (v_claimed[i]).step_slug) + 2 order by i)
    into v_offsets from generate_subscripts(v_claimed, 1) as i;
  v_updated := flowlane._set_tasks_vt(v_claimed, v_offsets);
  if v_updated <> cardinality(v_claimed) then
    raise exception 'claim aborted: % tasks claimed but % queue messages got their visibility extended',
      cardinality(v_claimed), v_updated
      using errcode = '40001', hint = 'a task''s message is missing from its queue; the claim was rolled back';
  end if;

  return query
    select (v_claimed[i]).flow_slug, (v_claimed[i]).step_slug, (v_claimed[i]).queue_name,
           (v_claimed[i]).run_id, (v_claimed[i]).task_index,
           flowlane._task_input((v_claimed[i]).run_id, (v_claimed[i]).step_slug, (v_claimed[i]).task_index),
           r.input, (v_claimed[i]).attempts_count, (v_claimed[i]).message_id
    from generate_subscripts(v_claimed, 1) as i
    join flowlane.runs r on r.run_id = (v_claimed[i]).run_id
    order by i;
end;
$$;

-- ---------------------------------------------------------------------------
-- recovery and deletion
-- ---------------------------------------------------------------------------

-- same rule as 0001, stated again here because it is seed 01's #621 fix:
-- stalled = started before now - (coalesce(step.opt_timeout, flow.opt_timeout) + 30 s);
-- visibility resets and archives go to each task's own queue, grouped by queue
create or replace function flowlane.requeue_stalled_tasks() returns int
language plpgsql volatile
set search_path = ''
as $$
declare
  v_requeued flowlane.step_tasks[];
  v_stalled flowlane.step_tasks[];
begin
  with candidates as (
    select t.run_id, t.step_slug, t.task_index
    from flowlane.step_tasks t
    join flowlane.runs r on r.run_id = t.run_id and r.status = 'started'
    join flowlane.step_states ss on ss.run_id = t.run_id and ss.step_slug = t.step_slug and ss.status = 'started'
    join flowlane.steps s on s.flow_slug = t.flow_slug and s.step_slug = t.step_slug
    join flowlane.flows f on f.flow_slug = t.flow_slug
    where t.status = 'started' and t.permanently_stalled_at is null
      and t.started_at < now() - make_interval(secs => coalesce(s.opt_timeout, f.opt_timeout) + 30)
    order by t.run_id, t.step_slug, t.task_index
    for update of t skip locked
  ), requeued as (
    update flowlane.step_tasks t
       set status = 'queued', started_at = null, last_worker_id = null,
           requeued_count = t.requeued_count + 1, last_requeued_at = now()
      from candidates c
     where t.run_id = c.run_id and t.step_slug = c.step_slug and t.task_index = c.task_index
       and t.requeued_count < 3
    returning t
  ), stalled as (
    update flowlane.step_tasks t
       set permanently_stalled_at = now()
      from candidates c
     where t.run_id = c.run_id and t.step_slug = c.step_slug and t.task_index = c.task_index
       and t.requeued_count >= 3
    returning t
  )
  select (select coalesce(array_agg(q.t), '{}') from requeued q),
         (select coalesce(array_agg(p.t), '{}') from stalled p)
    into v_requeued, v_stalled;
  perform flowlane._set_tasks_vt(v_requeued, array_fill(0, array[cardinality(v_requeued)]));
  perform flowlane._archive_tasks(v_stalled);
  return cardinality(v_requeued);
end;
$$;

-- archives only this flow's active messages (grouped by task queue), deletes
-- its rows, and never drops a queue (registry rows stay: ownership persists)
create or replace function flowlane.delete_flow_and_data(flow_slug text) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_active flowlane.step_tasks[];
begin
  perform 1 from flowlane.runs r where r.flow_slug = delete_flow_and_data.flow_slug
  order by r.run_id for update;
  select coalesce(array_agg(t order by t.queue_name, t.message_id), '{}') into v_active
  from flowlane.step_tasks t
  where t.flow_slug = delete_flow_and_data.flow_slug and t.status in ('queued', 'started');
  perform flowlane._archive_tasks(v_active);
  delete from flowlane.step_tasks t where t.flow_slug = delete_flow_and_data.flow_slug;
  delete from flowlane.step_states ss where ss.flow_slug = delete_flow_and_data.flow_slug;
  delete from flowlane.runs r where r.flow_slug = delete_flow_and_data.flow_slug;
  delete from flowlane.deps d where d.flow_slug = delete_flow_and_data.flow_slug;
  delete from flowlane.steps s where s.flow_slug = delete_flow_and_data.flow_slug;
  delete from flowlane.flows f where f.flow_slug = delete_flow_and_data.flow_slug;
end;
$$;

-- ---------------------------------------------------------------------------
-- shapes (docs/shape.md)
-- ---------------------------------------------------------------------------

create function flowlane.get_flow_shape(flow_slug text) returns jsonb
language sql stable
set search_path = ''
as $$
  select jsonb_build_object(
    'queue_mode', f.queue_mode,
    'steps', coalesce((
      select jsonb_agg(jsonb_build_object(
               'slug', s.step_slug,
               'type', s.step_type,
               'needs', coalesce((select jsonb_agg(d.dep_slug order by d.dep_slug collate "C")
                                  from flowlane.deps d
                                  where d.flow_slug = s.flow_slug and d.step_slug = s.step_slug), '[]'::jsonb),
               'if', s.required_input_pattern,
               'unless', s.forbidden_input_pattern,
               'when_unmet', s.when_unmet,
               'when_exhausted', s.when_exhausted,
               'queue', s.queue_name) order by s.step_index)
      from flowlane.steps s where s.flow_slug = f.flow_slug), '[]'::jsonb))
  from flowlane.flows f
  where f.flow_slug = get_flow_shape.flow_slug
$$;

create function flowlane._shape_text(v jsonb) returns text
language sql immutable
set search_path = ''
as $$
  select case when v is null then 'absent'
              when jsonb_typeof(v) = 'string' then v #>> '{}'
              else v::text end
$$;

-- readable differences between the stored shape and a given one
create function flowlane._shape_differences(p_db jsonb, p_given jsonb) returns text[]
language plpgsql immutable
set search_path = ''
as $$
declare
  v_out text[] := '{}';
  v_db_steps jsonb := coalesce(p_db -> 'steps', '[]'::jsonb);
  v_given_steps jsonb := coalesce(p_given -> 'steps', '[]'::jsonb);
  v_n int;
  v_key text;
  v_db_step jsonb;
  v_given_step jsonb;
  v_label text;
begin
  if jsonb_typeof(p_given) is distinct from 'object' or jsonb_typeof(v_given_steps) <> 'array' then
    raise exception 'a flow shape is a JSON object with "queue_mode" and a "steps" array, got %',
      coalesce(left(p_given::text, 200), 'null') using errcode = '22023';
  end if;
  if (p_db -> 'queue_mode') is distinct from (p_given -> 'queue_mode') then
    v_out := v_out || format('queue_mode: %s in the database, %s in the given shape',
      flowlane._shape_text(p_db -> 'queue_mode'), flowlane._shape_text(p_given -> 'queue_mode'));
  end if;
  for v_key in select k from jsonb_object_keys(p_given) k
               where k not in ('queue_mode', 'steps') order by k loop
    v_out := v_out || format('unknown key %s in the given shape', v_key);
  end loop;
  if jsonb_array_length(v_db_steps) <> jsonb_array_length(v_given_steps) then
    v_out := v_out || format('step count: %s in the database, %s in the given shape',
      jsonb_array_length(v_db_steps), jsonb_array_length(v_given_steps));
  end if;
  v_n := greatest(jsonb_array_length(v_db_steps), jsonb_array_length(v_given_steps));
  for i in 0 .. v_n - 1 loop
    v_db_step := v_db_steps -> i;
    v_given_step := v_given_steps -> i;
    if v_db_step is null then
      v_out := v_out || format('step %s (%s): only in the given shape', i, flowlane._shape_text(v_given_step -> 'slug'));
      continue;
    elsif v_given_step is null then
      v_out := v_out || format('step %s (%s): only in the database', i, flowlane._shape_text(v_db_step -> 'slug'));
      continue;
    end if;
    if (v_db_step -> 'slug') is distinct from (v_given_step -> 'slug') then
      v_out := v_out || format('step %s: slug is %s in the database, %s in the given shape', i,
        flowlane._shape_text(v_db_step -> 'slug'), flowlane._shape_text(v_given_step -> 'slug'));
      continue;
    end if;
    v_label := format('step %s (%s)', i, flowlane._shape_text(v_db_step -> 'slug'));
    foreach v_key in array array['type', 'needs', 'if', 'unless', 'when_unmet', 'when_exhausted', 'queue'] loop
      if (v_db_step -> v_key) is distinct from (v_given_step -> v_key) then
        v_out := v_out || format('%s: %s is %s in the database, %s in the given shape', v_label, v_key,
          flowlane._shape_text(v_db_step -> v_key), flowlane._shape_text(v_given_step -> v_key));
      end if;
    end loop;
    for v_key in select k from jsonb_object_keys(v_given_step) k
                 where k not in ('slug', 'type', 'needs', 'if', 'unless', 'when_unmet', 'when_exhausted', 'queue')
                 order by k loop
      v_out := v_out || format('%s: unknown key %s in the given shape', v_label, v_key);
    end loop;
  end loop;
  return v_out;
end;
$$;

create function flowlane.ensure_flow_shape(flow_slug text, shape jsonb) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_db jsonb := flowlane.get_flow_shape(ensure_flow_shape.flow_slug);
  v_diff text[];
begin
  if v_db is null then
    raise exception 'FLOWLANE_SHAPE_MISMATCH: flow "%" does not exist in the database', ensure_flow_shape.flow_slug
      using errcode = '23514';
  end if;
  v_diff := flowlane._shape_differences(v_db, shape);
  if cardinality(v_diff) > 0 then
    raise exception 'FLOWLANE_SHAPE_MISMATCH: flow "%" has a different shape in the database', ensure_flow_shape.flow_slug
      using errcode = '23514',
            detail = array_to_string(v_diff, E'\n'),
            hint = 'a flow''s shape never changes once applied; give the changed flow a new slug (a new version)';
  end if;
  update flowlane.flows f set shape_sealed_at = now()
   where f.flow_slug = ensure_flow_shape.flow_slug and f.shape_sealed_at is null;
end;
$$;

create function flowlane.ensure_flow_compiled(flow_slug text, shape jsonb) returns jsonb
language plpgsql volatile
set search_path = ''
as $$
declare
  v_slug text := ensure_flow_compiled.flow_slug;
  v_step jsonb;
  v_diff text[];
begin
  perform pg_advisory_xact_lock(hashtext('flowlane.flow:' || lower(v_slug)));
  if not exists (select 1 from flowlane.flows f where f.flow_slug = v_slug) then
    -- validate the document before creating anything
    v_diff := flowlane._shape_differences(jsonb_build_object('queue_mode', shape -> 'queue_mode', 'steps', '[]'::jsonb), shape);
    perform flowlane.create_flow(v_slug, queue_mode => shape ->> 'queue_mode');
    for v_step in select e from jsonb_array_elements(shape -> 'steps') e loop
      perform flowlane.add_step(
        flow_slug => v_slug,
        step_slug => v_step ->> 'slug',
        deps_slugs => coalesce((select array_agg(n order by o) from jsonb_array_elements_text(v_step -> 'needs') with ordinality as x(n, o)), '{}'),
        step_type => coalesce(v_step ->> 'type', 'single'),
        required_input_pattern => nullif(v_step -> 'if', 'null'::jsonb),
        forbidden_input_pattern => nullif(v_step -> 'unless', 'null'::jsonb),
        when_unmet => coalesce(v_step ->> 'when_unmet', 'skip'),
        when_exhausted => coalesce(v_step ->> 'when_exhausted', 'fail'),
        queue_name => v_step ->> 'queue');
    end loop;
    v_diff := flowlane._shape_differences(flowlane.get_flow_shape(v_slug), shape);
    if cardinality(v_diff) > 0 then
      raise exception 'FLOWLANE_SHAPE_MISMATCH: the shape given for flow "%" is not what it compiles to', v_slug
        using errcode = '23514', detail = array_to_string(v_diff, E'\n'),
              hint = 'check the shape document (needs sorted by code point, defaults written out)';
    end if;
    update flowlane.flows f set shape_sealed_at = now() where f.flow_slug = v_slug;
    return jsonb_build_object('status', 'compiled', 'differences', '[]'::jsonb);
  end if;
  v_diff := flowlane._shape_differences(flowlane.get_flow_shape(v_slug), shape);
  if cardinality(v_diff) = 0 then
    update flowlane.flows f set shape_sealed_at = now()
     where f.flow_slug = v_slug and f.shape_sealed_at is null;
    return jsonb_build_object('status', 'verified', 'differences', '[]'::jsonb);
  end if;
  return jsonb_build_object('status', 'mismatch', 'differences', to_jsonb(v_diff));
end;
$$;
