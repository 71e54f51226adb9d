//! Upstream MCP servers (reference §11): the tools of MCP servers declared in `tools.toml`
//! under `[mcp_servers.NAME]`, offered as kernel tools `NAME.TOOL`, so that each call is a
//! logged, compensable saga step.
//!
//! - [`load_servers`] reads the declarations strictly (every problem with its line),
//!   compensation argument mappings included ([`Mapping`], RFC 9535 JSONPath through
//!   `serde_json_path`).
//! - [`Hub`] owns the connections (rmcp's client over stdio), served on the runtime it is
//!   given or a thread of its own, and starts the programs on that thread: a
//!   server is started only when a step, a compensation or a listing first needs one of its
//!   tools, with a cleared environment (plus the listed
//!   variables, `PATH` and `HOME`), its stderr in the kernel's log, and restarted for the
//!   next call after it died, within [`SERVER_STARTS_MAX`].
//! - [`UpstreamTool`] is one upstream tool: its own input schema, the classes its
//!   declaration gives it (an undeclared tool is mutating and irreversible, unless its
//!   annotations are trusted and say read-only), and its compensation, another tool of the
//!   same server called with arguments mapped from the step's arguments and output.
//!
//! [`upstream_sources`] does all three for a tools file, [`upstream_sources_of`] for its
//! text read once with its command tools: one [`UpstreamSource`] per server, which a
//! dispatcher asks for its tools the first time one of them is needed.
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

mod config;
mod hub;
mod mapping;
mod tool;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use agent_kernel_api::{BoxFuture, SourcedTool, ToolEntry, ToolError, ToolSource};

pub use config::{
    Compensation, SERVER_START_TIMEOUT_MS_MAX, SERVERS_FILE_BYTES_MAX, ServerSpec,
    ServersFileError, ToolDecl, UPSTREAM_SERVERS_MAX, load_servers, parse_servers,
};
pub use hub::{
    CallError, Connection, Connector, Hub, SERVER_START_TIMEOUT, SERVER_STARTS_MAX,
    SERVER_STOP_GRACE, StepRef,
};
pub use mapping::Mapping;
pub use tool::UpstreamTool;

/// The most tools one upstream server may list: a server that lists more is unavailable
/// (a runaway list would otherwise fill the kernel's registry).
pub const UPSTREAM_TOOLS_PER_SERVER_MAX: usize = 1_024;

/// One upstream server as a source of kernel tools: asked for its tools (which starts it)
/// only the first time a step, a compensation or a listing needs one of them.
///
/// A server that cannot be used (it does not start, hangs past its `start_timeout_ms`,
/// lists too many tools, or lacks a tool its declarations compensate with) makes only its
/// own tools unavailable: never the built-in tools, the command tools or another server's.
#[derive(Debug)]
pub struct UpstreamSource {
    spec: ServerSpec,
    path: PathBuf,
    hub: Arc<Hub>,
    output_bytes_max: u64,
}

impl ToolSource for UpstreamSource {
    fn name(&self) -> &str {
        &self.spec.name
    }

    fn load(&self) -> BoxFuture<'_, Result<Vec<SourcedTool>, ToolError>> {
        Box::pin(async move {
            let listed = self.hub.list_tools(&self.spec.name).await?;
            let listed = usable(&self.path, &self.spec, listed).map_err(ToolError::failed)?;
            Ok(listed
                .iter()
                .map(|tool| {
                    let upstream = UpstreamTool::new(
                        &self.spec,
                        tool,
                        Arc::clone(&self.hub),
                        self.output_bytes_max,
                    );
                    let timeout_ms = upstream.timeout_ms(&self.spec);
                    (ToolEntry::compensated(upstream), timeout_ms)
                })
                .collect())
        })
    }
}

/// The upstream servers of the tools file at `path` as tool sources, their tools' outputs
/// bounded by `output_bytes_max`. No server is started here.
///
/// # Errors
///
/// A [`ServersFileError`] naming the file and the line when the file cannot be read or
/// parsed, or the file alone when the thread that owns the connections cannot be started.
pub fn upstream_sources(
    path: &Path,
    output_bytes_max: u64,
) -> Result<Vec<UpstreamSource>, ServersFileError> {
    let specs = load_servers(path)?;
    sources_of(path, specs, output_bytes_max, None)
}

/// The upstream servers `text`, the content of the tools file at `path`, declares, as
/// [`upstream_sources`] makes them: for a caller that read the file once for its command
/// tools too. With `serving`, their connections are served on that runtime while it runs
/// ([`Hub::serving_on`]).
///
/// # Errors
///
/// As [`upstream_sources`].
pub fn upstream_sources_of(
    path: &Path,
    text: &str,
    output_bytes_max: u64,
    serving: Option<&tokio::runtime::Handle>,
) -> Result<Vec<UpstreamSource>, ServersFileError> {
    let specs = parse_servers(path, text)?;
    sources_of(path, specs, output_bytes_max, serving)
}

/// The sources of the servers `specs` of the tools file at `path`, sharing one [`Hub`].
fn sources_of(
    path: &Path,
    specs: Vec<ServerSpec>,
    output_bytes_max: u64,
    serving: Option<&tokio::runtime::Handle>,
) -> Result<Vec<UpstreamSource>, ServersFileError> {
    if specs.is_empty() {
        return Ok(Vec::new());
    }
    let hub = match serving {
        Some(runtime) => Hub::serving_on(specs.clone(), runtime.clone()),
        None => Hub::new(specs.clone()),
    };
    let hub = Arc::new(hub.map_err(|error| ServersFileError {
        path: path.display().to_string(),
        line: None,
        message: error.to_string(),
    })?);
    Ok(upstream_sources_on(path, specs, &hub, output_bytes_max))
}

/// The servers `specs` (declared in the tools file at `path`) as tool sources whose calls
/// go through `hub`: one made with [`Hub::with_connector`], for a simulation.
pub fn upstream_sources_on(
    path: &Path,
    specs: Vec<ServerSpec>,
    hub: &Arc<Hub>,
    output_bytes_max: u64,
) -> Vec<UpstreamSource> {
    specs
        .into_iter()
        .map(|spec| UpstreamSource {
            spec,
            path: path.to_path_buf(),
            hub: Arc::clone(hub),
            output_bytes_max,
        })
        .collect()
}

/// The offered tools of what `spec`'s server listed, or why none of its tools can be used.
fn usable(
    path: &Path,
    spec: &ServerSpec,
    listed: Vec<rmcp::model::Tool>,
) -> Result<Vec<rmcp::model::Tool>, String> {
    if listed.len() > UPSTREAM_TOOLS_PER_SERVER_MAX {
        return Err(format!(
            "it lists {} tools, more than {UPSTREAM_TOOLS_PER_SERVER_MAX} (UPSTREAM_TOOLS_PER_SERVER_MAX)",
            listed.len()
        ));
    }
    for (tool, decl) in &spec.declared {
        if let Some(compensation) = &decl.compensate
            && !listed.iter().any(|listed| listed.name == compensation.tool)
        {
            return Err(format!(
                "{}, line {}: [mcp_servers.{}.tool.{tool}] compensates with `{}`, which the server does not list",
                path.display(),
                compensation.line,
                spec.name,
                compensation.tool
            ));
        }
    }
    Ok(listed
        .into_iter()
        .filter(|tool| spec.tools.iter().any(|glob| glob.matches(&tool.name)))
        .collect())
}
