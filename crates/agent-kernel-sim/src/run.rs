//! One case: the scenario's sagas run by one process that meets a fault, perhaps an
//! operator beside it who undoes and retries and may meet one too, a `recover` that may
//! meet one, a last `recover`; then the checks.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use agent_kernel_api::{
    Clock, Durability, IdSource, Owner, SagaId, SagaRecord, SagaState, StepStatus, ToolEntry, TxLog,
};
use agent_kernel_core::{
    BeginOptions, CallAnswer, Environment, Kernel, Liveness, LivenessProbe, NoObserver, UndoRequest,
};
use agent_kernel_dispatcher::{Dispatcher, Limits, NoJitter};
use agent_kernel_fsm::Guardrail;
use agent_kernel_txlog::{LogOptions, SqliteLog};
use anyhow::Context as _;

use crate::log::FaultyLog;
use crate::process::{Fault, Process};
use crate::scenario::{Driver, OPERATOR_STREAMS, Rng, Scenario};
use crate::tools::{SET_TOOL, SetTool};
use crate::world::{Event, World, WorldState, shown};

/// What one case runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Case {
    /// The sagas and outside writes.
    pub scenario: Scenario,
    /// Decides every interleaving.
    pub schedule_seed: u64,
    /// The fault the first process meets, if any.
    pub fault: Option<Fault>,
    /// The fault the first `recover` meets, if any.
    pub recovery_fault: Option<Fault>,
    /// The fault the operator meets, if the scenario has one.
    pub operator_fault: Option<Fault>,
}

/// What a case did and what the checks found.
#[derive(Debug, Clone, Default)]
pub struct CaseOutcome {
    /// How many points the first process reached.
    pub points: u64,
    /// Whether each of them was a log write (else a tool's effect or compensation).
    pub log_writes: Vec<bool>,
    /// How many points the operator reached.
    pub operator_points: u64,
    /// How many faults fired (0 to 3).
    pub faults_fired: u64,
    /// Every broken invariant; empty when the case passed.
    pub violations: Vec<String>,
    /// What happened, point by point, then the end state.
    pub history: Vec<String>,
}

/// The name of the log file in a case's folder.
const LOG_FILE: &str = "sim.db";

/// Where the clock starts: every process of a case reads one clock.
const CLOCK_START_MS: u64 = 1_700_000_000_000;

/// A clock that moves one millisecond each time it is read.
struct TickClock(Arc<AtomicU64>);

impl Clock for TickClock {
    fn now_ms(&self) -> i64 {
        i64::try_from(self.0.fetch_add(1, Ordering::Relaxed)).unwrap_or(i64::MAX)
    }
}

/// Saga ids `p<pid>-0001`, `p<pid>-0002`, ...
struct CountingIds {
    pid: u32,
    next: AtomicU64,
}

impl IdSource for CountingIds {
    fn new_saga_id(&self) -> SagaId {
        let n = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        SagaId::new(format!("p{}-{n:04}", self.pid))
    }
}

/// The processes a case has killed (or that have ended) are dead; the others alive.
struct DeadPids {
    /// Dead for good.
    dead: Vec<u32>,
    /// Dead once killed or ended.
    watched: Vec<(u32, Arc<Process>)>,
}

impl DeadPids {
    fn these(dead: Vec<u32>) -> DeadPids {
        DeadPids {
            dead,
            watched: Vec::new(),
        }
    }
}

impl LivenessProbe for DeadPids {
    fn liveness(&self, owner: &Owner) -> Liveness {
        let watched_dead = self
            .watched
            .iter()
            .any(|(pid, process)| *pid == owner.pid && process.is_dead());
        if self.dead.contains(&owner.pid) || watched_dead {
            Liveness::Dead
        } else {
            Liveness::Alive
        }
    }
}

fn owner(pid: u32) -> Owner {
    Owner {
        host: "sim".into(),
        boot_id: "sim-boot".into(),
        pid,
        start_ticks: u64::from(pid),
    }
}

/// Everything one simulated process needs.
struct Run<'a> {
    dir: &'a Path,
    world: Arc<World>,
    clock: Arc<AtomicU64>,
}

