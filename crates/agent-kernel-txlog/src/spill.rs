//! [`Spill`]: a map that keeps at most a named number of entries in memory and moves the
//! oldest to a scratch SQLite database on disk, so that `verify`'s replay of a log holds a
//! bounded amount in memory whatever the log's size.
//!
//! Every entry lives in exactly one place: in memory (the hot part) or in the scratch
//! database (the cold part). Reading a cold entry for a change moves it back into memory;
//! reading it only (the comparison with the tables) does not.

use std::borrow::Cow;
use std::cell::Cell;
use std::collections::{BTreeSet, HashMap};
use std::fmt;

use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Most entries one map of `verify`'s replay keeps in memory; at this size it moves the
/// older half to the scratch database. Measured in BENCHMARK.md: `audit verify` of a log
/// of a million steps peaks under 90 MiB at this bound, and logs of fewer entries never
/// touch the disk.
pub const VERIFY_ENTRIES_IN_MEMORY_MAX: usize = 16_384;

/// The scratch database's page cache, in KiB (what it may hold in memory before it
/// writes pages to its file).
pub(crate) const SCRATCH_CACHE_KIB: i64 = 8 * 1024;

/// Prepared statements the scratch database keeps: more than the maps use in all.
const SCRATCH_STATEMENTS_MAX: usize = 64;

/// An entry's key: an id and a number within it (a step's `(saga_id, step_seq)`; `0` for
/// maps keyed by one id).
pub(crate) type Key = (String, i64);

/// What a [`Spill`] holds.
pub(crate) trait Entry: Serialize + DeserializeOwned {
    /// The saga the entry under `key` belongs to, by which [`Spill::remove_groups`]
    /// removes it: the key's id unless the entry says otherwise.
    fn group<'a>(&'a self, key: &'a Key) -> &'a str {
        &key.0
    }

    /// Whether the entry keeps its saga from being pruned (an open dead letter, a pending
    /// or approved request), for [`Spill::open_groups`].
    fn open(&self) -> bool {
        false
    }
}

/// Why the scratch database failed: its file or its encoding, never the log.
#[derive(Debug)]
pub(crate) struct Error(String);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "verify's scratch database failed: {}", self.0)
    }
}

impl From<rusqlite::Error> for Error {
    fn from(err: rusqlite::Error) -> Error {
        Error(err.to_string())
    }
}

impl From<Error> for String {
    fn from(err: Error) -> String {
        err.to_string()
    }
}

impl From<serde_json::Error> for Error {
    fn from(err: serde_json::Error) -> Error {
        Error(format!("an entry does not encode: {err}"))
    }
}

/// The scratch database every [`Spill`] of one replay shares: a private temporary file
/// that SQLite deletes when it is closed, opened at the first spill.
#[derive(Default)]
pub(crate) struct Scratch {
    conn: Option<Connection>,
    /// The first failure [`Scratch::noted`] saw.
    failure: Cell<Option<String>>,
}

impl Scratch {
    /// `result`, its error noted as the replay's failure: the caller reports it as the
    /// scratch database's, never as the log's.
    pub(crate) fn noted<T>(&self, result: Result<T, Error>) -> Result<T, String> {
        result.map_err(|err| self.note(&err))
    }

    /// Notes `err` as the replay's failure (unless one came first); its message.
    pub(crate) fn note(&self, err: &Error) -> String {
        let message = err.to_string();
        let first = self.failure.take().unwrap_or_else(|| message.clone());
        self.failure.set(Some(first));
        message
    }

    /// The first failure noted, if any.
    pub(crate) fn failure(&self) -> Option<String> {
        let failure = self.failure.take();
        self.failure.set(failure.clone());
        failure
    }

    /// The database, which holds the entries on disk: opened when the first moved there.
    fn opened(&self) -> &Connection {
        self.conn
            .as_ref()
            .expect("a map with entries on disk has a scratch database")
    }

    fn open(&mut self) -> Result<&Connection, Error> {
        if self.conn.is_none() {
            // An empty name: a private on-disk database, deleted when closed.
            let conn = Connection::open("")?;
            conn.execute_batch(&format!(
                "PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF;
                 PRAGMA temp_store = FILE; PRAGMA cache_size = -{SCRATCH_CACHE_KIB};"
            ))?;
            // Every statement of every map stays prepared.
            conn.set_prepared_statement_cache_capacity(SCRATCH_STATEMENTS_MAX);
            self.conn = Some(conn);
        }
        Ok(self.conn.as_ref().expect("opened above"))
    }
}

