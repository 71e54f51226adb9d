//! Writing and reading records: round trips, atomic batches, key claims, take-over.

use agent_kernel_api::{
    LogWrite, SagaId, SagaState, StepStatus, ToolError, ToolOutput, TxError, TxLog, WriteOutcome,
};
use serde_json::json;

use crate::{begin, new_saga, open, owner};

fn commit(id: &str, step_seq: u32) -> LogWrite {
    LogWrite::CommitStep {
        saga_id: SagaId::new(id),
        step_seq,
        output: ToolOutput::new(json!({"ok": step_seq})),
    }
}

fn set_state(id: &str, state: SagaState) -> LogWrite {
    LogWrite::SetState {
        saga_id: SagaId::new(id),
        state,
    }
}

#[tokio::test]
async fn a_saga_round_trips_with_every_field() {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = open(&dir.path().join("log.db")).expect("opens");
    log.write(vec![new_saga("s"), begin("s", 0, Some("k"), "h0")])
        .await
        .expect("writes");
    log.write(vec![commit("s", 0), begin("s", 1, None, "h1")])
        .await
        .expect("writes");
    log.write(vec![LogWrite::FailStep {
        saga_id: SagaId::new("s"),
        step_seq: 1,
        error: ToolError::uncertain("disk full"),
    }])
    .await
    .expect("writes");
    let record = log
        .saga(&SagaId::new("s"))
        .await
        .expect("reads")
        .expect("exists");
    assert_eq!(record.saga.state, SagaState::Acting);
    assert_eq!(record.saga.owner, owner(1));
    assert_eq!(record.steps.len(), 2);
    assert_eq!(record.steps[0].status, StepStatus::Commit);
    assert_eq!(
        record.steps[0].output.as_ref().expect("output").data,
        json!({"ok": 0})
    );
    assert_eq!(record.steps[0].idempotency_key.as_deref(), Some("k"));
    assert_eq!(
        record.steps[0].undo.blob.as_deref(),
        Some(&b"previous \x00 bytes"[..])
    );
    assert_eq!(record.steps[1].status, StepStatus::Fail);
    assert!(
        record.steps[1]
            .error
            .as_ref()
            .expect("error")
            .is_uncertain()
    );
    assert_eq!(log.unfinished_sagas().await.expect("reads").len(), 1);
    log.write(vec![set_state("s", SagaState::Done)])
        .await
        .expect("writes");
    assert!(log.unfinished_sagas().await.expect("reads").is_empty());
}

#[tokio::test]
async fn a_batch_with_a_bad_record_writes_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = open(&dir.path().join("log.db")).expect("opens");
    log.write(vec![new_saga("s"), begin("s", 0, None, "h")])
        .await
        .expect("writes");
    // Committing step 5, which was never begun, must fail the whole batch.
    let error = log
        .write(vec![
            commit("s", 0),
            begin("s", 1, None, "h"),
            commit("s", 5),
        ])
        .await
        .expect_err("refused");
    assert!(matches!(error, TxError::NotFound(_)), "{error:?}");
    let record = log
        .saga(&SagaId::new("s"))
        .await
        .expect("reads")
        .expect("exists");
    assert_eq!(record.steps.len(), 1);
    assert_eq!(record.steps[0].status, StepStatus::Begin);
}

#[tokio::test]
async fn a_step_cannot_be_committed_twice_or_begun_twice() {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = open(&dir.path().join("log.db")).expect("opens");
    log.write(vec![
        new_saga("s"),
        begin("s", 0, None, "h"),
        commit("s", 0),
    ])
    .await
    .expect("writes");
    assert!(log.write(vec![commit("s", 0)]).await.is_err());
    assert!(log.write(vec![begin("s", 0, None, "h")]).await.is_err());
}

