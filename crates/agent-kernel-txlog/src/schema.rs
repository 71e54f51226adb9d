//! Opening a log file: refusing what is not a log, creating and migrating the schema.

use std::fs;
use std::io::Read;
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use agent_kernel_api::{Durability, TxError};
use rusqlite::config::DbConfig;
use rusqlite::{Connection, MAIN_DB, OpenFlags, OptionalExtension, TransactionBehavior};

use crate::audit::{self, AuditKey};
use crate::create;
pub(crate) use crate::sql::storage;

/// `PRAGMA application_id` of every agent-kernel log: the bytes `AKLG`.
pub(crate) const APPLICATION_ID: i64 = 0x414B_4C47;

/// The schema version this build writes (`PRAGMA user_version`).
pub(crate) const SCHEMA_VERSION: i64 = 9;

/// The first schema version with the audit chain.
pub(crate) const AUDIT_SCHEMA_VERSION: i64 = 2;

/// How long a writer waits for another process's write lock before giving up.
pub(crate) const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// The first bytes of every SQLite 3 database file.
const SQLITE_HEADER: &[u8; 16] = b"SQLite format 3\0";

/// The migrations, in order: `MIGRATIONS[n]` takes the schema from version `n` to `n + 1`.
/// Since version 9 the view `held_locks` reads `sagas`, `saga_steps`, `dead_letters` and
/// `locks`: a migration that rebuilds one of them (create, copy, drop, rename) must drop
/// the view first and create it again after.
pub(crate) const MIGRATIONS: [&str; SCHEMA_VERSION as usize] = [
    r"
CREATE TABLE sagas (
    saga_id            TEXT PRIMARY KEY NOT NULL,
    name               TEXT,
    actor              TEXT,
    state              TEXT NOT NULL CHECK (state = 'Idle' OR state = 'Planning'
                           OR state = 'Acting' OR state = 'Validating' OR state = 'Compensating'
                           OR state = 'Done' OR state = 'FailedRolledBack'
                           OR state = 'FailedRollbackPartial'),
    owner_host         TEXT NOT NULL,
    owner_boot_id      TEXT NOT NULL,
    owner_pid          INTEGER NOT NULL,
    owner_start_ticks  INTEGER NOT NULL,
    n_steps            INTEGER NOT NULL CHECK (n_steps > 0),
    created_at_ms      INTEGER NOT NULL,
    updated_at_ms      INTEGER NOT NULL
) STRICT, WITHOUT ROWID;
-- Only unfinished sagas are indexed: recovery looks for them, and a saga leaves the index
-- once it is terminal, so the index stays as small as the work in flight.
-- Conditions are written as comparisons, not `IN (...)` lists: SQLite evaluates an IN list
-- through an ephemeral table on every row written, which made each state change 5x slower.
CREATE INDEX sagas_unfinished ON sagas (created_at_ms, saga_id)
    WHERE state <> 'Done' AND state <> 'FailedRolledBack' AND state <> 'FailedRollbackPartial';
CREATE INDEX sagas_by_created ON sagas (created_at_ms, saga_id);

CREATE TABLE saga_steps (
    saga_id            TEXT NOT NULL REFERENCES sagas (saga_id),
    step_seq           INTEGER NOT NULL CHECK (step_seq >= 0),
    tool_id            TEXT NOT NULL,
    tool_version       TEXT NOT NULL,
    effect             TEXT NOT NULL,
    idempotency_key    TEXT,
    args               TEXT NOT NULL,
    args_hash          TEXT NOT NULL,
    undo               TEXT NOT NULL,
    undo_blob          BLOB,
    output             TEXT,
    status             TEXT NOT NULL CHECK (status = 'BEGIN' OR status = 'COMMIT'
                           OR status = 'FAIL' OR status = 'COMPENSATED'
                           OR status = 'COMPENSATION_FAILED'),
    error              TEXT,
    reused_from_saga   TEXT,
    reused_from_seq    INTEGER,
    compensation       TEXT,
    created_at_ms      INTEGER NOT NULL,
    updated_at_ms      INTEGER NOT NULL,
    PRIMARY KEY (saga_id, step_seq)
) STRICT, WITHOUT ROWID;

CREATE TABLE idempotency_keys (
    key                TEXT PRIMARY KEY NOT NULL,
    args_hash          TEXT NOT NULL,
    saga_id            TEXT NOT NULL,
    step_seq           INTEGER NOT NULL,
    FOREIGN KEY (saga_id, step_seq) REFERENCES saga_steps (saga_id, step_seq)
) STRICT;
",
    // Version 2: the tamper-evident audit chain (see `audit.rs`). A version 1 log that
    // holds sagas also gets a `Genesis` record, written by `migrate`.
    r"
CREATE TABLE audit_log (
    seq                INTEGER PRIMARY KEY,
    at_ms              INTEGER NOT NULL,
    kind               TEXT NOT NULL,
    saga_id            TEXT,
    body               TEXT NOT NULL,
    prev_hash          TEXT NOT NULL,
    hash               TEXT NOT NULL,
    mac                TEXT
) STRICT;
",
    // Version 3: dry runs are recorded, marked as such (their steps are simulated).
    r"
ALTER TABLE sagas ADD COLUMN dry_run INTEGER NOT NULL DEFAULT 0
    CHECK (dry_run = 0 OR dry_run = 1);
",
    // Version 4: live sagas, whose steps arrive one at a time, are created with
    // `n_steps = 0`. SQLite cannot change a CHECK constraint in place, so the table is
    // rebuilt, as SQLite's documentation describes, with foreign keys off (`migrate` runs
    // with them off and checks them before it commits).
    r"
CREATE TABLE sagas_v4 (
    saga_id            TEXT PRIMARY KEY NOT NULL,
    name               TEXT,
    actor              TEXT,
    state              TEXT NOT NULL CHECK (state = 'Idle' OR state = 'Planning'
                           OR state = 'Acting' OR state = 'Validating' OR state = 'Compensating'
                           OR state = 'Done' OR state = 'FailedRolledBack'
                           OR state = 'FailedRollbackPartial'),
    owner_host         TEXT NOT NULL,
    owner_boot_id      TEXT NOT NULL,
    owner_pid          INTEGER NOT NULL,
    owner_start_ticks  INTEGER NOT NULL,
    n_steps            INTEGER NOT NULL CHECK (n_steps >= 0),
    created_at_ms      INTEGER NOT NULL,
    updated_at_ms      INTEGER NOT NULL,
    dry_run            INTEGER NOT NULL DEFAULT 0 CHECK (dry_run = 0 OR dry_run = 1)
) STRICT, WITHOUT ROWID;
INSERT INTO sagas_v4 (saga_id, name, actor, state, owner_host, owner_boot_id, owner_pid,
    owner_start_ticks, n_steps, created_at_ms, updated_at_ms, dry_run)
    SELECT saga_id, name, actor, state, owner_host, owner_boot_id, owner_pid,
        owner_start_ticks, n_steps, created_at_ms, updated_at_ms, dry_run FROM sagas;
DROP TABLE sagas;
ALTER TABLE sagas_v4 RENAME TO sagas;
CREATE INDEX sagas_unfinished ON sagas (created_at_ms, saga_id)
    WHERE state <> 'Done' AND state <> 'FailedRolledBack' AND state <> 'FailedRollbackPartial';
CREATE INDEX sagas_by_created ON sagas (created_at_ms, saga_id);
",
    // Version 5: approvals and dead letters (reference §10). `sagas` is rebuilt for the new
    // states `AwaitingApproval` (unfinished) and `Undone` (terminal), as in version 4.
    r"
CREATE TABLE sagas_v5 (
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
    owner_pid          INTEGER NOT NULL,
    owner_start_ticks  INTEGER NOT NULL,
    n_steps            INTEGER NOT NULL CHECK (n_steps >= 0),
    created_at_ms      INTEGER NOT NULL,
    updated_at_ms      INTEGER NOT NULL,
    dry_run            INTEGER NOT NULL DEFAULT 0 CHECK (dry_run = 0 OR dry_run = 1)
) STRICT, WITHOUT ROWID;
INSERT INTO sagas_v5 (saga_id, name, actor, state, owner_host, owner_boot_id, owner_pid,
    owner_start_ticks, n_steps, created_at_ms, updated_at_ms, dry_run)
    SELECT saga_id, name, actor, state, owner_host, owner_boot_id, owner_pid,
        owner_start_ticks, n_steps, created_at_ms, updated_at_ms, dry_run FROM sagas;
DROP TABLE sagas;
ALTER TABLE sagas_v5 RENAME TO sagas;
CREATE INDEX sagas_unfinished ON sagas (created_at_ms, saga_id)
    WHERE state <> 'Done' AND state <> 'FailedRolledBack' AND state <> 'FailedRollbackPartial'
        AND state <> 'Undone';
CREATE INDEX sagas_by_created ON sagas (created_at_ms, saga_id);

-- One request per step that needed an operator's approval. `args` is exactly what runs
-- once approved; `rest` the plan's later steps (JSON), NULL for a live saga;
-- `decision_seq` the audit record of its decision, which its use checks.
CREATE TABLE approvals (
    approval_id        TEXT PRIMARY KEY NOT NULL,
    saga_id            TEXT NOT NULL REFERENCES sagas (saga_id),
    step_seq           INTEGER NOT NULL CHECK (step_seq >= 0),
    tool_id            TEXT NOT NULL,
    args               TEXT NOT NULL,
    idempotency_key    TEXT,
    digest             TEXT NOT NULL,
    rest               TEXT,
    status             TEXT NOT NULL CHECK (status = 'pending' OR status = 'approved'
                           OR status = 'rejected' OR status = 'expired'
                           OR status = 'cancelled' OR status = 'consumed'),
    requested_at_ms    INTEGER NOT NULL,
    expires_at_ms      INTEGER NOT NULL,
    decided_at_ms      INTEGER,
    decided_by         TEXT,
    note               TEXT,
    decision_seq       INTEGER,
    operator_key_check TEXT,
    UNIQUE (saga_id, step_seq)
) STRICT, WITHOUT ROWID;
CREATE INDEX approvals_pending ON approvals (requested_at_ms, approval_id)
    WHERE status = 'pending';

-- One per compensation that still failed after its retries, or step of unknown outcome
-- left to an operator; it leaves the open list only by a retry that succeeds or a
-- resolution.
CREATE TABLE dead_letters (
    letter_id          TEXT PRIMARY KEY NOT NULL,
    saga_id            TEXT NOT NULL REFERENCES sagas (saga_id),
    step_seq           INTEGER NOT NULL CHECK (step_seq >= 0),
    tool_id            TEXT NOT NULL,
    error              TEXT NOT NULL,
    attempts           INTEGER NOT NULL CHECK (attempts >= 1),
    first_failed_at_ms INTEGER NOT NULL,
    last_failed_at_ms  INTEGER NOT NULL,
    next_retry_at_ms   INTEGER NOT NULL,
    status             TEXT NOT NULL CHECK (status = 'open' OR status = 'retried'
                           OR status = 'resolved'),
    settled_at_ms      INTEGER,
    settled_by         TEXT,
    note               TEXT,
    UNIQUE (saga_id, step_seq)
) STRICT, WITHOUT ROWID;
CREATE INDEX dead_letters_open ON dead_letters (first_failed_at_ms, letter_id)
    WHERE status = 'open';
",
    // Version 6: `prune` deletes a saga's keys, and its steps, which the keys reference:
    // both look keys up by step, which without this index is a scan of every key.
    r"
CREATE INDEX idempotency_keys_step ON idempotency_keys (saga_id, step_seq);
",
    // Version 7: isolation. What each begun step declared (the resources it claimed, the
    // keys that make a later call of its tool a duplicate); the locks unsettled sagas hold,
    // one holder per resource (claimed before the rest of the BEGIN's batch is applied,
    // the saga's creation included, so its foreign key is checked at commit); the audit
    // records of refused claims, found by saga; and the earlier step an approval request
    // may duplicate.
    r"
CREATE TABLE step_keys (
    saga_id            TEXT NOT NULL,
    step_seq           INTEGER NOT NULL CHECK (step_seq >= 0),
    kind               TEXT NOT NULL CHECK (kind = 'resource' OR kind = 'duplicate'),
    key                TEXT NOT NULL,
    PRIMARY KEY (saga_id, step_seq, kind, key),
    FOREIGN KEY (saga_id, step_seq) REFERENCES saga_steps (saga_id, step_seq)
) STRICT, WITHOUT ROWID;
CREATE INDEX step_keys_by_key ON step_keys (kind, key);
CREATE TABLE locks (
    resource           TEXT PRIMARY KEY NOT NULL,
    saga_id            TEXT NOT NULL REFERENCES sagas (saga_id) DEFERRABLE INITIALLY DEFERRED,
    step_seq           INTEGER NOT NULL CHECK (step_seq >= 0),
    claimed_at_ms      INTEGER NOT NULL
) STRICT, WITHOUT ROWID;
CREATE INDEX locks_by_saga ON locks (saga_id);
CREATE INDEX audit_log_conflicts ON audit_log (saga_id) WHERE kind = 'LockConflict';
ALTER TABLE approvals ADD COLUMN duplicate_of TEXT;
",
    // Version 8: a begun step's resources (a JSON array of strings, NULL when it declared
    // none) kept in its own row, where its BEGIN writes them anyway, instead of one row of
    // `step_keys` each (a second table and index per step was most of what the locks cost);
    // `step_keys` keeps the duplicate keys, which are looked up by key. A saga's locks are
    // found by the resources its steps declared, so the index of locks by saga goes (one
    // more page written per claim and per release).
    r"
ALTER TABLE saga_steps ADD COLUMN resources TEXT;
UPDATE saga_steps SET resources = (
    SELECT json_group_array(key) FROM (
        SELECT key FROM step_keys k
        WHERE k.saga_id = saga_steps.saga_id AND k.step_seq = saga_steps.step_seq
            AND k.kind = 'resource'
        ORDER BY key))
WHERE EXISTS (SELECT 1 FROM step_keys k
    WHERE k.saga_id = saga_steps.saga_id AND k.step_seq = saga_steps.step_seq
        AND k.kind = 'resource');
DELETE FROM step_keys WHERE kind = 'resource';
DROP INDEX locks_by_saga;
",
    // Version 9: the locks held, as a view. A claim no longer writes a row of `locks`: the
    // begun steps' rows of unsettled sagas are the locks, and `locks` keeps only what an
    // `undo` claims again. The view lists both for operators; the new version also makes
    // a build that still looked for claims in `locks` alone refuse the log as newer.
    // The sagas that hold are `claims::HOLDING_SAGAS`; the log contract checks that the
    // view lists what the log reports each saga holds.
    r"
CREATE VIEW held_locks (resource, saga_id, step_seq) AS
    SELECT r.value, s.saga_id, s.step_seq FROM saga_steps s, json_each(s.resources) r
    WHERE s.resources IS NOT NULL AND s.saga_id IN (SELECT saga_id FROM sagas
     WHERE state <> 'Done' AND state <> 'FailedRolledBack' AND state <> 'FailedRollbackPartial'
         AND state <> 'Undone'
     UNION SELECT d.saga_id FROM dead_letters d JOIN sagas g ON g.saga_id = d.saga_id
     WHERE d.status = 'open' AND g.state = 'FailedRollbackPartial')
    UNION SELECT resource, saga_id, step_seq FROM locks;
",
];

