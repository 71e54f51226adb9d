//! The policy file (`sandbox.toml`), parsed strictly.

use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::SandboxError;
use crate::hosts::HostRule;
use crate::names::DenyNames;

/// The `max_io_bytes` used when `[fs]` does not set one: 1 MiB.
pub const DEFAULT_MAX_IO_BYTES: u64 = 1024 * 1024;

/// The largest `max_io_bytes` a policy may set: 64 MiB.
/// It also bounds what compensation reads and writes when it runs without a policy.
pub const MAX_IO_BYTES_LIMIT: u64 = 64 * 1024 * 1024;

/// The `max_response_bytes` used when `[http]` does not set one: 1 MiB.
pub const DEFAULT_MAX_RESPONSE_BYTES: u64 = 1024 * 1024;

/// The largest `max_response_bytes` a policy may set: 64 MiB.
pub const MAX_RESPONSE_BYTES_LIMIT: u64 = 64 * 1024 * 1024;

/// The largest policy file accepted: 64 KiB.
pub const MAX_POLICY_BYTES: u64 = 64 * 1024;

/// The most entries `[fs] allow` may list.
pub const MAX_ALLOW_ROOTS: usize = 64;

/// The most entries `[fs] deny_names` may list.
pub const MAX_DENY_NAMES: usize = 256;

/// The most entries `[http] allow_domains` may list.
pub const MAX_ALLOW_DOMAINS: usize = 256;

/// The most entries `[http] allow_ports` may list.
pub const MAX_ALLOW_PORTS: usize = 64;

/// A sandbox policy: which subtrees the file tools may touch and which hosts the network tools
/// may reach.
///
/// A missing section denies that kind of access; [`Policy::deny_all`] has neither.
#[derive(Debug, Clone)]
pub struct Policy {
    source: Option<PathBuf>,
    fs: Option<FsPolicy>,
    http: Option<HttpPolicy>,
    limits: Option<toml::Table>,
    approval: Option<toml::Table>,
    mcp: Option<toml::Table>,
}

/// The `[fs]` section, with every allowed root canonicalized.
#[derive(Debug, Clone)]
pub struct FsPolicy {
    allow: Vec<PathBuf>,
    deny_names: DenyNames,
    max_io_bytes: u64,
}

