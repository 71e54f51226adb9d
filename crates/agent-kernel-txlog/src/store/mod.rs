//! The SQL behind each log operation. Runs only on the writer thread.
//!
//! This module applies batches of writes (each record and its audit record in one
//! transaction); its children hold the statements of each record family.

mod approvals;
mod dead_letters;
mod locks;
pub(crate) mod prune;
mod sagas;
mod steps;

#[allow(clippy::wildcard_imports)]
use self::{approvals::*, dead_letters::*, sagas::*, steps::*};

pub(crate) use self::approvals::{
    approval, pending_approvals, saga_approval, vouched_saga_approval,
};
pub(crate) use self::dead_letters::{dead_letter, open_dead_letters};
pub(crate) use self::locks::{Claims, duplicate_of, later_claim, settled_lock_holders};
pub(crate) use self::sagas::{
    key_binding, saga, saga_counts, saga_page, sagas, take_over_in, unfinished_sagas,
};

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

use crate::head::{AuditHead, UnsyncedHead};
use crate::sql::storage;
use crate::sql::{Db, OptionalExtension as _, Row, ToValue, params};

use crate::audit::{
    ARGS_SUMMARY_BYTES_MAX, Appender, AuditKey, AuditSettings, CanonicalObject, DENIALS_LISTED_MAX,
    Head, KIND_APPROVAL_CONSUMED, KIND_APPROVAL_DECIDED, KIND_APPROVAL_REQUESTED, KIND_BEGIN_STEP,
    KIND_CALL_REFUSED, KIND_COMMIT_STEP, KIND_COMPENSATION, KIND_CREATE_SAGA, KIND_DEAD_LETTER,
    KIND_DEAD_LETTER_SETTLED, KIND_FAIL_STEP, KIND_OPERATOR, KIND_PLAN_DENIED, KIND_REFUSE_STEP,
    KIND_REUSE_STEP, KIND_SAGA_ABORTED, KIND_SET_STATE, KIND_SIMULATE_STEP, KIND_TAKE_OVER,
    QUOTE_BYTES_MAX, canonical_json, error_summary, quote, sha256_hex,
};

