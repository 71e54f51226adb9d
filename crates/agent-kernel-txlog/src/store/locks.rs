//! Isolation: the locks unsettled sagas hold on the resources their begun steps declared,
//! the conflicts a claim met, and the steps a call of an irreversible tool would duplicate.
//!
//! A step claims its resources in the transaction of its BEGIN, which keeps them in the
//! step's row (`saga_steps.resources`): that row *is* the lock, for as long as its saga
//! holds locks ([`HOLDING_SAGAS`](crate::claims::HOLDING_SAGAS): every saga not in
//! [`RELEASES_LOCKS`], that is not `Done`, `FailedRolledBack` or `Undone`; a
//! `FailedRollbackPartial` saga until its last dead letter is settled). Settling a saga
//! releases its locks without a write of its own. A claim is checked against [`Claims`], the
//! writer's map of those rows, read once, then kept up to date by its own claims and by the
//! records other writers append ([`Claims`] says how). An `undo` of a settled saga claims its resources again in the
//! `locks` table (one row per resource, one holder each), which the saga's settlement
//! deletes.

#[allow(clippy::wildcard_imports)]
use super::*;
use crate::audit::KIND_LOCK_CONFLICT;
use crate::transitions::RELEASES_LOCKS;
use agent_kernel_api::{ConflictRecord, DuplicateStep, LaterClaim, LockHolder};
use std::collections::{BTreeMap, BTreeSet};

pub(crate) use crate::claims::Claims;

/// `step_keys.kind` of a key that makes a later call of the tool a duplicate.
pub(super) const KEY_DUPLICATE: &str = "duplicate";

/// The owner in the four columns of `row` from `first` on: host, boot id, pid, start ticks.
fn owner_at(row: &Row, first: usize) -> Result<Owner, crate::sql::Error> {
    Ok(Owner {
        host: row.get(first)?,
        boot_id: row.get(first + 1)?,
        pid: row.get(first + 2)?,
        start_ticks: row.get::<_, i64>(first + 3)? as u64,
    })
}

/// The saga holding `resource` by a claim made again (the `locks` table), if any.
fn holder_of(conn: &dyn Db, resource: &str) -> Result<Option<LockHolder>, TxError> {
    conn.query_row(
        "SELECT l.saga_id, s.state, s.owner_host, s.owner_boot_id, s.owner_pid,
             s.owner_start_ticks
         FROM locks l JOIN sagas s ON s.saga_id = l.saga_id
         WHERE l.resource = ?1",
        params![resource],
        |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, String>(1)?,
                owner_at(row, 2)?,
            ))
        },
    )
    .optional()
    .map_err(storage)?
    .map(|(saga_id, state, owner)| {
        Ok(LockHolder {
            resource: resource.to_owned(),
            saga_id: SagaId::new(saga_id),
            state: state.parse().map_err(corrupt)?,
            owner,
        })
    })
    .transpose()
}

/// The holder of `resource` when it is another saga than `saga_id`: a claim made again
/// (the `locks` table), or an unsettled saga whose begun step declared it (`claims`, each
/// saga named there asked whether it still holds; one that the writes of the batch `before`
/// the claim create, not written yet, holds unless they settle it).
fn held_by_another(
    conn: &dyn Db,
    claims: &mut Claims,
    before: &[LogWrite],
    saga_id: &SagaId,
    resource: &str,
) -> Result<Option<LockHolder>, TxError> {
    if claims.may_hold_claims_again()
        && let Some(holder) = holder_of(conn, resource)?.filter(|holder| holder.saga_id != *saga_id)
    {
        return Ok(Some(holder));
    }
    let Some(sagas) = claims.holders_mut(resource) else {
        return Ok(None);
    };
    let mut at = 0;
    while at < sagas.len() {
        if sagas[at] == *saga_id {
            at += 1;
            continue;
        }
        let holder = |state, owner| LockHolder {
            resource: resource.to_owned(),
            saga_id: sagas[at].clone(),
            state,
            owner,
        };
        match standing(conn, &sagas[at])? {
            Standing::Holds(state, owner) => return Ok(Some(holder(state, owner))),
            Standing::Settled => {
                sagas.swap_remove(at);
            }
            Standing::Absent => match created_in(before, &sagas[at]) {
                Some((state, owner)) if !RELEASES_LOCKS.contains(&state) => {
                    return Ok(Some(holder(state, owner.clone())));
                }
                // Settled by the batch already, or pruned since.
                _ => {
                    sagas.swap_remove(at);
                }
            },
        }
    }
    Ok(None)
}

