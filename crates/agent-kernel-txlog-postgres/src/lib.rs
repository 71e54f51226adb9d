//! The agent-kernel write-ahead log on PostgreSQL, for many kernel processes on many
//! machines sharing one log.
//!
//! [`PostgresLog`] implements [`agent_kernel_api::TxLog`] with the same records as the
//! SQLite log ([`agent_kernel_txlog::SqliteLog`]): the statements, checks, compare-and-swap
//! conditions and audit records of [`agent_kernel_txlog::backend`], run on a PostgreSQL
//! connection ([`agent_kernel_txlog::sql::Db`]).
//!
//! # Using it alone
//!
//! ```no_run
//! use std::sync::Arc;
//! use agent_kernel_api::{Clock, Durability, TxLog};
//! use agent_kernel_txlog::LogOptions;
//! use agent_kernel_txlog_postgres::{PostgresLog, Worker};
//!
//! struct SystemClock;
//! impl Clock for SystemClock {
//!     fn now_ms(&self) -> i64 { 1_700_000_000_000 }
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let options = LogOptions { durability: Durability::Full, clock: Arc::new(SystemClock) };
//! # let this_process = agent_kernel_api::Owner::detached();
//! let url = "postgres://agent:secret@127.0.0.1:5432/agents";
//! let log = PostgresLog::open(url, options, None, Worker::new(this_process))?;
//! let runtime = tokio::runtime::Builder::new_current_thread().build()?;
//! let unfinished = runtime.block_on(log.unfinished_sagas())?;
//! println!("{} sagas in flight", unfinished.len());
//! # Ok(()) }
//! ```
//!
//! # Design
//!
//! - **One connection, one thread.** Each log opens one connection, owned by a dedicated
//!   OS thread (the `postgres` client, the blocking face of `tokio-postgres`); async callers
//!   send it jobs over a bounded channel and await the answer, so no async runtime thread
//!   ever waits on the database.
//! - **One writer at a time, across every process.** Each write transaction first takes a
//!   transaction-scoped advisory lock of its log (`WRITE_LOCK`, [`write_lock`]; a log in
//!   another schema of the database has its own): batches of every process
//!   apply one after another, as under SQLite's `BEGIN IMMEDIATE`, so every check the
//!   batch makes (a key's binding, an actor's idle, an owner still the expected one) holds
//!   until it commits, and the audit chain is appended by one writer at a time and never
//!   forks.
//! - **Group commit.** The batches and take-overs queued when a write transaction begins
//!   share it (up to [`GROUP_BATCHES_MAX`] of them and [`GROUP_RECORDS_MAX`] records): one
//!   lock, one lease check, one COMMIT. A refused one sends every item of its group to a
//!   transaction of its own, so each gets the answer it would have had alone. The
//!   transaction's audit records go in together, in one statement of arrays, before
//!   anything reads the chain and before the COMMIT. So do, in a group of several items,
//!   the writes every step and saga makes (a saga's and a step's insert, a step's outcome,
//!   a saga's state, the release of its locks): each kind in one statement of arrays, sent
//!   before any other statement and before the COMMIT, in an order that keeps what one
//!   statement after the other would have done. The store is answered at once with the rows
//!   it expects; a statement of arrays that changes other rows keeps the transaction from
//!   committing, and the group is written again item by item, without holding.
//!   [`PostgresLog::stats`] counts transactions and round trips.
//! - **Leases.** Every log is opened for a [`Worker`]: the process that holds sagas through
//!   it, whose lease (a row of `leases`, by the database's clock) a thread of its own
//!   renews. [`TxLog::owner_lease`] answers whether an owner is alive by its lease, whatever
//!   its host: recovery takes over only sagas of expired owners. A lease that ran out is
//!   never renewed, and every write transaction checks the writer's own lease first, under
//!   the write lock: a process paused or cut off past its lease can no longer write to the
//!   sagas another process took over ([`TxError::Fenced`]).
//! - **Durability.** [`Durability::Full`] commits with `synchronous_commit = on`: the
//!   commit is flushed to the server's WAL before `write` returns. A transaction that found
//!   the write lock taken by another writer (and every one for [`CONTENTION_REMEMBERED`]
//!   after) lets go of it before the flush, and then waits for the flush outside the lock
//!   (a synchronous write of its own lease row, whose flush covers every commit before it,
//!   and which concurrent writers share); it answers nothing before. [`Durability::Normal`]
//!   sets `synchronous_commit = off`: a crash of the server may lose the newest commits
//!   (never part of one); a crash of the kernel process loses nothing committed.
//! - **Refusing what is not a log.** A schema (the connection's `current_schema()`) that
//!   holds tables but no `agent_kernel_meta` row naming the log is refused with
//!   [`TxError::NotALog`], a newer schema version with [`TxError::SchemaTooNew`], a trigger
//!   or rule on the log's tables with [`TxError::Tampered`]; nothing is written then.

