//! Semantic locks and duplicate keys: a resource is held by one unsettled saga, released
//! when it settles, claimed again by an undo; a refused claim writes nothing of its step.

use std::sync::Arc;

use agent_kernel_api::{
    ApprovalDecision, ApprovalStatus, DeadLetterStatus, LogWrite, PruneSagas, RecordDeadLetter,
    SagaId, SagaState, SettleDeadLetter, StepStatus, ToolError, TxError, TxLog, WriteOutcome,
};

use crate::LogStore;
use crate::records::{
    begin_checked, begin_on, commit, consume, decide, new_saga, owner, set_state, waiting_saga,
};

/// The saga whose lock refused the claim answered by `outcomes[at]`.
fn refused_by(outcomes: &[WriteOutcome], at: usize) -> SagaId {
    match &outcomes[at] {
        WriteOutcome::Conflict(holder) => holder.saga_id.clone(),
        _ => panic!("a conflict at {at}: {outcomes:?}"),
    }
}

/// The locks saga `id` holds, as the log reports them; the view `held_locks` an operator
/// queries must list the same for it.
async fn locks_of(store: &dyn LogStore, log: &dyn TxLog, id: &str) -> Vec<String> {
    let locks = log
        .saga(&SagaId::new(id))
        .await
        .expect("reads")
        .expect("exists")
        .locks;
    let mut viewed: Vec<String> = store
        .held_locks()
        .into_iter()
        .filter(|(_, saga)| saga == id)
        .map(|(resource, _)| resource)
        .collect();
    viewed.sort();
    viewed.dedup();
    assert_eq!(viewed, locks, "the view `held_locks` for saga {id}");
    locks
}

/// Checks that a resource is held by one unsettled saga until that saga settles, and that
/// a refused claim writes nothing of its step but the conflict.
pub async fn a_resource_is_held_by_one_unsettled_saga_until_it_settles(store: &dyn LogStore) {
    let log = store.open();
    log.write(vec![
        new_saga("a"),
        begin_on("a", 0, &["file:/w/x", "acct:1"], &[]),
    ])
    .await
    .expect("writes");
    assert_eq!(
        locks_of(store, log.as_ref(), "a").await,
        ["acct:1", "file:/w/x"]
    );
    // Another saga: refused, nothing of its step written, the rest of its batch written.
    let outcomes = log
        .write(vec![
            new_saga("b"),
            begin_on("b", 0, &["file:/w/y", "file:/w/x"], &[]),
        ])
        .await
        .expect("writes");
    let WriteOutcome::Conflict(holder) = &outcomes[1] else {
        panic!("a conflict: {outcomes:?}");
    };
    assert_eq!(holder.saga_id, SagaId::new("a"));
    assert_eq!(holder.resource, "file:/w/x");
    assert_eq!(holder.state, SagaState::Acting);
    let b = log
        .saga(&SagaId::new("b"))
        .await
        .expect("reads")
        .expect("the saga of the batch was written");
    assert!(b.steps.is_empty(), "nothing of the refused step: {b:?}");
    assert!(b.locks.is_empty(), "no claim kept, not even the free one");
    assert_eq!(b.conflicts.len(), 1);
    assert_eq!(b.conflicts[0].resource, "file:/w/x");
    assert_eq!(b.conflicts[0].holder_saga_id, SagaId::new("a"));
    // The holder never conflicts with itself.
    let outcomes = log
        .write(vec![commit("a", 0), begin_on("a", 1, &["file:/w/x"], &[])])
        .await
        .expect("writes");
    assert_eq!(outcomes[1], WriteOutcome::Written);
    // Settled: released in the same transaction.
    log.write(vec![commit("a", 1), set_state("a", SagaState::Done)])
        .await
        .expect("writes");
    assert!(locks_of(store, log.as_ref(), "a").await.is_empty());
    let outcomes = log
        .write(vec![begin_on("b", 0, &["file:/w/x"], &[])])
        .await
        .expect("writes");
    assert_eq!(outcomes[0], WriteOutcome::Written);
    assert_eq!(locks_of(store, log.as_ref(), "b").await, ["file:/w/x"]);
    // A saga that fails and is rolled back releases too; one left partial keeps them until
    // its last dead letter is settled.
    log.write(vec![
        set_state("b", SagaState::Compensating),
        LogWrite::Compensation {
            saga_id: SagaId::new("b"),
            step_seq: 0,
            result: Err(ToolError::failed("locked")),
        },
        LogWrite::RecordDeadLetter(RecordDeadLetter {
            letter_id: "d1".into(),
            saga_id: SagaId::new("b"),
            step_seq: 0,
            tool_id: "fs.write".into(),
            error: "locked".into(),
            next_retry_at_ms: 99_000,
        }),
        set_state("b", SagaState::FailedRollbackPartial),
    ])
    .await
    .expect("writes");
    assert_eq!(locks_of(store, log.as_ref(), "b").await, ["file:/w/x"]);
    let outcomes = log
        .write(vec![new_saga("c"), begin_on("c", 0, &["file:/w/x"], &[])])
        .await
        .expect("writes");
    let WriteOutcome::Conflict(holder) = &outcomes[1] else {
        panic!("a conflict: {outcomes:?}");
    };
    assert_eq!(holder.saga_id, SagaId::new("b"));
    assert_eq!(holder.state, SagaState::FailedRollbackPartial);
    log.write(vec![LogWrite::SettleDeadLetter(SettleDeadLetter {
        letter_id: "d1".into(),
        status: DeadLetterStatus::Resolved,
        by: owner(9),
        uid: None,
        user: None,
        note: None,
    })])
    .await
    .expect("writes");
    assert!(locks_of(store, log.as_ref(), "b").await.is_empty());
    let outcomes = log
        .write(vec![begin_on("c", 0, &["file:/w/x"], &[])])
        .await
        .expect("writes");
    assert_eq!(outcomes[0], WriteOutcome::Written);
    assert_eq!(locks_of(store, log.as_ref(), "c").await, ["file:/w/x"]);
}

