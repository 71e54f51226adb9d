//! Upstream MCP servers (CONTRACT §11) through the binary: another `agent-kernel mcp` (a real
//! MCP server over stdio, with its own log and sandbox) declared in `tools.toml`, its tools
//! offered as `files.TOOL`, each call a saga step compensated through the upstream server.

use std::fs;

use serde_json::json;

use crate::{Project, bin, describe};

/// A project whose tools file puts the binary's own MCP server, confined to `up/ws`, in
/// front as the upstream server `files`; `fs_write` is compensated by `fs_delete` on the
/// path it wrote (the files it writes are new), `fs_read` only reads, and `fs_append` is
/// left undeclared.
fn project() -> Project {
    let project = Project::new();
    fs::create_dir_all(project.path("up/ws")).expect("creates up/ws");
    fs::write(project.path("up/sandbox.toml"), "[fs]\nallow = [\"ws\"]\n").expect("writes");
    // Its own tools file, so that it does not find this one (and start itself again).
    fs::write(project.path("up/tools.toml"), "").expect("writes");
    let tools = format!(
        r#"
[mcp_servers.files]
command = ["{bin}", "--db", "up/up.db", "--sandbox", "up/sandbox.toml", "--tools", "up/tools.toml", "-q", "mcp"]

[mcp_servers.files.tool.fs_write]
effect = "mutating"
reversibility = "full"
compensate = {{ tool = "fs_delete", args = {{ args = {{ path = "$.args.args.path" }} }} }}

[mcp_servers.files.tool.fs_read]
effect = "read-only"
"#,
        bin = bin().display()
    );
    fs::write(project.path("tools.toml"), tools).expect("writes tools.toml");
    project
}

fn write(path: &str, content: &str) -> serde_json::Value {
    json!({"tool": "files.fs_write", "args": {"args": {"path": path, "content": content}}})
}

#[test]
fn a_saga_of_upstream_calls_commits_and_one_that_fails_is_compensated_upstream() {
    let project = project();
    let (code, listed) = project.run_json(&["tools"]);
    assert_eq!(code, 0, "{listed}");
    let ids: Vec<&str> = listed["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|tool| tool["tool"].as_str())
        .collect();
    assert!(
        ids.contains(&"files.fs_write") && ids.contains(&"files.fs_read"),
        "{ids:?}"
    );
    let read = listed["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .find(|tool| tool["tool"] == "files.fs_read")
        .expect("listed");
    assert_eq!(read["effect"], "read-only");

    let plan = project.plan(
        "ok.json",
        &json!({"steps": [
            write("up/ws/a.txt", "alpha"),
            write("up/ws/b.txt", "beta"),
            {"tool": "files.fs_read", "args": {"args": {"path": "up/ws/a.txt"}}},
        ]}),
    );
    let (code, report) = project.run_json(&["run", "--plan", plan.to_str().expect("utf-8")]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["state"], "Done");
    assert_eq!(
        fs::read_to_string(project.path("up/ws/b.txt")).expect("reads"),
        "beta"
    );
    assert_eq!(
        report["steps"][2]["output"]["data"]["output"]["content"], "alpha",
        "{report}"
    );

    let plan = project.plan(
        "fails.json",
        &json!({"steps": [
            write("up/ws/c.txt", "gamma"),
            write("up/ws/d.txt", "delta"),
            {"tool": "fault.fail", "args": {}},
        ]}),
    );
    let output = project.run(&["run", "--plan", plan.to_str().expect("utf-8")]);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert!(
        !project.path("up/ws/c.txt").exists(),
        "compensated through the upstream server"
    );
    assert!(!project.path("up/ws/d.txt").exists());
    assert!(
        project.path("up/ws/a.txt").exists(),
        "the earlier saga's files stay"
    );
    let (code, audit) = project.run_json(&["audit", "verify"]);
    assert_eq!(code, 0, "{audit}");
}

#[test]
fn a_call_of_an_undeclared_upstream_tool_waits_for_an_approval() {
    let project = project();
    let plan = project.plan(
        "append.json",
        &json!({"steps": [
            {"tool": "files.fs_append", "args": {"args": {"path": "up/ws/log.txt", "content": "x"}}},
        ]}),
    );
    let (code, report) =
        project.run_json(&["run", "--no-wait", "--plan", plan.to_str().expect("utf-8")]);
    assert_eq!(code, 5, "{report}");
    assert_eq!(report["approval"]["tool"], "files.fs_append");
    assert!(!project.path("up/ws/log.txt").exists(), "nothing ran");
}

#[test]
fn after_a_sigkill_recover_compensates_through_a_freshly_started_server() {
    let project = project();
    let plan = project.plan(
        "slow.json",
        &json!({"steps": [
            write("up/ws/e.txt", "epsilon"),
            {"tool": "noop", "args": {"sleep_ms": 60000}},
        ]}),
    );
    let mut run = project
        .command(&["run", "--plan", plan.to_str().expect("utf-8")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawns");
    crate::wait_until("the upstream call was made", || {
        project.path("up/ws/e.txt").exists()
    });
    run.kill().expect("SIGKILL");
    run.wait().expect("reaped");
    let (code, report) = project.run_json(&["recover"]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["sagas"][0]["action"], "rolled_back", "{report}");
    assert!(
        !project.path("up/ws/e.txt").exists(),
        "undone through a new server"
    );
}
