//! What every tool shares: argument parsing, schemas, blocking I/O, error mapping.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use agent_kernel_api::{SagaId, ToolContext, ToolError};
use agent_kernel_sandbox::{ConfinedFile, ConfinedPath, FsSandbox, SandboxError};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// The version every built-in tool reports.
pub const TOOL_VERSION: &str = "1.0.0";

/// What every temporary file of the file tools is named like: `.agent-kernel-<saga>-<step>.tmp`.
pub const TEMP_PREFIX: &str = ".agent-kernel-";

/// The suffix of every temporary file of the file tools.
pub const TEMP_SUFFIX: &str = ".tmp";

/// Parses `args` into a tool's argument struct; serde's message names the offending field.
pub(crate) fn parse_args<T: DeserializeOwned>(args: &Value) -> Result<T, ToolError> {
    T::deserialize(args).map_err(|error| ToolError::invalid_args(error.to_string()))
}

/// A JSON Schema (draft 2020-12) for an object with exactly `properties`.
pub(crate) fn object_schema(title: &str, properties: Value, required: &[&str]) -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": title,
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    })
}

/// The schema of a `path` argument.
pub(crate) fn path_schema() -> Value {
    json!({
        "type": "string",
        "minLength": 1,
        "description": "a file path; relative paths resolve against the working directory",
    })
}

/// Maps a sandbox error to the tool error the saga engine understands.
pub(crate) fn sandbox_error(error: SandboxError) -> ToolError {
    let message = error.to_string();
    if error.is_denied() {
        ToolError::denied(message)
    } else if error.is_invalid_path() || error.is_invalid_url() {
        ToolError::invalid_args(message)
    } else if error.may_have_changed() {
        ToolError::uncertain(message)
    } else {
        ToolError::failed(message)
    }
}

/// Runs blocking file work on the blocking pool, so no runtime thread waits on the disk.
///
/// A panic on the blocking thread becomes [`ToolError::panicked`] (its effect is uncertain).
pub(crate) async fn blocking<T, F>(work: F) -> Result<T, ToolError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, ToolError> + Send + 'static,
{
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result,
        Err(error) if error.is_panic() => Err(ToolError::panicked(format!(
            "the blocking file task panicked: {error}"
        ))),
        Err(error) => Err(ToolError::uncertain(format!(
            "the blocking file task did not finish: {error}"
        ))),
    }
}

/// The blocking file work of each step that may still be running in this process.
///
/// The dispatcher's timeout drops a tool's future, but blocking work handed to the pool
/// runs on to its end: an `fs.write` stalled on a slow disk may rename its new bytes into
/// place after it timed out. Its step's compensation must not run before that, or the late
/// effect would land on top of the restored file; [`settle`] waits for it.
static IN_FLIGHT: LazyLock<Mutex<HashMap<StepKey, Arc<Flight>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// A step: its saga and position.
type StepKey = (SagaId, u32);

/// The blocking work of one step: how much is running, and a signal when none is.
#[derive(Debug, Default)]
struct Flight {
    running: AtomicUsize,
    ended: tokio::sync::Notify,
}

/// One piece of a step's blocking work, counted while it exists: it moves into the
/// blocking closure, so it is dropped when the work really ends.
struct FlightGuard {
    key: StepKey,
    flight: Arc<Flight>,
}

impl FlightGuard {
    fn enter(ctx: &ToolContext) -> FlightGuard {
        let key = (ctx.saga_id.clone(), ctx.step_seq);
        let mut in_flight = IN_FLIGHT.lock().unwrap_or_else(PoisonError::into_inner);
        let flight = Arc::clone(in_flight.entry(key.clone()).or_default());
        flight.running.fetch_add(1, Ordering::SeqCst);
        FlightGuard { key, flight }
    }
}

impl Drop for FlightGuard {
    fn drop(&mut self) {
        let mut in_flight = IN_FLIGHT.lock().unwrap_or_else(PoisonError::into_inner);
        if self.flight.running.fetch_sub(1, Ordering::SeqCst) == 1 {
            if in_flight
                .get(&self.key)
                .is_some_and(|current| Arc::ptr_eq(current, &self.flight))
            {
                in_flight.remove(&self.key);
            }
            self.flight.ended.notify_waiters();
        }
    }
}

