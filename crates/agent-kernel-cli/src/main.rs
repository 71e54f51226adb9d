//! `agent-kernel`: run tool-call plans as sagas with durable intent, rollback and recovery.
//!
//! See `agent-kernel --help`, docs/reference.md and SPEC.md for the commands, and reference-level
//! exit codes: 0 success, 1 rolled back, 2 bad input, 3 operator attention, 4 denied, 5 the
//! saga waits for an approval.

mod approvals;
mod audit;
mod bench;
mod dlq;
mod export;
mod output;
mod progress;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use agent_kernel_api::{Durability, Plan, SagaId, SagaState, TxError};
use agent_kernel_core::{
    Cancellation, DEFAULT_DB, DEFAULT_FSM, DEFAULT_SANDBOX, Kernel, KernelBuilder, KernelError,
    SystemClock, current_owner,
};
use agent_kernel_dispatcher::Dispatcher;
use agent_kernel_fsm::Guardrail;
use agent_kernel_sandbox::{
    FsSandbox, HttpSandbox, NetworkLine, Policy, SecondLine, restrict_network, restrict_to_roots,
};
use agent_kernel_txlog::{LogOptions, SqliteLog};
use anyhow::Context as _;
use clap::{Parser, Subcommand};

use crate::output::Output;

/// Exit codes of the contract.
pub(crate) mod exit {
    /// Success: the saga is `Done`, recovered, rolled back, or the log is intact.
    pub(crate) const OK: u8 = 0;
    /// The saga failed and was fully rolled back.
    pub(crate) const ROLLED_BACK: u8 = 1;
    /// Bad input; nothing was executed.
    pub(crate) const BAD_INPUT: u8 = 2;
    /// Operator attention needed: a compensation failed.
    pub(crate) const ATTENTION: u8 = 3;
    /// Denied by the sandbox or the FSM; an approval rejected or expired; a decision on a
    /// request already decided, or without the operator key.
    pub(crate) const DENIED: u8 = 4;
    /// The saga waits for an operator's approval (`run --no-wait`, `resume --no-wait`).
    pub(crate) const AWAITING_APPROVAL: u8 = 5;
}

/// Largest `--limit` of `log`.
const MAX_LOG_LIMIT: u32 = 10_000;

/// How long `undo` and `dlq retry` wait for another one on the same log to finish.
const OPERATOR_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long `sandbox status --probe-connect` waits for a connection.
const PROBE_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

#[derive(Debug, Parser)]
#[command(
    name = "agent-kernel",
    version,
    about = "Saga transactions, crash recovery and a sandbox for AI agent tool calls"
)]
struct Cli {
    /// The log database [default: $AGENT_KERNEL_DB, else ./agent-kernel.db]
    #[arg(long, global = true, env = "AGENT_KERNEL_DB", value_name = "PATH")]
    db: Option<PathBuf>,
    /// The audit key file, hex digits [default: $AGENT_KERNEL_AUDIT_KEY, else no key]
    #[arg(long, global = true, value_name = "PATH")]
    audit_key_file: Option<PathBuf>,
    /// The sandbox policy [default: ./sandbox.toml if it exists, else deny all]
    #[arg(long, global = true, value_name = "PATH")]
    sandbox: Option<PathBuf>,
    /// The FSM transition table [default: ./fsm.toml if it exists, else the built-in table]
    #[arg(long, global = true, value_name = "PATH")]
    fsm: Option<PathBuf>,
    /// Tools of your own, programs in any language [default: ./tools.toml if it exists]
    #[arg(long, global = true, value_name = "PATH")]
    tools: Option<PathBuf>,
    /// Print exactly one JSON document on stdout instead of human-readable output
    #[arg(long, global = true)]
    json: bool,
    /// More log detail on stderr (-v info, -vv debug, -vvv trace); RUST_LOG overrides
    #[arg(short, long, global = true, action = clap::ArgAction::Count, conflicts_with = "quiet")]
    verbose: u8,
    /// Only errors on stderr
    #[arg(short, long, global = true)]
    quiet: bool,
    /// How logs on stderr are written
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check every step of a plan, then run it as a saga
    Run {
        /// The plan file (JSON)
        #[arg(long, value_name = "FILE")]
        plan: PathBuf,
        /// `full` survives power loss; `normal` survives process crashes only
        #[arg(long, default_value = "full", value_parser = parse_durability)]
        durability: Durability,
        /// Check and simulate the plan: nothing is executed; the log records it as a dry run
        #[arg(long)]
        dry_run: bool,
        /// Stop at a step that needs an operator's approval (exit 5) instead of waiting;
        /// `resume --saga ID` continues the plan once it is decided
        #[arg(long, conflicts_with = "dry_run")]
        no_wait: bool,
    },
    /// Continue a saga that waits for an approval, in this process, once it is decided
    Resume {
        /// The saga id
        #[arg(long, value_name = "ID")]
        saga: String,
        /// Exit 5 at once if the request is still pending instead of waiting for it
        #[arg(long)]
        no_wait: bool,
    },
    /// List the approval requests waiting for a decision, each with its whole arguments
    Approvals {
        /// Show one request in full (any status): its arguments, digest, decision and the
        /// plan's steps that run after it
        #[arg(long, value_name = "ID")]
        show: Option<String>,
    },
    /// Approve a pending request: its step runs once, with exactly the arguments shown
    Approve {
        /// The request id (`agent-kernel approvals`)
        id: String,
        /// A note recorded with the decision in the audit chain
        #[arg(long, value_name = "TEXT")]
        note: Option<String>,
        /// The operator key, when the request was asked under a policy that names one
        #[arg(long, value_name = "FILE")]
        operator_key_file: Option<PathBuf>,
    },
    /// Reject a pending request: its step never runs, and the saga rolls back
    Reject {
        /// The request id (`agent-kernel approvals`)
        id: String,
        /// Why, recorded with the decision in the audit chain
        #[arg(long, value_name = "TEXT")]
        reason: String,
        /// The operator key, when the request was asked under a policy that names one
        #[arg(long, value_name = "FILE")]
        operator_key_file: Option<PathBuf>,
    },
    /// Roll back every saga left unfinished by a process that is no longer running
    Recover {
        /// Act even if `audit verify` finds the log tampered with (recorded in the audit chain)
        #[arg(long)]
        skip_verify: bool,
        /// Keep going: a worker that rolls back, every RECOVER_WATCH_PERIOD, the sagas of every
        /// owner found dead (on PostgreSQL, whose lease ran out), until SIGINT or SIGTERM
        #[arg(long)]
        watch: bool,
        /// On PostgreSQL: wait until every lease that keeps a saga from recovery has run
        /// out (at most RECOVER_WAIT_MAX), then recover those sagas too
        #[arg(long, conflicts_with = "watch")]
        wait: bool,
    },
    /// Compensate a saga's committed steps in reverse order
    Rollback {
        /// The saga id
        #[arg(long, value_name = "ID")]
        saga: String,
        /// Act even if `audit verify` finds the log tampered with (recorded in the audit chain)
        #[arg(long)]
        skip_verify: bool,
    },
    /// Undo a Done saga: compensate its steps last first, within their undo windows
    Undo {
        /// The saga id
        #[arg(long, value_name = "ID")]
        saga: String,
        /// Why, recorded in the audit chain
        #[arg(long, value_name = "TEXT")]
        reason: String,
        /// Undo a step even when another writer changed what it left since
        #[arg(long)]
        force: bool,
        /// Act even if `audit verify` finds the log tampered with (recorded in the audit chain)
        #[arg(long)]
        skip_verify: bool,
    },
    /// Remove settled sagas older than a horizon from the log; never an open one, one waiting
    /// for an approval, one whose compensation failed, or one inside its undo window
    Prune {
        /// The horizon: sagas that finished longer ago than this (`90s`, `15m`, `24h`, `30d`)
        #[arg(long, value_name = "DURATION", value_parser = parse_horizon)]
        before: u64,
        /// Then rebuild the file so the freed space goes back to the file system (VACUUM)
        #[arg(long)]
        vacuum: bool,
        /// Act even if `audit verify` finds the log tampered with (recorded in the audit chain)
        #[arg(long)]
        skip_verify: bool,
    },
    /// Check a saga's recorded history again, executing nothing: every state change against
    /// the FSM table (the one in force, or --fsm), every step's tool version and argument
    /// hash; exit 1 naming the first divergence
    Replay {
        /// The saga id
        #[arg(long, value_name = "ID")]
        saga: String,
    },
    /// Write sagas as OpenTelemetry traces (OTLP/JSON): a root span per saga, a span per
    /// step (`execute_tool TOOL`) and per compensation, times from the log
    #[command(group(clap::ArgGroup::new("which").required(true).args(["saga", "all"])))]
    Export {
        /// OTLP/JSON, the JSON form of an `ExportTraceServiceRequest` (the only format)
        #[arg(long, required = true)]
        otel: bool,
        /// Export this saga
        #[arg(long, value_name = "ID")]
        saga: Option<String>,
        /// Export every saga in the log (the newest `EXPORT_SAGAS_MAX`, 10,000)
        #[arg(long)]
        all: bool,
        /// Write the document to FILE (replaced whole) instead of standard output
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Show one saga with its steps, or list recent sagas
    Log {
        /// Show this saga and every step with its status
        #[arg(long, value_name = "ID")]
        saga: Option<String>,
        /// How many sagas to list, most recent first
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_LOG_LIMIT)))]
        limit: u32,
    },
    /// Measure the kernel's per-step cost in a temporary log
    Bench(bench::BenchArgs),
    /// Serve the Model Context Protocol on stdio: an agent's tool calls as sagas
    Mcp {
        /// The actor recorded with this connection's sagas (one saga at a time)
        #[arg(long, value_name = "NAME")]
        actor: Option<String>,
        /// Also offer the drill tools (fault.*), which fail on purpose
        #[arg(long)]
        drills: bool,
    },
    /// See, retry or settle the compensations that failed (dead letters)
    Dlq {
        #[command(subcommand)]
        action: DlqAction,
    },
    /// List the tools with their classes and the limits in force
    Tools,
    /// Check the tamper-evident audit log
    Audit {
        #[command(subcommand)]
        action: AuditAction,
    },
    /// Which lines of the sandbox are active
    Sandbox {
        #[command(subcommand)]
        action: SandboxAction,
    },
    /// Show the FSM transition table in use, or check a custom one
    Fsm {
        /// Show the table (the default when no subcommand is given)
        #[arg(long)]
        show: bool,
        /// How to show it
        #[arg(long, value_enum, default_value_t = FsmFormat::Table)]
        format: FsmFormat,
        #[command(subcommand)]
        action: Option<FsmAction>,
    },
}

