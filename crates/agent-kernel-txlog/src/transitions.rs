//! Which changes a record may make, from which states: one table for the write path
//! (`store/`, whose SQL guards are built from it) and for verification (`verify/`, whose
//! replay of the chain checks each record against it). A change the write path refuses is
//! one the replay calls impossible, and the other way round.

use agent_kernel_api::{ApprovalStatus, DeadLetterStatus, SagaState, StepStatus};

/// The statuses a step's outcome (`COMMIT` or `FAIL`) is recorded over.
pub(crate) const OUTCOME_FROM: &[StepStatus] = &[StepStatus::Begin];

/// The status a compensation outcome is never recorded over: a compensated step stays so.
pub(crate) const COMPENSATION_NEVER_OVER: StepStatus = StepStatus::Compensated;

/// The statuses a request may be decided from, for the status the decision gives: approve,
/// reject and expire a pending request only; cancel a pending or an approved one, never a
/// consumed one (that step ran).
pub(crate) fn decided_from(to: ApprovalStatus) -> &'static [ApprovalStatus] {
    match to {
        ApprovalStatus::Approved | ApprovalStatus::Rejected | ApprovalStatus::Expired => {
            &[ApprovalStatus::Pending]
        }
        ApprovalStatus::Cancelled => &[ApprovalStatus::Pending, ApprovalStatus::Approved],
        ApprovalStatus::Pending | ApprovalStatus::Consumed => &[],
    }
}

/// The status a request must have to be consumed by its step's BEGIN.
pub(crate) const CONSUMED_FROM: ApprovalStatus = ApprovalStatus::Approved;

/// Whether a dead letter in `from` may be settled as `to`: an open letter, to anything but
/// open.
pub(crate) fn settles(from: DeadLetterStatus, to: DeadLetterStatus) -> bool {
    from == DeadLetterStatus::Open && to != DeadLetterStatus::Open
}

/// The saga state that settling a saga's last open dead letter clears, and the state it
/// clears to: every failed compensation was then retried or resolved.
pub(crate) const CLEARED_BY_LAST_LETTER: (SagaState, SagaState) = (
    SagaState::FailedRollbackPartial,
    SagaState::FailedRolledBack,
);

/// The states that settle a saga and release its locks: its effects are final or undone.
/// `FailedRollbackPartial` keeps them until its last dead letter is settled
/// ([`CLEARED_BY_LAST_LETTER`]).
pub(crate) const RELEASES_LOCKS: &[SagaState] = &[
    SagaState::Done,
    SagaState::FailedRolledBack,
    SagaState::Undone,
];

/// `column IN ('a', 'b')` for `statuses`, for a guard in SQL (`FALSE` for none); the names
/// are the fixed spellings of the states, never input.
pub(crate) fn sql_in<'a>(column: &str, statuses: impl IntoIterator<Item = &'a str>) -> String {
    let names: Vec<String> = statuses
        .into_iter()
        .map(|name| {
            debug_assert!(
                name.bytes()
                    .all(|byte| byte.is_ascii_alphanumeric() || byte == b'_')
            );
            format!("'{name}'")
        })
        .collect();
    if names.is_empty() {
        return "FALSE".to_owned();
    }
    format!("{column} IN ({})", names.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guards_spell_the_statuses_they_allow() {
        assert_eq!(
            sql_in(
                "status",
                decided_from(ApprovalStatus::Cancelled)
                    .iter()
                    .map(|status| status.as_str())
            ),
            "status IN ('pending', 'approved')"
        );
        assert_eq!(sql_in("status", []), "FALSE");
        assert!(settles(DeadLetterStatus::Open, DeadLetterStatus::Resolved));
        assert!(!settles(
            DeadLetterStatus::Resolved,
            DeadLetterStatus::Retried
        ));
        assert!(!settles(DeadLetterStatus::Open, DeadLetterStatus::Open));
    }
}
