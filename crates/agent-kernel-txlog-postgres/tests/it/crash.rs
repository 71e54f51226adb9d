//! The server killed: every write a worker was answered for is in the log after the server
//! restarts, whether its transaction committed through the flush or let go of the write
//! lock before it. Runs a server of its own (the suite's is shared, and never killed): the
//! machine's PostgreSQL binaries, as the `postgres` user, which needs root.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_kernel_api::{Owner, TxLog};
use agent_kernel_log_contract::records::done_saga_declaring;
use agent_kernel_txlog_postgres::{PostgresLog, Worker};

use crate::{open_as, server};

/// How long the drill waits for its writers, or for its server, before it fails.
const WAIT_MAX: Duration = Duration::from_secs(60);

/// Writes answered before the server is killed, at least.
const ANSWERED_BEFORE_KILL: u64 = 400;

/// Writers, each a process of its own to the log (its own connection and lease).
const WRITERS: u32 = 4;

/// The newest PostgreSQL server binaries of the machine, as `tests/postgres/server.sh`
/// finds them.
fn server_binaries() -> Option<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry.file_name().to_str()?.parse().ok()?;
            Some((version, entry.path().join("bin")))
        })
        .filter(|(_, bin)| bin.join("initdb").is_file())
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

/// Runs `program` of `bin` as the `postgres` user.
fn as_postgres(bin: &Path, program: &str, args: &[&str]) {
    if let Err(failed) = try_as_postgres(bin, program, args) {
        panic!("{failed}");
    }
}

/// [`as_postgres`], saying what went wrong instead of panicking.
fn try_as_postgres(bin: &Path, program: &str, args: &[&str]) -> Result<(), String> {
    let output = Command::new("runuser")
        .args(["-u", "postgres", "--"])
        .arg(bin.join(program))
        .args(args)
        .current_dir("/")
        .output()
        .expect("runs runuser");
    if output.status.success() {
        return Ok(());
    }
    Err(format!(
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    ))
}

/// A cluster of this test's own, in a folder the `postgres` user owns, served on a Unix
/// socket in that folder alone (no TCP port, which another test's connection could have
/// taken); stopped at once and removed when dropped.
struct Cluster {
    bin: PathBuf,
    dir: PathBuf,
}