#[tokio::test]
async fn keys_are_held_while_live_and_released_after_compensation() {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = open(&dir.path().join("log.db")).expect("opens");
    log.write(vec![new_saga("a"), begin("a", 0, Some("k"), "h")])
        .await
        .expect("writes");
    // Held by a BEGIN step: another saga cannot claim it.
    let outcomes = log
        .write(vec![new_saga("b"), begin("b", 0, Some("k"), "h")])
        .await
        .expect("writes");
    assert!(
        matches!(&outcomes[1], WriteOutcome::KeyRejected(reason) if reason.contains("held by saga a"))
    );
    let record = log
        .saga(&SagaId::new("b"))
        .await
        .expect("reads")
        .expect("exists");
    assert_eq!(record.steps[0].status, StepStatus::Fail);
    // Bound to other arguments: always refused.
    let outcomes = log
        .write(vec![new_saga("c"), begin("c", 0, Some("k"), "other")])
        .await
        .expect("writes");
    assert!(
        matches!(&outcomes[1], WriteOutcome::KeyRejected(reason) if reason.contains("other arguments"))
    );
    // Compensated: free again, and rebound to the new step.
    log.write(vec![LogWrite::Compensation {
        saga_id: SagaId::new("a"),
        step_seq: 0,
        result: Ok("compensated".into()),
    }])
    .await
    .expect("writes");
    let outcomes = log
        .write(vec![new_saga("d"), begin("d", 0, Some("k"), "h")])
        .await
        .expect("writes");
    assert_eq!(outcomes[1], WriteOutcome::Written);
    let binding = log.key_binding("k").await.expect("reads").expect("bound");
    assert_eq!(binding.saga_id, SagaId::new("d"));
    assert_eq!(binding.status, StepStatus::Begin);
}

#[tokio::test]
async fn take_over_is_a_compare_and_swap_on_owner_and_state() {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = open(&dir.path().join("log.db")).expect("opens");
    log.write(vec![new_saga("s"), begin("s", 0, None, "h")])
        .await
        .expect("writes");
    let saga_id = SagaId::new("s");
    let acting = SagaState::Acting;
    assert!(
        log.take_over(&saga_id, &owner(1), acting, &owner(2))
            .await
            .expect("writes")
    );
    assert!(
        !log.take_over(&saga_id, &owner(1), acting, &owner(3))
            .await
            .expect("writes"),
        "the owner changed"
    );
    // The saga reached Done after it was read: the take-over must not happen.
    log.write(vec![set_state("s", SagaState::Done)])
        .await
        .expect("writes");
    assert!(
        !log.take_over(&saga_id, &owner(2), acting, &owner(4))
            .await
            .expect("writes"),
        "the state changed"
    );
    let record = log.saga(&saga_id).await.expect("reads").expect("exists");
    assert_eq!(record.saga.owner, owner(2));
    assert_eq!(record.saga.state, SagaState::Done);
}

#[tokio::test]
async fn a_key_whose_step_failed_with_an_uncertain_outcome_stays_held() {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = open(&dir.path().join("log.db")).expect("opens");
    log.write(vec![new_saga("a"), begin("a", 0, Some("k"), "h")])
        .await
        .expect("writes");
    log.write(vec![LogWrite::FailStep {
        saga_id: SagaId::new("a"),
        step_seq: 0,
        error: ToolError::uncertain("timed out mid-append"),
    }])
    .await
    .expect("writes");
    let outcomes = log
        .write(vec![new_saga("b"), begin("b", 0, Some("k"), "h")])
        .await
        .expect("writes");
    assert!(
        matches!(&outcomes[1], WriteOutcome::KeyRejected(reason) if reason.contains("held by saga a")),
        "{outcomes:?}"
    );
    // Once compensated, it is free.
    log.write(vec![LogWrite::Compensation {
        saga_id: SagaId::new("a"),
        step_seq: 0,
        result: Ok("compensated".into()),
    }])
    .await
    .expect("writes");
    let outcomes = log
        .write(vec![new_saga("c"), begin("c", 0, Some("k"), "h")])
        .await
        .expect("writes");
    assert_eq!(outcomes[1], WriteOutcome::Written);
}

