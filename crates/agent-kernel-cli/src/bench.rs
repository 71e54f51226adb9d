//! `agent-kernel bench`: the kernel's honest per-step cost, beside the raw SQLite floor; in a
//! temporary SQLite log, or in the log `--db` names (an SQLite file or a PostgreSQL URL),
//! which several bench processes may share.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_kernel::{
    BeginOptions, CallAnswer, Environment, Kernel, NoObserver, Observer, ProcessProbe,
    RecoveryAction, SagaEvent, SystemClock, ToolEntry, UuidV7Ids, current_owner,
};
use agent_kernel_api::{
    Compensate, Durability, ObservedLog, Owner, Plan, PlanStep, SagaState, Tool, ToolContext,
    ToolError, ToolOutput, ToolSpec, TxLog, Undo,
};
use agent_kernel_dispatcher::{Dispatcher, Limits, MAX_OPEN_SAGAS, NoJitter};
use agent_kernel_txlog::{AuditKey, GroupCounts, LogOptions, SqliteLog, measure_commit_floor};
use agent_kernel_txlog_postgres::PostgresLog;
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
    /// Drive live sagas (begin, one call per step, commit) instead of plans
    #[arg(long)]
    live: bool,
    /// Measure `recover` instead: leave `--sagas` live sagas of `--steps` committed steps
    /// unfinished under a dead process, then time one `recover` of them all
    #[arg(long, conflicts_with = "live")]
    recovery: bool,
    /// Write the kernel's log to PATH, a new file, and keep it (to measure `audit verify`
    /// or `prune` on a log of that size afterwards)
    #[arg(long, value_name = "PATH")]
    keep_log: Option<std::path::PathBuf>,
    /// `on`: each step claims a resource of its own with its BEGIN, as a step that writes
    /// one file does; `off`: steps declare they touch nothing (to measure the locks' cost)
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    locks: String,
}

impl BenchArgs {
    /// Refuses what would make the run touch an existing file, and `--keep-log` beside a
    /// log given with `--db` (`db`). `--recovery` in a given log is refused later, by
    /// [`run`], when the log holds unfinished sagas ([`Refused`]).
    pub(crate) fn check(&self, db: Option<&std::path::Path>) -> Result<(), String> {
        match (&self.keep_log, db) {
            (Some(_), Some(db)) => Err(format!(
                "--keep-log and --db {}: bench runs in the log --db names, which is kept anyway; give one of them",
                crate::shown_db(db)
            )),
            (Some(path), None) if path.exists() => Err(format!(
                "--keep-log {}: the file exists; bench writes a new log and never reuses one",
                path.display()
            )),
            _ => Ok(()),
        }
    }
}

/// A step that changes nothing but is logged exactly as a mutating step: `prepare` returns
/// an undo record that goes into the durable BEGIN, `execute` returns an output that goes
/// into the COMMIT; with `locks`, it claims a resource of its own (`bench:SAGA/STEP`) with
/// its BEGIN, released when its saga is `Done`, as one file written per step would be.
struct BenchStep {
    locks: bool,
}

impl Tool for BenchStep {
    fn spec(&self) -> ToolSpec {
        ToolSpec::mutating("bench.step")
            .with_version("1.0.0")
            .with_idempotent(true)
            .with_schema(json!({ "type": "object", "additionalProperties": false }))
    }

    fn check(&self, _args: &Value) -> Result<(), ToolError> {
        Ok(())
    }

    async fn resources(
        &self,
        ctx: &ToolContext,
        _args: &Value,
    ) -> Result<Option<Vec<String>>, ToolError> {
        Ok(Some(if self.locks {
            vec![format!("bench:{}/{}", ctx.saga_id, ctx.step_seq)]
        } else {
            Vec::new()
        }))
    }

    async fn execute(&self, ctx: &ToolContext, _args: &Value) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::new(json!({ "step": ctx.step_seq })))
    }
}

