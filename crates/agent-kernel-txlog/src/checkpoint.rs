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
use std::path::Path;
use std::sync::mpsc;
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

/// The checkpoint thread of one log.
pub(crate) struct Checkpointer {
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    /// Starts the thread and hooks the writer's connection `writer` to it. The thread opens
    /// its connection to the log at `path` (synced as `durability` asks: under either,
    /// SQLite syncs the WAL before a checkpoint and the file after it) the first time it is
    /// needed, so that a log opened for a short command costs one connection, not two.
    ///
    /// # Errors
    ///
    /// [`TxError::Storage`] when the thread cannot be started or the hook set.
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
            })
            .map_err(|err| {
                TxError::Storage(format!("cannot start the checkpoint thread: {err}"))
            })?;
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
                        // Full: the thread is at it already, or pausing.
                        let _ = nudge.try_send(());
                    }
                    Ok(())
                },
            ))
            .map_err(crate::schema::storage)?;
        Ok(Checkpointer {
            thread: Some(thread),
        })
    }

    /// Unhooks the writer's connection `writer`, stops the thread and closes its
    /// connection, so that the writer's is the last one and its closing checkpoints the
    /// whole WAL into the file.
    pub(crate) fn stop(mut self, writer: &mut Connection) {
        // Dropping the hook drops the thread's only sender: the thread ends.
        let _ =
            writer.wal_hook(None::<fn(&mut rusqlite::hooks::Wal, c_int) -> rusqlite::Result<()>>);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A `PASSIVE` checkpoint on the thread's connection: it copies what it can without waiting
/// for the writer or a reader.
fn checkpoint(conn: &Connection) -> Result<(), String> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
        .map_err(|err| err.to_string())
}
