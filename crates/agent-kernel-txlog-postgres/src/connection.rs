//! The log's connection and its thread's work: connecting (the schema checked, the lease
//! taken, this machine's head file found), group commit, take-overs, seals and reads, and
//! what they cost in transactions and round trips.

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use agent_kernel_api::{
    AuditEvent, Durability, LogWrite, Owner, SagaId, SagaState, TxError, WriteOutcome,
};
use agent_kernel_txlog::backend::{self, Chain, HeadFile, LockMap, NEWEST_RECORD_SQL};
use agent_kernel_txlog::sql::{Db, Value};
use agent_kernel_txlog::{AuditHead, AuditKey};
use postgres::{Client, Config, IsolationLevel, NoTls, SimpleQueryMessage};
use tokio::sync::oneshot;

use crate::db::{self, Failed, PgDb, Statements};
use crate::lease::{self, Worker};
use crate::schema::{self, Taking, storage};
use crate::session::WriteTx;
use crate::{head_files, verify::head_file_at};

/// Connects to the database `config` names, sets the durability and checks the schema; the
/// client and the log's identity.
fn connect(
    config: &Config,
    target: &str,
    durability: Durability,
    lease: Duration,
) -> Result<(Client, String), TxError> {
    let mut client = config.connect(NoTls).map_err(|err| {
        TxError::Storage(format!(
            "cannot connect to {target}: {}",
            db::describe_error(&err)
        ))
    })?;
    let synchronous = match durability {
        Durability::Full => "on",
        Durability::Normal => "off",
    };
    // A session paused or cut off inside a transaction (holding its log's write lock) is ended by
    // the server once it has been idle for a lease, so it never blocks the other writers
    // for longer than it would stay alive.
    client
        .batch_execute(&format!(
            "SET synchronous_commit = {synchronous}; SET idle_in_transaction_session_timeout = {}",
            lease.as_millis()
        ))
        .map_err(storage)?;
    let log_id = schema::prepare(&mut client, target)?;
    Ok((client, log_id))
}

/// The `application_name` of the log's sessions, unless the URL names another.
pub const APPLICATION_NAME: &str = "agent-kernel";

/// How long connecting to the server may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// `config` with the timeouts every connection of the log uses: [`CONNECT_TIMEOUT`], and TCP
/// keepalives after a lease of silence, so a server that vanished is noticed; named
/// [`APPLICATION_NAME`] unless the URL names it.
pub(crate) fn with_timeouts(config: &Config, lease: Duration) -> Config {
    let mut config = config.clone();
    config
        .connect_timeout(CONNECT_TIMEOUT)
        .keepalives(true)
        .keepalives_idle(lease.max(Duration::from_secs(1)));
    if config.get_application_name().is_none() {
        // How `pg_stat_activity` names the kernel's sessions.
        config.application_name(APPLICATION_NAME);
    }
    config
}

/// Whether a connection is the log's first or one made again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Opening {
    /// At [`PostgresLog::open`](crate::PostgresLog::open): the lease is taken, its row made
    /// if there is none.
    First,
    /// After the server dropped the connection: the lease is only extended while live,
    /// never made again.
    Again,
}

/// The log's connection, its statements and this machine's head file, made (or made
/// again, after the server dropped the connection): connected, the schema checked, the
/// worker's lease taken (refused once it ran out).
pub(crate) fn open_connection(
    config: &Config,
    target: &str,
    durability: Durability,
    worker: &Worker,
    audit_key: Option<&AuditKey>,
    opening: Opening,
) -> Result<(Client, WriteGate, Option<HeadFile>), TxError> {
    let (mut client, log_id) = connect(config, target, durability, worker.lease)?;
    match opening {
        Opening::First => lease::acquire(&mut client, worker)?,
        Opening::Again => lease::reacquire(&mut client, worker)?,
    }
    let gate = WriteGate::prepare(&mut client, durability, log_id, worker)?;
    let head_file = worker
        .head_file
        .as_deref()
        .map(|base| {
            let own = head_files::keyed(base, &gate.log_id);
            if own.symlink_metadata().is_err() && base.symlink_metadata().is_ok() {
                // An earlier build's file, named after the URL alone: it vouched for the log
                // at the URL, which has since been given its identity. Another process of
                // this machine may rename it first.
                match std::fs::rename(base, &own) {
                    Ok(()) => {}
                    Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                    Err(err) => {
                        return Err(TxError::Storage(format!(
                            "cannot rename the audit head file {} to {}: {err}",
                            base.display(),
                            own.display()
                        )));
                    }
                }
            }
            head_file_at(&own, audit_key.cloned(), durability)
        })
        .transpose()?;
    if let Some(head_file) = &head_file {
        let mut tx = snapshot(&mut client)?;
        let newest = head_file.newest_if_missing(&PgDb::new(&mut tx, &Statements::default()))?;
        tx.commit().map_err(storage)?;
        if let Some(newest) = newest {
            // The newest record may be another writer's commit that let go of the write
            // lock before the server's flush: flushed here before this machine vouches
            // for it.
            if let Some(full) = &gate.full {
                lease::flush(&mut client, &full.flush, &worker.owner)?;
            }
            head_file.create(&newest)?;
        }
    }
    Ok((client, gate, head_file))
}

