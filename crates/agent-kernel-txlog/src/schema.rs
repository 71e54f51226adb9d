//! Opening a log file: refusing what is not a log, creating and migrating the schema.

use std::fs;
use std::io::Read;
use std::path::Path;
use std::time::Duration;

use agent_kernel_api::{Durability, TxError};
use rusqlite::{Connection, OpenFlags, TransactionBehavior};

use crate::audit::{self, AuditKey};

/// `PRAGMA application_id` of every agent-kernel log: the bytes `AKLG`.
pub(crate) const APPLICATION_ID: i64 = 0x414B_4C47;

/// The schema version this build writes (`PRAGMA user_version`).
pub(crate) const SCHEMA_VERSION: i64 = 3;

/// The first schema version with the audit chain.
pub(crate) const AUDIT_SCHEMA_VERSION: i64 = 2;

/// How long a writer waits for another process's write lock before giving up.
pub(crate) const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// The first bytes of every SQLite 3 database file.
const SQLITE_HEADER: &[u8; 16] = b"SQLite format 3\0";

/// The migrations, in order: `MIGRATIONS[n]` takes the schema from version `n` to `n + 1`.
const MIGRATIONS: [&str; SCHEMA_VERSION as usize] = [
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
];

/// An SQLite error as the log reports it.
pub(crate) fn storage(err: rusqlite::Error) -> TxError {
    TxError::Storage(err.to_string())
}

/// A connection to `path` with `flags`, waiting [`BUSY_TIMEOUT`] for other writers.
fn connect(path: &Path, flags: OpenFlags) -> Result<Connection, TxError> {
    let conn = Connection::open_with_flags(path, flags)
        .map_err(|err| TxError::Storage(format!("cannot open {}: {err}", path.display())))?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(storage)?;
    Ok(conn)
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

/// Creates a missing log file readable and writable by its owner only: undo records hold
/// files' previous bytes. SQLite gives its `-wal` and `-shm` files the same permissions.
fn create_private(path: &Path) -> Result<(), TxError> {
    use std::os::unix::fs::OpenOptionsExt;
    match fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => Ok(()),
        // An empty file another process just created, or one that was already there.
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(err) => Err(TxError::Storage(format!(
            "cannot create {}: {err}",
            path.display()
        ))),
    }
}

/// Opens (creating if absent) the log at `path`, checks it and brings its schema up to date.
/// Returns the connection and whether this open started the audit chain (a new log, or one
/// migrated from before the chain).
///
/// A migration that starts the audit chain of a log holding sagas writes a `Genesis`
/// record stamped `now_ms()` (called only then) and MACed with `audit_key`.
pub(crate) fn open(
    path: &Path,
    durability: Durability,
    audit_key: Option<&AuditKey>,
    now_ms: &dyn Fn() -> i64,
) -> Result<(Connection, bool), TxError> {
    let existed = check_header(path)?;
    if !existed {
        create_private(path)?;
    }
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let mut conn = connect(path, flags)?;

    // Identify the file before changing anything in it (even the journal mode).
    if existed {
        check_identity(&conn, path)?;
    }

    let journal_mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "wal", |row| row.get(0))
        .map_err(storage)?;
    if !journal_mode.eq_ignore_ascii_case("wal") {
        return Err(TxError::Storage(format!(
            "{} cannot use write-ahead logging (journal_mode is {journal_mode})",
            path.display()
        )));
    }
    let synchronous = match durability {
        Durability::Full => "FULL",
        Durability::Normal => "NORMAL",
    };
    conn.pragma_update(None, "synchronous", synchronous)
        .map_err(storage)?;
    conn.pragma_update(None, "foreign_keys", "ON")
        .map_err(storage)?;

    let started_chain = migrate(&mut conn, path, audit_key, now_ms)?;
    Ok((conn, started_chain))
}

/// Refuses an SQLite database that belongs to another application. Returns whether the
/// file is marked as a log (an empty database is not, yet).
fn check_identity(conn: &Connection, path: &Path) -> Result<bool, TxError> {
    let application_id: i64 = conn
        .pragma_query_value(None, "application_id", |row| row.get(0))
        .map_err(|err| not_a_log(path, format!("sqlite cannot read it ({err})")))?;
    if application_id == APPLICATION_ID {
        return Ok(true);
    }
    let n_tables: i64 = conn
        .query_row("SELECT count(*) FROM sqlite_schema", [], |row| row.get(0))
        .map_err(|err| not_a_log(path, format!("sqlite cannot read it ({err})")))?;
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

/// Opens an existing log read-only, without migrating it or changing its journal mode,
/// after the same checks as [`open`]; returns the connection and the schema version.
pub(crate) fn open_read_only(path: &Path) -> Result<(Connection, i64), TxError> {
    if !check_header(path)? {
        return Err(TxError::Storage(format!(
            "no log at {} (the file does not exist or is empty)",
            path.display()
        )));
    }
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = connect(path, flags)?;
    if !check_identity(&conn, path)? {
        return Err(not_a_log(path, "it is an empty SQLite database"));
    }
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .map_err(storage)?;
    check_not_newer(path, version)?;
    if version < 1 {
        return Err(not_a_log(path, format!("its schema version is {version}")));
    }
    Ok((conn, version))
}

/// Returns whether the migration started the audit chain.
fn migrate(
    conn: &mut Connection,
    path: &Path,
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
    check_tables(&tx, path)?;
    tx.commit().map_err(storage)?;
    Ok(version < AUDIT_SCHEMA_VERSION)
}

/// Checks that the tables this build relies on are there, with the columns it reads.
fn check_tables(conn: &Connection, path: &Path) -> Result<(), TxError> {
    let expected: [(&str, &[&str]); 4] = [
        (
            "sagas",
            &[
                "saga_id",
                "state",
                "owner_pid",
                "owner_start_ticks",
                "n_steps",
                "dry_run",
            ],
        ),
        (
            "saga_steps",
            &["saga_id", "step_seq", "tool_id", "args", "undo", "status"],
        ),
        (
            "idempotency_keys",
            &["key", "args_hash", "saga_id", "step_seq"],
        ),
        (
            "audit_log",
            &[
                "seq",
                "at_ms",
                "kind",
                "saga_id",
                "body",
                "prev_hash",
                "hash",
                "mac",
            ],
        ),
    ];
    for (table, columns) in expected {
        let mut statement = conn
            .prepare(&format!("SELECT name FROM pragma_table_info('{table}')"))
            .map_err(storage)?;
        let found: Vec<String> = statement
            .query_map([], |row| row.get(0))
            .map_err(storage)?
            .collect::<Result<_, _>>()
            .map_err(storage)?;
        for column in columns {
            if !found.iter().any(|name| name == column) {
                return Err(not_a_log(
                    path,
                    format!("table `{table}` lacks column `{column}`"),
                ));
            }
        }
    }
    Ok(())
}