impl Run<'_> {
    fn open_log(&self) -> anyhow::Result<Arc<SqliteLog>> {
        let options = LogOptions {
            durability: Durability::Normal,
            clock: Arc::new(TickClock(self.clock.clone())),
        };
        let log = SqliteLog::open(&self.dir.join(LOG_FILE), options).context("opening the log")?;
        // Each call is waited for on the process's own thread (`log.rs`): polling would only
        // take the core from the writer.
        log.set_spin(std::time::Duration::ZERO);
        Ok(Arc::new(log))
    }

    /// Process `pid`, meeting `fault`, with processes `dead` known dead; and its log,
    /// without the faults.
    fn kernel(
        &self,
        process: &Arc<Process>,
        pid: u32,
        dead: DeadPids,
    ) -> anyhow::Result<(Kernel, Arc<SqliteLog>)> {
        let sqlite = self.open_log()?;
        let log: Arc<dyn TxLog> = Arc::new(FaultyLog::new(sqlite.clone(), process.clone()));
        let mut tools = Dispatcher::new(Limits::default(), Arc::new(NoJitter))
            .map_err(|err| anyhow::anyhow!("limits: {err}"))?;
        tools
            .register(ToolEntry::compensated(SetTool {
                world: self.world.clone(),
                process: process.clone(),
            }))
            .map_err(|err| anyhow::anyhow!("registering sim.set: {err}"))?;
        let kernel = Kernel::new(
            log,
            Arc::new(tools),
            Arc::new(Guardrail::builtin()),
            Environment {
                clock: Arc::new(TickClock(self.clock.clone())),
                ids: Arc::new(CountingIds {
                    pid,
                    next: AtomicU64::new(0),
                }),
                owner: owner(pid),
                liveness: Arc::new(dead),
            },
            Durability::Normal,
        );
        Ok((kernel, sqlite))
    }
}

/// Closes `log` once nothing else holds it (its kernel dropped), so the next process, or
/// the next case, finds the file as a new process would.
fn close(log: Arc<SqliteLog>) -> anyhow::Result<()> {
    let log = Arc::try_unwrap(log)
        .map_err(|_| anyhow::anyhow!("the log is still held after its process ended"))?;
    runtime()?.block_on(log.close());
    Ok(())
}

/// The empty log every case starts from, made once per folder: a copy costs a fifth of
/// creating a log.
const TEMPLATE_FILE: &str = "template.db";

/// Puts an empty log at [`LOG_FILE`] in `dir`, over whatever an earlier case left.
fn fresh_log(dir: &Path) -> anyhow::Result<()> {
    let template = dir.join(TEMPLATE_FILE);
    let log = dir.join(LOG_FILE);
    if !template.exists() {
        let options = LogOptions {
            durability: Durability::Normal,
            clock: Arc::new(TickClock(Arc::new(AtomicU64::new(CLOCK_START_MS)))),
        };
        let made = SqliteLog::open(&template, options).context("making the template log")?;
        runtime()?.block_on(made.close());
    }
    for suffix in ["-wal", "-shm", "-journal"] {
        let _ = std::fs::remove_file(with_suffix(&log, suffix));
    }
    std::fs::copy(&template, &log).context("copying the template log")?;
    let template_wal = with_suffix(&template, "-wal");
    if template_wal.exists() {
        std::fs::copy(&template_wal, with_suffix(&log, "-wal")).context("copying its WAL")?;
    }
    std::fs::copy(
        agent_kernel_txlog::audit_head_path(&template),
        agent_kernel_txlog::audit_head_path(&log),
    )
    .context("copying the template's head file")?;
    Ok(())
}

fn with_suffix(path: &Path, suffix: &str) -> std::path::PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    name.into()
}

/// A runtime whose time moves only when every task waits: timers fire in one order.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .context("building the runtime")
}

