//! The front door: a [`KernelBuilder`] with the command line's defaults, so that a program
//! gets a kernel (the SQLite log, the policy, the FSM table, the built-in tools and its own)
//! in a few lines. The engine itself sees only the traits; this module alone names the
//! SQLite log, the sandbox and the built-in tools.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agent_kernel_api::{
    Clock, Durability, DynTool, IdSource, ToolSource, TransactionalTool, TxLog,
};
use agent_kernel_dispatcher::{Dispatcher, Limits, SeededJitter};
use agent_kernel_fsm::Guardrail;
use agent_kernel_sandbox::{FsSandbox, HttpSandbox, Policy};
use agent_kernel_txlog::{AuditKey, LogOptions, SqliteLog};
use agent_kernel_txlog_postgres::{PostgresLog, Worker, is_postgres_url};

use crate::approval::ApprovalPolicy;
use crate::{
    Environment, Kernel, KernelError, ProcessProbe, SystemClock, UuidV7Ids, current_owner,
};

/// The log a builder opens unless told otherwise (after `$AGENT_KERNEL_DB`).
pub const DEFAULT_DB: &str = "agent-kernel.db";
/// The policy file a builder loads when it exists in the working directory.
pub const DEFAULT_SANDBOX: &str = "sandbox.toml";
/// The FSM table file a builder loads when it exists in the working directory.
pub const DEFAULT_FSM: &str = "fsm.toml";
/// The environment variable naming the log, as for the command line.
pub const DB_ENV: &str = "AGENT_KERNEL_DB";

/// The environment variable that sets the lease of a process on a PostgreSQL log, in ms
/// (default [`agent_kernel_txlog_postgres::LEASE_DEFAULT`]): how long after it stops its
/// unfinished sagas wait before another process may recover them.
pub const LEASE_ENV: &str = "AGENT_KERNEL_LEASE_MS";
/// The tools file a builder loads when it exists in the working directory (reference §7).
pub const DEFAULT_TOOLS: &str = "tools.toml";

/// Where the command tools come from.
#[derive(Debug)]
enum ToolsFileSource {
    /// `./tools.toml` if it exists, else none.
    Default,
    File(PathBuf),
    Skip,
}

/// Where the policy comes from.
#[derive(Debug)]
enum PolicySource {
    /// `./sandbox.toml` if it exists, else deny-all.
    Default,
    File(PathBuf),
    Given(Box<Policy>),
}

/// Where the FSM table comes from.
#[derive(Debug)]
enum FsmSource {
    /// `./fsm.toml` if it exists, else the built-in table.
    Default,
    File(PathBuf),
    Given(Box<Guardrail>),
}

/// Builds a [`Kernel`] with the command line's defaults, each of which can be changed:
///
/// | part | default |
/// | --- | --- |
/// | log | `$AGENT_KERNEL_DB`, else `./agent-kernel.db` (SQLite, created if absent) |
/// | durability | [`Durability::Full`] |
/// | policy | `./sandbox.toml` if it exists, else deny-all |
/// | FSM table | `./fsm.toml` if it exists, else the built-in table |
/// | tools | the built-in tools without the drill tools (`fault.*`), the command tools of `./tools.toml` if it exists, plus the ones added |
/// | limits | the policy's `[limits]`, else the defaults |
/// | clock, ids, owner | the system clock, UUID v7 ids, this process |
///
/// ```
/// use agent_kernel_core::KernelBuilder;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = tempfile::tempdir()?;
/// let kernel = KernelBuilder::new()
///     .db(dir.path().join("agent-kernel.db"))
///     .policy_toml("[fs]\nallow = [\".\"]\n", dir.path())?
///     .build()?;
/// assert!(kernel.tool("fs.write").is_some());
/// assert!(kernel.tool("fault.fail").is_none(), "no drill tools unless asked");
/// # Ok(()) }
/// ```
#[must_use]
pub struct KernelBuilder {
    db: Option<PathBuf>,
    durability: Durability,
    policy: PolicySource,
    fsm: FsmSource,
    audit_key: Option<AuditKey>,
    lease: Option<Duration>,
    limits: Option<Limits>,
    standard_tools: bool,
    drill_tools: bool,
    /// The tools added, each with the timeout it declares, if any.
    tools: Vec<(Arc<dyn DynTool>, Option<u64>)>,
    tools_file: ToolsFileSource,
    cwd: Option<PathBuf>,
    clock: Option<Arc<dyn Clock>>,
    ids: Option<Arc<dyn IdSource>>,
    operator_options: Vec<String>,
    log_layer: Option<LogLayer>,
}

