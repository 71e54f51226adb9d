//! `agent-kernel-sim`: explores seeds until a budget is spent, on every core, and prints
//! what it covered; the first failing seed is printed with its shrunk history (exit 1).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_kernel_sim::{SeedReport, explore_seed, scratch_dir};
use anyhow::Context as _;
use clap::Parser;

/// Runs the simulator over consecutive seeds.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    /// The first seed (default: from the clock; printed, so a run replays).
    #[arg(long)]
    seed: Option<u64>,
    /// Stop after this many seeds.
    #[arg(long)]
    seeds: Option<u64>,
    /// Stop once this many faults have fired.
    #[arg(long)]
    faults: Option<u64>,
    /// Stop after this many seconds (default 10 when no other budget is given).
    #[arg(long)]
    seconds: Option<u64>,
    /// Threads exploring seeds at once (default: the machine's cores), spread over one
    /// process per core.
    #[arg(long)]
    threads: Option<usize>,
    /// One process of several: its index and their count (`I/N`); it explores every N-th
    /// seed from the first plus I, kept to one core, and prints its summary first.
    #[arg(long, hide = true)]
    worker: Option<Worker>,
    /// One process of several: the folder its scratch folders go in, which the first
    /// process removes.
    #[arg(long, hide = true)]
    scratch: Option<std::path::PathBuf>,
}

/// What the threads share.
struct Shared {
    /// How many seeds this process's threads took so far.
    seeds_taken: AtomicU64,
    seeds: AtomicU64,
    cases: AtomicU64,
    faults: AtomicU64,
    points: AtomicU64,
    stop: AtomicBool,
    failure: Mutex<Option<SeedReport>>,
}

fn main() {
    match run() {
        Ok(Found::Nothing) => {}
        Ok(Found::Broken) => std::process::exit(1),
        Err(error) => {
            eprintln!("agent-kernel-sim: {error:#}");
            std::process::exit(2);
        }
    }
}

/// What the seeds explored found.
enum Found {
    /// No invariant broken (exit 0).
    Nothing,
    /// A seed broke an invariant, printed with its smallest case (exit 1).
    Broken,
}

/// Explores as the arguments say; an error (exit 2) is the harness's, not a finding.
fn run() -> anyhow::Result<Found> {
    let args = Args::parse();
    let first_seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos() as u64)
    });
    let seconds = match (args.seconds, args.seeds, args.faults) {
        (None, None, None) => Some(10),
        (seconds, _, _) => seconds,
    };
    let threads = args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    if let Some(worker) = args.worker {
        // Ended with its parent, whatever ends the parent.
        let _ =
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL));
        keep_to_one_core(worker.index);
        let scratch = args.scratch.as_deref();
        let explored = explore_here(&args, first_seed, seconds, threads, worker, scratch)?;
        // The parent reads the summary from the first line.
        println!("{}", explored.summary(first_seed));
        return Ok(match &explored.failure {
            None => Found::Nothing,
            Some(report) => {
                print_failure(report);
                Found::Broken
            }
        });
    }
    println!("agent-kernel-sim: first seed {first_seed}, {threads} threads");
    let processes = threads.min(allowed_cores().len());
    if processes > 1 {
        return explore_in_processes(&args, first_seed, seconds, threads, processes);
    }
    let explored = explore_here(&args, first_seed, seconds, threads, Worker::ALONE, None)?;
    println!("{}", explored.summary(first_seed));
    Ok(match &explored.failure {
        None => {
            println!("no invariant broken");
            Found::Nothing
        }
        Some(report) => {
            print_failure(report);
            Found::Broken
        }
    })
}

/// Which share of the seeds a process explores: seeds `first + index`, `first + index +
/// of`, and so on.
#[derive(Debug, Clone, Copy)]
struct Worker {
    index: u64,
    of: u64,
}

impl Worker {
    /// The only process: every seed.
    const ALONE: Worker = Worker { index: 0, of: 1 };
}

impl std::str::FromStr for Worker {
    type Err = String;

    fn from_str(text: &str) -> Result<Worker, String> {
        let (index, of) = text
            .split_once('/')
            .ok_or_else(|| format!("expected INDEX/COUNT, found {text:?}"))?;
        let worker = Worker {
            index: index.parse().map_err(|err| format!("{index:?}: {err}"))?,
            of: of.parse().map_err(|err| format!("{of:?}: {err}"))?,
        };
        if worker.index >= worker.of {
            return Err(format!("{text:?}: the index must be below the count"));
        }
        Ok(worker)
    }
}

/// What one process explored.
struct Explored {
    seeds: u64,
    cases: u64,
    faults: u64,
    points: u64,
    elapsed: f64,
    /// The first failing seed its threads found, if any.
    failure: Option<SeedReport>,
}

impl Explored {
    fn summary(&self, first_seed: u64) -> serde_json::Value {
        let elapsed = self.elapsed;
        serde_json::json!({
            "first_seed": first_seed,
            "seeds": self.seeds,
            "cases": self.cases,
            "faults_fired": self.faults,
            "points": self.points,
            "seconds": (elapsed * 10.0).round() / 10.0,
            "faults_per_second": (self.faults as f64 / elapsed).round(),
        })
    }
}

