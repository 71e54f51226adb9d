//! [`ConfinedPath`] (a ruled-on path, storable in a log) and [`ConfinedFile`] (the same path
//! bound to its root's directory handle, through which every operation runs).

use std::ffi::OsStr;
use std::fmt;
use std::io::{self, Read, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use cap_fs_ext::{FollowSymlinks, OpenOptionsFollowExt, OpenOptionsSyncExt};
use cap_std::fs::{Dir, Metadata, OpenOptions};
use serde::{Deserialize, Serialize};

use crate::names::DenyNames;
use crate::sandbox::{MAX_NAME_BYTES, MAX_PATH_BYTES};
use crate::{MAX_IO_BYTES_LIMIT, SandboxError};

/// A path the sandbox has ruled on: a canonical root and a path relative to it.
///
/// It serializes (`{"root": …, "rel": …}`), so a tool can keep it in an undo record and
/// compensation can work from the log alone. A path read back from a record is not trusted:
/// [`FsSandbox::reconfine`](crate::FsSandbox::reconfine) rules on it again under the policy
/// in force before anything touches it.
/// Deserializing checks the same shape [`ConfinedPath::new`] checks.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "RawConfinedPath")]
pub struct ConfinedPath {
    root: PathBuf,
    rel: PathBuf,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfinedPath {
    root: PathBuf,
    rel: PathBuf,
}

impl TryFrom<RawConfinedPath> for ConfinedPath {
    type Error = SandboxError;

    fn try_from(raw: RawConfinedPath) -> Result<Self, Self::Error> {
        ConfinedPath::new(raw.root, raw.rel)
    }
}

impl ConfinedPath {
    /// Builds a confined path from its parts, checking their shape (not the disk).
    ///
    /// # Errors
    ///
    /// [`SandboxError::InvalidPath`] unless `root` is absolute and `rel` is a non-empty
    /// relative path that ends in a name, never climbs above the root through `..`, and has
    /// no NUL byte or over-long name.
    pub fn new(root: PathBuf, rel: PathBuf) -> Result<ConfinedPath, SandboxError> {
        let invalid = |reason: &str| SandboxError::InvalidPath {
            path: root.join(&rel).display().to_string(),
            reason: reason.to_owned(),
        };
        if !root.is_absolute() {
            return Err(invalid("its root is not absolute"));
        }
        if rel.as_os_str().is_empty() {
            return Err(invalid("it names the root itself, not a file inside it"));
        }
        if rel.as_os_str().len() > MAX_PATH_BYTES {
            return Err(invalid("it is too long"));
        }
        if rel.as_os_str().as_encoded_bytes().contains(&0) {
            return Err(invalid("it contains a NUL byte"));
        }
        for component in rel.components() {
            match component {
                Component::Normal(name) if name.len() > MAX_NAME_BYTES => {
                    return Err(invalid("it has a name over 255 bytes"));
                }
                Component::Normal(_) | Component::ParentDir | Component::CurDir => {}
                Component::RootDir | Component::Prefix(_) => {
                    return Err(invalid("its relative part is absolute"));
                }
            }
        }
        if !lexical_depth_ok(&rel) {
            return Err(invalid("it climbs above its root through `..`"));
        }
        if !matches!(rel.components().next_back(), Some(Component::Normal(_))) {
            return Err(invalid("it does not name a file"));
        }
        Ok(ConfinedPath { root, rel })
    }

    /// The canonical absolute root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The path below the root.
    pub fn rel(&self) -> &Path {
        &self.rel
    }

    /// The folder part of `rel` (`.` for the root) and the final name.
    fn split(&self) -> (PathBuf, &OsStr) {
        let mut components: Vec<Component<'_>> = self.rel.components().collect();
        let name = match components.pop() {
            Some(Component::Normal(name)) => name,
            // `new` checked that the last component is a name.
            _ => unreachable!("a confined path ends in a name"),
        };
        let parent: PathBuf = components.iter().collect();
        if parent.as_os_str().is_empty() {
            (PathBuf::from("."), name)
        } else {
            (parent, name)
        }
    }
}

impl fmt::Display for ConfinedPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.root.join(&self.rel).display())
    }
}

