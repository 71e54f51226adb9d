//! Owners' leases: every process that holds sagas through the log renews a lease on its
//! owner row; an owner whose lease ran out (by the database's clock) is dead for recovery,
//! whatever its host, and its writes are refused (fencing).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use agent_kernel_api::{LeaseStatus, Owner, TxError};
use postgres::{Client, Config, GenericClient, NoTls};

use crate::schema::storage;

/// How long a lease lasts unless renewed, by default.
pub const LEASE_DEFAULT: Duration = Duration::from_secs(10);

/// The shortest lease accepted: renewals come a quarter of it apart.
pub const LEASE_MIN: Duration = Duration::from_millis(400);

/// The longest lease accepted: a dead worker's sagas wait this long at most.
pub const LEASE_MAX: Duration = Duration::from_secs(3600);

/// How many renewals each lease gets before it would run out.
pub const RENEWALS_PER_LEASE: u32 = 4;

/// The part of a lease, counted from the moment a renewal was sent, that an effect may
/// start in (three quarters): the database set the lease to end a whole lease after it
/// received the renewal, which is after it was sent, so the last quarter is the margin for
/// the two clocks' rates and the time between the check and the effect.
const EFFECT_PART_NUM: u32 = 3;
const EFFECT_PART_DEN: u32 = 4;

/// The database's clock, in ms since the Unix epoch: every lease is read and written by
/// it, never by a worker's own clock, so workers whose clocks disagree still agree on
/// who is alive.
pub(crate) const NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

/// The process that holds sagas through a log, and how long its lease lasts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Worker {
    /// The process, as its sagas record it.
    pub owner: Owner,
    /// How long its lease lasts unless renewed ([`LEASE_MIN`] to [`LEASE_MAX`]).
    pub lease: Duration,
    /// The base of this machine's head files for the URL (named `<name>.audit-head`;
    /// [`default_head_file`](crate::default_head_file) is where the kernel keeps it): the
    /// log's own is `<name>.log-<log id>.audit-head` beside it. `None` to keep none: then
    /// nothing outside the database vouches for the chain's newest records.
    pub head_file: Option<std::path::PathBuf>,
}

impl Worker {
    /// `owner` with the [`LEASE_DEFAULT`] lease.
    pub fn new(owner: Owner) -> Worker {
        Worker {
            owner,
            lease: LEASE_DEFAULT,
            head_file: None,
        }
    }

    /// The lease in ms, checked against its bounds.
    pub(crate) fn lease_ms(&self) -> Result<i64, TxError> {
        if !(LEASE_MIN..=LEASE_MAX).contains(&self.lease) {
            return Err(TxError::Storage(format!(
                "a lease of {} ms is outside {} ms to {} ms",
                self.lease.as_millis(),
                LEASE_MIN.as_millis(),
                LEASE_MAX.as_millis()
            )));
        }
        i64::try_from(self.lease.as_millis()).map_err(|_| TxError::Storage("lease too long".into()))
    }
}

fn owner_params(owner: &Owner) -> (String, String, i64, i64) {
    (
        owner.host.clone(),
        owner.boot_id.clone(),
        i64::from(owner.pid),
        owner.start_ticks as i64,
    )
}

/// Takes (or extends) `worker`'s lease; refused when it already ran out.
pub(crate) fn acquire(client: &mut Client, worker: &Worker) -> Result<(), TxError> {
    let lease_ms = worker.lease_ms()?;
    let (host, boot_id, pid, start_ticks) = owner_params(&worker.owner);
    let taken = client
        .query_opt(
            &format!(
                "INSERT INTO leases AS l (owner_host, owner_boot_id, owner_pid, owner_start_ticks,
                     acquired_at_ms, expires_at_ms)
                 VALUES ($1, $2, $3, $4, {NOW_MS}, {NOW_MS} + $5)
                 ON CONFLICT (owner_host, owner_boot_id, owner_pid, owner_start_ticks)
                 DO UPDATE SET expires_at_ms = EXCLUDED.expires_at_ms
                     WHERE l.expires_at_ms > {NOW_MS}
                 RETURNING 1"
            ),
            &[&host, &boot_id, &pid, &start_ticks, &lease_ms],
        )
        .map_err(storage)?;
    if taken.is_none() {
        return Err(TxError::Fenced {
            reason: "it ran out before this log was opened".to_owned(),
        });
    }
    Ok(())
}

