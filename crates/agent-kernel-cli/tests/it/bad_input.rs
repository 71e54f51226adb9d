//! Bad input: a clear message, exit 2, nothing executed, the existing log intact.

use std::fs;

use serde_json::json;

use crate::{Project, describe};

/// Seeds the log with one finished saga so "the existing log intact" means something.
fn seeded() -> Project {
    let project = Project::new();
    let plan = project.plan(
        "seed.json",
        &json!({ "steps": [ { "tool": "fs.write", "args": {"path": "ws/seed.txt", "content": "seed"} } ] }),
    );
    let output = project.run(&["run", "--plan", plan.to_str().expect("utf8")]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    project
}

/// Runs `args` and checks: exit 2, stderr mentions `fragment`, no file changed, log intact.
fn check(project: &Project, args: &[&str], fragment: &str) {
    let files_before = project.snapshot();
    let log_before = log_contents(project);
    let output = project.run(args);
    assert_eq!(
        output.status.code(),
        Some(2),
        "{args:?}: {}",
        describe(&output)
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(fragment),
        "{args:?}: stderr lacks `{fragment}`:\n{}",
        describe(&output)
    );
    assert!(
        output.stdout.is_empty(),
        "{args:?}: nothing on stdout without --json"
    );
    assert_eq!(
        project.snapshot(),
        files_before,
        "{args:?}: files untouched"
    );
    // SQLite may checkpoint its WAL into the main file when a connection closes, so the
    // bytes may move; what must not change is any record.
    assert!(
        log_contents(project) == log_before,
        "{args:?}: log records intact"
    );
}

/// Every saga in the log with every step, as `log --json` shows them.
fn log_contents(project: &Project) -> Vec<serde_json::Value> {
    let (code, listed) = project.run_json(&["log", "--limit", "10000"]);
    assert_eq!(code, 0, "{listed}");
    listed["sagas"]
        .as_array()
        .expect("sagas")
        .iter()
        .map(|saga| {
            let (code, shown) =
                project.run_json(&["log", "--saga", saga["saga_id"].as_str().expect("id")]);
            assert_eq!(code, 0, "{shown}");
            shown
        })
        .collect()
}

fn check_plan(project: &Project, text: &str, fragment: &str) {
    let path = project.path("bad.json");
    fs::write(&path, text).expect("writes");
    check(
        project,
        &["run", "--plan", path.to_str().expect("utf8")],
        fragment,
    );
}

#[test]
fn malformed_plans_are_refused() {
    let project = seeded();
    let write = r#"{"tool":"fs.write","args":{"path":"ws/x.txt","content":"x"}}"#;
    let cases: &[(&str, &str)] = &[
        ("", "EOF while parsing"),
        ("{ not json", "key must be a string"),
        (r#"{"steps": []}"#, "`steps` is empty"),
        (r#"{"name": "no steps"}"#, "missing field `steps`"),
        (
            &format!(r#"{{"steps": [{write}], "stepz": 1}}"#),
            "unknown field `stepz`",
        ),
        (
            r#"{"steps": [{"tool": "fs.write", "args": {"path": "ws/x.txt", "content": "x"}, "retries": 3}]}"#,
            "unknown field `retries`",
        ),
        (
            r#"{"steps": [{"tool": "fs.write"}]}"#,
            "missing field `args`",
        ),
        (
            r#"{"steps": [{"tool": "fs.write", "args": "ws/x.txt"}]}"#,
            "must be a JSON object",
        ),
        (
            r#"{"steps": [{"tool": "no.such.tool", "args": {}}]}"#,
            "unknown tool",
        ),
        (
            r#"{"steps": [{"tool": "fs.write", "args": {"path": "ws/x.txt", "contnt": "x"}}]}"#,
            "`/`: additionalProperties: Additional properties are not allowed ('contnt' was unexpected)",
        ),
        (
            r#"{"steps": [{"tool": "fs.write", "args": {"path": 5, "content": "x"}}]}"#,
            "`/path`: type",
        ),
        (
            r#"{"steps": [{"tool": "noop", "args": {"sleep_ms": "soon"}}]}"#,
            "`/sleep_ms`: type",
        ),
        (
            r#"{"steps": [{"tool": "noop", "args": {"sleep_ms": 600000}}]}"#,
            "`/sleep_ms`: maximum",
        ),
        (
            r#"{"steps": [{"tool": "fs.write", "tool": "fs.delete", "args": {}}]}"#,
            "duplicate field `tool`",
        ),
        (
            r#"{"steps": [{"tool": "fs.write", "args": {"path": "ws/x.txt", "path": "/etc/passwd", "content": "x"}}]}"#,
            "duplicate key `path` in the arguments",
        ),
    ];
    for (text, fragment) in cases {
        check_plan(&project, text, fragment);
    }
}

#[test]
fn a_plan_whose_third_step_is_invalid_executes_nothing() {
    let project = seeded();
    check_plan(
        &project,
        r#"{"steps": [
            {"tool": "fs.write", "args": {"path": "ws/one.txt", "content": "1"}},
            {"tool": "fs.write", "args": {"path": "ws/two.txt", "content": "2"}},
            {"tool": "fs.write", "args": {"path": "ws/three.txt"}}
        ]}"#,
        "step 2",
    );
}

#[test]
fn missing_or_unreadable_plan_files_are_refused() {
    let project = seeded();
    check(
        &project,
        &["run", "--plan", "no-such-plan.json"],
        "cannot read plan",
    );
    fs::create_dir(project.path("a-directory.json")).expect("creates");
    check(
        &project,
        &["run", "--plan", "a-directory.json"],
        "cannot read plan",
    );
    fs::write(project.path("binary.json"), b"\xff\xfe\x00garbage").expect("writes");
    check(&project, &["run", "--plan", "binary.json"], "not UTF-8");
}

#[test]
fn usage_errors_exit_2() {
    let project = seeded();
    check(&project, &["run"], "--plan");
    check(&project, &["frobnicate"], "unrecognized subcommand");
    check(&project, &["log", "--limit", "0"], "--limit");
    check(
        &project,
        &["rollback", "--saga", "no-such-saga"],
        "no saga no-such-saga",
    );
    check(
        &project,
        &["rollback", "--saga", "a\nb"],
        "holds control characters",
    );
    check(
        &project,
        &["bench", "--durability", "sometimes"],
        "unknown durability",
    );
}

#[test]
fn a_broken_policy_is_refused() {
    let project = seeded();
    let plan = project.plan(
        "ok.json",
        &json!({ "steps": [ { "tool": "noop", "args": {} } ] }),
    );
    fs::write(project.path("typo.toml"), "[fs]\nalow = [\"ws\"]\n").expect("writes");
    check(
        &project,
        &[
            "--sandbox",
            "typo.toml",
            "run",
            "--plan",
            plan.to_str().expect("utf8"),
        ],
        "alow",
    );
    check(
        &project,
        &[
            "--sandbox",
            "missing.toml",
            "run",
            "--plan",
            plan.to_str().expect("utf8"),
        ],
        "missing.toml",
    );
}

#[test]
fn a_database_that_is_not_a_log_is_refused_and_left_untouched() {
    let project = Project::new();
    let plan = project.plan(
        "ok.json",
        &json!({ "steps": [ { "tool": "fs.write", "args": {"path": "ws/x.txt", "content": "x"} } ] }),
    );
    let notes = project.path("notes.txt");
    fs::write(&notes, b"my precious notes\n").expect("writes");
    let output = project
        .isolated(crate::bin())
        .arg("--db")
        .arg(&notes)
        .args(["run", "--plan", plan.to_str().expect("utf8")])
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(2), "{}", describe(&output));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("not an agent-kernel log"),
        "{}",
        describe(&output)
    );
    assert_eq!(fs::read(&notes).expect("reads"), b"my precious notes\n");
    assert!(project.snapshot().is_empty(), "nothing executed");
}

