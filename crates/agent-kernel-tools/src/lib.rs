//! The built-in agent-kernel tools.
//!
//! | tool | args | effect | compensation |
//! | --- | --- | --- | --- |
//! | [`noop`](Noop) | `sleep_ms`? (0..=60000) | read-only | none |
//! | [`fs.read`](FsRead) | `path` | read-only | none |
//! | [`fs.write`](FsWrite) | `path`, `content` | mutating | restores the exact previous bytes, or removes a file that did not exist |
//! | [`fs.append`](FsAppend) | `path`, `content` | mutating | truncates back to the previous length, or removes a file that did not exist |
//! | [`fs.delete`](FsDelete) | `path` | mutating | restores the file with its previous bytes |
//! | [`validate.file`](ValidateFile) | `path`, and `contains`? / `equals`? | read-only | none; a check that does not hold is a validation failure |
//! | [`http.get`](HttpGet) | `url` | read-only (network) | none; every redirect hop and resolved address is checked against `[http]` |
//! | [`fault.fail`](FaultFail) | `message`? | read-only | none; always fails |
//! | [`fault.panic`](FaultPanic) | `message`? | read-only | none; panics inside `execute` |
//!
//! Each implements [`agent_kernel_api::Tool`]; the file tools also implement
//! [`agent_kernel_api::Compensate`]. [`builtin_tools`] returns them all as
//! [`agent_kernel_api::ToolEntry`]s for a registry.
//! The crate knows nothing of the log, the saga engine or the command line: a program can use a
//! tool alone by calling `check`, `prepare`, `execute` and, to undo, `compensate`.
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//!
//! use agent_kernel_api::{Compensate, Durability, SagaId, Tool, ToolContext};
//! use agent_kernel_sandbox::{FsSandbox, Policy};
//! use agent_kernel_tools::FsWrite;
//! use serde_json::json;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let base = dir.path().canonicalize()?;
//! std::fs::create_dir(base.join("workspace"))?;
//! std::fs::write(base.join("workspace/a.txt"), "old")?;
//! let policy = Policy::from_toml_str("[fs]\nallow = [\"workspace\"]\n", &base)?;
//! let tool = FsWrite::new(Arc::new(FsSandbox::new(&policy)?), base.clone());
//!
//! let ctx = ToolContext {
//!     saga_id: SagaId::new("saga-1"),
//!     step_seq: 0,
//!     tool_id: "fs.write".to_owned(),
//!     idempotency_key: None,
//!     actor: None,
//!     durability: Durability::Full,
//!     files: Arc::new(agent_kernel_api::NoFiles::new(&base)),
//! };
//! let args = json!({ "path": "workspace/a.txt", "content": "new" });
//! tool.check(&args)?; // arguments and policy, no side effect
//! let undo = tool.prepare(&ctx, &args).await?; // the old bytes, kept before the effect
//! let output = tool.execute(&ctx, &args).await?;
//! assert_eq!(output.effects, ["wrote 3 bytes to workspace/a.txt"]);
//! assert_eq!(std::fs::read_to_string(base.join("workspace/a.txt"))?, "new");
//!
//! tool.compensate(&ctx, &args, &undo, Some(&output)).await?;
//! assert_eq!(std::fs::read_to_string(base.join("workspace/a.txt"))?, "old");
//! # Ok(())
//! # }
//! ```
//!
//! # Design decisions
//!
//! - **Arguments are parsed strictly** into typed structs (`deny_unknown_fields`); serde's
//!   message names the offending field (``unknown field `contnt`, expected `path` or
//!   `content` ``). `check` also asks the sandbox about the path and the content size, with no
//!   side effect, so a plan can be checked whole before its first effect.
//! - **Compensation works from the undo record alone, under the policy in force.**
//!   `prepare` stores the [`ConfinedPath`](agent_kernel_sandbox::ConfinedPath) and the
//!   previous bytes or length; `compensate` (and a drill tool's `probe`) rules on that path
//!   again through [`FsSandbox::reconfine`](agent_kernel_sandbox::FsSandbox::reconfine), so a
//!   record is data, never authority: one that names a path outside today's roots (a forged
//!   log, a narrowed policy) is denied, and nothing is touched.
//! - **Compensation is state-based, so it is safe whether the effect happened or not**, and
//!   idempotent: it compares the file with the recorded state and only acts on a difference.
//! - **Temporary files are named after the step** (`.agent-kernel-<saga>-<step>.tmp`), so
//!   compensation after a crash removes the one a half-finished atomic write left behind.
//! - **No blocking on the runtime**: every file operation runs in
//!   `tokio::task::spawn_blocking`.
//! - **Errors say whether the effect may have happened**: denials and definite failures
//!   ([`ToolError::failed`](agent_kernel_api::ToolError::failed)) when nothing changed,
//!   [`ToolError::uncertain`](agent_kernel_api::ToolError::uncertain) when a mutation failed
//!   part-way.
//!   A check of `validate.file` that does not hold, a missing file included, is a
//!   [`ToolError::validation`](agent_kernel_api::ToolError::validation) failure: the world is
//!   not as the plan expects, so the saga rolls back.
//! - **`http.get` is checked at every step of the way**: the URL, each redirect hop before it
//!   is followed (at most [`HTTP_GET_REDIRECTS_MAX`]), each address a name resolves to before
//!   connecting (through a custom resolver), and the body's size while it is read.
//!   The client uses rustls, no system proxy, no cookies, no decompression, and is built once
//!   per tool on first use. A denial anywhere is
//!   [`ToolError::denied`](agent_kernel_api::ToolError::denied); connection failures and
//!   timeouts are retriable definite failures, since a GET changes nothing.
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

