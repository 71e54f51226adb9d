//! The kernel: what every saga shares (the log, the tools, the FSM table, the injected
//! environment), the checks of a plan before it runs, and the audit of operator commands.
//! The step path is in `step.rs`, plans in `plan.rs`, compensation in `compensation.rs`,
//! recovery and rollback in `recovery.rs`.

use std::collections::HashMap;
use std::sync::Arc;

use agent_kernel_api::{
    AuditEvent, Clock, Durability, DynTool, Files, IdSource, LogWrite, NewSaga, NoFiles,
    OperatorCommand, Owner, Plan, PlanStep, SagaId, SagaState, ToolContext, ToolError, TxError,
    TxLog,
};
use serde_json::Value;
use sha2::{Digest, Sha256};

use agent_kernel_dispatcher::Dispatcher;
use agent_kernel_fsm::Guardrail;

use crate::owner::LivenessProbe;
use crate::{KernelError, Problem, ProblemKind};

/// What the kernel needs from the outside world, injected.
#[derive(Clone)]
pub struct Environment {
    /// The clock (used by the log; kept here so one place wires time).
    pub clock: Arc<dyn Clock>,
    /// Where saga ids come from.
    pub ids: Arc<dyn IdSource>,
    /// The process the kernel runs in, recorded as the owner of its sagas.
    pub owner: Owner,
    /// Decides whether another saga's owner is alive.
    pub liveness: Arc<dyn LivenessProbe>,
}

/// The saga engine.
///
/// It runs plans as sagas: for each step it makes the intent durable in the log (with what
/// compensation needs), runs the tool, and records the outcome; on failure it compensates
/// the steps that ran, last first. It also rolls back single sagas on request and recovers
/// sagas left unfinished by dead processes.
pub struct Kernel {
    pub(crate) log: Arc<dyn TxLog>,
    pub(crate) tools: Arc<Dispatcher>,
    pub(crate) fsm: Arc<Guardrail>,
    pub(crate) env: Environment,
    pub(crate) durability: Durability,
    /// The user recorded with operator commands.
    uid: Option<u32>,
    /// Options recorded with operator commands.
    operator_options: Vec<String>,
    /// The live sagas this process holds open.
    pub(crate) live: crate::live_registry::LiveRegistry,
    /// Which steps wait for an operator's approval, and for how long.
    pub(crate) approvals: crate::approval_policy::ApprovalPolicy,
    /// The file access every tool's context carries.
    files: Arc<dyn Files>,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernel")
            .field("tools", &self.tools)
            .field("owner", &self.env.owner)
            .field("durability", &self.durability)
            .finish_non_exhaustive()
    }
}