#[test]
fn json_errors_are_one_document_on_stdout() {
    let project = seeded();
    let path = project.path("bad.json");
    fs::write(
        &path,
        r#"{"steps": [{"tool": "nope", "args": {}}, {"tool": "fs.write", "args": {}}]}"#,
    )
    .expect("writes");
    let (code, document) = project.run_json(&["run", "--plan", path.to_str().expect("utf8")]);
    assert_eq!(code, 2);
    assert_eq!(document["error"]["kind"], "bad_input");
    assert_eq!(
        document["error"]["problems"]
            .as_array()
            .expect("problems")
            .len(),
        2
    );
}

#[test]
fn usage_errors_with_json_are_one_document_on_stdout() {
    let project = Project::new();
    let (code, document) = project.run_json(&["run"]);
    assert_eq!(code, 2);
    assert_eq!(document["error"]["kind"], "usage");
    assert!(
        document["error"]["message"]
            .as_str()
            .expect("message")
            .contains("--plan")
    );
}

#[test]
fn reading_commands_never_create_a_log() {
    let project = Project::new();
    let (code, listed) = project.run_json(&["log"]);
    assert_eq!((code, &listed["sagas"]), (0, &json!([])));
    let (code, recovered) = project.run_json(&["recover"]);
    assert_eq!((code, &recovered["sagas"]), (0, &json!([])));
    let output = project.run(&["log", "--saga", "abc"]);
    assert_eq!(output.status.code(), Some(2), "{}", describe(&output));
    assert!(String::from_utf8_lossy(&output.stderr).contains("no log at"));
    let output = project.run(&["rollback", "--saga", "abc"]);
    assert_eq!(output.status.code(), Some(2), "{}", describe(&output));
    assert!(!project.db().exists(), "no log file was created");
}
