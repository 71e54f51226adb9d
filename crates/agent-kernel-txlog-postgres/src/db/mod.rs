//! [`Db`] on a PostgreSQL transaction: the log's statements (written for both backends,
//! with `?N` placeholders) prepared once per connection and bound by the types PostgreSQL
//! infers for them.

use std::cell::{Cell, RefCell, RefMut};
use std::collections::HashMap;
use std::error::Error as StdError;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use agent_kernel_txlog::backend::NEWEST_RECORD_SQL;
use agent_kernel_txlog::sql::{Db, Error, Row, ToValue, Value, ValueRef};

use crate::held::{self, Held};
use bytes::BytesMut;
use postgres::error::{Severity, SqlState};
use postgres::fallible_iterator::FallibleIterator as _;
use postgres::types::{IsNull, ToSql, Type, to_sql_checked};
use postgres::{SimpleQueryMessage, Statement};

use crate::session::Session;

/// The statements prepared on one connection, by their text as the log writes it, and the
/// round trips to the server they made (each prepare, and each statement run).
#[derive(Default)]
pub(crate) struct Statements {
    prepared: RefCell<HashMap<String, Statement>>,
    /// The names of the statements prepared in the session by SQL (`PREPARE`), by the text
    /// the log writes (a held kind's is prepared wrapped, [`held::checked`]): a simple query runs them (`EXECUTE`) with their plans cached,
    /// where a statement written out whole would be parsed and planned each time.
    named: RefCell<HashMap<String, String>>,
    /// What each text the store ran is, once told apart (whether it is [`AUDIT_INSERT`],
    /// the held kind it is): the store runs a few texts many times.
    seen: RefCell<HashMap<String, Seen>>,
    round_trips: Arc<AtomicU64>,
}

/// What a statement's text is, for [`PgDb`] to hold it back or not.
#[derive(Clone, Copy)]
struct Seen {
    audit_insert: bool,
    kind: Option<usize>,
}

impl Statements {
    /// None prepared yet; their round trips added to `round_trips`.
    pub(crate) fn counting(round_trips: Arc<AtomicU64>) -> Statements {
        Statements {
            prepared: RefCell::default(),
            named: RefCell::default(),
            seen: RefCell::default(),
            round_trips,
        }
    }

    /// What `sql` is, told apart once per text.
    fn seen(&self, sql: &str) -> Seen {
        if let Some(seen) = self.seen.borrow().get(sql) {
            return *seen;
        }
        let seen = Seen {
            audit_insert: is_audit_insert(sql),
            kind: held::kind_of(sql),
        };
        self.seen.borrow_mut().insert(sql.to_owned(), seen);
        seen
    }

    fn trip(&self) {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
    }
}

/// Why [`PgDb::flush_and_commit`] did not commit.
#[derive(Debug)]
pub(crate) enum Failed {
    /// Refused before its COMMIT took effect (a held write that did not change the rows
    /// the store was told, a statement the server refused): nothing of it was written.
    Refused(String),
    /// The connection failed or the session ended while it ran, or its answer made no
    /// sense: it may have committed.
    Unknown(String),
}

/// A transaction the log's statements run in.
pub(crate) struct PgDb<'t> {
    tx: RefCell<&'t mut dyn Session>,
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
    /// The answer to [`NEWEST_RECORD_SQL`] read ahead in this transaction
    /// ([`PgDb::knowing_newest`]), for its first statement only.
    newest: RefCell<Option<Vec<Vec<Value>>>>,
    /// The bytes of the values held back since they were last sent ([`PgDb::grown_by`]).
    held_bytes: Cell<usize>,
}

/// The bytes of held values past which they are sent at once, without waiting for the
/// COMMIT: written out as constants they take at most four times as much (a backslash in an
/// array's element), within the 1 GiB the server takes in one message with room to spare.
pub const HELD_BYTES_SENT: usize = 16 * 1024 * 1024;

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

/// How held records are inserted: one row per element of its arrays, prepared in the session
/// under a name and run with the arrays written out as constants.
const AUDIT_INSERT_ARRAYS: &str = "INSERT INTO audit_log (seq, at_ms, kind, saga_id, body, prev_hash, hash, mac) \
     SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::text[], $5::text[], \
                          $6::text[], $7::text[], $8::text[])";

