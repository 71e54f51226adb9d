//! Dead letters (reference §10): every failed compensation is kept, one letter per step,
//! until a retry compensates it or an operator resolves it; nothing is dropped.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use agent_kernel_api::{
    Compensate, DeadLetterStatus, Durability, DynTool, PlanStep, SagaState, StepStatus, Tool,
    ToolContext, ToolEntry, ToolError, ToolOutput, ToolSpec, Undo,
};
use agent_kernel_core::{Environment, Kernel, KernelError, NoObserver};
use agent_kernel_dispatcher::{Dispatcher, Limits, NoJitter};
use agent_kernel_fsm::Guardrail;
use agent_kernel_sandbox::{FsSandbox, Policy};
use agent_kernel_tools::FsWrite;
use serde_json::{Value, json};

use crate::{Fixture, Rng, add, boom, plan};

/// Sagas in the chaos test.
const CHAOS_SAGAS: usize = 1_000;

/// `fs.write` whose compensation fails for the paths in `stuck` until `unstuck` is set.
struct FlakyUndo {
    inner: Arc<dyn DynTool>,
    stuck: Mutex<HashSet<String>>,
    unstuck: AtomicBool,
}

impl Tool for FlakyUndo {
    fn spec(&self) -> ToolSpec {
        ToolSpec::mutating("flaky.write").with_schema(self.inner.spec().args_schema().clone())
    }

    fn check(&self, args: &Value) -> Result<(), ToolError> {
        self.inner.check(args)
    }

    async fn resources(
        &self,
        ctx: &ToolContext,
        args: &Value,
    ) -> Result<Option<Vec<String>>, ToolError> {
        self.inner.resources(ctx, args).await.map(Some)
    }

    async fn execute(&self, ctx: &ToolContext, args: &Value) -> Result<ToolOutput, ToolError> {
        self.inner.execute(ctx, args).await
    }
}

impl Compensate for FlakyUndo {
    async fn prepare(&self, ctx: &ToolContext, args: &Value) -> Result<Undo, ToolError> {
        self.inner.prepare(ctx, args).await
    }

    async fn compensate(
        &self,
        ctx: &ToolContext,
        args: &Value,
        undo: &Undo,
        output: Option<&ToolOutput>,
    ) -> Result<(), ToolError> {
        let path = args["path"].as_str().unwrap_or_default().to_owned();
        if !self.unstuck.load(Ordering::SeqCst)
            && self.stuck.lock().expect("not poisoned").contains(&path)
        {
            return Err(ToolError::failed(format!(
                "{path} is locked: cannot restore it"
            )));
        }
        self.inner.compensate(ctx, args, undo, output).await
    }
}

/// A kernel over `fixture`'s log with `flaky.write` (`fs.write` in `ws/`, its compensation
/// failing for the paths made stuck) and `boom`; the tool, and the folder `ws`.
fn flaky_kernel(fixture: &Fixture) -> (Kernel, Arc<FlakyUndo>, std::path::PathBuf) {
    let root = fixture.dir.path().join("ws");
    std::fs::create_dir(&root).expect("creates ws");
    let policy =
        Policy::from_toml_str("[fs]\nallow = [\"ws\"]\n", fixture.dir.path()).expect("a policy");
    let sandbox = Arc::new(FsSandbox::new(&policy).expect("a sandbox"));
    let flaky = Arc::new(FlakyUndo {
        inner: ToolEntry::compensated(FsWrite::new(sandbox, fixture.dir.path().to_path_buf()))
            .into_dyn(),
        stuck: Mutex::new(HashSet::new()),
        unstuck: AtomicBool::new(false),
    });
    let mut tools = Dispatcher::new(Limits::default(), Arc::new(NoJitter)).expect("limits");
    tools
        .register(ToolEntry::compensated(flaky.clone()))
        .expect("registers");
    tools
        .register(ToolEntry::compensated(crate::Boom))
        .expect("registers");
    let kernel = Kernel::new(
        fixture.open_log(),
        Arc::new(tools),
        Arc::new(Guardrail::builtin()),
        Environment {
            clock: Arc::new(crate::TickClock(AtomicU64::new(0))),
            ids: Arc::new(crate::CountingIds {
                prefix: "chaos".into(),
                next: AtomicU64::new(0),
            }),
            owner: crate::owner(1),
            liveness: fixture.liveness.clone(),
        },
        Durability::Normal,
    );
    (kernel, flaky, root)
}