/// Checks that an undo claims its saga's resources again, and is refused while another
/// saga holds one.
pub async fn an_undo_claims_its_resources_again(store: &dyn LogStore) {
    let log = store.open();
    log.write(vec![
        new_saga("a"),
        begin_on("a", 0, &["file:/w/x"], &[]),
        commit("a", 0),
        set_state("a", SagaState::Done),
    ])
    .await
    .expect("writes");
    log.write(vec![new_saga("b"), begin_on("b", 0, &["file:/w/x"], &[])])
        .await
        .expect("writes");
    let claim = || LogWrite::ClaimLocks {
        saga_id: SagaId::new("a"),
    };
    let refused = log.write(vec![claim()]).await;
    let Err(TxError::Conflict(holder)) = refused else {
        panic!("refused: {refused:?}");
    };
    assert_eq!(holder.saga_id, SagaId::new("b"));
    assert!(locks_of(store, log.as_ref(), "a").await.is_empty());
    log.write(vec![
        commit("b", 0),
        set_state("b", SagaState::FailedRolledBack),
    ])
    .await
    .expect("writes");
    log.write(vec![claim()]).await.expect("claimed");
    assert_eq!(locks_of(store, log.as_ref(), "a").await, ["file:/w/x"]);
    log.write(vec![claim()])
        .await
        .expect("claimed again: its own");
    // An undo that stopped there: the settled saga is listed, and its locks can go.
    let holders = log.settled_lock_holders().await.expect("reads");
    let ids: Vec<&str> = holders.iter().map(|saga| saga.saga_id.as_str()).collect();
    assert_eq!(ids, ["a"]);
    let release_by = |id: &str, pid: u32| LogWrite::ReleaseLocks {
        saga_id: SagaId::new(id),
        owner: owner(pid),
    };
    let release = |id: &str| release_by(id, 1);
    // Another process took it over since it was listed (to undo it again): a release by
    // the owner it was listed with leaves the locks to that undo.
    assert!(
        log.take_over(&SagaId::new("a"), &owner(1), SagaState::Done, &owner(2))
            .await
            .expect("writes")
    );
    log.write(vec![release("a")]).await.expect("writes nothing");
    assert_eq!(locks_of(store, log.as_ref(), "a").await, ["file:/w/x"]);
    log.write(vec![release_by("a", 2)]).await.expect("released");
    assert!(locks_of(store, log.as_ref(), "a").await.is_empty());
    assert!(log.settled_lock_holders().await.expect("reads").is_empty());
    log.write(vec![claim()]).await.expect("claimed once more");
    // Not pruned while it holds them again (an undo under way, or killed: `recover`
    // finishes it).
    let prune = || {
        LogWrite::Prune(PruneSagas {
            saga_ids: vec![SagaId::new("a")],
            before_ms: i64::MAX,
        })
    };
    let pruned = log.write(vec![prune()]).await.expect("writes");
    assert_eq!(
        pruned[0],
        WriteOutcome::Pruned {
            n_sagas: 0,
            n_steps: 0
        }
    );
    assert_eq!(locks_of(store, log.as_ref(), "a").await, ["file:/w/x"]);
    log.write(vec![set_state("a", SagaState::Undone)])
        .await
        .expect("writes");
    assert!(locks_of(store, log.as_ref(), "a").await.is_empty());
    // An unsettled saga's locks are not released that way.
    log.write(vec![
        new_saga("c"),
        begin_on("c", 0, &["file:/w/z"], &[]),
        release("c"),
    ])
    .await
    .expect("writes");
    assert_eq!(locks_of(store, log.as_ref(), "c").await, ["file:/w/z"]);
}

