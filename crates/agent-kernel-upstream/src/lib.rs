//! Upstream MCP servers (CONTRACT §11): the tools of MCP servers declared in `tools.toml`
//! under `[mcp_servers.NAME]`, offered as kernel tools `NAME.TOOL`, so that each call is a
//! logged, compensable saga step.
//!
//! - [`load_servers`] reads the declarations strictly (every problem with its line),
//!   compensation argument mappings included ([`Mapping`], RFC 9535 JSONPath through
//!   `serde_json_path`).
//! - [`Hub`] owns the connections (rmcp's client over stdio) on a thread of its own: a
//!   server is started when first needed, with a cleared environment (plus the listed
//!   variables, `PATH` and `HOME`), its stderr in the kernel's log, and restarted for the
//!   next call after it died, within [`SERVER_STARTS_MAX`].
//! - [`UpstreamTool`] is one upstream tool: its own input schema, the classes its
//!   declaration gives it (an undeclared tool is mutating and irreversible, unless its
//!   annotations are trusted and say read-only), and its compensation, another tool of the
//!   same server called with arguments mapped from the step's arguments and output.
//!
//! [`upstream_tools`] does all three for a tools file, [`upstream_tools_of`] for its text
//! read once with its command tools.
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

mod config;
mod hub;
mod mapping;
mod tool;

use std::path::Path;
use std::sync::Arc;

pub use config::{
    Compensation, SERVER_START_TIMEOUT_MS_MAX, SERVERS_FILE_BYTES_MAX, ServerSpec,
    ServersFileError, ToolDecl, UPSTREAM_SERVERS_MAX, load_servers, parse_servers,
};
pub use hub::{CallError, Hub, SERVER_START_TIMEOUT, SERVER_STARTS_MAX};
pub use mapping::Mapping;
pub use tool::UpstreamTool;

/// The most tools one upstream server may list: a server that lists more is unavailable
/// (a runaway list would otherwise fill the kernel's registry).
pub const UPSTREAM_TOOLS_PER_SERVER_MAX: usize = 1_024;

/// What the upstream servers of a tools file offer: the tools of those that started and
/// listed tools that can be used, and the servers that are unavailable, with why.
///
/// A server that cannot be used makes only its own tools unavailable: never the built-in
/// tools, the command tools or another server's.
#[derive(Debug, Default)]
pub struct UpstreamTools {
    /// Each offered tool, with the timeout it declares.
    pub tools: Vec<(UpstreamTool, Option<u64>)>,
    /// The servers none of whose tools are offered, each with the reason.
    pub unavailable: Vec<Unavailable>,
}

/// An upstream server whose tools are not offered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable {
    /// The server's name in the tools file.
    pub server: String,
    /// Why: it did not start, did not answer in time, listed too many tools, or does not
    /// list a tool its declarations compensate with.
    pub reason: String,
}

/// The upstream tools of the tools file at `path`, their outputs bounded by
/// `output_bytes_max`: the servers are started and asked for their tools, all at once
/// (blocking the calling thread), and the offered ones (`tools` globs) made kernel tools, each server waited for at most its
/// `start_timeout_ms` (default [`SERVER_START_TIMEOUT`]).
///
/// # Errors
///
/// A message naming the file and the line when the file cannot be read or parsed; a server
/// that cannot be used is no error, but [`UpstreamTools::unavailable`].
pub fn upstream_tools(path: &Path, output_bytes_max: u64) -> Result<UpstreamTools, String> {
    let specs = load_servers(path).map_err(|error| error.to_string())?;
    Ok(tools_of(path, specs, output_bytes_max))
}

/// The upstream tools `text`, the content of the tools file at `path`, declares, as
/// [`upstream_tools`] makes them: for a caller that read the file once for its command
/// tools too.
///
/// # Errors
///
/// As [`upstream_tools`].
pub fn upstream_tools_of(
    path: &Path,
    text: &str,
    output_bytes_max: u64,
) -> Result<UpstreamTools, String> {
    let specs = parse_servers(path, text).map_err(|error| error.to_string())?;
    Ok(tools_of(path, specs, output_bytes_max))
}

/// The offered tools of the servers `specs` of the tools file at `path`.
fn tools_of(path: &Path, specs: Vec<ServerSpec>, output_bytes_max: u64) -> UpstreamTools {
    let mut offered = UpstreamTools::default();
    if specs.is_empty() {
        return offered;
    }
    let hub = match Hub::new(specs.clone()) {
        Ok(hub) => Arc::new(hub),
        Err(reason) => {
            offered.unavailable = specs
                .iter()
                .map(|spec| Unavailable {
                    server: spec.name.clone(),
                    reason: reason.clone(),
                })
                .collect();
            return offered;
        }
    };
    let names: Vec<String> = specs.iter().map(|spec| spec.name.clone()).collect();
    let listed = hub.list_all_tools_blocking(&names);
    for (spec, listed) in specs.iter().zip(listed) {
        match listed.and_then(|listed| usable(path, spec, listed)) {
            Ok(listed) => {
                for tool in listed {
                    let upstream =
                        UpstreamTool::new(spec, &tool, Arc::clone(&hub), output_bytes_max);
                    let timeout_ms = upstream.timeout_ms(spec);
                    offered.tools.push((upstream, timeout_ms));
                }
            }
            Err(reason) => {
                tracing::warn!(server = %spec.name, %reason, "upstream MCP server unavailable: its tools are not offered");
                offered.unavailable.push(Unavailable {
                    server: spec.name.clone(),
                    reason,
                });
            }
        }
    }
    offered
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
