//! What the kernel reports: saga outcomes and progress events.

use agent_kernel_api::{ApprovalRequest, SagaId, SagaRecord, SagaState, StepStatus, ToolError};
use serde::Serialize;

/// The outcome of one step, as reported to the caller.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepReport {
    /// The step's position, from 0.
    pub seq: u32,
    /// The tool id.
    pub tool: String,
    /// The step's final status.
    pub status: StepStatus,
    /// The tool's output, when the step committed (or reused one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<agent_kernel_api::ToolOutput>,
    /// The tool's error, if it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What compensation reported, if it ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compensation: Option<String>,
    /// Whether the output was reused from an earlier saga by idempotency key.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub reused: bool,
}

/// Why a saga did not reach `Done`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Failure {
    /// The step that failed.
    pub step_seq: u32,
    /// Its tool.
    pub tool: String,
    /// The error.
    pub error: ToolError,
}

/// The outcome of a saga (after `run`, `rollback` or recovery).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SagaReport {
    /// The saga.
    pub saga_id: SagaId,
    /// Its state.
    pub state: SagaState,
    /// Every step recorded, in order.
    pub steps: Vec<StepReport>,
    /// The failure that started a rollback, if one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
    /// Whether this is the report of a dry run: nothing ran; the log holds the saga marked
    /// as a dry run, with its steps simulated.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    /// The request the saga waits on, when it is `AwaitingApproval` (serialized as
    /// [`approval_document`]).
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "serialize_approval"
    )]
    pub approval: Option<ApprovalRequest>,
}

/// A request as every document shows it (`approvals --json`, `run --json`, MCP answers):
/// `{id, saga_id, step, tool, digest, requested_at, expires_at, args, args_shown,
/// args_warnings}`, times in RFC 3339 (UTC, milliseconds); `args_shown` is the whole
/// canonical JSON of the arguments with hidden characters escaped, and `args_warnings`
/// names each kind of hidden character ([`shown_json`](crate::shown_json)).
pub fn approval_document(request: &ApprovalRequest) -> serde_json::Value {
    let shown = crate::shown_json(&request.args);
    serde_json::json!({
        "id": request.approval_id,
        "saga_id": request.saga_id,
        "step": request.step_seq,
        "tool": request.tool_id,
        "digest": request.digest,
        "requested_at": agent_kernel_api::format_rfc3339_ms(request.requested_at_ms),
        "expires_at": agent_kernel_api::format_rfc3339_ms(request.expires_at_ms),
        "args": request.args,
        "args_shown": shown.text,
        "args_warnings": shown.warnings(),
        "duplicate_of": request.duplicate_of.as_ref().map(|earlier| {
            let shown = crate::shown_json(&earlier.args);
            serde_json::json!({
                "saga_id": earlier.saga_id,
                "step": earlier.step_seq,
                "tool": earlier.tool_id,
                "status": earlier.status,
                "key": earlier.key,
                "at": agent_kernel_api::format_rfc3339_ms(earlier.at_ms),
                "args": earlier.args,
                "args_shown": shown.text,
                "args_warnings": shown.warnings(),
            })
        }),
    })
}

fn serialize_approval<S: serde::Serializer>(
    approval: &Option<ApprovalRequest>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match approval {
        Some(request) => approval_document(request).serialize(serializer),
        None => serializer.serialize_none(),
    }
}

impl SagaReport {
    /// The same report, waiting on `approval`.
    #[must_use]
    pub fn awaiting(mut self, approval: Option<ApprovalRequest>) -> Self {
        self.approval = approval;
        self
    }

    /// Whether the saga waits for an operator's approval.
    pub fn is_awaiting_approval(&self) -> bool {
        self.state == SagaState::AwaitingApproval
    }

    /// The report of a saga as the log holds it.
    pub fn from_record(record: &SagaRecord, failure: Option<Failure>) -> Self {
        SagaReport {
            saga_id: record.saga.saga_id.clone(),
            state: record.saga.state,
            steps: record
                .steps
                .iter()
                .map(|step| StepReport {
                    seq: step.step_seq,
                    tool: step.tool_id.clone(),
                    status: step.status,
                    output: step.output.clone(),
                    error: step.error.as_ref().map(ToString::to_string),
                    compensation: step.compensation.clone(),
                    reused: step.reused_from.is_some(),
                })
                .collect(),
            failure,
            dry_run: record.saga.dry_run,
            approval: None,
        }
    }

    /// Whether the saga failed because the sandbox denied a step.
    pub fn is_denied(&self) -> bool {
        self.failure
            .as_ref()
            .is_some_and(|failure| failure.error.is_denied())
    }

    /// Whether the saga failed because a step met another saga's lock (a conflict).
    pub fn is_conflict(&self) -> bool {
        self.failure
            .as_ref()
            .is_some_and(|failure| failure.error.is_conflict())
    }
}

/// What happened to one unfinished saga during recovery.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum RecoveryAction {
    /// Its owner was dead; it was rolled back.
    RolledBack(Box<SagaReport>),
    /// Its owner is alive, or cannot be checked from here; it was not touched.
    SkippedLive {
        /// The saga.
        saga_id: SagaId,
        /// The owner's pid.
        pid: u32,
        /// The owner's host.
        host: String,
        /// On a log that keeps leases, how long the owner's lease had left when it was
        /// checked, in ms: the saga is recovered once it runs out (`recover --wait`).
        #[serde(skip_serializing_if = "Option::is_none")]
        lease_left_ms: Option<u64>,
    },
    /// It waits for an operator's approval, left so on purpose (`run --no-wait`), and its
    /// request is still open: not touched; `resume` continues it once decided.
    SkippedWaiting {
        /// The saga.
        saga_id: SagaId,
        /// The request it waits on.
        approval_id: String,
    },
    /// Another process took it over first, or it finished meanwhile; it was not touched.
    SkippedTakenOver {
        /// The saga.
        saga_id: SagaId,
    },
    /// It needs tools to be compensated that this program does not have: it was left exactly
    /// as it was (not taken over, no step marked), for a program that has them.
    MissingTools {
        /// The saga.
        saga_id: SagaId,
        /// The tools it needs and this program lacks, sorted.
        tools: Vec<String>,
    },
    /// It could not be recovered (its record is unreadable, the log failed); the others were.
    Failed {
        /// The saga.
        saga_id: SagaId,
        /// Why.
        error: String,
    },
}

