//! Opening: a schema of something else, a newer log, tampering, a bad URL.

use agent_kernel_api::TxError;
use agent_kernel_txlog_postgres::is_postgres_url;

use crate::{Schema, open, server};

#[test]
fn postgres_urls_are_told_from_file_paths() {
    assert!(is_postgres_url("postgres://u@localhost/db"));
    assert!(is_postgres_url("PostgreSQL://u@localhost/db"));
    assert!(!is_postgres_url("agent-kernel.db"));
    assert!(!is_postgres_url("./postgres://x"));
}

#[test]
fn a_url_that_does_not_parse_is_refused_naming_it() {
    let error = open("postgres://u@localhost/db?no_such_option=1").expect_err("refused");
    assert!(
        matches!(error, TxError::Storage(ref reason) if reason.contains("does not parse")),
        "{error}"
    );
}

#[test]
fn a_schema_of_something_else_is_refused_and_left_untouched() {
    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    schema.execute("CREATE TABLE invoices (id BIGINT PRIMARY KEY)");
    let error = open(&schema.url()).expect_err("refused");
    assert!(matches!(error, TxError::NotALog { .. }), "{error}");
    assert!(error.to_string().contains("holds 1 tables"), "{error}");
    // Nothing was created beside it.
    schema.execute("CREATE TABLE sagas (x BIGINT)");
}

#[test]
fn an_empty_schema_becomes_a_log_once_and_reopens() {
    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    let url = schema.url();
    // Two first opens at once: one creates the tables, the other finds them.
    let (first, second) = crate::blocking(|| {
        std::thread::scope(|scope| {
            let a = scope.spawn(|| open(&url));
            let b = scope.spawn(|| open(&url));
            (a.join().expect("joins"), b.join().expect("joins"))
        })
    });
    first.expect("opens");
    second.expect("opens");
    open(&url).expect("reopens");
}

#[test]
fn a_newer_log_and_a_trigger_on_its_tables_are_refused() {
    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    open(&schema.url()).expect("creates");
    schema.execute(
        "CREATE FUNCTION keep() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$;
         CREATE TRIGGER rewrite BEFORE INSERT ON audit_log FOR EACH ROW EXECUTE FUNCTION keep()",
    );
    let error = open(&schema.url()).expect_err("refused");
    assert!(
        matches!(&error, TxError::Tampered { reason, .. } if reason.contains("`rewrite`")),
        "{error}"
    );
    schema.execute(
        "DROP TRIGGER rewrite ON audit_log; UPDATE agent_kernel_meta SET schema_version = 99",
    );
    let error = open(&schema.url()).expect_err("refused");
    assert!(
        matches!(error, TxError::SchemaTooNew { found: 99, .. }),
        "{error}"
    );
}

/// A log of schema version 2 (a begun step's resources in `step_keys`) is upgraded when
/// opened: each step's resources move into its row, in the order they were declared, an
/// undo claims them from there, and the chain still verifies.
#[tokio::test]
async fn a_version_2_log_moves_its_steps_resources_into_their_rows() {
    use agent_kernel_api::{LogWrite, SagaId, TxLog};
    use agent_kernel_log_contract::records::done_saga_declaring;

    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    let url = schema.url();
    let log = open(&url).expect("creates");
    log.write(done_saga_declaring("a")).await.expect("writes");
    drop(log);
    // As a version 2 build left it.
    schema.execute(
        "DROP VIEW held_locks;
         INSERT INTO step_keys (saga_id, step_seq, kind, key)
             SELECT s.saga_id, s.step_seq, 'resource', r.key
             FROM saga_steps s, json_array_elements_text(s.resources::json) AS r(key)
             WHERE s.resources IS NOT NULL;
         ALTER TABLE saga_steps DROP COLUMN resources;
         CREATE INDEX locks_by_saga ON locks (saga_id);
         ALTER TABLE agent_kernel_meta DROP COLUMN log_id;
         UPDATE agent_kernel_meta SET schema_version = 2",
    );
    let log = open(&url).expect("upgrades");
    let rows = schema.rows(
        "SELECT step_seq::text, resources FROM saga_steps WHERE saga_id = 'a' ORDER BY step_seq",
    );
    let resources: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            serde_json::from_str(row[1].as_deref().expect("declared")).expect("a JSON array")
        })
        .collect();
    assert_eq!(
        resources,
        [vec!["acct:1", "file:/w/x"], vec!["file:/w/x"]],
        "{rows:?}"
    );
    assert_eq!(
        schema.rows("SELECT kind, key FROM step_keys"),
        [vec![
            Some("duplicate".to_owned()),
            Some("invoice:7".to_owned())
        ]]
    );
    assert_eq!(
        schema.rows("SELECT schema_version::text FROM agent_kernel_meta"),
        [vec![Some(
            agent_kernel_txlog_postgres::SCHEMA_VERSION.to_string()
        )]]
    );
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
    drop(log);
    let report = agent_kernel_txlog_postgres::verify(&url, None, None).expect("verifies");
    assert!(report.is_intact(), "{report:#?}");
}

