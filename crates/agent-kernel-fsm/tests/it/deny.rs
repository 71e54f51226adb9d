//! Default deny: one test per (state, event) pair that the table does not list.
//! Whatever the facts, the machine refuses, and a terminal state says so.

use agent_kernel_api::SagaState;
use agent_kernel_fsm::{Event, Facts, Guardrail, Rule};

/// Facts under which every guard holds: a denial then cannot be a guard's doing.
const ALL_TRUE: Facts = Facts {
    actor_idle: true,
    plan_non_empty: true,
    validation_next: true,
    more_steps: true,
    saga_complete: true,
    all_compensated: true,
    any_compensation_failed: true,
};

fn check_denied(state: SagaState, event: Event) {
    let fsm = Guardrail::builtin();
    for facts in [Facts::default(), ALL_TRUE] {
        assert!(
            !fsm.can_transition(state, event, &facts),
            "{state} --{event}--> allowed"
        );
        let denial = fsm.apply(state, event, &facts).expect_err("denied");
        assert_eq!(denial.state, state);
        assert_eq!(denial.event, Some(event));
        let expected = if state.is_terminal() {
            Rule::Terminal
        } else {
            Rule::NotInTable
        };
        assert_eq!(denial.rule, expected);
        let message = denial.to_string();
        assert!(
            message.contains(state.as_str()) && message.contains(event.as_str()),
            "{message}"
        );
    }
}

macro_rules! forbidden_pairs {
    ($($name:ident: $state:ident, $event:ident;)*) => {
        $(
            #[test]
            fn $name() {
                check_denied(SagaState::$state, Event::$event);
            }
        )*

        /// The list above is exactly the complement of the table.
        #[test]
        fn the_forbidden_pairs_are_every_pair_the_table_lacks() {
            let listed: Vec<(SagaState, Event)> = vec![$((SagaState::$state, Event::$event)),*];
            let fsm = Guardrail::builtin();
            for state in SagaState::ALL {
                for event in Event::ALL {
                    let in_table = fsm
                        .transitions()
                        .iter()
                        .any(|row| row.from == state && row.event == event);
                    assert_eq!(
                        in_table,
                        !listed.contains(&(state, event)),
                        "{state} {event}"
                    );
                }
            }
        }
    };
}

