//! The tool contract: `prepare`, `execute`, `compensate`.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{Durability, Files, Reversibility, SagaId, UndoWindow};

/// A boxed, sendable future: what the object-safe traits return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The [`TransactionalTool::version`] of every tool of an upstream MCP server (reference §11),
/// as its steps record it: when a later tools file no longer declares the server, recovery
/// does not wait for it (as it waits for a missing tool of the program's own) but leaves
/// each of those steps a dead letter.
pub const UPSTREAM_TOOL_VERSION: &str = "upstream";

/// What a tool does to the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum EffectClass {
    /// Reads only; running it twice or not at all changes nothing.
    ReadOnly,
    /// Changes the world; needs compensation on rollback.
    Mutating,
}

impl EffectClass {
    /// The name used in the log and in tool listings.
    pub fn as_str(self) -> &'static str {
        match self {
            EffectClass::ReadOnly => "read-only",
            EffectClass::Mutating => "mutating",
        }
    }
}

impl fmt::Display for EffectClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a step whose outcome is unknown (a timeout, a crash, a lost reply between the effect
/// and its log record) is settled. Every tool declares one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Settlement {
    /// Compensation is safe whether or not the effect happened: run it.
    /// (All built-in file tools; read-only tools, whose compensation does nothing.)
    Compensate,
    /// The tool can tell whether the effect happened: ask
    /// [`TransactionalTool::probe`], then compensate if it did.
    Probe,
    /// Neither: the saga stops for an operator (`FailedRollbackPartial`, exit 3); the step is
    /// never assumed done or undone.
    Operator,
}

impl Settlement {
    /// The name used in listings and the log.
    pub fn as_str(self) -> &'static str {
        match self {
            Settlement::Compensate => "compensate",
            Settlement::Probe => "probe",
            Settlement::Operator => "operator",
        }
    }
}

/// What [`TransactionalTool::probe`] found out about a step whose outcome was unknown.
#[derive(Debug, Clone, PartialEq)]
pub enum ProbeOutcome {
    /// The effect happened (with the output, if the tool can reconstruct it).
    Happened(Option<ToolOutput>),
    /// The effect did not happen.
    NotHappened,
    /// The tool cannot tell either.
    Unknown,
}

/// Who is running a step, and how: handed to every tool call.
#[derive(Debug, Clone)]
pub struct ToolContext {
    /// The saga the step belongs to.
    pub saga_id: SagaId,
    /// The step's position in the saga, from 0.
    pub step_seq: u32,
    /// The tool being called.
    pub tool_id: String,
    /// The caller's idempotency key, if the plan gave one.
    pub idempotency_key: Option<String>,
    /// Who runs the saga, as the plan says.
    pub actor: Option<String>,
    /// Whether the tool must sync what it writes.
    pub durability: Durability,
    /// The kernel's file access: its sandbox for the policy in force, and the folder
    /// relative paths resolve against. A tool of the program's own that touches files goes
    /// through it, and is confined exactly as the built-in file tools are.
    pub files: std::sync::Arc<dyn Files>,
}

impl ToolContext {
    /// The folder relative paths in arguments resolve against.
    pub fn folder(&self) -> &std::path::Path {
        self.files.folder()
    }

    /// The content of the file at `path`, or `None` when there is none, through the
    /// kernel's sandbox ([`Files::read`]).
    ///
    /// # Errors
    ///
    /// As [`Files::read`]: denied outside the policy's roots, failed when it cannot be read.
    pub async fn read_file(&self, path: &str) -> Result<Option<Vec<u8>>, ToolError> {
        self.files.read(self, path).await
    }

    /// Replaces the file at `path` with `bytes` through the kernel's sandbox, synced when the
    /// kernel's durability asks for it ([`Files::write`]).
    ///
    /// # Errors
    ///
    /// As [`Files::write`].
    pub async fn write_file(&self, path: &str, bytes: Vec<u8>) -> Result<(), ToolError> {
        self.files.write(self, path, bytes).await
    }

    /// Removes the file at `path` through the kernel's sandbox; whether it existed
    /// ([`Files::remove`]).
    ///
    /// # Errors
    ///
    /// As [`Files::remove`].
    pub async fn remove_file(&self, path: &str) -> Result<bool, ToolError> {
        self.files.remove(self, path).await
    }
}