/// Compensations run last first, also across a failure: a step is not compensated while a
/// later step of its saga on the same file is not (undone first, it would act under that
/// step's write), and `dlq retry` takes the later one first. Then both are undone, in
/// order, and the file is as before the saga.
#[tokio::test]
async fn a_step_waits_for_a_later_step_on_its_resource_whose_compensation_failed() {
    let fixture = Fixture::new();
    let (kernel, flaky, root) = flaky_kernel(&fixture);
    std::fs::write(root.join("x.txt"), "before").expect("writes");
    // The second write's compensation fails (the first's would not, over the same path,
    // once unstuck: the rule, not the failure, keeps it back).
    let write = |content: &str| PlanStep {
        tool: "flaky.write".into(),
        args: json!({"path": "ws/x.txt", "content": content}),
        idempotency_key: None,
    };
    flaky
        .stuck
        .lock()
        .expect("not poisoned")
        .insert("ws/x.txt".into());
    let report = kernel
        .run(
            &plan(vec![write("first"), write("second"), boom()]),
            &NoObserver,
        )
        .await
        .expect("runs");
    assert_eq!(report.state, SagaState::FailedRollbackPartial);
    let letters = kernel
        .dead_letters(Some(&report.saga_id))
        .await
        .expect("reads");
    let by_step: BTreeMap<u32, &agent_kernel_api::DeadLetter> = letters
        .iter()
        .map(|letter| (letter.step_seq, letter))
        .collect();
    assert_eq!(by_step.keys().copied().collect::<Vec<_>>(), [0, 1]);
    assert!(
        by_step[&1].error.contains("locked"),
        "{}",
        by_step[&1].error
    );
    assert!(
        by_step[&0]
            .error
            .contains("not compensated: step 1, later on the same resource"),
        "{}",
        by_step[&0].error
    );
    assert_eq!(
        std::fs::read_to_string(root.join("x.txt")).expect("reads"),
        "second"
    );

    flaky.unstuck.store(true, Ordering::SeqCst);
    // The earlier step first is refused, and nothing runs.
    let error = kernel
        .retry_dead_letter(&by_step[&0].letter_id, None)
        .await
        .expect_err("the later step comes first");
    assert!(
        error.to_string().contains("retry that one first"),
        "{error}"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("x.txt")).expect("reads"),
        "second"
    );
    let later = kernel
        .retry_dead_letter(&by_step[&1].letter_id, None)
        .await
        .expect("retries");
    assert!(later.compensated(), "{later:?}");
    assert_eq!(
        std::fs::read_to_string(root.join("x.txt")).expect("reads"),
        "first"
    );
    let earlier = kernel
        .retry_dead_letter(&by_step[&0].letter_id, None)
        .await
        .expect("retries");
    assert!(earlier.compensated(), "{earlier:?}");
    assert_eq!(earlier.saga_state, SagaState::FailedRolledBack);
    assert_eq!(
        std::fs::read_to_string(root.join("x.txt")).expect("reads"),
        "before"
    );
    let audit = fixture.verify();
    assert!(audit.is_intact(), "{:?}", audit.first_bad);
}

/// Every file under `root`, by name, with its bytes.
fn snapshot(root: &std::path::Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(root)
        .expect("lists")
        .map(|entry| {
            let entry = entry.expect("entry");
            (
                entry.file_name().to_string_lossy().into_owned(),
                std::fs::read(entry.path()).expect("reads"),
            )
        })
        .collect()
}

