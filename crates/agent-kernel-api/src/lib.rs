//! The contract every agent-kernel crate shares: tools, the transaction log, plans and saga states.
//!
//! This crate holds traits, plain types and their errors only.
//! It knows nothing of SQLite, of any async runtime, of the command line or of the file system,
//! so a tool author or a log backend can depend on it alone.
//!
//! # The pieces
//!
//! - [`Tool`]: what every tool implements, a [`ToolSpec`] value that describes it and
//!   `execute`. A tool that can undo its effect also implements [`Compensate`] (`compensate`,
//!   plus `prepare`, which captures what compensation will need *before* the effect runs);
//!   one that can tell whether an effect of unknown outcome happened implements [`Probe`].
//!   [`ToolEntry`] says which of these a tool implements and makes it a [`DynTool`], the
//!   trait object a registry holds.
//! - [`TxLog`]: the write-ahead log the saga engine records every step in.
//! - [`Plan`]: the plan file, parsed strictly (unknown fields are errors).
//! - [`SagaState`] and [`StepStatus`]: the names of saga and step states.
//! - [`Clock`] and [`IdSource`]: time and ids are injected, never read from the ambient world,
//!   so tests and replays are deterministic.
//!
//! # Why the traits are small, and a [`ToolEntry`] between them and a registry
//!
//! A tool's abilities are traits, not methods with defaults, so a spec cannot claim what its
//! tool cannot do: a registry refuses a mutating tool without [`Compensate`] unless it
//! declares [`Reversibility::None`], and [`Settlement::Probe`] from a tool without [`Probe`]
//! ([`ToolEntry::misdeclaration`]).
//! Native `async fn` in traits is not dyn-compatible, so [`ToolEntry`] boxes each future
//! once, at the call boundary: one allocation per call, noise beside a synced log write.
//!
//! # Example
//!
//! ```
//! use agent_kernel_api::{
//!     Compensate, ToolContext, ToolEntry, ToolError, ToolOutput, ToolSpec, Tool, Undo,
//! };
//! use serde_json::{json, Value};
//!
//! /// A counter kept in memory: `add` adds, compensation takes it back.
//! #[derive(Default)]
//! struct Counter(std::sync::atomic::AtomicI64);
//!
//! impl Tool for Counter {
//!     fn spec(&self) -> ToolSpec {
//!         ToolSpec::mutating("counter.add")
//!             .with_schema(json!({"type": "object", "required": ["by"]}))
//!     }
//!     async fn execute(&self, _ctx: &ToolContext, args: &Value) -> Result<ToolOutput, ToolError> {
//!         let by = args["by"].as_i64().ok_or_else(|| ToolError::invalid_args("`by` is a number"))?;
//!         let now = self.0.fetch_add(by, std::sync::atomic::Ordering::SeqCst) + by;
//!         Ok(ToolOutput::new(json!({ "value": now })))
//!     }
//! }
//!
//! impl Compensate for Counter {
//!     async fn compensate(
//!         &self,
//!         _ctx: &ToolContext,
//!         args: &Value,
//!         _undo: &Undo,
//!         _output: Option<&ToolOutput>,
//!     ) -> Result<(), ToolError> {
//!         let by = args["by"].as_i64().unwrap_or(0);
//!         self.0.fetch_sub(by, std::sync::atomic::Ordering::SeqCst);
//!         Ok(())
//!     }
//! }
//!
//! let entry = ToolEntry::compensated(Counter::default());
//! assert_eq!(entry.id(), "counter.add");
//! assert_eq!(entry.misdeclaration(), None);
//! ```
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

mod approval;
mod canonical;
mod clock;
mod entry;
mod files;
mod list;
mod log;
mod observed;
mod plan;
mod resource;
mod reversibility;
mod spec;
mod state;
mod text;
mod tool;

pub use approval::{
    ApprovalDecision, ApprovalRecord, ApprovalRequest, ApprovalStatus, ConsumeApproval,
    DEFAULT_APPROVAL_TIMEOUT_MS, DeadLetter, DeadLetterStatus, DecideApproval,
    MAX_APPROVAL_TIMEOUT_MS, MAX_DECISION_NOTE_BYTES, RecordDeadLetter, SettleDeadLetter,
};
pub use canonical::{canonical_json, write_json_string};
pub use clock::{Clock, IdSource, format_rfc3339_ms, parse_utc_ms};
pub use entry::{Compensate, DynTool, Misdeclaration, Probe, Tool, ToolEntry};
pub use files::{Files, NoFiles};
pub use list::{SagaListing, SagaQuery, SagaSummary};
pub use log::{
    AbortCause, AuditEvent, BeginStep, CallRefusal, ConflictRecord, KeyBinding, LeaseStatus,
    LogWrite, NewSaga, OperatorCommand, Owner, PRUNE_IDS_BYTES_MAX, PRUNE_SAGAS_MAX, PlanDenial,
    PruneSagas, SagaAbort, SagaRecord, StepDenial, StepRecord, TxError, TxLog, WriteOutcome,
};
pub use observed::{ObservedLog, WriteObserver};
pub use plan::{
    MAX_IDEMPOTENCY_KEY_BYTES, MAX_LABEL_BYTES, MAX_PLAN_BYTES, MAX_PLAN_STEPS, Plan, PlanError,
    PlanStep,
};
pub use resource::{
    DuplicateCheck, DuplicateStep, KeyTemplate, KeyTemplateError, LaterClaim, LockHolder,
    MAX_RESOURCE_KEY_BYTES, MAX_RESOURCES_PER_STEP, file_resource, parse_templates, template_keys,
    tool_resource,
};
pub use reversibility::{
    DEFAULT_UNDO_WINDOW_MS, MAX_UNDO_WINDOW_MS, Reversibility, UndoWindow, not_a_duration,
    parse_duration_ms,
};
pub use spec::ToolSpec;
pub use state::{Durability, OnDenied, SagaId, SagaState, StepStatus};
pub use text::{line_of, read_text_bounded};
pub use tool::{
    BoxFuture, EffectClass, Outcome, ProbeOutcome, Settlement, SourcedTool, ToolContext, ToolError,
    ToolErrorKind, ToolOutput, ToolSource, UPSTREAM_TOOL_VERSION, Undo,
};