/// The normalized result of a successful `execute`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolOutput {
    /// Structured result data.
    pub data: Value,
    /// Human-readable descriptions of the side effects ("wrote 5 bytes to a.txt").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub effects: Vec<String>,
    /// A hint for the planner or the state machine ("validate").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_hint: Option<String>,
}

impl ToolOutput {
    /// An output with `data` and no effects or hint.
    pub fn new(data: Value) -> Self {
        Self {
            data,
            effects: Vec::new(),
            next_hint: None,
        }
    }

    /// Adds a description of one side effect.
    #[must_use]
    pub fn with_effect(mut self, effect: impl Into<String>) -> Self {
        self.effects.push(effect.into());
        self
    }
}

/// What compensation needs, captured by `prepare` *before* the effect runs and made durable
/// in the log with the step's BEGIN record.
///
/// `data` holds small structured facts (where the file is, whether it existed, its length);
/// `blob` holds bulk bytes (a file's previous content).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Undo {
    /// Structured facts for compensation; `Value::Null` when there is nothing to undo.
    pub data: Value,
    /// Bulk bytes for compensation, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blob: Option<Vec<u8>>,
}

impl Undo {
    /// Nothing to undo: what read-only tools return.
    pub fn none() -> Self {
        Self::default()
    }

    /// Whether there is anything to undo.
    pub fn is_none(&self) -> bool {
        self.data.is_null() && self.blob.is_none()
    }

    /// Undo data from a typed value (serialized to JSON), with no blob.
    ///
    /// # Errors
    ///
    /// [`ToolError::failed`] when the value cannot be serialized to JSON.
    pub fn from_data<T: Serialize>(data: &T) -> Result<Undo, ToolError> {
        let data = serde_json::to_value(data)
            .map_err(|error| ToolError::failed(format!("cannot record the undo data: {error}")))?;
        Ok(Undo { data, blob: None })
    }

    /// The undo data as the typed value [`from_data`](Self::from_data) recorded.
    ///
    /// # Errors
    ///
    /// [`ToolError::failed`] naming what does not parse: the record was written by another
    /// version of the tool, or damaged.
    pub fn data_as<T: serde::de::DeserializeOwned>(&self) -> Result<T, ToolError> {
        T::deserialize(&self.data)
            .map_err(|error| ToolError::failed(format!("the undo record is malformed: {error}")))
    }
}

/// The kind of a [`ToolError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ToolErrorKind {
    /// The arguments do not satisfy the tool's schema.
    InvalidArgs,
    /// The sandbox policy forbids the call.
    Denied,
    /// The tool tried and failed.
    Failed,
    /// The tool did not finish in time.
    Timeout,
    /// The tool panicked; the kernel contained it.
    Panicked,
    /// A validation check did not hold (the world is not as the plan expects).
    Validation,
    /// A compensation was not run because what its step left has changed since (another
    /// saga, a person or another program changed it): running it would destroy that.
    Changed,
}

impl ToolErrorKind {
    /// A short name for messages and the log.
    pub fn as_str(self) -> &'static str {
        match self {
            ToolErrorKind::InvalidArgs => "invalid arguments",
            ToolErrorKind::Denied => "denied",
            ToolErrorKind::Failed => "failed",
            ToolErrorKind::Timeout => "timed out",
            ToolErrorKind::Panicked => "panicked",
            ToolErrorKind::Validation => "validation failed",
            ToolErrorKind::Changed => "changed since",
        }
    }
}

/// Whether a failed call may have changed the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The effect definitely did not happen.
    NotApplied,
    /// The effect may or may not have happened (a timeout, a lost reply, a failure halfway).
    Uncertain,
}

/// A tool call that did not succeed.
///
/// Beyond its message, an error answers the two questions the saga engine asks:
/// did the effect happen ([`ToolError::is_uncertain`]) and may the call be retried
/// ([`ToolError::is_retriable`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[error("{}: {message}", kind.as_str())]
pub struct ToolError {
    kind: ToolErrorKind,
    message: String,
    outcome: Outcome,
    retry_safe: bool,
}

impl ToolError {
    fn new(kind: ToolErrorKind, message: impl Into<String>, outcome: Outcome) -> Self {
        Self {
            kind,
            message: message.into(),
            outcome,
            retry_safe: false,
        }
    }

    /// Arguments that fail the tool's schema. Nothing happened.
    pub fn invalid_args(message: impl Into<String>) -> Self {
        Self::new(ToolErrorKind::InvalidArgs, message, Outcome::NotApplied)
    }