impl Compensate for BenchStep {
    async fn prepare(&self, ctx: &ToolContext, _args: &Value) -> Result<Undo, ToolError> {
        Ok(Undo {
            data: json!({ "step": ctx.step_seq }),
            blob: Some(vec![b'u'; BENCH_UNDO_BYTES]),
        })
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

/// Counts the batches the kernel writes.
type CountingLog = ObservedLog<Arc<dyn TxLog>>;

/// The log a bench runs in, with what it counts of its transactions.
enum BenchLog {
    Sqlite(Arc<SqliteLog>),
    Postgres(Arc<PostgresLog>),
}

impl BenchLog {
    fn log(&self) -> Arc<dyn TxLog> {
        match self {
            BenchLog::Sqlite(log) => log.clone(),
            BenchLog::Postgres(log) => log.clone(),
        }
    }

    /// The transactions the log committed so far (and the batches and records they held),
    /// and on PostgreSQL the round trips its connection made.
    fn counts(&self) -> (GroupCounts, Option<u64>) {
        match self {
            BenchLog::Sqlite(log) => (log.group_stats(), None),
            BenchLog::Postgres(log) => {
                let stats = log.stats();
                (
                    GroupCounts {
                        commits: stats.transactions,
                        batches: stats.batches,
                        records: stats.records,
                        batches_max: stats.batches_max,
                        records_max: stats.records_max,
                    },
                    Some(stats.round_trips),
                )
            }
        }
    }

    fn backend(&self) -> &'static str {
        match self {
            BenchLog::Sqlite(_) => "sqlite",
            BenchLog::Postgres(_) => "postgres",
        }
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

/// Longest step latency the histogram tells apart (an hour); longer ones count as this.
const LATENCY_US_MAX: u64 = 3_600_000_000;

/// A histogram of step latencies in microseconds, 3 significant digits: fixed memory,
/// however many steps are recorded, so `bench` over a million steps measures the kernel's
/// memory and not its own.
fn latency_histogram() -> hdrhistogram::Histogram<u64> {
    hdrhistogram::Histogram::new_with_bounds(1, LATENCY_US_MAX, 3)
        .expect("the bounds are valid: 1 <= low, high >= 2 * low, 3 digits")
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros())
        .unwrap_or(u64::MAX)
        .clamp(1, LATENCY_US_MAX)
}

/// The CPU time this process has used so far, all its threads, user and system.
fn process_cpu() -> Duration {
    let spent = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(
        u64::try_from(spent.tv_sec).unwrap_or(0),
        u32::try_from(spent.tv_nsec).unwrap_or(0),
    )
}

/// This process's resident memory now and at its peak, in KiB (`VmRSS`, `VmHWM`).
fn rss_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// What `bench` measured: steps, or one recovery.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub(crate) enum BenchReport {
    /// Sagas run to `Done` (the default).
    Steps(StepsReport),
    /// One `recover` of abandoned sagas (`--recovery`).
    Recovery(RecoveryBench),
}

impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BenchReport::Steps(report) => report.fmt(f),
            BenchReport::Recovery(report) => report.fmt(f),
        }
    }
}

