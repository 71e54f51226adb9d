//! The step path: the one way a step of any saga (a plan's, a dry run's, a live saga's)
//! is admitted by the FSM, checked against its idempotency key, prepared, begun durably,
//! executed and recorded. Drivers (`plan.rs`, `live.rs`) decide only which step comes
//! next and what is known about the one after it.

use agent_kernel_api::{
    ApprovalDecision, ApprovalRecord, ApprovalRequest, BeginStep, ConsumeApproval, DecideApproval,
    DynTool, EffectClass, KeyBinding, LogWrite, NewSaga, PlanStep, SagaId, SagaRecord, SagaState,
    StepDenial, StepStatus, ToolError, ToolOutput, TxError, Undo, WriteOutcome,
};
use agent_kernel_fsm::{Denial, Event, Facts, Guardrail, Rule};
use tracing::{Instrument, debug, field, info, info_span, warn};

use crate::approval::approval_digest;
use crate::kernel::{Kernel, args_hash};
use crate::report::{Failure, Observer, SagaEvent, SagaReport, StepReport};
use crate::{KernelError, VALIDATE_HINT};

/// Step `step_seq` as the log records it before it begins (no undo data yet).
pub(crate) fn step_record(
    saga_id: &SagaId,
    step_seq: u32,
    step: &PlanStep,
    tool: &dyn DynTool,
) -> BeginStep {
    BeginStep {
        saga_id: saga_id.clone(),
        step_seq,
        tool_id: step.tool.clone(),
        tool_version: tool.version().to_owned(),
        effect: tool.effect(),
        args: step.args.clone(),
        args_hash: args_hash(&step.tool, &step.args),
        idempotency_key: step.idempotency_key.clone(),
        undo: Undo::none(),
    }
}

/// The error of a step the FSM denied.
pub(crate) fn step_denied(denial: Denial, tool: &str) -> ToolError {
    ToolError::denied(denial.with_tool(tool).to_string())
}

/// Whether a key's binding holds an output a step may reuse: committed, in a `Done` saga.
pub(crate) fn is_reusable(binding: &KeyBinding) -> bool {
    binding.status == StepStatus::Commit && binding.saga_state == SagaState::Done
}

/// What the driver knows, when a step's success is settled, about what follows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lookahead {
    /// Another step follows, of this effect class: a plan's next step, or a live saga's
    /// next call.
    Step(EffectClass),
    /// No step follows: a plan's last step, or a live saga's commit.
    End,
    /// Not known yet: a live saga's step, before its next call or commit. Never settled
    /// with: admission tries what may follow, settlement waits until it is known.
    Unknown,
}

impl Lookahead {
    /// What follows step `step_idx` of `steps`, by the effect class `effect_of` gives.
    pub(crate) fn in_plan(
        steps: &[PlanStep],
        step_idx: usize,
        effect_of: impl Fn(&str) -> Option<EffectClass>,
    ) -> Lookahead {
        match steps.get(step_idx + 1) {
            None => Lookahead::End,
            // An unknown tool is refused by preflight; as a step it counts as mutating.
            Some(next) => Lookahead::Step(effect_of(&next.tool).unwrap_or(EffectClass::Mutating)),
        }
    }

    /// The facts of a step's success with output hint `hint`, followed by this.
    pub(crate) fn facts(self, hint: Option<&str>) -> Facts {
        let asks_validation = hint == Some(VALIDATE_HINT);
        match self {
            Lookahead::Step(effect) => Facts {
                validation_next: asks_validation || effect == EffectClass::ReadOnly,
                more_steps: true,
                ..Facts::default()
            },
            Lookahead::End => Facts {
                validation_next: true,
                saga_complete: true,
                ..Facts::default()
            },
            Lookahead::Unknown => unreachable!("admission and settlement look at known cases"),
        }
    }
}

/// Whether a step's effect runs or is simulated (a dry run).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StepMode {
    /// `prepare`, a durable BEGIN, then `execute`.
    Run,
    /// `simulate` only; nothing is written until the driver writes the whole saga.
    Simulate,
}

