//! The agent-kernel write-ahead log, on SQLite.
//!
//! [`SqliteLog`] implements [`agent_kernel_api::TxLog`]: every saga, every step's intent
//! (BEGIN, with what compensation needs), outcome (COMMIT or FAIL) and compensation is a row
//! in an SQLite database in WAL mode, written in transactions that are synced before the
//! saga engine lets an effect run.
//!
//! # Using it alone
//!
//! ```
//! use std::sync::Arc;
//! use agent_kernel_api::{Clock, Durability, TxLog};
//! use agent_kernel_txlog::{LogOptions, SqliteLog};
//!
//! struct FixedClock;
//! impl Clock for FixedClock {
//!     fn now_ms(&self) -> i64 { 1_700_000_000_000 }
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let options = LogOptions { durability: Durability::Full, clock: Arc::new(FixedClock) };
//! let log = SqliteLog::open(&dir.path().join("agent-kernel.db"), options)?;
//! let runtime = tokio::runtime::Builder::new_current_thread().build()?;
//! let sagas = runtime.block_on(log.sagas(20))?;
//! assert!(sagas.is_empty());
//! # Ok(()) }
//! ```
//!
//! # Design
//!
//! - **One owner thread.** A dedicated OS thread owns the connection; async callers send it
//!   jobs over a bounded channel and await a oneshot reply, so no async runtime thread ever
//!   blocks on SQLite.
//!   Each [`TxLog::write`] batch is one `BEGIN IMMEDIATE` transaction.
//! - **Durability.** [`Durability::Full`] sets
//!   `synchronous = FULL`: each committed batch is fsynced before `write` returns, so it
//!   survives power loss.
//!   [`Durability::Normal`] sets `synchronous = NORMAL`:
//!   committed batches survive a crash of the process, not of the machine.
//! - **Refusing what is not a log.** A file that does not start with the SQLite header, or
//!   an SQLite database of another application (its `application_id` differs and it has
//!   tables), is refused with [`TxError::NotALog`] before
//!   anything is written to it.
//!   A log from a newer build is refused with
//!   [`TxError::SchemaTooNew`].
//! - **Schema versions.** `PRAGMA user_version` holds the schema version; migrations run in
//!   order inside one immediate transaction, so concurrent first opens are safe.
//! - **Idempotency keys** are bound, for good, to the hash of the arguments of their first
//!   use (table `idempotency_keys`, key unique). A key is held while its step is BEGIN, COMMIT
//!   or COMPENSATION_FAILED; after FAIL or COMPENSATED it may be claimed again.
//! - **Records are checked** before they are written (a COMMIT must find its step in BEGIN)
//!   and after they are read (states, statuses and JSON must parse; steps have no gaps).
//! - **Audit chain** (schema version 2). Every record the log writes is also chained, in
//!   the same transaction, into the table `audit_log`: one record per [`LogWrite`] and per
//!   successful [`TxLog::take_over`], with a sequence number, its kind, the saga, a body
//!   in canonical JSON (identifiers, states and statuses, error kinds and messages, and
//!   the SHA-256 of arguments, undo data and bytes, outputs and errors — never the bytes
//!   themselves), the previous record's hash and its own SHA-256 hash.
//!   With a key ([`SqliteLog::open_with_audit_key`]) each record also carries an
//!   HMAC-SHA256, so a rewrite of the whole chain by someone without the key is detected.
//!   A version 1 log that holds sagas is migrated with one `Genesis` record that fixes
//!   every saga's state and every step's status at that moment; history before it is not
//!   covered.
//! - **Head file.** The newest sequence number and hash are also kept outside the
//!   database, in `<database file name>.audit-head` next to it ([`audit_head_path`]), in
//!   two checksummed slots, moved in place under an advisory lock (synced under `Full`).
//!   It is written when the chain starts, and moved after each batch that ends a saga (a
//!   terminal `SetState`) or holds an audit event and after each take-over — not after
//!   every step, which would add a sync to each. A writer never moves a head file the chain
//!   contradicts and never recreates a missing one: that is evidence, until an operator
//!   seals the log again ([`SqliteLog::seal`]).
//!   So records written after its last update (an unfinished saga, a crash) can be removed
//!   from the end, with the tables edited to match, without the head file noticing.
//!   The head file must be protected like the database, and copied and backed up with it:
//!   whoever can replace both with an older pair, or rewrite both without the key, is not
//!   detected.
//!   Under `Normal`, a power loss can lose the newest committed batches while the head file
//!   that names them survives; `verify` then reports them missing, which they are.
//! - **Verification.** [`verify`] opens the database read-only and checks the chain, the
//!   head file, and that the tables agree with the chain replayed (so an edit of
//!   `saga_steps` alone is caught). It names the first bad record.
//!
//! Readers go through the same thread; that keeps one view of the database per process.
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

