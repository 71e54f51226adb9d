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

/// The array type of `member`, for the types the store's statements bind.
pub(crate) fn array_of(member: &postgres::types::Type) -> Option<postgres::types::Type> {
    use postgres::types::Type;
    Some(match *member {
        Type::TEXT => Type::TEXT_ARRAY,
        Type::VARCHAR => Type::VARCHAR_ARRAY,
        Type::BPCHAR => Type::BPCHAR_ARRAY,
        Type::NAME => Type::NAME_ARRAY,
        Type::INT8 => Type::INT8_ARRAY,
        Type::INT4 => Type::INT4_ARRAY,
        Type::INT2 => Type::INT2_ARRAY,
        Type::BOOL => Type::BOOL_ARRAY,
        Type::BYTEA => Type::BYTEA_ARRAY,
        _ => return None,
    })
}

/// The statement that does what `sql` does once for each row of its parameters, given as
/// arrays (`$N`, of `types`, the types PostgreSQL inferred for `sql`'s `?N`, named by schema
/// and name): `?N` read from the column `u.pN` of their `unnest`. `None` for a statement of
/// another shape than the four held (`INSERT … VALUES`, `INSERT … SELECT … WHERE`,
/// `UPDATE … WHERE`, `DELETE FROM … WHERE`).
pub(crate) fn bulk_sql(sql: &str, types: &[(String, String)]) -> Option<String> {
    let sql = sql.split_whitespace().collect::<Vec<_>>().join(" ");
    let arrays: Vec<String> = types
        .iter()
        .enumerate()
        .map(|(at, (schema, name))| format!("${}::\"{schema}\".\"{name}\"[]", at + 1))
        .collect();
    let columns: Vec<String> = (1..=types.len()).map(|n| format!("p{n}")).collect();
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

    fn types(n: usize) -> Vec<(String, String)> {
        (0..n)
            .map(|_| ("pg_catalog".to_owned(), "text".to_owned()))
            .collect()
    }

    #[test]
    fn each_kind_has_a_statement_of_arrays() {
        for kind in KINDS {
            let n = kind.sql.matches('?').count();
            let bulk = bulk_sql(kind.sql, &types(n)).expect(kind.sql);
            assert!(!bulk.contains('?'), "{bulk}");
            assert!(bulk.contains("unnest($1::"), "{bulk}");
        }
        assert_eq!(
            bulk_sql("UPDATE t SET a = ?2 WHERE k = ?1 AND s IN ('?')", &types(2))
                .expect("an update"),
            "UPDATE t SET a = u.p2 FROM unnest($1::\"pg_catalog\".\"text\"[], \
             $2::\"pg_catalog\".\"text\"[]) AS u(p1, p2) WHERE k = u.p1 AND s IN ('?')"
        );
        assert_eq!(bulk_sql("SELECT 1", &types(0)), None);
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
}
