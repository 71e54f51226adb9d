//! The machine: `can_transition`, `apply`, `may_execute`.

use std::fmt;

use agent_kernel_api::{EffectClass, SagaState};

use crate::{Event, Facts, Guard, Transition};

/// Why the machine refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Rule {
    /// Default deny: the table has no row for this state and event (spec §3.5 rule 1).
    NotInTable,
    /// Rows exist for this state and event, but none of their guards holds.
    GuardNotMet {
        /// The guards that were required, one per row.
        required: Vec<Guard>,
    },
    /// A terminal state absorbs every event but an operator's (`UndoRequested`).
    Terminal,
    /// In `Compensating` nothing executes; only compensation runs (spec §3.5 rule 2).
    CompensatingBlocksExecute,
    /// In `Planning` and `Validating` only read-only tools execute (spec §3.5 rule 3).
    ReadOnlyState,
    /// Tools execute only in `Planning`, `Acting` and `Validating` (never while a step
    /// awaits its approval).
    NoExecutionState,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rule::NotInTable => f.write_str("no such transition in the table (default deny)"),
            Rule::GuardNotMet { required } => {
                let names: Vec<&str> = required.iter().map(|guard| guard.as_str()).collect();
                write!(f, "no guard holds (required one of: {})", names.join(", "))
            }
            Rule::Terminal => f.write_str("a terminal state absorbs every event"),
            Rule::CompensatingBlocksExecute => {
                f.write_str("nothing executes while compensating, only compensation runs")
            }
            Rule::ReadOnlyState => f.write_str("only read-only tools execute in this state"),
            Rule::NoExecutionState => f.write_str("no tool executes in this state"),
        }
    }
}

/// A refusal of the machine, naming the state, the event or tool, and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.describe())]
pub struct Denial {
    /// The state the saga was in.
    pub state: SagaState,
    /// The event that was refused, if the refusal is about a transition.
    pub event: Option<Event>,
    /// The tool that was refused, if the refusal is about executing one.
    pub tool: Option<String>,
    /// Why.
    pub rule: Rule,
}

impl Denial {
    fn describe(&self) -> String {
        let mut text = format!("fsm denied: in state {}", self.state);
        if let Some(event) = self.event {
            text.push_str(&format!(", event {event}"));
        }
        if let Some(tool) = &self.tool {
            text.push_str(&format!(", tool `{tool}`"));
        }
        text.push_str(&format!(": {}", self.rule));
        text
    }

    /// The same denial, naming the tool that caused it.
    #[must_use]
    pub fn with_tool(mut self, tool: impl Into<String>) -> Self {
        self.tool = Some(tool.into());
        self
    }
}

/// The FSM guardrail: a validated transition table and the enforcement rules of spec §3.5.
///
/// Pure: no I/O, no clock, no randomness. Every answer depends only on the table and the
/// arguments. A `Guardrail` is immutable once built; a custom table is only what a file
/// says (see [`Guardrail::from_toml_str`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Guardrail {
    transitions: Vec<Transition>,
}

impl Guardrail {
    /// Wraps rows that [`crate::validate`] accepted.
    pub(crate) fn from_validated(transitions: Vec<Transition>) -> Self {
        Self { transitions }
    }

    /// The rows, in table order.
    pub fn transitions(&self) -> &[Transition] {
        &self.transitions
    }

    /// The row `apply` would take, if any.
    fn select(&self, state: SagaState, event: Event, facts: &Facts) -> Result<&Transition, Rule> {
        // A finished saga moves on only by an operator's undo of a `Done` saga.
        if state.is_terminal() && !(event.is_operator() && state == SagaState::Done) {
            return Err(Rule::Terminal);
        }
        let mut required = Vec::new();
        for transition in self
            .transitions
            .iter()
            .filter(|transition| transition.from == state && transition.event == event)
        {
            match transition.guard {
                None => return Ok(transition),
                Some(guard) if facts.holds(guard) => return Ok(transition),
                Some(guard) => required.push(guard),
            }
        }
        if required.is_empty() {
            Err(Rule::NotInTable)
        } else {
            Err(Rule::GuardNotMet { required })
        }
    }

    /// Whether `event` may happen in `state` given `facts`.
    pub fn can_transition(&self, state: SagaState, event: Event, facts: &Facts) -> bool {
        self.select(state, event, facts).is_ok()
    }

    /// The state `event` leads to from `state` given `facts`.
    ///
    /// Rows for the state and event are tried in table order; the first whose guard holds
    /// (or that has none) wins.
    ///
    /// # Errors
    ///
    /// A [`Denial`] naming the state, the event and the rule: no row (default deny), no
    /// guard held, or a terminal state.
    pub fn apply(
        &self,
        state: SagaState,
        event: Event,
        facts: &Facts,
    ) -> Result<SagaState, Denial> {
        self.select(state, event, facts)
            .map(|transition| transition.to)
            .map_err(|rule| Denial {
                state,
                event: Some(event),
                tool: None,
                rule,
            })
    }

    /// Whether a tool of class `effect` may execute in `state` (spec §3.5 rules 2 and 3).
    ///
    /// # Errors
    ///
    /// A [`Denial`] naming the state and the rule; the caller adds the tool with
    /// [`Denial::with_tool`].
    pub fn may_execute(&self, state: SagaState, effect: EffectClass) -> Result<(), Denial> {
        let deny = |rule| {
            Err(Denial {
                state,
                event: None,
                tool: None,
                rule,
            })
        };
        match state {
            SagaState::Acting => Ok(()),
            SagaState::Planning | SagaState::Validating if effect == EffectClass::ReadOnly => {
                Ok(())
            }
            SagaState::Planning | SagaState::Validating => deny(Rule::ReadOnlyState),
            SagaState::Compensating => deny(Rule::CompensatingBlocksExecute),
            SagaState::Done
            | SagaState::FailedRolledBack
            | SagaState::FailedRollbackPartial
            | SagaState::Undone => deny(Rule::Terminal),
            SagaState::Idle | SagaState::AwaitingApproval => deny(Rule::NoExecutionState),
        }
    }

    /// The event that reports a step's success in `state`: `ToolSucceeded` while acting,
    /// `ValidationPassed` while validating (or planning: a read-only step there checks).
    pub fn success_event(state: SagaState) -> Event {
        match state {
            SagaState::Validating | SagaState::Planning => Event::ValidationPassed,
            _ => Event::ToolSucceeded,
        }
    }

    /// The event that reports a step's failure in `state`: `ToolFailed` while acting,
    /// `ValidationFailed` while validating, `ApprovalDenied` while a step waits for an
    /// approval that will never come (rejected, expired, its process gone).
    pub fn failure_event(state: SagaState) -> Event {
        match state {
            SagaState::Validating | SagaState::Planning => Event::ValidationFailed,
            SagaState::AwaitingApproval => Event::ApprovalDenied,
            _ => Event::ToolFailed,
        }
    }
}