/// Takes `worker`'s lease again on a new connection (the server dropped the last one):
/// only extends a lease still live, never makes one. A lease that ran out, or whose row was
/// forgotten ([`forget_gone`]), stays lost: the process is fenced.
pub(crate) fn reacquire(client: &mut Client, worker: &Worker) -> Result<(), TxError> {
    let lease_ms = worker.lease_ms()?;
    if renew(client, worker, lease_ms).map_err(storage)? {
        Ok(())
    } else {
        Err(TxError::Fenced {
            reason: "it ran out while the connection was made again".to_owned(),
        })
    }
}

/// How long the row of a lease that ran out is kept, for whoever looks at who held what:
/// a day. Then each process's renewer deletes it, unless it was ended for good.
pub const LEASE_ROWS_KEPT: Duration = Duration::from_secs(24 * 3600);

/// How often each process's renewer deletes the rows of leases gone longer than
/// [`LEASE_ROWS_KEPT`] (and once when it starts).
pub const LEASE_ROWS_FORGET_PERIOD: Duration = Duration::from_secs(600);

/// Deletes the rows of leases that ran out more than [`LEASE_ROWS_KEPT`] ago and were
/// never ended for good; how many. Rows ended for good (`expires_at_ms = -1`: an owner
/// whose sagas were taken over, or whose process is known gone) are kept as tombstones, so
/// that a process paused past its lease whose sagas another took can never take a lease
/// again, not even by opening the log anew ([`acquire`] refuses an ended row, and a
/// take-over of an owner with no row makes one, [`end_if_expired`]). A forgotten owner is
/// dead to recovery ([`status`]); one that comes back before any take-over still owns
/// what it held, and a connection made again never makes a row ([`reacquire`]).
pub(crate) fn forget_gone(client: &mut Client) -> Result<u64, postgres::Error> {
    let kept_ms = i64::try_from(LEASE_ROWS_KEPT.as_millis()).unwrap_or(i64::MAX);
    client.execute(
        &format!("DELETE FROM leases WHERE expires_at_ms >= 0 AND expires_at_ms < {NOW_MS} - $1"),
        &[&kept_ms],
    )
}

/// Extends a live lease; `false` when it had already run out (and stays so).
fn renew(client: &mut Client, worker: &Worker, lease_ms: i64) -> Result<bool, postgres::Error> {
    let (host, boot_id, pid, start_ticks) = owner_params(&worker.owner);
    let n = client.execute(
        &format!(
            "UPDATE leases SET expires_at_ms = {NOW_MS} + $5
             WHERE owner_host = $1 AND owner_boot_id = $2 AND owner_pid = $3
                 AND owner_start_ticks = $4 AND expires_at_ms > {NOW_MS}"
        ),
        &[&host, &boot_id, &pid, &start_ticks, &lease_ms],
    )?;
    Ok(n == 1)
}

/// The query [`status`] runs: whether an owner's lease is live now.
pub(crate) fn status_sql() -> String {
    status_sql_of("$1", "$2", "$3", "$4")
}

/// [`status_sql`] for `owner`, written into it as constants, for a simple query that sends
/// it with other statements.
pub(crate) fn status_sql_inlined(owner: &Owner) -> String {
    let (host, boot_id, pid, start_ticks) = owner_params(owner);
    let (mut host_sql, mut boot_id_sql) = (String::new(), String::new());
    crate::held::text_literal(&host, &mut host_sql);
    crate::held::text_literal(&boot_id, &mut boot_id_sql);
    status_sql_of(
        &host_sql,
        &boot_id_sql,
        &pid.to_string(),
        &start_ticks.to_string(),
    )
}

/// [`status_sql`] with the owner's columns compared to these expressions.
fn status_sql_of(host: &str, boot_id: &str, pid: &str, start_ticks: &str) -> String {
    format!(
        "SELECT expires_at_ms > {NOW_MS} FROM leases
         WHERE owner_host = {host} AND owner_boot_id = {boot_id} AND owner_pid = {pid}
             AND owner_start_ticks = {start_ticks}"
    )
}

