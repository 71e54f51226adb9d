//! Statements a group's write transaction holds back and sends together: the writes every
//! step and saga makes (a saga's and a step's insert, a step's outcome, a saga's state, the
//! release of its locks), one statement of arrays per kind instead of one round trip each.
//!
//! What makes it safe:
//!
//! - **Only what the store does not read back.** A held statement is answered at once with
//!   the rows the store expects it to change ([`Kind::rows_each`]), the only thing the store
//!   reads of it. When the statement of arrays changes another number of rows, or fails, the
//!   transaction is poisoned: it can no longer commit, and its group is written again item by
//!   item, without holding, so each item gets the answer it would have had alone (a step
//!   not in `BEGIN`, a saga that is a dry run).
//! - **The order of a sequence.** Every other statement sends what is held first. Held kinds
//!   are sent in the order of [`Kind::rank`] (a saga before its steps, a step's insert before
//!   its outcome), so a held statement that touches a row a held statement of the same or a
//!   later rank touched sends everything held first: what runs is what one statement after
//!   the other would have done.

use std::collections::HashMap;

use agent_kernel_txlog::sql::{Value, ValueRef};
use postgres::types::Type;

/// A row a held statement reads or writes: its table (or a part of it that other kinds do
/// not touch) and the parameters, numbered from 1, that name the row.
pub(crate) struct RowOf {
    table: &'static str,
    key: &'static [usize],
}

/// A statement that may be held back.
pub(crate) struct Kind {
    /// The statement as the store runs it, its words separated by single spaces.
    pub(crate) sql: &'static str,
    /// Held kinds are sent lowest first.
    pub(crate) rank: u8,
    /// The rows it writes.
    writes: &'static [RowOf],
    /// The rows it reads (a step's saga, which must exist and be no dry run).
    reads: &'static [RowOf],
    /// How many rows each must change for the store to go on as it did; `None` where the
    /// store does not look.
    pub(crate) rows_each: Option<u64>,
}

const SAGA: RowOf = RowOf {
    table: "sagas",
    key: &[1],
};
/// A saga's state: what a saga's insert and its state's update write, and no held kind reads.
const SAGA_STATE: RowOf = RowOf {
    table: "sagas.state",
    key: &[1],
};
const STEP: RowOf = RowOf {
    table: "saga_steps",
    key: &[1, 2],
};

/// A step's outcome, its output or its error in `column` (`store/steps.rs`, `step_outcome`,
/// its guard from `OUTCOME_FROM`).
macro_rules! outcome {
    ($column:literal) => {
        Kind {
            sql: concat!(
                "UPDATE saga_steps SET status = ?3, ",
                $column,
                " = ?4, updated_at_ms = ?5 \
                 WHERE saga_id = ?1 AND step_seq = ?2 AND status IN ('BEGIN')"
            ),
            rank: 2,
            writes: &[STEP],
            reads: &[],
            rows_each: Some(1),
        }
    };
}

/// The kinds held, by the store's text (`store/sagas.rs`, `store/steps.rs`,
/// `store/locks.rs`). A statement whose text changes there is no longer held, and costs a
/// round trip again: `batches_written_at_once_share_one_transaction_and_its_round_trips`
/// counts them.
pub(crate) const KINDS: &[Kind] = &[
    Kind {
        sql: "INSERT INTO sagas (saga_id, name, actor, state, owner_host, owner_boot_id, \
              owner_pid, owner_start_ticks, n_steps, created_at_ms, updated_at_ms, dry_run) \
              VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?10, ?11)",
        rank: 0,
        writes: &[SAGA, SAGA_STATE],
        reads: &[],
        rows_each: Some(1),
    },
    Kind {
        sql: "INSERT INTO saga_steps (saga_id, step_seq, tool_id, tool_version, effect, \
              idempotency_key, args, args_hash, undo, undo_blob, output, status, error, \
              reused_from_saga, reused_from_seq, created_at_ms, updated_at_ms, resources) \
              VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, \
              ?16, ?17)",
        rank: 1,
        writes: &[STEP],
        reads: &[SAGA],
        rows_each: Some(1),
    },
    Kind {
        sql: "INSERT INTO saga_steps (saga_id, step_seq, tool_id, tool_version, effect, \
              idempotency_key, args, args_hash, undo, undo_blob, output, status, error, \
              reused_from_saga, reused_from_seq, created_at_ms, updated_at_ms, resources) \
              SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, \
              ?16, ?17 WHERE EXISTS (SELECT 1 FROM sagas WHERE saga_id = ?1 AND dry_run = 0)",
        rank: 1,
        writes: &[STEP],
        reads: &[SAGA],
        rows_each: Some(1),
    },
    outcome!("output"),
    outcome!("error"),
    Kind {
        sql: "UPDATE sagas SET state = ?2, updated_at_ms = ?3 WHERE saga_id = ?1",
        rank: 3,
        writes: &[SAGA_STATE],
        reads: &[],
        rows_each: Some(1),
    },
    Kind {
        sql: "DELETE FROM locks WHERE saga_id = ?1",
        rank: 4,
        writes: &[RowOf {
            table: "locks",
            key: &[1],
        }],
        reads: &[],
        rows_each: None,
    },
];

