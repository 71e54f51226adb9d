//! Sagas and steps: created, begun (with their idempotency keys), read, and taken over.

#[allow(clippy::wildcard_imports)]
use super::*;

/// Creates saga `saga`; returns the audit body.
pub(super) fn create_saga(conn: &dyn Db, saga: &NewSaga, now_ms: i64) -> Result<String, TxError> {
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
    Ok(CanonicalObject::new()
        .opt_str("actor", saga.actor.as_deref())
        .flag("dry_run", saga.dry_run)
        .int("n_steps", saga.n_steps)
        .opt_str("name", saga.name.as_deref())
        .object("owner", owner_body(&saga.owner))
        .str("saga_id", saga.saga_id.as_str())
        .str("state", saga.state.as_str())
        .finish())
}

/// Claims the step's idempotency key (if any) and records its intent; returns the outcome
/// and the audit body.
pub(super) fn begin_step(
    conn: &dyn Db,
    step: &BeginStep,
    now_ms: i64,
) -> Result<(WriteOutcome, String), TxError> {
    if step.step_seq as i64 > i64::from(u32::MAX) {
        return Err(corrupt("step_seq out of range"));
    }
    // That its saga is no dry run is checked by the step's insert (`SagaGuard::NotDryRun`).
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
                SagaGuard::NotDryRun,
            )?;
            super::locks::declare(conn, step)?;
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
                SagaGuard::NotDryRun,
            )?;
            Ok((WriteOutcome::KeyRejected(reason), body))
        }
    }
}

/// Returns why the key cannot be claimed for `step`, or `None` if it can.
pub(super) fn claim_key(
    conn: &dyn Db,
    key: &str,
    step: &BeginStep,
) -> Result<Option<String>, TxError> {
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

/// What the insert of a step row checks of its saga.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum SagaGuard {
    /// Nothing: the caller checked what it needs.
    Checked,
    /// That it is no dry run: a step that begins (or is refused by its key as it would
    /// begin). One statement where a read and an insert were.
    NotDryRun,
}

/// The insert of a step row, ending in `$rows`: its values (`?1` to `?17`, `?16` both
/// times) as a `VALUES` list or a `SELECT`.
macro_rules! insert_step {
    ($rows:literal) => {
        concat!(
            "INSERT INTO saga_steps (saga_id, step_seq, tool_id, tool_version, effect,
                 idempotency_key, args, args_hash, undo, undo_blob, output, status, error,
                 reused_from_saga, reused_from_seq, created_at_ms, updated_at_ms, resources) ",
            $rows
        )
    };
}

/// The insert of a step row ([`SagaGuard::Checked`]).
const INSERT_STEP: &str = insert_step!(
    "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?16, ?17)"
);

/// The insert of a step row into a saga that is no dry run ([`SagaGuard::NotDryRun`]).
const INSERT_STEP_NOT_DRY_RUN: &str = insert_step!(
    "SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?16, ?17
     WHERE EXISTS (SELECT 1 FROM sagas WHERE saga_id = ?1 AND dry_run = 0)"
);

