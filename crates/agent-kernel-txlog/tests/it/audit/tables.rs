//! What is not a log, downgrades, and tables changed beside the chain (rows forged,
//! deleted or pruned by hand), detected by `verify`.

#[allow(clippy::wildcard_imports)]
use super::*;

#[test]
fn verify_refuses_what_is_not_a_log() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("missing.db");
    let error = verify(&missing, None).expect_err("refused");
    assert!(error.to_string().contains("no log"), "{error}");
    assert!(!missing.exists(), "verify creates nothing");
    let text = dir.path().join("notes.db");
    fs::write(&text, "my notes").expect("writes");
    assert!(matches!(verify(&text, None), Err(TxError::NotALog { .. })));
    let other = dir.path().join("other.db");
    Connection::open(&other)
        .expect("opens")
        .execute_batch("CREATE TABLE t (x)")
        .expect("creates");
    assert!(matches!(verify(&other, None), Err(TxError::NotALog { .. })));
}

#[tokio::test]
async fn a_version_2_log_migrates_to_dry_runs_with_its_chain_intact() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("v2.db");
    {
        let log = open_log(&path, None, Durability::Normal);
        let mut rng = Rng(11);
        for saga in ["a", "b"] {
            let mut first = step(&mut rng, saga, 0, None);
            // Version 2 knew no resources.
            first.resources.clear();
            write(&log, vec![create(saga, 1), LogWrite::BeginStep(first)]).await;
            write(
                &log,
                vec![commit(&mut rng, saga, 0), set_state(saga, SagaState::Done)],
            )
            .await;
        }
    }
    // As version 2 left it: no `dry_run` column.
    downgrade_in_place(&path, 2).expect("downgrades");
    let report = assert_intact(&path, None);
    assert_eq!(report.n_records, 8);

    let log = open_log(&path, None, Durability::Normal);
    let version: i64 = Connection::open(&path)
        .expect("opens")
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .expect("reads");
    assert_eq!(version, agent_kernel_txlog::SCHEMA_VERSION);
    assert_intact(&path, None);
    let mut rng = Rng(12);
    let batch = dry_run(&mut rng, "dry", 3);
    write(&log, batch).await;
    let record = log
        .saga(&SagaId::new("dry"))
        .await
        .expect("reads")
        .expect("recorded");
    assert!(record.saga.dry_run);
    assert!(
        !log.saga(&SagaId::new("a"))
            .await
            .expect("reads")
            .expect("there")
            .saga
            .dry_run
    );
    let report = assert_intact(&path, None);
    assert!(report.n_records > 8);
}

#[tokio::test]
async fn dry_runs_hold_only_simulated_steps_and_claim_no_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("dry.db");
    let log = open_log(&path, None, Durability::Normal);
    let mut rng = Rng(21);

    // A simulated step in a saga that is not a dry run is refused, and nothing is written.
    let simulated = step(&mut rng, "live", 0, None);
    let error = log
        .write(vec![
            create("live", 1),
            LogWrite::SimulateStep {
                step: simulated,
                result: Ok(ToolOutput::new(json!({}))),
            },
        ])
        .await
        .expect_err("refused");
    assert!(error.to_string().contains("not a dry run"), "{error}");
    assert!(
        log.saga(&SagaId::new("live"))
            .await
            .expect("reads")
            .is_none()
    );

    // A begun step in a dry run is refused too.
    let mut batch = dry_run(&mut rng, "dry", 1);
    batch.truncate(1);
    batch.push(LogWrite::BeginStep(step(&mut rng, "dry", 0, None)));
    let error = log.write(batch).await.expect_err("refused");
    assert!(error.to_string().contains("is a dry run"), "{error}");

    // A dry run's keyed step leaves the key free.
    let mut keyed = step(&mut rng, "dry2", 0, Some("order-1".into()));
    keyed.args_hash = "h".repeat(64);
    write(
        &log,
        vec![
            LogWrite::CreateSaga(NewSaga {
                saga_id: SagaId::new("dry2"),
                name: None,
                actor: None,
                owner: owner(1),
                n_steps: 1,
                state: SagaState::Acting,
                dry_run: true,
                require_actor_idle: false,
            }),
            LogWrite::SimulateStep {
                step: keyed,
                result: Ok(ToolOutput::new(json!({"dry_run": true}))),
            },
            set_state("dry2", SagaState::Done),
        ],
    )
    .await;
    assert!(log.key_binding("order-1").await.expect("reads").is_none());
    let sagas = log.sagas(10).await.expect("lists");
    assert!(
        sagas
            .iter()
            .any(|saga| saga.saga_id.as_str() == "dry2" && saga.dry_run)
    );
    let report = assert_intact(&path, None);
    assert_eq!(report.n_records, 3);

    // Marking the dry run as a live saga in the table (so that recovery would compensate its
    // simulated steps) is detected at the record that last changed the row.
    let conn = Connection::open(&path).expect("opens");
    conn.execute("UPDATE sagas SET dry_run = 0 WHERE saga_id = 'dry2'", [])
        .expect("edits");
    let (bad, reason) = first_bad(&path, None);
    assert_eq!(bad, 3, "{reason}");
    assert!(reason.contains("dry_run"), "{reason}");
}