mod command;
mod common;
mod drill;
mod fault;
mod files;
mod fs_append;
mod fs_delete;
mod fs_read;
mod fs_write;
#[cfg(feature = "http")]
mod http_get;
mod noop;
mod validate_file;

use std::path::PathBuf;
use std::sync::Arc;

use agent_kernel_api::ToolEntry;
use agent_kernel_sandbox::{FsSandbox, HttpSandbox};

pub use command::{
    COMMAND_STDERR_BYTES_MAX, COMMAND_TIMEOUT_MS_MAX, COMMAND_TOOLS_MAX, CommandTool, EXIT_RETRY,
    Reversibility, TOOLS_FILE_BYTES_MAX, ToolsFileError, load_tools_file, parse_tools_file,
    read_tools_file,
};
pub use common::{TEMP_PREFIX, TEMP_SUFFIX, TOOL_VERSION};
pub use drill::{DRILL_PAUSE_MS_MAX, DrillWrite};
pub use fault::{
    FAULT_FAIL_DEFAULT_MESSAGE, FAULT_MESSAGE_BYTES_MAX, FAULT_PANIC_DEFAULT_MESSAGE, FaultFail,
    FaultPanic,
};
pub use files::SandboxFiles;
pub use fs_append::FsAppend;
pub use fs_delete::FsDelete;
pub use fs_read::FsRead;
pub use fs_write::FsWrite;
#[cfg(feature = "http")]
pub use http_get::{
    HTTP_GET_CONNECT_TIMEOUT_MS, HTTP_GET_REDIRECTS_MAX, HTTP_GET_RESOLVED_ADDRS_MAX,
    HTTP_GET_TIMEOUT_MS, HttpGet,
};
pub use noop::{NOOP_SLEEP_MS_MAX, Noop};
pub use validate_file::ValidateFile;

/// The ids of every built-in tool, whether or not a build offers it: no tool of a tools
/// file may take one.
pub const BUILTIN_TOOL_IDS: [&str; 11] = [
    "noop",
    "fs.read",
    "fs.write",
    "fs.append",
    "fs.delete",
    "validate.file",
    "http.get",
    "fault.fail",
    "fault.panic",
    "fault.probed_write",
    "fault.opaque_write",
];

/// Every built-in tool, ready for a registry: [`standard_tools`] and [`drill_tools`].
///
/// The file tools are confined by `fs`; relative paths in their arguments resolve against
/// `cwd` (the command's working directory, absolute). `http.get` is confined by `http`.
pub fn builtin_tools(fs: Arc<FsSandbox>, http: Arc<HttpSandbox>, cwd: PathBuf) -> Vec<ToolEntry> {
    let mut tools = standard_tools(Arc::clone(&fs), http, cwd.clone());
    tools.extend(drill_tools(fs, cwd));
    tools
}

/// The built-in tools an agent is given: `noop`, the file tools, `validate.file` and (with
/// the `http` feature, on by default) `http.get`; not the drill tools.
pub fn standard_tools(fs: Arc<FsSandbox>, http: Arc<HttpSandbox>, cwd: PathBuf) -> Vec<ToolEntry> {
    #[cfg(not(feature = "http"))]
    let _ = http;
    vec![
        ToolEntry::new(Noop),
        ToolEntry::new(FsRead::new(Arc::clone(&fs), cwd.clone())),
        ToolEntry::compensated(FsWrite::new(Arc::clone(&fs), cwd.clone())),
        ToolEntry::compensated(FsAppend::new(Arc::clone(&fs), cwd.clone())),
        ToolEntry::compensated(FsDelete::new(Arc::clone(&fs), cwd.clone())),
        ToolEntry::new(ValidateFile::new(fs, cwd)),
        #[cfg(feature = "http")]
        ToolEntry::new(HttpGet::new(http)),
    ]
}

/// The drill tools (`fault.fail`, `fault.panic`, `fault.probed_write`,
/// `fault.opaque_write`): failures on purpose, for demos and tests; never given to an agent
/// unless asked for.
pub fn drill_tools(fs: Arc<FsSandbox>, cwd: PathBuf) -> Vec<ToolEntry> {
    vec![
        ToolEntry::new(FaultFail),
        ToolEntry::new(FaultPanic),
        ToolEntry::compensated_probed(DrillWrite::probed(Arc::clone(&fs), cwd.clone())),
        ToolEntry::compensated_probed(DrillWrite::opaque(fs, cwd)),
    ]
}
