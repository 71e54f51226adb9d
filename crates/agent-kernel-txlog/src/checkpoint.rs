//! Checkpoints off the write path. SQLite's automatic checkpoint copies the WAL into the
//! database file (and syncs both, under either durability) inside the commit that takes the
//! WAL past 1,000 frames: one commit in about ninety of an agent's calls took 4 – 5 ms where
//! the others took 0.35 (`normal`). Here the writer's commits only tell a thread of its own
//! (SQLite's WAL hook, which replaces the automatic checkpoint): past
//! [`WAL_FRAMES_CHECKPOINT`] frames that thread runs a `PASSIVE` checkpoint on a connection
//! of its own, which never blocks the writer, at most once every [`CHECKPOINT_PAUSE`].
//!
//! The WAL is reused from its start only by a commit that finds every frame copied, which a
//! writer that never rests does not offer the thread. Past
//! [`WAL_FRAMES_CHECKPOINT_INLINE`] frames the writer's commit checkpoints itself, as
//! SQLite's automatic checkpoint did (most frames are copied already), so the WAL stays
//! bounded under any load.

use std::os::raw::c_int;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use agent_kernel_api::{Durability, TxError};
use rusqlite::Connection;
use rusqlite::wal::CheckpointMode;

/// How many frames the WAL holds before the thread checkpoints: SQLite's own threshold.
pub const WAL_FRAMES_CHECKPOINT: c_int = 1_000;

/// How many frames the WAL holds before the writer's commit checkpoints itself.
pub const WAL_FRAMES_CHECKPOINT_INLINE: c_int = 4_096;

/// The least time between two of the thread's checkpoints, so that a WAL the writer keeps
/// filling is not copied (and synced) without pause.
pub const CHECKPOINT_PAUSE: Duration = Duration::from_millis(100);

/// The checkpoint thread of one log, started the first time the WAL grows past
/// [`WAL_FRAMES_CHECKPOINT`] frames: a log opened for a short command starts none.
pub(crate) struct Checkpointer {
    thread: Arc<Mutex<ThreadState>>,
}

/// The checkpoint thread's state.
#[derive(Default)]
enum ThreadState {
    /// Not needed yet.
    #[default]
    NotStarted,
    Running(Running),
    /// It could not be started (said once): the writer's own checkpoints keep the WAL
    /// bounded.
    CannotStart,
}

/// A started checkpoint thread: a nudge asks for a checkpoint; dropping the sender ends it.
struct Running {
    nudge: mpsc::SyncSender<()>,
    thread: JoinHandle<()>,
}

impl Checkpointer {
    /// Hooks the writer's connection `writer`, so that its commits start the thread when
    /// first needed and nudge it after. The thread opens its connection to the log at
    /// `path` (synced as `durability` asks: under either, SQLite syncs the WAL before a
    /// checkpoint and the file after it) when it starts.
    ///
    /// # Errors
    ///
    /// [`TxError::Storage`] when the log's path cannot be resolved or the hook set.
    pub(crate) fn start(
        path: &Path,
        durability: Durability,
        writer: &mut Connection,
    ) -> Result<Checkpointer, TxError> {
        // Absolute now, so that a later change of the working folder (a program's own, a
        // binding's) cannot point the connection opened later at another file.
        let path = std::path::absolute(path).map_err(|err| {
            TxError::Storage(format!(
                "cannot resolve the log's path {}: {err}",
                path.display()
            ))
        })?;
        let thread: Arc<Mutex<ThreadState>> = Arc::default();
        let hooked = Arc::clone(&thread);
        writer
            .wal_hook(Some(
                move |wal: &mut rusqlite::hooks::Wal, frames: c_int| {
                    if frames >= WAL_FRAMES_CHECKPOINT_INLINE {
                        match wal.checkpoint_v2(CheckpointMode::PASSIVE) {
                            // Another checkpoint (the thread's, another process's) holds
                            // its lock: the next commit tries again.
                            Err(error)
                                if error.sqlite_error_code()
                                    == Some(rusqlite::ErrorCode::DatabaseBusy) => {}
                            Err(error) => tracing::warn!(%error, "a checkpoint of the log failed"),
                            Ok(_) => {}
                        }
                    } else if frames >= WAL_FRAMES_CHECKPOINT {
                        nudge(&hooked, &path, durability);
                    }
                    Ok(())
                },
            ))
            .map_err(crate::schema::storage)?;
        Ok(Checkpointer { thread })
    }

