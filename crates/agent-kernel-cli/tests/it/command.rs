//! Command tools (reference §7): programs declared in `tools.toml`, run by the real binary,
//! compensated through the programs, after a failure and after a SIGKILL.

use std::fs;
use std::process::Stdio;

use serde_json::{Value, json};

use crate::{Project, describe};

/// A Python program behind every test tool: its item list lives in `ws/items.json`.
const TOOL_PY: &str = r#"
import json, os, pathlib, subprocess, sys, time
request = json.load(sys.stdin)
phase, args, mode = request["phase"], request["args"], sys.argv[1]
store = pathlib.Path("ws/items.json")
items = json.loads(store.read_text()) if store.exists() else []
def save():
    temp = store.with_suffix(".tmp")
    temp.write_text(json.dumps(items))
    os.replace(temp, store)
if mode == "flaky" and phase == "execute":
    counter = pathlib.Path("ws/attempts-" + request["tool"])
    attempts = int(counter.read_text()) + 1 if counter.exists() else 1
    counter.write_text(str(attempts))
    if attempts == 1:
        print("busy, try again", file=sys.stderr)
        sys.exit(75)
if mode == "chatty" and phase == "execute":
    sys.stderr.write("x" * 300000 + "\nLAST LINE\n")
    sys.stdout.write("y" * (100000 if args.get("loud") else 0))
    sys.exit(0 if args.get("loud") else 3)
if mode == "slow" and phase == "execute":
    child = subprocess.Popen(["sleep", "60"])
    pathlib.Path("ws/grandchild.pid").write_text(str(child.pid))
    time.sleep(60)
if phase == "execute":
    if args.get("fail"):
        print("refused on purpose", file=sys.stderr)
        sys.exit(3)
    items.append(args["item"])
    save()
    print(json.dumps({"count": len(items)}))
elif phase == "compensate":
    if args.get("item") in items:
        items.remove(args["item"])
        save()
"#;

const TOOLS_TOML: &str = r#"
[tools."item.add"]
description = "Add an item to ws/items.json"
effect = "mutating"
settlement = "compensate"
execute = ["python3", "tool.py", "add"]
compensate = ["python3", "tool.py", "add"]
args_schema = { type = "object", properties = { item = { type = "string" }, fail = { type = "boolean" } } }

[tools."slow.add"]
effect = "mutating"
settlement = "compensate"
reversibility = "partial"
undo_window = "36h"
timeout_ms = 2000
execute = ["python3", "tool.py", "slow"]
compensate = ["python3", "tool.py", "slow"]

[tools."chatty.add"]
effect = "mutating"
settlement = "compensate"
timeout_ms = 60000
execute = ["python3", "tool.py", "chatty"]
compensate = ["python3", "tool.py", "chatty"]

[tools."flaky.idem"]
effect = "mutating"
idempotent = true
settlement = "compensate"
execute = ["python3", "tool.py", "flaky"]
compensate = ["python3", "tool.py", "flaky"]

[tools."flaky.once"]
effect = "mutating"
idempotent = false
settlement = "compensate"
execute = ["python3", "tool.py", "flaky"]
compensate = ["python3", "tool.py", "flaky"]

[tools."mail.send"]
description = "Send a mail; it cannot be unsent"
effect = "mutating"
settlement = "operator"
reversibility = "none"
execute = ["python3", "tool.py", "add"]
"#;

/// A project with the test tools in `tools.toml` (found as `./tools.toml`).
fn project() -> Project {
    let project = Project::new();
    fs::write(project.path("tool.py"), TOOL_PY).expect("writes the program");
    fs::write(project.path("tools.toml"), TOOLS_TOML).expect("writes the tools file");
    project
}

fn items(project: &Project) -> Value {
    fs::read(project.path("ws/items.json"))
        .map(|bytes| serde_json::from_slice(&bytes).expect("JSON"))
        .unwrap_or_else(|_| json!([]))
}

fn run_plan(project: &Project, steps: Value) -> (i32, Value) {
    let plan = project.plan("plan.json", &json!({ "steps": steps }));
    project.run_json(&["run", "--plan", plan.to_str().expect("utf8")])
}

