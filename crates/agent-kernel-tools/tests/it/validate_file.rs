//! `validate.file`: a check that does not hold is a validation failure, never a plain one.

use agent_kernel_api::{EffectClass, ToolError, ToolOutput, Undo};
use serde_json::{Value, json};

use crate::{Fixture, ctx, run};

const ID: &str = "validate.file";

/// Runs the tool as the saga engine would (`check`, `prepare`, `execute`) on `args`.
async fn validate(fixture: &Fixture, args: Value) -> Result<ToolOutput, ToolError> {
    let (undo, output) = run(&fixture.tool(ID), &ctx(ID, 0), &args).await;
    assert!(undo.is_none(), "a validation has nothing to undo");
    output
}

/// Like [`validate`], expecting a validation failure; returns its message.
async fn fails(fixture: &Fixture, args: Value) -> String {
    let error = validate(fixture, args).await.expect_err("must fail");
    assert!(error.is_validation(), "{error}");
    assert!(!error.is_uncertain(), "{error}");
    error.message().to_owned()
}

#[tokio::test]
async fn passes_when_the_file_exists() {
    let fixture = Fixture::new();
    let output = validate(&fixture, json!({ "path": "workspace/a.txt" }))
        .await
        .expect("exists");
    assert_eq!(
        output.data,
        json!({ "path": "workspace/a.txt", "bytes": 5, "checks": ["exists"] })
    );
    assert_eq!(output.effects, ["validated workspace/a.txt (1 check)"]);
    assert_eq!(output.next_hint, None);
}

#[tokio::test]
async fn passes_with_contains() {
    let fixture = Fixture::new();
    let output = validate(
        &fixture,
        json!({ "path": "workspace/a.txt", "contains": "lph" }),
    )
    .await
    .expect("contains");
    assert_eq!(
        output.data,
        json!({ "path": "workspace/a.txt", "bytes": 5, "checks": ["exists", "contains"] })
    );
    assert_eq!(output.effects, ["validated workspace/a.txt (2 checks)"]);
}

#[tokio::test]
async fn passes_with_equals() {
    let fixture = Fixture::new();
    let output = validate(
        &fixture,
        json!({ "path": "workspace/a.txt", "equals": "alpha" }),
    )
    .await
    .expect("equals");
    assert_eq!(
        output.data,
        json!({ "path": "workspace/a.txt", "bytes": 5, "checks": ["exists", "equals"] })
    );
}

#[tokio::test]
async fn passes_with_equals_and_contains() {
    let fixture = Fixture::new();
    let output = validate(
        &fixture,
        json!({ "path": "workspace/a.txt", "contains": "alp", "equals": "alpha" }),
    )
    .await
    .expect("equals");
    assert_eq!(
        output.data,
        json!({
            "path": "workspace/a.txt",
            "bytes": 5,
            "checks": ["exists", "contains", "equals"],
        })
    );
    assert_eq!(output.effects, ["validated workspace/a.txt (3 checks)"]);
}

#[tokio::test]
async fn an_empty_file_equals_the_empty_string() {
    let fixture = Fixture::new();
    fixture.write("workspace/empty.txt", b"");
    let output = validate(
        &fixture,
        json!({ "path": "workspace/empty.txt", "contains": "", "equals": "" }),
    )
    .await
    .expect("empty");
    assert_eq!(output.data["bytes"], 0);
}

#[tokio::test]
async fn compares_bytes_so_non_utf8_files_work() {
    let fixture = Fixture::new();
    fixture.write("workspace/bin", &[b'o', b'k', 0xff, 0xfe]);
    validate(
        &fixture,
        json!({ "path": "workspace/bin", "contains": "ok" }),
    )
    .await
    .expect("the UTF-8 bytes of `ok` are there");
    let message = fails(&fixture, json!({ "path": "workspace/bin", "equals": "ok" })).await;
    assert_eq!(
        message,
        "`workspace/bin` is not equal to the expected content (4 bytes, expected 2)"
    );
}

#[tokio::test]
async fn fails_contains_naming_the_path_and_the_text() {
    let fixture = Fixture::new();
    let message = fails(
        &fixture,
        json!({ "path": "workspace/a.txt", "contains": "hello" }),
    )
    .await;
    assert_eq!(message, "`workspace/a.txt` does not contain \"hello\"");
}

#[tokio::test]
async fn fails_equals_naming_the_path_and_the_lengths() {
    let fixture = Fixture::new();
    let message = fails(
        &fixture,
        json!({ "path": "workspace/a.txt", "equals": "alphabet" }),
    )
    .await;
    assert_eq!(
        message,
        "`workspace/a.txt` is not equal to the expected content (5 bytes, expected 8)"
    );
    let message = fails(
        &fixture,
        json!({ "path": "workspace/a.txt", "equals": "alpho" }),
    )
    .await;
    assert_eq!(
        message,
        "`workspace/a.txt` is not equal to the expected content \
         (5 bytes as expected, but they differ from byte offset 4)"
    );
}

