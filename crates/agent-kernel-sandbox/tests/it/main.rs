//! Integration tests of the sandbox, one module per topic, on real temporary folders.

mod http;
mod ops;
mod policy;
mod props;
mod resolve;

use std::fs;
use std::path::{Path, PathBuf};

use agent_kernel_sandbox::{FsSandbox, Policy};

/// A temporary tree: `base/workspace` (the allowed root, holding `a.txt`) and
/// `base/outside` (holding `secret.txt`), with a policy allowing `workspace`.
pub(crate) struct Fixture {
    _dir: tempfile::TempDir,
    pub(crate) base: PathBuf,
    pub(crate) sandbox: FsSandbox,
}

impl Fixture {
    pub(crate) fn new() -> Fixture {
        Fixture::with_fs_section(
            r#"allow = ["workspace"]
deny_names = [".env", "*.pem", ".git"]
max_io_bytes = 64"#,
        )
    }

    pub(crate) fn with_fs_section(fs_section: &str) -> Fixture {
        let dir = tempfile::tempdir().expect("temp dir");
        let base = dir.path().canonicalize().expect("canonical temp dir");
        fs::create_dir(base.join("workspace")).expect("workspace");
        fs::create_dir(base.join("outside")).expect("outside");
        fs::write(base.join("workspace/a.txt"), "alpha").expect("a.txt");
        fs::write(base.join("outside/secret.txt"), "secret").expect("secret.txt");
        let policy =
            Policy::from_toml_str(&format!("[fs]\n{fs_section}\n"), &base).expect("policy");
        let sandbox = FsSandbox::new(&policy).expect("sandbox");
        Fixture {
            _dir: dir,
            base,
            sandbox,
        }
    }

    pub(crate) fn workspace(&self) -> PathBuf {
        self.base.join("workspace")
    }

    pub(crate) fn path(&self, rel: &str) -> PathBuf {
        self.base.join(rel)
    }

    pub(crate) fn read(&self, rel: &str) -> String {
        fs::read_to_string(self.path(rel)).expect("readable")
    }

    /// The names in `rel`, sorted.
    pub(crate) fn listing(&self, rel: &str) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(self.path(rel))
            .expect("listable")
            .map(|entry| {
                entry
                    .expect("entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        names.sort();
        names
    }
}

pub(crate) fn symlink(target: impl AsRef<Path>, link: impl AsRef<Path>) {
    std::os::unix::fs::symlink(target, link).expect("symlink");
}
