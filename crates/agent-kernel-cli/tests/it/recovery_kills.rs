//! Recovery that survives its own kill and never clobbers a later write.
//!
//! - A `recover` SIGKILLed at a random moment of its rollback leaves a log from which the
//!   next `recover` finishes it with exit 0, every file byte for byte as before the saga.
//! - A dead saga's file changed since (by a later `Done` saga, by a person, by an MCP
//!   autocommit) is not put back by `recover`: the newer content stays, the step becomes a
//!   dead letter whose error starts `changed since:`, `recover` exits 3, and
//!   `dlq retry ID --force` then applies the compensation.
//!
//! The seed is printed; `AGENT_KERNEL_RECOVER_KILL_SEED` replays a run and
//! `AGENT_KERNEL_RECOVER_KILLS` sets the number of iterations (default 300).

use std::fs;
use std::thread;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use crate::crash::{Files, kill_after, reset_to, spawn};
use crate::{Project, describe};

/// Iterations of the kill loop, unless `AGENT_KERNEL_RECOVER_KILLS` says otherwise.
const DEFAULT_ITERATIONS: u32 = 300;
/// Every this many iterations (and at the end), `audit verify` checks the whole chain, and
/// the next iterations start a new log.
const VERIFY_EVERY: u32 = 50;

/// The files before every iteration: three that the saga's steps share.
fn initial_files() -> Files {
    Files::from([
        ("a.txt".to_owned(), b"a: original\n".to_vec()),
        ("b.txt".to_owned(), b"b line 0\n".to_vec()),
        ("c.txt".to_owned(), b"c: doomed\n".to_vec()),
    ])
}

/// Ten mutating steps of `fs.write`, `fs.append` and `fs.delete` over the three shared
/// files (each file changed by several steps, so compensations depend on one another), with
/// short sleeps between them; and the files once the saga is `Done`.
fn plan_and_model() -> (Value, Files) {
    let steps = json!([
        { "tool": "fs.write", "args": { "path": "ws/a.txt", "content": "a: first\n" } },
        { "tool": "fs.append", "args": { "path": "ws/b.txt", "content": "b line 1\n" } },
        { "tool": "noop", "args": { "sleep_ms": 3 } },
        { "tool": "fs.write", "args": { "path": "ws/a.txt", "content": "a: second, longer\n" } },
        { "tool": "fs.delete", "args": { "path": "ws/c.txt" } },
        { "tool": "fs.append", "args": { "path": "ws/a.txt", "content": "a: appended\n" } },
        { "tool": "noop", "args": { "sleep_ms": 3 } },
        { "tool": "fs.write", "args": { "path": "ws/c.txt", "content": "c: created again\n" } },
        { "tool": "fs.append", "args": { "path": "ws/b.txt", "content": "b line 2\n" } },
        { "tool": "fs.append", "args": { "path": "ws/c.txt", "content": "c: more\n" } },
        { "tool": "fs.delete", "args": { "path": "ws/a.txt" } },
        { "tool": "fs.write", "args": { "path": "ws/b.txt", "content": "b: replaced\n" } },
        { "tool": "noop", "args": { "sleep_ms": 2 } },
    ]);
    let done = Files::from([
        ("b.txt".to_owned(), b"b: replaced\n".to_vec()),
        ("c.txt".to_owned(), b"c: created again\nc: more\n".to_vec()),
    ]);
    (json!({ "name": "recover kills", "steps": steps }), done)
}

fn reset(project: &Project) {
    reset_to(project, initial_files());
}

/// The state of saga `saga_id`, read from the log directly (no process started).
pub(crate) fn state_of(project: &Project, saga_id: &str) -> Option<String> {
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY;
    let conn = rusqlite::Connection::open_with_flags(project.db(), flags).ok()?;
    conn.query_row(
        "SELECT state FROM sagas WHERE saga_id = ?1",
        [saga_id],
        |row| row.get(0),
    )
    .ok()
}

