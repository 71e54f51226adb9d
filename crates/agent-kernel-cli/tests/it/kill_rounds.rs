//! `undo` and `dlq retry` SIGKILLed at random moments (while a command tool's program runs,
//! often), then finished by `recover` and the same command, and upstream MCP servers
//! SIGKILLed at random moments under a running saga: every file ends exactly as the model
//! says, and every kill is counted (`crate::sigkill`, `sigkill_server`).
//!
//! The seed is printed; `AGENT_KERNEL_KILL_SEED` replays a run and
//! `AGENT_KERNEL_KILL_ROUNDS` sets the number of kills of each command (default 30).

use std::collections::BTreeMap;
use std::fs;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use crate::crash::{kill_after, spawn};
use crate::dlq::{NOTE_PY, TOOLS_TOML};
use crate::{Project, describe};

/// Kills of each command per run, unless `AGENT_KERNEL_KILL_ROUNDS` says otherwise.
const DEFAULT_ROUNDS: u32 = 30;

type Files = BTreeMap<String, Vec<u8>>;

fn rounds() -> u32 {
    std::env::var("AGENT_KERNEL_KILL_ROUNDS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(DEFAULT_ROUNDS)
}

/// A project with the `note.add` command tool.
fn project_with_notes() -> Project {
    let project = Project::new();
    fs::write(project.path("note.py"), NOTE_PY).expect("writes");
    fs::write(project.path("tools.toml"), TOOLS_TOML).expect("writes");
    project
}

/// The state of the project's one saga.
fn state(project: &Project) -> String {
    project.latest_saga().expect("a saga").1
}

/// A saga of built-in and command-tool steps run to `Done`; the files before and after.
fn done_saga(project: &Project) -> (String, Files, Files) {
    fs::write(project.path("ws/a.txt"), "before").expect("writes");
    fs::write(project.path("ws/log.txt"), "one\n").expect("writes");
    // `note.add`'s compensation removes its line and leaves the file, empty.
    fs::write(project.path("ws/notes.txt"), "").expect("writes");
    let before = project.snapshot();
    let plan = project.plan(
        "plan.json",
        &json!({"steps": [
            {"tool": "fs.write", "args": {"path": "ws/a.txt", "content": "after"}},
            {"tool": "note.add", "args": {"item": "first"}},
            {"tool": "fs.append", "args": {"path": "ws/log.txt", "content": "two\n"}},
            {"tool": "note.add", "args": {"item": "second"}},
        ]}),
    );
    let output = project.run(&["run", "--plan", plan.to_str().expect("utf-8")]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let (saga_id, state) = project.latest_saga().expect("a saga");
    assert_eq!(state, "Done");
    (saga_id, before, project.snapshot())
}

/// How long `args` takes on a fresh project that `prepare` sets up, the shortest of three.
fn calibrate(prepare: impl Fn() -> (Project, Vec<String>)) -> Duration {
    (0..3)
        .map(|_| {
            let (project, args) = prepare();
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let started = Instant::now();
            let output = project.run(&args);
            assert!(
                matches!(output.status.code(), Some(0 | 3)),
                "{}",
                describe(&output)
            );
            started.elapsed()
        })
        .min()
        .expect("three runs")
}

/// `audit verify` passes after round `round`.
fn verifies(project: &Project, round: u32) {
    let output = project.run(&["audit", "verify"]);
    assert_eq!(
        output.status.code(),
        Some(0),
        "round {round}: {}",
        describe(&output)
    );
}

/// A delay from 0 to 130% of `span`: most kills land inside the command, some after it.
fn delay(rng: &mut StdRng, span: Duration) -> Duration {
    let span_us = u64::try_from(span.as_micros()).unwrap_or(u64::MAX);
    Duration::from_micros(rng.random_range(0..=span_us.saturating_mul(13) / 10))
}

#[test]
fn undo_killed_at_random_moments_then_recover_leaves_the_saga_done_or_undone() {
    let rounds = rounds();
    let seed = crate::seed_from_env("AGENT_KERNEL_KILL_SEED");
    eprintln!("undo kills: seed {seed} (AGENT_KERNEL_KILL_SEED={seed} reproduces), {rounds} kills");
    let mut rng = StdRng::seed_from_u64(seed);
    let span = calibrate(|| {
        let project = project_with_notes();
        let (saga_id, _, _) = done_saga(&project);
        let args = ["undo", "--saga", &saga_id, "--reason", "calibration"];
        (project, args.map(str::to_owned).to_vec())
    });
    let (mut undone, mut left_done) = (0, 0);
    for round in 0..rounds {
        let project = project_with_notes();
        let (saga_id, before, done) = done_saga(&project);
        let undo = spawn(
            &project,
            &["undo", "--saga", &saga_id, "--reason", "killed on purpose"],
        );
        kill_after(undo, delay(&mut rng, span));
        let output = project.run(&["recover"]);
        assert_eq!(
            output.status.code(),
            Some(0),
            "round {round}: {}",
            describe(&output)
        );
        match state(&project).as_str() {
            "Undone" => {
                undone += 1;
                assert_eq!(project.snapshot(), before, "round {round}: undone");
            }
            "Done" => {
                left_done += 1;
                assert_eq!(project.snapshot(), done, "round {round}: still done");
                let output =
                    project.run(&["undo", "--saga", &saga_id, "--reason", "after the kill"]);
                assert_eq!(
                    output.status.code(),
                    Some(0),
                    "round {round}: {}",
                    describe(&output)
                );
                assert_eq!(state(&project), "Undone", "round {round}");
                assert_eq!(project.snapshot(), before, "round {round}: undone after");
            }
            other => panic!("round {round}: the saga is {other} after `recover`"),
        }
        verifies(&project, round);
    }
    eprintln!("undo kills: {undone} undone by `recover`, {left_done} left done and undone again");
}

/// The open dead letters of the project, by step, highest step first.
fn open_letters(project: &Project) -> Vec<(u64, String)> {
    let (code, listed) = project.run_json(&["dlq", "list"]);
    assert_eq!(code, 0, "{listed}");
    let mut letters: Vec<(u64, String)> = listed["dead_letters"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|letter: &Value| {
            (
                letter["step"].as_u64().expect("a step"),
                letter["id"].as_str().expect("an id").to_owned(),
            )
        })
        .collect();
    letters.sort_unstable_by(|a, b| b.cmp(a));
    letters
}

/// A saga whose two `note.add` compensations failed (the notes locked), then unlocked:
/// two open dead letters.
fn failed_saga(project: &Project) {
    fs::write(project.path("ws/block"), "").expect("writes");
    let plan = project.plan(
        "plan.json",
        &json!({"steps": [
            {"tool": "note.add", "args": {"item": "a"}},
            {"tool": "note.add", "args": {"item": "b"}},
            {"tool": "fault.fail", "args": {}},
        ]}),
    );
    let output = project.run(&["run", "--plan", plan.to_str().expect("utf-8")]);
    assert_eq!(output.status.code(), Some(3), "{}", describe(&output));
    assert_eq!(state(project), "FailedRollbackPartial");
    fs::remove_file(project.path("ws/block")).expect("unlocks");
}

#[test]
fn dlq_retry_killed_at_random_moments_then_retried_settles_every_letter() {
    let rounds = rounds();
    let seed = crate::seed_from_env("AGENT_KERNEL_KILL_SEED");
    eprintln!(
        "dlq retry kills: seed {seed} (AGENT_KERNEL_KILL_SEED={seed} reproduces), {rounds} kills"
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let span = calibrate(|| {
        let project = project_with_notes();
        failed_saga(&project);
        let (_, id) = open_letters(&project).remove(0);
        (project, ["dlq", "retry", &id].map(str::to_owned).to_vec())
    });
    let rolled_back = Files::from([("notes.txt".to_owned(), Vec::new())]);
    for round in 0..rounds {
        let project = project_with_notes();
        failed_saga(&project);
        let (_, id) = open_letters(&project).remove(0);
        kill_after(
            spawn(&project, &["dlq", "retry", &id]),
            delay(&mut rng, span),
        );
        // What a killed retry left in flight, `recover` settles first; each letter still
        // open is then retried by hand, as an operator would.
        let output = project.run(&["recover"]);
        assert!(
            matches!(output.status.code(), Some(0 | 3)),
            "round {round}: {}",
            describe(&output)
        );
        for (_, id) in open_letters(&project) {
            let output = project.run(&["dlq", "retry", &id]);
            assert_eq!(
                output.status.code(),
                Some(0),
                "round {round}: {}",
                describe(&output)
            );
        }
        assert_eq!(open_letters(&project), Vec::new(), "round {round}");
        assert_eq!(state(&project), "FailedRolledBack", "round {round}");
        assert_eq!(project.snapshot(), rolled_back, "round {round}");
        verifies(&project, round);
    }
}

/// The fields of `/proc/PID/stat` after the command's name (`state ppid …`), which may
/// itself hold spaces and parentheses.
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

/// Whether `pid` is a live (not zombie) child of `parent` running `agent-kernel … mcp`.
fn is_server_of(pid: u32, parent: u32) -> bool {
    let child = stat_fields(pid).is_some_and(|fields| {
        fields
            .first()
            .is_some_and(|state| state != "Z" && state != "X")
            && fields.get(1).and_then(|ppid| ppid.parse::<u32>().ok()) == Some(parent)
    });
    child
        && fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|line| line.split(|byte| *byte == 0).any(|arg| arg == b"mcp"))
}

/// The upstream servers `parent` runs, from `/proc`.
fn servers_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| is_server_of(*pid, parent))
        .collect()
}

