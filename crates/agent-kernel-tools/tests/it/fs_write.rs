//! `fs.write`: atomic replacement and its compensation.

use serde_json::json;

use crate::{Fixture, ctx, prepare, run};

#[tokio::test]
async fn compensation_restores_an_overwritten_file() {
    let fixture = Fixture::new();
    let tool = fixture.tool("fs.write");
    let ctx = ctx("fs.write", 0);
    let args = json!({ "path": "workspace/a.txt", "content": "new content" });
    let (undo, output) = run(&tool, &ctx, &args).await;
    let output = output.expect("execute");
    assert_eq!(
        output.data,
        json!({ "path": "workspace/a.txt", "bytes": 11 })
    );
    assert_eq!(output.effects, ["wrote 11 bytes to workspace/a.txt"]);
    assert_eq!(
        fixture.read("workspace/a.txt").as_deref(),
        Some(&b"new content"[..])
    );
    assert_eq!(undo.blob.as_deref(), Some(&b"alpha"[..]));
    assert_eq!(undo.data["existed"], json!(true));
    assert_eq!(
        undo.data["temp"],
        json!(".agent-kernel-0190a3c2-7e1b-7abc-9def-0123456789ab-0.tmp")
    );

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
    assert_eq!(fixture.listing("workspace"), ["a.txt"]);
}

#[tokio::test]
async fn compensation_removes_a_created_file() {
    let fixture = Fixture::new();
    let tool = fixture.tool("fs.write");
    let ctx = ctx("fs.write", 3);
    let args = json!({ "path": "workspace/new.txt", "content": "fresh" });
    let (undo, output) = run(&tool, &ctx, &args).await;
    output.expect("execute");
    assert_eq!(undo.data["existed"], json!(false));
    assert!(undo.blob.is_none());
    assert_eq!(
        fixture.read("workspace/new.txt").as_deref(),
        Some(&b"fresh"[..])
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
    let tool = fixture.tool("fs.write");
    let ctx = ctx("fs.write", 0);
    for path in ["workspace/a.txt", "workspace/new.txt"] {
        let args = json!({ "path": path, "content": "never written" });
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
async fn compensation_removes_a_leftover_temp_file() {
    let fixture = Fixture::new();
    let tool = fixture.tool("fs.write");
    let ctx = ctx("fs.write", 7);
    let args = json!({ "path": "workspace/a.txt", "content": "new" });
    let undo = prepare(&tool, &ctx, &args).await.expect("prepare");
    // A crash between creating the temporary file and the rename leaves it behind.
    let temp = undo.data["temp"].as_str().expect("temp name").to_owned();
    fixture.write(&format!("workspace/{temp}"), b"ne");
    tool.compensate(&ctx, &args, &undo, None)
        .await
        .expect("compensate");
    assert_eq!(fixture.listing("workspace"), ["a.txt"]);
    assert_eq!(
        fixture.read("workspace/a.txt").as_deref(),
        Some(&b"alpha"[..])
    );
}

#[tokio::test]
async fn compensation_is_ruled_on_by_the_policy_in_force() {
    crate::check_compensation_under_the_policy_in_force("fs.write", "new", b"new").await;
}

#[tokio::test]
async fn a_symbolic_link_is_never_written_through() {
    let fixture = Fixture::new();
    std::os::unix::fs::symlink(
        fixture.path("outside/secret.txt"),
        fixture.path("workspace/link"),
    )
    .expect("symlink");
    let tool = fixture.tool("fs.write");
    let args = json!({ "path": "workspace/link", "content": "pwned" });
    tool.check(&args).expect("lexically fine");
    let error = tool
        .prepare(&ctx("fs.write", 0), &args)
        .await
        .expect_err("refused");
    assert!(error.is_denied(), "{error}");
    let error = tool
        .execute(&ctx("fs.write", 0), &args)
        .await
        .expect_err("refused");
    assert!(error.is_denied(), "{error}");
    assert!(!error.is_uncertain());
    assert_eq!(
        fixture.read("outside/secret.txt").as_deref(),
        Some(&b"secret"[..])
    );
}

#[tokio::test]
async fn a_missing_folder_is_a_definite_failure() {
    let fixture = Fixture::new();
    let tool = fixture.tool("fs.write");
    let args = json!({ "path": "workspace/missing/b.txt", "content": "x" });
    let error = tool
        .prepare(&ctx("fs.write", 0), &args)
        .await
        .expect_err("no folder");
    assert!(!error.is_uncertain() && !error.is_denied(), "{error}");
    assert!(error.message().contains("parent folder"), "{error}");
    let error = tool
        .execute(&ctx("fs.write", 0), &args)
        .await
        .expect_err("no folder");
    assert!(!error.is_uncertain(), "{error}");
    assert!(!fixture.path("workspace/missing").exists());
}

#[tokio::test]
async fn a_file_too_large_to_back_up_is_refused_before_the_effect() {
    let fixture = Fixture::new(); // max_io_bytes = 64
    fixture.write("workspace/big.txt", &[b'x'; 100]);
    let tool = fixture.tool("fs.write");
    let args = json!({ "path": "workspace/big.txt", "content": "small" });
    let error = tool
        .prepare(&ctx("fs.write", 0), &args)
        .await
        .expect_err("too large");
    assert!(error.is_denied(), "{error}");
}

#[tokio::test]
async fn other_bytes_or_a_removed_file_since_the_write_count_as_changed() {
    let fixture = Fixture::new();
    let tool = fixture.tool("fs.write");
    let ctx = ctx("fs.write", 1);
    let args = json!({ "path": "workspace/a.txt", "content": "mine" });
    let (undo, output) = run(&tool, &ctx, &args).await;
    let output = output.expect("execute");
    let check = || tool.changed_since(&ctx, &args, &undo, Some(&output));
    assert_eq!(check().await.expect("checks"), None);
    std::fs::write(fixture.path("workspace/a.txt"), "MINE").expect("writes");
    assert!(
        check()
            .await
            .expect("checks")
            .is_some_and(|what| what.contains("no longer holds"))
    );
    std::fs::write(fixture.path("workspace/a.txt"), "mine, and more").expect("writes");
    assert!(
        check()
            .await
            .expect("checks")
            .is_some_and(|what| what.contains("another writer"))
    );
    std::fs::remove_file(fixture.path("workspace/a.txt")).expect("removes");
    assert!(
        check()
            .await
            .expect("checks")
            .is_some_and(|what| what.contains("removed"))
    );
}