/// The state and owner of the saga `writes` create as `saga_id`, as they leave it (its last
/// state change among them), if they create it.
fn created_in<'w>(writes: &'w [LogWrite], saga_id: &SagaId) -> Option<(SagaState, &'w Owner)> {
    let mut created = None;
    for write in writes {
        match write {
            LogWrite::CreateSaga(new) if new.saga_id == *saga_id => {
                created = Some((new.state, &new.owner));
            }
            LogWrite::SetState {
                saga_id: changed,
                state,
            } if changed == saga_id => {
                if let Some((now, _)) = &mut created {
                    *now = *state;
                }
            }
            _ => {}
        }
    }
    created
}

/// Where a saga stands towards the locks of its begun steps.
enum Standing {
    /// It holds them: its state and owner.
    Holds(SagaState, Owner),
    /// It is settled: they are released.
    Settled,
    /// The log has no such saga (not written yet, or pruned).
    Absent,
}

/// Whether `saga_id` holds the locks of its begun steps, as
/// [`HOLDING_SAGAS`](crate::claims::HOLDING_SAGAS) counts: not settled ([`RELEASES_LOCKS`]),
/// and when `FailedRollbackPartial`, with a dead letter open.
fn standing(conn: &dyn Db, saga_id: &SagaId) -> Result<Standing, TxError> {
    let found = conn
        .query_row(
            "SELECT state, owner_host, owner_boot_id, owner_pid, owner_start_ticks,
                 CASE WHEN EXISTS (SELECT 1 FROM dead_letters
                     WHERE saga_id = ?1 AND status = 'open') THEN 1 ELSE 0 END
             FROM sagas WHERE saga_id = ?1",
            params![saga_id.as_str()],
            |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    owner_at(row, 1)?,
                    row.get::<_, i64>(5)? == 1,
                ))
            },
        )
        .optional()
        .map_err(storage)?;
    let Some((state, owner, letter_open)) = found else {
        return Ok(Standing::Absent);
    };
    let state: SagaState = state.parse().map_err(corrupt)?;
    Ok(if holds_steps_locks(state, letter_open) {
        Standing::Holds(state, owner)
    } else {
        Standing::Settled
    })
}

/// Whether a saga in `state` holds the locks of its begun steps: not settled
/// ([`RELEASES_LOCKS`]), and when `FailedRollbackPartial`, with a dead letter open
/// (`letter_open`, looked at for that state only).
fn holds_steps_locks(state: SagaState, letter_open: bool) -> bool {
    !RELEASES_LOCKS.contains(&state) && (state != SagaState::FailedRollbackPartial || letter_open)
}

/// Why a `BeginStep` was refused before anything of its batch was applied.
#[derive(Debug)]
pub(super) enum Refusal {
    /// Another unsettled saga holds one of its resources.
    Conflict(LockHolder),
    /// It repeats this earlier step of its tool ([`BeginStep::duplicate_check`]).
    Duplicate(DuplicateStep),
}