#[test]
fn a_recover_killed_mid_rollback_is_finished_by_the_next_recover() {
    let n_iterations: u32 = std::env::var("AGENT_KERNEL_RECOVER_KILLS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(DEFAULT_ITERATIONS);
    let seed = crate::seed_from_env("AGENT_KERNEL_RECOVER_KILL_SEED");
    eprintln!(
        "recover kills: seed {seed} (AGENT_KERNEL_RECOVER_KILL_SEED={seed} reproduces), {n_iterations} iterations"
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let project = Project::new();
    let (plan, done_files) = plan_and_model();
    let plan_path = project.plan("plan.json", &plan);
    let plan_arg = plan_path.to_str().expect("utf8").to_owned();

    // Calibrate: the shortest of three full runs, and the shortest time to its first
    // effect, set the range of the run's kill delays (so that most kills land in the saga,
    // not in the process's start).
    let (mut full_run, mut first_effect) = (Duration::MAX, Duration::MAX);
    for _ in 0..3 {
        reset(&project);
        let started = Instant::now();
        let mut child = spawn(&project, &["run", "--plan", &plan_arg]);
        let original = initial_files()["a.txt"].clone();
        crate::wait_until("the run's first effect never landed", || {
            fs::read(project.path("ws/a.txt")).is_ok_and(|now| now != original)
        });
        first_effect = first_effect.min(started.elapsed());
        let status = child.wait().expect("waits");
        full_run = full_run.min(started.elapsed());
        assert_eq!(status.code(), Some(0));
        assert_eq!(project.snapshot(), done_files, "the model matches a run");
    }
    let mut previous_saga = project.latest_saga().map(|(saga_id, _)| saga_id);
    let (mut n_recover_killed, mut n_mid_rollback, mut n_done, mut n_restored) = (0, 0, 0, 0);
    for iteration in 0..n_iterations {
        reset(&project);
        let (from_us, to_us) = (
            first_effect.as_micros() as u64 * 8 / 10,
            full_run.as_micros() as u64 * 11 / 10,
        );
        let run_delay = Duration::from_micros(rng.random_range(from_us..=to_us));
        kill_after(spawn(&project, &["run", "--plan", &plan_arg]), run_delay);
        let saga = project
            .latest_saga()
            .map(|(saga_id, _)| saga_id)
            .filter(|saga_id| Some(saga_id) != previous_saga.as_ref());
        // The recovery is killed between 0 and 60 ms in, or (every other time) once it is
        // seen compensating, 0 to 15 ms later: its compensations run only after it started,
        // verified the chain and took the saga over, so a delay from its start alone
        // rarely lands among them.
        let mut recover = spawn(&project, &["recover"]);
        let started = Instant::now();
        if iteration % 2 == 1
            && let Some(saga_id) = saga.as_deref()
        {
            while recover.try_wait().expect("polls").is_none()
                && state_of(&project, saga_id).as_deref() != Some("Compensating")
                && started.elapsed() < Duration::from_secs(10)
            {
                thread::sleep(Duration::from_micros(200));
            }
            thread::sleep(Duration::from_micros(rng.random_range(0..=15_000)));
        } else {
            thread::sleep(Duration::from_micros(rng.random_range(0..=60_000)));
        }
        let recover_delay = started.elapsed();
        if kill_after(recover, Duration::ZERO) {
            n_recover_killed += 1;
            if saga
                .as_deref()
                .and_then(|saga_id| state_of(&project, saga_id))
                .as_deref()
                == Some("Compensating")
            {
                n_mid_rollback += 1;
            }
        }
        let output = project.run(&["recover"]);
        assert_eq!(
            output.status.code(),
            Some(0),
            "seed {seed} iteration {iteration} (run killed at {run_delay:?}, recover killed at {recover_delay:?}): {}",
            describe(&output)
        );
        let state = saga
            .as_deref()
            .and_then(|saga_id| state_of(&project, saga_id));
        if let Some(saga_id) = saga {
            previous_saga = Some(saga_id);
        }
        let files = project.snapshot();
        match state.as_deref() {
            Some("Done") => {
                n_done += 1;
                assert_eq!(files, done_files, "seed {seed} iteration {iteration}: Done");
            }
            Some("FailedRolledBack") | None => {
                n_restored += 1;
                assert_eq!(
                    files,
                    initial_files(),
                    "seed {seed} iteration {iteration} (run killed at {run_delay:?}, recover killed at {recover_delay:?}): not as before the saga"
                );
            }
            Some(other) => panic!("seed {seed} iteration {iteration}: saga left {other}"),
        }
        if (iteration + 1) % VERIFY_EVERY == 0 || iteration + 1 == n_iterations {
            let output = project.run(&["audit", "verify"]);
            assert_eq!(
                output.status.code(),
                Some(0),
                "seed {seed} iteration {iteration}: {}",
                describe(&output)
            );
            // A new log from here: `recover` verifies the whole log before it acts, so
            // one log of all the iterations would make each slower than the last.
            for entry in fs::read_dir(project.dir.path()).expect("lists") {
                let path = entry.expect("entry").path();
                // The log, its journal, its head file and their locks.
                if path
                    .file_name()
                    .and_then(|name| name.to_str())
                    .is_some_and(|name| name.starts_with("log.db"))
                {
                    fs::remove_file(&path).expect("removes");
                }
            }
            previous_saga = None;
        }
    }
    eprintln!(
        "recover kills: {n_iterations} iterations, {n_recover_killed} recoveries killed while running ({n_mid_rollback} mid-rollback), {n_done} Done, {n_restored} restored"
    );
    assert!(n_restored > 0, "some iterations must need a rollback");
    if n_iterations >= 100 {
        assert!(
            n_mid_rollback > 0,
            "some recoveries must be killed mid-rollback ({n_recover_killed} killed while running)"
        );
    }
}

/// Starts `run` of a saga that writes `content` to `ws/config.txt` and then sleeps, and
/// SIGKILLs it once the write is on disk: a dead saga whose write `recover` would undo.
fn dead_saga_writing(project: &Project, content: &str) -> String {
    let plan = project.plan(
        "dead.json",
        &json!({ "steps": [
            { "tool": "fs.write", "args": { "path": "ws/config.txt", "content": content } },
            { "tool": "noop", "args": { "sleep_ms": 20_000 } },
        ]}),
    );
    let mut child = spawn(project, &["run", "--plan", plan.to_str().expect("utf8")]);
    crate::wait_until("the dead saga's write never landed", || {
        fs::read_to_string(project.path("ws/config.txt")).is_ok_and(|now| now == content)
    });
    crate::sigkill(&mut child).expect("SIGKILLs");
    child.wait().expect("reaps");
    project.latest_saga().expect("a saga").0
}

/// `recover` after `ws/config.txt` changed since the dead saga wrote it: exit 3, the newer
/// `expected` content stays, and one dead letter names the step and the change; then
/// `dlq retry --force` puts back `v1`.
fn recover_keeps_the_change(project: &Project, dead: &str, expected: &str) {
    let (code, report) = project.run_json(&["recover"]);
    assert_eq!(code, 3, "{report}");
    assert_eq!(
        fs::read_to_string(project.path("ws/config.txt")).expect("reads"),
        expected,
        "recover clobbered a later write"
    );
    let (code, record) = project.run_json(&["log", "--saga", dead]);
    assert_eq!(code, 0, "{record}");
    assert_eq!(record["state"], "FailedRollbackPartial", "{record}");
    assert_eq!(
        record["steps"][0]["status"], "COMPENSATION_FAILED",
        "{record}"
    );
    let (code, letters) = project.run_json(&["dlq", "list"]);
    assert_eq!(code, 0, "{letters}");
    let letters = letters["dead_letters"].as_array().expect("letters").clone();
    assert_eq!(letters.len(), 1, "{letters:?}");
    let letter = &letters[0];
    assert_eq!(letter["saga_id"], dead, "{letter}");
    assert_eq!(letter["step"], 0, "{letter}");
    assert_eq!(letter["tool"], "fs.write", "{letter}");
    let error = letter["error"].as_str().expect("error");
    assert!(error.starts_with("changed since: "), "{error}");
    assert!(error.contains("ws/config.txt"), "{error}");
    let id = letter["id"].as_str().expect("id");

    // Without --force, a retry refuses again and changes nothing.
    let output = project.run(&["dlq", "retry", id]);
    assert_eq!(output.status.code(), Some(3), "{}", describe(&output));
    assert_eq!(
        fs::read_to_string(project.path("ws/config.txt")).expect("reads"),
        expected
    );
    // With it, the operator applies what the compensation restores.
    let output = project.run(&["dlq", "retry", id, "--force"]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    assert_eq!(
        fs::read_to_string(project.path("ws/config.txt")).expect("reads"),
        "v1"
    );
    let (_, record) = project.run_json(&["log", "--saga", dead]);
    assert_eq!(record["state"], "FailedRolledBack", "{record}");
    let output = project.run(&["audit", "verify"]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
}

#[test]
fn a_later_saga_is_refused_while_a_dead_saga_holds_the_file_and_runs_after_recover() {
    let project = Project::new();
    fs::write(project.path("ws/config.txt"), "v1").expect("writes");
    let dead = dead_saga_writing(&project, "v2-dead");
    let later = project.plan(
        "later.json",
        &json!({ "steps": [
            { "tool": "fs.write", "args": { "path": "ws/config.txt", "content": "v3-later" } },
        ]}),
    );
    let later = later.to_str().expect("utf8");
    let output = project.run(&["run", "--plan", later]);
    assert_eq!(output.status.code(), Some(6), "{}", describe(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains(&format!("held by saga {dead}"))
            && stdout.contains("no longer running: run `agent-kernel recover`"),
        "{stdout}"
    );
    assert_eq!(
        fs::read_to_string(project.path("ws/config.txt")).expect("reads"),
        "v2-dead",
        "the refused saga wrote nothing"
    );
    let (code, report) = project.run_json(&["recover"]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(
        fs::read_to_string(project.path("ws/config.txt")).expect("reads"),
        "v1"
    );
    let output = project.run(&["run", "--plan", later]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    assert_eq!(
        fs::read_to_string(project.path("ws/config.txt")).expect("reads"),
        "v3-later"
    );
}

#[test]
fn recover_leaves_a_persons_edit_and_records_the_change() {
    let project = Project::new();
    fs::write(project.path("ws/config.txt"), "v1").expect("writes");
    let dead = dead_saga_writing(&project, "v2-dead");
    fs::write(project.path("ws/config.txt"), "edited by hand").expect("writes");
    recover_keeps_the_change(&project, &dead, "edited by hand");
}

#[test]
fn an_mcp_call_on_a_file_a_dead_saga_holds_is_a_conflict_until_recover() {
    let project = Project::new();
    fs::write(project.path("ws/config.txt"), "v1").expect("writes");
    let dead = dead_saga_writing(&project, "v2-dead");
    let mut server = crate::mcp::Raw::start(&project);
    let call = json!({ "args": { "path": "ws/config.txt", "content": "v3-over-mcp" } });
    let refused = server.call("fs_write", call.clone());
    assert_eq!(refused["result"]["isError"], true, "{refused}");
    let error = &refused["result"]["structuredContent"]["error"];
    assert_eq!(error["kind"], "conflict", "{refused}");
    assert_eq!(error["holder"]["saga_id"], dead.as_str(), "{refused}");
    assert_eq!(error["holder"]["alive"], false, "{refused}");
    assert!(
        error["message"]
            .as_str()
            .is_some_and(|message| message.contains("run `agent-kernel recover`")),
        "{refused}"
    );
    let (code, report) = project.run_json(&["recover"]);
    assert_eq!(code, 0, "{report}");
    let written = server.call("fs_write", call);
    assert_eq!(written["result"]["isError"], false, "{written}");
    assert_eq!(
        written["result"]["structuredContent"]["state"], "Done",
        "{written}"
    );
    server.close();
    assert_eq!(
        fs::read_to_string(project.path("ws/config.txt")).expect("reads"),
        "v3-over-mcp"
    );
}

#[test]
fn a_rollback_that_finds_its_file_unchanged_or_already_restored_finishes() {
    // A person restores the dead saga's file to what it was before the saga: the world is
    // then as the step's compensation would leave it, which is no change to destroy, so
    // recovery finishes (exit 0) and the file stays as it was.
    let project = Project::new();
    fs::write(project.path("ws/config.txt"), "v1").expect("writes");
    dead_saga_writing(&project, "v2-dead");
    fs::write(project.path("ws/config.txt"), "v1").expect("writes");
    let (code, report) = project.run_json(&["recover"]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(
        fs::read_to_string(project.path("ws/config.txt")).expect("reads"),
        "v1"
    );
}
