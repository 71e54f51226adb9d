//! Nothing outside can block recovery: an upstream MCP server that never initializes,
//! exits at once, lists 2,000 tools, a tool whose id a built-in has, or a tool with an
//! invalid schema makes only its own tools unavailable. `recover` settles every other saga
//! and leaves the sagas that need a broken server as dead letters naming it (exit 3);
//! `run` of a plan without its tools succeeds. And an upstream compensation that would
//! undo nothing (a mapping that matches nothing, a compensating tool the server does not
//! list) is never reported done.

use std::fs;
use std::process::Stdio;

use serde_json::{Value, json};

use crate::{Project, describe};

/// A minimal MCP server over stdio (JSON-RPC lines), by mode, that notes each start in
/// `ws/starts.log`: `good` lists `put` and `del` and logs every call to `ws/upstream.log`; `hang` never answers `initialize`; `exit`
/// exits at once; `many` lists 2,000 tools; `collide` also lists `write`; `badschema` also
/// lists a tool whose input schema is not a JSON Schema.
const FAKE_SERVER_PY: &str = r#"
import json, sys, time
mode = sys.argv[1]
with open("ws/starts.log", "a") as starts:
    starts.write(mode + "\n")
if mode == "exit":
    sys.exit(1)
def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()
schema = {"type": "object", "properties": {"key": {"type": "string"}}}
put = {"name": "put", "inputSchema": schema}
delete = {"name": "del", "inputSchema": schema}
for line in sys.stdin:
    message = json.loads(line)
    method, mid = message.get("method"), message.get("id")
    if method == "initialize":
        if mode == "hang":
            time.sleep(3600)
        send({"jsonrpc": "2.0", "id": mid, "result": {
            "protocolVersion": message["params"]["protocolVersion"],
            "capabilities": {"tools": {}}, "serverInfo": {"name": "fake", "version": "1"}}})
    elif method == "tools/list":
        tools = [put, delete]
        if mode == "many":
            tools = [{"name": "t%d" % n, "inputSchema": {"type": "object"}} for n in range(2000)]
        elif mode == "collide":
            tools.append({"name": "write", "inputSchema": {"type": "object"}})
        elif mode == "badschema":
            tools.append({"name": "bad", "inputSchema": {"type": "object", "properties": {"x": {"type": 12}}}})
        send({"jsonrpc": "2.0", "id": mid, "result": {"tools": tools}})
    elif method == "tools/call":
        params = message["params"]
        with open("ws/upstream.log", "a") as log:
            log.write(params["name"] + " " + json.dumps(params.get("arguments", {}), sort_keys=True) + "\n")
        send({"jsonrpc": "2.0", "id": mid, "result": {
            "content": [{"type": "text", "text": json.dumps({"stored": params.get("arguments", {}).get("key")})}],
            "isError": False}})
    elif mid is not None:
        send({"jsonrpc": "2.0", "id": mid, "result": {}})
"#;

/// The tools file with the server `memo` in `mode`, `put` compensated by `del` through
/// `mapping`, and the extra `more` text.
/// Commands that need no upstream server's tool, on a log with nothing to recover: none of
/// them may start one.
pub(crate) const COMMANDS_THAT_NEED_NO_UPSTREAM_TOOL: [&[&str]; 6] = [
    &["recover"],
    &["approvals"],
    &["dlq", "list"],
    &["log"],
    &["audit", "verify"],
    &["tools"],
];

fn tools_toml(mode: &str, mapping: &str, more: &str) -> String {
    format!(
        r#"
[mcp_servers.memo]
command = ["python3", "fake_server.py", "{mode}"]
start_timeout_ms = 2000

[mcp_servers.memo.tool.put]
effect = "mutating"
compensate = {{ tool = "del", args = {mapping} }}
{more}"#
    )
}

