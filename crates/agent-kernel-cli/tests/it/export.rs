//! `export --otel` through the real binary (reference §12): the JSON parses back into an
//! `ExportTraceServiceRequest`; ids have their lengths, parents are consistent, every step
//! and compensation has its span, times are monotone within a saga; golden documents (ids,
//! times and saga ids normalized) for a committed, a rolled-back and a partial saga.
//! `AGENT_KERNEL_BLESS=1` rewrites the golden files.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::PathBuf;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_proto::tonic::trace::v1::Span;
use serde_json::{Value, json};

use crate::dlq::{NOTE_PY, TOOLS_TOML};
use crate::{Project, describe};

fn step(tool: &str, args: Value) -> Value {
    json!({ "tool": tool, "args": args })
}

/// Runs `plan` (expecting `code`) and returns its saga id.
fn run_saga(project: &Project, name: &str, plan: &Value, code: i32) -> String {
    let plan = project.plan(name, plan);
    let output = project.run(&["run", "--plan", plan.to_str().expect("utf8")]);
    assert_eq!(output.status.code(), Some(code), "{}", describe(&output));
    project.latest_saga().expect("a saga").0
}

/// The three sagas of the golden tests in one log: (committed, rolled back, partial).
fn three_sagas(project: &Project) -> (String, String, String) {
    fs::write(project.path("note.py"), NOTE_PY).expect("writes");
    fs::write(project.path("tools.toml"), TOOLS_TOML).expect("writes");
    let done = run_saga(
        project,
        "done.json",
        &json!({ "name": "committed", "steps": [
            step("fs.write", json!({"path": "ws/a.txt", "content": "a"})),
            {"tool": "fs.write", "args": {"path": "ws/b.txt", "content": "b"}, "idempotency_key": "write-b"},
        ]}),
        0,
    );
    let rolled_back = run_saga(
        project,
        "failing.json",
        &json!({ "name": "rolled-back", "steps": [
            step("fs.write", json!({"path": "ws/c.txt", "content": "c"})),
            step("fs.write", json!({"path": "ws/d.txt", "content": "d"})),
            step("fault.fail", json!({"message": "deployment check failed"})),
        ]}),
        1,
    );
    fs::write(project.path("ws/block"), "").expect("writes");
    let partial = run_saga(
        project,
        "partial.json",
        &json!({ "name": "partial", "steps": [
            step("note.add", json!({"item": "x"})),
            step("fault.fail", json!({"message": "no"})),
        ]}),
        3,
    );
    (done, rolled_back, partial)
}

/// `export --otel --saga ID` parsed as JSON and as the OTLP request.
fn export(project: &Project, saga_id: &str) -> (Value, ExportTraceServiceRequest) {
    let output = project.run(&["export", "--otel", "--saga", saga_id]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let text = String::from_utf8(output.stdout).expect("utf8");
    let value: Value = serde_json::from_str(&text).expect("JSON");
    let request: ExportTraceServiceRequest = serde_json::from_str(&text).expect("OTLP/JSON");
    (value, request)
}

fn attribute<'a>(span: &'a Span, key: &str) -> Option<&'a any_value::Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|value| value.value.as_ref())
}

fn text<'a>(span: &'a Span, key: &str) -> &'a str {
    match attribute(span, key) {
        Some(any_value::Value::StringValue(text)) => text,
        other => panic!("span {} has no string {key}: {other:?}", span.name),
    }
}

