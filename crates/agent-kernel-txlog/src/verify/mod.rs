//! [`verify`]: checks a log's audit chain, its head file, and that the tables the kernel
//! reads say what the chain says.

mod approvals;
mod compare;
mod dead_letters;
mod model;
mod replay;
mod sagas;

#[allow(clippy::wildcard_imports)]
use self::model::*;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;

use crate::sql::{Db, Error as SqlError, Row as SqlRow, Value as SqlValue, params};
use agent_kernel_api::{ApprovalStatus, DeadLetterStatus, SagaState, StepStatus, TxError};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::audit::{
    self, AuditKey, KIND_APPROVAL_CONSUMED, KIND_APPROVAL_DECIDED, KIND_APPROVAL_REQUESTED,
    KIND_BEGIN_STEP, KIND_CALL_REFUSED, KIND_COMMIT_STEP, KIND_COMPENSATION, KIND_CREATE_SAGA,
    KIND_DEAD_LETTER, KIND_DEAD_LETTER_SETTLED, KIND_FAIL_STEP, KIND_GENESIS, KIND_LOCK_CONFLICT,
    KIND_LOCKS, KIND_OPERATOR, KIND_PLAN_DENIED, KIND_PRUNE, KIND_REFUSE_STEP, KIND_REUSE_STEP,
    KIND_SAGA_ABORTED, KIND_SET_STATE, KIND_SIMULATE_STEP, KIND_TAKE_OVER, Record, ZERO_HASH,
    sha256_hex,
};
use crate::head::{self, AuditHead};
use crate::schema::{self, AUDIT_SCHEMA_VERSION};
use crate::spill::{self, Entry, Key, Scratch, Spill, VERIFY_ENTRIES_IN_MEMORY_MAX};
use crate::store::prune::SagaRecords;

/// What [`verify`] found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditReport {
    /// How many records passed every check of the chain, from the first on (all of them
    /// when the log is intact).
    pub n_records: u64,
    /// The newest record that passed, if any.
    pub head: Option<AuditHead>,
    /// What the head file next to the database says, when it could be read.
    pub head_file: Option<AuditHead>,
    /// Whether MACs were checked (a key was given).
    pub macs_verified: bool,
    /// How many of the records read carry a MAC.
    pub n_records_with_mac: u64,
    /// The first problem found; `None` when the log is intact.
    pub first_bad: Option<BadRecord>,
}

impl AuditReport {
    /// Whether nothing was found wrong.
    pub fn is_intact(&self) -> bool {
        self.first_bad.is_none()
    }
}

/// The first record found bad, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BadRecord {
    /// The record the problem was found at: the record that is missing, edited or
    /// contradicted, or, for a row of the tables that no record accounts for, the first
    /// sequence number after the chain's end (where such a record would have had to be);
    /// 0 when the problem is the schema itself (an object this build never creates, or one
    /// missing or changed), found before any record is read.
    pub seq: u64,
    /// What is wrong, in a sentence.
    pub reason: String,
}

/// Checks the log at `path` without changing anything.
///
/// The database is opened read-only (no migration, no journal-mode change) after the same
/// checks [`SqliteLog::open`](crate::SqliteLog::open) makes, and read in one snapshot.
/// The checks, in order:
///
/// 1. the chain: sequence numbers run 1, 2, 3, … without gaps; each record's hash
///    recomputes from its content; each `prev_hash` is the previous record's hash; with
///    `key`, each record carries a MAC that verifies;
///    then each record must make sense after the ones before it (a step is committed only
///    after it was begun, a saga is created once, …);
/// 2. the head file: it exists when the chain is not empty, names a record the chain has,
///    with that record's hash (and, with `key`, a MAC that verifies);
/// 3. the tables: replaying the chain gives every saga's state, owner and timestamps,
///    every step's status and content hashes, and every idempotency key's binding; the
///    tables `sagas`, `saga_steps` and `idempotency_keys` must hold exactly that.
///
/// The first problem found is reported in [`AuditReport::first_bad`]; a problem with the
/// chain (1) stops the check there, and among problems with the tables (3) the one at the
/// earliest record is reported.
///
/// Without `key`, someone who can write the database and the head file can rewrite the
/// whole chain consistently, and this check cannot tell. Records written after the head
/// file's last update (an unfinished saga, a crash) can be removed from the end, with the
/// tables edited to match, without the head file noticing.
///
/// The head file is read before the database: a writer updates it only after committing,
/// so a log in use never looks tampered with.
/// The database's content is never changed; SQLite may still create the `-wal` and `-shm`
/// files of a log in WAL mode, as any reader does.
/// Memory is bounded: the replayed tables keep at most
/// [`VERIFY_ENTRIES_IN_MEMORY_MAX`](crate::VERIFY_ENTRIES_IN_MEMORY_MAX) sagas, steps,
/// keys, requests and dead letters each in memory, and the rest in a scratch database in
/// the temporary directory, deleted when the check ends.
///
/// # Errors
///
/// [`TxError::NotALog`] or [`TxError::SchemaTooNew`] as for
/// [`SqliteLog::open`](crate::SqliteLog::open), [`TxError::Storage`] when the file does not
/// exist or cannot be opened, when its schema predates the audit chain (version 1) and
/// it has no head file (open it once with this build to start the chain), or when the
/// scratch database fails (a full temporary directory): the log is then neither found
/// intact nor found tampered with.
pub fn verify(path: &Path, key: Option<&AuditKey>) -> Result<AuditReport, TxError> {
    verify_with(path, key, HeadFile::Check, VERIFY_ENTRIES_IN_MEMORY_MAX)
}

