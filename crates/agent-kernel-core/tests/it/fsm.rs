//! The FSM guardrail inside the engine: states persisted with the step records that cause
//! them, denials that roll back what ran, validation flow, recovery from the persisted state.

use agent_kernel_api::{
    BoxFuture, KeyBinding, LogWrite, Owner, SagaId, SagaRecord, SagaState, SagaSummary, StepStatus,
    TxError, TxLog, WriteOutcome,
};
use agent_kernel_core::{KernelError, NoObserver, RecoveryAction};
use agent_kernel_fsm::Guardrail;
use serde_json::json;

use crate::{Fixture, add, plan, probe};

/// The built-in table without one row, as a custom `fsm.toml` would say.
pub(crate) fn table_without(row: &str) -> Guardrail {
    let text = Guardrail::builtin().to_toml();
    assert!(text.contains(row), "the built-in table has {row:?}");
    Guardrail::from_toml_str(&text.replacen(row, "", 1)).expect("still a valid table")
}

#[tokio::test]
async fn every_step_sees_the_state_its_predecessor_persisted() {
    let fixture = Fixture::new();
    let kernel = fixture.kernel(1);
    let report = kernel
        .run(
            &plan(vec![add("a"), probe(json!({})), probe(json!({})), add("b")]),
            &NoObserver,
        )
        .await
        .expect("runs");
    assert_eq!(report.state, SagaState::Done);
    let probes: Vec<_> = fixture
        .world
        .journal()
        .into_iter()
        .filter(|entry| entry.starts_with("probe"))
        .collect();
    // add a (Acting) -> read-only next -> Validating; the first probe passes with more steps
    // -> Acting; the second probe runs while acting.
    assert_eq!(probes, ["probe 1 saw Validating", "probe 2 saw Acting"]);
    let record = kernel
        .log()
        .saga(&report.saga_id)
        .await
        .expect("reads")
        .expect("exists");
    assert_eq!(record.saga.state, SagaState::Done);
}

#[tokio::test]
async fn a_failed_validation_rolls_the_saga_back() {
    let fixture = Fixture::new();
    let kernel = fixture.kernel(1);
    let report = kernel
        .run(
            &plan(vec![
                add("a"),
                add("b"),
                probe(json!({"fail": true})),
                add("c"),
            ]),
            &NoObserver,
        )
        .await
        .expect("runs");
    assert_eq!(report.state, SagaState::FailedRolledBack);
    assert!(fixture.world.items().is_empty());
    assert!(
        !report.is_denied(),
        "a failed check is a rollback (exit 1), not a denial"
    );
    let failure = report.failure.expect("failed");
    assert!(failure.error.is_validation());
}

#[tokio::test]
async fn a_mutating_step_while_validating_is_denied_and_what_ran_is_undone() {
    let fixture = Fixture::new();
    let kernel = fixture.kernel(1);
    let mut hinted = add("a");
    hinted.args = json!({"item": "a", "hint": "validate"});
    let report = kernel
        .run(&plan(vec![hinted, add("b")]), &NoObserver)
        .await
        .expect("runs");
    assert_eq!(report.state, SagaState::FailedRolledBack);
    assert!(report.is_denied());
    assert!(fixture.world.items().is_empty(), "step 0 was compensated");
    assert_eq!(
        fixture.world.journal(),
        ["add a", "remove a"],
        "step 1 never ran"
    );
    let message = report.failure.expect("failed").error.to_string();
    assert!(
        message.contains("in state Validating") && message.contains("tool `ledger.add`"),
        "{message}"
    );
    // The denial is in the log, on the step it refused.
    let record = kernel
        .log()
        .saga(&report.saga_id)
        .await
        .expect("reads")
        .expect("exists");
    assert_eq!(record.steps[1].status, StepStatus::Fail);
    assert!(record.steps[1].error.as_ref().expect("error").is_denied());
}

