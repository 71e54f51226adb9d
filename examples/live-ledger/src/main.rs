//! A live saga over a tool of the program's own: a ledger in a JSON file.
//!
//! Two entries are added, then a third that would overdraw the account fails; the kernel
//! compensates the first two, last first, and the ledger is back as it was.
//! Run it with `cargo run -p live-ledger`; it works in a temporary folder and leaves
//! nothing behind.

use std::path::{Path, PathBuf};

use agent_kernel_api::{
    EffectClass, Settlement, ToolContext, ToolError, ToolOutput, TransactionalTool, Undo,
};
use agent_kernel_core::{BeginOptions, CallAnswer, KernelBuilder};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The ledger file: a balance and its entries.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
struct Book {
    balance: i64,
    entries: Vec<Entry>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Entry {
    id: String,
    amount: i64,
}

/// `ledger.add {id, amount}`: adds an entry, refusing to overdraw; compensation removes the
/// entry if it is there, so it is safe whether or not the effect happened.
struct Ledger {
    path: PathBuf,
}

impl Ledger {
    fn read(&self) -> Result<Book, ToolError> {
        match std::fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|error| ToolError::failed(format!("the ledger is unreadable: {error}"))),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(Book::default()),
            Err(error) => Err(ToolError::failed(format!(
                "cannot read the ledger: {error}"
            ))),
        }
    }

    /// Replaces the file atomically: readers see the old book or the new one.
    fn write(&self, book: &Book) -> Result<(), ToolError> {
        let temp = self.path.with_extension("tmp");
        let bytes = serde_json::to_vec_pretty(book).expect("a book serializes");
        std::fs::write(&temp, bytes)
            .and_then(|()| std::fs::rename(&temp, &self.path))
            .map_err(|error| ToolError::uncertain(format!("cannot write the ledger: {error}")))
    }
}

fn entry_of(args: &Value) -> Result<Entry, ToolError> {
    Entry::deserialize(args).map_err(|error| ToolError::invalid_args(error.to_string()))
}

impl TransactionalTool for Ledger {
    fn id(&self) -> &str {
        "ledger.add"
    }

    fn effect(&self) -> EffectClass {
        EffectClass::Mutating
    }

    fn idempotent(&self) -> bool {
        false
    }

    fn settlement(&self) -> Settlement {
        Settlement::Compensate
    }

    fn args_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": { "id": { "type": "string" }, "amount": { "type": "integer" } },
            "required": ["id", "amount"],
            "additionalProperties": false,
        })
    }

    async fn prepare(&self, _ctx: &ToolContext, args: &Value) -> Result<Undo, ToolError> {
        Undo::from_data(&entry_of(args)?.id)
    }

    async fn execute(&self, _ctx: &ToolContext, args: &Value) -> Result<ToolOutput, ToolError> {
        let entry = entry_of(args)?;
        let mut book = self.read()?;
        if book.balance + entry.amount < 0 {
            // Nothing was written: a definite failure.
            return Err(ToolError::failed(format!(
                "insufficient funds: the balance is {} and `{}` takes {}",
                book.balance, entry.id, -entry.amount
            )));
        }
        book.balance += entry.amount;
        book.entries.push(entry);
        self.write(&book)?;
        Ok(ToolOutput::new(json!({ "balance": book.balance })))
    }

    async fn compensate(
        &self,
        _ctx: &ToolContext,
        _args: &Value,
        undo: &Undo,
        _output: Option<&ToolOutput>,
    ) -> Result<(), ToolError> {
        let id: String = undo.data_as()?;
        let mut book = self.read()?;
        if let Some(at) = book.entries.iter().position(|entry| entry.id == id) {
            let entry = book.entries.remove(at);
            book.balance -= entry.amount;
            self.write(&book)?;
        }
        Ok(())
    }
}

fn book_at(path: &Path) -> Book {
    Ledger {
        path: path.to_owned(),
    }
    .read()
    .expect("the ledger reads")
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let ledger = dir.path().join("ledger.json");
    std::fs::write(&ledger, r#"{"balance": 100, "entries": []}"#)?;
    let before = book_at(&ledger);

    // The front door: the log, the built-in table, this program's tool.
    let kernel = KernelBuilder::new()
        .db(dir.path().join("agent-kernel.db"))
        .without_builtin_tools()
        .tool(Ledger {
            path: ledger.clone(),
        })
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
        Ok::<_, agent_kernel_core::KernelError>(())
    })?;
    let after = book_at(&ledger);
    assert_eq!(after, before, "every entry of the failed saga was undone");
    println!("ledger back as it was: balance {}", after.balance);
    Ok(())
}