/// Whether `rel` never climbs above its start through `..`, read lexically.
pub(crate) fn lexical_depth_ok(rel: &Path) -> bool {
    let mut depth: usize = 0;
    for component in rel.components() {
        match component {
            Component::Normal(_) => depth += 1,
            Component::ParentDir => match depth.checked_sub(1) {
                Some(up) => depth = up,
                None => return false,
            },
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    true
}

/// A [`ConfinedPath`] bound to an open handle on its root: every file operation goes through
/// it, so `..` and symbolic links cannot lead outside the root at the moment of the operation
/// (the kernel refuses, through `openat2` with `RESOLVE_BENEATH` on Linux).
///
/// Mutations never follow a symbolic link in the final component and only touch regular files.
/// Folders are never created.
/// The methods block: call them from a blocking thread in async code.
#[derive(Debug)]
pub struct ConfinedFile {
    path: ConfinedPath,
    root: Arc<Dir>,
    max_io_bytes: u64,
    deny_names: Arc<DenyNames>,
}

impl ConfinedFile {
    pub(crate) fn new(
        path: ConfinedPath,
        root: Arc<Dir>,
        max_io_bytes: u64,
        deny_names: Arc<DenyNames>,
    ) -> ConfinedFile {
        debug_assert!(max_io_bytes <= MAX_IO_BYTES_LIMIT);
        ConfinedFile {
            path,
            root,
            max_io_bytes,
            deny_names,
        }
    }

    /// The path this handle operates on.
    pub fn path(&self) -> &ConfinedPath {
        &self.path
    }

    /// The largest read or write, in bytes.
    pub fn max_io_bytes(&self) -> u64 {
        self.max_io_bytes
    }
    /// The whole file, up to `max_io_bytes`: [`read`](Self::read) with the policy's bound.
    ///
    /// # Errors
    ///
    /// As [`read`](Self::read).
    pub fn read_all(&self) -> Result<Vec<u8>, SandboxError> {
        self.read(self.max_io_bytes)
    }

    /// Reads the whole file, following symbolic links inside the root.
    ///
    /// # Errors
    ///
    /// [`SandboxError::TooLarge`] when the file is larger than `max_bytes` or than
    /// `max_io_bytes` (the read itself is bounded too, in case the file grows meanwhile);
    /// [`SandboxError::NotFound`], [`SandboxError::NotRegularFile`], a denial when the path
    /// leads outside the root or resolves to a denied name, [`SandboxError::Io`] otherwise.
    pub fn read(&self, max_bytes: u64) -> Result<Vec<u8>, SandboxError> {
        let limit = max_bytes.min(self.max_io_bytes);
        // Through the root, not the parent folder: a link in the final component may lead
        // anywhere inside the root, including above its own folder.
        let rel = self.path.rel();
        self.check_names_now(rel)?;
        let metadata = self
            .root
            .metadata(rel)
            .map_err(|error| self.io_error(error, "inspect", false))?;
        self.ensure_regular(&metadata)?;
        self.ensure_within(metadata.len(), limit)?;
        let mut options = OpenOptions::new();
        // Non-blocking, so that a file swapped for a FIFO after the check cannot hang the open.
        options.read(true).nonblock(true);
        let mut file = self
            .root
            .open_with(rel, &options)
            .map_err(|error| self.io_error(error, "open", false))?;
        let metadata = file
            .metadata()
            .map_err(|error| self.io_error(error, "inspect", false))?;
        self.ensure_regular(&metadata)?;
        self.ensure_within(metadata.len(), limit)?;
        let mut bytes = Vec::with_capacity(usize::try_from(metadata.len()).unwrap_or(0));
        Read::by_ref(&mut file)
            .take(limit.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(|error| self.io_error(error, "read", false))?;
        self.ensure_within(bytes.len() as u64, limit)?;
        Ok(bytes)
    }

    /// The file's length, or `None` if it does not exist.
    ///
    /// Like every mutation, and unlike [`read`](Self::read), it does not follow a symbolic
    /// link in the final component: it refuses it, so a caller planning a mutation learns
    /// early that the mutation would be refused.
    ///
    /// # Errors
    ///
    /// [`SandboxError::ParentMissing`], [`SandboxError::Symlink`],
    /// [`SandboxError::NotRegularFile`], a denial, or [`SandboxError::Io`].
    pub fn stat(&self) -> Result<Option<u64>, SandboxError> {
        let (_, name) = self.path.split();
        let parent = self.open_parent()?;
        self.check_names_now(&self.parent_rel())?;
        Ok(self
            .inspect_target(&parent, name, "modify")?
            .map(|metadata| metadata.len()))
    }

    /// The file's identity: its absolute path with the links of its folders resolved,
    /// through the root's handle, so every spelling of one file (`a`, `./b/../a`, a linked
    /// folder) gives the same path. A folder that does not exist (yet) is taken as spelled,
    /// `.` and `..` removed. Reads only.
    ///
    /// # Errors
    ///
    /// [`SandboxError::Io`] when the folder cannot be resolved for another reason than
    /// its absence.
    pub fn identity(&self) -> Result<PathBuf, SandboxError> {
        let (parent, name) = self.path.split();
        let folder = match self.root.canonicalize(&parent) {
            Ok(resolved) => lexical(&resolved),
            Err(error) if error.kind() == io::ErrorKind::NotFound => lexical(&parent),
            Err(error) => return Err(self.io_error(error, "resolve the folder of", false)),
        };
        Ok(self.path.root.join(folder).join(name))
    }

    /// Replaces the file's content atomically: writes `bytes` to `temp_name` (created new, in
    /// the same folder), syncs it if `sync`, renames it over the target, then syncs the folder
    /// if `sync`.
    /// Readers see the old or the new content, never a mix.
    /// An existing target keeps its permissions.
    ///
    /// # Errors
    ///
    /// [`SandboxError::TooLarge`], [`SandboxError::Symlink`] when the target is a symbolic
    /// link, [`SandboxError::NotRegularFile`], [`SandboxError::ParentMissing`],
    /// [`SandboxError::InvalidPath`] for a `temp_name` that is not a plain name,
    /// [`SandboxError::Io`] (with [`may_have_changed`](SandboxError::may_have_changed) when the
    /// rename may have happened or a temporary file may be left behind).
    pub fn write_atomic(
        &self,
        bytes: &[u8],
        temp_name: &str,
        sync: bool,
    ) -> Result<(), SandboxError> {
        self.ensure_within(bytes.len() as u64, self.max_io_bytes)?;
        let (_, name) = self.path.split();
        self.check_temp_name(temp_name, name)?;
        let parent = self.open_parent()?;
        self.check_names_now(&self.parent_rel())?;
        let existing = self.inspect_target(&parent, name, "write")?;

        let mut options = OpenOptions::new();
        options.write(true).create_new(true);
        let mut temp = parent
            .open_with(temp_name, &options)
            .map_err(|error| self.io_error(error, "create a temporary file next to", false))?;
        let filled = (|| {
            temp.write_all(bytes)?;
            if let Some(metadata) = &existing {
                temp.set_permissions(metadata.permissions())?;
            }
            if sync {
                temp.sync_all()?;
            }
            Ok::<(), io::Error>(())
        })();
        drop(temp);
        if let Err(error) = filled {
            let removed = parent.remove_file(temp_name).is_ok();
            return Err(self.io_error(error, "write a temporary file next to", !removed));
        }
        if let Err(error) = parent.rename(temp_name, &parent, name) {
            let removed = parent.remove_file(temp_name).is_ok();
            return Err(self.io_error(error, "rename a temporary file onto", !removed));
        }
        if sync {
            sync_dir(&parent).map_err(|error| self.io_error(error, "sync the folder of", true))?;
        }
        Ok(())
    }

    /// Appends `bytes`, creating the file if it is absent; syncs the file (and, for a new
    /// file, its folder) if `sync`.
    /// Returns the file's new length.
    ///
    /// # Errors
    ///
    /// As [`write_atomic`](Self::write_atomic); a failure while writing or syncing may have
    /// changed the file.
    pub fn append(&self, bytes: &[u8], sync: bool) -> Result<u64, SandboxError> {
        self.ensure_within(bytes.len() as u64, self.max_io_bytes)?;
        let (_, name) = self.path.split();
        let parent = self.open_parent()?;
        self.check_names_now(&self.parent_rel())?;
        let existing = self.inspect_target(&parent, name, "append")?;
        let mut options = OpenOptions::new();
        options
            .append(true)
            .create(true)
            .follow(FollowSymlinks::No)
            .nonblock(true);
        let mut file = parent
            .open_with(name, &options)
            .map_err(|error| self.io_error(error, "open", false))?;
        let metadata = file
            .metadata()
            .map_err(|error| self.io_error(error, "inspect", existing.is_none()))?;
        self.ensure_regular(&metadata)?;
        self.ensure_single_link(&metadata, "append to")?;
        file.write_all(bytes)
            .map_err(|error| self.io_error(error, "append to", true))?;
        if sync {
            file.sync_all()
                .map_err(|error| self.io_error(error, "sync", true))?;
            if existing.is_none() {
                sync_dir(&parent)
                    .map_err(|error| self.io_error(error, "sync the folder of", true))?;
            }
        }
        Ok(metadata.len().saturating_add(bytes.len() as u64))
    }

    /// Shortens the file to `len` bytes (a no-op when it already has that length); syncs it if
    /// `sync`.
    ///
    /// # Errors
    ///
    /// [`SandboxError::Conflict`] when the file is shorter than `len` (someone else changed
    /// it), [`SandboxError::NotFound`], [`SandboxError::Symlink`],
    /// [`SandboxError::NotRegularFile`], a denial, or [`SandboxError::Io`].
    pub fn truncate(&self, len: u64, sync: bool) -> Result<(), SandboxError> {
        let (_, name) = self.path.split();
        let parent = self.open_parent()?;
        self.check_names_now(&self.parent_rel())?;
        if self.inspect_target(&parent, name, "truncate")?.is_none() {
            return Err(self.not_found());
        }
        let mut options = OpenOptions::new();
        options
            .write(true)
            .follow(FollowSymlinks::No)
            .nonblock(true);
        let file = parent
            .open_with(name, &options)
            .map_err(|error| self.io_error(error, "open", false))?;
        let metadata = file
            .metadata()
            .map_err(|error| self.io_error(error, "inspect", false))?;
        self.ensure_regular(&metadata)?;
        self.ensure_single_link(&metadata, "truncate")?;
        if metadata.len() < len {
            return Err(SandboxError::Conflict {
                path: self.path.to_string(),
                reason: format!(
                    "it is {} bytes long, shorter than the {len} bytes to truncate to",
                    metadata.len()
                ),
            });
        }
        if metadata.len() > len {
            file.set_len(len)
                .map_err(|error| self.io_error(error, "truncate", false))?;
        }
        if sync {
            file.sync_all()
                .map_err(|error| self.io_error(error, "sync", true))?;
        }
        Ok(())
    }

    /// Removes the file; syncs its folder if `sync`.
    ///
    /// # Errors
    ///
    /// [`SandboxError::NotFound`] when it does not exist, [`SandboxError::Symlink`],
    /// [`SandboxError::NotRegularFile`], a denial, or [`SandboxError::Io`].
    pub fn remove_file(&self, sync: bool) -> Result<(), SandboxError> {
        if self.remove_file_if_exists(sync)? {
            Ok(())
        } else {
            Err(self.not_found())
        }
    }

    /// Removes the file if it exists (its folder missing counts as absent); syncs the folder
    /// if `sync`.
    /// Returns whether a file was removed.
    ///
    /// # Errors
    ///
    /// As [`remove_file`](Self::remove_file), except that absence is not an error.
    pub fn remove_file_if_exists(&self, sync: bool) -> Result<bool, SandboxError> {
        let (_, name) = self.path.split();
        let parent = match self.open_parent() {
            Ok(parent) => parent,
            Err(SandboxError::ParentMissing { .. }) => return Ok(false),
            Err(error) => return Err(error),
        };
        self.check_names_now(&self.parent_rel())?;
        if self.inspect_target(&parent, name, "remove")?.is_none() {
            return Ok(false);
        }
        match parent.remove_file(name) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(error) => return Err(self.io_error(error, "remove", false)),
        }
        if sync {
            sync_dir(&parent).map_err(|error| self.io_error(error, "sync the folder of", true))?;
        }
        Ok(true)
    }

    /// Removes the temporary file `temp_name` next to the target, if it exists (what a crash
    /// during [`write_atomic`](Self::write_atomic) can leave behind); syncs the folder if
    /// `sync`.
    /// Returns whether a file was removed.
    ///
    /// # Errors
    ///
    /// [`SandboxError::InvalidPath`] for a `temp_name` that is not a plain name, a denial, or
    /// [`SandboxError::Io`].
    pub fn remove_temp(&self, temp_name: &str, sync: bool) -> Result<bool, SandboxError> {
        let (_, name) = self.path.split();
        self.check_temp_name(temp_name, name)?;
        let parent = match self.open_parent() {
            Ok(parent) => parent,
            Err(SandboxError::ParentMissing { .. }) => return Ok(false),
            Err(error) => return Err(error),
        };
        // `remove_file` removes a symbolic link itself, never its target.
        match parent.remove_file(temp_name) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(error) => {
                return Err(self.io_error(error, "remove a temporary file next to", false));
            }
        }
        if sync {
            sync_dir(&parent).map_err(|error| self.io_error(error, "sync the folder of", true))?;
        }
        Ok(true)
    }

    fn parent_rel(&self) -> PathBuf {
        self.path.split().0
    }

    /// Opens the folder holding the target, through the root's handle.
    fn open_parent(&self) -> Result<Dir, SandboxError> {
        let (parent, _) = self.path.split();
        self.root.open_dir(&parent).map_err(|error| {
            if error.kind() == io::ErrorKind::NotFound {
                SandboxError::ParentMissing {
                    path: self.path.to_string(),
                }
            } else {
                self.io_error(error, "open the folder of", false)
            }
        })
    }

    /// Checks denied names against where `rel` leads now, symbolic links resolved, so a link
    /// with an innocent name cannot reach a denied one.
    fn check_names_now(&self, rel: &Path) -> Result<(), SandboxError> {
        if self.deny_names.is_empty() {
            return Ok(());
        }
        let resolved = match self.root.canonicalize(rel) {
            Ok(resolved) => resolved,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(error) => return Err(self.io_error(error, "resolve", false)),
        };
        match self.deny_names.first_denied(&resolved) {
            Some((name, pattern)) => Err(SandboxError::Denied {
                path: self.path.to_string(),
                reason: format!(
                    "it resolves to `{}`, whose name `{name}` matches the denied name `{pattern}`",
                    resolved.display()
                ),
            }),
            None => Ok(()),
        }
    }

    /// What is at `name` without following a link: `None` when absent; symbolic links and
    /// non-regular files are refused.
    fn inspect_target(
        &self,
        parent: &Dir,
        name: &OsStr,
        action: &'static str,
    ) -> Result<Option<Metadata>, SandboxError> {
        match parent.symlink_metadata(name) {
            Ok(metadata) if metadata.file_type().is_symlink() => Err(SandboxError::Symlink {
                path: self.path.to_string(),
                action,
            }),
            Ok(metadata) => {
                self.ensure_regular(&metadata)?;
                Ok(Some(metadata))
            }
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(self.io_error(error, "inspect", false)),
        }
    }

    /// Refuses to change a file in place when other hard links share its content: one of
    /// them may be outside the roots, and an in-place write would change it there too.
    /// (Atomic writes replace the file by rename, so they never write through a link.)
    fn ensure_single_link(&self, metadata: &Metadata, action: &str) -> Result<(), SandboxError> {
        use cap_std::fs::MetadataExt as _;
        let n_links = metadata.nlink();
        if n_links > 1 {
            return Err(SandboxError::Denied {
                path: self.path.to_string(),
                reason: format!(
                    "refusing to {action} a file with {n_links} hard links: its content is shared with another path, possibly outside the allowed roots"
                ),
            });
        }
        Ok(())
    }

    fn ensure_regular(&self, metadata: &Metadata) -> Result<(), SandboxError> {
        if metadata.is_file() {
            return Ok(());
        }
        let kind = if metadata.is_dir() {
            "directory"
        } else if metadata.file_type().is_symlink() {
            "symbolic link"
        } else {
            "special file such as a FIFO, socket or device"
        };
        Err(SandboxError::NotRegularFile {
            path: self.path.to_string(),
            kind,
        })
    }

    fn ensure_within(&self, len: u64, max_bytes: u64) -> Result<(), SandboxError> {
        if len > max_bytes {
            return Err(SandboxError::TooLarge {
                path: self.path.to_string(),
                len,
                max_bytes,
            });
        }
        Ok(())
    }

    fn check_temp_name(&self, temp_name: &str, target_name: &OsStr) -> Result<(), SandboxError> {
        let plain = !temp_name.is_empty()
            && temp_name.len() <= MAX_NAME_BYTES
            && temp_name != "."
            && temp_name != ".."
            && !temp_name.contains(['/', '\\', '\0']);
        if !plain || OsStr::new(temp_name) == target_name {
            return Err(SandboxError::InvalidPath {
                path: temp_name.escape_debug().to_string(),
                reason: format!(
                    "a temporary file for `{}` must be a plain name other than the file's",
                    self.path
                ),
            });
        }
        Ok(())
    }

    fn not_found(&self) -> SandboxError {
        SandboxError::NotFound {
            path: self.path.to_string(),
        }
    }

    /// Classifies an I/O error: absence, an escape attempt (a denial), or a plain failure.
    fn io_error(&self, error: io::Error, action: &'static str, partial: bool) -> SandboxError {
        if !partial && error.kind() == io::ErrorKind::NotFound {
            return self.not_found();
        }
        if is_escape(&error) {
            return SandboxError::Denied {
                path: self.path.to_string(),
                reason: format!(
                    "it leads outside its allowed root `{}` (through `..` or a symbolic link)",
                    self.path.root().display()
                ),
            };
        }
        SandboxError::Io {
            path: self.path.to_string(),
            action,
            partial,
            source: error,
        }
    }
}

/// Whether `error` is cap-std refusing a path that leads outside its directory.
///
/// cap-std reports every escape (`..` above the root, an absolute symbolic link, a relative
/// one that climbs out) as a `PermissionDenied` error of its own making, with no OS error code;
/// a real `EACCES` from the OS carries its code.
fn is_escape(error: &io::Error) -> bool {
    error.kind() == io::ErrorKind::PermissionDenied && error.raw_os_error().is_none()
}

/// Syncs a folder, so a rename, creation or removal in it survives power loss.
///
/// cap-std directory handles are opened with `O_PATH`, which cannot be synced, so the folder
/// is opened again for reading through the handle itself.
fn sync_dir(dir: &Dir) -> io::Result<()> {
    let mut options = OpenOptions::new();
    options.read(true);
    let handle = dir.open_with(".", &options)?;
    handle.sync_all()
}

/// `path` with `.` removed and each `..` taking away the name before it (a confined path
/// never climbs above its root).
fn lexical(path: &Path) -> PathBuf {
    let mut names: Vec<&OsStr> = Vec::new();
    for component in path.components() {
        match component {
            Component::Normal(name) => names.push(name),
            Component::ParentDir => {
                names.pop();
            }
            _ => {}
        }
    }
    names.iter().collect()
}
