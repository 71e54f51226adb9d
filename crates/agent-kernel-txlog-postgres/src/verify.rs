//! Verifying a log read-only, and where this machine keeps its head files.

use std::str::FromStr;

use agent_kernel_api::{Durability, TxError};
use agent_kernel_txlog::backend::{self, HeadFile};
use agent_kernel_txlog::{AuditHead, AuditKey, AuditReport};
use postgres::{Config, NoTls};

use crate::connection::snapshot;
use crate::db::{self, PgDb, Statements};
use crate::{describe, head_files, hosts_of, schema};

/// Verifies the audit chain of the log `url` names, read-only, in one snapshot: every
/// record's form, hash, link and (under `key`) MAC, then the tables against a replay of the
/// chain ([`agent_kernel_txlog::verify`]'s checks 1 and 3). A trigger or rule on the log's
/// tables is reported at record 0, before any row is read. With `head_file` (the base of
/// this machine's head files, [`Worker::head_file`](crate::Worker::head_file)) the head the log's own file names must
/// be in the chain, with its hash and MAC (check 2), read before the chain; a file of
/// another log at the URL that names records (the log was replaced), or any file naming
/// records when the schema holds no log (its tables dropped, another schema ahead in the
/// `search_path`), is reported at the record it names. Without `head_file`, or when this
/// machine has none (it never wrote the log), records removed from the end, with the
/// tables edited to match, go unseen, and an empty schema verifies with no records.
///
/// Blocks (on a thread of its own) while it reads.
///
/// # Errors
///
/// [`TxError::Storage`] when the URL does not parse or the server cannot be reached;
/// [`TxError::NotALog`] or [`TxError::SchemaTooNew`] as [`PostgresLog::open`](crate::PostgresLog::open).
pub fn verify(
    url: &str,
    key: Option<&AuditKey>,
    head_file: Option<&std::path::Path>,
) -> Result<AuditReport, TxError> {
    let config = Config::from_str(url)
        .map_err(|err| TxError::Storage(format!("the database URL does not parse: {err}")))?;
    let target = describe(&config);
    std::thread::scope(|scope| {
        scope
            .spawn(|| verify_on_this_thread(&config, &target, key, head_file))
            .join()
            .map_err(|_| TxError::Storage("the verification thread panicked".to_owned()))?
    })
}

/// One of this machine's head files, as read before the snapshot began.
type ReadFile = (HeadFile, backend::HeadRead);

/// [`verify`], blocking.
fn verify_on_this_thread(
    config: &Config,
    target: &str,
    key: Option<&AuditKey>,
    head_file: Option<&std::path::Path>,
) -> Result<AuditReport, TxError> {
    // This machine's head files of the logs at this URL, read before the snapshot begins: a
    // writer moves its file only after it commits, so a log in use never looks cut. A
    // machine that never wrote the log has none: that is no evidence here, where each
    // machine's files vouch only for what it saw.
    let files = head_file.map(head_files::all_for_url).unwrap_or_default();
    let reads = files
        .iter()
        .map(|path| {
            let file = head_file_at(path, key.cloned(), Durability::Full)?;
            let read = file.read();
            Ok((file, read))
        })
        .collect::<Result<Vec<ReadFile>, TxError>>()?;
    let mut client = config.connect(NoTls).map_err(|err| {
        TxError::Storage(format!(
            "cannot connect to {target}: {}",
            db::describe_error(&err)
        ))
    })?;
    let mut tx = snapshot(&mut client)?;
    let empty = AuditReport {
        n_records: 0,
        head: None,
        head_file: None,
        macs_verified: key.is_some(),
        n_records_with_mac: 0,
        first_bad: None,
    };
    let log_id = match schema::inspect(&mut tx, target)? {
        schema::Inspected::Log { log_id } => log_id,
        // No log: nothing recorded, unless this machine vouches for records.
        schema::Inspected::Empty => {
            return Ok(match reads.iter().find_map(named_record) {
                None => empty,
                Some((path, head)) => tampered(
                    empty,
                    head.clone(),
                    format!(
                        "this machine's head file {} names record {} of the log at {target}, but the schema holds no log: its tables were dropped, or another schema is ahead in the search_path",
                        path.display(),
                        head.seq
                    ),
                ),
            });
        }
        schema::Inspected::Tampered(reason) => {
            return Ok(AuditReport {
                first_bad: Some(agent_kernel_txlog::BadRecord {
                    seq: 0,
                    reason: format!("the schema is not this build's: {reason}"),
                }),
                ..empty
            });
        }
    };
    let anchor = head_file.and_then(|base| head_files::anchor_of(base, log_id.as_deref(), &files));
    let (own, others): (Vec<ReadFile>, Vec<ReadFile>) = reads
        .into_iter()
        .partition(|(file, _)| Some(file.path()) == anchor);
    if let Some((path, head)) = others.iter().find_map(named_record) {
        // A log this machine wrote at this URL is not the log there now.
        return Ok(tampered(
            empty,
            head.clone(),
            format!(
                "this machine's head file {} names record {} of another log at {target} than the one there now (log {}): the log was replaced, by a recreated database or tables dropped and made again. If you replaced it yourself, run `agent-kernel audit seal` to anchor this machine's head file to the new log",
                path.display(),
                head.seq,
                log_id.as_deref().unwrap_or("without an id")
            ),
        ));
    }
    let statements = Statements::default();
    let db = PgDb::new(&mut tx, &statements);
    match own.into_iter().next() {
        Some((file, read)) => file.verify(&db, key, read),
        None => backend::verify_chain_and_tables(&db, key),
    }
}

