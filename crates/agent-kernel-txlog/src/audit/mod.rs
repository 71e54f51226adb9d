//! The tamper-evident audit chain: one record per change the log makes, each hashed over
//! the previous record's hash, optionally MACed with a key.
//!
//! A record is a row of `audit_log`:
//! `seq` (1, 2, 3, … without gaps), `at_ms`, `kind` (the [`LogWrite`] variant's name,
//! `TakeOver` or `Genesis`), `saga_id`, `body` (canonical JSON: object keys sorted, no
//! spaces), `prev_hash`, `hash` and `mac`.
//!
//! `hash` is the lowercase hex SHA-256 of
//! `prev_hash \n seq \n at_ms \n kind \n saga_id-or-empty \n body`, with decimal numbers;
//! the first record's `prev_hash` is 64 zeros.
//! `mac`, when a key is configured, is the lowercase hex HMAC-SHA256 under the key of the
//! 64 ASCII characters of `hash`.
//!
//! [`LogWrite`]: agent_kernel_api::LogWrite

use std::fmt;

use agent_kernel_api::{SagaId, ToolError, TxError};
use hmac::{Hmac, KeyInit, Mac};
use rusqlite::Connection;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::claims::Claims;
pub(crate) use crate::digest::{ZERO_HASH, hex, is_hex_digest, sha256_hex};
pub(crate) use crate::head::Head;
use crate::sql::storage;
use crate::sql::{Db, OptionalExtension as _, params};

/// The fewest bytes an audit key may have: shorter keys can be guessed.
pub const AUDIT_KEY_BYTES_MIN: usize = 16;

/// The most bytes an audit key may have.
pub const AUDIT_KEY_BYTES_MAX: usize = 1024;

/// The largest body of an ordinary audit record, in bytes.
///
/// Bodies hold identifiers, hashes and truncated messages, so they stay far below this;
/// the `Genesis` record, which lists every saga that existed when the chain started, is
/// exempt.
pub const AUDIT_BODY_BYTES_MAX: usize = 1024 * 1024;

/// The most bytes of a message (an error, a compensation note, an argument summary) an
/// audit body quotes; the whole text is bound by its SHA-256.
pub(crate) const QUOTE_BYTES_MAX: usize = 1024;

/// The most bytes of a refused step's arguments the audit body quotes.
pub(crate) const ARGS_SUMMARY_BYTES_MAX: usize = 256;

pub(crate) use crate::kinds::{
    KIND_APPROVAL_CONSUMED, KIND_APPROVAL_DECIDED, KIND_APPROVAL_REQUESTED, KIND_BEGIN_STEP,
    KIND_CALL_REFUSED, KIND_COMMIT_STEP, KIND_COMPENSATION, KIND_CREATE_SAGA, KIND_DEAD_LETTER,
    KIND_DEAD_LETTER_SETTLED, KIND_FAIL_STEP, KIND_GENESIS, KIND_LOCK_CONFLICT, KIND_LOCKS,
    KIND_OPERATOR, KIND_PLAN_DENIED, KIND_PRUNE, KIND_REFUSE_STEP, KIND_REUSE_STEP,
    KIND_SAGA_ABORTED, KIND_SET_STATE, KIND_SIMULATE_STEP, KIND_TAKE_OVER, KINDS,
};

/// The most denials a `PlanDenied` record lists; `n_denials` counts them all.
pub(crate) const DENIALS_LISTED_MAX: usize = 64;

/// The secret that MACs every audit record, so that a rewrite of the whole chain by someone
/// without the key is detected.
///
/// Its bytes are never printed (`Debug` shows only the length).
#[derive(Clone, PartialEq, Eq)]
pub struct AuditKey(Vec<u8>);

