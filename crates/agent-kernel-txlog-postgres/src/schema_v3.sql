-- The agent-kernel log on PostgreSQL, schema version 3 (the SQLite log's schema version
-- 8): a begun step's resources (a JSON array of text, NULL when it declared none) kept in
-- its own row, which its BEGIN writes anyway, instead of one row of `step_keys` each;
-- `step_keys` keeps the duplicate keys, which are looked up by key. A saga's locks are
-- found by the resources its steps declared, so the index of locks by saga goes. Applied
-- after version 2's schema, to a new log or to an older log when it is first opened by a
-- build that knows version 3.

ALTER TABLE saga_steps ADD COLUMN resources TEXT;
UPDATE saga_steps s SET resources = (
    SELECT json_agg(k.key ORDER BY k.key)::text FROM step_keys k
    WHERE k.saga_id = s.saga_id AND k.step_seq = s.step_seq AND k.kind = 'resource')
WHERE EXISTS (SELECT 1 FROM step_keys k
    WHERE k.saga_id = s.saga_id AND k.step_seq = s.step_seq AND k.kind = 'resource');
DELETE FROM step_keys WHERE kind = 'resource';
DROP INDEX locks_by_saga;