mod connection;
mod db;
mod head_files;
mod held;
mod lease;
mod records;
mod schema;
mod session;
mod verify;

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;

use agent_kernel_api::{
    ApprovalRecord, AuditEvent, BoxFuture, Clock, DeadLetter, Durability, KeyBinding, LeaseStatus,
    LogWrite, Owner, SagaId, SagaRecord, SagaState, SagaSummary, TxError, TxLog, WriteOutcome,
};
use agent_kernel_txlog::backend::{self, LockMap};
use agent_kernel_txlog::sql::Db;
use agent_kernel_txlog::{AuditHead, AuditKey, GROUP_BATCHES_MAX, GROUP_RECORDS_MAX, LogOptions};
use postgres::Config;
use tokio::sync::{mpsc, oneshot};

pub use crate::connection::{
    APPLICATION_NAME, CONNECT_TIMEOUT, CONNECTION_CHECK_TIMEOUT, CONTENTION_REMEMBERED,
    ConnectionStats, RECONNECT_PAUSE_FIRST, RECONNECT_PAUSE_MAX, RECONNECT_WINDOW,
};
use crate::connection::{
    Answer, BEGIN_WRITE_TRIPS, Began, Connection, Counters, Item, Job, Opening, TakeOver,
    begin_write, open_connection, with_timeouts,
};
pub use crate::db::HELD_BYTES_SENT;
use crate::db::Statements;
use crate::lease::Renewer;
pub use crate::lease::{
    LEASE_DEFAULT, LEASE_MAX, LEASE_MIN, LEASE_ROWS_FORGET_PERIOD, LEASE_ROWS_KEPT,
    RENEWALS_PER_LEASE, Worker,
};
pub use crate::records::{audit_records, holds_log, saga_chains};
use crate::schema::storage;
pub use crate::schema::{SCHEMA_VERSION, WRITE_LOCK_BEFORE_V6, write_lock};
pub use crate::verify::{default_head_file, verify};

/// The most jobs that may wait for the connection's thread; senders wait when it is full.
pub const JOBS_QUEUED_MAX: usize = 1024;

/// Whether `text` names a PostgreSQL database (`postgres://…` or `postgresql://…`) rather
/// than an SQLite file.
pub fn is_postgres_url(text: &str) -> bool {
    let lower = text.get(..13).unwrap_or(text).to_ascii_lowercase();
    lower.starts_with("postgres://") || lower.starts_with("postgresql://")
}

/// The database `url` names, as messages may show it: `postgres://user@host:port/dbname`,
/// with no password and no other parameter; `None` when it does not parse.
pub fn describe_url(url: &str) -> Option<String> {
    Config::from_str(url).ok().map(|config| describe(&config))
}

/// The hosts and ports a URL names, `host:port,host:port`.
pub(crate) fn hosts_of(config: &Config) -> String {
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .zip(config.get_ports().iter().chain(std::iter::repeat(&5432)))
        .map(|(host, port)| match host {
            postgres::config::Host::Tcp(name) => format!("{name}:{port}"),
            postgres::config::Host::Unix(path) => format!("{}:{port}", path.display()),
        })
        .collect();
    hosts.join(",")
}

/// The database a URL names, without its password: `postgres://user@host:port/dbname`.
pub(crate) fn describe(config: &Config) -> String {
    let user = config.get_user().unwrap_or("");
    let hosts = hosts_of(config);
    let dbname = config.get_dbname().unwrap_or(user);
    format!("postgres://{user}@{hosts}/{dbname}")
}

