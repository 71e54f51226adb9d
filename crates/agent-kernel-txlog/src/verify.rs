//! [`verify`]: checks a log's audit chain, its head file, and that the tables the kernel
//! reads say what the chain says.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;

use crate::sql::{Db, Error as SqlError, Row as SqlRow, Value as SqlValue, params};
use agent_kernel_api::{ApprovalStatus, DeadLetterStatus, SagaState, StepStatus, TxError};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::audit::{
    self, AuditKey, Head, KIND_APPROVAL_CONSUMED, KIND_APPROVAL_DECIDED, KIND_APPROVAL_REQUESTED,
    KIND_BEGIN_STEP, KIND_CALL_REFUSED, KIND_COMMIT_STEP, KIND_COMPENSATION, KIND_CREATE_SAGA,
    KIND_DEAD_LETTER, KIND_DEAD_LETTER_SETTLED, KIND_FAIL_STEP, KIND_GENESIS, KIND_OPERATOR,
    KIND_PLAN_DENIED, KIND_PRUNE, KIND_REFUSE_STEP, KIND_REUSE_STEP, KIND_SAGA_ABORTED,
    KIND_SET_STATE, KIND_SIMULATE_STEP, KIND_TAKE_OVER, Record, ZERO_HASH, sha256_hex,
};
use crate::head;
use crate::prune::SagaRecords;
use crate::schema::{self, AUDIT_SCHEMA_VERSION};
use crate::spill::{self, Entry, Key, Scratch, Spill, VERIFY_ENTRIES_IN_MEMORY_MAX};

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

/// A position in the chain: a record's sequence number and hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditHead {
    /// The sequence number (0 for an empty chain).
    pub seq: u64,
    /// The record's hash (64 zeros for an empty chain).
    pub hash: String,
}

impl From<&Head> for AuditHead {
    fn from(head: &Head) -> AuditHead {
        AuditHead {
            seq: head.seq.unsigned_abs(),
            hash: head.hash.clone(),
        }
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

/// A process that owns a saga, as the `sagas` table stores it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct OwnerModel {
    host: String,
    boot_id: String,
    pid: i64,
    /// Stored as the `i64` with the same bits as the `u64`.
    start_ticks: i64,
}

/// What the chain says a saga row holds. `None` fields are not known: the saga predates
/// the chain (it came from a `Genesis` record) and no record has set them since.
/// Its steps are [`Replay::steps`].
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SagaModel {
    /// The record that last changed the row.
    last_seq: i64,
    state: SagaState,
    owner: Option<OwnerModel>,
    n_steps: Option<i64>,
    dry_run: Option<bool>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "known"
    )]
    name: Option<Option<String>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "known"
    )]
    actor: Option<Option<String>>,
    created_at_ms: Option<i64>,
    updated_at_ms: Option<i64>,
    /// How many of its steps the chain has begun.
    n_known_steps: i64,
    /// The running hash of its records, which a `Prune` checkpoint carries.
    records: SagaRecords,
}

impl Entry for SagaModel {}

/// Reads a column the chain knows (`Some`, its value or `None` for NULL) in the scratch
/// database's encoding: a known column is written as its value or `null`, an unknown one is
/// left out (`#[serde(default, skip_serializing_if = "Option::is_none")]`), so that the two
/// never read back as each other.
fn known<'de, D, T>(deserializer: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(deserializer).map(Some)
}

/// What a step was begun with; unknown for steps that predate the chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct StepContent {
    tool_id: String,
    tool_version: String,
    effect: String,
    idempotency_key: Option<String>,
    args_hash: String,
    args_sha256: String,
    undo_sha256: String,
    undo_blob_sha256: Option<String>,
    reused_from: Option<(String, i64)>,
}

/// What the chain says a step row holds (`None`: not known, as for [`SagaModel`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StepModel {
    last_seq: i64,
    status: StepStatus,
    content: Option<StepContent>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "known"
    )]
    output_sha256: Option<Option<String>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "known"
    )]
    error_sha256: Option<Option<String>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "known"
    )]
    compensation_sha256: Option<Option<String>>,
    created_at_ms: Option<i64>,
    updated_at_ms: Option<i64>,
}

/// Keyed by `(saga_id, step_seq)`.
impl Entry for StepModel {}

/// What the chain says an idempotency key is bound to.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct KeyModel {
    last_seq: i64,
    args_hash: String,
    saga_id: String,
    step_seq: i64,
}

impl Entry for KeyModel {
    fn group<'a>(&'a self, _: &'a Key) -> &'a str {
        &self.saga_id
    }
}

/// What the chain says an approval request row holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct ApprovalModel {
    last_seq: i64,
    saga_id: String,
    step_seq: i64,
    tool_id: String,
    args_sha256: String,
    idempotency_key: Option<String>,
    digest: String,
    rest_sha256: Option<String>,
    status: String,
    requested_at_ms: i64,
    expires_at_ms: i64,
    decided_at_ms: Option<i64>,
    /// Quoted as the record quotes it.
    decided_by: Option<String>,
    note_sha256: Option<String>,
    /// The record of the decision.
    decision_seq: Option<i64>,
    operator_key_check: Option<String>,
}

impl Entry for ApprovalModel {
    fn group<'a>(&'a self, _: &'a Key) -> &'a str {
        &self.saga_id
    }

    fn open(&self) -> bool {
        self.status == ApprovalStatus::Pending.as_str()
            || self.status == ApprovalStatus::Approved.as_str()
    }
}

/// What the chain says a dead letter row holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct DeadLetterModel {
    last_seq: i64,
    saga_id: String,
    step_seq: i64,
    tool_id: String,
    error_sha256: String,
    attempts: i64,
    first_failed_at_ms: i64,
    last_failed_at_ms: i64,
    next_retry_at_ms: i64,
    status: String,
    settled_at_ms: Option<i64>,
    /// Quoted as the record quotes it.
    settled_by: Option<String>,
    note_sha256: Option<String>,
}

impl Entry for DeadLetterModel {
    fn group<'a>(&'a self, _: &'a Key) -> &'a str {
        &self.saga_id
    }

    fn open(&self) -> bool {
        self.status == DeadLetterStatus::Open.as_str()
    }
}

/// The tables as the chain describes them, built record by record: each map keeps at most
/// a bound of entries in memory, the rest in one scratch database on disk.
struct Replay {
    scratch: Scratch,
    /// Keyed by `(saga_id, 0)`.
    sagas: Spill<SagaModel>,
    /// Keyed by `(saga_id, step_seq)`.
    steps: Spill<StepModel>,
    /// Keyed by `(key, 0)`.
    keys: Spill<KeyModel>,
    /// Keyed by `(approval_id, 0)`.
    approvals: Spill<ApprovalModel>,
    /// Keyed by `(letter_id, 0)`.
    dead_letters: Spill<DeadLetterModel>,
}

