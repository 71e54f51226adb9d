//! A live saga over a tool of the program's own: a ledger in a JSON file.
//!
//! Two entries are added, then a third that would overdraw the account fails; the kernel
//! compensates the first two, last first, and the ledger is back as it was.
//! Run it with `cargo run -p live-ledger`; it works in a temporary folder and leaves
//! nothing behind.

use agent_kernel::{BeginOptions, CallAnswer, KernelBuilder};
use live_ledger::{Ledger, book_at};
use serde_json::json;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let ledger = dir.path().join("ledger.json");
    std::fs::write(&ledger, r#"{"balance": 100, "entries": []}"#)?;
    let before = book_at(&ledger);

    // The front door: the log, the built-in table, this program's tool.
    let kernel = KernelBuilder::new()
        .db(dir.path().join("agent-kernel.db"))
        .without_builtin_tools()
        .tool(Ledger::new(&ledger))
        .build()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let saga = kernel.begin(BeginOptions::default()).await?;
        for (id, amount) in [("salary", 50), ("rent", -120), ("holiday", -500)] {
            match saga
                .call("ledger.add", json!({ "id": id, "amount": amount }), None)
                .await?
            {
                CallAnswer::Committed(step) => {
                    println!("{id}: committed, {}", step.output.expect("an output").data);
                }
                CallAnswer::Failed(report) | CallAnswer::Denied(report) => {
                    println!("{id}: {}", report.failure.expect("why").error);
                    println!("saga {}: {}", report.saga_id, report.state);
                    for step in &report.steps {
                        println!("  step {} {}: {}", step.seq, step.tool, step.status);
                    }
                    break;
                }
                other => println!("{id}: {other:?}"),
            }
        }
        Ok::<_, agent_kernel::KernelError>(())
    })?;
    let after = book_at(&ledger);
    assert_eq!(after, before, "every entry of the failed saga was undone");
    println!("ledger back as it was: balance {}", after.balance);
    Ok(())
}
