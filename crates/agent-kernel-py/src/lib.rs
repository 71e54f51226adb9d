//! `agent_kernel._native`: the Python binding over the Rust engine.
//!
//! The Python package `agent_kernel` (in `python/`) is the public face; this module gives it
//! a kernel (`NativeKernel`, built by the front door's `KernelBuilder` with the
//! command line's defaults), live sagas (`NativeSaga`) and Python functions as tools
//! (`NativeTool`). Everything crosses as JSON text, which the Python side parses: the
//! engine's own documents (a call's answer, a saga's report), unchanged.
//!
//! Every call that waits on the engine releases the GIL (`Python::detach`) while it waits on
//! one shared tokio runtime, so other Python threads run meanwhile, and a Python tool, which
//! runs on a blocking thread of that runtime, can take the GIL to run.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use agent_kernel::{BeginOptions, Kernel, KernelBuilder, KernelError, LiveSaga, ToolEntry};
use agent_kernel_api::{
    Compensate, Durability, EffectClass, KeyTemplate, Probe, ProbeOutcome, Reversibility,
    Settlement, Tool, ToolContext, ToolError, ToolOutput, Undo, UndoWindow, parse_templates,
};
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use serde_json::Value;
use tokio::sync::watch;

pyo3::create_exception!(
    _native,
    NativeError,
    PyException,
    "An error of the engine: `args` are its kind (a short name) and its message."
);

/// The worker threads of the runtime every kernel of the process shares.
pub const RUNTIME_WORKERS: usize = 2;

/// The phases of Python tools running now, on the runtime's blocking threads. The package
/// waits for them at interpreter exit (`agent_kernel._wait_for_tools`): a thread still in
/// Python code when the interpreter finalizes would abort the process.
static PHASES_RUNNING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Counts a running phase while it lives.
struct PhaseRunning;

impl PhaseRunning {
    fn start() -> PhaseRunning {
        PHASES_RUNNING.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        PhaseRunning
    }
}

impl Drop for PhaseRunning {
    fn drop(&mut self) {
        PHASES_RUNNING.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// How many phases of Python tools are running now (a hung one counts until it returns).
#[pyfunction]
fn python_phases_running() -> usize {
    PHASES_RUNNING.load(std::sync::atomic::Ordering::SeqCst)
}

/// The runtime every kernel of the process runs on, built on first use.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(RUNTIME_WORKERS)
            .thread_name("agent-kernel")
            .enable_all()
            .build()
            .expect("a tokio runtime can be built")
    })
}

/// Waits for `future` on the shared runtime with the GIL released.
fn wait<T: Send>(py: Python<'_>, future: impl Future<Output = T> + Send) -> T {
    py.detach(|| runtime().block_on(future))
}

/// The kind of an engine error, as the Python exceptions name it.
fn kind_of(error: &KernelError) -> &'static str {
    match error {
        KernelError::Preflight(_)
        | KernelError::Setup(_)
        | KernelError::InvalidRequest(_)
        | KernelError::TooManyOpenSagas { .. }
        | KernelError::NotAwaitingApproval { .. } => "bad_input",
        KernelError::Denied { .. } => "denied",
        KernelError::Conflict(_) => "conflict",
        KernelError::SagaNotOpen(_) => "saga_closed",
        KernelError::SagaNotFound(_)
        | KernelError::ApprovalNotFound(_)
        | KernelError::DeadLetterNotFound(_) => "not_found",
        KernelError::Log(_) | KernelError::Interrupted { .. } => "log",
        KernelError::MissingTools { .. } | KernelError::Inconsistent { .. } => "operator_attention",
        _ => "kernel",
    }
}

fn native_error(error: &KernelError) -> PyErr {
    NativeError::new_err((kind_of(error), error.to_string()))
}

fn to_json(value: &impl serde::Serialize) -> PyResult<String> {
    serde_json::to_string(value).map_err(|error| PyValueError::new_err(error.to_string()))
}

fn parse_json(what: &str, text: &str) -> PyResult<Value> {
    serde_json::from_str(text)
        .map_err(|error| PyValueError::new_err(format!("{what} is not JSON: {error}")))
}

/// A kernel: a log, a policy, an FSM table and tools, as `agent-kernel` builds them.
#[pyclass(frozen, module = "agent_kernel._native")]
struct NativeKernel {
    kernel: Arc<Kernel>,
}

