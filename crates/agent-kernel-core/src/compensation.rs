//! Compensation: undoing, last first, every step of a saga whose effect may be in place,
//! each from its log record alone (through the tools of this kernel, under the policy in
//! force), and settling a step of unknown outcome by its tool's declared class.

use std::collections::BTreeMap;

use agent_kernel_api::{
    EffectClass, LogWrite, ProbeOutcome, SagaId, SagaRecord, SagaState, Settlement, StepRecord,
    StepStatus, ToolError,
};
use agent_kernel_fsm::{Event, Facts, Guardrail};
use tracing::{Instrument, debug, field, info, info_span, warn};

use crate::KernelError;
use crate::kernel::Kernel;
use crate::report::{Failure, Observer, SagaEvent, SagaReport};

/// Whether a compensation runs when what its step left has changed since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WhenChanged {
    /// Not run: the step becomes a dead letter whose error starts `changed since:`.
    Refuse,
    /// Run anyway: an operator said so (`dlq retry --force`, `undo --force`).
    Force,
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
        self.compensate_into(&record, observer).await?;
        let record = self.load(&saga_id).await?;
        Ok(SagaReport::from_record(&record, failure))
    }

    /// [`Kernel::compensate_saga`]'s work: each step's outcome is written before the next
    /// compensation runs, the last one with the saga's end state; returns the end state.
    pub(crate) async fn compensate_into(
        &self,
        record: &SagaRecord,
        observer: &dyn Observer,
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
        let (any_failed, mut last) = self
            .compensate_steps(record, observer, WhenChanged::Refuse, &BTreeMap::new())
            .await?;
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
        last.push(LogWrite::SetState {
            saga_id: saga_id.clone(),
            state,
        });
        self.log.write(last).await?;
        info!(saga_id = %saga_id, %state, "saga finished");
        Ok(state)
    }

    /// Compensates, last first, every step of `record` whose effect may be in place; returns
    /// whether any failed, and the last outcome's records, which the caller writes (with the
    /// saga's end state) before anything else runs.
    ///
    /// Intent before effect holds for compensations too: every outcome is durable before
    /// the next compensation's effect runs, so a kill at any instant leaves at most one
    /// compensation whose outcome the log lacks, and running that one again is safe (its
    /// tool's [`changed_since`](agent_kernel_api::Compensate::changed_since) accepts
    /// what it restores). Holding outcomes until several compensations ran is the bug this
    /// rules out: a later step's undo run again over an earlier step's undo of one file.
    ///
    /// A step is not compensated while a later step of the saga on one of its resources is
    /// not ([`waits_for`]): undone first, it would act under that step's effect, and a
    /// tool that cannot tell what changed since (an upstream, command or Python tool) would
    /// undo nothing, or the wrong thing, and report success. It fails as that later step
    /// did, with a dead letter of its own, to be retried after the later one's.
    ///
    /// The steps in `covered` (an undo's, [`Kernel::covered_by`]) are not compensated
    /// either: each fails as changed since, with the reason given.
    pub(crate) async fn compensate_steps(
        &self,
        record: &SagaRecord,
        observer: &dyn Observer,
        when_changed: WhenChanged,
        covered: &BTreeMap<u32, String>,
    ) -> Result<(bool, Vec<LogWrite>), KernelError> {
        let saga_id = record.saga.saga_id.clone();
        let actor = record.saga.actor.as_deref();
        let mut any_failed = false;
        // The last outcome, not yet written.
        let mut pending: Vec<LogWrite> = Vec::new();
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
        // The resources of the later steps not compensated in this pass, with the step.
        let mut not_undone: BTreeMap<&str, u32> = BTreeMap::new();
        for step in record.steps.iter().rev() {
            if simulated || !Self::needs_compensation(step) {
                continue;
            }
            let waiting = waits_for(step, &not_undone).or_else(|| {
                covered
                    .get(&step.step_seq)
                    .map(|reason| ToolError::changed(covered_error(reason)))
            });
            // Test-only, never in a build you ship: outcomes held back until every
            // compensation ran (a planted bug, the regression that batching recovery's writes
            // once brought), so that the simulator can show it finds it.
            let hold_outcomes = cfg!(feature = "sim-plant-held-outcomes");
            if Self::may_act(step) && waiting.is_none() {
                if !pending.is_empty() && !hold_outcomes {
                    // The outcome before is durable before this compensation acts.
                    self.log.write(std::mem::take(&mut pending)).await?;
                }
                // No effect once this process's lease is not certainly live (a log shared
                // by many machines): another may have taken the saga over.
                self.log.effect_allowed()?;
            }
            let span = info_span!("compensate", step = step.step_seq, tool = %step.tool_id, outcome = field::Empty);
            let result = match &waiting {
                Some(error) => Err(error.clone()),
                None => {
                    self.compensate_step(&saga_id, actor, step, when_changed)
                        .instrument(span.clone())
                        .await
                }
            };
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
                for resource in &step.resources {
                    not_undone.entry(resource).or_insert(step.step_seq);
                }
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
            pending.push(LogWrite::Compensation {
                saga_id: saga_id.clone(),
                step_seq: step.step_seq,
                result,
            });
            pending.extend(dead_letter);
            observer.on_event(&SagaEvent::StepCompensated {
                saga_id: &saga_id,
                step_seq: step.step_seq,
                tool: &step.tool_id,
                status,
            });
        }
        Ok((any_failed, pending))
    }

    /// Whether compensating `step` may change the world (run a tool), as opposed to only
    /// recording that there is nothing to undo.
    pub(crate) fn may_act(step: &StepRecord) -> bool {
        step.reused_from.is_none() && step.effect != EffectClass::ReadOnly
    }

    /// Compensates one step; `Ok` carries a note for the log. Unless `when_changed` forces
    /// it, a step whose tool says what it left has changed since is not compensated: the
    /// error ([`ToolError::changed`]) starts `changed since:`.
    pub(crate) async fn compensate_step(
        &self,
        saga_id: &SagaId,
        actor: Option<&str>,
        step: &StepRecord,
        when_changed: WhenChanged,
    ) -> Result<String, ToolError> {
        if let Some((from_saga, from_seq)) = &step.reused_from {
            return Ok(format!(
                "output reused from saga {from_saga} step {from_seq}; the effect belongs to that saga and stays"
            ));
        }
        if step.effect == EffectClass::ReadOnly {
            return Ok("read-only: nothing to undo".to_owned());
        }
        let unavailable = self.tools.load(&step.tool_id).await.err();
        let Some(tool) = self.tools.get(&step.tool_id) else {
            if let Some(reason) = unavailable {
                let server = self.tools.source_of(&step.tool_id).unwrap_or_default();
                return Err(ToolError::failed(format!(
                    "`{}` is a tool of the upstream MCP server `{server}`, which is unavailable ({reason}); cannot compensate until it is",
                    step.tool_id
                )));
            }
            if step.tool_version == agent_kernel_api::UPSTREAM_TOOL_VERSION {
                return Err(ToolError::failed(format!(
                    "`{}` is a tool of an upstream MCP server that this process does not offer (the tools file no longer declares it, or the server does not list it, or its id was taken); cannot compensate",
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
        // Never clobber: what the step left (or, its outcome unknown, what was there before
        // it) must still be there, or compensating it would destroy a later writer's work.
        let settles_by_operator = step.status != StepStatus::Commit
            && step.output.is_none()
            && !matches!(
                tool.settlement(),
                Settlement::Compensate | Settlement::Probe
            );
        // Test-only, never in a build you ship: the check left out (a planted bug) so that
        // the simulator can show it finds the clobber.
        let planted_blindness = cfg!(feature = "sim-plant-ignore-changed-since");
        if when_changed == WhenChanged::Refuse && !settles_by_operator && !planted_blindness {
            match self
                .tools
                .changed_since(&ctx, &step.args, &step.undo, step.output.as_ref())
                .await
            {
                Ok(None) => {}
                Ok(Some(change)) => {
                    return Err(ToolError::changed(format!(
                        "{change}; the compensation was not run and that change stays (`agent-kernel dlq retry ID --force` runs it anyway)"
                    )));
                }
                Err(error) => {
                    return Err(ToolError::failed(format!(
                        "cannot tell whether what the step left is still there ({error}); the compensation was not run"
                    )));
                }
            }
        }
        // A retry after a backoff acts only while this process's lease is still certainly
        // live (a log shared by many machines).
        let lease_live = || self.log.effect_allowed().is_ok();
        // A committed step's effect happened: undo it. Otherwise the outcome is unknown (the
        // process died before the outcome was logged, or the tool failed with an uncertain
        // outcome) and the tool's declared settlement decides.
        if step.status == StepStatus::Commit || step.output.is_some() {
            return self
                .tools
                .compensate_while(
                    &ctx,
                    &step.args,
                    &step.undo,
                    step.output.as_ref(),
                    &lease_live,
                )
                .await
                .map(|()| "compensated".to_owned());
        }
        match tool.settlement() {
            Settlement::Compensate => self
                .tools
                .compensate_while(&ctx, &step.args, &step.undo, None, &lease_live)
                .await
                .map(|()| {
                    "compensated (outcome was in doubt; compensation is safe either way)".to_owned()
                }),
            Settlement::Probe => match self.tools.probe(&ctx, &step.args, &step.undo).await {
                Ok(ProbeOutcome::Happened(output)) => self
                    .tools
                    .compensate_while(&ctx, &step.args, &step.undo, output.as_ref(), &lease_live)
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

/// Why `step` must wait, when a later step of its saga on one of its resources was not
/// compensated (`not_undone`: each such resource, with that step): the error its
/// compensation fails with, nothing run.
pub(crate) fn waits_for(step: &StepRecord, not_undone: &BTreeMap<&str, u32>) -> Option<ToolError> {
    step.resources.iter().find_map(|resource| {
        not_undone.get(resource.as_str()).map(|later| {
            ToolError::failed(format!(
                "not compensated: step {later}, later on the same resource `{resource}`, was not compensated, and undoing this step first would act under its effect; retry step {later}'s dead letter first, then this one"
            ))
        })
    })
}

/// The error of a step an undo does not compensate because a later saga's effect may cover
/// its own ([`Kernel::covered_by`]'s `reason`).
pub(crate) fn covered_error(reason: &str) -> String {
    format!(
        "{reason}; the compensation was not run (undo that saga first, or `--force` runs it anyway)"
    )
}

impl Kernel {
    /// Why an undo must not compensate `step` of `saga_id` now, if it must not: a later
    /// saga claimed one of the step's resources since the step began and was neither rolled
    /// back nor undone, so its effect may cover the step's. Compensated first, the step
    /// would act under that effect (an upstream, command or Python tool cannot tell), and
    /// the later saga's own undo would then put the step's effect back.
    ///
    /// # Errors
    ///
    /// [`KernelError::Log`] when the log cannot be read.
    pub(crate) async fn covered_by(
        &self,
        saga_id: &SagaId,
        step: &StepRecord,
    ) -> Result<Option<String>, KernelError> {
        for resource in &step.resources {
            if let Some(later) = self
                .log
                .later_claim(saga_id, resource, step.created_at_ms)
                .await?
            {
                return Ok(Some(format!(
                    "`{resource}` was claimed since by saga {} (step {}, {}), whose effect may cover this step's",
                    later.saga_id, later.step_seq, later.state
                )));
            }
        }
        Ok(None)
    }

    /// [`Kernel::covered_by`] for every committed step of `record` an undo compensates.
    ///
    /// # Errors
    ///
    /// [`KernelError::Log`] when the log cannot be read.
    pub(crate) async fn covered_steps(
        &self,
        record: &SagaRecord,
    ) -> Result<BTreeMap<u32, String>, KernelError> {
        let mut covered = BTreeMap::new();
        for step in &record.steps {
            if step.status != StepStatus::Commit || !Self::may_act(step) {
                continue;
            }
            if let Some(reason) = self.covered_by(&record.saga.saga_id, step).await? {
                covered.insert(step.step_seq, reason);
            }
        }
        Ok(covered)
    }
}
