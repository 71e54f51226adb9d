//! The console's pages: server-rendered HTML, every string from the log escaped (an agent
//! controls arguments and outputs); one script of the console's own adds live updates.

use agent_kernel::RetryOutcome;
use agent_kernel::operator::ApprovalView;
use agent_kernel_api::{DeadLetter, SagaListing, SagaRecord, SagaState, SagaSummary, StepRecord};
use agent_kernel_txlog::{AuditRecord, AuditReport};

use super::actions::AuditCheck;
use super::views::ListFilters;
use maud::{DOCTYPE, Markup, html};

use crate::output::format_ms;

/// The console's style sheet, served at `/assets/console.css`.
pub(crate) const STYLE: &str = include_str!("console.css");

/// The console's one script, served at `/assets/console.js`: live updates (`GET /events`)
/// for a signed-in page; every page works without it.
pub(crate) const SCRIPT: &str = include_str!("console.js");

/// A whole page: `title`, the navigation (`None`: signed out; a session's CSRF token adds
/// the sign-out form; a bearer's is empty), and `body`.
fn page_of(title: &str, csrf: Option<&str>, body: Markup) -> Markup {
    page_with(title, csrf, true, body)
}

/// What a POST answered (a retry's outcome, the audit check): a page without live
/// updates, since fetching its address again would not show it.
fn result_page(title: &str, csrf: &str, body: Markup) -> Markup {
    page_with(title, Some(csrf), false, body)
}

/// [`page_of`], the live-updates script loaded when `live` and signed in by a session.
fn page_with(title: &str, csrf: Option<&str>, live: bool, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · agent-kernel" }
                link rel="stylesheet" href="/assets/console.css";
                @if live && csrf.is_some_and(|csrf| !csrf.is_empty()) {
                    script src="/assets/console.js" defer {}
                }
            }
            body {
                header {
                    strong { "agent-kernel" }
                    @if let Some(csrf) = csrf {
                        nav {
                            a href="/" { "Overview" }
                            a href="/sagas" { "Sagas" }
                            a href="/approvals" { "Approvals" }
                            a href="/dead-letters" { "Dead letters" }
                        }
                        span id="live" {}
                        @if !csrf.is_empty() {
                            form.signout method="post" action="/logout" {
                                input type="hidden" name="csrf" value=(csrf);
                                button type="submit" { "Sign out" }
                            }
                        }
                    }
                }
                main {
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
}

/// The login form, with `error` when a token was refused.
pub(crate) fn login(error: Option<&str>) -> Markup {
    page_of(
        "Sign in",
        None,
        html! {
            @if let Some(error) = error {
                p.error { (error) }
            }
            form method="post" action="/login" {
                label for="token" { "Console token" }
                input #token type="password" name="token" autocomplete="off" required;
                button type="submit" { "Sign in" }
            }
            p.hint { "The token is in the file `agent-kernel serve` named when it started." }
        },
    )
}

/// What the overview shows.
pub(crate) struct Overview<'a> {
    pub(crate) counts: &'a [(SagaState, u64)],
    pub(crate) pending: &'a [ApprovalView],
    pub(crate) dead_letters_open: usize,
    /// Unsettled sagas of processes no longer running, which `recover` would settle.
    pub(crate) orphans: &'a [SagaSummary],
    pub(crate) last_check: Option<&'a AuditCheck>,
    pub(crate) now_ms: i64,
    pub(crate) csrf: &'a str,
}

/// A duration in words: `45 s`, `12 min`, `3 h`, `2 d`.
fn span(ms: i64) -> String {
    let secs = ms.max(0) / 1000;
    match secs {
        0..60 => format!("{secs} s"),
        60..3600 => format!("{} min", secs / 60),
        3600..86_400 => format!("{} h", secs / 3600),
        _ => format!("{} d", secs / 86_400),
    }
}

