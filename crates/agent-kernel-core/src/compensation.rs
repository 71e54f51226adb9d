//! Compensation: undoing, last first, every step of a saga whose effect may be in place,
//! each from its log record alone (through the tools of this kernel, under the policy in
//! force), and settling a step of unknown outcome by its tool's declared class.

use agent_kernel_api::{
    EffectClass, LogWrite, ProbeOutcome, SagaId, SagaRecord, SagaState, Settlement, StepRecord,
    StepStatus, ToolError,
};
use agent_kernel_fsm::{Event, Facts, Guardrail};
use tracing::{Instrument, debug, field, info, info_span, warn};

use crate::KernelError;
use crate::kernel::Kernel;
use crate::report::{Failure, Observer, SagaEvent, SagaReport};

/// Where a compensation's outcome records go as they become known.
pub(crate) enum Outcomes {
    /// Written at once: each durable before the next compensation runs.
    Now,
    /// Held in the order the compensations ran, for the caller to write later in that
    /// order ([`Kernel::recover`], which shares one write among many sagas). Compensation
    /// is idempotent (SPEC 3.1), so a crash before the write only runs them again.
    Held(Vec<LogWrite>),
}

impl Outcomes {
    /// Writes `batch` now, or holds it after those held before.
    async fn record(&mut self, kernel: &Kernel, batch: Vec<LogWrite>) -> Result<(), KernelError> {
        match self {
            Outcomes::Now => {
                kernel.log.write(batch).await?;
            }
            Outcomes::Held(held) => held.extend(batch),
        }
        Ok(())
    }
}

impl Kernel {
    /// The state a failing saga moves to: `Compensating`, through the table's failure event
    /// for its state (`ValidationFailed` for a live saga waiting in `Planning`). A table
    /// without that row (a custom one, for `Idle` or `Planning`) is warned about and the saga
    /// moved there directly, because rollback must stay possible.
    pub(crate) fn enter_compensating(&self, saga_id: &SagaId, state: SagaState) -> SagaState {
        if state == SagaState::Compensating {
            return state;
        }
        let event = Guardrail::failure_event(state);
        let table_says = self.fsm.apply(state, event, &Facts::default());
        if table_says != Ok(SagaState::Compensating) {
            warn!(saga_id = %saga_id, %state, %event, other = ?table_says, "no failure transition to Compensating; compensating anyway");
        }
        SagaState::Compensating
    }

    pub(crate) async fn load(&self, saga_id: &SagaId) -> Result<SagaRecord, KernelError> {
        self.log
            .saga(saga_id)
            .await?
            .ok_or_else(|| KernelError::SagaNotFound(saga_id.clone()))
    }

    /// Whether a step's effect may be in place and so needs compensating.
    pub(crate) fn needs_compensation(step: &StepRecord) -> bool {
        match step.status {
            StepStatus::Begin | StepStatus::Commit | StepStatus::CompensationFailed => true,
            StepStatus::Fail => step.error.as_ref().is_some_and(ToolError::is_uncertain),
            StepStatus::Compensated => false,
        }
    }

    /// Compensates every step of a saga in `Compensating` whose effect may be in place,
    /// last first, then moves the saga to its final state.
    pub(crate) async fn compensate_saga(
        &self,
        record: SagaRecord,
        failure: Option<Failure>,
        observer: &dyn Observer,
    ) -> Result<SagaReport, KernelError> {
        let saga_id = record.saga.saga_id.clone();
        self.compensate_into(&record, observer, &mut Outcomes::Now)
            .await?;
        let record = self.load(&saga_id).await?;
        Ok(SagaReport::from_record(&record, failure))
    }

    /// [`Kernel::compensate_saga`]'s work, its records (each step's outcome, then the
    /// saga's end state) going to `outcomes`; the end state.
    pub(crate) async fn compensate_into(
        &self,
        record: &SagaRecord,
        observer: &dyn Observer,
        outcomes: &mut Outcomes,
    ) -> Result<SagaState, KernelError> {
        let saga_id = record.saga.saga_id.clone();
        if record.saga.state != SagaState::Compensating {
            return Err(KernelError::Inconsistent {
                saga_id,
                reason: format!(
                    "only a saga in Compensating is compensated; it is {}",
                    record.saga.state
                ),
            });
        }
        observer.on_event(&SagaEvent::Compensating { saga_id: &saga_id });
        info!(saga_id = %saga_id, "compensating");
        let any_failed = self.compensate_steps(record, observer, outcomes).await?;
        let (event, facts) = if any_failed {
            let facts = Facts {
                any_compensation_failed: true,
                ..Facts::default()
            };
            (Event::CompensationFailed, facts)
        } else {
            let facts = Facts {
                all_compensated: true,
                ..Facts::default()
            };
            (Event::CompensationDone, facts)
        };
        let state = self
            .fsm
            .apply(SagaState::Compensating, event, &facts)
            .expect("loaded tables always let compensation finish");
        outcomes
            .record(
                self,
                vec![LogWrite::SetState {
                    saga_id: saga_id.clone(),
                    state,
                }],
            )
            .await?;
        info!(saga_id = %saga_id, %state, "saga finished");
        Ok(state)
    }

