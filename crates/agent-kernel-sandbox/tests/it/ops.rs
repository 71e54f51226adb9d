//! File operations through the roots' handles: symbolic links, limits, atomicity.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use agent_kernel_sandbox::{ConfinedFile, ConfinedPath, SandboxError};

use crate::{Fixture, symlink};

fn open(fixture: &Fixture, path: &str) -> ConfinedFile {
    fixture
        .sandbox
        .resolve_open(path, &fixture.base)
        .unwrap_or_else(|error| panic!("{path}: {error}"))
}

fn assert_denied(result: Result<impl std::fmt::Debug, SandboxError>) -> String {
    let error = result.expect_err("must be denied");
    assert!(error.is_denied(), "not a denial: {error}");
    error.to_string()
}

#[test]
fn read_write_round_trip() {
    let fixture = Fixture::new();
    assert_eq!(
        open(&fixture, "workspace/a.txt").read(64).expect("read"),
        b"alpha"
    );
    let file = open(&fixture, "workspace/b.txt");
    assert_eq!(file.stat().expect("stat"), None);
    file.write_atomic(b"bravo", ".b.tmp", true).expect("write");
    assert_eq!(file.stat().expect("stat"), Some(5));
    assert_eq!(fixture.read("workspace/b.txt"), "bravo");
}

#[test]
fn absolute_symlink_to_outside_is_refused() {
    let fixture = Fixture::new();
    symlink(
        fixture.path("outside/secret.txt"),
        fixture.path("workspace/link"),
    );
    assert_denied(open(&fixture, "workspace/link").read(64));
    let message = assert_denied(open(&fixture, "workspace/link").write_atomic(b"x", ".t", false));
    assert!(
        message.contains("refusing to write through symbolic link"),
        "{message}"
    );
    assert_eq!(fixture.read("outside/secret.txt"), "secret");
}

#[test]
fn relative_symlink_to_outside_is_refused() {
    let fixture = Fixture::new();
    symlink("../outside/secret.txt", fixture.path("workspace/rel"));
    let message = assert_denied(open(&fixture, "workspace/rel").read(64));
    assert!(message.contains("leads outside"), "{message}");
    assert_denied(open(&fixture, "workspace/rel").append(b"x", false));
    assert_denied(open(&fixture, "workspace/rel").truncate(0, false));
    assert_denied(open(&fixture, "workspace/rel").remove_file(false));
    assert_eq!(fixture.read("outside/secret.txt"), "secret");
}

#[test]
fn symlinked_folder_to_outside_is_refused_for_every_operation() {
    let fixture = Fixture::new();
    symlink(fixture.path("outside"), fixture.path("workspace/out"));
    symlink("../outside", fixture.path("workspace/out_rel"));
    for dir in ["workspace/out", "workspace/out_rel"] {
        let secret = open(&fixture, &format!("{dir}/secret.txt"));
        assert_denied(secret.read(64));
        assert_denied(secret.stat());
        assert_denied(secret.write_atomic(b"pwned", ".t", false));
        assert_denied(secret.append(b"pwned", false));
        assert_denied(secret.truncate(0, false));
        assert_denied(secret.remove_file_if_exists(false));
        assert_denied(open(&fixture, &format!("{dir}/new.txt")).write_atomic(b"x", ".t", false));
    }
    assert_eq!(fixture.read("outside/secret.txt"), "secret");
    assert_eq!(fixture.listing("outside"), ["secret.txt"]);
}

#[test]
fn symlink_inside_the_root_is_followed_for_reads_only() {
    let fixture = Fixture::new();
    symlink("a.txt", fixture.path("workspace/alias"));
    fs::create_dir(fixture.path("workspace/sub")).expect("sub");
    symlink("../a.txt", fixture.path("workspace/sub/up"));
    assert_eq!(
        open(&fixture, "workspace/alias").read(64).expect("read"),
        b"alpha"
    );
    assert_eq!(
        open(&fixture, "workspace/sub/up").read(64).expect("read"),
        b"alpha"
    );
    let message = assert_denied(open(&fixture, "workspace/alias").write_atomic(b"x", ".t", false));
    assert!(
        message.contains("refusing to write through symbolic link"),
        "{message}"
    );
    assert_denied(open(&fixture, "workspace/alias").append(b"x", false));
    assert_denied(open(&fixture, "workspace/alias").stat());
    assert_eq!(fixture.read("workspace/a.txt"), "alpha");
    // A symbolic link in the folder part is fine when it stays inside.
    symlink("sub", fixture.path("workspace/sublink"));
    open(&fixture, "workspace/sublink/c.txt")
        .write_atomic(b"charlie", ".t", false)
        .expect("write through a folder link inside the root");
    assert_eq!(fixture.read("workspace/sub/c.txt"), "charlie");
}