#[tokio::test]
async fn operator_commands_and_denied_plans_are_chained_and_move_the_head() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("events.db");
    let log = open_log(&path, Some(key()), Durability::Normal);
    let mut rng = Rng(31);
    for n in 0..6 {
        let event = audit_event(&mut rng, n);
        write(&log, vec![event]).await;
        // Each event is covered by the head file at once.
        let report = assert_intact(&path, Some(&key()));
        assert_eq!(report.head_file.expect("written").seq, n + 1);
    }
    let conn = Connection::open(&path).expect("opens");
    let kinds: Vec<String> = conn
        .prepare("SELECT kind FROM audit_log ORDER BY seq")
        .expect("prepares")
        .query_map([], |row| row.get(0))
        .expect("queries")
        .collect::<Result<_, _>>()
        .expect("reads");
    assert!(
        kinds
            .iter()
            .all(|kind| kind == "Operator" || kind == "PlanDenied"),
        "{kinds:?}"
    );
    let denied: Option<String> = conn
        .query_row(
            "SELECT body FROM audit_log WHERE kind = 'PlanDenied' LIMIT 1",
            [],
            |row| row.get(0),
        )
        .ok();
    if let Some(body) = denied {
        let body: Value = serde_json::from_str(&body).expect("json");
        assert_eq!(body["n_denials"], 2);
        assert_eq!(body["denials"][0]["tool"], "fs.write");
        assert!(
            body["denials"][0]["args_summary"]
                .as_str()
                .expect("quoted")
                .contains("/etc/passwd")
        );
        assert!(
            body["denials"][0]["reason"]
                .as_str()
                .expect("quoted")
                .contains("outside every allowed root")
        );
    }

    // Deleting the newest event is detected by the head file.
    conn.execute(
        "DELETE FROM audit_log WHERE seq = (SELECT max(seq) FROM audit_log)",
        [],
    )
    .expect("deletes");
    let (bad, reason) = first_bad(&path, Some(&key()));
    assert_eq!(bad, 6, "{reason}");
}