/// Checks each `BeginStep` of `batch` for a duplicate ([`BeginStep::duplicate_check`]) and
/// claims its resources, before anything of the batch is applied; the refusal of each step
/// that repeats an earlier one or could not claim a resource, by the step's saga and
/// position (nothing of that step's claim is kept, and the approval it would consume is
/// left unused too). A step whose idempotency key is refused claims nothing: it is recorded
/// `FAIL` as before (unless an earlier write of the batch may free the key: then it is
/// checked, and gives its claims back if it is refused after all). A claim writes nothing: the step's row, which its BEGIN inserts, holds
/// it; `claims` notes it for the claims after it.
///
/// Also what each step that got through newly noted in `claims`: a step refused by its key
/// only when it is applied (an earlier step of the batch took the key) must give those back
/// ([`Claims::take_back`]). A later step of the same batch may have been refused on such a
/// claim meanwhile; the kernel writes no batch with two steps under one key.
///
/// The common case costs a lookup of the `locks` table and of `claims` per resource; the
/// holder is read only for a resource another saga's step declared.
pub(super) fn claim_or_refuse(
    conn: &dyn Db,
    claims: &mut Claims,
    batch: &[LogWrite],
) -> Result<Claimed, TxError> {
    refuse_claims_again_beside_others(batch)?;
    let mut refused = Vec::new();
    let mut noted = Vec::new();
    let mut read = false;
    for (at, write) in batch.iter().enumerate() {
        let LogWrite::BeginStep(step) = write else {
            continue;
        };
        if step.resources.is_empty() && step.duplicate_check.is_none() {
            continue;
        }
        // A key held now may be freed by an earlier write of the batch (a step's certain
        // failure, a compensation): then the step is checked as any other, and gives back
        // what it noted if its key refuses it after all.
        if let Some(key) = &step.idempotency_key
            && !may_free_keys(&batch[..at])
            && claim_key(conn, key, step)?.is_some()
        {
            continue;
        }
        if let Some(earlier) = repeated(conn, step)? {
            refused.push((
                step.saga_id.clone(),
                step.step_seq,
                Refusal::Duplicate(earlier),
            ));
            continue;
        }
        if !read && !step.resources.is_empty() {
            // Before this batch's first claim: every claim noted so far is in the rows.
            claims.read_if_needed(conn)?;
            read = true;
        }
        let mut claimed: Vec<&String> = Vec::new();
        let mut holder = None;
        for resource in &step.resources {
            holder = held_by_another(conn, claims, &batch[..at], &step.saga_id, resource)?;
            if holder.is_some() {
                break;
            }
            // What the saga held already (an earlier step declared it) stays noted.
            if claims.add(resource.clone(), &step.saga_id) {
                claimed.push(resource);
            }
        }
        if let Some(holder) = holder {
            for resource in claimed {
                claims.take_back(resource, &step.saga_id);
            }
            refused.push((
                step.saga_id.clone(),
                step.step_seq,
                Refusal::Conflict(holder),
            ));
        } else if step.idempotency_key.is_some() {
            // What a later step of the saga in this batch declares too stays noted even if
            // this one is refused: that step's own note found it noted already.
            let declared_later = |resource: &String| {
                batch[at + 1..].iter().any(|later| {
                    matches!(later, LogWrite::BeginStep(later)
                        if later.saga_id == step.saga_id && later.resources.contains(resource))
                })
            };
            let resources: Vec<String> = claimed
                .into_iter()
                .filter(|resource| !declared_later(resource))
                .cloned()
                .collect();
            if !resources.is_empty() {
                noted.push(Noted {
                    saga_id: step.saga_id.clone(),
                    step_seq: step.step_seq,
                    resources,
                });
            }
        }
    }
    Ok(Claimed { refused, noted })
}

/// Whether one of `writes` may free an idempotency key (a key is free again once its step
/// failed for certain or was compensated): anything but the writes that begin, create or
/// commit, or set a saga's state.
fn may_free_keys(writes: &[LogWrite]) -> bool {
    writes.iter().any(|write| {
        !matches!(
            write,
            LogWrite::CreateSaga(_)
                | LogWrite::BeginStep(_)
                | LogWrite::CommitStep { .. }
                | LogWrite::SetState { .. }
        )
    })
}

/// What [`claim_or_refuse`] decided for a batch.
pub(super) struct Claimed {
    /// The refusal of each step refused, by its saga and position.
    pub(super) refused: Vec<(SagaId, u32, Refusal)>,
    /// What each step with an idempotency key that got through newly noted as claimed.
    pub(super) noted: Vec<Noted>,
}

/// The resources a step with an idempotency key newly noted as claimed in [`Claims`], to be
/// given back if its key refuses it when it is applied.
pub(super) struct Noted {
    pub(super) saga_id: SagaId,
    pub(super) step_seq: u32,
    pub(super) resources: Vec<String>,
}

