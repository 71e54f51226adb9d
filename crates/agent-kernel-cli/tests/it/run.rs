//! `run`, `rollback`, `log`, `recover` and `bench` through the real binary.

use std::fs;

use serde_json::{Value, json};

use crate::{Project, describe};

fn step(tool: &str, args: Value) -> Value {
    json!({ "tool": tool, "args": args })
}

fn statuses(document: &Value) -> Vec<String> {
    document["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|step| step["status"].as_str().expect("status").to_owned())
        .collect()
}

#[test]
fn a_successful_plan_ends_done_and_the_log_shows_it() {
    let project = Project::new();
    let plan = project.plan(
        "plan.json",
        &json!({ "name": "ok", "actor": "tester", "steps": [
            step("fs.write", json!({"path": "ws/a.txt", "content": "hello"})),
            step("fs.append", json!({"path": "ws/a.txt", "content": " world"})),
            step("fs.read", json!({"path": "ws/a.txt"})),
            step("noop", json!({})),
        ]}),
    );
    let (code, document) = project.run_json(&["run", "--plan", plan.to_str().expect("utf8")]);
    assert_eq!(code, 0, "{document}");
    assert_eq!(document["state"], "Done");
    assert_eq!(statuses(&document), ["COMMIT"; 4]);
    assert_eq!(
        fs::read(project.path("ws/a.txt")).expect("reads"),
        b"hello world"
    );

    let saga_id = document["saga_id"].as_str().expect("id");
    let (code, shown) = project.run_json(&["log", "--saga", saga_id]);
    assert_eq!(code, 0);
    assert_eq!(shown["saga_id"], saga_id);
    assert_eq!(shown["state"], "Done");
    assert_eq!(shown["actor"], "tester");
    assert_eq!(
        shown["steps"][2]["output"]["data"]["content"],
        "hello world"
    );

    let (code, listed) = project.run_json(&["log"]);
    assert_eq!(code, 0);
    assert_eq!(listed["sagas"][0]["saga_id"], saga_id);
    assert_eq!(listed["sagas"][0]["state"], "Done");

    // Human output is a table naming every step.
    let output = project.run(&["log", "--saga", saga_id]);
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.contains("fs.append") && text.contains("COMMIT"),
        "{text}"
    );
}

#[test]
fn a_failing_plan_restores_every_file_byte_for_byte() {
    let project = Project::new();
    // An existing file to overwrite, one to append to, one to delete (with binary-ish bytes
    // and no trailing newline), and one that does not exist yet.
    fs::write(project.path("ws/overwritten.txt"), b"old \x00\xff contents").expect("writes");
    fs::write(project.path("ws/appended.txt"), b"line 1\nline 2").expect("writes");
    fs::write(project.path("ws/deleted.txt"), b"precious\r\n").expect("writes");
    fs::create_dir(project.path("ws/sub")).expect("creates");
    let before = project.snapshot();
    let plan = project.plan(
        "plan.json",
        &json!({ "steps": [
            step("fs.write", json!({"path": "ws/overwritten.txt", "content": "new"})),
            step("fs.append", json!({"path": "ws/appended.txt", "content": "\nline 3"})),
            step("fs.delete", json!({"path": "ws/deleted.txt"})),
            step("fs.write", json!({"path": "ws/sub/created.txt", "content": "fresh"})),
            step("fs.write", json!({"path": "ws/overwritten.txt", "content": "newer"})),
            step("fault.fail", json!({"message": "deployment check failed"})),
        ]}),
    );
    let (code, document) = project.run_json(&["run", "--plan", plan.to_str().expect("utf8")]);
    assert_eq!(code, 1, "{document}");
    assert_eq!(document["state"], "FailedRolledBack");
    assert_eq!(
        statuses(&document),
        [
            "COMPENSATED",
            "COMPENSATED",
            "COMPENSATED",
            "COMPENSATED",
            "COMPENSATED",
            "FAIL"
        ]
    );
    assert!(
        document["failure"]["error"]["message"]
            .as_str()
            .expect("message")
            .contains("deployment check failed")
    );
    assert_eq!(
        project.snapshot(),
        before,
        "every file restored, no temp file left"
    );
}

