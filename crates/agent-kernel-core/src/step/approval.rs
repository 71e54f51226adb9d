//! The step path's approval phases: a step that needs an operator's approval (by policy,
//! or because it may repeat an irreversible effect) runs only with the approval granted for
//! exactly it, consumed with its BEGIN; without one, its saga parks for a decision.

use agent_kernel_api::{ApprovalRecord, ConsumeApproval, LogWrite, PlanStep, ToolError};
use agent_kernel_fsm::{Event, Facts};
use tracing::{info, warn};

use super::{Halt, SagaInFlight, StepEnd, Taking, step_denied};
use crate::KernelError;
use crate::approval_policy::approval_digest;
use crate::isolation::duplicate_reason;
use crate::kernel::Kernel;

impl Kernel {
    /// Approval: a step that needs one runs only with the approval granted for exactly it
    /// (its position, tool, arguments and digest), consumed with its BEGIN; without one,
    /// the saga parks for an operator.
    pub(super) async fn approve(
        &self,
        saga: &mut SagaInFlight,
        taking: &Taking<'_>,
        approved: Option<ApprovalRecord>,
        rest: Option<&[PlanStep]>,
        duplicate_keys: &[String],
    ) -> Result<Option<ConsumeApproval>, Halt> {
        let step = taking.step;
        // A call that may repeat an irreversible effect waits for a person, whatever the
        // policy says of its tool.
        let duplicated = self
            .duplicated_step(&saga.saga_id, &step.tool, duplicate_keys)
            .await?;
        let reason = match &duplicated {
            Some(earlier) => Some(duplicate_reason(taking.tool.as_ref(), earlier)),
            None => self.approval_reason(&step.tool, taking.tool.as_ref()),
        };
        let Some(reason) = reason else {
            return Ok(None);
        };
        let digest = approval_digest(&saga.saga_id, taking.step_seq, &step.tool, &step.args);
        let Some(approval) =
            approved.filter(|approval| approval.request.step_seq == taking.step_seq)
        else {
            return Err(self
                .await_approval(saga, taking, rest, &reason, duplicated)
                .await?);
        };
        let request = &approval.request;
        let differs = if request.tool_id != step.tool {
            Some("its tool differs")
        } else if request.args != step.args {
            Some("its arguments differ")
        } else if request.digest != digest {
            Some("its digest differs")
        } else {
            None
        };
        if let Some(differs) = differs {
            let error = ToolError::denied(format!(
                "approval {} was given for another step than this one: {differs} (the request's digest {}, this step's {digest})",
                request.approval_id, request.digest
            ));
            return Err(taking.refused(saga, error));
        }
        Ok(Some(ConsumeApproval {
            approval_id: request.approval_id.clone(),
            saga_id: saga.saga_id.clone(),
            step_seq: taking.step_seq,
            tool_id: step.tool.clone(),
            args: step.args.clone(),
            digest,
        }))
    }

    /// A BEGIN refused because, between the look for duplicates and its write, a step of
    /// another saga began that this call may repeat (`earlier`). Without an approval, a
    /// person is asked, with both calls side by side. With one (given before `earlier`
    /// began, so its request could not show it), the approval is void and the step refused,
    /// nothing of it run: a step has one request, so the call is made again to be asked
    /// with both; so is a step whose position has a request already (`approval.1`, for
    /// this position: an earlier call there met a conflict).
    pub(super) async fn stopped_as_duplicate(
        &self,
        saga: &mut SagaInFlight,
        taking: &Taking<'_>,
        rest: Option<&[PlanStep]>,
        approval: (Option<ConsumeApproval>, Option<&ApprovalRecord>),
        earlier: agent_kernel_api::DuplicateStep,
    ) -> Result<Halt, KernelError> {
        let (consume, approved) = approval;
        let position_asked =
            approved.is_some_and(|approval| approval.request.step_seq == taking.step_seq);
        let reason = duplicate_reason(taking.tool.as_ref(), &earlier);
        warn!(saga_id = %saga.saga_id, step_seq = taking.step_seq, tool = %taking.step.tool, %reason, "step stopped at its BEGIN: it may repeat a step begun meanwhile");
        let Some(consume) = consume else {
            if position_asked {
                let error = ToolError::denied(format!(
                    "{reason}; this step's position has a request for another call already, so none can be asked here: nothing ran. Make the call again to be asked with both calls side by side"
                ));
                return Ok(taking.refused(saga, error));
            }
            return self
                .await_approval(saga, taking, rest, &reason, Some(earlier))
                .await;
        };
        let why = format!(
            "saga {} step {} began after this approval was asked, with the same `{}`: it may repeat that effect, which the request did not show",
            earlier.saga_id, earlier.step_seq, earlier.key
        );
        self.cancel_approval(saga, consume.approval_id.clone(), why.clone());
        let error = ToolError::denied(format!(
            "approval {} is void: {why}; nothing ran. Make the call again to be asked with both calls side by side",
            consume.approval_id
        ));
        Ok(taking.refused(saga, error))
    }

    /// Nothing of the BEGIN's batch was written and the step never began: an approval the
    /// log does not vouch for is a denial, and void.
    pub(super) fn approval_unusable(
        &self,
        saga: &mut SagaInFlight,
        taking: &Taking<'_>,
        approval_id: String,
        reason: String,
    ) -> Halt {
        warn!(saga_id = %saga.saga_id, step_seq = taking.step_seq, %approval_id, %reason, "approval unusable");
        self.cancel_approval(saga, approval_id.clone(), reason.clone());
        let error = ToolError::denied(format!(
            "approval {approval_id} cannot be used for this step: {reason}"
        ));
        taking.refused(saga, error)
    }

    /// Parks the step for an operator's approval: the FSM's `ApprovalRequested`, then the
    /// request and the saga's move to `AwaitingApproval`, with whatever the saga had
    /// queued, in one synced write. Nothing of the step ran; its position and key stay free
    /// for when it resumes.
    pub(super) async fn await_approval(
        &self,
        saga: &mut SagaInFlight,
        taking: &Taking<'_>,
        rest: Option<&[PlanStep]>,
        reason: &str,
        duplicate_of: Option<agent_kernel_api::DuplicateStep>,
    ) -> Result<Halt, KernelError> {
        let (step, step_seq) = (taking.step, taking.step_seq);
        saga.give_back(step_seq, step.idempotency_key.as_deref());
        let requested = self
            .fsm
            .apply(saga.state, Event::ApprovalRequested, &Facts::default());
        let state = match requested {
            Ok(state) => state,
            Err(denial) => {
                saga.next_seq = step_seq + 1;
                let error = step_denied(denial, &step.tool);
                warn!(saga_id = %saga.saga_id, step_seq, tool = %step.tool, %error, reason, "a step that needs an approval was denied");
                return Ok(taking.refused(saga, error));
            }
        };
        let request = self.approval_request(saga, step_seq, step, rest, duplicate_of);
        saga.state = state;
        saga.pending
            .push(LogWrite::RequestApproval(request.clone()));
        let batch = saga.take_batch();
        self.write_saga_batch(saga, batch).await?;
        saga.waiting_on = Some(request.clone());
        info!(saga_id = %saga.saga_id, step_seq, tool = %step.tool, approval_id = %request.approval_id, reason, "the step waits for an operator's approval");
        Ok(Halt::End(Box::new(StepEnd::AwaitingApproval(request))))
    }
}
