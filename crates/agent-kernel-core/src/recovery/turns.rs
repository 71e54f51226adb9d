//! A recovery group's compensations in turns: concurrently where the sagas act on different
//! resources, one after another, newest first, where they share one.

use agent_kernel_api::{SagaId, SagaRecord, StepRecord, tool_resource};
use std::collections::BTreeSet;
use std::sync::Mutex;
use tokio::sync::watch;
use tracing::{Instrument, info, info_span, warn};

use super::{Prepared, Slot};
use crate::KernelError;
use crate::kernel::Kernel;
use crate::report::{Failure, Observer, RecoveryAction};

/// A saga of a recovery group, taken over and in `Compensating`, to be compensated.
pub(super) struct Turn {
    pub(super) record: SagaRecord,
    pub(super) failure: Option<Failure>,
    /// What its compensations may act on: the resources of its steps that may need undoing;
    /// `None` when one of them does not say what it touches ([`names_what_it_touches`]),
    /// which orders it after every newer saga of the group and before every older one.
    resources: Option<BTreeSet<String>>,
}

impl Turn {
    pub(super) fn new(record: SagaRecord, failure: Option<Failure>) -> Turn {
        let resources = record
            .steps
            .iter()
            .filter(|step| Kernel::needs_compensation(step) && Kernel::may_act(step))
            .try_fold(BTreeSet::new(), |mut held, step| {
                names_what_it_touches(step).then(|| {
                    held.extend(step.resources.iter().cloned());
                    held
                })
            });
        Turn {
            record,
            failure,
            resources,
        }
    }

    /// Whether one of the two must be compensated before the other.
    fn shares_with(&self, other: &Turn) -> bool {
        match (&self.resources, &other.resources) {
            (Some(mine), Some(theirs)) => !mine.is_disjoint(theirs),
            _ => true,
        }
    }
}

/// Whether `step`'s resources say what it touches, so that a saga whose steps name other
/// resources can be compensated at the same time. Not when it names none (a log written
/// before steps named their resources, or a tool that says its call touches nothing another
/// saga could), nor when it has only its tool's own key (`tool:ID`, which a tool that names
/// nothing gets): a command tool's program writing a file another saga wrote through
/// `fs.write` is kept apart from it by nothing else, and its compensation cannot tell what
/// changed since.
fn names_what_it_touches(step: &StepRecord) -> bool {
    match step.resources.as_slice() {
        [] => false,
        [only] => *only != tool_resource(&step.tool_id),
        _ => true,
    }
}

impl Kernel {
    /// Compensates a group's `turns` (newest first), each once every newer one that shares
    /// a resource with it is settled, the others at the same time: their compensations act
    /// on different things, so their order cannot matter, and their outcomes share the
    /// log's synced commits. Within a saga, each outcome is still durable before the next
    /// compensation acts.
    ///
    /// A compensation stopped by the log stops every turn not yet begun (reported as not
    /// compensated, for the next recovery); those under way finish. Returns each turn's
    /// slot, in order, and the first error that stopped one.
    pub(super) async fn compensate_in_turns(
        &self,
        turns: &[Turn],
        observer: &dyn Observer,
    ) -> (Vec<Slot>, Option<KernelError>) {
        let settled: Vec<watch::Sender<bool>> =
            turns.iter().map(|_| watch::Sender::new(false)).collect();
        let stopped: Mutex<Option<KernelError>> = Mutex::new(None);
        let slots = futures_util::future::join_all(turns.iter().enumerate().map(|(n, turn)| {
            let newer: Vec<watch::Receiver<bool>> = turns[..n]
                .iter()
                .zip(&settled)
                .filter(|(newer, _)| newer.shares_with(turn))
                .map(|(_, sender)| sender.subscribe())
                .collect();
            let (stopped, done) = (&stopped, &settled[n]);
            async move {
                for mut receiver in newer {
                    // A sender dropped without settling cannot happen while this runs; either
                    // way, the wait is over.
                    let _ = receiver.wait_for(|settled| *settled).await;
                }
                let slot = self.take_turn(turn, stopped, observer).await;
                done.send_replace(true);
                slot
            }
        }))
        .await;
        let stopped = stopped
            .into_inner()
            .unwrap_or_else(|poison| poison.into_inner());
        (slots, stopped)
    }

