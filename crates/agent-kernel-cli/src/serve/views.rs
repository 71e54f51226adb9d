//! The console's reading routes: the overview, the approvals inbox, the saga list, a saga's
//! timeline, its audit records and its undo preview, and the dead letters. Each answers a
//! page, or with `Accept: application/json` the command line's document.

use agent_kernel::SystemClock;
use agent_kernel::operator::{self, ApprovalView};
use agent_kernel_api::{Clock as _, SagaId, SagaQuery};
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse};
use serde_json::{Value, json};

use super::auth::Access;
use super::{
    Answer, PAGE_SAGAS_DEFAULT, PAGE_SAGAS_MAX, Refuse as _, Shared, pages, refused, saga_id_of,
    wants_json,
};
use crate::output::saga_record_document;

/// `GET /`: sagas by state, pending approvals, open dead letters; the page adds each
/// request's age and expiry, the sagas `recover` would settle, and the last audit check.
pub(super) async fn overview(
    State(console): State<Shared>,
    headers: HeaderMap,
    axum::Extension(access): axum::Extension<Access>,
) -> Answer {
    let json = wants_json(&headers);
    let kernel = &console.kernel;
    let counts = kernel.log().saga_counts().await.refuse(json)?;
    let pending = operator::pending_approvals(kernel).await.refuse(json)?;
    let letters = operator::dead_letters(kernel).await.refuse(json)?.len();
    if json {
        let counts: serde_json::Map<String, Value> = counts
            .iter()
            .map(|(state, n)| (state.as_str().to_owned(), json!(n)))
            .collect();
        return Ok(axum::Json(json!({
            "counts": counts,
            "approvals_pending": pending.len(),
            "dead_letters_open": letters,
        }))
        .into_response());
    }
    let orphans = kernel.recoverable_sagas().await.refuse(json)?;
    let last_check = console.last_check.lock().ok().and_then(|last| last.clone());
    Ok(Html(
        pages::overview(&pages::Overview {
            counts: &counts,
            pending: &pending,
            dead_letters_open: letters,
            orphans: &orphans,
            last_check: last_check.as_ref(),
            now_ms: SystemClock.now_ms(),
            csrf: access.csrf(),
        })
        .into_string(),
    )
    .into_response())
}

/// `GET /approvals`: as `approvals --json`, or the inbox.
pub(super) async fn approvals(
    State(console): State<Shared>,
    headers: HeaderMap,
    axum::Extension(access): axum::Extension<Access>,
) -> Answer {
    let json = wants_json(&headers);
    let pending = operator::pending_approvals(&console.kernel)
        .await
        .refuse(json)?;
    if json {
        return Ok(axum::Json(crate::approvals::list_document(&pending)).into_response());
    }
    // Each request's saga so far: the steps before the one that waits.
    let mut earlier = Vec::with_capacity(pending.len());
    for view in &pending {
        let request = &view.request;
        let record = console
            .kernel
            .log()
            .saga(&request.saga_id)
            .await
            .refuse(json)?;
        earlier.push(
            record
                .map(|record| record.steps)
                .unwrap_or_default()
                .into_iter()
                .filter(|step| step.step_seq < request.step_seq)
                .collect::<Vec<_>>(),
        );
    }
    Ok(Html(pages::approvals(&pending, &earlier, access.csrf()).into_string()).into_response())
}

/// `GET /sagas/ID`: as `log --saga ID --json`, or its timeline.
pub(super) async fn saga(
    State(console): State<Shared>,
    headers: HeaderMap,
    UrlPath(id): UrlPath<String>,
    axum::Extension(access): axum::Extension<Access>,
) -> Answer {
    let json = wants_json(&headers);
    let saga_id = saga_id_of(json, id)?;
    let record = operator::saga(console.kernel.log().as_ref(), &saga_id)
        .await
        .refuse(json)?;
    if json {
        return Ok(axum::Json(saga_record_document(&record)).into_response());
    }
    let approval = console
        .kernel
        .log()
        .saga_approval(&saga_id)
        .await
        .refuse(json)?
        .map(|approval| ApprovalView::of(approval, SystemClock.now_ms()));
    Ok(Html(pages::saga(&record, approval.as_ref(), access.csrf()).into_string()).into_response())
}