/// [`blocking`], counted as work of `ctx`'s step until it really ends, even when the caller
/// stops waiting for it (a timeout): see [`settle`].
pub(crate) async fn step_blocking<T, F>(ctx: &ToolContext, work: F) -> Result<T, ToolError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, ToolError> + Send + 'static,
{
    let guard = FlightGuard::enter(ctx);
    blocking(move || {
        let _counted = guard;
        work()
    })
    .await
}

/// Waits until no blocking work of `ctx`'s step started by [`step_blocking`] is running in
/// this process: a compensation calls it first, so that an effect that timed out but is
/// still under way cannot land after the undo. Work of another process (a crashed one) is
/// gone with it. The wait is bounded by the compensation's own timeout.
pub(crate) async fn settle(ctx: &ToolContext) {
    let key = (ctx.saga_id.clone(), ctx.step_seq);
    loop {
        let flight = {
            let in_flight = IN_FLIGHT.lock().unwrap_or_else(PoisonError::into_inner);
            match in_flight.get(&key) {
                None => return,
                Some(flight) => Arc::clone(flight),
            }
        };
        let ended = flight.ended.notified();
        tokio::pin!(ended);
        // Registered before the count is read, so an end in between still wakes us.
        ended.as_mut().enable();
        if flight.running.load(Ordering::SeqCst) == 0 {
            continue;
        }
        ended.await;
    }
}

/// The file side shared by the file tools: the sandbox and the working directory that
/// relative paths resolve against.
#[derive(Debug, Clone)]
pub(crate) struct FileAccess {
    sandbox: Arc<FsSandbox>,
    cwd: PathBuf,
}

impl FileAccess {
    pub(crate) fn new(sandbox: Arc<FsSandbox>, cwd: PathBuf) -> FileAccess {
        FileAccess { sandbox, cwd }
    }

    /// The folder relative paths resolve against.
    pub(crate) fn cwd(&self) -> &Path {
        &self.cwd
    }

    /// Rules on `path` without touching the disk.
    pub(crate) fn resolve(&self, path: &str) -> Result<ConfinedPath, ToolError> {
        self.sandbox.resolve(path, &self.cwd).map_err(sandbox_error)
    }

    /// The resource a call on the file at `path` claims: the file as the sandbox resolves
    /// it, its folders' links followed (`file:/abs/path`), on a blocking thread.
    pub(crate) async fn resource(&self, path: &str) -> Result<Option<Vec<String>>, ToolError> {
        let file = self.open(path)?;
        let identity = blocking(move || file.identity().map_err(sandbox_error)).await?;
        Ok(Some(vec![agent_kernel_api::file_resource(&identity)]))
    }

    /// Rules on `path` and binds it to its root's handle.
    pub(crate) fn open(&self, path: &str) -> Result<ConfinedFile, ToolError> {
        self.sandbox
            .resolve_open(path, &self.cwd)
            .map_err(sandbox_error)
    }

    /// Binds a path recorded in an undo record to the policy in force: ruled on again as a
    /// new path would be, so compensation and probes reach nothing today's roots exclude.
    pub(crate) fn reconfine(&self, recorded: &ConfinedPath) -> Result<ConfinedFile, ToolError> {
        self.sandbox.reconfine(recorded).map_err(sandbox_error)
    }

    /// [`reconfine`](Self::reconfine), refused as changed since when the recorded path now
    /// leads to another file than `touched`, the one its step touched (a folder link
    /// retargeted since): a compensation never acts on a file its step did not touch,
    /// which its saga never claimed. `touched` is `None` in records written before it was
    /// kept.
    pub(crate) async fn reconfine_touched(
        &self,
        recorded: &ConfinedPath,
        touched: Option<&str>,
    ) -> Result<ConfinedFile, ToolError> {
        let file = self.reconfine(recorded)?;
        let Some(touched) = touched.map(str::to_owned) else {
            return Ok(file);
        };
        let shown = recorded.to_string();
        blocking(move || {
            let now = touched_by(&file)?;
            if now != touched {
                return Err(ToolError::changed(format!(
                    "`{shown}` now leads to {now}, not to {touched}, the file its step changed (a folder link changed since); nothing was done to either"
                )));
            }
            Ok(file)
        })
        .await
    }

    /// Checks that `len` bytes may be written to `path`.
    pub(crate) fn check_size(&self, path: &str, len: usize) -> Result<(), ToolError> {
        self.sandbox
            .check_size(path, len as u64)
            .map_err(sandbox_error)
    }
}

