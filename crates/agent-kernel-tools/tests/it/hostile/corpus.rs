//! The corpus: every hostile path form, each with what every tool must do with it.

#[allow(clippy::wildcard_imports)]
use super::*;

impl Corpus {
    pub(super) fn new(base: &Path) -> Corpus {
        Corpus {
            base: base.display().to_string(),
            forms: Vec::new(),
        }
    }

    pub(super) fn add(&mut self, category: &'static str, path: &str, expects: Expects) {
        self.forms.push(Form {
            category,
            path: path.replace("{base}", &self.base),
            expects,
            reads_canary: false,
        });
    }

    pub(super) fn all(&mut self, category: &'static str, path: &str, expect: Expect) {
        self.add(category, path, Expects::all(expect));
    }

    /// Every form, in a fixed order.
    pub(super) fn build(base: &Path) -> Vec<Form> {
        let mut corpus = Corpus::new(base);
        corpus.dot_dot();
        corpus.absolute();
        corpus.outside_by_name();
        corpus.symbolic_links();
        corpus.through_linked_folders();
        corpus.hard_links();
        corpus.special_files();
        corpus.proc_and_dev();
        corpus.nul_bytes();
        corpus.long_names();
        corpus.denied_names();
        corpus.look_alikes();
        corpus.windows_names();
        corpus.encodings();
        corpus.forms
    }

    /// `..` climbing out of the root at every depth, spelled six ways; and `..` that stays in.
    pub(super) fn dot_dot(&mut self) {
        const TARGETS: [&str; 7] = [
            "outside/secret.txt",
            "outside/dir/inner.txt",
            "outside/dir/new.txt",
            "outside/new.txt",
            "canary.txt",
            "new.txt",
            "outside/.env",
        ];
        // Existing folders and missing ones: `..` is never looked up on the disk first.
        const DOWN: [&str; 5] = ["sub", "deeper", "missing", "x", "inner_dir_link"];
        let base_rel = self.base.trim_start_matches('/').to_owned();
        let n_base_names = Path::new(&self.base).components().count() - 1;
        for target in TARGETS {
            for depth in 0..=DOWN.len() {
                let down: String = DOWN[..depth]
                    .iter()
                    .map(|name| format!("{name}/"))
                    .collect();
                let dotted_down: String = DOWN[..depth]
                    .iter()
                    .map(|name| format!("{name}/./"))
                    .collect();
                let ups = "../".repeat(depth + 1);
                let plain = format!("workspace/{down}{ups}{target}");
                let forms = [
                    plain.clone(),
                    format!(
                        "./workspace/./{dotted_down}{}{target}",
                        "./../".repeat(depth + 1)
                    ),
                    plain.replace('/', "//"),
                    format!("{plain}/"),
                    format!("{{base}}/{plain}"),
                    // To `/` and down again into the base, by its absolute spelling.
                    format!(
                        "workspace/{down}{}{base_rel}/{target}",
                        "../".repeat(depth + 1 + n_base_names)
                    ),
                ];
                for path in forms {
                    self.all("..", &path, Expect::RefusedByCheck);
                }
            }
        }
        for path in [
            "workspace/../workspace/a.txt",
            "workspace/sub/../../workspace/a.txt",
            "workspace/a.txt/../../outside/secret.txt",
            "workspace/..",
            "workspace/sub/..",
            "workspace/sub/deeper/../..",
        ] {
            self.all("..", path, Expect::RefusedByCheck);
        }
        for path in [
            "workspace/sub/../a.txt",
            "workspace/sub/deeper/../../a.txt",
            "workspace/./sub/.././a.txt",
        ] {
            self.all("..", path, Expect::Succeeds);
        }
        // Lexically inside, but the kernel does not normalize: `missing/..` needs `missing`.
        for path in [
            "workspace/missing/../a.txt",
            "workspace/a.txt/../a.txt",
            "workspace/sub/.",
            "workspace/a.txt/.",
        ] {
            self.all("..", path, Expect::Contained);
        }
    }

