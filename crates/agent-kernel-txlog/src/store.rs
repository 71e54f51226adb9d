//! The SQL behind each log operation. Runs only on the writer thread.

use agent_kernel_api::{
    BeginStep, EffectClass, KeyBinding, LogWrite, NewSaga, Owner, SagaId, SagaRecord, SagaState,
    SagaSummary, StepRecord, StepStatus, ToolError, ToolOutput, TxError, Undo, WriteOutcome,
};
use rusqlite::{Connection, OptionalExtension, Row, TransactionBehavior, params};
use serde_json::Value;

fn storage(err: rusqlite::Error) -> TxError {
    TxError::Storage(err.to_string())
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
pub(crate) fn write_batch(
    conn: &mut Connection,
    batch: &[LogWrite],
    now_ms: i64,
) -> Result<Vec<WriteOutcome>, TxError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(storage)?;
    let mut outcomes = Vec::with_capacity(batch.len());
    for write in batch {
        outcomes.push(apply(&tx, write, now_ms)?);
    }
    tx.commit().map_err(storage)?;
    Ok(outcomes)
}

fn apply(conn: &Connection, write: &LogWrite, now_ms: i64) -> Result<WriteOutcome, TxError> {
    match write {
        LogWrite::CreateSaga(saga) => create_saga(conn, saga, now_ms),
        LogWrite::SetState { saga_id, state } => {
            let n_changed = conn
                .prepare_cached(
                    "UPDATE sagas SET state = ?2, updated_at_ms = ?3 WHERE saga_id = ?1",
                )
                .and_then(|mut s| s.execute(params![saga_id.as_str(), state.as_str(), now_ms]))
                .map_err(storage)?;
            expect_one(n_changed, || format!("no saga {saga_id}"))
        }
        LogWrite::BeginStep(step) => begin_step(conn, step, now_ms),
        LogWrite::CommitStep {
            saga_id,
            step_seq,
            output,
        } => {
            let output = to_json(output)?;
            let n_changed = conn
                .prepare_cached(
                    "UPDATE saga_steps SET status = 'COMMIT', output = ?3, updated_at_ms = ?4
                     WHERE saga_id = ?1 AND step_seq = ?2 AND status = 'BEGIN'",
                )
                .and_then(|mut s| s.execute(params![saga_id.as_str(), step_seq, output, now_ms]))
                .map_err(storage)?;
            expect_one(n_changed, || {
                format!("saga {saga_id} has no step {step_seq} in BEGIN to commit")
            })
        }
        LogWrite::FailStep {
            saga_id,
            step_seq,
            error,
        } => {
            let error = to_json(error)?;
            let n_changed = conn
                .prepare_cached(
                    "UPDATE saga_steps SET status = 'FAIL', error = ?3, updated_at_ms = ?4
                     WHERE saga_id = ?1 AND step_seq = ?2 AND status = 'BEGIN'",
                )
                .and_then(|mut s| s.execute(params![saga_id.as_str(), step_seq, error, now_ms]))
                .map_err(storage)?;
            expect_one(n_changed, || {
                format!("saga {saga_id} has no step {step_seq} in BEGIN to fail")
            })
        }
        LogWrite::RefuseStep { step, error } => {
            insert_step(
                conn,
                step,
                &Undo::none(),
                StepStatus::Fail,
                None,
                Some(error),
                None,
                now_ms,
            )?;
            Ok(WriteOutcome::Written)
        }
        LogWrite::ReuseStep {
            step,
            from_saga_id,
            from_step_seq,
            output,
        } => {
            insert_step(
                conn,
                step,
                &Undo::none(),
                StepStatus::Commit,
                Some(output),
                None,
                Some((from_saga_id, *from_step_seq)),
                now_ms,
            )?;
            Ok(WriteOutcome::Written)
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
                .prepare_cached(
                    "UPDATE saga_steps SET status = ?3, compensation = ?4, updated_at_ms = ?5
                     WHERE saga_id = ?1 AND step_seq = ?2 AND status <> 'COMPENSATED'",
                )
                .and_then(|mut s| {
                    s.execute(params![
                        saga_id.as_str(),
                        step_seq,
                        status.as_str(),
                        note,
                        now_ms
                    ])
                })
                .map_err(storage)?;
            expect_one(n_changed, || {
                format!("saga {saga_id} has no uncompensated step {step_seq}")
            })
        }
        other => Err(corrupt(format!("unsupported log record {other:?}"))),
    }
}

