//! The log seam: the real log, with a simulated process's faults at each write.
//!
//! Every call completes before the process goes on (the real log's thread is waited for
//! on the spot), so the only interleavings are those the schedule makes at each call's
//! gate: one seed, one run.

use std::future::Future;
use std::sync::Arc;

use agent_kernel_api::{
    ApprovalRecord, BoxFuture, DeadLetter, DuplicateStep, KeyBinding, LeaseStatus, LogWrite, Owner,
    SagaId, SagaListing, SagaQuery, SagaRecord, SagaState, SagaSummary, TxError, TxLog,
    WriteOutcome,
};

use crate::power::Recorder;
use crate::process::{Act, Process};

/// A [`TxLog`] whose writes are points of a simulated process.
pub(crate) struct FaultyLog {
    inner: Arc<dyn TxLog>,
    process: Arc<Process>,
    /// Notes what the files hold after each write, where the case loses power.
    recorder: Option<Arc<Recorder>>,
}

impl FaultyLog {
    pub(crate) fn new(
        inner: Arc<dyn TxLog>,
        process: Arc<Process>,
        recorder: Option<Arc<Recorder>>,
    ) -> FaultyLog {
        FaultyLog {
            inner,
            process,
            recorder,
        }
    }

    /// The write, made, and noted.
    fn noted<T>(&self, written: T) -> T {
        if let Some(recorder) = &self.recorder {
            recorder.record();
        }
        written
    }

    /// A write at the next point: made, refused, or the process killed around it. `write`
    /// makes the real write's future only when the write is to happen, since a log may
    /// start writing as soon as its method is called.
    async fn write_at<T, F>(
        &self,
        what: String,
        write: impl FnOnce(Arc<dyn TxLog>) -> F,
    ) -> Result<T, TxError>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, TxError>> + Send + 'static,
    {
        self.process.gate().await;
        if let Some(recorder) = &self.recorder {
            recorder.expect_unchanged();
        }
        match self.process.point(&what, true) {
            // A hang is never planned at a log write.
            Act::Go | Act::HangBefore | Act::HangAfter => {
                self.noted(complete(write(self.inner.clone())))
            }
            Act::CrashBefore => {
                self.process.die();
                std::future::pending().await
            }
            Act::CrashAfter => {
                let _ = self.noted(complete(write(self.inner.clone())));
                self.process.die();
                std::future::pending().await
            }
            Act::Fail => Err(TxError::Storage(
                "simulated I/O error: nothing written".to_owned(),
            )),
        }
    }

    /// A read: no point, but a gate (a dead process reads nothing more).
    async fn read<T, F>(&self, read: impl FnOnce(Arc<dyn TxLog>) -> F) -> T
    where
        T: Send + 'static,
        F: Future<Output = T> + Send + 'static,
    {
        self.process.gate().await;
        complete(read(self.inner.clone()))
    }
}

/// `future`'s output, run to its end on the calling thread while the simulated process
/// waits. The log is opened with no polling ([`SqliteLog::set_spin`]), so its future only
/// waits on channels its writer thread answers; outside the runtime's cooperative budget,
/// so no poll is refused for having run too long.
///
/// [`SqliteLog::set_spin`]: agent_kernel_txlog::SqliteLog::set_spin
fn complete<T>(future: impl Future<Output = T>) -> T {
    futures_executor::block_on(tokio::task::unconstrained(future))
}

