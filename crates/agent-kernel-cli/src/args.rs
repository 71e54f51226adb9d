//! The command line's arguments (clap): the global options and every command's.

use std::path::PathBuf;

use agent_kernel_api::Durability;
use clap::{Parser, Subcommand};

use crate::bench;

/// Largest `--limit` of `log`.
pub(crate) const MAX_LOG_LIMIT: u32 = 10_000;

#[derive(Debug, Parser)]
#[command(
    name = "agent-kernel",
    version,
    about = "Saga transactions, crash recovery and a sandbox for AI agent tool calls"
)]
pub(crate) struct Cli {
    /// The log database [default: $AGENT_KERNEL_DB, else agent-kernel.db of --config]
    // The variable's value is never shown: a PostgreSQL URL in it may hold a password.
    #[arg(
        long,
        global = true,
        env = "AGENT_KERNEL_DB",
        hide_env_values = true,
        value_name = "PATH"
    )]
    pub(crate) db: Option<PathBuf>,
    /// Whether `--db` was given on the command line rather than by `AGENT_KERNEL_DB`.
    #[arg(skip)]
    pub(crate) db_on_command_line: bool,
    /// The audit key file, hex digits [default: $AGENT_KERNEL_AUDIT_KEY, else no key]
    #[arg(long, global = true, value_name = "PATH")]
    pub(crate) audit_key_file: Option<PathBuf>,
    /// The project's folder: its sandbox.toml, fsm.toml, tools.toml and agent-kernel.db are
    /// the defaults, and relative paths in tool arguments are taken from it [default: .]
    #[arg(long, global = true, value_name = "DIR")]
    pub(crate) config: Option<PathBuf>,
    /// The sandbox policy [default: sandbox.toml of --config if it exists, else deny all]
    #[arg(long, global = true, value_name = "PATH")]
    pub(crate) sandbox: Option<PathBuf>,
    /// The FSM transition table [default: fsm.toml beside --sandbox, else of --config, if it
    /// exists; else the built-in table]
    #[arg(long, global = true, value_name = "PATH")]
    pub(crate) fsm: Option<PathBuf>,
    /// Tools of your own, programs in any language [default: tools.toml beside --sandbox,
    /// else of --config, if it exists]
    #[arg(long, global = true, value_name = "PATH")]
    pub(crate) tools: Option<PathBuf>,
    /// Print exactly one JSON document on stdout instead of human-readable output
    #[arg(long, global = true)]
    pub(crate) json: bool,
    /// More log detail on stderr (-v info, -vv debug, -vvv trace); RUST_LOG overrides
    #[arg(short, long, global = true, action = clap::ArgAction::Count, conflicts_with = "quiet")]
    pub(crate) verbose: u8,
    /// Only errors on stderr
    #[arg(short, long, global = true)]
    pub(crate) quiet: bool,
    /// How logs on stderr are written
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Check every step of a plan, then run it as a saga
    Run(RunArgs),
    /// Continue a saga that waits for an approval, in this process, once it is decided
    Resume(ResumeArgs),
    /// List the approval requests waiting for a decision, each with its whole arguments
    Approvals(ApprovalsArgs),
    /// Approve a pending request: its step runs once, with exactly the arguments shown
    Approve(ApproveArgs),
    /// Serve the operator console: a web page (and JSON API) for approvals and sagas
    Serve(ServeArgs),
    /// Reject a pending request: its step never runs, and the saga rolls back
    Reject(RejectArgs),
    /// Roll back every saga left unfinished by a process that is no longer running
    Recover(RecoverArgs),
    /// Compensate a saga's committed steps in reverse order
    Rollback(RollbackArgs),
    /// Undo a Done saga: compensate its steps last first, within their undo windows
    Undo(UndoArgs),
    /// Remove settled sagas older than a horizon from the log; never an open one, one waiting
    /// for an approval, one whose compensation failed, or one inside its undo window
    Prune(PruneArgs),
    /// Check a saga's recorded history again, executing nothing: every state change against
    /// the FSM table (the one in force, or --fsm), every step's tool version and argument
    /// hash; exit 1 naming the first divergence
    Replay(ReplayArgs),
    /// Write sagas as OpenTelemetry traces (OTLP/JSON): a root span per saga, a span per
    /// step (`execute_tool TOOL`) and per compensation, times from the log
    Export(ExportArgs),
    /// Show one saga with its steps, or list recent sagas
    Log(LogArgs),
    /// Measure the kernel's per-step cost in a temporary log
    Bench(bench::BenchArgs),
    /// Serve the Model Context Protocol on stdio: an agent's tool calls as sagas
    Mcp(McpArgs),
    /// See, retry or settle the compensations that failed (dead letters)
    Dlq(DlqArgs),
    /// List the tools with their classes and the limits in force
    Tools(ToolsArgs),
    /// Check the tamper-evident audit log
    Audit(AuditArgs),
    /// Which lines of the sandbox are active
    Sandbox(SandboxArgs),
    /// Show the FSM transition table in use, or check a custom one
    Fsm(FsmArgs),
}