/// Refuses a batch that claims a saga's resources again ([`LogWrite::ClaimLocks`]) and
/// begins a step of another saga that claims resources: the claims are decided before the
/// batch is applied, and those made again only when it is, so the two would not see each
/// other. The kernel never writes such a batch.
fn refuse_claims_again_beside_others(batch: &[LogWrite]) -> Result<(), TxError> {
    let again: Vec<&SagaId> = batch
        .iter()
        .filter_map(|write| match write {
            LogWrite::ClaimLocks { saga_id } => Some(saga_id),
            _ => None,
        })
        .collect();
    let Some(first) = again.first() else {
        return Ok(());
    };
    let other = batch.iter().find_map(|write| match write {
        LogWrite::BeginStep(step)
            if !step.resources.is_empty() && !again.contains(&&step.saga_id) =>
        {
            Some(&step.saga_id)
        }
        _ => None,
    });
    match other {
        Some(other) => Err(corrupt(format!(
            "a batch that claims saga {first}'s resources again cannot begin a step of saga {other} that claims resources: write them apart"
        ))),
        None => Ok(()),
    }
}

/// The earlier step `step` repeats, by its [`duplicate_check`](BeginStep::duplicate_check):
/// the newest step of its tool in another saga, begun at or after the check's instant and
/// not failed, that declared one of its duplicate keys, but the one the step's approval
/// was given over.
fn repeated(conn: &dyn Db, step: &BeginStep) -> Result<Option<DuplicateStep>, TxError> {
    let Some(check) = &step.duplicate_check else {
        return Ok(None);
    };
    newest_duplicate(
        conn,
        &step.saga_id,
        &step.tool_id,
        &step.duplicate_keys,
        check.since_ms,
        check.approved_over.as_ref(),
    )
}

/// Claims `resource` again for step `step_seq` of `saga_id` in the `locks` table unless a
/// claim made again holds it (the saga's own included); whether it did.
fn claim(
    conn: &dyn Db,
    saga_id: &SagaId,
    step_seq: u32,
    resource: &str,
    now_ms: i64,
) -> Result<bool, TxError> {
    let n_inserted = conn
        .execute(
            "INSERT INTO locks (resource, saga_id, step_seq, claimed_at_ms)
             VALUES (?1, ?2, ?3, ?4) ON CONFLICT (resource) DO NOTHING",
            params![resource, saga_id.as_str(), step_seq, now_ms],
        )
        .map_err(storage)?;
    Ok(n_inserted == 1)
}

/// Records the keys that make a later call of a begun step's tool a duplicate, to be found
/// by key; its resources are in its row, and were claimed before its batch was applied
/// ([`claim_or_refuse`]).
pub(super) fn declare(conn: &dyn Db, step: &BeginStep) -> Result<(), TxError> {
    for key in &step.duplicate_keys {
        conn.execute(
            "INSERT INTO step_keys (saga_id, step_seq, kind, key) VALUES (?1, ?2, ?3, ?4)",
            params![step.saga_id.as_str(), step.step_seq, KEY_DUPLICATE, key],
        )
        .map_err(storage)?;
    }
    Ok(())
}

/// Releases every lock of `saga_id` when `state` settles it.
pub(super) fn release_if_settled(
    conn: &dyn Db,
    saga_id: &SagaId,
    state: SagaState,
) -> Result<(), TxError> {
    if RELEASES_LOCKS.contains(&state) {
        release(conn, saga_id)?;
    }
    Ok(())
}

/// Releases every lock `saga_id` claimed again (the `locks` table, which holds only those,
/// a few rows at most); its steps' rows hold the others only while it is unsettled.
pub(super) fn release(conn: &dyn Db, saga_id: &SagaId) -> Result<(), TxError> {
    conn.execute(
        "DELETE FROM locks WHERE saga_id = ?1",
        params![saga_id.as_str()],
    )
    .map_err(storage)?;
    Ok(())
}

