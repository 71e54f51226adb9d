//! The table as data: the built-in rows, `fsm.toml` parsing and validation, rendering.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::fmt::{self, Write as _};

use agent_kernel_api::{SagaState, line_of};
use serde::Deserialize;
use toml::Spanned;

use crate::model::parse_state;
use crate::{Event, Facts, Guard, Guardrail, Transition};

/// Largest `fsm.toml`, in bytes.
pub const MAX_TABLE_BYTES: usize = 64 * 1024;
/// Most rows in one table.
pub const MAX_TRANSITIONS: usize = 256;

/// The table of spec §3.4, row by row.
const BUILTIN: [Transition; 17] = {
    use Event::*;
    use Guard::*;
    use SagaState::*;
    const fn row(from: SagaState, event: Event, to: SagaState, guard: Option<Guard>) -> Transition {
        Transition {
            from,
            event,
            to,
            guard,
        }
    }
    [
        row(Idle, StartSaga, Planning, Some(ActorIdle)),
        row(Planning, PlanReady, Acting, Some(PlanNonEmpty)),
        row(Planning, ValidationFailed, Compensating, None),
        row(Acting, ToolSucceeded, Validating, Some(ValidationNext)),
        row(Acting, ToolSucceeded, Acting, None),
        row(Acting, ToolFailed, Compensating, None),
        row(Validating, ValidationPassed, Done, Some(SagaComplete)),
        row(Validating, ValidationPassed, Acting, Some(MoreSteps)),
        row(Validating, ValidationFailed, Compensating, None),
        row(Acting, ApprovalRequested, AwaitingApproval, None),
        row(Validating, ApprovalRequested, AwaitingApproval, None),
        row(AwaitingApproval, ApprovalGranted, Acting, None),
        row(AwaitingApproval, ApprovalDenied, Compensating, None),
        row(
            Compensating,
            CompensationDone,
            FailedRolledBack,
            Some(AllCompensated),
        ),
        row(
            Compensating,
            CompensationFailed,
            FailedRollbackPartial,
            Some(AnyCompensationFailed),
        ),
        row(Done, UndoRequested, Undone, None),
        row(Planning, ValidationPassed, Done, Some(SagaComplete)),
    ]
};

/// States a table may leave unreachable: without rows into `AwaitingApproval`, a step that
/// needs an approval is denied; without `Done --UndoRequested--> Undone`, `undo` is.
pub const OPTIONAL_STATES: [SagaState; 2] = [SagaState::AwaitingApproval, SagaState::Undone];

/// One problem found in a table, with its line when it has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The 1-based line in the file, if the problem is on one.
    pub line: Option<usize>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "line {line}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

/// Why a table was refused: every problem found, in order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.describe())]
pub struct TableError {
    /// The problems, at least one.
    pub problems: Vec<Problem>,
}

