//! `ledger.add`, a tool of its own for the agent-kernel examples: a small ledger in a JSON
//! file, with a real effect and its compensation. `main.rs` drives it as a live saga;
//! `bin/ledger-driver.rs` holds sagas open for the crash tests.

use std::path::{Path, PathBuf};

use agent_kernel_api::{Compensate, Tool, ToolContext, ToolError, ToolOutput, ToolSpec, Undo};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The ledger file: a balance and its entries.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Book {
    /// What the account holds.
    pub balance: i64,
    /// The entries, oldest first.
    pub entries: Vec<Entry>,
}

/// One entry of the ledger.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// The entry's id.
    pub id: String,
    /// What it adds (negative: takes).
    pub amount: i64,
}

/// `ledger.add {id, amount}`: adds an entry, refusing to overdraw; compensation removes the
/// entry if it is there, so it is safe whether or not the effect happened.
pub struct Ledger {
    path: PathBuf,
}

impl Ledger {
    /// The tool over the ledger file at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Ledger {
        Ledger { path: path.into() }
    }

    /// The book as the file holds it (empty when there is no file).
    ///
    /// # Errors
    ///
    /// [`ToolError`] when the file cannot be read or parsed.
    pub fn read(&self) -> Result<Book, ToolError> {
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

impl Tool for Ledger {
    fn spec(&self) -> ToolSpec {
        ToolSpec::mutating("ledger.add")
            .with_schema(json!({
                "type": "object",
                "properties": { "id": { "type": "string" }, "amount": { "type": "integer" } },
                "required": ["id", "amount"],
                "additionalProperties": false,
            }))
            // Each entry is its own resource: sagas adding different entries run side by
            // side (the compensation removes its own entry by id), two on one entry conflict.
            .with_resources(["ledger:$.args.id"
                .parse()
                .expect("a valid resource template")])
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
}

impl Compensate for Ledger {
    async fn prepare(&self, _ctx: &ToolContext, args: &Value) -> Result<Undo, ToolError> {
        Undo::from_data(&entry_of(args)?.id)
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

/// The book in the ledger file at `path`.
///
/// # Panics
///
/// When the file cannot be read.
pub fn book_at(path: &Path) -> Book {
    Ledger::new(path).read().expect("the ledger reads")
}