/// What every write transaction on a connection begins with ([`begin_write`]), made when
/// the connection is: after its BEGIN, one simple query (one round trip) running three
/// statements prepared in the session (the log's identity and the worker written into them
/// as constants). Under read committed each statement reads its own snapshot, so the two
/// after the lock read every write committed before it was granted:
///
/// 1. the log's write lock ([`schema::write_lock_sql`]), taken only while the log's
///    identity is the one the connection found;
/// 2. the worker's lease ([`lease::status_sql`]);
/// 3. the chain's newest record ([`NEWEST_RECORD_SQL`]), which the transaction's chain
///    then starts from without asking again.
pub(crate) struct WriteGate {
    /// With the lock waited for: a log not under [`Durability::Full`].
    lock: String,
    /// What a write under [`Durability::Full`] needs besides.
    full: Option<FullGate>,
    /// [`lease::status_sql`], prepared once.
    pub(crate) fence: postgres::Statement,
    /// The log's identity, as the connection found it.
    pub(crate) log_id: String,
}

/// The statements of a [`WriteGate`] under [`Durability::Full`], where a writer that found
/// the lock taken lets go of it before the server's flush.
struct FullGate {
    /// With the lock tried, then waited for when it was taken: the transaction commits
    /// through the flush, or before it when it waited.
    try_synced: String,
    /// With the lock tried, then waited for when it was taken: the transaction commits
    /// before the flush either way (the lock found taken lately).
    try_before_flush: String,
    /// [`lease::FLUSH_SQL`].
    flush: postgres::Statement,
    /// When a write transaction of this connection last found the lock taken.
    contended_at: Cell<Option<Instant>>,
}

/// How long after a write transaction found its log's write lock taken by another writer
/// the connection's write transactions commit before the server's flush (under
/// [`Durability::Full`]), so that they let go of the lock first and writers of several
/// processes share their flushes. A writer alone commits through the flush: one round trip
/// fewer.
pub const CONTENTION_REMEMBERED: Duration = Duration::from_secs(1);

impl WriteGate {
    fn prepare(
        client: &mut Client,
        durability: Durability,
        log_id: String,
        worker: &Worker,
    ) -> Result<WriteGate, TxError> {
        // Prepared in the session by SQL, plans cached; run by `EXECUTE`, with the START.
        let full = durability == Durability::Full;
        let locks = [
            ("agent_kernel_gate_wait", Taking::Wait, false),
            ("agent_kernel_gate_try_synced", Taking::TryThenWait, false),
            (
                "agent_kernel_gate_try_before_flush",
                Taking::TryThenWait,
                true,
            ),
        ];
        let mut prepare = String::new();
        for (name, taking, before_flush) in locks {
            let lock = schema::write_lock_sql(&log_id, taking, before_flush);
            prepare.push_str(&format!("PREPARE {name} AS {lock};\n"));
        }
        let lease = lease::status_sql_inlined(&worker.owner);
        prepare.push_str(&format!(
            "PREPARE agent_kernel_gate_lease AS {lease};\n\
             PREPARE agent_kernel_gate_newest AS {NEWEST_RECORD_SQL};"
        ));
        client.batch_execute(&prepare).map_err(storage)?;
        let statements = |lock: &str| {
            format!(
                "START TRANSACTION ISOLATION LEVEL READ COMMITTED; EXECUTE {lock}; \
                 EXECUTE agent_kernel_gate_lease; EXECUTE agent_kernel_gate_newest"
            )
        };
        let lock = statements(locks[0].0);
        let full = if full {
            Some(FullGate {
                try_synced: statements(locks[1].0),
                try_before_flush: statements(locks[2].0),
                flush: client.prepare(lease::FLUSH_SQL).map_err(storage)?,
                contended_at: Cell::new(None),
            })
        } else {
            None
        };
        Ok(WriteGate {
            lock,
            full,
            fence: client.prepare(&lease::status_sql()).map_err(storage)?,
            log_id,
        })
    }

