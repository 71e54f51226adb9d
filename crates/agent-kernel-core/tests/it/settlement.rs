//! Steps whose outcome is unknown are settled by the tool's declared class: compensated
//! blindly, probed, or left to an operator, after a timeout and after a crash.

use agent_kernel_api::{SagaState, StepStatus};
use agent_kernel_core::{NoObserver, RecoveryAction, SagaReport};
use agent_kernel_dispatcher::ToolLimits;
use serde_json::{Value, json};

use crate::{Fixture, add, plan};

fn settled(tool: &str, item: &str, hang: &str) -> agent_kernel_api::PlanStep {
    let mut args = json!({ "item": item });
    args[hang] = Value::Bool(true);
    agent_kernel_api::PlanStep {
        tool: tool.into(),
        args,
        idempotency_key: None,
    }
}

/// Runs `[add first, <tool> item]` where the second step hangs (`hang_before` or
/// `hang_after` its effect) until the 100 ms timeout; returns the report.
async fn after_timeout(fixture: &mut Fixture, tool: &str, hang: &str) -> SagaReport {
    for id in ["blind.add", "probed.add", "opaque.add"] {
        fixture.limits.tools.insert(
            id.into(),
            ToolLimits {
                timeout_ms: Some(100),
                ..ToolLimits::default()
            },
        );
    }
    fixture
        .kernel(1)
        .run(
            &plan(vec![add("first"), settled(tool, "x", hang)]),
            &NoObserver,
        )
        .await
        .expect("runs")
}

/// Starts the same saga as process 1, abandons it while the second step hangs (as a
/// SIGKILL would leave it: BEGIN without outcome), then recovers it as process 2.
async fn after_crash(fixture: &Fixture, tool: &str, hang: &str) -> SagaReport {
    after_crash_of(fixture, tool, "x", hang).await
}

/// [`after_crash`], with the hanging step adding `item`.
async fn after_crash_of(fixture: &Fixture, tool: &str, item: &str, hang: &str) -> SagaReport {
    // Abandoned once its step has begun executing (its BEGIN is durable before that).
    crate::abandon_when(
        &fixture.kernel(1),
        &plan(vec![add("first"), settled(tool, item, hang)]),
        || {
            fixture
                .world
                .started
                .lock()
                .expect("not poisoned")
                .iter()
                .any(|started| started == item)
        },
    )
    .await;
    fixture.kill([1]);
    let report = fixture
        .kernel(2)
        .recover(&NoObserver)
        .await
        .expect("recovers");
    match report.sagas.into_iter().next() {
        Some(RecoveryAction::RolledBack(saga)) => *saga,
        other => panic!("expected a rolled back saga, got {other:?}"),
    }
}

fn check_compensated(report: &SagaReport, fixture: &Fixture, note: &str) {
    assert_eq!(report.state, SagaState::FailedRolledBack, "{report:?}");
    assert_eq!(report.steps[1].status, StepStatus::Compensated);
    let compensation = report.steps[1].compensation.as_deref().unwrap_or_default();
    assert!(
        compensation.contains(note),
        "`{compensation}` lacks `{note}`"
    );
    assert!(
        fixture.world.items().is_empty(),
        "{:?}",
        fixture.world.items()
    );
}

fn check_left_to_operator(report: &SagaReport, fixture: &Fixture) {
    assert_eq!(report.state, SagaState::FailedRollbackPartial, "{report:?}");
    assert_eq!(report.steps[1].status, StepStatus::CompensationFailed);
    let compensation = report.steps[1].compensation.as_deref().unwrap_or_default();
    assert!(
        compensation.contains("an operator must settle"),
        "{compensation}"
    );
    // Never silently assumed undone: the effect is still there; the step before it was undone.
    assert_eq!(fixture.world.items(), ["x"]);
    assert_eq!(report.steps[0].status, StepStatus::Compensated);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_blind_compensation() {
    let mut fixture = Fixture::new();
    let report = after_timeout(&mut fixture, "blind.add", "hang_after").await;
    assert!(
        report
            .failure
            .as_ref()
            .expect("failed")
            .error
            .is_uncertain()
    );
    check_compensated(&report, &fixture, "compensation is safe either way");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_probe_finds_the_effect_and_compensates() {
    let mut fixture = Fixture::new();
    let report = after_timeout(&mut fixture, "probed.add", "hang_after").await;
    check_compensated(&report, &fixture, "probe: the effect happened");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_probe_finds_no_effect_and_leaves_it() {
    let mut fixture = Fixture::new();
    let report = after_timeout(&mut fixture, "probed.add", "hang_before").await;
    check_compensated(&report, &fixture, "probe: the effect did not happen");
    assert!(!fixture.world.journal().contains(&"remove x".to_owned()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_operator_class_stops_for_an_operator() {
    let mut fixture = Fixture::new();
    let report = after_timeout(&mut fixture, "opaque.add", "hang_after").await;
    check_left_to_operator(&report, &fixture);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_blind_compensation() {
    let fixture = Fixture::new();
    let report = after_crash(&fixture, "blind.add", "hang_after").await;
    check_compensated(&report, &fixture, "compensation is safe either way");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_probe_finds_the_effect_and_compensates() {
    let fixture = Fixture::new();
    let report = after_crash(&fixture, "probed.add", "hang_after").await;
    check_compensated(&report, &fixture, "probe: the effect happened");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_probe_finds_no_effect_and_leaves_it() {
    let fixture = Fixture::new();
    let report = after_crash(&fixture, "probed.add", "hang_before").await;
    check_compensated(&report, &fixture, "probe: the effect did not happen");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_operator_class_stops_for_an_operator() {
    let fixture = Fixture::new();
    let report = after_crash(&fixture, "opaque.add", "hang_after").await;
    check_left_to_operator(&report, &fixture);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_that_cannot_tell_stops_for_an_operator() {
    let fixture = Fixture::new();
    let saga = after_crash_of(&fixture, "probed.add", "unknowable", "hang_after").await;
    assert_eq!(saga.state, SagaState::FailedRollbackPartial);
    let compensation = saga.steps[1].compensation.as_deref().unwrap_or_default();
    assert!(compensation.contains("could not tell"), "{compensation}");
    assert_eq!(
        fixture.world.items(),
        ["unknowable"],
        "never assumed undone"
    );
}
