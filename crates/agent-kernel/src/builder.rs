//! [`KernelBuilder`]: every rule about which files, log and tools a kernel gets, in one
//! place. [`KernelBuilder::new`] reads nothing it is not given; [`KernelBuilder::from_folder`]
//! takes the command line's defaults from a folder.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agent_kernel_api::{
    Clock, Compensate, Durability, EffectClass, IdSource, Tool, ToolEntry, TxLog,
};
use agent_kernel_core::{Environment, Kernel, KernelError, SystemClock, UuidV7Ids};
use agent_kernel_dispatcher::{Dispatcher, Limits};
use agent_kernel_fsm::Guardrail;
use agent_kernel_sandbox::{FsSandbox, HttpSandbox, Policy};
use agent_kernel_tools::SandboxFiles;

use crate::backend::{self, AuditKey};
use crate::confine::Opened;
use crate::process::{ProcessProbe, current_owner, current_uid};
use crate::wiring::{
    ToolSet, approval_policy_from, declared_timeout, declared_tools, dispatcher_with,
    lease_from_env, limits_from_policy, mcp_settings_from, read_table,
};

/// The log [`KernelBuilder::from_folder`] opens unless told otherwise (after
/// `$AGENT_KERNEL_DB`).
pub const DEFAULT_DB: &str = "agent-kernel.db";
/// The policy file [`KernelBuilder::from_folder`] loads when it exists in the folder.
pub const DEFAULT_SANDBOX: &str = "sandbox.toml";
/// The FSM table file [`KernelBuilder::from_folder`] loads when it exists in the folder.
pub const DEFAULT_FSM: &str = "fsm.toml";
/// The tools file [`KernelBuilder::from_folder`] loads when it exists in the folder
/// (reference §7).
pub const DEFAULT_TOOLS: &str = "tools.toml";
/// The environment variable naming the log, read by [`KernelBuilder::from_folder`] only.
pub const DB_ENV: &str = "AGENT_KERNEL_DB";
/// The environment variable that sets the lease of a process on a PostgreSQL log, in ms,
/// read by [`KernelBuilder::from_folder`] only: how long after it stops its unfinished
/// sagas wait before another process may recover them.
pub const LEASE_ENV: &str = "AGENT_KERNEL_LEASE_MS";

/// Where the command tools come from.
#[derive(Debug)]
enum ToolsFileSource {
    /// The folder's `tools.toml` if it exists (with a folder), else none.
    Default,
    File(PathBuf),
    Skip,
}

/// Where the policy comes from.
#[derive(Debug)]
enum PolicySource {
    /// The folder's `sandbox.toml` if it exists (with a folder), else deny-all.
    Default,
    File(PathBuf),
    Given(Box<Policy>),
}

/// Where the FSM table comes from.
#[derive(Debug)]
enum FsmSource {
    /// The folder's `fsm.toml` if it exists (with a folder), else the built-in table.
    Default,
    File(PathBuf),
    Given(Box<Guardrail>),
}

