//! The kernel's file access for every tool ([`Files`]): the same sandbox and folder as the
//! built-in file tools, so a tool of the program's own is confined exactly as `fs.write` is.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, PoisonError};

use agent_kernel_api::{BoxFuture, Files, SagaId, ToolContext, ToolError};
use agent_kernel_sandbox::{ConfinedFile, FsSandbox, SandboxError};

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

impl SandboxFiles {
    /// The temporary name a write through the context of step `step_seq` of saga `saga_id`
    /// gives its file `file_name` on its way in, beside it: the same every time, so that a
    /// write cut short by a crash leaves a name the step's compensation finds. Before each
    /// write or removal of a file through the context, that name is removed if present.
    pub fn temp_name(saga_id: &SagaId, step_seq: u32, file_name: &str) -> String {
        // FNV-1a of the file's name: two files of one step never share a temporary name.
        let hash = file_name
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
                (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
            });
        let saga = crate::common::saga_for_name(saga_id);
        format!("{TEMP_PREFIX}files-{saga}-{step_seq}-{hash:016x}{TEMP_SUFFIX}")
    }
}

/// The temporary names of this process's writes and removals under way: a second write of
/// one file in one step waits for the first, so that neither clears the other's temporary
/// file. Held on the blocking thread that does the I/O, never on the runtime's.
struct TempInUse(String);

static TEMPS_IN_USE: (Mutex<BTreeSet<String>>, Condvar) =
    (Mutex::new(BTreeSet::new()), Condvar::new());

impl TempInUse {
    fn claim(name: &str) -> TempInUse {
        let (names, freed) = &TEMPS_IN_USE;
        let mut names = names.lock().unwrap_or_else(PoisonError::into_inner);
        while names.contains(name) {
            names = freed.wait(names).unwrap_or_else(PoisonError::into_inner);
        }
        names.insert(name.to_owned());
        TempInUse(name.to_owned())
    }
}

impl Drop for TempInUse {
    fn drop(&mut self) {
        let (names, freed) = &TEMPS_IN_USE;
        names
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.0);
        freed.notify_all();
    }
}

/// Runs `work(file, temp, sync)` as the step of `ctx`'s work on a blocking thread, once that
/// step's earlier work has ended, with the step's temporary name `temp` for the file held
/// and whatever a write cut short by a crash left under it removed first.
async fn leftover_cleared<T: Send + 'static>(
    ctx: &ToolContext,
    file: ConfinedFile,
    work: impl FnOnce(&ConfinedFile, &str, bool) -> Result<T, SandboxError> + Send + 'static,
) -> Result<T, ToolError> {
    let sync = ctx.durability.syncs();
    settle(ctx).await;
    let temp = temp_for(ctx, &file);
    step_blocking(ctx, move || {
        let _in_use = TempInUse::claim(&temp);
        file.remove_temp(&temp, sync).map_err(sandbox_error)?;
        work(&file, &temp, sync).map_err(sandbox_error)
    })
    .await
}

/// [`SandboxFiles::temp_name`] of `file` for the step of `ctx`.
fn temp_for(ctx: &ToolContext, file: &ConfinedFile) -> String {
    let name = file
        .path()
        .to_string()
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_owned();
    SandboxFiles::temp_name(&ctx.saga_id, ctx.step_seq, &name)
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
            leftover_cleared(ctx, file, move |file, temp, sync| {
                file.write_atomic(&bytes, temp, sync)
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
            leftover_cleared(ctx, file, |file, _temp, sync| {
                file.remove_file_if_exists(sync)
            })
            .await
        })
    }
}