/// Explores `worker`'s share of the seeds on `threads` threads of this process.
fn explore_here(
    args: &Args,
    first_seed: u64,
    seconds: Option<u64>,
    threads: usize,
    worker: Worker,
    scratch: Option<&std::path::Path>,
) -> anyhow::Result<Explored> {
    let deadline = seconds.map(|seconds| Instant::now() + Duration::from_secs(seconds));
    let shared = Arc::new(Shared {
        seeds_taken: AtomicU64::new(0),
        seeds: AtomicU64::new(0),
        cases: AtomicU64::new(0),
        faults: AtomicU64::new(0),
        points: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        failure: Mutex::new(None),
    });
    let started = Instant::now();
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let shared = shared.clone();
            let budget = (args.seeds, args.faults, deadline);
            let scratch = scratch.map(std::path::Path::to_path_buf);
            std::thread::spawn(move || {
                explore(&shared, first_seed, budget, worker, scratch.as_deref())
            })
        })
        .collect();
    for worker in workers {
        worker
            .join()
            .map_err(|_| anyhow::anyhow!("a simulator thread panicked"))??;
    }
    let failure = shared
        .failure
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .take();
    Ok(Explored {
        seeds: shared.seeds.load(Ordering::Relaxed),
        cases: shared.cases.load(Ordering::Relaxed),
        faults: shared.faults.load(Ordering::Relaxed),
        points: shared.points.load(Ordering::Relaxed),
        elapsed: started.elapsed().as_secs_f64(),
        failure,
    })
}

/// Explores in `processes` processes of this program, each kept to one core with its share
/// of the threads, the seeds and the fault budget, and sums what they report. Threads of
/// one process on two cores run slower than that: a simulated process hands each log call
/// to its log's writer thread, and opens and closes logs (threads started and ended, the
/// WAL index mapped and unmapped) at a rate where waking, or flushing the memory mappings
/// of, a thread on the other core costs more than the work (about a quarter more faults a
/// second this way on two cores). A failing process stops the others; the scratch folders
/// of all of them live under one that is removed at the end, whatever became of them.
fn explore_in_processes(
    args: &Args,
    first_seed: u64,
    seconds: Option<u64>,
    threads: usize,
    processes: usize,
) -> anyhow::Result<Found> {
    let program = std::env::current_exe().context("finding this program")?;
    let scratch = scratch_dir().context("making a scratch folder")?;
    let started = Instant::now();
    let (done, finished) = std::sync::mpsc::channel();
    let mut children = Children(Vec::with_capacity(processes));
    for index in 0..processes {
        let share = threads / processes + usize::from(index < threads % processes);
        let mut command = std::process::Command::new(&program);
        command
            .arg("--seed")
            .arg(first_seed.to_string())
            .arg("--threads")
            .arg(share.to_string())
            .arg("--worker")
            .arg(format!("{index}/{processes}"))
            .arg("--scratch")
            .arg(scratch.path())
            .stdout(std::process::Stdio::piped());
        if let Some(seeds) = args.seeds {
            command.arg("--seeds").arg(seeds.to_string());
        }
        if let Some(faults) = args.faults {
            // In proportion to the threads, so that the processes end together.
            let part = (u128::from(faults) * share as u128).div_ceil(threads as u128);
            command.arg("--faults").arg(part.to_string());
        }
        if let Some(seconds) = seconds {
            command.arg("--seconds").arg(seconds.to_string());
        }
        let mut child = command.spawn().context("starting a simulator process")?;
        let mut stdout = child.stdout.take().context("its output")?;
        let done = done.clone();
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut stdout, &mut text);
            let _ = done.send((index, text));
        });
        children.0.push(Child {
            process: child,
            stopped: false,
        });
    }
    drop(done);
    let mut total = Explored {
        seeds: 0,
        cases: 0,
        faults: 0,
        points: 0,
        elapsed: 0.0,
        failure: None,
    };
    // The failing seed explored first, with what its process printed.
    let mut failure: Option<(u64, String)> = None;
    // A process that ended neither with a summary nor with a finding.
    let mut crashed: Option<String> = None;
    for (index, text) in finished {
        let status = children.0[index]
            .process
            .wait()
            .context("waiting for a simulator process")?;
        if children.0[index].stopped {
            continue;
        }
        let summary = text
            .lines()
            .next()
            .and_then(|line| serde_json::from_str::<serde_json::Value>(line).ok());
        let count = |name: &str| {
            summary
                .as_ref()
                .and_then(|summary| summary[name].as_u64())
                .unwrap_or(0)
        };
        total.seeds += count("seeds");
        total.cases += count("cases");
        total.faults += count("faults_fired");
        total.points += count("points");
        if status.success() {
            continue;
        }
        children.stop_all();
        match text.lines().find_map(failing_seed) {
            Some(seed) if status.code() == Some(1) => {
                let nth = seed.wrapping_sub(first_seed);
                if failure
                    .as_ref()
                    .is_none_or(|(found, _)| found.wrapping_sub(first_seed) > nth)
                {
                    let report = text.lines().skip(1).collect::<Vec<_>>().join("\n");
                    failure = Some((seed, report));
                }
            }
            _ => {
                crashed.get_or_insert(format!(
                    "a simulator process ended with {status}: {}",
                    text.trim()
                ));
            }
        }
    }
    total.elapsed = started.elapsed().as_secs_f64();
    println!("{}", total.summary(first_seed));
    if let Some((_, report)) = failure {
        println!("{report}");
        return Ok(Found::Broken);
    }
    if let Some(crashed) = crashed {
        anyhow::bail!(crashed);
    }
    println!("no invariant broken");
    Ok(Found::Nothing)
}

