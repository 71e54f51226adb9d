//! The upstream servers' connections: a server is started when it is first needed and
//! restarted for the next call after it died, within [`SERVER_STARTS_MAX`]; calls come
//! from any runtime.
//!
//! - **Programs are started on a thread of the hub's own**, with its own runtime, started
//!   before the kernel confines itself (Landlock): the servers run outside the kernel's
//!   sandbox, as the separate programs they are. That thread keeps each program's process
//!   (its stderr to the log, and its stop when the hub is dropped: stdin closed, then
//!   `SIGTERM` and `SIGKILL` after [`SERVER_STOP_GRACE`] each).
//! - **The connections are served on the runtime the hub is given** ([`Hub::serving_on`],
//!   the kernel's own) while that runtime runs: a call reaches its server's pipe without a
//!   hand-off between threads. A hub given none ([`Hub::new`]), or whose runtime has
//!   stopped, serves them on its thread instead; a connection served by a runtime that
//!   stopped is closed, and the next call starts its server again.
//!
//! [`Hub::with_connector`] puts servers a [`Connector`] makes in place of programs, and runs
//! the calls on the caller's runtime: the simulator's upstream server.
//!
//! A step's calls from this process reach its server one at a time ([`StepCalls`]): a call
//! the kernel stopped waiting for (its timeout) still runs at the server, so the step's
//! compensation is sent only once the server answered it, never while the effect may still
//! land. Another process's calls (a `dlq retry` beside a live `mcp` server) do not wait.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use agent_kernel_api::{BoxFuture, ToolError};
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, CallToolResult, JsonObject, Tool};
use rmcp::service::{RoleClient, RunningService, ServiceError};
use tokio::io::AsyncBufReadExt;
use tokio::net::unix::pipe;
use tokio::runtime::Handle;
use tokio::sync::{Mutex, OwnedMutexGuard, mpsc, oneshot};
use tokio::task::JoinSet;
use tracing::{info, warn};

#[cfg(doc)]
use crate::SERVER_START_TIMEOUT_MS_MAX;
use crate::config::ServerSpec;

/// How long a server may take to start and answer `initialize` (an `npx` server may first
/// be downloaded).
pub const SERVER_START_TIMEOUT: Duration = Duration::from_secs(60);

/// How many times one process starts one server: the first start and the restarts after it
/// died.
pub const SERVER_STARTS_MAX: u32 = 4;

/// How long a server is given to exit at each step of its stop (before it is started again,
/// or when the hub is dropped): after its stdin is closed, then after `SIGTERM`; `SIGKILL`
/// follows.
pub const SERVER_STOP_GRACE: Duration = Duration::from_secs(3);

type Servers = BTreeMap<String, Arc<Server>>;
type Job = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// One server and its connection.
struct Server {
    spec: ServerSpec,
    /// What makes its connection instead of its program, if anything.
    connector: Option<Arc<dyn Connector>>,
    state: Mutex<State>,
}

/// The connection to one server: rmcp's client over the server's stdio, or one a
/// [`Connector`] made.
enum Client {
    Mcp(RunningService<RoleClient, ()>),
    Made(Box<dyn Connection>),
}

/// A connection to a server that a [`Connector`] made, in place of a program over stdio
/// (a simulated server). Its calls are made on the runtime that calls [`Hub::call`].
pub trait Connection: Send + Sync + 'static {
    /// The server's tools.
    fn list_tools(&self) -> BoxFuture<'_, Result<Vec<Tool>, CallError>>;

    /// Calls a tool for `step`, the step the kernel calls it for (a compensation's too).
    fn call_tool(
        &self,
        step: StepRef<'_>,
        params: CallToolRequestParams,
    ) -> BoxFuture<'_, Result<CallToolResult, CallError>>;

    /// Whether the server is gone: the next call makes a new connection, as it starts a
    /// program again (within [`SERVER_STARTS_MAX`]).
    fn is_closed(&self) -> bool;
}

