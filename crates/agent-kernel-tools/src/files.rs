//! The kernel's file access for every tool ([`Files`]): the same sandbox and folder as the
//! built-in file tools, so a tool of the program's own is confined exactly as `fs.write` is.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use agent_kernel_api::{BoxFuture, Files, ToolContext, ToolError};
use agent_kernel_sandbox::{FsSandbox, SandboxError};

use crate::common::{FileAccess, TEMP_PREFIX, TEMP_SUFFIX, sandbox_error, settle, step_blocking};

/// [`Files`] over a sandbox: each path resolved against the folder and ruled on by the
/// policy, the I/O done on a blocking thread and counted as its step's work, once any of
/// that step's work still under way has ended (so a compensation never acts before a late
/// effect of its own step lands).
#[derive(Debug, Clone)]
pub struct SandboxFiles {
    access: FileAccess,
}

impl SandboxFiles {
    /// File access through `sandbox`, relative paths resolved against `folder`.
    pub fn new(sandbox: Arc<FsSandbox>, folder: PathBuf) -> Self {
        Self {
            access: FileAccess::new(sandbox, folder),
        }
    }
}

/// The temporary name of one write through [`SandboxFiles`]: this process and a counter, so
/// no two writes share one. A write cut short by a crash leaves it beside its target
/// (recovery removes the built-in tools' temporary files only).
fn temp_name() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{TEMP_PREFIX}files-{}-{n}{TEMP_SUFFIX}", std::process::id())
}

impl Files for SandboxFiles {
    fn folder(&self) -> &Path {
        self.access.cwd()
    }

    fn read<'a>(
        &'a self,
        ctx: &'a ToolContext,
        path: &'a str,
    ) -> BoxFuture<'a, Result<Option<Vec<u8>>, ToolError>> {
        Box::pin(async move {
            let file = self.access.open(path)?;
            settle(ctx).await;
            step_blocking(ctx, move || match file.read_all() {
                Ok(bytes) => Ok(Some(bytes)),
                Err(SandboxError::NotFound { .. }) => Ok(None),
                Err(error) => Err(sandbox_error(error)),
            })
            .await
        })
    }

    fn write<'a>(
        &'a self,
        ctx: &'a ToolContext,
        path: &'a str,
        bytes: Vec<u8>,
    ) -> BoxFuture<'a, Result<(), ToolError>> {
        Box::pin(async move {
            self.access.check_size(path, bytes.len())?;
            let file = self.access.open(path)?;
            let sync = ctx.durability.syncs();
            settle(ctx).await;
            step_blocking(ctx, move || {
                file.write_atomic(&bytes, &temp_name(), sync)
                    .map_err(sandbox_error)
            })
            .await
        })
    }

    fn remove<'a>(
        &'a self,
        ctx: &'a ToolContext,
        path: &'a str,
    ) -> BoxFuture<'a, Result<bool, ToolError>> {
        Box::pin(async move {
            let file = self.access.open(path)?;
            let sync = ctx.durability.syncs();
            settle(ctx).await;
            step_blocking(ctx, move || {
                file.remove_file_if_exists(sync).map_err(sandbox_error)
            })
            .await
        })
    }
}
