//! `fs.write`: replaces a file's content atomically.

use std::path::PathBuf;
use std::sync::Arc;

use agent_kernel_api::{Compensate, Tool, ToolContext, ToolError, ToolOutput, ToolSpec, Undo};
use agent_kernel_sandbox::{ConfinedPath, FsSandbox, MAX_IO_BYTES_LIMIT};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::common::{
    FileAccess, TOOL_VERSION, blocking, byte_count, check_temp_name, object_schema, parse_args,
    parse_undo, path_resource, path_schema, sandbox_error, settle, step_blocking, temp_name,
    touched_by, undo_data,
};

/// `fs.write`: mutating; writes `content` to `path` atomically (temporary file, then rename),
/// creating the file if absent but never its folder.
///
/// Compensation restores the exact previous bytes, or removes the file if it did not exist,
/// and removes a temporary file a crash may have left behind.
#[derive(Debug, Clone)]
pub struct FsWrite {
    pub(crate) files: FileAccess,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ContentArgs {
    pub(crate) path: String,
    pub(crate) content: String,
}

/// `Undo.data` of `fs.write`; the previous bytes are in `Undo.blob` when `existed`.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WriteUndo {
    target: ConfinedPath,
    existed: bool,
    temp: String,
    /// The file the step touched, its folders' links followed (`file_resource`'s path),
    /// for a compensation to refuse a path that now leads elsewhere; absent from records
    /// written before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    file: Option<String>,
}

impl FsWrite {
    /// The tool id.
    pub const ID: &'static str = "fs.write";

    /// A tool confined by `sandbox`; relative paths resolve against `cwd`.
    pub fn new(sandbox: Arc<FsSandbox>, cwd: PathBuf) -> FsWrite {
        FsWrite {
            files: FileAccess::new(sandbox, cwd),
        }
    }
}

/// The schema of `fs.write` and `fs.append`.
/// The check of a tool taking `{path, content}`: the path ruled on by the policy, and the
/// content within its size bound. Touches nothing.
pub(crate) fn check_content(files: &FileAccess, args: &Value) -> Result<(), ToolError> {
    let ContentArgs { path, content } = parse_args(args)?;
    files.resolve(&path)?;
    files.check_size(&path, content.len())
}

/// The resource of a tool taking `{path, content}`: the file, as the sandbox resolves it.
pub(crate) async fn content_resource(
    files: &FileAccess,
    args: &Value,
) -> Result<Option<Vec<String>>, ToolError> {
    let ContentArgs { path, .. } = parse_args(args)?;
    files.resource(&path).await
}

/// What a dry run of a tool taking `{path, content}` that would `verb` it reports.
pub(crate) fn simulated_content(args: &Value, verb: &str) -> Result<ToolOutput, ToolError> {
    let ContentArgs { path, content } = parse_args(args)?;
    let count = content.len() as u64;
    Ok(
        ToolOutput::new(json!({ "path": path, "bytes": count, "dry_run": true }))
            .with_effect(format!("would {verb} {} to {path}", byte_count(count))),
    )
}

pub(crate) fn content_schema(title: &str) -> Value {
    object_schema(
        title,
        json!({
            "path": path_schema(),
            "content": {
                "type": "string",
                "description": "the text to write, at most the policy's max_io_bytes in UTF-8",
            },
        }),
        &["path", "content"],
    )
}

impl Tool for FsWrite {
    fn spec(&self) -> ToolSpec {
        ToolSpec::mutating(Self::ID)
            // Shown by `tools`; the claim is the file as the sandbox resolves it.
            .with_resources([path_resource()])
            .with_version(TOOL_VERSION)
            .with_idempotent(true)
            .with_description("Write a file's whole content atomically; undone by restoring its exact previous bytes (or removing it if it was new).")
            .with_schema(content_schema("fs.write arguments"))
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
        simulated_content(args, "write")
    }

    async fn execute(&self, ctx: &ToolContext, args: &Value) -> Result<ToolOutput, ToolError> {
        let ContentArgs { path, content } = parse_args(args)?;
        let file = self.files.open(&path)?;
        let temp = temp_name(ctx);
        let sync = ctx.durability.syncs();
        let count = content.len() as u64;
        step_blocking(ctx, move || {
            file.write_atomic(content.as_bytes(), &temp, sync)
                .map_err(sandbox_error)
        })
        .await?;
        Ok(ToolOutput::new(json!({ "path": path, "bytes": count }))
            .with_effect(format!("wrote {} to {path}", byte_count(count))))
    }
}

impl Compensate for FsWrite {
    fn restores(&self, _args: &Value, undo: &Undo, _output: Option<&ToolOutput>) -> Option<String> {
        let WriteUndo {
            target, existed, ..
        } = parse_undo(Self::ID, &undo.data).ok()?;
        Some(match (existed, &undo.blob) {
            (true, Some(bytes)) => format!(
                "puts back the previous {} of `{target}`",
                byte_count(bytes.len() as u64)
            ),
            (true, None) => return None,
            (false, _) => format!("removes `{target}`, which the step created"),
        })
    }