/// The arguments of `run`.
#[derive(Debug, clap::Args)]
pub(crate) struct RunArgs {
    /// The plan file (JSON)
    #[arg(long, value_name = "FILE")]
    pub(crate) plan: PathBuf,
    /// `full` survives power loss; `normal` survives process crashes only
    #[arg(long, default_value = "full", value_parser = parse_durability)]
    pub(crate) durability: Durability,
    /// Check and simulate the plan: nothing is executed; the log records it as a dry run
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Stop at a step that needs an operator's approval (exit 5) instead of waiting;
    /// `resume --saga ID` continues the plan once it is decided
    #[arg(long, conflicts_with = "dry_run")]
    pub(crate) no_wait: bool,
}

/// The arguments of `resume`.
#[derive(Debug, clap::Args)]
pub(crate) struct ResumeArgs {
    /// The saga id
    #[arg(long, value_name = "ID")]
    pub(crate) saga: String,
    /// Exit 5 at once if the request is still pending instead of waiting for it
    #[arg(long)]
    pub(crate) no_wait: bool,
}

/// The arguments of `approvals`.
#[derive(Debug, clap::Args)]
pub(crate) struct ApprovalsArgs {
    /// Show one request in full (any status): its arguments, digest, decision and the
    /// plan's steps that run after it
    #[arg(long, value_name = "ID")]
    pub(crate) show: Option<String>,
}

/// The arguments of `serve`.
#[derive(Debug, clap::Args)]
pub(crate) struct ServeArgs {
    /// Where to listen; port 0 picks a free port
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7700")]
    pub(crate) listen: String,
    /// The console's token [default: a new one, written 0600 to DB.console-token]
    #[arg(long, value_name = "PATH")]
    pub(crate) token_file: Option<PathBuf>,
    /// Who decides, as decisions record it [default: the user running the console]
    #[arg(long, value_name = "NAME")]
    pub(crate) operator: Option<String>,
    /// The operator key, for decisions on requests whose policy names one
    #[arg(long, value_name = "FILE")]
    pub(crate) operator_key_file: Option<PathBuf>,
    /// A TLS certificate chain (PEM): the console answers over https; needed beyond loopback
    #[arg(long, value_name = "PATH")]
    pub(crate) tls_cert: Option<PathBuf>,
    /// The TLS certificate's key (PEM)
    #[arg(long, value_name = "PATH")]
    pub(crate) tls_key: Option<PathBuf>,
}

/// The arguments of `approve`.
#[derive(Debug, clap::Args)]
pub(crate) struct ApproveArgs {
    /// The request id (`agent-kernel approvals`)
    pub(crate) id: String,
    /// A note recorded with the decision in the audit chain
    #[arg(long, value_name = "TEXT")]
    pub(crate) note: Option<String>,
    /// The operator key, when the request was asked under a policy that names one
    #[arg(long, value_name = "FILE")]
    pub(crate) operator_key_file: Option<PathBuf>,
}

