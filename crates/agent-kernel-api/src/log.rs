//! The transaction log contract: what the saga engine records, and what it reads back.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::list::{SagaListing, SagaQuery, SagaSummary};
use crate::{
    ApprovalRecord, ApprovalRequest, ApprovalStatus, BoxFuture, ConsumeApproval, DeadLetter,
    DeadLetterStatus, DecideApproval, DuplicateCheck, DuplicateStep, EffectClass, LockHolder,
    RecordDeadLetter, SagaId, SagaState, SettleDeadLetter, StepStatus, ToolError, ToolOutput, Undo,
};

/// The process that owns a running saga, recorded so that recovery can decide reliably
/// whether that process is still alive, pid reuse included.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Owner {
    /// The host name of the machine the process runs on.
    pub host: String,
    /// An id of the machine's current boot (`/proc/sys/kernel/random/boot_id` on Linux).
    pub boot_id: String,
    /// The process id.
    pub pid: u32,
    /// When the process started, in clock ticks since boot; tells a reused pid apart.
    pub start_ticks: u64,
}

impl Owner {
    /// The owner of a saga left waiting for an approval on purpose (`run --no-wait`): no
    /// process holds it, `recover` leaves it waiting while its request is open, and any
    /// process may take it over to resume it.
    pub fn detached() -> Owner {
        Owner {
            host: String::new(),
            boot_id: DETACHED_BOOT_ID.to_owned(),
            pid: 0,
            start_ticks: 0,
        }
    }

    /// Whether this is [`Owner::detached`].
    pub fn is_detached(&self) -> bool {
        *self == Owner::detached()
    }
}

/// The boot id of [`Owner::detached`], which no machine has.
const DETACHED_BOOT_ID: &str = "detached";

/// A new saga, written with its first step's BEGIN.
#[derive(Debug, Clone, PartialEq)]
pub struct NewSaga {
    /// The saga's id.
    pub saga_id: SagaId,
    /// The plan's label.
    pub name: Option<String>,
    /// Who runs the saga.
    pub actor: Option<String>,
    /// The process that runs it.
    pub owner: Owner,
    /// How many steps the plan has.
    pub n_steps: u32,
    /// The initial state.
    pub state: SagaState,
    /// Whether the saga is a dry run: its steps are simulated
    /// ([`LogWrite::SimulateStep`]), nothing ran and nothing is to be compensated.
    pub dry_run: bool,
    /// Whether the saga may be created only while its actor has no other unfinished saga
    /// (the FSM's `actor_idle` guard): the log checks it in the transaction that creates the
    /// saga and fails the batch with [`TxError::ActorBusy`] otherwise, so two processes
    /// starting sagas for one actor at once cannot both succeed. Dry runs are not counted.
    pub require_actor_idle: bool,
}

/// The intent of one step, written durably before its effect.
#[derive(Debug, Clone, PartialEq)]
pub struct BeginStep {
    /// The saga.
    pub saga_id: SagaId,
    /// The step's position, from 0.
    pub step_seq: u32,
    /// The tool id.
    pub tool_id: String,
    /// The tool's version.
    pub tool_version: String,
    /// The tool's effect class.
    pub effect: EffectClass,
    /// The arguments.
    pub args: Value,
    /// The hash of the canonical arguments (binds an idempotency key to them).
    pub args_hash: String,
    /// The caller's idempotency key.
    pub idempotency_key: Option<String>,
    /// What compensation needs.
    pub undo: Undo,
    /// The resources the step claims with its BEGIN ([`DynTool::resources`]), held until
    /// its saga is settled; a claim another saga holds is refused
    /// ([`WriteOutcome::Conflict`]) and nothing of the step is written.
    ///
    /// [`DynTool::resources`]: crate::DynTool::resources
    pub resources: Vec<String>,
    /// The keys that make a later call of the same tool a duplicate of this step
    /// ([`DynTool::duplicate_keys`]); recorded with the step, claimed by nothing.
    ///
    /// [`DynTool::duplicate_keys`]: crate::DynTool::duplicate_keys
    pub duplicate_keys: Vec<String>,
    /// With `duplicate_keys`: the check, in the BEGIN's own transaction, that no step of
    /// the same tool in another saga declared one of them meanwhile (begun since, and not
    /// failed), so that two calls repeating one effect at once are not both let through;
    /// such a step is refused ([`WriteOutcome::Duplicate`]) and nothing of it written.
    /// `None`: no check (a reversible tool, no window).
    pub duplicate_check: Option<DuplicateCheck>,
}

