//! Host rules of `[http] allow_domains`, and the classification of special addresses.
//!
//! Everything here is pure: no resolution, no network.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use url::Host;

/// One `[http] allow_domains` entry, normalized the way the `url` crate normalizes a URL's
/// host: lowercase, IDNA (punycode) applied, one trailing dot removed, IP addresses in every
/// notation parsed, IPv4-mapped IPv6 addresses turned into their IPv4 address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HostRule {
    /// A domain allowed exactly (`example.com`).
    Exact(String),
    /// `*.` and a domain: any host ending in `.` and that domain (not the domain itself).
    Suffix(String),
    /// An IP address, allowed exactly.
    Address(IpAddr),
}

impl HostRule {
    /// Parses one entry as written in the policy.
    ///
    /// The error says what is wrong, for a message naming the entry.
    pub(crate) fn parse(entry: &str) -> Result<HostRule, String> {
        if entry.contains('%') {
            return Err("percent-encoding is not allowed in a host".to_owned());
        }
        if let Some(suffix) = entry.strip_prefix("*.") {
            if suffix.contains('*') {
                return Err(
                    "a wildcard may only be the whole first label (`*.example.org`)".to_owned(),
                );
            }
            return match parse_host(suffix)? {
                NormalHost::Domain(domain) => Ok(HostRule::Suffix(domain)),
                NormalHost::Address(address) => Err(format!(
                    "a wildcard needs a domain after `*.`, not the address {address}"
                )),
            };
        }
        if entry.contains('*') {
            return Err(
                "a wildcard may only be the whole first label (`*.example.org`)".to_owned(),
            );
        }
        // Bare IPv6 addresses (`::1`) are accepted without brackets for convenience.
        if let Ok(address) = entry.parse::<Ipv6Addr>() {
            return Ok(HostRule::Address(canonical_address(IpAddr::V6(address))));
        }
        match parse_host(entry)? {
            NormalHost::Domain(domain) => Ok(HostRule::Exact(domain)),
            NormalHost::Address(address) => Ok(HostRule::Address(address)),
        }
    }
}

impl fmt::Display for HostRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostRule::Exact(domain) => f.write_str(domain),
            HostRule::Suffix(suffix) => write!(f, "*.{suffix}"),
            HostRule::Address(address) => write!(f, "{address}"),
        }
    }
}

/// A host after normalization.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NormalHost {
    /// A domain name: lowercase ASCII (punycode), without a trailing dot.
    Domain(String),
    /// An IP address, IPv4-mapped IPv6 turned into IPv4.
    Address(IpAddr),
}

/// Parses and normalizes a host as the `url` crate does for `http` URLs.
fn parse_host(text: &str) -> Result<NormalHost, String> {
    let host = Host::parse(text).map_err(|error| format!("not a valid host: {error}"))?;
    Ok(normalize_host(host))
}

/// Normalizes a host the `url` crate already parsed (lowercased, IDNA applied, every IPv4
/// notation read as an address).
pub(crate) fn normalize_host<S: AsRef<str>>(host: Host<S>) -> NormalHost {
    match host {
        Host::Domain(domain) => NormalHost::Domain(normalize_domain(domain.as_ref())),
        Host::Ipv4(address) => NormalHost::Address(IpAddr::V4(address)),
        Host::Ipv6(address) => NormalHost::Address(canonical_address(IpAddr::V6(address))),
    }
}

/// Lowercases a domain and removes one trailing dot (`Example.COM.` is `example.com`).
fn normalize_domain(domain: &str) -> String {
    let lower = domain.to_ascii_lowercase();
    match lower.strip_suffix('.') {
        Some(stripped) => stripped.to_owned(),
        None => lower,
    }
}

/// An IPv4-mapped IPv6 address (`::ffff:127.0.0.1`) as its IPv4 address; any other address
/// as it is.
pub(crate) fn canonical_address(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        IpAddr::V4(_) => address,
    }
}