/// Runs `case` in `dir` (empty, or left by an earlier case: it is cleared).
///
/// # Errors
///
/// When the log cannot be opened or read at all: not a finding, a broken harness.
pub fn run_case(case: &Case, dir: &Path) -> anyhow::Result<CaseOutcome> {
    fresh_log(dir)?;
    let run = Run {
        dir,
        world: Arc::new(World::default()),
        clock: Arc::new(AtomicU64::new(CLOCK_START_MS)),
    };
    let mut schedule = Rng::new(case.schedule_seed);
    let mut outcome = CaseOutcome::default();

    // The first process runs every saga at once, and may be killed; an operator may act
    // beside it, and may be killed too.
    let first = Arc::new(Process::new(
        "run",
        case.fault,
        Rng::new(schedule.next_u64()),
        case.scenario.outside.clone(),
        run.world.clone(),
    ));
    // Forked, not drawn, so that the `recover`s get the numbers they got before the
    // operator existed.
    let operator = Arc::new(Process::new(
        "operator",
        case.operator_fault,
        schedule.fork(OPERATOR_STREAMS[0]),
        Vec::new(),
        run.world.clone(),
    ));
    let mut choices = schedule.fork(OPERATOR_STREAMS[1]);
    {
        let (kernel, log) = run.kernel(&first, 1, DeadPids::these(Vec::new()))?;
        let kernel = Arc::new(kernel);
        let watching_first = DeadPids {
            dead: Vec::new(),
            watched: vec![(1, first.clone())],
        };
        // Opened only when it acts: each log opened costs a case about a tenth.
        let operator_kernel = if case.scenario.operator_actions > 0 {
            Some(run.kernel(&operator, OPERATOR_PID, watching_first)?)
        } else {
            None
        };
        let runtime = runtime()?;
        runtime.block_on(async {
            let sagas = async {
                let runs = futures_util::future::join_all(
                    (0..case.scenario.sagas.len()).map(|n| drive(&kernel, &case.scenario, n)),
                );
                tokio::select! {
                    biased;
                    () = first.killed() => {}
                    lines = runs => {
                        for line in lines {
                            first.note(line);
                        }
                        // It exits: its sagas are a dead process's now.
                        first.die();
                    }
                }
            };
            let operating = async {
                if let Some((operator_kernel, _)) = &operator_kernel {
                    tokio::select! {
                        biased;
                        () = operator.killed() => {}
                        () = operate(
                            operator_kernel,
                            &operator,
                            case.scenario.operator_actions,
                            &mut choices,
                        ) => operator.die(),
                    }
                }
            };
            futures_util::future::join(sagas, operating).await;
        });
        drop(kernel);
        close(log)?;
        if let Some((operator_kernel, operator_log)) = operator_kernel {
            drop(operator_kernel);
            close(operator_log)?;
        }
    }
    let (points, fired) = first.points();
    outcome.points = points;
    outcome.log_writes = first.log_writes();
    outcome.faults_fired += u64::from(fired);
    let (operator_points, operator_fired) = operator.points();
    outcome.operator_points = operator_points;
    outcome.faults_fired += u64::from(operator_fired);

    // A `recover` that may be killed in turn, then, if it was, one that is not; the checks
    // read the last one's log.
    let mut last_log = None;
    for (pid, name, fault) in [
        (OPERATOR_PID + 1, "recover", case.recovery_fault),
        (OPERATOR_PID + 2, "recover again", None),
    ] {
        let process = Arc::new(Process::new(
            name,
            fault,
            Rng::new(schedule.next_u64()),
            Vec::new(),
            run.world.clone(),
        ));
        let (kernel, log) = run.kernel(&process, pid, DeadPids::these((1..pid).collect()))?;
        let runtime = runtime()?;
        runtime.block_on(async {
            tokio::select! {
                biased;
                () = process.killed() => {}
                report = kernel.recover(&NoObserver) => match report {
                    Ok(report) => process.note(format!("settled {} sagas", report.sagas.len())),
                    Err(err) => {
                        // Its faults are kills, which end it silently: an error is a finding.
                        process.note(format!("failed: {err}"));
                        outcome.violations.push(format!("{name} failed: {err}"));
                    }
                },
            }
        });
        drop(kernel);
        let killed = process.points().1;
        outcome.faults_fired += u64::from(killed);
        outcome.history.extend(if pid == OPERATOR_PID + 1 {
            first
                .history()
                .into_iter()
                .chain(operator.history())
                .chain(process.history())
                .collect()
        } else {
            process.history()
        });
        if pid == OPERATOR_PID + 2 || !killed {
            last_log = Some(log);
            break;
        }
        close(log)?;
    }

    // An agent started again runs every saga once more, each as a plan with its keys.
    if case.scenario.retried {
        if let Some(log) = last_log.take() {
            close(log)?;
        }
        let agent = Arc::new(Process::new(
            "agent again",
            None,
            schedule.fork(RETRY_STREAM),
            Vec::new(),
            run.world.clone(),
        ));
        let (kernel, log) =
            run.kernel(&agent, RETRY_PID, DeadPids::these((1..RETRY_PID).collect()))?;
        let kernel = Arc::new(kernel);
        let mut again = case.scenario.clone();
        again.drivers = vec![Driver::Plan; again.sagas.len()];
        let runtime = runtime()?;
        runtime.block_on(async {
            let lines = futures_util::future::join_all(
                (0..again.sagas.len()).map(|n| drive(&kernel, &again, n)),
            )
            .await;
            for line in lines {
                agent.note(line);
            }
        });
        drop(kernel);
        outcome.history.extend(agent.history());
        last_log = Some(log);
    }

    let world = run.world.snapshot();
    let log = last_log.context("the last recover's log")?;
    let runtime = runtime()?;
    let sagas = runtime.block_on(read_sagas(&*log))?;
    let open_letters: Vec<SagaId> = runtime
        .block_on(log.open_dead_letters(None))
        .context("reading the dead letters")?
        .into_iter()
        .map(|letter| letter.saga_id)
        .collect();
    close(log)?;
    let audit = agent_kernel_txlog::verify(&dir.join(LOG_FILE), None);
    check(&world, &sagas, &open_letters, &mut outcome.violations);
    check_steps(&world, &sagas, &mut outcome.violations);
    check_retries(
        &world,
        &sagas,
        case.scenario.retried,
        &mut outcome.violations,
    );
    match audit {
        Ok(report) if report.is_intact() => {}
        Ok(report) => outcome.violations.push(format!(
            "the audit chain does not verify: {:?}",
            report.first_bad
        )),
        Err(err) => outcome
            .violations
            .push(format!("the audit chain cannot be verified: {err}")),
    }
    for record in &sagas {
        let reused = record
            .steps
            .iter()
            .filter(|step| step.reused_from.is_some())
            .count();
        outcome.history.push(format!(
            "end: {} ({}) {}{}",
            record.saga.saga_id,
            record.saga.name.as_deref().unwrap_or_default(),
            record.saga.state,
            if reused > 0 {
                format!(", {reused} steps reused")
            } else {
                String::new()
            }
        ));
    }
    for event in &world.journal {
        outcome.history.push(format!("journal: {event}"));
    }
    Ok(outcome)
}

