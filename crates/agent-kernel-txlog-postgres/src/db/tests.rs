//! [`PgDb`](super::PgDb) against the test server: what it holds back, sends together and
//! commits.

use super::placeholders;
use super::{PgDb, Statements};
use agent_kernel_txlog::sql::{Db, ToValue};

/// What `audit::Appender` runs for each record.
const INSERT: &str = "INSERT INTO audit_log (seq, at_ms, kind, saga_id, body, prev_hash, hash, mac)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)";

/// Holds back, through the chain's own insert, the audit record `seq` of `saga` with `body`.
fn hold_record(db: &dyn Db, seq: i64, saga: Option<&str>, body: &str) {
    let (at_ms, kind, mac) = (7_i64, "Test", None::<&str>);
    let (hash, prev) = ("h".repeat(64), "0".repeat(64));
    let params: [&dyn ToValue; 8] = [&seq, &at_ms, &kind, &saga, &body, &prev, &hash, &mac];
    assert_eq!(db.execute(INSERT, &params).expect("held"), 1);
}

/// A new connection to the log at `url`, and the statements it has prepared (none yet).
fn connected(url: &str) -> (postgres::Client, Statements) {
    let client = postgres::Client::connect(url, postgres::NoTls).expect("connects");
    (client, Statements::default())
}

fn count(db: &dyn Db) -> i64 {
    db.query_row("SELECT count(*) FROM audit_log", &[], |row| row.get(0))
        .expect("counts")
}

#[test]
fn only_the_chains_own_insert_is_held_back() {
    assert!(super::is_audit_insert(INSERT));
    assert!(!super::is_audit_insert(&format!(
        "{INSERT} ON CONFLICT DO NOTHING"
    )));
    assert!(!super::is_audit_insert(
        "INSERT INTO audit_log (seq, at_ms, kind, saga_id, body, prev_hash, hash) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"
    ));
}

#[test]
fn held_audit_records_are_seen_by_a_later_read_and_inserted_by_flush() {
    use agent_kernel_log_contract::postgres::{Schema, blocking, server};
    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    schema.execute(include_str!("../schema.sql"));
    let url = schema.url();
    blocking(|| {
        let (mut client, statements) = connected(&url);
        let mut tx = client.transaction().expect("begins");
        {
            let db = PgDb::holding(&mut tx, &statements, false);
            hold_record(&db, 1, Some("s"), "{}");
            hold_record(&db, 2, None, "{}");
            let trips = statements
                .round_trips
                .load(std::sync::atomic::Ordering::Relaxed);
            assert_eq!(trips, 0, "nothing sent yet");
            // A read of the table inserts them first, in one statement.
            assert_eq!(count(&db), 2);
            hold_record(&db, 3, None, "{}");
            db.flush().expect("inserts");
            assert_eq!(count(&db), 3);
        }
        tx.commit().expect("commits");
        let rows = client
            .query("SELECT seq, saga_id FROM audit_log ORDER BY seq", &[])
            .expect("reads");
        let read: Vec<(i64, Option<String>)> =
            rows.iter().map(|row| (row.get(0), row.get(1))).collect();
        assert_eq!(read, [(1, Some("s".to_owned())), (2, None), (3, None)]);
    });
}

#[test]
fn held_values_past_their_bound_are_sent_before_the_commit() {
    use agent_kernel_log_contract::postgres::{Schema, blocking, server};
    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    schema.execute(include_str!("../schema.sql"));
    let url = schema.url();
    let records = super::HELD_BYTES_SENT / (1 << 20) + 4;
    let trips = blocking(|| {
        let (mut client, statements) = connected(&url);
        let mut tx = begun(&mut client);
        let db = PgDb::holding(&mut tx, &statements, false);
        let body = format!("\"{}\\\\'\"", "x".repeat((1 << 20) - 8));
        for seq in 1..=i64::try_from(records).expect("few") {
            hold_record(&db, seq, None, &body);
        }
        // Sent once past the bound, before the COMMIT: its statement prepared, then the
        // records held so far.
        let trips = statements
            .round_trips
            .load(std::sync::atomic::Ordering::Relaxed);
        db.flush_and_commit().expect("commits the rest");
        trips
    });
    assert_eq!(trips, 2, "prepared, then sent once");
    let stored = schema.rows(
        "SELECT count(*)::text, min(length(body))::text, max(length(body))::text FROM audit_log",
    );
    let length = ((1 << 20) - 8 + 5).to_string();
    assert_eq!(
        stored,
        [vec![
            Some(records.to_string()),
            Some(length.clone()),
            Some(length)
        ]]
    );
}

