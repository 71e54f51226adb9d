//! `fs.delete` and its compensation.

use serde_json::json;

use crate::{Fixture, ctx, prepare, run};

#[tokio::test]
async fn compensation_restores_a_deleted_file() {
    let fixture = Fixture::new();
    let tool = fixture.tool("fs.delete");
    let ctx = ctx("fs.delete", 2);
    let args = json!({ "path": "workspace/a.txt" });
    let (undo, output) = run(&tool, &ctx, &args).await;
    let output = output.expect("execute");
    assert_eq!(output.effects, ["deleted workspace/a.txt (5 bytes)"]);
    assert_eq!(fixture.listing("workspace"), Vec::<String>::new());
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
async fn deleting_a_missing_file_fails_before_the_effect() {
    let fixture = Fixture::new();
    let tool = fixture.tool("fs.delete");
    let args = json!({ "path": "workspace/none.txt" });
    tool.check(&args).expect("check does not look at the disk");
    let error = tool
        .prepare(&ctx("fs.delete", 0), &args)
        .await
        .expect_err("missing");
    assert!(!error.is_uncertain() && !error.is_denied(), "{error}");
    assert!(error.message().contains("does not exist"), "{error}");
}

/// A step that deleted nothing: undoing it is no change, and its compensation succeeds.
async fn undoes_to_nothing(
    tool: &std::sync::Arc<dyn agent_kernel_api::DynTool>,
    ctx: &agent_kernel_api::ToolContext,
    args: &serde_json::Value,
    undo: &agent_kernel_api::Undo,
    output: &agent_kernel_api::ToolOutput,
) {
    let changed = tool
        .changed_since(ctx, args, undo, Some(output))
        .await
        .expect("checks");
    assert_eq!(
        changed, None,
        "undoing a step that deleted nothing changes nothing"
    );
    tool.compensate(ctx, args, undo, Some(output))
        .await
        .expect("compensates");
}

/// With `missing_ok`, deleting what is absent succeeds and deletes nothing, and its
/// compensation puts nothing back, even once a file of that name exists again: a
/// compensation that deletes what its step created can run twice (after a lost answer).
#[tokio::test]
async fn missing_ok_deletes_an_absent_file_as_a_success_that_undoes_to_nothing() {
    let fixture = Fixture::new();
    let tool = fixture.tool("fs.delete");
    let ctx = ctx("fs.delete", 0);
    let args = json!({ "path": "workspace/none.txt", "missing_ok": true });
    tool.check(&args).expect("valid");
    let (undo, output) = run(&tool, &ctx, &args).await;
    let output = output.expect("execute");
    assert_eq!(output.data["deleted"], false, "{:?}", output.data);
    assert_eq!(
        output.effects,
        ["workspace/none.txt was absent; nothing deleted"]
    );
    assert_eq!(undo.blob, None);
    std::fs::write(fixture.path("workspace/none.txt"), "later").expect("writes");
    undoes_to_nothing(&tool, &ctx, &args, &undo, &output).await;
    assert_eq!(
        fixture.read("workspace/none.txt").as_deref(),
        Some(&b"later"[..])
    );
    // Found by `prepare`, removed by another writer before the step ran: the step deleted
    // nothing, and its compensation does not bring back what the other writer removed.
    std::fs::write(fixture.path("workspace/gone.txt"), "theirs").expect("writes");
    let args = json!({ "path": "workspace/gone.txt", "missing_ok": true });
    let undo = prepare(&tool, &ctx, &args).await.expect("prepare");
    std::fs::remove_file(fixture.path("workspace/gone.txt")).expect("removes");
    let output = tool.execute(&ctx, &args).await.expect("execute");
    assert_eq!(output.data["deleted"], false);
    assert_eq!(tool.restores(&args, &undo, Some(&output)), None);
    std::fs::write(fixture.path("workspace/gone.txt"), "a third").expect("writes");
    undoes_to_nothing(&tool, &ctx, &args, &undo, &output).await;
    assert_eq!(
        fixture.read("workspace/gone.txt").as_deref(),
        Some(&b"a third"[..])
    );
    // A file that exists is deleted as without the flag, and put back.
    let args = json!({ "path": "workspace/a.txt", "missing_ok": true });
    let (undo, output) = run(&tool, &ctx, &args).await;
    assert_eq!(output.expect("execute").data["deleted"], true);
    assert!(fixture.read("workspace/a.txt").is_none());
    tool.compensate(&ctx, &args, &undo, None)
        .await
        .expect("compensates");
    assert_eq!(
        fixture.read("workspace/a.txt").as_deref(),
        Some(&b"alpha"[..])
    );
}

#[tokio::test]
async fn compensation_without_execution_leaves_the_original() {
    let fixture = Fixture::new();
    let tool = fixture.tool("fs.delete");
    let ctx = ctx("fs.delete", 0);
    let args = json!({ "path": "workspace/a.txt" });
    let undo = prepare(&tool, &ctx, &args).await.expect("prepare");
    let before = std::fs::metadata(fixture.path("workspace/a.txt")).expect("metadata");
    tool.compensate(&ctx, &args, &undo, None)
        .await
        .expect("in doubt");
    let after = std::fs::metadata(fixture.path("workspace/a.txt")).expect("metadata");
    // Not even rewritten: the same file is still there.
    assert_eq!(
        std::os::unix::fs::MetadataExt::ino(&before),
        std::os::unix::fs::MetadataExt::ino(&after)
    );
    assert_eq!(
        fixture.read("workspace/a.txt").as_deref(),
        Some(&b"alpha"[..])
    );
}

#[tokio::test]
async fn compensation_replaces_different_content_and_removes_a_leftover_temp() {
    let fixture = Fixture::new();
    let tool = fixture.tool("fs.delete");
    let ctx = ctx("fs.delete", 4);
    let args = json!({ "path": "workspace/a.txt" });
    let (undo, output) = run(&tool, &ctx, &args).await;
    output.expect("execute");
    let temp = undo.data["temp"].as_str().expect("temp").to_owned();
    // A crash during an earlier compensation left a temporary file and a partial file.
    fixture.write(&format!("workspace/{temp}"), b"alp");
    fixture.write("workspace/a.txt", b"something else");
    tool.compensate(&ctx, &args, &undo, None)
        .await
        .expect("compensate");
    assert_eq!(
        fixture.read("workspace/a.txt").as_deref(),
        Some(&b"alpha"[..])
    );
    assert_eq!(fixture.listing("workspace"), ["a.txt"]);
}

#[tokio::test]
async fn a_damaged_undo_record_cannot_remove_other_files() {
    let fixture = Fixture::new();
    let tool = fixture.tool("fs.delete");
    let ctx = ctx("fs.delete", 0);
    let args = json!({ "path": "workspace/a.txt" });
    let mut undo = prepare(&tool, &ctx, &args).await.expect("prepare");
    fixture.write("workspace/keep.txt", b"keep");
    undo.data["temp"] = json!("keep.txt");
    let error = tool
        .compensate(&ctx, &args, &undo, None)
        .await
        .expect_err("refused");
    assert!(
        error.message().contains("unexpected temporary file"),
        "{error}"
    );
    assert_eq!(
        fixture.read("workspace/keep.txt").as_deref(),
        Some(&b"keep"[..])
    );
    undo.data["surprise"] = json!(1);
    let error = tool
        .compensate(&ctx, &args, &undo, None)
        .await
        .expect_err("malformed");
    assert!(error.message().contains("malformed"), "{error}");
}

#[tokio::test]
async fn a_file_created_again_since_the_delete_counts_as_changed() {
    let fixture = Fixture::new();
    let tool = fixture.tool("fs.delete");
    let ctx = ctx("fs.delete", 1);
    let args = json!({ "path": "workspace/a.txt" });
    let (undo, output) = run(&tool, &ctx, &args).await;
    let output = output.expect("execute");
    let unchanged = tool
        .changed_since(&ctx, &args, &undo, Some(&output))
        .await
        .expect("checks");
    assert_eq!(unchanged, None);
    std::fs::write(fixture.path("workspace/a.txt"), "someone else's").expect("writes");
    let changed = tool
        .changed_since(&ctx, &args, &undo, Some(&output))
        .await
        .expect("checks");
    assert!(changed.is_some_and(|what| what.contains("exists again")));
}

/// A folder link retargeted between a step and its compensation: the compensation refuses
/// as changed since (the recorded path now leads to another file, which its saga never
/// claimed) and touches neither file; so does the check before it. Puts the link back, and
/// it compensates.
#[tokio::test]
async fn a_folder_link_retargeted_since_the_step_refuses_its_compensation() {
    let fixture = Fixture::new();
    for folder in ["workspace/d1", "workspace/d2"] {
        std::fs::create_dir(fixture.path(folder)).expect("makes a folder");
    }
    fixture.write("workspace/d1/f", b"one");
    fixture.write("workspace/d2/f", b"two");
    let link = fixture.path("workspace/link");
    std::os::unix::fs::symlink("d1", &link).expect("links");
    let tool = fixture.tool("fs.delete");
    let ctx = ctx("fs.delete", 4);
    let args = json!({ "path": "workspace/link/f" });
    let (undo, output) = run(&tool, &ctx, &args).await;
    let output = output.expect("execute");
    assert!(
        fixture.read("workspace/d1/f").is_none(),
        "deleted through the link"
    );
    std::fs::remove_file(&link).expect("unlinks");
    std::os::unix::fs::symlink("d2", &link).expect("links again");
    let changed = tool.changed_since(&ctx, &args, &undo, Some(&output)).await;
    let error = tool
        .compensate(&ctx, &args, &undo, Some(&output))
        .await
        .expect_err("another file now");
    assert_eq!(
        error.kind(),
        agent_kernel_api::ToolErrorKind::Changed,
        "{error}"
    );
    assert!(error.to_string().contains("now leads to"), "{error}");
    assert!(
        changed
            .as_ref()
            .is_err_and(|error| error.to_string().contains("now leads to"))
            || changed.as_ref().is_ok_and(Option::is_some),
        "{changed:?}"
    );
    assert_eq!(fixture.read("workspace/d2/f").as_deref(), Some(&b"two"[..]));
    assert!(fixture.read("workspace/d1/f").is_none());
    std::fs::remove_file(&link).expect("unlinks");
    std::os::unix::fs::symlink("d1", &link).expect("links back");
    tool.compensate(&ctx, &args, &undo, Some(&output))
        .await
        .expect("compensates the file it deleted");
    assert_eq!(fixture.read("workspace/d1/f").as_deref(), Some(&b"one"[..]));
    assert_eq!(fixture.read("workspace/d2/f").as_deref(), Some(&b"two"[..]));
}