/// `GET /sagas/ID/audit`: the saga's audit records, as `audit list --saga ID --json`
/// (newest first, at most [`SAGA_AUDIT_RECORDS`](super::SAGA_AUDIT_RECORDS)), or a page of
/// them oldest first. Read on demand: the chain has no index by saga, so this reads back
/// from its end.
pub(super) async fn saga_audit(
    State(console): State<Shared>,
    headers: HeaderMap,
    UrlPath(id): UrlPath<String>,
    axum::Extension(access): axum::Extension<Access>,
) -> Answer {
    let json = wants_json(&headers);
    let saga_id = saga_id_of(json, id)?;
    operator::saga(console.kernel.log().as_ref(), &saga_id)
        .await
        .refuse(json)?;
    let records = console.saga_audit_records(&saga_id).await;
    if json {
        let mut records =
            records.map_err(|message| refused(json, StatusCode::CONFLICT, &message))?;
        records.reverse();
        return Ok(axum::Json(json!({"records": records})).into_response());
    }
    Ok(Html(pages::saga_audit(&saga_id, &records, access.csrf()).into_string()).into_response())
}

/// `GET /dead-letters`: as `dlq list --json`, or the list with what each compensation
/// would put back and the forms that retry and resolve each.
pub(super) async fn dead_letters(
    State(console): State<Shared>,
    headers: HeaderMap,
    axum::Extension(access): axum::Extension<Access>,
) -> Answer {
    let json = wants_json(&headers);
    let letters = operator::dead_letters(&console.kernel).await.refuse(json)?;
    if json {
        return Ok(axum::Json(crate::dlq::list_document(&letters)).into_response());
    }
    // What each compensation would put back, as its tool says.
    let mut restores = Vec::with_capacity(letters.len());
    for letter in &letters {
        let record = console.kernel.log().saga(&letter.saga_id).await;
        let step = record.ok().flatten().and_then(|record| {
            record
                .steps
                .into_iter()
                .find(|step| step.step_seq == letter.step_seq)
        });
        restores.push(match step {
            Some(step) => console.kernel.step_restores(&step).await,
            None => None,
        });
    }
    Ok(Html(pages::dead_letters(&letters, &restores, access.csrf()).into_string()).into_response())
}

/// The filters of `GET /sagas`, from its query string, as given (for the page's form and
/// its next link).
#[derive(Debug, Default)]
pub(crate) struct ListFilters {
    pub(crate) state: String,
    pub(crate) tool: String,
    pub(crate) actor: String,
    pub(crate) text: String,
    pub(crate) name: String,
    pub(crate) from: String,
    pub(crate) until: String,
    pub(crate) limit: Option<u32>,
}

impl ListFilters {
    /// The query string of these filters, with `after` when given.
    pub(crate) fn query_string(&self, after: Option<&str>) -> String {
        let mut query = url::form_urlencoded::Serializer::new(String::new());
        for (name, value) in [
            ("state", self.state.as_str()),
            ("tool", &self.tool),
            ("actor", &self.actor),
            ("q", &self.text),
            ("name", &self.name),
            ("from", &self.from),
            ("until", &self.until),
        ] {
            if !value.is_empty() {
                query.append_pair(name, value);
            }
        }
        if let Some(limit) = self.limit {
            query.append_pair("limit", &limit.to_string());
        }
        if let Some(after) = after {
            query.append_pair("after", after);
        }
        query.finish()
    }
}

