//! The kinds of the audit chain's records, by name: kept apart from the chain (`audit`),
//! which writes them, so that what reads records by kind (the writer's map of claims)
//! needs nothing else of it.

/// Every record kind the chain may hold.
pub(crate) const KINDS: [&str; 23] = [
    KIND_GENESIS,
    KIND_CREATE_SAGA,
    KIND_SET_STATE,
    KIND_BEGIN_STEP,
    KIND_COMMIT_STEP,
    KIND_FAIL_STEP,
    KIND_REFUSE_STEP,
    KIND_REUSE_STEP,
    KIND_SIMULATE_STEP,
    KIND_COMPENSATION,
    KIND_TAKE_OVER,
    KIND_OPERATOR,
    KIND_PLAN_DENIED,
    KIND_CALL_REFUSED,
    KIND_SAGA_ABORTED,
    KIND_APPROVAL_REQUESTED,
    KIND_APPROVAL_DECIDED,
    KIND_APPROVAL_CONSUMED,
    KIND_DEAD_LETTER,
    KIND_DEAD_LETTER_SETTLED,
    KIND_PRUNE,
    KIND_LOCK_CONFLICT,
    KIND_LOCKS,
];

/// The record of a [`LogWrite::RecordDeadLetter`](agent_kernel_api::LogWrite::RecordDeadLetter).
pub(crate) const KIND_DEAD_LETTER: &str = "DeadLetter";

/// The record of a [`LogWrite::SettleDeadLetter`](agent_kernel_api::LogWrite::SettleDeadLetter)
/// that settled a letter: who, how, and their note.
pub(crate) const KIND_DEAD_LETTER_SETTLED: &str = "DeadLetterSettled";

/// The record of a [`LogWrite::RequestApproval`](agent_kernel_api::LogWrite::RequestApproval).
pub(crate) const KIND_APPROVAL_REQUESTED: &str = "ApprovalRequested";

/// The record of a [`LogWrite::DecideApproval`](agent_kernel_api::LogWrite::DecideApproval)
/// that changed the request: who decided, what, and their note.
pub(crate) const KIND_APPROVAL_DECIDED: &str = "ApprovalDecided";

/// The record of a [`LogWrite::ConsumeApproval`](agent_kernel_api::LogWrite::ConsumeApproval).
pub(crate) const KIND_APPROVAL_CONSUMED: &str = "ApprovalConsumed";

/// A refused call of a live saga
/// ([`AuditEvent::CallRefused`](agent_kernel_api::AuditEvent::CallRefused)): changes no
/// table; its saga id names the saga, which stays open.
pub(crate) const KIND_CALL_REFUSED: &str = "CallRefused";

/// A live saga ended without a commit
/// ([`AuditEvent::SagaAborted`](agent_kernel_api::AuditEvent::SagaAborted)): changes no
/// table; the rollback that follows is recorded as usual.
pub(crate) const KIND_SAGA_ABORTED: &str = "SagaAborted";

/// An operator command ([`AuditEvent::Operator`](agent_kernel_api::AuditEvent::Operator)):
/// changes no table; its saga id, when present, names the saga it acts on.
pub(crate) const KIND_OPERATOR: &str = "Operator";

/// A refused plan ([`AuditEvent::PlanDenied`](agent_kernel_api::AuditEvent::PlanDenied)):
/// changes no table and has no saga id.
pub(crate) const KIND_PLAN_DENIED: &str = "PlanDenied";

/// The record of a [`LogWrite::CreateSaga`](agent_kernel_api::LogWrite::CreateSaga).
pub(crate) const KIND_CREATE_SAGA: &str = "CreateSaga";

/// The record of a [`LogWrite::SetState`](agent_kernel_api::LogWrite::SetState).
pub(crate) const KIND_SET_STATE: &str = "SetState";

/// The record of a [`LogWrite::BeginStep`](agent_kernel_api::LogWrite::BeginStep).
pub(crate) const KIND_BEGIN_STEP: &str = "BeginStep";

/// The record of a [`LogWrite::CommitStep`](agent_kernel_api::LogWrite::CommitStep).
pub(crate) const KIND_COMMIT_STEP: &str = "CommitStep";

/// The record of a [`LogWrite::FailStep`](agent_kernel_api::LogWrite::FailStep).
pub(crate) const KIND_FAIL_STEP: &str = "FailStep";

/// The record of a [`LogWrite::RefuseStep`](agent_kernel_api::LogWrite::RefuseStep).
pub(crate) const KIND_REFUSE_STEP: &str = "RefuseStep";

/// The record of a [`LogWrite::ReuseStep`](agent_kernel_api::LogWrite::ReuseStep).
pub(crate) const KIND_REUSE_STEP: &str = "ReuseStep";

/// The record of a [`LogWrite::SimulateStep`](agent_kernel_api::LogWrite::SimulateStep).
pub(crate) const KIND_SIMULATE_STEP: &str = "SimulateStep";

/// The record of a [`LogWrite::Compensation`](agent_kernel_api::LogWrite::Compensation).
pub(crate) const KIND_COMPENSATION: &str = "Compensation";

/// The record that starts a chain in a log that already held sagas (a version 1 log).
pub(crate) const KIND_GENESIS: &str = "Genesis";

/// An owner change made by [`TxLog::take_over`](agent_kernel_api::TxLog::take_over).
pub(crate) const KIND_TAKE_OVER: &str = "TakeOver";

/// The checkpoint of a [`LogWrite::Prune`](agent_kernel_api::LogWrite::Prune): the sagas
/// removed from the tables and the hash of their records, which stay in the chain.
pub(crate) const KIND_PRUNE: &str = "Prune";

/// A step's claim on a resource that another unsettled saga held: nothing of the step was
/// written. Changes no table.
pub(crate) const KIND_LOCK_CONFLICT: &str = "LockConflict";

/// A settled saga's locks claimed again (for an `undo`) or released (after one that
/// stopped): changes no table the chain models; its body names the saga, `action`
/// (`claimed` or `released`) and the resources.
pub(crate) const KIND_LOCKS: &str = "Locks";