/// The start time of process `pid` (`/proc/PID/stat` field 22), which tells it from a later
/// process given the same pid.
fn start_time(pid: u32) -> Option<String> {
    let fields = stat_fields(pid)?;
    (fields.first()? != "Z").then(|| fields.get(19).cloned())?
}

/// Waits until the upstream servers of `parent` noted before it was killed (`servers`, each
/// with its start time) have exited: an orphan still in a call could hold what the next
/// command needs.
fn wait_for_servers_to_exit(servers: &[(u32, Option<String>)]) {
    crate::wait_until("the killed process's upstream servers exit", || {
        servers
            .iter()
            .all(|(pid, started)| start_time(*pid).is_none() || start_time(*pid) != *started)
    });
}

/// The upstream servers of `parent` with their start times.
fn servers_with_start_times(parent: u32) -> Vec<(u32, Option<String>)> {
    servers_of(parent)
        .into_iter()
        .map(|pid| (pid, start_time(pid)))
        .collect()
}

/// SIGKILLs the upstream server `pid` of `parent`, if it still is one, counting the kill
/// as `crate::sigkill` does; whether it was killed. The signal goes through a pidfd opened
/// before the check, so a pid the system gave to another process since is never signalled.
fn sigkill_server(pid: u32, parent: u32) -> bool {
    use rustix::process::{Pid, PidfdFlags, Signal, pidfd_open, pidfd_send_signal};
    let Some(target) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
        return false;
    };
    let Ok(pidfd) = pidfd_open(target, PidfdFlags::empty()) else {
        return false;
    };
    if !is_server_of(pid, parent) || pidfd_send_signal(&pidfd, Signal::KILL).is_err() {
        return false;
    }
    crate::tally_kill();
    true
}

