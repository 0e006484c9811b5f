-- A batch of results means what its items mean one by one, in key order.
--
-- 0009 applies the items of a run one by one when one of them ends the run itself
-- (a type violation, an exhausted task that fails it) and the run has other items
-- in the batch. A completion can also end a run indirectly: it releases a step
-- whose condition is unmet and whose when_unmet is fail, directly or through steps
-- that resolve at once (an empty map completes in the same call). Applied together
-- with the run's other items, that failure stopped the steps they released from
-- starting, while one by one in key order an earlier item's dependents start
-- before the run fails (and a later item's completion is then refused). So a run
-- of a flow with any step that fails the run on an unmet condition now applies its
-- items one by one when it has several in a batch. The test is conservative (the
-- flow, not the path from the item): a false positive only costs applying that
-- run's items one by one, and it costs one lookup per item on the hot path.

create or replace function flowlane._sequential_runs(p_classes flowlane._result_class[], p_enders flowlane._result_class[])
returns uuid[]
language sql stable
set search_path = ''
as $$
  select coalesce(array_agg(distinct e.run_id), '{}')
  from (
    select (x.task).run_id from unnest(p_enders) x
    union all
    select (c.task).run_id from unnest(p_classes) c
    where c.actionable and exists (
      select 1 from flowlane.steps s
      where s.flow_slug = (c.task).flow_slug
        and s.when_unmet = 'fail'
        and (s.required_input_pattern is not null or s.forbidden_input_pattern is not null))
  ) e
  where (select count(*) from unnest(p_classes) c
         where c.actionable and (c.task).run_id = e.run_id) > 1
$$;
