//! Saga ids, saga states, step statuses and durability modes: the names the contract fixes.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The identity of one saga (one plan run), unique within a log.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SagaId(String);

impl SagaId {
    /// Wraps an id produced by an [`IdSource`](crate::IdSource) or read from the log.
    ///
    /// # Panics
    ///
    /// Panics if `id` is empty: an empty id is a bug in the id source.
    pub fn new(id: impl Into<String>) -> Self {
        let id = id.into();
        assert!(!id.is_empty(), "saga id must not be empty");
        Self(id)
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SagaId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where a saga stands. The names are part of the external contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SagaState {
    /// No saga activity yet.
    Idle,
    /// The plan is being checked; nothing has run.
    Planning,
    /// Steps with effects are running.
    Acting,
    /// A validation step is checking the effects so far.
    Validating,
    /// Committed steps are being compensated, last first.
    Compensating,
    /// Every step committed. Terminal: recovery never touches it.
    Done,
    /// The saga failed and every committed step was compensated. Terminal.
    FailedRolledBack,
    /// A compensation failed: an operator must look. Terminal.
    FailedRollbackPartial,
    /// A step needs an operator's approval before anything of it runs; the saga waits for
    /// the decision (reference §10).
    AwaitingApproval,
    /// A `Done` saga whose steps an operator undid (`agent-kernel undo`). Terminal.
    Undone,
}

impl SagaState {
    /// Every state, in the order of the contract.
    pub const ALL: [SagaState; 10] = [
        SagaState::Idle,
        SagaState::Planning,
        SagaState::Acting,
        SagaState::Validating,
        SagaState::Compensating,
        SagaState::Done,
        SagaState::FailedRolledBack,
        SagaState::FailedRollbackPartial,
        SagaState::AwaitingApproval,
        SagaState::Undone,
    ];

    /// The contract's name of the state.
    pub fn as_str(self) -> &'static str {
        match self {
            SagaState::Idle => "Idle",
            SagaState::Planning => "Planning",
            SagaState::Acting => "Acting",
            SagaState::Validating => "Validating",
            SagaState::Compensating => "Compensating",
            SagaState::Done => "Done",
            SagaState::FailedRolledBack => "FailedRolledBack",
            SagaState::FailedRollbackPartial => "FailedRollbackPartial",
            SagaState::AwaitingApproval => "AwaitingApproval",
            SagaState::Undone => "Undone",
        }
    }

    /// Whether the saga has ended (`Done`, `FailedRolledBack`, `FailedRollbackPartial`,
    /// `Undone`): no step runs in it again, and recovery never touches it. Only an
    /// operator's explicit command moves a terminal saga on (`undo` of a `Done` saga).
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            SagaState::Done
                | SagaState::FailedRolledBack
                | SagaState::FailedRollbackPartial
                | SagaState::Undone
        )
    }
}

impl fmt::Display for SagaState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SagaState {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SagaState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| format!("unknown saga state `{s}`"))
    }
}

/// Where one step stands. The names are part of the external contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum StepStatus {
    /// The intent is durable; the outcome is not yet known (in doubt after a crash).
    #[serde(rename = "BEGIN")]
    Begin,
    /// The effect happened and its output is recorded.
    #[serde(rename = "COMMIT")]
    Commit,
    /// The tool reported an error.
    #[serde(rename = "FAIL")]
    Fail,
    /// The step's effect was undone (or never happened and compensation confirmed it).
    #[serde(rename = "COMPENSATED")]
    Compensated,
    /// Compensation was attempted and failed: the effect may still be in place.
    #[serde(rename = "COMPENSATION_FAILED")]
    CompensationFailed,
}

impl StepStatus {
    /// Every status, in the order of the contract.
    pub const ALL: [StepStatus; 5] = [
        StepStatus::Begin,
        StepStatus::Commit,
        StepStatus::Fail,
        StepStatus::Compensated,
        StepStatus::CompensationFailed,
    ];

    /// The contract's name of the status.
    pub fn as_str(self) -> &'static str {
        match self {
            StepStatus::Begin => "BEGIN",
            StepStatus::Commit => "COMMIT",
            StepStatus::Fail => "FAIL",
            StepStatus::Compensated => "COMPENSATED",
            StepStatus::CompensationFailed => "COMPENSATION_FAILED",
        }
    }
}

impl fmt::Display for StepStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for StepStatus {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        StepStatus::ALL
            .into_iter()
            .find(|status| status.as_str() == s)
            .ok_or_else(|| format!("unknown step status `{s}`"))
    }
}

/// How hard the kernel works to make records and effects survive failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// Survives power loss: the log is synced to disk before an effect runs and before
    /// `Done` is reported, and file tools sync what they write. The default.
    #[default]
    Full,
    /// Survives a crash of the process, not of the machine: writes reach the operating
    /// system but are not synced. Opt-in, for speed.
    Normal,
}

impl Durability {
    /// The name used on the command line and in the log.
    pub fn as_str(self) -> &'static str {
        match self {
            Durability::Full => "full",
            Durability::Normal => "normal",
        }
    }

    /// Whether writes must be synced to stable storage.
    pub fn syncs(self) -> bool {
        matches!(self, Durability::Full)
    }
}

impl fmt::Display for Durability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Durability {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "full" => Ok(Durability::Full),
            "normal" => Ok(Durability::Normal),
            other => Err(format!(
                "unknown durability `{other}` (expected `full` or `normal`)"
            )),
        }
    }
}

/// What a live saga does with a call the sandbox or the FSM denies.
///
/// The library's live sagas roll back ([`OnDenied::Rollback`], as a plan does); the MCP
/// server refuses by default (`sandbox.toml` `[mcp] on_denied`), so that an agent's mistaken
/// read does not undo its earlier writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnDenied {
    /// The call is refused as bad input is: nothing of it runs, the denial is in the audit
    /// chain, and the saga stays open.
    Refuse,
    /// The saga is rolled back, with the step recorded as denied.
    #[default]
    Rollback,
}

impl OnDenied {
    /// The name used in `sandbox.toml`.
    pub fn as_str(self) -> &'static str {
        match self {
            OnDenied::Refuse => "refuse",
            OnDenied::Rollback => "rollback",
        }
    }
}

impl fmt::Display for OnDenied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for state in SagaState::ALL {
            assert_eq!(state.as_str().parse::<SagaState>(), Ok(state));
            assert_eq!(
                serde_json::to_value(state).expect("serializes"),
                serde_json::Value::String(state.as_str().to_owned())
            );
        }
        for status in StepStatus::ALL {
            assert_eq!(status.as_str().parse::<StepStatus>(), Ok(status));
            assert_eq!(
                serde_json::to_value(status).expect("serializes"),
                serde_json::Value::String(status.as_str().to_owned())
            );
        }
    }

    #[test]
    fn only_the_end_states_are_terminal() {
        let terminal: Vec<_> = SagaState::ALL
            .into_iter()
            .filter(|s| s.is_terminal())
            .collect();
        assert_eq!(
            terminal,
            [
                SagaState::Done,
                SagaState::FailedRolledBack,
                SagaState::FailedRollbackPartial,
                SagaState::Undone
            ]
        );
    }
}