/// The variant names of a batch, for the history.
fn describe(batch: &[LogWrite]) -> String {
    let names: Vec<String> = batch
        .iter()
        .map(|write| {
            let debug = format!("{write:?}");
            debug
                .split(['(', ' ', '{'])
                .next()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    format!("log write [{}]", names.join(", "))
}

impl TxLog for FaultyLog {
    fn write(&self, batch: Vec<LogWrite>) -> BoxFuture<'_, Result<Vec<WriteOutcome>, TxError>> {
        Box::pin(async move {
            let what = describe(&batch);
            self.write_at(what, |log| async move { log.write(batch).await })
                .await
        })
    }

    fn take_over_and_write<'a>(
        &'a self,
        saga_id: &'a SagaId,
        expected_owner: &'a Owner,
        expected_state: SagaState,
        new_owner: &'a Owner,
        then: Vec<LogWrite>,
    ) -> BoxFuture<'a, Result<bool, TxError>> {
        Box::pin(async move {
            let what = format!("take over {saga_id} and {}", describe(&then));
            let (saga_id, expected_owner, new_owner) =
                (saga_id.clone(), expected_owner.clone(), new_owner.clone());
            let write = move |log: Arc<dyn TxLog>| async move {
                log.take_over_and_write(&saga_id, &expected_owner, expected_state, &new_owner, then)
                    .await
            };
            self.write_at(what, write).await
        })
    }

    fn end_lease<'a>(&'a self, owner: &'a Owner) -> BoxFuture<'a, Result<(), TxError>> {
        Box::pin(async move {
            let what = format!("end lease of pid {}", owner.pid);
            let owner = owner.clone();
            self.write_at(what, |log| async move { log.end_lease(&owner).await })
                .await
        })
    }

    fn effect_allowed(&self) -> Result<(), TxError> {
        self.inner.effect_allowed()
    }

    fn saga<'a>(
        &'a self,
        saga_id: &'a SagaId,
    ) -> BoxFuture<'a, Result<Option<SagaRecord>, TxError>> {
        let saga_id = saga_id.clone();
        Box::pin(self.read(|log| async move { log.saga(&saga_id).await }))
    }

    fn saga_records<'a>(
        &'a self,
        saga_ids: &'a [SagaId],
    ) -> BoxFuture<'a, Result<Vec<Option<SagaRecord>>, TxError>> {
        let saga_ids = saga_ids.to_vec();
        Box::pin(self.read(|log| async move { log.saga_records(&saga_ids).await }))
    }

    fn sagas(&self, limit: u32) -> BoxFuture<'_, Result<Vec<SagaSummary>, TxError>> {
        Box::pin(self.read(move |log| async move { log.sagas(limit).await }))
    }

    fn saga_counts(&self) -> BoxFuture<'_, Result<Vec<(SagaState, u64)>, TxError>> {
        Box::pin(self.read(|log| async move { log.saga_counts().await }))
    }

    fn saga_page<'a>(
        &'a self,
        query: &'a SagaQuery,
    ) -> BoxFuture<'a, Result<Vec<SagaListing>, TxError>> {
        let query = query.clone();
        Box::pin(self.read(|log| async move { log.saga_page(&query).await }))
    }

    fn unfinished_sagas(&self) -> BoxFuture<'_, Result<Vec<SagaSummary>, TxError>> {
        Box::pin(self.read(|log| async move { log.unfinished_sagas().await }))
    }

    fn settled_lock_holders(&self) -> BoxFuture<'_, Result<Vec<SagaSummary>, TxError>> {
        Box::pin(self.read(|log| async move { log.settled_lock_holders().await }))
    }

    fn duplicate_of<'a>(
        &'a self,
        saga_id: &'a SagaId,
        tool_id: &'a str,
        keys: &'a [String],
        since_ms: i64,
    ) -> BoxFuture<'a, Result<Option<DuplicateStep>, TxError>> {
        let (saga_id, tool_id, keys) = (saga_id.clone(), tool_id.to_owned(), keys.to_vec());
        Box::pin(self.read(move |log| async move {
            log.duplicate_of(&saga_id, &tool_id, &keys, since_ms).await
        }))
    }

    fn later_claim<'a>(
        &'a self,
        saga_id: &'a SagaId,
        resource: &'a str,
        since_ms: i64,
    ) -> BoxFuture<'a, Result<Option<agent_kernel_api::LaterClaim>, TxError>> {
        let (saga_id, resource) = (saga_id.clone(), resource.to_owned());
        Box::pin(
            self.read(
                move |log| async move { log.later_claim(&saga_id, &resource, since_ms).await },
            ),
        )
    }

    fn key_binding<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<KeyBinding>, TxError>> {
        let key = key.to_owned();
        Box::pin(self.read(|log| async move { log.key_binding(&key).await }))
    }

    fn approval<'a>(
        &'a self,
        approval_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<ApprovalRecord>, TxError>> {
        let approval_id = approval_id.to_owned();
        Box::pin(self.read(|log| async move { log.approval(&approval_id).await }))
    }

    fn saga_approval<'a>(
        &'a self,
        saga_id: &'a SagaId,
    ) -> BoxFuture<'a, Result<Option<ApprovalRecord>, TxError>> {
        let saga_id = saga_id.clone();
        Box::pin(self.read(|log| async move { log.saga_approval(&saga_id).await }))
    }

    fn vouched_saga_approval<'a>(
        &'a self,
        saga_id: &'a SagaId,
    ) -> BoxFuture<'a, Result<Option<ApprovalRecord>, TxError>> {
        let saga_id = saga_id.clone();
        Box::pin(self.read(|log| async move { log.vouched_saga_approval(&saga_id).await }))
    }

    fn pending_approvals(&self) -> BoxFuture<'_, Result<Vec<ApprovalRecord>, TxError>> {
        Box::pin(self.read(|log| async move { log.pending_approvals().await }))
    }

    fn dead_letter<'a>(
        &'a self,
        letter_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<DeadLetter>, TxError>> {
        let letter_id = letter_id.to_owned();
        Box::pin(self.read(|log| async move { log.dead_letter(&letter_id).await }))
    }

    fn open_dead_letters<'a>(
        &'a self,
        saga_id: Option<&'a SagaId>,
    ) -> BoxFuture<'a, Result<Vec<DeadLetter>, TxError>> {
        let saga_id = saga_id.cloned();
        Box::pin(self.read(|log| async move { log.open_dead_letters(saga_id.as_ref()).await }))
    }

    fn owner_lease<'a>(
        &'a self,
        owner: &'a Owner,
    ) -> BoxFuture<'a, Result<Option<LeaseStatus>, TxError>> {
        let owner = owner.clone();
        Box::pin(self.read(|log| async move { log.owner_lease(&owner).await }))
    }

    fn lease_left_ms<'a>(
        &'a self,
        owner: &'a Owner,
    ) -> BoxFuture<'a, Result<Option<i64>, TxError>> {
        let owner = owner.clone();
        Box::pin(self.read(|log| async move { log.lease_left_ms(&owner).await }))
    }

    fn prune_candidates(
        &self,
        before_ms: i64,
        after: Option<(i64, SagaId)>,
        limit: u32,
    ) -> BoxFuture<'_, Result<Vec<SagaRecord>, TxError>> {
        Box::pin(
            self.read(
                move |log| async move { log.prune_candidates(before_ms, after, limit).await },
            ),
        )
    }
}