/// [`verify`], keeping at most `entries_in_memory` (at least 1) entries of each replayed
/// table in memory instead of
/// [`VERIFY_ENTRIES_IN_MEMORY_MAX`](crate::VERIFY_ENTRIES_IN_MEMORY_MAX): less memory,
/// more reads and writes of the scratch database. The report is the same whatever the
/// bound.
///
/// # Errors
///
/// As [`verify`].
pub fn verify_bounded(
    path: &Path,
    key: Option<&AuditKey>,
    entries_in_memory: usize,
) -> Result<AuditReport, TxError> {
    verify_with(path, key, HeadFile::Check, entries_in_memory)
}

/// [`verify`] without check 2 (the head file): the chain and the tables only.
///
/// What an operator runs before sealing a log whose head file was lost or disagrees with
/// the database ([`SqliteLog::seal`](crate::SqliteLog::seal)); it cannot tell whether the
/// newest records were removed.
///
/// # Errors
///
/// As [`verify`].
pub fn verify_ignoring_head_file(
    path: &Path,
    key: Option<&AuditKey>,
) -> Result<AuditReport, TxError> {
    verify_with(path, key, HeadFile::Ignore, VERIFY_ENTRIES_IN_MEMORY_MAX)
}

/// Whether [`verify_with`] checks the head file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HeadFile {
    Check,
    Ignore,
}

fn verify_with(
    path: &Path,
    key: Option<&AuditKey>,
    head_check: HeadFile,
    entries_in_memory: usize,
) -> Result<AuditReport, TxError> {
    let path = &crate::create::resolve_db_path(path)?;
    let head_file = head::read(path);
    let (mut conn, version) = schema::open_read_only(path)?;
    let mut report = AuditReport {
        n_records: 0,
        head: None,
        head_file: head_file
            .as_ref()
            .ok()
            .and_then(Option::as_ref)
            .map(AuditHead::from),
        macs_verified: key.is_some(),
        n_records_with_mac: 0,
        first_bad: None,
    };
    // The schema first: a trigger, a view or a changed table could make the rows read below
    // say something other than what was written.
    if let Some(reason) = schema::schema_difference(&conn, version)? {
        report.first_bad = Some(BadRecord {
            seq: 0,
            reason: format!("the schema is not this build's: {reason}"),
        });
        return Ok(report);
    }
    // The same SQL text can sit over index pages rebuilt to hide rows (a partial index
    // emptied through `writable_schema`, say): SQLite's own check compares every index with
    // its table.
    if let Some(problem) = schema::integrity_problem(&conn)? {
        report.first_bad = Some(BadRecord {
            seq: 0,
            reason: format!("the database fails SQLite's integrity check: {problem}"),
        });
        return Ok(report);
    }
    if version < AUDIT_SCHEMA_VERSION {
        let head = match head_file {
            Ok(None) => {
                return Err(TxError::Storage(format!(
                    "{} has schema version {version}, which has no audit chain; open it once with this build (for example `agent-kernel log`) to start one",
                    path.display()
                )));
            }
            Ok(Some(head)) => format!("names record {}", head.seq),
            Err(reason) => reason,
        };
        report.first_bad = Some(BadRecord {
            seq: 1,
            reason: format!(
                "the log has schema version {version}, without an audit chain, but it has a head file ({head}): the chain was removed"
            ),
        });
        return Ok(report);
    }
    // One snapshot for everything below, even while writers go on.
    let tx = conn.transaction().map_err(schema::storage)?;
    let head_path = head::head_path(path);
    let anchor = (head_check == HeadFile::Check).then(|| Anchor {
        head: head_file,
        name: "the head file",
        location: head_path.display().to_string(),
    });
    verify_chain_and_tables(
        &tx,
        Tables::of_version(version),
        key,
        anchor,
        entries_in_memory,
        &mut report,
    )?;
    Ok(report)
}

