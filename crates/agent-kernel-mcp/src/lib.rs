//! The agent-kernel MCP server (reference §9): an agent's tool calls run through the kernel
//! as live sagas, over the Model Context Protocol on stdio, with the official Rust SDK
//! (`rmcp`).
//!
//! [`KernelServer`] implements `rmcp`'s `ServerHandler` by hand, since the tools are known
//! only at run time: the `saga_*` tools, and one tool per kernel tool (its id with each `.`
//! replaced by `_`) whose input is `{args, saga_id?, idempotency_key?}`. A call with a
//! `saga_id` is a step of that open saga (one of this connection's: a stdio server serves
//! one client, and the kernel's registry is this process's); a call without is a saga of
//! its own, begun, called and committed (or rolled back) within the call.
//! [`serve_stdio`] serves until end of input or SIGTERM, then rolls back what is open.
//!
//! Operator commands (recover, rollback, audit seal, …) are never offered.
//!
//! ```no_run
//! # async fn serve() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let kernel = agent_kernel::KernelBuilder::from_folder(".").build()?;
//! agent_kernel_mcp::serve_stdio(kernel, agent_kernel_mcp::ServerOptions::default()).await?;
//! # Ok(()) }
//! ```
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use agent_kernel_api::{
    AbortCause, ApprovalRequest, ApprovalStatus, EffectClass, OnDenied, Reversibility, SagaId,
    SagaState,
};
use agent_kernel_core::{
    BeginOptions, CallAnswer, Kernel, KernelError, LiveSaga, ProblemKind, SagaReport, StepReport,
};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CustomRequest, CustomResult,
    Implementation, JsonObject, ListToolsResult, PaginatedRequestParams, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::{Peer, RequestContext};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Value, json};
use tracing::{info, warn};

mod notify;
mod screen;
mod stdio;
pub use screen::MESSAGE_DEPTH_MAX;

/// What the server tells an agent about itself, in three sentences.
pub const INSTRUCTIONS: &str = "Every tool call runs through agent-kernel as a step of a saga: its intent is logged before it runs, the sandbox policy confines it, and it can be undone. Call saga_begin, then call tools with its saga_id, then saga_commit to keep their effects or saga_abort to undo them all, last first; a call without saga_id is a saga of its own that commits at once. A call that is refused (bad input) runs nothing and leaves the saga open; one that fails rolls the whole saga back and says what was undone. A call whose effect needs a person's approval answers status AWAITING_APPROVAL without running; an operator decides it outside this server, which then sends a notifications/message (event approval_decided), and saga_resume runs it (or reports the rollback).";

/// The name the server gives itself: agent-kernel's, not the SDK's.
pub const SERVER_NAME: &str = "agent-kernel";

/// The server's options.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// The actor recorded with every saga of this connection (one saga at a time).
    pub actor: Option<String>,
    /// What the agent should know about the log at start (unsettled sagas of processes
    /// that are gone, whose locks stay held until they are recovered), added to the
    /// server's instructions.
    pub notice: Option<String>,
    /// Where the file tools may act and what a relative path means (the policy's allowed
    /// roots, the server's working folder), added to the instructions and to each file
    /// tool's description, so that an agent need not learn them from a denial.
    pub files: Option<String>,
    /// What a call the sandbox or the FSM denies does to its saga: refused with the saga left
    /// open (the default), or the saga rolled back (`sandbox.toml` `[mcp] on_denied`).
    pub on_denied: OnDenied,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            actor: None,
            notice: None,
            files: None,
            on_denied: OnDenied::Refuse,
        }
    }
}

/// How often the server looks at a request one of its sagas waits on, to tell the client
/// once an operator has decided it.
pub const DECISION_WATCH_INTERVAL: Duration = Duration::from_millis(250);

/// The MCP server over a kernel: the `saga_*` tools and one tool per kernel tool.
#[derive(Debug, Clone)]
pub struct KernelServer {
    kernel: Arc<Kernel>,
    options: ServerOptions,
    /// MCP tool name → kernel tool id.
    names: Arc<BTreeMap<String, String>>,
    /// The sagas begun for one call without `saga_id` that wait for an approval: once the
    /// step runs (`saga_resume`), they commit as the call would have.
    autocommit_waiting: Arc<Mutex<BTreeSet<SagaId>>>,
    /// The client, once it has called a tool: told when a request its saga waits on is
    /// decided.
    peer: Arc<Mutex<Option<Peer<RoleServer>>>>,
    /// The requests watched for a decision, one watch each.
    watched: Arc<Mutex<BTreeSet<String>>>,
}

