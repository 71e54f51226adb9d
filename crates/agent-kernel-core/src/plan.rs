//! Plans: a saga whose steps are all known in advance, checked whole before the first
//! effect, then driven over the step path (`step.rs`) one step after the other. A dry run
//! is the same drive with every effect simulated.

use agent_kernel_api::{AuditEvent, Plan, PlanDenial, SagaState, StepDenial, ToolError};
use agent_kernel_fsm::{Denial, Event, Facts, Rule};
use tracing::{Instrument, debug, field, info, info_span, warn};

use crate::kernel::Kernel;
use crate::report::{Failure, NoObserver, Observer, SagaEvent, SagaReport};
use crate::step::{Lookahead, SagaInFlight, StepEnd, StepMode};
use crate::{Cancellation, KernelError, Problem, ProblemKind};

/// What the checks before a saga found: where it starts, its length, and whether the log
/// must check its actor idle when it creates it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Admitted {
    pub(crate) state: SagaState,
    pub(crate) n_steps: u32,
    pub(crate) require_actor_idle: bool,
}

/// The facts of a saga's start (`StartSaga`, `PlanReady`): whether it has a step to run,
/// and whether its actor is idle.
pub(crate) fn start_facts(has_step: bool, actor_idle: bool) -> Facts {
    Facts {
        actor_idle,
        plan_non_empty: has_step,
        ..Facts::default()
    }
}

impl Kernel {
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
        let saga = SagaInFlight::start(
            self.new_saga_record(
                &saga_id,
                plan.name.clone(),
                plan.actor.clone(),
                admitted.n_steps,
                admitted.state,
                false,
                admitted.require_actor_idle,
            ),
            plan.steps.len(),
        );
        let report = self
            .drive_plan(plan, saga, observer, cancel, StepMode::Run)
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

    /// Drives a started saga through `plan`'s steps over the step path, then finishes it
    /// (`Done`) or compensates it. Under [`StepMode::Simulate`] nothing is written until the
    /// end, when the whole dry run is written in one batch.
    async fn drive_plan(
        &self,
        plan: &Plan,
        mut saga: SagaInFlight,
        observer: &dyn Observer,
        cancel: &Cancellation,
        mode: StepMode,
    ) -> Result<SagaReport, KernelError> {
        let n_steps = u32::try_from(plan.steps.len()).unwrap_or(u32::MAX);
        if mode == StepMode::Run {
            info!(n_steps, "saga started");
            observer.on_event(&SagaEvent::Started {
                saga_id: &saga.saga_id,
                n_steps,
            });
        }
        // A dry run's records, written in one batch at its end.
        let mut records = Vec::new();
        let mut failure = None;
        for (step_idx, step) in plan.steps.iter().enumerate() {
            if mode == StepMode::Simulate {
                records.extend(saga.take_batch());
            }
            let lookahead = Lookahead::in_plan(&plan.steps, step_idx, |tool| {
                self.tools.get(tool).map(|tool| tool.effect())
            });
            if let Some(reason) = cancel.reason() {
                let tool = self
                    .tools
                    .get(&step.tool)
                    .expect("preflight checked that every tool is registered");
                let error = ToolError::failed(format!("cancelled before this step: {reason}"));
                warn!(saga_id = %saga.saga_id, step_idx, %error, "saga cancelled");
                // Never begun: recorded as refused, its idempotency key left alone.
                failure = Some(self.refuse_step(&mut saga, step, tool.as_ref(), error));
                break;
            }
            let rest = &plan.steps[step_idx + 1..];
            match self
                .take_step(&mut saga, step, lookahead, mode, Some(rest), observer)
                .await?
            {
                StepEnd::Taken => {}
                StepEnd::Failed(step_failure) => {
                    failure = Some(step_failure);
                    break;
                }
                StepEnd::Conflict {
                    conflict,
                    begin,
                    approved,
                } => {
                    // Recorded as refused at its position; the saga rolls back, as for any
                    // step that cannot run, and releases what it holds. The approval it
                    // would have used is void.
                    let error = ToolError::conflict(conflict.to_string());
                    if let Some(approval) = approved {
                        self.cancel_approval(
                            &mut saga,
                            approval.request.approval_id.clone(),
                            error.to_string(),
                        );
                    }
                    failure = Some(Failure {
                        step_seq: begin.step_seq,
                        tool: step.tool.clone(),
                        error: saga.refuse(*begin, error),
                    });
                    break;
                }
                StepEnd::AwaitingApproval(request) => {
                    // Left waiting in the log, with the plan's remaining steps, for
                    // `resume` (here, once decided, or in another process).
                    return Ok(SagaReport {
                        saga_id: saga.saga_id,
                        state: saga.state,
                        steps: saga.committed,
                        failure: None,
                        dry_run: false,
                        approval: Some(request),
                    });
                }
            }
            if let Err(denied) = self.settle(&mut saga, lookahead) {
                failure = Some(denied);
                break;
            }
        }
        match (mode, failure) {
            (StepMode::Run, None) => self.finish_done(saga).await,
            (StepMode::Run, Some(failure)) => self.fail_saga(saga, Some(failure), observer).await,
            (StepMode::Simulate, failure) => {
                if failure.is_some() {
                    // As a run would end: through Compensating, with nothing to compensate.
                    saga.state = self.enter_compensating(&saga.saga_id, saga.state);
                    records.extend(saga.take_batch());
                    saga.state = SagaState::FailedRolledBack;
                }
                records.extend(saga.take_batch());
                self.log.write(records).await?;
                info!(saga_id = %saga.saga_id, state = %saga.state, "dry run recorded");
                Ok(SagaReport {
                    saga_id: saga.saga_id,
                    state: saga.state,
                    steps: saga.committed,
                    failure,
                    dry_run: true,
                    approval: None,
                })
            }
        }
    }

