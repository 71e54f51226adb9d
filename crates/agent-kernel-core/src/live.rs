//! Live sagas (reference §8): begun, then driven one call at a time, each call chosen after
//! the previous answers, then committed or aborted. Each call goes through the same step
//! path as a plan's step (`step.rs`); a live saga is a plan whose next step is known only
//! when it is called.
//!
//! The FSM, for a saga whose steps arrive one at a time:
//!
//! - `begin`: `Idle --StartSaga[actor_idle]--> Planning`, written to the log at once
//!   (`n_steps` 0, state `Planning`): the agent is choosing its first step, and the actor is
//!   held from here on.
//! - the first call: `Planning --PlanReady[plan_non_empty]--> Acting` (the call is the
//!   step that makes the plan non-empty), then the step as a plan's.
//! - every call: the previous step's success is settled with the FSM only now, when what
//!   follows it is known (the called tool's effect class), exactly as a plan's step is
//!   settled with the next step in view; the step itself is admitted with what follows it
//!   unknown (more steps may come).
//! - `commit`: the last step's success is settled as a plan's last step (`saga_complete`),
//!   through the closing validation to `Done`. A saga with no step is complete at once:
//!   `Planning --ValidationPassed[saga_complete]--> Done` (a table without that row denies
//!   the commit, and the saga is rolled back).
//! - `abort`, the idle timeout, the process closing: recorded (`SagaAborted`), then the
//!   table's failure event for the saga's state, to `Compensating`, and compensation.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use agent_kernel_api::{
    AbortCause, ApprovalRequest, AuditEvent, MAX_IDEMPOTENCY_KEY_BYTES, MAX_LABEL_BYTES, OnDenied,
    PlanStep, SagaAbort, SagaId, SagaState, StepDenial,
};
use agent_kernel_fsm::Event;
use serde::Serialize;
use serde_json::Value;
use tokio::time::Instant;
use tracing::{Instrument, info, info_span, warn};

use crate::conflict::Conflict;
use crate::kernel::Kernel;
use crate::live_registry::{LiveEntry, LiveRegistry};
use crate::plan::start_facts;
use crate::report::{NoObserver, SagaReport, StepReport};
use crate::step::{Lookahead, SagaInFlight};
use crate::{KernelError, Problem};

/// How a live saga is begun.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BeginOptions {
    /// An optional label, recorded in the log.
    pub name: Option<String>,
    /// Who drives it, recorded in the log; an actor has one unfinished saga at a time.
    pub actor: Option<String>,
    /// What a call the sandbox or the FSM denies does: roll the saga back (the default), or
    /// refuse the call and leave the saga open.
    pub on_denied: OnDenied,
}

/// What a call of a live saga came to.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
#[non_exhaustive]
pub enum CallAnswer {
    /// The step committed (durably, before this answer); its report carries the output.
    Committed(StepReport),
    /// Bad input (an unknown tool, invalid arguments, a key bound to other arguments), or
    /// under [`OnDenied::Refuse`] a call the sandbox or the FSM denied
    /// ([`ProblemKind::Denied`](crate::ProblemKind::Denied)): nothing of the call ran, the
    /// refusal is in the audit chain, and the saga stays open.
    Refused(Problem),
    /// Under [`OnDenied::Rollback`], the sandbox or the FSM denied the call: the saga was
    /// rolled back, as a plan's is.
    Denied(SagaReport),
    /// The tool failed: the saga was rolled back; the report lists what was compensated.
    Failed(SagaReport),
    /// The step needs an operator's approval: nothing of it ran, the request is in the log,
    /// and the saga waits (`AwaitingApproval`) until [`LiveSaga::resume`] finds it decided.
    AwaitingApproval(ApprovalRequest),
    /// Another saga that is not settled holds a resource the call would claim: nothing of
    /// the call ran, the refused claim is in the audit chain, and the saga stays open (the
    /// agent may try something else, or the same call once the holder is settled).
    Conflict(Conflict),
}

impl CallAnswer {
    pub(crate) fn rolled_back(report: SagaReport) -> CallAnswer {
        if report.is_denied() {
            CallAnswer::Denied(report)
        } else {
            CallAnswer::Failed(report)
        }
    }

