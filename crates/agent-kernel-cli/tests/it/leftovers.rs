//! No effect after its undoing: a command tool's program, and everything it starts (a
//! daemon that left the process group with `setsid` included), never acts after the kernel
//! decided about its run, nor after `recover` settled the step of a killed kernel.
//!
//! The seed is printed; `AGENT_KERNEL_COMMAND_KILL_SEED` replays a run and
//! `AGENT_KERNEL_COMMAND_KILLS` sets the number of kills (default 100).

use std::fs;
use std::thread;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::crash::{kill_after, spawn};
use crate::{Project, describe};

/// Kills of the loop, unless `AGENT_KERNEL_COMMAND_KILLS` says otherwise.
const DEFAULT_KILLS: u32 = 100;

/// The program behind `ledger.*`: `slow S` appends `entry` to `ws/ledger.txt` after S
/// seconds; `daemon S W` starts, in a session of its own, a process that writes
/// `ws/late.txt` after S seconds (a file no compensation touches, so nothing can hide that
/// it acted), then waits W seconds; `compensate` removes every `entry` line. (The daemon's
/// output goes to a file of `ws/`: under the second line a program may not open
/// `/dev/null` for writing.)
const LEDGER_SH: &str = r#"
cat > /dev/null
case "$1" in
  slow) sleep "$2"; echo entry >> ws/ledger.txt ;;
  daemon)
    setsid sh -c "sleep $2; echo late > ws/late.txt" < ledger.sh > ws/daemon.out 2>&1 &
    sleep "$3" ;;
  compensate)
    if [ -f ws/ledger.txt ]; then
      grep -v '^entry$' ws/ledger.txt > ws/ledger.tmp || true
      mv ws/ledger.tmp ws/ledger.txt
    fi ;;
esac
"#;

const TOOLS_TOML: &str = r#"
[tools."ledger.slow"]
effect = "mutating"
settlement = "compensate"
execute = ["/bin/sh", "ledger.sh", "slow", "0.15"]
compensate = ["/bin/sh", "ledger.sh", "compensate"]

[tools."ledger.daemon"]
effect = "mutating"
settlement = "compensate"
execute = ["/bin/sh", "ledger.sh", "daemon", "3", "10"]
compensate = ["/bin/sh", "ledger.sh", "compensate"]

[tools."ledger.quick_daemon"]
effect = "mutating"
settlement = "compensate"
execute = ["/bin/sh", "ledger.sh", "daemon", "0.8", "0.3"]
compensate = ["/bin/sh", "ledger.sh", "compensate"]

[tools."ledger.timed_out"]
effect = "mutating"
settlement = "compensate"
timeout_ms = 300
execute = ["/bin/sh", "ledger.sh", "daemon", "1", "10"]
compensate = ["/bin/sh", "ledger.sh", "compensate"]
"#;

fn project() -> Project {
    let project = Project::new();
    fs::write(project.path("ledger.sh"), LEDGER_SH).expect("writes");
    fs::write(project.path("tools.toml"), TOOLS_TOML).expect("writes");
    project
}

fn ledger(project: &Project) -> String {
    fs::read_to_string(project.path("ws/ledger.txt")).unwrap_or_default()
}

fn plan_of(project: &Project, tool: &str) -> String {
    let plan = project.plan(
        &format!("{tool}.json"),
        &json!({ "steps": [ { "tool": tool, "args": {} } ] }),
    );
    plan.to_str().expect("utf8").to_owned()
}

