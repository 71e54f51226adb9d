//! The operator's side of approvals (reference §10): `approvals`, `approve`, `reject`, the
//! operator key given to them, and the wait of `run` and `resume` for a decision.

use std::path::Path;

use agent_kernel::{
    Cancellation, Kernel, KernelError, Observer, SagaReport, approval_document, operator,
};
use serde_json::json;

use crate::output::{Output, format_ms, printable, table};
use crate::{Failure, exit};

/// The key given with `--operator-key-file`, read with the core's bound.
pub(crate) fn given_operator_key(given: Option<&Path>) -> Result<Option<Vec<u8>>, Failure> {
    given
        .map(|path| {
            agent_kernel::read_operator_key(path).map_err(|message| {
                Failure::bad_input(anyhow::anyhow!(
                    "--operator-key-file: {message}; nothing was changed"
                ))
            })
        })
        .transpose()
}

/// `approvals`: the requests still open to a decision, oldest first, each with its whole
/// arguments (canonical JSON, hidden characters escaped and named) and digest: never cut.
pub(crate) async fn list_command(kernel: &Kernel, out: &Output) -> Result<u8, Failure> {
    let pending = operator::pending_approvals(kernel).await?;
    if out.is_json() {
        crate::output::print_json(&list_document(&pending));
        return Ok(exit::OK);
    }
    if pending.is_empty() {
        println!("no approval is pending");
        return Ok(exit::OK);
    }
    let mut list = table(&[
        "id",
        "saga",
        "step",
        "tool",
        "arguments",
        "digest",
        "expires",
    ]);
    for view in &pending {
        let request = &view.request;
        list.add_row(vec![
            printable(&request.approval_id),
            printable(request.saga_id.as_str()),
            request.step_seq.to_string(),
            printable(&request.tool_id),
            shown_arguments(&view.args_shown, &view.args_warnings),
            request.digest.clone(),
            format_ms(request.expires_at_ms),
        ]);
    }
    println!("{list}");
    for view in pending.iter().filter(|view| view.holder_gone) {
        println!(
            "⚠ {}: the process that held the live saga {} is gone, so nothing would run the step; it cannot be approved, and `agent-kernel recover` rolls the saga back",
            printable(&view.request.approval_id),
            view.request.saga_id,
        );
    }
    for view in &pending {
        if let Some(earlier) = &view.request.duplicate_of {
            println!(
                "⚠ {} may repeat an effect: saga {} step {} called `{}` with the same `{}` at {}; `agent-kernel approvals --show {}` shows both calls",
                printable(&view.request.approval_id),
                earlier.saga_id,
                earlier.step_seq,
                printable(&earlier.tool_id),
                printable(&earlier.key),
                format_ms(earlier.at_ms),
                printable(&view.request.approval_id),
            );
        }
    }
    println!(
        "each request shows its whole arguments; `agent-kernel approvals --show ID` shows one with the plan's later steps"
    );
    println!(
        "approve with `agent-kernel approve ID [--note TEXT]`, reject with `agent-kernel reject ID --reason TEXT`"
    );
    Ok(exit::OK)
}

/// The document of `approvals --json` (and of the console's inbox in JSON).
pub(crate) fn list_document(pending: &[operator::ApprovalView]) -> serde_json::Value {
    let approvals: Vec<_> = pending
        .iter()
        .map(|view| {
            let mut document = approval_document(&view.request);
            document["holder_gone"] = json!(view.holder_gone);
            document
        })
        .collect();
    json!({ "approvals": approvals })
}

/// The whole canonical arguments for a person, hidden characters escaped, then one line
/// per kind of hidden character ("⚠ contains U+202E …").
fn shown_arguments(shown: &str, warnings: &[String]) -> String {
    let mut text = shown.to_owned();
    for warning in warnings {
        text.push_str("\n⚠ ");
        text.push_str(warning);
    }
    text
}

/// `approvals --show ID`: one request in full, whatever its status.
pub(crate) async fn show_command(
    kernel: &Kernel,
    out: &Output,
    approval_id: &str,
) -> Result<u8, Failure> {
    let view = operator::approval(kernel, approval_id).await?;
    let request = &view.request;
    if out.is_json() {
        let mut document = approval_document(request);
        document["status"] = json!(view.status);
        document["decided_by"] = json!(view.decided_by);
        document["note"] = json!(view.note);
        document["later_steps"] = json!(view.later_steps);
        crate::output::print_json(&document);
        return Ok(exit::OK);
    }
    println!("approval {}", printable(&request.approval_id));
    println!("  status     {}", view.status);
    println!(
        "  saga       {} step {}",
        printable(request.saga_id.as_str()),
        request.step_seq
    );
    println!("  tool       {}", printable(&request.tool_id));
    println!("  digest     {}", request.digest);
    println!("  requested  {}", format_ms(request.requested_at_ms));
    println!("  expires    {}", format_ms(request.expires_at_ms));
    if let Some(by) = &view.decided_by {
        println!("  decided by {}", printable(by));
    }
    if let Some(note) = &view.note {
        println!("  note       {}", printable(note));
    }
    println!("  arguments (canonical JSON, whole):");
    for line in shown_arguments(&view.args_shown, &view.args_warnings).lines() {
        println!("    {line}");
    }
    if let Some(earlier) = &request.duplicate_of {
        let shown = agent_kernel::shown_json(&earlier.args);
        println!(
            "  ⚠ it may repeat an effect: saga {} step {} called `{}` with the same `{}` at {} ({}), with the arguments:",
            earlier.saga_id,
            earlier.step_seq,
            printable(&earlier.tool_id),
            printable(&earlier.key),
            format_ms(earlier.at_ms),
            earlier.status
        );
        for line in shown_arguments(&shown.text, &shown.warnings()).lines() {
            println!("    {line}");
        }
    }
    match &view.later_steps {
        None => println!("  a live saga's step: its agent sends the next steps"),
        Some(later) if later.is_empty() => println!("  the plan has no step after it"),
        Some(later) => {
            println!("  the plan's steps after it, which run once it is approved:");
            for (n, step) in later.iter().enumerate() {
                println!(
                    "    {} {}",
                    request.step_seq as usize + 1 + n,
                    printable(&step.tool)
                );
                for line in shown_arguments(&step.args_shown, &step.args_warnings).lines() {
                    println!("      {line}");
                }
            }
        }
    }
    Ok(exit::OK)
}

