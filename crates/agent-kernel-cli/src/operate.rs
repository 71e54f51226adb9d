//! The operator's commands: `undo`, `prune`, `dlq`, `approvals`, `approve`, `reject`,
//! `recover` and `rollback`, each parsing and printing over `agent_kernel::operator`.

#[allow(clippy::wildcard_imports)]
use crate::*;

pub(crate) async fn prune(cli: &Cli, out: &Output, args: &PruneArgs) -> Result<u8, Failure> {
    let PruneArgs {
        before,
        vacuum,
        skip_verify,
    } = args;
    require_log(cli)?;
    let _lock = operator_lock(cli).await?;
    // What is removed is chosen from the tables: they must say what the chain says.
    let options = verify_before_acting(cli, *skip_verify).await?;
    // Opened before the kernel confines this process to the roots: its writer
    // thread keeps its access to the log.
    let vacuum_log = if *vacuum {
        Some(open_log(cli, Durability::Full)?)
    } else {
        None
    };
    let kernel = open_kernel(
        cli,
        Durability::Full,
        Compensation::AndExecution,
        options,
        true,
    )?;
    let report = operator::prune(&kernel, *before).await?;
    drop(kernel);
    if let Some(log) = vacuum_log {
        log.vacuum()
            .await
            .map_err(|error| log_failure(error, true, "cannot vacuum the log".to_owned()))?;
    }
    out.prune(&report, *vacuum);
    Ok(exit::OK)
}

pub(crate) async fn dlq(cli: &Cli, out: &Output, args: &DlqArgs) -> Result<u8, Failure> {
    let DlqArgs { action } = args;
    require_log(cli)?;
    match action {
        DlqAction::List => {
            let kernel = open_kernel_for_approvals(cli)?;
            dlq::list_command(&kernel, out).await
        }
        DlqAction::Retry {
            id,
            due,
            force,
            skip_verify,
        } => {
            let _lock = operator_lock(cli).await?;
            // A retry compensates from the log's records, as `rollback` does.
            let kernel = open_kernel_to_compensate(cli, *skip_verify).await?;
            match id {
                Some(id) if !*due => dlq::retry_command(&kernel, out, id, *force).await,
                _ => dlq::retry_due_command(&kernel, out).await,
            }
        }
        DlqAction::Resolve { id, note } => {
            // Not beside an `undo` or a `dlq retry` of this log.
            let _lock = operator_lock(cli).await?;
            let kernel = open_kernel_for_approvals(cli)?;
            dlq::resolve_command(&kernel, out, id, note).await
        }
    }
}

pub(crate) async fn approvals(
    cli: &Cli,
    out: &Output,
    args: &ApprovalsArgs,
) -> Result<u8, Failure> {
    let ApprovalsArgs { show } = args;
    require_log(cli)?;
    let kernel = open_kernel_for_approvals(cli)?;
    match show {
        Some(id) => approvals::show_command(&kernel, out, id).await,
        None => approvals::list_command(&kernel, out).await,
    }
}

pub(crate) async fn approve(cli: &Cli, out: &Output, args: &ApproveArgs) -> Result<u8, Failure> {
    let ApproveArgs {
        id,
        note,
        operator_key_file,
    } = args;
    decide(
        cli,
        out,
        id,
        true,
        note.clone(),
        operator_key_file.as_deref(),
    )
    .await
}

pub(crate) async fn reject(cli: &Cli, out: &Output, args: &RejectArgs) -> Result<u8, Failure> {
    let RejectArgs {
        id,
        reason,
        operator_key_file,
    } = args;
    decide(
        cli,
        out,
        id,
        false,
        Some(reason.clone()),
        operator_key_file.as_deref(),
    )
    .await
}