/// The arguments of `reject`.
#[derive(Debug, clap::Args)]
pub(crate) struct RejectArgs {
    /// The request id (`agent-kernel approvals`)
    pub(crate) id: String,
    /// Why, recorded with the decision in the audit chain
    #[arg(long, value_name = "TEXT")]
    pub(crate) reason: String,
    /// The operator key, when the request was asked under a policy that names one
    #[arg(long, value_name = "FILE")]
    pub(crate) operator_key_file: Option<PathBuf>,
}

/// The arguments of `tools`.
#[derive(Debug, clap::Args)]
pub(crate) struct ToolsArgs {
    /// Start the upstream MCP servers of the tools file and list their tools too (else
    /// they are named, not started)
    #[arg(long)]
    pub(crate) upstream: bool,
}

/// The arguments of `recover`.
#[derive(Debug, clap::Args)]
pub(crate) struct RecoverArgs {
    /// Act even if `audit verify` finds the log tampered with (recorded in the audit chain)
    #[arg(long)]
    pub(crate) skip_verify: bool,
    /// Keep going: a worker that rolls back, every 250 ms, the sagas of every owner found
    /// dead (on PostgreSQL, whose lease ran out), until SIGINT or SIGTERM
    #[arg(long)]
    pub(crate) watch: bool,
    /// On PostgreSQL: wait until every lease that keeps a saga from recovery has run
    /// out (at most one hour), then recover those sagas too
    #[arg(long, conflicts_with = "watch")]
    pub(crate) wait: bool,
}

/// The arguments of `rollback`.
#[derive(Debug, clap::Args)]
pub(crate) struct RollbackArgs {
    /// The saga id
    #[arg(long, value_name = "ID")]
    pub(crate) saga: String,
    /// Act even if `audit verify` finds the log tampered with (recorded in the audit chain)
    #[arg(long)]
    pub(crate) skip_verify: bool,
}

/// The arguments of `undo`.
#[derive(Debug, clap::Args)]
pub(crate) struct UndoArgs {
    /// The saga id
    #[arg(long, value_name = "ID")]
    pub(crate) saga: String,
    /// Why, recorded in the audit chain
    #[arg(long, value_name = "TEXT", required_unless_present = "preview")]
    pub(crate) reason: Option<String>,
    /// Undo a step even when another writer changed what it left since
    #[arg(long)]
    pub(crate) force: bool,
    /// Show what an undo would do to each step (can it be undone, when its window
    /// closes, what changed since), and undo nothing
    #[arg(long)]
    pub(crate) preview: bool,
    /// Act even if `audit verify` finds the log tampered with (recorded in the audit chain)
    #[arg(long)]
    pub(crate) skip_verify: bool,
}

/// The arguments of `prune`.
#[derive(Debug, clap::Args)]
pub(crate) struct PruneArgs {
    /// The horizon: sagas that finished longer ago than this (`90s`, `15m`, `24h`, `30d`)
    #[arg(long, value_name = "DURATION", value_parser = parse_horizon)]
    pub(crate) before: u64,
    /// Then rebuild the file so the freed space goes back to the file system (VACUUM)
    #[arg(long)]
    pub(crate) vacuum: bool,
    /// Act even if `audit verify` finds the log tampered with (recorded in the audit chain)
    #[arg(long)]
    pub(crate) skip_verify: bool,
}

/// The arguments of `replay`.
#[derive(Debug, clap::Args)]
pub(crate) struct ReplayArgs {
    /// The saga id
    #[arg(long, value_name = "ID")]
    pub(crate) saga: String,
}

/// The arguments of `export`.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["saga", "all"])))]
pub(crate) struct ExportArgs {
    /// OTLP/JSON, the JSON form of an `ExportTraceServiceRequest` (the only format)
    #[arg(long, required = true)]
    pub(crate) otel: bool,
    /// Export this saga
    #[arg(long, value_name = "ID")]
    pub(crate) saga: Option<String>,
    /// Export every saga in the log (the newest `EXPORT_SAGAS_MAX`, 10,000)
    #[arg(long)]
    pub(crate) all: bool,
    /// Write the document to FILE (replaced whole) instead of standard output
    #[arg(long, value_name = "FILE")]
    pub(crate) out: Option<PathBuf>,
}

