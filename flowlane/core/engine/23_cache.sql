-- Step caches: a step with a cache (steps.opt_cache_ttl, opt_cache_key, opt_cache_fingerprint)
-- keeps each completed task's output under the key of the task's input for the step's time to
-- live. A task of the step whose key has an unexpired entry when the step starts completes at
-- once with that output, through the completion every result takes, without a queue message
-- and without a worker (step_tasks.cached). A step without a cache pays nothing: the step row
-- that starting and completing a task already read says whether to look.

-- an entry: the output of a task of the step, for the key of its input, under the step's
-- fingerprint (its shape and handler as compiled: a new flow version or handler never finds an
-- older entry), until expires_at
create table flowlane.step_cache (
  flow_slug text not null,
  step_slug text not null,
  fingerprint text not null,
  key_hash text not null,
  output jsonb,
  created_at timestamptz default now() not null,
  expires_at timestamptz not null,
  constraint step_cache_pkey primary key (flow_slug, step_slug, fingerprint, key_hash),
  constraint step_cache_expires_after_created check (expires_at > created_at)
);

-- what pruning deletes: the entries past their time
create index step_cache_expires_idx on flowlane.step_cache (expires_at);

-- a step's cache: a time to live of at least 1 second, for a step with tasks (a handler); its key
-- pointers are JSON pointers into the step's input
create function flowlane._check_cache(p_what text, p_ttl int, p_key text[], p_has_tasks boolean) returns void
language plpgsql immutable
set search_path = ''
as $$
begin
  if p_ttl is null and p_key is not null then
    raise exception '%: a cache key needs a cache ttl', p_what using errcode = '22023';
  end if;
  if p_ttl < 1 then
    raise exception '%: cache ttl must be at least 1 second, not %', p_what, p_ttl using errcode = '22023';
  end if;
  if p_ttl is not null and not p_has_tasks then
    raise exception '%: a cache needs a step with a handler (a wait or child-flow step has no tasks)', p_what
      using errcode = '22023';
  end if;
  if cardinality(p_key) = 0 or exists (select 1 from unnest(p_key) k where k is null or k !~ '^(/([^~/]|~[01])*)+$') then
    raise exception '%: cache key % is not a list of JSON pointers into the step''s input', p_what,
      quote_literal(p_key::text)
      using errcode = '22023', hint = 'a JSON pointer starts with "/" (e.g. /url); "~" is written ~0 and "/" inside a name ~1';
  end if;
end;
$$;

