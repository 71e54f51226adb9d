//! The exact schema: every object a log holds is one this build creates, or the log is
//! refused; a new log appears whole or not at all; links lead to the real file.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use agent_kernel_api::{TxError, TxLog};

use crate::{open, verify};

/// A log with one saga and one step, closed.
async fn written_log(path: &Path) {
    let log = open(path).expect("creates");
    log.write(vec![
        crate::new_saga("s1"),
        crate::begin("s1", 0, Some("k"), "h"),
    ])
    .await
    .expect("writes");
    // Closed before the test edits the file: a writer closing later would checkpoint over
    // the edit.
    log.close().await;
}

/// Plants `sql` in the log at `path` through a plain SQLite connection, as someone who can
/// write the file would.
fn plant(path: &Path, sql: &str) {
    let conn = rusqlite::Connection::open(path).expect("opens");
    conn.execute_batch(sql).expect("plants");
}

/// `audit verify` reports the schema (record 0) naming `object`, and opening refuses the
/// log as tampered, naming it too.
fn check_refused(path: &Path, object: &str) {
    let report = verify(path, None).expect("verifies");
    let bad = report.first_bad.expect("the planted object is found");
    assert_eq!(bad.seq, 0, "{bad:?}");
    assert!(bad.reason.contains(object), "{}", bad.reason);
    let error = open(path).expect_err("refused");
    assert!(matches!(error, TxError::Tampered { .. }), "{error:?}");
    assert!(error.to_string().contains(object), "{error}");
}

#[tokio::test]
async fn every_kind_of_foreign_schema_object_is_found_by_verify_and_refused_by_open() {
    let cases: &[(&str, &str)] = &[
        (
            "CREATE TRIGGER t_sagas AFTER UPDATE ON sagas BEGIN SELECT 1; END;",
            "trigger `t_sagas` on table `sagas`",
        ),
        (
            "CREATE TRIGGER t_steps BEFORE INSERT ON saga_steps BEGIN SELECT 1; END;",
            "trigger `t_steps` on table `saga_steps`",
        ),
        (
            "CREATE TRIGGER t_keys AFTER DELETE ON idempotency_keys BEGIN SELECT 1; END;",
            "trigger `t_keys` on table `idempotency_keys`",
        ),
        (
            "CREATE TRIGGER t_audit AFTER INSERT ON audit_log BEGIN UPDATE saga_steps SET undo = '{}'; END;",
            "trigger `t_audit` on table `audit_log`",
        ),
        (
            "CREATE VIEW steps_view AS SELECT * FROM saga_steps;",
            "view `steps_view`",
        ),
        (
            "CREATE INDEX steps_by_tool ON saga_steps (tool_id);",
            "index `steps_by_tool` on table `saga_steps`",
        ),
        (
            "ALTER TABLE saga_steps ADD COLUMN extra TEXT;",
            "table `saga_steps` is not defined as this build defines it",
        ),
        ("CREATE TABLE extra (x);", "table `extra`"),
        ("DROP INDEX sagas_by_created;", "index `sagas_by_created`"),
    ];
    for (sql, object) in cases {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("log.db");
        written_log(&path).await;
        assert!(
            verify(&path, None).expect("verifies").is_intact(),
            "clean before"
        );
        plant(&path, sql);
        check_refused(&path, object);
    }
}

#[tokio::test]
async fn a_user_version_that_does_not_match_the_structure_is_tampering() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("log.db");
    written_log(&path).await;
    // Version 2 lacked `sagas.dry_run`: a migration would run again over a newer table.
    plant(&path, "PRAGMA user_version = 2;");
    let current = format!(
        "structure is that of version {}",
        agent_kernel_txlog::SCHEMA_VERSION
    );
    check_refused(&path, &current);
    plant(&path, "PRAGMA user_version = 1;");
    check_refused(&path, &current);
}

