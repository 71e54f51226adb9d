//! The agent-kernel saga engine.
//!
//! [`Kernel`] runs a [`Plan`](agent_kernel_api::Plan) as a saga over any
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
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use agent_kernel_api::{Durability, Plan, SagaState};
//! use agent_kernel_core::{
//!     current_owner, Environment, Kernel, NoObserver, ProcessProbe, SystemClock, UuidV7Ids,
//! };
//! use agent_kernel_dispatcher::{Dispatcher, Limits, NoJitter};
//! use agent_kernel_fsm::Guardrail;
//! use agent_kernel_txlog::{LogOptions, SqliteLog};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let log = SqliteLog::open(
//!     &dir.path().join("agent-kernel.db"),
//!     LogOptions { durability: Durability::Full, clock: Arc::new(SystemClock) },
//! )?;
//! let owner = current_owner()?;
//! let env = Environment {
//!     clock: Arc::new(SystemClock),
//!     ids: Arc::new(UuidV7Ids),
//!     liveness: Arc::new(ProcessProbe::new(owner.clone())),
//!     owner,
//! };
//! // Register tools here (see the agent-kernel-tools crate); an empty dispatcher refuses
//! // every plan in preflight.
//! let tools = Arc::new(Dispatcher::new(Limits::default(), Arc::new(NoJitter))?);
//! let fsm = Arc::new(Guardrail::builtin());
//! let kernel = Kernel::new(Arc::new(log), tools, fsm, env, Durability::Full);
//! let plan = Plan::from_json(r#"{"steps":[{"tool":"noop","args":{}}]}"#)?;
//! let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
//! let refused = runtime.block_on(kernel.run(&plan, &NoObserver));
//! assert!(refused.is_err_and(|err| err.is_bad_input()));
//! # Ok(()) }
//! ```
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

mod cancel;
mod compensation;
mod env;
mod error;
mod kernel;
mod live;
mod owner;
mod plan;
mod recovery;
mod report;
mod step;

pub use cancel::Cancellation;
pub use env::{SystemClock, UuidV7Ids};
pub use error::{KernelError, Problem, ProblemKind};
pub use kernel::{Environment, Kernel, VALIDATE_HINT, args_hash};
pub use live::{BeginOptions, CallAnswer, LiveSaga, LiveStatus};
pub use owner::{Liveness, LivenessProbe, ProcessProbe, current_owner, current_uid};
pub use report::{
    Failure, NoObserver, Observer, RecoveryAction, RecoveryReport, SagaEvent, SagaReport,
    StepReport,
};
