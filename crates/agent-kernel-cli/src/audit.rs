//! `audit verify`: checks the log's tamper-evident audit chain and names the first bad
//! record. Exit 0 when the log is intact, 1 when tampering was found, 2 when the log
//! cannot be verified (missing, not a log, a bad key).
//!
//! The audit key (optional) comes from `--audit-key-file PATH`, else from the
//! environment variable `AGENT_KERNEL_AUDIT_KEY`, written as hex digits
//! (`openssl rand -hex 32`). Every command that writes the log uses it, so that each
//! record carries a MAC; `audit verify` needs the same key to check the MACs.

use std::env::VarError;
use std::io::Read;
use std::path::Path;

use agent_kernel_txlog::{AUDIT_KEY_BYTES_MAX, AuditKey, AuditReport};
use anyhow::Context as _;
use serde_json::json;

use crate::{Failure, KernelError, exit};

/// The environment variable that holds the audit key, as hex digits.
pub(crate) const AUDIT_KEY_ENV: &str = "AGENT_KERNEL_AUDIT_KEY";

/// The largest key file read: the longest hex key and a line break.
const KEY_FILE_BYTES_MAX: u64 = 2 * AUDIT_KEY_BYTES_MAX as u64 + 2;

/// `audit verify` found tampering (reference §5).
const EXIT_TAMPERED: u8 = 1;

/// The audit key: from `file` when given (hex digits; surrounding whitespace ignored),
/// else from `$AGENT_KERNEL_AUDIT_KEY`, else none.
///
/// A key that is set but unusable (unreadable file, not hex, too short) is an error, never
/// silently no key.
///
/// # Errors
///
/// When the file cannot be read, or the key is malformed, shorter than 16 bytes or
/// longer than 1024.
pub(crate) fn audit_key_from_env_or_file(file: Option<&Path>) -> anyhow::Result<Option<AuditKey>> {
    if let Some(path) = file {
        return read_key_file(path).map(Some);
    }
    match std::env::var(AUDIT_KEY_ENV) {
        Ok(text) => AuditKey::from_hex(&text)
            .map(Some)
            .map_err(|message| anyhow::anyhow!("${AUDIT_KEY_ENV}: {message}")),
        Err(VarError::NotPresent) => Ok(None),
        Err(VarError::NotUnicode(_)) => Err(anyhow::anyhow!(
            "${AUDIT_KEY_ENV}: the audit key must be written as hex digits"
        )),
    }
}

fn read_key_file(path: &Path) -> anyhow::Result<AuditKey> {
    let file = std::fs::File::open(path)
        .with_context(|| format!("cannot read the audit key file {}", path.display()))?;
    warn_if_readable_by_others(path, &file);
    let mut text = String::new();
    file.take(KEY_FILE_BYTES_MAX + 1)
        .read_to_string(&mut text)
        .with_context(|| format!("cannot read the audit key file {}", path.display()))?;
    if text.len() as u64 > KEY_FILE_BYTES_MAX {
        anyhow::bail!(
            "the audit key file {} is larger than any audit key ({KEY_FILE_BYTES_MAX} bytes)",
            path.display()
        );
    }
    AuditKey::from_hex(&text)
        .map_err(|message| anyhow::anyhow!("audit key file {}: {message}", path.display()))
}

/// A key that others can read protects nothing; say so (once, on stderr).
fn warn_if_readable_by_others(path: &Path, file: &std::fs::File) {
    use std::os::unix::fs::PermissionsExt as _;
    if let Ok(metadata) = file.metadata()
        && metadata.permissions().mode() & 0o077 != 0
    {
        tracing::warn!(
            path = %path.display(),
            mode = format!("{:o}", metadata.permissions().mode() & 0o777),
            "the audit key file is readable by other users; `chmod 600` it"
        );
    }
}

/// Runs `audit verify` on the log at `db` and prints the verdict: one line, or with `json`
/// one document `{"ok", "n_records", "first_bad": {"seq", "reason"} | null, …}`.
/// Returns the exit code: 0 intact, 1 tampering found.
///
/// # Errors
///
/// A bad-input [`Failure`] (exit 2) when the log at `db` cannot be verified (not a log, a
/// newer schema, a log from before the audit chain); the caller checks that it exists.
pub(crate) async fn verify_command(
    db: &Path,
    key: Option<AuditKey>,
    json: bool,
) -> Result<u8, Failure> {
    let report = verify_log(db, key).await?;
    print_report(&report, json);
    Ok(if report.is_intact() {
        exit::OK
    } else {
        EXIT_TAMPERED
    })
}