/// The files the upstream kill tests write through the server, under `up/ws`.
const UPSTREAM_FILES: [&str; 5] = ["a.txt", "b.txt", "c.txt", "d.txt", "e.txt"];

/// The number of rounds and the seeded generator of a kill test, the seed printed so that
/// `AGENT_KERNEL_KILL_SEED` replays it.
fn seeded_rounds(what: &str) -> (u32, StdRng) {
    let rounds = rounds();
    let seed = crate::seed_from_env("AGENT_KERNEL_KILL_SEED");
    eprintln!("{what}: seed {seed} (AGENT_KERNEL_KILL_SEED={seed} reproduces), {rounds} rounds");
    (rounds, StdRng::seed_from_u64(seed))
}

/// The upstream server's own log (`up/up.db`) has nothing left to recover after round
/// `round`.
fn upstream_log_settled(project: &Project, round: u32) {
    let output = project
        .isolated(crate::bin())
        .args(["--db", "up/up.db", "--sandbox", "up/sandbox.toml"])
        .args(["--tools", "up/tools.toml", "--json", "recover"])
        .output()
        .expect("runs");
    let (code, report) = crate::json_output(&output);
    assert_eq!(code, 0, "round {round}: the upstream's log: {report}");
    assert_eq!(
        report["sagas"],
        json!([]),
        "round {round}: the upstream's log: {report}"
    );
}