/// A simulator process started by this one.
struct Child {
    process: std::process::Child,
    /// Killed by this process, for another's finding or crash: what it printed is not read.
    stopped: bool,
}

/// The simulator processes started; any still running when this is dropped (the parent
/// returning early) are killed and waited for.
struct Children(Vec<Child>);

impl Children {
    /// Kills every process still running, and notes that it was stopped.
    fn stop_all(&mut self) {
        for child in &mut self.0 {
            if matches!(child.process.try_wait(), Ok(None)) {
                let _ = child.process.kill();
                child.stopped = true;
            }
        }
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        self.stop_all();
        for child in &mut self.0 {
            let _ = child.process.wait();
        }
    }
}

/// The seed a failure report's first line names.
fn failing_seed(line: &str) -> Option<u64> {
    line.strip_prefix("seed ")?.split_once(' ')?.0.parse().ok()
}

/// The cores this process may run on.
fn allowed_cores() -> Vec<usize> {
    use rustix::thread::{CpuSet, sched_getaffinity};
    sched_getaffinity(None).map_or_else(
        |_| vec![0],
        |allowed| {
            (0..CpuSet::MAX_CPU)
                .filter(|&core| allowed.is_set(core))
                .collect()
        },
    )
}

/// Keeps this thread, and every thread it starts after, on the `index`-th core this
/// process may use (round robin).
fn keep_to_one_core(index: u64) {
    use rustix::thread::{CpuSet, sched_setaffinity};
    let cores = allowed_cores();
    if cores.len() < 2 {
        return;
    }
    let mut one = CpuSet::new();
    one.set(cores[(index % cores.len() as u64) as usize]);
    // Not kept to one core, the process only runs slower.
    let _ = sched_setaffinity(None, &one);
}

/// One thread: takes the next seed until a budget is spent or a seed fails.
fn explore(
    shared: &Shared,
    first_seed: u64,
    (seeds, faults, deadline): (Option<u64>, Option<u64>, Option<Instant>),
    worker: Worker,
    scratch: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let dir = match scratch {
        Some(root) => tempfile::Builder::new().prefix("thread").tempdir_in(root),
        None => scratch_dir(),
    }
    .context("making a scratch folder")?;
    while !shared.stop.load(Ordering::Relaxed) {
        let nth = shared.seeds_taken.fetch_add(1, Ordering::Relaxed) * worker.of + worker.index;
        if seeds.is_some_and(|seeds| nth >= seeds) {
            break;
        }
        let seed = first_seed.wrapping_add(nth);
        let report = explore_seed(seed, dir.path())?;
        shared.seeds.fetch_add(1, Ordering::Relaxed);
        shared.cases.fetch_add(report.cases, Ordering::Relaxed);
        shared.points.fetch_add(report.points, Ordering::Relaxed);
        let fired = shared
            .faults
            .fetch_add(report.faults_fired, Ordering::Relaxed)
            + report.faults_fired;
        if report.failure.is_some() {
            shared.stop.store(true, Ordering::Relaxed);
            let mut failure = shared
                .failure
                .lock()
                .map_err(|_| anyhow::anyhow!("poisoned"))?;
            if failure.as_ref().is_none_or(|found| found.seed > seed) {
                *failure = Some(report);
            }
            break;
        }
        if faults.is_some_and(|faults| fired >= faults)
            || deadline.is_some_and(|deadline| Instant::now() >= deadline)
        {
            shared.stop.store(true, Ordering::Relaxed);
        }
    }
    Ok(())
}

fn print_failure(report: &SeedReport) {
    let Some((case, outcome)) = &report.failure else {
        return;
    };
    println!(
        "seed {} breaks an invariant; replay it with --seed {} --seeds 1",
        report.seed, report.seed
    );
    println!("smallest case found:");
    print!("{}", case.scenario);
    println!("  schedule seed {}", case.schedule_seed);
    if let Some(fault) = case.fault {
        println!("  the run is {fault}");
    }
    if let Some(fault) = case.recovery_fault {
        println!("  the first recover is {fault}");
    }
    if let Some(fault) = case
        .operator_fault
        .filter(|_| case.scenario.operator_actions > 0)
    {
        println!("  the operator is {fault}");
    }
    println!("broken:");
    for violation in &outcome.violations {
        println!("  {violation}");
    }
    println!("history:");
    for line in &outcome.history {
        println!("  {line}");
    }
}
