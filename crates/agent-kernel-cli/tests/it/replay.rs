//! `replay --saga ID` through the real binary: a saga's history checked again, executing
//! nothing, against the table in force or another, the tools' versions and the argument
//! hashes; exit 1 naming the first divergence.

use std::fs;

use serde_json::{Value, json};

use crate::Project;

fn step(tool: &str, args: Value) -> Value {
    json!({ "tool": tool, "args": args })
}

/// Runs a saga that goes Acting, Validating, Acting, Done; its id.
fn validated_saga(project: &Project) -> String {
    let plan = project.plan(
        "plan.json",
        &json!({ "steps": [
            step("fs.write", json!({"path": "ws/a.txt", "content": "draft"})),
            step("validate.file", json!({"path": "ws/a.txt", "contains": "draft"})),
            step("fs.write", json!({"path": "ws/b.txt", "content": "final"})),
        ]}),
    );
    let (code, report) = project.run_json(&["run", "--plan", plan.to_str().expect("utf8")]);
    assert_eq!(code, 0, "{report}");
    report["saga_id"].as_str().expect("an id").to_owned()
}

#[test]
fn a_saga_replays_consistent_under_its_table_and_diverges_under_one_without_its_row() {
    let project = Project::new();
    let saga_id = validated_saga(&project);
    let files = project.snapshot();
    let (code, report) = project.run_json(&["replay", "--saga", &saga_id]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["consistent"], true, "{report}");
    assert_eq!(report["n_steps"], 3, "{report}");
    assert!(report["n_transitions"].as_u64() >= Some(3), "{report}");
    // Nothing ran.
    assert_eq!(project.snapshot(), files);

    // A table without `Validating --ValidationPassed--> Acting` (row 8).
    let output = project.run(&["fsm", "--show", "--format", "toml"]);
    let table = String::from_utf8(output.stdout).expect("utf8");
    let kept: Vec<&str> = table
        .split("\n\n")
        .filter(|row| !(row.contains("from = \"Validating\"") && row.contains("to = \"Acting\"")))
        .collect();
    fs::write(project.path("strict.toml"), kept.join("\n\n")).expect("writes");
    let (code, report) = project.run_json(&["replay", "--saga", &saga_id, "--fsm", "strict.toml"]);
    assert_eq!(code, 1, "{report}");
    let reason = report["divergence"]["reason"].as_str().expect("a reason");
    assert!(reason.contains("from Validating to Acting"), "{reason}");
    assert!(report["divergence"]["seq"].as_u64() > Some(1), "{report}");

    let (code, report) = project.run_json(&["replay", "--saga", "no-such-saga"]);
    assert_eq!(code, 2, "{report}");
}

#[test]
fn replay_names_arguments_edited_in_the_log_and_a_tool_whose_version_changed() {
    let project = Project::new();
    let saga_id = validated_saga(&project);
    let conn = rusqlite::Connection::open(project.db()).expect("opens");
    conn.execute(
        "UPDATE saga_steps SET args = '{\"content\":\"other\",\"path\":\"ws/a.txt\"}'
         WHERE saga_id = ?1 AND step_seq = 0",
        [&saga_id],
    )
    .expect("edits");
    drop(conn);
    let (code, report) = project.run_json(&["replay", "--saga", &saga_id]);
    assert_eq!(code, 1, "{report}");
    let reason = report["divergence"]["reason"].as_str().expect("a reason");
    assert!(
        reason.contains("step 0") && reason.contains("hash"),
        "{reason}"
    );

    // A tool of the tools file, upgraded since the saga ran.
    let project = Project::new();
    let tools = |version: &str| {
        format!(
            "[tools.\"note.touch\"]\neffect = \"mutating\"\nsettlement = \"compensate\"\nversion = \"{version}\"\nexecute = [\"python3\", \"-c\", \"import sys; sys.stdin.read(); print('{{}}')\"]\ncompensate = [\"python3\", \"-c\", \"import sys; sys.stdin.read()\"]\n"
        )
    };
    fs::write(project.path("tools.toml"), tools("1.0.0")).expect("writes");
    let plan = project.plan(
        "plan.json",
        &json!({ "steps": [step("note.touch", json!({}))] }),
    );
    let (code, report) = project.run_json(&["run", "--plan", plan.to_str().expect("utf8")]);
    assert_eq!(code, 0, "{report}");
    let saga_id = report["saga_id"].as_str().expect("an id").to_owned();
    let (code, report) = project.run_json(&["replay", "--saga", &saga_id]);
    assert_eq!(code, 0, "{report}");
    fs::write(project.path("tools.toml"), tools("2.0.0")).expect("writes");
    let (code, report) = project.run_json(&["replay", "--saga", &saga_id]);
    assert_eq!(code, 1, "{report}");
    let reason = report["divergence"]["reason"].as_str().expect("a reason");
    assert!(
        reason.contains("version 1.0.0") && reason.contains("2.0.0"),
        "{reason}"
    );
}

#[test]
fn rolled_back_and_undone_sagas_replay_consistent() {
    let project = Project::new();
    let plan = project.plan(
        "failing.json",
        &json!({ "steps": [
            step("fs.write", json!({"path": "ws/a.txt", "content": "a"})),
            step("fault.fail", json!({"message": "no"})),
        ]}),
    );
    let (code, report) = project.run_json(&["run", "--plan", plan.to_str().expect("utf8")]);
    assert_eq!(code, 1, "{report}");
    let failed = report["saga_id"].as_str().expect("an id").to_owned();
    let (code, report) = project.run_json(&["replay", "--saga", &failed]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["n_steps"], 2, "{report}");

    let undone = validated_saga(&project);
    let output = project.run(&["undo", "--saga", &undone, "--reason", "test"]);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        crate::describe(&output)
    );
    let (code, report) = project.run_json(&["replay", "--saga", &undone]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["consistent"], true, "{report}");
}

#[test]
fn a_chain_edited_to_hold_an_illegal_transition_is_caught() {
    let project = Project::new();
    let saga_id = validated_saga(&project);
    let conn = rusqlite::Connection::open(project.db()).expect("opens");
    // The saga's move to Validating becomes a move from Acting straight to Undone.
    let seq: i64 = conn
        .query_row(
            "SELECT seq FROM audit_log WHERE kind = 'SetState' AND saga_id = ?1
             AND body LIKE '%\"state\":\"Validating\"%' ORDER BY seq LIMIT 1",
            [&saga_id],
            |row| row.get(0),
        )
        .expect("finds the record");
    conn.execute(
        "UPDATE audit_log SET body = replace(body, '\"Validating\"', '\"Undone\"') WHERE seq = ?1",
        [seq],
    )
    .expect("edits");
    drop(conn);
    let (code, report) = project.run_json(&["replay", "--saga", &saga_id]);
    assert_eq!(code, 1, "{report}");
    assert_eq!(report["divergence"]["seq"], seq, "{report}");
    let reason = report["divergence"]["reason"].as_str().expect("a reason");
    assert!(reason.contains("from Acting to Undone"), "{reason}");
}
