//! Under the second line a command tool's program reaches exactly what it was declared
//! with: never the log, its companions, the operator key or a `.env` beside them; its own
//! script and its `read` folders; and programs that live outside the system folders (a
//! virtualenv's Python, a pyenv-style shim, a script whose interpreter is elsewhere, a
//! symbolic link) run.

use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use serde_json::{Value, json};

use crate::{Project, describe};

/// Writes an executable file.
fn executable(path: &Path, text: &str) {
    fs::create_dir_all(path.parent().expect("a folder")).expect("creates its folder");
    fs::write(path, text).expect("writes");
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).expect("chmod");
}

/// Whether the Landlock second line is enforced on this machine.
fn second_line_enforced(project: &Project) -> bool {
    let output = project.run(&["sandbox", "status"]);
    String::from_utf8_lossy(&output.stdout).contains("landlock enforced")
}

/// Runs a one-step plan of `tool` and returns the step's output.
fn run_tool(project: &Project, tool: &str) -> Value {
    let plan = project.plan("plan.json", &json!({"steps": [{"tool": tool, "args": {}}]}));
    let output = project.run(&["--json", "run", "--plan", plan.to_str().expect("utf-8")]);
    let (code, report) = crate::json_output(&output);
    assert_eq!(code, 0, "{}", describe(&output));
    report["steps"][0]["output"]["data"].clone()
}

/// What the probe must find there and be denied, from the tools file's folder.
const DENIED: [&str; 7] = [
    "log.db",
    "log.db-wal",
    "log.db.audit-head",
    "log.db.console-token",
    "operator.key",
    ".env",
    "tools.toml",
];

/// What the probe must be able to read: its own script and a file of its `read` folder.
const ALLOWED: [&str; 2] = ["probe.sh", "data/info.txt"];

/// A program that says, for each of `DENIED` and `ALLOWED`, whether it could read it, was denied, or found
/// nothing there (the names are in the script, not on its command line, where they would be
/// declared).
fn probe_sh() -> String {
    let mut script = "#!/bin/sh\nprintf '{'\nsep=''\nfor f in".to_owned();
    for file in DENIED.iter().chain(&ALLOWED) {
        script.push_str(&format!(" '{file}'"));
    }
    script.push_str(
        "; do\n  if [ ! -e \"$f\" ]; then r=absent; elif cat \"$f\" >/dev/null 2>&1; then r=read; else r=denied; fi\n  printf '%s\"%s\": \"%s\"' \"$sep\" \"$f\" \"$r\"\n  sep=', '\ndone\nprintf '}'\n",
    );
    script
}

#[test]
fn a_program_reads_its_script_and_read_folders_never_the_log_keys_or_env() {
    let project = Project::new();
    fs::write(
        project.path("sandbox.toml"),
        "[fs]\nallow = [\"ws\"]\ndeny_names = [\".env\", \"*.pem\"]\n\n[approval]\nrequire = [\"nothing.*\"]\noperator_key_file = \"operator.key\"\n",
    )
    .expect("writes policy");
    fs::write(
        project.path("operator.key"),
        "0123456789abcdef0123456789abcdef",
    )
    .expect("key");
    fs::write(project.path(".env"), "SECRET=1").expect("env");
    fs::write(project.path("log.db.console-token"), "a console's token").expect("token");
    fs::create_dir(project.path("data")).expect("data");
    fs::write(project.path("data/info.txt"), "shared").expect("info");
    fs::write(project.path("probe.sh"), probe_sh()).expect("probe");
    fs::write(
        project.path("tools.toml"),
        "[tools.\"probe.read\"]\neffect = \"read-only\"\nread = [\"data\"]\nexecute = [\"sh\", \"probe.sh\"]\n",
    )
    .expect("tools");
    // The log exists before the probe runs (and its write-ahead file while it runs, the
    // log open in WAL mode).
    run_tool(&project, "probe.read");
    assert!(project.db().exists());
    let read = run_tool(&project, "probe.read");
    if !second_line_enforced(&project) {
        eprintln!("no Landlock here: nothing to check");
        return;
    }
    for denied in DENIED {
        assert_eq!(
            read[denied], "denied",
            "{denied} must exist and not be readable: {read}"
        );
    }
    for allowed in ALLOWED {
        assert_eq!(read[allowed], "read", "{allowed} must be readable: {read}");
    }
}

#[test]
fn a_declared_folder_that_holds_the_log_or_a_denied_name_is_refused_naming_it() {
    let project = Project::new();
    if !second_line_enforced(&project) {
        return;
    }
    fs::create_dir(project.path("secrets")).expect("secrets");
    fs::write(project.path("secrets/.env"), "SECRET=1").expect("env");
    fs::write(
        project.path("tools.toml"),
        "[tools.\"too.wide\"]\neffect = \"read-only\"\nread = [\".\"]\nexecute = [\"true\"]\n\n[tools.\"with.env\"]\neffect = \"read-only\"\nread = [\"secrets\"]\nexecute = [\"true\"]\n",
    )
    .expect("tools");
    for (tool, says) in [("too.wide", "log.db"), ("with.env", ".env")] {
        let plan = project.plan("plan.json", &json!({"steps": [{"tool": tool, "args": {}}]}));
        let output = project.run(&["run", "--plan", plan.to_str().expect("utf-8")]);
        assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            said.contains("second line") && said.contains(says),
            "{tool}: {said}"
        );
    }
}