    /// Compensates, last first, every step of `record` whose effect may be in place, each
    /// outcome (a failure with its dead letter) to `outcomes`; returns whether any failed.
    pub(crate) async fn compensate_steps(
        &self,
        record: &SagaRecord,
        observer: &dyn Observer,
        outcomes: &mut Outcomes,
    ) -> Result<bool, KernelError> {
        let saga_id = record.saga.saga_id.clone();
        let actor = record.saga.actor.as_deref();
        let mut any_failed = false;
        // A dry run's steps were simulated: nothing ran, so nothing is undone. (The kernel
        // writes a dry run whole in one batch, so it is never found unfinished; this guards
        // a log written otherwise.)
        let simulated = record.saga.dry_run;
        // Steps whose earlier compensation failed have an open dead letter: one that now
        // succeeds settles it in the same transaction.
        let letters = if record
            .steps
            .iter()
            .any(|step| step.status == StepStatus::CompensationFailed)
        {
            self.log.open_dead_letters(Some(&saga_id)).await?
        } else {
            Vec::new()
        };
        for step in record.steps.iter().rev() {
            if simulated || !Self::needs_compensation(step) {
                continue;
            }
            let span = info_span!("compensate", step = step.step_seq, tool = %step.tool_id, outcome = field::Empty);
            let result = self
                .compensate_step(&saga_id, actor, step)
                .instrument(span.clone())
                .await;
            span.record(
                "outcome",
                if result.is_ok() {
                    "compensated"
                } else {
                    "compensation_failed"
                },
            );
            debug!(parent: &span, "step compensation finished");
            if let Err(error) = &result {
                any_failed = true;
                warn!(saga_id = %saga_id, step_seq = step.step_seq, tool = %step.tool_id, %error, "compensation failed");
            }
            let status = if result.is_ok() {
                StepStatus::Compensated
            } else {
                StepStatus::CompensationFailed
            };
            // A compensation that still fails after its retries, or a step left to an
            // operator, becomes a dead letter with its record, in one transaction.
            let dead_letter = match &result {
                Ok(note) => letters
                    .iter()
                    .find(|letter| letter.step_seq == step.step_seq)
                    .map(|letter| {
                        self.settlement(
                            &letter.letter_id,
                            agent_kernel_api::DeadLetterStatus::Retried,
                            Some("agent-kernel (compensated on a later rollback)".to_owned()),
                            note,
                        )
                    }),
                Err(error) => Some(self.dead_letter_for(&saga_id, step, error).await?),
            };
            let mut batch = vec![LogWrite::Compensation {
                saga_id: saga_id.clone(),
                step_seq: step.step_seq,
                result,
            }];
            batch.extend(dead_letter);
            outcomes.record(self, batch).await?;
            observer.on_event(&SagaEvent::StepCompensated {
                step_seq: step.step_seq,
                tool: &step.tool_id,
                status,
            });
        }
        Ok(any_failed)
    }

    /// Compensates one step; `Ok` carries a note for the log.
    pub(crate) async fn compensate_step(
        &self,
        saga_id: &SagaId,
        actor: Option<&str>,
        step: &StepRecord,
    ) -> Result<String, ToolError> {
        if let Some((from_saga, from_seq)) = &step.reused_from {
            return Ok(format!(
                "output reused from saga {from_saga} step {from_seq}; the effect belongs to that saga and stays"
            ));
        }
        if step.effect == EffectClass::ReadOnly {
            return Ok("read-only: nothing to undo".to_owned());
        }
        let Some(tool) = self.tools.get(&step.tool_id).cloned() else {
            if step.tool_version == agent_kernel_api::UPSTREAM_TOOL_VERSION {
                return Err(ToolError::failed(format!(
                    "`{}` is a tool of an upstream MCP server the tools file no longer declares; cannot compensate",
                    step.tool_id
                )));
            }
            return Err(ToolError::failed(format!(
                "tool `{}` is not registered in this build; cannot compensate",
                step.tool_id
            )));
        };
        if tool.version() != step.tool_version {
            warn!(saga_id = %saga_id, step_seq = step.step_seq, logged = %step.tool_version, current = %tool.version(), "compensating with another tool version");
        }
        let ctx = self.context(
            saga_id,
            step.step_seq,
            &step.tool_id,
            step.idempotency_key.as_deref(),
            actor,
        );
        // A committed step's effect happened: undo it. Otherwise the outcome is unknown (the
        // process died before the outcome was logged, or the tool failed with an uncertain
        // outcome) and the tool's declared settlement decides.
        if step.status == StepStatus::Commit || step.output.is_some() {
            return self
                .tools
                .compensate(&ctx, &step.args, &step.undo, step.output.as_ref())
                .await
                .map(|()| "compensated".to_owned());
        }
        match tool.settlement() {
            Settlement::Compensate => self
                .tools
                .compensate(&ctx, &step.args, &step.undo, None)
                .await
                .map(|()| {
                    "compensated (outcome was in doubt; compensation is safe either way)".to_owned()
                }),
            Settlement::Probe => match self.tools.probe(&ctx, &step.args, &step.undo).await {
                Ok(ProbeOutcome::Happened(output)) => self
                    .tools
                    .compensate(&ctx, &step.args, &step.undo, output.as_ref())
                    .await
                    .map(|()| "probe: the effect happened; compensated".to_owned()),
                Ok(ProbeOutcome::NotHappened) => {
                    Ok("probe: the effect did not happen; nothing to undo".to_owned())
                }
                Ok(ProbeOutcome::Unknown) => Err(ToolError::failed(format!(
                    "outcome unknown: `{}` could not tell whether the effect happened; an operator must settle this step",
                    step.tool_id
                ))),
                Err(error) => Err(ToolError::failed(format!(
                    "outcome unknown: the probe of `{}` failed ({error}); an operator must settle this step",
                    step.tool_id
                ))),
            },
            Settlement::Operator | _ => Err(ToolError::failed(format!(
                "outcome unknown: `{}` can neither tell whether its effect happened nor undo it blindly; an operator must settle this step",
                step.tool_id
            ))),
        }
    }
}
