//! Approvals (reference §10) over the real log: a step that needs one waits before anything
//! of it runs; approved, it runs once with exactly the approved arguments; rejected,
//! expired, or left by a dead process, the saga rolls back; a decision is taken once.

use agent_kernel_api::{ApprovalStatus, PlanStep, SagaState, StepStatus};
use agent_kernel_core::{
    ApprovalPolicy, CallAnswer, Cancellation, Kernel, KernelError, NoObserver, OperatorDecision,
    RecoveryAction, approval_digest,
};
use serde_json::json;

use crate::{Fixture, add, plan};

fn blind(item: &str) -> PlanStep {
    PlanStep {
        tool: "blind.add".into(),
        args: json!({ "item": item }),
        idempotency_key: None,
    }
}

fn send(item: &str) -> PlanStep {
    PlanStep {
        tool: "send.once".into(),
        args: json!({ "item": item }),
        idempotency_key: None,
    }
}

/// `blind.add` needs an approval; requests expire after `timeout_ms`.
fn approving(kernel: Kernel, timeout_ms: u64) -> Kernel {
    kernel.with_approval_policy(
        ApprovalPolicy::new(vec!["blind.*".into()], timeout_ms).expect("a valid policy"),
    )
}

/// Runs a plan of `steps` on `kernel` up to the step that waits: the report and its request.
async fn run_until_waiting(
    kernel: &Kernel,
    steps: Vec<PlanStep>,
) -> (
    agent_kernel_core::SagaReport,
    agent_kernel_api::ApprovalRequest,
) {
    let report = kernel.run(&plan(steps), &NoObserver).await.expect("runs");
    let request = report.approval.clone().expect("waits");
    (report, request)
}

fn approve() -> OperatorDecision {
    OperatorDecision {
        approve: true,
        operator_key: None,
        user: Some("alice (uid 1000)".into()),
        note: Some("checked".into()),
    }
}

fn reject(reason: &str) -> OperatorDecision {
    OperatorDecision {
        approve: false,
        operator_key: None,
        user: Some("bob (uid 1001)".into()),
        note: Some(reason.into()),
    }
}

#[tokio::test]
async fn an_approved_step_runs_once_with_exactly_the_approved_arguments() {
    let fixture = Fixture::new();
    let kernel = approving(fixture.kernel(1), 3_600_000);
    let report = kernel
        .run(&plan(vec![add("a"), blind("x"), add("c")]), &NoObserver)
        .await
        .expect("runs");
    assert_eq!(report.state, SagaState::AwaitingApproval);
    let request = report.approval.expect("the report names the request");
    assert_eq!(
        (request.step_seq, request.tool_id.as_str()),
        (1, "blind.add")
    );
    assert_eq!(
        request.digest,
        approval_digest(&report.saga_id, 1, "blind.add", &json!({"item": "x"}))
    );
    // Nothing of the step ran; the plan's remaining step is kept in the log.
    assert_eq!(fixture.world.items(), ["a"]);
    assert_eq!(request.rest, Some(vec![add("c")]));
    let pending = kernel.pending_approvals().await.expect("reads");
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].request, request);
    let record = kernel
        .log()
        .saga(&report.saga_id)
        .await
        .expect("reads")
        .expect("saga");
    assert_eq!(record.saga.state, SagaState::AwaitingApproval);
    assert_eq!(record.steps.len(), 1, "the waiting step has not begun");

    // Still pending: resuming changes nothing.
    let again = kernel
        .resume(&report.saga_id, &NoObserver, &Cancellation::new())
        .await
        .expect("resumes");
    assert_eq!(again.state, SagaState::AwaitingApproval);
    assert_eq!(fixture.world.items(), ["a"]);

    let decided = kernel
        .decide_approval(&request.approval_id, approve())
        .await
        .expect("decided");
    assert_eq!(decided.status, ApprovalStatus::Approved);
    assert_eq!(decided.decided_by.as_deref(), Some("alice (uid 1000)"));
    let error = kernel
        .decide_approval(&request.approval_id, reject("too late"))
        .await
        .expect_err("decided once");
    assert!(
        matches!(
            error,
            KernelError::ApprovalClosed {
                status: ApprovalStatus::Approved,
                ..
            }
        ),
        "{error}"
    );
    assert!(error.is_denied());

    let done = kernel
        .resume(&report.saga_id, &NoObserver, &Cancellation::new())
        .await
        .expect("resumes");
    assert_eq!(done.state, SagaState::Done);
    assert_eq!(fixture.world.items(), ["a", "x", "c"]);
    let statuses: Vec<_> = done.steps.iter().map(|step| step.status).collect();
    assert_eq!(statuses, [StepStatus::Commit; 3]);
    let record = kernel.approval(&request.approval_id).await.expect("reads");
    assert_eq!(record.status, ApprovalStatus::Consumed);
    // A finished saga resumes to its report; the step never runs twice.
    let after = kernel
        .resume(&report.saga_id, &NoObserver, &Cancellation::new())
        .await
        .expect("reports");
    assert_eq!(after.state, SagaState::Done);
    assert_eq!(fixture.world.items(), ["a", "x", "c"]);
    // The request, the decision and its use are in the audit chain, which verifies.
    let audit = fixture.verify();
    assert!(audit.is_intact(), "{:?}", audit.first_bad);
}

