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
//!   transaction-scoped advisory lock (`WRITE_LOCK`): batches of every process
//!   apply one after another, as under SQLite's `BEGIN IMMEDIATE`, so every check the
//!   batch makes (a key's binding, an actor's idle, an owner still the expected one) holds
//!   until it commits, and the audit chain is appended by one writer at a time and never
//!   forks.
//! - **Leases.** Every log is opened for a [`Worker`]: the process that holds sagas through
//!   it, whose lease (a row of `leases`, by the database's clock) a thread of its own
//!   renews. [`TxLog::owner_lease`] answers whether an owner is alive by its lease, whatever
//!   its host: recovery takes over only sagas of expired owners. A lease that ran out is
//!   never renewed, and every write transaction checks the writer's own lease first, under
//!   the write lock: a process paused or cut off past its lease can no longer write to the
//!   sagas another process took over ([`TxError::Fenced`]).
//! - **Durability.** [`Durability::Full`] commits with `synchronous_commit = on`: the
//!   commit is flushed to the server's WAL before `write` returns. [`Durability::Normal`]
//!   sets `synchronous_commit = off`: a crash of the server may lose the newest commits
//!   (never part of one); a crash of the kernel process loses nothing committed.
//! - **Refusing what is not a log.** A schema (the connection's `current_schema()`) that
//!   holds tables but no `agent_kernel_meta` row naming the log is refused with
//!   [`TxError::NotALog`], a newer schema version with [`TxError::SchemaTooNew`], a trigger
//!   or rule on the log's tables with [`TxError::Tampered`]; nothing is written then.

mod db;
mod lease;
mod schema;

use std::str::FromStr;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use agent_kernel_api::{
    ApprovalRecord, BoxFuture, Clock, DeadLetter, Durability, KeyBinding, LeaseStatus, LogWrite,
    Owner, SagaId, SagaRecord, SagaState, SagaSummary, TxError, TxLog, WriteOutcome,
};
use agent_kernel_txlog::backend::{self, Chain, HeadFile};
use agent_kernel_txlog::sql::Db;
use agent_kernel_txlog::{AuditKey, AuditReport, LogOptions};
use postgres::{Client, Config, IsolationLevel, NoTls};
use tokio::sync::{mpsc, oneshot};