/// The PostgreSQL transaction log. Cheap to share behind an `Arc`.
pub struct PostgresLog {
    target: String,
    durability: Durability,
    jobs: mpsc::Sender<Job>,
    closed: oneshot::Receiver<()>,
    /// Renews this process's lease; stops when the log is dropped.
    renewer: Renewer,
    counters: Arc<Counters>,
    hold_never: Arc<AtomicBool>,
}

impl std::fmt::Debug for PostgresLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresLog")
            .field("target", &self.target)
            .field("durability", &self.durability)
            .finish_non_exhaustive()
    }
}

impl PostgresLog {
    /// Opens the log in the database `url` names (`postgres://user:password@host:port/db`,
    /// any parameter libpq's URLs take), creating its tables in the connection's current
    /// schema when that schema holds none, and starts its connection's thread.
    ///
    /// It takes `worker`'s lease (refused with [`TxError::Fenced`] when that owner's lease
    /// already ran out) and renews it on a thread and a connection of its own, every lease /
    /// [`RENEWALS_PER_LEASE`], until the log is dropped; every write checks it is still
    /// live. Then the lease runs out on its own: the process's unfinished sagas are
    /// another's to recover one lease after it stopped.
    ///
    /// Blocks while it connects and checks the schema; call it before starting an async
    /// runtime or from a blocking task. TLS is not offered: reach the server on loopback,
    /// a Unix socket or a network you trust.
    ///
    /// # Errors
    ///
    /// [`TxError::Storage`] when the URL does not parse or the server cannot be reached or
    /// refuses the login; [`TxError::NotALog`], [`TxError::SchemaTooNew`] or
    /// [`TxError::Tampered`] as the crate documentation describes.
    pub fn open(
        url: &str,
        options: LogOptions,
        audit_key: Option<AuditKey>,
        worker: Worker,
    ) -> Result<PostgresLog, TxError> {
        let config = Config::from_str(url)
            .map_err(|err| TxError::Storage(format!("the database URL does not parse: {err}")))?;
        let target = describe(&config);
        let config = with_timeouts(&config, worker.lease);
        // The blocking client runs a runtime of its own, which must not start inside the
        // caller's: the connection is made on the thread that keeps it.
        let (opened_sender, opened) = std::sync::mpsc::sync_channel(1);
        let (jobs, mut receiver) = mpsc::channel::<Job>(JOBS_QUEUED_MAX);
        let (closed_sender, closed) = oneshot::channel();
        let clock: Arc<dyn Clock> = options.clock;
        let durability = options.durability;
        let thread_target = target.clone();
        let thread_worker = worker.clone();
        let thread_config = config.clone();
        let counters = Arc::new(Counters::default());
        let thread_counters = counters.clone();
        let hold_never = Arc::new(AtomicBool::new(false));
        let thread_hold_never = hold_never.clone();
        thread::Builder::new()
            .name("agent-kernel-txlog-postgres".into())
            .spawn(move || {
                let opened = open_connection(
                    &thread_config,
                    &thread_target,
                    durability,
                    &thread_worker,
                    audit_key.as_ref(),
                    Opening::First,
                );
                let mut connection = match opened {
                    Ok((client, gate, head_file)) => Connection {
                        client,
                        statements: Statements::counting(thread_counters.round_trips.clone()),
                        audit_key,
                        worker: thread_worker,
                        head_file,
                        gate,
                        counters: thread_counters,
                        config: thread_config,
                        target: thread_target,
                        durability,
                        locks: LockMap::default(),
                        hold_never: thread_hold_never,
                    },
                    Err(error) => {
                        let _ = opened_sender.send(Err(error));
                        return;
                    }
                };
                let _ = opened_sender.send(Ok(()));
                // A job taken from the queue while gathering a group, run next.
                let mut next: Option<Job> = None;
                while let Some(job) = next.take().or_else(|| receiver.blocking_recv()) {
                    // The server dropped the connection (a restart, a failover): made again,
                    // the lease checked, before the job runs. If that fails, a write is
                    // answered with why (a lease that ran out: fenced), any other job fails
                    // on the closed connection, and the next job tries again.
                    let mut not_reconnected = None;
                    if connection.client.is_closed() {
                        not_reconnected = connection.reconnect_patiently().err();
                    }
                    match job {
                        Job::Other(job) => job(&mut connection, clock.now_ms()),
                        Job::Grouped(_, reply) if not_reconnected.is_some() => {
                            let _ = reply.send(Err(not_reconnected.take().expect("checked")));
                        }
                        Job::Grouped(item, reply) => {
                            // The items already queued join this one's transaction; none is
                            // waited for.
                            let mut records = item.records();
                            let mut group = vec![(item, reply)];
                            while group.len() < GROUP_BATCHES_MAX {
                                match receiver.try_recv() {
                                    Ok(Job::Grouped(item, reply))
                                        if records + item.records() <= GROUP_RECORDS_MAX =>
                                    {
                                        records += item.records();
                                        group.push((item, reply));
                                    }
                                    Ok(other) => {
                                        next = Some(other);
                                        break;
                                    }
                                    Err(_) => break,
                                }
                            }
                            connection.write_group(group, clock.now_ms());
                        }
                    }
                }
                drop(connection);
                let _ = closed_sender.send(());
            })
            .map_err(|err| TxError::Storage(format!("cannot start the log's thread: {err}")))?;
        opened.recv().map_err(|_| TxError::Closed)??;
        let renewer = Renewer::start(&config, worker)?;
        Ok(PostgresLog {
            target,
            durability: options.durability,
            jobs,
            closed,
            renewer,
            counters,
            hold_never,
        })
    }

