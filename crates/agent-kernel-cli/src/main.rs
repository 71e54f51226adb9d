//! `agent-kernel`: run tool-call plans as sagas with durable intent, rollback and recovery.
//!
//! See `agent-kernel --help`, docs/reference.md and SPEC.md for the commands, and reference-level
//! exit codes: 0 success, 1 rolled back, 2 bad input, 3 operator attention, 4 denied, 5 the
//! saga waits for an approval.

mod approvals;
mod args;
mod audit;
mod bench;
mod dlq;
mod drive;
mod export;
mod inspect;
mod operate;
mod output;
mod progress;
mod serve;
mod tool_listing;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use agent_kernel::{
    Cancellation, DEFAULT_DB, DEFAULT_SANDBOX, Kernel, KernelBuilder, KernelError, SystemClock,
    current_owner, operator,
};
use agent_kernel_api::{Durability, Plan, SagaId, SagaState, TxError};
use agent_kernel_dispatcher::Dispatcher;
use agent_kernel_fsm::Guardrail;
use agent_kernel_sandbox::{Policy, restrict_network, restrict_to_roots};
use agent_kernel_txlog::{LogOptions, SqliteLog};
use anyhow::Context as _;

use crate::args::*;
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
    /// Conflict: another saga that is not settled holds a resource the step (or the undo)
    /// would claim; nothing of it ran.
    pub(crate) const CONFLICT: u8 = 6;
}

/// How long `sandbox status --probe-connect` waits for a connection.
const PROBE_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

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
        let (code, kind) = if matches!(error, KernelError::Tampered { .. }) {
            (exit::ATTENTION, "tampered")
        } else if error.is_bad_input() {
            (exit::BAD_INPUT, "bad_input")
        } else if error.is_denied() {
            (exit::DENIED, "denied")
        } else if error.is_conflict() {
            (exit::CONFLICT, "conflict")
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
    let cli = match parse_command_line() {
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
                // Where stdin is not a pipe the runtime polls, its read blocks a thread that
                // no cancellation reaches (after SIGTERM the client may keep stdin open): do
                // not wait for it.
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
        .with_ansi(colours_on_stderr(std::env::var_os("NO_COLOR")))
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

/// Whether messages on stderr may carry colours: only on a terminal, and not when
/// `NO_COLOR` is set to anything but the empty text (no-color.org). A file or a pipe (an
/// MCP client's log, CI) gets plain text.
fn colours_on_stderr(no_color: Option<std::ffi::OsString>) -> bool {
    use std::io::IsTerminal as _;
    std::io::stderr().is_terminal() && no_color.is_none_or(|value| value.is_empty())
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
    if let Some(folder) = &cli.config
        && !folder.is_dir()
    {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "--config {}: not a folder (it names the project's folder, which holds sandbox.toml, tools.toml, fsm.toml and agent-kernel.db); nothing was done",
            folder.display()
        )));
    }
    match &cli.command {
        Command::Run(args) => drive::run(cli, out, args).await,
        Command::Resume(args) => drive::resume(cli, out, args).await,
        Command::Mcp(args) => drive::mcp(cli, out, args).await,
        Command::Undo(args) => operate::undo(cli, out, args).await,
        Command::Prune(args) => operate::prune(cli, out, args).await,
        Command::Dlq(args) => operate::dlq(cli, out, args).await,
        Command::Approvals(args) => operate::approvals(cli, out, args).await,
        Command::Approve(args) => operate::approve(cli, out, args).await,
        Command::Reject(args) => operate::reject(cli, out, args).await,
        Command::Serve(args) => serve::serve(cli, out, args).await,
        Command::Recover(args) => operate::recover(cli, out, args).await,
        Command::Rollback(args) => operate::rollback(cli, out, args).await,
        Command::Audit(args) => inspect::audit(cli, out, args).await,
        Command::Sandbox(args) => inspect::sandbox(cli, out, args).await,
        Command::Tools(args) => inspect::tools(cli, out, args).await,
        Command::Replay(args) => inspect::replay(cli, out, args).await,
        Command::Export(args) => inspect::export(cli, out, args).await,
        Command::Log(args) => inspect::log(cli, out, args).await,
        Command::Fsm(args) => inspect::fsm(cli, out, args).await,
        Command::Bench(args) => {
            // Only a log named on the command line: never one of `AGENT_KERNEL_DB`, which
            // names the log the user's sagas are in.
            let db = cli.db.as_deref().filter(|_| cli.db_on_command_line);
            args.check(db)
                .map_err(|message| Failure::bad_input(anyhow::anyhow!(message)))?;
            let key = if db.is_some() { audit_key(cli)? } else { None };
            let report = bench::run(args, db, key).await.map_err(|error| {
                if error.is::<bench::Refused>() {
                    Failure::bad_input(error)
                } else {
                    Failure::internal(error)
                }
            })?;
            out.bench(&report);
            Ok(exit::OK)
        }
    }
}

