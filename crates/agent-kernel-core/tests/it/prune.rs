//! Prune (issue 14), a property test over random histories: every prune removes exactly the
//! sagas its rules allow (settled for good before the horizon, no open dead letter, no open
//! request, outside every undo window), never an open one, one waiting for an approval or
//! one left `FailedRollbackPartial`;
//! the chain verifies after every prune; `recover` still rolls back what dead processes
//! left, and nothing else.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use agent_kernel_api::{
    ApprovalStatus, Clock, EffectClass, Plan, PlanStep, SagaRecord, SagaState, StepStatus,
    UndoWindow,
};
use agent_kernel_core::{BeginOptions, CallAnswer, Kernel, LiveSaga, NoObserver, RecoveryAction};
use serde_json::json;

use crate::{Fixture, Rng, abandon_when, add, boom, probe};

/// Histories run, each from its own seed.
const HISTORIES: u64 = 6;
/// Sagas in one history.
const SAGAS: u64 = 40;
/// The undo window of every reversible tool in these histories, in ms.
const WINDOW_MS: u64 = 400;

/// Time the test moves by hand; each reading still advances it a millisecond, so records
/// keep their order.
struct ManualClock(AtomicI64);

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.0.fetch_add(1, Ordering::Relaxed)
    }
}

/// A plan of no actor, so sagas left open never make others wait.
fn free_plan(steps: Vec<PlanStep>) -> Plan {
    Plan {
        name: Some("prune".into()),
        actor: None,
        steps,
    }
}

/// What the rules say of `record` (with its open letters and request) at a prune of
/// horizon `before_ms` run at `now_ms`.
fn prunable(
    record: &SagaRecord,
    open_letters: usize,
    request_open: bool,
    before_ms: i64,
    now_ms: i64,
) -> bool {
    let in_window = record.saga.state == SagaState::Done
        && record.steps.iter().any(|step| {
            step.status == StepStatus::Commit
                && step.reused_from.is_none()
                && step.effect != EffectClass::ReadOnly
                && step.tool_id != "send.once"
                && now_ms <= step.updated_at_ms + WINDOW_MS as i64
        });
    matches!(
        record.saga.state,
        SagaState::Done | SagaState::FailedRolledBack | SagaState::Undone
    ) && record.saga.updated_at_ms < before_ms
        && open_letters == 0
        && !request_open
        && !in_window
}

/// Every saga of the log with what the rules look at.
async fn snapshot(log: &dyn agent_kernel_api::TxLog) -> Vec<(SagaRecord, usize, bool)> {
    let mut sagas = Vec::new();
    for summary in log.sagas(10_000).await.expect("lists") {
        let record = log
            .saga(&summary.saga_id)
            .await
            .expect("reads")
            .expect("listed");
        let letters = log
            .open_dead_letters(Some(&summary.saga_id))
            .await
            .expect("reads");
        let request_open = log
            .saga_approval(&summary.saga_id)
            .await
            .expect("reads")
            .is_some_and(|request| {
                matches!(
                    request.status,
                    ApprovalStatus::Pending | ApprovalStatus::Approved
                )
            });
        sagas.push((record, letters.len(), request_open));
    }
    sagas
}

/// Prunes at a random horizon and checks the outcome against the rules and the chain.
async fn prune_and_check(
    seed: u64,
    fixture: &Fixture,
    log: &dyn agent_kernel_api::TxLog,
    kernel: &Kernel,
    older_than_ms: u64,
) -> u64 {
    let before = snapshot(log).await;
    let report = kernel.prune(older_than_ms).await.expect("prunes");
    let now_ms = report.before_ms + older_than_ms as i64;
    let mut n_expected = 0;
    for (record, open_letters, request_open) in &before {
        let expected = prunable(
            record,
            *open_letters,
            *request_open,
            report.before_ms,
            now_ms,
        );
        n_expected += u64::from(expected);
        let kept = log
            .saga(&record.saga.saga_id)
            .await
            .expect("reads")
            .is_some();
        assert_eq!(
            kept,
            !expected,
            "seed {seed}: saga {} ({}, updated {}, {} open letters, request open {request_open}) at horizon {} now {now_ms}",
            record.saga.saga_id,
            record.saga.state,
            record.saga.updated_at_ms,
            open_letters,
            report.before_ms
        );
    }
    assert_eq!(report.n_sagas, n_expected, "seed {seed}: {report:?}");
    let verified = fixture.verify();
    assert!(verified.is_intact(), "seed {seed}: {verified:#?}");
    report.n_sagas
}