    /// Whether the saga is still open after this answer of [`LiveSaga::call`] or
    /// [`LiveSaga::resume`] (after [`Kernel::call_alone`], a `Committed` saga is closed).
    pub fn saga_open(&self) -> bool {
        matches!(
            self,
            CallAnswer::Committed(_)
                | CallAnswer::Refused(_)
                | CallAnswer::AwaitingApproval(_)
                | CallAnswer::Conflict(_)
        )
    }
}

/// Where an open live saga stands.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LiveStatus {
    /// The saga.
    pub saga_id: SagaId,
    /// Its state in memory (the log has it once the next record is written).
    pub state: SagaState,
    /// The steps that committed, in order, with their outputs.
    pub steps: Vec<StepReport>,
    /// The request the saga waits on, while it is `AwaitingApproval`.
    pub approval: Option<ApprovalRequest>,
}

/// A handle on an open live saga. Cheap to clone; every clone drives the same saga, one
/// call at a time. [`Kernel::live_saga`] finds it again by id.
#[derive(Debug, Clone)]
pub struct LiveSaga {
    kernel: Arc<Kernel>,
    saga_id: SagaId,
    entry: Arc<LiveEntry>,
}

/// When a live saga's row is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Creation {
    /// At `begin`, on its own: the saga holds its actor from then on.
    Now,
    /// With its first step's BEGIN (or its request for an approval).
    WithFirstWrite,
}

/// A live call as a step, its idempotency key checked.
fn plan_step(
    tool: &str,
    args: Value,
    idempotency_key: Option<String>,
) -> Result<PlanStep, KernelError> {
    if let Some(key) = &idempotency_key
        && (key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY_BYTES)
    {
        return Err(KernelError::InvalidRequest(format!(
            "an idempotency key has 1 to {MAX_IDEMPOTENCY_KEY_BYTES} bytes; this one has {}",
            key.len()
        )));
    }
    Ok(PlanStep {
        tool: tool.to_owned(),
        args,
        idempotency_key,
    })
}

fn check_label(what: &str, value: Option<&String>) -> Result<(), KernelError> {
    match value {
        Some(value) if value.len() > MAX_LABEL_BYTES => Err(KernelError::InvalidRequest(format!(
            "the saga's {what} is {} bytes, more than the maximum of {MAX_LABEL_BYTES}",
            value.len()
        ))),
        Some(value) if value.chars().any(char::is_control) => Err(KernelError::InvalidRequest(
            format!("the saga's {what} holds control characters"),
        )),
        _ => Ok(()),
    }
}

impl Kernel {
    /// Begins a live saga: created in the log at once (state `Planning`, no plan), owned by
    /// this process, and held open until [`LiveSaga::commit`], [`LiveSaga::abort`], a call
    /// that fails or is denied, or `[limits] saga_idle_timeout_ms` without a touch.
    ///
    /// # Errors
    ///
    /// [`KernelError::TooManyOpenSagas`] at `[limits] open_sagas_max`;
    /// [`KernelError::InvalidRequest`] for a label too long;
    /// [`KernelError::Denied`] when the FSM refuses to start it (its actor has an unfinished
    /// saga), recorded as `PlanDenied`; [`KernelError::Log`] when the log fails.
    pub async fn begin(self: &Arc<Self>, options: BeginOptions) -> Result<LiveSaga, KernelError> {
        self.open_saga(options, Creation::Now).await
    }

    /// Calls `tool` with `args` (and an idempotency key) as a saga of its own, committed
    /// with the call: [`begin`](Self::begin), [`LiveSaga::call`] and [`LiveSaga::commit`] in
    /// two synced commits instead of four. The saga's creation rides with the step's BEGIN
    /// (durable before the effect), and the step's COMMIT with `Done` (durable before the
    /// answer). The answer is the call's: [`CallAnswer::Committed`] once the saga is
    /// `Done`, closed; a rollback, closed; [`CallAnswer::AwaitingApproval`] with the saga
    /// open, in the log and waiting, for [`LiveSaga::resume`] then [`LiveSaga::commit`]; a
    /// refusal with the saga open and nothing of it in the log, or a conflict with the saga
    /// open and its creation in the log (it rode with the refused claim's batch), for the
    /// caller to [`abort`](LiveSaga::abort), which writes the saga rolled back.
    /// [`CallAnswer::saga_open`] does not apply: a `Committed` saga here is closed.
    ///
    /// # Errors
    ///
    /// As [`begin`](Self::begin) and [`LiveSaga::call`].
    pub async fn call_alone(
        self: &Arc<Self>,
        options: BeginOptions,
        tool: &str,
        args: Value,
        idempotency_key: Option<String>,
    ) -> Result<(LiveSaga, CallAnswer), KernelError> {
        let step = plan_step(tool, args, idempotency_key)?;
        let saga = self.open_saga(options, Creation::WithFirstWrite).await?;
        let answer = saga.take(step, Lookahead::End).await?;
        Ok((saga, answer))
    }