#[tokio::test]
async fn a_custom_table_that_forbids_a_needed_transition_denies_and_undoes() {
    let mut fixture = Fixture::new();
    fixture.fsm = table_without(
        "[[transition]]\nfrom = \"Validating\"\nevent = \"ValidationPassed\"\nto = \"Acting\"\nguard = \"more_steps\"\n",
    );
    let kernel = fixture.kernel(1);
    let report = kernel
        .run(
            &plan(vec![add("a"), probe(json!({})), add("b")]),
            &NoObserver,
        )
        .await
        .expect("runs");
    assert_eq!(report.state, SagaState::FailedRolledBack);
    assert!(report.is_denied());
    assert!(fixture.world.items().is_empty());
    let message = report.failure.expect("failed").error.to_string();
    assert!(message.contains("event ValidationPassed"), "{message}");
}

#[tokio::test]
async fn an_actor_runs_one_saga_at_a_time() {
    let fixture = Fixture::new();
    let first = fixture.kernel(1);
    let mut slow = add("slow");
    slow.args = json!({"item": "slow", "sleep_ms": 60_000});
    crate::abandon_when(&first, &plan(vec![slow]), || {
        fixture.world.items().contains(&"slow".to_owned())
    })
    .await;
    let second = fixture.kernel(2);
    let error = second
        .run(&plan(vec![add("x")]), &NoObserver)
        .await
        .expect_err("denied");
    assert!(
        matches!(error, KernelError::Denied { saga_id: None, .. }),
        "{error}"
    );
    assert!(error.is_denied());
    assert!(error.to_string().contains("actor_idle"), "{error}");
    assert_eq!(
        fixture.world.items(),
        ["slow"],
        "nothing of the second saga ran"
    );
    let mut other = plan(vec![add("y")]);
    other.actor = Some("someone else".into());
    let report = second.run(&other, &NoObserver).await.expect("runs");
    assert_eq!(report.state, SagaState::Done);
}

/// A view of the log with some reads older than the log, as reads taken just before
/// another process wrote would be.
struct StaleReads(std::sync::Arc<dyn TxLog>, Stale);

/// Which reads of [`StaleReads`] are older than the log.
enum Stale {
    /// The list of unfinished sagas (and of prunable ones) is always empty.
    UnfinishedSagas,
    /// The first group of sagas read at once lacks each saga's last step, as a read just
    /// before its owner wrote that step would; the owner dies just after (`dies`).
    FirstGroupBeforeLastStep {
        read: std::sync::atomic::AtomicBool,
        dies: Box<dyn Fn() + Send + Sync>,
    },
}