/// Prunes every saga the log calls prunable at `before_ms`, page by page; their count.
async fn prune_all(log: &SqliteLog, before_ms: i64) -> u64 {
    let mut n_pruned = 0;
    loop {
        let page = log
            .prune_candidates(before_ms, None, 50)
            .await
            .expect("lists");
        if page.is_empty() {
            return n_pruned;
        }
        for record in &page {
            assert!(record.saga.state.is_terminal(), "{:?}", record.saga);
            assert!(record.saga.updated_at_ms < before_ms);
        }
        let saga_ids = page
            .iter()
            .map(|record| record.saga.saga_id.clone())
            .collect();
        let outcomes = write(
            log,
            vec![LogWrite::Prune(agent_kernel_api::PruneSagas {
                saga_ids,
                before_ms,
            })],
        )
        .await;
        match outcomes.as_slice() {
            [WriteOutcome::Pruned { n_sagas, .. }] => {
                assert_eq!(*n_sagas, page.len() as u64);
                n_pruned += n_sagas;
            }
            other => panic!("a prune answered {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_pruned_log_verifies_keeps_its_open_sagas_and_goes_on() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("log.db");
    build_log(&path, 7, 40, Some(key())).await;
    let conn = Connection::open(&path).expect("opens");
    let unfinished: Vec<String> = conn
        .prepare(
            "SELECT saga_id FROM sagas WHERE state NOT IN ('Done', 'FailedRolledBack', 'Undone')
                 ORDER BY saga_id",
        )
        .expect("prepares")
        .query_map([], |row| row.get(0))
        .expect("reads")
        .collect::<Result<_, _>>()
        .expect("reads");
    // Open sagas, and those an operator must still see to (`FailedRollbackPartial`).
    assert!(!unfinished.is_empty(), "the seed leaves some saga open");
    let log = open_log(&path, Some(key()), Durability::Full);
    let n_pruned = prune_all(&log, i64::MAX).await;
    assert!(n_pruned > 20, "{n_pruned}");
    drop(log);
    assert_intact(&path, Some(&key()));
    // Only those are left, with their steps; no row of a pruned saga survives.
    let left: Vec<String> = conn
        .prepare("SELECT saga_id FROM sagas ORDER BY saga_id")
        .expect("prepares")
        .query_map([], |row| row.get(0))
        .expect("reads")
        .collect::<Result<_, _>>()
        .expect("reads");
    assert_eq!(left, unfinished);
    for table in ["saga_steps", "idempotency_keys"] {
        let orphans: i64 = conn
            .query_row(
                &format!(
                    "SELECT count(*) FROM {table} WHERE saga_id NOT IN (SELECT saga_id FROM sagas)"
                ),
                [],
                |row| row.get(0),
            )
            .expect("counts");
        assert_eq!(orphans, 0, "{table}");
    }
    // The chain keeps every record and one checkpoint per page.
    let checkpoints: i64 = conn
        .query_row(
            "SELECT count(*) FROM audit_log WHERE kind = 'Prune'",
            [],
            |row| row.get(0),
        )
        .expect("counts");
    assert!(checkpoints >= 1);
    // Writing goes on, and a second prune of the new sagas verifies too.
    build_log(&path, 8, 10, Some(key())).await;
    let log = open_log(&path, Some(key()), Durability::Full);
    assert!(prune_all(&log, i64::MAX).await > 0);
    // Nothing left to prune: a prune naming an open saga removes nothing, records nothing.
    let before = last_seq(&conn);
    let outcomes = write(
        &log,
        vec![LogWrite::Prune(agent_kernel_api::PruneSagas {
            saga_ids: vec![SagaId::new(&unfinished[0])],
            before_ms: i64::MAX,
        })],
    )
    .await;
    assert_eq!(
        outcomes,
        [WriteOutcome::Pruned {
            n_sagas: 0,
            n_steps: 0
        }]
    );
    assert_eq!(last_seq(&conn), before);
    drop(log);
    assert_intact(&path, Some(&key()));
}

/// Appends a record to the chain as someone without the key would, hashes and all.
fn forge_record(conn: &Connection, kind: &str, body: &str) -> i64 {
    let (seq, prev, at_ms): (i64, String, i64) = conn
        .query_row(
            "SELECT seq, hash, at_ms FROM audit_log ORDER BY seq DESC LIMIT 1",
            [],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
        )
        .expect("reads the head");
    let (seq, at_ms) = (seq + 1, at_ms + 1);
    let hash = record_hash(&prev, seq, at_ms, kind, "", body);
    conn.execute(
        "INSERT INTO audit_log (seq, at_ms, kind, saga_id, body, prev_hash, hash, mac)
         VALUES (?1, ?2, ?3, NULL, ?4, ?5, ?6, NULL)",
        params![seq, at_ms, kind, body, prev, hash],
    )
    .expect("forges");
    seq
}

/// Deletes a saga's rows from the tables, as someone holding the file would.
fn delete_saga_rows(conn: &Connection, saga_id: &str) {
    for table in ["idempotency_keys", "saga_steps", "sagas"] {
        conn.execute(
            &format!("DELETE FROM {table} WHERE saga_id = ?1"),
            params![saga_id],
        )
        .expect("deletes");
    }
}

/// Appends a `Prune` checkpoint naming `saga_id` with `n_steps` and a hash of zeros, as a
/// forger without the records would; its sequence number.
fn forge_prune(conn: &Connection, saga_id: &str, n_steps: i64) -> i64 {
    let body = format!(
        r#"{{"before_ms":9000000000000,"n_steps":{n_steps},"records_sha256":"{}","saga_ids":["{saga_id}"]}}"#,
        "0".repeat(64)
    );
    forge_record(conn, "Prune", &body)
}

#[tokio::test]
async fn a_forged_prune_checkpoint_is_detected() {
    let fixture = Fixture::new(None).await;
    // It hides an unfinished saga: the rows go, a checkpoint claims them pruned.
    let (path, conn) = fixture.copy("open-pruned.db");
    let open: String = conn
        .query_row(
            "SELECT saga_id FROM sagas WHERE state = 'Acting' LIMIT 1",
            [],
            |row| row.get(0),
        )
        .expect("an unfinished saga");
    delete_saga_rows(&conn, &open);
    let seq = forge_prune(&conn, &open, 0);
    let (bad, reason) = first_bad(&path, None);
    assert_eq!(bad, seq as u64, "{reason}");
    assert!(reason.contains("not finished"), "{reason}");

    // A finished saga, but the checkpoint's hash is not that of its records.
    let (path, conn) = fixture.copy("wrong-hash.db");
    let (done, n_steps): (String, i64) = conn
        .query_row(
            "SELECT saga_id, (SELECT count(*) FROM saga_steps t WHERE t.saga_id = s.saga_id)
             FROM sagas s WHERE state = 'Done' LIMIT 1",
            [],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .expect("a finished saga");
    delete_saga_rows(&conn, &done);
    let seq = forge_prune(&conn, &done, n_steps);
    let (bad, reason) = first_bad(&path, None);
    assert_eq!(bad, seq as u64, "{reason}");
    assert!(reason.contains("records_sha256"), "{reason}");

    // Rows removed with no checkpoint at all: the chain still names them.
    let (path, conn) = fixture.copy("silently-pruned.db");
    delete_saga_rows(&conn, &done);
    let report = verify(&path, None).expect("verifies");
    assert!(!report.is_intact(), "{report:#?}");
}

#[tokio::test]
async fn a_saga_id_created_again_after_a_prune_is_pruned_again_and_verifies() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("log.db");
    let log = open_log(&path, Some(key()), Durability::Normal);
    let mut rng = Rng(11);
    for round in 0..3 {
        // The same id each round, as a business-keyed id source would give.
        write(
            &log,
            vec![
                create("order-42", 1),
                LogWrite::BeginStep(step(&mut rng, "order-42", 0, None)),
            ],
        )
        .await;
        write(
            &log,
            vec![
                commit(&mut rng, "order-42", 0),
                set_state("order-42", SagaState::Done),
            ],
        )
        .await;
        assert_eq!(prune_all(&log, i64::MAX).await, 1, "round {round}");
    }
    drop(log);
    assert_intact(&path, Some(&key()));
}

#[tokio::test]
async fn a_saga_whose_compensation_failed_is_never_pruned() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("log.db");
    let log = open_log(&path, Some(key()), Durability::Normal);
    let mut rng = Rng(12);
    // As a log migrated from version 4 holds it: FailedRollbackPartial with no dead letter.
    write(
        &log,
        vec![
            create("partial", 1),
            LogWrite::BeginStep(step(&mut rng, "partial", 0, None)),
        ],
    )
    .await;
    write(
        &log,
        vec![
            compensation("partial", 0, false),
            set_state("partial", SagaState::FailedRollbackPartial),
        ],
    )
    .await;
    assert!(
        log.prune_candidates(i64::MAX, None, 10)
            .await
            .expect("lists")
            .is_empty()
    );
    let outcomes = write(
        &log,
        vec![LogWrite::Prune(agent_kernel_api::PruneSagas {
            saga_ids: vec![SagaId::new("partial")],
            before_ms: i64::MAX,
        })],
    )
    .await;
    assert_eq!(
        outcomes,
        [WriteOutcome::Pruned {
            n_sagas: 0,
            n_steps: 0
        }]
    );
    assert!(
        log.saga(&SagaId::new("partial"))
            .await
            .expect("reads")
            .is_some()
    );
    drop(log);
    assert_intact(&path, Some(&key()));
}
