//! `dlq list`, `dlq retry`, `dlq resolve` (reference §10): the failed compensations an
//! operator must see, retry, or settle by hand.

use agent_kernel::{Kernel, RetryOutcome, operator};
use agent_kernel_api::DeadLetter;
use serde_json::{Value, json};

use crate::output::{Output, format_ms, print_json, printable, table};
use crate::{Failure, exit};

/// A letter as the documents show it: `{id, saga_id, step, tool, error, attempts, …}`.
fn letter_document(letter: &DeadLetter) -> Value {
    json!({
        "id": letter.letter_id,
        "saga_id": letter.saga_id,
        "step": letter.step_seq,
        "tool": letter.tool_id,
        "error": letter.error,
        "attempts": letter.attempts,
        "status": letter.status,
        "first_failed_at": agent_kernel_api::format_rfc3339_ms(letter.first_failed_at_ms),
        "last_failed_at": agent_kernel_api::format_rfc3339_ms(letter.last_failed_at_ms),
        "next_retry_at": agent_kernel_api::format_rfc3339_ms(letter.next_retry_at_ms),
        "settled_by": letter.settled_by,
        "note": letter.note,
    })
}

/// The document of `dlq list --json` (and of the console's dead letters in JSON).
pub(crate) fn list_document(letters: &[DeadLetter]) -> Value {
    let letters: Vec<Value> = letters.iter().map(letter_document).collect();
    json!({ "dead_letters": letters })
}

/// `dlq list`: the open letters, oldest first.
pub(crate) async fn list_command(kernel: &Kernel, out: &Output) -> Result<u8, Failure> {
    let letters = operator::dead_letters(kernel).await?;
    if out.is_json() {
        print_json(&list_document(&letters));
        return Ok(exit::OK);
    }
    if letters.is_empty() {
        println!("no dead letters: every failed compensation is settled");
        return Ok(exit::OK);
    }
    let mut list = table(&[
        "id",
        "saga",
        "step",
        "tool",
        "attempts",
        "next retry",
        "error",
    ]);
    for letter in &letters {
        list.add_row(vec![
            printable(&letter.letter_id),
            printable(letter.saga_id.as_str()),
            letter.step_seq.to_string(),
            printable(&letter.tool_id),
            letter.attempts.to_string(),
            format_ms(letter.next_retry_at_ms),
            printable(&letter.error),
        ]);
    }
    println!("{list}");
    println!(
        "retry with `agent-kernel dlq retry ID` (or `--due`), or settle by hand with `agent-kernel dlq resolve ID --note TEXT`"
    );
    Ok(exit::OK)
}

fn print_outcome(out: &Output, outcome: &RetryOutcome) {
    if out.is_json() {
        let mut document = letter_document(&outcome.letter);
        document["saga_state"] = json!(outcome.saga_state);
        document["detail"] = json!(outcome.detail);
        print_json(&document);
        return;
    }
    let letter = &outcome.letter;
    println!(
        "dead letter {}: {} after {} attempt{} (saga {} step {}, `{}`: {}); saga {} is {}",
        printable(&letter.letter_id),
        letter.status,
        letter.attempts,
        if letter.attempts == 1 { "" } else { "s" },
        letter.saga_id,
        letter.step_seq,
        printable(&letter.tool_id),
        printable(&outcome.detail),
        letter.saga_id,
        outcome.saga_state
    );
}

/// `dlq retry ID [--force]`: exit 0 when compensated, 3 when it failed again.
pub(crate) async fn retry_command(
    kernel: &Kernel,
    out: &Output,
    letter_id: &str,
    force: bool,
) -> Result<u8, Failure> {
    let outcome = operator::retry_dead_letter(
        kernel,
        &operator::RetryRequest {
            letter_id: letter_id.to_owned(),
            force,
            by: None,
        },
    )
    .await?;
    print_outcome(out, &outcome);
    Ok(if outcome.compensated() {
        exit::OK
    } else {
        exit::ATTENTION
    })
}

/// `dlq retry --due`: every open letter whose backoff has passed; exit 0 when all of them
/// were compensated (or none was due), 3 when one failed again.
pub(crate) async fn retry_due_command(kernel: &Kernel, out: &Output) -> Result<u8, Failure> {
    let due = operator::retry_due(kernel).await?;
    for refused in &due.not_retried {
        eprintln!(
            "agent-kernel: dead letter {} not retried: {}",
            printable(&refused.id),
            refused.error
        );
    }
    let all_compensated = due.all_compensated();
    let outcomes = due.retried;
    if out.is_json() {
        let retried: Vec<Value> = outcomes
            .iter()
            .map(|outcome| {
                let mut document = letter_document(&outcome.letter);
                document["saga_state"] = json!(outcome.saga_state);
                document["detail"] = json!(outcome.detail);
                document
            })
            .collect();
        print_json(&json!({ "retried": retried, "not_retried": due.not_retried }));
    } else if outcomes.is_empty() {
        println!("no dead letter is due for a retry");
    } else {
        for outcome in &outcomes {
            print_outcome(out, outcome);
        }
    }
    Ok(if all_compensated {
        exit::OK
    } else {
        exit::ATTENTION
    })
}

/// `dlq resolve ID --note TEXT`.
pub(crate) async fn resolve_command(
    kernel: &Kernel,
    out: &Output,
    letter_id: &str,
    note: &str,
) -> Result<u8, Failure> {
    let outcome = operator::resolve_dead_letter(kernel, letter_id, note, None).await?;
    print_outcome(out, &outcome);
    Ok(exit::OK)
}