/// Makes the connections of [`Hub::with_connector`]'s servers.
pub trait Connector: Send + Sync + 'static {
    /// A new connection to the server of `spec`, or why there is none (the call was not
    /// sent).
    ///
    /// # Errors
    ///
    /// The message of [`CallError::NotSent`].
    fn connect(&self, spec: &ServerSpec) -> Result<Box<dyn Connection>, String>;
}

impl Client {
    fn is_closed(&self) -> bool {
        match self {
            Client::Mcp(client) => client.is_transport_closed(),
            Client::Made(connection) => connection.is_closed(),
        }
    }

    async fn list_tools(&self) -> Result<Vec<Tool>, CallError> {
        match self {
            Client::Mcp(client) => client
                .list_all_tools()
                .await
                .map_err(|err| CallError::Refused(err.to_string())),
            Client::Made(connection) => connection.list_tools().await,
        }
    }

    async fn call_tool(
        &self,
        step: StepRef<'_>,
        params: CallToolRequestParams,
    ) -> Result<CallToolResult, CallError> {
        match self {
            Client::Mcp(client) => client.call_tool(params).await.map_err(|err| match err {
                ServiceError::McpError(error) => CallError::Refused(error.message.to_string()),
                other => {
                    warn!(%other, "an upstream call was lost");
                    CallError::Lost(other.to_string())
                }
            }),
            Client::Made(connection) => connection.call_tool(step, params).await,
        }
    }
}

#[derive(Default)]
struct State {
    client: Option<Arc<Client>>,
    starts: u32,
}

/// Why an upstream call did not answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// The call never reached the server (it could not be started): nothing happened, and
    /// the next call starts it again.
    NotSent(String),
    /// The call never reached the server, and no later call will in this process (no such
    /// server, or it was started [`SERVER_STARTS_MAX`] times already): nothing happened.
    Unavailable(String),
    /// The server refused the request (a protocol error): nothing happened.
    Refused(String),
    /// The connection was lost during the call (the server died): the outcome is unknown.
    Lost(String),
}

/// The connections to the upstream servers of one kernel.
pub struct Hub {
    servers: Arc<Servers>,
    runs: Runs,
    steps: Arc<StepCalls>,
}

/// Where a hub's calls run.
enum Runs {
    /// On the runtime the hub was given while it runs ([`Hub::serving_on`]), else on the
    /// hub's own thread and runtime; programs are started on that thread either way.
    Thread {
        jobs: mpsc::UnboundedSender<Job>,
        serving: Option<Serving>,
        keepers: Arc<Keepers>,
    },
    /// On the caller's runtime ([`Hub::with_connector`]).
    InPlace,
}

/// The runtime a hub serves its connections on, and whether it still runs: a task of the
/// hub's, parked on it for good, says so when that runtime drops it.
struct Serving {
    handle: Handle,
    runs: Arc<AtomicBool>,
    /// The parked task, ended with the hub.
    parked: tokio::task::AbortHandle,
}

/// Clears its flag when dropped: when the runtime holding it stops.
struct Running(Arc<AtomicBool>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl Serving {
    fn on(handle: Handle) -> Serving {
        let runs = Arc::new(AtomicBool::new(true));
        let running = Running(Arc::clone(&runs));
        let parked = handle
            .spawn(async move {
                let _running = running;
                std::future::pending::<()>().await;
            })
            .abort_handle();
        Serving {
            handle,
            runs,
            parked,
        }
    }

    fn runs(&self) -> bool {
        self.runs.load(Ordering::Acquire)
    }
}

/// How a call that needs its server started has it started.
#[derive(Clone)]
enum Starter {
    /// Here: the call runs on the hub's thread (or has a [`Connector`], and starts no
    /// program).
    Here(Option<Arc<Keepers>>),
    /// By a job sent to the hub's thread: the call runs on a runtime confined with the
    /// kernel. Weak, so that a running call does not keep the thread from ending with the
    /// hub.
    Thread(mpsc::WeakUnboundedSender<Job>, Arc<Keepers>),
}

/// The processes of the servers a hub started, each kept by a task on the hub's thread
/// until it exits, or is stopped: when the hub is dropped, or before its server is started
/// again (so that at most one process of a server runs, and a compensation never reaches a
/// new process while the old one may still act on the call it undoes).
#[derive(Default)]
struct Keepers {
    kept: std::sync::Mutex<HashMap<String, Kept>>,
    /// One start of each server at a time.
    starts: std::sync::Mutex<HashMap<String, Arc<Mutex<()>>>>,
    /// Set when the hub is dropped: no start begins after.
    closing: AtomicBool,
}

/// The task keeping one server's process, what tells it to stop the process, and the run
/// tag the process and whatever it started carry.
struct Kept {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
    tag: String,
}

/// The parent's ends of a started server's stdin and stdout.
struct Pipes {
    stdin: OwnedFd,
    stdout: OwnedFd,
}

/// The step a call is made for: its saga and position.
#[derive(Debug, Clone, Copy)]
pub struct StepRef<'a> {
    /// The step's saga.
    pub saga_id: &'a str,
    /// The step's position in its saga.
    pub step_seq: u32,
}

