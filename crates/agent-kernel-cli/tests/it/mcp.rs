//! `agent-kernel mcp` (reference §9), driven by rmcp's client over stdio, and by raw
//! JSON-RPC lines where the test needs to close stdin or send garbage.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, CallToolResult, JsonObject};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::TokioChildProcess;
use serde_json::{Value, json};

use crate::Project;

type Client = RunningService<RoleClient, ()>;

async fn connect(project: &Project, extra: &[&str]) -> Client {
    let mut command = tokio::process::Command::new(crate::bin());
    command
        .current_dir(project.dir.path())
        .env_remove("AGENT_KERNEL_DB")
        .env_remove("AGENT_KERNEL_AUDIT_KEY")
        .env_remove("RUST_LOG")
        .arg("--db")
        .arg(project.db())
        .arg("-q")
        .arg("mcp")
        .args(extra);
    ().serve(TokioChildProcess::new(command).expect("the server starts"))
        .await
        .expect("the session initializes")
}

fn arguments(value: Value) -> JsonObject {
    match value {
        Value::Object(map) => map,
        other => panic!("arguments are an object, not {other}"),
    }
}

async fn call(client: &Client, name: &str, args: Value) -> CallToolResult {
    client
        .call_tool(CallToolRequestParams::new(name.to_owned()).with_arguments(arguments(args)))
        .await
        .unwrap_or_else(|error| panic!("{name}: {error}"))
}

fn content(result: &CallToolResult) -> &Value {
    result
        .structured_content
        .as_ref()
        .expect("every result has structured content")
}

fn ok(result: &CallToolResult) -> &Value {
    assert_eq!(
        result.is_error,
        Some(false),
        "{:?}",
        result.structured_content
    );
    content(result)
}

fn error_kind(result: &CallToolResult) -> &str {
    assert_eq!(
        result.is_error,
        Some(true),
        "{:?}",
        result.structured_content
    );
    content(result)["error"]["kind"]
        .as_str()
        .expect("an error kind")
}