#[derive(Debug, Subcommand)]
enum AuditAction {
    /// Check every record, the head file and the tables; name the first bad record (exit 1)
    Verify,
    /// Put a log back in service after its head file was lost or left behind (a restore, a
    /// power loss): check the records and the tables, then record the seal and write a head
    /// file naming it. It cannot tell whether the newest records were removed: look first
    Seal,
    /// List the audit records, newest first: denials, operator commands, every change
    List {
        /// Only records of this kind (PlanDenied, Operator, RefuseStep, …); repeatable
        #[arg(long, value_name = "KIND")]
        kind: Vec<String>,
        /// Only records about this saga
        #[arg(long, value_name = "ID")]
        saga: Option<String>,
        /// How many records, newest first
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=i64::from(agent_kernel_txlog::AUDIT_RECORDS_MAX)))]
        limit: u32,
    },
}

#[derive(Debug, Subcommand)]
enum DlqAction {
    /// The open dead letters, oldest first
    List,
    /// Run a dead letter's compensation again; exit 0 when it is compensated, 3 when not
    Retry {
        /// The dead letter's id (`agent-kernel dlq list`)
        #[arg(required_unless_present = "due", conflicts_with = "due")]
        id: Option<String>,
        /// Retry every open dead letter whose backoff has passed
        #[arg(long)]
        due: bool,
        /// Run the compensation even when what its step left has changed since (a letter
        /// whose error starts `changed since:`): the later change is overwritten
        #[arg(long, conflicts_with = "due")]
        force: bool,
        /// Act even if `audit verify` finds the log tampered with (recorded in the audit chain)
        #[arg(long)]
        skip_verify: bool,
    },
    /// Settle a dead letter by hand, saying how
    Resolve {
        /// The dead letter's id (`agent-kernel dlq list`)
        id: String,
        /// What was done, recorded in the audit chain
        #[arg(long, value_name = "TEXT")]
        note: String,
    },
}

#[derive(Debug, Subcommand)]
enum SandboxAction {
    /// Report the policy (first line) and whether the kernel confines tools (second line)
    Status {
        /// After confining this process as `run` would, try to read PATH directly, beside
        /// the first line, to show whether the kernel refuses it
        #[arg(long, value_name = "PATH")]
        probe: Option<PathBuf>,
        /// After confining this process as `run` would, open a TCP connection to ADDRESS
        /// (`ip:port`) directly, beside the first line, to show whether the kernel refuses it
        #[arg(long, value_name = "ADDRESS")]
        probe_connect: Option<std::net::SocketAddr>,
    },
}

#[derive(Debug, Subcommand)]
enum FsmAction {
    /// Validate a custom table: exit 0, or 2 with every problem and its line
    Check {
        /// The table to check (TOML)
        file: PathBuf,
    },
}

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// Human-readable lines
    Text,
    /// One JSON object per line, with the saga and step spans
    Json,
}

/// Renderings of the FSM table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum FsmFormat {
    /// Aligned columns
    Table,
    /// A Mermaid state diagram
    Mermaid,
    /// A Graphviz digraph
    Dot,
    /// `fsm.toml`, loadable with --fsm
    Toml,
}

fn parse_durability(text: &str) -> Result<Durability, String> {
    text.parse()
}

/// A failure with the exit code it maps to.
struct Failure {
    code: u8,
    kind: &'static str,
    error: anyhow::Error,
}

impl Failure {
    fn bad_input(error: impl Into<anyhow::Error>) -> Self {
        Self {
            code: exit::BAD_INPUT,
            kind: "bad_input",
            error: error.into(),
        }
    }

    /// Something went wrong inside, not in the input: operator attention (exit 3).
    fn internal(error: impl Into<anyhow::Error>) -> Self {
        Self {
            code: exit::ATTENTION,
            kind: "internal",
            error: error.into(),
        }
    }
}

impl From<KernelError> for Failure {
    fn from(error: KernelError) -> Self {
        let (code, kind) = if error.is_bad_input() {
            (exit::BAD_INPUT, "bad_input")
        } else if error.is_denied() {
            (exit::DENIED, "denied")
        } else {
            (exit::ATTENTION, "internal")
        };
        Self {
            code,
            kind,
            error: error.into(),
        }
    }
}

