//! The hostile corpus: thousands of paths a prompt-injected agent might try, run through the
//! real file tools, and a thread that swaps a folder for a symbolic link while the tools run.
//!
//! The tree (`Tree`): `base/workspace` is the only allowed root, planted with hostile objects:
//! symbolic links out of it (absolute, relative, chained, looping, dangling, to folders), hard
//! links to files outside it, FIFOs, and files with denied names at depth.
//! Everything else under `base` is a canary: `base/canary.txt` next to the root,
//! `base/outside/…` (files, folders, a FIFO, a denied name), and two siblings whose names start
//! like the root's (`workspace2`, `workspace-old`).
//!
//! Zero escapes means: after every case, every name under `base` outside the root has the same
//! kind, mode, bytes or link target as before, and no name appeared there.
//! Link counts are left out of that comparison: replacing a hard link inside the root (what an
//! atomic write does) rightly lowers the count of its twin outside, whose bytes stay the same.
//! A few names in the folders a broken sandbox could reach beyond `base` (`/`, the temporary
//! folder, the working directory and its parent) are watched too.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use agent_kernel_api::{Durability, DynTool, ToolContext, ToolError, ToolOutput};
use agent_kernel_sandbox::{FsSandbox, HttpSandbox, Policy};
use agent_kernel_tools::{TEMP_PREFIX, builtin_tools};
use serde_json::{Value, json};

use crate::{ctx, prepare};

mod corpus;
mod tree;

#[allow(clippy::wildcard_imports)]
use self::tree::*;

/// `workspace` is the only allowed root.
const POLICY: &str = r#"[fs]
allow = ["workspace"]
deny_names = [".env", "*.pem", "id_rsa", ".git"]
max_io_bytes = 1024
"#;

/// What every file outside the root holds, so a read that returns one is recognised.
const CANARY: &str = "CANARY";

/// The longest one call may take: a FIFO opened for blocking I/O would hang it forever.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The corpus must hold at least this many cases (issue 5).
const CORPUS_CASES_MIN: usize = 2_000;

/// How many operations run while the folder is being swapped (issue 5 asks for at least
/// 1,000); few of them straddle a swap, and each takes well under a millisecond.
const RACE_OPS: usize = 3_000;

/// Replays the race's sequence of operations (not its timing).
const RACE_SEED_VAR: &str = "AGENT_KERNEL_RACE_SEED";

/// How many links the long chain inside the root has: more than the kernel follows (40).
const LONG_CHAIN_LEN: usize = 45;

/// What a symbolic link planted in the root leads to, which decides what the tools must do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    /// To a file (or a FIFO or device) outside the root, directly or through other links.
    EscapeFile,
    /// To a folder outside the root.
    EscapeDir,
    /// To nothing, outside the root.
    DanglingOut,
    /// To nothing readable inside the root: a loop, a missing file, a FIFO, too long a chain.
    NotAFile,
    /// To a file inside the root, relatively.
    InnerFile,
    /// To a file inside the root, by its absolute path.
    InnerAbs,
    /// To a folder inside the root.
    InnerDir,
    /// To a denied name inside the root, under an innocent name.
    DeniedTarget,
}