    /// The sandbox policy forbids the call. Nothing happened.
    pub fn denied(message: impl Into<String>) -> Self {
        Self::new(ToolErrorKind::Denied, message, Outcome::NotApplied)
    }

    /// A definite failure: the effect did not happen.
    pub fn failed(message: impl Into<String>) -> Self {
        Self::new(ToolErrorKind::Failed, message, Outcome::NotApplied)
    }

    /// A validation check that did not hold. Nothing happened (validations only read).
    pub fn validation(message: impl Into<String>) -> Self {
        Self::new(ToolErrorKind::Validation, message, Outcome::NotApplied)
    }

    /// A compensation left unrun because what its step left has changed since; `message`
    /// says how. Nothing happened. Its text starts `changed since: `.
    pub fn changed(message: impl Into<String>) -> Self {
        Self::new(ToolErrorKind::Changed, message, Outcome::NotApplied)
    }

    /// A failure after which the effect may or may not have happened.
    pub fn uncertain(message: impl Into<String>) -> Self {
        Self::new(ToolErrorKind::Failed, message, Outcome::Uncertain)
    }

    /// The call did not finish within `timeout_ms`; its effect is uncertain.
    pub fn timeout(timeout_ms: u64) -> Self {
        Self::new(
            ToolErrorKind::Timeout,
            format!("no result after {timeout_ms} ms"),
            Outcome::Uncertain,
        )
    }

    /// The tool panicked with `message`; its effect is uncertain.
    pub fn panicked(message: impl Into<String>) -> Self {
        Self::new(ToolErrorKind::Panicked, message, Outcome::Uncertain)
    }

    /// Marks the error as safe to retry with the same arguments.
    #[must_use]
    pub fn retriable(mut self) -> Self {
        self.retry_safe = true;
        self
    }

    /// Marks the error as definite: the effect did not happen.
    ///
    /// For failures the caller knows happened before any effect (a failing `prepare`, which
    /// has no side effects by contract, or a panic inside it).
    #[must_use]
    pub fn not_applied(mut self) -> Self {
        self.outcome = Outcome::NotApplied;
        self
    }

    /// The kind of failure.
    pub fn kind(&self) -> ToolErrorKind {
        self.kind
    }

    /// The message, without the kind.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether the effect may have happened.
    pub fn outcome(&self) -> Outcome {
        self.outcome
    }

    /// Whether the effect may have happened despite the error.
    pub fn is_uncertain(&self) -> bool {
        self.outcome == Outcome::Uncertain
    }

    /// Whether the sandbox denied the call.
    pub fn is_denied(&self) -> bool {
        self.kind == ToolErrorKind::Denied
    }

    /// Whether a validation check did not hold.
    pub fn is_validation(&self) -> bool {
        self.kind == ToolErrorKind::Validation
    }

    /// Whether a compensation was left unrun because the world changed since its step.
    pub fn is_changed(&self) -> bool {
        self.kind == ToolErrorKind::Changed
    }

    /// Whether the arguments were invalid.
    pub fn is_invalid_args(&self) -> bool {
        self.kind == ToolErrorKind::InvalidArgs
    }

    /// Whether the tool says a retry with the same arguments is safe.
    pub fn is_retriable(&self) -> bool {
        self.retry_safe
    }
}