/// One record to write. A batch of them is written in one transaction.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum LogWrite {
    /// Creates a saga.
    CreateSaga(NewSaga),
    /// Moves a saga to a new state.
    SetState {
        /// The saga.
        saga_id: SagaId,
        /// The new state.
        state: SagaState,
    },
    /// Records a step's intent (status `BEGIN`) and claims its idempotency key.
    BeginStep(BeginStep),
    /// Records a step's successful outcome (status `COMMIT`).
    CommitStep {
        /// The saga.
        saga_id: SagaId,
        /// The step.
        step_seq: u32,
        /// The tool's output.
        output: ToolOutput,
    },
    /// Records a step's failure (status `FAIL`).
    FailStep {
        /// The saga.
        saga_id: SagaId,
        /// The step.
        step_seq: u32,
        /// What went wrong.
        error: ToolError,
    },
    /// Records a step that was refused before it began (a denial, a cancellation, a failing
    /// `prepare`): status `FAIL` with `error`, its idempotency key neither claimed nor
    /// released, nothing to compensate.
    RefuseStep {
        /// The step, as it would have begun (its `undo` is ignored).
        step: BeginStep,
        /// Why it never began.
        error: ToolError,
    },
    /// Records a step whose idempotency key was already committed: status `COMMIT`, the
    /// recorded output reused, nothing executed, nothing to compensate.
    ReuseStep {
        /// The step, as it would have begun (its `undo` is ignored).
        step: BeginStep,
        /// The saga that holds the committed key.
        from_saga_id: SagaId,
        /// The step in that saga.
        from_step_seq: u32,
        /// The output recorded there.
        output: ToolOutput,
    },
    /// Records a simulated step of a dry-run saga (see [`NewSaga::dry_run`]): status
    /// `COMMIT` with the simulated output, or `FAIL` with the simulation's error. Nothing
    /// ran: no idempotency key is claimed and there is nothing to compensate. Only a dry-run
    /// saga may hold simulated steps, and a dry-run saga holds no begun step.
    SimulateStep {
        /// The step, as it would have begun (its `undo` is ignored).
        step: BeginStep,
        /// What the simulation answered.
        result: Result<ToolOutput, ToolError>,
    },
    /// Records an event in the audit chain only: no saga or step changes.
    Audit(AuditEvent),
    /// Records a request for an operator's approval of a step that has not begun (reference
    /// §10); the saga's move to `AwaitingApproval` rides in the same batch.
    RequestApproval(ApprovalRequest),
    /// Records a decision on a request: approve or reject (only while it is pending and not
    /// expired), expire (only while pending), cancel (while pending or approved). A request
    /// in any other status is left as it is and the write answers
    /// [`WriteOutcome::NotPending`].
    DecideApproval(DecideApproval),
    /// Uses an approved request for the step whose BEGIN follows in the same batch.
    ConsumeApproval(ConsumeApproval),
    /// Records a failed compensation as a dead letter (new, or the step's reopened).
    RecordDeadLetter(RecordDeadLetter),
    /// Settles an open dead letter; one that is not open is left as it is and the write
    /// answers [`WriteOutcome::NotOpen`].
    SettleDeadLetter(SettleDeadLetter),
    /// Removes finished sagas from the tables (`prune`): each named saga still finished in
    /// the write's transaction, last changed before `before_ms`, with no open dead letter
    /// or approval request, goes with its steps, keys, requests and letters; one checkpoint
    /// record names them with the hash of their records (which stay in the chain). The
    /// write answers [`WriteOutcome::Pruned`].
    Prune(PruneSagas),
    /// Records the outcome of compensating a step.
    Compensation {
        /// The saga.
        saga_id: SagaId,
        /// The step.
        step_seq: u32,
        /// `Ok(note)` when compensated (status `COMPENSATED`), `Err(error)` when not
        /// (status `COMPENSATION_FAILED`).
        result: Result<String, ToolError>,
    },
    /// Claims again every resource the saga's begun steps declared (for `undo` of a settled
    /// saga, which then holds them until it is settled again): fails the batch with
    /// [`TxError::Conflict`] when another unsettled saga holds one.
    ClaimLocks {
        /// The saga.
        saga_id: SagaId,
    },
    /// Releases what a settled saga still holds (an `undo` stopped after its claim); writes
    /// nothing for a saga not settled or not owned by `owner` (an undo took it over since).
    ReleaseLocks {
        /// The saga.
        saga_id: SagaId,
        /// The owner the saga must still have.
        owner: Owner,
    },
}