/// In the spirit of IATP-002 §7.1: sagas of real file writes whose compensations fail at
/// random (seeded, printed; `AGENT_KERNEL_DLQ_SEED` replays). Afterwards every saga is
/// `FailedRolledBack`, or `FailedRollbackPartial` with exactly one open dead letter per
/// failed compensation; retrying every letter with the failures switched off brings every
/// file back and every saga to `FailedRolledBack`.
#[tokio::test]
async fn a_thousand_sagas_with_failing_compensations_lose_nothing_and_retries_bring_every_file_back()
 {
    let seed = crate::seed_from_env("AGENT_KERNEL_DLQ_SEED");
    eprintln!("dead-letter chaos test: seed {seed} (AGENT_KERNEL_DLQ_SEED={seed} reproduces)");
    let mut rng = Rng(seed);
    let fixture = Fixture::new();
    let (kernel, flaky, root) = flaky_kernel(&fixture);

    let mut plans = Vec::with_capacity(CHAOS_SAGAS);
    for saga_idx in 0..CHAOS_SAGAS {
        let n_steps = 1 + rng.below(4) as usize;
        let mut steps = Vec::new();
        let mut stuck = Vec::new();
        for step_idx in 0..n_steps {
            let name = format!("s{saga_idx}-{step_idx}.txt");
            if rng.below(2) == 0 {
                std::fs::write(root.join(&name), format!("before {saga_idx} {step_idx}"))
                    .expect("writes");
            }
            let path = format!("ws/{name}");
            if rng.below(100) < 20 {
                flaky
                    .stuck
                    .lock()
                    .expect("not poisoned")
                    .insert(path.clone());
                stuck.push(step_idx as u32);
            }
            steps.push(PlanStep {
                tool: "flaky.write".into(),
                args: json!({"path": path, "content": format!("written by saga {saga_idx}")}),
                idempotency_key: None,
            });
        }
        steps.push(boom());
        plans.push((plan(steps), stuck));
    }
    let before = snapshot(&root);
    let mut expected = Vec::with_capacity(CHAOS_SAGAS);
    for (plan, stuck) in plans {
        let report = kernel.run(&plan, &NoObserver).await.expect("runs");
        expected.push((report.saga_id, stuck));
    }

    let mut n_letters = 0;
    for (saga_id, stuck) in &expected {
        let record = kernel
            .log()
            .saga(saga_id)
            .await
            .expect("reads")
            .expect("saga");
        let letters = kernel.dead_letters(Some(saga_id)).await.expect("reads");
        let mut lettered: Vec<u32> = letters.iter().map(|letter| letter.step_seq).collect();
        lettered.sort_unstable();
        assert_eq!(
            &lettered, stuck,
            "seed {seed}: saga {saga_id}: one letter per failed compensation"
        );
        let want = if stuck.is_empty() {
            SagaState::FailedRolledBack
        } else {
            SagaState::FailedRollbackPartial
        };
        assert_eq!(record.saga.state, want, "seed {seed}: saga {saga_id}");
        for letter in &letters {
            assert_eq!(
                (letter.attempts, letter.tool_id.as_str()),
                (1, "flaky.write")
            );
            assert!(letter.error.contains("locked"), "{}", letter.error);
        }
        n_letters += letters.len();
    }
    let open = kernel.dead_letters(None).await.expect("reads");
    assert_eq!(
        open.len(),
        n_letters,
        "seed {seed}: the list holds every letter"
    );
    let n_stuck = flaky.stuck.lock().expect("not poisoned").len();
    assert_eq!(n_letters, n_stuck, "seed {seed}: nothing silently dropped");
    let after_run = snapshot(&root);
    let differing = before
        .keys()
        .chain(after_run.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .filter(|name| before.get(*name) != after_run.get(*name))
        .count();
    assert_eq!(
        differing, n_letters,
        "seed {seed}: only the stuck files differ"
    );
    eprintln!("dead-letter chaos test: {n_letters} dead letters over {CHAOS_SAGAS} sagas");

    flaky.unstuck.store(true, Ordering::SeqCst);
    for letter in open {
        let outcome = kernel
            .retry_dead_letter(&letter.letter_id, Some("chaos".into()))
            .await
            .expect("retries");
        assert!(outcome.compensated(), "seed {seed}: {outcome:?}");
    }
    assert_eq!(snapshot(&root), before, "seed {seed}: every file is back");
    assert!(kernel.dead_letters(None).await.expect("reads").is_empty());
    for (saga_id, _) in &expected {
        let record = kernel
            .log()
            .saga(saga_id)
            .await
            .expect("reads")
            .expect("saga");
        assert_eq!(
            record.saga.state,
            SagaState::FailedRolledBack,
            "seed {seed}: saga {saga_id}"
        );
        assert!(
            record
                .steps
                .iter()
                .all(|step| step.status != StepStatus::CompensationFailed),
            "seed {seed}: saga {saga_id}"
        );
    }
    let audit = fixture.verify();
    assert!(audit.is_intact(), "seed {seed}: {:?}", audit.first_bad);
}

#[tokio::test]
async fn a_retry_that_fails_again_counts_an_attempt_and_a_resolution_settles_by_hand() {
    let fixture = Fixture::new();
    let kernel = fixture.kernel(1);
    let report = kernel
        .run(
            &plan(vec![add("stuck-a"), add("stuck-b"), boom()]),
            &NoObserver,
        )
        .await
        .expect("runs");
    assert_eq!(report.state, SagaState::FailedRollbackPartial);
    let letters = kernel
        .dead_letters(Some(&report.saga_id))
        .await
        .expect("reads");
    assert_eq!(letters.len(), 2);

    let again = kernel
        .retry_dead_letter(&letters[0].letter_id, None)
        .await
        .expect("retries");
    assert!(!again.compensated());
    assert_eq!(again.letter.attempts, 2);
    assert_eq!(again.letter.status, DeadLetterStatus::Open);
    assert!(again.letter.next_retry_at_ms > again.letter.last_failed_at_ms);
    assert_eq!(again.saga_state, SagaState::FailedRollbackPartial);

    // One resolved by hand, one retried: the saga is FailedRolledBack only after both.
    let resolved = kernel
        .resolve_dead_letter(
            &letters[0].letter_id,
            "removed by hand".into(),
            Some("ops".into()),
        )
        .await
        .expect("resolves");
    assert_eq!(resolved.letter.status, DeadLetterStatus::Resolved);
    assert_eq!(resolved.saga_state, SagaState::FailedRollbackPartial);
    let error = kernel
        .resolve_dead_letter(&letters[0].letter_id, "twice".into(), None)
        .await
        .expect_err("settled once");
    assert!(
        matches!(error, KernelError::DeadLetterClosed { .. }),
        "{error}"
    );
    assert!(error.is_denied());
    fixture.world.unstuck.store(true, Ordering::SeqCst);
    let retried = kernel
        .retry_dead_letter(&letters[1].letter_id, None)
        .await
        .expect("retries");
    assert!(retried.compensated());
    assert_eq!(retried.saga_state, SagaState::FailedRolledBack);
    let error = kernel
        .retry_dead_letter(&letters[1].letter_id, None)
        .await
        .expect_err("settled once");
    assert!(
        matches!(error, KernelError::DeadLetterClosed { .. }),
        "{error}"
    );
    let audit = fixture.verify();
    assert!(audit.is_intact(), "{:?}", audit.first_bad);
}

#[tokio::test]
async fn a_step_of_unknown_outcome_left_to_an_operator_is_a_dead_letter_that_only_a_resolution_settles()
 {
    let mut fixture = Fixture::new();
    fixture.limits.timeout_ms = 100;
    let kernel = fixture.kernel(1);
    let opaque = agent_kernel_api::PlanStep {
        tool: "opaque.add".into(),
        args: serde_json::json!({"item": "x", "hang_before": true}),
        idempotency_key: None,
    };
    let report = kernel
        .run(&plan(vec![add("first"), opaque]), &NoObserver)
        .await
        .expect("runs");
    assert_eq!(report.state, SagaState::FailedRollbackPartial);
    let letters = kernel
        .dead_letters(Some(&report.saga_id))
        .await
        .expect("reads");
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(
        (letters[0].step_seq, letters[0].tool_id.as_str()),
        (1, "opaque.add")
    );
    assert!(
        letters[0].error.contains("operator"),
        "{}",
        letters[0].error
    );
    // Its tool can neither tell nor undo blindly: a retry cannot settle it.
    let retried = kernel
        .retry_dead_letter(&letters[0].letter_id, None)
        .await
        .expect("retries");
    assert!(!retried.compensated());
    let resolved = kernel
        .resolve_dead_letter(
            &letters[0].letter_id,
            "checked: x never arrived".into(),
            None,
        )
        .await
        .expect("resolves");
    assert_eq!(resolved.saga_state, SagaState::FailedRolledBack);
}