/// A write of `owner`'s lease row that changes nothing, for [`flush`]: a row no other
/// worker writes (its renewer apart, now and then), so that the flushes of different workers
/// never wait for one another's row.
pub(crate) const FLUSH_SQL: &str = "UPDATE leases SET expires_at_ms = expires_at_ms
     WHERE owner_host = $1 AND owner_boot_id = $2 AND owner_pid = $3 AND owner_start_ticks = $4";

/// Returns once every transaction this connection committed is in the server's flushed WAL:
/// `query` ([`FLUSH_SQL`], prepared) commits a write of its own, synchronously (the
/// session's `synchronous_commit` is on under `full`), and the server flushes its WAL in
/// order, so the flush of that commit is the flush of everything committed before it. A
/// write transaction that let go of the log's write lock before its flush
/// ([`write_lock_sql`](crate::schema::write_lock_sql)) waits here, outside the lock, where
/// the flushes of concurrent writers are shared.
///
/// # Errors
///
/// [`TxError::Storage`] when the statement fails, or finds no lease row of `owner` (it then
/// wrote nothing, and waited for nothing).
pub(crate) fn flush(
    client: &mut Client,
    query: &postgres::Statement,
    owner: &Owner,
) -> Result<(), TxError> {
    let (host, boot_id, pid, start_ticks) = owner_params(owner);
    let written = client
        .execute(query, &[&host, &boot_id, &pid, &start_ticks])
        .map_err(|err| {
            TxError::Storage(format!(
                "committed, but not known flushed to the server's disk: {}",
                crate::db::describe_error(&err)
            ))
        })?;
    if written != 1 {
        return Err(TxError::Storage(format!(
            "committed, but not known flushed to the server's disk: the lease row of {}:{} (pid {}) is gone",
            owner.host, owner.boot_id, owner.pid
        )));
    }
    Ok(())
}

/// Whether `owner`'s lease is live now, by `query` ([`status_sql`], or the statement
/// prepared from it), in the caller's transaction or connection.
pub(crate) fn status<T: postgres::ToStatement + ?Sized>(
    client: &mut impl GenericClient,
    query: &T,
    owner: &Owner,
) -> Result<LeaseStatus, TxError> {
    let (host, boot_id, pid, start_ticks) = owner_params(owner);
    let live: Option<bool> = client
        .query_opt(query, &[&host, &boot_id, &pid, &start_ticks])
        .map_err(storage)?
        .map(|row| row.get(0));
    Ok(if live == Some(true) {
        LeaseStatus::Live
    } else {
        LeaseStatus::Expired
    })
}

/// The owners of one write transaction's take-overs whose leases have ended, each asked
/// once ([`end_if_expired`]; an ended lease stays ended, a live one is refused for the
/// transaction): a recovery takes many sagas of one owner over in one group.
#[derive(Default)]
pub(crate) struct EndedLeases<'o>(HashMap<&'o Owner, bool>);

impl<'o> EndedLeases<'o> {
    /// Whether `owner`'s lease has ended, ending it if it ran out; `asking` is called when
    /// the server is asked (two round trips), not when the answer is known.
    pub(crate) fn ended(
        &mut self,
        tx: &mut impl GenericClient,
        owner: &'o Owner,
        asking: impl FnOnce(),
    ) -> Result<bool, TxError> {
        if let Some(ended) = self.0.get(owner) {
            return Ok(*ended);
        }
        asking();
        let ended = end_if_expired(tx, owner)?;
        self.0.insert(owner, ended);
        Ok(ended)
    }
}