/// An event the audit chain records although it changes no saga.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum AuditEvent {
    /// An operator command, recorded before it acts.
    Operator(OperatorCommand),
    /// A plan refused before any step began, because the sandbox or the FSM denied it.
    PlanDenied(PlanDenial),
    /// A call of a live saga refused as bad input: nothing of it ran, the saga stays open.
    CallRefused(CallRefusal),
    /// A live saga ended without a commit (by its driver, its idle timeout or its process
    /// closing), recorded before its rollback.
    SagaAborted(SagaAbort),
}

/// A refused call of a live saga, as the audit chain records it.
#[derive(Debug, Clone, PartialEq)]
pub struct CallRefusal {
    /// The saga, which stays open.
    pub saga_id: SagaId,
    /// The tool asked for.
    pub tool: String,
    /// The arguments given (the record quotes their start and hashes them whole).
    pub args: Value,
    /// Why the call was refused.
    pub reason: String,
    /// The process that refused it.
    pub by: Owner,
}

/// Why a live saga was ended without a commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AbortCause {
    /// Its driver asked (`abort`).
    Requested,
    /// It was left untouched past its idle timeout.
    IdleTimeout,
    /// The process holding it was closing (end of input, a signal).
    Shutdown,
}

impl AbortCause {
    /// The name the audit chain records: `requested`, `idle_timeout` or `shutdown`.
    pub fn as_str(self) -> &'static str {
        match self {
            AbortCause::Requested => "requested",
            AbortCause::IdleTimeout => "idle_timeout",
            AbortCause::Shutdown => "shutdown",
        }
    }
}

/// A live saga ended without a commit, as the audit chain records it.
#[derive(Debug, Clone, PartialEq)]
pub struct SagaAbort {
    /// The saga, rolled back next.
    pub saga_id: SagaId,
    /// Why.
    pub cause: AbortCause,
    /// The reason given, or what the kernel said.
    pub reason: String,
    /// The process that ended it.
    pub by: Owner,
}

/// An operator command (`rollback`, `recover`, …) as the audit chain records it.
#[derive(Debug, Clone, PartialEq)]
pub struct OperatorCommand {
    /// The command, e.g. `rollback`.
    pub command: String,
    /// The saga it acts on, when it names one.
    pub saga_id: Option<SagaId>,
    /// Options that change what it does (e.g. `--skip-verify`), as given.
    pub options: Vec<String>,
    /// The process that runs it.
    pub by: Owner,
    /// The operating-system user that runs it, when known.
    pub uid: Option<u32>,
}

/// A plan refused before any step began, as the audit chain records it.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanDenial {
    /// The plan's label.
    pub name: Option<String>,
    /// Who asked for it.
    pub actor: Option<String>,
    /// Whether it was asked for as a dry run.
    pub dry_run: bool,
    /// The process that refused it.
    pub by: Owner,
    /// What was denied, in plan order.
    pub denials: Vec<StepDenial>,
}

/// One denial of a refused plan.
#[derive(Debug, Clone, PartialEq)]
pub struct StepDenial {
    /// The step's position in the plan, when the denial is about one step (`None`: the
    /// whole plan, e.g. the FSM refused to start the saga).
    pub step_idx: Option<u32>,
    /// The step's tool.
    pub tool: Option<String>,
    /// The step's arguments (the audit record quotes their start and hashes them whole).
    pub args: Option<Value>,
    /// Why it was denied.
    pub reason: String,
}