/// The upstream server under a saga of five upstream writes (and, half the time, a last
/// step that fails) SIGKILLed at a random moment: the saga's `run` goes on or rolls back
/// through a server started again, `recover` settles anything left, and the files are all
/// there (`Done`) or none is (`FailedRolledBack`); the server's own log (`mcp --recover`
/// settles its killed calls when it starts again) verifies and has nothing to recover.
#[test]
fn upstream_servers_killed_at_random_moments_leave_the_saga_done_or_rolled_back() {
    use crate::upstream::{project_with_server_options, write};
    let (rounds, mut rng) = seeded_rounds("upstream kills");
    let files = UPSTREAM_FILES;
    let contents = ["alpha", "beta", "gamma", "delta", "epsilon"];
    let plan = |project: &Project, fails: bool| {
        let mut steps: Vec<Value> = files
            .iter()
            .zip(contents)
            .map(|(file, content)| write(&format!("up/ws/{file}"), content))
            .collect();
        if fails {
            steps.push(json!({"tool": "fault.fail", "args": {}}));
        }
        project.plan("plan.json", &json!({ "steps": steps }))
    };
    // From the server's start to the run's end, the shortest of three failing runs (the
    // longer kind: five writes, then five compensations).
    let span = (0..3)
        .map(|_| {
            let project = project_with_server_options(r#", "--recover""#);
            let plan = plan(&project, true);
            let mut run = spawn(&project, &["run", "--plan", plan.to_str().expect("utf-8")]);
            let parent = run.id();
            crate::wait_until("the upstream server started", || {
                !servers_of(parent).is_empty()
            });
            let started = Instant::now();
            run.wait().expect("the run ends");
            started.elapsed()
        })
        .min()
        .expect("three runs");
    let (mut killed, mut done, mut rolled_back, mut not_begun) = (0, 0, 0, 0);
    for round in 0..rounds {
        let project = project_with_server_options(r#", "--recover""#);
        let fails = rng.random_bool(0.5);
        let plan = plan(&project, fails);
        let stderr = fs::File::create(project.path("run.stderr")).expect("creates");
        let mut run = project
            .command(&["run", "--plan", plan.to_str().expect("utf-8")])
            .stdout(std::process::Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawns");
        let parent = run.id();
        let mut server = None;
        crate::wait_until("the upstream server started (or the run ended)", || {
            server = servers_of(parent).first().copied();
            server.is_some() || run.try_wait().is_ok_and(|status| status.is_some())
        });
        if let Some(server) = server {
            let span_us = u64::try_from(span.as_micros()).unwrap_or(u64::MAX);
            std::thread::sleep(Duration::from_micros(rng.random_range(0..=span_us)));
            killed += u32::from(sigkill_server(server, parent));
        }
        let status = run.wait().expect("the run ends");
        let said = fs::read_to_string(project.path("run.stderr")).unwrap_or_default();
        let status = format!("{status}, saying: {said}");
        let output = project.run(&["recover"]);
        assert_eq!(
            output.status.code(),
            Some(0),
            "round {round} (run {status}): {}",
            describe(&output)
        );
        let present: Vec<bool> = files
            .iter()
            .map(|file| project.path(&format!("up/ws/{file}")).exists())
            .collect();
        let Some((_, state)) = project.latest_saga() else {
            // Killed while `run` read its tools, before the saga began: nothing ran.
            not_begun += 1;
            assert_eq!(present, [false; 5], "round {round} (run {status})");
            continue;
        };
        match state.as_str() {
            "Done" => {
                done += 1;
                assert!(!fails, "round {round}: a failing saga ended Done");
                for (file, content) in files.iter().zip(contents) {
                    let found = fs::read_to_string(project.path(&format!("up/ws/{file}")));
                    assert_eq!(
                        found.ok().as_deref(),
                        Some(content),
                        "round {round}: {file}"
                    );
                }
            }
            "FailedRolledBack" => {
                rolled_back += 1;
                assert_eq!(present, [false; 5], "round {round}: rolled back");
            }
            other => {
                let (_, letters) = project.run_json(&["dlq", "list"]);
                let (_, sagas) = project.run_json(&["log", "--limit", "1"]);
                let up = project
                    .isolated(crate::bin())
                    .args(["--db", "up/up.db", "--json", "log"])
                    .output()
                    .expect("runs");
                panic!(
                    "round {round} (run {status}): the saga is {other} after `recover`\n{sagas:#}\n{letters:#}\nupstream: {}",
                    String::from_utf8_lossy(&up.stdout)
                )
            }
        }
        verifies(&project, round);
        upstream_log_settled(&project, round);
    }
    eprintln!(
        "upstream kills: {killed} servers killed while running; {done} sagas done, {rolled_back} rolled back, {not_begun} never begun"
    );
    // Most kills land on a running server (27 to 29 of 30 here): the delays are drawn
    // within the time it runs.
    assert!(
        rounds == 0 || killed > rounds / 2,
        "{killed} of {rounds} rounds killed a running server"
    );
}

/// A saga of five upstream writes whose `run` is SIGKILLed once they are made; then
/// `recover`, which rolls it back through a server it starts, SIGKILLed at a random moment;
/// then `recover` again: the saga ends rolled back with every file gone, both logs verify,
/// and the server's own log (settled by the next server's `mcp --recover`) has nothing left
/// to recover.
#[test]
fn recover_killed_while_it_compensates_upstream_is_finished_by_the_next() {
    use crate::upstream::{project_with_server_options, write};
    let (rounds, mut rng) = seeded_rounds("upstream recover kills");
    let files = UPSTREAM_FILES;
    // A project whose one saga wrote the five files upstream and was killed in its last step.
    let dead_saga = || {
        let project = project_with_server_options(r#", "--recover""#);
        let mut steps: Vec<Value> = files
            .iter()
            .map(|file| write(&format!("up/ws/{file}"), file))
            .collect();
        steps.push(json!({"tool": "noop", "args": {"sleep_ms": 60000}}));
        let plan = project.plan("plan.json", &json!({ "steps": steps }));
        let mut run = spawn(&project, &["run", "--plan", plan.to_str().expect("utf-8")]);
        crate::wait_until("the five upstream writes were made", || {
            files
                .iter()
                .all(|file| project.path(&format!("up/ws/{file}")).exists())
        });
        let servers = servers_with_start_times(run.id());
        crate::sigkill(&mut run).expect("SIGKILLs");
        run.wait().expect("reaped");
        wait_for_servers_to_exit(&servers);
        project
    };
    let span = calibrate(|| (dead_saga(), vec!["recover".to_owned()]));
    let mut killed = 0;
    for round in 0..rounds {
        let project = dead_saga();
        let recover = spawn(&project, &["recover"]);
        let parent = recover.id();
        let pause = delay(&mut rng, span);
        let started = Instant::now();
        let mut servers = Vec::new();
        // Its servers, as late as can be before the kill.
        while started.elapsed() + Duration::from_millis(5) < pause {
            servers = servers_with_start_times(parent);
            std::thread::sleep(Duration::from_millis(2));
        }
        killed += u32::from(kill_after(recover, pause.saturating_sub(started.elapsed())));
        servers.extend(servers_with_start_times(parent));
        wait_for_servers_to_exit(&servers);
        let output = project.run(&["recover"]);
        assert_eq!(
            output.status.code(),
            Some(0),
            "round {round}: {}",
            describe(&output)
        );
        assert_eq!(state(&project), "FailedRolledBack", "round {round}");
        for file in files {
            assert!(
                !project.path(&format!("up/ws/{file}")).exists(),
                "round {round}: {file} is left"
            );
        }
        verifies(&project, round);
        upstream_log_settled(&project, round);
    }
    eprintln!("upstream recover kills: {killed} of {rounds} recovers killed while running");
    // Most kills land on a running `recover` (19 to 25 of 30 here).
    assert!(
        rounds == 0 || killed > rounds / 3,
        "{killed} of {rounds} rounds killed a running recover"
    );
}
