//! A tool of your own inside the kernel's walls: `kv.set {key, value}` keeps each value in
//! a file under `kv/`, through the context's file access, so the policy that confines
//! `fs.write` confines it too. A saga sets two keys, then gives up: both files are put
//! back as they were.
//!
//! ```sh
//! cargo run -p agent-kernel --example own_tool                        # SQLite, a temporary log
//! cargo run -p agent-kernel --example own_tool --features postgres -- postgres://localhost/agent_kernel
//! ```

use agent_kernel::{
    BeginOptions, CallAnswer, Compensate, KernelBuilder, SagaState, Tool, ToolContext, ToolError,
    ToolOutput, ToolSpec, Undo,
};
use serde_json::{Value, json};

/// `kv.set {key, value}`: writes `kv/<key>`; its compensation puts back what was there.
struct KvSet;

impl KvSet {
    fn path(args: &Value) -> String {
        format!("kv/{}", args["key"].as_str().unwrap_or_default())
    }
}

impl Tool for KvSet {
    fn spec(&self) -> ToolSpec {
        ToolSpec::mutating("kv.set")
            .with_idempotent(true)
            .with_schema(json!({
                "type": "object",
                "required": ["key", "value"],
                "properties": {
                    "key": { "type": "string", "pattern": "^[a-z0-9_-]{1,64}$" },
                    "value": { "type": "string" }
                }
            }))
    }

    async fn execute(&self, ctx: &ToolContext, args: &Value) -> Result<ToolOutput, ToolError> {
        let value = args["value"].as_str().unwrap_or_default();
        ctx.write_file(&Self::path(args), value.as_bytes().to_vec())
            .await?;
        Ok(ToolOutput::new(json!({ "key": args["key"] }))
            .with_effect(format!("set {}", args["key"])))
    }
}

impl Compensate for KvSet {
    /// What compensation needs, kept in the log before the effect: the bytes there now.
    async fn prepare(&self, ctx: &ToolContext, args: &Value) -> Result<Undo, ToolError> {
        let previous = ctx.read_file(&Self::path(args)).await?;
        Ok(Undo {
            data: json!({ "existed": previous.is_some() }),
            blob: previous,
        })
    }

    async fn compensate(
        &self,
        ctx: &ToolContext,
        args: &Value,
        undo: &Undo,
        _output: Option<&ToolOutput>,
    ) -> Result<(), ToolError> {
        let path = Self::path(args);
        match (&undo.blob, undo.data["existed"].as_bool()) {
            (Some(previous), Some(true)) => ctx.write_file(&path, previous.clone()).await,
            _ => ctx.remove_file(&path).await.map(|_| ()),
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    std::fs::create_dir(dir.path().join("kv"))?;
    std::fs::write(dir.path().join("kv/a"), "old a")?;
    let db = std::env::args()
        .nth(1)
        .map_or_else(|| dir.path().join("kv.db"), Into::into);
    let kernel = KernelBuilder::new()
        .db(db)
        .policy_toml("[fs]\nallow = [\"kv\"]\n", dir.path())?
        .cwd(dir.path())
        .tool(KvSet)
        .build()?;
    let runtime = tokio::runtime::Runtime::new()?;
    let report = runtime.block_on(async {
        let saga = kernel.begin(BeginOptions::default()).await?;
        for (key, value) in [("a", "new a"), ("b", "new b")] {
            let answer = saga
                .call("kv.set", json!({ "key": key, "value": value }), None)
                .await?;
            assert!(matches!(answer, CallAnswer::Committed(_)), "{answer:?}");
        }
        saga.abort("changed my mind").await
    })?;
    assert_eq!(report.state, SagaState::FailedRolledBack);
    assert_eq!(std::fs::read_to_string(dir.path().join("kv/a"))?, "old a");
    assert!(!dir.path().join("kv/b").exists());
    println!(
        "saga {}: {:?}; kv/a is back to \"old a\", kv/b is gone",
        report.saga_id, report.state
    );
    Ok(())
}
