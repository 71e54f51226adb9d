//! The console's acting routes: decisions, a dead letter's retry and resolution, an undo,
//! and the audit check. Each is an operator action of the library, as the command line
//! runs it, recorded as the console's operator.

use std::future::Future;
use std::sync::Arc;

use agent_kernel::operator::{self, OperatorLock};
use agent_kernel::{Kernel, KernelError, SystemClock};
use agent_kernel_api::{Clock as _, SagaId};
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Redirect};
use serde_json::json;

use super::auth::Access;
use super::{
    Answer, Console, Fields, Refuse as _, Refused, SAGA_AUDIT_RECORDS, Shared, failed, pages,
    refused, saga_id_of, wants_json,
};
use crate::output::saga_record_document;

/// The audit chain's last check by this console: when, and what it found.
#[derive(Debug, Clone)]
pub(crate) struct AuditCheck {
    /// When it ran, in ms since the Unix epoch.
    pub(crate) at_ms: i64,
    /// How many records it checked (`None`: not counted, or the log predates the chain).
    pub(crate) n_records: Option<u64>,
    /// The first bad record and why (`None`: intact).
    pub(crate) first_bad: Option<(u64, String)>,
}

impl Console {
    /// The kernel that compensates, or the refusal of a console started without a policy.
    fn compensating(&self, json: bool) -> Result<&Arc<Kernel>, Refused> {
        self.compensating.as_ref().ok_or_else(|| {
            refused(
                json,
                StatusCode::CONFLICT,
                "this console was started without a sandbox policy, so it cannot compensate: restart it with --sandbox and the policy the sagas ran under; nothing was done",
            )
        })
    }

    /// The audit records about `saga_id`, oldest first (at most [`SAGA_AUDIT_RECORDS`]),
    /// read from the log (its file, or its PostgreSQL database) on the outside thread; when
    /// they cannot be read, why not.
    pub(super) async fn saga_audit_records(
        &self,
        saga_id: &SagaId,
    ) -> Result<Vec<agent_kernel_txlog::AuditRecord>, String> {
        let query = agent_kernel_txlog::AuditQuery {
            saga_id: Some(saga_id.as_str().to_owned()),
            limit: SAGA_AUDIT_RECORDS,
            ..agent_kernel_txlog::AuditQuery::default()
        };
        let db = self.db.clone();
        let records = self
            .outside
            .run(async move { operator::audit_records(&db, query).await })
            .await
            .and_then(|records| records)
            .map_err(|error| format!("cannot read its audit records: {error}"))?;
        Ok(records.into_iter().rev().collect())
    }

    fn remember(&self, check: AuditCheck) {
        if let Ok(mut last) = self.last_check.lock() {
            *last = Some(check);
        }
    }

    /// What a compensating action takes first, as `undo` and `dlq retry` do: the operator
    /// lock of the log (one compensating action at a time, this console's or a command
    /// line's), then the audit chain's word for the undo records it acts on.
    async fn before_compensating(&self, json: bool) -> Result<OperatorLock, Refused> {
        let db = self.db.clone();
        let lock = self
            .outside
            .run(async move { OperatorLock::acquire(&db, operator::OPERATOR_LOCK_WAIT).await })
            .await
            .and_then(|locked| locked)
            .map_err(|error| match error {
                // Another action holds it: that is a conflict, not bad input.
                KernelError::InvalidRequest(message) => {
                    refused(json, StatusCode::CONFLICT, &message)
                }
                error => Refused(Box::new(failed(json, &error))),
            })?;
        let (db, key) = (self.db.clone(), self.audit_key.clone());
        let vouched = self
            .outside
            .run(async move { operator::vouch_for_log(&db, key).await })
            .await
            .and_then(|vouched| vouched);
        let at_ms = SystemClock.now_ms();
        match vouched {
            Ok(operator::Vouched::Intact) => Ok(lock),
            Ok(operator::Vouched::PredatesChain) => {
                self.remember(AuditCheck {
                    at_ms,
                    n_records: None,
                    first_bad: None,
                });
                Ok(lock)
            }
            Err(KernelError::Tampered { seq, reason }) => {
                self.remember(AuditCheck {
                    at_ms,
                    n_records: None,
                    first_bad: Some((seq, reason.clone())),
                });
                Err(refused(
                    json,
                    StatusCode::CONFLICT,
                    &format!(
                        "the log failed its audit check at record {seq}: {reason}; nothing was done, since its undo records cannot be trusted (see Audit, or `agent-kernel audit verify`)"
                    ),
                ))
            }
            Err(error) => Err(error).refuse(json),
        }
    }
}

