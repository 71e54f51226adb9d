//! The operator of a case, a process of its own beside the sagas': it undoes sagas that
//! ended `Done`, retries dead letters, and decides approval requests, as `agent-kernel
//! undo`, `dlq retry`, `approve` and `reject` do.

use agent_kernel_api::{SagaId, SagaState};
use agent_kernel_core::{Kernel, NoObserver, OperatorDecision, UndoRequest};

use crate::process::Process;
use crate::scenario::Rng;

/// How many times the operator looks for something to act on, a few yields apart, before
/// it gives an action up.
const OPERATOR_LOOKS_MAX: u32 = 24;

/// The operator's `actions`: each waits until a saga has ended `Done` or a dead letter is
/// open, then undoes that saga or retries that letter (without `--force`), as `agent-kernel
/// undo` and `dlq retry` do, through a kernel of its own process.
pub(crate) async fn operate(kernel: &Kernel, process: &Process, actions: u32, choices: &mut Rng) {
    for _ in 0..actions {
        for _ in 0..OPERATOR_LOOKS_MAX {
            for _ in 0..=choices.below(8) {
                tokio::task::yield_now().await;
            }
            let (Ok(sagas), Ok(letters)) = (
                kernel.log().sagas(u32::MAX).await,
                kernel.dead_letters(None).await,
            ) else {
                continue;
            };
            let done: Vec<SagaId> = sagas
                .into_iter()
                .filter(|saga| saga.state == SagaState::Done)
                .map(|saga| saga.saga_id)
                .collect();
            let candidates = done.len() + letters.len();
            if candidates == 0 {
                continue;
            }
            let pick = usize::try_from(choices.below(candidates as u64)).unwrap_or(0);
            if let Some(saga_id) = done.get(pick) {
                let request = UndoRequest {
                    reason: "the simulated operator undoes it".to_owned(),
                    force: false,
                    by: Some("sim".to_owned()),
                };
                process.note(format!("undo {saga_id}"));
                let line = match kernel.undo(saga_id, &request, &NoObserver).await {
                    Ok(report) => format!("undo {saga_id}: {}", report.state),
                    Err(err) => format!("undo {saga_id}: {err}"),
                };
                process.note(line);
                // Its preview checked every step; a refused undo acts on none of them.
                process.forget_checks();
            } else {
                let letter = &letters[pick - done.len()];
                let id = &letter.letter_id;
                process.note(format!("dlq retry {id} of {}", letter.saga_id));
                let line = match kernel.retry_dead_letter(id, Some("sim".to_owned())).await {
                    Ok(outcome) => format!("dlq retry {id}: saga {}", outcome.saga_state),
                    Err(err) => format!("dlq retry {id}: {err}"),
                };
                process.note(line);
            }
            break;
        }
    }
}

/// The stream of the operator's decisions on approval requests ([`Rng::fork`]).
pub(crate) const DECISIONS_STREAM: u64 = 0x6465_6369_6465_5F6F;

/// How many times the operator looks for requests to decide.
const DECISION_LOOKS_MAX: u32 = 12;

/// The longest pause between two of those looks, on the runtime's paused clock.
const DECISION_PAUSE_MAX_MS: u64 = 300;

/// The operator's decisions: every request it finds pending, approved (70%) or rejected,
/// as `agent-kernel approve` and `reject` do, through a kernel of its own process, until
/// `sagas` (the process that runs them) has ended and nothing is pending.
pub(crate) async fn decide(kernel: &Kernel, process: &Process, sagas: &Process, choices: &mut Rng) {
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..DECISION_LOOKS_MAX {
        tokio::time::sleep(std::time::Duration::from_millis(
            choices.below(DECISION_PAUSE_MAX_MS),
        ))
        .await;
        let Ok(pending) = kernel.pending_approvals().await else {
            continue;
        };
        if pending.is_empty() && sagas.is_dead() {
            break;
        }
        for record in pending {
            let request = record.request;
            if !seen.insert(request.approval_id.clone()) {
                continue;
            }
            let approve = choices.chance(70);
            let verb = if approve { "approve" } else { "reject" };
            process.note(format!(
                "{verb} {} for {}/{}",
                request.approval_id, request.saga_id, request.step_seq
            ));
            let decision = OperatorDecision {
                approve,
                operator_key: None,
                user: Some("sim".to_owned()),
                note: None,
            };
            let line = match kernel.decide_approval(&request.approval_id, decision).await {
                Ok(record) => format!("{verb} {}: {:?}", request.approval_id, record.status),
                Err(err) => format!("{verb} {}: {err}", request.approval_id),
            };
            process.note(line);
        }
    }
}
