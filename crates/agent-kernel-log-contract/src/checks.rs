//! Writing and reading records: round trips, atomic batches, key claims, take-over, two
//! connections at once.

use agent_kernel_api::{
    LogWrite, SagaId, SagaState, StepStatus, ToolError, TxError, TxLog, WriteOutcome,
};

use std::sync::Arc;

use serde_json::json;

use crate::LogStore;
pub use crate::isolation::{
    a_begin_that_repeats_a_step_begun_meanwhile_is_refused,
    a_claim_sees_every_claim_other_connections_made_since_it_last_claimed,
    a_claim_sees_what_another_connection_claimed_and_settled,
    a_duplicate_is_found_by_its_keys_within_the_window, a_refused_claim_leaves_its_approval_unused,
    a_refused_step_leaves_its_sagas_earlier_claims_held,
    a_resource_is_held_by_one_unsettled_saga_until_it_settles,
    a_resource_raced_from_several_connections_is_claimed_once,
    a_step_refused_by_its_key_claims_nothing, an_undo_claims_its_resources_again,
    claims_in_one_batch_see_each_other,
    duplicate_begins_raced_from_several_connections_are_written_once,
};
pub use crate::listing::{sagas_are_counted_by_state, sagas_are_listed_by_page_and_filter};
use agent_kernel_api::{ApprovalDecision, ApprovalStatus};

use crate::records::{
    begin, commit, consume, decide, new_saga, owner, saga_of, set_state, use_with_begin,
    waiting_saga,
};