/// Drives saga `n` of `scenario` as its driver says; what came of it, for the history.
async fn drive(kernel: &Arc<Kernel>, scenario: &Scenario, n: usize) -> String {
    let driver = scenario.drivers[n];
    format!(
        "saga {n} ({driver}): {}",
        drive_saga(kernel, scenario, n).await
    )
}

async fn drive_saga(kernel: &Arc<Kernel>, scenario: &Scenario, n: usize) -> String {
    let options = BeginOptions {
        name: Some(format!("saga {n}")),
        ..BeginOptions::default()
    };
    let abort = match scenario.drivers[n] {
        Driver::Plan => {
            return match kernel.run(&scenario.plan(n), &NoObserver).await {
                Ok(report) => format!("ended {}", report.state),
                Err(err) => err.to_string(),
            };
        }
        Driver::CallAlone => {
            let called = kernel
                .call_alone(
                    options,
                    SET_TOOL,
                    scenario.args(n, 0),
                    scenario.idempotency_key(n, 0),
                )
                .await;
            return match called {
                Ok((_, CallAnswer::Committed(_))) => "its call committed".to_owned(),
                // Nothing of it ran: the agent gives it up.
                Ok((saga, answer @ (CallAnswer::Refused(_) | CallAnswer::Conflict(_)))) => {
                    let ended = saga.abort("the call was refused").await;
                    format!(
                        "{}, then aborted: {}",
                        answer_name(&answer),
                        ended_as(ended)
                    )
                }
                Ok((_, answer)) => format!("its call {}", answer_name(&answer)),
                Err(err) => err.to_string(),
            };
        }
        Driver::Live { abort } => abort,
    };
    let saga = match kernel.begin(options).await {
        Ok(saga) => saga,
        Err(err) => return format!("not begun: {err}"),
    };
    for m in 0..scenario.sagas[n].len() {
        let key = scenario.idempotency_key(n, m);
        match saga.call(SET_TOOL, scenario.args(n, m), key).await {
            Ok(CallAnswer::Committed(_)) => {}
            Ok(answer @ (CallAnswer::Refused(_) | CallAnswer::Conflict(_))) => {
                let ended = saga.abort("a call was refused").await;
                return format!(
                    "call {m} {}, then aborted: {}",
                    answer_name(&answer),
                    ended_as(ended)
                );
            }
            Ok(answer) => return format!("call {m} {}", answer_name(&answer)),
            Err(err) => return format!("call {m}: {err}"),
        }
    }
    let ended = if abort {
        saga.abort("the agent changed its mind").await
    } else {
        saga.commit().await
    };
    format!("ended {}", ended_as(ended))
}

/// What a live call came to, in a word.
fn answer_name(answer: &CallAnswer) -> &'static str {
    match answer {
        CallAnswer::Committed(_) => "committed",
        CallAnswer::Refused(_) => "refused",
        CallAnswer::Denied(_) => "denied",
        CallAnswer::Failed(_) => "failed, rolled back",
        CallAnswer::AwaitingApproval(_) => "awaits an approval",
        CallAnswer::Conflict(_) => "met a conflict",
        _ => "answered",
    }
}

fn ended_as(
    ended: Result<agent_kernel_core::SagaReport, agent_kernel_core::KernelError>,
) -> String {
    match ended {
        Ok(report) => report.state.to_string(),
        Err(err) => err.to_string(),
    }
}

/// The operator's process id; the recovers' follow it.
const OPERATOR_PID: u32 = 2;

/// The process id of the agent started again (a retried scenario), after the recovers'.
const RETRY_PID: u32 = OPERATOR_PID + 3;

/// The stream of the agent started again's schedule ([`Rng::fork`]).
const RETRY_STREAM: u64 = 0x7265_7472_795F_6167;

/// How many times the operator looks for something to act on, a few yields apart, before
/// it gives an action up.
const OPERATOR_LOOKS_MAX: u32 = 24;