/// Checks the structure every saga's trace must have, and returns its spans by kind:
/// (root, steps, compensations).
pub(crate) fn check_trace(request: &ExportTraceServiceRequest) -> (Span, Vec<Span>, Vec<Span>) {
    assert_eq!(request.resource_spans.len(), 1);
    let resource = request.resource_spans[0]
        .resource
        .as_ref()
        .expect("a resource");
    let service = resource
        .attributes
        .iter()
        .find(|kv| kv.key == "service.name")
        .expect("service.name");
    assert_eq!(
        service.value.as_ref().and_then(|v| v.value.clone()),
        Some(any_value::Value::StringValue("agent-kernel".to_owned()))
    );
    let spans: Vec<Span> = request.resource_spans[0]
        .scope_spans
        .iter()
        .flat_map(|scope| scope.spans.clone())
        .collect();
    let roots: Vec<&Span> = spans
        .iter()
        .filter(|span| span.parent_span_id.is_empty())
        .collect();
    assert_eq!(roots.len(), 1, "one root span per saga");
    let root = roots[0].clone();
    let mut ids = BTreeSet::new();
    for span in &spans {
        assert_eq!(span.trace_id.len(), 16, "{}", span.name);
        assert_eq!(span.span_id.len(), 8, "{}", span.name);
        assert_eq!(span.trace_id, root.trace_id, "one trace per saga");
        assert!(ids.insert(span.span_id.clone()), "span ids are unique");
        assert!(
            span.start_time_unix_nano <= span.end_time_unix_nano,
            "{}",
            span.name
        );
        assert!(span.start_time_unix_nano >= root.start_time_unix_nano);
        assert!(span.end_time_unix_nano <= root.end_time_unix_nano);
        if span.span_id != root.span_id {
            assert_eq!(span.parent_span_id, root.span_id, "{}", span.name);
        }
        for event in &span.events {
            assert!(event.time_unix_nano >= root.start_time_unix_nano);
            assert!(event.time_unix_nano <= root.end_time_unix_nano);
        }
    }
    let steps: Vec<Span> = spans
        .iter()
        .filter(|span| span.name.starts_with("execute_tool "))
        .cloned()
        .collect();
    let compensations: Vec<Span> = spans
        .iter()
        .filter(|span| span.name.starts_with("compensate "))
        .cloned()
        .collect();
    // Steps run one after another; compensations too, last step first.
    for pair in steps.windows(2) {
        assert!(pair[0].end_time_unix_nano <= pair[1].start_time_unix_nano);
    }
    for pair in compensations.windows(2) {
        assert!(pair[0].end_time_unix_nano <= pair[1].start_time_unix_nano);
    }
    for span in &steps {
        assert_eq!(text(span, "gen_ai.operation.name"), "execute_tool");
        assert_eq!(
            span.name,
            format!("execute_tool {}", text(span, "gen_ai.tool.name"))
        );
        assert!(!text(span, "gen_ai.tool.call.id").is_empty());
    }
    for span in &compensations {
        assert_eq!(span.links.len(), 1);
        assert!(
            steps
                .iter()
                .any(|step| step.span_id == span.links[0].span_id),
            "a compensation links to its step"
        );
        if let Some(last) = steps.last() {
            assert!(span.start_time_unix_nano >= last.end_time_unix_nano);
        }
    }
    (root, steps, compensations)
}

/// The document with what changes from run to run replaced: ids by their order of first
/// appearance, times by `<time>` (their order is checked by `check_trace`: two records may
/// or may not share a millisecond), UUIDs, and millisecond fields.
fn normalize(document: &Value) -> Value {
    fn walk(value: &Value, ids: &mut BTreeMap<String, String>) -> Value {
        match value {
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(key, inner)| {
                        let replaced = if key.ends_with("UnixNano") {
                            json!("<time>")
                        } else if ["traceId", "spanId", "parentSpanId"].contains(&key.as_str()) {
                            let id = inner.as_str().unwrap_or_default().to_owned();
                            if id.is_empty() {
                                json!("")
                            } else {
                                let next = format!("<id {}>", ids.len());
                                json!(ids.entry(id).or_insert(next).clone())
                            }
                        } else {
                            walk(inner, ids)
                        };
                        (key.clone(), replaced)
                    })
                    .collect(),
            ),
            Value::Array(items) => Value::Array(items.iter().map(|item| walk(item, ids)).collect()),
            Value::String(text) => json!(mask_uuids(text)),
            other => other.clone(),
        }
    }
    let mut normalized = walk(document, &mut BTreeMap::new());
    // Millisecond fields of records (deadlines, retry times) and the version of the build.
    mask_fields(&mut normalized);
    normalized
}

