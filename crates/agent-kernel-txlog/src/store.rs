//! The SQL behind each log operation. Runs only on the writer thread.

use agent_kernel_api::{
    ApprovalDecision, ApprovalRecord, ApprovalRequest, ApprovalStatus, AuditEvent, BeginStep,
    ConsumeApproval, DeadLetter, DeadLetterStatus, DecideApproval, EffectClass, KeyBinding,
    LogWrite, NewSaga, Owner, PlanStep, RecordDeadLetter, SagaId, SagaRecord, SagaState,
    SagaSummary, SettleDeadLetter, StepRecord, StepStatus, ToolError, ToolOutput, TxError, Undo,
    WriteOutcome,
};
use std::borrow::Cow;

use rusqlite::{Connection, TransactionBehavior};
use serde_json::{Value, json};

use crate::AuditHead;
use crate::schema::storage;
use crate::sql::{Db, OptionalExtension as _, Row, ToValue, params};

use crate::audit::{
    ARGS_SUMMARY_BYTES_MAX, Appender, AuditKey, AuditSettings, CanonicalObject, DENIALS_LISTED_MAX,
    Head, KIND_APPROVAL_CONSUMED, KIND_APPROVAL_DECIDED, KIND_APPROVAL_REQUESTED, KIND_BEGIN_STEP,
    KIND_CALL_REFUSED, KIND_COMMIT_STEP, KIND_COMPENSATION, KIND_CREATE_SAGA, KIND_DEAD_LETTER,
    KIND_DEAD_LETTER_SETTLED, KIND_FAIL_STEP, KIND_OPERATOR, KIND_PLAN_DENIED, KIND_REFUSE_STEP,
    KIND_REUSE_STEP, KIND_SAGA_ABORTED, KIND_SET_STATE, KIND_SIMULATE_STEP, KIND_TAKE_OVER,
    QUOTE_BYTES_MAX, canonical_json, error_summary, quote, sha256_hex,
};

fn corrupt(what: impl std::fmt::Display) -> TxError {
    TxError::Corrupt(what.to_string())
}

fn to_json<T: serde::Serialize>(value: &T) -> Result<String, TxError> {
    serde_json::to_string(value).map_err(|err| corrupt(format!("cannot encode record: {err}")))
}

fn from_json<T: serde::de::DeserializeOwned>(column: &str, text: &str) -> Result<T, TxError> {
    serde_json::from_str(text).map_err(|err| corrupt(format!("column `{column}`: {err}")))
}

fn effect_from_str(text: &str) -> Result<EffectClass, TxError> {
    from_json("effect", &format!("\"{text}\""))
}

/// Writes a batch in one immediate transaction; all of it or none of it.
///
/// Each record is chained into the audit log in the same transaction. After a batch that
/// ends a saga, the head file is brought up to date.
pub(crate) fn write_batch(
    conn: &mut Connection,
    audit: &AuditSettings,
    batch: &[LogWrite],
    now_ms: i64,
) -> Result<Vec<WriteOutcome>, TxError> {
    let committed = commit_chained(conn, audit, batch, now_ms)?;
    // Only here, not after every batch: a head update costs a sync under
    // `Durability::Full`, which every step would otherwise pay.
    if committed.moves_head {
        audit.advance_head(conn, &committed.head);
    }
    Ok(committed.outcomes)
}

/// What [`commit_chained`] committed.
struct Committed {
    outcomes: Vec<WriteOutcome>,
    /// The chain's newest record, the batch's last.
    head: Head,
    /// Whether the batch ends a saga or holds an audit event: the head file should move.
    moves_head: bool,
}

/// Applies `batch` and chains each record into the audit log, in one immediate transaction.
fn commit_chained(
    conn: &mut Connection,
    audit: &AuditSettings,
    batch: &[LogWrite],
    now_ms: i64,
) -> Result<Committed, TxError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(storage)?;
    let mut chain = Appender::start(&tx, audit.key.as_ref())?;
    let (outcomes, moves_head) = apply_chained(&tx, &mut chain, audit.key.as_ref(), batch, now_ms)?;
    tx.commit().map_err(storage)?;
    Ok(Committed {
        outcomes,
        head: chain.head().clone(),
        moves_head,
    })
}

/// Applies `batch` and chains each record, inside the caller's transaction; returns the
/// outcomes and whether the head file should move.
pub(crate) fn apply_chained(
    tx: &dyn Db,
    chain: &mut Appender<'_>,
    key: Option<&AuditKey>,
    batch: &[LogWrite],
    now_ms: i64,
) -> Result<(Vec<WriteOutcome>, bool), TxError> {
    let mut outcomes = Vec::with_capacity(batch.len());
    let mut moves_head = false;
    for write in batch {
        let applied = apply(tx, write, key, now_ms)?;
        if let Some(kind) = applied.kind {
            chain.append(tx, now_ms, kind, applied.saga_id.as_deref(), &applied.body)?;
            if let LogWrite::DecideApproval(decision) = write {
                // The decision's own record, which the request's use checks.
                tx.execute(
                    "UPDATE approvals SET decision_seq = ?2 WHERE approval_id = ?1",
                    params![decision.approval_id, chain.head().seq],
                )
                .map_err(storage)?;
            }
        }
        // Audit events are rare and each one should be covered by the head file at once.
        moves_head |= matches!(write, LogWrite::SetState { state, .. } if state.is_terminal())
            || matches!(
                write,
                LogWrite::Audit(_)
                    | LogWrite::DecideApproval(_)
                    | LogWrite::SettleDeadLetter(_)
                    | LogWrite::Prune(_)
            );
        outcomes.push(applied.outcome);
    }
    Ok((outcomes, moves_head))
}

/// A take-over ([`TxLog::take_over`](agent_kernel_api::TxLog::take_over)) for the writer
/// to commit with the batches queued beside it.
pub(crate) struct TakeOverRequest {
    pub(crate) saga_id: SagaId,
    pub(crate) expected: Owner,
    pub(crate) expected_state: SagaState,
    pub(crate) new: Owner,
    /// Written after the take-over in its transaction, if it holds.
    pub(crate) then: Vec<LogWrite>,
}

/// One item of a group commit.
pub(crate) enum GroupItem<'a> {
    Batch(&'a [LogWrite]),
    TakeOver(&'a TakeOverRequest),
}

/// What one item of a group commit came to: a batch's outcomes, or whether a take-over
/// held.
pub(crate) enum GroupAnswer {
    Batch(Vec<WriteOutcome>),
    TakeOver(bool),
}

/// Writes several batches and take-overs, ready at the same time, in one immediate
/// transaction (one sync under `Durability::Full`): each item in a savepoint of its own, so
/// an item that fails leaves nothing of itself and nothing of the others undone; the chain
/// runs through them in order. Returns each item's result, in order. A failure of the
/// transaction itself (its begin or its commit) is every item's.
pub(crate) fn write_group(
    conn: &mut Connection,
    audit: &AuditSettings,
    items: &[GroupItem<'_>],
    now_ms: i64,
) -> Vec<Result<GroupAnswer, TxError>> {
    match items {
        [GroupItem::Batch(batch)] => {
            return vec![write_batch(conn, audit, batch, now_ms).map(GroupAnswer::Batch)];
        }
        [GroupItem::TakeOver(request)] => {
            return vec![take_over(conn, audit, request, now_ms).map(GroupAnswer::TakeOver)];
        }
        _ => {}
    }
    let every = |error: TxError| items.iter().map(|_| Err(error.clone())).collect();
    let mut tx = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
        Ok(tx) => tx,
        Err(err) => return every(storage(err)),
    };
    let mut chain = match Appender::start(&tx, audit.key.as_ref()) {
        Ok(chain) => chain,
        Err(error) => return every(error),
    };
    let mut results = Vec::with_capacity(items.len());
    let mut moves_head = false;
    for item in items {
        let before = chain.clone();
        let applied = tx.savepoint().map_err(storage).and_then(|savepoint| {
            let applied = match item {
                GroupItem::Batch(batch) => {
                    apply_chained(&savepoint, &mut chain, audit.key.as_ref(), batch, now_ms)
                        .map(|(outcomes, moves)| (GroupAnswer::Batch(outcomes), moves))?
                }
                // A take-over moves the head file, as it does alone.
                GroupItem::TakeOver(request) => {
                    take_over_then(&savepoint, &mut chain, audit.key.as_ref(), request, now_ms)
                        .map(|taken| (GroupAnswer::TakeOver(taken), taken))?
                }
            };
            savepoint.commit().map_err(storage)?;
            Ok(applied)
        });
        match applied {
            Ok((answer, moves)) => {
                moves_head |= moves;
                results.push(Ok(answer));
            }
            Err(error) => {
                // The savepoint was rolled back when dropped: so is the chain.
                chain = before;
                results.push(Err(error));
            }
        }
    }
    if let Err(err) = tx.commit() {
        return every(storage(err));
    }
    if moves_head {
        audit.advance_head(conn, chain.head());
    }
    results
}

/// Appends `event` and writes the head file naming it, whatever the head file held.
pub(crate) fn seal(
    conn: &mut Connection,
    audit: &AuditSettings,
    event: &AuditEvent,
    now_ms: i64,
) -> Result<AuditHead, TxError> {
    let committed = commit_chained(conn, audit, &[LogWrite::Audit(event.clone())], now_ms)?;
    let head = &committed.head;
    audit.write_head(head).map_err(|err| {
        TxError::Storage(format!(
            "the seal record {} is written, but the head file cannot be: {err}",
            head.seq
        ))
    })?;
    Ok(AuditHead::from(head))
}

/// What one [`LogWrite`] did, and the audit record that describes it.
struct Applied<'w> {
    outcome: WriteOutcome,
    /// `None`: nothing changed, so nothing is chained.
    kind: Option<&'static str>,
    saga_id: Option<Cow<'w, SagaId>>,
    /// Canonical JSON.
    body: String,
}

