//! The step path: the one way a step of any saga (a plan's, a dry run's, a live saga's)
//! is admitted by the FSM, checked against its idempotency key, prepared, begun durably,
//! executed and recorded. Drivers (`plan.rs`, `live.rs`) decide only which step comes
//! next and what is known about the one after it.

use agent_kernel_api::{
    ApprovalRecord, ApprovalRequest, BeginStep, ConsumeApproval, DynTool, EffectClass, KeyBinding,
    LockHolder, LogWrite, PlanStep, SagaId, SagaState, StepDenial, StepStatus, ToolContext,
    ToolError, ToolOutput, TxError, Undo, WriteOutcome,
};
use agent_kernel_fsm::{Denial, Event, Facts, Guardrail, Rule};
use std::time::Duration;
use tracing::{Instrument, debug, field, info, info_span, warn};

use crate::conflict::Conflict;
pub(crate) use crate::in_flight::{PendingSuccess, SagaInFlight};
use crate::isolation::{Declared, LOCK_POLL_INTERVAL, MAX_LOCK_PAUSE};
use crate::kernel::{Kernel, args_hash};
use crate::report::{Failure, Observer, SagaEvent, SagaReport};
use crate::{KernelError, VALIDATE_HINT};

mod approval;

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
        resources: Vec::new(),
        duplicate_keys: Vec::new(),
        duplicate_check: None,
    }
}

/// Why a BEGIN was refused, nothing of its step written.
enum BeginRefused {
    /// Another unsettled saga holds this resource.
    Conflict(LockHolder),
    /// The call may repeat this step, begun since the look for duplicates.
    Duplicate(Box<agent_kernel_api::DuplicateStep>),
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

/// How the step path ended for one step.
#[derive(Debug)]
pub(crate) enum StepEnd {
    /// The step committed, or reused a committed output: its success waits for
    /// [`Kernel::settle`].
    Taken,
    /// The step failed or was refused: the driver rolls the saga back.
    Failed(Failure),
    /// The step waits for an operator's approval: nothing of it ran, the request and the
    /// saga's move to `AwaitingApproval` are durable, and the driver stops here.
    AwaitingApproval(ApprovalRequest),
    /// Another unsettled saga holds a resource the step would claim: nothing of the step
    /// was written but its `LockConflict` audit record (whatever the saga had queued was);
    /// the driver refuses the step (`begin`, at its position) or gives its position back.
    Conflict {
        /// What held it.
        conflict: Conflict,
        /// The step's BEGIN as it would have been written.
        begin: Box<BeginStep>,
        /// The approval the step would have consumed, left unused: a live saga keeps it
        /// for the same call again, a plan cancels it as it rolls back.
        approved: Option<Box<ApprovalRecord>>,
    },
}

/// Why the phases of a step stopped before its outcome: the step ended, or the log failed.
enum Halt {
    End(Box<StepEnd>),
    Log(KernelError),
}

impl From<KernelError> for Halt {
    fn from(error: KernelError) -> Halt {
        Halt::Log(error)
    }
}

impl From<TxError> for Halt {
    fn from(error: TxError) -> Halt {
        Halt::Log(error.into())
    }
}

/// The step being taken: what every phase needs of it.
struct Taking<'a> {
    step: &'a PlanStep,
    step_seq: u32,
    tool: std::sync::Arc<dyn DynTool>,
    ctx: ToolContext,
    /// Its BEGIN record, without undo data.
    begin: BeginStep,
}

