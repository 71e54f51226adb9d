//! Rewriting a log as an older build would have left it, for tests of migrations.

use std::path::Path;

use agent_kernel_api::TxError;
use rusqlite::Connection;

use crate::schema::{APPLICATION_ID, MIGRATIONS, storage};

/// The columns of `saga_steps` up to schema version 7, in their order.
const STEP_COLUMNS_BEFORE_V8: &str = "saga_id, step_seq, tool_id, tool_version, effect,
    idempotency_key, args, args_hash, undo, undo_blob, output, status, error, reused_from_saga,
    reused_from_seq, compensation, created_at_ms, updated_at_ms";

/// Rewrites the closed log at `path` (checkpointed first) into schema version `version`,
/// with the rows it holds: exactly what this build's migrations up to `version` create, as
/// a log of that version written by an earlier build would look. Columns added since are
/// dropped; the head file is left alone. For tests of migrations and of verification; not
/// part of the supported interface.
///
/// # Errors
///
/// [`TxError::Storage`] when the log cannot be read or the copy written.
///
/// # Panics
///
/// When `version` is not an older schema version (1 to `SCHEMA_VERSION - 1`).
#[doc(hidden)]
pub fn downgrade_in_place(path: &Path, version: i64) -> Result<(), TxError> {
    let index = usize::try_from(version).expect("a positive version");
    assert!((1..MIGRATIONS.len()).contains(&index), "an older version");
    let conn = Connection::open(path).map_err(storage)?;
    conn.pragma_update(None, "wal_checkpoint", "TRUNCATE")
        .map_err(storage)?;
    drop(conn);
    let mut name = path.as_os_str().to_owned();
    name.push(".downgrading");
    let temp = std::path::PathBuf::from(name);
    let _ = std::fs::remove_file(&temp);
    {
        let mut conn = Connection::open(&temp).map_err(storage)?;
        conn.execute(
            "ATTACH DATABASE ?1 AS src",
            [path.to_str().expect("a UTF-8 path")],
        )
        .map_err(storage)?;
        let tx = conn.transaction().map_err(storage)?;
        for migration in &MIGRATIONS[..index] {
            tx.execute_batch(migration).map_err(storage)?;
        }
        let dry_run = if version >= 3 { ", dry_run" } else { "" };
        let step_columns = if version >= 8 {
            "*"
        } else {
            STEP_COLUMNS_BEFORE_V8
        };
        tx.execute_batch(&format!(
            "INSERT INTO main.sagas (saga_id, name, actor, state, owner_host, owner_boot_id,
                 owner_pid, owner_start_ticks, n_steps, created_at_ms, updated_at_ms{dry_run})
                 SELECT saga_id, name, actor, state, owner_host, owner_boot_id, owner_pid,
                 owner_start_ticks, n_steps, created_at_ms, updated_at_ms{dry_run} FROM src.sagas;
             INSERT INTO main.saga_steps SELECT {step_columns} FROM src.saga_steps;
             INSERT INTO main.idempotency_keys SELECT * FROM src.idempotency_keys;"
        ))
        .map_err(storage)?;
        if version >= 8 {
            tx.execute_batch(
                "INSERT INTO main.step_keys SELECT * FROM src.step_keys;
                 INSERT INTO main.locks SELECT * FROM src.locks;",
            )
            .map_err(storage)?;
        } else if version == 7 {
            // Version 7 kept a begun step's resources as rows of `step_keys`.
            tx.execute_batch(
                "INSERT INTO main.step_keys SELECT * FROM src.step_keys;
                 INSERT INTO main.step_keys (saga_id, step_seq, kind, key)
                     SELECT s.saga_id, s.step_seq, 'resource', r.value
                     FROM src.saga_steps s, json_each(s.resources) r
                     WHERE s.resources IS NOT NULL;
                 INSERT INTO main.locks SELECT * FROM src.locks;",
            )
            .map_err(storage)?;
        }
        if version >= 2 {
            tx.execute_batch("INSERT INTO main.audit_log SELECT * FROM src.audit_log;")
                .map_err(storage)?;
        }
        tx.pragma_update(None, "application_id", APPLICATION_ID)
            .map_err(storage)?;
        tx.pragma_update(None, "user_version", version)
            .map_err(storage)?;
        tx.commit().map_err(storage)?;
        conn.execute("DETACH DATABASE src", []).map_err(storage)?;
    }
    for suffix in ["-wal", "-shm"] {
        let mut journal = path.as_os_str().to_owned();
        journal.push(suffix);
        let _ = std::fs::remove_file(std::path::PathBuf::from(journal));
    }
    std::fs::rename(&temp, path)
        .map_err(|err| TxError::Storage(format!("cannot replace {}: {err}", path.display())))
}