/// In a take-over's write transaction: ends `owner`'s lease for good if it ran out, and
/// answers whether the owner is dead. The row lock waits for a renewal in flight, and the
/// condition is checked again on what it committed, so a renewal that ran just before the
/// expiry but committed after it cannot bring the owner back once its sagas are taken.
/// A live owner's row is left unlocked. An owner without a lease row (one whose row was
/// forgotten) is dead, and gets a row ended for good: a tombstone, so that no later open
/// by that owner takes a lease again ([`acquire`] refuses an ended row). The detached
/// owner ([`Owner::detached`], no process) is dead and gets none.
pub(crate) fn end_if_expired(tx: &mut impl GenericClient, owner: &Owner) -> Result<bool, TxError> {
    if owner.is_detached() {
        return Ok(true);
    }
    let (host, boot_id, pid, start_ticks) = owner_params(owner);
    let ended = tx
        .execute(
            &format!(
                "UPDATE leases SET expires_at_ms = -1
                 WHERE owner_host = $1 AND owner_boot_id = $2 AND owner_pid = $3
                     AND owner_start_ticks = $4 AND expires_at_ms <= {NOW_MS}"
            ),
            &[&host, &boot_id, &pid, &start_ticks],
        )
        .map_err(storage)?;
    if ended == 1 {
        return Ok(true);
    }
    // No row to end: a tombstone, unless a row is there (live, or made meanwhile).
    let tombstone = tx
        .execute(
            &format!(
                "INSERT INTO leases (owner_host, owner_boot_id, owner_pid, owner_start_ticks,
                     acquired_at_ms, expires_at_ms)
                 VALUES ($1, $2, $3, $4, {NOW_MS}, -1)
                 ON CONFLICT (owner_host, owner_boot_id, owner_pid, owner_start_ticks) DO NOTHING"
            ),
            &[&host, &boot_id, &pid, &start_ticks],
        )
        .map_err(storage)?;
    if tombstone == 1 {
        return Ok(true);
    }
    Ok(status(tx, &status_sql(), owner)? == LeaseStatus::Expired)
}

/// How long `owner`'s lease has left, in ms by the database's clock; `None` without one.
pub(crate) fn left_ms(
    client: &mut impl GenericClient,
    owner: &Owner,
) -> Result<Option<i64>, TxError> {
    let (host, boot_id, pid, start_ticks) = owner_params(owner);
    Ok(client
        .query_opt(
            &format!(
                "SELECT expires_at_ms - {NOW_MS} FROM leases
                 WHERE owner_host = $1 AND owner_boot_id = $2 AND owner_pid = $3
                     AND owner_start_ticks = $4"
            ),
            &[&host, &boot_id, &pid, &start_ticks],
        )
        .map_err(storage)?
        .map(|row| row.get(0)))
}

/// Ends `owner`'s lease for good, whether or not it ran out (its process is known gone).
pub(crate) fn end(tx: &mut impl GenericClient, owner: &Owner) -> Result<(), TxError> {
    let (host, boot_id, pid, start_ticks) = owner_params(owner);
    tx.execute(
        "UPDATE leases SET expires_at_ms = -1
         WHERE owner_host = $1 AND owner_boot_id = $2 AND owner_pid = $3
             AND owner_start_ticks = $4",
        &[&host, &boot_id, &pid, &start_ticks],
    )
    .map_err(storage)?;
    Ok(())
}

/// The thread that renews a lease on a connection of its own, so that a long batch on the
/// log's connection never delays a renewal. Stopped (and joined) when dropped.
pub(crate) struct Renewer {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<thread::JoinHandle<()>>,
    lost: Arc<AtomicBool>,
    /// Until when, by [`since_boot`], the lease is certainly live: from the last renewal
    /// the database confirmed (`None` before the first).
    live_until: Arc<Mutex<Option<Duration>>>,
}

/// This machine's clock since it booted, suspended time included (`CLOCK_BOOTTIME`): a
/// monotonic clock that stops while the machine sleeps would make a lease that ran out
/// during a suspend look live after the resume.
fn since_boot() -> Duration {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    Duration::new(
        u64::try_from(now.tv_sec).unwrap_or(0),
        u32::try_from(now.tv_nsec).unwrap_or(0),
    )
}

/// Renews on `client` and, when the database confirmed it, moves `live_until` to the part
/// of the lease counted from the moment the renewal was sent ([`EFFECT_PART_NUM`] /
/// [`EFFECT_PART_DEN`]).
fn renew_and_mark(
    client: &mut Client,
    worker: &Worker,
    lease_ms: i64,
    live_until: &Mutex<Option<Duration>>,
) -> Result<bool, postgres::Error> {
    let sent = since_boot();
    let renewed = renew(client, worker, lease_ms)?;
    if renewed {
        let until = sent + worker.lease * EFFECT_PART_NUM / EFFECT_PART_DEN;
        if let Ok(mut live) = live_until.lock() {
            *live = Some(until);
        }
    }
    Ok(renewed)
}