/// The outcome of `recover`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RecoveryReport {
    /// One entry per unfinished saga found.
    pub sagas: Vec<RecoveryAction>,
}

impl RecoveryAction {
    /// The saga the action is about.
    pub fn saga_id(&self) -> &SagaId {
        match self {
            RecoveryAction::RolledBack(report) => &report.saga_id,
            RecoveryAction::SkippedLive { saga_id, .. }
            | RecoveryAction::SkippedWaiting { saga_id, .. }
            | RecoveryAction::SkippedTakenOver { saga_id }
            | RecoveryAction::MissingTools { saga_id, .. }
            | RecoveryAction::Failed { saga_id, .. } => saga_id,
        }
    }
}

/// What a [`RecoveryReport`] says happened, counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RecoveryCounts {
    /// Sagas rolled back in full (`FailedRolledBack`), and undos a killed process left
    /// that recovery finished (`Undone`).
    pub rolled_back: usize,
    /// Sagas left alone because their process is alive.
    pub skipped_live: usize,
    /// Sagas left waiting for an operator's approval, on purpose.
    pub skipped_waiting: usize,
    /// Sagas another recovery took over first.
    pub skipped_taken_over: usize,
    /// Sagas an operator must see to: a compensation failed or is uncertain
    /// (`FailedRollbackPartial`, a dead letter), a tool is missing, or recovery itself
    /// failed on them.
    pub left_for_operator: usize,
}

impl RecoveryReport {
    /// How many sagas ended each way. An empty report counts nothing: it is no evidence
    /// that anything was rolled back.
    pub fn counts(&self) -> RecoveryCounts {
        let mut counts = RecoveryCounts::default();
        for action in &self.sagas {
            let count = match action {
                RecoveryAction::RolledBack(report)
                    if matches!(
                        report.state,
                        SagaState::FailedRolledBack | SagaState::Undone
                    ) =>
                {
                    &mut counts.rolled_back
                }
                RecoveryAction::RolledBack(_)
                | RecoveryAction::Failed { .. }
                | RecoveryAction::MissingTools { .. } => &mut counts.left_for_operator,
                RecoveryAction::SkippedLive { .. } => &mut counts.skipped_live,
                RecoveryAction::SkippedWaiting { .. } => &mut counts.skipped_waiting,
                RecoveryAction::SkippedTakenOver { .. } => &mut counts.skipped_taken_over,
            };
            *count += 1;
        }
        counts
    }

    /// Whether an operator must see to any saga this recovery found (exit 3 on the command
    /// line).
    pub fn needs_operator(&self) -> bool {
        self.counts().left_for_operator > 0
    }
}

/// A progress event, for progress bars and logs.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum SagaEvent<'a> {
    /// A saga began.
    Started {
        /// The saga.
        saga_id: &'a SagaId,
        /// How many steps it has.
        n_steps: u32,
    },
    /// A step finished executing (or was reused, or failed).
    StepFinished {
        /// Its saga.
        saga_id: &'a SagaId,
        /// The step.
        step_seq: u32,
        /// Its tool.
        tool: &'a str,
        /// Its status.
        status: StepStatus,
    },
    /// Compensation of a saga began.
    Compensating {
        /// The saga.
        saga_id: &'a SagaId,
    },
    /// A step was compensated (or its compensation failed). Recovery compensates sagas on
    /// different resources at the same time, so events of several sagas interleave.
    StepCompensated {
        /// Its saga.
        saga_id: &'a SagaId,
        /// The step.
        step_seq: u32,
        /// Its tool.
        tool: &'a str,
        /// Its status.
        status: StepStatus,
    },
}

/// Receives progress events. Must be quick: it runs on the task that drives the saga (for
/// `recover`, one task for a whole group of sagas).
pub trait Observer: Send + Sync {
    /// Called for each event.
    fn on_event(&self, event: &SagaEvent<'_>);
}

/// An observer that ignores everything.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoObserver;

impl Observer for NoObserver {
    fn on_event(&self, _event: &SagaEvent<'_>) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_or_skipping_recovery_rolls_nothing_back_and_needs_no_operator() {
        let empty = RecoveryReport::default();
        assert_eq!(empty.counts(), RecoveryCounts::default());
        assert!(!empty.needs_operator());
        let skipping = RecoveryReport {
            sagas: vec![
                RecoveryAction::SkippedLive {
                    saga_id: SagaId::new("a"),
                    pid: 7,
                    host: "here".into(),
                    lease_left_ms: None,
                },
                RecoveryAction::MissingTools {
                    saga_id: SagaId::new("b"),
                    tools: vec!["kv.set".into()],
                },
                RecoveryAction::SkippedTakenOver {
                    saga_id: SagaId::new("c"),
                },
            ],
        };
        let counts = skipping.counts();
        assert_eq!(
            (
                counts.rolled_back,
                counts.skipped_live,
                counts.skipped_taken_over,
                counts.left_for_operator
            ),
            (0, 1, 1, 1)
        );
        assert!(skipping.needs_operator());
    }
}
