//! agent-kernel: every tool call an agent makes runs as a step of a saga, with its intent
//! logged durably before the effect, compensation in reverse on failure, recovery after a
//! kill, exactly-once by key, a sandbox, approvals and an audit chain.
//!
//! This crate is the front door: [`KernelBuilder`] wires the engine
//! ([`agent_kernel_core`]) to a log, a sandbox policy, an FSM table and tools, and every
//! name a program needs is re-exported here. The command line, the MCP server, the Python
//! package and the evals build their kernels through it.
//!
//! ```
//! use agent_kernel::{BeginOptions, Compensate, KernelBuilder, SagaState, Tool, ToolSpec};
//! use agent_kernel::{ToolContext, ToolError, ToolOutput, Undo, serde_json::{Value, json}};
//! struct Note; // `note {text}`: writes `notes/<saga>.txt`; compensation removes it
//! impl Tool for Note {
//!     fn spec(&self) -> ToolSpec { ToolSpec::mutating("note").with_schema(json!({ "required": ["text"] })) }
//!     async fn execute(&self, ctx: &ToolContext, args: &Value) -> Result<ToolOutput, ToolError> {
//!         let text = args["text"].as_str().unwrap_or_default().as_bytes().to_vec();
//!         ctx.write_file(&format!("notes/{}.txt", ctx.saga_id), text).await?;
//!         Ok(ToolOutput::new(json!({ "written": true })))
//!     }
//! }
//! impl Compensate for Note {
//!     async fn compensate(&self, ctx: &ToolContext, _: &Value, _: &Undo, _: Option<&ToolOutput>) -> Result<(), ToolError> {
//!         ctx.remove_file(&format!("notes/{}.txt", ctx.saga_id)).await.map(drop)
//!     }
//! }
//! # fn main() -> Result<(), Box<dyn std::error::Error>> { let dir = tempfile::tempdir()?; std::fs::create_dir(dir.path().join("notes"))?;
//! let kernel = KernelBuilder::new().db(dir.path().join("log.db")).cwd(dir.path())
//!     .policy_toml("[fs]\nallow = [\"notes\"]\n", dir.path())?.tool(Note).build()?;
//! let report = tokio::runtime::Runtime::new()?.block_on(async {
//!     let saga = kernel.begin(BeginOptions::default()).await?;
//!     saga.call("note", json!({ "text": "hello" }), None).await?;
//!     saga.abort("changed my mind").await // the note is removed again
//! })?;
//! assert_eq!(report.state, SagaState::FailedRolledBack);
//! assert_eq!(std::fs::read_dir(dir.path().join("notes"))?.count(), 0);
//! # Ok(()) }
//! ```
//!
//! [`KernelBuilder::new`] reads no file and no environment variable it is not pointed at;
//! [`KernelBuilder::from_folder`] takes the command line's defaults (`agent-kernel.db`,
//! `sandbox.toml`, `fsm.toml`, `tools.toml`) from a folder.
//!
//! # Features
//!
//! | feature | what it adds |
//! | --- | --- |
//! | `sqlite` (default) | the embedded log, one SQLite file |
//! | `postgres` | a PostgreSQL log shared by many workers (`.db("postgres://…")`) |
//! | `upstream` | upstream MCP servers behind the kernel (`[mcp_servers.NAME]` in a tools file) |
//! | `http` | the built-in `http.get` tool |
//! | `full` | all of the above, as the command line has them |
//!
//! A program that brings its own [`TxLog`] may turn every feature off and give it with
//! [`KernelBuilder::log`].
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

mod backend;
mod builder;
mod confine;
pub mod operator;
mod process;
mod wiring;

pub use agent_kernel_api::*;
pub use agent_kernel_core::*;
pub use agent_kernel_dispatcher::Limits;
pub use agent_kernel_fsm::Guardrail;
pub use agent_kernel_sandbox::{NetworkLine, Policy, SecondLine};
pub use backend::{AuditKey, is_postgres};
pub use builder::{
    DB_ENV, DEFAULT_DB, DEFAULT_FSM, DEFAULT_SANDBOX, DEFAULT_TOOLS, KernelBuilder, LEASE_ENV,
};
pub use confine::{Confinement, Opened};
pub use process::{ProcessProbe, current_owner, current_uid};
/// The JSON values tools take and give.
pub use serde_json;
pub use wiring::{
    McpSettings, OPERATOR_KEY_BYTES_MAX, ToolSet, approval_policy_from, declared_tools,
    dispatcher_with, limits_from_policy, mcp_settings_from, read_operator_key,
};

/// The README's Rust snippet, compiled and run as a documentation test.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeSnippet;