/// The temporary file name of a step: deterministic, so compensation after a crash knows
/// what to remove.
///
/// The saga id is reduced to letters, digits, `-` and `_` and shortened so the name stays a
/// plain name well under 255 bytes.
pub(crate) fn temp_name(ctx: &ToolContext) -> String {
    let saga = saga_for_name(&ctx.saga_id);
    format!("{TEMP_PREFIX}{saga}-{}{TEMP_SUFFIX}", ctx.step_seq)
}

/// A saga id as a file name may hold it: at most 128 characters of letters, digits, `-`
/// and `_` (any other character becomes `_`).
pub(crate) fn saga_for_name(saga_id: &agent_kernel_api::SagaId) -> String {
    const SAGA_ID_MAX_CHARS: usize = 128;
    saga_id
        .as_str()
        .chars()
        .take(SAGA_ID_MAX_CHARS)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Checks that an undo record names a temporary file of ours, so a damaged record cannot make
/// compensation remove a user's file.
pub(crate) fn check_temp_name(tool: &str, temp: &str) -> Result<(), ToolError> {
    if temp.starts_with(TEMP_PREFIX) && temp.ends_with(TEMP_SUFFIX) && !temp.contains('/') {
        Ok(())
    } else {
        Err(ToolError::failed(format!(
            "the undo record of {tool} names an unexpected temporary file `{temp}`"
        )))
    }
}

/// Parses an undo record's `data`.
pub(crate) fn parse_undo<T: DeserializeOwned>(tool: &str, data: &Value) -> Result<T, ToolError> {
    T::deserialize(data).map_err(|error| {
        ToolError::failed(format!("the undo record of {tool} is malformed: {error}"))
    })
}

/// Serializes an undo record's `data`.
pub(crate) fn undo_data<T: serde::Serialize>(tool: &str, data: &T) -> Result<Value, ToolError> {
    serde_json::to_value(data).map_err(|error| {
        ToolError::failed(format!("cannot record the undo data of {tool}: {error}"))
    })
}

/// "1 byte", "5 bytes".
pub(crate) fn byte_count(n: u64) -> String {
    if n == 1 {
        "1 byte".to_owned()
    } else {
        format!("{n} bytes")
    }
}

/// The template the file tools show for their resource: the file their `path` names, which
/// their [`Tool::resources`](agent_kernel_api::Tool::resources) resolves as the sandbox does.
pub(crate) fn path_resource() -> agent_kernel_api::KeyTemplate {
    agent_kernel_api::KeyTemplate::parse("file:$.args.path").expect("a fixed template is valid")
}

/// The file `file` is, its folders' links followed, as an undo record keeps it (the path of
/// its `file:` resource).
pub(crate) fn touched_by(file: &ConfinedFile) -> Result<String, ToolError> {
    file.identity()
        .map(|path| path.display().to_string())
        .map_err(sandbox_error)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    use agent_kernel_api::Durability;

    use super::*;

    fn ctx(step_seq: u32) -> ToolContext {
        ToolContext {
            saga_id: SagaId::new("settle-test"),
            step_seq,
            tool_id: "fs.write".into(),
            idempotency_key: None,
            actor: None,
            durability: Durability::Normal,
            files: Arc::new(agent_kernel_api::NoFiles::new(".")),
        }
    }

    #[tokio::test]
    async fn a_compensation_waits_for_blocking_work_that_outlived_its_timeout() {
        let landed = Arc::new(AtomicBool::new(false));
        let effect = Arc::clone(&landed);
        let timed_out = tokio::time::timeout(
            Duration::from_millis(20),
            step_blocking(&ctx(1), move || {
                std::thread::sleep(Duration::from_millis(300));
                effect.store(true, Ordering::SeqCst);
                Ok(())
            }),
        )
        .await;
        assert!(timed_out.is_err(), "the caller stopped waiting");
        assert!(
            !landed.load(Ordering::SeqCst),
            "the work is still under way"
        );
        settle(&ctx(1)).await;
        assert!(
            landed.load(Ordering::SeqCst),
            "settle returned only once the late effect had landed"
        );
        // Nothing left in flight: another step, or this one again, does not wait.
        settle(&ctx(1)).await;
        settle(&ctx(2)).await;
        assert!(
            !IN_FLIGHT
                .lock()
                .expect("not poisoned")
                .contains_key(&(SagaId::new("settle-test"), 1))
        );
    }
}
