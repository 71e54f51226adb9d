//! Live OTLP export through the real binary (reference §12): with
//! `OTEL_EXPORTER_OTLP_ENDPOINT` set, `run` and `mcp` send their sagas' spans to an
//! OTLP/HTTP collector on loopback (JSON or protobuf), the same spans `export --otel`
//! writes; `mcp` sends them while it runs; a dead or silent collector never fails a saga
//! and never holds the process past its bound; malformed settings are bad input.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use serde_json::{Value, json};

use crate::{Project, describe, wait_until};

/// Spans as (span id, name).
type SpanSet = BTreeSet<(Vec<u8>, String)>;

/// One request the collector received.
#[derive(Debug, Clone)]
struct Received {
    path: String,
    content_type: String,
    body: Vec<u8>,
}

/// An OTLP/HTTP collector on loopback: it keeps every request and answers 200, or, when
/// `silent`, reads requests and never answers.
struct Collector {
    url: String,
    received: Arc<Mutex<Vec<Received>>>,
}

impl Collector {
    fn start(silent: bool) -> Collector {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binds");
        let url = format!("http://{}", listener.local_addr().expect("an address"));
        let received = Arc::new(Mutex::new(Vec::new()));
        let store = Arc::clone(&received);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let store = Arc::clone(&store);
                std::thread::spawn(move || serve(stream, &store, silent));
            }
        });
        Collector { url, received }
    }

    /// Every span received so far, as (span id, name), with the requests' paths and types.
    fn spans(&self) -> (SpanSet, BTreeSet<(String, String)>) {
        let received = self.received.lock().expect("locks").clone();
        let mut spans = BTreeSet::new();
        let mut kinds = BTreeSet::new();
        for request in received {
            let decoded = if request.content_type == "application/x-protobuf" {
                ExportTraceServiceRequest::decode(request.body.as_slice()).expect("protobuf")
            } else {
                serde_json::from_slice(&request.body).expect("OTLP/JSON")
            };
            for resource in decoded.resource_spans {
                for scope in resource.scope_spans {
                    for span in scope.spans {
                        spans.insert((span.span_id, span.name));
                    }
                }
            }
            kinds.insert((request.path, request.content_type));
        }
        (spans, kinds)
    }
}

/// Serves one connection's requests (HTTP/1.1, keep-alive) until it closes.
fn serve(stream: TcpStream, store: &Mutex<Vec<Received>>, silent: bool) {
    let mut writer = stream.try_clone().expect("clones");
    let mut reader = BufReader::new(stream);
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let path = request_line
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_owned();
        let (mut length, mut content_type) = (0, String::new());
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                match name.to_ascii_lowercase().as_str() {
                    "content-length" => length = value.trim().parse().unwrap_or(0),
                    "content-type" => value.trim().clone_into(&mut content_type),
                    _ => {}
                }
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        if silent {
            // Never answers: the exporter must give up on its own.
            std::thread::park();
            return;
        }
        store.lock().expect("locks").push(Received {
            path,
            content_type,
            body,
        });
        let answer =
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
        if writer.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

/// The binary with the OTLP variables for `url` (a short schedule, so spans go out soon).
fn exporting(project: &Project, url: &str, args: &[&str]) -> Command {
    let mut command = project.command(args);
    command
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", url)
        .env("OTEL_BSP_SCHEDULE_DELAY", "20");
    command
}

fn failing_plan(project: &Project) -> String {
    let plan = project.plan(
        "plan.json",
        &json!({ "name": "exported", "steps": [
            {"tool": "fs.write", "args": {"path": "ws/a.txt", "content": "a"}},
            {"tool": "fs.write", "args": {"path": "ws/b.txt", "content": "b"}},
            {"tool": "fault.fail", "args": {"message": "no"}},
        ]}),
    );
    plan.to_str().expect("utf8").to_owned()
}

/// The spans `export --otel --saga ID` writes, as (span id, name).
fn exported(project: &Project, saga_id: &str) -> SpanSet {
    let output = project.run(&["export", "--otel", "--saga", saga_id]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let request: ExportTraceServiceRequest =
        serde_json::from_slice(&output.stdout).expect("OTLP/JSON");
    request.resource_spans[0].scope_spans[0]
        .spans
        .iter()
        .map(|span| (span.span_id.clone(), span.name.clone()))
        .collect()
}

fn run(command: &mut Command) -> Output {
    command.output().expect("runs")
}

#[test]
fn run_sends_the_same_spans_as_export_over_json_and_protobuf() {
    for (protocol, content_type) in [
        ("http/json", "application/json"),
        ("http/protobuf", "application/x-protobuf"),
    ] {
        let project = Project::new();
        let collector = Collector::start(false);
        let plan = failing_plan(&project);
        let output = run(
            exporting(&project, &collector.url, &["run", "--plan", &plan])
                .env("OTEL_EXPORTER_OTLP_PROTOCOL", protocol),
        );
        assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
        let (saga_id, state) = project.latest_saga().expect("a saga");
        assert_eq!(state, "FailedRolledBack");
        let (spans, kinds) = collector.spans();
        assert_eq!(
            kinds,
            BTreeSet::from([("/v1/traces".to_owned(), content_type.to_owned())])
        );
        let expected = exported(&project, &saga_id);
        assert_eq!(expected.len(), 6, "a root, three steps, two compensations");
        assert_eq!(spans, expected, "{protocol}: the spans of `export --otel`");
    }
}

#[test]
fn mcp_sends_a_sagas_spans_while_it_runs() {
    let project = Project::new();
    let collector = Collector::start(false);
    let mut child = exporting(&project, &collector.url, &["-q", "mcp"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawns");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut ask = |id: u64, method: &str, params: Value| -> Value {
        let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        writeln!(stdin, "{message}").expect("writes");
        loop {
            let mut line = String::new();
            assert!(
                stdout.read_line(&mut line).expect("reads") > 0,
                "the server ended"
            );
            let answer: Value = serde_json::from_str(&line).expect("JSON");
            if answer.get("id") == Some(&json!(id)) {
                return answer;
            }
        }
    };
    let init = json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "otlp", "version": "1"}});
    ask(0, "initialize", init);
    let call = |name: &str, arguments: Value| json!({"name": name, "arguments": arguments});
    let begun = ask(1, "tools/call", call("saga_begin", json!({"name": "live"})));
    let saga_id = begun["result"]["structuredContent"]["saga_id"]
        .as_str()
        .expect("a saga id")
        .to_owned();
    let args = json!({"saga_id": saga_id, "args": {"path": "ws/live.txt", "content": "x"}});
    ask(2, "tools/call", call("fs_write", args));
    ask(
        3,
        "tools/call",
        call("saga_commit", json!({"saga_id": saga_id})),
    );
    // The server is still running: the spans arrive while it waits for the next call.
    let expected = exported(&project, &saga_id);
    wait_until("the collector has the saga's spans", || {
        collector.spans().0 == expected
    });
    assert!(child.try_wait().expect("polls").is_none(), "still running");
    drop(stdin);
    let status = child.wait().expect("waits");
    assert_eq!(status.code(), Some(0));
}

