//! [`audit_records`]: the audit chain's records, read back for operators (denials, operator
//! commands, and every other change), newest first; [`saga_chains`]: the whole history of
//! some sagas, oldest first, for `replay` and `export`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use agent_kernel_api::TxError;
use rusqlite::params_from_iter;
use rusqlite::types::Value as SqlValue;
use serde::Serialize;
use serde_json::Value;

use crate::audit::KINDS;
use crate::schema::{self, AUDIT_SCHEMA_VERSION, storage};

/// The most records one [`audit_records`] call returns.
pub const AUDIT_RECORDS_MAX: u32 = 10_000;

/// How many records an [`AuditQuery::default`] asks for.
pub const AUDIT_RECORDS_DEFAULT: u32 = 20;

/// Which records [`audit_records`] returns; the default asks for the newest
/// [`AUDIT_RECORDS_DEFAULT`] of every kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditQuery {
    /// Only these kinds (`PlanDenied`, `Operator`, `RefuseStep`, …); all when empty.
    pub kinds: Vec<String>,
    /// Only the records about this saga.
    pub saga_id: Option<String>,
    /// At most this many, newest first (at most [`AUDIT_RECORDS_MAX`]).
    pub limit: u32,
}

impl Default for AuditQuery {
    fn default() -> Self {
        AuditQuery {
            kinds: Vec::new(),
            saga_id: None,
            limit: AUDIT_RECORDS_DEFAULT,
        }
    }
}

/// One record of the audit chain, as stored.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuditRecord {
    /// Its sequence number.
    pub seq: i64,
    /// When it was written, in ms since the Unix epoch.
    pub at_ms: i64,
    /// Its kind.
    pub kind: String,
    /// The saga it is about, if any.
    pub saga_id: Option<String>,
    /// What it recorded (its canonical JSON body, parsed).
    pub body: Value,
}

/// The record kinds an [`AuditQuery`] may name.
pub fn audit_record_kinds() -> &'static [&'static str] {
    &KINDS
}

/// The records of the log at `path` that `query` selects, newest first. Read-only, like
/// [`verify`](crate::verify), and without checking the chain: run `verify` to know whether
/// they can be trusted.
///
/// # Errors
///
/// [`TxError::NotFound`] naming an unknown kind in `query`; [`TxError::Corrupt`] for a
/// record whose body is not JSON; otherwise as [`verify`](crate::verify) when the log cannot be opened, and
/// [`TxError::Storage`] for a log from before the audit chain.
pub fn audit_records(path: &Path, query: &AuditQuery) -> Result<Vec<AuditRecord>, TxError> {
    if let Some(unknown) = query
        .kinds
        .iter()
        .find(|kind| !KINDS.contains(&kind.as_str()))
    {
        return Err(TxError::NotFound(format!(
            "no audit record is of kind `{unknown}` (kinds: {})",
            KINDS.join(", ")
        )));
    }
    let conn = open_chain(path)?;
    let mut sql = "SELECT seq, at_ms, kind, saga_id, body FROM audit_log WHERE 1 = 1".to_owned();
    let mut bound: Vec<SqlValue> = Vec::new();
    if !query.kinds.is_empty() {
        let marks = vec!["?"; query.kinds.len()].join(", ");
        sql.push_str(&format!(" AND kind IN ({marks})"));
        bound.extend(query.kinds.iter().cloned().map(SqlValue::Text));
    }
    if let Some(saga_id) = &query.saga_id {
        sql.push_str(" AND saga_id = ?");
        bound.push(SqlValue::Text(saga_id.clone()));
    }
    sql.push_str(" ORDER BY seq DESC LIMIT ?");
    bound.push(SqlValue::Integer(i64::from(
        query.limit.min(AUDIT_RECORDS_MAX),
    )));
    read_rows(&conn, &sql, params_from_iter(bound), |_| true)
}