async fn begin(client: &Client) -> String {
    let result = call(client, "saga_begin", json!({ "name": "test" })).await;
    ok(&result)["saga_id"].as_str().expect("an id").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_names_itself_and_lists_the_saga_tools_and_every_kernel_tool() {
    let project = Project::new();
    let client = connect(&project, &[]).await;
    let info = client.peer_info().expect("initialized");
    let server = info.server_info.clone().expect("the server names itself");
    assert_eq!(server.name, "agent-kernel");
    assert_eq!(server.version, env!("CARGO_PKG_VERSION"));
    assert!(
        info.instructions
            .as_deref()
            .is_some_and(|text| text.contains("saga_begin")),
        "{info:?}"
    );
    // Where files may be touched and what a relative path means, before any denial.
    let root = fs::canonicalize(project.path("ws")).expect("the root");
    let folder = fs::canonicalize(project.path("")).expect("the folder");
    let files = format!(
        "File paths must lie under `{}` (the sandbox's allowed roots; anything else is denied); a relative path is taken from `{}`.",
        root.display(),
        folder.display()
    );
    assert!(
        info.instructions
            .as_deref()
            .is_some_and(|text| text.contains(&files)),
        "{info:?}"
    );
    let tools = client.list_all_tools().await.expect("lists");
    for tool in &tools {
        let described = tool.description.as_deref().unwrap_or_default();
        let is_file_tool = tool.name.starts_with("fs_") || tool.name == "validate_file";
        assert_eq!(
            described.contains(&files),
            is_file_tool,
            "{}: {described}",
            tool.name
        );
    }
    let names: Vec<&str> = tools.iter().map(|tool| tool.name.as_ref()).collect();
    for name in [
        "saga_begin",
        "saga_commit",
        "saga_abort",
        "saga_status",
        "fs_write",
        "fs_read",
        "noop",
        "http_get",
    ] {
        assert!(names.contains(&name), "{name} in {names:?}");
    }
    assert!(
        !names.iter().any(|name| name.starts_with("fault_")),
        "no drill tools unless asked: {names:?}"
    );
    for operator in ["recover", "rollback", "approve", "audit_seal", "prune"] {
        assert!(!names.contains(&operator), "{operator} is never offered");
    }
    let tool = |name: &str| tools.iter().find(|tool| tool.name == name).expect("listed");
    let write = tool("fs_write");
    assert_eq!(
        write.input_schema["properties"]["args"]["required"],
        json!(["path", "content"])
    );
    assert_eq!(write.input_schema["required"], json!(["args"]));
    let annotations = |name: &str| tool(name).annotations.clone().expect("annotated");
    assert_eq!(annotations("fs_read").read_only_hint, Some(true));
    assert_eq!(annotations("fs_write").read_only_hint, Some(false));
    assert_eq!(annotations("fs_write").destructive_hint, Some(false));
    assert_eq!(annotations("fs_write").idempotent_hint, Some(true));
    assert_eq!(annotations("fs_append").idempotent_hint, Some(false));
    assert_eq!(annotations("http_get").open_world_hint, Some(true));
    client.cancel().await.expect("closes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sagas_commit_abort_and_autocommit_with_the_contract_answers() {
    let project = Project::new();
    fs::write(project.path("ws/a.txt"), "before").expect("writes");
    let client = connect(&project, &["--drills"]).await;

    // Committed: two steps, each answered with its output.
    let saga = begin(&client).await;
    for (step, path) in [(0, "ws/a.txt"), (1, "ws/b.txt")] {
        let result = call(
            &client,
            "fs_write",
            json!({ "saga_id": saga, "args": { "path": path, "content": "after" } }),
        )
        .await;
        let answer = ok(&result);
        assert_eq!(answer["step"], step, "{answer}");
        assert_eq!(answer["tool"], "fs.write");
        assert_eq!(answer["status"], "COMMIT");
        assert_eq!(answer["state"], "Acting");
        assert_eq!(answer["output"]["path"], path);
    }
    let status = call(&client, "saga_status", json!({ "saga_id": saga })).await;
    assert_eq!(ok(&status)["steps"].as_array().expect("steps").len(), 2);
    let committed = call(&client, "saga_commit", json!({ "saga_id": saga })).await;
    assert_eq!(ok(&committed)["state"], "Done");
    assert_eq!(
        fs::read_to_string(project.path("ws/b.txt")).expect("reads"),
        "after"
    );

    // Aborted: every file back.
    let saga = begin(&client).await;
    for path in ["ws/a.txt", "ws/c.txt"] {
        let result = call(
            &client,
            "fs_write",
            json!({ "saga_id": saga, "args": { "path": path, "content": "doomed" } }),
        )
        .await;
        ok(&result);
    }
    let aborted = call(
        &client,
        "saga_abort",
        json!({ "saga_id": saga, "reason": "no" }),
    )
    .await;
    let answer = ok(&aborted);
    assert_eq!(answer["state"], "FailedRolledBack", "{answer}");
    assert!(
        answer["steps"]
            .as_array()
            .expect("steps")
            .iter()
            .all(|step| step["status"] == "COMPENSATED")
    );
    assert_eq!(
        fs::read_to_string(project.path("ws/a.txt")).expect("reads"),
        "after"
    );
    assert!(!project.path("ws/c.txt").exists());

    // Autocommit: a saga of its own.
    let result = call(
        &client,
        "fs_read",
        json!({ "args": { "path": "ws/a.txt" } }),
    )
    .await;
    let answer = ok(&result);
    assert_eq!(answer["state"], "Done");
    assert_eq!(answer["output"]["content"], "after");

    // Refused: bad input, the saga stays open and usable.
    let saga = begin(&client).await;
    let refused = call(
        &client,
        "fs_write",
        json!({ "saga_id": saga, "args": { "path": "ws/d.txt" } }),
    )
    .await;
    assert_eq!(error_kind(&refused), "bad_input");
    let write = call(
        &client,
        "fs_write",
        json!({ "saga_id": saga, "args": { "path": "ws/d.txt", "content": "d" } }),
    )
    .await;
    ok(&write);

    // Denied by the sandbox: refused (`[mcp] on_denied` is `refuse` by default), the saga
    // stays open with d.txt in place; aborting it then puts everything back.
    let denied = call(
        &client,
        "fs_write",
        json!({ "saga_id": saga, "args": { "path": "/etc/agent-kernel-test", "content": "x" } }),
    )
    .await;
    assert_eq!(error_kind(&denied), "denied");
    assert_eq!(content(&denied)["state"], "Acting");
    assert!(project.path("ws/d.txt").exists());
    let aborted = call(&client, "saga_abort", json!({ "saga_id": saga })).await;
    assert_eq!(ok(&aborted)["state"], "FailedRolledBack");
    assert!(!project.path("ws/d.txt").exists());
    let closed = call(&client, "saga_commit", json!({ "saga_id": saga })).await;
    assert_eq!(error_kind(&closed), "bad_input", "the saga is closed");

    // A failed tool: rolled back, with what was compensated.
    let saga = begin(&client).await;
    ok(&call(
        &client,
        "fs_write",
        json!({ "saga_id": saga, "args": { "path": "ws/e.txt", "content": "e" } }),
    )
    .await);
    let failed = call(
        &client,
        "fault_fail",
        json!({ "saga_id": saga, "args": {} }),
    )
    .await;
    assert_eq!(error_kind(&failed), "failed");
    assert_eq!(content(&failed)["steps"][0]["status"], "COMPENSATED");
    assert!(!project.path("ws/e.txt").exists());
    client.cancel().await.expect("closes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_uses_only_its_own_sagas_and_two_share_one_log() {
    let project = Project::new();
    let (first, second) = (connect(&project, &[]).await, connect(&project, &[]).await);
    let saga = begin(&first).await;
    ok(&call(
        &first,
        "fs_write",
        json!({ "saga_id": saga, "args": { "path": "ws/mine.txt", "content": "1" } }),
    )
    .await);
    // The other connection cannot touch it.
    for (name, args) in [
        ("saga_commit", json!({ "saga_id": saga })),
        ("saga_abort", json!({ "saga_id": saga })),
        (
            "fs_write",
            json!({ "saga_id": saga, "args": { "path": "ws/x.txt", "content": "x" } }),
        ),
    ] {
        let result = call(&second, name, args).await;
        assert_eq!(error_kind(&result), "bad_input", "{name}");
    }
    // Both work on the one log at once.
    let theirs = begin(&second).await;
    ok(&call(
        &second,
        "fs_write",
        json!({ "saga_id": theirs, "args": { "path": "ws/theirs.txt", "content": "2" } }),
    )
    .await);
    assert_eq!(
        ok(&call(&first, "saga_commit", json!({ "saga_id": saga })).await)["state"],
        "Done"
    );
    assert_eq!(
        ok(&call(&second, "saga_commit", json!({ "saga_id": theirs })).await)["state"],
        "Done"
    );
    assert!(project.path("ws/mine.txt").exists() && project.path("ws/theirs.txt").exists());
    // Ended, a saga's status still answers to the connection that began it, and only to it.
    let status = call(&first, "saga_status", json!({ "saga_id": saga })).await;
    let status = ok(&status);
    assert_eq!(status["state"], "Done", "{status}");
    assert_eq!(status["steps"][0]["tool"], "fs.write", "{status}");
    assert_eq!(status["steps"][0]["status"], "COMMIT", "{status}");
    assert_eq!(
        status["steps"][0]["output"]["path"], "ws/mine.txt",
        "{status}"
    );
    assert_eq!(status["locks"], json!([]), "{status}");
    let refused = call(&second, "saga_status", json!({ "saga_id": saga })).await;
    assert_eq!(error_kind(&refused), "bad_input");
    let refused = call(&first, "saga_status", json!({ "saga_id": "no-such-saga" })).await;
    assert_eq!(error_kind(&refused), "bad_input");
    first.cancel().await.expect("closes");
    second.cancel().await.expect("closes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_saga_s_status_says_how_it_ended_at_either_durability() {
    let project = Project::new();
    let client = connect(&project, &["--durability", "normal"]).await;
    // A call's own saga, committed within the call, and an aborted one.
    let written = call(
        &client,
        "fs_write",
        json!({ "args": { "path": "ws/auto.txt", "content": "a" } }),
    )
    .await;
    let own = ok(&written)["saga_id"]
        .as_str()
        .expect("its saga")
        .to_owned();
    let status = call(&client, "saga_status", json!({ "saga_id": own })).await;
    assert_eq!(ok(&status)["state"], "Done");
    let saga = begin(&client).await;
    ok(&call(
        &client,
        "fs_write",
        json!({ "saga_id": saga, "args": { "path": "ws/gone.txt", "content": "g" } }),
    )
    .await);
    ok(&call(
        &client,
        "saga_abort",
        json!({ "saga_id": saga, "reason": "changed my mind" }),
    )
    .await);
    let status = call(&client, "saga_status", json!({ "saga_id": saga })).await;
    let status = ok(&status);
    assert_eq!(status["state"], "FailedRolledBack", "{status}");
    assert_eq!(status["steps"][0]["status"], "COMPENSATED", "{status}");
    assert!(!project.path("ws/gone.txt").exists());
    client.cancel().await.expect("closes");
    // `log` counts the steps a live saga began (it has no plan to count).
    let (code, listed) = project.run_json(&["log"]);
    assert_eq!(code, 0, "{listed}");
    let aborted = listed["sagas"]
        .as_array()
        .expect("sagas")
        .iter()
        .find(|listed| listed["saga_id"] == saga.as_str())
        .expect("the aborted saga");
    assert_eq!(aborted["n_steps"], 0, "{listed}");
    assert_eq!(aborted["steps_begun"], 1, "{listed}");
    let table = project.run(&["log"]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("1 (live)"), "{table}");
    // A bad durability is bad input before anything is served.
    let output = project.run(&["mcp", "--durability", "sometimes"]);
    assert_eq!(
        output.status.code(),
        Some(2),
        "{}",
        crate::describe(&output)
    );
}

/// The server over raw pipes: JSON-RPC lines in, one answer line per request out.
pub(crate) struct Raw {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    next_id: u64,
}

impl Raw {
    pub(crate) fn start(project: &Project) -> Raw {
        Raw::start_with(project, &["-q", "mcp"])
    }

    /// The server started with `args` (`["-q", "mcp", …]`), initialized.
    pub(crate) fn start_with(project: &Project, args: &[&str]) -> Raw {
        let mut child = project
            .command(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the server starts");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut raw = Raw {
            child,
            stdin,
            stdout,
            next_id: 1,
        };
        let init = raw.request(
            "initialize",
            json!({ "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": { "name": "raw", "version": "1" } }),
        );
        assert_eq!(
            init["result"]["serverInfo"]["name"], "agent-kernel",
            "{init}"
        );
        raw.send_line(
            &json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }).to_string(),
        );
        raw
    }

    fn send_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("open");
        stdin.write_all(line.as_bytes()).expect("writes");
        stdin.write_all(b"\n").expect("writes");
        stdin.flush().expect("flushes");
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send_line(
            &json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }).to_string(),
        );
        loop {
            let mut line = String::new();
            assert!(
                self.stdout.read_line(&mut line).expect("reads") > 0,
                "the server hung up"
            );
            let message: Value = serde_json::from_str(&line).expect("one JSON-RPC message a line");
            if message["id"] == id {
                return message;
            }
        }
    }

    /// Ends input and waits for the server to exit 0.
    pub(crate) fn close(mut self) {
        drop(self.stdin.take());
        let status = self.child.wait().expect("exits");
        assert_eq!(status.code(), Some(0));
    }

    pub(crate) fn call(&mut self, name: &str, arguments: Value) -> Value {
        self.request(
            "tools/call",
            json!({ "name": name, "arguments": arguments }),
        )
    }

    /// Sends `n` calls of `name` at once, then reads their `n` answers (in any order);
    /// each must be a result that is not an error.
    fn call_many(&mut self, name: &str, arguments: &Value, n: usize) {
        let first = self.next_id;
        for _ in 0..n {
            let id = self.next_id;
            self.next_id += 1;
            let request = json!({
                "jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": { "name": name, "arguments": arguments },
            });
            let stdin = self.stdin.as_mut().expect("open");
            writeln!(stdin, "{request}").expect("writes");
        }
        self.stdin.as_mut().expect("open").flush().expect("flushes");
        let mut n_answered = 0;
        while n_answered < n {
            let mut line = String::new();
            assert!(
                self.stdout.read_line(&mut line).expect("reads") > 0,
                "the server hung up"
            );
            let message: Value = serde_json::from_str(&line).expect("one JSON-RPC message a line");
            let Some(id) = message["id"].as_u64() else {
                continue;
            };
            assert!((first..self.next_id).contains(&id), "{message}");
            assert_eq!(message["result"]["isError"], false, "{message}");
            n_answered += 1;
        }
    }

    fn begin_and_write(&mut self, path: &str) -> String {
        let begun = self.call("saga_begin", json!({}));
        let saga = begun["result"]["structuredContent"]["saga_id"]
            .as_str()
            .expect("an id")
            .to_owned();
        let written = self.call(
            "fs_write",
            json!({ "saga_id": saga, "args": { "path": path, "content": "new" } }),
        );
        assert_eq!(written["result"]["isError"], false, "{written}");
        saga
    }
}

