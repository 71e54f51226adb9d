//! Integration tests of the PostgreSQL log, on the server `AGENT_KERNEL_TEST_POSTGRES`
//! names (a URL of a database the tests may create schemas in; `.ci/run` starts one).
//! Without it they are skipped, unless `AGENT_KERNEL_TEST_POSTGRES_REQUIRED=1`, when they
//! fail.

mod crash;
mod flush;
mod leases;
mod open;

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use agent_kernel_api::{Clock, Durability, Owner, TxError, TxLog};
use agent_kernel_txlog::LogOptions;
use agent_kernel_txlog_postgres::{PostgresLog, Worker};

pub(crate) use agent_kernel_log_contract::postgres::{Schema, blocking, server};

pub(crate) struct StepClock(AtomicI64);

impl Clock for StepClock {
    fn now_ms(&self) -> i64 {
        self.0.fetch_add(1, Ordering::Relaxed)
    }
}

/// This test process as a worker, with the default lease.
pub(crate) fn this_worker() -> Worker {
    Worker::new(Owner {
        host: "test-host".into(),
        boot_id: "test-boot".into(),
        pid: std::process::id(),
        start_ticks: 1,
    })
}

/// Opens the log in `url` with a stepping clock, as `worker`.
pub(crate) fn open_as(url: &str, worker: Worker) -> Result<PostgresLog, TxError> {
    PostgresLog::open(
        url,
        LogOptions {
            durability: Durability::Full,
            clock: Arc::new(StepClock(AtomicI64::new(1_000))),
        },
        None,
        worker,
    )
}

/// Opens the log in `url` with a stepping clock, as [`this_worker`].
pub(crate) fn open(url: &str) -> Result<PostgresLog, TxError> {
    open_as(url, this_worker())
}

/// A fresh schema, for the log contract's checks.
struct PostgresStore {
    schema: Schema,
    /// Whether every write sends its writes of steps and sagas one by one, as the batches of
    /// a refused group are written again.
    hold_never: bool,
}

impl agent_kernel_log_contract::LogStore for PostgresStore {
    fn open(&self) -> Arc<dyn TxLog> {
        let log = open(&self.schema.url()).expect("opens");
        if self.hold_never {
            log.write_without_holding();
        }
        Arc::new(log)
    }

    /// Every check leaves a log whose audit chain and tables verify.
    fn finished(&self) {
        let report =
            agent_kernel_txlog_postgres::verify(&self.schema.url(), None, None).expect("verifies");
        assert!(report.is_intact(), "{report:#?}");
        assert!(report.n_records > 0, "{report:#?}");
    }

    fn held_locks(&self) -> Vec<(String, String)> {
        self.schema
            .rows("SELECT resource, saga_id FROM held_locks")
            .into_iter()
            .map(|row| {
                let text = |at: usize| row[at].clone().expect("not NULL");
                (text(0), text(1))
            })
            .collect()
    }
}

fn fresh_store(hold_never: bool) -> Option<PostgresStore> {
    server().map(|server| PostgresStore {
        schema: Schema::create(&server),
        hold_never,
    })
}

agent_kernel_log_contract::contract_tests!(crate::fresh_store(false));

/// The log contract's checks again, every write sending its writes of steps and sagas one by
/// one, as the batches of a refused group are written again: each answer, each refusal and
/// each check is the same.
mod one_by_one {
    agent_kernel_log_contract::contract_tests!(crate::fresh_store(true));
}
