//! The saga manager: run, roll back, recover.

use std::collections::HashMap;
use std::sync::Arc;

use agent_kernel_api::Durability;
use agent_kernel_api::{
    AuditEvent, BeginStep, Clock, DynTool, EffectClass, IdSource, KeyBinding, LogWrite, NewSaga,
    OperatorCommand, Owner, Plan, PlanDenial, PlanStep, ProbeOutcome, SagaId, SagaRecord,
    SagaState, Settlement, StepDenial, StepRecord, StepStatus, ToolContext, ToolError, TxError,
    TxLog, Undo, WriteOutcome,
};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tracing::{Instrument, debug, field, info, info_span, warn};

use agent_kernel_dispatcher::Dispatcher;
use agent_kernel_fsm::{Denial, Event, Facts, Guardrail, Rule};

use crate::owner::{Liveness, LivenessProbe};
use crate::report::{
    Failure, Observer, RecoveryAction, RecoveryReport, SagaEvent, SagaReport, StepReport,
};
use crate::{Cancellation, KernelError, Problem, ProblemKind};

/// What the kernel needs from the outside world, injected.
#[derive(Clone)]
pub struct Environment {
    /// The clock (used by the log; kept here so one place wires time).
    pub clock: Arc<dyn Clock>,
    /// Where saga ids come from.
    pub ids: Arc<dyn IdSource>,
    /// The process the kernel runs in, recorded as the owner of its sagas.
    pub owner: Owner,
    /// Decides whether another saga's owner is alive.
    pub liveness: Arc<dyn LivenessProbe>,
}

/// The saga engine.
///
/// It runs plans as sagas: for each step it makes the intent durable in the log (with what
/// compensation needs), runs the tool, and records the outcome; on failure it compensates
/// the steps that ran, last first. It also rolls back single sagas on request and recovers
/// sagas left unfinished by dead processes.
pub struct Kernel {
    log: Arc<dyn TxLog>,
    tools: Arc<Dispatcher>,
    fsm: Arc<Guardrail>,
    env: Environment,
    durability: Durability,
    /// The user recorded with operator commands.
    uid: Option<u32>,
    /// Options recorded with operator commands.
    operator_options: Vec<String>,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernel")
            .field("tools", &self.tools)
            .field("owner", &self.env.owner)
            .field("durability", &self.durability)
            .finish_non_exhaustive()
    }
}