/// The symbolic links planted in the root: name (relative to the root), target (`{base}` is
/// replaced by the tree's base), and what it leads to.
const LINKS: &[(&str, &str, Link)] = &[
    ("abs_secret", "{base}/outside/secret.txt", Link::EscapeFile),
    ("rel_secret", "../outside/secret.txt", Link::EscapeFile),
    ("rel_canary", "../canary.txt", Link::EscapeFile),
    (
        "sub/deep_rel_secret",
        "../../outside/secret.txt",
        Link::EscapeFile,
    ),
    ("chain_a", "chain_b", Link::EscapeFile),
    ("chain_b", "chain_c", Link::EscapeFile),
    ("chain_c", "../outside/secret.txt", Link::EscapeFile),
    (
        "chain_abs_a",
        "{base}/workspace/chain_abs_b",
        Link::EscapeFile,
    ),
    ("chain_abs_b", "{base}/outside/secret.txt", Link::EscapeFile),
    ("chain_mixed", "sub/hop", Link::EscapeFile),
    ("sub/hop", "../../outside/dir/inner.txt", Link::EscapeFile),
    (
        "via_inner",
        "sub/../../outside/secret.txt",
        Link::EscapeFile,
    ),
    ("hidden_env", "../outside/.env", Link::EscapeFile),
    ("pipe_out", "../outside/pipe", Link::EscapeFile),
    ("dev_null", "/dev/null", Link::EscapeFile),
    ("dev_zero", "/dev/zero", Link::EscapeFile),
    ("out_dir", "{base}/outside/dir", Link::EscapeDir),
    ("out_dir_rel", "../outside/dir", Link::EscapeDir),
    ("out_parent", "..", Link::EscapeDir),
    ("out_base", "{base}", Link::EscapeDir),
    ("sub/up2", "../..", Link::EscapeDir),
    ("chain_dir_a", "chain_dir_b", Link::EscapeDir),
    ("chain_dir_b", "../outside/dir", Link::EscapeDir),
    ("root_link", "/", Link::EscapeDir),
    ("proc_root", "/proc/self/root", Link::EscapeDir),
    ("proc_self", "/proc/self", Link::EscapeDir),
    ("proc_cwd", "/proc/self/cwd", Link::EscapeDir),
    ("dangling_out", "../outside/missing.txt", Link::DanglingOut),
    (
        "dangling_abs",
        "{base}/outside/nowhere/x.txt",
        Link::DanglingOut,
    ),
    ("dangling_out_dir", "../outside/newdir", Link::DanglingOut),
    ("loop_a", "loop_b", Link::NotAFile),
    ("loop_b", "loop_a", Link::NotAFile),
    ("self_loop", "self_loop", Link::NotAFile),
    ("loop_abs", "{base}/workspace/loop_abs", Link::NotAFile),
    ("loop_via_sub", "sub/../loop_via_sub", Link::NotAFile),
    ("dangling_in", "missing.txt", Link::NotAFile),
    ("dangling_in_dir", "nowhere/x.txt", Link::NotAFile),
    ("fifo_link", "fifo", Link::NotAFile),
    ("long_chain_00", "long_chain_01", Link::NotAFile),
    ("inner_link", "a.txt", Link::InnerFile),
    ("sub/inner_up", "../a.txt", Link::InnerFile),
    ("inner_abs", "{base}/workspace/a.txt", Link::InnerAbs),
    ("inner_dir_link", "sub", Link::InnerDir),
    ("sub/up", "..", Link::InnerDir),
    ("innocent", "sub/.env", Link::DeniedTarget),
    ("keylink", "keys/server.pem", Link::DeniedTarget),
    ("gitlink", ".git", Link::DeniedTarget),
];

/// Hard links planted in the root (name relative to the root) to canaries (relative to base).
const HARD_LINKS: &[(&str, &str)] = &[
    ("hard_secret", "outside/secret.txt"),
    ("sub/hard_canary", "canary.txt"),
    ("hard_inner", "outside/dir/inner.txt"),
    ("hard_dotenv", "outside/.env"),
];

/// FIFOs planted in the root.
const FIFOS: &[&str] = &["fifo", "sub/fifo2"];

/// Windows reserved names and stream syntax: plain names on Linux, planted in `workspace/win`.
const WINDOWS_NAMES: &[&str] = &[
    "CON",
    "con",
    "NUL",
    "nul.txt",
    "PRN.txt",
    "AUX",
    "COM1",
    "LPT1.log",
    "lpt9",
    "CONIN$",
    "CLOCK$",
    "CON.",
    "Con .txt",
    "x.txt.",
    "trailing ",
    "file.txt::$DATA",
    "file.txt::$INDEX_ALLOCATION",
    "a:b",
    "a.txt:Zone.Identifier:$DATA",
    "NUL:",
    "$MFT",
    "back\\slash.txt",
    "C:\\Windows\\win.ini",
    "..\\..\\outside\\secret.txt",
];