impl From<TxError> for Failure {
    fn from(error: TxError) -> Self {
        KernelError::from(error).into()
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => return usage_error(&error),
    };
    init_tracing(&cli);
    let out = Output::new(cli.json);
    // One thread drives every saga; SQLite work runs on the log's own writer thread and file
    // I/O on the blocking pool, so a second async worker would only add cross-thread wake-ups.
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
        .map_err(Failure::internal)
        .and_then(|runtime| {
            let result = runtime.block_on(dispatch(&cli, &out));
            if matches!(cli.command, Command::Mcp { .. }) {
                // The stdio transport's read of stdin blocks a thread that no cancellation
                // reaches (after SIGTERM the client may keep stdin open): do not wait for it.
                // Every saga was rolled back and every log write answered before this.
                runtime.shutdown_background();
            }
            result
        });
    match result {
        Ok(code) => ExitCode::from(code),
        Err(failure) => {
            out.error(failure.kind, &failure.error);
            ExitCode::from(failure.code)
        }
    }
}

/// Reports a command-line error: clap's message on stderr (help and version on stdout, exit
/// 0), and with `--json` also one JSON document on stdout. Usage errors exit 2.
fn usage_error(error: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(
        error.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) && error.exit_code() == 0
    {
        // `error.print` writes help to stdout as clap would.
        let _ = error.print();
        return ExitCode::from(exit::OK);
    }
    let _ = error.print();
    if std::env::args().any(|arg| arg == "--json") {
        let message = error
            .kind()
            .as_str()
            .unwrap_or("invalid command line")
            .to_owned();
        Output::new(true).usage_error(&message, &error.render().to_string());
    }
    ExitCode::from(exit::BAD_INPUT)
}

/// Logs go to stderr: `RUST_LOG` if set, else the level `-v`/`-q` choose (default `warn`).
fn init_tracing(cli: &Cli) {
    let level = match (cli.quiet, cli.verbose) {
        (true, _) => "error",
        (false, 0) => "warn",
        (false, 1) => "info",
        (false, 2) => "debug",
        (false, _) => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .init(),
    }
}

/// Stops a running saga at the next step boundary on the first SIGINT or SIGTERM; a second
/// signal exits at once, leaving the saga for `agent-kernel recover`.
fn watch_signals(cancel: Arc<Cancellation>) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut interrupt), Ok(mut terminate)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        tracing::warn!("cannot install signal handlers; Ctrl-C will stop the process at once");
        return;
    };
    tokio::spawn(async move {
        let mut n_signals = 0_u32;
        loop {
            let name = tokio::select! {
                _ = interrupt.recv() => "SIGINT",
                _ = terminate.recv() => "SIGTERM",
            };
            n_signals += 1;
            if n_signals == 1 {
                eprintln!(
                    "agent-kernel: {name} received; stopping at the next step boundary and rolling back (send it again to exit at once and leave the saga to `agent-kernel recover`)"
                );
                cancel.cancel(format!("{name} received"));
            } else {
                eprintln!("agent-kernel: second {name}: exiting now; run `agent-kernel recover`");
                std::process::exit(130);
            }
        }
    });
}