#[tokio::test]
async fn a_trigger_added_while_the_log_is_open_never_fires() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("log.db");
    let log = open(&path).expect("creates");
    log.write(vec![crate::new_saga("s1")])
        .await
        .expect("writes");
    // Planted after the schema was checked: the writer's connection runs no trigger.
    plant(
        &path,
        "CREATE TABLE fired (x); CREATE TRIGGER spy AFTER INSERT ON saga_steps BEGIN INSERT INTO fired VALUES (1); END;",
    );
    log.write(vec![crate::begin("s1", 0, None, "h")])
        .await
        .expect("writes");
    drop(log);
    let conn = rusqlite::Connection::open(&path).expect("opens");
    let fired: i64 = conn
        .query_row("SELECT count(*) FROM fired", [], |row| row.get(0))
        .expect("reads");
    assert_eq!(fired, 0, "the planted trigger ran inside the log's writer");
}

#[test]
fn a_new_log_appears_whole_with_its_journal_files_private() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("log.db");
    drop(open(&path).expect("creates"));
    assert!(verify(&path, None).expect("verifies").is_intact());
    for name in ["log.db", "log.db-wal", "log.db-shm", "log.db.audit-head"] {
        if let Ok(metadata) = fs::metadata(dir.path().join(name)) {
            assert_eq!(metadata.permissions().mode() & 0o077, 0, "{name}");
        }
    }
    // Nothing else: no temporary file of the creation is left.
    let mut names: Vec<String> = fs::read_dir(dir.path())
        .expect("lists")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| !name.ends_with("-wal") && !name.ends_with("-shm"))
        .collect();
    names.sort();
    assert_eq!(names, ["log.db", "log.db.audit-head"]);
}

#[tokio::test]
async fn a_log_through_a_dangling_link_is_created_private_beside_the_real_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    fs::create_dir(dir.path().join("real")).expect("folder");
    fs::create_dir(dir.path().join("links")).expect("folder");
    let link = dir.path().join("links/log.db");
    std::os::unix::fs::symlink("../real/log.db", &link).expect("links");
    // Created through the link, even with a permissive umask in force for others.
    let log = open(&link).expect("creates through the link");
    log.write(vec![
        crate::new_saga("s1"),
        crate::begin("s1", 0, None, "h"),
    ])
    .await
    .expect("writes");
    for name in ["log.db", "log.db-wal", "log.db-shm", "log.db.audit-head"] {
        let mode = fs::metadata(dir.path().join("real").join(name))
            .unwrap_or_else(|err| panic!("{name} beside the real file: {err}"))
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "{name} is readable by others: {mode:o}");
    }
    assert!(
        fs::symlink_metadata(&link)
            .expect("still there")
            .file_type()
            .is_symlink(),
        "the link was left a link"
    );
    let beside_link: Vec<String> = fs::read_dir(dir.path().join("links"))
        .expect("lists")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert_eq!(beside_link, ["log.db"], "nothing beside the link");
    assert_eq!(
        agent_kernel_txlog::audit_head_path(&link),
        dir.path().join("links/../real/log.db.audit-head")
    );
    drop(log);
    assert!(verify(&link, None).expect("verifies").is_intact());
}

/// Opens the log at `path` from `N_RACERS` threads at once; every one must succeed.
fn race_opens(path: &Path) {
    const N_RACERS: usize = 8;
    let barrier = std::sync::Barrier::new(N_RACERS);
    std::thread::scope(|scope| {
        for _ in 0..N_RACERS {
            scope.spawn(|| {
                barrier.wait();
                drop(open(path).expect("every racer opens the one log"));
            });
        }
    });
    assert!(verify(path, None).expect("verifies").is_intact());
    assert_eq!(
        fs::metadata(path).expect("exists").permissions().mode() & 0o077,
        0
    );
}

#[test]
fn racing_first_opens_all_succeed_on_one_log() {
    for _ in 0..20 {
        let dir = tempfile::tempdir().expect("temp dir");
        race_opens(&dir.path().join("log.db"));
    }
}

#[test]
fn an_empty_file_is_replaced_by_a_whole_log_and_racers_share_it() {
    for _ in 0..20 {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("log.db");
        fs::write(&path, b"").expect("an empty file, as mktemp makes");
        race_opens(&path);
    }
}

