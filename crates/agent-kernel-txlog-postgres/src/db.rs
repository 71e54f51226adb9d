//! [`Db`] on a PostgreSQL transaction: the log's statements (written for both backends,
//! with `?N` placeholders) prepared once per connection and bound by the types PostgreSQL
//! infers for them.

use std::cell::RefCell;
use std::collections::HashMap;
use std::error::Error as StdError;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use agent_kernel_txlog::sql::{Db, Error, Row, ToValue, Value, ValueRef};
use bytes::BytesMut;
use postgres::error::SqlState;
use postgres::fallible_iterator::FallibleIterator as _;
use postgres::types::{IsNull, ToSql, Type, to_sql_checked};
use postgres::{Statement, Transaction};

/// The statements prepared on one connection, by their text as the log writes it, and the
/// round trips to the server they made (each prepare, and each statement run).
#[derive(Default)]
pub(crate) struct Statements {
    prepared: RefCell<HashMap<String, Statement>>,
    round_trips: Arc<AtomicU64>,
}

impl Statements {
    /// None prepared yet; their round trips added to `round_trips`.
    pub(crate) fn counting(round_trips: Arc<AtomicU64>) -> Statements {
        Statements {
            prepared: RefCell::default(),
            round_trips,
        }
    }

    fn trip(&self) {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
    }
}

/// A transaction the log's statements run in.
pub(crate) struct PgDb<'t, 'c> {
    tx: RefCell<&'t mut Transaction<'c>>,
    statements: &'t Statements,
    /// Audit records held back, to be inserted together ([`PgDb::holding_audit_records`]);
    /// `None` when each is inserted as it comes.
    held: RefCell<Option<HeldRecords>>,
}

/// Audit records held back, column by column, as the arrays one `INSERT … SELECT FROM
/// unnest(…)` takes.
#[derive(Default)]
struct HeldRecords {
    seq: Vec<i64>,
    at_ms: Vec<i64>,
    kind: Vec<String>,
    saga_id: Vec<Option<String>>,
    body: Vec<String>,
    prev_hash: Vec<String>,
    hash: Vec<String>,
    mac: Vec<Option<String>>,
}

/// How the chain's records are inserted (`audit::Appender`), its words separated by single
/// spaces: the one statement [`PgDb`] holds back. Any other (an `ON CONFLICT`, another
/// column list) runs as it comes.
const AUDIT_INSERT: &str = "INSERT INTO audit_log (seq, at_ms, kind, saga_id, body, prev_hash, hash, mac) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)";

/// Whether `sql` is [`AUDIT_INSERT`], however its words are spaced.
fn is_audit_insert(sql: &str) -> bool {
    sql.split_whitespace().eq(AUDIT_INSERT.split_whitespace())
}

/// The held records, inserted in one statement and one round trip.
const AUDIT_INSERT_HELD: &str =
    "INSERT INTO audit_log (seq, at_ms, kind, saga_id, body, prev_hash, hash, mac)
     SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::text[], $5::text[],
                          $6::text[], $7::text[], $8::text[])";

impl<'t, 'c> PgDb<'t, 'c> {
    pub(crate) fn new(tx: &'t mut Transaction<'c>, statements: &'t Statements) -> Self {
        PgDb {
            tx: RefCell::new(tx),
            statements,
            held: RefCell::new(None),
        }
    }

    /// As [`new`](Self::new), but the chain's records are held back and inserted together:
    /// before any other statement that names `audit_log`, and at [`flush`](Self::flush),
    /// which the caller must run before it commits. One round trip for all of a group's
    /// records instead of one each; the transaction sees them wherever it reads them.
    pub(crate) fn holding_audit_records(
        tx: &'t mut Transaction<'c>,
        statements: &'t Statements,
    ) -> Self {
        PgDb {
            tx: RefCell::new(tx),
            statements,
            held: RefCell::new(Some(HeldRecords::default())),
        }
    }