/// Why the step path stopped short of a committed step.
#[derive(Debug)]
pub(crate) enum Stopped {
    /// The step failed or was refused: the driver rolls the saga back.
    Failed(Failure),
    /// The step waits for an operator's approval: nothing of it ran, the request and the
    /// saga's move to `AwaitingApproval` are durable, and the driver stops here.
    AwaitingApproval(ApprovalRequest),
}

/// A step that succeeded and whose success the FSM has not yet been told of: what follows
/// it decides the facts (a live saga learns that only at its next call or its commit).
#[derive(Debug, Clone)]
pub(crate) struct PendingSuccess {
    step_seq: u32,
    tool: String,
    hint: Option<String>,
}

/// A saga while a driver runs it: where it stands, what is queued for the log, what its
/// report will say.
#[derive(Debug)]
pub(crate) struct SagaInFlight {
    pub(crate) saga_id: SagaId,
    pub(crate) name: Option<String>,
    pub(crate) actor: Option<String>,
    /// Where the saga stands in memory.
    pub(crate) state: SagaState,
    /// Where the log says it stands, once the pending records are written.
    persisted: SagaState,
    pending: Vec<LogWrite>,
    /// The steps that committed (or were reused), in order, with their outputs.
    pub(crate) committed: Vec<StepReport>,
    /// The position of the next step.
    pub(crate) next_seq: u32,
    /// The last step's success, not yet settled with the FSM.
    pending_success: Option<PendingSuccess>,
    /// The idempotency keys of the steps taken so far, with their positions.
    keys: Vec<(String, u32)>,
    /// The approved request for the next step, when the saga resumes after a decision.
    approved: Option<ApprovalRecord>,
    /// The request the saga waits on, while it is `AwaitingApproval`.
    pub(crate) waiting_on: Option<ApprovalRequest>,
}

impl SagaInFlight {
    /// A saga about to be created by `saga`, whose record rides with its first write.
    pub(crate) fn start(saga: NewSaga, n_steps_hint: usize) -> SagaInFlight {
        SagaInFlight {
            saga_id: saga.saga_id.clone(),
            name: saga.name.clone(),
            actor: saga.actor.clone(),
            state: saga.state,
            persisted: saga.state,
            pending: vec![LogWrite::CreateSaga(saga)],
            committed: Vec::with_capacity(n_steps_hint),
            next_seq: 0,
            pending_success: None,
            keys: Vec::new(),
            approved: None,
            waiting_on: None,
        }
    }

    /// A saga read back from the log while it waits in `AwaitingApproval`, resuming in
    /// `state` (where `ApprovalGranted` leads) with `approval` granted for its next step.
    pub(crate) fn resumed(
        record: &SagaRecord,
        state: SagaState,
        approval: ApprovalRecord,
    ) -> SagaInFlight {
        let committed = record
            .steps
            .iter()
            .filter(|step| step.status == StepStatus::Commit)
            .map(|step| StepReport {
                seq: step.step_seq,
                tool: step.tool_id.clone(),
                status: step.status,
                output: step.output.clone(),
                error: None,
                compensation: None,
                reused: step.reused_from.is_some(),
            })
            .collect();
        SagaInFlight {
            saga_id: record.saga.saga_id.clone(),
            name: record.saga.name.clone(),
            actor: record.saga.actor.clone(),
            state,
            persisted: record.saga.state,
            pending: Vec::new(),
            committed,
            next_seq: approval.request.step_seq,
            pending_success: None,
            keys: record
                .steps
                .iter()
                .filter_map(|step| Some((step.idempotency_key.clone()?, step.step_seq)))
                .collect(),
            approved: None,
            waiting_on: None,
        }
        .granted(state, approval)
    }

    /// Grants `approval` for the next step: the saga moves to `state` (written with the
    /// step's BEGIN) and the step path consumes the request there.
    pub(crate) fn granted(mut self, state: SagaState, approval: ApprovalRecord) -> SagaInFlight {
        self.state = state;
        self.waiting_on = None;
        self.approved = Some(approval);
        self
    }