/// The query of `GET /sagas?state=&tool=&actor=&q=&name=&from=&until=&limit=&after=`, or
/// why it is bad input.
fn list_query(raw: Option<&str>) -> Result<(ListFilters, SagaQuery), String> {
    let mut filters = ListFilters::default();
    let mut after = None;
    for (name, value) in url::form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        let value = value.trim().to_owned();
        match name.as_ref() {
            "state" => filters.state = value,
            "tool" => filters.tool = value,
            "actor" => filters.actor = value,
            "q" => filters.text = value,
            "name" => filters.name = value,
            "from" => filters.from = value,
            "until" => filters.until = value,
            "limit" if !value.is_empty() => {
                let limit = value
                    .parse::<u32>()
                    .ok()
                    .filter(|limit| (1..=PAGE_SAGAS_MAX).contains(limit))
                    .ok_or_else(|| {
                        format!("`limit` must be a whole number from 1 to {PAGE_SAGAS_MAX}")
                    })?;
                filters.limit = Some(limit);
            }
            "after" if !value.is_empty() => after = Some(value),
            _ => {}
        }
    }
    let state = if filters.state.is_empty() {
        None
    } else {
        Some(
            filters
                .state
                .parse()
                .map_err(|_| format!("`state` {:?} is not a saga state", filters.state))?,
        )
    };
    let before = after
        .map(|cursor| {
            cursor
                .split_once(':')
                .and_then(|(at_ms, saga_id)| Some((at_ms.parse::<i64>().ok()?, saga_id)))
                .filter(|(_, saga_id)| !saga_id.is_empty())
                .map(|(at_ms, saga_id)| (at_ms, SagaId::new(saga_id)))
                .ok_or_else(|| format!("`after` {cursor:?} is not a cursor this list gave"))
        })
        .transpose()?;
    let time = |field: &str, text: &str| -> Result<Option<i64>, String> {
        if text.is_empty() {
            return Ok(None);
        }
        agent_kernel_api::parse_utc_ms(text).map(Some).ok_or_else(|| {
            format!(
                "`{field}` {text:?} is not a time: give a UTC date and time such as 2026-12-01 or 2026-12-01T14:30"
            )
        })
    };
    let created_from_ms = time("from", &filters.from)?;
    let created_until_ms = time("until", &filters.until)?;
    let given = |text: &str| (!text.is_empty()).then(|| text.to_owned());
    let query = SagaQuery {
        state,
        actor: given(&filters.actor),
        tool: given(&filters.tool),
        text: given(&filters.text),
        name: given(&filters.name),
        created_from_ms,
        created_until_ms,
        before,
        // One more, to know whether a next page exists.
        limit: filters.limit.unwrap_or(PAGE_SAGAS_DEFAULT) + 1,
    };
    Ok((filters, query))
}

/// `GET /sagas`: a page of the saga list, newest first, with its filters, and the cursor
/// of the next page.
pub(super) async fn sagas(
    State(console): State<Shared>,
    headers: HeaderMap,
    uri: axum::http::Uri,
    axum::Extension(access): axum::Extension<Access>,
) -> Answer {
    let json = wants_json(&headers);
    let (filters, query) = list_query(uri.query())
        .map_err(|message| refused(json, StatusCode::UNPROCESSABLE_ENTITY, &message))?;
    let mut page = operator::saga_page(console.kernel.log().as_ref(), &query)
        .await
        .refuse(json)?;
    let wanted = (query.limit - 1) as usize;
    let next = (page.len() > wanted).then(|| {
        page.truncate(wanted);
        let last = &page[wanted - 1].saga;
        format!("{}:{}", last.created_at_ms, last.saga_id)
    });
    if json {
        let sagas: Vec<Value> = page
            .iter()
            .map(|listing| {
                let saga = &listing.saga;
                json!({
                    "saga_id": saga.saga_id,
                    "state": saga.state,
                    "name": saga.name,
                    "actor": saga.actor,
                    "created_at": agent_kernel_api::format_rfc3339_ms(saga.created_at_ms),
                    "steps": listing.n_begun,
                })
            })
            .collect();
        return Ok(axum::Json(json!({"sagas": sagas, "next": next})).into_response());
    }
    Ok(
        Html(pages::sagas(&page, &filters, next.as_deref(), access.csrf()).into_string())
            .into_response(),
    )
}

/// `GET /sagas/ID/undo`: what an undo would do to each step, nothing undone (`undo
/// --preview`); the page ends in the form that confirms it.
pub(super) async fn undo_preview(
    State(console): State<Shared>,
    headers: HeaderMap,
    UrlPath(id): UrlPath<String>,
    axum::Extension(access): axum::Extension<Access>,
) -> Answer {
    let json = wants_json(&headers);
    let saga_id = saga_id_of(json, id)?;
    // The kernel that would undo it, when there is one: its verdicts are the undo's.
    let kernel = console.compensating.as_ref().unwrap_or(&console.kernel);
    let preview = operator::undo_preview(kernel, &saga_id)
        .await
        .refuse(json)?;
    if !json {
        return Ok(
            Html(pages::undo_preview(&preview, access.csrf()).into_string()).into_response(),
        );
    }
    let steps: Vec<Value> = preview
        .steps
        .iter()
        .map(|step| {
            let reason = pages::undo_refusal(step);
            json!({
                "seq": step.step_seq,
                "tool": step.tool_id,
                "undoable": reason.is_none(),
                "reason": reason,
                "restores": step.restores,
                "window_closes_at": step.window_closes_at_ms.map(agent_kernel_api::format_rfc3339_ms),
            })
        })
        .collect();
    Ok(axum::Json(json!({
        "saga_id": preview.saga_id,
        "state": preview.state,
        "undoable": preview.undoable(false),
        "refused": preview.refused,
        "steps": steps,
    }))
    .into_response())
}
