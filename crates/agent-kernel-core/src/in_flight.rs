//! A saga while a driver runs it ([`SagaInFlight`]): where it stands in memory and in the
//! log, the records queued for its next write, the steps it committed, and the success of
//! its last step not yet settled with the FSM.

use agent_kernel_api::{
    ApprovalDecision, ApprovalRecord, ApprovalRequest, BeginStep, DecideApproval, LogWrite,
    NewSaga, SagaId, SagaRecord, SagaState, StepStatus, ToolError, ToolOutput,
};

use crate::report::StepReport;

/// A step that succeeded and whose success the FSM has not yet been told of: what follows
/// it decides the facts (a live saga learns that only at its next call or its commit).
#[derive(Debug, Clone)]
pub(crate) struct PendingSuccess {
    pub(crate) step_seq: u32,
    pub(crate) tool: String,
    pub(crate) hint: Option<String>,
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
    pub(crate) persisted: SagaState,
    pub(crate) pending: Vec<LogWrite>,
    /// The steps that committed (or were reused), in order, with their outputs.
    pub(crate) committed: Vec<StepReport>,
    /// The position of the next step.
    pub(crate) next_seq: u32,
    /// The last step's success, not yet settled with the FSM.
    pub(crate) pending_success: Option<PendingSuccess>,
    /// The idempotency keys of the steps taken so far, with their positions.
    pub(crate) keys: Vec<(String, u32)>,
    /// The approved request for the next step, when the saga resumes after a decision.
    pub(crate) approved: Option<ApprovalRecord>,
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

    /// Gives back position `step_seq`, and the use of `key` there, to a step that did not
    /// begin and leaves no record in the saga: the next step takes them.
    pub(crate) fn give_back(&mut self, step_seq: u32, key: Option<&str>) {
        self.next_seq = step_seq;
        if let Some(key) = key {
            self.keys
                .retain(|(used, seq)| !(used == key && *seq == step_seq));
        }
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

    pub(crate) fn committed(&mut self, seq: u32, tool: &str, output: &ToolOutput, reused: bool) {
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
