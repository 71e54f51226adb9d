//! The agent-kernel tool dispatcher: where the world gets touched, guarded.
//!
//! [`Dispatcher`] is the registry of tools (`tool id → tool`, ids unique) and the one path
//! every call takes:
//!
//! - **Arguments** are checked against the tool's JSON Schema before anything runs
//!   ([`Dispatcher::check`]); every violation is reported with its path and rule, and
//!   unknown fields are errors (the built-in schemas say `additionalProperties: false`).
//! - **Time**: every call is bounded by a timeout (a default and per-tool overrides); a call
//!   that times out has an uncertain outcome.
//! - **Concurrency**: a global limit and optional per-tool limits (semaphores).
//! - **Retries**: a failure is retried only when the error says a retry is safe *and* the
//!   tool is idempotent, at most `retries_max` times, with exponential backoff and jitter.
//! - **Containment**: a tool that panics becomes an error; the caller survives.
//!
//! Every bound is named in [`Limits`] and its constants.
//! The dispatcher does not decide the order of steps and never writes the log: that is the
//! saga engine's job.
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use agent_kernel_api::{
//!     Durability, SagaId, Tool, ToolContext, ToolEntry, ToolError, ToolOutput, ToolSpec,
//! };
//! use agent_kernel_dispatcher::{Dispatcher, Limits, NoJitter};
//! use serde_json::{json, Value};
//!
//! struct Echo;
//! impl Tool for Echo {
//!     fn spec(&self) -> ToolSpec {
//!         ToolSpec::read_only("echo").with_schema(json!({
//!             "type": "object", "properties": {"text": {"type": "string"}},
//!             "required": ["text"], "additionalProperties": false,
//!         }))
//!     }
//!     async fn execute(&self, _: &ToolContext, args: &Value) -> Result<ToolOutput, ToolError> {
//!         Ok(ToolOutput::new(args.clone()))
//!     }
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut dispatcher = Dispatcher::new(Limits::default(), Arc::new(NoJitter))?;
//! dispatcher.register(ToolEntry::new(Echo))?;
//! let error = dispatcher.check("echo", &json!({"txt": "hi"})).unwrap_err();
//! assert!(error.to_string().contains("required"), "{error}");
//!
//! let ctx = ToolContext {
//!     saga_id: SagaId::new("s"), step_seq: 0, tool_id: "echo".into(),
//!     idempotency_key: None, actor: None, durability: Durability::Full,
//!     files: Arc::new(agent_kernel_api::NoFiles::new(".")),
//! };
//! let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
//! let output = runtime.block_on(dispatcher.execute(&ctx, &json!({"text": "hi"})))?;
//! assert_eq!(output.data["text"], "hi");
//! # Ok(()) }
//! ```
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

mod dispatcher;
mod limits;

pub use dispatcher::{Dispatcher, Jitter, MAX_ARG_PROBLEMS, MAX_TOOLS, NoJitter, SeededJitter};
pub use limits::{
    DEFAULT_BACKOFF_BASE_MS, DEFAULT_BACKOFF_MAX_MS, DEFAULT_COMPENSATION_TIMEOUT_MS,
    DEFAULT_CONCURRENCY_MAX, DEFAULT_DUPLICATE_WINDOW_MS, DEFAULT_LOCK_WAIT_MS,
    DEFAULT_OPEN_SAGAS_MAX, DEFAULT_RETRIES_MAX, DEFAULT_SAGA_IDLE_TIMEOUT_MS, DEFAULT_TIMEOUT_MS,
    Limits, MAX_CONCURRENCY, MAX_DUPLICATE_WINDOW_MS, MAX_LOCK_WAIT_MS, MAX_OPEN_SAGAS,
    MAX_RETRIES, MAX_SAGA_IDLE_TIMEOUT_MS, MAX_TIMEOUT_MS, ToolLimits,
};

/// Why the dispatcher could not be built or a tool registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DispatchError {
    /// Two tools with one id.
    #[error("tool `{0}` is registered twice")]
    DuplicateTool(String),
    /// Past [`MAX_TOOLS`].
    #[error("a dispatcher holds at most {0} tools")]
    TooManyTools(usize),
    /// A tool's schema is not a valid JSON Schema.
    #[error("tool `{tool}` publishes an invalid JSON Schema: {reason}")]
    Schema {
        /// The tool.
        tool: String,
        /// What is wrong.
        reason: String,
    },
    /// A tool's spec claims what the tool cannot do.
    #[error("tool `{tool}` is misdeclared: {misdeclaration}")]
    Misdeclared {
        /// The tool.
        tool: String,
        /// What it claims.
        misdeclaration: agent_kernel_api::Misdeclaration,
    },
    /// A limit is out of range.
    #[error("dispatcher limits: {0}")]
    Limits(String),
    /// A tool source (an upstream MCP server) cannot be used, so none of its tools can.
    #[error("{reason}")]
    Unavailable {
        /// The source's name (an upstream server's).
        server: String,
        /// Why.
        reason: String,
    },
}