/// The contract every tool implements, with native `async fn`s.
///
/// A call goes through three phases, and the saga engine logs between them:
///
/// 1. [`prepare`](Self::prepare) captures what compensation will need (a file's previous
///    bytes, say) without changing anything. The engine writes it to the log with the step's
///    BEGIN record, durably, *before* the effect.
/// 2. [`execute`](Self::execute) performs the effect.
/// 3. [`compensate`](Self::compensate), on rollback, undoes it from the logged [`Undo`] alone.
///
/// # Contract
///
/// - `check` and `prepare` have no side effects.
/// - `compensate` must be safe when the effect happened, when it did not, and when it is
///   unknown whether it did: a crash can land between the effect and its log record, and
///   then `output` is `None`. It must be idempotent (recovery may run it twice) and must not
///   panic.
/// - `execute` and `compensate` must not block the async runtime: blocking I/O belongs on a
///   blocking thread.
pub trait TransactionalTool: Send + Sync + 'static {
    /// The stable tool id used in plans, e.g. `fs.write`.
    fn id(&self) -> &str;

    /// The tool's version, recorded with every step so a log can be replayed against the same
    /// behaviour. The default is `"1"`: change it when the tool's effect or undo data
    /// change meaning.
    fn version(&self) -> &str {
        "1"
    }

    /// Whether the tool changes the world.
    fn effect(&self) -> EffectClass;

    /// Whether running the tool twice with the same arguments has the effect of running it
    /// once. Only idempotent tools are ever retried.
    fn idempotent(&self) -> bool;

    /// How a step of this tool whose outcome is unknown is settled.
    fn settlement(&self) -> Settlement;

    /// The JSON Schema of the tool's arguments.
    fn args_schema(&self) -> Value;

    /// What the tool does, in a sentence, shown by `tools` and to agents over MCP. The
    /// default is empty (listings then describe it by its id).
    fn description(&self) -> &str {
        ""
    }

    /// How completely [`compensate`](Self::compensate) restores what the effect changed.
    /// The default is [`Reversibility::Full`]; a tool whose effect cannot be taken back
    /// must say [`Reversibility::None`], and then each of its steps waits for an operator.
    fn reversibility(&self) -> Reversibility {
        Reversibility::Full
    }

    /// How long after its saga ended a step may still be undone. The default, `None`, is the
    /// kernel's `[limits] undo_window`.
    fn undo_window(&self) -> Option<UndoWindow> {
        None
    }

    /// Checks arguments and policy without side effects.
    ///
    /// # Errors
    ///
    /// [`ToolError::invalid_args`] when the arguments are malformed, [`ToolError::denied`]
    /// when the sandbox policy forbids the call.
    ///
    /// The dispatcher has already checked the arguments against
    /// [`args_schema`](Self::args_schema); the default accepts whatever the schema accepts.
    /// Override it for what a schema cannot say (a policy's ruling on a path, say).
    fn check(&self, _args: &Value) -> Result<(), ToolError> {
        Ok(())
    }

    /// Captures what compensation needs, without changing anything. The default captures
    /// nothing ([`Undo::none`]): compensation then works from the arguments and, once the
    /// step committed, its output.
    ///
    /// # Errors
    ///
    /// Any [`ToolError`]; the step then fails before its effect.
    fn prepare(
        &self,
        _ctx: &ToolContext,
        _args: &Value,
    ) -> impl Future<Output = Result<Undo, ToolError>> + Send {
        std::future::ready(Ok(Undo::none()))
    }

    /// Performs the effect.
    ///
    /// # Errors
    ///
    /// A [`ToolError`] that says whether the effect may have happened.
    fn execute(
        &self,
        ctx: &ToolContext,
        args: &Value,
    ) -> impl Future<Output = Result<ToolOutput, ToolError>> + Send;

    /// What `execute` would plausibly return, computed without touching anything: used by
    /// dry runs. The default describes the call; tools override it with a likelier output.
    ///
    /// # Errors
    ///
    /// A [`ToolError`] when the call could not succeed even in simulation.
    fn simulate(
        &self,
        ctx: &ToolContext,
        _args: &Value,
    ) -> impl Future<Output = Result<ToolOutput, ToolError>> + Send {
        let output = ToolOutput::new(serde_json::json!({ "dry_run": true }))
            .with_effect(format!("would run {}", ctx.tool_id));
        std::future::ready(Ok(output))
    }

    /// Tells whether the effect of a step whose outcome is unknown happened, without
    /// changing anything. Called only for tools whose [`settlement`](Self::settlement) is
    /// [`Settlement::Probe`]; the default answers [`ProbeOutcome::Unknown`].
    ///
    /// # Errors
    ///
    /// A [`ToolError`] when the probe itself failed; the outcome then stays unknown.
    fn probe(
        &self,
        _ctx: &ToolContext,
        _args: &Value,
        _undo: &Undo,
    ) -> impl Future<Output = Result<ProbeOutcome, ToolError>> + Send {
        std::future::ready(Ok(ProbeOutcome::Unknown))
    }

    /// Whether what a step left has changed since (another saga, a person or another program
    /// touched it), so that compensating it now would destroy someone else's work:
    /// `Ok(Some(what))` names the change; `Ok(None)` says nothing changed, or that the tool
    /// cannot tell (the default).
    ///
    /// The kernel asks before every compensation (a failing saga's own rollback, a live
    /// abort, `rollback`, `recover`, a dead letter's retry, `undo`); a changed step is not
    /// compensated but left as a dead letter whose error starts `changed since:`, until an
    /// operator forces it (`dlq retry --force`, `undo --force`).
    ///
    /// `undo` and `output` are the step's record. The step's outcome may be unknown (the
    /// process died between its BEGIN and its outcome), and its compensation may already have
    /// run once without its outcome being recorded (a rollback killed between the two): so the
    /// answer is `None` both when what the step left is there and when what its compensation
    /// restores is (compensating again changes nothing then). It must not change anything.
    ///
    /// # Errors
    ///
    /// A [`ToolError`] when the check could not be made: the compensation is then not run
    /// either (a dead letter), and `undo` refuses the step.
    fn changed_since(
        &self,
        _ctx: &ToolContext,
        _args: &Value,
        _undo: &Undo,
        _output: Option<&ToolOutput>,
    ) -> impl Future<Output = Result<Option<String>, ToolError>> + Send {
        std::future::ready(Ok(None))
    }

    /// Undoes the effect of `execute` using what `prepare` captured.
    ///
    /// `output` is `None` when the step's outcome was never recorded (the process died between
    /// BEGIN and COMMIT, or `execute` failed with an uncertain outcome).
    ///
    /// The default suits read-only tools, which have nothing to undo (the engine does not
    /// even call it for their steps); for a mutating tool it fails, saying the tool
    /// implements no compensation, so a mutating tool must override it.
    ///
    /// # Errors
    ///
    /// A [`ToolError`] when the world could not be restored; the saga then ends in
    /// `FailedRollbackPartial`.
    fn compensate(
        &self,
        ctx: &ToolContext,
        _args: &Value,
        _undo: &Undo,
        _output: Option<&ToolOutput>,
    ) -> impl Future<Output = Result<(), ToolError>> + Send {
        let result = match self.effect() {
            EffectClass::ReadOnly => Ok(()),
            _ => Err(ToolError::failed(format!(
                "`{}` is mutating but implements no compensation",
                ctx.tool_id
            ))),
        };
        std::future::ready(result)
    }
}