#[tokio::test]
async fn a_failing_contains_is_reported_before_equals() {
    let fixture = Fixture::new();
    let message = fails(
        &fixture,
        json!({ "path": "workspace/a.txt", "contains": "beta", "equals": "beta" }),
    )
    .await;
    assert!(message.contains("does not contain \"beta\""), "{message}");
}

#[tokio::test]
async fn a_missing_file_is_a_validation_failure() {
    let fixture = Fixture::new();
    let message = fails(&fixture, json!({ "path": "workspace/none.txt" })).await;
    assert_eq!(message, "`workspace/none.txt` does not exist");
    let message = fails(&fixture, json!({ "path": "workspace/no/such.txt" })).await;
    assert_eq!(message, "`workspace/no/such.txt` does not exist");
}

#[tokio::test]
async fn a_folder_is_a_definite_plain_failure() {
    let fixture = Fixture::new();
    std::fs::create_dir(fixture.path("workspace/sub")).expect("sub");
    let error = validate(&fixture, json!({ "path": "workspace/sub" }))
        .await
        .expect_err("not a file");
    assert!(!error.is_validation() && !error.is_uncertain(), "{error}");
    assert!(error.message().contains("not a regular file"), "{error}");
}

#[tokio::test]
async fn a_file_over_max_io_bytes_is_denied() {
    let fixture = Fixture::new(); // max_io_bytes = 64
    fixture.write("workspace/big.txt", &[b'x'; 65]);
    let error = validate(&fixture, json!({ "path": "workspace/big.txt" }))
        .await
        .expect_err("too large");
    assert!(error.is_denied(), "{error}");
}

#[tokio::test]
async fn a_link_out_of_the_root_is_denied_when_read() {
    let fixture = Fixture::new();
    std::os::unix::fs::symlink("../outside/secret.txt", fixture.path("workspace/rel"))
        .expect("symlink");
    let error = validate(
        &fixture,
        json!({ "path": "workspace/rel", "contains": "secret" }),
    )
    .await
    .expect_err("escape");
    assert!(error.is_denied(), "{error}");
    assert!(!error.message().contains("does not"), "{error}");
}

#[test]
fn paths_outside_the_root_are_denied_at_check() {
    let fixture = Fixture::new();
    let tool = fixture.tool(ID);
    let secret = fixture.path("outside/secret.txt").display().to_string();
    for path in [
        "workspace/../outside/secret.txt",
        "outside/secret.txt",
        &secret,
    ] {
        let error = tool
            .check(&json!({ "path": path, "contains": "secret" }))
            .expect_err("denied");
        assert!(error.is_denied(), "{path}: {error}");
    }
    let error = tool
        .check(&json!({ "path": "workspace/.env" }))
        .expect_err("denied name");
    assert!(error.is_denied(), "{error}");
}

#[test]
fn unknown_fields_are_named_at_check() {
    let fixture = Fixture::new();
    let error = fixture
        .tool(ID)
        .check(&json!({ "path": "workspace/a.txt", "contans": "x" }))
        .expect_err("unknown field");
    assert!(error.is_invalid_args(), "{error}");
    assert_eq!(
        error.message(),
        "unknown field `contans`, expected one of `path`, `contains`, `equals`"
    );
}

#[test]
fn wrong_types_and_missing_fields_are_invalid_at_check() {
    let fixture = Fixture::new();
    let tool = fixture.tool(ID);
    for args in [
        json!({ "path": "workspace/a.txt", "contains": 5 }),
        json!({ "path": "workspace/a.txt", "equals": ["alpha"] }),
        json!({ "path": 1 }),
        json!("workspace/a.txt"),
    ] {
        let error = tool.check(&args).expect_err("wrong type");
        assert!(error.is_invalid_args(), "{args}: {error}");
        assert!(error.message().contains("invalid type"), "{args}: {error}");
    }
    let error = tool.check(&json!({ "equals": "x" })).expect_err("no path");
    assert!(error.is_invalid_args(), "{error}");
    assert!(error.message().contains("missing field `path`"), "{error}");
    tool.check(&json!({ "path": "workspace/none.txt" }))
        .expect("check does not look at the disk");
}

#[tokio::test]
async fn is_registered_read_only_and_compensates_as_a_no_op() {
    let fixture = Fixture::new();
    let tool = fixture.tool(ID);
    assert_eq!(tool.effect(), EffectClass::ReadOnly);
    let schema = tool.args_schema();
    assert_eq!(schema["additionalProperties"], false);
    assert_eq!(schema["required"], json!(["path"]));
    for field in ["path", "contains", "equals"] {
        assert!(schema["properties"].get(field).is_some(), "{field}");
    }
    let args = json!({ "path": "workspace/a.txt", "equals": "alpha" });
    let ctx = ctx(ID, 0);
    tool.compensate(&ctx, &args, &Undo::none(), None)
        .await
        .expect("nothing to undo");
    assert_eq!(fixture.listing("workspace"), ["a.txt"]);
    assert_eq!(
        fixture.read("workspace/a.txt").as_deref(),
        Some(&b"alpha"[..])
    );
}
