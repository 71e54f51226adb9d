//! Approvals (reference §10): which steps wait for an operator, the request bound to the
//! exact step, the decisions, and resuming a saga once its step is decided.
//!
//! A step needs an approval when its tool's reversibility is `none`, or when its tool id
//! matches a glob of `[approval] require`. The step path (`step.rs`) then writes, before
//! anything of the step runs, the request and the saga's move to `AwaitingApproval`, and
//! the driver stops there. [`Kernel::decide_approval`] records an operator's decision;
//! [`Kernel::resume`] continues the saga (in this process or another): approved, the step
//! runs once, the request consumed in its BEGIN's transaction; rejected, expired or void,
//! the saga rolls back.

use std::time::Duration;

use agent_kernel_api::{
    ApprovalDecision, ApprovalRecord, ApprovalRequest, ApprovalStatus, DecideApproval, DynTool,
    LogWrite, MAX_DECISION_NOTE_BYTES, Plan, PlanStep, SagaId, SagaRecord, SagaState, ToolError,
    TxError, WriteOutcome,
};
use agent_kernel_fsm::{Event, Facts};
use tracing::{Instrument, info, info_span, warn};

use crate::approval_policy::{
    APPROVAL_POLL_INTERVAL, OperatorDecision, approval_digest, operator_key_check,
};
use crate::in_flight::SagaInFlight;
use crate::kernel::Kernel;
use crate::report::{Failure, Observer, SagaReport};
use crate::{Cancellation, KernelError};

impl Kernel {
    /// Queues the cancellation of approval `approval_id`, which its step will not use, with
    /// `reason`, decided by this process.
    pub(crate) fn cancel_approval(
        &self,
        saga: &mut SagaInFlight,
        approval_id: String,
        reason: String,
    ) {
        saga.pending.push(LogWrite::DecideApproval(DecideApproval {
            approval_id,
            decision: ApprovalDecision::Cancel,
            by: self.env.owner.clone(),
            uid: self.operator_uid(),
            user: Some("agent-kernel (the approval could not be used)".to_owned()),
            note: Some(reason),
        }));
    }

    /// Why the step of `tool_id` needs an approval, or `None`.
    pub(crate) fn approval_reason(&self, tool_id: &str, tool: &dyn DynTool) -> Option<String> {
        self.approvals.reason_for(tool_id, tool)
    }

    /// The request for step `step_seq` of `saga`, asked for now.
    pub(crate) fn approval_request(
        &self,
        saga: &SagaInFlight,
        step_seq: u32,
        step: &PlanStep,
        rest: Option<&[PlanStep]>,
        duplicate_of: Option<agent_kernel_api::DuplicateStep>,
    ) -> ApprovalRequest {
        let requested_at_ms = self.env.clock.now_ms();
        let timeout_ms = i64::try_from(self.approvals.timeout_ms()).unwrap_or(i64::MAX);
        ApprovalRequest {
            approval_id: self.env.ids.new_record_id(),
            saga_id: saga.saga_id.clone(),
            step_seq,
            tool_id: step.tool.clone(),
            args: step.args.clone(),
            idempotency_key: step.idempotency_key.clone(),
            digest: approval_digest(&saga.saga_id, step_seq, &step.tool, &step.args),
            rest: rest.map(<[PlanStep]>::to_vec),
            requested_at_ms,
            expires_at_ms: requested_at_ms.saturating_add(timeout_ms),
            operator_key_check: self.approvals.operator_key_check().map(str::to_owned),
            duplicate_of,
        }
    }

    /// Every request still waiting for a decision (expired ones, whose sagas roll back when
    /// next looked at, included), oldest first.
    ///
    /// # Errors
    ///
    /// [`KernelError::Log`] when the log cannot be read.
    pub async fn pending_approvals(&self) -> Result<Vec<ApprovalRecord>, KernelError> {
        Ok(self.log.pending_approvals().await?)
    }

    /// One request.
    ///
    /// # Errors
    ///
    /// [`KernelError::ApprovalNotFound`]; [`KernelError::Log`].
    pub async fn approval(&self, approval_id: &str) -> Result<ApprovalRecord, KernelError> {
        self.log
            .approval(approval_id)
            .await?
            .ok_or_else(|| KernelError::ApprovalNotFound(approval_id.to_owned()))
    }