impl<'w> Applied<'w> {
    fn written(kind: &'static str, saga_id: &'w SagaId, body: String) -> Self {
        Applied {
            outcome: WriteOutcome::Written,
            kind: Some(kind),
            saga_id: Some(Cow::Borrowed(saga_id)),
            body,
        }
    }
}

fn apply<'w>(
    conn: &dyn Db,
    write: &'w LogWrite,
    key: Option<&AuditKey>,
    now_ms: i64,
) -> Result<Applied<'w>, TxError> {
    match write {
        LogWrite::Prune(prune) => {
            let (outcome, body) = crate::prune::prune(conn, prune)?;
            Ok(Applied {
                outcome,
                kind: body.is_some().then_some(crate::audit::KIND_PRUNE),
                saga_id: None,
                body: body.unwrap_or_default(),
            })
        }
        LogWrite::CreateSaga(saga) => {
            create_saga(conn, saga, now_ms)?;
            let body = CanonicalObject::new()
                .opt_str("actor", saga.actor.as_deref())
                .flag("dry_run", saga.dry_run)
                .int("n_steps", saga.n_steps)
                .opt_str("name", saga.name.as_deref())
                .object("owner", owner_body(&saga.owner))
                .str("saga_id", saga.saga_id.as_str())
                .str("state", saga.state.as_str())
                .finish();
            Ok(Applied::written(KIND_CREATE_SAGA, &saga.saga_id, body))
        }
        LogWrite::SetState { saga_id, state } => {
            let n_changed = conn
                .execute(
                    "UPDATE sagas SET state = ?2, updated_at_ms = ?3 WHERE saga_id = ?1",
                    params![saga_id.as_str(), state.as_str(), now_ms],
                )
                .map_err(storage)?;
            expect_one(n_changed, || format!("no saga {saga_id}"))?;
            let body = CanonicalObject::new()
                .str("saga_id", saga_id.as_str())
                .str("state", state.as_str())
                .finish();
            Ok(Applied::written(KIND_SET_STATE, saga_id, body))
        }
        LogWrite::BeginStep(step) => {
            let (outcome, body) = begin_step(conn, step, now_ms)?;
            Ok(Applied {
                outcome,
                kind: Some(KIND_BEGIN_STEP),
                saga_id: Some(Cow::Borrowed(&step.saga_id)),
                body,
            })
        }
        LogWrite::CommitStep {
            saga_id,
            step_seq,
            output,
        } => {
            let output = to_json(output)?;
            let n_changed = conn
                .execute(
                    "UPDATE saga_steps SET status = 'COMMIT', output = ?3, updated_at_ms = ?4
                     WHERE saga_id = ?1 AND step_seq = ?2 AND status = 'BEGIN'",
                    params![saga_id.as_str(), step_seq, output, now_ms],
                )
                .map_err(storage)?;
            expect_one(n_changed, || {
                format!("saga {saga_id} has no step {step_seq} in BEGIN to commit")
            })?;
            let body = CanonicalObject::new()
                .str("output_sha256", &sha256_hex(output.as_bytes()))
                .str("saga_id", saga_id.as_str())
                .str("status", StepStatus::Commit.as_str())
                .int("step_seq", *step_seq)
                .finish();
            Ok(Applied::written(KIND_COMMIT_STEP, saga_id, body))
        }
        LogWrite::FailStep {
            saga_id,
            step_seq,
            error,
        } => {
            let error_text = to_json(error)?;
            let n_changed = conn
                .execute(
                    "UPDATE saga_steps SET status = 'FAIL', error = ?3, updated_at_ms = ?4
                     WHERE saga_id = ?1 AND step_seq = ?2 AND status = 'BEGIN'",
                    params![saga_id.as_str(), step_seq, error_text, now_ms],
                )
                .map_err(storage)?;
            expect_one(n_changed, || {
                format!("saga {saga_id} has no step {step_seq} in BEGIN to fail")
            })?;
            let body = CanonicalObject::new()
                .object("error", error_summary(error))
                .str("error_sha256", &sha256_hex(error_text.as_bytes()))
                .str("saga_id", saga_id.as_str())
                .str("status", StepStatus::Fail.as_str())
                .int("step_seq", *step_seq)
                .finish();
            Ok(Applied::written(KIND_FAIL_STEP, saga_id, body))
        }
        LogWrite::RefuseStep { step, error } => {
            // A refusal is usually a denial: its record says what was asked for.
            let body = insert_step(
                conn,
                step,
                &Undo::none(),
                StepStatus::Fail,
                None,
                Some(error),
                None,
                now_ms,
                ArgsSummary::Quoted,
            )?;
            Ok(Applied::written(KIND_REFUSE_STEP, &step.saga_id, body))
        }
        LogWrite::ReuseStep {
            step,
            from_saga_id,
            from_step_seq,
            output,
        } => {
            let body = insert_step(
                conn,
                step,
                &Undo::none(),
                StepStatus::Commit,
                Some(output),
                None,
                Some((from_saga_id, *from_step_seq)),
                now_ms,
                ArgsSummary::Omitted,
            )?;
            Ok(Applied::written(KIND_REUSE_STEP, &step.saga_id, body))
        }
        LogWrite::SimulateStep { step, result } => {
            if !is_dry_run(conn, &step.saga_id)? {
                return Err(corrupt(format!(
                    "saga {} is not a dry run: it cannot hold simulated steps",
                    step.saga_id
                )));
            }
            let (status, output, error) = match result {
                Ok(output) => (StepStatus::Commit, Some(output), None),
                Err(error) => (StepStatus::Fail, None, Some(error)),
            };
            let body = insert_step(
                conn,
                step,
                &Undo::none(),
                status,
                output,
                error,
                None,
                now_ms,
                ArgsSummary::Omitted,
            )?;
            Ok(Applied::written(KIND_SIMULATE_STEP, &step.saga_id, body))
        }
        LogWrite::Audit(event) => {
            let (kind, saga_id, body) = audit_event_body(event)?;
            Ok(Applied {
                outcome: WriteOutcome::Written,
                kind: Some(kind),
                saga_id: saga_id.map(Cow::Borrowed),
                body,
            })
        }
        LogWrite::Compensation {
            saga_id,
            step_seq,
            result,
        } => {
            let (status, note) = match result {
                Ok(note) => (StepStatus::Compensated, note.clone()),
                Err(error) => (StepStatus::CompensationFailed, to_json(error)?),
            };
            let n_changed = conn
                .execute(
                    "UPDATE saga_steps SET status = ?3, compensation = ?4, updated_at_ms = ?5
                     WHERE saga_id = ?1 AND step_seq = ?2 AND status <> 'COMPENSATED'",
                    params![saga_id.as_str(), step_seq, status.as_str(), note, now_ms],
                )
                .map_err(storage)?;
            expect_one(n_changed, || {
                format!("saga {saga_id} has no uncompensated step {step_seq}")
            })?;
            let body = CanonicalObject::new()
                .str("compensation", &quote(&note, QUOTE_BYTES_MAX))
                .str("compensation_sha256", &sha256_hex(note.as_bytes()))
                .str("saga_id", saga_id.as_str())
                .str("status", status.as_str())
                .int("step_seq", *step_seq)
                .finish();
            Ok(Applied::written(KIND_COMPENSATION, saga_id, body))
        }
        LogWrite::RequestApproval(request) => {
            let body = request_approval(conn, request)?;
            Ok(Applied::written(
                KIND_APPROVAL_REQUESTED,
                &request.saga_id,
                body,
            ))
        }
        LogWrite::DecideApproval(decision) => decide_approval(conn, decision, now_ms),
        LogWrite::ConsumeApproval(consume) => {
            let body = consume_approval(conn, consume, key)?;
            Ok(Applied::written(
                KIND_APPROVAL_CONSUMED,
                &consume.saga_id,
                body,
            ))
        }
        LogWrite::RecordDeadLetter(letter) => {
            let body = record_dead_letter(conn, letter, now_ms)?;
            Ok(Applied::written(KIND_DEAD_LETTER, &letter.saga_id, body))
        }
        LogWrite::SettleDeadLetter(settle) => settle_dead_letter(conn, settle, now_ms),
        other => Err(corrupt(format!("unsupported log record {other:?}"))),
    }
}