    /// Absolute paths: to the canaries, to names beside the root, to the root itself.
    pub(super) fn absolute(&mut self) {
        for rel in [
            "outside/secret.txt",
            "canary.txt",
            "outside/dir/inner.txt",
            "outside/dir/new.txt",
            "outside/new.txt",
            "new.txt",
            "outside/.env",
            "outside/pipe",
            "outside/dir",
            "workspace2/x.txt",
            "workspace-old/x.txt",
            "WORKSPACE/a.txt",
            "workspace/../outside/secret.txt",
            "./workspace/../outside/secret.txt",
            "workspace/sub/../../outside/secret.txt",
            "workspace",
            "workspace/",
            "workspace/.",
            "workspace/..",
            "",
        ] {
            self.all(
                "absolute",
                &format!("{{base}}/{rel}"),
                Expect::RefusedByCheck,
            );
        }
        for path in ["{base}", "/{base}/outside/secret.txt", "/", "//", "///"] {
            self.all("absolute", path, Expect::RefusedByCheck);
        }
        for path in [
            "{base}/workspace/a.txt",
            "{base}//workspace///a.txt",
            "{base}/./workspace/./a.txt",
            "{base}/workspace/sub/b.txt",
            "//{base}/workspace/a.txt",
        ] {
            self.all("absolute", path, Expect::Succeeds);
        }
        self.add(
            "absolute",
            "{base}/workspace/empty/new.txt",
            Expects::new_file(),
        );
    }

    /// Relative paths whose first name is not the root's.
    pub(super) fn outside_by_name(&mut self) {
        for path in [
            "outside/secret.txt",
            "canary.txt",
            "./outside/secret.txt",
            "../outside/secret.txt",
            "new.txt",
            "workspace2/x.txt",
            "workspace-old/x.txt",
            "WORKSPACE/a.txt",
            "Workspace/a.txt",
            "workspace /a.txt",
            " workspace/a.txt",
            "workspace\\a.txt",
            "workspace\\..\\outside\\secret.txt",
            "..\\outside\\secret.txt",
            "C:\\Windows\\win.ini",
            "C:/Windows/win.ini",
            "\\\\?\\C:\\secret.txt",
            "\\\\.\\pipe\\x",
            "./workspace/../outside/secret.txt",
            "workspace",
            "./workspace",
            ".",
            "..",
            "./",
            "",
            "~",
            "~/x.txt",
            "$HOME/x.txt",
            "${PWD}/outside/secret.txt",
            "file://{base}/outside/secret.txt",
            "file:workspace/a.txt",
            "workspace/",
            "workspace/.",
            "workspace/./.",
            "workspace/a.txt/",
            "workspace/sub/",
        ] {
            self.all("outside by name", path, Expect::RefusedByCheck);
        }
    }

    /// Every planted symbolic link, alone and as a folder, after two spellings of the root.
    pub(super) fn symbolic_links(&mut self) {
        for &(name, _, link) in LINKS {
            for suffix in LINK_SUFFIXES {
                let expects = link_expects(link, suffix.is_empty());
                for prefix in ROOT_PREFIXES {
                    self.add("symbolic link", &format!("{prefix}{name}{suffix}"), expects);
                }
            }
        }
    }

