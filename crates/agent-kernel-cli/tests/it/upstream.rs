//! Upstream MCP servers (reference §11) through the binary: another `agent-kernel mcp` (a real
//! MCP server over stdio, with its own log and sandbox) declared in `tools.toml`, its tools
//! offered as `files.TOOL`, each call a saga step compensated through the upstream server.

use std::fs;

use serde_json::json;

use crate::{Project, bin, describe};

/// A project whose tools file puts the binary's own MCP server, confined to `up/ws`, in
/// front as the upstream server `files`; `fs_write` is compensated by `fs_delete` on the
/// path it wrote (the files it writes are new; `missing_ok`, so that a compensation run
/// again after a lost answer succeeds), `fs_read` only reads, and `fs_append` is left
/// undeclared.
fn project() -> Project {
    project_with_server_options("")
}

/// [`project`], the upstream server started as `agent-kernel … mcp OPTIONS` (`options`: a
/// TOML list's items, each quoted, after a comma).
pub(crate) fn project_with_server_options(options: &str) -> Project {
    let project = Project::new();
    fs::create_dir_all(project.path("up/ws")).expect("creates up/ws");
    fs::write(project.path("up/sandbox.toml"), "[fs]\nallow = [\"ws\"]\n").expect("writes");
    // Its own tools file, so that it does not find this one (and start itself again).
    fs::write(project.path("up/tools.toml"), "").expect("writes");
    let tools = format!(
        r#"
[mcp_servers.files]
command = ["{bin}", "--db", "up/up.db", "--sandbox", "up/sandbox.toml", "--tools", "up/tools.toml", "-q", "mcp"{options}]

[mcp_servers.files.tool.fs_write]
effect = "mutating"
reversibility = "full"
compensate = {{ tool = "fs_delete", args = {{ args = {{ path = "$.args.args.path", missing_ok = true }} }} }}

[mcp_servers.files.tool.fs_read]
effect = "read-only"
"#,
        bin = bin().display()
    );
    fs::write(project.path("tools.toml"), tools).expect("writes tools.toml");
    project
}

/// A plan step writing `content` to `path` through the upstream server `files`.
pub(crate) fn write(path: &str, content: &str) -> serde_json::Value {
    json!({"tool": "files.fs_write", "args": {"args": {"path": path, "content": content}}})
}