/// What `bench` measured of sagas run to `Done`.
#[derive(Debug, Serialize)]
pub(crate) struct StepsReport {
    /// `sqlite` or `postgres`.
    backend: &'static str,
    /// Whether the log was the one `--db` names (else a temporary SQLite file).
    shared_log: bool,
    durability: Durability,
    /// `plan` (`Kernel::run`) or `live` (begin, call, commit).
    mode: &'static str,
    /// Whether each step claimed a resource with its BEGIN (`--locks`).
    locks: bool,
    concurrency: u32,
    n_sagas: u32,
    n_steps: u64,
    elapsed_ms: f64,
    steps_per_sec: f64,
    p50_us: u64,
    p99_us: u64,
    p999_us: u64,
    max_us: u64,
    /// CPU time of this process (every thread, user and system) during the run, in
    /// microseconds per step: what a step costs the machine, which the disk's latency and
    /// other processes on it sway less than they do steps/s (a PostgreSQL server's own CPU
    /// is not counted).
    cpu_us_per_step: f64,
    /// Resident memory at the end of the run and at its peak, in KiB (before the floor is
    /// measured).
    rss_kib: u64,
    rss_peak_kib: u64,
    /// Batches the kernel wrote (each all or nothing).
    n_commits: u64,
    commits_per_step: f64,
    /// Transactions the log made of them: batches ready at once share one (group commit).
    n_transactions: u64,
    transactions_per_step: f64,
    /// Round trips to the server per step, on PostgreSQL (each BEGIN, statement and COMMIT
    /// the log's connection waited for, reads included).
    #[serde(skip_serializing_if = "Option::is_none")]
    round_trips_per_step: Option<f64>,
    /// Batches per transaction, on average and at most.
    batches_per_transaction: f64,
    batches_per_transaction_max: u64,
    /// Records (each chained into the audit log) per transaction, on average and at most.
    records_per_transaction: f64,
    records_per_transaction_max: u64,
    /// The same number of plain SQLite commits, same settings, no kernel (SQLite logs).
    #[serde(skip_serializing_if = "Option::is_none")]
    floor: Option<FloorSummary>,
    /// Kernel wall time over floor wall time, for the same number of commits.
    #[serde(skip_serializing_if = "Option::is_none")]
    overhead_ratio: Option<f64>,
}

#[derive(Debug, Serialize)]
pub(crate) struct FloorSummary {
    n_commits: u64,
    elapsed_ms: f64,
    commits_per_sec: f64,
    p50_us: u64,
    p99_us: u64,
}

impl fmt::Display for StepsReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "kernel: {} {} sagas x {} steps, concurrency {}, durability {}, locks {}, {} log{}",
            self.n_sagas,
            self.mode,
            self.n_steps / u64::from(self.n_sagas),
            self.concurrency,
            self.durability,
            if self.locks { "on" } else { "off" },
            self.backend,
            if self.shared_log {
                " (--db)"
            } else {
                " (temporary)"
            }
        )?;
        writeln!(
            f,
            "  {:.0} steps/s, step latency p50 {} us, p99 {} us, p999 {} us, max {} us, {:.1} us of CPU a step",
            self.steps_per_sec,
            self.p50_us,
            self.p99_us,
            self.p999_us,
            self.max_us,
            self.cpu_us_per_step
        )?;
        writeln!(
            f,
            "  memory: {} KiB resident, {} KiB at peak",
            self.rss_kib, self.rss_peak_kib
        )?;
        write!(
            f,
            "  {} commits ({:.3} per step) in {:.1} ms, in {} transactions ({:.3} per step; {:.2} batches each, at most {}; {:.2} records each, at most {})",
            self.n_commits,
            self.commits_per_step,
            self.elapsed_ms,
            self.n_transactions,
            self.transactions_per_step,
            self.batches_per_transaction,
            self.batches_per_transaction_max,
            self.records_per_transaction,
            self.records_per_transaction_max
        )?;
        if let Some(round_trips) = self.round_trips_per_step {
            write!(f, "\n  {round_trips:.2} round trips to the server per step")?;
        }
        if let (Some(floor), Some(ratio)) = (&self.floor, self.overhead_ratio) {
            write!(
                f,
                "\nfloor: {} plain SQLite commits, same settings: {:.0} commits/s, p50 {} us, p99 {} us, {:.1} ms\noverhead: kernel time / floor time = {ratio:.2}x",
                floor.n_commits,
                floor.commits_per_sec,
                floor.p50_us,
                floor.p99_us,
                floor.elapsed_ms
            )?;
        }
        Ok(())
    }
}