    /// Inserts the audit records held back, if any.
    pub(crate) fn flush(&self) -> Result<(), Error> {
        let held = match self.held.borrow_mut().as_mut() {
            Some(held) if !held.seq.is_empty() => std::mem::take(held),
            _ => return Ok(()),
        };
        let statement = self.statement(AUDIT_INSERT_HELD)?;
        self.statements.trip();
        self.tx
            .try_borrow_mut()
            .map_err(|_| {
                Error::Database(
                    "records were inserted while a statement's rows were read".to_owned(),
                )
            })?
            .execute(
                &statement,
                &[
                    &held.seq,
                    &held.at_ms,
                    &held.kind,
                    &held.saga_id,
                    &held.body,
                    &held.prev_hash,
                    &held.hash,
                    &held.mac,
                ],
            )
            .map_err(error)?;
        Ok(())
    }

    /// Holds back the audit record `params` inserts, when records are held; whether it did.
    fn held_back(&self, sql: &str, params: &[&dyn ToValue]) -> Result<bool, Error> {
        let mut held = self.held.borrow_mut();
        let Some(held) = held.as_mut() else {
            return Ok(false);
        };
        if !is_audit_insert(sql) {
            return Ok(false);
        }
        let [seq, at_ms, kind, saga_id, body, prev_hash, hash, mac] = params else {
            return Err(Error::Database(format!(
                "an audit record has 8 columns, not {}",
                params.len()
            )));
        };
        let integer = |value: &dyn ToValue| match value.to_value() {
            ValueRef::Integer(n) => Ok(n),
            other => Err(Error::Database(format!(
                "an integer expected, not {other:?}"
            ))),
        };
        let text = |value: &dyn ToValue| match value.to_value() {
            ValueRef::Text(text) => Ok(Some(text.to_owned())),
            ValueRef::Null => Ok(None),
            other => Err(Error::Database(format!("text expected, not {other:?}"))),
        };
        let required = |value: &dyn ToValue| {
            text(value)?.ok_or_else(|| Error::Database("a NULL where text is required".to_owned()))
        };
        held.seq.push(integer(*seq)?);
        held.at_ms.push(integer(*at_ms)?);
        held.kind.push(required(*kind)?);
        held.saga_id.push(text(*saga_id)?);
        held.body.push(required(*body)?);
        held.prev_hash.push(required(*prev_hash)?);
        held.hash.push(required(*hash)?);
        held.mac.push(text(*mac)?);
        Ok(true)
    }

    /// Inserts the held records first when `sql` reads or writes `audit_log`.
    fn flush_before(&self, sql: &str) -> Result<(), Error> {
        if sql.contains("audit_log") {
            self.flush()?;
        }
        Ok(())
    }

    fn statement(&self, sql: &str) -> Result<Statement, Error> {
        if let Some(statement) = self.statements.prepared.borrow().get(sql) {
            return Ok(statement.clone());
        }
        self.statements.trip();
        let statement = self
            .tx
            .try_borrow_mut()
            .map_err(|_| {
                Error::Database(
                    "a statement was prepared while another one's rows were read".to_owned(),
                )
            })?
            .prepare(&placeholders(sql))
            .map_err(error)?;
        self.statements
            .prepared
            .borrow_mut()
            .insert(sql.to_owned(), statement.clone());
        Ok(statement)
    }
}

/// `sql` with `?N` placeholders written as PostgreSQL's `$N` (outside string literals).
pub(crate) fn placeholders(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut in_literal = false;
    for c in sql.chars() {
        match c {
            '\'' => {
                in_literal = !in_literal;
                out.push(c);
            }
            '?' if !in_literal => out.push('$'),
            _ => out.push(c),
        }
    }
    out
}

