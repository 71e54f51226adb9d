//! The hub's tests, with real programs: servers in `sh` speaking MCP over their stdio.

use std::path::Path;

use super::*;

fn step(saga_id: &str, step_seq: u32) -> StepRef<'_> {
    StepRef { saga_id, step_seq }
}

/// The runtime `hub` serves its connections on.
fn served(hub: &Hub) -> &Serving {
    let Runs::Thread {
        serving: Some(serving),
        ..
    } = &hub.runs
    else {
        panic!("a serving runtime was recorded");
    };
    serving
}

#[tokio::test]
async fn a_steps_next_call_waits_until_its_earlier_one_is_answered() {
    let calls = Arc::new(StepCalls::default());
    let first = calls.board(step("s", 0)).await;
    // Another step, or the same position of another saga, does not wait.
    let other = calls.board(step("s", 1)).await;
    let elsewhere = calls.board(step("t", 0)).await;
    let next = tokio::spawn({
        let calls = Arc::clone(&calls);
        async move { calls.board(step("s", 0)).await }
    });
    tokio::task::yield_now().await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!next.is_finished(), "it waits while the first call runs");
    drop(first);
    let next = next.await.expect("boards once the first call ended");
    drop((next, other, elsewhere));
    assert!(
        calls.gates.lock().expect("not poisoned").is_empty(),
        "every gate is forgotten once nobody holds it"
    );
}

/// A server in `sh` that answers `initialize` and `tools/list` (one tool, `echo`),
/// appends its pid to `$PIDS` when it starts, and to `$PIDS.calls` for each call of a
/// tool, which it never answers.
const LISTING_SERVER: &str = r#"echo $$ >> "$PIDS"
while IFS= read -r line; do
  id=$(printf '%s' "$line" | sed -n 's/.*"id":\([0-9]*\).*/\1/p')
  case "$line" in
    *'"initialize"'*) printf '{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":"2025-06-18","capabilities":{"tools":{}},"serverInfo":{"name":"listing","version":"1"}}}\n' "$id" ;;
    *'"tools/list"'*) printf '{"jsonrpc":"2.0","id":%s,"result":{"tools":[{"name":"echo","inputSchema":{"type":"object"}}]}}\n' "$id" ;;
    *'"tools/call"'*) echo $$ >> "$PIDS.calls" ;;
  esac
done"#;

fn listing_server(folder: &Path) -> ServerSpec {
    ServerSpec {
        name: "listing".to_owned(),
        command: vec!["sh".to_owned(), "-c".to_owned(), LISTING_SERVER.to_owned()],
        env: BTreeMap::from([("PIDS".to_owned(), folder.join("pids").display().to_string())]),
        folder: folder.to_path_buf(),
        tools: Vec::new(),
        trust_annotations: false,
        timeout_ms: None,
        start_timeout: Duration::from_secs(20),
        declared: BTreeMap::new(),
    }
}

fn pids(folder: &Path) -> Vec<u32> {
    std::fs::read_to_string(folder.join("pids"))
        .unwrap_or_default()
        .lines()
        .map(|line| line.trim().parse().expect("a pid"))
        .collect()
}

