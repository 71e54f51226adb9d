//! `agent-kernel bench`: the kernel's honest per-step cost, beside the raw SQLite floor.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_kernel_api::{
    BoxFuture, Durability, EffectClass, KeyBinding, LogWrite, Owner, Plan, PlanStep, SagaId,
    SagaRecord, SagaState, SagaSummary, Settlement, ToolContext, ToolError, ToolOutput,
    TransactionalTool, TxError, TxLog, Undo, WriteOutcome,
};
use agent_kernel_core::{
    Environment, Kernel, Observer, ProcessProbe, SagaEvent, SystemClock, UuidV7Ids, current_owner,
};
use agent_kernel_dispatcher::{Dispatcher, Limits, NoJitter};
use agent_kernel_txlog::{LogOptions, SqliteLog, measure_commit_floor};
use anyhow::{Context as _, bail};
use serde::Serialize;
use serde_json::{Value, json};

/// Most sagas one bench run may start.
const MAX_BENCH_SAGAS: u32 = 1_000_000;
/// Most steps per bench saga.
const MAX_BENCH_STEPS: u32 = 10_000;
/// Most sagas run at once.
const MAX_BENCH_CONCURRENCY: u32 = 1024;
/// Size of the undo record each bench step logs, like a small file's before-image.
const BENCH_UNDO_BYTES: usize = 256;

/// Options of `bench`.
#[derive(Debug, clap::Args)]
pub(crate) struct BenchArgs {
    /// How many sagas to run
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_BENCH_SAGAS)))]
    sagas: u32,
    /// Steps per saga
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_BENCH_STEPS)))]
    steps: u32,
    /// How many sagas run at once
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_BENCH_CONCURRENCY)))]
    concurrency: u32,
    /// `full` (synced) or `normal` (survives process crashes)
    #[arg(long, default_value = "full", value_parser = crate::parse_durability)]
    durability: Durability,
}

/// A step that changes nothing but is logged exactly as a mutating step: `prepare` returns
/// an undo record that goes into the durable BEGIN, `execute` returns an output that goes
/// into the COMMIT.
struct BenchStep;

impl TransactionalTool for BenchStep {
    fn id(&self) -> &str {
        "bench.step"
    }

    fn version(&self) -> &str {
        "1.0.0"
    }

    fn effect(&self) -> EffectClass {
        EffectClass::Mutating
    }

    fn idempotent(&self) -> bool {
        true
    }

    fn settlement(&self) -> Settlement {
        Settlement::Compensate
    }

    fn args_schema(&self) -> Value {
        json!({ "type": "object", "additionalProperties": false })
    }

    fn check(&self, _args: &Value) -> Result<(), ToolError> {
        Ok(())
    }

    async fn prepare(&self, ctx: &ToolContext, _args: &Value) -> Result<Undo, ToolError> {
        Ok(Undo {
            data: json!({ "step": ctx.step_seq }),
            blob: Some(vec![b'u'; BENCH_UNDO_BYTES]),
        })
    }

    async fn execute(&self, ctx: &ToolContext, _args: &Value) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::new(json!({ "step": ctx.step_seq })))
    }

    async fn compensate(
        &self,
        _ctx: &ToolContext,
        _args: &Value,
        _undo: &Undo,
        _output: Option<&ToolOutput>,
    ) -> Result<(), ToolError> {
        Ok(())
    }
}

/// Counts the transactions the kernel commits.
struct CountingLog {
    inner: SqliteLog,
    n_writes: AtomicU64,
}