/// What a [`LogWrite`] did.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum WriteOutcome {
    /// Written as asked.
    Written,
    /// A `BeginStep` whose idempotency key is held by a live or committed step, or bound to
    /// other arguments: the step was recorded as `FAIL` with this reason and must not run.
    KeyRejected(String),
    /// A `DecideApproval` on a request that is no longer open to it: nothing was changed.
    /// Carries the request's status (`Expired` for a pending request past its expiry).
    NotPending(ApprovalStatus),
    /// A `SettleDeadLetter` on a letter that is no longer open: nothing was changed.
    NotOpen(DeadLetterStatus),
    /// A `BeginStep` whose resources another unsettled saga holds: nothing of the step was
    /// written (nor the approval it would have consumed), and a `LockConflict` record names
    /// the holder in the audit chain. The rest of the batch was written.
    Conflict(Box<LockHolder>),
    /// A `BeginStep` that repeats this earlier step of its tool, found by its
    /// [`duplicate_check`](BeginStep::duplicate_check) (the newest such step, and not the
    /// one its approval was given over): nothing of the step was written, nor the approval
    /// it would have consumed; a person must see both calls first. The rest of the batch
    /// was written.
    Duplicate(Box<DuplicateStep>),
    /// A `Prune`: how many sagas, and steps of theirs, were removed (the named sagas that
    /// were no longer prunable were left as they are).
    Pruned {
        /// Sagas removed.
        n_sagas: u64,
        /// Their steps, removed with them.
        n_steps: u64,
    },
}

/// Most sagas one [`LogWrite::Prune`] may name: its checkpoint record lists them all.
pub const PRUNE_SAGAS_MAX: usize = 1_000;

/// Most bytes of saga ids one [`LogWrite::Prune`] may name, so that its checkpoint record
/// stays far below a log's bound on one audit record whatever the ids.
pub const PRUNE_IDS_BYTES_MAX: usize = 256 * 1024;

/// Sagas to remove, finished before a horizon (see [`LogWrite::Prune`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PruneSagas {
    /// The sagas, each checked again before it is removed.
    pub saga_ids: Vec<SagaId>,
    /// The horizon: only a saga last changed before it is removed (milliseconds since the
    /// Unix epoch).
    pub before_ms: i64,
}

/// The binding of an idempotency key: the step that last ran with it.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyBinding {
    /// The key.
    pub key: String,
    /// The hash of the arguments the key is bound to, for good.
    pub args_hash: String,
    /// The saga of the step that holds the key.
    pub saga_id: SagaId,
    /// The state of that saga.
    pub saga_state: SagaState,
    /// The step that holds the key.
    pub step_seq: u32,
    /// That step's status.
    pub status: StepStatus,
    /// That step's output, when committed.
    pub output: Option<ToolOutput>,
    /// That step's error, when it failed: a failure with an uncertain outcome keeps the key
    /// held until the step is compensated.
    pub error: Option<ToolError>,
}

impl KeyBinding {
    /// Whether the key is free to be claimed again by a step with the same arguments: its
    /// holder failed with nothing applied, or was compensated.
    pub fn is_released(&self) -> bool {
        match self.status {
            StepStatus::Compensated => true,
            StepStatus::Fail => !self.error.as_ref().is_some_and(ToolError::is_uncertain),
            StepStatus::Begin | StepStatus::Commit | StepStatus::CompensationFailed => false,
        }
    }
}

/// One step as the log holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// The step's position, from 0.
    pub step_seq: u32,
    /// The tool id.
    pub tool_id: String,
    /// The tool's version when the step ran.
    pub tool_version: String,
    /// The tool's effect class.
    pub effect: EffectClass,
    /// The arguments.
    pub args: Value,
    /// The hash of the canonical arguments.
    pub args_hash: String,
    /// The caller's idempotency key.
    pub idempotency_key: Option<String>,
    /// What compensation needs.
    pub undo: Undo,
    /// The status.
    pub status: StepStatus,
    /// The output, once committed.
    pub output: Option<ToolOutput>,
    /// The error, once failed.
    pub error: Option<ToolError>,
    /// For a reused step: the saga and step whose output it reused.
    pub reused_from: Option<(SagaId, u32)>,
    /// What compensation reported.
    pub compensation: Option<String>,
    /// When the step was begun, in ms since the Unix epoch.
    pub created_at_ms: i64,
    /// When it last changed, in ms since the Unix epoch.
    pub updated_at_ms: i64,
    /// The resources its BEGIN claimed (its tool's resource keys for its arguments),
    /// sorted; empty when it declared none (a read-only step).
    #[serde(default)]
    pub resources: Vec<String>,
}

