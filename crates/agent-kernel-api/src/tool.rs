//! What tools are handed and answer: contexts, outputs, undo data, errors, settlements.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{Durability, Files, SagaId};

/// A boxed, sendable future: what the object-safe traits return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The [`ToolSpec::version`](crate::ToolSpec::version) of every tool of an upstream MCP server (reference §11),
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
    /// [`Probe::probe`](crate::Probe::probe), then compensate if it did.
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

/// What [`Probe::probe`](crate::Probe::probe) found out about a step whose outcome was unknown.
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
    /// kernel's durability asks for it ([`Files::write`]). The bytes go to a temporary file
    /// beside it first, renamed over it; a write cut short by a crash leaves that temporary
    /// file, which the step's next write or removal of the same file (a retry, or its
    /// compensation) removes first.
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
    /// A resource the call would claim is held by another saga that is not settled; nothing
    /// of the call ran.
    Conflict,
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
            ToolErrorKind::Conflict => "conflict",
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

    /// A resource the call would claim is held by another unsettled saga; `message` names
    /// it and its holder. Nothing happened.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(ToolErrorKind::Conflict, message, Outcome::NotApplied)
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

    /// This error, after an earlier attempt of the same call whose outcome was unknown
    /// (`earlier`, its error's text): its kind kept, its outcome unknown (that attempt may
    /// have acted), not retriable, and both named in its message.
    #[must_use]
    pub fn after_attempt_in_doubt(mut self, earlier: &str) -> Self {
        self.message = format!(
            "{}; an earlier attempt's outcome is unknown ({earlier})",
            self.message
        );
        self.outcome = Outcome::Uncertain;
        self.retry_safe = false;
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

    /// Whether another saga's lock refused the call.
    pub fn is_conflict(&self) -> bool {
        self.kind == ToolErrorKind::Conflict
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

/// A tool of a [`ToolSource`], with the timeout it declares (`None`: the kernel's).
pub type SourcedTool = (crate::ToolEntry, Option<u64>);

/// A family of tools that exist only once their source has been asked for them: the tools
/// of an upstream MCP server, whose ids are `NAME.TOOL`. A dispatcher asks the source the
/// first time a step, a compensation or a listing needs one of its tools, and never again:
/// a source that cannot be used makes only its own tools unavailable.
pub trait ToolSource: Send + Sync + 'static {
    /// The family's name: its tools' ids are this name, a dot, and the tool's own name.
    fn name(&self) -> &str;
    /// Starts the source and answers its tools.
    ///
    /// # Errors
    ///
    /// Why none of them can be used ([`ToolError::failed`], the message naming the source).
    fn load(&self) -> BoxFuture<'_, Result<Vec<SourcedTool>, ToolError>>;
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