/// The operator's `actions`: each waits until a saga has ended `Done` or a dead letter is
/// open, then undoes that saga or retries that letter (without `--force`), as `agent-kernel
/// undo` and `dlq retry` do, through a kernel of its own process.
async fn operate(kernel: &Kernel, process: &Process, actions: u32, choices: &mut Rng) {
    for _ in 0..actions {
        for _ in 0..OPERATOR_LOOKS_MAX {
            for _ in 0..=choices.below(8) {
                tokio::task::yield_now().await;
            }
            let (Ok(sagas), Ok(letters)) = (
                kernel.log().sagas(u32::MAX).await,
                kernel.dead_letters(None).await,
            ) else {
                continue;
            };
            let done: Vec<SagaId> = sagas
                .into_iter()
                .filter(|saga| saga.state == SagaState::Done)
                .map(|saga| saga.saga_id)
                .collect();
            let candidates = done.len() + letters.len();
            if candidates == 0 {
                continue;
            }
            let pick = usize::try_from(choices.below(candidates as u64)).unwrap_or(0);
            if let Some(saga_id) = done.get(pick) {
                let request = UndoRequest {
                    reason: "the simulated operator undoes it".to_owned(),
                    force: false,
                    by: Some("sim".to_owned()),
                };
                process.note(format!("undo {saga_id}"));
                let line = match kernel.undo(saga_id, &request, &NoObserver).await {
                    Ok(report) => format!("undo {saga_id}: {}", report.state),
                    Err(err) => format!("undo {saga_id}: {err}"),
                };
                process.note(line);
            } else {
                let letter = &letters[pick - done.len()];
                let id = &letter.letter_id;
                process.note(format!("dlq retry {id} of {}", letter.saga_id));
                let line = match kernel.retry_dead_letter(id, Some("sim".to_owned())).await {
                    Ok(outcome) => format!("dlq retry {id}: saga {}", outcome.saga_state),
                    Err(err) => format!("dlq retry {id}: {err}"),
                };
                process.note(line);
            }
            break;
        }
    }
}

/// Every saga of the log, with its steps and locks.
async fn read_sagas(log: &dyn TxLog) -> anyhow::Result<Vec<SagaRecord>> {
    let summaries = log.sagas(u32::MAX).await.context("listing the sagas")?;
    let mut records = Vec::new();
    for summary in summaries {
        if let Some(record) = log.saga(&summary.saga_id).await.context("reading a saga")? {
            records.push(record);
        }
    }
    records.sort_by_key(|record| record.saga.saga_id.to_string());
    Ok(records)
}

/// Whether a saga may rightly be left to an operator: a compensation of it failed, or
/// another writer (outside the kernel, or another saga) changed a key after one of its
/// steps had prepared it, so that undoing the step could destroy that. (A step prepared
/// before another saga wrote or compensated and settled, and claimed after, carries stale undo data: a
/// kill before the engine's check of it leaves recovery a "changed since" it cannot tell
/// from a real one.)
fn has_cause_to_park(world: &WorldState, record: &SagaRecord) -> bool {
    let saga_id = record.saga.saga_id.to_string();
    let mut prepared: Vec<&str> = Vec::new();
    for event in &world.journal {
        match event {
            Event::CompensationFailed { saga, .. } if *saga == saga_id => return true,
            Event::Prepared { saga, key, .. } if *saga == saga_id => prepared.push(key),
            Event::Outside { key, .. } if prepared.contains(&key.as_str()) => return true,
            Event::Effect { saga, key, .. } | Event::Restored { saga, key, .. }
                if *saga != saga_id && prepared.contains(&key.as_str()) =>
            {
                return true;
            }
            _ => {}
        }
    }
    false
}

/// What the log says each saga's steps did, against the journal: a `Done` saga's every
/// committed step acted once; every effect of a saga rolled back or undone in full was
/// compensated after it.
fn check_steps(world: &WorldState, sagas: &[SagaRecord], violations: &mut Vec<String>) {
    for record in sagas {
        let id = record.saga.saga_id.to_string();
        let state = record.saga.state;
        match state {
            SagaState::Done => {
                for step in &record.steps {
                    if step.status != StepStatus::Commit {
                        continue;
                    }
                    // A step that reused another's output (its idempotency key) acted there.
                    let (acting, acting_step) = match &step.reused_from {
                        Some((from, from_step)) => (from.to_string(), *from_step),
                        None => (id.clone(), step.step_seq),
                    };
                    let acted = world
                        .journal
                        .iter()
                        .filter(|event| {
                            matches!(event, Event::Effect { saga, step: seq, .. }
                                if *saga == acting && *seq == acting_step)
                        })
                        .count();
                    let reused_yet_acted = step.reused_from.is_some()
                        && world.journal.iter().any(|event| {
                            matches!(event, Event::Effect { saga, step: seq, .. }
                                if *saga == id && *seq == step.step_seq)
                        });
                    if reused_yet_acted {
                        violations.push(format!(
                            "{id}/{} reused {acting}/{acting_step}'s output, and acted too",
                            step.step_seq
                        ));
                    }
                    if acted != 1 {
                        violations.push(format!(
                            "{id}/{} is committed in a Done saga, and the effect of {acting}/{acting_step} happened {acted} times",
                            step.step_seq
                        ));
                    }
                }
            }
            SagaState::FailedRolledBack | SagaState::Undone => {
                for (at, event) in world.journal.iter().enumerate() {
                    let Event::Effect { saga, step, .. } = event else {
                        continue;
                    };
                    if *saga != id {
                        continue;
                    }
                    let undone = world.journal[at..].iter().any(|later| {
                        matches!(later, Event::Restored { saga, step: seq, .. }
                            if *saga == id && seq == step)
                    });
                    if !undone {
                        violations.push(format!(
                            "{id} ended {state}, and the effect of {id}/{step} was never compensated"
                        ));
                    }
                }
            }
            _ => {}
        }
    }
}