mod audit;
pub mod backend;
mod checkpoint;
mod claims;
mod create;
mod digest;
mod downgrade;
mod floor;
mod head;
mod kinds;
mod records;
mod schema;
mod spill;
pub mod sql;
mod store;
mod transitions;
mod verify;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use agent_kernel_api::{
    ApprovalRecord, AuditEvent, BoxFuture, Clock, DeadLetter, Durability, KeyBinding, LogWrite,
    Owner, SagaId, SagaRecord, SagaState, SagaSummary, TxError, TxLog, WriteOutcome,
};
use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};

pub use audit::{AUDIT_BODY_BYTES_MAX, AUDIT_KEY_BYTES_MAX, AUDIT_KEY_BYTES_MIN, AuditKey};
pub use checkpoint::{CHECKPOINT_PAUSE, WAL_FRAMES_CHECKPOINT, WAL_FRAMES_CHECKPOINT_INLINE};
pub use create::{DB_LINK_HOPS_MAX, resolve_db_path};
#[doc(hidden)]
pub use downgrade::downgrade_in_place;
pub use floor::{FloorReport, measure_commit_floor};
pub use head::AuditHead;
pub use records::{
    AUDIT_RECORDS_DEFAULT, AUDIT_RECORDS_MAX, AuditQuery, AuditRecord, ChainReader,
    audit_record_kinds, audit_records, saga_chains,
};
pub use spill::VERIFY_ENTRIES_IN_MEMORY_MAX;
pub use store::prune::{PRUNE_IDS_BYTES_MAX, PRUNE_SAGAS_MAX};
pub use verify::{AuditReport, BadRecord, verify, verify_bounded, verify_ignoring_head_file};

use crate::audit::AuditSettings;

/// The most jobs that may wait for the writer thread; senders wait when it is full.
pub const WRITER_QUEUE_MAX: usize = 1024;

/// The schema version this build reads and writes.
pub const SCHEMA_VERSION: i64 = schema::SCHEMA_VERSION;

/// The first schema version with the audit chain: an older log has nothing to verify
/// until it is opened (and migrated) once.
pub const AUDIT_SCHEMA_VERSION: i64 = schema::AUDIT_SCHEMA_VERSION;

/// The schema version of the existing log at `path`, read without changing anything.
///
/// # Errors
///
/// As [`verify`]: [`TxError::NotALog`], [`TxError::SchemaTooNew`], or [`TxError::Storage`]
/// when there is no log or it cannot be read.
pub fn schema_version(path: &std::path::Path) -> Result<i64, TxError> {
    schema::open_read_only(&resolve_db_path(path)?).map(|(_, version)| version)
}

/// How a log is opened.
#[derive(Clone)]
pub struct LogOptions {
    /// Sync every batch (`Full`, the default) or only survive process crashes (`Normal`).
    pub durability: Durability,
    /// The clock that stamps records.
    pub clock: Arc<dyn Clock>,
}

/// A job other than a write, run alone on the writer thread.
type Task = Box<dyn FnOnce(&mut Connection, i64) + Send>;

/// What the writer thread runs.
enum Job {
    /// A write the writer commits together with the others ready at the same time (group
    /// commit).
    Group(Grouped),
    /// Anything else, run alone.
    Other(Task),
}