/// The answer to a call whose step waits for an operator's approval: not an error.
fn awaiting_result(saga_id: &SagaId, request: &ApprovalRequest) -> CallToolResult {
    CallToolResult::structured(json!({
        "saga_id": saga_id.as_str(),
        "step": request.step_seq,
        "tool": request.tool_id,
        "status": "AWAITING_APPROVAL",
        "state": SagaState::AwaitingApproval,
        // What the operator is shown: the whole arguments, hidden characters escaped.
        "approval": agent_kernel_core::approval_document(request),
    }))
}

/// Whether kernel tool `id` is a built-in file tool (`fs.*`, `validate.file`), whose paths
/// the sandbox's roots confine.
fn is_file_tool(id: &str) -> bool {
    id.starts_with("fs.") || id == "validate.file"
}

/// What the file tools' paths mean, in one sentence for an agent: the allowed `roots` (none:
/// no file may be touched) and the folder `cwd` a relative path is joined to.
pub fn files_note(roots: &[std::path::PathBuf], cwd: &std::path::Path) -> String {
    if roots.is_empty() {
        return "The sandbox policy allows no file: every file tool call is denied.".to_owned();
    }
    let roots: Vec<String> = roots
        .iter()
        .map(|root| format!("`{}`", root.display()))
        .collect();
    format!(
        "File paths must lie under {} (the sandbox's allowed roots; anything else is denied); a relative path is taken from `{}`.",
        roots.join(", "),
        cwd.display()
    )
}

/// The MCP name of kernel tool `id`: each `.` replaced by `_`.
pub fn mcp_name(id: &str) -> String {
    id.replace('.', "_")
}

/// What an agent reads about a kernel tool: the tool's own description (else its id), how
/// far the kernel can take its effect back, and whether its calls wait for an approval.
fn describe(
    id: &str,
    description: &str,
    effect: EffectClass,
    reversibility: Reversibility,
    needs_approval: bool,
) -> String {
    let what = if description.is_empty() {
        format!("The kernel tool `{id}`.")
    } else if description.ends_with('.') {
        description.to_owned()
    } else {
        format!("{description}.")
    };
    let undo = match (effect, reversibility) {
        (EffectClass::ReadOnly, _) => "it only reads",
        (_, Reversibility::Full) => "its effect is compensated exactly on rollback",
        (_, Reversibility::Partial) => "its effect is compensated only in part on rollback",
        (_, Reversibility::None) => "its effect cannot be undone",
    };
    let approval = if needs_approval {
        " Each call waits for a person's approval before anything of it runs: it answers status AWAITING_APPROVAL, and saga_resume runs it once approved."
    } else {
        ""
    };
    format!("{what} Run as a saga step: sandboxed, logged; {undo}.{approval}")
}

fn object(value: Value) -> JsonObject {
    match value {
        Value::Object(map) => map,
        _ => JsonObject::new(),
    }
}

fn steps_of(steps: &[StepReport]) -> Value {
    Value::Array(
        steps
            .iter()
            .map(|step| json!({ "seq": step.seq, "tool": step.tool, "status": step.status }))
            .collect(),
    )
}

/// An `isError` result: `{saga_id, state, error: {kind, message}, steps}`.
fn error_result(
    saga_id: Option<&SagaId>,
    state: Option<SagaState>,
    kind: &str,
    message: &str,
    steps: &[StepReport],
) -> CallToolResult {
    CallToolResult::structured_error(json!({
        "saga_id": saga_id.map(SagaId::as_str),
        "state": state,
        "error": { "kind": kind, "message": message },
        "steps": steps_of(steps),
    }))
}

/// The error result of a saga rolled back by a call.
fn rolled_back_result(report: &SagaReport) -> CallToolResult {
    let kind = if report.state == SagaState::FailedRollbackPartial {
        "operator"
    } else if report.is_denied() {
        "denied"
    } else {
        "failed"
    };
    let message = report.failure.as_ref().map_or_else(
        || "the saga was rolled back".to_owned(),
        |failure| {
            format!(
                "step {} (`{}`): {}",
                failure.step_seq, failure.tool, failure.error
            )
        },
    );
    error_result(
        Some(&report.saga_id),
        Some(report.state),
        kind,
        &message,
        &report.steps,
    )
}

