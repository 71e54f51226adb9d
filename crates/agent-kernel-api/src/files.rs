//! Confined file access for tools ([`Files`]): what a [`ToolContext`] carries so that a
//! tool of the program's own reaches files exactly as the built-in file tools do.

use std::fmt;

#[cfg(doc)]
use crate::ToolErrorKind;
use crate::{BoxFuture, ToolContext, ToolError};

/// Confined file access, as the kernel's sandbox rules for the policy in force: every path
/// is resolved against [`folder`](Files::folder), then refused unless it lies under an
/// allowed root and outside the denied names, exactly as for `fs.read` and `fs.write`
/// (symbolic links are not followed out of a root; sizes are bounded by the policy's
/// `max_io_bytes`).
///
/// Every method does its file I/O on a blocking thread and returns a future, so a tool
/// awaits it from `execute` or `compensate` without blocking the runtime (the one rule for
/// tools: never block a runtime thread). Each is given the step's context: its I/O counts as
/// the step's work, so that a compensation waits for an effect of its own step that timed
/// out but is still under way before it acts (as for the built-in file tools), and a write
/// syncs when the kernel's durability asks for it.
pub trait Files: Send + Sync + fmt::Debug {
    /// The folder relative paths resolve against.
    fn folder(&self) -> &std::path::Path;

    /// The whole content of the file at `path`, or `None` when it does not exist.
    ///
    /// # Errors
    ///
    /// [`ToolErrorKind::Denied`] outside the policy; a failure when it cannot be read or is
    /// larger than the policy allows.
    fn read<'a>(
        &'a self,
        ctx: &'a ToolContext,
        path: &'a str,
    ) -> BoxFuture<'a, Result<Option<Vec<u8>>, ToolError>>;

    /// Replaces the file at `path` with `bytes` atomically (a temporary file renamed over
    /// it), syncing the file and its folder when `ctx`'s durability asks for it. Its folder
    /// must exist.
    ///
    /// # Errors
    ///
    /// [`ToolErrorKind::Denied`] outside the policy; an uncertain error when the write may
    /// have landed.
    fn write<'a>(
        &'a self,
        ctx: &'a ToolContext,
        path: &'a str,
        bytes: Vec<u8>,
    ) -> BoxFuture<'a, Result<(), ToolError>>;

    /// Removes the file at `path`; whether it existed.
    ///
    /// # Errors
    ///
    /// [`ToolErrorKind::Denied`] outside the policy; a failure when it cannot be removed.
    fn remove<'a>(
        &'a self,
        ctx: &'a ToolContext,
        path: &'a str,
    ) -> BoxFuture<'a, Result<bool, ToolError>>;
}

/// No file access at all: every path is denied. What a kernel built without a sandbox
/// hands its tools.
#[derive(Debug, Clone)]
pub struct NoFiles {
    folder: std::path::PathBuf,
}

impl NoFiles {
    /// No file access, relative paths (all denied) shown against `folder`.
    pub fn new(folder: impl Into<std::path::PathBuf>) -> Self {
        Self {
            folder: folder.into(),
        }
    }

    fn denied<T>(path: &str) -> Result<T, ToolError> {
        Err(ToolError::denied(format!(
            "{path}: this kernel gives its tools no file access"
        )))
    }
}

impl Files for NoFiles {
    fn folder(&self) -> &std::path::Path {
        &self.folder
    }

    fn read<'a>(
        &'a self,
        _ctx: &'a ToolContext,
        path: &'a str,
    ) -> BoxFuture<'a, Result<Option<Vec<u8>>, ToolError>> {
        Box::pin(async move { Self::denied(path) })
    }

    fn write<'a>(
        &'a self,
        _ctx: &'a ToolContext,
        path: &'a str,
        _bytes: Vec<u8>,
    ) -> BoxFuture<'a, Result<(), ToolError>> {
        Box::pin(async move { Self::denied(path) })
    }

    fn remove<'a>(
        &'a self,
        _ctx: &'a ToolContext,
        path: &'a str,
    ) -> BoxFuture<'a, Result<bool, ToolError>> {
        Box::pin(async move { Self::denied(path) })
    }
}
