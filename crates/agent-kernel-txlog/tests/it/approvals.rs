//! Approval requests in the log (reference §10): requested with the saga's move to
//! `AwaitingApproval`, decided once, consumed once in the BEGIN's transaction and only for
//! exactly the step they name, and covered by `audit verify`.

use agent_kernel_api::{ApprovalDecision, ApprovalStatus, SagaId, TxError, TxLog, WriteOutcome};
use rusqlite::Connection;

use agent_kernel_log_contract::records::{decide, use_with_begin, waiting_saga};

use crate::{open, verify};

#[tokio::test]
async fn an_expired_request_cannot_be_approved_and_a_cancelled_one_applies_to_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("log.db");
    let log = open(&path).expect("opens");
    // The log's clock starts at 1,000 ms: this request expired at 500.
    waiting_saga(&log, "s1", "a1", 500).await;
    let outcomes = log
        .write(vec![decide("a1", ApprovalDecision::Approve)])
        .await
        .expect("written");
    assert_eq!(
        outcomes,
        [WriteOutcome::NotPending(ApprovalStatus::Expired)]
    );
    log.write(vec![decide("a1", ApprovalDecision::Expire)])
        .await
        .expect("written");
    assert_eq!(
        log.approval("a1")
            .await
            .expect("reads")
            .expect("exists")
            .status,
        ApprovalStatus::Expired
    );

    waiting_saga(&log, "s2", "a2", i64::MAX).await;
    log.write(vec![decide("a2", ApprovalDecision::Cancel)])
        .await
        .expect("written");
    let outcomes = log
        .write(vec![decide("a2", ApprovalDecision::Approve)])
        .await
        .expect("written");
    assert_eq!(
        outcomes,
        [WriteOutcome::NotPending(ApprovalStatus::Cancelled)]
    );
    drop(log);
    assert!(verify(&path, None).expect("verifies").is_intact());
}

#[tokio::test]
async fn an_approval_forged_in_the_table_is_caught_by_verify() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("log.db");
    let log = open(&path).expect("opens");
    waiting_saga(&log, "s1", "a1", i64::MAX).await;
    drop(log);
    assert!(verify(&path, None).expect("verifies").is_intact());
    let conn = Connection::open(&path).expect("opens");
    conn.execute(
        "UPDATE approvals SET status = 'approved' WHERE approval_id = 'a1'",
        [],
    )
    .expect("forged");
    drop(conn);
    let report = verify(&path, None).expect("verifies");
    let bad = report.first_bad.expect("detected");
    assert!(bad.reason.contains("approval a1"), "{}", bad.reason);
    // And the forged approval is never used: its use checks the decision's own record.
    let log = open(&path).expect("opens");
    let error = use_with_begin(&log, &"d".repeat(64))
        .await
        .expect_err("no decision in the chain");
    assert!(
        matches!(&error, TxError::ApprovalUnusable { reason, .. } if reason.contains("audit chain")),
        "{error}"
    );
    assert!(
        log.saga(&SagaId::new("s1"))
            .await
            .expect("reads")
            .expect("saga")
            .steps
            .is_empty()
    );
}

#[tokio::test]
async fn dead_letters_count_attempts_settle_once_and_an_edit_is_caught_by_verify() {
    let store = crate::fresh_store().expect("a store");
    agent_kernel_log_contract::checks::dead_letters_count_attempts_and_settle_once(&store).await;
    let path = store.path();
    assert!(verify(&path, None).expect("verifies").is_intact());

    let conn = Connection::open(&path).expect("opens");
    conn.execute("UPDATE dead_letters SET attempts = 1", [])
        .expect("edited");
    drop(conn);
    let bad = verify(&path, None)
        .expect("verifies")
        .first_bad
        .expect("detected");
    assert!(bad.reason.contains("dead letter d1"), "{}", bad.reason);
}

#[tokio::test]
async fn under_an_audit_key_a_decision_forged_with_a_consistent_record_is_never_used() {
    use crate::audit::{key, open_log, record_hash};

    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("log.db");
    let log = open_log(&path, Some(key()), agent_kernel_api::Durability::Full);
    waiting_saga(&log, "s1", "a1", i64::MAX).await;
    drop(log);
    // The attacker appends an `ApprovalDecided` record that hashes and follows the chain,
    // but cannot compute its MAC without the key, and points the request at it.
    let conn = Connection::open(&path).expect("opens");
    let (seq, prev): (i64, String) = conn
        .query_row(
            "SELECT seq, hash FROM audit_log ORDER BY seq DESC LIMIT 1",
            [],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .expect("the head");
    let body = format!(
        r#"{{"approval_id":"a1","by":{{"boot_id":"b","host":"h","pid":9,"start_ticks":7}},"decided_by":"mallory","digest":"{}","note":null,"note_sha256":null,"saga_id":"s1","status":"approved","uid":null}}"#,
        "d".repeat(64)
    );
    let seq = seq + 1;
    let hash = record_hash(&prev, seq, 5, "ApprovalDecided", "s1", &body);
    conn.execute(
        "INSERT INTO audit_log (seq, at_ms, kind, saga_id, body, prev_hash, hash, mac)
         VALUES (?1, 5, 'ApprovalDecided', 's1', ?2, ?3, ?4, NULL)",
        rusqlite::params![seq, body, prev, hash],
    )
    .expect("forged record");
    conn.execute(
        "UPDATE approvals SET status = 'approved', decision_seq = ?1 WHERE approval_id = 'a1'",
        [seq],
    )
    .expect("forged status");
    drop(conn);
    let log = open_log(&path, Some(key()), agent_kernel_api::Durability::Full);
    let error = use_with_begin(&log, &"d".repeat(64))
        .await
        .expect_err("not signed");
    assert!(
        matches!(&error, TxError::ApprovalUnusable { reason, .. } if reason.contains("not signed with the audit key")),
        "{error}"
    );
}