/// Denied names (`.env`, `*.pem`, `id_rsa`, `.git`) in many cases: all must be refused.
const DENIED_VARIANTS: &[&str] = &[
    ".env",
    ".ENV",
    ".Env",
    ".eNV",
    "KEY.PEM",
    "key.pem",
    "Key.Pem",
    "server.pEm",
    ".pem",
    "x.PEM",
    "id_rsa",
    "Id_Rsa",
    "ID_RSA",
    "iD_rSA",
    ".git",
    ".GIT",
    ".Git",
    ".gIT",
];

/// Names that look like denied names but are other names: allowed or not, they stay inside.
const LOOK_ALIKES: &[&str] = &[
    ".\u{0435}nv",               // Cyrillic е
    ".\u{ff45}\u{ff4e}\u{ff56}", // fullwidth ｅｎｖ
    ".env\u{200b}",              // zero-width space after
    "\u{200b}.env",              // zero-width space before
    ".env ",
    ".env.",
    ".env.txt",
    "env",
    ".ENV\u{0307}",
    "\u{0456}d_rsa", // Cyrillic і
    "\u{0131}d_rsa", // dotless ı
    "\u{0130}D_RSA", // dotted İ, which lowercases to two characters
    "id_rs\u{0430}", // Cyrillic а
    "id_rsa.pub",
    "key.pem.txt",
    "key.\u{ff50}\u{ff45}\u{ff4d}", // fullwidth ｐｅｍ
    "key.\u{0440}\u{0435}\u{043c}", // Cyrillic рем
    ".g\u{0456}t",
    ".git.bak",
    "git",
    "\u{212a}EY.TXT", // Kelvin sign K
    ".\u{0395}NV",    // Greek Epsilon
];

/// Percent-encodings, look-alike dots and slashes, and other spellings of `..` that the file
/// system takes as plain names.
const ENCODINGS: &[&str] = &[
    "%2e%2e/outside/secret.txt",
    "%2e%2e%2foutside%2fsecret.txt",
    "..%2f..%2foutside%2fsecret.txt",
    "%252e%252e%252foutside%252fsecret.txt",
    "%2E%2E/outside/secret.txt",
    ".%2e/outside/secret.txt",
    "%c0%ae%c0%ae/outside/secret.txt",
    "..%c0%af..%c0%afoutside%c0%afsecret.txt",
    "..%5c..%5coutside%5csecret.txt",
    "%2e%2e%5coutside%5csecret.txt",
    "..%00/secret.txt",
    "%2fetc%2fpasswd",
    "\u{2024}\u{2024}/outside/secret.txt",
    "\u{ff0e}\u{ff0e}/outside/secret.txt",
    "\u{2025}/outside/secret.txt",
    "..\u{200b}/outside/secret.txt",
    "..\u{2215}outside\u{2215}secret.txt",
    "..\u{ff0f}outside\u{ff0f}secret.txt",
    "..\u{2044}outside\u{2044}secret.txt",
    " ../outside/secret.txt",
    ".. /outside/secret.txt",
    ".../outside/secret.txt",
    "....//outside/secret.txt",
    "..;/outside/secret.txt",
];

/// Where a symbolic link's name is followed by more: nothing, a name, `..`.
const LINK_SUFFIXES: &[&str] = &[
    "",
    "/x.txt",
    "/inner.txt",
    "/secret.txt",
    "/../secret.txt",
    "/./file.txt",
    "/nested/deep.txt",
];

/// How a path inside the root may start (`{base}` is replaced by the tree's base).
/// (`workspace/./` would add nothing: the sandbox drops `.` before the path reaches the disk,
/// and the other groups spell it anyway.)
const ROOT_PREFIXES: &[&str] = &["workspace/", "{base}/workspace/"];

/// Names a broken sandbox would create or change beyond `base`, watched in `Strays`.
const STRAY_NAMES: &[&str] = &[
    "x.txt",
    "inner.txt",
    "secret.txt",
    "file.txt",
    "new.txt",
    "canary.txt",
    "nested",
];

/// The file tools under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tool {
    Write,
    Append,
    Delete,
    Read,
    Validate,
}

