//! Crates depend strictly downward: `api` → (`txlog`, `sandbox`, `fsm`) → (`dispatcher`,
//! `tools`, `upstream`) → `core` (the engine) → `agent-kernel` (the front door) → `cli`.

use std::collections::BTreeMap;
use std::process::Command;

use serde_json::Value;

/// The tier of each workspace crate; an edge may only point to a lower tier.
/// Same-tier edges must be listed in `ALLOWED_SAME_TIER` and in ARCHITECTURE.md.
fn tier(name: &str) -> Option<u32> {
    match name {
        "agent-kernel-api" => Some(0),
        // The log's contract as checks, over the api alone; each backend's tests run them.
        "agent-kernel-log-contract" => Some(1),
        "agent-kernel-txlog" | "agent-kernel-sandbox" | "agent-kernel-fsm" => Some(1),
        // The second backend of the log: txlog's records over a PostgreSQL connection.
        "agent-kernel-txlog-postgres" => Some(1),
        "agent-kernel-dispatcher" | "agent-kernel-tools" | "agent-kernel-upstream" => Some(2),
        // The engine: api, fsm and dispatcher alone (see the test below).
        "agent-kernel-core" => Some(3),
        // The front door: wires the engine to a log, a policy and tools.
        "agent-kernel" => Some(4),
        // The MCP server: a front end over core's live sagas, below the binary.
        "agent-kernel-mcp" => Some(4),
        // Sagas as OpenTelemetry traces: beside the MCP server, over the log's records.
        "agent-kernel-otel" => Some(4),
        // The binary and the Python package's native module: two front ends over core.
        "agent-kernel-cli" | "agent-kernel-py" => Some(5),
        // Examples and the eval suite stand above everything, as any user of the crates does.
        "live-ledger" | "agent-kernel-evals" => Some(6),
        // The simulator: a dev tool over the engine and the SQLite log, never a dependency.
        "agent-kernel-sim" => Some(6),
        _ => None,
    }
}

/// Same-tier edges written down in ARCHITECTURE.md.
const ALLOWED_SAME_TIER: &[(&str, &str)] = &[("agent-kernel-txlog-postgres", "agent-kernel-txlog")];

/// The workspace's packages, from `cargo metadata`.
fn workspace_packages() -> Vec<Value> {
    let output = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: Value = serde_json::from_slice(&output.stdout).expect("parses");
    metadata["packages"].as_array().expect("packages").clone()
}

/// The workspace crates `package` depends on, dev-dependencies left out.
fn normal_dependencies<'a>(packages: &'a [Value], package: &str) -> Vec<&'a str> {
    let package = packages
        .iter()
        .find(|candidate| candidate["name"] == package)
        .unwrap_or_else(|| panic!("no package {package}"));
    let mut names: Vec<&str> = package["dependencies"]
        .as_array()
        .expect("dependencies")
        .iter()
        .filter(|dependency| dependency["kind"].is_null())
        .filter_map(|dependency| dependency["name"].as_str())
        .filter(|name| tier(name).is_some())
        .collect();
    names.sort_unstable();
    names
}

/// The engine sees traits: no log backend, sandbox, tool or MCP crate of ours.
#[test]
fn the_engine_depends_on_api_fsm_and_dispatcher_alone() {
    let packages = workspace_packages();
    assert_eq!(
        normal_dependencies(&packages, "agent-kernel-core"),
        [
            "agent-kernel-api",
            "agent-kernel-dispatcher",
            "agent-kernel-fsm"
        ]
    );
}

/// The binary, the Python package and the evals build their kernels through the front
/// door, never by wiring the engine themselves.
#[test]
fn front_ends_build_kernels_through_the_front_door() {
    let packages = workspace_packages();
    for front_end in ["agent-kernel-cli", "agent-kernel-py", "agent-kernel-evals"] {
        let dependencies = normal_dependencies(&packages, front_end);
        assert!(
            dependencies.contains(&"agent-kernel"),
            "{front_end}: {dependencies:?}"
        );
        assert!(
            !dependencies.contains(&"agent-kernel-core"),
            "{front_end} names the engine directly: {dependencies:?}"
        );
    }
}

#[test]
fn no_crate_depends_on_a_crate_above_it() {
    let packages = workspace_packages();
    let mut edges = BTreeMap::new();
    for package in &packages {
        let name = package["name"].as_str().expect("name");
        let from = tier(name).unwrap_or_else(|| {
            panic!("workspace crate `{name}` has no tier: add it to this test and ARCHITECTURE.md")
        });
        for dependency in package["dependencies"].as_array().expect("dependencies") {
            let target = dependency["name"].as_str().expect("name");
            let is_dev = dependency["kind"].as_str() == Some("dev");
            let Some(to) = tier(target) else { continue };
            edges.insert((name.to_owned(), target.to_owned()), (from, to, is_dev));
        }
    }
    assert!(!edges.is_empty(), "the workspace has internal edges");
    for ((from_name, to_name), (from, to, is_dev)) in &edges {
        let allowed = to < from
            || (to == from && ALLOWED_SAME_TIER.contains(&(from_name.as_str(), to_name.as_str())))
            // A dev-dependency may reach sideways or down for test fixtures, never up.
            || (*is_dev && to <= from);
        assert!(
            allowed,
            "`{from_name}` (tier {from}) depends on `{to_name}` (tier {to}): edges must point down"
        );
    }
}