    /// Queues the voiding of the request the saga waits on (it rolls back instead), to be
    /// written with its move to `Compensating`.
    pub(crate) fn cancel_waiting(
        &mut self,
        by: &agent_kernel_api::Owner,
        uid: Option<u32>,
        now_ms: i64,
        why: &str,
    ) {
        if let Some(request) = self.waiting_on.take() {
            // Past its expiry it is recorded as expired, else as void.
            let (decision, user) = if now_ms >= request.expires_at_ms {
                (
                    ApprovalDecision::Expire,
                    "agent-kernel (expired undecided)".to_owned(),
                )
            } else {
                (ApprovalDecision::Cancel, format!("agent-kernel ({why})"))
            };
            self.pending.push(LogWrite::DecideApproval(DecideApproval {
                approval_id: request.approval_id,
                decision,
                by: by.clone(),
                uid,
                user: Some(user),
                note: None,
            }));
        }
    }

    /// The position of the step that used idempotency key `key`, if one did.
    pub(crate) fn step_with_key(&self, key: &str) -> Option<u32> {
        self.keys
            .iter()
            .find(|(used, _)| used == key)
            .map(|(_, step_seq)| *step_seq)
    }

    /// Records `step` as refused before it began (a denial, a cancellation, a failing
    /// `prepare`, a held key): its idempotency key is left alone. Returns `error`.
    pub(crate) fn refuse(&mut self, step: BeginStep, error: ToolError) -> ToolError {
        self.pending.push(LogWrite::RefuseStep {
            step,
            error: error.clone(),
        });
        error
    }

    /// The pending records plus the state change they caused, if any, for one write.
    pub(crate) fn take_batch(&mut self) -> Vec<LogWrite> {
        if self.state != self.persisted {
            self.pending.push(LogWrite::SetState {
                saga_id: self.saga_id.clone(),
                state: self.state,
            });
            self.persisted = self.state;
        }
        std::mem::take(&mut self.pending)
    }

    fn committed(&mut self, seq: u32, tool: &str, output: &ToolOutput, reused: bool) {
        self.committed.push(StepReport {
            seq,
            tool: tool.to_owned(),
            status: StepStatus::Commit,
            output: Some(output.clone()),
            error: None,
            compensation: None,
            reused,
        });
    }
}

impl Kernel {
    /// Whether the FSM lets a step of class `effect` execute in `state` and succeed there,
    /// followed by `lookahead`; checked before any log write for the step. When what
    /// follows is not known yet, the step is admitted if its success is allowed followed
    /// by any of what may come (a mutating step, a read-only one, the end): its settlement
    /// rules once it is known.
    pub(crate) fn admit_step(
        &self,
        state: SagaState,
        effect: EffectClass,
        lookahead: Lookahead,
    ) -> Result<(), Denial> {
        self.fsm.may_execute(state, effect)?;
        let event = Guardrail::success_event(state);
        let candidates: &[Lookahead] = match lookahead {
            Lookahead::Unknown => &[
                Lookahead::Step(EffectClass::Mutating),
                Lookahead::Step(EffectClass::ReadOnly),
                Lookahead::End,
            ],
            known => &[known],
        };
        let mut first_denial = None;
        for candidate in candidates {
            match self.fsm.apply(state, event, &candidate.facts(None)) {
                Ok(_) => return Ok(()),
                Err(denial) => {
                    first_denial.get_or_insert(denial);
                }
            }
        }
        Err(first_denial.expect("at least one candidate was tried"))
    }

    /// Records `step` as the saga's next step, refused before it began with `error` (a
    /// cancellation, say); returns the failure to roll back for.
    pub(crate) fn refuse_step(
        &self,
        saga: &mut SagaInFlight,
        step: &PlanStep,
        tool: &dyn DynTool,
        error: ToolError,
    ) -> Failure {
        let step_seq = saga.next_seq;
        saga.next_seq += 1;
        let begin = step_record(&saga.saga_id, step_seq, step, tool);
        Failure {
            step_seq,
            tool: step.tool.clone(),
            error: saga.refuse(begin, error),
        }
    }

