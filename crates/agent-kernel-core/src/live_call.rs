//! Each call of a live saga over the step path (reference §8): a call, with what the
//! sandbox and the FSM rule on it before anything is written; a resume after an approval;
//! the commit. `live.rs` holds the sagas and hands each call its saga; here is what a call
//! does to it.

use agent_kernel_api::{ApprovalStatus, AuditEvent, CallRefusal, OnDenied, PlanStep, SagaState};
use agent_kernel_fsm::{Denial, Event};
use tracing::warn;

use crate::in_flight::PendingSuccess;
use crate::kernel::Kernel;
use crate::live::{CallAnswer, LiveStep};
use crate::plan::start_facts;
use crate::report::{NoObserver, SagaReport};
use crate::step::{Lookahead, SagaInFlight, StepEnd, StepMode, step_denied};
use crate::{KernelError, Problem, ProblemKind};

impl Kernel {
    /// One call of a live saga, over the step path.
    pub(crate) async fn live_call(
        &self,
        mut saga: SagaInFlight,
        step: PlanStep,
        on_denied: OnDenied,
        then: Lookahead,
    ) -> Result<LiveStep, KernelError> {
        if let Some(request) = &saga.waiting_on {
            let problem = Problem {
                step_idx: request.step_seq as usize,
                tool: step.tool,
                kind: ProblemKind::InvalidArgs,
                message: format!(
                    "the saga waits for approval {} of its step {}; call `saga_resume` (or `LiveSaga::resume`) once it is decided",
                    request.approval_id, request.step_seq
                ),
            };
            return Ok(LiveStep::Open(Box::new(saga), CallAnswer::Refused(problem)));
        }
        let step_idx = saga.next_seq as usize;
        let checked = self.checked_step(step_idx, &step).await?;
        let mut problems = checked.problems;
        if let Some(key) = &step.idempotency_key
            && let Some(first) = saga.step_with_key(key)
        {
            // As a plan's preflight refuses a key repeated within the plan.
            problems.push(Problem {
                step_idx,
                tool: step.tool.clone(),
                kind: ProblemKind::KeyConflict,
                message: format!(
                    "idempotency key `{key}` is also used by step {first} of this saga"
                ),
            });
        }
        if let Some(problem) = problems.first() {
            if let Some(denial) = checked.denial
                && on_denied == OnDenied::Rollback
            {
                // As a run's: a denial rolls the saga back, with the step recorded refused.
                let tool = self
                    .tools
                    .get(&step.tool)
                    .expect("a denial comes from a registered tool's check")
                    .clone();
                let failure = self.refuse_step(&mut saga, &step, tool.as_ref(), denial);
                let report = self.fail_saga(saga, Some(failure), &NoObserver).await?;
                return Ok(LiveStep::Closed(CallAnswer::rolled_back(report)));
            }
            let problem = problem.clone();
            return self.refuse_call(saga, &step, problem).await;
        }
        let tool = self
            .tools
            .get(&step.tool)
            .expect("checked just above")
            .clone();
        // Where the saga stood before this call, for a call that runs nothing (a conflict).
        let before = (saga.state, saga.pending_success.clone());
        // The previous step's success, now that what follows it is known.
        if let Err(failure) = self.settle(&mut saga, Lookahead::Step(tool.effect())) {
            if on_denied == OnDenied::Refuse && failure.error.is_denied() {
                return self
                    .refuse_denied(saga, before, &step, failure.error.to_string())
                    .await;
            }
            let report = self.fail_saga(saga, Some(failure), &NoObserver).await?;
            return Ok(LiveStep::Closed(CallAnswer::rolled_back(report)));
        }
        if saga.state == SagaState::Planning {
            // The first call makes the plan non-empty.
            match self
                .fsm
                .apply(saga.state, Event::PlanReady, &start_facts(true, true))
            {
                Ok(state) => saga.state = state,
                Err(denial) if on_denied == OnDenied::Refuse => {
                    let message = step_denied(denial, &step.tool).to_string();
                    return self.refuse_denied(saga, before, &step, message).await;
                }
                Err(denial) => {
                    let failure = self.refuse_step(
                        &mut saga,
                        &step,
                        tool.as_ref(),
                        step_denied(denial, &step.tool),
                    );
                    let report = self.fail_saga(saga, Some(failure), &NoObserver).await?;
                    return Ok(LiveStep::Closed(CallAnswer::rolled_back(report)));
                }
            }
        }
        if on_denied == OnDenied::Refuse
            && let Err(denial) = self.admit_step(saga.state, tool.effect(), then)
        {
            // What the step path's admission would deny, refused before anything is written.
            let message = step_denied(denial, &step.tool).to_string();
            return self.refuse_denied(saga, before, &step, message).await;
        }
        match self.live_step(saga, &step, then).await? {
            LiveStep::Open(mut saga, answer @ CallAnswer::Conflict(_)) => {
                // Nothing of the call ran: the saga stands where it stood, its previous
                // step's success settled by whatever comes next (a state already written
                // is written again by the next record).
                (saga.state, saga.pending_success) = before;
                Ok(LiveStep::Open(saga, answer))
            }
            other => Ok(other),
        }
    }