/// The calls of each step still running at their server, one gate per step: a call holds
/// its step's gate from before it is sent until the server answered it (or the connection
/// was lost), on the upstream thread, whether or not anyone still waits for the answer; the
/// step's next call (its compensation after a timeout) waits for the gate first.
#[derive(Default)]
struct StepCalls {
    gates: std::sync::Mutex<HashMap<String, Arc<Mutex<()>>>>,
}

/// A step's gate, held (or waited for); the gate is forgotten once nobody holds or waits.
struct Boarding {
    calls: Arc<StepCalls>,
    key: String,
    gate: Option<Arc<Mutex<()>>>,
    held: Option<OwnedMutexGuard<()>>,
}

impl StepCalls {
    /// The gate of `step`, once its earlier calls have all been answered.
    async fn board(self: &Arc<Self>, step: StepRef<'_>) -> Boarding {
        let key = format!("{}/{}", step.saga_id, step.step_seq);
        let gate = Arc::clone(
            self.gates
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .entry(key.clone())
                .or_default(),
        );
        let mut boarding = Boarding {
            calls: Arc::clone(self),
            key,
            gate: Some(Arc::clone(&gate)),
            held: None,
        };
        let held = match Arc::clone(&gate).try_lock_owned() {
            Ok(held) => held,
            Err(_) => {
                info!(
                    step = %boarding.key,
                    "waiting for this step's earlier upstream call, still running at its server"
                );
                gate.lock_owned().await
            }
        };
        boarding.held = Some(held);
        boarding
    }
}

impl Drop for Boarding {
    fn drop(&mut self) {
        drop(self.held.take());
        drop(self.gate.take());
        let mut gates = self
            .calls
            .gates
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if gates
            .get(&self.key)
            .is_some_and(|gate| Arc::strong_count(gate) == 1)
        {
            gates.remove(&self.key);
        }
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        if let Runs::Thread {
            serving: Some(serving),
            ..
        } = &self.runs
        {
            serving.parked.abort();
        }
    }
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub").finish_non_exhaustive()
    }
}

impl Server {
    /// A live client, starting (or restarting) the server through `starter` when there is
    /// none.
    async fn client(&self, starter: &Starter) -> Result<Arc<Client>, CallError> {
        let mut state = self.state.lock().await;
        if let Some(client) = &state.client
            && !client.is_closed()
        {
            return Ok(Arc::clone(client));
        }
        if state.starts >= SERVER_STARTS_MAX {
            return Err(CallError::Unavailable(format!(
                "MCP server `{}` was started {} times and stopped each time; it is not started again by this process (SERVER_STARTS_MAX)",
                self.spec.name, state.starts
            )));
        }
        state.starts += 1;
        let client = match &self.connector {
            Some(connector) => {
                Client::Made(connector.connect(&self.spec).map_err(CallError::NotSent)?)
            }
            None => Client::Mcp(
                start(&self.spec, starter)
                    .await
                    .map_err(CallError::NotSent)?,
            ),
        };
        let client = Arc::new(client);
        state.client = Some(Arc::clone(&client));
        Ok(client)
    }
}