const TOOLS: [Tool; 5] = [
    Tool::Write,
    Tool::Append,
    Tool::Delete,
    Tool::Read,
    Tool::Validate,
];

impl Tool {
    fn id(self) -> &'static str {
        match self {
            Tool::Write => "fs.write",
            Tool::Append => "fs.append",
            Tool::Delete => "fs.delete",
            Tool::Read => "fs.read",
            Tool::Validate => "validate.file",
        }
    }

    fn mutates(self) -> bool {
        matches!(self, Tool::Write | Tool::Append | Tool::Delete)
    }

    fn args(self, path: &str, content: &str) -> Value {
        match self {
            Tool::Write | Tool::Append => json!({ "path": path, "content": content }),
            Tool::Delete | Tool::Read | Tool::Validate => json!({ "path": path }),
        }
    }
}

/// What one tool must do with one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// `check` refuses it (denied or invalid arguments), before anything touches the disk.
    RefusedByCheck,
    /// Refused (denied or invalid arguments) by `check`, `prepare` or `execute`.
    Refused,
    /// Fails definitely (refused, missing, not a regular file, a loop): never succeeds.
    Fails,
    /// Succeeds, inside the root.
    Succeeds,
    /// Succeeds or fails; whatever it does stays inside the root.
    Contained,
}

/// What each tool must do with one path; `validate.file` as `fs.read`.
#[derive(Debug, Clone, Copy)]
struct Expects {
    write: Expect,
    append: Expect,
    delete: Expect,
    read: Expect,
}

impl Expects {
    fn all(expect: Expect) -> Expects {
        Expects::split(expect, expect)
    }

    /// `read` for the reading tools, `mutate` for the others.
    fn split(read: Expect, mutate: Expect) -> Expects {
        Expects {
            write: mutate,
            append: mutate,
            delete: mutate,
            read,
        }
    }

    /// A name that does not exist yet, in a folder that does: writes create it, the rest find
    /// nothing.
    fn new_file() -> Expects {
        Expects {
            write: Expect::Succeeds,
            append: Expect::Succeeds,
            delete: Expect::Fails,
            read: Expect::Fails,
        }
    }

    /// A hard link to a canary: an atomic write or a delete replaces or removes the name inside
    /// the root and leaves the canary alone; an append would write through the shared content,
    /// so it is refused; a read returns the canary's bytes (THREAT_MODEL.md 5.2).
    fn hard_link() -> Expects {
        Expects {
            write: Expect::Succeeds,
            append: Expect::Refused,
            delete: Expect::Succeeds,
            read: Expect::Succeeds,
        }
    }

    fn for_tool(self, tool: Tool) -> Expect {
        match tool {
            Tool::Write => self.write,
            Tool::Append => self.append,
            Tool::Delete => self.delete,
            Tool::Read | Tool::Validate => self.read,
        }
    }
}

/// One path of the corpus, run through every tool.
struct Form {
    category: &'static str,
    path: String,
    expects: Expects,
    /// Whether a successful read may return a canary's bytes (a hard link to it).
    reads_canary: bool,
}

/// Builds the corpus.
struct Corpus {
    base: String,
    forms: Vec<Form>,
}

/// What the tools must do with a planted link, alone (`last`) or followed by more names.
fn link_expects(link: Link, last: bool) -> Expects {
    match (link, last) {
        (Link::EscapeFile | Link::DanglingOut | Link::DeniedTarget, true)
        | (Link::EscapeDir, _) => Expects::all(Expect::Refused),
        // Mutations never follow a link in the final name; reads follow it and find no file.
        (Link::NotAFile | Link::InnerDir, true) => Expects::split(Expect::Fails, Expect::Refused),
        (Link::InnerFile, true) => Expects::split(Expect::Succeeds, Expect::Refused),
        (Link::InnerAbs, true) => Expects::split(Expect::Contained, Expect::Refused),
        (Link::InnerDir | Link::DeniedTarget, false) => Expects::all(Expect::Contained),
        (
            Link::EscapeFile
            | Link::DanglingOut
            | Link::NotAFile
            | Link::InnerFile
            | Link::InnerAbs,
            false,
        ) => Expects::all(Expect::Fails),
    }
}