/// What kind of special address `address` is, or `None` for an ordinary public address.
///
/// Special means anything a request from this machine should not reach by accident: loopback,
/// private and unique-local, link-local, unspecified, broadcast, multicast, shared (carrier-grade
/// NAT), documentation, benchmarking and reserved ranges.
/// IPv6 forms that embed an IPv4 address (IPv4-mapped, IPv4-compatible, NAT64, 6to4) are
/// classified by the embedded address.
pub(crate) fn special_kind(address: IpAddr) -> Option<&'static str> {
    match address {
        IpAddr::V4(v4) => special_kind_v4(v4),
        IpAddr::V6(v6) => special_kind_v6(v6),
    }
}

fn special_kind_v4(address: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = address.octets();
    if address.is_unspecified() {
        Some("unspecified")
    } else if address.is_broadcast() {
        Some("broadcast")
    } else if address.is_loopback() {
        Some("loopback")
    } else if address.is_private() {
        Some("private")
    } else if address.is_link_local() {
        Some("link-local")
    } else if address.is_multicast() {
        Some("multicast")
    } else if address.is_documentation() {
        Some("documentation")
    } else if a == 0 {
        // 0.0.0.0/8, "this network": some systems route it to the local host.
        Some("this-network")
    } else if a == 100 && (64..128).contains(&b) {
        Some("shared (carrier-grade NAT)")
    } else if a == 198 && (b == 18 || b == 19) {
        Some("benchmarking")
    } else if a == 192 && b == 0 && c == 0 {
        Some("IETF protocol assignment")
    } else if a >= 240 {
        Some("reserved")
    } else {
        None
    }
}