impl HeldRecords {
    /// The arguments of [`AUDIT_INSERT_ARRAYS`] for these records: each column an array of
    /// constants.
    fn arguments(&self) -> Result<String, String> {
        let integers = |column: &[i64]| {
            held::array_literal(column.iter().map(|&n| ValueRef::Integer(n)), &Type::INT8)
        };
        let texts = |column: &[String]| {
            held::array_literal(column.iter().map(|text| ValueRef::Text(text)), &Type::TEXT)
        };
        let optional = |column: &[Option<String>]| {
            held::array_literal(
                column
                    .iter()
                    .map(|text| text.as_deref().map_or(ValueRef::Null, ValueRef::Text)),
                &Type::TEXT,
            )
        };
        Ok(format!(
            "({}, {}, {}, {}, {}, {}, {}, {})",
            integers(&self.seq)?,
            integers(&self.at_ms)?,
            texts(&self.kind)?,
            optional(&self.saga_id)?,
            texts(&self.body)?,
            texts(&self.prev_hash)?,
            texts(&self.hash)?,
            optional(&self.mac)?,
        ))
    }
}

impl<'t> PgDb<'t> {
    pub(crate) fn new(tx: &'t mut dyn Session, statements: &'t Statements) -> Self {
        PgDb::with(tx, statements, None, None)
    }

    /// As [`new`](Self::new), but the chain's records are held back and inserted together:
    /// before any other statement that names `audit_log`, and at [`flush`](Self::flush),
    /// which the caller must run before it commits. One round trip for all of a group's
    /// records instead of one each; the transaction sees them wherever it reads them.
    /// With `rows`, the writes of steps and sagas are held back too ([`held`](crate::held)),
    /// and sent before any other statement: a group of many batches, whose transaction is
    /// tried again item by item when [`flush`](Self::flush) refuses it.
    pub(crate) fn holding(tx: &'t mut dyn Session, statements: &'t Statements, rows: bool) -> Self {
        PgDb::with(
            tx,
            statements,
            Some(HeldRecords::default()),
            rows.then(Held::default),
        )
    }

    /// The one constructor: the audit records and the writes of steps and sagas held back
    /// when `held` and `rows` are given.
    fn with(
        tx: &'t mut dyn Session,
        statements: &'t Statements,
        held: Option<HeldRecords>,
        rows: Option<Held>,
    ) -> Self {
        PgDb {
            tx: RefCell::new(tx),
            statements,
            held: RefCell::new(held),
            rows: RefCell::new(rows),
            poisoned: RefCell::new(None),
            newest: RefCell::new(None),
            held_bytes: Cell::new(0),
        }
    }

    /// Answers the transaction's first statement, when it is [`NEWEST_RECORD_SQL`], with
    /// `rows` instead of asking the server: what the transaction read under the log's write
    /// lock, after which nothing was written ([`begin_write`](crate::connection::begin_write)).
    /// Any other first statement goes to the server, and so does everything after it.
    pub(crate) fn knowing_newest(self, rows: Vec<Vec<Value>>) -> Self {
        *self.newest.borrow_mut() = Some(rows);
        self
    }

    /// Sends what is held back, if anything, in one simple query and one round trip: the
    /// held rows kind by kind (each kind one statement, in the order of its rank, which
    /// fails when it changes other rows than the store was told), then the audit records.
    /// An error when a statement of held rows failed, now or earlier: the transaction must
    /// then be rolled back.
    pub(crate) fn flush(&self) -> Result<(), Error> {
        if let Some(why) = self.poisoned.borrow().as_ref() {
            return Err(Error::Database(why.clone()));
        }
        self.send_held(false).map_err(|failed| {
            let (Failed::Refused(why) | Failed::Unknown(why)) = failed;
            // Never a constraint: the store must not read it as its own statement's.
            let why = format!("{why}; the group is written again item by item");
            *self.poisoned.borrow_mut() = Some(why.clone());
            Error::Database(why)
        })
    }

    /// [`flush`](Self::flush), and the transaction's COMMIT in the same simple query: one
    /// round trip for a group's writes and its commit. A held write whose rows are not what
    /// the store was told fails its statement on the server, so the COMMIT after it never
    /// runs. On a [`WriteTx`], which it ends.
    pub(crate) fn flush_and_commit(&self) -> Result<(), Failed> {
        if let Some(why) = self.poisoned.borrow().as_ref() {
            return Err(Failed::Refused(why.clone()));
        }
        self.send_held(true)
    }