    /// After a transaction [`begin_write`] began has committed on `client`: returns once it
    /// is durable as the log's durability asks. Its COMMIT did not wait for the server's
    /// flush when `before_flush` (the log's write lock was found taken lately: the lock was
    /// let go of first, and the next writer, of any process, went on meanwhile);
    /// [`lease::flush`] waits for it here, outside the lock, where the server flushes once
    /// for every writer waiting at once. Nothing the transaction wrote may be answered before
    /// this returns: its failure is every caller's error, as a COMMIT whose answer was lost
    /// is.
    pub(crate) fn flushed(
        &self,
        client: &mut Client,
        worker: &Worker,
        counters: &Counters,
        before_flush: bool,
    ) -> Result<(), TxError> {
        let (true, Some(full)) = (before_flush, &self.full) else {
            return Ok(());
        };
        counters.trips(1);
        counters.flushed_after.fetch_add(1, Ordering::Relaxed);
        lease::flush(client, &full.flush, &worker.owner)
    }
}

/// A write transaction [`begin_write`] began.
pub(crate) struct Began<'c> {
    pub(crate) tx: WriteTx<'c>,
    /// Whether its COMMIT returns before the server's flush: [`WriteGate::flushed`] must
    /// then return before anything it wrote is answered.
    pub(crate) before_flush: bool,
    /// The chain's newest record as the transaction read it under the lock: the answer to
    /// its [`NEWEST_RECORD_SQL`] ([`PgDb::knowing_newest`]).
    pub(crate) newest: Vec<Vec<Value>>,
}

/// What a log's connection did since the log was opened ([`PostgresLog::stats`](crate::PostgresLog::stats)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnectionStats {
    /// Write transactions committed.
    pub transactions: u64,
    /// Batches of records written ([`TxLog::write`](agent_kernel_api::TxLog::write) calls and take-overs).
    pub batches: u64,
    /// The most batches one transaction held.
    pub batches_max: u64,
    /// Records written, each chained into the audit log.
    pub records: u64,
    /// The most records one transaction held.
    pub records_max: u64,
    /// Round trips to the server: each BEGIN, statement and COMMIT the connection sent and
    /// waited for, reads included; the lease renewer's connection is not counted.
    pub round_trips: u64,
    /// Write transactions that found the log's write lock taken by another writer.
    pub contended: u64,
    /// Write transactions that let go of the write lock before the server's flush, and
    /// waited for it after ([`CONTENTION_REMEMBERED`]).
    pub flushed_after: u64,
}

/// [`ConnectionStats`], shared by the log and its connection's thread.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) transactions: AtomicU64,
    pub(crate) batches: AtomicU64,
    pub(crate) batches_max: AtomicU64,
    pub(crate) records: AtomicU64,
    pub(crate) records_max: AtomicU64,
    pub(crate) round_trips: Arc<AtomicU64>,
    pub(crate) contended: AtomicU64,
    pub(crate) flushed_after: AtomicU64,
}

impl Counters {
    pub(crate) fn trips(&self, n: u64) {
        self.round_trips.fetch_add(n, Ordering::Relaxed);
    }

    /// A write transaction of `batches` batches holding `records` records, committed.
    pub(crate) fn committed(&self, batches: u64, records: u64) {
        self.transactions.fetch_add(1, Ordering::Relaxed);
        self.batches.fetch_add(batches, Ordering::Relaxed);
        self.batches_max.fetch_max(batches, Ordering::Relaxed);
        self.records.fetch_add(records, Ordering::Relaxed);
        self.records_max.fetch_max(records, Ordering::Relaxed);
    }
}

/// How long a connection may take to answer whether it is still there, after a statement
/// on it failed.
pub const CONNECTION_CHECK_TIMEOUT: Duration = Duration::from_secs(1);

/// How long a connection the server dropped is tried again before the job waiting on it
/// fails (and at most half a lease): a restart of the server takes a moment.
pub const RECONNECT_WINDOW: Duration = Duration::from_secs(5);