#[tokio::test]
async fn a_rejected_step_never_runs_and_the_saga_rolls_back_as_a_denial() {
    let fixture = Fixture::new();
    let kernel = approving(fixture.kernel(1), 3_600_000);
    let (report, request) = run_until_waiting(&kernel, vec![add("a"), blind("x")]).await;
    kernel
        .decide_approval(&request.approval_id, reject("not this one"))
        .await
        .expect("decided");
    let rolled_back = kernel
        .resume(&report.saga_id, &NoObserver, &Cancellation::new())
        .await
        .expect("resumes");
    assert_eq!(rolled_back.state, SagaState::FailedRolledBack);
    assert!(rolled_back.is_denied(), "a rejection exits as a denial");
    let failure = rolled_back.failure.expect("says why");
    assert!(
        failure.error.to_string().contains("not this one"),
        "{}",
        failure.error
    );
    assert!(fixture.world.items().is_empty());
    assert!(!fixture.world.journal().contains(&"add x".to_owned()));
}

#[tokio::test]
async fn an_undecided_request_expires_and_the_saga_rolls_back_recorded_as_expired() {
    let fixture = Fixture::new();
    // The test clock advances a millisecond per reading: 5 ms pass within a few reads.
    let kernel = approving(fixture.kernel(1), 5);
    let (report, request) = run_until_waiting(&kernel, vec![add("a"), blind("x")]).await;
    let waited = kernel
        .wait_for_decision(&request.approval_id)
        .await
        .expect("waits");
    assert_eq!(waited.status, ApprovalStatus::Pending, "not yet recorded");
    let error = kernel
        .decide_approval(&request.approval_id, approve())
        .await
        .expect_err("expired");
    assert!(
        matches!(
            error,
            KernelError::ApprovalClosed {
                status: ApprovalStatus::Expired,
                ..
            }
        ),
        "{error}"
    );
    let rolled_back = kernel
        .resume(&report.saga_id, &NoObserver, &Cancellation::new())
        .await
        .expect("resumes");
    assert_eq!(rolled_back.state, SagaState::FailedRolledBack);
    assert!(rolled_back.is_denied());
    assert!(fixture.world.items().is_empty());
    let record = kernel.approval(&request.approval_id).await.expect("reads");
    assert_eq!(record.status, ApprovalStatus::Expired);
}

