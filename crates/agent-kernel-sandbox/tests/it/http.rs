//! The `[http]` rules: URLs, redirect targets and resolved addresses.

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

use agent_kernel_sandbox::{HttpSandbox, MAX_URL_BYTES, Policy, SandboxError};
use proptest::prelude::*;

/// What [`HttpSandbox::check_url`] should say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Allow,
    Deny,
    Invalid,
}

use Expect::{Allow, Deny, Invalid};

const ALLOW_DOMAINS: &str = r#"["example.com", "*.example.org", "Bücher.DE.", "10.1.2.3", "[::ffff:192.168.7.7]", "2001:db8::5"]"#;

fn sandbox_with(allow_domains: &str) -> HttpSandbox {
    let policy = Policy::from_toml_str(
        &format!("[http]\nallow_domains = {allow_domains}\nmax_response_bytes = 1000\n"),
        Path::new("."),
    )
    .expect("policy");
    HttpSandbox::new(&policy)
}

fn sandbox() -> HttpSandbox {
    sandbox_with(ALLOW_DOMAINS)
}

fn outcome(result: &Result<url::Url, SandboxError>) -> Expect {
    match result {
        Ok(_) => Allow,
        Err(error) if error.is_denied() => Deny,
        Err(error) if error.is_invalid_url() => Invalid,
        Err(error) => panic!("unexpected error kind: {error:?}"),
    }
}

#[track_caller]
fn check(url: &str, expected: Expect) {
    let result = sandbox().check_url(url);
    assert_eq!(outcome(&result), expected, "{url}: {result:?}");
    if let Err(error) = &result {
        let message = error.to_string();
        assert!(!message.is_empty());
        if expected == Deny {
            assert!(message.starts_with("request to `"), "{message}");
        }
    }
}

#[test]
fn url_table() {
    // Allowed names, in every spelling the URL standard treats as the same host.
    check("http://example.com/", Allow);
    check("https://example.com/a?b=c#d", Allow);
    check("HTTP://EXAMPLE.COM:8080/x", Allow);
    check("http://example.com./", Allow);
    check("http://ExAmPlE.cOm./", Allow);
    check("http://a.example.org/", Allow);
    check("http://deep.sub.example.org./", Allow);
    check("http://bücher.de/", Allow);
    check("http://xn--bcher-kva.de/", Allow);
    check("http://BÜCHER.de./", Allow);
    check("http://example%2Ecom/", Allow);
    // Listed addresses, in any notation.
    check("http://10.1.2.3/", Allow);
    check("http://0x0a.1.2.3/", Allow);
    check("http://012.1.2.3/", Allow);
    check("http://10.1.515/", Allow);
    check("http://167838211/", Allow);
    check("http://[::ffff:10.1.2.3]/", Allow);
    check("http://192.168.7.7/", Allow);
    check("http://[::ffff:c0a8:707]/", Allow);
    check("http://[2001:db8::5]:8443/", Allow);
    check("http://[2001:0db8:0:0:0:0:0:5]/", Allow);

    // Names not listed, suffix confusion, look-alikes.
    check("http://example.org/", Deny);
    check("http://evilexample.com/", Deny);
    check("http://evilexample.org/", Deny);
    check("http://example.com.evil/", Deny);
    check("http://example.com.evil.org/", Deny);
    check("http://example.org.evil/", Deny);
    check("http://example.com../", Deny);
    check("http://www.example.com/", Deny);
    check("http://ехample.com/", Deny);
    check("http://xn--xample-2of.com/", Deny);
    check("http://еxample.com/", Deny);
    check("http://xn--example-9ua.com/", Invalid);
    check("http://bucher.de/", Deny);
    check("http://localhost/", Deny);
    check("http://localhost./", Deny);
    // Addresses not listed, in every notation, special or not.
    check("http://127.0.0.1/", Deny);
    check("http://127.1/", Deny);
    check("http://2130706433/", Deny);
    check("http://0x7f000001/", Deny);
    check("http://0x7f.0.0.1/", Deny);
    check("http://0177.0.0.1/", Deny);
    check("http://017700000001/", Deny);
    check("http://127.0.0.1./", Deny);
    check("http://0/", Deny);
    check("http://0.0.0.0/", Deny);
    check("http://[::]/", Deny);
    check("http://[::1]/", Deny);
    check("http://[::ffff:127.0.0.1]/", Deny);
    check("http://[::ffff:7f00:1]/", Deny);
    check("http://[::127.0.0.1]/", Deny);
    check("http://169.254.169.254/latest/meta-data/", Deny);
    check("http://[fe80::1]/", Deny);
    check("http://[fd00::1]/", Deny);
    check("http://10.1.2.4/", Deny);
    check("http://192.168.0.1/", Deny);
    check("http://172.16.0.1/", Deny);
    check("http://100.64.0.1/", Deny);
    check("http://224.0.0.1/", Deny);
    check("http://255.255.255.255/", Deny);
    check("http://93.184.216.34/", Deny);
    check("http://[2001:db8::6]/", Deny);
    // Credentials, in every position.
    check("http://user@example.com/", Deny);
    check("http://user:pass@example.com/", Deny);
    check("http://:pass@example.com/", Deny);
    check("http://example.com@127.0.0.1/", Deny);
    check("http://example.com:80@127.0.0.1/", Deny);
    // Other schemes.
    check("ftp://example.com/", Deny);
    check("file:///etc/passwd", Deny);
    check("file://example.com/etc/passwd", Deny);
    check("gopher://example.com/", Deny);
    check("data:text/plain,hello", Deny);
    check("javascript:alert(1)", Deny);
    check("ws://example.com/", Deny);
    check("wss://example.com/", Deny);
    check("mailto:a@example.com", Deny);

    // Not URLs at all.
    check("", Invalid);
    check("example.com", Invalid);
    check("//example.com/", Invalid);
    check("http://", Invalid);
    check("http://256.0.0.1/", Invalid);
    check("http://[::1/", Invalid);
    check("http://exa mple.com/", Invalid);
    check(
        &format!("http://example.com/{}", "a".repeat(MAX_URL_BYTES)),
        Invalid,
    );
}

