//! The sandbox policy parser on arbitrary input: never panics.

#![no_main]

use std::path::Path;

use agent_kernel_sandbox::Policy;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // Roots must exist to load; `/` always does, so allow lists naming it can succeed.
    let _ = Policy::from_toml_str(text, Path::new("/"));
});