#[tokio::test]
async fn a_truncated_log_is_damaged_not_new() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("log.db");
    written_log(&path).await;
    // Checkpointed, so the file holds everything, then cut to less than its first page.
    plant(&path, "PRAGMA wal_checkpoint(TRUNCATE);");
    let bytes = fs::read(&path).expect("reads");
    fs::write(&path, &bytes[..3000]).expect("truncates");
    let error = open(&path).expect_err("refused");
    assert!(matches!(error, TxError::Storage(_)), "{error:?}");
    assert!(error.to_string().contains("damaged"), "{error}");
    assert_eq!(
        fs::read(&path).expect("reads"),
        &bytes[..3000],
        "left as it was"
    );
}

#[test]
fn a_missing_log_with_a_journal_left_behind_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("log.db");
    fs::write(dir.path().join("log.db-wal"), b"journal frames").expect("writes");
    let error = open(&path).expect_err("refused");
    assert!(error.to_string().contains("write-ahead journal"), "{error}");
    assert!(!path.exists(), "no log was created over the journal");
}

#[test]
fn a_log_in_a_missing_folder_says_so() {
    let dir = tempfile::tempdir().expect("temp dir");
    let error = open(&dir.path().join("nowhere/log.db")).expect_err("refused");
    assert!(error.to_string().contains("does not exist"), "{error}");
}

#[tokio::test]
async fn an_index_rebuilt_to_hide_rows_under_its_own_definition_is_found() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("log.db");
    written_log(&path).await;
    // The attacker's own connection may write the schema: the partial index of unfinished
    // sagas is rebuilt under a predicate that matches nothing, then given back its text.
    let original: String = {
        let conn = rusqlite::Connection::open(&path).expect("opens");
        conn.query_row(
            "SELECT sql FROM sqlite_schema WHERE name = 'sagas_unfinished'",
            [],
            |row| row.get(0),
        )
        .expect("reads")
    };
    let hiding = original.replace("WHERE state", "WHERE state = 'zzz' AND state");
    for (sql, reindex) in [(&hiding, true), (&original, false)] {
        let conn = rusqlite::Connection::open(&path).expect("opens");
        conn.execute_batch("PRAGMA writable_schema = ON;")
            .expect("writable");
        conn.execute(
            "UPDATE sqlite_schema SET sql = ?1 WHERE name = 'sagas_unfinished'",
            [sql],
        )
        .expect("rewrites the index definition");
        drop(conn);
        if reindex {
            let conn = rusqlite::Connection::open(&path).expect("opens");
            conn.execute_batch("REINDEX sagas_unfinished;")
                .expect("rebuilds the index empty");
        }
    }
    let report = verify(&path, None).expect("verifies");
    let bad = report.first_bad.expect("the emptied index is found");
    assert_eq!(bad.seq, 0, "{bad:?}");
    assert!(bad.reason.contains("integrity check"), "{}", bad.reason);
}

#[tokio::test]
async fn a_log_whose_mark_was_removed_is_tampered_not_foreign() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("log.db");
    written_log(&path).await;
    plant(&path, "PRAGMA application_id = 0;");
    let error = open(&path).expect_err("refused");
    assert!(matches!(error, TxError::Tampered { .. }), "{error:?}");
    assert!(error.to_string().contains("application_id"), "{error}");
    assert!(matches!(
        verify(&path, None).expect_err("refused"),
        TxError::Tampered { .. }
    ));
    // With its version zeroed instead, the structure gives it away.
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("log.db");
    written_log(&path).await;
    plant(&path, "PRAGMA user_version = 0;");
    check_refused(&path, "structure is that of version");
}

#[tokio::test]
async fn no_new_log_is_started_where_a_head_file_says_one_was() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("log.db");
    {
        // A saga that ends moves the head file past record 0.
        let log = open(&path).expect("creates");
        log.write(vec![
            crate::new_saga("s1"),
            agent_kernel_api::LogWrite::SetState {
                saga_id: agent_kernel_api::SagaId::new("s1"),
                state: agent_kernel_api::SagaState::FailedRolledBack,
            },
        ])
        .await
        .expect("writes");
    }
    for name in ["log.db", "log.db-wal", "log.db-shm"] {
        let _ = fs::remove_file(dir.path().join(name));
    }
    let head = agent_kernel_txlog::audit_head_path(&path);
    assert!(head.exists());
    for emptied in [false, true] {
        if emptied {
            fs::write(&path, b"").expect("an emptied log");
        }
        let error = open(&path).expect_err("refused");
        assert!(matches!(error, TxError::Tampered { .. }), "{error:?}");
        assert!(error.to_string().contains("head file"), "{error}");
    }
    fs::remove_file(&head).expect("the operator removes it");
    drop(open(&path).expect("a new log starts"));
}