#[test]
fn the_parsed_url_has_the_normalized_host() {
    let http = sandbox();
    assert_eq!(
        http.check_url("http://0x0a.1.515/")
            .expect("listed")
            .as_str(),
        "http://10.1.2.3/"
    );
    assert_eq!(
        http.check_url("http://BÜCHER.de/x")
            .expect("listed")
            .as_str(),
        "http://xn--bcher-kva.de/x"
    );
}

#[test]
fn denials_name_the_url_and_the_reason() {
    let http = sandbox();
    let message = |url: &str| http.check_url(url).expect_err("denied").to_string();
    let text = message("http://0x7f000001:8080/");
    assert!(text.contains("`http://0x7f000001:8080/`"), "{text}");
    assert!(text.contains("127.0.0.1 (loopback)"), "{text}");
    let text = message("http://evilexample.com/");
    assert!(
        text.contains("the host `evilexample.com` is not in [http] allow_domains"),
        "{text}"
    );
    assert!(text.contains("*.example.org"), "{text}");
    let text = message("ftp://example.com/");
    assert!(text.contains("the scheme `ftp` is not allowed"), "{text}");
    let text = message("http://example.com@127.0.0.1/");
    assert!(text.contains("credentials"), "{text}");
    let text = message("http://93.184.216.34/");
    assert!(text.contains("the address 93.184.216.34"), "{text}");
}

