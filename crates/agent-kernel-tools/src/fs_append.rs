//! `fs.append`: appends to a file.

use std::path::PathBuf;
use std::sync::Arc;

use agent_kernel_api::{Compensate, Tool, ToolContext, ToolError, ToolOutput, ToolSpec, Undo};
use agent_kernel_sandbox::{ConfinedPath, FsSandbox};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::common::{
    FileAccess, TOOL_VERSION, blocking, byte_count, parse_args, parse_undo, path_resource,
    sandbox_error, settle, step_blocking, touched_by, undo_data,
};
use crate::fs_write::{
    ContentArgs, check_content, content_resource, content_schema, simulated_content,
};

/// `fs.append`: mutating; appends `content` to `path`, creating the file if absent but never
/// its folder.
///
/// Compensation truncates the file back to its previous length, or removes it if it did not
/// exist; it fails (rather than guess) when the file is now shorter than before.
#[derive(Debug, Clone)]
pub struct FsAppend {
    files: FileAccess,
}

/// `Undo.data` of `fs.append`.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct AppendUndo {
    target: ConfinedPath,
    existed: bool,
    len: u64,
    /// The file the step touched, its folders' links followed (`file_resource`'s path),
    /// for a compensation to refuse a path that now leads elsewhere; absent from records
    /// written before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    file: Option<String>,
}

impl FsAppend {
    /// The tool id.
    pub const ID: &'static str = "fs.append";

    /// A tool confined by `sandbox`; relative paths resolve against `cwd`.
    pub fn new(sandbox: Arc<FsSandbox>, cwd: PathBuf) -> FsAppend {
        FsAppend {
            files: FileAccess::new(sandbox, cwd),
        }
    }
}

impl Tool for FsAppend {
    fn spec(&self) -> ToolSpec {
        ToolSpec::mutating(Self::ID)
            // Shown by `tools`; the claim is the file as the sandbox resolves it.
            .with_resources([path_resource()])
            .with_version(TOOL_VERSION)
            .with_description("Append to a file; undone by truncating it back to its previous length (or removing it if it was new).")
            .with_schema(content_schema("fs.append arguments"))
    }

    fn check(&self, args: &Value) -> Result<(), ToolError> {
        check_content(&self.files, args)
    }

    async fn resources(
        &self,
        _ctx: &ToolContext,
        args: &Value,
    ) -> Result<Option<Vec<String>>, ToolError> {
        content_resource(&self.files, args).await
    }

    async fn simulate(&self, _ctx: &ToolContext, args: &Value) -> Result<ToolOutput, ToolError> {
        simulated_content(args, "append")
    }

    async fn execute(&self, ctx: &ToolContext, args: &Value) -> Result<ToolOutput, ToolError> {
        let ContentArgs { path, content } = parse_args(args)?;
        let file = self.files.open(&path)?;
        let sync = ctx.durability.syncs();
        let count = content.len() as u64;
        let len = step_blocking(ctx, move || {
            file.append(content.as_bytes(), sync).map_err(sandbox_error)
        })
        .await?;
        Ok(
            ToolOutput::new(json!({ "path": path, "bytes": count, "len": len }))
                .with_effect(format!("appended {} to {path}", byte_count(count))),
        )
    }
}

impl Compensate for FsAppend {
    fn restores(&self, _args: &Value, undo: &Undo, _output: Option<&ToolOutput>) -> Option<String> {
        let AppendUndo {
            target,
            existed,
            len,
            ..
        } = parse_undo(Self::ID, &undo.data).ok()?;
        Some(if existed {
            format!("cuts `{target}` back to its previous {}", byte_count(len))
        } else {
            format!("removes `{target}`, which the step created")
        })
    }

    async fn prepare(&self, _ctx: &ToolContext, args: &Value) -> Result<Undo, ToolError> {
        self.check(args)?;
        let ContentArgs { path, .. } = parse_args(args)?;
        let file = self.files.open(&path)?;
        let (target, len) = blocking(move || {
            let len = file.stat().map_err(sandbox_error)?;
            Ok(((file.path().clone(), touched_by(&file)?), len))
        })
        .await?;
        let (target, touched) = target;
        let data = AppendUndo {
            target,
            existed: len.is_some(),
            len: len.unwrap_or(0),
            file: Some(touched),
        };
        Ok(Undo {
            data: undo_data(Self::ID, &data)?,
            blob: None,
        })
    }

    async fn changed_since(
        &self,
        ctx: &ToolContext,
        args: &Value,
        undo: &Undo,
        _output: Option<&ToolOutput>,
    ) -> Result<Option<String>, ToolError> {
        // A timed-out effect still under way lands first: judged half-done, it would
        // look like another writer's change.
        settle(ctx).await;
        let ContentArgs { content, .. } = parse_args(args)?;
        let AppendUndo {
            file: touched,
            target,
            existed,
            len,
        } = parse_undo(Self::ID, &undo.data)?;
        let file = self
            .files
            .reconfine_touched(&target, touched.as_deref())
            .await?;
        blocking(move || {
            let change = crate::fs_write::left_as(&file, len, content.as_bytes())?;
            // Compensated already (a rollback killed before its outcome was recorded), or
            // the append never happened: the file is as compensating leaves it.
            let restored = match file.stat().map_err(sandbox_error)? {
                None => !existed,
                Some(now) => existed && now == len,
            };
            Ok(change.filter(|_| !restored))
        })
        .await
    }

    /// The file must be as `prepare` found it: absent, or of the length it kept. Already
    /// grown by the step's bytes, it holds another writer's append.
    async fn changed_since_prepared(
        &self,
        _ctx: &ToolContext,
        _args: &Value,
        undo: &Undo,
    ) -> Result<Option<String>, ToolError> {
        let AppendUndo {
            file: touched,
            target,
            existed,
            len,
        } = parse_undo(Self::ID, &undo.data)?;
        let file = self
            .files
            .reconfine_touched(&target, touched.as_deref())
            .await?;
        blocking(move || {
            let path = file.path().clone();
            Ok(match (file.stat().map_err(sandbox_error)?, existed) {
                (None, false) => None,
                (Some(now), true) if now == len => None,
                (None, true) => Some(format!(
                    "`{path}` was removed since the step's preparation found it"
                )),
                (Some(_), false) => Some(format!(
                    "`{path}` exists now, where the step's preparation found none"
                )),
                (Some(now), true) => Some(format!(
                    "`{path}` holds {} now, where the step's preparation found {}",
                    crate::common::byte_count(now),
                    crate::common::byte_count(len)
                )),
            })
        })
        .await
    }

    async fn compensate(
        &self,
        ctx: &ToolContext,
        _args: &Value,
        undo: &Undo,
        _output: Option<&ToolOutput>,
    ) -> Result<(), ToolError> {
        let AppendUndo {
            file: touched,
            target,
            existed,
            len,
        } = parse_undo(Self::ID, &undo.data)?;
        let sync = ctx.durability.syncs();
        // An effect that timed out but is still under way lands first, then is undone.
        settle(ctx).await;
        // The recorded target is ruled on again by the policy in force, through its
        // handles: the log is data, so a record pointing outside today's roots undoes nothing.
        let file = self
            .files
            .reconfine_touched(&target, touched.as_deref())
            .await?;
        step_blocking(ctx, move || {
            if existed {
                // Fails if the file is gone or shorter than before: someone else changed it.
                file.truncate(len, sync).map_err(sandbox_error)
            } else {
                file.remove_file_if_exists(sync)
                    .map(|_| ())
                    .map_err(sandbox_error)
            }
        })
        .await
    }
}
