//! The agent-kernel sandbox: the one crate that rules on paths.
//!
//! It parses the sandbox policy (`sandbox.toml`) strictly, rules on every path a file tool is
//! given, and performs the file operations themselves through directory handles, so that no
//! check can be raced.
//! It knows nothing of sagas, tools, the log or async runtimes.
//!
//! # The pieces
//!
//! - [`Policy`]: the policy file. `[fs]` lists the allowed roots (relative to the policy's
//!   folder, canonicalized at load), the denied names and `max_io_bytes`; `[http]` is parsed
//!   and stored for the network tools. A missing section denies that kind of access.
//! - [`FsSandbox`]: one open [`cap_std::fs::Dir`] per allowed root.
//!   [`FsSandbox::resolve`] turns a path argument into a [`ConfinedPath`] without touching the
//!   disk (a pure ruling, fit for checking a plan), and [`FsSandbox::open`] binds it to its
//!   root's handle as a [`ConfinedFile`].
//! - [`ConfinedFile`]: `read`, `stat`, `write_atomic`, `append`, `truncate`, `remove_file`,
//!   `remove_temp`, each through the root's handle.
//! - [`ConfinedPath`]: serializable, so an undo record can hold it;
//!   [`ConfinedPath::reopen`] opens its root again without any policy, so compensation and
//!   recovery never depend on the policy in force later.
//! - [`SandboxError`]: the one error type, with [`SandboxError::is_denied`].
//!
//! # Example
//!
//! ```
//! use agent_kernel_sandbox::{FsSandbox, Policy};
//!
//! let dir = tempfile::tempdir()?;
//! let base = dir.path().canonicalize()?;
//! std::fs::create_dir(base.join("workspace"))?;
//! let policy = Policy::from_toml_str(
//!     r#"
//!     [fs]
//!     allow = ["workspace"]
//!     deny_names = [".env", "*.pem"]
//!     "#,
//!     &base,
//! )?;
//! let sandbox = FsSandbox::new(&policy)?;
//!
//! // Relative paths resolve against the caller's working directory.
//! let file = sandbox.resolve_open("workspace/a.txt", &base)?;
//! file.write_atomic(b"hello", ".a.txt.tmp", true)?;
//! assert_eq!(file.read(1024)?, b"hello");
//!
//! // Outside the roots, or a denied name at any depth and in any case: denied.
//! assert!(sandbox.resolve("workspace/../secret.txt", &base).is_err_and(|e| e.is_denied()));
//! assert!(sandbox.resolve("workspace/sub/.ENV", &base).is_err_and(|e| e.is_denied()));
//!
//! // No policy, no file access.
//! assert!(FsSandbox::deny_all().resolve("workspace/a.txt", &base).is_err_and(|e| e.is_denied()));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Design decisions
//!
//! - **Two lines of defence.** [`FsSandbox::resolve`] is lexical: the joined path must start
//!   with a canonical root component by component, must not climb above it through `..`, and
//!   no component may match a denied name. It does no I/O, so a plan can be checked before
//!   anything runs. The enforcing line is the kernel: every operation goes through the root's
//!   `Dir` (openat2 with `RESOLVE_BENEATH` on Linux), so `..` or a symbolic link that leads
//!   outside the root at the moment of the operation fails, with no check-then-use race.
//!   Denied names are checked again at the moment of the operation on the path with links
//!   resolved, so a link with an innocent name cannot reach a denied file.
//! - **Mutations never go through a final symbolic link** and only touch regular files;
//!   reads follow links that stay inside the root. Files are opened non-blocking, so a FIFO
//!   cannot hang an operation.
//! - **Folders are never created**: a missing parent is an error.
//! - **Every read and write is bounded** by `max_io_bytes` (default
//!   [`DEFAULT_MAX_IO_BYTES`], at most [`MAX_IO_BYTES_LIMIT`]).
//! - **Atomic replacement** is temp file + rename in the same folder; the caller names the
//!   temporary file, so that compensation after a crash knows what to clean up.
//! - **Security settings have no permissive default**: no policy, or no `[fs]`, means no file
//!   access; unknown keys in the policy are errors (they are usually typos).
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

mod confined;
mod error;
mod names;
mod policy;
mod sandbox;

pub use confined::{ConfinedFile, ConfinedPath};
pub use error::SandboxError;
pub use policy::{
    DEFAULT_MAX_IO_BYTES, DEFAULT_MAX_RESPONSE_BYTES, FsPolicy, HttpPolicy, MAX_ALLOW_DOMAINS,
    MAX_ALLOW_ROOTS, MAX_DENY_NAMES, MAX_IO_BYTES_LIMIT, MAX_POLICY_BYTES,
    MAX_RESPONSE_BYTES_LIMIT, Policy,
};
pub use sandbox::{FsSandbox, MAX_NAME_BYTES, MAX_PATH_BYTES};
