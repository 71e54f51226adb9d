//! The file sandbox's path ruling on arbitrary input: never panics, and whatever it allows
//! stays lexically inside an allowed root and names no denied file.

#![no_main]

use std::path::{Component, Path, PathBuf};
use std::sync::OnceLock;

use agent_kernel_sandbox::{FsSandbox, Policy};
use libfuzzer_sys::fuzz_target;

struct Setup {
    _dir: PathBuf,
    cwd: PathBuf,
    sandbox: FsSandbox,
}

fn setup() -> &'static Setup {
    static SETUP: OnceLock<Setup> = OnceLock::new();
    SETUP.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("agent-kernel-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("workspace/sub")).expect("creates the root");
        let policy = Policy::from_toml_str(
            "[fs]\nallow = [\"workspace\"]\ndeny_names = [\".env\", \"*.pem\", \"id_rsa\"]\n",
            &dir,
        )
        .expect("the fuzz policy is valid");
        let sandbox = FsSandbox::new(&policy).expect("the root opens");
        let cwd = dir.canonicalize().expect("canonical");
        Setup {
            _dir: dir,
            cwd,
            sandbox,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(path) = std::str::from_utf8(data) else {
        return;
    };
    let setup = setup();
    if let Ok(confined) = setup.sandbox.resolve(path, &setup.cwd) {
        assert!(
            setup.sandbox.roots().contains(&confined.root()),
            "{path:?} resolved under a root that is not allowed"
        );
        let mut depth: i64 = 0;
        for component in confined.rel().components() {
            match component {
                Component::ParentDir => depth -= 1,
                Component::Normal(name) => {
                    depth += 1;
                    let name = name.to_string_lossy().to_lowercase();
                    assert!(
                        name != ".env" && !name.ends_with(".pem") && name != "id_rsa",
                        "{path:?} allowed a denied name"
                    );
                }
                Component::CurDir => {}
                Component::RootDir | Component::Prefix(_) => {
                    panic!("{path:?} resolved to an absolute remainder")
                }
            }
            assert!(depth >= 0, "{path:?} climbs above its root");
        }
        assert!(!Path::new(confined.rel()).as_os_str().is_empty());
    }
});
