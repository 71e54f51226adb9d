//! The operator's actions, as library calls: what the command line's `approvals`,
//! `approve`, `reject`, `undo`, `dlq`, `recover`, `prune`, `audit verify`, `audit list`,
//! `audit seal` and `log` do,
//! each a function with a typed request and a typed report, so that the command line, a
//! web console and the Python package share one implementation.
//!
//! The functions act on a [`Kernel`] built by [`KernelBuilder`](crate::KernelBuilder):
//! a kernel built [`for_compensation`](crate::KernelBuilder::for_compensation) for
//! the actions that compensate (`undo`, a dead letter's retry, `recover`), after
//! [`vouch_for_log`] found the audit chain intact, and under an [`OperatorLock`] where two
//! such actions must not overlap. Who acts is recorded from the kernel's operator uid
//! ([`operator_name`]).

mod approvals;
#[cfg(feature = "sqlite")]
mod audit;
mod dead_letters;
mod lock;
mod recovery;

use agent_kernel_api::{SagaId, SagaListing, SagaQuery, SagaRecord, SagaSummary, TxError, TxLog};
use agent_kernel_core::{
    Kernel, KernelError, Observer, PruneReport, SagaReport, UndoPreview, UndoRequest,
};

pub use approvals::{ApprovalView, Decision, LaterStep, approval, decide, pending_approvals};
#[cfg(feature = "sqlite")]
pub use audit::{
    Vouched, audit_records, saga_chains, seal, verify, verify_ignoring_head_file, vouch_for_log,
};
#[cfg(all(feature = "sqlite", feature = "postgres"))]
pub use audit::{postgres_holds_log, seal_postgres};
pub use dead_letters::{
    DueRetries, NotRetried, RetryRequest, dead_letters, resolve_dead_letter, retry_dead_letter,
    retry_due,
};
pub use lock::{OPERATOR_LOCK_WAIT, OperatorLock};
pub use recovery::{RECOVER_WAIT_MAX, recover, recover_waiting, rollback};

/// Who runs this process, as decisions and retries record it: `alice (uid 1000)`, or
/// `uid 1000` when `/etc/passwd` does not name the uid; `None` without a uid. It reads
/// `/etc/passwd`, so async code calls it off the runtime's threads.
pub fn operator_name(uid: Option<u32>) -> Option<String> {
    let uid = uid?;
    let name = std::fs::read_to_string("/etc/passwd")
        .ok()
        .and_then(|passwd| {
            passwd.lines().find_map(|line| {
                let mut fields = line.split(':');
                let name = fields.next()?;
                let found: u32 = fields.nth(1)?.parse().ok()?;
                (found == uid && !name.is_empty()).then(|| name.to_owned())
            })
        });
    Some(match name {
        Some(name) => format!("{name} (uid {uid})"),
        None => format!("uid {uid}"),
    })
}

/// What [`undo`] would do to a `Done` saga, step by step, without doing anything:
/// whether each step can be undone, when its window closes, and whether what it left has
/// changed since.
///
/// # Errors
///
/// [`KernelError::SagaNotFound`]; [`KernelError::Log`].
pub async fn undo_preview(kernel: &Kernel, saga_id: &SagaId) -> Result<UndoPreview, KernelError> {
    kernel.undo_preview(saga_id).await
}

/// Undoes a `Done` saga (reference §10): every step compensated, last first; nothing when a
/// step cannot be (see [`undo_preview`]).
///
/// # Errors
///
/// As [`Kernel::undo`].
pub async fn undo(
    kernel: &Kernel,
    saga_id: &SagaId,
    request: &UndoRequest,
    observer: &dyn Observer,
) -> Result<SagaReport, KernelError> {
    kernel.undo(saga_id, request, observer).await
}

/// Removes the settled sagas last changed before `older_than_ms` ago (`prune --before`).
///
/// # Errors
///
/// As [`Kernel::prune`].
pub async fn prune(kernel: &Kernel, older_than_ms: u64) -> Result<PruneReport, KernelError> {
    kernel.prune(older_than_ms).await
}

/// The most recent sagas of `log`, newest first, at most `limit` (`log`; a kernel's is
/// [`Kernel::log`]).
///
/// # Errors
///
/// [`KernelError::Log`].
pub async fn sagas(log: &dyn TxLog, limit: u32) -> Result<Vec<SagaSummary>, KernelError> {
    Ok(log.sagas(limit).await?)
}

/// A page of the saga list, newest first, each saga with the steps it began (`log`, the
/// console's list): the sagas `query` selects.
///
/// # Errors
///
/// [`KernelError::Log`].
pub async fn saga_page(
    log: &dyn TxLog,
    query: &SagaQuery,
) -> Result<Vec<SagaListing>, KernelError> {
    Ok(log.saga_page(query).await?)
}

/// One saga of `log` with its steps (`log --saga ID`).
///
/// # Errors
///
/// [`KernelError::SagaNotFound`]; [`KernelError::Log`].
pub async fn saga(log: &dyn TxLog, saga_id: &SagaId) -> Result<SagaRecord, KernelError> {
    log.saga(saga_id)
        .await?
        .ok_or_else(|| KernelError::SagaNotFound(saga_id.clone()))
}

/// [`operator_name`] of the kernel's operator uid, read off the runtime's threads.
pub(crate) async fn operator_name_of(kernel: &Kernel) -> Option<String> {
    let uid = kernel.operator_uid();
    off_thread("reading /etc/passwd", move || operator_name(uid))
        .await
        .unwrap_or_else(|_| uid.map(|uid| format!("uid {uid}")))
}

/// Runs `work` on a thread of its own and waits for it without blocking the runtime. Not
/// the runtime's blocking pool: a pool thread started before the process confines itself
/// would stay unconfined and could later run a tool's file work.
pub(crate) async fn off_thread<T: Send + 'static>(
    what: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, KernelError> {
    let (reply, answer) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("agent-kernel-operator".into())
        .spawn(move || {
            let _ = reply.send(work());
        })
        .map_err(|error| {
            KernelError::Log(TxError::Storage(format!("cannot start {what}: {error}")))
        })?;
    answer.await.map_err(|_| {
        KernelError::Log(TxError::Storage(format!(
            "{what} stopped without an answer"
        )))
    })
}