/// Where the chain's newest record is vouched for outside the chain, as read before the
/// chain: SQLite's head file, PostgreSQL's anchor row.
pub(crate) struct Anchor {
    /// What it holds, or why it cannot be read; `None` when there is none.
    pub(crate) head: Result<Option<crate::audit::Head>, String>,
    /// What it is, in messages ("the head file").
    pub(crate) name: &'static str,
    /// Where it is, in messages (the head file's path).
    pub(crate) location: String,
}

/// Checks 1 to 3 of [`verify`] over any backend, in the caller's snapshot: the chain, the
/// anchor of its head (when `anchor` is given) and the tables, into `report`, keeping at
/// most `entries_in_memory` entries of each replayed table in memory. `Err` only when the
/// scratch database of the replay failed: nothing is then known about the log.
pub(crate) fn verify_chain_and_tables(
    conn: &dyn Db,
    tables: Tables,
    key: Option<&AuditKey>,
    anchor: Option<Anchor>,
    entries_in_memory: usize,
    report: &mut AuditReport,
) -> Result<(), TxError> {
    let mut replay = Replay::new(entries_in_memory);
    let scratch_failed = |replay: &Replay| {
        replay.scratch.failure().map_or(Ok(()), |failure| {
            Err(TxError::Storage(format!(
                "the log could not be verified: {failure}"
            )))
        })
    };
    let last = match check_chain(conn, key, &mut replay, report) {
        Ok(last) => last,
        Err(bad) => {
            scratch_failed(&replay)?;
            report.first_bad = Some(bad);
            return Ok(());
        }
    };
    report.head = (last.seq > 0).then(|| AuditHead {
        seq: last.seq.unsigned_abs(),
        hash: last.hash.clone(),
    });
    if let Some(anchor) = anchor
        && let Err(bad) = check_head_file(conn, anchor, &last, key)
    {
        report.first_bad = Some(bad);
        return Ok(());
    }
    let first_bad = replay.compare(conn, tables, last.seq);
    scratch_failed(&replay)?;
    report.first_bad = first_bad;
    Ok(())
}

fn bad(seq: i64, reason: impl Into<String>) -> BadRecord {
    BadRecord {
        seq: seq.max(0).unsigned_abs(),
        reason: reason.into(),
    }
}

/// The newest record that passed.
struct Last {
    seq: i64,
    hash: String,
}

/// Walks the chain in order; returns its newest record, or the first bad one.
fn check_chain(
    conn: &dyn Db,
    key: Option<&AuditKey>,
    replay: &mut Replay,
    report: &mut AuditReport,
) -> Result<Last, BadRecord> {
    let mut last = Last {
        seq: 0,
        hash: ZERO_HASH.to_owned(),
    };
    let mut first_bad = None;
    let read = conn.query_each(
        "SELECT seq, at_ms, kind, saga_id, body, prev_hash, hash, mac
         FROM audit_log ORDER BY seq",
        params![],
        &mut |row| match check_record(row, &last, key, replay, report) {
            Ok(record) => {
                last = record;
                Ok(true)
            }
            Err(bad) => {
                first_bad = Some(bad);
                Ok(false)
            }
        },
    );
    if let Some(bad) = first_bad {
        return Err(bad);
    }
    if let Err(err) = read {
        let expected_seq = last.seq + 1;
        return Err(bad(
            expected_seq,
            if last.seq == 0 {
                format!("the audit_log table cannot be read: {err}")
            } else {
                format!(
                    "the database cannot be read past record {}: {err}",
                    last.seq
                )
            },
        ));
    }
    Ok(last)
}