#[pymethods]
impl NativeKernel {
    /// Builds a kernel; `None` takes the command line's default for that part.
    #[new]
    #[pyo3(signature = (db=None, sandbox=None, fsm=None, tools=None, durability="full", cwd=None, python_tools=Vec::new(), drills=false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        db: Option<PathBuf>,
        sandbox: Option<PathBuf>,
        fsm: Option<PathBuf>,
        tools: Option<PathBuf>,
        durability: &str,
        cwd: Option<PathBuf>,
        python_tools: Vec<Py<NativeTool>>,
        drills: bool,
    ) -> PyResult<NativeKernel> {
        let durability = match durability {
            "full" => Durability::Full,
            "normal" => Durability::Normal,
            other => {
                return Err(NativeError::new_err((
                    "bad_input",
                    format!("durability is `full` or `normal`, not `{other}`"),
                )));
            }
        };
        // The command line's defaults, from the working folder.
        let mut builder = KernelBuilder::from_folder(".")
            .durability(durability)
            .upstream_runtime(runtime().handle().clone());
        if let Some(db) = db {
            builder = builder.db(db);
        }
        if let Some(sandbox) = sandbox {
            builder = builder.sandbox_file(sandbox);
        }
        if let Some(fsm) = fsm {
            builder = builder.fsm_file(fsm);
        }
        if let Some(tools) = tools {
            builder = builder.tools_file(tools);
        }
        if let Some(cwd) = cwd {
            builder = builder.cwd(cwd);
        }
        if drills {
            builder = builder.with_drill_tools();
        }
        for tool in python_tools {
            let tool = tool.get().clone();
            let timeout_ms = tool.spec.timeout_ms;
            builder =
                builder.tool_entry_with_timeout(ToolEntry::compensated_probed(tool), timeout_ms);
        }
        // Building opens the log and starts upstream servers: no runtime, no GIL.
        let kernel = py
            .detach(|| builder.build())
            .map_err(|error| native_error(&error))?;
        Ok(NativeKernel { kernel })
    }

    /// Begins a live saga.
    #[pyo3(signature = (name=None, actor=None))]
    fn begin(
        &self,
        py: Python<'_>,
        name: Option<String>,
        actor: Option<String>,
    ) -> PyResult<NativeSaga> {
        let kernel = Arc::clone(&self.kernel);
        let saga = wait(py, async move {
            // The engine's timers (the idle timeout) need its runtime.
            kernel
                .begin(BeginOptions {
                    name,
                    actor,
                    ..BeginOptions::default()
                })
                .await
        })
        .map_err(|error| native_error(&error))?;
        Ok(NativeSaga { saga })
    }

    /// An open live saga of this kernel, by id.
    fn live_saga(&self, saga_id: &str) -> Option<NativeSaga> {
        self.kernel
            .live_saga(&agent_kernel_api::SagaId::new(saga_id))
            .map(|saga| NativeSaga { saga })
    }

    /// Runs a plan (its JSON text) to its end; the saga's report as JSON.
    fn run_plan(&self, py: Python<'_>, plan: &str) -> PyResult<String> {
        let plan: agent_kernel_api::Plan = agent_kernel_api::Plan::from_json(plan)
            .map_err(|error| NativeError::new_err(("bad_input", error.to_string())))?;
        let kernel = Arc::clone(&self.kernel);
        let report = wait(py, async move {
            kernel.run(&plan, &agent_kernel::NoObserver).await
        })
        .map_err(|error| native_error(&error))?;
        to_json(&report)
    }

    /// Rolls back the unfinished sagas of dead processes; the recovery report as JSON.
    fn recover(&self, py: Python<'_>) -> PyResult<String> {
        let kernel = Arc::clone(&self.kernel);
        let report = wait(py, async move {
            agent_kernel::operator::recover(&kernel, &agent_kernel::NoObserver).await
        })
        .map_err(|error| native_error(&error))?;
        to_json(&report)
    }

    /// The most recent sagas, newest first, as JSON.
    #[pyo3(signature = (limit=20))]
    fn sagas(&self, py: Python<'_>, limit: u32) -> PyResult<String> {
        let kernel = Arc::clone(&self.kernel);
        let sagas = wait(py, async move {
            agent_kernel::operator::sagas(kernel.log().as_ref(), limit).await
        })
        .map_err(|error| native_error(&error))?;
        to_json(&sagas)
    }

    /// One saga with its steps, as JSON, or `None`.
    fn saga(&self, py: Python<'_>, saga_id: &str) -> PyResult<Option<String>> {
        let kernel = Arc::clone(&self.kernel);
        let id = agent_kernel_api::SagaId::new(saga_id);
        let saga = wait(py, async move { kernel.log().saga(&id).await })
            .map_err(|error| native_error(&KernelError::Log(error)))?;
        saga.map(|saga| to_json(&saga)).transpose()
    }

    /// The approval requests open to a decision (pending and not expired), as JSON
    /// documents: the operator's list, as `agent-kernel approvals` shows it.
    fn approvals(&self, py: Python<'_>) -> PyResult<String> {
        let kernel = Arc::clone(&self.kernel);
        let pending = wait(py, async move {
            agent_kernel::operator::pending_approvals(&kernel).await
        })
        .map_err(|error| native_error(&error))?;
        let documents: Vec<Value> = pending
            .iter()
            .map(|view| agent_kernel::approval_document(&view.request))
            .collect();
        to_json(&documents)
    }

    /// The ids of the tools this kernel runs (its upstream servers asked for theirs).
    fn tool_ids(&self, py: Python<'_>) -> Vec<String> {
        let kernel = Arc::clone(&self.kernel);
        wait(py, async move { kernel.load_all_tools().await });
        self.kernel.tool_ids()
    }
}