use crate::db::{PgDb, Statements};
use crate::lease::Renewer;
pub use crate::lease::{LEASE_DEFAULT, LEASE_MAX, LEASE_MIN, RENEWALS_PER_LEASE, Worker};
pub use crate::schema::SCHEMA_VERSION;
use crate::schema::{WRITE_LOCK, storage};

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
fn hosts_of(config: &Config) -> String {
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
fn describe(config: &Config) -> String {
    let user = config.get_user().unwrap_or("");
    let hosts = hosts_of(config);
    let dbname = config.get_dbname().unwrap_or(user);
    format!("postgres://{user}@{hosts}/{dbname}")
}

/// Connects to the database `config` names, sets the durability and checks the schema.
fn connect(
    config: &Config,
    target: &str,
    durability: Durability,
    lease: Duration,
) -> Result<Client, TxError> {
    let mut client = config
        .connect(NoTls)
        .map_err(|err| TxError::Storage(format!("cannot connect to {target}: {err}")))?;
    let synchronous = match durability {
        Durability::Full => "on",
        Durability::Normal => "off",
    };
    // A session paused or cut off inside a transaction (holding `WRITE_LOCK`) is ended by
    // the server once it has been idle for a lease, so it never blocks the other writers
    // for longer than it would stay alive.
    client
        .batch_execute(&format!(
            "SET synchronous_commit = {synchronous}; SET idle_in_transaction_session_timeout = {}",
            lease.as_millis()
        ))
        .map_err(storage)?;
    schema::prepare(&mut client, target)?;
    Ok(client)
}

/// How long connecting to the server may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// `config` with the timeouts every connection of the log uses: [`CONNECT_TIMEOUT`], and TCP
/// keepalives after a lease of silence, so a server that vanished is noticed.
fn with_timeouts(config: &Config, lease: Duration) -> Config {
    let mut config = config.clone();
    config
        .connect_timeout(CONNECT_TIMEOUT)
        .keepalives(true)
        .keepalives_idle(lease.max(Duration::from_secs(1)));
    config
}

/// The log's connection, its statements and this machine's head file, made (or made
/// again, after the server dropped the connection): connected, the schema checked, the
/// worker's lease taken (refused once it ran out).
fn open_connection(
    config: &Config,
    target: &str,
    durability: Durability,
    worker: &Worker,
    audit_key: Option<&AuditKey>,
) -> Result<
    (
        Client,
        postgres::Statement,
        postgres::Statement,
        Option<HeadFile>,
    ),
    TxError,
> {
    let mut client = connect(config, target, durability, worker.lease)?;
    lease::acquire(&mut client, worker)?;
    let lock = client
        .prepare("SELECT pg_advisory_xact_lock($1)")
        .map_err(storage)?;
    let fence = client.prepare(&lease::status_sql()).map_err(storage)?;
    let head_file = worker
        .head_file
        .as_deref()
        .map(|path| head_file_at(path, audit_key.cloned(), durability))
        .transpose()?;
    if let Some(head_file) = &head_file {
        let mut tx = snapshot(&mut client)?;
        head_file.create_if_missing(&PgDb::new(&mut tx, &Statements::default()))?;
        tx.commit().map_err(storage)?;
    }
    Ok((client, lock, fence, head_file))
}

/// Verifies the audit chain of the log `url` names, read-only, in one snapshot: every
/// record's form, hash, link and (under `key`) MAC, then the tables against a replay of the
/// chain ([`agent_kernel_txlog::verify`]'s checks 1 and 3). A trigger or rule on the log's
/// tables is reported at record 0, before any row is read. With `head_file` (this machine's,
/// [`Worker::head_file`]) the head it names must be in the chain, with its hash and MAC
/// (check 2), read before the chain; without one, or when this machine has none (it never
/// wrote the log), records removed from the end, with the tables edited to match, go
/// unseen. An empty schema, where no log was created yet,
/// verifies with no records.
///
/// Blocks (on a thread of its own) while it reads.
///
/// # Errors
///
/// [`TxError::Storage`] when the URL does not parse or the server cannot be reached;
/// [`TxError::NotALog`] or [`TxError::SchemaTooNew`] as [`PostgresLog::open`].
pub fn verify(
    url: &str,
    key: Option<&AuditKey>,
    head_file: Option<&std::path::Path>,
) -> Result<AuditReport, TxError> {
    let config = Config::from_str(url)
        .map_err(|err| TxError::Storage(format!("the database URL does not parse: {err}")))?;
    let target = describe(&config);
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                // This machine's head file, read before the snapshot begins: a writer moves
                // it only after it commits, so a log in use never looks cut. A machine that
                // never wrote the log has none: that is no evidence here, where each
                // machine's file vouches only for what it saw.
                let anchor = match head_file.filter(|path| path.symlink_metadata().is_ok()) {
                    Some(path) => {
                        let file = head_file_at(path, key.cloned(), Durability::Full)?;
                        let read = file.read();
                        Some((file, read))
                    }
                    None => None,
                };
                let mut client = config.connect(NoTls).map_err(|err| {
                    TxError::Storage(format!("cannot connect to {target}: {err}"))
                })?;
                let mut tx = snapshot(&mut client)?;
                let inspected = schema::inspect(&mut tx, &target)?;
                let empty = AuditReport {
                    n_records: 0,
                    head: None,
                    head_file: None,
                    macs_verified: key.is_some(),
                    n_records_with_mac: 0,
                    first_bad: None,
                };
                match inspected {
                    schema::Inspected::Log => {}
                    // No log yet: nothing recorded, nothing to check.
                    schema::Inspected::Empty => return Ok(empty),
                    schema::Inspected::Tampered(reason) => {
                        return Ok(AuditReport {
                            first_bad: Some(agent_kernel_txlog::BadRecord {
                                seq: 0,
                                reason: format!("the schema is not this build's: {reason}"),
                            }),
                            ..empty
                        });
                    }
                }
                let statements = Statements::default();
                let db = PgDb::new(&mut tx, &statements);
                match anchor {
                    Some((file, read)) => file.verify(&db, key, read),
                    None => backend::verify_chain_and_tables(&db, key),
                }
            })
            .join()
            .map_err(|_| TxError::Storage("the verification thread panicked".to_owned()))?
    })
}