#[test]
fn a_link_with_an_innocent_name_cannot_reach_a_denied_name() {
    let fixture = Fixture::new();
    fs::write(fixture.path("workspace/.env"), "TOKEN=1").expect(".env");
    symlink(".env", fixture.path("workspace/innocent"));
    let message = assert_denied(open(&fixture, "workspace/innocent").read(64));
    assert!(message.contains("denied name `.env`"), "{message}");
    fs::create_dir(fixture.path("workspace/.git")).expect(".git");
    symlink(".git", fixture.path("workspace/g"));
    assert_denied(open(&fixture, "workspace/g/config").write_atomic(b"x", ".t", false));
    assert_eq!(fixture.listing("workspace/.git"), Vec::<String>::new());
}

#[test]
fn max_io_bytes_bounds_reads_and_writes() {
    let fixture = Fixture::new(); // max_io_bytes = 64
    fs::write(fixture.path("workspace/big.txt"), vec![b'x'; 65]).expect("big");
    let message = assert_denied(open(&fixture, "workspace/big.txt").read(1024));
    assert!(
        message.contains("65 bytes exceed the limit of 64 bytes"),
        "{message}"
    );
    // The caller's own limit applies too.
    assert_denied(open(&fixture, "workspace/a.txt").read(4));
    let file = open(&fixture, "workspace/new.txt");
    assert_denied(file.write_atomic(&[b'y'; 65], ".t", false));
    assert_denied(file.append(&[b'y'; 65], false));
    assert_eq!(file.stat().expect("stat"), None);
    file.write_atomic(&[b'y'; 64], ".t", false)
        .expect("at the limit");
    assert!(fixture.sandbox.check_size("x", 64).is_ok());
    assert!(
        fixture
            .sandbox
            .check_size("x", 65)
            .is_err_and(|e| e.is_denied())
    );
}