/// A function that puts a [`TxLog`] of the caller's around the SQLite log
/// ([`KernelBuilder::wrap_log`]).
type LogLayer = Box<dyn FnOnce(Arc<dyn TxLog>) -> Arc<dyn TxLog> + Send>;

impl std::fmt::Debug for KernelBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelBuilder")
            .field("db", &self.db)
            .field("durability", &self.durability)
            .field("policy", &self.policy)
            .field("fsm", &self.fsm)
            .field("audit_key", &self.audit_key.is_some())
            .field("limits", &self.limits)
            .field("standard_tools", &self.standard_tools)
            .field("drill_tools", &self.drill_tools)
            .field("n_tools", &self.tools.len())
            .field("cwd", &self.cwd)
            .field("log_layer", &self.log_layer.is_some())
            .finish_non_exhaustive()
    }
}

impl Default for KernelBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl KernelBuilder {
    /// A builder with every default.
    pub fn new() -> Self {
        KernelBuilder {
            db: None,
            durability: Durability::Full,
            policy: PolicySource::Default,
            fsm: FsmSource::Default,
            audit_key: None,
            lease: None,
            limits: None,
            standard_tools: true,
            drill_tools: false,
            tools: Vec::new(),
            tools_file: ToolsFileSource::Default,
            cwd: None,
            clock: None,
            ids: None,
            operator_options: Vec::new(),
            log_layer: None,
        }
    }

    /// The options the operator command at hand was given (e.g. `--skip-verify`), recorded
    /// with it in the audit chain ([`Kernel::with_operator_options`]).
    pub fn operator_options(mut self, options: Vec<String>) -> Self {
        self.operator_options = options;
        self
    }

    /// The log's file, or a PostgreSQL database's URL (`postgres://…`, `postgresql://…`).
    pub fn db(mut self, path: impl Into<PathBuf>) -> Self {
        self.db = Some(path.into());
        self
    }

