//! The saga engine's error type.

use std::fmt;

use agent_kernel_api::{Owner, SagaId, SagaState, TxError};
use agent_kernel_fsm::Denial;

/// One thing wrong with a plan (or a live saga's call), found before anything ran.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Problem {
    /// The step's index, from 0.
    pub step_idx: usize,
    /// The step's tool id.
    pub tool: String,
    /// What kind of problem.
    pub kind: ProblemKind,
    /// What is wrong, for a person.
    pub message: String,
}

/// The kind of a [`Problem`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ProblemKind {
    /// No tool with that id is registered.
    UnknownTool,
    /// The arguments fail the tool's schema.
    InvalidArgs,
    /// The sandbox policy forbids the call.
    Denied,
    /// The idempotency key is bound to other arguments, or repeated within the plan.
    KeyConflict,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "step {} (`{}`): {}",
            self.step_idx, self.tool, self.message
        )
    }
}

/// Why the kernel could not do what was asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KernelError {
    /// The plan was refused before anything ran; every problem found is listed.
    #[error("{}", preflight_message(.0))]
    Preflight(Vec<Problem>),
    /// The log failed.
    #[error(transparent)]
    Log(#[from] TxError),
    /// No saga with this id is in the log.
    #[error("no saga {0} in the log")]
    SagaNotFound(SagaId),
    /// The saga is still being run by a live process, so it must not be touched.
    #[error(
        "saga {saga_id} is {state} and owned by process {} on {} which is still running (or cannot be checked from here); it was not touched",
        .owner.pid, .owner.host
    )]
    SagaBusy {
        /// The saga.
        saga_id: SagaId,
        /// Its state.
        state: SagaState,
        /// The process that owns it.
        owner: Owner,
    },
    /// The FSM guardrail refused: to start the saga (`saga_id` is `None`, nothing was
    /// written), or to reopen a finished saga.
    #[error("{}{denial}", .saga_id.as_ref().map(|id| format!("saga {id}: ")).unwrap_or_default())]
    Denied {
        /// The saga, if one exists.
        saga_id: Option<SagaId>,
        /// The refusal, naming state, event and rule.
        denial: Denial,
    },
    /// The log failed while a saga ran (a full disk, an I/O error): the saga stopped at
    /// that point. What it began before is in the log, unfinished, for `recover` (once the
    /// log can be written again) to roll back; a step whose intent could not be written did
    /// not run.
    #[error(
        "saga {saga_id} stopped because the log failed ({source}); what it began is left for `agent-kernel recover` once the log can be written again"
    )]
    Interrupted {
        /// The saga.
        saga_id: SagaId,
        /// The log's error.
        source: TxError,
    },
    /// Another process took the saga over first.
    #[error("saga {0} was taken over by another process; it was not touched")]
    TakenOver(SagaId),
    /// The saga needs tools to be compensated that this program does not have (a custom tool
    /// of another program, a `tools.toml` entry since removed): it was left exactly as it
    /// was, for a program that has them.
    #[error(
        "saga {saga_id} cannot be compensated here: it needs {} that this program does not have; it was left as it is, for a program that has {}",
        tool_list(.tools), if .tools.len() == 1 { "it" } else { "them" }
    )]
    MissingTools {
        /// The saga.
        saga_id: SagaId,
        /// The tools it needs and this program lacks, sorted.
        tools: Vec<String>,
    },
    /// No live saga with this id is open in this process: it was never begun here, or it
    /// was committed, aborted or rolled back (its idle timeout, a failed call).
    #[error("no live saga {0} is open in this process (it was never begun here, or it has ended)")]
    SagaNotOpen(SagaId),
    /// This process already holds its most open live sagas (`[limits] open_sagas_max`).
    #[error(
        "this process already holds {max} open live sagas, the most `[limits] open_sagas_max` allows; commit or abort one first"
    )]
    TooManyOpenSagas {
        /// The bound.
        max: usize,
    },
    /// The kernel could not be set up as asked (a policy, FSM table, limits or tool set
    /// that cannot be used); nothing was opened or run.
    #[error("{0}")]
    Setup(String),
    /// A request the kernel cannot take as given (a label too long, say); nothing ran.
    #[error("{0}")]
    InvalidRequest(String),
    /// No approval request with this id is in the log.
    #[error("no approval request {0} in the log")]
    ApprovalNotFound(String),
    /// The request is no longer open to a decision; nothing was changed.
    #[error(
        "approval request {approval_id} is {status}: it can no longer be decided; nothing was changed"
    )]
    ApprovalClosed {
        /// The request.
        approval_id: String,
        /// Where it stands.
        status: agent_kernel_api::ApprovalStatus,
    },
    /// The process that held the request's live saga is gone: an approval would move
    /// nothing. `recover` rolls the saga back and voids the request.
    #[error(
        "approval request {approval_id} cannot be approved: the process that held the live saga {saga_id} is gone, so nothing would run its step; `agent-kernel recover` rolls the saga back; nothing was changed"
    )]
    HolderGone {
        /// The request.
        approval_id: String,
        /// Its saga.
        saga_id: SagaId,
    },
    /// `undo` refused: nothing was undone. `step` is the step that made it refuse, when one
    /// did.
    #[error(
        "undo of saga {saga_id} refused{}: {reason}; nothing was undone",
        .step.as_ref().map(|(seq, tool)| format!(" at step {seq} (`{tool}`)")).unwrap_or_default()
    )]
    UndoRefused {
        /// The saga.
        saga_id: SagaId,
        /// The step and its tool.
        step: Option<(u32, String)>,
        /// Why.
        reason: String,
    },
    /// Another saga that is not settled holds a resource this action would claim (an
    /// `undo` claims again what its saga's steps touched); nothing was done.
    #[error("conflict: {0}")]
    Conflict(Box<crate::conflict::Conflict>),
    /// No dead letter with this id is in the log.
    #[error("no dead letter {0} in the log")]
    DeadLetterNotFound(String),
    /// The dead letter was already settled; nothing was changed.
    #[error("dead letter {letter_id} is {status}: it is no longer open; nothing was changed")]
    DeadLetterClosed {
        /// The letter.
        letter_id: String,
        /// Where it stands.
        status: agent_kernel_api::DeadLetterStatus,
    },
    /// The request was asked under a policy that names an operator key, and no key was
    /// given; nothing was changed.
    #[error(
        "approval request {0} needs the operator key its policy names: pass it with --operator-key-file FILE; nothing was changed"
    )]
    OperatorKeyRequired(String),
    /// The key given is not the one the request names; nothing was changed.
    #[error(
        "the key given is not the operator key approval request {0} needs; nothing was changed"
    )]
    OperatorKeyMismatch(String),
    /// The saga does not wait for an approval, and has not finished either.
    #[error("saga {saga_id} is {state}, not waiting for an approval; nothing was done")]
    NotAwaitingApproval {
        /// The saga.
        saga_id: SagaId,
        /// Its state.
        state: SagaState,
    },
    /// The log failed its audit check, so its undo records cannot be trusted: nothing was
    /// undone (an operator action that compensates checks the chain first).
    #[error("the log failed its audit check {}: {reason}", if *seq == 0 { "on its schema".to_owned() } else { format!("at record {seq}") })]
    Tampered {
        /// The first bad record (0: the schema).
        seq: u64,
        /// What is wrong with it.
        reason: String,
    },
    /// The log holds a saga the kernel cannot make sense of.
    #[error("saga {saga_id}: {reason}")]
    Inconsistent {
        /// The saga.
        saga_id: SagaId,
        /// What is wrong.
        reason: String,
    },
}