    /// Compensates one saga, unless the group was stopped.
    async fn take_turn(
        &self,
        turn: &Turn,
        stopped: &Mutex<Option<KernelError>>,
        observer: &dyn Observer,
    ) -> Slot {
        let saga_id = &turn.record.saga.saga_id;
        let stop = stopped
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .as_ref()
            .map(ToString::to_string);
        if let Some(error) = stop {
            return Slot::Done(not_compensated(saga_id, &error));
        }
        info!(saga_id = %saga_id, "recovering");
        let span = info_span!("saga", saga_id = %saga_id, recovery = true);
        match self
            .compensate_into(&turn.record, observer)
            .instrument(span)
            .await
        {
            Ok(_) => Slot::Compensated(saga_id.clone(), turn.failure.clone()),
            Err(error) => {
                // Stopped by the log: no older saga that shares a resource with it is undone
                // before it is, and none is begun at all.
                warn!(saga_id = %saga_id, %error, "cannot recover this saga");
                let slot = Slot::Done(RecoveryAction::Failed {
                    saga_id: saga_id.clone(),
                    error: format!("{error}; the next recovery finishes it"),
                });
                stopped
                    .lock()
                    .unwrap_or_else(|poison| poison.into_inner())
                    .get_or_insert(error);
                slot
            }
        }
    }
}

/// Each saga of a group in the report's order, known now or as its turn (its place among the
/// turns returned: `None`, in the same order), from what its preparation came to (`settled`: its owner was known gone
/// before the first read; `read_again`: the others taken over, read again, in order), and
/// what stopped the group before any compensation (a saga taken over that cannot be read
/// again: those after it are not compensated).
pub(super) fn places_and_turns(
    group: &[SagaId],
    prepared: Vec<Result<Prepared, KernelError>>,
    settled: Vec<bool>,
    read_again: Vec<Result<SagaRecord, KernelError>>,
) -> (Vec<Option<Slot>>, Vec<Turn>, Option<KernelError>) {
    let mut read_again = read_again.into_iter();
    // Each saga's place in the report, in the group's order: known now, or `None` for the
    // next turn's.
    let mut places = Vec::with_capacity(group.len());
    let mut turns = Vec::new();
    // What stopped the group before any compensation (the first): a saga taken over
    // that cannot be read again.
    let mut stopped: Option<KernelError> = None;
    for ((saga_id, prepared), settled) in group.iter().zip(prepared).zip(settled) {
        if let Some(error) = &stopped {
            // Past the stop nothing is compensated: each says what its preparation
            // came to.
            places.extend(
                match prepared {
                    Ok(Prepared::Done(action)) => action,
                    Ok(Prepared::Ready(_)) => Some(not_compensated(saga_id, error)),
                    Err(error) => Some(RecoveryAction::Failed {
                        saga_id: saga_id.clone(),
                        error: error.to_string(),
                    }),
                }
                .map(|action| Some(Slot::Done(action))),
            );
            continue;
        }
        let (record, failure) = match prepared {
            Ok(Prepared::Done(action)) => {
                places.extend(action.map(|action| Some(Slot::Done(action))));
                continue;
            }
            Ok(Prepared::Ready(ready)) => {
                let (record, failure) = *ready;
                let record = if settled {
                    Ok(record)
                } else {
                    read_again
                        .next()
                        .unwrap_or_else(|| Err(KernelError::SagaNotFound(saga_id.clone())))
                };
                match record {
                    Ok(record) => (record, failure),
                    Err(error) => {
                        // Taken over but unreadable: its resources unknown, it stops the
                        // group, so no older saga is undone before it.
                        warn!(saga_id = %saga_id, %error, "cannot recover this saga");
                        places.push(Some(Slot::Done(RecoveryAction::Failed {
                            saga_id: saga_id.clone(),
                            error: format!(
                                "taken over and moved to Compensating, but cannot be read again ({error}); the next recovery compensates it"
                            ),
                        })));
                        stopped = Some(error);
                        continue;
                    }
                }
            }
            Err(error) => {
                // Nothing of it ran: left for the next recovery, as a skipped one is.
                warn!(saga_id = %saga_id, %error, "cannot recover this saga");
                places.push(Some(Slot::Done(RecoveryAction::Failed {
                    saga_id: saga_id.clone(),
                    error: error.to_string(),
                })));
                continue;
            }
        };
        places.push(None);
        turns.push(Turn::new(record, failure));
    }
    (places, turns, stopped)
}

/// What the report says of a saga taken over that a stop left uncompensated.
fn not_compensated(saga_id: &SagaId, error: &dyn std::fmt::Display) -> RecoveryAction {
    RecoveryAction::Failed {
        saga_id: saga_id.clone(),
        error: format!(
            "taken over and moved to Compensating, but not compensated: recovery stopped before it ({error}); the next recovery compensates it"
        ),
    }
}