fn special_kind_v6(address: Ipv6Addr) -> Option<&'static str> {
    if let Some(v4) = address.to_ipv4_mapped() {
        return special_kind_v4(v4);
    }
    let segments = address.segments();
    let embedded_low = Ipv4Addr::new(
        (segments[6] >> 8) as u8,
        segments[6] as u8,
        (segments[7] >> 8) as u8,
        segments[7] as u8,
    );
    if address.is_unspecified() {
        Some("unspecified")
    } else if address.is_loopback() {
        Some("loopback")
    } else if segments[..6] == [0; 6] {
        // ::/96, IPv4-compatible (deprecated): classified by the embedded address.
        special_kind_v4(embedded_low).map(|_| "IPv4-compatible form of a special IPv4 address")
    } else if segments[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        // 64:ff9b::/96, NAT64: a gateway forwards to the embedded IPv4 address.
        special_kind_v4(embedded_low).map(|_| "NAT64 form of a special IPv4 address")
    } else if segments[0] == 0x64 && segments[1] == 0xff9b && segments[2] == 1 {
        Some("local-use NAT64")
    } else if segments[0] == 0x2002 {
        // 2002::/16, 6to4: the IPv4 address sits in the next 32 bits.
        let embedded = Ipv4Addr::new(
            (segments[1] >> 8) as u8,
            segments[1] as u8,
            (segments[2] >> 8) as u8,
            segments[2] as u8,
        );
        special_kind_v4(embedded).map(|_| "6to4 form of a special IPv4 address")
    } else if segments[0] & 0xfe00 == 0xfc00 {
        Some("unique local, private")
    } else if segments[0] & 0xffc0 == 0xfe80 {
        Some("link-local")
    } else if segments[0] & 0xffc0 == 0xfec0 {
        Some("site-local")
    } else if segments[0] & 0xff00 == 0xff00 {
        Some("multicast")
    } else if segments[0] == 0x2001 && segments[1] == 0x0db8 {
        Some("documentation")
    } else if segments[0] == 0x3fff && segments[1] & 0xf000 == 0 {
        // 3fff::/20 (RFC 9637): the first 20 bits are 0x3fff0.
        Some("documentation")
    } else if segments[0] == 0x2001 && segments[1] < 0x0200 {
        // 2001::/23: Teredo, benchmarking, ORCHID and other protocol assignments.
        Some("IETF protocol assignment")
    } else if segments[..4] == [0x0100, 0, 0, 0] {
        Some("discard-only")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(text: &str) -> Option<&'static str> {
        special_kind(text.parse().expect("an address"))
    }

    #[test]
    fn special_ipv4_ranges() {
        for (text, expected) in [
            ("0.0.0.0", Some("unspecified")),
            ("0.1.2.3", Some("this-network")),
            ("10.0.0.1", Some("private")),
            ("172.16.0.1", Some("private")),
            ("172.31.255.255", Some("private")),
            ("172.32.0.1", None),
            ("192.168.1.1", Some("private")),
            ("100.64.0.1", Some("shared (carrier-grade NAT)")),
            ("100.127.255.255", Some("shared (carrier-grade NAT)")),
            ("100.128.0.1", None),
            ("127.0.0.1", Some("loopback")),
            ("127.255.0.9", Some("loopback")),
            ("169.254.169.254", Some("link-local")),
            ("192.0.0.8", Some("IETF protocol assignment")),
            ("192.0.2.1", Some("documentation")),
            ("198.51.100.1", Some("documentation")),
            ("203.0.113.1", Some("documentation")),
            ("198.18.0.1", Some("benchmarking")),
            ("224.0.0.1", Some("multicast")),
            ("240.0.0.1", Some("reserved")),
            ("255.255.255.255", Some("broadcast")),
            ("93.184.216.34", None),
            ("8.8.8.8", None),
        ] {
            assert_eq!(kind(text), expected, "{text}");
        }
    }

    #[test]
    fn special_ipv6_ranges() {
        for (text, expected) in [
            ("::", Some("unspecified")),
            ("::1", Some("loopback")),
            ("::ffff:127.0.0.1", Some("loopback")),
            ("::ffff:10.1.2.3", Some("private")),
            ("::ffff:8.8.8.8", None),
            (
                "::127.0.0.1",
                Some("IPv4-compatible form of a special IPv4 address"),
            ),
            (
                "64:ff9b::a00:1",
                Some("NAT64 form of a special IPv4 address"),
            ),
            ("64:ff9b::808:808", None),
            ("64:ff9b:1::1", Some("local-use NAT64")),
            ("2002:7f00:1::", Some("6to4 form of a special IPv4 address")),
            ("2002:808:808::", None),
            ("fc00::1", Some("unique local, private")),
            ("fd12:3456::1", Some("unique local, private")),
            ("fe80::1", Some("link-local")),
            ("febf::1", Some("link-local")),
            ("fec0::1", Some("site-local")),
            ("ff02::1", Some("multicast")),
            ("2001:db8::1", Some("documentation")),
            ("3fff::1", Some("documentation")),
            ("3fff:0fff::1", Some("documentation")),
            ("3fff:1000::1", None),
            ("3ff0::1", None),
            ("2001::1", Some("IETF protocol assignment")),
            ("100::1", Some("discard-only")),
            ("2606:4700::1111", None),
            ("2001:4860:4860::8888", None),
        ] {
            assert_eq!(kind(text), expected, "{text}");
        }
    }

    #[test]
    fn rules_are_normalized() {
        for (entry, expected) in [
            ("Example.COM", HostRule::Exact("example.com".to_owned())),
            ("example.com.", HostRule::Exact("example.com".to_owned())),
            ("*.Example.org", HostRule::Suffix("example.org".to_owned())),
            ("bücher.de", HostRule::Exact("xn--bcher-kva.de".to_owned())),
            ("localhost", HostRule::Exact("localhost".to_owned())),
            (
                "127.0.0.1",
                HostRule::Address("127.0.0.1".parse().expect("ip")),
            ),
            (
                "0x7f.1",
                HostRule::Address("127.0.0.1".parse().expect("ip")),
            ),
            ("::1", HostRule::Address("::1".parse().expect("ip"))),
            ("[::1]", HostRule::Address("::1".parse().expect("ip"))),
            (
                "[::ffff:127.0.0.1]",
                HostRule::Address("127.0.0.1".parse().expect("ip")),
            ),
        ] {
            assert_eq!(HostRule::parse(entry), Ok(expected), "{entry}");
        }
    }

    #[test]
    fn bad_rules_are_refused() {
        for entry in [
            "*",
            "*.",
            "*.*.example.org",
            "a.*.example.org",
            "ex*ample.com",
            "*.127.0.0.1",
            "http://example.com",
            "example.com:80",
            "example.com/path",
            "user@example.com",
            "%65xample.com",
            "[::1",
            "256.1.1.1",
            "exa mple.com",
        ] {
            assert!(HostRule::parse(entry).is_err(), "{entry}");
        }
    }
}
