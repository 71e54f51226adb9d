//! The world a scenario acts on: the files under its folder's watched trees, read back
//! after the run, and the model of what they hold once every call has taken effect.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::Value;

use crate::scenario::{Call, Scenario, Setup};

/// The folders of a scenario whose files are the world (relative to its folder): the
/// agent's workspace, what lies outside it, and the upstream server's workspace. The log,
/// the policy and the tools file sit beside them and are not part of the world.
pub(crate) const WATCHED: [&str; 3] = ["ws", "outside", "up/ws"];

/// Every watched path and what it holds.
pub(crate) type World = BTreeMap<String, Setup>;

/// What a path holds as text (lossy), empty when it is not a file.
pub(crate) fn text(setup: Option<&Setup>) -> String {
    match setup {
        Some(Setup::File(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
        _ => String::new(),
    }
}

/// The paths, other than those `judged` and those outside the workspace, whose content is
/// not as the scenario set it up: what a check of a few paths must also find unchanged.
pub(crate) fn untouched_differences(
    scenario: &Scenario,
    world: &World,
    judged: impl Fn(&str) -> bool,
) -> Vec<String> {
    let rest = |world: &World| -> World {
        world
            .iter()
            .filter(|(path, _)| !judged(path) && !path.starts_with("outside/"))
            .map(|(path, setup)| (path.clone(), setup.clone()))
            .collect()
    };
    differences(&rest(world), &rest(&initial(scenario)))
}

/// Creates the scenario's files under `root`.
///
/// # Errors
///
/// When a file or link cannot be made.
pub(crate) fn lay_out(root: &Path, scenario: &Scenario) -> Result<()> {
    for dir in WATCHED {
        fs::create_dir_all(root.join(dir)).with_context(|| format!("creating {dir}"))?;
    }
    for (path, setup) in &scenario.setup {
        let full = root.join(path);
        if let Some(parent) = full.parent() {
            fs::create_dir_all(parent)?;
        }
        match setup {
            Setup::File(bytes) => fs::write(&full, bytes)?,
            Setup::Link(target) => std::os::unix::fs::symlink(target, &full)?,
        }
    }
    Ok(())
}

/// What the watched folders under `root` hold now; links are recorded, not followed.
///
/// # Errors
///
/// When a folder cannot be read.
pub(crate) fn snapshot(root: &Path) -> Result<World> {
    let mut world = World::new();
    for dir in WATCHED {
        walk(root, &root.join(dir), &mut world)?;
    }
    Ok(world)
}

fn walk(root: &Path, dir: &Path, world: &mut World) -> Result<()> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries {
        let entry = entry?;
        let path = entry.path();
        let name = path
            .strip_prefix(root)
            .expect("walked under the root")
            .to_string_lossy()
            .into_owned();
        let kind = entry.file_type()?;
        if kind.is_symlink() {
            let target = fs::read_link(&path)?;
            world.insert(name, Setup::Link(target.to_string_lossy().into_owned()));
        } else if kind.is_dir() {
            // The upstream server's workspace is walked as a tree of its own.
            if !WATCHED.contains(&name.as_str()) {
                walk(root, &path, world)?;
            }
        } else {
            world.insert(name, Setup::File(fs::read(&path)?));
        }
    }
    Ok(())
}

/// The world before the scenario: its setup, restricted to the watched folders, with a
/// later writer's change, if the scenario has one (the world that no chain touched).
pub(crate) fn initial(scenario: &Scenario) -> World {
    let mut world: World = scenario
        .setup
        .iter()
        .filter(|(path, _)| {
            WATCHED
                .iter()
                .any(|dir| path.starts_with(&format!("{dir}/")))
        })
        .map(|(path, setup)| (path.clone(), setup.clone()))
        .collect();
    // What a later writer changed must stay, whatever the chain needs undone.
    if let Some((path, content)) = &scenario.later_write {
        world.insert(path.clone(), Setup::File(content.clone().into_bytes()));
    }
    world
}

/// The world once every call has taken effect exactly once (a call whose idempotency key
/// was used before counts once; the forbidden call not at all), by a model of the tools: the
/// file tools and the write drill act on their path, `files.fs_write` (the upstream
/// server's) on its path relative to the scenario's folder; the others change no file.
/// Paths are taken as written (`ws/a.txt`), so an injected path models the effect it aims
/// at only as far as the text says; attacks are judged on their own.
pub(crate) fn complete(scenario: &Scenario) -> World {
    let mut world = initial(scenario);
    let mut keys = std::collections::BTreeSet::new();
    for (index, call) in scenario.calls.iter().enumerate() {
        let first_use = call.key.as_ref().is_none_or(|key| keys.insert(key.clone()));
        if first_use && scenario.attack != Some(index) {
            apply(&mut world, call);
        }
    }
    world
}

fn apply(world: &mut World, call: &Call) {
    let text = |value: &Value, field: &str| value[field].as_str().map(str::to_owned);
    let (args, tool) = match call.tool.as_str() {
        "files.fs_write" => (&call.args["args"], "fs.write"),
        other => (&call.args, other),
    };
    let Some(path) = text(args, "path") else {
        return;
    };
    let content = text(args, "content").unwrap_or_default().into_bytes();
    if tool == "drill.slow_append" {
        let mut bytes = match world.get(&path) {
            Some(Setup::File(bytes)) => bytes.clone(),
            _ => Vec::new(),
        };
        bytes.extend_from_slice(format!("{}\n", text(args, "line").unwrap_or_default()).as_bytes());
        world.insert(path, Setup::File(bytes));
        return;
    }
    match tool {
        "fs.write" | "fault.probed_write" => {
            world.insert(path, Setup::File(content));
        }
        "fs.append" => {
            let mut bytes = match world.get(&path) {
                Some(Setup::File(bytes)) => bytes.clone(),
                _ => Vec::new(),
            };
            bytes.extend_from_slice(&content);
            world.insert(path, Setup::File(bytes));
        }
        "fs.delete" => {
            world.remove(&path);
        }
        _ => {}
    }
}

/// The paths whose content differs between two worlds, for a note.
pub(crate) fn differences(a: &World, b: &World) -> Vec<String> {
    let paths: std::collections::BTreeSet<&String> = a
        .keys()
        .chain(b.keys())
        .filter(|path| a.get(*path) != b.get(*path))
        .collect();
    paths.into_iter().cloned().collect()
}

/// The part of a world outside the agent's workspace (`outside/`).
pub(crate) fn outside(world: &World) -> World {
    world
        .iter()
        .filter(|(path, _)| path.starts_with("outside/"))
        .map(|(path, setup)| (path.clone(), setup.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::scenario::{Drive, Kind, Must};

    fn scenario(calls: Vec<Call>, attack: Option<usize>) -> Scenario {
        Scenario {
            id: "test-000".to_owned(),
            kind: Kind::Duplicate,
            variant: String::new(),
            seed: 0,
            setup: BTreeMap::from([
                ("ws/a.txt".to_owned(), Setup::File(b"a\n".to_vec())),
                (
                    "state/log.db".to_owned(),
                    Setup::File(b"not watched".to_vec()),
                ),
            ]),
            calls,
            policy_extra: String::new(),
            upstream: false,
            drive: Drive::Chain,
            must: Must::Complete,
            attack,
            forbidden: Vec::new(),
            stops_at: None,
            writes: None,
            recovery_writes: None,
            later_write: None,
            commands: false,
            agents: Vec::new(),
        }
    }

    #[test]
    fn the_model_applies_a_key_once_and_the_forbidden_call_never() {
        let append = Call::new("fs.append", json!({ "path": "ws/a.txt", "content": "b\n" }))
            .keyed("k".to_owned());
        let calls = vec![
            append.clone(),
            append,
            Call::new("fs.write", json!({ "path": "ws/new.txt", "content": "n" })),
            Call::new("fs.delete", json!({ "path": "ws/a.txt" })),
            Call::new(
                "files.fs_write",
                json!({ "args": { "path": "up/ws/u.txt", "content": "u" } }),
            ),
        ];
        let world = complete(&scenario(calls.clone(), Some(3)));
        assert_eq!(
            world.get("ws/a.txt"),
            Some(&Setup::File(b"a\nb\n".to_vec()))
        );
        assert_eq!(world.get("ws/new.txt"), Some(&Setup::File(b"n".to_vec())));
        assert_eq!(world.get("up/ws/u.txt"), Some(&Setup::File(b"u".to_vec())));
        assert!(
            !world.contains_key("state/log.db"),
            "the log is not the world"
        );
        let world = complete(&scenario(calls, None));
        assert!(!world.contains_key("ws/a.txt"), "deleted once allowed");
    }

    #[test]
    fn a_snapshot_reads_files_and_links_under_the_watched_folders_only() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let scenario = scenario(Vec::new(), None);
        lay_out(dir.path(), &scenario).expect("lays out");
        std::os::unix::fs::symlink("../outside", dir.path().join("ws/escape")).expect("links");
        let world = snapshot(dir.path()).expect("reads");
        assert_eq!(world.get("ws/a.txt"), Some(&Setup::File(b"a\n".to_vec())));
        assert_eq!(
            world.get("ws/escape"),
            Some(&Setup::Link("../outside".to_owned()))
        );
        assert!(!world.contains_key("state/log.db"));
        assert_eq!(initial(&scenario).len(), 1);
    }
}
