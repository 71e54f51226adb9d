//! Finding the database file a path names, and creating a new log so that no one ever sees
//! half of one.
//!
//! A new log is built whole in memory (every migration applied, marked with the log's
//! `application_id` and `user_version`), written to a file in the target folder that has
//! no name yet (`O_TMPFILE`, private to its owner), synced, and only then given its name
//! with a link that fails if the name is taken. A process killed at any instant leaves
//! either no log or a complete empty one; processes racing to create the same log all end
//! up on the one that was linked first. An empty file at the path (`mktemp`) is replaced
//! by a rename made under an advisory lock on the empty file: the new log is written whole
//! to an unnamed file, linked to a temporary name, and renamed over the empty one at once.

use std::ffi::OsString;
use std::fs;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use agent_kernel_api::TxError;

/// The most symbolic links followed from a `--db` path to the database file (Linux's own
/// limit for one path).
pub const DB_LINK_HOPS_MAX: usize = 40;

/// How many times creation starts over when another process created or replaced the file
/// meanwhile.
const CREATE_ATTEMPTS_MAX: usize = 8;

/// How long creation waits for another process that is replacing the same empty file.
const CREATE_LOCK_WAIT: Duration = Duration::from_secs(10);

/// How long creation sleeps between attempts to lock an empty file.
const CREATE_LOCK_RETRY: Duration = Duration::from_millis(1);

/// Tells apart the temporary names of one process's creations.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

fn storage(path: &Path, what: &str, err: &io::Error) -> TxError {
    TxError::Storage(format!("{what} {}: {err}", path.display()))
}

/// The database file `path` names: symbolic links in its last component are followed (at
/// most [`DB_LINK_HOPS_MAX`]), so that the log, its `-wal` and `-shm` files and its head
/// file are created, and found, beside the real file rather than beside a link. A path
/// without such a link is returned as given.
///
/// # Errors
///
/// [`TxError::Storage`] when a link cannot be read, or links loop.
pub fn resolve_db_path(path: &Path) -> Result<PathBuf, TxError> {
    let mut current = path.to_owned();
    for _ in 0..DB_LINK_HOPS_MAX {
        match fs::symlink_metadata(&current) {
            Ok(metadata) if metadata.file_type().is_symlink() => {
                let target = fs::read_link(&current)
                    .map_err(|err| storage(&current, "cannot read the link", &err))?;
                // A relative target is relative to the link's folder; joining keeps any `..`
                // for the kernel to resolve, as it would through the link.
                current = match current.parent() {
                    Some(parent) if target.is_relative() => parent.join(target),
                    _ => target,
                };
            }
            Ok(_) => return Ok(current),
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(current),
            Err(err) => return Err(storage(&current, "cannot inspect", &err)),
        }
    }
    Err(TxError::Storage(format!(
        "{}: more than {DB_LINK_HOPS_MAX} symbolic links to follow",
        path.display()
    )))
}

/// The folder holding `path`, as something `File::open` accepts.
fn folder_of(path: &Path) -> &Path {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

/// `<path>-wal`, SQLite's write-ahead log beside the database.
fn wal_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push("-wal");
    PathBuf::from(name)
}

/// Whether a non-empty `-wal` file lies beside `path`: then `path`, even empty or absent, is
/// not a place for a new log (SQLite would replay that journal onto it).
fn has_journal(path: &Path) -> Result<bool, TxError> {
    let wal = wal_path(path);
    match fs::symlink_metadata(&wal) {
        Ok(metadata) => Ok(metadata.len() > 0 || !metadata.is_file()),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(err) => Err(storage(&wal, "cannot inspect", &err)),
    }
}

/// Makes sure `path` (already resolved by [`resolve_db_path`]) holds a file SQLite can
/// open as a log, creating a new log there if it is absent or empty. Returns whether this
/// call created it. An existing non-empty file is left for the caller to check.
///
/// `image` builds the bytes of a new, complete, empty log; it is called at most once.
pub(crate) fn ensure_log_file(
    path: &Path,
    image: &dyn Fn() -> Result<Vec<u8>, TxError>,
) -> Result<bool, TxError> {
    let mut bytes: Option<Vec<u8>> = None;
    for _ in 0..CREATE_ATTEMPTS_MAX {
        let metadata = match fs::symlink_metadata(path) {
            Ok(metadata) => Some(metadata),
            Err(err) if err.kind() == io::ErrorKind::NotFound => None,
            Err(err) => return Err(storage(path, "cannot inspect", &err)),
        };
        match metadata {
            Some(metadata) if !metadata.is_file() || metadata.len() > 0 => return Ok(false),
            _ if has_journal(path)? => {
                return Err(TxError::Storage(format!(
                    "{} is missing or empty but its write-ahead journal {} is not: the log was moved or truncated without its journal; restore the database file, or remove both to start a new log",
                    path.display(),
                    wal_path(path).display()
                )));
            }
            _ => {}
        }
        if bytes.is_none() {
            bytes = Some(image()?);
        }
        let image = bytes.as_deref().expect("built just above");
        let created = match metadata {
            None => link_new(path, image)?,
            Some(_) => replace_empty(path, image)?,
        };
        if created {
            return Ok(true);
        }
        // Another process created or replaced the file meanwhile: look again.
    }
    Err(TxError::Storage(format!(
        "cannot create the log {}: other processes kept changing the file",
        path.display()
    )))
}