/// Inserts a dead letter for the step, or reopens its existing one with one more attempt;
/// returns the audit body (the letter's id and attempts as stored, the error quoted and
/// hashed).
fn record_dead_letter(
    conn: &dyn Db,
    letter: &RecordDeadLetter,
    now_ms: i64,
) -> Result<String, TxError> {
    let (letter_id, attempts, first_failed_at_ms): (String, i64, i64) = conn
        .query_row(
            "INSERT INTO dead_letters (letter_id, saga_id, step_seq, tool_id, error, attempts,
                 first_failed_at_ms, last_failed_at_ms, next_retry_at_ms, status)
             VALUES (?1, ?2, ?3, ?4, ?5, 1, ?6, ?6, ?7, 'open')
             ON CONFLICT (saga_id, step_seq) DO UPDATE SET error = ?5,
                 attempts = dead_letters.attempts + 1, last_failed_at_ms = ?6, next_retry_at_ms = ?7,
                 status = 'open', settled_at_ms = NULL, settled_by = NULL, note = NULL
             RETURNING letter_id, attempts, first_failed_at_ms",
            params![
                letter.letter_id,
                letter.saga_id.as_str(),
                letter.step_seq,
                letter.tool_id,
                letter.error,
                now_ms,
                letter.next_retry_at_ms
            ],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
        )
        .map_err(|err| match err {
            crate::sql::Error::Constraint(_) => corrupt(format!(
                "a dead letter for saga {} step {} cannot be recorded: {err}",
                letter.saga_id, letter.step_seq
            )),
            other => storage(other),
        })?;
    Ok(CanonicalObject::new()
        .int("attempts", attempts)
        .str("error", &quote(&letter.error, QUOTE_BYTES_MAX))
        .str("error_sha256", &sha256_hex(letter.error.as_bytes()))
        .int("first_failed_at_ms", first_failed_at_ms)
        .str("letter_id", &letter_id)
        .int("next_retry_at_ms", letter.next_retry_at_ms)
        .str("saga_id", letter.saga_id.as_str())
        .int("step_seq", letter.step_seq)
        .str("tool", &letter.tool_id)
        .finish())
}

/// Settles an open dead letter; one that is not open is left as it is (its status is
/// answered, and nothing is chained).
fn settle_dead_letter<'w>(
    conn: &dyn Db,
    settle: &'w SettleDeadLetter,
    now_ms: i64,
) -> Result<Applied<'w>, TxError> {
    if settle.status == DeadLetterStatus::Open {
        return Err(corrupt("a dead letter is settled as retried or resolved"));
    }
    let by = settled_by(settle.user.as_deref(), settle.uid);
    let updated: Option<String> = conn
        .query_row(
            "UPDATE dead_letters SET status = ?2, settled_at_ms = ?3, settled_by = ?4, note = ?5
             WHERE letter_id = ?1 AND status = 'open'
             RETURNING saga_id",
            params![
                settle.letter_id,
                settle.status.as_str(),
                now_ms,
                by,
                settle.note
            ],
            |row| row.get(0),
        )
        .optional()
        .map_err(storage)?;
    let Some(saga_id) = updated else {
        let current = dead_letter(conn, &settle.letter_id)?
            .ok_or_else(|| TxError::NotFound(format!("no dead letter {}", settle.letter_id)))?;
        return Ok(Applied {
            outcome: WriteOutcome::NotOpen(current.status),
            kind: None,
            saga_id: None,
            body: String::new(),
        });
    };
    // The last open letter of a `FailedRollbackPartial` saga settled: every failed
    // compensation is accounted for, and the saga is `FailedRolledBack`, in this record.
    let cleared: Option<String> = conn
        .query_row(
            "UPDATE sagas SET state = 'FailedRolledBack', updated_at_ms = ?2
             WHERE saga_id = ?1 AND state = 'FailedRollbackPartial'
                 AND NOT EXISTS (SELECT 1 FROM dead_letters
                                 WHERE saga_id = ?1 AND status = 'open')
             RETURNING state",
            params![saga_id, now_ms],
            |row| row.get(0),
        )
        .optional()
        .map_err(storage)?;
    let note = settle.note.as_deref();
    let body = CanonicalObject::new()
        .object("by", owner_body(&settle.by))
        .str("letter_id", &settle.letter_id)
        .opt_str(
            "note",
            note.map(|note| quote(note, QUOTE_BYTES_MAX)).as_deref(),
        )
        .opt_str(
            "note_sha256",
            note.map(|note| sha256_hex(note.as_bytes())).as_deref(),
        )
        .str("saga_id", &saga_id)
        .opt_str("saga_state", cleared.as_deref())
        .opt_str(
            "settled_by",
            by.as_deref()
                .map(|by| quote(by, QUOTE_BYTES_MAX))
                .as_deref(),
        )
        .str("status", settle.status.as_str())
        .opt_int("uid", settle.uid)
        .finish();
    Ok(Applied {
        outcome: WriteOutcome::Written,
        kind: Some(KIND_DEAD_LETTER_SETTLED),
        saga_id: Some(Cow::Owned(SagaId::new(saga_id))),
        body,
    })
}

const DEAD_LETTER_COLUMNS: &str = "letter_id, saga_id, step_seq, tool_id, error, attempts,
    first_failed_at_ms, last_failed_at_ms, next_retry_at_ms, status, settled_at_ms, settled_by,
    note";

fn dead_letter_from_row(row: &Row) -> Result<Result<DeadLetter, TxError>, crate::sql::Error> {
    let step_seq: i64 = row.get(2)?;
    let attempts: i64 = row.get(5)?;
    let status: String = row.get(9)?;
    let letter = DeadLetter {
        letter_id: row.get(0)?,
        saga_id: SagaId::new(row.get::<_, String>(1)?),
        step_seq: 0,
        tool_id: row.get(3)?,
        error: row.get(4)?,
        attempts: 0,
        first_failed_at_ms: row.get(6)?,
        last_failed_at_ms: row.get(7)?,
        next_retry_at_ms: row.get(8)?,
        status: DeadLetterStatus::Open,
        settled_at_ms: row.get(10)?,
        settled_by: row.get(11)?,
        note: row.get(12)?,
    };
    Ok((|| {
        Ok(DeadLetter {
            step_seq: u32::try_from(step_seq)
                .map_err(|_| corrupt(format!("dead letter step_seq {step_seq} out of range")))?,
            attempts: u32::try_from(attempts)
                .map_err(|_| corrupt(format!("dead letter attempts {attempts} out of range")))?,
            status: status
                .parse()
                .map_err(|err: String| corrupt(format!("dead_letters.status: {err}")))?,
            ..letter
        })
    })())
}

/// One dead letter by id.
pub(crate) fn dead_letter(conn: &dyn Db, letter_id: &str) -> Result<Option<DeadLetter>, TxError> {
    conn.query_row(
        &format!("SELECT {DEAD_LETTER_COLUMNS} FROM dead_letters WHERE letter_id = ?1"),
        params![letter_id],
        dead_letter_from_row,
    )
    .optional()
    .map_err(storage)?
    .transpose()
}