async fn dispatch(cli: &Cli, out: &Output) -> Result<u8, Failure> {
    match &cli.command {
        Command::Run {
            plan,
            durability,
            dry_run,
            no_wait,
        } => {
            // Everything about the input is checked before the log is opened.
            let plan = read_plan(plan)?;
            let live = if *dry_run {
                None
            } else {
                live_export_config()?
            };
            let (kernel, exporter) = open_kernel_exporting(
                cli,
                *durability,
                Compensation::AndExecution,
                Vec::new(),
                true,
                live,
            )?;
            if *dry_run {
                let report = kernel.dry_run(&plan).await?;
                out.saga(&report);
                return Ok(match report.state {
                    SagaState::Done => exit::OK,
                    _ if report.is_denied() => exit::DENIED,
                    _ => exit::ROLLED_BACK,
                });
            }
            let progress = progress::StepProgress::new(plan.steps.len());
            let cancel = Arc::new(Cancellation::new());
            watch_signals(cancel.clone());
            let report = kernel.run_cancellable(&plan, &progress, &cancel).await?;
            let report =
                approvals::settle_waits(&kernel, report, *no_wait, &progress, &cancel).await?;
            if cancel.is_cancelled() && report.state == SagaState::Done {
                eprintln!(
                    "agent-kernel: the signal came while the last step was running; no step was left to stop before, so the saga completed"
                );
            }
            progress.finish();
            out.saga(&report);
            finish_live_export(exporter);
            Ok(approvals::exit_code(&report))
        }
        Command::Resume { saga, no_wait } => {
            let saga_id = parse_saga_id(saga)?;
            require_log(cli)?;
            let kernel = open_kernel_for_approvals(cli)?;
            let progress = progress::StepProgress::hidden();
            let cancel = Arc::new(Cancellation::new());
            watch_signals(cancel.clone());
            let report = kernel.resume(&saga_id, &progress, &cancel).await?;
            let report =
                approvals::settle_waits(&kernel, report, *no_wait, &progress, &cancel).await?;
            out.saga(&report);
            Ok(approvals::exit_code(&report))
        }
        Command::Undo {
            saga,
            reason,
            force,
            skip_verify,
        } => {
            let saga_id = parse_saga_id(saga)?;
            require_log(cli)?;
            let _lock = operator_lock(cli).await?;
            // Undo compensates from the log's records, as `rollback` does.
            let kernel = open_kernel_to_compensate(cli, *skip_verify).await?;
            let report = kernel
                .undo(
                    &saga_id,
                    &agent_kernel_core::UndoRequest {
                        reason: reason.clone(),
                        force: *force,
                    },
                    &progress::StepProgress::hidden(),
                )
                .await?;
            out.saga(&report);
            Ok(match report.state {
                SagaState::Undone => exit::OK,
                // A dry run has nothing to undo.
                _ if report.dry_run => exit::OK,
                _ => exit::ATTENTION,
            })
        }
        Command::Prune {
            before,
            vacuum,
            skip_verify,
        } => {
            require_log(cli)?;
            let _lock = operator_lock(cli).await?;
            // What is removed is chosen from the tables: they must say what the chain says.
            let options = verify_before_acting(cli, *skip_verify).await?;
            // Opened before the kernel confines this process to the roots: its writer
            // thread keeps its access to the log.
            let vacuum_log = if *vacuum {
                Some(open_log(cli, Durability::Full)?)
            } else {
                None
            };
            let kernel = open_kernel(
                cli,
                Durability::Full,
                Compensation::AndExecution,
                options,
                true,
            )?;
            let report = kernel.prune(*before).await?;
            drop(kernel);
            if let Some(log) = vacuum_log {
                log.vacuum().await.map_err(|error| {
                    log_failure(error, true, "cannot vacuum the log".to_owned())
                })?;
            }
            out.prune(&report, *vacuum);
            Ok(exit::OK)
        }
        Command::Dlq { action } => {
            require_log(cli)?;
            match action {
                DlqAction::List => {
                    let kernel = open_kernel_for_approvals(cli)?;
                    dlq::list_command(&kernel, out).await
                }
                DlqAction::Retry {
                    id,
                    due,
                    force,
                    skip_verify,
                } => {
                    let _lock = operator_lock(cli).await?;
                    // A retry compensates from the log's records, as `rollback` does.
                    let kernel = open_kernel_to_compensate(cli, *skip_verify).await?;
                    match id {
                        Some(id) if !*due => dlq::retry_command(&kernel, out, id, *force).await,
                        _ => dlq::retry_due_command(&kernel, out).await,
                    }
                }
                DlqAction::Resolve { id, note } => {
                    let kernel = open_kernel_for_approvals(cli)?;
                    dlq::resolve_command(&kernel, out, id, note).await
                }
            }
        }
        Command::Approvals { show } => {
            require_log(cli)?;
            let kernel = open_kernel_for_approvals(cli)?;
            match show {
                Some(id) => approvals::show_command(&kernel, out, id).await,
                None => approvals::list_command(&kernel, out).await,
            }
        }
        Command::Approve {
            id,
            note,
            operator_key_file,
        } => {
            decide(
                cli,
                out,
                id,
                true,
                note.clone(),
                operator_key_file.as_deref(),
            )
            .await
        }
        Command::Reject {
            id,
            reason,
            operator_key_file,
        } => {
            decide(
                cli,
                out,
                id,
                false,
                Some(reason.clone()),
                operator_key_file.as_deref(),
            )
            .await
        }
        Command::Recover {
            skip_verify,
            watch: true,
            ..
        } => {
            let kernel = open_kernel_to_compensate(cli, *skip_verify).await?;
            recover_watch(&kernel, out).await
        }
        Command::Recover {
            skip_verify,
            watch: false,
            wait: true,
        } => {
            let kernel = open_kernel_to_compensate(cli, *skip_verify).await?;
            let report = recover_waiting(&kernel).await?;
            out.recovery(&report);
            Ok(if report.all_rolled_back() {
                exit::OK
            } else {
                exit::ATTENTION
            })
        }
        Command::Recover {
            skip_verify,
            watch: false,
            wait: false,
        } => {
            if !log_present(&db_path(cli))? {
                // Nothing was ever logged here, so nothing can need recovery.
                out.recovery(&agent_kernel_core::RecoveryReport::default());
                return Ok(exit::OK);
            }
            let kernel = open_kernel_to_compensate(cli, *skip_verify).await?;
            let report = kernel.recover(&progress::StepProgress::hidden()).await?;
            out.recovery(&report);
            Ok(if report.all_rolled_back() {
                exit::OK
            } else {
                exit::ATTENTION
            })
        }
        Command::Rollback { saga, skip_verify } => {
            let saga_id = parse_saga_id(saga)?;
            require_log(cli)?;
            let kernel = open_kernel_to_compensate(cli, *skip_verify).await?;
            let report = kernel
                .rollback(&saga_id, &progress::StepProgress::hidden())
                .await?;
            out.saga(&report);
            Ok(match report.state {
                // A dry run has nothing to undo.
                _ if report.dry_run => exit::OK,
                SagaState::FailedRolledBack => exit::OK,
                _ => exit::ATTENTION,
            })
        }
        Command::Audit {
            action: AuditAction::Verify,
        } => {
            let key = audit_key(cli)?;
            require_log(cli)?;
            audit::verify_command(&db_path(cli), key, cli.json).await
        }
        Command::Audit {
            action: AuditAction::List { kind, saga, limit },
        } => {
            sqlite_only(cli, "audit list")?;
            require_log(cli)?;
            let query = agent_kernel_txlog::AuditQuery {
                kinds: kind.clone(),
                saga_id: saga
                    .as_deref()
                    .map(parse_saga_id)
                    .transpose()?
                    .map(|id| id.as_str().to_owned()),
                limit: *limit,
            };
            audit::list_command(&db_path(cli), query, cli.json).await
        }
        Command::Audit {
            action: AuditAction::Seal,
        } => {
            sqlite_only(cli, "audit seal")?;
            let key = audit_key(cli)?;
            require_log(cli)?;
            let owner = this_process()?;
            audit::seal_command(&db_path(cli), key, cli.json, owner, || {
                open_log(cli, Durability::Full)
            })
            .await
        }
        Command::Sandbox {
            action:
                SandboxAction::Status {
                    probe,
                    probe_connect,
                },
        } => {
            let policy = load_policy(cli)?;
            let files = restrict_to_roots(&policy);
            let network = restrict_network(&policy);
            let probe = probe.as_ref().map(|path| {
                let result = std::fs::File::open(path);
                (
                    path.clone(),
                    result.map(|_| ()).map_err(|error| error.to_string()),
                )
            });
            let probe_connect = probe_connect.map(|address| {
                let result = std::net::TcpStream::connect_timeout(&address, PROBE_CONNECT_TIMEOUT);
                (
                    address.to_string(),
                    result.map(|_| ()).map_err(|error| error.to_string()),
                )
            });
            out.sandbox_status(&output::SandboxStatus {
                policy: &policy,
                files: &files,
                network: &network,
                probe: probe.as_ref(),
                probe_connect: probe_connect.as_ref(),
            });
            Ok(exit::OK)
        }
        Command::Tools => {
            let policy = load_policy(cli)?;
            let approvals =
                agent_kernel_core::approval_policy_from(&policy).map_err(Failure::bad_input)?;
            let tools = build_dispatcher(cli, &policy)?;
            tools.load_all().await;
            out.tools(&tools, &approvals);
            Ok(exit::OK)
        }
        Command::Replay { saga } => {
            sqlite_only(cli, "replay")?;
            let saga_id = parse_saga_id(saga)?;
            require_log(cli)?;
            let fsm = load_fsm(cli)?;
            let policy = load_policy(cli)?;
            let tools = build_dispatcher(cli, &policy)?;
            let log = open_log(cli, Durability::Full)?;
            let record = agent_kernel_api::TxLog::saga(&log, &saga_id)
                .await?
                .ok_or_else(|| KernelError::SagaNotFound(saga_id.clone()))?;
            drop(log);
            for step in &record.steps {
                // An upstream server is asked for its tools only when a step used one.
                let _ = tools.load(&step.tool_id).await;
            }
            let recorded = audit::saga_history(&db_path(cli), &saga_id).await?;
            let report = agent_kernel_core::replay(&record, &recorded, &fsm, &tools);
            out.replay(&report);
            Ok(if report.divergence.is_none() {
                exit::OK
            } else {
                exit::ROLLED_BACK
            })
        }
        Command::Export {
            otel: _,
            saga,
            all: _,
            out: file,
        } => {
            let saga_id = saga.as_deref().map(parse_saga_id).transpose()?;
            sqlite_only(cli, "export")?;
            require_log(cli)?;
            export::otel(cli, &db_path(cli), saga_id, file.as_deref()).await
        }
        Command::Log { saga, limit } => {
            sqlite_only(cli, "log")?;
            if saga.is_none() && !log_present(&db_path(cli))? {
                out.saga_list(&[]);
                return Ok(exit::OK);
            }
            require_log(cli)?;
            let log = open_log(cli, Durability::Full)?;
            match saga {
                Some(saga) => {
                    let saga_id = parse_saga_id(saga)?;
                    let record = agent_kernel_api::TxLog::saga(&log, &saga_id)
                        .await?
                        .ok_or(KernelError::SagaNotFound(saga_id))?;
                    out.saga_record(&record);
                }
                None => {
                    let sagas = agent_kernel_api::TxLog::sagas(&log, *limit).await?;
                    out.saga_list(&sagas);
                }
            }
            Ok(exit::OK)
        }
        Command::Fsm {
            show: _,
            format,
            action,
        } => match action {
            Some(FsmAction::Check { file }) => {
                let fsm = read_fsm(file)?;
                out.fsm_checked(file, &fsm);
                Ok(exit::OK)
            }
            None => {
                let fsm = load_fsm(cli)?;
                out.fsm(&fsm, *format);
                Ok(exit::OK)
            }
        },
        Command::Mcp { actor, drills } => {
            let live = live_export_config()?;
            let (kernel, exporter) = open_kernel_exporting(
                cli,
                Durability::Full,
                Compensation::AndExecution,
                Vec::new(),
                *drills,
                live,
            )?;
            let served = agent_kernel_mcp::serve_stdio(
                kernel,
                agent_kernel_mcp::ServerOptions {
                    actor: actor.clone(),
                },
            )
            .await;
            // The open sagas were rolled back: their last spans go out before the exit.
            finish_live_export(exporter);
            served.map_err(|error| {
                Failure::internal(anyhow::anyhow!("the MCP server stopped: {error}"))
            })?;
            Ok(exit::OK)
        }
        Command::Bench(args) => {
            args.check()
                .map_err(|message| Failure::bad_input(anyhow::anyhow!(message)))?;
            let report = bench::run(args).await.map_err(Failure::internal)?;
            out.bench(&report);
            Ok(exit::OK)
        }
    }
}

