//! Prune (issue 14): finished sagas older than a horizon leave the log's tables, so the log
//! stays as small as the work that may still need it; the audit chain keeps their records
//! and a checkpoint naming them.

use agent_kernel_api::{
    EffectClass, LogWrite, MAX_UNDO_WINDOW_MS, PruneSagas, Reversibility, SagaId, SagaRecord,
    SagaState, StepStatus, TxError, UndoWindow, WriteOutcome,
};
use agent_kernel_api::{PRUNE_IDS_BYTES_MAX, PRUNE_SAGAS_MAX};
use serde::Serialize;
use tracing::info;

use crate::KernelError;
use crate::kernel::Kernel;

/// What [`Kernel::prune`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PruneReport {
    /// The horizon: sagas last changed before it were considered (ms since the epoch).
    pub before_ms: i64,
    /// Sagas removed.
    pub n_sagas: u64,
    /// Their steps, removed with them.
    pub n_steps: u64,
    /// Finished sagas past the horizon kept because a step of theirs may still be undone.
    pub kept_in_undo_window: u64,
}

impl Kernel {
    /// Removes from the log every saga settled for good before `older_than_ms` ago:
    /// `Done`, `FailedRolledBack` or `Undone` (never `FailedRollbackPartial`, which an
    /// operator must still see to), last changed before the horizon, with no open dead
    /// letter and no open approval request, and, for a `Done` saga, no step still inside
    /// its undo window (the tool's, else `[limits] undo_window`; a tool this kernel does
    /// not have counts with the longest window, `MAX_UNDO_WINDOW_MS`). Open sagas, and
    /// sagas waiting for an approval, are never removed.
    ///
    /// Each saga goes with its steps, idempotency keys (a key of a pruned saga may run
    /// again), approval requests and dead letters. The audit chain keeps every record; a
    /// `Prune` checkpoint per [`PRUNE_SAGAS_MAX`] sagas names them with the hash of their
    /// records, so `audit verify` replays through it. The command is recorded first.
    ///
    /// # Errors
    ///
    /// [`KernelError::Log`] when the log fails; sagas pruned before are then gone, the
    /// others are left as they were.
    pub async fn prune(&self, older_than_ms: u64) -> Result<PruneReport, KernelError> {
        self.record_operator_command("prune", None).await?;
        let now_ms = self.env.clock.now_ms();
        let before_ms = now_ms.saturating_sub(i64::try_from(older_than_ms).unwrap_or(i64::MAX));
        let mut report = PruneReport {
            before_ms,
            ..PruneReport::default()
        };
        let page_max = u32::try_from(PRUNE_SAGAS_MAX).expect("the bound fits in u32");
        let mut after = None;
        loop {
            let page = self
                .log
                .prune_candidates(before_ms, after.take(), page_max)
                .await?;
            let Some(last) = page.last() else {
                break;
            };
            after = Some((last.saga.created_at_ms, last.saga.saga_id.clone()));
            let mut saga_ids = Vec::with_capacity(page.len());
            for record in &page {
                if self.may_still_be_undone(record, now_ms) {
                    report.kept_in_undo_window += 1;
                } else {
                    saga_ids.push(record.saga.saga_id.clone());
                }
            }
            for saga_ids in by_bytes(saga_ids) {
                let outcomes = self
                    .log
                    .write(vec![LogWrite::Prune(PruneSagas {
                        saga_ids,
                        before_ms,
                    })])
                    .await?;
                match outcomes.as_slice() {
                    [WriteOutcome::Pruned { n_sagas, n_steps }] => {
                        report.n_sagas += n_sagas;
                        report.n_steps += n_steps;
                    }
                    other => {
                        return Err(KernelError::Log(TxError::Corrupt(format!(
                            "a prune was answered {other:?}"
                        ))));
                    }
                }
            }
            if page.len() < PRUNE_SAGAS_MAX {
                break;
            }
        }
        info!(
            n_sagas = report.n_sagas,
            n_steps = report.n_steps,
            kept_in_undo_window = report.kept_in_undo_window,
            "pruned"
        );
        Ok(report)
    }

    /// Whether `undo` might still accept `record` at `now_ms`: a `Done` saga with a
    /// committed, executed, mutating step of a reversible tool whose window is open. A
    /// tool this kernel does not have counts with the longest window there is, since its
    /// own may be as long.
    fn may_still_be_undone(&self, record: &SagaRecord, now_ms: i64) -> bool {
        if record.saga.state != SagaState::Done {
            return false;
        }
        let limits = self.tools.limits();
        record.steps.iter().any(|step| {
            if step.status != StepStatus::Commit
                || step.reused_from.is_some()
                || step.effect == EffectClass::ReadOnly
            {
                return false;
            }
            let window = match self.tools.get(&step.tool_id) {
                Some(tool) if tool.reversibility() == Reversibility::None => return false,
                Some(tool) => limits.undo_window_for(tool.as_ref()),
                None => {
                    UndoWindow::from_ms(MAX_UNDO_WINDOW_MS).expect("the longest window is a window")
                }
            };
            let closes_at = step
                .updated_at_ms
                .saturating_add(i64::try_from(window.as_ms()).unwrap_or(i64::MAX));
            now_ms <= closes_at
        })
    }
}

/// `saga_ids` in runs whose ids take at most [`PRUNE_IDS_BYTES_MAX`] bytes, one write each.
fn by_bytes(saga_ids: Vec<SagaId>) -> Vec<Vec<SagaId>> {
    let mut runs: Vec<Vec<SagaId>> = Vec::new();
    let mut run_bytes = 0;
    for saga_id in saga_ids {
        let bytes = saga_id.as_str().len();
        match runs.last_mut() {
            Some(run) if run_bytes + bytes <= PRUNE_IDS_BYTES_MAX => {
                run_bytes += bytes;
                run.push(saga_id);
            }
            _ => {
                run_bytes = bytes;
                runs.push(vec![saga_id]);
            }
        }
    }
    runs
}
