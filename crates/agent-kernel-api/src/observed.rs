//! [`ObservedLog`]: a [`TxLog`] around another that numbers its writes and tells an
//! observer before and after each, passing every call on unchanged. For measurements (the
//! bench counts transactions with it) and drills (the evals kill their process at a chosen
//! write).

use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::{
    ApprovalRecord, BoxFuture, DeadLetter, DuplicateStep, KeyBinding, LeaseStatus, LogWrite, Owner,
    SagaId, SagaListing, SagaQuery, SagaRecord, SagaState, SagaSummary, TxError, TxLog,
    WriteOutcome,
};

/// What an [`ObservedLog`] tells about each write (one transaction), numbered from 0.
pub trait WriteObserver: Send + Sync + 'static {
    /// Before write `n` is passed on.
    fn before_write(&self, n: u64) {
        let _ = n;
    }

    /// After write `n` returned; `applied` when it succeeded and wrote its records (it is
    /// then as durable as the log promises): not for a take-over refused by its
    /// compare-and-swap, which wrote nothing.
    fn after_write(&self, n: u64, applied: bool) {
        let _ = (n, applied);
    }
}

/// Observes nothing: the log only counts its writes.
impl WriteObserver for () {}

/// The log behind `inner` (an `Arc<SqliteLog>`, an `Arc<dyn TxLog>`), with its writes
/// numbered and shown to an observer.
#[derive(Debug)]
pub struct ObservedLog<L, O = ()> {
    inner: L,
    observer: O,
    writes: AtomicU64,
}

impl<L, O> ObservedLog<L, O>
where
    L: Deref<Target: TxLog> + Send + Sync + 'static,
    O: WriteObserver,
{
    /// `inner`, observed by `observer`.
    pub fn new(inner: L, observer: O) -> Self {
        Self {
            inner,
            observer,
            writes: AtomicU64::new(0),
        }
    }

    /// The log inside.
    pub fn inner(&self) -> &L::Target {
        &self.inner
    }

    /// The writes begun so far.
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::SeqCst)
    }
}

