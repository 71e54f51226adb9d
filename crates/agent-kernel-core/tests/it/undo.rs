//! Undo of a `Done` saga (reference §10): every step compensated last first and the saga
//! `Undone`, within the undo window (on an injected clock), never for an irreversible step,
//! and never started by `recover`.

use agent_kernel_api::{ApprovalStatus, PlanStep, SagaState, StepStatus};
use agent_kernel_core::{
    Cancellation, KernelError, NoObserver, OperatorDecision, RecoveryReport, UndoRequest,
};
use serde_json::json;

use crate::{Fixture, add, plan};

fn request(reason: &str) -> UndoRequest {
    UndoRequest {
        reason: reason.into(),
        force: false,
        by: None,
    }
}

/// A little over the default undo window (7 days), in ms.
const EIGHT_DAYS_MS: u64 = 8 * 24 * 3_600_000;

#[tokio::test]
async fn a_done_saga_is_undone_last_first_and_ends_undone() {
    let fixture = Fixture::new();
    let kernel = fixture.kernel(1);
    let report = kernel
        .run(&plan(vec![add("a"), add("b")]), &NoObserver)
        .await
        .expect("runs");
    assert_eq!(report.state, SagaState::Done);
    // Recovery never touches it.
    fixture.kill([1]);
    let recovered = fixture
        .kernel(2)
        .recover(&NoObserver)
        .await
        .expect("recovers");
    assert_eq!(recovered, RecoveryReport::default());
    assert_eq!(fixture.world.items(), ["a", "b"]);

    let undone = fixture
        .kernel(3)
        .undo(&report.saga_id, &request("wrong customer"), &NoObserver)
        .await
        .expect("undoes");
    assert_eq!(undone.state, SagaState::Undone);
    assert!(
        undone
            .steps
            .iter()
            .all(|step| step.status == StepStatus::Compensated)
    );
    assert!(fixture.world.items().is_empty());
    let journal = fixture.world.journal();
    let removals: Vec<&String> = journal
        .iter()
        .filter(|entry| entry.starts_with("remove"))
        .collect();
    assert_eq!(removals, ["remove b", "remove a"], "last first");
    // Undone is terminal: a second undo reports it as it is, and changes nothing.
    let again = fixture
        .kernel(3)
        .undo(&report.saga_id, &request("again"), &NoObserver)
        .await
        .expect("reports");
    assert_eq!(again.state, SagaState::Undone);
    let audit = fixture.verify();
    assert!(audit.is_intact(), "{:?}", audit.first_bad);
}

#[tokio::test]
async fn past_its_window_an_undo_is_refused_naming_the_step_and_nothing_is_undone() {
    let mut fixture = Fixture::new();
    let report = fixture
        .kernel(1)
        .run(&plan(vec![add("a"), add("b")]), &NoObserver)
        .await
        .expect("runs");
    fixture.clock_ahead_ms = EIGHT_DAYS_MS;
    let error = fixture
        .kernel(2)
        .undo(&report.saga_id, &request("too late"), &NoObserver)
        .await
        .expect_err("past the window");
    let KernelError::UndoRefused { step, reason, .. } = &error else {
        panic!("refused: {error}");
    };
    assert_eq!(
        step.as_ref().map(|(seq, _)| *seq),
        Some(1),
        "the last step is checked first"
    );
    assert!(reason.contains("window of 7d"), "{reason}");
    assert!(error.is_denied());
    assert_eq!(fixture.world.items(), ["a", "b"]);
    // Within the window (a day later), it goes through.
    fixture.clock_ahead_ms = 24 * 3_600_000;
    let undone = fixture
        .kernel(2)
        .undo(&report.saga_id, &request("in time"), &NoObserver)
        .await
        .expect("undoes");
    assert_eq!(undone.state, SagaState::Undone);
}

#[tokio::test]
async fn a_saga_with_an_irreversible_step_cannot_be_undone() {
    let fixture = Fixture::new();
    let kernel = fixture.kernel(1);
    let send = PlanStep {
        tool: "send.once".into(),
        args: json!({"item": "mail"}),
        idempotency_key: None,
    };
    let waiting = kernel
        .run(&plan(vec![add("a"), send]), &NoObserver)
        .await
        .expect("runs");
    let approval = waiting.approval.expect("an irreversible step waits");
    kernel
        .decide_approval(
            &approval.approval_id,
            OperatorDecision {
                approve: true,
                operator_key: None,
                user: None,
                note: None,
            },
        )
        .await
        .expect("approved");
    let done = kernel
        .resume(&waiting.saga_id, &NoObserver, &Cancellation::new())
        .await
        .expect("resumes");
    assert_eq!(done.state, SagaState::Done);
    assert_eq!(
        kernel
            .approval(&approval.approval_id)
            .await
            .expect("reads")
            .status,
        ApprovalStatus::Consumed
    );
    let error = kernel
        .undo(&done.saga_id, &request("oops"), &NoObserver)
        .await
        .expect_err("irreversible");
    assert!(
        matches!(&error, KernelError::UndoRefused { step: Some((1, tool)), .. } if tool == "send.once"),
        "{error}"
    );
    assert_eq!(fixture.world.items(), ["a", "mail"]);
}

