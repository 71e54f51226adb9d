//! [`FsSandbox`]: rules on paths and hands out confined file handles.

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use cap_std::ambient_authority;
use cap_std::fs::Dir;

use crate::confined::{ConfinedFile, lexical_depth_ok};
use crate::names::DenyNames;
use crate::{ConfinedPath, Policy, SandboxError};

/// The longest path [`FsSandbox::resolve`] accepts, in bytes (Linux's `PATH_MAX`).
pub const MAX_PATH_BYTES: usize = 4096;

/// The longest single name in a path, in bytes (the usual file system limit).
pub const MAX_NAME_BYTES: usize = 255;

/// The file side of a [`Policy`]: one open directory handle per allowed root.
///
/// [`resolve`](Self::resolve) rules on a path without touching the disk;
/// [`open`](Self::open) binds a resolved path to its root's handle, and every operation then
/// goes through that handle.
#[derive(Debug)]
pub struct FsSandbox {
    access: Option<Access>,
    origin: Option<String>,
}

#[derive(Debug)]
struct Access {
    roots: Vec<Root>,
    deny_names: Arc<DenyNames>,
    max_io_bytes: u64,
}

#[derive(Debug)]
struct Root {
    path: PathBuf,
    dir: Arc<Dir>,
}

impl FsSandbox {
    /// Opens a handle on every allowed root of `policy`.
    ///
    /// A policy without `[fs]` gives a sandbox that denies every path.
    ///
    /// # Errors
    ///
    /// [`SandboxError::Root`] when a root cannot be opened (it was removed since the policy
    /// was loaded, say).
    pub fn new(policy: &Policy) -> Result<FsSandbox, SandboxError> {
        let origin = policy.source().map(|source| source.display().to_string());
        let Some(fs_policy) = policy.fs() else {
            return Ok(FsSandbox {
                access: None,
                origin,
            });
        };
        let mut roots = Vec::with_capacity(fs_policy.allow().len());
        for root in fs_policy.allow() {
            let dir = Dir::open_ambient_dir(root, ambient_authority()).map_err(|error| {
                SandboxError::Root {
                    origin: policy.origin(),
                    root: root.clone(),
                    reason: format!("cannot be opened: {error}"),
                }
            })?;
            roots.push(Root {
                path: root.clone(),
                dir: Arc::new(dir),
            });
        }
        Ok(FsSandbox {
            access: Some(Access {
                roots,
                deny_names: Arc::new(fs_policy.deny_name_matcher().clone()),
                max_io_bytes: fs_policy.max_io_bytes(),
            }),
            origin,
        })
    }

    /// The sandbox that denies every path.
    pub fn deny_all() -> FsSandbox {
        FsSandbox {
            access: None,
            origin: None,
        }
    }

    /// Whether any file access is allowed (the policy has an `[fs]` section).
    pub fn allows_files(&self) -> bool {
        self.access.is_some()
    }

    /// The allowed roots, canonical; empty when file access is denied.
    pub fn roots(&self) -> Vec<&Path> {
        self.access
            .iter()
            .flat_map(|access| access.roots.iter().map(|root| root.path.as_path()))
            .collect()
    }

    /// The largest read or write in bytes; 0 when file access is denied.
    pub fn max_io_bytes(&self) -> u64 {
        self.access.as_ref().map_or(0, |access| access.max_io_bytes)
    }

    /// Checks that `len` bytes may be read or written at `path` (used for messages only).
    ///
    /// # Errors
    ///
    /// [`SandboxError::TooLarge`] when `len` exceeds `max_io_bytes`, and a denial when file
    /// access is not allowed at all.
    pub fn check_size(&self, path: &str, len: u64) -> Result<(), SandboxError> {
        let Some(access) = &self.access else {
            return Err(self.no_access(path));
        };
        if len > access.max_io_bytes {
            return Err(SandboxError::TooLarge {
                path: path.to_owned(),
                len,
                max_bytes: access.max_io_bytes,
            });
        }
        Ok(())
    }

    /// Rules on `path` without touching the disk.
    ///
    /// A relative `path` is joined to `cwd` (which should be absolute, as
    /// `std::env::current_dir` returns it).
    /// The result must start, component by component, with one of the canonical roots; nothing
    /// is normalized, so a path that leaves a root through `..` and comes back is denied.
    /// What follows the root must be non-empty, must not climb above the root through `..`,
    /// and no component may match a denied name.
    ///
    /// This is the first line only: symbolic links are resolved by the kernel when the file is
    /// touched, through the root's handle, and anything leading outside the root fails then.
    ///
    /// # Errors
    ///
    /// [`SandboxError::InvalidPath`] for an empty path, a NUL byte, a name over
    /// [`MAX_NAME_BYTES`] or a path over [`MAX_PATH_BYTES`], a trailing `/` or `..`;
    /// a denial ([`SandboxError::is_denied`]) naming the path and the reason otherwise.
    pub fn resolve(&self, path: &str, cwd: &Path) -> Result<ConfinedPath, SandboxError> {
        check_path_text(path)?;
        let Some(access) = &self.access else {
            return Err(self.no_access(path));
        };
        let denied = |reason: String| SandboxError::Denied {
            path: path.to_owned(),
            reason,
        };
        let joined = cwd.join(path);
        // The most specific root wins when roots nest.
        let (root, rest) = access
            .roots
            .iter()
            .filter_map(|root| {
                joined
                    .strip_prefix(&root.path)
                    .ok()
                    .map(|rest| (root, rest))
            })
            .max_by_key(|(root, _)| root.path.components().count())
            .ok_or_else(|| denied(outside_reason(&access.roots)))?;
        if rest.as_os_str().is_empty() {
            return Err(denied(format!(
                "it names the allowed root `{}` itself, not a file inside it",
                root.path.display()
            )));
        }
        if !lexical_depth_ok(rest) {
            return Err(denied(format!(
                "it leaves the allowed root `{}` through `..`",
                root.path.display()
            )));
        }
        if !matches!(rest.components().next_back(), Some(Component::Normal(_))) {
            return Err(SandboxError::InvalidPath {
                path: path.to_owned(),
                reason: "it does not name a file".to_owned(),
            });
        }
        if let Some((name, pattern)) = access.deny_names.first_denied(rest) {
            return Err(denied(format!(
                "the name `{name}` matches the denied name `{pattern}`"
            )));
        }
        ConfinedPath::new(root.path.clone(), rest.to_path_buf())
    }