/// The name every head file ends with.
const HEAD_FILE_SUFFIX: &str = ".audit-head";

/// The head file at `path` (which must end with `.audit-head`), its folder created.
fn head_file_at(
    path: &std::path::Path,
    key: Option<AuditKey>,
    durability: Durability,
) -> Result<HeadFile, TxError> {
    let text = path.to_string_lossy();
    let Some(base) = text
        .strip_suffix(HEAD_FILE_SUFFIX)
        .filter(|base| !base.is_empty())
    else {
        return Err(TxError::Storage(format!(
            "the audit head file {} must be named `<name>{HEAD_FILE_SUFFIX}`",
            path.display()
        )));
    };
    if let Some(folder) = path
        .parent()
        .filter(|folder| !folder.as_os_str().is_empty())
    {
        std::fs::create_dir_all(folder).map_err(|err| {
            TxError::Storage(format!(
                "cannot create the folder {}: {err}",
                folder.display()
            ))
        })?;
    }
    Ok(HeadFile::new(std::path::Path::new(base), key, durability))
}

/// Where this machine keeps its head file for the log `url` names, unless told otherwise:
/// `$XDG_STATE_HOME/agent-kernel/` (else `~/.local/state/agent-kernel/`), named after the
/// SHA-256 of the hosts, database and options (so two logs, even two schemas of one
/// database, never share one, whichever role connects; a host spelled otherwise, such as
/// `localhost` for `127.0.0.1`, is another file). `None` without a home folder, or for a URL that does not parse.
pub fn default_head_file(url: &str) -> Option<std::path::PathBuf> {
    use sha2::Digest as _;
    let config = Config::from_str(url).ok()?;
    let state = std::env::var_os("XDG_STATE_HOME")
        .filter(|dir| !dir.is_empty())
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|dir| !dir.is_empty())
                .map(|home| std::path::Path::new(&home).join(".local/state"))
        })?;
    // The database and schema, not the role: an auditor connecting as another role finds
    // the writers' file.
    let hosts = hosts_of(&config);
    let identity = format!(
        "{}/{}?{}",
        hosts,
        config.get_dbname().or(config.get_user()).unwrap_or(""),
        config.get_options().unwrap_or("")
    );
    let digest = sha2::Sha256::digest(identity.as_bytes());
    let name: String = digest[..12]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    Some(
        state
            .join("agent-kernel")
            .join(format!("postgres-{name}{HEAD_FILE_SUFFIX}")),
    )
}

/// A job, run on the connection's thread with the connection and the clock's time.
type Job = Box<dyn FnOnce(&mut Connection, i64) + Send>;

/// What the connection's thread holds.
struct Connection {
    client: Client,
    statements: Statements,
    audit_key: Option<AuditKey>,
    /// The process writing through this connection, whose lease every write checks.
    worker: Worker,
    /// This machine's anchor of the chain's head, when it keeps one.
    head_file: Option<HeadFile>,
    /// `WRITE_LOCK` taken, prepared once.
    lock: postgres::Statement,
    /// [`lease::status_sql`], prepared once.
    fence: postgres::Statement,
}

/// A read-only, repeatable-read snapshot on `client`: every read of the log sees one
/// moment.
fn snapshot(client: &mut Client) -> Result<postgres::Transaction<'_>, TxError> {
    client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .map_err(storage)
}