/// An operator's note in an audit body: quoted (at most [`QUOTE_BYTES_MAX`] bytes) as
/// `note`, and bound whole by `note_sha256`; neither when there is none.
fn with_note(body: CanonicalObject, note: Option<&str>) -> CanonicalObject {
    body.opt_str(
        "note",
        note.map(|note| quote(note, QUOTE_BYTES_MAX)).as_deref(),
    )
    .opt_str(
        "note_sha256",
        note.map(|note| sha256_hex(note.as_bytes())).as_deref(),
    )
}

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
/// ends a saga, the head file is brought up to date; under `Durability::Full` its sync is
/// returned, for the writer to drop after answering.
pub(crate) fn write_batch(
    conn: &mut Connection,
    audit: &AuditSettings,
    claims: &mut Claims,
    batch: &[LogWrite],
    now_ms: i64,
) -> Result<(Vec<WriteOutcome>, Option<UnsyncedHead>), TxError> {
    let committed = commit_chained(conn, audit, claims, batch, now_ms)?;
    // Only here, not after every batch: a head update costs a sync under
    // `Durability::Full`, which every step would otherwise pay.
    let unsynced = committed
        .moves_head
        .then(|| audit.advance_head_deferring_sync(conn, &committed.head))
        .flatten();
    Ok((committed.outcomes, unsynced))
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
/// `claims` is the writer's map of locks ([`Claims`]), left empty unless the transaction
/// commits.
fn commit_chained(
    conn: &mut Connection,
    audit: &AuditSettings,
    claims: &mut Claims,
    batch: &[LogWrite],
    now_ms: i64,
) -> Result<Committed, TxError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(storage)?;
    let mut chain = Appender::start_with(&tx, audit.key.as_ref(), std::mem::take(claims))?;
    let (outcomes, moves_head) = apply_chained(&tx, &mut chain, audit.key.as_ref(), batch, now_ms)?;
    tx.commit().map_err(storage)?;
    let head = chain.head().clone();
    *claims = chain.committed();
    Ok(Committed {
        outcomes,
        head,
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
    let locks::Claimed { refused, noted } = locks::claim_or_refuse(tx, chain.claims(), batch)?;
    for write in batch {
        if matches!(write, LogWrite::ClaimLocks { .. }) {
            chain.claims().note_claimed_again();
        }
        let applied = match refused_claim(write, &refused) {
            Some(holder) => refused_step(write, holder),
            None => apply(tx, write, key, now_ms)?,
        };
        if let (LogWrite::BeginStep(step), WriteOutcome::KeyRejected(_)) = (write, &applied.outcome)
        {
            // Refused by its key only now: what it noted as claimed holds nothing.
            let given_back = noted
                .iter()
                .filter(|n| n.saga_id == step.saga_id && n.step_seq == step.step_seq);
            for resource in given_back.flat_map(|n| &n.resources) {
                chain.claims().take_back(resource, &step.saga_id);
            }
        }
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

/// The holder refusing `write`'s claim: a `BeginStep` in `refused`, or the approval such a
/// step would consume.
fn refused_claim<'r>(
    write: &LogWrite,
    refused: &'r [(SagaId, u32, locks::Refusal)],
) -> Option<&'r locks::Refusal> {
    let (saga_id, step_seq) = match write {
        LogWrite::BeginStep(step) => (&step.saga_id, step.step_seq),
        LogWrite::ConsumeApproval(consume) => (&consume.saga_id, consume.step_seq),
        _ => return None,
    };
    refused
        .iter()
        .find(|(at_saga, at_seq, _)| at_saga == saga_id && *at_seq == step_seq)
        .map(|(_, _, holder)| holder)
}

/// A write left unapplied because its step was refused: for a conflict, the step's
/// `LockConflict` record; nothing for a duplicate (the request for approval that follows
/// names the earlier step), nor for the approval it would have consumed.
fn refused_step<'w>(write: &'w LogWrite, refusal: &locks::Refusal) -> Applied<'w> {
    let holder = match refusal {
        locks::Refusal::Conflict(holder) => holder,
        locks::Refusal::Duplicate(earlier) => {
            return Applied {
                outcome: WriteOutcome::Duplicate(Box::new(earlier.clone())),
                kind: None,
                saga_id: None,
                body: String::new(),
            };
        }
    };
    let outcome = WriteOutcome::Conflict(Box::new(holder.clone()));
    match write {
        LogWrite::BeginStep(step) => Applied {
            outcome,
            kind: Some(crate::audit::KIND_LOCK_CONFLICT),
            saga_id: Some(Cow::Borrowed(&step.saga_id)),
            body: locks::conflict_body(step, holder),
        },
        _ => Applied {
            outcome,
            kind: None,
            saga_id: None,
            body: String::new(),
        },
    }
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
///
/// When the group moved the head file under `Durability::Full`, the head file's sync comes
/// back too ([`UnsyncedHead`]): the writer answers the items first, then drops it.
pub(crate) fn write_group(
    conn: &mut Connection,
    audit: &AuditSettings,
    claims: &mut Claims,
    items: &[GroupItem<'_>],
    now_ms: i64,
) -> (Vec<Result<GroupAnswer, TxError>>, Option<UnsyncedHead>) {
    /// One item's result, and its head file's sync.
    fn alone<T>(
        result: Result<(T, Option<UnsyncedHead>), TxError>,
        answer: impl FnOnce(T) -> GroupAnswer,
    ) -> (Vec<Result<GroupAnswer, TxError>>, Option<UnsyncedHead>) {
        match result {
            Ok((value, unsynced)) => (vec![Ok(answer(value))], unsynced),
            Err(error) => (vec![Err(error)], None),
        }
    }
    match items {
        [GroupItem::Batch(batch)] => {
            return alone(
                write_batch(conn, audit, claims, batch, now_ms),
                GroupAnswer::Batch,
            );
        }
        [GroupItem::TakeOver(request)] => {
            return alone(
                take_over(conn, audit, claims, request, now_ms),
                GroupAnswer::TakeOver,
            );
        }
        _ => {}
    }
    let every = |error: TxError| (items.iter().map(|_| Err(error.clone())).collect(), None);
    let mut tx = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
        Ok(tx) => tx,
        Err(err) => return every(storage(err)),
    };
    let mut chain = match Appender::start_with(&tx, audit.key.as_ref(), std::mem::take(claims)) {
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
    let head = chain.head().clone();
    *claims = chain.committed();
    let unsynced = moves_head
        .then(|| audit.advance_head_deferring_sync(conn, &head))
        .flatten();
    (results, unsynced)
}

/// Appends `event` and writes the head file naming it, whatever the head file held.
pub(crate) fn seal(
    conn: &mut Connection,
    audit: &AuditSettings,
    event: &AuditEvent,
    now_ms: i64,
) -> Result<AuditHead, TxError> {
    // Outside the writer's groups: its map of locks reads the log again after this.
    let committed = commit_chained(
        conn,
        audit,
        &mut Claims::default(),
        &[LogWrite::Audit(event.clone())],
        now_ms,
    )?;
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
            let (outcome, body) = crate::store::prune::prune(conn, prune)?;
            Ok(Applied {
                outcome,
                kind: body.is_some().then_some(crate::audit::KIND_PRUNE),
                saga_id: None,
                body: body.unwrap_or_default(),
            })
        }
        LogWrite::CreateSaga(saga) => {
            let body = create_saga(conn, saga, now_ms)?;
            Ok(Applied::written(KIND_CREATE_SAGA, &saga.saga_id, body))
        }
        LogWrite::SetState { saga_id, state } => {
            let body = set_state(conn, saga_id, *state, now_ms)?;
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
            let body = step_outcome(conn, saga_id, *step_seq, Ok(output), now_ms)?;
            Ok(Applied::written(KIND_COMMIT_STEP, saga_id, body))
        }
        LogWrite::FailStep {
            saga_id,
            step_seq,
            error,
        } => {
            let body = step_outcome(conn, saga_id, *step_seq, Err(error), now_ms)?;
            Ok(Applied::written(KIND_FAIL_STEP, saga_id, body))
        }
        LogWrite::RefuseStep { .. }
        | LogWrite::ReuseStep { .. }
        | LogWrite::SimulateStep { .. } => unbegun_step(conn, write, now_ms),
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
            let body = compensation(conn, saga_id, *step_seq, result, now_ms)?;
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
        LogWrite::ClaimLocks { saga_id } => {
            let body = locks::claim_again(conn, saga_id, now_ms)?;
            Ok(Applied::written(crate::audit::KIND_LOCKS, saga_id, body))
        }
        LogWrite::ReleaseLocks { saga_id, owner } => {
            Ok(match locks::release_settled(conn, saga_id, owner)? {
                Some(body) => Applied::written(crate::audit::KIND_LOCKS, saga_id, body),
                None => Applied {
                    outcome: WriteOutcome::Written,
                    kind: None,
                    saga_id: None,
                    body: String::new(),
                },
            })
        }
        other => Err(corrupt(format!("unsupported log record {other:?}"))),
    }
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