/// Each resource the begun steps of `saga_id` declared (`saga_steps.resources`), with the
/// first step that did, sorted by resource: every lock the saga can hold is one of them.
fn declared(conn: &dyn Db, saga_id: &SagaId) -> Result<BTreeMap<String, u32>, TxError> {
    let rows: Vec<(u32, String)> = conn
        .query_map(
            "SELECT step_seq, resources FROM saga_steps
             WHERE saga_id = ?1 AND resources IS NOT NULL ORDER BY step_seq",
            params![saga_id.as_str()],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .map_err(storage)?;
    let mut declared = BTreeMap::new();
    for (step_seq, resources) in rows {
        for resource in from_json::<Vec<String>>("resources", &resources)? {
            declared.entry(resource).or_insert(step_seq);
        }
    }
    Ok(declared)
}

/// [`LogWrite::ClaimLocks`]: every resource the saga's begun steps declared, claimed again
/// in the `locks` table; [`TxError::Conflict`] (the batch undone) when another saga holds
/// one. The audit body.
pub(super) fn claim_again(conn: &dyn Db, saga_id: &SagaId, now_ms: i64) -> Result<String, TxError> {
    let declared = declared(conn, saga_id)?;
    // Rare (an undo, a retry): the rows are read afresh, not through the writer's map.
    let mut claims = Claims::default();
    claims.read_if_needed(conn)?;
    for (resource, step_seq) in &declared {
        if let Some(holder) = held_by_another(conn, &mut claims, &[], saga_id, resource)? {
            return Err(TxError::Conflict(Box::new(holder)));
        }
        claim(conn, saga_id, *step_seq, resource, now_ms)?;
    }
    Ok(locks_body(
        saga_id,
        "claimed",
        declared.keys().map(String::as_str),
    ))
}

/// [`LogWrite::ReleaseLocks`]: the locks of `saga_id` released when it is settled and
/// `owner` still owns it; the audit body, or `None` when there was nothing to release.
pub(super) fn release_settled(
    conn: &dyn Db,
    saga_id: &SagaId,
    owner: &Owner,
) -> Result<Option<String>, TxError> {
    let settled: bool = conn
        .query_row(
            &format!(
                "SELECT CASE WHEN {} THEN 1 ELSE 0 END FROM sagas
                 WHERE saga_id = ?1 AND owner_host = ?2 AND owner_boot_id = ?3
                     AND owner_pid = ?4 AND owner_start_ticks = ?5",
                crate::transitions::sql_in(
                    "state",
                    RELEASES_LOCKS.iter().map(|state| state.as_str())
                )
            ),
            params![
                saga_id.as_str(),
                owner.host,
                owner.boot_id,
                owner.pid,
                owner.start_ticks as i64
            ],
            |row| Ok(row.get::<_, i64>(0)? == 1),
        )
        .optional()
        .map_err(storage)?
        .unwrap_or(false);
    let held = claimed_again(conn, saga_id)?;
    if !settled || held.is_empty() {
        return Ok(None);
    }
    release(conn, saga_id)?;
    Ok(Some(locks_body(
        saga_id,
        "released",
        held.iter().map(String::as_str),
    )))
}

/// The audit body of a `Locks` record.
fn locks_body<'k>(
    saga_id: &SagaId,
    action: &str,
    resources: impl IntoIterator<Item = &'k str>,
) -> String {
    CanonicalObject::new()
        .str("action", action)
        .str_array("resources", resources)
        .str("saga_id", saga_id.as_str())
        .finish()
}

/// The settled sagas that still hold locks (an `undo` of them stopped after claiming).
pub(crate) fn settled_lock_holders(conn: &dyn Db) -> Result<Vec<SagaSummary>, TxError> {
    let settled =
        crate::transitions::sql_in("state", RELEASES_LOCKS.iter().map(|state| state.as_str()));
    query_sagas(
        conn,
        &format!(
            "SELECT {SAGA_COLUMNS} FROM sagas
             WHERE {settled} AND saga_id IN (SELECT saga_id FROM locks)"
        ),
        params![],
    )
}

/// The audit body of a claim refused: the step that asked and the saga that holds.
pub(super) fn conflict_body(step: &BeginStep, holder: &LockHolder) -> String {
    CanonicalObject::new()
        .str("args_sha256", &sha256_hex(step.args.to_string().as_bytes()))
        .object(
            "holder",
            CanonicalObject::new()
                .object("owner", owner_body(&holder.owner))
                .str("saga_id", holder.saga_id.as_str())
                .str("state", holder.state.as_str()),
        )
        .str("resource", &quote(&holder.resource, QUOTE_BYTES_MAX))
        .str("saga_id", step.saga_id.as_str())
        .int("step_seq", step.step_seq)
        .str("tool", &step.tool_id)
        .finish()
}

