//! `audit verify` through the real binary: exit 0 on an intact log, 1 with the bad record
//! named when the log was tampered with, 2 when there is nothing to verify.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::{Value, json};

use crate::{Project, describe};

const KEY: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
const OTHER_KEY: &str = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";

/// The head file next to a log.
fn head_file(db: &Path) -> PathBuf {
    let mut name = db.file_name().expect("a file name").to_owned();
    name.push(".audit-head");
    db.with_file_name(name)
}

/// Runs the binary with `key` (or none) in `$AGENT_KERNEL_AUDIT_KEY`.
fn run_with_key(project: &Project, key: Option<&str>, args: &[&str]) -> Output {
    // `Project::command` has already removed any key of the environment.
    let mut command = project.command(args);
    if let Some(key) = key {
        command.env("AGENT_KERNEL_AUDIT_KEY", key);
    }
    command.output().expect("the binary runs")
}

/// Runs two plans, one that succeeds and one that fails and is rolled back.
fn write_log(project: &Project, key: Option<&str>, tag: &str) {
    let ok = project.plan(
        &format!("ok-{tag}.json"),
        &json!({ "name": "ok", "steps": [
            { "tool": "fs.write", "args": { "path": format!("ws/{tag}.txt"), "content": "hello" } },
            { "tool": "noop", "args": {} },
        ]}),
    );
    let output = run_with_key(project, key, &["run", "--plan", ok.to_str().expect("utf8")]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let failing = project.plan(
        &format!("failing-{tag}.json"),
        &json!({ "name": "failing", "steps": [
            { "tool": "fs.write", "args": { "path": format!("ws/{tag}-b.txt"), "content": "x" } },
            { "tool": "fault.fail", "args": { "message": "deployment check failed" } },
        ]}),
    );
    let output = run_with_key(
        project,
        key,
        &["run", "--plan", failing.to_str().expect("utf8")],
    );
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
}

fn verify_json(project: &Project, key: Option<&str>, extra: &[&str]) -> (i32, Value) {
    let mut args = vec!["--json", "audit", "verify"];
    args.extend_from_slice(extra);
    crate::json_output(&run_with_key(project, key, &args))
}

#[test]
fn an_intact_log_verifies_and_says_how_many_records() {
    let project = Project::new();
    write_log(&project, None, "a");
    let output = run_with_key(&project, None, &["audit", "verify"]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.starts_with("audit: ") && stdout.contains("records verified, head at seq"),
        "{}",
        describe(&output)
    );
    let (code, document) = verify_json(&project, None, &[]);
    assert_eq!(code, 0, "{document}");
    assert_eq!(document["ok"], true);
    assert_eq!(document["first_bad"], Value::Null);
    assert!(
        document["n_records"].as_u64().expect("a count") >= 8,
        "{document}"
    );
}

#[test]
fn a_missing_log_is_bad_input() {
    let project = Project::new();
    let output = run_with_key(&project, None, &["audit", "verify"]);
    assert_eq!(output.status.code(), Some(2), "{}", describe(&output));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("no log at"),
        "{}",
        describe(&output)
    );
    assert!(!project.db().exists(), "verify creates no log");
    let output = run_with_key(&project, None, &["--json", "audit", "verify"]);
    assert_eq!(output.status.code(), Some(2), "{}", describe(&output));
    let document: Value = serde_json::from_slice(&output.stdout).expect("one JSON document");
    assert_eq!(document["error"]["kind"], "bad_input");
}

#[test]
fn a_deleted_head_file_is_tampering_and_the_record_is_named() {
    let project = Project::new();
    write_log(&project, None, "a");
    fs::remove_file(head_file(&project.db())).expect("removes the head file");
    let output = run_with_key(&project, None, &["audit", "verify"]);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.starts_with("audit: record ") && stdout.contains(" is bad: "),
        "{}",
        describe(&output)
    );
    let (code, document) = verify_json(&project, None, &[]);
    assert_eq!(code, 1, "{document}");
    assert_eq!(document["ok"], false);
    assert!(document["first_bad"]["seq"].as_u64().expect("a seq") > 0);
    assert!(
        document["first_bad"]["reason"]
            .as_str()
            .expect("a reason")
            .contains("missing")
    );
}