impl<L, O> TxLog for ObservedLog<L, O>
where
    L: Deref<Target: TxLog> + Send + Sync + 'static,
    O: WriteObserver,
{
    fn write(&self, batch: Vec<LogWrite>) -> BoxFuture<'_, Result<Vec<WriteOutcome>, TxError>> {
        let n = self.writes.fetch_add(1, Ordering::SeqCst);
        self.observer.before_write(n);
        let write = self.inner.write(batch);
        Box::pin(async move {
            let outcome = write.await;
            self.observer.after_write(n, outcome.is_ok());
            outcome
        })
    }

    fn effect_allowed(&self) -> Result<(), TxError> {
        self.inner.effect_allowed()
    }

    fn end_lease<'a>(&'a self, owner: &'a Owner) -> BoxFuture<'a, Result<(), TxError>> {
        self.inner.end_lease(owner)
    }

    fn lease_left_ms<'a>(
        &'a self,
        owner: &'a Owner,
    ) -> BoxFuture<'a, Result<Option<i64>, TxError>> {
        self.inner.lease_left_ms(owner)
    }

    fn saga<'a>(
        &'a self,
        saga_id: &'a SagaId,
    ) -> BoxFuture<'a, Result<Option<SagaRecord>, TxError>> {
        self.inner.saga(saga_id)
    }

    fn saga_records<'a>(
        &'a self,
        saga_ids: &'a [SagaId],
    ) -> BoxFuture<'a, Result<Vec<Option<SagaRecord>>, TxError>> {
        self.inner.saga_records(saga_ids)
    }

    fn sagas(&self, limit: u32) -> BoxFuture<'_, Result<Vec<SagaSummary>, TxError>> {
        self.inner.sagas(limit)
    }

    fn saga_counts(&self) -> BoxFuture<'_, Result<Vec<(SagaState, u64)>, TxError>> {
        self.inner.saga_counts()
    }

    fn saga_page<'a>(
        &'a self,
        query: &'a SagaQuery,
    ) -> BoxFuture<'a, Result<Vec<SagaListing>, TxError>> {
        self.inner.saga_page(query)
    }

    fn unfinished_sagas(&self) -> BoxFuture<'_, Result<Vec<SagaSummary>, TxError>> {
        self.inner.unfinished_sagas()
    }

    fn key_binding<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<KeyBinding>, TxError>> {
        self.inner.key_binding(key)
    }

    fn take_over<'a>(
        &'a self,
        saga_id: &'a SagaId,
        expected_owner: &'a Owner,
        expected_state: SagaState,
        new_owner: &'a Owner,
    ) -> BoxFuture<'a, Result<bool, TxError>> {
        self.inner
            .take_over(saga_id, expected_owner, expected_state, new_owner)
    }

    /// A write (numbered and observed) when `then` has records; a take-over alone is not.
    fn take_over_and_write<'a>(
        &'a self,
        saga_id: &'a SagaId,
        expected_owner: &'a Owner,
        expected_state: SagaState,
        new_owner: &'a Owner,
        then: Vec<LogWrite>,
    ) -> BoxFuture<'a, Result<bool, TxError>> {
        let n = (!then.is_empty()).then(|| self.writes.fetch_add(1, Ordering::SeqCst));
        if let Some(n) = n {
            self.observer.before_write(n);
        }
        let write = self.inner.take_over_and_write(
            saga_id,
            expected_owner,
            expected_state,
            new_owner,
            then,
        );
        Box::pin(async move {
            let outcome = write.await;
            if let Some(n) = n {
                self.observer.after_write(n, matches!(outcome, Ok(true)));
            }
            outcome
        })
    }

    fn settled_lock_holders(&self) -> BoxFuture<'_, Result<Vec<SagaSummary>, TxError>> {
        self.inner.settled_lock_holders()
    }

    fn duplicate_of<'a>(
        &'a self,
        saga_id: &'a SagaId,
        tool_id: &'a str,
        keys: &'a [String],
        since_ms: i64,
    ) -> BoxFuture<'a, Result<Option<DuplicateStep>, TxError>> {
        self.inner.duplicate_of(saga_id, tool_id, keys, since_ms)
    }

    fn later_claim<'a>(
        &'a self,
        saga_id: &'a SagaId,
        resource: &'a str,
        since_ms: i64,
    ) -> BoxFuture<'a, Result<Option<crate::LaterClaim>, TxError>> {
        self.inner.later_claim(saga_id, resource, since_ms)
    }

    fn approval<'a>(
        &'a self,
        approval_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<ApprovalRecord>, TxError>> {
        self.inner.approval(approval_id)
    }

    fn saga_approval<'a>(
        &'a self,
        saga_id: &'a SagaId,
    ) -> BoxFuture<'a, Result<Option<ApprovalRecord>, TxError>> {
        self.inner.saga_approval(saga_id)
    }

    fn vouched_saga_approval<'a>(
        &'a self,
        saga_id: &'a SagaId,
    ) -> BoxFuture<'a, Result<Option<ApprovalRecord>, TxError>> {
        self.inner.vouched_saga_approval(saga_id)
    }

    fn pending_approvals(&self) -> BoxFuture<'_, Result<Vec<ApprovalRecord>, TxError>> {
        self.inner.pending_approvals()
    }

    fn dead_letter<'a>(
        &'a self,
        letter_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<DeadLetter>, TxError>> {
        self.inner.dead_letter(letter_id)
    }

    fn open_dead_letters<'a>(
        &'a self,
        saga_id: Option<&'a SagaId>,
    ) -> BoxFuture<'a, Result<Vec<DeadLetter>, TxError>> {
        self.inner.open_dead_letters(saga_id)
    }

    fn prune_candidates(
        &self,
        before_ms: i64,
        after: Option<(i64, SagaId)>,
        limit: u32,
    ) -> BoxFuture<'_, Result<Vec<SagaRecord>, TxError>> {
        self.inner.prune_candidates(before_ms, after, limit)
    }

    fn owner_lease<'a>(
        &'a self,
        owner: &'a Owner,
    ) -> BoxFuture<'a, Result<Option<LeaseStatus>, TxError>> {
        self.inner.owner_lease(owner)
    }
}
