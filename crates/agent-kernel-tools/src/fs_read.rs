//! `fs.read`: reads a UTF-8 text file inside the sandbox.

use std::path::PathBuf;
use std::sync::Arc;

use agent_kernel_api::{Tool, ToolContext, ToolError, ToolOutput, ToolSpec};
use agent_kernel_sandbox::FsSandbox;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::common::{
    FileAccess, TOOL_VERSION, blocking, byte_count, object_schema, parse_args, path_schema,
    sandbox_error,
};

/// `fs.read`: read-only; returns `{"path": <arg>, "bytes": n, "content": "<text>"}`.
///
/// The file must be UTF-8 text no larger than the policy's `max_io_bytes`; anything else is a
/// definite failure.
#[derive(Debug, Clone)]
pub struct FsRead {
    files: FileAccess,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PathArgs {
    pub(crate) path: String,
}

impl FsRead {
    /// The tool id.
    pub const ID: &'static str = "fs.read";

    /// A tool confined by `sandbox`; relative paths resolve against `cwd`.
    pub fn new(sandbox: Arc<FsSandbox>, cwd: PathBuf) -> FsRead {
        FsRead {
            files: FileAccess::new(sandbox, cwd),
        }
    }
}

impl Tool for FsRead {
    fn spec(&self) -> ToolSpec {
        ToolSpec::read_only(Self::ID)
            .with_version(TOOL_VERSION)
            .with_description("Read a file inside the sandbox's roots.")
            .with_schema(object_schema(
                "fs.read arguments",
                json!({ "path": path_schema() }),
                &["path"],
            ))
    }

    fn check(&self, args: &Value) -> Result<(), ToolError> {
        let PathArgs { path } = parse_args(args)?;
        self.files.resolve(&path).map(|_| ())
    }

    async fn execute(&self, _ctx: &ToolContext, args: &Value) -> Result<ToolOutput, ToolError> {
        let PathArgs { path } = parse_args(args)?;
        let file = self.files.open(&path)?;
        let bytes = blocking(move || file.read_all().map_err(sandbox_error)).await?;
        let count = bytes.len() as u64;
        let content = String::from_utf8(bytes).map_err(|error| {
            ToolError::failed(format!(
                "`{path}` is not UTF-8 text (invalid byte at offset {})",
                error.utf8_error().valid_up_to()
            ))
        })?;
        Ok(
            ToolOutput::new(json!({ "path": path, "bytes": count, "content": content }))
                .with_effect(format!("read {} from {path}", byte_count(count))),
        )
    }
}