/// One saga with its steps, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SagaRecord {
    /// The saga.
    pub saga: SagaSummary,
    /// Its steps, by `step_seq`.
    pub steps: Vec<StepRecord>,
    /// The resources it holds now (none once it is settled), sorted.
    #[serde(default)]
    pub locks: Vec<String>,
    /// The claims of its steps that other sagas' locks refused, oldest first.
    #[serde(default)]
    pub conflicts: Vec<ConflictRecord>,
}

/// A claim a saga's step made on a resource another saga held, as the log recorded it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConflictRecord {
    /// When, in ms since the Unix epoch.
    pub at_ms: i64,
    /// The position the step would have had.
    pub step_seq: u32,
    /// Its tool.
    pub tool_id: String,
    /// The resource refused.
    pub resource: String,
    /// The saga that held it.
    pub holder_saga_id: SagaId,
    /// That saga's state then.
    pub holder_state: SagaState,
}

/// Why the log could not do what was asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TxError {
    /// The file exists but is not an agent-kernel log; it was not modified.
    #[error("{path} is not an agent-kernel log: {reason}; it was left untouched")]
    NotALog {
        /// The file.
        path: String,
        /// Why it was refused.
        reason: String,
    },
    /// The log was written by a newer agent-kernel.
    #[error("{path} has log schema version {found}, newer than the supported {supported}")]
    SchemaTooNew {
        /// The file.
        path: String,
        /// The version found.
        found: i64,
        /// The newest version this build knows.
        supported: i64,
    },
    /// The log's schema is not the one this build creates for its version: an object
    /// (trigger, view, index, table, column) was added, removed or changed, or its
    /// `user_version` does not match its structure. The log was not used.
    #[error(
        "{path} fails its schema check: {reason}; the log may have been tampered with, so it was not used"
    )]
    Tampered {
        /// The file.
        path: String,
        /// The first difference found, naming the object.
        reason: String,
    },
    /// The log could not be opened, read or written.
    #[error("log storage: {0}")]
    Storage(String),
    /// A record read back or about to be written breaks the log's rules.
    #[error("log record: {0}")]
    Corrupt(String),
    /// A write refers to a saga or step the log does not hold.
    #[error("log: {0}")]
    NotFound(String),
    /// The thread that owns the log is gone (it panicked or the log was closed).
    #[error("the log writer has stopped")]
    Closed,
    /// A saga created with [`NewSaga::require_actor_idle`] found its actor with another
    /// unfinished saga; nothing of the batch was written.
    #[error("actor `{actor}` already has an unfinished saga, {saga_id}")]
    ActorBusy {
        /// The actor.
        actor: String,
        /// Its unfinished saga.
        saga_id: SagaId,
    },
    /// This process's lease on the log ran out (it was paused, or cut off from the
    /// database, longer than its lease): its sagas may have been taken over, so none of
    /// its writes is accepted any more; nothing of the batch was written.
    #[error(
        "this process's lease on the log ran out ({reason}); it must stop, and its sagas are another's to recover"
    )]
    Fenced {
        /// When and why.
        reason: String,
    },
    /// A [`LogWrite::ClaimLocks`] found a resource of the saga held by another unsettled
    /// saga; nothing of the batch was written.
    #[error("conflict: {0}")]
    Conflict(Box<LockHolder>),
    /// A [`LogWrite::ConsumeApproval`] found no approved, unused request naming exactly its
    /// saga, step, tool, arguments and digest; nothing of the batch was written.
    #[error("approval {approval_id} cannot be used for this step: {reason}")]
    ApprovalUnusable {
        /// The request.
        approval_id: String,
        /// Why.
        reason: String,
    },
}

