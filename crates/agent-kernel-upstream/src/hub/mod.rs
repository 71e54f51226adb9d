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
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use agent_kernel_api::{BoxFuture, ToolError};
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, CallToolResult, JsonObject, Tool};
use rmcp::service::{RoleClient, RunningService, ServiceError};
use tokio::net::unix::pipe;
use tokio::runtime::Handle;
use tokio::sync::{Mutex, OwnedMutexGuard, mpsc, oneshot};
use tokio::task::JoinSet;
use tracing::{info, warn};

#[cfg(doc)]
use crate::SERVER_START_TIMEOUT_MS_MAX;
use crate::config::ServerSpec;

mod programs;

use programs::{Keepers, start_program};

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

/// The runtime a hub serves its connections on, and a task of the hub's parked on it for
/// good, which ends when that runtime stops (or the hub is dropped).
struct Serving {
    handle: Handle,
    parked: tokio::task::AbortHandle,
}

impl Serving {
    fn on(handle: Handle) -> Serving {
        let parked = handle.spawn(std::future::pending::<()>()).abort_handle();
        Serving { handle, parked }
    }

    /// Whether the runtime still runs.
    fn runs(&self) -> bool {
        !self.parked.is_finished()
    }
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
    /// A live client, starting (or restarting) the server when there is none: its program
    /// by `keepers`, or its connection by the hub's [`Connector`].
    async fn client(&self, keepers: Option<&Arc<Keepers>>) -> Result<Arc<Client>, CallError> {
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
        let client = match (&self.connector, keepers) {
            (Some(connector), _) => {
                Client::Made(connector.connect(&self.spec).map_err(CallError::NotSent)?)
            }
            (None, Some(keepers)) => Client::Mcp(
                start(&self.spec, keepers)
                    .await
                    .map_err(CallError::NotSent)?,
            ),
            (None, None) => {
                return Err(CallError::Unavailable(format!(
                    "MCP server `{}` cannot be started: this hub starts no programs",
                    self.spec.name
                )));
            }
        };
        let client = Arc::new(client);
        state.client = Some(Arc::clone(&client));
        Ok(client)
    }
}

/// Starts the server of `spec` (its program by `keepers`, on the hub's thread) and
/// initializes the session, served on the runtime this runs on.
async fn start(
    spec: &ServerSpec,
    keepers: &Arc<Keepers>,
) -> Result<RunningService<RoleClient, ()>, String> {
    let pipes = start_program(spec.clone(), Arc::clone(keepers)).await?;
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
        let keepers = Arc::new(Keepers::on(runtime.handle().clone()));
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
        work: impl FnOnce(Arc<Server>, Option<Arc<Keepers>>, Sending) -> F + Send + 'static,
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
        let job = move |keepers: Option<Arc<Keepers>>| async move {
            let result = work(server, keepers, sending).await;
            reply.send(result);
        };
        match &self.runs {
            Runs::InPlace => {
                tokio::spawn(job(None));
            }
            Runs::Thread {
                serving: Some(serving),
                keepers,
                ..
            } if serving.runs() => {
                serving.handle.spawn(job(Some(Arc::clone(keepers))));
            }
            Runs::Thread { jobs, keepers, .. } => {
                let keepers = Some(Arc::clone(keepers));
                if let Err(mpsc::error::SendError(job)) =
                    jobs.send(Box::new(move || Box::pin(job(keepers))))
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
        let answer = self.submit(name, |server: Arc<Server>, keepers, _| async move {
            let start_timeout = server.spec.start_timeout;
            let listed = async { server.client(keepers.as_ref()).await?.list_tools().await };
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
            move |server: Arc<Server>, keepers, sending| async move {
                // Held until the server answered, wherever the call runs.
                let _turn = turn;
                let step = StepRef {
                    saga_id: &saga_id,
                    step_seq,
                };
                let client = server.client(keepers.as_ref()).await?;
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
mod tests;
