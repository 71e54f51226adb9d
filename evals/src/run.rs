//! One scenario, both sides: lay out a fresh folder for each, drive the calls, read the world
//! back, and judge it.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::agents::{baseline_agents, kernel_agents};
use crate::generate::isolation::{OPENING_BALANCE, READ, debit_of, fails, writes};
use crate::scenario::{
    Call, Decision, Drive, KillPoint, Must, Redelivery, SLOW_EFFECT_MS, Scenario, Setup, Writer,
};
use crate::sides::{
    DB, Env, OnRefused, Operator, Run, Side, baseline_chain, build_kernel, cli, configure,
    kernel_chain, resolve,
};
use crate::world::{self, World};

/// How one side of one scenario ended.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SideResult {
    /// The world ended as the scenario says it must, no attack got through, no effect was
    /// duplicated and (for the kernel) its log verifies.
    pub(crate) success: bool,
    /// The world (the files the chain was allowed to touch) was changed, but not to a state
    /// the scenario allows: what a failed chain left applied, a mix left by a crash, an
    /// effect applied twice.
    pub(crate) corrupt: bool,
    /// A forbidden effect happened: a file outside the workspace changed, the internal
    /// server was reached, a secret came back in an output, or a step that needed an
    /// approval ran without one.
    pub(crate) attack_accepted: bool,
    /// Appends that took effect more than once.
    pub(crate) duplicate_effects: u32,
    /// A later writer's change that was lost (undone by a rollback).
    #[serde(default)]
    pub(crate) lost_updates: u32,
    /// The kernel left a step for an operator (`FailedRollbackPartial`).
    pub(crate) operator_attention: bool,
    /// What happened.
    pub(crate) run: Run,
    /// The paths whose content is not what the scenario required.
    pub(crate) wrong_paths: Vec<String>,
}

/// One scenario's result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ScenarioResult {
    /// The scenario.
    pub(crate) scenario: Scenario,
    /// Through the kernel.
    pub(crate) kernel: SideResult,
    /// The tools called directly.
    pub(crate) baseline: SideResult,
}

/// What a child process is asked to do.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ChildSpec {
    side: Side,
    root: PathBuf,
    name: String,
    /// Whether the kernel reads the side's `tools.toml`.
    tools_file: bool,
    calls: Vec<Call>,
    point: Option<KillPoint>,
    kill_after: Option<u32>,
    /// Run `recover` (the library's, with the kill switch) instead of the calls.
    #[serde(default)]
    recover: bool,
}

impl ChildSpec {
    /// `calls` of `scenario` on `side` in `root`, killed nowhere.
    fn chain(scenario: &Scenario, root: &Path, calls: Vec<Call>, side: Side) -> ChildSpec {
        ChildSpec {
            side,
            root: root.to_path_buf(),
            name: scenario.id.clone(),
            tools_file: scenario.tools_file(),
            calls,
            point: None,
            kill_after: None,
            recover: false,
        }
    }
}

/// What a child that was not killed prints.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ChildReport {
    writes: u32,
    run: Run,
}

