//! Parsing `sandbox.toml`.

use std::fs;

use agent_kernel_sandbox::{DEFAULT_MAX_IO_BYTES, FsSandbox, MAX_IO_BYTES_LIMIT, Policy};

fn parse_error(text: &str) -> String {
    let dir = tempfile::tempdir().expect("temp dir");
    fs::create_dir(dir.path().join("workspace")).expect("workspace");
    Policy::from_toml_str(text, dir.path())
        .expect_err("policy must be rejected")
        .to_string()
}

#[test]
fn unknown_keys_are_errors_naming_the_key() {
    let message = parse_error("[fs]\nallow = [\"workspace\"]\nalow = []\n");
    assert!(message.contains("unknown field `alow`"), "{message}");
    assert!(message.contains("line 3"), "{message}");

    let message = parse_error("[fss]\nallow = [\"workspace\"]\n");
    assert!(message.contains("unknown field `fss`"), "{message}");

    let message = parse_error("[http]\nallow_domains = []\nmax_bytes = 1\n");
    assert!(message.contains("unknown field `max_bytes`"), "{message}");
}

#[test]
fn wrong_types_and_missing_fields_are_errors() {
    let message = parse_error("[fs]\nallow = \"workspace\"\n");
    assert!(message.contains("invalid type"), "{message}");
    let message = parse_error("[fs]\ndeny_names = []\n");
    assert!(message.contains("missing field `allow`"), "{message}");
    let message = parse_error("[fs]\nallow = [\"workspace\"]\nmax_io_bytes = -1\n");
    assert!(
        message.contains("max_io_bytes") || message.contains("u64"),
        "{message}"
    );
}

#[test]
fn missing_root_is_an_error_naming_it() {
    let message = parse_error("[fs]\nallow = [\"workspace\", \"nowhere\"]\n");
    assert!(message.contains("nowhere"), "{message}");
    assert!(message.contains("does not exist"), "{message}");
}

#[test]
fn root_that_is_a_file_is_an_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    fs::write(dir.path().join("file"), "x").expect("file");
    let error =
        Policy::from_toml_str("[fs]\nallow = [\"file\"]\n", dir.path()).expect_err("a file");
    assert!(error.to_string().contains("is not a directory"), "{error}");
}

#[test]
fn limits_are_checked() {
    let message = parse_error(&format!(
        "[fs]\nallow = [\"workspace\"]\nmax_io_bytes = {}\n",
        MAX_IO_BYTES_LIMIT + 1
    ));
    assert!(message.contains("max_io_bytes"), "{message}");
    let message = parse_error("[fs]\nallow = [\"workspace\"]\nmax_io_bytes = 0\n");
    assert!(message.contains("max_io_bytes"), "{message}");
    let message = parse_error("[fs]\nallow = [\"workspace\"]\ndeny_names = [\"[\"]\n");
    assert!(message.contains("not a valid glob"), "{message}");
    let message = parse_error("[fs]\nallow = [\"workspace\"]\ndeny_names = [\"a/b\"]\n");
    assert!(message.contains("path separator"), "{message}");
}

#[test]
fn defaults_apply() {
    let dir = tempfile::tempdir().expect("temp dir");
    fs::create_dir(dir.path().join("workspace")).expect("workspace");
    let policy =
        Policy::from_toml_str("[fs]\nallow = [\"workspace\"]\n", dir.path()).expect("policy");
    let fs_policy = policy.fs().expect("[fs]");
    assert_eq!(fs_policy.max_io_bytes(), DEFAULT_MAX_IO_BYTES);
    assert!(fs_policy.deny_names().is_empty());
    assert_eq!(
        fs_policy.allow(),
        [dir.path()
            .join("workspace")
            .canonicalize()
            .expect("canonical")]
    );
    assert!(policy.http().is_none());
}

#[test]
fn load_resolves_roots_against_the_policy_folder() {
    let dir = tempfile::tempdir().expect("temp dir");
    let conf = dir.path().join("conf");
    fs::create_dir_all(conf.join("workspace")).expect("conf/workspace");
    let file = conf.join("sandbox.toml");
    fs::write(
        &file,
        "[fs]\nallow = [\"workspace\"]\n\n[http]\nallow_domains = [\"example.com\", \"*.example.org\"]\nmax_response_bytes = 2048\n",
    )
    .expect("policy file");
    let policy = Policy::load(&file).expect("policy");
    assert_eq!(policy.source(), Some(file.as_path()));
    assert_eq!(
        policy.fs().expect("[fs]").allow(),
        [conf.join("workspace").canonicalize().expect("canonical")]
    );
    let http = policy.http().expect("[http]");
    assert_eq!(http.allow_domains(), ["example.com", "*.example.org"]);
    assert_eq!(http.max_response_bytes(), 2048);
}

#[test]
fn load_errors_name_the_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("absent.toml");
    let error = Policy::load(&missing).expect_err("absent");
    assert!(error.to_string().contains("absent.toml"), "{error}");

    let file = dir.path().join("bad.toml");
    fs::write(&file, "[fs\n").expect("policy file");
    let error = Policy::load(&file).expect_err("bad toml");
    assert!(error.to_string().contains("bad.toml"), "{error}");
}

#[test]
fn a_missing_fs_section_denies_every_path_and_says_how_to_pass_a_policy() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("sandbox.toml");
    fs::write(&file, "[http]\nallow_domains = []\n").expect("policy file");
    let sandbox = FsSandbox::new(&Policy::load(&file).expect("policy")).expect("sandbox");
    assert!(!sandbox.allows_files());
    let error = sandbox.resolve("a.txt", dir.path()).expect_err("denied");
    assert!(error.is_denied());
    let message = error.to_string();
    assert!(message.contains("no file access is allowed"), "{message}");
    assert!(
        message.contains("sandbox.toml has no [fs] section"),
        "{message}"
    );
    assert!(message.contains("--sandbox FILE"), "{message}");

    let error = FsSandbox::deny_all()
        .resolve("a.txt", dir.path())
        .expect_err("denied");
    assert!(error.is_denied());
    assert!(
        error.to_string().contains("no sandbox policy was given"),
        "{error}"
    );
    assert!(
        FsSandbox::new(&Policy::deny_all())
            .expect("sandbox")
            .roots()
            .is_empty()
    );
}