#[test]
fn resolved_addresses() {
    let http = sandbox_with(r#"["example.com", "*.example.org", "localhost", "10.9.9.9"]"#);
    let ip = |text: &str| -> IpAddr { text.parse().expect("an address") };
    // Public addresses are fine for an allowed name.
    assert!(
        http.check_resolved("example.com", ip("93.184.216.34"))
            .is_ok()
    );
    assert!(
        http.check_resolved("EXAMPLE.com.", ip("2606:4700::1"))
            .is_ok()
    );
    assert!(http.check_resolved("a.example.org", ip("8.8.8.8")).is_ok());
    // Special addresses are denied unless listed ...
    for special in [
        "127.0.0.1",
        "::1",
        "::ffff:127.0.0.1",
        "10.0.0.1",
        "192.168.1.1",
        "172.20.0.1",
        "169.254.169.254",
        "fe80::1",
        "fd00::1",
        "0.0.0.0",
        "::",
        "100.64.1.1",
        "224.0.0.1",
        "255.255.255.255",
        "64:ff9b::7f00:1",
        "2002:a00:1::",
    ] {
        let error = http
            .check_resolved("example.com", ip(special))
            .expect_err(special);
        assert!(error.is_denied(), "{special}");
        let message = error.to_string();
        assert!(
            message.contains("request to `example.com` denied"),
            "{message}"
        );
        assert!(message.contains("special address"), "{message}");
    }
    // ... and allowed when listed, in either form.
    assert!(http.check_resolved("example.com", ip("10.9.9.9")).is_ok());
    assert!(
        http.check_resolved("example.com", ip("::ffff:10.9.9.9"))
            .is_ok()
    );
    // `localhost` listed allows loopback for `localhost` only.
    assert!(http.check_resolved("localhost", ip("127.0.0.1")).is_ok());
    assert!(http.check_resolved("LOCALHOST.", ip("127.0.0.2")).is_ok());
    assert!(http.check_resolved("localhost", ip("::1")).is_ok());
    assert!(
        http.check_resolved("localhost", ip("10.0.0.1"))
            .is_err_and(|e| e.is_denied())
    );
    assert!(
        http.check_resolved("example.com", ip("127.0.0.1"))
            .is_err_and(|e| e.is_denied())
    );
    // Without `localhost` listed, even localhost's loopback is denied.
    let strict = sandbox_with(r#"["localhost.example"]"#);
    assert!(
        strict
            .check_resolved("localhost.example", ip("127.0.0.1"))
            .is_err_and(|e| e.is_denied())
    );
    // A name that is not allowed is denied whatever it resolved to.
    assert!(
        http.check_resolved("evil.com", ip("93.184.216.34"))
            .is_err_and(|e| e.is_denied())
    );
    assert!(
        http.check_resolved("example.org", ip("93.184.216.34"))
            .is_err_and(|e| e.is_denied())
    );
}

#[test]
fn no_http_section_denies_everything_and_says_how_to_allow() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("sandbox.toml");
    std::fs::write(&file, "[fs]\nallow = []\n").expect("policy file");
    let from_file = HttpSandbox::new(&Policy::load(&file).expect("policy"));
    for http in [from_file, HttpSandbox::deny_all()] {
        assert!(!http.allows_network());
        assert_eq!(http.max_response_bytes(), 0);
        let error = http.check_url("https://example.com/").expect_err("denied");
        assert!(error.is_denied());
        let message = error.to_string();
        assert!(
            message.contains("no network access is allowed"),
            "{message}"
        );
        assert!(message.contains("[http]"), "{message}");
        assert!(message.contains("allow_domains"), "{message}");
        assert!(message.contains("--sandbox FILE"), "{message}");
        assert!(
            http.check_resolved("example.com", IpAddr::V4(Ipv4Addr::new(8, 8, 8, 8)))
                .is_err_and(|e| e.is_denied())
        );
        assert!(
            http.check_response_bytes("https://example.com/", 0)
                .is_err_and(|e| e.is_denied())
        );
    }
    let message = HttpSandbox::deny_all()
        .check_url("https://example.com/")
        .expect_err("denied")
        .to_string();
    assert!(message.contains("no sandbox policy was given"), "{message}");
    let with_section = sandbox_with("[]");
    assert!(with_section.allows_network());
    let message = with_section
        .check_url("https://example.com/")
        .expect_err("denied")
        .to_string();
    assert!(message.contains("it lists nothing"), "{message}");
}

#[test]
fn response_size_limit() {
    let http = sandbox();
    assert_eq!(http.max_response_bytes(), 1000);
    assert!(
        http.check_response_bytes("http://example.com/", 1000)
            .is_ok()
    );
    let error = http
        .check_response_bytes("http://example.com/", 1001)
        .expect_err("too large");
    assert!(error.is_denied());
    let message = error.to_string();
    assert!(message.contains("`http://example.com/`"), "{message}");
    assert!(message.contains("1001 bytes"), "{message}");
    assert!(message.contains("max_response_bytes"), "{message}");
}

#[test]
fn policy_entries_are_normalized_or_refused() {
    let parse = |allow_domains: &str| {
        Policy::from_toml_str(
            &format!("[http]\nallow_domains = {allow_domains}\n"),
            Path::new("."),
        )
    };
    let policy = parse(r#"["Example.COM.", "*.Example.org", "bücher.de", "0x7f.1", "[::ffff:10.0.0.1]", "::1", "example.com"]"#)
        .expect("policy");
    let http = policy.http().expect("[http]");
    assert_eq!(
        http.normalized_allow_domains(),
        [
            "example.com",
            "*.example.org",
            "xn--bcher-kva.de",
            "127.0.0.1",
            "10.0.0.1",
            "::1"
        ]
    );
    // As written, for display.
    assert_eq!(http.allow_domains()[0], "Example.COM.");
    for bad in [
        r#"["*"]"#,
        r#"["*."]"#,
        r#"["a.*.example.org"]"#,
        r#"["*.10.0.0.1"]"#,
        r#"["https://example.com"]"#,
        r#"["example.com:443"]"#,
        r#"["example.com/path"]"#,
        r#"["user@example.com"]"#,
        r#"["300.1.1.1"]"#,
        r#"["[::1"]"#,
    ] {
        let error = parse(bad).expect_err(bad);
        let message = error.to_string();
        assert!(message.contains("[http] allow_domains entry"), "{message}");
        assert!(message.contains("is invalid"), "{message}");
    }
}

/// The four IPv4 notations the URL standard reads, for `address`.
fn notations(address: Ipv4Addr) -> Vec<String> {
    let [a, b, c, d] = address.octets();
    let n = u32::from(address);
    vec![
        format!("{a}.{b}.{c}.{d}"),
        format!("{n}"),
        format!("0x{n:x}"),
        format!("0{a:o}.0{b:o}.0{c:o}.0{d:o}"),
        format!("0x{a:x}.0x{b:x}.0x{c:x}.0x{d:x}"),
        format!(
            "{a}.{}",
            (u32::from(b) << 16) | (u32::from(c) << 8) | u32::from(d)
        ),
        format!("{a}.{b}.{}", (u32::from(c) << 8) | u32::from(d)),
        format!("[::ffff:{a}.{b}.{c}.{d}]"),
    ]
}

proptest! {
    /// Every notation of an address gets the same ruling as its usual form, and only a
    /// listed address is allowed.
    #[test]
    fn every_notation_of_an_address_is_ruled_alike(
        listed in any::<u32>(),
        asked in prop_oneof![any::<u32>(), Just(0x7f00_0001u32)],
        ask_listed in any::<bool>(),
    ) {
        let listed = Ipv4Addr::from(listed);
        let asked = if ask_listed { listed } else { Ipv4Addr::from(asked) };
        let http = sandbox_with(&format!(r#"["{listed}"]"#));
        let expected = if asked == listed { Allow } else { Deny };
        for host in notations(asked) {
            let url = format!("http://{host}:8080/path");
            let result = http.check_url(&url);
            prop_assert_eq!(outcome(&result), expected, "{} {:?}", url, result);
        }
    }
}

#[test]
fn allow_ports_limits_every_url_to_the_listed_ports() {
    let policy = Policy::from_toml_str(
        "[http]\nallow_domains = [\"example.com\"]\nallow_ports = [8443, 443, 443]\n",
        Path::new("."),
    )
    .expect("policy");
    assert_eq!(
        policy.http().expect("[http]").allow_ports(),
        Some(&[443_u16, 8443][..]),
        "sorted, duplicates removed"
    );
    let sandbox = HttpSandbox::new(&policy);
    for (url, expect) in [
        ("https://example.com/", Allow),
        ("https://example.com:443/", Allow),
        ("https://example.com:8443/x", Allow),
        // No port: the scheme's, 80, which is not listed.
        ("http://example.com/", Deny),
        ("http://example.com:8443/", Allow),
        ("https://example.com:22/", Deny),
        ("https://example.com:0443/", Allow),
        ("https://example.com:65535/", Deny),
    ] {
        assert_eq!(outcome(&sandbox.check_url(url)), expect, "{url}");
    }
    let message = sandbox
        .check_url("https://example.com:22/")
        .expect_err("denied")
        .to_string();
    assert!(
        message.contains("the port 22 is not in [http] allow_ports (443, 8443)"),
        "{message}"
    );
    // Without allow_ports, every port of an allowed host is allowed.
    assert_eq!(
        outcome(&sandbox_with(r#"["example.com"]"#).check_url("https://example.com:22/")),
        Allow
    );
    for (bad, needle) in [
        ("[]", "allow_ports is empty"),
        ("[0]", "port 0"),
        ("[70000]", "expected u16"),
        ("[\"443\"]", "expected u16"),
    ] {
        let error = Policy::from_toml_str(
            &format!("[http]\nallow_domains = [\"example.com\"]\nallow_ports = {bad}\n"),
            Path::new("."),
        )
        .expect_err(bad);
        assert!(error.to_string().contains(needle), "{bad}: {error}");
    }
}