#[test]
fn programs_outside_the_system_folders_run_under_the_second_line() {
    let project = Project::new();
    let root = project.path("elsewhere");
    // An installation outside /usr: a shell copied into PREFIX/bin, with PREFIX/lib beside.
    let shell = fs::canonicalize("/bin/sh").expect("a shell");
    fs::create_dir_all(root.join("inst/bin")).expect("bin");
    fs::create_dir_all(root.join("inst/lib")).expect("lib");
    fs::copy(&shell, root.join("inst/bin/mysh")).expect("copies the shell");
    fs::write(root.join("inst/lib/greeting"), "from-inst").expect("greeting");
    let mysh = root.join("inst/bin/mysh");
    // A script whose interpreter is that shell, reading its installation's files.
    executable(
        &project.path("tools/by-interpreter.sh"),
        &format!(
            "#!{}\nprintf '{{\"said\": \"%s\"}}' \"$(cat {})\"\n",
            mysh.display(),
            root.join("inst/lib/greeting").display()
        ),
    );
    // A symbolic link to the copied shell.
    std::os::unix::fs::symlink(&mysh, project.path("tools/linked-sh")).expect("links");
    // A pyenv-style shim: PREFIX/shims/NAME runs PREFIX/libexec/real.
    executable(
        &root.join("fakeenv/libexec/real"),
        "#!/bin/sh\nprintf '{\"said\": \"shimmed\"}'\n",
    );
    executable(
        &root.join("fakeenv/shims/fakepy"),
        &format!(
            "#!/bin/sh\nexec {} \"$@\"\n",
            root.join("fakeenv/libexec/real").display()
        ),
    );
    let mut tools = String::new();
    for (id, execute) in [
        ("by.interpreter", json!(["tools/by-interpreter.sh"])),
        (
            "by.link",
            json!(["tools/linked-sh", "-c", "printf '{\"said\": \"linked\"}'"]),
        ),
        (
            "by.shim",
            json!([root.join("fakeenv/shims/fakepy").display().to_string()]),
        ),
    ] {
        tools.push_str(&format!(
            "[tools.\"{id}\"]\neffect = \"read-only\"\nexecute = {execute}\n\n"
        ));
    }
    // A virtualenv's Python, when this machine can make one.
    let venv = project.path("venv");
    let made = project
        .isolated("python3")
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .output()
        .is_ok_and(|output| output.status.success());
    if made {
        tools.push_str(
            "[tools.\"by.venv\"]\neffect = \"read-only\"\nexecute = [\"venv/bin/python\", \"-c\", \"import sys, json; print(json.dumps({'said': 'venv' if sys.prefix != sys.base_prefix else 'base'}))\"]\n",
        );
    }
    fs::write(project.path("tools.toml"), tools).expect("tools");
    assert_eq!(run_tool(&project, "by.interpreter")["said"], "from-inst");
    assert_eq!(run_tool(&project, "by.link")["said"], "linked");
    assert_eq!(run_tool(&project, "by.shim")["said"], "shimmed");
    if made {
        assert_eq!(run_tool(&project, "by.venv")["said"], "venv");
    } else {
        eprintln!("python3 -m venv is not available here: the virtualenv case was skipped");
    }
}

#[test]
fn a_program_installed_after_its_tools_were_loaded_fails_naming_the_second_line_and_the_key() {
    let project = Project::new();
    if !second_line_enforced(&project) {
        return;
    }
    fs::write(
        project.path("tools.toml"),
        "[tools.\"late.run\"]\neffect = \"read-only\"\nexecute = [\"bin/late\"]\n",
    )
    .expect("tools");
    let mut server = crate::mcp::Raw::start(&project);
    // Installed once the server has loaded its tools: nothing declared it.
    executable(&project.path("bin/late"), "#!/bin/sh\nprintf '{}'\n");
    let answer = server.call("late_run", json!({ "args": {} }));
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    let text = answer["result"].to_string();
    assert!(
        text.contains("second line") && text.contains("read = [...]") && text.contains("late.run"),
        "{answer}"
    );
    server.close();
}

/// The log's checkpoint thread starts the first time the WAL needs copying into the file,
/// long after `run` confined itself to `ws/`; it is started by the log's writer thread,
/// which the second line never confines, so it still opens the log outside the roots: a
/// plan whose WAL passes `WAL_FRAMES_CHECKPOINT` frames has its pages copied into the file
/// while it runs (seen during its last step, which waits, so no closing of the log can have
/// copied them), and no checkpoint fails.
#[test]
fn the_checkpoint_thread_started_after_confinement_still_reaches_the_log() {
    let project = Project::new();
    if !second_line_enforced(&project) {
        eprintln!("Landlock is not enforced on this machine: nothing to check");
        return;
    }
    let one = project.plan(
        "one.json",
        &json!({"steps": [{"tool": "noop", "args": {}}]}),
    );
    let output = project.run(&["run", "--plan", one.to_str().expect("utf-8")]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let file_before = fs::metadata(project.db()).expect("the log").len();
    // About five frames a step: a WAL of some 3,000 frames, well past the thread's 1,000;
    // then a step that waits while the file is looked at.
    let mut steps: Vec<Value> = (0..600)
        .map(|_| json!({"tool": "noop", "args": {}}))
        .collect();
    steps.push(json!({"tool": "noop", "args": {"sleep_ms": 3000}}));
    let many = project.plan("many.json", &json!({ "steps": steps }));
    let mut running = project
        .command(&["run", "--plan", many.to_str().expect("utf-8")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starts");
    let copied_while_running = loop {
        let file_now = fs::metadata(project.db()).expect("the log").len();
        if file_now > 4 * file_before {
            break true;
        }
        if running.try_wait().expect("waits").is_some() {
            break false;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    let output = running.wait_with_output().expect("ends");
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !stderr.contains("checkpoint"),
        "a checkpoint failed or could not start: {stderr}"
    );
    assert!(
        copied_while_running,
        "the file stayed under four times its {file_before} bytes while the plan ran: no checkpoint copied the WAL"
    );
}
