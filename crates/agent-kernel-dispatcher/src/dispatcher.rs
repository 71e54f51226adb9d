//! The registry and the guarded call path.

use std::collections::BTreeMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use agent_kernel_api::{DynTool, ProbeOutcome, ToolContext, ToolError, ToolOutput, Undo};
use serde_json::Value;
use tokio::sync::{Semaphore, SemaphorePermit};
use tracing::{debug, warn};

use crate::{DispatchError, Limits};

/// Most tools one dispatcher holds.
pub const MAX_TOOLS: usize = 1024;

/// Most schema errors reported for one call's arguments.
pub const MAX_ARG_PROBLEMS: usize = 32;

/// Where retry jitter comes from; injected so tests are deterministic.
pub trait Jitter: Send + Sync + 'static {
    /// A value in `0..=max_ms`.
    fn jitter_ms(&self, max_ms: u64) -> u64;
}

/// No jitter at all.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoJitter;

impl Jitter for NoJitter {
    fn jitter_ms(&self, _max_ms: u64) -> u64 {
        0
    }
}

/// Jitter from a seeded xorshift generator: spreads retries of concurrent calls apart.
#[derive(Debug)]
pub struct SeededJitter {
    state: AtomicU64,
}

impl SeededJitter {
    /// A generator from `seed` (any value; zero is replaced).
    pub fn new(seed: u64) -> Self {
        Self {
            state: AtomicU64::new(seed.max(1)),
        }
    }
}

impl Jitter for SeededJitter {
    fn jitter_ms(&self, max_ms: u64) -> u64 {
        let mut next = 0;
        // A lost race between two callers only repeats a value; it never blocks.
        let _ = self
            .state
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |mut x| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                next = x;
                Some(x)
            });
        if max_ms == 0 { 0 } else { next % (max_ms + 1) }
    }
}

/// Polls a tool's future inside `catch_unwind`, so that a panic inside the tool becomes an
/// error instead of unwinding through the caller. Costs nothing on the happy path.
struct Contained<F>(Pin<Box<F>>);

impl<T, F: Future<Output = Result<T, ToolError>>> Future for Contained<F> {
    type Output = Result<T, ToolError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // After a panic the future is never polled again: `Ready` is returned at once.
        let future = self.0.as_mut();
        match std::panic::catch_unwind(AssertUnwindSafe(|| future.poll(cx))) {
            Ok(poll) => poll,
            Err(payload) => {
                let message = payload
                    .downcast_ref::<&str>()
                    .map(|text| (*text).to_owned())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "panic with a non-text payload".to_owned());
                Poll::Ready(Err(ToolError::panicked(message)))
            }
        }
    }
}

/// Runs `future` contained and bounded by `timeout_ms`.
async fn guarded<T>(
    timeout_ms: u64,
    future: impl Future<Output = Result<T, ToolError>>,
) -> Result<T, ToolError> {
    match tokio::time::timeout(
        Duration::from_millis(timeout_ms),
        Contained(Box::pin(future)),
    )
    .await
    {
        Ok(result) => result,
        Err(_) => Err(ToolError::timeout(timeout_ms)),
    }
}

struct Entry {
    tool: Arc<dyn DynTool>,
    schema: jsonschema::Validator,
    permits: Option<Semaphore>,
}

