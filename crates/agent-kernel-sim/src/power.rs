//! Power losses: what a machine keeps of its log when it loses power, by durability.
//!
//! Every log write of a case with a power loss is followed by a note of what the files
//! then held ([`Recorder::record`]): the length of the write-ahead log (SQLite appends a
//! commit's frames to it, and only a checkpoint, which a case's small log never reaches
//! before its processes close it, writes the database file: both are checked), the audit
//! head file's bytes, and how far the world's journal had come. At the power loss the files
//! are put back to those notes ([`Recorder::lose_power`]):
//! - under `full` every commit was synced before its answer, so the last note's log
//!   survives; only the head file may be the one before, when the last write moved it (its
//!   sync follows the answer);
//! - under `normal` no commit was synced since the case began (a commit reaches the OS, not
//!   the disk; the head file is never synced), so the write-ahead log keeps a prefix of its
//!   commits, any, and the head file any version written since, each as the fault says:
//!   SQLite's frame checksums make what survives a prefix, whatever pages the OS wrote back.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::Context as _;

use crate::process::FaultKind;
use crate::with_suffix;
use crate::world::World;

/// What a power loss left of a case's log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PowerLoss {
    /// Its durability was `full`.
    pub full: bool,
    /// How many of the log's writes survived.
    pub writes_kept: usize,
    /// How many the log had.
    pub writes: usize,
    /// Whether the head file named a record the log lost, so that `audit verify` reported
    /// it and the operator sealed the log before recovering.
    pub head_ahead: bool,
    /// Whether the head file was older than the log kept (which `audit verify` accepts).
    pub head_behind: bool,
    /// How many effects and compensations the world shows whose records were lost (to the
    /// kernel, changes it never made).
    pub unlogged: usize,
}

/// What the files held after one write.
#[derive(Debug, Clone)]
struct Note {
    /// The write-ahead log's length.
    wal_len: u64,
    /// The audit head file's bytes (empty when it is missing).
    head: Vec<u8>,
    /// How many events the world's journal held.
    journal_len: usize,
}

/// The notes of one case's log, taken after each write.
pub(crate) struct Recorder {
    db: PathBuf,
    wal: PathBuf,
    head: PathBuf,
    world: Arc<World>,
    notes: Mutex<Notes>,
}

#[derive(Default)]
struct Notes {
    taken: Vec<Note>,
    /// The first file that could not be read, or a write no note follows: the harness is
    /// broken, not the engine.
    broken: Option<String>,
}

impl Recorder {
    /// Notes what the log at `db` holds now, as the case begins (its files synced: the
    /// empty log was copied before any process opened it).
    pub(crate) fn new(db: &Path, world: Arc<World>) -> Recorder {
        let recorder = Recorder {
            db: db.to_owned(),
            wal: with_suffix(db, "-wal"),
            head: agent_kernel_txlog::audit_head_path(db),
            world,
            notes: Mutex::new(Notes::default()),
        };
        recorder.record();
        recorder
    }

    /// Notes what the files hold after a write.
    pub(crate) fn record(&self) {
        let note = read_or_empty(&self.wal)
            .map(|wal| wal.len() as u64)
            .and_then(|wal_len| {
                Ok(Note {
                    wal_len,
                    head: read_or_empty(&self.head)?,
                    journal_len: self.world.journal_len(),
                })
            });
        let mut notes = self.lock();
        match note {
            Ok(note) => notes.taken.push(note),
            Err(err) => {
                notes
                    .broken
                    .get_or_insert(format!("a note of the log's files failed: {err}"));
            }
        }
    }

    /// Before a write: the write-ahead log is as the last note left it (no write went
    /// unnoted).
    pub(crate) fn expect_unchanged(&self) {
        let now = std::fs::metadata(&self.wal).map_or(0, |meta| meta.len());
        let mut notes = self.lock();
        let noted = notes.taken.last().map_or(0, |note| note.wal_len);
        if now != noted {
            notes.broken.get_or_insert(format!(
                "the write-ahead log grew from {noted} to {now} bytes with no note: a write the simulator did not see"
            ));
        }
    }

    /// The write-ahead log's bytes now: read before the processes close the log, which
    /// checkpoints it into the database file and removes it. Checks first that the database
    /// file is still `empty`'s copy: no checkpoint wrote it during the case.
    pub(crate) fn wal_now(&self, empty: &Path) -> anyhow::Result<Vec<u8>> {
        anyhow::ensure!(
            std::fs::read(&self.db).context("reading the database file")?
                == std::fs::read(empty).context("reading the empty log")?,
            "the database file changed during the case (a checkpoint): a power loss cannot be placed"
        );
        read_or_empty(&self.wal).context("reading the write-ahead log")
    }