    /// This process's lease on a PostgreSQL log ([`LEASE_ENV`] otherwise, else the
    /// default); a SQLite log keeps no leases.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// The durability of the log and of the file tools.
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// The policy file to load.
    pub fn sandbox_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.policy = PolicySource::File(path.into());
        self
    }

    /// A policy already loaded.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = PolicySource::Given(Box::new(policy));
        self
    }

    /// A policy from TOML text, its relative roots resolved against `base`.
    ///
    /// # Errors
    ///
    /// [`KernelError::Setup`] when the text is not a valid policy.
    pub fn policy_toml(self, text: &str, base: &Path) -> Result<Self, KernelError> {
        let policy = Policy::from_toml_str(text, base)
            .map_err(|error| KernelError::Setup(format!("sandbox policy: {error}")))?;
        Ok(self.policy(policy))
    }

    /// The FSM table file to load.
    pub fn fsm_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.fsm = FsmSource::File(path.into());
        self
    }

    /// An FSM table already loaded.
    pub fn fsm(mut self, table: Guardrail) -> Self {
        self.fsm = FsmSource::Given(Box::new(table));
        self
    }

    /// The audit key: every record the log writes carries a MAC under it.
    pub fn audit_key(mut self, key: AuditKey) -> Self {
        self.audit_key = Some(key);
        self
    }

    /// The audit key, when there is one ([`audit_key`](Self::audit_key) otherwise).
    pub fn audit_key_opt(mut self, key: Option<AuditKey>) -> Self {
        self.audit_key = key;
        self
    }

    /// The dispatcher's bounds, instead of the policy's `[limits]`.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = Some(limits);
        self
    }

    /// Adds a tool of the program's own.
    pub fn tool<T: TransactionalTool + 'static>(mut self, tool: T) -> Self {
        self.tools.push((Arc::new(tool), None));
        self
    }

    /// Adds a tool already shared.
    pub fn tool_arc(mut self, tool: Arc<dyn DynTool>) -> Self {
        self.tools.push((tool, None));
        self
    }

    /// Adds a tool with the timeout it declares (as a command tool's `timeout_ms`): its
    /// timeout in `[limits]` unless `[limits.tools."<id>"]` sets one.
    pub fn tool_with_timeout<T: TransactionalTool + 'static>(
        mut self,
        tool: T,
        timeout_ms: Option<u64>,
    ) -> Self {
        self.tools.push((Arc::new(tool), timeout_ms));
        self
    }

    /// The tools file whose command tools to register (reference §7), instead of
    /// `./tools.toml` when it exists.
    pub fn tools_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.tools_file = ToolsFileSource::File(path.into());
        self
    }

    /// Loads no tools file, not even `./tools.toml`.
    pub fn without_tools_file(mut self) -> Self {
        self.tools_file = ToolsFileSource::Skip;
        self
    }

    /// The tools file this builder loads, if any.
    pub fn tools_file_path(&self) -> Option<PathBuf> {
        match &self.tools_file {
            ToolsFileSource::File(path) => Some(path.clone()),
            ToolsFileSource::Default if Path::new(DEFAULT_TOOLS).is_file() => {
                Some(PathBuf::from(DEFAULT_TOOLS))
            }
            ToolsFileSource::Default | ToolsFileSource::Skip => None,
        }
    }

    /// Leaves out the built-in tools: only the tools added are registered.
    pub fn without_builtin_tools(mut self) -> Self {
        self.standard_tools = false;
        self
    }

    /// Adds the drill tools (`fault.fail`, `fault.panic`, `fault.probed_write`,
    /// `fault.opaque_write`), which fail on purpose; for demos and tests.
    pub fn with_drill_tools(mut self) -> Self {
        self.drill_tools = true;
        self
    }

    /// The folder relative paths in tool arguments resolve against (default: the working
    /// directory).
    pub fn cwd(mut self, cwd: impl Into<PathBuf>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }

    /// The clock that stamps the log (default: the system clock).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Where saga ids come from (default: UUID v7).
    pub fn ids(mut self, ids: Arc<dyn IdSource>) -> Self {
        self.ids = Some(ids);
        self
    }

    /// Puts a log of the caller's around the SQLite log the builder opens: `layer` gets that
    /// log and returns the one the kernel writes to, which must keep [`TxLog`]'s contract
    /// (it may count, time or stop writes, and must pass every batch on whole). For
    /// measurements and drills; the evals use it to kill their own process at a chosen log
    /// boundary.
    pub fn wrap_log(
        mut self,
        layer: impl FnOnce(Arc<dyn TxLog>) -> Arc<dyn TxLog> + Send + 'static,
    ) -> Self {
        self.log_layer = Some(Box::new(layer));
        self
    }

    /// The log file this builder opens.
    pub fn db_path(&self) -> PathBuf {
        self.db.clone().unwrap_or_else(|| {
            std::env::var_os(DB_ENV).map_or_else(|| PathBuf::from(DEFAULT_DB), PathBuf::from)
        })
    }

    /// Loads the policy and the table, registers the tools, opens the log (creating it if
    /// absent) and returns the kernel, shared so that live sagas can be begun.
    ///
    /// It blocks while the log is opened: call it before starting an async runtime, or
    /// from a blocking task.
    ///
    /// # Errors
    ///
    /// [`KernelError::Setup`] for a policy, table, limits or tool set that cannot be used
    /// (naming the file and the problem); [`KernelError::Log`] when the log cannot be
    /// opened or created.
    pub fn build(self) -> Result<Arc<Kernel>, KernelError> {
        let setup = |what: String| KernelError::Setup(what);
        let db = self.db_path();
        let tools_file = self.tools_file_path();
        let policy = match self.policy {
            PolicySource::Given(policy) => *policy,
            PolicySource::File(path) => Policy::load(&path)
                .map_err(|error| setup(format!("sandbox policy {}: {error}", path.display())))?,
            PolicySource::Default if Path::new(DEFAULT_SANDBOX).is_file() => {
                Policy::load(Path::new(DEFAULT_SANDBOX)).map_err(|error| {
                    setup(format!("sandbox policy ./{DEFAULT_SANDBOX}: {error}"))
                })?
            }
            PolicySource::Default => Policy::deny_all(),
        };
        let fsm = match self.fsm {
            FsmSource::Given(table) => *table,
            FsmSource::File(path) => read_table(&path)?,
            FsmSource::Default if Path::new(DEFAULT_FSM).is_file() => {
                read_table(Path::new(DEFAULT_FSM))?
            }
            FsmSource::Default => Guardrail::builtin(),
        };
        let mut limits = match self.limits {
            Some(limits) => limits,
            None => limits_from_policy(&policy)?,
        };
        let cwd = match self.cwd {
            Some(cwd) => cwd,
            None => std::env::current_dir()
                .map_err(|error| setup(format!("cannot read the working directory: {error}")))?,
        };
        let mut tools = ToolSet::default();
        if self.standard_tools || self.drill_tools {
            let fs = Arc::new(FsSandbox::new(&policy).map_err(|error| {
                setup(format!("cannot open the sandbox's allowed roots: {error}"))
            })?);
            if self.standard_tools {
                tools.required.extend(agent_kernel_tools::standard_tools(
                    Arc::clone(&fs),
                    Arc::new(HttpSandbox::new(&policy)),
                    cwd.clone(),
                ));
            }
            if self.drill_tools {
                tools
                    .required
                    .extend(agent_kernel_tools::drill_tools(fs, cwd));
            }
        }
        if let Some(path) = tools_file {
            tools.extend(declared_tools(&path, &policy, &mut limits)?);
        }
        tools.required.extend(
            self.tools
                .into_iter()
                .map(|(tool, timeout_ms)| declared_timeout(&mut limits, tool, timeout_ms)),
        );
        let dispatcher = dispatcher_with(limits, tools, &policy)?;
        let approvals = approval_policy_from(&policy)?;
        let clock = self.clock.unwrap_or_else(|| Arc::new(SystemClock));
        let owner = current_owner().map_err(|error| {
            KernelError::Setup(format!("cannot identify this process in /proc: {error}"))
        })?;
        let options = LogOptions {
            durability: self.durability,
            clock: Arc::clone(&clock),
        };
        let log: Arc<dyn TxLog> = match db.to_str().filter(|text| is_postgres_url(text)) {
            Some(url) => {
                let lease = match self.lease {
                    Some(lease) => lease,
                    None => lease_from_env()?,
                };
                let worker = Worker {
                    owner: owner.clone(),
                    lease,
                    head_file: agent_kernel_txlog_postgres::default_head_file(url),
                };
                Arc::new(PostgresLog::open(url, options, self.audit_key, worker)?)
            }
            None => Arc::new(SqliteLog::open_with_audit_key(
                &db,
                options,
                self.audit_key,
            )?),
        };
        let log = match self.log_layer {
            Some(layer) => layer(log),
            None => log,
        };
        let env = Environment {
            clock,
            ids: self.ids.unwrap_or_else(|| Arc::new(UuidV7Ids)),
            liveness: Arc::new(ProcessProbe::new(owner.clone())),
            owner,
        };
        Ok(Arc::new(
            Kernel::new(
                log,
                Arc::new(dispatcher),
                Arc::new(fsm),
                env,
                self.durability,
            )
            .with_operator_options(self.operator_options)
            .with_approval_policy(approvals),
        ))
    }
}