    /// Opens a live saga, written to the log at once or with its first write.
    async fn open_saga(
        self: &Arc<Self>,
        options: BeginOptions,
        creation: Creation,
    ) -> Result<LiveSaga, KernelError> {
        check_label("name", options.name.as_ref())?;
        check_label("actor", options.actor.as_ref())?;
        let limits = self.tools.limits();
        if self.live.lock().len() >= limits.open_sagas_max {
            return Err(KernelError::TooManyOpenSagas {
                max: limits.open_sagas_max,
            });
        }
        let actor_idle = self.actor_idle(options.actor.as_deref()).await?;
        let state = match self.fsm.apply(
            SagaState::Idle,
            Event::StartSaga,
            &start_facts(true, actor_idle),
        ) {
            Ok(state) => state,
            Err(denial) => {
                self.record_plan_denied(
                    options.name.clone(),
                    options.actor.clone(),
                    false,
                    vec![StepDenial {
                        step_idx: None,
                        tool: None,
                        args: None,
                        reason: denial.to_string(),
                    }],
                )
                .await;
                return Err(KernelError::Denied {
                    saga_id: None,
                    denial,
                });
            }
        };
        let require_actor_idle = options.actor.is_some() && self.start_with_actor_busy().is_err();
        let saga_id = self.env.ids.new_saga_id();
        let mut saga = SagaInFlight::start(
            self.new_saga_record(
                &saga_id,
                options.name,
                options.actor,
                0,
                state,
                false,
                require_actor_idle,
            ),
            8,
        );
        if creation == Creation::Now {
            // Durable at once: the saga exists, holds its actor, and is recovered if this
            // process dies before it ends.
            let batch = saga.take_batch();
            self.write_saga_batch(&saga, batch).await?;
        }
        let entry = Arc::new(LiveEntry {
            on_denied: options.on_denied,
            saga: tokio::sync::Mutex::new(Some(saga)),
            touched: Mutex::new(Instant::now()),
            ended: Arc::new(tokio::sync::Notify::new()),
        });
        let registered = {
            let mut sagas = self.live.lock();
            let room = sagas.len() < limits.open_sagas_max;
            if room {
                sagas.insert(saga_id.clone(), Arc::clone(&entry));
            }
            room
        };
        if !registered && creation == Creation::WithFirstWrite {
            // Others were begun meanwhile; nothing of this one was written.
            return Err(KernelError::TooManyOpenSagas {
                max: limits.open_sagas_max,
            });
        }
        if !registered {
            // Others were begun meanwhile: this one exists in the log, so it is rolled back.
            let handle = LiveSaga {
                kernel: Arc::clone(self),
                saga_id: saga_id.clone(),
                entry,
            };
            handle
                .end(
                    AbortCause::Requested,
                    "over open_sagas_max".to_owned(),
                    None,
                )
                .await?;
            return Err(KernelError::TooManyOpenSagas {
                max: limits.open_sagas_max,
            });
        }
        info!(saga_id = %saga_id, "live saga begun");
        spawn_idle_watch(
            Arc::downgrade(self),
            saga_id.clone(),
            Arc::downgrade(&entry),
            Duration::from_millis(limits.saga_idle_timeout_ms),
        );
        Ok(LiveSaga {
            kernel: Arc::clone(self),
            saga_id,
            entry,
        })
    }

    /// The open live saga `saga_id` of this process, if there is one.
    pub fn live_saga(self: &Arc<Self>, saga_id: &SagaId) -> Option<LiveSaga> {
        self.live.get(saga_id).map(|entry| LiveSaga {
            kernel: Arc::clone(self),
            saga_id: saga_id.clone(),
            entry,
        })
    }

