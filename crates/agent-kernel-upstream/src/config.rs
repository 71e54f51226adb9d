//! `[mcp_servers.NAME]` in `tools.toml` (reference §11), parsed strictly, every problem
//! naming its line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use agent_kernel_api::{
    EffectClass, KeyTemplate, Reversibility, Settlement, UndoWindow, line_of, parse_templates,
    read_text_bounded,
};
use glob::Pattern;
use serde::Deserialize;
use serde_json::Value;
use toml::Spanned;

use crate::mapping::Mapping;

/// The largest tools file read for its servers, in bytes.
pub const SERVERS_FILE_BYTES_MAX: usize = 1024 * 1024;

/// The most upstream servers one tools file declares.
pub const UPSTREAM_SERVERS_MAX: usize = 64;
/// The longest `start_timeout_ms` a server may declare (ten minutes).
pub const SERVER_START_TIMEOUT_MS_MAX: u64 = 600_000;

/// Why the servers of a tools file cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}{}: {message}", .line.map(|line| format!(", line {line}")).unwrap_or_default())]
pub struct ServersFileError {
    /// The file.
    pub path: String,
    /// The 1-based line, when the problem is on one.
    pub line: Option<usize>,
    /// What is wrong.
    pub message: String,
}

/// One upstream server as declared.
#[derive(Debug, Clone)]
pub struct ServerSpec {
    /// Its name: the part of its tools' ids before the dot.
    pub name: String,
    /// The program and its arguments (a relative program path is the tools file's folder's).
    pub command: Vec<String>,
    /// The variables set for it; all others are cleared but `PATH` and `HOME`.
    pub env: BTreeMap<String, String>,
    /// Where it runs: the tools file's folder.
    pub folder: PathBuf,
    /// Which of its tools are offered.
    pub tools: Vec<Pattern>,
    /// Whether its `readOnlyHint` and `idempotentHint` count for undeclared tools.
    pub trust_annotations: bool,
    /// The timeout of its calls, when it sets one.
    pub timeout_ms: Option<u64>,
    /// How long it may take to start, answer `initialize` and list its tools
    /// (`start_timeout_ms`, default [`SERVER_START_TIMEOUT`](crate::SERVER_START_TIMEOUT),
    /// at most [`SERVER_START_TIMEOUT_MS_MAX`]).
    pub start_timeout: std::time::Duration,
    /// Its tools' declarations, by upstream tool name.
    pub declared: BTreeMap<String, ToolDecl>,
}

/// What the tools file says of one upstream tool.
#[derive(Debug, Clone)]
pub struct ToolDecl {
    /// Its effect class.
    pub effect: EffectClass,
    /// How far its compensation restores the world.
    pub reversibility: Reversibility,
    /// Whether the kernel may retry it.
    pub idempotent: bool,
    /// How a call of unknown outcome is settled, when the file says.
    pub settlement: Option<Settlement>,
    /// Its own timeout.
    pub timeout_ms: Option<u64>,
    /// Its own undo window.
    pub undo_window: Option<UndoWindow>,
    /// Its compensation: another tool of the same server, with mapped arguments.
    pub compensate: Option<Compensation>,
    /// What a call touches (`resources`), for the kernel's locks.
    pub resources: Vec<KeyTemplate>,
    /// What makes two calls one effect (`duplicate_keys`).
    pub duplicate_keys: Vec<KeyTemplate>,
}