fn expect_one(n_changed: usize, what: impl FnOnce() -> String) -> Result<WriteOutcome, TxError> {
    if n_changed == 1 {
        Ok(WriteOutcome::Written)
    } else {
        Err(TxError::NotFound(what()))
    }
}

fn create_saga(conn: &Connection, saga: &NewSaga, now_ms: i64) -> Result<WriteOutcome, TxError> {
    if saga.n_steps == 0 {
        return Err(corrupt("a saga needs at least one step"));
    }
    conn.prepare_cached(
        "INSERT INTO sagas (saga_id, name, actor, state, owner_host, owner_boot_id, owner_pid,
             owner_start_ticks, n_steps, created_at_ms, updated_at_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?10)",
    )
    .and_then(|mut s| {
        s.execute(params![
            saga.saga_id.as_str(),
            saga.name,
            saga.actor,
            saga.state.as_str(),
            saga.owner.host,
            saga.owner.boot_id,
            saga.owner.pid,
            saga.owner.start_ticks as i64,
            saga.n_steps,
            now_ms
        ])
    })
    .map_err(storage)?;
    Ok(WriteOutcome::Written)
}

/// Claims the step's idempotency key (if any) and records its intent.
fn begin_step(conn: &Connection, step: &BeginStep, now_ms: i64) -> Result<WriteOutcome, TxError> {
    if step.step_seq as i64 > i64::from(u32::MAX) {
        return Err(corrupt("step_seq out of range"));
    }
    let rejection = match &step.idempotency_key {
        None => None,
        Some(key) => claim_key(conn, key, step)?,
    };
    match rejection {
        None => {
            insert_step(
                conn,
                step,
                &step.undo,
                StepStatus::Begin,
                None,
                None,
                None,
                now_ms,
            )?;
            if let Some(key) = &step.idempotency_key {
                conn.prepare_cached(
                    "INSERT INTO idempotency_keys (key, args_hash, saga_id, step_seq)
                     VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT (key) DO UPDATE SET saga_id = ?3, step_seq = ?4",
                )
                .and_then(|mut s| {
                    s.execute(params![
                        key,
                        step.args_hash,
                        step.saga_id.as_str(),
                        step.step_seq
                    ])
                })
                .map_err(storage)?;
            }
            Ok(WriteOutcome::Written)
        }
        Some(reason) => {
            let error = ToolError::failed(reason.clone());
            insert_step(
                conn,
                step,
                &Undo::none(),
                StepStatus::Fail,
                None,
                Some(&error),
                None,
                now_ms,
            )?;
            Ok(WriteOutcome::KeyRejected(reason))
        }
    }
}

/// Returns why the key cannot be claimed for `step`, or `None` if it can.
fn claim_key(conn: &Connection, key: &str, step: &BeginStep) -> Result<Option<String>, TxError> {
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

#[allow(clippy::too_many_arguments)]
fn insert_step(
    conn: &Connection,
    step: &BeginStep,
    undo: &Undo,
    status: StepStatus,
    output: Option<&ToolOutput>,
    error: Option<&ToolError>,
    reused_from: Option<(&SagaId, u32)>,
    now_ms: i64,
) -> Result<(), TxError> {
    let output = output.map(to_json).transpose()?;
    let error = error.map(to_json).transpose()?;
    conn.prepare_cached(
        "INSERT INTO saga_steps (saga_id, step_seq, tool_id, tool_version, effect,
             idempotency_key, args, args_hash, undo, undo_blob, output, status, error,
             reused_from_saga, reused_from_seq, created_at_ms, updated_at_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?16)",
    )
    .and_then(|mut s| {
        s.execute(params![
            step.saga_id.as_str(),
            step.step_seq,
            step.tool_id,
            step.tool_version,
            step.effect.as_str(),
            step.idempotency_key,
            step.args.to_string(),
            step.args_hash,
            undo.data.to_string(),
            undo.blob,
            output,
            status.as_str(),
            error,
            reused_from.map(|(saga_id, _)| saga_id.as_str().to_owned()),
            reused_from.map(|(_, step_seq)| step_seq),
            now_ms
        ])
    })
    .map_err(|err| match err {
        rusqlite::Error::SqliteFailure(code, _)
            if code.code == rusqlite::ErrorCode::ConstraintViolation =>
        {
            TxError::Corrupt(format!(
                "saga {} step {} cannot be begun: {err}",
                step.saga_id, step.step_seq
            ))
        }
        other => storage(other),
    })?;
    Ok(())
}