#[tokio::test]
async fn a_journal_file_that_is_a_hard_link_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("log.db");
    written_log(&path).await;
    let victim = dir.path().join("victim.txt");
    fs::write(&victim, b"keep").expect("writes");
    let _ = fs::remove_file(dir.path().join("log.db-shm"));
    fs::hard_link(&victim, dir.path().join("log.db-shm")).expect("links");
    let error = open(&path).expect_err("refused");
    assert!(matches!(error, TxError::Tampered { .. }), "{error:?}");
    assert!(error.to_string().contains("journal file"), "{error}");
    assert_eq!(fs::read(&victim).expect("reads"), b"keep");
}

#[tokio::test]
async fn a_version_3_log_migrates_to_live_sagas_with_its_chain_intact() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("log.db");
    written_log(&path).await;
    agent_kernel_txlog::downgrade_in_place(&path, 3).expect("downgrades");
    assert_eq!(agent_kernel_txlog::schema_version(&path).expect("reads"), 3);
    assert!(verify(&path, None).expect("verifies").is_intact());
    let log = open(&path).expect("migrates");
    // A live saga: no plan, so no length.
    let agent_kernel_api::LogWrite::CreateSaga(mut live) = crate::new_saga("live") else {
        unreachable!("new_saga creates a saga")
    };
    live.n_steps = 0;
    live.state = agent_kernel_api::SagaState::Planning;
    log.write(vec![agent_kernel_api::LogWrite::CreateSaga(live.clone())])
        .await
        .expect("a live saga is created");
    // A dry run always has its plan's steps.
    live.saga_id = agent_kernel_api::SagaId::new("dry");
    live.dry_run = true;
    log.write(vec![agent_kernel_api::LogWrite::CreateSaga(live)])
        .await
        .expect_err("a dry run of no steps is refused");
    drop(log);
    assert_eq!(
        agent_kernel_txlog::schema_version(&path).expect("reads"),
        agent_kernel_txlog::SCHEMA_VERSION
    );
    assert!(verify(&path, None).expect("verifies").is_intact());
    assert_eq!(
        open(&path)
            .expect("reopens")
            .saga(&agent_kernel_api::SagaId::new("live"))
            .await
            .expect("reads")
            .expect("exists")
            .saga
            .n_steps,
        0
    );
}