/// The first pause between tries to connect again; each next one doubles.
pub const RECONNECT_PAUSE_FIRST: Duration = Duration::from_millis(50);

/// The longest pause between tries to connect again.
pub const RECONNECT_PAUSE_MAX: Duration = Duration::from_secs(1);

/// The round trips [`begin_write`] makes: BEGIN, the write lock (tried, then waited for
/// when taken), the lease check and the chain's newest record, together.
pub(crate) const BEGIN_WRITE_TRIPS: u64 = 1;

/// The round trips of a read-only snapshot's BEGIN and COMMIT.
const SNAPSHOT_TRIPS: u64 = 2;

/// A job other than a write, run with the connection and the clock's time.
pub(crate) type Run = Box<dyn FnOnce(&mut Connection, i64) + Send>;

/// What a group commit writes: a batch, or a take-over with the batch written with it.
pub(crate) enum Item {
    /// [`TxLog::write`](agent_kernel_api::TxLog::write).
    Write(Vec<LogWrite>),
    /// [`TxLog::take_over_and_write`](agent_kernel_api::TxLog::take_over_and_write).
    TakeOver(TakeOver),
}

impl Item {
    /// The records it may write.
    pub(crate) fn records(&self) -> usize {
        match self {
            Item::Write(batch) => batch.len(),
            Item::TakeOver(take_over) => 1 + take_over.then.len(),
        }
    }
}

/// A take-over: the saga, the owner and state it must still have, its new owner, and what
/// is written with it.
pub(crate) struct TakeOver {
    pub(crate) saga_id: SagaId,
    pub(crate) expected: Owner,
    pub(crate) expected_state: SagaState,
    pub(crate) new: Owner,
    pub(crate) then: Vec<LogWrite>,
}

/// What an item came to, once its transaction committed.
pub(crate) enum Answer {
    /// A batch's outcomes.
    Written(Vec<WriteOutcome>),
    /// Whether a take-over took the saga.
    TakenOver(bool),
}

/// Where an item's answer goes.
pub(crate) type Reply = oneshot::Sender<Result<Answer, TxError>>;

/// What the connection's thread is asked to do.
pub(crate) enum Job {
    /// An item to write: the items queued together share one transaction (group commit).
    Grouped(Item, Reply),
    /// Anything else.
    Other(Run),
}

/// How a group's transaction ended ([`Connection::try_group`]).
enum GroupEnd {
    /// Committed: each item's answer, in order.
    Committed(Vec<Answer>),
    /// Its BEGIN or COMMIT failed: every batch's error.
    Failed(TxError),
    /// A batch was refused (why), and the transaction rolled back: nothing of the group is
    /// written.
    BatchRefused(TxError),
    /// The transaction did not begin (why): nothing was sent that could be written.
    NotBegun(TxError),
}

/// What the connection's thread holds.
pub(crate) struct Connection {
    pub(crate) client: Client,
    pub(crate) statements: Statements,
    pub(crate) audit_key: Option<AuditKey>,
    /// The process writing through this connection, whose lease every write checks.
    pub(crate) worker: Worker,
    /// This machine's anchor of the chain's head, when it keeps one.
    pub(crate) head_file: Option<HeadFile>,
    /// What its write transactions begin with.
    pub(crate) gate: WriteGate,
    pub(crate) counters: Arc<Counters>,
    /// What the connection is made again with, after the server dropped it.
    pub(crate) config: Config,
    pub(crate) target: String,
    pub(crate) durability: Durability,
    /// The locks begun steps hold, kept from one of this writer's transactions to the next.
    pub(crate) locks: LockMap,
    /// Whether no group holds back its writes of steps and sagas, as the items of a refused
    /// group written again one by one do not
    /// ([`PostgresLog::write_without_holding`](crate::PostgresLog::write_without_holding)).
    pub(crate) hold_never: Arc<std::sync::atomic::AtomicBool>,
}

/// A read-only, repeatable-read snapshot on `client`: every read of the log sees one
/// moment.
pub(crate) fn snapshot(client: &mut Client) -> Result<postgres::Transaction<'_>, TxError> {
    client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .map_err(storage)
}