/// An open live saga.
#[pyclass(frozen, module = "agent_kernel._native")]
struct NativeSaga {
    saga: LiveSaga,
}

#[pymethods]
impl NativeSaga {
    /// The saga's id.
    #[getter]
    fn id(&self) -> String {
        self.saga.id().to_string()
    }

    /// Runs one step; the engine's answer (`CallAnswer`) as JSON.
    #[pyo3(signature = (tool, args, key=None))]
    fn call(
        &self,
        py: Python<'_>,
        tool: String,
        args: &str,
        key: Option<String>,
    ) -> PyResult<String> {
        let args = parse_json("the arguments", args)?;
        let saga = self.saga.clone();
        let answer = wait(py, async move { saga.call(&tool, args, key).await })
            .map_err(|error| native_error(&error))?;
        to_json(&answer)
    }

    /// Resumes a step that waited for an approval; the answer as JSON.
    fn resume(&self, py: Python<'_>) -> PyResult<String> {
        let saga = self.saga.clone();
        let answer =
            wait(py, async move { saga.resume().await }).map_err(|error| native_error(&error))?;
        to_json(&answer)
    }

    /// Commits; the saga's report as JSON.
    fn commit(&self, py: Python<'_>) -> PyResult<String> {
        let saga = self.saga.clone();
        let report =
            wait(py, async move { saga.commit().await }).map_err(|error| native_error(&error))?;
        to_json(&report)
    }

    /// Rolls the saga back; its report as JSON.
    fn abort(&self, py: Python<'_>, reason: String) -> PyResult<String> {
        let saga = self.saga.clone();
        let report = wait(py, async move { saga.abort(&reason).await })
            .map_err(|error| native_error(&error))?;
        to_json(&report)
    }

    /// Where the saga stands, as JSON, or `None` once it has ended.
    fn status(&self, py: Python<'_>) -> PyResult<Option<String>> {
        let saga = self.saga.clone();
        let status = wait(py, async move { saga.status().await });
        status.map(|status| to_json(&status)).transpose()
    }
}

/// What a Python tool declares.
#[derive(Debug, Clone)]
struct ToolSpec {
    id: String,
    version: String,
    description: String,
    effect: EffectClass,
    idempotent: bool,
    settlement: Settlement,
    reversibility: Reversibility,
    undo_window: Option<UndoWindow>,
    schema: Value,
    timeout_ms: Option<u64>,
    resources: Vec<KeyTemplate>,
    duplicate_keys: Vec<KeyTemplate>,
}