/// `text` with every UUID replaced by `<uuid>`.
fn mask_uuids(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::new();
    let mut i = 0;
    while i < bytes.len() {
        let candidate = &text[i..text.len().min(i + 36)];
        let is_uuid = candidate.len() == 36
            && candidate.char_indices().all(|(j, c)| match j {
                8 | 13 | 18 | 23 => c == '-',
                _ => c.is_ascii_hexdigit(),
            });
        if is_uuid {
            out.push_str("<uuid>");
            i += 36;
        } else {
            let c = text[i..].chars().next().expect("a char");
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// Attributes whose values change from run to run, set to a placeholder.
fn mask_fields(value: &mut Value) {
    match value {
        Value::Object(map) => {
            let volatile = map
                .get("key")
                .and_then(Value::as_str)
                .is_some_and(|key| key.ends_with("_ms") || key == "service.version");
            if volatile {
                map.insert("value".to_owned(), json!("<volatile>"));
            }
            map.values_mut().for_each(mask_fields);
        }
        Value::Array(items) => items.iter_mut().for_each(mask_fields),
        _ => {}
    }
}

fn golden(name: &str, document: &Value) {
    let path: PathBuf = [env!("CARGO_MANIFEST_DIR"), "tests", "it", "golden", name]
        .iter()
        .collect();
    let normalized = normalize(document);
    let text = serde_json::to_string_pretty(&normalized).expect("prints") + "\n";
    if std::env::var_os("AGENT_KERNEL_BLESS").is_some() {
        fs::create_dir_all(path.parent().expect("a folder")).expect("creates");
        fs::write(&path, &text).expect("writes");
        return;
    }
    let expected = fs::read_to_string(&path).unwrap_or_else(|error| {
        panic!(
            "{}: {error} (AGENT_KERNEL_BLESS=1 writes it)",
            path.display()
        )
    });
    assert_eq!(
        text,
        expected,
        "{} differs (AGENT_KERNEL_BLESS=1 rewrites it)",
        path.display()
    );
}

#[test]
fn committed_rolled_back_and_partial_sagas_export_as_traces_that_match_their_golden_files() {
    let project = Project::new();
    let (done, rolled_back, partial) = three_sagas(&project);

    let (document, request) = export(&project, &done);
    let (root, steps, compensations) = check_trace(&request);
    assert_eq!(root.name, "saga committed");
    assert_eq!(text(&root, "agent_kernel.saga.state"), "Done");
    assert_eq!(steps.len(), 2);
    assert!(compensations.is_empty());
    assert_eq!(text(&steps[1], "agent_kernel.idempotency_key"), "write-b");
    assert_eq!(
        hex(&root.trace_id),
        done.replace('-', ""),
        "the trace id is the saga's UUID"
    );
    golden("otel_committed.json", &document);

    let (document, request) = export(&project, &rolled_back);
    let (root, steps, compensations) = check_trace(&request);
    assert_eq!(text(&root, "agent_kernel.saga.state"), "FailedRolledBack");
    assert_eq!(steps.len(), 3);
    let failed = &steps[2];
    assert_eq!(text(failed, "error.type"), "failed");
    assert_eq!(
        failed.status.as_ref().map(|status| status.code),
        Some(2),
        "ERROR"
    );
    // The two writes compensated, last first.
    assert_eq!(compensations.len(), 2);
    assert_eq!(compensations[0].links[0].span_id, steps[1].span_id);
    assert_eq!(compensations[1].links[0].span_id, steps[0].span_id);
    golden("otel_rolled_back.json", &document);

    let (document, request) = export(&project, &partial);
    let (root, _, compensations) = check_trace(&request);
    assert_eq!(
        text(&root, "agent_kernel.saga.state"),
        "FailedRollbackPartial"
    );
    assert_eq!(text(&root, "error.type"), "rollback_partial");
    assert_eq!(compensations.len(), 1);
    assert_eq!(text(&compensations[0], "error.type"), "compensation_failed");
    golden("otel_partial.json", &document);

    // --all holds the three traces; --out writes the same document to a file.
    let output = project.run(&["export", "--otel", "--all", "--out", "all.json"]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    assert!(output.stdout.is_empty());
    let all: ExportTraceServiceRequest =
        serde_json::from_str(&fs::read_to_string(project.path("all.json")).expect("reads"))
            .expect("OTLP/JSON");
    let traces: BTreeSet<Vec<u8>> = all.resource_spans[0].scope_spans[0]
        .spans
        .iter()
        .map(|span| span.trace_id.clone())
        .collect();
    assert_eq!(traces.len(), 3);
}

#[test]
fn export_refuses_what_it_cannot_export() {
    let project = Project::new();
    let output = project.run(&["export", "--otel", "--saga", "no-such-saga"]);
    assert_eq!(output.status.code(), Some(2), "{}", describe(&output));
    // No log.
    let output = project.run(&["export", "--otel", "--all"]);
    assert_eq!(output.status.code(), Some(2), "{}", describe(&output));
    // Neither --saga nor --all, or both, or no --otel: usage errors.
    for args in [
        &["export", "--otel"][..],
        &["export", "--otel", "--all", "--saga", "x"],
        &["export", "--all"],
    ] {
        let output = project.run(args);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            describe(&output)
        );
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}
