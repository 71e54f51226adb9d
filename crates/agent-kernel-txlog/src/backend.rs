//! The log's records over any [`Db`], for a second backend (PostgreSQL, in
//! `agent-kernel-txlog-postgres`): the same writes, checks, compare-and-swap conditions,
//! audit records and reads as [`SqliteLog`](crate::SqliteLog), on the caller's connection.
//!
//! The caller owns the transaction: it begins one that no other writer of the log can run
//! beside (SQLite's `BEGIN IMMEDIATE`; on PostgreSQL a transaction-scoped advisory lock
//! taken first), starts a [`Chain`] in it, applies batches, and commits. The records are
//! then exactly as SQLite's, so the chain verifies the same way.

use std::path::{Path, PathBuf};

use agent_kernel_api::{
    ApprovalRecord, DeadLetter, Durability, KeyBinding, LogWrite, Owner, SagaId, SagaRecord,
    SagaState, SagaSummary, TxError, WriteOutcome,
};

pub use crate::audit::NEWEST_RECORD_SQL;
use crate::audit::{Appender, AuditKey, AuditSettings};
use crate::sql::Db;
use crate::store;
use crate::store::prune;

/// One writer's map of the locks the begun steps of unsettled sagas hold, kept from one of
/// its write transactions to the next and caught up from the records other writers appended
/// in between; read from the log again when it cannot be. Empty by default.
#[derive(Debug, Default)]
pub struct LockMap(store::Claims);

/// The audit chain inside one write transaction: it starts after the newest record and
/// appends each record the batch writes.
pub struct Chain<'key> {
    appender: Appender<'key>,
}

impl<'key> Chain<'key> {
    /// Starts after the chain's newest record. Call inside the write transaction, after it
    /// has excluded every other writer.
    ///
    /// # Errors
    ///
    /// [`TxError::Corrupt`] when the newest record cannot be read or is malformed.
    pub fn start(db: &dyn Db, key: Option<&'key AuditKey>) -> Result<Chain<'key>, TxError> {
        Ok(Chain {
            appender: Appender::start(db, key)?,
        })
    }

    /// [`start`](Chain::start), with the map of locks the writer kept from its last write
    /// transaction (taken out of `locks`; [`committed`](Chain::committed) gives it back).
    ///
    /// # Errors
    ///
    /// As [`start`](Chain::start).
    pub fn start_with(
        db: &dyn Db,
        key: Option<&'key AuditKey>,
        locks: &mut LockMap,
    ) -> Result<Chain<'key>, TxError> {
        Ok(Chain {
            appender: Appender::start_with(db, key, std::mem::take(&mut locks.0))?,
        })
    }

    /// Once the transaction committed: the map of locks back into `locks`, for the writer's
    /// next transaction. A writer whose transaction failed leaves `locks` empty instead.
    pub fn committed(&mut self, locks: &mut LockMap) {
        locks.0 = self.appender.committed();
    }

    /// The newest record's sequence number (0 for an empty chain) and hash.
    pub fn head(&self) -> (i64, &str) {
        let head = self.appender.head();
        (head.seq, &head.hash)
    }

    /// The newest record's MAC, under an audit key.
    pub fn head_mac(&self) -> Option<&str> {
        self.appender.head().mac.as_deref()
    }
}

/// What [`apply_batch`] did.
#[derive(Debug)]
pub struct Applied {
    /// One outcome per record, in order.
    pub outcomes: Vec<WriteOutcome>,
    /// Whether the batch ends a saga or holds an audit event: where the log keeps an
    /// anchor of the chain's head outside the records, it should move now.
    pub moves_head: bool,
}

/// Applies `batch` in the caller's transaction, chaining each record; on an error the
/// caller must roll the transaction (or its savepoint) back, since part of the batch may
/// have been applied.
///
/// # Errors
///
/// [`TxError`] as [`TxLog::write`](agent_kernel_api::TxLog::write) describes.
pub fn apply_batch(
    db: &dyn Db,
    chain: &mut Chain<'_>,
    key: Option<&AuditKey>,
    batch: &[LogWrite],
    now_ms: i64,
) -> Result<Applied, TxError> {
    let (outcomes, moves_head) = store::apply_chained(db, &mut chain.appender, key, batch, now_ms)?;
    Ok(Applied {
        outcomes,
        moves_head,
    })
}