/// Runs `audit seal`: checks the chain and the tables of the log at `db` (not its head
/// file), and if they hold, records the seal (by `owner`) in the chain and writes a head
/// file naming that record. Prints the verdict as `audit verify` does, plus the new head.
/// Returns the exit code: 0 sealed, 1 not sealed (a bad record).
///
/// # Errors
///
/// A [`Failure`] when the log cannot be verified, opened or written.
pub(crate) async fn seal_command(
    db: &Path,
    key: Option<AuditKey>,
    json: bool,
    owner: agent_kernel_api::Owner,
    open: impl FnOnce() -> Result<agent_kernel_txlog::SqliteLog, Failure>,
) -> Result<u8, Failure> {
    let key_for_seal = key.clone();
    let report = agent_kernel::operator::verify_ignoring_head_file(db, key)
        .await
        .with_context(|| format!("cannot verify the log {}", crate::shown_db(db)))
        .map_err(Failure::bad_input)?;
    if !report.is_intact() {
        print_report(&report, json);
        eprintln!("agent-kernel: the log was not sealed: its records or tables are bad");
        return Ok(EXIT_TAMPERED);
    }
    let uid = agent_kernel::current_uid();
    let sealed = match db.to_str().filter(|_| agent_kernel::is_postgres(db)) {
        Some(url) => agent_kernel::operator::seal_postgres(url, key_for_seal, owner, uid).await,
        None => agent_kernel::operator::seal(&open()?, owner, uid).await,
    };
    let head = sealed.map_err(|error| {
        Failure::internal(anyhow::Error::new(error).context("cannot seal the log"))
    })?;
    if json {
        let document = json!({
            "ok": true,
            "sealed": true,
            "n_records": report.n_records + 1,
            "head": head,
            "previous_head_file": report.head_file,
        });
        crate::output::print_json(&document);
    } else {
        println!(
            "audit: {} records verified; sealed with record {}, which the head file now names",
            report.n_records, head.seq
        );
    }
    Ok(exit::OK)
}

/// Runs `audit list`: the records `query` selects, newest first, as a table (sequence
/// number, time, kind, saga, what it says) or with `json` one document
/// `{"records": [{"seq", "at_ms", "kind", "saga_id", "body"}]}`. Returns exit 0.
///
/// # Errors
///
/// A bad-input [`Failure`] (exit 2) for an unknown kind or a log that cannot be read.
pub(crate) async fn list_command(
    db: &Path,
    query: agent_kernel_txlog::AuditQuery,
    json: bool,
) -> Result<u8, Failure> {
    let records = agent_kernel::operator::audit_records(db, query)
        .await
        .map_err(|error| records_unread(db, error))?;
    if json {
        crate::output::print_json(&json!({ "records": records }));
        return Ok(exit::OK);
    }
    if records.is_empty() {
        println!("no audit records match");
        return Ok(exit::OK);
    }
    let mut table = crate::output::table(&["seq", "at", "kind", "saga", "what"]);
    for record in &records {
        // Records hold text from plans and from whoever edited the log: no control
        // character reaches the terminal.
        table.add_row(vec![
            record.seq.to_string(),
            crate::output::format_ms(record.at_ms),
            crate::output::printable(&record.kind),
            crate::output::printable(record.saga_id.as_deref().unwrap_or_default()),
            crate::output::printable(&summary(record)),
        ]);
    }
    println!("{table}");
    Ok(exit::OK)
}

