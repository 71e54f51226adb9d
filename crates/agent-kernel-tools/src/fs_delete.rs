//! `fs.delete`: removes a file, keeping its bytes for compensation.

use std::path::PathBuf;
use std::sync::Arc;

use agent_kernel_api::{Compensate, Tool, ToolContext, ToolError, ToolOutput, ToolSpec, Undo};
use agent_kernel_sandbox::{ConfinedPath, FsSandbox};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::common::{
    FileAccess, TOOL_VERSION, blocking, byte_count, check_temp_name, object_schema, parse_args,
    parse_undo, path_resource, path_schema, sandbox_error, settle, step_blocking, temp_name,
    touched_by, undo_data,
};
use crate::fs_write::restore;

/// `fs.delete`: mutating; removes the file at `path`, which must exist unless `missing_ok`
/// (then an absent file is a success that deleted nothing: a compensation that deletes
/// what its step created, run again after a lost answer, is idempotent).
///
/// `prepare` keeps the file's bytes; compensation writes them back atomically if the file is
/// absent or different, and removes a temporary file a crash may have left behind.
#[derive(Debug, Clone)]
pub struct FsDelete {
    files: FileAccess,
}

/// The arguments of `fs.delete`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeleteArgs {
    path: String,
    #[serde(default)]
    missing_ok: bool,
}

/// `Undo.data` of `fs.delete`; the previous bytes are in `Undo.blob`, none when the file
/// was absent (`missing_ok`).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeleteUndo {
    target: ConfinedPath,
    temp: String,
    /// The file was absent when the step began (`missing_ok`), so there is no content to
    /// put back; left out of the record otherwise, as before the flag existed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    absent: bool,
    /// The file the step touched, its folders' links followed (`file_resource`'s path),
    /// for a compensation to refuse a path that now leads elsewhere; absent from records
    /// written before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    file: Option<String>,
}

impl FsDelete {
    /// The tool id.
    pub const ID: &'static str = "fs.delete";

    /// A tool confined by `sandbox`; relative paths resolve against `cwd`.
    pub fn new(sandbox: Arc<FsSandbox>, cwd: PathBuf) -> FsDelete {
        FsDelete {
            files: FileAccess::new(sandbox, cwd),
        }
    }
}

impl Tool for FsDelete {
    fn spec(&self) -> ToolSpec {
        ToolSpec::mutating(Self::ID)
            // Shown by `tools`; the claim is the file as the sandbox resolves it.
            .with_resources([path_resource()])
            .with_version(TOOL_VERSION)
            .with_description("Delete a file; undone by restoring it with its previous bytes.")
            .with_schema(object_schema(
                "fs.delete arguments",
                json!({
                    "path": path_schema(),
                    "missing_ok": {
                        "type": "boolean",
                        "description": "Succeed, deleting nothing, when the file does not exist (default false: an error)."
                    }
                }),
                &["path"],
            ))
    }

    fn check(&self, args: &Value) -> Result<(), ToolError> {
        let DeleteArgs { path, .. } = parse_args(args)?;
        self.files.resolve(&path).map(|_| ())
    }

    async fn resources(
        &self,
        _ctx: &ToolContext,
        args: &Value,
    ) -> Result<Option<Vec<String>>, ToolError> {
        let DeleteArgs { path, .. } = parse_args(args)?;
        self.files.resource(&path).await
    }

    async fn simulate(&self, _ctx: &ToolContext, args: &Value) -> Result<ToolOutput, ToolError> {
        let DeleteArgs { path, .. } = parse_args(args)?;
        Ok(ToolOutput::new(json!({ "path": path, "dry_run": true }))
            .with_effect(format!("would delete {path}")))
    }

    async fn execute(&self, ctx: &ToolContext, args: &Value) -> Result<ToolOutput, ToolError> {
        let DeleteArgs { path, missing_ok } = parse_args(args)?;
        let file = self.files.open(&path)?;
        let sync = ctx.durability.syncs();
        let count = step_blocking(ctx, move || {
            let Some(len) = file.stat().map_err(sandbox_error)? else {
                // Absent: as `prepare` found it (`missing_ok`), or removed since by another
                // writer between `prepare` and now. Either way this step deleted nothing,
                // and says so (`deleted: false`), so its compensation restores nothing.
                return Ok(None);
            };
            file.remove_file(sync).map_err(sandbox_error)?;
            Ok(Some(len))
        })
        .await?;
        Ok(match count {
            Some(count) => {
                ToolOutput::new(json!({ "path": path, "bytes": count, "deleted": true }))
                    .with_effect(format!("deleted {path} ({})", byte_count(count)))
            }
            None if missing_ok => {
                ToolOutput::new(json!({ "path": path, "bytes": 0, "deleted": false }))
                    .with_effect(format!("{path} was absent; nothing deleted"))
            }
            None => {
                return Err(ToolError::failed(format!(
                    "`{path}` does not exist, so there is nothing to delete"
                )));
            }
        })
    }
}

