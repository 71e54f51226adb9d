//! The writer's map of the locks unsettled sagas hold through their begun steps
//! ([`Claims`]), which a claim checks instead of reading every such step; kept apart from
//! the log's statements (`store`) and the chain (`audit`), which both carry it.

use std::collections::HashMap;

use agent_kernel_api::{SagaId, TxError};

use serde::Deserialize;

use crate::kinds::{KIND_BEGIN_STEP, KIND_LOCKS};
use crate::sql::storage;
use crate::sql::{Db, params};

/// The sagas that hold the locks of their begun steps, by the two partial indexes that keep
/// them few: unfinished sagas (every state but `Done`, `FailedRolledBack`,
/// `FailedRollbackPartial` and `Undone`, spelled as the index `sagas_unfinished` is, for it
/// to be used) and `FailedRollbackPartial` sagas with an open dead letter
/// (`dead_letters_open`).
pub(crate) const HOLDING_SAGAS: &str = "SELECT saga_id FROM sagas
     WHERE state <> 'Done' AND state <> 'FailedRolledBack' AND state <> 'FailedRollbackPartial'
         AND state <> 'Undone'
     UNION SELECT d.saga_id FROM dead_letters d JOIN sagas g ON g.saga_id = d.saga_id
     WHERE d.status = 'open' AND g.state = 'FailedRollbackPartial'";

/// How many resources [`Claims`] may map beyond twice what it read, before it reads the log
/// again: entries of sagas settled since are dropped only when a claim meets them, so a
/// writer whose sagas each claim new resources would otherwise grow the map without end.
pub(crate) const CLAIMS_SLACK: usize = 4096;

/// How many records other writers may have appended since [`Claims`] was last up to date
/// for it to catch up by reading them ([`catch_up`](Claims::catch_up)); beyond, it reads
/// every lock again.
pub(crate) const CLAIMS_CATCH_UP_MAX: i64 = 4096;

/// One writer's map of the locks unsettled sagas hold through their begun steps, by
/// resource: read from the log ([`HOLDING_SAGAS`]) when first needed in a write transaction,
/// then kept from one transaction to the next. When other writers committed in between
/// (processes, or other connections, on one log), it catches up from their records: the
/// chain is appended in the order transactions commit, and every begun step that claims
/// resources has a `BeginStep` record naming them, every claim made again a `Locks` record.
/// Between reads it only grows: a saga named here may have settled since, which the claim
/// asks the log before it counts.
///
/// A clone is empty and read again when needed: it stands for a transaction rolled back to
/// an earlier point (a savepoint), whose claims since are gone.
#[derive(Debug, Default)]
pub(crate) struct Claims {
    /// The chain's record (sequence number, hash) up to which the map holds every claim:
    /// those of later records are not in it yet, but for this writer's own. `None` when it
    /// must be read again (it was never read, or its transaction rolled back).
    upto: Option<(i64, String)>,
    /// The chain's head when the current write transaction started.
    started_at: Option<(i64, String)>,
    /// The sagas whose begun steps declared each resource, as read or claimed since.
    holders: HashMap<String, Vec<SagaId>>,
    /// How many resources the last read found.
    n_read: usize,
    /// Whether the `locks` table may hold a claim made again: it held one when read, or a
    /// writer made one since. When not, a claim does not look there.
    claimed_again: bool,
}

/// What a `BeginStep` record's body says the step claimed (its other fields unread).
#[derive(Deserialize)]
struct DeclaredIn {
    #[serde(default)]
    resources: Vec<String>,
}

impl Clone for Claims {
    fn clone(&self) -> Claims {
        Claims::default()
    }
}

impl Claims {
    /// Enters a write transaction whose chain starts at the record `seq` of hash `hash`.
    pub(crate) fn begin(&mut self, seq: i64, hash: &str) {
        self.started_at = Some((seq, hash.to_owned()));
    }

    /// Leaves a write transaction that committed with its chain at the record `seq` of hash
    /// `hash`: the map holds the claims up to there when it held those up to where the
    /// transaction started (its own claims it noted as it made them).
    pub(crate) fn committed(&mut self, seq: i64, hash: &str) {
        if self.upto.is_some() && self.upto == self.started_at {
            self.upto = Some((seq, hash.to_owned()));
        }
        self.started_at = None;
    }

    /// The sagas noted as holding `resource` (some may have settled since).
    pub(crate) fn holders_mut(&mut self, resource: &str) -> Option<&mut Vec<SagaId>> {
        self.holders.get_mut(resource)
    }

    /// Whether the `locks` table may hold a claim made again.
    pub(crate) fn may_hold_claims_again(&self) -> bool {
        self.claimed_again
    }