/// Moves this machine's head file, when it keeps one, to `chain`'s newest record, just
/// committed (a batch that ended a saga or held an audit event, or a take-over), checked by
/// one statement outside any transaction (a snapshot of its own, one round trip).
pub(crate) fn advance_head_file(
    client: &mut Client,
    statements: &Statements,
    head_file: Option<&HeadFile>,
    chain: &Chain<'_>,
) {
    let Some(head_file) = head_file else {
        return;
    };
    head_file.advance(&PgDb::new(client, statements), chain);
}

/// Begins a write transaction on `client`, the log `target` names: after every other
/// writer's (the gate's statements take the log's [`write_lock`](schema::write_lock), while
/// the log's identity is still the gate's `log_id`), and only while the gate's worker's lease
/// is live. Once it ran out, another process may have taken its sagas over: the write is
/// refused ([`TxError::Fenced`]). A log whose identity is no longer the one this connection
/// found (edited, or another schema ahead in the `search_path`), whose writers take another
/// lock, is refused as [`TxError::Tampered`].
pub(crate) fn begin_write<'c>(
    client: &'c mut Client,
    gate: &WriteGate,
    target: &str,
    counters: &Counters,
) -> Result<Began<'c>, TxError> {
    let tampered = || TxError::Tampered {
        path: target.to_owned(),
        reason: format!(
            "the log's identity is no longer {}, the one this process opened (agent_kernel_meta edited, or another schema ahead in the search_path): nothing written",
            gate.log_id
        ),
    };
    // Begun by the gate's first query, and rolled back if anything fails before its end.
    let mut tx = WriteTx::beginning(client);
    // Under `full`, tried first: a writer that finds it taken waits, and lets go of it
    // before the flush; so do its writes for a while after.
    let mut before_flush = false;
    let first = match &gate.full {
        Some(full) => {
            before_flush = full
                .contended_at
                .get()
                .is_some_and(|at| at.elapsed() < CONTENTION_REMEMBERED);
            if before_flush {
                &full.try_before_flush
            } else {
                &full.try_synced
            }
        }
        None => &gate.lock,
    };
    let tries = gate.full.is_some();
    let found = gate_answers(&mut tx, first, tries)?.ok_or_else(tampered)?;
    if !found.free {
        // Found taken, and waited for: the transaction commits before the flush.
        counters.contended.fetch_add(1, Ordering::Relaxed);
        if let Some(full) = &gate.full {
            full.contended_at.set(Some(Instant::now()));
        }
        before_flush = true;
    }
    if !found.live {
        return Err(TxError::Fenced {
            reason: "found run out at a write".to_owned(),
        });
    }
    Ok(Began {
        tx,
        before_flush,
        newest: found.newest,
    })
}

/// What a [`WriteGate`]'s statements answered.
struct GateAnswers {
    /// Whether the lock was free (a lock tried first and found taken was waited for).
    free: bool,
    /// Whether the worker's lease is live.
    live: bool,
    /// The chain's newest record (none for an empty chain): seq, hash, MAC.
    newest: Vec<Vec<Value>>,
}

/// Sends `statements`, a [`WriteGate`]'s (`tries`: its lock is tried first), in one simple
/// query that begins `tx` (read committed, whatever the server's default: each statement
/// then reads what the writers before it committed); `None` when the lock statement found
/// the log's identity changed, and took nothing.
fn gate_answers(
    tx: &mut WriteTx<'_>,
    statements: &str,
    tries: bool,
) -> Result<Option<GateAnswers>, TxError> {
    let mut answers: Vec<Vec<postgres::SimpleQueryRow>> = vec![Vec::new()];
    let messages = tx.client().simple_query(statements).map_err(storage)?;
    // The START's answer apart.
    for message in messages.into_iter().skip(1) {
        match message {
            SimpleQueryMessage::Row(row) => {
                if let Some(rows) = answers.last_mut() {
                    rows.push(row);
                }
            }
            SimpleQueryMessage::CommandComplete(_) => answers.push(Vec::new()),
            _ => {}
        }
    }
    let [lock, lease, newest, _] = &answers[..] else {
        return Err(TxError::Storage(format!(
            "a write transaction's first statements answered {} times, not 3",
            answers.len().saturating_sub(1)
        )));
    };
    let Some(lock) = lock.first() else {
        return Ok(None);
    };
    let free = !tries || lock.get(1) == Some("t");
    let live = lease.first().and_then(|row| row.get(0)) == Some("t");
    let newest = newest
        .iter()
        .map(|row| {
            let text = |idx: usize| {
                row.get(idx)
                    .map_or(Value::Null, |text| Value::Text(text.to_owned()))
            };
            // The seq as an integer, as the store reads it; anything else as the text the
            // server sent, for the store to find malformed.
            let seq = match row.get(0).map(str::parse::<i64>) {
                Some(Ok(seq)) => Value::Integer(seq),
                _ => text(0),
            };
            vec![seq, text(1), text(2)]
        })
        .collect();
    Ok(Some(GateAnswers { free, live, newest }))
}