/// The `flags` of the descriptor `fd` of process `pid`, from `/proc` (octal there).
fn descriptor_flags(pid: u32, fd: &str) -> u32 {
    let info = fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).expect("reads fdinfo");
    let flags = info
        .lines()
        .find_map(|line| line.strip_prefix("flags:"))
        .expect("a flags line");
    u32::from_str_radix(flags.trim(), 8).expect("octal flags")
}

/// `O_NONBLOCK` on Linux.
const O_NONBLOCK: u32 = 0o4000;

#[test]
fn the_server_polls_descriptions_of_its_own_and_leaves_its_inherited_pipes_blocking() {
    let project = Project::new();
    let mut raw = Raw::start(&project);
    let pid = raw.child.id();
    let pong = raw.request("ping", json!({}));
    assert!(pong.get("result").is_some(), "{pong}");
    for inherited in ["0", "1"] {
        let pipe = fs::read_link(format!("/proc/{pid}/fd/{inherited}")).expect("reads the link");
        assert!(pipe.to_string_lossy().starts_with("pipe:"), "{pipe:?}");
        // Whoever shares the description (a wrapper script, the client) still sees it
        // blocking.
        assert_eq!(
            descriptor_flags(pid, inherited) & O_NONBLOCK,
            0,
            "descriptor {inherited} was made non-blocking"
        );
        let own = fs::read_dir(format!("/proc/{pid}/fd"))
            .expect("lists the descriptors")
            .map(|entry| {
                entry
                    .expect("an entry")
                    .file_name()
                    .into_string()
                    .expect("a number")
            })
            .filter(|fd| fd != inherited)
            .filter(|fd| {
                fs::read_link(format!("/proc/{pid}/fd/{fd}")).is_ok_and(|link| link == pipe)
            })
            .any(|fd| descriptor_flags(pid, &fd) & O_NONBLOCK != 0);
        assert!(
            own,
            "no non-blocking description of its own on {pipe:?} (descriptor {inherited})"
        );
    }
    raw.close();
}