    /// Takes `step` as the saga's next step: the FSM admits it (with what the driver knows
    /// of what follows, `lookahead`), its idempotency key is looked up (a committed output
    /// is reused), and then, under [`StepMode::Run`], `prepare` captures the undo data, the
    /// BEGIN is written durably (with whatever the saga had queued), `execute` runs and its
    /// outcome is queued; under [`StepMode::Simulate`], `simulate` stands in for the effect
    /// and nothing is written.
    ///
    /// On success the step's report is added and its success waits for
    /// [`settle`](Self::settle), which the driver calls once it knows what follows. `Ok(Err)`
    /// is a step that failed or was refused: the driver rolls the saga back.
    ///
    /// # Errors
    ///
    /// [`KernelError::Log`] when the log fails.
    pub(crate) async fn take_step(
        &self,
        saga: &mut SagaInFlight,
        step: &PlanStep,
        lookahead: Lookahead,
        mode: StepMode,
        rest: Option<&[PlanStep]>,
        observer: &dyn Observer,
    ) -> Result<Result<(), Stopped>, KernelError> {
        assert!(
            saga.pending_success.is_none(),
            "the previous step's success is settled before the next step"
        );
        let tool = self
            .tools
            .get(&step.tool)
            .expect("every step's tool was checked to be registered")
            .clone();
        let step_seq = saga.next_seq;
        saga.next_seq += 1;
        if let Some(key) = &step.idempotency_key {
            saga.keys.push((key.clone(), step_seq));
        }
        let ctx = self.context(
            &saga.saga_id,
            step_seq,
            &step.tool,
            step.idempotency_key.as_deref(),
            saga.actor.as_deref(),
        );
        let begin = step_record(&saga.saga_id, step_seq, step, tool.as_ref());
        let fail = |error: ToolError| {
            Stopped::Failed(Failure {
                step_seq,
                tool: step.tool.clone(),
                error,
            })
        };

        // The FSM rules on the step before anything about it is written.
        if let Err(denial) = self.admit_step(saga.state, tool.effect(), lookahead) {
            let error = step_denied(denial, &step.tool);
            warn!(saga_id = %saga.saga_id, step_seq, tool = %step.tool, %error, "step denied");
            // Never begun: recorded as refused, its idempotency key left alone.
            return Ok(Err(fail(saga.refuse(begin, error))));
        }
        let approved = saga.approved.take();

        let binding = match &step.idempotency_key {
            Some(key) => self
                .log
                .key_binding(key)
                .await?
                .filter(|binding| binding.args_hash == begin.args_hash),
            None => None,
        };
        if let Some(binding) = &binding
            && is_reusable(binding)
            && let Some(output) = &binding.output
        {
            debug!(saga_id = %saga.saga_id, step_seq, key = %binding.key, from = %binding.saga_id, "reusing committed output");
            saga.committed(step_seq, &step.tool, output, true);
            saga.pending_success = Some(PendingSuccess {
                step_seq,
                tool: step.tool.clone(),
                hint: output.next_hint.clone(),
            });
            saga.pending.push(LogWrite::ReuseStep {
                step: begin,
                from_saga_id: binding.saga_id.clone(),
                from_step_seq: binding.step_seq,
                output: output.clone(),
            });
            observer.on_event(&SagaEvent::StepFinished {
                step_seq,
                tool: &step.tool,
                status: StepStatus::Commit,
            });
            return Ok(Ok(()));
        }

        let result = match mode {
            StepMode::Simulate => {
                if let Some(binding) = &binding
                    && !binding.is_released()
                {
                    // A run would find the key held and stop here, as the log's claim would.
                    let error = ToolError::failed(format!(
                        "idempotency key `{}` is held by saga {} step {} (status {}, saga {})",
                        binding.key,
                        binding.saga_id,
                        binding.step_seq,
                        binding.status,
                        binding.saga_state
                    ));
                    return Ok(Err(fail(saga.refuse(begin, error))));
                }
                let simulated = tool.simulate(&ctx, &step.args).await;
                saga.pending.push(LogWrite::SimulateStep {
                    step: begin,
                    result: simulated.clone(),
                });
                simulated
            }
            StepMode::Run => {
                let mut consume = None;
                if let Some(reason) = self.approval_reason(&step.tool, tool.as_ref()) {
                    let digest = approval_digest(&saga.saga_id, step_seq, &step.tool, &step.args);
                    match approved.filter(|approval| approval.request.step_seq == step_seq) {
                        Some(approval) => {
                            let request = &approval.request;
                            if request.digest != digest
                                || request.tool_id != step.tool
                                || request.args != step.args
                            {
                                let differs = if request.tool_id != step.tool {
                                    "its tool differs"
                                } else if request.args != step.args {
                                    "its arguments differ"
                                } else {
                                    "its digest differs"
                                };
                                let error = ToolError::denied(format!(
                                    "approval {} was given for another step than this one: {differs} (the request's digest {}, this step's {digest})",
                                    request.approval_id, request.digest
                                ));
                                return Ok(Err(fail(saga.refuse(begin, error))));
                            }
                            consume = Some(ConsumeApproval {
                                approval_id: request.approval_id.clone(),
                                saga_id: saga.saga_id.clone(),
                                step_seq,
                                tool_id: step.tool.clone(),
                                args: step.args.clone(),
                                digest,
                            });
                        }
                        None => {
                            return self
                                .await_approval(saga, step_seq, step, &begin, rest, &reason)
                                .await;
                        }
                    }
                }
                let step_span =
                    info_span!("step", step = step_seq, tool = %step.tool, outcome = field::Empty);
                let prepared = self
                    .tools
                    .prepare(&ctx, &step.args)
                    .instrument(step_span.clone())
                    .await;
                let undo = match prepared {
                    Ok(undo) => undo,
                    Err(error) => {
                        step_span.record("outcome", "fail");
                        // `prepare` has no side effects, so whatever went wrong, nothing
                        // happened. Never begun: recorded as refused, its key left alone.
                        return Ok(Err(fail(saga.refuse(begin, error.not_applied()))));
                    }
                };
                let refused_as = consume.as_ref().map(|_| begin.clone());
                if let Some(consume) = consume {
                    // Used once, in the same transaction as the step's BEGIN.
                    saga.pending.push(LogWrite::ConsumeApproval(consume));
                }
                saga.pending
                    .push(LogWrite::BeginStep(BeginStep { undo, ..begin }));
                // The intent (and what the saga had queued) is durable before the effect.
                let batch = saga.take_batch();
                let begin_idx = batch
                    .iter()
                    .position(|write| matches!(write, LogWrite::BeginStep(_)))
                    .expect("the batch holds this step's BEGIN");
                let outcomes = match self.write_saga_batch(saga, batch).await {
                    Err(KernelError::Log(TxError::ApprovalUnusable {
                        approval_id,
                        reason,
                    })) => {
                        // Nothing of the batch was written and the step never began: an
                        // approval the log does not vouch for is a denial, and void.
                        warn!(saga_id = %saga.saga_id, step_seq, %approval_id, %reason, "approval unusable");
                        saga.pending.push(LogWrite::DecideApproval(DecideApproval {
                            approval_id: approval_id.clone(),
                            decision: ApprovalDecision::Cancel,
                            by: self.env.owner.clone(),
                            uid: self.operator_uid(),
                            user: Some("agent-kernel (the approval could not be used)".to_owned()),
                            note: Some(reason.clone()),
                        }));
                        let error = ToolError::denied(format!(
                            "approval {approval_id} cannot be used for this step: {reason}"
                        ));
                        let begin = refused_as.expect("only a consumed approval is refused");
                        return Ok(Err(fail(saga.refuse(begin, error))));
                    }
                    other => other?,
                };
                if let Some(WriteOutcome::KeyRejected(reason)) = outcomes.get(begin_idx) {
                    return Ok(Err(fail(ToolError::failed(reason.clone()))));
                }
                // On a log shared by many machines the effect starts only while this
                // process's lease is certainly live: cut off past it, another process may
                // have taken the saga over (and compensated a change not yet made).
                self.log.effect_allowed()?;
                // And each retry only while it still is.
                let lease_live = || self.log.effect_allowed().is_ok();
                let executed = self
                    .tools
                    .execute_while(&ctx, &step.args, &lease_live)
                    .instrument(step_span.clone())
                    .await;
                step_span.record("outcome", if executed.is_ok() { "commit" } else { "fail" });
                // An event after the record, so logs show the span with its outcome.
                debug!(parent: &step_span, "step executed");
                match &executed {
                    Ok(output) => saga.pending.push(LogWrite::CommitStep {
                        saga_id: saga.saga_id.clone(),
                        step_seq,
                        output: output.clone(),
                    }),
                    Err(error) => {
                        info!(saga_id = %saga.saga_id, step_seq, tool = %step.tool, %error, "step failed");
                        saga.pending.push(LogWrite::FailStep {
                            saga_id: saga.saga_id.clone(),
                            step_seq,
                            error: error.clone(),
                        });
                    }
                }
                executed
            }
        };
        match result {
            Ok(output) => {
                saga.committed(step_seq, &step.tool, &output, false);
                saga.pending_success = Some(PendingSuccess {
                    step_seq,
                    tool: step.tool.clone(),
                    hint: output.next_hint,
                });
                observer.on_event(&SagaEvent::StepFinished {
                    step_seq,
                    tool: &step.tool,
                    status: StepStatus::Commit,
                });
                Ok(Ok(()))
            }
            Err(error) => {
                observer.on_event(&SagaEvent::StepFinished {
                    step_seq,
                    tool: &step.tool,
                    status: StepStatus::Fail,
                });
                Ok(Err(fail(error)))
            }
        }
    }