/// The tool registry and the one path every call takes: arguments checked against the
/// tool's JSON Schema, concurrency bounded, calls bounded in time, panics contained,
/// retriable failures of idempotent tools retried with backoff.
pub struct Dispatcher {
    tools: BTreeMap<String, Entry>,
    permits: Semaphore,
    limits: Limits,
    jitter: Arc<dyn Jitter>,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("tools", &self.tools.keys().collect::<Vec<_>>())
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl Dispatcher {
    /// An empty dispatcher with these limits.
    ///
    /// # Errors
    ///
    /// [`DispatchError::Limits`] when a limit is out of range.
    pub fn new(limits: Limits, jitter: Arc<dyn Jitter>) -> Result<Self, DispatchError> {
        limits.validate().map_err(DispatchError::Limits)?;
        Ok(Self {
            tools: BTreeMap::new(),
            permits: Semaphore::new(limits.concurrency_max),
            limits,
            jitter,
        })
    }

    /// Adds a tool.
    ///
    /// # Errors
    ///
    /// [`DispatchError::DuplicateTool`] when the id is taken, [`DispatchError::TooManyTools`]
    /// past [`MAX_TOOLS`], [`DispatchError::Schema`] when the tool's schema is not a valid
    /// JSON Schema.
    pub fn register(&mut self, tool: Arc<dyn DynTool>) -> Result<(), DispatchError> {
        let id = tool.id().to_owned();
        if self.tools.contains_key(&id) {
            return Err(DispatchError::DuplicateTool(id));
        }
        if self.tools.len() >= MAX_TOOLS {
            return Err(DispatchError::TooManyTools(MAX_TOOLS));
        }
        let schema = jsonschema::validator_for(&tool.args_schema()).map_err(|err| {
            DispatchError::Schema {
                tool: id.clone(),
                reason: err.to_string(),
            }
        })?;
        let permits = self
            .limits
            .tools
            .get(&id)
            .and_then(|limits| limits.concurrency_max)
            .map(Semaphore::new);
        self.tools.insert(
            id,
            Entry {
                tool,
                schema,
                permits,
            },
        );
        Ok(())
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The tool registered under `id`.
    pub fn get(&self, id: &str) -> Option<&Arc<dyn DynTool>> {
        self.tools.get(id).map(|entry| &entry.tool)
    }

    /// Every registered id, sorted.
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.tools.keys().map(String::as_str)
    }

    fn entry(&self, id: &str) -> Result<&Entry, ToolError> {
        self.tools
            .get(id)
            .ok_or_else(|| ToolError::invalid_args(format!("unknown tool `{id}`")))
    }

    /// Checks `args` against the tool's JSON Schema (every violation, with its path and
    /// rule), then the tool's own check (sandbox policy). Nothing runs.
    ///
    /// # Errors
    ///
    /// [`ToolError::invalid_args`] listing every schema violation as `` `/path`: rule: message ``,
    /// or the tool's own error (a denial, say).
    pub fn check(&self, tool_id: &str, args: &Value) -> Result<(), ToolError> {
        let entry = self.entry(tool_id)?;
        let problems: Vec<String> = entry
            .schema
            .iter_errors(args)
            .take(MAX_ARG_PROBLEMS)
            .map(|error| {
                let path = error.instance_path().to_string();
                let path = if path.is_empty() {
                    "/".to_owned()
                } else {
                    path
                };
                format!("`{path}`: {}: {error}", error.kind().keyword())
            })
            .collect();
        if !problems.is_empty() {
            return Err(ToolError::invalid_args(problems.join("; ")));
        }
        entry.tool.check(args)
    }

    async fn permits<'a>(
        &'a self,
        entry: &'a Entry,
    ) -> (Option<SemaphorePermit<'a>>, SemaphorePermit<'a>) {
        // The tool's own limit first, so a saturated tool never holds a global permit idle.
        let tool_permit = match &entry.permits {
            Some(semaphore) => Some(
                semaphore
                    .acquire()
                    .await
                    .expect("the dispatcher never closes its semaphores"),
            ),
            None => None,
        };
        let global = self
            .permits
            .acquire()
            .await
            .expect("the dispatcher never closes its semaphores");
        (tool_permit, global)
    }

    /// Captures what compensation needs (contained, bounded in time).
    ///
    /// # Errors
    ///
    /// The tool's error, a timeout, or a contained panic.
    pub async fn prepare(&self, ctx: &ToolContext, args: &Value) -> Result<Undo, ToolError> {
        let entry = self.entry(&ctx.tool_id)?;
        let _permits = self.permits(entry).await;
        guarded(
            self.limits.timeout_ms_for(&ctx.tool_id),
            entry.tool.prepare(ctx, args),
        )
        .await
    }

