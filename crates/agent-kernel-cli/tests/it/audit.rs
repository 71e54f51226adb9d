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
    let mut command = project.command(args);
    command.env_remove("AGENT_KERNEL_AUDIT_KEY");
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
    let output = run_with_key(project, key, &args);
    let document = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|err| panic!("not one JSON document ({err}): {}", describe(&output)));
    (output.status.code().expect("exited"), document)
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