/// A write that shares a group commit.
enum Grouped {
    /// A batch of records.
    Write {
        batch: Vec<LogWrite>,
        reply: oneshot::Sender<Result<Vec<WriteOutcome>, TxError>>,
    },
    /// A take-over (one record when it holds), and the batch it then writes.
    TakeOver {
        request: store::TakeOverRequest,
        reply: oneshot::Sender<Result<bool, TxError>>,
    },
}

impl Grouped {
    /// How many records it may chain.
    fn n_records(&self) -> usize {
        match self {
            Grouped::Write { batch, .. } => batch.len(),
            Grouped::TakeOver { request, .. } => 1 + request.then.len(),
        }
    }

    fn item(&self) -> store::GroupItem<'_> {
        match self {
            Grouped::Write { batch, .. } => store::GroupItem::Batch(batch),
            Grouped::TakeOver { request, .. } => store::GroupItem::TakeOver(request),
        }
    }

    /// Sends `result` to whoever asked; a caller that went away is not waited for.
    fn answer(self, result: Result<store::GroupAnswer, TxError>) {
        let wrong = || TxError::Storage("the log writer answered another kind of write".into());
        match self {
            Grouped::Write { reply, .. } => {
                let _ = reply.send(match result {
                    Ok(store::GroupAnswer::Batch(outcomes)) => Ok(outcomes),
                    Ok(store::GroupAnswer::TakeOver(_)) => Err(wrong()),
                    Err(error) => Err(error),
                });
            }
            Grouped::TakeOver { reply, .. } => {
                let _ = reply.send(match result {
                    Ok(store::GroupAnswer::TakeOver(taken)) => Ok(taken),
                    Ok(store::GroupAnswer::Batch(_)) => Err(wrong()),
                    Err(error) => Err(error),
                });
            }
        }
    }
}

/// The most batches (and take-overs) one group commit takes: each is a savepoint within it.
pub const GROUP_BATCHES_MAX: usize = 64;

/// The most records one group commit takes (a batch is never split: a group holds at least
/// one whole batch, and adds another only while it stays under this).
pub const GROUP_RECORDS_MAX: usize = 1024;

/// How long a batch waits for others to share its commit: none. The writer takes the
/// batches that are already queued when it starts a transaction, and never waits for more.
pub const GROUP_WAIT: Duration = Duration::ZERO;

/// How long the writer polls for the next job before it sleeps.
///
/// A saga sends its next record a few microseconds after the previous one is answered;
/// polling briefly spares that record the cost of waking a sleeping thread, which on these
/// machines is larger than the record's own SQLite work.
pub const WRITER_SPIN: Duration = Duration::from_micros(50);

/// Waits for the next job: polls for up to `spin` ([`WRITER_SPIN`] unless
/// [`SqliteLog::set_spin`] changed it), then sleeps. `None` once every sender is gone.
fn next_job(receiver: &mut mpsc::Receiver<Job>, spin: &Spin) -> Option<Job> {
    let spin = spin.get();
    let spin_started = Instant::now();
    loop {
        match receiver.try_recv() {
            Ok(job) => return Some(job),
            Err(mpsc::error::TryRecvError::Disconnected) => return None,
            Err(mpsc::error::TryRecvError::Empty)
                if !spin.is_zero() && spin_started.elapsed() < spin =>
            {
                std::hint::spin_loop();
            }
            Err(mpsc::error::TryRecvError::Empty) => return receiver.blocking_recv(),
        }
    }
}

/// How long the writer and its callers poll before they sleep, shared by both.
#[derive(Debug)]
struct Spin(AtomicU64);

impl Spin {
    fn new() -> Spin {
        Spin(AtomicU64::new(duration_nanos(WRITER_SPIN)))
    }

    fn get(&self) -> Duration {
        Duration::from_nanos(self.0.load(Ordering::Relaxed))
    }

    fn set(&self, spin: Duration) {
        self.0.store(duration_nanos(spin), Ordering::Relaxed);
    }
}