/// The overview: what waits for a person (approvals with their age and expiry, dead
/// letters, sagas of dead processes), sagas by state, and the audit chain's last check.
pub(crate) fn overview(view: &Overview<'_>) -> Markup {
    page_of(
        "Overview",
        Some(view.csrf),
        html! {
            section {
                h2 { "Waiting for a person" }
                p { a href="/approvals" { (view.pending.len()) " approval requests pending" } }
                @if !view.pending.is_empty() {
                    table.pending {
                        thead { tr { th { "tool" } th { "saga" } th { "asked" } th { "expires in" } } }
                        tbody {
                            @for approval in view.pending {
                                @let request = &approval.request;
                                tr {
                                    td { a href={ "/approvals#approval-" (request.approval_id) } { code { (request.tool_id) } } }
                                    td { a href={ "/sagas/" (request.saga_id.as_str()) } { code { (request.saga_id.as_str()) } } }
                                    td { (span(view.now_ms - request.requested_at_ms)) " ago" }
                                    td { (span(request.expires_at_ms - view.now_ms)) }
                                }
                            }
                        }
                    }
                }
                p { a href="/dead-letters" { (view.dead_letters_open) " dead letters open" } }
                @if !view.orphans.is_empty() {
                    p.warning {
                        (view.orphans.len()) " unsettled sagas of processes that are no longer running; what they touched stays locked until "
                        code { "agent-kernel recover" } " settles them:"
                    }
                    ul.orphans {
                        @for saga in view.orphans {
                            li {
                                a href={ "/sagas/" (saga.saga_id.as_str()) } { code { (saga.saga_id.as_str()) } }
                                " " (saga.state.as_str()) " (process " (saga.owner.pid) ")"
                            }
                        }
                    }
                }
            }
            section {
                h2 { "Sagas by state" }
                @if view.counts.is_empty() {
                    p { "The log holds no saga yet." }
                } @else {
                    table.counts {
                        thead { tr { th { "state" } th.num { "sagas" } } }
                        tbody {
                            @for (state, n) in view.counts {
                                tr {
                                    td { a href={ "/sagas?state=" (state.as_str()) } { (state.as_str()) } }
                                    td.num { (n) }
                                }
                            }
                        }
                    }
                }
            }
            section {
                h2 { "Audit chain" }
                @match view.last_check {
                    None => p { "Not checked by this console yet." },
                    Some(check) => {
                        @match &check.first_bad {
                            None => p.ok id="audit-last" {
                                "Intact"
                                @if let Some(n) = check.n_records { ": " (n) " records" }
                                ", checked " (span(view.now_ms - check.at_ms)) " ago."
                            },
                            Some((seq, reason)) => p.error id="audit-last" {
                                "Record " (seq) " is bad: " (reason) " (checked " (span(view.now_ms - check.at_ms)) " ago)."
                            },
                        }
                    }
                }
                form method="post" action="/audit/verify" {
                    input type="hidden" name="csrf" value=(view.csrf);
                    button type="submit" { "Verify the chain now" }
                }
            }
        },
    )
}

/// What `POST /audit/verify` found.
pub(crate) fn audit(report: &AuditReport, csrf: &str) -> Markup {
    result_page(
        "Audit chain",
        csrf,
        html! {
            @match &report.first_bad {
                None => p.ok id="audit-verdict" {
                    "Intact: " (report.n_records) " records verified"
                    @if let Some(head) = &report.head { ", the head at record " (head.seq) }
                    @if report.macs_verified { ", their MACs checked" }
                    "."
                },
                Some(bad) if bad.seq == 0 => p.error id="audit-verdict" { "The log is bad: " (bad.reason) },
                Some(bad) => p.error id="audit-verdict" { "Record " (bad.seq) " is bad: " (bad.reason) ". Nothing is undone or retried from this log until it is settled." },
            }
            @if !report.macs_verified && report.n_records_with_mac > 0 {
                p.warning { "The records carry MACs, but this console was started without the audit key, so they were not checked (--audit-key-file)." }
            }
            p { a href="/" { "Back to the overview" } }
        },
    )
}