/// Checks that a step whose claim is refused leaves the approval it would have consumed
/// unused.
pub async fn a_refused_claim_leaves_its_approval_unused(store: &dyn LogStore) {
    let log = store.open();
    log.write(vec![new_saga("h"), begin_on("h", 0, &["file:/a.txt"], &[])])
        .await
        .expect("writes");
    waiting_saga(log.as_ref(), "s1", "a1", i64::MAX).await;
    log.write(vec![decide("a1", ApprovalDecision::Approve)])
        .await
        .expect("decided");
    let digest = log
        .approval("a1")
        .await
        .expect("reads")
        .expect("exists")
        .request
        .digest;
    let outcomes = log
        .write(vec![
            set_state("s1", SagaState::Acting),
            consume("s1", "a1", &digest),
            begin_on("s1", 0, &["file:/a.txt"], &[]),
        ])
        .await
        .expect("writes");
    assert!(
        matches!(outcomes[1], WriteOutcome::Conflict(_)),
        "{outcomes:?}"
    );
    assert!(
        matches!(outcomes[2], WriteOutcome::Conflict(_)),
        "{outcomes:?}"
    );
    let approval = log.approval("a1").await.expect("reads").expect("exists");
    assert_eq!(approval.status, ApprovalStatus::Approved, "not consumed");
    let s1 = log
        .saga(&SagaId::new("s1"))
        .await
        .expect("reads")
        .expect("exists");
    assert_eq!(s1.saga.state, SagaState::Acting, "the rest was written");
    assert!(s1.steps.is_empty());
}

/// Checks that the earlier step a call duplicates is found by its duplicate keys, within
/// the window, in another saga, and not when it failed.
pub async fn a_duplicate_is_found_by_its_keys_within_the_window(store: &dyn LogStore) {
    let log = store.open();
    log.write(vec![
        new_saga("p1"),
        begin_on("p1", 0, &["acct:bob"], &["inv:17"]),
        commit("p1", 0),
        set_state("p1", SagaState::Done),
        new_saga("p2"),
        begin_on("p2", 0, &["acct:bob"], &["inv:18"]),
        LogWrite::FailStep {
            saga_id: SagaId::new("p2"),
            step_seq: 0,
            error: agent_kernel_api::ToolError::failed("declined"),
        },
    ])
    .await
    .expect("writes");
    let other = SagaId::new("p3");
    let keys = |keys: &[&str]| keys.iter().map(|key| (*key).to_owned()).collect::<Vec<_>>();
    let found = log
        .duplicate_of(&other, "fs.write", &keys(&["inv:17"]), 0)
        .await
        .expect("reads")
        .expect("found");
    assert_eq!(found.saga_id, SagaId::new("p1"));
    assert_eq!(found.step_seq, 0);
    assert_eq!(found.key, "inv:17");
    assert_eq!(found.status, StepStatus::Commit);
    assert_eq!(found.args["path"], "a.txt");
    for (saga, tool, asked, since) in [
        (&other, "fs.write", &["inv:18"][..], 0),
        (&other, "fs.write", &["inv:19"][..], 0),
        (&other, "fs.append", &["inv:17"][..], 0),
        (&other, "fs.write", &["inv:17"][..], i64::MAX),
        (&SagaId::new("p1"), "fs.write", &["inv:17"][..], 0),
    ] {
        let found = log
            .duplicate_of(saga, tool, &keys(asked), since)
            .await
            .expect("reads");
        assert!(
            found.is_none(),
            "{saga} {tool} {asked:?} {since}: {found:?}"
        );
    }
}