fn duration_nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// The SQLite transaction log. Cheap to share behind an `Arc`.
pub struct SqliteLog {
    path: PathBuf,
    durability: Durability,
    audit: Arc<AuditSettings>,
    jobs: mpsc::Sender<Job>,
    stats: Arc<GroupStats>,
    /// How long the writer and callers poll before sleeping.
    spin: Arc<Spin>,
    /// Told when the writer has closed its connection, after the last sender is gone.
    closed: oneshot::Receiver<()>,
}

impl std::fmt::Debug for SqliteLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteLog")
            .field("path", &self.path)
            .field("durability", &self.durability)
            .field("audit_key", &self.audit.key.is_some())
            .finish_non_exhaustive()
    }
}

/// The head file of the log at `db`: `<db file name>.audit-head`, in the same folder as the
/// database file (when `db` is a symbolic link, beside the file it leads to).
///
/// It must be protected like the database, and copied, moved and backed up with it.
pub fn audit_head_path(db: &Path) -> PathBuf {
    head::head_path(&resolve_db_path(db).unwrap_or_else(|_| db.to_owned()))
}

/// Every file of the log at `db` (its links followed, as opening it follows them): the
/// database, its `-wal`, `-shm` and `-journal` files, its head file, and the operator
/// console's token (`.console-token`). What the second line keeps from every program.
pub fn log_files(db: &Path) -> Vec<PathBuf> {
    let resolved = resolve_db_path(db).unwrap_or_else(|_| db.to_owned());
    let mut files: Vec<PathBuf> = ["", "-wal", "-shm", "-journal", ".console-token"]
        .iter()
        .map(|suffix| {
            let mut name = resolved.clone().into_os_string();
            name.push(suffix);
            PathBuf::from(name)
        })
        .collect();
    files.push(head::head_path(&resolved));
    files
}

impl SqliteLog {
    /// Opens the log at `path`, creating it if absent, and starts its writer thread.
    ///
    /// This call blocks while the file is checked and migrated; call it before starting an
    /// async runtime or from a blocking task.
    ///
    /// # Errors
    ///
    /// [`TxError::NotALog`] when the file is something else (left untouched),
    /// [`TxError::SchemaTooNew`] when a newer build wrote it, [`TxError::Storage`] when it
    /// cannot be opened.
    pub fn open(path: &Path, options: LogOptions) -> Result<SqliteLog, TxError> {
        SqliteLog::open_with_audit_key(path, options, None)
    }