/// A Python function as a tool. Its phases are Python callables taking and returning JSON
/// text, which the Python side wraps (`agent_kernel.tool`): `execute(args)`,
/// `compensate(args, output, undo)`, optionally `prepare(args)` and `probe(args, undo)`.
/// Each returns `{"ok": value}`, `{"failed": message}` (nothing was applied) or
/// `{"uncertain": message}` (the effect may have happened).
#[pyclass(frozen, module = "agent_kernel._native")]
#[derive(Clone)]
struct NativeTool {
    spec: Arc<ToolSpec>,
    execute: Arc<Py<PyAny>>,
    compensate: Option<Arc<Py<PyAny>>>,
    prepare: Option<Arc<Py<PyAny>>>,
    probe: Option<Arc<Py<PyAny>>>,
    /// The executes still running, by saga and step: one the dispatcher gave up on (its
    /// timeout) goes on in its thread, and its step is compensated or probed only once it
    /// has returned.
    running: Arc<Mutex<RunningExecutes>>,
}

/// The executes of a tool still running, by saga id and step: told when each returns.
type RunningExecutes = HashMap<(String, u32), watch::Receiver<bool>>;

/// How long a compensation or a probe waits for the step's execute, still running after
/// its timeout, when the tool declares no timeout of its own (which is then the wait).
pub const EXECUTE_DRAIN_DEFAULT_MS: u64 = 30_000;

#[pymethods]
impl NativeTool {
    #[new]
    #[pyo3(signature = (id, execute, *, compensate=None, prepare=None, probe=None, effect="mutating", idempotent=false, settlement="compensate", reversibility=None, undo_window=None, schema="{\"type\":\"object\"}", description="", version="1", timeout_ms=None, resources=Vec::new(), duplicate_keys=Vec::new()))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        id: String,
        execute: Py<PyAny>,
        compensate: Option<Py<PyAny>>,
        prepare: Option<Py<PyAny>>,
        probe: Option<Py<PyAny>>,
        effect: &str,
        idempotent: bool,
        settlement: &str,
        reversibility: Option<&str>,
        undo_window: Option<&str>,
        schema: &str,
        description: &str,
        version: &str,
        timeout_ms: Option<u64>,
        resources: Vec<String>,
        duplicate_keys: Vec<String>,
    ) -> PyResult<NativeTool> {
        let bad = |message: String| {
            NativeError::new_err(("bad_input", format!("tool `{id}`: {message}")))
        };
        let effect = match effect {
            "mutating" => EffectClass::Mutating,
            "read-only" | "read_only" => EffectClass::ReadOnly,
            other => {
                return Err(bad(format!(
                    "effect is `mutating` or `read-only`, not `{other}`"
                )));
            }
        };
        let settlement = match settlement {
            "compensate" => Settlement::Compensate,
            "probe" => Settlement::Probe,
            "operator" => Settlement::Operator,
            other => {
                return Err(bad(format!(
                    "settlement is `compensate`, `probe` or `operator`, not `{other}`"
                )));
            }
        };
        if settlement == Settlement::Probe && probe.is_none() {
            return Err(bad("settlement `probe` needs a probe".to_owned()));
        }
        let reversibility = match reversibility {
            Some("full") => Reversibility::Full,
            Some("partial") => Reversibility::Partial,
            Some("none") => Reversibility::None,
            Some(other) => {
                return Err(bad(format!(
                    "reversibility is `full`, `partial` or `none`, not `{other}`"
                )));
            }
            None if compensate.is_some() || effect == EffectClass::ReadOnly => Reversibility::Full,
            None => Reversibility::None,
        };
        if effect == EffectClass::Mutating
            && compensate.is_none()
            && reversibility != Reversibility::None
        {
            return Err(bad(
                "a mutating tool needs a compensation, or reversibility \"none\"".to_owned(),
            ));
        }
        let undo_window = undo_window
            .map(|text| {
                text.parse::<UndoWindow>()
                    .map_err(|error| bad(error.to_string()))
            })
            .transpose()?;
        let schema: Value = serde_json::from_str(schema)
            .map_err(|error| bad(format!("its schema is not JSON: {error}")))?;
        let resources = parse_templates("resources", &resources).map_err(&bad)?;
        let duplicate_keys = parse_templates("duplicate_keys", &duplicate_keys).map_err(&bad)?;
        if !duplicate_keys.is_empty() && reversibility == Reversibility::Full {
            return Err(bad(
                "duplicate_keys are for tools of reversibility \"none\" or \"partial\"".to_owned(),
            ));
        }
        Ok(NativeTool {
            spec: Arc::new(ToolSpec {
                id,
                version: version.to_owned(),
                description: description.to_owned(),
                effect,
                idempotent,
                settlement,
                reversibility,
                undo_window,
                schema,
                timeout_ms,
                resources,
                duplicate_keys,
            }),
            execute: Arc::new(execute),
            compensate: compensate.map(Arc::new),
            prepare: prepare.map(Arc::new),
            probe: probe.map(Arc::new),
            running: Arc::default(),
        })
    }

    /// The tool's id.
    #[getter]
    fn id(&self) -> String {
        self.spec.id.clone()
    }
}

