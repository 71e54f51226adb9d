//! One test per row of the table of spec §3.4: with its guard holding the row is taken,
//! with its guard failing it is not.

use agent_kernel_api::SagaState;
use agent_kernel_fsm::{Event, Facts, Guard, Guardrail};

fn facts_with(guard: Option<Guard>) -> Facts {
    let mut facts = Facts::default();
    match guard {
        None => {}
        Some(Guard::ActorIdle) => facts.actor_idle = true,
        Some(Guard::PlanNonEmpty) => facts.plan_non_empty = true,
        Some(Guard::ValidationNext) => facts.validation_next = true,
        Some(Guard::MoreSteps) => facts.more_steps = true,
        Some(Guard::SagaComplete) => facts.saga_complete = true,
        Some(Guard::AllCompensated) => facts.all_compensated = true,
        Some(Guard::AnyCompensationFailed) => facts.any_compensation_failed = true,
    }
    facts
}

fn check(from: SagaState, event: Event, guard: Option<Guard>, to: SagaState) {
    let fsm = Guardrail::builtin();
    assert!(
        fsm.transitions().iter().any(|row| row.from == from
            && row.event == event
            && row.to == to
            && row.guard == guard),
        "the table has {from} --{event}--> {to} [{guard:?}]"
    );
    let facts = facts_with(guard);
    assert!(fsm.can_transition(from, event, &facts));
    assert_eq!(fsm.apply(from, event, &facts), Ok(to));
    if let Some(guard) = guard {
        // Without its guard, the row is not taken: either the next row applies, or nothing.
        let without = fsm.apply(from, event, &Facts::default());
        assert_ne!(without, Ok(to), "{from} --{event}--> {to} needs {guard}");
    }
}

macro_rules! rows {
    ($($name:ident: $from:ident, $event:ident, $guard:expr, $to:ident;)*) => {
        $(
            #[test]
            fn $name() {
                check(SagaState::$from, Event::$event, $guard, SagaState::$to);
            }
        )*

        #[test]
        fn the_table_has_exactly_these_rows() {
            assert_eq!(Guardrail::builtin().transitions().len(), [$(stringify!($name)),*].len());
        }
    };
}

rows! {
    idle_start_saga_planning: Idle, StartSaga, Some(Guard::ActorIdle), Planning;
    planning_plan_ready_acting: Planning, PlanReady, Some(Guard::PlanNonEmpty), Acting;
    planning_validation_failed_compensating: Planning, ValidationFailed, None, Compensating;
    acting_tool_succeeded_validating: Acting, ToolSucceeded, Some(Guard::ValidationNext), Validating;
    acting_tool_succeeded_acting: Acting, ToolSucceeded, None, Acting;
    acting_tool_failed_compensating: Acting, ToolFailed, None, Compensating;
    validating_validation_passed_done: Validating, ValidationPassed, Some(Guard::SagaComplete), Done;
    validating_validation_passed_acting: Validating, ValidationPassed, Some(Guard::MoreSteps), Acting;
    validating_validation_failed_compensating: Validating, ValidationFailed, None, Compensating;
    acting_approval_requested_awaiting: Acting, ApprovalRequested, None, AwaitingApproval;
    validating_approval_requested_awaiting: Validating, ApprovalRequested, None, AwaitingApproval;
    awaiting_approval_granted_acting: AwaitingApproval, ApprovalGranted, None, Acting;
    awaiting_approval_denied_compensating: AwaitingApproval, ApprovalDenied, None, Compensating;
    compensating_compensation_done_failed_rolled_back: Compensating, CompensationDone, Some(Guard::AllCompensated), FailedRolledBack;
    compensating_compensation_failed_partial: Compensating, CompensationFailed, Some(Guard::AnyCompensationFailed), FailedRollbackPartial;
    done_undo_requested_undone: Done, UndoRequested, None, Undone;
    planning_validation_passed_done: Planning, ValidationPassed, Some(Guard::SagaComplete), Done;
}

#[test]
fn validating_needs_more_steps_or_a_complete_saga() {
    let fsm = Guardrail::builtin();
    let denial = fsm
        .apply(
            SagaState::Validating,
            Event::ValidationPassed,
            &Facts::default(),
        )
        .expect_err("neither guard holds");
    let message = denial.to_string();
    assert!(
        message.contains("saga_complete") && message.contains("more_steps"),
        "{message}"
    );
}