impl AuditKey {
    /// Wraps a key of [`AUDIT_KEY_BYTES_MIN`] to [`AUDIT_KEY_BYTES_MAX`] bytes.
    ///
    /// # Errors
    ///
    /// An [`std::io::ErrorKind::InvalidInput`] error saying the key is too short or too
    /// long.
    pub fn new(bytes: Vec<u8>) -> std::io::Result<AuditKey> {
        let invalid =
            |message: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, message);
        if bytes.len() < AUDIT_KEY_BYTES_MIN {
            return Err(invalid(format!(
                "the audit key has {} bytes; at least {AUDIT_KEY_BYTES_MIN} are needed",
                bytes.len()
            )));
        }
        if bytes.len() > AUDIT_KEY_BYTES_MAX {
            return Err(invalid(format!(
                "the audit key has {} bytes; at most {AUDIT_KEY_BYTES_MAX} are allowed",
                bytes.len()
            )));
        }
        Ok(AuditKey(bytes))
    }

    /// Parses a key written as hex digits (surrounding whitespace ignored), e.g. the output
    /// of `openssl rand -hex 32`.
    ///
    /// # Errors
    ///
    /// An [`std::io::ErrorKind::InvalidInput`] error when the text is not an even number
    /// of hex digits, or the key is too short or too long.
    pub fn from_hex(text: &str) -> std::io::Result<AuditKey> {
        let text = text.trim();
        let bytes = unhex(text).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the audit key must be written as hex digits (e.g. `openssl rand -hex 32`)",
            )
        })?;
        AuditKey::new(bytes)
    }

    fn hmac(&self) -> Hmac<Sha256> {
        <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0).expect("HMAC accepts keys of any length")
    }

    /// The hex MAC of a record's hash.
    pub(crate) fn mac(&self, hash: &str) -> String {
        let mut mac = self.hmac();
        mac.update(hash.as_bytes());
        hex(&mac.finalize().into_bytes())
    }

    /// Whether `mac_hex` is the MAC of `hash` (compared in constant time).
    pub(crate) fn verifies(&self, hash: &str, mac_hex: &str) -> bool {
        let Some(expected) = unhex(mac_hex) else {
            return false;
        };
        let mut mac = self.hmac();
        mac.update(hash.as_bytes());
        mac.verify_slice(&expected).is_ok()
    }
}

impl fmt::Debug for AuditKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AuditKey(<{} bytes, not shown>)", self.0.len())
    }
}

/// Parses hex digits (either case); `None` unless every character is one and they pair up.
fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    let digit = |byte: u8| char::from(byte).to_digit(16);
    text.as_bytes()
        .chunks_exact(2)
        .map(|pair| Some((digit(pair[0])? * 16 + digit(pair[1])?) as u8))
        .collect()
}

pub(crate) use agent_kernel_api::canonical_json;
use agent_kernel_api::write_json_string as write_json_str;

/// A JSON object written in canonical form as it is built: keys must be added in
/// ascending byte order (asserted), values are escaped as `serde_json` escapes them, so
/// the result equals [`canonical_json`] of the same object without building a `Value`.
#[must_use]
pub(crate) struct CanonicalObject {
    text: String,
    last_key: Option<&'static str>,
}

impl CanonicalObject {
    pub(crate) fn new() -> CanonicalObject {
        let mut text = String::with_capacity(256);
        text.push('{');
        CanonicalObject {
            text,
            last_key: None,
        }
    }

    fn key(&mut self, key: &'static str) {
        debug_assert!(
            key.bytes()
                .all(|byte| byte.is_ascii_alphanumeric() || byte == b'_'),
            "keys need no escaping"
        );
        if let Some(last_key) = self.last_key {
            assert!(
                last_key < key,
                "canonical keys are added in order: {last_key} then {key}"
            );
            self.text.push(',');
        }
        self.last_key = Some(key);
        self.text.push('"');
        self.text.push_str(key);
        self.text.push_str("\":");
    }

    pub(crate) fn str(mut self, key: &'static str, value: &str) -> CanonicalObject {
        self.key(key);
        write_json_str(&mut self.text, value);
        self
    }

    pub(crate) fn opt_str(mut self, key: &'static str, value: Option<&str>) -> CanonicalObject {
        match value {
            Some(value) => self.str(key, value),
            None => {
                self.key(key);
                self.text.push_str("null");
                self
            }
        }
    }

    pub(crate) fn int(mut self, key: &'static str, value: impl Into<i128>) -> CanonicalObject {
        use std::fmt::Write as _;
        self.key(key);
        write!(self.text, "{}", value.into()).expect("writing to a String cannot fail");
        self
    }

    /// `"key":true` when `value` holds; nothing otherwise (the key's absence means false).
    pub(crate) fn flag(mut self, key: &'static str, value: bool) -> CanonicalObject {
        if value {
            self.key(key);
            self.text.push_str("true");
        }
        self
    }