/// What `bench --recovery` measured.
#[derive(Debug, Serialize)]
pub(crate) struct RecoveryBench {
    /// `sqlite` or `postgres`.
    backend: &'static str,
    durability: Durability,
    /// Unfinished sagas of a dead process, each with `steps_per_saga` committed steps.
    n_sagas: u32,
    steps_per_saga: u32,
    /// Time to leave them (begun and called by `concurrency` tasks).
    setup_ms: f64,
    /// Wall time of one `recover` of them all.
    recover_ms: f64,
    sagas_per_sec: f64,
    /// Sagas recover rolled back (all of them, or the bench fails).
    n_rolled_back: u64,
    /// Batches recover wrote, and the transactions the log made of them.
    n_commits: u64,
    n_transactions: u64,
    /// Round trips to the server recover made (PostgreSQL only).
    #[serde(skip_serializing_if = "Option::is_none")]
    n_round_trips: Option<u64>,
    rss_peak_kib: u64,
}

impl fmt::Display for RecoveryBench {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "recover: {} unfinished sagas of a dead process x {} committed steps, durability {}, {}",
            self.n_sagas, self.steps_per_saga, self.durability, self.backend
        )?;
        writeln!(
            f,
            "  rolled back {} in {:.1} ms ({:.0} sagas/s), {} commits in {} transactions",
            self.n_rolled_back,
            self.recover_ms,
            self.sagas_per_sec,
            self.n_commits,
            self.n_transactions
        )?;
        if let Some(round_trips) = self.n_round_trips {
            writeln!(f, "  {round_trips} round trips to the server")?;
        }
        write!(
            f,
            "  left in {:.1} ms; memory at peak {} KiB",
            self.setup_ms, self.rss_peak_kib
        )
    }
}

/// The kernel `bench` drives: `bench.step` only, the built-in table, `owner` as this process.
fn bench_kernel(
    log: Arc<CountingLog>,
    owner: Owner,
    me: Owner,
    open_sagas_max: usize,
    durability: Durability,
    locks: bool,
) -> anyhow::Result<Arc<Kernel>> {
    let limits = Limits {
        open_sagas_max: open_sagas_max.max(Limits::default().open_sagas_max),
        ..Limits::default()
    };
    let mut tools = Dispatcher::new(limits, Arc::new(NoJitter))?;
    tools.register(ToolEntry::compensated(BenchStep { locks }))?;
    let env = Environment {
        clock: Arc::new(SystemClock),
        ids: Arc::new(UuidV7Ids),
        liveness: Arc::new(ProcessProbe::new(me)),
        owner,
    };
    let fsm = Arc::new(agent_kernel_fsm::Guardrail::builtin());
    Ok(Arc::new(Kernel::new(
        log,
        Arc::new(tools),
        fsm,
        env,
        durability,
    )))
}

