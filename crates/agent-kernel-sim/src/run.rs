//! One case: the scenario's sagas run by one process that meets a fault, perhaps an
//! operator beside it who undoes and retries and may meet one too, a `recover` that may
//! meet one, a last `recover`; then the checks.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use agent_kernel_api::{
    AuditEvent, Clock, Durability, IdSource, OperatorCommand, Owner, SagaId, SagaRecord, ToolEntry,
    TxLog,
};
use agent_kernel_core::{ApprovalPolicy, Environment, Kernel, Liveness, LivenessProbe, NoObserver};
use agent_kernel_dispatcher::{Dispatcher, Limits, NoJitter};
use agent_kernel_fsm::Guardrail;
use agent_kernel_txlog::{LogOptions, SqliteLog};
use anyhow::Context as _;

use crate::check::{check, check_approvals, check_retries, check_steps, unlog_lost};
use crate::drivers::drive;
use crate::log::FaultyLog;
use crate::operator::{DECISIONS_STREAM, decide, operate};
use crate::power::{PowerLoss, Recorder};
use crate::process::{Fault, FaultKind, Process};
use crate::scenario::{Driver, OPERATOR_STREAMS, Rng, Scenario};
use crate::tools::{APPROVED_TOOL, PROBED_TOOL, SET_TOOL, SetTool};
use crate::upstream::Upstream;
use crate::with_suffix;
use crate::world::World;

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

impl Case {
    /// The log's durability: `full` where the first process's fault is a power loss at
    /// `full`, else `normal` (a kill of a process loses nothing committed at either).
    pub fn durability(&self) -> Durability {
        match self.fault {
            Some(Fault {
                kind: FaultKind::PowerLossFull { .. },
                ..
            }) => Durability::Full,
            _ => Durability::Normal,
        }
    }

    /// Whether the first process's fault is a power loss.
    fn loses_power(&self) -> bool {
        self.fault.is_some_and(|fault| fault.kind.is_power_loss())
    }
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
    /// What a power loss left, when one happened: how many of the log's writes it kept
    /// of how many, and whether the head file was left newer than the log (then sealed).
    pub power_loss: Option<PowerLoss>,
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

pub(crate) fn owner(pid: u32) -> Owner {
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
    durability: Durability,
    /// Notes the files after each write of the processes before a power loss.
    recorder: Option<Arc<Recorder>>,
}

impl Run<'_> {
    fn open_log(&self) -> anyhow::Result<Arc<SqliteLog>> {
        let options = LogOptions {
            durability: self.durability,
            clock: Arc::new(TickClock(self.clock.clone())),
        };
        let log = SqliteLog::open(&self.dir.join(LOG_FILE), options).context("opening the log")?;
        // Each call is waited for on the process's own thread (`log.rs`): polling would only
        // take the core from the writer.
        log.set_spin(std::time::Duration::ZERO);
        Ok(Arc::new(log))
    }