/// A running execute's place in [`NativeTool::running`], left (and its end told) when the
/// function returns.
struct Registered {
    running: Arc<Mutex<RunningExecutes>>,
    key: (String, u32),
    done: watch::Sender<bool>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        if let Ok(mut running) = self.running.lock() {
            running.remove(&self.key);
        }
        let _ = self.done.send(true);
    }
}

/// What a phase of a Python tool answered.
enum Answer {
    Ok(Value),
    Failed(String),
    Uncertain(String),
}

impl NativeTool {
    /// Waits until the execute of `ctx`'s step, if it still runs (the dispatcher gave up on
    /// it), has returned, at most the tool's timeout; fails past it, so that nothing is
    /// settled while the effect may still land.
    async fn after_execute(&self, phase: &str, ctx: &ToolContext) -> Result<(), ToolError> {
        let key = (ctx.saga_id.to_string(), ctx.step_seq);
        let running = self
            .running
            .lock()
            .map_or(None, |running| running.get(&key).cloned());
        let Some(mut done) = running else {
            return Ok(());
        };
        let wait_ms = self.spec.timeout_ms.unwrap_or(EXECUTE_DRAIN_DEFAULT_MS);
        match tokio::time::timeout(Duration::from_millis(wait_ms), done.wait_for(|done| *done))
            .await
        {
            Ok(_) => Ok(()),
            Err(_) => Err(ToolError::failed(format!(
                "`{}` ({phase}): its execute of this step still runs {wait_ms} ms after its timeout; settling the step now could be undone by its effect",
                self.spec.id
            ))),
        }
    }

    /// Calls a phase on a blocking thread, holding the GIL there only. An execute is
    /// registered under `execute_of` (its saga and step) until its function returns, even
    /// when the dispatcher stops waiting for it.
    async fn phase(
        &self,
        name: &'static str,
        function: &Arc<Py<PyAny>>,
        inputs: Vec<Value>,
        execute_of: Option<&ToolContext>,
    ) -> Result<Answer, ToolError> {
        let function = Arc::clone(function);
        let id = self.spec.id.clone();
        let texts: Vec<String> = inputs.iter().map(Value::to_string).collect();
        let registration = execute_of.map(|ctx| {
            let key = (ctx.saga_id.to_string(), ctx.step_seq);
            let (done, receiver) = watch::channel(false);
            if let Ok(mut running) = self.running.lock() {
                running.insert(key.clone(), receiver);
            }
            (Arc::clone(&self.running), key, done)
        });
        let joined = tokio::task::spawn_blocking(move || {
            let _running = PhaseRunning::start();
            let _registered =
                registration.map(|(running, key, done)| Registered { running, key, done });
            Python::try_attach(|py| -> Result<String, String> {
                let args =
                    pyo3::types::PyTuple::new(py, texts).map_err(|error| error.to_string())?;
                let result = function
                    .call1(py, args)
                    .map_err(|error| error.to_string())?;
                result
                    .extract::<String>(py)
                    .map_err(|error| error.to_string())
            })
            .unwrap_or_else(|| Err("the Python interpreter is shutting down".to_owned()))
        })
        .await;
        let text = match joined {
            Ok(Ok(text)) => text,
            // The wrapper catches the function's exceptions: one reaching here is the
            // wrapper's own, after the function may have run.
            Ok(Err(error)) => {
                return Err(ToolError::uncertain(format!("`{id}` ({name}): {error}")));
            }
            Err(join) => return Err(ToolError::panicked(format!("`{id}` ({name}): {join}"))),
        };
        let answer: Value = serde_json::from_str(&text).map_err(|error| {
            ToolError::uncertain(format!(
                "`{id}` ({name}) answered something that is not JSON: {error}"
            ))
        })?;
        Ok(match answer {
            Value::Object(mut map) if map.contains_key("ok") => {
                Answer::Ok(map.remove("ok").unwrap_or(Value::Null))
            }
            Value::Object(map) if map.get("failed").is_some_and(Value::is_string) => {
                Answer::Failed(map["failed"].as_str().unwrap_or_default().to_owned())
            }
            Value::Object(map) if map.get("uncertain").is_some_and(Value::is_string) => {
                Answer::Uncertain(map["uncertain"].as_str().unwrap_or_default().to_owned())
            }
            other => Answer::Uncertain(format!(
                "`{id}` ({name}) answered {other}, which is not a phase's answer"
            )),
        })
    }
}