#[test]
fn a_commit_in_a_transaction_that_already_failed_is_refused_not_taken_for_done() {
    use agent_kernel_log_contract::postgres::blocking;
    let Some(schema) = fresh_log() else { return };
    let url = schema.url();
    blocking(|| {
        let (mut client, statements) = connected(&url);
        let mut tx = begun(&mut client);
        // A statement failed, its error dropped: the server now answers a COMMIT with
        // ROLLBACK, which a simple query's answer does not tell apart.
        assert!(tx.client().batch_execute("SELECT 1 / 0").is_err());
        let db = PgDb::holding(&mut tx, &statements, true);
        let committed = db.flush_and_commit();
        assert!(
            matches!(committed, Err(super::Failed::Refused(_))),
            "{committed:?}"
        );
    });
}

/// A write transaction begun on `client`, as `begin_write` begins one.
fn begun(client: &mut postgres::Client) -> crate::session::WriteTx<'_> {
    client
        .batch_execute("START TRANSACTION ISOLATION LEVEL READ COMMITTED")
        .expect("begins");
    crate::session::WriteTx::beginning(client)
}

/// A fresh log's schema at its current version, for statements of the store.
fn fresh_log() -> Option<agent_kernel_log_contract::postgres::Schema> {
    use agent_kernel_log_contract::postgres::{Schema, server};
    let server = server()?;
    let schema = Schema::create(&server);
    struct Fixed;
    impl agent_kernel_api::Clock for Fixed {
        fn now_ms(&self) -> i64 {
            1_700_000_000_000
        }
    }
    let clock = std::sync::Arc::new(Fixed);
    let options = agent_kernel_txlog::LogOptions {
        durability: agent_kernel_api::Durability::Full,
        clock,
    };
    let worker = crate::Worker::new(agent_kernel_log_contract::records::owner(1));
    drop(crate::PostgresLog::open(&schema.url(), options, None, worker).expect("creates"));
    Some(schema)
}

/// `sagas` sagas of one step each, begun, committed and `Done`, applied in one
/// transaction holding rows, and `bad` (if any) applied among them; what
/// `flush_and_commit` says and the round trips of the transaction's statements (the
/// chain's first read and the statements prepared excepted: all are prepared by a first
/// round).
fn group(
    client: &mut postgres::Client,
    statements: &Statements,
    round: &str,
    sagas: usize,
    bad: Option<&[agent_kernel_api::LogWrite]>,
) -> (Result<(), super::Failed>, u64) {
    use agent_kernel_api::SagaState;
    use agent_kernel_log_contract::records::{begin, commit, new_saga, set_state};
    use agent_kernel_txlog::backend::{Chain, LockMap, apply_batch};
    use std::sync::atomic::Ordering::Relaxed;
    let mut tx = begun(client);
    let db = PgDb::holding(&mut tx, statements, true);
    let mut locks = LockMap::default();
    let mut chain = Chain::start_with(&db, None, &mut locks).expect("starts");
    let before = statements.round_trips.load(Relaxed);
    for n in 0..sagas {
        let id = format!("{round}-{n}");
        let batch = [
            new_saga(&id),
            begin(&id, 0, None, "h"),
            commit(&id, 0),
            set_state(&id, SagaState::Done),
        ];
        apply_batch(&db, &mut chain, None, &batch, 5).expect("held");
        if n == sagas / 2
            && let Some(bad) = bad
        {
            apply_batch(&db, &mut chain, None, bad, 5).expect("held, not yet checked");
        }
    }
    let committed = db.flush_and_commit();
    let trips = statements.round_trips.load(Relaxed) - before;
    (committed, trips)
}