impl TxLog for CountingLog {
    fn write(&self, batch: Vec<LogWrite>) -> BoxFuture<'_, Result<Vec<WriteOutcome>, TxError>> {
        self.n_writes.fetch_add(1, Ordering::Relaxed);
        self.inner.write(batch)
    }

    fn saga<'a>(
        &'a self,
        saga_id: &'a SagaId,
    ) -> BoxFuture<'a, Result<Option<SagaRecord>, TxError>> {
        self.inner.saga(saga_id)
    }

    fn sagas(&self, limit: u32) -> BoxFuture<'_, Result<Vec<SagaSummary>, TxError>> {
        self.inner.sagas(limit)
    }

    fn unfinished_sagas(&self) -> BoxFuture<'_, Result<Vec<SagaSummary>, TxError>> {
        self.inner.unfinished_sagas()
    }

    fn key_binding<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<KeyBinding>, TxError>> {
        self.inner.key_binding(key)
    }

    fn take_over<'a>(
        &'a self,
        saga_id: &'a SagaId,
        expected_owner: &'a Owner,
        expected_state: SagaState,
        new_owner: &'a Owner,
    ) -> BoxFuture<'a, Result<bool, TxError>> {
        self.inner
            .take_over(saga_id, expected_owner, expected_state, new_owner)
    }

    fn approval<'a>(
        &'a self,
        approval_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<agent_kernel_api::ApprovalRecord>, TxError>> {
        self.inner.approval(approval_id)
    }

    fn saga_approval<'a>(
        &'a self,
        saga_id: &'a SagaId,
    ) -> BoxFuture<'a, Result<Option<agent_kernel_api::ApprovalRecord>, TxError>> {
        self.inner.saga_approval(saga_id)
    }

    fn pending_approvals(
        &self,
    ) -> BoxFuture<'_, Result<Vec<agent_kernel_api::ApprovalRecord>, TxError>> {
        self.inner.pending_approvals()
    }

    fn dead_letter<'a>(
        &'a self,
        letter_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<agent_kernel_api::DeadLetter>, TxError>> {
        self.inner.dead_letter(letter_id)
    }

    fn open_dead_letters<'a>(
        &'a self,
        saga_id: Option<&'a SagaId>,
    ) -> BoxFuture<'a, Result<Vec<agent_kernel_api::DeadLetter>, TxError>> {
        self.inner.open_dead_letters(saga_id)
    }
}

/// Records when each step of one saga finished executing.
struct StepClock {
    marks: Mutex<Vec<Instant>>,
}

impl Observer for StepClock {
    fn on_event(&self, event: &SagaEvent<'_>) {
        if let SagaEvent::StepFinished { .. } = event {
            self.marks
                .lock()
                .expect("the lock is never poisoned: nothing panics while holding it")
                .push(Instant::now());
        }
    }
}

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Latency {
    p50_us: u64,
    p99_us: u64,
    max_us: u64,
}

fn percentiles(mut samples: Vec<u64>) -> Latency {
    assert!(!samples.is_empty(), "percentiles need samples");
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    Latency {
        p50_us: at(0.50),
        p99_us: at(0.99),
        max_us: at(1.0),
    }
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// What `bench` measured.
#[derive(Debug, Serialize)]
pub(crate) struct BenchReport {
    durability: Durability,
    concurrency: u32,
    n_sagas: u32,
    n_steps: u64,
    elapsed_ms: f64,
    steps_per_sec: f64,
    p50_us: u64,
    p99_us: u64,
    max_us: u64,
    /// Batches the kernel wrote (each all or nothing).
    n_commits: u64,
    commits_per_step: f64,
    /// Transactions the log made of them: batches ready at once share one (group commit).
    n_transactions: u64,
    /// Batches per transaction, on average and at most.
    batches_per_transaction: f64,
    batches_per_transaction_max: u64,
    /// The same number of plain SQLite commits, same settings, no kernel.
    floor: FloorSummary,
    /// Kernel wall time over floor wall time, for the same number of commits.
    overhead_ratio: f64,
}

#[derive(Debug, Serialize)]
pub(crate) struct FloorSummary {
    n_commits: u64,
    elapsed_ms: f64,
    commits_per_sec: f64,
    p50_us: u64,
    p99_us: u64,
}

impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "kernel: {} sagas x {} steps, concurrency {}, durability {}",
            self.n_sagas,
            self.n_steps / u64::from(self.n_sagas),
            self.concurrency,
            self.durability
        )?;
        writeln!(
            f,
            "  {:.0} steps/s, step latency p50 {} us, p99 {} us, max {} us",
            self.steps_per_sec, self.p50_us, self.p99_us, self.max_us
        )?;
        writeln!(
            f,
            "  {} commits ({:.3} per step) in {:.1} ms, in {} transactions ({:.2} batches each, at most {})",
            self.n_commits,
            self.commits_per_step,
            self.elapsed_ms,
            self.n_transactions,
            self.batches_per_transaction,
            self.batches_per_transaction_max
        )?;
        writeln!(
            f,
            "floor: {} plain SQLite commits, same settings: {:.0} commits/s, p50 {} us, p99 {} us, {:.1} ms",
            self.floor.n_commits,
            self.floor.commits_per_sec,
            self.floor.p50_us,
            self.floor.p99_us,
            self.floor.elapsed_ms
        )?;
        write!(
            f,
            "overhead: kernel time / floor time = {:.2}x",
            self.overhead_ratio
        )
    }
}