/// A take-over in the group's transaction, its owner's lease already ended: the
/// compare-and-swap, then, if it took the saga, the batch written with it (a refused batch
/// is the error, and rolls the take-over back with the transaction).
fn take_over_in(
    db: &PgDb<'_>,
    chain: &mut Chain<'_>,
    key: Option<&AuditKey>,
    take_over: &TakeOver,
    now_ms: i64,
) -> Result<bool, TxError> {
    let taken = backend::take_over(
        db,
        chain,
        &take_over.saga_id,
        &take_over.expected,
        take_over.expected_state,
        &take_over.new,
        now_ms,
    )?;
    if taken && !take_over.then.is_empty() {
        backend::apply_batch(db, chain, key, &take_over.then, now_ms)?;
    }
    Ok(taken)
}

impl Connection {
    /// Writes `item` alone, in one transaction, after every other writer's.
    pub(crate) fn write_alone(&mut self, item: &Item, now_ms: i64) -> Result<Answer, TxError> {
        match self.try_group_reconnecting(&[item], now_ms, false) {
            GroupEnd::Committed(mut answers) => Ok(answers.remove(0)),
            GroupEnd::Failed(error) | GroupEnd::BatchRefused(error) | GroupEnd::NotBegun(error) => {
                Err(error)
            }
        }
    }

    /// Writes `group`, items queued at the same time, in one transaction (one commit and
    /// one sync under [`Durability::Full`]), and answers each. When an item is refused the
    /// transaction is rolled back and each item is written again in a transaction of its
    /// own, in order, so each gets the answer it would have had alone. A group, even of one
    /// item, holds back its writes of steps and sagas ([`PgDb::holding`]), which the items
    /// written again one by one do not.
    pub(crate) fn write_group(&mut self, group: Vec<(Item, Reply)>, now_ms: i64) {
        let items: Vec<&Item> = group.iter().map(|(item, _)| item).collect();
        let hold = !self.hold_never.load(Ordering::Relaxed);
        let answers: Vec<Result<Answer, TxError>> =
            match self.try_group_reconnecting(&items, now_ms, hold) {
                GroupEnd::Committed(answers) => answers.into_iter().map(Ok).collect(),
                GroupEnd::Failed(error) | GroupEnd::NotBegun(error) => {
                    group.iter().map(|_| Err(error.clone())).collect()
                }
                GroupEnd::BatchRefused(error) if group.len() == 1 && !hold => vec![Err(error)],
                GroupEnd::BatchRefused(_) => group
                    .iter()
                    .map(|(item, _)| self.write_alone(item, now_ms))
                    .collect(),
            };
        for ((_, reply), answer) in group.into_iter().zip(answers) {
            // The caller may have gone away; its answer is then dropped.
            let _ = reply.send(answer);
        }
    }

    /// [`try_group`](Self::try_group); when its BEGIN failed because the server had dropped
    /// the connection (a restart, a failover, while this process was idle), the connection
    /// is made again and the transaction tried once more: nothing of the first try reached
    /// the log.
    fn try_group_reconnecting(&mut self, items: &[&Item], now_ms: i64, hold: bool) -> GroupEnd {
        match self.try_group(items, now_ms, hold) {
            GroupEnd::NotBegun(error) if self.dropped() => match self.reconnect_patiently() {
                Ok(()) => self.try_group(items, now_ms, hold),
                // A lease that ran out meanwhile is what the caller must hear.
                Err(again @ TxError::Fenced { .. }) => GroupEnd::NotBegun(again),
                Err(again) => {
                    GroupEnd::NotBegun(TxError::Storage(format!("{error}; made again: {again}")))
                }
            },
            ended => ended,
        }
    }

    /// Whether the server dropped the connection, asked after a statement failed: the
    /// client may not have seen the end yet (the server's `FATAL` came first), so a
    /// connection not known closed is asked once more (an empty query, within
    /// [`CONNECTION_CHECK_TIMEOUT`]).
    fn dropped(&mut self) -> bool {
        if self.client.is_closed() {
            return true;
        }
        self.counters.trips(1);
        self.client.is_valid(CONNECTION_CHECK_TIMEOUT).is_err()
    }

