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
}

impl<'t, 'c> PgDb<'t, 'c> {
    pub(crate) fn new(tx: &'t mut Transaction<'c>, statements: &'t Statements) -> Self {
        PgDb {
            tx: RefCell::new(tx),
            statements,
        }
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

    #[test]
    fn placeholders_are_rewritten_outside_literals_only() {
        assert_eq!(
            placeholders("SELECT '?1' FROM t WHERE a = ?1 AND b = ?12"),
            "SELECT '?1' FROM t WHERE a = $1 AND b = $12"
        );
    }
}