fn project(mode: &str) -> Project {
    let project = Project::new();
    fs::write(project.path("fake_server.py"), FAKE_SERVER_PY).expect("writes");
    fs::write(
        project.path("tools.toml"),
        tools_toml(mode, r#"{ key = "$.args.key" }"#, ""),
    )
    .expect("writes");
    project
}

/// How many times an upstream server was started.
fn starts(project: &Project) -> usize {
    fs::read_to_string(project.path("ws/starts.log"))
        .unwrap_or_default()
        .lines()
        .count()
}

fn upstream_log(project: &Project) -> String {
    fs::read_to_string(project.path("ws/upstream.log")).unwrap_or_default()
}

/// Runs `plan` and SIGKILLs it once `landed` holds: a dead saga for `recover`.
fn dead_saga(project: &Project, name: &str, plan: &Value, landed: impl Fn() -> bool) -> String {
    let path = project.plan(name, plan);
    let mut child = project
        .command(&["run", "--plan", path.to_str().expect("utf8")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawns");
    crate::wait_until("the dead saga's effect never landed", landed);
    crate::sigkill(&mut child).expect("SIGKILLs");
    child.wait().expect("reaps");
    project.latest_saga().expect("a saga").0
}

/// A dead saga that wrote `content` to `ws/a.txt`.
fn dead_file_saga(project: &Project, content: &str) -> String {
    dead_saga(
        project,
        &format!("{content}.json"),
        &json!({"steps": [
            {"tool": "fs.write", "args": {"path": "ws/a.txt", "content": content}},
            {"tool": "noop", "args": {"sleep_ms": 20_000}},
        ]}),
        || fs::read_to_string(project.path("ws/a.txt")).is_ok_and(|now| now == content),
    )
}

/// A dead saga that called `memo.put` with the key `k1`.
fn dead_upstream_saga(project: &Project) -> String {
    dead_saga(
        project,
        "upstream.json",
        &json!({"steps": [
            {"tool": "memo.put", "args": {"key": "k1"}},
            {"tool": "noop", "args": {"sleep_ms": 20_000}},
        ]}),
        || upstream_log(project).contains("put"),
    )
}

#[test]
fn a_broken_upstream_server_leaves_only_its_own_sagas_to_an_operator() {
    for broken in ["hang", "exit", "many"] {
        let project = project("good");
        fs::write(project.path("ws/a.txt"), "before").expect("writes");
        let upstream = dead_upstream_saga(&project);
        let files = dead_file_saga(&project, "after");
        // The server breaks before anyone recovers.
        fs::write(
            project.path("tools.toml"),
            tools_toml(broken, r#"{ key = "$.args.key" }"#, ""),
        )
        .expect("writes");
        let (code, report) = project.run_json(&["recover"]);
        assert_eq!(code, 3, "{broken}: {report}");
        assert_eq!(
            fs::read_to_string(project.path("ws/a.txt")).expect("reads"),
            "before",
            "{broken}: the file saga was not rolled back"
        );
        let (_, record) = project.run_json(&["log", "--saga", &files]);
        assert_eq!(record["state"], "FailedRolledBack", "{broken}: {record}");
        let (_, record) = project.run_json(&["log", "--saga", &upstream]);
        assert_eq!(
            record["state"], "FailedRollbackPartial",
            "{broken}: {record}"
        );
        let (_, letters) = project.run_json(&["dlq", "list"]);
        let letters = letters["dead_letters"].as_array().expect("letters").clone();
        assert_eq!(letters.len(), 1, "{broken}: {letters:?}");
        assert_eq!(letters[0]["saga_id"], upstream.as_str());
        let error = letters[0]["error"].as_str().expect("error");
        assert!(
            error.contains("`memo`") && error.contains("unavailable"),
            "{broken}: {error}"
        );

        // A plan without the server's tools runs.
        let plan = project.plan(
            "ok.json",
            &json!({"steps": [{"tool": "fs.write", "args": {"path": "ws/b.txt", "content": "b"}}]}),
        );
        let started = starts(&project);
        let output = project.run(&["run", "--plan", plan.to_str().expect("utf8")]);
        assert_eq!(
            output.status.code(),
            Some(0),
            "{broken}: {}",
            describe(&output)
        );
        assert_eq!(
            starts(&project),
            started,
            "{broken}: the server was not needed"
        );

        // Once the server works again, the letter is retried through it.
        fs::write(
            project.path("tools.toml"),
            tools_toml("good", r#"{ key = "$.args.key" }"#, ""),
        )
        .expect("writes");
        let id = letters[0]["id"].as_str().expect("id");
        let output = project.run(&["dlq", "retry", id]);
        assert_eq!(
            output.status.code(),
            Some(0),
            "{broken}: {}",
            describe(&output)
        );
        assert!(upstream_log(&project).contains(r#"del {"key": "k1"}"#));
    }
}

#[test]
fn colliding_and_invalid_upstream_tools_are_left_out_alone() {
    let project = project("good");
    let more = r#"
[mcp_servers.fs]
command = ["python3", "fake_server.py", "collide"]

[mcp_servers.odd]
command = ["python3", "fake_server.py", "badschema"]
"#;
    fs::write(
        project.path("tools.toml"),
        tools_toml("good", r#"{ key = "$.args.key" }"#, more),
    )
    .expect("writes");
    let (code, listed) = project.run_json(&["tools", "--upstream"]);
    assert_eq!(code, 0, "{listed}");
    let ids: Vec<&str> = listed["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|tool| tool["tool"].as_str())
        .collect();
    for id in ["fs.write", "fs.put", "odd.put", "memo.put"] {
        assert!(ids.contains(&id), "{id} in {ids:?}");
    }
    assert!(!ids.contains(&"odd.bad"), "{ids:?}");
    assert_eq!(ids.iter().filter(|id| **id == "fs.write").count(), 1);
    // `fs.write` is the built-in one.
    let plan = project.plan(
        "files.json",
        &json!({"steps": [{"tool": "fs.write", "args": {"path": "ws/a.txt", "content": "a"}}]}),
    );
    let output = project.run(&["run", "--plan", plan.to_str().expect("utf8")]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    assert_eq!(
        fs::read_to_string(project.path("ws/a.txt")).expect("reads"),
        "a"
    );
    assert!(!upstream_log(&project).contains("write"));
}

#[test]
fn an_upstream_compensation_that_would_undo_nothing_is_a_dead_letter() {
    let project = project("good");
    // `stored` is what the server answers; `$.output.entities[*].name` matches nothing.
    fs::write(
        project.path("tools.toml"),
        tools_toml("good", r#"{ key = "$.output.entities[*].name" }"#, ""),
    )
    .expect("writes");
    let plan = project.plan(
        "fails.json",
        &json!({"steps": [
            {"tool": "memo.put", "args": {"key": "k1"}},
            {"tool": "fs.read", "args": {"path": "ws/missing.txt"}},
        ]}),
    );
    let (code, report) = project.run_json(&["run", "--plan", plan.to_str().expect("utf8")]);
    assert_eq!(code, 3, "{report}");
    assert_eq!(report["state"], "FailedRollbackPartial", "{report}");
    assert_eq!(
        report["steps"][0]["status"], "COMPENSATION_FAILED",
        "{report}"
    );
    assert!(
        !upstream_log(&project).contains("del"),
        "nothing was called"
    );
    let (_, letters) = project.run_json(&["dlq", "list"]);
    let error = letters["dead_letters"][0]["error"].as_str().expect("error");
    assert!(error.contains("matches nothing"), "{error}");
}

#[test]
fn a_compensating_tool_the_server_does_not_list_is_named_with_its_line() {
    let project = project("good");
    fs::write(
        project.path("tools.toml"),
        tools_toml("good", r#"{ key = "$.args.key" }"#, "")
            .replace(r#"tool = "del""#, r#"tool = "remove""#),
    )
    .expect("writes");
    let output = project.run(&["tools", "--upstream"]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("line 6") && stderr.contains("`remove`"),
        "{stderr}"
    );
    let (_, listed) = project.run_json(&["tools", "--upstream"]);
    assert!(
        !listed.to_string().contains("memo.put"),
        "the server's tools are not offered: {listed}"
    );
}

#[test]
fn an_upstream_server_starts_only_when_a_step_or_a_compensation_needs_it() {
    let project = project("good");
    let plan = project.plan(
        "files.json",
        &json!({"steps": [{"tool": "fs.write", "args": {"path": "ws/a.txt", "content": "a"}}]}),
    );
    let output = project.run(&["run", "--plan", plan.to_str().expect("utf8")]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    for command in COMMANDS_THAT_NEED_NO_UPSTREAM_TOOL {
        let output = project.run(command);
        assert_eq!(
            output.status.code(),
            Some(0),
            "{command:?}: {}",
            describe(&output)
        );
    }
    assert_eq!(starts(&project), 0, "no command needed the server");
    let (code, listed) = project.run_json(&["tools"]);
    assert_eq!(code, 0, "{listed}");
    assert_eq!(listed["not_started"], json!(["memo"]), "{listed}");
    assert_eq!(
        starts(&project),
        0,
        "`tools` names the server without starting it"
    );

    // A dead saga of file steps alone is settled without it.
    let files = dead_file_saga(&project, "dead");
    let (code, report) = project.run_json(&["recover"]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(
        fs::read_to_string(project.path("ws/a.txt")).expect("reads"),
        "a"
    );
    assert!(report.to_string().contains(&files), "{report}");
    assert_eq!(
        starts(&project),
        0,
        "recovery of file steps started no server"
    );

    // A step of the server starts it once; so does its compensation in a later process.
    let upstream = dead_upstream_saga(&project);
    assert_eq!(starts(&project), 1);
    let (code, report) = project.run_json(&["recover"]);
    assert_eq!(code, 0, "{report}");
    assert!(report.to_string().contains(&upstream), "{report}");
    assert!(upstream_log(&project).contains(r#"del {"key": "k1"}"#));
    assert_eq!(starts(&project), 2, "the compensation started it again");

    // A listing asks every server.
    let (code, listed) = project.run_json(&["tools", "--upstream"]);
    assert_eq!(code, 0, "{listed}");
    assert!(listed.to_string().contains("memo.put"), "{listed}");
    assert_eq!(starts(&project), 3);
}
