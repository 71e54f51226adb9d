//! The SQL the log's records are written and read with, whatever database holds them.
//!
//! The log's logic (the records of `store`, the audit chain, pruning) is
//! written once, against [`Db`]: this crate implements it on a `rusqlite::Connection`, and
//! a second backend implements it on its own client (PostgreSQL, in
//! `agent-kernel-txlog-postgres`). So both backends apply every [`LogWrite`] with the same
//! checks, the same compare-and-swap conditions and the same audit records.
//!
//! # The dialect
//!
//! Statements use numbered placeholders (`?1`, `?2`, …; a backend whose driver wants
//! another form rewrites them) and only SQL that SQLite and PostgreSQL read the same way:
//! `INSERT … ON CONFLICT … DO UPDATE`, `RETURNING`, `EXISTS`, `LIMIT`, no `IN (…)` lists
//! of parameters, no functions either lacks. Values are integers (64-bit), text, blobs and
//! NULL ([`Value`]); a flag is an integer 0 or 1.
//!
//! [`LogWrite`]: agent_kernel_api::LogWrite

use std::fmt;

/// One value bound to a statement or read from a row, borrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueRef<'a> {
    /// SQL NULL.
    Null,
    /// A 64-bit integer (flags are 0 or 1).
    Integer(i64),
    /// UTF-8 text.
    Text(&'a str),
    /// Bytes.
    Blob(&'a [u8]),
}

/// One value read from a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// SQL NULL.
    Null,
    /// A 64-bit integer (flags are 0 or 1).
    Integer(i64),
    /// UTF-8 text.
    Text(String),
    /// Bytes.
    Blob(Vec<u8>),
}

impl Value {
    fn type_name(&self) -> &'static str {
        match self {
            Value::Null => "NULL",
            Value::Integer(_) => "an integer",
            Value::Text(_) => "text",
            Value::Blob(_) => "a blob",
        }
    }
}

/// What went wrong running a statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// A statement expected to return a row returned none.
    NoRows,
    /// A constraint (unique, check, foreign key, not null) refused the statement.
    Constraint(String),
    /// A column did not hold the type asked for.
    Conversion {
        /// The column's position.
        column: usize,
        /// What was asked for.
        expected: &'static str,
        /// What it held.
        found: &'static str,
    },
    /// Anything else the database reported.
    Database(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NoRows => f.write_str("the query returned no rows"),
            Error::Constraint(message) => write!(f, "constraint failed: {message}"),
            Error::Conversion {
                column,
                expected,
                found,
            } => write!(f, "column {column} holds {found}, not {expected}"),
            Error::Database(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for Error {}

/// A value that can be bound to a statement.
pub trait ToValue {
    /// The value, borrowed from `self`.
    fn to_value(&self) -> ValueRef<'_>;
}

impl<T: ToValue + ?Sized> ToValue for &T {
    fn to_value(&self) -> ValueRef<'_> {
        (**self).to_value()
    }
}

impl<T: ToValue> ToValue for Option<T> {
    fn to_value(&self) -> ValueRef<'_> {
        match self {
            Some(value) => value.to_value(),
            None => ValueRef::Null,
        }
    }
}

impl ToValue for str {
    fn to_value(&self) -> ValueRef<'_> {
        ValueRef::Text(self)
    }
}

impl ToValue for String {
    fn to_value(&self) -> ValueRef<'_> {
        ValueRef::Text(self)
    }
}

impl ToValue for [u8] {
    fn to_value(&self) -> ValueRef<'_> {
        ValueRef::Blob(self)
    }
}

impl ToValue for Vec<u8> {
    fn to_value(&self) -> ValueRef<'_> {
        ValueRef::Blob(self)
    }
}

impl ToValue for i64 {
    fn to_value(&self) -> ValueRef<'_> {
        ValueRef::Integer(*self)
    }
}

impl ToValue for u32 {
    fn to_value(&self) -> ValueRef<'_> {
        ValueRef::Integer(i64::from(*self))
    }
}

impl ToValue for bool {
    fn to_value(&self) -> ValueRef<'_> {
        ValueRef::Integer(i64::from(*self))
    }
}

/// A type a column can be read as.
pub trait FromValue: Sized {
    /// The value, or `None` when the column holds another type.
    fn from_value(value: &Value) -> Option<Self>;
    /// What the type is called in an error.
    const EXPECTED: &'static str;
}

impl<T: FromValue> FromValue for Option<T> {
    fn from_value(value: &Value) -> Option<Self> {
        match value {
            Value::Null => Some(None),
            other => T::from_value(other).map(Some),
        }
    }
    const EXPECTED: &'static str = T::EXPECTED;
}

impl FromValue for String {
    fn from_value(value: &Value) -> Option<Self> {
        match value {
            Value::Text(text) => Some(text.clone()),
            _ => None,
        }
    }
    const EXPECTED: &'static str = "text";
}