#[test]
fn atomic_write_leaves_no_temp_file_and_keeps_permissions() {
    let fixture = Fixture::new();
    let target = fixture.path("workspace/a.txt");
    fs::set_permissions(&target, fs::Permissions::from_mode(0o600)).expect("chmod");
    open(&fixture, "workspace/a.txt")
        .write_atomic(b"new content", ".a.txt.agent-kernel.tmp", true)
        .expect("write");
    assert_eq!(fixture.read("workspace/a.txt"), "new content");
    assert_eq!(fixture.listing("workspace"), ["a.txt"]);
    let mode = fs::metadata(&target)
        .expect("metadata")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn a_leftover_temp_file_stops_the_write_and_is_removable() {
    let fixture = Fixture::new();
    fs::write(fixture.path("workspace/.t"), "stale").expect("stale temp");
    let file = open(&fixture, "workspace/a.txt");
    let error = file
        .write_atomic(b"new", ".t", false)
        .expect_err("temp exists");
    assert!(!error.may_have_changed(), "{error}");
    assert_eq!(fixture.read("workspace/a.txt"), "alpha");
    assert!(file.remove_temp(".t", true).expect("removed"));
    assert!(!file.remove_temp(".t", true).expect("already gone"));
    assert_eq!(fixture.listing("workspace"), ["a.txt"]);
}

#[test]
fn temp_names_must_be_plain() {
    let fixture = Fixture::new();
    let file = open(&fixture, "workspace/a.txt");
    for bad in ["", ".", "..", "../x", "a/b", "a.txt"] {
        let error = file.write_atomic(b"x", bad, false).expect_err(bad);
        assert!(error.is_invalid_path(), "{bad}: {error}");
        assert!(file.remove_temp(bad, false).is_err(), "{bad}");
    }
    assert_eq!(fixture.read("workspace/a.txt"), "alpha");
}

#[test]
fn parents_are_never_created() {
    let fixture = Fixture::new();
    let file = open(&fixture, "workspace/missing/b.txt");
    let error = file.write_atomic(b"x", ".t", false).expect_err("no parent");
    assert!(
        matches!(error, SandboxError::ParentMissing { .. }),
        "{error}"
    );
    assert!(error.is_not_found());
    assert!(file.append(b"x", false).is_err());
    assert!(!file.remove_file_if_exists(false).expect("absent is fine"));
    assert!(!file.remove_temp(".t", false).expect("absent is fine"));
    assert!(!fixture.path("workspace/missing").exists());
}

#[test]
fn non_regular_files_are_refused() {
    let fixture = Fixture::new();
    fs::create_dir(fixture.path("workspace/dir")).expect("dir");
    let dir = open(&fixture, "workspace/dir");
    for result in [
        dir.read(64).map(|_| ()),
        dir.write_atomic(b"x", ".t", false),
        dir.append(b"x", false).map(|_| ()),
        dir.remove_file(false),
    ] {
        let error = result.expect_err("a directory");
        assert!(
            matches!(error, SandboxError::NotRegularFile { .. }),
            "{error}"
        );
    }
    let status = std::process::Command::new("mkfifo")
        .arg(fixture.path("workspace/fifo"))
        .status()
        .expect("mkfifo runs");
    assert!(status.success());
    let fifo = open(&fixture, "workspace/fifo");
    // Neither call may block on the FIFO.
    assert!(matches!(
        fifo.read(64),
        Err(SandboxError::NotRegularFile { .. })
    ));
    assert!(matches!(
        fifo.append(b"x", false),
        Err(SandboxError::NotRegularFile { .. })
    ));
}

#[test]
fn append_truncate_and_remove() {
    let fixture = Fixture::new();
    let file = open(&fixture, "workspace/log.txt");
    assert_eq!(file.append(b"one ", true).expect("create"), 4);
    assert_eq!(file.append(b"two", true).expect("append"), 7);
    assert_eq!(fixture.read("workspace/log.txt"), "one two");
    file.truncate(4, true).expect("truncate");
    assert_eq!(fixture.read("workspace/log.txt"), "one ");
    file.truncate(4, true).expect("same length is a no-op");
    let error = file.truncate(10, true).expect_err("cannot grow");
    assert!(matches!(error, SandboxError::Conflict { .. }), "{error}");
    file.remove_file(true).expect("remove");
    assert!(file.remove_file(true).expect_err("gone").is_not_found());
    assert!(!file.remove_file_if_exists(true).expect("absent is fine"));
    assert!(file.truncate(0, true).expect_err("gone").is_not_found());
    assert!(file.read(64).expect_err("gone").is_not_found());
}

#[test]
fn confined_paths_round_trip_and_reconfine_under_the_policy_in_force() {
    let fixture = Fixture::new();
    let confined = fixture
        .sandbox
        .resolve("workspace/a.txt", &fixture.base)
        .expect("allowed");
    let json = serde_json::to_value(&confined).expect("serializes");
    let back: ConfinedPath = serde_json::from_value(json).expect("parses");
    assert_eq!(back, confined);
    let file = fixture.sandbox.reconfine(&back).expect("still allowed");
    assert_eq!(file.read(1024).expect("read"), b"alpha");
    file.write_atomic(b"restored", ".t", false).expect("write");
    assert_eq!(fixture.read("workspace/a.txt"), "restored");
}

#[test]
fn a_recorded_root_is_no_authority() {
    let fixture = Fixture::new();
    // A record that names `/` as its root, as a tampered log would: only where the path
    // really lies counts, and it lies outside the policy's roots.
    let forged = ConfinedPath::new(
        PathBuf::from("/"),
        fixture
            .path("outside/secret.txt")
            .strip_prefix("/")
            .expect("absolute")
            .to_owned(),
    )
    .expect("shape");
    let message = assert_denied(fixture.sandbox.reconfine(&forged));
    assert!(message.contains("outside every allowed root"), "{message}");
    assert!(message.contains("recorded step"), "{message}");
    // The same forged root, but a path inside today's root: the file of the policy in force.
    let inside = ConfinedPath::new(
        PathBuf::from("/"),
        fixture
            .path("workspace/a.txt")
            .strip_prefix("/")
            .expect("absolute")
            .to_owned(),
    )
    .expect("shape");
    let file = fixture
        .sandbox
        .reconfine(&inside)
        .expect("inside today's root");
    assert_eq!(file.read(64).expect("read"), b"alpha");
    assert_eq!(file.path().root(), fixture.workspace());
    // Today's denied names and limits apply to a record too.
    let denied_name =
        ConfinedPath::new(fixture.workspace(), PathBuf::from("keys/id.pem")).expect("shape");
    assert_denied(fixture.sandbox.reconfine(&denied_name));
    assert_eq!(
        fixture
            .sandbox
            .reconfine(&inside)
            .expect("allowed")
            .max_io_bytes(),
        64
    );
    // No policy today: nothing recorded can be reached.
    let deny_all = agent_kernel_sandbox::FsSandbox::deny_all();
    assert_denied(deny_all.reconfine(&inside));
    assert_eq!(fixture.read("outside/secret.txt"), "secret");
}

#[test]
fn reconfined_paths_stay_confined() {
    let fixture = Fixture::new();
    symlink(fixture.path("outside"), fixture.path("workspace/out"));
    let confined =
        ConfinedPath::new(fixture.workspace(), PathBuf::from("out/secret.txt")).expect("shape");
    let file = fixture
        .sandbox
        .reconfine(&confined)
        .expect("the first line allows it");
    assert_denied(file.read(64));
    assert_denied(file.write_atomic(b"pwned", ".t", false));
    assert_denied(file.remove_file_if_exists(false));
    assert_eq!(fixture.read("outside/secret.txt"), "secret");
    for (root, rel) in [
        (fixture.workspace(), "../outside/secret.txt"),
        (fixture.workspace(), ""),
        (fixture.workspace(), "/etc/passwd"),
        (fixture.workspace(), "sub/.."),
        (PathBuf::from("relative"), "a.txt"),
    ] {
        let json = serde_json::json!({ "root": root, "rel": rel });
        assert!(
            serde_json::from_value::<ConfinedPath>(json).is_err(),
            "{rel}"
        );
    }
}

#[test]
fn a_record_under_a_root_the_policy_no_longer_allows_is_refused() {
    let fixture = Fixture::new();
    let confined = fixture
        .sandbox
        .resolve("workspace/a.txt", &fixture.base)
        .expect("allowed");
    let narrower =
        agent_kernel_sandbox::Policy::from_toml_str("[fs]\nallow = [\"outside\"]\n", &fixture.base)
            .expect("policy");
    let today = agent_kernel_sandbox::FsSandbox::new(&narrower).expect("sandbox");
    assert_denied(today.reconfine(&confined));
    assert_eq!(fixture.read("workspace/a.txt"), "alpha");
}

#[test]
fn open_refuses_a_path_from_another_root() {
    let fixture = Fixture::new();
    let foreign =
        ConfinedPath::new(fixture.path("outside"), PathBuf::from("secret.txt")).expect("shape");
    let message = assert_denied(fixture.sandbox.open(&foreign));
    assert!(
        message.contains("not allowed by the current policy"),
        "{message}"
    );
}

#[test]
fn in_place_writes_through_a_hard_link_to_outside_are_refused() {
    let fixture = Fixture::new();
    fs::hard_link(
        fixture.path("outside/secret.txt"),
        fixture.path("workspace/linked.txt"),
    )
    .expect("links");
    let message = assert_denied(open(&fixture, "workspace/linked.txt").append(b"pwned", false));
    assert!(message.contains("hard links"), "{message}");
    assert_denied(open(&fixture, "workspace/linked.txt").truncate(0, false));
    assert_eq!(fixture.read("outside/secret.txt"), "secret");
    // An atomic write replaces the link by rename: the other name keeps its content.
    open(&fixture, "workspace/linked.txt")
        .write_atomic(b"new", ".l.tmp", false)
        .expect("writes");
    assert_eq!(fixture.read("workspace/linked.txt"), "new");
    assert_eq!(fixture.read("outside/secret.txt"), "secret");
}