/// The hash an idempotency key is bound to: SHA-256 over the tool id and the canonical
/// JSON of the arguments (object keys sorted, no insignificant whitespace).
pub fn args_hash(tool_id: &str, args: &Value) -> String {
    let mut hasher = Sha256::new();
    hasher.update(tool_id.as_bytes());
    hasher.update([0]);
    // serde_json's map is ordered by key, so this serialization is canonical.
    hasher.update(args.to_string().as_bytes());
    hasher
        .finalize()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// Step `step_seq` of a plan as the log records it before it begins (no undo data yet).
fn step_record(saga_id: &SagaId, step_seq: u32, step: &PlanStep, tool: &dyn DynTool) -> BeginStep {
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

/// What the checks before a saga found: where it starts, its length, and whether the log
/// must check its actor idle when it creates it.
#[derive(Debug, Clone, Copy)]
struct Admitted {
    state: SagaState,
    n_steps: u32,
    require_actor_idle: bool,
}

/// The facts of a saga's start (`StartSaga`, `PlanReady`) for `plan`.
fn start_facts(plan: &Plan, actor_idle: bool) -> Facts {
    Facts {
        actor_idle,
        plan_non_empty: !plan.steps.is_empty(),
        ..Facts::default()
    }
}

/// The error of a step the FSM denied.
fn step_denied(denial: Denial, tool: &str) -> ToolError {
    ToolError::denied(denial.with_tool(tool).to_string())
}

/// Whether a key's binding holds an output a step may reuse: committed, in a `Done` saga.
fn is_reusable(binding: &KeyBinding) -> bool {
    binding.status == StepStatus::Commit && binding.saga_state == SagaState::Done
}

/// The output hint by which a tool asks for validation next (spec §3.2).
pub const VALIDATE_HINT: &str = "validate";

/// A saga while `run` drives it.
struct SagaInFlight {
    saga_id: SagaId,
    /// Where the saga stands in memory.
    state: SagaState,
    /// Where the log says it stands, once the pending records are written.
    persisted: SagaState,
    pending: Vec<LogWrite>,
    committed: Vec<StepReport>,
}

impl SagaInFlight {
    /// A saga about to be created by `saga`, which rides with its first write.
    fn start(saga: NewSaga, n_steps: usize) -> SagaInFlight {
        SagaInFlight {
            saga_id: saga.saga_id.clone(),
            state: saga.state,
            persisted: saga.state,
            pending: vec![LogWrite::CreateSaga(saga)],
            committed: Vec::with_capacity(n_steps),
        }
    }

    /// Records `step` as refused before it began (a denial, a cancellation, a failing
    /// `prepare`, a held key): its idempotency key is left alone. Returns `error`.
    fn refuse(&mut self, step: BeginStep, error: ToolError) -> ToolError {
        self.pending.push(LogWrite::RefuseStep {
            step,
            error: error.clone(),
        });
        error
    }

    /// The pending records plus the state change they caused, if any, for one write.
    fn take_batch(&mut self) -> Vec<LogWrite> {
        if self.state != self.persisted {
            self.pending.push(LogWrite::SetState {
                saga_id: self.saga_id.clone(),
                state: self.state,
            });
            self.persisted = self.state;
        }
        std::mem::take(&mut self.pending)
    }

    fn committed(&mut self, seq: u32, tool: &str, reused: bool) {
        self.committed.push(StepReport {
            seq,
            tool: tool.to_owned(),
            status: StepStatus::Commit,
            error: None,
            compensation: None,
            reused,
        });
    }
}

impl Kernel {
    /// A kernel over `log` running the tools of `tools` (through its checks and bounds),
    /// guarded by `fsm`.
    pub fn new(
        log: Arc<dyn TxLog>,
        tools: Arc<Dispatcher>,
        fsm: Arc<Guardrail>,
        env: Environment,
        durability: Durability,
    ) -> Self {
        Self {
            log,
            tools,
            fsm,
            env,
            durability,
            uid: crate::owner::current_uid(),
            operator_options: Vec::new(),
        }
    }

    /// The options that changed how the operator command at hand was carried out (for
    /// example `--skip-verify`); [`Kernel::rollback`] and [`Kernel::recover`] record them
    /// in the audit chain with the command.
    #[must_use]
    pub fn with_operator_options(mut self, options: Vec<String>) -> Self {
        self.operator_options = options;
        self
    }

    /// Records an operator command in the audit chain, before it acts.
    async fn record_operator_command(
        &self,
        command: &str,
        saga_id: Option<&SagaId>,
    ) -> Result<(), KernelError> {
        let event = AuditEvent::Operator(OperatorCommand {
            command: command.to_owned(),
            saga_id: saga_id.cloned(),
            options: self.operator_options.clone(),
            by: self.env.owner.clone(),
            uid: self.uid,
        });
        Ok(self.audit(event).await?)
    }

    /// Writes an event to the audit chain alone.
    async fn audit(&self, event: AuditEvent) -> Result<(), TxError> {
        self.log
            .write(vec![LogWrite::Audit(event)])
            .await
            .map(|_| ())
    }

    /// The record that creates a saga of `plan`.
    fn new_saga(
        &self,
        plan: &Plan,
        saga_id: &SagaId,
        n_steps: u32,
        state: SagaState,
        dry_run: bool,
        require_actor_idle: bool,
    ) -> NewSaga {
        NewSaga {
            saga_id: saga_id.clone(),
            name: plan.name.clone(),
            actor: plan.actor.clone(),
            owner: self.env.owner.clone(),
            n_steps,
            state,
            dry_run,
            require_actor_idle,
        }
    }

    /// The log.
    pub fn log(&self) -> &Arc<dyn TxLog> {
        &self.log
    }

    /// Checks every step of `plan` (known tool, valid arguments, policy, idempotency keys)
    /// without running anything.
    ///
    /// # Errors
    ///
    /// [`KernelError::Preflight`] listing every problem found; [`KernelError::Log`] when the
    /// log cannot be read.
    pub async fn preflight(&self, plan: &Plan) -> Result<(), KernelError> {
        let mut problems = Vec::new();
        let mut keys_seen: HashMap<&str, usize> = HashMap::new();
        for (step_idx, step) in plan.steps.iter().enumerate() {
            let problem = |kind, message: String| Problem {
                step_idx,
                tool: step.tool.clone(),
                kind,
                message,
            };
            if self.tools.get(&step.tool).is_none() {
                let known: Vec<&str> = self.tools.ids().collect();
                problems.push(problem(
                    ProblemKind::UnknownTool,
                    format!("unknown tool (known tools: {})", known.join(", ")),
                ));
                continue;
            }
            if let Err(error) = self.tools.check(&step.tool, &step.args) {
                let kind = if error.is_denied() {
                    ProblemKind::Denied
                } else {
                    ProblemKind::InvalidArgs
                };
                problems.push(problem(kind, error.to_string()));
            }
            if let Some(key) = &step.idempotency_key {
                if let Some(first_idx) = keys_seen.insert(key, step_idx) {
                    problems.push(problem(
                        ProblemKind::KeyConflict,
                        format!("idempotency key `{key}` is also used by step {first_idx}"),
                    ));
                    continue;
                }
                if let Some(binding) = self.log.key_binding(key).await?
                    && binding.args_hash != args_hash(&step.tool, &step.args)
                {
                    problems.push(problem(
                        ProblemKind::KeyConflict,
                        format!(
                            "idempotency key `{key}` is bound to other arguments (first used by saga {} step {})",
                            binding.saga_id, binding.step_seq
                        ),
                    ));
                }
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(KernelError::Preflight(problems))
        }
    }

    fn context(
        &self,
        saga_id: &SagaId,
        step_seq: u32,
        tool_id: &str,
        key: Option<&str>,
        actor: Option<&str>,
    ) -> ToolContext {
        ToolContext {
            saga_id: saga_id.clone(),
            step_seq,
            tool_id: tool_id.to_owned(),
            idempotency_key: key.map(str::to_owned),
            actor: actor.map(str::to_owned),
            durability: self.durability,
        }
    }

    /// Runs `plan` as one saga.
    ///
    /// Every step passes the FSM before any log write for it: the tool must be allowed to
    /// execute in the saga's state, and the step's success must be a transition the table
    /// allows. Every step's intent is then durable in the log before its effect; a step's
    /// outcome is written together with the next step's intent (one synced commit per step),
    /// and the last outcome together with `Done`. State changes ride in the same transaction
    /// as the step record that caused them. If a step fails or the FSM denies it, the steps
    /// that ran are compensated last-first and the saga ends `FailedRolledBack` (or
    /// `FailedRollbackPartial` when a compensation fails).
    ///
    /// # Errors
    ///
    /// [`KernelError::Preflight`] when the plan is refused (nothing ran);
    /// [`KernelError::Denied`] when the FSM refuses to start the saga (nothing ran);
    /// [`KernelError::Log`] when the log cannot be read before the saga starts;
    /// [`KernelError::Interrupted`] when the log fails while the saga runs (it is then left
    /// for `recover`).
    pub async fn run(
        &self,
        plan: &Plan,
        observer: &dyn Observer,
    ) -> Result<SagaReport, KernelError> {
        self.run_cancellable(plan, observer, &Cancellation::new())
            .await
    }

    /// [`Kernel::run`], stopping at the next step boundary once `cancel` is cancelled: no
    /// further step begins, the reason is recorded on the step that did not run, and the
    /// steps that ran are compensated (the saga ends `FailedRolledBack`).
    ///
    /// # Errors
    ///
    /// As [`Kernel::run`].
    pub async fn run_cancellable(
        &self,
        plan: &Plan,
        observer: &dyn Observer,
        cancel: &Cancellation,
    ) -> Result<SagaReport, KernelError> {
        let admitted = self.admit_plan(plan, false).await?;
        let saga_id = self.env.ids.new_saga_id();
        let span = info_span!("saga", saga_id = %saga_id, n_steps = admitted.n_steps, state = field::Empty);
        let report = self
            .drive(plan, observer, cancel, saga_id.clone(), admitted)
            .instrument(span.clone())
            .await
            .map_err(|error| match error {
                KernelError::Log(source) => KernelError::Interrupted { saga_id, source },
                other => other,
            });
        if let Ok(report) = &report {
            span.record("state", report.state.as_str());
            debug!(parent: &span, "saga ended");
        }
        report
    }

    /// Runs a started saga's steps, then finishes or compensates it.
    async fn drive(
        &self,
        plan: &Plan,
        observer: &dyn Observer,
        cancel: &Cancellation,
        saga_id: SagaId,
        admitted: Admitted,
    ) -> Result<SagaReport, KernelError> {
        let Admitted {
            state,
            n_steps,
            require_actor_idle,
        } = admitted;
        let actor = plan.actor.as_deref();
        info!(n_steps, "saga started");
        observer.on_event(&SagaEvent::Started {
            saga_id: &saga_id,
            n_steps,
        });
        // `committed` keeps what a `Done` saga's report says as the records are queued, so
        // that success costs no read of the log.
        let mut saga = SagaInFlight::start(
            self.new_saga(plan, &saga_id, n_steps, state, false, require_actor_idle),
            plan.steps.len(),
        );
        let mut failure = None;

        for (step_seq, step) in (0_u32..).zip(&plan.steps) {
            let tool = self
                .tools
                .get(&step.tool)
                .expect("preflight checked that every tool is registered")
                .clone();
            let ctx = self.context(
                &saga_id,
                step_seq,
                &step.tool,
                step.idempotency_key.as_deref(),
                actor,
            );
            let begin = step_record(&saga_id, step_seq, step, tool.as_ref());
            let fail = |error: ToolError| Failure {
                step_seq,
                tool: step.tool.clone(),
                error,
            };

            if let Some(reason) = cancel.reason() {
                let error = ToolError::failed(format!("cancelled before this step: {reason}"));
                warn!(saga_id = %saga_id, step_seq, %error, "saga cancelled");
                // Never begun: recorded as refused, its idempotency key left alone.
                failure = Some(fail(saga.refuse(begin, error)));
                break;
            }

            // The FSM rules on the step before anything about it is written.
            if let Err(denial) = self.admit_step(saga.state, plan, step_seq, tool.effect()) {
                let error = step_denied(denial, &step.tool);
                warn!(saga_id = %saga_id, step_seq, tool = %step.tool, %error, "step denied");
                // Never begun: recorded as refused, its idempotency key left alone.
                failure = Some(fail(saga.refuse(begin, error)));
                break;
            }

            if let Some(key) = &step.idempotency_key
                && let Some(binding) = self.log.key_binding(key).await?
                && binding.args_hash == begin.args_hash
                && is_reusable(&binding)
                && let Some(output) = binding.output
            {
                debug!(saga_id = %saga_id, step_seq, key, from = %binding.saga_id, "reusing committed output");
                let hint = output.next_hint.clone();
                saga.pending.push(LogWrite::ReuseStep {
                    step: begin,
                    from_saga_id: binding.saga_id,
                    from_step_seq: binding.step_seq,
                    output,
                });
                saga.committed(step_seq, &step.tool, true);
                observer.on_event(&SagaEvent::StepFinished {
                    step_seq,
                    tool: &step.tool,
                    status: StepStatus::Commit,
                });
                if let Err(denial) = self.advance(&mut saga, plan, step_seq, hint.as_deref()) {
                    failure = Some(fail(step_denied(denial, &step.tool)));
                    break;
                }
                continue;
            }

            let step_span =
                info_span!("step", step = step_seq, tool = %step.tool, outcome = field::Empty);
            let prepared = self
                .tools
                .prepare(&ctx, &step.args)
                .instrument(step_span.clone())
                .await;
            if prepared.is_err() {
                step_span.record("outcome", "fail");
            }
            let undo = match prepared {
                Ok(undo) => undo,
                Err(error) => {
                    // `prepare` has no side effects, so whatever went wrong, nothing happened.
                    let error = error.not_applied();
                    // Never begun: recorded as refused, its idempotency key left alone.
                    failure = Some(fail(saga.refuse(begin, error)));
                    break;
                }
            };
            saga.pending
                .push(LogWrite::BeginStep(BeginStep { undo, ..begin }));
            // The intent (and the previous step's outcome) is durable before the effect.
            let batch = saga.take_batch();
            let begin_idx = batch
                .iter()
                .position(|write| matches!(write, LogWrite::BeginStep(_)))
                .expect("the batch holds this step's BEGIN");
            let outcomes = self.write_saga_batch(plan, batch).await?;
            if let Some(WriteOutcome::KeyRejected(reason)) = outcomes.get(begin_idx) {
                failure = Some(fail(ToolError::failed(reason.clone())));
                break;
            }

            let executed = self
                .tools
                .execute(&ctx, &step.args)
                .instrument(step_span.clone())
                .await;
            step_span.record("outcome", if executed.is_ok() { "commit" } else { "fail" });
            // An event after the record, so logs show the span with its outcome.
            debug!(parent: &step_span, "step executed");
            match executed {
                Ok(output) => {
                    let hint = output.next_hint.clone();
                    saga.pending.push(LogWrite::CommitStep {
                        saga_id: saga_id.clone(),
                        step_seq,
                        output,
                    });
                    saga.committed(step_seq, &step.tool, false);
                    observer.on_event(&SagaEvent::StepFinished {
                        step_seq,
                        tool: &step.tool,
                        status: StepStatus::Commit,
                    });
                    if let Err(denial) = self.advance(&mut saga, plan, step_seq, hint.as_deref()) {
                        // The effect happened and is committed; the saga still cannot go on.
                        failure = Some(fail(step_denied(denial, &step.tool)));
                        break;
                    }
                }
                Err(error) => {
                    info!(saga_id = %saga_id, step_seq, tool = %step.tool, %error, "step failed");
                    saga.pending.push(LogWrite::FailStep {
                        saga_id: saga_id.clone(),
                        step_seq,
                        error: error.clone(),
                    });
                    observer.on_event(&SagaEvent::StepFinished {
                        step_seq,
                        tool: &step.tool,
                        status: StepStatus::Fail,
                    });
                    failure = Some(fail(error));
                    break;
                }
            }
        }

        match failure {
            None => {
                assert_eq!(
                    saga.state,
                    SagaState::Done,
                    "a saga without failure ends Done"
                );
                // `Done` is durable before it is reported.
                self.write_saga_batch(plan, saga.take_batch()).await?;
                info!(saga_id = %saga_id, "saga done");
                Ok(SagaReport {
                    saga_id,
                    state: SagaState::Done,
                    steps: saga.committed,
                    failure: None,
                    dry_run: false,
                })
            }
            Some(failure) => {
                saga.state = self.enter_compensating(&saga_id, saga.state);
                self.write_saga_batch(plan, saga.take_batch()).await?;
                let record = self.load(&saga_id).await?;
                self.compensate_saga(record, Some(failure), observer).await
            }
        }
    }

    /// Checks and simulates `plan` without touching anything but the log: the preflight of
    /// [`Kernel::run`], the FSM's ruling on every step, idempotency keys, and each tool's
    /// [`simulate`](agent_kernel_api::TransactionalTool::simulate) output in place of its
    /// effect. No tool's `prepare` or `execute` runs.
    ///
    /// The dry run is recorded as a saga marked as a dry run
    /// ([`NewSaga::dry_run`](agent_kernel_api::NewSaga::dry_run)), written whole in one
    /// batch once the simulation ends: its steps are simulated (`COMMIT` with the simulated
    /// output, or `FAIL`), it claims no idempotency key and holds the actor for no time, and
    /// it is never found unfinished, so recovery never acts on it.
    ///
    /// The report says what a run would do: `Done` with every step `COMMIT` (outputs
    /// simulated, or reused by key), or `FailedRolledBack` with the step the FSM would deny
    /// (and `is_denied`). A run can still fail where the simulation passed: a simulation does
    /// not know what the world will answer.
    ///
    /// # Errors
    ///
    /// As [`Kernel::run`]'s refusals: [`KernelError::Preflight`], [`KernelError::Denied`],
    /// [`KernelError::Log`].
    pub async fn dry_run(&self, plan: &Plan) -> Result<SagaReport, KernelError> {
        let Admitted { state, n_steps, .. } = self.admit_plan(plan, true).await?;
        let saga_id = self.env.ids.new_saga_id();
        // A dry run holds its actor for no time.
        let mut saga = SagaInFlight::start(
            self.new_saga(plan, &saga_id, n_steps, state, true, false),
            plan.steps.len(),
        );
        // Every record of the dry run, written in one batch at the end.
        let mut records = Vec::with_capacity(2 * plan.steps.len() + 2);
        let mut failure = None;
        for (step_seq, step) in (0_u32..).zip(&plan.steps) {
            records.extend(saga.take_batch());
            let tool = self
                .tools
                .get(&step.tool)
                .expect("preflight checked that every tool is registered")
                .clone();
            let fail = |error: ToolError| Failure {
                step_seq,
                tool: step.tool.clone(),
                error,
            };
            let simulated_step = step_record(&saga_id, step_seq, step, tool.as_ref());
            if let Err(denial) = self.admit_step(saga.state, plan, step_seq, tool.effect()) {
                let error = step_denied(denial, &step.tool);
                failure = Some(fail(saga.refuse(simulated_step, error)));
                break;
            }
            let binding = match &step.idempotency_key {
                Some(key) => self
                    .log
                    .key_binding(key)
                    .await?
                    .filter(|binding| binding.args_hash == simulated_step.args_hash),
                None => None,
            };
            if let Some(binding) = &binding
                && !is_reusable(binding)
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
                failure = Some(fail(saga.refuse(simulated_step, error)));
                break;
            }
            let reused = binding.filter(is_reusable);
            let hint = if let Some(binding) = reused
                && let Some(output) = binding.output
            {
                saga.pending.push(LogWrite::ReuseStep {
                    step: simulated_step,
                    from_saga_id: binding.saga_id,
                    from_step_seq: binding.step_seq,
                    output,
                });
                saga.committed(step_seq, &step.tool, true);
                None
            } else {
                let ctx = self.context(
                    &saga_id,
                    step_seq,
                    &step.tool,
                    step.idempotency_key.as_deref(),
                    plan.actor.as_deref(),
                );
                let simulated = tool.simulate(&ctx, &step.args).await;
                let hint = simulated
                    .as_ref()
                    .ok()
                    .and_then(|output| output.next_hint.clone());
                let error = simulated.as_ref().err().cloned();
                saga.pending.push(LogWrite::SimulateStep {
                    step: simulated_step,
                    result: simulated,
                });
                if let Some(error) = error {
                    failure = Some(fail(error));
                    break;
                }
                saga.committed(step_seq, &step.tool, false);
                hint
            };
            if let Err(denial) = self.advance(&mut saga, plan, step_seq, hint.as_deref()) {
                failure = Some(fail(step_denied(denial, &step.tool)));
                break;
            }
        }
        if failure.is_some() {
            // As a run would end: through Compensating, with nothing to compensate.
            saga.state = self.enter_compensating(&saga_id, saga.state);
            records.extend(saga.take_batch());
            saga.state = SagaState::FailedRolledBack;
        }
        records.extend(saga.take_batch());
        self.log.write(records).await?;
        info!(saga_id = %saga_id, state = %saga.state, "dry run recorded");
        Ok(SagaReport {
            saga_id,
            state: saga.state,
            steps: saga.committed,
            failure,
            dry_run: true,
        })
    }

    /// The checks before a saga starts: [`Kernel::preflight`] and the FSM's start
    /// (`Idle --StartSaga--> Planning --PlanReady--> Acting`). Returns the state the saga
    /// starts in and its number of steps.
    ///
    /// A refusal that is a denial (by the sandbox or the FSM) is recorded in the audit chain
    /// ([`AuditEvent::PlanDenied`]) with each denied step's tool, arguments and reason.
    async fn admit_plan(&self, plan: &Plan, dry_run: bool) -> Result<Admitted, KernelError> {
        let checked = match self.preflight(plan).await {
            Ok(()) => self.start_state(plan).await,
            Err(error) => Err(error),
        };
        let denials: Vec<StepDenial> = match &checked {
            Err(KernelError::Preflight(problems)) => problems
                .iter()
                .filter(|problem| problem.kind == ProblemKind::Denied)
                .map(|problem| StepDenial {
                    step_idx: u32::try_from(problem.step_idx).ok(),
                    tool: Some(problem.tool.clone()),
                    args: plan
                        .steps
                        .get(problem.step_idx)
                        .map(|step| step.args.clone()),
                    reason: problem.message.clone(),
                })
                .collect(),
            Err(KernelError::Denied { denial, .. }) => vec![StepDenial {
                step_idx: None,
                tool: None,
                args: None,
                reason: denial.to_string(),
            }],
            _ => Vec::new(),
        };
        if !denials.is_empty() {
            self.record_plan_denied(plan, dry_run, denials).await;
        }
        let (state, require_actor_idle) = checked?;
        let n_steps = u32::try_from(plan.steps.len()).map_err(|_| {
            KernelError::Preflight(vec![Problem {
                step_idx: 0,
                tool: String::new(),
                kind: ProblemKind::InvalidArgs,
                message: "too many steps".into(),
            }])
        })?;
        Ok(Admitted {
            state,
            n_steps,
            require_actor_idle,
        })
    }

    /// Records a plan refused for denials in the audit chain; the denial stands whether or
    /// not it could be recorded.
    async fn record_plan_denied(&self, plan: &Plan, dry_run: bool, denials: Vec<StepDenial>) {
        let event = AuditEvent::PlanDenied(PlanDenial {
            name: plan.name.clone(),
            actor: plan.actor.clone(),
            dry_run,
            by: self.env.owner.clone(),
            denials,
        });
        if let Err(error) = self.audit(event).await {
            warn!(%error, "the denied plan could not be recorded in the audit chain");
        }
    }

    /// Writes a batch of a running saga. The batch that creates the saga may find its actor
    /// busy (another process started a saga for it since `start_state` looked): nothing of
    /// it is written, and the plan is denied as the FSM's `actor_idle` guard would.
    async fn write_saga_batch(
        &self,
        plan: &Plan,
        batch: Vec<LogWrite>,
    ) -> Result<Vec<WriteOutcome>, KernelError> {
        match self.log.write(batch).await {
            Err(TxError::ActorBusy { actor, saga_id }) => {
                warn!(%actor, busy = %saga_id, "actor busy: another saga started first");
                let denial = self.actor_busy_denial(plan);
                self.record_plan_denied(
                    plan,
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

    /// The FSM's denial of a saga whose actor is busy.
    fn actor_busy_denial(&self, plan: &Plan) -> Denial {
        match self.start_with_actor_busy(plan) {
            Err(denial) => denial,
            // Only asked when the table's start needs the actor idle.
            Ok(_) => Denial {
                state: SagaState::Idle,
                event: Some(Event::StartSaga),
                tool: None,
                rule: Rule::NotInTable,
            },
        }
    }

    /// `Idle --StartSaga-->` for `plan` as if its actor had another saga in progress: a
    /// denial when the table's start needs the actor idle.
    fn start_with_actor_busy(&self, plan: &Plan) -> Result<SagaState, Denial> {
        self.fsm
            .apply(SagaState::Idle, Event::StartSaga, &start_facts(plan, false))
    }

    /// `Idle --StartSaga--> Planning --PlanReady--> Acting`, with the facts of the plan.
    /// Also returns whether the table's start needs the actor idle, which the log then
    /// checks again when it creates the saga ([`NewSaga::require_actor_idle`]).
    async fn start_state(&self, plan: &Plan) -> Result<(SagaState, bool), KernelError> {
        let actor_idle = match &plan.actor {
            None => true,
            Some(actor) => !self
                .log
                .unfinished_sagas()
                .await?
                .iter()
                .any(|saga| saga.actor.as_deref() == Some(actor.as_str())),
        };
        let facts = start_facts(plan, actor_idle);
        let deny = |denial: Denial| KernelError::Denied {
            saga_id: None,
            denial,
        };
        let planning = self
            .fsm
            .apply(SagaState::Idle, Event::StartSaga, &facts)
            .map_err(deny)?;
        let state = self
            .fsm
            .apply(planning, Event::PlanReady, &facts)
            .map_err(deny)?;
        let require_actor_idle = plan.actor.is_some() && self.start_with_actor_busy(plan).is_err();
        Ok((state, require_actor_idle))
    }

    /// The facts of step `step_seq` succeeding with output hint `hint`.
    fn step_facts(&self, plan: &Plan, step_seq: u32, hint: Option<&str>) -> Facts {
        let next = plan.steps.get(step_seq as usize + 1);
        let next_is_read_only = next.is_some_and(|next| {
            self.tools
                .get(&next.tool)
                .is_some_and(|tool| tool.effect() == EffectClass::ReadOnly)
        });
        Facts {
            validation_next: hint == Some(VALIDATE_HINT) || next_is_read_only || next.is_none(),
            more_steps: next.is_some(),
            saga_complete: next.is_none(),
            ..Facts::default()
        }
    }

    /// Whether the FSM lets step `step_seq` (of class `effect`) execute in `state` and
    /// succeed there; checked before any log write for the step.
    fn admit_step(
        &self,
        state: SagaState,
        plan: &Plan,
        step_seq: u32,
        effect: EffectClass,
    ) -> Result<(), Denial> {
        self.fsm.may_execute(state, effect)?;
        let event = Guardrail::success_event(state);
        self.fsm
            .apply(state, event, &self.step_facts(plan, step_seq, None))
            .map(|_| ())
    }

    /// Moves the saga past a successful step; after the last step, through the closing
    /// validation (`Validating --ValidationPassed--> Done`).
    fn advance(
        &self,
        saga: &mut SagaInFlight,
        plan: &Plan,
        step_seq: u32,
        hint: Option<&str>,
    ) -> Result<(), Denial> {
        let facts = self.step_facts(plan, step_seq, hint);
        let event = Guardrail::success_event(saga.state);
        saga.state = self.fsm.apply(saga.state, event, &facts)?;
        if facts.saga_complete && saga.state == SagaState::Validating {
            // The end of a plan is a validation: every step committed.
            saga.state = self
                .fsm
                .apply(saga.state, Event::ValidationPassed, &facts)?;
        }
        if facts.saga_complete && saga.state != SagaState::Done {
            return Err(Denial {
                state: saga.state,
                event: Some(event),
                tool: None,
                rule: Rule::NotInTable,
            });
        }
        Ok(())
    }

    /// The state a failing saga moves to: `Compensating`, through the table's failure event
    /// for its state. Loaded tables always allow it; a state this build never persists
    /// (`Idle`, `Planning`) is moved there directly, because rollback must stay possible.
    fn enter_compensating(&self, saga_id: &SagaId, state: SagaState) -> SagaState {
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

    async fn load(&self, saga_id: &SagaId) -> Result<SagaRecord, KernelError> {
        self.log
            .saga(saga_id)
            .await?
            .ok_or_else(|| KernelError::SagaNotFound(saga_id.clone()))
    }

    /// Whether a step's effect may be in place and so needs compensating.
    fn needs_compensation(step: &StepRecord) -> bool {
        match step.status {
            StepStatus::Begin | StepStatus::Commit | StepStatus::CompensationFailed => true,
            StepStatus::Fail => step.error.as_ref().is_some_and(ToolError::is_uncertain),
            StepStatus::Compensated => false,
        }
    }

    /// Compensates every step of a saga in `Compensating` whose effect may be in place,
    /// last first, then moves the saga to its final state.
    async fn compensate_saga(
        &self,
        record: SagaRecord,
        failure: Option<Failure>,
        observer: &dyn Observer,
    ) -> Result<SagaReport, KernelError> {
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
        let actor = record.saga.actor.as_deref();
        let mut any_failed = false;
        // A dry run's steps were simulated: nothing ran, so nothing is undone. (The kernel
        // writes a dry run whole in one batch, so it is never found unfinished; this guards
        // a log written otherwise.)
        let simulated = record.saga.dry_run;
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
            self.log
                .write(vec![LogWrite::Compensation {
                    saga_id: saga_id.clone(),
                    step_seq: step.step_seq,
                    result,
                }])
                .await?;
            observer.on_event(&SagaEvent::StepCompensated {
                step_seq: step.step_seq,
                tool: &step.tool_id,
                status,
            });
        }
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
        self.log
            .write(vec![LogWrite::SetState {
                saga_id: saga_id.clone(),
                state,
            }])
            .await?;
        info!(saga_id = %saga_id, %state, "saga finished");
        let record = self.load(&saga_id).await?;
        Ok(SagaReport::from_record(&record, failure))
    }

    /// Compensates one step; `Ok` carries a note for the log.
    async fn compensate_step(
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

    /// The tools that compensating `record` needs and this kernel does not have, sorted.
    fn missing_tools(&self, record: &SagaRecord) -> Vec<String> {
        if record.saga.dry_run {
            return Vec::new();
        }
        let mut missing: Vec<String> = record
            .steps
            .iter()
            .filter(|step| {
                Self::needs_compensation(step)
                    && step.reused_from.is_none()
                    && step.effect != EffectClass::ReadOnly
                    && self.tools.get(&step.tool_id).is_none()
            })
            .map(|step| step.tool_id.clone())
            .collect();
        missing.sort();
        missing.dedup();
        missing
    }

    /// Refuses a saga owned by another process that is alive (or cannot be checked).
    fn check_owner_gone(&self, record: &SagaRecord) -> Result<(), KernelError> {
        let saga = &record.saga;
        if saga.owner == self.env.owner || saga.state.is_terminal() {
            return Ok(());
        }
        if self.env.liveness.liveness(&saga.owner) != Liveness::Dead {
            return Err(KernelError::SagaBusy {
                saga_id: saga.saga_id.clone(),
                state: saga.state,
                owner: saga.owner.clone(),
            });
        }
        Ok(())
    }

    /// Before a saga of a dead process is taken over: its owner must be gone, and this
    /// kernel must have every tool its compensation needs. A saga that fails either check
    /// is left exactly as it is.
    fn check_recoverable(&self, record: &SagaRecord) -> Result<(), KernelError> {
        self.check_owner_gone(record)?;
        let tools = self.missing_tools(record);
        if !tools.is_empty() {
            return Err(KernelError::MissingTools {
                saga_id: record.saga.saga_id.clone(),
                tools,
            });
        }
        Ok(())
    }

    /// Takes a saga over from `owner` (who must be dead, or the saga terminal), or fails.
    async fn take_over(&self, record: &SagaRecord) -> Result<(), KernelError> {
        let saga = &record.saga;
        if saga.owner == self.env.owner {
            return Ok(());
        }
        self.check_owner_gone(record)?;
        if self
            .log
            .take_over(&saga.saga_id, &saga.owner, saga.state, &self.env.owner)
            .await?
        {
            Ok(())
        } else {
            Err(KernelError::TakenOver(saga.saga_id.clone()))
        }
    }

    /// Rolls one saga back on an operator's request: compensates its committed steps in
    /// reverse order.
    ///
    /// - A saga still owned by a live process is refused ([`KernelError::SagaBusy`]).
    /// - An unfinished saga of a dead process is rolled back as `recover` would, from its
    ///   persisted state.
    /// - A `FailedRolledBack` saga is already rolled back; it is reported as is.
    /// - A `Done` or `FailedRollbackPartial` saga is refused by the FSM
    ///   ([`KernelError::Denied`]): terminal states absorb every event, so a finished saga is
    ///   never reopened.
    /// - A dry run has nothing to undo: it is reported as it is (its report has `dry_run`).
    ///
    /// The request is recorded in the audit chain ([`AuditEvent::Operator`]) before anything
    /// else, whatever comes of it.
    ///
    /// # Errors
    ///
    /// [`KernelError::SagaNotFound`], [`KernelError::SagaBusy`], [`KernelError::TakenOver`],
    /// [`KernelError::Denied`], or [`KernelError::Log`].
    pub async fn rollback(
        &self,
        saga_id: &SagaId,
        observer: &dyn Observer,
    ) -> Result<SagaReport, KernelError> {
        self.record_operator_command("rollback", Some(saga_id))
            .await?;
        let record = self.load(saga_id).await?;
        if record.saga.dry_run && record.saga.state.is_terminal() {
            // Nothing ran, so the world is already as it was before the saga.
            return Ok(SagaReport::from_record(&record, None));
        }
        match record.saga.state {
            SagaState::FailedRolledBack => return Ok(SagaReport::from_record(&record, None)),
            state if state.is_terminal() => {
                // Terminal states absorb every event: a finished saga is never reopened.
                return Err(KernelError::Denied {
                    saga_id: Some(saga_id.clone()),
                    denial: Denial {
                        state,
                        event: None,
                        tool: None,
                        rule: Rule::Terminal,
                    },
                });
            }
            _ => {}
        }
        self.check_recoverable(&record)?;
        self.take_over(&record).await?;
        info!(saga_id = %saga_id, from = %record.saga.state, "operator rollback");
        let state = self.enter_compensating(saga_id, record.saga.state);
        self.log
            .write(vec![LogWrite::SetState {
                saga_id: saga_id.clone(),
                state,
            }])
            .await?;
        let record = self.load(saga_id).await?;
        let span = info_span!("saga", saga_id = %saga_id, rollback = true);
        self.compensate_saga(record, None, observer)
            .instrument(span)
            .await
    }

    /// Rolls back every saga left unfinished by a process that is no longer running.
    ///
    /// The command is recorded in the audit chain ([`AuditEvent::Operator`]) before it acts.
    ///
    /// Sagas in a terminal state are never touched; sagas whose owner is alive (or cannot
    /// be checked from this host) are skipped and reported. Each saga is taken over with a
    /// compare-and-swap on its owner, so concurrent recoveries never compensate one saga
    /// twice at once, and a recovery that is itself killed is resumed by the next one.
    ///
    /// # Errors
    ///
    /// [`KernelError::Log`] when the log fails.
    pub async fn recover(&self, observer: &dyn Observer) -> Result<RecoveryReport, KernelError> {
        self.record_operator_command("recover", None).await?;
        let mut report = RecoveryReport::default();
        for saga in self.log.unfinished_sagas().await? {
            // One saga that cannot be recovered must not stop the recovery of the others.
            match self.recover_one(&saga.saga_id, observer).await {
                Ok(Some(action)) => report.sagas.push(action),
                Ok(None) => {}
                Err(error) => {
                    warn!(saga_id = %saga.saga_id, %error, "cannot recover this saga");
                    report.sagas.push(RecoveryAction::Failed {
                        saga_id: saga.saga_id.clone(),
                        error: error.to_string(),
                    });
                }
            }
        }
        Ok(report)
    }

    /// Recovers one unfinished saga; `None` when another recovery finished it meanwhile.
    async fn recover_one(
        &self,
        saga_id: &SagaId,
        observer: &dyn Observer,
    ) -> Result<Option<RecoveryAction>, KernelError> {
        let record = self.load(saga_id).await?;
        if record.saga.state.is_terminal() {
            // Another recovery finished it since the list was read.
            return Ok(None);
        }
        let checked = match self.check_recoverable(&record) {
            Ok(()) => self.take_over(&record).await,
            Err(error) => Err(error),
        };
        match checked {
            Ok(()) => {}
            Err(KernelError::MissingTools { saga_id, tools }) => {
                warn!(saga_id = %saga_id, ?tools, "tools missing; the saga is left as it is");
                return Ok(Some(RecoveryAction::MissingTools { saga_id, tools }));
            }
            Err(KernelError::SagaBusy { saga_id, owner, .. }) => {
                info!(saga_id = %saga_id, pid = owner.pid, "owner alive; skipped");
                return Ok(Some(RecoveryAction::SkippedLive {
                    saga_id,
                    pid: owner.pid,
                    host: owner.host,
                }));
            }
            Err(KernelError::TakenOver(saga_id)) => {
                return Ok(Some(RecoveryAction::SkippedTakenOver { saga_id }));
            }
            Err(other) => return Err(other),
        }
        // The take-over held only if the saga was still in the state just read, so that
        // state is current: no one else writes to it now.
        info!(saga_id = %saga_id, state = %record.saga.state, "recovering");
        // Recovery resumes from the persisted state: a step was in flight in `Acting` or
        // `Validating`, so the table's failure event for that state applies.
        if record.saga.state != SagaState::Compensating {
            let state = self.enter_compensating(saga_id, record.saga.state);
            self.log
                .write(vec![LogWrite::SetState {
                    saga_id: saga_id.clone(),
                    state,
                }])
                .await?;
        }
        let record = self.load(saga_id).await?;
        let span = info_span!("saga", saga_id = %saga_id, recovery = true);
        let saga_report = self
            .compensate_saga(record, None, observer)
            .instrument(span)
            .await?;
        Ok(Some(RecoveryAction::RolledBack(saga_report)))
    }

    /// The tool registered under `id`.
    pub fn tool(&self, id: &str) -> Option<&Arc<dyn DynTool>> {
        self.tools.get(id)
    }
}