/// One line saying what a record recorded.
fn summary(record: &agent_kernel_txlog::AuditRecord) -> String {
    let body = &record.body;
    let text = |value: &serde_json::Value| value.as_str().unwrap_or_default().to_owned();
    match record.kind.as_str() {
        "PlanDenied" => {
            let denials = body["denials"].as_array().cloned().unwrap_or_default();
            let first = denials.first().map_or_else(String::new, |denial| {
                let tool = text(&denial["tool"]);
                let args = text(&denial["args_summary"]);
                let step = denial["step_idx"]
                    .as_u64()
                    .map_or_else(String::new, |step| format!("step {step} "));
                format!("{step}{tool} {args}: {}", text(&denial["reason"]))
            });
            let more = body["n_denials"].as_u64().unwrap_or(0).saturating_sub(1);
            let dry = if body["dry_run"] == true {
                " (dry run)"
            } else {
                ""
            };
            if more > 0 {
                format!("denied{dry}: {first} (and {more} more)")
            } else {
                format!("denied{dry}: {first}")
            }
        }
        "Operator" => {
            let options = body["options"]
                .as_array()
                .map(|options| options.iter().map(text).collect::<Vec<_>>().join(" "))
                .unwrap_or_default();
            let uid = body["uid"]
                .as_u64()
                .map_or_else(String::new, |uid| format!(", uid {uid}"));
            format!(
                "{}{}{} (pid {}{uid})",
                text(&body["command"]),
                if options.is_empty() { "" } else { " " },
                options,
                body["by"]["pid"]
            )
        }
        "CallRefused" => format!(
            "call {} {} refused (the saga stays open): {}",
            text(&body["tool"]),
            text(&body["args_summary"]),
            text(&body["reason"])
        ),
        "SagaAborted" => format!(
            "aborted ({}): {}",
            text(&body["cause"]),
            text(&body["reason"])
        ),
        "RefuseStep" => format!(
            "step {} {} refused: {}",
            body["step_seq"],
            text(&body["tool"]),
            text(&body["error"]["message"])
        ),
        "CreateSaga" => format!(
            "created ({} steps{}) in {}",
            body["n_steps"],
            if body["dry_run"] == true {
                ", dry run"
            } else {
                ""
            },
            text(&body["state"])
        ),
        "SetState" => format!("now {}", text(&body["state"])),
        "TakeOver" => format!(
            "taken over by pid {} (it was {})",
            body["to_owner"]["pid"], body["from_owner"]["pid"]
        ),
        "Compensation" => format!("step {} {}", body["step_seq"], text(&body["status"])),
        "CommitStep" => format!("step {} COMMIT", body["step_seq"]),
        "FailStep" => format!(
            "step {} FAIL: {}",
            body["step_seq"],
            text(&body["error"]["message"])
        ),
        "Genesis" => "the chain starts".to_owned(),
        "Prune" => format!(
            "{} sagas ({} steps) removed from the tables, their records kept",
            body["saga_ids"].as_array().map_or(0, Vec::len),
            body["n_steps"]
        ),
        "ApprovalRequested" => format!(
            "step {} {} {} waits for approval {} (digest {})",
            body["step_seq"],
            text(&body["tool"]),
            text(&body["args_summary"]),
            text(&body["approval_id"]),
            text(&body["digest"])
        ),
        "ApprovalDecided" => format!(
            "approval {} {} by {}{}",
            text(&body["approval_id"]),
            text(&body["status"]),
            text(&body["decided_by"]),
            body["note"]
                .as_str()
                .map(|note| format!(": {note}"))
                .unwrap_or_default()
        ),
        "ApprovalConsumed" => format!(
            "approval {} used by step {}",
            text(&body["approval_id"]),
            body["step_seq"]
        ),
        "DeadLetter" => format!(
            "dead letter {} for step {} {} (attempt {}): {}",
            text(&body["letter_id"]),
            body["step_seq"],
            text(&body["tool"]),
            body["attempts"],
            text(&body["error"])
        ),
        "DeadLetterSettled" => format!(
            "dead letter {} {} by {}{}",
            text(&body["letter_id"]),
            text(&body["status"]),
            text(&body["settled_by"]),
            body["note"]
                .as_str()
                .map(|note| format!(": {note}"))
                .unwrap_or_default()
        ),
        _ => format!(
            "step {} {} {}",
            body["step_seq"],
            text(&body["tool"]),
            text(&body["status"])
        )
        .trim_end()
        .to_owned(),
    }
}