    async fn prepare(&self, ctx: &ToolContext, args: &Value) -> Result<Undo, ToolError> {
        self.check(args)?;
        let ContentArgs { path, .. } = parse_args(args)?;
        let file = self.files.open(&path)?;
        let temp = temp_name(ctx);
        let (target, previous) = blocking(move || {
            let previous = match file.stat().map_err(sandbox_error)? {
                Some(_) => Some(file.read_all().map_err(sandbox_error)?),
                None => None,
            };
            Ok(((file.path().clone(), touched_by(&file)?), previous))
        })
        .await?;
        let (target, touched) = target;
        let data = WriteUndo {
            target,
            existed: previous.is_some(),
            temp,
            file: Some(touched),
        };
        Ok(Undo {
            data: undo_data(Self::ID, &data)?,
            blob: previous,
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
        let WriteUndo {
            file: touched,
            target,
            existed,
            ..
        } = parse_undo(Self::ID, &undo.data)?;
        let previous = existed.then(|| undo.blob.clone().unwrap_or_default());
        let file = self
            .files
            .reconfine_touched(&target, touched.as_deref())
            .await?;
        blocking(move || {
            let change = left_as(&file, 0, content.as_bytes())?;
            if change.is_some() && holds_exactly(&file, previous.as_deref())? {
                // Compensated already (a rollback killed before its outcome was
                // recorded), or the write never happened: compensating changes nothing.
                return Ok(None);
            }
            Ok(change)
        })
        .await
    }

    /// The file must hold exactly what `prepare` kept (or still be absent): already holding
    /// the step's bytes, it holds another writer's.
    async fn changed_since_prepared(
        &self,
        _ctx: &ToolContext,
        _args: &Value,
        undo: &Undo,
    ) -> Result<Option<String>, ToolError> {
        let WriteUndo {
            file: touched,
            target,
            existed,
            ..
        } = parse_undo(Self::ID, &undo.data)?;
        let previous = existed.then(|| undo.blob.clone().unwrap_or_default());
        let file = self
            .files
            .reconfine_touched(&target, touched.as_deref())
            .await?;
        blocking(move || as_prepared(&file, previous.as_deref())).await
    }

    async fn compensate(
        &self,
        ctx: &ToolContext,
        _args: &Value,
        undo: &Undo,
        _output: Option<&ToolOutput>,
    ) -> Result<(), ToolError> {
        let WriteUndo {
            file: touched,
            target,
            existed,
            temp,
        } = parse_undo(Self::ID, &undo.data)?;
        check_temp_name(Self::ID, &temp)?;
        let previous = match (existed, &undo.blob) {
            (true, Some(bytes)) => Some(bytes.clone()),
            (true, None) => {
                return Err(ToolError::failed(format!(
                    "the undo record of {} for `{target}` lacks the previous content",
                    Self::ID
                )));
            }
            (false, _) => None,
        };
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
            file.remove_temp(&temp, sync).map_err(sandbox_error)?;
            match previous {
                Some(bytes) => restore(&file, &bytes, &temp, sync),
                None => file
                    .remove_file_if_exists(sync)
                    .map(|_| ())
                    .map_err(sandbox_error),
            }
        })
        .await
    }
}

/// Whether the file still holds what a step left: `prefix_len` bytes from before, then
/// exactly `written`; `Some` says how it differs now.
pub(crate) fn left_as(
    file: &agent_kernel_sandbox::ConfinedFile,
    prefix_len: u64,
    written: &[u8],
) -> Result<Option<String>, ToolError> {
    let path = file.path().clone();
    let expected_len = prefix_len + written.len() as u64;
    match file.stat().map_err(sandbox_error)? {
        None => Ok(Some(format!(
            "`{path}` was removed since the step wrote it"
        ))),
        Some(len) if len != expected_len => Ok(Some(format!(
            "`{path}` holds {} now where the step left {}: another writer changed it",
            byte_count(len),
            byte_count(expected_len)
        ))),
        Some(_) => {
            let bytes = file.read(MAX_IO_BYTES_LIMIT).map_err(sandbox_error)?;
            let offset = usize::try_from(prefix_len).unwrap_or(usize::MAX);
            Ok((bytes.get(offset..) != Some(written)).then(|| {
                format!(
                    "`{path}` no longer holds the bytes the step wrote: another writer changed it"
                )
            }))
        }
    }
}

/// Why `file` no longer holds exactly `prepared` (`None`: absent), if it does not.
pub(crate) fn as_prepared(
    file: &agent_kernel_sandbox::ConfinedFile,
    prepared: Option<&[u8]>,
) -> Result<Option<String>, ToolError> {
    if holds_exactly(file, prepared)? {
        return Ok(None);
    }
    let path = file.path();
    Ok(Some(match prepared {
        None => format!("`{path}` exists now, where the step's preparation found none"),
        Some(bytes) => format!(
            "`{path}` no longer holds the {} the step's preparation found",
            byte_count(bytes.len() as u64)
        ),
    }))
}

/// Whether the file holds exactly `bytes`, or is absent when `bytes` is `None`: what a
/// compensation restores.
pub(crate) fn holds_exactly(
    file: &agent_kernel_sandbox::ConfinedFile,
    bytes: Option<&[u8]>,
) -> Result<bool, ToolError> {
    match (file.stat().map_err(sandbox_error)?, bytes) {
        (None, None) => Ok(true),
        (Some(len), Some(bytes)) if len == bytes.len() as u64 => {
            Ok(file.read(MAX_IO_BYTES_LIMIT).map_err(sandbox_error)? == bytes)
        }
        _ => Ok(false),
    }
}

/// Puts `bytes` back atomically unless the file already holds exactly them.
pub(crate) fn restore(
    file: &agent_kernel_sandbox::ConfinedFile,
    bytes: &[u8],
    temp: &str,
    sync: bool,
) -> Result<(), ToolError> {
    let unchanged = match file.stat().map_err(sandbox_error)? {
        Some(len) if len == bytes.len() as u64 => {
            file.read(MAX_IO_BYTES_LIMIT).map_err(sandbox_error)? == bytes
        }
        _ => false,
    };
    if unchanged {
        return Ok(());
    }
    file.write_atomic(bytes, temp, sync).map_err(sandbox_error)
}