-- the hash of a task's cache key: its whole input without pointers, else the values at the
-- pointers in their order (a missing value is null)
create function flowlane._cache_key_hash(p_pointers text[], p_input jsonb) returns text
language plpgsql immutable
set search_path = ''
as $$
begin
  return encode(sha256(convert_to((
    case when p_pointers is null then coalesce(p_input, 'null'::jsonb)
         else (select jsonb_agg(coalesce(p_input #> flowlane._pointer_path(u.p), 'null'::jsonb) order by u.o)
               from unnest(p_pointers) with ordinality u (p, o)) end)::text, 'UTF8')), 'hex');
end;
$$;

-- of the tasks about to be sent (bodies {flow_slug, run_id, step_slug, task_index}) of cached
-- steps (their runs' locks held), those whose key has an unexpired entry are recorded as started
-- without a message and completed with the entry's output; returns the bodies to send
create function flowlane._take_cached(p_bodies jsonb[]) returns jsonb[]
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
declare
  v_hits flowlane._result_item[];
  v_send jsonb[];
begin
  with tasks as (
    select b.ord, b.body, jsonb_populate_record(null::flowlane.step_tasks, b.body) as t
    from unnest(p_bodies) with ordinality b (body, ord)
  ), keyed as materialized (  -- (each key computed once: the entries are then found by their primary key)
    select k.ord, k.body, (k.t).flow_slug, (k.t).run_id, (k.t).step_slug, (k.t).task_index, s.queue_name,
           coalesce(s.opt_cache_fingerprint, '') as fingerprint,
           case when s.opt_cache_ttl is not null then flowlane._cache_key_hash(s.opt_cache_key, i.input) end as key_hash
    from tasks k
    join flowlane.steps s on s.flow_slug = (k.t).flow_slug and s.step_slug = (k.t).step_slug
    -- (the inputs of the cached steps' tasks only: a queue's tasks may be of several steps)
    left join flowlane._claimed_inputs(array(
      select x.t from tasks x
      join flowlane.steps c on c.flow_slug = (x.t).flow_slug and c.step_slug = (x.t).step_slug
      where c.opt_cache_ttl is not null)) i
      on i.run_id = (k.t).run_id and i.step_slug = (k.t).step_slug and i.task_index = (k.t).task_index
  ), found as (
    select k.*, e.output, e.flow_slug is not null as hit
    from keyed k
    left join flowlane.step_cache e
      on e.flow_slug = k.flow_slug and e.step_slug = k.step_slug and e.fingerprint = k.fingerprint
     and e.key_hash = k.key_hash and e.expires_at > flowlane._now()
  ), started as (
    insert into flowlane.step_tasks (flow_slug, run_id, step_slug, task_index, queue_name, message_id, status,
                                     queued_at, started_at, cached)
    select f.flow_slug, f.run_id, f.step_slug, f.task_index, f.queue_name, null, 'started',
           flowlane._now(), flowlane._now(), true
    from found f where f.hit
    order by f.run_id, f.step_slug, f.task_index
    returning 1
  )
  select coalesce(array_agg(row(f.ord - 1, f.run_id, f.step_slug, f.task_index, f.output, null, null, null, null,
                                null)::flowlane._result_item order by f.ord) filter (where f.hit), '{}'),
         coalesce(array_agg(f.body order by f.ord) filter (where not f.hit), '{}')
    into v_hits, v_send
  from found f
  where (select count(*) from started) >= 0;  -- (the insert runs first)
  if cardinality(v_hits) > 0 then
    perform flowlane._complete_batch(v_hits);
  end if;
  return v_send;
end;
$$;

-- completed tasks (their runs' locks held) of cached steps, by their handler or an operator:
-- each output is kept under its input's key, unless an unexpired entry has the key already (the
-- first completion wins: runs that reach the step with the same key before it completes each
-- run the handler); an expired entry is replaced
create function flowlane._cache_outputs(p_tasks flowlane.step_tasks[]) returns void
language plpgsql volatile
set search_path = ''
set enable_seqscan = off  -- see "Plans" in flowlane/core/engine/README.md
set jit = off  -- see "Plans" in flowlane/core/engine/README.md
as $$
begin
  insert into flowlane.step_cache as e (flow_slug, step_slug, fingerprint, key_hash, output, created_at, expires_at)
  select distinct on (1, 2, 3, 4) t.flow_slug, t.step_slug, coalesce(s.opt_cache_fingerprint, ''),
         flowlane._cache_key_hash(s.opt_cache_key, i.input), t.output, flowlane._now(),
         flowlane._now() + make_interval(secs => s.opt_cache_ttl)
  from unnest(p_tasks) t
  join flowlane.steps s on s.flow_slug = t.flow_slug and s.step_slug = t.step_slug and s.opt_cache_ttl is not null
  join flowlane._claimed_inputs(p_tasks) i
    on i.run_id = t.run_id and i.step_slug = t.step_slug and i.task_index = t.task_index
  where t.status = 'completed' and not t.cached
  order by 1, 2, 3, 4, t.run_id, t.task_index
  on conflict on constraint step_cache_pkey do update
    set output = excluded.output, created_at = excluded.created_at, expires_at = excluded.expires_at
    where e.expires_at <= flowlane._now();
end;
$$;

-- one bounded batch of expired entries deleted (the maintenance tick); how many
create function flowlane._prune_cache(p_now timestamptz) returns int
language plpgsql volatile
set search_path = ''
as $$
declare
  v_n int;
begin
  delete from flowlane.step_cache e
   where (e.flow_slug, e.step_slug, e.fingerprint, e.key_hash) in (
     select x.flow_slug, x.step_slug, x.fingerprint, x.key_hash from flowlane.step_cache x
     where x.expires_at <= p_now order by x.expires_at limit 10000
     for update skip locked);
  get diagnostics v_n = row_count;
  return v_n;
end;
$$;

-- a rerun from a step (retry_run_from) runs the handlers of the steps it resets again: the
-- entries their completed tasks are keyed under go first (p_steps of the locked run p_run_id)
create function flowlane._forget_cached(p_run_id uuid, p_steps text[]) returns void
language plpgsql volatile
set search_path = ''
as $$
declare
  v_tasks flowlane.step_tasks[];
begin
  select coalesce(array_agg(t order by t.step_slug, t.task_index), '{}') into v_tasks
  from flowlane.step_tasks t
  join flowlane.steps s on s.flow_slug = t.flow_slug and s.step_slug = t.step_slug and s.opt_cache_ttl is not null
  where t.run_id = p_run_id and t.step_slug = any (p_steps) and t.status = 'completed';
  if cardinality(v_tasks) = 0 then
    return;
  end if;
  with keyed as materialized (
    select s.flow_slug, s.step_slug, coalesce(s.opt_cache_fingerprint, '') as fingerprint,
           flowlane._cache_key_hash(s.opt_cache_key, i.input) as key_hash
    from flowlane._claimed_inputs(v_tasks) i
    join flowlane.runs r on r.run_id = i.run_id
    join flowlane.steps s on s.flow_slug = r.flow_slug and s.step_slug = i.step_slug
  )
  delete from flowlane.step_cache e
   using keyed k
   where e.flow_slug = k.flow_slug and e.step_slug = k.step_slug and e.fingerprint = k.fingerprint
     and e.key_hash = k.key_hash;
end;
$$;