pub(crate) async fn rollback(cli: &Cli, out: &Output, args: &RollbackArgs) -> Result<u8, Failure> {
    let RollbackArgs { saga, skip_verify } = args;
    let saga_id = parse_saga_id(saga)?;
    require_log(cli)?;
    let kernel = open_kernel_to_compensate(cli, *skip_verify).await?;
    let report = operator::rollback(&kernel, &saga_id, &progress::StepProgress::hidden()).await?;
    out.saga(&report);
    Ok(match report.state {
        // A dry run has nothing to undo.
        _ if report.dry_run => exit::OK,
        SagaState::FailedRolledBack => exit::OK,
        _ => exit::ATTENTION,
    })
}

pub(crate) async fn undo(cli: &Cli, out: &Output, args: &UndoArgs) -> Result<u8, Failure> {
    let UndoArgs {
        saga,
        reason,
        force,
        preview,
        skip_verify,
    } = args;
    if *preview {
        let saga_id = parse_saga_id(saga)?;
        require_log(cli)?;
        let kernel = open_kernel_to_compensate(cli, *skip_verify).await?;
        let preview = operator::undo_preview(&kernel, &saga_id).await?;
        let undoable = preview.undoable(*force);
        out.undo_preview(&preview, undoable);
        return Ok(if undoable { exit::OK } else { exit::DENIED });
    }
    let saga_id = parse_saga_id(saga)?;
    require_log(cli)?;
    let _lock = operator_lock(cli).await?;
    // Undo compensates from the log's records, as `rollback` does.
    let kernel = open_kernel_to_compensate(cli, *skip_verify).await?;
    let report = operator::undo(
        &kernel,
        &saga_id,
        &agent_kernel::UndoRequest {
            reason: reason.clone().unwrap_or_default(),
            force: *force,
            by: None,
        },
        &progress::StepProgress::hidden(),
    )
    .await?;
    out.saga(&report);
    Ok(match report.state {
        SagaState::Undone => exit::OK,
        // A dry run has nothing to undo.
        _ if report.dry_run => exit::OK,
        _ => exit::ATTENTION,
    })
}

/// When recovery left a saga for want of a tool: on stderr, the tools file this process
/// loaded, or where it looked for one, so that the operator can point `--tools` at the
/// right file.
fn say_where_tools_were_looked_for(cli: &Cli, report: &agent_kernel::RecoveryReport) {
    let missing = report
        .sagas
        .iter()
        .any(|action| matches!(action, agent_kernel::RecoveryAction::MissingTools { .. }));
    if !missing {
        return;
    }
    let builder = wiring(cli);
    match builder.tools_file_path() {
        Some(path) => eprintln!(
            "agent-kernel: the tools file loaded was {}; if the sagas ran with another, name it with --tools FILE",
            path.display()
        ),
        None => {
            let looked: Vec<String> = builder
                .default_file_candidates(agent_kernel::DEFAULT_TOOLS)
                .iter()
                .map(|path| path.display().to_string())
                .collect();
            eprintln!(
                "agent-kernel: no tools file was loaded (none at {}); name the one the sagas ran with using --tools FILE or --config DIR",
                looked.join(", ")
            );
        }
    }
}

pub(crate) async fn recover(cli: &Cli, out: &Output, args: &RecoverArgs) -> Result<u8, Failure> {
    let RecoverArgs {
        skip_verify,
        watch,
        wait,
    } = args;
    if *watch {
        let kernel = open_kernel_to_compensate(cli, *skip_verify).await?;
        return recover_watch(&kernel, out).await;
    }
    if *wait {
        let kernel = open_kernel_to_compensate(cli, *skip_verify).await?;
        let report = operator::recover_waiting(
            &kernel,
            &progress::StepProgress::hidden(),
            operator::RECOVER_WAIT_MAX,
            |n_waiting, left_ms| {
                eprintln!(
                    "agent-kernel: {n_waiting} saga(s) wait for their worker's lease; the soonest runs out in {:.1} s",
                    left_ms as f64 / 1000.0
                );
            },
        )
        .await?;
        out.recovery(&report);
        say_where_tools_were_looked_for(cli, &report);
        return Ok(if report.needs_operator() {
            exit::ATTENTION
        } else {
            exit::OK
        });
    }
    if !log_present(&db_path(cli))? {
        // Nothing was ever logged here, so nothing can need recovery.
        out.recovery(&agent_kernel::RecoveryReport::default());
        return Ok(exit::OK);
    }
    let kernel = open_kernel_to_compensate(cli, *skip_verify).await?;
    let report = operator::recover(&kernel, &progress::StepProgress::hidden()).await?;
    out.recovery(&report);
    say_where_tools_were_looked_for(cli, &report);
    Ok(if !report.needs_operator() {
        exit::OK
    } else {
        exit::ATTENTION
    })
}