#[test]
fn a_plan_of_command_tools_failing_at_its_last_step_is_compensated_through_the_programs() {
    let project = project();
    let (code, report) = run_plan(
        &project,
        json!([
            { "tool": "item.add", "args": { "item": "a" } },
            { "tool": "item.add", "args": { "item": "b" } },
            { "tool": "item.add", "args": { "item": "c", "fail": true } },
        ]),
    );
    assert_eq!(code, 1, "{report}");
    assert_eq!(report["state"], "FailedRolledBack", "{report}");
    let statuses: Vec<&str> = report["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|step| step["status"].as_str().expect("status"))
        .collect();
    assert_eq!(statuses, ["COMPENSATED", "COMPENSATED", "FAIL"], "{report}");
    assert!(
        report["failure"]["error"]["message"]
            .as_str()
            .expect("a message")
            .contains("refused on purpose"),
        "the last line of stderr is the message: {report}"
    );
    assert_eq!(items(&project), json!([]));
    // The outputs the programs printed are the steps' outputs.
    let (code, done) = run_plan(
        &project,
        json!([{ "tool": "item.add", "args": { "item": "kept" } }]),
    );
    assert_eq!(code, 0, "{done}");
    assert_eq!(
        done["steps"][0]["output"]["data"],
        json!({ "count": 1 }),
        "{done}"
    );
}

#[test]
fn after_a_sigkill_recover_compensates_through_the_programs_from_the_log_alone() {
    let project = project();
    let plan = project.plan(
        "slow.json",
        &json!({ "steps": [
            { "tool": "item.add", "args": { "item": "a" } },
            { "tool": "item.add", "args": { "item": "b" } },
            { "tool": "noop", "args": { "sleep_ms": 60000 } },
        ]}),
    );
    let mut runner = project
        .command(&["run", "--plan", plan.to_str().expect("utf8")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawns");
    crate::wait_until("the programs never added both items", || {
        items(&project) == json!(["a", "b"])
    });
    crate::sigkill(&mut runner).expect("SIGKILLs");
    runner.wait().expect("reaps");
    let (code, report) = project.run_json(&["recover"]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["sagas"][0]["action"], "rolled_back", "{report}");
    assert_eq!(items(&project), json!([]));
}

#[test]
fn a_timeout_kills_the_whole_process_group() {
    let project = project();
    let (code, report) = run_plan(&project, json!([{ "tool": "slow.add", "args": {} }]));
    assert_eq!(code, 1, "{report}");
    assert!(
        report["failure"]["error"]["message"]
            .as_str()
            .expect("a message")
            .contains("no result after 2000 ms"),
        "{report}"
    );
    let pid: u32 = fs::read_to_string(project.path("ws/grandchild.pid"))
        .expect("the program started its own child")
        .trim()
        .parse()
        .expect("a pid");
    // Killed with its group: gone, or a zombie for init to reap.
    crate::wait_until("the grandchild outlived the timeout", || {
        fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
            stat.rsplit(')')
                .next()
                .is_some_and(|rest| rest.trim_start().starts_with('Z'))
        })
    });
}

#[test]
fn exit_75_is_retried_only_for_idempotent_tools() {
    let project = project();
    let (code, report) = run_plan(
        &project,
        json!([{ "tool": "flaky.idem", "args": { "item": "i" } }]),
    );
    assert_eq!(code, 0, "{report}");
    assert_eq!(
        fs::read_to_string(project.path("ws/attempts-flaky.idem")).expect("counted"),
        "2"
    );
    let (code, report) = run_plan(
        &project,
        json!([{ "tool": "flaky.once", "args": { "item": "o" } }]),
    );
    assert_eq!(code, 1, "{report}");
    assert_eq!(
        fs::read_to_string(project.path("ws/attempts-flaky.once")).expect("counted"),
        "1",
        "a tool that is not idempotent is never retried"
    );
    assert_eq!(items(&project), json!(["i"]));
}

#[test]
fn a_malformed_tools_file_is_bad_input_naming_the_line() {
    let cases: &[(&str, &str)] = &[
        (
            "[tools.\"x.y\"]\neffect = \"mutating\"\nsettlement = \"compensate\"\nexecute = [\"true\"]\n",
            "line 1",
        ),
        (
            "[tools.\"x.y\"]\neffect = \"read-only\"\nsettlement = \"compensate\"\nexecute = [\"true\"]\ncolour = \"red\"\n",
            "unknown field `colour`",
        ),
        (
            "\n\n[tools.\"x.y\"]\neffect = \"read-only\"\nsettlement = \"probe\"\nexecute = [\"true\"]\n",
            "line 3",
        ),
        (
            "[tools.\"fs.write\"]\neffect = \"read-only\"\nsettlement = \"compensate\"\nexecute = [\"true\"]\n",
            "built-in",
        ),
        ("[tools.\"x.y\"\n", "line 1"),
        (
            "[tools.\"x.y\"]\neffect = \"mutating\"\nexecute = [\"true\"]\ncompensate = [\"true\"]\n",
            "needs `settlement`",
        ),
        (
            "[tools.\"x.y\"]\neffect = \"read-only\"\nexecute = [\"true\"]\nread = [\"no-such-folder\"]\n",
            "`read` names `no-such-folder`",
        ),
        (
            "[tools.\"x.y\"]\neffect = \"read-only\"\nsettlement = \"compensate\"\nexecute = [\"true\"]\nundo_window = \"7w\"\n",
            "`7w` is not a duration",
        ),
        (
            "[tools.\"x.y\"]\neffect = \"read-only\"\nsettlement = \"compensate\"\nexecute = [\"true\"]\nundo_window = \"400d\"\n",
            "out of range",
        ),
        (
            "[tools.\"x.y\"]\neffect = \"read-only\"\nsettlement = \"compensate\"\nexecute = [\"true\"]\nreversibility = \"mostly\"\n",
            "unknown variant `mostly`",
        ),
    ];
    for (text, fragment) in cases {
        let project = Project::new();
        fs::write(project.path("tools.toml"), text).expect("writes");
        let output = project.run(&["--json", "tools"]);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{text}: {}",
            describe(&output)
        );
        let document: Value = serde_json::from_slice(&output.stdout).expect("one document");
        let message = document["error"]["message"].as_str().expect("a message");
        assert!(message.contains(fragment), "{text}: {message}");
        assert!(message.contains("tools.toml"), "{message}");
    }
}