    /// Makes every write transaction send its writes of steps and sagas one statement
    /// after the other, as the batches of a refused group are written again: for tests,
    /// which then run every check through that path too.
    #[doc(hidden)]
    pub fn write_without_holding(&self) {
        self.hold_never.store(true, Ordering::Relaxed);
    }

    /// What the log's connection did since the log was opened: write transactions, batches
    /// and round trips to the server (for `agent-kernel bench`).
    pub fn stats(&self) -> ConnectionStats {
        ConnectionStats {
            transactions: self.counters.transactions.load(Ordering::Relaxed),
            batches: self.counters.batches.load(Ordering::Relaxed),
            batches_max: self.counters.batches_max.load(Ordering::Relaxed),
            records: self.counters.records.load(Ordering::Relaxed),
            records_max: self.counters.records_max.load(Ordering::Relaxed),
            round_trips: self.counters.round_trips.load(Ordering::Relaxed),
            contended: self.counters.contended.load(Ordering::Relaxed),
            flushed_after: self.counters.flushed_after.load(Ordering::Relaxed),
        }
    }

    /// Appends `event` (an operator's `audit seal`) to the chain and makes this machine's
    /// head file for this log name it, whatever it held; this machine's head files of
    /// other logs once at the same URL (a database recreated, tables dropped and made
    /// again) are removed. Call once the chain and tables were verified without the head
    /// files ([`verify`] with no head file).
    ///
    /// # Errors
    ///
    /// [`TxError`] when the record cannot be written ([`TxError::Fenced`] once this
    /// process's lease ran out), or [`TxError::Storage`] naming the head file that cannot
    /// be written or removed (the record is then written).
    pub fn seal(&self, event: AuditEvent) -> BoxFuture<'_, Result<AuditHead, TxError>> {
        self.call(move |connection, now_ms| connection.seal(event, now_ms))
    }

    /// The database, as `postgres://user@host:port/db` (no password).
    pub fn target(&self) -> &str {
        &self.target
    }

    /// The durability mode the log was opened with.
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// Whether this process's lease was found run out: from then on every write is refused
    /// ([`TxError::Fenced`]) and the process should stop.
    pub fn lease_lost(&self) -> bool {
        self.renewer.lost()
    }

    /// Closes the log: the jobs already queued run, then the connection is closed, and
    /// only then does this return.
    pub async fn close(self) {
        drop(self.jobs);
        let _ = self.closed.await;
    }

    /// Runs `read` in one snapshot on the connection's thread and returns its result.
    fn read_job<T: Send + 'static>(
        &self,
        read: impl FnOnce(&dyn Db) -> Result<T, TxError> + Send + 'static,
    ) -> BoxFuture<'_, Result<T, TxError>> {
        self.call(move |connection, _| connection.read(read))
    }

    /// Sends `item` to the connection's thread, which may write it with others in one
    /// transaction; its answer, once that transaction committed.
    async fn grouped(&self, item: Item) -> Result<Answer, TxError> {
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send(Job::Grouped(item, reply))
            .await
            .map_err(|_| TxError::Closed)?;
        answer.await.map_err(|_| TxError::Closed)?
    }

    /// Runs `job` on the connection's thread and returns its result.
    fn call<T: Send + 'static>(
        &self,
        job: impl FnOnce(&mut Connection, i64) -> Result<T, TxError> + Send + 'static,
    ) -> BoxFuture<'_, Result<T, TxError>> {
        Box::pin(async move {
            let (reply, answer) = oneshot::channel();
            let job = Job::Other(Box::new(move |connection, now_ms| {
                // The caller may have gone away; its answer is then dropped.
                let _ = reply.send(job(connection, now_ms));
            }));
            self.jobs.send(job).await.map_err(|_| TxError::Closed)?;
            answer.await.map_err(|_| TxError::Closed)?
        })
    }
}