impl Taking<'_> {
    /// The step's end for `error`.
    fn ended(&self, error: ToolError) -> StepEnd {
        StepEnd::Failed(Failure {
            step_seq: self.step_seq,
            tool: self.step.tool.clone(),
            error,
        })
    }

    /// The step failed with `error`.
    fn failed(&self, error: ToolError) -> Halt {
        Halt::End(Box::new(self.ended(error)))
    }

    /// The step is recorded as refused before it began with `error`, its idempotency key
    /// left alone.
    fn refused(&self, saga: &mut SagaInFlight, error: ToolError) -> Halt {
        let error = saga.refuse(self.begin.clone(), error);
        self.failed(error)
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

    /// Takes `step` as the saga's next step, phase by phase: [`admit`](Self::admit) (the
    /// FSM, with what the driver knows of what follows, `lookahead`), [`reuse`](Self::reuse)
    /// (a committed output under the step's idempotency key), then under
    /// [`StepMode::Simulate`] [`simulate`](Self::simulate_step) and nothing written, and
    /// under [`StepMode::Run`] [`approve`](Self::approve), [`prepare`](Self::prepare_step)
    /// (the undo data), [`begin`](Self::begin_step) (the BEGIN written durably, with whatever
    /// the saga had queued) and [`execute`](Self::execute_step) (its outcome queued); and
    /// last [`finish`](Self::finish_step), which reports the step.
    ///
    /// On [`StepEnd::Taken`] the step's report is added and its success waits for
    /// [`settle`](Self::settle), which the driver calls once it knows what follows. On
    /// [`StepEnd::Failed`] the driver rolls the saga back; on [`StepEnd::AwaitingApproval`]
    /// it stops.
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
    ) -> Result<StepEnd, KernelError> {
        assert!(
            saga.pending_success.is_none(),
            "the previous step's success is settled before the next step"
        );
        let taking = self.open_step(saga, step);
        let outcome = match self.step_phases(saga, &taking, lookahead, mode, rest).await {
            Ok(outcome) => outcome,
            Err(Halt::End(end)) => {
                if matches!(*end, StepEnd::Taken) {
                    observer.on_event(&SagaEvent::StepFinished {
                        saga_id: &saga.saga_id,
                        step_seq: taking.step_seq,
                        tool: &step.tool,
                        status: StepStatus::Commit,
                    });
                }
                return Ok(*end);
            }
            Err(Halt::Log(error)) => return Err(error),
        };
        Ok(Self::finish_step(saga, &taking, outcome, observer))
    }

    /// The phases after the step is opened; `Ok` is the outcome of its effect (or of its
    /// simulation), `Err` a step that ended before it, or the log's failure.
    async fn step_phases(
        &self,
        saga: &mut SagaInFlight,
        taking: &Taking<'_>,
        lookahead: Lookahead,
        mode: StepMode,
        rest: Option<&[PlanStep]>,
    ) -> Result<Result<ToolOutput, ToolError>, Halt> {
        self.admit(saga, taking, lookahead)?;
        let approved = saga.approved.take();
        let unused = approved.clone();
        let binding = self.reuse(saga, taking).await?;
        if mode == StepMode::Simulate {
            return self.simulate_step(saga, taking, binding.as_ref()).await;
        }
        let declared = Self::declare(saga, taking).await?;
        let consume = self
            .approve(saga, taking, approved, rest, &declared.duplicate_keys)
            .await?;
        let span = info_span!("step", step = taking.step_seq, tool = %taking.step.tool, outcome = field::Empty);
        // Test-only, never in a build you ship: a known bug planted (the effect runs before
        // its intent is logged) so that the simulator can show it finds it.
        #[cfg(feature = "sim-plant-begin-after-effect")]
        let early = Some(self.run_effect(taking, &span).await);
        #[cfg(not(feature = "sim-plant-begin-after-effect"))]
        let early = None;
        let begin = match self
            .begin_step(
                saga,
                taking,
                declared,
                (consume, unused.as_ref()),
                rest,
                &span,
            )
            .await
        {
            Err(Halt::End(mut end)) => {
                if let StepEnd::Conflict { approved, .. } = end.as_mut() {
                    *approved = unused.map(Box::new);
                }
                return Err(Halt::End(end));
            }
            other => other?,
        };
        // On a log shared by many machines the effect starts only while this process's
        // lease is certainly live: cut off past it, another process may have taken the
        // saga over (and compensated a change not yet made).
        self.log.effect_allowed()?;
        if let Some(error) = self
            .prepared_world_changed(&taking.ctx, &taking.step.args, taking.tool.as_ref(), &begin)
            .await
        {
            span.record("outcome", "fail");
            saga.pending.push(LogWrite::FailStep {
                saga_id: saga.saga_id.clone(),
                step_seq: taking.step_seq,
                error: error.clone(),
            });
            return Ok(Err(error));
        }
        Ok(self.execute_step(saga, taking, &span, early).await)
    }

    /// The step as the saga's next: its position, its key noted, its tool, context and
    /// BEGIN record.
    fn open_step<'a>(&self, saga: &mut SagaInFlight, step: &'a PlanStep) -> Taking<'a> {
        let tool = self
            .tools
            .get(&step.tool)
            .expect("every step's tool was checked to be registered");
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
        Taking {
            step,
            step_seq,
            tool,
            ctx,
            begin,
        }
    }

    /// Admission: the FSM rules on the step before anything about it is written; a denied
    /// step is recorded as refused, its idempotency key left alone.
    fn admit(
        &self,
        saga: &mut SagaInFlight,
        taking: &Taking<'_>,
        lookahead: Lookahead,
    ) -> Result<(), Halt> {
        let Err(denial) = self.admit_step(saga.state, taking.tool.effect(), lookahead) else {
            return Ok(());
        };
        let error = step_denied(denial, &taking.step.tool);
        warn!(saga_id = %saga.saga_id, step_seq = taking.step_seq, tool = %taking.step.tool, %error, "step denied");
        Err(taking.refused(saga, error))
    }

    /// Declaration: the resources the step would claim and the keys that would make a later
    /// call its duplicate, from its arguments, before anything of it runs; a tool that
    /// cannot name them refuses the step.
    async fn declare(saga: &mut SagaInFlight, taking: &Taking<'_>) -> Result<Declared, Halt> {
        let (ctx, args) = (&taking.ctx, &taking.step.args);
        let declared = async {
            Ok(Declared {
                resources: taking.tool.resources(ctx, args).await?,
                duplicate_keys: taking.tool.duplicate_keys(ctx, args).await?,
            })
        };
        declared
            .await
            .map_err(|error: ToolError| taking.refused(saga, error.not_applied()))
    }

    /// Reuse: a committed output under the step's idempotency key, in a `Done` saga, for the
    /// same arguments, is the step's output, and nothing runs. Otherwise the key's binding
    /// for these arguments, if any, for the next phases.
    async fn reuse(
        &self,
        saga: &mut SagaInFlight,
        taking: &Taking<'_>,
    ) -> Result<Option<KeyBinding>, Halt> {
        let Some(key) = &taking.step.idempotency_key else {
            return Ok(None);
        };
        let binding = self
            .log
            .key_binding(key)
            .await?
            .filter(|binding| binding.args_hash == taking.begin.args_hash);
        let Some(binding) = binding else {
            return Ok(None);
        };
        let Some(output) = binding.output.as_ref().filter(|_| is_reusable(&binding)) else {
            return Ok(Some(binding));
        };
        // A `Done` saga that holds its resources again is being undone (an `undo` under
        // way, or killed and left for `recover` to finish): its effect is about to go, so
        // its output is not reused, nor is the step run under the key meanwhile.
        let origin = self.log.saga(&binding.saga_id).await?;
        if let Some(origin) = origin.filter(|origin| !origin.locks.is_empty()) {
            let error = ToolError::conflict(format!(
                "idempotency key `{}`: its output belongs to saga {}, which an undo is undoing (it holds {} again); try again once that saga is settled, or run `agent-kernel recover` if the undo's process is gone",
                binding.key,
                binding.saga_id,
                origin.locks.join(", ")
            ));
            return Err(taking.refused(saga, error));
        }
        debug!(saga_id = %saga.saga_id, step_seq = taking.step_seq, key = %binding.key, from = %binding.saga_id, "reusing committed output");
        saga.committed(taking.step_seq, &taking.step.tool, output, true);
        saga.pending_success = Some(PendingSuccess {
            step_seq: taking.step_seq,
            tool: taking.step.tool.clone(),
            hint: output.next_hint.clone(),
        });
        saga.pending.push(LogWrite::ReuseStep {
            step: taking.begin.clone(),
            from_saga_id: binding.saga_id.clone(),
            from_step_seq: binding.step_seq,
            output: output.clone(),
        });
        Err(Halt::End(Box::new(StepEnd::Taken)))
    }

    /// A dry run's step: `simulate` stands in for the effect, and its record waits for the
    /// driver to write the whole saga. A key held by another saga stops it as a run would.
    async fn simulate_step(
        &self,
        saga: &mut SagaInFlight,
        taking: &Taking<'_>,
        binding: Option<&KeyBinding>,
    ) -> Result<Result<ToolOutput, ToolError>, Halt> {
        if let Some(binding) = binding
            && !binding.is_released()
        {
            let error = ToolError::failed(format!(
                "idempotency key `{}` is held by saga {} step {} (status {}, saga {})",
                binding.key, binding.saga_id, binding.step_seq, binding.status, binding.saga_state
            ));
            return Err(taking.refused(saga, error));
        }
        let simulated = taking.tool.simulate(&taking.ctx, &taking.step.args).await;
        saga.pending.push(LogWrite::SimulateStep {
            step: taking.begin.clone(),
            result: simulated.clone(),
        });
        Ok(simulated)
    }

    /// Preparation: `prepare` captures the undo data. It has no side effects, so whatever
    /// went wrong, nothing happened: a failure is a step refused before it began.
    async fn prepare_step(
        &self,
        saga: &mut SagaInFlight,
        taking: &Taking<'_>,
        span: &tracing::Span,
    ) -> Result<Undo, Halt> {
        let prepared = self
            .tools
            .prepare(&taking.ctx, &taking.step.args)
            .instrument(span.clone())
            .await;
        prepared.map_err(|error| {
            span.record("outcome", "fail");
            taking.refused(saga, error.not_applied())
        })
    }

    /// Preparation and the BEGIN: the undo data captured, then the step's intent, its undo
    /// data, its claim on its resources, the approval it consumes and whatever the saga had
    /// queued, durable in one write before the effect. A resource another saga holds is
    /// claimed again, prepared again first (the holder may have changed it meanwhile), until
    /// `[limits] lock_wait_ms` has passed; then the step ends unbegun, as it does for an
    /// approval the log does not vouch for or an idempotency key it will not bind. The BEGIN
    /// as written.
    ///
    /// `approval` is the approval the BEGIN consumes, if any, and the saga's approval for
    /// its current step, if it has one (consumed or not).
    async fn begin_step(
        &self,
        saga: &mut SagaInFlight,
        taking: &Taking<'_>,
        declared: Declared,
        approval: (Option<ConsumeApproval>, Option<&ApprovalRecord>),
        rest: Option<&[PlanStep]>,
        span: &tracing::Span,
    ) -> Result<BeginStep, Halt> {
        let (consume, approved) = approval;
        let consumed = approved
            .filter(|_| consume.is_some())
            .map(|approval| &approval.request);
        let wait_ms = self.tools.limits().lock_wait_ms;
        let started_ms = self.env.clock.now_ms();
        let mut pause = LOCK_POLL_INTERVAL;
        let mut begin = BeginStep {
            duplicate_check: self.duplicate_check(&declared.duplicate_keys, consumed),
            resources: declared.resources,
            duplicate_keys: declared.duplicate_keys,
            ..taking.begin.clone()
        };
        loop {
            begin.undo = self.prepare_step(saga, taking, span).await?;
            let holder = match self
                .write_begin(saga, taking, &begin, consume.clone())
                .await?
            {
                None => return Ok(begin),
                Some(BeginRefused::Conflict(holder)) => holder,
                Some(BeginRefused::Duplicate(earlier)) => {
                    return Err(self
                        .stopped_as_duplicate(saga, taking, rest, (consume, approved), *earlier)
                        .await?);
                }
            };
            let elapsed_ms = u64::try_from(self.env.clock.now_ms() - started_ms).unwrap_or(0);
            if elapsed_ms < wait_ms {
                // Claimed again after a pause that doubles, so a long wait leaves few
                // refused claims in the chain.
                let left = Duration::from_millis(wait_ms - elapsed_ms);
                tokio::time::sleep(pause.min(left)).await;
                pause = (pause * 2).min(MAX_LOCK_PAUSE);
                continue;
            }
            // Without a wait, the claim was refused at once.
            let waited_ms = if wait_ms == 0 { 0 } else { elapsed_ms };
            let conflict = self.conflict(&taking.step.tool, holder, waited_ms).await?;
            warn!(saga_id = %saga.saga_id, step_seq = taking.step_seq, tool = %taking.step.tool, %conflict, "step refused: conflict");
            return Err(Halt::End(Box::new(StepEnd::Conflict {
                conflict,
                begin: Box::new(begin),
                approved: None,
            })));
        }
    }

    /// One attempt at the BEGIN's write; why it was refused before anything of the step
    /// was written: a resource another saga holds, or an earlier step it may repeat.
    async fn write_begin(
        &self,
        saga: &mut SagaInFlight,
        taking: &Taking<'_>,
        begin: &BeginStep,
        consume: Option<ConsumeApproval>,
    ) -> Result<Option<BeginRefused>, Halt> {
        let consumes = consume.is_some();
        if let Some(consume) = consume {
            // Used once, in the same transaction as the step's BEGIN.
            saga.pending.push(LogWrite::ConsumeApproval(consume));
        }
        saga.pending.push(LogWrite::BeginStep(begin.clone()));
        let batch = saga.take_batch();
        let begin_idx = batch
            .iter()
            .position(|write| matches!(write, LogWrite::BeginStep(_)))
            .expect("the batch holds this step's BEGIN");
        let outcomes = match self.write_saga_batch(saga, batch).await {
            Err(KernelError::Log(TxError::ApprovalUnusable {
                approval_id,
                reason,
            })) if consumes => {
                return Err(self.approval_unusable(saga, taking, approval_id, reason));
            }
            other => other?,
        };
        match outcomes.get(begin_idx) {
            Some(WriteOutcome::KeyRejected(reason)) => {
                Err(taking.failed(ToolError::failed(reason.clone())))
            }
            Some(WriteOutcome::Conflict(holder)) => {
                Ok(Some(BeginRefused::Conflict((**holder).clone())))
            }
            Some(WriteOutcome::Duplicate(earlier)) => {
                Ok(Some(BeginRefused::Duplicate(earlier.clone())))
            }
            _ => Ok(None),
        }
    }

    /// The effect, each retry only while this process may still act on a shared log.
    async fn run_effect(
        &self,
        taking: &Taking<'_>,
        span: &tracing::Span,
    ) -> Result<ToolOutput, ToolError> {
        let lease_live = || self.log.effect_allowed().is_ok();
        self.tools
            .execute_while(&taking.ctx, &taking.step.args, &lease_live)
            .instrument(span.clone())
            .await
    }

    /// Execution: the effect, each retry only while this process may still act on a shared
    /// log; its outcome is queued for the next write.
    /// `early` is the outcome of an effect already run (only under a planted bug).
    async fn execute_step(
        &self,
        saga: &mut SagaInFlight,
        taking: &Taking<'_>,
        span: &tracing::Span,
        early: Option<Result<ToolOutput, ToolError>>,
    ) -> Result<ToolOutput, ToolError> {
        let executed = match early {
            Some(executed) => executed,
            None => self.run_effect(taking, span).await,
        };
        span.record("outcome", if executed.is_ok() { "commit" } else { "fail" });
        // An event after the record, so logs show the span with its outcome.
        debug!(parent: span, "step executed");
        let (saga_id, step_seq) = (saga.saga_id.clone(), taking.step_seq);
        saga.pending.push(match &executed {
            Ok(output) => LogWrite::CommitStep {
                saga_id,
                step_seq,
                output: output.clone(),
            },
            Err(error) => {
                info!(%saga_id, step_seq, tool = %taking.step.tool, %error, "step failed");
                LogWrite::FailStep {
                    saga_id,
                    step_seq,
                    error: error.clone(),
                }
            }
        });
        executed
    }

    /// The step's end: a success is reported and waits to be settled; a failure ends it.
    fn finish_step(
        saga: &mut SagaInFlight,
        taking: &Taking<'_>,
        outcome: Result<ToolOutput, ToolError>,
        observer: &dyn Observer,
    ) -> StepEnd {
        let status = if outcome.is_ok() {
            StepStatus::Commit
        } else {
            StepStatus::Fail
        };
        observer.on_event(&SagaEvent::StepFinished {
            saga_id: &saga.saga_id,
            step_seq: taking.step_seq,
            tool: &taking.step.tool,
            status,
        });
        match outcome {
            Ok(output) => {
                saga.committed(taking.step_seq, &taking.step.tool, &output, false);
                saga.pending_success = Some(PendingSuccess {
                    step_seq: taking.step_seq,
                    tool: taking.step.tool.clone(),
                    hint: output.next_hint,
                });
                StepEnd::Taken
            }
            Err(error) => taking.ended(error),
        }
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
