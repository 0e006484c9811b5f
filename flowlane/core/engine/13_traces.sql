-- Traces: a run remembers the W3C trace context it was started in, so that the spans of its
-- tasks (made by workers with OpenTelemetry installed) join the trace. The caller sets it
-- for the transaction before starting runs:
--   select set_config('flowlane.traceparent', '00-<trace id>-<span id>-<flags>', true);
-- (Client and `flowlane start` do this inside a trace); start_flow's signature stays as it is.

-- the transaction's trace context, checked; null when none is set
create function flowlane._trace_parent() returns text
language plpgsql stable
set search_path = ''
as $$
declare
  v_value text := nullif(current_setting('flowlane.traceparent', true), '');
begin
  if v_value is not null and v_value !~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$' then
    raise exception 'flowlane.traceparent must be a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>), got %',
      quote_literal(left(v_value, 100)) using errcode = '22023';
  end if;
  return v_value;
end;
$$;

-- the trace contexts of the given runs (those started inside a trace)
create function flowlane.trace_parents(run_ids uuid[])
returns table (run_id uuid, trace_parent text)
language sql stable
set search_path = ''
as $$
  select r.run_id, r.trace_parent from flowlane.runs r
  where r.run_id = any (run_ids) and r.trace_parent is not null
$$;