/// `compensate = { tool = "…", args = { … } }`.
#[derive(Debug, Clone)]
pub struct Compensation {
    /// The server's tool that undoes the call.
    pub tool: String,
    /// Its arguments, built from `{"args": …, "output": …}` of the step.
    pub args: Mapping,
    /// The 1-based line of the tool's declaration in the tools file.
    pub line: usize,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    mcp_servers: BTreeMap<String, Spanned<RawServer>>,
    /// The command tools, which `agent-kernel-tools` reads.
    #[serde(default)]
    #[allow(dead_code)]
    tools: Option<toml::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    command: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    tools: Option<Vec<String>>,
    #[serde(default)]
    trust_annotations: bool,
    timeout_ms: Option<u64>,
    start_timeout_ms: Option<u64>,
    #[serde(default)]
    tool: BTreeMap<String, Spanned<RawDecl>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDecl {
    effect: EffectClass,
    reversibility: Option<Reversibility>,
    #[serde(default)]
    idempotent: bool,
    settlement: Option<Settlement>,
    timeout_ms: Option<u64>,
    undo_window: Option<String>,
    compensate: Option<RawCompensation>,
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    duplicate_keys: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCompensation {
    tool: String,
    #[serde(default)]
    args: toml::Table,
}

/// The upstream servers the tools file at `path` declares (none when it declares none).
///
/// # Errors
///
/// A [`ServersFileError`] naming the line: TOML syntax, an unknown key, an empty command,
/// a server name with a dot, an invalid glob, JSONPath or undo window, a mutating tool with
/// neither `compensate` nor `reversibility = "none"`, a `probe` settlement (upstream tools
/// have no probe).
pub fn load_servers(path: &Path) -> Result<Vec<ServerSpec>, ServersFileError> {
    let text = std::fs::File::open(path)
        .map_err(|io| format!("cannot read it: {io}"))
        .and_then(|file| {
            read_text_bounded(file, SERVERS_FILE_BYTES_MAX).map_err(|error| error.to_string())
        })
        .map_err(|message| ServersFileError {
            path: path.display().to_string(),
            line: None,
            message,
        })?;
    parse_servers(path, &text)
}

/// The upstream servers `text`, the content of the tools file at `path`, declares, as
/// [`load_servers`] reads them; `path` names the file in errors, and its folder is the one
/// servers' programs resolve against.
///
/// # Errors
///
/// As [`load_servers`], but for reading the file.
pub fn parse_servers(path: &Path, text: &str) -> Result<Vec<ServerSpec>, ServersFileError> {
    let shown = path.display().to_string();
    let error = |line: Option<usize>, message: String| ServersFileError {
        path: shown.clone(),
        line,
        message,
    };
    if text.len() > SERVERS_FILE_BYTES_MAX {
        return Err(error(
            None,
            format!("it is more than {SERVERS_FILE_BYTES_MAX} bytes"),
        ));
    }
    let file: File = toml::from_str(text).map_err(|parse| {
        let line = parse.span().map(|span| line_of(text, span.start));
        error(line, parse.message().to_owned())
    })?;
    if file.mcp_servers.len() > UPSTREAM_SERVERS_MAX {
        return Err(error(
            None,
            format!("it declares more than {UPSTREAM_SERVERS_MAX} MCP servers"),
        ));
    }
    let folder = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut servers = Vec::new();
    for (name, raw) in file.mcp_servers {
        let line = Some(line_of(text, raw.span().start));
        let raw = raw.into_inner();
        if name.is_empty() || name.contains('.') || name.chars().any(char::is_control) {
            return Err(error(
                line,
                format!("MCP server name `{name}` must be non-empty, without a dot"),
            ));
        }
        if raw.command.first().is_none_or(String::is_empty) {
            return Err(error(
                line,
                format!("[mcp_servers.{name}] command must name a program"),
            ));
        }
        let tools = raw
            .tools
            .unwrap_or_else(|| vec!["*".to_owned()])
            .into_iter()
            .map(|glob| {
                Pattern::new(&glob).map_err(|err| {
                    error(
                        line,
                        format!("[mcp_servers.{name}] tools: `{glob}` is not a valid glob: {err}"),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut declared = BTreeMap::new();
        for (tool, decl) in raw.tool {
            let decl_line = line_of(text, decl.span().start);
            let line = Some(decl_line);
            let decl = decl.into_inner();
            let at = |message: String| {
                error(line, format!("[mcp_servers.{name}.tool.{tool}] {message}"))
            };
            if decl.settlement == Some(Settlement::Probe) {
                return Err(at(
                    "settlement `probe` needs a probe, which upstream tools have not".into(),
                ));
            }
            let reversibility = decl.reversibility.unwrap_or(match decl.effect {
                EffectClass::ReadOnly => Reversibility::Full,
                _ if decl.compensate.is_some() => Reversibility::Full,
                _ => Reversibility::None,
            });
            if decl.effect == EffectClass::Mutating
                && decl.compensate.is_none()
                && reversibility != Reversibility::None
            {
                return Err(at(
                    "a mutating tool needs `compensate`, or `reversibility = \"none\"`".into(),
                ));
            }
            let undo_window = decl
                .undo_window
                .as_deref()
                .map(str::parse::<UndoWindow>)
                .transpose()
                .map_err(|err| at(format!("undo_window: {err}")))?;
            let resources = parse_templates("resources", &decl.resources).map_err(&at)?;
            if !resources.is_empty() && decl.effect == EffectClass::ReadOnly {
                return Err(at(
                    "`resources` is for mutating tools: a read-only call claims nothing".into(),
                ));
            }
            let duplicate_keys =
                parse_templates("duplicate_keys", &decl.duplicate_keys).map_err(&at)?;
            if !duplicate_keys.is_empty() && reversibility == Reversibility::Full {
                return Err(at(
                    "`duplicate_keys` is for tools of reversibility \"none\" or \"partial\"".into(),
                ));
            }
            let compensate = decl
                .compensate
                .map(|raw| {
                    if raw.tool.is_empty() {
                        return Err(at("compensate.tool is empty".into()));
                    }
                    let args =
                        serde_json::to_value(toml::Value::Table(raw.args)).unwrap_or(Value::Null);
                    Mapping::new(args)
                        .map(|args| Compensation {
                            tool: raw.tool,
                            args,
                            line: decl_line,
                        })
                        .map_err(|error| at(format!("compensate.args: {}", error.message())))
                })
                .transpose()?;
            declared.insert(
                tool,
                ToolDecl {
                    effect: decl.effect,
                    reversibility,
                    idempotent: decl.idempotent,
                    settlement: decl.settlement,
                    timeout_ms: decl.timeout_ms,
                    undo_window,
                    compensate,
                    resources,
                    duplicate_keys,
                },
            );
        }
        let start_timeout = match raw.start_timeout_ms {
            None => crate::SERVER_START_TIMEOUT,
            Some(ms) if (1..=SERVER_START_TIMEOUT_MS_MAX).contains(&ms) => {
                std::time::Duration::from_millis(ms)
            }
            Some(ms) => {
                return Err(error(
                    line,
                    format!(
                        "[mcp_servers.{name}] start_timeout_ms = {ms} is outside 1..={SERVER_START_TIMEOUT_MS_MAX}"
                    ),
                ));
            }
        };
        servers.push(ServerSpec {
            start_timeout,
            name,
            command: raw.command,
            env: raw.env,
            folder: folder.clone(),
            tools,
            trust_annotations: raw.trust_annotations,
            timeout_ms: raw.timeout_ms,
            declared,
        });
    }
    Ok(servers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<Vec<ServerSpec>, ServersFileError> {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("tools.toml");
        std::fs::write(&path, text).expect("writes");
        load_servers(&path)
    }

    #[test]
    fn a_server_with_declared_tools_loads() {
        let servers = load(
            r#"
[tools."x.y"]
effect = "read-only"
settlement = "compensate"
execute = ["true"]

[mcp_servers.memory]
command = ["npx", "-y", "@modelcontextprotocol/server-memory"]
env = { MEMORY_FILE_PATH = "data/memory.json" }

[mcp_servers.memory.tool.create_entities]
effect = "mutating"
compensate = { tool = "delete_entities", args = { entityNames = "$.output.entities[*].name" } }

[mcp_servers.memory.tool.read_graph]
effect = "read-only"
"#,
        )
        .expect("loads");
        assert_eq!(servers.len(), 1);
        let memory = &servers[0];
        assert_eq!(memory.env["MEMORY_FILE_PATH"], "data/memory.json");
        assert!(memory.tools[0].matches("anything"), "all tools by default");
        let create = &memory.declared["create_entities"];
        assert_eq!(create.reversibility, Reversibility::Full);
        assert!(
            create
                .compensate
                .as_ref()
                .expect("compensated")
                .args
                .reads_output()
        );
        assert_eq!(memory.declared["read_graph"].effect, EffectClass::ReadOnly);
        assert!(load("").expect("loads").is_empty());
    }

    #[test]
    fn every_problem_names_its_line() {
        let cases = [
            (
                "[mcp_servers.a]\ncommand = [\"x\"]\ncolour = 1\n",
                3,
                "unknown field",
            ),
            ("[mcp_servers.a]\ncommand = []\n", 1, "must name a program"),
            (
                "[mcp_servers.\"a.b\"]\ncommand = [\"x\"]\n",
                1,
                "without a dot",
            ),
            (
                "[mcp_servers.a]\ncommand = [\"x\"]\n\n[mcp_servers.a.tool.t]\neffect = \"mutating\"\nreversibility = \"full\"\n",
                4,
                "needs `compensate`",
            ),
            (
                "[mcp_servers.a]\ncommand = [\"x\"]\n\n[mcp_servers.a.tool.t]\neffect = \"mutating\"\ncompensate = { tool = \"u\", args = { x = \"$.args[?\" } }\n",
                4,
                "is not a JSONPath query",
            ),
            (
                "[mcp_servers.a]\ncommand = [\"x\"]\n\n[mcp_servers.a.tool.t]\neffect = \"read-only\"\nsettlement = \"probe\"\n",
                4,
                "needs a probe",
            ),
        ];
        for (text, line, fragment) in cases {
            let error = load(text).expect_err(text);
            assert_eq!(error.line, Some(line), "{error}");
            assert!(error.message.contains(fragment), "{error}");
        }
    }
}