    pub(crate) fn str_array<'s>(
        mut self,
        key: &'static str,
        values: impl IntoIterator<Item = &'s str>,
    ) -> CanonicalObject {
        self.key(key);
        self.text.push('[');
        for (idx, value) in values.into_iter().enumerate() {
            if idx > 0 {
                self.text.push(',');
            }
            write_json_str(&mut self.text, value);
        }
        self.text.push(']');
        self
    }

    pub(crate) fn object(mut self, key: &'static str, value: CanonicalObject) -> CanonicalObject {
        self.key(key);
        self.text.push_str(&value.finish());
        self
    }

    pub(crate) fn opt_int(
        mut self,
        key: &'static str,
        value: Option<impl Into<i128>>,
    ) -> CanonicalObject {
        match value {
            Some(value) => self.int(key, value),
            None => {
                self.key(key);
                self.text.push_str("null");
                self
            }
        }
    }

    pub(crate) fn opt_object(
        mut self,
        key: &'static str,
        value: Option<CanonicalObject>,
    ) -> CanonicalObject {
        match value {
            Some(value) => self.object(key, value),
            None => {
                self.key(key);
                self.text.push_str("null");
                self
            }
        }
    }

    pub(crate) fn finish(mut self) -> String {
        self.text.push('}');
        self.text
    }
}

/// At most `bytes_max` bytes of `text`, cut at a character boundary, with `…` when cut.
pub(crate) fn quote(text: &str, bytes_max: usize) -> String {
    if text.len() <= bytes_max {
        return text.to_owned();
    }
    let mut end = bytes_max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// What an audit body says about an error: its kind and (quoted) message.
pub(crate) fn error_summary(error: &ToolError) -> CanonicalObject {
    CanonicalObject::new()
        .str("kind", error.kind().as_str())
        .str("message", &quote(error.message(), QUOTE_BYTES_MAX))
}

/// The hash of one record.
pub(crate) fn record_hash(
    prev_hash: &str,
    seq: i64,
    at_ms: i64,
    kind: &str,
    saga_id: Option<&str>,
    body: &str,
) -> String {
    let mut hasher = Sha256::new();
    let mut number = [0_u8; 24];
    hasher.update(prev_hash.as_bytes());
    hasher.update(b"\n");
    hasher.update(decimal(seq, &mut number));
    hasher.update(b"\n");
    hasher.update(decimal(at_ms, &mut number));
    hasher.update(b"\n");
    hasher.update(kind.as_bytes());
    hasher.update(b"\n");
    hasher.update(saga_id.unwrap_or("").as_bytes());
    hasher.update(b"\n");
    hasher.update(body.as_bytes());
    hex(&hasher.finalize())
}

/// `value` in decimal, written into `buffer`.
fn decimal(value: i64, buffer: &mut [u8; 24]) -> &[u8] {
    use std::io::Write as _;
    let mut cursor = std::io::Cursor::new(&mut buffer[..]);
    write!(cursor, "{value}").expect("an i64 has at most 20 characters");
    let len = usize::try_from(cursor.position()).expect("at most 24");
    &buffer[..len]
}

/// One record of the chain, as stored.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Record {
    pub(crate) seq: i64,
    pub(crate) at_ms: i64,
    pub(crate) kind: String,
    pub(crate) saga_id: Option<String>,
    pub(crate) body: String,
    pub(crate) prev_hash: String,
    pub(crate) hash: String,
    pub(crate) mac: Option<String>,
}

impl Record {
    /// The record, borrowed.
    pub(crate) fn view(&self) -> RecordView<'_> {
        RecordView {
            seq: self.seq,
            at_ms: self.at_ms,
            kind: &self.kind,
            saga_id: self.saga_id.as_deref(),
            body: &self.body,
            prev_hash: &self.prev_hash,
            hash: &self.hash,
            mac: self.mac.as_deref(),
        }
    }
}

/// One record of the chain, borrowed: what is checked before it is written and after it
/// is read back.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecordView<'a> {
    pub(crate) seq: i64,
    pub(crate) at_ms: i64,
    pub(crate) kind: &'a str,
    pub(crate) saga_id: Option<&'a str>,
    pub(crate) body: &'a str,
    pub(crate) prev_hash: &'a str,
    pub(crate) hash: &'a str,
    pub(crate) mac: Option<&'a str>,
}