#[test]
fn an_older_database_put_back_is_detected_by_the_newer_head_file() {
    let project = Project::new();
    write_log(&project, None, "a");
    let db = project.db();
    let mut wal = db.clone().into_os_string();
    wal.push("-wal");
    let wal = PathBuf::from(wal);
    let older_db = fs::read(&db).expect("reads");
    let older_wal = fs::read(&wal).ok();
    write_log(&project, None, "b");
    // Restore the older backup of the database, not of its head file.
    let mut shm = db.clone().into_os_string();
    shm.push("-shm");
    let _ = fs::remove_file(PathBuf::from(shm));
    let _ = fs::remove_file(&wal);
    fs::write(&db, older_db).expect("writes");
    if let Some(older_wal) = older_wal {
        fs::write(&wal, older_wal).expect("writes");
    }
    let (code, document) = verify_json(&project, None, &[]);
    assert_eq!(code, 1, "{document}");
    assert!(
        document["first_bad"]["reason"]
            .as_str()
            .expect("a reason")
            .contains("older copy"),
        "{document}"
    );
}

#[test]
fn with_a_key_records_carry_macs_that_only_the_key_verifies() {
    let project = Project::new();
    write_log(&project, Some(KEY), "a");
    let (code, document) = verify_json(&project, Some(KEY), &[]);
    assert_eq!(code, 0, "{document}");
    assert_eq!(document["macs_verified"], true);

    let key_file = project.path("audit.key");
    fs::write(&key_file, format!("{KEY}\n")).expect("writes");
    let key_arg = key_file.to_str().expect("utf8");
    let (code, document) = verify_json(&project, None, &["--audit-key-file", key_arg]);
    assert_eq!(code, 0, "{document}");

    let (code, document) = verify_json(&project, Some(OTHER_KEY), &[]);
    assert_eq!(code, 1, "{document}");
    assert_eq!(document["first_bad"]["seq"], 1);
    assert!(
        document["first_bad"]["reason"]
            .as_str()
            .expect("a reason")
            .contains("MAC"),
        "{document}"
    );

    // Without the key the chain still verifies, and stderr says the MACs went unchecked.
    let output = run_with_key(&project, None, &["audit", "verify"]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("MACs were not checked"),
        "{}",
        describe(&output)
    );
}

#[test]
fn a_malformed_key_is_bad_input_never_silently_no_key() {
    let project = Project::new();
    write_log(&project, None, "a");
    for key in ["", "not hex", "00ff"] {
        let output = run_with_key(&project, Some(key), &["audit", "verify"]);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{key:?}: {}",
            describe(&output)
        );
        assert!(
            String::from_utf8_lossy(&output.stderr).contains("AGENT_KERNEL_AUDIT_KEY"),
            "{}",
            describe(&output)
        );
    }
    let output = run_with_key(
        &project,
        None,
        &["audit", "verify", "--audit-key-file", "no-such-key-file"],
    );
    assert_eq!(output.status.code(), Some(2), "{}", describe(&output));
}

/// Every audit record's kind and body, in order.
fn audit_records(project: &Project) -> Vec<(String, Value)> {
    let conn = rusqlite::Connection::open(project.db()).expect("opens the log");
    let mut statement = conn
        .prepare("SELECT kind, body FROM audit_log ORDER BY seq")
        .expect("prepares");
    statement
        .query_map([], |row| Ok((row.get(0)?, row.get::<_, String>(1)?)))
        .expect("queries")
        .map(|row| {
            let (kind, body) = row.expect("reads");
            (kind, serde_json::from_str(&body).expect("a JSON body"))
        })
        .collect()
}