/// A key of a map keyed by one id.
fn id_key(id: &str) -> Key {
    (id.to_owned(), 0)
}

/// Typed access to a record body, with messages naming the missing field.
struct Body<'a>(&'a Map<String, Value>);

impl<'a> Body<'a> {
    fn field(&self, name: &str) -> Result<&'a Value, String> {
        self.0
            .get(name)
            .ok_or_else(|| format!("its body lacks `{name}`"))
    }

    fn str(&self, name: &str) -> Result<&'a str, String> {
        self.field(name)?
            .as_str()
            .ok_or_else(|| format!("its body's `{name}` is not text"))
    }

    fn opt_str(&self, name: &str) -> Result<Option<String>, String> {
        match self.field(name)? {
            Value::Null => Ok(None),
            Value::String(text) => Ok(Some(text.clone())),
            _ => Err(format!("its body's `{name}` is neither text nor null")),
        }
    }

    fn int(&self, name: &str) -> Result<i64, String> {
        self.field(name)?
            .as_i64()
            .ok_or_else(|| format!("its body's `{name}` is not an integer"))
    }

    /// A flag written only when true: absent means false.
    fn flag(&self, name: &str) -> Result<bool, String> {
        match self.0.get(name) {
            None => Ok(false),
            Some(Value::Bool(true)) => Ok(true),
            Some(_) => Err(format!("its body's `{name}` is present but not `true`")),
        }
    }

    fn object(&self, name: &str) -> Result<Body<'a>, String> {
        self.field(name)?
            .as_object()
            .map(Body)
            .ok_or_else(|| format!("its body's `{name}` is not an object"))
    }

    fn state(&self, name: &str) -> Result<SagaState, String> {
        self.str(name)?
            .parse()
            .map_err(|err| format!("its body's `{name}`: {err}"))
    }

    fn status(&self, name: &str) -> Result<StepStatus, String> {
        self.str(name)?
            .parse()
            .map_err(|err| format!("its body's `{name}`: {err}"))
    }

    fn owner(&self, name: &str) -> Result<OwnerModel, String> {
        let owner = self.object(name)?;
        let start_ticks = owner
            .field("start_ticks")?
            .as_u64()
            .ok_or_else(|| format!("its body's `{name}.start_ticks` is not an integer"))?;
        Ok(OwnerModel {
            host: owner.str("host")?.to_owned(),
            boot_id: owner.str("boot_id")?.to_owned(),
            pid: owner.int("pid")?,
            // The same conversion the store makes.
            start_ticks: start_ticks as i64,
        })
    }
}

impl Replay {
    /// An empty replay that keeps at most `entries_in_memory` entries of each map in
    /// memory.
    fn new(entries_in_memory: usize) -> Replay {
        Replay {
            scratch: Scratch::default(),
            sagas: Spill::new("sagas", entries_in_memory),
            steps: Spill::new("steps", entries_in_memory),
            keys: Spill::new("keys", entries_in_memory),
            approvals: Spill::new("approvals", entries_in_memory),
            dead_letters: Spill::new("dead_letters", entries_in_memory),
        }
    }

    fn has_saga(&self, saga_id: &str) -> Result<bool, String> {
        self.scratch
            .noted(self.sagas.contains(&self.scratch, &id_key(saga_id)))
    }

    fn saga_mut(&mut self, saga_id: &str) -> Result<&mut SagaModel, String> {
        let found = self.sagas.get_mut(&mut self.scratch, &id_key(saga_id));
        self.scratch
            .noted(found)?
            .ok_or_else(|| format!("it refers to saga {saga_id}, which no earlier record created"))
    }

    fn has_step(&self, saga_id: &str, step_seq: i64) -> Result<bool, String> {
        self.scratch.noted(
            self.steps
                .contains(&self.scratch, &(saga_id.to_owned(), step_seq)),
        )
    }

    fn approval_mut(
        &mut self,
        approval_id: &str,
        saga_id: &str,
    ) -> Result<&mut ApprovalModel, String> {
        let found = self
            .approvals
            .get_mut(&mut self.scratch, &id_key(approval_id));
        let approval = self.scratch.noted(found)?.ok_or_else(|| {
            format!("it refers to approval {approval_id}, which no earlier record requested")
        })?;
        if approval.saga_id != saga_id {
            return Err(format!(
                "it refers to approval {approval_id} as one of saga {saga_id}, but it belongs to saga {}",
                approval.saga_id
            ));
        }
        Ok(approval)
    }

    fn step_mut(&mut self, saga_id: &str, step_seq: i64) -> Result<&mut StepModel, String> {
        self.saga_mut(saga_id)?;
        let found = self
            .steps
            .get_mut(&mut self.scratch, &(saga_id.to_owned(), step_seq));
        self.scratch.noted(found)?.ok_or_else(|| {
            format!("it refers to step {step_seq} of saga {saga_id}, which no earlier record began")
        })
    }

    /// Puts `value` under `key` in `map` (a field of `self`).
    fn put<V: Entry>(
        scratch: &mut Scratch,
        map: &mut Spill<V>,
        key: Key,
        value: V,
    ) -> Result<(), String> {
        let result = map.insert(scratch, key, value);
        scratch.noted(result)
    }

    /// [`Replay::put`] under a key the caller found empty.
    fn put_new<V: Entry>(
        scratch: &mut Scratch,
        map: &mut Spill<V>,
        key: Key,
        value: V,
    ) -> Result<(), String> {
        let result = map.insert_absent(scratch, key, value);
        scratch.noted(result)
    }

    /// Applies one record that passed the chain checks; `Err` when it cannot follow the
    /// records before it.
    fn apply(&mut self, record: &Record) -> Result<(), String> {
        let body: Value = serde_json::from_str(&record.body)
            .map_err(|_| "its body is not valid JSON".to_owned())?;
        let body = Body(
            body.as_object()
                .ok_or_else(|| "its body is not a JSON object".to_owned())?,
        );
        self.apply_body(record, &body)?;
        if let Some(saga_id) = &record.saga_id {
            // Counted from the saga's creation (or the `Genesis` record), and only while it
            // exists, as `prune` counts: a record that creates the saga counts, one that
            // prunes it does not.
            let found = self.sagas.get_mut(&mut self.scratch, &id_key(saga_id));
            if let Some(saga) = self.scratch.noted(found)? {
                saga.records.add(&record.hash);
            }
        }
        Ok(())
    }