/// What a log that keeps owners' leases says of one owner ([`TxLog::owner_lease`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseStatus {
    /// The owner renewed its lease and it has not run out: the owner is alive.
    Live,
    /// The owner's lease ran out, or it never held one: it is dead for good (an expired
    /// lease is never renewed), and its sagas may be taken over.
    Expired,
}

/// The write-ahead log the saga engine records every step in.
///
/// The trait is object-safe (methods return boxed futures) so the engine can hold
/// `Arc<dyn TxLog>` and backends can differ without generics crossing crate boundaries.
///
/// # Contract
///
/// - [`write`](Self::write) applies a whole batch in one transaction, or none of it, and
///   returns once the batch is as durable as the log's durability mode promises.
///   The engine relies on this to make a step's intent durable before its effect.
/// - Implementations must not block the caller's async runtime thread.
/// - Nothing assumes a single process: several processes may share one log, and
///   [`take_over`](Self::take_over) is how one of them claims a dead owner's saga.
pub trait TxLog: Send + Sync + 'static {
    /// Writes a batch of records atomically and durably.
    ///
    /// # Errors
    ///
    /// [`TxError`] when the batch could not be written; then none of it was.
    fn write(&self, batch: Vec<LogWrite>) -> BoxFuture<'_, Result<Vec<WriteOutcome>, TxError>>;

    /// One saga with all its steps, or `None` if the log has no such saga.
    ///
    /// # Errors
    ///
    /// [`TxError`] when the log cannot be read.
    fn saga<'a>(
        &'a self,
        saga_id: &'a SagaId,
    ) -> BoxFuture<'a, Result<Option<SagaRecord>, TxError>>;

    /// Several sagas with all their steps, one answer per id asked and in that order (`None`
    /// for one the log does not have), each as [`saga`](Self::saga) would read it.
    ///
    /// Recovery reads a group of sagas at once through this. The default reads them one
    /// after another; both backends of this project read them in one job of their
    /// connection's thread (SQLite's writer, a PostgreSQL snapshot).
    ///
    /// # Errors
    ///
    /// [`TxError`] when the log cannot be read.
    fn saga_records<'a>(
        &'a self,
        saga_ids: &'a [SagaId],
    ) -> BoxFuture<'a, Result<Vec<Option<SagaRecord>>, TxError>> {
        Box::pin(async move {
            let mut records = Vec::with_capacity(saga_ids.len());
            for saga_id in saga_ids {
                records.push(self.saga(saga_id).await?);
            }
            Ok(records)
        })
    }

    /// The most recent sagas, newest first, at most `limit`.
    ///
    /// # Errors
    ///
    /// [`TxError`] when the log cannot be read.
    fn sagas(&self, limit: u32) -> BoxFuture<'_, Result<Vec<SagaSummary>, TxError>>;

    /// How many sagas of the log are in each state (states without one left out).
    ///
    /// # Errors
    ///
    /// [`TxError`] when the log cannot be read.
    fn saga_counts(&self) -> BoxFuture<'_, Result<Vec<(SagaState, u64)>, TxError>>;

    /// A page of the saga list: the sagas `query` selects, newest first, found by the index
    /// of sagas by creation (a filter on steps looks at the steps of each saga it passes).
    ///
    /// # Errors
    ///
    /// [`TxError`] when the log cannot be read.
    fn saga_page<'a>(
        &'a self,
        query: &'a SagaQuery,
    ) -> BoxFuture<'a, Result<Vec<SagaListing>, TxError>>;

    /// Every saga not in a terminal state, oldest first.
    ///
    /// # Errors
    ///
    /// [`TxError`] when the log cannot be read.
    fn unfinished_sagas(&self) -> BoxFuture<'_, Result<Vec<SagaSummary>, TxError>>;

    /// The settled sagas that still hold locks (an `undo` of them stopped after it claimed
    /// them again), for recovery to release those of dead owners. The default knows none.
    ///
    /// # Errors
    ///
    /// [`TxError`] when the log cannot be read.
    fn settled_lock_holders(&self) -> BoxFuture<'_, Result<Vec<SagaSummary>, TxError>> {
        Box::pin(std::future::ready(Ok(Vec::new())))
    }

    /// The most recent step of `tool_id` begun at or after `since_ms`, in a saga other than
    /// `saga_id`, whose duplicate keys share one of `keys`; not a step that failed before
    /// its effect or was refused.
    ///
    /// # Errors
    ///
    /// [`TxError`] when the log cannot be read.
    fn duplicate_of<'a>(
        &'a self,
        saga_id: &'a SagaId,
        tool_id: &'a str,
        keys: &'a [String],
        since_ms: i64,
    ) -> BoxFuture<'a, Result<Option<DuplicateStep>, TxError>>;

    /// The newest step of a saga other than `saga_id`, begun at or after `since_ms`, that
    /// claimed `resource`, and whose effect may still be in place: `COMMIT` or `BEGIN` in
    /// a saga neither `FailedRolledBack` nor `Undone`, or `COMPENSATION_FAILED` in any
    /// (one resolved by hand kept its effect). What `undo` asks before it compensates a
    /// step: that saga's effect may cover the step's. The log keeps no index of steps by
    /// resource, so this reads the steps begun since.
    ///
    /// # Errors
    ///
    /// [`TxError`] when the log cannot be read.
    fn later_claim<'a>(
        &'a self,
        saga_id: &'a SagaId,
        resource: &'a str,
        since_ms: i64,
    ) -> BoxFuture<'a, Result<Option<crate::LaterClaim>, TxError>>;

    /// The binding of an idempotency key, if the key was ever used.
    ///
    /// # Errors
    ///
    /// [`TxError`] when the log cannot be read.
    fn key_binding<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<KeyBinding>, TxError>>;

    /// Makes `new_owner` the owner of a saga if `expected_owner` still is and the saga is
    /// still in `expected_state`. Returns whether it did; `false` means another process took
    /// it first or the saga moved on (it may have just reached `Done`). On a log that keeps
    /// leases, a saga is taken only once its owner's lease has ended. It is
    /// [`take_over_and_write`](Self::take_over_and_write) with nothing after it.
    ///
    /// # Errors
    ///
    /// [`TxError`] when the log cannot be written.
    fn take_over<'a>(
        &'a self,
        saga_id: &'a SagaId,
        expected_owner: &'a Owner,
        expected_state: SagaState,
        new_owner: &'a Owner,
    ) -> BoxFuture<'a, Result<bool, TxError>> {
        self.take_over_and_write(
            saga_id,
            expected_owner,
            expected_state,
            new_owner,
            Vec::new(),
        )
    }

    /// [`take_over`](Self::take_over), and, if it held, `then` written after it: in the same
    /// transaction, so that either both are in the log or neither is (`then` refused
    /// undoes the take-over, and is the error). Recovery takes a saga over and moves it to
    /// `Compensating` so, in one synced commit; a log wrapped around another must pass it
    /// on, never split it in two.
    ///
    /// # Errors
    ///
    /// [`TxError`] when the log cannot be written, or refuses `then`.
    fn take_over_and_write<'a>(
        &'a self,
        saga_id: &'a SagaId,
        expected_owner: &'a Owner,
        expected_state: SagaState,
        new_owner: &'a Owner,
        then: Vec<LogWrite>,
    ) -> BoxFuture<'a, Result<bool, TxError>>;

    /// One approval request, or `None` if the log has no such request.
    ///
    /// # Errors
    ///
    /// [`TxError`] when the log cannot be read.
    fn approval<'a>(
        &'a self,
        approval_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<ApprovalRecord>, TxError>>;

    /// The newest approval request of a saga, if it has one.
    ///
    /// # Errors
    ///
    /// [`TxError`] when the log cannot be read.
    fn saga_approval<'a>(
        &'a self,
        saga_id: &'a SagaId,
    ) -> BoxFuture<'a, Result<Option<ApprovalRecord>, TxError>>;

    /// [`saga_approval`](Self::saga_approval), once the log has shown that the request's row
    /// still says what the kernel recorded, in the audit chain, when it asked: the same step,
    /// tool, arguments, idempotency key, digest and later steps of the plan, in a sound
    /// record. `resume` runs what this returns, so a row rewritten after the request (another
    /// plan put in the place of the later steps, say) runs nothing.
    ///
    /// # Errors
    ///
    /// [`TxError::ApprovalUnusable`] naming what differs; [`TxError`] when the log cannot be
    /// read.
    fn vouched_saga_approval<'a>(
        &'a self,
        saga_id: &'a SagaId,
    ) -> BoxFuture<'a, Result<Option<ApprovalRecord>, TxError>>;

    /// Every request still recorded as pending (expired ones included), oldest first.
    ///
    /// # Errors
    ///
    /// [`TxError`] when the log cannot be read.
    fn pending_approvals(&self) -> BoxFuture<'_, Result<Vec<ApprovalRecord>, TxError>>;

    /// One dead letter, or `None` if the log has no such letter.
    ///
    /// # Errors
    ///
    /// [`TxError`] when the log cannot be read.
    fn dead_letter<'a>(
        &'a self,
        letter_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<DeadLetter>, TxError>>;

    /// The open dead letters: of one saga, or of every saga (`None`), oldest first.
    ///
    /// # Errors
    ///
    /// [`TxError`] when the log cannot be read.
    fn open_dead_letters<'a>(
        &'a self,
        saga_id: Option<&'a SagaId>,
    ) -> BoxFuture<'a, Result<Vec<DeadLetter>, TxError>>;

    /// Whether this process may start an effect now (a step's or a compensation's): on a
    /// log shared by many machines, only while its lease is certainly live, so that a
    /// process cut off from the log past its lease never acts on a saga another may have
    /// taken over. The default (a log of one machine, whose owners' liveness is their
    /// processes') always allows. Called right before every effect; must be cheap and must
    /// not block.
    ///
    /// # Errors
    ///
    /// [`TxError::Fenced`] saying why not.
    fn effect_allowed(&self) -> Result<(), TxError> {
        Ok(())
    }

    /// Whether `owner` is alive by its lease, for a log shared by processes on many
    /// machines, whose pids cannot be probed; `None` for a log that keeps no leases (SQLite:
    /// liveness is the process's, read from `/proc`).
    ///
    /// # Errors
    ///
    /// [`TxError`] when the log cannot be read.
    fn owner_lease<'a>(
        &'a self,
        owner: &'a Owner,
    ) -> BoxFuture<'a, Result<Option<LeaseStatus>, TxError>> {
        let _ = owner;
        Box::pin(async { Ok(None) })
    }

    /// How long `owner`'s lease has left, in ms (zero or less: it ran out), on a log that
    /// keeps leases; `None` on a log that keeps none, or for an owner that holds none. For
    /// reports and for waiting on it (`recover --wait`), never for deciding liveness, which
    /// [`TxLog::owner_lease`] does.
    ///
    /// # Errors
    ///
    /// [`TxError`] when the log cannot be read.
    fn lease_left_ms<'a>(
        &'a self,
        owner: &'a Owner,
    ) -> BoxFuture<'a, Result<Option<i64>, TxError>> {
        let _ = owner;
        Box::pin(async { Ok(None) })
    }

    /// Ends `owner`'s lease now, for good, on a log that keeps leases: the caller found its
    /// process gone (an owner on this machine, in this boot, whose pid and start time no
    /// longer name a running process), which can never renew it, so its sagas need not
    /// wait for the lease to run out. The default (a log that keeps no leases) does nothing.
    ///
    /// # Errors
    ///
    /// [`TxError`] when the log cannot be written.
    fn end_lease<'a>(&'a self, owner: &'a Owner) -> BoxFuture<'a, Result<(), TxError>> {
        let _ = owner;
        Box::pin(async { Ok(()) })
    }

    /// Up to `limit` sagas that [`LogWrite::Prune`] would remove at `before_ms`, with their
    /// steps: finished (`Done`, `FailedRolledBack`, `FailedRollbackPartial`, `Undone`), last
    /// changed before `before_ms`, with no open dead letter and no open approval request;
    /// oldest first (by creation, then id), after `after` (the `created_at_ms` and id of a
    /// saga returned before, to page on) when given.
    ///
    /// # Errors
    ///
    /// [`TxError`] when the log cannot be read.
    fn prune_candidates(
        &self,
        before_ms: i64,
        after: Option<(i64, SagaId)>,
        limit: u32,
    ) -> BoxFuture<'_, Result<Vec<SagaRecord>, TxError>>;
}
