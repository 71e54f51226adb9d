//! What the log's statements run on ([`Session`]): a transaction of the `postgres` client,
//! the client itself outside any transaction, or a write transaction begun by SQL
//! ([`WriteTx`]), whose BEGIN travels with the statements after it.

use postgres::types::ToSql;
use postgres::{GenericClient, SimpleQueryMessage, Statement};

/// What the log's statements run on: one of the client's transactions
/// ([`postgres::Transaction`]), the client alone (one statement, its own snapshot), or a
/// connection whose write transaction was begun by SQL ([`WriteTx`]).
pub(crate) trait Session {
    fn prepare(&mut self, sql: &str) -> Result<Statement, postgres::Error>;
    fn execute(
        &mut self,
        statement: &Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, postgres::Error>;
    fn query_raw(
        &mut self,
        statement: &Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<postgres::RowIter<'_>, postgres::Error>;
    fn simple_query(&mut self, sql: &str) -> Result<Vec<SimpleQueryMessage>, postgres::Error>;
    fn batch_execute(&mut self, sql: &str) -> Result<(), postgres::Error>;
    /// Told that a statement it ran ended its transaction (a COMMIT sent with others).
    fn ended(&mut self) {}
}

/// [`Session`] for `$type`, run on the [`postgres::GenericClient`] `$this` gives (`$this`
/// being the value itself, or what it wraps), with `$extra` methods besides.
macro_rules! session_of {
    ($type:ty, |$this:ident| $client:expr $(, $($extra:tt)*)?) => {
        impl Session for $type {
            fn prepare(&mut self, sql: &str) -> Result<Statement, postgres::Error> {
                let $this = self;
                GenericClient::prepare($client, sql)
            }
            fn execute(
                &mut self,
                statement: &Statement,
                params: &[&(dyn ToSql + Sync)],
            ) -> Result<u64, postgres::Error> {
                let $this = self;
                GenericClient::execute($client, statement, params)
            }
            fn query_raw(
                &mut self,
                statement: &Statement,
                params: &[&(dyn ToSql + Sync)],
            ) -> Result<postgres::RowIter<'_>, postgres::Error> {
                let $this = self;
                GenericClient::query_raw($client, statement, params.iter().copied())
            }
            fn simple_query(
                &mut self,
                sql: &str,
            ) -> Result<Vec<SimpleQueryMessage>, postgres::Error> {
                let $this = self;
                GenericClient::simple_query($client, sql)
            }
            fn batch_execute(&mut self, sql: &str) -> Result<(), postgres::Error> {
                let $this = self;
                GenericClient::batch_execute($client, sql)
            }
            $($($extra)*)?
        }
    };
}

session_of!(postgres::Transaction<'_>, |this| this);
session_of!(postgres::Client, |this| this);
session_of!(
    WriteTx<'_>,
    |this| this.client,
    fn ended(&mut self) {
        self.open = false;
    }
);

/// A write transaction begun by SQL on a connection, so that its BEGIN travels with the
/// statements after it in one round trip ([`begin_write`](crate::connection::begin_write)):
/// rolled back when dropped before it ended.
pub(crate) struct WriteTx<'c> {
    client: &'c mut postgres::Client,
    /// Whether it may still be open on the server: begun, and neither committed nor
    /// rolled back.
    open: bool,
}

impl<'c> WriteTx<'c> {
    /// A transaction `sql` is about to begin on `client` (its `START TRANSACTION` first):
    /// rolled back when dropped, whether or not `sql` got that far.
    pub(crate) fn beginning(client: &'c mut postgres::Client) -> Self {
        WriteTx { client, open: true }
    }

    /// The connection, inside the transaction.
    pub(crate) fn client(&mut self) -> &mut postgres::Client {
        self.client
    }

    /// Commits it.
    pub(crate) fn commit(mut self) -> Result<(), postgres::Error> {
        // Over whatever the COMMIT answers: a failed COMMIT ends the transaction too.
        self.open = false;
        self.client.batch_execute("COMMIT")
    }
}

impl Drop for WriteTx<'_> {
    fn drop(&mut self) {
        if self.open {
            // The connection's own thread, as every statement of it. A connection that
            // broke has no transaction left to roll back.
            let _ = self.client.batch_execute("ROLLBACK");
        }
    }
}