impl FromValue for Vec<u8> {
    fn from_value(value: &Value) -> Option<Self> {
        match value {
            Value::Blob(bytes) => Some(bytes.clone()),
            _ => None,
        }
    }
    const EXPECTED: &'static str = "a blob";
}

impl FromValue for i64 {
    fn from_value(value: &Value) -> Option<Self> {
        match value {
            Value::Integer(n) => Some(*n),
            _ => None,
        }
    }
    const EXPECTED: &'static str = "an integer";
}

impl FromValue for u32 {
    fn from_value(value: &Value) -> Option<Self> {
        match value {
            Value::Integer(n) => u32::try_from(*n).ok(),
            _ => None,
        }
    }
    const EXPECTED: &'static str = "an integer from 0 to 4294967295";
}

impl FromValue for bool {
    fn from_value(value: &Value) -> Option<Self> {
        match value {
            Value::Integer(0) => Some(false),
            Value::Integer(1) => Some(true),
            _ => None,
        }
    }
    const EXPECTED: &'static str = "a flag (0 or 1)";
}

/// A column position, as [`Row::get`] takes it.
pub trait ColumnIndex {
    /// The position, from 0.
    fn index(self) -> usize;
}

impl ColumnIndex for usize {
    fn index(self) -> usize {
        self
    }
}

/// One row a query returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    values: Vec<Value>,
}

impl Row {
    /// A row of `values`, in column order (for a backend's implementation of [`Db`]).
    pub fn new(values: Vec<Value>) -> Row {
        Row { values }
    }

    /// Column `idx` as it is (NULL past the last column).
    pub fn value(&self, idx: usize) -> &Value {
        self.values.get(idx).unwrap_or(&Value::Null)
    }

    /// Column `idx`, read as `T`.
    ///
    /// # Errors
    ///
    /// [`Error::Conversion`] when the row has no such column or it holds another type.
    pub fn get<I: ColumnIndex, T: FromValue>(&self, idx: I) -> Result<T, Error> {
        let column = idx.index();
        let value = self.values.get(column).unwrap_or(&Value::Null);
        T::from_value(value).ok_or(Error::Conversion {
            column,
            expected: T::EXPECTED,
            found: value.type_name(),
        })
    }
}

/// A connection (or transaction) the log's statements run on.
///
/// Implementations prepare each distinct statement text once and reuse it.
pub trait Db {
    /// Runs a statement that returns no rows; returns how many rows it changed.
    ///
    /// # Errors
    ///
    /// [`Error`] when the database refused it.
    fn execute(&self, sql: &str, params: &[&dyn ToValue]) -> Result<usize, Error>;

    /// Runs a query and hands each row to `each`, in order, until it answers `false`.
    ///
    /// # Errors
    ///
    /// [`Error`] when the database refused it, or the first error `each` returned.
    fn query_each(
        &self,
        sql: &str,
        params: &[&dyn ToValue],
        each: &mut dyn FnMut(&Row) -> Result<bool, Error>,
    ) -> Result<(), Error>;
}

impl dyn Db + '_ {
    /// The first row `sql` returns, read by `read`.
    ///
    /// # Errors
    ///
    /// [`Error::NoRows`] when it returns none; otherwise as [`Db::query_each`].
    pub fn query_row<T>(
        &self,
        sql: &str,
        params: &[&dyn ToValue],
        read: impl FnOnce(&Row) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let mut read = Some(read);
        let mut found = None;
        self.query_each(sql, params, &mut |row| {
            if let Some(read) = read.take() {
                found = Some(read(row)?);
            }
            Ok(false)
        })?;
        found.ok_or(Error::NoRows)
    }

    /// Every row `sql` returns, each read by `read`.
    ///
    /// # Errors
    ///
    /// As [`Db::query_each`].
    pub fn query_map<T>(
        &self,
        sql: &str,
        params: &[&dyn ToValue],
        mut read: impl FnMut(&Row) -> Result<T, Error>,
    ) -> Result<Vec<T>, Error> {
        let mut all = Vec::new();
        self.query_each(sql, params, &mut |row| {
            all.push(read(row)?);
            Ok(true)
        })?;
        Ok(all)
    }

    /// Whether `sql` returns any row.
    ///
    /// # Errors
    ///
    /// As [`Db::query_each`].
    pub fn exists(&self, sql: &str, params: &[&dyn ToValue]) -> Result<bool, Error> {
        let mut any = false;
        self.query_each(sql, params, &mut |_| {
            any = true;
            Ok(false)
        })?;
        Ok(any)
    }
}

/// `Result<T, Error>` → `Result<Option<T>, Error>`, [`Error::NoRows`] becoming `None`.
pub trait OptionalExtension<T> {
    /// `None` for [`Error::NoRows`].
    ///
    /// # Errors
    ///
    /// Any other error, as it was.
    fn optional(self) -> Result<Option<T>, Error>;
}