/// The audit records of each saga of `saga_ids`, oldest first (chain order), with no
/// limit: every record whose `saga_id` is one of them. One saga is read by its id; several
/// in one pass over the chain. A saga with no record is absent from the map. Read-only and
/// unchecked, like [`audit_records`].
///
/// # Errors
///
/// As [`audit_records`].
pub fn saga_chains(
    path: &Path,
    saga_ids: &BTreeSet<String>,
) -> Result<BTreeMap<String, Vec<AuditRecord>>, TxError> {
    let conn = open_chain(path)?;
    let records = match saga_ids.iter().next() {
        None => Vec::new(),
        Some(only) if saga_ids.len() == 1 => read_rows(
            &conn,
            "SELECT seq, at_ms, kind, saga_id, body FROM audit_log WHERE saga_id = ?1 ORDER BY seq",
            [only],
            |_| true,
        )?,
        Some(_) => read_rows(
            &conn,
            "SELECT seq, at_ms, kind, saga_id, body FROM audit_log WHERE saga_id IS NOT NULL ORDER BY seq",
            [],
            |saga_id| saga_id.is_some_and(|id| saga_ids.contains(id)),
        )?,
    };
    let mut chains: BTreeMap<String, Vec<AuditRecord>> = BTreeMap::new();
    for record in records {
        if let Some(saga_id) = record.saga_id.clone() {
            chains.entry(saga_id).or_default().push(record);
        }
    }
    Ok(chains)
}

/// A read-only connection to a log for a reader that follows it as it grows (the live
/// OTLP exporter): the chain's newest records and the sagas they are about. Each call sees
/// what was committed before it; nothing is checked (run `verify` for that).
#[derive(Debug)]
pub struct ChainReader {
    conn: rusqlite::Connection,
}

impl ChainReader {
    /// Opens the log at `path` read-only.
    ///
    /// # Errors
    ///
    /// As [`audit_records`].
    pub fn open(path: &Path) -> Result<ChainReader, TxError> {
        Ok(ChainReader {
            conn: open_chain(path)?,
        })
    }

    /// The sequence number of the chain's newest record (0 for an empty chain).
    ///
    /// # Errors
    ///
    /// [`TxError::Storage`] when the log cannot be read.
    pub fn last_seq(&self) -> Result<i64, TxError> {
        self.conn
            .query_row("SELECT coalesce(max(seq), 0) FROM audit_log", [], |row| {
                row.get(0)
            })
            .map_err(storage)
    }

    /// At most `limit` records after `seq`, oldest first.
    ///
    /// # Errors
    ///
    /// As [`audit_records`].
    pub fn records_after(&self, seq: i64, limit: u32) -> Result<Vec<AuditRecord>, TxError> {
        read_rows(
            &self.conn,
            "SELECT seq, at_ms, kind, saga_id, body FROM audit_log WHERE seq > ?1 ORDER BY seq LIMIT ?2",
            rusqlite::params![seq, i64::from(limit)],
            |_| true,
        )
    }

    /// The saga `saga_id` with its steps, if the log holds it.
    ///
    /// # Errors
    ///
    /// [`TxError::Storage`] or [`TxError::Corrupt`] when it cannot be read.
    pub fn saga(
        &self,
        saga_id: &agent_kernel_api::SagaId,
    ) -> Result<Option<agent_kernel_api::SagaRecord>, TxError> {
        crate::store::saga(&self.conn, saga_id)
    }
}

/// Opens the log at `path` read-only for its chain.
fn open_chain(path: &Path) -> Result<rusqlite::Connection, TxError> {
    let path = &crate::create::resolve_db_path(path)?;
    let (conn, version) = schema::open_read_only_checked(path)?;
    if version < AUDIT_SCHEMA_VERSION {
        return Err(TxError::Storage(format!(
            "{} has schema version {version}, which has no audit chain; open it once with this build to start one",
            path.display()
        )));
    }
    Ok(conn)
}

/// The rows `sql` selects (`seq, at_ms, kind, saga_id, body`) whose saga id `keep` accepts,
/// as records; a body that is not JSON is corrupt.
fn read_rows(
    conn: &rusqlite::Connection,
    sql: &str,
    params: impl rusqlite::Params,
    keep: impl Fn(Option<&String>) -> bool,
) -> Result<Vec<AuditRecord>, TxError> {
    let mut statement = conn.prepare(sql).map_err(storage)?;
    let mut rows = statement.query(params).map_err(storage)?;
    let mut records = Vec::new();
    while let Some(row) = rows.next().map_err(storage)? {
        let saga_id: Option<String> = row.get(3).map_err(storage)?;
        if !keep(saga_id.as_ref()) {
            continue;
        }
        let seq: i64 = row.get(0).map_err(storage)?;
        let body: String = row.get(4).map_err(storage)?;
        let body = serde_json::from_str(&body).map_err(|_| {
            TxError::Corrupt(format!(
                "audit record {seq} has a body that is not JSON; run `agent-kernel audit verify`"
            ))
        })?;
        records.push(AuditRecord {
            seq,
            at_ms: row.get(1).map_err(storage)?,
            kind: row.get(2).map_err(storage)?,
            saga_id,
            body,
        });
    }
    Ok(records)
}