/// [`TxLog::take_over`](agent_kernel_api::TxLog::take_over) in the caller's transaction:
/// changes the owner if `expected` still owns the saga in `expected_state`, chaining the
/// change; returns whether it did.
///
/// # Errors
///
/// [`TxError`] when the log cannot be written.
pub fn take_over(
    db: &dyn Db,
    chain: &mut Chain<'_>,
    saga_id: &SagaId,
    expected: &Owner,
    expected_state: SagaState,
    new: &Owner,
    now_ms: i64,
) -> Result<bool, TxError> {
    store::take_over_in(
        db,
        &mut chain.appender,
        saga_id,
        expected,
        expected_state,
        new,
        now_ms,
    )
}

/// [`TxLog::saga`](agent_kernel_api::TxLog::saga).
///
/// # Errors
///
/// [`TxError`] when the log cannot be read or a record breaks its rules.
pub fn saga(db: &dyn Db, saga_id: &SagaId) -> Result<Option<SagaRecord>, TxError> {
    store::saga(db, saga_id)
}

/// [`TxLog::settled_lock_holders`](agent_kernel_api::TxLog::settled_lock_holders).
///
/// # Errors
///
/// As [`saga`].
pub fn settled_lock_holders(db: &dyn Db) -> Result<Vec<SagaSummary>, TxError> {
    store::settled_lock_holders(db)
}

/// [`TxLog::duplicate_of`](agent_kernel_api::TxLog::duplicate_of).
///
/// # Errors
///
/// As [`saga`].
pub fn duplicate_of(
    db: &dyn Db,
    saga_id: &SagaId,
    tool_id: &str,
    keys: &[String],
    since_ms: i64,
) -> Result<Option<agent_kernel_api::DuplicateStep>, TxError> {
    store::duplicate_of(db, saga_id, tool_id, keys, since_ms)
}

/// [`TxLog::later_claim`](agent_kernel_api::TxLog::later_claim).
///
/// # Errors
///
/// As [`saga`].
pub fn later_claim(
    db: &dyn Db,
    saga_id: &SagaId,
    resource: &str,
    since_ms: i64,
) -> Result<Option<agent_kernel_api::LaterClaim>, TxError> {
    store::later_claim(db, saga_id, resource, since_ms)
}

/// [`TxLog::sagas`](agent_kernel_api::TxLog::sagas).
///
/// # Errors
///
/// As [`saga`].
pub fn sagas(db: &dyn Db, limit: u32) -> Result<Vec<SagaSummary>, TxError> {
    store::sagas(db, limit)
}

/// [`TxLog::saga_counts`](agent_kernel_api::TxLog::saga_counts).
///
/// # Errors
///
/// As [`saga`].
pub fn saga_counts(db: &dyn Db) -> Result<Vec<(SagaState, u64)>, TxError> {
    store::saga_counts(db)
}

/// [`TxLog::saga_page`](agent_kernel_api::TxLog::saga_page).
///
/// # Errors
///
/// As [`saga`].
pub fn saga_page(
    db: &dyn Db,
    query: &agent_kernel_api::SagaQuery,
) -> Result<Vec<agent_kernel_api::SagaListing>, TxError> {
    store::saga_page(db, query)
}

/// [`TxLog::unfinished_sagas`](agent_kernel_api::TxLog::unfinished_sagas).
///
/// # Errors
///
/// As [`saga`].
pub fn unfinished_sagas(db: &dyn Db) -> Result<Vec<SagaSummary>, TxError> {
    store::unfinished_sagas(db)
}

/// [`TxLog::key_binding`](agent_kernel_api::TxLog::key_binding).
///
/// # Errors
///
/// As [`saga`].
pub fn key_binding(db: &dyn Db, key: &str) -> Result<Option<KeyBinding>, TxError> {
    store::key_binding(db, key)
}

/// [`TxLog::approval`](agent_kernel_api::TxLog::approval).
///
/// # Errors
///
/// As [`saga`].
pub fn approval(db: &dyn Db, approval_id: &str) -> Result<Option<ApprovalRecord>, TxError> {
    store::approval(db, approval_id)
}

/// [`TxLog::saga_approval`](agent_kernel_api::TxLog::saga_approval).
///
/// # Errors
///
/// As [`saga`].
pub fn saga_approval(db: &dyn Db, saga_id: &SagaId) -> Result<Option<ApprovalRecord>, TxError> {
    store::saga_approval(db, saga_id)
}

