//! Which log a path names, and opening it: an SQLite file (feature `sqlite`) or a
//! PostgreSQL database's URL (feature `postgres`). Without the feature a backend needs,
//! naming its log is a setup error that says which feature to turn on.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agent_kernel_api::{Clock, Durability, Owner, TxLog};
use agent_kernel_core::KernelError;

/// The key whose MAC every audit record carries (feature `sqlite`).
#[cfg(feature = "sqlite")]
pub use agent_kernel_txlog::AuditKey;

/// Without a backend there is no audit key to give: the caller's log keeps its own.
#[cfg(not(feature = "sqlite"))]
#[derive(Debug, Clone)]
pub enum AuditKey {}

/// The shortest and longest lease a PostgreSQL worker may hold.
#[cfg(feature = "postgres")]
pub(crate) const LEASE_BOUNDS: (Duration, Duration) = (
    agent_kernel_txlog_postgres::LEASE_MIN,
    agent_kernel_txlog_postgres::LEASE_MAX,
);
#[cfg(not(feature = "postgres"))]
pub(crate) const LEASE_BOUNDS: (Duration, Duration) =
    (Duration::from_millis(400), Duration::from_secs(3600));

/// How a log is opened (a backend left out by its feature reads none of it).
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) struct Opening {
    pub(crate) durability: Durability,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) audit_key: Option<AuditKey>,
    /// This worker's lease on a PostgreSQL log; `None` for the default.
    pub(crate) lease: Option<Duration>,
    /// This process, the worker a PostgreSQL log leases to.
    pub(crate) owner: Owner,
}

/// Whether `db` is a PostgreSQL database's URL (`postgres://…`, `postgresql://…`) rather
/// than an SQLite file's path.
pub fn is_postgres(db: &Path) -> bool {
    db.to_str().is_some_and(|text| {
        let lower = text.get(..13).unwrap_or(text).to_ascii_lowercase();
        lower.starts_with("postgres://") || lower.starts_with("postgresql://")
    })
}

/// The files of the SQLite log at `db` that no program may open (none for PostgreSQL).
pub(crate) fn log_files(db: &Path) -> Vec<PathBuf> {
    #[cfg(feature = "sqlite")]
    if !is_postgres(db) {
        return agent_kernel_txlog::log_files(db);
    }
    let _ = db;
    Vec::new()
}

/// Opens (creating it when absent) the log `db` names.
pub(crate) fn open(db: &Path, opening: Opening) -> Result<Arc<dyn TxLog>, KernelError> {
    if is_postgres(db) {
        return open_postgres(db, opening);
    }
    open_sqlite(db, opening)
}

#[cfg(feature = "postgres")]
fn open_postgres(db: &Path, opening: Opening) -> Result<Arc<dyn TxLog>, KernelError> {
    use agent_kernel_txlog_postgres::{LEASE_DEFAULT, PostgresLog, Worker, default_head_file};
    let url = db.to_str().unwrap_or_default();
    let worker = Worker {
        owner: opening.owner,
        lease: opening.lease.unwrap_or(LEASE_DEFAULT),
        head_file: default_head_file(url),
    };
    let options = agent_kernel_txlog::LogOptions {
        durability: opening.durability,
        clock: opening.clock,
    };
    Ok(Arc::new(PostgresLog::open(
        url,
        options,
        opening.audit_key,
        worker,
    )?))
}

#[cfg(not(feature = "postgres"))]
fn open_postgres(_db: &Path, _opening: Opening) -> Result<Arc<dyn TxLog>, KernelError> {
    Err(KernelError::Setup(
        "the log is a PostgreSQL URL, and this program was built without the `postgres` feature of the agent-kernel crate".to_owned(),
    ))
}

#[cfg(feature = "sqlite")]
fn open_sqlite(db: &Path, opening: Opening) -> Result<Arc<dyn TxLog>, KernelError> {
    let options = agent_kernel_txlog::LogOptions {
        durability: opening.durability,
        clock: opening.clock,
    };
    Ok(Arc::new(
        agent_kernel_txlog::SqliteLog::open_with_audit_key(db, options, opening.audit_key)?,
    ))
}

#[cfg(not(feature = "sqlite"))]
fn open_sqlite(db: &Path, _opening: Opening) -> Result<Arc<dyn TxLog>, KernelError> {
    Err(KernelError::Setup(format!(
        "the log {} is an SQLite file, and this program was built without the `sqlite` feature of the agent-kernel crate (or give a log of your own with .log(log))",
        db.display()
    )))
}
