//! Approvals through the binary (reference §10): `run --no-wait` (exit 5), `approvals`,
//! `approve`, `reject`, `resume` from another process, a waiting `run`, SIGKILL while
//! waiting, two approvers at once, the operator key, and expiry.

use std::fs;
use std::process::{Child, Stdio};

use serde_json::{Value, json};

use crate::{Project, describe, json_output, wait_until};

/// A project whose policy makes `fs.append` wait for an approval, with `extra` added to
/// the `[approval]` section.
fn project(extra: &str) -> Project {
    let project = Project::new();
    fs::write(
        project.path("sandbox.toml"),
        format!("[fs]\nallow = [\"ws\"]\n\n[approval]\nrequire = [\"fs.append\"]\n{extra}"),
    )
    .expect("writes policy");
    project
}

/// `fs.write ws/a.txt`, then `fs.append ws/log.txt` (which waits), then `fs.write ws/c.txt`.
fn plan(project: &Project) -> std::path::PathBuf {
    project.plan(
        "plan.json",
        &json!({"steps": [
            {"tool": "fs.write", "args": {"path": "ws/a.txt", "content": "a"}},
            {"tool": "fs.append", "args": {"path": "ws/log.txt", "content": "once\n"}},
            {"tool": "fs.write", "args": {"path": "ws/c.txt", "content": "c"}},
        ]}),
    )
}

/// Runs the plan with `--no-wait`: exit 5, the saga waiting; returns (saga id, request).
fn run_no_wait(project: &Project) -> (String, Value) {
    let plan = plan(project);
    let output = project.run(&[
        "--json",
        "run",
        "--no-wait",
        "--plan",
        plan.to_str().expect("utf-8"),
    ]);
    let (code, report) = json_output(&output);
    assert_eq!(code, 5, "{}", describe(&output));
    assert_eq!(report["state"], "AwaitingApproval");
    let approval = report["approval"].clone();
    let id = approval["id"].as_str().expect("an id");
    // The command to approve is on stderr.
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("agent-kernel approve {id}")),
        "{stderr}"
    );
    (
        report["saga_id"].as_str().expect("saga").to_owned(),
        approval,
    )
}

fn pending(project: &Project) -> Vec<Value> {
    let (code, document) = project.run_json(&["approvals"]);
    assert_eq!(code, 0, "{document}");
    document["approvals"].as_array().expect("a list").clone()
}

/// The pending requests, or none while the log does not exist yet.
fn pending_once_logged(project: &Project) -> usize {
    if !project.db().exists() {
        return 0;
    }
    pending(project).len()
}

