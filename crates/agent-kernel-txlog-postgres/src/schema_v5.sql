-- The agent-kernel log on PostgreSQL, schema version 5 (the SQLite log's schema version
-- 9): the locks held, as a view. A claim no longer writes a row of `locks`: the begun
-- steps' rows of unsettled sagas are the locks, and `locks` keeps only what an `undo`
-- claims again. The view lists both for operators; the new version also makes a build that
-- still looked for claims in `locks` alone refuse the log as newer. Applied after version
-- 4's schema, to a new log or to an older log when it is first opened by a build that
-- knows version 5.

CREATE VIEW held_locks (resource, saga_id, step_seq) AS
    SELECT r.resource, s.saga_id, s.step_seq
    FROM saga_steps s CROSS JOIN LATERAL json_array_elements_text(s.resources::json) AS r (resource)
    WHERE s.resources IS NOT NULL AND s.saga_id IN (SELECT saga_id FROM sagas
     WHERE state <> 'Done' AND state <> 'FailedRolledBack' AND state <> 'FailedRollbackPartial'
         AND state <> 'Undone'
     UNION SELECT d.saga_id FROM dead_letters d JOIN sagas g ON g.saga_id = d.saga_id
     WHERE d.status = 'open' AND g.state = 'FailedRollbackPartial')
    UNION SELECT resource, saga_id, step_seq FROM locks;