/// A connection to `path` with `flags`, waiting [`BUSY_TIMEOUT`] for other writers, and
/// opened defensively ([`harden`]).
fn connect(path: &Path, flags: OpenFlags) -> Result<Connection, TxError> {
    let conn = Connection::open_with_flags(path, flags)
        .map_err(|err| TxError::Storage(format!("cannot open {}: {err}", path.display())))?;
    harden(&conn)?;
    fix_query_plans(&conn)?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(storage)?;
    conn.set_prepared_statement_cache_capacity(LOG_STATEMENTS_MAX);
    Ok(conn)
}

/// A second connection to the log at `path`, for checkpoints alone, synced as
/// `durability` asks (SQLite syncs the WAL before a checkpoint and the file after it).
pub(crate) fn connect_for_checkpoints(
    path: &Path,
    durability: Durability,
) -> Result<Connection, TxError> {
    let conn = connect(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.pragma_update(None, "synchronous", synchronous_of(durability))
        .map_err(storage)?;
    Ok(conn)
}

/// SQLite's `synchronous` for `durability`.
fn synchronous_of(durability: Durability) -> &'static str {
    match durability {
        Durability::Full => "FULL",
        Durability::Normal => "NORMAL",
    }
}

/// How many prepared statements a log connection keeps: more than a step's, a saga's and
/// recovery's statements together (about 30 with the locks), so none is compiled again in
/// a steady state; rusqlite's default of 16 was below that once the locks came.
const LOG_STATEMENTS_MAX: usize = 64;