    /// Paths that walk through linked folders, out of the root and back into it.
    pub(super) fn through_linked_folders(&mut self) {
        for path in [
            "workspace/out_dir/nested/deep.txt",
            "workspace/out_dir_rel/nested/new.txt",
            "workspace/out_parent/outside/secret.txt",
            "workspace/out_parent/canary.txt",
            "workspace/out_parent/new.txt",
            "workspace/out_base/outside/secret.txt",
            "workspace/out_base/outside/dir/new.txt",
            "workspace/sub/up2/outside/secret.txt",
            "workspace/sub/up2/canary.txt",
            "workspace/sub/up/../outside/secret.txt",
            "workspace/sub/up/../canary.txt",
            "workspace/inner_dir_link/up2/outside/secret.txt",
            "workspace/chain_dir_a/nested/new.txt",
            "workspace/root_link{base}/outside/secret.txt",
            "workspace/root_link{base}/outside/new.txt",
            "workspace/proc_root{base}/outside/secret.txt",
            "workspace/proc_root{base}/outside/dir/new.txt",
            "workspace/proc_self/root{base}/outside/secret.txt",
            "workspace/proc_self/cwd/x.txt",
        ] {
            self.all("through linked folders", path, Expect::Refused);
        }
        // Out and back in: refused or not, never anywhere else.
        for path in [
            "workspace/out_parent/workspace/a.txt",
            "workspace/out_base/workspace/a.txt",
            "workspace/root_link{base}/workspace/a.txt",
            "workspace/proc_root{base}/workspace/a.txt",
            "workspace/inner_dir_link/../canary.txt",
            "workspace/gitlink/../secret.txt",
        ] {
            self.all("through linked folders", path, Expect::Contained);
        }
        for path in [
            "workspace/sub/up/a.txt",
            "workspace/sub/up/sub/up/sub/up/a.txt",
            "workspace/inner_dir_link/b.txt",
            "workspace/inner_dir_link/deeper/c.txt",
            "workspace/inner_dir_link/up/inner_dir_link/b.txt",
            "workspace/inner_dir_link/../a.txt",
        ] {
            self.all("through linked folders", path, Expect::Succeeds);
        }
        self.add(
            "through linked folders",
            "workspace/inner_dir_link/new.txt",
            Expects::new_file(),
        );
        self.all(
            "through linked folders",
            "workspace/gitlink/config",
            Expect::Refused,
        );
        // More links in one path than the kernel follows.
        let many = format!("workspace/{}a.txt", "inner_dir_link/up/".repeat(30));
        self.all("through linked folders", &many, Expect::Contained);
    }

    /// Hard links to canaries, spelled four ways.
    pub(super) fn hard_links(&mut self) {
        for &(name, _) in HARD_LINKS {
            for prefix in [
                "workspace/",
                "workspace/./",
                "{base}/workspace/",
                "workspace/sub/../",
            ] {
                let path = format!("{prefix}{name}").replace("{base}", &self.base);
                self.forms.push(Form {
                    category: "hard link",
                    path,
                    expects: Expects::hard_link(),
                    reads_canary: true,
                });
            }
        }
    }

    /// FIFOs and folders where a file is expected.
    pub(super) fn special_files(&mut self) {
        for path in [
            "workspace/fifo",
            "workspace/./fifo",
            "{base}/workspace/fifo",
            "workspace/sub/fifo2",
            "workspace/inner_dir_link/fifo2",
            "workspace/fifo/x.txt",
            "workspace/sub",
            "workspace/empty",
            "workspace/swap",
        ] {
            self.all("special file", path, Expect::Fails);
        }
    }

    /// `/proc` and `/dev`, leading back into the base where they would lead anywhere.
    pub(super) fn proc_and_dev(&mut self) {
        let base_rel = self.base.trim_start_matches('/').to_owned();
        let up = "../".repeat(16);
        for path in [
            "/proc/self/root{base}/outside/secret.txt".to_owned(),
            "/proc/self/root{base}/outside/new.txt".to_owned(),
            "/proc/self/root{base}/workspace/a.txt".to_owned(),
            "/proc/thread-self/root{base}/outside/secret.txt".to_owned(),
            "/proc/1/root{base}/outside/secret.txt".to_owned(),
            "/proc/self/root/proc/self/root{base}/outside/secret.txt".to_owned(),
            format!("/proc/self/cwd/{up}{base_rel}/outside/secret.txt"),
            format!("/proc/self/cwd/{up}{base_rel}/workspace/a.txt"),
            "/proc/self/cwd/x.txt".to_owned(),
            "/proc/self/fd/0".to_owned(),
            "/proc/self/fd/3".to_owned(),
            "workspace/../../proc/self/root{base}/outside/secret.txt".to_owned(),
            "/dev/null".to_owned(),
            "/dev/zero".to_owned(),
            "/dev/full".to_owned(),
            "/dev/stdin".to_owned(),
            "/dev/fd/0".to_owned(),
        ] {
            self.all("/proc and /dev", &path, Expect::RefusedByCheck);
        }
    }

