//! The head file: the audit chain's newest sequence number and hash, kept outside the
//! database (`<database file name>.audit-head` in the same folder) so that deleting the
//! newest records, or swapping in an older copy of the database, is detected.
//!
//! It is one line of canonical JSON, `{"hash":"…","mac":"…","seq":n}` (`mac` only with a
//! key), replaced atomically: written to a new temporary file in the same folder (synced
//! with [`Durability::Full`]), renamed over the old one, and the folder synced (with
//! [`Durability::Full`]).

use std::ffi::OsString;
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use agent_kernel_api::Durability;
use serde_json::{Value, json};

use crate::audit::{Head, canonical_json, is_hex_digest};

/// The largest head file read; a real one is under 200 bytes.
const HEAD_FILE_BYTES_MAX: u64 = 4096;

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

/// Replaces the head file of `db` with `head`.
///
/// # Errors
///
/// The I/O error; the previous head file is then left as it was.
pub(crate) fn write(db: &Path, head: &Head, durability: Durability) -> std::io::Result<()> {
    debug_assert!(head.seq >= 0, "a head has a non-negative seq");
    debug_assert!(is_hex_digest(&head.hash), "a head has a hex hash");
    let path = head_path(db);
    let mut document = json!({ "seq": head.seq, "hash": head.hash });
    if let Some(mac) = &head.mac {
        document["mac"] = Value::String(mac.clone());
    }
    let text = format!("{}\n", canonical_json(&document));

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
        let mut file = std::os::unix::fs::OpenOptionsExt::mode(
            fs::OpenOptions::new().write(true).create_new(true),
            0o600,
        )
        .open(&temp)?;
        file.write_all(text.as_bytes())?;
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

/// Whether the head file of `db` exists (as anything, a dangling symlink included).
pub(crate) fn exists(db: &Path) -> bool {
    fs::symlink_metadata(head_path(db)).is_ok()
}

/// Reads the head file of `db`: `Ok(None)` when there is none, `Err(reason)` when it
/// cannot be read or is not a head file.
pub(crate) fn read(db: &Path) -> Result<Option<Head>, String> {
    let path = head_path(db);
    let file = match fs::File::open(&path) {
        Ok(file) => file,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) => {
            return Err(format!(
                "the head file {} cannot be read: {err}",
                path.display()
            ));
        }
    };
    let mut text = String::new();
    file.take(HEAD_FILE_BYTES_MAX + 1)
        .read_to_string(&mut text)
        .map_err(|err| format!("the head file {} cannot be read: {err}", path.display()))?;
    if text.len() as u64 > HEAD_FILE_BYTES_MAX {
        return Err(format!("the head file {} is too large", path.display()));
    }
    let garbled = || format!("the head file {} is not a head file", path.display());
    let document: Value = serde_json::from_str(&text).map_err(|_| garbled())?;
    let seq = document["seq"].as_i64().filter(|seq| *seq >= 0);
    let hash = document["hash"].as_str().filter(|hash| is_hex_digest(hash));
    let mac = match document.get("mac") {
        None => Some(None),
        Some(Value::String(mac)) if is_hex_digest(mac) => Some(Some(mac.clone())),
        Some(_) => None,
    };
    match (seq, hash, mac) {
        (Some(seq), Some(hash), Some(mac)) => Ok(Some(Head {
            seq,
            hash: hash.to_owned(),
            mac,
        })),
        _ => Err(garbled()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::ZERO_HASH;

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
        let head = Head {
            seq: 7,
            hash: ZERO_HASH.replace('0', "a"),
            mac: Some(ZERO_HASH.replace('0', "b")),
        };
        write(&db, &head, Durability::Full).expect("writes");
        assert_eq!(read(&db), Ok(Some(head)));
        let names: Vec<_> = fs::read_dir(dir.path())
            .expect("lists")
            .map(|entry| entry.expect("entry").file_name())
            .collect();
        assert_eq!(names, ["log.db.audit-head"], "no temporary file left");
        for junk in [
            "",
            "{}",
            "[1]",
            r#"{"seq": -1, "hash": "00"}"#,
            r#"{"seq": 1, "hash": "XYZ"}"#,
            r#"{"seq": 1, "hash": "0000000000000000000000000000000000000000000000000000000000000000", "mac": 5}"#,
        ] {
            fs::write(head_path(&db), junk).expect("writes");
            assert!(read(&db).is_err(), "{junk}");
        }
        fs::write(head_path(&db), vec![b' '; 5000]).expect("writes");
        assert!(read(&db).is_err(), "too large");
    }
}
