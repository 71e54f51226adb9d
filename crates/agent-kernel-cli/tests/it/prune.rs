//! `prune` through the real binary: finished sagas older than the horizon leave the log,
//! one inside its undo window stays, the chain verifies afterwards, and a tampered log or
//! a bad horizon prunes nothing.

use std::fs;

use serde_json::{Value, json};

use crate::Project;

fn step(tool: &str, args: Value) -> Value {
    json!({ "tool": tool, "args": args })
}

/// Runs `plan` and returns its saga id and exit code.
fn run_plan(project: &Project, name: &str, plan: &Value) -> (String, i32) {
    let path = project.plan(name, plan);
    let (code, report) = project.run_json(&["run", "--plan", path.to_str().expect("utf8")]);
    let saga_id = report["saga_id"].as_str().expect("a saga id").to_owned();
    (saga_id, code)
}

fn saga_exists(project: &Project, saga_id: &str) -> bool {
    let (code, document) = project.run_json(&["log", "--saga", saga_id]);
    match code {
        0 => true,
        2 => false,
        other => panic!("log --saga exited {other}: {document}"),
    }
}

#[test]
fn prune_removes_finished_sagas_outside_their_undo_window_and_the_chain_verifies() {
    let project = Project::new();
    fs::write(project.path("ws/a.txt"), b"before").expect("writes");
    // Done, with a write still inside its undo window (7 days by default): kept.
    let (written, code) = run_plan(
        &project,
        "write.json",
        &json!({"steps": [step("fs.write", json!({"path": "ws/a.txt", "content": "after"}))]}),
    );
    assert_eq!(code, 0);
    // Done, having only read: nothing to undo, so no window keeps it.
    let (read, code) = run_plan(
        &project,
        "read.json",
        &json!({"steps": [step("fs.read", json!({"path": "ws/a.txt"}))]}),
    );
    assert_eq!(code, 0);
    // Rolled back: finished.
    let (failed, code) = run_plan(
        &project,
        "fail.json",
        &json!({"steps": [
            step("fs.write", json!({"path": "ws/b.txt", "content": "x"})),
            step("fs.read", json!({"path": "ws/missing.txt"})),
        ]}),
    );
    assert_eq!(code, 1);

    // A horizon of a day: all three finished just now, so none is old enough.
    let (code, report) = project.run_json(&["prune", "--before", "1d"]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["n_sagas"], 0, "{report}");

    let (code, report) = project.run_json(&["prune", "--before", "0s", "--vacuum"]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["n_sagas"], 2, "{report}");
    assert_eq!(report["n_steps"], 3, "{report}");
    assert_eq!(report["kept_in_undo_window"], 1, "{report}");
    assert_eq!(report["vacuumed"], true, "{report}");
    assert!(saga_exists(&project, &written));
    assert!(!saga_exists(&project, &read));
    assert!(!saga_exists(&project, &failed));
    let (code, audit) = project.run_json(&["audit", "verify"]);
    assert_eq!(code, 0, "{audit}");
    // The checkpoint and the command are in the chain.
    let (code, records) = project.run_json(&["audit", "list", "--kind", "Prune"]);
    assert_eq!(code, 0, "{records}");
    assert_eq!(
        records["records"].as_array().map(Vec::len),
        Some(1),
        "{records}"
    );
    // The kept saga can still be undone.
    let (code, undone) = project.run_json(&["undo", "--saga", &written, "--reason", "test"]);
    assert_eq!(code, 0, "{undone}");
    assert_eq!(
        fs::read(project.path("ws/a.txt")).expect("reads"),
        b"before"
    );
    let (code, audit) = project.run_json(&["audit", "verify"]);
    assert_eq!(code, 0, "{audit}");
}

#[test]
fn a_bad_horizon_or_a_tampered_log_prunes_nothing() {
    let project = Project::new();
    let (saga_id, code) = run_plan(
        &project,
        "fail.json",
        &json!({"steps": [step("fs.read", json!({"path": "ws/missing.txt"}))]}),
    );
    assert_eq!(code, 1);
    for bad in [
        vec!["prune"],
        vec!["prune", "--before", "7"],
        vec!["prune", "--before", "-1d"],
    ] {
        let (code, document) = project.run_json(&bad);
        assert_eq!(code, 2, "{bad:?}: {document}");
    }
    let (code, document) = project.run_json(&["prune", "--before", "99999d"]);
    assert_eq!(code, 2, "{document}");
    assert!(saga_exists(&project, &saga_id));

    // An edit of the tables (the saga made to look older): the chain disagrees, so prune
    // refuses to choose from them.
    let conn = rusqlite::Connection::open(project.db()).expect("opens");
    conn.execute(
        "UPDATE sagas SET updated_at_ms = updated_at_ms - 1 WHERE saga_id = ?1",
        [&saga_id],
    )
    .expect("edits");
    drop(conn);
    let (code, document) = project.run_json(&["prune", "--before", "0s"]);
    assert_eq!(code, 3, "{document}");
    assert!(saga_exists(&project, &saga_id));
}