    /// What [`Replay::apply`] does to the tables.
    fn apply_body(&mut self, record: &Record, body: &Body<'_>) -> Result<(), String> {
        if record.kind == KIND_GENESIS {
            return self.genesis(record, body);
        }
        if record.kind == KIND_PRUNE {
            return self.prune(body);
        }
        if [
            KIND_OPERATOR,
            KIND_PLAN_DENIED,
            KIND_CALL_REFUSED,
            KIND_SAGA_ABORTED,
        ]
        .contains(&record.kind.as_str())
        {
            // Changes no table; its body must still name what the column names.
            let saga_id = match body.0.get("saga_id") {
                None | Some(Value::Null) => None,
                Some(Value::String(saga_id)) => Some(saga_id.as_str()),
                Some(_) => return Err("its body's `saga_id` is neither text nor null".to_owned()),
            };
            if record.saga_id.as_deref() != saga_id {
                return Err("its saga_id column differs from its body's".to_owned());
            }
            body.object("by")?;
            return Ok(());
        }
        let saga_id = body.str("saga_id")?;
        if record.saga_id.as_deref() != Some(saga_id) {
            return Err("its saga_id column differs from its body's".to_owned());
        }
        let (seq, at_ms) = (record.seq, record.at_ms);
        match record.kind.as_str() {
            KIND_CREATE_SAGA => {
                if self.has_saga(saga_id)? {
                    return Err(format!("it creates saga {saga_id}, which already exists"));
                }
                let n_steps = body.int("n_steps")?;
                if n_steps < 0 || (n_steps == 0 && body.flag("dry_run")?) {
                    return Err(format!(
                        "it creates a saga of {n_steps} steps (0 only for a live saga, never for a dry run)"
                    ));
                }
                let saga = SagaModel {
                    last_seq: seq,
                    state: body.state("state")?,
                    owner: Some(body.owner("owner")?),
                    n_steps: Some(n_steps),
                    dry_run: Some(body.flag("dry_run")?),
                    name: Some(body.opt_str("name")?),
                    actor: Some(body.opt_str("actor")?),
                    created_at_ms: Some(at_ms),
                    updated_at_ms: Some(at_ms),
                    n_known_steps: 0,
                    records: SagaRecords::default(),
                };
                Self::put_new(&mut self.scratch, &mut self.sagas, id_key(saga_id), saga)?;
            }
            KIND_SET_STATE => {
                let state = body.state("state")?;
                let saga = self.saga_mut(saga_id)?;
                saga.state = state;
                saga.updated_at_ms = Some(at_ms);
                saga.last_seq = seq;
            }
            KIND_TAKE_OVER => {
                let state = body.state("state")?;
                let from = body.owner("from_owner")?;
                let to = body.owner("to_owner")?;
                let saga = self.saga_mut(saga_id)?;
                if saga.state != state {
                    return Err(format!(
                        "it takes over saga {saga_id} in state {state}, but the saga was {}",
                        saga.state
                    ));
                }
                if saga.owner.as_ref().is_some_and(|owner| *owner != from) {
                    return Err(format!(
                        "it takes over saga {saga_id} from a process that did not own it"
                    ));
                }
                saga.owner = Some(to);
                saga.updated_at_ms = Some(at_ms);
                saga.last_seq = seq;
            }
            KIND_BEGIN_STEP | KIND_REFUSE_STEP | KIND_REUSE_STEP | KIND_SIMULATE_STEP => {
                self.insert_step(record, body, saga_id)?;
            }
            KIND_APPROVAL_REQUESTED => {
                self.saga_mut(saga_id)?;
                let approval_id = body.str("approval_id")?.to_owned();
                let exists = self
                    .approvals
                    .contains(&self.scratch, &id_key(&approval_id));
                if self.scratch.noted(exists)? {
                    return Err(format!(
                        "it requests approval {approval_id}, which already exists"
                    ));
                }
                let model = ApprovalModel {
                    last_seq: seq,
                    saga_id: saga_id.to_owned(),
                    step_seq: body.int("step_seq")?,
                    tool_id: body.str("tool")?.to_owned(),
                    args_sha256: body.str("args_sha256")?.to_owned(),
                    idempotency_key: body.opt_str("idempotency_key")?,
                    digest: body.str("digest")?.to_owned(),
                    rest_sha256: body.opt_str("rest_sha256")?,
                    status: ApprovalStatus::Pending.as_str().to_owned(),
                    requested_at_ms: body.int("requested_at_ms")?,
                    expires_at_ms: body.int("expires_at_ms")?,
                    decided_at_ms: None,
                    decided_by: None,
                    note_sha256: None,
                    decision_seq: None,
                    operator_key_check: body.opt_str("operator_key_check")?,
                };
                Self::put_new(
                    &mut self.scratch,
                    &mut self.approvals,
                    id_key(&approval_id),
                    model,
                )?;
            }
            KIND_APPROVAL_DECIDED => {
                body.object("by")?;
                let status: ApprovalStatus = body
                    .str("status")?
                    .parse()
                    .map_err(|err| format!("its body's `status`: {err}"))?;
                let note_sha256 = body.opt_str("note_sha256")?;
                let decided_by = body.opt_str("decided_by")?;
                let digest = body.str("digest")?.to_owned();
                let approval = self.approval_mut(body.str("approval_id")?, saga_id)?;
                if approval.digest != digest {
                    return Err(format!(
                        "it decides on digest {digest}, but the request names {}",
                        approval.digest
                    ));
                }
                let open = match status {
                    ApprovalStatus::Approved
                    | ApprovalStatus::Rejected
                    | ApprovalStatus::Expired => approval.status == "pending",
                    ApprovalStatus::Cancelled => {
                        approval.status == "pending" || approval.status == "approved"
                    }
                    ApprovalStatus::Pending | ApprovalStatus::Consumed => false,
                };
                if !open {
                    return Err(format!(
                        "it decides {} on a request that was {}",
                        status, approval.status
                    ));
                }
                approval.status = status.as_str().to_owned();
                approval.decided_at_ms = Some(at_ms);
                approval.decided_by = decided_by;
                approval.note_sha256 = note_sha256;
                approval.decision_seq = Some(seq);
                approval.last_seq = seq;
            }
            KIND_DEAD_LETTER => {
                let step_seq = body.int("step_seq")?;
                self.saga_mut(saga_id)?;
                if !self.has_step(saga_id, step_seq)? {
                    return Err(format!(
                        "it records a dead letter for step {step_seq} of saga {saga_id}, which no earlier record began"
                    ));
                }
                let letter_id = body.str("letter_id")?.to_owned();
                let attempts = body.int("attempts")?;
                let first_failed_at_ms = body.int("first_failed_at_ms")?;
                let model = DeadLetterModel {
                    last_seq: seq,
                    saga_id: saga_id.to_owned(),
                    step_seq,
                    tool_id: body.str("tool")?.to_owned(),
                    error_sha256: body.str("error_sha256")?.to_owned(),
                    attempts,
                    first_failed_at_ms,
                    last_failed_at_ms: at_ms,
                    next_retry_at_ms: body.int("next_retry_at_ms")?,
                    status: DeadLetterStatus::Open.as_str().to_owned(),
                    settled_at_ms: None,
                    settled_by: None,
                    note_sha256: None,
                };
                let known = self.dead_letters.get(&self.scratch, &id_key(&letter_id));
                let expected_attempts = match self.scratch.noted(known)?.as_deref() {
                    None => {
                        let of_saga = self.dead_letters.group_entries(&self.scratch, saga_id);
                        if let Some(((other, _), _)) = self
                            .scratch
                            .noted(of_saga)?
                            .into_iter()
                            .find(|(_, letter)| letter.step_seq == step_seq)
                        {
                            return Err(format!(
                                "it records dead letter {letter_id} for a step that has letter {other}"
                            ));
                        }
                        (1, at_ms)
                    }
                    Some(known) if known.saga_id == saga_id && known.step_seq == step_seq => {
                        (known.attempts + 1, known.first_failed_at_ms)
                    }
                    Some(_) => {
                        return Err(format!(
                            "it records dead letter {letter_id} for another step than its own"
                        ));
                    }
                };
                if (attempts, first_failed_at_ms) != expected_attempts {
                    return Err(format!(
                        "it counts {attempts} attempts since {first_failed_at_ms} for dead letter {letter_id}, where the chain says {} since {}",
                        expected_attempts.0, expected_attempts.1
                    ));
                }
                Self::put(
                    &mut self.scratch,
                    &mut self.dead_letters,
                    id_key(&letter_id),
                    model,
                )?;
            }
            KIND_DEAD_LETTER_SETTLED => {
                body.object("by")?;
                let status: DeadLetterStatus = body
                    .str("status")?
                    .parse()
                    .map_err(|err| format!("its body's `status`: {err}"))?;
                let note_sha256 = body.opt_str("note_sha256")?;
                let settled_by = body.opt_str("settled_by")?;
                let letter_id = body.str("letter_id")?;
                let found = self
                    .dead_letters
                    .get_mut(&mut self.scratch, &id_key(letter_id));
                let letter = self.scratch.noted(found)?.ok_or_else(|| {
                    format!("it settles dead letter {letter_id}, which no earlier record wrote")
                })?;
                if letter.saga_id != saga_id
                    || letter.status != DeadLetterStatus::Open.as_str()
                    || status == DeadLetterStatus::Open
                {
                    return Err(format!(
                        "it settles dead letter {letter_id} of saga {} ({}) as {status}",
                        letter.saga_id, letter.status
                    ));
                }
                letter.status = status.as_str().to_owned();
                letter.settled_at_ms = Some(at_ms);
                letter.settled_by = settled_by;
                letter.note_sha256 = note_sha256;
                letter.last_seq = seq;
                let of_saga = self.dead_letters.group_entries(&self.scratch, saga_id);
                let still_open = self
                    .scratch
                    .noted(of_saga)?
                    .iter()
                    .any(|(_, letter)| letter.open());
                let saga = self.saga_mut(saga_id)?;
                let clears = !still_open && saga.state == SagaState::FailedRollbackPartial;
                match body.opt_str("saga_state")? {
                    Some(state) if clears && state == SagaState::FailedRolledBack.as_str() => {
                        saga.state = SagaState::FailedRolledBack;
                        saga.updated_at_ms = Some(at_ms);
                        saga.last_seq = seq;
                    }
                    None if !clears => {}
                    other => {
                        return Err(format!(
                            "it moves saga {saga_id} to {other:?} as its dead letters are settled, where the chain says {}",
                            if clears {
                                "FailedRolledBack"
                            } else {
                                "no move"
                            }
                        ));
                    }
                }
            }
            KIND_APPROVAL_CONSUMED => {
                let digest = body.str("digest")?.to_owned();
                let step_seq = body.int("step_seq")?;
                let approval = self.approval_mut(body.str("approval_id")?, saga_id)?;
                if approval.status != "approved"
                    || approval.digest != digest
                    || approval.step_seq != step_seq
                {
                    return Err(format!(
                        "it uses a request that was {} (digest {}, step {}) for step {step_seq} with digest {digest}",
                        approval.status, approval.digest, approval.step_seq
                    ));
                }
                approval.status = ApprovalStatus::Consumed.as_str().to_owned();
                approval.last_seq = seq;
            }
            KIND_COMMIT_STEP => {
                let status = body.status("status")?;
                let output_sha256 = body.str("output_sha256")?.to_owned();
                let step = self.step_mut(saga_id, body.int("step_seq")?)?;
                if status != StepStatus::Commit || step.status != StepStatus::Begin {
                    return Err(format!(
                        "it commits a step that was {}, not BEGIN",
                        step.status.as_str()
                    ));
                }
                step.status = status;
                step.output_sha256 = Some(Some(output_sha256));
                step.updated_at_ms = Some(at_ms);
                step.last_seq = seq;
            }
            KIND_FAIL_STEP => {
                let status = body.status("status")?;
                let error_sha256 = body.str("error_sha256")?.to_owned();
                let step = self.step_mut(saga_id, body.int("step_seq")?)?;
                if status != StepStatus::Fail || step.status != StepStatus::Begin {
                    return Err(format!(
                        "it fails a step that was {}, not BEGIN",
                        step.status.as_str()
                    ));
                }
                step.status = status;
                step.error_sha256 = Some(Some(error_sha256));
                step.updated_at_ms = Some(at_ms);
                step.last_seq = seq;
            }
            KIND_COMPENSATION => {
                let status = body.status("status")?;
                let compensation_sha256 = body.str("compensation_sha256")?.to_owned();
                let step = self.step_mut(saga_id, body.int("step_seq")?)?;
                if !matches!(
                    status,
                    StepStatus::Compensated | StepStatus::CompensationFailed
                ) {
                    return Err(format!("its compensation sets status {}", status.as_str()));
                }
                if step.status == StepStatus::Compensated {
                    return Err("it compensates a step that was already COMPENSATED".to_owned());
                }
                step.status = status;
                step.compensation_sha256 = Some(Some(compensation_sha256));
                step.updated_at_ms = Some(at_ms);
                step.last_seq = seq;
            }
            other => return Err(format!("its kind `{other}` is unknown")),
        }
        Ok(())
    }