impl RecordView<'_> {
    /// Checks the record's form (not its place in the chain): run before it is written and
    /// after it is read back.
    pub(crate) fn check_form(&self) -> Result<(), String> {
        if self.seq < 1 {
            return Err(format!("its seq {} is not positive", self.seq));
        }
        if !KINDS.contains(&self.kind) {
            return Err(format!("its kind `{}` is unknown", quote(self.kind, 64)));
        }
        let saga_id_optional = self.kind == KIND_OPERATOR;
        let saga_id_absent =
            self.kind == KIND_GENESIS || self.kind == KIND_PLAN_DENIED || self.kind == KIND_PRUNE;
        match self.saga_id {
            None if !saga_id_optional && !saga_id_absent => {
                return Err(format!("a {} record needs a saga id", self.kind));
            }
            Some(_) if saga_id_absent => {
                return Err(format!("a {} record has no saga id", self.kind));
            }
            // A newline would make the hashed text ambiguous.
            Some(saga_id) if saga_id.is_empty() || saga_id.contains('\n') => {
                return Err("its saga id is empty or contains a newline".to_owned());
            }
            _ => {}
        }
        if self.kind != KIND_GENESIS && self.body.len() > AUDIT_BODY_BYTES_MAX {
            return Err(format!(
                "its body has {} bytes, more than the maximum of {AUDIT_BODY_BYTES_MAX}",
                self.body.len()
            ));
        }
        if !self.body.starts_with('{') {
            return Err("its body is not a JSON object".to_owned());
        }
        if !is_hex_digest(self.prev_hash) {
            return Err("its prev_hash is not a hex SHA-256".to_owned());
        }
        if !is_hex_digest(self.hash) {
            return Err("its hash is not a hex SHA-256".to_owned());
        }
        if let Some(mac) = self.mac
            && !is_hex_digest(mac)
        {
            return Err("its MAC is not a hex HMAC-SHA256".to_owned());
        }
        Ok(())
    }

    /// The hash its content should have.
    pub(crate) fn expected_hash(&self) -> String {
        record_hash(
            self.prev_hash,
            self.seq,
            self.at_ms,
            self.kind,
            self.saga_id,
            self.body,
        )
    }
}

impl Head {
    fn empty(key: Option<&AuditKey>) -> Head {
        Head {
            seq: 0,
            hash: ZERO_HASH.to_owned(),
            mac: key.map(|key| key.mac(ZERO_HASH)),
        }
    }
}

/// What the writer thread needs to keep the chain: the key, and where and how to write the
/// head file.
#[derive(Debug)]
pub(crate) struct AuditSettings {
    pub(crate) key: Option<AuditKey>,
    pub(crate) db_path: std::path::PathBuf,
    pub(crate) durability: agent_kernel_api::Durability,
}

impl AuditSettings {
    /// Moves the head file forward to `head`, just committed by this process, unless the
    /// head file is evidence: when it is missing, unreadable, or names a record the chain
    /// does not hold with that hash, the log may have been tampered with (newest records
    /// deleted, an older database put back), and overwriting it would erase what `verify`
    /// needs to tell. It is then left as is, with a warning, until an operator has looked
    /// (`audit verify`) and sealed the log again ([`SqliteLog::seal`](crate::SqliteLog::seal)).
    /// A head file already at or past `head` (another process's) is left as is too.
    pub(crate) fn advance_head(&self, conn: &dyn Db, head: &Head) {
        // Dropped at once: synced before this returns.
        drop(self.advance_head_deferring_sync(conn, head));
    }

    /// [`advance_head`](Self::advance_head), except that under
    /// [`Durability::Full`](agent_kernel_api::Durability::Full) the head file's sync is left
    /// to the caller, who drops what this returns once it has answered the writes that
    /// moved the head (`head::advance`).
    pub(crate) fn advance_head_deferring_sync(
        &self,
        conn: &dyn Db,
        head: &Head,
    ) -> Option<crate::head::UnsyncedHead> {
        use crate::head::Advance;
        let path = crate::head::head_path(&self.db_path);
        let holds = |current: &Head| {
            if current.seq == 0 {
                return Ok(current.hash == ZERO_HASH);
            }
            hash_at(conn, current.seq)
                .map(|hash| hash.is_some_and(|hash| hash == current.hash))
                .map_err(|err| format!("the record the head file names cannot be read: {err}"))
        };
        match crate::head::advance(&self.db_path, head, self.durability, holds) {
            Ok((Advance::Moved, unsynced)) => return unsynced,
            Ok((Advance::AlreadyPast, _)) => {}
            Ok((Advance::Missing, _)) => tracing::warn!(
                path = %path.display(),
                "the audit head file is missing, so it is not moved: run `agent-kernel audit verify`, then `agent-kernel audit seal` once the log is known good"
            ),
            Ok((Advance::Unusable(reason), _)) => tracing::warn!(
                %reason,
                "the audit head file is not moved: run `agent-kernel audit verify`"
            ),
            Ok((Advance::Contradicted(current), _)) => tracing::warn!(
                path = %path.display(),
                head_seq = current.seq,
                "the audit head file names a record the log does not hold as it was, so it is not moved: run `agent-kernel audit verify`"
            ),
            Err(err) => tracing::warn!(
                path = %path.display(),
                error = %err,
                "cannot update the audit head file; `audit verify` will vouch only for the records up to its previous head"
            ),
        }
        None
    }