/// What went wrong, as the server said it (`FATAL 57P01: terminating connection due to
/// administrator command`), or as the client saw it with every cause (`error communicating
/// with the server: Connection reset by peer (os error 104)`); never just `db error`.
pub(crate) fn describe_error(err: &postgres::Error) -> String {
    if let Some(db) = err.as_db_error() {
        let mut message = format!("{} {}: {}", db.severity(), db.code().code(), db.message());
        if let Some(detail) = db.detail() {
            message.push_str(&format!(" ({detail})"));
        }
        return message;
    }
    let mut message = err.to_string();
    let mut cause = StdError::source(err);
    while let Some(inner) = cause {
        let text = inner.to_string();
        if !message.ends_with(&text) {
            message.push_str(&format!(": {text}"));
        }
        cause = inner.source();
    }
    message
}

/// A database error as [`Error`]: constraint violations (class 23) apart.
pub(crate) fn error(err: postgres::Error) -> Error {
    let constraint = err.code().is_some_and(|code| {
        code.code().starts_with("23") || *code == SqlState::INTEGRITY_CONSTRAINT_VIOLATION
    });
    let message = describe_error(&err);
    if constraint {
        Error::Constraint(message)
    } else {
        Error::Database(message)
    }
}

/// One bound value, converted to the type PostgreSQL inferred for its placeholder.
#[derive(Debug)]
struct Bind<'a>(ValueRef<'a>);