fn spawn(project: &Project, args: &[&str]) -> Child {
    project
        .command(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawns")
}

/// A `run` of the project's plan (with `--json` when `json`) spawned and waiting for its
/// approval; the request's id.
fn waiting_run(project: &Project, json: bool) -> (Child, String) {
    let plan = plan(project);
    let plan = plan.to_str().expect("utf-8");
    let args: &[&str] = if json {
        &["--json", "run", "--plan", plan]
    } else {
        &["run", "--plan", plan]
    };
    let run = spawn(project, args);
    wait_until("the run waits for an approval", || {
        pending_once_logged(project) == 1
    });
    let id = pending(project)[0]["id"].as_str().expect("id").to_owned();
    (run, id)
}

#[test]
fn no_wait_exits_5_then_approve_and_resume_in_another_process_finish_the_plan() {
    let project = project("");
    let (saga_id, approval) = run_no_wait(&project);
    // Nothing of the waiting step ran.
    assert!(project.path("ws/a.txt").exists());
    assert!(!project.path("ws/log.txt").exists());
    // Left waiting on purpose, it is not in flight: `recover` leaves it to the operator.
    let (code, recovered) = project.run_json(&["recover"]);
    assert_eq!(code, 0, "{recovered}");
    assert_eq!(
        recovered["sagas"][0]["action"], "skipped_waiting",
        "{recovered}"
    );
    assert_eq!(project.latest_saga().expect("a saga").1, "AwaitingApproval");
    assert!(project.path("ws/a.txt").exists());
    let listed = pending(&project);
    assert_eq!(listed.len(), 1);
    let request = &listed[0];
    for field in [
        "id",
        "saga_id",
        "step",
        "tool",
        "digest",
        "requested_at",
        "expires_at",
    ] {
        assert!(request.get(field).is_some(), "`{field}` in {request}");
    }
    assert_eq!(request["saga_id"], saga_id.as_str());
    assert_eq!(
        (request["step"].clone(), request["tool"].clone()),
        (json!(1), json!("fs.append"))
    );
    assert_eq!(request["digest"], approval["digest"]);
    let id = request["id"].as_str().expect("id");

    let output = project.run(&["approve", id, "--note", "looked at the line"]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let again = project.run(&["approve", id]);
    assert_eq!(again.status.code(), Some(4), "{}", describe(&again));
    let reject = project.run(&["reject", id, "--reason", "changed my mind"]);
    assert_eq!(reject.status.code(), Some(4), "{}", describe(&reject));
    assert!(pending(&project).is_empty());

    let (code, report) = project.run_json(&["resume", "--saga", &saga_id]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["state"], "Done");
    assert_eq!(
        fs::read_to_string(project.path("ws/log.txt")).expect("reads"),
        "once\n"
    );
    assert_eq!(
        fs::read_to_string(project.path("ws/c.txt")).expect("reads"),
        "c"
    );
    // Resuming a finished saga runs nothing again.
    let (code, _) = project.run_json(&["resume", "--saga", &saga_id]);
    assert_eq!(code, 0);
    assert_eq!(
        fs::read_to_string(project.path("ws/log.txt")).expect("reads"),
        "once\n"
    );

    // The decision is in the audit chain with the operator and the note.
    let (code, records) = project.run_json(&["audit", "list", "--kind", "ApprovalDecided"]);
    assert_eq!(code, 0, "{records}");
    let text = records.to_string();
    assert!(
        text.contains("looked at the line") && text.contains("uid"),
        "{text}"
    );
    let (code, audit) = project.run_json(&["audit", "verify"]);
    assert_eq!(code, 0, "{audit}");
}

#[test]
fn a_rejected_step_rolls_the_saga_back_with_exit_4() {
    let project = project("");
    let (saga_id, approval) = run_no_wait(&project);
    let id = approval["id"].as_str().expect("id");
    let output = project.run(&["reject", id, "--reason", "not today"]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let (code, report) = project.run_json(&["resume", "--saga", &saga_id]);
    assert_eq!(code, 4, "{report}");
    assert_eq!(report["state"], "FailedRolledBack");
    assert!(project.snapshot().is_empty(), "{:?}", project.snapshot());
}

#[test]
fn a_waiting_run_says_how_to_approve_and_finishes_once_approved() {
    let project = project("");
    let (run, id) = waiting_run(&project, true);
    let output = project.run(&["approve", &id]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let output = run.wait_with_output().expect("waits");
    let (code, report) = json_output(&output);
    assert_eq!(code, 0, "{}", describe(&output));
    assert_eq!(report["state"], "Done");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("agent-kernel approve {id}")),
        "{stderr}"
    );
    assert_eq!(
        fs::read_to_string(project.path("ws/log.txt")).expect("reads"),
        "once\n"
    );
}

#[test]
fn a_run_killed_while_it_waits_is_rolled_back_by_recover_and_a_later_approval_applies_to_nothing() {
    let project = project("");
    let (mut run, id) = waiting_run(&project, false);
    crate::sigkill(&mut run).expect("SIGKILL");
    run.wait().expect("reaped");
    let (code, report) = project.run_json(&["recover"]);
    assert_eq!(code, 0, "{report}");
    let text = report.to_string();
    assert!(
        text.contains(&id),
        "recover says the saga waited for {id}: {text}"
    );
    assert!(project.snapshot().is_empty(), "{:?}", project.snapshot());
    let output = project.run(&["approve", &id]);
    assert_eq!(output.status.code(), Some(4), "{}", describe(&output));
    assert!(project.snapshot().is_empty());
}

#[test]
fn two_operators_approving_at_once_decide_once_and_the_step_runs_once() {
    let project = project("");
    let (saga_id, approval) = run_no_wait(&project);
    let id = approval["id"].as_str().expect("id").to_owned();
    let approvers: Vec<Child> = (0..2).map(|_| spawn(&project, &["approve", &id])).collect();
    let mut codes: Vec<i32> = approvers
        .into_iter()
        .map(|child| {
            child
                .wait_with_output()
                .expect("waits")
                .status
                .code()
                .expect("exits")
        })
        .collect();
    codes.sort_unstable();
    assert_eq!(codes, [0, 4]);
    let resumers: Vec<Child> = (0..2)
        .map(|_| spawn(&project, &["resume", "--saga", &saga_id]))
        .collect();
    for resumer in resumers {
        resumer.wait_with_output().expect("waits");
    }
    assert_eq!(
        fs::read_to_string(project.path("ws/log.txt")).expect("reads"),
        "once\n"
    );
    assert_eq!(project.latest_saga().expect("a saga").1, "Done");
}

#[test]
fn with_an_operator_key_a_decision_without_it_is_refused() {
    let project = project("operator_key_file = \"operator.key\"\n");
    fs::write(project.path("operator.key"), "0123456789abcdef\n").expect("writes key");
    fs::write(project.path("other.key"), "not the key\n").expect("writes key");
    let (_, approval) = run_no_wait(&project);
    let id = approval["id"].as_str().expect("id");
    let without = project.run(&["approve", id]);
    assert_eq!(without.status.code(), Some(4), "{}", describe(&without));
    assert!(String::from_utf8_lossy(&without.stderr).contains("--operator-key-file"));
    let wrong = project.run(&["approve", id, "--operator-key-file", "other.key"]);
    assert_eq!(wrong.status.code(), Some(4), "{}", describe(&wrong));
    // The request names the key: a policy of the approver's own choosing does not lift it.
    fs::write(project.path("lax.toml"), "[fs]\nallow = [\"ws\"]\n").expect("writes");
    let lax = project.run(&["approve", id, "--sandbox", "lax.toml"]);
    assert_eq!(lax.status.code(), Some(4), "{}", describe(&lax));
    assert_eq!(pending(&project).len(), 1, "nothing changed");
    let right = project.run(&["approve", id, "--operator-key-file", "operator.key"]);
    assert_eq!(right.status.code(), Some(0), "{}", describe(&right));
}

#[test]
fn a_request_left_waiting_that_expired_is_rolled_back_by_recover() {
    let project = project("timeout_ms = 200\n");
    let (saga_id, _) = run_no_wait(&project);
    let (code, listed) = project.run_json(&["log", "--saga", &saga_id]);
    assert_eq!(code, 0);
    let expires_at_ms = listed["updated_at_ms"].as_i64().expect("a time") + 200;
    wait_until("the request has expired", || {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_millis() as i64;
        now_ms > expires_at_ms
    });
    let (code, recovered) = project.run_json(&["recover"]);
    assert_eq!(code, 0, "{recovered}");
    assert_eq!(
        recovered["sagas"][0]["action"], "rolled_back",
        "{recovered}"
    );
    assert_eq!(project.latest_saga().expect("a saga").1, "FailedRolledBack");
    assert!(project.snapshot().is_empty());
}

#[test]
fn an_undecided_request_expires_and_the_waiting_run_rolls_back_with_exit_4() {
    let project = project("timeout_ms = 300\n");
    let plan = plan(&project);
    let output = project.run(&["--json", "run", "--plan", plan.to_str().expect("utf-8")]);
    let (code, report) = json_output(&output);
    assert_eq!(code, 4, "{}", describe(&output));
    assert_eq!(report["state"], "FailedRolledBack");
    assert!(project.snapshot().is_empty());
    let (code, records) = project.run_json(&["audit", "list", "--kind", "ApprovalDecided"]);
    assert_eq!(code, 0);
    assert!(records.to_string().contains("expired"), "{records}");
}

#[test]
fn bad_approval_settings_are_bad_input() {
    let project = Project::new();
    fs::write(
        project.path("sandbox.toml"),
        "[fs]\nallow = [\"ws\"]\n\n[approval]\nrequire = [\"[\"]\n",
    )
    .expect("writes policy");
    let plan = plan(&project);
    let output = project.run(&["run", "--plan", plan.to_str().expect("utf-8")]);
    assert_eq!(output.status.code(), Some(2), "{}", describe(&output));
    assert!(String::from_utf8_lossy(&output.stderr).contains("[approval]"));
    let project = self::project("");
    run_no_wait(&project);
    let unknown = project.run(&["approve", "no-such-request"]);
    assert_eq!(unknown.status.code(), Some(2), "{}", describe(&unknown));
}

#[test]
fn an_approval_written_into_the_table_by_hand_is_never_used() {
    let project = project("");
    let (saga_id, approval) = run_no_wait(&project);
    let id = approval["id"].as_str().expect("id");
    // Someone with the database file marks the request approved, without a decision.
    let conn = rusqlite::Connection::open(project.db()).expect("opens");
    conn.execute(
        "UPDATE approvals SET status = 'approved' WHERE approval_id = ?1",
        [id],
    )
    .expect("forged");
    drop(conn);
    let (code, report) = project.run_json(&["resume", "--saga", &saga_id]);
    assert_eq!(code, 4, "{report}");
    assert_eq!(report["state"], "FailedRolledBack");
    let message = report["failure"]["error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(message.contains("audit chain"), "{report}");
    assert!(!project.path("ws/log.txt").exists(), "the step never ran");
    assert!(
        !project.path("ws/a.txt").exists(),
        "the saga was rolled back"
    );
}

#[test]
fn later_steps_rewritten_in_the_log_are_never_run_resume_refuses_with_exit_3() {
    let project = project("");
    let (saga_id, approval) = run_no_wait(&project);
    let id = approval["id"].as_str().expect("id");
    // The operator can see what runs after the step.
    let (code, shown) = project.run_json(&["approvals", "--show", id]);
    assert_eq!(code, 0, "{shown}");
    assert_eq!(
        shown["later_steps"][0]["args"]["path"], "ws/c.txt",
        "{shown}"
    );
    // Someone who can write the log puts a plan of their own after the waiting step.
    let forged = json!([{"tool": "fs.write", "args": {"path": "ws/planted.txt", "content": "x"}}]);
    let conn = rusqlite::Connection::open(project.db()).expect("opens");
    let n_changed = conn
        .execute(
            "UPDATE approvals SET rest = ?2 WHERE approval_id = ?1",
            [id, &forged.to_string()],
        )
        .expect("forged");
    assert_eq!(n_changed, 1);
    drop(conn);
    // The operator approves the step they were shown.
    let (code, decided) = project.run_json(&["approve", id]);
    assert_eq!(code, 0, "{decided}");
    let output = project.run(&["--json", "resume", "--saga", &saga_id]);
    let (code, document) = json_output(&output);
    assert_eq!(code, 3, "{}", describe(&output));
    let message = document["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("later steps of the plan") && message.contains("nothing ran"),
        "{document}"
    );
    assert!(
        !project.path("ws/planted.txt").exists(),
        "the forged step never ran"
    );
    assert!(
        !project.path("ws/log.txt").exists(),
        "the approved step never ran"
    );
    assert!(
        project.path("ws/a.txt").exists(),
        "nothing was rolled back either"
    );
    assert_eq!(project.latest_saga().expect("a saga").1, "AwaitingApproval");
    assert!(message.contains("--skip-verify"), "{document}");
    // The log fails its audit check, so rolling back needs the operator's word.
    let (code, refused) = project.run_json(&["rollback", "--saga", &saga_id]);
    assert_eq!(code, 3, "{refused}");
    assert_eq!(refused["error"]["kind"], "tampered", "{refused}");
    let (code, rolled) = project.run_json(&["rollback", "--saga", &saga_id, "--skip-verify"]);
    assert_eq!(code, 0, "{rolled}");
    assert!(!project.path("ws/a.txt").exists());
    assert!(!project.path("ws/planted.txt").exists());
}

#[test]
fn arguments_and_digest_rewritten_together_after_the_approval_are_never_run() {
    let project = project("");
    let (saga_id, approval) = run_no_wait(&project);
    let id = approval["id"].as_str().expect("id");
    let (code, decided) = project.run_json(&["approve", id]);
    assert_eq!(code, 0, "{decided}");
    // The approved request's arguments replaced, with a digest computed for them.
    let args = json!({"path": "ws/other.txt", "content": "x"});
    let digest = agent_kernel::approval_digest(
        &agent_kernel_api::SagaId::new(saga_id.clone()),
        1,
        "fs.append",
        &args,
    );
    let conn = rusqlite::Connection::open(project.db()).expect("opens");
    conn.execute(
        "UPDATE approvals SET args = ?2, digest = ?3 WHERE approval_id = ?1",
        [id, &args.to_string(), &digest],
    )
    .expect("forged");
    drop(conn);
    let output = project.run(&["--json", "resume", "--saga", &saga_id]);
    let (code, document) = json_output(&output);
    assert_eq!(code, 3, "{}", describe(&output));
    let message = document["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("digest, arguments"), "{document}");
    assert!(!project.path("ws/other.txt").exists());
    assert!(!project.path("ws/log.txt").exists());
}

#[test]
fn the_operator_sees_the_whole_arguments_and_every_hidden_character_escaped() {
    let project = project("");
    // The agent puts what matters past where a shortened view would cut.
    let folder = format!("ws/tmp-cache-safe-to-delete-{}", "a".repeat(120));
    fs::create_dir_all(project.path(&folder)).expect("creates");
    let path = format!("{folder}/../important.txt");
    let plan = project.plan(
        "plan.json",
        &json!({"steps": [
            {"tool": "fs.append", "args": {"path": path, "content": "ok\u{202e}txt.exe\u{200b}"}},
        ]}),
    );
    let output = project.run(&["run", "--no-wait", "--plan", plan.to_str().expect("utf-8")]);
    assert_eq!(output.status.code(), Some(5), "{}", describe(&output));

    // The table: the whole path, the override escaped and named, the digest.
    let listed = project.run(&["approvals"]);
    let table = String::from_utf8_lossy(&listed.stdout);
    assert!(table.contains("/../important.txt"), "{table}");
    assert!(table.contains(&"a".repeat(120)), "{table}");
    assert!(table.contains(r"ok\u202etxt.exe\u200b"), "{table}");
    assert!(
        !table.contains('\u{202e}') && !table.contains('\u{200b}'),
        "{table}"
    );
    assert!(
        table.contains(r"contains U+202E RIGHT-TO-LEFT OVERRIDE (shown as \u202e)"),
        "{table}"
    );
    assert!(
        table.contains("contains U+200B ZERO WIDTH SPACE"),
        "{table}"
    );
    let request = &pending(&project)[0];
    let digest = request["digest"].as_str().expect("digest");
    assert!(table.contains(digest), "{table}");

    // The JSON view: the same, and the arguments themselves.
    let shown = request["args_shown"].as_str().expect("args_shown");
    assert!(shown.contains("/../important.txt"), "{request}");
    assert!(shown.contains(r"\u202e"), "{request}");
    assert_eq!(request["args"]["path"], path.as_str());
    let warnings = request["args_warnings"].to_string();
    assert!(
        warnings.contains("U+202E RIGHT-TO-LEFT OVERRIDE"),
        "{request}"
    );

    // One request in full; `approve` says what it approved.
    let id = request["id"].as_str().expect("id");
    let one = project.run(&["approvals", "--show", id]);
    let one = String::from_utf8_lossy(&one.stdout);
    assert!(
        one.contains("/../important.txt") && one.contains(digest),
        "{one}"
    );
    assert!(one.contains("the plan has no step after it"), "{one}");
    let approved = project.run(&["approve", id]);
    assert_eq!(approved.status.code(), Some(0), "{}", describe(&approved));
    let approved = String::from_utf8_lossy(&approved.stdout);
    assert!(
        approved.contains("/../important.txt")
            && approved.contains(r"\u202e")
            && approved.contains(digest),
        "{approved}"
    );
}

#[test]
fn a_signal_while_run_waits_rolls_the_saga_back_with_exit_1() {
    let project = project("");
    let (run, id) = waiting_run(&project, true);
    let status = std::process::Command::new("kill")
        .args(["-INT", &run.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    let output = run.wait_with_output().expect("waits");
    let (code, report) = json_output(&output);
    assert_eq!(code, 1, "{}", describe(&output));
    assert_eq!(report["state"], "FailedRolledBack");
    let message = report["failure"]["error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(message.contains("SIGINT"), "{report}");
    assert!(project.snapshot().is_empty(), "{:?}", project.snapshot());
    // The request is void.
    let output = project.run(&["approve", &id]);
    assert_eq!(output.status.code(), Some(4), "{}", describe(&output));
}