#[test]
fn a_dead_or_silent_collector_never_fails_a_saga_or_holds_the_process() {
    let plan = |project: &Project| {
        project
            .plan(
                "plan.json",
                &json!({"steps": [{"tool": "fs.write", "args": {"path": "ws/a.txt", "content": "a"}}]}),
            )
            .to_str()
            .expect("utf8")
            .to_owned()
    };
    // Nothing listens on the port.
    let closed = TcpListener::bind("127.0.0.1:0").expect("binds");
    let url = format!("http://{}", closed.local_addr().expect("an address"));
    drop(closed);
    let project = Project::new();
    let output = run(&mut exporting(
        &project,
        &url,
        &["run", "--plan", &plan(&project)],
    ));
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("dropped"), "{stderr}");

    // A collector that takes the request and never answers, with a request timeout of ten
    // minutes: the process still ends once FLUSH_AT_EXIT_MAX (2 s) has passed.
    let silent = Collector::start(true);
    let project = Project::new();
    let started = std::time::Instant::now();
    let output = run(
        exporting(&project, &silent.url, &["run", "--plan", &plan(&project)])
            .env("OTEL_EXPORTER_OTLP_TIMEOUT", "600000"),
    );
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    assert_eq!(project.latest_saga().expect("a saga").1, "Done");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(60),
        "the exit waited {:?} for a silent collector",
        started.elapsed()
    );
}

#[test]
fn malformed_otlp_settings_are_bad_input_and_nothing_runs() {
    for (name, value) in [
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ("OTEL_BSP_SCHEDULE_DELAY", "soon"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "no-equals-sign"),
    ] {
        let project = Project::new();
        let plan = failing_plan(&project);
        let output = run(
            exporting(&project, "http://127.0.0.1:9", &["run", "--plan", &plan]).env(name, value),
        );
        assert_eq!(
            output.status.code(),
            Some(2),
            "{name}: {}",
            describe(&output)
        );
        assert!(
            String::from_utf8_lossy(&output.stderr).contains(name),
            "{name}: {}",
            describe(&output)
        );
        assert!(!project.db().exists(), "{name}: no log was created");
    }
    let project = Project::new();
    let output = run(&mut exporting(
        &project,
        "ftp://collector",
        &["run", "--plan", &failing_plan(&project)],
    ));
    assert_eq!(output.status.code(), Some(2), "{}", describe(&output));
}