impl<T> OptionalExtension<T> for Result<T, Error> {
    fn optional(self) -> Result<Option<T>, Error> {
        match self {
            Ok(value) => Ok(Some(value)),
            Err(Error::NoRows) => Ok(None),
            Err(other) => Err(other),
        }
    }
}

/// The parameters of a statement, in placeholder order: `params![a, b]` is
/// `&[&a as &dyn ToValue, &b as &dyn ToValue]`.
#[macro_export]
macro_rules! params {
    () => { &[] as &[&dyn $crate::sql::ToValue] };
    ($($param:expr),+ $(,)?) => { &[$(&($param) as &dyn $crate::sql::ToValue),+] as &[&dyn $crate::sql::ToValue] };
}

pub use crate::params;

/// [`Db`] on SQLite.
mod sqlite {
    use rusqlite::types::{ToSqlOutput, ValueRef as SqliteRef};

    use super::{Db, Error, Row, ToValue, Value, ValueRef};

    struct Bind<'a>(ValueRef<'a>);

    impl rusqlite::ToSql for Bind<'_> {
        fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
            Ok(ToSqlOutput::Borrowed(match self.0 {
                ValueRef::Null => SqliteRef::Null,
                ValueRef::Integer(n) => SqliteRef::Integer(n),
                ValueRef::Text(text) => SqliteRef::Text(text.as_bytes()),
                ValueRef::Blob(bytes) => SqliteRef::Blob(bytes),
            }))
        }
    }

    fn error(err: rusqlite::Error) -> Error {
        match err {
            rusqlite::Error::QueryReturnedNoRows => Error::NoRows,
            rusqlite::Error::SqliteFailure(code, _)
                if code.code == rusqlite::ErrorCode::ConstraintViolation =>
            {
                Error::Constraint(err.to_string())
            }
            other => Error::Database(other.to_string()),
        }
    }

    fn binds<'a>(params: &'a [&'a dyn ToValue]) -> impl Iterator<Item = Bind<'a>> {
        params.iter().map(|param| Bind(param.to_value()))
    }

    fn row_of(row: &rusqlite::Row<'_>, n_columns: usize) -> Result<Row, Error> {
        let mut values = Vec::with_capacity(n_columns);
        for column in 0..n_columns {
            values.push(match row.get_ref(column).map_err(error)? {
                SqliteRef::Null => Value::Null,
                SqliteRef::Integer(n) => Value::Integer(n),
                SqliteRef::Text(bytes) => Value::Text(
                    String::from_utf8(bytes.to_vec())
                        .map_err(|_| Error::Database(format!("column {column} is not UTF-8")))?,
                ),
                SqliteRef::Blob(bytes) => Value::Blob(bytes.to_vec()),
                SqliteRef::Real(_) => {
                    return Err(Error::Conversion {
                        column,
                        expected: "an integer, text or a blob",
                        found: "a real number",
                    });
                }
            });
        }
        Ok(Row::new(values))
    }

    impl Db for rusqlite::Connection {
        fn execute(&self, sql: &str, params: &[&dyn ToValue]) -> Result<usize, Error> {
            self.prepare_cached(sql)
                .and_then(|mut statement| {
                    statement.execute(rusqlite::params_from_iter(binds(params)))
                })
                .map_err(error)
        }

        fn query_each(
            &self,
            sql: &str,
            params: &[&dyn ToValue],
            each: &mut dyn FnMut(&Row) -> Result<bool, Error>,
        ) -> Result<(), Error> {
            let mut statement = self.prepare_cached(sql).map_err(error)?;
            let n_columns = statement.column_count();
            let mut rows = statement
                .query(rusqlite::params_from_iter(binds(params)))
                .map_err(error)?;
            while let Some(row) = rows.next().map_err(error)? {
                if !each(&row_of(row, n_columns)?)? {
                    break;
                }
            }
            Ok(())
        }
    }

    /// A transaction or savepoint runs the statements of the connection it derefs to.
    macro_rules! delegate_to_connection {
        ($($guard:ty),+) => {$(
            impl Db for $guard {
                fn execute(&self, sql: &str, params: &[&dyn ToValue]) -> Result<usize, Error> {
                    Db::execute(&**self, sql, params)
                }

                fn query_each(
                    &self,
                    sql: &str,
                    params: &[&dyn ToValue],
                    each: &mut dyn FnMut(&Row) -> Result<bool, Error>,
                ) -> Result<(), Error> {
                    Db::query_each(&**self, sql, params, each)
                }
            }
        )+};
    }

    delegate_to_connection!(rusqlite::Transaction<'_>, rusqlite::Savepoint<'_>);
}

/// An SQLite error as the log reports it.
pub(crate) fn storage(err: impl std::fmt::Display) -> agent_kernel_api::TxError {
    agent_kernel_api::TxError::Storage(err.to_string())
}