/// Waits (at most a minute) until process `pid` has exited (a zombie has).
fn wait_gone(pid: u32) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while matches!(
        agent_kernel_sandbox::programs::read_stat(pid),
        Ok(Some(stat)) if !stat.is_zombie
    ) {
        assert!(
            std::time::Instant::now() < deadline,
            "server {pid} still runs"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// A multi-threaded runtime, as the Python package's.
fn multi_threaded_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

fn listed(runtime: &tokio::runtime::Runtime, hub: &Hub) -> Vec<String> {
    runtime
        .block_on(hub.list_tools("listing"))
        .expect("the server lists its tools")
        .into_iter()
        .map(|tool| tool.name.to_string())
        .collect()
}

#[test]
fn a_hub_serves_on_its_runtime_then_on_its_thread_once_that_runtime_stopped() {
    let folder = tempfile::tempdir().expect("a folder");
    let first = runtime();
    let hub = Hub::serving_on(vec![listing_server(folder.path())], first.handle().clone())
        .expect("a hub");
    assert!(
        matches!(&hub.runs, Runs::Thread { serving: Some(serving), .. } if serving.runs()),
        "the hub serves on the runtime it was given"
    );
    assert_eq!(listed(&first, &hub), ["echo"]);
    let started = pids(folder.path());
    assert_eq!(started.len(), 1, "one server started");

    // The runtime that served the connection stops: the connection closes with it, the
    // server sees the end of its stdin and exits, and is reaped by the hub's thread.
    drop(first);
    wait_gone(started[0]);
    assert!(!served(&hub).runs(), "the hub knows its runtime stopped");

    // Calls from another runtime go on: served on the hub's thread, the server started
    // again.
    let second = runtime();
    assert_eq!(listed(&second, &hub), ["echo"]);
    assert_eq!(
        listed(&second, &hub),
        ["echo"],
        "the same connection serves again"
    );
    let started = pids(folder.path());
    assert_eq!(
        started.len(),
        2,
        "started once more, then kept: {started:?}"
    );

    // Dropping the hub stops its server.
    drop(hub);
    wait_gone(started[1]);
}

#[test]
fn a_hub_given_no_runtime_serves_on_its_thread_and_stops_its_servers() {
    let folder = tempfile::tempdir().expect("a folder");
    let runtime = runtime();
    // Made within a runtime, but not given it.
    let hub = {
        let _inside = runtime.enter();
        Hub::new(vec![listing_server(folder.path())]).expect("a hub")
    };
    assert!(matches!(&hub.runs, Runs::Thread { serving: None, .. }));
    assert_eq!(listed(&runtime, &hub), ["echo"]);
    let started = pids(folder.path());
    assert_eq!(started.len(), 1);
    drop(hub);
    wait_gone(started[0]);
}

#[test]
fn a_wrapped_server_that_outlives_its_stdin_and_sigterm_is_killed_with_its_wrapper() {
    let folder = tempfile::tempdir().expect("a folder");
    let mut spec = listing_server(folder.path());
    // The server (which ignores SIGTERM and goes on after its stdin ended) under a
    // wrapper that ignores SIGTERM too, as `npx` or `sh -c` put a server under another
    // process.
    spec.env.insert(
        "SERVER".to_owned(),
        format!("trap '' TERM\n{LISTING_SERVER}\nwhile :; do sleep 1; done"),
    );
    // (An asynchronous command's stdin is `/dev/null` unless given another descriptor.)
    spec.command[2] = "trap '' TERM\nexec 3<&0\nsh -c \"$SERVER\" <&3 3<&- &\nwait".to_owned();
    let hub = Hub::new(vec![spec]).expect("a hub");
    let runtime = runtime();
    assert_eq!(listed(&runtime, &hub), ["echo"]);
    let started = pids(folder.path());
    assert_eq!(started.len(), 1);
    let dropped = std::time::Instant::now();
    drop(hub);
    wait_gone(started[0]);
    assert!(
        dropped.elapsed() >= SERVER_STOP_GRACE * 2,
        "given its grace after stdin closed and after SIGTERM before SIGKILL"
    );
}

#[test]
fn a_server_is_started_again_only_once_its_earlier_process_is_gone() {
    let folder = tempfile::tempdir().expect("a folder");
    let mut spec = listing_server(folder.path());
    // Goes on after its stdin ended, until SIGTERM, which it notes.
    spec.command[2] = format!(
        "trap 'echo $$ >> \"$PIDS.term\"; exit 0' TERM\n{LISTING_SERVER}\nwhile :; do sleep 1; done"
    );
    let first = runtime();
    let hub = Hub::serving_on(vec![spec], first.handle().clone()).expect("a hub");
    assert_eq!(listed(&first, &hub), ["echo"]);
    // Its connection closes with the runtime that served it; the process lives on.
    drop(first);
    let second = runtime();
    assert_eq!(listed(&second, &hub), ["echo"]);
    let started = pids(folder.path());
    assert_eq!(started.len(), 2, "{started:?}");
    assert!(
        !Path::new(&format!("/proc/{}", started[0])).exists(),
        "the earlier process was stopped and reaped before the new one started"
    );
    let termed = std::fs::read_to_string(folder.path().join("pids.term")).expect("noted");
    assert_eq!(
        termed.trim(),
        started[0].to_string(),
        "stopped by SIGTERM once its grace after stdin closed ran out"
    );
    drop(hub);
    wait_gone(started[1]);
}

#[test]
fn a_server_that_exits_is_started_again_from_the_serving_runtime() {
    let folder = tempfile::tempdir().expect("a folder");
    let mut spec = listing_server(folder.path());
    // Exits once it has listed its tools.
    spec.command[2] = LISTING_SERVER.replace(r#"}]}}\n' "$id" ;;"#, r#"}]}}\n' "$id"; exit 0 ;;"#);
    assert_ne!(spec.command[2], LISTING_SERVER);
    let serving = multi_threaded_runtime();
    let hub = Hub::serving_on(vec![spec], serving.handle().clone()).expect("a hub");
    assert_eq!(listed(&serving, &hub), ["echo"]);
    let first = pids(folder.path());
    assert_eq!(first.len(), 1);
    wait_gone(first[0]);
    serving.block_on(async {
        while !hub.servers["listing"]
            .state
            .lock()
            .await
            .client
            .as_ref()
            .is_some_and(|client| client.is_closed())
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    // The serving runtime still runs: the start is a task it spawns on the hub's thread.
    assert_eq!(listed(&serving, &hub), ["echo"]);
    let started = pids(folder.path());
    assert_eq!(started.len(), 2, "{started:?}");
    drop(hub);
    wait_gone(started[1]);
}

#[test]
fn a_start_nobody_waits_for_any_more_still_stops_the_earlier_process_first() {
    let folder = tempfile::tempdir().expect("a folder");
    let mut spec = listing_server(folder.path());
    // Notes its start and its SIGTERM, and goes on after its stdin ended until then.
    spec.command[2] = format!(
        "echo \"start $$\" >> \"$PIDS.log\"\ntrap 'echo \"term $$\" >> \"$PIDS.log\"; exit 0' TERM\n{LISTING_SERVER}\nwhile :; do sleep 1; done"
    );
    runtime().block_on(async {
        let keepers = Arc::new(Keepers::on(Handle::current()));
        // Each start's pipes are dropped at once: its process lives on.
        drop(start_program(spec.clone(), Arc::clone(&keepers)).await);
        // A start given up while it stops the earlier process...
        let given_up = tokio::time::timeout(
            Duration::from_millis(100),
            start_program(spec.clone(), Arc::clone(&keepers)),
        )
        .await;
        assert!(given_up.is_err(), "still stopping the first process");
        // ...goes on, and the next start waits for it.
        drop(start_program(spec.clone(), Arc::clone(&keepers)).await);
        keepers.stop_all().await;
    });
    let pids = pids(folder.path());
    assert_eq!(pids.len(), 3, "{pids:?}");
    let log = std::fs::read_to_string(folder.path().join("pids.log")).expect("a log");
    let expected: Vec<String> = pids
        .iter()
        .flat_map(|pid| [format!("start {pid}"), format!("term {pid}")])
        .collect();
    assert_eq!(
        log.lines().collect::<Vec<_>>(),
        expected,
        "each process began only once the one before it had ended"
    );
}

#[test]
fn dropping_the_hub_stops_a_server_a_call_still_waits_for() {
    let folder = tempfile::tempdir().expect("a folder");
    let serving = multi_threaded_runtime();
    let hub = Hub::serving_on(
        vec![listing_server(folder.path())],
        serving.handle().clone(),
    )
    .expect("a hub");
    let parked = served(&hub).parked.clone();
    let calls = folder.path().join("pids.calls");
    serving.block_on(async {
        let step = StepRef {
            saga_id: "s",
            step_seq: 0,
        };
        let call = hub.call(step, "listing", "echo", JsonObject::new());
        tokio::pin!(call);
        // Until the server has the call, which it never answers; the call goes on
        // without its caller.
        while !calls.exists() {
            tokio::select! {
                answered = &mut call => panic!("answered: {answered:?}"),
                () = tokio::time::sleep(Duration::from_millis(10)) => {}
            }
        }
    });
    let started = pids(folder.path());
    assert_eq!(started.len(), 1);
    drop(hub);
    wait_gone(started[0]);
    serving.block_on(tokio::task::yield_now());
    assert!(parked.is_finished(), "the hub's parked task ended with it");
}

#[test]
fn a_call_ended_without_an_answer_is_lost_only_once_it_may_have_been_sent() {
    for sent in [false, true] {
        let (sender, mut answer) = oneshot::channel::<Result<(), CallError>>();
        let sending = Sending::default();
        let reply = Reply {
            sender: Some(sender),
            sending: sending.clone(),
        };
        if sent {
            sending.now();
        }
        drop(reply);
        let ended = answer.try_recv().expect("answered when dropped");
        if sent {
            assert!(matches!(ended, Err(CallError::Lost(_))), "{ended:?}");
        } else {
            assert!(matches!(ended, Err(CallError::NotSent(_))), "{ended:?}");
        }
    }
}

#[tokio::test]
async fn a_caller_that_stops_waiting_leaves_no_gate_behind() {
    let calls = Arc::new(StepCalls::default());
    let first = calls.board(step("s", 0)).await;
    let gave_up = tokio::time::timeout(Duration::from_millis(10), calls.board(step("s", 0))).await;
    assert!(gave_up.is_err(), "still held by the first call");
    drop(first);
    assert!(calls.gates.lock().expect("not poisoned").is_empty());
}