impl Tool for NativeTool {
    fn spec(&self) -> agent_kernel_api::ToolSpec {
        agent_kernel_api::ToolSpec::new(&self.spec.id, self.spec.effect)
            .with_version(&self.spec.version)
            .with_idempotent(self.spec.idempotent)
            .with_settlement(self.spec.settlement)
            .with_schema(self.spec.schema.clone())
            .with_description(&self.spec.description)
            .with_reversibility(self.spec.reversibility)
            .with_undo_window(self.spec.undo_window)
            .with_resources(self.spec.resources.clone())
            .with_duplicate_keys(self.spec.duplicate_keys.clone())
    }

    async fn execute(&self, ctx: &ToolContext, args: &Value) -> Result<ToolOutput, ToolError> {
        match self
            .phase("execute", &self.execute, vec![args.clone()], Some(ctx))
            .await?
        {
            Answer::Ok(data) => Ok(ToolOutput::new(data)),
            Answer::Failed(message) => Err(ToolError::failed(message)),
            Answer::Uncertain(message) => Err(ToolError::uncertain(message)),
        }
    }
}

impl Compensate for NativeTool {
    async fn prepare(&self, _ctx: &ToolContext, args: &Value) -> Result<Undo, ToolError> {
        let Some(prepare) = &self.prepare else {
            return Ok(Undo::none());
        };
        match self
            .phase("prepare", prepare, vec![args.clone()], None)
            .await?
        {
            Answer::Ok(data) => Ok(Undo { data, blob: None }),
            Answer::Failed(message) | Answer::Uncertain(message) => Err(ToolError::failed(message)),
        }
    }

    async fn compensate(
        &self,
        ctx: &ToolContext,
        args: &Value,
        undo: &Undo,
        output: Option<&ToolOutput>,
    ) -> Result<(), ToolError> {
        let Some(compensate) = &self.compensate else {
            return Err(ToolError::failed(format!(
                "`{}` declares no compensation (reversibility none)",
                self.spec.id
            )));
        };
        self.after_execute("compensate", ctx).await?;
        let output = output.map_or(Value::Null, |output| output.data.clone());
        match self
            .phase(
                "compensate",
                compensate,
                vec![args.clone(), output, undo.data.clone()],
                None,
            )
            .await?
        {
            Answer::Ok(_) => Ok(()),
            Answer::Failed(message) | Answer::Uncertain(message) => Err(ToolError::failed(message)),
        }
    }
}

impl Probe for NativeTool {
    async fn probe(
        &self,
        ctx: &ToolContext,
        args: &Value,
        undo: &Undo,
    ) -> Result<ProbeOutcome, ToolError> {
        let Some(probe) = &self.probe else {
            return Ok(ProbeOutcome::Unknown);
        };
        self.after_execute("probe", ctx).await?;
        match self
            .phase("probe", probe, vec![args.clone(), undo.data.clone()], None)
            .await?
        {
            Answer::Ok(Value::Bool(true)) => Ok(ProbeOutcome::Happened(None)),
            Answer::Ok(Value::Bool(false)) => Ok(ProbeOutcome::NotHappened),
            _ => Ok(ProbeOutcome::Unknown),
        }
    }
}

/// The native module.
#[pymodule(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<NativeKernel>()?;
    m.add_class::<NativeSaga>()?;
    m.add_class::<NativeTool>()?;
    m.add("NativeError", m.py().get_type::<NativeError>())?;
    m.add("RUNTIME_WORKERS", RUNTIME_WORKERS)?;
    m.add_function(wrap_pyfunction!(python_phases_running, m)?)?;
    Ok(())
}
