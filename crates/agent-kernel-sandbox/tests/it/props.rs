//! Property test: whatever path and operation, nothing outside the root changes or is read,
//! and no denied file is read or changed.

use std::fs;

use proptest::prelude::*;

use crate::{Fixture, symlink};

/// Names that exercise every rule: plain names, `..`, `.`, links that stay inside, links that
/// leave (relative and absolute), a link loop, a denied name and a link to it.
const NAMES: &[&str] = &[
    "a.txt",
    "sub",
    "..",
    ".",
    "in",
    "out",
    "abs",
    "up",
    "loop",
    "secret.txt",
    ".env",
    "innocent",
    "new.txt",
];

#[derive(Debug, Clone, Copy)]
enum Op {
    Read,
    Stat,
    Write,
    Append,
    Truncate,
    Remove,
    RemoveTemp,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        Just(Op::Read),
        Just(Op::Stat),
        Just(Op::Write),
        Just(Op::Append),
        Just(Op::Truncate),
        Just(Op::Remove),
        Just(Op::RemoveTemp),
    ]
}

fn path() -> impl Strategy<Value = (bool, String)> {
    (
        any::<bool>(),
        prop::collection::vec(prop::sample::select(NAMES), 1..5),
    )
        .prop_map(|(from_workspace, names)| (from_workspace, names.join("/")))
}

fn layout(fixture: &Fixture) {
    let ws = fixture.workspace();
    fs::create_dir(ws.join("sub")).expect("sub");
    fs::write(ws.join("sub/a.txt"), "sub alpha").expect("sub/a.txt");
    fs::write(ws.join(".env"), "TOKEN").expect(".env");
    symlink("sub", ws.join("in"));
    symlink("../outside", ws.join("out"));
    symlink(fixture.path("outside"), ws.join("abs"));
    symlink("../..", ws.join("sub/up"));
    symlink("loop", ws.join("loop"));
    symlink(".env", ws.join("innocent"));
}

fn apply(fixture: &Fixture, op: Op, path: &str, from_workspace: bool) -> Option<Vec<u8>> {
    let cwd = if from_workspace {
        fixture.workspace()
    } else {
        fixture.base.clone()
    };
    let file = fixture.sandbox.resolve_open(path, &cwd).ok()?;
    match op {
        Op::Read => file.read(1024).ok(),
        Op::Stat => file.stat().ok().map(|_| Vec::new()),
        Op::Write => file
            .write_atomic(b"written", ".prop.tmp", false)
            .ok()
            .map(|()| Vec::new()),
        Op::Append => file.append(b"appended", false).ok().map(|_| Vec::new()),
        Op::Truncate => file.truncate(0, false).ok().map(|()| Vec::new()),
        Op::Remove => file.remove_file_if_exists(false).ok().map(|_| Vec::new()),
        Op::RemoveTemp => file
            .remove_temp(".prop.tmp", false)
            .ok()
            .map(|_| Vec::new()),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn nothing_outside_the_root_or_denied_is_touched(
        steps in prop::collection::vec((op(), path()), 1..12)
    ) {
        let fixture = Fixture::new();
        layout(&fixture);
        for (op, (from_workspace, path)) in &steps {
            if let Some(read) = apply(&fixture, *op, path, *from_workspace) {
                prop_assert_ne!(read.as_slice(), b"secret".as_slice(), "{:?} {}", op, path);
                prop_assert_ne!(read.as_slice(), b"TOKEN".as_slice(), "{:?} {}", op, path);
            }
            prop_assert_eq!(fixture.listing("outside"), ["secret.txt"]);
            prop_assert_eq!(fixture.read("outside/secret.txt"), "secret");
            prop_assert_eq!(fixture.read("workspace/.env"), "TOKEN");
        }
    }
}