/// "the tool `a`" or "the tools `a`, `b`".
pub(crate) fn tool_list(tools: &[String]) -> String {
    let quoted: Vec<String> = tools.iter().map(|tool| format!("`{tool}`")).collect();
    match quoted.len() {
        1 => format!("the tool {}", quoted[0]),
        _ => format!("the tools {}", quoted.join(", ")),
    }
}

fn preflight_message(problems: &[Problem]) -> String {
    let mut message = format!(
        "the plan was refused before anything ran ({} problem{}):",
        problems.len(),
        if problems.len() == 1 { "" } else { "s" }
    );
    for problem in problems {
        message.push_str("\n  ");
        message.push_str(&problem.to_string());
    }
    message
}

impl KernelError {
    /// Whether the error is bad input (a usage error, an invalid plan): nothing ran.
    pub fn is_bad_input(&self) -> bool {
        match self {
            KernelError::Preflight(problems) => problems
                .iter()
                .any(|problem| problem.kind != ProblemKind::Denied),
            KernelError::SagaNotFound(_)
            | KernelError::SagaBusy { .. }
            | KernelError::TakenOver(_)
            | KernelError::SagaNotOpen(_)
            | KernelError::TooManyOpenSagas { .. }
            | KernelError::InvalidRequest(_)
            | KernelError::ApprovalNotFound(_)
            | KernelError::DeadLetterNotFound(_)
            | KernelError::NotAwaitingApproval { .. }
            | KernelError::Setup(_) => true,
            KernelError::Log(TxError::NotALog { .. } | TxError::SchemaTooNew { .. }) => true,
            _ => false,
        }
    }

    /// Whether another saga's lock refused the action ([`KernelError::Conflict`]).
    pub fn is_conflict(&self) -> bool {
        matches!(self, KernelError::Conflict(_))
    }

    /// Whether the sandbox denied the plan (and nothing else was wrong with it), or the FSM
    /// refused.
    pub fn is_denied(&self) -> bool {
        match self {
            KernelError::Preflight(problems) => {
                !problems.is_empty() && problems.iter().all(|p| p.kind == ProblemKind::Denied)
            }
            KernelError::Denied { .. }
            | KernelError::UndoRefused { .. }
            | KernelError::OperatorKeyRequired(_)
            | KernelError::OperatorKeyMismatch(_)
            | KernelError::ApprovalClosed { .. }
            | KernelError::HolderGone { .. }
            | KernelError::DeadLetterClosed { .. } => true,
            KernelError::Log(TxError::ApprovalUnusable { .. }) => true,
            _ => false,
        }
    }
}
