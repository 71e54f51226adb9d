//! The HTTP sandbox's URL ruling on arbitrary input: never panics, and whatever it allows
//! is http(s), has no credentials, names an allowed host and, under a policy with
//! `allow_ports`, a listed port.

#![no_main]

use std::path::Path;
use std::sync::OnceLock;

use agent_kernel_sandbox::{HttpSandbox, Policy};
use libfuzzer_sys::fuzz_target;

fn sandbox() -> &'static HttpSandbox {
    static SANDBOX: OnceLock<HttpSandbox> = OnceLock::new();
    SANDBOX.get_or_init(|| {
        let policy = Policy::from_toml_str(
            "[http]\nallow_domains = [\"example.com\", \"*.example.org\", \"203.0.113.7\"]\n",
            Path::new("/"),
        )
        .expect("the fuzz policy is valid");
        HttpSandbox::new(&policy)
    })
}

/// The same hosts, with `allow_ports = [443, 8443]`.
fn sandbox_with_ports() -> &'static HttpSandbox {
    static SANDBOX: OnceLock<HttpSandbox> = OnceLock::new();
    SANDBOX.get_or_init(|| {
        let policy = Policy::from_toml_str(
            "[http]\nallow_domains = [\"example.com\", \"*.example.org\", \"203.0.113.7\"]\nallow_ports = [443, 8443]\n",
            Path::new("/"),
        )
        .expect("the fuzz policy is valid");
        HttpSandbox::new(&policy)
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(url) = sandbox_with_ports().check_url(text) {
        let port = url.port_or_known_default();
        assert!(matches!(port, Some(443 | 8443)), "{text:?} allowed port {port:?}");
        assert!(
            sandbox().check_url(text).is_ok(),
            "{text:?}: allowed with a port list but not without"
        );
    }
    if let Ok(url) = sandbox().check_url(text) {
        assert!(matches!(url.scheme(), "http" | "https"), "{text:?}: scheme");
        assert!(
            url.username().is_empty() && url.password().is_none(),
            "{text:?}: credentials"
        );
        let host = url.host_str().expect("an allowed URL has a host");
        let host = host.trim_end_matches('.');
        assert!(
            host == "example.com" || host.ends_with(".example.org") || host == "203.0.113.7",
            "{text:?} allowed host {host:?}"
        );
    }
});
