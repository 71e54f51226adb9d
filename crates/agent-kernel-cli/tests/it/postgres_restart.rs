//! Workers through a PostgreSQL restart, as a loopback proxy shows one to them (every
//! connection cut, new ones refused for a while): a worker idle through it makes its
//! connection again and finishes; workers writing through it end `Done` or, after
//! `recover`, rolled back, every file as its saga's state says, no step begun or
//! compensated twice. And many workers SIGKILLed at once, whose sagas one `recover --watch`
//! rolls back together. Skipped without `AGENT_KERNEL_TEST_POSTGRES`.

use std::fs;
use std::process::{Child, Stdio};
use std::time::Duration;

use agent_kernel_log_contract::postgres::{Schema, server};
use serde_json::json;

use crate::postgres::{
    LEASE_MS as SHORT_LEASE_MS, ORIGINAL, Partition, STEPS, TAKEOVER_MAX, assert_verifies, file,
    on_postgres, repeated_records, saga_states, server_address, stop, worker_plan,
};
use crate::{Project, wait_until};

/// The workers' lease here: longer than the outage, so a worker that makes its connection
/// again finds its lease still live.
const LEASE_MS: &str = "10000";

#[test]
fn a_worker_idle_through_a_server_restart_makes_its_connection_again_and_finishes() {
    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    let url = schema.url();
    let partition = Partition::start(server_address(&url));
    let project = Project::new();
    for name in ["a", "b"] {
        fs::write(project.path(&format!("ws/{name}.txt")), ORIGINAL).expect("writes");
    }
    let plan = project.plan(
        "idle.json",
        &json!({ "name": "idle", "steps": [
            { "tool": "fs.write", "args": { "path": "ws/a.txt", "content": "first\n" } },
            { "tool": "noop", "args": { "sleep_ms": 2_500 } },
            { "tool": "fs.write", "args": { "path": "ws/b.txt", "content": "second\n" } },
        ] }),
    );
    let worker = on_postgres(
        &project,
        &partition.url(&url),
        &["--json", "run", "--plan", &plan.to_string_lossy()],
    )
    .env("AGENT_KERNEL_LEASE_MS", LEASE_MS)
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("starts");
    // The second step (the sleep) begun: its BEGIN is committed, and the worker waits.
    wait_until("the worker sleeps in its second step", || {
        let created = schema.rows("SELECT (to_regclass('saga_steps') IS NOT NULL)::text");
        created[0][0].as_deref() == Some("true")
            && !schema
                .rows("SELECT 'begun' FROM saga_steps WHERE step_seq = 1")
                .is_empty()
    });
    // The server restarts while it sleeps.
    partition.restart(Duration::from_millis(500));
    let output = worker.wait_with_output().expect("runs");
    assert!(output.status.success(), "{}", crate::describe(&output));
    assert_eq!(saga_states(&schema)["idle"], "Done");
    assert_eq!(
        fs::read_to_string(project.path("ws/b.txt")).expect("reads"),
        "second\n"
    );
    assert_verifies(&project, &url);
}

#[test]
fn workers_writing_through_a_server_restart_end_done_or_rolled_back_and_no_step_runs_twice() {
    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    let url = schema.url();
    let partition = Partition::start(server_address(&url));
    let project = Project::new();
    let n_workers = 4;
    let plans: Vec<String> = (0..n_workers)
        .map(|n| worker_plan(&project, n, 150))
        .collect();
    let workers: Vec<Child> = plans
        .iter()
        .map(|plan| {
            on_postgres(
                &project,
                &partition.url(&url),
                &["--json", "run", "--plan", plan],
            )
            .env("AGENT_KERNEL_LEASE_MS", LEASE_MS)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starts")
        })
        .collect();
    wait_until("worker 0 rewrote two files", || {
        file(&project, 0, 1) != ORIGINAL
    });
    partition.restart(Duration::from_millis(300));
    let mut codes = Vec::new();
    for mut worker in workers {
        codes.push(worker.wait().expect("exits").code());
    }
    eprintln!("the workers exited {codes:?}");
    // A worker the restart stopped ("the log failed", exit 3) left its saga to `recover`.
    let output = on_postgres(&project, &url, &["--json", "recover"])
        .output()
        .expect("runs");
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        crate::describe(&output)
    );
    let states = saga_states(&schema);
    for (n, code) in codes.iter().enumerate() {
        // A worker stopped before its saga's creation was written left nothing to settle.
        let state = states
            .get(&format!("worker {n}"))
            .map_or("never created", String::as_str);
        let expected = |step: usize| match state {
            "Done" => format!("worker {n} step {step}\n"),
            "FailedRolledBack" | "never created" => ORIGINAL.to_owned(),
            other => panic!("worker {n}'s saga ended {other}: {states:?}"),
        };
        for step in 0..STEPS {
            assert_eq!(file(&project, n, step), expected(step), "worker {n}");
        }
        if *code == Some(0) {
            assert_eq!(state, "Done", "worker {n} exited 0");
        }
        if state == "never created" {
            assert_eq!(*code, Some(3), "worker {n}");
        }
    }
    assert!(
        repeated_records(&schema).is_empty(),
        "{:?}",
        repeated_records(&schema)
    );
    assert_verifies(&project, &url);
}

#[test]
fn a_watcher_rolls_back_the_sagas_of_many_workers_killed_at_once() {
    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    let url = schema.url();
    let project = Project::new();
    let n_workers = 6;
    let plans: Vec<String> = (0..n_workers)
        .map(|n| worker_plan(&project, n, 1_000))
        .collect();
    let watcher = on_postgres(&project, &url, &["--json", "recover", "--watch"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starts");
    let mut workers: Vec<Child> = plans
        .iter()
        .map(|plan| {
            on_postgres(&project, &url, &["--json", "run", "--plan", plan])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("starts")
        })
        .collect();
    wait_until("every worker rewrote a file", || {
        (0..n_workers).all(|n| file(&project, n, 0) != ORIGINAL)
    });
    for worker in &mut workers {
        crate::sigkill(worker).expect("SIGKILL");
    }
    for worker in &mut workers {
        worker.wait().expect("reaped");
    }
    let killed_at = std::time::Instant::now();
    wait_until("every killed worker's files are restored", || {
        (0..n_workers).all(|n| (0..STEPS).all(|step| file(&project, n, step) == ORIGINAL))
    });
    let restored_after = killed_at.elapsed();
    eprintln!("{n_workers} sagas rolled back {restored_after:?} after the kills");
    assert!(
        restored_after < Duration::from_millis(SHORT_LEASE_MS) + TAKEOVER_MAX,
        "rolled back {restored_after:?} after the kills"
    );
    stop(watcher);
    let states = saga_states(&schema);
    assert_eq!(states.len(), n_workers, "{states:?}");
    assert!(
        states.values().all(|state| state == "FailedRolledBack"),
        "{states:?}"
    );
    assert!(
        repeated_records(&schema).is_empty(),
        "{:?}",
        repeated_records(&schema)
    );
    let take_overs = schema.rows("SELECT count(*)::text FROM audit_log WHERE kind = 'TakeOver'");
    assert_eq!(
        take_overs[0][0].as_deref(),
        Some(n_workers.to_string().as_str()),
        "one take-over per saga"
    );
    assert_verifies(&project, &url);
}
