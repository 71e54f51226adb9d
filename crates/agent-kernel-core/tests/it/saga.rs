//! Running sagas: success, LIFO rollback, failed compensation, panics, commit counts.

use agent_kernel_api::{SagaState, StepStatus};
use agent_kernel_core::{KernelError, NoObserver, ProblemKind};
use serde_json::json;

use crate::{Fixture, add, boom, plan};

#[tokio::test]
async fn a_successful_saga_ends_done_with_every_step_committed() {
    let fixture = Fixture::new();
    let kernel = fixture.kernel(1);
    let report = kernel
        .run(&plan(vec![add("a"), add("b"), add("c")]), &NoObserver)
        .await
        .expect("runs");
    assert_eq!(report.state, SagaState::Done);
    assert!(report.steps.iter().all(|s| s.status == StepStatus::Commit));
    assert_eq!(fixture.world.items(), ["a", "b", "c"]);
    let record = kernel
        .log()
        .saga(&report.saga_id)
        .await
        .expect("reads")
        .expect("exists");
    assert_eq!(record.saga.state, SagaState::Done);
    assert_eq!(record.saga.actor.as_deref(), Some("tester"));
    assert_eq!(record.steps[1].undo.data, json!({"item": "b"}));
}

#[tokio::test]
async fn a_failure_compensates_committed_steps_last_first() {
    let fixture = Fixture::new();
    let kernel = fixture.kernel(1);
    let report = kernel
        .run(
            &plan(vec![add("a"), add("b"), add("c"), boom()]),
            &NoObserver,
        )
        .await
        .expect("runs");
    assert_eq!(report.state, SagaState::FailedRolledBack);
    assert!(fixture.world.items().is_empty());
    assert_eq!(
        fixture.world.journal(),
        [
            "add a", "add b", "add c", "remove c", "remove b", "remove a"
        ]
    );
    let statuses: Vec<_> = report.steps.iter().map(|s| s.status).collect();
    assert_eq!(
        statuses,
        [
            StepStatus::Compensated,
            StepStatus::Compensated,
            StepStatus::Compensated,
            StepStatus::Fail
        ]
    );
    let failure = report.failure.expect("has a failure");
    assert_eq!(failure.step_seq, 3);
    assert!(failure.error.to_string().contains("boom fails on purpose"));
}

#[tokio::test]
async fn a_failed_compensation_ends_partial_and_still_compensates_the_rest() {
    let fixture = Fixture::new();
    let kernel = fixture.kernel(1);
    let report = kernel
        .run(
            &plan(vec![add("a"), add("stuck"), add("c"), boom()]),
            &NoObserver,
        )
        .await
        .expect("runs");
    assert_eq!(report.state, SagaState::FailedRollbackPartial);
    assert_eq!(fixture.world.items(), ["stuck"]);
    assert_eq!(report.steps[1].status, StepStatus::CompensationFailed);
    assert_eq!(report.steps[0].status, StepStatus::Compensated);
}

#[tokio::test]
async fn a_panicking_tool_is_contained_and_rolled_back() {
    let fixture = Fixture::new();
    let kernel = fixture.kernel(1);
    let mut panicking = boom();
    panicking.args = json!({"panic": true});
    let report = kernel
        .run(&plan(vec![add("a"), panicking]), &NoObserver)
        .await
        .expect("runs");
    assert_eq!(report.state, SagaState::FailedRolledBack);
    assert!(fixture.world.items().is_empty());
    let failure = report.failure.expect("has a failure");
    assert!(failure.error.to_string().contains("boom panics on purpose"));
    assert!(failure.error.is_uncertain());
}

#[tokio::test]
async fn a_panic_in_prepare_is_a_definite_failure() {
    let fixture = Fixture::new();
    let kernel = fixture.kernel(1);
    let mut panicking = boom();
    panicking.args = json!({"panic_in_prepare": true});
    let report = kernel
        .run(&plan(vec![add("a"), panicking]), &NoObserver)
        .await
        .expect("runs");
    assert_eq!(report.state, SagaState::FailedRolledBack);
    let failure = report.failure.expect("has a failure");
    assert!(failure.error.to_string().contains("boom panics in prepare"));
    assert!(!failure.error.is_uncertain(), "prepare has no side effects");
    assert_eq!(report.steps[1].status, StepStatus::Fail);
    assert!(
        report.steps[1].compensation.is_none(),
        "nothing to compensate"
    );
    assert!(fixture.world.items().is_empty());
}

#[tokio::test]
async fn preflight_reports_every_problem_and_runs_nothing() {
    let fixture = Fixture::new();
    let kernel = fixture.kernel(1);
    let mut bad_args = add("x");
    bad_args.args = json!({"itm": "x"});
    let mut unknown = add("y");
    unknown.tool = "no.such.tool".into();
    let error = kernel
        .run(&plan(vec![add("a"), bad_args, unknown]), &NoObserver)
        .await
        .expect_err("refused");
    let KernelError::Preflight(problems) = &error else {
        panic!("expected a preflight error, got {error}");
    };
    let kinds: Vec<_> = problems.iter().map(|p| (p.step_idx, p.kind)).collect();
    assert_eq!(
        kinds,
        [(1, ProblemKind::InvalidArgs), (2, ProblemKind::UnknownTool)]
    );
    assert!(error.is_bad_input());
    assert!(fixture.world.journal().is_empty());
    assert!(kernel.log().sagas(10).await.expect("reads").is_empty());
}

#[tokio::test]
async fn rollback_of_a_finished_saga_is_refused_or_a_no_op() {
    let fixture = Fixture::new();
    let kernel = fixture.kernel(1);
    let done = kernel
        .run(&plan(vec![add("a"), add("b")]), &NoObserver)
        .await
        .expect("runs");
    // Done is terminal: the FSM never reopens it.
    let error = kernel
        .rollback(&done.saga_id, &NoObserver)
        .await
        .expect_err("denied");
    assert!(error.is_denied(), "{error}");
    assert!(error.to_string().contains("in state Done"), "{error}");
    assert_eq!(fixture.world.items(), ["a", "b"]);
    // A rolled-back saga is reported as it is.
    let failed = kernel
        .run(&plan(vec![add("c"), boom()]), &NoObserver)
        .await
        .expect("runs");
    let again = kernel
        .rollback(&failed.saga_id, &NoObserver)
        .await
        .expect("no-op");
    assert_eq!(again.state, SagaState::FailedRolledBack);
    assert_eq!(fixture.world.items(), ["a", "b"]);
}

#[tokio::test]
async fn rollback_of_an_unknown_saga_is_bad_input() {
    let fixture = Fixture::new();
    let kernel = fixture.kernel(1);
    let error = kernel
        .rollback(&agent_kernel_api::SagaId::new("nope"), &NoObserver)
        .await
        .expect_err("refused");
    assert!(matches!(error, KernelError::SagaNotFound(_)));
    assert!(error.is_bad_input());
}