#[test]
fn a_denied_plan_is_audited_with_tool_arguments_and_reason() {
    let project = Project::new();
    let denied = project.plan(
        "denied.json",
        &json!({ "name": "exfiltrate", "steps": [
            { "tool": "fs.write", "args": { "path": "ws/fine.txt", "content": "ok" } },
            { "tool": "fs.write", "args": { "path": "../escape.txt", "content": "pwned" } },
        ]}),
    );
    let output = project.run(&["run", "--plan", denied.to_str().expect("utf8")]);
    assert_eq!(output.status.code(), Some(4), "{}", describe(&output));
    assert!(!project.path("ws/fine.txt").exists(), "nothing ran");
    assert!(!project.path("escape.txt").exists());

    let records = audit_records(&project);
    let (kind, body) = records.last().expect("the denial is recorded");
    assert_eq!(kind, "PlanDenied");
    assert_eq!(body["name"], "exfiltrate");
    assert_eq!(body["dry_run"], false);
    assert_eq!(body["n_denials"], 1);
    let denial = &body["denials"][0];
    assert_eq!(denial["step_idx"], 1);
    assert_eq!(denial["tool"], "fs.write");
    assert!(
        denial["args_summary"]
            .as_str()
            .expect("quoted")
            .contains("../escape.txt"),
        "{denial}"
    );
    assert!(
        denial["reason"]
            .as_str()
            .expect("a reason")
            .contains("denied"),
        "{denial}"
    );
    // An operator reads it back with `audit list`.
    let (code, document) = project.run_json(&["audit", "list", "--kind", "PlanDenied"]);
    assert_eq!(code, 0, "{document}");
    let listed = document["records"].as_array().expect("records");
    assert_eq!(listed.len(), 1, "{document}");
    assert_eq!(listed[0]["body"], *body);
    let output = project.run(&["audit", "list"]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let table = String::from_utf8_lossy(&output.stdout);
    assert!(
        table.contains("PlanDenied") && table.contains("../escape.txt"),
        "{table}"
    );
    // A terminal escape in the plan reaches the table escaped.
    let escape = project.plan(
        "escape.json",
        &json!({ "steps": [
            { "tool": "fs.write", "args": { "path": "../\u{1b}[2J.txt", "content": "x" } },
        ]}),
    );
    let output = project.run(&["run", "--plan", escape.to_str().expect("utf8")]);
    assert_eq!(output.status.code(), Some(4), "{}", describe(&output));
    let output = project.run(&["audit", "list", "--kind", "PlanDenied"]);
    assert!(!output.stdout.contains(&0x1b), "{}", describe(&output));
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("\\u{1b}"),
        "{}",
        describe(&output)
    );
    let output = project.run(&["audit", "list", "--kind", "NoSuchKind"]);
    assert_eq!(output.status.code(), Some(2), "{}", describe(&output));

    // No saga was created, and the log verifies.
    let (_, listed) = project.run_json(&["log"]);
    assert_eq!(listed["sagas"], json!([]));
    let (code, document) = verify_json(&project, None, &[]);
    assert_eq!(code, 0, "{document}");
}

/// The id of the most recent saga.
fn latest_saga_id(project: &Project) -> String {
    project.latest_saga().expect("a saga in the log").0
}

