//! The agent-kernel saga engine.
//!
//! [`Kernel`] runs sagas, a [`Plan`](agent_kernel_api::Plan) written in advance or a live
//! saga driven one call at a time ([`Kernel::begin`]), over any
//! [`TxLog`](agent_kernel_api::TxLog) and any set of tools:
//!
//! 1. **Preflight**: every step is checked (known tool, valid arguments, sandbox policy,
//!    idempotency keys) before anything runs; all problems are reported at once.
//! 2. **Intent before effect**: for each step the tool's `prepare` captures what compensation
//!    will need, and the step's BEGIN record (with that undo data) is written durably before
//!    `execute` runs.
//!    The previous step's COMMIT rides in the same transaction, so a saga of `n` steps costs
//!    `n + 1` synced commits.
//! 3. **Rollback**: when a step fails, every step whose effect may be in place (committed,
//!    in doubt, or failed with an uncertain outcome) is compensated, last first, and each
//!    compensation is logged. The saga ends `FailedRolledBack`, or `FailedRollbackPartial`
//!    when a compensation fails.
//! 4. **Recovery**: [`Kernel::recover`] rolls back every unfinished saga whose owning
//!    process is dead (decided from pid, process start time and boot id, so a reused pid is
//!    not mistaken for the owner). `Done` sagas and sagas of live processes are never touched.
//! 5. **FSM guardrail**: every step passes the [`Guardrail`](agent_kernel_fsm::Guardrail)
//!    before any log write for it (may this tool run in this state, may it succeed here), and
//!    every state change is written in the same transaction as the step record that caused
//!    it; recovery resumes from the persisted state. A denial rolls back what ran.
//! 6. **Exactly-once by key**: a step whose idempotency key is committed in a `Done` saga
//!    is not run again; its recorded output is reused.
//!
//! Time, ids and process liveness are injected through [`Environment`], so the engine is
//! deterministic under test.
//! Every tool call goes through the [`Dispatcher`](agent_kernel_dispatcher::Dispatcher):
//! arguments checked against the tool's JSON Schema, calls bounded in time and concurrency,
//! retriable failures of idempotent tools retried, and a panicking tool contained as a failed
//! step. A step whose outcome is unknown (a timeout, a crash) is settled by the tool's declared
//! [`Settlement`](agent_kernel_api::Settlement): compensated blindly when that is safe, probed
//! when the tool can tell, or left to an operator (`FailedRollbackPartial`, never assumed done
//! or undone).
//! A [`Cancellation`] stops a saga at the next step boundary and rolls back what ran.
//!
//! # The engine alone
//!
//! This crate is the engine and nothing else: it depends on `agent-kernel-api` (the
//! traits), `agent-kernel-fsm` and `agent-kernel-dispatcher`, and sees the log, the tools
//! and the process table only through traits. Most programs build a kernel with the front
//! door, the `agent-kernel` crate (`agent_kernel::KernelBuilder`), which wires a log
//! (SQLite or PostgreSQL), a sandbox policy, the built-in, command and upstream tools and
//! this process's identity. A program that brings its own [`TxLog`](agent_kernel_api::TxLog)
//! and tools calls [`Kernel::new`] with an [`Environment`]:
//!
//! ```
//! use std::sync::Arc;
//! use agent_kernel_api::{Durability, Owner, SagaState};
//! use agent_kernel_core::{BeginOptions, Environment, Kernel, Liveness, LivenessProbe, SystemClock, UuidV7Ids};
//! use agent_kernel_dispatcher::{Dispatcher, Limits, SeededJitter};
//! use agent_kernel_txlog::{LogOptions, SqliteLog};
//!
//! /// Every other owner is alive: nothing is ever recovered (a test's probe).
//! struct AllAlive;
//! impl LivenessProbe for AllAlive {
//!     fn liveness(&self, _: &Owner) -> Liveness { Liveness::Alive }
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! let options = LogOptions { durability: Durability::Full, clock: Arc::new(SystemClock) };
//! let log = Arc::new(SqliteLog::open(&dir.path().join("saga.db"), options)?);
//! let tools = Dispatcher::new(Limits::default(), Arc::new(SeededJitter::new(7)))?;
//! let env = Environment {
//!     clock: Arc::new(SystemClock),
//!     ids: Arc::new(UuidV7Ids),
//!     owner: Owner { host: "here".into(), boot_id: "boot".into(), pid: 1, start_ticks: 1 },
//!     liveness: Arc::new(AllAlive),
//! };
//! let kernel = Arc::new(Kernel::new(log, Arc::new(tools), Arc::new(agent_kernel_fsm::Guardrail::builtin()), env, Durability::Full));
//! let report = tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
//!     kernel.begin(BeginOptions::default()).await?.abort("nothing to do").await
//! })?;
//! assert_eq!(report.state, SagaState::FailedRolledBack);
//! # Ok(()) }
//! ```
//!
//! Plans run the same way: [`Kernel::run`] drives every step of a
//! [`Plan`](agent_kernel_api::Plan) over the same step path.
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

mod approval;
mod approval_policy;
mod cancel;
mod compensation;
mod conflict;
mod dead_letter;
mod env;
mod error;
mod in_flight;
mod isolation;
mod kernel;
mod live;
mod live_call;
mod live_registry;
mod owner;
mod plan;
mod prune;
mod recoverable;
mod recovery;
mod replay;
mod report;
mod shown;
mod step;
mod undo;

pub use approval_policy::{
    APPROVAL_POLL_INTERVAL, ApprovalPolicy, MAX_APPROVAL_RULES, OperatorDecision, approval_digest,
    operator_key_check,
};
pub use cancel::Cancellation;
pub use conflict::Conflict;
pub use dead_letter::{
    DEAD_LETTER_BACKOFF_BASE_MS, DEAD_LETTER_BACKOFF_MAX_MS, RetryOutcome, dead_letter_backoff_ms,
};
pub use env::{SystemClock, UuidV7Ids};
pub use error::{KernelError, Problem, ProblemKind};
pub use isolation::{LOCK_POLL_INTERVAL, MAX_LOCK_PAUSE};
pub use kernel::{Environment, Kernel, VALIDATE_HINT, args_hash};
pub use live::{BeginOptions, CallAnswer, LiveSaga, LiveStatus};
pub use owner::{Liveness, LivenessProbe, StoppedPrograms};
pub use prune::PruneReport;
pub use recovery::RECOVER_GROUP_SAGAS;
pub use replay::{Divergence, Recorded, ReplayReport, replay};
pub use report::{
    Failure, NoObserver, Observer, RecoveryAction, RecoveryCounts, RecoveryReport, SagaEvent,
    SagaReport, StepReport, approval_document,
};
pub use shown::{HiddenChar, Shown, is_hidden, shown_json};
pub use undo::{INTERRUPTED_UNDO_REASON, UndoPreview, UndoRequest, UndoStepPreview, UndoVerdict};