    /// [`reconnect`](Self::reconnect), tried again while the server refuses (a restart
    /// takes a moment) for [`RECONNECT_WINDOW`] at most, and half a lease: pauses from
    /// [`RECONNECT_PAUSE_FIRST`], doubling up to [`RECONNECT_PAUSE_MAX`]. A lease found run
    /// out ends it at once.
    pub(crate) fn reconnect_patiently(&mut self) -> Result<(), TxError> {
        let window = RECONNECT_WINDOW.min(self.worker.lease / 2);
        let started = std::time::Instant::now();
        let mut pause = RECONNECT_PAUSE_FIRST;
        loop {
            match self.reconnect() {
                Ok(()) => return Ok(()),
                Err(error @ TxError::Fenced { .. }) => return Err(error),
                Err(error) if started.elapsed() + pause > window => return Err(error),
                Err(_) => {
                    // The connection's own thread: no async runtime waits on it.
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(RECONNECT_PAUSE_MAX);
                }
            }
        }
    }

    /// Makes the connection again after the server dropped it: the schema checked, the
    /// lease extended only while live ([`Opening::Again`]), the statements prepared anew.
    pub(crate) fn reconnect(&mut self) -> Result<(), TxError> {
        let (client, gate, head_file) = open_connection(
            &self.config,
            &self.target,
            self.durability,
            &self.worker,
            self.audit_key.as_ref(),
            Opening::Again,
        )?;
        self.client = client;
        self.gate = gate;
        self.head_file = head_file;
        self.statements = Statements::counting(self.counters.round_trips.clone());
        Ok(())
    }

    /// `items` in one write transaction, the chain running through them in order. The
    /// leases of the owners the take-overs expect are ended first, where they ran out (or
    /// made ended, where there is no row): that holds whether or not the take-over then
    /// finds the saga as it expected. With `hold`, the writes of steps and sagas are held
    /// back and sent kind by kind ([`PgDb::holding`]).
    fn try_group(&mut self, items: &[&Item], now_ms: i64, hold: bool) -> GroupEnd {
        let key = self.audit_key.as_ref();
        // The COMMIT travels with the held writes, counted with them.
        self.counters.trips(BEGIN_WRITE_TRIPS);
        let Began {
            mut tx,
            before_flush,
            newest,
        } = match begin_write(&mut self.client, &self.gate, &self.target, &self.counters) {
            Ok(began) => began,
            Err(error) => return GroupEnd::NotBegun(error),
        };
        // Whether each item may go on: a take-over only of an owner that is dead, or that
        // is this process.
        let mut owners_dead = Vec::with_capacity(items.len());
        let mut leases = lease::EndedLeases::default();
        for item in items {
            owners_dead.push(match item {
                Item::Write(_) => false,
                // A saga this process hands over itself (left waiting for an approval):
                // its owner is alive, and lets it go.
                Item::TakeOver(take_over) if take_over.expected == self.worker.owner => true,
                Item::TakeOver(take_over) => {
                    let asking = || self.counters.trips(2);
                    match leases.ended(tx.client(), &take_over.expected, asking) {
                        Ok(dead) => dead,
                        Err(error) => return GroupEnd::BatchRefused(error),
                    }
                }
            });
        }
        let mut answers = Vec::with_capacity(items.len());
        let mut moves_head = false;
        let mut chain = {
            // The group's audit records go in together, in one round trip, and so do its
            // steps' and sagas' writes of each kind when they are held.
            let db = PgDb::holding(&mut tx, &self.statements, hold).knowing_newest(newest);
            let mut chain = match Chain::start_with(&db, key, &mut self.locks) {
                Ok(chain) => chain,
                Err(error) => return GroupEnd::Failed(error),
            };
            for (item, owner_dead) in items.iter().zip(owners_dead) {
                let applied = match item {
                    Item::Write(batch) => backend::apply_batch(&db, &mut chain, key, batch, now_ms)
                        .map(|applied| {
                            moves_head |= applied.moves_head;
                            Answer::Written(applied.outcomes)
                        }),
                    // Renewed after all: the owner is alive, and keeps its saga.
                    Item::TakeOver(_) if !owner_dead => Ok(Answer::TakenOver(false)),
                    Item::TakeOver(take_over) => {
                        take_over_in(&db, &mut chain, key, take_over, now_ms).map(|taken| {
                            // A take-over moves the head file, as it does alone.
                            moves_head |= taken;
                            Answer::TakenOver(taken)
                        })
                    }
                };
                match applied {
                    Ok(answer) => answers.push(answer),
                    // Rolled back when `tx` is dropped.
                    Err(error) => return GroupEnd::BatchRefused(error),
                }
            }
            // The held writes, the audit records and the COMMIT, in one round trip.
            match db.flush_and_commit() {
                Ok(()) => {}
                // Each item alone, then, to tell which one it was.
                Err(Failed::Refused(err)) => {
                    return GroupEnd::BatchRefused(TxError::Storage(format!(
                        "the held writes or the audit records could not be written: {err}"
                    )));
                }
                Err(Failed::Unknown(err)) => return GroupEnd::Failed(TxError::Storage(err)),
            }
            chain
        };
        drop(tx);
        if let Err(error) =
            self.gate
                .flushed(&mut self.client, &self.worker, &self.counters, before_flush)
        {
            return GroupEnd::Failed(error);
        }
        chain.committed(&mut self.locks);
        let records = items.iter().map(|item| item.records() as u64).sum();
        self.counters.committed(items.len() as u64, records);
        if moves_head {
            advance_head_file(
                &mut self.client,
                &self.statements,
                self.head_file.as_ref(),
                &chain,
            );
        }
        GroupEnd::Committed(answers)
    }

