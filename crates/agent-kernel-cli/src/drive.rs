//! The commands that run sagas: `run`, `resume` and `mcp`.

#[allow(clippy::wildcard_imports)]
use crate::*;

pub(crate) async fn run(cli: &Cli, out: &Output, args: &RunArgs) -> Result<u8, Failure> {
    let RunArgs {
        plan,
        durability,
        dry_run,
        no_wait,
    } = args;
    // Everything about the input is checked before the log is opened.
    let plan = read_plan(plan)?;
    let live = if *dry_run {
        None
    } else {
        live_export_config()?
    };
    let (kernel, exporter) = open_kernel_exporting(
        cli,
        *durability,
        Compensation::AndExecution,
        Vec::new(),
        true,
        live,
    )?;
    if *dry_run {
        let report = kernel.dry_run(&plan).await?;
        out.saga(&report);
        return Ok(match report.state {
            SagaState::Done => exit::OK,
            _ if report.is_denied() => exit::DENIED,
            _ => exit::ROLLED_BACK,
        });
    }
    let progress = progress::StepProgress::new(plan.steps.len());
    let cancel = Arc::new(Cancellation::new());
    watch_signals(cancel.clone());
    let report = kernel.run_cancellable(&plan, &progress, &cancel).await?;
    let report = approvals::settle_waits(&kernel, report, *no_wait, &progress, &cancel).await?;
    if cancel.is_cancelled() && report.state == SagaState::Done {
        eprintln!(
            "agent-kernel: the signal came while the last step was running; no step was left to stop before, so the saga completed"
        );
    }
    progress.finish();
    out.saga(&report);
    finish_live_export(exporter);
    Ok(approvals::exit_code(&report))
}

pub(crate) async fn resume(cli: &Cli, out: &Output, args: &ResumeArgs) -> Result<u8, Failure> {
    let ResumeArgs { saga, no_wait } = args;
    let saga_id = parse_saga_id(saga)?;
    require_log(cli)?;
    let kernel = open_kernel_for_approvals(cli)?;
    let progress = progress::StepProgress::hidden();
    let cancel = Arc::new(Cancellation::new());
    watch_signals(cancel.clone());
    let report = kernel.resume(&saga_id, &progress, &cancel).await?;
    let report = approvals::settle_waits(&kernel, report, *no_wait, &progress, &cancel).await?;
    out.saga(&report);
    Ok(approvals::exit_code(&report))
}

pub(crate) async fn mcp(cli: &Cli, _out: &Output, args: &McpArgs) -> Result<u8, Failure> {
    let McpArgs {
        actor,
        drills,
        recover,
        durability,
    } = args;
    // The recovery's kernel is opened, as the server's is, before the process confines
    // itself (opening the server's kernel does that): a confined process can no longer
    // read the policy, tools and table files it needs to open one.
    let recovery = if *recover && log_present(&db_path(cli))? {
        let options = verify_before_acting(cli, false).await?;
        Some(open_unconfined(
            cli,
            Durability::Full,
            Compensation::Only,
            options,
            true,
        )?)
    } else {
        None
    };
    let live = live_export_config()?;
    // Told to the agent up front: where files may be touched, what a relative path means.
    let policy = load_policy(cli)?;
    let settings = agent_kernel::mcp_settings_from(&policy).map_err(Failure::bad_input)?;
    let files = {
        let roots = policy
            .fs()
            .map(|fs| fs.allow().to_vec())
            .unwrap_or_default();
        let folder = config_folder(cli);
        let cwd = std::fs::canonicalize(&folder).map_err(|error| {
            Failure::bad_input(anyhow::anyhow!(
                "cannot resolve the project folder {}: {error}",
                folder.display()
            ))
        })?;
        Some(agent_kernel_mcp::files_note(&roots, &cwd))
    };
    let (kernel, exporter) = open_kernel_exporting(
        cli,
        *durability,
        Compensation::AndExecution,
        Vec::new(),
        *drills,
        live,
    )?;
    if let Some(recovery) = recovery {
        let report = operator::recover(&recovery.kernel, &progress::StepProgress::hidden()).await?;
        let counts = report.counts();
        eprintln!(
            "agent-kernel: recovered before serving: {} saga(s) rolled back, {} left for an operator",
            counts.rolled_back, counts.left_for_operator
        );
    }
    let notice = if kernel.has_recoverable_sagas().await? {
        let notice = "this log holds unsettled sagas of processes that are no longer running; what they touched stays locked (a call on it is refused as a conflict) until `agent-kernel recover`, or `agent-kernel mcp --recover`, settles them";
        eprintln!("agent-kernel: {notice}");
        Some(notice.to_owned())
    } else {
        None
    };
    let served = agent_kernel_mcp::serve_stdio(
        kernel,
        agent_kernel_mcp::ServerOptions {
            actor: actor.clone(),
            notice,
            files,
            on_denied: settings.on_denied,
        },
    )
    .await;
    // The open sagas were rolled back: their last spans go out before the exit.
    finish_live_export(exporter);
    served
        .map_err(|error| Failure::internal(anyhow::anyhow!("the MCP server stopped: {error}")))?;
    Ok(exit::OK)
}