#[test]
fn a_groups_writes_take_one_round_trip_whatever_their_number_and_kinds() {
    use agent_kernel_log_contract::postgres::blocking;
    let Some(schema) = fresh_log() else { return };
    let url = schema.url();
    blocking(|| {
        let (mut client, statements) = connected(&url);
        // The first prepares every statement.
        assert!(group(&mut client, &statements, "a", 2, None).0.is_ok());
        let (few, trips_few) = group(&mut client, &statements, "b", 3, None);
        let (many, trips_many) = group(&mut client, &statements, "c", 40, None);
        assert!(few.is_ok() && many.is_ok(), "{few:?} {many:?}");
        // A saga's insert, a step's, its outcome, the state, the locks' release, the
        // audit records and the COMMIT: a statement each, all sent together.
        assert_eq!((trips_few, trips_many), (1, 1));
    });
    let done = schema.rows(
        "SELECT count(*)::text FROM sagas s JOIN saga_steps t USING (saga_id)
         WHERE s.state = 'Done' AND t.status = 'COMMIT'",
    );
    assert_eq!(done, [vec![Some("45".to_owned())]]);
    let report = crate::verify(&url, None, None).expect("verifies");
    assert!(report.is_intact(), "{report:#?}");
}

#[test]
fn a_held_write_that_changes_no_row_keeps_its_transaction_from_committing() {
    use agent_kernel_api::SagaState;
    use agent_kernel_log_contract::postgres::blocking;
    use agent_kernel_log_contract::records::{begin, commit, new_saga, set_state};
    let Some(schema) = fresh_log() else { return };
    let url = schema.url();
    blocking(|| {
        let (mut client, statements) = connected(&url);
        // A step committed twice, a step of a saga that is not there, a state of a saga
        // that is not there: the store took each as written, the flush finds out.
        let twice = vec![
            new_saga("x"),
            begin("x", 0, None, "h"),
            commit("x", 0),
            commit("x", 0),
        ];
        for bad in [
            twice,
            vec![begin("nowhere", 0, None, "h")],
            vec![set_state("nowhere", SagaState::Done)],
        ] {
            let (committed, _) = group(&mut client, &statements, "d", 4, Some(&bad));
            // Refused on the server, before the COMMIT sent with it could run.
            let Err(super::Failed::Refused(error)) = committed else {
                panic!("refused: {committed:?}");
            };
            assert!(error.contains("held writes changed"), "{error}");
        }
    });
    assert_eq!(
        schema.rows("SELECT count(*)::text FROM sagas"),
        [vec![Some("0".to_owned())]]
    );
}

fn count_sagas(db: &dyn Db) -> Result<i64, super::Error> {
    db.query_row("SELECT count(*) FROM sagas", &[], |row| row.get(0))
}

#[test]
fn a_failed_flush_inside_another_statement_reaches_it_and_stays() {
    use agent_kernel_log_contract::postgres::blocking;
    let Some(schema) = fresh_log() else { return };
    let url = schema.url();
    blocking(|| {
        let (mut client, statements) = connected(&url);
        let mut tx = client.transaction().expect("begins");
        let db = PgDb::holding(&mut tx, &statements, true);
        let state = "UPDATE sagas SET state = ?2, updated_at_ms = ?3 WHERE saga_id = ?1";
        let params: [&dyn ToValue; 3] = [&"nowhere", &"Done", &5_i64];
        // Held: answered as the store expects, though no such saga exists.
        assert_eq!(db.execute(state, &params).expect("held"), 1);
        // The read that sends it first fails, as a database error the read's caller
        // cannot take for an empty answer or a constraint of its own…
        let read = count_sagas(&db);
        assert!(matches!(read, Err(super::Error::Database(_))), "{read:?}");
        // …and so does every statement after it, and the flush before the COMMIT.
        let again = db.execute("DELETE FROM locks WHERE resource = ?1", &[&"r"]);
        assert!(matches!(again, Err(super::Error::Database(_))), "{again:?}");
        assert!(matches!(db.flush(), Err(super::Error::Database(_))));
    });
}

#[test]
fn placeholders_are_rewritten_outside_literals_only() {
    assert_eq!(
        placeholders("SELECT '?1' FROM t WHERE a = ?1 AND b = ?12"),
        "SELECT '?1' FROM t WHERE a = $1 AND b = $12"
    );
}
