//! Pruning ([`LogWrite::Prune`](agent_kernel_api::LogWrite::Prune)): finished sagas leave
//! the tables, their records stay in the chain, and one checkpoint record names them with
//! the hash of those records, so `verify` can replay the chain through the prune.

use std::collections::{BTreeMap, BTreeSet};

use agent_kernel_api::{PruneSagas, SagaId, SagaRecord, TxError, WriteOutcome};

use sha2::{Digest as _, Sha256};

use crate::audit::{CanonicalObject, KIND_CREATE_SAGA, hex};
use crate::sql::storage;
use crate::sql::{Db, params};
use crate::store;

pub use agent_kernel_api::{PRUNE_IDS_BYTES_MAX, PRUNE_SAGAS_MAX};

/// The condition a saga row `s` must meet to be pruned at horizon `?1`: settled for good
/// (`Done`, `FailedRolledBack`, `Undone`; never `FailedRollbackPartial`, whose effects an
/// operator must still see to), last changed before the horizon, no open dead letter, no
/// open approval request, no lock held again (an `undo` under way, or killed and left for
/// `recover` to finish).
const PRUNABLE: &str = "(s.state = 'Done' OR s.state = 'FailedRolledBack' OR s.state = 'Undone')
    AND s.updated_at_ms < ?1
    AND NOT EXISTS (SELECT 1 FROM dead_letters d
        WHERE d.saga_id = s.saga_id AND d.status = 'open')
    AND NOT EXISTS (SELECT 1 FROM approvals a
        WHERE a.saga_id = s.saga_id AND (a.status = 'pending' OR a.status = 'approved'))
    AND NOT EXISTS (SELECT 1 FROM locks l WHERE l.saga_id = s.saga_id)";

/// The running hash of one saga's records: SHA-256 over each record's hash and a newline,
/// in chain order, for every record whose `saga_id` column names the saga, from its
/// latest `CreateSaga` record on (an id pruned, then created again, starts afresh).
#[derive(Debug, Clone, Default)]
pub(crate) struct SagaRecords(Sha256);

/// A running hash in `verify`'s scratch database: the hex of SHA-256's serialized state.
impl serde::Serialize for SagaRecords {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use sha2::digest::common::hazmat::SerializableState as _;
        serializer.serialize_str(&hex(&self.0.serialize()))
    }
}

impl<'de> serde::Deserialize<'de> for SagaRecords {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        use sha2::digest::common::hazmat::SerializableState as _;
        let text = String::deserialize(deserializer)?;
        let bytes = (0..text.len())
            .step_by(2)
            .map(|at| {
                text.get(at..at + 2)
                    .and_then(|pair| u8::from_str_radix(pair, 16).ok())
            })
            .collect::<Option<Vec<u8>>>()
            .ok_or_else(|| D::Error::custom("a running hash's state is not hex"))?;
        let state = bytes
            .as_slice()
            .try_into()
            .map_err(|_| D::Error::custom("a running hash's state has the wrong length"))?;
        Sha256::deserialize(state)
            .map(SagaRecords)
            .map_err(|_| D::Error::custom("a running hash's state does not decode"))
    }
}

impl SagaRecords {
    pub(crate) fn add(&mut self, record_hash: &str) {
        self.0.update(record_hash.as_bytes());
        self.0.update(b"\n");
    }

    fn finish(self) -> [u8; 32] {
        self.0.finalize().into()
    }
}

/// The checkpoint's `records_sha256`: SHA-256 over each pruned saga's id, a colon, the hex
/// of its [`SagaRecords`] and a newline, in the order of the ids.
pub(crate) fn records_sha256(sagas: BTreeMap<&str, SagaRecords>) -> String {
    let mut all = Sha256::new();
    for (saga_id, records) in sagas {
        all.update(saga_id.as_bytes());
        all.update(b":");
        all.update(hex(&records.finish()).as_bytes());
        all.update(b"\n");
    }
    hex(&all.finalize())
}