#[test]
fn a_named_fifo_on_stdin_whose_writer_left_still_ends_the_session() {
    let project = Project::new();
    // Inside an allowed root, where the second line lets the server open it again.
    let fifo = project.path("ws/input.fifo");
    let made = Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("runs mkfifo");
    assert!(made.success());
    let writer = {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            let mut input = fs::OpenOptions::new()
                .write(true)
                .open(&fifo)
                .expect("opens the FIFO for writing");
            for message in [
                json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": { "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": { "name": "fifo", "version": "1" } } }),
                json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }),
                json!({ "jsonrpc": "2.0", "id": 2, "method": "ping" }),
            ] {
                writeln!(input, "{message}").expect("writes");
            }
        })
    };
    // Blocks until the writer opens it; the writer has closed it before the server starts.
    let input = fs::File::open(&fifo).expect("opens the FIFO for reading");
    writer.join().expect("the writer finishes");
    let child = project
        .command(&["-q", "mcp"])
        .stdin(input)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the server starts");
    let pid = child.id();
    let (done, exited) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait_with_output());
    });
    let Ok(output) = exited.recv_timeout(std::time::Duration::from_secs(60)) else {
        let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
        panic!("the server never saw the end of its input");
    };
    let output = output.expect("waits");
    assert_eq!(output.status.code(), Some(0));
    let answers = String::from_utf8(output.stdout).expect("UTF-8");
    assert!(
        answers
            .lines()
            .any(|line| serde_json::from_str::<Value>(line)
                .is_ok_and(|answer| answer["id"] == 2 && answer.get("result").is_some())),
        "{answers}"
    );
}

#[test]
fn end_of_input_rolls_back_the_open_sagas_and_exits_0() {
    let project = Project::new();
    fs::write(project.path("ws/a.txt"), "old").expect("writes");
    let mut raw = Raw::start(&project);
    let first = raw.begin_and_write("ws/a.txt");
    let second = raw.begin_and_write("ws/b.txt");
    drop(raw.stdin.take());
    let status = raw.child.wait().expect("exits");
    assert_eq!(status.code(), Some(0));
    assert_eq!(
        fs::read_to_string(project.path("ws/a.txt")).expect("reads"),
        "old"
    );
    assert!(!project.path("ws/b.txt").exists());
    for saga in [first, second] {
        let (code, record) = project.run_json(&["log", "--saga", &saga]);
        assert_eq!(code, 0, "{record}");
        assert_eq!(record["state"], "FailedRolledBack", "{record}");
    }
    let (code, listed) = project.run_json(&["audit", "list", "--kind", "SagaAborted"]);
    assert_eq!(code, 0, "{listed}");
    let aborted: Vec<&Value> = listed["records"]
        .as_array()
        .expect("records")
        .iter()
        .map(|record| &record["body"])
        .collect();
    assert_eq!(aborted.len(), 2);
    assert!(aborted.iter().all(|body| body["cause"] == "shutdown"));
}

