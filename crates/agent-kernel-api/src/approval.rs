//! Approvals and dead letters (reference §10): a request for an operator's decision on one
//! exact step and the decisions that end it; a failed compensation kept for an operator.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{Owner, PlanStep, SagaId};

/// The `[approval] timeout_ms` used when the policy does not set one: one hour.
pub const DEFAULT_APPROVAL_TIMEOUT_MS: u64 = 3_600_000;

/// The largest `[approval] timeout_ms`: 30 days.
pub const MAX_APPROVAL_TIMEOUT_MS: u64 = 30 * 24 * 3_600_000;

/// The longest note or reason an operator may give with a decision, in bytes.
pub const MAX_DECISION_NOTE_BYTES: usize = 4096;

/// Where an approval request stands. The names are those `approvals --json` and the log use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ApprovalStatus {
    /// Waiting for an operator.
    Pending,
    /// Approved, not yet used: the step runs once, with exactly these arguments.
    Approved,
    /// Rejected by an operator: the saga rolls back.
    Rejected,
    /// Undecided past its `expires_at`: the saga rolls back.
    Expired,
    /// Void: its saga was rolled back before the step ran (its process died, say), so the
    /// request applies to nothing any more.
    Cancelled,
    /// Approved and used, in the transaction that began the step.
    Consumed,
}

impl ApprovalStatus {
    /// Every status.
    pub const ALL: [ApprovalStatus; 6] = [
        ApprovalStatus::Pending,
        ApprovalStatus::Approved,
        ApprovalStatus::Rejected,
        ApprovalStatus::Expired,
        ApprovalStatus::Cancelled,
        ApprovalStatus::Consumed,
    ];

    /// The status's name.
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalStatus::Pending => "pending",
            ApprovalStatus::Approved => "approved",
            ApprovalStatus::Rejected => "rejected",
            ApprovalStatus::Expired => "expired",
            ApprovalStatus::Cancelled => "cancelled",
            ApprovalStatus::Consumed => "consumed",
        }
    }
}

impl fmt::Display for ApprovalStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ApprovalStatus {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ApprovalStatus::ALL
            .into_iter()
            .find(|status| status.as_str() == s)
            .ok_or_else(|| format!("unknown approval status `{s}`"))
    }
}

/// A decision that ends a pending request (or voids an approved one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ApprovalDecision {
    /// An operator approved (`agent-kernel approve`).
    Approve,
    /// An operator rejected (`agent-kernel reject`).
    Reject,
    /// The request was undecided past its expiry; recorded by the process that rolls the
    /// saga back.
    Expire,
    /// The saga was rolled back before the step ran (by `recover`, say); the request, pending
    /// or approved, applies to nothing.
    Cancel,
}

impl ApprovalDecision {
    /// The status the request takes.
    pub fn status(self) -> ApprovalStatus {
        match self {
            ApprovalDecision::Approve => ApprovalStatus::Approved,
            ApprovalDecision::Reject => ApprovalStatus::Rejected,
            ApprovalDecision::Expire => ApprovalStatus::Expired,
            ApprovalDecision::Cancel => ApprovalStatus::Cancelled,
        }
    }
}

/// A request for an operator's approval of one step, recorded before anything of the step
/// runs (reference §10).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRequest {
    /// The request's id (what `approve` and `reject` name).
    pub approval_id: String,
    /// The saga, which waits in `AwaitingApproval`.
    pub saga_id: SagaId,
    /// The step's position.
    pub step_seq: u32,
    /// The step's tool.
    pub tool_id: String,
    /// The step's exact arguments: what runs once approved.
    pub args: Value,
    /// The step's idempotency key.
    pub idempotency_key: Option<String>,
    /// SHA-256 (hex) of the canonical JSON of `{saga_id, step, tool, args}`: what an
    /// approval is bound to.
    pub digest: String,
    /// The plan's steps after this one, kept so another process can finish the plan
    /// (`resume`); `None` for a live saga, whose next steps its driver chooses.
    pub rest: Option<Vec<PlanStep>>,
    /// When it was asked for, in ms since the Unix epoch.
    pub requested_at_ms: i64,
    /// When it expires undecided, in ms since the Unix epoch.
    pub expires_at_ms: i64,
    /// When the policy it was asked under names an operator key: the key's check value
    /// (SHA-256 of a fixed prefix and the key), which a decision must match. Bound to the
    /// request, so whoever decides needs the key the requester's policy named, whatever
    /// policy they load themselves.
    #[serde(default)]
    pub operator_key_check: Option<String>,
    /// When the step may repeat an irreversible effect: the earlier step its duplicate keys
    /// match (`[limits] duplicate_window`), shown beside it to whoever decides. Bound to the
    /// request by its audit record.
    #[serde(default)]
    pub duplicate_of: Option<crate::DuplicateStep>,
}