    /// Whether the process holding the live saga that asked `request` is gone: not this
    /// process, not left detached for any process to resume, and found dead (its process
    /// gone from this machine, or its lease run out). Only that process could run a live
    /// saga's step, so its request waits for `recover`, which rolls the saga back, and an
    /// approval would move nothing. A plan's request is never so: any process resumes a
    /// plan (`resume --saga`), taking it over from a dead owner. On a log that keeps leases,
    /// finding the owner's process gone from this machine ends its lease, as recovery does.
    ///
    /// # Errors
    ///
    /// [`KernelError::SagaNotFound`]; [`KernelError::Log`].
    pub async fn holder_gone(&self, request: &ApprovalRequest) -> Result<bool, KernelError> {
        if request.rest.is_some() {
            return Ok(false);
        }
        let record = self.load(&request.saga_id).await?;
        let owner = &record.saga.owner;
        if owner.is_detached() || *owner == self.env.owner || record.saga.state.is_terminal() {
            return Ok(false);
        }
        Ok(self.owner_liveness(owner).await? == crate::Liveness::Dead)
    }

    /// Records an operator's decision on a pending request, in the audit chain with the
    /// user and the note. The waiting saga moves on when its process next looks (or at
    /// [`Kernel::resume`]).
    ///
    /// # Errors
    ///
    /// [`KernelError::ApprovalNotFound`]; [`KernelError::ApprovalClosed`] when the request
    /// was already decided, has expired, or its saga was rolled back (nothing changes);
    /// [`KernelError::InvalidRequest`] for a note too long;
    /// [`KernelError::OperatorKeyRequired`] and [`KernelError::OperatorKeyMismatch`] when
    /// the request names an operator key and it is not given;
    /// [`KernelError::HolderGone`] for an approval when the process holding the live saga
    /// is gone ([`holder_gone`](Self::holder_gone)), until `recover` settles it (a
    /// rejection is recorded: the saga rolls back either way);
    /// [`KernelError::Log`].
    pub async fn decide_approval(
        &self,
        approval_id: &str,
        decision: OperatorDecision,
    ) -> Result<ApprovalRecord, KernelError> {
        if let Some(note) = &decision.note
            && note.len() > MAX_DECISION_NOTE_BYTES
        {
            return Err(KernelError::InvalidRequest(format!(
                "the note is {} bytes, more than the maximum of {MAX_DECISION_NOTE_BYTES}",
                note.len()
            )));
        }
        let record = self.approval(approval_id).await?;
        if let Some(required) = &record.request.operator_key_check {
            // The request names the key of the policy it was asked under; the decider's
            // own policy does not matter.
            match &decision.operator_key {
                None => return Err(KernelError::OperatorKeyRequired(approval_id.to_owned())),
                Some(key) if operator_key_check(key) != *required => {
                    return Err(KernelError::OperatorKeyMismatch(approval_id.to_owned()));
                }
                Some(_) => {}
            }
        }
        let status = record.status_at(self.env.clock.now_ms());
        if status != ApprovalStatus::Pending {
            return Err(KernelError::ApprovalClosed {
                approval_id: approval_id.to_owned(),
                status,
            });
        }
        if decision.approve && self.holder_gone(&record.request).await? {
            return Err(KernelError::HolderGone {
                approval_id: approval_id.to_owned(),
                saga_id: record.request.saga_id.clone(),
            });
        }
        let kind = if decision.approve {
            ApprovalDecision::Approve
        } else {
            ApprovalDecision::Reject
        };
        let outcomes = self
            .log
            .write(vec![LogWrite::DecideApproval(DecideApproval {
                approval_id: approval_id.to_owned(),
                decision: kind,
                by: self.env.owner.clone(),
                uid: self.operator_uid(),
                user: decision.user,
                note: decision.note,
            })])
            .await?;
        if let Some(WriteOutcome::NotPending(status)) = outcomes.first() {
            // Another operator (or the expiry) came first.
            return Err(KernelError::ApprovalClosed {
                approval_id: approval_id.to_owned(),
                status: *status,
            });
        }
        info!(approval_id, approve = decision.approve, "approval decided");
        self.approval(approval_id).await
    }