/// The kind `sql` is, if it may be held, however its words are spaced.
pub(crate) fn kind_of(sql: &str) -> Option<usize> {
    KINDS
        .iter()
        .position(|kind| sql.split_whitespace().eq(kind.sql.split_whitespace()))
}

/// What a group's transaction holds back: each kind's rows of parameters, and the rows they
/// touch.
#[derive(Default)]
pub(crate) struct Held {
    /// Each kind held, in the order first held: its place in [`KINDS`], its statement as the
    /// store wrote it (the text its prepared statement is kept under), and its rows of
    /// parameters in the order they came.
    kinds: Vec<(usize, String, Vec<Vec<Value>>)>,
    /// Per row touched (its table and key): the highest rank that writes it and that reads it.
    touched: HashMap<String, (Option<u8>, Option<u8>)>,
}

impl Held {
    /// Whether nothing is held.
    pub(crate) fn is_empty(&self) -> bool {
        self.kinds.is_empty()
    }

    /// Whether what is held must be sent before a statement of `kind` with `params` is
    /// held: it touches a row that a held statement of its rank or a later one touched, one
    /// of the two writing it.
    pub(crate) fn conflicts(&self, kind: usize, params: &[ValueRef<'_>]) -> bool {
        let spec = &KINDS[kind];
        let at_or_after = |rank: Option<u8>| rank.is_some_and(|rank| rank >= spec.rank);
        spec.writes.iter().any(|row| {
            self.touched
                .get(&key_of(row, params))
                .is_some_and(|&(write, read)| at_or_after(write) || at_or_after(read))
        }) || spec.reads.iter().any(|row| {
            self.touched
                .get(&key_of(row, params))
                .is_some_and(|&(write, _)| at_or_after(write))
        })
    }

    /// Holds a statement of `kind`, `sql` as the store wrote it, with `params`; the caller
    /// asked [`conflicts`] first.
    ///
    /// [`conflicts`]: Held::conflicts
    pub(crate) fn hold(&mut self, kind: usize, sql: &str, params: &[ValueRef<'_>]) {
        let spec = &KINDS[kind];
        let rank = Some(spec.rank);
        for row in spec.writes {
            let entry = self.touched.entry(key_of(row, params)).or_default();
            entry.0 = entry.0.max(rank);
        }
        for row in spec.reads {
            let entry = self.touched.entry(key_of(row, params)).or_default();
            entry.1 = entry.1.max(rank);
        }
        let row = params.iter().map(|&value| owned(value)).collect();
        match self.kinds.iter_mut().find(|(held, _, _)| *held == kind) {
            Some((_, _, rows)) => rows.push(row),
            None => self.kinds.push((kind, sql.to_owned(), vec![row])),
        }
    }

    /// Everything held: each kind, its statement as the store wrote it, and its rows in the
    /// order they came, the kinds by rank; nothing is held after.
    pub(crate) fn take(&mut self) -> Vec<(usize, String, Vec<Vec<Value>>)> {
        self.touched.clear();
        let mut kinds = std::mem::take(&mut self.kinds);
        kinds.sort_by_key(|(kind, _, _)| KINDS[*kind].rank);
        kinds
    }
}

fn key_of(row: &RowOf, params: &[ValueRef<'_>]) -> String {
    let mut key = row.table.to_owned();
    for &at in row.key {
        key.push('\u{1f}');
        match params.get(at - 1) {
            Some(ValueRef::Text(text)) => key.push_str(text),
            Some(ValueRef::Integer(n)) => key.push_str(&n.to_string()),
            Some(other) => key.push_str(&format!("{other:?}")),
            None => key.push('-'),
        }
    }
    key
}

fn owned(value: ValueRef<'_>) -> Value {
    match value {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(n) => Value::Integer(n),
        ValueRef::Text(text) => Value::Text(text.to_owned()),
        ValueRef::Blob(bytes) => Value::Blob(bytes.to_vec()),
    }
}

/// `value` borrowed.
pub(crate) fn borrowed(value: &Value) -> ValueRef<'_> {
    match value {
        Value::Null => ValueRef::Null,
        Value::Integer(n) => ValueRef::Integer(*n),
        Value::Text(text) => ValueRef::Text(text),
        Value::Blob(bytes) => ValueRef::Blob(bytes),
    }
}

/// The statement that does what `sql` does once for each row of `rows`, whose parameters
/// are of `types` (the types PostgreSQL inferred for `sql`'s `?N`): each `?N` read from the
/// column `u.pN` of an `unnest` of arrays written out as constants, so that the statement
/// needs no parameters and travels with others in one simple query. `None` for a
/// statement of another shape than the four held (`INSERT … VALUES`, `INSERT … SELECT …
/// WHERE`, `UPDATE … WHERE`, `DELETE FROM … WHERE`); an error when a value is not of its
/// column's type.
pub(crate) fn bulk_with_values(
    sql: &str,
    types: &[Type],
    rows: &[Vec<Value>],
) -> Result<Option<String>, String> {
    let arrays = types
        .iter()
        .enumerate()
        .map(|(at, ty)| {
            let values = rows
                .iter()
                .map(|row| row.get(at).map_or(ValueRef::Null, borrowed));
            array_literal(values, ty)
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(bulk_sql(sql, &arrays))
}

/// `sql` wrapped so that it fails unless it changed `rows` rows: its changed rows returned
/// and counted, and a count that differs cast to an integer from a text that says so (the
/// error a simple query then stops at, before anything after it runs).
pub(crate) fn checked(sql: &str, rows: u64) -> String {
    format!(
        "WITH changed AS ({sql} RETURNING 1) \
         SELECT CASE WHEN count(*) = {rows} THEN 0 \
             ELSE CAST('held writes changed ' || count(*) || ' rows, not {rows}' AS integer) \
         END FROM changed"
    )
}

/// `EXECUTE name(…)`: the statement prepared in the session under `name`, whose
/// parameters are of `types`, run with `row`, each value written as a constant. An error
/// when a value is not of its parameter's type.
pub(crate) fn execute(name: &str, types: &[Type], row: &[Value]) -> Result<String, String> {
    let mut out = format!("EXECUTE {name}");
    for (at, ty) in types.iter().enumerate() {
        out.push(if at == 0 { '(' } else { ',' });
        literal(row.get(at).map_or(ValueRef::Null, borrowed), ty, &mut out)?;
    }
    if !types.is_empty() {
        out.push(')');
    }
    Ok(out)
}

/// `values`, of `member`, as one array constant (`E'{…}'::"schema"."name"[]`): each value as
/// the array's text form writes it (text in double quotes, a backslash before each double
/// quote and backslash in it), then the whole as an escape string. One token for the
/// server's parser, however many values.
pub(crate) fn array_literal<'v>(
    values: impl Iterator<Item = ValueRef<'v>>,
    member: &Type,
) -> Result<String, String> {
    let mut out = String::from("E'{");
    for (at, value) in values.enumerate() {
        if at > 0 {
            out.push(',');
        }
        match value {
            ValueRef::Null => out.push_str("NULL"),
            ValueRef::Integer(n) => integer(n, member, &mut out)?,
            ValueRef::Text(text) => {
                checked_text(text, member)?;
                out.push('"');
                // `\\` and `\"` in the array, each backslash doubled in the string.
                escaped(text, &['\\', '\'', '"'], &mut out, |c| match c {
                    '\\' => r"\\\\",
                    '"' => r#"\\""#,
                    _ => "''",
                });
                out.push('"');
            }
            ValueRef::Blob(bytes) => {
                checked_bytes(member)?;
                // The hex's backslash escaped for the array, then for the string.
                out.push_str(r#""\\\\x"#);
                hex(bytes, &mut out);
                out.push('"');
            }
        }
    }
    out.push_str(&format!(
        "}}'::\"{}\".\"{}\"[]",
        member.schema(),
        member.name()
    ));
    Ok(out)
}

/// `value` written as a constant of `ty` onto `out`, as [`Db`](agent_kernel_txlog::sql::Db)
/// binds it: an integer as an integer or a boolean, text as an escape string (`E'…'`, which
/// reads the same whatever `standard_conforming_strings` says), bytes in hex.
pub(crate) fn literal(value: ValueRef<'_>, ty: &Type, out: &mut String) -> Result<(), String> {
    match value {
        ValueRef::Null => out.push_str("NULL"),
        ValueRef::Integer(n) => integer(n, ty, out)?,
        ValueRef::Text(text) => {
            checked_text(text, ty)?;
            text_literal(text, out);
        }
        ValueRef::Blob(bytes) => {
            checked_bytes(ty)?;
            out.push_str(r"E'\\x");
            hex(bytes, out);
            out.push('\'');
        }
    }
    Ok(())
}

/// `n` as `ty` takes it: digits, in its range, or a boolean.
fn integer(n: i64, ty: &Type, out: &mut String) -> Result<(), String> {
    use std::fmt::Write as _;
    let out_of_range = |_| format!("{n} out of range for {ty}");
    match *ty {
        Type::INT8 => {}
        Type::INT4 => {
            i32::try_from(n).map_err(out_of_range)?;
        }
        Type::INT2 => {
            i16::try_from(n).map_err(out_of_range)?;
        }
        Type::BOOL => {
            out.push_str(if n != 0 { "true" } else { "false" });
            return Ok(());
        }
        _ => return Err(format!("an integer where {ty} is expected")),
    }
    let _ = write!(out, "{n}");
    Ok(())
}

/// Refuses text `ty` does not take, and text holding a NUL character: the server refuses it
/// as a bound value too, and a constant holding one would end the query.
fn checked_text(text: &str, ty: &Type) -> Result<(), String> {
    if text.contains('\0') {
        return Err("text holding a NUL character".to_owned());
    }
    match *ty {
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => Ok(()),
        _ => Err(format!("text where {ty} is expected")),
    }
}

/// Refuses bytes where `ty` is not `bytea`.
fn checked_bytes(ty: &Type) -> Result<(), String> {
    match *ty {
        Type::BYTEA => Ok(()),
        _ => Err(format!("bytes where {ty} is expected")),
    }
}

/// `bytes` in hex, two digits each.
fn hex(bytes: &[u8], out: &mut String) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for byte in bytes {
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0xf)]));
    }
}