#[test]
fn rollback_of_a_done_saga_is_denied_by_the_fsm() {
    let project = Project::new();
    let plan = project.plan(
        "plan.json",
        &json!({ "steps": [
            step("fs.write", json!({"path": "ws/a.txt", "content": "changed"})),
        ]}),
    );
    let (code, document) = project.run_json(&["run", "--plan", plan.to_str().expect("utf8")]);
    assert_eq!(code, 0, "{document}");
    let after = project.snapshot();
    let saga_id = document["saga_id"].as_str().expect("id");
    let output = project.run(&["rollback", "--saga", saga_id]);
    assert_eq!(output.status.code(), Some(4), "{}", describe(&output));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("in state Done"),
        "{}",
        describe(&output)
    );
    assert_eq!(project.snapshot(), after, "a Done saga is never reopened");
}

#[test]
fn a_denied_path_exits_4_and_touches_nothing() {
    let project = Project::new();
    fs::write(project.path("outside.txt"), b"canary").expect("writes");
    for path in [
        "outside.txt",
        "ws/../outside.txt",
        "/etc/passwd",
        "ws/.env",
        "ws/key.PEM",
    ] {
        let plan = project.plan(
            "plan.json",
            &json!({ "steps": [
                step("fs.write", json!({"path": "ws/first.txt", "content": "x"})),
                step("fs.write", json!({"path": path, "content": "pwned"})),
            ]}),
        );
        let output = project.run(&["run", "--plan", plan.to_str().expect("utf8")]);
        assert_eq!(
            output.status.code(),
            Some(4),
            "{path}: {}",
            describe(&output)
        );
        assert!(
            String::from_utf8_lossy(&output.stderr).contains("denied"),
            "{path}: {}",
            describe(&output)
        );
        assert!(project.snapshot().is_empty(), "{path}: nothing written");
        assert_eq!(
            fs::read(project.path("outside.txt")).expect("reads"),
            b"canary"
        );
    }
}

#[test]
fn without_a_policy_every_file_tool_is_denied_with_a_hint() {
    let project = Project::new();
    fs::remove_file(project.path("sandbox.toml")).expect("removes");
    let plan = project.plan(
        "plan.json",
        &json!({ "steps": [ step("fs.write", json!({"path": "ws/a.txt", "content": "x"})) ]}),
    );
    let output = project.run(&["run", "--plan", plan.to_str().expect("utf8")]);
    assert_eq!(output.status.code(), Some(4), "{}", describe(&output));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("--sandbox"),
        "{}",
        describe(&output)
    );
    assert!(project.snapshot().is_empty());
}

#[test]
fn a_repeated_idempotency_key_reuses_the_output() {
    let project = Project::new();
    let plan = project.plan(
        "plan.json",
        &json!({ "steps": [
            { "tool": "fs.append", "args": {"path": "ws/log.txt", "content": "once\n"}, "idempotency_key": "order-42" },
        ]}),
    );
    for _ in 0..3 {
        let (code, document) = project.run_json(&["run", "--plan", plan.to_str().expect("utf8")]);
        assert_eq!(code, 0, "{document}");
    }
    assert_eq!(
        fs::read(project.path("ws/log.txt")).expect("reads"),
        b"once\n"
    );
    let other = project.plan(
        "other.json",
        &json!({ "steps": [
            { "tool": "fs.append", "args": {"path": "ws/log.txt", "content": "twice\n"}, "idempotency_key": "order-42" },
        ]}),
    );
    let output = project.run(&["run", "--plan", other.to_str().expect("utf8")]);
    assert_eq!(output.status.code(), Some(2), "{}", describe(&output));
    assert!(String::from_utf8_lossy(&output.stderr).contains("bound to other arguments"));
}

#[test]
fn a_panicking_tool_is_contained_rolled_back_and_exits_1() {
    let project = Project::new();
    let plan = project.plan(
        "plan.json",
        &json!({ "steps": [
            step("fs.write", json!({"path": "ws/a.txt", "content": "x"})),
            step("fault.panic", json!({"message": "tool bug"})),
        ]}),
    );
    let (code, document) = project.run_json(&["run", "--plan", plan.to_str().expect("utf8")]);
    assert_eq!(code, 1, "{document}");
    assert_eq!(document["state"], "FailedRolledBack");
    assert!(project.snapshot().is_empty());
}

