//! `fs.append` and its compensation.

use serde_json::json;

use crate::{Fixture, ctx, prepare, run};

#[tokio::test]
async fn compensation_truncates_to_the_previous_bytes() {
    let fixture = Fixture::new();
    let tool = fixture.tool("fs.append");
    let ctx = ctx("fs.append", 1);
    let args = json!({ "path": "workspace/a.txt", "content": " beta" });
    let (undo, output) = run(&tool, &ctx, &args).await;
    let output = output.expect("execute");
    assert_eq!(
        output.data,
        json!({ "path": "workspace/a.txt", "bytes": 5, "len": 10 })
    );
    assert_eq!(output.effects, ["appended 5 bytes to workspace/a.txt"]);
    assert_eq!(
        fixture.read("workspace/a.txt").as_deref(),
        Some(&b"alpha beta"[..])
    );
    assert_eq!(undo.data["len"], json!(5));
    tool.compensate(&ctx, &args, &undo, Some(&output))
        .await
        .expect("compensate");
    assert_eq!(
        fixture.read("workspace/a.txt").as_deref(),
        Some(&b"alpha"[..])
    );
    tool.compensate(&ctx, &args, &undo, Some(&output))
        .await
        .expect("twice");
    assert_eq!(
        fixture.read("workspace/a.txt").as_deref(),
        Some(&b"alpha"[..])
    );
}

#[tokio::test]
async fn compensation_removes_a_created_file() {
    let fixture = Fixture::new();
    let tool = fixture.tool("fs.append");
    let ctx = ctx("fs.append", 0);
    let args = json!({ "path": "workspace/log.txt", "content": "x" });
    let (undo, output) = run(&tool, &ctx, &args).await;
    assert_eq!(
        output.expect("execute").effects,
        ["appended 1 byte to workspace/log.txt"]
    );
    assert_eq!(
        fixture.read("workspace/log.txt").as_deref(),
        Some(&b"x"[..])
    );
    tool.compensate(&ctx, &args, &undo, None)
        .await
        .expect("compensate");
    tool.compensate(&ctx, &args, &undo, None)
        .await
        .expect("twice");
    assert_eq!(fixture.listing("workspace"), ["a.txt"]);
}

#[tokio::test]
async fn compensation_without_execution_leaves_the_original() {
    let fixture = Fixture::new();
    let tool = fixture.tool("fs.append");
    let ctx = ctx("fs.append", 0);
    for path in ["workspace/a.txt", "workspace/log.txt"] {
        let args = json!({ "path": path, "content": "never" });
        let undo = prepare(&tool, &ctx, &args).await.expect("prepare");
        tool.compensate(&ctx, &args, &undo, None)
            .await
            .expect("in doubt");
    }
    assert_eq!(
        fixture.read("workspace/a.txt").as_deref(),
        Some(&b"alpha"[..])
    );
    assert_eq!(fixture.listing("workspace"), ["a.txt"]);
}

#[tokio::test]
async fn a_file_shortened_by_someone_else_fails_compensation() {
    let fixture = Fixture::new();
    let tool = fixture.tool("fs.append");
    let ctx = ctx("fs.append", 0);
    let args = json!({ "path": "workspace/a.txt", "content": "!" });
    let (undo, output) = run(&tool, &ctx, &args).await;
    output.expect("execute");
    fixture.write("workspace/a.txt", b"al");
    let error = tool
        .compensate(&ctx, &args, &undo, None)
        .await
        .expect_err("conflict");
    assert!(error.message().contains("changed unexpectedly"), "{error}");
    assert_eq!(fixture.read("workspace/a.txt").as_deref(), Some(&b"al"[..]));

    std::fs::remove_file(fixture.path("workspace/a.txt")).expect("remove");
    let error = tool
        .compensate(&ctx, &args, &undo, None)
        .await
        .expect_err("gone");
    assert!(error.message().contains("does not exist"), "{error}");
}

#[tokio::test]
async fn compensation_is_ruled_on_by_the_policy_in_force() {
    crate::check_compensation_under_the_policy_in_force("fs.append", "++", b"alpha++").await;
}

#[tokio::test]
async fn an_append_since_the_step_counts_as_changed() {
    let fixture = Fixture::new();
    let tool = fixture.tool("fs.append");
    let ctx = ctx("fs.append", 1);
    let args = json!({ "path": "workspace/a.txt", "content": "+1" });
    let (undo, output) = run(&tool, &ctx, &args).await;
    let output = output.expect("execute");
    let check = || tool.changed_since(&ctx, &args, &undo, Some(&output));
    assert_eq!(check().await.expect("checks"), None);
    let mut bytes = std::fs::read(fixture.path("workspace/a.txt")).expect("reads");
    bytes.extend_from_slice(b"+2");
    std::fs::write(fixture.path("workspace/a.txt"), &bytes).expect("writes");
    assert!(check().await.expect("checks").is_some());
}
