//! The dispatcher's overhead per call: a no-op tool called directly, and through
//! `Dispatcher::check` + `Dispatcher::execute` (schema check, permits, timeout, containment).
//!
//! Run with `cargo bench -p agent-kernel-dispatcher`.

use std::sync::Arc;
use std::time::Duration;

use agent_kernel_api::{
    Compensate, Durability, SagaId, Tool, ToolContext, ToolEntry, ToolError, ToolOutput, ToolSpec,
    Undo,
};
use agent_kernel_dispatcher::{Dispatcher, Limits, NoJitter};
use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::{Value, json};

struct Nop;

impl Tool for Nop {
    fn spec(&self) -> ToolSpec {
        ToolSpec::read_only("nop").with_version("1.0.0").with_schema(json!({
            "type": "object",
            "properties": {"path": {"type": "string", "minLength": 1}, "content": {"type": "string"}},
            "required": ["path", "content"],
            "additionalProperties": false
        }))
    }

    fn check(&self, _args: &Value) -> Result<(), ToolError> {
        Ok(())
    }

    async fn execute(&self, _: &ToolContext, _: &Value) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::new(Value::Null))
    }
}

impl Compensate for Nop {
    async fn prepare(&self, _: &ToolContext, _: &Value) -> Result<Undo, ToolError> {
        Ok(Undo::none())
    }

    async fn compensate(
        &self,
        _: &ToolContext,
        _: &Value,
        _: &Undo,
        _: Option<&ToolOutput>,
    ) -> Result<(), ToolError> {
        Ok(())
    }
}

fn dispatch(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut dispatcher = Dispatcher::new(Limits::default(), Arc::new(NoJitter)).expect("limits");
    dispatcher
        .register(ToolEntry::compensated(Nop))
        .expect("registers");
    let ctx = ToolContext {
        saga_id: SagaId::new("bench"),
        step_seq: 0,
        tool_id: "nop".into(),
        idempotency_key: None,
        actor: None,
        durability: Durability::Normal,
        files: Arc::new(agent_kernel_api::NoFiles::new(".")),
    };
    let args = json!({"path": "workspace/a.txt", "content": "hello"});
    let mut group = c.benchmark_group("call");
    group
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_millis(500));
    group.bench_function("direct", |b| {
        b.iter(|| runtime.block_on(Nop.execute(&ctx, &args)).expect("runs"));
    });
    group.bench_function("dispatcher_execute", |b| {
        b.iter(|| {
            runtime
                .block_on(dispatcher.execute(&ctx, &args))
                .expect("runs")
        });
    });
    group.bench_function("dispatcher_check_and_execute", |b| {
        b.iter(|| {
            dispatcher.check("nop", &args).expect("valid");
            runtime
                .block_on(dispatcher.execute(&ctx, &args))
                .expect("runs")
        });
    });
    group.finish();
}

criterion_group!(benches, dispatch);
criterion_main!(benches);