/// The command line, and whether `--db` was on it (not from `AGENT_KERNEL_DB`).
fn parse_command_line() -> Result<Cli, clap::Error> {
    use clap::{CommandFactory as _, FromArgMatches as _};
    let matches = Cli::command().try_get_matches()?;
    let mut cli = Cli::from_arg_matches(&matches)?;
    cli.db_on_command_line =
        matches.value_source("db") == Some(clap::parser::ValueSource::CommandLine);
    Ok(cli)
}

/// The lock that keeps two compensating operator commands (`undo`, `dlq retry`, `prune`)
/// on one log apart ([`operator::OperatorLock`]).
async fn operator_lock(cli: &Cli) -> Result<operator::OperatorLock, Failure> {
    Ok(operator::OperatorLock::acquire(&db_path(cli), operator::OPERATOR_LOCK_WAIT).await?)
}

/// The kernel of `resume`, `approvals`, `approve` and `reject`: the tools and the policy of
/// `run`, since a resumed saga runs its remaining steps.
pub(crate) fn open_kernel_for_approvals(cli: &Cli) -> Result<Arc<Kernel>, Failure> {
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

/// Reads and validates an FSM table file for `fsm check`, keeping the table's own error
/// (each problem with its line, which `--json` lists) where a kernel's loading keeps text.
fn read_fsm(path: &Path) -> Result<Guardrail, Failure> {
    let text = read_text_file(path, "FSM table", agent_kernel_fsm::MAX_TABLE_BYTES)?;
    Guardrail::from_toml_str(&text)
        .with_context(|| format!("FSM table {}", path.display()))
        .map_err(Failure::bad_input)
}

/// The table in force: `--fsm`, else `./fsm.toml` if it exists, else the built-in one.
fn load_fsm(cli: &Cli) -> Result<Guardrail, Failure> {
    wiring(cli).load_fsm().map_err(Failure::bad_input)
}

/// Every command's kernel, policy, table and tools come from here: the global options over
/// the working folder's defaults ([`KernelBuilder::from_folder`]), the same for `run`,
/// `mcp`, `recover` and every listing.
fn wiring(cli: &Cli) -> KernelBuilder {
    let mut builder = KernelBuilder::from_folder(config_folder(cli)).db(db_path(cli));
    // The command's runtime (built with every driver) serves the upstream connections.
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        builder = builder.upstream_runtime(runtime);
    }
    if let Some(path) = &cli.sandbox {
        builder = builder.sandbox_file(path);
    }
    if let Some(path) = &cli.fsm {
        builder = builder.fsm_file(path);
    }
    if let Some(path) = &cli.tools {
        builder = builder.tools_file(path);
    }
    builder
}

pub(crate) fn db_path(cli: &Cli) -> PathBuf {
    match (&cli.db, &cli.config) {
        (Some(db), _) => db.clone(),
        (None, Some(folder)) => folder.join(DEFAULT_DB),
        (None, None) => PathBuf::from(DEFAULT_DB),
    }
}

/// The project's folder: `--config`, else the working folder. Its `sandbox.toml`,
/// `fsm.toml`, `tools.toml` and `agent-kernel.db` are the defaults, and relative paths in
/// tool arguments are taken from it.
pub(crate) fn config_folder(cli: &Cli) -> PathBuf {
    cli.config.clone().unwrap_or_else(|| PathBuf::from("."))
}

/// Whether `--db` names a PostgreSQL database rather than an SQLite file.
pub(crate) fn is_postgres(cli: &Cli) -> bool {
    agent_kernel::is_postgres(&db_path(cli))
}

