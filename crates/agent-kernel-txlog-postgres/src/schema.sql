-- The agent-kernel log on PostgreSQL, schema version 1: the tables of the SQLite log's
-- schema version 6 (same names, columns and checks; integers are BIGINT, bytes BYTEA), so
-- the records are written by the same statements (agent_kernel_txlog::sql), plus the meta
-- row that marks the database as a log and the owners' leases.

-- One row: what this database is. A database without it, holding tables, is not a log.
CREATE TABLE agent_kernel_meta (
    singleton          BIGINT PRIMARY KEY CHECK (singleton = 1),
    application        TEXT NOT NULL,
    schema_version     BIGINT NOT NULL
);

CREATE TABLE sagas (
    saga_id            TEXT PRIMARY KEY NOT NULL,
    name               TEXT,
    actor              TEXT,
    state              TEXT NOT NULL CHECK (state = 'Idle' OR state = 'Planning'
                           OR state = 'Acting' OR state = 'Validating' OR state = 'Compensating'
                           OR state = 'Done' OR state = 'FailedRolledBack'
                           OR state = 'FailedRollbackPartial' OR state = 'AwaitingApproval'
                           OR state = 'Undone'),
    owner_host         TEXT NOT NULL,
    owner_boot_id      TEXT NOT NULL,
    owner_pid          BIGINT NOT NULL,
    owner_start_ticks  BIGINT NOT NULL,
    n_steps            BIGINT NOT NULL CHECK (n_steps >= 0),
    created_at_ms      BIGINT NOT NULL,
    updated_at_ms      BIGINT NOT NULL,
    dry_run            BIGINT NOT NULL DEFAULT 0 CHECK (dry_run = 0 OR dry_run = 1)
);
CREATE INDEX sagas_unfinished ON sagas (created_at_ms, saga_id)
    WHERE state <> 'Done' AND state <> 'FailedRolledBack' AND state <> 'FailedRollbackPartial'
        AND state <> 'Undone';
CREATE INDEX sagas_by_created ON sagas (created_at_ms, saga_id);

CREATE TABLE saga_steps (
    saga_id            TEXT NOT NULL REFERENCES sagas (saga_id),
    step_seq           BIGINT NOT NULL CHECK (step_seq >= 0),
    tool_id            TEXT NOT NULL,
    tool_version       TEXT NOT NULL,
    effect             TEXT NOT NULL,
    idempotency_key    TEXT,
    args               TEXT NOT NULL,
    args_hash          TEXT NOT NULL,
    undo               TEXT NOT NULL,
    undo_blob          BYTEA,
    output             TEXT,
    status             TEXT NOT NULL CHECK (status = 'BEGIN' OR status = 'COMMIT'
                           OR status = 'FAIL' OR status = 'COMPENSATED'
                           OR status = 'COMPENSATION_FAILED'),
    error              TEXT,
    reused_from_saga   TEXT,
    reused_from_seq    BIGINT,
    compensation       TEXT,
    created_at_ms      BIGINT NOT NULL,
    updated_at_ms      BIGINT NOT NULL,
    PRIMARY KEY (saga_id, step_seq)
);

CREATE TABLE idempotency_keys (
    key                TEXT PRIMARY KEY NOT NULL,
    args_hash          TEXT NOT NULL,
    saga_id            TEXT NOT NULL,
    step_seq           BIGINT NOT NULL,
    FOREIGN KEY (saga_id, step_seq) REFERENCES saga_steps (saga_id, step_seq)
);
CREATE INDEX idempotency_keys_step ON idempotency_keys (saga_id, step_seq);

CREATE TABLE audit_log (
    seq                BIGINT PRIMARY KEY,
    at_ms              BIGINT NOT NULL,
    kind               TEXT NOT NULL,
    saga_id            TEXT,
    body               TEXT NOT NULL,
    prev_hash          TEXT NOT NULL,
    hash               TEXT NOT NULL,
    mac                TEXT
);

CREATE TABLE approvals (
    approval_id        TEXT PRIMARY KEY NOT NULL,
    saga_id            TEXT NOT NULL REFERENCES sagas (saga_id),
    step_seq           BIGINT NOT NULL CHECK (step_seq >= 0),
    tool_id            TEXT NOT NULL,
    args               TEXT NOT NULL,
    idempotency_key    TEXT,
    digest             TEXT NOT NULL,
    rest               TEXT,
    status             TEXT NOT NULL CHECK (status = 'pending' OR status = 'approved'
                           OR status = 'rejected' OR status = 'expired'
                           OR status = 'cancelled' OR status = 'consumed'),
    requested_at_ms    BIGINT NOT NULL,
    expires_at_ms      BIGINT NOT NULL,
    decided_at_ms      BIGINT,
    decided_by         TEXT,
    note               TEXT,
    decision_seq       BIGINT,
    operator_key_check TEXT,
    UNIQUE (saga_id, step_seq)
);
CREATE INDEX approvals_pending ON approvals (requested_at_ms, approval_id)
    WHERE status = 'pending';

CREATE TABLE dead_letters (
    letter_id          TEXT PRIMARY KEY NOT NULL,
    saga_id            TEXT NOT NULL REFERENCES sagas (saga_id),
    step_seq           BIGINT NOT NULL CHECK (step_seq >= 0),
    tool_id            TEXT NOT NULL,
    error              TEXT NOT NULL,
    attempts           BIGINT NOT NULL CHECK (attempts >= 1),
    first_failed_at_ms BIGINT NOT NULL,
    last_failed_at_ms  BIGINT NOT NULL,
    next_retry_at_ms   BIGINT NOT NULL,
    status             TEXT NOT NULL CHECK (status = 'open' OR status = 'retried'
                           OR status = 'resolved'),
    settled_at_ms      BIGINT,
    settled_by         TEXT,
    note               TEXT,
    UNIQUE (saga_id, step_seq)
);
CREATE INDEX dead_letters_open ON dead_letters (first_failed_at_ms, letter_id)
    WHERE status = 'open';

-- One row per process that holds sagas through the log: alive while `expires_at_ms` (by
-- the database's clock) is ahead. A lease that ran out is never renewed: its owner is dead
-- for good, its writes are refused, and its sagas are another's to recover.
CREATE TABLE leases (
    owner_host         TEXT NOT NULL,
    owner_boot_id      TEXT NOT NULL,
    owner_pid          BIGINT NOT NULL,
    owner_start_ticks  BIGINT NOT NULL,
    acquired_at_ms     BIGINT NOT NULL,
    expires_at_ms      BIGINT NOT NULL,
    PRIMARY KEY (owner_host, owner_boot_id, owner_pid, owner_start_ticks)
);
