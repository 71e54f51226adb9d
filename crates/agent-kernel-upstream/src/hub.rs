//! The upstream servers' connections: one thread with its own runtime owns every client
//! (rmcp over stdio), starts a server when it is first needed, restarts one that died for
//! the next call within [`SERVER_STARTS_MAX`], and answers calls from any runtime.
//!
//! The thread is started before the kernel confines itself (Landlock), so the servers it
//! starts run outside the kernel's sandbox, as the separate programs they are.
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
use std::path::Path;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use agent_kernel_api::{BoxFuture, ToolError};
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, CallToolResult, JsonObject, Tool};
use rmcp::service::{RoleClient, RunningService, ServiceError};
use rmcp::transport::TokioChildProcess;
use tokio::io::AsyncBufReadExt;
use tokio::sync::{Mutex, OwnedMutexGuard, mpsc, oneshot};
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

type Servers = BTreeMap<String, Arc<Server>>;
type Job = Box<dyn FnOnce(Arc<Servers>) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

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
    jobs: Jobs,
    steps: Arc<StepCalls>,
}

/// Where a hub's calls run.
enum Jobs {
    /// On the hub's own thread and runtime ([`Hub::new`]).
    Thread(mpsc::UnboundedSender<Job>),
    /// On the caller's runtime ([`Hub::with_connector`]).
    InPlace(Arc<Servers>),
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

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub").finish_non_exhaustive()
    }
}

impl Server {
    /// A live client, starting (or restarting) the server when there is none.
    async fn client(&self) -> Result<Arc<Client>, CallError> {
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
            None => Client::Mcp(start(&self.spec).await.map_err(CallError::NotSent)?),
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

/// Starts the server of `spec` and initializes the session; its stderr goes to the log.
async fn start(spec: &ServerSpec) -> Result<RunningService<RoleClient, ()>, String> {
    let mut command = tokio::process::Command::new(program(&spec.folder, &spec.command[0]));
    command
        .args(&spec.command[1..])
        .current_dir(&spec.folder)
        .env_clear();
    for name in ["PATH", "HOME"] {
        if let Some(value) = std::env::var_os(name) {
            command.env(name, value);
        }
    }
    command.envs(&spec.env);
    // Tagged, so that `recover` stops it (and what it started) once this process is dead.
    command.env(
        agent_kernel_sandbox::programs::RUN_TAG_VAR,
        agent_kernel_sandbox::programs::new_run_tag(&format!("upstream.{}", spec.name)),
    );
    let (transport, stderr) = TokioChildProcess::builder(command)
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|err| format!("cannot start MCP server `{}`: {err}", spec.name))?;
    if let Some(stderr) = stderr {
        let name = spec.name.clone();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                info!(server = %name, "{line}");
            }
        });
    }
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

impl Hub {
    /// Starts the thread that will own the connections to `specs`' servers; no server is
    /// started yet.
    ///
    /// # Errors
    ///
    /// An I/O error when the thread or its runtime cannot be started.
    pub fn new(specs: Vec<ServerSpec>) -> std::io::Result<Hub> {
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
        let (jobs, mut queue) = mpsc::unbounded_channel::<Job>();
        std::thread::Builder::new()
            .name("agent-kernel-upstream".to_owned())
            .spawn(move || {
                runtime.block_on(async move {
                    let mut running = tokio::task::JoinSet::new();
                    while let Some(job) = queue.recv().await {
                        running.spawn(job(Arc::clone(&servers)));
                        while running.try_join_next().is_some() {}
                    }
                    // The kernel is gone: stop what runs, then every server, here, where
                    // their runtime still runs.
                    running.shutdown().await;
                    for server in servers.values() {
                        if let Some(client) = server.state.lock().await.client.take()
                            && let Ok(Client::Mcp(client)) = Arc::try_unwrap(client)
                        {
                            let _ = client.cancel().await;
                        }
                    }
                });
            })
            .map_err(|err| {
                std::io::Error::new(
                    err.kind(),
                    format!("cannot start the upstream thread: {err}"),
                )
            })?;
        Ok(Hub {
            jobs: Jobs::Thread(jobs),
            steps: Arc::default(),
        })
    }

    /// A hub whose servers `connector` connects to, in place of starting their programs,
    /// and whose calls run on the runtime of whoever calls (`tokio::spawn`), not on a thread
    /// of their own: with a paused clock, they keep to its one schedule. For simulations
    /// and tests; every call must be made within a Tokio runtime.
    pub fn with_connector(specs: Vec<ServerSpec>, connector: Arc<dyn Connector>) -> Hub {
        Hub {
            jobs: Jobs::InPlace(servers(specs, Some(connector))),
            steps: Arc::default(),
        }
    }

    /// Runs `work` on the upstream thread with the server `name`; its answer.
    fn submit<T, F>(
        &self,
        name: &str,
        work: impl FnOnce(Arc<Server>) -> F + Send + 'static,
    ) -> oneshot::Receiver<Result<T, CallError>>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, CallError>> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let name = name.to_owned();
        let job: Job = Box::new(move |servers: Arc<Servers>| {
            Box::pin(async move {
                let result = match servers.get(&name) {
                    Some(server) => work(Arc::clone(server)).await,
                    None => Err(CallError::Unavailable(format!("no MCP server `{name}`"))),
                };
                let _ = reply.send(result);
            })
        });
        let sent = match &self.jobs {
            Jobs::Thread(jobs) => jobs.send(job).is_ok(),
            Jobs::InPlace(servers) => {
                tokio::spawn(job(Arc::clone(servers)));
                true
            }
        };
        if !sent {
            // The thread is gone: the call was never sent, and no later call will be.
            let (reply, answer) = oneshot::channel();
            let _ = reply.send(Err(CallError::Unavailable(
                "the upstream thread stopped before the call was sent".to_owned(),
            )));
            return answer;
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
        let answer = self.submit(name, |server: Arc<Server>| async move {
            let start_timeout = server.spec.start_timeout;
            let listed = async { server.client().await?.list_tools().await };
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
        let answer = self.submit(name, move |server: Arc<Server>| async move {
            // Held until the server answered, on the upstream thread.
            let _turn = turn;
            let step = StepRef {
                saga_id: &saga_id,
                step_seq,
            };
            let client = server.client().await?;
            client
                .call_tool(step, CallToolRequestParams::new(tool).with_arguments(args))
                .await
        });
        answer
            .await
            // Dropped by the thread during the call (it stopped): the call may have been sent.
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