/// Builds a [`Kernel`]: its log, policy, FSM table, tools and identity.
///
/// | part | [`new`](Self::new) | [`from_folder(dir)`](Self::from_folder) |
/// | --- | --- | --- |
/// | log | [`db`](Self::db) or [`log`](Self::log), required | `$AGENT_KERNEL_DB`, else `dir/agent-kernel.db` (SQLite, created if absent) |
/// | policy | deny-all | `dir/sandbox.toml` if it exists, else deny-all |
/// | FSM table | the built-in table | `fsm.toml` beside a policy file named with [`sandbox_file`](Self::sandbox_file), else `dir/fsm.toml`, if it exists; else the built-in table |
/// | tools | the built-in tools (not the drill tools `fault.*`) and the ones added | the same, and the command and upstream tools of `tools.toml`, looked for as `fsm.toml` is |
/// | relative paths in arguments | against the working directory | against `dir` |
/// | lease on PostgreSQL | the default | `$AGENT_KERNEL_LEASE_MS`, else the default |
///
/// For both: durability [`Durability::Full`], the policy's `[limits]` (else the
/// defaults), the system clock, UUID v7 ids, this process as the owner of its sagas. Each
/// can be changed. `new` reads no file and no environment variable it is not pointed at.
///
/// ```
/// use agent_kernel::KernelBuilder;
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
    /// Where default files are looked for ([`KernelBuilder::from_folder`]).
    folder: Option<PathBuf>,
    db: Option<PathBuf>,
    /// A log of the caller's, used as it is.
    log: Option<Arc<dyn TxLog>>,
    durability: Durability,
    policy: PolicySource,
    fsm: FsmSource,
    audit_key: Option<AuditKey>,
    lease: Option<Duration>,
    limits: Option<Limits>,
    standard_tools: bool,
    drill_tools: bool,
    /// The tools added, each with the timeout it declares, if any.
    tools: Vec<(ToolEntry, Option<u64>)>,
    /// Why a tool added cannot be registered, said by `build`.
    refused: Vec<String>,
    tools_file: ToolsFileSource,
    cwd: Option<PathBuf>,
    clock: Option<Arc<dyn Clock>>,
    ids: Option<Arc<dyn IdSource>>,
    operator_options: Vec<String>,
    log_layer: Option<LogLayer>,
    /// Files no program a tool starts may open (besides the log's own and the keys').
    protected: Vec<PathBuf>,
    /// Only compensations will run: an FSM table that does not load is replaced by the
    /// built-in one, so that rollback stays possible.
    compensation_only: bool,
    /// Where upstream servers' connections are served, if not on a thread of their own.
    upstream_runtime: Option<tokio::runtime::Handle>,
}

/// A function that puts a [`TxLog`] of the caller's around the SQLite log
/// ([`KernelBuilder::wrap_log`]).
type LogLayer = Box<dyn FnOnce(Arc<dyn TxLog>) -> Arc<dyn TxLog> + Send>;

impl std::fmt::Debug for KernelBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelBuilder")
            .field("folder", &self.folder)
            .field("db", &self.db)
            .field("log", &self.log.is_some())
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
            .field("upstream_runtime", &self.upstream_runtime.is_some())
            .finish_non_exhaustive()
    }
}

impl Default for KernelBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl KernelBuilder {
    /// A builder that reads nothing it is not given: no file of the working folder, no
    /// environment variable. The log must be named ([`db`](Self::db)) or given
    /// ([`log`](Self::log)).
    pub fn new() -> Self {
        KernelBuilder {
            folder: None,
            log: None,
            protected: Vec::new(),
            compensation_only: false,
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
            refused: Vec::new(),
            tools_file: ToolsFileSource::Default,
            cwd: None,
            clock: None,
            ids: None,
            operator_options: Vec::new(),
            log_layer: None,
            upstream_runtime: None,
        }
    }

    /// A builder with the command line's defaults, taken from `folder` (see the table
    /// above): its `agent-kernel.db` unless `$AGENT_KERNEL_DB` names another log, and its
    /// `sandbox.toml`, `fsm.toml` and `tools.toml` when they exist; relative paths in tool
    /// arguments resolve against it. Anything set explicitly wins.
    pub fn from_folder(folder: impl Into<PathBuf>) -> Self {
        Self {
            folder: Some(folder.into()),
            ..Self::new()
        }
    }

    /// A log of the caller's, used as it is (the builder's durability, audit key and lease
    /// then only concern the file tools; the log was opened with its own).
    pub fn log(mut self, log: Arc<dyn TxLog>) -> Self {
        self.log = Some(log);
        self
    }

    /// Only compensations will run (`recover`, `rollback`, `undo`, a dead letter's retry):
    /// an FSM table that does not load is replaced by the built-in one, with a warning, since
    /// every table lets failures and compensations finish and rollback must stay possible.
    pub fn for_compensation(mut self) -> Self {
        self.compensation_only = true;
        self
    }

    /// A file that no program a command tool starts may open, whatever its tool declares
    /// (an audit key file, say); the log's files and the operator key file always are.
    pub fn protect_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.protected.push(path.into());
        self
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

    /// Adds a tool of the program's own that can undo its effect.
    pub fn tool<T: Compensate>(self, tool: T) -> Self {
        self.tool_entry(ToolEntry::compensated(tool))
    }

    /// Adds a read-only tool of the program's own. [`build`](Self::build) refuses it when
    /// its spec says it is mutating.
    pub fn read_only_tool<T: Tool>(mut self, tool: T) -> Self {
        let entry = ToolEntry::new(tool);
        if entry.as_dyn().effect() != EffectClass::ReadOnly {
            self.refused.push(format!(
                "tool `{}` was added as read-only but its spec says it is mutating",
                entry.id()
            ));
        }
        self.tool_entry(entry)
    }