    /// The ids of the live sagas this process holds open.
    pub fn open_live_sagas(&self) -> Vec<SagaId> {
        self.live.ids()
    }

    /// Rolls back every live saga this process holds open, recording `cause` and `reason`
    /// (a server closing: end of input, a signal). Returns their reports.
    ///
    /// # Errors
    ///
    /// [`KernelError::Log`] when the log fails; the sagas not yet rolled back are left to
    /// `recover`.
    pub async fn abort_open_sagas(
        self: &Arc<Self>,
        cause: AbortCause,
        reason: &str,
    ) -> Result<Vec<SagaReport>, KernelError> {
        let mut reports = Vec::new();
        for saga_id in self.live.ids() {
            if let Some(saga) = self.live_saga(&saga_id)
                && let Some(report) = saga.end(cause, reason.to_owned(), None).await?
            {
                reports.push(report);
            }
        }
        Ok(reports)
    }
}

/// Rolls the saga back once it has been untouched for `idle`; ends as soon as the saga
/// leaves the registry.
fn spawn_idle_watch(kernel: Weak<Kernel>, saga_id: SagaId, entry: Weak<LiveEntry>, idle: Duration) {
    let Some(ended) = entry.upgrade().map(|entry| Arc::clone(&entry.ended)) else {
        return;
    };
    tokio::spawn(async move {
        loop {
            let Some(deadline) = entry.upgrade().map(|entry| entry.touched() + idle) else {
                return;
            };
            if tokio::time::timeout_at(deadline, ended.notified())
                .await
                .is_ok()
            {
                return;
            }
            let (Some(kernel), Some(entry)) = (kernel.upgrade(), entry.upgrade()) else {
                return;
            };
            if entry.touched() + idle > Instant::now() {
                continue;
            }
            let saga = LiveSaga {
                kernel,
                saga_id: saga_id.clone(),
                entry,
            };
            let reason = format!(
                "untouched for {} ms (saga_idle_timeout_ms)",
                idle.as_millis()
            );
            match saga.end(AbortCause::IdleTimeout, reason, Some(idle)).await {
                Ok(Some(_)) => warn!(saga_id = %saga_id, "idle live saga rolled back"),
                Ok(None) if saga.entry.saga.try_lock().is_ok_and(|slot| slot.is_some()) => {
                    // Touched while the watch waited for it: watch again.
                    continue;
                }
                Ok(None) => {}
                Err(error) => {
                    warn!(saga_id = %saga_id, %error, "the idle live saga could not be rolled back; it is left to recover")
                }
            }
            return;
        }
    });
}

impl LiveSaga {
    /// The saga's id.
    pub fn id(&self) -> &SagaId {
        &self.saga_id
    }

    /// Calls `tool` with `args` (and an idempotency key) as the saga's next step.
    ///
    /// The call is checked like a plan's step; bad input is refused
    /// ([`CallAnswer::Refused`]) with nothing run and the saga still open. Otherwise the
    /// previous step's success is settled, the FSM admits the step, its intent is made
    /// durable, the tool runs, and its outcome is made durable before the answer: the output
    /// ([`CallAnswer::Committed`]), or, for a failure, the saga rolled back
    /// ([`CallAnswer::Failed`]), after which the saga is closed. A denial by the sandbox or
    /// the FSM follows the saga's [`BeginOptions::on_denied`]: the saga rolled back
    /// ([`CallAnswer::Denied`]), or the call refused with the saga still open
    /// ([`CallAnswer::Refused`]). A denial found only while the tool runs (a link out of the
    /// allowed roots met when the file is opened) always rolls the saga back: the step had
    /// begun.
    ///
    /// # Errors
    ///
    /// [`KernelError::SagaNotOpen`] when the saga has ended; [`KernelError::InvalidRequest`]
    /// for an idempotency key that is empty or too long; [`KernelError::Interrupted`] when
    /// the log fails (the saga is then left for `recover`).
    pub async fn call(
        &self,
        tool: &str,
        args: Value,
        idempotency_key: Option<String>,
    ) -> Result<CallAnswer, KernelError> {
        let step = plan_step(tool, args, idempotency_key)?;
        self.take(step, Lookahead::Unknown).await
    }

