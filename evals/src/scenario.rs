//! The scenarios: what each one sets up, which calls it makes, how it is driven, and what the
//! world must look like at its end. Everything here is data, generated from one seed.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The kinds of trouble the suite puts a chain of tool calls through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Kind {
    /// A tool fails mid-chain (an error, a panic, a failed validation).
    ToolFailure,
    /// The process is SIGKILLed at a log boundary of the saga.
    Crash,
    /// A prompt-injected path or URL (traversal, symlinks, SSRF, redirects).
    Injection,
    /// The same call is delivered twice.
    Duplicate,
    /// A step's outcome is unknown: a timeout, or a crash between the effect and its record.
    UnknownOutcome,
    /// A step needs an operator's approval.
    Approval,
    /// An upstream MCP server fails.
    Upstream,
    /// The process is SIGKILLed during a rollback, between two compensations of steps on
    /// the same files, then `recover` is SIGKILLed between two of its own.
    RollbackKill,
    /// The process is SIGKILLed, then a later writer changes a file the chain wrote
    /// before anyone recovers: what it wrote must stay.
    LaterWriter,
    /// A command tool's program outlives the process that ran it, and would act late.
    SlowCommand,
    /// Two agents read and then write the same file or account, their calls interleaved;
    /// one may fail, or be SIGKILLed holding what it wrote.
    Isolation,
    /// After a restart, an agent makes a payment again with other words in its memo.
    Regenerated,
}

impl Kind {
    /// Every kind, in the order of the tables.
    pub(crate) const ALL: [Kind; 12] = [
        Kind::ToolFailure,
        Kind::Crash,
        Kind::Injection,
        Kind::Duplicate,
        Kind::UnknownOutcome,
        Kind::Approval,
        Kind::Upstream,
        Kind::RollbackKill,
        Kind::LaterWriter,
        Kind::SlowCommand,
        Kind::Isolation,
        Kind::Regenerated,
    ];

    /// The name in ids, JSON and tables.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::ToolFailure => "tool_failure",
            Kind::Crash => "crash",
            Kind::Injection => "injection",
            Kind::Duplicate => "duplicate",
            Kind::UnknownOutcome => "unknown_outcome",
            Kind::Approval => "approval",
            Kind::Upstream => "upstream",
            Kind::RollbackKill => "rollback_kill",
            Kind::LaterWriter => "later_writer",
            Kind::SlowCommand => "slow_command",
            Kind::Isolation => "isolation",
            Kind::Regenerated => "regenerated",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One tool call, as an agent would make it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Call {
    /// The tool id.
    pub(crate) tool: String,
    /// Its arguments.
    pub(crate) args: Value,
    /// The idempotency key, if the agent gives one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) key: Option<String>,
}

impl Call {
    pub(crate) fn new(tool: &str, args: Value) -> Call {
        Call {
            tool: tool.to_owned(),
            args,
            key: None,
        }
    }

    pub(crate) fn keyed(mut self, key: String) -> Call {
        self.key = Some(key);
        self
    }
}

/// What a path holds (before the scenario starts, or in the world read back).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) enum Setup {
    /// A file with these bytes (written as text when they are UTF-8).
    File(#[serde(with = "bytes_as_text")] Vec<u8>),
    /// A symbolic link to this target (relative to the link's folder).
    Link(String),
}

/// Where a crash lands: counted in the log writes (transactions) of the saga, from 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum KillPoint {
    /// Before write `n` is applied: what ran since write `n - 1` (an effect, if `n` is a
    /// step's outcome) has happened, and the log does not know it.
    BeforeWrite(u32),
    /// Just after write `n` is durable (a step's BEGIN: its intent is logged, its effect has
    /// not run; the saga's last write: it is `Done`).
    AfterWrite(u32),
}

impl KillPoint {
    /// How many of a chain's effects have happened at this point, for a chain of mutating
    /// steps whose writes are the saga's creation, then each step's BEGIN and outcome, then
    /// its end (the model `generate::expected_writes` states).
    pub(crate) fn effects_done(self, n_steps: u32) -> u32 {
        // Write 2j - 1 is step j's BEGIN and write 2j its outcome: before the outcome (and
        // after it) the effect has run; before and after the BEGIN, j - 1 effects have.
        let (KillPoint::BeforeWrite(w) | KillPoint::AfterWrite(w)) = self;
        (w / 2).min(n_steps)
    }
}