/// The open dead letters of one saga, or of all, oldest first.
pub(crate) fn open_dead_letters(
    conn: &dyn Db,
    saga_id: Option<&SagaId>,
) -> Result<Vec<DeadLetter>, TxError> {
    query_all(
        conn,
        &format!(
            "SELECT {DEAD_LETTER_COLUMNS} FROM dead_letters
             WHERE status = 'open' AND (CAST(?1 AS TEXT) IS NULL OR saga_id = ?1)
             ORDER BY first_failed_at_ms, letter_id"
        ),
        params![saga_id.map(SagaId::as_str)],
        dead_letter_from_row,
    )
}

/// Who settled or decided, as the columns and the audit records hold it.
pub(crate) fn settled_by(user: Option<&str>, uid: Option<u32>) -> Option<String> {
    match (user, uid) {
        (Some(user), _) => Some(user.to_owned()),
        (None, Some(uid)) => Some(format!("uid {uid}")),
        (None, None) => None,
    }
}

/// Inserts a pending request; returns its audit body ([`request_body`]).
fn request_approval(conn: &dyn Db, request: &ApprovalRequest) -> Result<String, TxError> {
    let (args_text, rest_text) = request_texts(request)?;
    conn.execute(
        "INSERT INTO approvals (approval_id, saga_id, step_seq, tool_id, args, idempotency_key,
             digest, rest, status, requested_at_ms, expires_at_ms, operator_key_check)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 'pending', ?9, ?10, ?11)",
        params![
            request.approval_id,
            request.saga_id.as_str(),
            request.step_seq,
            request.tool_id,
            args_text,
            request.idempotency_key,
            request.digest,
            rest_text,
            request.requested_at_ms,
            request.expires_at_ms,
            request.operator_key_check
        ],
    )
    .map_err(|err| match err {
        crate::sql::Error::Constraint(_) => corrupt(format!(
            "approval {} for saga {} step {} cannot be requested: {err}",
            request.approval_id, request.saga_id, request.step_seq
        )),
        other => storage(other),
    })?;
    Ok(request_body(request, &args_text, rest_text.as_deref()))
}

/// A request's arguments and the plan's later steps as the row holds them (JSON text).
fn request_texts(request: &ApprovalRequest) -> Result<(String, Option<String>), TxError> {
    Ok((
        request.args.to_string(),
        request.rest.as_ref().map(to_json).transpose()?,
    ))
}

/// The audit body of a request: arguments and the plan's later steps (`args_text` and
/// `rest_text`, [`request_texts`]) by their SHA-256, with a short quote of the arguments.
/// A request's row is checked against the same function of the row ([`unvouched_request`]).
fn request_body(request: &ApprovalRequest, args_text: &str, rest_text: Option<&str>) -> String {
    CanonicalObject::new()
        .str("approval_id", &request.approval_id)
        .str("args_sha256", &sha256_hex(args_text.as_bytes()))
        .str("args_summary", &quote(args_text, ARGS_SUMMARY_BYTES_MAX))
        .str("digest", &request.digest)
        .int("expires_at_ms", request.expires_at_ms)
        .opt_str("idempotency_key", request.idempotency_key.as_deref())
        .opt_str("operator_key_check", request.operator_key_check.as_deref())
        .int("requested_at_ms", request.requested_at_ms)
        .opt_str(
            "rest_sha256",
            rest_text.map(|text| sha256_hex(text.as_bytes())).as_deref(),
        )
        .str("saga_id", request.saga_id.as_str())
        .int("step_seq", request.step_seq)
        .str("tool", &request.tool_id)
        .finish()
}

/// Records a decision if the request is still open to it; otherwise changes nothing and
/// answers its status. Only a change is chained (a refused decision is the caller's to
/// record).
fn decide_approval<'w>(
    conn: &dyn Db,
    decision: &'w DecideApproval,
    now_ms: i64,
) -> Result<Applied<'w>, TxError> {
    let status = decision.decision.status();
    let by = settled_by(decision.user.as_deref(), decision.uid);
    // Approve and reject only a pending request within its time; expire only a pending
    // one; cancel a pending or an approved one (never a consumed one: that step ran).
    let condition = match decision.decision {
        ApprovalDecision::Approve | ApprovalDecision::Reject => {
            "status = 'pending' AND expires_at_ms > ?5"
        }
        ApprovalDecision::Expire => "status = 'pending'",
        ApprovalDecision::Cancel | _ => "(status = 'pending' OR status = 'approved')",
    };
    let updated: Option<(String, String)> = conn
        .query_row(
            &format!(
                "UPDATE approvals SET status = ?2, decided_at_ms = ?5, decided_by = ?3, note = ?4
             WHERE approval_id = ?1 AND {condition}
             RETURNING saga_id, digest"
            ),
            params![
                decision.approval_id,
                status.as_str(),
                by,
                decision.note,
                now_ms
            ],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .optional()
        .map_err(storage)?;
    let Some((saga_id, digest)) = updated else {
        let current = approval(conn, &decision.approval_id)?.ok_or_else(|| {
            TxError::NotFound(format!("no approval request {}", decision.approval_id))
        })?;
        return Ok(Applied {
            outcome: WriteOutcome::NotPending(current.status_at(now_ms)),
            kind: None,
            saga_id: None,
            body: String::new(),
        });
    };
    let note = decision.note.as_deref();
    let body = CanonicalObject::new()
        .str("approval_id", &decision.approval_id)
        .object("by", owner_body(&decision.by))
        .opt_str(
            "decided_by",
            by.as_deref()
                .map(|by| quote(by, QUOTE_BYTES_MAX))
                .as_deref(),
        )
        .str("digest", &digest)
        .opt_str(
            "note",
            note.map(|note| quote(note, QUOTE_BYTES_MAX)).as_deref(),
        )
        .opt_str(
            "note_sha256",
            note.map(|note| sha256_hex(note.as_bytes())).as_deref(),
        )
        .str("saga_id", &saga_id)
        .str("status", status.as_str())
        .opt_int("uid", decision.uid)
        .finish();
    Ok(Applied {
        outcome: WriteOutcome::Written,
        kind: Some(KIND_APPROVAL_DECIDED),
        saga_id: Some(Cow::Owned(SagaId::new(saga_id))),
        body,
    })
}

/// Marks an approved request consumed for the step whose BEGIN follows in the batch, only
/// if it names exactly that saga, step, tool, arguments and digest.
fn consume_approval(
    conn: &dyn Db,
    consume: &ConsumeApproval,
    key: Option<&AuditKey>,
) -> Result<String, TxError> {
    let args_text = consume.args.to_string();
    let n_changed = conn
        .execute(
            "UPDATE approvals SET status = 'consumed'
             WHERE approval_id = ?1 AND status = 'approved' AND saga_id = ?2 AND step_seq = ?3
                 AND tool_id = ?4 AND args = ?5 AND digest = ?6",
            params![
                consume.approval_id,
                consume.saga_id.as_str(),
                consume.step_seq,
                consume.tool_id,
                args_text,
                consume.digest
            ],
        )
        .map_err(storage)?;
    if n_changed != 1 {
        let reason = match approval(conn, &consume.approval_id)? {
            None => "the log has no such request".to_owned(),
            Some(found) if found.status != ApprovalStatus::Approved => {
                format!("it is {}, not approved", found.status)
            }
            Some(found)
                if found.request.saga_id != consume.saga_id
                    || found.request.step_seq != consume.step_seq =>
            {
                format!(
                    "it was given for saga {} step {}",
                    found.request.saga_id, found.request.step_seq
                )
            }
            Some(_) => {
                "it was given for another tool, other arguments or another digest".to_owned()
            }
        };
        return Err(TxError::ApprovalUnusable {
            approval_id: consume.approval_id.clone(),
            reason,
        });
    }
    if let Some(reason) = unverified_decision(conn, consume, key)? {
        return Err(TxError::ApprovalUnusable {
            approval_id: consume.approval_id.clone(),
            reason: format!(
                "{reason}: the approvals table says approved, but the audit chain does not; it was changed outside agent-kernel"
            ),
        });
    }
    Ok(CanonicalObject::new()
        .str("approval_id", &consume.approval_id)
        .str("digest", &consume.digest)
        .str("saga_id", consume.saga_id.as_str())
        .str("status", ApprovalStatus::Consumed.as_str())
        .int("step_seq", consume.step_seq)
        .finish())
}