/// A map of [`Entry`] values under [`Key`]s, at most `hot_max` of them in memory.
pub(crate) struct Spill<V> {
    /// Its table in the scratch database.
    table: &'static str,
    sql: Statements,
    /// Entries in memory, each with the ticket of its arrival (oldest leave first).
    hot: HashMap<Key, (u64, V)>,
    next_ticket: u64,
    hot_max: usize,
    /// Entries in the scratch database.
    n_cold: usize,
    created: bool,
}

/// The statements of one map's table, written once.
struct Statements {
    exists: String,
    get: String,
    take: String,
    insert: String,
    delete_group: String,
    open_groups: String,
    of_group: String,
    all: String,
}

impl Statements {
    fn of(table: &str) -> Statements {
        Statements {
            exists: format!("SELECT 1 FROM {table} WHERE id = ?1 AND sub = ?2"),
            get: format!("SELECT value FROM {table} WHERE id = ?1 AND sub = ?2"),
            take: format!("DELETE FROM {table} WHERE id = ?1 AND sub = ?2 RETURNING value"),
            insert: format!(
                "INSERT INTO {table} (id, sub, grp, open, value) VALUES (?1, ?2, ?3, ?4, ?5)"
            ),
            delete_group: format!("DELETE FROM {table} WHERE grp = ?1"),
            open_groups: format!("SELECT DISTINCT grp FROM {table} WHERE open = 1"),
            of_group: format!("SELECT id, sub, value FROM {table} WHERE grp = ?1"),
            // The order of `Key`: SQLite compares text as bytes, as Rust compares `String`.
            all: format!("SELECT id, sub, value FROM {table} ORDER BY id, sub"),
        }
    }
}

impl<V: Entry> Spill<V> {
    /// An empty map whose spilled entries go to `table`.
    pub(crate) fn new(table: &'static str, hot_max: usize) -> Spill<V> {
        Spill {
            table,
            sql: Statements::of(table),
            hot: HashMap::new(),
            next_ticket: 0,
            hot_max: hot_max.max(1),
            n_cold: 0,
            created: false,
        }
    }

    /// How many entries it holds.
    pub(crate) fn len(&self) -> usize {
        self.hot.len() + self.n_cold
    }

    /// The entry under `key`, without moving it.
    pub(crate) fn get(&self, scratch: &Scratch, key: &Key) -> Result<Option<Cow<'_, V>>, Error>
    where
        V: Clone,
    {
        if let Some((_, value)) = self.hot.get(key) {
            return Ok(Some(Cow::Borrowed(value)));
        }
        Ok(self.cold_get(scratch, key)?.map(Cow::Owned))
    }

    /// Whether an entry is under `key`.
    pub(crate) fn contains(&self, scratch: &Scratch, key: &Key) -> Result<bool, Error> {
        if self.hot.contains_key(key) {
            return Ok(true);
        }
        if self.n_cold == 0 {
            return Ok(false);
        }
        let conn = scratch.opened();
        Ok(conn
            .prepare_cached(&self.sql.exists)?
            .query_row(params![key.0, key.1], |_| Ok(()))
            .optional()?
            .is_some())
    }

    /// The entry under `key`, to change: a cold one moves into memory.
    pub(crate) fn get_mut(
        &mut self,
        scratch: &mut Scratch,
        key: &Key,
    ) -> Result<Option<&mut V>, Error> {
        if !self.hot.contains_key(key) {
            let Some(value) = self.cold_take(scratch, key)? else {
                return Ok(None);
            };
            self.put_hot(scratch, key.clone(), value)?;
        }
        Ok(self.hot.get_mut(key).map(|(_, value)| value))
    }

    /// Puts `value` under `key`, replacing what was there.
    pub(crate) fn insert(
        &mut self,
        scratch: &mut Scratch,
        key: Key,
        value: V,
    ) -> Result<(), Error> {
        if let Some((_, held)) = self.hot.get_mut(&key) {
            *held = value;
            return Ok(());
        }
        self.cold_take(scratch, &key)?;
        self.put_hot(scratch, key, value)
    }