impl TxLog for StaleReads {
    fn write(&self, batch: Vec<LogWrite>) -> BoxFuture<'_, Result<Vec<WriteOutcome>, TxError>> {
        self.0.write(batch)
    }
    fn effect_allowed(&self) -> Result<(), TxError> {
        self.0.effect_allowed()
    }
    fn end_lease<'a>(&'a self, owner: &'a Owner) -> BoxFuture<'a, Result<(), TxError>> {
        self.0.end_lease(owner)
    }
    fn lease_left_ms<'a>(
        &'a self,
        owner: &'a Owner,
    ) -> BoxFuture<'a, Result<Option<i64>, TxError>> {
        self.0.lease_left_ms(owner)
    }
    fn saga<'a>(
        &'a self,
        saga_id: &'a SagaId,
    ) -> BoxFuture<'a, Result<Option<SagaRecord>, TxError>> {
        self.0.saga(saga_id)
    }
    fn sagas(&self, limit: u32) -> BoxFuture<'_, Result<Vec<SagaSummary>, TxError>> {
        self.0.sagas(limit)
    }
    fn saga_counts(
        &self,
    ) -> BoxFuture<'_, Result<Vec<(agent_kernel_api::SagaState, u64)>, TxError>> {
        self.0.saga_counts()
    }
    fn saga_page<'a>(
        &'a self,
        query: &'a agent_kernel_api::SagaQuery,
    ) -> BoxFuture<'a, Result<Vec<agent_kernel_api::SagaListing>, TxError>> {
        self.0.saga_page(query)
    }
    fn unfinished_sagas(&self) -> BoxFuture<'_, Result<Vec<SagaSummary>, TxError>> {
        match self.1 {
            Stale::UnfinishedSagas => Box::pin(async { Ok(Vec::new()) }),
            Stale::FirstGroupBeforeLastStep { .. } => self.0.unfinished_sagas(),
        }
    }
    fn prune_candidates(
        &self,
        before_ms: i64,
        after: Option<(i64, SagaId)>,
        limit: u32,
    ) -> BoxFuture<'_, Result<Vec<agent_kernel_api::SagaRecord>, TxError>> {
        match self.1 {
            Stale::UnfinishedSagas => Box::pin(async { Ok(Vec::new()) }),
            Stale::FirstGroupBeforeLastStep { .. } => {
                self.0.prune_candidates(before_ms, after, limit)
            }
        }
    }
    fn duplicate_of<'a>(
        &'a self,
        saga_id: &'a agent_kernel_api::SagaId,
        tool_id: &'a str,
        keys: &'a [String],
        since_ms: i64,
    ) -> agent_kernel_api::BoxFuture<
        'a,
        Result<Option<agent_kernel_api::DuplicateStep>, agent_kernel_api::TxError>,
    > {
        self.0.duplicate_of(saga_id, tool_id, keys, since_ms)
    }
    fn later_claim<'a>(
        &'a self,
        saga_id: &'a agent_kernel_api::SagaId,
        resource: &'a str,
        since_ms: i64,
    ) -> agent_kernel_api::BoxFuture<
        'a,
        Result<Option<agent_kernel_api::LaterClaim>, agent_kernel_api::TxError>,
    > {
        self.0.later_claim(saga_id, resource, since_ms)
    }
    fn key_binding<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<KeyBinding>, TxError>> {
        self.0.key_binding(key)
    }
    fn take_over<'a>(
        &'a self,
        saga_id: &'a SagaId,
        expected_owner: &'a Owner,
        expected_state: SagaState,
        new_owner: &'a Owner,
    ) -> BoxFuture<'a, Result<bool, TxError>> {
        self.0
            .take_over(saga_id, expected_owner, expected_state, new_owner)
    }

    fn take_over_and_write<'a>(
        &'a self,
        saga_id: &'a SagaId,
        expected_owner: &'a Owner,
        expected_state: SagaState,
        new_owner: &'a Owner,
        then: Vec<LogWrite>,
    ) -> BoxFuture<'a, Result<bool, TxError>> {
        self.0
            .take_over_and_write(saga_id, expected_owner, expected_state, new_owner, then)
    }

    fn saga_records<'a>(
        &'a self,
        saga_ids: &'a [SagaId],
    ) -> BoxFuture<'a, Result<Vec<Option<SagaRecord>>, TxError>> {
        Box::pin(async move {
            let mut records = self.0.saga_records(saga_ids).await?;
            if let Stale::FirstGroupBeforeLastStep { read, dies } = &self.1
                && !read.swap(true, std::sync::atomic::Ordering::SeqCst)
            {
                for record in records.iter_mut().flatten() {
                    record.steps.pop();
                }
                dies();
            }
            Ok(records)
        })
    }

    fn approval<'a>(
        &'a self,
        approval_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<agent_kernel_api::ApprovalRecord>, TxError>> {
        self.0.approval(approval_id)
    }

    fn saga_approval<'a>(
        &'a self,
        saga_id: &'a SagaId,
    ) -> BoxFuture<'a, Result<Option<agent_kernel_api::ApprovalRecord>, TxError>> {
        self.0.saga_approval(saga_id)
    }

    fn vouched_saga_approval<'a>(
        &'a self,
        saga_id: &'a SagaId,
    ) -> BoxFuture<'a, Result<Option<agent_kernel_api::ApprovalRecord>, TxError>> {
        self.0.vouched_saga_approval(saga_id)
    }

    fn pending_approvals(
        &self,
    ) -> BoxFuture<'_, Result<Vec<agent_kernel_api::ApprovalRecord>, TxError>> {
        self.0.pending_approvals()
    }

    fn dead_letter<'a>(
        &'a self,
        letter_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<agent_kernel_api::DeadLetter>, TxError>> {
        self.0.dead_letter(letter_id)
    }

    fn open_dead_letters<'a>(
        &'a self,
        saga_id: Option<&'a SagaId>,
    ) -> BoxFuture<'a, Result<Vec<agent_kernel_api::DeadLetter>, TxError>> {
        self.0.open_dead_letters(saga_id)
    }
}