/// A bench refused before it measured anything, as bad input: it would act on sagas that
/// are not its own.
#[derive(Debug)]
pub(crate) struct Refused(String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

/// Runs the benchmark: in the log `db` names (an SQLite file, created if missing, or a
/// PostgreSQL URL; never removed), else in a temporary directory removed afterwards.
/// `audit_key` MACs the records, as every other command on that log does.
pub(crate) async fn run(
    args: &BenchArgs,
    db: Option<&std::path::Path>,
    audit_key: Option<AuditKey>,
) -> anyhow::Result<BenchReport> {
    let dir = tempfile::tempdir().context("cannot create a temporary directory")?;
    let options = LogOptions {
        durability: args.durability,
        clock: Arc::new(SystemClock),
    };
    let bench_log = match db {
        Some(db) if agent_kernel::is_postgres(db) => {
            let url = db.to_str().unwrap_or_default().to_owned();
            let worker = agent_kernel_txlog_postgres::Worker {
                head_file: agent_kernel_txlog_postgres::default_head_file(&url),
                ..agent_kernel_txlog_postgres::Worker::new(
                    current_owner().context("cannot identify this process in /proc")?,
                )
            };
            let log = tokio::task::spawn_blocking(move || {
                PostgresLog::open(&url, options, audit_key, worker)
            })
            .await
            .context("opening the log panicked")?
            .with_context(|| format!("cannot open the log {}", crate::shown_db(db)))?;
            BenchLog::Postgres(Arc::new(log))
        }
        _ => {
            let log_path = db
                .map(std::path::Path::to_owned)
                .or_else(|| args.keep_log.clone())
                .unwrap_or_else(|| dir.path().join("bench.db"));
            let log = SqliteLog::open_with_audit_key(&log_path, options, audit_key)
                .with_context(|| format!("cannot open the log {}", log_path.display()))?;
            BenchLog::Sqlite(Arc::new(log))
        }
    };
    let log = Arc::new(CountingLog::new(bench_log.log(), ()));
    if args.recovery {
        return recovery(args, log, &bench_log)
            .await
            .map(BenchReport::Recovery);
    }
    steps(args, log, &bench_log, db.is_some(), dir.path())
        .await
        .map(BenchReport::Steps)
}

/// One saga of `n_steps` live calls, then its commit; returns each step's latency, the
/// commit charged to the last step as in a plan.
async fn live_saga(
    kernel: &Arc<Kernel>,
    n_steps: u32,
    latencies: &mut hdrhistogram::Histogram<u64>,
) -> anyhow::Result<()> {
    let mut previous = Instant::now();
    let saga = kernel
        .begin(BeginOptions {
            name: Some("bench".into()),
            actor: None,
            ..BeginOptions::default()
        })
        .await?;
    for step in 0..n_steps {
        match saga.call("bench.step", json!({}), None).await? {
            CallAnswer::Committed(_) => {}
            other => bail!("bench call of saga {} came to {other:?}", saga.id()),
        }
        if step + 1 < n_steps {
            let now = Instant::now();
            latencies.saturating_record(micros(now - previous));
            previous = now;
        }
    }
    let report = saga.commit().await?;
    if report.state != SagaState::Done {
        bail!("bench saga {} ended {}", report.saga_id, report.state);
    }
    latencies.saturating_record(micros(previous.elapsed()));
    Ok(())
}

/// One plan saga; returns each step's latency.
async fn plan_saga(
    kernel: &Arc<Kernel>,
    plan: &Plan,
    latencies: &mut hdrhistogram::Histogram<u64>,
) -> anyhow::Result<()> {
    let clock = StepClock {
        marks: Mutex::new(Vec::with_capacity(plan.steps.len())),
    };
    let saga_started = Instant::now();
    let report = kernel.run(plan, &clock).await?;
    let saga_done = Instant::now();
    if report.state != SagaState::Done {
        bail!("bench saga {} ended {}", report.saga_id, report.state);
    }
    let marks = clock.marks.into_inner().expect("not poisoned");
    // Step k runs from the previous step's mark (or the saga's start) to its own mark; the
    // final commit (last outcome + Done) is charged to the last step.
    let mut previous = saga_started;
    let n_marks = marks.len();
    for (mark_idx, mark) in marks.into_iter().enumerate() {
        let end = if mark_idx + 1 == n_marks {
            saga_done
        } else {
            mark
        };
        latencies.saturating_record(micros(end - previous));
        previous = mark;
    }
    Ok(())
}

async fn steps(
    args: &BenchArgs,
    log: Arc<CountingLog>,
    bench_log: &BenchLog,
    shared_log: bool,
    dir: &std::path::Path,
) -> anyhow::Result<StepsReport> {
    let (counts_before, trips_before) = bench_log.counts();
    let owner = current_owner().context("cannot identify this process in /proc")?;
    let open = usize::try_from(args.concurrency).context("too many sagas at once")?;
    let kernel = bench_kernel(
        log.clone(),
        owner.clone(),
        owner,
        open,
        args.durability,
        args.locks == "on",
    )?;
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
    let cpu_before = process_cpu();
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..args.concurrency {
        let (kernel, plan, next_saga) = (kernel.clone(), plan.clone(), next_saga.clone());
        let n_sagas = u64::from(args.sagas);
        let (live, n_steps) = (args.live, args.steps);
        workers.push(tokio::spawn(async move {
            let mut latencies = latency_histogram();
            while next_saga.fetch_add(1, Ordering::Relaxed) < n_sagas {
                if live {
                    live_saga(&kernel, n_steps, &mut latencies).await?;
                } else {
                    plan_saga(&kernel, &plan, &mut latencies).await?;
                }
            }
            anyhow::Ok(latencies)
        }));
    }
    let mut latencies = latency_histogram();
    for worker in workers {
        let worker = worker.await.context("a bench worker panicked")??;
        latencies
            .add(worker)
            .context("the latency histograms have the same bounds")?;
    }
    let elapsed = started.elapsed();
    let cpu = process_cpu().saturating_sub(cpu_before);
    let (rss_kib, rss_peak_kib) = rss_kib();
    let n_steps = latencies.len();
    let n_commits = log.writes();
    let (counts, trips) = bench_log.counts();
    let n_transactions = counts.commits - counts_before.commits;
    let n_batches = counts.batches - counts_before.batches;
    let n_records = counts.records - counts_before.records;
    drop(kernel);

    let floor = match bench_log {
        BenchLog::Sqlite(_) => Some(sqlite_floor(dir, args.durability, n_commits).await?),
        BenchLog::Postgres(_) => None,
    };
    Ok(StepsReport {
        backend: bench_log.backend(),
        shared_log,
        durability: args.durability,
        mode: if args.live { "live" } else { "plan" },
        locks: args.locks == "on",
        concurrency: args.concurrency,
        n_sagas: args.sagas,
        n_steps,
        elapsed_ms: elapsed.as_secs_f64() * 1e3,
        steps_per_sec: n_steps as f64 / elapsed.as_secs_f64(),
        p50_us: latencies.value_at_quantile(0.50),
        p99_us: latencies.value_at_quantile(0.99),
        p999_us: latencies.value_at_quantile(0.999),
        max_us: latencies.max(),
        cpu_us_per_step: cpu.as_secs_f64() * 1e6 / n_steps as f64,
        rss_kib,
        rss_peak_kib,
        n_commits,
        commits_per_step: n_commits as f64 / n_steps as f64,
        n_transactions,
        transactions_per_step: n_transactions as f64 / n_steps as f64,
        round_trips_per_step: trips
            .zip(trips_before)
            .map(|(after, before)| (after - before) as f64 / n_steps as f64),
        batches_per_transaction: n_batches as f64 / n_transactions.max(1) as f64,
        batches_per_transaction_max: counts.batches_max,
        records_per_transaction: n_records as f64 / n_transactions.max(1) as f64,
        records_per_transaction_max: counts.records_max,
        overhead_ratio: floor
            .as_ref()
            .map(|floor| elapsed.as_secs_f64() * 1e3 / floor.elapsed_ms),
        floor,
    })
}

/// As many plain SQLite commits as the kernel made, same settings, no kernel, in a file of
/// `dir`.
async fn sqlite_floor(
    dir: &std::path::Path,
    durability: Durability,
    n_commits: u64,
) -> anyhow::Result<FloorSummary> {
    let floor_path = dir.join("floor.db");
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
    let latency = percentiles(floor.latencies_us);
    Ok(FloorSummary {
        n_commits: floor.n_commits as u64,
        elapsed_ms: floor.elapsed.as_secs_f64() * 1e3,
        commits_per_sec: floor.n_commits as f64 / floor.elapsed.as_secs_f64(),
        p50_us: latency.p50_us,
        p99_us: latency.p99_us,
    })
}

/// Leaves `--sagas` live sagas unfinished under an owner that is dead to this process (the
/// same host, another boot), then times one `recover`.
async fn recovery(
    args: &BenchArgs,
    log: Arc<CountingLog>,
    bench_log: &BenchLog,
) -> anyhow::Result<RecoveryBench> {
    let me = current_owner().context("cannot identify this process in /proc")?;
    let dead = Owner {
        boot_id: format!("{}-bench-dead", me.boot_id),
        ..me.clone()
    };
    let n_sagas = usize::try_from(args.sagas).context("too many sagas")?;
    if n_sagas > MAX_OPEN_SAGAS {
        bail!("bench --recovery leaves at most {MAX_OPEN_SAGAS} sagas open, not {n_sagas}");
    }
    // In a log given with `--db`: `recover` takes over every dead process's sagas, so the
    // log may hold none but the bench's.
    let unfinished = log.unfinished_sagas().await?.len();
    if unfinished > 0 {
        return Err(Refused(format!(
            "bench --recovery in a log that holds {unfinished} unfinished saga(s): recover would take over every dead process's sagas, not only the bench's; give a log with none (a new file, or a new PostgreSQL schema)"
        ))
        .into());
    }
    let setup_started = Instant::now();
    {
        let kernel = bench_kernel(
            log.clone(),
            dead,
            me.clone(),
            n_sagas,
            args.durability,
            args.locks == "on",
        )?;
        let next_saga = Arc::new(AtomicU64::new(0));
        let mut workers = Vec::new();
        for _ in 0..args.concurrency {
            let (kernel, next_saga) = (kernel.clone(), next_saga.clone());
            let (n_sagas, n_steps) = (u64::from(args.sagas), args.steps);
            workers.push(tokio::spawn(async move {
                while next_saga.fetch_add(1, Ordering::Relaxed) < n_sagas {
                    let saga = kernel
                        .begin(BeginOptions {
                            name: Some("bench-abandoned".into()),
                            actor: None,
                            ..BeginOptions::default()
                        })
                        .await?;
                    for _ in 0..n_steps {
                        match saga.call("bench.step", json!({}), None).await? {
                            CallAnswer::Committed(_) => {}
                            other => bail!("bench call of saga {} came to {other:?}", saga.id()),
                        }
                    }
                    // Neither committed nor aborted: left as a killed process leaves it.
                }
                anyhow::Ok(())
            }));
        }
        for worker in workers {
            worker.await.context("a bench worker panicked")??;
        }
    }
    let setup = setup_started.elapsed();
    let commits_before = log.writes();
    let (groups_before, trips_before) = bench_log.counts();
    let kernel = bench_kernel(
        log.clone(),
        me.clone(),
        me,
        0,
        args.durability,
        args.locks == "on",
    )?;
    let started = Instant::now();
    let report = kernel.recover(&NoObserver).await?;
    let elapsed = started.elapsed();
    let n_rolled_back = report
        .sagas
        .iter()
        .filter(|action| {
            matches!(action, RecoveryAction::RolledBack(saga) if saga.state == SagaState::FailedRolledBack)
        })
        .count() as u64;
    if n_rolled_back != u64::from(args.sagas) {
        bail!(
            "recover rolled back {n_rolled_back} of {} abandoned sagas",
            args.sagas
        );
    }
    let (_, rss_peak_kib) = rss_kib();
    let (groups_after, trips_after) = bench_log.counts();
    Ok(RecoveryBench {
        backend: bench_log.backend(),
        durability: args.durability,
        n_sagas: args.sagas,
        steps_per_saga: args.steps,
        setup_ms: setup.as_secs_f64() * 1e3,
        recover_ms: elapsed.as_secs_f64() * 1e3,
        sagas_per_sec: f64::from(args.sagas) / elapsed.as_secs_f64(),
        n_rolled_back,
        n_commits: log.writes() - commits_before,
        n_transactions: groups_after.commits - groups_before.commits,
        n_round_trips: trips_after
            .zip(trips_before)
            .map(|(after, before)| after - before),
        rss_peak_kib,
    })
}