    /// Waits until the request is decided or expires (looking at the log every
    /// [`APPROVAL_POLL_INTERVAL`]); returns it as it then stands. Writes nothing.
    ///
    /// # Errors
    ///
    /// [`KernelError::ApprovalNotFound`]; [`KernelError::Log`].
    pub async fn wait_for_decision(
        &self,
        approval_id: &str,
    ) -> Result<ApprovalRecord, KernelError> {
        loop {
            let record = self.approval(approval_id).await?;
            let now_ms = self.env.clock.now_ms();
            if record.status_at(now_ms) != ApprovalStatus::Pending {
                return Ok(record);
            }
            let until_expiry =
                u64::try_from(record.request.expires_at_ms.saturating_sub(now_ms)).unwrap_or(0);
            tokio::time::sleep(APPROVAL_POLL_INTERVAL.min(Duration::from_millis(until_expiry)))
                .await;
        }
    }

    /// Continues a saga waiting in `AwaitingApproval`, once its step is decided: approved,
    /// the step runs once with exactly the approved arguments (the request consumed in the
    /// same transaction as its BEGIN), then the plan's remaining steps; rejected, expired or
    /// void, the saga rolls back (the expiry recorded), and the report's failure says why
    /// (a denial: `run` exits 4). Still pending: the report says `AwaitingApproval`, and
    /// nothing is written.
    ///
    /// The saga's process may be this one or a dead one (`run --no-wait` then `resume`): it
    /// is taken over with a compare-and-swap on its owner. A live saga waiting in the
    /// process that holds it is resumed through [`LiveSaga::resume`](crate::LiveSaga::resume)
    /// instead; from another process, it is only rolled back by `recover`.
    ///
    /// # Errors
    ///
    /// [`KernelError::SagaNotFound`]; [`KernelError::NotAwaitingApproval`] for a saga that
    /// is neither waiting nor finished; [`KernelError::SagaBusy`] when its owner is alive;
    /// [`KernelError::InvalidRequest`] for a live saga (its own process resumes it);
    /// [`KernelError::TakenOver`]; [`KernelError::Log`].
    pub async fn resume(
        &self,
        saga_id: &SagaId,
        observer: &dyn Observer,
        cancel: &Cancellation,
    ) -> Result<SagaReport, KernelError> {
        let mut record = self.load(saga_id).await?;
        if record.saga.state.is_terminal() {
            // Finished already: its report says why, when its approval was refused.
            let failure = match self.log.saga_approval(saga_id).await? {
                Some(approval) if record.saga.state == SagaState::FailedRolledBack => {
                    match approval.status {
                        status @ (ApprovalStatus::Rejected
                        | ApprovalStatus::Expired
                        | ApprovalStatus::Cancelled) => {
                            Some(Self::unapproved_failure(&approval, status))
                        }
                        _ => None,
                    }
                }
                _ => None,
            };
            return Ok(SagaReport::from_record(&record, failure));
        }
        if record.saga.state != SagaState::AwaitingApproval {
            return Err(KernelError::NotAwaitingApproval {
                saga_id: saga_id.clone(),
                state: record.saga.state,
            });
        }
        let mut approval = self.waiting_approval(&record).await?;
        if approval.request.rest.is_none() {
            // A live saga: only its own process can run its next steps.
            if self.live.contains(saga_id) || record.saga.owner == self.env.owner {
                return Err(KernelError::InvalidRequest(format!(
                    "saga {saga_id} is a live saga open in this process: resume it through its handle"
                )));
            }
            return Err(KernelError::InvalidRequest(format!(
                "saga {saga_id} is a live saga: only the process that holds it can resume it (if that process has died, `agent-kernel recover` rolls it back)"
            )));
        }
        if approval.status_at(self.env.clock.now_ms()) == ApprovalStatus::Approved {
            // What runs is what the kernel recorded when it asked, checked before the saga
            // is taken over: a rewritten row leaves it waiting as it was, for an operator.
            approval = self.vouched_approval(&record).await?;
        }
        self.take_over(&mut record).await?;
        let span = info_span!("saga", saga_id = %saga_id, resumed = true);
        async {
            let now_ms = self.env.clock.now_ms();
            match approval.status_at(now_ms) {
                ApprovalStatus::Pending => {
                    Ok(SagaReport::from_record(&record, None)
                        .awaiting(Some(approval.request.clone())))
                }
                ApprovalStatus::Approved => {
                    let request = &approval.request;
                    let saga =
                        SagaInFlight::resumed(&record, self.granted_state()?, approval.clone());
                    let mut steps = vec![PlanStep {
                        tool: request.tool_id.clone(),
                        args: request.args.clone(),
                        idempotency_key: request.idempotency_key.clone(),
                    }];
                    steps.extend(request.rest.clone().unwrap_or_default());
                    let plan = Plan {
                        name: record.saga.name.clone(),
                        actor: record.saga.actor.clone(),
                        steps,
                    };
                    info!(approval_id = %request.approval_id, "approved: resuming");
                    self.drive_resumed(&plan, saga, observer, cancel).await
                }
                status => {
                    self.roll_back_unapproved(&record, &approval, status, observer)
                        .await
                }
            }
        }
        .instrument(span)
        .await
    }