    /// Writes the head file, whatever it held.
    pub(crate) fn write_head(&self, head: &Head) -> std::io::Result<()> {
        crate::head::write(&self.db_path, head, self.durability)
    }

    /// Creates the head file naming `head`, unless one exists.
    pub(crate) fn create_head(&self, head: &Head) -> std::io::Result<()> {
        crate::head::create(&self.db_path, head, self.durability)
    }
}

/// The hash of record `seq`, if the chain holds it.
pub(crate) fn hash_at(conn: &dyn Db, seq: i64) -> Result<Option<String>, crate::sql::Error> {
    conn.query_row(
        "SELECT hash FROM audit_log WHERE seq = ?1",
        params![seq],
        |row| row.get(0),
    )
    .optional()
}

/// The query a write transaction reads the chain's newest record with, as its first
/// statement: its seq, hash and MAC, no row for an empty chain. A backend may read it ahead
/// and answer it from what it read, when it read it under the write lock in the same
/// transaction.
pub const NEWEST_RECORD_SQL: &str =
    "SELECT seq, hash, mac FROM audit_log ORDER BY seq DESC LIMIT 1";

/// The newest record in the database, checked as it is read.
pub(crate) fn read_head(conn: &dyn Db, key: Option<&AuditKey>) -> Result<Head, TxError> {
    let row = conn
        .query_row(NEWEST_RECORD_SQL, params![], |row| {
                    Ok((
                        row.get::<_, i64>(0)?,
                        row.get::<_, String>(1)?,
                        row.get::<_, Option<String>>(2)?,
                    ))
                })
                .optional()
        .map_err(|err| {
            TxError::Corrupt(format!(
                "the audit chain's newest record cannot be read ({err}); run `agent-kernel audit verify`"
            ))
        })?;
    let Some((seq, hash, mac)) = row else {
        return Ok(Head::empty(key));
    };
    if seq < 1 || !is_hex_digest(&hash) {
        return Err(TxError::Corrupt(format!(
            "the audit chain's newest record (seq {seq}) is malformed; run `agent-kernel audit verify`"
        )));
    }
    Ok(Head { seq, hash, mac })
}

/// Appends records to the chain inside the caller's write transaction.
///
/// It also carries the writer's map of the locks begun steps hold ([`Claims`]): both live
/// as long as a write transaction, and a savepoint rolled back restores both (a clone of
/// the map is empty, read again when needed).
#[derive(Clone)]
pub(crate) struct Appender<'key> {
    key: Option<&'key AuditKey>,
    head: Head,
    claims: Claims,
}

