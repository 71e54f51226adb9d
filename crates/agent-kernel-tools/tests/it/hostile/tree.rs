//! The hostile tree planted inside and outside the root, and its snapshots.

#[allow(clippy::wildcard_imports)]
use super::*;

/// A file system entry as the snapshot records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Node {
    Dir {
        mode: u32,
    },
    File {
        mode: u32,
        links: u64,
        bytes: Vec<u8>,
    },
    Symlink {
        target: PathBuf,
    },
    Special {
        mode: u32,
    },
}

impl fmt::Display for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Node::Dir { mode } => write!(f, "folder {mode:o}"),
            Node::File { mode, links, bytes } => write!(
                f,
                "file {mode:o}, {links} links, {:?}",
                String::from_utf8_lossy(bytes)
            ),
            Node::Symlink { target } => write!(f, "link to {}", target.display()),
            Node::Special { mode } => write!(f, "special file {mode:o}"),
        }
    }
}

/// Every entry under a folder, by path relative to it, never following a link.
pub(super) type Snapshot = BTreeMap<PathBuf, Node>;

pub(super) fn snapshot(top: &Path, skip: Option<&Path>) -> Snapshot {
    let mut nodes = Snapshot::new();
    let mut pending = vec![top.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir).expect("a folder of the tree is listable") {
            let path = entry.expect("a folder entry").path();
            if skip == Some(path.as_path()) {
                continue;
            }
            let metadata = fs::symlink_metadata(&path).expect("an entry is inspectable");
            let mode = metadata.permissions().mode();
            let kind = metadata.file_type();
            let node = if kind.is_symlink() {
                Node::Symlink {
                    target: fs::read_link(&path).expect("a link is readable"),
                }
            } else if kind.is_dir() {
                pending.push(path.clone());
                Node::Dir { mode }
            } else if kind.is_file() {
                Node::File {
                    mode,
                    links: metadata.nlink(),
                    bytes: fs::read(&path).expect("a file is readable"),
                }
            } else {
                Node::Special { mode }
            };
            let rel = path.strip_prefix(top).expect("under the top").to_path_buf();
            nodes.insert(rel, node);
        }
    }
    nodes
}

pub(super) fn without_links(snapshot: &Snapshot) -> Snapshot {
    snapshot
        .iter()
        .map(|(path, node)| {
            let node = match node {
                Node::File { mode, bytes, .. } => Node::File {
                    mode: *mode,
                    links: 0,
                    bytes: bytes.clone(),
                },
                other => other.clone(),
            };
            (path.clone(), node)
        })
        .collect()
}

/// The differences from `before` to `after`, one line each.
pub(super) fn differences(before: &Snapshot, after: &Snapshot) -> Vec<String> {
    let mut lines = Vec::new();
    for (path, node) in before {
        match after.get(path) {
            None => lines.push(format!("removed {}: was {node}", path.display())),
            Some(now) if now != node => {
                lines.push(format!("changed {}: {node} -> {now}", path.display()));
            }
            Some(_) => {}
        }
    }
    for (path, node) in after {
        if !before.contains_key(path) {
            lines.push(format!("appeared {}: {node}", path.display()));
        }
    }
    lines
}

pub(super) fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("mkfifo runs");
    assert!(status.success(), "mkfifo {}: {status}", path.display());
}

/// The canaries: everything under `base` but the root.
pub(super) fn plant_outside(base: &Path) {
    for dir in [
        "outside",
        "outside/dir",
        "outside/dir/nested",
        "outside/empty",
        "workspace2",
        "workspace-old",
    ] {
        fs::create_dir(base.join(dir)).expect("a canary folder");
    }
    for rel in [
        "canary.txt",
        "outside/secret.txt",
        "outside/.env",
        "outside/dir/inner.txt",
        "outside/dir/file.txt",
        "outside/dir/nested/deep.txt",
        "workspace2/x.txt",
        "workspace-old/x.txt",
    ] {
        fs::write(base.join(rel), format!("{CANARY} {rel}\n")).expect("a canary file");
    }
    mkfifo(&base.join("outside/pipe"));
}