#[tokio::test]
async fn a_connection_the_server_ends_while_idle_is_made_again_at_the_next_write() {
    use agent_kernel_api::TxLog;
    use agent_kernel_log_contract::records::done_saga_declaring;

    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    let name = format!("ak_ended_{}", std::process::id());
    let url = format!("{}&application_name={name}", schema.url());
    let log = open(&url).expect("opens");
    log.write(done_saga_declaring("a")).await.expect("writes");
    schema.execute(&format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '{name}'"
    ));
    // Its BEGIN fails on the ended connection, so nothing of it was sent: it is written on a
    // new one.
    log.write(done_saga_declaring("b"))
        .await
        .expect("written on a connection made again");
    log.write(done_saga_declaring("c")).await.expect("writes");
    assert_eq!(
        schema.rows("SELECT count(*)::text FROM sagas"),
        [vec![Some("3".to_owned())]]
    );
}

#[test]
fn an_error_says_what_the_server_said() {
    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    let url = schema.url();
    let (before, after) = url.split_once('@').expect("a user and password in the URL");
    let user = before.rsplit_once(':').expect("a password").0;
    let error = open(&format!("{user}:not-the-password@{after}")).expect_err("refused");
    let message = error.to_string();
    assert!(
        message.contains("28P01") && message.contains("password authentication failed"),
        "{message}"
    );
    assert!(!message.contains("not-the-password"), "{message}");
}

#[tokio::test]
async fn batches_written_at_once_share_one_transaction_and_its_round_trips() {
    use agent_kernel_api::TxLog;
    use agent_kernel_log_contract::records::done_saga_declaring;

    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    let log = std::sync::Arc::new(open(&schema.url()).expect("opens"));
    let before = log.stats();
    // While the first batch's transaction runs, the others queue behind it and are taken
    // together.
    let writes: Vec<_> = (0..32)
        .map(|n| {
            let log = log.clone();
            tokio::spawn(async move { log.write(done_saga_declaring(&format!("s{n}"))).await })
        })
        .collect();
    for write in writes {
        write.await.expect("ran").expect("writes");
    }
    let after = log.stats();
    let transactions = after.transactions - before.transactions;
    assert_eq!(after.batches - before.batches, 32, "{after:?}");
    assert_eq!(after.records - before.records, 32 * 6, "{after:?}");
    assert!(transactions < 32, "no group formed: {after:?}");
    assert!(after.batches_max > 1, "{after:?}");
    // Each BEGIN and COMMIT counted once per transaction, not per batch.
    assert!(after.round_trips > before.round_trips, "{after:?}");
    assert_eq!(
        schema.rows("SELECT count(*)::text FROM sagas WHERE state = 'Done'"),
        [vec![Some("32".to_owned())]]
    );
}

#[tokio::test]
async fn the_writes_of_a_group_take_the_same_round_trips_whatever_their_number() {
    use agent_kernel_api::{SagaState, TxLog};
    use agent_kernel_log_contract::records::{begin, commit, new_saga, set_state};

    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    let log = std::sync::Arc::new(open(&schema.url()).expect("opens"));
    let before = log.stats();
    let writes: Vec<_> = (0..48)
        .map(|n| {
            let log = log.clone();
            let id = format!("s{n}");
            let batch = vec![
                new_saga(&id),
                begin(&id, 0, None, "h"),
                commit(&id, 0),
                set_state(&id, SagaState::Done),
            ];
            tokio::spawn(async move { log.write(batch).await })
        })
        .collect();
    for write in writes {
        write.await.expect("ran").expect("writes");
    }
    let after = log.stats();
    let transactions = after.transactions - before.transactions;
    let trips = after.round_trips - before.round_trips;
    assert!(after.batches_max > 1, "no group formed: {after:?}");
    // Alone, each batch takes 5 statements (a saga's insert, a step's, its outcome, the
    // state, the locks' release) besides its transaction's own; held back, they and the
    // audit records are one simple query per transaction, plus the store's statements
    // prepared once for the types of their parameters.
    // BEGIN, the lock, the lease check and the chain's head together; the held writes and
    // records with the COMMIT; the head file's check.
    let per_transaction = 1 + 1 + 1;
    let prepared = 30;
    assert!(
        trips <= transactions * per_transaction + prepared,
        "{trips} round trips in {transactions} transactions: {after:?}"
    );
}