/// Exactly once by key, when the scenario was `retried`: each saga of the first process
/// that ended `Done`, rolled back or undone was run again (by [`RETRY_PID`]); the run again
/// reused every step of a first run that ended `Done`, and none of one rolled back or
/// undone (its keys released, so it ran anew); and a step whose key a parked first run
/// still holds (its step committed or its compensation failed) did not act again.
fn check_retries(
    world: &WorldState,
    sagas: &[SagaRecord],
    retried: bool,
    violations: &mut Vec<String>,
) {
    if !retried {
        return;
    }
    let retry_prefix = format!("p{RETRY_PID}-");
    for first in sagas
        .iter()
        .filter(|record| record.saga.saga_id.as_str().starts_with("p1-"))
    {
        let first_id = &first.saga.saga_id;
        let Some(again) = sagas.iter().find(|record| {
            record.saga.name == first.saga.name
                && record.saga.saga_id.as_str().starts_with(&retry_prefix)
        }) else {
            if matches!(
                first.saga.state,
                SagaState::Done | SagaState::FailedRolledBack | SagaState::Undone
            ) {
                violations.push(format!(
                    "{first_id} ended {}, and the agent started again ran no saga in its place",
                    first.saga.state
                ));
            }
            continue;
        };
        let again_id = &again.saga.saga_id;
        let reused: Vec<Option<u32>> = again
            .steps
            .iter()
            .map(|step| {
                step.reused_from
                    .as_ref()
                    .filter(|(from, _)| from == first_id)
                    .map(|(_, from_step)| *from_step)
            })
            .collect();
        match first.saga.state {
            SagaState::Done => {
                let every_step: Vec<Option<u32>> =
                    first.steps.iter().map(|step| Some(step.step_seq)).collect();
                if again.saga.state != SagaState::Done || reused != every_step {
                    violations.push(format!(
                        "{again_id} ran {first_id} again with its keys after it ended Done, and ended {} reusing {reused:?}, not every step",
                        again.saga.state
                    ));
                }
            }
            SagaState::FailedRolledBack | SagaState::Undone
                if reused.iter().any(Option::is_some) =>
            {
                violations.push(format!(
                    "{again_id} reused a step of {first_id}, which ended {}",
                    first.saga.state
                ));
            }
            SagaState::FailedRollbackPartial => {
                let again_text = again_id.to_string();
                for step in first.steps.iter().filter(|step| {
                    matches!(
                        step.status,
                        StepStatus::Commit | StepStatus::CompensationFailed
                    )
                }) {
                    let acted = world.journal.iter().any(|event| {
                        matches!(event, Event::Effect { saga, step: seq, .. }
                            if *saga == again_text && *seq == step.step_seq)
                    });
                    if acted {
                        violations.push(format!(
                            "{again_id}/{} acted again under the key {first_id}/{} still holds",
                            step.step_seq, step.step_seq
                        ));
                    }
                }
            }
            _ => {}
        }
    }
}

