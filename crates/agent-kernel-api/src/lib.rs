//! The contract every agent-kernel crate shares: tools, the transaction log, plans and saga states.
//!
//! This crate holds traits, plain types and their errors only.
//! It knows nothing of SQLite, of any async runtime, of the command line or of the file system,
//! so a tool author or a log backend can depend on it alone.
//!
//! # The pieces
//!
//! - [`TransactionalTool`]: what a tool implements (`execute` and `compensate`, plus `prepare`,
//!   which captures what compensation will need *before* the effect runs).
//!   [`DynTool`] is its object-safe twin, implemented for every tool by a blanket impl, so a
//!   registry can hold `Arc<dyn DynTool>`.
//! - [`TxLog`]: the write-ahead log the saga engine records every step in.
//! - [`Plan`]: the plan file of the contract, parsed strictly (unknown fields are errors).
//! - [`SagaState`] and [`StepStatus`]: the names the contract fixes.
//! - [`Clock`] and [`IdSource`]: time and ids are injected, never read from the ambient world,
//!   so tests and replays are deterministic.
//!
//! # Why two tool traits
//!
//! Native `async fn` in traits is not dyn-compatible: the future it returns has a different,
//! unnameable type for every implementation, so `dyn TransactionalTool` cannot exist.
//! A registry of tools needs trait objects, though.
//! Tool authors therefore implement [`TransactionalTool`] with plain `async fn`s, and the blanket
//! `impl<T: TransactionalTool> DynTool for T` boxes each future once, at the call boundary.
//! The cost is one allocation per call, which is noise beside a synced log write.
//!
//! # Example
//!
//! ```
//! use agent_kernel_api::{
//!     DynTool, EffectClass, Settlement, ToolContext, ToolError, ToolOutput, TransactionalTool,
//!     Undo,
//! };
//! use serde_json::{json, Value};
//!
//! /// A tool that only echoes its arguments.
//! struct Echo;
//!
//! impl TransactionalTool for Echo {
//!     fn id(&self) -> &str { "echo" }
//!     fn version(&self) -> &str { "1.0.0" }
//!     fn effect(&self) -> EffectClass { EffectClass::ReadOnly }
//!     fn idempotent(&self) -> bool { true }
//!     fn settlement(&self) -> Settlement { Settlement::Compensate }
//!     fn args_schema(&self) -> Value { json!({ "type": "object" }) }
//!     fn check(&self, _args: &Value) -> Result<(), ToolError> { Ok(()) }
//!     async fn prepare(&self, _ctx: &ToolContext, _args: &Value) -> Result<Undo, ToolError> {
//!         Ok(Undo::none())
//!     }
//!     async fn execute(&self, _ctx: &ToolContext, args: &Value) -> Result<ToolOutput, ToolError> {
//!         Ok(ToolOutput::new(args.clone()))
//!     }
//!     async fn compensate(
//!         &self,
//!         _ctx: &ToolContext,
//!         _args: &Value,
//!         _undo: &Undo,
//!         _output: Option<&ToolOutput>,
//!     ) -> Result<(), ToolError> {
//!         Ok(())
//!     }
//! }
//!
//! // The registry side: any tool is usable as a trait object.
//! let tool: std::sync::Arc<dyn DynTool> = std::sync::Arc::new(Echo);
//! assert_eq!(tool.id(), "echo");
//! ```
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

mod approval;
mod canonical;
mod clock;
mod files;
mod log;
mod observed;
mod plan;
mod reversibility;
mod state;
mod text;
mod tool;

pub use approval::{
    ApprovalDecision, ApprovalRecord, ApprovalRequest, ApprovalStatus, ConsumeApproval,
    DEFAULT_APPROVAL_TIMEOUT_MS, DeadLetter, DeadLetterStatus, DecideApproval,
    MAX_APPROVAL_TIMEOUT_MS, MAX_DECISION_NOTE_BYTES, RecordDeadLetter, SettleDeadLetter,
};
pub use canonical::{canonical_json, write_json_string};
pub use clock::{Clock, IdSource, format_rfc3339_ms};
pub use files::{Files, NoFiles};
pub use log::{
    AbortCause, AuditEvent, BeginStep, CallRefusal, KeyBinding, LeaseStatus, LogWrite, NewSaga,
    OperatorCommand, Owner, PRUNE_IDS_BYTES_MAX, PRUNE_SAGAS_MAX, PlanDenial, PruneSagas,
    SagaAbort, SagaRecord, SagaSummary, StepDenial, StepRecord, TxError, TxLog, WriteOutcome,
};
pub use observed::{ObservedLog, WriteObserver};
pub use plan::{
    MAX_IDEMPOTENCY_KEY_BYTES, MAX_LABEL_BYTES, MAX_PLAN_BYTES, MAX_PLAN_STEPS, Plan, PlanError,
    PlanStep,
};
pub use reversibility::{
    DEFAULT_UNDO_WINDOW_MS, MAX_UNDO_WINDOW_MS, Reversibility, UndoWindow, parse_duration_ms,
};
pub use state::{Durability, SagaId, SagaState, StepStatus};
pub use text::{line_of, read_text_bounded};
pub use tool::{
    BoxFuture, DynTool, EffectClass, Outcome, ProbeOutcome, Settlement, SourcedTool, ToolContext,
    ToolError, ToolErrorKind, ToolOutput, ToolSource, TransactionalTool, UPSTREAM_TOOL_VERSION,
    Undo,
};