    /// Takes `step` as the saga's next step: more may follow (`Unknown`), or the saga is
    /// committed with it (`End`, [`Kernel::call_alone`]).
    async fn take(&self, step: PlanStep, then: Lookahead) -> Result<CallAnswer, KernelError> {
        let span = info_span!("saga", saga_id = %self.saga_id, live = true);
        let on_denied = self.entry.on_denied;
        self.with_saga(move |kernel, saga| Box::pin(kernel.live_call(saga, step, on_denied, then)))
            .instrument(span)
            .await
    }

    /// Resumes the saga while it waits for an operator's approval
    /// ([`CallAnswer::AwaitingApproval`]): still pending, the same answer, nothing written;
    /// approved, the step runs once with exactly the approved arguments (the request consumed
    /// in the same transaction as its BEGIN) and the answer is the call's; rejected, expired
    /// or void, the saga is rolled back ([`CallAnswer::Denied`]).
    ///
    /// # Errors
    ///
    /// [`KernelError::SagaNotOpen`] when the saga has ended;
    /// [`KernelError::NotAwaitingApproval`] when it waits for nothing;
    /// [`KernelError::Interrupted`] when the log fails.
    pub async fn resume(&self) -> Result<CallAnswer, KernelError> {
        let span = info_span!("saga", saga_id = %self.saga_id, live = true, resumed = true);
        self.with_saga(|kernel, saga| Box::pin(kernel.live_resume(saga)))
            .instrument(span)
            .await
    }

    /// Commits the saga: the last step's success is settled as a plan's last step's, and
    /// `Done` is durable before this returns. The saga is closed afterwards, whatever the
    /// outcome.
    ///
    /// # Errors
    ///
    /// [`KernelError::SagaNotOpen`] when the saga has ended; [`KernelError::Denied`] when
    /// the FSM refuses the commit (a table without `Planning --ValidationPassed--> Done`
    /// refuses a saga with no step), after the saga was rolled back;
    /// [`KernelError::Interrupted`] when the log fails.
    pub async fn commit(&self) -> Result<SagaReport, KernelError> {
        let span = info_span!("saga", saga_id = %self.saga_id, live = true);
        let kernel = Arc::clone(&self.kernel);
        let result = async {
            let mut slot = self.entry.saga.lock().await;
            let saga = slot
                .take()
                .ok_or_else(|| KernelError::SagaNotOpen(self.saga_id.clone()))?;
            let mut abandoned = Unregister {
                registry: &self.kernel.live,
                saga_id: &self.saga_id,
                armed: true,
            };
            let committed = kernel.live_commit(saga).await;
            abandoned.armed = false;
            // Out of the registry once it has ended in the log (or the log failed).
            self.kernel.live.remove(&self.saga_id);
            committed
        }
        .instrument(span)
        .await;
        self.interrupted(result)
    }

    /// Aborts the saga: `reason` is recorded (`SagaAborted`), then every step whose effect
    /// may be in place is compensated, last first, as after a failure. The saga is closed.
    ///
    /// # Errors
    ///
    /// [`KernelError::SagaNotOpen`] when the saga has ended; [`KernelError::Interrupted`]
    /// when the log fails.
    pub async fn abort(&self, reason: &str) -> Result<SagaReport, KernelError> {
        match self
            .end(AbortCause::Requested, reason.to_owned(), None)
            .await?
        {
            Some(report) => Ok(report),
            None => Err(KernelError::SagaNotOpen(self.saga_id.clone())),
        }
    }

    /// Where the saga stands, with the outputs of its committed steps; `None` once it has
    /// ended. Looking counts as a touch for the idle timeout.
    pub async fn status(&self) -> Option<LiveStatus> {
        self.entry.touch();
        let slot = self.entry.saga.lock().await;
        slot.as_ref().map(|saga| LiveStatus {
            saga_id: saga.saga_id.clone(),
            state: saga.state,
            steps: saga.committed.clone(),
            approval: saga.waiting_on.clone(),
        })
    }