    /// Parks step `step_seq` for an operator's approval: the FSM's `ApprovalRequested`, then
    /// the request and the saga's move to `AwaitingApproval`, with whatever the saga had
    /// queued, in one synced write. Nothing of the step ran; its position and key stay free
    /// for when it resumes.
    async fn await_approval(
        &self,
        saga: &mut SagaInFlight,
        step_seq: u32,
        step: &PlanStep,
        begin: &BeginStep,
        rest: Option<&[PlanStep]>,
        reason: &str,
    ) -> Result<Result<(), Stopped>, KernelError> {
        saga.next_seq = step_seq;
        if let Some(key) = &step.idempotency_key {
            saga.keys
                .retain(|(used, seq)| !(used == key && *seq == step_seq));
        }
        let state = match self.fsm.apply(
            saga.state,
            Event::ApprovalRequested,
            &agent_kernel_fsm::Facts::default(),
        ) {
            Ok(state) => state,
            Err(denial) => {
                saga.next_seq = step_seq + 1;
                let error = step_denied(denial, &step.tool);
                warn!(saga_id = %saga.saga_id, step_seq, tool = %step.tool, %error, reason, "a step that needs an approval was denied");
                return Ok(Err(Stopped::Failed(Failure {
                    step_seq,
                    tool: step.tool.clone(),
                    error: saga.refuse(begin.clone(), error),
                })));
            }
        };
        let request = self.approval_request(saga, step_seq, step, rest);
        saga.state = state;
        saga.pending
            .push(LogWrite::RequestApproval(request.clone()));
        let batch = saga.take_batch();
        self.write_saga_batch(saga, batch).await?;
        saga.waiting_on = Some(request.clone());
        info!(saga_id = %saga.saga_id, step_seq, tool = %step.tool, approval_id = %request.approval_id, reason, "the step waits for an operator's approval");
        Ok(Err(Stopped::AwaitingApproval(request)))
    }