/// Whether a form's checkbox or a JSON boolean field is set.
fn flag(fields: &Fields, name: &str) -> bool {
    fields
        .get(name)
        .is_some_and(|value| matches!(value.as_str(), "true" | "on" | "1" | "yes"))
}

pub(super) async fn approve(
    state: State<Shared>,
    headers: HeaderMap,
    id: UrlPath<String>,
    fields: axum::Extension<Fields>,
) -> Answer {
    decide(state, headers, id, fields, true).await
}

pub(super) async fn reject(
    state: State<Shared>,
    headers: HeaderMap,
    id: UrlPath<String>,
    fields: axum::Extension<Fields>,
) -> Answer {
    decide(state, headers, id, fields, false).await
}

/// `POST /approvals/ID/approve` (`note`) and `…/reject` (`reason`): the decision, once,
/// recorded as the console's operator.
async fn decide(
    State(console): State<Shared>,
    headers: HeaderMap,
    UrlPath(id): UrlPath<String>,
    axum::Extension(fields): axum::Extension<Fields>,
    approve: bool,
) -> Answer {
    let json = wants_json(&headers);
    let note = if approve {
        fields.get("note")
    } else {
        Some(fields.required(
            json,
            "reason",
            "a rejection needs a reason (field `reason`); nothing was changed",
        )?)
    };
    let view = operator::decide(
        &console.kernel,
        operator::Decision {
            approval_id: id,
            approve,
            note,
            operator_key: console.operator_key.clone(),
            by: console.operator.clone(),
        },
    )
    .await
    .refuse(json)?;
    if !json {
        return Ok(Redirect::to("/approvals").into_response());
    }
    Ok(axum::Json(json!({"id": view.request.approval_id, "status": view.status})).into_response())
}

/// `POST /dead-letters/ID/resolve` (`note`): the letter settled by hand, recorded as the
/// console's operator.
pub(super) async fn resolve(
    State(console): State<Shared>,
    headers: HeaderMap,
    UrlPath(id): UrlPath<String>,
    axum::Extension(fields): axum::Extension<Fields>,
) -> Answer {
    let json = wants_json(&headers);
    let note = fields.required(
        json,
        "note",
        "resolving a dead letter needs a note saying how it was settled (field `note`); nothing was changed",
    )?;
    let outcome =
        operator::resolve_dead_letter(&console.kernel, &id, &note, console.operator.clone())
            .await
            .refuse(json)?;
    if !json {
        return Ok(Redirect::to("/dead-letters").into_response());
    }
    Ok(axum::Json(json!({
        "id": outcome.letter.letter_id,
        "status": outcome.letter.status,
    }))
    .into_response())
}

/// Runs a compensating action on a task of its own and waits for it: a browser that goes
/// away mid-request (closed, or a second click) drops the request's future, never the
/// action, which finishes and records its outcome (and releases what it claimed).
async fn to_the_end(json: bool, action: impl Future<Output = Answer> + Send + 'static) -> Answer {
    tokio::spawn(action).await.unwrap_or_else(|error| {
        Err(refused(
            json,
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("the action stopped before it answered ({error}); see the saga's timeline for what it did"),
        ))
    })
}

