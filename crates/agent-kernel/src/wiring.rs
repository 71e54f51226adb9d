//! What a [`KernelBuilder`](crate::KernelBuilder) reads and registers: the policy's
//! `[approval]` and `[limits]`, the FSM table file, the tools file's command tools and
//! upstream servers, the lease from the environment, the operator key file, and the
//! dispatcher they make.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use agent_kernel_api::{OnDenied, ToolEntry, ToolSource};
use agent_kernel_core::{ApprovalPolicy, KernelError};
use agent_kernel_dispatcher::{Dispatcher, Limits, SeededJitter};
use agent_kernel_fsm::Guardrail;
use agent_kernel_sandbox::Policy;

use crate::backend;
use crate::builder::LEASE_ENV;

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
    pub required: Vec<ToolEntry>,
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
/// becomes its timeout in `limits`, unless `[limits.tools."<id>"]` sets one. With
/// `upstream_runtime`, the servers' connections are served on that runtime while it runs
/// ([`KernelBuilder::upstream_runtime`](crate::KernelBuilder::upstream_runtime)).
///
/// # Errors
///
/// [`KernelError::Setup`] naming the file and the line: a file that cannot be read or
/// parsed, or a command tool that is invalid.
pub fn declared_tools(
    path: &Path,
    policy: &Policy,
    limits: &mut Limits,
    upstream_runtime: Option<&tokio::runtime::Handle>,
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
    let sources = upstream_sources(path, &text, output_bytes_max, upstream_runtime)?;
    let mut tools = ToolSet::default();
    for tool in commands {
        let timeout_ms = tool.timeout_ms();
        tools
            .required
            .push(declared_timeout(limits, tool.into_entry(), timeout_ms));
    }
    tools.sources = sources;
    Ok(tools)
}

/// The upstream MCP servers the tools file at `path` (its `text`) declares, none started.
#[cfg(feature = "upstream")]
fn upstream_sources(
    path: &Path,
    text: &str,
    output_bytes_max: u64,
    serving: Option<&tokio::runtime::Handle>,
) -> Result<Vec<Arc<dyn ToolSource>>, KernelError> {
    let sources = agent_kernel_upstream::upstream_sources_of(path, text, output_bytes_max, serving)
        .map_err(|error| KernelError::Setup(error.to_string()))?;
    Ok(sources
        .into_iter()
        .map(|source| Arc::new(source) as Arc<dyn ToolSource>)
        .collect())
}

/// Without the `upstream` feature, a tools file that declares upstream servers is refused
/// rather than half loaded.
#[cfg(not(feature = "upstream"))]
fn upstream_sources(
    path: &Path,
    text: &str,
    _output_bytes_max: u64,
    _serving: Option<&tokio::runtime::Handle>,
) -> Result<Vec<Arc<dyn ToolSource>>, KernelError> {
    let declares_servers = text
        .parse::<toml::Table>()
        .is_ok_and(|table| table.contains_key("mcp_servers"));
    if declares_servers {
        return Err(KernelError::Setup(format!(
            "tools file {}: [mcp_servers] declares upstream MCP servers, and this program was built without the `upstream` feature of the agent-kernel crate",
            path.display()
        )));
    }
    Ok(Vec::new())
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
pub(crate) fn declared_timeout(
    limits: &mut Limits,
    tool: ToolEntry,
    timeout_ms: Option<u64>,
) -> ToolEntry {
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

/// Reads (at most [`agent_kernel_fsm::MAX_TABLE_BYTES`]) and validates an FSM table file.
pub(crate) fn read_table(path: &Path) -> Result<Guardrail, KernelError> {
    let setup = |what: String| KernelError::Setup(what);
    let file = std::fs::File::open(path)
        .map_err(|error| setup(format!("cannot read FSM table {}: {error}", path.display())))?;
    let text = agent_kernel_api::read_text_bounded(file, agent_kernel_fsm::MAX_TABLE_BYTES)
        .map_err(|sentence| setup(format!("FSM table {}: {sentence}", path.display())))?;
    Guardrail::from_toml_str(&text)
        .map_err(|error| setup(format!("FSM table {}: {error}", path.display())))
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
    limits.validate().map_err(|error| {
        let message = match error {
            agent_kernel_dispatcher::DispatchError::Limits(message) => message,
            other => other.to_string(),
        };
        KernelError::Setup(format!(
            "sandbox policy {}: [limits]: {message}",
            policy.origin()
        ))
    })?;
    Ok(limits)
}

/// What a policy's `[mcp]` section asks of the MCP server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct McpSettings {
    /// What a call the sandbox or the FSM denies does to its saga (`on_denied`, default
    /// `"refuse"`).
    #[serde(default = "refuse")]
    pub on_denied: OnDenied,
}

fn refuse() -> OnDenied {
    OnDenied::Refuse
}

impl Default for McpSettings {
    fn default() -> Self {
        McpSettings {
            on_denied: OnDenied::Refuse,
        }
    }
}

/// The MCP server's settings from a policy's `[mcp]` section, else the defaults.
///
/// # Errors
///
/// [`KernelError::Setup`] naming the policy and the key unknown or the value not allowed.
pub fn mcp_settings_from(policy: &Policy) -> Result<McpSettings, KernelError> {
    let Some(table) = policy.mcp_table() else {
        return Ok(McpSettings::default());
    };
    toml::Value::Table(table.clone())
        .try_into()
        .map_err(|error| {
            KernelError::Setup(format!(
                "sandbox policy {}: [mcp]: {error}",
                policy.origin()
            ))
        })
}

/// The lease [`LEASE_ENV`] sets, if it does, checked against the backend's bounds.
pub(crate) fn lease_from_env() -> Result<Option<Duration>, KernelError> {
    let Some(text) = std::env::var_os(LEASE_ENV) else {
        return Ok(None);
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
    let (min, max) = backend::LEASE_BOUNDS;
    if !(min..=max).contains(&lease) {
        return Err(KernelError::Setup(format!(
            "{LEASE_ENV} is {ms} ms, outside {} ms to {} ms",
            min.as_millis(),
            max.as_millis()
        )));
    }
    Ok(Some(lease))
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
/// [`KernelError::Setup`] saying why it cannot be used.
pub fn read_operator_key(path: &Path) -> Result<Vec<u8>, KernelError> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|file| {
            file.take(OPERATOR_KEY_BYTES_MAX + 1)
                .read_to_end(&mut bytes)
        })
        .map_err(|error| KernelError::Setup(format!("cannot read {}: {error}", path.display())))?;
    if bytes.len() as u64 > OPERATOR_KEY_BYTES_MAX {
        return Err(KernelError::Setup(format!(
            "{} is larger than {OPERATOR_KEY_BYTES_MAX} bytes",
            path.display()
        )));
    }
    if bytes.trim_ascii_end().is_empty() {
        return Err(KernelError::Setup(format!("{} is empty", path.display())));
    }
    Ok(bytes)
}
