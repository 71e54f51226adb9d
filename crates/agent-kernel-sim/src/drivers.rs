//! The agents of a case: each saga driven as a plan, as a live saga, or as a call alone,
//! waiting for approvals and resuming once they are decided, as `agent-kernel run` and an
//! MCP client do.

use std::sync::Arc;

use agent_kernel_api::SagaState;
use agent_kernel_core::{
    BeginOptions, CallAnswer, Cancellation, Kernel, KernelError, LiveSaga, NoObserver, SagaReport,
};

use crate::scenario::{Driver, Scenario};

/// Drives saga `n` of `scenario` as its driver says; what came of it, for the history.
pub(crate) async fn drive(kernel: &Arc<Kernel>, scenario: &Scenario, n: usize) -> String {
    let driver = scenario.drivers[n];
    format!(
        "saga {n} ({driver}): {}",
        drive_saga(kernel, scenario, n).await
    )
}

async fn drive_saga(kernel: &Arc<Kernel>, scenario: &Scenario, n: usize) -> String {
    let options = BeginOptions {
        name: Some(format!("saga {n}")),
        ..BeginOptions::default()
    };
    let abort = match scenario.drivers[n] {
        Driver::Plan => {
            let ran = match kernel.run(&scenario.plan(n), &NoObserver).await {
                Ok(report) => resumed_when_decided(kernel, report).await,
                Err(err) => Err(err),
            };
            return match ran {
                Ok(report) => format!("ended {}", report.state),
                Err(err) => err.to_string(),
            };
        }
        Driver::CallAlone => {
            let called = match kernel
                .call_alone(
                    options,
                    scenario.tool(n, 0),
                    scenario.args(n, 0),
                    scenario.idempotency_key(n, 0),
                )
                .await
            {
                Ok((saga, answer)) => answered_when_decided(kernel, &saga, answer)
                    .await
                    .map(|answer| (saga, answer)),
                Err(err) => Err(err),
            };
            return match called {
                Ok((_, CallAnswer::Committed(_))) => "its call committed".to_owned(),
                // Nothing of it ran: the agent gives it up.
                Ok((saga, answer @ (CallAnswer::Refused(_) | CallAnswer::Conflict(_)))) => {
                    let ended = saga.abort("the call was refused").await;
                    format!(
                        "{}, then aborted: {}",
                        answer_name(&answer),
                        ended_as(ended)
                    )
                }
                Ok((_, answer)) => format!("its call {}", answer_name(&answer)),
                Err(err) => err.to_string(),
            };
        }
        Driver::Live { abort } => abort,
    };
    let saga = match kernel.begin(options).await {
        Ok(saga) => saga,
        Err(err) => return format!("not begun: {err}"),
    };
    for m in 0..scenario.sagas[n].len() {
        let key = scenario.idempotency_key(n, m);
        let answer = match saga
            .call(scenario.tool(n, m), scenario.args(n, m), key)
            .await
        {
            Ok(answer) => answered_when_decided(kernel, &saga, answer).await,
            Err(err) => Err(err),
        };
        match answer {
            Ok(CallAnswer::Committed(_)) => {}
            Ok(answer @ (CallAnswer::Refused(_) | CallAnswer::Conflict(_))) => {
                let ended = saga.abort("a call was refused").await;
                return format!(
                    "call {m} {}, then aborted: {}",
                    answer_name(&answer),
                    ended_as(ended)
                );
            }
            Ok(answer) => return format!("call {m} {}", answer_name(&answer)),
            Err(err) => return format!("call {m}: {err}"),
        }
    }
    let ended = if abort {
        saga.abort("the agent changed its mind").await
    } else {
        saga.commit().await
    };
    format!("ended {}", ended_as(ended))
}

/// `report`, or, while it waits for an approval, what resuming it gives once the request is
/// decided (or expired), as `agent-kernel run` does.
async fn resumed_when_decided(
    kernel: &Kernel,
    mut report: SagaReport,
) -> Result<SagaReport, KernelError> {
    while report.state == SagaState::AwaitingApproval {
        let Some(request) = &report.approval else {
            break;
        };
        kernel.wait_for_decision(&request.approval_id).await?;
        report = kernel
            .resume(&report.saga_id, &NoObserver, &Cancellation::new())
            .await?;
    }
    Ok(report)
}

/// `answer`, or, while it is a wait for an approval, what resuming the saga gives once the
/// request is decided (or expired), as an MCP client does at the server's notification.
async fn answered_when_decided(
    kernel: &Kernel,
    saga: &LiveSaga,
    mut answer: CallAnswer,
) -> Result<CallAnswer, KernelError> {
    while let CallAnswer::AwaitingApproval(request) = &answer {
        kernel.wait_for_decision(&request.approval_id).await?;
        answer = saga.resume().await?;
    }
    Ok(answer)
}

/// What a live call came to, in a word.
fn answer_name(answer: &CallAnswer) -> &'static str {
    match answer {
        CallAnswer::Committed(_) => "committed",
        CallAnswer::Refused(_) => "refused",
        CallAnswer::Denied(_) => "denied",
        CallAnswer::Failed(_) => "failed, rolled back",
        CallAnswer::AwaitingApproval(_) => "awaits an approval",
        CallAnswer::Conflict(_) => "met a conflict",
        _ => "answered",
    }
}

fn ended_as(
    ended: Result<agent_kernel_core::SagaReport, agent_kernel_core::KernelError>,
) -> String {
    match ended {
        Ok(report) => report.state.to_string(),
        Err(err) => err.to_string(),
    }
}
