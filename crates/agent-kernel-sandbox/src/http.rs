//! [`HttpSandbox`]: rules on every URL and resolved address a network tool may reach.

use std::net::IpAddr;

use url::Url;

use crate::hosts::{HostRule, NormalHost, canonical_address, normalize_host, special_kind};
use crate::{Policy, SandboxError};

/// The longest URL [`HttpSandbox::check_url`] accepts, in bytes.
pub const MAX_URL_BYTES: usize = 8192;

/// The longest piece of a URL or host quoted in an error message, in characters.
const SHOWN_CHARS_MAX: usize = 256;

/// The most `allow_domains` entries quoted in an error message.
const SHOWN_RULES_MAX: usize = 8;

/// The network side of a [`Policy`]: which URLs a network tool may request and which
/// addresses it may connect to.
///
/// It does no I/O: it rules on text and on addresses the caller resolved.
/// A tool calls [`check_url`](Self::check_url) on the first URL and on every redirect hop
/// (before following it), and [`check_resolved`](Self::check_resolved) on every address a
/// name resolves to (before connecting), and keeps the body within
/// [`max_response_bytes`](Self::max_response_bytes).
///
/// # Rules
///
/// - Only `http` and `https`; URLs with credentials (`user:pass@`) are refused.
/// - With `allow_ports`, only those ports (a URL without a port names 80 or 443).
/// - Hosts are compared after normalization: lowercase, IDNA (punycode), one trailing dot
///   removed. `allow_domains` entries are normalized the same way when the policy is loaded.
/// - A domain is allowed if it equals an entry, or ends in `.suffix` for an entry
///   `*.suffix` (the bare `suffix` is not matched by `*.suffix`).
/// - A host that is an IP address, in any notation the URL standard accepts (`2130706433`,
///   `0x7f000001`, `0177.0.0.1`, `127.1`, `[::ffff:127.0.0.1]`), is allowed only if that
///   address is listed; IPv4-mapped IPv6 addresses count as their IPv4 address.
/// - An address an allowed name resolves to is allowed if it is an ordinary public address,
///   if it is listed itself, or if it is loopback, the name is `localhost` and `localhost` is
///   listed. Loopback, private, link-local, unspecified, broadcast, multicast, shared,
///   documentation and reserved addresses are denied otherwise.
#[derive(Debug)]
pub struct HttpSandbox {
    access: Option<Access>,
    origin: Option<String>,
}

#[derive(Debug)]
struct Access {
    rules: Vec<HostRule>,
    allow_ports: Option<Vec<u16>>,
    max_response_bytes: u64,
}

impl HttpSandbox {
    /// The network side of `policy`.
    ///
    /// A policy without `[http]` gives a sandbox that denies every URL.
    pub fn new(policy: &Policy) -> HttpSandbox {
        let origin = policy.source().map(|source| source.display().to_string());
        let access = policy.http().map(|http| Access {
            rules: http.host_rules().to_vec(),
            allow_ports: http.allow_ports().map(<[u16]>::to_vec),
            max_response_bytes: http.max_response_bytes(),
        });
        HttpSandbox { access, origin }
    }

    /// The sandbox that denies every URL.
    pub fn deny_all() -> HttpSandbox {
        HttpSandbox {
            access: None,
            origin: None,
        }
    }

    /// Whether any network access is allowed (the policy has an `[http]` section).
    pub fn allows_network(&self) -> bool {
        self.access.is_some()
    }

    /// The largest response body in bytes; 0 when network access is denied.
    pub fn max_response_bytes(&self) -> u64 {
        self.access
            .as_ref()
            .map_or(0, |access| access.max_response_bytes)
    }