/// Why the approval being used is not vouched for by its decision's audit record, or
/// `None` when it is: the record the request names is an `ApprovalDecided` record that
/// approves this request for this digest, hashes as written, follows its predecessor, and,
/// under an audit key, carries a MAC that verifies. A status set in the table alone, or a
/// record forged without the key, fails.
fn unverified_decision(
    conn: &dyn Db,
    consume: &ConsumeApproval,
    key: Option<&AuditKey>,
) -> Result<Option<String>, TxError> {
    let Some(seq) = decision_seq(conn, &consume.approval_id)? else {
        return Ok(Some("no decision of it is in the audit chain".to_owned()));
    };
    let record: Option<crate::audit::Record> = conn
        .query_row(
            &format!("SELECT {AUDIT_RECORD_COLUMNS} FROM audit_log WHERE seq = ?1"),
            params![seq],
            audit_record_from_row,
        )
        .optional()
        .map_err(storage)?;
    let Some(record) = record else {
        return Ok(Some(format!(
            "its decision's audit record {seq} is missing"
        )));
    };
    let fields: Value = serde_json::from_str(&record.body).unwrap_or(Value::Null);
    let approves = record.kind == KIND_APPROVAL_DECIDED
        && record.saga_id.as_deref() == Some(consume.saga_id.as_str())
        && fields["approval_id"] == consume.approval_id.as_str()
        && fields["status"] == ApprovalStatus::Approved.as_str()
        && fields["digest"] == consume.digest.as_str();
    if !approves {
        return Ok(Some(format!(
            "audit record {seq} does not approve this request for this digest"
        )));
    }
    unsound_record(conn, &record, key)
}

/// Why the audit record `record`, read from the chain, cannot be relied on alone, or `None`
/// when it can: it hashes as written, follows its predecessor, and, under an audit key,
/// carries a MAC that verifies (so no one without the key wrote it).
fn unsound_record(
    conn: &dyn Db,
    record: &crate::audit::Record,
    key: Option<&AuditKey>,
) -> Result<Option<String>, TxError> {
    let seq = record.seq;
    let hash = crate::audit::record_hash(
        &record.prev_hash,
        seq,
        record.at_ms,
        &record.kind,
        record.saga_id.as_deref(),
        &record.body,
    );
    if hash != record.hash {
        return Ok(Some(format!("audit record {seq} does not hash as written")));
    }
    let previous: Option<String> = if seq == 1 {
        Some(crate::audit::ZERO_HASH.to_owned())
    } else {
        crate::audit::hash_at(conn, seq - 1).map_err(storage)?
    };
    if previous.as_deref() != Some(record.prev_hash.as_str()) {
        return Ok(Some(format!(
            "audit record {seq} does not follow its predecessor"
        )));
    }
    if let Some(key) = key
        && !record
            .mac
            .as_deref()
            .is_some_and(|mac| key.verifies(&record.hash, mac))
    {
        return Ok(Some(format!(
            "audit record {seq} is not signed with the audit key"
        )));
    }
    Ok(None)
}

/// The newest request of a saga, once its row is shown to say what the kernel recorded
/// when it asked: the `ApprovalRequested` record of the same request (the newest before its
/// decision) names the same saga, step, tool, idempotency key and digest, the SHA-256 of the
/// same arguments and of the same later steps of the plan, and is sound
/// ([`unsound_record`]). What `resume` runs comes from the record this returns.
///
/// # Errors
///
/// [`TxError::ApprovalUnusable`] naming what differs, when the row does not match its
/// record or no sound record vouches for it; [`TxError`] when the log cannot be read.
pub(crate) fn vouched_saga_approval(
    conn: &dyn Db,
    saga_id: &SagaId,
    key: Option<&AuditKey>,
) -> Result<Option<ApprovalRecord>, TxError> {
    let Some(approval) = saga_approval(conn, saga_id)? else {
        return Ok(None);
    };
    match unvouched_request(conn, &approval.request, key)? {
        None => Ok(Some(approval)),
        Some(reason) => Err(TxError::ApprovalUnusable {
            approval_id: approval.request.approval_id.clone(),
            reason: format!(
                "{reason}: the approvals table no longer holds what the kernel recorded when it asked; it was changed outside agent-kernel"
            ),
        }),
    }
}

/// The audit record of a request's decision, if one was made.
fn decision_seq(conn: &dyn Db, approval_id: &str) -> Result<Option<i64>, TxError> {
    conn.query_row(
        "SELECT decision_seq FROM approvals WHERE approval_id = ?1",
        params![approval_id],
        |row| row.get(0),
    )
    .map_err(storage)
}

/// The columns of an audit record, in the order [`audit_record_from_row`] reads them.
const AUDIT_RECORD_COLUMNS: &str = "seq, at_ms, kind, saga_id, body, prev_hash, hash, mac";

fn audit_record_from_row(row: &Row) -> Result<crate::audit::Record, crate::sql::Error> {
    Ok(crate::audit::Record {
        seq: row.get(0)?,
        at_ms: row.get(1)?,
        kind: row.get(2)?,
        saga_id: row.get(3)?,
        body: row.get(4)?,
        prev_hash: row.get(5)?,
        hash: row.get(6)?,
        mac: row.get(7)?,
    })
}

/// Why `request` (as its row reads) is not what its `ApprovalRequested` audit record
/// says, or `None` when it is.
fn unvouched_request(
    conn: &dyn Db,
    request: &ApprovalRequest,
    key: Option<&AuditKey>,
) -> Result<Option<String>, TxError> {
    // The request's record precedes its decision's; scanned newest first, a saga's records
    // of kind `ApprovalRequested` are few.
    let candidates: Vec<crate::audit::Record> = conn
        .query_map(
            &format!(
                "SELECT {AUDIT_RECORD_COLUMNS} FROM audit_log
                 WHERE seq < ?1 AND kind = ?2 AND saga_id = ?3 ORDER BY seq DESC"
            ),
            params![
                decision_seq(conn, &request.approval_id)?.unwrap_or(i64::MAX),
                KIND_APPROVAL_REQUESTED,
                request.saga_id.as_str()
            ],
            audit_record_from_row,
        )
        .map_err(storage)?;
    let found = candidates.into_iter().find_map(|record| {
        let fields: Value = serde_json::from_str(&record.body).ok()?;
        (fields["approval_id"] == request.approval_id.as_str()).then_some((record, fields))
    });
    let Some((record, fields)) = found else {
        return Ok(Some(format!(
            "the audit chain holds no request record of approval {}",
            request.approval_id
        )));
    };
    let seq = record.seq;
    let (args_text, rest_text) = request_texts(request)?;
    let expected: Value =
        serde_json::from_str(&request_body(request, &args_text, rest_text.as_deref()))
            .map_err(|err| corrupt(format!("a request's audit body: {err}")))?;
    let changed: Vec<&str> = [
        ("step_seq", "step"),
        ("tool", "tool"),
        ("digest", "digest"),
        ("args_sha256", "arguments"),
        ("idempotency_key", "idempotency key"),
        ("rest_sha256", "later steps of the plan"),
    ]
    .into_iter()
    .filter(|(key, _)| fields.get(key) != expected.get(key))
    .map(|(_, what)| what)
    .collect();
    if !changed.is_empty() {
        return Ok(Some(format!(
            "its {} differ from its request's audit record {seq}",
            changed.join(", ")
        )));
    }
    unsound_record(conn, &record, key)
}

const APPROVAL_COLUMNS: &str = "approval_id, saga_id, step_seq, tool_id, args, idempotency_key,
    digest, rest, status, requested_at_ms, expires_at_ms, decided_at_ms, decided_by, note,
    operator_key_check";

