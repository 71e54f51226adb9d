//! The raw floor the kernel is measured against: plain SQLite commits, no kernel.

use std::path::Path;
use std::time::{Duration, Instant};

use agent_kernel_api::{Durability, TxError};
use rusqlite::{TransactionBehavior, params};

use crate::sql::storage;

/// What [`measure_commit_floor`] measured.
#[derive(Debug, Clone, PartialEq)]
pub struct FloorReport {
    /// How many transactions were committed.
    pub n_commits: usize,
    /// Wall time for all of them.
    pub elapsed: Duration,
    /// The latency of each commit, in microseconds, in the order they ran.
    pub latencies_us: Vec<u64>,
}

/// Commits `n_commits` transactions of one `payload_bytes`-byte row each into a fresh
/// database at `path`, opened with exactly the pragmas a log uses (WAL, the same
/// `synchronous` level, the same busy timeout), one after another on one connection.
///
/// This is the floor under the kernel's per-step cost: a step needs one such commit in
/// steady state, so the kernel's overhead is its step latency over this commit latency.
///
/// # Errors
///
/// [`TxError`] when the database cannot be created or written, or when `path` already
/// holds something other than an agent-kernel log.
pub fn measure_commit_floor(
    path: &Path,
    durability: Durability,
    n_commits: usize,
    payload_bytes: usize,
) -> Result<FloorReport, TxError> {
    // Only a migrated log holding sagas asks for the time (for its genesis audit record).
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| {
                i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX)
            })
    };
    let (mut conn, _) = crate::schema::open(path, durability, None, &now_ms)?;
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS floor_commits (id INTEGER PRIMARY KEY, payload TEXT NOT NULL)",
    )
    .map_err(storage)?;
    let payload = "x".repeat(payload_bytes);
    let mut latencies_us = Vec::with_capacity(n_commits);
    let started = Instant::now();
    for _ in 0..n_commits {
        let commit_started = Instant::now();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(storage)?;
        tx.execute(
            "INSERT INTO floor_commits (payload) VALUES (?1)",
            params![payload],
        )
        .map_err(storage)?;
        tx.commit().map_err(storage)?;
        latencies_us.push(u64::try_from(commit_started.elapsed().as_micros()).unwrap_or(u64::MAX));
    }
    Ok(FloorReport {
        n_commits,
        elapsed: started.elapsed(),
        latencies_us,
    })
}