/// The resources `saga_id` holds, sorted: those its begun steps declared while it is
/// unsettled, and those it claimed again.
pub(crate) fn locks_of(
    conn: &dyn Db,
    saga: &SagaSummary,
    steps: &[StepRecord],
) -> Result<Vec<String>, TxError> {
    let mut held: BTreeSet<String> = claimed_again(conn, &saga.saga_id)?.into_iter().collect();
    // As `standing` and `declared` tell, from the saga and steps just read in the same
    // snapshot (the open letters asked only where they matter).
    let letter_open =
        saga.state == SagaState::FailedRollbackPartial && letter_open(conn, &saga.saga_id)?;
    if holds_steps_locks(saga.state, letter_open) {
        held.extend(steps.iter().flat_map(|step| step.resources.iter().cloned()));
    }
    Ok(held.into_iter().collect())
}

/// Whether a dead letter of `saga_id` is open.
fn letter_open(conn: &dyn Db, saga_id: &SagaId) -> Result<bool, TxError> {
    conn.query_row(
        "SELECT CASE WHEN EXISTS (SELECT 1 FROM dead_letters
             WHERE saga_id = ?1 AND status = 'open') THEN 1 ELSE 0 END",
        params![saga_id.as_str()],
        |row| Ok(row.get::<_, i64>(0)? == 1),
    )
    .map_err(storage)
}

/// The resources `saga_id` claimed again (the `locks` table), sorted.
fn claimed_again(conn: &dyn Db, saga_id: &SagaId) -> Result<Vec<String>, TxError> {
    conn.query_map(
        "SELECT resource FROM locks WHERE saga_id = ?1 ORDER BY resource",
        params![saga_id.as_str()],
        |row| row.get(0),
    )
    .map_err(storage)
}