/// The program of `command`, as the tools file's folder sees a relative path.
fn program(folder: &Path, program: &str) -> std::path::PathBuf {
    let path = Path::new(program);
    if path.is_relative() && program.contains('/') {
        folder.join(path)
    } else {
        path.to_path_buf()
    }
}

/// Starts the server of `spec` through `starter` and initializes the session, served on
/// the runtime this runs on.
async fn start(
    spec: &ServerSpec,
    starter: &Starter,
) -> Result<RunningService<RoleClient, ()>, String> {
    let pipes = match starter {
        Starter::Here(Some(keepers)) => start_program(spec.clone(), Arc::clone(keepers)).await?,
        Starter::Here(None) => {
            return Err(format!(
                "MCP server `{}` cannot be started: this hub starts no programs",
                spec.name
            ));
        }
        Starter::Thread(jobs, keepers) => {
            let (reply, answer) = oneshot::channel();
            let (started, keepers) = (spec.clone(), Arc::clone(keepers));
            let job: Job = Box::new(move || {
                Box::pin(async move {
                    let _ = reply.send(start_program(started, keepers).await);
                })
            });
            let stopped = || {
                format!(
                    "MCP server `{}` cannot be started: the upstream thread stopped",
                    spec.name
                )
            };
            jobs.upgrade()
                .ok_or_else(stopped)?
                .send(job)
                .map_err(|_| stopped())?;
            answer.await.map_err(|_| {
                format!(
                    "MCP server `{}` was not started: the upstream thread stopped",
                    spec.name
                )
            })??
        }
    };
    let piped =
        |err: std::io::Error| format!("MCP server `{}`: cannot use its pipes: {err}", spec.name);
    let transport = (
        pipe::Receiver::from_owned_fd(pipes.stdout).map_err(piped)?,
        pipe::Sender::from_owned_fd(pipes.stdin).map_err(piped)?,
    );
    let client = tokio::time::timeout(spec.start_timeout, ().serve(transport))
        .await
        .map_err(|_| {
            format!(
                "MCP server `{}` did not initialize within {} s",
                spec.name,
                spec.start_timeout.as_secs_f64()
            )
        })?
        .map_err(|err| format!("MCP server `{}` did not initialize: {err}", spec.name))?;
    info!(server = %spec.name, "MCP server started");
    Ok(client)
}

/// Starts the program of `spec` on the hub's thread, once its earlier process (if any) and
/// what that started are gone, in a task of its own: begun, a start runs whole (stop,
/// spawn, keep) even when nobody waits for it any more, and one start of a server runs at a
/// time. Its stderr goes to the log, its process to `keepers`; the parent's ends of its
/// stdin and stdout.
async fn start_program(spec: ServerSpec, keepers: Arc<Keepers>) -> Result<Pipes, String> {
    let name = spec.name.clone();
    tokio::spawn(async move {
        let turn = keepers.start_turn(&spec.name);
        let _turn = turn.lock().await;
        if keepers.closing.load(Ordering::Acquire) {
            return Err(format!(
                "MCP server `{}` was not started: the hub is stopping its servers",
                spec.name
            ));
        }
        keepers.retire(&spec.name).await;
        let (pipes, child, tag) = spawn_program(&spec)?;
        keepers.keep(child, spec.name.clone(), tag);
        Ok(pipes)
    })
    .await
    .unwrap_or_else(|_| {
        Err(format!(
            "MCP server `{name}` was not started: the upstream thread stopped"
        ))
    })
}