/// Where a call stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Check,
    Prepare,
    Execute,
}

/// What one call did.
#[derive(Debug)]
struct Outcome {
    phase: Phase,
    result: Result<ToolOutput, ToolError>,
    /// Whether a successful effect was found inside the root (and a read returned no canary).
    effect: Result<(), String>,
    /// For mutating tools whose `prepare` succeeded.
    compensation: Option<Result<(), ToolError>>,
}

impl Outcome {
    fn stopped(phase: Phase, error: ToolError) -> Outcome {
        Outcome {
            phase,
            result: Err(error),
            effect: Ok(()),
            compensation: None,
        }
    }
}

fn is_refusal(error: &ToolError) -> bool {
    error.is_denied() || error.is_invalid_args()
}

/// Whether `outcome` meets `expect` and the rules every case obeys.
fn judge(expect: Expect, outcome: &Outcome) -> Result<(), String> {
    if let Err(error) = &outcome.result
        && error.is_uncertain()
    {
        return Err(format!("an uncertain failure: {error}"));
    }
    if let Some(Err(error)) = &outcome.compensation
        && (error.is_uncertain() || outcome.result.is_ok())
    {
        return Err(format!("compensation failed: {error}"));
    }
    outcome.effect.clone()?;
    let met = match expect {
        Expect::RefusedByCheck => {
            outcome.phase == Phase::Check && outcome.result.as_ref().is_err_and(is_refusal)
        }
        Expect::Refused => outcome.result.as_ref().is_err_and(is_refusal),
        Expect::Fails => outcome.result.is_err(),
        Expect::Succeeds => outcome.result.is_ok(),
        Expect::Contained => true,
    };
    if met {
        Ok(())
    } else {
        Err(format!("expected {expect:?}"))
    }
}

/// A successful read that returned a canary's bytes, unless the path is a hard link to one.
fn no_canary_read(output: &ToolOutput, reads_canary: bool) -> Result<(), String> {
    let content = output.data["content"].as_str().unwrap_or_default();
    if !reads_canary && content.contains(CANARY) {
        return Err(format!("a read returned a canary's bytes: {content:?}"));
    }
    Ok(())
}

/// A few names in the folders a broken sandbox could reach beyond the base: `/`, the
/// temporary folder, the working directory (`/proc/self/cwd`) and its parent.
struct Strays {
    dirs: Vec<PathBuf>,
    before: BTreeSet<PathBuf>,
}

impl Strays {
    fn new(base: &Path) -> Strays {
        let cwd = std::env::current_dir().expect("a working directory");
        let mut dirs = vec![PathBuf::from("/"), cwd.clone()];
        dirs.extend(base.parent().map(Path::to_path_buf));
        dirs.extend(cwd.parent().map(Path::to_path_buf));
        let before = Strays::list(&dirs);
        Strays { dirs, before }
    }

    fn list(dirs: &[PathBuf]) -> BTreeSet<PathBuf> {
        let mut found = BTreeSet::new();
        for dir in dirs {
            let Ok(entries) = fs::read_dir(dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if STRAY_NAMES.contains(&name.as_str()) || name.starts_with(TEMP_PREFIX) {
                    found.insert(entry.path());
                }
            }
        }
        found
    }

    fn assert_unchanged(&self) {
        let now = Strays::list(&self.dirs);
        let appeared: Vec<_> = now.difference(&self.before).collect();
        assert!(
            appeared.is_empty(),
            "ESCAPE: files appeared beyond the base: {appeared:?}"
        );
    }
}

/// Outcomes per category: refused by `check`, refused later, failed, succeeded.
#[derive(Default)]
struct Tally {
    by_category: BTreeMap<&'static str, [usize; 4]>,
}

impl Tally {
    fn count(&mut self, category: &'static str, outcome: &Outcome) {
        let column = match (&outcome.result, outcome.phase) {
            (Err(_), Phase::Check) => 0,
            (Err(error), _) if is_refusal(error) => 1,
            (Err(_), _) => 2,
            (Ok(_), _) => 3,
        };
        self.by_category.entry(category).or_default()[column] += 1;
    }
}