#[tokio::test]
async fn another_process_resumes_the_saga_of_a_dead_one_and_two_resumers_run_the_step_once() {
    let fixture = Fixture::new();
    let first = approving(fixture.kernel(1), 3_600_000);
    let (report, request) = run_until_waiting(&first, vec![blind("x"), add("c")]).await;
    // While its process lives, no other process may resume it.
    let second = approving(fixture.kernel(2), 3_600_000);
    second
        .decide_approval(&request.approval_id, approve())
        .await
        .expect("decided");
    let error = second
        .resume(&report.saga_id, &NoObserver, &Cancellation::new())
        .await
        .expect_err("owner alive");
    assert!(matches!(error, KernelError::SagaBusy { .. }), "{error}");

    fixture.kill([1]);
    let third = approving(fixture.kernel(3), 3_600_000);
    let cancel = Cancellation::new();
    let (a, b) = tokio::join!(
        second.resume(&report.saga_id, &NoObserver, &cancel),
        third.resume(&report.saga_id, &NoObserver, &cancel)
    );
    // One resumer takes it over and finishes it; the other is refused, or (when its read
    // comes after the end, as it can on a loaded machine) reports the finished saga.
    let done = [&a, &b]
        .into_iter()
        .filter(|result| matches!(result, Ok(report) if report.state == SagaState::Done))
        .count();
    assert!(done >= 1, "one resumer finishes it: {a:?} {b:?}");
    for result in [&a, &b] {
        assert!(
            matches!(result, Ok(report) if report.state == SagaState::Done)
                || matches!(
                    result,
                    Err(KernelError::TakenOver(_)
                        | KernelError::SagaBusy { .. }
                        | KernelError::NotAwaitingApproval { .. })
                ),
            "{result:?}"
        );
    }
    assert_eq!(fixture.world.items(), ["x", "c"], "the step ran once");
}

#[tokio::test]
async fn recover_rolls_back_a_saga_whose_process_died_waiting_and_voids_its_request() {
    let fixture = Fixture::new();
    let first = approving(fixture.kernel(1), 3_600_000);
    let (_, request) = run_until_waiting(&first, vec![add("a"), blind("x")]).await;
    fixture.kill([1]);
    let recovery = approving(fixture.kernel(2), 3_600_000)
        .recover(&NoObserver)
        .await
        .expect("recovers");
    let [RecoveryAction::RolledBack(rolled_back)] = recovery.sagas.as_slice() else {
        panic!("one saga rolled back: {recovery:?}");
    };
    assert_eq!(rolled_back.state, SagaState::FailedRolledBack);
    let failure = rolled_back.failure.as_ref().expect("says why");
    assert!(
        failure.error.to_string().contains(&request.approval_id),
        "{}",
        failure.error
    );
    assert!(fixture.world.items().is_empty());
    // An approval given afterwards applies to nothing.
    let error = approving(fixture.kernel(3), 3_600_000)
        .decide_approval(&request.approval_id, approve())
        .await
        .expect_err("void");
    assert!(
        matches!(
            error,
            KernelError::ApprovalClosed {
                status: ApprovalStatus::Cancelled,
                ..
            }
        ),
        "{error}"
    );
}

#[tokio::test]
async fn an_irreversible_tool_always_waits_even_without_require() {
    let fixture = Fixture::new();
    let kernel = fixture.kernel(1);
    let report = kernel
        .run(&plan(vec![send("mail")]), &NoObserver)
        .await
        .expect("runs");
    assert_eq!(report.state, SagaState::AwaitingApproval);
    assert!(fixture.world.items().is_empty());
}

#[tokio::test]
async fn a_live_saga_waits_refuses_other_calls_and_resumes_once_approved() {
    let fixture = Fixture::new();
    let kernel = std::sync::Arc::new(approving(fixture.kernel(1), 3_600_000));
    let saga = kernel.begin(Default::default()).await.expect("begins");
    saga.call("ledger.add", json!({"item": "a"}), None)
        .await
        .expect("calls");
    let CallAnswer::AwaitingApproval(request) = saga
        .call("blind.add", json!({"item": "x"}), None)
        .await
        .expect("calls")
    else {
        panic!("the call waits for an approval");
    };
    assert_eq!(
        request.rest, None,
        "a live saga's next steps are its driver's"
    );
    let status = saga.status().await.expect("open");
    assert_eq!(status.state, SagaState::AwaitingApproval);
    assert_eq!(status.approval.as_ref(), Some(&request));
    // Another call is refused while it waits; the saga stays open.
    let refused = saga
        .call("ledger.add", json!({"item": "b"}), None)
        .await
        .expect("answers");
    assert!(matches!(refused, CallAnswer::Refused(_)), "{refused:?}");
    assert!(matches!(
        saga.resume().await.expect("answers"),
        CallAnswer::AwaitingApproval(_)
    ));
    kernel
        .decide_approval(&request.approval_id, approve())
        .await
        .expect("decided");
    let CallAnswer::Committed(step) = saga.resume().await.expect("answers") else {
        panic!("the approved step runs");
    };
    assert_eq!((step.seq, step.tool.as_str()), (1, "blind.add"));
    saga.call("ledger.add", json!({"item": "c"}), None)
        .await
        .expect("calls");
    let done = saga.commit().await.expect("commits");
    assert_eq!(done.state, SagaState::Done);
    assert_eq!(fixture.world.items(), ["a", "x", "c"]);
}

