//! Where a command finds its files (reference §5): `--config DIR` names the project's
//! folder from anywhere, `tools.toml` and `fsm.toml` are found beside the policy given with
//! `--sandbox`, and `recover` says where it looked for a tools file it did not find.

use std::fs;
use std::process::{Command, Output, Stdio};

use serde_json::json;

use crate::upstream_isolation::COMMANDS_THAT_NEED_NO_UPSTREAM_TOOL;
use crate::{Project, bin, describe};

/// A project with the note tool (`tests/fixtures/note.py`) in its `tools.toml`.
fn note_project() -> Project {
    let project = Project::new();
    fs::write(project.path("note.py"), crate::dlq::NOTE_PY).expect("writes the program");
    fs::write(project.path("tools.toml"), crate::dlq::TOOLS_TOML).expect("writes the tools file");
    project
}

/// The binary run in `folder` with `args`, without the environment that would change it.
fn run_in(folder: &std::path::Path, args: &[&str]) -> Output {
    Command::new(bin())
        .current_dir(folder)
        .env_remove("AGENT_KERNEL_DB")
        .env_remove("AGENT_KERNEL_AUDIT_KEY")
        .env_remove("RUST_LOG")
        .args(args)
        .output()
        .expect("the binary runs")
}

#[test]
fn config_names_the_project_from_any_folder() {
    let project = note_project();
    let elsewhere = tempfile::tempdir().expect("another folder");
    let plan = elsewhere.path().join("plan.json");
    fs::write(
        &plan,
        json!({"steps": [
            {"tool": "fs.write", "args": {"path": "ws/a.txt", "content": "a"}},
            {"tool": "note.add", "args": {"item": "x"}},
        ]})
        .to_string(),
    )
    .expect("writes the plan");
    let folder = project.path("");
    let output = run_in(
        elsewhere.path(),
        &[
            "--config",
            folder.to_str().expect("UTF-8"),
            "run",
            "--plan",
            plan.to_str().expect("UTF-8"),
        ],
    );
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    // The relative path, the tools file and the log are the project's.
    assert_eq!(
        fs::read_to_string(project.path("ws/a.txt")).expect("reads"),
        "a"
    );
    assert_eq!(
        fs::read_to_string(project.path("ws/notes.txt")).expect("reads"),
        "x\n"
    );
    assert!(project.path("agent-kernel.db").is_file());
    let left: Vec<_> = fs::read_dir(elsewhere.path())
        .expect("lists")
        .map(|entry| entry.expect("an entry").file_name())
        .collect();
    assert_eq!(left, ["plan.json"], "nothing written where the command ran");
}

#[test]
fn a_config_that_is_no_folder_is_bad_input() {
    let project = Project::new();
    let output = project.run(&["--config", "no-such-folder", "log"]);
    assert_eq!(output.status.code(), Some(2), "{}", describe(&output));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("--config no-such-folder: not a folder"),
        "{}",
        describe(&output)
    );
}

#[test]
fn the_tools_file_and_the_table_beside_the_policy_are_found() {
    let project = note_project();
    let table = agent_kernel::Guardrail::builtin().to_toml().replacen(
        "[[transition]]\nfrom = \"Done\"\nevent = \"UndoRequested\"\nto = \"Undone\"\n",
        "",
        1,
    );
    fs::write(project.path("fsm.toml"), table).expect("writes the table");
    let elsewhere = tempfile::tempdir().expect("another folder");
    let policy = project.path("sandbox.toml");
    let db = elsewhere.path().join("log.db");
    let given = [
        "--json",
        "--db",
        db.to_str().expect("UTF-8"),
        "--sandbox",
        policy.to_str().expect("UTF-8"),
    ];
    let output = run_in(elsewhere.path(), &[&given[..], &["tools"]].concat());
    let (code, listed) = crate::json_output(&output);
    assert_eq!(code, 0, "{listed}");
    assert!(listed.to_string().contains("\"note.add\""), "{listed}");
    let output = run_in(elsewhere.path(), &[&given[..], &["fsm", "--show"]].concat());
    let (code, shown) = crate::json_output(&output);
    assert_eq!(code, 0, "{shown}");
    assert!(shown.to_string().contains("ValidationPassed"), "{shown}");
    assert!(!shown.to_string().contains("UndoRequested"), "{shown}");
}

#[test]
fn recover_says_where_it_looked_for_the_tools_file() {
    let project = note_project();
    let plan = project.plan(
        "plan.json",
        &json!({"steps": [
            {"tool": "note.add", "args": {"item": "x"}},
            {"tool": "noop", "args": {"sleep_ms": 20_000}},
        ]}),
    );
    let mut child = project
        .command(&["run", "--plan", plan.to_str().expect("UTF-8")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawns");
    crate::wait_until("the note never landed", || {
        fs::read_to_string(project.path("ws/notes.txt")).is_ok_and(|notes| notes == "x\n")
    });
    crate::sigkill(&mut child).expect("SIGKILLs");
    child.wait().expect("reaps");
    // Recovered without the tools file: left as it is, and the operator told where the
    // command looked.
    fs::rename(project.path("tools.toml"), project.path("tools.toml.away")).expect("moves");
    let output = project.run(&["recover"]);
    assert_eq!(output.status.code(), Some(3), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("no tools file was loaded (none at tools.toml)")
            && stderr.contains("--tools FILE or --config DIR"),
        "{}",
        describe(&output)
    );
    // With it, the saga is settled.
    fs::rename(project.path("tools.toml.away"), project.path("tools.toml")).expect("moves");
    let output = project.run(&["recover"]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    assert_eq!(
        fs::read_to_string(project.path("ws/notes.txt")).expect("reads"),
        ""
    );
}

/// A tools file naming an upstream server whose program fails: every command that needs
/// none of its tools answers, says nothing of it, and never starts it.
#[test]
fn commands_that_need_no_upstream_server_start_none_even_one_that_would_fail() {
    let project = Project::new();
    fs::write(
        project.path("tools.toml"),
        "[mcp_servers.broken]\ncommand = [\"sh\", \"-c\", \"touch started; exit 1\"]\n",
    )
    .expect("writes the tools file");
    let plan = project.plan(
        "plan.json",
        &json!({"steps": [{"tool": "fs.write", "args": {"path": "ws/a.txt", "content": "a"}}]}),
    );
    let run: &[&str] = &["run", "--plan", plan.to_str().expect("UTF-8")];
    for command in std::iter::once(run).chain(COMMANDS_THAT_NEED_NO_UPSTREAM_TOOL) {
        let output = project.run(command);
        assert_eq!(
            output.status.code(),
            Some(0),
            "{command:?}: {}",
            describe(&output)
        );
        assert!(
            !String::from_utf8_lossy(&output.stderr).contains("broken"),
            "{command:?}: {}",
            describe(&output)
        );
    }
    assert!(
        !project.path("started").exists(),
        "no command started the server"
    );
    // Asked for, it is started, and its failure is named.
    let output = project.run(&["tools", "--upstream"]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    assert!(project.path("started").exists());
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("`broken` is unavailable"),
        "{}",
        describe(&output)
    );
}