#[tokio::test]
async fn only_a_done_saga_is_undone() {
    let fixture = Fixture::new();
    let kernel = fixture.kernel(1);
    let failed = kernel
        .run(&plan(vec![add("a"), crate::boom()]), &NoObserver)
        .await
        .expect("runs");
    assert_eq!(failed.state, SagaState::FailedRolledBack);
    let error = kernel
        .undo(&failed.saga_id, &request("why not"), &NoObserver)
        .await
        .expect_err("not Done");
    assert!(
        matches!(error, KernelError::UndoRefused { step: None, .. }),
        "{error}"
    );
    let error = kernel
        .undo(&failed.saga_id, &request(""), &NoObserver)
        .await
        .expect_err("no reason");
    assert!(matches!(error, KernelError::InvalidRequest(_)), "{error}");
}

/// Undo keeps the order across sagas: a saga one of whose steps' resources a later saga
/// (neither rolled back nor undone) claimed since is refused, naming that saga, and nothing
/// is undone (its tool cannot tell that the later write covers its own); undone newest
/// first, both are.
#[tokio::test]
async fn an_undo_under_a_later_sagas_claim_is_refused_until_that_saga_is_undone() {
    let fixture = Fixture::new();
    let kernel = fixture.kernel(1);
    let first = kernel
        .run(&plan(vec![add("x")]), &NoObserver)
        .await
        .expect("runs");
    let second = kernel
        .run(&plan(vec![add("x")]), &NoObserver)
        .await
        .expect("runs");
    assert_eq!(
        (first.state, second.state),
        (SagaState::Done, SagaState::Done)
    );
    let preview = kernel.undo_preview(&first.saga_id).await.expect("previews");
    assert!(!preview.undoable(false), "{preview:?}");
    let error = kernel
        .undo(&first.saga_id, &request("out of order"), &NoObserver)
        .await
        .expect_err("the later saga comes first");
    assert!(matches!(error, KernelError::UndoRefused { .. }), "{error}");
    let text = error.to_string();
    assert!(
        text.contains(&format!("claimed since by saga {}", second.saga_id)),
        "{text}"
    );
    assert_eq!(fixture.world.items(), ["x", "x"], "nothing undone");

    for saga_id in [&second.saga_id, &first.saga_id] {
        let undone = kernel
            .undo(saga_id, &request("newest first"), &NoObserver)
            .await
            .expect("undoes");
        assert_eq!(undone.state, SagaState::Undone);
    }
    assert!(fixture.world.items().is_empty());
    let audit = fixture.verify();
    assert!(audit.is_intact(), "{:?}", audit.first_bad);
}

/// A later saga whose compensation failed and whose letter an operator resolved (keeping
/// its effect) still covers the earlier saga's step: that saga is `FailedRolledBack`, but its
/// step is `COMPENSATION_FAILED` and its write in place, so undoing the earlier saga is
/// refused (its tool cannot tell that the later write covers its own).
#[tokio::test]
async fn an_undo_under_a_resolved_later_step_on_its_resource_is_refused() {
    let fixture = Fixture::new();
    let kernel = fixture.kernel(1);
    let first = kernel
        .run(&plan(vec![add("stuck-x")]), &NoObserver)
        .await
        .expect("runs");
    assert_eq!(first.state, SagaState::Done);
    let second = kernel
        .run(&plan(vec![add("stuck-x"), crate::boom()]), &NoObserver)
        .await
        .expect("runs");
    assert_eq!(second.state, SagaState::FailedRollbackPartial);
    let letters = kernel
        .dead_letters(Some(&second.saga_id))
        .await
        .expect("reads");
    assert_eq!(letters.len(), 1);
    let resolved = kernel
        .resolve_dead_letter(&letters[0].letter_id, "kept on purpose".into(), None)
        .await
        .expect("resolves");
    assert_eq!(resolved.saga_state, SagaState::FailedRolledBack);
    // The item could be removed now: only the rule keeps the undo back.
    fixture
        .world
        .unstuck
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let error = kernel
        .undo(
            &first.saga_id,
            &request("the later write was kept"),
            &NoObserver,
        )
        .await
        .expect_err("the later saga's kept write covers it");
    assert!(
        error
            .to_string()
            .contains(&format!("claimed since by saga {}", second.saga_id)),
        "{error}"
    );
    assert_eq!(
        fixture.world.items(),
        ["stuck-x", "stuck-x"],
        "nothing undone"
    );
}