#[tokio::test]
async fn aborting_a_waiting_live_saga_voids_its_request() {
    let fixture = Fixture::new();
    let kernel = std::sync::Arc::new(approving(fixture.kernel(1), 3_600_000));
    let saga = kernel.begin(Default::default()).await.expect("begins");
    let CallAnswer::AwaitingApproval(request) = saga
        .call("blind.add", json!({"item": "x"}), None)
        .await
        .expect("calls")
    else {
        panic!("waits");
    };
    let report = saga.abort("changed my mind").await.expect("aborts");
    assert_eq!(report.state, SagaState::FailedRolledBack);
    let record = kernel.approval(&request.approval_id).await.expect("reads");
    assert_eq!(record.status, ApprovalStatus::Cancelled);
    assert!(fixture.world.items().is_empty());
}

#[tokio::test]
async fn recover_records_a_request_that_expired_while_its_process_was_dead_as_expired() {
    let mut fixture = Fixture::new();
    let first = approving(fixture.kernel(1), 5);
    let (_, request) = run_until_waiting(&first, vec![add("a"), blind("x")]).await;
    fixture.kill([1]);
    // The recovering kernel reads the time well past the expiry.
    fixture.clock_ahead_ms = 60_000;
    let recovery = approving(fixture.kernel(2), 5)
        .recover(&NoObserver)
        .await
        .expect("recovers");
    let [RecoveryAction::RolledBack(rolled_back)] = recovery.sagas.as_slice() else {
        panic!("one saga rolled back: {recovery:?}");
    };
    let failure = rolled_back.failure.as_ref().expect("says why");
    assert!(
        failure.error.to_string().contains("expired"),
        "{}",
        failure.error
    );
    let record = fixture
        .kernel(3)
        .approval(&request.approval_id)
        .await
        .expect("reads");
    assert_eq!(record.status, ApprovalStatus::Expired);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_saga_waiting_for_a_person_is_not_idle_until_its_request_expires() {
    let mut fixture = Fixture::new();
    fixture.limits.saga_idle_timeout_ms = 50;
    let kernel = std::sync::Arc::new(approving(fixture.kernel(1), 3_600_000));
    let saga = kernel.begin(Default::default()).await.expect("begins");
    let CallAnswer::AwaitingApproval(request) = saga
        .call("blind.add", json!({"item": "x"}), None)
        .await
        .expect("calls")
    else {
        panic!("waits");
    };
    // Several idle periods pass without a touch: a person has it, so it stays open.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(
        kernel.live_saga(saga.id()).is_some(),
        "rolled back while it waited"
    );
    kernel
        .decide_approval(&request.approval_id, approve())
        .await
        .expect("decided");
    assert!(matches!(
        saga.resume().await.expect("answers"),
        CallAnswer::Committed(_)
    ));

    // Once its request has expired, the idle timeout rolls it back, recorded as expired.
    let short = std::sync::Arc::new(approving(fixture.kernel(2), 5));
    let saga = short.begin(Default::default()).await.expect("begins");
    let CallAnswer::AwaitingApproval(request) = saga
        .call("blind.add", json!({"item": "y"}), None)
        .await
        .expect("calls")
    else {
        panic!("waits");
    };
    let saga_id = saga.id().clone();
    drop(saga);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while short.live_saga(&saga_id).is_some() {
        assert!(tokio::time::Instant::now() < deadline, "never rolled back");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let record = short.approval(&request.approval_id).await.expect("reads");
    assert_eq!(record.status, ApprovalStatus::Expired);
}
