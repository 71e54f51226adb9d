//! Dead letters through the binary (reference §10): a compensation that fails becomes a
//! dead letter, `dlq list` shows it, `dlq retry` runs it again (exit 3 while it still
//! fails, 0 once it is compensated), `dlq resolve` settles one by hand, and the saga is
//! `FailedRolledBack` once none is left.

use std::fs;

use serde_json::json;

use crate::{Project, describe};

/// `note.add {item}` appends a line to `ws/notes.txt`; its compensation removes it, and
/// fails while `ws/block` exists.
pub(crate) const NOTE_PY: &str = include_str!("../../../../tests/fixtures/note.py");

pub(crate) const TOOLS_TOML: &str = include_str!("../../../../tests/fixtures/note-tools.toml");

#[test]
fn failed_compensations_are_listed_retried_and_resolved_until_the_saga_is_rolled_back() {
    let project = Project::new();
    fs::write(project.path("note.py"), NOTE_PY).expect("writes");
    fs::write(project.path("tools.toml"), TOOLS_TOML).expect("writes");
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
    let (saga_id, state) = project.latest_saga().expect("a saga");
    assert_eq!(state, "FailedRollbackPartial");

    let (code, listed) = project.run_json(&["dlq", "list"]);
    assert_eq!(code, 0, "{listed}");
    let letters = listed["dead_letters"].as_array().expect("a list").clone();
    assert_eq!(letters.len(), 2, "{listed}");
    for letter in &letters {
        for field in ["id", "saga_id", "step", "tool", "error", "attempts"] {
            assert!(letter.get(field).is_some(), "`{field}` in {letter}");
        }
        assert_eq!(letter["saga_id"], saga_id.as_str());
        assert_eq!(letter["attempts"], 1);
    }
    let letter = |step: u64| {
        letters
            .iter()
            .find(|letter| letter["step"] == step)
            .expect("a letter for the step")
            .clone()
    };
    let id = |step: u64| letter(step)["id"].as_str().expect("an id").to_owned();
    let (first, second) = (id(0), id(1));
    let error = |step: u64| {
        letter(step)["error"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    assert!(error(1).contains("locked"), "{listed}");
    // The tool declares no resources, so both steps hold `tool:note.add`: the first waits
    // for the second's compensation (compensations run last first), nothing run.
    assert!(
        error(0).contains("not compensated: step 1, later on the same resource `tool:note.add`"),
        "{listed}"
    );

    // Still failing: exit 3, one more attempt, still listed.
    let (code, again) = project.run_json(&["dlq", "retry", &second]);
    assert_eq!(code, 3, "{again}");
    assert_eq!(
        (again["status"].clone(), again["attempts"].clone()),
        (json!("open"), json!(2))
    );

    fs::remove_file(project.path("ws/block")).expect("unblocks");
    // The first step's letter waits for the second's: refused, nothing done.
    let output = project.run(&["dlq", "retry", &first]);
    assert_eq!(output.status.code(), Some(2), "{}", describe(&output));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("retry that one first"),
        "{}",
        describe(&output)
    );
    let (code, retried) = project.run_json(&["dlq", "retry", &second]);
    assert_eq!(code, 0, "{retried}");
    assert_eq!(retried["status"], "retried");
    assert_eq!(
        retried["saga_state"], "FailedRollbackPartial",
        "one letter is left"
    );
    assert_eq!(
        fs::read_to_string(project.path("ws/notes.txt")).expect("reads"),
        "a\n",
        "`b` was taken out"
    );

    // The operator takes `a` out by hand and says so.
    fs::write(project.path("ws/notes.txt"), "").expect("writes");
    let output = project.run(&["dlq", "resolve", &first, "--note", "removed a by hand"]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    assert_eq!(project.latest_saga().expect("a saga").1, "FailedRolledBack");
    let (code, listed) = project.run_json(&["dlq", "list"]);
    assert_eq!(code, 0);
    assert_eq!(listed["dead_letters"], json!([]));

    // Settled letters stay settled.
    let output = project.run(&["dlq", "retry", &second]);
    assert_eq!(output.status.code(), Some(4), "{}", describe(&output));
    let output = project.run(&["dlq", "retry", "no-such-letter"]);
    assert_eq!(output.status.code(), Some(2), "{}", describe(&output));
    let output = project.run(&["dlq", "resolve", &first]);
    assert_eq!(
        output.status.code(),
        Some(2),
        "a note is required: {}",
        describe(&output)
    );

    let (code, records) = project.run_json(&["audit", "list", "--kind", "DeadLetterSettled"]);
    assert_eq!(code, 0, "{records}");
    assert!(
        records.to_string().contains("removed a by hand"),
        "{records}"
    );
    let (code, audit) = project.run_json(&["audit", "verify"]);
    assert_eq!(code, 0, "{audit}");
}

/// `wait.add`: a command tool whose compensation writes `ws/waiting` and waits while
/// `ws/wait` exists (for a test to kill what runs it).
const WAIT_PY: &str = "import json, pathlib, time\nrequest = json.load(__import__('sys').stdin)\nif request['phase'] == 'compensate':\n    while pathlib.Path('ws/wait').exists():\n        pathlib.Path('ws/waiting').write_text('')\n        time.sleep(0.05)\n";

/// An `undo` killed after one compensation failed (its letter open) while the next runs:
/// the saga still says `Done`, and its letter can be neither resolved nor retried (`recover`
/// finishes the undo, which may still compensate that step); once `recover` has left the
/// saga `FailedRollbackPartial`, the letter is resolved and the saga settles.
#[test]
fn a_letter_of_an_unfinished_undo_is_settled_only_after_recover() {
    let project = Project::new();
    fs::write(project.path("note.py"), NOTE_PY).expect("writes");
    fs::write(project.path("wait.py"), WAIT_PY).expect("writes");
    let tools = format!(
        "{TOOLS_TOML}\n[tools.\"wait.add\"]\neffect = \"mutating\"\nsettlement = \"compensate\"\nexecute = [\"python3\", \"wait.py\"]\ncompensate = [\"python3\", \"wait.py\"]\n"
    );
    fs::write(project.path("tools.toml"), tools).expect("writes");
    let plan = project.plan(
        "plan.json",
        &json!({"steps": [
            {"tool": "wait.add", "args": {}},
            {"tool": "note.add", "args": {"item": "a"}},
        ]}),
    );
    let output = project.run(&["run", "--plan", plan.to_str().expect("utf-8")]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let (saga_id, _) = project.latest_saga().expect("a saga");
    fs::write(project.path("ws/block"), "").expect("writes");
    fs::write(project.path("ws/wait"), "").expect("writes");
    let mut undo = crate::crash::spawn(&project, &["undo", "--saga", &saga_id, "--reason", "r"]);
    crate::wait_until("wait.add's compensation runs", || {
        project.path("ws/waiting").exists()
    });
    crate::sigkill(&mut undo).expect("kills the undo");
    let _ = undo.wait();
    fs::remove_file(project.path("ws/wait")).expect("removes");
    assert_eq!(project.latest_saga().expect("a saga").1, "Done");
    let (code, listed) = project.run_json(&["dlq", "list"]);
    assert_eq!(code, 0, "{listed}");
    let id = listed["dead_letters"][0]["id"]
        .as_str()
        .expect("the note's letter")
        .to_owned();
    for refused in [
        vec!["dlq", "resolve", id.as_str(), "--note", "kept on purpose"],
        vec!["dlq", "retry", id.as_str()],
    ] {
        let output = project.run(&refused);
        assert_eq!(output.status.code(), Some(2), "{}", describe(&output));
        assert!(
            String::from_utf8_lossy(&output.stderr).contains("an undo of it has not finished"),
            "{}",
            describe(&output)
        );
    }
    // `recover` finishes the undo: the note still cannot be removed, so its letter stays.
    let output = project.run(&["recover"]);
    assert_eq!(output.status.code(), Some(3), "{}", describe(&output));
    assert_eq!(
        project.latest_saga().expect("a saga").1,
        "FailedRollbackPartial"
    );
    let output = project.run(&["dlq", "resolve", &id, "--note", "kept on purpose"]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    assert_eq!(project.latest_saga().expect("a saga").1, "FailedRolledBack");
    let output = project.run(&["audit", "verify"]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
}

/// `late.add`: a command tool whose compensation fails while `ws/block` exists, and, while
/// `ws/slow` exists, writes `ws/waiting`, waits a second and writes `ws/late.txt` (what a
/// compensation left running by a killed process would do after others acted).
const LATE_SH: &str = "cat > /dev/null\nif [ \"$1\" = compensate ]; then\n  if [ -f ws/block ]; then echo locked >&2; exit 1; fi\n  if [ -f ws/slow ]; then touch ws/waiting; sleep 1; echo late > ws/late.txt; fi\nfi\n";

/// A `dlq retry` SIGKILLed while its compensation runs: the next retry stops that program
/// before it compensates (it would act after the letter was settled and the saga's
/// resources released), and settles the saga.
#[test]
fn a_retry_after_a_killed_retry_stops_the_compensation_it_left_running() {
    let project = Project::new();
    fs::write(project.path("late.sh"), LATE_SH).expect("writes");
    fs::write(
        project.path("tools.toml"),
        "[tools.\"late.add\"]\neffect = \"mutating\"\nsettlement = \"compensate\"\nexecute = [\"/bin/sh\", \"late.sh\", \"execute\"]\ncompensate = [\"/bin/sh\", \"late.sh\", \"compensate\"]\n",
    )
    .expect("writes");
    fs::write(project.path("ws/block"), "").expect("writes");
    let plan = project.plan(
        "plan.json",
        &json!({"steps": [{"tool": "late.add", "args": {}}, {"tool": "fault.fail", "args": {}}]}),
    );
    let output = project.run(&["run", "--plan", plan.to_str().expect("utf-8")]);
    assert_eq!(output.status.code(), Some(3), "{}", describe(&output));
    let (code, listed) = project.run_json(&["dlq", "list"]);
    assert_eq!(code, 0, "{listed}");
    let id = listed["dead_letters"][0]["id"]
        .as_str()
        .expect("a letter")
        .to_owned();
    fs::remove_file(project.path("ws/block")).expect("removes");
    fs::write(project.path("ws/slow"), "").expect("writes");
    let mut retry = crate::crash::spawn(&project, &["dlq", "retry", &id]);
    crate::wait_until("the retry's compensation runs", || {
        project.path("ws/waiting").exists()
    });
    crate::sigkill(&mut retry).expect("kills the retry");
    let _ = retry.wait();
    fs::remove_file(project.path("ws/slow")).expect("removes");
    let output = project.run(&["dlq", "retry", &id]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    assert_eq!(project.latest_saga().expect("a saga").1, "FailedRolledBack");
    // The killed retry's program would write within a second of starting: well past that.
    std::thread::sleep(std::time::Duration::from_millis(1_500));
    assert!(
        !project.path("ws/late.txt").exists(),
        "a compensation of the killed retry acted after the saga was settled"
    );
    let output = project.run(&["audit", "verify"]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
}
