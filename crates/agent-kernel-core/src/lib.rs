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
//! # Example: a live saga over a tool of your own
//!
//! A tool implements [`TransactionalTool`](agent_kernel_api::TransactionalTool): its id,
//! effect class, idempotence, settlement, argument schema, `execute` and (for a mutating
//! tool) `compensate`; the rest has defaults. [`KernelBuilder`] opens the log with the
//! command line's defaults; [`Kernel::begin`] starts a live saga, each
//! [`LiveSaga::call`] runs one step, and [`LiveSaga::commit`] or [`LiveSaga::abort`] ends it.
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use agent_kernel_api::{EffectClass, SagaState, Settlement, ToolContext, ToolError, ToolOutput, TransactionalTool, Undo};
//! use agent_kernel_core::{BeginOptions, CallAnswer, KernelBuilder};
//! use serde_json::{json, Value};
//!
//! /// `note.add {text}`: appends to a list; compensation takes it out again.
//! struct Notes(Arc<Mutex<Vec<String>>>);
//!
//! impl TransactionalTool for Notes {
//!     fn id(&self) -> &str { "note.add" }
//!     fn effect(&self) -> EffectClass { EffectClass::Mutating }
//!     fn idempotent(&self) -> bool { false }
//!     fn settlement(&self) -> Settlement { Settlement::Compensate }
//!     fn args_schema(&self) -> Value { json!({"type": "object", "required": ["text"]}) }
//!     async fn execute(&self, _: &ToolContext, args: &Value) -> Result<ToolOutput, ToolError> {
//!         self.0.lock().expect("not poisoned").push(args["text"].to_string());
//!         Ok(ToolOutput::new(json!({ "notes": self.0.lock().expect("not poisoned").len() })))
//!     }
//!     async fn compensate(&self, _: &ToolContext, args: &Value, _: &Undo, _: Option<&ToolOutput>) -> Result<(), ToolError> {
//!         self.0.lock().expect("not poisoned").retain(|note| *note != args["text"].to_string());
//!         Ok(())
//!     }
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! let notes = Arc::new(Mutex::new(Vec::new()));
//! let kernel = KernelBuilder::new()
//!     .db(dir.path().join("agent-kernel.db"))
//!     .tool(Notes(notes.clone()))
//!     .build()?;
//! tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
//!     let saga = kernel.begin(BeginOptions::default()).await?;
//!     let answer = saga.call("note.add", json!({ "text": "first" }), None).await?;
//!     assert!(matches!(answer, CallAnswer::Committed(_)));
//!     saga.call("note.add", json!({ "text": "second" }), None).await?;
//!     let report = saga.abort("changed my mind").await?;
//!     assert_eq!(report.state, SagaState::FailedRolledBack);
//!     Ok::<_, agent_kernel_core::KernelError>(())
//! })?;
//! assert!(notes.lock().expect("not poisoned").is_empty(), "both notes were taken out again");
//! # Ok(()) }
//! ```
//!
//! Plans run the same way: [`Kernel::run`] drives every step of a
//! [`Plan`](agent_kernel_api::Plan) over the same step path.
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

mod approval;
mod builder;
mod cancel;
mod compensation;
mod dead_letter;
mod env;
mod error;
mod kernel;
mod live;
mod owner;
mod plan;
mod prune;
mod recovery;
mod replay;
mod report;
mod shown;
mod step;
mod undo;

pub use approval::{
    APPROVAL_POLL_INTERVAL, ApprovalPolicy, MAX_APPROVAL_RULES, OperatorDecision, approval_digest,
    operator_key_check,
};
pub use builder::{
    DB_ENV, DEFAULT_DB, DEFAULT_FSM, DEFAULT_SANDBOX, DEFAULT_TOOLS, KernelBuilder, LEASE_ENV,
    OPERATOR_KEY_BYTES_MAX, ToolSet, approval_policy_from, declared_tools, dispatcher_with,
    limits_from_policy, read_operator_key,
};
pub use cancel::Cancellation;
pub use dead_letter::{
    DEAD_LETTER_BACKOFF_BASE_MS, DEAD_LETTER_BACKOFF_MAX_MS, RetryOutcome, dead_letter_backoff_ms,
};
pub use env::{SystemClock, UuidV7Ids};
pub use error::{KernelError, Problem, ProblemKind};
pub use kernel::{Environment, Kernel, VALIDATE_HINT, args_hash};
pub use live::{BeginOptions, CallAnswer, LiveSaga, LiveStatus};
pub use owner::{Liveness, LivenessProbe, ProcessProbe, current_owner, current_uid};
pub use prune::PruneReport;
pub use recovery::RECOVER_GROUP_SAGAS;
pub use replay::{Divergence, Recorded, ReplayReport, replay};
pub use report::{
    Failure, NoObserver, Observer, RecoveryAction, RecoveryReport, SagaEvent, SagaReport,
    StepReport, approval_document,
};
pub use shown::{HiddenChar, Shown, is_hidden, shown_json};
pub use undo::UndoRequest;
