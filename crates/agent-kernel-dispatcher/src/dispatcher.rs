//! The registry and the guarded call path.

use std::collections::BTreeMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use agent_kernel_api::{
    BoxFuture, DynTool, ProbeOutcome, ToolContext, ToolEntry, ToolError, ToolOutput, ToolSource,
    Undo,
};
use serde_json::Value;
use tokio::sync::{OnceCell, Semaphore, SemaphorePermit};
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
    timeout_ms: u64,
}

/// A [`ToolSource`] and what asking it gave: nothing yet, or `Ok` once its tools are
/// registered, or why none of them can be used.
struct Source {
    source: Arc<dyn ToolSource>,
    loaded: OnceCell<Result<(), String>>,
}

/// The tool registry and the one path every call takes: arguments checked against the
/// tool's JSON Schema, concurrency bounded, calls bounded in time, panics contained,
/// retriable failures of idempotent tools retried with backoff.
///
/// Tools are registered up front, or come from a [`ToolSource`] (an upstream MCP server)
/// the first time one of its tools is needed: every async call path asks for it first, and
/// [`Dispatcher::load`] or [`Dispatcher::load_all`] do it for the synchronous ones.
pub struct Dispatcher {
    tools: RwLock<BTreeMap<String, Arc<Entry>>>,
    sources: BTreeMap<String, Source>,
    permits: Semaphore,
    limits: Limits,
    jitter: Arc<dyn Jitter>,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("tools", &self.ids())
            .field("sources", &self.sources.keys().collect::<Vec<_>>())
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// Whether `id` is a tool of the family `name` (`NAME.TOOL`).
fn of_family(id: &str, name: &str) -> bool {
    id.strip_prefix(name)
        .is_some_and(|rest| rest.starts_with('.'))
}

impl Dispatcher {
    /// An empty dispatcher with these limits.
    ///
    /// # Errors
    ///
    /// [`DispatchError::Limits`] when a limit is out of range.
    pub fn new(limits: Limits, jitter: Arc<dyn Jitter>) -> Result<Self, DispatchError> {
        limits.validate()?;
        Ok(Self {
            tools: RwLock::new(BTreeMap::new()),
            sources: BTreeMap::new(),
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
    /// JSON Schema, [`DispatchError::Misdeclared`] when its spec claims what the tool cannot
    /// do ([`ToolEntry::misdeclaration`]).
    pub fn register(&mut self, tool: ToolEntry) -> Result<(), DispatchError> {
        let tools = self.tools.get_mut().unwrap_or_else(PoisonError::into_inner);
        Self::insert(&self.limits, tools, tool, None)
    }

    /// Adds a source whose tools are registered the first time one of them is needed.
    ///
    /// # Errors
    ///
    /// [`DispatchError::DuplicateTool`] when a source of that name is already added.
    pub fn add_source(&mut self, source: Arc<dyn ToolSource>) -> Result<(), DispatchError> {
        let name = source.name().to_owned();
        if self.sources.contains_key(&name) {
            return Err(DispatchError::DuplicateTool(format!("{name}.*")));
        }
        self.sources.insert(
            name,
            Source {
                source,
                loaded: OnceCell::new(),
            },
        );
        Ok(())
    }

    /// Registers `tool` in `tools`, its timeout `declared_ms` unless `limits` sets one.
    fn insert(
        limits: &Limits,
        tools: &mut BTreeMap<String, Arc<Entry>>,
        tool: ToolEntry,
        declared_ms: Option<u64>,
    ) -> Result<(), DispatchError> {
        let id = tool.id().to_owned();
        if let Some(misdeclaration) = tool.misdeclaration() {
            return Err(DispatchError::Misdeclared {
                tool: id,
                misdeclaration,
            });
        }
        let tool = tool.into_dyn();
        if tools.contains_key(&id) {
            return Err(DispatchError::DuplicateTool(id));
        }
        if tools.len() >= MAX_TOOLS {
            return Err(DispatchError::TooManyTools(MAX_TOOLS));
        }
        let schema =
            jsonschema::validator_for(tool.args_schema()).map_err(|err| DispatchError::Schema {
                tool: id.clone(),
                reason: err.to_string(),
            })?;
        let own = limits.tools.get(&id);
        let permits = own
            .and_then(|limits| limits.concurrency_max)
            .map(Semaphore::new);
        let timeout_ms = own
            .and_then(|limits| limits.timeout_ms)
            .or(declared_ms)
            .unwrap_or(limits.timeout_ms);
        tools.insert(
            id,
            Arc::new(Entry {
                tool,
                schema,
                permits,
                timeout_ms,
            }),
        );
        Ok(())
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The tool registered under `id`: `None` for a tool of a source not yet asked (see
    /// [`Dispatcher::load`]).
    pub fn get(&self, id: &str) -> Option<Arc<dyn DynTool>> {
        self.read().get(id).map(|entry| Arc::clone(&entry.tool))
    }

    /// Every registered id, sorted.
    pub fn ids(&self) -> Vec<String> {
        self.read().keys().cloned().collect()
    }

    /// The timeout of a call of `id`, in milliseconds: its own limit, else what it
    /// declares, else the default.
    pub fn timeout_ms_of(&self, id: &str) -> u64 {
        self.read()
            .get(id)
            .map_or_else(|| self.limits.timeout_ms_for(id), |entry| entry.timeout_ms)
    }

    /// The name of the source whose tool `id` would be, if any.
    pub fn source_of(&self, id: &str) -> Option<&str> {
        self.sources
            .keys()
            .find(|name| of_family(id, name))
            .map(String::as_str)
    }

    /// Whether `id` is registered or belongs to a source (asked or not).
    pub fn knows(&self, id: &str) -> bool {
        self.read().contains_key(id) || self.source_of(id).is_some()
    }

    /// Makes sure the source `id` belongs to, if any, has been asked for its tools (once,
    /// whoever asks first; others wait for its answer).
    ///
    /// # Errors
    ///
    /// [`DispatchError::Unavailable`]: why the source's tools cannot be used, naming it. A
    /// tool of no source is no error: it is registered or unknown.
    pub async fn load(&self, id: &str) -> Result<(), DispatchError> {
        if self.read().contains_key(id) {
            return Ok(());
        }
        let Some(name) = self.source_of(id) else {
            return Ok(());
        };
        self.load_source(name)
            .await
            .map_err(|reason| DispatchError::Unavailable {
                server: name.to_owned(),
                reason,
            })
    }

    /// Asks every source not yet asked for its tools, all at once.
    pub async fn load_all(&self) {
        let mut pending: Vec<BoxFuture<'_, Result<(), String>>> = self
            .sources
            .keys()
            .map(|name| Box::pin(self.load_source(name)) as BoxFuture<'_, _>)
            .collect();
        std::future::poll_fn(|cx| {
            pending.retain_mut(|future| future.as_mut().poll(cx).is_pending());
            if pending.is_empty() {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
    }

    /// The sources not asked for their tools yet (an upstream server not started), by name.
    pub fn not_asked(&self) -> Vec<String> {
        self.sources
            .iter()
            .filter(|(_, source)| source.loaded.get().is_none())
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// The sources asked whose tools cannot be used, each with why.
    pub fn unavailable(&self) -> Vec<(String, String)> {
        self.sources
            .iter()
            .filter_map(|(name, source)| match source.loaded.get() {
                Some(Err(reason)) => Some((name.clone(), reason.clone())),
                _ => None,
            })
            .collect()
    }

    async fn load_source(&self, name: &str) -> Result<(), String> {
        let source = &self.sources[name];
        source
            .loaded
            .get_or_init(|| async {
                let tools = source.source.load().await.map_err(|error| {
                    let reason = error.message().to_owned();
                    warn!(source = %name, %reason, "a tool source is unavailable: its tools are not offered");
                    reason
                })?;
                let mut registered = self.tools.write().unwrap_or_else(PoisonError::into_inner);
                for (tool, declared_ms) in tools {
                    let id = tool.id().to_owned();
                    if !of_family(&id, name) {
                        warn!(source = %name, tool = %id, "a tool source offered a tool outside its family; left out");
                        continue;
                    }
                    if let Err(error) = Self::insert(&self.limits, &mut registered, tool, declared_ms) {
                        warn!(tool = %id, %error, "a tool is left out; the others are offered");
                    }
                }
                Ok(())
            })
            .await
            .clone()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Arc<Entry>>> {
        self.tools.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn entry(&self, id: &str) -> Result<Arc<Entry>, ToolError> {
        if let Some(entry) = self.read().get(id) {
            return Ok(Arc::clone(entry));
        }
        let Some(name) = self.source_of(id) else {
            return Err(ToolError::invalid_args(format!("unknown tool `{id}`")));
        };
        Err(match self.sources[name].loaded.get() {
            Some(Err(reason)) => ToolError::failed(format!(
                "`{id}` is a tool of `{name}`, which is unavailable: {reason}"
            )),
            Some(Ok(())) => {
                ToolError::invalid_args(format!("unknown tool `{id}`: `{name}` does not offer it"))
            }
            None => ToolError::invalid_args(format!(
                "`{id}` is a tool of `{name}`, which has not been asked for its tools yet"
            )),
        })
    }

    /// The entry of `id`, its source asked first if it has one.
    async fn loaded_entry(&self, id: &str) -> Result<Arc<Entry>, ToolError> {
        // A source that cannot be used is answered by `entry`, naming it.
        let _ = self.load(id).await;
        self.entry(id)
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
        let entry = self.loaded_entry(&ctx.tool_id).await?;
        let _permits = self.permits(&entry).await;
        guarded(entry.timeout_ms, entry.tool.prepare(ctx, args)).await
    }

    /// Performs the effect: bounded in concurrency and time, contained, and retried with
    /// exponential backoff and jitter when the tool is idempotent and the error says a retry
    /// is safe, at most `retries_max` times.
    ///
    /// # Errors
    ///
    /// The last attempt's error; a timeout or a panic has an uncertain outcome.
    pub async fn execute(&self, ctx: &ToolContext, args: &Value) -> Result<ToolOutput, ToolError> {
        self.execute_while(ctx, args, &|| true).await
    }

    /// [`Dispatcher::execute`], each retry made only while `may_act` answers `true` (asked
    /// after the backoff, right before the attempt): when it answers `false`, the last
    /// attempt's error is the answer and nothing more runs.
    ///
    /// # Errors
    ///
    /// As [`Dispatcher::execute`].
    pub async fn execute_while(
        &self,
        ctx: &ToolContext,
        args: &Value,
        may_act: &(dyn Fn() -> bool + Sync),
    ) -> Result<ToolOutput, ToolError> {
        let entry = self.loaded_entry(&ctx.tool_id).await?;
        let retries_max = if entry.tool.idempotent() {
            self.limits.retries_max_for(&ctx.tool_id)
        } else {
            0
        };
        let (result, attempts) = self
            .retrying(&entry, ctx, entry.timeout_ms, retries_max, may_act, || {
                entry.tool.execute(ctx, args)
            })
            .await;
        debug!(tool = %ctx.tool_id, step_seq = ctx.step_seq, attempts, ok = result.is_ok(), "executed");
        result
    }

    /// Calls `call` under the tool's permits and `timeout_ms`, again after a backoff with
    /// jitter while it fails with a retriable error and `may_act` allows, at most
    /// `retries_max` more times. Returns the last result and the number of attempts; a last
    /// error that says nothing happened, after an attempt whose outcome was unknown, is
    /// returned as unknown too (that attempt may have acted), naming both.
    async fn retrying<T, Fut>(
        &self,
        entry: &Entry,
        ctx: &ToolContext,
        timeout_ms: u64,
        retries_max: u32,
        may_act: &(dyn Fn() -> bool + Sync),
        call: impl Fn() -> Fut,
    ) -> (Result<T, ToolError>, u32)
    where
        Fut: Future<Output = Result<T, ToolError>>,
    {
        let mut retry_idx = 0;
        // The first attempt whose outcome was unknown, if any.
        let mut in_doubt: Option<String> = None;
        let last = loop {
            let result = {
                let _permits = self.permits(entry).await;
                guarded(timeout_ms, call()).await
            };
            match result {
                Err(error) if error.is_retriable() && retry_idx < retries_max => {
                    if error.is_uncertain() && in_doubt.is_none() {
                        in_doubt = Some(error.to_string());
                    }
                    let backoff_ms = self.limits.backoff_ms(retry_idx);
                    let backoff_ms = backoff_ms + self.jitter.jitter_ms(backoff_ms / 2);
                    warn!(tool = %ctx.tool_id, step_seq = ctx.step_seq, retry = retry_idx + 1, backoff_ms, %error, "retrying");
                    tokio::time::sleep(Duration::from_millis(backoff_ms)).await;
                    if !may_act() {
                        warn!(tool = %ctx.tool_id, step_seq = ctx.step_seq, "no retry: this process may no longer act");
                        break Err(error);
                    }
                    retry_idx += 1;
                }
                other => break other,
            }
        };
        let last = match (last, in_doubt) {
            (Err(error), Some(earlier)) if !error.is_uncertain() => {
                Err(error.after_attempt_in_doubt(&earlier))
            }
            (last, _) => last,
        };
        (last, retry_idx + 1)
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
        let entry = self.loaded_entry(&ctx.tool_id).await?;
        let _permits = self.permits(&entry).await;
        guarded(entry.timeout_ms, entry.tool.probe(ctx, args, undo)).await
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
        let entry = self.loaded_entry(&ctx.tool_id).await?;
        let _permits = self.permits(&entry).await;
        guarded(
            entry.timeout_ms,
            entry.tool.changed_since(ctx, args, undo, output),
        )
        .await
    }

    /// Asks whether the world is still what a begun step's preparation found (contained,
    /// bounded by the tool's timeout, never retried): once the step holds its resources,
    /// before its effect ([`Compensate::changed_since_prepared`]).
    ///
    /// # Errors
    ///
    /// The tool's error, or a timeout or contained panic.
    ///
    /// [`Compensate::changed_since_prepared`]: agent_kernel_api::Compensate::changed_since_prepared
    pub async fn changed_since_prepared(
        &self,
        ctx: &ToolContext,
        args: &Value,
        undo: &Undo,
    ) -> Result<Option<String>, ToolError> {
        let entry = self.loaded_entry(&ctx.tool_id).await?;
        let _permits = self.permits(&entry).await;
        guarded(
            entry.timeout_ms,
            entry.tool.changed_since_prepared(ctx, args, undo),
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
        self.compensate_while(ctx, args, undo, output, &|| true)
            .await
    }

    /// [`Dispatcher::compensate`], each retry made only while `may_act` answers `true`, as
    /// [`Dispatcher::execute_while`] does.
    ///
    /// # Errors
    ///
    /// The last attempt's error.
    pub async fn compensate_while(
        &self,
        ctx: &ToolContext,
        args: &Value,
        undo: &Undo,
        output: Option<&ToolOutput>,
        may_act: &(dyn Fn() -> bool + Sync),
    ) -> Result<(), ToolError> {
        let entry = self.loaded_entry(&ctx.tool_id).await?;
        let retries_max = self.limits.retries_max_for(&ctx.tool_id);
        let (result, _) = self
            .retrying(
                &entry,
                ctx,
                self.limits.compensation_timeout_ms,
                retries_max,
                may_act,
                || entry.tool.compensate(ctx, args, undo, output),
            )
            .await;
        result
    }
}