/// Turns on SQLite's query planner stability guarantee: a statement's plan is made once,
/// when it is prepared, and never again because of the values bound to it.
///
/// Without it, SQLite marks some statements to be prepared again whenever a parameter is
/// rebound (its planner looked at the bound value, as it does for `saga_id = ?1` on the
/// `WITHOUT ROWID` step table), and the statement cache clears a statement's bindings each
/// time it takes it back, which counts as rebinding: reading a saga's steps was compiled
/// anew on every read. The log's statements name their partial indexes' states as
/// literals, and it keeps no `ANALYZE` statistics, so a bound value can never improve a
/// plan here.
fn fix_query_plans(conn: &Connection) -> Result<(), TxError> {
    let on = conn
        .set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
        .map_err(storage)?;
    if !on {
        return Err(TxError::Storage(
            "sqlite refused the query planner stability guarantee".into(),
        ));
    }
    Ok(())
}

/// Makes a connection treat the file as data, never as code: defensive mode (no writable
/// schema, no direct edits of SQLite's own pages), an untrusted schema (no function called
/// from the schema unless harmless), and no triggers or views at all. The log's schema has
/// no trigger, and its one view (`held_locks`, for operators) is never read by the kernel,
/// so neither found in a file is ever run, even if it was added after the schema was
/// checked.
pub(crate) fn harden(conn: &Connection) -> Result<(), TxError> {
    for (setting, on) in [
        (DbConfig::SQLITE_DBCONFIG_DEFENSIVE, true),
        (DbConfig::SQLITE_DBCONFIG_TRUSTED_SCHEMA, false),
        (DbConfig::SQLITE_DBCONFIG_ENABLE_TRIGGER, false),
        (DbConfig::SQLITE_DBCONFIG_ENABLE_VIEW, false),
    ] {
        let now = conn.set_db_config(setting, on).map_err(storage)?;
        if now != on {
            return Err(TxError::Storage(format!(
                "sqlite refused the setting {setting:?}"
            )));
        }
    }
    Ok(())
}

