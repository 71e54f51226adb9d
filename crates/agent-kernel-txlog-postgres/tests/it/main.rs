//! Integration tests of the PostgreSQL log, on the server `AGENT_KERNEL_TEST_POSTGRES`
//! names (a URL of a database the tests may create schemas in; `.ci/run` starts one).
//! Without it they are skipped, unless `AGENT_KERNEL_TEST_POSTGRES_REQUIRED=1`, when they
//! fail.

mod open;

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};

use agent_kernel_api::{Clock, Durability, TxError, TxLog};
use agent_kernel_txlog::LogOptions;
use agent_kernel_txlog_postgres::PostgresLog;

/// The variable naming the test server.
const SERVER_VARIABLE: &str = "AGENT_KERNEL_TEST_POSTGRES";

pub(crate) struct StepClock(AtomicI64);

impl Clock for StepClock {
    fn now_ms(&self) -> i64 {
        self.0.fetch_add(1, Ordering::Relaxed)
    }
}

/// The test server's URL, or `None` (tests skip) when none is configured.
pub(crate) fn server() -> Option<String> {
    match std::env::var(SERVER_VARIABLE) {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            assert!(
                std::env::var("AGENT_KERNEL_TEST_POSTGRES_REQUIRED").as_deref() != Ok("1"),
                "{SERVER_VARIABLE} is not set, and the PostgreSQL tests are required"
            );
            None
        }
    }
}

/// Runs `job` on a thread of its own: the blocking client must not run inside the test's
/// async runtime.
pub(crate) fn blocking<T: Send>(job: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| scope.spawn(job).join().expect("the job finished"))
}

/// A schema of its own on the test server, dropped with it.
pub(crate) struct Schema {
    server: String,
    name: String,
}

impl Schema {
    /// A new, empty schema.
    pub(crate) fn create(server: &str) -> Schema {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "ak_test_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        blocking(|| {
            let mut client = postgres::Client::connect(server, postgres::NoTls)
                .expect("the test server accepts connections");
            client
                .batch_execute(&format!(
                    "DROP SCHEMA IF EXISTS {name} CASCADE; CREATE SCHEMA {name}"
                ))
                .expect("creates a schema");
        });
        Schema {
            server: server.to_owned(),
            name,
        }
    }

    /// The URL of a connection whose current schema is this one.
    pub(crate) fn url(&self) -> String {
        let separator = if self.server.contains('?') { '&' } else { '?' };
        format!(
            "{}{separator}options=-c%20search_path%3D{}",
            self.server, self.name
        )
    }

    /// Runs `sql` in this schema, on a connection of its own.
    pub(crate) fn execute(&self, sql: &str) {
        let url = self.url();
        blocking(|| {
            postgres::Client::connect(&url, postgres::NoTls)
                .expect("connects")
                .batch_execute(sql)
                .expect("runs");
        });
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        let (server, name) = (&self.server, &self.name);
        blocking(|| {
            if let Ok(mut client) = postgres::Client::connect(server, postgres::NoTls) {
                let _ = client.batch_execute(&format!("DROP SCHEMA IF EXISTS {name} CASCADE"));
            }
        });
    }
}

/// Opens the log in `url` with a stepping clock.
pub(crate) fn open(url: &str) -> Result<PostgresLog, TxError> {
    PostgresLog::open(
        url,
        LogOptions {
            durability: Durability::Full,
            clock: Arc::new(StepClock(AtomicI64::new(1_000))),
        },
        None,
    )
}

/// A fresh schema, for the log contract's checks.
struct PostgresStore {
    schema: Schema,
}

impl agent_kernel_log_contract::LogStore for PostgresStore {
    fn open(&self) -> Arc<dyn TxLog> {
        Arc::new(open(&self.schema.url()).expect("opens"))
    }
}

fn fresh_store() -> Option<PostgresStore> {
    server().map(|server| PostgresStore {
        schema: Schema::create(&server),
    })
}

agent_kernel_log_contract::contract_tests!(crate::fresh_store());
