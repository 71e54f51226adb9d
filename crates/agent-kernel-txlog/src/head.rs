//! The head file: the audit chain's newest sequence number and hash, kept outside the
//! database (`<database file name>.audit-head` in the same folder) so that deleting the
//! newest records, or swapping in an older copy of the database, is detected.
//!
//! It holds two slots of [`SLOT_BYTES`] each, [`SLOT_STRIDE`] bytes apart so that no disk
//! sector or page holds both: a line of canonical JSON,
//! `{"hash":"…","mac":"…","seq":n,"sum":"…"}` (`mac` only with a key; `sum` the SHA-256 of
//! the same object without `sum`), padded with spaces and ended by a newline; a blank slot
//! is all spaces, and so is the filler between the slots (ended by a newline). The head is
//! the valid slot with the larger `seq`.
//!
//! A writer moves the head ([`advance`]) by overwriting, in place, the slot that does not
//! hold it, under an exclusive advisory lock on the file, and syncs the file's data under
//! [`Durability::Full`]: a write torn by a crash or seen half-done by a reader damages only
//! that slot, whose `sum` then fails, and the other slot still holds the previous head.
//! No rename, so no new file for the file system to allocate and flush at each saga's end.
//! The file is created, and replaced by an operator's seal ([`write`]), atomically: a new
//! temporary file in the same folder (synced under [`Durability::Full`]), renamed over the
//! old one, and the folder synced (under [`Durability::Full`]).
//!
//! A head file written by an earlier build, one line `{"hash":"…","mac":"…","seq":n}`, is
//! read as its one head, and replaced by the two-slot form the first time a writer moves it.

use std::ffi::OsString;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use agent_kernel_api::Durability;
use serde::Serialize;
use serde_json::{Map, Value, json};

use agent_kernel_api::canonical_json;

use crate::digest::{is_hex_digest, sha256_hex};

/// The newest record of a chain: what the head file holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Head {
    /// 0 for an empty chain.
    pub(crate) seq: i64,
    /// [`ZERO_HASH`](crate::digest::ZERO_HASH) for an empty chain.
    pub(crate) hash: String,
    pub(crate) mac: Option<String>,
}

/// A position in the chain: a record's sequence number and hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditHead {
    /// The sequence number (0 for an empty chain).
    pub seq: u64,
    /// The record's hash (64 zeros for an empty chain).
    pub hash: String,
}

impl From<&Head> for AuditHead {
    fn from(head: &Head) -> AuditHead {
        AuditHead {
            seq: head.seq.unsigned_abs(),
            hash: head.hash.clone(),
        }
    }
}

/// The largest head file read; a real one is [`HEAD_FILE_BYTES`].
const HEAD_FILE_BYTES_MAX: u64 = 8192;

/// How far apart the slots start: a page, so that a write torn at a power loss by a device
/// that garbles the sector or page it writes cannot reach the other slot.
pub(crate) const SLOT_STRIDE: usize = 4096;

/// The size of a head file: the last slot ends it.
const HEAD_FILE_BYTES: usize = SLOT_STRIDE * (N_SLOTS - 1) + SLOT_BYTES;

/// The bytes of one slot, its newline included; a slot's JSON is under 250 bytes.
pub(crate) const SLOT_BYTES: usize = 256;

/// The slots of a head file.
const N_SLOTS: usize = 2;

/// How long a writer waits for another process's lock on the head file before leaving the
/// head as it is (the next saga's end tries again).
pub(crate) const HEAD_LOCK_WAIT: Duration = Duration::from_secs(1);

/// How many times a writer opens the head file again when it was replaced (renamed over)
/// between opening and locking it.
const HEAD_REPLACED_RETRIES: usize = 3;

/// How long a writer sleeps between attempts to lock the head file.
const HEAD_LOCK_RETRY: Duration = Duration::from_millis(1);

/// Tells apart the temporary files of the writers of one process.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// The head file of the database at `db`.
pub(crate) fn head_path(db: &Path) -> PathBuf {
    let mut name = db
        .file_name()
        .map(OsString::from)
        .unwrap_or_else(|| OsString::from("agent-kernel.db"));
    name.push(".audit-head");
    db.with_file_name(name)
}