impl fmt::Display for Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<24} {:>8} {:>8} {:>8} {:>8}",
            "category", "check", "refused", "failed", "ok"
        )?;
        for (category, [check, refused, failed, ok]) in &self.by_category {
            writeln!(
                f,
                "{category:<24} {check:>8} {refused:>8} {failed:>8} {ok:>8}"
            )?;
        }
        Ok(())
    }
}

/// How a case is named in a failure: its index, tool and path (cut when long).
fn describe(case_idx: usize, tool: Tool, path: &str) -> String {
    const SHOWN_CHARS_MAX: usize = 160;
    let escaped = path.escape_debug().to_string();
    let shown = match escaped.char_indices().nth(SHOWN_CHARS_MAX) {
        Some((cut, _)) => format!("{}… ({} bytes)", &escaped[..cut], path.len()),
        None => escaped,
    };
    format!("case #{case_idx} {} \"{shown}\"", tool.id())
}

#[tokio::test]
async fn no_case_of_the_hostile_corpus_leaves_the_root() {
    let started = Instant::now();
    let tree = Tree::new();
    let strays = Strays::new(&tree.base);
    let forms = Corpus::build(&tree.base);
    let n_cases = forms.len() * TOOLS.len();
    println!(
        "hostile corpus: {n_cases} cases ({} paths x {} tools)",
        forms.len(),
        TOOLS.len()
    );
    assert!(n_cases >= CORPUS_CASES_MIN, "only {n_cases} cases");
    let mut tally = Tally::default();
    let mut case_idx = 0;
    for form in &forms {
        for tool in TOOLS {
            let shown = describe(case_idx, tool, &form.path);
            // Syncing only adds reopenings of `.` through a folder handle already open, so the
            // corpus skips it for speed; the race runs with it.
            let call = tree.call(case_idx, tool, &form.path, Durability::Normal, Some(form));
            let outcome = tokio::time::timeout(CALL_TIMEOUT, call)
                .await
                .unwrap_or_else(|_| panic!("{shown}: no answer in {CALL_TIMEOUT:?}"));
            if let Err(why) = judge(form.expects.for_tool(tool), &outcome) {
                panic!("{shown} ({}): {why}\n{outcome:#?}", form.category);
            }
            // `check` never touches the disk: a case it refused is covered by the check
            // after its path's last tool.
            if outcome.phase != Phase::Check {
                tree.assert_outside_unchanged(&shown);
            }
            // `prepare` has no side effect either: only a case that executed can change the root.
            if tool.mutates() && outcome.phase == Phase::Execute {
                tree.assert_inside_restored(&shown);
            }
            tally.count(form.category, &outcome);
            case_idx += 1;
        }
        let shown = format!("the path {:?} with every tool", form.path);
        tree.assert_outside_unchanged(&shown);
    }
    strays.assert_unchanged();
    println!("{tally}");
    println!(
        "hostile corpus: {n_cases} cases, zero escapes, in {:.1?}",
        started.elapsed()
    );
}

/// SplitMix64: a few lines, so the crate needs no `rand` for one seeded sequence.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// An index below `n`.
    fn below(&mut self, n: usize) -> usize {
        let n = u64::try_from(n).expect("a small bound");
        usize::try_from(self.next() % n).expect("below a usize bound")
    }
}

/// The seed from `AGENT_KERNEL_RACE_SEED`, or a fresh one.
fn race_seed() -> u64 {
    match std::env::var(RACE_SEED_VAR) {
        Ok(text) => text
            .trim()
            .parse()
            .unwrap_or_else(|error| panic!("{RACE_SEED_VAR}={text:?} is not a u64: {error}")),
        Err(_) => {
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |elapsed| elapsed.as_nanos());
            // The low 64 bits change fastest; truncation is the point.
            (nanos as u64) ^ u64::from(std::process::id())
        }
    }
}

