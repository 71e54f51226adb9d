//! Which steps wait for an operator (reference §10), as values: the `[approval]` policy,
//! the digest a request is bound to, the check value of an operator key, and an operator's
//! decision. The flows that use them (requesting, deciding, resuming) are `approval.rs`'s.

use std::path::{Path, PathBuf};
use std::time::Duration;

use agent_kernel_api::{
    DEFAULT_APPROVAL_TIMEOUT_MS, DynTool, MAX_APPROVAL_TIMEOUT_MS, Reversibility, SagaId,
    canonical_json,
};
use glob::Pattern;
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::KernelError;

/// The most globs `[approval] require` may list.
pub const MAX_APPROVAL_RULES: usize = 256;

/// How often a process waiting for a decision looks at the log.
pub const APPROVAL_POLL_INTERVAL: Duration = Duration::from_millis(100);

/// Which steps wait for an operator's approval, and for how long (`[approval]` of the
/// policy file).
#[derive(Debug, Clone)]
pub struct ApprovalPolicy {
    require: Vec<(String, Pattern)>,
    operator_key_file: Option<PathBuf>,
    /// The check value of the operator key, once read (`with_operator_key`).
    operator_key_check: Option<String>,
    timeout_ms: u64,
}

impl Default for ApprovalPolicy {
    /// Approvals for irreversible tools only, expiring after
    /// [`DEFAULT_APPROVAL_TIMEOUT_MS`], with no operator key.
    fn default() -> Self {
        ApprovalPolicy {
            require: Vec::new(),
            operator_key_file: None,
            operator_key_check: None,
            timeout_ms: DEFAULT_APPROVAL_TIMEOUT_MS,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawApproval {
    #[serde(default)]
    require: Vec<String>,
    #[serde(default)]
    operator_key_file: Option<PathBuf>,
    #[serde(default = "default_timeout_ms")]
    timeout_ms: u64,
}

fn default_timeout_ms() -> u64 {
    DEFAULT_APPROVAL_TIMEOUT_MS
}

impl ApprovalPolicy {
    /// A policy requiring approval for the tools whose ids match one of `require` (globs:
    /// `shop.*`, `fs.delete`), besides every irreversible tool, expiring after `timeout_ms`.
    ///
    /// # Errors
    ///
    /// [`KernelError::Setup`] naming the glob that is not valid, or the bound broken.
    pub fn new(require: Vec<String>, timeout_ms: u64) -> Result<Self, KernelError> {
        let setup = KernelError::Setup;
        if require.len() > MAX_APPROVAL_RULES {
            return Err(setup(format!(
                "[approval] require lists {} globs, more than the maximum of {MAX_APPROVAL_RULES}",
                require.len()
            )));
        }
        if !(1..=MAX_APPROVAL_TIMEOUT_MS).contains(&timeout_ms) {
            return Err(setup(format!(
                "[approval] timeout_ms is {timeout_ms}; it must be 1 to {MAX_APPROVAL_TIMEOUT_MS} (30 days)"
            )));
        }
        let require = require
            .into_iter()
            .map(|glob| {
                if glob.is_empty() {
                    return Err(setup("[approval] require holds an empty glob".to_owned()));
                }
                Pattern::new(&glob)
                    .map(|pattern| (glob.clone(), pattern))
                    .map_err(|err| {
                        setup(format!(
                            "[approval] require entry `{glob}` is not a valid glob: {err}"
                        ))
                    })
            })
            .collect::<Result<_, _>>()?;
        Ok(ApprovalPolicy {
            require,
            operator_key_file: None,
            operator_key_check: None,
            timeout_ms,
        })
    }

    /// The `[approval]` table of a policy file whose folder is `base_dir` (a relative
    /// `operator_key_file` is taken from there).
    ///
    /// # Errors
    ///
    /// [`KernelError::Setup`] naming the unknown key, the value of the wrong type, the
    /// invalid glob or the bound broken.
    pub fn from_table(table: toml::Table, base_dir: &Path) -> Result<Self, KernelError> {
        let raw: RawApproval =
            toml::Value::Table(table)
                .try_into()
                .map_err(|err: toml::de::Error| {
                    KernelError::Setup(format!("[approval]: {}", err.message().trim()))
                })?;
        let policy = ApprovalPolicy::new(raw.require, raw.timeout_ms)?;
        Ok(match raw.operator_key_file {
            Some(path) if path.as_os_str().is_empty() => {
                return Err(KernelError::Setup(
                    "[approval] operator_key_file is empty".to_owned(),
                ));
            }
            Some(path) => policy.with_operator_key_file(base_dir.join(path)),
            None => policy,
        })
    }

    /// The same policy, with decisions needing the key in `path` (`approve
    /// --operator-key-file`).
    #[must_use]
    pub fn with_operator_key_file(mut self, path: PathBuf) -> Self {
        self.operator_key_file = Some(path);
        self
    }

    /// The same policy, with decisions on the requests it makes needing `key` (the bytes
    /// of the operator key file, trailing whitespace ignored): each request records the
    /// key's [`operator_key_check`], and a decision must be given the same key.
    #[must_use]
    pub fn with_operator_key(mut self, key: &[u8]) -> Self {
        self.operator_key_check = Some(operator_key_check(key));
        self
    }

    /// The check value requests record, when an operator key is set.
    pub fn operator_key_check(&self) -> Option<&str> {
        self.operator_key_check.as_deref()
    }

    /// The globs of `[approval] require`, as written.
    pub fn require(&self) -> impl Iterator<Item = &str> {
        self.require.iter().map(|(glob, _)| glob.as_str())
    }

    /// The file holding the operator key, when decisions need one.
    pub fn operator_key_file(&self) -> Option<&Path> {
        self.operator_key_file.as_deref()
    }

    /// How long a request waits before it expires, in ms.
    pub fn timeout_ms(&self) -> u64 {
        self.timeout_ms
    }

    /// Why a step of `tool` (registered as `tool_id`) needs an approval, or `None`.
    pub fn reason_for(&self, tool_id: &str, tool: &dyn DynTool) -> Option<String> {
        if tool.reversibility() == Reversibility::None {
            return Some(format!("`{tool_id}` is irreversible (reversibility none)"));
        }
        self.require
            .iter()
            .find(|(_, pattern)| pattern.matches(tool_id))
            .map(|(glob, _)| format!("`{tool_id}` matches [approval] require `{glob}`"))
    }
}

/// The check value of an operator key: SHA-256 (hex) of `agent-kernel operator key\n`
/// followed by the key, trailing whitespace ignored. It stands for the key in the log, so
/// the key should be random (as `openssl rand -hex 32` makes one): a guessable key can be
/// found from its check value.
pub fn operator_key_check(key: &[u8]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"agent-kernel operator key\n");
    hasher.update(key.trim_ascii_end());
    hasher
        .finalize()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// The digest an approval is bound to: SHA-256 (lowercase hex) of the canonical JSON of
/// `{"args": …, "saga_id": …, "step": …, "tool": …}` (object keys sorted by their bytes at
/// every depth, no whitespace, strings escaped as `serde_json` escapes them).
pub fn approval_digest(saga_id: &SagaId, step_seq: u32, tool: &str, args: &Value) -> String {
    let document = json!({
        "args": args,
        "saga_id": saga_id.as_str(),
        "step": step_seq,
        "tool": tool,
    });
    Sha256::digest(canonical_json(&document).as_bytes())
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// An operator's decision on a request, as [`Kernel::decide_approval`](crate::Kernel::decide_approval) takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorDecision {
    /// Approve or reject.
    pub approve: bool,
    /// The operator key given (`--operator-key-file`), for a request that names one.
    pub operator_key: Option<Vec<u8>>,
    /// Who decides, as recorded (`alice (uid 1000)`).
    pub user: Option<String>,
    /// The note (`approve --note`) or the reason (`reject --reason`).
    pub note: Option<String>,
}