forbidden_pairs! {
    idle_plan_ready: Idle, PlanReady;
    idle_tool_succeeded: Idle, ToolSucceeded;
    idle_tool_failed: Idle, ToolFailed;
    idle_validation_passed: Idle, ValidationPassed;
    idle_validation_failed: Idle, ValidationFailed;
    idle_compensation_done: Idle, CompensationDone;
    idle_compensation_failed: Idle, CompensationFailed;
    idle_approval_requested: Idle, ApprovalRequested;
    idle_approval_granted: Idle, ApprovalGranted;
    idle_approval_denied: Idle, ApprovalDenied;
    idle_undo_requested: Idle, UndoRequested;
    planning_start_saga: Planning, StartSaga;
    planning_tool_succeeded: Planning, ToolSucceeded;
    planning_tool_failed: Planning, ToolFailed;
    planning_compensation_done: Planning, CompensationDone;
    planning_compensation_failed: Planning, CompensationFailed;
    planning_approval_requested: Planning, ApprovalRequested;
    planning_approval_granted: Planning, ApprovalGranted;
    planning_approval_denied: Planning, ApprovalDenied;
    planning_undo_requested: Planning, UndoRequested;
    acting_start_saga: Acting, StartSaga;
    acting_plan_ready: Acting, PlanReady;
    acting_validation_passed: Acting, ValidationPassed;
    acting_validation_failed: Acting, ValidationFailed;
    acting_compensation_done: Acting, CompensationDone;
    acting_compensation_failed: Acting, CompensationFailed;
    acting_approval_granted: Acting, ApprovalGranted;
    acting_approval_denied: Acting, ApprovalDenied;
    acting_undo_requested: Acting, UndoRequested;
    validating_start_saga: Validating, StartSaga;
    validating_plan_ready: Validating, PlanReady;
    validating_tool_succeeded: Validating, ToolSucceeded;
    validating_tool_failed: Validating, ToolFailed;
    validating_compensation_done: Validating, CompensationDone;
    validating_compensation_failed: Validating, CompensationFailed;
    validating_approval_granted: Validating, ApprovalGranted;
    validating_approval_denied: Validating, ApprovalDenied;
    validating_undo_requested: Validating, UndoRequested;
    compensating_start_saga: Compensating, StartSaga;
    compensating_plan_ready: Compensating, PlanReady;
    compensating_tool_succeeded: Compensating, ToolSucceeded;
    compensating_tool_failed: Compensating, ToolFailed;
    compensating_validation_passed: Compensating, ValidationPassed;
    compensating_validation_failed: Compensating, ValidationFailed;
    compensating_approval_requested: Compensating, ApprovalRequested;
    compensating_approval_granted: Compensating, ApprovalGranted;
    compensating_approval_denied: Compensating, ApprovalDenied;
    compensating_undo_requested: Compensating, UndoRequested;
    done_start_saga: Done, StartSaga;
    done_plan_ready: Done, PlanReady;
    done_tool_succeeded: Done, ToolSucceeded;
    done_tool_failed: Done, ToolFailed;
    done_validation_passed: Done, ValidationPassed;
    done_validation_failed: Done, ValidationFailed;
    done_compensation_done: Done, CompensationDone;
    done_compensation_failed: Done, CompensationFailed;
    done_approval_requested: Done, ApprovalRequested;
    done_approval_granted: Done, ApprovalGranted;
    done_approval_denied: Done, ApprovalDenied;
    failed_rolled_back_start_saga: FailedRolledBack, StartSaga;
    failed_rolled_back_plan_ready: FailedRolledBack, PlanReady;
    failed_rolled_back_tool_succeeded: FailedRolledBack, ToolSucceeded;
    failed_rolled_back_tool_failed: FailedRolledBack, ToolFailed;
    failed_rolled_back_validation_passed: FailedRolledBack, ValidationPassed;
    failed_rolled_back_validation_failed: FailedRolledBack, ValidationFailed;
    failed_rolled_back_compensation_done: FailedRolledBack, CompensationDone;
    failed_rolled_back_compensation_failed: FailedRolledBack, CompensationFailed;
    failed_rolled_back_approval_requested: FailedRolledBack, ApprovalRequested;
    failed_rolled_back_approval_granted: FailedRolledBack, ApprovalGranted;
    failed_rolled_back_approval_denied: FailedRolledBack, ApprovalDenied;
    failed_rolled_back_undo_requested: FailedRolledBack, UndoRequested;
    failed_rollback_partial_start_saga: FailedRollbackPartial, StartSaga;
    failed_rollback_partial_plan_ready: FailedRollbackPartial, PlanReady;
    failed_rollback_partial_tool_succeeded: FailedRollbackPartial, ToolSucceeded;
    failed_rollback_partial_tool_failed: FailedRollbackPartial, ToolFailed;
    failed_rollback_partial_validation_passed: FailedRollbackPartial, ValidationPassed;
    failed_rollback_partial_validation_failed: FailedRollbackPartial, ValidationFailed;
    failed_rollback_partial_compensation_done: FailedRollbackPartial, CompensationDone;
    failed_rollback_partial_compensation_failed: FailedRollbackPartial, CompensationFailed;
    failed_rollback_partial_approval_requested: FailedRollbackPartial, ApprovalRequested;
    failed_rollback_partial_approval_granted: FailedRollbackPartial, ApprovalGranted;
    failed_rollback_partial_approval_denied: FailedRollbackPartial, ApprovalDenied;
    failed_rollback_partial_undo_requested: FailedRollbackPartial, UndoRequested;
    awaiting_approval_start_saga: AwaitingApproval, StartSaga;
    awaiting_approval_plan_ready: AwaitingApproval, PlanReady;
    awaiting_approval_tool_succeeded: AwaitingApproval, ToolSucceeded;
    awaiting_approval_tool_failed: AwaitingApproval, ToolFailed;
    awaiting_approval_validation_passed: AwaitingApproval, ValidationPassed;
    awaiting_approval_validation_failed: AwaitingApproval, ValidationFailed;
    awaiting_approval_compensation_done: AwaitingApproval, CompensationDone;
    awaiting_approval_compensation_failed: AwaitingApproval, CompensationFailed;
    awaiting_approval_approval_requested: AwaitingApproval, ApprovalRequested;
    awaiting_approval_undo_requested: AwaitingApproval, UndoRequested;
    undone_start_saga: Undone, StartSaga;
    undone_plan_ready: Undone, PlanReady;
    undone_tool_succeeded: Undone, ToolSucceeded;
    undone_tool_failed: Undone, ToolFailed;
    undone_validation_passed: Undone, ValidationPassed;
    undone_validation_failed: Undone, ValidationFailed;
    undone_compensation_done: Undone, CompensationDone;
    undone_compensation_failed: Undone, CompensationFailed;
    undone_approval_requested: Undone, ApprovalRequested;
    undone_approval_granted: Undone, ApprovalGranted;
    undone_approval_denied: Undone, ApprovalDenied;
    undone_undo_requested: Undone, UndoRequested;
}