/// Moves this machine's head file, when it keeps one, to `chain`'s newest record, just
/// committed (a batch that ended a saga or held an audit event, or a take-over), checked in
/// a new snapshot.
fn advance_head_file(
    client: &mut Client,
    statements: &Statements,
    head_file: Option<&HeadFile>,
    chain: &Chain<'_>,
) {
    let Some(head_file) = head_file else {
        return;
    };
    // Without a snapshot the head file stays where it was; `audit verify` vouches up to it.
    if let Ok(mut tx) = snapshot(client) {
        head_file.advance(&PgDb::new(&mut tx, statements), chain);
        let _ = tx.commit();
    }
}

/// Begins a write transaction on `client`: after every other writer's (`lock` takes
/// `WRITE_LOCK`), and only while `worker`'s lease is live (`fence`). Once it ran out,
/// another process may have taken its sagas over: the write is refused
/// ([`TxError::Fenced`]).
fn begin_write<'c>(
    client: &'c mut Client,
    lock: &postgres::Statement,
    fence: &postgres::Statement,
    worker: &Worker,
) -> Result<postgres::Transaction<'c>, TxError> {
    // Read committed, whatever the server's default: each statement then reads what the
    // writers before this one committed, once the lock is granted.
    let mut tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::ReadCommitted)
        .start()
        .map_err(storage)?;
    tx.execute(lock, &[&WRITE_LOCK]).map_err(storage)?;
    match lease::status(&mut tx, fence, &worker.owner)? {
        LeaseStatus::Live => Ok(tx),
        LeaseStatus::Expired => Err(TxError::Fenced {
            reason: "found run out at a write".to_owned(),
        }),
    }
}

impl Connection {
    /// Applies one batch in one transaction, after every other writer's.
    fn write(&mut self, batch: &[LogWrite], now_ms: i64) -> Result<Vec<WriteOutcome>, TxError> {
        let key = self.audit_key.as_ref();
        let mut tx = begin_write(&mut self.client, &self.lock, &self.fence, &self.worker)?;
        let (applied, chain) = {
            let db = PgDb::new(&mut tx, &self.statements);
            let mut chain = Chain::start(&db, key)?;
            let applied = backend::apply_batch(&db, &mut chain, key, batch, now_ms)?;
            (applied, chain)
        };
        tx.commit().map_err(storage)?;
        if applied.moves_head {
            advance_head_file(
                &mut self.client,
                &self.statements,
                self.head_file.as_ref(),
                &chain,
            );
        }
        Ok(applied.outcomes)
    }

    /// [`TxLog::take_over_and_write`] in one write transaction.
    fn take_over(
        &mut self,
        saga_id: &SagaId,
        expected: &Owner,
        expected_state: SagaState,
        new: &Owner,
        then: &[LogWrite],
        now_ms: i64,
    ) -> Result<bool, TxError> {
        let key = self.audit_key.as_ref();
        let mut tx = begin_write(&mut self.client, &self.lock, &self.fence, &self.worker)?;
        if !lease::end_if_expired(&mut tx, expected)? {
            // Renewed after all: the owner is alive, and keeps its saga.
            return Ok(false);
        }
        let (taken, chain) = {
            let db = PgDb::new(&mut tx, &self.statements);
            let mut chain = Chain::start(&db, key)?;
            let taken = backend::take_over(
                &db,
                &mut chain,
                saga_id,
                expected,
                expected_state,
                new,
                now_ms,
            )?;
            if taken && !then.is_empty() {
                // Refused, it is the error, and the transaction (the take-over with it) is
                // rolled back when dropped.
                backend::apply_batch(&db, &mut chain, key, then, now_ms)?;
            }
            (taken, chain)
        };
        if taken {
            tx.commit().map_err(storage)?;
            advance_head_file(
                &mut self.client,
                &self.statements,
                self.head_file.as_ref(),
                &chain,
            );
        }
        Ok(taken)
    }

