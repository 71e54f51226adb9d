//! A driver for the crash tests: `ledger-driver hold DIR N [--ledger]` begins N live sagas
//! in the log `DIR/agent-kernel.db` under the policy `DIR/sandbox.toml`, each writing
//! `ws/file-I` (and, with `--ledger`, adding an entry to `DIR/ledger.json`), prints `ready`
//! and waits to be killed; `ledger-driver recover DIR` recovers that log as a program that
//! has the `ledger.add` tool.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use agent_kernel::{BeginOptions, CallAnswer, KernelBuilder, NoObserver, RecoveryAction};
use live_ledger::Ledger;
use serde_json::json;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(mode), Some(dir)) = (args.first(), args.get(1)) else {
        return Err("usage: ledger-driver hold DIR N [--ledger] | recover DIR".into());
    };
    let dir = PathBuf::from(dir);
    let kernel = KernelBuilder::new()
        .db(dir.join("agent-kernel.db"))
        .sandbox_file(dir.join("sandbox.toml"))
        .cwd(&dir)
        .tool(Ledger::new(dir.join("ledger.json")))
        .build()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        match mode.as_str() {
            "hold" => {
                let n_sagas: usize = args.get(2).ok_or("hold needs N")?.parse()?;
                let with_ledger = args.iter().any(|arg| arg == "--ledger");
                let mut open = Vec::new();
                for saga_idx in 0..n_sagas {
                    let saga = kernel.begin(BeginOptions::default()).await?;
                    let mut calls = vec![(
                        "fs.write",
                        json!({ "path": format!("ws/file-{saga_idx}"), "content": "new" }),
                    )];
                    if with_ledger {
                        calls.push((
                            "ledger.add",
                            json!({ "id": format!("entry-{saga_idx}"), "amount": 1 }),
                        ));
                    }
                    for (tool, args) in calls {
                        let answer = saga.call(tool, args, None).await?;
                        if !matches!(answer, CallAnswer::Committed(_)) {
                            return Err(format!("{tool}: {answer:?}").into());
                        }
                    }
                    open.push(saga);
                }
                println!("ready");
                std::io::stdout().flush()?;
                // Held open until the test kills this process.
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok(())
            }
            "recover" => {
                let report = kernel.recover(&NoObserver).await?;
                for action in &report.sagas {
                    match action {
                        RecoveryAction::RolledBack(saga) => {
                            println!("{} {}", saga.saga_id, saga.state);
                        }
                        other => println!("{other:?}"),
                    }
                }
                if !report.needs_operator() {
                    Ok(())
                } else {
                    Err("not every saga was rolled back".into())
                }
            }
            other => Err(format!("unknown mode `{other}`").into()),
        }
    })
}
