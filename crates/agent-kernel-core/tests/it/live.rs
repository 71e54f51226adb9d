//! Live sagas (reference §8): begun, called one step at a time, committed or aborted.

use std::sync::Arc;
use std::time::Duration;

use agent_kernel_api::{OnDenied, SagaId, SagaState, StepStatus, TxLog};
use agent_kernel_core::{
    BeginOptions, CallAnswer, Kernel, KernelError, NoObserver, ProblemKind, RecoveryAction,
    SagaReport,
};
use serde_json::{Value, json};

use crate::Fixture;
use crate::fsm::table_without;

/// The row that lets mutating steps follow one another: without it, the second is denied.
const ACTING_SELF_LOOP: &str =
    "[[transition]]\nfrom = \"Acting\"\nevent = \"ToolSucceeded\"\nto = \"Acting\"\n";

fn live_kernel(fixture: &Fixture, pid: u32) -> Arc<Kernel> {
    Arc::new(fixture.kernel(pid))
}

fn committed_output(answer: &CallAnswer) -> &Value {
    match answer {
        CallAnswer::Committed(step) => {
            assert_eq!(step.status, StepStatus::Commit);
            &step
                .output
                .as_ref()
                .expect("a committed step has its output")
                .data
        }
        other => panic!("expected the step committed, got {other:?}"),
    }
}

fn rolled_back(answer: CallAnswer) -> SagaReport {
    match answer {
        CallAnswer::Failed(report) | CallAnswer::Denied(report) => report,
        other => panic!("expected the saga rolled back, got {other:?}"),
    }
}

/// The audit records of `kind` in the fixture's log.
fn audit_kinds(fixture: &Fixture, kind: &str) -> Vec<Value> {
    fixture.audit_bodies(kind)
}

