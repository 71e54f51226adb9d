//! The one error type of the crate.

use std::io;
use std::path::PathBuf;

/// Everything that can go wrong while loading a policy, ruling on a path, a URL or an
/// address, or touching a file.
///
/// Callers ask questions rather than match on variants:
/// [`is_denied`](Self::is_denied) (the policy forbids it),
/// [`is_invalid_path`](Self::is_invalid_path) (the path itself is malformed),
/// [`is_invalid_url`](Self::is_invalid_url) (the URL itself is malformed),
/// [`is_not_found`](Self::is_not_found) and
/// [`may_have_changed`](Self::may_have_changed) (a mutation failed part-way).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SandboxError {
    /// The policy file could not be read.
    #[error("cannot read sandbox policy {}: {source}", path.display())]
    PolicyRead {
        /// The policy file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// The policy is not valid TOML, has an unknown key, a value of the wrong type, or a value
    /// beyond a limit.
    #[error("invalid sandbox policy {origin}: {message}")]
    PolicyInvalid {
        /// Where the policy came from (its file, or "text").
        origin: String,
        /// What is wrong, naming the key.
        message: String,
    },

    /// An allowed root of the policy does not exist, is not a directory, or cannot be opened.
    #[error("invalid sandbox policy {origin}: allowed root `{}` {reason}", root.display())]
    Root {
        /// Where the policy came from.
        origin: String,
        /// The root as written in the policy, joined to the policy's folder.
        root: PathBuf,
        /// Why it is unusable.
        reason: String,
    },

    /// The policy forbids the access.
    #[error("access to `{path}` denied: {reason}")]
    Denied {
        /// The path as the caller gave it (or the confined path).
        path: String,
        /// Why, in words.
        reason: String,
    },

    /// The policy forbids a network request: the scheme, credentials in the URL, a host not in
    /// `[http] allow_domains`, a special address (loopback, private, ...) not listed, or no
    /// `[http]` section at all.
    #[error("request to `{target}` denied: {reason}")]
    HostDenied {
        /// The URL, or the host name that resolved to a denied address.
        target: String,
        /// Why, in words.
        reason: String,
    },

    /// A response body is larger than the policy's `max_response_bytes` (a denial).
    #[error(
        "response from `{url}` denied: its body of at least {len} bytes exceeds the limit of \
         {max_bytes} bytes ([http] max_response_bytes)"
    )]
    ResponseTooLarge {
        /// The URL the response came from.
        url: String,
        /// How many bytes the body has at least (its announced length, or what was read).
        len: u64,
        /// The limit in force.
        max_bytes: u64,
    },

    /// The URL is malformed: not an absolute URL, no host, or over-long.
    #[error("invalid URL `{url}`: {reason}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A read or write is larger than the policy's `max_io_bytes` (a denial).
    #[error("access to `{path}` denied: {len} bytes exceed the limit of {max_bytes} bytes")]
    TooLarge {
        /// The file.
        path: String,
        /// The size of the file or of the data to write.
        len: u64,
        /// The limit in force.
        max_bytes: u64,
    },

    /// The final component is a symbolic link and the operation refuses to follow it
    /// (a denial: mutations never go through a link).
    #[error("refusing to {action} through symbolic link `{path}`")]
    Symlink {
        /// The file.
        path: String,
        /// What was attempted ("write", "remove", ...).
        action: &'static str,
    },

    /// The path is malformed: empty, a NUL byte, an over-long name, or it does not name a file.
    #[error("invalid path `{path}`: {reason}")]
    InvalidPath {
        /// The path as given.
        path: String,
        /// What is wrong with it.
        reason: String,
    },

    /// The path exists but is not a regular file (a directory, FIFO, socket or device).
    #[error("`{path}` is not a regular file (it is a {kind})")]
    NotRegularFile {
        /// The path.
        path: String,
        /// What it is instead.
        kind: &'static str,
    },

    /// The file does not exist.
    #[error("`{path}` does not exist")]
    NotFound {
        /// The path.
        path: String,
    },

    /// The folder that should contain the file does not exist (folders are never created).
    #[error("the parent folder of `{path}` does not exist")]
    ParentMissing {
        /// The path.
        path: String,
    },

    /// The file is not in the state the operation expects (e.g. shorter than the length to
    /// truncate to): someone else changed it.
    #[error("`{path}` changed unexpectedly: {reason}")]
    Conflict {
        /// The path.
        path: String,
        /// What was found.
        reason: String,
    },

    /// Any other I/O failure.
    #[error("cannot {action} `{path}`: {source}")]
    Io {
        /// The path.
        path: String,
        /// What was attempted ("read", "rename temporary file onto", ...).
        action: &'static str,
        /// Whether the file may have changed before the failure (a part-way mutation).
        partial: bool,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// A thread could not be confined for a program to start from (the second line could
    /// not give it what its tool declares), or the launcher has stopped: the program was not
    /// started.
    #[error("{reason}")]
    NotConfined {
        /// Why.
        reason: String,
    },

    /// A declared folder of a program's tool cannot be used (it does not exist, say).
    #[error("{reason}")]
    ProgramAccess {
        /// Why.
        reason: String,
    },
}

impl SandboxError {
    /// Whether the policy forbids the access (outside the roots, a denied name, over the size
    /// limit, through a symbolic link, no `[fs]` section; a URL or address the `[http]`
    /// section does not allow, a response over `max_response_bytes`, no `[http]` section).
    /// Nothing was touched.
    pub fn is_denied(&self) -> bool {
        matches!(
            self,
            SandboxError::Denied { .. }
                | SandboxError::TooLarge { .. }
                | SandboxError::Symlink { .. }
                | SandboxError::HostDenied { .. }
                | SandboxError::ResponseTooLarge { .. }
        )
    }

    /// Whether the URL itself is malformed (bad input rather than a policy decision).
    pub fn is_invalid_url(&self) -> bool {
        matches!(self, SandboxError::InvalidUrl { .. })
    }

    /// Whether the path itself is malformed (bad input rather than a policy decision).
    pub fn is_invalid_path(&self) -> bool {
        matches!(self, SandboxError::InvalidPath { .. })
    }

    /// Whether the file (or its parent folder) does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            SandboxError::NotFound { .. } | SandboxError::ParentMissing { .. }
        )
    }

    /// Whether a mutation failed after it may have changed something on disk (a part-way
    /// append, a rename that happened but could not be synced, a temporary file left behind).
    pub fn may_have_changed(&self) -> bool {
        matches!(self, SandboxError::Io { partial: true, .. })
    }

    /// The path the error is about, if it is about one.
    pub fn path(&self) -> Option<&str> {
        match self {
            SandboxError::PolicyRead { .. }
            | SandboxError::PolicyInvalid { .. }
            | SandboxError::Root { .. }
            | SandboxError::HostDenied { .. }
            | SandboxError::ResponseTooLarge { .. }
            | SandboxError::InvalidUrl { .. }
            | SandboxError::NotConfined { .. }
            | SandboxError::ProgramAccess { .. } => None,
            SandboxError::Denied { path, .. }
            | SandboxError::TooLarge { path, .. }
            | SandboxError::Symlink { path, .. }
            | SandboxError::InvalidPath { path, .. }
            | SandboxError::NotRegularFile { path, .. }
            | SandboxError::NotFound { path }
            | SandboxError::ParentMissing { path }
            | SandboxError::Conflict { path, .. }
            | SandboxError::Io { path, .. } => Some(path),
        }
    }
}
