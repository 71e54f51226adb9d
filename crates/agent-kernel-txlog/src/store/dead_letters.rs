//! Dead letters: recorded when a compensation fails, settled by a retry or by hand, and read.

#[allow(clippy::wildcard_imports)]
use super::*;
use crate::transitions::{CLEARED_BY_LAST_LETTER, settles};

/// Inserts a dead letter for the step, or reopens its existing one with one more attempt;
/// returns the audit body (the letter's id and attempts as stored, the error quoted and
/// hashed).
pub(super) fn record_dead_letter(
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
pub(super) fn settle_dead_letter<'w>(
    conn: &dyn Db,
    settle: &'w SettleDeadLetter,
    now_ms: i64,
) -> Result<Applied<'w>, TxError> {
    if !settles(DeadLetterStatus::Open, settle.status) {
        return Err(corrupt("a dead letter is settled as retried or resolved"));
    }
    let by = settled_by(settle.user.as_deref(), settle.uid);
    let updated: Option<String> = conn
        .query_row(
            "UPDATE dead_letters SET status = ?2, settled_at_ms = ?3, settled_by = ?4, note = ?5
             WHERE letter_id = ?1 AND status = ?6
             RETURNING saga_id",
            params![
                settle.letter_id,
                settle.status.as_str(),
                now_ms,
                by,
                settle.note,
                DeadLetterStatus::Open.as_str()
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
            "UPDATE sagas SET state = ?4, updated_at_ms = ?2
             WHERE saga_id = ?1 AND state = ?3
                 AND NOT EXISTS (SELECT 1 FROM dead_letters
                                 WHERE saga_id = ?1 AND status = ?5)
             RETURNING state",
            params![
                saga_id,
                now_ms,
                CLEARED_BY_LAST_LETTER.0.as_str(),
                CLEARED_BY_LAST_LETTER.1.as_str(),
                DeadLetterStatus::Open.as_str()
            ],
            |row| row.get(0),
        )
        .optional()
        .map_err(storage)?;
    if cleared.is_some() {
        super::locks::release(conn, &SagaId::new(saga_id.clone()))?;
    }
    let note = settle.note.as_deref();
    let body = CanonicalObject::new()
        .object("by", owner_body(&settle.by))
        .str("letter_id", &settle.letter_id);
    let body = with_note(body, note)
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

pub(super) const DEAD_LETTER_COLUMNS: &str =
    "letter_id, saga_id, step_seq, tool_id, error, attempts,
    first_failed_at_ms, last_failed_at_ms, next_retry_at_ms, status, settled_at_ms, settled_by,
    note";

pub(super) fn dead_letter_from_row(
    row: &Row,
) -> Result<Result<DeadLetter, TxError>, crate::sql::Error> {
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