impl TxLog for PostgresLog {
    fn write(&self, batch: Vec<LogWrite>) -> BoxFuture<'_, Result<Vec<WriteOutcome>, TxError>> {
        Box::pin(async move {
            match self.grouped(Item::Write(batch)).await? {
                Answer::Written(outcomes) => Ok(outcomes),
                Answer::TakenOver(_) => Err(TxError::Storage(
                    "a write was answered as a take-over".to_owned(),
                )),
            }
        })
    }

    fn effect_allowed(&self) -> Result<(), TxError> {
        self.renewer
            .certainly_live()
            .map_err(|reason| TxError::Fenced { reason })
    }

    fn saga<'a>(
        &'a self,
        saga_id: &'a SagaId,
    ) -> BoxFuture<'a, Result<Option<SagaRecord>, TxError>> {
        let saga_id = saga_id.clone();
        self.read_job(move |db| backend::saga(db, &saga_id))
    }

    fn saga_records<'a>(
        &'a self,
        saga_ids: &'a [SagaId],
    ) -> BoxFuture<'a, Result<Vec<Option<SagaRecord>>, TxError>> {
        let saga_ids = saga_ids.to_vec();
        // One job on one reading connection, each saga as `saga` reads it.
        self.read_job(move |db| {
            saga_ids
                .iter()
                .map(|saga_id| backend::saga(db, saga_id))
                .collect()
        })
    }

    fn sagas(&self, limit: u32) -> BoxFuture<'_, Result<Vec<SagaSummary>, TxError>> {
        self.read_job(move |db| backend::sagas(db, limit))
    }

    fn saga_counts(&self) -> BoxFuture<'_, Result<Vec<(SagaState, u64)>, TxError>> {
        self.read_job(backend::saga_counts)
    }

    fn saga_page<'a>(
        &'a self,
        query: &'a agent_kernel_api::SagaQuery,
    ) -> BoxFuture<'a, Result<Vec<agent_kernel_api::SagaListing>, TxError>> {
        let query = query.clone();
        self.read_job(move |db| backend::saga_page(db, &query))
    }

    fn unfinished_sagas(&self) -> BoxFuture<'_, Result<Vec<SagaSummary>, TxError>> {
        self.read_job(backend::unfinished_sagas)
    }

    fn settled_lock_holders(&self) -> BoxFuture<'_, Result<Vec<SagaSummary>, TxError>> {
        self.read_job(backend::settled_lock_holders)
    }

    fn duplicate_of<'a>(
        &'a self,
        saga_id: &'a SagaId,
        tool_id: &'a str,
        keys: &'a [String],
        since_ms: i64,
    ) -> BoxFuture<'a, Result<Option<agent_kernel_api::DuplicateStep>, TxError>> {
        let (saga_id, tool_id, keys) = (saga_id.clone(), tool_id.to_owned(), keys.to_vec());
        self.read_job(move |db| backend::duplicate_of(db, &saga_id, &tool_id, &keys, since_ms))
    }

    fn later_claim<'a>(
        &'a self,
        saga_id: &'a SagaId,
        resource: &'a str,
        since_ms: i64,
    ) -> BoxFuture<'a, Result<Option<agent_kernel_api::LaterClaim>, TxError>> {
        let (saga_id, resource) = (saga_id.clone(), resource.to_owned());
        self.read_job(move |db| backend::later_claim(db, &saga_id, &resource, since_ms))
    }

    fn key_binding<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<KeyBinding>, TxError>> {
        let key = key.to_owned();
        self.read_job(move |db| backend::key_binding(db, &key))
    }

    fn take_over_and_write<'a>(
        &'a self,
        saga_id: &'a SagaId,
        expected_owner: &'a Owner,
        expected_state: SagaState,
        new_owner: &'a Owner,
        then: Vec<LogWrite>,
    ) -> BoxFuture<'a, Result<bool, TxError>> {
        let take_over = TakeOver {
            saga_id: saga_id.clone(),
            expected: expected_owner.clone(),
            expected_state,
            new: new_owner.clone(),
            then,
        };
        Box::pin(async move {
            match self.grouped(Item::TakeOver(take_over)).await? {
                Answer::TakenOver(taken) => Ok(taken),
                Answer::Written(_) => Err(TxError::Storage(
                    "a take-over was answered as a write".to_owned(),
                )),
            }
        })
    }

    fn approval<'a>(
        &'a self,
        approval_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<ApprovalRecord>, TxError>> {
        let approval_id = approval_id.to_owned();
        self.read_job(move |db| backend::approval(db, &approval_id))
    }

    fn saga_approval<'a>(
        &'a self,
        saga_id: &'a SagaId,
    ) -> BoxFuture<'a, Result<Option<ApprovalRecord>, TxError>> {
        let saga_id = saga_id.clone();
        self.read_job(move |db| backend::saga_approval(db, &saga_id))
    }

    fn vouched_saga_approval<'a>(
        &'a self,
        saga_id: &'a SagaId,
    ) -> BoxFuture<'a, Result<Option<ApprovalRecord>, TxError>> {
        let saga_id = saga_id.clone();
        self.call(move |connection, _| {
            let key = connection.audit_key.clone();
            connection.read(move |db| backend::vouched_saga_approval(db, &saga_id, key.as_ref()))
        })
    }

    fn pending_approvals(&self) -> BoxFuture<'_, Result<Vec<ApprovalRecord>, TxError>> {
        self.read_job(backend::pending_approvals)
    }

    fn dead_letter<'a>(
        &'a self,
        letter_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<DeadLetter>, TxError>> {
        let letter_id = letter_id.to_owned();
        self.read_job(move |db| backend::dead_letter(db, &letter_id))
    }

    fn open_dead_letters<'a>(
        &'a self,
        saga_id: Option<&'a SagaId>,
    ) -> BoxFuture<'a, Result<Vec<DeadLetter>, TxError>> {
        let saga_id = saga_id.cloned();
        self.read_job(move |db| backend::open_dead_letters(db, saga_id.as_ref()))
    }

    fn owner_lease<'a>(
        &'a self,
        owner: &'a Owner,
    ) -> BoxFuture<'a, Result<Option<LeaseStatus>, TxError>> {
        let owner = owner.clone();
        self.call(move |connection, _| {
            let query = connection.gate.fence.clone();
            connection.counters.trips(1);
            lease::status(&mut connection.client, &query, &owner).map(Some)
        })
    }

    fn lease_left_ms<'a>(
        &'a self,
        owner: &'a Owner,
    ) -> BoxFuture<'a, Result<Option<i64>, TxError>> {
        let owner = owner.clone();
        self.call(move |connection, _| {
            connection.counters.trips(1);
            lease::left_ms(&mut connection.client, &owner)
        })
    }

    fn end_lease<'a>(&'a self, owner: &'a Owner) -> BoxFuture<'a, Result<(), TxError>> {
        let owner = owner.clone();
        self.call(move |connection, _| {
            connection.counters.trips(BEGIN_WRITE_TRIPS + 2);
            let Began {
                mut tx,
                before_flush,
                ..
            } = begin_write(
                &mut connection.client,
                &connection.gate,
                &connection.target,
                &connection.counters,
            )?;
            lease::end(tx.client(), &owner)?;
            tx.commit().map_err(storage)?;
            connection.gate.flushed(
                &mut connection.client,
                &connection.worker,
                &connection.counters,
                before_flush,
            )?;
            connection.counters.committed(0, 0);
            Ok(())
        })
    }

    fn prune_candidates(
        &self,
        before_ms: i64,
        after: Option<(i64, SagaId)>,
        limit: u32,
    ) -> BoxFuture<'_, Result<Vec<SagaRecord>, TxError>> {
        self.read_job(move |db| backend::prune_candidates(db, before_ms, after.as_ref(), limit))
    }
}
