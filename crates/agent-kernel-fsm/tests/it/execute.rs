//! Which tools may execute in which state (spec §3.5 rules 2 and 3).

use agent_kernel_api::{EffectClass, SagaState};
use agent_kernel_fsm::{Guardrail, Rule};

fn check(state: SagaState, effect: EffectClass, expected: Result<(), Rule>) {
    let actual = Guardrail::builtin()
        .may_execute(state, effect)
        .map_err(|denial| denial.rule);
    assert_eq!(actual, expected, "{state} {effect}");
}

#[test]
fn execution_rules() {
    use EffectClass::{Mutating, ReadOnly};
    use SagaState::*;
    check(Acting, Mutating, Ok(()));
    check(Acting, ReadOnly, Ok(()));
    check(Planning, ReadOnly, Ok(()));
    check(Planning, Mutating, Err(Rule::ReadOnlyState));
    check(Validating, ReadOnly, Ok(()));
    check(Validating, Mutating, Err(Rule::ReadOnlyState));
    check(Compensating, ReadOnly, Err(Rule::CompensatingBlocksExecute));
    check(Compensating, Mutating, Err(Rule::CompensatingBlocksExecute));
    check(Idle, ReadOnly, Err(Rule::NoExecutionState));
    for terminal in [Done, FailedRolledBack, FailedRollbackPartial] {
        check(terminal, ReadOnly, Err(Rule::Terminal));
        check(terminal, Mutating, Err(Rule::Terminal));
    }
}

#[test]
fn a_denial_names_state_tool_and_rule() {
    let denial = Guardrail::builtin()
        .may_execute(SagaState::Validating, EffectClass::Mutating)
        .expect_err("denied")
        .with_tool("fs.write");
    assert_eq!(
        denial.to_string(),
        "fsm denied: in state Validating, tool `fs.write`: only read-only tools execute in this state"
    );
}
