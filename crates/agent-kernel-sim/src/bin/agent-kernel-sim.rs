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
    /// Threads exploring seeds at once (default: the machine's cores).
    #[arg(long)]
    threads: Option<usize>,
}

/// What the threads share.
struct Shared {
    next_seed: AtomicU64,
    seeds: AtomicU64,
    cases: AtomicU64,
    faults: AtomicU64,
    points: AtomicU64,
    stop: AtomicBool,
    failure: Mutex<Option<SeedReport>>,
}

fn main() -> anyhow::Result<()> {
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
    let deadline = seconds.map(|seconds| Instant::now() + Duration::from_secs(seconds));
    let threads = args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    println!("agent-kernel-sim: first seed {first_seed}, {threads} threads");
    let shared = Arc::new(Shared {
        next_seed: AtomicU64::new(first_seed),
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
            std::thread::spawn(move || explore(&shared, first_seed, budget))
        })
        .collect();
    for worker in workers {
        worker
            .join()
            .map_err(|_| anyhow::anyhow!("a simulator thread panicked"))??;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let faults = shared.faults.load(Ordering::Relaxed);
    let summary = serde_json::json!({
        "first_seed": first_seed,
        "seeds": shared.seeds.load(Ordering::Relaxed),
        "cases": shared.cases.load(Ordering::Relaxed),
        "faults_fired": faults,
        "points": shared.points.load(Ordering::Relaxed),
        "seconds": (elapsed * 10.0).round() / 10.0,
        "faults_per_second": (faults as f64 / elapsed).round(),
    });
    let failure = shared
        .failure
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .take();
    match failure {
        None => {
            println!("{summary}");
            println!("no invariant broken");
            Ok(())
        }
        Some(report) => {
            println!("{summary}");
            print_failure(&report);
            std::process::exit(1);
        }
    }
}

/// One thread: takes the next seed until a budget is spent or a seed fails.
fn explore(
    shared: &Shared,
    first_seed: u64,
    (seeds, faults, deadline): (Option<u64>, Option<u64>, Option<Instant>),
) -> anyhow::Result<()> {
    let dir = scratch_dir().context("making a scratch folder")?;
    while !shared.stop.load(Ordering::Relaxed) {
        let seed = shared.next_seed.fetch_add(1, Ordering::Relaxed);
        if seeds.is_some_and(|seeds| seed.wrapping_sub(first_seed) >= seeds) {
            break;
        }
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