    /// Opens the log at `path` as [`open`](Self::open) does; with `audit_key`, every audit
    /// record it writes from now on carries a MAC under that key, so that
    /// [`verify`] given the same key detects a rewrite of the whole chain.
    ///
    /// Use the same key from a log's first run on: records written without a key cannot be
    /// verified with one.
    ///
    /// # Errors
    ///
    /// As for [`open`](Self::open).
    pub fn open_with_audit_key(
        path: &Path,
        options: LogOptions,
        audit_key: Option<AuditKey>,
    ) -> Result<SqliteLog, TxError> {
        // The database file itself, beside which its journal and head file live.
        let path = &resolve_db_path(path)?;
        let clock = options.clock.clone();
        let (mut conn, started_chain) =
            schema::open(path, options.durability, audit_key.as_ref(), &|| {
                clock.now_ms()
            })?;
        let audit = Arc::new(AuditSettings {
            key: audit_key,
            db_path: path.to_owned(),
            durability: options.durability,
        });
        // The open that starts the chain (a new log, a migrated one) writes the head file;
        // afterwards the writer moves it forward. A head file missing from a chain that has
        // records is evidence (the newest records may have been deleted with it): it is not
        // recreated here, and the writer leaves it missing, until an operator seals the log.
        // An existing head file is never overwritten here either: if it disagrees with the
        // database, that is for `verify` to report.
        if !head::exists(path) {
            let chain_head = audit::read_head(&conn, audit.key.as_ref())?;
            if started_chain || chain_head.seq == 0 {
                // Without it, every later check would report the chain's head missing.
                audit.create_head(&chain_head).map_err(|err| {
                    TxError::Storage(format!(
                        "cannot write the audit head file {}: {err}",
                        head::head_path(path).display()
                    ))
                })?;
            } else {
                tracing::warn!(
                    path = %head::head_path(path).display(),
                    "the audit head file is missing: run `agent-kernel audit verify`, then `agent-kernel audit seal` once the log is known good"
                );
            }
        }
        // Checkpoints run on a thread of their own, not inside a commit.
        let checkpointer = checkpoint::Checkpointer::start(path, options.durability, &mut conn)?;
        let (jobs, mut receiver) = mpsc::channel::<Job>(WRITER_QUEUE_MAX);
        let clock = options.clock;
        let writer_audit = audit.clone();
        let stats = Arc::new(GroupStats::default());
        let writer_stats = Arc::clone(&stats);
        let (closed_sender, closed) = oneshot::channel();
        let spin = Arc::new(Spin::new());
        let writer_spin = Arc::clone(&spin);
        thread::Builder::new()
            .name("agent-kernel-txlog".into())
            .spawn(move || {
                let mut next = None;
                // The locks begun steps hold, kept from one group to the next.
                let mut claims = store::Claims::default();
                loop {
                    let job = match next.take() {
                        Some(job) => job,
                        None => match next_job(&mut receiver, &writer_spin) {
                            Some(job) => job,
                            None => break,
                        },
                    };
                    match job {
                        Job::Other(job) => job(&mut conn, clock.now_ms()),
                        Job::Group(first) => {
                            let mut n_records = first.n_records();
                            let mut group = vec![first];
                            // Group commit: the writes already queued share the commit.
                            while group.len() < GROUP_BATCHES_MAX {
                                match receiver.try_recv() {
                                    Ok(Job::Group(write))
                                        if n_records + write.n_records() <= GROUP_RECORDS_MAX =>
                                    {
                                        n_records += write.n_records();
                                        group.push(write);
                                    }
                                    Ok(other) => {
                                        next = Some(other);
                                        break;
                                    }
                                    Err(_) => break,
                                }
                            }
                            let items: Vec<store::GroupItem<'_>> =
                                group.iter().map(Grouped::item).collect();
                            let (results, unsynced_head) = store::write_group(
                                &mut conn,
                                &writer_audit,
                                &mut claims,
                                &items,
                                clock.now_ms(),
                            );
                            drop(items);
                            writer_stats.record(group.len(), n_records);
                            for (write, result) in group.into_iter().zip(results) {
                                write.answer(result);
                            }
                            // The head file's sync, after the answers: the records are
                            // durable already; only the head's anchor waits, and for no
                            // longer than this thread takes to come back to the queue.
                            drop(unsynced_head);
                        }
                    }
                }
                // Closing the last connection checkpoints the WAL into the file: done before
                // anyone waiting in `close` goes on.
                checkpointer.stop(&mut conn);
                drop(conn);
                let _ = closed_sender.send(());
            })
            .map_err(|err| TxError::Storage(format!("cannot start the log writer: {err}")))?;
        Ok(SqliteLog {
            path: path.to_owned(),
            durability: options.durability,
            audit,
            jobs,
            stats,
            spin,
            closed,
        })
    }

    /// Closes the log: the writes already queued are committed, then the writer closes its
    /// connection (SQLite checkpoints the WAL into the file then), and only then does this
    /// return. Dropping the log closes it too, but in the background, so a program that
    /// goes on to copy, move or remove the file should close it first.
    pub async fn close(self) {
        drop(self.jobs);
        // An error means the writer is gone already.
        let _ = self.closed.await;
    }