    /// Puts the files back to what the power loss `kind` leaves, the log's processes
    /// closed: the database file as the case began (`empty`), the write-ahead log `wal` (as
    /// [`wal_now`](Self::wal_now) read it) cut to the commits kept, the head file as kept.
    /// Returns what was lost, and the span of the world's journal whose records the log
    /// lost (from the last write kept to the power loss).
    pub(crate) fn lose_power(
        &self,
        kind: FaultKind,
        empty: &Path,
        wal: &[u8],
    ) -> anyhow::Result<(PowerLoss, Range<usize>)> {
        let notes = {
            let notes = self.lock();
            if let Some(broken) = &notes.broken {
                anyhow::bail!("{broken}");
            }
            notes.taken.clone()
        };
        let last = notes.len() - 1;
        anyhow::ensure!(
            notes
                .windows(2)
                .all(|pair| pair[1].wal_len >= pair[0].wal_len),
            "the write-ahead log shrank during the case (a checkpoint): a power loss cannot be placed"
        );
        anyhow::ensure!(
            notes[last].wal_len == wal.len() as u64,
            "the write-ahead log holds {} bytes, where the last write left {}",
            wal.len(),
            notes[last].wal_len
        );
        let back = |by: u16| last - usize::from(by).min(last);
        let (kept, head) = match kind {
            FaultKind::PowerLossFull { head_behind } => {
                // Every commit is synced; the head file's last move may not be.
                let moved_last = last > 0 && notes[last].head != notes[last - 1].head;
                (
                    last,
                    if head_behind && moved_last {
                        last - 1
                    } else {
                        last
                    },
                )
            }
            FaultKind::PowerLossNormal {
                writes_lost,
                head_back,
            } => (back(writes_lost), back(head_back)),
            other => anyhow::bail!("{other:?} is not a power loss"),
        };
        let wal_len = usize::try_from(notes[kept].wal_len).context("the WAL's length")?;
        check_commit_boundary(wal, wal_len)?;
        std::fs::copy(empty, &self.db).context("putting the database file back")?;
        let _ = std::fs::remove_file(with_suffix(&self.db, "-shm"));
        if wal_len == 0 {
            let _ = std::fs::remove_file(&self.wal);
        } else {
            std::fs::write(&self.wal, &wal[..wal_len]).context("cutting the write-ahead log")?;
        }
        if notes[head].head.is_empty() {
            let _ = std::fs::remove_file(&self.head);
        } else {
            std::fs::write(&self.head, &notes[head].head).context("putting the head file back")?;
        }
        let differs = notes[head].head != notes[kept].head;
        let loss = PowerLoss {
            full: matches!(kind, FaultKind::PowerLossFull { .. }),
            writes_kept: kept,
            writes: last,
            head_ahead: head > kept && differs,
            head_behind: head < kept && differs,
            unlogged: 0,
        };
        Ok((loss, notes[kept].journal_len..self.world.journal_len()))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Notes> {
        self.notes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A file's bytes, or none when it is missing.
fn read_or_empty(path: &Path) -> std::io::Result<Vec<u8>> {
    match std::fs::read(path) {
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        read => read,
    }
}

/// The size of the header of SQLite's write-ahead log, and of each frame's header.
const WAL_HEADER_BYTES: usize = 32;
const FRAME_HEADER_BYTES: usize = 24;

/// Checks that the write-ahead log `wal` cut at `len` ends on a commit: at a whole frame
/// whose header gives the database's size (nonzero only in a transaction's last frame).
fn check_commit_boundary(wal: &[u8], len: usize) -> anyhow::Result<()> {
    if len == 0 {
        return Ok(());
    }
    let word = |at: usize| {
        wal.get(at..at + 4)
            .map(|bytes| u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    };
    let page_size = word(8).context("the write-ahead log has no header")? as usize;
    let frame = FRAME_HEADER_BYTES + page_size;
    anyhow::ensure!(
        len >= WAL_HEADER_BYTES + frame && (len - WAL_HEADER_BYTES).is_multiple_of(frame),
        "a write left the write-ahead log at {len} bytes, not at the end of a frame"
    );
    let commit_size = word(len - frame + 4).context("the last frame kept")?;
    anyhow::ensure!(
        commit_size != 0,
        "a write left the write-ahead log at {len} bytes, inside a transaction"
    );
    Ok(())
}
