//! Many kernel processes on one PostgreSQL log (SPEC 6.10): four workers running sagas, one
//! SIGKILLed mid-saga and rolled back by a `recover --watch` worker once its lease ran out,
//! never twice; a worker paused (SIGSTOP) past its lease, whose saga was taken over, is
//! fenced when it continues. Skipped without `AGENT_KERNEL_TEST_POSTGRES` (see
//! `agent_kernel_log_contract::postgres`).

use std::collections::BTreeMap;
use std::fs;
use std::io::Read as _;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use agent_kernel_log_contract::postgres::{Schema, server};
use serde_json::json;

use crate::{Project, bin, wait_until};

/// The workers' lease in these tests, shortened from the default.
pub(crate) const LEASE_MS: u64 = 1_000;

/// How soon after a lease runs out its sagas must be rolled back.
pub(crate) const TAKEOVER_MAX: Duration = Duration::from_secs(5);

/// Steps per worker's saga.
pub(crate) const STEPS: usize = 6;

pub(crate) const ORIGINAL: &str = "original\n";

/// The binary on the PostgreSQL log at `url`, in `project`'s folder, with the short lease.
pub(crate) fn on_postgres(project: &Project, url: &str, args: &[&str]) -> Command {
    let mut command = project.isolated(bin());
    command
        .env("AGENT_KERNEL_LEASE_MS", LEASE_MS.to_string())
        // This machine's head files, in the project's folder.
        .env("XDG_STATE_HOME", project.path("state"))
        .arg("--db")
        .arg(url)
        .args(args);
    command
}

/// Worker `n`'s plan: each of its files rewritten, a short sleep after each.
pub(crate) fn worker_plan(project: &Project, n: usize, sleep_ms: u64) -> String {
    let mut steps = Vec::new();
    for step in 0..STEPS {
        let path = format!("ws/w{n}-{step}.txt");
        fs::write(project.path(&path), ORIGINAL).expect("writes");
        steps.push(json!({ "tool": "fs.write", "args": { "path": path, "content": format!("worker {n} step {step}\n") } }));
        steps.push(json!({ "tool": "noop", "args": { "sleep_ms": sleep_ms } }));
    }
    let plan = project.plan(
        &format!("worker{n}.json"),
        &json!({ "name": format!("worker {n}"), "steps": steps }),
    );
    plan.to_string_lossy().into_owned()
}

pub(crate) fn file(project: &Project, n: usize, step: usize) -> String {
    fs::read_to_string(project.path(&format!("ws/w{n}-{step}.txt"))).expect("reads")
}

/// Every saga's name and state.
pub(crate) fn saga_states(schema: &Schema) -> BTreeMap<String, String> {
    schema
        .rows("SELECT name, state FROM sagas")
        .into_iter()
        .map(|row| {
            (
                row[0].clone().expect("named"),
                row[1].clone().expect("state"),
            )
        })
        .collect()
}

/// How many times any step was begun, or compensated, more than once (audit records).
pub(crate) fn repeated_records(schema: &Schema) -> Vec<Vec<Option<String>>> {
    schema.rows(
        "SELECT saga_id, kind, body::json->>'step_seq', count(*)::text FROM audit_log
         WHERE kind IN ('BeginStep', 'Compensation')
         GROUP BY saga_id, kind, body::json->>'step_seq' HAVING count(*) > 1",
    )
}

pub(crate) fn stop(mut child: Child) -> String {
    // SIGTERM: `recover --watch` ends its round and exits 0.
    let pid = rustix::process::Pid::from_child(&child);
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("signals");
    let status = child.wait().expect("exits");
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .expect("piped")
        .read_to_string(&mut stdout)
        .expect("reads");
    assert!(status.success(), "the watcher exited {status:?}:\n{stdout}");
    stdout
}

fn signal(child: &Child, signal: rustix::process::Signal) {
    rustix::process::kill_process(rustix::process::Pid::from_child(child), signal)
        .expect("signals");
}