/// One row of `sqlite_schema`: type, name, table, and the SQL text (none for SQLite's own
/// automatic indexes).
type SchemaObject = (String, String, String, Option<String>);

/// The schema objects of `conn`'s main database, sorted.
fn schema_objects(conn: &Connection) -> rusqlite::Result<Vec<SchemaObject>> {
    let mut statement = conn.prepare(
        "SELECT type, name, tbl_name, sql FROM main.sqlite_schema ORDER BY type, name, tbl_name",
    )?;
    statement
        .query_map([], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
        })?
        .collect()
}

/// An empty database in memory with the first `version` migrations applied.
fn build_in_memory(version: usize) -> rusqlite::Result<Connection> {
    let mut conn = Connection::open_in_memory()?;
    let tx = conn.transaction()?;
    for migration in &MIGRATIONS[..version] {
        tx.execute_batch(migration)?;
    }
    if version > 0 {
        tx.pragma_update(None, "application_id", APPLICATION_ID)?;
        tx.pragma_update(None, "user_version", version as i64)?;
    }
    tx.commit()?;
    Ok(conn)
}

/// The schema this build creates for each version, from 0 (nothing) to [`SCHEMA_VERSION`]:
/// the migrations replayed on an empty database in memory, once per process.
fn expected_schema(version: i64) -> &'static [SchemaObject] {
    static EXPECTED: OnceLock<Vec<Vec<SchemaObject>>> = OnceLock::new();
    let all = EXPECTED.get_or_init(|| {
        (0..=MIGRATIONS.len())
            .map(|version| {
                build_in_memory(version)
                    .and_then(|conn| schema_objects(&conn))
                    .expect("the migrations apply to an empty database in memory")
            })
            .collect()
    });
    let index = usize::try_from(version).expect("checked: 0 <= version <= SCHEMA_VERSION");
    &all[index]
}