/// The approvals inbox: each pending request with its whole arguments and digest, and the
/// forms that decide it (each carrying the session's CSRF token).
pub(crate) fn approvals(
    pending: &[ApprovalView],
    earlier: &[Vec<StepRecord>],
    csrf: &str,
) -> Markup {
    page_of(
        "Approvals",
        Some(csrf),
        html! {
            @if pending.is_empty() {
                p { "No approval is pending." }
            }
            @for (view, earlier) in pending.iter().zip(earlier) {
                @let request = &view.request;
                article.request id={ "approval-" (request.approval_id) } {
                    h2 { code { (request.tool_id) } " · saga " a href={ "/sagas/" (request.saga_id.as_str()) } { (request.saga_id.as_str()) } " step " (request.step_seq) }
                    dl {
                        dt { "request" } dd { code { (request.approval_id) } }
                        dt { "digest" } dd { code.digest { (request.digest) } }
                        dt { "requested" } dd { (format_ms(request.requested_at_ms)) }
                        dt { "expires" } dd { (format_ms(request.expires_at_ms)) }
                    }
                    @if view.holder_gone {
                        p.warning {
                            "⚠ The process that held this live saga is gone, so nothing would run the step: it cannot be approved, and "
                            code { "agent-kernel recover" } " rolls the saga back."
                        }
                    }
                    p { "Arguments (canonical JSON, whole):" }
                    pre.args { (view.args_shown) }
                    @for warning in &view.args_warnings {
                        p.warning { "⚠ " (warning) }
                    }
                    @if let Some(earlier) = &request.duplicate_of {
                        p.warning {
                            "⚠ It may repeat an effect: saga " (earlier.saga_id.as_str()) " step " (earlier.step_seq)
                            " called " code { (earlier.tool_id) } " with the same " code { (earlier.key) }
                            " at " (format_ms(earlier.at_ms)) " (" (earlier.status) "), with the arguments:"
                        }
                        pre.args { (agent_kernel::shown_json(&earlier.args).text) }
                    }
                    @if !earlier.is_empty() {
                        p { "The saga's steps before it:" }
                        table.earlier {
                            thead { tr { th { "step" } th { "tool" } th { "status" } th { "arguments" } } }
                            tbody {
                                @for step in earlier {
                                    tr {
                                        td.num { (step.step_seq) }
                                        td { code { (step.tool_id) } }
                                        td { (step.status) }
                                        td { pre.args { (agent_kernel::shown_json(&step.args).text) } }
                                    }
                                }
                            }
                        }
                    }
                    @if let Some(later) = &view.later_steps {
                        @if !later.is_empty() {
                            p { "The plan's steps after it, which run once it is approved:" }
                            ol start=(request.step_seq + 2) {
                                @for step in later {
                                    li { code { (step.tool) } pre.args { (step.args_shown) } }
                                }
                            }
                        }
                    }
                    div.decide {
                        form method="post" action={ "/approvals/" (request.approval_id) "/approve" } {
                            input type="hidden" name="csrf" value=(csrf);
                            label { "Note " input type="text" name="note"; }
                            button type="submit" name="decision" value="approve" { "Approve" }
                        }
                        form method="post" action={ "/approvals/" (request.approval_id) "/reject" } {
                            input type="hidden" name="csrf" value=(csrf);
                            label { "Reason " input type="text" name="reason" required; }
                            button type="submit" name="decision" value="reject" { "Reject" }
                        }
                    }
                }
            }
        },
    )
}