/// The folder holding `path`, as something `File::open` accepts.
fn folder_of(path: &Path) -> &Path {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

/// The fields of a head, as a JSON object without `sum`.
fn head_document(head: &Head) -> Map<String, Value> {
    let mut document = Map::new();
    document.insert("hash".to_owned(), Value::String(head.hash.clone()));
    if let Some(mac) = &head.mac {
        document.insert("mac".to_owned(), Value::String(mac.clone()));
    }
    document.insert("seq".to_owned(), json!(head.seq));
    document
}

/// One slot holding `head`: its line, padded to [`SLOT_BYTES`].
fn slot(head: &Head) -> Vec<u8> {
    debug_assert!(head.seq >= 0, "a head has a non-negative seq");
    debug_assert!(is_hex_digest(&head.hash), "a head has a hex hash");
    let mut document = head_document(head);
    let sum = sha256_hex(canonical_json(&Value::Object(document.clone())).as_bytes());
    document.insert("sum".to_owned(), Value::String(sum));
    let mut line = canonical_json(&Value::Object(document)).into_bytes();
    assert!(
        line.len() < SLOT_BYTES,
        "a head slot fits in {SLOT_BYTES} bytes"
    );
    line.resize(SLOT_BYTES - 1, b' ');
    line.push(b'\n');
    line
}

/// A slot holding nothing.
fn blank_slot() -> Vec<u8> {
    let mut line = vec![b' '; SLOT_BYTES - 1];
    line.push(b'\n');
    line
}

/// A head from a JSON object's `seq`, `hash` and `mac`, if they are well formed.
fn head_of(document: &Map<String, Value>) -> Option<Head> {
    let seq = document.get("seq")?.as_i64().filter(|seq| *seq >= 0)?;
    let hash = document
        .get("hash")?
        .as_str()
        .filter(|hash| is_hex_digest(hash))?;
    let mac = match document.get("mac") {
        None => None,
        Some(Value::String(mac)) if is_hex_digest(mac) => Some(mac.clone()),
        Some(_) => return None,
    };
    Some(Head {
        seq,
        hash: hash.to_owned(),
        mac,
    })
}

/// What a head file holds.
#[derive(Debug, PartialEq)]
enum Content {
    /// An earlier form (one line, or two adjacent slots): read, and rewritten in the
    /// current form when the head next moves.
    OneLine(Head),
    /// The two-slot form, with the slot that holds the head.
    Slots { head: Head, slot: usize },
}

impl Content {
    fn head(&self) -> &Head {
        match self {
            Content::OneLine(head) | Content::Slots { head, .. } => head,
        }
    }
}

/// Parses a head file's text; `None` when it is not a head file.
fn parse(text: &[u8]) -> Option<Content> {
    if text.len() == HEAD_FILE_BYTES {
        let mut best: Option<(Head, usize)> = None;
        for index in 0..N_SLOTS {
            let start = index * SLOT_STRIDE;
            let Some(head) = parse_slot(&text[start..start + SLOT_BYTES]) else {
                continue;
            };
            if best.as_ref().is_none_or(|(kept, _)| head.seq > kept.seq) {
                best = Some((head, index));
            }
        }
        return best.map(|(head, slot)| Content::Slots { head, slot });
    }
    if text.len() == SLOT_BYTES * N_SLOTS {
        // Two adjacent slots, as a development build wrote them.
        return text
            .chunks(SLOT_BYTES)
            .filter_map(parse_slot)
            .max_by_key(|head| head.seq)
            .map(Content::OneLine);
    }
    let document: Value = serde_json::from_slice(text).ok()?;
    let document = document.as_object()?;
    if document.contains_key("sum") {
        return None;
    }
    head_of(document).map(Content::OneLine)
}

/// One slot's head: `None` for a blank slot, a torn one, or one whose `sum` fails.
fn parse_slot(line: &[u8]) -> Option<Head> {
    let document: Value = serde_json::from_slice(line).ok()?;
    let mut document = document.as_object()?.clone();
    let Some(Value::String(sum)) = document.remove("sum") else {
        return None;
    };
    let head = head_of(&document)?;
    if head_document(&head) != document {
        return None;
    }
    (sha256_hex(canonical_json(&Value::Object(document)).as_bytes()) == sum).then_some(head)
}

/// The bytes of a head file whose head is `head`, in its first slot.
fn file_bytes(head: &Head) -> Vec<u8> {
    let mut text = vec![b' '; HEAD_FILE_BYTES];
    text[..SLOT_BYTES].copy_from_slice(&slot(head));
    text[SLOT_STRIDE - 1] = b'\n';
    text[SLOT_STRIDE..].copy_from_slice(&blank_slot());
    text
}

/// Creates the head file of `db`, naming `head`, unless one exists (another process's, made
/// meanwhile): written whole before it gets its name, so a kill leaves no head file or a
/// whole one, and no temporary file (`create::create_whole`).
///
/// # Errors
///
/// The I/O error.
pub(crate) fn create(db: &Path, head: &Head, durability: Durability) -> std::io::Result<()> {
    crate::create::create_whole(
        &head_path(db),
        &file_bytes(head),
        durability == Durability::Full,
    )
    .map(|_| ())
}

/// Replaces the head file of `db` with one whose head is `head`, whatever it held.
///
/// # Errors
///
/// The I/O error; the previous head file is then left as it was.
pub(crate) fn write(db: &Path, head: &Head, durability: Durability) -> std::io::Result<()> {
    let path = head_path(db);
    let text = file_bytes(head);

    let mut temp_name = path.file_name().map(OsString::from).unwrap_or_default();
    temp_name.push(format!(
        ".tmp-{}-{}",
        std::process::id(),
        TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let temp = path.with_file_name(temp_name);
    let result = (|| {
        // `create_new` never follows a symlink planted at the temporary name.
        // Private like the log itself.
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temp)?;
        file.write_all(&text)?;
        if durability == Durability::Full {
            file.sync_all()?;
        }
        drop(file);
        fs::rename(&temp, &path)?;
        if durability == Durability::Full {
            fs::File::open(folder_of(&path))?.sync_all()?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&temp);
    }
    result
}

/// What [`advance`] did.
#[derive(Debug, PartialEq)]
pub(crate) enum Advance {
    /// The head file now names the new head.
    Moved,
    /// The head file already names a record at or past the new head (another process's).
    AlreadyPast,
    /// There is no head file.
    Missing,
    /// The head file cannot be read, is not a head file, or is not a plain file of its own
    /// (a symbolic link, a hard link): it was left as it is.
    Unusable(String),
    /// The head file names this head, which the chain does not hold as it was.
    Contradicted(Head),
}

/// A head file just moved in place under [`Durability::Full`] whose data is not synced
/// yet: dropping it syncs the data, then releases the advisory lock, so no other writer
/// overwrites the previous head's slot before the new one is durable, and at any moment
/// one slot on the disk holds a whole head. A kill before the drop loses nothing (the write
/// is in the operating system's cache); a power loss before it leaves the previous head.
#[derive(Debug)]
#[must_use = "dropping it syncs the head file; keep it only until the callers are answered"]
pub(crate) struct UnsyncedHead {
    file: fs::File,
    path: PathBuf,
}

impl Drop for UnsyncedHead {
    fn drop(&mut self) {
        if let Err(err) = self.file.sync_data() {
            tracing::warn!(
                path = %self.path.display(),
                error = %err,
                "cannot sync the audit head file; after a power loss `audit verify` may vouch only for the records up to its previous head"
            );
        }
    }
}

/// Moves the head file of `db` forward to `head`, if the head it names is one `holds`
/// confirms (the chain holds that record with that hash; `Err` when it cannot tell) and is
/// older than `head`.
///
/// The file is opened without following a symbolic link, refused if it has other hard
/// links, read and written under an exclusive advisory lock, and written in place (the
/// slot not holding the current head); a head file of the one-line form is replaced by
/// [`write`].
///
/// Under [`Durability::Full`] a head moved in place comes back unsynced and still locked
/// ([`UnsyncedHead`]), for the caller to drop once it has answered whoever waits for the
/// commit: the head file's sync is then off their path.
///
/// # Errors
///
/// The I/O error of writing; the file then still names its previous head in one slot.
pub(crate) fn advance(
    db: &Path,
    head: &Head,
    durability: Durability,
    holds: impl FnOnce(&Head) -> Result<bool, String>,
) -> std::io::Result<(Advance, Option<UnsyncedHead>)> {
    let path = head_path(db);
    // The file may be replaced by a rename (an upgrade from the one-line form, a seal)
    // between opening it and locking it; the lock is then on a file no one reads, so look
    // again.
    for _ in 0..HEAD_REPLACED_RETRIES {
        match advance_once(&path, head)? {
            Step::Replaced => continue,
            Step::Locked(file, content) => {
                return finish(db, file, content, head, durability, holds);
            }
            Step::Done(outcome) => return Ok((outcome, None)),
        }
    }
    Ok((
        Advance::Unusable(format!(
            "the head file {} kept being replaced while it was being moved",
            path.display()
        )),
        None,
    ))
}

/// What one attempt at opening and locking the head file found.
enum Step {
    /// Locked, with what it holds.
    Locked(fs::File, Content),
    /// Replaced by a rename after it was opened.
    Replaced,
    /// Nothing to move, or nothing that may be moved.
    Done(Advance),
}

fn advance_once(path: &Path, head: &Head) -> std::io::Result<Step> {
    let mut file = match fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
    {
        Ok(file) => file,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Step::Done(Advance::Missing));
        }
        Err(err) => {
            return Ok(Step::Done(Advance::Unusable(format!(
                "the head file {} cannot be opened: {err}",
                path.display()
            ))));
        }
    };
    let metadata = file.metadata()?;
    if !metadata.is_file() || metadata.nlink() != 1 {
        return Ok(Step::Done(Advance::Unusable(format!(
            "the head file {} is not a plain file of its own",
            path.display()
        ))));
    }
    // Writers of every process take turns; the lock goes with the file handle. A lock held
    // longer than `HEAD_LOCK_WAIT` (by a stuck or hostile process) leaves the head as it is.
    let waited_since = Instant::now();
    loop {
        match file.try_lock() {
            Ok(()) => break,
            Err(fs::TryLockError::WouldBlock) if waited_since.elapsed() < HEAD_LOCK_WAIT => {
                std::thread::sleep(HEAD_LOCK_RETRY);
            }
            Err(fs::TryLockError::WouldBlock) => {
                return Ok(Step::Done(Advance::Unusable(format!(
                    "the head file {} stayed locked by another process for {HEAD_LOCK_WAIT:?}",
                    path.display()
                ))));
            }
            Err(fs::TryLockError::Error(err)) => return Err(err),
        }
    }
    // Still the file at the path? (Compared after locking: a rename is what changes it.)
    let at_path = fs::symlink_metadata(path);
    if !at_path.is_ok_and(|now| now.ino() == metadata.ino() && now.dev() == metadata.dev()) {
        return Ok(Step::Replaced);
    }
    let mut text = Vec::with_capacity(HEAD_FILE_BYTES);
    (&mut file)
        .take(HEAD_FILE_BYTES_MAX + 1)
        .read_to_end(&mut text)?;
    let Some(content) = parse(&text) else {
        return Ok(Step::Done(Advance::Unusable(format!(
            "the head file {} is not a head file",
            path.display()
        ))));
    };
    if content.head().seq >= head.seq {
        return Ok(Step::Done(Advance::AlreadyPast));
    }
    Ok(Step::Locked(file, content))
}

/// Moves the locked head file `file`, which holds `content`, to `head`.
fn finish(
    db: &Path,
    file: fs::File,
    content: Content,
    head: &Head,
    durability: Durability,
    holds: impl FnOnce(&Head) -> Result<bool, String>,
) -> std::io::Result<(Advance, Option<UnsyncedHead>)> {
    match holds(content.head()) {
        Ok(true) => {}
        Ok(false) => return Ok((Advance::Contradicted(content.head().clone()), None)),
        Err(reason) => return Ok((Advance::Unusable(reason), None)),
    }
    let unsynced = match content {
        Content::OneLine(_) => {
            write(db, head, durability)?;
            None
        }
        Content::Slots { slot: current, .. } => {
            let other = (current + 1) % N_SLOTS;
            file.write_all_at(&slot(head), (other * SLOT_STRIDE) as u64)?;
            (durability == Durability::Full).then(|| UnsyncedHead {
                file,
                path: head_path(db),
            })
        }
    };
    Ok((Advance::Moved, unsynced))
}

/// Whether the head file of `db` exists (as anything, a dangling symlink included).
pub(crate) fn exists(db: &Path) -> bool {
    fs::symlink_metadata(head_path(db)).is_ok()
}

/// Reads the head file of `db`: `Ok(None)` when there is none, `Err(reason)` when it
/// cannot be read or is not a head file.
pub(crate) fn read(db: &Path) -> Result<Option<Head>, String> {
    let path = head_path(db);
    // Never through a symbolic link (a writer would not move it either), and never blocking
    // on a FIFO planted at the path.
    let file = match fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path)
    {
        Ok(file) => file,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) => {
            return Err(format!(
                "the head file {} cannot be read: {err}",
                path.display()
            ));
        }
    };
    if !file.metadata().is_ok_and(|metadata| metadata.is_file()) {
        return Err(format!(
            "the head file {} is not a regular file",
            path.display()
        ));
    }
    let mut text = Vec::new();
    file.take(HEAD_FILE_BYTES_MAX + 1)
        .read_to_end(&mut text)
        .map_err(|err| format!("the head file {} cannot be read: {err}", path.display()))?;
    if text.len() as u64 > HEAD_FILE_BYTES_MAX {
        return Err(format!("the head file {} is too large", path.display()));
    }
    parse(&text)
        .map(|content| Some(content.head().clone()))
        .ok_or_else(|| format!("the head file {} is not a head file", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::ZERO_HASH;

    fn head(seq: i64, digit: &str) -> Head {
        Head {
            seq,
            hash: ZERO_HASH.replace('0', digit),
            mac: (seq % 2 == 0).then(|| ZERO_HASH.replace('0', "b")),
        }
    }

    #[test]
    fn the_head_file_sits_next_to_the_database() {
        assert_eq!(
            head_path(Path::new("/a/b/log.db")),
            Path::new("/a/b/log.db.audit-head")
        );
        assert_eq!(
            head_path(Path::new("log.db")),
            Path::new("log.db.audit-head")
        );
        assert_eq!(folder_of(Path::new("log.db")), Path::new("."));
    }

    #[test]
    fn a_head_round_trips_and_junk_is_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = dir.path().join("log.db");
        assert_eq!(read(&db), Ok(None));
        let written = head(7, "a");
        write(&db, &written, Durability::Full).expect("writes");
        assert_eq!(read(&db), Ok(Some(written)));
        assert_eq!(
            fs::metadata(head_path(&db)).expect("stat").len(),
            HEAD_FILE_BYTES as u64
        );
        let names: Vec<_> = fs::read_dir(dir.path())
            .expect("lists")
            .map(|entry| entry.expect("entry").file_name())
            .collect();
        assert_eq!(names, ["log.db.audit-head"], "no temporary file left");
        let mut blank_pair = vec![b' '; HEAD_FILE_BYTES];
        blank_pair[SLOT_STRIDE - 1] = b'\n';
        blank_pair[SLOT_STRIDE..].copy_from_slice(&blank_slot());
        for junk in [
            b"".to_vec(),
            b"{}".to_vec(),
            b"[1]".to_vec(),
            br#"{"seq": -1, "hash": "00"}"#.to_vec(),
            br#"{"seq": 1, "hash": "XYZ"}"#.to_vec(),
            br#"{"seq": 1, "hash": "0000000000000000000000000000000000000000000000000000000000000000", "mac": 5}"#.to_vec(),
            blank_pair,
        ] {
            fs::write(head_path(&db), &junk).expect("writes");
            assert!(read(&db).is_err(), "{}", String::from_utf8_lossy(&junk));
        }
        fs::write(head_path(&db), vec![b' '; 9000]).expect("writes");
        assert!(read(&db).is_err(), "too large");
    }

    #[test]
    fn a_one_line_head_file_of_an_earlier_build_is_read_and_upgraded() {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = dir.path().join("log.db");
        let old = head(3, "c");
        let line = format!("{}\n", canonical_json(&Value::Object(head_document(&old))));
        fs::write(head_path(&db), line).expect("writes");
        assert_eq!(read(&db), Ok(Some(old.clone())));
        let new = head(9, "d");
        let moved = advance(&db, &new, Durability::Normal, |current| Ok(*current == old))
            .expect("moves")
            .0;
        assert_eq!(moved, Advance::Moved);
        assert_eq!(read(&db), Ok(Some(new)));
        assert_eq!(
            fs::metadata(head_path(&db)).expect("stat").len(),
            HEAD_FILE_BYTES as u64,
            "the two-slot form"
        );
    }

    #[test]
    fn advancing_alternates_slots_and_a_torn_slot_falls_back_to_the_other() {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = dir.path().join("log.db");
        assert_eq!(
            advance(&db, &head(1, "1"), Durability::Full, |_| Ok(true))
                .expect("runs")
                .0,
            Advance::Missing
        );
        write(&db, &head(2, "2"), Durability::Full).expect("writes");
        for (seq, digit) in [(5, "5"), (6, "6"), (11, "e")] {
            let moved = advance(&db, &head(seq, digit), Durability::Full, |_| Ok(true))
                .expect("moves")
                .0;
            assert_eq!(moved, Advance::Moved);
            assert_eq!(read(&db), Ok(Some(head(seq, digit))));
        }
        // Never backwards, and never from a head the chain contradicts.
        assert_eq!(
            advance(&db, &head(8, "8"), Durability::Full, |_| Ok(true))
                .expect("runs")
                .0,
            Advance::AlreadyPast
        );
        assert_eq!(
            advance(&db, &head(12, "f"), Durability::Full, |_| Ok(false))
                .expect("runs")
                .0,
            Advance::Contradicted(head(11, "e"))
        );
        assert_eq!(read(&db), Ok(Some(head(11, "e"))));
        // A chain that cannot be read is not taken for a contradiction.
        assert!(matches!(
            advance(&db, &head(12, "f"), Durability::Full, |_| Err("busy".to_owned()))
                .expect("runs").0,
            Advance::Unusable(reason) if reason == "busy"
        ));

        // A write torn in the newest slot leaves the previous head readable.
        let path = head_path(&db);
        let mut text = fs::read(&path).expect("reads");
        let newest = parse(&text).expect("parses");
        let Content::Slots {
            slot: newest_slot, ..
        } = newest
        else {
            panic!("two slots expected");
        };
        // The whole page that holds the newest slot garbled, as a device that does not
        // write pages atomically could leave it at a power loss.
        let page =
            newest_slot * SLOT_STRIDE..(newest_slot * SLOT_STRIDE + SLOT_STRIDE).min(text.len());
        text[page].fill(0xa5);
        fs::write(&path, &text).expect("writes");
        assert_eq!(read(&db), Ok(Some(head(6, "6"))));
    }

    #[test]
    fn under_full_the_moved_head_is_read_at_once_and_the_file_stays_locked_until_synced() {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = dir.path().join("log.db");
        write(&db, &head(2, "2"), Durability::Full).expect("writes");
        let (moved, unsynced) =
            advance(&db, &head(5, "5"), Durability::Full, |_| Ok(true)).expect("moves");
        assert_eq!(moved, Advance::Moved);
        let unsynced = unsynced.expect("under `Full` the sync is left to the caller");
        // Written already: a reader, or a process that outlives a kill of this one, sees it.
        assert_eq!(read(&db), Ok(Some(head(5, "5"))));
        // No other writer moves it before it is synced.
        let other = fs::File::open(head_path(&db)).expect("opens");
        assert!(matches!(
            other.try_lock(),
            Err(fs::TryLockError::WouldBlock)
        ));
        drop(unsynced);
        other.try_lock().expect("unlocked once synced");
        drop(other);
        // Under `Normal` nothing is synced, so nothing is left to the caller.
        let (moved, unsynced) =
            advance(&db, &head(6, "6"), Durability::Normal, |_| Ok(true)).expect("moves");
        assert_eq!(moved, Advance::Moved);
        assert!(unsynced.is_none());
    }

    #[test]
    fn a_head_file_locked_too_long_is_left_as_it_is() {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = dir.path().join("log.db");
        write(&db, &head(2, "2"), Durability::Normal).expect("writes");
        let holder = fs::File::open(head_path(&db)).expect("opens");
        holder.lock().expect("locks");
        let started = Instant::now();
        let outcome = advance(&db, &head(5, "5"), Durability::Normal, |_| Ok(true))
            .expect("runs")
            .0;
        assert!(
            matches!(outcome, Advance::Unusable(ref reason) if reason.contains("locked")),
            "{outcome:?}"
        );
        assert!(started.elapsed() >= HEAD_LOCK_WAIT);
        drop(holder);
        assert_eq!(read(&db), Ok(Some(head(2, "2"))));
        assert_eq!(
            advance(&db, &head(5, "5"), Durability::Normal, |_| Ok(true))
                .expect("runs")
                .0,
            Advance::Moved
        );
    }

    #[test]
    fn a_head_file_of_adjacent_slots_is_read_and_upgraded() {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = dir.path().join("log.db");
        let old = head(4, "4");
        fs::write(head_path(&db), [slot(&old), blank_slot()].concat()).expect("writes");
        assert_eq!(read(&db), Ok(Some(old.clone())));
        assert_eq!(
            advance(&db, &head(9, "9"), Durability::Normal, |current| Ok(
                *current == old
            ))
            .expect("moves")
            .0,
            Advance::Moved
        );
        assert_eq!(read(&db), Ok(Some(head(9, "9"))));
        assert_eq!(
            fs::metadata(head_path(&db)).expect("stat").len(),
            HEAD_FILE_BYTES as u64
        );
    }

    #[test]
    fn reading_refuses_links_and_fifos_without_blocking() {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = dir.path().join("log.db");
        let elsewhere = dir.path().join("elsewhere.db");
        write(&elsewhere, &head(3, "3"), Durability::Normal).expect("writes");
        std::os::unix::fs::symlink(head_path(&elsewhere), head_path(&db)).expect("links");
        assert!(read(&db).is_err(), "a symbolic link is not a head file");
        fs::remove_file(head_path(&db)).expect("removes");
        let made = std::process::Command::new("mkfifo")
            .arg(head_path(&db))
            .status()
            .expect("mkfifo runs");
        assert!(made.success());
        assert!(read(&db).is_err(), "a FIFO is refused, at once");
    }

    #[test]
    fn advancing_refuses_links() {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = dir.path().join("log.db");
        let elsewhere = dir.path().join("elsewhere");
        write(
            &dir.path().join("other.db"),
            &head(1, "1"),
            Durability::Normal,
        )
        .expect("writes");
        fs::rename(head_path(&dir.path().join("other.db")), &elsewhere).expect("moves");
        let before = fs::read(&elsewhere).expect("reads");

        std::os::unix::fs::symlink(&elsewhere, head_path(&db)).expect("links");
        let symlinked = advance(&db, &head(5, "5"), Durability::Normal, |_| Ok(true))
            .expect("runs")
            .0;
        assert!(matches!(symlinked, Advance::Unusable(_)), "{symlinked:?}");
        fs::remove_file(head_path(&db)).expect("removes");

        fs::hard_link(&elsewhere, head_path(&db)).expect("links");
        let hard_linked = advance(&db, &head(5, "5"), Durability::Normal, |_| Ok(true))
            .expect("runs")
            .0;
        assert!(
            matches!(hard_linked, Advance::Unusable(_)),
            "{hard_linked:?}"
        );
        assert_eq!(
            fs::read(&elsewhere).expect("reads"),
            before,
            "nothing written through"
        );
    }
}