    /// Rules on `url`: parses it, and checks its scheme, its credentials and its host.
    ///
    /// Returns the parsed URL, which is what the caller should request (its host is
    /// normalized; an IP address in any notation is written in its usual form).
    ///
    /// # Errors
    ///
    /// [`SandboxError::InvalidUrl`] when `url` is longer than [`MAX_URL_BYTES`] or is not a
    /// valid absolute URL; a denial ([`SandboxError::is_denied`]) naming the URL and the
    /// reason when the policy forbids it.
    pub fn check_url(&self, url: &str) -> Result<Url, SandboxError> {
        let invalid = |reason: String| SandboxError::InvalidUrl {
            url: shown(url),
            reason,
        };
        if url.len() > MAX_URL_BYTES {
            return Err(invalid(format!(
                "it is {} bytes long; the limit is {MAX_URL_BYTES}",
                url.len()
            )));
        }
        let parsed = Url::parse(url).map_err(|error| invalid(error.to_string()))?;
        let denied = |reason: String| SandboxError::HostDenied {
            target: shown(url),
            reason,
        };
        let Some(access) = &self.access else {
            return Err(denied(self.no_access_reason()));
        };
        let scheme = parsed.scheme();
        if scheme != "http" && scheme != "https" {
            return Err(denied(format!(
                "the scheme `{}` is not allowed (only http and https are)",
                shown(scheme)
            )));
        }
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(denied(
                "it carries credentials (`user:password@` before the host), which are refused"
                    .to_owned(),
            ));
        }
        let Some(host) = parsed.host() else {
            return Err(invalid("it has no host".to_owned()));
        };
        if let Some(ports) = &access.allow_ports {
            // http and https always have a port: the URL's, or the scheme's default.
            let port = parsed.port_or_known_default().unwrap_or(0);
            if !ports.contains(&port) {
                let listed: Vec<String> = ports.iter().map(u16::to_string).collect();
                return Err(denied(format!(
                    "the port {port} is not in [http] allow_ports ({})",
                    listed.join(", ")
                )));
            }
        }
        match normalize_host(host) {
            NormalHost::Domain(domain) => {
                if domain.is_empty() {
                    return Err(invalid("its host is empty".to_owned()));
                }
                if !access.allows_domain(&domain) {
                    return Err(denied(access.unlisted(&domain)));
                }
            }
            NormalHost::Address(address) => {
                if !access.lists_address(address) {
                    let what = match special_kind(address) {
                        Some(kind) => format!("the special address {address} ({kind})"),
                        None => format!("the address {address}"),
                    };
                    return Err(denied(format!(
                        "its host is {what}, which [http] allow_domains does not list \
                         (an address is allowed only when listed exactly)"
                    )));
                }
            }
        }
        Ok(parsed)
    }

    /// Rules on `address`, which the name `host` resolved to, before anything connects to it.
    ///
    /// `host` must be a name [`check_url`](Self::check_url) allowed; it is checked again.
    ///
    /// # Errors
    ///
    /// A denial naming the host and the address when `host` is not allowed, or when `address`
    /// is special (loopback, private, link-local, ...) and neither listed itself nor loopback
    /// for a listed `localhost`.
    pub fn check_resolved(&self, host: &str, address: IpAddr) -> Result<(), SandboxError> {
        let (access, domain) = self.check_host(host)?;
        let denied = |reason: String| SandboxError::HostDenied {
            target: shown(host),
            reason,
        };
        let address = canonical_address(address);
        let Some(kind) = special_kind(address) else {
            return Ok(());
        };
        if access.lists_address(address) {
            return Ok(());
        }
        if domain == "localhost"
            && address.is_loopback()
            && access
                .rules
                .contains(&HostRule::Exact("localhost".to_owned()))
        {
            return Ok(());
        }
        Err(denied(format!(
            "it resolved to the special address {address} ({kind}), which [http] \
             allow_domains does not list (list the address itself to allow it)"
        )))
    }

    /// Rules on a host name alone, before it is resolved: it must match `[http]
    /// allow_domains` once normalized (lowercase, IDNA, one trailing dot removed).
    ///
    /// A resolver calls this before asking anyone about the name, so a name the policy does
    /// not allow is never even looked up.
    ///
    /// # Errors
    ///
    /// A denial naming the host when it is not allowed or is not a valid host name.
    pub fn check_name(&self, host: &str) -> Result<(), SandboxError> {
        self.check_host(host).map(|_| ())
    }

    /// The access rules and the normalized name, when `host` is an allowed name.
    fn check_host(&self, host: &str) -> Result<(&Access, String), SandboxError> {
        let denied = |reason: String| SandboxError::HostDenied {
            target: shown(host),
            reason,
        };
        let Some(access) = &self.access else {
            return Err(denied(self.no_access_reason()));
        };
        // The same parser as for a URL's host, so `BÜCHER.de.` and `xn--bcher-kva.de` agree.
        let domain = match url::Host::parse(host).map(normalize_host) {
            Ok(NormalHost::Domain(domain)) => domain,
            Ok(NormalHost::Address(address)) => {
                return Err(denied(format!(
                    "`{address}` is an address, not a host name"
                )));
            }
            Err(error) => return Err(denied(format!("it is not a valid host name: {error}"))),
        };
        if domain.is_empty() || !access.allows_domain(&domain) {
            return Err(denied(access.unlisted(&domain)));
        }
        Ok((access, domain))
    }

    /// Checks that a response body of at least `n_bytes` bytes from `url` may be read.
    ///
    /// # Errors
    ///
    /// [`SandboxError::ResponseTooLarge`] (a denial) when `n_bytes` exceeds
    /// [`max_response_bytes`](Self::max_response_bytes), and a denial when network access is
    /// not allowed at all.
    pub fn check_response_bytes(&self, url: &str, n_bytes: u64) -> Result<(), SandboxError> {
        let Some(access) = &self.access else {
            return Err(SandboxError::HostDenied {
                target: shown(url),
                reason: self.no_access_reason(),
            });
        };
        if n_bytes > access.max_response_bytes {
            return Err(SandboxError::ResponseTooLarge {
                url: shown(url),
                len: n_bytes,
                max_bytes: access.max_response_bytes,
            });
        }
        Ok(())
    }

    fn no_access_reason(&self) -> String {
        let why = match &self.origin {
            Some(origin) => format!("the sandbox policy {origin} has no [http] section"),
            None => "no sandbox policy was given".to_owned(),
        };
        format!(
            "no network access is allowed: {why}; pass a policy with --sandbox FILE whose \
             [http] section lists the hosts in allow_domains (e.g. allow_domains = \
             [\"example.com\"])"
        )
    }
}

