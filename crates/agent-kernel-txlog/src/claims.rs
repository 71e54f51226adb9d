//! The writer's map of the locks unsettled sagas hold through their begun steps
//! ([`Claims`]), which a claim checks instead of reading every such step; kept apart from
//! the log's statements (`store`) and the chain (`audit`), which both carry it.

use std::collections::HashMap;

use agent_kernel_api::{SagaId, TxError};

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

/// One writer's map of the locks unsettled sagas hold through their begun steps, by
/// resource: read from the log ([`HOLDING_SAGAS`]) when first needed in a write transaction,
/// and kept from one transaction to the next while the audit chain's head shows that no
/// other writer committed in between. Between reads it only grows: a saga named here may
/// have settled since, which the claim asks the log before it counts.
///
/// A clone is empty and read again when needed: it stands for a transaction rolled back to
/// an earlier point (a savepoint), whose claims since are gone.
#[derive(Debug, Default)]
pub(crate) struct Claims {
    /// The chain's head (sequence number, hash) after the last transaction this map
    /// followed to its commit; `None` when it must be read again.
    after: Option<(i64, String)>,
    /// Whether `holders` holds every lock of the log's begun steps in this transaction.
    read: bool,
    /// The sagas whose begun steps declared each resource, as read or claimed since.
    holders: HashMap<String, Vec<SagaId>>,
    /// How many resources the last read found.
    n_read: usize,
    /// Whether the `locks` table may hold a claim made again: it held one when read, or this
    /// writer made one since. When not, a claim does not look there.
    claimed_again: bool,
}

impl Clone for Claims {
    fn clone(&self) -> Claims {
        Claims::default()
    }
}

impl Claims {
    /// Enters a write transaction whose chain starts at the record `seq` of hash `hash`: what
    /// the map holds is kept only when this writer's own transaction was the last to commit.
    pub(crate) fn begin(&mut self, seq: i64, hash: &str) {
        if self
            .after
            .as_ref()
            .is_none_or(|(after_seq, after_hash)| *after_seq != seq || after_hash != hash)
        {
            self.read = false;
        }
        self.after = None;
    }

    /// Leaves a write transaction that committed with its chain at the record `seq` of hash
    /// `hash`.
    pub(crate) fn committed(&mut self, seq: i64, hash: &str) {
        self.after = Some((seq, hash.to_owned()));
    }

    /// The sagas noted as holding `resource` (some may have settled since).
    pub(crate) fn holders_mut(&mut self, resource: &str) -> Option<&mut Vec<SagaId>> {
        self.holders.get_mut(resource)
    }

    /// Whether the `locks` table may hold a claim made again.
    pub(crate) fn may_hold_claims_again(&self) -> bool {
        self.claimed_again
    }

    /// Reads every lock of the log's begun steps, unless the map holds them already and has
    /// not grown past its bound ([`CLAIMS_SLACK`]). Call only where every claim the map holds
    /// is in the log's rows too: before a batch's claims, not between them.
    pub(crate) fn read_if_needed(&mut self, conn: &dyn Db) -> Result<(), TxError> {
        if self.read && self.holders.len() <= self.n_read.saturating_mul(2) + CLAIMS_SLACK {
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
        self.read = true;
        Ok(())
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
