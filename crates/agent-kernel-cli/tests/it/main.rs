//! End-to-end tests of the `agent-kernel` binary: real processes, real files, real SQLite,
//! real SIGKILLs.

mod approvals;
mod audit;
mod bad_input;
mod command;
mod config;
mod console;
mod crash;
mod creation;
mod dlq;
mod docs;
mod export;
mod fsm;
mod group_crash;
mod http;
mod integrations;
mod isolation;
mod kill_rounds;
mod layering;
mod least_privilege;
mod leftovers;
mod mcp;
mod otlp;
mod postgres;
mod postgres_restart;
mod postgres_trust;
mod prune;
mod recovery_kills;
mod replay;
mod run;
mod storage;
mod tamper;
mod undo;
mod upstream;
mod upstream_isolation;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// How long a test waits for a spawned binary to reach a point it watches for.
const WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(20);

/// Polls `done` every few milliseconds until it holds; fails with `what` after `WAIT_MAX`.
#[track_caller]
pub(crate) fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + WAIT_MAX;
    while !done() {
        assert!(std::time::Instant::now() < deadline, "{what}");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// The file each SIGKILL of a running process is counted in, one line each, when set: CI
/// sets it and prints the total (the eval suite counts its kills in the same file).
pub(crate) const KILL_TALLY_VARIABLE: &str = "AGENT_KERNEL_KILL_TALLY";

/// SIGKILLs `child` (`Child::kill` sends SIGKILL on Unix) and, when it was still running,
/// counts the kill in the file `AGENT_KERNEL_KILL_TALLY` names.
///
/// # Errors
///
/// As `Child::kill`.
pub(crate) fn sigkill(child: &mut std::process::Child) -> std::io::Result<()> {
    let running = child.try_wait()?.is_none();
    child.kill()?;
    if running {
        tally_kill();
    }
    Ok(())
}

/// Counts one SIGKILL of a running process in the file `AGENT_KERNEL_KILL_TALLY` names,
/// when it is set.
pub(crate) fn tally_kill() {
    if let Some(path) = std::env::var_os(KILL_TALLY_VARIABLE) {
        use std::io::Write as _;
        // One short append per kill: atomic, so tests killing at once never mix lines.
        let appended = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut tally| tally.write_all(b"sigkill\n"));
        appended.expect("the kill tally can be appended to");
    }
}

/// The seed of a randomized test: `$VAR` when set (to replay a run), else from the clock.
pub(crate) fn seed_from_env(var: &str) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("after 1970")
                .as_nanos() as u64
        })
}

/// SQL both backends run that counts the rows of the log's view `held_locks` (a resource
/// claimed again by an undo, or declared by a begun step of a saga that is not settled; a
/// resource two steps of one saga declared twice): zero exactly when no lock is held.
pub(crate) const HELD_LOCKS_SQL: &str = "SELECT COUNT(*) FROM held_locks";

/// The exit code of a finished binary and the one JSON document it printed on stdout.
#[track_caller]
pub(crate) fn json_output(output: &Output) -> (i32, Value) {
    let code = output.status.code().expect("exited normally");
    let document = serde_json::from_slice(&output.stdout).unwrap_or_else(|err| {
        panic!(
            "stdout is not one JSON document ({err}):\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    });
    (code, document)
}

/// The binary under test.
pub(crate) fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_agent-kernel"))
}

/// A scratch project: a folder with `sandbox.toml` allowing `ws/`, and a log path.
pub(crate) struct Project {
    pub(crate) dir: tempfile::TempDir,
}

impl Project {
    pub(crate) fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        fs::create_dir(dir.path().join("ws")).expect("creates ws");
        fs::write(
            dir.path().join("sandbox.toml"),
            "[fs]\nallow = [\"ws\"]\ndeny_names = [\".env\", \"*.pem\"]\nmax_io_bytes = 65536\n",
        )
        .expect("writes policy");
        Self { dir }
    }

    pub(crate) fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub(crate) fn db(&self) -> PathBuf {
        self.path("log.db")
    }

    /// Writes a plan file and returns its path.
    pub(crate) fn plan(&self, name: &str, plan: &Value) -> PathBuf {
        let path = self.path(name);
        fs::write(&path, serde_json::to_vec_pretty(plan).expect("serializes")).expect("writes");
        path
    }

    /// A command running `program` in the project folder, without the environment variables
    /// that would change what the binary does (`AGENT_KERNEL_DB`, `AGENT_KERNEL_AUDIT_KEY`,
    /// `RUST_LOG`).
    pub(crate) fn isolated(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new(program);
        command
            .current_dir(self.dir.path())
            .env_remove("AGENT_KERNEL_DB")
            .env_remove("AGENT_KERNEL_AUDIT_KEY")
            .env_remove("RUST_LOG")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .env_remove("OTEL_SDK_DISABLED");
        command
    }

    /// A command running the binary in the project folder on the project's log.
    pub(crate) fn command(&self, args: &[&str]) -> Command {
        let mut command = self.isolated(bin());
        command.arg("--db").arg(self.db()).args(args);
        command
    }

    /// The id and state of the most recent saga, if any.
    pub(crate) fn latest_saga(&self) -> Option<(String, String)> {
        let (code, document) = self.run_json(&["log", "--limit", "1"]);
        assert_eq!(code, 0, "{document}");
        document["sagas"]
            .as_array()
            .expect("sagas")
            .first()
            .map(|saga| {
                (
                    saga["saga_id"].as_str().expect("id").to_owned(),
                    saga["state"].as_str().expect("state").to_owned(),
                )
            })
    }

    /// Runs the binary to completion.
    pub(crate) fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("the binary runs")
    }

    /// Runs the binary with `--json` and parses its one JSON document.
    pub(crate) fn run_json(&self, args: &[&str]) -> (i32, Value) {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        json_output(&self.run(&all))
    }

    /// Every file under `ws/`, by relative path, with its bytes.
    pub(crate) fn snapshot(&self) -> BTreeMap<String, Vec<u8>> {
        let mut files = BTreeMap::new();
        let root = self.path("ws");
        let mut stack = vec![root.clone()];
        while let Some(dir) = stack.pop() {
            for entry in fs::read_dir(&dir).expect("lists") {
                let entry = entry.expect("entry");
                let path = entry.path();
                if entry.file_type().expect("type").is_dir() {
                    stack.push(path);
                } else {
                    let rel = path
                        .strip_prefix(&root)
                        .expect("under root")
                        .to_string_lossy()
                        .into_owned();
                    files.insert(rel, fs::read(&path).expect("reads"));
                }
            }
        }
        files
    }
}

/// The stdout and stderr of a finished command, for failure messages.
pub(crate) fn describe(output: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}