/// `bench ARGS --durability normal --json` in a fresh project, without `--db` (a temporary
/// log): it must exit 0.
fn bench(args: &[&str]) -> serde_json::Value {
    let output = Project::new()
        .isolated(crate::bin())
        .args(["--json", "bench", "--durability", "normal"])
        .args(args)
        .output()
        .expect("runs");
    let (code, document) = crate::json_output(&output);
    assert_eq!(code, 0, "{document}");
    document
}

#[test]
fn bench_reports_the_contract_fields() {
    let document = bench(&["--sagas", "5", "--steps", "3", "--concurrency", "2"]);
    for field in ["steps_per_sec", "p50_us", "p99_us"] {
        assert!(
            document[field].as_f64().is_some_and(|v| v > 0.0),
            "{field}: {document}"
        );
    }
    assert_eq!(document["n_steps"], 15);
    assert_eq!(document["mode"], "plan");
    // n + 1 commits per saga of n steps.
    assert_eq!(document["n_commits"], 20);
    let p99 = document["p99_us"].as_u64().expect("p99");
    let p999 = document["p999_us"].as_u64().expect("p999");
    assert!(
        p999 >= p99 && document["max_us"].as_u64() >= Some(p999),
        "{document}"
    );
    let rss = document["rss_kib"].as_u64().expect("rss");
    assert!(
        rss > 0 && document["rss_peak_kib"].as_u64() >= Some(rss),
        "{document}"
    );
    // Every batch holds a record at least; no transaction more than the group's bound.
    let batches = document["batches_per_transaction"]
        .as_f64()
        .expect("batches");
    let records = document["records_per_transaction"]
        .as_f64()
        .expect("records");
    let records_max = document["records_per_transaction_max"]
        .as_u64()
        .expect("records max");
    assert!(
        batches >= 1.0
            && records >= batches
            && records_max as f64 >= records
            && records_max <= agent_kernel_txlog::GROUP_RECORDS_MAX as u64,
        "{document}"
    );
}

#[test]
fn bench_drives_live_sagas() {
    let document = bench(&[
        "--live",
        "--sagas",
        "4",
        "--steps",
        "3",
        "--concurrency",
        "2",
    ]);
    assert_eq!(document["mode"], "live");
    assert_eq!(document["n_steps"], 12);
    // A live saga of n steps: its begin, a BEGIN and a COMMIT per call, its commit.
    assert_eq!(document["n_commits"], 4 * (2 * 3 + 2));
}

#[test]
fn bench_measures_one_recovery_of_abandoned_sagas() {
    let document = bench(&[
        "--recovery",
        "--sagas",
        "20",
        "--steps",
        "2",
        "--concurrency",
        "4",
    ]);
    assert_eq!(document["n_sagas"], 20);
    assert_eq!(document["n_rolled_back"], 20);
    assert!(document["recover_ms"].as_f64() > Some(0.0), "{document}");
    // Each saga's move to Compensating, then per saga one write per compensation (each
    // durable before the next one acts; the last with the saga's end), and recover's own
    // record. (Take-overs are not writes of batches.)
    assert_eq!(document["n_commits"], 20 + 20 * 2 + 1);
    let (code, document) = Project::new().run_json(&["bench", "--recovery", "--live"]);
    assert_eq!(code, 2, "{document}");
}