/// The log as messages name it: the path, or a database URL without its password.
fn shown_db(path: &Path) -> String {
    if !agent_kernel::is_postgres(path) {
        return path.display().to_string();
    }
    agent_kernel_txlog_postgres::describe_url(&path.to_string_lossy())
        .unwrap_or_else(|| "a PostgreSQL URL that does not parse".to_owned())
}

/// A command that works on the SQLite file itself ([`open_log`]'s: `prune --vacuum`, the
/// SQLite side of `audit seal`), refused on a PostgreSQL log.
fn sqlite_only(cli: &Cli, command: &str) -> Result<(), Failure> {
    if is_postgres(cli) {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "`{command}` works on an SQLite log only so far; {} is a PostgreSQL log (SPEC.md, Known gaps); nothing was done",
            shown_db(&db_path(cli))
        )));
    }
    Ok(())
}

/// The audit key (`--audit-key-file`, else `$AGENT_KERNEL_AUDIT_KEY`), read once per
/// process: a command that both checks and opens the log reads the key file (and warns about
/// its mode) once.
pub(crate) fn audit_key(cli: &Cli) -> Result<Option<agent_kernel_txlog::AuditKey>, Failure> {
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

/// Whether there is a log for a command that only reads it: an SQLite file, or a
/// PostgreSQL schema that holds a log (asked without opening it, which would create one).
async fn reading_log_present(cli: &Cli) -> Result<bool, Failure> {
    let path = db_path(cli);
    if !is_postgres(cli) {
        return log_present(&path);
    }
    agent_kernel::operator::postgres_holds_log(&path.to_string_lossy())
        .await
        .map_err(|error| match error {
            KernelError::Log(error) => log_failure(
                error,
                true,
                format!("cannot look for the log {}", shown_db(&path)),
            ),
            other => other.into(),
        })
}

/// The log, opened for a command that reads it (`log`, `replay`, `export`), which must be
/// there: bad input otherwise, and nothing is created ([`open_reading_log_if_present`]).
async fn open_reading_log(cli: &Cli) -> Result<Arc<dyn agent_kernel_api::TxLog>, Failure> {
    open_reading_log_if_present(cli).await?.ok_or_else(|| {
        Failure::bad_input(anyhow::anyhow!(
            "no log at {} (pass --db PATH or set AGENT_KERNEL_DB); nothing was created",
            shown_db(&db_path(cli))
        ))
    })
}

/// The log, opened for a command that reads it, or `None` when there is none
/// ([`reading_log_present`]; nothing is created): an SQLite file as [`open_log`] opens it;
/// a PostgreSQL log through the front door (as a worker, with a lease of its own while it
/// reads). The process is not confined, as it is not for an SQLite file: it reads the
/// audit chain on connections of its own afterwards, which the second line's network
/// rules would refuse. (`replay` asks the tools of the steps it checks for their specs,
/// which starts a declared upstream server, as `run` would.)
async fn open_reading_log_if_present(
    cli: &Cli,
) -> Result<Option<Arc<dyn agent_kernel_api::TxLog>>, Failure> {
    if !reading_log_present(cli).await? {
        return Ok(None);
    }
    if is_postgres(cli) {
        let opened = open_unconfined(
            cli,
            Durability::Full,
            Compensation::AndExecution,
            Vec::new(),
            false,
        )?;
        return Ok(Some(Arc::clone(opened.kernel.log())));
    }
    Ok(Some(Arc::new(open_log(cli, Durability::Full)?)))
}

/// Whether something that would be opened as the log is at `path` (through links): a
/// non-empty file, or one that cannot be inspected (which then is not taken for a new log).
fn log_exists(path: &Path) -> bool {
    if agent_kernel::is_postgres(path) {
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
    if agent_kernel::is_postgres(path) {
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
    wiring(cli).load_policy().map_err(Failure::bad_input)
}

/// Every tool the log may name (the drill tools included, as the reference lists them)
/// behind a dispatcher with the policy's sandbox and limits, without opening the log: for
/// `tools` and `replay`.
fn build_dispatcher(cli: &Cli) -> Result<Dispatcher, Failure> {
    wiring(cli).listing().map_err(Failure::bad_input)
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
    let path = db_path(cli);
    match operator::vouch_for_log(&path, audit_key(cli)?).await {
        Ok(operator::Vouched::Intact) => Ok(Vec::new()),
        Ok(operator::Vouched::PredatesChain) => {
            tracing::warn!(
                path = %path.display(),
                "the log predates the audit chain, so there is nothing to verify before acting; opening it starts the chain"
            );
            Ok(Vec::new())
        }
        // What is not a log, or a newer one, is refused as opening it would be.
        Err(error @ KernelError::Log(TxError::NotALog { .. } | TxError::SchemaTooNew { .. })) => {
            Err(Failure::bad_input(error))
        }
        Err(KernelError::Tampered { seq, reason }) => Err(Failure {
            code: exit::ATTENTION,
            kind: "tampered",
            error: anyhow::anyhow!(
                "the log {} failed its audit check {}: {}; nothing was undone, since its undo records cannot be trusted. See `agent-kernel audit verify`; to act anyway, pass --skip-verify",
                shown_db(&path),
                if seq == 0 {
                    "on its schema".to_owned()
                } else {
                    format!("at record {seq}")
                },
                reason
            ),
        }),
        Err(error) => Err(Failure::internal(anyhow::Error::new(error).context(format!(
            "cannot check the log {} before acting on it; nothing was undone (to act anyway, pass --skip-verify)",
            shown_db(&path)
        )))),
    }
}

/// Refuses to go on when the log file does not exist: reading must not create one.
pub(crate) fn require_log(cli: &Cli) -> Result<(), Failure> {
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
pub(crate) enum Compensation {
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
    let opened = open_unconfined(cli, durability, purpose, operator_options, drills)?;
    let path = db_path(cli);
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
    // The second line: from here on, this thread and every thread it starts (the tools'
    // blocking work included) can reach only the allowed roots; command tools' programs
    // start from a launcher thread started just before, each confined to what its tool
    // declares. The log's writer thread and the exporter started above keep their access.
    opened
        .confine()
        .map_err(|error| Failure::internal(anyhow::Error::new(error)))?;
    Ok((opened.kernel, exporter))
}

/// A kernel opened as [`open_kernel`] opens it, the process not yet confined: for a caller
/// that starts what must keep its access outside the roots (the console's thread for the
/// audit check) before it calls [`Opened::confine`](agent_kernel::Opened::confine) once.
pub(crate) fn open_unconfined(
    cli: &Cli,
    durability: Durability,
    purpose: Compensation,
    operator_options: Vec<String>,
    drills: bool,
) -> Result<agent_kernel::Opened, Failure> {
    let mut builder = wiring(cli)
        .durability(durability)
        .operator_options(operator_options)
        .audit_key_opt(audit_key(cli)?);
    if let Some(file) = &cli.audit_key_file {
        builder = builder.protect_file(file);
    }
    if drills {
        builder = builder.with_drill_tools();
    }
    if purpose == Compensation::Only {
        // Rollback must stay possible: every loaded table lets failures and compensations
        // finish, so a broken table file falls back to the built-in one here.
        builder = builder.for_compensation();
    }
    // Compensation too runs under the policy in force: what the log records is ruled on
    // again, so a record pointing outside today's roots undoes nothing. A policy file that
    // does not load is bad input here as for `run`: nothing is undone under a guess.
    let policy = builder.load_policy().map_err(Failure::bad_input)?;
    if purpose == Compensation::Only {
        // Without a policy every file compensation would be refused for good: more likely
        // the command runs in the wrong folder than on sagas that touched no file.
        if policy.source().is_none() {
            return Err(Failure::bad_input(anyhow::anyhow!(
                "no sandbox policy: recover and rollback rule on every path the log records with the policy in force, and without one every file step would be left uncompensated for good; pass the policy the sagas ran under with --sandbox FILE or --config DIR (or run in the folder of its ./{DEFAULT_SANDBOX}); nothing was done"
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
    builder.policy(policy).open().map_err(|error| match error {
        KernelError::Log(error) => log_failure(
            error,
            existed,
            format!("cannot open the log {}", shown_db(&path)),
        ),
        KernelError::Setup(_) => Failure::bad_input(error),
        other => Failure::from(other),
    })
}