impl ToSql for Bind<'_> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn StdError + Sync + Send>> {
        match self.0 {
            ValueRef::Null => Ok(IsNull::Yes),
            ValueRef::Integer(n) => match *ty {
                Type::INT8 => n.to_sql(ty, out),
                Type::INT4 => i32::try_from(n)?.to_sql(ty, out),
                Type::INT2 => i16::try_from(n)?.to_sql(ty, out),
                Type::BOOL => (n != 0).to_sql(ty, out),
                _ => Err(format!("an integer bound where {ty} is expected").into()),
            },
            ValueRef::Text(text) => match *ty {
                Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => {
                    text.to_sql(&Type::TEXT, out)
                }
                _ => Err(format!("text bound where {ty} is expected").into()),
            },
            ValueRef::Blob(bytes) => match *ty {
                Type::BYTEA => bytes.to_sql(ty, out),
                _ => Err(format!("bytes bound where {ty} is expected").into()),
            },
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

/// Column `idx` of `row` as a [`Value`], by its type.
fn value(row: &postgres::Row, idx: usize) -> Result<Value, Error> {
    let ty = row.columns()[idx].type_().clone();
    let conversion = |err: postgres::Error| Error::Database(format!("column {idx}: {err}"));
    Ok(match ty {
        Type::INT8 => row
            .try_get::<_, Option<i64>>(idx)
            .map_err(conversion)?
            .map_or(Value::Null, Value::Integer),
        Type::INT4 => row
            .try_get::<_, Option<i32>>(idx)
            .map_err(conversion)?
            .map_or(Value::Null, |n| Value::Integer(n.into())),
        Type::INT2 => row
            .try_get::<_, Option<i16>>(idx)
            .map_err(conversion)?
            .map_or(Value::Null, |n| Value::Integer(n.into())),
        Type::BOOL => row
            .try_get::<_, Option<bool>>(idx)
            .map_err(conversion)?
            .map_or(Value::Null, |b| Value::Integer(b.into())),
        Type::BYTEA => row
            .try_get::<_, Option<Vec<u8>>>(idx)
            .map_err(conversion)?
            .map_or(Value::Null, Value::Blob),
        _ => row
            .try_get::<_, Option<String>>(idx)
            .map_err(conversion)?
            .map_or(Value::Null, Value::Text),
    })
}

impl Db for PgDb<'_, '_> {
    fn execute(&self, sql: &str, params: &[&dyn ToValue]) -> Result<usize, Error> {
        if self.held_back(sql, params)? {
            return Ok(1);
        }
        self.flush_before(sql)?;
        let statement = self.statement(sql)?;
        let binds: Vec<Bind<'_>> = params.iter().map(|param| Bind(param.to_value())).collect();
        self.statements.trip();
        let refs: Vec<&(dyn ToSql + Sync)> = binds
            .iter()
            .map(|bind| bind as &(dyn ToSql + Sync))
            .collect();
        let n = self
            .tx
            .try_borrow_mut()
            .map_err(|_| {
                Error::Database("a statement was run while another one's rows were read".to_owned())
            })?
            .execute(&statement, &refs)
            .map_err(error)?;
        usize::try_from(n).map_err(|_| Error::Database(format!("{n} rows changed")))
    }

    fn query_each(
        &self,
        sql: &str,
        params: &[&dyn ToValue],
        each: &mut dyn FnMut(&Row) -> Result<bool, Error>,
    ) -> Result<(), Error> {
        self.flush_before(sql)?;
        let statement = self.statement(sql)?;
        let binds: Vec<Bind<'_>> = params.iter().map(|param| Bind(param.to_value())).collect();
        self.statements.trip();
        let mut tx = self.tx.try_borrow_mut().map_err(|_| {
            Error::Database("a statement was run while another one's rows were read".to_owned())
        })?;
        let mut rows = tx.query_raw(&statement, binds.iter()).map_err(error)?;
        let mut wanted = true;
        while let Some(row) = rows.next().map_err(error)? {
            // The rows after the last one wanted are still read to the end: an error the
            // server sends after them must not go unseen (the transaction would then be
            // rolled back while its commit looked successful).
            if !wanted {
                continue;
            }
            let values = (0..row.len())
                .map(|idx| value(&row, idx))
                .collect::<Result<Vec<_>, _>>()?;
            wanted = each(&Row::new(values))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::placeholders;
    use super::{PgDb, Statements};
    use agent_kernel_txlog::sql::{Db, ToValue};

    /// What `audit::Appender` runs for each record.
    const INSERT: &str =
        "INSERT INTO audit_log (seq, at_ms, kind, saga_id, body, prev_hash, hash, mac)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)";

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
        schema.execute(include_str!("schema.sql"));
        let url = schema.url();
        let record = |seq: i64, saga: Option<&str>| {
            let (kind, body, hash) = ("Test", "{}", "h".repeat(64));
            let (at_ms, mac): (i64, Option<&str>) = (7, None);
            let prev: String = "0".repeat(64);
            (
                seq,
                at_ms,
                kind,
                saga.map(str::to_owned),
                body,
                prev,
                hash,
                mac,
            )
        };
        blocking(|| {
            let mut client = postgres::Client::connect(&url, postgres::NoTls).expect("connects");
            let mut tx = client.transaction().expect("begins");
            let statements = Statements::default();
            {
                let db = PgDb::holding_audit_records(&mut tx, &statements);
                for (seq, saga) in [(1, Some("s")), (2, None)] {
                    let (seq, at_ms, kind, saga, body, prev, hash, mac) = record(seq, saga);
                    let params: [&dyn ToValue; 8] =
                        [&seq, &at_ms, &kind, &saga, &body, &prev, &hash, &mac];
                    assert_eq!(db.execute(INSERT, &params).expect("held"), 1);
                }
                let trips = statements
                    .round_trips
                    .load(std::sync::atomic::Ordering::Relaxed);
                assert_eq!(trips, 0, "nothing sent yet");
                // A read of the table inserts them first, in one statement.
                assert_eq!(count(&db), 2);
                let (seq, at_ms, kind, saga, body, prev, hash, mac) = record(3, None);
                let params: [&dyn ToValue; 8] =
                    [&seq, &at_ms, &kind, &saga, &body, &prev, &hash, &mac];
                db.execute(INSERT, &params).expect("held");
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
    fn placeholders_are_rewritten_outside_literals_only() {
        assert_eq!(
            placeholders("SELECT '?1' FROM t WHERE a = ?1 AND b = ?12"),
            "SELECT '?1' FROM t WHERE a = $1 AND b = $12"
        );
    }
}