    /// Rebuilds the database file so the space that deletions (a prune) freed is returned
    /// to the file system (SQLite's `VACUUM`); it needs free space about the size of the
    /// log while it runs, and holds the writer meanwhile.
    ///
    /// # Errors
    ///
    /// [`TxError::Storage`] when SQLite cannot vacuum (the disk is full, another connection
    /// holds a read transaction open).
    pub fn vacuum(&self) -> BoxFuture<'_, Result<(), TxError>> {
        self.call(|conn, _| {
            // Then the journal the rebuild went through is emptied, so the file shrinks now.
            conn.execute_batch("VACUUM; PRAGMA wal_checkpoint(TRUNCATE);")
                .map_err(schema::storage)
        })
    }

    /// Sets how long the writer thread polls for the next write, and a caller for its
    /// answer, before sleeping ([`WRITER_SPIN`] by default). Polling spares a saga's next
    /// record the cost of waking a sleeping thread, at the price of a busy core; zero
    /// never polls, for a machine whose cores are all busy with other work (many kernel
    /// processes on few cores), or a caller that waits for each answer on a thread of its
    /// own.
    pub fn set_spin(&self, spin: Duration) {
        self.spin.set(spin);
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The durability mode the log was opened with.
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// Appends `event` (the operator's seal command) to the audit chain and writes the head
    /// file naming it, whatever the head file held: the operator vouches that the log is as
    /// it should be, after [`verify_ignoring_head_file`] found the chain and the tables
    /// consistent. Returns the new head.
    ///
    /// This is how a log whose head file was lost, or disagrees with the database after a
    /// power loss under [`Durability::Normal`], is put back in service: until then the
    /// writer leaves such a head file as it is, so that `verify` keeps reporting it.
    ///
    /// # Errors
    ///
    /// [`TxError`] when the record cannot be written, or [`TxError::Storage`] when the head
    /// file cannot be (the record is then written, and the head file left as it was).
    pub fn seal(&self, event: AuditEvent) -> BoxFuture<'_, Result<AuditHead, TxError>> {
        let audit = self.audit.clone();
        self.call(move |conn, now_ms| store::seal(conn, &audit, &event, now_ms))
    }

    /// Runs `job` on the writer thread and returns its result.
    fn call<T: Send + 'static>(
        &self,
        job: impl FnOnce(&mut Connection, i64) -> Result<T, TxError> + Send + 'static,
    ) -> BoxFuture<'_, Result<T, TxError>> {
        Box::pin(async move {
            let (reply, answer) = oneshot::channel();
            let job = Job::Other(Box::new(move |conn, now_ms| {
                // The caller may have gone away; its answer is then simply dropped.
                let _ = reply.send(job(conn, now_ms));
            }));
            self.jobs.send(job).await.map_err(|_| TxError::Closed)?;
            self.answer(answer).await
        })
    }

    /// Sends `batch` to the writer, which may commit it with others; its outcomes.
    fn send_batch(
        &self,
        batch: Vec<LogWrite>,
    ) -> BoxFuture<'_, Result<Vec<WriteOutcome>, TxError>> {
        Box::pin(self.send_grouped(|reply| Grouped::Write { batch, reply }))
    }

    /// Sends the write `grouped` makes around its reply channel to the writer, which may
    /// commit it with others; its answer.
    async fn send_grouped<T>(
        &self,
        grouped: impl FnOnce(oneshot::Sender<Result<T, TxError>>) -> Grouped,
    ) -> Result<T, TxError> {
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send(Job::Group(grouped(reply)))
            .await
            .map_err(|_| TxError::Closed)?;
        self.answer(answer).await
    }

    /// Waits for the writer's answer: polls briefly, then sleeps.
    async fn answer<T>(&self, answer: oneshot::Receiver<Result<T, TxError>>) -> Result<T, TxError> {
        // Poll briefly before sleeping, as the writer does (see `WRITER_SPIN`): the answer
        // usually comes within tens of microseconds. Yielding lets other tasks run.
        let mut answer = answer;
        let spin = self.spin.get() * 4;
        let spin_started = Instant::now();
        while !spin.is_zero() {
            match answer.try_recv() {
                Ok(result) => return result,
                Err(oneshot::error::TryRecvError::Closed) => return Err(TxError::Closed),
                Err(oneshot::error::TryRecvError::Empty) if spin_started.elapsed() < spin => {
                    tokio::task::yield_now().await;
                }
                Err(oneshot::error::TryRecvError::Empty) => break,
            }
        }
        answer.await.map_err(|_| TxError::Closed)?
    }

    /// How many group commits the writer made, and how many batches and records they held.
    pub fn group_stats(&self) -> GroupCounts {
        self.stats.counts()
    }
}

