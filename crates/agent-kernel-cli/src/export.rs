//! `export --otel (--saga ID | --all) [--out FILE]` (reference §12): sagas as OTLP/JSON,
//! built by `agent-kernel-otel` from the log's tables and its audit chain.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::Path;

use agent_kernel::KernelError;
use agent_kernel_api::{SagaId, SagaRecord};
use agent_kernel_otel::{SagaHistory, export_request};
use anyhow::Context;

use crate::{Cli, Failure, exit};

/// The most sagas `export --all` writes: the newest ones (a note on stderr says when more
/// were left out; `--saga` exports any one).
pub(crate) const EXPORT_SAGAS_MAX: u32 = 10_000;

/// Runs `export --otel`: the saga `saga_id`, or with `None` every saga (the newest
/// [`EXPORT_SAGAS_MAX`]), to `out` or standard output.
pub(crate) async fn otel(
    cli: &Cli,
    db: &Path,
    saga_id: Option<SagaId>,
    out: Option<&Path>,
) -> Result<u8, Failure> {
    let log = crate::open_reading_log(cli).await?;
    let records: Vec<SagaRecord> = match saga_id {
        Some(saga_id) => vec![
            log.saga(&saga_id)
                .await?
                .ok_or(KernelError::SagaNotFound(saga_id))?,
        ],
        None => {
            let listed = log.sagas(EXPORT_SAGAS_MAX).await?;
            if listed.len() >= EXPORT_SAGAS_MAX as usize {
                eprintln!(
                    "note: exported the newest {EXPORT_SAGAS_MAX} sagas; older ones are left out (export them with --saga ID)"
                );
            }
            let mut records = Vec::with_capacity(listed.len());
            // Oldest first, as they ran.
            for summary in listed.iter().rev() {
                if let Some(record) = log.saga(&summary.saga_id).await? {
                    records.push(record);
                }
            }
            records
        }
    };
    drop(log);
    let ids: BTreeSet<String> = records
        .iter()
        .map(|record| record.saga.saga_id.as_str().to_owned())
        .collect();
    let chains = crate::audit::saga_chains(db, ids).await?;
    let histories: Vec<SagaHistory<'_>> = records
        .iter()
        .map(|record| SagaHistory {
            record,
            chain: chains
                .get(record.saga.saga_id.as_str())
                .map_or(&[], Vec::as_slice),
        })
        .collect();
    let mut document = serde_json::to_string(&export_request(&histories))
        .context("cannot write the spans as JSON")
        .map_err(Failure::internal)?;
    document.push('\n');
    match out {
        None => {
            let mut stdout = std::io::stdout().lock();
            stdout
                .write_all(document.as_bytes())
                .and_then(|()| stdout.flush())
                .context("cannot write to standard output")
                .map_err(Failure::internal)?;
        }
        Some(path) => write_replacing(path, document.as_bytes())?,
    }
    Ok(exit::OK)
}

/// Writes `bytes` to `path` whole: into a new file beside it, synced, then renamed over it,
/// so a reader never sees half a document.
fn write_replacing(path: &Path, bytes: &[u8]) -> Result<(), Failure> {
    let folder = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let bad = |error: std::io::Error| {
        Failure::bad_input(anyhow::anyhow!("cannot write {}: {error}", path.display()))
    };
    let mut file = tempfile::NamedTempFile::new_in(folder).map_err(bad)?;
    file.write_all(bytes)
        .and_then(|()| file.as_file().sync_all())
        .map_err(bad)?;
    file.persist(path).map_err(|error| bad(error.error))?;
    Ok(())
}