/// The object-safe form of [`TransactionalTool`], for registries of `Arc<dyn DynTool>`.
///
/// Implemented for every [`TransactionalTool`]; implement that trait, not this one.
pub trait DynTool: Send + Sync + 'static {
    /// See [`TransactionalTool::id`].
    fn id(&self) -> &str;
    /// See [`TransactionalTool::version`].
    fn version(&self) -> &str;
    /// See [`TransactionalTool::effect`].
    fn effect(&self) -> EffectClass;
    /// See [`TransactionalTool::idempotent`].
    fn idempotent(&self) -> bool;
    /// See [`TransactionalTool::settlement`].
    fn settlement(&self) -> Settlement;
    /// See [`TransactionalTool::args_schema`].
    fn args_schema(&self) -> Value;
    /// See [`TransactionalTool::description`].
    fn description(&self) -> &str;
    /// See [`TransactionalTool::reversibility`].
    fn reversibility(&self) -> Reversibility;
    /// See [`TransactionalTool::undo_window`].
    fn undo_window(&self) -> Option<UndoWindow>;
    /// See [`TransactionalTool::check`].
    ///
    /// # Errors
    ///
    /// As [`TransactionalTool::check`].
    fn check(&self, args: &Value) -> Result<(), ToolError>;
    /// See [`TransactionalTool::prepare`].
    fn prepare<'a>(
        &'a self,
        ctx: &'a ToolContext,
        args: &'a Value,
    ) -> BoxFuture<'a, Result<Undo, ToolError>>;
    /// See [`TransactionalTool::execute`].
    fn execute<'a>(
        &'a self,
        ctx: &'a ToolContext,
        args: &'a Value,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>>;
    /// See [`TransactionalTool::simulate`].
    fn simulate<'a>(
        &'a self,
        ctx: &'a ToolContext,
        args: &'a Value,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>>;
    /// See [`TransactionalTool::probe`].
    fn probe<'a>(
        &'a self,
        ctx: &'a ToolContext,
        args: &'a Value,
        undo: &'a Undo,
    ) -> BoxFuture<'a, Result<ProbeOutcome, ToolError>>;
    /// See [`TransactionalTool::changed_since`].
    fn changed_since<'a>(
        &'a self,
        ctx: &'a ToolContext,
        args: &'a Value,
        undo: &'a Undo,
        output: Option<&'a ToolOutput>,
    ) -> BoxFuture<'a, Result<Option<String>, ToolError>>;
    /// See [`TransactionalTool::compensate`].
    fn compensate<'a>(
        &'a self,
        ctx: &'a ToolContext,
        args: &'a Value,
        undo: &'a Undo,
        output: Option<&'a ToolOutput>,
    ) -> BoxFuture<'a, Result<(), ToolError>>;
}