    /// Tells the FSM of the last step's success, now that what follows it is known; after
    /// the last step (`Lookahead::End`), through the closing validation
    /// (`Validating --ValidationPassed--> Done`). A denial is the failure of that step: the
    /// effect happened and is committed, but the saga cannot go on.
    pub(crate) fn settle(
        &self,
        saga: &mut SagaInFlight,
        lookahead: Lookahead,
    ) -> Result<(), Failure> {
        let Some(pending) = saga.pending_success.take() else {
            return Ok(());
        };
        let facts = lookahead.facts(pending.hint.as_deref());
        let fail = |denial: Denial| Failure {
            step_seq: pending.step_seq,
            tool: pending.tool.clone(),
            error: step_denied(denial, &pending.tool),
        };
        let event = Guardrail::success_event(saga.state);
        saga.state = self.fsm.apply(saga.state, event, &facts).map_err(fail)?;
        if facts.saga_complete && saga.state == SagaState::Validating {
            // The end of a saga is a validation: every step committed.
            saga.state = self
                .fsm
                .apply(saga.state, Event::ValidationPassed, &facts)
                .map_err(fail)?;
        }
        if facts.saga_complete && saga.state != SagaState::Done {
            return Err(fail(Denial {
                state: saga.state,
                event: Some(event),
                tool: None,
                rule: Rule::NotInTable,
            }));
        }
        Ok(())
    }