/// Another session holding the write lock of the log at `url` (or the lock `key`) until told
/// to let go, which it does once the session named `waiter` (an `application_name`) waits
/// for that lock: the writes sent meanwhile queue behind that session's first transaction.
pub(crate) struct WriteLockHeld {
    release: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

/// How long a test waits for a session to wait for a lock before it fails.
const LOCK_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(30);

impl WriteLockHeld {
    pub(crate) fn take(url: &str, waiter: &str, key: Option<i64>) -> WriteLockHeld {
        let url = url.to_owned();
        let waiter = waiter.to_owned();
        let (taken, is_taken) = std::sync::mpsc::channel();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let mut client = postgres::Client::connect(&url, postgres::NoTls).expect("connects");
            let lock = key.unwrap_or_else(|| {
                let log_id: String = client
                    .query_one("SELECT log_id FROM agent_kernel_meta", &[])
                    .expect("a log")
                    .get(0);
                agent_kernel_txlog_postgres::write_lock(&log_id)
            });
            client
                .execute("SELECT pg_advisory_lock($1)", &[&lock])
                .expect("locks");
            taken.send(()).expect("told");
            released.recv().expect("let go of");
            // The log's session waits for this lock: its first transaction began.
            let waiting = "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
                 WHERE l.locktype = 'advisory' AND NOT l.granted AND a.application_name = $1
                     AND l.classid::bigint = $2 AND l.objid::bigint = $3 AND l.objsubid = 1";
            let (high, low) = (lock >> 32, lock & 0xFFFF_FFFF);
            let deadline = std::time::Instant::now() + LOCK_WAIT_MAX;
            while client
                .query_one(waiting, &[&waiter, &high, &low])
                .expect("reads")
                .get::<_, i64>(0)
                == 0
            {
                assert!(
                    std::time::Instant::now() < deadline,
                    "{waiter} never waited for the lock {lock:#x}"
                );
                std::thread::yield_now();
            }
            client
                .execute("SELECT pg_advisory_unlock($1)", &[&lock])
                .expect("unlocks");
        });
        is_taken.recv().expect("taken");
        WriteLockHeld { release, thread }
    }

    /// Lets go of the lock once the session named `waiter` waits for it.
    pub(crate) fn let_go(self) {
        self.release.send(()).expect("told");
        self.thread.join().expect("let go of");
    }
}

#[tokio::test]
async fn a_batch_refused_in_a_group_gets_the_answer_it_would_have_had_alone() {
    use agent_kernel_api::TxLog;
    use agent_kernel_log_contract::records::{commit, done_saga_declaring};

    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    let name = format!("ak_refused_{}", std::process::id());
    let url = format!("{}&application_name={name}", schema.url());
    let log = std::sync::Arc::new(open(&url).expect("opens"));
    // The first round has no refused batch: it shows the writes queued behind the held
    // lock are taken as a group. In the others, one of them commits a step that never
    // began: its group's writes are held back and sent together, and the refusal found
    // only then.
    for round in 0..4 {
        let held = WriteLockHeld::take(&schema.url(), &name, None);
        let writes: Vec<_> = (0..24)
            .map(|n| {
                let log = log.clone();
                let batch = if n == 12 && round > 0 {
                    vec![commit(&format!("r{round}-s0"), 7)]
                } else {
                    done_saga_declaring(&format!("r{round}-s{n}"))
                };
                tokio::spawn(async move { log.write(batch).await })
            })
            .collect();
        // Every write is sent before the lock is let go of.
        tokio::task::yield_now().await;
        held.let_go();
        for (n, write) in writes.into_iter().enumerate() {
            let written = write.await.expect("ran");
            if n == 12 && round > 0 {
                let error = written.expect_err("refused").to_string();
                assert!(
                    error.contains("has no step 7 in BEGIN to commit"),
                    "{error}"
                );
            } else {
                written.expect("writes");
            }
        }
        if round == 0 {
            assert!(
                log.stats().batches_max > 1,
                "no group formed: {:?}",
                log.stats()
            );
        }
    }
    assert_eq!(
        schema.rows("SELECT count(*)::text FROM sagas WHERE state = 'Done'"),
        [vec![Some("93".to_owned())]]
    );
    let report = agent_kernel_txlog_postgres::verify(&schema.url(), None, None).expect("verifies");
    assert!(report.is_intact(), "{report:#?}");
}