/// Verifies the log at `db` ([`agent_kernel::operator::verify`], on a thread of its own).
///
/// # Errors
///
/// A bad-input [`Failure`] (exit 2) when the log cannot be verified.
pub(crate) async fn verify_log(db: &Path, key: Option<AuditKey>) -> Result<AuditReport, Failure> {
    agent_kernel::operator::verify(db, key)
        .await
        .with_context(|| format!("cannot verify the log {}", crate::shown_db(db)))
        .map_err(Failure::bad_input)
}

/// The document of `audit verify --json` (and of the console's `POST /audit/verify`).
pub(crate) fn report_document(report: &AuditReport) -> serde_json::Value {
    json!({
        "ok": report.is_intact(),
        "n_records": report.n_records,
        "first_bad": report.first_bad.as_ref().map(|bad| json!({
            "seq": bad.seq,
            "reason": bad.reason,
        })),
        "head": report.head,
        "head_file": report.head_file,
        "macs_verified": report.macs_verified,
    })
}

fn print_report(report: &AuditReport, json: bool) {
    if json {
        crate::output::print_json(&report_document(report));
    } else {
        match &report.first_bad {
            None => println!(
                "audit: {} records verified, head at seq {}{}",
                report.n_records,
                report.head.as_ref().map_or(0, |head| head.seq),
                if report.macs_verified {
                    ", MACs checked"
                } else {
                    ""
                }
            ),
            Some(bad) if bad.seq == 0 => println!("audit: the log is bad: {}", bad.reason),
            Some(bad) => println!("audit: record {} is bad: {}", bad.seq, bad.reason),
        }
    }
    if !report.macs_verified && report.n_records_with_mac > 0 {
        eprintln!(
            "agent-kernel: the records carry MACs but no audit key was given, so the MACs were not checked (set ${AUDIT_KEY_ENV} or pass --audit-key-file)"
        );
    }
}

/// The whole chain of each saga of `saga_ids`, oldest first, from either backend.
pub(crate) async fn saga_chains(
    db: &Path,
    saga_ids: std::collections::BTreeSet<String>,
) -> Result<std::collections::BTreeMap<String, Vec<agent_kernel_txlog::AuditRecord>>, Failure> {
    agent_kernel::operator::saga_chains(db, saga_ids)
        .await
        .map_err(|error| records_unread(db, error))
}

/// The failure of reading the audit records of the log at `db`: the log's own
/// (`log_failure`), or what the kernel says.
fn records_unread(db: &Path, error: KernelError) -> Failure {
    match error {
        KernelError::Log(error) => crate::log_failure(
            error,
            crate::log_exists(db),
            format!("cannot read the audit records of {}", crate::shown_db(db)),
        ),
        other => other.into(),
    }
}

/// The records of one saga's history that `replay` checks (its creation, its changes of
/// state, its begun steps), oldest first, read from the audit chain.
pub(crate) async fn saga_history(
    db: &Path,
    saga_id: &agent_kernel_api::SagaId,
) -> Result<Vec<agent_kernel::Recorded>, Failure> {
    use agent_kernel::Recorded;
    let records = saga_chains(db, [saga_id.as_str().to_owned()].into())
        .await?
        .remove(saga_id.as_str())
        .unwrap_or_default();
    let state = |record: &agent_kernel_txlog::AuditRecord| {
        record.body["state"]
            .as_str()
            .and_then(|state| state.parse().ok())
            .ok_or_else(|| {
                Failure::internal(anyhow::anyhow!(
                    "audit record {} holds no saga state: run `agent-kernel audit verify`",
                    record.seq
                ))
            })
    };
    records
        .iter()
        .filter(|record| ["CreateSaga", "SetState", "BeginStep"].contains(&record.kind.as_str()))
        .map(|record| match record.kind.as_str() {
            "CreateSaga" => Ok(Recorded::Created {
                seq: record.seq,
                state: state(record)?,
            }),
            "SetState" => Ok(Recorded::State {
                seq: record.seq,
                state: state(record)?,
            }),
            _ => record.body["step_seq"]
                .as_u64()
                .and_then(|step_seq| u32::try_from(step_seq).ok())
                .map(|step_seq| Recorded::Begun {
                    seq: record.seq,
                    step_seq,
                })
                .ok_or_else(|| {
                    Failure::internal(anyhow::anyhow!(
                        "audit record {} holds no step: run `agent-kernel audit verify`",
                        record.seq
                    ))
                }),
        })
        .collect()
}