#[test]
fn a_program_that_writes_a_lot_neither_hangs_nor_floods_the_log() {
    let project = project();
    // 300 kB of stderr, then a failure: its last line is the message, at once.
    let (code, report) = run_plan(&project, json!([{ "tool": "chatty.add", "args": {} }]));
    assert_eq!(code, 1, "{report}");
    let message = report["failure"]["error"]["message"]
        .as_str()
        .expect("a message");
    assert!(
        message.contains("LAST LINE") && message.contains("exited 3"),
        "{message}"
    );
    // 100 kB of stdout, past the policy's max_io_bytes (65,536): refused, outcome unknown.
    let (code, report) = run_plan(
        &project,
        json!([{ "tool": "chatty.add", "args": { "loud": true } }]),
    );
    assert_eq!(code, 1, "{report}");
    let message = report["failure"]["error"]["message"]
        .as_str()
        .expect("a message");
    assert!(message.contains("over 65536 bytes"), "{message}");
}

#[test]
fn tools_lists_each_tools_reversibility_window_and_description() {
    let project = project();
    let listed = |project: &Project| {
        let (code, document) = project.run_json(&["tools"]);
        assert_eq!(code, 0, "{document}");
        document
    };
    let find = |document: &Value, id: &str| {
        document["tools"]
            .as_array()
            .expect("tools")
            .iter()
            .find(|tool| tool["tool"] == id)
            .unwrap_or_else(|| panic!("{id} listed in {document}"))
            .clone()
    };
    let document = listed(&project);
    let row = |id: &str| find(&document, id);
    assert_eq!(document["limits"]["undo_window"], "7d");
    let item = row("item.add");
    assert_eq!(item["reversibility"], "full");
    assert_eq!(item["undo_window"], "7d", "the [limits] default");
    assert_eq!(item["description"], "Add an item to ws/items.json");
    let slow = row("slow.add");
    assert_eq!(slow["reversibility"], "partial");
    assert_eq!(slow["undo_window"], "36h", "its own window");
    let mail = row("mail.send");
    assert_eq!(mail["reversibility"], "none");
    assert_eq!(mail["undo_window"], Value::Null, "nothing to undo");
    assert_eq!(
        mail["needs_approval"], true,
        "irreversible: every call waits"
    );
    assert_eq!(item["needs_approval"], false);
    assert_eq!(row("fs.write")["reversibility"], "full");
    assert_eq!(row("fs.write")["undo_window"], "7d");
    assert_eq!(row("fs.read")["undo_window"], Value::Null, "reads only");
    assert!(
        row("fs.delete")["description"]
            .as_str()
            .is_some_and(|text| text.contains("previous bytes")),
        "built-in tools describe themselves"
    );

    // `[limits] undo_window` is the window of every tool without its own.
    let policy = project.path("sandbox.toml");
    let mut text = fs::read_to_string(&policy).expect("a policy");
    text.push_str("\n[limits]\nundo_window = \"90s\"\n");
    fs::write(&policy, &text).expect("writes");
    let document = listed(&project);
    let row = |id: &str| find(&document, id);
    assert_eq!(document["limits"]["undo_window"], "90s");
    assert_eq!(row("item.add")["undo_window"], "90s");
    assert_eq!(row("slow.add")["undo_window"], "36h");

    // A malformed window is bad input naming the setting.
    fs::write(&policy, text.replace("\"90s\"", "\"90\"")).expect("writes");
    let output = project.run(&["--json", "tools"]);
    assert_eq!(output.status.code(), Some(2), "{}", describe(&output));
    let document: Value = serde_json::from_slice(&output.stdout).expect("one document");
    let message = document["error"]["message"].as_str().expect("a message");
    assert!(message.contains("`90` is not a duration"), "{message}");

    // The table says the same.
    fs::write(&policy, &text).expect("writes");
    let output = project.run(&["tools"]);
    let table = String::from_utf8(output.stdout).expect("utf8");
    assert!(
        table.contains("reversibility") && table.contains("undo window"),
        "{table}"
    );
    assert!(
        table.contains("partial") && table.contains("36h"),
        "{table}"
    );
}