#[test]
fn bench_runs_in_the_log_db_names_which_several_bench_processes_share() {
    let project = Project::new();
    let shared = project.db();
    let benches: Vec<_> = (0..2)
        .map(|_| {
            project
                .command(&[
                    "--json",
                    "bench",
                    "--sagas",
                    "6",
                    "--steps",
                    "3",
                    "--concurrency",
                    "3",
                ])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("starts")
        })
        .collect();
    for bench in benches {
        let (code, document) = crate::json_output(&bench.wait_with_output().expect("runs"));
        assert_eq!(code, 0, "{document}");
        assert_eq!(document["backend"], "sqlite", "{document}");
        assert_eq!(document["shared_log"], true, "{document}");
        let per_step = document["transactions_per_step"]
            .as_f64()
            .expect("a number");
        let expected = document["n_transactions"].as_f64().expect("a count") / 18.0;
        assert!((per_step - expected).abs() < 1e-9, "{document}");
        assert!(document.get("round_trips_per_step").is_none(), "{document}");
    }
    // Both processes' sagas are in the one log, which verifies.
    let (code, log) = project.run_json(&["log", "--limit", "100"]);
    assert_eq!(code, 0, "{log}");
    let sagas = log["sagas"].as_array().expect("sagas");
    assert_eq!(sagas.len(), 12, "{log}");
    assert!(sagas.iter().all(|saga| saga["state"] == "Done"), "{log}");
    let (code, report) = project.run_json(&["audit", "verify"]);
    assert_eq!(code, 0, "{report}");
    assert!(shared.exists());
    // --keep-log beside --db is refused, and a log of AGENT_KERNEL_DB is never used.
    let (code, document) = project.run_json(&["bench", "--keep-log", "other.db"]);
    assert_eq!(code, 2, "{document}");
    // --recovery runs in it while it holds no unfinished saga, and is refused once it holds
    // one (`recover` would take it over too), nothing written.
    let recovery = ["bench", "--recovery", "--sagas", "3", "--steps", "1"];
    let (code, document) = project.run_json(&recovery);
    assert_eq!(code, 0, "{document}");
    assert_eq!(document["backend"], "sqlite", "{document}");
    assert_eq!(document["n_rolled_back"], 3, "{document}");
    assert!(document.get("n_round_trips").is_none(), "{document}");
    fs::write(
        project.path("sandbox.toml"),
        "[fs]\nallow = [\"ws\"]\n\n[approval]\nrequire = [\"fs.append\"]\n",
    )
    .expect("writes policy");
    let waits = project.plan(
        "waits.json",
        &json!({"steps": [{"tool": "fs.append", "args": {"path": "ws/log.txt", "content": "x"}}]}),
    );
    let output = project.run(&["run", "--no-wait", "--plan", waits.to_str().expect("utf-8")]);
    assert_eq!(output.status.code(), Some(5), "{}", describe(&output));
    let before = project.run_json(&["log", "--limit", "100"]).1;
    let (code, document) = project.run_json(&recovery);
    assert_eq!(code, 2, "{document}");
    assert!(
        document.to_string().contains("1 unfinished saga"),
        "{document}"
    );
    assert_eq!(project.run_json(&["log", "--limit", "100"]).1, before);
    let elsewhere = project.path("env.db");
    let output = project
        .isolated(crate::bin())
        .env("AGENT_KERNEL_DB", &elsewhere)
        .args(["--json", "bench", "--sagas", "1", "--steps", "1"])
        .output()
        .expect("runs");
    let (code, document) = crate::json_output(&output);
    assert_eq!(code, 0, "{document}");
    assert_eq!(document["shared_log"], false, "{document}");
    assert!(
        !elsewhere.exists(),
        "bench wrote the log of AGENT_KERNEL_DB"
    );
}

