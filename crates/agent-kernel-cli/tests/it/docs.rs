//! The reference in `docs/` names everything `--help` prints, and no Markdown file of the
//! repository points at a file outside it.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository's root.
fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the repository")
}

/// The help text of `agent-kernel ARGS --help`.
fn help(args: &[&str]) -> String {
    let output = Command::new(crate::bin())
        .args(args)
        .arg("--help")
        .output()
        .expect("runs");
    assert!(output.status.success(), "{args:?} --help failed");
    String::from_utf8(output.stdout).expect("utf-8")
}

/// The subcommands a help text lists (under `Commands:`), `help` left out.
fn subcommands(text: &str) -> Vec<String> {
    text.lines()
        .skip_while(|line| !line.starts_with("Commands:"))
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

/// The long flags a help text names (`--plan`, `--json`, …).
fn flags(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|word| word.starts_with("--") && word.len() > 2)
        .map(str::to_owned)
        .collect()
}

/// Whether `text` holds `word` as a word of its own: `--force`, not `--force-all`.
fn names(text: &str, word: &str) -> bool {
    let is_word = |c: char| c.is_ascii_alphanumeric() || c == '-';
    text.match_indices(word).any(|(at, _)| {
        !text[..at].chars().next_back().is_some_and(is_word)
            && !text[at + word.len()..].chars().next().is_some_and(is_word)
    })
}

#[test]
fn the_reference_names_every_command_flag_and_exit_code_the_help_prints() {
    let reference = fs::read_to_string(repository().join("docs/reference.md")).expect("reads");
    let mut missing = Vec::new();
    let mut pending: Vec<Vec<String>> = vec![Vec::new()];
    while let Some(path) = pending.pop() {
        let args: Vec<&str> = path.iter().map(String::as_str).collect();
        let text = help(&args);
        if !path.is_empty() && !reference.contains(&format!("`{}", path.join(" "))) {
            missing.push(format!("the command `{}`", path.join(" ")));
        }
        for flag in flags(&text) {
            if !names(&reference, &flag) {
                missing.push(format!("{flag} (of `{}`)", path.join(" ")));
            }
        }
        for sub in subcommands(&text) {
            let mut deeper = path.clone();
            deeper.push(sub);
            pending.push(deeper);
        }
    }
    for code in 0..=5 {
        if !reference.contains(&format!("| {code} |")) {
            missing.push(format!("exit code {code}"));
        }
    }
    assert!(
        missing.is_empty(),
        "docs/reference.md does not name: {missing:#?}"
    );
}

/// Every Markdown file of the repository, build and install folders left out.
fn markdown_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("lists").flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
            if !name.starts_with('.')
                && !["target", "node_modules", "venv"].contains(&name.as_ref())
            {
                markdown_files(&path, found);
            }
        } else if name.ends_with(".md") {
            found.push(path);
        }
    }
}

#[test]
fn no_markdown_file_links_outside_the_repository() {
    let root = repository();
    let mut files = Vec::new();
    markdown_files(&root, &mut files);
    assert!(files.len() > 5, "{files:?}");
    let mut outside = Vec::new();
    for file in &files {
        let text = fs::read_to_string(file).expect("reads");
        for (at, _) in text.match_indices("](") {
            let rest = &text[at + 2..];
            let Some(end) = rest.find(')') else {
                continue;
            };
            let target = rest[..end].split('#').next().unwrap_or_default();
            if target.is_empty() || target.starts_with("https://") || target.starts_with("http://")
            {
                continue;
            }
            let resolved = file.parent().expect("a folder").join(target);
            let inside = resolved
                .canonicalize()
                .is_ok_and(|path| path.starts_with(&root));
            if !inside {
                outside.push(format!("{}: {target}", file.display()));
            }
        }
        // The project's own specification is in the tree; the one it grew from is not.
        if text.contains("../shared/") || text.contains(&["CONTR", "ACT.md"].concat()) {
            outside.push(format!(
                "{}: names a document outside the repository",
                file.display()
            ));
        }
    }
    assert!(
        outside.is_empty(),
        "links outside the repository: {outside:#?}"
    );
}