    /// Runs `read` in one read-only snapshot.
    fn read<T>(&mut self, read: impl FnOnce(&dyn Db) -> Result<T, TxError>) -> Result<T, TxError> {
        let mut tx = snapshot(&mut self.client)?;
        let value = {
            let db = PgDb::new(&mut tx, &self.statements);
            read(&db)?
        };
        tx.commit().map_err(storage)?;
        Ok(value)
    }
}

/// The PostgreSQL transaction log. Cheap to share behind an `Arc`.
pub struct PostgresLog {
    target: String,
    durability: Durability,
    jobs: mpsc::Sender<Job>,
    closed: oneshot::Receiver<()>,
    /// Renews this process's lease; stops when the log is dropped.
    renewer: Renewer,
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
        thread::Builder::new()
            .name("agent-kernel-txlog-postgres".into())
            .spawn(move || {
                let opened = open_connection(
                    &thread_config,
                    &thread_target,
                    durability,
                    &thread_worker,
                    audit_key.as_ref(),
                );
                let mut connection = match opened {
                    Ok((client, lock, fence, head_file)) => Connection {
                        client,
                        statements: Statements::default(),
                        audit_key,
                        worker: thread_worker,
                        head_file,
                        lock,
                        fence,
                    },
                    Err(error) => {
                        let _ = opened_sender.send(Err(error));
                        return;
                    }
                };
                let _ = opened_sender.send(Ok(()));
                while let Some(job) = receiver.blocking_recv() {
                    if connection.client.is_closed() {
                        // The server dropped the connection (a restart, a failover): made
                        // again, the lease checked, before the job runs; if that fails the
                        // job fails, and the next one tries again.
                        if let Ok((client, lock, fence, head_file)) = open_connection(
                            &thread_config,
                            &thread_target,
                            durability,
                            &connection.worker,
                            connection.audit_key.as_ref(),
                        ) {
                            connection.client = client;
                            connection.lock = lock;
                            connection.fence = fence;
                            connection.head_file = head_file;
                            connection.statements = Statements::default();
                        }
                    }
                    job(&mut connection, clock.now_ms());
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
        })
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

    /// Runs `job` on the connection's thread and returns its result.
    fn call<T: Send + 'static>(
        &self,
        job: impl FnOnce(&mut Connection, i64) -> Result<T, TxError> + Send + 'static,
    ) -> BoxFuture<'_, Result<T, TxError>> {
        Box::pin(async move {
            let (reply, answer) = oneshot::channel();
            let job: Job = Box::new(move |connection, now_ms| {
                // The caller may have gone away; its answer is then dropped.
                let _ = reply.send(job(connection, now_ms));
            });
            self.jobs.send(job).await.map_err(|_| TxError::Closed)?;
            answer.await.map_err(|_| TxError::Closed)?
        })
    }
}

impl TxLog for PostgresLog {
    fn write(&self, batch: Vec<LogWrite>) -> BoxFuture<'_, Result<Vec<WriteOutcome>, TxError>> {
        self.call(move |connection, now_ms| connection.write(&batch, now_ms))
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
        let (saga_id, expected, new) = (saga_id.clone(), expected_owner.clone(), new_owner.clone());
        self.call(move |connection, now_ms| {
            connection.take_over(&saga_id, &expected, expected_state, &new, &then, now_ms)
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
            let query = connection.fence.clone();
            lease::status(&mut connection.client, &query, &owner).map(Some)
        })
    }

    fn lease_left_ms<'a>(
        &'a self,
        owner: &'a Owner,
    ) -> BoxFuture<'a, Result<Option<i64>, TxError>> {
        let owner = owner.clone();
        self.call(move |connection, _| lease::left_ms(&mut connection.client, &owner))
    }

    fn end_lease<'a>(&'a self, owner: &'a Owner) -> BoxFuture<'a, Result<(), TxError>> {
        let owner = owner.clone();
        self.call(move |connection, _| {
            let mut tx = begin_write(
                &mut connection.client,
                &connection.lock,
                &connection.fence,
                &connection.worker,
            )?;
            lease::end(&mut tx, &owner)?;
            tx.commit().map_err(storage)
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