#[test]
fn recovery_runs_under_the_policy_in_force_and_refuses_a_broken_one() {
    let project = Project::new();
    fs::write(project.path("ws/a.txt"), b"before").expect("writes");
    let before = project.snapshot();
    let plan = project.plan(
        "plan.json",
        &json!({ "steps": [
            step("fs.write", json!({"path": "ws/a.txt", "content": "after"})),
            step("noop", json!({"sleep_ms": 60000})),
        ]}),
    );
    let mut child = project
        .command(&["run", "--plan", plan.to_str().expect("utf8")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawns");
    crate::wait_until("the saga never wrote", || {
        fs::read(project.path("ws/a.txt")).expect("reads") == b"after"
    });
    crate::sigkill(&mut child).expect("kills");
    child.wait().expect("reaps");
    // The policy is now broken: what the log records is ruled on by the policy in force,
    // so recovery refuses to guess and undoes nothing, leaving the saga for later.
    let policy = fs::read(project.path("sandbox.toml")).expect("reads");
    fs::write(project.path("sandbox.toml"), "this is [not toml").expect("writes");
    let (code, report) = project.run_json(&["recover"]);
    assert_eq!(code, 2, "{report}");
    assert!(
        report["error"]["message"]
            .as_str()
            .expect("a message")
            .contains("sandbox policy"),
        "{report}"
    );
    assert_eq!(fs::read(project.path("ws/a.txt")).expect("reads"), b"after");
    // No policy at all (the wrong folder, say): refused too, since every file step would
    // otherwise be left uncompensated for good.
    fs::remove_file(project.path("sandbox.toml")).expect("removes");
    let (code, report) = project.run_json(&["recover"]);
    assert_eq!(code, 2, "{report}");
    assert!(
        report["error"]["message"]
            .as_str()
            .expect("a message")
            .contains("no sandbox policy"),
        "{report}"
    );
    assert_eq!(fs::read(project.path("ws/a.txt")).expect("reads"), b"after");
    // Repaired, the policy lets recovery put the file back.
    fs::write(project.path("sandbox.toml"), policy).expect("writes");
    let (code, report) = project.run_json(&["recover"]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["sagas"][0]["action"], "rolled_back", "{report}");
    assert_eq!(project.snapshot(), before);
}

#[test]
fn sigint_stops_at_the_next_step_boundary_and_rolls_back() {
    let project = Project::new();
    fs::write(project.path("ws/a.txt"), b"before").expect("writes");
    let before = project.snapshot();
    let plan = project.plan(
        "plan.json",
        &json!({ "steps": [
            step("fs.write", json!({"path": "ws/a.txt", "content": "after"})),
            step("noop", json!({"sleep_ms": 400})),
            step("fs.write", json!({"path": "ws/b.txt", "content": "b"})),
            step("noop", json!({"sleep_ms": 400})),
            step("fs.write", json!({"path": "ws/c.txt", "content": "c"})),
        ]}),
    );
    let child = project
        .command(&["--json", "run", "--plan", plan.to_str().expect("utf8")])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawns");
    crate::wait_until("the saga never wrote", || {
        fs::read(project.path("ws/a.txt")).expect("reads") == b"after"
    });
    let status = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    let output = child.wait_with_output().expect("finishes");
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let document: Value = serde_json::from_slice(&output.stdout).expect("one JSON document");
    assert_eq!(document["state"], "FailedRolledBack");
    let message = document["failure"]["error"]["message"]
        .as_str()
        .expect("message");
    assert!(message.contains("SIGINT"), "{message}");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("stopping at the next step boundary"),
        "{}",
        describe(&output)
    );
    assert_eq!(
        project.snapshot(),
        before,
        "what ran was rolled back, nothing else ran"
    );
    // Why is in the log, on the step that did not run.
    let saga_id = document["saga_id"].as_str().expect("id");
    let (_, shown) = project.run_json(&["log", "--saga", saga_id]);
    let steps = shown["steps"].as_array().expect("steps");
    let cancelled = steps.last().expect("a step");
    assert_eq!(cancelled["status"], "FAIL");
    assert!(
        cancelled["error"]
            .as_str()
            .expect("error")
            .contains("SIGINT")
    );
}

#[test]
fn limits_from_the_policy_bound_every_call() {
    let project = Project::new();
    fs::write(
        project.path("sandbox.toml"),
        "[fs]\nallow = [\"ws\"]\n\n[limits]\ntimeout_ms = 20000\n\n[limits.tools.noop]\ntimeout_ms = 200\n",
    )
    .expect("writes policy");
    let (code, listed) = project.run_json(&["tools"]);
    assert_eq!(code, 0, "{listed}");
    let noop = listed["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .find(|tool| tool["tool"] == "noop")
        .expect("noop listed")
        .clone();
    assert_eq!(noop["timeout_ms"], 200);
    assert_eq!(listed["limits"]["timeout_ms"], 20000);

    fs::write(project.path("ws/a.txt"), b"before").expect("writes");
    let before = project.snapshot();
    let plan = project.plan(
        "plan.json",
        &json!({ "steps": [
            step("fs.write", json!({"path": "ws/a.txt", "content": "after"})),
            step("noop", json!({"sleep_ms": 5000})),
        ]}),
    );
    let started = std::time::Instant::now();
    let (code, document) = project.run_json(&["run", "--plan", plan.to_str().expect("utf8")]);
    assert_eq!(code, 1, "{document}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(4),
        "the timeout cut the sleep"
    );
    assert_eq!(document["failure"]["error"]["kind"], "timeout");
    assert_eq!(project.snapshot(), before);
}

#[test]
fn bad_limits_and_mcp_settings_are_bad_input() {
    let project = Project::new();
    let plan = project.plan(
        "plan.json",
        &json!({ "steps": [ step("noop", json!({})) ] }),
    );
    for (limits, fragment) in [
        ("[limits]\ntimeout = 5\n", "unknown field `timeout`"),
        ("[limits]\nconcurrency_max = 0\n", "concurrency_max is 0"),
        (
            "[limits.tools.noop]\nretries_max = 99\n",
            "retries_max is 99",
        ),
        (
            "[limits.tools.\"fs.wrte\"]\ntimeout_ms = 5\n",
            "names no tool",
        ),
        // Every command refuses what the MCP server would.
        (
            "[mcp]\non_denied = \"ignore\"\n",
            "unknown variant `ignore`",
        ),
        ("[mcp]\non_deny = \"refuse\"\n", "unknown field `on_deny`"),
    ] {
        fs::write(
            project.path("sandbox.toml"),
            format!("[fs]\nallow = [\"ws\"]\n\n{limits}"),
        )
        .expect("writes policy");
        let output = project.run(&["run", "--plan", plan.to_str().expect("utf8")]);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{limits}: {}",
            describe(&output)
        );
        assert!(
            String::from_utf8_lossy(&output.stderr).contains(fragment),
            "{limits}: {}",
            describe(&output)
        );
    }
}

#[test]
fn json_logs_carry_saga_and_step_spans() {
    let project = Project::new();
    let plan = project.plan(
        "plan.json",
        &json!({ "steps": [
            step("fs.write", json!({"path": "ws/a.txt", "content": "x"})),
            step("fault.fail", json!({})),
        ]}),
    );
    let output = project.run(&[
        "-vv",
        "--log-format",
        "json",
        "run",
        "--plan",
        plan.to_str().expect("utf8"),
    ]);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let lines: Vec<Value> = String::from_utf8_lossy(&output.stderr)
        .lines()
        .filter(|line| line.starts_with('{'))
        .map(|line| serde_json::from_str(line).expect("each log line is JSON"))
        .collect();
    assert!(!lines.is_empty(), "{}", describe(&output));
    let failed = lines
        .iter()
        .find(|line| line["fields"]["message"] == "step failed")
        .expect("the failure is logged");
    assert!(
        failed["span"]["saga_id"].is_string() || failed["spans"][0]["saga_id"].is_string(),
        "{failed}"
    );
    assert!(
        lines
            .iter()
            .any(|line| line["spans"].as_array().is_some_and(|spans| spans
                .iter()
                .any(|span| span["name"] == "step" && span["tool"] == "fs.write"))),
        "a step span names its tool"
    );
    // -q silences all but errors.
    let output = project.run(&["-q", "run", "--plan", plan.to_str().expect("utf8")]);
    assert!(output.stderr.is_empty() || !String::from_utf8_lossy(&output.stderr).contains("WARN"));
}

#[test]
fn dry_run_checks_and_simulates_without_touching_anything() {
    let project = Project::new();
    fs::write(project.path("ws/a.txt"), b"before").expect("writes");
    let before = project.snapshot();
    let plan = project.plan(
        "plan.json",
        &json!({ "steps": [
            step("fs.write", json!({"path": "ws/a.txt", "content": "after"})),
            step("fs.append", json!({"path": "ws/log.txt", "content": "x"})),
            step("validate.file", json!({"path": "ws/a.txt", "contains": "after"})),
            step("fs.delete", json!({"path": "ws/a.txt"})),
        ]}),
    );
    let plan_arg = plan.to_str().expect("utf8");
    let (code, document) = project.run_json(&["run", "--plan", plan_arg, "--dry-run"]);
    assert_eq!(code, 0, "{document}");
    assert_eq!(document["dry_run"], true);
    assert_eq!(document["state"], "Done");
    assert_eq!(statuses(&document), ["COMMIT"; 4]);
    assert_eq!(project.snapshot(), before, "no file touched");
    // Recorded, marked as a dry run, with its steps simulated.
    let saga_id = document["saga_id"].as_str().expect("an id").to_owned();
    let (_, listed) = project.run_json(&["log"]);
    assert_eq!(listed["sagas"].as_array().expect("sagas").len(), 1);
    assert_eq!(listed["sagas"][0]["saga_id"], saga_id.as_str());
    assert_eq!(listed["sagas"][0]["dry_run"], true);
    let (code, record) = project.run_json(&["log", "--saga", &saga_id]);
    assert_eq!(code, 0, "{record}");
    assert_eq!(record["dry_run"], true);
    assert_eq!(record["state"], "Done");
    assert_eq!(statuses(&record), ["COMMIT"; 4]);
    assert_eq!(
        record["steps"][0]["output"]["data"]["dry_run"], true,
        "{record}"
    );
    // Nothing to recover and nothing to roll back; the log is intact.
    let (code, recovered) = project.run_json(&["recover"]);
    assert_eq!(code, 0, "{recovered}");
    assert_eq!(recovered["sagas"], json!([]));
    let (code, rolled_back) = project.run_json(&["rollback", "--saga", &saga_id]);
    assert_eq!(code, 0, "{rolled_back}");
    assert_eq!(rolled_back["dry_run"], true);
    assert_eq!(project.snapshot(), before, "no file touched");
    let output = project.run(&["audit", "verify"]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));

    // A step that would fail, and a sandbox denial, are reported the same way a run would.
    let failing = project.plan(
        "failing.json",
        &json!({ "steps": [
            step("fs.write", json!({"path": "ws/a.txt", "content": "after"})),
            step("fault.fail", json!({"message": "would not pass"})),
        ]}),
    );
    let (code, document) = project.run_json(&[
        "run",
        "--plan",
        failing.to_str().expect("utf8"),
        "--dry-run",
    ]);
    assert_eq!(code, 1, "{document}");
    assert!(
        document["failure"]["error"]["message"]
            .as_str()
            .expect("message")
            .contains("would not pass")
    );
    let denied = project.plan(
        "denied.json",
        &json!({ "steps": [ step("fs.write", json!({"path": "../outside.txt", "content": "x"})) ]}),
    );
    let output = project.run(&["run", "--plan", denied.to_str().expect("utf8"), "--dry-run"]);
    assert_eq!(output.status.code(), Some(4), "{}", describe(&output));
    assert_eq!(project.snapshot(), before);
    assert!(!project.path("outside.txt").exists());
}

