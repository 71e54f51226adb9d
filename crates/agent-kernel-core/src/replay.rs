//! Replay (reference §12): a saga's recorded history checked again, executing nothing,
//! against an FSM table (the one in force, or another), the tools' versions and the
//! arguments' hashes; the first divergence is named.

use agent_kernel_api::{SagaRecord, SagaState};
use agent_kernel_dispatcher::Dispatcher;
use agent_kernel_fsm::{Event, Guardrail};
use serde::Serialize;

use crate::kernel::args_hash;

/// One record of a saga's history, as the audit chain holds it, in chain order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// The saga was created in `state` (`CreateSaga`).
    Created {
        /// The record's sequence number.
        seq: i64,
        /// The state it was created in.
        state: SagaState,
    },
    /// The saga moved to `state` (`SetState`).
    State {
        /// The record's sequence number.
        seq: i64,
        /// The state it moved to.
        state: SagaState,
    },
    /// A step began (`BeginStep`).
    Begun {
        /// The record's sequence number.
        seq: i64,
        /// The step.
        step_seq: u32,
    },
}

/// The first place a replay found the history and today's rules apart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Divergence {
    /// The audit record it was found at.
    pub seq: i64,
    /// What differs, in a sentence.
    pub reason: String,
}

/// What [`replay`] found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReplayReport {
    /// The saga.
    pub saga_id: String,
    /// The state changes checked against the table (its creation included).
    pub n_transitions: u64,
    /// The steps whose tool and arguments were checked.
    pub n_steps: u64,
    /// The first divergence; `None` when the history agrees with the table and the tools.
    pub divergence: Option<Divergence>,
}

/// Whether `fsm` leads from `from` to `to` the way the engine records a change of state:
/// one row, or, at a saga's end, a success row into `Validating` followed by
/// `Validating --ValidationPassed--> Done` (the engine applies both in one write and
/// records only `Done`).
fn reachable(fsm: &Guardrail, from: SagaState, to: SagaState) -> bool {
    let rows = fsm.transitions();
    let row = |from: SagaState, event: Option<Event>, to: SagaState| {
        rows.iter().any(|row| {
            row.from == from && row.to == to && event.is_none_or(|event| row.event == event)
        })
    };
    row(from, None, to)
        || (to == SagaState::Done
            && row(from, None, SagaState::Validating)
            && row(
                SagaState::Validating,
                Some(Event::ValidationPassed),
                SagaState::Done,
            ))
}

/// The states the table lets a saga be created in: reached from `Idle` by `StartSaga`,
/// then, for a plan, `PlanReady`, under any guard.
fn creation_states(fsm: &Guardrail) -> Vec<SagaState> {
    let after = |from: SagaState, event: Event| {
        fsm.transitions()
            .iter()
            .filter(move |row| row.from == from && row.event == event)
            .map(|row| row.to)
    };
    let mut states: Vec<SagaState> = after(SagaState::Idle, Event::StartSaga).collect();
    let planned: Vec<SagaState> = states
        .iter()
        .flat_map(|state| after(*state, Event::PlanReady))
        .collect();
    states.extend(planned);
    states
}

/// Checks `record`'s history (`recorded`, in chain order) against `fsm` and `tools`,
/// executing nothing:
///
/// - the saga's creation state must be one the table reaches from `Idle` by `StartSaga`
///   (then `PlanReady`), and each later change of state must be a row of the table (some
///   event, under some guard: the facts of the moment are not recorded), or the pair of
///   rows a saga's end is recorded as (into `Validating`, then `ValidationPassed` to `Done`);
/// - each begun step's tool must be one `tools` has, at the version recorded, and its
///   arguments must hash to the hash recorded.
///
/// A dry run's steps were simulated, never run: only its states are checked.
pub fn replay(
    record: &SagaRecord,
    recorded: &[Recorded],
    fsm: &Guardrail,
    tools: &Dispatcher,
) -> ReplayReport {
    let mut report = ReplayReport {
        saga_id: record.saga.saga_id.as_str().to_owned(),
        n_transitions: 0,
        n_steps: 0,
        divergence: None,
    };
    let mut state: Option<SagaState> = None;
    for entry in recorded {
        let found = match *entry {
            Recorded::Created {
                seq,
                state: created,
            } => {
                report.n_transitions += 1;
                state = Some(created);
                (!creation_states(fsm).contains(&created)).then(|| Divergence {
                    seq,
                    reason: format!(
                        "the saga was created in {created}, which the table does not reach from Idle by StartSaga (and PlanReady)"
                    ),
                })
            }
            Recorded::State { seq, state: to } => {
                let from = state.replace(to);
                match from {
                    None => Some(Divergence {
                        seq,
                        reason: format!("the saga moved to {to} before it was created"),
                    }),
                    Some(from) if from == to => None,
                    Some(from) => {
                        report.n_transitions += 1;
                        (!reachable(fsm, from, to)).then(|| Divergence {
                            seq,
                            reason: format!(
                                "the saga moved from {from} to {to}, and the table has no row from {from} to {to}"
                            ),
                        })
                    }
                }
            }
            Recorded::Begun { seq, step_seq } => {
                if record.saga.dry_run {
                    None
                } else {
                    report.n_steps += 1;
                    check_step(record, step_seq, tools).map(|reason| Divergence { seq, reason })
                }
            }
        };
        if found.is_some() {
            report.divergence = found;
            break;
        }
    }
    report
}

/// What is wrong with step `step_seq` of `record` today, if anything.
fn check_step(record: &SagaRecord, step_seq: u32, tools: &Dispatcher) -> Option<String> {
    let found = record
        .steps
        .binary_search_by_key(&step_seq, |step| step.step_seq)
        .ok()
        .map(|i| &record.steps[i]);
    let Some(step) = found else {
        return Some(format!(
            "step {step_seq} was begun, but the log holds no such step"
        ));
    };
    let Some(tool) = tools.get(&step.tool_id) else {
        return Some(format!(
            "step {step_seq} ran {}, which this program does not have",
            step.tool_id
        ));
    };
    if tool.version() != step.tool_version {
        return Some(format!(
            "step {step_seq} ran {} version {}, and the tool is now version {}",
            step.tool_id,
            step.tool_version,
            tool.version()
        ));
    }
    let hash = args_hash(&step.tool_id, &step.args);
    if hash != step.args_hash {
        return Some(format!(
            "the arguments of step {step_seq} ({}) do not hash to the hash recorded with them",
            step.tool_id
        ));
    }
    None
}
