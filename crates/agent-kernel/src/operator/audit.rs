//! The audit chain: `audit verify`, and the check every compensating action makes first.

use std::path::{Path, PathBuf};

use agent_kernel_api::TxError;
use agent_kernel_core::KernelError;
use agent_kernel_txlog::AuditReport;

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
    if let Some(url) = db.to_str().filter(|_| crate::is_postgres(db)) {
        return agent_kernel_txlog_postgres::verify(
            url,
            key,
            agent_kernel_txlog_postgres::default_head_file(url).as_deref(),
        );
    }
    agent_kernel_txlog::verify(db, key)
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
