//! Records duplicated, dropped, reordered or edited, detected by `verify`.

#[allow(clippy::wildcard_imports)]
use super::*;

#[tokio::test]
async fn duplicating_a_record_is_detected() {
    let fixture = Fixture::new(None).await;
    // Appended at the end.
    let (path, conn) = fixture.copy("dup-end.db");
    let last = last_seq(&conn);
    conn.execute(
        "INSERT INTO audit_log (seq, at_ms, kind, saga_id, body, prev_hash, hash, mac)
         SELECT ?1, at_ms, kind, saga_id, body, prev_hash, hash, mac FROM audit_log WHERE seq = 3",
        params![last + 1],
    )
    .expect("duplicates");
    let (bad, reason) = first_bad(&path, None);
    assert_eq!(bad, last as u64 + 1, "{reason}");

    // Inserted in the middle, the records after it renumbered.
    let (path, conn) = fixture.copy("dup-middle.db");
    conn.execute_batch(
        "UPDATE audit_log SET seq = -(seq + 1) WHERE seq > 6;
         UPDATE audit_log SET seq = -seq WHERE seq < 0;
         INSERT INTO audit_log (seq, at_ms, kind, saga_id, body, prev_hash, hash, mac)
             SELECT 7, at_ms, kind, saga_id, body, prev_hash, hash, mac FROM audit_log WHERE seq = 6;",
    )
    .expect("duplicates");
    let (bad, reason) = first_bad(&path, None);
    assert_eq!(bad, 7, "{reason}");
}

#[tokio::test]
async fn deleting_the_newest_records_is_detected_by_the_head_file() {
    let fixture = Fixture::new(None).await;
    let (path, conn) = fixture.copy("truncated.db");
    let last = last_seq(&conn);
    conn.execute("DELETE FROM audit_log WHERE seq > ?1", params![last - 3])
        .expect("deletes");
    let (bad, reason) = first_bad(&path, None);
    assert_eq!(bad, last as u64, "{reason}");
    assert!(reason.contains("deleted at the end"), "{reason}");

    // Without its head file, the log cannot vouch for its newest records either.
    let (path, _conn) = fixture.copy("headless.db");
    fs::remove_file(audit_head_path(&path)).expect("removes");
    let (bad, reason) = first_bad(&path, None);
    assert_eq!(bad, last as u64, "{reason}");
    assert!(reason.contains("missing"), "{reason}");

    // A garbled head file is no head file.
    let (path, _conn) = fixture.copy("garbled.db");
    fs::write(audit_head_path(&path), "{\"seq\": \"ten\"}").expect("writes");
    let (_, reason) = first_bad(&path, None);
    assert!(reason.contains("not a head file"), "{reason}");
}

#[tokio::test]
async fn an_older_copy_of_the_database_is_detected_by_the_newer_head_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("log.db");
    let older = dir.path().join("older.db");
    let mut rng = Rng(11);
    {
        let log = open_log(&path, None, Durability::Full);
        for n in 0..3 {
            write_saga(&log, &mut rng, &format!("early{n}"), false).await;
        }
        copy_log(&path, &older);
        for n in 0..3 {
            write_saga(&log, &mut rng, &format!("late{n}"), false).await;
        }
    }
    let report = assert_intact(&path, None);
    let newest = report.head.expect("a head").seq;
    // The older database put in place, its newer head file kept.
    let swapped_dir = tempfile::tempdir().expect("temp dir");
    let swapped = swapped_dir.path().join("log.db");
    fs::copy(&older, &swapped).expect("copies");
    fs::copy(audit_head_path(&path), audit_head_path(&swapped)).expect("copies");
    let (bad, reason) = first_bad(&swapped, None);
    assert_eq!(bad, newest, "{reason}");
    assert!(reason.contains("older copy"), "{reason}");

    // Today's limit, stated: an older copy *with its own* head file verifies. The head
    // file must be protected like the database.
    assert_intact(&older, None);

    // Life goes on in the swapped log: the writer does not move a head file the chain
    // contradicts, so the evidence stays until an operator looks.
    let head_before = fs::read(audit_head_path(&swapped)).expect("reads");
    {
        let log = open_log(&swapped, None, Durability::Full);
        for n in 0..4 {
            write_saga(&log, &mut rng, &format!("after{n}"), false).await;
        }
    }
    assert_eq!(
        fs::read(audit_head_path(&swapped)).expect("reads"),
        head_before,
        "the head file was left as it was"
    );
    let (_, reason) = first_bad(&swapped, None);
    assert!(reason.contains("head file"), "{reason}");
}

