//! Ruling on paths, without touching the disk.

use std::path::Path;

use agent_kernel_sandbox::{FsSandbox, Policy, SandboxError};

use crate::Fixture;

fn denied(fixture: &Fixture, path: &str, cwd: &Path) -> String {
    let error = fixture
        .sandbox
        .resolve(path, cwd)
        .expect_err("must be denied");
    assert!(error.is_denied(), "{error}");
    assert!(error.to_string().contains(path), "{error}");
    error.to_string()
}

fn invalid(fixture: &Fixture, path: &str) -> SandboxError {
    let error = fixture
        .sandbox
        .resolve(path, &fixture.base)
        .expect_err("must be invalid");
    assert!(error.is_invalid_path(), "{error}");
    error
}

#[test]
fn relative_and_absolute_paths_inside_a_root_resolve() {
    let fixture = Fixture::new();
    let confined = fixture
        .sandbox
        .resolve("workspace/sub/b.txt", &fixture.base)
        .expect("allowed");
    assert_eq!(confined.root(), fixture.workspace());
    assert_eq!(confined.rel(), Path::new("sub/b.txt"));

    let absolute = fixture.path("workspace/a.txt");
    let confined = fixture
        .sandbox
        .resolve(absolute.to_str().expect("utf-8"), Path::new("/elsewhere"))
        .expect("allowed");
    assert_eq!(confined.rel(), Path::new("a.txt"));

    // The working directory may itself be inside the root.
    let confined = fixture
        .sandbox
        .resolve("a.txt", &fixture.workspace())
        .expect("allowed");
    assert_eq!(confined.rel(), Path::new("a.txt"));
}

#[test]
fn dot_dot_that_escapes_is_denied() {
    let fixture = Fixture::new();
    let message = denied(&fixture, "workspace/../outside/secret.txt", &fixture.base);
    assert!(message.contains("through `..`"), "{message}");
    let message = denied(&fixture, "../outside/secret.txt", &fixture.workspace());
    assert!(message.contains("through `..`"), "{message}");
}

#[test]
fn leaving_and_reentering_is_denied() {
    let fixture = Fixture::new();
    let message = denied(&fixture, "workspace/../workspace/a.txt", &fixture.base);
    assert!(message.contains("through `..`"), "{message}");
    denied(&fixture, "sub/../../workspace/a.txt", &fixture.workspace());
}

#[test]
fn dot_dot_that_stays_inside_resolves() {
    let fixture = Fixture::new();
    let confined = fixture
        .sandbox
        .resolve("workspace/sub/../a.txt", &fixture.base)
        .expect("allowed");
    assert_eq!(confined.rel(), Path::new("sub/../a.txt"));
}

#[test]
fn absolute_path_outside_is_denied() {
    let fixture = Fixture::new();
    let secret = fixture.path("outside/secret.txt");
    let message = denied(&fixture, secret.to_str().expect("utf-8"), &fixture.base);
    assert!(message.contains("outside every allowed root"), "{message}");
    denied(&fixture, "/etc/passwd", &fixture.base);
}

#[test]
fn a_relative_working_directory_matches_no_root() {
    let fixture = Fixture::new();
    denied(&fixture, "workspace/a.txt", Path::new("relative"));
}

#[test]
fn the_root_itself_is_not_a_file() {
    let fixture = Fixture::new();
    let message = denied(&fixture, "workspace", &fixture.base);
    assert!(message.contains("itself"), "{message}");
    let message = denied(&fixture, "workspace/.", &fixture.base);
    assert!(message.contains("itself"), "{message}");
}

#[test]
fn denied_names_match_at_any_depth_and_in_any_case() {
    let fixture = Fixture::new();
    let message = denied(&fixture, "workspace/sub/.ENV", &fixture.base);
    assert!(
        message.contains("`.ENV` matches the denied name `.env`"),
        "{message}"
    );
    denied(&fixture, "workspace/.env", &fixture.base);
    denied(&fixture, "workspace/keys/Server.PEM", &fixture.base);
    denied(&fixture, "workspace/.Git/config", &fixture.base);
    denied(&fixture, "workspace/a/b/c/.git/HEAD", &fixture.base);
    // Names that merely contain a denied name are fine.
    for allowed in [
        "workspace/env.txt",
        "workspace/a.pem.txt",
        "workspace/git/x",
    ] {
        fixture
            .sandbox
            .resolve(allowed, &fixture.base)
            .unwrap_or_else(|error| panic!("{allowed}: {error}"));
    }
}

#[test]
fn malformed_paths_are_invalid() {
    let fixture = Fixture::new();
    assert!(invalid(&fixture, "").to_string().contains("empty"));
    assert!(
        invalid(&fixture, "workspace/a\0b")
            .to_string()
            .contains("NUL")
    );
    let long = format!("workspace/{}", "x".repeat(256));
    assert!(invalid(&fixture, &long).to_string().contains("255"));
    assert!(
        invalid(&fixture, "workspace/sub/")
            .to_string()
            .contains("folder")
    );
    assert!(
        invalid(&fixture, "workspace/sub/..")
            .to_string()
            .contains("does not name a file")
    );
    let name_255 = format!("workspace/{}", "x".repeat(255));
    fixture
        .sandbox
        .resolve(&name_255, &fixture.base)
        .expect("255 bytes is fine");
}

#[test]
fn nested_roots_pick_the_most_specific() {
    let fixture = Fixture::new();
    let inner = fixture.path("workspace/inner");
    std::fs::create_dir(&inner).expect("inner");
    let policy = Policy::from_toml_str(
        "[fs]\nallow = [\"workspace\", \"workspace/inner\"]\n",
        &fixture.base,
    )
    .expect("policy");
    let sandbox = FsSandbox::new(&policy).expect("sandbox");
    let confined = sandbox
        .resolve("workspace/inner/x.txt", &fixture.base)
        .expect("allowed");
    assert_eq!(confined.root(), inner);
    assert_eq!(confined.rel(), Path::new("x.txt"));
}

#[test]
fn resolve_touches_nothing() {
    let fixture = Fixture::new();
    fixture
        .sandbox
        .resolve("workspace/new/deep/file.txt", &fixture.base)
        .expect("allowed");
    assert_eq!(fixture.listing("workspace"), ["a.txt"]);
}
