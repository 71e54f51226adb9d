//! The console's pages: server-rendered HTML, every string from the log escaped (an agent
//! controls arguments and outputs), no script.

use agent_kernel::operator::ApprovalView;
use agent_kernel_api::{DeadLetter, SagaListing, SagaRecord, SagaState};

use super::ListFilters;
use maud::{DOCTYPE, Markup, html};

use crate::output::format_ms;

/// The console's style sheet, served at `/assets/console.css`.
pub(crate) const STYLE: &str = include_str!("console.css");

/// A whole page: `title`, the navigation (`None`: signed out; a session's CSRF token adds
/// the sign-out form; a bearer's is empty), and `body`.
fn page_of(title: &str, csrf: Option<&str>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · agent-kernel" }
                link rel="stylesheet" href="/assets/console.css";
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

/// The overview: sagas by state, pending approvals, open dead letters.
pub(crate) fn overview(
    counts: &[(SagaState, u64)],
    approvals_pending: usize,
    dead_letters_open: usize,
    csrf: &str,
) -> Markup {
    page_of(
        "Overview",
        Some(csrf),
        html! {
            section {
                h2 { "Waiting for a person" }
                ul {
                    li { a href="/approvals" { (approvals_pending) " approval requests pending" } }
                    li { (dead_letters_open) " dead letters open" }
                }
            }
            section {
                h2 { "Sagas by state" }
                @if counts.is_empty() {
                    p { "The log holds no saga yet." }
                } @else {
                    table {
                        thead { tr { th { "state" } th.num { "sagas" } } }
                        tbody {
                            @for (state, n) in counts {
                                tr { td { (state.as_str()) } td.num { (n) } }
                            }
                        }
                    }
                }
            }
        },
    )
}

/// The approvals inbox: each pending request with its whole arguments and digest, and the
/// forms that decide it (each carrying the session's CSRF token).
pub(crate) fn approvals(pending: &[ApprovalView], csrf: &str) -> Markup {
    page_of(
        "Approvals",
        Some(csrf),
        html! {
            @if pending.is_empty() {
                p { "No approval is pending." }
            }
            @for view in pending {
                @let request = &view.request;
                article.request id={ "approval-" (request.approval_id) } {
                    h2 { code { (request.tool_id) } " · saga " a href={ "/sagas/" (request.saga_id.as_str()) } { (request.saga_id.as_str()) } " step " (request.step_seq) }
                    dl {
                        dt { "request" } dd { code { (request.approval_id) } }
                        dt { "digest" } dd { code.digest { (request.digest) } }
                        dt { "requested" } dd { (format_ms(request.requested_at_ms)) }
                        dt { "expires" } dd { (format_ms(request.expires_at_ms)) }
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
                thead { tr { th { "step" } th { "tool" } th { "status" } th { "arguments" } th { "output or error" } th { "compensation" } } }
                tbody {
                    @for step in &record.steps {
                        tr {
                            td.num { (step.step_seq) }
                            td { code { (step.tool_id) } }
                            td { (step.status) }
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
        },
    )
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
                label { "Text in arguments " input type="text" name="q" value=(filters.text); }
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

/// What an undo of a saga would do, step by step, last first; the undo itself is the
/// command line's for now.
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
                } @else {
                    p.warning { "An undo would be refused as things stand." }
                }
            }
            p.hint { "Nothing was undone. To undo it: " code { "agent-kernel undo --saga " (preview.saga_id.as_str()) " --reason TEXT" } " (the console's undo comes next)." }
        },
    )
}

/// The open dead letters, each with a form that resolves it (with the session's CSRF
/// token).
pub(crate) fn dead_letters(letters: &[DeadLetter], csrf: &str) -> Markup {
    page_of(
        "Dead letters",
        Some(csrf),
        html! {
            @if letters.is_empty() {
                p { "No dead letter is open: every failed compensation is settled." }
            }
            @for letter in letters {
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
                    p.hint { "Retry it with " code { "agent-kernel dlq retry " (letter.letter_id) } " (not in the console yet), or, once you have settled it yourself, resolve it here:" }
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