#[test]
fn after_a_sigkill_of_the_server_recover_puts_every_file_back() {
    let project = Project::new();
    fs::write(project.path("ws/a.txt"), "old").expect("writes");
    let mut raw = Raw::start(&project);
    raw.begin_and_write("ws/a.txt");
    raw.begin_and_write("ws/b.txt");
    crate::sigkill(&mut raw.child).expect("SIGKILLs");
    raw.child.wait().expect("reaps");
    assert_eq!(
        fs::read_to_string(project.path("ws/a.txt")).expect("reads"),
        "new"
    );
    let (code, report) = project.run_json(&["recover"]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(
        report["sagas"].as_array().expect("sagas").len(),
        2,
        "{report}"
    );
    assert_eq!(
        fs::read_to_string(project.path("ws/a.txt")).expect("reads"),
        "old"
    );
    assert!(!project.path("ws/b.txt").exists());
}

#[test]
fn malformed_requests_are_protocol_errors_and_the_server_goes_on() {
    let project = Project::new();
    let mut raw = Raw::start(&project);
    // Not JSON at all: no answer can name an id; the server goes on.
    raw.send_line("{not json");
    // An unknown tool, arguments that are not the tool's shape, an oversized request.
    let unknown = raw.call("no_such_tool", json!({}));
    assert!(unknown["error"]["code"].is_i64(), "{unknown}");
    let shapeless = raw.call("fs_write", json!({ "path": "ws/x.txt" }));
    assert!(shapeless["error"]["code"].is_i64(), "{shapeless}");
    let huge = "x".repeat(4 * 1024 * 1024);
    let oversized = raw.call(
        "fs_write",
        json!({ "args": { "path": "ws/huge.txt", "content": huge } }),
    );
    assert!(
        oversized["error"]["code"].is_i64() || oversized["result"]["isError"] == true,
        "refused: {}",
        &oversized.to_string()[..200]
    );
    assert!(!project.path("ws/x.txt").exists() && !project.path("ws/huge.txt").exists());
    // Still answering.
    let begun = raw.call("saga_begin", json!({}));
    assert_eq!(begun["result"]["isError"], false, "{begun}");
    drop(raw.stdin.take());
    assert_eq!(raw.child.wait().expect("exits").code(), Some(0));
}

/// Reads lines until the answer to request `id`; fails if the server hangs up first.
fn answer_to(raw: &mut Raw, id: u64) -> Value {
    loop {
        let mut line = String::new();
        assert!(
            raw.stdout.read_line(&mut line).expect("reads") > 0,
            "the server hung up"
        );
        let message: Value = serde_json::from_str(&line).expect("one JSON-RPC message a line");
        if message["id"] == id {
            return message;
        }
    }
}

#[test]
fn every_request_with_an_id_is_answered_whatever_its_params_or_depth() {
    let project = Project::new();
    let mut raw = Raw::start(&project);
    let mut deep = json!("leaf");
    for _ in 0..200 {
        deep = json!({ "a": deep });
    }
    let deep_text = deep.to_string();
    let requests = [
        // params of the wrong shape
        (101, r#"{"jsonrpc":"2.0","id":101,"method":"tools/call","params":{"name":5}}"#.to_owned()),
        (102, r#"{"jsonrpc":"2.0","id":102,"method":"tools/call","params":"text"}"#.to_owned()),
        (103, r#"{"jsonrpc":"2.0","id":103,"method":"tools/call"}"#.to_owned()),
        (104, r#"{"jsonrpc":"2.0","id":104,"method":"tools/call","params":{"name":"fs_read","arguments":[1]}}"#.to_owned()),
        // arguments nested 200 deep
        (
            105,
            format!(
                r#"{{"jsonrpc":"2.0","id":105,"method":"tools/call","params":{{"name":"fs_read","arguments":{{"args":{deep_text}}}}}}}"#
            ),
        ),
        // an unknown method
        (106, r#"{"jsonrpc":"2.0","id":106,"method":"no/such","params":{}}"#.to_owned()),
    ];
    for (id, line) in &requests {
        raw.send_line(line);
        let answer = answer_to(&mut raw, *id);
        let code = answer["error"]["code"].as_i64();
        let refused = answer["result"]["isError"] == true;
        assert!(code.is_some() || refused, "request {id}: {answer}");
        if *id <= 104 {
            assert_eq!(code, Some(-32602), "invalid params, request {id}: {answer}");
            let message = answer["error"]["message"].as_str().unwrap_or_default();
            assert!(!message.is_empty(), "{answer}");
        }
        if *id == 106 {
            assert_eq!(code, Some(-32601), "{answer}");
        }
    }
    // Still answering.
    let begun = raw.call("saga_begin", json!({}));
    assert_eq!(begun["result"]["isError"], false, "{begun}");
    raw.close();
}

/// The resident memory of process `pid`, in KiB (`VmRSS`).
fn rss_kib(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).expect("reads its status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("a VmRSS line")
}

/// The autocommit calls of the memory test, the number after which its first reading is
/// taken, and how many are in flight at once.
const LOOP_CALLS: usize = 50_000;
const LOOP_CALLS_WARM: usize = 5_000;
const LOOP_CALLS_IN_FLIGHT: usize = 64;

#[test]
fn a_long_loop_of_autocommit_calls_leaves_memory_flat() {
    let project = Project::new();
    fs::write(project.path("ws/a.txt"), "x").expect("writes");
    let mut raw = Raw::start(&project);
    let pid = raw.child.id();
    let call = json!({ "args": { "path": "ws/a.txt" } });
    let mut n_done = 0;
    let mut rss_warm = None;
    while n_done < LOOP_CALLS {
        let n = LOOP_CALLS_IN_FLIGHT.min(LOOP_CALLS - n_done);
        raw.call_many("fs_read", &call, n);
        n_done += n;
        if n_done >= LOOP_CALLS_WARM && rss_warm.is_none() {
            rss_warm = Some(rss_kib(pid));
        }
    }
    let rss_warm = rss_warm.expect("read");
    let rss_end = rss_kib(pid);
    eprintln!(
        "RSS after {LOOP_CALLS_WARM} calls: {rss_warm} KiB; after {LOOP_CALLS}: {rss_end} KiB"
    );
    assert!(
        rss_end * 10 <= rss_warm * 11,
        "RSS grew from {rss_warm} KiB after {LOOP_CALLS_WARM} calls to {rss_end} KiB after {LOOP_CALLS}"
    );
    raw.close();
}

#[test]
fn sigterm_rolls_back_the_open_sagas_and_exits_0() {
    let project = Project::new();
    fs::write(project.path("ws/a.txt"), "old").expect("writes");
    let mut raw = Raw::start(&project);
    let saga = raw.begin_and_write("ws/a.txt");
    let status = Command::new("kill")
        .args(["-TERM", &raw.child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    assert_eq!(raw.child.wait().expect("exits").code(), Some(0));
    assert_eq!(
        fs::read_to_string(project.path("ws/a.txt")).expect("reads"),
        "old"
    );
    let (code, record) = project.run_json(&["log", "--saga", &saga]);
    assert_eq!(code, 0, "{record}");
    assert_eq!(record["state"], "FailedRolledBack", "{record}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_read_each_tools_description_and_whether_it_can_be_undone() {
    let project = Project::new();
    fs::write(
        project.path("tools.toml"),
        r#"
[tools."mail.send"]
description = "Send a mail"
effect = "mutating"
settlement = "operator"
reversibility = "none"
execute = ["true"]

[tools."refund.issue"]
effect = "mutating"
settlement = "compensate"
reversibility = "partial"
execute = ["true"]
compensate = ["true"]
"#,
    )
    .expect("writes the tools file");
    let client = connect(&project, &[]).await;
    let tools = client.list_all_tools().await.expect("lists tools");
    let tool = |name: &str| {
        tools
            .iter()
            .find(|tool| tool.name == name)
            .unwrap_or_else(|| panic!("{name} listed"))
            .clone()
    };
    let destructive = |name: &str| tool(name).annotations.expect("annotated").destructive_hint;
    assert_eq!(destructive("fs_write"), Some(false), "compensated exactly");
    assert_eq!(destructive("mail_send"), Some(true), "cannot be undone");
    assert_eq!(
        destructive("refund_issue"),
        Some(true),
        "undone only in part"
    );
    let described = |name: &str| tool(name).description.expect("described").to_string();
    assert!(
        described("mail_send").starts_with("Send a mail."),
        "{}",
        described("mail_send")
    );
    assert!(described("mail_send").contains("cannot be undone"));
    assert!(described("refund_issue").contains("`refund.issue`"));
    assert!(described("fs_write").contains("previous bytes"));
    assert!(
        described("fs_read").contains("it only reads. File paths must lie under"),
        "{}",
        described("fs_read")
    );
    client.cancel().await.expect("closes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_that_needs_approval_answers_pending_and_saga_resume_runs_it_once_approved() {
    let project = Project::new();
    fs::write(
        project.path("sandbox.toml"),
        "[fs]\nallow = [\"ws\"]\n\n[approval]\nrequire = [\"fs.append\"]\n",
    )
    .expect("writes policy");
    let client = connect(&project, &[]).await;
    let tools = client.list_all_tools().await.expect("lists");
    let names: Vec<&str> = tools.iter().map(|tool| tool.name.as_ref()).collect();
    assert!(names.contains(&"saga_resume"), "{names:?}");
    let described = |name: &str| {
        tools
            .iter()
            .find(|tool| tool.name == name)
            .and_then(|tool| tool.description.clone())
            .unwrap_or_default()
    };
    assert!(
        described("fs_append").contains("approval"),
        "{}",
        described("fs_append")
    );
    assert!(
        !described("fs_write").contains("approval"),
        "{}",
        described("fs_write")
    );
    for decision in [
        "approve",
        "reject",
        "approvals",
        "dlq_retry",
        "dlq_resolve",
        "undo",
    ] {
        assert!(
            !names.iter().any(|name| name.contains(decision)),
            "no tool of the agent decides an approval: {names:?}"
        );
    }

    let saga_id = begin(&client).await;
    let args = json!({"saga_id": saga_id, "args": {"path": "ws/log.txt", "content": "once\n"}});
    let pending = call(&client, "fs_append", args).await;
    let answer = ok(&pending).clone();
    assert_eq!(answer["status"], "AWAITING_APPROVAL");
    assert_eq!(answer["saga_id"], saga_id.as_str());
    assert_eq!(
        (answer["step"].clone(), answer["tool"].clone()),
        (json!(0), json!("fs.append"))
    );
    let approval_id = answer["approval"]["id"].as_str().expect("an id").to_owned();
    assert!(
        answer["approval"]["digest"]
            .as_str()
            .is_some_and(|d| d.len() == 64)
    );
    assert!(answer["approval"]["expires_at"].is_string());
    assert!(!project.path("ws/log.txt").exists(), "nothing ran");

    // Still pending: the same answer, and the status names the request.
    let again = call(&client, "saga_resume", json!({"saga_id": saga_id})).await;
    assert_eq!(ok(&again)["status"], "AWAITING_APPROVAL");
    let status = call(&client, "saga_status", json!({"saga_id": saga_id})).await;
    assert_eq!(ok(&status)["approval"]["id"], approval_id.as_str());

    // The operator decides outside the agent's reach.
    let output = project.run(&["approve", &approval_id]);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        crate::describe(&output)
    );
    let resumed = call(&client, "saga_resume", json!({"saga_id": saga_id})).await;
    let step = ok(&resumed);
    assert_eq!(
        (step["status"].clone(), step["step"].clone()),
        (json!("COMMIT"), json!(0))
    );
    // Resumed again, once the step ran: refused, and the saga stays open to commit.
    let twice = call(&client, "saga_resume", json!({"saga_id": saga_id})).await;
    assert_eq!(error_kind(&twice), "bad_input");
    let commit = call(&client, "saga_commit", json!({"saga_id": saga_id})).await;
    assert_eq!(ok(&commit)["state"], "Done");
    assert_eq!(
        fs::read_to_string(project.path("ws/log.txt")).expect("reads"),
        "once\n"
    );

    // A call of its own waits too; rejected, resuming it rolls it back.
    let alone = call(
        &client,
        "fs_append",
        json!({"args": {"path": "ws/log.txt", "content": "twice\n"}}),
    )
    .await;
    let alone = ok(&alone).clone();
    assert_eq!(alone["status"], "AWAITING_APPROVAL");
    let id = alone["approval"]["id"].as_str().expect("an id").to_owned();
    let output = project.run(&["reject", &id, "--reason", "once is enough"]);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        crate::describe(&output)
    );
    let rolled_back = call(&client, "saga_resume", json!({"saga_id": alone["saga_id"]})).await;
    assert_eq!(error_kind(&rolled_back), "denied");
    assert!(
        content(&rolled_back)["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("once is enough"))
    );
    assert_eq!(
        fs::read_to_string(project.path("ws/log.txt")).expect("reads"),
        "once\n"
    );

    // A commit while a step waits rolls the saga back, and its answer says so.
    let waiting = begin(&client).await;
    let written = call(
        &client,
        "fs_write",
        json!({"saga_id": waiting, "args": {"path": "ws/w.txt", "content": "w"}}),
    )
    .await;
    assert_eq!(ok(&written)["status"], "COMMIT");
    let args = json!({"saga_id": waiting, "args": {"path": "ws/log.txt", "content": "x\n"}});
    assert_eq!(
        ok(&call(&client, "fs_append", args).await)["status"],
        "AWAITING_APPROVAL"
    );
    let refused = call(&client, "saga_commit", json!({"saga_id": waiting})).await;
    assert_eq!(error_kind(&refused), "denied");
    let answer = content(&refused);
    assert_eq!(answer["state"], "FailedRolledBack", "{answer}");
    assert_eq!(answer["steps"][0]["status"], "COMPENSATED", "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("rolled back")),
        "{answer}"
    );
    assert!(!project.path("ws/w.txt").exists());
    client.cancel().await.expect("closes");
}

/// `tools`, `run` and `mcp` take their kernel from one wiring: started in the same folder
/// with nothing but `--db`, the MCP server offers exactly the tools `tools` lists (the
/// drill tools aside), the folder's command tool among them, and rules on paths with the
/// same policy as a plan's run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mcp_server_and_the_command_line_wire_the_same_kernel_from_one_folder() {
    let project = Project::new();
    fs::write(
        project.path("tools.toml"),
        "[tools.\"note.read\"]\neffect = \"read-only\"\nsettlement = \"compensate\"\nexecute = [\"cat\"]\n",
    )
    .expect("writes the tools file");
    let (code, listed) = project.run_json(&["tools"]);
    assert_eq!(code, 0, "{listed}");
    let mut from_cli: Vec<String> = listed["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|tool| tool["tool"].as_str())
        .filter(|id| !id.starts_with("fault."))
        .map(|id| id.replace('.', "_"))
        .collect();
    from_cli.sort();
    assert!(from_cli.contains(&"note_read".to_owned()), "{from_cli:?}");

    let client = connect(&project, &[]).await;
    let mut from_mcp: Vec<String> = client
        .list_all_tools()
        .await
        .expect("lists")
        .iter()
        .map(|tool| tool.name.to_string())
        .filter(|name| !name.starts_with("saga_"))
        .collect();
    from_mcp.sort();
    assert_eq!(from_mcp, from_cli);

    for (path, allowed) in [("ws/inside.txt", true), ("outside.txt", false)] {
        let result = call(
            &client,
            "fs_write",
            json!({ "args": { "path": path, "content": "mcp" } }),
        )
        .await;
        assert_eq!(result.is_error, Some(!allowed), "mcp, {path}: {result:?}");
        let plan = project.plan(
            "plan.json",
            &json!({ "steps": [{ "tool": "fs.write", "args": { "path": path, "content": "run" } }] }),
        );
        let output = project.run(&["run", "--plan", plan.to_str().expect("UTF-8")]);
        let expected = if allowed { 0 } else { 4 };
        assert_eq!(
            output.status.code(),
            Some(expected),
            "run, {path}: {output:?}"
        );
    }
    assert!(!project.path("outside.txt").exists());
    client.cancel().await.expect("closes");
}

/// The Claude Code snippet's arguments (`integrations/claude-code/add.sh`, `$PWD` the
/// project) start a server from any folder that loads the project's tools file and takes
/// relative paths from the project, as a server started in the project does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_snippets_arguments_serve_the_project_from_another_folder() {
    let project = Project::new();
    fs::write(
        project.path("tools.toml"),
        "[tools.\"note.read\"]\neffect = \"read-only\"\nsettlement = \"compensate\"\nexecute = [\"cat\"]\n",
    )
    .expect("writes the tools file");
    let folder = project.path("");
    let args =
        crate::integrations::add_sh_args(folder.to_str().expect("UTF-8").trim_end_matches('/'));
    let elsewhere = tempfile::tempdir().expect("another folder");
    let mut command = tokio::process::Command::new(crate::bin());
    command
        .current_dir(elsewhere.path())
        .env_remove("AGENT_KERNEL_DB")
        .env_remove("AGENT_KERNEL_AUDIT_KEY")
        .env_remove("RUST_LOG")
        .args(&args);
    let client: Client =
        ().serve(TokioChildProcess::new(command).expect("the server starts"))
            .await
            .expect("the session initializes");
    let names: Vec<String> = client
        .list_all_tools()
        .await
        .expect("lists")
        .iter()
        .map(|tool| tool.name.to_string())
        .collect();
    assert!(names.contains(&"note_read".to_owned()), "{names:?}");
    let written = call(
        &client,
        "fs_write",
        json!({ "args": { "path": "ws/snippet.txt", "content": "from elsewhere" } }),
    )
    .await;
    ok(&written);
    assert_eq!(
        fs::read_to_string(project.path("ws/snippet.txt")).expect("written in the project"),
        "from elsewhere"
    );
    assert!(!elsewhere.path().join("ws").exists());
    // The project's own log holds the saga.
    assert!(project.path("agent-kernel.db").exists());
    assert!(!elsewhere.path().join("agent-kernel.db").exists());
    client.cancel().await.expect("closes");
}

/// A call without `saga_id` is one saga in two synced commits (its creation rides with the
/// step's BEGIN, its COMMIT with `Done`): the server SIGKILLed while the step's program
/// runs leaves the saga begun in the log, and `recover` compensates it.
#[test]
fn a_server_killed_during_an_autocommit_call_leaves_it_to_recover() {
    let project = Project::new();
    fs::write(
        project.path("tools.toml"),
        r#"[tools."slow.add"]
effect = "mutating"
settlement = "compensate"
execute = ["sh", "-c", "echo added >> ws/slow.txt; sleep 30"]
compensate = ["sh", "-c", "rm -f ws/slow.txt"]
"#,
    )
    .expect("writes the tools file");
    let mut raw = Raw::start(&project);
    raw.send_line(
        &json!({
            "jsonrpc": "2.0", "id": 99, "method": "tools/call",
            "params": { "name": "slow_add", "arguments": { "args": {} } },
        })
        .to_string(),
    );
    crate::wait_until("the program never ran", || {
        fs::read_to_string(project.path("ws/slow.txt")).is_ok_and(|text| text == "added\n")
    });
    crate::sigkill(&mut raw.child).expect("SIGKILLs");
    raw.child.wait().expect("reaps");
    let (code, listed) = project.run_json(&["log"]);
    assert_eq!(code, 0, "{listed}");
    let sagas = listed["sagas"].as_array().expect("sagas");
    assert_eq!(sagas.len(), 1, "{listed}");
    assert_eq!(sagas[0]["state"], "Acting", "begun with its step: {listed}");
    let (code, report) = project.run_json(&["recover"]);
    assert_eq!(code, 0, "{report}");
    assert!(!project.path("ws/slow.txt").exists());
    let (code, listed) = project.run_json(&["log"]);
    assert_eq!(code, 0, "{listed}");
    assert_eq!(listed["sagas"][0]["state"], "FailedRolledBack", "{listed}");
}

/// Autocommit writes, the server SIGKILLed at random moments, then `recover`: every file
/// is written exactly when its saga is `Done`, and no saga is left unsettled.
#[test]
fn autocommit_calls_killed_at_random_moments_end_done_or_undone() {
    use rand::{Rng, SeedableRng};
    const ROUNDS: usize = 12;
    const CALLS: usize = 6;
    let seed = crate::seed_from_env("AGENT_KERNEL_MCP_KILL_SEED");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let project = Project::new();
    for round in 0..ROUNDS {
        let mut raw = Raw::start(&project);
        for call in 0..CALLS {
            let request = json!({
                "jsonrpc": "2.0", "id": 1000 + call, "method": "tools/call",
                "params": { "name": "fs_write", "arguments": {
                    "args": { "path": format!("ws/r{round}c{call}.txt"), "content": "x" }
                } },
            });
            raw.send_line(&request.to_string());
        }
        std::thread::sleep(std::time::Duration::from_micros(
            rng.random_range(0..20_000),
        ));
        crate::sigkill(&mut raw.child).expect("SIGKILLs");
        raw.child.wait().expect("reaps");
        let (code, report) = project.run_json(&["recover"]);
        assert_eq!(code, 0, "seed {seed}, round {round}: {report}");
    }
    let (code, listed) = project.run_json(&["log", "--limit", "1000"]);
    assert_eq!(code, 0, "{listed}");
    let mut done = std::collections::BTreeSet::new();
    for saga in listed["sagas"].as_array().expect("sagas") {
        let id = saga["saga_id"].as_str().expect("an id");
        let state = saga["state"].as_str().expect("a state");
        assert!(
            ["Done", "FailedRolledBack"].contains(&state),
            "seed {seed}: {saga}"
        );
        let (_, record) = project.run_json(&["log", "--saga", id]);
        let path = record["steps"][0]["args"]["path"]
            .as_str()
            .map(str::to_owned);
        if state == "Done" {
            done.insert(path.expect("a Done saga wrote its file"));
        }
    }
    eprintln!(
        "seed {seed}: {} of {} calls ended Done",
        done.len(),
        ROUNDS * CALLS
    );
    for round in 0..ROUNDS {
        for call in 0..CALLS {
            let path = format!("ws/r{round}c{call}.txt");
            assert_eq!(
                project.path(&path).exists(),
                done.contains(&path),
                "seed {seed}: {path}"
            );
        }
    }
}