    /// [`PostgresLog::seal`] on the connection's thread.
    pub(crate) fn seal(&mut self, event: AuditEvent, now_ms: i64) -> Result<AuditHead, TxError> {
        let key = self.audit_key.as_ref();
        self.counters.trips(BEGIN_WRITE_TRIPS + 1);
        let Began {
            mut tx,
            before_flush,
            newest,
        } = begin_write(&mut self.client, &self.gate, &self.target, &self.counters)?;
        let chain = {
            let db = PgDb::new(&mut tx, &self.statements).knowing_newest(newest);
            let mut chain = Chain::start(&db, key)?;
            backend::apply_batch(&db, &mut chain, key, &[LogWrite::Audit(event)], now_ms)?;
            chain
        };
        tx.commit().map_err(storage)?;
        self.gate
            .flushed(&mut self.client, &self.worker, &self.counters, before_flush)?;
        self.counters.committed(1, 1);
        let (seq, hash) = chain.head();
        let sealed = AuditHead {
            seq: seq.unsigned_abs(),
            hash: hash.to_owned(),
        };
        let (Some(file), Some(base)) = (&self.head_file, self.worker.head_file.as_deref()) else {
            return Ok(sealed);
        };
        file.replace(&chain).map_err(|err| {
            TxError::Storage(format!("the seal record {seq} is written, but {err}"))
        })?;
        for other in head_files::all_for_url(base) {
            if other != file.path() {
                std::fs::remove_file(&other).map_err(|err| {
                    TxError::Storage(format!(
                        "the seal record {seq} is written, but the head file {} of the log this URL held before cannot be removed: {err}",
                        other.display()
                    ))
                })?;
            }
        }
        Ok(sealed)
    }

    /// Runs `read` in one read-only snapshot; one that could not begin on a connection the
    /// server dropped is begun again on a new one, as a write is.
    pub(crate) fn read<T>(
        &mut self,
        read: impl FnOnce(&dyn Db) -> Result<T, TxError>,
    ) -> Result<T, TxError> {
        let mut read = Some(read);
        match self.read_once(&mut read) {
            // Still there: the snapshot did not begin.
            Err(_) if read.is_some() && self.dropped() => {
                self.reconnect_patiently()?;
                self.read_once(&mut read)
            }
            done => done,
        }
    }

    /// [`read`](Self::read)'s one snapshot: `read` is taken once it has begun.
    fn read_once<T, F: FnOnce(&dyn Db) -> Result<T, TxError>>(
        &mut self,
        read: &mut Option<F>,
    ) -> Result<T, TxError> {
        self.counters.trips(SNAPSHOT_TRIPS);
        let mut tx = snapshot(&mut self.client)?;
        let read = read.take().ok_or(TxError::Closed)?;
        let value = {
            let db = PgDb::new(&mut tx, &self.statements);
            read(&db)?
        };
        tx.commit().map_err(storage)?;
        Ok(value)
    }
}