/// The file's path and the record it names, when it names one.
fn named_record((file, read): &ReadFile) -> Option<(std::path::PathBuf, AuditHead)> {
    read.names_record().map(|head| (file.path(), head))
}

/// `report` with the first bad record at `head`, the record a head file names, for
/// `reason`.
fn tampered(report: AuditReport, head: AuditHead, reason: String) -> AuditReport {
    AuditReport {
        first_bad: Some(agent_kernel_txlog::BadRecord {
            seq: head.seq,
            reason,
        }),
        head_file: Some(head),
        ..report
    }
}

/// The name every head file ends with.
pub(crate) const HEAD_FILE_SUFFIX: &str = ".audit-head";

/// The head file at `path` (which must end with `.audit-head`), its folder created.
pub(crate) fn head_file_at(
    path: &std::path::Path,
    key: Option<AuditKey>,
    durability: Durability,
) -> Result<HeadFile, TxError> {
    let text = path.to_string_lossy();
    let Some(base) = text
        .strip_suffix(HEAD_FILE_SUFFIX)
        .filter(|base| !base.is_empty())
    else {
        return Err(TxError::Storage(format!(
            "the audit head file {} must be named `<name>{HEAD_FILE_SUFFIX}`",
            path.display()
        )));
    };
    if let Some(folder) = path
        .parent()
        .filter(|folder| !folder.as_os_str().is_empty())
    {
        std::fs::create_dir_all(folder).map_err(|err| {
            TxError::Storage(format!(
                "cannot create the folder {}: {err}",
                folder.display()
            ))
        })?;
    }
    Ok(HeadFile::new(std::path::Path::new(base), key, durability))
}

/// The base of this machine's head files for the logs at `url`, unless told otherwise:
/// `$XDG_STATE_HOME/agent-kernel/` (else `~/.local/state/agent-kernel/`), named after the
/// SHA-256 of the hosts, database and options, not the role, so that an auditor connecting
/// as another role finds the writers' files (a host spelled otherwise, such as `localhost`
/// for `127.0.0.1`, is another base; two roles whose default `search_path` puts their logs
/// in different schemas share one, so name the schema in the URL then). Each log's own
/// head file is named after the base and the log's identity, made with the log
/// (`postgres-<digest>.log-<id>.audit-head`): a log recreated at the URL is another log,
/// and [`verify`] reports this machine's file of the old one until an operator seals the
/// new one ([`PostgresLog::seal`](crate::PostgresLog::seal)). `None` without a home folder,
/// or for a URL that does not parse.
pub fn default_head_file(url: &str) -> Option<std::path::PathBuf> {
    use sha2::Digest as _;
    let config = Config::from_str(url).ok()?;
    let state = std::env::var_os("XDG_STATE_HOME")
        .filter(|dir| !dir.is_empty())
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|dir| !dir.is_empty())
                .map(|home| std::path::Path::new(&home).join(".local/state"))
        })?;
    // The database and schema, not the role: an auditor connecting as another role finds
    // the writers' file.
    let hosts = hosts_of(&config);
    let identity = format!(
        "{}/{}?{}",
        hosts,
        config.get_dbname().or(config.get_user()).unwrap_or(""),
        config.get_options().unwrap_or("")
    );
    let digest = sha2::Sha256::digest(identity.as_bytes());
    let name: String = digest[..12]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    Some(
        state
            .join("agent-kernel")
            .join(format!("postgres-{name}{HEAD_FILE_SUFFIX}")),
    )
}