/// A saga's timeline: its steps with arguments, outputs, errors and compensations, the
/// locks it holds, and its newest approval request with its decision.
pub(crate) fn saga(record: &SagaRecord, approval: Option<&ApprovalView>, csrf: &str) -> Markup {
    let saga = &record.saga;
    page_of(
        &format!("Saga {}", saga.saga_id),
        Some(csrf),
        html! {
            @if saga.state == SagaState::Done {
                p { a href={ "/sagas/" (saga.saga_id.as_str()) "/undo" } { "What would an undo do?" } }
            }
            dl {
                dt { "state" } dd.state { (saga.state.as_str()) }
                @if let Some(name) = &saga.name { dt { "name" } dd { (name) } }
                @if let Some(actor) = &saga.actor { dt { "actor" } dd { (actor) } }
                dt { "created" } dd { (format_ms(saga.created_at_ms)) }
                dt { "updated" } dd { (format_ms(saga.updated_at_ms)) }
                @if !record.locks.is_empty() {
                    dt { "locks held" }
                    dd { @for resource in &record.locks { code { (resource) } " " } }
                }
            }
            table.timeline {
                thead { tr { th { "step" } th { "tool" } th { "status" } th { "began" } th.num { "took" } th { "arguments" } th { "output or error" } th { "compensation" } } }
                tbody {
                    @for step in &record.steps {
                        tr {
                            td.num { (step.step_seq) }
                            td { code { (step.tool_id) } }
                            td { (step.status) }
                            td { (format_ms(step.created_at_ms)) }
                            td.num { (millis(step.updated_at_ms - step.created_at_ms)) }
                            td { pre.args { (agent_kernel::shown_json(&step.args).text) } }
                            td {
                                @if let Some(output) = &step.output {
                                    pre.args { (agent_kernel::shown_json(&output.data).text) }
                                }
                                @if let Some(error) = &step.error {
                                    p.error { (error.to_string()) }
                                }
                            }
                            td { @if let Some(compensation) = &step.compensation { (compensation) } }
                        }
                    }
                }
            }
            @if let Some(view) = approval {
                @let request = &view.request;
                section.approval {
                    h2 { "Approval of step " (request.step_seq) ": " (view.status) }
                    dl {
                        dt { "tool" } dd { code { (request.tool_id) } }
                        dt { "digest" } dd { code.digest { (request.digest) } }
                        dt { "requested" } dd { (format_ms(request.requested_at_ms)) }
                        dt { "expires" } dd { (format_ms(request.expires_at_ms)) }
                        @if let Some(by) = &view.decided_by { dt { "decided by" } dd { (by) } }
                        @if let Some(note) = &view.note { dt { "note" } dd { (note) } }
                    }
                    pre.args { (view.args_shown) }
                }
            }
            p { a href={ "/sagas/" (saga.saga_id.as_str()) "/audit" } { "Its audit records" } }
        },
    )
}

/// A saga's audit records, oldest first, or why they cannot be shown.
pub(crate) fn saga_audit(
    saga_id: &agent_kernel_api::SagaId,
    audit: &Result<Vec<AuditRecord>, String>,
    csrf: &str,
) -> Markup {
    page_of(
        &format!("Audit records of saga {saga_id}"),
        Some(csrf),
        html! {
            p { a href={ "/sagas/" (saga_id.as_str()) } { "Back to its timeline" } }
            @match audit {
                Err(why) => p.hint { (why) },
                Ok(records) if records.is_empty() => p { "None." },
                Ok(records) => {
                    table.audit {
                        thead { tr { th.num { "record" } th { "at" } th { "kind" } th { "what it says" } } }
                        tbody {
                            @for audit_record in records {
                                tr id={ "audit-" (audit_record.seq) } {
                                    td.num { (audit_record.seq) }
                                    td { (format_ms(audit_record.at_ms)) }
                                    td { code { (audit_record.kind) } }
                                    td { pre.args { (agent_kernel::shown_json(&audit_record.body).text) } }
                                }
                            }
                        }
                    }
                    p.hint { "Whether the chain still verifies: the overview's “Verify the chain now”, or " code { "agent-kernel audit verify" } "." }
                }
            }
        },
    )
}

/// A step's duration, from its intent to its last record: `850 ms`, `12.4 s`.
fn millis(ms: i64) -> String {
    if ms < 10_000 {
        format!("{} ms", ms.max(0))
    } else {
        format!("{:.1} s", ms as f64 / 1000.0)
    }
}