    /// Puts `value` under `key`, which the caller found empty ([`Spill::contains`]):
    /// [`Spill::insert`] without looking on disk for an entry to replace.
    pub(crate) fn insert_absent(
        &mut self,
        scratch: &mut Scratch,
        key: Key,
        value: V,
    ) -> Result<(), Error> {
        debug_assert!(!self.hot.contains_key(&key));
        self.put_hot(scratch, key, value)
    }

    /// Removes the entry under `key`, if any.
    pub(crate) fn remove(&mut self, scratch: &mut Scratch, key: &Key) -> Result<(), Error> {
        if self.hot.remove(key).is_none() {
            self.cold_take(scratch, key)?;
        }
        Ok(())
    }

    /// Removes every entry whose group is one of `groups` (sorted).
    pub(crate) fn remove_groups(
        &mut self,
        scratch: &mut Scratch,
        groups: &[String],
    ) -> Result<(), Error> {
        self.hot.retain(|key, (_, value)| {
            groups
                .binary_search_by(|group| group.as_str().cmp(value.group(key)))
                .is_err()
        });
        if self.n_cold > 0 {
            let conn = scratch.open()?;
            let mut delete = conn.prepare_cached(&self.sql.delete_group)?;
            for group in groups {
                self.n_cold -= delete.execute(params![group])?;
            }
        }
        Ok(())
    }

    /// The groups of every [`Entry::open`] entry.
    pub(crate) fn open_groups(&self, scratch: &Scratch) -> Result<BTreeSet<String>, Error> {
        let mut groups: BTreeSet<String> = self
            .hot
            .iter()
            .filter(|(_, (_, value))| value.open())
            .map(|(key, (_, value))| value.group(key).to_owned())
            .collect();
        if self.n_cold > 0 {
            let conn = scratch.opened();
            let mut select = conn.prepare_cached(&self.sql.open_groups)?;
            let mut rows = select.query([])?;
            while let Some(row) = rows.next()? {
                groups.insert(row.get(0)?);
            }
        }
        Ok(groups)
    }

    /// Every entry of `group`, in no particular order.
    pub(crate) fn group_entries(
        &self,
        scratch: &Scratch,
        group: &str,
    ) -> Result<Vec<(Key, V)>, Error>
    where
        V: Clone,
    {
        let mut found: Vec<(Key, V)> = self
            .hot
            .iter()
            .filter(|(key, (_, value))| value.group(key) == group)
            .map(|(key, (_, value))| (key.clone(), value.clone()))
            .collect();
        if self.n_cold > 0 {
            let conn = scratch.opened();
            let mut select = conn.prepare_cached(&self.sql.of_group)?;
            let mut rows = select.query(params![group])?;
            while let Some(row) = rows.next()? {
                let value: Vec<u8> = row.get(2)?;
                found.push(((row.get(0)?, row.get(1)?), serde_json::from_slice(&value)?));
            }
        }
        Ok(found)
    }

    /// Calls `each` with every entry, in the order of their keys (whatever is in memory and
    /// on disk, so the walk is the same whatever the bound); stops at its first error.
    pub(crate) fn for_each<E: From<Error>>(
        &self,
        scratch: &Scratch,
        each: &mut dyn FnMut(&Key, &V) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut hot: Vec<(&Key, &V)> = self
            .hot
            .iter()
            .map(|(key, (_, value))| (key, value))
            .collect();
        hot.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let mut hot = hot.into_iter().peekable();
        if self.n_cold > 0 {
            let conn = scratch.opened();
            let mut select = conn.prepare_cached(&self.sql.all).map_err(Error::from)?;
            let mut rows = select.query([]).map_err(Error::from)?;
            while let Some(row) = rows.next().map_err(Error::from)? {
                let key: Key = (
                    row.get(0).map_err(Error::from)?,
                    row.get(1).map_err(Error::from)?,
                );
                // Memory and disk never hold one key both: the smaller goes first.
                while let Some((hot_key, value)) = hot.next_if(|(hot_key, _)| **hot_key < key) {
                    each(hot_key, value)?;
                }
                let value: Vec<u8> = row.get(2).map_err(Error::from)?;
                let value: V = serde_json::from_slice(&value).map_err(Error::from)?;
                each(&key, &value)?;
            }
        }
        for (key, value) in hot {
            each(key, value)?;
        }
        Ok(())
    }

