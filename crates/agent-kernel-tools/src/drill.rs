//! `fault.probed_write` and `fault.opaque_write`: drill tools for the two settlement classes
//! no other built-in tool has.
//!
//! Both write a file exactly as `fs.write` does (and compensate a committed write the same
//! way), optionally pausing before or after the effect so that a drill can kill the process
//! while the outcome is unknown. They differ only in how such an unknown outcome is settled:
//! `fault.probed_write` declares [`Settlement::Probe`] and tells, by reading the file, whether
//! its write happened; `fault.opaque_write` declares [`Settlement::Operator`], so the saga
//! stops for an operator.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agent_kernel_api::{
    Compensate, Probe, ProbeOutcome, Settlement, Tool, ToolContext, ToolError, ToolOutput,
    ToolSpec, Undo,
};
use agent_kernel_sandbox::{ConfinedPath, FsSandbox};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::FsWrite;
use crate::common::{
    TOOL_VERSION, blocking, object_schema, parse_args, path_schema, sandbox_error, settle,
};

/// Longest pause before or after the effect, in milliseconds.
pub const DRILL_PAUSE_MS_MAX: u64 = 60_000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DrillArgs {
    path: String,
    content: String,
    #[serde(default)]
    pause_before_ms: u64,
    #[serde(default)]
    pause_after_ms: u64,
}

/// A write drill: `fs.write` with pauses, under another id and settlement class.
#[derive(Debug, Clone)]
pub struct DrillWrite {
    id: &'static str,
    settlement: Settlement,
    write: FsWrite,
}

impl DrillWrite {
    /// `fault.probed_write`: settled by probing the file.
    pub const PROBED_ID: &'static str = "fault.probed_write";
    /// `fault.opaque_write`: settled by an operator.
    pub const OPAQUE_ID: &'static str = "fault.opaque_write";

    /// The probed drill, confined by `sandbox`; relative paths resolve against `cwd`.
    pub fn probed(sandbox: Arc<FsSandbox>, cwd: PathBuf) -> DrillWrite {
        DrillWrite {
            id: Self::PROBED_ID,
            settlement: Settlement::Probe,
            write: FsWrite::new(sandbox, cwd),
        }
    }

    /// The opaque drill, confined by `sandbox`; relative paths resolve against `cwd`.
    pub fn opaque(sandbox: Arc<FsSandbox>, cwd: PathBuf) -> DrillWrite {
        DrillWrite {
            id: Self::OPAQUE_ID,
            settlement: Settlement::Operator,
            write: FsWrite::new(sandbox, cwd),
        }
    }

    fn parse(args: &Value) -> Result<(DrillArgs, Value), ToolError> {
        let parsed: DrillArgs = parse_args(args)?;
        for (name, pause_ms) in [
            ("pause_before_ms", parsed.pause_before_ms),
            ("pause_after_ms", parsed.pause_after_ms),
        ] {
            if pause_ms > DRILL_PAUSE_MS_MAX {
                return Err(ToolError::invalid_args(format!(
                    "`{name}` is {pause_ms}, more than the maximum of {DRILL_PAUSE_MS_MAX}"
                )));
            }
        }
        let write_args = json!({ "path": parsed.path, "content": parsed.content });
        Ok((parsed, write_args))
    }
}

impl Tool for DrillWrite {
    fn spec(&self) -> ToolSpec {
        let pause = json!({ "type": "integer", "minimum": 0, "maximum": DRILL_PAUSE_MS_MAX });
        ToolSpec::mutating(self.id)
            .with_version(TOOL_VERSION)
            .with_settlement(self.settlement)
            .with_schema(object_schema(
                &format!("{} arguments", self.id),
                json!({
                    "path": path_schema(),
                    "content": { "type": "string" },
                    "pause_before_ms": pause,
                    "pause_after_ms": pause,
                }),
                &["path", "content"],
            ))
    }

    fn check(&self, args: &Value) -> Result<(), ToolError> {
        let (_, write_args) = Self::parse(args)?;
        Tool::check(&self.write, &write_args)
    }

    async fn execute(&self, ctx: &ToolContext, args: &Value) -> Result<ToolOutput, ToolError> {
        let (parsed, write_args) = Self::parse(args)?;
        tokio::time::sleep(Duration::from_millis(parsed.pause_before_ms)).await;
        let output = self.write.execute(ctx, &write_args).await?;
        tokio::time::sleep(Duration::from_millis(parsed.pause_after_ms)).await;
        Ok(output)
    }
}

impl Compensate for DrillWrite {
    async fn prepare(&self, ctx: &ToolContext, args: &Value) -> Result<Undo, ToolError> {
        let (_, write_args) = Self::parse(args)?;
        self.write.prepare(ctx, &write_args).await
    }

    async fn compensate(
        &self,
        ctx: &ToolContext,
        args: &Value,
        undo: &Undo,
        output: Option<&ToolOutput>,
    ) -> Result<(), ToolError> {
        let (_, write_args) = Self::parse(args)?;
        self.write.compensate(ctx, &write_args, undo, output).await
    }
}

impl Probe for DrillWrite {
    async fn probe(
        &self,
        ctx: &ToolContext,
        args: &Value,
        undo: &Undo,
    ) -> Result<ProbeOutcome, ToolError> {
        // A write that timed out but is still under way lands before the file is looked at.
        settle(ctx).await;
        let (parsed, _) = Self::parse(args)?;
        let target: ConfinedPath = serde_json::from_value(undo.data["target"].clone())
            .map_err(|err| ToolError::failed(format!("the undo record lacks its target: {err}")))?;
        let existed = undo.data["existed"].as_bool().unwrap_or(false);
        let previous = undo.blob.clone();
        let wanted = parsed.content.into_bytes();
        // Looked at through the policy in force, like every compensation.
        let touched = undo.data["file"].as_str();
        let file = self.write.files.reconfine_touched(&target, touched).await?;
        blocking(move || {
            let current = match file.stat().map_err(sandbox_error)? {
                None => None,
                Some(_) => Some(file.read_all().map_err(sandbox_error)?),
            };
            Ok(match current {
                Some(bytes) if bytes == wanted => ProbeOutcome::Happened(None),
                Some(bytes) if existed && previous.as_deref() == Some(bytes.as_slice()) => {
                    ProbeOutcome::NotHappened
                }
                None if !existed => ProbeOutcome::NotHappened,
                // Neither the old nor the new content: someone else changed the file.
                _ => ProbeOutcome::Unknown,
            })
        })
        .await
    }
}