    /// Binds `path` to the handle of its root, under this sandbox's limits.
    ///
    /// # Errors
    ///
    /// A denial when file access is not allowed, when `path`'s root is not one of this
    /// sandbox's roots (it came from another policy), or when one of its names is denied.
    pub fn open(&self, path: &ConfinedPath) -> Result<ConfinedFile, SandboxError> {
        let shown = path.to_string();
        let Some(access) = &self.access else {
            return Err(self.no_access(&shown));
        };
        let root = access
            .roots
            .iter()
            .find(|root| root.path == path.root())
            .ok_or_else(|| SandboxError::Denied {
                path: shown.clone(),
                reason: format!(
                    "its root `{}` is not allowed by the current policy",
                    path.root().display()
                ),
            })?;
        if let Some((name, pattern)) = access.deny_names.first_denied(path.rel()) {
            return Err(SandboxError::Denied {
                path: shown,
                reason: format!("the name `{name}` matches the denied name `{pattern}`"),
            });
        }
        Ok(ConfinedFile::new(
            path.clone(),
            Arc::clone(&root.dir),
            access.max_io_bytes,
            Arc::clone(&access.deny_names),
        ))
    }

    /// Binds a path recorded earlier (in a log's undo record, say) to this sandbox: its
    /// absolute form is ruled on again exactly as a new path would be
    /// ([`resolve`](Self::resolve)), then bound to the handle of the root it falls in
    /// ([`open`](Self::open)). Whatever root the record names, only today's roots, limits
    /// and denied names apply: a record is data, never authority.
    ///
    /// # Errors
    ///
    /// As [`resolve`](Self::resolve) and [`open`](Self::open); a denial says that the path
    /// came from a record.
    pub fn reconfine(&self, recorded: &ConfinedPath) -> Result<ConfinedFile, SandboxError> {
        let absolute = recorded.root().join(recorded.rel());
        let Some(text) = absolute.to_str() else {
            return Err(SandboxError::InvalidPath {
                path: absolute.display().to_string(),
                reason: "it is not UTF-8".to_owned(),
            });
        };
        let from_record = |error: SandboxError| match error {
            SandboxError::Denied { path, reason } => SandboxError::Denied {
                path,
                reason: format!(
                    "{reason}; the path comes from a recorded step and is ruled on again under the policy in force"
                ),
            },
            other => other,
        };
        let confined = self.resolve(text, Path::new("/")).map_err(from_record)?;
        self.open(&confined).map_err(from_record)
    }

    /// [`resolve`](Self::resolve), then [`open`](Self::open).
    ///
    /// # Errors
    ///
    /// As those two.
    pub fn resolve_open(&self, path: &str, cwd: &Path) -> Result<ConfinedFile, SandboxError> {
        let confined = self.resolve(path, cwd)?;
        self.open(&confined)
    }

    fn no_access(&self, path: &str) -> SandboxError {
        let why = match &self.origin {
            Some(origin) => format!("the sandbox policy {origin} has no [fs] section"),
            None => "no sandbox policy was given".to_owned(),
        };
        SandboxError::Denied {
            path: path.to_owned(),
            reason: format!(
                "no file access is allowed: {why}; pass a policy with an [fs] section \
                 using --sandbox FILE"
            ),
        }
    }
}

/// Checks what can be checked on the text alone.
fn check_path_text(path: &str) -> Result<(), SandboxError> {
    let invalid = |reason: String| SandboxError::InvalidPath {
        path: path.escape_debug().to_string(),
        reason,
    };
    if path.is_empty() {
        return Err(invalid("it is empty".to_owned()));
    }
    if path.contains('\0') {
        return Err(invalid("it contains a NUL byte".to_owned()));
    }
    if path.len() > MAX_PATH_BYTES {
        return Err(invalid(format!(
            "it is {} bytes long; the limit is {MAX_PATH_BYTES}",
            path.len()
        )));
    }
    if path.ends_with('/') {
        return Err(invalid(
            "it ends in `/`, so it names a folder, not a file".to_owned(),
        ));
    }
    if let Some(long) = path.split('/').find(|name| name.len() > MAX_NAME_BYTES) {
        let shown: String = long.chars().take(32).collect();
        return Err(invalid(format!(
            "the name `{shown}…` is {} bytes long; the limit is {MAX_NAME_BYTES}",
            long.len()
        )));
    }
    Ok(())
}

fn outside_reason(roots: &[Root]) -> String {
    if roots.is_empty() {
        return "the policy allows no folder".to_owned();
    }
    let listed: Vec<String> = roots
        .iter()
        .map(|root| format!("`{}`", root.path.display()))
        .collect();
    format!("it is outside every allowed root ({})", listed.join(", "))
}