/// Checks that a BEGIN asked to check for duplicates is refused, nothing of its step
/// written, when another saga's step declared one of its duplicate keys (begun, not yet
/// committed), but the step its approval was given over, which hides no other; without
/// the check, or with other keys, it is written.
pub async fn a_begin_that_repeats_a_step_begun_meanwhile_is_refused(store: &dyn LogStore) {
    let log = store.open();
    log.write(vec![
        new_saga("first"),
        begin_on("first", 0, &[], &["inv:17"]),
    ])
    .await
    .expect("writes");
    let outcomes = log
        .write(vec![
            new_saga("again"),
            begin_checked("again", 0, &["inv:17"], None),
        ])
        .await
        .expect("writes");
    let WriteOutcome::Duplicate(earlier) = &outcomes[1] else {
        panic!("a duplicate: {outcomes:?}");
    };
    assert_eq!(earlier.saga_id, SagaId::new("first"));
    assert_eq!(earlier.step_seq, 0);
    assert_eq!(earlier.key, "inv:17");
    assert_eq!(earlier.status, StepStatus::Begin);
    let again = log
        .saga(&SagaId::new("again"))
        .await
        .expect("reads")
        .expect("the rest of the batch was written");
    assert!(
        again.steps.is_empty(),
        "nothing of the refused step: {again:?}"
    );
    let found = log
        .duplicate_of(&SagaId::new("third"), "fs.write", &["inv:17".to_owned()], 0)
        .await
        .expect("reads")
        .expect("found");
    assert_eq!(
        found.saga_id,
        SagaId::new("first"),
        "the refused step declared nothing"
    );
    for (n, write) in [
        begin_checked("again", 0, &["inv:17"], Some(("first", 0))),
        begin_checked("again", 1, &["inv:18"], None),
        begin_on("again", 2, &[], &["inv:17"]),
    ]
    .into_iter()
    .enumerate()
    {
        let outcomes = log.write(vec![write]).await.expect("writes");
        assert!(
            matches!(outcomes[0], WriteOutcome::Written),
            "write {n}: {outcomes:?}"
        );
    }
    // The step an approval was given over hides no other: with `first`, `again` and
    // `second` begun, an approval over `second` is refused for one of the others.
    log.write(vec![
        new_saga("second"),
        begin_on("second", 0, &[], &["inv:17"]),
    ])
    .await
    .expect("writes");
    let outcomes = log
        .write(vec![
            new_saga("third"),
            begin_checked("third", 0, &["inv:17"], Some(("second", 0))),
        ])
        .await
        .expect("writes");
    let WriteOutcome::Duplicate(earlier) = &outcomes[1] else {
        panic!("a duplicate: {outcomes:?}");
    };
    assert_ne!(earlier.saga_id, SagaId::new("second"), "{earlier:?}");
}

/// How many connections race in the checks below.
const RACERS: usize = 4;

/// The outcomes of the second write of each of [`RACERS`] batches, `batch(n)` for racer
/// `n`, written at once from connections of their own.
async fn race(store: &dyn LogStore, batch: fn(usize) -> Vec<LogWrite>) -> Vec<WriteOutcome> {
    let logs: Vec<Arc<dyn TxLog>> = (0..RACERS).map(|_| store.open()).collect();
    let racing: Vec<_> = logs
        .iter()
        .enumerate()
        .map(|(n, log)| {
            let log = Arc::clone(log);
            tokio::spawn(async move { log.write(batch(n)).await.expect("writes") })
        })
        .collect();
    let mut outcomes = Vec::new();
    for task in racing {
        outcomes.push(task.await.expect("the task finished")[1].clone());
    }
    outcomes
}

/// Checks that BEGINs raced from several connections, each repeating the others' effect
/// and asking the log to check, are written once: the others are refused as duplicates.
pub async fn duplicate_begins_raced_from_several_connections_are_written_once(
    store: &dyn LogStore,
) {
    let outcomes = race(store, |n| {
        let id = format!("payer{n}");
        vec![new_saga(&id), begin_checked(&id, 0, &["inv:raced"], None)]
    })
    .await;
    let mut n_written = 0;
    for outcome in outcomes {
        match outcome {
            WriteOutcome::Written => n_written += 1,
            WriteOutcome::Duplicate(earlier) => assert_eq!(earlier.key, "inv:raced"),
            other => panic!("a BEGIN or a duplicate: {other:?}"),
        }
    }
    assert_eq!(n_written, 1, "exactly one BEGIN");
}

