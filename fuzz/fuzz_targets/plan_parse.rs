//! The plan parser on arbitrary input: never panics; an accepted plan respects its bounds.

#![no_main]

use agent_kernel_api::{MAX_PLAN_STEPS, Plan};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(plan) = Plan::from_json(text) {
        assert!(!plan.steps.is_empty() && plan.steps.len() <= MAX_PLAN_STEPS);
        assert!(plan.steps.iter().all(|step| step.args.is_object()));
    }
});