/// The states a saga can be in, for the list's filter.
const STATES: [&str; 10] = [
    "Idle",
    "Planning",
    "Acting",
    "Validating",
    "AwaitingApproval",
    "Compensating",
    "Done",
    "FailedRolledBack",
    "FailedRollbackPartial",
    "Undone",
];

/// A page of the saga list: its filters (a form that GETs the list again), the sagas,
/// and a link to the next page.
pub(crate) fn sagas(
    page: &[SagaListing],
    filters: &ListFilters,
    next: Option<&str>,
    csrf: &str,
) -> Markup {
    page_of(
        "Sagas",
        Some(csrf),
        html! {
            form.filters method="get" action="/sagas" {
                label { "State "
                    select name="state" {
                        option value="" { "any" }
                        @for state in STATES {
                            option value=(state) selected[filters.state == state] { (state) }
                        }
                    }
                }
                label { "Tool " input type="text" name="tool" value=(filters.tool); }
                label { "Actor " input type="text" name="actor" value=(filters.actor); }
                label { "Name " input type="text" name="name" value=(filters.name); }
                label { "Text in arguments " input type="text" name="q" value=(filters.text); }
                label { "Created from (UTC) " input type="text" name="from" value=(filters.from) placeholder="2026-12-01T09:00"; }
                label { "until " input type="text" name="until" value=(filters.until) placeholder="2026-12-02"; }
                button type="submit" { "Filter" }
            }
            @if page.is_empty() {
                p { "No saga matches." }
            } @else {
                table.sagas {
                    thead { tr { th { "saga" } th { "state" } th { "name" } th { "actor" } th { "created" } th.num { "steps" } } }
                    tbody {
                        @for listing in page {
                            @let saga = &listing.saga;
                            tr {
                                td { a href={ "/sagas/" (saga.saga_id.as_str()) } { code { (saga.saga_id.as_str()) } } }
                                td { (saga.state.as_str()) }
                                td { @if let Some(name) = &saga.name { (name) } }
                                td { @if let Some(actor) = &saga.actor { (actor) } }
                                td { (format_ms(saga.created_at_ms)) }
                                td.num { (listing.n_begun) }
                            }
                        }
                    }
                }
            }
            @if let Some(next) = next {
                p { a.next href={ "/sagas?" (filters.query_string(Some(next))) } { "Older sagas →" } }
            }
        },
    )
}

/// Why an undo would refuse `step`, or `None` when it can be undone.
pub(crate) fn undo_refusal(step: &agent_kernel::UndoStepPreview) -> Option<String> {
    if step.verdict == agent_kernel::UndoVerdict::Undoable {
        return None;
    }
    Some(match step.refusal() {
        reason if reason.is_empty() => "its tool is missing here".to_owned(),
        reason => reason,
    })
}

/// What an undo of a saga would do, step by step, last first, and the form that confirms
/// it with a reason.
pub(crate) fn undo_preview(preview: &agent_kernel::UndoPreview, csrf: &str) -> Markup {
    page_of(
        &format!("Undo saga {}?", preview.saga_id),
        Some(csrf),
        html! {
            p { "Saga " a href={ "/sagas/" (preview.saga_id.as_str()) } { code { (preview.saga_id.as_str()) } } " is " (preview.state.as_str()) "." }
            @if preview.nothing_to_undo {
                p { "Nothing to undo." }
            } @else if let Some(refused) = &preview.refused {
                p.error { "An undo would be refused: " (refused) }
            } @else {
                table.undo {
                    thead { tr { th { "step" } th { "tool" } th { "window closes" } th { "undo" } th { "it would" } } }
                    tbody {
                        @for step in &preview.steps {
                            tr {
                                td.num { (step.step_seq) }
                                td { code { (step.tool_id) } }
                                td { @if let Some(at_ms) = step.window_closes_at_ms { (format_ms(at_ms)) } }
                                td {
                                    @match undo_refusal(step) {
                                        None => "can be undone",
                                        Some(reason) => span.warning { (reason) },
                                    }
                                }
                                td { @if let Some(restores) = &step.restores { (restores) } }
                            }
                        }
                    }
                }
                @if preview.undoable(false) {
                    p { "Every step can be undone." }
                } @else if preview.undoable(true) {
                    p.warning { "What some steps left has changed since: undoing them overwrites that later work, and is done only when you tick “force”." }
                } @else {
                    p.warning { "An undo would be refused as things stand." }
                }
                @if preview.undoable(true) {
                    form.confirm method="post" action={ "/sagas/" (preview.saga_id.as_str()) "/undo" } {
                        input type="hidden" name="csrf" value=(csrf);
                        label { "Reason " input type="text" name="reason" required; }
                        @if !preview.undoable(false) {
                            label { input type="checkbox" name="force" value="true"; " force: overwrite what changed since" }
                        }
                        button type="submit" { "Undo saga " (preview.saga_id.as_str()) }
                    }
                }
            }
            p.hint { "Nothing is undone until you confirm." }
        },
    )
}