#[tokio::test]
async fn a_lost_head_file_is_not_recreated_until_the_operator_seals_the_log() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("log.db");
    let mut rng = Rng(13);
    {
        let log = open_log(&path, Some(key()), Durability::Full);
        for n in 0..3 {
            write_saga(&log, &mut rng, &format!("before{n}"), false).await;
        }
    }
    fs::remove_file(audit_head_path(&path)).expect("removes the head file");
    // Neither opening the log nor writing to it recreates the head file: its absence is
    // what `verify` reports.
    let log = open_log(&path, Some(key()), Durability::Full);
    for n in 0..2 {
        write_saga(&log, &mut rng, &format!("during{n}"), false).await;
    }
    assert!(!audit_head_path(&path).exists());
    let (_, reason) = first_bad(&path, Some(&key()));
    assert!(reason.contains("missing"), "{reason}");
    // The chain and tables alone are consistent.
    let report = verify_ignoring_head_file(&path, Some(&key())).expect("verifies");
    assert!(report.is_intact(), "{report:#?}");

    // The operator seals: a record of it, and a head file naming it.
    let head = log
        .seal(AuditEvent::Operator(OperatorCommand {
            command: "audit seal".into(),
            saga_id: None,
            options: Vec::new(),
            by: owner(4),
            uid: Some(0),
        }))
        .await
        .expect("seals");
    let report = assert_intact(&path, Some(&key()));
    assert_eq!(report.head.as_ref(), Some(&head));
    assert_eq!(report.head_file.as_ref(), Some(&head));
    // And the writer moves it forward again.
    write_saga(&log, &mut rng, "after", false).await;
    let report = assert_intact(&path, Some(&key()));
    assert!(report.head_file.expect("a head file").seq > head.seq);
}