    /// Process `pid`, meeting `fault`, with processes `dead` known dead; its log, without
    /// the faults; and its upstream server. Its writes are noted for a power loss where
    /// `before_power_loss`.
    fn kernel(
        &self,
        process: &Arc<Process>,
        pid: u32,
        dead: DeadPids,
        before_power_loss: bool,
    ) -> anyhow::Result<(Kernel, Arc<SqliteLog>, Upstream)> {
        let sqlite = self.open_log()?;
        let recorder = self.recorder.clone().filter(|_| before_power_loss);
        let log: Arc<dyn TxLog> =
            Arc::new(FaultyLog::new(sqlite.clone(), process.clone(), recorder));
        let mut tools = Dispatcher::new(Limits::default(), Arc::new(NoJitter))
            .map_err(|err| anyhow::anyhow!("limits: {err}"))?;
        let tool = |id| SetTool {
            world: self.world.clone(),
            process: process.clone(),
            id,
        };
        for entry in [
            ToolEntry::compensated(tool(SET_TOOL)),
            ToolEntry::compensated_probed(tool(PROBED_TOOL)),
            ToolEntry::compensated(tool(APPROVED_TOOL)),
        ] {
            let id = entry.id().to_owned();
            tools
                .register(entry)
                .map_err(|err| anyhow::anyhow!("registering {id}: {err}"))?;
        }
        let upstream = Upstream::new(self.world.clone(), process.clone());
        tools
            .add_source(upstream.source())
            .map_err(|err| anyhow::anyhow!("the upstream server: {err}"))?;
        let approvals = ApprovalPolicy::new(vec![APPROVED_TOOL.to_owned()], APPROVAL_TIMEOUT_MS)
            .map_err(|err| anyhow::anyhow!("the approval policy: {err}"))?;
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
            self.durability,
        )
        .with_approval_policy(approvals);
        Ok((kernel, sqlite, upstream))
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
    let world = Arc::new(World::default());
    let recorder = if case.loses_power() {
        Some(Arc::new(Recorder::new(&dir.join(LOG_FILE), world.clone())))
    } else {
        None
    };
    let run = Run {
        dir,
        world,
        clock: Arc::new(AtomicU64::new(CLOCK_START_MS)),
        durability: case.durability(),
        recorder,
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
    first.shares_machine_with(operator.clone());
    let mut choices = schedule.fork(OPERATOR_STREAMS[1]);
    let mut decisions = schedule.fork(DECISIONS_STREAM);
    let mut lost = None;
    {
        let (kernel, log, upstream) = run.kernel(&first, 1, DeadPids::these(Vec::new()), true)?;
        let kernel = Arc::new(kernel);
        let watching_first = DeadPids {
            dead: Vec::new(),
            watched: vec![(1, first.clone())],
        };
        // Opened only when it acts: each log opened costs a case about a tenth.
        let operator_kernel = if case.scenario.has_operator() {
            Some(run.kernel(&operator, OPERATOR_PID, watching_first, true)?)
        } else {
            None
        };
        let runtime = runtime()?;
        runtime.block_on(async {
            let sagas = async {
                let runs = async {
                    let lines = futures_util::future::join_all(
                        (0..case.scenario.sagas.len()).map(|n| drive(&kernel, &case.scenario, n)),
                    )
                    .await;
                    // It ends once its upstream server finished what it was asked.
                    upstream.idle().await;
                    lines
                };
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
                if let Some((operator_kernel, _, operator_upstream)) = &operator_kernel {
                    let deciding = async {
                        if case.scenario.asks_approvals() {
                            decide(operator_kernel, &operator, &first, &mut decisions).await;
                        }
                    };
                    tokio::select! {
                        biased;
                        () = operator.killed() => {}
                        _ = async {
                            futures_util::future::join(
                                operate(
                                    operator_kernel,
                                    &operator,
                                    case.scenario.operator_actions,
                                    &mut choices,
                                ),
                                deciding,
                            )
                            .await;
                            operator_upstream.idle().await;
                        } => operator.die(),
                    }
                }
            };
            futures_util::future::join(sagas, operating).await;
        });
        drop((kernel, upstream));
        // What the write-ahead log holds, before closing checkpoints it away.
        let wal = match &run.recorder {
            Some(recorder) if first.lost_power() => {
                Some(recorder.wal_now(&dir.join(TEMPLATE_FILE))?)
            }
            _ => None,
        };
        close(log)?;
        if let Some((operator_kernel, operator_log, operator_upstream)) = operator_kernel {
            drop((operator_kernel, operator_upstream));
            close(operator_log)?;
        }
        if let (Some(recorder), Some(wal), Some(fault)) = (&run.recorder, wal, case.fault) {
            let (loss, unrecorded) =
                recorder.lose_power(fault.kind, &dir.join(TEMPLATE_FILE), &wal)?;
            outcome.history.push(format!(
                "the power lost: the log keeps {} of its {} writes{}",
                loss.writes_kept,
                loss.writes,
                if loss.head_ahead {
                    ", its head file names a record lost"
                } else if loss.head_behind {
                    ", its head file an older record"
                } else {
                    ""
                }
            ));
            back_on(&run, loss.head_ahead, &mut outcome.violations)?;
            outcome.power_loss = Some(loss);
            if !loss.full {
                lost = Some(unrecorded);
            }
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
        let (kernel, log, upstream) =
            run.kernel(&process, pid, DeadPids::these((1..pid).collect()), false)?;
        let runtime = runtime()?;
        runtime.block_on(async {
            let recovering = async {
                let report = kernel.recover(&NoObserver).await;
                upstream.idle().await;
                report
            };
            tokio::select! {
                biased;
                () = process.killed() => {}
                report = recovering => match report {
                    Ok(report) => process.note(format!("settled {} sagas", report.sagas.len())),
                    Err(err) => {
                        // Its faults are kills, which end it silently: an error is a finding.
                        process.note(format!("failed: {err}"));
                        outcome.violations.push(format!("{name} failed: {err}"));
                    }
                },
            }
        });
        drop((kernel, upstream));
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
        let (kernel, log, upstream) = run.kernel(
            &agent,
            RETRY_PID,
            DeadPids::these((1..RETRY_PID).collect()),
            false,
        )?;
        let kernel = Arc::new(kernel);
        let mut again = case.scenario.clone();
        again.drivers = vec![Driver::Plan; again.sagas.len()];
        let runtime = runtime()?;
        runtime.block_on(async {
            let lines = futures_util::future::join_all(
                (0..again.sagas.len()).map(|n| drive(&kernel, &again, n)),
            )
            .await;
            upstream.idle().await;
            for line in lines {
                agent.note(line);
            }
        });
        drop((kernel, upstream));
        outcome.history.extend(agent.history());
        last_log = Some(log);
    }

    let mut world = run.world.snapshot();
    let log = last_log.context("the last recover's log")?;
    let runtime = runtime()?;
    let sagas = runtime.block_on(read_sagas(&*log))?;
    let open_letters: Vec<SagaId> = runtime
        .block_on(log.open_dead_letters(None))
        .context("reading the dead letters")?
        .into_iter()
        .map(|letter| letter.saga_id)
        .collect();
    let approvals = runtime.block_on(read_approvals(&*log, &sagas))?;
    close(log)?;
    if let Some(unrecorded) = lost {
        let unlogged = unlog_lost(&mut world, unrecorded, &sagas);
        if let Some(power_loss) = &mut outcome.power_loss {
            power_loss.unlogged = unlogged;
        }
    }
    let audit = agent_kernel_txlog::verify(&dir.join(LOG_FILE), None);
    check(&world, &sagas, &open_letters, &mut outcome.violations);
    check_steps(&world, &sagas, &mut outcome.violations);
    check_approvals(&world, &sagas, &approvals, &mut outcome.violations);
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
        let approval = approvals
            .get(&record.saga.saga_id.to_string())
            .map(|approval| {
                format!(
                    ", step {}'s request {:?}",
                    approval.request.step_seq, approval.status
                )
            })
            .unwrap_or_default();
        outcome.history.push(format!(
            "end: {} ({}) {}{}{approval}",
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

/// The machine back after a power loss, before anything runs: `audit verify` finds the log
/// intact, or, exactly where the head file names a record the log lost (`head_ahead`),
/// says so; the operator then checks the log without the head file and seals it, as
/// `audit seal` does.
fn back_on(run: &Run<'_>, head_ahead: bool, violations: &mut Vec<String>) -> anyhow::Result<()> {
    let path = run.dir.join(LOG_FILE);
    match (agent_kernel_txlog::verify(&path, None), head_ahead) {
        (Ok(report), false) if report.is_intact() => return Ok(()),
        (Ok(report), true) if !report.is_intact() => {}
        (Ok(report), true) => {
            violations.push(format!(
                "after the power loss, audit verify accepted the log ({} records), though its head file names a record the log lost",
                report.n_records
            ));
            return Ok(());
        }
        (Ok(report), false) => {
            violations.push(format!(
                "after the power loss, audit verify reported {:?}, though the log and its head file agree",
                report.first_bad
            ));
            return Ok(());
        }
        (Err(err), _) => {
            violations.push(format!(
                "after the power loss, the log cannot be verified: {err}"
            ));
            return Ok(());
        }
    }
    match agent_kernel_txlog::verify_ignoring_head_file(&path, None) {
        Ok(report) if report.is_intact() => {}
        other => {
            violations.push(format!(
                "after the power loss, the log without its head file does not verify: {:?}",
                other.map(|report| report.first_bad)
            ));
            return Ok(());
        }
    }
    let log = run.open_log().context("opening the log to seal it")?;
    let runtime = runtime()?;
    let sealed = runtime.block_on(log.seal(AuditEvent::Operator(OperatorCommand {
        command: "audit seal".to_owned(),
        saga_id: None,
        options: Vec::new(),
        by: owner(SEAL_PID),
        uid: None,
    })));
    close(log)?;
    sealed.context("sealing the log")?;
    Ok(())
}

/// The process id of the operator who seals the log after a power loss.
const SEAL_PID: u32 = 99;

/// The operator's process id; the recovers' follow it.
const OPERATOR_PID: u32 = 2;

/// The process id of the agent started again (a retried scenario), after the recovers'.
pub(crate) const RETRY_PID: u32 = OPERATOR_PID + 3;

/// The stream of the agent started again's schedule ([`Rng::fork`]).
const RETRY_STREAM: u64 = 0x7265_7472_795F_6167;

/// How long a request waits for a decision before it expires, on the simulated clock
/// (which moves a millisecond each time it is read): long enough for the operator to find
/// it, short enough that a request no one decides (the operator killed) expires soon.
const APPROVAL_TIMEOUT_MS: u64 = 150;

/// The newest approval request of each saga that has one, by saga id.
async fn read_approvals(
    log: &dyn TxLog,
    sagas: &[SagaRecord],
) -> anyhow::Result<std::collections::BTreeMap<String, agent_kernel_api::ApprovalRecord>> {
    let mut approvals = std::collections::BTreeMap::new();
    for record in sagas {
        let saga_id = &record.saga.saga_id;
        if let Some(approval) = log
            .saga_approval(saga_id)
            .await
            .context("reading a saga's approval")?
        {
            approvals.insert(saga_id.to_string(), approval);
        }
    }
    Ok(approvals)
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