/// Checks that a saga round trips with every field.
pub async fn a_saga_round_trips_with_every_field(store: &dyn LogStore) {
    let log = store.open();
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

/// Checks that several sagas read at once come back in the order asked, each as reading it
/// alone gives it, with `None` for an id the log does not have and a repeated id answered
/// each time.
pub async fn sagas_read_at_once_are_answered_in_the_order_asked(store: &dyn LogStore) {
    let log = store.open();
    log.write(vec![new_saga("a"), begin("a", 0, None, "h0")])
        .await
        .expect("writes");
    log.write(vec![commit("a", 0), new_saga("b")])
        .await
        .expect("writes");
    let ids = [
        SagaId::new("b"),
        SagaId::new("missing"),
        SagaId::new("a"),
        SagaId::new("b"),
    ];
    let together = log.saga_records(&ids).await.expect("reads");
    let mut alone = Vec::new();
    for saga_id in &ids {
        alone.push(log.saga(saga_id).await.expect("reads"));
    }
    assert_eq!(together, alone);
    let found: Vec<Option<&str>> = together
        .iter()
        .map(|record| record.as_ref().map(|record| record.saga.saga_id.as_str()))
        .collect();
    assert_eq!(found, [Some("b"), None, Some("a"), Some("b")]);
    assert_eq!(together[2].as_ref().expect("a").steps.len(), 1);
    assert!(log.saga_records(&[]).await.expect("reads").is_empty());
}

/// Checks that a batch with a bad record writes nothing.
pub async fn a_batch_with_a_bad_record_writes_nothing(store: &dyn LogStore) {
    let log = store.open();
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

/// Checks that a step begins only in a saga the log holds and that is no dry run, whether
/// or not its idempotency key would let it begin; the batch is refused whole.
pub async fn a_step_begins_only_in_a_saga_that_is_no_dry_run(store: &dyn LogStore) {
    let log = store.open();
    let error = log
        .write(vec![begin("ghost", 0, None, "h")])
        .await
        .expect_err("refused");
    assert!(matches!(error, TxError::NotFound(_)), "{error:?}");
    assert!(
        log.saga(&SagaId::new("ghost"))
            .await
            .expect("reads")
            .is_none()
    );
    log.write(vec![saga_of("d", "agent", false, true)])
        .await
        .expect("a dry run is created");
    // A key another saga's step holds: such a step is recorded as refused by its key.
    log.write(vec![new_saga("s"), begin("s", 0, Some("k"), "h")])
        .await
        .expect("writes");
    for key in [None, Some("k")] {
        let error = log
            .write(vec![begin("d", 0, key, "h")])
            .await
            .expect_err("refused");
        assert!(
            matches!(&error, TxError::Corrupt(reason) if reason.contains("dry run")),
            "{error:?}"
        );
    }
    let dry = log
        .saga(&SagaId::new("d"))
        .await
        .expect("reads")
        .expect("exists");
    assert!(dry.steps.is_empty(), "{dry:?}");
}

/// Checks that a step cannot be committed twice or begun twice.
pub async fn a_step_cannot_be_committed_twice_or_begun_twice(store: &dyn LogStore) {
    let log = store.open();
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

/// Checks that keys are held while live and released after compensation.
pub async fn keys_are_held_while_live_and_released_after_compensation(store: &dyn LogStore) {
    let log = store.open();
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

/// Checks that take over is a compare and swap on owner and state.
pub async fn take_over_is_a_compare_and_swap_on_owner_and_state(store: &dyn LogStore) {
    let log = store.open();
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

/// Checks that a take-over with a batch writes both in one transaction: the batch only if
/// the take-over holds, and a refused batch undoes the take-over.
pub async fn a_take_over_and_its_batch_are_written_together_or_not_at_all(store: &dyn LogStore) {
    let log = store.open();
    log.write(vec![new_saga("s"), begin("s", 0, None, "h")])
        .await
        .expect("writes");
    let saga_id = SagaId::new("s");
    let acting = SagaState::Acting;
    let compensating = || vec![set_state("s", SagaState::Compensating)];
    // A batch the log refuses (a step that was never begun): neither is written.
    let refused = log
        .take_over_and_write(
            &saga_id,
            &owner(1),
            acting,
            &owner(2),
            vec![set_state("s", SagaState::Compensating), commit("s", 7)],
        )
        .await;
    assert!(refused.is_err(), "{refused:?}");
    let record = log.saga(&saga_id).await.expect("reads").expect("exists");
    assert_eq!(record.saga.owner, owner(1), "the take-over was undone");
    assert_eq!(record.saga.state, acting);
    // The wrong owner: nothing is written.
    assert!(
        !log.take_over_and_write(&saga_id, &owner(9), acting, &owner(2), compensating())
            .await
            .expect("writes")
    );
    let record = log.saga(&saga_id).await.expect("reads").expect("exists");
    assert_eq!((record.saga.owner, record.saga.state), (owner(1), acting));
    // It holds: both are written.
    assert!(
        log.take_over_and_write(&saga_id, &owner(1), acting, &owner(2), compensating())
            .await
            .expect("writes")
    );
    let record = log.saga(&saga_id).await.expect("reads").expect("exists");
    assert_eq!(
        (record.saga.owner, record.saga.state),
        (owner(2), SagaState::Compensating)
    );
    // The state moved on: the compare-and-swap fails.
    assert!(
        !log.take_over_and_write(&saga_id, &owner(2), acting, &owner(3), Vec::new())
            .await
            .expect("writes")
    );
}

/// Checks that a key whose step failed with an uncertain outcome stays held.
pub async fn a_key_whose_step_failed_with_an_uncertain_outcome_stays_held(store: &dyn LogStore) {
    let log = store.open();
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

/// Checks that a refused step leaves its key alone.
pub async fn a_refused_step_leaves_its_key_alone(store: &dyn LogStore) {
    let log = store.open();
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

async fn write_many(log: &dyn TxLog, parity: u32) {
    for n in (0..20).filter(|n| n % 2 == parity) {
        let id = format!("s{n}");
        log.write(vec![new_saga(&id), begin(&id, 0, None, "h")])
            .await
            .expect("writes");
    }
}

/// Checks that two connections write one log at once.
pub async fn two_connections_write_one_log_at_once(store: &dyn LogStore) {
    let (first, second) = (store.open(), store.open());
    // Each log has its own writer thread, so the two streams of writes really interleave.
    tokio::join!(write_many(&*first, 0), write_many(&*second, 1));
    assert_eq!(first.sagas(100).await.expect("reads").len(), 20);
}

/// How many batches [`batches_written_at_once_are_each_answered_as_alone`] writes at once.
const BATCHES_AT_ONCE: usize = 48;

/// Checks that batches written at once (which a log may commit together) are each answered
/// as if written alone: a refused batch leaves nothing of itself, and nothing of the
/// others undone.
pub async fn batches_written_at_once_are_each_answered_as_alone(store: &dyn LogStore) {
    let log = store.open();
    let refused = |n: usize| n % 7 == 3;
    let writes: Vec<_> = (0..BATCHES_AT_ONCE)
        .map(|n| {
            let log = log.clone();
            let id = format!("s{n}");
            // A refused batch commits a step it never began.
            let last = if refused(n) {
                commit(&id, 5)
            } else {
                commit(&id, 0)
            };
            tokio::spawn(async move {
                log.write(vec![new_saga(&id), begin(&id, 0, None, "h"), last])
                    .await
            })
        })
        .collect();
    for (n, write) in writes.into_iter().enumerate() {
        let written = write.await.expect("the write task ran");
        let record = log
            .saga(&SagaId::new(format!("s{n}")))
            .await
            .expect("reads");
        if refused(n) {
            assert!(
                matches!(written, Err(TxError::NotFound(_))),
                "s{n}: {written:?}"
            );
            assert!(record.is_none(), "nothing of refused s{n} is written");
        } else {
            written.unwrap_or_else(|error| panic!("s{n}: {error}"));
            let record = record.unwrap_or_else(|| panic!("s{n} is written"));
            assert_eq!(record.steps.len(), 1, "s{n}");
            assert_eq!(record.steps[0].status, StepStatus::Commit, "s{n}");
        }
    }
}

/// Checks that a saga that needs its actor idle is refused while another is unfinished.
pub async fn a_saga_that_needs_its_actor_idle_is_refused_while_another_is_unfinished(
    store: &dyn LogStore,
) {
    let log = store.open();
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

/// How many connections race in the checks below.
const RACERS: usize = 4;

/// Checks that duplicate keys raced from several connections are claimed once.
pub async fn duplicate_keys_raced_from_several_connections_are_claimed_once(store: &dyn LogStore) {
    let logs: Vec<_> = (0..RACERS).map(|_| store.open()).collect();
    // Each log has a thread (and a connection) of its own: the writes really race.
    let racing = logs.iter().enumerate().map(|(n, log)| {
        let log = Arc::clone(log);
        tokio::spawn(async move {
            let id = format!("racer{n}");
            log.write(vec![new_saga(&id), begin(&id, 0, Some("shared"), "h")])
                .await
                .expect("writes")
        })
    });
    let outcomes = joined(racing.collect()).await;
    let claimed: Vec<usize> = outcomes
        .iter()
        .enumerate()
        .filter(|(_, outcomes)| outcomes[1] == WriteOutcome::Written)
        .map(|(n, _)| n)
        .collect();
    assert_eq!(claimed.len(), 1, "exactly one claim: {outcomes:?}");
    for (n, outcomes) in outcomes.iter().enumerate() {
        if n != claimed[0] {
            assert!(
                matches!(&outcomes[1], WriteOutcome::KeyRejected(reason) if reason.contains("held by saga")),
                "{outcomes:?}"
            );
        }
    }
    let binding = logs[0]
        .key_binding("shared")
        .await
        .expect("reads")
        .expect("bound");
    assert_eq!(binding.saga_id, SagaId::new(format!("racer{}", claimed[0])));
}

/// Checks that take over raced from several connections succeeds once.
pub async fn take_over_raced_from_several_connections_succeeds_once(store: &dyn LogStore) {
    let log = store.open();
    log.write(vec![new_saga("s"), begin("s", 0, None, "h")])
        .await
        .expect("writes");
    let logs: Vec<_> = (0..RACERS).map(|_| store.open()).collect();
    let saga_id = SagaId::new("s");
    let racing = logs.iter().enumerate().map(|(n, log)| {
        let (log, saga_id) = (Arc::clone(log), saga_id.clone());
        tokio::spawn(async move {
            let new = owner(100 + u32::try_from(n).expect("few racers"));
            log.take_over(&saga_id, &owner(1), SagaState::Acting, &new)
                .await
                .expect("writes")
        })
    });
    let taken = joined(racing.collect()).await;
    assert_eq!(taken.iter().filter(|&&taken| taken).count(), 1, "{taken:?}");
    let winner = taken.iter().position(|&taken| taken).expect("one won");
    let record = log.saga(&saga_id).await.expect("reads").expect("exists");
    assert_eq!(
        record.saga.owner,
        owner(100 + u32::try_from(winner).expect("few racers"))
    );
}

/// The outputs of `tasks`, in order.
async fn joined<T>(tasks: Vec<tokio::task::JoinHandle<T>>) -> Vec<T> {
    let mut outputs = Vec::with_capacity(tasks.len());
    for task in tasks {
        outputs.push(task.await.expect("the task finished"));
    }
    outputs
}

/// Checks that a request is decided once and consumed once, for its exact step.
pub async fn a_request_is_decided_once_and_consumed_once_for_its_exact_step(store: &dyn LogStore) {
    let log = store.open();
    waiting_saga(&*log, "s1", "a1", i64::MAX).await;
    let pending = log.pending_approvals().await.expect("reads");
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].status, ApprovalStatus::Pending);
    assert_eq!(pending[0].request.rest, Some(Vec::new()));
    let unfinished = log.unfinished_sagas().await.expect("reads");
    assert_eq!(unfinished[0].state, SagaState::AwaitingApproval);

    let outcomes = log
        .write(vec![decide("a1", ApprovalDecision::Approve)])
        .await
        .expect("written");
    assert_eq!(outcomes, [WriteOutcome::Written]);
    // A second decision, of either kind, changes nothing.
    for decision in [ApprovalDecision::Approve, ApprovalDecision::Reject] {
        let outcomes = log
            .write(vec![decide("a1", decision)])
            .await
            .expect("written");
        assert_eq!(
            outcomes,
            [WriteOutcome::NotPending(ApprovalStatus::Approved)]
        );
    }
    let record = log.approval("a1").await.expect("reads").expect("exists");
    assert_eq!(record.decided_by.as_deref(), Some("alice"));
    // Its row says what the request's audit record says.
    let vouched = log
        .vouched_saga_approval(&SagaId::new("s1"))
        .await
        .expect("vouched for")
        .expect("exists");
    assert_eq!(vouched.request, record.request);
    assert_eq!(record.note.as_deref(), Some("looked at it"));
    assert!(log.pending_approvals().await.expect("reads").is_empty());

    // Another digest: refused, and nothing of the batch is written.
    let error = use_with_begin(&*log, &"e".repeat(64))
        .await
        .expect_err("another digest");
    assert!(
        matches!(&error, TxError::ApprovalUnusable { reason, .. } if reason.contains("digest")),
        "{error}"
    );
    assert!(
        log.saga(&SagaId::new("s1"))
            .await
            .expect("reads")
            .expect("saga")
            .steps
            .is_empty()
    );
    // The right one: consumed with the BEGIN, and never again.
    use_with_begin(&*log, &"d".repeat(64))
        .await
        .expect("consumed");
    let error = log
        .write(vec![consume("s1", "a1", &"d".repeat(64))])
        .await
        .expect_err("consumed once");
    assert!(error.to_string().contains("consumed"), "{error}");
    let record = log.approval("a1").await.expect("reads").expect("exists");
    assert_eq!(record.status, ApprovalStatus::Consumed);
}

/// Checks that a dead letter counts its attempts, settles once, and settling the last one
/// makes its saga `FailedRolledBack`.
pub async fn dead_letters_count_attempts_and_settle_once(store: &dyn LogStore) {
    use agent_kernel_api::{
        DeadLetterStatus, RecordDeadLetter, SettleDeadLetter, StepStatus, ToolError,
    };

    let log = store.open();
    let failed = |error: &str| LogWrite::Compensation {
        saga_id: SagaId::new("s1"),
        step_seq: 0,
        result: Err(ToolError::failed(error)),
    };
    let letter = |id: &str| {
        LogWrite::RecordDeadLetter(RecordDeadLetter {
            letter_id: id.into(),
            saga_id: SagaId::new("s1"),
            step_seq: 0,
            tool_id: "fs.write".into(),
            error: "locked".into(),
            next_retry_at_ms: 99_000,
        })
    };
    log.write(vec![new_saga("s1"), begin("s1", 0, None, "h")])
        .await
        .expect("written");
    log.write(vec![
        failed("locked"),
        letter("d1"),
        LogWrite::SetState {
            saga_id: SagaId::new("s1"),
            state: SagaState::FailedRollbackPartial,
        },
    ])
    .await
    .expect("written");
    // A second failure of the same step is the same letter, one attempt more.
    log.write(vec![failed("locked"), letter("d2")])
        .await
        .expect("written");
    let open_letters = log.open_dead_letters(None).await.expect("reads");
    assert_eq!(open_letters.len(), 1);
    assert_eq!(
        (open_letters[0].letter_id.as_str(), open_letters[0].attempts),
        ("d1", 2)
    );
    let settle = || {
        LogWrite::SettleDeadLetter(SettleDeadLetter {
            letter_id: "d1".into(),
            status: DeadLetterStatus::Resolved,
            by: owner(9),
            uid: Some(1000),
            user: Some("alice".into()),
            note: Some("fixed by hand".into()),
        })
    };
    assert_eq!(
        log.write(vec![settle()]).await.expect("written"),
        [WriteOutcome::Written]
    );
    assert_eq!(
        log.write(vec![settle()]).await.expect("written"),
        [WriteOutcome::NotOpen(DeadLetterStatus::Resolved)]
    );
    // The last open letter settled: the saga is FailedRolledBack, in the same record.
    let record = log
        .saga(&SagaId::new("s1"))
        .await
        .expect("reads")
        .expect("saga");
    assert_eq!(record.saga.state, SagaState::FailedRolledBack);
    assert_eq!(record.steps[0].status, StepStatus::CompensationFailed);
}
