-- The agent-kernel log on PostgreSQL, schema version 2: isolation (the tables of the SQLite
-- log's schema version 7). Applied after version 1's schema, to a new log or to a version 1
-- log when it is first opened by a build that knows version 2.

-- What each begun step declared: the resources it claimed and the keys that make a later
-- call of its tool a duplicate.
CREATE TABLE step_keys (
    saga_id            TEXT NOT NULL,
    step_seq           BIGINT NOT NULL CHECK (step_seq >= 0),
    kind               TEXT NOT NULL CHECK (kind = 'resource' OR kind = 'duplicate'),
    key                TEXT NOT NULL,
    PRIMARY KEY (saga_id, step_seq, kind, key),
    FOREIGN KEY (saga_id, step_seq) REFERENCES saga_steps (saga_id, step_seq)
);
CREATE INDEX step_keys_by_key ON step_keys (kind, key);

-- The locks unsettled sagas hold: one holder per resource. Claimed before the rest of the
-- BEGIN's batch (the saga's creation included), so the foreign key is checked at commit.
CREATE TABLE locks (
    resource           TEXT PRIMARY KEY NOT NULL,
    saga_id            TEXT NOT NULL REFERENCES sagas (saga_id) DEFERRABLE INITIALLY DEFERRED,
    step_seq           BIGINT NOT NULL CHECK (step_seq >= 0),
    claimed_at_ms      BIGINT NOT NULL
);
CREATE INDEX locks_by_saga ON locks (saga_id);

-- The audit records of refused claims, found by saga.
CREATE INDEX audit_log_conflicts ON audit_log (saga_id) WHERE kind = 'LockConflict';

-- The earlier step an approval request may duplicate (JSON), shown to whoever decides.
ALTER TABLE approvals ADD COLUMN duplicate_of TEXT;
