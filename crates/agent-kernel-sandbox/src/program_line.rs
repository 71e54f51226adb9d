//! Least privilege for the programs of command tools under the second line.
//!
//! A command tool's program may reach exactly what it was declared with
//! ([`ProgramAccess`], resolved when the tools file loads): the program as resolved (its
//! symbolic links followed, a script's interpreter through its `#!` line, the installation
//! each of them lives in, a virtualenv's folder), the files and folders named on its
//! command line, its tool's `read` and `write` folders, the policy's allowed roots (as the
//! built-in tools do) and the system folders of [`SYSTEM_READ_ONLY`]. Never the files the
//! operator protects (the log, its journal and head files, the audit and operator key
//! files: [`start_launcher`]) or a name the policy denies: a declared path that is, or holds,
//! one of them is refused when its program would start.
//!
//! Landlock confines a thread and what it starts, and a confined thread can never widen
//! its rules; so the kernel, which confines itself to the roots, starts programs from a
//! launcher thread it started before ([`start_launcher`]): for each run the launcher starts
//! a thread that confines itself to that program's access (and the policy's network rules)
//! and only then runs the caller's job, which starts the program ([`launch`]).

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use landlock::{Access, AccessFs, RulesetCreatedAttr, RulesetStatus, path_beneath_rules};

use crate::second_line::{LANDLOCK_ABI, NetworkLine, restrict_network, roots_ruleset};
use crate::{Policy, SandboxError};

/// The most `#!` interpreters followed from one program (a script run by a script ...).
pub const INTERPRETERS_FOLLOWED_MAX: usize = 4;

/// The most bytes of a program read to find its `#!` line.
const SHEBANG_BYTES_MAX: usize = 256;

/// The most entries looked at in each `read` or `write` folder for a denied name or a
/// protected file; a folder with more is refused (list narrower folders).
pub const DECLARED_FOLDER_ENTRIES_MAX: usize = 10_000;

/// Files every program may also write: output thrown away.
pub const PROGRAM_WRITABLE: [&str; 1] = ["/dev/null"];

/// What one command tool's program may reach beyond the roots and the system folders.
#[derive(Debug, Default)]
pub struct ProgramAccess {
    /// Read and execute: the resolved programs, interpreters and installations, and the
    /// files named on the command lines.
    run: BTreeSet<PathBuf>,
    /// Read: the tool's `read` folders.
    read: BTreeSet<PathBuf>,
    /// Read and write: the tool's `write` folders.
    write: BTreeSet<PathBuf>,
    /// Whether none of them holds a protected file or a denied name, once checked.
    checked: OnceLock<Result<(), String>>,
}

impl ProgramAccess {
    /// The access of the tool whose phases run `commands` from `folder` (the tools file's
    /// folder) with `path_var` as `PATH`, with its declared `read` and `write` folders
    /// (relative to `folder`).
    ///
    /// # Errors
    ///
    /// [`SandboxError::ProgramAccess`] naming a declared folder that does not exist.
    pub fn resolve(
        folder: &Path,
        commands: &[&[String]],
        path_var: Option<&OsStr>,
        read: &[String],
        write: &[String],
    ) -> Result<ProgramAccess, SandboxError> {
        let mut access = ProgramAccess::default();
        let mut followed = BTreeSet::new();
        for command in commands {
            let Some((program, arguments)) = command.split_first() else {
                continue;
            };
            if let Some(found) = find_program(folder, program, path_var) {
                access.add_program(&found, path_var, 0, &mut followed);
            }
            for argument in arguments {
                let named = folder.join(argument);
                if !argument.is_empty()
                    && let Ok(resolved) = fs::canonicalize(&named)
                {
                    access.run.insert(resolved);
                }
            }
        }
        for (key, declared, into) in [
            ("read", read, &mut access.read),
            ("write", write, &mut access.write),
        ] {
            for entry in declared {
                let resolved = fs::canonicalize(folder.join(entry)).map_err(|error| {
                    SandboxError::ProgramAccess {
                        reason: format!("`{key}` names `{entry}`, which cannot be used: {error}"),
                    }
                })?;
                into.insert(resolved);
            }
        }
        Ok(access)
    }

    /// Adds the program at `found` (as found, before its links are followed): its
    /// virtualenv, its resolved file and installation, and its interpreter; a program in
    /// `followed` (resolved for another phase) is not followed again.
    fn add_program(
        &mut self,
        found: &Path,
        path_var: Option<&OsStr>,
        depth: usize,
        followed: &mut BTreeSet<PathBuf>,
    ) {
        // A virtualenv's Python finds its `pyvenv.cfg` beside the folder it was called from.
        if let Some(venv) = found.parent().and_then(Path::parent)
            && venv.join("pyvenv.cfg").is_file()
            && let Ok(venv) = fs::canonicalize(venv)
        {
            self.run.insert(venv);
        }
        let Ok(resolved) = fs::canonicalize(found) else {
            return;
        };
        if !followed.insert(resolved.clone()) {
            // Another phase runs the same program: it was followed already.
            return;
        }
        if let Some(installation) = installation_of(&resolved) {
            self.run.insert(installation);
        }
        self.run.insert(resolved.clone());
        if depth >= INTERPRETERS_FOLLOWED_MAX {
            return;
        }
        if let Some(interpreter) = interpreter_of(&resolved, path_var) {
            self.add_program(&interpreter, path_var, depth + 1, followed);
        }
    }