    /// Refuses a call of which nothing ran: the refusal is in the audit chain
    /// (`CallRefused`), and the saga stays open where it stood.
    async fn refuse_call(
        &self,
        saga: SagaInFlight,
        step: &PlanStep,
        problem: Problem,
    ) -> Result<LiveStep, KernelError> {
        warn!(saga_id = %saga.saga_id, tool = %step.tool, problem = %problem, "call refused");
        self.audit(AuditEvent::CallRefused(CallRefusal {
            saga_id: saga.saga_id.clone(),
            tool: step.tool.clone(),
            args: step.args.clone(),
            reason: problem.message.clone(),
            by: self.env.owner.clone(),
        }))
        .await?;
        Ok(LiveStep::Open(Box::new(saga), CallAnswer::Refused(problem)))
    }

    /// Refuses a call the sandbox or the FSM denied under [`OnDenied::Refuse`]: the saga
    /// goes back to where it stood `before` the call (its state and its previous step's
    /// pending success, which settling for this call changed), as if it had not been made.
    async fn refuse_denied(
        &self,
        mut saga: SagaInFlight,
        before: (SagaState, Option<PendingSuccess>),
        step: &PlanStep,
        message: String,
    ) -> Result<LiveStep, KernelError> {
        (saga.state, saga.pending_success) = before;
        let problem = Problem {
            step_idx: saga.next_seq as usize,
            tool: step.tool.clone(),
            kind: ProblemKind::Denied,
            message,
        };
        self.refuse_call(saga, step, problem).await
    }

    /// Takes `step` as the live saga's next step over the step path and makes its outcome
    /// durable before the answer; with `then` [`Lookahead::End`], the saga is committed
    /// with it (the COMMIT rides with `Done`).
    async fn live_step(
        &self,
        mut saga: SagaInFlight,
        step: &PlanStep,
        then: Lookahead,
    ) -> Result<LiveStep, KernelError> {
        match self
            .take_step(&mut saga, step, then, StepMode::Run, None, &NoObserver)
            .await?
        {
            StepEnd::Taken => {
                let report = saga
                    .committed
                    .last()
                    .expect("the step just committed")
                    .clone();
                if then == Lookahead::End {
                    // The outcome and `Done` in one synced commit, before the answer.
                    let ended = self.end_settled(saga).await?;
                    return Ok(LiveStep::Closed(if ended.state == SagaState::Done {
                        CallAnswer::Committed(report)
                    } else {
                        CallAnswer::rolled_back(ended)
                    }));
                }
                // The outcome is durable before the agent sees it.
                let batch = saga.take_batch();
                self.write_saga_batch(&saga, batch).await?;
                Ok(LiveStep::Open(
                    Box::new(saga),
                    CallAnswer::Committed(report),
                ))
            }
            StepEnd::Failed(failure) => {
                let report = self.fail_saga(saga, Some(failure), &NoObserver).await?;
                Ok(LiveStep::Closed(CallAnswer::rolled_back(report)))
            }
            StepEnd::AwaitingApproval(request) => Ok(LiveStep::Open(
                Box::new(saga),
                CallAnswer::AwaitingApproval(request),
            )),
            StepEnd::Conflict {
                conflict,
                begin,
                approved,
            } => {
                // As bad input: the saga stays open and its next call takes this position,
                // with the approval this one would have used, if any.
                saga.give_back(begin.step_seq, begin.idempotency_key.as_deref());
                saga.approved = approved.map(|approval| *approval);
                Ok(LiveStep::Open(
                    Box::new(saga),
                    CallAnswer::Conflict(conflict),
                ))
            }
        }
    }

