//! Writers of several processes on one log: a write transaction that found the log's write
//! lock taken lets go of it before the server flushes its COMMIT, and answers only after.

use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_kernel_api::{Owner, TxLog};
use agent_kernel_log_contract::records::done_saga_declaring;
use agent_kernel_txlog_postgres::Worker;

use crate::open::WriteLockHeld;
use crate::{Schema, open, open_as, server};

/// How long a test waits for a session to reach a state before it fails.
const WAIT_MAX: Duration = Duration::from_secs(30);

#[tokio::test]
async fn a_write_that_found_the_lock_taken_lets_go_of_it_before_the_flush_and_answers_after() {
    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    let name = format!("ak_flush_{}", std::process::id());
    let log = Arc::new(open(&format!("{}&application_name={name}", schema.url())).expect("opens"));
    let other = open_as(
        &schema.url(),
        Worker::new(Owner {
            host: "other-host".into(),
            boot_id: "other-boot".into(),
            pid: 7,
            start_ticks: 1,
        }),
    )
    .expect("opens");
    log.write(done_saga_declaring("alone"))
        .await
        .expect("writes");
    assert_eq!(
        (log.stats().contended, log.stats().flushed_after),
        (0, 0),
        "a writer alone commits through the flush"
    );
    // Another session holds the lease row of the log's worker: a write of it waits there.
    let (row_held, let_go_of_row) = {
        let url = schema.url();
        let (held, is_held) = std::sync::mpsc::channel();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let mut client = postgres::Client::connect(&url, postgres::NoTls).expect("connects");
            let mut tx = client.transaction().expect("begins");
            let rows = tx
                .query(
                    "SELECT 1 FROM leases WHERE owner_host = 'test-host' AND owner_pid = $1
                     FOR UPDATE",
                    &[&i64::from(std::process::id())],
                )
                .expect("locks");
            assert_eq!(rows.len(), 1, "the worker's lease row");
            held.send(()).expect("told");
            released.recv().expect("let go of");
            tx.commit().expect("commits");
        });
        is_held.recv().expect("held");
        (thread, release)
    };
    // The log's next write finds the write lock taken by another session.
    let lock_held = WriteLockHeld::take(&schema.url(), &name, None);
    let write = {
        let log = log.clone();
        tokio::spawn(async move { log.write(done_saga_declaring("flushed")).await })
    };
    // The write is sent before the lock is let go of.
    tokio::task::yield_now().await;
    lock_held.let_go();
    // It committed, and waits for its flush: at the lease row.
    let waiting_at_row = "SELECT count(*) FROM pg_stat_activity
         WHERE application_name = $1 AND wait_event_type = 'Lock'
             AND query LIKE 'UPDATE leases SET expires_at_ms = expires_at_ms%'";
    crate::blocking(|| {
        let mut client =
            postgres::Client::connect(&schema.url(), postgres::NoTls).expect("connects");
        let deadline = Instant::now() + WAIT_MAX;
        while client
            .query_one(waiting_at_row, &[&name])
            .expect("reads")
            .get::<_, i64>(0)
            == 0
        {
            assert!(
                Instant::now() < deadline,
                "the write never waited for its flush"
            );
            std::thread::yield_now();
        }
    });
    assert_eq!(
        schema.rows("SELECT state FROM sagas WHERE saga_id = 'flushed'"),
        [vec![Some("Done".to_owned())]],
        "committed"
    );
    assert!(!write.is_finished(), "not answered before its flush");
    // The write lock was let go of before the flush: another writer goes on meanwhile.
    tokio::time::timeout(WAIT_MAX, other.write(done_saga_declaring("meanwhile")))
        .await
        .expect("the write lock is free")
        .expect("writes");
    assert!(!write.is_finished(), "still not answered");
    let_go_of_row.send(()).expect("told");
    row_held.join().expect("let go of");
    write.await.expect("ran").expect("answered once flushed");
    let stats = log.stats();
    assert_eq!((stats.contended, stats.flushed_after), (1, 1), "{stats:?}");
    let report = agent_kernel_txlog_postgres::verify(&schema.url(), None, None).expect("verifies");
    assert!(report.is_intact(), "{report:#?}");
}