    /// Performs the effect: bounded in concurrency and time, contained, and retried with
    /// exponential backoff and jitter when the tool is idempotent and the error says a retry
    /// is safe, at most `retries_max` times.
    ///
    /// # Errors
    ///
    /// The last attempt's error; a timeout or a panic has an uncertain outcome.
    pub async fn execute(&self, ctx: &ToolContext, args: &Value) -> Result<ToolOutput, ToolError> {
        let entry = self.entry(&ctx.tool_id)?;
        let timeout_ms = self.limits.timeout_ms_for(&ctx.tool_id);
        let retries_max = if entry.tool.idempotent() {
            self.limits.retries_max_for(&ctx.tool_id)
        } else {
            0
        };
        let (result, attempts) = self
            .retrying(entry, ctx, timeout_ms, retries_max, || {
                entry.tool.execute(ctx, args)
            })
            .await;
        debug!(tool = %ctx.tool_id, step_seq = ctx.step_seq, attempts, ok = result.is_ok(), "executed");
        result
    }

    /// Calls `call` under the tool's permits and `timeout_ms`, again after a backoff with
    /// jitter while it fails with a retriable error, at most `retries_max` more times.
    /// Returns the last result and the number of attempts.
    async fn retrying<T, Fut>(
        &self,
        entry: &Entry,
        ctx: &ToolContext,
        timeout_ms: u64,
        retries_max: u32,
        call: impl Fn() -> Fut,
    ) -> (Result<T, ToolError>, u32)
    where
        Fut: Future<Output = Result<T, ToolError>>,
    {
        let mut retry_idx = 0;
        loop {
            let result = {
                let _permits = self.permits(entry).await;
                guarded(timeout_ms, call()).await
            };
            match result {
                Err(error) if error.is_retriable() && retry_idx < retries_max => {
                    let backoff_ms = self.limits.backoff_ms(retry_idx);
                    let backoff_ms = backoff_ms + self.jitter.jitter_ms(backoff_ms / 2);
                    warn!(tool = %ctx.tool_id, step_seq = ctx.step_seq, retry = retry_idx + 1, backoff_ms, %error, "retrying");
                    tokio::time::sleep(Duration::from_millis(backoff_ms)).await;
                    retry_idx += 1;
                }
                other => return (other, retry_idx + 1),
            }
        }
    }

    /// Asks whether the effect of an in-doubt step happened (contained, bounded in time).
    ///
    /// # Errors
    ///
    /// The tool's error, a timeout, or a contained panic.
    pub async fn probe(
        &self,
        ctx: &ToolContext,
        args: &Value,
        undo: &Undo,
    ) -> Result<ProbeOutcome, ToolError> {
        let entry = self.entry(&ctx.tool_id)?;
        let _permits = self.permits(entry).await;
        guarded(
            self.limits.timeout_ms_for(&ctx.tool_id),
            entry.tool.probe(ctx, args, undo),
        )
        .await
    }

    /// Asks whether what a committed step left has changed since (contained, bounded by the
    /// tool's timeout, never retried): before `undo` compensates a finished saga.
    ///
    /// # Errors
    ///
    /// The tool's error, or a timeout or contained panic.
    pub async fn changed_since(
        &self,
        ctx: &ToolContext,
        args: &Value,
        undo: &Undo,
        output: Option<&ToolOutput>,
    ) -> Result<Option<String>, ToolError> {
        let entry = self.entry(&ctx.tool_id)?;
        let _permits = self.permits(entry).await;
        guarded(
            self.limits.timeout_ms_for(&ctx.tool_id),
            entry.tool.changed_since(ctx, args, undo, output),
        )
        .await
    }

    /// Undoes a step (contained, bounded by the compensation timeout, retried like
    /// `execute` when the error says a retry is safe: compensations are idempotent by
    /// contract).
    ///
    /// # Errors
    ///
    /// The last attempt's error.
    pub async fn compensate(
        &self,
        ctx: &ToolContext,
        args: &Value,
        undo: &Undo,
        output: Option<&ToolOutput>,
    ) -> Result<(), ToolError> {
        let entry = self.entry(&ctx.tool_id)?;
        let retries_max = self.limits.retries_max_for(&ctx.tool_id);
        let (result, _) = self
            .retrying(
                entry,
                ctx,
                self.limits.compensation_timeout_ms,
                retries_max,
                || entry.tool.compensate(ctx, args, undo, output),
            )
            .await;
        result
    }
}