    /// Resumes a live saga that waits for an approval: still pending, the same answer;
    /// approved, the step runs; rejected, expired or void, the saga rolls back. A saga that
    /// does not wait, whose request the log lacks, or whose grant the FSM refuses stays
    /// open as it was ([`LiveStep::Unchanged`]).
    pub(crate) async fn live_resume(&self, saga: SagaInFlight) -> Result<LiveStep, KernelError> {
        let Some(request) = saga.waiting_on.clone() else {
            let error = KernelError::NotAwaitingApproval {
                saga_id: saga.saga_id.clone(),
                state: saga.state,
            };
            return Ok(LiveStep::Unchanged(Box::new(saga), error));
        };
        let approval = match self.approval(&request.approval_id).await {
            Ok(approval) => approval,
            Err(error @ KernelError::ApprovalNotFound(_)) => {
                return Ok(LiveStep::Unchanged(Box::new(saga), error));
            }
            Err(error) => return Err(error),
        };
        match approval.status_at(self.env.clock.now_ms()) {
            ApprovalStatus::Pending => Ok(LiveStep::Open(
                Box::new(saga),
                CallAnswer::AwaitingApproval(request),
            )),
            ApprovalStatus::Approved => {
                let step = PlanStep {
                    tool: request.tool_id.clone(),
                    args: request.args.clone(),
                    idempotency_key: request.idempotency_key.clone(),
                };
                let granted = match self.granted_state() {
                    Ok(granted) => granted,
                    Err(error) => return Ok(LiveStep::Unchanged(Box::new(saga), error)),
                };
                let saga = saga.granted(granted, approval);
                self.live_step(saga, &step, Lookahead::Unknown).await
            }
            status => {
                let record = self.load(&saga.saga_id).await?;
                let report = self
                    .roll_back_unapproved(&record, &approval, status, &NoObserver)
                    .await?;
                Ok(LiveStep::Closed(CallAnswer::rolled_back(report)))
            }
        }
    }

    /// Rolls back a saga whose commit the FSM refuses, and answers the denial.
    async fn refuse_commit(
        &self,
        saga: SagaInFlight,
        denial: Denial,
    ) -> Result<SagaReport, KernelError> {
        let saga_id = saga.saga_id.clone();
        self.fail_saga(saga, None, &NoObserver).await?;
        Err(KernelError::Denied {
            saga_id: Some(saga_id),
            denial,
        })
    }

    /// Commits a live saga.
    pub(crate) async fn live_commit(
        &self,
        mut saga: SagaInFlight,
    ) -> Result<SagaReport, KernelError> {
        if let Some(request) = &saga.waiting_on {
            // Its last step never ran: the saga cannot be complete. Rolled back, as a
            // commit the FSM refuses is.
            let denial = Denial {
                state: saga.state,
                event: Some(Event::ValidationPassed),
                tool: Some(request.tool_id.clone()),
                rule: agent_kernel_fsm::Rule::NotInTable,
            };
            return self.refuse_commit(saga, denial).await;
        }
        if saga.state == SagaState::Planning {
            // No step was ever called: there is nothing to validate, and the saga is
            // complete (`Planning --ValidationPassed[saga_complete]--> Done`).
            let facts = Lookahead::End.facts(None);
            let denial = match self.fsm.apply(saga.state, Event::ValidationPassed, &facts) {
                Ok(SagaState::Done) => {
                    saga.state = SagaState::Done;
                    return self.finish_done(saga).await;
                }
                Err(denial) => denial,
                Ok(_) => Denial {
                    state: saga.state,
                    event: Some(Event::ValidationPassed),
                    tool: None,
                    rule: agent_kernel_fsm::Rule::NotInTable,
                },
            };
            return self.refuse_commit(saga, denial).await;
        }
        self.end_settled(saga).await
    }

    /// Ends a saga with its last step's success settled as a plan's last step's: `Done`
    /// (durable, with whatever the saga queued), or, if the FSM refuses that end, rolled
    /// back.
    async fn end_settled(&self, mut saga: SagaInFlight) -> Result<SagaReport, KernelError> {
        match self.settle(&mut saga, Lookahead::End) {
            Ok(()) => self.finish_done(saga).await,
            Err(failure) => self.fail_saga(saga, Some(failure), &NoObserver).await,
        }
    }
}
