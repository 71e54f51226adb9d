//! Leases: an owner is alive while its log renews its lease, dead once it ran out, and a
//! writer whose lease ran out is fenced for good.

use std::time::{Duration, Instant};

use agent_kernel_api::{LeaseStatus, Owner, SagaId, TxError, TxLog};
use agent_kernel_log_contract::records::{begin, new_saga};
use agent_kernel_txlog_postgres::{LEASE_MIN, Worker};

use crate::{Schema, open, open_as, server};

fn worker(pid: u32, lease: Duration) -> Worker {
    Worker {
        owner: Owner {
            host: "lease-host".into(),
            boot_id: "lease-boot".into(),
            pid,
            start_ticks: 3,
        },
        lease,
        head_file: None,
    }
}

/// Writes the saga `held`, owned by `owner`, with its first step begun.
async fn hold_saga(log: &dyn TxLog, owner: &Owner) {
    let LogWrite::CreateSaga(mut saga) = new_saga("held") else {
        unreachable!("new_saga creates a saga")
    };
    saga.owner = owner.clone();
    log.write(vec![
        LogWrite::CreateSaga(saga),
        begin("held", 0, None, "h"),
    ])
    .await
    .expect("writes");
}

/// Polls `lease` of `owner` through `log` until it is `wanted`, for at most `within`.
async fn wait_for(log: &dyn TxLog, owner: &Owner, wanted: LeaseStatus, within: Duration) {
    let started = Instant::now();
    loop {
        let status = log.owner_lease(owner).await.expect("reads");
        if status == Some(wanted) {
            return;
        }
        assert!(
            started.elapsed() < within,
            "the lease of {owner:?} is still {status:?} after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn an_owner_is_alive_while_its_log_renews_and_dead_one_lease_after_it_closed() {
    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    let observer = open(&schema.url()).expect("opens");
    let short = worker(10, LEASE_MIN);
    assert_eq!(
        observer.owner_lease(&short.owner).await.expect("reads"),
        Some(LeaseStatus::Expired),
        "an owner that never held a lease is dead"
    );
    let log = open_as(&schema.url(), short.clone()).expect("opens");
    // Renewed a quarter lease apart: alive well past one lease.
    let started = Instant::now();
    while started.elapsed() < LEASE_MIN * 3 {
        assert_eq!(
            observer.owner_lease(&short.owner).await.expect("reads"),
            Some(LeaseStatus::Live)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(log);
    wait_for(&observer, &short.owner, LeaseStatus::Expired, LEASE_MIN * 4).await;
}

#[tokio::test]
async fn a_writer_whose_lease_ran_out_is_fenced_for_good() {
    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    let fenced = worker(20, Duration::from_secs(30));
    let log = open_as(&schema.url(), fenced.clone()).expect("opens");
    log.write(vec![new_saga("s"), begin("s", 0, None, "h")])
        .await
        .expect("writes while its lease is live");
    // As if the process had been paused past its lease.
    schema.execute("UPDATE leases SET expires_at_ms = 0 WHERE owner_pid = 20");
    let error = log
        .write(vec![LogWrite::SetState {
            saga_id: SagaId::new("s"),
            state: agent_kernel_api::SagaState::Compensating,
        }])
        .await
        .expect_err("fenced");
    assert!(matches!(error, TxError::Fenced { .. }), "{error}");
    let error = log
        .take_over(
            &SagaId::new("s"),
            &agent_kernel_log_contract::records::owner(1),
            agent_kernel_api::SagaState::Acting,
            &fenced.owner,
        )
        .await
        .expect_err("fenced");
    assert!(matches!(error, TxError::Fenced { .. }), "{error}");
    let record = log
        .saga(&SagaId::new("s"))
        .await
        .expect("reads")
        .expect("exists");
    assert_eq!(
        record.saga.state,
        agent_kernel_api::SagaState::Acting,
        "nothing written"
    );
    // Its renewals find it run out, and it cannot be taken again.
    drop(log);
    let error = open_as(&schema.url(), fenced).expect_err("refused");
    assert!(matches!(error, TxError::Fenced { .. }), "{error}");
}

use agent_kernel_api::LogWrite;

#[tokio::test]
async fn a_take_over_needs_the_owners_lease_run_out_and_ends_it_for_good() {
    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    let holder = worker(40, Duration::from_secs(30));
    let log = open_as(&schema.url(), holder.clone()).expect("opens");
    hold_saga(&log, &holder.owner).await;
    let recoverer = open(&schema.url()).expect("opens");
    let me = crate::this_worker().owner;
    let acting = agent_kernel_api::SagaState::Acting;
    assert!(
        !recoverer
            .take_over(&SagaId::new("held"), &holder.owner, acting, &me)
            .await
            .expect("writes"),
        "the owner's lease is live: no take-over"
    );
    schema.execute("UPDATE leases SET expires_at_ms = 1 WHERE owner_pid = 40");
    assert!(
        recoverer
            .take_over(&SagaId::new("held"), &holder.owner, acting, &me)
            .await
            .expect("writes")
    );
    // Ended for good by the take-over: a renewal committed afterwards cannot revive it.
    let ended = schema.rows("SELECT expires_at_ms::text FROM leases WHERE owner_pid = 40");
    assert_eq!(ended[0][0].as_deref(), Some("-1"));
    let error = log
        .write(vec![LogWrite::SetState {
            saga_id: SagaId::new("held"),
            state: agent_kernel_api::SagaState::Compensating,
        }])
        .await
        .expect_err("fenced");
    assert!(matches!(error, TxError::Fenced { .. }), "{error}");
}

#[tokio::test]
async fn an_owner_taken_over_after_its_row_was_forgotten_never_takes_a_lease_again() {
    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    let zombie = worker(41, Duration::from_secs(30));
    let log = open_as(&schema.url(), zombie.clone()).expect("opens");
    hold_saga(&log, &zombie.owner).await;
    // Its row gone (forgotten, as a day after it ran out), its saga is taken over.
    schema.execute("DELETE FROM leases WHERE owner_pid = 41");
    let recoverer = open(&schema.url()).expect("opens");
    let me = crate::this_worker().owner;
    assert!(
        recoverer
            .take_over(
                &SagaId::new("held"),
                &zombie.owner,
                agent_kernel_api::SagaState::Acting,
                &me
            )
            .await
            .expect("writes")
    );
    let tombstone = schema.rows("SELECT expires_at_ms::text FROM leases WHERE owner_pid = 41");
    assert_eq!(tombstone, [vec![Some("-1".to_owned())]]);
    // The same process opening the log anew is refused, and so stays every write of it.
    let error = open_as(&schema.url(), zombie.clone()).expect_err("refused");
    assert!(matches!(error, TxError::Fenced { .. }), "{error}");
    let error = log
        .write(vec![LogWrite::SetState {
            saga_id: SagaId::new("held"),
            state: agent_kernel_api::SagaState::Compensating,
        }])
        .await
        .expect_err("fenced");
    assert!(matches!(error, TxError::Fenced { .. }), "{error}");
}

#[tokio::test]
async fn lease_rows_gone_longer_than_a_day_are_forgotten_and_the_rest_kept() {
    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    let first = open(&schema.url()).expect("opens");
    let now = "(extract(epoch from clock_timestamp()) * 1000)::bigint";
    let day = agent_kernel_txlog_postgres::LEASE_ROWS_KEPT.as_millis();
    let hour = 3_600_000;
    // (pid, acquired, expires): ran out a day and an hour ago; ended for good, taken a day
    // and an hour ago; ran out an hour ago; ended, taken an hour ago.
    let rows = [
        (
            101,
            format!("{now} - {day} - 2 * {hour}"),
            format!("{now} - {day} - {hour}"),
        ),
        (102, format!("{now} - {day} - {hour}"), "-1".to_owned()),
        (
            103,
            format!("{now} - 2 * {hour}"),
            format!("{now} - {hour}"),
        ),
        (104, format!("{now} - {hour}"), "-1".to_owned()),
    ];
    for (pid, acquired, expires) in &rows {
        schema.execute(&format!(
            "INSERT INTO leases (owner_host, owner_boot_id, owner_pid, owner_start_ticks,
                 acquired_at_ms, expires_at_ms)
             VALUES ('gone-host', 'gone-boot', {pid}, 1, {acquired}, {expires})"
        ));
    }
    // Each process forgets them when its lease's renewer starts.
    let second = open_as(&schema.url(), worker(20, Duration::from_secs(10))).expect("opens");
    let kept: Vec<String> = schema
        .rows("SELECT owner_pid::text FROM leases WHERE owner_host = 'gone-host' ORDER BY 1")
        .into_iter()
        .map(|row| row[0].clone().expect("a pid"))
        .collect();
    // Rows ended for good are tombstones, whatever their age.
    assert_eq!(kept, ["102", "103", "104"]);
    // Forgotten owners are dead, and the live ones keep their rows.
    let gone = Owner {
        host: "gone-host".into(),
        boot_id: "gone-boot".into(),
        pid: 101,
        start_ticks: 1,
    };
    assert_eq!(
        second.owner_lease(&gone).await.expect("reads"),
        Some(LeaseStatus::Expired)
    );
    assert_eq!(
        schema.rows("SELECT count(*)::text FROM leases WHERE owner_host <> 'gone-host'"),
        [vec![Some("2".to_owned())]]
    );
    drop(first);
}

#[tokio::test]
async fn a_worker_whose_lease_row_is_gone_is_fenced_when_its_connection_is_made_again() {
    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    let name = format!("ak_forgotten_{}", std::process::id());
    let url = format!("{}&application_name={name}", schema.url());
    let log = open_as(&url, worker(30, Duration::from_secs(10))).expect("opens");
    log.write(vec![new_saga("a"), begin("a", 0, None, "h")])
        .await
        .expect("writes");
    // Its row deleted (as if forgotten), and its connections ended by the server.
    schema.execute("DELETE FROM leases WHERE owner_host = 'lease-host' AND owner_pid = 30");
    schema.execute(&format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '{name}'"
    ));
    // The write's BEGIN fails on the ended connection; made again, the lease is not.
    let fenced = log.write(vec![new_saga("b")]).await.expect_err("fenced");
    assert!(matches!(fenced, TxError::Fenced { .. }), "{fenced}");
    assert!(fenced.to_string().contains("ran out"), "{fenced}");
    assert!(
        schema
            .rows("SELECT 'b' FROM sagas WHERE saga_id = 'b'")
            .is_empty(),
        "nothing of the fenced write landed"
    );
    assert!(
        schema
            .rows("SELECT 'row' FROM leases WHERE owner_host = 'lease-host' AND owner_pid = 30")
            .is_empty(),
        "the lease was not made again"
    );
}

#[tokio::test]
async fn take_overs_sent_at_once_share_transactions_and_each_takes_its_saga_once() {
    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    let log = std::sync::Arc::new(open(&schema.url()).expect("opens"));
    // An owner that never held a lease here: dead.
    let dead = worker(50, Duration::from_secs(30)).owner;
    let n_sagas = 24;
    for n in 0..n_sagas {
        let id = format!("s{n}");
        let LogWrite::CreateSaga(mut saga) = new_saga(&id) else {
            unreachable!("new_saga creates a saga")
        };
        saga.owner = dead.clone();
        log.write(vec![LogWrite::CreateSaga(saga), begin(&id, 0, None, "h")])
            .await
            .expect("writes");
    }
    let before = log.stats();
    let me = crate::this_worker().owner;
    let take_overs: Vec<_> = (0..n_sagas)
        .map(|n| {
            let (log, dead, me) = (log.clone(), dead.clone(), me.clone());
            tokio::spawn(async move {
                let saga_id = SagaId::new(format!("s{n}"));
                log.take_over_and_write(
                    &saga_id,
                    &dead,
                    agent_kernel_api::SagaState::Acting,
                    &me,
                    vec![LogWrite::SetState {
                        saga_id: saga_id.clone(),
                        state: agent_kernel_api::SagaState::Compensating,
                    }],
                )
                .await
            })
        })
        .collect();
    for take_over in take_overs {
        assert!(take_over.await.expect("ran").expect("writes"), "taken");
    }
    let after = log.stats();
    assert_eq!(after.batches - before.batches, n_sagas as u64, "{after:?}");
    assert!(
        after.transactions - before.transactions < n_sagas as u64,
        "no group formed: {after:?}"
    );
    // Each taken once, by this worker, and moved on; the dead owner's lease a tombstone.
    let rows = schema.rows(
        "SELECT count(*)::text FROM sagas WHERE state = 'Compensating' AND owner_host = 'test-host'",
    );
    assert_eq!(rows, [vec![Some(n_sagas.to_string())]]);
    let take_over_records =
        schema.rows("SELECT count(*)::text FROM audit_log WHERE kind = 'TakeOver'");
    assert_eq!(take_over_records, [vec![Some(n_sagas.to_string())]]);
    assert_eq!(
        schema.rows("SELECT expires_at_ms::text FROM leases WHERE owner_pid = 50"),
        [vec![Some("-1".to_owned())]]
    );
    // Taken, they are not taken again.
    assert!(
        !log.take_over(
            &SagaId::new("s0"),
            &dead,
            agent_kernel_api::SagaState::Acting,
            &me
        )
        .await
        .expect("writes")
    );
    let report = agent_kernel_txlog_postgres::verify(&schema.url(), None, None).expect("verifies");
    assert!(report.first_bad.is_none(), "{report:?}");
}

#[tokio::test]
async fn a_process_hands_its_own_saga_over_and_keeps_its_lease() {
    let Some(server) = server() else { return };
    let schema = Schema::create(&server);
    let me = worker(60, Duration::from_secs(30));
    let log = open_as(&schema.url(), me.clone()).expect("opens");
    hold_saga(&log, &me.owner).await;
    // As `run --no-wait` leaves a saga waiting for its approval.
    assert!(
        log.take_over(
            &SagaId::new("held"),
            &me.owner,
            agent_kernel_api::SagaState::Acting,
            &Owner::detached()
        )
        .await
        .expect("writes"),
        "handed over"
    );
    assert_eq!(
        log.owner_lease(&me.owner).await.expect("reads"),
        Some(LeaseStatus::Live)
    );
    let record = log
        .saga(&SagaId::new("held"))
        .await
        .expect("reads")
        .expect("exists");
    assert!(record.saga.owner.is_detached(), "{:?}", record.saga.owner);
    // Taking a detached saga over leaves no lease row for the detached owner.
    let other = open(&schema.url()).expect("opens");
    assert!(
        other
            .take_over(
                &SagaId::new("held"),
                &Owner::detached(),
                agent_kernel_api::SagaState::Acting,
                &crate::this_worker().owner
            )
            .await
            .expect("writes")
    );
    assert!(
        schema
            .rows("SELECT 'row' FROM leases WHERE owner_pid = 0")
            .is_empty()
    );
}
