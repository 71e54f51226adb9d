//! Recovery of sagas left unfinished by dead processes (reference §6.1, §6.2).

use agent_kernel_api::{SagaState, StepStatus, ToolError};
use agent_kernel_core::{NoObserver, RecoveryAction};
use serde_json::{Value, json};
use std::time::Duration;

use crate::{Fixture, World, add, plan};

/// The longest a compensation with `after` waits for its item to leave the world.
const AFTER_WAIT_MAX: Duration = Duration::from_secs(10);

/// What `ledger.add`'s compensation does before it removes its item, as its arguments say:
/// `yields: N` notes `compensating ITEM` and yields to the runtime N times; `after: ITEM`
/// waits until that item has left the world, and fails after [`AFTER_WAIT_MAX`].
pub(crate) async fn before_removing(world: &World, args: &Value) -> Result<(), ToolError> {
    if let Some(yields) = args.get("yields").and_then(Value::as_u64) {
        world.note(format!("compensating {}", args["item"]));
        for _ in 0..yields {
            tokio::task::yield_now().await;
        }
    }
    let Some(after) = args.get("after").and_then(Value::as_str) else {
        return Ok(());
    };
    let deadline = tokio::time::Instant::now() + AFTER_WAIT_MAX;
    loop {
        let removed = world.removed.notified();
        tokio::pin!(removed);
        removed.as_mut().enable();
        if !world.items().iter().any(|item| item == after) {
            return Ok(());
        }
        if tokio::time::timeout_at(deadline, removed).await.is_err() {
            return Err(ToolError::failed(format!(
                "{after} was still in the world after {AFTER_WAIT_MAX:?}"
            )));
        }
    }
}

/// Starts a saga of one step as process `pid`, its call `args` (with `item`), and abandons it
/// once the effect is in the world.
async fn abandon_one_step(fixture: &Fixture, pid: u32, mut args: Value) {
    let item = args["item"].as_str().expect("an item").to_owned();
    args["sleep_ms"] = json!(60_000);
    let mut step = add(&item);
    step.args = args;
    let mut plan = plan(vec![step]);
    plan.actor = Some(format!("actor-{item}"));
    crate::abandon_when(&fixture.kernel(pid), &plan, || {
        fixture.world.items().contains(&item)
    })
    .await;
}

/// The position of `entry` in the world's journal.
fn noted_at(world: &World, entry: &str) -> usize {
    world
        .journal()
        .iter()
        .position(|noted| noted == entry)
        .unwrap_or_else(|| panic!("`{entry}` is not in the journal {:?}", world.journal()))
}