/// `POST /sagas/ID/undo` (`reason`, `force`): the saga undone as `undo --saga ID` does,
/// recorded as the console's operator; answers its record as `log --saga ID --json`.
pub(super) async fn undo(
    State(console): State<Shared>,
    headers: HeaderMap,
    UrlPath(id): UrlPath<String>,
    axum::Extension(fields): axum::Extension<Fields>,
) -> Answer {
    let json = wants_json(&headers);
    let saga_id = saga_id_of(json, id)?;
    let reason = fields.required(
        json,
        "reason",
        "an undo needs a reason (field `reason`); nothing was undone",
    )?;
    let force = flag(&fields, "force");
    to_the_end(json, async move {
        let kernel = console.compensating(json)?;
        let _lock = console.before_compensating(json).await?;
        let request = agent_kernel::UndoRequest {
            reason,
            force,
            by: console.operator.clone(),
        };
        let report = operator::undo(kernel, &saga_id, &request, &agent_kernel::NoObserver)
            .await
            .refuse(json)?;
        console
            .events
            .send(json!({"type": "saga", "saga_id": saga_id, "state": report.state}));
        if !json {
            return Ok(Redirect::to(&format!("/sagas/{}", saga_path(&saga_id))).into_response());
        }
        let record = operator::saga(console.kernel.log().as_ref(), &saga_id)
            .await
            .refuse(json)?;
        Ok(axum::Json(saga_record_document(&record)).into_response())
    })
    .await
}

/// A saga id as a path segment.
fn saga_path(saga_id: &SagaId) -> String {
    url::form_urlencoded::byte_serialize(saga_id.as_str().as_bytes()).collect()
}

/// `POST /dead-letters/ID/retry` (`force`): the compensation tried again now, as `dlq retry
/// ID` does; `{"id", "status", "saga_state", "detail"}`, the status `retried` when it was
/// compensated, still `open` when it failed again.
pub(super) async fn retry(
    State(console): State<Shared>,
    headers: HeaderMap,
    UrlPath(id): UrlPath<String>,
    axum::Extension(fields): axum::Extension<Fields>,
    axum::Extension(access): axum::Extension<Access>,
) -> Answer {
    let json = wants_json(&headers);
    let request = operator::RetryRequest {
        letter_id: id,
        force: flag(&fields, "force"),
        by: console.operator.clone(),
    };
    let csrf = access.csrf().to_owned();
    to_the_end(json, async move {
        let kernel = console.compensating(json)?;
        let _lock = console.before_compensating(json).await?;
        let outcome = operator::retry_dead_letter(kernel, &request)
            .await
            .refuse(json)?;
        if !json {
            return Ok(Html(pages::retried(&outcome, &csrf).into_string()).into_response());
        }
        Ok(axum::Json(json!({
            "id": outcome.letter.letter_id,
            "status": outcome.letter.status,
            "saga_state": outcome.saga_state,
            "detail": outcome.detail,
        }))
        .into_response())
    })
    .await
}

/// `POST /audit/verify`: the whole audit chain checked now (`audit verify --json`).
pub(super) async fn verify(
    State(console): State<Shared>,
    headers: HeaderMap,
    axum::Extension(access): axum::Extension<Access>,
) -> Answer {
    let json = wants_json(&headers);
    let (db, key) = (console.db.clone(), console.audit_key.clone());
    let report = console
        .outside
        .run(async move { operator::verify(&db, key).await })
        .await
        .and_then(|report| report)
        .refuse(json)?;
    console.remember(AuditCheck {
        at_ms: SystemClock.now_ms(),
        n_records: Some(report.n_records),
        first_bad: report
            .first_bad
            .as_ref()
            .map(|bad| (bad.seq, bad.reason.clone())),
    });
    if json {
        return Ok(axum::Json(crate::audit::report_document(&report)).into_response());
    }
    Ok(Html(pages::audit(&report, access.csrf()).into_string()).into_response())
}
