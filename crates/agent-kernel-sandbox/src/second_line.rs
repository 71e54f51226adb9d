//! The OS second line: Landlock confines the process that runs tools to the allowed roots.

use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, AccessNet, NetPort, Ruleset, RulesetAttr, RulesetCreated,
    RulesetCreatedAttr, RulesetError, RulesetStatus, path_beneath_rules,
};

use crate::Policy;

/// The newest Landlock ABI this build asks for; older kernels get what they support.
pub(crate) const LANDLOCK_ABI: ABI = ABI::V5;

/// System folders the process may still read once confined: name resolution and TLS roots
/// (`/etc`), shared libraries loaded on demand (`/usr`, `/lib*`), `/dev` and `/proc`.
pub const SYSTEM_READ_ONLY: [&str; 6] = ["/etc", "/usr", "/lib", "/lib64", "/dev", "/proc"];

/// What the second line achieved.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SecondLine {
    /// The kernel enforces the rules on this thread and every thread and process it starts
    /// from now on.
    Enforced {
        /// Whether every requested right is enforced (`false`: an older ABI enforces a subset).
        fully: bool,
    },
    /// The kernel offers no Landlock (or refused it): only the first line (capability
    /// handles) confines file tools.
    Unavailable {
        /// Why.
        reason: String,
    },
}

impl SecondLine {
    /// Whether the kernel enforces the rules.
    pub fn is_enforced(&self) -> bool {
        matches!(self, SecondLine::Enforced { .. })
    }
}

/// Confines the calling thread, and every thread and process it starts afterwards, to the
/// policy's allowed roots (read and write) and the system folders of [`SYSTEM_READ_ONLY`]
/// (read only); any other path is refused by the kernel, whatever the caller does.
///
/// Call it once, after opening what the process needs elsewhere (the log's files, whose
/// writer thread started before and stays unconfined) and before running tools. The rules
/// are permanent for the thread.
/// Network access is restricted by [`restrict_network`].
pub fn restrict_to_roots(policy: &Policy) -> SecondLine {
    let result = roots_ruleset(policy).and_then(|ruleset| ruleset.restrict_self());
    match result {
        Ok(status) => match status.ruleset {
            RulesetStatus::FullyEnforced => SecondLine::Enforced { fully: true },
            RulesetStatus::PartiallyEnforced => SecondLine::Enforced { fully: false },
            RulesetStatus::NotEnforced => SecondLine::Unavailable {
                reason: "this kernel does not offer Landlock".to_owned(),
            },
        },
        Err(error) => SecondLine::Unavailable {
            reason: format!("Landlock refused the rules: {error}"),
        },
    }
}

/// A ruleset over every file access that allows the policy's roots (every right) and the
/// system folders of [`SYSTEM_READ_ONLY`] (reading and executing), to which more rules may
/// be added before it is enforced.
pub(crate) fn roots_ruleset(policy: &Policy) -> Result<RulesetCreated, RulesetError> {
    let roots: Vec<PathBuf> = policy
        .fs()
        .map(|fs| fs.allow().to_vec())
        .unwrap_or_default();
    let system: Vec<&Path> = SYSTEM_READ_ONLY
        .iter()
        .map(Path::new)
        .filter(|path| path.exists())
        .collect();
    Ruleset::default()
        .handle_access(AccessFs::from_all(LANDLOCK_ABI))
        .and_then(|ruleset| ruleset.create())
        .and_then(|ruleset| {
            ruleset.add_rules(path_beneath_rules(&roots, AccessFs::from_all(LANDLOCK_ABI)))
        })
        .and_then(|ruleset| {
            ruleset.add_rules(path_beneath_rules(
                &system,
                AccessFs::from_read(LANDLOCK_ABI),
            ))
        })
}

/// The TCP port of DNS, which name resolution falls back to for long answers; allowed
/// beside `[http] allow_ports` so that allowed names still resolve.
pub const DNS_TCP_PORT: u16 = 53;

/// What the second line does to the network (Landlock rules on TCP, Linux 6.7 and later).
///
/// Landlock rules name TCP ports, not hosts: `[http] allow_domains` stays the first line's
/// (checked on every URL, redirect hop and resolved address). UDP is not covered.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NetworkLine {
    /// The policy allows no network access: the kernel refuses every TCP connection and
    /// bind.
    NoTcp,
    /// The kernel refuses TCP connections to any port but these (`[http] allow_ports` and
    /// [`DNS_TCP_PORT`]), and every bind.
    Ports(Vec<u16>),
    /// `[http]` has no `allow_ports`: the kernel refuses every bind, but connections to
    /// any port are left to the first line.
    AnyPort,
    /// The kernel offers no Landlock network rules (or refused them): only the first line
    /// rules on network access.
    Unavailable {
        /// Why.
        reason: String,
    },
}

impl NetworkLine {
    /// Whether the kernel enforces any network rule.
    pub fn is_enforced(&self) -> bool {
        !matches!(self, NetworkLine::Unavailable { .. })
    }
}

/// Confines the calling thread, and every thread and process it starts afterwards, to the
/// TCP access the policy needs: none without `[http]`; with `[http] allow_ports`,
/// connections to those ports (and [`DNS_TCP_PORT`]); binding never.
///
/// Call it with [`restrict_to_roots`], before running tools. The rules are a separate
/// Landlock layer, permanent for the thread.
pub fn restrict_network(policy: &Policy) -> NetworkLine {
    let (handled, allowed, line) = match policy.http() {
        None => (
            AccessNet::from_all(LANDLOCK_ABI),
            Vec::new(),
            NetworkLine::NoTcp,
        ),
        Some(http) => match http.allow_ports() {
            Some(ports) => {
                let mut allowed = ports.to_vec();
                if !allowed.contains(&DNS_TCP_PORT) {
                    allowed.push(DNS_TCP_PORT);
                    allowed.sort_unstable();
                }
                (
                    AccessNet::from_all(LANDLOCK_ABI),
                    allowed.clone(),
                    NetworkLine::Ports(allowed),
                )
            }
            None => (AccessNet::BindTcp.into(), Vec::new(), NetworkLine::AnyPort),
        },
    };
    let result = Ruleset::default()
        .handle_access(handled)
        .and_then(|ruleset| ruleset.create())
        .and_then(|ruleset| {
            ruleset.add_rules(
                allowed
                    .iter()
                    .map(|port| Ok(NetPort::new(*port, AccessNet::ConnectTcp))),
            )
        })
        .and_then(|ruleset| ruleset.restrict_self());
    match result {
        Ok(status) => match status.ruleset {
            RulesetStatus::FullyEnforced | RulesetStatus::PartiallyEnforced => line,
            RulesetStatus::NotEnforced => NetworkLine::Unavailable {
                reason:
                    "this kernel does not offer Landlock network rules (Linux 6.7 or later does)"
                        .to_owned(),
            },
        },
        Err(error) => NetworkLine::Unavailable {
            reason: format!("Landlock refused the network rules: {error}"),
        },
    }
}
