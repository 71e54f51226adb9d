//! The real processes, SIGKILLed while they hold live sagas open, then `recover`: by the
//! stock `agent-kernel` binary, and by a program that has the custom tool.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use live_ledger::book_at;
use serde_json::Value;

/// The driver program of this package.
fn driver() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ledger-driver"))
}

/// The stock `agent-kernel` binary, built beside this package's binaries by
/// `cargo test --workspace`.
fn stock_binary() -> PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_ledger-driver"))
        .with_file_name(format!("agent-kernel{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.is_file(),
        "{} is missing: build it first (`cargo build -p agent-kernel-cli`; `cargo test --workspace` does)",
        bin.display()
    );
    bin
}

/// A folder with a policy allowing `ws/`, N files holding `old`, and a ledger of 100.
fn world(n_files: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir(dir.path().join("ws")).expect("ws");
    std::fs::write(dir.path().join("sandbox.toml"), "[fs]\nallow = [\"ws\"]\n").expect("policy");
    for file_idx in 0..n_files {
        std::fs::write(dir.path().join(format!("ws/file-{file_idx}")), "old").expect("file");
    }
    std::fs::write(
        dir.path().join("ledger.json"),
        r#"{"balance": 100, "entries": []}"#,
    )
    .expect("ledger");
    dir
}

/// Runs the driver holding `n_sagas` live sagas open, and SIGKILLs it once they are.
fn hold_and_kill(dir: &Path, n_sagas: usize, ledger: bool) {
    let mut command = driver();
    command
        .arg("hold")
        .arg(dir)
        .arg(n_sagas.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if ledger {
        command.arg("--ledger");
    }
    let mut child = command.spawn().expect("the driver starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("reads");
    assert_eq!(line.trim(), "ready", "the driver did not hold its sagas");
    child.kill().expect("SIGKILLs");
    child.wait().expect("reaps");
}

fn files(dir: &Path, n_files: usize) -> Vec<String> {
    (0..n_files)
        .map(|file_idx| {
            std::fs::read_to_string(dir.join(format!("ws/file-{file_idx}"))).expect("reads")
        })
        .collect()
}

fn stock(dir: &Path, args: &[&str]) -> (i32, Value) {
    let output = Command::new(stock_binary())
        .current_dir(dir)
        .env_remove("AGENT_KERNEL_DB")
        .env_remove("AGENT_KERNEL_AUDIT_KEY")
        .arg("--db")
        .arg(dir.join("agent-kernel.db"))
        .arg("--json")
        .args(args)
        .output()
        .expect("the binary runs");
    let document = serde_json::from_slice(&output.stdout).unwrap_or_else(|error| {
        panic!(
            "one JSON document ({error}): {}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    });
    (output.status.code().expect("exited"), document)
}

#[test]
fn a_process_killed_while_it_holds_live_sagas_open_is_recovered_by_the_stock_binary() {
    const N_SAGAS: usize = 4;
    let dir = world(N_SAGAS);
    hold_and_kill(dir.path(), N_SAGAS, false);
    assert!(files(dir.path(), N_SAGAS).iter().all(|file| file == "new"));
    let (code, report) = stock(dir.path(), &["recover"]);
    assert_eq!(code, 0, "{report}");
    let sagas = report["sagas"].as_array().expect("sagas");
    assert_eq!(sagas.len(), N_SAGAS, "{report}");
    assert!(
        sagas
            .iter()
            .all(|saga| saga["action"] == "rolled_back" && saga["state"] == "FailedRolledBack"),
        "{report}"
    );
    assert!(files(dir.path(), N_SAGAS).iter().all(|file| file == "old"));
    let (code, verified) = stock(dir.path(), &["audit", "verify"]);
    assert_eq!(code, 0, "{verified}");
}

#[test]
fn a_custom_tool_saga_is_left_untouched_by_the_stock_binary_and_recovered_by_its_program() {
    const N_SAGAS: usize = 2;
    let dir = world(N_SAGAS);
    hold_and_kill(dir.path(), N_SAGAS, true);
    assert_eq!(book_at(&dir.path().join("ledger.json")).balance, 102);
    let (_, before) = stock(dir.path(), &["log"]);

    // The stock binary has no `ledger.add`: it names the tool, exits 3, and changes nothing.
    let (code, report) = stock(dir.path(), &["recover"]);
    assert_eq!(code, 3, "{report}");
    for saga in report["sagas"].as_array().expect("sagas") {
        assert_eq!(saga["action"], "missing_tools", "{report}");
        assert_eq!(saga["tools"], serde_json::json!(["ledger.add"]), "{report}");
        let (_, record) = stock(
            dir.path(),
            &["log", "--saga", saga["saga_id"].as_str().expect("an id")],
        );
        assert_eq!(record["state"], "Acting", "{record}");
        assert!(
            record["steps"]
                .as_array()
                .expect("steps")
                .iter()
                .all(|step| step["status"] == "COMMIT"),
            "no step marked: {record}"
        );
    }
    let (_, after) = stock(dir.path(), &["log"]);
    assert_eq!(before, after, "the log's sagas are as they were");
    assert!(files(dir.path(), N_SAGAS).iter().all(|file| file == "new"));

    // The program that has the tool recovers them: files and ledger back.
    let output = driver()
        .arg("recover")
        .arg(dir.path())
        .output()
        .expect("runs");
    assert!(
        output.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(files(dir.path(), N_SAGAS).iter().all(|file| file == "old"));
    let book = book_at(&dir.path().join("ledger.json"));
    assert_eq!(book.balance, 100);
    assert!(book.entries.is_empty());
}
