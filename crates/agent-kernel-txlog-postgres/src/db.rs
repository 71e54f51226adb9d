//! [`Db`] on a PostgreSQL transaction: the log's statements (written for both backends,
//! with `?N` placeholders) prepared once per connection and bound by the types PostgreSQL
//! infers for them.

use std::cell::RefCell;
use std::collections::HashMap;
use std::error::Error as StdError;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use agent_kernel_txlog::sql::{Db, Error, Row, ToValue, Value, ValueRef};

use crate::held::{self, Held};
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
    /// Audit records held back, to be inserted together ([`PgDb::holding`]); `None` when
    /// each is inserted as it comes.
    held: RefCell<Option<HeldRecords>>,
    /// The rows of steps and sagas held back, to be written one statement per kind
    /// ([`held`](crate::held)); `None` when each statement runs as it comes.
    rows: RefCell<Option<Held>>,
    /// Why a statement of held rows failed or changed other rows than the store was told:
    /// the transaction must not commit ([`PgDb::flush`] says so).
    poisoned: RefCell<Option<String>>,
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
            rows: RefCell::new(None),
            poisoned: RefCell::new(None),
        }
    }

    /// As [`new`](Self::new), but the chain's records are held back and inserted together:
    /// before any other statement that names `audit_log`, and at [`flush`](Self::flush),
    /// which the caller must run before it commits. One round trip for all of a group's
    /// records instead of one each; the transaction sees them wherever it reads them.
    /// With `rows`, the writes of steps and sagas are held back too ([`held`](crate::held)),
    /// and sent before any other statement: a group of many batches, whose transaction is
    /// tried again item by item when [`flush`](Self::flush) refuses it.
    pub(crate) fn holding(
        tx: &'t mut Transaction<'c>,
        statements: &'t Statements,
        rows: bool,
    ) -> Self {
        PgDb {
            tx: RefCell::new(tx),
            statements,
            held: RefCell::new(Some(HeldRecords::default())),
            rows: RefCell::new(rows.then(Held::default)),
            poisoned: RefCell::new(None),
        }
    }

    /// Sends what is held back, if anything: the held rows, kind by kind, then the audit
    /// records. An error when a statement of held rows failed or changed other rows than
    /// the store was told, now or earlier: the transaction must then be rolled back.
    pub(crate) fn flush(&self) -> Result<(), Error> {
        self.flush_rows()?;
        self.flush_records()
    }

    /// Inserts the audit records held back, if any.
    fn flush_records(&self) -> Result<(), Error> {
        let held = match self.held.borrow_mut().as_mut() {
            Some(held) if !held.seq.is_empty() => std::mem::take(held),
            _ => return Ok(()),
        };
        let statement = self.statement(AUDIT_INSERT_HELD)?;
        self.run_refs(
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
        )?;
        Ok(())
    }

    /// Holds back the statement `sql` runs with `params` when rows are held and it is of a
    /// kind that may be; the rows the store expects it to change, if it did.
    fn hold_row(&self, sql: &str, params: &[&dyn ToValue]) -> Result<Option<usize>, Error> {
        let Some(kind) = self.rows.borrow().as_ref().and_then(|_| held::kind_of(sql)) else {
            return Ok(None);
        };
        let values: Vec<ValueRef<'_>> = params.iter().map(|param| param.to_value()).collect();
        let conflicts = self
            .rows
            .borrow()
            .as_ref()
            .is_some_and(|held| held.conflicts(kind, &values));
        if conflicts {
            self.flush_rows()?;
        }
        if let Some(held) = self.rows.borrow_mut().as_mut() {
            held.hold(kind, sql, &values);
        }
        let rows = held::KINDS[kind].rows_each.unwrap_or(0);
        Ok(Some(usize::try_from(rows).unwrap_or(usize::MAX)))
    }

    /// Sends the held rows, a statement per kind, and checks each changed the rows the
    /// store was told; the first failure poisons the transaction.
    fn flush_rows(&self) -> Result<(), Error> {
        if let Some(why) = self.poisoned.borrow().as_ref() {
            return Err(Error::Database(why.clone()));
        }
        let kinds = match self.rows.borrow_mut().as_mut() {
            Some(held) if !held.is_empty() => held.take(),
            _ => return Ok(()),
        };
        for (kind, sql, rows) in kinds {
            if let Err(why) = self.send_held(kind, &sql, &rows) {
                // Never a constraint: the store must not read it as its own statement's.
                let why = format!("{why}; the group is written again item by item");
                *self.poisoned.borrow_mut() = Some(why.clone());
                return Err(Error::Database(why));
            }
        }
        Ok(())
    }

    /// One kind's held rows, in one statement: the store's own (`sql`, as the store wrote
    /// it, prepared under that text already) when there is one row, its statement of arrays
    /// otherwise.
    fn send_held(&self, kind: usize, sql: &str, rows: &[Vec<Value>]) -> Result<(), String> {
        let spec = &held::KINDS[kind];
        let single = self.statement(sql).map_err(|err| err.to_string())?;
        let changed = if let [row] = rows {
            let binds: Vec<Bind<'_>> = row
                .iter()
                .map(|value| Bind(held::borrowed(value)))
                .collect();
            self.run(&single, &binds)
        } else {
            let (types, arrays): (Vec<(String, String)>, Vec<Type>) = single
                .params()
                .iter()
                .map(|ty| {
                    let array = held::array_of(ty)
                        .ok_or_else(|| format!("no array type of {ty} to hold"))?;
                    Ok(((ty.schema().to_owned(), ty.name().to_owned()), array))
                })
                .collect::<Result<Vec<_>, String>>()?
                .into_iter()
                .unzip();
            let bulk = held::bulk_sql(spec.sql, &types)
                .ok_or_else(|| format!("no statement of arrays for `{}`", spec.sql))?;
            let columns: Vec<Vec<Bind<'_>>> = (0..types.len())
                .map(|at| {
                    rows.iter()
                        .map(|row| Bind(row.get(at).map_or(ValueRef::Null, held::borrowed)))
                        .collect()
                })
                .collect();
            self.run_planned(&bulk, &columns, &arrays)
        }
        .map_err(|err| format!("{} held writes ({}): {err}", rows.len(), spec.sql))?;
        if let Some(each) = spec.rows_each {
            let expected = each * rows.len() as u64;
            if changed != expected {
                return Err(format!(
                    "{} held writes changed {changed} rows, not {expected} ({})",
                    rows.len(),
                    spec.sql
                ));
            }
        }
        Ok(())
    }

    /// Runs `sql` with `binds` of `types` as a statement planned for these values (the
    /// unnamed statement, sent with its values in one round trip), never a plan cached for
    /// any values: a statement of arrays joins its rows to a table, and a plan made once,
    /// while the table was small, would scan it whole ever after (a sequential scan of
    /// `saga_steps` for every group's outcomes, slower as the log grows).
    fn run_planned<B: ToSql + Sync>(
        &self,
        sql: &str,
        binds: &[B],
        types: &[Type],
    ) -> Result<u64, Error> {
        let typed: Vec<(&(dyn ToSql + Sync), Type)> = binds
            .iter()
            .zip(types)
            .map(|(bind, ty)| (bind as &(dyn ToSql + Sync), ty.clone()))
            .collect();
        self.statements.trip();
        self.tx_mut()?.execute_typed(sql, &typed).map_err(error)
    }

    /// Runs `statement` with `binds`, a round trip; the rows it changed.
    fn run<B: ToSql + Sync>(&self, statement: &Statement, binds: &[B]) -> Result<u64, Error> {
        let refs: Vec<&(dyn ToSql + Sync)> = binds
            .iter()
            .map(|bind| bind as &(dyn ToSql + Sync))
            .collect();
        self.run_refs(statement, &refs)
    }

    /// Runs `statement` with `params`, a round trip; the rows it changed.
    fn run_refs(
        &self,
        statement: &Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, Error> {
        self.statements.trip();
        self.tx_mut()?.execute(statement, params).map_err(error)
    }

    /// The transaction, to run a statement on: refused while another statement's rows are
    /// still being read from it.
    fn tx_mut(&self) -> Result<std::cell::RefMut<'_, &'t mut Transaction<'c>>, Error> {
        self.tx.try_borrow_mut().map_err(|_| {
            Error::Database("a statement was run while another one's rows were read".to_owned())
        })
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

    /// Sends the held rows before any statement, and the held records first when `sql`
    /// reads or writes `audit_log`.
    fn flush_before(&self, sql: &str) -> Result<(), Error> {
        self.flush_rows()?;
        if sql.contains("audit_log") {
            self.flush_records()?;
        }
        Ok(())
    }

    fn statement(&self, sql: &str) -> Result<Statement, Error> {
        if let Some(statement) = self.statements.prepared.borrow().get(sql) {
            return Ok(statement.clone());
        }
        self.statements.trip();
        let statement = self.tx_mut()?.prepare(&placeholders(sql)).map_err(error)?;
        self.statements
            .prepared
            .borrow_mut()
            .insert(sql.to_owned(), statement.clone());
        Ok(statement)
    }
}

