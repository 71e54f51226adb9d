//! The FSM guardrail through the binary: validation flow, custom tables, `fsm --show`,
//! `fsm check`.

use std::fs;

use serde_json::{Value, json};

use crate::{Project, describe};

fn step(tool: &str, args: Value) -> Value {
    json!({ "tool": tool, "args": args })
}

/// The built-in table with `row` removed, written to the project as `name`.
fn table_without(project: &Project, name: &str, row: &str) -> String {
    let output = project.run(&["fsm", "--show", "--format", "toml"]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let table = String::from_utf8(output.stdout).expect("utf8");
    assert!(table.contains(row), "the built-in table has {row:?}");
    fs::write(project.path(name), table.replacen(row, "", 1)).expect("writes");
    name.to_owned()
}

#[test]
fn a_passing_validation_continues_to_done() {
    let project = Project::new();
    let plan = project.plan(
        "plan.json",
        &json!({ "steps": [
            step("fs.write", json!({"path": "ws/a.txt", "content": "hello world"})),
            step("validate.file", json!({"path": "ws/a.txt", "contains": "world"})),
            step("fs.append", json!({"path": "ws/a.txt", "content": "!"})),
            step("validate.file", json!({"path": "ws/a.txt", "equals": "hello world!"})),
        ]}),
    );
    let (code, document) = project.run_json(&["run", "--plan", plan.to_str().expect("utf8")]);
    assert_eq!(code, 0, "{document}");
    assert_eq!(document["state"], "Done");
    assert_eq!(
        fs::read(project.path("ws/a.txt")).expect("reads"),
        b"hello world!"
    );
}

#[test]
fn a_failed_validation_rolls_back_and_exits_1() {
    let project = Project::new();
    fs::write(project.path("ws/config.txt"), b"mode = old\n").expect("writes");
    let before = project.snapshot();
    let plan = project.plan(
        "plan.json",
        &json!({ "steps": [
            step("fs.write", json!({"path": "ws/config.txt", "content": "mode = new\n"})),
            step("fs.write", json!({"path": "ws/extra.txt", "content": "x"})),
            step("validate.file", json!({"path": "ws/config.txt", "equals": "mode = newer\n"})),
            step("fs.write", json!({"path": "ws/never.txt", "content": "never"})),
        ]}),
    );
    let (code, document) = project.run_json(&["run", "--plan", plan.to_str().expect("utf8")]);
    assert_eq!(code, 1, "{document}");
    assert_eq!(document["state"], "FailedRolledBack");
    assert_eq!(document["failure"]["error"]["kind"], "validation");
    assert_eq!(
        project.snapshot(),
        before,
        "everything undone, step 3 never ran"
    );
    assert_eq!(document["steps"].as_array().expect("steps").len(), 3);
}

#[test]
fn a_custom_table_that_forbids_a_needed_transition_exits_4_with_nothing_applied() {
    let project = Project::new();
    fs::write(project.path("ws/a.txt"), b"original").expect("writes");
    let before = project.snapshot();
    // Without `Validating --ValidationPassed--> Acting`, work cannot resume after a check.
    let table = table_without(
        &project,
        "strict.toml",
        "[[transition]]\nfrom = \"Validating\"\nevent = \"ValidationPassed\"\nto = \"Acting\"\nguard = \"more_steps\"\n",
    );
    let check = project.run(&["fsm", "check", &table]);
    assert_eq!(check.status.code(), Some(0), "{}", describe(&check));
    let plan = project.plan(
        "plan.json",
        &json!({ "steps": [
            step("fs.write", json!({"path": "ws/a.txt", "content": "changed"})),
            step("validate.file", json!({"path": "ws/a.txt", "contains": "changed"})),
            step("fs.write", json!({"path": "ws/b.txt", "content": "more"})),
        ]}),
    );
    let (code, document) = project.run_json(&[
        "--fsm",
        &table,
        "run",
        "--plan",
        plan.to_str().expect("utf8"),
    ]);
    assert_eq!(code, 4, "{document}");
    assert_eq!(document["state"], "FailedRolledBack");
    let message = document["failure"]["error"]["message"]
        .as_str()
        .expect("message");
    assert!(
        message.contains("in state Validating")
            && message.contains("event ValidationPassed")
            && message.contains("tool `validate.file`"),
        "{message}"
    );
    assert_eq!(project.snapshot(), before, "nothing left applied");
    // The denial is recorded in the log.
    let saga_id = document["saga_id"].as_str().expect("id");
    let (_, shown) = project.run_json(&["log", "--saga", saga_id]);
    assert_eq!(shown["steps"][1]["status"], "FAIL");
    assert!(
        shown["steps"][1]["error"]
            .as_str()
            .expect("error")
            .contains("fsm denied")
    );

    // The same table found as ./fsm.toml applies without --fsm.
    fs::rename(project.path(&table), project.path("fsm.toml")).expect("renames");
    let output = project.run(&["run", "--plan", plan.to_str().expect("utf8")]);
    assert_eq!(output.status.code(), Some(4), "{}", describe(&output));
}

#[test]
fn a_malformed_table_exits_2_naming_the_line() {
    let project = Project::new();
    let text = "[[transition]]\nfrom = \"Idle\"\nevent = \"StartSaga\"\nto = \"Planing\"\n";
    fs::write(project.path("bad.toml"), text).expect("writes");
    let plan = project.plan(
        "plan.json",
        &json!({ "steps": [ step("noop", json!({})) ] }),
    );
    for args in [
        vec!["fsm", "check", "bad.toml"],
        vec![
            "--fsm",
            "bad.toml",
            "run",
            "--plan",
            plan.to_str().expect("utf8"),
        ],
        vec!["--fsm", "bad.toml", "fsm", "--show"],
    ] {
        let output = project.run(&args);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            describe(&output)
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("line 4: unknown saga state `Planing`"),
            "{args:?}: {stderr}"
        );
    }
    assert!(!project.db().exists(), "nothing ran, no log was created");
    let (code, document) = project.run_json(&["fsm", "check", "bad.toml"]);
    assert_eq!(code, 2);
    assert_eq!(document["error"]["problems"][0]["line"], 4);
    let syntax = project.path("syntax.toml");
    fs::write(&syntax, "[[transition]]\nfrom = Idle\n").expect("writes");
    let output = project.run(&["fsm", "check", syntax.to_str().expect("utf8")]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("line 2"),
        "{}",
        describe(&output)
    );
}