    /// Brings the map up to date: reads every lock of the log's begun steps, unless the map
    /// holds them already and has not grown past its bound ([`CLAIMS_SLACK`]), or can catch
    /// up from the records other writers appended since ([`catch_up`](Claims::catch_up)).
    /// Call only where every claim the map holds is in the log's rows too: before a batch's
    /// claims, not between them.
    pub(crate) fn read_if_needed(&mut self, conn: &dyn Db) -> Result<(), TxError> {
        if self.upto.is_some()
            && self.holders.len() <= self.n_read.saturating_mul(2) + CLAIMS_SLACK
            && (self.upto == self.started_at || self.catch_up(conn)?)
        {
            return Ok(());
        }
        let rows: Vec<(String, String)> = conn
            .query_map(
                &format!(
                    "SELECT saga_id, resources FROM saga_steps
                     WHERE resources IS NOT NULL AND saga_id IN ({HOLDING_SAGAS})"
                ),
                params![],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .map_err(storage)?;
        self.claimed_again = conn
            .query_row(
                "SELECT CASE WHEN EXISTS (SELECT 1 FROM locks) THEN 1 ELSE 0 END",
                params![],
                |row| Ok(row.get::<_, i64>(0)? == 1),
            )
            .map_err(storage)?;
        self.holders.clear();
        for (saga_id, resources) in rows {
            let resources: Vec<String> = serde_json::from_str(&resources)
                .map_err(|err| TxError::Corrupt(format!("column `resources`: {err}")))?;
            let saga_id = SagaId::new(saga_id);
            for resource in resources {
                self.add(resource, &saga_id);
            }
        }
        self.n_read = self.holders.len();
        self.upto.clone_from(&self.started_at);
        Ok(())
    }

    /// Adds the claims of the records other writers appended between `upto` and where this
    /// transaction started: each `BeginStep` record's resources, and whether a `Locks`
    /// record claimed some again. Whether it could; it cannot when `upto` is no longer the
    /// record it was (the chain was cut or rewritten), when more than
    /// [`CLAIMS_CATCH_UP_MAX`] records were appended, or when a record is not what this
    /// build writes: the map is then read again whole.
    fn catch_up(&mut self, conn: &dyn Db) -> Result<bool, TxError> {
        let (Some((from, from_hash)), Some((to, _))) = (&self.upto, &self.started_at) else {
            return Ok(false);
        };
        if *to < *from || *to - *from > CLAIMS_CATCH_UP_MAX {
            return Ok(false);
        }
        let records: Vec<(i64, String, Option<String>, String, String)> = conn
            .query_map(
                &format!(
                    "SELECT seq, kind, saga_id, hash, body FROM audit_log
                     WHERE seq >= ?1 AND seq <= ?2
                         AND (seq = ?1 OR kind = '{KIND_BEGIN_STEP}' OR kind = '{KIND_LOCKS}')
                     ORDER BY seq"
                ),
                params![*from, *to],
                |row| {
                    Ok((
                        row.get(0)?,
                        row.get(1)?,
                        row.get(2)?,
                        row.get(3)?,
                        row.get(4)?,
                    ))
                },
            )
            .map_err(storage)?;
        let mut records = records.into_iter();
        // An empty chain's head (0) has no record.
        if *from > 0
            && !records
                .next()
                .is_some_and(|(seq, _, _, hash, _)| seq == *from && hash == *from_hash)
        {
            return Ok(false);
        }
        // A record this build does not write leaves the map to be read whole, which clears
        // what was added before it.
        for (_, kind, saga_id, _, body) in records {
            if kind == KIND_LOCKS {
                self.claimed_again = true;
                continue;
            }
            let (Some(saga_id), Ok(declared)) =
                (saga_id, serde_json::from_str::<DeclaredIn>(&body))
            else {
                return Ok(false);
            };
            let saga_id = SagaId::new(saga_id);
            for resource in declared.resources {
                self.add(resource, &saga_id);
            }
        }
        self.upto.clone_from(&self.started_at);
        Ok(true)
    }

    /// Notes that this writer claimed resources again in the `locks` table
    /// ([`LogWrite::ClaimLocks`](agent_kernel_api::LogWrite::ClaimLocks)).
    pub(crate) fn note_claimed_again(&mut self) {
        self.claimed_again = true;
    }

    /// Notes that `saga_id` claims (or holds) `resource`; whether it was not noted yet.
    pub(crate) fn add(&mut self, resource: String, saga_id: &SagaId) -> bool {
        let sagas = self.holders.entry(resource).or_default();
        if sagas.contains(saga_id) {
            return false;
        }
        sagas.push(saga_id.clone());
        true
    }

    /// Takes back a claim [`add`](Claims::add) newly noted, of a step refused after all.
    pub(crate) fn take_back(&mut self, resource: &str, saga_id: &SagaId) {
        if let Some(sagas) = self.holders.get_mut(resource) {
            sagas.retain(|holder| holder != saga_id);
            if sagas.is_empty() {
                self.holders.remove(resource);
            }
        }
    }
}