/// Spawns the program of `spec` (on the hub's thread): the parent's ends of its stdin and
/// stdout, its process, and its run tag. Its stderr goes to the log.
fn spawn_program(spec: &ServerSpec) -> Result<(Pipes, tokio::process::Child, String), String> {
    let mut command = tokio::process::Command::new(program(&spec.folder, &spec.command[0]));
    command
        .args(&spec.command[1..])
        .current_dir(&spec.folder)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .env_clear();
    for name in ["PATH", "HOME"] {
        if let Some(value) = std::env::var_os(name) {
            command.env(name, value);
        }
    }
    command.envs(&spec.env);
    // Tagged, so that `recover` stops it (and what it started) once this process is dead,
    // and the hub before it starts the server again.
    let tag = agent_kernel_sandbox::programs::new_run_tag(&format!("upstream.{}", spec.name));
    command.env(agent_kernel_sandbox::programs::RUN_TAG_VAR, &tag);
    let mut child = command
        .spawn()
        .map_err(|err| format!("cannot start MCP server `{}`: {err}", spec.name))?;
    let piped = |end: Option<OwnedFd>| {
        end.ok_or_else(|| format!("MCP server `{}` was started without its pipes", spec.name))
    };
    let stdin = piped(child.stdin.take().and_then(|end| end.into_owned_fd().ok()))?;
    let stdout = piped(child.stdout.take().and_then(|end| end.into_owned_fd().ok()))?;
    if let Some(stderr) = child.stderr.take() {
        let name = spec.name.clone();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                info!(server = %name, "{line}");
            }
        });
    }
    Ok((Pipes { stdin, stdout }, child, tag))
}

impl Keepers {
    /// The turn of server `name`'s starts.
    fn start_turn(&self, name: &str) -> Arc<Mutex<()>> {
        Arc::clone(
            self.starts
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .entry(name.to_owned())
                .or_default(),
        )
    }

    /// Keeps `child`, the process of server `name` tagged `tag`, until it exits or is
    /// stopped (on the hub's thread).
    fn keep(&self, mut child: tokio::process::Child, name: String, tag: String) {
        let (stop_it, stopped) = oneshot::channel::<()>();
        let server = name.clone();
        let task = tokio::spawn(async move {
            tokio::select! {
                status = child.wait() => {
                    info!(server = %server, ?status, "MCP server exited");
                    return;
                }
                // Only when told: a sender dropped unsent leaves the process to the end of
                // the hub's runtime (which kills it).
                Ok(()) = stopped => {}
            }
            stop(&mut child, &server).await;
        });
        let kept = Kept {
            stop: stop_it,
            task,
            tag,
        };
        let earlier = self
            .kept
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(name, kept);
        debug_assert!(
            earlier.is_none(),
            "a start retires the earlier process first"
        );
    }

    /// Stops the process of server `name`, if one runs, and waits until it and whatever it
    /// started are gone.
    async fn retire(&self, name: &str) {
        let kept = self
            .kept
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(name);
        if let Some(kept) = kept {
            if !kept.task.is_finished() {
                info!(server = %name, "stopping the earlier process of this MCP server before starting it again");
            }
            retired(kept).await;
        }
    }

    /// Stops every server still running, and waits until each is gone.
    /// Starts under way finish first (later ones start nothing); the servers stop
    /// together.
    async fn stop_all(&self) {
        self.closing.store(true, Ordering::Release);
        let turns: Vec<_> = self
            .starts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .values()
            .map(Arc::clone)
            .collect();
        for turn in turns {
            drop(turn.lock().await);
        }
        let kept = std::mem::take(
            &mut *self
                .kept
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        let mut stopping = JoinSet::new();
        for kept in kept.into_values() {
            stopping.spawn(retired(kept));
        }
        while stopping.join_next().await.is_some() {}
    }
}

/// Stops a kept process and then whatever it started (a wrapper's server: `npx`, `sh -c`),
/// by its run tag.
async fn retired(kept: Kept) {
    let _ = kept.stop.send(());
    let _ = kept.task.await;
    let tag = kept.tag;
    let stopped =
        tokio::task::spawn_blocking(move || agent_kernel_sandbox::programs::stop_tagged(&tag))
            .await;
    match stopped {
        Ok(Ok(stopped)) if stopped.n_left > 0 => {
            warn!(
                left = stopped.n_left,
                "processes an MCP server started were not all stopped"
            );
        }
        Ok(Ok(_)) => {}
        Ok(Err(err)) => warn!(%err, "cannot look for the processes an MCP server started"),
        Err(err) => warn!(%err, "the search for the processes an MCP server started failed"),
    }
}

/// Stops a server whose stdin was closed (or is being closed): given [`SERVER_STOP_GRACE`]
/// to exit, then `SIGTERM` and as long again, then `SIGKILL`.
async fn stop(child: &mut tokio::process::Child, name: &str) {
    if tokio::time::timeout(SERVER_STOP_GRACE, child.wait())
        .await
        .is_ok()
    {
        return;
    }
    // Not reaped yet, so its pid is still its own.
    if let Some(pid) = child
        .id()
        .and_then(|pid| i32::try_from(pid).ok())
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        if tokio::time::timeout(SERVER_STOP_GRACE, child.wait())
            .await
            .is_ok()
        {
            return;
        }
    }
    warn!(server = %name, "MCP server did not stop when asked; killed");
    let _ = child.kill().await;
}