/// An exclusive advisory lock on `<db>.operator.lock`, held while `undo` or `dlq retry`
/// compensates: two of them on one log never compensate at once (a second waits up to
/// `OPERATOR_LOCK_WAIT`, then is refused as busy). The kernel releases it at exit, a kill
/// included.
async fn operator_lock(cli: &Cli) -> Result<Option<std::fs::File>, Failure> {
    if is_postgres(cli) {
        // Many machines share the log: the database's own locks order its writers.
        return Ok(None);
    }
    let mut name = db_path(cli).into_os_string();
    name.push(".operator.lock");
    let path = PathBuf::from(name);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot open the lock file {}", path.display()))
        .map_err(Failure::internal)?;
    let deadline = tokio::time::Instant::now() + OPERATOR_LOCK_WAIT;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(Some(file)),
            Err(std::fs::TryLockError::WouldBlock) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(Failure::bad_input(anyhow::anyhow!(
                    "another undo or dlq retry is compensating on this log ({} is locked); try again once it has finished; nothing was done",
                    path.display()
                )));
            }
            Err(std::fs::TryLockError::Error(error)) => {
                return Err(Failure::internal(
                    anyhow::Error::new(error).context(format!("cannot lock {}", path.display())),
                ));
            }
        }
    }
}

/// The kernel of `resume`, `approvals`, `approve` and `reject`: the tools and the policy of
/// `run`, since a resumed saga runs its remaining steps.
fn open_kernel_for_approvals(cli: &Cli) -> Result<Arc<Kernel>, Failure> {
    open_kernel(
        cli,
        Durability::Full,
        Compensation::AndExecution,
        Vec::new(),
        true,
    )
}

/// `approve` and `reject`: the decision, with the operator key given (which the request
/// names when the policy it was asked under has one), read before the log is opened.
async fn decide(
    cli: &Cli,
    out: &Output,
    approval_id: &str,
    approve: bool,
    note: Option<String>,
    operator_key_file: Option<&Path>,
) -> Result<u8, Failure> {
    require_log(cli)?;
    let operator_key = approvals::given_operator_key(operator_key_file)?;
    let kernel = open_kernel_for_approvals(cli)?;
    approvals::decide_command(&kernel, out, approval_id, approve, note, operator_key).await
}

fn parse_saga_id(text: &str) -> Result<SagaId, Failure> {
    let text = text.trim();
    if text.is_empty() {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "--saga needs a saga id"
        )));
    }
    if text.chars().any(char::is_control) {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "--saga `{}` is not a saga id: it holds control characters",
            text.escape_debug()
        )));
    }
    Ok(SagaId::new(text))
}

/// Reads a UTF-8 text file of at most `max_bytes`, naming it `what` in errors; never reads
/// more than one byte past the bound, so a huge file is refused without being loaded.
fn read_text_file(path: &Path, what: &str, max_bytes: usize) -> Result<String, Failure> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|file| file.take(max_bytes as u64 + 1).read_to_end(&mut bytes))
        .with_context(|| format!("cannot read {what} {}", path.display()))
        .map_err(Failure::bad_input)?;
    if bytes.len() > max_bytes {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "{what} {} is more than the maximum of {max_bytes} bytes",
            path.display()
        )));
    }
    String::from_utf8(bytes).map_err(|_| {
        Failure::bad_input(anyhow::anyhow!(
            "{what} {} is not UTF-8 text",
            path.display()
        ))
    })
}

fn read_plan(path: &Path) -> Result<Plan, Failure> {
    let text = read_text_file(path, "plan", agent_kernel_api::MAX_PLAN_BYTES)?;
    Plan::from_json(&text)
        .with_context(|| format!("plan {}", path.display()))
        .map_err(Failure::bad_input)
}

/// Reads and validates an FSM table file.
fn read_fsm(path: &Path) -> Result<Guardrail, Failure> {
    let text = read_text_file(path, "FSM table", agent_kernel_fsm::MAX_TABLE_BYTES)?;
    Guardrail::from_toml_str(&text)
        .with_context(|| format!("FSM table {}", path.display()))
        .map_err(Failure::bad_input)
}

/// The table in force: `--fsm`, else `./fsm.toml` if it exists, else the built-in one.
fn load_fsm(cli: &Cli) -> Result<Guardrail, Failure> {
    match &cli.fsm {
        Some(path) => read_fsm(path),
        None if Path::new(DEFAULT_FSM).is_file() => read_fsm(Path::new(DEFAULT_FSM)),
        None => Ok(Guardrail::builtin()),
    }
}

fn db_path(cli: &Cli) -> PathBuf {
    cli.db.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_DB))
}

/// Whether `--db` names a PostgreSQL database rather than an SQLite file.
fn is_postgres(cli: &Cli) -> bool {
    is_postgres_path(&db_path(cli))
}

/// Whether `path` is a PostgreSQL database's URL rather than an SQLite file's path.
pub(crate) fn is_postgres_path(path: &Path) -> bool {
    path.to_str()
        .is_some_and(agent_kernel_txlog_postgres::is_postgres_url)
}

/// The log as messages name it: the path, or a database URL without its password.
fn shown_db(path: &Path) -> String {
    if !is_postgres_path(path) {
        return path.display().to_string();
    }
    agent_kernel_txlog_postgres::describe_url(&path.to_string_lossy())
        .unwrap_or_else(|| "a PostgreSQL URL that does not parse".to_owned())
}

/// A command that reads the SQLite file itself, refused on a PostgreSQL log.
fn sqlite_only(cli: &Cli, command: &str) -> Result<(), Failure> {
    if is_postgres(cli) {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "`{command}` works on an SQLite log only so far; {} is a PostgreSQL log (SPEC.md, Known gaps); nothing was done",
            shown_db(&db_path(cli))
        )));
    }
    Ok(())
}

/// How often `recover --watch` looks for sagas of dead owners.
const RECOVER_WATCH_PERIOD: std::time::Duration = std::time::Duration::from_millis(250);