/// The error result of a kernel error answering a request.
fn kernel_error_result(saga_id: Option<&SagaId>, error: &KernelError) -> CallToolResult {
    let kind = if error.is_bad_input() {
        "bad_input"
    } else if error.is_denied() {
        "denied"
    } else {
        "operator"
    };
    error_result(saga_id, None, kind, &error.to_string(), &[])
}

/// `mutex` locked, whether or not a thread panicked while holding it.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn complete(result: CallToolResult) -> Result<CallToolResponse, McpError> {
    Ok(CallToolResponse::Complete(result))
}

impl KernelServer {
    /// A server over `kernel`, offering the tools it has registered (an upstream server's
    /// once it has been asked: see [`Kernel::load_all_tools`], which [`serve_stdio`] calls).
    pub fn new(kernel: Arc<Kernel>, options: ServerOptions) -> KernelServer {
        let mut names = BTreeMap::new();
        for id in kernel.tool_ids() {
            let name = mcp_name(&id);
            if names.contains_key(&name) || name.starts_with("saga_") {
                warn!(%id, %name, "a kernel tool whose MCP name is taken is not offered");
                continue;
            }
            names.insert(name, id);
        }
        KernelServer {
            kernel,
            options,
            names: Arc::new(names),
            autocommit_waiting: Arc::default(),
            peer: Arc::default(),
            watched: Arc::default(),
        }
    }

    /// Watches request `request` of saga `saga_id` (once, however often it is asked) until
    /// it is decided or the saga ends, looking every [`DECISION_WATCH_INTERVAL`]; once
    /// approved, rejected or expired, tells the client with a `notifications/message`
    /// (level `notice`, logger `agent-kernel`, data `{event: "approval_decided", saga_id,
    /// approval_id, status}`), after which `saga_resume` runs at once.
    fn watch_decision(&self, saga_id: &SagaId, request: &ApprovalRequest) {
        let Some(peer) = lock(&self.peer).clone() else {
            return;
        };
        if !lock(&self.watched).insert(request.approval_id.clone()) {
            return;
        }
        let (kernel, watched) = (Arc::clone(&self.kernel), Arc::clone(&self.watched));
        let (saga_id, approval_id) = (saga_id.clone(), request.approval_id.clone());
        tokio::spawn(async move {
            let status = loop {
                tokio::time::sleep(DECISION_WATCH_INTERVAL).await;
                if kernel.live_saga(&saga_id).is_none() {
                    // Ended meanwhile (aborted, rolled back): nothing to resume.
                    break None;
                }
                match kernel.approval(&approval_id).await {
                    Ok(record) => match record.status_at(kernel.now_ms()) {
                        ApprovalStatus::Pending => {}
                        status @ (ApprovalStatus::Approved
                        | ApprovalStatus::Rejected
                        | ApprovalStatus::Expired) => break Some(status),
                        // Used or void: the saga has already moved on.
                        _ => break None,
                    },
                    Err(error) => {
                        warn!(%saga_id, %approval_id, %error, "cannot watch the approval");
                        break None;
                    }
                }
            };
            lock(&watched).remove(&approval_id);
            if let Some(status) = status {
                info!(%saga_id, %approval_id, %status, "telling the client the approval is decided");
                let data = json!({
                    "event": "approval_decided",
                    "saga_id": saga_id.as_str(),
                    "approval_id": approval_id,
                    "status": status,
                    "next": "call saga_resume with this saga_id",
                });
                if let Err(error) = notify::tell(&peer, data).await {
                    warn!(%saga_id, %error, "the client could not be told the approval is decided");
                }
            }
        });
    }