    fn insert_step(
        &mut self,
        record: &Record,
        body: &Body<'_>,
        saga_id: &str,
    ) -> Result<(), String> {
        let step_seq = body.int("step_seq")?;
        if !(0..=i64::from(u32::MAX)).contains(&step_seq) {
            return Err(format!("its step_seq {step_seq} is out of range"));
        }
        let status = body.status("status")?;
        let allowed: &[StepStatus] = match record.kind.as_str() {
            KIND_BEGIN_STEP => &[StepStatus::Begin, StepStatus::Fail],
            KIND_REFUSE_STEP => &[StepStatus::Fail],
            KIND_SIMULATE_STEP => &[StepStatus::Commit, StepStatus::Fail],
            _ => &[StepStatus::Commit],
        };
        if !allowed.contains(&status) {
            return Err(format!(
                "a {} record cannot leave a step {}",
                record.kind,
                status.as_str()
            ));
        }
        let reused_from = match body.field("reused_from")? {
            Value::Null => None,
            Value::Object(map) => {
                let from = Body(map);
                Some((from.str("saga_id")?.to_owned(), from.int("step_seq")?))
            }
            _ => return Err("its body's `reused_from` is neither an object nor null".to_owned()),
        };
        let content = StepContent {
            tool_id: body.str("tool")?.to_owned(),
            tool_version: body.str("tool_version")?.to_owned(),
            effect: body.str("effect")?.to_owned(),
            idempotency_key: body.opt_str("idempotency_key")?,
            args_hash: body.str("args_hash")?.to_owned(),
            args_sha256: body.str("args_sha256")?.to_owned(),
            undo_sha256: body.str("undo_sha256")?.to_owned(),
            undo_blob_sha256: body.opt_str("undo_blob_sha256")?,
            reused_from,
        };
        let output_sha256 = body.opt_str("output_sha256")?;
        let error_sha256 = body.opt_str("error_sha256")?;
        let claims_key = record.kind == KIND_BEGIN_STEP && status == StepStatus::Begin;
        let key_claim = content
            .idempotency_key
            .clone()
            .filter(|_| claims_key)
            .map(|key| (key, content.args_hash.clone()));
        let dry_run = self.saga_mut(saga_id)?.dry_run == Some(true);
        if record.kind == KIND_SIMULATE_STEP && !dry_run {
            return Err(format!(
                "it simulates a step of saga {saga_id}, which is not a dry run"
            ));
        }
        if record.kind == KIND_BEGIN_STEP && dry_run {
            return Err(format!(
                "it begins a step of saga {saga_id}, which is a dry run"
            ));
        }
        if self.has_step(saga_id, step_seq)? {
            return Err(format!(
                "it begins step {step_seq} of saga {saga_id}, which was already begun"
            ));
        }
        self.saga_mut(saga_id)?.n_known_steps += 1;
        Self::put_new(
            &mut self.scratch,
            &mut self.steps,
            (saga_id.to_owned(), step_seq),
            StepModel {
                last_seq: record.seq,
                status,
                content: Some(content),
                output_sha256: Some(output_sha256),
                error_sha256: Some(error_sha256),
                compensation_sha256: Some(None),
                created_at_ms: Some(record.at_ms),
                updated_at_ms: Some(record.at_ms),
            },
        )?;
        // The store binds a key to its first arguments for good and moves it to each new
        // step that claims it.
        if let Some((key, args_hash)) = key_claim {
            let key = id_key(&key);
            let found = self.keys.get_mut(&mut self.scratch, &key);
            if let Some(binding) = self.scratch.noted(found)? {
                binding.saga_id = saga_id.to_owned();
                binding.step_seq = step_seq;
                binding.last_seq = record.seq;
            } else {
                let binding = KeyModel {
                    last_seq: record.seq,
                    args_hash,
                    saga_id: saga_id.to_owned(),
                    step_seq,
                };
                Self::put_new(&mut self.scratch, &mut self.keys, key, binding)?;
            }
        }
        Ok(())
    }