/// [`TxLog::vouched_saga_approval`](agent_kernel_api::TxLog::vouched_saga_approval), the
/// MACs checked under `key`.
///
/// # Errors
///
/// As [`TxLog::vouched_saga_approval`](agent_kernel_api::TxLog::vouched_saga_approval).
pub fn vouched_saga_approval(
    db: &dyn Db,
    saga_id: &SagaId,
    key: Option<&AuditKey>,
) -> Result<Option<ApprovalRecord>, TxError> {
    store::vouched_saga_approval(db, saga_id, key)
}

/// [`TxLog::pending_approvals`](agent_kernel_api::TxLog::pending_approvals).
///
/// # Errors
///
/// As [`saga`].
pub fn pending_approvals(db: &dyn Db) -> Result<Vec<ApprovalRecord>, TxError> {
    store::pending_approvals(db)
}

/// [`TxLog::dead_letter`](agent_kernel_api::TxLog::dead_letter).
///
/// # Errors
///
/// As [`saga`].
pub fn dead_letter(db: &dyn Db, letter_id: &str) -> Result<Option<DeadLetter>, TxError> {
    store::dead_letter(db, letter_id)
}

/// [`TxLog::open_dead_letters`](agent_kernel_api::TxLog::open_dead_letters).
///
/// # Errors
///
/// As [`saga`].
pub fn open_dead_letters(
    db: &dyn Db,
    saga_id: Option<&SagaId>,
) -> Result<Vec<DeadLetter>, TxError> {
    store::open_dead_letters(db, saga_id)
}

/// [`TxLog::prune_candidates`](agent_kernel_api::TxLog::prune_candidates).
///
/// # Errors
///
/// As [`saga`].
pub fn prune_candidates(
    db: &dyn Db,
    before_ms: i64,
    after: Option<&(i64, SagaId)>,
    limit: u32,
) -> Result<Vec<SagaRecord>, TxError> {
    prune::candidates(db, before_ms, after, limit)
}

/// [`verify`](crate::verify)'s checks of the chain (with its MACs under `key`) and of the
/// tables against the chain, in the caller's snapshot, for a backend with the tables of the
/// current SQLite schema. There is no anchor of the head outside the database here, so
/// records removed from the end of the chain, with the tables edited to match, go unseen.
/// Memory is bounded as [`verify`](crate::verify)'s.
///
/// # Errors
///
/// [`TxError::Storage`] when the replay's scratch database fails (nothing is then known
/// about the log).
pub fn verify_chain_and_tables(
    db: &dyn Db,
    key: Option<&AuditKey>,
) -> Result<crate::AuditReport, TxError> {
    let mut report = crate::AuditReport {
        n_records: 0,
        head: None,
        head_file: None,
        macs_verified: key.is_some(),
        n_records_with_mac: 0,
        first_bad: None,
    };
    crate::verify::verify_chain_and_tables(
        db,
        crate::verify::Tables::of_version(crate::SCHEMA_VERSION),
        key,
        None,
        crate::VERIFY_ENTRIES_IN_MEMORY_MAX,
        &mut report,
    )?;
    Ok(report)
}

/// The chain's newest record, for a head file to be created ([`HeadFile::newest_if_missing`]).
#[derive(Debug)]
pub struct Newest(crate::audit::Head);

/// What [`HeadFile::read`] found: the head, none, or why it cannot be read.
#[derive(Debug)]
pub struct HeadRead(Result<Option<crate::audit::Head>, String>);

impl HeadRead {
    /// The record the file names, when it was read and names one (not an empty chain's
    /// head).
    pub fn names_record(&self) -> Option<crate::AuditHead> {
        match &self.0 {
            Ok(Some(head)) if head.seq > 0 => Some(crate::AuditHead::from(head)),
            _ => None,
        }
    }
}

/// A head file for a log whose database is not a local file (PostgreSQL): the chain's
/// newest sequence number, hash and MAC, kept by each machine that writes the log in a file
/// of its own, exactly as beside an SQLite log (`<base>.audit-head`: two checksummed slots,
/// moved in place under an advisory lock, only from a head the chain confirms, never
/// backwards, never recreated once the chain has records). Someone who can write the
/// database but not this file cannot cut the newest records it names unnoticed.
#[derive(Debug)]
pub struct HeadFile {
    settings: AuditSettings,
}

impl HeadFile {
    /// The head file `<base>.audit-head`, MACed under `key`, synced under `Full`.
    pub fn new(base: &Path, key: Option<AuditKey>, durability: Durability) -> HeadFile {
        HeadFile {
            settings: AuditSettings {
                key,
                db_path: base.to_owned(),
                durability,
            },
        }
    }

