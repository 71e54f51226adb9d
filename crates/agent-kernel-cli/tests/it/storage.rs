//! A real storage fault: the log stops being able to grow in the middle of a saga.
//!
//! The binary runs under `prlimit --fsize` (util-linux) with `SIGXFSZ` ignored, so a write
//! past the limit fails with `EFBIG`, as a full disk fails with `ENOSPC`: SQLite reports an
//! I/O error on the log write that would have crossed it, partway through the saga.

use std::fs;

use serde_json::json;

use crate::{Project, bin, describe};

/// The largest file the limited process may write: the log's WAL crosses it after a few
/// steps of the plan below, the workspace file never does.
const FILE_SIZE_LIMIT: u64 = 1_500_000;

#[test]
fn a_log_that_cannot_grow_stops_the_saga_and_recover_restores_the_files() {
    let project = Project::new();
    fs::write(project.path("ws/a.txt"), b"original").expect("writes");
    let before = project.snapshot();
    // Each step logs 50 kB of arguments and 50 kB of undo bytes.
    let steps: Vec<_> = (0..30_u8)
        .map(|n| {
            let content = char::from(b'a' + n % 26).to_string().repeat(50_000);
            json!({ "tool": "fs.write", "args": { "path": "ws/a.txt", "content": content } })
        })
        .collect();
    let plan = project.plan("big.json", &json!({ "steps": steps }));

    // `exec` keeps the ignored SIGXFSZ; prlimit sets the limit for the binary alone.
    let script = format!("trap '' XFSZ; exec prlimit --fsize={FILE_SIZE_LIMIT} -- \"$0\" \"$@\"");
    let output = project
        .isolated("sh")
        .arg("-c")
        .arg(script)
        .arg(bin())
        .arg("--db")
        .arg(project.db())
        .args(["--json", "run", "--plan"])
        .arg(&plan)
        .output()
        .expect("sh and prlimit run");
    assert_eq!(output.status.code(), Some(3), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("stopped because the log failed")
            && stderr.contains("agent-kernel recover"),
        "{}",
        describe(&output)
    );
    let document: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("one JSON document");
    assert_eq!(document["error"]["kind"], "internal", "{document}");

    // The saga is in the log, unfinished, with the steps it began; some of them ran.
    let (code, listed) = project.run_json(&["log"]);
    assert_eq!(code, 0, "{listed}");
    let saga_id = listed["sagas"][0]["saga_id"]
        .as_str()
        .expect("an id")
        .to_owned();
    assert_eq!(listed["sagas"][0]["state"], "Acting", "{listed}");
    let (_, record) = project.run_json(&["log", "--saga", &saga_id]);
    let n_steps = record["steps"].as_array().expect("steps").len();
    assert!(
        (2..30).contains(&n_steps),
        "the limit should stop the saga partway: {n_steps} steps logged"
    );
    assert_ne!(project.snapshot(), before, "the first steps ran");

    // Without the limit, recover puts the file back, and the log verifies.
    let (code, recovered) = project.run_json(&["recover"]);
    assert_eq!(code, 0, "{recovered}");
    assert_eq!(
        recovered["sagas"][0]["action"], "rolled_back",
        "{recovered}"
    );
    assert_eq!(
        recovered["sagas"][0]["state"], "FailedRolledBack",
        "{recovered}"
    );
    assert_eq!(project.snapshot(), before, "every file back to its bytes");
    let output = project.run(&["audit", "verify"]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
}