/// Runs the benchmark in a temporary directory that is removed afterwards.
pub(crate) async fn run(args: &BenchArgs) -> anyhow::Result<BenchReport> {
    let dir = tempfile::tempdir().context("cannot create a temporary directory")?;
    let log = SqliteLog::open(
        &dir.path().join("bench.db"),
        LogOptions {
            durability: args.durability,
            clock: Arc::new(SystemClock),
        },
    )?;
    let log = Arc::new(CountingLog {
        inner: log,
        n_writes: AtomicU64::new(0),
    });
    let mut tools = Dispatcher::new(Limits::default(), Arc::new(NoJitter))?;
    tools.register(Arc::new(BenchStep))?;
    let owner = current_owner().context("cannot identify this process in /proc")?;
    let env = Environment {
        clock: Arc::new(SystemClock),
        ids: Arc::new(UuidV7Ids),
        liveness: Arc::new(ProcessProbe::new(owner.clone())),
        owner,
    };
    let fsm = Arc::new(agent_kernel_fsm::Guardrail::builtin());
    let kernel = Arc::new(Kernel::new(
        log.clone(),
        Arc::new(tools),
        fsm,
        env,
        args.durability,
    ));
    let plan = Arc::new(Plan {
        name: Some("bench".into()),
        actor: None,
        steps: (0..args.steps)
            .map(|_| PlanStep {
                tool: "bench.step".into(),
                args: json!({}),
                idempotency_key: None,
            })
            .collect(),
    });

    let next_saga = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..args.concurrency {
        let (kernel, plan, next_saga) = (kernel.clone(), plan.clone(), next_saga.clone());
        let n_sagas = u64::from(args.sagas);
        workers.push(tokio::spawn(async move {
            let mut latencies_us = Vec::new();
            while next_saga.fetch_add(1, Ordering::Relaxed) < n_sagas {
                let clock = StepClock {
                    marks: Mutex::new(Vec::with_capacity(plan.steps.len())),
                };
                let saga_started = Instant::now();
                let report = kernel.run(&plan, &clock).await?;
                let saga_done = Instant::now();
                if report.state != SagaState::Done {
                    bail!("bench saga {} ended {}", report.saga_id, report.state);
                }
                let marks = clock.marks.into_inner().expect("not poisoned");
                // Step k runs from the previous step's mark (or the saga's start) to its own
                // mark; the final commit (last outcome + Done) is charged to the last step.
                let mut previous = saga_started;
                let n_marks = marks.len();
                for (mark_idx, mark) in marks.into_iter().enumerate() {
                    let end = if mark_idx + 1 == n_marks {
                        saga_done
                    } else {
                        mark
                    };
                    latencies_us.push(micros(end - previous));
                    previous = mark;
                }
            }
            anyhow::Ok(latencies_us)
        }));
    }
    let mut latencies_us = Vec::new();
    for worker in workers {
        latencies_us.extend(worker.await.context("a bench worker panicked")??);
    }
    let elapsed = started.elapsed();
    let n_steps = latencies_us.len() as u64;
    let n_commits = log.n_writes.load(Ordering::Relaxed);
    let groups = log.inner.group_stats();
    let latency = percentiles(latencies_us);

    let floor_path = dir.path().join("floor.db");
    let durability = args.durability;
    let n_floor_commits = usize::try_from(n_commits).context("too many commits")?;
    let floor = tokio::task::spawn_blocking(move || {
        measure_commit_floor(
            &floor_path,
            durability,
            n_floor_commits,
            BENCH_UNDO_BYTES + 256,
        )
    })
    .await
    .context("the floor measurement panicked")??;
    let n_floor_commits = floor.n_commits;
    let floor_elapsed = floor.elapsed;
    let floor_latency = percentiles(floor.latencies_us);

    Ok(BenchReport {
        durability: args.durability,
        concurrency: args.concurrency,
        n_sagas: args.sagas,
        n_steps,
        elapsed_ms: elapsed.as_secs_f64() * 1e3,
        steps_per_sec: n_steps as f64 / elapsed.as_secs_f64(),
        p50_us: latency.p50_us,
        p99_us: latency.p99_us,
        max_us: latency.max_us,
        n_commits,
        commits_per_step: n_commits as f64 / n_steps as f64,
        n_transactions: groups.commits,
        batches_per_transaction: groups.batches as f64 / groups.commits.max(1) as f64,
        batches_per_transaction_max: groups.batches_max,
        floor: FloorSummary {
            n_commits: n_floor_commits as u64,
            elapsed_ms: floor_elapsed.as_secs_f64() * 1e3,
            commits_per_sec: n_floor_commits as f64 / floor_elapsed.as_secs_f64(),
            p50_us: floor_latency.p50_us,
            p99_us: floor_latency.p99_us,
        },
        overhead_ratio: elapsed.as_secs_f64() / floor_elapsed.as_secs_f64(),
    })
}