/// `text` onto `out`, each of `special` written as `escape` says, the runs between copied
/// whole.
fn escaped(text: &str, special: &[char], out: &mut String, escape: fn(char) -> &'static str) {
    let mut rest = text;
    while let Some(at) = rest.find(special) {
        out.push_str(&rest[..at]);
        let c = rest[at..].chars().next().unwrap_or_default();
        out.push_str(escape(c));
        rest = &rest[at + c.len_utf8()..];
    }
    out.push_str(rest);
}

/// `text` as an escape string constant: each backslash and each quote doubled, the only
/// two characters such a constant gives a meaning to.
pub(crate) fn text_literal(text: &str, out: &mut String) {
    out.reserve(text.len() + 3);
    out.push_str("E'");
    escaped(text, &['\\', '\''], out, |c| {
        if c == '\\' { r"\\" } else { "''" }
    });
    out.push('\'');
}

/// The statement that does what `sql` does once for each row of its parameters, given as
/// `arrays` (an array expression per `?N`, in order): `?N` read from the column `u.pN` of
/// their `unnest`. `None` for a statement of another shape than the four held (`INSERT …
/// VALUES`, `INSERT … SELECT … WHERE`, `UPDATE … WHERE`, `DELETE FROM … WHERE`).
pub(crate) fn bulk_sql(sql: &str, arrays: &[String]) -> Option<String> {
    let sql = sql.split_whitespace().collect::<Vec<_>>().join(" ");
    let columns: Vec<String> = (1..=arrays.len()).map(|n| format!("p{n}")).collect();
    let rows = format!("unnest({}) AS u({})", arrays.join(", "), columns.join(", "));
    if let Some(rest) = sql.strip_prefix("DELETE FROM ") {
        let (table, condition) = rest.split_once(" WHERE ")?;
        return Some(format!(
            "DELETE FROM {table} USING {rows} WHERE {}",
            from_rows(condition)
        ));
    }
    if sql.starts_with("UPDATE ") {
        let (head, condition) = sql.split_once(" WHERE ")?;
        return Some(format!(
            "{} FROM {rows} WHERE {}",
            from_rows(head),
            from_rows(condition)
        ));
    }
    if sql.starts_with("INSERT INTO ") {
        if let Some((head, values)) = sql.split_once(" VALUES (") {
            let values = values.strip_suffix(')')?;
            return Some(format!("{head} SELECT {} FROM {rows}", from_rows(values)));
        }
        let (head, select) = sql.split_once(") SELECT ")?;
        let (values, condition) = select.split_once(" WHERE ")?;
        return Some(format!(
            "{head}) SELECT {} FROM {rows} WHERE {}",
            from_rows(values),
            from_rows(condition)
        ));
    }
    None
}