#[tokio::test]
async fn a_log_whose_writer_holds_its_lock_does_not_hold_up_a_log_in_another_schema() {
    use agent_kernel_api::TxLog;
    use agent_kernel_log_contract::records::done_saga_declaring;

    let Some(server) = server() else { return };
    let (held_schema, free_schema) = (Schema::create(&server), Schema::create(&server));
    let name = format!("ak_held_{}", std::process::id());
    let held_log = std::sync::Arc::new(
        open(&format!("{}&application_name={name}", held_schema.url())).expect("opens"),
    );
    let free_log = open(&free_schema.url()).expect("opens");
    let held = WriteLockHeld::take(&held_schema.url(), &name, None);
    let waiting = {
        let held_log = held_log.clone();
        tokio::spawn(async move { held_log.write(done_saga_declaring("waits")).await })
    };
    // The other log's write goes through while the first log's lock is held (bounded, so a
    // shared lock fails the test instead of hanging it).
    tokio::time::timeout(
        std::time::Duration::from_secs(20),
        free_log.write(done_saga_declaring("free")),
    )
    .await
    .expect("not held up by the other log's lock")
    .expect("writes");
    assert!(
        !waiting.is_finished(),
        "the held log's write waits for its lock"
    );
    // The held log's write was sent; its session waits for the lock.
    tokio::task::yield_now().await;
    held.let_go();
    waiting.await.expect("ran").expect("writes once let go of");
    let lock_of = |schema: &Schema| {
        let id = schema.rows("SELECT log_id FROM agent_kernel_meta")[0][0].clone();
        agent_kernel_txlog_postgres::write_lock(&id.expect("an identity"))
    };
    assert_ne!(lock_of(&held_schema), lock_of(&free_schema));
}

#[tokio::test]
async fn a_writer_of_an_older_build_and_one_of_this_build_keep_each_other_out() {
    use agent_kernel_api::TxLog;
    use agent_kernel_log_contract::records::done_saga_declaring;

    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    let name = format!("ak_older_{}", std::process::id());
    let log = std::sync::Arc::new(
        open(&format!("{}&application_name={name}", schema.url())).expect("opens"),
    );
    // A process of a build before version 6 that opened the log before it was migrated
    // takes the one lock of every log, exclusive: this build's write waits for it.
    let older = agent_kernel_txlog_postgres::WRITE_LOCK_BEFORE_V6;
    let held = WriteLockHeld::take(&schema.url(), &name, Some(older));
    let waiting = {
        let log = log.clone();
        tokio::spawn(async move { log.write(done_saga_declaring("after")).await })
    };
    tokio::task::yield_now().await;
    // Returns only once this build's session waited for the older build's lock.
    held.let_go();
    waiting.await.expect("ran").expect("writes once let go of");
}

#[tokio::test]
async fn a_log_whose_identity_was_edited_is_written_no_more() {
    use agent_kernel_api::TxLog;
    use agent_kernel_log_contract::records::done_saga_declaring;

    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    let log = open(&schema.url()).expect("opens");
    log.write(done_saga_declaring("before"))
        .await
        .expect("writes");
    // A process opened after the edit would take another lock than this one.
    schema.execute("UPDATE agent_kernel_meta SET log_id = 'another'");
    let error = log
        .write(done_saga_declaring("after"))
        .await
        .expect_err("refused");
    assert!(
        matches!(&error, TxError::Tampered { reason, .. } if reason.contains("no longer")),
        "{error:?}"
    );
    assert_eq!(
        schema.rows("SELECT saga_id FROM sagas"),
        [vec![Some("before".to_owned())]]
    );
}