impl Access {
    fn allows_domain(&self, domain: &str) -> bool {
        self.rules.iter().any(|rule| match rule {
            HostRule::Exact(exact) => exact == domain,
            HostRule::Suffix(suffix) => domain
                .strip_suffix(suffix.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            HostRule::Address(_) => false,
        })
    }

    fn lists_address(&self, address: IpAddr) -> bool {
        let address = canonical_address(address);
        self.rules
            .iter()
            .any(|rule| matches!(rule, HostRule::Address(listed) if *listed == address))
    }

    /// Why `domain` is denied: `allow_domains` does not list it.
    fn unlisted(&self, domain: &str) -> String {
        format!(
            "the host `{}` is not in [http] allow_domains ({})",
            shown(domain),
            self.listing()
        )
    }

    /// The entries for a message, the first few only.
    fn listing(&self) -> String {
        if self.rules.is_empty() {
            return "it lists nothing".to_owned();
        }
        let mut shown: Vec<String> = self
            .rules
            .iter()
            .take(SHOWN_RULES_MAX)
            .map(ToString::to_string)
            .collect();
        if self.rules.len() > SHOWN_RULES_MAX {
            shown.push(format!("and {} more", self.rules.len() - SHOWN_RULES_MAX));
        }
        shown.join(", ")
    }
}

/// `text` made fit for a one-line message: control characters escaped, shortened.
fn shown(text: &str) -> String {
    let mut out: String = text.chars().take(SHOWN_CHARS_MAX).collect::<String>();
    if out.len() < text.len() {
        out.push('…');
    }
    out.escape_debug().to_string()
}