/// `sql` with each `?N` outside string literals read from `u.pN`.
fn from_rows(sql: &str) -> String {
    crate::db::placeholders_as(sql, "u.p")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arrays(n: usize) -> Vec<String> {
        (1..=n).map(|at| format!("${at}::text[]")).collect()
    }

    #[test]
    fn each_kind_has_a_statement_of_arrays() {
        for kind in KINDS {
            let n = kind.sql.matches('?').count();
            let bulk = bulk_sql(kind.sql, &arrays(n)).expect(kind.sql);
            assert!(!bulk.contains('?'), "{bulk}");
            assert!(bulk.contains("unnest($1::"), "{bulk}");
        }
        assert_eq!(
            bulk_sql(
                "UPDATE t SET a = ?2 WHERE k = ?1 AND s IN ('?')",
                &arrays(2)
            )
            .expect("an update"),
            "UPDATE t SET a = u.p2 FROM unnest($1::text[], $2::text[]) AS u(p1, p2) \
             WHERE k = u.p1 AND s IN ('?')"
        );
        assert_eq!(bulk_sql("SELECT 1", &arrays(0)), None);
    }

    #[test]
    fn a_statement_is_held_by_its_text_however_spaced() {
        let spaced = "UPDATE sagas SET state = ?2,\n    updated_at_ms = ?3 WHERE saga_id = ?1";
        assert_eq!(kind_of(spaced).map(|kind| KINDS[kind].rank), Some(3));
        assert_eq!(
            kind_of("UPDATE sagas SET state = ?2 WHERE saga_id = ?1"),
            None
        );
    }

    #[test]
    fn what_would_run_out_of_order_sends_the_held_first() {
        let kind = |sql_start: &str| {
            KINDS
                .iter()
                .position(|kind| kind.sql.starts_with(sql_start))
                .expect(sql_start)
        };
        let (saga, step) = (kind("INSERT INTO sagas"), kind("INSERT INTO saga_steps"));
        let (commit, state) = (kind("UPDATE saga_steps"), kind("UPDATE sagas"));
        let s = |id: &'static str| [ValueRef::Text(id), ValueRef::Integer(1)];
        let mut held = Held::default();
        held.hold(saga, "", &s("a"));
        // A step of the saga after its insert, its outcome after it, the state after both.
        assert!(!held.conflicts(step, &s("a")));
        held.hold(step, "", &s("a"));
        assert!(!held.conflicts(commit, &s("a")));
        held.hold(commit, "", &s("a"));
        assert!(!held.conflicts(state, &s("a")));
        held.hold(state, "", &s("a"));
        // A step begun after its saga's state moved: the state is not what it reads.
        assert!(!held.conflicts(step, &[ValueRef::Text("a"), ValueRef::Integer(2)]));
        // The same step's outcome twice, a saga inserted after a step of it was held, the
        // same row written twice by one kind: each sends the held first.
        assert!(held.conflicts(commit, &s("a")));
        assert!(held.conflicts(step, &s("a")));
        assert!(held.conflicts(state, &s("a")));
        let mut held = Held::default();
        held.hold(step, "", &s("b"));
        assert!(held.conflicts(saga, &s("b")));
        assert!(!held.conflicts(saga, &s("c")));
        let taken = held.take();
        assert_eq!(taken.len(), 1);
        assert!(held.is_empty() && !held.conflicts(saga, &s("b")));
    }

    #[test]
    fn a_text_constant_doubles_backslashes_and_quotes_only() {
        let mut out = String::new();
        text_literal("it's a\\b \u{e9}\n", &mut out);
        assert_eq!(out, "E'it''s a\\\\b \u{e9}\n'");
        let mut out = String::new();
        assert!(literal(ValueRef::Text("a\0b"), &Type::TEXT, &mut out).is_err());
        assert!(literal(ValueRef::Integer(1 << 40), &Type::INT4, &mut out).is_err());
        assert!(literal(ValueRef::Text("1"), &Type::INT8, &mut out).is_err());
        let mut out = String::new();
        literal(ValueRef::Blob(&[0, 0xab]), &Type::BYTEA, &mut out).expect("bytes");
        assert_eq!(out, "E'\\\\x00ab'");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// Whatever a value holds, the server reads its constant back as that value: no
        /// text, however quoted, ends the constant early or changes a byte.
        #[test]
        fn the_server_reads_each_constant_back_as_the_value(
            texts in proptest::collection::vec(
                proptest::option::of("[^\u{0}]{0,40}|[\\\\'\"$;E{},\\- ]{0,12}"),
                1..6,
            ),
            numbers in proptest::collection::vec(proptest::num::i64::ANY, 1..4),
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..24),
        ) {
            use agent_kernel_log_contract::postgres::{blocking, server};
            let Some(server) = server() else { return Ok(()) };
            let values = texts
                .iter()
                .map(|text| text.as_deref().map_or(ValueRef::Null, ValueRef::Text));
            let texts_sql = array_literal(values, &Type::TEXT).expect("texts");
            let numbers_sql =
                array_literal(numbers.iter().map(|&n| ValueRef::Integer(n)), &Type::INT8)
                    .expect("numbers");
            let mut bytes_sql = String::new();
            literal(ValueRef::Blob(&bytes), &Type::BYTEA, &mut bytes_sql).expect("bytes");
            let bytes_array =
                array_literal([ValueRef::Blob(&bytes), ValueRef::Null].into_iter(), &Type::BYTEA)
                    .expect("bytes");
            let query = format!(
                "SELECT t FROM unnest({texts_sql}) WITH ORDINALITY AS u(t, n) ORDER BY n; \
                 SELECT n::text FROM unnest({numbers_sql}) WITH ORDINALITY AS u(n, o) ORDER BY o; \
                 SELECT encode({bytes_sql}::bytea, 'hex'); \
                 SELECT encode(b, 'hex') FROM unnest({bytes_array}) WITH ORDINALITY AS u(b, n) ORDER BY n"
            );
            let read: Vec<Option<String>> = blocking(|| {
                let mut client =
                    postgres::Client::connect(&server, postgres::NoTls).expect("connects");
                client
                    .simple_query(&query)
                    .expect("runs")
                    .iter()
                    .filter_map(|message| match message {
                        postgres::SimpleQueryMessage::Row(row) => {
                            Some(row.get(0).map(str::to_owned))
                        }
                        _ => None,
                    })
                    .collect()
            });
            let hex: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
            let expected: Vec<Option<String>> = texts
                .iter()
                .cloned()
                .chain(numbers.iter().map(|n| Some(n.to_string())))
                .chain([Some(hex.clone()), Some(hex), None])
                .collect();
            proptest::prop_assert_eq!(read, expected);
        }
    }
}
