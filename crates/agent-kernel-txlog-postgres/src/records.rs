//! The audit chain's records read back on PostgreSQL, as [`agent_kernel_txlog`] reads them
//! from an SQLite file: [`audit_records`] for operators (`audit list`), newest first;
//! [`saga_chains`], the whole history of some sagas, oldest first (`replay`, `export`).

use std::collections::{BTreeMap, BTreeSet};
use std::str::FromStr;

use agent_kernel_api::TxError;
use agent_kernel_txlog::{AUDIT_RECORDS_MAX, AuditQuery, AuditRecord, audit_record_kinds};
use postgres::types::ToSql;
use postgres::{Config, NoTls};

use crate::connection::{snapshot, with_timeouts};
use crate::db::describe_error;
use crate::schema::{self, Inspected, storage};
use crate::{LEASE_DEFAULT, describe};

/// The records `query` selects, newest first: those of its kinds (all when none is named),
/// about its saga if it names one, at most its `limit` (and [`AUDIT_RECORDS_MAX`]).
const RECORDS_SQL: &str = "SELECT seq, at_ms, kind, saga_id, body FROM audit_log \
     WHERE (cardinality($1::text[]) = 0 OR kind = ANY($1)) \
       AND ($2::text IS NULL OR saga_id = $2) \
     ORDER BY seq DESC LIMIT $3";

/// The records of the log `url` names that `query` selects, newest first, read in one
/// read-only snapshot and without checking the chain: run
/// [`verify`](crate::verify) to know whether they can be trusted.
///
/// Blocks (on a thread of its own) while it reads.
///
/// # Errors
///
/// [`TxError::NotFound`] naming an unknown kind in `query`; [`TxError::NotALog`] when the
/// connection's current schema holds no log, or something else; [`TxError::SchemaTooNew`]; [`TxError::Corrupt`] for a record whose body is not
/// JSON; [`TxError::Storage`] when the URL does not parse or the server cannot be reached.
pub fn audit_records(url: &str, query: &AuditQuery) -> Result<Vec<AuditRecord>, TxError> {
    let kinds = audit_record_kinds();
    if let Some(unknown) = query
        .kinds
        .iter()
        .find(|kind| !kinds.contains(&kind.as_str()))
    {
        return Err(TxError::NotFound(format!(
            "no audit record is of kind `{unknown}` (kinds: {})",
            kinds.join(", ")
        )));
    }
    let limit = i64::from(query.limit.min(AUDIT_RECORDS_MAX));
    read_rows(url, RECORDS_SQL, &[&query.kinds, &query.saga_id, &limit])
}

/// Every record about a saga of `saga_ids`.
const CHAINS_SQL: &str = "SELECT seq, at_ms, kind, saga_id, body FROM audit_log \
     WHERE saga_id = ANY($1) ORDER BY seq";

/// The audit records of each saga of `saga_ids` in the log `url` names, oldest first (chain
/// order), with no limit; a saga with no record is absent from the map. Read in one
/// read-only snapshot, unchecked, like [`audit_records`].
///
/// # Errors
///
/// As [`audit_records`].
pub fn saga_chains(
    url: &str,
    saga_ids: &BTreeSet<String>,
) -> Result<BTreeMap<String, Vec<AuditRecord>>, TxError> {
    let mut chains: BTreeMap<String, Vec<AuditRecord>> = BTreeMap::new();
    if saga_ids.is_empty() {
        return Ok(chains);
    }
    let ids: Vec<&str> = saga_ids.iter().map(String::as_str).collect();
    for record in read_rows(url, CHAINS_SQL, &[&ids])? {
        if let Some(saga_id) = record.saga_id.clone() {
            chains.entry(saga_id).or_default().push(record);
        }
    }
    Ok(chains)
}

/// Whether the log `url` names exists: its connection's current schema holds a log (of
/// this build, or older), not nothing. A reader asks before it opens the log, which would
/// create one. Blocks (on a thread of its own) while it asks.
///
/// # Errors
///
/// [`TxError::NotALog`] when the schema holds something else; [`TxError::SchemaTooNew`];
/// [`TxError::Storage`] when the URL does not parse or the server cannot be reached.
pub fn holds_log(url: &str) -> Result<bool, TxError> {
    in_snapshot(url, |_, _, inspected| {
        Ok(!matches!(inspected, Inspected::Empty))
    })
}

/// The records `sql` (whose columns are `seq, at_ms, kind, saga_id, body`) selects with
/// `params`, from the log the connection's current schema holds (an empty one is no log,
/// and a table of that name further along the `search_path` is not this one's; one with
/// something this build never makes is still read: nothing here is checked).
fn read_rows(
    url: &str,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<AuditRecord>, TxError> {
    in_snapshot(url, |tx, target, inspected| {
        if let Inspected::Empty = inspected {
            return Err(TxError::NotALog {
                path: target.to_owned(),
                reason: "its schema holds no log".to_owned(),
            });
        }
        let storage = |err: &postgres::Error| {
            TxError::Storage(format!("cannot read {target}: {}", describe_error(err)))
        };
        let rows = tx.query(sql, params).map_err(|err| storage(&err))?;
        rows.iter()
            .map(|row| {
                let seq: i64 = row.try_get(0).map_err(|err| storage(&err))?;
                let body: String = row.try_get(4).map_err(|err| storage(&err))?;
                let body = serde_json::from_str(&body).map_err(|_| {
                    TxError::Corrupt(format!(
                        "audit record {seq} has a body that is not JSON; run `agent-kernel audit verify`"
                    ))
                })?;
                Ok(AuditRecord {
                    seq,
                    at_ms: row.try_get(1).map_err(|err| storage(&err))?,
                    kind: row.try_get(2).map_err(|err| storage(&err))?,
                    saga_id: row.try_get(3).map_err(|err| storage(&err))?,
                    body,
                })
            })
            .collect()
    })
}

/// What `read` makes of the log `url` names, in one read-only snapshot, given the log's
/// description (without its password) and what its current schema holds: on a connection
/// of its own, with the log's timeouts and name, opened and read on a thread of its own
/// (the blocking client may not run on an async runtime's thread).
fn in_snapshot<T: Send>(
    url: &str,
    read: impl FnOnce(&mut postgres::Transaction<'_>, &str, Inspected) -> Result<T, TxError> + Send,
) -> Result<T, TxError> {
    let config = Config::from_str(url)
        .map_err(|err| TxError::Storage(format!("the database URL does not parse: {err}")))?;
    let target = describe(&config);
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let mut client = with_timeouts(&config, LEASE_DEFAULT)
                    .connect(NoTls)
                    .map_err(|err| {
                        TxError::Storage(format!(
                            "cannot connect to {target}: {}",
                            describe_error(&err)
                        ))
                    })?;
                let mut tx = snapshot(&mut client)?;
                let inspected = schema::inspect(&mut tx, &target)?;
                let value = read(&mut tx, &target, inspected)?;
                tx.commit().map_err(storage)?;
                Ok(value)
            })
            .join()
            .map_err(|_| TxError::Storage("the reading thread panicked".to_owned()))?
    })
}
