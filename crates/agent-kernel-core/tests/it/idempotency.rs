//! Exactly-once by idempotency key (reference §6.4).

use agent_kernel_api::{SagaState, StepStatus};
use agent_kernel_core::{KernelError, NoObserver, ProblemKind};

use crate::{Fixture, add, add_keyed, boom, plan};

#[tokio::test]
async fn a_committed_key_is_not_run_again_and_its_output_is_reused() {
    let fixture = Fixture::new();
    let kernel = fixture.kernel(1);
    let first = kernel
        .run(&plan(vec![add_keyed("a", "order-42")]), &NoObserver)
        .await
        .expect("runs");
    assert_eq!(first.state, SagaState::Done);
    let second = kernel
        .run(
            &plan(vec![add_keyed("a", "order-42"), add("b")]),
            &NoObserver,
        )
        .await
        .expect("runs");
    assert_eq!(second.state, SagaState::Done);
    assert!(second.steps[0].reused);
    assert_eq!(fixture.world.items(), ["a", "b"], "`a` was added once");
    let record = kernel
        .log()
        .saga(&second.saga_id)
        .await
        .expect("reads")
        .expect("exists");
    assert_eq!(
        record.steps[0].reused_from,
        Some((first.saga_id.clone(), 0))
    );
    assert_eq!(
        record.steps[0].output.as_ref().expect("has output").data["step"],
        0
    );
}

#[tokio::test]
async fn rolling_back_a_saga_that_reused_a_key_leaves_the_original_effect() {
    let fixture = Fixture::new();
    let kernel = fixture.kernel(1);
    kernel
        .run(&plan(vec![add_keyed("a", "k")]), &NoObserver)
        .await
        .expect("runs");
    let second = kernel
        .run(&plan(vec![add_keyed("a", "k"), boom()]), &NoObserver)
        .await
        .expect("runs");
    assert_eq!(second.state, SagaState::FailedRolledBack);
    assert_eq!(fixture.world.items(), ["a"]);
}

#[tokio::test]
async fn the_same_key_with_other_arguments_is_refused_before_anything_runs() {
    let fixture = Fixture::new();
    let kernel = fixture.kernel(1);
    kernel
        .run(&plan(vec![add_keyed("a", "k")]), &NoObserver)
        .await
        .expect("runs");
    let error = kernel
        .run(
            &plan(vec![add("first"), add_keyed("other", "k")]),
            &NoObserver,
        )
        .await
        .expect_err("refused");
    let KernelError::Preflight(problems) = &error else {
        panic!("expected a preflight error, got {error}");
    };
    assert_eq!(problems[0].kind, ProblemKind::KeyConflict);
    assert!(problems[0].message.contains("bound to other arguments"));
    assert!(error.is_bad_input());
    assert_eq!(fixture.world.items(), ["a"]);
}

#[tokio::test]
async fn a_key_repeated_within_one_plan_is_refused() {
    let fixture = Fixture::new();
    let kernel = fixture.kernel(1);
    let error = kernel
        .run(
            &plan(vec![add_keyed("a", "k"), add_keyed("a", "k")]),
            &NoObserver,
        )
        .await
        .expect_err("refused");
    assert!(error.to_string().contains("also used by step 0"));
    assert!(fixture.world.journal().is_empty());
}

#[tokio::test]
async fn a_compensated_key_may_run_again() {
    let fixture = Fixture::new();
    let kernel = fixture.kernel(1);
    let failed = kernel
        .run(&plan(vec![add_keyed("a", "k"), boom()]), &NoObserver)
        .await
        .expect("runs");
    assert_eq!(failed.state, SagaState::FailedRolledBack);
    assert_eq!(failed.steps[0].status, StepStatus::Compensated);
    let retried = kernel
        .run(&plan(vec![add_keyed("a", "k")]), &NoObserver)
        .await
        .expect("runs");
    assert_eq!(retried.state, SagaState::Done);
    assert!(!retried.steps[0].reused);
    assert_eq!(fixture.world.items(), ["a"]);
    assert_eq!(fixture.world.journal(), ["add a", "remove a", "add a"]);
}

#[tokio::test]
async fn a_failed_key_may_run_again() {
    let fixture = Fixture::new();
    let kernel = fixture.kernel(1);
    let mut failing = boom();
    failing.idempotency_key = Some("k".into());
    let failed = kernel
        .run(&plan(vec![failing.clone()]), &NoObserver)
        .await
        .expect("runs");
    assert_eq!(failed.state, SagaState::FailedRolledBack);
    let again = kernel
        .run(&plan(vec![failing]), &NoObserver)
        .await
        .expect("runs");
    assert_eq!(again.state, SagaState::FailedRolledBack);
    assert!(!again.steps[0].reused);
}

/// Abandons, as process 9 with its own actor, a saga whose keyed step is still running, so
/// key `k` stays held (BEGIN) for the given arguments.
async fn hold_key(fixture: &crate::Fixture, held: &agent_kernel_api::PlanStep) {
    let mut plan = plan(vec![held.clone()]);
    plan.actor = Some("holder".into());
    // Abandoned once its effect is applied: its BEGIN, which holds the key, is durable.
    crate::abandon_when(&fixture.kernel(9), &plan, || {
        fixture.world.items().contains(&"held".to_owned())
    })
    .await;
}

fn held_step() -> agent_kernel_api::PlanStep {
    let mut held = add_keyed("held", "k");
    held.args = serde_json::json!({"item": "held", "sleep_ms": 60_000});
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_key_is_refused_even_when_a_state_change_rides_in_the_same_batch() {
    let fixture = Fixture::new();
    hold_key(&fixture, &held_step()).await;
    // After the probe the saga moves Validating -> Acting: that state change is written in
    // the same batch as the keyed step's BEGIN, whose refusal must still be seen.
    let report = fixture
        .kernel(1)
        .run(
            &plan(vec![
                add("a"),
                crate::probe(serde_json::json!({})),
                held_step(),
            ]),
            &NoObserver,
        )
        .await
        .expect("runs");
    assert_eq!(report.state, SagaState::FailedRolledBack);
    assert!(
        report
            .failure
            .expect("failed")
            .error
            .to_string()
            .contains("is held by saga"),
    );
    assert_eq!(fixture.world.items(), ["held"], "only the holder's effect");
}

/// Cancels the saga as soon as its first step has run.
struct CancelAfterFirstStep(std::sync::Arc<agent_kernel_core::Cancellation>);

impl agent_kernel_core::Observer for CancelAfterFirstStep {
    fn on_event(&self, event: &agent_kernel_core::SagaEvent<'_>) {
        if let agent_kernel_core::SagaEvent::StepFinished { step_seq: 0, .. } = event {
            self.0.cancel("test cancel");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_step_with_a_held_key_still_rolls_back_cleanly() {
    let fixture = Fixture::new();
    hold_key(&fixture, &held_step()).await;
    let cancel = std::sync::Arc::new(agent_kernel_core::Cancellation::new());
    let report = fixture
        .kernel(1)
        .run_cancellable(
            &plan(vec![add("a"), held_step()]),
            &CancelAfterFirstStep(cancel.clone()),
            &cancel,
        )
        .await
        .expect("runs, and the cancellation is recorded without touching the key");
    assert_eq!(report.state, SagaState::FailedRolledBack);
    assert!(
        report
            .failure
            .expect("failed")
            .error
            .to_string()
            .contains("test cancel")
    );
    assert_eq!(fixture.world.items(), ["held"]);
}