    /// A `Prune` checkpoint: every saga it names must be prunable here (`Done`,
    /// `FailedRolledBack` or `Undone`, last changed before the horizon, no open dead letter,
    /// no open request), its steps must add up, and the hash of their records must match;
    /// then they leave the tables.
    fn prune(&mut self, body: &Body<'_>) -> Result<(), String> {
        let before_ms = body.int("before_ms")?;
        let n_steps = body.int("n_steps")?;
        let records_sha256 = body.str("records_sha256")?;
        let listed = body
            .field("saga_ids")?
            .as_array()
            .ok_or_else(|| "its `saga_ids` is not a list".to_owned())?;
        let with_open_letter = self
            .scratch
            .noted(self.dead_letters.open_groups(&self.scratch))?;
        let with_open_request = self
            .scratch
            .noted(self.approvals.open_groups(&self.scratch))?;
        let mut pruned = BTreeMap::new();
        let mut n_counted = 0_i64;
        for saga_id in listed {
            let saga_id = saga_id
                .as_str()
                .ok_or_else(|| "its `saga_ids` holds something other than text".to_owned())?;
            if pruned
                .keys()
                .next_back()
                .is_some_and(|last: &&str| *last >= saga_id)
            {
                return Err("its `saga_ids` are not in ascending order".to_owned());
            }
            let saga = self
                .scratch
                .noted(self.sagas.get(&self.scratch, &id_key(saga_id)))?
                .ok_or_else(|| format!("it prunes saga {saga_id}, which does not exist"))?;
            if !matches!(
                saga.state,
                SagaState::Done | SagaState::FailedRolledBack | SagaState::Undone
            ) {
                return Err(format!(
                    "it prunes saga {saga_id}, which is {}, not finished and settled",
                    saga.state
                ));
            }
            if saga.updated_at_ms.is_some_and(|at_ms| at_ms >= before_ms) {
                return Err(format!(
                    "it prunes saga {saga_id}, last changed after its horizon"
                ));
            }
            if with_open_letter.contains(saga_id) {
                return Err(format!(
                    "it prunes saga {saga_id}, which has an open dead letter"
                ));
            }
            if with_open_request.contains(saga_id) {
                return Err(format!(
                    "it prunes saga {saga_id}, which has an open approval request"
                ));
            }
            n_counted += saga.n_known_steps;
            pruned.insert(saga_id, saga.records.clone());
        }
        if n_counted != n_steps {
            return Err(format!(
                "it counts {n_steps} steps, but the sagas it prunes have {n_counted}"
            ));
        }
        let ids: Vec<String> = pruned.keys().map(|saga_id| (*saga_id).to_owned()).collect();
        if crate::prune::records_sha256(pruned) != records_sha256 {
            return Err(
                "its `records_sha256` is not the hash of the pruned sagas' records".to_owned(),
            );
        }
        let scratch = &mut self.scratch;
        let mut removed = Ok(());
        for saga_id in &ids {
            removed = removed.and_then(|()| self.sagas.remove(scratch, &id_key(saga_id)));
        }
        let removed = removed
            .and_then(|()| self.steps.remove_groups(scratch, &ids))
            .and_then(|()| self.keys.remove_groups(scratch, &ids))
            .and_then(|()| self.approvals.remove_groups(scratch, &ids))
            .and_then(|()| self.dead_letters.remove_groups(scratch, &ids));
        scratch.noted(removed)
    }