/// A log of schema version 7 (a begun step's resources in `step_keys`) migrates when
/// opened: each step's resources move into its row, sorted, `step_keys` keeps the
/// duplicate keys, an undo claims the resources from the rows, and the chain still
/// verifies (it binds each step's resources).
#[tokio::test]
async fn a_version_7_log_moves_its_steps_resources_into_their_rows() {
    use agent_kernel_api::{LogWrite, SagaId};
    use agent_kernel_log_contract::records::done_saga_declaring;

    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("log.db");
    let log = open(&path).expect("creates");
    log.write(done_saga_declaring("a")).await.expect("writes");
    log.close().await;
    agent_kernel_txlog::downgrade_in_place(&path, 7).expect("downgrades");
    assert_eq!(agent_kernel_txlog::schema_version(&path).expect("reads"), 7);
    assert!(verify(&path, None).expect("verifies").is_intact());
    let rows = |sql: &str| -> Vec<(i64, String)> {
        let conn = rusqlite::Connection::open(&path).expect("opens");
        let mut statement = conn.prepare(sql).expect("prepares");
        statement
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
            .expect("queries")
            .collect::<Result<_, _>>()
            .expect("reads")
    };
    assert_eq!(
        rows("SELECT step_seq, key FROM step_keys WHERE kind = 'resource' ORDER BY step_seq, key")
            .len(),
        3,
        "version 7 kept them as rows"
    );
    let log = open(&path).expect("migrates");
    log.write(vec![LogWrite::ClaimLocks {
        saga_id: SagaId::new("a"),
    }])
    .await
    .expect("claims");
    let saga = log
        .saga(&SagaId::new("a"))
        .await
        .expect("reads")
        .expect("exists");
    assert_eq!(saga.locks, ["acct:1", "file:/w/x"]);
    log.close().await;
    assert_eq!(
        agent_kernel_txlog::schema_version(&path).expect("reads"),
        agent_kernel_txlog::SCHEMA_VERSION
    );
    assert_eq!(
        rows("SELECT step_seq, resources FROM saga_steps ORDER BY step_seq"),
        [
            (0, r#"["acct:1","file:/w/x"]"#.to_owned()),
            (1, r#"["file:/w/x"]"#.to_owned())
        ]
    );
    assert_eq!(
        rows("SELECT step_seq, kind || ' ' || key FROM step_keys"),
        [(0, "duplicate invoice:7".to_owned())]
    );
    assert!(verify(&path, None).expect("verifies").is_intact());
}

/// A log of schema version 8 gains the view of the locks held when it is first opened by
/// this build (version 9): the view lists what its unsettled sagas' begun steps hold and
/// what an undo claimed again, and the chain still verifies.
#[tokio::test]
async fn a_version_8_log_gains_the_view_of_the_locks_held() {
    use agent_kernel_api::{LogWrite, SagaId, SagaState};
    use agent_kernel_log_contract::records::{begin_on, commit, new_saga, set_state};

    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("log.db");
    let log = open(&path).expect("creates");
    log.write(vec![
        new_saga("a"),
        begin_on("a", 0, &["file:/w/x", "acct:1"], &[]),
        new_saga("c"),
        begin_on("c", 0, &["file:/w/z"], &[]),
        commit("c", 0),
        set_state("c", SagaState::Done),
    ])
    .await
    .expect("writes");
    // An undo of `c` under way: its resource claimed again, as a row of `locks`.
    log.write(vec![LogWrite::ClaimLocks {
        saga_id: SagaId::new("c"),
    }])
    .await
    .expect("claims");
    log.close().await;
    agent_kernel_txlog::downgrade_in_place(&path, 8).expect("downgrades");
    assert_eq!(agent_kernel_txlog::schema_version(&path).expect("reads"), 8);
    assert!(verify(&path, None).expect("verifies").is_intact());
    let held = || -> rusqlite::Result<Vec<(String, String)>> {
        let conn = rusqlite::Connection::open(&path)?;
        let mut statement =
            conn.prepare("SELECT resource, saga_id FROM held_locks ORDER BY resource")?;
        statement
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?
            .collect()
    };
    assert!(held().is_err(), "version 8 has no such view");
    let log = open(&path).expect("migrates");
    log.close().await;
    assert_eq!(
        agent_kernel_txlog::schema_version(&path).expect("reads"),
        agent_kernel_txlog::SCHEMA_VERSION
    );
    let pair = |resource: &str, saga: &str| (resource.to_owned(), saga.to_owned());
    assert_eq!(
        held().expect("the view is there"),
        [
            pair("acct:1", "a"),
            pair("file:/w/x", "a"),
            pair("file:/w/z", "c")
        ]
    );
    assert!(verify(&path, None).expect("verifies").is_intact());
}

/// A step row whose resources were edited no longer matches the chain, which binds them.
#[tokio::test]
async fn a_steps_resources_edited_in_its_row_fail_verification() {
    use agent_kernel_log_contract::records::{begin_on, new_saga};

    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("log.db");
    let log = open(&path).expect("creates");
    log.write(vec![new_saga("a"), begin_on("a", 0, &["file:/w/x"], &[])])
        .await
        .expect("writes");
    log.close().await;
    assert!(verify(&path, None).expect("verifies").is_intact());
    plant(
        &path,
        r#"UPDATE saga_steps SET resources = '["file:/w/other"]' WHERE saga_id = 'a'"#,
    );
    let report = verify(&path, None).expect("verifies");
    let bad = report.first_bad.expect("the edit is found");
    assert!(bad.reason.contains("resources"), "{}", bad.reason);
}