    /// Each held kind's rows as one statement (the store's own, prepared in the session
    /// under a name, for one row; a statement of arrays written out as constants for
    /// several), wrapped so that it fails unless it changed the rows the store was told;
    /// then the held records; then, when it `commits`, COMMIT: all in one simple query.
    fn send_held(&self, commits: bool) -> Result<(), Failed> {
        self.held_bytes.set(0);
        let kinds = match self.rows.borrow_mut().as_mut() {
            Some(held) if !held.is_empty() => held.take(),
            _ => Vec::new(),
        };
        let records = match self.held.borrow_mut().as_mut() {
            Some(held) if !held.seq.is_empty() => Some(std::mem::take(held)),
            _ => None,
        };
        if kinds.is_empty() && records.is_none() && !commits {
            return Ok(());
        }
        let mut query = String::new();
        let mut statements = 0;
        let mut what = Vec::new();
        for (kind, sql, rows) in &kinds {
            let spec = &held::KINDS[*kind];
            let about = format!("{} held writes ({})", rows.len(), spec.sql);
            let refused = |err: String| Failed::Refused(format!("{about}: {err}"));
            let single = self
                .statement(sql)
                .map_err(|err| refused(err.to_string()))?;
            let expected = spec.rows_each.map(|each| each * rows.len() as u64);
            // One row: the store's own statement, prepared in the session, its plan cached.
            // Several: their statement of arrays, planned for its values each time (a plan
            // cached for any values, made while the log was small, would join `saga_steps`
            // by a sequential scan ever after).
            let statement = match &rows[..] {
                [row] => {
                    // Prepared once per kind, whose rows to change are its own.
                    let name = self
                        .named(sql, || match expected {
                            Some(rows) => held::checked(sql, rows),
                            None => sql.clone(),
                        })
                        .map_err(|err| refused(err.to_string()))?;
                    held::execute(&name, single.params(), row)
                }
                _ => held::bulk_with_values(spec.sql, single.params(), rows)
                    .and_then(|bulk| {
                        bulk.ok_or_else(|| format!("no statement of arrays for `{}`", spec.sql))
                    })
                    .map(|bulk| match expected {
                        Some(rows) => held::checked(&bulk, rows),
                        None => bulk,
                    }),
            }
            .map_err(refused)?;
            query.push_str(&statement);
            query.push_str(";\n");
            statements += 1;
            what.push(about);
        }
        if let Some(records) = records {
            let name = self
                .named(AUDIT_INSERT_ARRAYS, || AUDIT_INSERT_ARRAYS.to_owned())
                .map_err(|err| Failed::Refused(format!("the audit records: {err}")))?;
            let arguments = records.arguments().map_err(Failed::Refused)?;
            query.push_str(&format!("EXECUTE {name}{arguments};\n"));
            statements += 1;
            what.push(format!("{} audit records", records.seq.len()));
        }
        if commits {
            // A statement that fails in a transaction already aborted: its COMMIT would
            // answer as a ROLLBACK, which a simple query's answer does not tell apart.
            query.push_str("SELECT 1;\nCOMMIT");
            statements += 2;
            what.push("COMMIT".to_owned());
        }
        self.statements.trip();
        let mut tx = self
            .tx_mut()
            .map_err(|err| Failed::Refused(err.to_string()))?;
        let answers = tx.simple_query(&query).map_err(|err| {
            let why = format!("{}: {}", what.join(", "), describe_error(&err));
            // An error the server reported in its session: that statement failed, and so
            // did the transaction, whose COMMIT (last) never took effect. Anything else (the
            // connection lost, the session ended) may have come after the COMMIT did.
            // The severity as the protocol fixes it, not as the server's language says it.
            match err.as_db_error() {
                Some(db) if db.parsed_severity() == Some(Severity::Error) => Failed::Refused(why),
                _ if !commits => Failed::Refused(why),
                _ => Failed::Unknown(why),
            }
        })?;
        if commits {
            tx.ended();
        }
        let answered = answers
            .iter()
            .filter(|answer| matches!(answer, SimpleQueryMessage::CommandComplete(_)))
            .count();
        if answered != statements {
            // Every statement ran, the COMMIT too: the count is the client's to explain.
            return Err(Failed::Unknown(format!(
                "{statements} statements sent, {answered} answered"
            )));
        }
        Ok(())
    }