/// Runs a child's spec (in the child process): the kernel's side with its log wrapped to
/// kill at the point, or the baseline killing itself after so many calls.
///
/// # Errors
///
/// When the spec cannot be read or the kernel fails.
pub(crate) fn child(spec_path: &Path) -> Result<()> {
    let spec: ChildSpec = serde_json::from_slice(&std::fs::read(spec_path)?)?;
    let writes = Arc::new(AtomicU32::new(0));
    let kernel = match spec.side {
        Side::Kernel => build_kernel(
            &spec.root,
            spec.tools_file,
            Some((spec.point, Arc::clone(&writes))),
        )?,
        Side::Baseline => build_kernel(&spec.root, spec.tools_file, None)?,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut run = Run::default();
    runtime.block_on(async {
        match spec.side {
            Side::Kernel if spec.recover => {
                let report = kernel
                    .recover(&agent_kernel::NoObserver)
                    .await
                    .context("recover")?;
                run.note(format!("recovered {} sagas", report.sagas.len()));
                Ok(())
            }
            Side::Kernel => {
                kernel_chain(
                    &kernel,
                    &spec.name,
                    &spec.calls,
                    OnRefused::Abort,
                    None,
                    &mut run,
                )
                .await
            }
            Side::Baseline => {
                baseline_chain(
                    &kernel,
                    &spec.name,
                    &spec.calls,
                    None,
                    spec.kill_after,
                    &mut run,
                )
                .await
            }
        }
    })?;
    let report = ChildReport {
        writes: writes.load(Ordering::SeqCst),
        run,
    };
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

/// The runner of a suite: the environment, and the log writes of each crash chain, learnt
/// once from a run without a kill.
pub(crate) struct Runner {
    env: Env,
    work: PathBuf,
    calibrated: HashSet<String>,
}

impl Runner {
    /// A runner whose scenarios get folders under `work`.
    pub(crate) fn new(env: Env, work: PathBuf) -> Runner {
        Runner {
            env,
            work,
            calibrated: HashSet::new(),
        }
    }

    /// Runs `scenario` through the kernel and as the baseline, each in a fresh folder.
    ///
    /// # Errors
    ///
    /// When the harness itself fails (a folder, a child that cannot start, a kernel that
    /// cannot be built): a fault of the suite, not a result.
    pub(crate) async fn run(&mut self, scenario: &Scenario) -> Result<ScenarioResult> {
        let mut kernel = self.side(scenario, Side::Kernel).await?;
        let mut baseline = self.side(scenario, Side::Baseline).await?;
        // The folders are temporary: name them alike in every run's results.
        let work = self.work.canonicalize()?.display().to_string();
        for side in [&mut kernel, &mut baseline] {
            let run = &mut side.run;
            for text in run
                .notes
                .iter_mut()
                .chain(&mut run.outputs)
                .chain(&mut run.broken)
            {
                *text = text.replace(&work, "$WORK");
            }
        }
        Ok(ScenarioResult {
            scenario: scenario.clone(),
            kernel,
            baseline,
        })
    }

    async fn side(&mut self, scenario: &Scenario, side: Side) -> Result<SideResult> {
        let root = self.work.join(&scenario.id).join(match side {
            Side::Kernel => "kernel",
            Side::Baseline => "baseline",
        });
        let (root, calls) = self.prepare(&root, scenario, side)?;
        let hits_before = self.env.servers.internal_hits();
        let mut run = Run::default();
        match side {
            Side::Kernel => self.kernel_side(scenario, &root, &calls, &mut run).await?,
            Side::Baseline => {
                self.baseline_side(scenario, &root, &calls, &mut run)
                    .await?
            }
        }
        let hits = self.env.servers.internal_hits() - hits_before;
        if side == Side::Kernel {
            // A scenario that edits the log by hand expects `audit verify` to see it.
            let tampered = matches!(
                scenario.drive,
                Drive::Approval {
                    decision: Decision::Forge | Decision::SwapArgs,
                    ..
                }
            );
            self.check_log(&root, tampered, &mut run).await?;
        }
        let world = world::snapshot(&root)?;
        Ok(judge(scenario, side, &world, run, hits))
    }

    async fn kernel_side(
        &mut self,
        scenario: &Scenario,
        root: &Path,
        calls: &[Call],
        run: &mut Run,
    ) -> Result<()> {
        let name = scenario.id.as_str();
        match &scenario.drive {
            Drive::Chain | Drive::Timeout { .. } => {
                let kernel = kernel_at(root, scenario.tools_file()).await?;
                kernel_chain(&kernel, name, calls, OnRefused::Abort, None, run).await?;
            }
            Drive::Crash(point) => {
                self.calibrate(scenario, root, Side::Kernel, run).await?;
                self.kill(scenario, root, calls, Side::Kernel, *point, run)
                    .await?;
                self.recover(root, run).await?;
            }
            Drive::CrashRecovery { first, recovery } => {
                self.calibrate(scenario, root, Side::Kernel, run).await?;
                self.kill(scenario, root, calls, Side::Kernel, *first, run)
                    .await?;
                self.kill_recovery(scenario, root, *recovery, run).await?;
                self.recover(root, run).await?;
            }
            Drive::LaterWrite { first, by } => {
                self.calibrate(scenario, root, Side::Kernel, run).await?;
                self.kill(scenario, root, calls, Side::Kernel, *first, run)
                    .await?;
                self.later_write(scenario, root, Some(*by), run).await?;
                self.recover(root, run).await?;
            }
            Drive::SlowCommand => {
                let killed = self
                    .killed_by_its_tool(scenario, root, calls, Side::Kernel, run)
                    .await?;
                self.recover(root, run).await?;
                wait_past_slow_effect(killed).await;
            }
            Drive::Twice(redelivery) => {
                let again = format!("{name}-again");
                match redelivery {
                    Redelivery::Sequential => {
                        let kernel = kernel_at(root, scenario.tools_file()).await?;
                        kernel_chain(&kernel, name, calls, OnRefused::Abort, None, run).await?;
                        kernel_chain(&kernel, &again, calls, OnRefused::Abort, None, run).await?;
                    }
                    Redelivery::Retry => {
                        let kernel = kernel_at(root, scenario.tools_file()).await?;
                        kernel_chain(&kernel, name, calls, OnRefused::GoOn, None, run).await?;
                    }
                    Redelivery::Concurrent => {
                        let kernel = kernel_at(root, scenario.tools_file()).await?;
                        let (mut first, mut second) = (Run::default(), Run::default());
                        let (a, b) = tokio::join!(
                            kernel_chain(&kernel, name, calls, OnRefused::Abort, None, &mut first),
                            kernel_chain(
                                &kernel,
                                &again,
                                calls,
                                OnRefused::Abort,
                                None,
                                &mut second
                            ),
                        );
                        a?;
                        b?;
                        merge(run, first);
                        merge(run, second);
                    }
                    Redelivery::AfterCrash(point) => {
                        self.kill(scenario, root, calls, Side::Kernel, *point, run)
                            .await?;
                        self.recover(root, run).await?;
                        let kernel = kernel_at(root, scenario.tools_file()).await?;
                        kernel_chain(&kernel, &again, calls, OnRefused::Abort, None, run).await?;
                    }
                }
            }
            Drive::Agents { schedule, victim } => {
                let first = self
                    .victim(scenario, root, calls, Side::Kernel, *victim, run)
                    .await?;
                let kernel = kernel_at(root, scenario.tools_file()).await?;
                let place = (self.env.bin.as_path(), root);
                kernel_agents(&kernel, place, name, &scenario.agents, first, schedule, run).await?;
            }
            Drive::Regenerate { first } => {
                let operator = Operator::new(root, &self.env.bin, Decision::Duplicate);
                if let Some(point) = first {
                    self.calibrate(scenario, root, Side::Kernel, run).await?;
                    self.kill(scenario, root, calls, Side::Kernel, *point, run)
                        .await?;
                    self.recover(root, run).await?;
                } else {
                    let kernel = kernel_at(root, scenario.tools_file()).await?;
                    kernel_chain(&kernel, name, calls, OnRefused::Abort, Some(&operator), run)
                        .await?;
                }
                // The agent restarts: a kernel of its own, a new saga, its calls in other words.
                let kernel = kernel_at(root, scenario.tools_file()).await?;
                let again = format!("{name}-again");
                let regenerated = &scenario.agents[0];
                kernel_chain(
                    &kernel,
                    &again,
                    regenerated,
                    OnRefused::Abort,
                    Some(&operator),
                    run,
                )
                .await?;
            }
            Drive::Approval { decision, .. } => {
                let kernel = kernel_at(root, scenario.tools_file()).await?;
                let operator = Operator::new(root, &self.env.bin, *decision);
                kernel_chain(&kernel, name, calls, OnRefused::Abort, Some(&operator), run).await?;
            }
        }
        Ok(())
    }

    async fn baseline_side(
        &mut self,
        scenario: &Scenario,
        root: &Path,
        calls: &[Call],
        run: &mut Run,
    ) -> Result<()> {
        let name = format!("baseline-{}", scenario.id);
        let n = u32::try_from(calls.len())?;
        match &scenario.drive {
            Drive::Chain | Drive::Approval { .. } => {
                let tools = kernel_at(root, scenario.tools_file()).await?;
                baseline_chain(&tools, &name, calls, None, None, run).await?;
            }
            Drive::Timeout { timeout_ms, .. } => {
                let tools = kernel_at(root, scenario.tools_file()).await?;
                let timeout = Some(Duration::from_millis(*timeout_ms));
                baseline_chain(&tools, &name, calls, timeout, None, run).await?;
            }
            Drive::Crash(point)
            | Drive::CrashRecovery { first: point, .. }
            | Drive::LaterWrite { first: point, .. } => {
                self.calibrate(scenario, root, Side::Baseline, run).await?;
                self.kill(scenario, root, calls, Side::Baseline, *point, run)
                    .await?;
                run.note(format!(
                    "killed after {} of {n} calls; nothing recovers",
                    point.effects_done(n)
                ));
                self.later_write(scenario, root, None, run).await?;
            }
            Drive::SlowCommand => {
                let killed = self
                    .killed_by_its_tool(scenario, root, calls, Side::Baseline, run)
                    .await?;
                run.note("killed by the slow command's program; nothing recovers");
                wait_past_slow_effect(killed).await;
            }
            Drive::Agents { schedule, victim } => {
                let first = self
                    .victim(scenario, root, calls, Side::Baseline, *victim, run)
                    .await?;
                let tools = kernel_at(root, scenario.tools_file()).await?;
                baseline_agents(&tools, &name, &scenario.agents, first, schedule, run).await?;
            }
            Drive::Regenerate { first } => {
                if let Some(point) = first {
                    self.calibrate(scenario, root, Side::Baseline, run).await?;
                    self.kill(scenario, root, calls, Side::Baseline, *point, run)
                        .await?;
                } else {
                    let tools = kernel_at(root, scenario.tools_file()).await?;
                    baseline_chain(&tools, &name, calls, None, None, run).await?;
                }
                let tools = kernel_at(root, scenario.tools_file()).await?;
                let again = format!("{name}-again");
                baseline_chain(&tools, &again, &scenario.agents[0], None, None, run).await?;
            }
            Drive::Twice(redelivery) => {
                if let Redelivery::AfterCrash(point) = redelivery {
                    self.kill(scenario, root, calls, Side::Baseline, *point, run)
                        .await?;
                }
                let tools = kernel_at(root, scenario.tools_file()).await?;
                match redelivery {
                    Redelivery::Sequential => {
                        baseline_chain(&tools, &name, calls, None, None, run).await?;
                        baseline_chain(&tools, &name, calls, None, None, run).await?;
                    }
                    Redelivery::Retry | Redelivery::AfterCrash(_) => {
                        baseline_chain(&tools, &name, calls, None, None, run).await?;
                    }
                    Redelivery::Concurrent => {
                        let (mut first, mut second) = (Run::default(), Run::default());
                        let (a, b) = tokio::join!(
                            baseline_chain(&tools, &name, calls, None, None, &mut first),
                            baseline_chain(&tools, &name, calls, None, None, &mut second),
                        );
                        a?;
                        b?;
                        merge(run, first);
                        merge(run, second);
                    }
                }
            }
        }
        Ok(())
    }

    /// Agent 0 of an agents scenario with a victim: its calls run first, alone, in a child
    /// process SIGKILLed at the point; answers the first agent the schedule drives (1, or 0
    /// without a victim). An agent killed after its saga was `Done` (for the baseline:
    /// after its calls returned) counts as committed.
    async fn victim(
        &mut self,
        scenario: &Scenario,
        root: &Path,
        calls: &[Call],
        side: Side,
        victim: Option<KillPoint>,
        run: &mut Run,
    ) -> Result<usize> {
        let Some(point) = victim else {
            return Ok(scenario.first_driven_agent());
        };
        self.calibrate(scenario, root, side, run).await?;
        self.kill(scenario, root, calls, side, point, run).await?;
        let n = u32::try_from(calls.len())?;
        let finished = match side {
            Side::Kernel => scenario.killed_after_done(point),
            Side::Baseline => point.effects_done(n) == n,
        };
        if finished {
            run.committed.push(0);
        }
        Ok(scenario.first_driven_agent())
    }

    /// Runs a crash chain once without a kill, in a folder of its own, the first time a
    /// side meets it: its steps are timed (into `run`), and for the kernel its log writes
    /// are checked against the model the kill points were made from.
    async fn calibrate(
        &mut self,
        scenario: &Scenario,
        root: &Path,
        side: Side,
        run: &mut Run,
    ) -> Result<()> {
        let chain = format!("{side:?} {}", serde_json::to_string(&scenario.calls)?);
        if self.calibrated.contains(&chain) {
            return Ok(());
        }
        let folder = root.with_file_name(format!("{side:?}-calibration"));
        let (folder, calls) = self.prepare(&folder, scenario, side)?;
        let spec = ChildSpec::chain(scenario, &folder, calls, side);
        let report = self
            .spawn(&folder, &spec)
            .await?
            .context("the calibration run was killed")?;
        run.latencies_us.extend(&report.run.latencies_us);
        let expected = scenario
            .writes
            .context("a crash scenario states its writes")?;
        if side == Side::Kernel && report.writes != expected {
            bail!(
                "{}: the saga made {} log writes, not the {expected} the kill points assume ({:?})",
                scenario.id,
                report.writes,
                report.run
            );
        }
        self.calibrated.insert(chain);
        Ok(())
    }

    /// Runs the calls in a child process that dies at `point` (the kernel's log boundary,
    /// or for the baseline after as many calls as had taken effect there).
    async fn kill(
        &mut self,
        scenario: &Scenario,
        root: &Path,
        calls: &[Call],
        side: Side,
        point: KillPoint,
        run: &mut Run,
    ) -> Result<()> {
        let n = u32::try_from(calls.len())?;
        let spec = ChildSpec {
            point: (side == Side::Kernel).then_some(point),
            kill_after: (side == Side::Baseline).then(|| point.effects_done(n)),
            ..ChildSpec::chain(scenario, root, calls.to_vec(), side)
        };
        match self.spawn(root, &spec).await? {
            None => run.note(format!("SIGKILLed {point}")),
            // The baseline stops at a failing call, which may come before its kill.
            Some(report) if side == Side::Baseline => {
                run.note("stopped at the failing call before its kill");
                merge(run, report.run);
            }
            Some(report) => bail!(
                "{}: the child was to be killed {point} but finished: {:?}",
                scenario.id,
                report.run
            ),
        }
        Ok(())
    }

    /// A first `recover` (the library's, in a child process) SIGKILLed at `point` of its
    /// own writes; the first time a chain meets it, a recovery without a kill in a folder of
    /// its own checks the writes the points were made from.
    async fn kill_recovery(
        &mut self,
        scenario: &Scenario,
        root: &Path,
        point: KillPoint,
        run: &mut Run,
    ) -> Result<()> {
        let expected = scenario
            .recovery_writes
            .context("a recovery crash states its writes")?;
        let chain = format!("recovery {}", serde_json::to_string(&scenario.calls)?);
        if !self.calibrated.contains(&chain) {
            let folder = root.with_file_name("recovery-calibration");
            let (folder, calls) = self.prepare(&folder, scenario, Side::Kernel)?;
            let Drive::CrashRecovery { first, .. } = scenario.drive else {
                bail!("{}: not a recovery crash", scenario.id);
            };
            let mut scratch = Run::default();
            self.kill(scenario, &folder, &calls, Side::Kernel, first, &mut scratch)
                .await?;
            let spec = self.recovery_spec(scenario, &folder, None);
            let report = self
                .spawn(&folder, &spec)
                .await?
                .context("the recovery calibration was killed")?;
            if report.writes != expected {
                bail!(
                    "{}: the recovery made {} log writes, not the {expected} the kill points assume ({:?})",
                    scenario.id,
                    report.writes,
                    report.run
                );
            }
            self.calibrated.insert(chain);
        }
        let spec = self.recovery_spec(scenario, root, Some(point));
        match self.spawn(root, &spec).await? {
            None => run.note(format!("the first recover SIGKILLed {point}")),
            Some(report) => bail!(
                "{}: the recovery was to be killed {point} but finished: {:?}",
                scenario.id,
                report.run
            ),
        }
        Ok(())
    }

    fn recovery_spec(
        &self,
        scenario: &Scenario,
        root: &Path,
        point: Option<KillPoint>,
    ) -> ChildSpec {
        ChildSpec {
            point,
            recover: true,
            ..ChildSpec::chain(scenario, root, Vec::new(), Side::Kernel)
        }
    }

    /// Makes `folder` a fresh place for a side of `scenario`: its files and configuration;
    /// returns the folder's canonical path and the calls resolved for it.
    fn prepare(
        &self,
        folder: &Path,
        scenario: &Scenario,
        side: Side,
    ) -> Result<(PathBuf, Vec<Call>)> {
        std::fs::create_dir_all(folder)?;
        let folder = folder.canonicalize()?;
        world::lay_out(&folder, scenario)?;
        configure(&folder, scenario, side, &self.env)?;
        let calls = resolve(&scenario.calls, &folder, &self.env.servers);
        Ok((folder, calls))
    }

    /// Spawns this program as a child on `spec`; `None` when SIGKILL ended it.
    async fn spawn(&self, root: &Path, spec: &ChildSpec) -> Result<Option<ChildReport>> {
        let spec_path = root.join("state/child.json");
        std::fs::create_dir_all(root.join("state"))?;
        std::fs::write(&spec_path, serde_json::to_vec(spec)?)?;
        let mut command = Command::new(&self.env.self_exe);
        command
            .arg("child")
            .arg(&spec_path)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let output = tokio::task::spawn_blocking(move || command.output()).await??;
        use std::os::unix::process::ExitStatusExt;
        if output.status.signal() == Some(9) {
            return Ok(None);
        }
        if !output.status.success() {
            bail!(
                "the child exited {}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(Some(serde_json::from_slice(&output.stdout).with_context(
            || {
                format!(
                    "the child's report: {}",
                    String::from_utf8_lossy(&output.stdout)
                )
            },
        )?))
    }

    /// The scenario's later write, if it has one: by `by` on the kernel's side (a person
    /// writes the file; a later saga runs `agent-kernel run` on a plan that writes it), and
    /// directly on the baseline's (`None`), which has no kernel.
    async fn later_write(
        &self,
        scenario: &Scenario,
        root: &Path,
        by: Option<Writer>,
        run: &mut Run,
    ) -> Result<()> {
        let Some((path, content)) = &scenario.later_write else {
            return Ok(());
        };
        if by == Some(Writer::Saga) {
            let plan = json!({"name": "later", "steps": [
                {"tool": "fs.write", "args": {"path": path, "content": content}},
            ]});
            std::fs::write(root.join("state/later.json"), serde_json::to_vec(&plan)?)?;
            let mut code = cli(&self.env.bin, root, &["run", "--plan", "state/later.json"]).await?;
            if code == CONFLICT_EXIT {
                // The dead saga still holds the file (isolation): refused, nothing written,
                // until `recover` settles the dead saga; then the later saga runs again.
                run.note(format!(
                    "a later saga on {path} was refused: the dead saga holds it (exit {code})"
                ));
                self.recover(root, run).await?;
                code = cli(&self.env.bin, root, &["run", "--plan", "state/later.json"]).await?;
            }
            run.note(format!(
                "a later saga wrote {path}: agent-kernel run exited {code}"
            ));
            if code != 0 {
                run.broken
                    .push(format!("the later saga's agent-kernel run exited {code}"));
            }
        } else {
            std::fs::write(root.join(path), content)?;
            run.note(format!("{path} written by a later writer"));
        }
        Ok(())
    }

    /// Runs the calls in a child process that the slow command tool's program SIGKILLs;
    /// answers when it died.
    async fn killed_by_its_tool(
        &self,
        scenario: &Scenario,
        root: &Path,
        calls: &[Call],
        side: Side,
        run: &mut Run,
    ) -> Result<Instant> {
        let spec = ChildSpec::chain(scenario, root, calls.to_vec(), side);
        match self.spawn(root, &spec).await? {
            None => {
                run.note("SIGKILLed by the slow command's program");
                Ok(Instant::now())
            }
            Some(report) => bail!(
                "{}: the slow command's program was to kill the child, which finished: {:?}",
                scenario.id,
                report.run
            ),
        }
    }

    /// `agent-kernel recover`, as an operator runs it after a crash.
    async fn recover(&self, root: &Path, run: &mut Run) -> Result<()> {
        crate::sides::recover(&self.env.bin, root, run).await?;
        Ok(())
    }

    /// The kernel's log, once the side is over: `audit verify` must pass (unless the
    /// scenario edited the log by hand: then its verdict is noted), and every saga must have
    /// ended.
    async fn check_log(&self, root: &Path, tampered: bool, run: &mut Run) -> Result<()> {
        run.states = saga_states(&root.join(DB))?;
        if !root.join(DB).exists() {
            return Ok(());
        }
        let code = cli(&self.env.bin, root, &["audit", "verify"]).await?;
        if tampered {
            run.note(format!(
                "agent-kernel audit verify exited {code} on the log edited by hand"
            ));
        } else if code != 0 {
            run.broken
                .push(format!("agent-kernel audit verify exited {code}"));
        }
        for state in &run.states {
            if !matches!(
                state.as_str(),
                "Done" | "FailedRolledBack" | "FailedRollbackPartial"
            ) {
                run.broken.push(format!("a saga left {state}"));
            }
        }
        Ok(())
    }
}

/// Waits until the slow command's program, started right before `killed`, would have made
/// its effect (and a little more): what is read after is what stays.
async fn wait_past_slow_effect(killed: Instant) {
    let past = killed + Duration::from_millis(SLOW_EFFECT_MS + SLOW_EFFECT_MARGIN_MS);
    tokio::time::sleep_until(past.into()).await;
}

/// How long past [`SLOW_EFFECT_MS`] the world is read, for a loaded machine's scheduling.
const SLOW_EFFECT_MARGIN_MS: u64 = 400;

/// `agent-kernel run`'s exit code for a conflict: another unsettled saga holds a resource.
const CONFLICT_EXIT: i32 = 6;

/// A kernel (or, for the baseline, the tools) for a side's folder, built off the runtime.
async fn kernel_at(root: &Path, tools_file: bool) -> Result<Arc<agent_kernel::Kernel>> {
    let root = root.to_path_buf();
    tokio::task::spawn_blocking(move || build_kernel(&root, tools_file, None)).await?
}

fn merge(into: &mut Run, from: Run) {
    into.outputs.extend(from.outputs);
    into.latencies_us.extend(from.latencies_us);
    into.notes.extend(from.notes);
    into.broken.extend(from.broken);
}

/// The states of the sagas in a log, oldest first; none when there is no log.
fn saga_states(db: &Path) -> Result<Vec<String>> {
    if !db.exists() {
        return Ok(Vec::new());
    }
    let db = rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let mut statement = db.prepare("SELECT state FROM sagas ORDER BY created_at_ms, saga_id")?;
    let states = statement
        .query_map([], |row| row.get::<_, String>(0))?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(states)
}

/// The world without what an attack aims at, so that an attack is judged once, as such.
fn allowed_part(world: &World, scenario: &Scenario) -> World {
    world
        .iter()
        .filter(|(path, _)| !path.starts_with("outside/") && !scenario.forbidden.contains(path))
        .map(|(path, setup)| (path.clone(), setup.clone()))
        .collect()
}

/// Judges one side's world against the scenario.
fn judge(scenario: &Scenario, side: Side, world: &World, run: Run, hits: u64) -> SideResult {
    let initial = world::initial(scenario);
    let complete = world::complete(scenario);
    let (now, before, after) = (
        allowed_part(world, scenario),
        allowed_part(&initial, scenario),
        allowed_part(&complete, scenario),
    );
    let forbidden_changed = scenario
        .forbidden
        .iter()
        .any(|path| world.get(path) != initial.get(path));
    let attack_accepted = world::outside(world) != world::outside(&initial)
        || forbidden_changed
        || hits > 0
        || run
            .outputs
            .iter()
            .chain(&run.notes)
            .any(|text| text.contains("SECRET-"));
    // The kernel must end the saga at the call the scenario says, not before it.
    let mut run = run;
    if side == Side::Kernel
        && let Some(index) = scenario.stops_at
    {
        let ended = format!("call {index} ended the saga");
        if !run.notes.iter().any(|note| note.starts_with(&ended)) {
            run.broken
                .push(format!("the saga did not end at call {index}, as it must"));
        }
    }
    let done = run.states.iter().any(|state| state == "Done");
    let (wrong_paths, lost_updates, duplicate_effects) = match &scenario.drive {
        Drive::Agents { .. } => shared_check(scenario, world, &run.committed),
        Drive::Regenerate { .. } => payments_check(scenario, world),
        _ => {
            let lost_updates = u32::from(scenario.later_write.as_ref().is_some_and(
                |(path, content)| {
                    world.get(path) != Some(&Setup::File(content.clone().into_bytes()))
                },
            ));
            let required = match scenario.must {
                Must::Unchanged => &before,
                Must::Complete => &after,
                Must::Atomic => match side {
                    Side::Kernel if done => &after,
                    Side::Kernel => &before,
                    Side::Baseline if now == after => &after,
                    Side::Baseline => &before,
                },
            };
            let wrong_paths = world::differences(&now, required);
            (wrong_paths, lost_updates, duplicates(scenario, world))
        }
    };
    // Changed, but not to a state the scenario allows: what a failed chain left behind, a
    // mix of a crash, an effect applied twice.
    let corrupt = !wrong_paths.is_empty() && now != before;
    let success = wrong_paths.is_empty()
        && !attack_accepted
        && duplicate_effects == 0
        && lost_updates == 0
        && run.broken.is_empty();
    SideResult {
        success,
        corrupt,
        attack_accepted,
        duplicate_effects,
        lost_updates,
        operator_attention: run
            .states
            .iter()
            .any(|state| state == "FailedRollbackPartial"),
        run,
        wrong_paths,
    }
}

/// Appends that took effect more than once: each append's content is unique to its call,
/// so a file holding it twice holds a duplicate.
fn duplicates(scenario: &Scenario, world: &World) -> u32 {
    let mut seen = std::collections::BTreeSet::new();
    let mut extra = 0;
    for call in &scenario.calls {
        if call.tool != "fs.append" {
            continue;
        }
        let (Some(path), Some(content)) =
            (call.args["path"].as_str(), call.args["content"].as_str())
        else {
            continue;
        };
        if !seen.insert((path, content)) {
            continue;
        }
        if let Some(Setup::File(bytes)) = world.get(path) {
            let needle = content.as_bytes();
            let count = bytes.windows(needle.len()).filter(|w| *w == needle).count();
            extra += u32::try_from(count.saturating_sub(1)).unwrap_or(u32::MAX);
        }
    }
    extra
}

/// The world of agents side by side, judged against their work: each file they share must
/// hold its opening content and then the line of every agent that committed, once each, in
/// some order, and no other; each account, its opening balance less the debit of every
/// agent that committed, and no other. Every other file keeps its bytes. Answers the wrong
/// paths, the committed changes missing (lost updates), and the changes held twice.
fn shared_check(
    scenario: &Scenario,
    world: &World,
    committed: &[usize],
) -> (Vec<String>, u32, u32) {
    let text = world::text;
    // Each shared path and each writer's change of it: a line, or a debit.
    let mut shared: std::collections::BTreeMap<String, Vec<(usize, Change)>> = Default::default();
    for (who, calls) in scenario.agents.iter().enumerate() {
        for call in calls.iter().filter(|call| writes(call)) {
            let (path, change) = match call.args["account"].as_str() {
                Some(account) => (
                    format!("ws/accounts/{account}"),
                    Change::Debit(debit_of(who)),
                ),
                None => {
                    let path = call.args["path"].as_str().unwrap_or_default().to_owned();
                    let opening = text(scenario.setup.get(&path));
                    let content = call.args["content"].as_str().unwrap_or_default();
                    let line = content
                        .strip_prefix(READ)
                        .or_else(|| content.strip_prefix(&opening))
                        .unwrap_or(content);
                    (path, Change::Line(line.to_owned()))
                }
            };
            shared.entry(path).or_default().push((who, change));
        }
    }
    let (mut wrong, mut lost, mut twice) = (Vec::new(), 0, 0);
    // Every agent the schedule drives whose calls do not end failing must commit: a kernel
    // that refused or failed them all would leave the world as it found it.
    let first = scenario.first_driven_agent();
    for (who, calls) in scenario.agents.iter().enumerate().skip(first) {
        if !fails(calls) && !committed.contains(&who) {
            wrong.push(format!("agent {who} did not commit"));
        }
    }
    for (path, changes) in &shared {
        let now = text(world.get(path));
        let opening = text(scenario.setup.get(path));
        let must = |who: usize| committed.contains(&who);
        let right = if path.starts_with("ws/accounts/") {
            let balance = now.trim().parse::<u64>().ok();
            match balance.and_then(|balance| OPENING_BALANCE.checked_sub(balance)) {
                None => false,
                Some(held) => {
                    let mut right = true;
                    let mut explained = 0;
                    for (who, change) in changes {
                        let Change::Debit(debit) = change else {
                            continue;
                        };
                        // How many times the debit is in the balance: its own digit.
                        let count = held / debit % 10;
                        explained += count * debit;
                        lost += u32::from(must(*who) && count == 0);
                        twice += u32::try_from(count.saturating_sub(1)).unwrap_or(u32::MAX);
                        right &= count == u64::from(must(*who));
                    }
                    right && held == explained
                }
            }
        } else {
            match now.strip_prefix(&opening) {
                None => false,
                Some(rest) => {
                    let lines: Vec<&str> = rest.split_inclusive('\n').collect();
                    let mut right = true;
                    let mut musts = 0;
                    for (who, change) in changes {
                        let Change::Line(line) = change else { continue };
                        let count = lines.iter().filter(|held| **held == line.as_str()).count();
                        lost += u32::from(must(*who) && count == 0);
                        twice += u32::try_from(count.saturating_sub(1)).unwrap_or(u32::MAX);
                        right &= count == usize::from(must(*who));
                        musts += usize::from(must(*who));
                    }
                    right && lines.len() == musts
                }
            }
        };
        if !right {
            wrong.push(path.clone());
        }
    }
    wrong.extend(world::untouched_differences(scenario, world, |path| {
        shared.contains_key(path)
    }));
    (wrong, lost, twice)
}

/// What an agent's write changes in what it shares.
enum Change {
    /// A line added to a file.
    Line(String),
    /// An amount taken from an account.
    Debit(u64),
}

/// The payments an agent made before and after it was restarted: the invoice it asked for
/// again must be paid exactly once; the first, when the agent moved on to the next one, at
/// most once. Every other file keeps its bytes. Answers the wrong paths, no lost updates,
/// and the payments made twice.
fn payments_check(scenario: &Scenario, world: &World) -> (Vec<String>, u32, u32) {
    const PAYMENTS: &str = "ws/payments.txt";
    let invoice = |calls: &[Call]| {
        calls
            .first()
            .and_then(|call| call.args["invoice"].as_str())
            .unwrap_or_default()
            .to_owned()
    };
    let (first, again) = (invoice(&scenario.calls), invoice(&scenario.agents[0]));
    let paid = world::text(world.get(PAYMENTS));
    let count = |invoice: &str| {
        let head = format!("paid invoice={invoice} ");
        paid.lines().filter(|line| line.starts_with(&head)).count()
    };
    let twice: usize = [&first, &again]
        .into_iter()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .map(|invoice| count(invoice).saturating_sub(1))
        .sum();
    // The first payment stands when its saga was Done: killed after that, or not at all.
    let first_done = match scenario.drive {
        Drive::Regenerate { first: None } => true,
        Drive::Regenerate { first: Some(point) } => scenario.killed_after_done(point),
        _ => false,
    };
    let right = count(&again) == 1
        && if first_done {
            count(&first) == 1
        } else {
            count(&first) <= 1
        };
    let mut wrong = Vec::new();
    if !right {
        wrong.push(PAYMENTS.to_owned());
    }
    wrong.extend(world::untouched_differences(scenario, world, |path| {
        path == PAYMENTS
    }));
    (wrong, 0, u32::try_from(twice).unwrap_or(u32::MAX))
}