    /// Takes `value` into memory, first moving the older half out when memory is full.
    fn put_hot(&mut self, scratch: &mut Scratch, key: Key, value: V) -> Result<(), Error> {
        if self.hot.len() >= self.hot_max {
            self.spill_oldest(scratch)?;
        }
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.hot.insert(key, (ticket, value));
        Ok(())
    }

    /// Moves the older half of the entries in memory (at least one) to the scratch
    /// database, in one transaction, in the order of their keys (ids that grow with time,
    /// as saga ids do, then append to its tables).
    fn spill_oldest(&mut self, scratch: &mut Scratch) -> Result<(), Error> {
        let mut tickets: Vec<u64> = self.hot.values().map(|(ticket, _)| *ticket).collect();
        let n_out = (self.hot.len() / 2).max(1);
        let (_, cut, _) = tickets.select_nth_unstable(n_out - 1);
        let cut = *cut;
        let mut leaving: Vec<Key> = self
            .hot
            .iter()
            .filter(|(_, (ticket, _))| *ticket <= cut)
            .map(|(key, _)| key.clone())
            .collect();
        leaving.sort_unstable();
        let conn = scratch.open()?;
        if !self.created {
            conn.execute_batch(&format!(
                "CREATE TABLE {table} (id TEXT NOT NULL, sub INTEGER NOT NULL,
                     grp TEXT NOT NULL, open INTEGER NOT NULL, value BLOB NOT NULL,
                     PRIMARY KEY (id, sub)) WITHOUT ROWID;
                 CREATE INDEX {table}_grp ON {table} (grp);
                 CREATE INDEX {table}_open ON {table} (grp) WHERE open = 1;",
                table = self.table
            ))?;
            self.created = true;
        }
        let tx = conn.unchecked_transaction()?;
        {
            let mut insert = tx.prepare_cached(&self.sql.insert)?;
            let mut bytes = Vec::new();
            for key in &leaving {
                let (_, value) = &self.hot[key];
                bytes.clear();
                serde_json::to_writer(&mut bytes, value)?;
                insert.execute(params![key.0, key.1, value.group(key), value.open(), bytes])?;
            }
        }
        tx.commit()?;
        // Only once they are all on disk do they leave memory.
        for key in &leaving {
            self.hot.remove(key);
        }
        self.n_cold += leaving.len();
        Ok(())
    }

    fn cold_get(&self, scratch: &Scratch, key: &Key) -> Result<Option<V>, Error> {
        if self.n_cold == 0 {
            return Ok(None);
        }
        let conn = scratch.opened();
        let bytes: Option<Vec<u8>> = conn
            .prepare_cached(&self.sql.get)?
            .query_row(params![key.0, key.1], |row| row.get(0))
            .optional()?;
        Ok(match bytes {
            Some(bytes) => Some(serde_json::from_slice(&bytes)?),
            None => None,
        })
    }

    /// Removes the cold entry under `key` and returns it.
    fn cold_take(&mut self, scratch: &mut Scratch, key: &Key) -> Result<Option<V>, Error> {
        if self.n_cold == 0 {
            return Ok(None);
        }
        let conn = scratch.open()?;
        let bytes: Option<Vec<u8>> = conn
            .prepare_cached(&self.sql.take)?
            .query_row(params![key.0, key.1], |row| row.get(0))
            .optional()?;
        match bytes {
            Some(bytes) => {
                self.n_cold -= 1;
                Ok(Some(serde_json::from_slice(&bytes)?))
            }
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::Deserialize;

    use super::*;

    /// An entry of a group, open or not.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    struct Item {
        group: String,
        open: bool,
        n: u64,
    }

    impl Entry for Item {
        fn group<'a>(&'a self, _: &'a Key) -> &'a str {
            &self.group
        }

        fn open(&self) -> bool {
            self.open
        }
    }

    /// SplitMix64: a failing seed reproduces.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            (z ^ (z >> 31)) % n
        }
    }

    fn everything(spill: &Spill<Item>, scratch: &Scratch) -> BTreeMap<Key, Item> {
        let mut all = BTreeMap::new();
        let mut last: Option<Key> = None;
        spill
            .for_each::<Error>(scratch, &mut |key, value| {
                assert!(
                    last.as_ref().is_none_or(|last| last < key),
                    "{key:?} out of order"
                );
                last = Some(key.clone());
                assert!(
                    all.insert(key.clone(), value.clone()).is_none(),
                    "{key:?} twice"
                );
                Ok(())
            })
            .expect("walks");
        all
    }

    /// Random operations on a spill map and on a plain map give the same answers, and the
    /// spill map never holds more than its bound in memory.
    #[test]
    fn a_spill_map_answers_as_a_map_and_holds_at_most_its_bound_in_memory() {
        for seed in 0..40_u64 {
            let mut rng = Rng(seed);
            let hot_max = 1 + usize::try_from(rng.below(6)).expect("small");
            let mut scratch = Scratch::default();
            let mut spill: Spill<Item> = Spill::new("items", hot_max);
            let mut model: BTreeMap<Key, Item> = BTreeMap::new();
            for step in 0..400 {
                let key = (
                    format!("k{}", rng.below(30)),
                    i64::try_from(rng.below(2)).expect("0 or 1"),
                );
                let group = format!("g{}", rng.below(5));
                match rng.below(8) {
                    0 | 1 => {
                        let item = Item {
                            group,
                            open: rng.below(2) == 0,
                            n: step,
                        };
                        if model.insert(key.clone(), item.clone()).is_none() && step % 2 == 0 {
                            spill
                                .insert_absent(&mut scratch, key, item)
                                .expect("inserts");
                        } else {
                            spill.insert(&mut scratch, key, item).expect("inserts");
                        }
                    }
                    2 => {
                        let found = spill.get_mut(&mut scratch, &key).expect("reads");
                        assert_eq!(found.is_some(), model.contains_key(&key), "seed {seed}");
                        if let Some(item) = found {
                            item.n = step;
                            model.get_mut(&key).expect("in the model").n = step;
                        }
                    }
                    3 => {
                        let found = spill
                            .get(&scratch, &key)
                            .expect("reads")
                            .map(Cow::into_owned);
                        assert_eq!(found.as_ref(), model.get(&key), "seed {seed}");
                        assert_eq!(
                            spill.contains(&scratch, &key).expect("reads"),
                            model.contains_key(&key)
                        );
                    }
                    4 => {
                        spill.remove(&mut scratch, &key).expect("removes");
                        model.remove(&key);
                    }
                    5 => {
                        let groups = vec![group.clone(), format!("g{}", rng.below(5))];
                        let mut groups = groups;
                        groups.sort();
                        spill.remove_groups(&mut scratch, &groups).expect("removes");
                        model.retain(|_, item| !groups.contains(&item.group));
                    }
                    6 => {
                        let open: BTreeSet<String> = model
                            .values()
                            .filter(|item| item.open)
                            .map(|item| item.group.clone())
                            .collect();
                        assert_eq!(spill.open_groups(&scratch).expect("reads"), open);
                    }
                    _ => {
                        let mut found: Vec<(Key, Item)> =
                            spill.group_entries(&scratch, &group).expect("reads");
                        found.sort_by(|a, b| a.0.cmp(&b.0));
                        let expected: Vec<(Key, Item)> = model
                            .iter()
                            .filter(|(_, item)| item.group == group)
                            .map(|(key, item)| (key.clone(), item.clone()))
                            .collect();
                        assert_eq!(found, expected, "seed {seed}");
                    }
                }
                assert!(
                    spill.hot.len() <= hot_max,
                    "seed {seed}: {} in memory",
                    spill.hot.len()
                );
                assert_eq!(spill.len(), model.len(), "seed {seed}");
            }
            assert_eq!(everything(&spill, &scratch), model, "seed {seed}");
        }
    }

    #[test]
    fn a_running_hash_survives_the_scratch_database() {
        let mut records = crate::store::prune::SagaRecords::default();
        records.add(&"a".repeat(64));
        let text = serde_json::to_string(&records).expect("encodes");
        let mut back: crate::store::prune::SagaRecords =
            serde_json::from_str(&text).expect("decodes");
        records.add(&"b".repeat(64));
        back.add(&"b".repeat(64));
        let hash = |records: crate::store::prune::SagaRecords| {
            crate::store::prune::records_sha256(BTreeMap::from([("s", records)]))
        };
        assert_eq!(hash(records), hash(back));
        assert!(serde_json::from_str::<crate::store::prune::SagaRecords>("\"zz\"").is_err());
    }
}