pub(crate) fn key_binding(conn: &Connection, key: &str) -> Result<Option<KeyBinding>, TxError> {
    let row = conn
        .prepare_cached(
            "SELECT k.args_hash, k.saga_id, k.step_seq, s.status, s.output, g.state, s.error
             FROM idempotency_keys k
             JOIN saga_steps s ON s.saga_id = k.saga_id AND s.step_seq = k.step_seq
             JOIN sagas g ON g.saga_id = k.saga_id
             WHERE k.key = ?1",
        )
        .and_then(|mut s| {
            s.query_row(params![key], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, u32>(2)?,
                    row.get::<_, String>(3)?,
                    row.get::<_, Option<String>>(4)?,
                    row.get::<_, String>(5)?,
                    row.get::<_, Option<String>>(6)?,
                ))
            })
            .optional()
        })
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
    owner_start_ticks, n_steps, created_at_ms, updated_at_ms";

fn saga_from_row(row: &Row<'_>) -> rusqlite::Result<Result<SagaSummary, TxError>> {
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
        created_at_ms: row.get(9)?,
        updated_at_ms: row.get(10)?,
    }))
}

fn query_sagas(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<SagaSummary>, TxError> {
    let mut statement = conn.prepare_cached(sql).map_err(storage)?;
    let rows = statement
        .query_map(params, saga_from_row)
        .map_err(storage)?;
    let mut sagas = Vec::new();
    for row in rows {
        sagas.push(row.map_err(storage)??);
    }
    Ok(sagas)
}

pub(crate) fn sagas(conn: &Connection, limit: u32) -> Result<Vec<SagaSummary>, TxError> {
    query_sagas(
        conn,
        &format!(
            "SELECT {SAGA_COLUMNS} FROM sagas ORDER BY created_at_ms DESC, saga_id DESC LIMIT ?1"
        ),
        params![limit],
    )
}

pub(crate) fn unfinished_sagas(conn: &Connection) -> Result<Vec<SagaSummary>, TxError> {
    query_sagas(
        conn,
        &format!(
            "SELECT {SAGA_COLUMNS} FROM sagas
             WHERE state <> 'Done' AND state <> 'FailedRolledBack'
                 AND state <> 'FailedRollbackPartial'
             ORDER BY created_at_ms, saga_id"
        ),
        [],
    )
}

pub(crate) fn saga(conn: &Connection, saga_id: &SagaId) -> Result<Option<SagaRecord>, TxError> {
    let mut sagas = query_sagas(
        conn,
        &format!("SELECT {SAGA_COLUMNS} FROM sagas WHERE saga_id = ?1"),
        params![saga_id.as_str()],
    )?;
    let Some(saga) = sagas.pop() else {
        return Ok(None);
    };
    let mut statement = conn
        .prepare_cached(
            "SELECT step_seq, tool_id, tool_version, effect, args, args_hash, idempotency_key,
                 undo, undo_blob, status, output, error, reused_from_saga, reused_from_seq,
                 compensation, created_at_ms, updated_at_ms
             FROM saga_steps WHERE saga_id = ?1 ORDER BY step_seq",
        )
        .map_err(storage)?;
    let rows = statement
        .query_map(params![saga_id.as_str()], |row| {
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
        })
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
        ) = row.map_err(storage)?;
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

pub(crate) fn take_over(
    conn: &mut Connection,
    saga_id: &SagaId,
    expected: &Owner,
    expected_state: SagaState,
    new: &Owner,
    now_ms: i64,
) -> Result<bool, TxError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(storage)?;
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
    tx.commit().map_err(storage)?;
    Ok(n_changed == 1)
}