/// Which steps wait for an operator's approval, from a policy's `[approval]` section (a
/// relative `operator_key_file` taken from the policy file's folder, and read, so that each
/// request records the key's check value), else only the steps of irreversible tools,
/// expiring after the default timeout.
///
/// # Errors
///
/// [`KernelError::Setup`] naming the policy and the problem.
pub fn approval_policy_from(policy: &Policy) -> Result<ApprovalPolicy, KernelError> {
    let Some(table) = policy.approval_table() else {
        return Ok(ApprovalPolicy::default());
    };
    let base_dir = policy
        .source()
        .and_then(Path::parent)
        .filter(|dir| !dir.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let approvals = ApprovalPolicy::from_table(table.clone(), base_dir).map_err(|message| {
        KernelError::Setup(format!("sandbox policy {}: {message}", policy.origin()))
    })?;
    let Some(path) = approvals.operator_key_file().map(Path::to_path_buf) else {
        return Ok(approvals);
    };
    // Read now, so each request records the key's check value.
    let key = read_operator_key(&path).map_err(|message| {
        KernelError::Setup(format!(
            "sandbox policy {}: [approval] operator_key_file: {message}",
            policy.origin()
        ))
    })?;
    Ok(approvals.with_operator_key(&key))
}

/// The tools a kernel is built with.
#[derive(Default)]
pub struct ToolSet {
    /// Tools that must all be registered: two of one id, or an invalid schema, is an error.
    pub required: Vec<Arc<dyn DynTool>>,
    /// Sources of tools asked only when one of their tools is first needed (upstream MCP
    /// servers): a tool of theirs that cannot be registered (its id is taken, its input
    /// schema is not a valid JSON Schema) is left out with a warning, and a source that
    /// cannot be used makes only its own tools unavailable, so that a server never keeps
    /// the kernel, and so recovery, from being built or from settling other sagas.
    pub sources: Vec<Arc<dyn ToolSource>>,
}

impl std::fmt::Debug for ToolSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let required: Vec<&str> = self.required.iter().map(|tool| tool.id()).collect();
        let sources: Vec<&str> = self.sources.iter().map(|source| source.name()).collect();
        f.debug_struct("ToolSet")
            .field("required", &required)
            .field("sources", &sources)
            .finish()
    }
}

