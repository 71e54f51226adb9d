//! The crash test: the real binary, SIGKILLed at random moments, then `recover`.
//!
//! reference §6.1: after a kill and a recovery, every file the saga touched holds its bytes
//! from before the saga, or the saga reached `Done` and every effect is present. Never a mix,
//! and no temporary file of the kernel is left among the user's files.
//!
//! The seed is printed; set `AGENT_KERNEL_CRASH_SEED` to replay a run and
//! `AGENT_KERNEL_CRASH_KILLS` to change the number of kills (default 60).

use std::collections::BTreeMap;
use std::fs;
use std::process::{Child, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use crate::{Project, describe};

/// Kills per run of the test, unless `AGENT_KERNEL_CRASH_KILLS` says otherwise.
const DEFAULT_KILLS: u32 = 60;
/// Full runs timed before the kills; the shortest sets the range of the kill delays.
const CALIBRATION_RUNS: u32 = 3;

pub(crate) type Files = BTreeMap<String, Vec<u8>>;

/// The files before every attempt.
fn initial_files() -> Files {
    Files::from([
        ("existing.txt".to_owned(), b"existing: original\n".to_vec()),
        ("journal.txt".to_owned(), b"journal line 0\n".to_vec()),
        ("doomed.txt".to_owned(), b"doomed but precious\n".to_vec()),
        ("binary.dat".to_owned(), vec![0, 159, 146, 150, 255, 10, 13]),
    ])
}

/// A plan of many mutating steps with short sleeps and validation steps between them, and
/// the model of its effects: the files once the saga is `Done`.
fn plan_and_model() -> (Value, Files) {
    let mut files = initial_files();
    let mut steps = Vec::new();
    let sleep = |steps: &mut Vec<Value>, sleep_ms: u64| {
        steps.push(json!({ "tool": "noop", "args": { "sleep_ms": sleep_ms } }));
    };
    for round in 0..4 {
        let content = format!("existing: round {round}\n");
        steps.push(json!({ "tool": "fs.write", "args": { "path": "ws/existing.txt", "content": content } }));
        files.insert("existing.txt".into(), content.into_bytes());
        sleep(&mut steps, 4);

        // A validation step: the saga moves to Validating (persisted with the step before
        // it), so kills also land while a saga stands in Validating.
        steps.push(json!({ "tool": "validate.file", "args": { "path": "ws/existing.txt", "equals": format!("existing: round {round}\n") } }));

        let line = format!("journal line {}\n", round + 1);
        steps.push(
            json!({ "tool": "fs.append", "args": { "path": "ws/journal.txt", "content": line } }),
        );
        files
            .get_mut("journal.txt")
            .expect("present")
            .extend_from_slice(line.as_bytes());
        sleep(&mut steps, 3);

        let name = format!("new-{round}.txt");
        let content = format!("created in round {round}\n");
        steps.push(json!({ "tool": "fs.write", "args": { "path": format!("ws/{name}"), "content": content } }));
        files.insert(name, content.into_bytes());
        sleep(&mut steps, 3);
    }
    steps.push(json!({ "tool": "fs.delete", "args": { "path": "ws/doomed.txt" } }));
    files.remove("doomed.txt");
    steps.push(
        json!({ "tool": "fs.write", "args": { "path": "ws/binary.dat", "content": "now text" } }),
    );
    files.insert("binary.dat".into(), b"now text".to_vec());
    (json!({ "name": "crash test", "steps": steps }), files)
}

fn reset(project: &Project) {
    reset_to(project, initial_files());
}

/// Empties `ws/` and puts `files` in it.
pub(crate) fn reset_to(project: &Project, files: Files) {
    let ws = project.path("ws");
    fs::remove_dir_all(&ws).expect("removes ws");
    fs::create_dir(&ws).expect("creates ws");
    for (name, bytes) in files {
        fs::write(ws.join(name), bytes).expect("writes");
    }
}

/// The binary with `args` on the project's log, its output dropped.
pub(crate) fn spawn(project: &Project, args: &[&str]) -> Child {
    project
        .command(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawns")
}

/// Kills `child` with SIGKILL after `delay` (unless it already exited); returns whether it
/// was still running when killed.
pub(crate) fn kill_after(mut child: Child, delay: Duration) -> bool {
    thread::sleep(delay);
    let running = child.try_wait().expect("polls").is_none();
    // `Child::kill` sends SIGKILL on Unix.
    let _ = crate::sigkill(&mut child);
    let _ = child.wait();
    running
}

fn seed() -> u64 {
    crate::seed_from_env("AGENT_KERNEL_CRASH_SEED")
}

#[test]
fn sigkill_at_random_moments_then_recover_restores_before_or_done() {
    let n_kills: u32 = std::env::var("AGENT_KERNEL_CRASH_KILLS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(DEFAULT_KILLS);
    let seed = seed();
    eprintln!(
        "crash test: seed {seed} (AGENT_KERNEL_CRASH_SEED={seed} reproduces), {n_kills} kills"
    );
    let mut rng = StdRng::seed_from_u64(seed);

    let project = Project::new();
    let (plan, done_files) = plan_and_model();
    let plan_path = project.plan("plan.json", &plan);
    let plan_arg = plan_path.to_str().expect("utf8").to_owned();
    let before_files = initial_files();

    // Calibrate: how long a saga takes on this machine, the shortest of a few runs, since
    // the other tests running beside this one make any single run's time noisy (one slow
    // run would put most kills after the saga's end).
    let mut full_run = Duration::MAX;
    for _ in 0..CALIBRATION_RUNS {
        reset(&project);
        let started = Instant::now();
        let output = project.run(&["run", "--plan", &plan_arg]);
        full_run = full_run.min(started.elapsed());
        assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
        assert_eq!(
            project.snapshot(),
            done_files,
            "the model matches a full run"
        );
    }

    let mut previous_saga = project.latest_saga().map(|(saga_id, _)| saga_id);
    let (mut n_killed_running, mut n_done, mut n_rolled_back, mut n_recover_kills) = (0, 0, 0, 0);
    let mut n_in_validating = 0;
    for attempt in 0..n_kills {
        reset(&project);
        let durability = if attempt % 2 == 0 { "full" } else { "normal" };
        let child = spawn(
            &project,
            &["run", "--plan", &plan_arg, "--durability", durability],
        );
        let delay =
            Duration::from_micros(rng.random_range(0..=full_run.as_micros() as u64 * 11 / 10));
        if kill_after(child, delay) {
            n_killed_running += 1;
            // Recovery resumes from the state the log holds; count the kills that left a
            // saga standing in Validating, to show that path is exercised.
            if let Some((saga_id, state)) = project.latest_saga()
                && Some(&saga_id) != previous_saga.as_ref()
                && state == "Validating"
            {
                n_in_validating += 1;
            }
        }
        // Every third attempt, also kill a recovery midway; the next one must finish the job.
        if attempt % 3 == 0 {
            let recover = spawn(&project, &["recover"]);
            let delay = Duration::from_micros(rng.random_range(0..=30_000));
            if kill_after(recover, delay) {
                n_recover_kills += 1;
            }
        }
        let output = project.run(&["recover"]);
        assert_eq!(
            output.status.code(),
            Some(0),
            "seed {seed} attempt {attempt}: {}",
            describe(&output)
        );
        // A run killed before it created its saga leaves the previous attempt's saga latest.
        let state = match project.latest_saga() {
            Some((saga_id, state)) if Some(&saga_id) != previous_saga.as_ref() => {
                previous_saga = Some(saga_id);
                Some(state)
            }
            _ => None,
        };
        let files = project.snapshot();
        match state.as_deref() {
            Some("Done") => {
                n_done += 1;
                assert_eq!(
                    files, done_files,
                    "seed {seed} attempt {attempt}: Done but not every effect present"
                );
            }
            Some("FailedRolledBack") | None => {
                n_rolled_back += 1;
                assert_eq!(
                    files, before_files,
                    "seed {seed} attempt {attempt} (delay {delay:?}): not restored to before the saga"
                );
            }
            Some(other) => panic!("seed {seed} attempt {attempt}: saga left in {other}"),
        }
    }
    eprintln!(
        "crash test: {n_kills} attempts, {n_killed_running} killed mid-run ({n_in_validating} in Validating), {n_recover_kills} recoveries killed, {n_done} Done, {n_rolled_back} restored"
    );
    assert!(
        n_in_validating > 0,
        "some kills must leave a saga in Validating"
    );
    assert!(
        n_killed_running >= n_kills / 2,
        "most kills must land while the saga runs ({n_killed_running} of {n_kills})"
    );
    assert!(n_rolled_back > 0, "some attempts must need a rollback");
}

#[test]
fn recover_leaves_a_live_processs_saga_alone() {
    let project = Project::new();
    let plan = project.plan(
        "slow.json",
        &json!({ "steps": [
            { "tool": "fs.write", "args": { "path": "ws/slow.txt", "content": "slow" } },
            { "tool": "noop", "args": { "sleep_ms": 2500 } },
            { "tool": "fs.write", "args": { "path": "ws/slow-2.txt", "content": "done" } },
        ]}),
    );
    let runner = project
        .command(&["--json", "run", "--plan", plan.to_str().expect("utf8")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawns");
    // Wait until the first write is visible, so the saga is surely in the log.
    crate::wait_until("the slow saga never started", || {
        project.path("ws/slow.txt").exists()
    });
    let (code, report) = project.run_json(&["recover"]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["sagas"][0]["action"], "skipped_live", "{report}");
    assert_eq!(
        fs::read(project.path("ws/slow.txt")).expect("reads"),
        b"slow"
    );

    let output = runner.wait_with_output().expect("finishes");
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let document: Value = serde_json::from_slice(&output.stdout).expect("json");
    assert_eq!(document["state"], "Done");
    assert_eq!(
        fs::read(project.path("ws/slow-2.txt")).expect("reads"),
        b"done"
    );
}

#[test]
fn several_processes_share_one_log() {
    let project = Project::new();
    let n_processes = 6;
    let children: Vec<_> = (0..n_processes)
        .map(|idx| {
            let steps: Vec<Value> = (0..8)
                .map(|step| {
                    json!({ "tool": "fs.append", "args": {
                        "path": format!("ws/proc-{idx}.txt"),
                        "content": format!("{step}\n"),
                    }})
                })
                .collect();
            let plan = project.plan(&format!("p{idx}.json"), &json!({ "steps": steps }));
            project
                .command(&["run", "--plan", plan.to_str().expect("utf8")])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawns")
        })
        .collect();
    for child in children {
        let output = child.wait_with_output().expect("finishes");
        assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    }
    let expected: String = (0..8).map(|step| format!("{step}\n")).collect();
    for idx in 0..n_processes {
        assert_eq!(
            fs::read_to_string(project.path(&format!("ws/proc-{idx}.txt"))).expect("reads"),
            expected
        );
    }
    let (_, listed) = project.run_json(&["log"]);
    let sagas = listed["sagas"].as_array().expect("sagas");
    assert_eq!(sagas.len(), n_processes);
    assert!(sagas.iter().all(|saga| saga["state"] == "Done"));
}

/// Runs `[fs.write ws/a.txt, <drill> ws/b.txt]` where the drill pauses before or after its
/// effect, SIGKILLs the process once the pause has surely begun, and recovers.
/// Returns the recover exit code, its report, and the files afterwards.
fn kill_during_drill(drill: &str, pause: &str) -> (i32, Value, BTreeMap<String, Vec<u8>>) {
    let project = Project::new();
    fs::write(project.path("ws/a.txt"), b"a before").expect("writes");
    fs::write(project.path("ws/b.txt"), b"b before").expect("writes");
    let plan = project.plan(
        "plan.json",
        &json!({ "steps": [
            { "tool": "fs.write", "args": { "path": "ws/a.txt", "content": "a after" } },
            { "tool": drill, "args": { "path": "ws/b.txt", "content": "b after", pause: 60_000 } },
        ]}),
    );
    let child = spawn(&project, &["run", "--plan", plan.to_str().expect("utf8")]);
    // Step 0 has run once a.txt changed; give step 1 time to begin and reach its pause.
    crate::wait_until("the saga never started", || {
        fs::read(project.path("ws/a.txt")).expect("reads") == b"a after"
    });
    if pause == "pause_after_ms" {
        crate::wait_until("the drill never wrote", || {
            fs::read(project.path("ws/b.txt")).expect("reads") == b"b after"
        });
    }
    thread::sleep(Duration::from_millis(300));
    assert!(
        kill_after(child, Duration::ZERO),
        "killed while the drill paused"
    );
    let (code, report) = project.run_json(&["recover"]);
    (code, report, project.snapshot())
}

fn files(a: &str, b: &str) -> BTreeMap<String, Vec<u8>> {
    BTreeMap::from([
        ("a.txt".to_owned(), a.as_bytes().to_vec()),
        ("b.txt".to_owned(), b.as_bytes().to_vec()),
    ])
}

/// Reference-level settlement after a real SIGKILL, for the `probe` and `operator` classes
/// (the drill tools `fault.probed_write` and `fault.opaque_write`).
#[test]
fn sigkill_settles_each_unknown_outcome_by_its_class() {
    // The `compensate` class is the file tools', killed 60 times above. Here the other two.
    // Probe class, killed before its effect: the probe finds nothing happened.
    let (code, report, after) = kill_during_drill("fault.probed_write", "pause_before_ms");
    assert_eq!(code, 0, "{report}");
    let saga = &report["sagas"][0];
    assert_eq!(saga["state"], "FailedRolledBack", "{report}");
    assert!(
        saga["steps"][1]["compensation"]
            .as_str()
            .expect("note")
            .contains("did not happen"),
        "{report}"
    );
    assert_eq!(after, files("a before", "b before"));

    // Probe class, killed after its effect: the probe finds it and it is compensated.
    let (code, report, after) = kill_during_drill("fault.probed_write", "pause_after_ms");
    assert_eq!(code, 0, "{report}");
    let saga = &report["sagas"][0];
    assert_eq!(saga["state"], "FailedRolledBack", "{report}");
    assert!(
        saga["steps"][1]["compensation"]
            .as_str()
            .expect("note")
            .contains("effect happened"),
        "{report}"
    );
    assert_eq!(after, files("a before", "b before"));

    // Operator class, killed after its effect: never assumed undone; exit 3.
    let (code, report, after) = kill_during_drill("fault.opaque_write", "pause_after_ms");
    assert_eq!(code, 3, "{report}");
    let saga = &report["sagas"][0];
    assert_eq!(saga["state"], "FailedRollbackPartial", "{report}");
    assert_eq!(saga["steps"][1]["status"], "COMPENSATION_FAILED");
    assert_eq!(saga["steps"][0]["status"], "COMPENSATED");
    assert_eq!(
        after,
        files("a before", "b after"),
        "the unknown write is left for an operator"
    );
}