/// Swaps `swap` between the real folder and a link to a folder outside the root (absolute and
/// relative in turn) until `stop`; returns how many times the link was put in place.
///
/// Without the yields the real folder would be in place for one system call in four, and few
/// operations would start inside it before the link replaces it.
fn swap_until(stop: &AtomicBool, swap: &Path, parked: &Path, targets: &[PathBuf; 2]) -> u64 {
    let mut n_swaps: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        fs::rename(swap, parked).expect("park the real folder");
        symlink(&targets[usize::from(n_swaps % 2 == 1)], swap).expect("put the link in place");
        n_swaps += 1;
        thread::yield_now();
        fs::remove_file(swap).expect("remove the link");
        fs::rename(parked, swap).expect("bring the real folder back");
        thread::yield_now();
    }
    n_swaps
}

#[tokio::test]
async fn a_folder_swapped_for_a_link_mid_operation_never_leads_outside() {
    let started = Instant::now();
    let seed = race_seed();
    println!(
        "race seed {seed}: {RACE_SEED_VAR}={seed} replays the operations (not the thread timing)"
    );
    let tree = Tree::new();
    let strays = Strays::new(&tree.base);
    let swap = tree.root.join("swap");
    let parked = tree.root.join("swap.parked");
    let targets = [
        tree.base.join("outside/dir"),
        PathBuf::from("../outside/dir"),
    ];
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let stop = Arc::clone(&stop);
        let (swap, parked) = (swap.clone(), parked.clone());
        thread::spawn(move || swap_until(&stop, &swap, &parked, &targets))
    };
    let base = tree.base.display().to_string();
    let paths = [
        "workspace/swap/file.txt".to_owned(),
        format!("{base}/workspace/swap/file.txt"),
        "workspace/./swap/file.txt".to_owned(),
        "workspace/swap/./file.txt".to_owned(),
        "workspace/swap/../swap/file.txt".to_owned(),
    ];
    let race_tools = [Tool::Write, Tool::Append, Tool::Read];
    let mut rng = SplitMix64(seed);
    // Succeeded, refused, failed; compensations refused or failed.
    let mut counts = [0_usize; 4];
    for op_idx in 0..RACE_OPS {
        let tool = race_tools[rng.below(race_tools.len())];
        let path = &paths[rng.below(paths.len())];
        let shown = format!("race op #{op_idx} (seed {seed})");
        // With syncing, so the reopening of the folder to sync it races the swap too.
        let call = tree.call(op_idx, tool, path, Durability::Full, None);
        let outcome = tokio::time::timeout(CALL_TIMEOUT, call)
            .await
            .unwrap_or_else(|_| panic!("{shown}: no answer in {CALL_TIMEOUT:?}"));
        let uncertain = outcome.result.as_ref().is_err_and(ToolError::is_uncertain)
            || matches!(&outcome.compensation, Some(Err(error)) if error.is_uncertain());
        assert!(
            !uncertain,
            "{shown} {} {path}: an uncertain failure\n{outcome:#?}",
            tool.id()
        );
        if let Err(why) = &outcome.effect {
            panic!("ESCAPE at {shown} {} {path}: {why}", tool.id());
        }
        counts[match &outcome.result {
            Ok(_) => 0,
            Err(error) if is_refusal(error) => 1,
            Err(_) => 2,
        }] += 1;
        if matches!(outcome.compensation, Some(Err(_))) {
            counts[3] += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let n_swaps = swapper.join().expect("the swapping thread ran to the end");
    assert!(n_swaps > 0, "the link was never put in place");
    assert!(
        fs::symlink_metadata(&swap).is_ok_and(|metadata| metadata.is_dir()),
        "the real folder is back"
    );
    tree.assert_outside_unchanged(&format!("the race (seed {seed})"));
    strays.assert_unchanged();
    let [n_ok, n_refused, n_failed, n_compensations_failed] = counts;
    println!(
        "race: {RACE_OPS} operations against {n_swaps} swaps: {n_ok} succeeded, {n_refused} \
         refused, {n_failed} failed ({n_compensations_failed} compensations refused or \
         failed), zero escapes, in {:.1?}",
        started.elapsed()
    );
}