/// `sql` with `?N` placeholders written as PostgreSQL's `$N` (outside string literals).
pub(crate) fn placeholders(sql: &str) -> String {
    placeholders_as(sql, "$")
}

/// `sql` with the `?` of each `?N` placeholder outside string literals written as `prefix`.
pub(crate) fn placeholders_as(sql: &str, prefix: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 16);
    let mut in_literal = false;
    for c in sql.chars() {
        match c {
            '\'' => {
                in_literal = !in_literal;
                out.push(c);
            }
            '?' if !in_literal => out.push_str(prefix),
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
        if let Some(rows) = self.hold_row(sql, params)? {
            return Ok(rows);
        }
        self.flush_before(sql)?;
        let statement = self.statement(sql)?;
        let binds: Vec<Bind<'_>> = params.iter().map(|param| Bind(param.to_value())).collect();
        let n = self.run(&statement, &binds)?;
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
        let mut tx = self.tx_mut()?;
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
                let db = PgDb::holding(&mut tx, &statements, false);
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
    /// transaction holding rows, and `bad` (if any) applied among them; what `flush` says
    /// and the round trips of the transaction's statements (the chain's first read and the
    /// statements prepared excepted: all are prepared by a first round).
    fn group(
        client: &mut postgres::Client,
        statements: &Statements,
        round: &str,
        sagas: usize,
        bad: Option<&[agent_kernel_api::LogWrite]>,
    ) -> (Result<(), super::Error>, u64) {
        use agent_kernel_api::SagaState;
        use agent_kernel_log_contract::records::{begin, commit, new_saga, set_state};
        use agent_kernel_txlog::backend::{Chain, LockMap, apply_batch};
        use std::sync::atomic::Ordering::Relaxed;
        let mut tx = client.transaction().expect("begins");
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
        let flushed = db.flush();
        let trips = statements.round_trips.load(Relaxed) - before;
        drop(db);
        if flushed.is_ok() {
            tx.commit().expect("commits");
        }
        (flushed, trips)
    }

    #[test]
    fn a_groups_writes_of_each_kind_take_one_round_trip_whatever_their_number() {
        use agent_kernel_log_contract::postgres::blocking;
        let Some(schema) = fresh_log() else { return };
        let url = schema.url();
        blocking(|| {
            let mut client = postgres::Client::connect(&url, postgres::NoTls).expect("connects");
            let statements = Statements::default();
            // The first prepares every statement.
            assert!(group(&mut client, &statements, "a", 2, None).0.is_ok());
            let (few, trips_few) = group(&mut client, &statements, "b", 3, None);
            let (many, trips_many) = group(&mut client, &statements, "c", 40, None);
            assert!(few.is_ok() && many.is_ok(), "{few:?} {many:?}");
            // A saga's insert, a step's, its outcome, the state, the locks' release and the
            // audit records: a statement each.
            assert_eq!((trips_few, trips_many), (6, 6));
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
            let mut client = postgres::Client::connect(&url, postgres::NoTls).expect("connects");
            let statements = Statements::default();
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
                let (flushed, _) = group(&mut client, &statements, "d", 4, Some(&bad));
                // Never a constraint, which the store might read as its own statement's.
                let Err(super::Error::Database(error)) = flushed else {
                    panic!("refused as a database error: {flushed:?}");
                };
                assert!(error.contains("written again item by item"), "{error}");
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
            let mut client = postgres::Client::connect(&url, postgres::NoTls).expect("connects");
            let statements = Statements::default();
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
}