/// Checks the record `row` holds, which must follow `last`; it becomes the newest.
fn check_record(
    row: &SqlRow,
    last: &Last,
    key: Option<&AuditKey>,
    replay: &mut Replay,
    report: &mut AuditReport,
) -> Result<Last, BadRecord> {
    let expected_seq = last.seq + 1;
    let record =
        record_from_row(row).map_err(|(seq, reason)| bad(seq.unwrap_or(expected_seq), reason))?;
    let seq = record.seq;
    if record.mac.is_some() {
        report.n_records_with_mac += 1;
    }
    if seq < 1 {
        return Err(bad(
            expected_seq,
            format!("a record has the sequence number {seq}; the chain starts at 1"),
        ));
    }
    if seq > expected_seq {
        return Err(bad(
            expected_seq,
            format!(
                "record {expected_seq} is missing: the chain jumps from record {} to record {seq}",
                last.seq
            ),
        ));
    }
    if seq < expected_seq {
        return Err(bad(
            seq,
            format!("record {seq} appears twice or out of order"),
        ));
    }
    record
        .view()
        .check_form()
        .map_err(|reason| bad(seq, reason))?;
    if record.view().expected_hash() != record.hash {
        return Err(bad(
            seq,
            "its hash does not match its content: the record was edited, or moved or copied from another place in the chain",
        ));
    }
    if record.prev_hash != last.hash {
        return Err(bad(
            seq,
            format!(
                "its prev_hash is not the hash of record {}: records were removed, inserted or reordered before it",
                last.seq
            ),
        ));
    }
    if let Some(key) = key {
        match &record.mac {
            None => {
                return Err(bad(
                    seq,
                    "it has no MAC, but a key was given: it was written without the key, or its MAC was removed",
                ));
            }
            Some(mac) if !key.verifies(&record.hash, mac) => {
                return Err(bad(
                    seq,
                    "its MAC does not verify with the key: the chain was rewritten without the key, or the key is wrong",
                ));
            }
            Some(_) => {}
        }
    }
    replay.apply(&record).map_err(|reason| bad(seq, reason))?;
    report.n_records += 1;
    Ok(Last {
        seq,
        hash: record.hash,
    })
}

/// Reads one row without trusting its types: a tampered table need not be STRICT.
/// On failure, the row's seq (when readable) and why.
fn record_from_row(row: &SqlRow) -> Result<Record, (Option<i64>, String)> {
    let seq = match row.value(0) {
        SqlValue::Integer(seq) => *seq,
        _ => return Err((None, "a record's seq is not an integer".to_owned())),
    };
    let wrong = |name: &str, what: &str| (Some(seq), format!("its {name} is not {what}"));
    let integer = |idx: usize, name: &str| match row.value(idx) {
        SqlValue::Integer(value) => Ok(*value),
        _ => Err(wrong(name, "an integer")),
    };
    let text = |idx: usize, name: &str| match row.value(idx) {
        SqlValue::Text(value) => Ok(Some(value.clone())),
        SqlValue::Null => Ok(None),
        _ => Err(wrong(name, "text")),
    };
    let required = |value: Option<String>, name: &str| value.ok_or_else(|| wrong(name, "set"));
    Ok(Record {
        seq,
        at_ms: integer(1, "at_ms")?,
        kind: required(text(2, "kind")?, "kind")?,
        saga_id: text(3, "saga_id")?,
        body: required(text(4, "body")?, "body")?,
        prev_hash: required(text(5, "prev_hash")?, "prev_hash")?,
        hash: required(text(6, "hash")?, "hash")?,
        mac: text(7, "mac")?,
    })
}