impl fmt::Display for KillPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KillPoint::BeforeWrite(w) => write!(f, "before log write {w}"),
            KillPoint::AfterWrite(w) => write!(f, "after log write {w}"),
        }
    }
}

/// How an operator answers an approval request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Decision {
    /// `agent-kernel approve`.
    Approve,
    /// `agent-kernel reject`.
    Reject,
    /// Nobody answers before the request expires.
    Expire,
    /// Someone with write access to the log sets the request `approved` by hand.
    Forge,
    /// The request is approved, then its arguments are edited in the log to aim elsewhere.
    SwapArgs,
    /// A careful operator reads the request (`approvals --show ID --json`) and approves it
    /// only if the arguments shown climb out of no folder (`/../`) and hide no character;
    /// else rejects it. The view decides: one that cut or hid what runs would be approved.
    Inspect,
    /// An operator reads the request and rejects it when it shows an earlier call it may
    /// repeat whose effect stands (`duplicate_of` with the status `COMMIT` or `BEGIN`);
    /// else approves it.
    Duplicate,
}

/// How a duplicate delivery happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Redelivery {
    /// The chain is delivered again after the first delivery finished.
    Sequential,
    /// Each call is delivered twice in a row (a retry after a lost answer).
    Retry,
    /// Two deliveries race, from two tasks.
    Concurrent,
    /// The first delivery's process is killed at this point, then the chain is delivered
    /// again (after `recover`, for the kernel).
    AfterCrash(KillPoint),
}

/// Who changes a file after the chain's process died and before anyone recovers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Writer {
    /// A person (or another program) writes the file directly.
    Person,
    /// A later saga writes it through the kernel (`agent-kernel run`) and is `Done`; the
    /// baseline, which has no kernel, writes it directly.
    Saga,
}

/// How the calls are driven.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) enum Drive {
    /// In order; the saga commits after the last.
    Chain,
    /// In order, each call bounded by this timeout (the kernel: the policy's limit for the
    /// tool; the baseline: the agent's own timeout around the call).
    Timeout {
        /// The tool the limit is for.
        tool: String,
        /// The bound.
        timeout_ms: u64,
    },
    /// In a child process SIGKILLed at `point` (for the kernel, `recover` runs after).
    Crash(KillPoint),
    /// As `Crash(first)`; then, for the kernel, a first `recover` in a child process
    /// SIGKILLed at `recovery` (counted in its own log writes), then `recover` again.
    CrashRecovery {
        /// Where the saga's process dies.
        first: KillPoint,
        /// Where the first recovery's process dies.
        recovery: KillPoint,
    },
    /// As `Crash(first)`; then the scenario's `later_write` is made by `by` before
    /// `recover` (the kernel) or nothing (the baseline).
    LaterWrite {
        /// Where the saga's process dies.
        first: KillPoint,
        /// Who writes.
        by: Writer,
    },
    /// In a child process that a command tool's program SIGKILLs as it starts, before it
    /// makes its effect late ([`SLOW_EFFECT_MS`] after it started); for the kernel,
    /// `recover` runs after. The world is read once that delay has passed.
    SlowCommand,
    /// Delivered twice.
    Twice(Redelivery),
    /// The scenario's agents, each a saga of its own, their turns taken in this order
    /// (an agent's index per turn: its next call, or its commit after its last call). An
    /// agent whose call meets a conflict rolls its saga back and runs its calls again once
    /// the others are over. With `victim`, agent 0 runs first, alone, in a child process
    /// SIGKILLed at that point; the others' turns follow.
    Agents {
        /// The turns.
        schedule: Vec<usize>,
        /// Where agent 0's process dies, if it does.
        victim: Option<KillPoint>,
    },
    /// The chain (`calls`) runs, in a child process SIGKILLed at `first` if given (then
    /// `recover`, for the kernel); then the agent, restarted, sends its regenerated calls
    /// (`agents[0]`) as a new saga, and an operator answers approvals with
    /// [`Decision::Duplicate`].
    Regenerate {
        /// Where the first chain's process dies, if it does.
        first: Option<KillPoint>,
    },
    /// The call at this index needs an approval, answered so.
    Approval {
        /// The index of the guarded call.
        call: usize,
        /// The answer.
        decision: Decision,
    },
}

