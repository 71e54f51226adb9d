//! Undo (reference §10): an operator compensates a `Done` saga's steps, last first, within
//! their undo windows, and the saga ends `Undone`. `recover` never does this; only `undo`.

use agent_kernel_api::{
    EffectClass, LogWrite, MAX_DECISION_NOTE_BYTES, Reversibility, SagaId, SagaState, StepStatus,
    format_rfc3339_ms,
};
use agent_kernel_fsm::{Event, Facts};
use tracing::{Instrument, info, info_span, warn};

use crate::KernelError;
use crate::compensation::WhenChanged;
use crate::kernel::Kernel;
use crate::report::{Observer, SagaReport};

/// How an undo is asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UndoRequest {
    /// Why, recorded in the audit chain.
    pub reason: String,
    /// Undo a step even when what it left has changed since (another writer's work is then
    /// overwritten). Irreversible steps and closed windows are refused all the same.
    pub force: bool,
}

impl Kernel {
    /// Undoes a `Done` saga: every step it committed is compensated, last first, through the
    /// tools of this kernel under the policy in force, and the saga ends `Undone` (the FSM's
    /// `Done --UndoRequested--> Undone`). The request, its reason and the operator are in
    /// the audit chain before anything else.
    ///
    /// Nothing is undone when a step that would be is refused: its tool is irreversible
    /// (reversibility `none`), its undo window (the tool's own, else `[limits] undo_window`,
    /// counted from the step's commit) has passed, or what it left has changed since
    /// ([`changed_since`](agent_kernel_api::TransactionalTool::changed_since)), unless
    /// `force` (only for that last case). A compensation that fails leaves a dead letter and
    /// the saga `FailedRollbackPartial`. An undo cut short (a crash) is finished by running
    /// it again: the steps already compensated are skipped.
    ///
    /// # Errors
    ///
    /// [`KernelError::UndoRefused`] (nothing undone); [`KernelError::SagaNotFound`];
    /// [`KernelError::InvalidRequest`] for an empty or over-long reason;
    /// [`KernelError::MissingTools`]; [`KernelError::Denied`] when the FSM table has no
    /// undo row; [`KernelError::TakenOver`] when another undo of it runs; [`KernelError::Log`].
    pub async fn undo(
        &self,
        saga_id: &SagaId,
        request: &UndoRequest,
        observer: &dyn Observer,
    ) -> Result<SagaReport, KernelError> {
        if request.reason.trim().is_empty() || request.reason.len() > MAX_DECISION_NOTE_BYTES {
            return Err(KernelError::InvalidRequest(format!(
                "an undo needs a reason of 1 to {MAX_DECISION_NOTE_BYTES} bytes"
            )));
        }
        let mut options = vec!["--reason".to_owned(), request.reason.clone()];
        if request.force {
            options.push("--force".to_owned());
        }
        self.record_operator_command_with("undo", Some(saga_id), options)
            .await?;
        let mut record = self.load(saga_id).await?;
        let refuse = |step: Option<(u32, &str)>, reason: String| KernelError::UndoRefused {
            saga_id: saga_id.clone(),
            step: step.map(|(seq, tool)| (seq, tool.to_owned())),
            reason,
        };
        if record.saga.dry_run || record.saga.state == SagaState::Undone {
            // Nothing ran, or it is undone already.
            return Ok(SagaReport::from_record(&record, None));
        }
        if record.saga.state != SagaState::Done {
            return Err(refuse(
                None,
                format!(
                    "only a Done saga is undone; it is {} (an unfinished saga is rolled back by `recover` or `rollback`)",
                    record.saga.state
                ),
            ));
        }
        let undone = self
            .fsm
            .apply(SagaState::Done, Event::UndoRequested, &Facts::default())
            .map_err(|denial| KernelError::Denied {
                saga_id: Some(saga_id.clone()),
                denial,
            })?;
        let now_ms = self.env.clock.now_ms();
        let mut missing = Vec::new();
        for step in record.steps.iter().rev() {
            if step.status != StepStatus::Commit
                || step.reused_from.is_some()
                || step.effect == EffectClass::ReadOnly
            {
                continue;
            }
            let at = Some((step.step_seq, step.tool_id.as_str()));
            // An upstream server's tool is known once the server is asked.
            let _ = self.tools.load(&step.tool_id).await;
            let Some(tool) = self.tools.get(&step.tool_id) else {
                missing.push(step.tool_id.clone());
                continue;
            };
            if tool.reversibility() == Reversibility::None {
                return Err(refuse(
                    at,
                    "its tool is irreversible (reversibility none): its effect cannot be undone"
                        .to_owned(),
                ));
            }
            // Counted from the step's commit, which a take-over does not move.
            let window = self.tools.limits().undo_window_for(tool.as_ref());
            let closes_at = step
                .updated_at_ms
                .saturating_add(i64::try_from(window.as_ms()).unwrap_or(i64::MAX));
            if now_ms > closes_at {
                return Err(refuse(
                    at,
                    format!(
                        "its undo window of {window} closed at {}",
                        format_rfc3339_ms(closes_at)
                    ),
                ));
            }
            let ctx = self.context(
                saga_id,
                step.step_seq,
                &step.tool_id,
                step.idempotency_key.as_deref(),
                record.saga.actor.as_deref(),
            );
            match self
                .tools
                .changed_since(&ctx, &step.args, &step.undo, step.output.as_ref())
                .await
            {
                Ok(None) => {}
                Ok(Some(change)) if request.force => {
                    warn!(saga_id = %saga_id, step_seq = step.step_seq, %change, "undoing a changed step: --force");
                }
                Ok(Some(change)) => {
                    return Err(refuse(
                        at,
                        format!(
                            "{change}; undoing it would destroy that (pass --force to undo anyway)"
                        ),
                    ));
                }
                Err(error) => {
                    return Err(refuse(
                        at,
                        format!("whether what it left has changed cannot be told: {error}"),
                    ));
                }
            }
        }
        if !missing.is_empty() {
            missing.sort();
            missing.dedup();
            return Err(KernelError::MissingTools {
                saga_id: saga_id.clone(),
                tools: missing,
            });
        }
        // One undo at a time: a compare-and-swap on the owner of the finished saga.
        self.take_over(&mut record).await?;
        let span = info_span!("saga", saga_id = %saga_id, undo = true);
        async {
            info!(reason = %request.reason, force = request.force, "undoing a Done saga");
            // Checked above: a change since then (a writer racing the undo) is refused
            // step by step, unless forced.
            let when_changed = if request.force {
                WhenChanged::Force
            } else {
                WhenChanged::Refuse
            };
            let (any_failed, mut last) = self
                .compensate_steps(&record, observer, when_changed)
                .await?;
            let state = if any_failed {
                SagaState::FailedRollbackPartial
            } else {
                undone
            };
            last.push(LogWrite::SetState {
                saga_id: saga_id.clone(),
                state,
            });
            self.log.write(last).await?;
            info!(%state, "undo finished");
            let record = self.load(saga_id).await?;
            Ok(SagaReport::from_record(&record, None))
        }
        .instrument(span)
        .await
    }
}