/// What the writer's group commits held, for `bench`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupCounts {
    /// Transactions that wrote batches.
    pub commits: u64,
    /// Batches they held.
    pub batches: u64,
    /// Records they held.
    pub records: u64,
    /// The most batches one held.
    pub batches_max: u64,
    /// The most records one held (more than [`GROUP_RECORDS_MAX`] only for a batch that
    /// alone is larger: it is never split, and commits alone).
    pub records_max: u64,
}

/// Counters the writer thread keeps.
#[derive(Debug, Default)]
struct GroupStats {
    commits: std::sync::atomic::AtomicU64,
    batches: std::sync::atomic::AtomicU64,
    records: std::sync::atomic::AtomicU64,
    batches_max: std::sync::atomic::AtomicU64,
    records_max: std::sync::atomic::AtomicU64,
}

impl GroupStats {
    fn record(&self, batches: usize, records: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        self.commits.fetch_add(1, Relaxed);
        self.batches.fetch_add(batches as u64, Relaxed);
        self.records.fetch_add(records as u64, Relaxed);
        self.batches_max.fetch_max(batches as u64, Relaxed);
        self.records_max.fetch_max(records as u64, Relaxed);
    }

    fn counts(&self) -> GroupCounts {
        use std::sync::atomic::Ordering::Relaxed;
        GroupCounts {
            commits: self.commits.load(Relaxed),
            batches: self.batches.load(Relaxed),
            records: self.records.load(Relaxed),
            batches_max: self.batches_max.load(Relaxed),
            records_max: self.records_max.load(Relaxed),
        }
    }
}