/// Starts a saga that writes `ws/slow.txt` and then sleeps, and SIGKILLs it once the write
/// is visible: the saga is left unfinished, owned by a dead process.
fn leave_a_saga_unfinished(project: &Project) {
    let plan = project.plan(
        "slow.json",
        &json!({ "steps": [
            { "tool": "fs.write", "args": { "path": "ws/slow.txt", "content": "slow" } },
            { "tool": "noop", "args": { "sleep_ms": 60000 } },
        ]}),
    );
    let mut runner = project
        .command(&["run", "--plan", plan.to_str().expect("utf8")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawns");
    crate::wait_until("the slow saga never started", || {
        project.path("ws/slow.txt").exists()
    });
    crate::sigkill(&mut runner).expect("SIGKILLs");
    runner.wait().expect("reaps");
}

#[test]
fn recover_and_rollback_refuse_a_tampered_log_unless_told_and_record_the_command() {
    let project = Project::new();
    write_log(&project, None, "a");
    leave_a_saga_unfinished(&project);
    let saga_id = latest_saga_id(&project);
    let (_, listed) = project.run_json(&["log", "--limit", "1"]);
    // Unfinished: killed during the write (Acting) or the sleep after it (Validating: the
    // sleep is read-only).
    let state = listed["sagas"][0]["state"].as_str().expect("a state");
    assert!(state == "Acting" || state == "Validating", "{listed}");

    // Someone removes the head file: the undo records can no longer be vouched for.
    fs::remove_file(head_file(&project.db())).expect("removes the head file");
    for args in [
        vec!["--json", "recover"],
        vec!["--json", "rollback", "--saga", saga_id.as_str()],
    ] {
        let output = run_with_key(&project, None, &args);
        assert_eq!(output.status.code(), Some(3), "{}", describe(&output));
        let document: Value = serde_json::from_slice(&output.stdout).expect("one JSON document");
        assert_eq!(document["error"]["kind"], "tampered", "{document}");
        let message = document["error"]["message"].as_str().expect("a message");
        assert!(
            message.contains("audit check at record") && message.contains("--skip-verify"),
            "{message}"
        );
        assert_eq!(
            fs::read(project.path("ws/slow.txt")).expect("still there"),
            b"slow",
            "nothing was undone"
        );
    }

    // The operator decides to act anyway: the saga is rolled back, and the choice recorded.
    let (code, report) = project.run_json(&["recover", "--skip-verify"]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["sagas"][0]["action"], "rolled_back", "{report}");
    assert!(
        !project.path("ws/slow.txt").exists(),
        "the write was undone"
    );
    let records = audit_records(&project);
    let operator: Vec<&Value> = records
        .iter()
        .filter(|(kind, _)| kind == "Operator")
        .map(|(_, body)| body)
        .collect();
    assert_eq!(
        operator.len(),
        1,
        "refused commands act on nothing and record nothing"
    );
    assert_eq!(operator[0]["command"], "recover");
    assert_eq!(operator[0]["options"], json!(["--skip-verify"]));
    assert!(operator[0]["by"]["pid"].as_u64().is_some());
    // The command comes before what it did.
    let operator_at = records
        .iter()
        .position(|(kind, _)| kind == "Operator")
        .expect("recorded");
    assert!(
        records[operator_at + 1..]
            .iter()
            .any(|(kind, _)| kind == "TakeOver"),
        "{records:?}"
    );

    // The writer did not recreate the head file: the evidence stays until the operator
    // seals the log, after which it verifies and recover runs without --skip-verify.
    assert!(!head_file(&project.db()).exists());
    let (code, document) = verify_json(&project, None, &[]);
    assert_eq!(code, 1, "{document}");
    let output = run_with_key(&project, None, &["--json", "audit", "seal"]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let sealed: Value = serde_json::from_slice(&output.stdout).expect("one JSON document");
    assert_eq!(sealed["sealed"], true, "{sealed}");
    let (code, document) = verify_json(&project, None, &[]);
    assert_eq!(code, 0, "{document}");
    assert_eq!(document["head"], sealed["head"]);
    assert_eq!(
        audit_records(&project).last().expect("a record").1["command"],
        "audit seal"
    );
    let (code, report) = project.run_json(&["recover"]);
    assert_eq!(code, 0, "{report}");
}

#[test]
fn audit_seal_refuses_a_log_whose_records_are_bad() {
    let project = Project::new();
    write_log(&project, None, "a");
    let conn = rusqlite::Connection::open(project.db()).expect("opens the log");
    conn.execute(
        "UPDATE audit_log SET body = replace(body, 'ok', 'OK') WHERE kind = 'CreateSaga'",
        [],
    )
    .expect("edits");
    drop(conn);
    let head_before = fs::read(head_file(&project.db())).expect("reads");
    let output = run_with_key(&project, None, &["audit", "seal"]);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("not sealed"),
        "{}",
        describe(&output)
    );
    assert_eq!(
        fs::read(head_file(&project.db())).expect("reads"),
        head_before,
        "the head file is untouched"
    );
}

#[test]
fn operator_commands_on_an_intact_log_are_recorded_before_they_act() {
    let project = Project::new();
    write_log(&project, None, "a");
    leave_a_saga_unfinished(&project);
    let saga_id = latest_saga_id(&project);
    let (code, report) = project.run_json(&["rollback", "--saga", &saga_id]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["state"], "FailedRolledBack");
    assert!(!project.path("ws/slow.txt").exists());
    let (code, recovered) = project.run_json(&["recover"]);
    assert_eq!(code, 0, "{recovered}");

    let records = audit_records(&project);
    let commands: Vec<(&str, &Value)> = records
        .iter()
        .filter(|(kind, _)| kind == "Operator")
        .map(|(_, body)| (body["command"].as_str().expect("text"), &body["saga_id"]))
        .collect();
    assert_eq!(
        commands,
        [("rollback", &json!(saga_id)), ("recover", &Value::Null)]
    );
    // `audit list --saga` shows the saga's records, the operator's rollback among them.
    let (code, document) =
        project.run_json(&["audit", "list", "--saga", &saga_id, "--limit", "100"]);
    assert_eq!(code, 0, "{document}");
    let kinds: Vec<&str> = document["records"]
        .as_array()
        .expect("records")
        .iter()
        .map(|record| record["kind"].as_str().expect("kind"))
        .collect();
    assert_eq!(kinds.first(), Some(&"SetState"), "newest first: {kinds:?}");
    assert_eq!(kinds.last(), Some(&"CreateSaga"), "{kinds:?}");
    assert!(
        kinds.contains(&"Operator") && kinds.contains(&"TakeOver"),
        "{kinds:?}"
    );
    let (code, document) = verify_json(&project, None, &[]);
    assert_eq!(code, 0, "{document}");
}

#[test]
fn recover_acts_on_a_log_from_before_the_audit_chain_and_starts_its_chain() {
    let project = Project::new();
    write_log(&project, None, "a");
    leave_a_saga_unfinished(&project);
    // As schema version 1 left it: no chain, no dry-run column, no head file.
    agent_kernel_txlog::downgrade_in_place(&project.db(), 1).expect("downgrades");
    fs::remove_file(head_file(&project.db())).expect("removes the head file");

    let (code, report) = project.run_json(&["recover"]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["sagas"][0]["action"], "rolled_back", "{report}");
    assert!(
        !project.path("ws/slow.txt").exists(),
        "the write was undone"
    );
    let records = audit_records(&project);
    assert_eq!(records[0].0, "Genesis");
    assert!(records.iter().any(|(kind, _)| kind == "Operator"));
    let (code, document) = verify_json(&project, None, &[]);
    assert_eq!(code, 0, "{document}");
}

/// A log of more steps than `audit verify` keeps in memory
/// (`VERIFY_ENTRIES_IN_MEMORY_MAX`): the replay moves the older ones to its scratch
/// database, the log still verifies, and an edit of a step that went to disk is caught
/// with the step named.
#[test]
fn a_log_larger_than_verify_keeps_in_memory_verifies_and_an_edit_on_disk_is_caught() {
    let project = Project::new();
    let n_sagas = agent_kernel_txlog::VERIFY_ENTRIES_IN_MEMORY_MAX / 10 + 50;
    let output = project
        .isolated(crate::bin())
        .args(["--json", "bench", "--durability", "normal", "--steps", "10"])
        .arg("--sagas")
        .arg(n_sagas.to_string())
        .arg("--keep-log")
        .arg(project.db())
        .output()
        .expect("the binary runs");
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let (code, document) = verify_json(&project, None, &[]);
    assert_eq!(code, 0, "{document}");
    // Each step begun and committed, each saga created and finished.
    assert!(
        document["n_records"].as_u64().expect("a count") > 20 * n_sagas as u64,
        "{document}"
    );
    // The oldest saga's first step: among the first the replay moves to disk.
    let conn = rusqlite::Connection::open(project.db()).expect("opens");
    let saga_id: String = conn
        .query_row(
            "SELECT saga_id FROM sagas ORDER BY created_at_ms, saga_id LIMIT 1",
            [],
            |row| row.get(0),
        )
        .expect("a saga");
    let n_changed = conn
        .execute(
            "UPDATE saga_steps SET output = '{\"forged\":true}' WHERE saga_id = ?1 AND step_seq = 0",
            [&saga_id],
        )
        .expect("edits");
    assert_eq!(n_changed, 1);
    drop(conn);
    let (code, document) = verify_json(&project, None, &[]);
    assert_eq!(code, 1, "{document}");
    let reason = document["first_bad"]["reason"].as_str().expect("a reason");
    assert!(
        reason.contains(&format!("step 0 of saga {saga_id}")) && reason.contains("output"),
        "{document}"
    );
}