/// How often `recover --watch` looks for sagas of dead owners (its `--help` says so).
const RECOVER_WATCH_PERIOD: std::time::Duration = std::time::Duration::from_millis(250);

/// `recover --watch`: rolls back, round after round, every saga of an owner found dead,
/// printing each round that acted; returns on SIGINT or SIGTERM. A round acts only when
/// [`Kernel::has_recoverable_sagas`] says there is something to do, so an idle round writes
/// nothing. The log is verified once, before the first round (`open_kernel_to_compensate`):
/// once the process is confined, a new connection to the database's port is refused, so a
/// round cannot verify again.
async fn recover_watch(kernel: &Kernel, out: &output::Output) -> Result<u8, Failure> {
    use tokio::signal::unix::{SignalKind, signal};
    let listen = |kind: SignalKind, name: &str| {
        signal(kind)
            .with_context(|| format!("cannot watch for {name}"))
            .map_err(Failure::internal)
    };
    let (mut interrupt, mut terminate) = (
        listen(SignalKind::interrupt(), "SIGINT")?,
        listen(SignalKind::terminate(), "SIGTERM")?,
    );
    tracing::info!(
        period_ms = RECOVER_WATCH_PERIOD.as_millis() as u64,
        "recovering the sagas of dead owners until stopped"
    );
    let mut pause = RECOVER_WATCH_PERIOD;
    loop {
        match watch_round(kernel, out).await {
            Ok(()) => {
                if pause != RECOVER_WATCH_PERIOD {
                    tracing::warn!("the log answers again; watching on");
                }
                pause = RECOVER_WATCH_PERIOD;
            }
            Err(KernelError::Log(error)) if watch_may_retry(&error) => {
                // The database went away (a lost connection, a restart): its connection is
                // made again by the next round; nobody else may be recovering meanwhile.
                pause = (pause * 2).clamp(RECOVER_WATCH_PERIOD, RECOVER_WATCH_BACKOFF_MAX);
                tracing::warn!(
                    %error,
                    retry_in_ms = pause.as_millis() as u64,
                    "the log does not answer; trying again"
                );
            }
            Err(error) => return Err(error.into()),
        }
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            _ = interrupt.recv() => return Ok(exit::OK),
            _ = terminate.recv() => return Ok(exit::OK),
        }
    }
}

/// The longest `recover --watch` waits between two tries while the log does not answer.
const RECOVER_WATCH_BACKOFF_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether `recover --watch` tries again after `error`: the storage went away, which the
/// log's own connection makes good, as opposed to this process being fenced (its lease ran
/// out: it can never write again, and a new process must take its place) or a log that
/// cannot be trusted.
fn watch_may_retry(error: &agent_kernel_api::TxError) -> bool {
    matches!(
        error,
        agent_kernel_api::TxError::Storage(_) | agent_kernel_api::TxError::NotFound(_)
    )
}

/// One round of `recover --watch`: recovers when there is something to recover, and prints
/// the round when it acted.
async fn watch_round(kernel: &Kernel, out: &output::Output) -> Result<(), KernelError> {
    if kernel.has_recoverable_sagas().await? {
        let report = operator::recover(kernel, &progress::StepProgress::hidden()).await?;
        if report.sagas.iter().any(|action| {
            !matches!(
                action,
                agent_kernel::RecoveryAction::SkippedLive { .. }
                    | agent_kernel::RecoveryAction::SkippedWaiting { .. }
            )
        }) {
            out.recovery(&report);
        }
    }
    Ok(())
}