#[test]
fn four_workers_share_a_log_and_a_killed_ones_saga_is_rolled_back_once_by_a_watcher() {
    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    let url = schema.url();
    let project = Project::new();
    let plans: Vec<String> = (0..4).map(|n| worker_plan(&project, n, 150)).collect();
    let watcher = on_postgres(&project, &url, &["--json", "recover", "--watch"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starts");
    let mut workers: Vec<Child> = plans
        .iter()
        .map(|plan| {
            on_postgres(&project, &url, &["--json", "run", "--plan", plan])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("starts")
        })
        .collect();
    // Worker 0 is killed once two of its steps have landed.
    wait_until("worker 0 rewrote two files", || {
        file(&project, 0, 1) != ORIGINAL
    });
    crate::sigkill(&mut workers[0]).expect("SIGKILL");
    workers[0].wait().expect("reaped");
    let killed_at = Instant::now();
    for (n, worker) in workers.iter_mut().enumerate().skip(1) {
        let status = worker.wait().expect("exits");
        assert!(status.success(), "worker {n} exited {status:?}");
        for step in 0..STEPS {
            assert_eq!(file(&project, n, step), format!("worker {n} step {step}\n"));
        }
    }
    wait_until("the killed worker's files are restored", || {
        (0..STEPS).all(|step| file(&project, 0, step) == ORIGINAL)
    });
    let restored_after = killed_at.elapsed();
    eprintln!("rolled back {restored_after:?} after the kill (lease {LEASE_MS} ms)");
    assert!(
        restored_after < Duration::from_millis(LEASE_MS) + TAKEOVER_MAX,
        "rolled back {restored_after:?} after the kill, with a lease of {LEASE_MS} ms"
    );
    // Another round of the watcher finds nothing more to do.
    std::thread::sleep(Duration::from_millis(600));
    let watched = stop(watcher);
    let rolled_back =
        watched.matches("\"RolledBack\"").count() + watched.matches("\"rolled_back\"").count();
    assert!(
        rolled_back >= 1,
        "the watcher reported no rollback:\n{watched}"
    );
    let states = saga_states(&schema);
    assert_eq!(states.len(), 4, "{states:?}");
    assert_eq!(states["worker 0"], "FailedRolledBack", "{states:?}");
    for n in 1..4 {
        assert_eq!(states[&format!("worker {n}")], "Done", "{states:?}");
    }
    assert_eq!(repeated_records(&schema), Vec::<Vec<Option<String>>>::new());
    let take_overs = schema.rows("SELECT count(*)::text FROM audit_log WHERE kind = 'TakeOver'");
    assert_eq!(
        take_overs[0][0].as_deref(),
        Some("1"),
        "one take-over, never two"
    );
    assert_verifies(&project, &url);
}

#[test]
fn a_worker_paused_past_its_lease_is_fenced_when_it_continues() {
    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    let url = schema.url();
    let project = Project::new();
    fs::write(project.path("ws/a.txt"), ORIGINAL).expect("writes");
    let plan = project.plan(
        "paused.json",
        &json!({ "name": "paused", "steps": [
            { "tool": "fs.write", "args": { "path": "ws/a.txt", "content": "changed\n" } },
            { "tool": "noop", "args": { "sleep_ms": 2_500 } },
            { "tool": "fs.write", "args": { "path": "ws/b.txt", "content": "never\n" } },
        ] }),
    );
    let worker = on_postgres(
        &project,
        &url,
        &["--json", "run", "--plan", &plan.to_string_lossy()],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("starts");
    wait_until("the first step landed", || {
        fs::read_to_string(project.path("ws/a.txt")).expect("reads") != ORIGINAL
    });
    // Well inside the sleep step: nothing of the next step has begun.
    std::thread::sleep(Duration::from_millis(200));
    signal(&worker, rustix::process::Signal::STOP);
    let watcher = on_postgres(&project, &url, &["--json", "recover", "--watch"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starts");
    wait_until(
        "the paused worker's saga is rolled back by the watcher",
        || saga_states(&schema).get("paused").map(String::as_str) == Some("FailedRolledBack"),
    );
    assert_eq!(
        fs::read_to_string(project.path("ws/a.txt")).expect("reads"),
        ORIGINAL
    );
    signal(&worker, rustix::process::Signal::CONT);
    let output = worker.wait_with_output().expect("exits");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "the fenced worker exited 0:\n{stderr}"
    );
    assert!(stderr.contains("lease"), "{stderr}");
    eprintln!(
        "the fenced worker exited {:?}: {}",
        output.status.code(),
        stderr.lines().last().unwrap_or("")
    );
    stop(watcher);
    // It wrote nothing more: its sleep's commit and everything after were refused.
    assert!(
        !project.path("ws/b.txt").exists(),
        "a step ran after the fence"
    );
    assert_eq!(
        fs::read_to_string(project.path("ws/a.txt")).expect("reads"),
        ORIGINAL
    );
    assert_eq!(saga_states(&schema)["paused"], "FailedRolledBack");
    let begun = schema.rows(
        "SELECT count(*)::text FROM audit_log WHERE kind = 'BeginStep'
             AND body::json->>'step_seq' = '2'",
    );
    assert_eq!(
        begun[0][0].as_deref(),
        Some("0"),
        "the third step never began"
    );
    assert_eq!(repeated_records(&schema), Vec::<Vec<Option<String>>>::new());
    assert_verifies(&project, &url);
}

#[test]
fn commands_that_read_a_postgres_log_name_it_without_its_password() {
    let project = Project::new();
    // No server is there: each fails to connect, and says so (exit 3).
    let url = "postgres://agent:hunter2@127.0.0.1:1/agents";
    for args in [
        &["audit", "list"][..],
        &["log"],
        &["replay", "--saga", "01a233af-2df2-7442-8416-8fdd19379a1c"],
        &["export", "--otel", "--all"],
    ] {
        let output = on_postgres(&project, url, args).output().expect("runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(3), "{args:?}: {stderr}");
        assert!(
            stderr.contains("cannot connect to postgres://agent@127.0.0.1:1/agents"),
            "{args:?}: {stderr}"
        );
        assert!(
            !stderr.contains("hunter2"),
            "{args:?} printed the password: {stderr}"
        );
    }
}

/// Runs the plan at `plan` on `url` to its end: it must succeed.
#[track_caller]
pub(crate) fn run_to_end(project: &Project, url: &str, plan: &str) {
    let output = on_postgres(project, url, &["run", "--plan", plan])
        .output()
        .expect("runs");
    assert!(output.status.success(), "{}", crate::describe(&output));
}

/// `audit verify` of the log at `url` exits 0 on a machine without this one's head files:
/// it never wrote the log, so it has nothing to go by but the chain and the tables.
#[track_caller]
pub(crate) fn assert_verifies_elsewhere(project: &Project, url: &str) {
    let elsewhere = on_postgres(project, url, &["audit", "verify"])
        .env("XDG_STATE_HOME", project.path("elsewhere"))
        .output()
        .expect("runs");
    assert_eq!(
        elsewhere.status.code(),
        Some(0),
        "{}",
        crate::describe(&elsewhere)
    );
}

/// `audit verify` of the log at `url` exits 0.
#[track_caller]
pub(crate) fn assert_verifies(project: &Project, url: &str) {
    let output = on_postgres(project, url, &["audit", "verify"])
        .output()
        .expect("runs");
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        crate::describe(&output)
    );
}

#[test]
fn an_edited_record_fails_audit_verify_and_recover_acts_on_nothing() {
    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    let url = schema.url();
    let project = Project::new();
    let plan = worker_plan(&project, 0, 0);
    run_to_end(&project, &url, &plan);
    assert_verifies(&project, &url);
    schema.execute("UPDATE audit_log SET at_ms = at_ms + 1 WHERE seq = 5");
    let output = on_postgres(&project, &url, &["--json", "audit", "verify"])
        .output()
        .expect("runs");
    let (code, report) = crate::json_output(&output);
    assert_eq!(code, 1, "{report}");
    assert_eq!(report["first_bad"]["seq"], 5, "{report}");
    let output = on_postgres(&project, &url, &["recover"])
        .output()
        .expect("runs");
    assert_eq!(
        output.status.code(),
        Some(3),
        "{}",
        crate::describe(&output)
    );
}

#[test]
fn records_cut_from_the_end_are_caught_by_this_machines_head_file() {
    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    let url = schema.url();
    let project = Project::new();
    let max_seq = || -> i64 {
        schema.rows("SELECT max(seq)::text FROM audit_log")[0][0]
            .as_deref()
            .expect("records")
            .parse()
            .expect("a number")
    };
    for n in 0..2 {
        let plan = worker_plan(&project, n, 0);
        run_to_end(&project, &url, &plan);
        if n == 0 {
            let first_end = max_seq();
            // The second saga, every record and row of it, removed: a consistent earlier
            // state, which the chain and the tables alone cannot tell from the truth.
            schema.execute(&format!(
                "CREATE TABLE cut_after AS SELECT {first_end}::bigint AS seq"
            ));
        }
    }
    let last = max_seq();
    schema.execute(
        "DELETE FROM audit_log WHERE seq > (SELECT seq FROM cut_after);
         DELETE FROM step_keys WHERE saga_id IN (SELECT saga_id FROM sagas WHERE name = 'worker 1');
         DELETE FROM locks WHERE saga_id IN (SELECT saga_id FROM sagas WHERE name = 'worker 1');
         DELETE FROM saga_steps WHERE saga_id IN (SELECT saga_id FROM sagas WHERE name = 'worker 1');
         DELETE FROM sagas WHERE name = 'worker 1';
         DROP TABLE cut_after;",
    );
    let output = on_postgres(&project, &url, &["--json", "audit", "verify"])
        .output()
        .expect("runs");
    let (code, report) = crate::json_output(&output);
    assert_eq!(code, 1, "{report}");
    let reason = report["first_bad"]["reason"].as_str().expect("a reason");
    assert!(reason.contains(&format!("names record {last}")), "{report}");
    // Another machine, without this one's head file, cannot tell.
    assert_verifies_elsewhere(&project, &url);
}

#[test]
fn one_idempotency_key_raced_from_four_worker_processes_gives_one_effect() {
    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    let url = schema.url();
    let project = Project::new();
    fs::write(project.path("ws/ledger.txt"), "").expect("writes");
    let plan = project.plan(
        "append-once.json",
        &json!({ "name": "append once", "steps": [
            { "tool": "fs.append", "args": { "path": "ws/ledger.txt", "content": "paid\n" },
              "idempotency_key": "invoice-42" },
        ] }),
    );
    let plan = plan.to_string_lossy().into_owned();
    let workers: Vec<Child> = (0..4)
        .map(|_| {
            on_postgres(&project, &url, &["--json", "run", "--plan", &plan])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("starts")
        })
        .collect();
    let codes: Vec<Option<i32>> = workers
        .into_iter()
        .map(|mut worker| worker.wait().expect("exits").code())
        .collect();
    assert!(codes.contains(&Some(0)), "{codes:?}");
    assert_eq!(
        fs::read_to_string(project.path("ws/ledger.txt")).expect("reads"),
        "paid\n",
        "one effect, whatever each worker was told: {codes:?}"
    );
    let claims = schema.rows(
        "SELECT count(*)::text FROM audit_log WHERE kind = 'BeginStep'
             AND body::json->>'status' = 'BEGIN'",
    );
    assert_eq!(
        claims[0][0].as_deref(),
        Some("1"),
        "one step began: {codes:?}"
    );
    assert_verifies(&project, &url);
}

/// A loopback TCP proxy in front of the PostgreSQL server that the test controls: once
/// armed, it forwards the next `COMMIT` a client sends (a simple query, as the log's
/// transactions end) and then holds every byte of every connection, both ways, until
/// released, as a network partition would right after a commit left the worker.
pub(crate) struct Partition {
    port: u16,
    armed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    held: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Every connection through it (both ends), for [`Partition::restart`].
    streams: std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
    /// Until when new connections are refused (closed at once), as during a restart.
    refusing_until: std::sync::Arc<std::sync::Mutex<Option<Instant>>>,
}

/// The end of a simple query that commits: a write transaction sends its writes and its
/// `COMMIT` as one, the query's text ending with the COMMIT and its NUL.
const COMMIT_QUERY: &[u8] = b"COMMIT\0";

impl Partition {
    pub(crate) fn start(upstream: std::net::SocketAddr) -> Partition {
        use std::sync::Arc;
        use std::sync::atomic::AtomicBool;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binds");
        let port = listener.local_addr().expect("an address").port();
        let armed = Arc::new(AtomicBool::new(false));
        let held = Arc::new(AtomicBool::new(false));
        let streams = Arc::new(std::sync::Mutex::new(Vec::new()));
        let refusing_until = Arc::new(std::sync::Mutex::new(None::<Instant>));
        let (accept_armed, accept_held) = (Arc::clone(&armed), Arc::clone(&held));
        let (accept_streams, accept_refusing) = (Arc::clone(&streams), Arc::clone(&refusing_until));
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let refusing = accept_refusing
                    .lock()
                    .expect("not poisoned")
                    .is_some_and(|until| Instant::now() < until);
                if refusing {
                    continue;
                }
                let Ok(server) = std::net::TcpStream::connect(upstream) else {
                    continue;
                };
                for stream in [&client, &server] {
                    if let Ok(clone) = stream.try_clone() {
                        accept_streams.lock().expect("not poisoned").push(clone);
                    }
                }
                let pump =
                    |from: std::net::TcpStream, to: std::net::TcpStream, watch_commit: bool| {
                        let (armed, held) = (Arc::clone(&accept_armed), Arc::clone(&accept_held));
                        std::thread::spawn(move || pump(from, to, watch_commit, &armed, &held));
                    };
                let (client_read, server_read) = (
                    client.try_clone().expect("clones"),
                    server.try_clone().expect("clones"),
                );
                pump(client_read, server, true);
                pump(server_read, client, false);
            }
        });
        Partition {
            port,
            armed,
            held,
            streams,
            refusing_until,
        }
    }

    /// As a server restart looks from a client: every connection is cut, and new ones are
    /// refused for `down`.
    pub(crate) fn restart(&self, down: Duration) {
        *self.refusing_until.lock().expect("not poisoned") = Some(Instant::now() + down);
        for stream in self.streams.lock().expect("not poisoned").drain(..) {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
    }

    fn arm(&self) {
        self.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    fn disarm(&self) {
        self.armed.store(false, std::sync::atomic::Ordering::SeqCst);
    }

    fn holding(&self) -> bool {
        self.held.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn release(&self) {
        self.held.store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// `url` with its host and port replaced by the proxy's.
    pub(crate) fn url(&self, url: &str) -> String {
        let at = url.find('@').expect("a user in the URL") + 1;
        let end = at + url[at..].find('/').expect("a database in the URL");
        format!("{}127.0.0.1:{}{}", &url[..at], self.port, &url[end..])
    }
}

/// Copies `from` to `to`, waiting while the partition holds; on the client's side, the
/// armed partition starts holding right after it forwarded a `COMMIT`.
fn pump(
    mut from: std::net::TcpStream,
    mut to: std::net::TcpStream,
    watch_commit: bool,
    armed: &std::sync::atomic::AtomicBool,
    held: &std::sync::atomic::AtomicBool,
) {
    use std::io::Write as _;
    use std::sync::atomic::Ordering;
    let mut buffer = [0_u8; 16 * 1024];
    // The end of what was read before, so that a `COMMIT` cut across two reads is seen.
    let mut tail: Vec<u8> = Vec::new();
    loop {
        let Ok(n_read) = from.read(&mut buffer) else {
            return;
        };
        if n_read == 0 {
            return;
        }
        while held.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(2));
        }
        let chunk = &buffer[..n_read];
        if watch_commit {
            tail.extend_from_slice(chunk);
            let seen = tail
                .windows(COMMIT_QUERY.len())
                .any(|window| window == COMMIT_QUERY);
            // Held before this chunk goes, so nothing after it passes, and the test never
            // sees the commit land before the hold.
            if seen && armed.swap(false, Ordering::SeqCst) {
                held.store(true, Ordering::SeqCst);
            }
            let keep = tail.len().saturating_sub(COMMIT_QUERY.len() - 1);
            tail.drain(..keep);
        }
        if to.write_all(chunk).is_err() {
            return;
        }
    }
}

/// The address of the server `url` names.
pub(crate) fn server_address(url: &str) -> std::net::SocketAddr {
    let at = url.find('@').expect("a user in the URL") + 1;
    let end = at + url[at..].find('/').expect("a database in the URL");
    url[at..end].parse().expect("an IP address and a port")
}

#[test]
fn a_worker_cut_off_after_a_begin_never_makes_its_effect_after_the_take_over() {
    let Some(server) = server() else { return };
    let tries: usize = std::env::var("AGENT_KERNEL_PARTITION_TRIES")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(20);
    let mut inconclusive = 0;
    for attempt in 0..tries {
        let schema = Schema::create(&server);
        let url = schema.url();
        let partition = Partition::start(server_address(&url));
        let project = Project::new();
        fs::write(project.path("ws/a.txt"), ORIGINAL).expect("writes");
        let plan = project.plan(
            "cut.json",
            &json!({ "name": "cut", "steps": [
                { "tool": "fs.write", "args": { "path": "ws/a.txt", "content": "changed\n" } },
                // Long enough for the test to see the sleep begun on a loaded machine.
                { "tool": "noop", "args": { "sleep_ms": 1_500 } },
                { "tool": "fs.write", "args": { "path": "ws/b.txt", "content": "too late\n" } },
            ] }),
        );
        let watcher = on_postgres(&project, &url, &["--json", "recover", "--watch"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("starts");
        let worker = on_postgres(
            &project,
            &partition.url(&url),
            &["--json", "run", "--plan", &plan.to_string_lossy()],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts");
        // Once the sleep has begun, the worker's next commit is the one that ends the
        // sleep and begins the last step: the partition holds everything right after it.
        let steps = || {
            // The worker creates the tables when it opens the log.
            let created = schema.rows("SELECT (to_regclass('saga_steps') IS NOT NULL)::text");
            if created[0][0].as_deref() != Some("true") {
                return 0;
            }
            schema.rows("SELECT count(*)::text FROM saga_steps")[0][0]
                .as_deref()
                .and_then(|n| n.parse::<u32>().ok())
                .unwrap_or(0)
        };
        wait_until("the sleep step began", || steps() >= 2);
        partition.arm();
        wait_until(
            "the partition began, or the commit passed before it",
            || partition.holding() || steps() >= 3,
        );
        // The commit held must be the one that began the last step (its BEGIN, no effect
        // yet): a later one, if an earlier went through before the partition was armed,
        // would show nothing.
        let last_begun = || {
            let rows = schema.rows("SELECT status FROM saga_steps ORDER BY step_seq");
            rows.len() == 3 && rows[2][0].as_deref() == Some("BEGIN")
        };
        if !partition.holding() || !last_begun() {
            // The test was held up past the sleep (a loaded machine), so the commit went
            // through before the partition was armed: this attempt shows nothing.
            partition.disarm();
            partition.release();
            let mut worker = worker;
            crate::sigkill(&mut worker).expect("SIGKILL");
            worker.wait().expect("reaped");
            stop(watcher);
            inconclusive += 1;
            eprintln!("attempt {attempt}: the commit passed before the partition was armed");
            continue;
        }
        wait_until(
            "the cut-off worker's saga is rolled back by the watcher",
            || saga_states(&schema).get("cut").map(String::as_str) == Some("FailedRolledBack"),
        );
        partition.release();
        let output = worker.wait_with_output().expect("exits");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            output.status.code(),
            Some(3),
            "attempt {attempt}: the cut-off worker:\n{stderr}"
        );
        assert!(stderr.contains("lease"), "attempt {attempt}: {stderr}");
        stop(watcher);
        assert!(
            !project.path("ws/b.txt").exists(),
            "attempt {attempt}: the effect landed after the take-over"
        );
        assert_eq!(
            fs::read_to_string(project.path("ws/a.txt")).expect("reads"),
            ORIGINAL,
            "attempt {attempt}"
        );
        assert_eq!(saga_states(&schema)["cut"], "FailedRolledBack");
    }
    assert!(
        inconclusive * 2 <= tries,
        "{inconclusive} of {tries} attempts armed the partition too late"
    );
}

/// A project whose `ws/a.txt` holds [`ORIGINAL`], and its plan `NAME.json`: a saga named
/// `name` that changes the file, then waits 30 s.
pub(crate) fn write_then_wait(name: &str) -> (Project, std::path::PathBuf) {
    let project = Project::new();
    fs::write(project.path("ws/a.txt"), ORIGINAL).expect("writes");
    let plan = project.plan(
        &format!("{name}.json"),
        &json!({ "name": name, "steps": [
            { "tool": "fs.write", "args": { "path": "ws/a.txt", "content": "changed\n" } },
            { "tool": "noop", "args": { "sleep_ms": 30_000 } },
        ] }),
    );
    (project, plan)
}

#[test]
fn recover_right_after_a_sigkill_on_this_machine_does_not_wait_for_the_lease() {
    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    let url = schema.url();
    let (project, plan) = write_then_wait("killed");
    // A long lease: recovery must not wait for it.
    let mut worker = on_postgres(&project, &url, &["run", "--plan", &plan.to_string_lossy()])
        .env("AGENT_KERNEL_LEASE_MS", "600000")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starts");
    wait_until("the first step landed", || {
        fs::read_to_string(project.path("ws/a.txt")).expect("reads") != ORIGINAL
    });
    crate::sigkill(&mut worker).expect("SIGKILLs");
    worker.wait().expect("reaps");
    let started = Instant::now();
    let output = on_postgres(&project, &url, &["--json", "recover"])
        .output()
        .expect("runs");
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_eq!(saga_states(&schema)["killed"], "FailedRolledBack");
    assert_eq!(
        fs::read_to_string(project.path("ws/a.txt")).expect("reads"),
        ORIGINAL
    );
    assert_verifies(&project, &url);
}

#[test]
fn recover_watch_survives_a_lost_connection_and_a_restart() {
    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    let url = schema.url();
    let partition = Partition::start(server_address(&url));
    let project = Project::new();
    fs::write(project.path("ws/a.txt"), ORIGINAL).expect("writes");
    let stderr = fs::File::create(project.path("watcher.err")).expect("creates");
    // The watcher's lease outlasts the outage; the worker's is the short one.
    let watcher = on_postgres(
        &project,
        &partition.url(&url),
        &["--json", "-v", "recover", "--watch"],
    )
    .env("AGENT_KERNEL_LEASE_MS", "10000")
    .stdout(Stdio::piped())
    .stderr(stderr)
    .spawn()
    .expect("starts");
    wait_until("the watcher started watching", || {
        fs::read_to_string(project.path("watcher.err"))
            .is_ok_and(|said| said.contains("recovering the sagas of dead owners until stopped"))
    });
    partition.restart(Duration::from_secs(1));
    let plan = project.plan(
        "killed.json",
        &json!({ "name": "killed", "steps": [
            { "tool": "fs.write", "args": { "path": "ws/a.txt", "content": "changed\n" } },
            { "tool": "noop", "args": { "sleep_ms": 30_000 } },
        ] }),
    );
    let mut worker = on_postgres(&project, &url, &["run", "--plan", &plan.to_string_lossy()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starts");
    wait_until("the first step landed", || {
        fs::read_to_string(project.path("ws/a.txt")).expect("reads") != ORIGINAL
    });
    crate::sigkill(&mut worker).expect("SIGKILLs");
    worker.wait().expect("reaps");
    let mut watcher = watcher;
    let deadline = Instant::now() + Duration::from_secs(60);
    while saga_states(&schema).get("killed").map(String::as_str) != Some("FailedRolledBack") {
        let said = || fs::read_to_string(project.path("watcher.err")).unwrap_or_default();
        if let Some(status) = watcher.try_wait().expect("polls") {
            panic!("the watcher exited {status:?}:\n{}", said());
        }
        assert!(
            Instant::now() < deadline,
            "the watcher did not roll the dead worker's saga back:\n{}",
            said()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        fs::read_to_string(project.path("ws/a.txt")).expect("reads"),
        ORIGINAL
    );
    // Through the outage the watcher either made its connection again unseen (a read whose
    // BEGIN failed is tried again on a new connection) or said the log did not answer and
    // tried the round again: either way it is still running, and it rolled the saga back.
    stop(watcher);
}

#[test]
fn recover_names_a_live_lease_and_recover_wait_waits_for_it() {
    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    let url = schema.url();
    let (project, plan) = write_then_wait("paused");
    // A paused worker: its process still exists, so only its lease can say it is gone
    // (long enough that the first `recover`, on a loaded machine, still finds it live).
    let worker = on_postgres(&project, &url, &["run", "--plan", &plan.to_string_lossy()])
        .env("AGENT_KERNEL_LEASE_MS", "8000")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starts");
    // Stopped inside its sleep, with no transaction of its own open: a worker stopped
    // mid-transaction holds the log's write lock, and `recover` would wait for its lease
    // to run out before it could even record itself.
    wait_until("the sleep step began", || {
        let created = schema.rows("SELECT (to_regclass('saga_steps') IS NOT NULL)::text");
        created[0][0].as_deref() == Some("true")
            && schema.rows("SELECT count(*)::text FROM saga_steps")[0][0].as_deref() == Some("2")
    });
    std::thread::sleep(Duration::from_millis(200));
    signal(&worker, rustix::process::Signal::STOP);
    let output = on_postgres(&project, &url, &["-v", "recover"])
        .output()
        .expect("runs");
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(
        said.contains("the lease of its worker") && said.contains("runs out in"),
        "{said}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        !["Done", "FailedRolledBack", "FailedRollbackPartial"]
            .contains(&saga_states(&schema)["paused"].as_str()),
        "recover left the saga of a live lease alone"
    );
    let output = on_postgres(&project, &url, &["--json", "recover", "--wait"])
        .output()
        .expect("runs");
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(saga_states(&schema)["paused"], "FailedRolledBack");
    assert_eq!(
        fs::read_to_string(project.path("ws/a.txt")).expect("reads"),
        ORIGINAL
    );
    signal(&worker, rustix::process::Signal::KILL);
    let _ = worker.wait_with_output();
}

/// A plan named `name` in `project` of `steps`.
fn named_plan(project: &Project, name: &str, steps: serde_json::Value) -> String {
    let plan = project.plan(
        &format!("{name}.json"),
        &json!({ "name": name, "steps": steps }),
    );
    plan.to_string_lossy().into_owned()
}

/// A worker's saga that writes `content` to `ws/f.txt` and then waits `sleep_ms` (then
/// fails, with `fail`), running in the background once its write has landed.
fn holding_worker(
    project: &Project,
    url: &str,
    (name, content): (&str, &str),
    sleep_ms: u64,
    fail: bool,
) -> Child {
    let mut steps = vec![
        json!({"tool": "fs.write", "args": {"path": "ws/f.txt", "content": content}}),
        json!({"tool": "noop", "args": {"sleep_ms": sleep_ms}}),
    ];
    if fail {
        steps.push(json!({"tool": "fault.fail", "args": {}}));
    }
    let plan = named_plan(project, name, serde_json::Value::Array(steps));
    let child = on_postgres(project, url, &["run", "--plan", &plan])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starts");
    wait_until("the holder's write landed", || {
        fs::read_to_string(project.path("ws/f.txt")).is_ok_and(|now| now == content)
    });
    child
}

/// `run` of a one-step plan named `name` (`tool` on `ws/f.txt` with `content`) on the log
/// at `url`; answers its exit code and stderr.
fn one_step(project: &Project, url: &str, name: &str, tool: &str, content: &str) -> (i32, String) {
    let plan = named_plan(
        project,
        name,
        json!([{"tool": tool, "args": {"path": "ws/f.txt", "content": content}}]),
    );
    let output = on_postgres(project, url, &["run", "--plan", &plan])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (output.status.code().expect("exits"), stderr)
}

#[test]
fn two_worker_processes_on_one_file_are_kept_apart_on_postgres_and_a_dead_ones_hold_lasts_until_recover()
 {
    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    let url = schema.url();
    let read = |project: &Project| fs::read_to_string(project.path("ws/f.txt")).expect("reads");

    // Of two workers on one file, one proceeds: the other is refused (exit 6) and the file
    // ends as the winner's saga left it, whether it commits or rolls back.
    for fail in [false, true] {
        let project = Project::new();
        fs::write(project.path("ws/f.txt"), "original").expect("writes");
        let winner_name = format!("winner-{fail}");
        let mut winner = holding_worker(&project, &url, (&winner_name, "A"), 1_500, fail);
        let (code, stderr) = one_step(&project, &url, &format!("loser-{fail}"), "fs.write", "B");
        assert_eq!(code, 6, "{stderr}");
        assert!(stderr.contains("which is running"), "{stderr}");
        let status = winner.wait().expect("the winner ends");
        assert_eq!(status.code(), Some(i32::from(fail)));
        assert_eq!(read(&project), if fail { "original" } else { "A" });
    }

    // A worker killed holding the file: the later write is refused, naming `recover`, until
    // a recovery (once the dead worker's lease has run out) settles the dead saga.
    let project = Project::new();
    fs::write(project.path("ws/f.txt"), "original").expect("writes");
    let mut dead = holding_worker(&project, &url, ("dead", "A"), 60_000, false);
    crate::sigkill(&mut dead).expect("SIGKILL");
    dead.wait().expect("reaped");
    let (code, stderr) = one_step(&project, &url, "later", "fs.write", "B");
    assert_eq!(code, 6, "{stderr}");
    assert!(
        stderr.contains("no longer running: run `agent-kernel recover`"),
        "{stderr}"
    );
    assert_eq!(read(&project), "A", "the refused write ran nothing");
    wait_until("recover settled the dead worker's saga", || {
        on_postgres(&project, &url, &["recover"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("runs");
        saga_states(&schema).get("dead").map(String::as_str) == Some("FailedRolledBack")
    });
    assert_eq!(read(&project), "original");
    let (code, stderr) = one_step(&project, &url, "later-again", "fs.write", "B");
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(read(&project), "B");

    // With a lock wait, the second worker runs once the first is settled.
    let project = Project::new();
    fs::write(
        project.path("sandbox.toml"),
        "[fs]\nallow = [\"ws\"]\n\n[limits]\nlock_wait_ms = 30000\n",
    )
    .expect("writes the policy");
    fs::write(project.path("ws/f.txt"), "original").expect("writes");
    let mut first = holding_worker(&project, &url, ("first", "A"), 800, false);
    let (code, stderr) = one_step(&project, &url, "second", "fs.append", "+B");
    assert_eq!(code, 0, "{stderr}");
    assert!(first.wait().expect("ends").success());
    assert_eq!(read(&project), "A+B");

    let states = saga_states(&schema);
    for name in ["winner-false", "later-again", "first", "second"] {
        assert_eq!(states[name], "Done", "{states:?}");
    }
    for name in ["winner-true", "dead", "loser-false", "loser-true", "later"] {
        assert_eq!(states[name], "FailedRolledBack", "{states:?}");
    }
    let held = schema.rows(&format!("SELECT ({})::text", crate::HELD_LOCKS_SQL));
    assert_eq!(held[0][0].as_deref(), Some("0"), "no lock remains");
    // Three refusals, and each refused claim of the waiting worker (at least one).
    let refused = schema.rows("SELECT count(*)::text FROM audit_log WHERE kind = 'LockConflict'");
    let refused: u32 = refused[0][0]
        .as_deref()
        .expect("a count")
        .parse()
        .expect("a number");
    assert!(refused >= 4, "{refused} refused claims");
    assert_verifies(&project, &url);
}

#[test]
fn the_console_serves_a_postgresql_log_with_its_token_file() {
    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    let url = schema.url();
    let project = Project::new();
    fs::write(project.path("sandbox.toml"), "[fs]\nallow = [\"ws\"]\n").expect("writes");
    let plan = project.plan(
        "plan.json",
        &json!({"steps": [{"tool": "fs.write", "args": {"path": "ws/a.txt", "content": "a"}}]}),
    );
    let ran = on_postgres(
        &project,
        &url,
        &["run", "--plan", plan.to_str().expect("utf-8")],
    )
    .output()
    .expect("runs");
    assert!(ran.status.success(), "{}", crate::describe(&ran));
    // Without a token file there is no folder beside the log to write one in.
    let refused = on_postgres(&project, &url, &["serve", "--listen", "127.0.0.1:0"])
        .output()
        .expect("runs");
    assert_eq!(
        refused.status.code(),
        Some(2),
        "{}",
        crate::describe(&refused)
    );
    fs::write(
        project.path("console.token"),
        "a-token-of-32-characters-or-so-x\n",
    )
    .expect("writes");
    let console = crate::console::Console::spawn(
        &project,
        on_postgres(
            &project,
            &url,
            &[
                "--json",
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--token-file",
                "console.token",
            ],
        ),
    );
    let (status, overview) = console.get_json("/");
    assert_eq!(status, 200, "{overview}");
    assert_eq!(
        overview,
        json!({"counts": {"Done": 1}, "approvals_pending": 0, "dead_letters_open": 0})
    );
    // The audit check and the undo, as on SQLite, the file put back.
    let (status, verified) = console.post_json("/audit/verify", &json!({}));
    assert_eq!(status, 200, "{verified}");
    assert_eq!(verified["ok"], true, "{verified}");
    let (status, page) = console.get_json("/sagas");
    assert_eq!(status, 200, "{page}");
    let saga_id = page["sagas"][0]["saga_id"]
        .as_str()
        .expect("a saga")
        .to_owned();
    // Its audit records, newest first, as on SQLite.
    let (status, audit) = console.get_json(&format!("/sagas/{saga_id}/audit"));
    assert_eq!(status, 200, "{audit}");
    let kinds: Vec<&str> = audit["records"]
        .as_array()
        .expect("records")
        .iter()
        .map(|record| record["kind"].as_str().expect("a kind"))
        .collect();
    assert_eq!(
        kinds,
        ["SetState", "CommitStep", "BeginStep", "CreateSaga"],
        "{audit}"
    );
    let (status, undone) = console.post_json(
        &format!("/sagas/{saga_id}/undo"),
        &json!({"reason": "not wanted"}),
    );
    assert_eq!(status, 200, "{undone}");
    assert_eq!(undone["state"], "Undone", "{undone}");
    assert!(!project.path("ws/a.txt").exists());
}

#[test]
fn bench_processes_share_one_postgresql_log_and_report_its_round_trips() {
    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    let url = schema.url();
    let project = Project::new();
    let benches: Vec<Child> = (0..2)
        .map(|_| {
            on_postgres(
                &project,
                &url,
                &[
                    "--json",
                    "bench",
                    "--sagas",
                    "8",
                    "--steps",
                    "3",
                    "--concurrency",
                    "4",
                ],
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starts")
        })
        .collect();
    for bench in benches {
        let (code, document) = crate::json_output(&bench.wait_with_output().expect("runs"));
        assert_eq!(code, 0, "{document}");
        assert_eq!(document["backend"], "postgres", "{document}");
        let commits = document["commits_per_step"].as_f64().expect("a number");
        let transactions = document["transactions_per_step"]
            .as_f64()
            .expect("a number");
        let trips = document["round_trips_per_step"].as_f64().expect("a number");
        // A transaction holds one batch at least; each costs a BEGIN, a COMMIT and more.
        assert!(transactions > 0.0 && transactions <= commits, "{document}");
        assert!(trips >= 2.0 * transactions, "{document}");
        assert!(document.get("floor").is_none(), "{document}");
    }
    let states = schema.rows("SELECT state, count(*)::text FROM sagas GROUP BY state");
    assert_eq!(
        states,
        [vec![Some("Done".to_owned()), Some("16".to_owned())]]
    );
    assert_verifies(&project, &url);
}