/// The `[http]` section, with every `allow_domains` entry normalized (lowercase, IDNA, one
/// trailing dot removed, IP addresses parsed); [`HttpSandbox`](crate::HttpSandbox) enforces it.
#[derive(Debug, Clone)]
pub struct HttpPolicy {
    allow_domains: Vec<String>,
    rules: Vec<HostRule>,
    allow_ports: Option<Vec<u16>>,
    max_response_bytes: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    fs: Option<RawFs>,
    http: Option<RawHttp>,
    /// The dispatcher's bounds; the sandbox carries them without ruling on them.
    limits: Option<toml::Table>,
    /// Which steps wait for an operator (reference §10); carried, not ruled on, like
    /// `[limits]`.
    approval: Option<toml::Table>,
    /// How the MCP server answers what it serves; carried, not ruled on, like `[limits]`.
    mcp: Option<toml::Table>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFs {
    allow: Vec<String>,
    #[serde(default)]
    deny_names: Vec<String>,
    #[serde(default = "default_max_io_bytes")]
    max_io_bytes: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHttp {
    allow_domains: Vec<String>,
    #[serde(default)]
    allow_ports: Option<Vec<u16>>,
    #[serde(default = "default_max_response_bytes")]
    max_response_bytes: u64,
}

fn default_max_io_bytes() -> u64 {
    DEFAULT_MAX_IO_BYTES
}

fn default_max_response_bytes() -> u64 {
    DEFAULT_MAX_RESPONSE_BYTES
}

impl Policy {
    /// Reads and parses a policy file.
    /// Allowed roots are relative to the file's folder and are canonicalized now.
    ///
    /// # Errors
    ///
    /// [`SandboxError::PolicyRead`] when the file cannot be read,
    /// [`SandboxError::PolicyInvalid`] when it is not valid TOML, has an unknown key, a value of
    /// the wrong type or beyond a limit, [`SandboxError::Root`] when an allowed root does not
    /// exist or is not a directory.
    pub fn load(path: &Path) -> Result<Policy, SandboxError> {
        let read_error = |source| SandboxError::PolicyRead {
            path: path.to_path_buf(),
            source,
        };
        let file = fs::File::open(path).map_err(read_error)?;
        let mut text = String::new();
        // Read one byte past the limit so an oversized file is recognised without reading it all.
        file.take(MAX_POLICY_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(read_error)?;
        if text.len() as u64 > MAX_POLICY_BYTES {
            return Err(read_error(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the file is larger than {MAX_POLICY_BYTES} bytes"),
            )));
        }
        let base_dir = match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        Self::parse(&text, base_dir, Some(path))
    }

    /// Parses policy text; allowed roots are relative to `base_dir` and are canonicalized now.
    ///
    /// # Errors
    ///
    /// As [`Policy::load`], except for reading.
    pub fn from_toml_str(text: &str, base_dir: &Path) -> Result<Policy, SandboxError> {
        Self::parse(text, base_dir, None)
    }

    /// The policy that denies everything: what runs when no policy file is given.
    pub fn deny_all() -> Policy {
        Policy {
            source: None,
            fs: None,
            http: None,
            limits: None,
            approval: None,
            mcp: None,
        }
    }

    /// The file the policy was loaded from, if any.
    pub fn source(&self) -> Option<&Path> {
        self.source.as_deref()
    }

    /// The `[fs]` section; `None` means no file access at all.
    pub fn fs(&self) -> Option<&FsPolicy> {
        self.fs.as_ref()
    }

    /// The `[http]` section; `None` means no network access at all.
    pub fn http(&self) -> Option<&HttpPolicy> {
        self.http.as_ref()
    }

    /// The `[limits]` section as written (timeouts, concurrency, retries of tool calls). The
    /// sandbox does not rule on it; the tool dispatcher reads it.
    pub fn limits_table(&self) -> Option<&toml::Table> {
        self.limits.as_ref()
    }

    /// The `[approval]` section as written (which tools wait for an operator's approval,
    /// the operator key, the timeout). The sandbox carries it without ruling on it.
    pub fn approval_table(&self) -> Option<&toml::Table> {
        self.approval.as_ref()
    }

    /// The `[mcp]` section as written (what the MCP server does with a denied call). The
    /// sandbox carries it without ruling on it.
    pub fn mcp_table(&self) -> Option<&toml::Table> {
        self.mcp.as_ref()
    }

    /// How to name the policy in messages: its file, or a stand-in.
    pub fn origin(&self) -> String {
        origin_of(self.source.as_deref())
    }

    fn parse(text: &str, base_dir: &Path, source: Option<&Path>) -> Result<Policy, SandboxError> {
        let origin = origin_of(source);
        let invalid = |message: String| SandboxError::PolicyInvalid {
            origin: origin.clone(),
            message,
        };
        let raw: RawPolicy =
            toml::from_str(text).map_err(|error| invalid(toml_message(text, &error)))?;
        let fs = raw
            .fs
            .map(|raw_fs| FsPolicy::from_raw(raw_fs, base_dir, &origin))
            .transpose()?;
        let http = raw
            .http
            .map(|raw_http| HttpPolicy::from_raw(raw_http, &origin))
            .transpose()?;
        Ok(Policy {
            source: source.map(Path::to_path_buf),
            fs,
            http,
            limits: raw.limits,
            approval: raw.approval,
            mcp: raw.mcp,
        })
    }
}

impl FsPolicy {
    fn from_raw(raw: RawFs, base_dir: &Path, origin: &str) -> Result<FsPolicy, SandboxError> {
        let invalid = |message: String| SandboxError::PolicyInvalid {
            origin: origin.to_owned(),
            message,
        };
        if raw.allow.len() > MAX_ALLOW_ROOTS {
            return Err(invalid(format!(
                "[fs] allow lists {} roots; the limit is {MAX_ALLOW_ROOTS}",
                raw.allow.len()
            )));
        }
        if raw.deny_names.len() > MAX_DENY_NAMES {
            return Err(invalid(format!(
                "[fs] deny_names lists {} names; the limit is {MAX_DENY_NAMES}",
                raw.deny_names.len()
            )));
        }
        if raw.max_io_bytes == 0 || raw.max_io_bytes > MAX_IO_BYTES_LIMIT {
            return Err(invalid(format!(
                "[fs] max_io_bytes is {}; it must be between 1 and {MAX_IO_BYTES_LIMIT}",
                raw.max_io_bytes
            )));
        }
        let mut allow: Vec<PathBuf> = Vec::with_capacity(raw.allow.len());
        for entry in &raw.allow {
            let root = canonical_root(entry, base_dir, origin)?;
            if !allow.contains(&root) {
                allow.push(root);
            }
        }
        let deny_names = DenyNames::new(&raw.deny_names).map_err(invalid)?;
        Ok(FsPolicy {
            allow,
            deny_names,
            max_io_bytes: raw.max_io_bytes,
        })
    }

    /// The allowed roots: canonical absolute directories.
    pub fn allow(&self) -> &[PathBuf] {
        &self.allow
    }

    /// The denied name patterns, as written.
    pub fn deny_names(&self) -> &[String] {
        self.deny_names.patterns()
    }

    /// The largest read or write, in bytes.
    pub fn max_io_bytes(&self) -> u64 {
        self.max_io_bytes
    }

    pub(crate) fn deny_name_matcher(&self) -> &DenyNames {
        &self.deny_names
    }
}

impl HttpPolicy {
    fn from_raw(raw: RawHttp, origin: &str) -> Result<HttpPolicy, SandboxError> {
        let invalid = |message: String| SandboxError::PolicyInvalid {
            origin: origin.to_owned(),
            message,
        };
        if raw.allow_domains.len() > MAX_ALLOW_DOMAINS {
            return Err(invalid(format!(
                "[http] allow_domains lists {} domains; the limit is {MAX_ALLOW_DOMAINS}",
                raw.allow_domains.len()
            )));
        }
        if let Some(bad) = raw
            .allow_domains
            .iter()
            .find(|domain| domain.trim().is_empty() || domain.contains(char::is_whitespace))
        {
            return Err(invalid(format!(
                "[http] allow_domains has an empty or blank entry `{bad}`"
            )));
        }
        if raw.max_response_bytes == 0 || raw.max_response_bytes > MAX_RESPONSE_BYTES_LIMIT {
            return Err(invalid(format!(
                "[http] max_response_bytes is {}; it must be between 1 and {MAX_RESPONSE_BYTES_LIMIT}",
                raw.max_response_bytes
            )));
        }
        let allow_ports = match raw.allow_ports {
            None => None,
            Some(ports) if ports.is_empty() => {
                return Err(invalid(
                    "[http] allow_ports is empty, which would allow no URL; leave it out to allow every port, or list the ports (e.g. [443])".to_owned(),
                ));
            }
            Some(ports) if ports.len() > MAX_ALLOW_PORTS => {
                return Err(invalid(format!(
                    "[http] allow_ports lists {} ports; the limit is {MAX_ALLOW_PORTS}",
                    ports.len()
                )));
            }
            Some(ports) if ports.contains(&0) => {
                return Err(invalid(
                    "[http] allow_ports lists port 0, which no URL can name".to_owned(),
                ));
            }
            Some(mut ports) => {
                ports.sort_unstable();
                ports.dedup();
                Some(ports)
            }
        };
        let mut rules: Vec<HostRule> = Vec::with_capacity(raw.allow_domains.len());
        for entry in &raw.allow_domains {
            let rule = HostRule::parse(entry).map_err(|reason| {
                invalid(format!(
                    "[http] allow_domains entry `{}` is invalid: {reason}",
                    entry.escape_debug()
                ))
            })?;
            if !rules.contains(&rule) {
                rules.push(rule);
            }
        }
        Ok(HttpPolicy {
            allow_domains: raw.allow_domains,
            rules,
            allow_ports,
            max_response_bytes: raw.max_response_bytes,
        })
    }

    /// The allowed hosts, as written: an exact host or IP address, or `*.` and a suffix.
    pub fn allow_domains(&self) -> &[String] {
        &self.allow_domains
    }

    /// The allowed hosts, normalized as they are compared: lowercase, IDNA (punycode) applied,
    /// one trailing dot removed, IP addresses in their usual form (an IPv4-mapped IPv6
    /// address as its IPv4 address), duplicates removed.
    pub fn normalized_allow_domains(&self) -> Vec<String> {
        self.rules.iter().map(ToString::to_string).collect()
    }

    pub(crate) fn host_rules(&self) -> &[HostRule] {
        &self.rules
    }

    /// The TCP ports URLs may name (a URL without a port names its scheme's: 80 or 443),
    /// sorted; `None` when `allow_ports` is left out and every port is allowed.
    ///
    /// With a list, the OS second line also confines the process's TCP connections to these
    /// ports (and 53, for name resolution over TCP).
    pub fn allow_ports(&self) -> Option<&[u16]> {
        self.allow_ports.as_deref()
    }

    /// The largest response body, in bytes.
    pub fn max_response_bytes(&self) -> u64 {
        self.max_response_bytes
    }
}

fn origin_of(source: Option<&Path>) -> String {
    match source {
        Some(path) => path.display().to_string(),
        None => "(inline text)".to_owned(),
    }
}

/// Joins `entry` to `base_dir`, canonicalizes it, and checks that it is a directory.
fn canonical_root(entry: &str, base_dir: &Path, origin: &str) -> Result<PathBuf, SandboxError> {
    let joined = base_dir.join(entry);
    let root_error = |reason: String| SandboxError::Root {
        origin: origin.to_owned(),
        root: joined.clone(),
        reason,
    };
    if entry.is_empty() {
        return Err(root_error("is empty".to_owned()));
    }
    let canonical = fs::canonicalize(&joined).map_err(|error| {
        if error.kind() == io::ErrorKind::NotFound {
            root_error("does not exist".to_owned())
        } else {
            root_error(format!("cannot be resolved: {error}"))
        }
    })?;
    let metadata = fs::metadata(&canonical)
        .map_err(|error| root_error(format!("cannot be inspected: {error}")))?;
    if !metadata.is_dir() {
        return Err(root_error("is not a directory".to_owned()));
    }
    Ok(canonical)
}

/// A one-line message from a TOML error: position, then what is wrong (which names the key).
fn toml_message(text: &str, error: &toml::de::Error) -> String {
    let message = error.message().trim_end();
    match error.span() {
        Some(span) => {
            let before = text.get(..span.start).unwrap_or(text);
            let line = before.matches('\n').count() + 1;
            let column = before
                .rsplit('\n')
                .next()
                .map_or(0, |line_text| line_text.chars().count())
                + 1;
            format!("line {line}, column {column}: {message}")
        }
        None => message.to_owned(),
    }
}
