//! The records of a step after it began, and of steps that never begin: outcomes,
//! compensations, refusals, reuses and simulations.

#[allow(clippy::wildcard_imports)]
use super::*;
use crate::transitions::{COMPENSATION_NEVER_OVER, OUTCOME_FROM, sql_in};

/// Moves saga `saga_id` to `state`; returns the audit body.
pub(super) fn set_state(
    conn: &dyn Db,
    saga_id: &SagaId,
    state: SagaState,
    now_ms: i64,
) -> Result<String, TxError> {
    let n_changed = conn
        .execute(
            "UPDATE sagas SET state = ?2, updated_at_ms = ?3 WHERE saga_id = ?1",
            params![saga_id.as_str(), state.as_str(), now_ms],
        )
        .map_err(storage)?;
    expect_one(n_changed, || format!("no saga {saga_id}"))?;
    super::locks::release_if_settled(conn, saga_id, state)?;
    Ok(CanonicalObject::new()
        .str("saga_id", saga_id.as_str())
        .str("state", state.as_str())
        .finish())
}

/// Records the outcome of step `step_seq`, which must be in one of
/// [`OUTCOME_FROM`]: its output (`COMMIT`) or its error (`FAIL`). Returns the audit body.
pub(super) fn step_outcome(
    conn: &dyn Db,
    saga_id: &SagaId,
    step_seq: u32,
    outcome: Result<&ToolOutput, &ToolError>,
    now_ms: i64,
) -> Result<String, TxError> {
    let (status, column, text) = match outcome {
        Ok(output) => (StepStatus::Commit, "output", to_json(output)?),
        Err(error) => (StepStatus::Fail, "error", to_json(error)?),
    };
    let guard = sql_in("status", OUTCOME_FROM.iter().map(|status| status.as_str()));
    let n_changed = conn
        .execute(
            &format!(
                "UPDATE saga_steps SET status = ?3, {column} = ?4, updated_at_ms = ?5
                 WHERE saga_id = ?1 AND step_seq = ?2 AND {guard}"
            ),
            params![saga_id.as_str(), step_seq, status.as_str(), text, now_ms],
        )
        .map_err(storage)?;
    let verb = if status == StepStatus::Commit {
        "commit"
    } else {
        "fail"
    };
    expect_one(n_changed, || {
        format!("saga {saga_id} has no step {step_seq} in BEGIN to {verb}")
    })?;
    let body = CanonicalObject::new();
    let body = match outcome {
        Ok(_) => body.str("output_sha256", &sha256_hex(text.as_bytes())),
        Err(error) => body
            .object("error", error_summary(error))
            .str("error_sha256", &sha256_hex(text.as_bytes())),
    };
    Ok(body
        .str("saga_id", saga_id.as_str())
        .str("status", status.as_str())
        .int("step_seq", step_seq)
        .finish())
}

/// Records the outcome of compensating step `step_seq`, which must not be
/// [`COMPENSATION_NEVER_OVER`]. Returns the audit body.
pub(super) fn compensation(
    conn: &dyn Db,
    saga_id: &SagaId,
    step_seq: u32,
    result: &Result<String, ToolError>,
    now_ms: i64,
) -> Result<String, TxError> {
    let (status, note) = match result {
        Ok(note) => (StepStatus::Compensated, note.clone()),
        Err(error) => (StepStatus::CompensationFailed, to_json(error)?),
    };
    let n_changed = conn
        .execute(
            "UPDATE saga_steps SET status = ?3, compensation = ?4, updated_at_ms = ?5
             WHERE saga_id = ?1 AND step_seq = ?2 AND status <> ?6",
            params![
                saga_id.as_str(),
                step_seq,
                status.as_str(),
                note,
                now_ms,
                COMPENSATION_NEVER_OVER.as_str()
            ],
        )
        .map_err(storage)?;
    expect_one(n_changed, || {
        format!("saga {saga_id} has no uncompensated step {step_seq}")
    })?;
    Ok(CanonicalObject::new()
        .str("compensation", &quote(&note, QUOTE_BYTES_MAX))
        .str("compensation_sha256", &sha256_hex(note.as_bytes()))
        .str("saga_id", saga_id.as_str())
        .str("status", status.as_str())
        .int("step_seq", step_seq)
        .finish())
}

/// A step that never begins: refused (a denial, usually: its record quotes what was asked
/// for), reused from a committed step, or simulated in a dry run.
pub(super) fn unbegun_step<'w>(
    conn: &dyn Db,
    write: &'w LogWrite,
    now_ms: i64,
) -> Result<Applied<'w>, TxError> {
    let none = Undo::none();
    let (kind, step, status, output, error, reused_from, summary) = match write {
        LogWrite::RefuseStep { step, error } => (
            KIND_REFUSE_STEP,
            step,
            StepStatus::Fail,
            None,
            Some(error),
            None,
            ArgsSummary::Quoted,
        ),
        LogWrite::ReuseStep {
            step,
            from_saga_id,
            from_step_seq,
            output,
        } => (
            KIND_REUSE_STEP,
            step,
            StepStatus::Commit,
            Some(output),
            None,
            Some((from_saga_id, *from_step_seq)),
            ArgsSummary::Omitted,
        ),
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
            (
                KIND_SIMULATE_STEP,
                step,
                status,
                output,
                error,
                None,
                ArgsSummary::Omitted,
            )
        }
        other => unreachable!("not a step that never begins: {other:?}"),
    };
    let body = insert_step(
        conn,
        step,
        &none,
        status,
        output,
        error,
        reused_from,
        now_ms,
        summary,
        SagaGuard::Checked,
    )?;
    Ok(Applied::written(kind, &step.saga_id, body))
}