    fn autocommit_waiting(&self) -> MutexGuard<'_, BTreeSet<SagaId>> {
        lock(&self.autocommit_waiting)
    }

    /// Every tool this server lists.
    pub fn tools(&self) -> Vec<Tool> {
        let saga_id =
            json!({ "type": "string", "description": "the saga, as saga_begin answered" });
        let saga_only = json!({
            "type": "object",
            "properties": { "saga_id": saga_id },
            "required": ["saga_id"],
            "additionalProperties": false,
        });
        let mut tools = vec![
            Tool::new(
                "saga_begin",
                "Begin a saga: the tool calls made with its saga_id are its steps, undone together if it is aborted or a step fails.",
                object(json!({
                    "type": "object",
                    "properties": { "name": { "type": "string", "description": "a label for the saga" } },
                    "additionalProperties": false,
                })),
            )
            .with_annotations(ToolAnnotations::new().read_only(false).destructive(false)),
            Tool::new(
                "saga_commit",
                "Commit a saga: keep the effects of its steps.",
                object(saga_only.clone()),
            )
            .with_annotations(ToolAnnotations::new().read_only(false).destructive(false)),
            Tool::new(
                "saga_abort",
                "Abort a saga: undo the effects of its steps, last first.",
                object(json!({
                    "type": "object",
                    "properties": { "saga_id": saga_id, "reason": { "type": "string" } },
                    "required": ["saga_id"],
                    "additionalProperties": false,
                })),
            )
            .with_annotations(ToolAnnotations::new().read_only(false).destructive(false)),
            Tool::new(
                "saga_resume",
                "Resume a saga whose step waits for a person's approval: once approved, the step runs and this answers as the call would have; still pending, the same AWAITING_APPROVAL answer; rejected or expired, the saga is rolled back.",
                object(saga_only.clone()),
            )
            .with_annotations(ToolAnnotations::new().read_only(false).destructive(false)),
            Tool::new(
                "saga_status",
                "Where a saga this connection began stands, open or ended, with its steps (and the approval it waits for).",
                object(saga_only.clone()),
            )
            .with_annotations(ToolAnnotations::new().read_only(true)),
        ];
        for (name, id) in self.names.iter() {
            let Some(tool) = self.kernel.tool(id) else {
                continue;
            };
            let schema = json!({
                "type": "object",
                "properties": {
                    "args": tool.args_schema(),
                    "saga_id": { "type": "string", "description": "the open saga this call is a step of; without it, the call is a saga of its own" },
                    "idempotency_key": { "type": "string", "description": "run at most once across sagas by this key" },
                },
                "required": ["args"],
                "additionalProperties": false,
            });
            let read_only = tool.effect() == EffectClass::ReadOnly;
            let mut annotations = ToolAnnotations::new()
                .read_only(read_only)
                .idempotent(tool.idempotent());
            if !read_only {
                // A kernel tool's effect is compensated on rollback: destructive only when
                // compensation cannot restore the prior state exactly.
                annotations = annotations.destructive(tool.reversibility() != Reversibility::Full);
            }
            if id == "http.get" {
                annotations = annotations.open_world(true);
            }
            let mut description = describe(
                id,
                tool.description(),
                tool.effect(),
                tool.reversibility(),
                self.kernel
                    .approval_policy()
                    .reason_for(id, tool.as_ref())
                    .is_some(),
            );
            if let Some(files) = self.options.files.as_deref().filter(|_| is_file_tool(id)) {
                description.push(' ');
                description.push_str(files);
            }
            tools.push(
                Tool::new(name.clone(), description, object(schema)).with_annotations(annotations),
            );
        }
        tools
    }

    fn saga_arg(arguments: &JsonObject) -> Result<SagaId, McpError> {
        match arguments.get("saga_id") {
            Some(Value::String(id)) if !id.is_empty() => Ok(SagaId::new(id.as_str())),
            _ => Err(McpError::invalid_params(
                "`saga_id` is required, as text",
                None,
            )),
        }
    }

    async fn saga_tool(
        &self,
        name: &str,
        arguments: &JsonObject,
    ) -> Result<CallToolResponse, McpError> {
        let known: &[&str] = match name {
            "saga_begin" => &["name"],
            "saga_abort" => &["saga_id", "reason"],
            _ => &["saga_id"],
        };
        if let Some(unknown) = arguments.keys().find(|key| !known.contains(&key.as_str())) {
            return Err(McpError::invalid_params(
                format!("unknown argument `{unknown}` of {name}"),
                None,
            ));
        }
        if name == "saga_begin" {
            let label = match arguments.get("name") {
                None | Some(Value::Null) => None,
                Some(Value::String(label)) => Some(label.clone()),
                Some(_) => return Err(McpError::invalid_params("`name` must be text", None)),
            };
            return complete(
                match self
                    .kernel
                    .begin(BeginOptions {
                        name: label,
                        actor: self.options.actor.clone(),
                        on_denied: self.options.on_denied,
                    })
                    .await
                {
                    Ok(saga) => CallToolResult::structured(
                        json!({ "saga_id": saga.id().as_str(), "state": SagaState::Planning }),
                    ),
                    Err(error) => kernel_error_result(None, &error),
                },
            );
        }
        let saga_id = Self::saga_arg(arguments)?;
        let Some(saga) = self.kernel.live_saga(&saga_id) else {
            if name == "saga_status" {
                return complete(self.ended_status(&saga_id).await);
            }
            let error = KernelError::SagaNotOpen(saga_id.clone());
            return complete(kernel_error_result(Some(&saga_id), &error));
        };
        let outcome = match name {
            "saga_resume" => {
                let autocommit = self.autocommit_waiting().remove(&saga_id);
                return complete(match saga.resume().await {
                    Ok(answer) => self.answer_result(&saga, answer, autocommit).await,
                    Err(error) => kernel_error_result(Some(&saga_id), &error),
                });
            }
            "saga_commit" => saga.commit().await,
            "saga_abort" => {
                let reason = match arguments.get("reason") {
                    Some(Value::String(reason)) => reason.clone(),
                    _ => "aborted by the agent".to_owned(),
                };
                saga.abort(&reason).await
            }
            _ => {
                return complete(match saga.status().await {
                    Some(status) => {
                        let mut document = json!({
                            "saga_id": status.saga_id.as_str(),
                            "state": status.state,
                            "steps": steps_of(&status.steps),
                        });
                        if let Some(request) = &status.approval {
                            document["approval"] = agent_kernel_core::approval_document(request);
                        }
                        CallToolResult::structured(document)
                    }
                    None => kernel_error_result(
                        Some(&saga_id),
                        &KernelError::SagaNotOpen(saga_id.clone()),
                    ),
                });
            }
        };
        complete(match outcome {
            Ok(report) if report.state == SagaState::Done || name == "saga_abort" => {
                CallToolResult::structured(json!({
                    "saga_id": report.saga_id.as_str(),
                    "state": report.state,
                    "steps": steps_of(&report.steps),
                }))
            }
            Ok(report) => rolled_back_result(&report),
            Err(error @ KernelError::Denied { .. }) if name == "saga_commit" => {
                // A commit the FSM refuses (a step still waiting for its approval) rolled
                // the saga back first: the answer says so, with its steps as the log has
                // them.
                match self.kernel.log().saga(&saga_id).await {
                    Ok(Some(record)) => {
                        let report = SagaReport::from_record(&record, None);
                        error_result(
                            Some(&saga_id),
                            Some(report.state),
                            "denied",
                            &format!("{error}; the saga was rolled back"),
                            &report.steps,
                        )
                    }
                    _ => kernel_error_result(Some(&saga_id), &error),
                }
            }
            Err(error) => kernel_error_result(Some(&saga_id), &error),
        })
    }

    /// `saga_status` of a saga no longer open: from the log, for a saga this server began
    /// (its owner is this process: a stdio server serves one connection); `{saga_id,
    /// state, steps, approval?, locks}`, each step with its output.
    async fn ended_status(&self, saga_id: &SagaId) -> CallToolResult {
        let not_ours = || {
            kernel_error_result(
                Some(saga_id),
                &KernelError::InvalidRequest(format!(
                    "saga {saga_id} was not begun by this server: saga_status answers for this connection's sagas, open or ended"
                )),
            )
        };
        let record = match self.kernel.log().saga(saga_id).await {
            Ok(Some(record)) => record,
            Ok(None) => return not_ours(),
            Err(error) => return kernel_error_result(Some(saga_id), &KernelError::Log(error)),
        };
        if &record.saga.owner != self.kernel.owner() {
            return not_ours();
        }
        let steps: Vec<Value> = record
            .steps
            .iter()
            .map(|step| {
                json!({
                    "seq": step.step_seq,
                    "tool": step.tool_id,
                    "status": step.status,
                    "output": step.output.as_ref().map(|output| &output.data),
                })
            })
            .collect();
        let mut document = json!({
            "saga_id": saga_id.as_str(),
            "state": record.saga.state,
            "steps": steps,
            "locks": record.locks,
        });
        if let Ok(Some(approval)) = self.kernel.log().saga_approval(saga_id).await {
            let mut shown = agent_kernel_core::approval_document(&approval.request);
            shown["status"] = json!(approval.status);
            document["approval"] = shown;
        }
        CallToolResult::structured(document)
    }

    async fn kernel_tool(
        &self,
        id: &str,
        arguments: &JsonObject,
    ) -> Result<CallToolResponse, McpError> {
        if let Some(unknown) = arguments
            .keys()
            .find(|key| !["args", "saga_id", "idempotency_key"].contains(&key.as_str()))
        {
            return Err(McpError::invalid_params(
                format!(
                    "unknown argument `{unknown}`: a kernel tool takes {{args, saga_id?, idempotency_key?}}"
                ),
                None,
            ));
        }
        let Some(args) = arguments.get("args").cloned() else {
            return Err(McpError::invalid_params(
                "`args` is required: the tool's own arguments, as an object",
                None,
            ));
        };
        let key = match arguments.get("idempotency_key") {
            None | Some(Value::Null) => None,
            Some(Value::String(key)) => Some(key.clone()),
            Some(_) => {
                return Err(McpError::invalid_params(
                    "`idempotency_key` must be text",
                    None,
                ));
            }
        };
        if matches!(arguments.get("saga_id"), None | Some(Value::Null)) {
            // A saga of its own, committed with the call: two synced commits.
            let options = BeginOptions {
                name: Some(format!("{id} (autocommit)")),
                actor: self.options.actor.clone(),
                on_denied: self.options.on_denied,
            };
            return complete(match self.kernel.call_alone(options, id, args, key).await {
                Ok((saga, answer)) => self.answer_result(&saga, answer, true).await,
                Err(error) => kernel_error_result(None, &error),
            });
        }
        let saga_id = Self::saga_arg(arguments)?;
        let Some(saga) = self.kernel.live_saga(&saga_id) else {
            let error = KernelError::SagaNotOpen(saga_id.clone());
            return complete(kernel_error_result(Some(&saga_id), &error));
        };
        let answer = match saga.call(id, args, key).await {
            Ok(answer) => answer,
            Err(error) => return complete(kernel_error_result(Some(&saga_id), &error)),
        };
        complete(self.answer_result(&saga, answer, false).await)
    }

    /// The state and committed steps of a saga whose call ran nothing (bad input, a
    /// conflict): it stays open, unless it was begun for the call alone (`autocommit`),
    /// which ends with it (`reason`).
    async fn refused_call(
        saga: &LiveSaga,
        autocommit: bool,
        reason: &str,
    ) -> (SagaState, Vec<StepReport>) {
        let (state, steps) = match saga.status().await {
            // Where it stands: `AwaitingApproval` for a call refused while it waits.
            Some(status) => (status.state, status.steps),
            None => (SagaState::FailedRolledBack, Vec::new()),
        };
        if autocommit {
            // Nothing ran: the saga of this call ends with it.
            let _ = saga.abort(reason).await;
            return (SagaState::FailedRolledBack, steps);
        }
        (state, steps)
    }

    /// The result of a call's answer (or of `saga_resume`'s): for a saga begun for the
    /// call alone (`autocommit`), its commit, or its end when nothing ran.
    async fn answer_result(
        &self,
        saga: &LiveSaga,
        answer: CallAnswer,
        autocommit: bool,
    ) -> CallToolResult {
        let saga_id = saga.id().clone();
        match answer {
            CallAnswer::Committed(step) => {
                let state = match saga.status().await {
                    // Resumed after an approval: committed now, as the call would have been.
                    Some(_) if autocommit => match saga.commit().await {
                        Ok(report) if report.state == SagaState::Done => SagaState::Done,
                        Ok(report) => return rolled_back_result(&report),
                        Err(error) => return kernel_error_result(Some(&saga_id), &error),
                    },
                    Some(status) => status.state,
                    // Committed with the call (`Kernel::call_alone`).
                    None if autocommit => SagaState::Done,
                    // Ended meanwhile (another call of the saga failed, `saga_abort`, the
                    // idle timeout): as the log has it.
                    None => match self.kernel.log().saga(&saga_id).await {
                        Ok(Some(record)) => record.saga.state,
                        _ => SagaState::FailedRolledBack,
                    },
                };
                CallToolResult::structured(json!({
                    "saga_id": saga_id.as_str(),
                    "step": step.seq,
                    "tool": step.tool,
                    "status": step.status,
                    "output": step.output.map(|output| output.data),
                    "state": state,
                }))
            }
            CallAnswer::AwaitingApproval(request) => {
                self.watch_decision(&saga_id, &request);
                if autocommit {
                    // Kept open until `saga_resume`, which commits it once the step runs.
                    self.autocommit_waiting().insert(saga_id.clone());
                }
                awaiting_result(&saga_id, &request)
            }
            CallAnswer::Refused(problem) => {
                let (state, steps) =
                    Self::refused_call(saga, autocommit, "the call was refused").await;
                let kind = match problem.kind {
                    ProblemKind::Denied => "denied",
                    _ => "bad_input",
                };
                error_result(
                    Some(&saga_id),
                    Some(state),
                    kind,
                    &problem.to_string(),
                    &steps,
                )
            }
            CallAnswer::Conflict(conflict) => {
                let (state, steps) =
                    Self::refused_call(saga, autocommit, "the call met a conflict").await;
                let mut result = error_result(
                    Some(&saga_id),
                    Some(state),
                    "conflict",
                    &conflict.to_string(),
                    &steps,
                );
                if let Some(error) = result
                    .structured_content
                    .as_mut()
                    .and_then(|content| content.get_mut("error"))
                {
                    error["holder"] = json!({
                        "saga_id": conflict.holder.saga_id.as_str(),
                        "state": conflict.holder.state,
                        "alive": conflict.alive,
                        "resource": conflict.holder.resource,
                        "pid": conflict.holder.owner.pid,
                    });
                }
                result
            }
            CallAnswer::Denied(report) | CallAnswer::Failed(report) => rolled_back_result(&report),
            _ => error_result(
                Some(&saga_id),
                None,
                "operator",
                "an unexpected answer",
                &[],
            ),
        }
    }
}