    /// Holds back the statement `sql` runs with `params` when rows are held and it is of a
    /// kind that may be; the rows the store expects it to change, if it did.
    fn hold_row(&self, sql: &str, params: &[&dyn ToValue]) -> Result<Option<usize>, Error> {
        let Some(kind) = self
            .rows
            .borrow()
            .as_ref()
            .and_then(|_| self.statements.seen(sql).kind)
        else {
            return Ok(None);
        };
        let values: Vec<ValueRef<'_>> = params.iter().map(|param| param.to_value()).collect();
        let conflicts = self
            .rows
            .borrow()
            .as_ref()
            .is_some_and(|held| held.conflicts(kind, &values));
        if conflicts {
            self.flush()?;
        }
        if let Some(held) = self.rows.borrow_mut().as_mut() {
            held.hold(kind, sql, &values);
        }
        let rows = held::KINDS[kind].rows_each.unwrap_or(0);
        Ok(Some(usize::try_from(rows).unwrap_or(usize::MAX)))
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
    fn tx_mut(&self) -> Result<RefMut<'_, &'t mut dyn Session>, Error> {
        self.tx.try_borrow_mut().map_err(|_| {
            Error::Database("a statement was run while another one's rows were read".to_owned())
        })
    }

    /// Counts what a statement just held back holds, and sends everything held once that
    /// passes [`HELD_BYTES_SENT`]: a query holding every value of a large group, each
    /// written out as a constant, must stay well within what the server takes in one
    /// message.
    fn grown_by(&self, params: &[&dyn ToValue]) -> Result<(), Error> {
        let bytes: usize = params
            .iter()
            .map(|param| match param.to_value() {
                ValueRef::Text(text) => text.len(),
                ValueRef::Blob(bytes) => bytes.len(),
                ValueRef::Integer(_) | ValueRef::Null => 8,
            })
            .sum();
        let held = self.held_bytes.get() + bytes;
        self.held_bytes.set(held);
        if held > HELD_BYTES_SENT {
            return self.flush();
        }
        Ok(())
    }

    /// Holds back the audit record `params` inserts, when records are held; whether it did.
    fn held_back(&self, sql: &str, params: &[&dyn ToValue]) -> Result<bool, Error> {
        let mut held = self.held.borrow_mut();
        let Some(held) = held.as_mut() else {
            return Ok(false);
        };
        if !self.statements.seen(sql).audit_insert {
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

    /// Sends what is held before a statement that is not held: the rows before any (it
    /// may read them or follow them), with the records, which then cost no round trip
    /// more; the records alone only before a statement that reads or writes `audit_log`.
    fn flush_before(&self, sql: &str) -> Result<(), Error> {
        let rows_held = self
            .rows
            .borrow()
            .as_ref()
            .is_some_and(|held| !held.is_empty());
        if rows_held || self.poisoned.borrow().is_some() || sql.contains("audit_log") {
            return self.flush();
        }
        Ok(())
    }

    /// The name the statement `text` gives is prepared under in the session by SQL, for
    /// `EXECUTE`, found by `key`: prepared the first time `key` is asked for on this
    /// connection (a round trip), which a rollback does not undo.
    fn named(&self, key: &str, text: impl FnOnce() -> String) -> Result<String, Error> {
        if let Some(name) = self.statements.named.borrow().get(key) {
            return Ok(name.clone());
        }
        let name = format!("agent_kernel_held_{}", self.statements.named.borrow().len());
        self.statements.trip();
        self.tx_mut()?
            .batch_execute(&format!("PREPARE {name} AS {}", placeholders(&text())))
            .map_err(error)?;
        self.statements
            .named
            .borrow_mut()
            .insert(key.to_owned(), name.clone());
        Ok(name)
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

/// `params` as the client binds them.
fn bound<'p>(params: &'p [&dyn ToValue]) -> Vec<Bind<'p>> {
    params.iter().map(|param| Bind(param.to_value())).collect()
}

impl Db for PgDb<'_> {
    fn execute(&self, sql: &str, params: &[&dyn ToValue]) -> Result<usize, Error> {
        self.newest.borrow_mut().take();
        if self.held_back(sql, params)? {
            self.grown_by(params)?;
            return Ok(1);
        }
        if let Some(rows) = self.hold_row(sql, params)? {
            self.grown_by(params)?;
            return Ok(rows);
        }
        self.flush_before(sql)?;
        let statement = self.statement(sql)?;
        let binds = bound(params);
        let n = self.run(&statement, &binds)?;
        usize::try_from(n).map_err(|_| Error::Database(format!("{n} rows changed")))
    }

    fn query_each(
        &self,
        sql: &str,
        params: &[&dyn ToValue],
        each: &mut dyn FnMut(&Row) -> Result<bool, Error>,
    ) -> Result<(), Error> {
        let newest = self.newest.borrow_mut().take();
        if let Some(rows) = newest
            && sql == NEWEST_RECORD_SQL
            && params.is_empty()
        {
            for row in rows {
                if !each(&Row::new(row))? {
                    break;
                }
            }
            return Ok(());
        }
        self.flush_before(sql)?;
        let statement = self.statement(sql)?;
        let binds = bound(params);
        self.statements.trip();
        let mut tx = self.tx_mut()?;
        let refs: Vec<&(dyn ToSql + Sync)> = binds
            .iter()
            .map(|bind| bind as &(dyn ToSql + Sync))
            .collect();
        let mut rows = tx.query_raw(&statement, &refs).map_err(error)?;
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
mod tests;