impl ToolSet {
    /// Adds `other`'s tools and sources to these.
    pub fn extend(&mut self, other: ToolSet) {
        self.required.extend(other.required);
        self.sources.extend(other.sources);
    }
}

/// The tools the tools file at `path` declares: its command tools, required, then its
/// upstream MCP servers (`[mcp_servers.NAME]`) as sources, none of them started here (a
/// server starts when a step, a compensation or a listing first needs one of its tools).
/// The file is read once, so both come from the same version of it. Outputs are bounded by
/// `policy`'s `max_io_bytes` (or the default); a command tool's declared `timeout_ms`
/// becomes its timeout in `limits`, unless `[limits.tools."<id>"]` sets one.
///
/// # Errors
///
/// [`KernelError::Setup`] naming the file and the line: a file that cannot be read or
/// parsed, or a command tool that is invalid.
pub fn declared_tools(
    path: &Path,
    policy: &Policy,
    limits: &mut Limits,
) -> Result<ToolSet, KernelError> {
    let setup = |error: &dyn std::fmt::Display| KernelError::Setup(error.to_string());
    let text = agent_kernel_tools::read_tools_file(path).map_err(|error| setup(&error))?;
    let output_bytes_max = output_bytes_max(policy);
    let commands = agent_kernel_tools::parse_tools_file(
        path,
        &text,
        output_bytes_max,
        &agent_kernel_tools::BUILTIN_TOOL_IDS,
    )
    .map_err(|error| setup(&error))?;
    let sources = agent_kernel_upstream::upstream_sources_of(path, &text, output_bytes_max)
        .map_err(|error| setup(&error))?;
    let mut tools = ToolSet::default();
    for tool in commands {
        let timeout_ms = tool.timeout_ms();
        tools
            .required
            .push(declared_timeout(limits, Arc::new(tool), timeout_ms));
    }
    tools.sources = sources
        .into_iter()
        .map(|source| Arc::new(source) as Arc<dyn ToolSource>)
        .collect();
    Ok(tools)
}

/// The bound on a declared tool's output: the policy's `max_io_bytes`, or the default.
fn output_bytes_max(policy: &Policy) -> u64 {
    policy.fs().map_or(
        agent_kernel_sandbox::DEFAULT_MAX_IO_BYTES,
        agent_kernel_sandbox::FsPolicy::max_io_bytes,
    )
}

/// `tool`, with its declared `timeout_ms` made its timeout in `limits` unless
/// `[limits.tools."<id>"]` sets one.
fn declared_timeout(
    limits: &mut Limits,
    tool: Arc<dyn DynTool>,
    timeout_ms: Option<u64>,
) -> Arc<dyn DynTool> {
    if let Some(timeout_ms) = timeout_ms {
        limits
            .tools
            .entry(tool.id().to_owned())
            .or_default()
            .timeout_ms
            .get_or_insert(timeout_ms);
    }
    tool
}

/// Reads and validates an FSM table file.
fn read_table(path: &Path) -> Result<Guardrail, KernelError> {
    let text = std::fs::read_to_string(path).map_err(|error| {
        KernelError::Setup(format!(
            "cannot read the FSM table {}: {error}",
            path.display()
        ))
    })?;
    Guardrail::from_toml_str(&text)
        .map_err(|error| KernelError::Setup(format!("FSM table {}: {error}", path.display())))
}

