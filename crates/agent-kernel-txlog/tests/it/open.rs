//! Opening: new files, reopening, and refusing files that are not logs without touching them.

use std::fs;

use agent_kernel_api::{TxError, TxLog};

use crate::open;

#[tokio::test]
async fn a_new_log_is_created_and_reopened() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("log.db");
    {
        let log = open(&path).expect("creates");
        log.write(vec![
            crate::new_saga("s1"),
            crate::begin("s1", 0, None, "h"),
        ])
        .await
        .expect("writes");
    }
    let log = open(&path).expect("reopens");
    assert_eq!(log.sagas(10).await.expect("reads").len(), 1);
}

#[test]
fn an_empty_file_becomes_a_log() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("empty.db");
    fs::write(&path, b"").expect("writes");
    open(&path).expect("an empty file holds nothing to lose");
}

fn assert_refused_untouched(contents: &[u8], fragment: &str) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("not-a-log.db");
    fs::write(&path, contents).expect("writes");
    let error = open(&path).expect_err("refused");
    assert!(matches!(error, TxError::NotALog { .. }), "{error:?}");
    assert!(error.to_string().contains(fragment), "{error}");
    assert_eq!(fs::read(&path).expect("reads"), contents, "file untouched");
    let mut names: Vec<_> = fs::read_dir(dir.path())
        .expect("lists")
        .map(|entry| entry.expect("entry").file_name())
        .collect();
    names.sort();
    assert_eq!(names, ["not-a-log.db"], "no -wal or -shm files created");
}

#[test]
fn a_text_file_is_refused_and_left_untouched() {
    assert_refused_untouched(
        b"these are my notes, not a database\n",
        "not an SQLite database",
    );
    assert_refused_untouched(b"SQLite", "not an SQLite database");
}

#[test]
fn another_applications_sqlite_database_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("other.db");
    {
        let conn = rusqlite::Connection::open(&path).expect("opens");
        conn.execute_batch("CREATE TABLE notes (body TEXT); INSERT INTO notes VALUES ('keep me');")
            .expect("creates");
    }
    let before = fs::read(&path).expect("reads");
    assert_refused_untouched(&before, "another application");
}

#[test]
fn a_log_from_a_newer_build_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("log.db");
    drop(open(&path).expect("creates"));
    {
        let conn = rusqlite::Connection::open(&path).expect("opens");
        conn.pragma_update(None, "user_version", 99).expect("sets");
    }
    let error = open(&path).expect_err("refused");
    assert!(
        matches!(error, TxError::SchemaTooNew { found: 99, .. }),
        "{error:?}"
    );
}

#[test]
fn a_directory_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let error = open(dir.path()).expect_err("refused");
    assert!(error.to_string().contains("not a regular file"), "{error}");
}

#[tokio::test]
async fn a_new_log_is_private_to_its_owner() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("log.db");
    let log = open(&path).expect("creates");
    log.write(vec![
        crate::new_saga("s1"),
        crate::begin("s1", 0, None, "h"),
    ])
    .await
    .expect("writes");
    for file in ["log.db", "log.db-wal", "log.db-shm"] {
        let mode = fs::metadata(dir.path().join(file))
            .expect("exists")
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "{file} is readable by others: {mode:o}");
    }
}
