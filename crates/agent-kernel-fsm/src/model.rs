//! Events, guards, facts and transitions: the vocabulary of the table.

use std::fmt;
use std::str::FromStr;

use agent_kernel_api::SagaState;

/// What happens to a saga. The names are those of spec §3.2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Event {
    /// A saga begins (`Idle → Planning`).
    StartSaga,
    /// The plan is checked and ready (`Planning → Acting`).
    PlanReady,
    /// A step succeeded while acting.
    ToolSucceeded,
    /// A step failed while acting.
    ToolFailed,
    /// A step succeeded while validating.
    ValidationPassed,
    /// A step failed while validating (a check did not hold).
    ValidationFailed,
    /// Every step that needed it was compensated.
    CompensationDone,
    /// At least one compensation failed.
    CompensationFailed,
    /// A step needs an operator's approval before anything of it runs (reference §10).
    ApprovalRequested,
    /// The operator approved the waiting step: it runs next.
    ApprovalGranted,
    /// The waiting step will never run: rejected, expired, or its process died waiting.
    ApprovalDenied,
    /// An operator undid a `Done` saga (`agent-kernel undo`): the one event a terminal
    /// state does not absorb.
    UndoRequested,
}

impl Event {
    /// Every event, in the order of spec §3.2.
    pub const ALL: [Event; 12] = [
        Event::StartSaga,
        Event::PlanReady,
        Event::ToolSucceeded,
        Event::ToolFailed,
        Event::ValidationPassed,
        Event::ValidationFailed,
        Event::CompensationDone,
        Event::CompensationFailed,
        Event::ApprovalRequested,
        Event::ApprovalGranted,
        Event::ApprovalDenied,
        Event::UndoRequested,
    ];

    /// The event's name, as written in `fsm.toml`.
    pub fn as_str(self) -> &'static str {
        match self {
            Event::StartSaga => "StartSaga",
            Event::PlanReady => "PlanReady",
            Event::ToolSucceeded => "ToolSucceeded",
            Event::ToolFailed => "ToolFailed",
            Event::ValidationPassed => "ValidationPassed",
            Event::ValidationFailed => "ValidationFailed",
            Event::CompensationDone => "CompensationDone",
            Event::CompensationFailed => "CompensationFailed",
            Event::ApprovalRequested => "ApprovalRequested",
            Event::ApprovalGranted => "ApprovalGranted",
            Event::ApprovalDenied => "ApprovalDenied",
            Event::UndoRequested => "UndoRequested",
        }
    }

    /// Whether the event is an operator's explicit command on a finished saga, which its
    /// terminal state does not absorb (`UndoRequested` from `Done`).
    pub fn is_operator(self) -> bool {
        matches!(self, Event::UndoRequested)
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Event {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Event::ALL
            .into_iter()
            .find(|event| event.as_str() == s)
            .ok_or_else(|| format!("unknown event `{s}`"))
    }
}

/// A condition a transition needs besides its state and event (the conditions column of
/// spec §3.4). Whether it holds is an input ([`Facts`]), never looked up by the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Guard {
    /// The actor has no other saga in progress.
    ActorIdle,
    /// The plan has at least one step.
    PlanNonEmpty,
    /// Validation comes next: the step's output hints `validate`, the next step is
    /// read-only, or the plan has no next step.
    ValidationNext,
    /// Steps remain to run.
    MoreSteps,
    /// No step remains and every step committed.
    SagaComplete,
    /// Every step that needed compensation was compensated.
    AllCompensated,
    /// At least one compensation failed.
    AnyCompensationFailed,
}

impl Guard {
    /// Every guard.
    pub const ALL: [Guard; 7] = [
        Guard::ActorIdle,
        Guard::PlanNonEmpty,
        Guard::ValidationNext,
        Guard::MoreSteps,
        Guard::SagaComplete,
        Guard::AllCompensated,
        Guard::AnyCompensationFailed,
    ];

    /// The guard's name, as written in `fsm.toml`.
    pub fn as_str(self) -> &'static str {
        match self {
            Guard::ActorIdle => "actor_idle",
            Guard::PlanNonEmpty => "plan_non_empty",
            Guard::ValidationNext => "validation_next",
            Guard::MoreSteps => "more_steps",
            Guard::SagaComplete => "saga_complete",
            Guard::AllCompensated => "all_compensated",
            Guard::AnyCompensationFailed => "any_compensation_failed",
        }
    }
}

impl fmt::Display for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Guard {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Guard::ALL
            .into_iter()
            .find(|guard| guard.as_str() == s)
            .ok_or_else(|| format!("unknown guard `{s}`"))
    }
}

/// The facts the caller knows when it asks for a transition: one boolean per [`Guard`].
///
/// All default to `false`, so a guard nobody vouched for does not hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Facts {
    /// See [`Guard::ActorIdle`].
    pub actor_idle: bool,
    /// See [`Guard::PlanNonEmpty`].
    pub plan_non_empty: bool,
    /// See [`Guard::ValidationNext`].
    pub validation_next: bool,
    /// See [`Guard::MoreSteps`].
    pub more_steps: bool,
    /// See [`Guard::SagaComplete`].
    pub saga_complete: bool,
    /// See [`Guard::AllCompensated`].
    pub all_compensated: bool,
    /// See [`Guard::AnyCompensationFailed`].
    pub any_compensation_failed: bool,
}

impl Facts {
    /// Whether `guard` holds.
    pub fn holds(&self, guard: Guard) -> bool {
        match guard {
            Guard::ActorIdle => self.actor_idle,
            Guard::PlanNonEmpty => self.plan_non_empty,
            Guard::ValidationNext => self.validation_next,
            Guard::MoreSteps => self.more_steps,
            Guard::SagaComplete => self.saga_complete,
            Guard::AllCompensated => self.all_compensated,
            Guard::AnyCompensationFailed => self.any_compensation_failed,
        }
    }
}

/// One row of the table: in `from`, `event` leads to `to` if `guard` holds (or always,
/// without a guard).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Transition {
    /// The state the saga is in.
    pub from: SagaState,
    /// What happens.
    pub event: Event,
    /// The state it moves to.
    pub to: SagaState,
    /// The condition, if any.
    pub guard: Option<Guard>,
}

impl fmt::Display for Transition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} --{}--> {}", self.from, self.event, self.to)?;
        if let Some(guard) = self.guard {
            write!(f, " [{guard}]")?;
        }
        Ok(())
    }
}

/// Parses a saga state by its contract name.
pub(crate) fn parse_state(name: &str) -> Result<SagaState, String> {
    name.parse()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for event in Event::ALL {
            assert_eq!(event.as_str().parse::<Event>(), Ok(event));
        }
        for guard in Guard::ALL {
            assert_eq!(guard.as_str().parse::<Guard>(), Ok(guard));
            assert!(!Facts::default().holds(guard), "no guard holds by default");
        }
    }
}