/// The sagas a prune at `before_ms` would remove, with their steps (see
/// [`TxLog::prune_candidates`](agent_kernel_api::TxLog::prune_candidates)).
pub(crate) fn candidates(
    conn: &dyn Db,
    before_ms: i64,
    after: Option<&(i64, SagaId)>,
    limit: u32,
) -> Result<Vec<SagaRecord>, TxError> {
    let (after_ms, after_id) = match after {
        Some((created_at_ms, saga_id)) => (*created_at_ms, saga_id.as_str()),
        None => (i64::MIN, ""),
    };
    let ids: Vec<String> = conn
        .query_map(
            &format!(
                "SELECT s.saga_id FROM sagas s
                 WHERE (s.created_at_ms > ?2 OR (s.created_at_ms = ?2 AND s.saga_id > ?3))
                     AND {PRUNABLE}
                 ORDER BY s.created_at_ms, s.saga_id LIMIT ?4"
            ),
            params![before_ms, after_ms, after_id, limit],
            |row| row.get(0),
        )
        .map_err(storage)?;
    let mut records = Vec::with_capacity(ids.len());
    for saga_id in ids {
        let saga_id = SagaId::new(saga_id);
        if let Some(record) = store::saga(conn, &saga_id)? {
            records.push(record);
        }
    }
    Ok(records)
}

/// Removes the named sagas that are still prunable, inside the caller's transaction;
/// returns the outcome and, when any was removed, the checkpoint record's body.
pub(crate) fn prune(
    conn: &dyn Db,
    write: &PruneSagas,
) -> Result<(WriteOutcome, Option<String>), TxError> {
    let ids_bytes: usize = write.saga_ids.iter().map(|id| id.as_str().len()).sum();
    if write.saga_ids.len() > PRUNE_SAGAS_MAX || ids_bytes > PRUNE_IDS_BYTES_MAX {
        return Err(TxError::Corrupt(format!(
            "a prune names {} sagas in {ids_bytes} bytes, more than the maximum of {PRUNE_SAGAS_MAX} or {PRUNE_IDS_BYTES_MAX} bytes",
            write.saga_ids.len()
        )));
    }
    let mut pruned = BTreeSet::new();
    let still = format!("SELECT 1 FROM sagas s WHERE s.saga_id = ?2 AND {PRUNABLE}");
    for saga_id in &write.saga_ids {
        if conn
            .exists(&still, params![write.before_ms, saga_id.as_str()])
            .map_err(storage)?
        {
            pruned.insert(saga_id.as_str());
        }
    }
    if pruned.is_empty() {
        let outcome = WriteOutcome::Pruned {
            n_sagas: 0,
            n_steps: 0,
        };
        return Ok((outcome, None));
    }
    // One pass over the chain: the records of the pruned sagas, in order.
    let mut records: BTreeMap<&str, SagaRecords> = pruned
        .iter()
        .map(|saga_id| (*saga_id, SagaRecords::default()))
        .collect();
    conn.query_each(
        "SELECT saga_id, kind, hash FROM audit_log WHERE saga_id IS NOT NULL ORDER BY seq",
        params![],
        &mut |row| {
            let saga_id: String = row.get(0)?;
            if let Some(saga) = records.get_mut(saga_id.as_str()) {
                let kind: String = row.get(1)?;
                if kind == KIND_CREATE_SAGA {
                    *saga = SagaRecords::default();
                }
                let hash: String = row.get(2)?;
                saga.add(&hash);
            }
            Ok(true)
        },
    )
    .map_err(storage)?;
    let mut n_steps = 0_u64;
    for saga_id in &pruned {
        for sql in [
            "DELETE FROM idempotency_keys WHERE saga_id = ?1",
            "DELETE FROM approvals WHERE saga_id = ?1",
            "DELETE FROM dead_letters WHERE saga_id = ?1",
            "DELETE FROM step_keys WHERE saga_id = ?1",
        ] {
            conn.execute(sql, params![saga_id]).map_err(storage)?;
        }
        super::locks::release(conn, &SagaId::new(*saga_id))?;
        let steps = conn
            .execute(
                "DELETE FROM saga_steps WHERE saga_id = ?1",
                params![saga_id],
            )
            .map_err(storage)?;
        n_steps += steps as u64;
        conn.execute("DELETE FROM sagas WHERE saga_id = ?1", params![saga_id])
            .map_err(storage)?;
    }
    let body = CanonicalObject::new()
        .int("before_ms", write.before_ms)
        .int("n_steps", n_steps)
        .str("records_sha256", &records_sha256(records))
        .str_array("saga_ids", pruned.iter().copied())
        .finish();
    let outcome = WriteOutcome::Pruned {
        n_sagas: pruned.len() as u64,
        n_steps,
    };
    Ok((outcome, Some(body)))
}