/// How long the slow command tool's program waits before it makes its effect.
pub(crate) const SLOW_EFFECT_MS: u64 = 600;

/// What the world must be at the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Must {
    /// As it was before: the chain could not complete, so none of it may stay.
    Unchanged,
    /// As if every call took effect exactly once.
    Complete,
    /// One or the other, never a mix; for the kernel, `Complete` exactly when the saga is
    /// `Done`.
    Atomic,
}

/// One scenario.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Scenario {
    /// `kind-NNN`.
    pub(crate) id: String,
    /// Its kind.
    pub(crate) kind: Kind,
    /// What exactly happens, for a person.
    pub(crate) variant: String,
    /// The seed it was generated from.
    pub(crate) seed: u64,
    /// The paths (relative to the scenario's folder) and what they hold before.
    pub(crate) setup: BTreeMap<String, Setup>,
    /// The calls, in order.
    pub(crate) calls: Vec<Call>,
    /// Lines added to the kernel's `sandbox.toml` (limits, approvals).
    pub(crate) policy_extra: String,
    /// Whether the upstream MCP server is declared in `tools.toml`.
    pub(crate) upstream: bool,
    /// How the calls are driven.
    pub(crate) drive: Drive,
    /// What the world must end as.
    pub(crate) must: Must,
    /// The index of the call that must never take effect (an injected path or URL, a step
    /// whose approval was not given), if any; the model of the complete world leaves it out.
    pub(crate) attack: Option<usize>,
    /// Paths that must keep their bytes whatever happens (besides everything in `outside/`).
    pub(crate) forbidden: Vec<String>,
    /// The call at which the kernel must end the saga (the failing, injected, hung or
    /// unapproved one), if the scenario has one: a kernel that stopped earlier, refusing a
    /// harmless call, would leave the world unchanged too, and must not pass for it.
    pub(crate) stops_at: Option<usize>,
    /// For a crash: the log writes a run of the chain without a kill makes, which the kill
    /// points were made from and the calibration run checks.
    pub(crate) writes: Option<u32>,
    /// For a crash of a recovery: the log writes that recovery makes without a kill.
    pub(crate) recovery_writes: Option<u32>,
    /// A later writer's change (path, content), made after the chain's process died: the
    /// world must keep it, whatever the chain needs undone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) later_write: Option<(String, String)>,
    /// Whether the scenario's command tools are declared in `tools.toml`.
    #[serde(default)]
    pub(crate) commands: bool,
    /// The agents of [`Drive::Agents`] (each one's calls), or the regenerated calls of
    /// [`Drive::Regenerate`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) agents: Vec<Vec<Call>>,
}

impl Scenario {
    /// Whether the side's kernel reads `tools.toml` (an upstream server, or command tools).
    pub(crate) fn tools_file(&self) -> bool {
        self.upstream || self.commands
    }

    /// Whether a kill at `point` lands after the saga's last write (it is `Done`), by the
    /// writes the scenario states its chain makes.
    pub(crate) fn killed_after_done(&self, point: KillPoint) -> bool {
        self.writes
            .is_some_and(|writes| point == KillPoint::AfterWrite(writes - 1))
    }

    /// The first agent of [`Drive::Agents`] the schedule drives: 1 when agent 0 is a victim
    /// that ran alone first, else 0.
    pub(crate) fn first_driven_agent(&self) -> usize {
        usize::from(matches!(
            self.drive,
            Drive::Agents {
                victim: Some(_),
                ..
            }
        ))
    }
}

/// File bytes in JSON: a string when they are UTF-8 (every file the scenarios write), else
/// the array of bytes.
mod bytes_as_text {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    #[serde(untagged)]
    enum Form {
        Text(String),
        Bytes(Vec<u8>),
    }

    pub(super) fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        match std::str::from_utf8(bytes) {
            Ok(text) => serializer.serialize_str(text),
            Err(_) => bytes.serialize(serializer),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<u8>, D::Error> {
        Ok(match Form::deserialize(deserializer)? {
            Form::Text(text) => text.into_bytes(),
            Form::Bytes(bytes) => bytes,
        })
    }
}
