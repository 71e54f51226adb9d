//! `check`: arguments and policy, before anything runs, with no side effect.

use agent_kernel_api::ToolError;
use serde_json::{Value, json};

use crate::Fixture;

fn check(fixture: &Fixture, tool: &str, args: Value) -> Result<(), ToolError> {
    fixture.tool(tool).check(&args)
}

fn invalid(fixture: &Fixture, tool: &str, args: Value) -> String {
    let error = check(fixture, tool, args).expect_err("must be invalid");
    assert!(error.is_invalid_args(), "{error}");
    error.message().to_owned()
}

fn denied(fixture: &Fixture, tool: &str, args: Value) -> String {
    let error = check(fixture, tool, args).expect_err("must be denied");
    assert!(error.is_denied(), "{error}");
    error.message().to_owned()
}

#[test]
fn unknown_fields_are_named() {
    let fixture = Fixture::new();
    assert_eq!(
        invalid(
            &fixture,
            "fs.write",
            json!({ "path": "workspace/a.txt", "contnt": "x" })
        ),
        "unknown field `contnt`, expected `path` or `content`"
    );
    assert!(
        invalid(
            &fixture,
            "fs.read",
            json!({ "path": "workspace/a.txt", "x": 1 })
        )
        .contains("unknown field `x`")
    );
    assert!(invalid(&fixture, "noop", json!({ "sleep": 1 })).contains("unknown field `sleep`"));
    assert!(invalid(&fixture, "fault.fail", json!({ "msg": "x" })).contains("unknown field `msg`"));
}

#[test]
fn wrong_types_and_missing_fields_are_invalid() {
    let fixture = Fixture::new();
    assert!(
        invalid(
            &fixture,
            "fs.write",
            json!({ "path": "workspace/a.txt", "content": 5 })
        )
        .contains("invalid type")
    );
    assert!(
        invalid(&fixture, "fs.append", json!({ "path": "workspace/a.txt" }))
            .contains("missing field `content`")
    );
    assert!(invalid(&fixture, "fs.delete", json!({ "path": ["a"] })).contains("invalid type"));
    assert!(invalid(&fixture, "fs.read", json!("workspace/a.txt")).contains("invalid type"));
    assert!(invalid(&fixture, "noop", json!({ "sleep_ms": -1 })).contains("invalid value"));
    assert!(invalid(&fixture, "noop", json!({ "sleep_ms": 60_001 })).contains("60000"));
    assert!(invalid(&fixture, "fs.read", json!({ "path": "" })).contains("empty"));
    check(&fixture, "noop", json!({})).expect("sleep_ms is optional");
    check(&fixture, "noop", json!({ "sleep_ms": 60_000 })).expect("at the bound");
    check(&fixture, "fault.fail", json!({})).expect("message is optional");
}

#[test]
fn paths_outside_the_root_are_denied() {
    let fixture = Fixture::new();
    let secret = fixture.path("outside/secret.txt").display().to_string();
    for tool in ["fs.read", "fs.delete"] {
        denied(
            &fixture,
            tool,
            json!({ "path": "workspace/../outside/secret.txt" }),
        );
        denied(&fixture, tool, json!({ "path": secret }));
    }
    for tool in ["fs.write", "fs.append"] {
        let message = denied(
            &fixture,
            tool,
            json!({ "path": "outside/x.txt", "content": "x" }),
        );
        assert!(message.contains("outside/x.txt"), "{message}");
        assert!(message.contains("outside every allowed root"), "{message}");
    }
}

#[test]
fn denied_names_are_denied_at_any_depth_and_case() {
    let fixture = Fixture::new();
    let message = denied(
        &fixture,
        "fs.write",
        json!({ "path": "workspace/sub/.ENV", "content": "x" }),
    );
    assert!(message.contains("denied name `.env`"), "{message}");
    denied(
        &fixture,
        "fs.read",
        json!({ "path": "workspace/keys/id.PEM" }),
    );
}

#[test]
fn content_over_max_io_bytes_is_denied() {
    let fixture = Fixture::new(); // max_io_bytes = 64
    let big = "x".repeat(65);
    for tool in ["fs.write", "fs.append"] {
        let message = denied(
            &fixture,
            tool,
            json!({ "path": "workspace/big.txt", "content": big }),
        );
        assert!(
            message.contains("65 bytes exceed the limit of 64 bytes"),
            "{message}"
        );
        check(
            &fixture,
            tool,
            json!({ "path": "workspace/ok.txt", "content": "x".repeat(64) }),
        )
        .expect("at the limit");
    }
}

#[test]
fn check_has_no_side_effect() {
    let fixture = Fixture::new();
    check(
        &fixture,
        "fs.write",
        json!({ "path": "workspace/new.txt", "content": "x" }),
    )
    .expect("ok");
    check(
        &fixture,
        "fs.append",
        json!({ "path": "workspace/log.txt", "content": "x" }),
    )
    .expect("ok");
    check(&fixture, "fs.delete", json!({ "path": "workspace/a.txt" })).expect("ok");
    assert_eq!(fixture.listing("workspace"), ["a.txt"]);
    assert_eq!(
        fixture.read("workspace/a.txt").as_deref(),
        Some(&b"alpha"[..])
    );
}

#[test]
fn without_a_policy_file_tools_are_denied_with_advice() {
    let fixture = Fixture::new();
    let tool = fixture.deny_all_tool("fs.read");
    let error = tool
        .check(&json!({ "path": "workspace/a.txt" }))
        .expect_err("denied");
    assert!(error.is_denied(), "{error}");
    assert!(error.message().contains("--sandbox FILE"), "{error}");
    fixture
        .deny_all_tool("noop")
        .check(&json!({}))
        .expect("noop needs no policy");
}