fn check_head_file(
    conn: &dyn Db,
    anchor: Anchor,
    last: &Last,
    key: Option<&AuditKey>,
) -> Result<(), BadRecord> {
    let Anchor {
        head: head_file,
        name,
        location,
    } = anchor;
    let head = match head_file {
        Err(reason) => return Err(bad(last.seq.max(1), reason)),
        Ok(None) if last.seq == 0 => return Ok(()),
        Ok(None) => {
            return Err(bad(
                last.seq,
                format!("{name} {location} is missing, so nothing vouches for the newest records"),
            ));
        }
        Ok(Some(head)) => head,
    };
    if head.seq > last.seq {
        return Err(bad(
            head.seq,
            format!(
                "{name} names record {}, but the log ends at record {}: records were deleted at the end, or an older copy of the database was put in its place",
                head.seq, last.seq
            ),
        ));
    }
    let hash = if head.seq == 0 {
        ZERO_HASH.to_owned()
    } else {
        audit::hash_at(conn, head.seq)
            .and_then(|hash| hash.ok_or(crate::sql::Error::NoRows))
            .map_err(|err| {
                bad(
                    head.seq,
                    format!("record {} cannot be read: {err}", head.seq),
                )
            })?
    };
    if head.hash != hash {
        return Err(bad(
            head.seq.max(1),
            format!(
                "{name}'s hash for record {} is not the record's: the database holds a different history than the one {name} recorded",
                head.seq
            ),
        ));
    }
    // A head at record 0 vouches for nothing, so its MAC does not matter (it has none when
    // the log was first opened without the key).
    if let Some(key) = key.filter(|_| head.seq > 0) {
        match &head.mac {
            None => {
                return Err(bad(
                    head.seq,
                    format!("{name} has no MAC, but a key was given"),
                ));
            }
            Some(mac) if !key.verifies(&head.hash, mac) => {
                return Err(bad(
                    head.seq,
                    format!(
                        "{name}'s MAC does not verify with the key: it was rewritten without the key, or the key is wrong"
                    ),
                ));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// Why a walk over a [`Spill`] stopped: the log's read, or the scratch database.
enum Fault {
    Log(SqlError),
    Scratch(spill::Error),
}

impl From<spill::Error> for Fault {
    fn from(err: spill::Error) -> Fault {
        Fault::Scratch(err)
    }
}

/// Which of the newer tables and columns a log's schema has (older SQLite versions lack
/// some).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tables {
    /// `sagas.dry_run` (SQLite schema version 3 on).
    pub(crate) dry_run: bool,
    /// `approvals` (version 5 on).
    pub(crate) approvals: bool,
    /// `dead_letters` (version 5 on).
    pub(crate) dead_letters: bool,
    /// `saga_steps.resources` (version 8 on; version 7 kept them in `step_keys`).
    pub(crate) step_resources: bool,
}

impl Tables {
    /// What SQLite schema `version` holds.
    pub(crate) fn of_version(version: i64) -> Tables {
        Tables {
            dry_run: version >= 3,
            approvals: version >= 5,
            dead_letters: version >= 5,
            step_resources: version >= 8,
        }
    }
}

/// The problem at the earliest record found so far.
struct Found {
    first: Option<BadRecord>,
    /// Where rows that no record accounts for are reported: just past the chain's end.
    unaccounted_seq: i64,
}

impl Found {
    fn note(&mut self, seq: i64, reason: String) {
        let candidate = bad(seq, reason);
        if self
            .first
            .as_ref()
            .is_none_or(|first| candidate.seq < first.seq)
        {
            self.first = Some(candidate);
        }
    }

    fn unaccounted(&mut self, reason: String) {
        self.note(self.unaccounted_seq, reason);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the chain knows of a column (its value, or NULL) and what it does not know stay
    /// apart through the scratch database's encoding.
    #[test]
    fn known_and_unknown_columns_survive_the_scratch_database() {
        let step = StepModel {
            last_seq: 3,
            status: StepStatus::Begin,
            content: None,
            output_sha256: Some(None),
            error_sha256: None,
            compensation_sha256: Some(Some("c".repeat(64))),
            created_at_ms: None,
            updated_at_ms: Some(5),
        };
        let text = serde_json::to_string(&step).expect("encodes");
        let back: StepModel = serde_json::from_str(&text).expect("decodes");
        assert_eq!(back.output_sha256, Some(None), "{text}");
        assert_eq!(back.error_sha256, None, "{text}");
        assert_eq!(back.compensation_sha256, step.compensation_sha256, "{text}");
        let saga = SagaModel {
            last_seq: 1,
            state: SagaState::Acting,
            owner: None,
            n_steps: None,
            dry_run: Some(false),
            name: Some(None),
            actor: None,
            created_at_ms: None,
            updated_at_ms: None,
            n_known_steps: 2,
            records: SagaRecords::default(),
        };
        let text = serde_json::to_string(&saga).expect("encodes");
        let back: SagaModel = serde_json::from_str(&text).expect("decodes");
        assert_eq!(back.name, Some(None), "{text}");
        assert_eq!(back.actor, None, "{text}");
    }
}