/// The top-level modules of the crate in `crates/NAME/src` that each one names with
/// `crate::MODULE` (comments left out), as a graph.
fn module_graph(crate_dir: &str) -> BTreeMap<String, std::collections::BTreeSet<String>> {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(crate_dir)
        .join("src");
    let mut files = Vec::new();
    let mut folders = vec![src.clone()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).expect("src is readable") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                files.push(path);
            }
        }
    }
    let mut graph: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
    for path in files {
        let relative = path.strip_prefix(&src).expect("under src");
        let first = relative.components().next().expect("a component");
        let module = first
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_owned();
        if module == "lib" || module == "main" {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("a source file");
        let edges = graph.entry(module.clone()).or_default();
        for line in text.lines() {
            let code = line.split("//").next().unwrap_or_default();
            // `crate::a::b`, and `use crate::{a, b::c}` groups.
            let mut named: Vec<&str> = code
                .split("crate::")
                .skip(1)
                .map(|rest| {
                    rest.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                        .next()
                        .unwrap_or_default()
                })
                .collect();
            if let Some(group) = code.split("crate::{").nth(1) {
                named.extend(
                    group
                        .split(',')
                        .map(|item| item.trim().split("::").next().unwrap_or_default()),
                );
            }
            edges.extend(
                named
                    .into_iter()
                    .filter(|name| !name.is_empty() && *name != module)
                    .map(str::to_owned),
            );
        }
    }
    // A name the crate's root re-exports (`crate::AuditHead`) stands for its module.
    let reexports = root_reexports(&std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs"));
    let modules: std::collections::BTreeSet<String> = graph.keys().cloned().collect();
    for (module, edges) in &mut graph {
        *edges = edges
            .iter()
            .map(|name| reexports.get(name).unwrap_or(name).clone())
            .filter(|name| modules.contains(name) && name != module)
            .collect();
    }
    graph
}

/// The names `lib.rs` re-exports (`pub use verify::{AuditReport, …};`), each with the
/// module it comes from.
fn root_reexports(lib: &str) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    for statement in lib.split(';') {
        let statement = statement.trim();
        let Some(path) = statement
            .strip_prefix("pub use ")
            .or_else(|| statement.strip_prefix("pub(crate) use "))
        else {
            continue;
        };
        let module = path
            .split("::")
            .next()
            .unwrap_or_default()
            .trim()
            .to_owned();
        let items = match path.split_once('{') {
            Some((_, group)) => group.trim_end_matches('}').to_owned(),
            None => path.rsplit("::").next().unwrap_or_default().to_owned(),
        };
        for item in items.split(',') {
            let name = item.split(" as ").last().unwrap_or_default().trim();
            let name = name.rsplit("::").next().unwrap_or_default();
            if !name.is_empty() {
                names.insert(name.to_owned(), module.clone());
            }
        }
    }
    names
}

/// A cycle among `graph`'s modules, if there is one, as the path around it.
fn a_cycle(graph: &BTreeMap<String, std::collections::BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        module: &str,
        graph: &BTreeMap<String, std::collections::BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut std::collections::BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|seen| seen == module) {
            let mut cycle = path[at..].to_vec();
            cycle.push(module.to_owned());
            return Some(cycle);
        }
        if done.contains(module) {
            return None;
        }
        path.push(module.to_owned());
        for next in &graph[module] {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(module.to_owned());
        None
    }
    let mut done = std::collections::BTreeSet::new();
    graph
        .keys()
        .find_map(|module| visit(module, graph, &mut Vec::new(), &mut done))
}

/// Inside the engine and the log, modules name each other in one direction only: no
/// module reaches, through others, back to itself.
#[test]
fn the_modules_of_the_engine_and_the_log_import_each_other_in_no_circle() {
    for crate_dir in ["agent-kernel-core", "agent-kernel-txlog"] {
        let graph = module_graph(crate_dir);
        assert!(graph.len() > 5, "{crate_dir}: {graph:?}");
        assert_eq!(a_cycle(&graph), None, "{crate_dir}");
    }
    // The check finds a circle when there is one.
    let circle: BTreeMap<String, std::collections::BTreeSet<String>> =
        [("a", vec!["b"]), ("b", vec!["c"]), ("c", vec!["a"])]
            .into_iter()
            .map(|(name, edges)| {
                (
                    name.to_owned(),
                    edges.into_iter().map(str::to_owned).collect(),
                )
            })
            .collect();
    assert_eq!(
        a_cycle(&circle),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
}