    /// Adds a tool of the program's own whose effect cannot be undone: its spec must
    /// declare reversibility `none`, and each of its steps waits for an operator's approval.
    /// [`build`](Self::build) refuses it otherwise.
    pub fn irreversible_tool<T: Tool>(self, tool: T) -> Self {
        self.tool_entry(ToolEntry::new(tool))
    }

    /// Adds a tool of any kind ([`ToolEntry::probed`] and [`ToolEntry::compensated_probed`]
    /// for tools that can probe).
    pub fn tool_entry(self, tool: ToolEntry) -> Self {
        self.tool_entry_with_timeout(tool, None)
    }

    /// Adds a tool with the timeout it declares (as a command tool's `timeout_ms`): its
    /// timeout in `[limits]` unless `[limits.tools."<id>"]` sets one.
    pub fn tool_entry_with_timeout(mut self, tool: ToolEntry, timeout_ms: Option<u64>) -> Self {
        self.tools.push((tool, timeout_ms));
        self
    }

    /// The tools file whose command tools to register (reference §7), instead of
    /// `./tools.toml` when it exists.
    pub fn tools_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.tools_file = ToolsFileSource::File(path.into());
        self
    }

    /// Serves the connections to the tools file's upstream MCP servers on `runtime` while
    /// it runs, instead of on a thread of their own: a call made on that runtime then
    /// reaches its server without a hand-off between threads. The runtime must have its I/O
    /// and time drivers enabled (`enable_all`), and be run while calls are made (a
    /// current-thread runtime between two `block_on`s serves nothing: calls from other
    /// threads wait until their timeouts); once it stops, the connections are served on the
    /// thread again (each server started anew). The servers' programs are started on that
    /// thread either way, outside the sandbox the process may confine itself to.
    pub fn upstream_runtime(mut self, runtime: tokio::runtime::Handle) -> Self {
        self.upstream_runtime = Some(runtime);
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
            ToolsFileSource::Default => self.default_file(DEFAULT_TOOLS),
            ToolsFileSource::Skip => None,
        }
    }

    /// Where a default file `name` is looked for, in order: beside the policy file when
    /// one is named (for `fsm.toml` and `tools.toml`), then in the folder of
    /// [`from_folder`](Self::from_folder). Nothing for a builder from [`new`](Self::new).
    pub fn default_file_candidates(&self, name: &str) -> Vec<PathBuf> {
        let Some(folder) = self.folder.as_deref() else {
            return Vec::new();
        };
        let mut candidates = Vec::with_capacity(2);
        let policy_file = match &self.policy {
            PolicySource::File(path) => Some(path.as_path()),
            PolicySource::Given(policy) => policy.source(),
            PolicySource::Default => None,
        };
        if name != DEFAULT_SANDBOX
            && let Some(policy) = policy_file
        {
            let beside = policy
                .parent()
                .filter(|dir| !dir.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            candidates.push(in_folder(beside, name));
        }
        let in_config = in_folder(folder, name);
        if !candidates.contains(&in_config) {
            candidates.push(in_config);
        }
        candidates
    }

    /// The first of [`default_file_candidates`](Self::default_file_candidates) that exists.
    fn default_file(&self, name: &str) -> Option<PathBuf> {
        self.default_file_candidates(name)
            .into_iter()
            .find(|path| path.is_file())
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

    /// The folder relative paths in tool arguments resolve against (default: the folder of
    /// [`from_folder`](Self::from_folder), else the working directory), for the built-in
    /// tools and for every tool through [`ToolContext::folder`](agent_kernel_api::ToolContext).
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

    /// The log this builder opens: [`db`](Self::db), else (with a folder)
    /// `$AGENT_KERNEL_DB` or the folder's `agent-kernel.db`; `None` for a builder from
    /// [`new`](Self::new) given neither a path nor a [`log`](Self::log).
    pub fn db_path(&self) -> Option<PathBuf> {
        if let Some(db) = &self.db {
            return Some(db.clone());
        }
        let folder = self.folder.as_deref()?;
        Some(std::env::var_os(DB_ENV).map_or_else(|| in_folder(folder, DEFAULT_DB), PathBuf::from))
    }

    /// The policy in force: the one given, else the file named, else (with a folder) its
    /// `sandbox.toml` when it exists, else deny-all.
    ///
    /// # Errors
    ///
    /// [`KernelError::Setup`] naming the file and the problem.
    pub fn load_policy(&self) -> Result<Policy, KernelError> {
        let load = |path: &Path, shown: String| {
            Policy::load(path)
                .map_err(|error| KernelError::Setup(format!("sandbox policy {shown}: {error}")))
        };
        match &self.policy {
            PolicySource::Given(policy) => Ok(policy.as_ref().clone()),
            PolicySource::File(path) => load(path, path.display().to_string()),
            PolicySource::Default => match self.default_file(DEFAULT_SANDBOX) {
                Some(path) => load(&path, path.display().to_string()),
                None => Ok(Policy::deny_all()),
            },
        }
    }

    /// The FSM table in force: the one given, else the file named, else (with a folder) its
    /// `fsm.toml` when it exists, else the built-in table. With
    /// [`for_compensation`](Self::for_compensation), a table that does not load is the
    /// built-in one, with a warning.
    ///
    /// # Errors
    ///
    /// [`KernelError::Setup`] naming the file and the problem.
    pub fn load_fsm(&self) -> Result<Guardrail, KernelError> {
        let loaded = match &self.fsm {
            FsmSource::Given(table) => Ok(table.as_ref().clone()),
            FsmSource::File(path) => read_table(path),
            FsmSource::Default => match self.default_file(DEFAULT_FSM) {
                Some(path) => read_table(&path),
                None => Ok(Guardrail::builtin()),
            },
        };
        match loaded {
            Err(error) if self.compensation_only => {
                tracing::warn!(%error, "using the built-in FSM table for recovery");
                Ok(Guardrail::builtin())
            }
            loaded => loaded,
        }
    }

    /// The folder relative paths in tool arguments resolve against.
    fn resolved_cwd(&self) -> Result<PathBuf, KernelError> {
        let working = || {
            std::env::current_dir().map_err(|error| {
                KernelError::Setup(format!("cannot read the working directory: {error}"))
            })
        };
        match self.cwd.as_ref().or(self.folder.as_ref()) {
            Some(dir) if dir.is_absolute() => Ok(dir.clone()),
            Some(dir) if dir.as_os_str() == "." => working(),
            Some(dir) => Ok(working()?.join(dir)),
            None => working(),
        }
    }

    /// The sandbox of `policy`, and the folder relative paths resolve against.
    fn sandbox(&self, policy: &Policy) -> Result<(Arc<FsSandbox>, PathBuf), KernelError> {
        let fs = FsSandbox::new(policy).map_err(|error| {
            KernelError::Setup(format!("cannot open the sandbox's allowed roots: {error}"))
        })?;
        Ok((Arc::new(fs), self.resolved_cwd()?))
    }

    /// The tools this builder registers under `policy` (its sandbox `fs`, relative paths
    /// against `cwd`), and the limits their declared timeouts complete. With
    /// `every_builtin`, the drill tools are among them whatever was asked (a listing shows
    /// every tool the log may name).
    fn tool_set(
        &self,
        policy: &Policy,
        (fs, cwd): &(Arc<FsSandbox>, PathBuf),
        every_builtin: bool,
    ) -> Result<(ToolSet, Limits), KernelError> {
        if let Some(refusal) = self.refused.first() {
            return Err(KernelError::Setup(refusal.clone()));
        }
        let mut limits = match &self.limits {
            Some(limits) => limits.clone(),
            None => limits_from_policy(policy)?,
        };
        let mut tools = ToolSet::default();
        if self.standard_tools || every_builtin {
            tools.required.extend(agent_kernel_tools::standard_tools(
                Arc::clone(fs),
                Arc::new(HttpSandbox::new(policy)),
                cwd.clone(),
            ));
        }
        if self.drill_tools || every_builtin {
            tools
                .required
                .extend(agent_kernel_tools::drill_tools(Arc::clone(fs), cwd.clone()));
        }
        if let Some(path) = self.tools_file_path() {
            tools.extend(declared_tools(
                &path,
                policy,
                &mut limits,
                self.upstream_runtime.as_ref(),
            )?);
        }
        tools.required.extend(
            self.tools
                .iter()
                .map(|(tool, timeout_ms)| declared_timeout(&mut limits, tool.clone(), *timeout_ms)),
        );
        Ok((tools, limits))
    }

    /// Every tool this builder's kernel would have, the drill tools included, behind a
    /// dispatcher with the policy's limits, without opening the log: for listings
    /// (`agent-kernel tools`). Upstream servers are not started here.
    ///
    /// # Errors
    ///
    /// As [`build`](Self::build), for the policy and the tools.
    pub fn listing(&self) -> Result<Dispatcher, KernelError> {
        let policy = self.load_policy()?;
        let sandbox = self.sandbox(&policy)?;
        let (tools, limits) = self.tool_set(&policy, &sandbox, true)?;
        dispatcher_with(limits, tools, &policy)
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
    /// (naming the file and the problem), or no log; [`KernelError::Log`] when the log
    /// cannot be opened or created.
    pub fn build(self) -> Result<Arc<Kernel>, KernelError> {
        self.open().map(|opened| opened.kernel)
    }

    /// [`build`](Self::build), keeping what [`Opened::confine`] needs to confine this
    /// process afterwards: the policy in force and the files no program may open.
    ///
    /// # Errors
    ///
    /// As [`build`](Self::build).
    pub fn open(self) -> Result<Opened, KernelError> {
        let policy = self.load_policy()?;
        let fsm = self.load_fsm()?;
        let sandbox = self.sandbox(&policy)?;
        let (tools, limits) = self.tool_set(&policy, &sandbox, false)?;
        let dispatcher = dispatcher_with(limits, tools, &policy)?;
        let approvals = approval_policy_from(&policy)?;
        // Checked here so that every command refuses a policy the MCP server would.
        mcp_settings_from(&policy)?;
        let clock = self.clock.clone().unwrap_or_else(|| Arc::new(SystemClock));
        let owner = current_owner().map_err(|error| {
            KernelError::Setup(format!("cannot identify this process in /proc: {error}"))
        })?;
        let mut protected = self.protected.clone();
        let log = match (self.log.clone(), self.db_path()) {
            (Some(log), _) => log,
            (None, Some(db)) => {
                // The lease concerns a PostgreSQL log alone: an SQLite log keeps none, and a
                // stray value of the variable does not stop it from opening.
                let lease = match self.lease {
                    Some(lease) => Some(lease),
                    None if self.folder.is_some() && backend::is_postgres(&db) => lease_from_env()?,
                    None => None,
                };
                protected.extend(backend::log_files(&db));
                backend::open(
                    &db,
                    backend::Opening {
                        durability: self.durability,
                        clock: Arc::clone(&clock),
                        audit_key: self.audit_key.clone(),
                        lease,
                        owner: owner.clone(),
                    },
                )?
            }
            (None, None) => {
                return Err(KernelError::Setup(
                    "no log: name one with .db(path) or give one with .log(log), or build from a folder with KernelBuilder::from_folder".to_owned(),
                ));
            }
        };
        let log = match self.log_layer {
            Some(layer) => layer(log),
            None => log,
        };
        protected.extend(approvals.operator_key_file().map(Path::to_owned));
        let env = Environment {
            clock,
            ids: self.ids.unwrap_or_else(|| Arc::new(UuidV7Ids)),
            liveness: Arc::new(ProcessProbe::new(owner.clone())),
            owner,
        };
        let kernel = Kernel::new(
            log,
            Arc::new(dispatcher),
            Arc::new(fsm),
            env,
            self.durability,
        )
        .with_operator_options(self.operator_options)
        .with_operator_uid(current_uid())
        .with_approval_policy(approvals)
        .with_files(Arc::new(SandboxFiles::new(sandbox.0, sandbox.1)));
        Ok(Opened::new(Arc::new(kernel), policy, protected))
    }
}

/// `name` in `folder`, written as the command line shows it (`agent-kernel.db`, not
/// `./agent-kernel.db`, for the working folder).
fn in_folder(folder: &Path, name: &str) -> PathBuf {
    if folder.as_os_str().is_empty() || folder == Path::new(".") {
        PathBuf::from(name)
    } else {
        folder.join(name)
    }
}