/// The root's hostile content; the root itself exists.
pub(super) fn plant_inside(base: &Path) {
    let root = base.join("workspace");
    for dir in [
        "sub",
        "sub/deeper",
        "sub/.Git",
        "empty",
        "win",
        "win2",
        "keys",
        "ssh",
        ".git",
        "swap",
    ] {
        fs::create_dir(root.join(dir)).expect("a folder in the root");
    }
    for rel in [
        "a.txt",
        "sub/b.txt",
        "sub/deeper/c.txt",
        "sub/.env",
        "sub/deeper/.ENV",
        "keys/server.pem",
        "keys/KEY.PEM",
        ".git/config",
        "sub/.Git/HEAD",
        "ssh/id_rsa",
        "ssh/Id_Rsa",
        "swap/file.txt",
    ] {
        fs::write(root.join(rel), format!("inside {rel}\n")).expect("a file in the root");
    }
    for name in WINDOWS_NAMES {
        fs::write(root.join("win").join(name), format!("plain name {name}\n"))
            .expect("a Windows name is a plain name here");
    }
    let base_text = base.display().to_string();
    for &(name, target, _) in LINKS {
        symlink(target.replace("{base}", &base_text), root.join(name)).expect("a planted link");
    }
    // `long_chain_00` is in LINKS; the rest of the chain ends at a.txt.
    for idx in 1..LONG_CHAIN_LEN {
        let target = if idx + 1 == LONG_CHAIN_LEN {
            "a.txt".to_owned()
        } else {
            format!("long_chain_{:02}", idx + 1)
        };
        symlink(target, root.join(format!("long_chain_{idx:02}"))).expect("a chain link");
    }
    for &(name, canary) in HARD_LINKS {
        fs::hard_link(base.join(canary), root.join(name)).expect("a hard link to a canary");
    }
    for fifo in FIFOS {
        mkfifo(&root.join(fifo));
    }
}

/// The hostile tree and the built-in tools confined to its root.
pub(super) struct Tree {
    pub(super) _dir: tempfile::TempDir,
    pub(super) base: PathBuf,
    pub(super) root: PathBuf,
    pub(super) tools: Vec<Arc<dyn DynTool>>,
    /// Outside the root, link counts left out.
    pub(super) outside: Snapshot,
    /// Inside the root, as planted.
    pub(super) inside: Snapshot,
}

impl Tree {
    pub(super) fn new() -> Tree {
        let dir = tempfile::tempdir().expect("temp dir");
        let base = dir.path().canonicalize().expect("canonical temp dir");
        let root = base.join("workspace");
        plant_outside(&base);
        fs::create_dir(&root).expect("the root");
        plant_inside(&base);
        let policy = Policy::from_toml_str(POLICY, &base).expect("policy");
        let sandbox = Arc::new(FsSandbox::new(&policy).expect("sandbox"));
        let tools = builtin_tools(sandbox, Arc::new(HttpSandbox::deny_all()), base.clone())
            .into_iter()
            .map(agent_kernel_api::ToolEntry::into_dyn)
            .collect();
        let outside = without_links(&snapshot(&base, Some(&root)));
        let inside = snapshot(&root, None);
        Tree {
            _dir: dir,
            base,
            root,
            tools,
            outside,
            inside,
        }
    }

    pub(super) fn tool(&self, tool: Tool) -> Arc<dyn DynTool> {
        self.tools
            .iter()
            .find(|candidate| candidate.id() == tool.id())
            .cloned()
            .unwrap_or_else(|| panic!("no tool {}", tool.id()))
    }

    /// `check`, `prepare`, `execute` and, for a mutating tool whose `prepare` succeeded,
    /// `compensate`, as the saga engine runs a step and rolls it back.
    ///
    /// With `form`, a successful effect is looked for where the kernel resolves the path,
    /// before compensation; every successful read is checked for a canary's bytes.
    pub(super) async fn call(
        &self,
        step_seq: usize,
        tool: Tool,
        path: &str,
        durability: Durability,
        form: Option<&Form>,
    ) -> Outcome {
        let content = format!("HOSTILE-{step_seq}");
        let args = tool.args(path, &content);
        let dyn_tool = self.tool(tool);
        let ctx = ToolContext {
            durability,
            ..ctx(
                tool.id(),
                u32::try_from(step_seq).expect("fewer steps than u32::MAX"),
            )
        };
        if let Err(error) = dyn_tool.check(&args) {
            return Outcome::stopped(Phase::Check, error);
        }
        let undo = match prepare(&dyn_tool, &ctx, &args).await {
            Ok(undo) => undo,
            Err(error) => return Outcome::stopped(Phase::Prepare, error),
        };
        let result = dyn_tool.execute(&ctx, &args).await;
        let reads_canary = form.is_some_and(|form| form.reads_canary);
        let effect = match (&result, form) {
            (Ok(output), Some(_)) => self.effect_inside(tool, path, &content, output, reads_canary),
            (Ok(output), None) => no_canary_read(output, reads_canary),
            (Err(_), _) => Ok(()),
        };
        let compensation = if tool.mutates() {
            Some(
                dyn_tool
                    .compensate(&ctx, &args, &undo, result.as_ref().ok())
                    .await,
            )
        } else {
            None
        };
        Outcome {
            phase: Phase::Execute,
            result,
            effect,
            compensation,
        }
    }