impl<'key> Appender<'key> {
    /// Starts after the newest record. Call inside the write transaction, so that no other
    /// writer can append in between.
    pub(crate) fn start(
        conn: &dyn Db,
        key: Option<&'key AuditKey>,
    ) -> Result<Appender<'key>, TxError> {
        Appender::start_with(conn, key, Claims::default())
    }

    /// [`start`](Appender::start), with the map of locks the writer kept from its last
    /// transaction, to be caught up from the records appended since when it claims.
    pub(crate) fn start_with(
        conn: &dyn Db,
        key: Option<&'key AuditKey>,
        mut claims: Claims,
    ) -> Result<Appender<'key>, TxError> {
        let head = read_head(conn, key)?;
        claims.begin(head.seq, &head.hash);
        Ok(Appender { key, head, claims })
    }

    /// The map of locks begun steps hold, for the claims of this transaction.
    pub(crate) fn claims(&mut self) -> &mut Claims {
        &mut self.claims
    }

    /// The map of locks, for the writer's next transaction, once this one committed.
    pub(crate) fn committed(&mut self) -> Claims {
        let mut claims = std::mem::take(&mut self.claims);
        claims.committed(self.head.seq, &self.head.hash);
        claims
    }

    /// The newest record, including those appended so far.
    pub(crate) fn head(&self) -> &Head {
        &self.head
    }

    /// Appends one record; `body` is a JSON object in canonical form
    /// ([`CanonicalObject`] or [`canonical_json`]).
    pub(crate) fn append(
        &mut self,
        conn: &dyn Db,
        at_ms: i64,
        kind: &str,
        saga_id: Option<&SagaId>,
        body: &str,
    ) -> Result<(), TxError> {
        let seq = self
            .head
            .seq
            .checked_add(1)
            .ok_or_else(|| TxError::Corrupt("the audit chain is full".to_owned()))?;
        let saga_id = saga_id.map(SagaId::as_str);
        let hash = record_hash(&self.head.hash, seq, at_ms, kind, saga_id, body);
        let mac = self.key.map(|key| key.mac(&hash));
        let record = RecordView {
            seq,
            at_ms,
            kind,
            saga_id,
            body,
            prev_hash: &self.head.hash,
            hash: &hash,
            mac: mac.as_deref(),
        };
        record
            .check_form()
            .map_err(|reason| TxError::Corrupt(format!("audit record {seq}: {reason}")))?;
        conn.execute(
            "INSERT INTO audit_log (seq, at_ms, kind, saga_id, body, prev_hash, hash, mac)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![
                record.seq,
                record.at_ms,
                record.kind,
                record.saga_id,
                record.body,
                record.prev_hash,
                record.hash,
                record.mac
            ],
        )
        .map_err(storage)?;
        self.head = Head { seq, hash, mac };
        Ok(())
    }
}

/// Starts the chain of a log migrated from schema version 1 with one `Genesis` record that
/// fixes what the log held then: every saga's state, every step's status, every
/// idempotency key's binding.
/// Writes nothing when the log held no saga. Runs inside the migration's transaction.
///
/// History before the migration is not covered: the genesis record vouches for the state
/// it found, not for how the log got there.
pub(crate) fn write_genesis(
    conn: &Connection,
    from_version: i64,
    key: Option<&AuditKey>,
    now_ms: &dyn Fn() -> i64,
) -> Result<(), TxError> {
    let mut sagas = serde_json::Map::new();
    {
        let mut statement = conn
            .prepare("SELECT saga_id, state FROM sagas ORDER BY saga_id")
            .map_err(storage)?;
        let rows = statement
            .query_map([], |row| {
                Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
            })
            .map_err(storage)?;
        for row in rows {
            let (saga_id, state) = row.map_err(storage)?;
            sagas.insert(saga_id, json!({ "state": state, "steps": [] }));
        }
    }
    if sagas.is_empty() {
        return Ok(());
    }
    {
        let mut statement = conn
            .prepare("SELECT saga_id, step_seq, status FROM saga_steps ORDER BY saga_id, step_seq")
            .map_err(storage)?;
        let rows = statement
            .query_map([], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, i64>(1)?,
                    row.get::<_, String>(2)?,
                ))
            })
            .map_err(storage)?;
        for row in rows {
            let (saga_id, step_seq, status) = row.map_err(storage)?;
            let steps = sagas
                .get_mut(&saga_id)
                .and_then(|saga| saga.get_mut("steps"))
                .and_then(Value::as_array_mut)
                .ok_or_else(|| {
                    TxError::Corrupt(format!("a step of saga {saga_id}, which does not exist"))
                })?;
            steps.push(json!([step_seq, status]));
        }
    }
    let mut keys = serde_json::Map::new();
    {
        let mut statement = conn
            .prepare("SELECT key, args_hash, saga_id, step_seq FROM idempotency_keys ORDER BY key")
            .map_err(storage)?;
        let rows = statement
            .query_map([], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, String>(2)?,
                    row.get::<_, i64>(3)?,
                ))
            })
            .map_err(storage)?;
        for row in rows {
            let (key, args_hash, saga_id, step_seq) = row.map_err(storage)?;
            keys.insert(
                key,
                json!({ "args_hash": args_hash, "saga_id": saga_id, "step_seq": step_seq }),
            );
        }
    }
    let body = json!({
        "note": "the audit chain starts here; earlier history is not covered",
        "migrated_from_version": from_version,
        "sagas": sagas,
        "idempotency_keys": keys,
    });
    let mut appender = Appender::start(conn, key)?;
    assert_eq!(appender.head().seq, 0, "a genesis record starts the chain");
    appender.append(conn, now_ms(), KIND_GENESIS, None, &canonical_json(&body))
}

#[cfg(test)]
mod tests;
