//! Group commit under SIGKILL (issue 14): one `agent-kernel mcp` process drives 32 sagas at
//! once (their steps pipelined, so their records share transactions), killed at random
//! moments; after `recover`, every saga is `Done` with every file it wrote, or rolled back
//! with none of them; no file exists that no saga accounts for; the chain verifies.

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use crate::{Project, seed_from_env};

/// Sagas driven at once.
const SAGAS: usize = 32;
/// Steps of each saga.
const STEPS: usize = 3;
/// Kills by default (`AGENT_KERNEL_GROUP_KILLS` sets another number).
const KILLS: usize = 50;

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % n
    }
}

/// How long the killer waits for the server to answer `initialize` before it kills anyway.
const READY_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Drives the sagas until the server dies (or they are all committed). The kill lands
/// `kill_after` the server answered `initialize`, so that a slow start (a loaded machine)
/// does not turn every kill into one before any saga began.
fn drive(project: &Project, round: usize, kill_after: std::time::Duration) {
    let mut child = project
        .command(&["-q", "mcp"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawns");
    let pid = child.id();
    let (ready, started) = std::sync::mpsc::channel::<()>();
    let killer = std::thread::spawn(move || {
        // A server that never answers (or died) is killed all the same.
        let _ = started.recv_timeout(READY_WAIT);
        std::thread::sleep(kill_after);
        // It may have finished already: then there is nothing to kill.
        let _ = Command::new("kill")
            .args(["-9", &pid.to_string()])
            .stderr(Stdio::null())
            .status();
    });
    let stdin = child.stdin.take().expect("stdin");
    let stdout = child.stdout.take().expect("stdout");
    converse(stdin, stdout, round, &ready);
    drop(ready);
    // Every path ends here: stdin is closed, and the killer ends the
    // server at the latest, so the child is always reaped.
    let _ = child.wait();
    let _ = killer.join();
}

/// Speaks JSON-RPC to the server until every saga is committed or the
/// server is gone (killed); returns early on the first failed read. Says on `ready` when
/// the server has answered `initialize`.
fn converse(
    mut stdin: std::process::ChildStdin,
    stdout: std::process::ChildStdout,
    round: usize,
    ready: &std::sync::mpsc::Sender<()>,
) {
    let mut stdout = BufReader::new(stdout);
    let mut send = |message: Value| writeln!(stdin, "{message}").is_ok();
    let mut answers = |n: usize| -> Option<Vec<Value>> {
        let mut got = Vec::new();
        while got.len() < n {
            let mut line = String::new();
            if stdout.read_line(&mut line).ok()? == 0 {
                return None;
            }
            let message: Value = serde_json::from_str(&line).ok()?;
            if message.get("id").is_some() {
                got.push(message);
            }
        }
        Some(got)
    };
    let init = json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "crash", "version": "1"}});
    if !send(json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init})) {
        return;
    }
    if answers(1).is_none() {
        return;
    }
    let _ = ready.send(());
    send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    let call = |id: usize, name: &str, arguments: Value| json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": arguments}});
    for saga in 0..SAGAS {
        send(call(
            1 + saga,
            "saga_begin",
            json!({"name": format!("{round}-{saga}")}),
        ));
    }
    let Some(begun) = answers(SAGAS) else { return };
    let mut ids = BTreeMap::new();
    for answer in begun {
        let saga = answer["id"].as_u64().expect("an id") as usize - 1;
        ids.insert(
            saga,
            answer["result"]["structuredContent"]["saga_id"].clone(),
        );
    }
    let mut next_id = 1000;
    for step in 0..STEPS {
        for (saga, saga_id) in &ids {
            next_id += 1;
            let path = format!("ws/{round}-{saga}-{step}.txt");
            let args = json!({"saga_id": saga_id, "args": {"path": path, "content": path}});
            send(call(next_id, "fs_write", args));
        }
        if answers(SAGAS).is_none() {
            return;
        }
    }
    for saga_id in ids.values() {
        next_id += 1;
        send(call(next_id, "saga_commit", json!({"saga_id": saga_id})));
    }
    let _ = answers(SAGAS);
}

/// The `(name, state)` of every saga of `round` in the log. A kill can land before the
/// server has created the log (or committed its schema): then there are none.
fn sagas_of_round(project: &Project, round: usize) -> Vec<(String, String)> {
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY;
    let Ok(conn) = rusqlite::Connection::open_with_flags(project.db(), flags) else {
        return Vec::new();
    };
    let has_table: bool = conn
        .query_row(
            "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'sagas'",
            [],
            |row| row.get(0),
        )
        .expect("reads the schema");
    if !has_table {
        return Vec::new();
    }
    let mut statement = conn
        .prepare("SELECT name, state FROM sagas WHERE name LIKE ?1")
        .expect("prepares");
    statement
        .query_map([format!("{round}-%")], |row| Ok((row.get(0)?, row.get(1)?)))
        .expect("queries")
        .collect::<Result<_, _>>()
        .expect("reads")
}

#[test]
fn sigkill_among_concurrent_sagas_then_recover_leaves_no_saga_half_done() {
    let seed = seed_from_env("AGENT_KERNEL_GROUP_SEED");
    let kills = std::env::var("AGENT_KERNEL_GROUP_KILLS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(KILLS);
    eprintln!(
        "group commit crash test: seed {seed} (AGENT_KERNEL_GROUP_SEED={seed} reproduces), {kills} kills"
    );
    let mut rng = Rng(seed);
    let project = Project::new();
    let mut n_done = 0;
    let mut n_rolled_back = 0;
    for round in 0..kills {
        drive(
            &project,
            round,
            std::time::Duration::from_millis(rng.below(120)),
        );
        let output = project.run(&["recover"]);
        assert_eq!(
            output.status.code(),
            Some(0),
            "seed {seed} round {round}: {}",
            crate::describe(&output)
        );
        // Every saga of the round: Done with all its files, or rolled back with none.
        let sagas = sagas_of_round(&project, round);
        let mut named = std::collections::BTreeSet::new();
        for (name, state) in &sagas {
            named.insert(name.clone());
            let present: Vec<bool> = (0..STEPS)
                .map(|step| project.path(&format!("ws/{name}-{step}.txt")).exists())
                .collect();
            match state.as_str() {
                "Done" => {
                    n_done += 1;
                    assert!(
                        present.iter().all(|p| *p),
                        "seed {seed}: Done saga {name} lacks a file: {present:?}"
                    );
                }
                "FailedRolledBack" => {
                    n_rolled_back += 1;
                    assert!(
                        present.iter().all(|p| !*p),
                        "seed {seed}: rolled-back saga {name} left a file: {present:?}"
                    );
                }
                other => panic!("seed {seed}: saga {name} is {other} after recover"),
            }
        }
        // No file that no saga accounts for: no effect ran before its BEGIN was durable.
        for entry in fs::read_dir(project.path("ws")).expect("lists").flatten() {
            let file = entry.file_name().to_string_lossy().into_owned();
            if let Some(rest) = file.strip_prefix(&format!("{round}-")) {
                let saga = rest.rsplit_once('-').map(|(saga, _)| saga).unwrap_or(rest);
                assert!(
                    named.contains(&format!("{round}-{saga}")),
                    "seed {seed}: {file} belongs to no saga in the log"
                );
            }
        }
    }
    eprintln!("group commit crash test: {n_done} sagas done, {n_rolled_back} rolled back");
    assert!(n_rolled_back > 0, "seed {seed}: no kill landed mid-saga");
    let (code, audit) = project.run_json(&["audit", "verify"]);
    assert_eq!(code, 0, "seed {seed}: {audit}");
}
