//! An attacker who can write the log file: whatever it plants there (a trigger, an undo
//! record pointing outside the roots, a consistently rewritten chain), no byte outside the
//! policy's roots changes.

use std::fs;
use std::path::{Path, PathBuf};

use rusqlite::params;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::{Project, describe};

/// A project whose `victim/` folder lies outside the policy's root `ws/`.
struct World {
    project: Project,
    saga_id: String,
}

impl World {
    /// Runs a saga that creates `ws/new.txt`, rewrites `ws/old.txt` and then sleeps, and
    /// SIGKILLs it once both writes are visible: the saga is left unfinished for `recover`.
    fn unfinished(key: Option<&str>) -> World {
        let project = Project::new();
        fs::create_dir(project.path("victim")).expect("creates victim");
        fs::write(project.path("victim/keep.txt"), "precious").expect("writes");
        fs::write(project.path("ws/old.txt"), "orig").expect("writes");
        let plan = project.plan(
            "slow.json",
            &json!({ "steps": [
                { "tool": "fs.write", "args": { "path": "ws/new.txt", "content": "created" } },
                { "tool": "fs.write", "args": { "path": "ws/old.txt", "content": "new" } },
                { "tool": "noop", "args": { "sleep_ms": 60000 } },
            ]}),
        );
        let mut command = project.command(&["run", "--plan", plan.to_str().expect("utf8")]);
        if let Some(key) = key {
            command.env("AGENT_KERNEL_AUDIT_KEY", key);
        }
        let mut runner = command
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawns");
        crate::wait_until("the saga never wrote both files", || {
            fs::read(project.path("ws/old.txt")).is_ok_and(|bytes| bytes == b"new")
        });
        crate::sigkill(&mut runner).expect("SIGKILLs");
        runner.wait().expect("reaps");
        let saga_id = project.latest_saga().expect("a saga").0;
        World { project, saga_id }
    }

    fn victim(&self, name: &str) -> PathBuf {
        self.project.path("victim").join(name)
    }

    /// An undo record of `fs.write` that names `victim/NAME` under the root `/`.
    fn forged_undo(&self, name: &str, existed: bool) -> String {
        let absolute = canonical(&self.victim(name));
        json!({
            "existed": existed,
            "target": { "root": "/", "rel": absolute.strip_prefix("/").expect("absolute") },
            "temp": ".agent-kernel-x.tmp",
        })
        .to_string()
    }

    fn db(&self) -> PathBuf {
        self.project.db()
    }

    fn run(&self, key: Option<&str>, args: &[&str]) -> std::process::Output {
        let mut command = self.project.command(args);
        if let Some(key) = key {
            command.env("AGENT_KERNEL_AUDIT_KEY", key);
        }
        command.output().expect("the binary runs")
    }