/// The hash an idempotency key is bound to: SHA-256 over the tool id and the canonical
/// JSON of the arguments (object keys sorted, no insignificant whitespace).
pub fn args_hash(tool_id: &str, args: &Value) -> String {
    let mut hasher = Sha256::new();
    hasher.update(tool_id.as_bytes());
    hasher.update([0]);
    // serde_json's map is ordered by key, so this serialization is canonical.
    hasher.update(args.to_string().as_bytes());
    hasher
        .finalize()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// A refused check's kind: a denial by the sandbox, or invalid arguments.
fn problem_kind(error: &agent_kernel_api::ToolError) -> ProblemKind {
    if error.is_denied() {
        ProblemKind::Denied
    } else {
        ProblemKind::InvalidArgs
    }
}

/// The output hint by which a tool asks for validation next (spec §3.2).
pub const VALIDATE_HINT: &str = "validate";

impl Kernel {
    /// A kernel over `log` running the tools of `tools` (through its checks and bounds),
    /// guarded by `fsm`.
    pub fn new(
        log: Arc<dyn TxLog>,
        tools: Arc<Dispatcher>,
        fsm: Arc<Guardrail>,
        env: Environment,
        durability: Durability,
    ) -> Self {
        Self {
            log,
            tools,
            fsm,
            env,
            durability,
            uid: None,
            operator_options: Vec::new(),
            live: crate::live_registry::LiveRegistry::default(),
            approvals: crate::approval_policy::ApprovalPolicy::default(),
            files: Arc::new(NoFiles::new(".")),
        }
    }

    /// The kernel handing `files` to every tool in its [`ToolContext`]: the sandbox and
    /// folder a tool of the program's own reaches files through (none by default; the front
    /// door's builder gives the policy's sandbox).
    #[must_use]
    pub fn with_files(mut self, files: Arc<dyn Files>) -> Self {
        self.files = files;
        self
    }

    /// The upstream servers asked for their tools whose tools cannot be used, each with
    /// why (a server is asked only when one of its tools is first needed, or by
    /// [`Kernel::load_all_tools`]).
    pub fn unavailable_servers(&self) -> Vec<(String, String)> {
        self.tools.unavailable()
    }

    /// Asks every upstream server not yet asked for its tools (starting them, all at once),
    /// so that [`Kernel::tool_ids`] lists them: for listings (`tools`, an MCP client's
    /// `tools/list`). A server that cannot be used is then in
    /// [`Kernel::unavailable_servers`].
    pub async fn load_all_tools(&self) {
        self.tools.load_all().await;
    }

    /// The kernel with `policy` deciding which steps wait for an operator's approval
    /// (reference §10): those of irreversible tools always, and those `[approval] require`
    /// names.
    #[must_use]
    pub fn with_approval_policy(mut self, policy: crate::approval_policy::ApprovalPolicy) -> Self {
        self.approvals = policy;
        self
    }

    /// Which steps wait for an operator's approval.
    pub fn approval_policy(&self) -> &crate::approval_policy::ApprovalPolicy {
        &self.approvals
    }

    /// The user recorded with operator commands and decisions.
    pub fn operator_uid(&self) -> Option<u32> {
        self.uid
    }

    /// The kernel recording `uid` as the user of operator commands and decisions (the front
    /// door's builder records this process's real user id; none by default).
    #[must_use]
    pub fn with_operator_uid(mut self, uid: Option<u32>) -> Self {
        self.uid = uid;
        self
    }

    /// The options that changed how the operator command at hand was carried out (for
    /// example `--skip-verify`); [`Kernel::rollback`] and [`Kernel::recover`] record them
    /// in the audit chain with the command.
    #[must_use]
    pub fn with_operator_options(mut self, options: Vec<String>) -> Self {
        self.operator_options = options;
        self
    }

    /// Records an operator command in the audit chain, before it acts.
    pub(crate) async fn record_operator_command(
        &self,
        command: &str,
        saga_id: Option<&SagaId>,
    ) -> Result<(), KernelError> {
        self.record_operator_command_with(command, saga_id, Vec::new())
            .await
    }

    /// [`Kernel::record_operator_command`], with `extra` options of the command itself
    /// (`undo`'s reason) after those of the command line.
    pub(crate) async fn record_operator_command_with(
        &self,
        command: &str,
        saga_id: Option<&SagaId>,
        extra: Vec<String>,
    ) -> Result<(), KernelError> {
        let mut options = self.operator_options.clone();
        options.extend(extra);
        let event = AuditEvent::Operator(OperatorCommand {
            command: command.to_owned(),
            saga_id: saga_id.cloned(),
            options,
            by: self.env.owner.clone(),
            uid: self.uid,
        });
        Ok(self.audit(event).await?)
    }

    /// Writes an event to the audit chain alone.
    pub(crate) async fn audit(&self, event: AuditEvent) -> Result<(), TxError> {
        self.log
            .write(vec![LogWrite::Audit(event)])
            .await
            .map(|_| ())
    }

    /// The record that creates a saga (its first write carries it).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new_saga_record(
        &self,
        saga_id: &SagaId,
        name: Option<String>,
        actor: Option<String>,
        n_steps: u32,
        state: SagaState,
        dry_run: bool,
        require_actor_idle: bool,
    ) -> NewSaga {
        NewSaga {
            saga_id: saga_id.clone(),
            name,
            actor,
            owner: self.env.owner.clone(),
            n_steps,
            state,
            dry_run,
            require_actor_idle,
        }
    }

    /// The log.
    pub fn log(&self) -> &Arc<dyn TxLog> {
        &self.log
    }

    /// The time now by the kernel's clock, in milliseconds since the Unix epoch.
    pub fn now_ms(&self) -> i64 {
        self.env.clock.now_ms()
    }

    /// The process this kernel records as the owner of the sagas it begins.
    pub fn owner(&self) -> &Owner {
        &self.env.owner
    }

    /// Checks every step of `plan` (known tool, valid arguments, policy, idempotency keys)
    /// without running anything.
    ///
    /// # Errors
    ///
    /// [`KernelError::Preflight`] listing every problem found; [`KernelError::Log`] when the
    /// log cannot be read.
    pub async fn preflight(&self, plan: &Plan) -> Result<(), KernelError> {
        let mut problems = Vec::new();
        let mut keys_seen: HashMap<&str, usize> = HashMap::new();
        for (step_idx, step) in plan.steps.iter().enumerate() {
            // A tool of an upstream server is known once the server is asked.
            let _ = self.tools.load(&step.tool).await;
            let repeated_key = step.idempotency_key.as_deref().and_then(|key| {
                keys_seen
                    .insert(key, step_idx)
                    .map(|first_idx| (key, first_idx))
            });
            let Some((key, first_idx)) =
                repeated_key.filter(|_| self.tools.get(&step.tool).is_some())
            else {
                problems.extend(self.check_step(step_idx, step).await?);
                continue;
            };
            // A key repeated within the plan: its binding in the log is not looked up.
            if let Err(error) = self.tools.check(&step.tool, &step.args) {
                problems.push(Problem {
                    step_idx,
                    tool: step.tool.clone(),
                    kind: problem_kind(&error),
                    message: error.to_string(),
                });
            }
            problems.push(Problem {
                step_idx,
                tool: step.tool.clone(),
                kind: ProblemKind::KeyConflict,
                message: format!("idempotency key `{key}` is also used by step {first_idx}"),
            });
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(KernelError::Preflight(problems))
        }
    }

    /// What is wrong with one step, checked without running anything: the tool is known,
    /// the arguments satisfy its schema and its own check (the sandbox's ruling included),
    /// and its idempotency key, if any, is not bound to other arguments.
    ///
    /// # Errors
    ///
    /// [`KernelError::Log`] when the log cannot be read.
    pub(crate) async fn check_step(
        &self,
        step_idx: usize,
        step: &PlanStep,
    ) -> Result<Vec<Problem>, KernelError> {
        Ok(self.checked_step(step_idx, step).await?.problems)
    }

    /// [`check_step`](Self::check_step), keeping the tool's own error when its check
    /// denied the step: a live call rolls back with that very error.
    ///
    /// # Errors
    ///
    /// [`KernelError::Log`] when the log cannot be read.
    pub(crate) async fn checked_step(
        &self,
        step_idx: usize,
        step: &PlanStep,
    ) -> Result<CheckedStep, KernelError> {
        let problem = |kind, message: String| Problem {
            step_idx,
            tool: step.tool.clone(),
            kind,
            message,
        };
        if let Err(reason) = self.tools.load(&step.tool).await {
            let server = self.tools.source_of(&step.tool).unwrap_or_default();
            return Ok(CheckedStep::refused(problem(
                ProblemKind::UnknownTool,
                format!(
                    "a tool of the upstream MCP server `{server}`, which is unavailable: {reason}"
                ),
            )));
        }
        if self.tools.get(&step.tool).is_none() {
            return Ok(CheckedStep::refused(problem(
                ProblemKind::UnknownTool,
                format!(
                    "unknown tool (known tools: {})",
                    self.tools.ids().join(", ")
                ),
            )));
        }
        let mut problems = Vec::new();
        let mut denial = None;
        if let Err(error) = self.tools.check(&step.tool, &step.args) {
            problems.push(problem(problem_kind(&error), error.to_string()));
            denial = error.is_denied().then_some(error);
        }
        if let Some(key) = &step.idempotency_key
            && let Some(binding) = self.log.key_binding(key).await?
            && binding.args_hash != args_hash(&step.tool, &step.args)
        {
            problems.push(problem(
                ProblemKind::KeyConflict,
                format!(
                    "idempotency key `{key}` is bound to other arguments (first used by saga {} step {})",
                    binding.saga_id, binding.step_seq
                ),
            ));
        }
        Ok(CheckedStep { problems, denial })
    }

    pub(crate) fn context(
        &self,
        saga_id: &SagaId,
        step_seq: u32,
        tool_id: &str,
        key: Option<&str>,
        actor: Option<&str>,
    ) -> ToolContext {
        ToolContext {
            saga_id: saga_id.clone(),
            step_seq,
            tool_id: tool_id.to_owned(),
            idempotency_key: key.map(str::to_owned),
            actor: actor.map(str::to_owned),
            durability: self.durability,
            files: Arc::clone(&self.files),
        }
    }

    /// The ids of every registered tool, sorted: an upstream server's tools once it has
    /// been asked for them (see [`Kernel::load_all_tools`]).
    pub fn tool_ids(&self) -> Vec<String> {
        self.tools.ids()
    }

    /// The tool registered under `id` (an upstream server's once it has been asked).
    pub fn tool(&self, id: &str) -> Option<Arc<dyn DynTool>> {
        self.tools.get(id)
    }
}

/// What [`Kernel::checked_step`] found: the step's problems, and the tool's own error when
/// its check denied the step.
pub(crate) struct CheckedStep {
    pub(crate) problems: Vec<Problem>,
    pub(crate) denial: Option<ToolError>,
}

impl CheckedStep {
    fn refused(problem: Problem) -> CheckedStep {
        CheckedStep {
            problems: vec![problem],
            denial: None,
        }
    }
}