/// Checks that claims of one resource raced from several connections give it to one saga.
pub async fn a_resource_raced_from_several_connections_is_claimed_once(store: &dyn LogStore) {
    let outcomes = race(store, |n| {
        let id = format!("racer{n}");
        vec![new_saga(&id), begin_on(&id, 0, &["acct:shared"], &[])]
    })
    .await;
    let mut n_claimed = 0;
    for outcome in outcomes {
        match outcome {
            WriteOutcome::Written => n_claimed += 1,
            WriteOutcome::Conflict(holder) => assert_eq!(holder.resource, "acct:shared"),
            other => panic!("a claim or a conflict: {other:?}"),
        }
    }
    assert_eq!(n_claimed, 1, "exactly one claim");
}

/// What `log` answers to `writes`, which it must write.
async fn written(log: &dyn TxLog, writes: Vec<LogWrite>) -> Vec<WriteOutcome> {
    log.write(writes).await.expect("writes")
}

/// Saga `a` claiming `acct:a` through `first`, then saga `b` claiming `acct:b` through
/// `second`.
async fn a_and_b_claimed(first: &dyn TxLog, second: &dyn TxLog) {
    written(
        first,
        vec![new_saga("a"), begin_on("a", 0, &["acct:a"], &[])],
    )
    .await;
    written(
        second,
        vec![new_saga("b"), begin_on("b", 0, &["acct:b"], &[])],
    )
    .await;
}

/// Checks that a writer's claims see what another connection claimed and settled between
/// two of its own writes: a writer that kept what it read of the locks from its last
/// transaction must read again once another has committed.
pub async fn a_claim_sees_what_another_connection_claimed_and_settled(store: &dyn LogStore) {
    let (first, second) = (store.open(), store.open());
    let (first, second) = (first.as_ref(), second.as_ref());
    a_and_b_claimed(first, second).await;
    // The first writer's last transaction is no longer the newest: b's claim counts.
    let outcomes = written(
        first,
        vec![new_saga("c"), begin_on("c", 0, &["acct:b"], &[])],
    )
    .await;
    assert_eq!(refused_by(&outcomes, 1), SagaId::new("b"));
    // And the other way round, on what the first claimed since.
    written(first, vec![begin_on("c", 0, &["acct:c"], &[])]).await;
    let outcomes = written(
        second,
        vec![new_saga("d"), begin_on("d", 0, &["acct:c"], &[])],
    )
    .await;
    assert_eq!(refused_by(&outcomes, 1), SagaId::new("c"));
    // Settled by one connection, free for the other, and for the first again.
    written(first, vec![commit("a", 0), set_state("a", SagaState::Done)]).await;
    assert_eq!(
        written(second, vec![begin_on("d", 0, &["acct:a"], &[])]).await,
        [WriteOutcome::Written]
    );
    let outcomes = written(
        first,
        vec![new_saga("e"), begin_on("e", 0, &["acct:a"], &[])],
    )
    .await;
    assert_eq!(refused_by(&outcomes, 1), SagaId::new("d"));
}