    /// Ends the saga without a commit, for `cause`; `None` when it had already ended, or,
    /// with `idle`, when it was touched within `idle` after all (checked under its lock, so
    /// a call that ran long is never followed by its saga's rollback).
    async fn end(
        &self,
        cause: AbortCause,
        reason: String,
        idle: Option<Duration>,
    ) -> Result<Option<SagaReport>, KernelError> {
        let span = info_span!("saga", saga_id = %self.saga_id, live = true);
        let kernel = Arc::clone(&self.kernel);
        let result = async {
            let mut slot = self.entry.saga.lock().await;
            if let Some(idle) = idle
                && self.entry.touched() + idle > Instant::now()
            {
                return Ok(None);
            }
            // A saga waiting for a person is not idle until its request expires: its
            // approval timeout, not the agent's silence, decides.
            if idle.is_some()
                && let Some(request) = slot.as_ref().and_then(|saga| saga.waiting_on.as_ref())
                && request.expires_at_ms > self.kernel.env.clock.now_ms()
            {
                self.entry.touch();
                return Ok(None);
            }
            let Some(saga) = slot.take() else {
                self.kernel.live.remove(&self.saga_id);
                return Ok(None);
            };
            info!(cause = cause.as_str(), %reason, "live saga aborted");
            let ended = async {
                kernel
                    .audit(AuditEvent::SagaAborted(SagaAbort {
                        saga_id: saga.saga_id.clone(),
                        cause,
                        reason,
                        by: kernel.env.owner.clone(),
                    }))
                    .await?;
                kernel.fail_saga(saga, None, &NoObserver).await.map(Some)
            }
            .await;
            // Out of the registry once it has ended in the log (or the log failed).
            self.kernel.live.remove(&self.saga_id);
            ended
        }
        .instrument(span)
        .await;
        self.interrupted(result)
    }

    /// Runs `work` on the open saga, one at a time; closes it when `work` ends it.
    async fn with_saga<'a>(
        &'a self,
        work: impl FnOnce(
            &'a Kernel,
            SagaInFlight,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<LiveStep, KernelError>> + Send + 'a>,
        >,
    ) -> Result<CallAnswer, KernelError> {
        let mut slot = self.entry.saga.lock().await;
        let saga = slot
            .take()
            .ok_or_else(|| KernelError::SagaNotOpen(self.saga_id.clone()))?;
        self.entry.touch();
        let mut abandoned = Unregister {
            registry: &self.kernel.live,
            saga_id: &self.saga_id,
            armed: true,
        };
        let result = work(&self.kernel, saga).await;
        abandoned.armed = false;
        self.entry.touch();
        match result {
            Ok(LiveStep::Open(saga, answer)) => {
                *slot = Some(*saga);
                Ok(answer)
            }
            Ok(LiveStep::Closed(answer)) => {
                self.kernel.live.remove(&self.saga_id);
                Ok(answer)
            }
            Ok(LiveStep::Unchanged(saga, error)) => {
                *slot = Some(*saga);
                Err(error)
            }
            Err(error) => {
                // The log failed: what was begun is in it, for `recover`.
                self.kernel.live.remove(&self.saga_id);
                self.interrupted(Err(error))
            }
        }
    }

    /// A log failure while the saga ran, as [`KernelError::Interrupted`].
    fn interrupted<T>(&self, result: Result<T, KernelError>) -> Result<T, KernelError> {
        result.map_err(|error| match error {
            KernelError::Log(source) => KernelError::Interrupted {
                saga_id: self.saga_id.clone(),
                source,
            },
            other => other,
        })
    }
}

/// Removes a saga from the registry when dropped armed: its driver's future was dropped
/// (or panicked) after taking the saga out, so the saga is lost to this process; it stays
/// in the log, owned by this process, for `recover` once the process has ended.
struct Unregister<'a> {
    registry: &'a LiveRegistry,
    saga_id: &'a SagaId,
    armed: bool,
}

impl Drop for Unregister<'_> {
    fn drop(&mut self) {
        if self.armed {
            warn!(saga_id = %self.saga_id, "a live saga's call was abandoned midway; the saga is left to recover");
            self.registry.remove(self.saga_id);
        }
    }
}

/// A call's outcome for the registry: the saga still open, or closed, or a call refused
/// before anything of it ran (the saga open as it was, the call failing with the error).
pub(crate) enum LiveStep {
    Open(Box<SagaInFlight>, CallAnswer),
    Closed(CallAnswer),
    Unchanged(Box<SagaInFlight>, KernelError),
}
