//! The commands that read: `audit`, `sandbox status`, `tools`, `replay`, `export`, `log`
//! and `fsm`.

#[allow(clippy::wildcard_imports)]
use crate::*;

pub(crate) async fn replay(cli: &Cli, out: &Output, args: &ReplayArgs) -> Result<u8, Failure> {
    let ReplayArgs { saga } = args;
    let saga_id = parse_saga_id(saga)?;
    require_log(cli)?;
    let fsm = load_fsm(cli)?;
    let tools = build_dispatcher(cli)?;
    let log = open_reading_log(cli).await?;
    let record = log
        .saga(&saga_id)
        .await?
        .ok_or_else(|| KernelError::SagaNotFound(saga_id.clone()))?;
    drop(log);
    for step in &record.steps {
        // An upstream server is asked for its tools only when a step used one.
        let _ = tools.load(&step.tool_id).await;
    }
    let recorded = audit::saga_history(&db_path(cli), &saga_id).await?;
    let report = agent_kernel::replay(&record, &recorded, &fsm, &tools);
    out.replay(&report);
    Ok(if report.divergence.is_none() {
        exit::OK
    } else {
        exit::ROLLED_BACK
    })
}

pub(crate) async fn export(cli: &Cli, _out: &Output, args: &ExportArgs) -> Result<u8, Failure> {
    let ExportArgs {
        otel: _,
        saga,
        all: _,
        out: file,
    } = args;
    let saga_id = saga.as_deref().map(parse_saga_id).transpose()?;
    require_log(cli)?;
    export::otel(cli, &db_path(cli), saga_id, file.as_deref()).await
}

pub(crate) async fn log(cli: &Cli, out: &Output, args: &LogArgs) -> Result<u8, Failure> {
    let LogArgs { saga, limit } = args;
    let log = match saga {
        // No log, no sagas.
        None => match open_reading_log_if_present(cli).await? {
            Some(log) => log,
            None => {
                out.saga_list(&[]);
                return Ok(exit::OK);
            }
        },
        Some(_) => open_reading_log(cli).await?,
    };
    let log = &*log;
    match saga {
        Some(saga) => {
            let saga_id = parse_saga_id(saga)?;
            out.saga_record(&operator::saga(log, &saga_id).await?);
        }
        None => {
            let query = agent_kernel_api::SagaQuery {
                limit: *limit,
                ..agent_kernel_api::SagaQuery::default()
            };
            out.saga_list(&operator::saga_page(log, &query).await?);
        }
    }
    Ok(exit::OK)
}

pub(crate) async fn fsm(cli: &Cli, out: &Output, args: &FsmArgs) -> Result<u8, Failure> {
    let FsmArgs {
        show: _,
        format,
        action,
    } = args;
    match action {
        Some(FsmAction::Check { file }) => {
            let fsm = read_fsm(file)?;
            out.fsm_checked(file, &fsm);
            Ok(exit::OK)
        }
        None => {
            let fsm = load_fsm(cli)?;
            out.fsm(&fsm, *format);
            Ok(exit::OK)
        }
    }
}

pub(crate) async fn audit(cli: &Cli, _out: &Output, args: &AuditArgs) -> Result<u8, Failure> {
    let AuditArgs { action } = args;
    match action {
        AuditAction::Verify => {
            let key = audit_key(cli)?;
            require_log(cli)?;
            audit::verify_command(&db_path(cli), key, cli.json).await
        }
        AuditAction::List { kind, saga, limit } => {
            require_log(cli)?;
            let query = agent_kernel_txlog::AuditQuery {
                kinds: kind.clone(),
                saga_id: saga
                    .as_deref()
                    .map(parse_saga_id)
                    .transpose()?
                    .map(|id| id.as_str().to_owned()),
                limit: *limit,
            };
            audit::list_command(&db_path(cli), query, cli.json).await
        }
        AuditAction::Seal => {
            let key = audit_key(cli)?;
            require_log(cli)?;
            let owner = this_process()?;
            audit::seal_command(&db_path(cli), key, cli.json, owner, || {
                open_log(cli, Durability::Full)
            })
            .await
        }
    }
}

pub(crate) async fn sandbox(cli: &Cli, out: &Output, args: &SandboxArgs) -> Result<u8, Failure> {
    let SandboxArgs {
        action: SandboxAction::Status {
            probe,
            probe_connect,
        },
    } = args;
    let policy = load_policy(cli)?;
    let files = restrict_to_roots(&policy);
    let network = restrict_network(&policy);
    let probe = probe.as_ref().map(|path| {
        let result = std::fs::File::open(path);
        (
            path.clone(),
            result.map(|_| ()).map_err(|error| error.to_string()),
        )
    });
    let probe_connect = probe_connect.map(|address| {
        let result = std::net::TcpStream::connect_timeout(&address, PROBE_CONNECT_TIMEOUT);
        (
            address.to_string(),
            result.map(|_| ()).map_err(|error| error.to_string()),
        )
    });
    out.sandbox_status(&output::SandboxStatus {
        policy: &policy,
        files: &files,
        network: &network,
        probe: probe.as_ref(),
        probe_connect: probe_connect.as_ref(),
    });
    Ok(exit::OK)
}

pub(crate) async fn tools(cli: &Cli, out: &Output, args: &ToolsArgs) -> Result<u8, Failure> {
    // Read once: the listing and the approval rules come from the same policy.
    let policy = load_policy(cli)?;
    let approvals = agent_kernel::approval_policy_from(&policy).map_err(Failure::bad_input)?;
    let tools = wiring(cli)
        .policy(policy)
        .listing()
        .map_err(Failure::bad_input)?;
    // An upstream server is started only when asked: listing tools should not run programs.
    if args.upstream {
        tools.load_all().await;
    }
    out.tools(&tools, &approvals);
    Ok(exit::OK)
}