async fn saga_state(kernel: &Kernel, saga_id: &SagaId) -> SagaState {
    kernel
        .log()
        .saga(saga_id)
        .await
        .expect("reads")
        .expect("exists")
        .saga
        .state
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_chosen_from_the_previous_output_commits() {
    let fixture = Fixture::new();
    let kernel = live_kernel(&fixture, 1);
    let saga = kernel
        .begin(BeginOptions {
            name: Some("agent loop".into()),
            actor: None,
            ..BeginOptions::default()
        })
        .await
        .expect("begins");
    // Durable at once, waiting for its first call.
    assert_eq!(saga_state(&kernel, saga.id()).await, SagaState::Planning);
    let first = saga
        .call("ledger.add", json!({ "item": "order-7" }), None)
        .await
        .expect("calls");
    let item = committed_output(&first)["item"]
        .as_str()
        .expect("the output names the item")
        .to_owned();
    // The next step is computed from what the first one answered.
    let second = saga
        .call(
            "ledger.add",
            json!({ "item": format!("{item}-shipped") }),
            None,
        )
        .await
        .expect("calls");
    assert_eq!(committed_output(&second)["item"], "order-7-shipped");
    // The outcome is durable before the answer.
    let record = kernel
        .log()
        .saga(saga.id())
        .await
        .expect("reads")
        .expect("exists");
    assert_eq!(record.saga.n_steps, 0, "a live saga has no plan");
    assert!(
        record
            .steps
            .iter()
            .all(|step| step.status == StepStatus::Commit)
    );
    let report = saga.commit().await.expect("commits");
    assert_eq!(report.state, SagaState::Done);
    assert_eq!(report.steps.len(), 2);
    assert!(report.steps.iter().all(|step| step.output.is_some()));
    assert_eq!(saga_state(&kernel, saga.id()).await, SagaState::Done);
    assert_eq!(fixture.world.items(), ["order-7", "order-7-shipped"]);
    // Closed: no further call.
    assert!(matches!(
        saga.call("ledger.add", json!({ "item": "late" }), None)
            .await,
        Err(KernelError::SagaNotOpen(_))
    ));
    assert!(kernel.open_live_sagas().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aborted_live_saga_is_rolled_back_and_the_reason_recorded() {
    let fixture = Fixture::new();
    let kernel = live_kernel(&fixture, 1);
    let saga = kernel.begin(BeginOptions::default()).await.expect("begins");
    for item in ["a", "b"] {
        let answer = saga
            .call("ledger.add", json!({ "item": item }), None)
            .await
            .expect("calls");
        committed_output(&answer);
    }
    let report = saga
        .abort("the user changed their mind")
        .await
        .expect("aborts");
    assert_eq!(report.state, SagaState::FailedRolledBack);
    assert!(
        report
            .steps
            .iter()
            .all(|step| step.status == StepStatus::Compensated)
    );
    assert!(fixture.world.items().is_empty());
    let aborted = audit_kinds(&fixture, "SagaAborted");
    assert_eq!(aborted.len(), 1);
    assert_eq!(aborted[0]["cause"], "requested");
    assert_eq!(aborted[0]["reason"], "the user changed their mind");
    assert!(matches!(
        saga.abort("twice").await,
        Err(KernelError::SagaNotOpen(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_call_leaves_the_saga_open_and_is_audited() {
    let fixture = Fixture::new();
    let kernel = live_kernel(&fixture, 1);
    let saga = kernel.begin(BeginOptions::default()).await.expect("begins");
    let answer = saga
        .call("no.such.tool", json!({}), None)
        .await
        .expect("answers");
    let CallAnswer::Refused(problem) = &answer else {
        panic!("expected a refusal, got {answer:?}");
    };
    assert_eq!(problem.kind, ProblemKind::UnknownTool);
    assert!(answer.saga_open());
    let answer = saga
        .call("ledger.add", json!({ "itm": "typo" }), None)
        .await
        .expect("answers");
    assert!(
        matches!(&answer, CallAnswer::Refused(problem) if problem.kind == ProblemKind::InvalidArgs),
        "{answer:?}"
    );
    assert!(fixture.world.items().is_empty(), "nothing of it ran");
    // Still open and usable.
    committed_output(
        &saga
            .call("ledger.add", json!({ "item": "x" }), None)
            .await
            .expect("calls"),
    );
    assert_eq!(saga.commit().await.expect("commits").state, SagaState::Done);
    let refused = audit_kinds(&fixture, "CallRefused");
    assert_eq!(refused.len(), 2);
    let mut tools: Vec<&str> = refused
        .iter()
        .map(|body| body["tool"].as_str().expect("a tool"))
        .collect();
    tools.sort_unstable();
    assert_eq!(tools, ["ledger.add", "no.such.tool"]);
    assert!(
        refused
            .iter()
            .all(|body| body["saga_id"] == saga.id().as_str())
    );
    let record = kernel
        .log()
        .saga(saga.id())
        .await
        .expect("reads")
        .expect("exists");
    assert_eq!(record.steps.len(), 1, "refused calls are not steps");
    assert_log_verifies(&fixture);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_call_rolls_the_saga_back_and_says_what_was_compensated() {
    let fixture = Fixture::new();
    let kernel = live_kernel(&fixture, 1);
    let saga = kernel.begin(BeginOptions::default()).await.expect("begins");
    committed_output(
        &saga
            .call("ledger.add", json!({ "item": "a" }), None)
            .await
            .expect("calls"),
    );
    let answer = saga.call("boom", json!({}), None).await.expect("answers");
    assert!(matches!(answer, CallAnswer::Failed(_)), "{answer:?}");
    assert!(!answer.saga_open());
    let report = rolled_back(answer);
    assert_eq!(report.state, SagaState::FailedRolledBack);
    assert_eq!(report.steps[0].status, StepStatus::Compensated);
    assert_eq!(report.failure.as_ref().expect("a failure").step_seq, 1);
    assert!(fixture.world.items().is_empty());
    assert!(matches!(
        saga.commit().await,
        Err(KernelError::SagaNotOpen(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_the_fsm_denies_rolls_the_saga_back() {
    // A table without `Acting --ToolSucceeded--> Acting`: two mutating steps in a row are
    // denied, as for a plan.
    let mut fixture = Fixture::new();
    fixture.fsm = table_without(ACTING_SELF_LOOP);
    let kernel = live_kernel(&fixture, 1);
    let saga = kernel.begin(BeginOptions::default()).await.expect("begins");
    committed_output(
        &saga
            .call("ledger.add", json!({ "item": "a" }), None)
            .await
            .expect("calls"),
    );
    let answer = saga
        .call("ledger.add", json!({ "item": "b" }), None)
        .await
        .expect("answers");
    assert!(matches!(answer, CallAnswer::Denied(_)), "{answer:?}");
    let report = rolled_back(answer);
    assert!(report.is_denied());
    assert_eq!(report.state, SagaState::FailedRolledBack);
    assert!(fixture.world.items().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saga_that_refuses_denials_stays_open_after_one() {
    // The same table: the FSM denies a second mutating step; the tool's check denies a
    // forbidden item, as the sandbox denies a path outside its roots.
    let mut fixture = Fixture::new();
    fixture.fsm = table_without(ACTING_SELF_LOOP);
    let kernel = live_kernel(&fixture, 1);
    let saga = kernel
        .begin(BeginOptions {
            on_denied: OnDenied::Refuse,
            ..BeginOptions::default()
        })
        .await
        .expect("begins");
    let first = saga
        .call(
            "ledger.add",
            json!({ "item": "x", "forbidden": true }),
            None,
        )
        .await
        .expect("answers");
    let CallAnswer::Refused(problem) = first else {
        panic!("{first:?}")
    };
    assert_eq!(problem.kind, ProblemKind::Denied);
    assert!(problem.message.contains("forbidden"), "{problem}");
    committed_output(
        &saga
            .call("ledger.add", json!({ "item": "a" }), None)
            .await
            .expect("calls"),
    );
    let second = saga
        .call("ledger.add", json!({ "item": "b" }), None)
        .await
        .expect("answers");
    let CallAnswer::Refused(problem) = second else {
        panic!("{second:?}")
    };
    assert_eq!(problem.kind, ProblemKind::Denied);
    assert!(problem.message.contains("ToolSucceeded"), "{problem}");
    // Nothing of either ran, both refusals are in the chain, and the saga ends as if they
    // had not been made.
    assert_eq!(fixture.world.items(), ["a"]);
    let refused = audit_kinds(&fixture, "CallRefused");
    assert_eq!(refused.len(), 2, "{refused:?}");
    let report = saga.commit().await.expect("commits");
    assert_eq!(report.state, SagaState::Done);
    assert_eq!(report.steps.len(), 1);
    assert_eq!(fixture.world.items(), ["a"]);
    let audit = fixture.verify();
    assert!(audit.is_intact(), "{:?}", audit.first_bad);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_live_sagas_at_once_end_as_their_drivers_chose() {
    const N_SAGAS: usize = 32;
    let fixture = Fixture::new();
    let kernel = live_kernel(&fixture, 1);
    let tasks: Vec<_> = (0..N_SAGAS)
        .map(|saga_idx| {
            let kernel = Arc::clone(&kernel);
            tokio::spawn(async move {
                let saga = kernel
                    .begin(BeginOptions {
                        name: None,
                        actor: Some(format!("agent-{saga_idx}")),
                        ..BeginOptions::default()
                    })
                    .await
                    .expect("begins");
                for step_idx in 0..3 {
                    let answer = saga
                        .call(
                            "ledger.add",
                            json!({ "item": format!("s{saga_idx}-{step_idx}") }),
                            None,
                        )
                        .await
                        .expect("calls");
                    assert!(matches!(answer, CallAnswer::Committed(_)), "{answer:?}");
                }
                let report = if saga_idx % 2 == 0 {
                    saga.commit().await.expect("commits")
                } else {
                    saga.abort("odd").await.expect("aborts")
                };
                (saga_idx, report)
            })
        })
        .collect();
    assert!(kernel.open_live_sagas().len() <= N_SAGAS);
    for task in tasks {
        let (saga_idx, report) = task.await.expect("the task ends");
        let expected = if saga_idx % 2 == 0 {
            SagaState::Done
        } else {
            SagaState::FailedRolledBack
        };
        assert_eq!(report.state, expected, "saga {saga_idx}");
    }
    let mut items = fixture.world.items();
    items.sort();
    let mut expected: Vec<String> = (0..N_SAGAS)
        .filter(|saga_idx| saga_idx % 2 == 0)
        .flat_map(|saga_idx| (0..3).map(move |step_idx| format!("s{saga_idx}-{step_idx}")))
        .collect();
    expected.sort();
    assert_eq!(items, expected);
    assert!(kernel.open_live_sagas().is_empty());
    assert_log_verifies(&fixture);
}

/// Group commit (issue 14) keeps the first promise: 64 live sagas call at once, so their
/// BEGINs share transactions, and every effect, run while the others commit, finds its own
/// BEGIN already in the log through a connection of its own (committed, never pending).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_group_commit_every_effect_finds_its_begin_in_the_log() {
    const N_SAGAS: usize = 64;
    const N_STEPS: usize = 4;
    let mut fixture = Fixture::new();
    fixture.limits.open_sagas_max = N_SAGAS;
    // On SQLite the writer's group counts are read too (PostgreSQL has no group commit).
    let sqlite = fixture.open_sqlite();
    let log: Arc<dyn TxLog> = match &sqlite {
        Some(sqlite) => sqlite.clone(),
        None => fixture.open_log(),
    };
    let kernel = Arc::new(fixture.kernel_over(log, fixture.open_log(), 1));
    let tasks: Vec<_> = (0..N_SAGAS)
        .map(|_| {
            let kernel = Arc::clone(&kernel);
            tokio::spawn(async move {
                let saga = kernel.begin(BeginOptions::default()).await.expect("begins");
                let mut seen = Vec::new();
                for _ in 0..N_STEPS {
                    let answer = saga.call("probe", json!({}), None).await.expect("calls");
                    seen.push(committed_output(&answer)["own_step"].clone());
                }
                assert_eq!(saga.commit().await.expect("commits").state, SagaState::Done);
                seen
            })
        })
        .collect();
    for task in tasks {
        let seen = task.await.expect("the task ends");
        assert_eq!(seen, vec![json!("BEGIN"); N_STEPS]);
    }
    if let Some(sqlite) = sqlite {
        let groups = sqlite.group_stats();
        assert!(
            groups.batches_max > 1,
            "no two batches shared a transaction: {groups:?}"
        );
    }
    assert_log_verifies(&fixture);
}

/// The fixture's log passes `audit verify`: live sagas, refusals and aborts chain like
/// every other record.
fn assert_log_verifies(fixture: &Fixture) {
    let report = fixture.verify();
    assert!(report.is_intact(), "{report:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_idle_timeout_rolls_back_an_abandoned_saga() {
    let mut fixture = Fixture::new();
    fixture.limits.saga_idle_timeout_ms = 150;
    let kernel = live_kernel(&fixture, 1);
    let saga = kernel.begin(BeginOptions::default()).await.expect("begins");
    committed_output(
        &saga
            .call("ledger.add", json!({ "item": "forgotten" }), None)
            .await
            .expect("calls"),
    );
    let saga_id = saga.id().clone();
    drop(saga);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while kernel.live_saga(&saga_id).is_some() {
        assert!(tokio::time::Instant::now() < deadline, "never rolled back");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The rollback is written before the saga leaves the registry's lock.
    let state = saga_state(&kernel, &saga_id).await;
    assert_eq!(state, SagaState::FailedRolledBack);
    assert!(fixture.world.items().is_empty());
    let aborted = audit_kinds(&fixture, "SagaAborted");
    assert_eq!(aborted.len(), 1);
    assert_eq!(aborted[0]["cause"], "idle_timeout");
    assert_log_verifies(&fixture);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_saga_past_open_sagas_max_is_refused() {
    let mut fixture = Fixture::new();
    fixture.limits.open_sagas_max = 4;
    let kernel = live_kernel(&fixture, 1);
    let mut open = Vec::new();
    for _ in 0..4 {
        open.push(kernel.begin(BeginOptions::default()).await.expect("begins"));
    }
    let error = kernel
        .begin(BeginOptions::default())
        .await
        .expect_err("one too many");
    assert!(
        matches!(error, KernelError::TooManyOpenSagas { max: 4 }),
        "{error}"
    );
    assert!(error.to_string().contains("open_sagas_max"), "{error}");
    assert!(error.is_bad_input());
    // Committing or aborting one frees a place.
    open.pop()
        .expect("one")
        .abort("make room")
        .await
        .expect("aborts");
    kernel
        .begin(BeginOptions::default())
        .await
        .expect("begins again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_actor_drives_one_saga_at_a_time() {
    let fixture = Fixture::new();
    let kernel = live_kernel(&fixture, 1);
    let actor = BeginOptions {
        name: None,
        actor: Some("agent".into()),
        ..BeginOptions::default()
    };
    let first = kernel.begin(actor.clone()).await.expect("begins");
    let error = kernel.begin(actor.clone()).await.expect_err("busy");
    assert!(error.is_denied(), "{error}");
    assert_eq!(audit_kinds(&fixture, "PlanDenied").len(), 1);
    committed_output(
        &first
            .call("ledger.add", json!({ "item": "a" }), None)
            .await
            .expect("calls"),
    );
    first.commit().await.expect("commits");
    kernel.begin(actor).await.expect("idle again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saga_without_a_step_commits_done() {
    let fixture = Fixture::new();
    let kernel = live_kernel(&fixture, 1);
    let actor = BeginOptions {
        name: None,
        actor: Some("agent".into()),
        ..BeginOptions::default()
    };
    let saga = kernel.begin(actor.clone()).await.expect("begins");
    let report = saga.commit().await.expect("commits");
    assert_eq!(report.state, SagaState::Done);
    assert!(report.steps.is_empty());
    assert_eq!(saga_state(&kernel, saga.id()).await, SagaState::Done);
    // The actor is free again, and the chain holds the move from Planning to Done.
    kernel.begin(actor).await.expect("idle again");
    let audit = fixture.verify();
    assert!(audit.is_intact(), "{:?}", audit.first_bad);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_without_the_empty_commit_row_rolls_an_empty_saga_back() {
    let mut fixture = Fixture::new();
    fixture.fsm = table_without(
        "[[transition]]\nfrom = \"Planning\"\nevent = \"ValidationPassed\"\nto = \"Done\"\nguard = \"saga_complete\"\n",
    );
    let kernel = live_kernel(&fixture, 1);
    let saga = kernel.begin(BeginOptions::default()).await.expect("begins");
    let error = saga.commit().await.expect_err("denied");
    assert!(error.is_denied(), "{error}");
    assert!(error.to_string().contains("ValidationPassed"), "{error}");
    assert_eq!(
        saga_state(&kernel, saga.id()).await,
        SagaState::FailedRolledBack
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_reuses_a_committed_output_across_live_sagas() {
    let fixture = Fixture::new();
    let kernel = live_kernel(&fixture, 1);
    for round in 0..2 {
        let saga = kernel.begin(BeginOptions::default()).await.expect("begins");
        let answer = saga
            .call(
                "ledger.add",
                json!({ "item": "once" }),
                Some("order-1".into()),
            )
            .await
            .expect("calls");
        let CallAnswer::Committed(step) = &answer else {
            panic!("{answer:?}");
        };
        assert_eq!(step.reused, round == 1, "round {round}");
        saga.commit().await.expect("commits");
    }
    assert_eq!(fixture.world.items(), ["once"], "the effect happened once");
    // The same key with other arguments is refused, the saga left open.
    let saga = kernel.begin(BeginOptions::default()).await.expect("begins");
    let answer = saga
        .call(
            "ledger.add",
            json!({ "item": "other" }),
            Some("order-1".into()),
        )
        .await
        .expect("answers");
    assert!(
        matches!(&answer, CallAnswer::Refused(problem) if problem.kind == ProblemKind::KeyConflict),
        "{answer:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_live_saga_of_a_dead_process_is_recovered() {
    let fixture = Fixture::new();
    let saga_id = {
        let kernel = live_kernel(&fixture, 41);
        let saga = kernel.begin(BeginOptions::default()).await.expect("begins");
        for item in ["a", "b"] {
            committed_output(
                &saga
                    .call("ledger.add", json!({ "item": item }), None)
                    .await
                    .expect("calls"),
            );
        }
        // The process dies with the saga open: nothing more is written.
        saga.id().clone()
    };
    let open = fixture.kernel(42);
    assert_eq!(saga_state(&open, &saga_id).await, SagaState::Acting);
    fixture.kill([41]);
    let report = open.recover(&NoObserver).await.expect("recovers");
    let [RecoveryAction::RolledBack(saga)] = &report.sagas[..] else {
        panic!("{report:?}");
    };
    assert_eq!(saga.state, SagaState::FailedRolledBack);
    assert!(fixture.world.items().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_used_twice_in_one_saga_is_refused_and_the_saga_stays_open() {
    let fixture = Fixture::new();
    let kernel = live_kernel(&fixture, 1);
    let saga = kernel.begin(BeginOptions::default()).await.expect("begins");
    committed_output(
        &saga
            .call("ledger.add", json!({ "item": "k" }), Some("same".into()))
            .await
            .expect("calls"),
    );
    let answer = saga
        .call("ledger.add", json!({ "item": "k" }), Some("same".into()))
        .await
        .expect("answers");
    assert!(
        matches!(&answer, CallAnswer::Refused(problem) if problem.kind == ProblemKind::KeyConflict),
        "{answer:?}"
    );
    assert_eq!(saga.commit().await.expect("commits").state, SagaState::Done);
    assert_eq!(fixture.world.items(), ["k"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_in_the_process_that_holds_a_live_saga_leaves_it_alone() {
    let fixture = Fixture::new();
    let kernel = live_kernel(&fixture, 1);
    let saga = kernel.begin(BeginOptions::default()).await.expect("begins");
    committed_output(
        &saga
            .call("ledger.add", json!({ "item": "held" }), None)
            .await
            .expect("calls"),
    );
    let report = kernel.recover(&NoObserver).await.expect("recovers");
    assert!(
        matches!(report.sagas[..], [RecoveryAction::SkippedLive { .. }]),
        "{report:?}"
    );
    assert!(kernel.rollback(saga.id(), &NoObserver).await.is_err());
    assert_eq!(fixture.world.items(), ["held"]);
    assert_eq!(saga.commit().await.expect("commits").state, SagaState::Done);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_call_frees_its_place_and_leaves_the_saga_to_recover() {
    let mut fixture = Fixture::new();
    fixture.limits.open_sagas_max = 1;
    let kernel = live_kernel(&fixture, 1);
    let saga = kernel.begin(BeginOptions::default()).await.expect("begins");
    // The caller stops waiting while the tool sleeps.
    let abandoned = tokio::time::timeout(
        Duration::from_millis(100),
        saga.call(
            "ledger.add",
            json!({ "item": "slow", "sleep_ms": 5000 }),
            None,
        ),
    )
    .await;
    assert!(abandoned.is_err(), "still running when abandoned");
    assert!(matches!(
        saga.call("ledger.add", json!({ "item": "x" }), None).await,
        Err(KernelError::SagaNotOpen(_))
    ));
    kernel
        .begin(BeginOptions::default())
        .await
        .expect("its place in open_sagas_max is free again");
}

/// More open sagas of a dead process than recovery takes over at once
/// (`RECOVER_GROUP_SAGAS`): every one is rolled back, reported newest first, and their
/// compensations ran group after group, newest first, as the order of their records in the
/// chain shows (within a group, sagas on different items are compensated at the same time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_sagas_of_a_dead_process_in_several_groups_are_undone_newest_first() {
    let fixture = Fixture::new();
    let n_sagas = agent_kernel_core::RECOVER_GROUP_SAGAS + 6;
    let mut saga_ids = Vec::new();
    // Two processes, since one holds at most 64 open sagas.
    for (pid, n_of_process) in [(43, n_sagas / 2), (45, n_sagas - n_sagas / 2)] {
        let kernel = live_kernel(&fixture, pid);
        for _ in 0..n_of_process {
            let n = saga_ids.len();
            let saga = kernel.begin(BeginOptions::default()).await.expect("begins");
            committed_output(
                &saga
                    .call("ledger.add", json!({ "item": format!("item-{n}") }), None)
                    .await
                    .expect("calls"),
            );
            saga_ids.push(saga.id().to_string());
        }
        // The process dies with every saga open.
    }
    assert_eq!(fixture.world.items().len(), n_sagas);
    fixture.kill([43, 45]);
    let report = fixture
        .kernel(44)
        .recover(&NoObserver)
        .await
        .expect("recovers");
    let reported: Vec<String> = report
        .sagas
        .iter()
        .map(|action| match action {
            RecoveryAction::RolledBack(saga) if saga.state == SagaState::FailedRolledBack => {
                saga.saga_id.to_string()
            }
            other => panic!("{other:?}"),
        })
        .collect();
    // Newest first: the two processes' clocks tie here, so each one's sagas in reverse.
    let mut every = reported.clone();
    every.sort();
    let mut expected = saga_ids.clone();
    expected.sort();
    assert_eq!(every, expected);
    for prefix in ["p43-", "p45-"] {
        let of_process = |ids: &[String]| -> Vec<String> {
            ids.iter()
                .filter(|id| id.starts_with(prefix))
                .cloned()
                .collect()
        };
        let mut created = of_process(&saga_ids);
        created.reverse();
        assert_eq!(of_process(&reported), created);
    }
    assert!(fixture.world.items().is_empty());
    // The outcomes were written group after group, in the report's order of groups.
    let compensated: Vec<String> = fixture
        .audit_bodies("Compensation")
        .iter()
        .rev()
        .map(|body| body["saga_id"].as_str().expect("a saga").to_owned())
        .collect();
    let groups = |ids: &[String]| -> Vec<Vec<String>> {
        ids.chunks(agent_kernel_core::RECOVER_GROUP_SAGAS)
            .map(|group| {
                let mut group = group.to_vec();
                group.sort();
                group
            })
            .collect()
    };
    assert_eq!(groups(&compensated), groups(&reported));
    assert!(fixture.verify().is_intact());
}

/// A `resume` of a saga that waits for nothing is refused and leaves the saga open, as it
/// was: it can still be called and committed (a second `resume` after an approved step ran
/// once took the saga out of the process's reach, holding its locks until `recover`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_of_a_saga_that_waits_for_nothing_leaves_it_open() {
    let fixture = Fixture::new();
    let kernel = live_kernel(&fixture, 1);
    let saga = kernel.begin(BeginOptions::default()).await.expect("begins");
    let first = saga
        .call("ledger.add", json!({ "item": "a" }), None)
        .await
        .expect("calls");
    committed_output(&first);
    let refused = saga.resume().await;
    assert!(
        matches!(refused, Err(KernelError::NotAwaitingApproval { .. })),
        "{refused:?}"
    );
    assert!(kernel.live_saga(saga.id()).is_some(), "still open here");
    let second = saga
        .call("ledger.add", json!({ "item": "b" }), None)
        .await
        .expect("calls again");
    committed_output(&second);
    let report = saga.commit().await.expect("commits");
    assert_eq!(report.state, SagaState::Done);
    assert_eq!(report.steps.len(), 2);
    assert_eq!(fixture.world.items(), ["a", "b"]);
}