fn approval_from_row(row: &Row) -> Result<Result<ApprovalRecord, TxError>, crate::sql::Error> {
    let args: String = row.get(4)?;
    let rest: Option<String> = row.get(7)?;
    let status: String = row.get(8)?;
    let step_seq: i64 = row.get(2)?;
    Ok((|| {
        Ok(ApprovalRecord {
            request: ApprovalRequest {
                approval_id: row.get(0).map_err(storage)?,
                saga_id: SagaId::new(row.get::<_, String>(1).map_err(storage)?),
                step_seq: u32::try_from(step_seq)
                    .map_err(|_| corrupt(format!("approval step_seq {step_seq} out of range")))?,
                tool_id: row.get(3).map_err(storage)?,
                args: from_json("approvals.args", &args)?,
                idempotency_key: row.get(5).map_err(storage)?,
                digest: row.get(6).map_err(storage)?,
                rest: rest
                    .map(|text| from_json::<Vec<PlanStep>>("approvals.rest", &text))
                    .transpose()?,
                requested_at_ms: row.get(9).map_err(storage)?,
                expires_at_ms: row.get(10).map_err(storage)?,
                operator_key_check: row.get(14).map_err(storage)?,
            },
            status: status
                .parse()
                .map_err(|err: String| corrupt(format!("approvals.status: {err}")))?,
            decided_at_ms: row.get(11).map_err(storage)?,
            decided_by: row.get(12).map_err(storage)?,
            note: row.get(13).map_err(storage)?,
        })
    })())
}

fn query_approvals(
    conn: &dyn Db,
    sql: &str,
    params: &[&dyn ToValue],
) -> Result<Vec<ApprovalRecord>, TxError> {
    query_all(conn, sql, params, approval_from_row)
}

/// Every row `sql` selects, each read by `from_row` (whose inner error is a corrupt
/// value).
fn query_all<T>(
    conn: &dyn Db,
    sql: &str,
    params: &[&dyn ToValue],
    from_row: fn(&Row) -> Result<Result<T, TxError>, crate::sql::Error>,
) -> Result<Vec<T>, TxError> {
    conn.query_map(sql, params, from_row)
        .map_err(storage)?
        .into_iter()
        .collect()
}

/// One request by id.
pub(crate) fn approval(
    conn: &dyn Db,
    approval_id: &str,
) -> Result<Option<ApprovalRecord>, TxError> {
    Ok(query_approvals(
        conn,
        &format!("SELECT {APPROVAL_COLUMNS} FROM approvals WHERE approval_id = ?1"),
        params![approval_id],
    )?
    .pop())
}

/// The newest request of a saga.
pub(crate) fn saga_approval(
    conn: &dyn Db,
    saga_id: &SagaId,
) -> Result<Option<ApprovalRecord>, TxError> {
    Ok(query_approvals(
        conn,
        &format!(
            "SELECT {APPROVAL_COLUMNS} FROM approvals WHERE saga_id = ?1
             ORDER BY step_seq DESC LIMIT 1"
        ),
        params![saga_id.as_str()],
    )?
    .pop())
}

/// Every request recorded as pending, oldest first (served by the partial index).
pub(crate) fn pending_approvals(conn: &dyn Db) -> Result<Vec<ApprovalRecord>, TxError> {
    query_approvals(
        conn,
        &format!(
            "SELECT {APPROVAL_COLUMNS} FROM approvals WHERE status = 'pending'
             ORDER BY requested_at_ms, approval_id"
        ),
        params![],
    )
}

/// Whether the saga is a dry run; an error if the log has no such saga.
fn is_dry_run(conn: &dyn Db, saga_id: &SagaId) -> Result<bool, TxError> {
    conn.query_row(
        "SELECT dry_run FROM sagas WHERE saga_id = ?1",
        params![saga_id.as_str()],
        |row| row.get::<_, i64>(0),
    )
    .optional()
    .map_err(storage)?
    .map(|flag| flag != 0)
    .ok_or_else(|| TxError::NotFound(format!("no saga {saga_id}")))
}

/// The audit record of an event that changes no table: its kind, saga id and body.
fn audit_event_body(
    event: &AuditEvent,
) -> Result<(&'static str, Option<&SagaId>, String), TxError> {
    match event {
        AuditEvent::Operator(command) => {
            let options: Vec<Value> = command
                .options
                .iter()
                .map(|option| Value::String(quote(option, QUOTE_BYTES_MAX)))
                .collect();
            let body = json!({
                "by": owner_json(&command.by),
                "command": quote(&command.command, QUOTE_BYTES_MAX),
                "options": options,
                "saga_id": command.saga_id.as_ref().map(SagaId::as_str),
                "uid": command.uid,
            });
            Ok((
                KIND_OPERATOR,
                command.saga_id.as_ref(),
                canonical_json(&body),
            ))
        }
        AuditEvent::PlanDenied(plan) => {
            let denials: Vec<Value> = plan
                .denials
                .iter()
                .take(DENIALS_LISTED_MAX)
                .map(|denial| {
                    let args_text = denial.args.as_ref().map(Value::to_string);
                    json!({
                        "args_sha256": args_text.as_deref().map(|text| sha256_hex(text.as_bytes())),
                        "args_summary": args_text
                            .as_deref()
                            .map(|text| quote(text, ARGS_SUMMARY_BYTES_MAX)),
                        "reason": quote(&denial.reason, QUOTE_BYTES_MAX),
                        "step_idx": denial.step_idx,
                        "tool": denial.tool.as_deref().map(|tool| quote(tool, QUOTE_BYTES_MAX)),
                    })
                })
                .collect();
            let body = json!({
                "actor": plan.actor,
                "by": owner_json(&plan.by),
                "denials": denials,
                "dry_run": plan.dry_run,
                "n_denials": plan.denials.len(),
                "name": plan.name,
            });
            Ok((KIND_PLAN_DENIED, None, canonical_json(&body)))
        }
        AuditEvent::CallRefused(call) => {
            let args_text = call.args.to_string();
            let body = json!({
                "args_sha256": sha256_hex(args_text.as_bytes()),
                "args_summary": quote(&args_text, ARGS_SUMMARY_BYTES_MAX),
                "by": owner_json(&call.by),
                "reason": quote(&call.reason, QUOTE_BYTES_MAX),
                "saga_id": call.saga_id.as_str(),
                "tool": quote(&call.tool, QUOTE_BYTES_MAX),
            });
            Ok((
                KIND_CALL_REFUSED,
                Some(&call.saga_id),
                canonical_json(&body),
            ))
        }
        AuditEvent::SagaAborted(abort) => {
            let body = json!({
                "by": owner_json(&abort.by),
                "cause": abort.cause.as_str(),
                "reason": quote(&abort.reason, QUOTE_BYTES_MAX),
                "saga_id": abort.saga_id.as_str(),
            });
            Ok((
                KIND_SAGA_ABORTED,
                Some(&abort.saga_id),
                canonical_json(&body),
            ))
        }
        other => Err(corrupt(format!("unsupported audit event {other:?}"))),
    }
}

/// An owner as audit bodies built from a [`Value`] show it (as [`owner_body`] does).
fn owner_json(owner: &Owner) -> Value {
    json!({
        "boot_id": owner.boot_id,
        "host": owner.host,
        "pid": owner.pid,
        "start_ticks": owner.start_ticks,
    })
}

/// An owner as audit bodies show it.
fn owner_body(owner: &Owner) -> CanonicalObject {
    CanonicalObject::new()
        .str("boot_id", &owner.boot_id)
        .str("host", &owner.host)
        .int("pid", owner.pid)
        .int("start_ticks", owner.start_ticks)
}

/// Whether a step's audit record quotes the start of its arguments (refusals do: they are
/// usually denials, and the record should say what was asked for).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ArgsSummary {
    Quoted,
    Omitted,
}

fn expect_one(n_changed: usize, what: impl FnOnce() -> String) -> Result<(), TxError> {
    if n_changed == 1 {
        Ok(())
    } else {
        Err(TxError::NotFound(what()))
    }
}