/// Checks that a writer's claims see everything other connections claimed since its map of
/// locks was last up to date: across its own transactions that claimed nothing, the claims
/// made again by an undo, and more records than a writer catches up from one by one.
pub async fn a_claim_sees_every_claim_other_connections_made_since_it_last_claimed(
    store: &dyn LogStore,
) {
    let (first, second) = (store.open(), store.open());
    let (first, second) = (first.as_ref(), second.as_ref());
    a_and_b_claimed(first, second).await;
    // The first writes, claiming nothing (a settles); then the second claims again.
    written(first, vec![commit("a", 0), set_state("a", SagaState::Done)]).await;
    written(second, vec![begin_on("b", 1, &["acct:b2"], &[])]).await;
    let outcomes = written(
        first,
        vec![new_saga("c"), begin_on("c", 0, &["acct:b"], &[])],
    )
    .await;
    assert_eq!(
        refused_by(&outcomes, 1),
        SagaId::new("b"),
        "b's first claim"
    );
    let outcomes = written(first, vec![begin_on("c", 0, &["acct:b2"], &[])]).await;
    assert_eq!(
        refused_by(&outcomes, 0),
        SagaId::new("b"),
        "b's second claim"
    );
    // A settled saga's resources claimed again by the second (an undo) hold for the first,
    // whose map never saw a claim made again.
    written(
        second,
        vec![
            new_saga("d"),
            begin_on("d", 0, &["acct:d"], &[]),
            commit("d", 0),
            set_state("d", SagaState::Done),
        ],
    )
    .await;
    second
        .write(vec![LogWrite::ClaimLocks {
            saga_id: SagaId::new("d"),
        }])
        .await
        .expect("claimed again");
    let outcomes = written(first, vec![begin_on("c", 0, &["acct:d"], &[])]).await;
    assert_eq!(
        refused_by(&outcomes, 0),
        SagaId::new("d"),
        "d's claim made again"
    );
    // More records than a writer catches up from one by one (4,096): it reads every lock.
    for batch in 0..21 {
        let mut writes = Vec::new();
        for n in 0..100 {
            let id = format!("many{batch}-{n}");
            writes.push(new_saga(&id));
            writes.push(begin_on(&id, 0, &[&format!("acct:many{batch}-{n}")], &[]));
        }
        written(second, writes).await;
    }
    let outcomes = written(first, vec![begin_on("c", 0, &["acct:many20-99"], &[])]).await;
    assert_eq!(refused_by(&outcomes, 0), SagaId::new("many20-99"));
    assert_eq!(
        written(first, vec![begin_on("c", 0, &["acct:a"], &[])]).await,
        [WriteOutcome::Written],
        "a's claim is free once a is settled, and c's own",
    );
}

/// Checks that a step refused for one of its resources leaves its saga holding what an
/// earlier step of it declared, the refused step's other resources among them.
pub async fn a_refused_step_leaves_its_sagas_earlier_claims_held(store: &dyn LogStore) {
    let log = store.open();
    log.write(vec![
        new_saga("a"),
        begin_on("a", 0, &["acct:1"], &[]),
        new_saga("b"),
        begin_on("b", 0, &["acct:2"], &[]),
    ])
    .await
    .expect("writes");
    let outcomes = log
        .write(vec![
            commit("a", 0),
            begin_on("a", 1, &["acct:1", "acct:2"], &[]),
        ])
        .await
        .expect("writes");
    assert_eq!(refused_by(&outcomes, 1), SagaId::new("b"));
    let outcomes = log
        .write(vec![new_saga("c"), begin_on("c", 0, &["acct:1"], &[])])
        .await
        .expect("writes");
    assert_eq!(refused_by(&outcomes, 1), SagaId::new("a"));
    assert_eq!(locks_of(store, log.as_ref(), "a").await, ["acct:1"]);
}

/// Checks that the claims of one batch see each other: a saga the batch creates holds what
/// its step claimed against another saga's step later in the batch, and for good; a batch
/// that claims a settled saga's resources again beside another saga's claiming step is
/// refused whole.
pub async fn claims_in_one_batch_see_each_other(store: &dyn LogStore) {
    let log = store.open();
    let outcomes = log
        .write(vec![
            new_saga("a"),
            begin_on("a", 0, &["acct:1"], &[]),
            new_saga("b"),
            begin_on("b", 0, &["acct:1"], &[]),
        ])
        .await
        .expect("writes");
    assert_eq!(refused_by(&outcomes, 3), SagaId::new("a"));
    log.write(vec![set_state("b", SagaState::FailedRolledBack)])
        .await
        .expect("writes");
    let outcomes = log
        .write(vec![new_saga("c"), begin_on("c", 0, &["acct:1"], &[])])
        .await
        .expect("writes");
    assert_eq!(refused_by(&outcomes, 1), SagaId::new("a"));
    log.write(vec![commit("a", 0), set_state("a", SagaState::Done)])
        .await
        .expect("writes");
    let mixed = log
        .write(vec![
            LogWrite::ClaimLocks {
                saga_id: SagaId::new("a"),
            },
            begin_on("c", 0, &["acct:1"], &[]),
        ])
        .await;
    assert!(matches!(mixed, Err(TxError::Corrupt(_))), "{mixed:?}");
    assert!(
        locks_of(store, log.as_ref(), "a").await.is_empty(),
        "nothing of it"
    );
}