    /// Drives a saga resumed after its waiting step was approved through `plan` (that step
    /// first, then the plan's remaining steps), as [`Kernel::run`] would have.
    pub(crate) async fn drive_resumed(
        &self,
        plan: &Plan,
        saga: SagaInFlight,
        observer: &dyn Observer,
        cancel: &Cancellation,
    ) -> Result<SagaReport, KernelError> {
        let saga_id = saga.saga_id.clone();
        self.drive_plan(plan, saga, observer, cancel, StepMode::Run)
            .await
            .map_err(|error| match error {
                KernelError::Log(source) => KernelError::Interrupted { saga_id, source },
                other => other,
            })
    }

    /// Checks and simulates `plan` without touching anything but the log: the preflight of
    /// [`Kernel::run`], the FSM's ruling on every step, idempotency keys, and each tool's
    /// [`simulate`](agent_kernel_api::Tool::simulate) output in place of its
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
        let saga = SagaInFlight::start(
            self.new_saga_record(
                &saga_id,
                plan.name.clone(),
                plan.actor.clone(),
                n_steps,
                state,
                true,
                false,
            ),
            plan.steps.len(),
        );
        self.drive_plan(
            plan,
            saga,
            &NoObserver,
            &Cancellation::new(),
            StepMode::Simulate,
        )
        .await
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
            self.record_plan_denied(plan.name.clone(), plan.actor.clone(), dry_run, denials)
                .await;
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

    /// Records a saga refused for denials in the audit chain; the denial stands whether or
    /// not it could be recorded.
    pub(crate) async fn record_plan_denied(
        &self,
        name: Option<String>,
        actor: Option<String>,
        dry_run: bool,
        denials: Vec<StepDenial>,
    ) {
        let event = AuditEvent::PlanDenied(PlanDenial {
            name,
            actor,
            dry_run,
            by: self.env.owner.clone(),
            denials,
        });
        if let Err(error) = self.audit(event).await {
            warn!(%error, "the denied plan could not be recorded in the audit chain");
        }
    }

    /// The FSM's denial of a saga whose actor is busy.
    pub(crate) fn actor_busy_denial(&self) -> Denial {
        match self.start_with_actor_busy() {
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

    /// `Idle --StartSaga-->` as if the actor had another saga in progress: a denial when
    /// the table's start needs the actor idle.
    pub(crate) fn start_with_actor_busy(&self) -> Result<SagaState, Denial> {
        self.fsm
            .apply(SagaState::Idle, Event::StartSaga, &start_facts(true, false))
    }

    /// Whether `actor` has no unfinished saga in the log (an anonymous saga always does).
    pub(crate) async fn actor_idle(&self, actor: Option<&str>) -> Result<bool, KernelError> {
        Ok(match actor {
            None => true,
            Some(actor) => !self
                .log
                .unfinished_sagas()
                .await?
                .iter()
                .any(|saga| saga.actor.as_deref() == Some(actor)),
        })
    }

    /// `Idle --StartSaga--> Planning --PlanReady--> Acting`, with the facts of the plan.
    /// Also returns whether the table's start needs the actor idle, which the log then
    /// checks again when it creates the saga
    /// ([`NewSaga::require_actor_idle`](agent_kernel_api::NewSaga::require_actor_idle)).
    async fn start_state(&self, plan: &Plan) -> Result<(SagaState, bool), KernelError> {
        let actor_idle = self.actor_idle(plan.actor.as_deref()).await?;
        let facts = start_facts(!plan.steps.is_empty(), actor_idle);
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
        let require_actor_idle = plan.actor.is_some() && self.start_with_actor_busy().is_err();
        Ok((state, require_actor_idle))
    }
}