fn create_saga(conn: &dyn Db, saga: &NewSaga, now_ms: i64) -> Result<(), TxError> {
    if saga.n_steps == 0 && saga.dry_run {
        // A live saga (no plan, `n_steps` 0) is never simulated.
        return Err(corrupt("a dry run needs the steps of its plan"));
    }
    if saga.require_actor_idle
        && let Some(actor) = &saga.actor
    {
        // Inside the batch's immediate transaction: no other writer can create one between
        // this check and the insert. Served by the partial index of unfinished sagas.
        let busy: Option<String> = conn
            .query_row(
                "SELECT saga_id FROM sagas
                 WHERE state <> 'Done' AND state <> 'FailedRolledBack'
                     AND state <> 'FailedRollbackPartial' AND state <> 'Undone'
                     AND actor = ?1 AND dry_run = 0
                 LIMIT 1",
                params![actor],
                |row| row.get(0),
            )
            .optional()
            .map_err(storage)?;
        if let Some(busy) = busy {
            return Err(TxError::ActorBusy {
                actor: actor.clone(),
                saga_id: SagaId::new(busy),
            });
        }
    }
    conn.execute(
        "INSERT INTO sagas (saga_id, name, actor, state, owner_host, owner_boot_id, owner_pid,
             owner_start_ticks, n_steps, created_at_ms, updated_at_ms, dry_run)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?10, ?11)",
        params![
            saga.saga_id.as_str(),
            saga.name,
            saga.actor,
            saga.state.as_str(),
            saga.owner.host,
            saga.owner.boot_id,
            saga.owner.pid,
            saga.owner.start_ticks as i64,
            saga.n_steps,
            now_ms,
            i64::from(saga.dry_run)
        ],
    )
    .map_err(storage)?;
    Ok(())
}

/// Claims the step's idempotency key (if any) and records its intent; returns the outcome
/// and the audit body.
fn begin_step(
    conn: &dyn Db,
    step: &BeginStep,
    now_ms: i64,
) -> Result<(WriteOutcome, String), TxError> {
    if step.step_seq as i64 > i64::from(u32::MAX) {
        return Err(corrupt("step_seq out of range"));
    }
    if is_dry_run(conn, &step.saga_id)? {
        return Err(corrupt(format!(
            "saga {} is a dry run: none of its steps may begin",
            step.saga_id
        )));
    }
    let rejection = match &step.idempotency_key {
        None => None,
        Some(key) => claim_key(conn, key, step)?,
    };
    match rejection {
        None => {
            let body = insert_step(
                conn,
                step,
                &step.undo,
                StepStatus::Begin,
                None,
                None,
                None,
                now_ms,
                ArgsSummary::Omitted,
            )?;
            if let Some(key) = &step.idempotency_key {
                conn.execute(
                    "INSERT INTO idempotency_keys (key, args_hash, saga_id, step_seq)
                     VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT (key) DO UPDATE SET saga_id = ?3, step_seq = ?4",
                    params![key, step.args_hash, step.saga_id.as_str(), step.step_seq],
                )
                .map_err(storage)?;
            }
            Ok((WriteOutcome::Written, body))
        }
        Some(reason) => {
            let error = ToolError::failed(reason.clone());
            let body = insert_step(
                conn,
                step,
                &Undo::none(),
                StepStatus::Fail,
                None,
                Some(&error),
                None,
                now_ms,
                ArgsSummary::Omitted,
            )?;
            Ok((WriteOutcome::KeyRejected(reason), body))
        }
    }
}

/// Returns why the key cannot be claimed for `step`, or `None` if it can.
fn claim_key(conn: &dyn Db, key: &str, step: &BeginStep) -> Result<Option<String>, TxError> {
    let Some(binding) = key_binding(conn, key)? else {
        return Ok(None);
    };
    if binding.args_hash != step.args_hash {
        return Ok(Some(format!(
            "idempotency key `{key}` is bound to other arguments (first used by saga {} step {})",
            binding.saga_id, binding.step_seq
        )));
    }
    if binding.is_released() {
        return Ok(None);
    }
    Ok(Some(format!(
        "idempotency key `{key}` is held by saga {} step {} (status {}, saga {})",
        binding.saga_id, binding.step_seq, binding.status, binding.saga_state
    )))
}

/// Inserts a step row; returns the audit body describing it: small fields as they are,
/// large ones (arguments, undo data and bytes, output, error) by the SHA-256 of exactly
/// what was stored.
#[allow(clippy::too_many_arguments)]
fn insert_step(
    conn: &dyn Db,
    step: &BeginStep,
    undo: &Undo,
    status: StepStatus,
    output: Option<&ToolOutput>,
    error: Option<&ToolError>,
    reused_from: Option<(&SagaId, u32)>,
    now_ms: i64,
    args_summary: ArgsSummary,
) -> Result<String, TxError> {
    let output_text = output.map(to_json).transpose()?;
    let error_text = error.map(to_json).transpose()?;
    let args_text = step.args.to_string();
    let undo_text = undo.data.to_string();
    conn.execute(
        "INSERT INTO saga_steps (saga_id, step_seq, tool_id, tool_version, effect,
             idempotency_key, args, args_hash, undo, undo_blob, output, status, error,
             reused_from_saga, reused_from_seq, created_at_ms, updated_at_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?16)",
        params![
            step.saga_id.as_str(),
            step.step_seq,
            step.tool_id,
            step.tool_version,
            step.effect.as_str(),
            step.idempotency_key,
            args_text,
            step.args_hash,
            undo_text,
            undo.blob,
            output_text,
            status.as_str(),
            error_text,
            reused_from.map(|(saga_id, _)| saga_id.as_str().to_owned()),
            reused_from.map(|(_, step_seq)| step_seq),
            now_ms
        ],
    )
    .map_err(|err| match err {
        crate::sql::Error::Constraint(_) => TxError::Corrupt(format!(
            "saga {} step {} cannot be begun: {err}",
            step.saga_id, step.step_seq
        )),
        other => storage(other),
    })?;
    let sha256_of = |text: &Option<String>| text.as_ref().map(|text| sha256_hex(text.as_bytes()));
    let mut body = CanonicalObject::new()
        .str("args_hash", &step.args_hash)
        .str("args_sha256", &sha256_hex(args_text.as_bytes()));
    if args_summary == ArgsSummary::Quoted {
        body = body.str("args_summary", &quote(&args_text, ARGS_SUMMARY_BYTES_MAX));
    }
    Ok(body
        .str("effect", step.effect.as_str())
        .opt_object("error", error.map(error_summary))
        .opt_str("error_sha256", sha256_of(&error_text).as_deref())
        .opt_str("idempotency_key", step.idempotency_key.as_deref())
        .opt_str("output_sha256", sha256_of(&output_text).as_deref())
        .opt_object(
            "reused_from",
            reused_from.map(|(saga_id, step_seq)| {
                CanonicalObject::new()
                    .str("saga_id", saga_id.as_str())
                    .int("step_seq", step_seq)
            }),
        )
        .str("saga_id", step.saga_id.as_str())
        .str("status", status.as_str())
        .int("step_seq", step.step_seq)
        .str("tool", &step.tool_id)
        .str("tool_version", &step.tool_version)
        .opt_str(
            "undo_blob_sha256",
            undo.blob.as_deref().map(sha256_hex).as_deref(),
        )
        .str("undo_sha256", &sha256_hex(undo_text.as_bytes()))
        .finish())
}

pub(crate) fn key_binding(conn: &dyn Db, key: &str) -> Result<Option<KeyBinding>, TxError> {
    let row = conn
        .query_row(
            "SELECT k.args_hash, k.saga_id, k.step_seq, s.status, s.output, g.state, s.error
             FROM idempotency_keys k
             JOIN saga_steps s ON s.saga_id = k.saga_id AND s.step_seq = k.step_seq
             JOIN sagas g ON g.saga_id = k.saga_id
             WHERE k.key = ?1",
            params![key],
            |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, u32>(2)?,
                    row.get::<_, String>(3)?,
                    row.get::<_, Option<String>>(4)?,
                    row.get::<_, String>(5)?,
                    row.get::<_, Option<String>>(6)?,
                ))
            },
        )
        .optional()
        .map_err(storage)?;
    let Some((args_hash, saga_id, step_seq, status, output, state, error)) = row else {
        return Ok(None);
    };
    Ok(Some(KeyBinding {
        key: key.to_owned(),
        args_hash,
        saga_id: SagaId::new(saga_id),
        saga_state: state.parse().map_err(corrupt)?,
        step_seq,
        status: status.parse().map_err(corrupt)?,
        output: output.map(|text| from_json("output", &text)).transpose()?,
        error: error.map(|text| from_json("error", &text)).transpose()?,
    }))
}

const SAGA_COLUMNS: &str = "saga_id, name, actor, state, owner_host, owner_boot_id, owner_pid,
    owner_start_ticks, n_steps, created_at_ms, updated_at_ms, dry_run";