/// The claims of `saga_id` that other sagas' locks refused, oldest first, from the audit
/// chain's `LockConflict` records.
pub(crate) fn conflicts_of(
    conn: &dyn Db,
    saga_id: &SagaId,
) -> Result<Vec<ConflictRecord>, TxError> {
    let rows: Vec<(i64, String)> = conn
        .query_map(
            &format!(
                "SELECT at_ms, body FROM audit_log WHERE saga_id = ?1 AND kind = '{KIND_LOCK_CONFLICT}'
                 ORDER BY seq"
            ),
            params![saga_id.as_str()],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .map_err(storage)?;
    rows.into_iter()
        .map(|(at_ms, body)| {
            let body: Value = from_json("body", &body)?;
            let text = |value: &Value| value.as_str().unwrap_or_default().to_owned();
            Ok(ConflictRecord {
                at_ms,
                step_seq: body["step_seq"]
                    .as_u64()
                    .and_then(|seq| u32::try_from(seq).ok())
                    .ok_or_else(|| corrupt("a LockConflict record without its step_seq"))?,
                tool_id: text(&body["tool"]),
                resource: text(&body["resource"]),
                holder_saga_id: SagaId::new(text(&body["holder"]["saga_id"])),
                holder_state: text(&body["holder"]["state"]).parse().map_err(corrupt)?,
            })
        })
        .collect()
}

/// See [`TxLog::later_claim`](agent_kernel_api::TxLog::later_claim): the steps begun
/// since whose resources' text holds the resource's JSON spelling (a `LIKE` both SQLite
/// and PostgreSQL run, with no index to use), newest first, the first whose resources
/// hold it exactly.
pub(crate) fn later_claim(
    conn: &dyn Db,
    saga_id: &SagaId,
    resource: &str,
    since_ms: i64,
) -> Result<Option<LaterClaim>, TxError> {
    let spelled = serde_json::to_string(resource).map_err(corrupt)?;
    let mut pattern = String::from("%");
    for char in spelled.chars() {
        if matches!(char, '%' | '_' | '\\') {
            pattern.push('\\');
        }
        pattern.push(char);
    }
    pattern.push('%');
    let statuses = crate::transitions::sql_in(
        "s.status",
        [
            StepStatus::Commit,
            StepStatus::Begin,
            StepStatus::CompensationFailed,
        ]
        .iter()
        .map(|status| status.as_str()),
    );
    // A step whose compensation failed keeps its effect whatever its saga came to: its
    // letter resolved by hand settles the saga `FailedRolledBack` with the effect in place.
    let failed = StepStatus::CompensationFailed.as_str();
    let undone = crate::transitions::sql_in(
        "g.state",
        [SagaState::FailedRolledBack, SagaState::Undone]
            .iter()
            .map(|state| state.as_str()),
    );
    let rows: Vec<(String, u32, String, i64, String)> = conn
        .query_map(
            &format!(
                "SELECT s.saga_id, s.step_seq, g.state, s.created_at_ms, s.resources
                 FROM saga_steps s JOIN sagas g ON g.saga_id = s.saga_id
                 WHERE s.saga_id <> ?1 AND s.created_at_ms >= ?2
                     AND s.resources LIKE ?3 ESCAPE '\\' AND {statuses}
                     AND (s.status = '{failed}' OR NOT {undone})
                 ORDER BY s.created_at_ms DESC, s.saga_id DESC, s.step_seq DESC"
            ),
            params![saga_id.as_str(), since_ms, pattern],
            |row| {
                Ok((
                    row.get(0)?,
                    row.get(1)?,
                    row.get(2)?,
                    row.get(3)?,
                    row.get(4)?,
                ))
            },
        )
        .map_err(storage)?;
    for (later, step_seq, state, at_ms, resources) in rows {
        if from_json::<Vec<String>>("resources", &resources)?
            .iter()
            .any(|claimed| claimed == resource)
        {
            return Ok(Some(LaterClaim {
                saga_id: SagaId::new(later),
                step_seq,
                state: state.parse().map_err(corrupt)?,
                at_ms,
            }));
        }
    }
    Ok(None)
}

/// See [`TxLog::duplicate_of`](agent_kernel_api::TxLog::duplicate_of).
pub(crate) fn duplicate_of(
    conn: &dyn Db,
    saga_id: &SagaId,
    tool_id: &str,
    keys: &[String],
    since_ms: i64,
) -> Result<Option<DuplicateStep>, TxError> {
    newest_duplicate(conn, saga_id, tool_id, keys, since_ms, None)
}

/// [`duplicate_of`], never finding `except` (a saga and a position); of steps begun in the
/// same millisecond, the greatest saga id and position is the newest.
fn newest_duplicate(
    conn: &dyn Db,
    saga_id: &SagaId,
    tool_id: &str,
    keys: &[String],
    since_ms: i64,
    except: Option<&(SagaId, u32)>,
) -> Result<Option<DuplicateStep>, TxError> {
    let mut newest: Option<DuplicateStep> = None;
    let fail = StepStatus::Fail.as_str();
    // A step no saga has: nothing is excepted.
    let (except_saga, except_seq) =
        except.map_or(("", -1), |(saga, seq)| (saga.as_str(), i64::from(*seq)));
    for key in keys {
        let found = conn
            .query_row(
                &format!(
                    "SELECT s.saga_id, s.step_seq, s.args, s.status, s.created_at_ms
                     FROM step_keys k
                     JOIN saga_steps s ON s.saga_id = k.saga_id AND s.step_seq = k.step_seq
                     WHERE k.kind = '{KEY_DUPLICATE}' AND k.key = ?1 AND s.tool_id = ?2
                         AND s.saga_id <> ?3 AND s.created_at_ms >= ?4 AND s.status <> '{fail}'
                         AND NOT (s.saga_id = ?5 AND s.step_seq = ?6)
                     ORDER BY s.created_at_ms DESC, s.saga_id DESC, s.step_seq DESC LIMIT 1"
                ),
                params![
                    key,
                    tool_id,
                    saga_id.as_str(),
                    since_ms,
                    except_saga,
                    except_seq
                ],
                |row| {
                    Ok((
                        row.get::<_, String>(0)?,
                        row.get::<_, u32>(1)?,
                        row.get::<_, String>(2)?,
                        row.get::<_, String>(3)?,
                        row.get::<_, i64>(4)?,
                    ))
                },
            )
            .optional()
            .map_err(storage)?;
        let Some((found_saga, step_seq, args, status, at_ms)) = found else {
            continue;
        };
        if newest.as_ref().is_some_and(|newest| {
            (newest.at_ms, newest.saga_id.as_str(), newest.step_seq)
                >= (at_ms, found_saga.as_str(), step_seq)
        }) {
            continue;
        }
        newest = Some(DuplicateStep {
            saga_id: SagaId::new(found_saga),
            step_seq,
            tool_id: tool_id.to_owned(),
            args: from_json("args", &args)?,
            status: status.parse().map_err(corrupt)?,
            key: key.clone(),
            at_ms,
        });
    }
    Ok(newest)
}
