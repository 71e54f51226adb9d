//! Integration tests of the SQLite log: opening, refusing, writing, reading back.

mod approvals;
mod audit;
mod group;
mod open;
mod schema;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use agent_kernel_api::{Clock, Durability, TxLog};
pub(crate) use agent_kernel_log_contract::records::{begin, new_saga, owner};
use agent_kernel_txlog::{AuditKey, AuditReport, LogOptions, SqliteLog};

pub(crate) struct StepClock(AtomicI64);

impl Clock for StepClock {
    fn now_ms(&self) -> i64 {
        self.0.fetch_add(1, Ordering::Relaxed)
    }
}

/// [`agent_kernel_txlog::verify`], checked against the same check keeping one entry of each
/// replayed table in memory and the rest in its scratch database: both must say the same.
pub(crate) fn verify(
    path: &Path,
    key: Option<&AuditKey>,
) -> Result<AuditReport, agent_kernel_api::TxError> {
    let report = agent_kernel_txlog::verify(path, key);
    let bounded = agent_kernel_txlog::verify_bounded(path, key, 1);
    assert_eq!(
        format!("{report:?}"),
        format!("{bounded:?}"),
        "verify with one entry in memory differs"
    );
    report
}

pub(crate) fn open(path: &Path) -> Result<SqliteLog, agent_kernel_api::TxError> {
    SqliteLog::open(
        path,
        LogOptions {
            durability: Durability::Full,
            clock: Arc::new(StepClock(AtomicI64::new(1_000))),
        },
    )
}

/// A fresh SQLite log in a temporary folder, for the log contract's checks.
pub(crate) struct SqliteStore {
    dir: tempfile::TempDir,
}

impl SqliteStore {
    /// The log's file.
    pub(crate) fn path(&self) -> std::path::PathBuf {
        self.dir.path().join("log.db")
    }
}

impl agent_kernel_log_contract::LogStore for SqliteStore {
    fn open(&self) -> Arc<dyn TxLog> {
        Arc::new(open(&self.dir.path().join("log.db")).expect("opens"))
    }

    /// Every check leaves a log whose audit chain verifies.
    fn finished(&self) {
        let report = verify(&self.dir.path().join("log.db"), None).expect("verifies");
        assert!(report.is_intact(), "{report:#?}");
    }

    fn held_locks(&self) -> Vec<(String, String)> {
        let conn = rusqlite::Connection::open(self.dir.path().join("log.db")).expect("opens");
        let mut statement = conn
            .prepare("SELECT resource, saga_id FROM held_locks")
            .expect("prepares");
        statement
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
            .expect("queries")
            .collect::<Result<_, _>>()
            .expect("reads")
    }
}

pub(crate) fn fresh_store() -> Option<SqliteStore> {
    Some(SqliteStore {
        dir: tempfile::tempdir().expect("temp dir"),
    })
}

agent_kernel_log_contract::contract_tests!(crate::fresh_store());