impl Cluster {
    fn create(bin: PathBuf) -> Cluster {
        let dir = std::env::temp_dir().join(format!("ak-crash-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("creates the folder");
        let chown = Command::new("chown")
            .args(["postgres:postgres", dir.to_str().expect("a UTF-8 path")])
            .status()
            .expect("runs chown");
        assert!(chown.success(), "chown");
        let data = dir.join("data");
        as_postgres(
            &bin,
            "initdb",
            &[
                "-D",
                data.to_str().expect("a UTF-8 path"),
                "-A",
                "trust",
                "-U",
                "ak",
                "--no-sync",
            ],
        );
        let cluster = Cluster { bin, dir };
        cluster.start();
        cluster
    }

    fn data(&self) -> String {
        self.dir
            .join("data")
            .to_str()
            .expect("a UTF-8 path")
            .to_owned()
    }

    fn start(&self) {
        let options = format!(
            "-c listen_addresses='' -c unix_socket_directories={} -c fsync=on",
            self.dir.display()
        );
        let log = self.dir.join("server.log");
        let started = try_as_postgres(
            &self.bin,
            "pg_ctl",
            &[
                "-D",
                &self.data(),
                "-o",
                &options,
                "-l",
                log.to_str().expect("a UTF-8 path"),
                "-w",
                "start",
            ],
        );
        if let Err(failed) = started {
            // What the server said: the reason is in its log, not in pg_ctl's answer.
            let said = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = said.lines().rev().take(20).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            panic!("{failed}\nthe server's log ends:\n{}", tail.join("\n"));
        }
    }

    fn url(&self) -> String {
        // The socket's folder as the host, percent-encoded.
        let host = self.dir.to_str().expect("a UTF-8 path").replace('/', "%2F");
        format!("postgres://ak@{host}/postgres")
    }

    /// SIGKILL to the server and every process of it at once (its process group): what
    /// its shared memory held, the WAL not yet written among it, is gone.
    fn kill(&self) {
        let pid_file = std::fs::read_to_string(self.dir.join("data/postmaster.pid"))
            .expect("reads postmaster.pid");
        let pid: i32 = pid_file
            .lines()
            .next()
            .and_then(|line| line.trim().parse().ok())
            .expect("the server's pid");
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("reads its stat");
        // Fields after the command's closing parenthesis: state, ppid, pgrp.
        let after = &stat[stat.rfind(')').expect("a stat line") + 2..];
        let group: i32 = after
            .split(' ')
            .nth(2)
            .and_then(|field| field.parse().ok())
            .expect("its process group");
        assert_eq!(group, pid, "the server leads its own process group");
        let killed = Command::new("kill")
            .args(["-KILL", "--", &format!("-{group}")])
            .status()
            .expect("runs kill");
        assert!(killed.success(), "kill");
        // Every process of the group gone, or a zombie where nothing reaps it: either way
        // it holds nothing more. A backend still exiting would still hold the shared memory
        // the next server refuses to start beside.
        let living_in_group = || {
            std::fs::read_dir("/proc")
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|entry| std::fs::read_to_string(entry.path().join("stat")).ok())
                .any(|stat| {
                    let Some(close) = stat.rfind(')') else {
                        return false;
                    };
                    let fields: Vec<&str> = stat[close + 2..].split(' ').collect();
                    fields.get(2) == Some(&group.to_string().as_str())
                        && fields.first() != Some(&"Z")
                })
        };
        let deadline = Instant::now() + WAIT_MAX;
        while living_in_group() {
            assert!(Instant::now() < deadline, "the server outlived its SIGKILL");
            std::thread::yield_now();
        }
        // A zombie's pid would keep the next server from starting: the data folder's lock
        // and the socket's name it.
        std::fs::remove_file(self.dir.join("data/postmaster.pid")).expect("removes the pid file");
        for entry in std::fs::read_dir(&self.dir).expect("lists the socket's folder") {
            let path = entry.expect("an entry").path();
            let name = path
                .file_name()
                .and_then(|name| name.to_str())
                .unwrap_or("");
            if name.starts_with(".s.PGSQL.") && name.ends_with(".lock") {
                std::fs::remove_file(&path).expect("removes the socket's lock file");
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bin.join("pg_ctl"))
            .args(["-D", &self.data(), "-m", "immediate", "stop"])
            .current_dir("/")
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether this process runs as root (its effective uid), which `runuser` needs.
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .find_map(|line| line.strip_prefix("Uid:"))
            .and_then(|uids| uids.split_whitespace().nth(1))
            == Some("0")
    })
}

fn writer(n: u32) -> Worker {
    Worker::new(Owner {
        host: "crash-host".into(),
        boot_id: "crash-boot".into(),
        pid: 1000 + n,
        start_ticks: 1,
    })
}

#[tokio::test]
async fn every_write_answered_before_the_server_was_killed_is_in_the_log_after_it_restarts() {
    // Only where the PostgreSQL suites run (`.ci/run`, as root): the machine's binaries.
    if server().is_none() {
        return;
    }
    if !is_root() {
        eprintln!("skipped: starting a server of its own takes root (runuser)");
        return;
    }
    let Some(bin) = server_binaries() else {
        panic!(
            "no PostgreSQL server binaries under /usr/lib/postgresql (tests/postgres/server.sh installs them)"
        );
    };
    let cluster = Cluster::create(bin);
    let url = cluster.url();
    let logs: Vec<Arc<PostgresLog>> = crate::blocking(|| {
        (0..WRITERS)
            .map(|n| Arc::new(open_as(&url, writer(n)).expect("opens")))
            .collect()
    });
    let answered = Arc::new(Mutex::new(Vec::new()));
    let n_answered = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = logs
        .iter()
        .enumerate()
        .map(|(n, log)| {
            let (log, answered, n_answered, stop) = (
                log.clone(),
                answered.clone(),
                n_answered.clone(),
                stop.clone(),
            );
            tokio::spawn(async move {
                let mut at = 0;
                while !stop.load(Ordering::Relaxed) {
                    let id = format!("w{n}-{at}");
                    at += 1;
                    if log.write(done_saga_declaring(&id)).await.is_err() {
                        // Its outcome unknown: this writer stops, as a worker's saga does.
                        return;
                    }
                    answered.lock().expect("not poisoned").push(id);
                    n_answered.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    // Kill it in the midst of writes, once some let go of the lock before their flush.
    let deadline = Instant::now() + WAIT_MAX;
    while n_answered.load(Ordering::Relaxed) < ANSWERED_BEFORE_KILL
        || logs.iter().all(|log| log.stats().flushed_after == 0)
    {
        assert!(
            Instant::now() < deadline,
            "the writers never wrote {ANSWERED_BEFORE_KILL} sagas with a flush after the lock: {:?}",
            logs.iter().map(|log| log.stats()).collect::<Vec<_>>()
        );
        // Looked at every few milliseconds, leaving the cores to the writers and the server.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    crate::blocking(|| cluster.kill());
    let killed_at = n_answered.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        writer.await.expect("ran");
    }
    drop(logs);
    crate::blocking(|| cluster.start());
    let answered = answered.lock().expect("not poisoned").clone();
    let done: std::collections::HashSet<String> = crate::blocking(|| {
        let mut client = postgres::Client::connect(&url, postgres::NoTls).expect("connects");
        client
            .query("SELECT saga_id FROM sagas WHERE state = 'Done'", &[])
            .expect("reads")
            .into_iter()
            .map(|row| row.get(0))
            .collect()
    });
    let lost: Vec<&String> = answered.iter().filter(|id| !done.contains(*id)).collect();
    assert!(
        lost.is_empty(),
        "{} of {} writes answered were lost with the server ({killed_at} answered at the kill): {lost:?}",
        lost.len(),
        answered.len()
    );
    let report = crate::blocking(|| {
        agent_kernel_txlog_postgres::verify(&url, None, None).expect("verifies")
    });
    assert!(report.is_intact(), "{report:#?}");
}
