//! What every tool shares: argument parsing, schemas, blocking I/O, error mapping.

use std::path::PathBuf;
use std::sync::Arc;

use agent_kernel_api::{ToolContext, ToolError};
use agent_kernel_sandbox::{ConfinedFile, ConfinedPath, FsSandbox, SandboxError};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// The version every built-in tool reports.
pub const TOOL_VERSION: &str = "1.0.0";

/// What every temporary file of the file tools is named like: `.agent-kernel-<saga>-<step>.tmp`.
pub const TEMP_PREFIX: &str = ".agent-kernel-";

/// The suffix of every temporary file of the file tools.
pub const TEMP_SUFFIX: &str = ".tmp";

/// Parses `args` into a tool's argument struct; serde's message names the offending field.
pub(crate) fn parse_args<T: DeserializeOwned>(args: &Value) -> Result<T, ToolError> {
    T::deserialize(args).map_err(|error| ToolError::invalid_args(error.to_string()))
}

/// A JSON Schema (draft 2020-12) for an object with exactly `properties`.
pub(crate) fn object_schema(title: &str, properties: Value, required: &[&str]) -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": title,
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    })
}

/// The schema of a `path` argument.
pub(crate) fn path_schema() -> Value {
    json!({
        "type": "string",
        "minLength": 1,
        "description": "a file path; relative paths resolve against the working directory",
    })
}

/// Maps a sandbox error to the tool error the saga engine understands.
pub(crate) fn sandbox_error(error: SandboxError) -> ToolError {
    let message = error.to_string();
    if error.is_denied() {
        ToolError::denied(message)
    } else if error.is_invalid_path() || error.is_invalid_url() {
        ToolError::invalid_args(message)
    } else if error.may_have_changed() {
        ToolError::uncertain(message)
    } else {
        ToolError::failed(message)
    }
}

/// Runs blocking file work on the blocking pool, so no runtime thread waits on the disk.
///
/// A panic on the blocking thread becomes [`ToolError::panicked`] (its effect is uncertain).
pub(crate) async fn blocking<T, F>(work: F) -> Result<T, ToolError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, ToolError> + Send + 'static,
{
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result,
        Err(error) if error.is_panic() => Err(ToolError::panicked(format!(
            "the blocking file task panicked: {error}"
        ))),
        Err(error) => Err(ToolError::uncertain(format!(
            "the blocking file task did not finish: {error}"
        ))),
    }
}

/// The file side shared by the file tools: the sandbox and the working directory that
/// relative paths resolve against.
#[derive(Debug, Clone)]
pub(crate) struct FileAccess {
    sandbox: Arc<FsSandbox>,
    cwd: PathBuf,
}

impl FileAccess {
    pub(crate) fn new(sandbox: Arc<FsSandbox>, cwd: PathBuf) -> FileAccess {
        FileAccess { sandbox, cwd }
    }

    /// Rules on `path` without touching the disk.
    pub(crate) fn resolve(&self, path: &str) -> Result<ConfinedPath, ToolError> {
        self.sandbox.resolve(path, &self.cwd).map_err(sandbox_error)
    }

    /// Rules on `path` and binds it to its root's handle.
    pub(crate) fn open(&self, path: &str) -> Result<ConfinedFile, ToolError> {
        self.sandbox
            .resolve_open(path, &self.cwd)
            .map_err(sandbox_error)
    }

    /// Checks that `len` bytes may be written to `path`.
    pub(crate) fn check_size(&self, path: &str, len: usize) -> Result<(), ToolError> {
        self.sandbox
            .check_size(path, len as u64)
            .map_err(sandbox_error)
    }
}

/// The temporary file name of a step: deterministic, so compensation after a crash knows
/// what to remove.
///
/// The saga id is reduced to letters, digits, `-` and `_` and shortened so the name stays a
/// plain name well under 255 bytes.
pub(crate) fn temp_name(ctx: &ToolContext) -> String {
    const SAGA_ID_MAX_CHARS: usize = 128;
    let saga: String = ctx
        .saga_id
        .as_str()
        .chars()
        .take(SAGA_ID_MAX_CHARS)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{TEMP_PREFIX}{saga}-{}{TEMP_SUFFIX}", ctx.step_seq)
}

/// Checks that an undo record names a temporary file of ours, so a damaged record cannot make
/// compensation remove a user's file.
pub(crate) fn check_temp_name(tool: &str, temp: &str) -> Result<(), ToolError> {
    if temp.starts_with(TEMP_PREFIX) && temp.ends_with(TEMP_SUFFIX) && !temp.contains('/') {
        Ok(())
    } else {
        Err(ToolError::failed(format!(
            "the undo record of {tool} names an unexpected temporary file `{temp}`"
        )))
    }
}

/// Parses an undo record's `data`.
pub(crate) fn parse_undo<T: DeserializeOwned>(tool: &str, data: &Value) -> Result<T, ToolError> {
    T::deserialize(data).map_err(|error| {
        ToolError::failed(format!("the undo record of {tool} is malformed: {error}"))
    })
}

/// Serializes an undo record's `data`.
pub(crate) fn undo_data<T: serde::Serialize>(tool: &str, data: &T) -> Result<Value, ToolError> {
    serde_json::to_value(data).map_err(|error| {
        ToolError::failed(format!("cannot record the undo data of {tool}: {error}"))
    })
}

/// "1 byte", "5 bytes".
pub(crate) fn byte_count(n: u64) -> String {
    if n == 1 {
        "1 byte".to_owned()
    } else {
        format!("{n} bytes")
    }
}