    /// Unhooks the writer's connection `writer`, stops the thread, if it started, and closes
    /// its connection, so that the writer's is the last one and its closing checkpoints
    /// the whole WAL into the file.
    pub(crate) fn stop(self, writer: &mut Connection) {
        let _ =
            writer.wal_hook(None::<fn(&mut rusqlite::hooks::Wal, c_int) -> rusqlite::Result<()>>);
        let state = match self.thread.lock() {
            Ok(mut state) => std::mem::take(&mut *state),
            Err(poisoned) => std::mem::take(&mut *poisoned.into_inner()),
        };
        if let ThreadState::Running(Running { nudge, thread }) = state {
            // Dropping the only sender ends the thread.
            drop(nudge);
            let _ = thread.join();
        }
    }
}

/// Asks the thread in `state` for a checkpoint, starting it first if it has not started: a
/// full nudge means the thread is at it already, or pausing.
fn nudge(state: &Mutex<ThreadState>, path: &Path, durability: Durability) {
    let mut state = match state.lock() {
        Ok(state) => state,
        Err(poisoned) => poisoned.into_inner(),
    };
    if matches!(*state, ThreadState::NotStarted) {
        *state = match spawn(path.to_owned(), durability) {
            Ok(running) => ThreadState::Running(running),
            // The writer checkpoints itself past `WAL_FRAMES_CHECKPOINT_INLINE`.
            Err(error) => {
                tracing::warn!(%error, "cannot start the checkpoint thread");
                ThreadState::CannotStart
            }
        };
    }
    if let ThreadState::Running(running) = &*state {
        let _ = running.nudge.try_send(());
    }
}

/// The checkpoint thread, with its connection to the log at `path`.
fn spawn(path: PathBuf, durability: Durability) -> std::io::Result<Running> {
    let (nudge, nudged) = mpsc::sync_channel::<()>(1);
    let thread = thread::Builder::new()
        .name("agent-kernel-checkpoint".into())
        .spawn(move || {
            let mut conn = None;
            while nudged.recv().is_ok() {
                let checkpointed = match &conn {
                    Some(conn) => checkpoint(conn),
                    None => crate::schema::connect_for_checkpoints(&path, durability)
                        .map_err(|err| err.to_string())
                        .and_then(|opened| checkpoint(conn.insert(opened))),
                };
                if let Err(error) = checkpointed {
                    // The next commit asks again (and the writer checkpoints itself past
                    // `WAL_FRAMES_CHECKPOINT_INLINE`); the WAL only grows meanwhile.
                    tracing::warn!(%error, "a checkpoint of the log failed");
                }
                thread::sleep(CHECKPOINT_PAUSE);
            }
        })?;
    Ok(Running { nudge, thread })
}

/// A `PASSIVE` checkpoint on the thread's connection: it copies what it can without waiting
/// for the writer or a reader.
fn checkpoint(conn: &Connection) -> Result<(), String> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
        .map_err(|err| err.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn started(checkpointer: &Checkpointer) -> bool {
        matches!(
            *checkpointer.thread.lock().expect("not poisoned"),
            ThreadState::Running(_)
        )
    }

    /// A short command's commits start no thread; the commit that takes the WAL past
    /// `WAL_FRAMES_CHECKPOINT` frames starts it, and its checkpoint copies the WAL into
    /// the file; stopping ends it.
    #[test]
    fn the_thread_starts_when_the_wal_first_needs_a_checkpoint() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("log.db");
        let mut writer = Connection::open(&path).expect("opens");
        writer
            .pragma_update(None, "journal_mode", "WAL")
            .expect("WAL");
        writer
            .execute_batch("CREATE TABLE t (b BLOB)")
            .expect("a table");
        let checkpointer =
            Checkpointer::start(&path, Durability::Normal, &mut writer).expect("hooked");
        writer
            .execute("INSERT INTO t VALUES (zeroblob(100))", [])
            .expect("a small commit");
        assert!(!started(&checkpointer), "a small commit starts no thread");
        let pages = usize::try_from(WAL_FRAMES_CHECKPOINT).expect("positive") + 100;
        writer
            .execute(
                "INSERT INTO t VALUES (zeroblob(?1))",
                [i64::try_from(pages * 4_096).expect("fits")],
            )
            .expect("a large commit");
        assert!(started(&checkpointer), "past the frames, the thread runs");
        let file_before = std::fs::metadata(&path).expect("the file").len();
        // The thread's checkpoint copies the frames into the file (no reader holds them).
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::fs::metadata(&path).expect("the file").len() == file_before {
            assert!(
                std::time::Instant::now() < deadline,
                "no checkpoint copied the WAL within 10 s"
            );
            thread::sleep(Duration::from_millis(5));
        }
        checkpointer.stop(&mut writer);
    }
}