impl Renewer {
    /// Starts renewing `worker`'s lease, already taken, every lease / [`RENEWALS_PER_LEASE`].
    pub(crate) fn start(config: &Config, worker: Worker) -> Result<Renewer, TxError> {
        let lease_ms = worker.lease_ms()?;
        let period = worker.lease / RENEWALS_PER_LEASE;
        let (stop, stopped) = mpsc::channel::<()>();
        let lost = Arc::new(AtomicBool::new(false));
        let thread_lost = Arc::clone(&lost);
        let live_until = Arc::new(Mutex::new(None));
        let thread_live_until = Arc::clone(&live_until);
        let config = config.clone();
        let (connected_sender, connected) = mpsc::sync_channel(1);
        let thread = thread::Builder::new()
            .name("agent-kernel-lease".into())
            .spawn(move || {
                // Connected now, before the process may confine itself (Landlock's network
                // rules would refuse a new connection to the server's port later).
                let mut client = match config.connect(NoTls) {
                    Ok(mut client) => {
                        // Renewed at once: a short lease taken on the log's connection may
                        // be close to running out by now.
                        let renewed =
                            renew_and_mark(&mut client, &worker, lease_ms, &thread_live_until);
                        let _ = connected_sender.send(match &renewed {
                            Ok(true) => Ok(()),
                            Ok(false) => {
                                Err("the lease ran out before its first renewal".to_owned())
                            }
                            Err(err) => Err(err.to_string()),
                        });
                        if !matches!(renewed, Ok(true)) {
                            return;
                        }
                        // Best effort: a row not deleted now is deleted at a later period.
                        let _ = forget_gone(&mut client);
                        Some(client)
                    }
                    Err(err) => {
                        let _ = connected_sender.send(Err(err.to_string()));
                        return;
                    }
                };
                let mut forgotten_at = std::time::Instant::now();
                while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(period) {
                    if client.as_ref().is_none_or(Client::is_closed) {
                        client = config.connect(NoTls).ok();
                    }
                    let Some(connected) = client.as_mut() else {
                        continue;
                    };
                    match renew_and_mark(connected, &worker, lease_ms, &thread_live_until) {
                        Ok(true) => {
                            if forgotten_at.elapsed() >= LEASE_ROWS_FORGET_PERIOD {
                                forgotten_at = std::time::Instant::now();
                                let _ = forget_gone(connected);
                            }
                        }
                        Ok(false) => {
                            // Ran out while this process was paused or cut off: for good.
                            thread_lost.store(true, Ordering::SeqCst);
                            return;
                        }
                        // The server is unreachable: try again next period, on a new
                        // connection; the lease runs out if that lasts.
                        Err(_) => client = None,
                    }
                }
            })
            .map_err(|err| TxError::Storage(format!("cannot start the lease's thread: {err}")))?;
        connected
            .recv()
            .map_err(|_| TxError::Closed)?
            .map_err(|err| TxError::Storage(format!("the lease's connection: {err}")))?;
        Ok(Renewer {
            stop: Some(stop),
            thread: Some(thread),
            lost,
            live_until,
        })
    }

    /// Whether the lease was found run out.
    pub(crate) fn lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// Whether the lease is certainly live now, by this machine's clock since boot from the
    /// last renewal the database confirmed; why not, when it is not.
    pub(crate) fn certainly_live(&self) -> Result<(), String> {
        if self.lost() {
            return Err("its lease ran out".to_owned());
        }
        let until = self.live_until.lock().ok().and_then(|live| *live);
        let now = since_boot();
        match until {
            Some(until) if now < until => Ok(()),
            Some(until) => Err(format!(
                "its lease is not certainly live: the database has confirmed no renewal for {} ms past the safe part of the last one (cut off from the server?)",
                now.saturating_sub(until).as_millis()
            )),
            None => Err("its lease was never confirmed".to_owned()),
        }
    }
}

impl Drop for Renewer {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
