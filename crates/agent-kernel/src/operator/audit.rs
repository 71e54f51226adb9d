//! The audit chain: `audit verify`, `audit list`, `audit seal`, and the check every
//! compensating action makes first.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use agent_kernel_api::{AuditEvent, OperatorCommand, Owner, TxError};
use agent_kernel_core::KernelError;
use agent_kernel_txlog::{AuditHead, AuditQuery, AuditRecord, AuditReport, SqliteLog};

use super::off_thread;
use crate::AuditKey;

/// Checks the log's whole audit chain (`audit verify`): every record's hash, link and (with
/// `key`) MAC, the head file, and on SQLite the database's integrity. Reads only.
///
/// # Errors
///
/// [`KernelError::Log`] when the log cannot be read ([`TxError::NotALog`] and
/// [`TxError::SchemaTooNew`] for what is not a log of this build).
pub async fn verify(db: &Path, key: Option<AuditKey>) -> Result<AuditReport, KernelError> {
    let db: PathBuf = db.to_owned();
    let verified = off_thread("the audit check", move || verify_now(&db, key.as_ref())).await?;
    Ok(verified?)
}

/// The check itself, blocking.
fn verify_now(db: &Path, key: Option<&AuditKey>) -> Result<AuditReport, TxError> {
    #[cfg(feature = "postgres")]
    if let Some(url) = postgres_url(db) {
        return agent_kernel_txlog_postgres::verify(
            url,
            key,
            agent_kernel_txlog_postgres::default_head_file(url).as_deref(),
        );
    }
    agent_kernel_txlog::verify(db, key)
}

/// The URL `db` is when it names a PostgreSQL log.
#[cfg(feature = "postgres")]
fn postgres_url(db: &Path) -> Option<&str> {
    db.to_str().filter(|_| crate::is_postgres(db))
}

/// What [`vouch_for_log`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Vouched {
    /// The chain verifies: the undo records can be trusted.
    Intact,
    /// The log predates the audit chain: there is nothing to verify yet; opening it starts
    /// the chain.
    PredatesChain,
}

/// The check a compensating action (`recover`, `rollback`, `undo`, a dead letter's retry,
/// `prune`) makes before it opens the log for writing: compensation acts on undo records
/// (previous contents, paths), so the audit chain must vouch for them.
///
/// # Errors
///
/// [`KernelError::Tampered`] naming the first bad record (nothing may be undone);
/// [`KernelError::Log`] when the log cannot be checked ([`TxError::NotALog`] and
/// [`TxError::SchemaTooNew`] for what is not a log of this build).
pub async fn vouch_for_log(db: &Path, key: Option<AuditKey>) -> Result<Vouched, KernelError> {
    let checked = db.to_owned();
    let (verified, predates) = off_thread("the audit check", move || {
        let verified = verify_now(&checked, key.as_ref());
        // A log from before the audit chain has nothing to verify yet.
        let predates = verified.is_err()
            && !crate::is_postgres(&checked)
            && agent_kernel_txlog::schema_version(&checked)
                .is_ok_and(|version| version < agent_kernel_txlog::AUDIT_SCHEMA_VERSION);
        (verified, predates)
    })
    .await?;
    let report = match verified {
        Ok(report) => report,
        Err(error @ (TxError::NotALog { .. } | TxError::SchemaTooNew { .. })) => {
            return Err(KernelError::Log(error));
        }
        Err(_) if predates => return Ok(Vouched::PredatesChain),
        Err(error) => return Err(KernelError::Log(error)),
    };
    match report.first_bad {
        None => Ok(Vouched::Intact),
        Some(bad) => Err(KernelError::Tampered {
            seq: bad.seq,
            reason: bad.reason,
        }),
    }
}

/// The audit records `query` selects, newest first (`audit list`), from an SQLite file or
/// a PostgreSQL URL. Reads only, and checks nothing: [`verify`] says whether they can be
/// trusted.
///
/// # Errors
///
/// [`KernelError::Log`] when the log cannot be read, or a kind in `query` is unknown.
pub async fn audit_records(db: &Path, query: AuditQuery) -> Result<Vec<AuditRecord>, KernelError> {
    let db = db.to_owned();
    let records = off_thread("reading the audit records", move || {
        #[cfg(feature = "postgres")]
        if let Some(url) = postgres_url(&db) {
            return agent_kernel_txlog_postgres::audit_records(url, &query);
        }
        agent_kernel_txlog::audit_records(&db, &query)
    })
    .await?;
    Ok(records?)
}