/// Starts a saga as process `pid` and abandons it while its third step is executing, as a
/// killed process would: the log holds two COMMITs and one BEGIN without outcome.
async fn crash_mid_saga(fixture: &Fixture, pid: u32, prefix: &str) {
    let kernel = fixture.kernel(pid);
    let mut slow = add(&format!("{prefix}-c"));
    slow.args = json!({ "item": format!("{prefix}-c"), "sleep_ms": 60_000 });
    let steps = vec![
        add(&format!("{prefix}-a")),
        add(&format!("{prefix}-b")),
        slow,
    ];
    // One actor per saga: the FSM lets an actor have only one saga in progress.
    let mut plan = plan(steps);
    plan.actor = Some(format!("actor-{prefix}"));
    // Abandoned once the slow third step's effect is applied (its BEGIN is durable then).
    let last = format!("{prefix}-c");
    crate::abandon_when(&kernel, &plan, || fixture.world.items().contains(&last)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_doubt_step_of_a_dead_owner_is_compensated_with_the_rest() {
    let fixture = Fixture::new();
    crash_mid_saga(&fixture, 1, "x").await;
    assert_eq!(fixture.world.items(), ["x-a", "x-b", "x-c"]);

    let recoverer = fixture.kernel(2);
    // Process 1 is still alive: nothing is touched.
    let report = recoverer.recover(&NoObserver).await.expect("recovers");
    assert!(matches!(
        report.sagas[..],
        [RecoveryAction::SkippedLive { pid: 1, .. }]
    ));
    assert_eq!(fixture.world.items().len(), 3);

    fixture.kill([1]);
    let report = recoverer.recover(&NoObserver).await.expect("recovers");
    let [RecoveryAction::RolledBack(saga)] = &report.sagas[..] else {
        panic!("expected one rolled back saga, got {report:?}");
    };
    assert_eq!(saga.state, SagaState::FailedRolledBack);
    assert!(
        saga.steps
            .iter()
            .all(|s| s.status == StepStatus::Compensated)
    );
    assert!(
        saga.steps[2]
            .compensation
            .as_deref()
            .is_some_and(|note| note.contains("in doubt"))
    );
    assert!(fixture.world.items().is_empty());

    // A second recovery finds nothing to do.
    let report = recoverer.recover(&NoObserver).await.expect("recovers");
    assert!(report.sagas.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn done_sagas_are_never_touched_by_recovery() {
    let fixture = Fixture::new();
    let kernel = fixture.kernel(3);
    let done = kernel
        .run(&plan(vec![add("kept")]), &NoObserver)
        .await
        .expect("runs");
    assert_eq!(done.state, SagaState::Done);
    fixture.kill([3]);
    let report = fixture
        .kernel(4)
        .recover(&NoObserver)
        .await
        .expect("recovers");
    assert!(report.sagas.is_empty());
    assert_eq!(fixture.world.items(), ["kept"]);
    let record = kernel
        .log()
        .saga(&done.saga_id)
        .await
        .expect("reads")
        .expect("exists");
    assert_eq!(record.saga.state, SagaState::Done);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_recoveries_compensate_each_saga_exactly_once() {
    let fixture = Fixture::new();
    for (pid, prefix) in [(11, "p"), (12, "q"), (13, "r")] {
        crash_mid_saga(&fixture, pid, prefix).await;
    }
    fixture.kill([11, 12, 13]);
    let (first, second) = (fixture.kernel(21), fixture.kernel(22));
    let (a, b) = tokio::join!(first.recover(&NoObserver), second.recover(&NoObserver));
    let (a, b) = (a.expect("recovers"), b.expect("recovers"));
    let n_rolled_back = a
        .sagas
        .iter()
        .chain(&b.sagas)
        .filter(|action| matches!(action, RecoveryAction::RolledBack(_)))
        .count();
    assert_eq!(n_rolled_back, 3);
    assert!(fixture.world.items().is_empty());
    let removals = fixture
        .world
        .journal()
        .into_iter()
        .filter(|entry| entry.starts_with("remove"))
        .count();
    assert_eq!(removals, 9, "each of the 9 steps compensated once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_refuses_a_saga_whose_owner_is_alive() {
    let fixture = Fixture::new();
    crash_mid_saga(&fixture, 31, "live").await;
    let kernel = fixture.kernel(32);
    let saga_id = kernel.log().unfinished_sagas().await.expect("reads")[0]
        .saga_id
        .clone();
    let error = kernel
        .rollback(&saga_id, &NoObserver)
        .await
        .expect_err("refused");
    assert!(error.to_string().contains("still running"), "{error}");
    assert_eq!(fixture.world.items().len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_is_recorded_claims_no_key_and_is_never_compensated() {
    let fixture = Fixture::new();
    let kernel = fixture.kernel(7);
    let keyed = plan(vec![add("d-a"), crate::add_keyed("d-b", "order-7")]);
    let report = kernel.dry_run(&keyed).await.expect("simulates");
    assert!(report.dry_run);
    assert_eq!(report.state, SagaState::Done);
    assert!(fixture.world.journal().is_empty(), "nothing ran");
    let record = kernel
        .log()
        .saga(&report.saga_id)
        .await
        .expect("reads")
        .expect("recorded");
    assert!(record.saga.dry_run);
    assert_eq!(record.saga.state, SagaState::Done);
    assert!(
        record
            .steps
            .iter()
            .all(|step| step.status == StepStatus::Commit)
    );
    assert!(
        kernel
            .log()
            .key_binding("order-7")
            .await
            .expect("reads")
            .is_none(),
        "a dry run claims no key"
    );
    // The real run executes the keyed step: nothing is reused from the dry run.
    let real = kernel.run(&keyed, &NoObserver).await.expect("runs");
    assert_eq!(real.state, SagaState::Done);
    assert!(real.steps.iter().all(|step| !step.reused));
    assert_eq!(fixture.world.items(), ["d-a", "d-b"]);

    // A dry run found unfinished (written by hand: the kernel writes a dry run whole) is
    // finished by recovery without compensating anything.
    let log = kernel.log();
    let saga_id = agent_kernel_api::SagaId::new("hand-written-dry-run");
    let step = agent_kernel_api::BeginStep {
        saga_id: saga_id.clone(),
        step_seq: 0,
        tool_id: "ledger.add".into(),
        tool_version: "1.0.0".into(),
        effect: agent_kernel_api::EffectClass::Mutating,
        args: json!({ "item": "d-a" }),
        args_hash: agent_kernel_core::args_hash("ledger.add", &json!({ "item": "d-a" })),
        idempotency_key: None,
        undo: agent_kernel_api::Undo::none(),
        resources: Vec::new(),
        duplicate_keys: Vec::new(),
        duplicate_check: None,
    };
    log.write(vec![
        agent_kernel_api::LogWrite::CreateSaga(agent_kernel_api::NewSaga {
            saga_id: saga_id.clone(),
            name: None,
            actor: None,
            owner: crate::owner(8),
            n_steps: 1,
            state: SagaState::Acting,
            dry_run: true,
            require_actor_idle: false,
        }),
        agent_kernel_api::LogWrite::SimulateStep {
            step,
            result: Ok(agent_kernel_api::ToolOutput::new(
                json!({ "dry_run": true }),
            )),
        },
    ])
    .await
    .expect("writes");
    fixture.kill([8]);
    let journal_before = fixture.world.journal();
    let report = fixture
        .kernel(9)
        .recover(&NoObserver)
        .await
        .expect("recovers");
    let [RecoveryAction::RolledBack(saga)] = &report.sagas[..] else {
        panic!("expected the dry run to be finished, got {report:?}");
    };
    assert_eq!(saga.state, SagaState::FailedRolledBack);
    assert!(saga.dry_run);
    assert_eq!(
        saga.steps[0].status,
        StepStatus::Commit,
        "a simulated step is left as is"
    );
    assert_eq!(
        fixture.world.journal(),
        journal_before,
        "nothing compensated"
    );
    assert_eq!(fixture.world.items(), ["d-a", "d-b"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_stops_where_a_run_would_find_its_key_held() {
    let fixture = Fixture::new();
    let holder = fixture.kernel(11);
    let mut slow = crate::add_keyed("held", "key-held");
    slow.args = json!({ "item": "held", "sleep_ms": 60_000 });
    let mut holding = plan(vec![slow]);
    holding.actor = Some("holder".into());
    crate::abandon_when(&holder, &holding, || {
        fixture.world.items().contains(&"held".to_owned())
    })
    .await;

    // The same key and arguments, while the holder's step is in flight.
    let mut same = plan(vec![add("first"), crate::add_keyed("held", "key-held")]);
    same.steps[1].args = json!({ "item": "held", "sleep_ms": 60_000 });
    let report = fixture.kernel(12).dry_run(&same).await.expect("simulates");
    assert!(report.dry_run);
    assert_eq!(report.state, SagaState::FailedRolledBack);
    let failure = report.failure.expect("the step a run would stop at");
    assert_eq!(failure.step_seq, 1);
    assert!(
        failure.error.to_string().contains("is held by saga"),
        "{}",
        failure.error
    );
    assert_eq!(
        fixture.world.items(),
        ["held"],
        "nothing of the dry run ran"
    );
}

/// reference §8: a process asked to compensate a step whose tool it does not have leaves the
/// saga as it is and names the tool; a process that has the tool recovers it later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saga_whose_tool_is_missing_is_left_untouched_for_a_program_that_has_it() {
    let fixture = Fixture::new();
    crash_mid_saga(&fixture, 31, "m").await;
    fixture.kill([31]);
    let stock = fixture.kernel_without_ledger(32);
    let before = {
        let saga = stock.log().unfinished_sagas().await.expect("reads");
        assert_eq!(saga.len(), 1);
        stock
            .log()
            .saga(&saga[0].saga_id)
            .await
            .expect("reads")
            .expect("exists")
    };
    let report = stock.recover(&NoObserver).await.expect("recovers");
    let [RecoveryAction::MissingTools { saga_id, tools }] = &report.sagas[..] else {
        panic!("expected the missing tool reported, got {report:?}");
    };
    assert_eq!(saga_id, &before.saga.saga_id);
    assert_eq!(tools, &["ledger.add".to_owned()]);
    assert!(report.needs_operator(), "operator attention: exit 3");
    assert_eq!(report.counts().left_for_operator, 1, "{report:?}");
    let after = stock
        .log()
        .saga(saga_id)
        .await
        .expect("reads")
        .expect("exists");
    assert_eq!(
        after, before,
        "not taken over, no step marked, state unchanged"
    );
    assert_eq!(fixture.world.items(), ["m-a", "m-b", "m-c"]);
    // Operator rollback from the same program is refused the same way.
    let error = stock
        .rollback(saga_id, &NoObserver)
        .await
        .expect_err("refused");
    assert!(
        matches!(&error, agent_kernel_core::KernelError::MissingTools { tools, .. } if tools == &["ledger.add".to_owned()]),
        "{error}"
    );
    assert!(error.to_string().contains("`ledger.add`"), "{error}");
    assert!(!error.is_bad_input() && !error.is_denied(), "exit 3");

    // The program that has the tool recovers it.
    let report = fixture
        .kernel(33)
        .recover(&NoObserver)
        .await
        .expect("recovers");
    let [RecoveryAction::RolledBack(saga)] = &report.sagas[..] else {
        panic!("expected the saga rolled back, got {report:?}");
    };
    assert_eq!(saga.state, SagaState::FailedRolledBack);
    assert!(fixture.world.items().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sagas_on_different_resources_are_compensated_at_the_same_time() {
    let fixture = Fixture::new();
    abandon_one_step(&fixture, 31, json!({ "item": "older" })).await;
    // The newer saga is compensated first when they are taken one after another; its
    // compensation waits for the older saga's, so only compensations at the same time let
    // it succeed.
    abandon_one_step(&fixture, 32, json!({ "item": "newer", "after": "older" })).await;
    fixture.kill([31, 32]);

    let report = fixture
        .kernel(33)
        .recover(&NoObserver)
        .await
        .expect("recovers");
    assert_eq!(report.sagas.len(), 2, "{report:?}");
    for action in &report.sagas {
        let RecoveryAction::RolledBack(saga) = action else {
            panic!("expected the saga rolled back, got {action:?}");
        };
        assert_eq!(saga.state, SagaState::FailedRolledBack, "{saga:?}");
    }
    assert!(fixture.world.items().is_empty());
    assert!(noted_at(&fixture.world, "remove older") < noted_at(&fixture.world, "remove newer"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saga_whose_steps_do_not_say_what_they_touch_is_compensated_alone_newest_first() {
    // The older saga's step names no resources (as in a log written before steps named
    // them), or only its tool's own key (as a command tool that names nothing): nothing
    // tells that the two sagas act on different things.
    for unnamed in ["none", "tool"] {
        compensated_alone_newest_first(unnamed).await;
    }
}

async fn compensated_alone_newest_first(unnamed: &str) {
    let fixture = Fixture::new();
    abandon_one_step(&fixture, 41, json!({ "item": "older", "unnamed": unnamed })).await;
    abandon_one_step(&fixture, 42, json!({ "item": "newer", "yields": 200 })).await;
    fixture.kill([41, 42]);

    let report = fixture
        .kernel(43)
        .recover(&NoObserver)
        .await
        .expect("recovers");
    assert_eq!(report.sagas.len(), 2, "{report:?}");
    assert!(fixture.world.items().is_empty());
    // The newer saga's compensation, yielding all along, ends before the older one's
    // begins.
    let journal = fixture.world.journal();
    let newer = noted_at(&fixture.world, "remove newer");
    assert!(
        noted_at(&fixture.world, "compensating \"newer\"") < newer
            && newer < noted_at(&fixture.world, "remove older"),
        "unnamed {unnamed}: {journal:?}"
    );
}