async fn history(seed: u64) -> (u64, u64) {
    let mut rng = Rng(seed);
    let clock = Arc::new(ManualClock(AtomicI64::new(1_800_000_000_000)));
    let mut fixture = Fixture::new();
    fixture.limits.undo_window = UndoWindow::from_ms(WINDOW_MS).expect("a window");
    fixture.clock = Some(clock.clone());
    let log = fixture.open_log();
    let kernel = Arc::new(fixture.kernel_on(log.clone(), 1));
    let dead = fixture.kernel_on(log.clone(), 2);
    // Live sagas held open (one of them waiting for an approval) stay open to the end.
    let mut held: Vec<LiveSaga> = Vec::new();
    let mut n_abandoned = 0;
    let mut n_pruned = 0;
    for saga_idx in 0..SAGAS {
        let item = format!("s{seed}-{saga_idx}");
        match rng.below(8) {
            0 | 1 => {
                let steps = (0..=rng.below(3))
                    .map(|step| add(&format!("{item}-{step}")))
                    .collect();
                let report = kernel.run(&free_plan(steps), &NoObserver).await;
                assert_eq!(report.expect("runs").state, SagaState::Done);
            }
            2 => {
                let report = kernel
                    .run(&free_plan(vec![add(&item), boom()]), &NoObserver)
                    .await;
                assert_eq!(report.expect("runs").state, SagaState::FailedRolledBack);
            }
            3 => {
                // Its compensation fails: a dead letter, resolved by an operator or not.
                let report = kernel
                    .run(
                        &free_plan(vec![add(&format!("stuck-{item}")), boom()]),
                        &NoObserver,
                    )
                    .await
                    .expect("runs");
                assert_eq!(report.state, SagaState::FailedRollbackPartial);
                if rng.below(2) == 0 {
                    for letter in kernel
                        .dead_letters(Some(&report.saga_id))
                        .await
                        .expect("lists")
                    {
                        kernel
                            .resolve_dead_letter(&letter.letter_id, "done by hand".into(), None)
                            .await
                            .expect("resolves");
                    }
                }
            }
            4 => {
                let saga = kernel.begin(BeginOptions::default()).await.expect("begins");
                let answer = saga
                    .call("send.once", json!({ "item": item }), None)
                    .await
                    .expect("calls");
                assert!(
                    matches!(answer, CallAnswer::AwaitingApproval(_)),
                    "{answer:?}"
                );
                held.push(saga);
            }
            5 => {
                let saga = kernel.begin(BeginOptions::default()).await.expect("begins");
                let answer = saga
                    .call("ledger.add", json!({ "item": item }), None)
                    .await
                    .expect("calls");
                assert!(matches!(answer, CallAnswer::Committed(_)), "{answer:?}");
                held.push(saga);
            }
            6 => {
                let report = kernel
                    .run(&free_plan(vec![probe(json!({}))]), &NoObserver)
                    .await;
                assert_eq!(report.expect("runs").state, SagaState::Done);
            }
            _ => {
                // A process that dies mid-saga (pid 2, killed at the end).
                let world = fixture.world.clone();
                let marker = item.clone();
                abandon_when(
                    &dead,
                    &free_plan(vec![add(&item), probe(json!({ "sleep_ms": 60_000 }))]),
                    move || world.items().contains(&marker),
                )
                .await;
                n_abandoned += 1;
            }
        }
        clock.0.fetch_add(
            i64::try_from(rng.below(200)).expect("small"),
            Ordering::Relaxed,
        );
        if rng.below(6) == 0 {
            let older_than = rng.below(1_500);
            n_pruned += prune_and_check(seed, &fixture, &*log, &kernel, older_than).await;
        }
    }
    // Past every window: all that is finished and settled goes.
    clock.0.fetch_add(10_000, Ordering::Relaxed);
    n_pruned += prune_and_check(seed, &fixture, &*log, &kernel, 0).await;

    // Recovery is unaffected: the dead process's sagas are rolled back, the live ones kept.
    fixture.kill([2]);
    let recovered = fixture
        .kernel_on(log.clone(), 3)
        .recover(&NoObserver)
        .await
        .expect("recovers");
    let n_rolled_back = recovered
        .sagas
        .iter()
        .filter(|action| {
            matches!(action, RecoveryAction::RolledBack(report) if report.state == SagaState::FailedRolledBack)
        })
        .count();
    assert_eq!(n_rolled_back, n_abandoned, "seed {seed}: {recovered:?}");
    for saga in &held {
        assert!(
            log.saga(saga.id()).await.expect("reads").is_some(),
            "seed {seed}: an open saga was pruned"
        );
    }
    n_pruned += prune_and_check(seed, &fixture, &*log, &kernel, 0).await;
    (n_pruned, held.len() as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_removes_exactly_what_its_rules_allow_over_random_histories() {
    let base = crate::seed_from_env("AGENT_KERNEL_PRUNE_SEED");
    eprintln!("prune property test: seed {base} (AGENT_KERNEL_PRUNE_SEED={base} reproduces)");
    let (mut n_pruned, mut n_held) = (0, 0);
    for history_idx in 0..HISTORIES {
        let (pruned, held) = history(base.wrapping_add(history_idx)).await;
        n_pruned += pruned;
        n_held += held;
    }
    eprintln!("prune property test: {n_pruned} sagas pruned, {n_held} held open to the end");
    assert!(
        n_pruned > 0 && n_held > 0,
        "seed {base}: a history too tame"
    );
}
