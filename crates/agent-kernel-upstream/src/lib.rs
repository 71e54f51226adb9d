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
    Compensation, SERVERS_FILE_BYTES_MAX, ServerSpec, ServersFileError, ToolDecl,
    UPSTREAM_SERVERS_MAX, load_servers, parse_servers,
};
pub use hub::{CallError, Hub, SERVER_START_TIMEOUT, SERVER_STARTS_MAX};
pub use mapping::Mapping;
pub use tool::UpstreamTool;

/// The upstream tools of the tools file at `path`, each with the timeout it declares, their
/// outputs bounded by `output_bytes_max`: the servers are started and asked for their tools
/// (blocking the calling thread), and the offered ones (`tools` globs) made kernel tools.
/// None when the file declares no server.
///
/// # Errors
///
/// A message naming the file, the server and the problem.
pub fn upstream_tools(
    path: &Path,
    output_bytes_max: u64,
) -> Result<Vec<(UpstreamTool, Option<u64>)>, String> {
    let specs = load_servers(path).map_err(|error| error.to_string())?;
    tools_of(path, specs, output_bytes_max)
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
) -> Result<Vec<(UpstreamTool, Option<u64>)>, String> {
    let specs = parse_servers(path, text).map_err(|error| error.to_string())?;
    tools_of(path, specs, output_bytes_max)
}

/// The offered tools of the servers `specs` of the tools file at `path`.
fn tools_of(
    path: &Path,
    specs: Vec<ServerSpec>,
    output_bytes_max: u64,
) -> Result<Vec<(UpstreamTool, Option<u64>)>, String> {
    if specs.is_empty() {
        return Ok(Vec::new());
    }
    let hub = Arc::new(Hub::new(specs.clone())?);
    let mut tools = Vec::new();
    for spec in &specs {
        let listed = hub
            .list_tools_blocking(&spec.name)
            .map_err(|message| format!("{}: {message}", path.display()))?;
        for tool in listed {
            if !spec.tools.iter().any(|glob| glob.matches(&tool.name)) {
                continue;
            }
            let upstream = UpstreamTool::new(spec, &tool, Arc::clone(&hub), output_bytes_max);
            let timeout_ms = upstream.timeout_ms(spec);
            tools.push((upstream, timeout_ms));
        }
    }
    Ok(tools)
}