fn saga_from_row(row: &Row) -> Result<Result<SagaSummary, TxError>, crate::sql::Error> {
    let state: String = row.get(3)?;
    let start_ticks: i64 = row.get(7)?;
    let saga_id: String = row.get(0)?;
    if saga_id.is_empty() {
        return Ok(Err(corrupt("a saga has an empty id")));
    }
    let state = match state.parse::<SagaState>() {
        Ok(state) => state,
        Err(err) => return Ok(Err(corrupt(err))),
    };
    Ok(Ok(SagaSummary {
        saga_id: SagaId::new(saga_id),
        name: row.get(1)?,
        actor: row.get(2)?,
        state,
        owner: Owner {
            host: row.get(4)?,
            boot_id: row.get(5)?,
            pid: row.get(6)?,
            start_ticks: start_ticks as u64,
        },
        n_steps: row.get(8)?,
        dry_run: row.get::<_, i64>(11)? != 0,
        created_at_ms: row.get(9)?,
        updated_at_ms: row.get(10)?,
    }))
}

fn query_sagas(
    conn: &dyn Db,
    sql: &str,
    params: &[&dyn ToValue],
) -> Result<Vec<SagaSummary>, TxError> {
    query_all(conn, sql, params, saga_from_row)
}

pub(crate) fn sagas(conn: &dyn Db, limit: u32) -> Result<Vec<SagaSummary>, TxError> {
    query_sagas(
        conn,
        &format!(
            "SELECT {SAGA_COLUMNS} FROM sagas ORDER BY created_at_ms DESC, saga_id DESC LIMIT ?1"
        ),
        params![limit],
    )
}

pub(crate) fn unfinished_sagas(conn: &dyn Db) -> Result<Vec<SagaSummary>, TxError> {
    query_sagas(
        conn,
        &format!(
            "SELECT {SAGA_COLUMNS} FROM sagas
             WHERE state <> 'Done' AND state <> 'FailedRolledBack'
                 AND state <> 'FailedRollbackPartial' AND state <> 'Undone'
             ORDER BY created_at_ms, saga_id"
        ),
        params![],
    )
}

pub(crate) fn saga(conn: &dyn Db, saga_id: &SagaId) -> Result<Option<SagaRecord>, TxError> {
    let mut sagas = query_sagas(
        conn,
        &format!("SELECT {SAGA_COLUMNS} FROM sagas WHERE saga_id = ?1"),
        params![saga_id.as_str()],
    )?;
    let Some(saga) = sagas.pop() else {
        return Ok(None);
    };
    let rows = conn
        .query_map(
            "SELECT step_seq, tool_id, tool_version, effect, args, args_hash, idempotency_key,
                 undo, undo_blob, status, output, error, reused_from_saga, reused_from_seq,
                 compensation, created_at_ms, updated_at_ms
             FROM saga_steps WHERE saga_id = ?1 ORDER BY step_seq",
            params![saga_id.as_str()],
            |row| {
                Ok((
                    row.get::<_, u32>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, String>(2)?,
                    row.get::<_, String>(3)?,
                    row.get::<_, String>(4)?,
                    row.get::<_, String>(5)?,
                    row.get::<_, Option<String>>(6)?,
                    row.get::<_, String>(7)?,
                    row.get::<_, Option<Vec<u8>>>(8)?,
                    row.get::<_, String>(9)?,
                    row.get::<_, Option<String>>(10)?,
                    row.get::<_, Option<String>>(11)?,
                    (
                        row.get::<_, Option<String>>(12)?,
                        row.get::<_, Option<u32>>(13)?,
                        row.get::<_, Option<String>>(14)?,
                        row.get::<_, i64>(15)?,
                        row.get::<_, i64>(16)?,
                    ),
                ))
            },
        )
        .map_err(storage)?;
    let mut steps = Vec::new();
    for row in rows {
        let (
            step_seq,
            tool_id,
            tool_version,
            effect,
            args,
            args_hash,
            idempotency_key,
            undo,
            undo_blob,
            status,
            output,
            error,
            (reused_saga, reused_seq, compensation, created_at_ms, updated_at_ms),
        ) = row;
        let status: StepStatus = status.parse().map_err(corrupt)?;
        let output: Option<ToolOutput> =
            output.map(|text| from_json("output", &text)).transpose()?;
        if status == StepStatus::Commit && output.is_none() {
            return Err(corrupt(format!(
                "saga {saga_id} step {step_seq} is COMMIT without an output"
            )));
        }
        let reused_from = match (reused_saga, reused_seq) {
            (Some(saga), Some(seq)) if !saga.is_empty() => Some((SagaId::new(saga), seq)),
            (None, None) => None,
            _ => {
                return Err(corrupt(format!(
                    "saga {saga_id} step {step_seq} has a partial reuse reference"
                )));
            }
        };
        steps.push(StepRecord {
            step_seq,
            tool_id,
            tool_version,
            effect: effect_from_str(&effect)?,
            args: from_json::<Value>("args", &args)?,
            args_hash,
            idempotency_key,
            undo: Undo {
                data: from_json("undo", &undo)?,
                blob: undo_blob,
            },
            status,
            output,
            error: error.map(|text| from_json("error", &text)).transpose()?,
            reused_from,
            compensation,
            created_at_ms,
            updated_at_ms,
        });
    }
    for (step_idx, step) in steps.iter().enumerate() {
        if step.step_seq as usize != step_idx {
            return Err(corrupt(format!(
                "saga {saga_id} has a gap in its steps before step {}",
                step.step_seq
            )));
        }
    }
    Ok(Some(SagaRecord { saga, steps }))
}

/// Changes a saga's owner if it still has the expected owner and state, then writes the
/// request's batch; both are chained into the audit log and the head file brought up to
/// date. All of it or nothing is written.
pub(crate) fn take_over(
    conn: &mut Connection,
    audit: &AuditSettings,
    request: &TakeOverRequest,
    now_ms: i64,
) -> Result<bool, TxError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(storage)?;
    let mut chain = Appender::start(&tx, audit.key.as_ref())?;
    if !take_over_then(&tx, &mut chain, audit.key.as_ref(), request, now_ms)? {
        return Ok(false);
    }
    tx.commit().map_err(storage)?;
    audit.advance_head(conn, chain.head());
    Ok(true)
}

/// [`take_over_in`], then the request's batch if it held, inside the caller's write
/// transaction (which a refused batch must roll back); returns whether it held.
fn take_over_then(
    tx: &dyn Db,
    chain: &mut Appender<'_>,
    key: Option<&AuditKey>,
    request: &TakeOverRequest,
    now_ms: i64,
) -> Result<bool, TxError> {
    let taken = take_over_in(
        tx,
        chain,
        &request.saga_id,
        &request.expected,
        request.expected_state,
        &request.new,
        now_ms,
    )?;
    if taken && !request.then.is_empty() {
        apply_chained(tx, chain, key, &request.then, now_ms)?;
    }
    Ok(taken)
}

/// Changes a saga's owner if it still has `expected` and is still in `expected_state`,
/// and chains the change, inside the caller's write transaction; returns whether it did.
pub(crate) fn take_over_in(
    tx: &dyn Db,
    chain: &mut Appender<'_>,
    saga_id: &SagaId,
    expected: &Owner,
    expected_state: SagaState,
    new: &Owner,
    now_ms: i64,
) -> Result<bool, TxError> {
    let n_changed = tx
        .execute(
            "UPDATE sagas SET owner_host = ?6, owner_boot_id = ?7, owner_pid = ?8,
                 owner_start_ticks = ?9, updated_at_ms = ?10
             WHERE saga_id = ?1 AND owner_host = ?2 AND owner_boot_id = ?3 AND owner_pid = ?4
                 AND owner_start_ticks = ?5 AND state = ?11",
            params![
                saga_id.as_str(),
                expected.host,
                expected.boot_id,
                expected.pid,
                expected.start_ticks as i64,
                new.host,
                new.boot_id,
                new.pid,
                new.start_ticks as i64,
                now_ms,
                expected_state.as_str()
            ],
        )
        .map_err(storage)?;
    if n_changed != 1 {
        return Ok(false);
    }
    let body = CanonicalObject::new()
        .object("from_owner", owner_body(expected))
        .str("saga_id", saga_id.as_str())
        .str("state", expected_state.as_str())
        .object("to_owner", owner_body(new))
        .finish();
    chain.append(tx, now_ms, KIND_TAKE_OVER, Some(saga_id), &body)?;
    Ok(true)
}