#[test]
fn a_command_tool_killed_mid_execute_never_acts_after_recover() {
    let n_kills: u32 = std::env::var("AGENT_KERNEL_COMMAND_KILLS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(DEFAULT_KILLS);
    let seed = crate::seed_from_env("AGENT_KERNEL_COMMAND_KILL_SEED");
    eprintln!(
        "command kills: seed {seed} (AGENT_KERNEL_COMMAND_KILL_SEED={seed} reproduces), {n_kills} kills"
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let project = project();
    let plan = plan_of(&project, "ledger.slow");
    let started = Instant::now();
    let output = project.run(&["run", "--plan", &plan]);
    let full_run = started.elapsed();
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    assert_eq!(ledger(&project), "entry\n");

    let mut previous = project.latest_saga().map(|(saga_id, _)| saga_id);
    let (mut n_done, mut n_rolled_back, mut n_in_flight) = (0, 0, 0);
    for kill in 0..n_kills {
        fs::write(project.path("ws/ledger.txt"), "").expect("writes");
        let delay =
            Duration::from_micros(rng.random_range(0..=full_run.as_micros() as u64 * 11 / 10));
        kill_after(spawn(&project, &["run", "--plan", &plan]), delay);
        let output = project.run(&["recover"]);
        assert_eq!(
            output.status.code(),
            Some(0),
            "seed {seed} kill {kill}: {}",
            describe(&output)
        );
        // Past the tool's own delay from any moment of the run: a program left running
        // would have acted by now.
        thread::sleep(Duration::from_millis(250));
        let state = match project.latest_saga() {
            Some((saga_id, state)) if Some(&saga_id) != previous.as_ref() => {
                previous = Some(saga_id);
                Some(state)
            }
            _ => None,
        };
        match state.as_deref() {
            Some("Done") => {
                n_done += 1;
                assert_eq!(ledger(&project), "entry\n", "seed {seed} kill {kill}");
            }
            Some("FailedRolledBack") | None => {
                n_rolled_back += 1;
                if state.is_some() {
                    n_in_flight += 1;
                }
                assert_eq!(
                    ledger(&project),
                    "",
                    "seed {seed} kill {kill} (after {delay:?}): an effect landed after its rollback"
                );
            }
            Some(other) => panic!("seed {seed} kill {kill}: left {other}"),
        }
    }
    eprintln!(
        "command kills: {n_kills} kills, {n_done} Done, {n_rolled_back} rolled back ({n_in_flight} with the step begun)"
    );
    assert!(n_in_flight > 0, "some kills must land while the step runs");
}

#[test]
fn a_setsid_daemon_of_a_killed_run_never_acts_after_recover() {
    let project = project();
    fs::write(project.path("ws/ledger.txt"), "").expect("writes");
    let plan = plan_of(&project, "ledger.daemon");
    let child = spawn(&project, &["run", "--plan", &plan]);
    crate::wait_until("the saga never began", || {
        project
            .latest_saga()
            .is_some_and(|(_, state)| state == "Acting")
    });
    // The program has started its daemon by now (it does so first, then waits).
    thread::sleep(Duration::from_millis(300));
    kill_after(child, Duration::ZERO);
    let started = Instant::now();
    let (code, report) = project.run_json(&["recover"]);
    assert_eq!(code, 0, "{report}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "recover took too long for the daemon's delay to mean anything"
    );
    // The daemon acts 3 s after it started: well past that.
    thread::sleep(Duration::from_millis(3_500));
    assert!(
        !project.path("ws/late.txt").exists(),
        "the daemon acted after the rollback"
    );
}

#[test]
fn a_setsid_daemon_never_outlives_its_runs_decision() {
    let project = project();
    fs::write(project.path("ws/ledger.txt"), "").expect("writes");
    let plan = plan_of(&project, "ledger.quick_daemon");
    let output = project.run(&["run", "--plan", &plan]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    // The daemon (detached while the program waits 0.3 s) acts 0.8 s after it started.
    thread::sleep(Duration::from_millis(1_200));
    assert!(
        !project.path("ws/late.txt").exists(),
        "a process the run started acted after the run was decided"
    );
}

#[test]
fn a_setsid_daemon_of_a_timed_out_run_never_acts_after_its_compensation() {
    // The step times out (300 ms) while its program waits; the daemon it started acts 1 s
    // after it started. The outcome is unknown, so the step is compensated: not before
    // what the timed-out run left is stopped.
    let project = project();
    fs::write(project.path("ws/ledger.txt"), "").expect("writes");
    let plan = plan_of(&project, "ledger.timed_out");
    let output = project.run(&["run", "--plan", &plan]);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    thread::sleep(Duration::from_millis(1_500));
    assert!(
        !project.path("ws/late.txt").exists(),
        "the timed-out run's daemon acted after its compensation"
    );
}