impl TableError {
    fn describe(&self) -> String {
        let mut text = format!(
            "invalid FSM table ({} problem{}):",
            self.problems.len(),
            if self.problems.len() == 1 { "" } else { "s" }
        );
        for problem in &self.problems {
            text.push_str("\n  ");
            text.push_str(&problem.to_string());
        }
        text
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TableFile {
    #[serde(default)]
    transition: Vec<Spanned<RowFile>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RowFile {
    from: Spanned<String>,
    event: Spanned<String>,
    to: Spanned<String>,
    #[serde(default)]
    guard: Option<Spanned<String>>,
}

impl Guardrail {
    /// The built-in table (spec §3.4).
    pub fn builtin() -> Guardrail {
        Guardrail::from_validated(BUILTIN.to_vec())
    }

    /// Parses and validates a table written as `fsm.toml`.
    ///
    /// # Errors
    ///
    /// A [`TableError`] listing every problem with its line: TOML syntax, unknown keys,
    /// unknown states, events or guards, duplicate rows, rows that can never be taken, rows
    /// out of a terminal state, states unreachable from `Idle`, non-terminal states with no
    /// way out, and failures that could not be rolled back.
    pub fn from_toml_str(text: &str) -> Result<Guardrail, TableError> {
        let fail = |line, message: String| TableError {
            problems: vec![Problem { line, message }],
        };
        if text.len() > MAX_TABLE_BYTES {
            return Err(fail(
                None,
                format!(
                    "the table is {} bytes, more than the maximum of {MAX_TABLE_BYTES}",
                    text.len()
                ),
            ));
        }
        let file: TableFile = toml::from_str(text).map_err(|err| {
            let line = err.span().map(|span| line_of(text, span.start));
            fail(line, err.message().trim().to_owned())
        })?;
        if file.transition.len() > MAX_TRANSITIONS {
            return Err(fail(
                None,
                format!(
                    "the table has {} transitions, more than the maximum of {MAX_TRANSITIONS}",
                    file.transition.len()
                ),
            ));
        }
        let mut problems = Vec::new();
        let mut rows = Vec::new();
        for row in &file.transition {
            let line = line_of(text, row.span().start);
            let row = row.get_ref();
            let mut field = |value: &Spanned<String>, what: &str, parsed: Option<&String>| {
                if let Some(message) = parsed {
                    problems.push(Problem {
                        line: Some(line_of(text, value.span().start)),
                        message: format!("{message} in `{what}`"),
                    });
                }
            };
            let from = parse_state(row.from.get_ref());
            field(&row.from, "from", from.as_ref().err());
            let to = parse_state(row.to.get_ref());
            field(&row.to, "to", to.as_ref().err());
            let event = row.event.get_ref().parse::<Event>();
            field(&row.event, "event", event.as_ref().err());
            let guard = match &row.guard {
                None => Ok(None),
                Some(guard) => {
                    let parsed = guard.get_ref().parse::<Guard>();
                    field(guard, "guard", parsed.as_ref().err());
                    parsed.map(Some)
                }
            };
            if let (Ok(from), Ok(event), Ok(to), Ok(guard)) = (from, event, to, guard) {
                rows.push((
                    line,
                    Transition {
                        from,
                        event,
                        to,
                        guard,
                    },
                ));
            }
        }
        problems.extend(validate(&rows));
        if problems.is_empty() {
            Ok(Guardrail::from_validated(
                rows.into_iter().map(|(_, row)| row).collect(),
            ))
        } else {
            problems.sort_by_key(|problem| problem.line.unwrap_or(usize::MAX));
            Err(TableError { problems })
        }
    }

    /// The table written as `fsm.toml`; [`Guardrail::from_toml_str`] reads it back.
    pub fn to_toml(&self) -> String {
        let mut text = String::from(
            "# The agent-kernel FSM transition table (spec section 3.4), the built-in default written out.\n\
             # `agent-kernel --fsm FILE` loads a custom table; `agent-kernel fsm check FILE` validates one.\n\
             #\n\
             # Each [[transition]]: in state `from`, `event` leads to `to` if `guard` holds.\n\
             # Rows for one state and event are tried in order; the first whose guard holds wins.\n\
             # Anything not listed is denied.\n\
             # States: Idle Planning Acting Validating Compensating Done FailedRolledBack FailedRollbackPartial AwaitingApproval Undone\n\
             # Events: StartSaga PlanReady ToolSucceeded ToolFailed ValidationPassed ValidationFailed CompensationDone CompensationFailed ApprovalRequested ApprovalGranted ApprovalDenied UndoRequested\n\
             # A table without ApprovalRequested rows denies every step that needs an approval (the saga rolls back);\n\
             # one without `Done --UndoRequested--> Undone` denies `agent-kernel undo`. No other row leaves a terminal state.\n\
             # Guards: actor_idle plan_non_empty validation_next more_steps saga_complete all_compensated any_compensation_failed\n",
        );
        for transition in self.transitions() {
            text.push_str("\n[[transition]]\n");
            let _ = writeln!(text, "from = \"{}\"", transition.from);
            let _ = writeln!(text, "event = \"{}\"", transition.event);
            let _ = writeln!(text, "to = \"{}\"", transition.to);
            if let Some(guard) = transition.guard {
                let _ = writeln!(text, "guard = \"{guard}\"");
            }
        }
        text
    }

    /// The table as aligned text columns.
    pub fn to_text_table(&self) -> String {
        let mut text = format!("{:<14} {:<20} {:<22} {}\n", "from", "event", "to", "guard");
        for transition in self.transitions() {
            let _ = writeln!(
                text,
                "{:<14} {:<20} {:<22} {}",
                transition.from.as_str(),
                transition.event.as_str(),
                transition.to.as_str(),
                transition.guard.map(Guard::as_str).unwrap_or("-")
            );
        }
        text
    }

    /// The table as a Mermaid state diagram, like spec §3.3.
    pub fn to_mermaid(&self) -> String {
        let mut text = String::from("stateDiagram-v2\n    [*] --> Idle\n");
        for transition in self.transitions() {
            let _ = write!(
                text,
                "    {} --> {}: {}",
                transition.from, transition.to, transition.event
            );
            if let Some(guard) = transition.guard {
                let _ = write!(text, " [{guard}]");
            }
            text.push('\n');
        }
        for state in SagaState::ALL
            .into_iter()
            .filter(|state| state.is_terminal())
        {
            let _ = writeln!(text, "    {state} --> [*]");
        }
        text
    }

    /// The table as a Graphviz digraph.
    pub fn to_dot(&self) -> String {
        let mut text = String::from(
            "digraph fsm {\n    rankdir=LR;\n    start [shape=point];\n    start -> Idle;\n",
        );
        for state in SagaState::ALL
            .into_iter()
            .filter(|state| state.is_terminal())
        {
            let _ = writeln!(text, "    {state} [shape=doublecircle];");
        }
        for transition in self.transitions() {
            let label = match transition.guard {
                Some(guard) => format!("{} [{guard}]", transition.event),
                None => transition.event.to_string(),
            };
            let _ = writeln!(
                text,
                "    {} -> {} [label=\"{label}\"];",
                transition.from, transition.to
            );
        }
        text.push_str("}\n");
        text
    }
}

/// The structural checks on parsed rows (each with its line).
pub(crate) fn validate(rows: &[(usize, Transition)]) -> Vec<Problem> {
    let mut problems = Vec::new();
    let problem = |line, message: String| Problem {
        line: Some(line),
        message,
    };
    let mut seen: HashMap<(SagaState, Event, Option<Guard>), usize> = HashMap::new();
    let mut unguarded: HashMap<(SagaState, Event), usize> = HashMap::new();
    for (line, row) in rows {
        let undo = row.event.is_operator()
            && row.from == SagaState::Done
            && row.to == SagaState::Undone
            && row.guard.is_none();
        if row.from.is_terminal() && !undo {
            problems.push(problem(
                *line,
                format!(
                    "transition out of the terminal state {} ({row}); only `Done --UndoRequested--> Undone` leaves one",
                    row.from
                ),
            ));
        } else if row.event.is_operator() && !undo {
            problems.push(problem(
                *line,
                format!(
                    "`{}` leads only from Done to Undone, unguarded ({row})",
                    row.event
                ),
            ));
        }
        if let Some(first) = seen.insert((row.from, row.event, row.guard), *line) {
            problems.push(problem(
                *line,
                format!("duplicate transition ({row}); first at line {first}"),
            ));
            continue;
        }
        if let Some(first) = unguarded.get(&(row.from, row.event)) {
            problems.push(problem(
                *line,
                format!(
                    "transition can never be taken ({row}): the unguarded row at line {first} for the same state and event comes first"
                ),
            ));
        }
        if row.guard.is_none() {
            unguarded.entry((row.from, row.event)).or_insert(*line);
        }
    }

    // Reachability from Idle.
    let mut reachable = BTreeSet::from([SagaState::Idle.as_str()]);
    let mut queue = VecDeque::from([SagaState::Idle]);
    while let Some(state) = queue.pop_front() {
        for (_, row) in rows.iter().filter(|(_, row)| row.from == state) {
            if reachable.insert(row.to.as_str()) {
                queue.push_back(row.to);
            }
        }
    }
    let first_line_of = |state: SagaState| {
        rows.iter()
            .find(|(_, row)| row.from == state || row.to == state)
            .map(|(line, _)| *line)
    };
    for state in SagaState::ALL {
        if !reachable.contains(state.as_str()) {
            if OPTIONAL_STATES.contains(&state) {
                // A table may leave approvals out: a step that needs one is then denied.
                continue;
            }
            problems.push(Problem {
                line: first_line_of(state),
                message: format!("state {state} is unreachable from Idle"),
            });
            continue;
        }
        if !state.is_terminal() && !rows.iter().any(|(_, row)| row.from == state) {
            problems.push(Problem {
                line: first_line_of(state),
                message: format!("non-terminal state {state} has no way out"),
            });
        }
    }

    // Rollback must stay possible wherever a step can fail or compensation can finish:
    // the kernel raises these events with the facts below and must land where it expects.
    let machine = Guardrail::from_validated(rows.iter().map(|(_, row)| *row).collect());
    let outcome_facts = Facts {
        all_compensated: true,
        ..Facts::default()
    };
    let failed_facts = Facts {
        any_compensation_failed: true,
        ..Facts::default()
    };
    let required = [
        (
            SagaState::Acting,
            Event::ToolFailed,
            Facts::default(),
            SagaState::Compensating,
        ),
        (
            SagaState::Validating,
            Event::ValidationFailed,
            Facts::default(),
            SagaState::Compensating,
        ),
        (
            SagaState::AwaitingApproval,
            Event::ApprovalDenied,
            Facts::default(),
            SagaState::Compensating,
        ),
        (
            SagaState::Compensating,
            Event::CompensationDone,
            outcome_facts,
            SagaState::FailedRolledBack,
        ),
        (
            SagaState::Compensating,
            Event::CompensationFailed,
            failed_facts,
            SagaState::FailedRollbackPartial,
        ),
    ];
    // The engine starts every saga with `StartSaga` then `PlanReady`, both guards holding,
    // and runs its first step in the state that leads to; it must be `Acting`.
    if reachable.contains(SagaState::Acting.as_str()) {
        let start_facts = Facts {
            actor_idle: true,
            plan_non_empty: true,
            ..Facts::default()
        };
        let started = machine
            .apply(SagaState::Idle, Event::StartSaga, &start_facts)
            .and_then(|planning| machine.apply(planning, Event::PlanReady, &start_facts));
        if started != Ok(SagaState::Acting) {
            problems.push(Problem {
                line: first_line_of(SagaState::Idle),
                message: "a saga could never start: `StartSaga` then `PlanReady` (with their guards holding) must lead from Idle to Acting".to_owned(),
            });
        }
    }
    for (state, event, facts, to) in required {
        if !reachable.contains(state.as_str()) {
            continue;
        }
        if machine.apply(state, event, &facts) != Ok(to) {
            problems.push(Problem {
                line: first_line_of(state),
                message: format!(
                    "rollback would be impossible: {state} needs `{event}` to lead to {to} (add that row; failures and compensations must always be able to finish)"
                ),
            });
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builtin_table_passes_its_own_validation() {
        let rows: Vec<_> = BUILTIN.iter().map(|row| (1, *row)).collect();
        assert_eq!(validate(&rows), []);
    }

    #[test]
    fn lines_are_one_based() {
        assert_eq!(line_of("a\nb\nc", 0), 1);
        assert_eq!(line_of("a\nb\nc", 2), 2);
        assert_eq!(line_of("a\nb\nc", 4), 3);
    }
}