/// Compares `conn`'s schema with the one this build creates for `version`; returns the
/// first difference, naming the object, or `None` when they are the same.
///
/// # Panics
///
/// When `version` is negative or above [`SCHEMA_VERSION`] (callers refuse those first).
pub(crate) fn schema_difference(
    conn: &Connection,
    version: i64,
) -> Result<Option<String>, TxError> {
    assert!((0..=SCHEMA_VERSION).contains(&version));
    let found = schema_objects(conn).map_err(storage)?;
    let expected = expected_schema(version);
    if found == expected {
        return Ok(None);
    }
    let describe = |(kind, name, table, _): &SchemaObject| {
        if kind == "table" || name == table {
            format!("{kind} `{name}`")
        } else {
            format!("{kind} `{name}` on table `{table}`")
        }
    };
    let difference = if let Some(extra) = found.iter().find(|object| {
        !expected
            .iter()
            .any(|known| (&known.0, &known.1) == (&object.0, &object.1))
    }) {
        format!(
            "it holds a {} that this build never creates",
            describe(extra)
        )
    } else if let Some(missing) = expected.iter().find(|known| {
        !found
            .iter()
            .any(|object| (&known.0, &known.1) == (&object.0, &object.1))
    }) {
        format!("its {} is missing", describe(missing))
    } else {
        let changed = found
            .iter()
            .find(|object| !expected.contains(object))
            .expect("same names, so some definition differs");
        format!(
            "its {} is not defined as this build defines it (a column or constraint was changed)",
            describe(changed)
        )
    };
    // A structure that is another version's: the `user_version` was changed.
    let other_version = (0..=SCHEMA_VERSION)
        .filter(|other| *other != version)
        .find(|other| found == expected_schema(*other));
    Ok(Some(match other_version {
        Some(other) => format!(
            "its user_version says schema version {version}, but its structure is that of version {other} ({difference})"
        ),
        None => format!("compared with schema version {version}, {difference}"),
    }))
}

