//! The agent-kernel sandbox: the one crate that rules on paths and hosts.
//!
//! It parses the sandbox policy (`sandbox.toml`) strictly, rules on every path a file tool is
//! given, and performs the file operations themselves through directory handles, so that no
//! check can be raced.
//! It also rules on every URL, redirect hop and resolved address a network tool may reach,
//! without doing any network I/O itself.
//! It knows nothing of sagas, tools, the log, HTTP clients or async runtimes.
//!
//! # The pieces
//!
//! - [`Policy`]: the policy file. `[fs]` lists the allowed roots (relative to the policy's
//!   folder, canonicalized at load), the denied names and `max_io_bytes`; `[http]` lists the
//!   allowed hosts (normalized at load) and `max_response_bytes`. A missing section denies
//!   that kind of access.
//! - [`FsSandbox`]: one open [`cap_std::fs::Dir`] per allowed root.
//!   [`FsSandbox::resolve`] turns a path argument into a [`ConfinedPath`] without touching the
//!   disk (a pure ruling, fit for checking a plan), and [`FsSandbox::open`] binds it to its
//!   root's handle as a [`ConfinedFile`].
//! - [`ConfinedFile`]: `read`, `stat`, `write_atomic`, `append`, `truncate`, `remove_file`,
//!   `remove_temp`, each through the root's handle.
//! - [`ConfinedPath`]: serializable, so an undo record can hold it; what is read back from a
//!   record is data, not authority: [`FsSandbox::reconfine`] rules on it again under the
//!   policy in force and binds it to that policy's handles, so compensation and recovery
//!   can reach nothing today's roots exclude, whatever the record says.
//! - [`HttpSandbox`]: the `[http]` rules. [`HttpSandbox::check_url`] rules on a URL (the first
//!   one and every redirect hop), [`HttpSandbox::check_name`] on a name before it is looked
//!   up, [`HttpSandbox::check_resolved`] on each address an allowed name resolved to,
//!   [`HttpSandbox::check_response_bytes`] on the body's size.
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
//! Hosts:
//!
//! ```
//! use agent_kernel_sandbox::{HttpSandbox, Policy};
//!
//! let policy = Policy::from_toml_str(
//!     r#"
//!     [http]
//!     allow_domains = ["example.com", "*.example.org"]
//!     "#,
//!     std::path::Path::new("."),
//! )?;
//! let http = HttpSandbox::new(&policy);
//!
//! assert_eq!(http.check_url("https://EXAMPLE.com./a")?.as_str(), "https://example.com./a");
//! assert!(http.check_url("https://docs.example.org/").is_ok());
//! // `*.example.org` does not match `example.org` itself, nor `evilexample.org`.
//! assert!(http.check_url("https://example.org/").is_err_and(|e| e.is_denied()));
//! assert!(http.check_url("https://evilexample.org/").is_err_and(|e| e.is_denied()));
//! // IP addresses in any notation are addresses, allowed only when listed.
//! assert!(http.check_url("http://0x7f000001/").is_err_and(|e| e.is_denied()));
//! // Credentials and other schemes are refused.
//! assert!(http.check_url("http://example.com@127.0.0.1/").is_err_and(|e| e.is_denied()));
//! assert!(http.check_url("file:///etc/passwd").is_err_and(|e| e.is_denied()));
//! // An allowed name that resolves to a private address is denied.
//! let private = "10.0.0.7".parse()?;
//! assert!(http.check_resolved("example.com", private).is_err_and(|e| e.is_denied()));
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
//!   access; no `[http]` means no network access; unknown keys in the policy are errors (they
//!   are usually typos), and so are `allow_domains` entries that are not a host, an IP
//!   address or `*.` and a domain.
//! - **Hosts are compared after the URL standard's normalization**, which the `url` crate
//!   applies: lowercase, IDNA, every IPv4 notation read as an address. Policy entries go
//!   through the same parser at load, so `Example.COM.` in a policy and `example.com` in a URL
//!   agree, and `0x7f000001` in a URL is `127.0.0.1`.
//! - **Addresses are checked twice**: a host that is an address is checked in the URL; a name
//!   is checked in the URL and each address it resolves to is checked before connecting, so a
//!   name that an attacker points at `127.0.0.1` or `169.254.169.254` gets nowhere unless the
//!   policy lists that address.
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

mod confined;
mod error;
mod hosts;
mod http;
mod names;
mod policy;
mod program_line;
pub mod programs;
mod sandbox;
mod second_line;

pub use confined::{ConfinedFile, ConfinedPath};
pub use error::SandboxError;
pub use http::{HttpSandbox, MAX_URL_BYTES};
pub use policy::{
    DEFAULT_MAX_IO_BYTES, DEFAULT_MAX_RESPONSE_BYTES, FsPolicy, HttpPolicy, MAX_ALLOW_DOMAINS,
    MAX_ALLOW_PORTS, MAX_ALLOW_ROOTS, MAX_DENY_NAMES, MAX_IO_BYTES_LIMIT, MAX_POLICY_BYTES,
    MAX_RESPONSE_BYTES_LIMIT, Policy,
};
pub use program_line::{
    DECLARED_FOLDER_ENTRIES_MAX, INTERPRETERS_FOLLOWED_MAX, PROGRAM_WRITABLE, ProgramAccess,
    launch, launcher_running, start_launcher,
};
pub use sandbox::{FsSandbox, MAX_NAME_BYTES, MAX_PATH_BYTES};
pub use second_line::{
    DNS_TCP_PORT, NetworkLine, SYSTEM_READ_ONLY, SecondLine, restrict_network, restrict_to_roots,
};