#[test]
fn landlock_refuses_what_the_first_line_would_not_see() {
    let project = Project::new();
    fs::write(project.path("outside.txt"), b"secret").expect("writes");
    fs::write(project.path("ws/inside.txt"), b"fine").expect("writes");
    let (code, outside) = project.run_json(&["sandbox", "status", "--probe", "outside.txt"]);
    assert_eq!(code, 0, "{outside}");
    assert_eq!(outside["first_line"]["files"], true);
    let landlock = outside["second_line"]["landlock"].as_str().expect("status");
    let (_, inside) = project.run_json(&["sandbox", "status", "--probe", "ws/inside.txt"]);
    assert_eq!(inside["probe"]["refused"], false, "{inside}");
    if landlock == "unavailable" {
        // No second line on this kernel: say so, and the direct read goes through.
        eprintln!(
            "landlock unavailable here: {}",
            outside["second_line"]["detail"]
        );
        assert_eq!(outside["probe"]["refused"], false);
    } else {
        // The process read the file directly, beside the first line: the kernel refused.
        assert_eq!(outside["probe"]["refused"], true, "{outside}");
        assert!(
            outside["probe"]["error"]
                .as_str()
                .expect("error")
                .contains("Permission denied"),
            "{outside}"
        );
    }
}

#[test]
fn landlock_confines_tcp_to_what_the_policy_needs() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binds");
    let port = listener.local_addr().expect("address").port();
    let other_port = if port == 8443 { 8444 } else { 8443 };
    let project = Project::new();
    let target = format!("127.0.0.1:{port}");
    let probe = |policy: &str| {
        fs::write(project.path("sandbox.toml"), policy).expect("writes policy");
        let (code, document) =
            project.run_json(&["sandbox", "status", "--probe-connect", target.as_str()]);
        assert_eq!(code, 0, "{document}");
        document
    };
    let cases = [
        // No [http]: no TCP at all.
        ("[fs]\nallow = [\"ws\"]\n".to_owned(), "no_tcp", true),
        // allow_ports that do not include the port.
        (
            format!("[http]\nallow_domains = [\"127.0.0.1\"]\nallow_ports = [{other_port}]\n"),
            "ports",
            true,
        ),
        // allow_ports that include it.
        (
            format!("[http]\nallow_domains = [\"127.0.0.1\"]\nallow_ports = [{port}]\n"),
            "ports",
            false,
        ),
        // No allow_ports: connections are the first line's business.
        (
            "[http]\nallow_domains = [\"127.0.0.1\"]\n".to_owned(),
            "any_port",
            false,
        ),
    ];
    for (policy, line, refused) in cases {
        let document = probe(&policy);
        let network = document["second_line"]["network"]
            .as_str()
            .expect("network");
        if network == "unavailable" {
            // An older kernel: no network rules; the connection goes through.
            eprintln!(
                "landlock network rules unavailable here: {}",
                document["second_line"]["network_detail"]
            );
            assert_eq!(document["probe_connect"]["refused"], false, "{document}");
            continue;
        }
        assert_eq!(network, line, "{policy}: {document}");
        assert_eq!(
            document["probe_connect"]["refused"], refused,
            "{policy}: {document}"
        );
        if refused {
            assert!(
                document["probe_connect"]["error"]
                    .as_str()
                    .expect("error")
                    .contains("Permission denied"),
                "{document}"
            );
        }
    }
    drop(listener);
}