/// Inserts a step row; returns the audit body describing it: small fields as they are,
/// large ones (arguments, undo data and bytes, output, error) by the SHA-256 of exactly
/// what was stored.
#[allow(clippy::too_many_arguments)]
pub(super) fn insert_step(
    conn: &dyn Db,
    step: &BeginStep,
    undo: &Undo,
    status: StepStatus,
    output: Option<&ToolOutput>,
    error: Option<&ToolError>,
    reused_from: Option<(&SagaId, u32)>,
    now_ms: i64,
    args_summary: ArgsSummary,
    guard: SagaGuard,
) -> Result<String, TxError> {
    let output_text = output.map(to_json).transpose()?;
    let error_text = error.map(to_json).transpose()?;
    let args_text = step.args.to_string();
    let undo_text = undo.data.to_string();
    // What a begun step declared, bound by the chain; a step that never began declares
    // nothing.
    let declares = status == StepStatus::Begin;
    let resources_text = (declares && !step.resources.is_empty())
        .then(|| to_json(&step.resources))
        .transpose()?;
    let sql = match guard {
        SagaGuard::Checked => INSERT_STEP,
        SagaGuard::NotDryRun => INSERT_STEP_NOT_DRY_RUN,
    };
    let n_inserted = conn
        .execute(
            sql,
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
                now_ms,
                resources_text
            ],
        )
        .map_err(|err| match err {
            crate::sql::Error::Constraint(_) => TxError::Corrupt(format!(
                "saga {} step {} cannot be begun: {err}",
                step.saga_id, step.step_seq
            )),
            other => storage(other),
        })?;
    if n_inserted == 0 {
        // No such saga, or a dry run: said as the read before the insert said it.
        return Err(if is_dry_run(conn, &step.saga_id)? {
            corrupt(format!(
                "saga {} is a dry run: none of its steps may begin",
                step.saga_id
            ))
        } else {
            corrupt(format!(
                "saga {} step {} was not inserted",
                step.saga_id, step.step_seq
            ))
        });
    }
    let sha256_of = |text: &Option<String>| text.as_ref().map(|text| sha256_hex(text.as_bytes()));
    let mut body = CanonicalObject::new()
        .str("args_hash", &step.args_hash)
        .str("args_sha256", &sha256_hex(args_text.as_bytes()));
    if args_summary == ArgsSummary::Quoted {
        body = body.str("args_summary", &quote(&args_text, ARGS_SUMMARY_BYTES_MAX));
    }
    if declares && !step.duplicate_keys.is_empty() {
        body = body.str_array(
            "duplicate_keys",
            step.duplicate_keys.iter().map(String::as_str),
        );
    }
    let body = body
        .str("effect", step.effect.as_str())
        .opt_object("error", error.map(error_summary))
        .opt_str("error_sha256", sha256_of(&error_text).as_deref())
        .opt_str("idempotency_key", step.idempotency_key.as_deref())
        .opt_str("output_sha256", sha256_of(&output_text).as_deref());
    let body = if declares && !step.resources.is_empty() {
        body.str_array("resources", step.resources.iter().map(String::as_str))
    } else {
        body
    };
    Ok(body
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

pub(super) const SAGA_COLUMNS: &str =
    "saga_id, name, actor, state, owner_host, owner_boot_id, owner_pid,
    owner_start_ticks, n_steps, created_at_ms, updated_at_ms, dry_run";

pub(super) fn saga_from_row(row: &Row) -> Result<Result<SagaSummary, TxError>, crate::sql::Error> {
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

pub(super) fn query_sagas(
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

/// See [`TxLog::saga_page`](agent_kernel_api::TxLog::saga_page).
pub(crate) fn saga_page(
    conn: &dyn Db,
    query: &agent_kernel_api::SagaQuery,
) -> Result<Vec<agent_kernel_api::SagaListing>, TxError> {
    let state = query.state.map(SagaState::as_str);
    let text = query.text.as_ref().map(|text| {
        let mut pattern = String::from("%");
        for c in text.to_ascii_lowercase().chars() {
            if matches!(c, '%' | '_' | '\\') {
                pattern.push('\\');
            }
            pattern.push(c);
        }
        pattern.push('%');
        pattern
    });
    // Without a cursor, one no saga reaches, so that the index of sagas by creation is
    // always read as a range from it.
    let (before_ms, before_id) = match &query.before {
        Some((at_ms, saga_id)) => (*at_ms, saga_id.as_str()),
        None => (i64::MAX, ""),
    };
    // Each parameter is first met where its type shows (PostgreSQL types it there), and a
    // filter not given is a NULL that passes every row.
    query_all(
        conn,
        &format!(
            "SELECT {SAGA_COLUMNS},
                 (SELECT COUNT(*) FROM saga_steps t WHERE t.saga_id = s.saga_id)
             FROM sagas s
             WHERE (s.state = ?1 OR ?1 IS NULL)
                 AND (s.actor = ?2 OR ?2 IS NULL)
                 AND (EXISTS (SELECT 1 FROM saga_steps t
                     WHERE t.saga_id = s.saga_id AND t.tool_id = ?3) OR ?3 IS NULL)
                 AND (EXISTS (SELECT 1 FROM saga_steps t
                     WHERE t.saga_id = s.saga_id AND lower(t.args) LIKE ?4 ESCAPE '\\')
                     OR ?4 IS NULL)
                 AND s.created_at_ms <= ?5 AND (s.created_at_ms < ?5 OR s.saga_id < ?6)
                 AND (s.name = ?8 OR ?8 IS NULL)
                 AND (s.created_at_ms >= ?9 OR ?9 IS NULL)
                 AND (s.created_at_ms < ?10 OR ?10 IS NULL)
             ORDER BY s.created_at_ms DESC, s.saga_id DESC LIMIT ?7"
        ),
        params![
            state,
            query.actor.as_deref(),
            query.tool.as_deref(),
            text,
            before_ms,
            before_id,
            query.limit,
            query.name.as_deref(),
            query.created_from_ms,
            query.created_until_ms
        ],
        |row| {
            let n_begun: i64 = row.get(12)?;
            Ok(
                saga_from_row(row)?.map(|saga| agent_kernel_api::SagaListing {
                    saga,
                    n_begun: u32::try_from(n_begun).unwrap_or(u32::MAX),
                }),
            )
        },
    )
}

/// See [`TxLog::saga_counts`](agent_kernel_api::TxLog::saga_counts).
pub(crate) fn saga_counts(conn: &dyn Db) -> Result<Vec<(SagaState, u64)>, TxError> {
    let rows: Vec<(String, i64)> = conn
        .query_map(
            "SELECT state, COUNT(*) FROM sagas GROUP BY state ORDER BY state",
            params![],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .map_err(storage)?;
    rows.into_iter()
        .map(|(state, n)| Ok((state.parse().map_err(corrupt)?, n.max(0) as u64)))
        .collect()
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
                 compensation, created_at_ms, updated_at_ms, resources
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
                        row.get::<_, Option<String>>(17)?,
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
            (reused_saga, reused_seq, compensation, created_at_ms, updated_at_ms, resources),
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
            resources: resources
                .map(|text| from_json("resources", &text))
                .transpose()?
                .unwrap_or_default(),
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
    Ok(Some(SagaRecord {
        locks: super::locks::locks_of(conn, &saga, &steps)?,
        conflicts: super::locks::conflicts_of(conn, saga_id)?,
        saga,
        steps,
    }))
}

/// Changes a saga's owner if it still has the expected owner and state, then writes the
/// request's batch; both are chained into the audit log and the head file brought up to
/// date (its sync under `Durability::Full` returned, as by `write_batch`). All of it or
/// nothing is written.
pub(crate) fn take_over(
    conn: &mut Connection,
    audit: &AuditSettings,
    claims: &mut super::Claims,
    request: &TakeOverRequest,
    now_ms: i64,
) -> Result<(bool, Option<crate::head::UnsyncedHead>), TxError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(storage)?;
    let mut chain = Appender::start_with(&tx, audit.key.as_ref(), std::mem::take(claims))?;
    if !take_over_then(&tx, &mut chain, audit.key.as_ref(), request, now_ms)? {
        return Ok((false, None));
    }
    tx.commit().map_err(storage)?;
    let head = chain.head().clone();
    *claims = chain.committed();
    Ok((true, audit.advance_head_deferring_sync(conn, &head)))
}

/// [`take_over_in`], then the request's batch if it held, inside the caller's write
/// transaction (which a refused batch must roll back); returns whether it held.
pub(super) fn take_over_then(
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
