//! Approvals (reference §10): the requests open to a decision, one request in full, and a
//! decision bound to the request's digest.

use agent_kernel_api::{ApprovalRecord, ApprovalRequest, ApprovalStatus, Clock as _};
use agent_kernel_core::{Kernel, KernelError, OperatorDecision, SystemClock, shown_json};
use serde::Serialize;
use serde_json::Value;

use super::operator_name_of;

/// One approval request as an operator sees it: the request, what a person reads of its
/// arguments (hidden characters escaped and named), its status now and its decision.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ApprovalView {
    /// The request as recorded (tool, whole arguments, digest, expiry).
    pub request: ApprovalRequest,
    /// The arguments as canonical JSON, every hidden character written as an escape.
    pub args_shown: String,
    /// One sentence per kind of hidden character in the arguments.
    pub args_warnings: Vec<String>,
    /// The status now (a pending request past its expiry is `Expired`).
    pub status: ApprovalStatus,
    /// Who decided, when it is decided.
    pub decided_by: Option<String>,
    /// The decision's note or reason.
    pub note: Option<String>,
    /// A plan's steps after the one waiting, which run once it is approved; `None` for a
    /// live saga's step (its agent sends the next steps).
    pub later_steps: Option<Vec<LaterStep>>,
    /// Whether the process holding the live saga is gone ([`Kernel::holder_gone`]): the
    /// request cannot be approved until `recover` has settled the saga. Known for a pending
    /// request only; `false` otherwise, and for a plan's (any process resumes a plan).
    pub holder_gone: bool,
}

/// A plan's step after the one an approval is asked for.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LaterStep {
    /// Its tool.
    pub tool: String,
    /// Its arguments.
    pub args: Value,
    /// As [`ApprovalView::args_shown`].
    pub args_shown: String,
    /// As [`ApprovalView::args_warnings`].
    pub args_warnings: Vec<String>,
}

impl ApprovalView {
    /// The view of `record` at `now_ms`.
    pub fn of(record: ApprovalRecord, now_ms: i64) -> Self {
        let shown = shown_json(&record.request.args);
        let later_steps = record.request.rest.as_ref().map(|rest| {
            rest.iter()
                .map(|step| {
                    let shown = shown_json(&step.args);
                    LaterStep {
                        tool: step.tool.clone(),
                        args: step.args.clone(),
                        args_warnings: shown.warnings(),
                        args_shown: shown.text,
                    }
                })
                .collect()
        });
        Self {
            status: record.status_at(now_ms),
            args_warnings: shown.warnings(),
            args_shown: shown.text,
            decided_by: record.decided_by,
            note: record.note,
            later_steps,
            holder_gone: false,
            request: record.request,
        }
    }

    /// [`of`](Self::of), with [`holder_gone`](Self::holder_gone) asked of `kernel` for a
    /// pending request.
    async fn looked_at(
        kernel: &Kernel,
        record: ApprovalRecord,
        now_ms: i64,
    ) -> Result<Self, KernelError> {
        let mut view = Self::of(record, now_ms);
        if view.status == ApprovalStatus::Pending {
            view.holder_gone = kernel.holder_gone(&view.request).await?;
        }
        Ok(view)
    }
}

/// The requests open to a decision now, oldest first (`approvals`).
///
/// # Errors
///
/// [`KernelError::Log`].
pub async fn pending_approvals(kernel: &Kernel) -> Result<Vec<ApprovalView>, KernelError> {
    let now_ms = SystemClock.now_ms();
    let mut views = Vec::new();
    for record in kernel.pending_approvals().await? {
        if record.status_at(now_ms) == ApprovalStatus::Pending {
            views.push(ApprovalView::looked_at(kernel, record, now_ms).await?);
        }
    }
    Ok(views)
}

/// One request in full, whatever its status (`approvals --show ID`).
///
/// # Errors
///
/// [`KernelError::ApprovalNotFound`]; [`KernelError::Log`].
pub async fn approval(kernel: &Kernel, approval_id: &str) -> Result<ApprovalView, KernelError> {
    let record = kernel.approval(approval_id).await?;
    ApprovalView::looked_at(kernel, record, SystemClock.now_ms()).await
}

/// An operator's decision on one request (`approve`, `reject`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The request.
    pub approval_id: String,
    /// Approve, or reject.
    pub approve: bool,
    /// The note (approve) or the reason (reject), recorded with the decision.
    pub note: Option<String>,
    /// The operator key, when the request names one: read with
    /// [`read_operator_key`](crate::read_operator_key) before the process confines itself
    /// ([`Opened::confine`](crate::Opened::confine)), since the key file lies outside the
    /// roots.
    pub operator_key: Option<Vec<u8>>,
    /// Who decides, as recorded: `None` records the kernel's operator uid (the command
    /// line's way); the web console records the operator name it was given.
    pub by: Option<String>,
}

/// Decides a request, once, recording who decided ([`Decision::by`], else the kernel's
/// operator uid) in the log and the audit chain; returns the request as decided.
///
/// # Errors
///
/// [`KernelError::ApprovalNotFound`]; [`KernelError::ApprovalClosed`] for a
/// request already decided or expired; [`KernelError::OperatorKeyRequired`] and
/// [`KernelError::OperatorKeyMismatch`]; [`KernelError::Log`].
pub async fn decide(kernel: &Kernel, decision: Decision) -> Result<ApprovalView, KernelError> {
    let record = kernel
        .decide_approval(
            &decision.approval_id,
            OperatorDecision {
                approve: decision.approve,
                operator_key: decision.operator_key,
                user: match decision.by {
                    Some(by) => Some(by),
                    None => operator_name_of(kernel).await,
                },
                note: decision.note,
            },
        )
        .await?;
    Ok(ApprovalView::of(record, SystemClock.now_ms()))
}
