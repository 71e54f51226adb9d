//! A mini-saga exported as OpenTelemetry spans (the seed spec's Phase 5.2).
//!
//! In a temporary folder: two `fs.write` steps succeed, a third step fails, and the kernel
//! compensates the two writes, last first. The saga is then read back from its log and
//! printed on stdout as OTLP/JSON: a root span, three `execute_tool` spans and two
//! `compensate` spans. The folder, its log included, is removed at the end.
//!
//! Run it with `cargo run -p agent-kernel-otel --example otel_saga`; pipe it into a
//! collector with `| curl -X POST -H 'Content-Type: application/json' --data-binary @-
//! http://localhost:4318/v1/traces`.

use std::collections::BTreeSet;

use agent_kernel::{KernelBuilder, NoObserver};
use agent_kernel_api::{Plan, SagaState};
use agent_kernel_otel::{SagaHistory, export_request};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    std::fs::create_dir(dir.path().join("ws"))?;
    let db = dir.path().join("agent-kernel.db");
    let kernel = KernelBuilder::new()
        .db(&db)
        .cwd(dir.path())
        .policy_toml("[fs]\nallow = [\"ws\"]\n", dir.path())?
        .fsm(agent_kernel_fsm::Guardrail::builtin())
        .without_tools_file()
        .with_drill_tools()
        .build()?;
    let plan = Plan::from_json(
        r#"{"name": "otel-example", "steps": [
            {"tool": "fs.write", "args": {"path": "ws/a.txt", "content": "first"}},
            {"tool": "fs.write", "args": {"path": "ws/b.txt", "content": "second"}},
            {"tool": "fault.fail", "args": {"message": "the deployment check failed"}}
        ]}"#,
    )?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let record = runtime.block_on(async {
        let report = kernel.run(&plan, &NoObserver).await?;
        assert_eq!(report.state, SagaState::FailedRolledBack, "{report:?}");
        let record = kernel.log().saga(&report.saga_id).await?;
        Ok::<_, Box<dyn std::error::Error>>(record.ok_or("the saga is not in its log")?)
    })?;
    assert!(
        !dir.path().join("ws/a.txt").exists(),
        "the writes were undone"
    );
    let saga_id = record.saga.saga_id.as_str().to_owned();
    let chains = agent_kernel_txlog::saga_chains(&db, &BTreeSet::from([saga_id.clone()]))?;
    let request = export_request(&[SagaHistory {
        record: &record,
        chain: chains.get(&saga_id).map_or(&[], Vec::as_slice),
    }]);
    println!("{}", serde_json::to_string_pretty(&request)?);
    drop(kernel);
    dir.close()?;
    Ok(())
}
