//! The agent-kernel eval suite.
//!
//! Seeded scenarios of twelve kinds (a tool failing mid-chain, a SIGKILL at every log
//! boundary, injected paths and URLs, duplicate delivery, unknown outcomes, approvals, a
//! failing upstream MCP server, a recovery killed mid-rollback, a later writer, a slow
//! command, agents side by side on one file or account, a regenerated payment), each run
//! twice in fresh folders: through the kernel, and as a baseline that calls the same tools
//! directly, in the same order, with no kernel. The world (the files, the requests an
//! internal server got, the outputs) is read back and
//! judged; the numbers go to `results.json` and `results.md`.
//!
//! ```text
//! cargo build --release -p agent-kernel-cli -p agent-kernel-evals
//! target/release/agent-kernel-evals run --out evals/results
//! ```
//!
//! `evals/run.sh` does both. The process exits 1 when the kernel's side shows any residual
//! corruption, accepted attack, duplicate effect or failed scenario.

mod agents;
mod generate;
mod http;
mod kill_switch;
mod report;
mod run;
mod scenario;
mod sides;
mod world;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

use crate::http::Servers;
use crate::run::Runner;
use crate::sides::Env;

/// The seed of the committed results.
const DEFAULT_SEED: u64 = 20_261_201;

#[derive(Parser)]
#[command(
    name = "agent-kernel-evals",
    version,
    about = "The agent-kernel eval suite: the kernel against the same tools called directly"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the scenarios and write results.json and results.md
    Run {
        /// The seed the scenarios are generated from
        #[arg(long, default_value_t = DEFAULT_SEED)]
        seed: u64,
        /// The reduced suite: a seeded sample of 8 scenarios of each kind (56)
        #[arg(long)]
        quick: bool,
        /// Where to write results.json and results.md (default: print the table only)
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        /// The agent-kernel binary (default: $AGENT_KERNEL_BIN, else `agent-kernel` beside this program)
        #[arg(long, value_name = "PATH")]
        bin: Option<PathBuf>,
        /// Keep the scenarios' folders here instead of a temporary folder
        #[arg(long, value_name = "DIR")]
        keep: Option<PathBuf>,
        /// Only the scenarios whose id starts with this (e.g. `crash`, `approval-003`)
        #[arg(long, value_name = "PREFIX")]
        only: Option<String>,
    },
    /// List the scenarios as JSON, running nothing
    List {
        /// The seed
        #[arg(long, default_value_t = DEFAULT_SEED)]
        seed: u64,
        /// The reduced suite
        #[arg(long)]
        quick: bool,
    },
    /// Run one side of a crash scenario (the suite starts this itself)
    #[command(hide = true)]
    Child {
        /// The spec file
        spec: PathBuf,
    },
}

fn main() -> ExitCode {
    match try_main() {
        Ok(code) => code,
        Err(error) => {
            eprintln!("agent-kernel-evals: {error:#}");
            ExitCode::from(2)
        }
    }
}

fn try_main() -> Result<ExitCode> {
    match Cli::parse().command {
        Cmd::Child { spec } => {
            run::child(&spec)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::List { seed, quick } => {
            let scenarios = generate::scenarios(seed, quick);
            println!("{}", serde_json::to_string_pretty(&scenarios)?);
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Run {
            seed,
            quick,
            out,
            bin,
            keep,
            only,
        } => run_suite(seed, quick, out.as_deref(), bin, keep, only.as_deref()),
    }
}

/// The `agent-kernel` binary: as given, else `$AGENT_KERNEL_BIN`, else beside this program.
fn kernel_bin(given: Option<PathBuf>) -> Result<PathBuf> {
    let bin = match given.or_else(|| std::env::var_os("AGENT_KERNEL_BIN").map(PathBuf::from)) {
        Some(bin) => bin,
        None => std::env::current_exe()?.with_file_name("agent-kernel"),
    };
    if !bin.is_file() {
        bail!(
            "no agent-kernel binary at {}: build it first (cargo build --release -p agent-kernel-cli) or pass --bin",
            bin.display()
        );
    }
    Ok(bin.canonicalize()?)
}

fn run_suite(
    seed: u64,
    quick: bool,
    out: Option<&Path>,
    bin: Option<PathBuf>,
    keep: Option<PathBuf>,
    only: Option<&str>,
) -> Result<ExitCode> {
    // `fault.panic` panics on purpose, in many scenarios: its panics are contained (by the
    // kernel's dispatcher, by the baseline's task) and need not be printed.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let drill = info
            .location()
            .is_some_and(|location| location.file().ends_with("agent-kernel-tools/src/fault.rs"));
        if !drill {
            default_hook(info);
        }
    }));
    let env = Env {
        bin: kernel_bin(bin)?,
        self_exe: std::env::current_exe()?,
        servers: Servers::start()?,
    };
    let scenarios: Vec<_> = generate::scenarios(seed, quick)
        .into_iter()
        .filter(|s| only.is_none_or(|prefix| s.id.starts_with(prefix)))
        .collect();
    if scenarios.is_empty() {
        bail!("no scenario matches");
    }
    let temp = tempfile::Builder::new()
        .prefix("agent-kernel-evals")
        .tempdir()?;
    let work = keep.unwrap_or_else(|| temp.path().to_path_buf());
    std::fs::create_dir_all(&work)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let started = Instant::now();
    let mut runner = Runner::new(env, work);
    let mut results = Vec::with_capacity(scenarios.len());
    for scenario in &scenarios {
        let result = runtime
            .block_on(runner.run(scenario))
            .with_context(|| format!("scenario {} ({})", scenario.id, scenario.variant))?;
        let mark = |ok: bool| if ok { "ok" } else { "FAILED" };
        eprintln!(
            "{:<22} kernel {:<6} baseline {:<6} {}",
            scenario.id,
            mark(result.kernel.success),
            mark(result.baseline.success),
            scenario.variant
        );
        if !result.kernel.success {
            eprintln!("    kernel: {}", serde_json::to_string(&result.kernel)?);
        }
        results.push(result);
    }
    let elapsed = started.elapsed();
    let rows = report::summary(&results);
    let now_ms = i64::try_from(SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis())?;
    let date = agent_kernel_api::format_rfc3339_ms(now_ms);
    let command = format!(
        "agent-kernel-evals run --seed {seed}{}",
        if quick { " --quick" } else { "" }
    );
    let header = format!(
        "{} scenarios, seed {seed}, {date}, {:.1} s (`{command}`)",
        results.len(),
        elapsed.as_secs_f64()
    );
    let table = report::markdown(&rows, &header);
    println!("{table}");
    if let Some(out) = out {
        std::fs::create_dir_all(out)?;
        let document = serde_json::json!({
            "command": command,
            "seed": seed,
            "quick": quick,
            "date": date,
            "seconds": elapsed.as_secs_f64(),
            "summary": rows,
            "scenarios": results,
        });
        std::fs::write(
            out.join("results.json"),
            serde_json::to_string(&document)? + "\n",
        )?;
        std::fs::write(out.join("results.md"), &table)?;
        eprintln!("wrote {0}/results.json and {0}/results.md", out.display());
    }
    let all = rows.last().expect("the row of all");
    if all.kernel.clean() {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!(
            "the kernel's side is not clean: {} failed, {} corrupt, {} attacks accepted, {} duplicate effects",
            all.kernel.scenarios - all.kernel.successes,
            all.kernel.corrupt,
            all.kernel.attacks_accepted,
            all.kernel.duplicate_effects
        );
        Ok(ExitCode::from(1))
    }
}