/// The invariants, against the model of the world: the effects of `Done` sagas and the
/// outside writes, latest last.
fn check(
    world: &WorldState,
    sagas: &[SagaRecord],
    open_letters: &[SagaId],
    violations: &mut Vec<String>,
) {
    let states: BTreeMap<String, SagaState> = sagas
        .iter()
        .map(|record| (record.saga.saga_id.to_string(), record.saga.state))
        .collect();
    for record in sagas {
        let id = &record.saga.saga_id;
        let state = record.saga.state;
        if !state.is_terminal() {
            violations.push(format!("{id} is left {state} after the last recover"));
        }
        let parked = state == SagaState::FailedRollbackPartial;
        if parked && !open_letters.contains(id) {
            violations.push(format!(
                "{id} ended {state} and no open dead letter names it"
            ));
        }
        if parked && !has_cause_to_park(world, record) {
            violations.push(format!(
                "{id} ended {state}, though no compensation of it failed and no other writer touched what it was to write"
            ));
        }
        if state.is_terminal() && !parked && !record.locks.is_empty() {
            violations.push(format!(
                "{id} ended {state} and still holds {:?}",
                record.locks
            ));
        }
    }
    // Each step: how many times its effect happened, and whether it was undone since.
    let mut effects: BTreeMap<(String, u32), (u32, bool)> = BTreeMap::new();
    // Each key: the event the world should show (a Done saga's effect or an outside
    // write), and whether a parked saga's effect came after it.
    let mut expected: BTreeMap<String, (Option<i64>, bool)> = BTreeMap::new();
    for event in &world.journal {
        match event {
            Event::Effect {
                saga,
                step,
                key,
                value,
            } => {
                let entry = effects.entry((saga.clone(), *step)).or_default();
                entry.0 += 1;
                if entry.1 {
                    violations.push(format!(
                        "the effect of {saga}/{step} happened after its compensation"
                    ));
                }
                if entry.0 > 1 {
                    violations.push(format!("the effect of {saga}/{step} happened twice"));
                }
                match states.get(saga) {
                    Some(SagaState::Done) => {
                        expected.insert(key.clone(), (Some(*value), false));
                    }
                    Some(SagaState::FailedRollbackPartial) => {
                        expected.entry(key.clone()).or_insert((None, false)).1 = true;
                    }
                    Some(_) => {}
                    None => violations.push(format!(
                        "{saga}/{step} acted, and the log holds no such saga"
                    )),
                }
            }
            Event::Restored { saga, step, .. } => {
                effects.entry((saga.clone(), *step)).or_default().1 = true;
            }
            Event::Clobbered {
                saga,
                step,
                key,
                found,
            } => violations.push(format!(
                "the compensation of {saga}/{step} destroyed a later write ({key} held {})",
                shown(*found)
            )),
            Event::Outside { key, value } => {
                expected.insert(key.clone(), (Some(*value), false));
            }
            Event::CompensationFailed { .. } | Event::Prepared { .. } => {}
        }
    }
    for (key, (value, after_parked)) in &expected {
        let found = world.values.get(key).copied();
        if found != *value && !after_parked {
            violations.push(format!(
                "{key} holds {}, where the sagas that ended Done and the outside writes leave {}",
                shown(found),
                shown(*value)
            ));
        }
    }
    for (key, value) in &world.values {
        if !expected.contains_key(key) {
            violations.push(format!(
                "{key} holds {value}, and no saga that ended Done nor any outside writer wrote it"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use agent_kernel_api::{SagaState, SagaSummary};

    use super::*;

    fn saga(id: &str, state: SagaState, locks: &[&str]) -> SagaRecord {
        SagaRecord {
            saga: SagaSummary {
                saga_id: SagaId::new(id),
                name: None,
                actor: None,
                state,
                owner: owner(1),
                n_steps: 1,
                dry_run: false,
                created_at_ms: 0,
                updated_at_ms: 0,
            },
            steps: Vec::new(),
            locks: locks.iter().map(|lock| (*lock).to_owned()).collect(),
            conflicts: Vec::new(),
        }
    }

    fn effect(saga: &str, key: &str, value: i64) -> Event {
        Event::Effect {
            saga: saga.to_owned(),
            step: 1,
            key: key.to_owned(),
            value,
        }
    }

    fn restored(saga: &str, key: &str, to: Option<i64>) -> Event {
        Event::Restored {
            saga: saga.to_owned(),
            step: 1,
            key: key.to_owned(),
            to,
        }
    }

    fn violations(
        journal: Vec<Event>,
        values: &[(&str, i64)],
        sagas: &[SagaRecord],
    ) -> Vec<String> {
        let world = WorldState {
            values: values
                .iter()
                .map(|(key, value)| ((*key).to_owned(), *value))
                .collect(),
            journal,
        };
        let mut found = Vec::new();
        check(&world, sagas, &[], &mut found);
        found
    }

    #[test]
    fn a_world_as_the_done_sagas_and_outside_writers_left_it_passes() {
        let sagas = [
            saga("s1", SagaState::Done, &[]),
            saga("s2", SagaState::FailedRolledBack, &[]),
        ];
        let journal = vec![
            effect("s1", "a", 1),
            effect("s2", "a", 2),
            restored("s2", "a", Some(1)),
            Event::Outside {
                key: "b".into(),
                value: 1000,
            },
        ];
        assert_eq!(
            violations(journal, &[("a", 1), ("b", 1000)], &sagas),
            Vec::<String>::new()
        );
    }

    /// CI's run at seed 1796514550604883940 (before 1d37a0c) took this for a saga parked
    /// without cause: its step prepared `a`, another saga's compensation then restored `a`
    /// and settled, and the step, claimed after, was killed right after its BEGIN, so
    /// recovery found its undo data stale ("changed since") and rightly parked it.
    #[test]
    fn another_sagas_compensation_after_a_prepare_is_a_cause_to_park() {
        let parked = saga("s2", SagaState::FailedRollbackPartial, &[]);
        let prepared = Event::Prepared {
            saga: "s2".into(),
            step: 1,
            key: "a".into(),
        };
        let world = |journal: Vec<Event>| WorldState {
            values: BTreeMap::new(),
            journal,
        };
        let after = world(vec![
            effect("s1", "a", 1),
            prepared.clone(),
            restored("s1", "a", None),
        ]);
        assert!(has_cause_to_park(&after, &parked));
        let before = world(vec![
            effect("s1", "a", 1),
            restored("s1", "a", None),
            prepared,
        ]);
        assert!(!has_cause_to_park(&before, &parked));
    }

    fn step(seq: u32, reused_from: Option<(&str, u32)>) -> agent_kernel_api::StepRecord {
        agent_kernel_api::StepRecord {
            step_seq: seq,
            tool_id: crate::tools::SET_TOOL.to_owned(),
            tool_version: "1.0.0".to_owned(),
            effect: agent_kernel_api::EffectClass::Mutating,
            args: serde_json::json!({}),
            args_hash: String::new(),
            idempotency_key: Some(format!("key-0-{seq}")),
            undo: agent_kernel_api::Undo::none(),
            status: StepStatus::Commit,
            output: None,
            error: None,
            reused_from: reused_from.map(|(saga, seq)| (SagaId::new(saga), seq)),
            compensation: None,
            created_at_ms: 0,
            updated_at_ms: 0,
        }
    }

    fn named(
        mut record: SagaRecord,
        name: &str,
        steps: Vec<agent_kernel_api::StepRecord>,
    ) -> SagaRecord {
        record.saga.name = Some(name.to_owned());
        record.steps = steps;
        record
    }

    #[test]
    fn a_saga_run_again_must_reuse_what_was_done_and_only_that() {
        let again = format!("p{RETRY_PID}-0001");
        let reusing = |from: &str| vec![step(0, Some((from, 0))), step(1, Some((from, 1)))];
        let done_again = || {
            named(
                saga("p1-0001", SagaState::Done, &[]),
                "saga 0",
                vec![step(0, None), step(1, None)],
            )
        };
        let done = done_again();
        let mut found = Vec::new();
        let world = WorldState::default();
        check_retries(
            &world,
            &[
                done.clone(),
                named(
                    saga(&again, SagaState::Done, &[]),
                    "saga 0",
                    reusing("p1-0001"),
                ),
            ],
            true,
            &mut found,
        );
        assert_eq!(found, Vec::<String>::new());
        // Run twice: the first run's effects stand, and the second made its own.
        check_retries(
            &world,
            &[
                done,
                named(
                    saga(&again, SagaState::Done, &[]),
                    "saga 0",
                    vec![step(0, None), step(1, None)],
                ),
            ],
            true,
            &mut found,
        );
        assert!(
            found
                .iter()
                .any(|violation| violation.contains("not every step")),
            "{found:?}"
        );
        found.clear();
        // A first run that ended Done, and no run again in its place.
        check_retries(&world, &[done_again()], true, &mut found);
        assert!(
            found
                .iter()
                .any(|violation| violation.contains("ran no saga in its place")),
            "{found:?}"
        );
        found.clear();
        let rolled_back = named(
            saga("p1-0001", SagaState::FailedRolledBack, &[]),
            "saga 0",
            Vec::new(),
        );
        check_retries(
            &world,
            &[
                rolled_back,
                named(
                    saga(&again, SagaState::Done, &[]),
                    "saga 0",
                    reusing("p1-0001"),
                ),
            ],
            true,
            &mut found,
        );
        assert!(
            found
                .iter()
                .any(|violation| violation.contains("which ended FailedRolledBack")),
            "{found:?}"
        );
    }

    #[test]
    fn each_broken_invariant_is_named() {
        let sagas = [
            saga("s1", SagaState::Done, &["key:a"]),
            saga("s2", SagaState::FailedRolledBack, &[]),
            saga("s3", SagaState::Acting, &[]),
            saga("s4", SagaState::FailedRollbackPartial, &[]),
        ];
        let journal = vec![
            effect("s2", "b", 2),
            restored("s2", "b", None),
            effect("s2", "b", 2),
            Event::Clobbered {
                saga: "s2".into(),
                step: 1,
                key: "c".into(),
                found: Some(1000),
            },
            effect("s1", "a", 1),
        ];
        let found = violations(journal, &[("a", 7), ("b", 2)], &sagas);
        for expected in [
            "s1 ended Done and still holds",
            "s3 is left Acting",
            "s4 ended FailedRollbackPartial and no open dead letter",
            "s4 ended FailedRollbackPartial, though no compensation of it failed",
            "the effect of s2/1 happened after its compensation",
            "the effect of s2/1 happened twice",
            "the compensation of s2/1 destroyed a later write (c held 1000)",
            "a holds 7, where the sagas that ended Done and the outside writes leave 1",
            "b holds 2, and no saga that ended Done",
        ] {
            assert!(
                found
                    .iter()
                    .any(|violation| violation.starts_with(expected)),
                "{expected:?} not in {found:#?}"
            );
        }
    }
}
