//! Dead letters (reference §10): the failed compensations an operator must see, retry, or
//! settle by hand.

use agent_kernel_api::{Clock as _, DeadLetter};
use agent_kernel_core::{Kernel, KernelError, RetryOutcome, SystemClock};
use serde::Serialize;

use super::operator_name_of;

/// The open letters, oldest first (`dlq list`).
///
/// # Errors
///
/// [`KernelError::Log`].
pub async fn dead_letters(kernel: &Kernel) -> Result<Vec<DeadLetter>, KernelError> {
    kernel.dead_letters(None).await
}

/// A retry of one letter (`dlq retry ID`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryRequest {
    /// The letter.
    pub letter_id: String,
    /// Compensate even where recovery found what the step left changed since (another
    /// writer's work is then overwritten).
    pub force: bool,
    /// Who asks, as recorded; `None`: the process's user.
    pub by: Option<String>,
}

/// Retries one letter's compensation now, recording who asked.
///
/// # Errors
///
/// As [`Kernel::retry_dead_letter_with`].
pub async fn retry_dead_letter(
    kernel: &Kernel,
    request: &RetryRequest,
) -> Result<RetryOutcome, KernelError> {
    kernel
        .retry_dead_letter_with(
            &request.letter_id,
            match &request.by {
                Some(by) => Some(by.clone()),
                None => operator_name_of(kernel).await,
            },
            request.force,
        )
        .await
}

/// A letter [`retry_due`] could not retry, and why; the others were retried all the same.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NotRetried {
    /// The letter.
    pub id: String,
    /// Why (its saga's rollback unfinished, its tool missing, …).
    pub error: String,
}

/// What [`retry_due`] did.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DueRetries {
    /// The letters retried, each with its outcome.
    pub retried: Vec<RetryOutcome>,
    /// The letters that could not be retried.
    pub not_retried: Vec<NotRetried>,
}

impl DueRetries {
    /// Whether every due letter was retried and compensated (true when none was due).
    pub fn all_compensated(&self) -> bool {
        self.not_retried.is_empty() && self.retried.iter().all(RetryOutcome::compensated)
    }
}

/// Retries every open letter whose backoff has passed (`dlq retry --due`); one that cannot
/// be retried does not stop the others.
///
/// # Errors
///
/// [`KernelError::Log`] when the letters cannot be listed.
pub async fn retry_due(kernel: &Kernel) -> Result<DueRetries, KernelError> {
    let now_ms = SystemClock.now_ms();
    let due: Vec<DeadLetter> = kernel
        .dead_letters(None)
        .await?
        .into_iter()
        .filter(|letter| letter.next_retry_at_ms <= now_ms)
        .collect();
    let mut report = DueRetries::default();
    for letter in &due {
        match kernel
            .retry_dead_letter(&letter.letter_id, operator_name_of(kernel).await)
            .await
        {
            Ok(outcome) => report.retried.push(outcome),
            Err(error) => report.not_retried.push(NotRetried {
                id: letter.letter_id.clone(),
                error: error.to_string(),
            }),
        }
    }
    Ok(report)
}

/// Settles a letter by hand (`dlq resolve ID --note TEXT`): the operator undid the effect
/// or decided it may stay. Recorded as `by`, else the kernel's operator uid.
///
/// # Errors
///
/// As [`Kernel::resolve_dead_letter`].
pub async fn resolve_dead_letter(
    kernel: &Kernel,
    letter_id: &str,
    note: &str,
    by: Option<String>,
) -> Result<RetryOutcome, KernelError> {
    let by = match by {
        Some(by) => Some(by),
        None => operator_name_of(kernel).await,
    };
    kernel
        .resolve_dead_letter(letter_id, note.to_owned(), by)
        .await
}