/// The arguments of `log`.
#[derive(Debug, clap::Args)]
pub(crate) struct LogArgs {
    /// Show this saga and every step with its status
    #[arg(long, value_name = "ID")]
    pub(crate) saga: Option<String>,
    /// How many sagas to list, most recent first
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_LOG_LIMIT)))]
    pub(crate) limit: u32,
}

/// The arguments of `mcp`.
#[derive(Debug, clap::Args)]
pub(crate) struct McpArgs {
    /// The actor recorded with this connection's sagas (one saga at a time)
    #[arg(long, value_name = "NAME")]
    pub(crate) actor: Option<String>,
    /// Also offer the drill tools (fault.*), which fail on purpose
    #[arg(long)]
    pub(crate) drills: bool,
    /// Recover first: roll back the unsettled sagas of processes that are gone (the log
    /// verified first), so the locks they hold are released before the first call
    #[arg(long)]
    pub(crate) recover: bool,
    /// `full` survives power loss; `normal` survives process crashes only
    #[arg(long, default_value = "full", value_parser = parse_durability)]
    pub(crate) durability: Durability,
}

/// The arguments of `dlq`.
#[derive(Debug, clap::Args)]
pub(crate) struct DlqArgs {
    #[command(subcommand)]
    pub(crate) action: DlqAction,
}

/// The arguments of `audit`.
#[derive(Debug, clap::Args)]
pub(crate) struct AuditArgs {
    #[command(subcommand)]
    pub(crate) action: AuditAction,
}

/// The arguments of `sandbox`.
#[derive(Debug, clap::Args)]
pub(crate) struct SandboxArgs {
    #[command(subcommand)]
    pub(crate) action: SandboxAction,
}

/// The arguments of `fsm`.
#[derive(Debug, clap::Args)]
pub(crate) struct FsmArgs {
    /// Show the table (the default when no subcommand is given)
    #[arg(long)]
    pub(crate) show: bool,
    /// How to show it
    #[arg(long, value_enum, default_value_t = FsmFormat::Table)]
    pub(crate) format: FsmFormat,
    #[command(subcommand)]
    pub(crate) action: Option<FsmAction>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum AuditAction {
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
pub(crate) enum DlqAction {
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
pub(crate) enum SandboxAction {
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
pub(crate) enum FsmAction {
    /// Validate a custom table: exit 0, or 2 with every problem and its line
    Check {
        /// The table to check (TOML)
        file: PathBuf,
    },
}

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable lines
    Text,
    /// One JSON object per line, with the saga and step spans
    Json,
}

/// Renderings of the FSM table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum FsmFormat {
    /// Aligned columns
    Table,
    /// A Mermaid state diagram
    Mermaid,
    /// A Graphviz digraph
    Dot,
    /// `fsm.toml`, loadable with --fsm
    Toml,
}

pub(crate) fn parse_durability(text: &str) -> Result<Durability, String> {
    text.parse()
}

/// Most `prune --before` accepts: a hundred years.
pub(crate) const PRUNE_HORIZON_MAX_MS: u64 = 100 * 366 * 86_400_000;

/// `prune --before`: a duration of `agent_kernel_api::parse_duration_ms`, zero to
/// [`PRUNE_HORIZON_MAX_MS`].
pub(crate) fn parse_horizon(text: &str) -> Result<u64, String> {
    let ms = agent_kernel_api::parse_duration_ms(text)
        .ok_or_else(|| agent_kernel_api::not_a_duration(text))?;
    if ms > PRUNE_HORIZON_MAX_MS {
        return Err(format!("`{text}` is more than a hundred years"));
    }
    Ok(ms)
}