/// `recover --watch`: rolls back, round after round, every saga of an owner found dead,
/// printing each round that acted; returns on SIGINT or SIGTERM. A round acts only when
/// [`Kernel::has_recoverable_sagas`] says there is something to do, so an idle round writes
/// nothing. The log is verified once, before the first round (`open_kernel_to_compensate`):
/// once the process is confined, a new connection to the database's port is refused, so a
/// round cannot verify again.
async fn recover_watch(kernel: &Kernel, out: &output::Output) -> Result<u8, Failure> {
    use tokio::signal::unix::{SignalKind, signal};
    let listen = |kind: SignalKind, name: &str| {
        signal(kind)
            .with_context(|| format!("cannot watch for {name}"))
            .map_err(Failure::internal)
    };
    let (mut interrupt, mut terminate) = (
        listen(SignalKind::interrupt(), "SIGINT")?,
        listen(SignalKind::terminate(), "SIGTERM")?,
    );
    tracing::info!(
        period_ms = RECOVER_WATCH_PERIOD.as_millis() as u64,
        "recovering the sagas of dead owners until stopped"
    );
    let mut pause = RECOVER_WATCH_PERIOD;
    loop {
        match watch_round(kernel, out).await {
            Ok(()) => {
                if pause != RECOVER_WATCH_PERIOD {
                    tracing::warn!("the log answers again; watching on");
                }
                pause = RECOVER_WATCH_PERIOD;
            }
            Err(KernelError::Log(error)) if watch_may_retry(&error) => {
                // The database went away (a lost connection, a restart): its connection is
                // made again by the next round; nobody else may be recovering meanwhile.
                pause = (pause * 2).clamp(RECOVER_WATCH_PERIOD, RECOVER_WATCH_BACKOFF_MAX);
                tracing::warn!(
                    %error,
                    retry_in_ms = pause.as_millis() as u64,
                    "the log does not answer; trying again"
                );
            }
            Err(error) => return Err(error.into()),
        }
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            _ = interrupt.recv() => return Ok(exit::OK),
            _ = terminate.recv() => return Ok(exit::OK),
        }
    }
}

/// The longest `recover --wait` waits for leases, in all.
const RECOVER_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(3_600);

/// `recover --wait`: recovers, and while sagas are skipped because their owner's lease is
/// live, waits until the soonest of those leases would run out and recovers again, at most
/// [`RECOVER_WAIT_MAX`] in all; the report of every saga, the last word on each.
async fn recover_waiting(kernel: &Kernel) -> Result<agent_kernel_core::RecoveryReport, Failure> {
    let deadline = std::time::Instant::now() + RECOVER_WAIT_MAX;
    // Each saga's latest word, in the order the sagas were first reported.
    let mut sagas: Vec<agent_kernel_core::RecoveryAction> = Vec::new();
    loop {
        let report = kernel.recover(&progress::StepProgress::hidden()).await?;
        let mut soonest_ms: Option<u64> = None;
        let mut n_waiting = 0_usize;
        for action in report.sagas {
            if let agent_kernel_core::RecoveryAction::SkippedLive {
                lease_left_ms: Some(left_ms),
                ..
            } = &action
            {
                soonest_ms = Some(soonest_ms.map_or(*left_ms, |soonest| soonest.min(*left_ms)));
                n_waiting += 1;
            }
            match sagas
                .iter_mut()
                .find(|known| known.saga_id() == action.saga_id())
            {
                Some(known) => *known = action,
                None => sagas.push(action),
            }
        }
        let Some(left_ms) = soonest_ms else {
            return Ok(agent_kernel_core::RecoveryReport { sagas });
        };
        // A little past the lease's end, by the database's clock.
        let pause = std::time::Duration::from_millis(left_ms.saturating_add(100));
        if std::time::Instant::now() + pause > deadline {
            return Ok(agent_kernel_core::RecoveryReport { sagas });
        }
        let waiting = n_waiting;
        eprintln!(
            "agent-kernel: {waiting} saga(s) wait for their worker's lease; the soonest runs out in {:.1} s",
            left_ms as f64 / 1000.0
        );
        tokio::time::sleep(pause).await;
    }
}

/// The longest `recover --watch` waits between two tries while the log does not answer.
const RECOVER_WATCH_BACKOFF_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether `recover --watch` tries again after `error`: the storage went away, which the
/// log's own connection makes good, as opposed to this process being fenced (its lease ran
/// out: it can never write again, and a new process must take its place) or a log that
/// cannot be trusted.
fn watch_may_retry(error: &agent_kernel_api::TxError) -> bool {
    matches!(
        error,
        agent_kernel_api::TxError::Storage(_) | agent_kernel_api::TxError::NotFound(_)
    )
}

/// One round of `recover --watch`: recovers when there is something to recover, and prints
/// the round when it acted.
async fn watch_round(kernel: &Kernel, out: &output::Output) -> Result<(), KernelError> {
    if kernel.has_recoverable_sagas().await? {
        let report = kernel.recover(&progress::StepProgress::hidden()).await?;
        if report.sagas.iter().any(|action| {
            !matches!(
                action,
                agent_kernel_core::RecoveryAction::SkippedLive { .. }
                    | agent_kernel_core::RecoveryAction::SkippedWaiting { .. }
            )
        }) {
            out.recovery(&report);
        }
    }
    Ok(())
}

/// The audit key (`--audit-key-file`, else `$AGENT_KERNEL_AUDIT_KEY`), read once per
/// process: a command that both checks and opens the log reads the key file (and warns about
/// its mode) once.
fn audit_key(cli: &Cli) -> Result<Option<agent_kernel_txlog::AuditKey>, Failure> {
    static KEY: std::sync::OnceLock<Result<Option<agent_kernel_txlog::AuditKey>, String>> =
        std::sync::OnceLock::new();
    KEY.get_or_init(|| {
        audit::audit_key_from_env_or_file(cli.audit_key_file.as_deref())
            .map_err(|error| format!("{error:#}"))
    })
    .clone()
    .map_err(|message| Failure::bad_input(anyhow::anyhow!(message)))
}

/// The owner record of this process.
fn this_process() -> Result<agent_kernel_api::Owner, Failure> {
    current_owner()
        .context("cannot identify this process in /proc")
        .map_err(Failure::internal)
}

/// Most `prune --before` accepts: a hundred years.
const PRUNE_HORIZON_MAX_MS: u64 = 100 * 366 * 86_400_000;

/// `prune --before`: a duration of `agent_kernel_api::parse_duration_ms`, zero to
/// [`PRUNE_HORIZON_MAX_MS`].
fn parse_horizon(text: &str) -> Result<u64, String> {
    let ms = agent_kernel_api::parse_duration_ms(text)?;
    if ms > PRUNE_HORIZON_MAX_MS {
        return Err(format!("`{text}` is more than a hundred years"));
    }
    Ok(ms)
}

/// Opens the log, creating it if absent.
///
/// A file that is not a log, or one from a newer build, is bad input (exit 2), as is a new
/// log that cannot be created where the path says; a log whose schema fails its check is
/// tampered (exit 3), and an existing log that cannot be read or written (truncated,
/// damaged, read-only) needs an operator (exit 3). Nothing is run in any of these cases.
fn open_log(cli: &Cli, durability: Durability) -> Result<SqliteLog, Failure> {
    sqlite_only(cli, "this command")?;
    let path = db_path(cli);
    let audit_key = audit_key(cli)?;
    let existed = log_exists(&path);
    SqliteLog::open_with_audit_key(
        &path,
        LogOptions {
            durability,
            clock: Arc::new(SystemClock),
        },
        audit_key,
    )
    .map_err(|error| {
        log_failure(
            error,
            existed,
            format!("cannot open the log {}", path.display()),
        )
    })
}