/// The dispatcher's bounds from a policy's `[limits]` section, else the defaults, checked.
///
/// # Errors
///
/// [`KernelError::Setup`] naming the policy and the key out of range or unknown.
pub fn limits_from_policy(policy: &Policy) -> Result<Limits, KernelError> {
    let Some(table) = policy.limits_table() else {
        return Ok(Limits::default());
    };
    let limits: Limits = toml::Value::Table(table.clone())
        .try_into()
        .map_err(|error| {
            KernelError::Setup(format!(
                "sandbox policy {}: [limits]: {error}",
                policy.origin()
            ))
        })?;
    limits.validate().map_err(|message| {
        KernelError::Setup(format!(
            "sandbox policy {}: [limits]: {message}",
            policy.origin()
        ))
    })?;
    Ok(limits)
}

/// The lease [`LEASE_ENV`] sets, or the default.
fn lease_from_env() -> Result<Duration, KernelError> {
    let Some(text) = std::env::var_os(LEASE_ENV) else {
        return Ok(agent_kernel_txlog_postgres::LEASE_DEFAULT);
    };
    let ms = text
        .to_str()
        .and_then(|text| text.parse::<u64>().ok())
        .ok_or_else(|| {
            KernelError::Setup(format!(
                "{LEASE_ENV} is `{}`, not a number of milliseconds",
                text.to_string_lossy()
            ))
        })?;
    let lease = Duration::from_millis(ms);
    let (min, max) = (
        agent_kernel_txlog_postgres::LEASE_MIN,
        agent_kernel_txlog_postgres::LEASE_MAX,
    );
    if !(min..=max).contains(&lease) {
        return Err(KernelError::Setup(format!(
            "{LEASE_ENV} is {ms} ms, outside {} ms to {} ms",
            min.as_millis(),
            max.as_millis()
        )));
    }
    Ok(lease)
}

/// A dispatcher with `limits` and `tools`; a `[limits.tools."<id>"]` entry of `policy` must
/// name one of them, or a tool of one of its sources.
///
/// # Errors
///
/// [`KernelError::Setup`] for limits out of range, two required tools of one id, two
/// sources of one name, or a per-tool entry naming no tool. A tool of a source that cannot
/// be registered is left out with a warning when the source is asked, never an error.
pub fn dispatcher_with(
    limits: Limits,
    tools: ToolSet,
    policy: &Policy,
) -> Result<Dispatcher, KernelError> {
    let jitter = Arc::new(SeededJitter::new(u64::from(std::process::id())));
    let mut dispatcher = Dispatcher::new(limits, jitter)
        .map_err(|error| KernelError::Setup(format!("dispatcher limits: {error}")))?;
    for tool in tools.required {
        dispatcher
            .register(tool)
            .map_err(|error| KernelError::Setup(format!("registering the tools: {error}")))?;
    }
    for source in tools.sources {
        let name = source.name().to_owned();
        if let Err(error) = dispatcher.add_source(source) {
            return Err(KernelError::Setup(format!(
                "registering the tools of `{name}`: {error}"
            )));
        }
    }
    // A misspelled tool id would silently leave that tool unbounded by its override (a
    // tool of a source is checked once the source is asked: it is not known before).
    if let Some(unknown) = dispatcher
        .limits()
        .tools
        .keys()
        .find(|id| !dispatcher.knows(id))
    {
        let known = dispatcher.ids();
        return Err(KernelError::Setup(format!(
            "sandbox policy {}: [limits.tools.\"{unknown}\"] names no tool (known tools: {})",
            policy.origin(),
            known.join(", ")
        )));
    }
    Ok(dispatcher)
}

/// The largest operator key file read, in bytes.
pub const OPERATOR_KEY_BYTES_MAX: u64 = 4096;

/// The key in the operator key file at `path`, read with a bound: not empty once its
/// trailing whitespace is ignored.
///
/// # Errors
///
/// A message saying why it cannot be used.
pub fn read_operator_key(path: &Path) -> Result<Vec<u8>, String> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|file| {
            file.take(OPERATOR_KEY_BYTES_MAX + 1)
                .read_to_end(&mut bytes)
        })
        .map_err(|error| format!("cannot read {}: {error}", path.display()))?;
    if bytes.len() as u64 > OPERATOR_KEY_BYTES_MAX {
        return Err(format!(
            "{} is larger than {OPERATOR_KEY_BYTES_MAX} bytes",
            path.display()
        ));
    }
    if bytes.trim_ascii_end().is_empty() {
        return Err(format!("{} is empty", path.display()));
    }
    Ok(bytes)
}