/// Whether the step's answer says it deleted nothing (`missing_ok` and no file when it
/// ran). Without an answer (its outcome unknown) it may have deleted the file `prepare` read.
fn deleted_nothing(output: Option<&ToolOutput>) -> bool {
    output.is_some_and(|output| output.data["deleted"] == false)
}

impl Compensate for FsDelete {
    fn restores(&self, _args: &Value, undo: &Undo, output: Option<&ToolOutput>) -> Option<String> {
        let DeleteUndo { target, absent, .. } = parse_undo(Self::ID, &undo.data).ok()?;
        if absent || deleted_nothing(output) {
            return None;
        }
        let bytes = undo.blob.as_ref()?;
        Some(format!(
            "puts `{target}` back with its {}",
            byte_count(bytes.len() as u64)
        ))
    }

    async fn prepare(&self, ctx: &ToolContext, args: &Value) -> Result<Undo, ToolError> {
        let DeleteArgs { path, missing_ok } = parse_args(args)?;
        let file = self.files.open(&path)?;
        let shown = path.clone();
        let ((target, touched), bytes) = blocking(move || {
            let at = (file.path().clone(), touched_by(&file)?);
            if file.stat().map_err(sandbox_error)?.is_none() {
                if missing_ok {
                    return Ok((at, None));
                }
                return Err(ToolError::failed(format!(
                    "`{shown}` does not exist, so there is nothing to delete"
                )));
            }
            let bytes = file.read_all().map_err(sandbox_error)?;
            Ok((at, Some(bytes)))
        })
        .await?;
        let data = DeleteUndo {
            target,
            temp: temp_name(ctx),
            absent: bytes.is_none(),
            file: Some(touched),
        };
        Ok(Undo {
            data: undo_data(Self::ID, &data)?,
            blob: bytes,
        })
    }

    async fn changed_since(
        &self,
        ctx: &ToolContext,
        _args: &Value,
        undo: &Undo,
        output: Option<&ToolOutput>,
    ) -> Result<Option<String>, ToolError> {
        // A timed-out effect still under way lands first: judged half-done, it would
        // look like another writer's change.
        settle(ctx).await;
        let DeleteUndo {
            file: touched,
            target,
            absent,
            ..
        } = parse_undo(Self::ID, &undo.data)?;
        if absent || deleted_nothing(output) {
            // The step deleted nothing, so undoing it changes nothing, whatever is there now.
            return Ok(None);
        }
        let deleted = undo.blob.clone();
        let file = self
            .files
            .reconfine_touched(&target, touched.as_deref())
            .await?;
        blocking(move || {
            if file.stat().map_err(sandbox_error)?.is_none()
                || crate::fs_write::holds_exactly(&file, deleted.as_deref())?
            {
                // Still deleted; or restored already (a rollback killed before its outcome
                // was recorded), or never deleted: compensating changes nothing.
                return Ok(None);
            }
            Ok(Some(format!(
                "`{}` exists again since the step deleted it, with other bytes: another writer created it",
                file.path()
            )))
        })
        .await
    }

    /// The file must be as `prepare` found it: still absent, or holding exactly the bytes
    /// it kept. Already gone, another writer deleted it, and compensating would bring back
    /// what that writer removed.
    async fn changed_since_prepared(
        &self,
        _ctx: &ToolContext,
        _args: &Value,
        undo: &Undo,
    ) -> Result<Option<String>, ToolError> {
        let DeleteUndo {
            file: touched,
            target,
            absent,
            ..
        } = parse_undo(Self::ID, &undo.data)?;
        let prepared = match (absent, &undo.blob) {
            (true, _) => None,
            (false, Some(bytes)) => Some(bytes.clone()),
            (false, None) => {
                return Err(ToolError::failed(format!(
                    "the undo record of {} for `{target}` lacks the file's bytes",
                    Self::ID
                )));
            }
        };
        let file = self
            .files
            .reconfine_touched(&target, touched.as_deref())
            .await?;
        blocking(move || crate::fs_write::as_prepared(&file, prepared.as_deref())).await
    }

    async fn compensate(
        &self,
        ctx: &ToolContext,
        _args: &Value,
        undo: &Undo,
        output: Option<&ToolOutput>,
    ) -> Result<(), ToolError> {
        let DeleteUndo {
            file: touched,
            target,
            temp,
            absent,
        } = parse_undo(Self::ID, &undo.data)?;
        check_temp_name(Self::ID, &temp)?;
        if absent || deleted_nothing(output) {
            // The file was absent when the step began (`missing_ok`), or when it ran (another
            // writer removed it after `prepare`): the step deleted nothing, and leaves
            // nothing to put back.
            return Ok(());
        }
        let Some(bytes) = undo.blob.clone() else {
            return Err(ToolError::failed(format!(
                "the undo record of {} for `{target}` lacks the deleted content",
                Self::ID
            )));
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
            restore(&file, &bytes, &temp, sync)
        })
        .await
    }
}