impl<T: TransactionalTool> DynTool for T {
    fn id(&self) -> &str {
        TransactionalTool::id(self)
    }

    fn version(&self) -> &str {
        TransactionalTool::version(self)
    }

    fn effect(&self) -> EffectClass {
        TransactionalTool::effect(self)
    }

    fn idempotent(&self) -> bool {
        TransactionalTool::idempotent(self)
    }

    fn settlement(&self) -> Settlement {
        TransactionalTool::settlement(self)
    }

    fn args_schema(&self) -> Value {
        TransactionalTool::args_schema(self)
    }

    fn description(&self) -> &str {
        TransactionalTool::description(self)
    }

    fn reversibility(&self) -> Reversibility {
        TransactionalTool::reversibility(self)
    }

    fn undo_window(&self) -> Option<UndoWindow> {
        TransactionalTool::undo_window(self)
    }

    fn check(&self, args: &Value) -> Result<(), ToolError> {
        TransactionalTool::check(self, args)
    }

    fn prepare<'a>(
        &'a self,
        ctx: &'a ToolContext,
        args: &'a Value,
    ) -> BoxFuture<'a, Result<Undo, ToolError>> {
        Box::pin(TransactionalTool::prepare(self, ctx, args))
    }

    fn execute<'a>(
        &'a self,
        ctx: &'a ToolContext,
        args: &'a Value,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(TransactionalTool::execute(self, ctx, args))
    }

    fn simulate<'a>(
        &'a self,
        ctx: &'a ToolContext,
        args: &'a Value,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(TransactionalTool::simulate(self, ctx, args))
    }

    fn probe<'a>(
        &'a self,
        ctx: &'a ToolContext,
        args: &'a Value,
        undo: &'a Undo,
    ) -> BoxFuture<'a, Result<ProbeOutcome, ToolError>> {
        Box::pin(TransactionalTool::probe(self, ctx, args, undo))
    }

    fn changed_since<'a>(
        &'a self,
        ctx: &'a ToolContext,
        args: &'a Value,
        undo: &'a Undo,
        output: Option<&'a ToolOutput>,
    ) -> BoxFuture<'a, Result<Option<String>, ToolError>> {
        Box::pin(TransactionalTool::changed_since(
            self, ctx, args, undo, output,
        ))
    }

    fn compensate<'a>(
        &'a self,
        ctx: &'a ToolContext,
        args: &'a Value,
        undo: &'a Undo,
        output: Option<&'a ToolOutput>,
    ) -> BoxFuture<'a, Result<(), ToolError>> {
        Box::pin(TransactionalTool::compensate(self, ctx, args, undo, output))
    }
}

/// A tool of a [`ToolSource`], with the timeout it declares (`None`: the kernel's).
pub type SourcedTool = (std::sync::Arc<dyn DynTool>, Option<u64>);

/// A family of tools that exist only once their source has been asked for them: the tools
/// of an upstream MCP server, whose ids are `NAME.TOOL`. A dispatcher asks the source the
/// first time a step, a compensation or a listing needs one of its tools, and never again:
/// a source that cannot be used makes only its own tools unavailable.
pub trait ToolSource: Send + Sync + 'static {
    /// The family's name: its tools' ids are this name, a dot, and the tool's own name.
    fn name(&self) -> &str;
    /// Starts the source and answers its tools, or why none of them can be used.
    fn load(&self) -> BoxFuture<'_, Result<Vec<SourcedTool>, String>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_questions_follow_constructors() {
        assert!(ToolError::denied("x").is_denied());
        assert!(!ToolError::denied("x").is_uncertain());
        assert!(ToolError::timeout(5).is_uncertain());
        assert!(ToolError::panicked("boom").is_uncertain());
        assert!(!ToolError::failed("x").is_retriable());
        assert!(ToolError::failed("x").retriable().is_retriable());
        assert_eq!(
            ToolError::invalid_args("missing field `path`").to_string(),
            "invalid arguments: missing field `path`"
        );
    }

    #[test]
    fn error_round_trips_through_json() {
        let error = ToolError::uncertain("disk vanished").retriable();
        let json = serde_json::to_string(&error).expect("serializes");
        let back: ToolError = serde_json::from_str(&json).expect("parses");
        assert_eq!(back, error);
    }
}