    /// Leaves a saga of this process that waits for an approval to whoever resumes it
    /// (`run --no-wait`): its owner becomes [`Owner::detached`](agent_kernel_api::Owner::detached),
    /// so `recover` leaves it waiting while its request is open, and any process may resume it.
    /// A saga not waiting, or not this process's, is left as it is.
    ///
    /// # Errors
    ///
    /// [`KernelError::SagaNotFound`]; [`KernelError::Log`].
    pub async fn detach(&self, saga_id: &SagaId) -> Result<(), KernelError> {
        let record = self.load(saga_id).await?;
        if record.saga.state != SagaState::AwaitingApproval
            || record.saga.owner != self.env.owner
            || self.live.contains(saga_id)
        {
            return Ok(());
        }
        self.log
            .take_over(
                saga_id,
                &self.env.owner,
                SagaState::AwaitingApproval,
                &agent_kernel_api::Owner::detached(),
            )
            .await?;
        info!(saga_id = %saga_id, "left waiting for its approval");
        Ok(())
    }

    /// Rolls back a saga of this process that waits for an approval, because its driver
    /// was stopped (`reason`: a signal): the request is voided and the report's failure is
    /// the stop, not a denial.
    ///
    /// # Errors
    ///
    /// [`KernelError::SagaNotFound`]; [`KernelError::NotAwaitingApproval`];
    /// [`KernelError::Log`].
    pub async fn stop_waiting(
        &self,
        saga_id: &SagaId,
        reason: &str,
        observer: &dyn Observer,
    ) -> Result<SagaReport, KernelError> {
        let record = self.load(saga_id).await?;
        if record.saga.state != SagaState::AwaitingApproval {
            return Err(KernelError::NotAwaitingApproval {
                saga_id: saga_id.clone(),
                state: record.saga.state,
            });
        }
        let approval = self.waiting_approval(&record).await?;
        let request = &approval.request;
        let batch = vec![LogWrite::DecideApproval(DecideApproval {
            approval_id: request.approval_id.clone(),
            decision: ApprovalDecision::Cancel,
            by: self.env.owner.clone(),
            uid: self.operator_uid(),
            user: Some("agent-kernel (its run was stopped while it waited)".to_owned()),
            note: Some(reason.to_owned()),
        })];
        let failure = Failure {
            step_seq: request.step_seq,
            tool: request.tool_id.clone(),
            error: ToolError::failed(format!(
                "stopped while waiting for approval {}: {reason}",
                request.approval_id
            )),
        };
        self.compensate_from(&record, batch, Some(failure), observer)
            .await
    }

    /// The request a waiting saga waits on.
    pub(crate) async fn waiting_approval(
        &self,
        record: &SagaRecord,
    ) -> Result<ApprovalRecord, KernelError> {
        self.log
            .saga_approval(&record.saga.saga_id)
            .await?
            .ok_or_else(|| no_request(&record.saga.saga_id))
    }