impl ServerHandler for KernelServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(notify::capabilities())
            .with_server_info(Implementation::new(SERVER_NAME, env!("CARGO_PKG_VERSION")))
            .with_instructions({
                let mut instructions = INSTRUCTIONS.to_owned();
                instructions.push_str(match self.options.on_denied {
                    OnDenied::Refuse => " A call the sandbox or the transition table denies runs nothing and leaves the saga open.",
                    OnDenied::Rollback => " A call the sandbox or the transition table denies rolls the whole saga back.",
                });
                if let Some(files) = &self.options.files {
                    instructions.push(' ');
                    instructions.push_str(files);
                }
                if let Some(notice) = &self.options.notice {
                    instructions.push_str(" Note: ");
                    instructions.push_str(notice);
                }
                instructions
            })
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(self.tools()))
    }

    async fn on_custom_request(
        &self,
        request: CustomRequest,
        _context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, McpError> {
        Err(screen::custom_request_error(
            &request.method,
            request.params.as_ref(),
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        lock(&self.peer).get_or_insert_with(|| context.peer.clone());
        let arguments = request.arguments.unwrap_or_default();
        let name = request.name.as_ref();
        if name.starts_with("saga_")
            && [
                "saga_begin",
                "saga_commit",
                "saga_abort",
                "saga_resume",
                "saga_status",
            ]
            .contains(&name)
        {
            return self.saga_tool(name, &arguments).await;
        }
        let Some(id) = self.names.get(name).cloned() else {
            return Err(McpError::invalid_params(
                format!("unknown tool `{name}`"),
                None,
            ));
        };
        self.kernel_tool(&id, &arguments).await
    }
}

/// Serves `kernel` over stdio until end of input or SIGTERM, then rolls back every saga
/// still open (recording why) and returns. The upstream servers are asked for their tools
/// first (all at once), since a client lists the tools as soon as it connects; one that
/// cannot be used is left out.
///
/// # Errors
///
/// The transport's error when the client never initializes the session;
/// [`KernelError`] when the log fails while the open sagas are rolled back.
pub async fn serve_stdio(
    kernel: Arc<Kernel>,
    options: ServerOptions,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    kernel.load_all_tools().await;
    let server = KernelServer::new(Arc::clone(&kernel), options);
    let input = screen::screened(stdio::input());
    let running = server.serve((input, stdio::output())).await?;
    info!("MCP session initialized");
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let reason = tokio::select! {
        quit = running.waiting() => {
            info!(?quit, "the client closed the session");
            "end of input"
        }
        _ = terminate.recv() => "SIGTERM",
    };
    let open = kernel
        .abort_open_sagas(AbortCause::Shutdown, reason)
        .await?;
    if !open.is_empty() {
        info!(n_sagas = open.len(), reason, "open sagas rolled back");
    }
    Ok(())
}
