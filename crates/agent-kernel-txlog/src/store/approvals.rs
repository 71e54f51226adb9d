//! Approval requests: asked, decided, consumed once, vouched for against their audit
//! record, and read.

#[allow(clippy::wildcard_imports)]
use super::*;
use crate::transitions::{CONSUMED_FROM, decided_from, sql_in};

/// Inserts a pending request; returns its audit body ([`request_body`]).
pub(super) fn request_approval(
    conn: &dyn Db,
    request: &ApprovalRequest,
) -> Result<String, TxError> {
    let (args_text, rest_text) = request_texts(request)?;
    conn.execute(
        "INSERT INTO approvals (approval_id, saga_id, step_seq, tool_id, args, idempotency_key,
             digest, rest, status, requested_at_ms, expires_at_ms, operator_key_check,
             duplicate_of)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 'pending', ?9, ?10, ?11, ?12)",
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
            request.operator_key_check,
            duplicate_text(request)?
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

/// The earlier step a request may duplicate, as the row holds it (JSON text).
fn duplicate_text(request: &ApprovalRequest) -> Result<Option<String>, TxError> {
    request.duplicate_of.as_ref().map(to_json).transpose()
}

/// A request's arguments and the plan's later steps as the row holds them (JSON text).
pub(super) fn request_texts(
    request: &ApprovalRequest,
) -> Result<(String, Option<String>), TxError> {
    Ok((
        request.args.to_string(),
        request.rest.as_ref().map(to_json).transpose()?,
    ))
}

/// The audit body of a request: arguments and the plan's later steps (`args_text` and
/// `rest_text`, [`request_texts`]) by their SHA-256, with a short quote of the arguments.
/// A request's row is checked against the same function of the row ([`unvouched_request`]).
pub(super) fn request_body(
    request: &ApprovalRequest,
    args_text: &str,
    rest_text: Option<&str>,
) -> String {
    let body = CanonicalObject::new()
        .str("approval_id", &request.approval_id)
        .str("args_sha256", &sha256_hex(args_text.as_bytes()))
        .str("args_summary", &quote(args_text, ARGS_SUMMARY_BYTES_MAX))
        .str("digest", &request.digest);
    // Only when there is one, so the records of requests without it keep their form.
    let body = match duplicate_text(request).ok().flatten() {
        Some(text) => body.str("duplicate_of_sha256", &sha256_hex(text.as_bytes())),
        None => body,
    };
    body.int("expires_at_ms", request.expires_at_ms)
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
pub(super) fn decide_approval<'w>(
    conn: &dyn Db,
    decision: &'w DecideApproval,
    now_ms: i64,
) -> Result<Applied<'w>, TxError> {
    let status = decision.decision.status();
    let by = settled_by(decision.user.as_deref(), decision.uid);
    // From the statuses `transitions` allows; approve and reject within the request's time.
    let from = sql_in(
        "status",
        decided_from(status).iter().map(|status| status.as_str()),
    );
    let condition = match decision.decision {
        ApprovalDecision::Approve | ApprovalDecision::Reject => {
            format!("{from} AND expires_at_ms > ?5")
        }
        _ => from,
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
        .str("digest", &digest);
    let body = with_note(body, note)
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
pub(super) fn consume_approval(
    conn: &dyn Db,
    consume: &ConsumeApproval,
    key: Option<&AuditKey>,
) -> Result<String, TxError> {
    let args_text = consume.args.to_string();
    let n_changed = conn
        .execute(
            "UPDATE approvals SET status = 'consumed'
             WHERE approval_id = ?1 AND status = ?7 AND saga_id = ?2 AND step_seq = ?3
                 AND tool_id = ?4 AND args = ?5 AND digest = ?6",
            params![
                consume.approval_id,
                consume.saga_id.as_str(),
                consume.step_seq,
                consume.tool_id,
                args_text,
                consume.digest,
                CONSUMED_FROM.as_str()
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
pub(super) fn unverified_decision(
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
pub(super) fn unsound_record(
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
pub(super) fn decision_seq(conn: &dyn Db, approval_id: &str) -> Result<Option<i64>, TxError> {
    conn.query_row(
        "SELECT decision_seq FROM approvals WHERE approval_id = ?1",
        params![approval_id],
        |row| row.get(0),
    )
    .map_err(storage)
}

/// The columns of an audit record, in the order [`audit_record_from_row`] reads them.
pub(super) const AUDIT_RECORD_COLUMNS: &str =
    "seq, at_ms, kind, saga_id, body, prev_hash, hash, mac";

pub(super) fn audit_record_from_row(row: &Row) -> Result<crate::audit::Record, crate::sql::Error> {
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
pub(super) fn unvouched_request(
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
        ("duplicate_of_sha256", "earlier call it may repeat"),
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

pub(super) const APPROVAL_COLUMNS: &str =
    "approval_id, saga_id, step_seq, tool_id, args, idempotency_key,
    digest, rest, status, requested_at_ms, expires_at_ms, decided_at_ms, decided_by, note,
    operator_key_check, duplicate_of";

pub(super) fn approval_from_row(
    row: &Row,
) -> Result<Result<ApprovalRecord, TxError>, crate::sql::Error> {
    let args: String = row.get(4)?;
    let rest: Option<String> = row.get(7)?;
    let status: String = row.get(8)?;
    let step_seq: i64 = row.get(2)?;
    let duplicate_of: Option<String> = row.get(15)?;
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
                duplicate_of: duplicate_of
                    .map(|text| from_json("approvals.duplicate_of", &text))
                    .transpose()?,
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

pub(super) fn query_approvals(
    conn: &dyn Db,
    sql: &str,
    params: &[&dyn ToValue],
) -> Result<Vec<ApprovalRecord>, TxError> {
    query_all(conn, sql, params, approval_from_row)
}

/// Every row `sql` selects, each read by `from_row` (whose inner error is a corrupt
/// value).
pub(super) fn query_all<T>(
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
