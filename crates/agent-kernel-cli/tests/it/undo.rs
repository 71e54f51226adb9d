//! `undo --saga ID --reason TEXT` through the binary (reference §10): every file back and
//! the saga `Undone`; refused (exit 4, naming the step) past the undo window, or after
//! another writer changed a file, unless `--force`.

use std::fs;

use serde_json::json;

use crate::recovery_kills::state_of;
use crate::{Project, describe, wait_until};

/// A project whose files get written by a saga that ends `Done`: `ws/a.txt` (existed)
/// rewritten, `ws/new.txt` created, `ws/log.txt` appended to.
fn done_saga(project: &Project) -> String {
    fs::write(project.path("ws/a.txt"), "before").expect("writes");
    fs::write(project.path("ws/log.txt"), "one\n").expect("writes");
    let plan = project.plan(
        "plan.json",
        &json!({"steps": [
            {"tool": "fs.write", "args": {"path": "ws/a.txt", "content": "after"}},
            {"tool": "fs.write", "args": {"path": "ws/new.txt", "content": "new"}},
            {"tool": "fs.append", "args": {"path": "ws/log.txt", "content": "two\n"}},
        ]}),
    );
    let output = project.run(&["run", "--plan", plan.to_str().expect("utf-8")]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let (saga_id, state) = project.latest_saga().expect("a saga");
    assert_eq!(state, "Done");
    saga_id
}

/// The files the done saga will change, written as they are before it; their snapshot.
fn files_before(project: &Project) -> std::collections::BTreeMap<String, Vec<u8>> {
    fs::write(project.path("ws/a.txt"), "before").expect("writes");
    fs::write(project.path("ws/log.txt"), "one\n").expect("writes");
    project.snapshot()
}

#[test]
fn undo_puts_every_file_back_and_the_saga_is_undone() {
    let project = Project::new();
    let before = files_before(&project);
    let saga_id = done_saga(&project);
    let (code, report) =
        project.run_json(&["undo", "--saga", &saga_id, "--reason", "the wrong folder"]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["state"], "Undone");
    assert_eq!(project.snapshot(), before);
    assert_eq!(project.latest_saga().expect("a saga").1, "Undone");
    // `recover` never touches it, and a second undo changes nothing.
    let (code, _) = project.run_json(&["recover"]);
    assert_eq!(code, 0);
    let (code, again) = project.run_json(&["undo", "--saga", &saga_id, "--reason", "again"]);
    assert_eq!(code, 0, "{again}");
    assert_eq!(project.snapshot(), before);
    let (code, records) = project.run_json(&["audit", "list", "--kind", "Operator"]);
    assert_eq!(code, 0);
    assert!(
        records.to_string().contains("the wrong folder"),
        "{records}"
    );
    let (code, audit) = project.run_json(&["audit", "verify"]);
    assert_eq!(code, 0, "{audit}");
}

#[test]
fn after_another_writer_changed_a_file_undo_is_refused_unless_forced() {
    let project = Project::new();
    let saga_id = done_saga(&project);
    fs::write(
        project.path("ws/log.txt"),
        "one\ntwo\nthree, by someone else\n",
    )
    .expect("writes");
    let output = project.run(&["undo", "--saga", &saga_id, "--reason", "undo it"]);
    assert_eq!(output.status.code(), Some(4), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("step 2") && stderr.contains("log.txt") && stderr.contains("--force"),
        "{stderr}"
    );
    // Nothing was undone.
    assert_eq!(
        fs::read_to_string(project.path("ws/a.txt")).expect("reads"),
        "after"
    );
    assert_eq!(project.latest_saga().expect("a saga").1, "Done");

    let output = project.run(&["undo", "--saga", &saga_id, "--reason", "undo it", "--force"]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    assert_eq!(
        fs::read_to_string(project.path("ws/a.txt")).expect("reads"),
        "before"
    );
    assert!(!project.path("ws/new.txt").exists());
    assert_eq!(
        fs::read_to_string(project.path("ws/log.txt")).expect("reads"),
        "one\n"
    );
}

#[test]
fn past_the_undo_window_undo_is_refused_naming_the_step() {
    let project = Project::new();
    fs::write(
        project.path("sandbox.toml"),
        "[fs]\nallow = [\"ws\"]\n\n[limits]\nundo_window = \"1s\"\n",
    )
    .expect("writes policy");
    let saga_id = done_saga(&project);
    let (code, saga) = project.run_json(&["log", "--saga", &saga_id]);
    assert_eq!(code, 0);
    let ended_at_ms = saga["updated_at_ms"].as_i64().expect("a time");
    wait_until("the undo window of 1s has passed", || {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_millis() as i64;
        now_ms > ended_at_ms + 1_000
    });
    let output = project.run(&[
        "undo", "--saga", &saga_id, "--reason", "too late", "--force",
    ]);
    assert_eq!(output.status.code(), Some(4), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("step 2") && stderr.contains("window of 1s"),
        "{stderr}"
    );
    assert_eq!(
        fs::read_to_string(project.path("ws/a.txt")).expect("reads"),
        "after"
    );
}

#[test]
fn undo_of_a_saga_that_is_not_done_is_refused() {
    let project = Project::new();
    let plan = project.plan(
        "plan.json",
        &json!({"steps": [
            {"tool": "fs.write", "args": {"path": "ws/a.txt", "content": "x"}},
            {"tool": "fault.fail", "args": {}},
        ]}),
    );
    let output = project.run(&["run", "--plan", plan.to_str().expect("utf-8")]);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let (saga_id, _) = project.latest_saga().expect("a saga");
    let output = project.run(&["undo", "--saga", &saga_id, "--reason", "r"]);
    assert_eq!(output.status.code(), Some(4), "{}", describe(&output));
    let output = project.run(&["undo", "--saga", &saga_id]);
    assert_eq!(
        output.status.code(),
        Some(2),
        "a reason is required: {}",
        describe(&output)
    );
}

#[test]
fn two_undos_of_one_saga_at_once_compensate_once() {
    let project = Project::new();
    let before = files_before(&project);
    let saga_id = done_saga(&project);
    let undos: Vec<std::process::Child> = (0..2)
        .map(|_| {
            project
                .command(&["undo", "--saga", &saga_id, "--reason", "twice at once"])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawns")
        })
        .collect();
    for undo in undos {
        let output = undo.wait_with_output().expect("waits");
        assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    }
    assert_eq!(project.snapshot(), before);
    assert_eq!(project.latest_saga().expect("a saga").1, "Undone");
}

/// `undo --preview` says what an undo would do to each step, last first, and undoes
/// nothing: every step undoable on a fresh `Done` saga (exit 0); once another writer changed
/// a file, that step is "changed since" and the undo would be refused (exit 4), unless
/// `--force`; the files and the saga stay as they are throughout.
#[test]
fn undo_preview_names_each_step_and_changes_nothing() {
    let project = Project::new();
    let saga_id = done_saga(&project);
    let (code, preview) = project.run_json(&["undo", "--saga", &saga_id, "--preview"]);
    assert_eq!(code, 0, "{preview}");
    assert_eq!(preview["undoable"], true, "{preview}");
    let steps = preview["steps"].as_array().expect("steps");
    let seqs: Vec<u64> = steps
        .iter()
        .map(|step| step["step_seq"].as_u64().expect("a seq"))
        .collect();
    assert_eq!(seqs, [2, 1, 0], "last first: {preview}");
    assert!(
        steps
            .iter()
            .all(|step| step["verdict"] == "undoable" && step["window_closes_at_ms"].is_i64()),
        "{preview}"
    );
    // What each compensation would put back, from the step's record.
    let restores: Vec<&str> = steps
        .iter()
        .map(|step| step["restores"].as_str().expect("each file tool says"))
        .collect();
    assert!(
        restores[0].contains("cuts")
            && restores[0].contains("log.txt")
            && restores[0].contains("4 bytes"),
        "{restores:?}"
    );
    assert!(
        restores[1].contains("removes") && restores[1].contains("new.txt"),
        "{restores:?}"
    );
    assert!(
        restores[2].contains("puts back the previous 6 bytes") && restores[2].contains("a.txt"),
        "{restores:?}"
    );

    fs::write(
        project.path("ws/log.txt"),
        "one\ntwo\nthree, by someone else\n",
    )
    .expect("writes");
    let before = project.snapshot();
    let (code, preview) = project.run_json(&["undo", "--saga", &saga_id, "--preview"]);
    assert_eq!(code, 4, "{preview}");
    assert_eq!(preview["undoable"], false);
    assert_eq!(preview["steps"][0]["verdict"], "changed", "{preview}");
    assert!(
        preview["steps"][0]["change"]
            .as_str()
            .is_some_and(|change| change.contains("log.txt")),
        "{preview}"
    );
    let (code, forced) = project.run_json(&["undo", "--saga", &saga_id, "--preview", "--force"]);
    assert_eq!(code, 0, "{forced}");
    assert_eq!(forced["undoable"], true);
    let output = project.run(&["undo", "--saga", &saga_id, "--preview"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("changed since") && stdout.contains("would be refused"),
        "{stdout}"
    );
    assert_eq!(project.snapshot(), before, "a preview undoes nothing");
    assert_eq!(project.latest_saga().expect("a saga").1, "Done");
}

/// A saga of `fs.write` (`ws/a.txt`), `note.add` and `fs.write` (`ws/b.txt`) run to `Done`,
/// then an `undo` of it SIGKILLed while `note.add`'s compensation runs: `ws/b.txt` is back,
/// the note not yet removed, `ws/a.txt` not reached. Returns the saga's id.
fn undo_killed_midway(project: &Project) -> String {
    fs::write(project.path("note.py"), crate::dlq::NOTE_PY).expect("writes");
    fs::write(project.path("tools.toml"), crate::dlq::TOOLS_TOML).expect("writes");
    fs::write(project.path("ws/a.txt"), "before").expect("writes");
    fs::write(project.path("ws/notes.txt"), "").expect("writes");
    let plan = project.plan(
        "plan.json",
        &json!({"steps": [
            {"tool": "fs.write", "args": {"path": "ws/a.txt", "content": "after"}},
            {"tool": "note.add", "args": {"item": "x"}},
            {"tool": "fs.write", "args": {"path": "ws/b.txt", "content": "after"}},
        ]}),
    );
    let output = project.run(&["run", "--plan", plan.to_str().expect("utf-8")]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let (saga_id, _) = project.latest_saga().expect("a saga");
    fs::write(project.path("ws/hold"), "").expect("writes");
    let mut undo = crate::crash::spawn(
        project,
        &["undo", "--saga", &saga_id, "--reason", "killed midway"],
    );
    wait_until("note.add's compensation runs", || {
        project.path("ws/held").exists()
    });
    crate::sigkill(&mut undo).expect("kills the undo");
    let _ = undo.wait();
    fs::remove_file(project.path("ws/hold")).expect("removes");
    assert!(
        !project.path("ws/b.txt").exists(),
        "ws/b.txt is undone first"
    );
    assert_eq!(project.latest_saga().expect("a saga").1, "Done");
    saga_id
}

/// Asserts that the files of [`undo_killed_midway`]'s saga are as before it ran.
fn assert_undone(project: &Project) {
    assert_eq!(
        fs::read_to_string(project.path("ws/a.txt")).expect("reads"),
        "before"
    );
    assert_eq!(
        fs::read_to_string(project.path("ws/notes.txt")).expect("reads"),
        ""
    );
    assert!(!project.path("ws/b.txt").exists());
}

/// An `undo` killed midway, then another writer's change to a file it had not reached:
/// `recover` undoes what it can (the note), leaves the changed file to an operator as a
/// dead letter, and the saga ends `FailedRollbackPartial` (exit 3), never `Done` over a
/// world partly undone; `dlq retry --force` then finishes it.
#[test]
fn recover_finishing_a_killed_undo_parks_a_step_changed_since_and_undoes_the_rest() {
    let project = Project::new();
    let saga_id = undo_killed_midway(&project);
    fs::write(project.path("ws/a.txt"), "someone else's").expect("writes");
    let output = project.run(&["recover"]);
    assert_eq!(output.status.code(), Some(3), "{}", describe(&output));
    assert_eq!(
        state_of(&project, &saga_id).as_deref(),
        Some("FailedRollbackPartial")
    );
    assert_eq!(
        fs::read_to_string(project.path("ws/notes.txt")).expect("reads"),
        ""
    );
    assert!(!project.path("ws/b.txt").exists());
    assert_eq!(
        fs::read_to_string(project.path("ws/a.txt")).expect("reads"),
        "someone else's"
    );
    let (code, listed) = project.run_json(&["dlq", "list"]);
    assert_eq!(code, 0, "{listed}");
    let letters = listed["dead_letters"].as_array().expect("a list");
    assert_eq!(letters.len(), 1, "{listed}");
    assert_eq!(letters[0]["step"], 0, "{listed}");
    assert!(
        letters[0]["error"]
            .as_str()
            .is_some_and(|error| error.starts_with("changed since")),
        "{listed}"
    );
    let id = letters[0]["id"].to_string();
    let output = project.run(&["dlq", "retry", id.trim_matches('"'), "--force"]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    assert_eq!(
        fs::read_to_string(project.path("ws/a.txt")).expect("reads"),
        "before"
    );
    let output = project.run(&["audit", "verify"]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
}

/// An `undo` killed midway, in a log with no unfinished saga: `recover --watch` finishes it
/// (a settled saga of a dead process still holding its locks is something to recover), and
/// the world is as before the saga.
#[test]
fn recover_watch_finishes_a_killed_undo_when_no_saga_is_unfinished() {
    let project = Project::new();
    let saga_id = undo_killed_midway(&project);
    let watcher = project
        .command(&["--json", "recover", "--watch"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("starts");
    wait_until("the watcher finishes the undo", || {
        state_of(&project, &saga_id).as_deref() == Some("Undone")
    });
    let watched = crate::postgres::stop(watcher);
    assert!(watched.contains(&saga_id), "{watched}");
    assert_undone(&project);
    let output = project.run(&["audit", "verify"]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
}

/// An `undo` killed midway, then a `recover` that lacks `note.add` (no tools file): the
/// saga is left as it is, its files still locked, reported as missing the tool (exit 3);
/// a `recover` with the tools file then finishes the undo.
#[test]
fn recover_without_a_killed_undos_tool_leaves_it_for_one_that_has_it() {
    let project = Project::new();
    let saga_id = undo_killed_midway(&project);
    fs::rename(project.path("tools.toml"), project.path("tools.toml.aside")).expect("moves");
    let output = project.run(&["recover"]);
    assert_eq!(output.status.code(), Some(3), "{}", describe(&output));
    assert!(
        describe(&output).contains("note.add"),
        "{}",
        describe(&output)
    );
    assert_eq!(state_of(&project, &saga_id).as_deref(), Some("Done"));
    // Still held: another saga may not write what the undo began to put back.
    let plan = project.plan(
        "other.json",
        &json!({"steps": [{"tool": "fs.write", "args": {"path": "ws/a.txt", "content": "other"}}]}),
    );
    let output = project.run(&["run", "--plan", plan.to_str().expect("utf-8")]);
    assert_eq!(output.status.code(), Some(6), "{}", describe(&output));
    fs::rename(project.path("tools.toml.aside"), project.path("tools.toml")).expect("moves");
    let output = project.run(&["recover"]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    assert_eq!(state_of(&project, &saga_id).as_deref(), Some("Undone"));
    assert_undone(&project);
}

/// A step keyed as a step of a saga whose undo was killed midway (`Done`, its resources
/// claimed again) does not reuse that step's output, whose effect `recover` is about to
/// undo: it is refused as a conflict, nothing run; once `recover` has undone the saga, the
/// same step runs again under the key.
#[test]
fn a_key_of_a_saga_being_undone_is_not_reused() {
    let project = Project::new();
    fs::write(project.path("note.py"), crate::dlq::NOTE_PY).expect("writes");
    fs::write(project.path("tools.toml"), crate::dlq::TOOLS_TOML).expect("writes");
    fs::write(project.path("ws/notes.txt"), "").expect("writes");
    let keyed = json!({"tool": "fs.write", "args": {"path": "ws/k.txt", "content": "k"}, "idempotency_key": "k-1"});
    let first = project.plan(
        "first.json",
        &json!({"steps": [keyed, {"tool": "note.add", "args": {"item": "x"}}]}),
    );
    let output = project.run(&["run", "--plan", first.to_str().expect("utf-8")]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let (saga_id, _) = project.latest_saga().expect("a saga");
    fs::write(project.path("ws/hold"), "").expect("writes");
    let mut undo = crate::crash::spawn(&project, &["undo", "--saga", &saga_id, "--reason", "r"]);
    wait_until("note.add's compensation runs", || {
        project.path("ws/held").exists()
    });
    crate::sigkill(&mut undo).expect("kills the undo");
    let _ = undo.wait();
    fs::remove_file(project.path("ws/hold")).expect("removes");
    let again = project.plan("again.json", &json!({"steps": [keyed]}));
    let output = project.run(&["run", "--plan", again.to_str().expect("utf-8")]);
    assert_eq!(output.status.code(), Some(6), "{}", describe(&output));
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("which an undo is undoing"),
        "{}",
        describe(&output)
    );
    let output = project.run(&["recover"]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    assert_eq!(state_of(&project, &saga_id).as_deref(), Some("Undone"));
    assert!(!project.path("ws/k.txt").exists());
    let output = project.run(&["run", "--plan", again.to_str().expect("utf-8")]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    assert_eq!(
        fs::read_to_string(project.path("ws/k.txt")).expect("reads"),
        "k"
    );
    let output = project.run(&["audit", "verify"]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
}