#[tokio::test]
async fn a_refused_step_leaves_its_key_alone() {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = open(&dir.path().join("log.db")).expect("opens");
    log.write(vec![new_saga("a"), begin("a", 0, Some("k"), "h")])
        .await
        .expect("writes");
    let agent_kernel_api::LogWrite::BeginStep(step) = begin("b", 0, Some("k"), "h") else {
        unreachable!("begin builds a BeginStep")
    };
    log.write(vec![
        new_saga("b"),
        LogWrite::RefuseStep {
            step,
            error: ToolError::denied("fsm denied"),
        },
    ])
    .await
    .expect("a refused step never conflicts with a held key");
    let binding = log.key_binding("k").await.expect("reads").expect("bound");
    assert_eq!(binding.saga_id, SagaId::new("a"), "still held by a");
    let record = log
        .saga(&SagaId::new("b"))
        .await
        .expect("reads")
        .expect("exists");
    assert_eq!(record.steps[0].status, StepStatus::Fail);
}

async fn write_many(log: &agent_kernel_txlog::SqliteLog, parity: u32) {
    for n in (0..20).filter(|n| n % 2 == parity) {
        let id = format!("s{n}");
        log.write(vec![new_saga(&id), begin(&id, 0, None, "h")])
            .await
            .expect("writes");
    }
}

#[tokio::test]
async fn two_connections_write_one_log_at_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("log.db");
    let (first, second) = (open(&path).expect("opens"), open(&path).expect("opens"));
    // Each log has its own writer thread, so the two streams of writes really interleave.
    tokio::join!(write_many(&first, 0), write_many(&second, 1));
    assert_eq!(first.sagas(100).await.expect("reads").len(), 20);
}

/// A saga of `actor`, created with `require_actor_idle` as given.
fn saga_of(id: &str, actor: &str, require_actor_idle: bool, dry_run: bool) -> LogWrite {
    let LogWrite::CreateSaga(mut saga) = new_saga(id) else {
        unreachable!("new_saga creates a saga")
    };
    saga.actor = Some(actor.to_owned());
    saga.require_actor_idle = require_actor_idle;
    saga.dry_run = dry_run;
    LogWrite::CreateSaga(saga)
}

#[tokio::test]
async fn a_saga_that_needs_its_actor_idle_is_refused_while_another_is_unfinished() {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = open(&dir.path().join("log.db")).expect("opens");
    // A dry run of the actor does not hold it.
    log.write(vec![
        saga_of("dry", "alice", false, true),
        set_state("dry", SagaState::Done),
    ])
    .await
    .expect("writes");
    log.write(vec![
        saga_of("a", "alice", true, false),
        begin("a", 0, None, "h"),
    ])
    .await
    .expect("the actor is idle");

    let error = log
        .write(vec![
            saga_of("b", "alice", true, false),
            begin("b", 0, None, "h"),
        ])
        .await
        .expect_err("refused");
    match &error {
        TxError::ActorBusy { actor, saga_id } => {
            assert_eq!(actor, "alice");
            assert_eq!(saga_id.as_str(), "a");
        }
        other => panic!("expected ActorBusy, got {other:?}"),
    }
    assert!(error.to_string().contains("alice"), "{error}");
    assert!(
        log.saga(&SagaId::new("b")).await.expect("reads").is_none(),
        "nothing written"
    );

    // Another actor, or a saga that does not ask, goes through.
    log.write(vec![
        saga_of("c", "bob", true, false),
        begin("c", 0, None, "h"),
    ])
    .await
    .expect("bob is idle");
    log.write(vec![
        saga_of("d", "alice", false, false),
        begin("d", 0, None, "h"),
    ])
    .await
    .expect("not asked");
    // Once alice's sagas end, she is idle again.
    log.write(vec![
        commit("a", 0),
        set_state("a", SagaState::Done),
        set_state("d", SagaState::FailedRolledBack),
    ])
    .await
    .expect("writes");
    log.write(vec![
        saga_of("e", "alice", true, false),
        begin("e", 0, None, "h"),
    ])
    .await
    .expect("alice is idle again");
}
