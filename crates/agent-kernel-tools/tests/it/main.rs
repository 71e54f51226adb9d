//! Integration tests of the built-in tools, one module per topic, on real temporary folders.

mod check;
mod files;
mod fs_append;
mod fs_delete;
mod fs_read;
mod fs_write;
mod hostile;
#[cfg(feature = "http")]
mod http_get;
mod misc;
mod prepared;
mod validate_file;

use std::fs;
use std::path::PathBuf;
use std::sync::Arc;

use agent_kernel_api::{
    Durability, DynTool, SagaId, ToolContext, ToolEntry, ToolError, ToolOutput, Undo,
};
use agent_kernel_sandbox::{FsSandbox, HttpSandbox, Policy};
use agent_kernel_tools::builtin_tools;
use serde_json::Value;

/// A temporary tree: `base/workspace` (allowed, holding `a.txt` = "alpha") and
/// `base/outside` (holding `secret.txt`), with every built-in tool confined to `workspace`
/// and no network access.
pub(crate) struct Fixture {
    _dir: tempfile::TempDir,
    pub(crate) base: PathBuf,
    tools: Vec<Arc<dyn DynTool>>,
}

impl Fixture {
    pub(crate) fn new() -> Fixture {
        let dir = tempfile::tempdir().expect("temp dir");
        let base = dir.path().canonicalize().expect("canonical temp dir");
        fs::create_dir(base.join("workspace")).expect("workspace");
        fs::create_dir(base.join("outside")).expect("outside");
        fs::write(base.join("workspace/a.txt"), "alpha").expect("a.txt");
        fs::write(base.join("outside/secret.txt"), "secret").expect("secret.txt");
        let policy = Policy::from_toml_str(
            "[fs]\nallow = [\"workspace\"]\ndeny_names = [\".env\", \"*.pem\"]\nmax_io_bytes = 64\n",
            &base,
        )
        .expect("policy");
        let sandbox = Arc::new(FsSandbox::new(&policy).expect("sandbox"));
        let tools = builtin_tools(sandbox, Arc::new(HttpSandbox::deny_all()), base.clone())
            .into_iter()
            .map(ToolEntry::into_dyn)
            .collect();
        Fixture {
            _dir: dir,
            base,
            tools,
        }
    }

    pub(crate) fn tool(&self, id: &str) -> Arc<dyn DynTool> {
        self.tools
            .iter()
            .find(|tool| tool.id() == id)
            .cloned()
            .unwrap_or_else(|| panic!("no tool {id}"))
    }

    /// The same tools with no file access at all: compensation must not need it.
    pub(crate) fn deny_all_tool(&self, id: &str) -> Arc<dyn DynTool> {
        builtin_tools(
            Arc::new(FsSandbox::deny_all()),
            Arc::new(HttpSandbox::deny_all()),
            self.base.clone(),
        )
        .into_iter()
        .map(ToolEntry::into_dyn)
        .find(|tool| tool.id() == id)
        .unwrap_or_else(|| panic!("no tool {id}"))
    }

    pub(crate) fn path(&self, rel: &str) -> PathBuf {
        self.base.join(rel)
    }

    pub(crate) fn read(&self, rel: &str) -> Option<Vec<u8>> {
        fs::read(self.path(rel)).ok()
    }

    pub(crate) fn write(&self, rel: &str, bytes: &[u8]) {
        fs::write(self.path(rel), bytes).expect("fixture write");
    }

    /// The names in `rel`, sorted.
    pub(crate) fn listing(&self, rel: &str) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(self.path(rel))
            .expect("listable")
            .map(|entry| {
                entry
                    .expect("entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        names.sort();
        names
    }
}

pub(crate) fn ctx(tool_id: &str, step_seq: u32) -> ToolContext {
    ToolContext {
        saga_id: SagaId::new("0190a3c2-7e1b-7abc-9def-0123456789ab"),
        step_seq,
        tool_id: tool_id.to_owned(),
        idempotency_key: None,
        actor: None,
        durability: Durability::Full,
        files: std::sync::Arc::new(agent_kernel_api::NoFiles::new(".")),
    }
}

/// `prepare`, then a trip of the undo record through JSON (as through the log).
pub(crate) async fn prepare(
    tool: &Arc<dyn DynTool>,
    ctx: &ToolContext,
    args: &Value,
) -> Result<Undo, ToolError> {
    let undo = tool.prepare(ctx, args).await?;
    let json = serde_json::to_string(&undo).expect("undo serializes");
    Ok(serde_json::from_str(&json).expect("undo parses"))
}

/// `check`, `prepare` and `execute`, as the saga engine runs a step.
pub(crate) async fn run(
    tool: &Arc<dyn DynTool>,
    ctx: &ToolContext,
    args: &Value,
) -> (Undo, Result<ToolOutput, ToolError>) {
    tool.check(args).expect("check passes");
    let undo = prepare(tool, ctx, args).await.expect("prepare succeeds");
    let output = tool.execute(ctx, args).await;
    (undo, output)
}

/// Runs `tool` on `workspace/a.txt` (which holds `alpha`) with `content`, checks that it
/// then holds `after`, and that its compensation is ruled on by the policy in force: denied
/// under no policy (the file unchanged), done by another tool under the same policy.
pub(crate) async fn check_compensation_under_the_policy_in_force(
    tool: &str,
    content: &str,
    after: &[u8],
) {
    let fixture = Fixture::new();
    let ctx = ctx(tool, 0);
    let args = serde_json::json!({ "path": "workspace/a.txt", "content": content });
    let (undo, output) = run(&fixture.tool(tool), &ctx, &args).await;
    output.expect("execute");
    assert_eq!(fixture.read("workspace/a.txt").as_deref(), Some(after));
    let error = fixture
        .deny_all_tool(tool)
        .compensate(&ctx, &args, &undo, None)
        .await
        .expect_err("the policy in force allows no file");
    assert!(error.is_denied(), "{error}");
    assert_eq!(fixture.read("workspace/a.txt").as_deref(), Some(after));
    fixture
        .tool(tool)
        .compensate(&ctx, &args, &undo, None)
        .await
        .expect("compensate");
    assert_eq!(
        fixture.read("workspace/a.txt").as_deref(),
        Some(&b"alpha"[..])
    );
}