impl TxLog for SqliteLog {
    fn write(&self, batch: Vec<LogWrite>) -> BoxFuture<'_, Result<Vec<WriteOutcome>, TxError>> {
        self.send_batch(batch)
    }

    fn saga<'a>(
        &'a self,
        saga_id: &'a SagaId,
    ) -> BoxFuture<'a, Result<Option<SagaRecord>, TxError>> {
        let saga_id = saga_id.clone();
        self.call(move |conn, _| store::saga(conn, &saga_id))
    }

    fn saga_records<'a>(
        &'a self,
        saga_ids: &'a [SagaId],
    ) -> BoxFuture<'a, Result<Vec<Option<SagaRecord>>, TxError>> {
        let saga_ids = saga_ids.to_vec();
        // One job: the writer reads them all between two commits, in one read transaction
        // (one snapshot, and one lock of the WAL's read mark instead of one a statement).
        self.call(move |conn, _| {
            let read = conn.unchecked_transaction().map_err(sql::storage)?;
            let records = saga_ids
                .iter()
                .map(|saga_id| store::saga(&*read, saga_id))
                .collect();
            // Nothing was written: ending it gives back the read mark.
            read.rollback().map_err(sql::storage)?;
            records
        })
    }

    fn sagas(&self, limit: u32) -> BoxFuture<'_, Result<Vec<SagaSummary>, TxError>> {
        self.call(move |conn, _| store::sagas(conn, limit))
    }

    fn saga_counts(&self) -> BoxFuture<'_, Result<Vec<(SagaState, u64)>, TxError>> {
        self.call(|conn, _| store::saga_counts(conn))
    }

    fn saga_page<'a>(
        &'a self,
        query: &'a agent_kernel_api::SagaQuery,
    ) -> BoxFuture<'a, Result<Vec<agent_kernel_api::SagaListing>, TxError>> {
        let query = query.clone();
        self.call(move |conn, _| store::saga_page(conn, &query))
    }

    fn unfinished_sagas(&self) -> BoxFuture<'_, Result<Vec<SagaSummary>, TxError>> {
        self.call(|conn, _| store::unfinished_sagas(conn))
    }

    fn prune_candidates(
        &self,
        before_ms: i64,
        after: Option<(i64, SagaId)>,
        limit: u32,
    ) -> BoxFuture<'_, Result<Vec<SagaRecord>, TxError>> {
        self.call(move |conn, _| store::prune::candidates(conn, before_ms, after.as_ref(), limit))
    }

    fn settled_lock_holders(&self) -> BoxFuture<'_, Result<Vec<SagaSummary>, TxError>> {
        self.call(|conn, _| crate::backend::settled_lock_holders(conn))
    }

    fn duplicate_of<'a>(
        &'a self,
        saga_id: &'a SagaId,
        tool_id: &'a str,
        keys: &'a [String],
        since_ms: i64,
    ) -> BoxFuture<'a, Result<Option<agent_kernel_api::DuplicateStep>, TxError>> {
        let (saga_id, tool_id, keys) = (saga_id.clone(), tool_id.to_owned(), keys.to_vec());
        self.call(move |conn, _| {
            crate::backend::duplicate_of(conn, &saga_id, &tool_id, &keys, since_ms)
        })
    }

    fn later_claim<'a>(
        &'a self,
        saga_id: &'a SagaId,
        resource: &'a str,
        since_ms: i64,
    ) -> BoxFuture<'a, Result<Option<agent_kernel_api::LaterClaim>, TxError>> {
        let (saga_id, resource) = (saga_id.clone(), resource.to_owned());
        self.call(move |conn, _| crate::backend::later_claim(conn, &saga_id, &resource, since_ms))
    }

    fn key_binding<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<KeyBinding>, TxError>> {
        let key = key.to_owned();
        self.call(move |conn, _| store::key_binding(conn, &key))
    }

    fn take_over_and_write<'a>(
        &'a self,
        saga_id: &'a SagaId,
        expected_owner: &'a Owner,
        expected_state: SagaState,
        new_owner: &'a Owner,
        then: Vec<LogWrite>,
    ) -> BoxFuture<'a, Result<bool, TxError>> {
        let request = store::TakeOverRequest {
            saga_id: saga_id.clone(),
            expected: expected_owner.clone(),
            expected_state,
            new: new_owner.clone(),
            then,
        };
        // Through the group commit: take-overs queued together (`recover` takes a group of
        // sagas over at once, each with its move to `Compensating`) share one transaction,
        // one sync.
        Box::pin(self.send_grouped(|reply| Grouped::TakeOver { request, reply }))
    }

    fn approval<'a>(
        &'a self,
        approval_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<ApprovalRecord>, TxError>> {
        let approval_id = approval_id.to_owned();
        self.call(move |conn, _| store::approval(conn, &approval_id))
    }

    fn saga_approval<'a>(
        &'a self,
        saga_id: &'a SagaId,
    ) -> BoxFuture<'a, Result<Option<ApprovalRecord>, TxError>> {
        let saga_id = saga_id.clone();
        self.call(move |conn, _| store::saga_approval(conn, &saga_id))
    }

    fn vouched_saga_approval<'a>(
        &'a self,
        saga_id: &'a SagaId,
    ) -> BoxFuture<'a, Result<Option<ApprovalRecord>, TxError>> {
        let saga_id = saga_id.clone();
        let key = self.audit.key.clone();
        self.call(move |conn, _| store::vouched_saga_approval(conn, &saga_id, key.as_ref()))
    }

    fn pending_approvals(&self) -> BoxFuture<'_, Result<Vec<ApprovalRecord>, TxError>> {
        self.call(|conn, _| store::pending_approvals(conn))
    }

    fn dead_letter<'a>(
        &'a self,
        letter_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<DeadLetter>, TxError>> {
        let letter_id = letter_id.to_owned();
        self.call(move |conn, _| store::dead_letter(conn, &letter_id))
    }

    fn open_dead_letters<'a>(
        &'a self,
        saga_id: Option<&'a SagaId>,
    ) -> BoxFuture<'a, Result<Vec<DeadLetter>, TxError>> {
        let saga_id = saga_id.cloned();
        self.call(move |conn, _| store::open_dead_letters(conn, saga_id.as_ref()))
    }
}
