//! The OS second line: Landlock confines the process that runs tools to the allowed roots.

use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus,
    path_beneath_rules,
};

use crate::Policy;

/// The newest Landlock ABI this build asks for; older kernels get what they support.
const LANDLOCK_ABI: ABI = ABI::V5;

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
/// Network access is not restricted here: Landlock rules on TCP ports cannot express
/// `[http] allow_domains`, which the first line enforces.
pub fn restrict_to_roots(policy: &Policy) -> SecondLine {
    let roots: Vec<PathBuf> = policy
        .fs()
        .map(|fs| fs.allow().to_vec())
        .unwrap_or_default();
    let system: Vec<&Path> = SYSTEM_READ_ONLY
        .iter()
        .map(Path::new)
        .filter(|path| path.exists())
        .collect();
    let result = Ruleset::default()
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
        .and_then(|ruleset| ruleset.restrict_self());
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