#[test]
fn bench_keeps_its_log_when_asked_and_never_reuses_one() {
    let project = Project::new();
    let kept = project.path("kept.db");
    let kept_arg = kept.to_str().expect("utf8");
    let document = bench(&["--sagas", "3", "--steps", "2", "--keep-log", kept_arg]);
    assert_eq!(document["n_steps"], 6);
    let output = project
        .isolated(crate::bin())
        .args(["--db", kept_arg, "audit", "verify"])
        .output()
        .expect("runs");
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        crate::describe(&output)
    );
    let before = fs::read(&kept).expect("reads");
    let (code, document) = project.run_json(&["bench", "--keep-log", kept_arg]);
    assert_eq!(code, 2, "{document}");
    assert_eq!(fs::read(&kept).expect("reads"), before);
}

#[test]
fn stderr_captured_to_a_file_carries_no_escape_byte_and_one_prefix_per_message() {
    let project = Project::new();
    // A warning (no policy) and a failed step, stderr and stdout captured as a log would.
    let plan = project.plan(
        "plan.json",
        &serde_json::json!({"steps": [{"tool": "fault.fail", "args": {"message": "the check failed"}}]}),
    );
    for colour in [None, Some("1")] {
        let mut command = project.command(&["run", "--plan", plan.to_str().expect("utf-8")]);
        if let Some(value) = colour {
            // Whatever the environment asks, a file is not a terminal.
            command.env("CLICOLOR_FORCE", value);
        }
        let output = command.output().expect("runs");
        assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
        assert!(!output.stderr.contains(&0x1b), "{}", describe(&output));
        assert!(!output.stdout.contains(&0x1b), "{}", describe(&output));
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            stdout.contains("step 0 (fault.fail) failed: the check failed"),
            "{stdout}"
        );
        assert!(!stdout.contains("failed: failed"), "{stdout}");
    }
    // A warning, as a tracing line: plain text.
    let output = project.run(&["recover", "--skip-verify"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--skip-verify"), "{}", describe(&output));
    assert!(!output.stderr.contains(&0x1b), "{}", describe(&output));
}