/// The schema version (1 or above) whose structure `conn`'s schema is exactly, if any.
fn structure_version(conn: &Connection) -> rusqlite::Result<Option<i64>> {
    let found = schema_objects(conn)?;
    Ok((1..=SCHEMA_VERSION).find(|version| found == expected_schema(*version)))
}

/// The first problem `PRAGMA integrity_check` finds (pages, records, and every index entry
/// against its table), or `None` when it answers `ok`.
pub(crate) fn integrity_problem(conn: &Connection) -> Result<Option<String>, TxError> {
    let answer: String = conn
        .query_row("PRAGMA main.integrity_check(1)", [], |row| row.get(0))
        .map_err(storage)?;
    Ok((answer != "ok").then_some(answer))
}

fn tampered(path: &Path, reason: String) -> TxError {
    TxError::Tampered {
        path: path.display().to_string(),
        reason,
    }
}

/// Bytes 18 and 19 of the SQLite header: the file format's write and read versions, 2 for
/// a database in WAL mode.
const HEADER_FORMAT_VERSIONS: std::ops::Range<usize> = 18..20;

/// The bytes of a new, complete, empty log: every migration applied in memory, and the
/// header marked for WAL mode, so that no open ever switches it with a rollback journal
/// (which a kill could leave hot, for a read-only check to stumble on).
fn fresh_image() -> Result<Vec<u8>, TxError> {
    let mut conn = build_in_memory(MIGRATIONS.len()).map_err(storage)?;
    let mut image = conn.serialize(MAIN_DB).map_err(storage)?.to_vec();
    assert!(
        image.starts_with(SQLITE_HEADER),
        "sqlite serialized a database"
    );
    image[HEADER_FORMAT_VERSIONS].fill(2);
    Ok(image)
}

/// Refuses to start a new log where a head file says one was: its newest records were
/// deleted along with the database (or the file emptied). Checked again after reading the
/// head file, since another process may have created the log and moved its head meanwhile.
fn refuse_lost_log(path: &Path) -> Result<(), TxError> {
    let Ok(Some(head)) = crate::head::read(path) else {
        return Ok(());
    };
    if head.seq == 0 || check_header(path)? {
        return Ok(());
    }
    Err(tampered(
        path,
        format!(
            "there is no log here, but its head file {} names record {}: the log was deleted or emptied; put it back (with its head file), or remove the head file to start a new log",
            crate::head::head_path(path).display(),
            head.seq
        ),
    ))
}

/// Whether the first page of the file at `path`, read directly, carries the log's
/// `application_id` (bytes 68 to 71 of the SQLite header).
fn header_marks_a_log(path: &Path) -> bool {
    let mut header = [0_u8; 72];
    fs::File::open(path)
        .and_then(|mut file| file.read_exact(&mut header))
        .is_ok_and(|()| header[68..72] == APPLICATION_ID.to_be_bytes()[4..])
}