    pub(super) fn nul_bytes(&mut self) {
        for path in [
            "\0",
            "workspace/\0",
            "workspace/a.txt\0",
            "workspace/a\0.txt",
            "workspace/a.txt\0/../../outside/secret.txt",
            "workspace/sub\0/../../outside/secret.txt",
            "\0/../outside/secret.txt",
            "{base}/outside/secret.txt\0",
            "workspace/.env\0.txt",
        ] {
            self.all("NUL byte", path, Expect::RefusedByCheck);
        }
    }

    /// Names over 255 bytes and paths over 4,096, and both just at their limits.
    pub(super) fn long_names(&mut self) {
        for path in [
            format!("workspace/{}", "a".repeat(256)),
            format!("workspace/{}", "\u{e9}".repeat(128)),
            format!("workspace/sub/{}/x.txt", "b".repeat(300)),
            format!("workspace/{}", "c".repeat(10_000)),
            format!("workspace/{}.PEM", "k".repeat(251)),
            format!("workspace/{}y", "x/".repeat(2_044)),
            format!("workspace/{}a.txt", "./".repeat(2_041)),
            format!("workspace/{}a.txt", "sub/../".repeat(600)),
            format!("workspace/{}outside/secret.txt", "../".repeat(1_400)),
        ] {
            self.all("long", &path, Expect::RefusedByCheck);
        }
        for path in [
            format!("workspace/{}", "a".repeat(255)),
            format!("workspace/{}", "\u{20ac}".repeat(85)),
        ] {
            self.add("long", &path, Expects::new_file());
        }
        for path in [
            format!("workspace/{}a.txt", "./".repeat(2_040)),
            format!("workspace/{}a.txt", "sub/../".repeat(580)),
        ] {
            self.all("long", &path, Expect::Succeeds);
        }
    }

    /// Every case of every denied name, at every depth, as a file and as a folder.
    pub(super) fn denied_names(&mut self) {
        for name in DENIED_VARIANTS {
            for position in [
                "workspace/{name}",
                "workspace/sub/{name}",
                "workspace/sub/deeper/{name}",
                "workspace/{name}/config",
                "workspace/sub/{name}/deeper/x.txt",
                "workspace/./sub/./{name}",
                "{base}/workspace/sub/{name}",
                "workspace/inner_dir_link/{name}",
                "workspace/sub/../{name}",
                "workspace/missing/{name}/x.txt",
            ] {
                let path = position.replace("{name}", name);
                self.all("denied name", &path, Expect::RefusedByCheck);
            }
        }
    }

    pub(super) fn look_alikes(&mut self) {
        for name in LOOK_ALIKES {
            for position in [
                "workspace/{name}",
                "workspace/empty/{name}",
                "workspace/sub/deeper/{name}",
            ] {
                let path = position.replace("{name}", name);
                self.all("look-alike", &path, Expect::Contained);
            }
        }
    }

    /// Windows reserved names and stream syntax are plain names here: allowed inside the root.
    pub(super) fn windows_names(&mut self) {
        for name in WINDOWS_NAMES {
            for prefix in [
                "workspace/win/",
                "workspace/win/./",
                "{base}/workspace/win/",
            ] {
                self.all("windows name", &format!("{prefix}{name}"), Expect::Succeeds);
            }
            self.add(
                "windows name",
                &format!("workspace/win2/{name}"),
                Expects::new_file(),
            );
        }
    }

    /// Encoded `..`: plain names, inside the root when under it, refused when not.
    pub(super) fn encodings(&mut self) {
        for encoded in ENCODINGS {
            self.all("encoding", encoded, Expect::RefusedByCheck);
            self.all(
                "encoding",
                &format!("workspace/{encoded}"),
                Expect::Contained,
            );
            self.all(
                "encoding",
                &format!("workspace/empty/{encoded}"),
                Expect::Contained,
            );
        }
    }
}