/// The servers of `specs`, none started, connected by `connector` when one is given.
fn servers(specs: Vec<ServerSpec>, connector: Option<Arc<dyn Connector>>) -> Arc<Servers> {
    Arc::new(
        specs
            .into_iter()
            .map(|spec| {
                (
                    spec.name.clone(),
                    Arc::new(Server {
                        spec,
                        connector: connector.clone(),
                        state: Mutex::new(State::default()),
                    }),
                )
            })
            .collect(),
    )
}

/// What a call sends back: its result, or, when the runtime running it dropped it (it
/// stopped, or the work panicked), whether it may have been sent.
struct Reply<T> {
    sender: Option<oneshot::Sender<Result<T, CallError>>>,
    sending: Sending,
}

/// Set by a call's work once its request may reach the server: from then on, a call that
/// ends without an answer may have happened.
#[derive(Clone, Default)]
struct Sending(Arc<AtomicBool>);

impl Sending {
    fn now(&self) {
        self.0.store(true, Ordering::Release);
    }

    fn began(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

impl<T> Reply<T> {
    fn send(mut self, result: Result<T, CallError>) {
        if let Some(sender) = self.sender.take() {
            let _ = sender.send(result);
        }
    }
}

impl<T> Drop for Reply<T> {
    fn drop(&mut self) {
        if let Some(sender) = self.sender.take() {
            let error = if self.sending.began() {
                CallError::Lost("the call ended without an answer: its runtime stopped".to_owned())
            } else {
                CallError::NotSent(
                    "the call ended before it was sent: its runtime stopped".to_owned(),
                )
            };
            let _ = sender.send(Err(error));
        }
    }
}

impl Hub {
    /// Starts the thread that will start `specs`' servers and serve their connections; no
    /// server is started yet.
    ///
    /// # Errors
    ///
    /// An I/O error when the thread or its runtime cannot be started.
    pub fn new(specs: Vec<ServerSpec>) -> std::io::Result<Hub> {
        Hub::started(specs, None)
    }

    /// As [`Hub::new`], but the connections are served on the runtime of `runtime` while it
    /// runs (on the hub's thread once it stopped): calls made on that runtime reach their
    /// server without a hand-off between threads. The runtime must have its I/O and time
    /// drivers enabled (`enable_all`), and be run while calls are made: a current-thread
    /// runtime between two `block_on`s serves nothing.
    ///
    /// # Errors
    ///
    /// As [`Hub::new`].
    pub fn serving_on(specs: Vec<ServerSpec>, runtime: Handle) -> std::io::Result<Hub> {
        Hub::started(specs, Some(runtime))
    }

    fn started(specs: Vec<ServerSpec>, serving: Option<Handle>) -> std::io::Result<Hub> {
        let servers = servers(specs, None);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|err| {
                std::io::Error::new(
                    err.kind(),
                    format!("cannot start the upstream runtime: {err}"),
                )
            })?;
        let keepers = Arc::new(Keepers::default());
        let (jobs, mut queue) = mpsc::unbounded_channel::<Job>();
        let owned = (Arc::clone(&servers), Arc::clone(&keepers));
        std::thread::Builder::new()
            .name("agent-kernel-upstream".to_owned())
            .spawn(move || {
                let (servers, keepers) = owned;
                runtime.block_on(async move {
                    let mut running = JoinSet::new();
                    while let Some(job) = queue.recv().await {
                        running.spawn(job());
                        while running.try_join_next().is_some() {}
                    }
                    // The kernel is gone: stop what runs here, close the connections no
                    // call holds any more, then stop every server.
                    running.shutdown().await;
                    // A server whose state a call holds (starting it) is left to be stopped.
                    for server in servers.values() {
                        if let Ok(mut state) = server.state.try_lock()
                            && let Some(client) = state.client.take()
                            && let Ok(Client::Mcp(client)) = Arc::try_unwrap(client)
                        {
                            let _ = tokio::time::timeout(SERVER_STOP_GRACE, client.cancel()).await;
                        }
                    }
                    keepers.stop_all().await;
                });
            })
            .map_err(|err| {
                std::io::Error::new(
                    err.kind(),
                    format!("cannot start the upstream thread: {err}"),
                )
            })?;
        Ok(Hub {
            servers,
            runs: Runs::Thread {
                jobs,
                serving: serving.map(Serving::on),
                keepers,
            },
            steps: Arc::default(),
        })
    }

    /// A hub whose servers `connector` connects to, in place of starting their programs,
    /// and whose calls run on the runtime of whoever calls (`tokio::spawn`), not on a thread
    /// of their own: with a paused clock, they keep to its one schedule. For simulations
    /// and tests; every call must be made within a Tokio runtime.
    pub fn with_connector(specs: Vec<ServerSpec>, connector: Arc<dyn Connector>) -> Hub {
        Hub {
            servers: servers(specs, Some(connector)),
            runs: Runs::InPlace,
            steps: Arc::default(),
        }
    }

    /// Runs `work` with the server `name` where this hub's calls run; its answer.
    fn submit<T, F>(
        &self,
        name: &str,
        work: impl FnOnce(Arc<Server>, Starter, Sending) -> F + Send + 'static,
    ) -> oneshot::Receiver<Result<T, CallError>>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, CallError>> + Send + 'static,
    {
        let (sender, answer) = oneshot::channel();
        let sending = Sending::default();
        let reply = Reply {
            sender: Some(sender),
            sending: sending.clone(),
        };
        let Some(server) = self.servers.get(name).map(Arc::clone) else {
            reply.send(Err(CallError::Unavailable(format!(
                "no MCP server `{name}`"
            ))));
            return answer;
        };
        let job = move |starter: Starter| async move {
            let result = work(server, starter, sending).await;
            reply.send(result);
        };
        match &self.runs {
            Runs::InPlace => {
                tokio::spawn(job(Starter::Here(None)));
            }
            Runs::Thread {
                jobs,
                serving: Some(serving),
                keepers,
            } if serving.runs() => {
                let starter = Starter::Thread(jobs.downgrade(), Arc::clone(keepers));
                serving.handle.spawn(job(starter));
            }
            Runs::Thread { jobs, keepers, .. } => {
                let starter = Starter::Here(Some(Arc::clone(keepers)));
                if let Err(mpsc::error::SendError(job)) =
                    jobs.send(Box::new(move || Box::pin(job(starter))))
                {
                    // The thread is gone: the call was never sent, and no later call will be.
                    drop(job);
                    let (sender, answer) = oneshot::channel();
                    let _ = sender.send(Err(CallError::Unavailable(
                        "the upstream thread stopped before the call was sent".to_owned(),
                    )));
                    return answer;
                }
            }
        }
        answer
    }

    /// The tools of server `name`, starting it when it is not running: waited for at most
    /// its `start_timeout_ms` (default [`SERVER_START_TIMEOUT`], at most
    /// [`SERVER_START_TIMEOUT_MS_MAX`]).
    ///
    /// # Errors
    ///
    /// [`ToolError::failed`] naming the server when it cannot be started, does not answer in
    /// time or does not list its tools.
    pub async fn list_tools(&self, name: &str) -> Result<Vec<Tool>, ToolError> {
        let answer = self.submit(name, |server: Arc<Server>, starter, _| async move {
            let start_timeout = server.spec.start_timeout;
            let listed = async { server.client(&starter).await?.list_tools().await };
            tokio::time::timeout(start_timeout, listed)
                .await
                .unwrap_or_else(|_| {
                    Err(CallError::NotSent(format!(
                        "MCP server `{}` did not start and list its tools within {} s (start_timeout_ms)",
                        server.spec.name,
                        start_timeout.as_secs_f64()
                    )))
                })
        });
        match answer.await {
            Ok(Ok(tools)) => Ok(tools),
            Ok(Err(
                CallError::NotSent(message)
                | CallError::Unavailable(message)
                | CallError::Refused(message)
                | CallError::Lost(message),
            )) => Err(ToolError::failed(message)),
            Err(_) => Err(ToolError::failed(format!(
                "MCP server `{name}` did not list its tools: the upstream thread stopped"
            ))),
        }
    }

    /// Calls `tool` of server `name` with `args` for `step`, once every earlier call for
    /// `step` was answered: a call whose answer the caller stopped waiting for (a timeout)
    /// may still be acting at the server, and a compensation sent meanwhile could be
    /// overtaken by the effect it undoes. The call holds the step's turn until the server
    /// answers it, whether or not the caller still waits.
    ///
    /// # Errors
    ///
    /// A [`CallError`] saying whether the call may have happened.
    pub async fn call(
        &self,
        step: StepRef<'_>,
        name: &str,
        tool: &str,
        args: JsonObject,
    ) -> Result<CallToolResult, CallError> {
        let tool = tool.to_owned();
        let saga_id = step.saga_id.to_owned();
        let step_seq = step.step_seq;
        let turn = self.steps.board(step).await;
        // Planted for the simulator to find: the turn given back at once, so a compensation
        // is sent while the step's call still runs.
        #[cfg(feature = "sim-plant-no-turns")]
        let turn = drop(turn);
        let answer = self.submit(
            name,
            move |server: Arc<Server>, starter, sending| async move {
                // Held until the server answered, wherever the call runs.
                let _turn = turn;
                let step = StepRef {
                    saga_id: &saga_id,
                    step_seq,
                };
                let client = server.client(&starter).await?;
                sending.now();
                client
                    .call_tool(step, CallToolRequestParams::new(tool).with_arguments(args))
                    .await
            },
        );
        answer
            .await
            // A `Reply` answers even when dropped; were it lost, the call may have been sent.
            .unwrap_or_else(|_| Err(CallError::Lost("the upstream thread stopped".to_owned())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(saga_id: &str, step_seq: u32) -> StepRef<'_> {
        StepRef { saga_id, step_seq }
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
        let Runs::Thread {
            serving: Some(serving),
            ..
        } = &hub.runs
        else {
            panic!("a serving runtime was recorded");
        };
        assert!(!serving.runs(), "the hub knows its runtime stopped");

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
        spec.command[2] =
            LISTING_SERVER.replace(r#"}]}}\n' "$id" ;;"#, r#"}]}}\n' "$id"; exit 0 ;;"#);
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
        // The serving runtime still runs: the start is a job sent from it to the thread.
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
            let keepers = Arc::new(Keepers::default());
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
        let Runs::Thread {
            serving: Some(served),
            ..
        } = &hub.runs
        else {
            panic!("a serving runtime was recorded");
        };
        let parked = Arc::clone(&served.runs);
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
        assert!(
            !parked.load(Ordering::Acquire),
            "the hub's parked task ended with it"
        );
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
        let gave_up =
            tokio::time::timeout(Duration::from_millis(10), calls.board(step("s", 0))).await;
        assert!(gave_up.is_err(), "still held by the first call");
        drop(first);
        assert!(calls.gates.lock().expect("not poisoned").is_empty());
    }
}
