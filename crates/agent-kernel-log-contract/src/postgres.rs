//! A PostgreSQL server for tests: the one `AGENT_KERNEL_TEST_POSTGRES` names (a URL of a
//! database the tests may create schemas in; `.ci/run` starts one with
//! `tests/postgres/server.sh`), and a fresh schema on it per test. Without the variable
//! the tests that need it skip, unless `AGENT_KERNEL_TEST_POSTGRES_REQUIRED=1`, when they
//! fail.

use std::sync::atomic::{AtomicU32, Ordering};

/// The variable naming the test server.
pub const SERVER_VARIABLE: &str = "AGENT_KERNEL_TEST_POSTGRES";

/// The test server's URL, or `None` (tests skip) when none is configured.
pub fn server() -> Option<String> {
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
pub fn blocking<T: Send>(job: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| scope.spawn(job).join().expect("the job finished"))
}

/// A schema of its own on the test server, dropped with it.
pub struct Schema {
    server: String,
    name: String,
}

impl Schema {
    /// A new, empty schema.
    pub fn create(server: &str) -> Schema {
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
    pub fn url(&self) -> String {
        self.url_behind(None)
    }

    /// The URL of a connection whose `search_path` names `ahead` first, then this schema:
    /// its current schema is `ahead` whenever that schema exists.
    pub fn url_behind(&self, ahead: Option<&Schema>) -> String {
        let separator = if self.server.contains('?') { '&' } else { '?' };
        let path = match ahead {
            Some(ahead) => format!("{}%2C{}", ahead.name, self.name),
            None => self.name.clone(),
        };
        format!(
            "{}{separator}options=-c%20search_path%3D{path}",
            self.server
        )
    }

    /// Drops the schema and everything in it now (it is dropped again, if it exists, with
    /// the value).
    pub fn drop_now(&self) {
        let (server, name) = (&self.server, &self.name);
        blocking(|| {
            postgres::Client::connect(server, postgres::NoTls)
                .expect("connects")
                .batch_execute(&format!("DROP SCHEMA IF EXISTS {name} CASCADE"))
                .expect("drops");
        });
    }

    /// Creates the schema again, empty, after [`drop_now`](Self::drop_now).
    pub fn create_again(&self) {
        let (server, name) = (&self.server, &self.name);
        blocking(|| {
            postgres::Client::connect(server, postgres::NoTls)
                .expect("connects")
                .batch_execute(&format!("CREATE SCHEMA {name}"))
                .expect("creates");
        });
    }

    /// Runs `sql` in this schema, on a connection of its own.
    pub fn execute(&self, sql: &str) {
        let url = self.url();
        blocking(|| {
            postgres::Client::connect(&url, postgres::NoTls)
                .expect("connects")
                .batch_execute(sql)
                .expect("runs");
        });
    }
}

impl Schema {
    /// The rows `sql` returns in this schema, every column read as text (cast them with
    /// `::text`), NULL as `None`.
    pub fn rows(&self, sql: &str) -> Vec<Vec<Option<String>>> {
        let url = self.url();
        blocking(|| {
            postgres::Client::connect(&url, postgres::NoTls)
                .expect("connects")
                .query(sql, &[])
                .expect("queries")
                .iter()
                .map(|row| (0..row.len()).map(|idx| row.get(idx)).collect())
                .collect()
        })
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