    /// Writes what the saga queued and its move to `Done` (durable before it is reported),
    /// and returns its report.
    ///
    /// # Errors
    ///
    /// [`KernelError::Log`] when the log fails.
    pub(crate) async fn finish_done(
        &self,
        mut saga: SagaInFlight,
    ) -> Result<SagaReport, KernelError> {
        assert_eq!(
            saga.state,
            SagaState::Done,
            "a saga without failure ends Done"
        );
        let batch = saga.take_batch();
        self.write_saga_batch(&saga, batch).await?;
        info!(saga_id = %saga.saga_id, "saga done");
        Ok(SagaReport {
            saga_id: saga.saga_id,
            state: SagaState::Done,
            steps: saga.committed,
            failure: None,
            dry_run: false,
            approval: None,
        })
    }

    /// Moves a failing saga to `Compensating` (with what it queued), then compensates every
    /// step whose effect may be in place, last first, and returns its report.
    ///
    /// # Errors
    ///
    /// [`KernelError::Log`] when the log fails.
    pub(crate) async fn fail_saga(
        &self,
        mut saga: SagaInFlight,
        failure: Option<Failure>,
        observer: &dyn Observer,
    ) -> Result<SagaReport, KernelError> {
        saga.pending_success = None;
        // A saga that waited for an approval rolls back instead: the request is void.
        saga.cancel_waiting(
            &self.env.owner,
            self.operator_uid(),
            self.env.clock.now_ms(),
            "its saga was rolled back while it waited",
        );
        saga.state = self.enter_compensating(&saga.saga_id, saga.state);
        let batch = saga.take_batch();
        self.write_saga_batch(&saga, batch).await?;
        let record = self.load(&saga.saga_id).await?;
        self.compensate_saga(record, failure, observer).await
    }

    /// Writes a batch of a running saga. The batch that creates the saga may find its actor
    /// busy (another process started a saga for it since the start was checked): nothing of
    /// it is written, and the saga is denied as the FSM's `actor_idle` guard would.
    pub(crate) async fn write_saga_batch(
        &self,
        saga: &SagaInFlight,
        batch: Vec<LogWrite>,
    ) -> Result<Vec<WriteOutcome>, KernelError> {
        match self.log.write(batch).await {
            Err(TxError::ActorBusy { actor, saga_id }) => {
                warn!(%actor, busy = %saga_id, "actor busy: another saga started first");
                let denial = self.actor_busy_denial();
                self.record_plan_denied(
                    saga.name.clone(),
                    saga.actor.clone(),
                    false,
                    vec![StepDenial {
                        step_idx: None,
                        tool: None,
                        args: None,
                        reason: format!(
                            "{denial} (saga {saga_id} of actor `{actor}` is unfinished)"
                        ),
                    }],
                )
                .await;
                Err(KernelError::Denied {
                    saga_id: None,
                    denial,
                })
            }
            other => Ok(other?),
        }
    }
}