/// Writes `image` to a new private file in `path`'s folder, synced, and gives it the name
/// `path` only if that name is still free. Returns `false` when another process took the
/// name first.
fn link_new(path: &Path, image: &[u8]) -> Result<bool, TxError> {
    create_whole(path, image, true).map_err(|err| {
        if err.kind() == io::ErrorKind::NotFound {
            TxError::Storage(format!(
                "cannot create the log {}: the folder {} does not exist",
                path.display(),
                folder_of(path).display()
            ))
        } else {
            storage(path, "cannot create the log", &err)
        }
    })
}

/// Creates the file `path` holding exactly `bytes`, private to its owner, so that no one
/// ever sees it partly written: the bytes go to a file with no name in the same folder
/// (`O_TMPFILE`; on a file system without it, a temporary name removed afterwards), synced
/// when `sync`, then linked to `path` only if that name is free. Returns `false`, changing
/// nothing, when `path` already exists. With `sync`, the folder is synced after the link.
pub(crate) fn create_whole(path: &Path, bytes: &[u8], sync: bool) -> io::Result<bool> {
    let folder = folder_of(path);
    let linked = match unnamed_file(folder) {
        Ok(mut file) => {
            write_all(&mut file, bytes, sync)?;
            let proc_path = format!("/proc/self/fd/{}", file.as_raw_fd());
            match rustix::fs::linkat(
                rustix::fs::CWD,
                proc_path.as_str(),
                rustix::fs::CWD,
                path,
                rustix::fs::AtFlags::SYMLINK_FOLLOW,
            ) {
                Ok(()) => true,
                Err(rustix::io::Errno::EXIST) => false,
                // No /proc to name the file by (the folder exists: the file was made in
                // it): the same with a named temporary file.
                Err(rustix::io::Errno::NOENT) => link_named(path, bytes, sync)?,
                Err(err) => return Err(io::Error::from(err)),
            }
        }
        // A file system without unnamed files.
        Err(err)
            if matches!(
                err.raw_os_error(),
                Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL)
            ) =>
        {
            link_named(path, bytes, sync)?
        }
        Err(err) => return Err(err),
    };
    if linked && sync {
        sync_folder(folder)?;
    }
    Ok(linked)
}

/// [`create_whole`] through a temporary name beside `path`, removed afterwards (a kill in
/// between leaves that complete temporary file behind, never a partial one at `path`).
fn link_named(path: &Path, bytes: &[u8], sync: bool) -> io::Result<bool> {
    let temp = temp_path(path);
    let result = (|| {
        let mut file = new_private(&temp)?;
        write_all(&mut file, bytes, sync)?;
        match fs::hard_link(&temp, path) {
            Ok(()) => Ok(true),
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => Ok(false),
            Err(err) => Err(err),
        }
    })();
    let _ = fs::remove_file(&temp);
    result
}

/// Replaces the empty file at `path` with `image`, by a rename made while holding an
/// exclusive advisory lock on the empty file. Returns `false` when the file changed
/// meanwhile (another process replaced it, or wrote to it).
fn replace_empty(path: &Path, image: &[u8]) -> Result<bool, TxError> {
    let file = match fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(file) => file,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(err) => return Err(storage(path, "cannot open", &err)),
    };
    let waited_since = Instant::now();
    loop {
        match file.try_lock() {
            Ok(()) => break,
            Err(fs::TryLockError::WouldBlock) if waited_since.elapsed() < CREATE_LOCK_WAIT => {
                std::thread::sleep(CREATE_LOCK_RETRY);
            }
            Err(fs::TryLockError::WouldBlock) => {
                return Err(TxError::Storage(format!(
                    "cannot create the log {}: another process held the empty file locked for {CREATE_LOCK_WAIT:?}",
                    path.display()
                )));
            }
            Err(fs::TryLockError::Error(err)) => return Err(storage(path, "cannot lock", &err)),
        }
    }
    // Still the same empty file at the path? (Checked under the lock: a rename is what
    // changes it.)
    let held = file
        .metadata()
        .map_err(|err| storage(path, "cannot inspect", &err))?;
    let still_empty = fs::symlink_metadata(path).is_ok_and(|now| {
        now.ino() == held.ino() && now.dev() == held.dev() && now.is_file() && now.len() == 0
    });
    if !still_empty {
        return Ok(false);
    }
    let temp = temp_path(path);
    let result = (|| {
        // Whole before it has even its temporary name; only the instant between the link
        // and the rename can leave it there.
        if !create_whole(&temp, image, true)? {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} already exists", temp.display()),
            ));
        }
        fs::rename(&temp, path)?;
        sync_folder(folder_of(path))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&temp);
    }
    result.map_err(|err| storage(path, "cannot create the log", &err))?;
    Ok(true)
}

/// A file with no name in `folder`, readable and writable by its owner only.
fn unnamed_file(folder: &Path) -> io::Result<fs::File> {
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_TMPFILE)
        .open(folder)
}

/// A new file at `path`, never following a link planted there, private to its owner.
fn new_private(path: &Path) -> io::Result<fs::File> {
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

/// `.<name>.<pid>-<nanos>-<n>.creating` beside `path`: the time tells apart processes that
/// reuse a pid, the counter the creations of one process.
fn temp_path(path: &Path) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.subsec_nanos());
    let mut name = OsString::from(".");
    name.push(path.file_name().unwrap_or_default());
    name.push(format!(
        ".{}-{nanos}-{}.creating",
        std::process::id(),
        TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    path.with_file_name(name)
}

fn write_all(file: &mut fs::File, bytes: &[u8], sync: bool) -> io::Result<()> {
    file.write_all(bytes)?;
    if sync {
        file.sync_all()?;
    }
    Ok(())
}

fn sync_folder(folder: &Path) -> io::Result<()> {
    fs::File::open(folder)?.sync_all()
}