/// Whether something that would be opened as the log is at `path` (through links): a
/// non-empty file, or one that cannot be inspected (which then is not taken for a new log).
fn log_exists(path: &Path) -> bool {
    if is_postgres_path(path) {
        return true;
    }
    match agent_kernel_txlog::resolve_db_path(path).map(std::fs::metadata) {
        Ok(Ok(metadata)) => metadata.len() > 0,
        Ok(Err(error)) => error.kind() != std::io::ErrorKind::NotFound,
        Err(_) => true,
    }
}

/// Whether anything is at `path` (through links), for commands that must not create a log:
/// `Ok(false)` only when nothing is there. Links that loop are bad input; a path that cannot
/// be inspected (a folder without search permission) needs an operator.
fn log_present(path: &Path) -> Result<bool, Failure> {
    if is_postgres_path(path) {
        // A database is there or not when it is connected to.
        return Ok(true);
    }
    let file = agent_kernel_txlog::resolve_db_path(path).map_err(Failure::bad_input)?;
    match std::fs::symlink_metadata(&file) {
        Ok(_) => Ok(true),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(error) => Err(Failure {
            code: exit::ATTENTION,
            kind: "storage",
            error: anyhow::anyhow!("cannot inspect the log {}: {error}", file.display()),
        }),
    }
}

/// What a log that could not be opened or read means for the exit code: not a log, a newer
/// one, or (when none `existed`) one that cannot be created is bad input (2); a tampered
/// schema, or an existing log that is damaged, unreadable or unwritable, needs an operator
/// (3). Other problems of the request (an unknown audit record kind) are bad input.
fn log_failure(error: TxError, existed: bool, context: String) -> Failure {
    let (code, kind) = match &error {
        TxError::Tampered { .. } => (exit::ATTENTION, "tampered"),
        TxError::Storage(_) | TxError::Corrupt(_) | TxError::Closed if existed => {
            (exit::ATTENTION, "storage")
        }
        _ => (exit::BAD_INPUT, "bad_input"),
    };
    Failure {
        code,
        kind,
        error: anyhow::Error::new(error).context(context),
    }
}

fn load_policy(cli: &Cli) -> Result<Policy, Failure> {
    match &cli.sandbox {
        Some(path) => Policy::load(path)
            .with_context(|| format!("sandbox policy {}", path.display()))
            .map_err(Failure::bad_input),
        None if Path::new(DEFAULT_SANDBOX).is_file() => Policy::load(Path::new(DEFAULT_SANDBOX))
            .with_context(|| format!("sandbox policy ./{DEFAULT_SANDBOX}"))
            .map_err(Failure::bad_input),
        None => Ok(Policy::deny_all()),
    }
}

/// The built-in tools (the drill tools included, as the contract lists them) behind a
/// dispatcher with the policy's sandbox and limits, for `tools`.
fn build_dispatcher(cli: &Cli, policy: &Policy) -> Result<Dispatcher, Failure> {
    let fs_sandbox = FsSandbox::new(policy)
        .context("cannot open the sandbox's allowed roots")
        .map_err(Failure::bad_input)?;
    let cwd = std::env::current_dir()
        .context("cannot read the working directory")
        .map_err(Failure::bad_input)?;
    let mut limits = agent_kernel_core::limits_from_policy(policy).map_err(Failure::bad_input)?;
    let tools = agent_kernel_tools::builtin_tools(
        Arc::new(fs_sandbox),
        Arc::new(HttpSandbox::new(policy)),
        cwd,
    );
    let mut tools = agent_kernel_core::ToolSet {
        required: tools,
        ..agent_kernel_core::ToolSet::default()
    };
    if let Some(path) = tools_file(cli) {
        tools.extend(
            agent_kernel_core::declared_tools(&path, policy, &mut limits)
                .map_err(Failure::bad_input)?,
        );
    }
    agent_kernel_core::dispatcher_with(limits, tools, policy).map_err(Failure::bad_input)
}

/// The tools file in force: `--tools`, else `./tools.toml` if it exists, else none.
fn tools_file(cli: &Cli) -> Option<PathBuf> {
    match &cli.tools {
        Some(path) => Some(path.clone()),
        None if Path::new(agent_kernel_core::DEFAULT_TOOLS).is_file() => {
            Some(PathBuf::from(agent_kernel_core::DEFAULT_TOOLS))
        }
        None => None,
    }
}

/// The kernel of a command that compensates from the log's records (`recover`,
/// `rollback`, `undo`, `dlq retry`): the log verified first unless `skip_verify`, the
/// table in force or the built-in one.
async fn open_kernel_to_compensate(cli: &Cli, skip_verify: bool) -> Result<Arc<Kernel>, Failure> {
    let options = verify_before_acting(cli, skip_verify).await?;
    open_kernel(cli, Durability::Full, Compensation::Only, options, true)
}

/// `recover` and `rollback` act on undo records (previous file contents, paths): before
/// they do, the audit chain must vouch for the log, unless the operator passed
/// `--skip-verify`. Returns the options to record with the command in the audit chain.
///
/// The check runs before the log is opened for writing, which could migrate it or write its
/// head file.
async fn verify_before_acting(cli: &Cli, skip: bool) -> Result<Vec<String>, Failure> {
    if skip {
        tracing::warn!("--skip-verify: acting on the log without checking its audit chain");
        return Ok(vec!["--skip-verify".to_owned()]);
    }
    let key = audit_key(cli)?;
    let path = db_path(cli);
    let checked = path.clone();
    let postgres = is_postgres(cli);
    let verified = audit::off_thread("the audit check", move || match checked.to_str() {
        Some(url) if postgres => agent_kernel_txlog_postgres::verify(
            url,
            key.as_ref(),
            agent_kernel_txlog_postgres::default_head_file(url).as_deref(),
        ),
        _ => agent_kernel_txlog::verify(&checked, key.as_ref()),
    })
    .await?;
    let report = match verified {
        Ok(report) => report,
        // What is not a log, or a newer one, is refused as opening it would be.
        Err(error @ (TxError::NotALog { .. } | TxError::SchemaTooNew { .. })) => {
            return Err(Failure::bad_input(error));
        }
        Err(error) => {
            // A log from before the audit chain has nothing to verify yet; opening it starts
            // its chain.
            if agent_kernel_txlog::schema_version(&path)
                .is_ok_and(|version| version < agent_kernel_txlog::AUDIT_SCHEMA_VERSION)
            {
                tracing::warn!(
                    path = %path.display(),
                    "the log predates the audit chain, so there is nothing to verify before acting; opening it starts the chain"
                );
                return Ok(Vec::new());
            }
            return Err(Failure::internal(anyhow::Error::new(error).context(format!(
                "cannot check the log {} before acting on it; nothing was undone (to act anyway, pass --skip-verify)",
                shown_db(&path)
            ))));
        }
    };
    match &report.first_bad {
        None => Ok(Vec::new()),
        Some(bad) => Err(Failure {
            code: exit::ATTENTION,
            kind: "tampered",
            error: anyhow::anyhow!(
                "the log {} failed its audit check {}: {}; nothing was undone, since its undo records cannot be trusted. See `agent-kernel audit verify`; to act anyway, pass --skip-verify",
                shown_db(&path),
                if bad.seq == 0 {
                    "on its schema".to_owned()
                } else {
                    format!("at record {}", bad.seq)
                },
                bad.reason
            ),
        }),
    }
}