#[tokio::test]
async fn with_a_key_a_consistent_rewrite_of_the_whole_chain_is_detected() {
    let key = key();
    let fixture = Fixture::new(Some(key.clone())).await;
    assert_intact(&fixture.original, Some(&key));
    let (path, conn) = fixture.copy("rewritten.db");
    // The attacker turns a failed saga into a finished one everywhere: the tables, the
    // record bodies, every hash from there on, and the head file. Only the MACs cannot
    // be recomputed without the key.
    let (saga_id, seq): (String, i64) = conn
        .query_row(
            "SELECT saga_id, seq FROM audit_log WHERE kind = 'SetState'
                 AND json_extract(body, '$.state') LIKE 'Failed%' ORDER BY seq LIMIT 1",
            [],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .expect("a failed saga");
    conn.execute(
        "UPDATE audit_log SET body = json_set(body, '$.state', 'Done') WHERE seq = ?1",
        params![seq],
    )
    .expect("edits the record");
    conn.execute(
        "UPDATE sagas SET state = 'Done' WHERE saga_id = ?1",
        params![saga_id],
    )
    .expect("edits the table");
    let rows: Vec<(i64, i64, String, Option<String>, String)> = conn
        .prepare(
            "SELECT seq, at_ms, kind, saga_id, body FROM audit_log WHERE seq >= ?1 ORDER BY seq",
        )
        .expect("prepares")
        .query_map(params![seq], |row| {
            Ok((
                row.get(0)?,
                row.get(1)?,
                row.get(2)?,
                row.get(3)?,
                row.get(4)?,
            ))
        })
        .expect("reads")
        .collect::<Result<_, _>>()
        .expect("reads");
    let mut prev: String = conn
        .query_row(
            "SELECT hash FROM audit_log WHERE seq = ?1",
            params![seq - 1],
            |row| row.get(0),
        )
        .expect("reads");
    for (row_seq, at_ms, kind, saga, body) in rows {
        let hash = record_hash(
            &prev,
            row_seq,
            at_ms,
            &kind,
            saga.as_deref().unwrap_or(""),
            &body,
        );
        conn.execute(
            "UPDATE audit_log SET prev_hash = ?2, hash = ?3 WHERE seq = ?1",
            params![row_seq, prev, hash],
        )
        .expect("rehashes");
        prev = hash;
    }
    // Written back in the one-line form, which readers still accept.
    let mut head = head_in_file(&path);
    head["hash"] = Value::String(prev);
    fs::write(audit_head_path(&path), head.to_string()).expect("writes");

    // Without the key, the rewrite cannot be told from the real history: the reason to
    // configure one.
    assert_intact(&path, None);
    let (bad, reason) = first_bad(&path, Some(&key));
    assert_eq!(bad, seq as u64, "{reason}");
    assert!(reason.contains("MAC"), "{reason}");

    // Removing the MACs does not help.
    conn.execute("UPDATE audit_log SET mac = NULL", [])
        .expect("strips");
    let (bad, reason) = first_bad(&path, Some(&key));
    assert_eq!(bad, 1, "{reason}");
    assert!(reason.contains("no MAC"), "{reason}");
}

#[tokio::test]
async fn a_wrong_key_fails_at_the_first_record() {
    let fixture = Fixture::new(Some(key())).await;
    let other = AuditKey::from_hex(&"a5".repeat(32)).expect("a key");
    let (bad, reason) = first_bad(&fixture.original, Some(&other));
    assert_eq!(bad, 1, "{reason}");
    assert!(reason.contains("key is wrong"), "{reason}");
    // A log written without a key cannot be verified with one.
    let unkeyed = Fixture::new(None).await;
    let (bad, reason) = first_bad(&unkeyed.original, Some(&other));
    assert_eq!(bad, 1, "{reason}");
}

#[tokio::test]
async fn verify_changes_nothing_in_the_database() {
    let fixture = Fixture::new(None).await;
    let (path, conn) = fixture.copy("readonly.db");
    drop(conn);
    let before = fs::read(&path).expect("reads");
    let head_before = fs::read(audit_head_path(&path)).expect("reads");
    assert_intact(&path, None);
    assert_eq!(fs::read(&path).expect("reads"), before);
    assert_eq!(
        fs::read(audit_head_path(&path)).expect("reads"),
        head_before
    );
    let journal_mode: String = Connection::open(&path)
        .expect("opens")
        .query_row("PRAGMA journal_mode", [], |row| row.get(0))
        .expect("reads");
    assert_eq!(
        journal_mode, "delete",
        "the journal mode of the copy is left alone"
    );
}

#[tokio::test]
async fn a_version_1_log_starts_its_chain_with_a_genesis_record() {
    let fixture = Fixture::new(None).await;
    // A log as version 1 left it: no audit_log, no head file.
    let (path, conn) = fixture.copy("v1.db");
    drop(conn);
    downgrade_in_place(&path, 1).expect("downgrades");
    let conn = Connection::open(&path).expect("opens");
    fs::remove_file(audit_head_path(&path)).expect("removes");
    let error = verify(&path, None).expect_err("no chain to verify");
    assert!(matches!(error, TxError::Storage(_)), "{error:?}");
    assert!(error.to_string().contains("no audit chain"), "{error}");

    // A version 1 log whose chain was removed but whose head file remains: tampering.
    let (stripped, stripped_conn) = fixture.copy("stripped.db");
    drop(stripped_conn);
    downgrade_in_place(&stripped, 1).expect("downgrades");
    let (_, reason) = first_bad(&stripped, None);
    assert!(reason.contains("chain was removed"), "{reason}");

    let n_sagas: i64 = conn
        .query_row("SELECT count(*) FROM sagas", [], |row| row.get(0))
        .expect("counts");
    let unfinished: String = conn
        .query_row(
            "SELECT saga_id FROM sagas WHERE state = 'Acting' ORDER BY saga_id LIMIT 1",
            [],
            |row| row.get(0),
        )
        .unwrap_or_else(|_| "none".to_owned());
    drop(conn);
    {
        let log = open_log(&path, Some(key()), Durability::Full);
        let report = assert_intact(&path, Some(&key()));
        assert_eq!(report.n_records, 1, "one genesis record");
        assert_eq!(report.head_file.expect("written at open").seq, 1);
        // Life goes on: new sagas, and the old unfinished ones recovered.
        let mut rng = Rng(5);
        write_saga(&log, &mut rng, "after", false).await;
        if unfinished != "none" {
            let saga_id = SagaId::new(&unfinished);
            log.take_over(&saga_id, &owner(1), SagaState::Acting, &owner(9))
                .await
                .expect("takes over");
            write(
                &log,
                vec![set_state(&unfinished, SagaState::FailedRolledBack)],
            )
            .await;
        }
    }
    assert_intact(&path, Some(&key()));
    let conn = Connection::open(&path).expect("opens");
    let genesis: Value = serde_json::from_str(
        &conn
            .query_row("SELECT body FROM audit_log WHERE seq = 1", [], |row| {
                row.get::<_, String>(0)
            })
            .expect("reads"),
    )
    .expect("JSON");
    assert_eq!(
        genesis["sagas"].as_object().expect("sagas").len() as i64,
        n_sagas
    );
    assert!(
        genesis["note"]
            .as_str()
            .expect("note")
            .contains("not covered")
    );

    // A step older than the chain, edited afterwards, is caught at the genesis record.
    let n_edited = conn
        .execute(
            "UPDATE saga_steps SET status = 'BEGIN'
             WHERE (saga_id, step_seq) = (SELECT saga_id, step_seq FROM saga_steps
                 WHERE saga_id <> 'after' AND status <> 'BEGIN' ORDER BY saga_id LIMIT 1)",
            [],
        )
        .expect("edits");
    assert_eq!(n_edited, 1);
    let (bad, reason) = first_bad(&path, Some(&key()));
    assert_eq!(bad, 1, "{reason}");
}

#[tokio::test]
async fn a_saga_older_than_the_chain_marked_as_a_dry_run_is_detected() {
    let fixture = Fixture::new(None).await;
    let (path, conn) = fixture.copy("v1.db");
    drop(conn);
    downgrade_in_place(&path, 1).expect("downgrades");
    let conn = Connection::open(&path).expect("opens");
    fs::remove_file(audit_head_path(&path)).expect("removes");
    drop(conn);
    drop(open_log(&path, None, Durability::Full));
    assert_intact(&path, None);
    // A dry run's steps are never compensated: marking an old saga as one would spare its
    // effects from recovery. No log before version 3 holds a dry run.
    let conn = Connection::open(&path).expect("opens");
    conn.execute(
        "UPDATE sagas SET dry_run = 1 WHERE saga_id = (SELECT min(saga_id) FROM sagas)",
        [],
    )
    .expect("edits");
    let (bad, reason) = first_bad(&path, None);
    assert_eq!(bad, 1, "{reason}");
    assert!(reason.contains("dry_run"), "{reason}");
}

#[tokio::test]
async fn hostile_rows_are_reported_without_panicking() {
    let fixture = Fixture::new(None).await;
    let edits = [
        "UPDATE audit_log SET body = 'not json' WHERE seq = 4",
        "UPDATE audit_log SET body = '[1,2]' WHERE seq = 4",
        "UPDATE audit_log SET kind = 'Nonsense' WHERE seq = 4",
        "UPDATE audit_log SET hash = 'short' WHERE seq = 4",
        "UPDATE audit_log SET mac = 'zz' WHERE seq = 4",
        "UPDATE audit_log SET saga_id = NULL WHERE seq = 4",
        "UPDATE audit_log SET seq = -4 WHERE seq = 4",
        "UPDATE audit_log SET seq = 9223372036854775807 WHERE seq = 4",
        "DELETE FROM audit_log",
        "DROP TABLE audit_log",
        "DROP TABLE saga_steps",
        "PRAGMA ignore_check_constraints = ON; UPDATE saga_steps SET status = 'BOGUS'",
        "UPDATE sagas SET owner_pid = -1",
        "UPDATE idempotency_keys SET saga_id = 'elsewhere'",
        "DELETE FROM idempotency_keys",
        "DELETE FROM saga_steps WHERE step_seq = 0",
        // A table that is no longer STRICT, holding values of any type.
        "ALTER TABLE audit_log RENAME TO old_log;
         CREATE TABLE audit_log (seq, at_ms, kind, saga_id, body, prev_hash, hash, mac);
         INSERT INTO audit_log SELECT * FROM old_log;
         UPDATE audit_log SET at_ms = x'00ff', body = 3.5 WHERE seq = 2;",
        "ALTER TABLE audit_log RENAME TO old_log;
         CREATE TABLE audit_log (seq, at_ms, kind, saga_id, body, prev_hash, hash, mac);
         INSERT INTO audit_log SELECT * FROM old_log;
         INSERT INTO audit_log SELECT * FROM old_log WHERE seq = 3;",
    ];
    for (edit_idx, edit) in edits.iter().enumerate() {
        let (path, conn) = fixture.copy(&format!("hostile-{edit_idx}.db"));
        // Foreign keys are off on this connection, as an attacker would have them.
        conn.execute_batch(edit).expect("tampers");
        drop(conn);
        let report = verify(&path, Some(&key())).expect("verifies");
        assert!(!report.is_intact(), "{edit}: {report:#?}");
        let report = verify(&path, None).expect("verifies");
        assert!(!report.is_intact(), "{edit}: {report:#?}");
        eprintln!("{edit}: {:?}", report.first_bad);
    }
}