/// A request as the log holds it, with where it stands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRecord {
    /// The request.
    pub request: ApprovalRequest,
    /// Its status as recorded. A `Pending` request past `expires_at_ms` is expired in
    /// effect; [`ApprovalRecord::status_at`] says so.
    pub status: ApprovalStatus,
    /// When it was decided, in ms since the Unix epoch.
    pub decided_at_ms: Option<i64>,
    /// Who decided: the operating-system user (or the process, for an expiry or a
    /// cancellation).
    pub decided_by: Option<String>,
    /// The operator's note or reason.
    pub note: Option<String>,
}

impl ApprovalRecord {
    /// The status at `now_ms`: a pending request past its expiry is `Expired`.
    pub fn status_at(&self, now_ms: i64) -> ApprovalStatus {
        if self.status == ApprovalStatus::Pending && now_ms >= self.request.expires_at_ms {
            ApprovalStatus::Expired
        } else {
            self.status
        }
    }
}

/// A decision to record on a request.
#[derive(Debug, Clone, PartialEq)]
pub struct DecideApproval {
    /// The request.
    pub approval_id: String,
    /// The decision.
    pub decision: ApprovalDecision,
    /// The process that records it.
    pub by: Owner,
    /// The operating-system user id, when known.
    pub uid: Option<u32>,
    /// The user's name, when known (or what the kernel says for an expiry or cancellation).
    pub user: Option<String>,
    /// The note (`approve --note`) or reason (`reject --reason`).
    pub note: Option<String>,
}

/// The use of an approved request, written in the same batch (one transaction) as the
/// step's BEGIN: the log marks the request consumed only if it is approved, unused, and
/// names exactly this saga, step, tool, arguments and digest; otherwise the whole batch
/// fails with [`TxError::ApprovalUnusable`](crate::TxError::ApprovalUnusable) and the step
/// does not begin.
#[derive(Debug, Clone, PartialEq)]
pub struct ConsumeApproval {
    /// The request.
    pub approval_id: String,
    /// The saga.
    pub saga_id: SagaId,
    /// The step about to begin.
    pub step_seq: u32,
    /// Its tool.
    pub tool_id: String,
    /// Its arguments.
    pub args: Value,
    /// The digest of the step about to begin.
    pub digest: String,
}

/// Where a dead letter stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeadLetterStatus {
    /// Waiting for an operator: listed by `dlq list`.
    Open,
    /// A retry compensated the step.
    Retried,
    /// An operator settled it by hand (`dlq resolve`).
    Resolved,
}

impl DeadLetterStatus {
    /// The status's name.
    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterStatus::Open => "open",
            DeadLetterStatus::Retried => "retried",
            DeadLetterStatus::Resolved => "resolved",
        }
    }
}

impl fmt::Display for DeadLetterStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DeadLetterStatus {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [
            DeadLetterStatus::Open,
            DeadLetterStatus::Retried,
            DeadLetterStatus::Resolved,
        ]
        .into_iter()
        .find(|status| status.as_str() == s)
        .ok_or_else(|| format!("unknown dead-letter status `{s}`"))
    }
}

/// A compensation that failed (after its retries), or a step of unknown outcome left to an
/// operator, as the log holds it (reference §10).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// The letter's id (what `dlq retry` and `dlq resolve` name).
    pub letter_id: String,
    /// The saga, `FailedRollbackPartial` while the letter is open.
    pub saga_id: SagaId,
    /// The step whose compensation failed.
    pub step_seq: u32,
    /// Its tool.
    pub tool_id: String,
    /// The last failure.
    pub error: String,
    /// How many times the compensation was tried and failed.
    pub attempts: u32,
    /// When it first failed, in ms since the Unix epoch.
    pub first_failed_at_ms: i64,
    /// When it last failed.
    pub last_failed_at_ms: i64,
    /// When a retry is next due (`dlq retry --due`): the backoff after the last failure.
    pub next_retry_at_ms: i64,
    /// Where it stands.
    pub status: DeadLetterStatus,
    /// When it was settled (retried successfully or resolved).
    pub settled_at_ms: Option<i64>,
    /// Who settled it.
    pub settled_by: Option<String>,
    /// The operator's note (`dlq resolve --note`), or the compensation's note after a retry.
    pub note: Option<String>,
}

/// A failed compensation to record as a dead letter: a new letter for the step, or, when
/// the step has one already, that letter again (reopened), with one more attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordDeadLetter {
    /// The id a new letter gets (the step's existing letter keeps its own).
    pub letter_id: String,
    /// The saga.
    pub saga_id: SagaId,
    /// The step.
    pub step_seq: u32,
    /// Its tool.
    pub tool_id: String,
    /// The failure.
    pub error: String,
    /// When a retry is next due.
    pub next_retry_at_ms: i64,
}

/// How an open dead letter was settled.
#[derive(Debug, Clone, PartialEq)]
pub struct SettleDeadLetter {
    /// The letter.
    pub letter_id: String,
    /// `Retried` (the compensation succeeded) or `Resolved` (by hand).
    pub status: DeadLetterStatus,
    /// The process that records it.
    pub by: Owner,
    /// The operating-system user id, when known.
    pub uid: Option<u32>,
    /// The user's name, when known.
    pub user: Option<String>,
    /// The note.
    pub note: Option<String>,
}
