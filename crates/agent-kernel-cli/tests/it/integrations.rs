//! The distribution files (`.claude-plugin/`, `integrations/`) parse, name the workspace's
//! version, and start `agent-kernel … mcp` with arguments the binary accepts.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the repository root")
}

fn json_file(rel: &str) -> Value {
    let path = root().join(rel);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|error| panic!("{rel}: {error}"))
}

/// The binary accepts `args` (with `--help` after the subcommand, so nothing runs).
fn assert_accepted(origin: &str, args: &[String]) {
    assert_eq!(
        args.last().map(String::as_str),
        Some("mcp"),
        "{origin}: ends in `mcp`"
    );
    let output = Command::new(crate::bin())
        .args(args)
        .arg("--help")
        .output()
        .expect("the binary runs");
    assert!(
        output.status.success(),
        "{origin}: `agent-kernel {}` is refused: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Every `mcpServers` entry of a client configuration starts the kernel's MCP server.
fn check_mcp_servers(rel: &str) {
    let document = json_file(rel);
    let servers = document["mcpServers"]
        .as_object()
        .unwrap_or_else(|| panic!("{rel}: no mcpServers"));
    let server = &servers["agent-kernel"];
    assert_eq!(server["command"], "agent-kernel", "{rel}");
    let args: Vec<String> = server["args"]
        .as_array()
        .unwrap_or_else(|| panic!("{rel}: no args"))
        .iter()
        .map(|arg| arg.as_str().expect("text").to_owned())
        .collect();
    assert_accepted(rel, &args);
}

#[test]
fn the_marketplace_and_its_plugin_carry_the_workspace_version() {
    let version = env!("CARGO_PKG_VERSION");
    let marketplace = json_file(".claude-plugin/marketplace.json");
    assert_eq!(marketplace["name"], "agent-kernel");
    assert!(marketplace["owner"]["name"].is_string());
    let plugins = marketplace["plugins"].as_array().expect("plugins");
    assert_eq!(plugins.len(), 1);
    let plugin = &plugins[0];
    assert_eq!(plugin["version"], version, "marketplace.json drifted");
    assert!(
        plugin["description"]
            .as_str()
            .is_some_and(|text| !text.is_empty())
    );
    let source = plugin["source"].as_str().expect("a source folder");
    let source = source.trim_start_matches("./");
    let manifest = json_file(&format!("{source}/.claude-plugin/plugin.json"));
    assert_eq!(manifest["name"], plugin["name"]);
    assert_eq!(manifest["version"], version, "plugin.json drifted");
    check_mcp_servers(&format!("{source}/.mcp.json"));
}

#[test]
fn every_client_snippet_starts_the_mcp_server_with_arguments_it_accepts() {
    for rel in [
        "integrations/claude-code/.mcp.json",
        "integrations/cursor/.cursor/mcp.json",
        "integrations/claude-desktop/claude_desktop_config.json",
    ] {
        check_mcp_servers(rel);
    }
    assert_accepted("integrations/claude-code/add.sh", &add_sh_args("/tmp"));
}

/// The arguments `integrations/claude-code/add.sh` gives `agent-kernel` (`claude mcp add
/// NAME -- agent-kernel ARGS…`), run in the folder `pwd`.
pub(crate) fn add_sh_args(pwd: &str) -> Vec<String> {
    let script = std::fs::read_to_string(root().join("integrations/claude-code/add.sh"))
        .expect("reads add.sh");
    let line = script
        .lines()
        .find(|line| line.starts_with("claude mcp add"))
        .expect("a `claude mcp add` line");
    let (_, command) = line.split_once(" -- ").expect("`--` before the command");
    let mut words = command
        .split_whitespace()
        .map(|word| word.trim_matches('"').replace("$PWD", pwd));
    assert_eq!(words.next().as_deref(), Some("agent-kernel"));
    words.collect()
}

#[test]
fn the_readme_adds_the_server_as_the_snippets_do() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("reads README.md");
    let line = readme
        .lines()
        .find(|line| line.starts_with("claude mcp add agent-kernel"))
        .expect("the README's `claude mcp add` line");
    let (_, command) = line.split_once(" -- ").expect("`--` before the command");
    let args: Vec<String> = command
        .split_whitespace()
        .skip(1)
        .map(|word| word.trim_matches('"').replace("$PWD", "/tmp"))
        .collect();
    assert_accepted("README.md", &args);
}
