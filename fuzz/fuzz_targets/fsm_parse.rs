//! The FSM table loader on arbitrary input: never panics; an accepted table can start a saga
//! and lets every failure roll back.

#![no_main]

use agent_kernel_api::SagaState;
use agent_kernel_fsm::{Event, Facts, Guardrail};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(fsm) = Guardrail::from_toml_str(text) {
        let failed = Facts {
            any_compensation_failed: true,
            ..Facts::default()
        };
        assert_eq!(
            fsm.apply(SagaState::Compensating, Event::CompensationFailed, &failed),
            Ok(SagaState::FailedRollbackPartial)
        );
        assert_eq!(fsm.to_toml().is_empty(), false);
    }
});