    fn genesis(&mut self, record: &Record, body: &Body<'_>) -> Result<(), String> {
        if record.seq != 1 {
            return Err("a Genesis record can only start the chain".to_owned());
        }
        for (saga_id, saga) in body.object("sagas")?.0 {
            let saga = saga
                .as_object()
                .map(Body)
                .ok_or_else(|| format!("its saga {saga_id} is not an object"))?;
            let mut steps = BTreeMap::new();
            let listed = saga
                .field("steps")?
                .as_array()
                .ok_or_else(|| format!("the steps of its saga {saga_id} are not a list"))?;
            for step in listed {
                let (step_seq, status) = match step.as_array().map(Vec::as_slice) {
                    Some([Value::Number(step_seq), Value::String(status)]) => {
                        (step_seq.as_i64(), status.parse::<StepStatus>().ok())
                    }
                    _ => (None, None),
                };
                let (Some(step_seq), Some(status)) = (step_seq, status) else {
                    return Err(format!("a step of its saga {saga_id} is malformed"));
                };
                steps.insert(
                    step_seq,
                    StepModel {
                        last_seq: record.seq,
                        status,
                        content: None,
                        output_sha256: None,
                        error_sha256: None,
                        compensation_sha256: None,
                        created_at_ms: None,
                        updated_at_ms: None,
                    },
                );
            }
            let n_known_steps = i64::try_from(steps.len()).unwrap_or(i64::MAX);
            for (step_seq, step) in steps {
                Self::put(
                    &mut self.scratch,
                    &mut self.steps,
                    (saga_id.clone(), step_seq),
                    step,
                )?;
            }
            let model = SagaModel {
                last_seq: record.seq,
                state: saga.state("state")?,
                owner: None,
                n_steps: None,
                // No log before schema version 3 holds a dry run.
                dry_run: Some(false),
                name: None,
                actor: None,
                created_at_ms: None,
                updated_at_ms: None,
                n_known_steps,
                records: SagaRecords::default(),
            };
            Self::put(&mut self.scratch, &mut self.sagas, id_key(saga_id), model)?;
        }
        for (key, binding) in body.object("idempotency_keys")?.0 {
            let binding = binding
                .as_object()
                .map(Body)
                .ok_or_else(|| format!("its idempotency key {key} is not an object"))?;
            let binding = KeyModel {
                last_seq: record.seq,
                args_hash: binding.str("args_hash")?.to_owned(),
                saga_id: binding.str("saga_id")?.to_owned(),
                step_seq: binding.int("step_seq")?,
            };
            Self::put(&mut self.scratch, &mut self.keys, id_key(key), binding)?;
        }
        Ok(())
    }