    /// The request a waiting saga waits on, vouched for by its audit record
    /// ([`TxLog::vouched_saga_approval`](agent_kernel_api::TxLog::vouched_saga_approval)).
    ///
    /// # Errors
    ///
    /// [`KernelError::Inconsistent`] when the row does not say what the kernel recorded
    /// (nothing ran, and the saga is left waiting); [`KernelError::Log`].
    async fn vouched_approval(&self, record: &SagaRecord) -> Result<ApprovalRecord, KernelError> {
        let saga_id = &record.saga.saga_id;
        match self.log.vouched_saga_approval(saga_id).await {
            Ok(Some(approval)) => Ok(approval),
            Ok(None) => Err(no_request(saga_id)),
            Err(TxError::ApprovalUnusable {
                approval_id,
                reason,
            }) => Err(KernelError::Inconsistent {
                saga_id: saga_id.clone(),
                reason: format!(
                    "approval {approval_id} cannot be used: {reason}; nothing ran and the saga still waits: `agent-kernel audit verify` shows what was changed, `agent-kernel rollback --saga {saga_id} --skip-verify` rolls the saga back"
                ),
            }),
            Err(error) => Err(error.into()),
        }
    }

    /// Where a saga goes when its step is approved: `ApprovalGranted` from
    /// `AwaitingApproval`.
    pub(crate) fn granted_state(&self) -> Result<SagaState, KernelError> {
        self.fsm
            .apply(
                SagaState::AwaitingApproval,
                Event::ApprovalGranted,
                &Facts::default(),
            )
            .map_err(|denial| KernelError::Denied {
                saga_id: None,
                denial,
            })
    }

    /// The failure a saga rolls back for when its step will never run.
    pub(crate) fn unapproved_failure(approval: &ApprovalRecord, status: ApprovalStatus) -> Failure {
        let request = &approval.request;
        let why = match status {
            ApprovalStatus::Rejected => format!(
                "rejected by {}{}",
                approval.decided_by.as_deref().unwrap_or("an operator"),
                approval
                    .note
                    .as_deref()
                    .map(|note| format!(": {note}"))
                    .unwrap_or_default()
            ),
            ApprovalStatus::Expired => "expired undecided".to_owned(),
            ApprovalStatus::Cancelled => {
                "void: the saga was rolled back while it waited".to_owned()
            }
            other => format!("{other}"),
        };
        Failure {
            step_seq: request.step_seq,
            tool: request.tool_id.clone(),
            error: ToolError::denied(format!(
                "approval {} for step {} (`{}`) {why}; the step never ran",
                request.approval_id, request.step_seq, request.tool_id
            )),
        }
    }

    /// Rolls back a saga whose waiting step will never run (`status`: rejected, expired,
    /// cancelled): an expiry not yet recorded is recorded with the move to `Compensating`.
    pub(crate) async fn roll_back_unapproved(
        &self,
        record: &SagaRecord,
        approval: &ApprovalRecord,
        status: ApprovalStatus,
        observer: &dyn Observer,
    ) -> Result<SagaReport, KernelError> {
        let mut batch = Vec::new();
        if approval.status == ApprovalStatus::Pending {
            batch.push(LogWrite::DecideApproval(DecideApproval {
                approval_id: approval.request.approval_id.clone(),
                decision: ApprovalDecision::Expire,
                by: self.env.owner.clone(),
                uid: self.operator_uid(),
                user: Some("agent-kernel (expired undecided)".to_owned()),
                note: None,
            }));
        }
        warn!(saga_id = %record.saga.saga_id, approval_id = %approval.request.approval_id, %status, "the step will never run: rolling back");
        let failure = Self::unapproved_failure(approval, status);
        self.compensate_from(record, batch, Some(failure), observer)
            .await
    }
}

/// A saga that waits in `AwaitingApproval` with no request in the log.
fn no_request(saga_id: &SagaId) -> KernelError {
    KernelError::Inconsistent {
        saga_id: saga_id.clone(),
        reason: "it waits in AwaitingApproval, but the log holds no request for it".to_owned(),
    }
}