/// `approve ID` and `reject ID`: the decision, once; says what was approved, in full.
pub(crate) async fn decide_command(
    kernel: &Kernel,
    out: &Output,
    approval_id: &str,
    approve: bool,
    note: Option<String>,
    operator_key: Option<Vec<u8>>,
) -> Result<u8, Failure> {
    let view = operator::decide(
        kernel,
        operator::Decision {
            approval_id: approval_id.to_owned(),
            approve,
            note,
            operator_key,
            by: None,
        },
    )
    .await?;
    let request = &view.request;
    if out.is_json() {
        let mut document = approval_document(request);
        document["status"] = json!(view.status);
        document["decided_by"] = json!(view.decided_by);
        document["note"] = json!(view.note);
        crate::output::print_json(&document);
    } else {
        println!(
            "approval {}: {} (saga {} step {}, `{}`, digest {})",
            printable(&request.approval_id),
            view.status,
            request.saga_id,
            request.step_seq,
            printable(&request.tool_id),
            request.digest,
        );
        println!(
            "arguments: {}",
            shown_arguments(&view.args_shown, &view.args_warnings)
        );
        if view.later_steps.is_none() {
            println!(
                "a live saga: the process holding it runs the step when its agent resumes it (`saga_resume` over MCP, told by a notification; `resume()` in Python)"
            );
        } else {
            println!(
                "a waiting `agent-kernel run` moves on by itself; one left with `--no-wait` continues with `agent-kernel resume --saga {}`",
                request.saga_id
            );
        }
    }
    Ok(exit::OK)
}

/// Tells the operator how to decide the request a saga waits on (stderr).
pub(crate) fn say_how_to_decide(report: &SagaReport) {
    let Some(request) = &report.approval else {
        return;
    };
    eprintln!(
        "agent-kernel: saga {} waits for approval {} of step {} (`{}`, digest {}), until {}",
        report.saga_id,
        printable(&request.approval_id),
        request.step_seq,
        printable(&request.tool_id),
        request.digest,
        format_ms(request.expires_at_ms)
    );
    eprintln!(
        "agent-kernel: see exactly what it runs with: agent-kernel approvals --show {}",
        request.approval_id
    );
    eprintln!(
        "agent-kernel: approve with: agent-kernel approve {}    (reject with: agent-kernel reject {} --reason TEXT)",
        request.approval_id, request.approval_id
    );
}

/// While `report` waits for an approval: without `no_wait`, waits for each decision and
/// resumes (a plan may wait more than once); a signal rolls the waiting saga back.
pub(crate) async fn settle_waits(
    kernel: &Kernel,
    mut report: SagaReport,
    no_wait: bool,
    observer: &dyn Observer,
    cancel: &Cancellation,
) -> Result<SagaReport, KernelError> {
    while let Some(request) = report.approval.clone() {
        say_how_to_decide(&report);
        if no_wait {
            // Left to whoever resumes it; `recover` leaves it waiting meanwhile.
            kernel.detach(&report.saga_id).await?;
            return Ok(report);
        }
        let decided = tokio::select! {
            decided = kernel.wait_for_decision(&request.approval_id) => Some(decided?),
            () = cancel.cancelled() => None,
        };
        report = match decided {
            Some(_) => kernel.resume(&report.saga_id, observer, cancel).await?,
            None => {
                let reason = cancel.reason().unwrap_or_else(|| "stopped".to_owned());
                eprintln!(
                    "agent-kernel: {reason} while waiting for approval {}; rolling the saga back",
                    request.approval_id
                );
                kernel
                    .stop_waiting(&report.saga_id, &reason, observer)
                    .await?
            }
        };
    }
    Ok(report)
}

/// The exit code of a saga's report after `run` or `resume`.
pub(crate) fn exit_code(report: &SagaReport) -> u8 {
    use agent_kernel_api::SagaState;
    match report.state {
        SagaState::Done | SagaState::Undone => exit::OK,
        SagaState::AwaitingApproval => exit::AWAITING_APPROVAL,
        SagaState::FailedRolledBack if report.is_denied() => exit::DENIED,
        SagaState::FailedRolledBack if report.is_conflict() => exit::CONFLICT,
        SagaState::FailedRolledBack => exit::ROLLED_BACK,
        _ => exit::ATTENTION,
    }
}
