//! One compensating operator action at a time on one log.

use std::path::{Path, PathBuf};
use std::time::Duration;

use agent_kernel_api::TxError;
use agent_kernel_core::KernelError;

/// How long [`OperatorLock::acquire`] waits for another action on the same log to finish.
pub const OPERATOR_LOCK_WAIT: Duration = Duration::from_secs(10);

/// How often a waiting [`OperatorLock::acquire`] tries again.
const OPERATOR_LOCK_RETRY: Duration = Duration::from_millis(50);

/// An exclusive advisory lock on `<db>.operator.lock`, held while `undo`, a dead letter's
/// retry or `prune` acts, so that two of them on one SQLite log never act at once. The
/// operating system releases it when the holder exits, a kill included. A PostgreSQL log
/// needs none: the database orders its writers.
#[derive(Debug)]
pub struct OperatorLock {
    /// The locked file; dropping it releases the lock.
    _file: Option<std::fs::File>,
}

impl OperatorLock {
    /// Takes the lock of the log `db`, waiting up to `wait` for another holder.
    ///
    /// # Errors
    ///
    /// [`KernelError::InvalidRequest`] when another action still holds it after `wait`
    /// (nothing was done); [`KernelError::Log`] when the lock file cannot be opened or locked.
    pub async fn acquire(db: &Path, wait: Duration) -> Result<Self, KernelError> {
        if crate::is_postgres(db) {
            return Ok(Self { _file: None });
        }
        let mut name = db.as_os_str().to_owned();
        name.push(".operator.lock");
        let path = PathBuf::from(name);
        let storage = |what: String| KernelError::Log(TxError::Storage(what));
        let opened = {
            let path = path.clone();
            super::off_thread("opening the lock file", move || {
                std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(&path)
            })
            .await?
        };
        let file = opened.map_err(|error| {
            storage(format!(
                "cannot open the lock file {}: {error}",
                path.display()
            ))
        })?;
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(Self { _file: Some(file) }),
                Err(std::fs::TryLockError::WouldBlock)
                    if tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(OPERATOR_LOCK_RETRY).await;
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(KernelError::InvalidRequest(format!(
                        "another undo or dlq retry is compensating on this log ({} is locked); try again once it has finished; nothing was done",
                        path.display()
                    )));
                }
                Err(std::fs::TryLockError::Error(error)) => {
                    return Err(storage(format!("cannot lock {}: {error}", path.display())));
                }
            }
        }
    }
}