#[tokio::test]
async fn the_log_refuses_a_second_saga_for_a_busy_actor_even_after_a_stale_read() {
    let fixture = Fixture::new();
    let first = fixture.kernel(1);
    let mut slow = add("slow");
    slow.args = json!({"item": "slow", "sleep_ms": 60_000});
    crate::abandon_when(&first, &plan(vec![slow]), || {
        fixture.world.items().contains(&"slow".to_owned())
    })
    .await;

    // The second process looked before the first created its saga: the FSM's read passes,
    // and the log, which checks again in the transaction that creates the saga, refuses.
    let sqlite = fixture.open_log();
    let second = fixture.kernel_over(
        std::sync::Arc::new(StaleReads(sqlite.clone(), Stale::UnfinishedSagas)),
        sqlite.clone(),
        2,
    );
    let error = second
        .run(&plan(vec![add("x"), add("y")]), &NoObserver)
        .await
        .expect_err("denied");
    assert!(
        matches!(error, KernelError::Denied { saga_id: None, .. }),
        "{error}"
    );
    assert!(error.to_string().contains("actor_idle"), "{error}");
    assert_eq!(
        fixture.world.items(),
        ["slow"],
        "nothing of the second saga ran"
    );
    let sagas = TxLog::sagas(sqlite.as_ref(), 10).await.expect("lists");
    assert_eq!(sagas.len(), 1, "no second saga was created: {sagas:?}");

    // A dry run does not hold the actor, and is not refused for it either.
    let report = second
        .dry_run(&plan(vec![add("x")]))
        .await
        .expect("simulates");
    assert_eq!(report.state, SagaState::Done);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_resumes_from_the_persisted_validating_state() {
    let fixture = Fixture::new();
    let kernel = fixture.kernel(1);
    let steps = vec![add("a"), probe(json!({"sleep_ms": 60_000}))];
    // Abandoned once the probe runs, which is after the move to Validating is durable.
    crate::abandon_when(&kernel, &plan(steps), || {
        fixture
            .world
            .journal()
            .iter()
            .any(|entry| entry.starts_with("probe 1 saw"))
    })
    .await;
    let unfinished = kernel.log().unfinished_sagas().await.expect("reads");
    assert_eq!(
        unfinished[0].state,
        SagaState::Validating,
        "persisted before the probe ran"
    );
    fixture.kill([1]);
    let report = fixture
        .kernel(2)
        .recover(&NoObserver)
        .await
        .expect("recovers");
    let [RecoveryAction::RolledBack(saga)] = &report.sagas[..] else {
        panic!("expected one rolled back saga: {report:?}");
    };
    assert_eq!(saga.state, SagaState::FailedRolledBack);
    assert!(fixture.world.items().is_empty());
}

#[tokio::test]
async fn a_step_its_dead_owner_wrote_after_recovery_first_read_the_saga_is_undone_too() {
    let fixture = Fixture::new();
    let owner = std::sync::Arc::new(fixture.kernel(43));
    let saga = owner
        .begin(agent_kernel_core::BeginOptions::default())
        .await
        .expect("begins");
    for item in ["a", "b"] {
        saga.call("ledger.add", json!({ "item": item }), None)
            .await
            .expect("calls");
    }
    // Recovery's first read of the group misses step 1, as a read just before the owner
    // (alive then) wrote it would; the owner then dies, and the take-over, which compares
    // only owner and state, holds.
    let sqlite = fixture.open_log();
    let liveness = fixture.liveness.clone();
    let recovering = fixture.kernel_over(
        std::sync::Arc::new(StaleReads(
            sqlite.clone(),
            Stale::FirstGroupBeforeLastStep {
                read: std::sync::atomic::AtomicBool::new(false),
                dies: Box::new(move || {
                    liveness.dead_pids.lock().expect("not poisoned").push(43);
                }),
            },
        )),
        sqlite,
        44,
    );
    let report = recovering.recover(&NoObserver).await.expect("recovers");
    match report.sagas.as_slice() {
        [RecoveryAction::RolledBack(rolled)] => {
            assert_eq!(rolled.state, SagaState::FailedRolledBack);
            let statuses: Vec<StepStatus> = rolled.steps.iter().map(|step| step.status).collect();
            assert_eq!(statuses, [StepStatus::Compensated, StepStatus::Compensated]);
        }
        other => panic!("{other:?}"),
    }
    assert!(
        fixture.world.items().is_empty(),
        "{:?}",
        fixture.world.items()
    );
    assert!(fixture.verify().is_intact());
}