/// Refuses to go on when the log file does not exist: reading must not create one.
fn require_log(cli: &Cli) -> Result<(), Failure> {
    let path = db_path(cli);
    if log_present(&path)? {
        Ok(())
    } else {
        Err(Failure::bad_input(anyhow::anyhow!(
            "no log at {} (pass --db PATH or set AGENT_KERNEL_DB)",
            path.display()
        )))
    }
}

/// What the kernel's tools will be asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Compensation {
    /// Run plans: the sandbox policy applies.
    AndExecution,
    /// Only compensate logged steps (`recover`, `rollback`). The log is data, never
    /// authority: every recorded path is ruled on again by the policy in force, and the
    /// Landlock second line applies as for `run`. A broken FSM table file falls back to the
    /// built-in table, which lets every compensation finish.
    Only,
}

fn open_kernel(
    cli: &Cli,
    durability: Durability,
    purpose: Compensation,
    operator_options: Vec<String>,
    drills: bool,
) -> Result<Arc<Kernel>, Failure> {
    open_kernel_exporting(cli, durability, purpose, operator_options, drills, None)
        .map(|(kernel, _)| kernel)
}

/// The standard OTLP variables read for live export (`run` and `mcp`): `Ok(None)` when no
/// endpoint is set; a malformed value is bad input, before anything runs.
fn live_export_config() -> Result<Option<agent_kernel_otel::LiveConfig>, Failure> {
    agent_kernel_otel::LiveConfig::from_env(|name| std::env::var(name).ok())
        .map_err(|message| Failure::bad_input(anyhow::anyhow!(message)))
}

/// Stops the live exporter, if any, sending what is left (within `FLUSH_AT_EXIT_MAX`).
fn finish_live_export(exporter: Option<agent_kernel_otel::LiveExporter>) {
    if let Some(exporter) = exporter {
        let (exported, dropped) = exporter.shutdown();
        if dropped > 0 {
            tracing::warn!(exported, dropped, "OTLP export: some spans were dropped");
        } else {
            tracing::debug!(exported, "OTLP export: every span was sent");
        }
    }
}

/// [`open_kernel`], and with `live` the live OTLP exporter for this process's sagas,
/// started before the second line confines the process (its thread and its connections
/// stay outside it, as the log's writer does).
fn open_kernel_exporting(
    cli: &Cli,
    durability: Durability,
    purpose: Compensation,
    operator_options: Vec<String>,
    drills: bool,
    live: Option<agent_kernel_otel::LiveConfig>,
) -> Result<(Arc<Kernel>, Option<agent_kernel_otel::LiveExporter>), Failure> {
    let fsm = match purpose {
        Compensation::AndExecution => load_fsm(cli)?,
        // Rollback must stay possible: every loaded table lets failures and compensations
        // finish, so a broken table file falls back to the built-in one here.
        Compensation::Only => load_fsm(cli).unwrap_or_else(|failure| {
            tracing::warn!(error = %failure.error, "using the built-in FSM table for recovery");
            Guardrail::builtin()
        }),
    };
    // Compensation too runs under the policy in force: what the log records is ruled on
    // again, so a record pointing outside today's roots undoes nothing. A policy file that
    // does not load is bad input here as for `run`: nothing is undone under a guess.
    let policy = load_policy(cli)?;
    if purpose == Compensation::Only {
        // Without a policy every file compensation would be refused for good: more likely
        // the command runs in the wrong folder than on sagas that touched no file.
        if policy.source().is_none() {
            return Err(Failure::bad_input(anyhow::anyhow!(
                "no sandbox policy: recover and rollback rule on every path the log records with the policy in force, and without one every file step would be left uncompensated for good; pass the policy the sagas ran under with --sandbox FILE (or run in the folder of its ./{DEFAULT_SANDBOX}); nothing was done"
            )));
        }
        if policy.fs().is_none() {
            tracing::warn!(
                "the sandbox policy in force allows no file access, so no file step can be compensated (each becomes COMPENSATION_FAILED); pass the policy the sagas ran under with --sandbox"
            );
        }
    }
    let path = db_path(cli);
    let existed = log_exists(&path);
    let tools_file = tools_file(cli);
    let mut builder = KernelBuilder::new().without_tools_file();
    if drills {
        builder = builder.with_drill_tools();
    }
    if let Some(file) = &tools_file {
        builder = builder.tools_file(file);
    }
    let kernel = builder
        .db(&path)
        .durability(durability)
        .policy(policy.clone())
        .fsm(fsm)
        .operator_options(operator_options)
        .audit_key_opt(audit_key(cli)?)
        .build()
        .map_err(|error| match error {
            KernelError::Log(error) => log_failure(
                error,
                existed,
                format!("cannot open the log {}", shown_db(&path)),
            ),
            KernelError::Setup(_) => Failure::bad_input(error),
            other => Failure::from(other),
        })?;
    let exporter = match live {
        None => None,
        Some(_) if is_postgres(cli) => {
            tracing::warn!(
                "OTLP export follows an SQLite log's file only so far: this process's sagas on a PostgreSQL log are not exported (SPEC.md, Known gaps)"
            );
            None
        }
        Some(config) => {
            let url = config.url.clone();
            let exporter =
                agent_kernel_otel::LiveExporter::start(path.clone(), this_process()?, config)
                    .map_err(|message| {
                        Failure::internal(anyhow::anyhow!(
                            "cannot start the OTLP export: {message}"
                        ))
                    })?;
            tracing::info!(%url, "sending this process's sagas as spans over OTLP/HTTP");
            Some(exporter)
        }
    };
    {
        // Command tools' programs start from a launcher thread started before the second
        // line, each confined to what its tool declares and never to the files below.
        let mut protected: Vec<PathBuf> = if is_postgres(cli) {
            Vec::new()
        } else {
            agent_kernel_txlog::log_files(&path)
        };
        protected.extend(cli.audit_key_file.iter().cloned());
        protected.extend(
            kernel
                .approval_policy()
                .operator_key_file()
                .map(Path::to_owned),
        );
        agent_kernel_sandbox::start_launcher(&policy, protected).map_err(|error| {
            Failure::internal(anyhow::anyhow!(
                "cannot start the thread that launches programs: {error}"
            ))
        })?;
        // The second line: from here on, this thread and every thread it starts (the tools'
        // blocking work included) can reach only the allowed roots. The log's writer thread
        // started above and keeps its access to the log.
        match restrict_to_roots(&policy) {
            SecondLine::Enforced { fully } => {
                tracing::debug!(fully, "landlock confines tools to the allowed roots");
            }
            SecondLine::Unavailable { reason } => {
                tracing::warn!(%reason, "no OS second line; the capability handles alone confine file tools");
            }
            _ => {}
        }
        match restrict_network(&policy) {
            NetworkLine::Unavailable { reason } => {
                tracing::info!(%reason, "no OS second line for the network; the first line alone rules on URLs");
            }
            line => tracing::debug!(?line, "landlock confines TCP"),
        }
    }
    Ok((kernel, exporter))
}
