//! The registry, schemas, `noop` and the fault tools.

use std::sync::Arc;

use agent_kernel_api::{EffectClass, Undo};
use agent_kernel_tools::{FAULT_FAIL_DEFAULT_MESSAGE, TOOL_VERSION};
use serde_json::json;

use crate::{Fixture, ctx};

#[test]
fn builtin_tools_lists_every_tool_once() {
    let fixture = Fixture::new();
    let expected = [
        ("noop", EffectClass::ReadOnly),
        ("fs.read", EffectClass::ReadOnly),
        ("fs.write", EffectClass::Mutating),
        ("fs.append", EffectClass::Mutating),
        ("fs.delete", EffectClass::Mutating),
        ("validate.file", EffectClass::ReadOnly),
        ("http.get", EffectClass::ReadOnly),
        ("fault.fail", EffectClass::ReadOnly),
        ("fault.panic", EffectClass::ReadOnly),
        ("fault.probed_write", EffectClass::Mutating),
        ("fault.opaque_write", EffectClass::Mutating),
    ];
    assert_eq!(
        agent_kernel_tools::builtin_tools(
            std::sync::Arc::new(agent_kernel_sandbox::FsSandbox::deny_all()),
            std::sync::Arc::new(agent_kernel_sandbox::HttpSandbox::deny_all()),
            std::path::PathBuf::from("/"),
        )
        .len(),
        expected.len(),
        "every built-in tool is listed here"
    );
    for (id, effect) in expected {
        let tool = fixture.tool(id);
        assert_eq!(tool.effect(), effect, "{id}");
        assert_eq!(tool.version(), TOOL_VERSION, "{id}");
    }
}

#[test]
fn schemas_are_closed_objects_naming_their_required_fields() {
    let fixture = Fixture::new();
    let required = [
        ("noop", json!([])),
        ("fs.read", json!(["path"])),
        ("fs.write", json!(["path", "content"])),
        ("fs.append", json!(["path", "content"])),
        ("fs.delete", json!(["path"])),
        ("validate.file", json!(["path"])),
        ("http.get", json!(["url"])),
        ("fault.fail", json!([])),
        ("fault.panic", json!([])),
    ];
    for (id, fields) in required {
        let schema = fixture.tool(id).args_schema().clone();
        assert_eq!(
            schema["$schema"], "https://json-schema.org/draft/2020-12/schema",
            "{id}"
        );
        assert_eq!(schema["type"], "object", "{id}");
        assert_eq!(schema["additionalProperties"], false, "{id}");
        assert_eq!(schema["required"], fields, "{id}");
        for field in fields.as_array().expect("array") {
            let name = field.as_str().expect("string");
            assert!(schema["properties"].get(name).is_some(), "{id}: {name}");
        }
    }
    assert_eq!(
        fixture.tool("noop").args_schema()["properties"]["sleep_ms"]["maximum"],
        60_000
    );
}

#[tokio::test]
async fn noop_sleeps_and_reports() {
    let fixture = Fixture::new();
    let tool = fixture.tool("noop");
    let ctx = ctx("noop", 0);
    let args = json!({ "sleep_ms": 5 });
    let undo = tool.prepare(&ctx, &args).await.expect("prepare");
    assert!(undo.is_none());
    let started = std::time::Instant::now();
    let output = tool.execute(&ctx, &args).await.expect("execute");
    assert!(started.elapsed() >= std::time::Duration::from_millis(5));
    assert_eq!(output.data, json!({ "slept_ms": 5 }));
    let output = tool.execute(&ctx, &json!({})).await.expect("execute");
    assert_eq!(output.data, json!({ "slept_ms": 0 }));
    tool.compensate(&ctx, &args, &Undo::none(), None)
        .await
        .expect("nothing to undo");
}

#[tokio::test]
async fn fault_fail_always_fails_definitely() {
    let fixture = Fixture::new();
    let tool = fixture.tool("fault.fail");
    let ctx = ctx("fault.fail", 0);
    let error = tool.execute(&ctx, &json!({})).await.expect_err("fails");
    assert_eq!(error.message(), FAULT_FAIL_DEFAULT_MESSAGE);
    assert!(!error.is_uncertain());
    let error = tool
        .execute(&ctx, &json!({ "message": "drill" }))
        .await
        .expect_err("fails");
    assert_eq!(error.message(), "drill");
}

#[tokio::test]
async fn fault_panic_panics_inside_execute() {
    let fixture = Fixture::new();
    let tool = fixture.tool("fault.panic");
    tool.check(&json!({ "message": "boom" }))
        .expect("check passes");
    let task_tool = Arc::clone(&tool);
    let joined = tokio::spawn(async move {
        let ctx = ctx("fault.panic", 0);
        task_tool.execute(&ctx, &json!({ "message": "boom" })).await
    })
    .await;
    let error = joined.expect_err("the task panicked");
    assert!(error.is_panic());
    let payload = error.into_panic();
    let message = payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .expect("a message");
    assert_eq!(message, "boom");
}