    /// Where the file is.
    pub fn path(&self) -> PathBuf {
        crate::head::head_path(&self.settings.db_path)
    }

    /// Creates the file naming the chain's newest record as `db` holds it, when there is no
    /// file yet: this machine vouches from here on for what it first found.
    ///
    /// # Errors
    ///
    /// [`TxError::Corrupt`] when the chain's newest record cannot be read,
    /// [`TxError::Storage`] when the file cannot be written.
    pub fn create_if_missing(&self, db: &dyn Db) -> Result<(), TxError> {
        match self.newest_if_missing(db)? {
            Some(newest) => self.create(&newest),
            None => Ok(()),
        }
    }

    /// [`create_if_missing`](Self::create_if_missing) in two steps, for a log whose reads
    /// may see commits not yet durable (a PostgreSQL server's asynchronous commits): the
    /// chain's newest record as `db` holds it, when there is no file yet; then, once the
    /// caller made sure that record is durable, [`create`](Self::create).
    ///
    /// # Errors
    ///
    /// [`TxError::Corrupt`] when the chain's newest record cannot be read.
    pub fn newest_if_missing(&self, db: &dyn Db) -> Result<Option<Newest>, TxError> {
        if crate::head::exists(&self.settings.db_path) {
            return Ok(None);
        }
        Ok(Some(Newest(crate::audit::read_head(
            db,
            self.settings.key.as_ref(),
        )?)))
    }

    /// Creates the file naming `newest` ([`newest_if_missing`](Self::newest_if_missing)),
    /// unless another process of this machine created one meanwhile.
    ///
    /// # Errors
    ///
    /// [`TxError::Storage`] when the file cannot be written.
    pub fn create(&self, newest: &Newest) -> Result<(), TxError> {
        self.settings.create_head(&newest.0).map_err(|err| {
            TxError::Storage(format!(
                "cannot write the audit head file {}: {err}",
                self.path().display()
            ))
        })
    }

    /// Moves the file to `chain`'s newest record, just committed, checking the file's
    /// current head against the chain in `db` (a snapshot that sees the commit); a file the
    /// chain contradicts, or a missing one, is left as evidence, with a warning.
    pub fn advance(&self, db: &dyn Db, chain: &Chain<'_>) {
        self.settings.advance_head(db, chain.appender.head());
    }

    /// Replaces the file, whatever it held, with one naming `chain`'s newest record, just
    /// committed: an operator's seal.
    ///
    /// # Errors
    ///
    /// [`TxError::Storage`] when the file cannot be written; it is then left as it was.
    pub fn replace(&self, chain: &Chain<'_>) -> Result<(), TxError> {
        self.settings
            .write_head(chain.appender.head())
            .map_err(|err| {
                TxError::Storage(format!(
                    "cannot write the audit head file {}: {err}",
                    self.path().display()
                ))
            })
    }

    /// Reads the file, for [`verify`](Self::verify): before the snapshot the chain is read
    /// in begins, since writers move the file only after they commit, so a log in use never
    /// looks cut.
    pub fn read(&self) -> HeadRead {
        HeadRead(crate::head::read(&self.settings.db_path))
    }

    /// [`verify_chain_and_tables`], and the head file as `read` found it checked against the
    /// chain (6.9's check 2).
    ///
    /// # Errors
    ///
    /// As [`verify_chain_and_tables`].
    pub fn verify(
        &self,
        db: &dyn Db,
        key: Option<&AuditKey>,
        read: HeadRead,
    ) -> Result<crate::AuditReport, TxError> {
        let head = read.0;
        let mut report = crate::AuditReport {
            n_records: 0,
            head: None,
            head_file: head
                .as_ref()
                .ok()
                .and_then(Option::as_ref)
                .map(crate::head::AuditHead::from),
            macs_verified: key.is_some(),
            n_records_with_mac: 0,
            first_bad: None,
        };
        let anchor = crate::verify::Anchor {
            head,
            name: "the head file",
            location: self.path().display().to_string(),
        };
        crate::verify::verify_chain_and_tables(
            db,
            crate::verify::Tables::of_version(crate::SCHEMA_VERSION),
            key,
            Some(anchor),
            crate::VERIFY_ENTRIES_IN_MEMORY_MAX,
            &mut report,
        )?;
        Ok(report)
    }
}