/// Refuses a log written by a newer build.
fn check_not_newer(path: &Path, version: i64) -> Result<(), TxError> {
    if version > SCHEMA_VERSION {
        return Err(TxError::SchemaTooNew {
            path: path.display().to_string(),
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    Ok(())
}

fn not_a_log(path: &Path, reason: impl Into<String>) -> TxError {
    TxError::NotALog {
        path: path.display().to_string(),
        reason: reason.into(),
    }
}

/// Refuses journal files (`-wal`, `-shm`) beside `path` that are not plain files of their
/// own: SQLite would write through a hard link (or a planted special file) to whatever it
/// leads to.
fn check_journal_files(path: &Path) -> Result<(), TxError> {
    use std::os::unix::fs::MetadataExt;
    for suffix in ["-wal", "-shm"] {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        let journal = std::path::PathBuf::from(name);
        match fs::symlink_metadata(&journal) {
            Ok(metadata) if !metadata.is_file() || metadata.nlink() > 1 => {
                return Err(tampered(
                    path,
                    format!(
                        "its journal file {} is not a plain file of its own (a link, or a special file)",
                        journal.display()
                    ),
                ));
            }
            Ok(_) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => {
                return Err(TxError::Storage(format!("{}: {err}", journal.display())));
            }
        }
    }
    Ok(())
}

/// Refuses a file that exists but does not start like an SQLite database, before SQLite
/// is allowed anywhere near it.
fn check_header(path: &Path) -> Result<bool, TxError> {
    let metadata = match fs::metadata(path) {
        Ok(metadata) => metadata,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(err) => return Err(TxError::Storage(format!("{}: {err}", path.display()))),
    };
    if !metadata.is_file() {
        return Err(not_a_log(path, "it is not a regular file"));
    }
    if metadata.len() == 0 {
        return Ok(false);
    }
    let mut header = [0_u8; 16];
    let mut file = fs::File::open(path)
        .map_err(|err| TxError::Storage(format!("{}: {err}", path.display())))?;
    let n_read = file
        .read(&mut header)
        .map_err(|err| TxError::Storage(format!("{}: {err}", path.display())))?;
    if n_read < header.len() || &header != SQLITE_HEADER {
        return Err(not_a_log(path, "it is not an SQLite database"));
    }
    Ok(true)
}

/// Opens (creating if absent or empty) the log at `path`, already resolved by
/// [`create::resolve_db_path`], checks it and brings its schema up to date.
/// Returns the connection and whether this open started the audit chain (a new log, or one
/// migrated from before the chain).
///
/// A new log is created whole, private to its owner (SQLite gives its `-wal` and `-shm`
/// files the same permissions): undo records hold files' previous bytes.
///
/// A migration that starts the audit chain of a log holding sagas writes a `Genesis`
/// record stamped `now_ms()` (called only then) and MACed with `audit_key`.
pub(crate) fn open(
    path: &Path,
    durability: Durability,
    audit_key: Option<&AuditKey>,
    now_ms: &dyn Fn() -> i64,
) -> Result<(Connection, bool), TxError> {
    // Refuse what is not a regular file or not an SQLite database before anything else.
    if !check_header(path)? {
        refuse_lost_log(path)?;
    }
    check_journal_files(path)?;
    let created = create::ensure_log_file(path, &fresh_image)?;
    if !check_header(path)? {
        return Err(TxError::Storage(format!(
            "{} was emptied while it was being opened",
            path.display()
        )));
    }
    // Never SQLITE_OPEN_CREATE: the file exists now, and SQLite must not make another.
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let mut conn = connect(path, flags)?;
    if conn.is_readonly(MAIN_DB).map_err(storage)? {
        return Err(TxError::Storage(format!(
            "{} cannot be written (its permissions, or a read-only file system); nothing was done",
            path.display()
        )));
    }

    // Identify the file before changing anything in it (even the journal mode).
    let marked = check_identity(&conn, path)?;

    let journal_mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "wal", |row| row.get(0))
        .map_err(storage)?;
    if !journal_mode.eq_ignore_ascii_case("wal") {
        return Err(TxError::Storage(format!(
            "{} cannot use write-ahead logging (journal_mode is {journal_mode})",
            path.display()
        )));
    }
    conn.pragma_update(None, "synchronous", synchronous_of(durability))
        .map_err(storage)?;
    // Migrations rebuild tables, which foreign keys would stand in the way of (and the
    // pragma cannot change inside a transaction): off while migrating, checked at its end.
    conn.pragma_update(None, "foreign_keys", "OFF")
        .map_err(storage)?;
    let started_chain = migrate(&mut conn, path, marked, audit_key, now_ms)?;
    conn.pragma_update(None, "foreign_keys", "ON")
        .map_err(storage)?;
    Ok((conn, created || started_chain))
}

/// Refuses an SQLite database that belongs to another application. Returns whether the
/// file is marked as a log (an empty database is not, yet).
fn check_identity(conn: &Connection, path: &Path) -> Result<bool, TxError> {
    // The file's own first page, read directly, says whether a log was ever there: then
    // anything SQLite cannot make of it is damage (exit 3 for the CLI), not another file.
    let header_says_log = header_marks_a_log(path);
    let unreadable = |err: rusqlite::Error| {
        if header_says_log {
            damaged(path, &format!("sqlite cannot read it ({err})"))
        } else {
            not_a_log(path, format!("sqlite cannot read it ({err})"))
        }
    };
    let application_id: i64 = conn
        .pragma_query_value(None, "application_id", |row| row.get(0))
        .map_err(unreadable)?;
    if application_id == APPLICATION_ID {
        return Ok(true);
    }
    let n_tables: i64 = conn
        .query_row("SELECT count(*) FROM sqlite_schema", [], |row| row.get(0))
        .map_err(unreadable)?;
    if header_says_log {
        // SQLite sees no log where the file's own first page says one was: it lost its
        // pages (truncated), and must not be taken for a new log or another file.
        return Err(damaged(
            path,
            "its header marks it as a log, but SQLite finds no log in it (was it truncated?)",
        ));
    }
    if n_tables != 0
        && let Some(version) = structure_version(conn).map_err(storage)?
    {
        // Exactly a log's structure under another `application_id`: the mark was changed.
        return Err(tampered(
            path,
            format!(
                "its structure is that of log schema version {version}, but its application_id is {application_id:#x}, not the log's"
            ),
        ));
    }
    if application_id != 0 || n_tables != 0 {
        return Err(not_a_log(
            path,
            format!(
                "it is an SQLite database of another application (application_id {application_id:#x}, {n_tables} schema objects)"
            ),
        ));
    }
    Ok(false)
}

/// A log that cannot be read as one: [`TxError::Storage`], never taken for something else.
fn damaged(path: &Path, why: &str) -> TxError {
    TxError::Storage(format!("the log {} is damaged: {why}", path.display()))
}

/// Opens an existing log read-only, without migrating it or changing its journal mode,
/// after the same checks as [`open`]; returns the connection and the schema version.
pub(crate) fn open_read_only(path: &Path) -> Result<(Connection, i64), TxError> {
    if !check_header(path)? {
        return Err(TxError::Storage(format!(
            "no log at {} (the file does not exist or is empty)",
            path.display()
        )));
    }
    check_journal_files(path)?;
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = connect(path, flags)?;
    if !check_identity(&conn, path)? {
        return Err(not_a_log(path, "it is an empty SQLite database"));
    }
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .map_err(storage)?;
    check_not_newer(path, version)?;
    if version < 0 {
        return Err(not_a_log(path, format!("its schema version is {version}")));
    }
    // A marked log at version 0: its schema check (against no objects) tells the rest.
    Ok((conn, version))
}

/// [`open_read_only`], refusing a log whose schema is not exactly this build's for its
/// version ([`TxError::Tampered`]).
pub(crate) fn open_read_only_checked(path: &Path) -> Result<(Connection, i64), TxError> {
    let (conn, version) = open_read_only(path)?;
    if let Some(reason) = schema_difference(&conn, version)? {
        return Err(tampered(path, reason));
    }
    Ok((conn, version))
}

/// Returns whether the migration started the audit chain.
///
/// `marked` says whether the file carries the log's `application_id`; an unmarked one is an
/// empty SQLite database, made a log here.
fn migrate(
    conn: &mut Connection,
    path: &Path,
    marked: bool,
    audit_key: Option<&AuditKey>,
    now_ms: &dyn Fn() -> i64,
) -> Result<bool, TxError> {
    // An immediate transaction serializes concurrent first opens of a new file.
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(storage)?;
    let version: i64 = tx
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .map_err(storage)?;
    check_not_newer(path, version)?;
    if version < 0 {
        return Err(not_a_log(path, format!("its schema version is {version}")));
    }
    // The structure must be exactly what this build created at that version; anything
    // else (a trigger, a view, an index, a column, a table) was put there by someone else.
    if (marked || version > 0)
        && let Some(reason) = schema_difference(&tx, version)?
    {
        return Err(tampered(path, reason));
    }
    for (from_version, migration) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        tx.execute_batch(migration).map_err(|err| {
            TxError::Storage(format!(
                "migrating the log schema from version {from_version}: {err}"
            ))
        })?;
    }
    // A log created before the audit chain may hold sagas: the chain starts with a record
    // of what they are now. A new log (version 0) holds none.
    if (1..AUDIT_SCHEMA_VERSION).contains(&version) {
        audit::write_genesis(&tx, version, audit_key, now_ms)?;
    }
    if version < SCHEMA_VERSION {
        tx.pragma_update(None, "application_id", APPLICATION_ID)
            .map_err(storage)?;
        tx.pragma_update(None, "user_version", SCHEMA_VERSION)
            .map_err(storage)?;
    }
    if let Some(reason) = schema_difference(&tx, SCHEMA_VERSION)? {
        return Err(TxError::Corrupt(format!(
            "after migrating {}: {reason}",
            path.display()
        )));
    }
    if version < SCHEMA_VERSION {
        let dangling: Option<String> = tx
            .query_row(
                "SELECT \"table\" FROM pragma_foreign_key_check",
                [],
                |row| row.get(0),
            )
            .optional()
            .map_err(storage)?;
        if let Some(table) = dangling {
            return Err(TxError::Corrupt(format!(
                "after migrating {}: a row of `{table}` refers to a row that does not exist",
                path.display()
            )));
        }
    }
    tx.commit().map_err(storage)?;
    Ok(version < AUDIT_SCHEMA_VERSION)
}