    /// The entry of `map` (a field of `self`) under `key`, for the comparison with the
    /// tables: a failure of the scratch database is noted and becomes a read error.
    fn lookup<'a, V: Entry + Clone>(
        &'a self,
        map: &'a Spill<V>,
        key: &Key,
    ) -> Result<Option<Cow<'a, V>>, SqlError> {
        self.scratch
            .noted(map.get(&self.scratch, key))
            .map_err(SqlError::Database)
    }

    /// Calls `each` with every entry of `map` (a field of `self`).
    fn each<V: Entry>(
        &self,
        map: &Spill<V>,
        each: &mut dyn FnMut(&Key, &V) -> Result<(), SqlError>,
    ) -> Result<(), SqlError> {
        map.for_each(&self.scratch, &mut |key, value| {
            each(key, value).map_err(Fault::Log)
        })
        .map_err(|fault| match fault {
            Fault::Log(err) => err,
            Fault::Scratch(err) => SqlError::Database(self.scratch.note(&err)),
        })
    }

    /// Compares the tables with the replayed chain; the problem at the earliest record, if
    /// any. `last_seq` is the chain's newest record.
    fn compare(&self, conn: &dyn Db, tables: Tables, last_seq: i64) -> Option<BadRecord> {
        let mut found = Found {
            first: None,
            unaccounted_seq: last_seq + 1,
        };
        if let Err(err) = self.compare_sagas(conn, tables, &mut found) {
            found.note(
                last_seq + 1,
                format!("the sagas table cannot be read: {err}"),
            );
        }
        if let Err(err) = self.compare_steps(conn, &mut found) {
            found.note(
                last_seq + 1,
                format!("the saga_steps table cannot be read: {err}"),
            );
        }
        if let Err(err) = self.compare_keys(conn, &mut found) {
            found.note(
                last_seq + 1,
                format!("the idempotency_keys table cannot be read: {err}"),
            );
        }
        if tables.approvals
            && let Err(err) = self.compare_approvals(conn, &mut found)
        {
            found.note(
                last_seq + 1,
                format!("the approvals table cannot be read: {err}"),
            );
        }
        if tables.dead_letters
            && let Err(err) = self.compare_dead_letters(conn, &mut found)
        {
            found.note(
                last_seq + 1,
                format!("the dead_letters table cannot be read: {err}"),
            );
        }
        found.first
    }

    fn compare_approvals(&self, conn: &dyn Db, found: &mut Found) -> Result<(), SqlError> {
        let mut n_seen = 0_usize;
        let sha256_of = |text: Option<String>| text.map(|text| sha256_hex(text.as_bytes()));
        conn.query_each(
            "SELECT approval_id, saga_id, step_seq, tool_id, args, idempotency_key, digest, rest,
                 status, requested_at_ms, expires_at_ms, decided_at_ms, note, decided_by,
                 decision_seq, operator_key_check
             FROM approvals",
            params![],
            &mut |row| {
            let approval_id: String = row.get(0)?;
            let Some(known) = self.lookup(&self.approvals, &id_key(&approval_id))? else {
                found.unaccounted(format!(
                    "approval {approval_id} is in the approvals table, but no audit record requests it"
                ));
                return Ok(true);
            };
            n_seen += 1;
            let actual = ApprovalModel {
                last_seq: known.last_seq,
                saga_id: row.get(1)?,
                step_seq: row.get(2)?,
                tool_id: row.get(3)?,
                args_sha256: sha256_hex(row.get::<_, String>(4)?.as_bytes()),
                idempotency_key: row.get(5)?,
                digest: row.get(6)?,
                rest_sha256: sha256_of(row.get(7)?),
                status: row.get(8)?,
                requested_at_ms: row.get(9)?,
                expires_at_ms: row.get(10)?,
                decided_at_ms: row.get(11)?,
                decided_by: row
                    .get::<_, Option<String>>(13)?
                    .map(|by| audit::quote(&by, audit::QUOTE_BYTES_MAX)),
                note_sha256: sha256_of(row.get(12)?),
                decision_seq: row.get(14)?,
                operator_key_check: row.get(15)?,
            };
            if actual != *known {
                found.note(
                    known.last_seq,
                    format!(
                        "approval {approval_id} in the approvals table differs from the audit chain (its step, arguments, digest, status or decision)"
                    ),
                );
            }
                Ok(true)
            },
        )?;
        if n_seen < self.approvals.len() {
            self.note_missing_rows(
                conn,
                found,
                ("approvals", "approval_id", "approval"),
                &self.approvals,
                |known| known.last_seq,
            )?;
        }
        Ok(())
    }

    fn compare_dead_letters(&self, conn: &dyn Db, found: &mut Found) -> Result<(), SqlError> {
        let mut n_seen = 0_usize;
        conn.query_each(
            "SELECT letter_id, saga_id, step_seq, tool_id, error, attempts, first_failed_at_ms,
                 last_failed_at_ms, next_retry_at_ms, status, settled_at_ms, settled_by, note
             FROM dead_letters",
            params![],
            &mut |row| {
            let letter_id: String = row.get(0)?;
            let Some(known) = self.lookup(&self.dead_letters, &id_key(&letter_id))? else {
                found.unaccounted(format!(
                    "dead letter {letter_id} is in the dead_letters table, but no audit record writes it"
                ));
                return Ok(true);
            };
            n_seen += 1;
            let actual = DeadLetterModel {
                last_seq: known.last_seq,
                saga_id: row.get(1)?,
                step_seq: row.get(2)?,
                tool_id: row.get(3)?,
                error_sha256: sha256_hex(row.get::<_, String>(4)?.as_bytes()),
                attempts: row.get(5)?,
                first_failed_at_ms: row.get(6)?,
                last_failed_at_ms: row.get(7)?,
                next_retry_at_ms: row.get(8)?,
                status: row.get(9)?,
                settled_at_ms: row.get(10)?,
                settled_by: row
                    .get::<_, Option<String>>(11)?
                    .map(|by| audit::quote(&by, audit::QUOTE_BYTES_MAX)),
                note_sha256: row
                    .get::<_, Option<String>>(12)?
                    .map(|note| sha256_hex(note.as_bytes())),
            };
            if actual != *known {
                found.note(
                    known.last_seq,
                    format!(
                        "dead letter {letter_id} in the dead_letters table differs from the audit chain (its step, error, attempts, status or settlement)"
                    ),
                );
            }
                Ok(true)
            },
        )?;
        if n_seen < self.dead_letters.len() {
            self.note_missing_rows(
                conn,
                found,
                ("dead_letters", "letter_id", "dead letter"),
                &self.dead_letters,
                |known| known.last_seq,
            )?;
        }
        Ok(())
    }

    fn compare_sagas(
        &self,
        conn: &dyn Db,
        tables: Tables,
        found: &mut Found,
    ) -> Result<(), SqlError> {
        // Logs of schema version 2 have no `dry_run` column: none of their sagas is one.
        let dry_run_column = if tables.dry_run { "dry_run" } else { "0" };
        let mut n_seen = 0_usize;
        conn.query_each(
            &format!(
                "SELECT saga_id, state, owner_host, owner_boot_id, owner_pid, owner_start_ticks,
                 n_steps, name, actor, created_at_ms, updated_at_ms, {dry_run_column}
             FROM sagas"
            ),
            params![],
            &mut |row| {
                let saga_id: String = row.get(0)?;
                let Some(saga) = self.lookup(&self.sagas, &id_key(&saga_id))? else {
                    found.unaccounted(format!(
                        "saga {saga_id} is in the sagas table, but no audit record creates it"
                    ));
                    return Ok(true);
                };
                n_seen += 1;
                let state: String = row.get(1)?;
                let owner = OwnerModel {
                    host: row.get(2)?,
                    boot_id: row.get(3)?,
                    pid: row.get(4)?,
                    start_ticks: row.get(5)?,
                };
                let n_steps: i64 = row.get(6)?;
                let name: Option<String> = row.get(7)?;
                let actor: Option<String> = row.get(8)?;
                let created_at_ms: i64 = row.get(9)?;
                let updated_at_ms: i64 = row.get(10)?;
                let dry_run: i64 = row.get(11)?;
                let mut differences = Vec::new();
                if state != saga.state.as_str() {
                    differences.push("state");
                }
                if saga.owner.as_ref().is_some_and(|known| *known != owner) {
                    differences.push("owner");
                }
                if saga.n_steps.is_some_and(|known| known != n_steps) {
                    differences.push("n_steps");
                }
                if saga
                    .dry_run
                    .is_some_and(|known| i64::from(known) != dry_run)
                {
                    differences.push("dry_run");
                }
                if saga.name.as_ref().is_some_and(|known| *known != name) {
                    differences.push("name");
                }
                if saga.actor.as_ref().is_some_and(|known| *known != actor) {
                    differences.push("actor");
                }
                if saga
                    .created_at_ms
                    .is_some_and(|known| known != created_at_ms)
                {
                    differences.push("created_at_ms");
                }
                if saga
                    .updated_at_ms
                    .is_some_and(|known| known != updated_at_ms)
                {
                    differences.push("updated_at_ms");
                }
                if !differences.is_empty() {
                    found.note(
                    saga.last_seq,
                    format!(
                        "saga {saga_id} in the sagas table differs from the audit chain in its {}",
                        differences.join(", ")
                    ),
                );
                }
                Ok(true)
            },
        )?;
        if n_seen < self.sagas.len() {
            self.note_missing_rows(
                conn,
                found,
                ("sagas", "saga_id", "saga"),
                &self.sagas,
                |saga| saga.last_seq,
            )?;
        }
        Ok(())
    }

    fn compare_steps(&self, conn: &dyn Db, found: &mut Found) -> Result<(), SqlError> {
        let mut n_seen = 0_usize;
        let sha256_of = |text: Option<String>| text.map(|text| sha256_hex(text.as_bytes()));
        conn.query_each(
            "SELECT saga_id, step_seq, status, tool_id, tool_version, effect, idempotency_key,
                 args, args_hash, undo, undo_blob, output, error, reused_from_saga,
                 reused_from_seq, compensation, created_at_ms, updated_at_ms
             FROM saga_steps",
            params![],
            &mut |row| {
            let saga_id: String = row.get(0)?;
            let step_seq: i64 = row.get(1)?;
            let Some(step) = self.lookup(&self.steps, &(saga_id.clone(), step_seq))? else {
                found.unaccounted(format!(
                    "step {step_seq} of saga {saga_id} is in the saga_steps table, but no audit record begins it"
                ));
                return Ok(true);
            };
            n_seen += 1;
            let mut differences = Vec::new();
            if row.get::<_, String>(2)? != step.status.as_str() {
                differences.push("status");
            }
            if let Some(content) = &step.content {
                let reused_from = match (
                    row.get::<_, Option<String>>(13)?,
                    row.get::<_, Option<i64>>(14)?,
                ) {
                    (Some(saga), Some(seq)) => Some((saga, seq)),
                    _ => None,
                };
                let actual = StepContent {
                    tool_id: row.get(3)?,
                    tool_version: row.get(4)?,
                    effect: row.get(5)?,
                    idempotency_key: row.get(6)?,
                    args_sha256: sha256_hex(row.get::<_, String>(7)?.as_bytes()),
                    args_hash: row.get(8)?,
                    undo_sha256: sha256_hex(row.get::<_, String>(9)?.as_bytes()),
                    undo_blob_sha256: row
                        .get::<_, Option<Vec<u8>>>(10)?
                        .map(|blob| sha256_hex(&blob)),
                    reused_from,
                };
                if actual != *content {
                    differences.push("content (tool, arguments, undo data or reuse)");
                }
            }
            let columns = [
                (&step.output_sha256, 11, "output"),
                (&step.error_sha256, 12, "error"),
                (&step.compensation_sha256, 15, "compensation"),
            ];
            for (known, idx, what) in columns {
                if let Some(known) = known
                    && *known != sha256_of(row.get(idx)?)
                {
                    differences.push(what);
                }
            }
            let created_at_ms: i64 = row.get(16)?;
            let updated_at_ms: i64 = row.get(17)?;
            if step
                .created_at_ms
                .is_some_and(|known| known != created_at_ms)
            {
                differences.push("created_at_ms");
            }
            if step
                .updated_at_ms
                .is_some_and(|known| known != updated_at_ms)
            {
                differences.push("updated_at_ms");
            }
            if !differences.is_empty() {
                found.note(
                    step.last_seq,
                    format!(
                        "step {step_seq} of saga {saga_id} in the saga_steps table differs from the audit chain in its {}",
                        differences.join(", ")
                    ),
                );
            }
                Ok(true)
            },
        )?;
        if n_seen < self.steps.len() {
            self.each(&self.steps, &mut |(saga_id, step_seq), step| {
                let exists: bool = conn.query_row(
                    "SELECT EXISTS (SELECT 1 FROM saga_steps WHERE saga_id = ?1 AND step_seq = ?2)",
                    params![saga_id, step_seq],
                    |row| row.get(0),
                )?;
                if !exists {
                    found.note(
                        step.last_seq,
                        format!(
                            "step {step_seq} of saga {saga_id} is in the audit chain but not in the saga_steps table"
                        ),
                    );
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    fn compare_keys(&self, conn: &dyn Db, found: &mut Found) -> Result<(), SqlError> {
        let mut n_seen = 0_usize;
        conn.query_each(
            "SELECT key, args_hash, saga_id, step_seq FROM idempotency_keys",
            params![],
            &mut |row| {
                let key: String = row.get(0)?;
                let Some(binding) = self.lookup(&self.keys, &id_key(&key))? else {
                    found.unaccounted(format!(
                        "idempotency key `{key}` is in the idempotency_keys table, but no audit record claims it"
                    ));
                    return Ok(true);
                };
                n_seen += 1;
                if row.get::<_, String>(1)? != binding.args_hash
                    || row.get::<_, String>(2)? != binding.saga_id
                    || row.get::<_, i64>(3)? != binding.step_seq
                {
                    found.note(
                        binding.last_seq,
                        format!(
                            "idempotency key `{key}` is bound to other arguments or another step in the idempotency_keys table than the audit chain says"
                        ),
                    );
                }
                Ok(true)
            },
        )?;
        if n_seen < self.keys.len() {
            self.each(&self.keys, &mut |(key, _), binding| {
                let exists: bool = conn.query_row(
                    "SELECT EXISTS (SELECT 1 FROM idempotency_keys WHERE key = ?1)",
                    params![key],
                    |row| row.get(0),
                )?;
                if !exists {
                    found.note(
                        binding.last_seq,
                        format!(
                            "idempotency key `{key}` is in the audit chain but not in the idempotency_keys table"
                        ),
                    );
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    /// Notes each row the chain describes in `known` (a map keyed by one id, with the
    /// record that last set each) that the table, named with its key column and what a row
    /// is, does not hold.
    fn note_missing_rows<V: Entry>(
        &self,
        conn: &dyn Db,
        found: &mut Found,
        (table, key_column, what): (&str, &str, &str),
        known: &Spill<V>,
        last_seq: impl Fn(&V) -> i64,
    ) -> Result<(), SqlError> {
        let exists_sql = format!("SELECT EXISTS (SELECT 1 FROM {table} WHERE {key_column} = ?1)");
        self.each(known, &mut |(id, _), value| {
            let exists: bool = conn.query_row(&exists_sql, params![id], |row| row.get(0))?;
            if !exists {
                found.note(
                    last_seq(value),
                    format!("{what} {id} is in the audit chain but not in the {table} table"),
                );
            }
            Ok(())
        })
    }
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
}

impl Tables {
    /// What SQLite schema `version` holds.
    pub(crate) fn of_version(version: i64) -> Tables {
        Tables {
            dry_run: version >= 3,
            approvals: version >= 5,
            dead_letters: version >= 5,
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