/// Whether a PostgreSQL log is at `url`: its connection's current schema holds one (not
/// nothing), asked without opening the log, which would create one. Reads only.
///
/// # Errors
///
/// [`KernelError::Log`] when the server cannot be asked, or the schema holds something
/// other than a log.
#[cfg(feature = "postgres")]
pub async fn postgres_holds_log(url: &str) -> Result<bool, KernelError> {
    let url = url.to_owned();
    let holds = off_thread("looking for the log", move || {
        agent_kernel_txlog_postgres::holds_log(&url)
    })
    .await?;
    Ok(holds?)
}

/// The whole audit history of each saga of `saga_ids`, oldest first (chain order), from an
/// SQLite file or a PostgreSQL URL, for `replay` and `export`; a saga with no record is
/// absent from the map. Reads only, and checks nothing.
///
/// # Errors
///
/// [`KernelError::Log`] when the log cannot be read.
pub async fn saga_chains(
    db: &Path,
    saga_ids: BTreeSet<String>,
) -> Result<BTreeMap<String, Vec<AuditRecord>>, KernelError> {
    let db = db.to_owned();
    let chains = off_thread("reading the sagas' audit records", move || {
        #[cfg(feature = "postgres")]
        if let Some(url) = postgres_url(&db) {
            return agent_kernel_txlog_postgres::saga_chains(url, &saga_ids);
        }
        agent_kernel_txlog::saga_chains(&db, &saga_ids)
    })
    .await?;
    Ok(chains?)
}

/// Checks every record and table of the log at `db`, leaving its head file out: what
/// `audit seal` checks before it seals, for a log whose head file was lost or disagrees
/// (on PostgreSQL, this machine's head files of every log at the URL are left out).
/// Reads only.
///
/// # Errors
///
/// [`KernelError::Log`] when the log cannot be read.
pub async fn verify_ignoring_head_file(
    db: &Path,
    key: Option<AuditKey>,
) -> Result<AuditReport, KernelError> {
    let db = db.to_owned();
    let verified = off_thread("the audit check", move || {
        #[cfg(feature = "postgres")]
        if let Some(url) = postgres_url(&db) {
            return agent_kernel_txlog_postgres::verify(url, key.as_ref(), None);
        }
        agent_kernel_txlog::verify_ignoring_head_file(&db, key.as_ref())
    })
    .await?;
    Ok(verified?)
}

/// Seals `log` (`audit seal`) once [`verify_ignoring_head_file`] found it intact: records
/// the seal, by `by` (`uid`), as the chain's newest record, which the head file then names.
///
/// # Errors
///
/// [`KernelError::Log`] when the seal cannot be written.
pub async fn seal(log: &SqliteLog, by: Owner, uid: Option<u32>) -> Result<AuditHead, KernelError> {
    let head = log.seal(seal_record(by, uid)).await?;
    Ok(head)
}

/// The record `audit seal` appends: by `by` (`uid`).
fn seal_record(by: Owner, uid: Option<u32>) -> AuditEvent {
    AuditEvent::Operator(OperatorCommand {
        command: "audit seal".to_owned(),
        saga_id: None,
        options: Vec::new(),
        by,
        uid,
    })
}

/// Seals the PostgreSQL log at `url` (`audit seal`, feature `postgres`) once
/// [`verify_ignoring_head_file`] found it intact: records the seal, by `by` (`uid`), as the
/// chain's newest record, which this machine's head file for the log then names; its head
/// files of other logs once at the URL (a database recreated, tables dropped and made
/// again) are removed. Opens the log as `by`, a worker with the default lease.
///
/// # Errors
///
/// [`KernelError::Log`] when the log cannot be opened or the seal written.
#[cfg(feature = "postgres")]
pub async fn seal_postgres(
    url: &str,
    key: Option<AuditKey>,
    by: Owner,
    uid: Option<u32>,
) -> Result<AuditHead, KernelError> {
    use agent_kernel_txlog_postgres::{PostgresLog, Worker, default_head_file};
    let opened_url = url.to_owned();
    let worker = Worker {
        head_file: default_head_file(url),
        ..Worker::new(by.clone())
    };
    let log = off_thread("opening the log", move || {
        let options = agent_kernel_txlog::LogOptions {
            durability: agent_kernel_api::Durability::Full,
            clock: std::sync::Arc::new(agent_kernel_core::SystemClock),
        };
        PostgresLog::open(&opened_url, options, key, worker)
    })
    .await??;
    let sealed = log.seal(seal_record(by, uid)).await;
    log.close().await;
    Ok(sealed?)
}
