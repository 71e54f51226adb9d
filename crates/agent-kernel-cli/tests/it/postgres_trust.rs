//! A PostgreSQL log this machine can trust: its head files are keyed by the log's identity,
//! so a log that vanished (tables dropped, an empty schema put ahead in the `search_path`)
//! or was replaced at the same URL is tampering where this machine vouches for records,
//! until an operator seals the new log; a password in `AGENT_KERNEL_DB` is never printed;
//! and `log`, `audit list`, `replay` and `export` read it as they read an SQLite file. Skipped without
//! `AGENT_KERNEL_TEST_POSTGRES`, but for the password's test.

use std::fs;
use std::path::PathBuf;
use std::process::Stdio;

use agent_kernel_log_contract::postgres::{Schema, server};

use crate::postgres::{
    ORIGINAL, assert_verifies, assert_verifies_elsewhere, on_postgres, run_to_end, saga_states,
    worker_plan, write_then_wait,
};
use crate::{Project, bin, wait_until};

/// Every table of the log, version 4.
const LOG_TABLES: &str = "agent_kernel_meta, sagas, saga_steps, idempotency_keys, audit_log, \
                          approvals, dead_letters, leases, step_keys, locks";

/// This machine's head files (the project's state folder), by name.
fn head_files(project: &Project) -> Vec<String> {
    let folder = project.path("state/agent-kernel");
    let mut names: Vec<String> = fs::read_dir(&folder)
        .map(|entries| {
            entries
                .map(|entry| {
                    entry
                        .expect("an entry")
                        .file_name()
                        .to_string_lossy()
                        .into_owned()
                })
                .filter(|name| name.ends_with(".audit-head"))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Runs a plan to its end (this machine's head file then names its last record), then one
/// that rewrites a file and is SIGKILLed while its second step sleeps: the file is left
/// half-done, for `recover`.
fn killed_mid_saga(url: &str) -> (Project, PathBuf) {
    let (project, plan) = write_then_wait("killed");
    run_to_end(&project, url, &worker_plan(&project, 0, 0));
    let mut worker = on_postgres(&project, url, &["run", "--plan", &plan.to_string_lossy()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starts");
    wait_until("the first step landed", || {
        fs::read_to_string(project.path("ws/a.txt")).expect("reads") != ORIGINAL
    });
    crate::sigkill(&mut worker).expect("SIGKILLs");
    worker.wait().expect("reaps");
    let file = project.path("ws/a.txt");
    (project, file)
}

/// `recover` on the log at `url` exits `code`.
#[track_caller]
fn recover_exits(project: &Project, url: &str, code: i32) {
    let output = on_postgres(project, url, &["recover"])
        .output()
        .expect("runs");
    assert_eq!(
        output.status.code(),
        Some(code),
        "{}",
        crate::describe(&output)
    );
}

/// `audit verify --json` exits 1, and the reason names each of `words`; `recover` exits 3
/// and acts on nothing.
#[track_caller]
fn tampering_found(project: &Project, url: &str, words: &[&str]) {
    let output = on_postgres(project, url, &["--json", "audit", "verify"])
        .output()
        .expect("runs");
    let (code, report) = crate::json_output(&output);
    assert_eq!(code, 1, "{report}");
    let reason = report["first_bad"]["reason"].as_str().expect("a reason");
    for word in words {
        assert!(reason.contains(word), "`{word}` not in: {report}");
    }
    recover_exits(project, url, 3);
}

#[test]
fn dropped_tables_are_tampering_where_this_machine_vouches_for_records() {
    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    let url = schema.url();
    let (project, file) = killed_mid_saga(&url);
    assert_verifies(&project, &url);
    schema.execute(&format!("DROP TABLE {LOG_TABLES} CASCADE"));
    tampering_found(&project, &url, &["holds no log", "dropped"]);
    assert_eq!(
        fs::read_to_string(&file).expect("reads"),
        "changed\n",
        "nothing acted on"
    );
    // Another machine, which never wrote the log, has nothing to go by.
    assert_verifies_elsewhere(&project, &url);
}

#[test]
fn an_empty_schema_put_ahead_in_the_search_path_is_tampering_too() {
    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    let ahead = Schema::create(&server);
    ahead.drop_now();
    // While `ahead` does not exist, the log is made in `schema`.
    let url = schema.url_behind(Some(&ahead));
    let (project, file) = killed_mid_saga(&url);
    assert_eq!(
        schema.rows("SELECT count(*)::text FROM sagas"),
        [vec![Some("2".to_owned())]]
    );
    assert_verifies(&project, &url);
    ahead.create_again();
    tampering_found(&project, &url, &["holds no log", "search_path"]);
    assert_eq!(fs::read_to_string(&file).expect("reads"), "changed\n");
    // Taken away again, the log is found as it was and recovered.
    ahead.drop_now();
    recover_exits(&project, &url, 0);
    assert_eq!(fs::read_to_string(&file).expect("reads"), ORIGINAL);
}

#[test]
fn a_log_recreated_at_the_same_url_is_told_apart_until_an_operator_seals_it() {
    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    let url = schema.url();
    let project = Project::new();
    let run = |n: usize| {
        let plan = worker_plan(&project, n, 0);
        run_to_end(&project, &url, &plan);
    };
    run(0);
    run(1);
    let first = head_files(&project);
    assert_eq!(first.len(), 1, "{first:?}");
    assert!(first[0].contains(".log-"), "named after the log: {first:?}");
    // The database recreated: a new, shorter log at the same URL.
    schema.drop_now();
    schema.create_again();
    run(2);
    let both = head_files(&project);
    assert_eq!(both.len(), 2, "one per log: {both:?}");
    tampering_found(&project, &url, &["another log", "audit seal"]);
    // The operator replaced the database on purpose: sealing anchors the new log.
    let output = on_postgres(&project, &url, &["--json", "audit", "seal"])
        .output()
        .expect("runs");
    let (code, sealed) = crate::json_output(&output);
    assert_eq!(code, 0, "{sealed}");
    assert_eq!(sealed["sealed"], true, "{sealed}");
    let last: u64 = schema.rows("SELECT max(seq)::text FROM audit_log")[0][0]
        .as_deref()
        .expect("records")
        .parse()
        .expect("a number");
    assert_eq!(sealed["head"]["seq"], last, "{sealed}");
    let kept = head_files(&project);
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert!(
        !first.contains(&kept[0]),
        "the new log's file is kept: {kept:?}"
    );
    assert_verifies(&project, &url);
    recover_exits(&project, &url, 0);
    assert_eq!(saga_states(&schema)["worker 2"], "Done");
}

#[test]
fn an_earlier_builds_head_file_is_given_its_logs_name_when_the_log_is_upgraded() {
    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    let url = schema.url();
    let project = Project::new();
    let plan = worker_plan(&project, 0, 0);
    run_to_end(&project, &url, &plan);
    // As a version 3 build left the log and its head file, named after the URL alone.
    let folder = project.path("state/agent-kernel");
    let keyed = head_files(&project).pop().expect("a head file");
    let base = keyed.split(".log-").next().expect("a base").to_owned() + ".audit-head";
    fs::rename(folder.join(&keyed), folder.join(&base)).expect("renames");
    schema.execute(
        "DROP VIEW held_locks;
         ALTER TABLE agent_kernel_meta DROP COLUMN log_id;
         UPDATE agent_kernel_meta SET schema_version = 3",
    );
    assert_verifies(&project, &url);
    let plan = worker_plan(&project, 1, 0);
    run_to_end(&project, &url, &plan);
    let now = head_files(&project);
    assert_eq!(now.len(), 1, "{now:?}");
    assert!(
        now[0].starts_with(base.trim_end_matches(".audit-head")),
        "{now:?}"
    );
    assert!(now[0].contains(".log-"), "{now:?}");
    assert_ne!(now[0], keyed, "a new id, made by the upgrade");
    let output = on_postgres(&project, &url, &["--json", "audit", "verify"])
        .output()
        .expect("runs");
    let (code, report) = crate::json_output(&output);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["head_file"], report["head"], "{report}");
}

#[test]
fn a_run_left_waiting_for_an_approval_stays_waiting_once_its_process_is_gone() {
    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    let url = schema.url();
    let project = Project::new();
    fs::write(
        project.path("sandbox.toml"),
        "[fs]\nallow = [\"ws\"]\n\n[approval]\nrequire = [\"fs.append\"]\n",
    )
    .expect("writes the policy");
    let plan = project.plan(
        "waits.json",
        &serde_json::json!({ "name": "waits", "steps": [
            { "tool": "fs.write", "args": { "path": "ws/a.txt", "content": "a" } },
            { "tool": "fs.append", "args": { "path": "ws/log.txt", "content": "once\n" } },
        ] }),
    );
    let output = on_postgres(
        &project,
        &url,
        &[
            "--json",
            "run",
            "--no-wait",
            "--plan",
            &plan.to_string_lossy(),
        ],
    )
    .output()
    .expect("runs");
    assert_eq!(
        output.status.code(),
        Some(5),
        "{}",
        crate::describe(&output)
    );
    // The process is gone (its lease ended by `recover` on this machine): the saga waits
    // for the operator, it is not rolled back.
    let output = on_postgres(&project, &url, &["--json", "recover"])
        .output()
        .expect("runs");
    let (code, recovered) = crate::json_output(&output);
    assert_eq!(code, 0, "{recovered}");
    assert_eq!(
        recovered["sagas"][0]["action"], "skipped_waiting",
        "{recovered}"
    );
    assert_eq!(saga_states(&schema)["waits"], "AwaitingApproval");
    assert_eq!(
        fs::read_to_string(project.path("ws/a.txt")).expect("reads"),
        "a"
    );
}

#[test]
fn a_password_in_agent_kernel_db_is_never_printed_by_help() {
    let project = Project::new();
    for args in [&["--help"][..], &["run", "--help"], &["recover", "--help"]] {
        let output = project
            .isolated(bin())
            .env(
                "AGENT_KERNEL_DB",
                "postgres://agent:hunter2@127.0.0.1:1/agents",
            )
            .args(args)
            .output()
            .expect("runs");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{args:?}: {}",
            crate::describe(&output)
        );
        assert!(stdout.contains("AGENT_KERNEL_DB"), "{args:?}: {stdout}");
        assert!(
            !stdout.contains("hunter2"),
            "{args:?} printed the password: {stdout}"
        );
    }
}

/// `args` on the log at `url`, which must exit `code`; its output.
#[track_caller]
fn exits(project: &Project, url: &str, args: &[&str], code: i32) -> std::process::Output {
    let output = on_postgres(project, url, args).output().expect("runs");
    assert_eq!(
        output.status.code(),
        Some(code),
        "{args:?}: {}",
        crate::describe(&output)
    );
    output
}

#[test]
fn log_audit_list_replay_and_export_read_a_postgresql_log() {
    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    let url = schema.url();
    let project = Project::new();
    run_to_end(&project, &url, &worker_plan(&project, 0, 0));

    let output = on_postgres(&project, &url, &["--json", "log"])
        .output()
        .expect("runs");
    let (code, listed) = crate::json_output(&output);
    assert_eq!(code, 0, "{listed}");
    let sagas = listed["sagas"].as_array().expect("a list");
    assert_eq!(sagas.len(), 1, "{listed}");
    assert_eq!(sagas[0]["name"], "worker 0", "{listed}");
    assert_eq!(sagas[0]["state"], "Done", "{listed}");
    let saga_id = sagas[0]["saga_id"].as_str().expect("an id");

    let output = on_postgres(&project, &url, &["--json", "log", "--saga", saga_id])
        .output()
        .expect("runs");
    let (code, shown) = crate::json_output(&output);
    assert_eq!(code, 0, "{shown}");
    assert_eq!(shown["state"], "Done", "{shown}");
    let steps = shown["steps"].as_array().expect("steps");
    assert!(!steps.is_empty(), "{shown}");
    assert!(
        steps.iter().all(|step| step["status"] == "COMMIT"),
        "{shown}"
    );

    // `replay` finds the saga's recorded decisions as the table and the tools make them.
    let output = exits(&project, &url, &["replay", "--saga", saga_id], 0);
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("consistent"),
        "{}",
        crate::describe(&output)
    );
    // `export --otel`: the saga's trace, a span for each step.
    let output = exits(&project, &url, &["export", "--otel", "--saga", saga_id], 0);
    let request = serde_json::from_slice(&output.stdout).expect("OTLP/JSON");
    let (_, step_spans, compensation_spans) = crate::export::check_trace(&request);
    assert_eq!(step_spans.len(), steps.len());
    assert!(compensation_spans.is_empty());

    // A saga the log does not hold is bad input, as on SQLite.
    exits(&project, &url, &["log", "--saga", "no-such-saga"], 2);

    // The saga's audit records, newest first, its end state last written.
    let output = on_postgres(
        &project,
        &url,
        &[
            "--json", "audit", "list", "--saga", saga_id, "--limit", "100",
        ],
    )
    .output()
    .expect("runs");
    let (code, listed) = crate::json_output(&output);
    assert_eq!(code, 0, "{listed}");
    let records = listed["records"].as_array().expect("records");
    let kinds: Vec<&str> = records
        .iter()
        .map(|record| record["kind"].as_str().expect("a kind"))
        .collect();
    assert_eq!(kinds.first(), Some(&"SetState"), "{listed}");
    assert_eq!(kinds.last(), Some(&"CreateSaga"), "{listed}");
    assert!(
        records.iter().all(|record| record["saga_id"] == saga_id),
        "{listed}"
    );
    let seqs: Vec<i64> = records
        .iter()
        .map(|record| record["seq"].as_i64().expect("a seq"))
        .collect();
    assert!(seqs.windows(2).all(|pair| pair[0] > pair[1]), "{listed}");
    // One kind, at most two.
    let output = on_postgres(
        &project,
        &url,
        &[
            "--json",
            "audit",
            "list",
            "--kind",
            "CommitStep",
            "--limit",
            "2",
        ],
    )
    .output()
    .expect("runs");
    let (code, listed) = crate::json_output(&output);
    assert_eq!(code, 0, "{listed}");
    let records = listed["records"].as_array().expect("records");
    assert_eq!(records.len(), 2, "{listed}");
    assert!(
        records.iter().all(|record| record["kind"] == "CommitStep"),
        "{listed}"
    );
    // An unknown kind is bad input, and the message names the log without its password.
    let output = exits(&project, &url, &["audit", "list", "--kind", "Nope"], 2);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("`Nope`"), "{stderr}");
    let password = server
        .split_once("://")
        .and_then(|(_, rest)| rest.split_once('@'))
        .and_then(|(userinfo, _)| userinfo.split_once(':'))
        .map(|(_, password)| password);
    if let Some(password) = password.filter(|password| !password.is_empty()) {
        assert!(!stderr.contains(password), "{stderr}");
    }
}

#[test]
fn reading_commands_create_no_log_and_read_no_other_schemas_log() {
    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    let ahead = Schema::create(&server);
    let project = Project::new();
    let count_tables = |schema: &Schema| {
        schema.rows(
            "SELECT count(*)::text FROM pg_catalog.pg_tables WHERE schemaname = current_schema()",
        )
    };
    // An empty schema: `log` lists nothing, the others find no log, and none creates one.
    let empty = ahead.url();
    let output = on_postgres(&project, &empty, &["--json", "log"])
        .output()
        .expect("runs");
    let (code, listed) = crate::json_output(&output);
    assert_eq!(code, 0, "{listed}");
    assert_eq!(listed["sagas"], serde_json::json!([]), "{listed}");
    for args in [
        &["log", "--saga", "01a233af-2df2-7442-8416-8fdd19379a1c"][..],
        &["replay", "--saga", "01a233af-2df2-7442-8416-8fdd19379a1c"],
        &["export", "--otel", "--all"],
        &["audit", "list"],
    ] {
        exits(&project, &empty, args, 2);
    }
    assert_eq!(count_tables(&ahead), [vec![Some("0".to_owned())]]);

    // A log behind that empty schema in the `search_path` is not read through it.
    run_to_end(&project, &schema.url(), &worker_plan(&project, 0, 0));
    let behind = schema.url_behind(Some(&ahead));
    let output = exits(&project, &behind, &["audit", "list"], 2);
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("holds no log"),
        "{}",
        crate::describe(&output)
    );
    assert_eq!(count_tables(&ahead), [vec![Some("0".to_owned())]]);
}