/// The open dead letters, each with the forms that retry and resolve it (with the
/// session's CSRF token).
pub(crate) fn dead_letters(
    letters: &[DeadLetter],
    restores: &[Option<String>],
    csrf: &str,
) -> Markup {
    page_of(
        "Dead letters",
        Some(csrf),
        html! {
            @if letters.is_empty() {
                p { "No dead letter is open: every failed compensation is settled." }
            }
            @for (letter, restores) in letters.iter().zip(restores) {
                article.request id={ "letter-" (letter.letter_id) } {
                    h2 { code { (letter.tool_id) } " · saga " a href={ "/sagas/" (letter.saga_id.as_str()) } { (letter.saga_id.as_str()) } " step " (letter.step_seq) }
                    dl {
                        dt { "letter" } dd { code { (letter.letter_id) } }
                        dt { "attempts" } dd { (letter.attempts) }
                        dt { "first failed" } dd { (format_ms(letter.first_failed_at_ms)) }
                        dt { "last failed" } dd { (format_ms(letter.last_failed_at_ms)) }
                        dt { "next retry" } dd { (format_ms(letter.next_retry_at_ms)) }
                    }
                    p.error { (letter.error) }
                    @if let Some(restores) = restores {
                        p { "Its compensation would: " (restores) }
                    }
                    form.retry method="post" action={ "/dead-letters/" (letter.letter_id) "/retry" } {
                        input type="hidden" name="csrf" value=(csrf);
                        @if letter.error.starts_with("changed since") {
                            label { input type="checkbox" name="force" value="true"; " force: compensate although what the step left has changed since" }
                        }
                        button type="submit" { "Retry the compensation" }
                    }
                    p.hint { "Or, once you have settled it yourself, resolve it:" }
                    form method="post" action={ "/dead-letters/" (letter.letter_id) "/resolve" } {
                        input type="hidden" name="csrf" value=(csrf);
                        label { "How it was settled " input type="text" name="note" required; }
                        button type="submit" { "Resolve" }
                    }
                }
            }
        },
    )
}

/// A page that says what went wrong (with the navigation, but no sign-out form).
pub(crate) fn problem(title: &str, message: &str) -> Markup {
    page_of(title, Some(""), html! { p.error { (message) } })
}

/// What a retry of a dead letter did.
pub(crate) fn retried(outcome: &RetryOutcome, csrf: &str) -> Markup {
    let letter = &outcome.letter;
    result_page(
        &format!("Dead letter {}", letter.letter_id),
        csrf,
        html! {
            @if outcome.compensated() {
                p.ok id="retry-outcome" { "Compensated: " (outcome.detail) }
            } @else {
                p.error id="retry-outcome" { "It failed again (attempt " (letter.attempts) "): " (outcome.detail) }
            }
            p { "Saga " a href={ "/sagas/" (letter.saga_id.as_str()) } { code { (letter.saga_id.as_str()) } } " is " (outcome.saga_state.as_str()) "." }
            p { a href="/dead-letters" { "Back to the dead letters" } }
        },
    )
}