/// Checks that a step refused by its idempotency key, which an earlier step of its batch
/// took, claims none of its resources, whether or not the earlier step claimed any: another
/// saga may take them, but not one a later step of its saga declares. And that a step under
/// a key an earlier write of its batch freed (a step's certain failure), whether the key
/// was taken in the batch or before, is checked like any other.
pub async fn a_step_refused_by_its_key_claims_nothing(store: &dyn LogStore) {
    let log = store.open();
    let keyed = |saga: &str, step_seq: u32, resources: &[&str], key: &str| {
        let LogWrite::BeginStep(mut step) = begin_on(saga, step_seq, resources, &[]) else {
            unreachable!("begin_on begins a step")
        };
        step.idempotency_key = Some(key.to_owned());
        LogWrite::BeginStep(step)
    };
    let outcomes = log
        .write(vec![
            new_saga("a"),
            keyed("a", 0, &["file:/w/x"], "k"),
            keyed("a", 1, &["file:/w/y"], "k"),
            new_saga("b"),
            keyed("b", 0, &[], "m"),
            keyed("b", 1, &["file:/w/z"], "m"),
        ])
        .await
        .expect("writes");
    assert_eq!(outcomes[1], WriteOutcome::Written);
    assert_eq!(outcomes[4], WriteOutcome::Written);
    for at in [2, 5] {
        assert!(
            matches!(outcomes[at], WriteOutcome::KeyRejected(_)),
            "{at}: {outcomes:?}"
        );
    }
    assert_eq!(locks_of(store, log.as_ref(), "a").await, ["file:/w/x"]);
    assert!(locks_of(store, log.as_ref(), "b").await.is_empty());
    let outcomes = log
        .write(vec![
            new_saga("c"),
            begin_on("c", 0, &["file:/w/y", "file:/w/z"], &[]),
        ])
        .await
        .expect("writes");
    assert_eq!(outcomes[1], WriteOutcome::Written, "{outcomes:?}");
    let outcomes = log
        .write(vec![new_saga("d"), begin_on("d", 0, &["file:/w/x"], &[])])
        .await
        .expect("writes");
    assert_eq!(refused_by(&outcomes, 1), SagaId::new("a"));
    // The key taken and freed within one batch: the later step claims as any other, and
    // `c` holds what it would claim.
    let outcomes = log
        .write(vec![
            new_saga("e"),
            keyed("e", 0, &["file:/w/w"], "n"),
            LogWrite::FailStep {
                saga_id: SagaId::new("e"),
                step_seq: 0,
                error: ToolError::failed("refused by the server"),
            },
            keyed("e", 1, &["file:/w/y"], "n"),
        ])
        .await
        .expect("writes");
    assert_eq!(refused_by(&outcomes, 3), SagaId::new("c"));
    assert_eq!(locks_of(store, log.as_ref(), "e").await, ["file:/w/w"]);
    // The key bound before the batch and freed by it: the step is checked all the same.
    log.write(vec![new_saga("h"), keyed("h", 0, &["file:/w/u"], "p")])
        .await
        .expect("writes");
    let outcomes = log
        .write(vec![
            LogWrite::FailStep {
                saga_id: SagaId::new("h"),
                step_seq: 0,
                error: ToolError::failed("refused by the server"),
            },
            keyed("h", 1, &["file:/w/y"], "p"),
        ])
        .await
        .expect("writes");
    assert_eq!(refused_by(&outcomes, 1), SagaId::new("c"));
    // A step refused by its key gives back nothing a later step of its saga declares.
    let outcomes = log
        .write(vec![
            new_saga("f"),
            keyed("f", 0, &[], "q"),
            keyed("f", 1, &["file:/w/v"], "q"),
            begin_on("f", 2, &["file:/w/v"], &[]),
        ])
        .await
        .expect("writes");
    assert!(
        matches!(outcomes[2], WriteOutcome::KeyRejected(_)),
        "{outcomes:?}"
    );
    assert_eq!(outcomes[3], WriteOutcome::Written);
    let outcomes = log
        .write(vec![new_saga("g"), begin_on("g", 0, &["file:/w/v"], &[])])
        .await
        .expect("writes");
    assert_eq!(refused_by(&outcomes, 1), SagaId::new("f"));
}