    /// Every path the program may read and execute, or read, or write.
    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        self.run
            .iter()
            .chain(&self.read)
            .chain(&self.write)
            .map(PathBuf::as_path)
    }

    /// The declared `read` and `write` folders, and the paths named on command lines.
    fn declared(&self) -> impl Iterator<Item = &Path> {
        self.read.iter().chain(&self.write).map(PathBuf::as_path)
    }
}

/// Where `program` is found: a path with a `/` against `folder`, else the first executable
/// file of that name on `path_var`.
fn find_program(folder: &Path, program: &str, path_var: Option<&OsStr>) -> Option<PathBuf> {
    if program.contains('/') {
        let found = folder.join(program);
        return found.is_file().then_some(found);
    }
    std::env::split_paths(path_var?)
        .map(|dir| folder.join(dir).join(program))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    fs::metadata(path).is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

/// The installation a resolved program lives in: `PREFIX` for `PREFIX/bin/NAME` (or
/// `sbin`, or `shims` as pyenv's), when `PREFIX` has a library folder beside it (`lib`,
/// `lib64` or `libexec`) and is neither `/` nor the home folder.
fn installation_of(resolved: &Path) -> Option<PathBuf> {
    let bin = resolved.parent()?;
    let name = bin.file_name()?.to_str()?;
    if !matches!(name, "bin" | "sbin" | "shims") {
        return None;
    }
    let prefix = bin.parent()?;
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let has_libraries = ["lib", "lib64", "libexec"]
        .iter()
        .any(|lib| prefix.join(lib).is_dir());
    (has_libraries && prefix != Path::new("/") && Some(prefix) != home.as_deref())
        .then(|| prefix.to_owned())
}

/// The interpreter a script's `#!` line names (through `env`, the program it looks up on
/// `path_var`), if the file is a script.
fn interpreter_of(resolved: &Path, path_var: Option<&OsStr>) -> Option<PathBuf> {
    let mut head = Vec::with_capacity(SHEBANG_BYTES_MAX);
    fs::File::open(resolved)
        .ok()?
        .take(SHEBANG_BYTES_MAX as u64)
        .read_to_end(&mut head)
        .ok()?;
    let line = head.strip_prefix(b"#!")?;
    let line = &line[..line.iter().position(|&b| b == b'\n').unwrap_or(line.len())];
    let line = std::str::from_utf8(line).ok()?;
    let mut words = line.split_whitespace();
    let interpreter = PathBuf::from(words.next()?);
    if interpreter.file_name() == Some(OsStr::new("env")) {
        let program = words.find(|word| !word.starts_with('-'))?;
        return find_program(Path::new("/"), program, path_var);
    }
    Some(interpreter)
}

/// What the launcher confines each program to, besides its own access.
#[derive(Debug)]
struct Launcher {
    policy: Policy,
    protected: Vec<PathBuf>,
    jobs: Mutex<std::sync::mpsc::Sender<LaunchJob>>,
}

/// A job for the launcher: the program's access, and what to run once confined.
type LaunchJob = (
    Arc<ProgramAccess>,
    Box<dyn FnOnce(Result<(), SandboxError>) + Send>,
);

static LAUNCHER: OnceLock<Launcher> = OnceLock::new();

/// Starts, once per process, the thread from which [`launch`] starts programs, each
/// confined to its own access, the roots and the network rules of `policy`, and never to
/// `protected` files (the log and its companions, key files). Call it right before the
/// process confines itself to its roots; later calls do nothing.
///
/// # Errors
///
/// An I/O error when the thread cannot be started.
pub fn start_launcher(policy: &Policy, protected: Vec<PathBuf>) -> io::Result<()> {
    if LAUNCHER.get().is_some() {
        return Ok(());
    }
    let (jobs, queue) = std::sync::mpsc::channel::<LaunchJob>();
    std::thread::Builder::new()
        .name("agent-kernel-launcher".to_owned())
        .spawn(move || {
            for (access, job) in queue {
                // Each run confines a thread of its own: a confined thread stays confined.
                let started = std::thread::Builder::new()
                    .name("agent-kernel-launch".to_owned())
                    .spawn(move || {
                        let confined = confine_this_thread(&access)
                            .map_err(|reason| SandboxError::NotConfined { reason });
                        job(confined);
                    });
                if let Err(error) = started {
                    tracing_free_warning(&error);
                }
            }
        })?;
    let _ = LAUNCHER.set(Launcher {
        policy: policy.clone(),
        protected: protected
            .into_iter()
            .map(|path| fs::canonicalize(&path).unwrap_or(path))
            .collect(),
        jobs: Mutex::new(jobs),
    });
    Ok(())
}

/// The launcher's own thread cannot report through the caller, whose job was dropped: it
/// says so on stderr.
fn tracing_free_warning(error: &io::Error) {
    eprintln!("agent-kernel: cannot start a thread to launch a program: {error}");
}

/// Whether programs start through the launcher (the process runs under the second line).
pub fn launcher_running() -> bool {
    LAUNCHER.get().is_some()
}

/// Runs `job` on a thread confined to `access` (see the module's documentation): with
/// `Ok(())` once confined, or with [`SandboxError::NotConfined`] saying why it could not be
/// (then the job must start nothing). Without a launcher, runs it at once, here, with
/// `Ok(())`.
pub fn launch(access: Arc<ProgramAccess>, job: Box<dyn FnOnce(Result<(), SandboxError>) + Send>) {
    let Some(launcher) = LAUNCHER.get() else {
        job(Ok(()));
        return;
    };
    let queued = launcher
        .jobs
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .send((access, job));
    if let Err(std::sync::mpsc::SendError((_, job))) = queued {
        job(Err(SandboxError::NotConfined {
            reason: "the launcher thread has stopped".to_owned(),
        }));
    }
}

/// Confines the calling thread to `access`, the roots and the system folders, and to the
/// policy's network rules.
fn confine_this_thread(access: &ProgramAccess) -> Result<(), String> {
    let launcher = LAUNCHER.get().ok_or("no launcher")?;
    access
        .checked
        .get_or_init(|| check(access, launcher))
        .clone()?;
    let status = roots_ruleset(&launcher.policy)
        .and_then(|ruleset| {
            ruleset.add_rules(path_beneath_rules(
                &access.run,
                AccessFs::from_read(LANDLOCK_ABI),
            ))
        })
        .and_then(|ruleset| {
            ruleset.add_rules(path_beneath_rules(
                &access.read,
                AccessFs::ReadFile | AccessFs::ReadDir,
            ))
        })
        .and_then(|ruleset| {
            ruleset.add_rules(path_beneath_rules(
                &access.write,
                AccessFs::from_all(LANDLOCK_ABI),
            ))
        })
        .and_then(|ruleset| {
            ruleset.add_rules(path_beneath_rules(
                PROGRAM_WRITABLE,
                AccessFs::ReadFile | AccessFs::WriteFile,
            ))
        })
        .and_then(|ruleset| ruleset.restrict_self())
        .map_err(|error| format!("Landlock refused the program's rules: {error}"))?;
    if status.ruleset == RulesetStatus::NotEnforced {
        // No Landlock here at all: the process has no second line either.
        return Ok(());
    }
    match restrict_network(&launcher.policy) {
        NetworkLine::Unavailable { reason } if reason.starts_with("Landlock refused") => {
            Err(reason)
        }
        _ => Ok(()),
    }
}

/// Why `access` may not be given (it is or holds a protected file, or a name the policy
/// denies), or `Ok`.
fn check(access: &ProgramAccess, launcher: &Launcher) -> Result<(), String> {
    for path in access.paths() {
        if let Some(protected) = launcher
            .protected
            .iter()
            .find(|protected| protected.starts_with(path))
        {
            return Err(format!(
                "it would let the program read {}, which the second line keeps from every program (the log, its journal and head files, the audit and operator key files)",
                protected.display()
            ));
        }
    }
    let Some(deny) = launcher.policy.fs().map(crate::FsPolicy::deny_name_matcher) else {
        return Ok(());
    };
    if deny.is_empty() {
        return Ok(());
    }
    // Names are matched as the built-in tools match them below a root: the entry's own name
    // and the names below it, never the folders above it (a home folder's `.pyenv`, say).
    let denied_name = |path: &Path| {
        let name = path.file_name()?.to_string_lossy().into_owned();
        let pattern = deny.matching(&name)?;
        Some((name, pattern))
    };
    for path in access
        .run
        .iter()
        .map(PathBuf::as_path)
        .filter(|path| path.is_file())
    {
        if let Some((name, pattern)) = denied_name(path) {
            return Err(format!(
                "it names {}, whose name `{name}` the policy denies (`{pattern}`)",
                path.display()
            ));
        }
    }
    for folder in access.declared() {
        if let Some((name, pattern)) = denied_name(folder) {
            return Err(format!(
                "it declares {}, whose name `{name}` the policy denies (`{pattern}`)",
                folder.display()
            ));
        }
        let mut n_seen = 0_usize;
        let mut pending = vec![folder.to_owned()];
        while let Some(dir) = pending.pop() {
            let Ok(entries) = fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                n_seen += 1;
                if n_seen > DECLARED_FOLDER_ENTRIES_MAX {
                    return Err(format!(
                        "{} holds more than {DECLARED_FOLDER_ENTRIES_MAX} entries to check for denied names; declare narrower folders",
                        folder.display()
                    ));
                }
                let name = entry.file_name();
                let name = name.to_string_lossy();
                if let Some(pattern) = deny.matching(&name) {
                    return Err(format!(
                        "it declares {}, which holds {}, a name the policy denies (`{pattern}`)",
                        folder.display(),
                        entry.path().display()
                    ));
                }
                if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                    pending.push(entry.path());
                }
            }
        }
    }
    Ok(())
}