#[test]
fn fsm_show_renders_every_format() {
    let project = Project::new();
    let output = project.run(&["fsm", "--show", "--format", "mermaid"]);
    assert_eq!(output.status.code(), Some(0));
    let mermaid = String::from_utf8(output.stdout).expect("utf8");
    assert!(
        mermaid.starts_with("stateDiagram-v2\n    [*] --> Idle\n"),
        "{mermaid}"
    );
    assert!(mermaid.contains("Compensating --> FailedRollbackPartial: CompensationFailed"));
    let output = project.run(&["fsm", "--format", "dot"]);
    assert!(String::from_utf8_lossy(&output.stdout).starts_with("digraph fsm {"));
    let output = project.run(&["fsm"]);
    assert!(String::from_utf8_lossy(&output.stdout).contains("Acting         ToolFailed"));
    let (code, document) = project.run_json(&["fsm", "--show"]);
    assert_eq!(code, 0);
    assert_eq!(document["transitions"].as_array().expect("rows").len(), 17);
    assert_eq!(document["transitions"][0]["guard"], "actor_idle");
    // The approval states are in the table `fsm --show` prints.
    let rows = document["transitions"].to_string();
    assert!(rows.contains("\"AwaitingApproval\""), "{rows}");
    assert!(mermaid.contains("AwaitingApproval --> Compensating: ApprovalDenied"));
}

#[test]
fn the_shipped_fsm_toml_is_valid() {
    let project = Project::new();
    let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fsm.toml");
    let output = project.run(&["fsm", "check", shipped]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
}
