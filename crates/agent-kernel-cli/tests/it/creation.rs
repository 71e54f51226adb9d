//! The first creation of a log, by the real binary: killed at any instant it leaves no log
//! or a whole one; racing first runs share one log; links lead to the real file; a log that
//! cannot be read or written is refused with the exit code that says so.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::{Project, describe};

/// How many first runs the kill loop kills, unless `AGENT_KERNEL_CREATE_KILLS` says.
const FIRST_RUN_KILLS: usize = 120;

/// The kill comes within this long of the process's start.
const FIRST_RUN_KILL_WITHIN_MS: u64 = 50;

fn noop_plan(project: &Project) -> std::path::PathBuf {
    project.plan(
        "noop.json",
        &json!({ "steps": [{ "tool": "noop", "args": {} }] }),
    )
}

/// Every name in the project folder that the log's creation could have left, sorted.
fn log_files(project: &Project, db_name: &str) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(project.dir.path())
        .expect("lists")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.contains(db_name))
        .collect();
    names.sort();
    names
}

#[test]
fn a_first_run_killed_at_any_instant_leaves_no_log_or_a_whole_one() {
    let seed = crate::seed_from_env("AGENT_KERNEL_CREATE_SEED");
    println!("seed {seed} (AGENT_KERNEL_CREATE_SEED replays it)");
    let n_kills: usize = std::env::var("AGENT_KERNEL_CREATE_KILLS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(FIRST_RUN_KILLS);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let project = Project::new();
    let plan = noop_plan(&project);
    let (mut absent, mut present) = (0, 0);
    for kill_idx in 0..n_kills {
        let db_name = format!("first-{kill_idx}.db");
        let db = project.path(&db_name);
        let mut child = project
            .isolated(crate::bin())
            .arg("--db")
            .arg(&db)
            .args(["-q", "run", "--plan", plan.to_str().expect("utf8")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawns");
        std::thread::sleep(Duration::from_micros(
            rng.random_range(0..FIRST_RUN_KILL_WITHIN_MS * 1000),
        ));
        crate::sigkill(&mut child).expect("SIGKILLs");
        child.wait().expect("reaps");
        if !db.exists() {
            absent += 1;
            // Nothing of a log, not even a temporary file of its creation.
            let left = log_files(&project, &db_name);
            assert!(left.is_empty(), "kill {kill_idx}: {left:?}");
            continue;
        }
        present += 1;
        for args in [vec!["recover"], vec!["audit", "verify"]] {
            let output = project
                .isolated(crate::bin())
                .arg("--db")
                .arg(&db)
                .args(&args)
                .output()
                .expect("runs");
            assert_eq!(
                output.status.code(),
                Some(0),
                "kill {kill_idx} (seed {seed}), {args:?}: {}",
                describe(&output)
            );
        }
        let left = log_files(&project, &db_name);
        assert!(
            left.iter().all(|name| name == &db_name
                || name.ends_with("-wal")
                || name.ends_with("-shm")
                || name.ends_with(".audit-head")),
            "kill {kill_idx}: {left:?}"
        );
    }
    println!("{absent} kills left no log, {present} a whole one");
}

#[test]
fn eight_first_runs_racing_on_one_new_log_all_succeed() {
    const N_RACERS: usize = 8;
    for round in 0..5 {
        let project = Project::new();
        let plan = noop_plan(&project);
        let db = project.path(&format!("race-{round}.db"));
        let children: Vec<_> = (0..N_RACERS)
            .map(|_| {
                project
                    .isolated(crate::bin())
                    .arg("--db")
                    .arg(&db)
                    .args(["-q", "run", "--plan", plan.to_str().expect("utf8")])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("spawns")
            })
            .collect();
        for child in children {
            let output = child.wait_with_output().expect("waits");
            assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
        }
        let output = project
            .isolated(crate::bin())
            .arg("--db")
            .arg(&db)
            .args(["--json", "log"])
            .output()
            .expect("runs");
        let (code, listed) = crate::json_output(&output);
        assert_eq!(code, 0, "{listed}");
        assert_eq!(
            listed["sagas"].as_array().expect("sagas").len(),
            N_RACERS,
            "every racer's saga is in the one log"
        );
    }
}

#[test]
fn a_log_created_through_a_dangling_link_is_private_beside_the_real_file() {
    let project = Project::new();
    fs::create_dir(project.path("data")).expect("creates");
    let link = project.path("log-link.db");
    std::os::unix::fs::symlink("data/real.db", &link).expect("links");
    let plan = noop_plan(&project);
    let output = project
        .isolated(crate::bin())
        .arg("--db")
        .arg(&link)
        .args(["run", "--plan", plan.to_str().expect("utf8")])
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    // The journal files exist only while a connection is open (SQLite removes them at the
    // last close): checked where they are; the txlog tests check them on an open log.
    for name in [
        "real.db",
        "real.db-wal",
        "real.db-shm",
        "real.db.audit-head",
    ] {
        match fs::metadata(project.path("data").join(name)) {
            Ok(metadata) => {
                let mode = metadata.permissions().mode();
                assert_eq!(mode & 0o077, 0, "{name} is readable by others: {mode:o}");
            }
            Err(err) => assert!(
                name.ends_with("-wal") || name.ends_with("-shm"),
                "{name}: {err}"
            ),
        }
    }
    assert!(
        !project.path("log-link.db.audit-head").exists(),
        "the head file sits beside the database, not the link"
    );
    let output = project
        .isolated(crate::bin())
        .arg("--db")
        .arg(&link)
        .args(["audit", "verify"])
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
}

/// A log with one finished saga.
fn finished_log(project: &Project) {
    let plan = noop_plan(project);
    let output = project.run(&["-q", "run", "--plan", plan.to_str().expect("utf8")]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
}

#[test]
fn a_truncated_log_needs_an_operator() {
    let project = Project::new();
    finished_log(&project);
    // Everything into the database file, then cut below its first page.
    let conn = rusqlite::Connection::open(project.db()).expect("opens");
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")
        .expect("checkpoints");
    drop(conn);
    let bytes = fs::read(project.db()).expect("reads");
    fs::write(project.db(), &bytes[..3000]).expect("truncates");
    let plan = noop_plan(&project);
    for args in [
        vec!["recover"],
        vec!["run", "--plan", plan.to_str().expect("utf8")],
        vec!["log"],
    ] {
        let (code, document) = project.run_json(&args);
        assert_eq!(code, 3, "{args:?}: {document}");
        assert!(
            document["error"]["message"]
                .as_str()
                .expect("a message")
                .contains("damaged"),
            "{document}"
        );
    }
    assert_eq!(fs::read(project.db()).expect("reads"), &bytes[..3000]);
}

#[test]
fn a_run_on_a_log_it_cannot_write_fails_before_any_saga() {
    let project = Project::new();
    finished_log(&project);
    let plan = noop_plan(&project);
    let mut command: Command;
    if running_as_root() {
        // Root writes through any mode: run as an unprivileged user, who may read the log
        // (and its folder) but not write it.
        for path in [project.dir.path().to_owned(), project.path("ws")] {
            fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        for name in [
            "log.db",
            "log.db-wal",
            "log.db-shm",
            "log.db.audit-head",
            "noop.json",
        ] {
            let path = project.path(name);
            if path.exists() {
                fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).expect("chmod");
            }
        }
        command = project.isolated("setpriv");
        command.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"]);
        command.arg(crate::bin());
    } else {
        fs::set_permissions(project.db(), fs::Permissions::from_mode(0o444)).expect("chmod");
        command = project.isolated(crate::bin());
    }
    let output = command
        .arg("--db")
        .arg(project.db())
        .args(["--json", "run", "--plan", plan.to_str().expect("utf8")])
        .output()
        .expect("runs");
    let (code, document) = crate::json_output(&output);
    assert_eq!(code, 3, "{document}");
    let message = document["error"]["message"].as_str().expect("a message");
    assert!(
        !message.contains("saga"),
        "no saga is named, since none began: {message}"
    );
    assert!(
        message.contains("cannot be written") || message.contains("readonly"),
        "{message}"
    );
    let (code, listed) = project.run_json(&["log"]);
    assert_eq!(code, 0, "{listed}");
    assert_eq!(listed["sagas"].as_array().expect("sagas").len(), 1);
}

fn running_as_root() -> bool {
    // The effective uid, without unsafe code: /proc says it.
    fs::read_to_string("/proc/self/status")
        .expect("reads /proc")
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|uids| uids.split_whitespace().nth(1).map(|uid| uid == "0"))
        .unwrap_or(false)
}
