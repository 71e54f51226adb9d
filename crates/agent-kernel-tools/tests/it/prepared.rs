//! Between a step's preparation and its claim, another writer may leave exactly what the
//! step would: `changed_since` must accept that (the step's outcome may be unknown), but
//! before the effect it is a change (`changed_since_prepared`), or compensating the step
//! would put back what the preparation found over the other writer's result.

use std::sync::Arc;

use agent_kernel_api::{DynTool, ToolContext, Undo};
use serde_json::{Value, json};

use crate::{Fixture, ctx, prepare};

/// What the tool says changed since the preparation, before the effect.
async fn since_prepared(
    tool: &Arc<dyn DynTool>,
    ctx: &ToolContext,
    args: &Value,
    undo: &Undo,
) -> Option<String> {
    tool.changed_since_prepared(ctx, args, undo)
        .await
        .expect("checks")
}

/// What the tool says changed since the step, its outcome unknown.
async fn since_step(
    tool: &Arc<dyn DynTool>,
    ctx: &ToolContext,
    args: &Value,
    undo: &Undo,
) -> Option<String> {
    tool.changed_since(ctx, args, undo, None)
        .await
        .expect("checks")
}

/// `fs.write` prepared over `alpha`; another writer leaves the step's bytes first.
#[tokio::test]
async fn a_file_already_holding_the_steps_bytes_has_changed_since_its_preparation() {
    let fixture = Fixture::new();
    let tool = fixture.tool("fs.write");
    let ctx = ctx("fs.write", 0);
    let args = json!({ "path": "workspace/a.txt", "content": "mine" });
    let undo = prepare(&tool, &ctx, &args).await.expect("prepares");
    assert_eq!(since_prepared(&tool, &ctx, &args, &undo).await, None);
    fixture.write("workspace/a.txt", b"mine");
    assert_eq!(
        since_step(&tool, &ctx, &args, &undo).await,
        None,
        "after the effect, the step's own bytes are no change"
    );
    let change = since_prepared(&tool, &ctx, &args, &undo).await;
    assert!(
        change.is_some_and(|why| why.contains("no longer holds the 5 bytes")),
        "before the effect, they are another writer's"
    );
    // And a file where the preparation found none.
    let args = json!({ "path": "workspace/new.txt", "content": "mine" });
    let undo = prepare(&tool, &ctx, &args).await.expect("prepares");
    fixture.write("workspace/new.txt", b"mine");
    let change = since_prepared(&tool, &ctx, &args, &undo).await;
    assert!(change.is_some_and(|why| why.contains("exists now")));
}

/// `fs.append` prepared over the 5 bytes of `alpha`; another writer appends the same text.
#[tokio::test]
async fn a_file_already_grown_by_the_steps_text_has_changed_since_its_preparation() {
    let fixture = Fixture::new();
    let tool = fixture.tool("fs.append");
    let ctx = ctx("fs.append", 0);
    let args = json!({ "path": "workspace/a.txt", "content": "!" });
    let undo = prepare(&tool, &ctx, &args).await.expect("prepares");
    assert_eq!(since_prepared(&tool, &ctx, &args, &undo).await, None);
    fixture.write("workspace/a.txt", b"alpha!");
    assert_eq!(since_step(&tool, &ctx, &args, &undo).await, None);
    let change = since_prepared(&tool, &ctx, &args, &undo).await;
    assert!(
        change.is_some_and(|why| why.contains("holds 6 bytes now")),
        "compensating would cut the other writer's append"
    );
}

/// `fs.delete` prepared over `alpha`; another writer deletes the file first. And one
/// prepared where no file was; another writer creates it.
#[tokio::test]
async fn a_file_deleted_or_created_by_another_has_changed_since_its_preparation() {
    let fixture = Fixture::new();
    let tool = fixture.tool("fs.delete");
    let ctx = ctx("fs.delete", 0);
    let args = json!({ "path": "workspace/a.txt" });
    let undo = prepare(&tool, &ctx, &args).await.expect("prepares");
    assert_eq!(since_prepared(&tool, &ctx, &args, &undo).await, None);
    std::fs::remove_file(fixture.path("workspace/a.txt")).expect("removes");
    assert_eq!(since_step(&tool, &ctx, &args, &undo).await, None);
    let change = since_prepared(&tool, &ctx, &args, &undo).await;
    assert!(
        change.is_some_and(|why| why.contains("no longer holds")),
        "compensating would bring back what the other writer deleted"
    );
    let args = json!({ "path": "workspace/none.txt", "missing_ok": true });
    let undo = prepare(&tool, &ctx, &args).await.expect("prepares");
    fixture.write("workspace/none.txt", b"theirs");
    let change = since_prepared(&tool, &ctx, &args, &undo).await;
    assert!(
        change.is_some_and(|why| why.contains("exists now")),
        "deleting it would lose the other writer's file for good"
    );
}