    /// Where the kernel resolves `path` (relative to the base, as the tools resolve it):
    /// canonical and inside the root, or why not.
    pub(super) fn resolved_inside(&self, path: &Path) -> Result<PathBuf, String> {
        let canonical = fs::canonicalize(path)
            .map_err(|error| format!("cannot resolve `{}`: {error}", path.display()))?;
        if canonical.starts_with(&self.root) {
            Ok(canonical)
        } else {
            Err(format!(
                "`{}` resolves to `{}`, outside the root",
                path.display(),
                canonical.display()
            ))
        }
    }

    /// Checks a successful call's effect: written, removed or read inside the root.
    pub(super) fn effect_inside(
        &self,
        tool: Tool,
        path: &str,
        content: &str,
        output: &ToolOutput,
        reads_canary: bool,
    ) -> Result<(), String> {
        // As the sandbox reads a path: `.` and doubled slashes dropped, `..` kept.
        let target: PathBuf = self.base.join(path).components().collect();
        if tool == Tool::Delete {
            return match fs::symlink_metadata(&target) {
                Err(error) if error.kind() == io::ErrorKind::NotFound => {
                    let folder = target.parent().ok_or("a deleted path has a folder")?;
                    self.resolved_inside(folder).map(|_| ())
                }
                Ok(_) => Err(format!("`{}` is still there", target.display())),
                Err(error) => Err(format!("cannot inspect `{}`: {error}", target.display())),
            };
        }
        let canonical = self.resolved_inside(&target)?;
        let metadata = fs::metadata(&canonical)
            .map_err(|error| format!("cannot inspect `{}`: {error}", canonical.display()))?;
        if !metadata.is_file() {
            return Err(format!("`{}` is not a regular file", canonical.display()));
        }
        let bytes = fs::read(&canonical)
            .map_err(|error| format!("cannot read `{}`: {error}", canonical.display()))?;
        let shown = String::from_utf8_lossy(&bytes);
        let found = match tool {
            Tool::Write => bytes == content.as_bytes(),
            Tool::Append => bytes.ends_with(content.as_bytes()),
            Tool::Read => output.data["content"].as_str() == Some(&*shown),
            Tool::Validate => output.data["bytes"] == json!(bytes.len()),
            Tool::Delete => unreachable!("handled above"),
        };
        if !found {
            return Err(format!(
                "`{}` holds {shown:?}, which does not match the output {}",
                canonical.display(),
                output.data
            ));
        }
        if !tool.mutates() && !reads_canary && shown.contains(CANARY) {
            return Err(format!(
                "a read returned a canary's bytes from `{}`",
                canonical.display()
            ));
        }
        Ok(())
    }

    /// Panics, naming `shown`, if anything outside the root changed or appeared.
    pub(super) fn assert_outside_unchanged(&self, shown: &str) {
        let now = without_links(&snapshot(&self.base, Some(&self.root)));
        let differences = differences(&self.outside, &now);
        assert!(
            differences.is_empty(),
            "ESCAPE after {shown}: outside the root\n{}",
            differences.join("\n")
        );
    }

    /// Panics, naming `shown`, unless the root holds what was planted, link counts aside
    /// (compensation puts back bytes, not the hard link); then plants it again if a hard link
    /// was replaced, so the next case meets the same tree.
    pub(super) fn assert_inside_restored(&self, shown: &str) {
        let now = snapshot(&self.root, None);
        if now == self.inside {
            return;
        }
        let differences = differences(&without_links(&self.inside), &without_links(&now));
        assert!(
            differences.is_empty(),
            "after {shown} and its compensation, the root differs from before\n{}",
            differences.join("\n")
        );
        self.replant();
    }

    pub(super) fn replant(&self) {
        for entry in fs::read_dir(&self.root).expect("the root is listable") {
            let path = entry.expect("an entry of the root").path();
            let metadata = fs::symlink_metadata(&path).expect("inspectable");
            if metadata.is_dir() {
                fs::remove_dir_all(&path).expect("remove a planted folder");
            } else {
                fs::remove_file(&path).expect("remove a planted entry");
            }
        }
        plant_inside(&self.base);
        assert_eq!(
            snapshot(&self.root, None),
            self.inside,
            "planting again gives the same root"
        );
    }
}