#[test]
fn a_saga_of_upstream_calls_commits_and_one_that_fails_is_compensated_upstream() {
    let project = project();
    let (code, listed) = project.run_json(&["tools", "--upstream"]);
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

/// Runs a plan that writes `path` through the upstream server and then sleeps, and
/// SIGKILLs it once the write is made: its saga is left unfinished.
fn sigkill_after_upstream_write(project: &Project, path: &str, content: &str) {
    let plan = project.plan(
        "slow.json",
        &json!({"steps": [
            write(path, content),
            {"tool": "noop", "args": {"sleep_ms": 60000}},
        ]}),
    );
    let mut run = project
        .command(&["run", "--plan", plan.to_str().expect("utf-8")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawns");
    crate::wait_until("the upstream call was made", || project.path(path).exists());
    crate::sigkill(&mut run).expect("SIGKILL");
    run.wait().expect("reaped");
}

#[test]
fn after_a_sigkill_recover_compensates_through_a_freshly_started_server() {
    let project = project();
    sigkill_after_upstream_write(&project, "up/ws/e.txt", "epsilon");
    let (code, report) = project.run_json(&["recover"]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["sagas"][0]["action"], "rolled_back", "{report}");
    assert!(
        !project.path("up/ws/e.txt").exists(),
        "undone through a new server"
    );
}

/// A project whose upstream server is the binary's MCP server with its drill tools, for
/// faults: `fault_fail` answers `isError`, `noop` can be made to outlast its timeout, and
/// `fs_write`'s compensation is `fault_fail`, which always fails.
fn faulty(trust_annotations: bool) -> Project {
    let project = Project::new();
    fs::create_dir_all(project.path("up/ws")).expect("creates up/ws");
    fs::write(project.path("up/sandbox.toml"), "[fs]\nallow = [\"ws\"]\n").expect("writes");
    fs::write(project.path("up/tools.toml"), "").expect("writes");
    let tools = format!(
        r#"
[mcp_servers.faulty]
command = ["{bin}", "--db", "up/up.db", "--sandbox", "up/sandbox.toml", "--tools", "up/tools.toml", "-q", "mcp", "--drills"]
trust_annotations = {trust_annotations}

[mcp_servers.faulty.tool.fault_fail]
effect = "mutating"
compensate = {{ tool = "noop", args = {{ args = {{}} }} }}

[mcp_servers.faulty.tool.noop]
effect = "mutating"
timeout_ms = 500
compensate = {{ tool = "noop", args = {{ args = {{}} }} }}

[mcp_servers.faulty.tool.fs_write]
effect = "mutating"
compensate = {{ tool = "fault_fail", args = {{ args = {{}} }} }}
"#,
        bin = bin().display()
    );
    fs::write(project.path("tools.toml"), tools).expect("writes tools.toml");
    project
}

fn one_step(project: &Project, tool: &str, args: serde_json::Value) -> (i32, serde_json::Value) {
    let plan = project.plan(
        "plan.json",
        &json!({"steps": [{"tool": tool, "args": {"args": args}}]}),
    );
    project.run_json(&["run", "--plan", plan.to_str().expect("utf-8")])
}

#[test]
fn an_is_error_result_fails_the_step_and_a_timeout_is_settled_by_the_mapping() {
    let project = faulty(false);
    let (code, report) = one_step(&project, "faulty.fault_fail", json!({}));
    assert_eq!(code, 1, "{report}");
    let message = report["failure"]["error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(message.contains("answered an error"), "{report}");
    // A definite failure: the server said so.
    assert_eq!(
        report["failure"]["error"]["outcome"], "not_applied",
        "{report}"
    );

    // Past its timeout the outcome is unknown; the mapping reads only `$.args`, so the
    // compensation runs blindly through the server.
    let (code, report) = one_step(&project, "faulty.noop", json!({"sleep_ms": 5000}));
    assert_eq!(code, 1, "{report}");
    assert_eq!(report["failure"]["error"]["kind"], "timeout", "{report}");
    assert_eq!(report["steps"][0]["status"], "COMPENSATED", "{report}");
}

#[test]
fn a_compensation_that_fails_upstream_is_a_dead_letter() {
    let project = faulty(false);
    let plan = project.plan(
        "plan.json",
        &json!({"steps": [
            {"tool": "faulty.fs_write", "args": {"args": {"path": "up/ws/a.txt", "content": "x"}}},
            {"tool": "fault.fail", "args": {}},
        ]}),
    );
    let output = project.run(&["run", "--plan", plan.to_str().expect("utf-8")]);
    assert_eq!(output.status.code(), Some(3), "{}", describe(&output));
    let (code, listed) = project.run_json(&["dlq", "list"]);
    assert_eq!(code, 0, "{listed}");
    let letters = listed["dead_letters"].as_array().expect("a list");
    assert_eq!(letters.len(), 1, "{listed}");
    assert_eq!(letters[0]["tool"], "faulty.fs_write");
}

#[test]
fn annotations_count_only_when_trusted() {
    for (trust, needs_approval, effect) in [(false, true, "mutating"), (true, false, "read-only")] {
        let project = faulty(trust);
        let (code, listed) = project.run_json(&["tools", "--upstream"]);
        assert_eq!(code, 0, "{listed}");
        let read = listed["tools"]
            .as_array()
            .expect("tools")
            .iter()
            .find(|tool| tool["tool"] == "faulty.fs_read")
            .expect("listed")
            .clone();
        assert_eq!(
            read["effect"], effect,
            "trust_annotations = {trust}: {read}"
        );
        assert_eq!(read["needs_approval"], needs_approval, "{read}");
    }
}

/// The pids of the processes whose command line holds `needle`.
fn pids_with(needle: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in fs::read_dir("/proc").expect("lists /proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(cmdline) = fs::read(entry.path().join("cmdline"))
            && String::from_utf8_lossy(&cmdline).contains(needle)
        {
            pids.push(pid);
        }
    }
    pids
}

#[test]
fn a_server_that_dies_mid_call_leaves_the_outcome_unknown_and_is_started_again() {
    let project = faulty(false);
    let tools = fs::read_to_string(project.path("tools.toml")).expect("reads");
    // A log name of its own: the server to kill is found by it, among those of other tests.
    let tools = tools
        .replace("timeout_ms = 500", "timeout_ms = 60000")
        .replace("up/up.db", "up/crashing.db");
    fs::write(project.path("tools.toml"), tools).expect("writes");
    let plan = project.plan(
        "plan.json",
        &json!({"steps": [{"tool": "faulty.noop", "args": {"args": {"sleep_ms": 60000}}}]}),
    );
    let run = project
        .command(&["--json", "run", "--plan", plan.to_str().expect("utf-8")])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawns");
    // The upstream server is the process whose command line names its log.
    let needle = "up/crashing.db";
    crate::wait_until("the upstream call is under way", || {
        project.path("up/crashing.db").exists() && !pids_with(needle).is_empty()
    });
    // Give the call time to reach the server: its own log records the step's BEGIN.
    crate::wait_until("the upstream server began the step", || {
        fs::metadata(project.path("up/crashing.db-wal")).is_ok_and(|meta| meta.len() > 0)
    });
    for pid in pids_with(needle) {
        let _ = std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status();
    }
    let output = run.wait_with_output().expect("finishes");
    let (code, report) = crate::json_output(&output);
    assert_eq!(code, 1, "{}", describe(&output));
    let message = report["failure"]["error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(message.contains("lost"), "{report}");
    // Compensated through a server started again.
    assert_eq!(report["steps"][0]["status"], "COMPENSATED", "{report}");
}

#[test]
fn a_server_the_tools_file_no_longer_declares_leaves_a_dead_letter() {
    let project = project();
    sigkill_after_upstream_write(&project, "up/ws/f.txt", "phi");
    fs::write(project.path("tools.toml"), "").expect("the server is no longer declared");
    let output = project.run(&["recover"]);
    assert_eq!(output.status.code(), Some(3), "{}", describe(&output));
    let (code, listed) = project.run_json(&["dlq", "list"]);
    assert_eq!(code, 0, "{listed}");
    let letters = listed["dead_letters"].as_array().expect("a list");
    assert_eq!(letters.len(), 1, "{listed}");
    assert!(
        letters[0]["error"]
            .as_str()
            .is_some_and(|error| error.contains("no longer declares")),
        "{listed}"
    );
}

/// An upstream tool whose call outlasts its timeout is compensated only once the server
/// answered that call: a compensation sent at once would reach the server while the call
/// still runs there, and the effect would land after its rollback. The upstream server is
/// the binary's own MCP server, whose command tool `late.write` writes its file a second
/// after it starts; the kernel in front gives it 300 ms.
#[test]
fn a_call_past_its_timeout_is_compensated_only_after_the_server_answered_it() {
    let project = Project::new();
    fs::create_dir_all(project.path("up/ws")).expect("creates up/ws");
    fs::write(project.path("up/sandbox.toml"), "[fs]\nallow = [\"ws\"]\n").expect("writes");
    fs::write(
        project.path("up/tools.toml"),
        r#"
[tools."late.write"]
effect = "mutating"
settlement = "compensate"
execute = ["sh", "-c", "sleep 1; printf late > ws/late.txt; printf x > ws/write.ended"]
compensate = ["sh", "-c", "rm -f ws/late.txt"]
write = ["ws"]

[tools."late.erase"]
effect = "mutating"
settlement = "compensate"
execute = ["sh", "-c", "rm -f ws/late.txt"]
compensate = ["true"]
write = ["ws"]
"#,
    )
    .expect("writes");
    fs::write(
        project.path("tools.toml"),
        format!(
            r#"
[mcp_servers.late]
command = ["{bin}", "--db", "up/up.db", "--sandbox", "up/sandbox.toml", "--tools", "up/tools.toml", "-q", "mcp"]

[mcp_servers.late.tool.late_write]
effect = "mutating"
timeout_ms = 300
compensate = {{ tool = "late_erase", args = {{ args = {{}} }} }}
"#,
            bin = bin().display()
        ),
    )
    .expect("writes tools.toml");
    let mut server = crate::mcp::Raw::start(&project);
    let answer = server.call("late_late_write", json!({"args": {"args": {}}}));
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    let text = answer.to_string();
    assert!(text.contains("timed out"), "{answer}");
    crate::wait_until("the upstream program ended", || {
        project.path("up/ws/write.ended").exists()
    });
    assert!(
        !project.path("up/ws/late.txt").exists(),
        "the effect landed after its compensation: {answer}"
    );
    server.close();
}