    /// Nothing outside the roots changed, and (since nothing was undone) the saga's files
    /// are as it left them.
    fn assert_outside_untouched(&self) {
        assert_eq!(
            fs::read(self.victim("keep.txt")).expect("still there"),
            b"precious"
        );
        assert!(!self.victim("planted.txt").exists(), "a file was planted");
        let names: Vec<_> = fs::read_dir(self.project.path("victim"))
            .expect("lists")
            .map(|entry| entry.expect("entry").file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }
}

/// `path` with its folder made canonical (the file itself may not exist).
fn canonical(path: &Path) -> PathBuf {
    let parent = path
        .parent()
        .expect("a folder")
        .canonicalize()
        .expect("exists");
    parent.join(path.file_name().expect("a name"))
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

fn code(output: &std::process::Output) -> i32 {
    output.status.code().expect("exited")
}

fn error_document(output: &std::process::Output) -> Value {
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|err| panic!("one JSON document ({err}): {}", describe(output)))
}

const KEY: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

/// The reproduction of issue 9: a trigger that rewrites the undo records the moment an
/// operator command is recorded, in both its write and its delete variant, with and
/// without an audit key.
#[test]
fn a_trigger_planted_in_the_log_is_refused_and_nothing_outside_the_roots_changes() {
    for key in [None, Some(KEY)] {
        let world = World::unfinished(key);
        let write_variant = world.forged_undo("planted.txt", true);
        let delete_variant = world.forged_undo("keep.txt", false);
        let conn = rusqlite::Connection::open(world.db()).expect("opens");
        conn.execute_batch(&format!(
            "CREATE TRIGGER evil AFTER INSERT ON audit_log WHEN new.kind = 'Operator' BEGIN
                 UPDATE saga_steps SET undo = '{write_variant}',
                     undo_blob = CAST('owned by trigger' AS BLOB) WHERE step_seq = 1;
                 UPDATE saga_steps SET undo = '{delete_variant}' WHERE step_seq = 0;
             END;"
        ))
        .expect("plants the trigger");
        drop(conn);

        let output = world.run(key, &["--json", "audit", "verify"]);
        assert_eq!(code(&output), 1, "{}", describe(&output));
        let report = error_document(&output);
        assert_eq!(report["first_bad"]["seq"], 0, "{report}");
        let reason = report["first_bad"]["reason"].as_str().expect("a reason");
        assert!(reason.contains("trigger `evil`"), "{reason}");

        for args in [
            vec!["--json", "recover"],
            vec!["--json", "rollback", "--saga", world.saga_id.as_str()],
            vec!["--json", "recover", "--skip-verify"],
            vec![
                "--json",
                "rollback",
                "--skip-verify",
                "--saga",
                world.saga_id.as_str(),
            ],
            vec!["--json", "log"],
            vec!["--json", "audit", "list"],
        ] {
            let output = world.run(key, &args);
            assert_eq!(code(&output), 3, "{args:?}: {}", describe(&output));
            let document = error_document(&output);
            assert_eq!(document["error"]["kind"], "tampered", "{document}");
            assert!(
                document["error"]["message"]
                    .as_str()
                    .expect("a message")
                    .contains("trigger `evil`"),
                "{document}"
            );
            world.assert_outside_untouched();
            assert_eq!(
                fs::read(world.project.path("ws/old.txt")).expect("reads"),
                b"new"
            );
        }
        // A run on that log is refused too, before any saga.
        let plan = world.project.plan(
            "one.json",
            &json!({ "steps": [{ "tool": "fs.write", "args": { "path": "ws/x.txt", "content": "x" } }] }),
        );
        let output = world.run(
            key,
            &["--json", "run", "--plan", plan.to_str().expect("utf8")],
        );
        assert_eq!(code(&output), 3, "{}", describe(&output));
        assert!(!world.project.path("ws/x.txt").exists());
        world.assert_outside_untouched();
    }
}

/// Replaces the undo records of steps 0 and 1 of `saga_id` and rewrites the audit chain to
/// match, as someone without an audit key can: the body hashes, every record hash after
/// them. The head file is then made to match by `audit seal`, which anyone may run.
fn forge_consistently(world: &World, forged: &[(u32, String, Option<&[u8]>)]) {
    let conn = rusqlite::Connection::open(world.db()).expect("opens");
    let mut first_seq = i64::MAX;
    for (step_seq, undo, blob) in forged {
        conn.execute(
            "UPDATE saga_steps SET undo = ?3, undo_blob = ?4 WHERE saga_id = ?1 AND step_seq = ?2",
            params![world.saga_id, step_seq, undo, blob],
        )
        .expect("forges the step");
        let seq: i64 = conn
            .query_row(
                "SELECT seq FROM audit_log WHERE kind = 'BeginStep' AND saga_id = ?1
                     AND json_extract(body, '$.step_seq') = ?2",
                params![world.saga_id, step_seq],
                |row| row.get(0),
            )
            .expect("the step's record");
        let blob_hash = blob.map(sha256_hex);
        conn.execute(
            "UPDATE audit_log SET body = CASE WHEN ?3 IS NULL
                 THEN json_set(body, '$.undo_sha256', ?2)
                 ELSE json_set(body, '$.undo_sha256', ?2, '$.undo_blob_sha256', ?3) END
             WHERE seq = ?1",
            params![seq, sha256_hex(undo.as_bytes()), blob_hash],
        )
        .expect("forges the record");
        first_seq = first_seq.min(seq);
    }
    let rows: Vec<(i64, i64, String, Option<String>, String)> = conn
        .prepare(
            "SELECT seq, at_ms, kind, saga_id, body FROM audit_log WHERE seq >= ?1 ORDER BY seq",
        )
        .expect("prepares")
        .query_map(params![first_seq], |row| {
            Ok((
                row.get(0)?,
                row.get(1)?,
                row.get(2)?,
                row.get(3)?,
                row.get(4)?,
            ))
        })
        .expect("reads")
        .collect::<Result<_, _>>()
        .expect("reads");
    let mut prev: String = conn
        .query_row(
            "SELECT hash FROM audit_log WHERE seq = ?1",
            params![first_seq - 1],
            |row| row.get(0),
        )
        .expect("reads");
    for (seq, at_ms, kind, saga, body) in rows {
        let hash = sha256_hex(
            format!(
                "{prev}\n{seq}\n{at_ms}\n{kind}\n{}\n{body}",
                saga.as_deref().unwrap_or("")
            )
            .as_bytes(),
        );
        conn.execute(
            "UPDATE audit_log SET prev_hash = ?2, hash = ?3 WHERE seq = ?1",
            params![seq, prev, hash],
        )
        .expect("rehashes");
        prev = hash;
    }
    drop(conn);
    let output = world.run(None, &["audit", "seal"]);
    assert_eq!(code(&output), 0, "{}", describe(&output));
}

/// The second line of issue 9: no trigger, but undo records pointing outside the roots
/// under a chain rewritten consistently, so that the audit check passes. The sandbox of the
/// policy in force refuses each compensation; nothing outside the roots changes.
#[test]
fn an_undo_record_pointing_outside_the_roots_is_refused_by_the_policy_in_force() {
    let world = World::unfinished(None);
    let write_variant = world.forged_undo("planted.txt", true);
    let delete_variant = world.forged_undo("keep.txt", false);
    forge_consistently(
        &world,
        &[
            (0, delete_variant, None),
            (1, write_variant, Some(b"owned by the log".as_slice())),
        ],
    );
    let output = world.run(None, &["--json", "audit", "verify"]);
    assert_eq!(
        code(&output),
        0,
        "the forgery verifies: {}",
        describe(&output)
    );

    let output = world.run(None, &["--json", "recover"]);
    assert_eq!(code(&output), 3, "{}", describe(&output));
    world.assert_outside_untouched();
    let output = world.run(None, &["--json", "log", "--saga", world.saga_id.as_str()]);
    assert_eq!(code(&output), 0, "{}", describe(&output));
    let saga = error_document(&output);
    assert_eq!(saga["state"], "FailedRollbackPartial", "{saga}");
    for step in [0, 1] {
        let step = &saga["steps"][step];
        assert_eq!(step["status"], "COMPENSATION_FAILED", "{saga}");
        let text = step.to_string();
        assert!(
            text.contains("outside every allowed root") && text.contains("recorded step"),
            "the refusal says why: {text}"
        );
    }
    // The honest record of step 2 (read-only) needs no compensation; the files the saga
    // wrote stay as they were, since their records were forged away.
    assert_eq!(
        fs::read(world.project.path("ws/old.txt")).expect("reads"),
        b"new"
    );
}
