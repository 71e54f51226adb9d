//! The simulated upstream MCP server `up`: the real [`UpstreamTool`]s and [`Hub`] of
//! `agent-kernel-upstream`, declared by a tools file as a user declares one, with a
//! [`Connector`] in place of a program over stdio. Its tool `set {key, value, fail?}` sets
//! a key of the world; its compensation `undo {key, value}` puts back what that write
//! replaced, only while the key still holds the write's value (as a service keeps what each
//! request replaced), so it never destroys a later write; `fail` makes `set` answer
//! `isError`.
//!
//! At its points the server can be killed with its process, before or after acting; lose
//! the connection after acting (the outcome unknown to the kernel, retried where that is
//! safe: compensations); or be slow: act only after the kernel's timeout gave up on the
//! call, or act at once and answer after it. The late effect is what a compensation sent
//! at once would overtake. A process that ends waits for its server's calls still running
//! (a program finishing its work); one that is killed takes them with it, as `recover`
//! stops a dead process's servers before it settles anything.
//!
//! The hub runs its calls on the case's runtime, whose clock is paused: the timeout and the
//! late answer fire in one order whatever the machine.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use agent_kernel_api::{BoxFuture, ToolSource};
use agent_kernel_dispatcher::DEFAULT_TIMEOUT_MS;
use agent_kernel_upstream::{
    CallError, Connection, Connector, Hub, ServerSpec, StepRef, parse_servers, upstream_sources_on,
};
use rmcp::model::{CallToolRequestParams, CallToolResult, ContentBlock, JsonObject, Tool};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::process::{Act, Process};
use crate::tools::key_and_value;
use crate::world::{Event, World, shown};

/// The id of the upstream tool, as the kernel offers it (`SERVER.TOOL`).
pub const UPSTREAM_TOOL: &str = "up.set";

/// The tools file that declares the server, as a user would: `set` claims its key, as
/// `sim.set` does, and is compensated blindly (the mapping reads only `$.args`) by `undo`.
const TOOLS_TOML: &str = r#"
[mcp_servers.up]
command = ["simulated-upstream-server"]

[mcp_servers.up.tool.set]
effect = "mutating"
resources = ["key:$.args.key"]
compensate = { tool = "undo", args = { key = "$.args.key", value = "$.args.value" } }
"#;

/// How long a slow call takes: past the kernel's timeout of a call (the simulated kernels
/// keep the default), so the kernel has given up on it when it acts or answers.
const SLOW_CALL: Duration = Duration::from_millis(DEFAULT_TIMEOUT_MS + 1_000);

/// The bound on an answer's size (the policy's default `max_io_bytes`).
const OUTPUT_BYTES_MAX: u64 = 1 << 20;

/// The server's declaration, parsed once.
fn specs() -> &'static [ServerSpec] {
    static SPECS: OnceLock<Vec<ServerSpec>> = OnceLock::new();
    SPECS.get_or_init(|| {
        parse_servers(std::path::Path::new("tools.toml"), TOOLS_TOML)
            .expect("the simulated server's declaration parses")
    })
}

/// The upstream server of one simulated process: the tool source its kernel registers, and
/// its calls still running.
pub(crate) struct Upstream {
    running: watch::Receiver<usize>,
    source: Arc<dyn ToolSource>,
}

impl Upstream {
    /// The server of `process`, acting on `world`.
    pub(crate) fn new(world: Arc<World>, process: Arc<Process>) -> Upstream {
        let (running, watching) = watch::channel(0);
        let connector = Arc::new(ServerOf {
            world,
            process,
            running: Arc::new(running),
        });
        let hub = Arc::new(Hub::with_connector(specs().to_vec(), connector));
        let mut sources = upstream_sources_on(
            std::path::Path::new("tools.toml"),
            specs().to_vec(),
            &hub,
            OUTPUT_BYTES_MAX,
        );
        let source = sources.pop().expect("one server declared");
        Upstream {
            running: watching,
            source: Arc::new(source),
        }
    }

    /// The source of the server's tools, for the process's dispatcher.
    pub(crate) fn source(&self) -> Arc<dyn ToolSource> {
        Arc::clone(&self.source)
    }

    /// Resolves once no call of the server is running: a process that ends lets its
    /// server finish what it was asked.
    pub(crate) async fn idle(&self) {
        let mut running = self.running.clone();
        let _ = running.wait_for(|running| *running == 0).await;
    }
}

/// The connector, and the connection, of one process's server.
#[derive(Clone)]
struct ServerOf {
    world: Arc<World>,
    process: Arc<Process>,
    running: Arc<watch::Sender<usize>>,
}

impl Connector for ServerOf {
    fn connect(&self, _spec: &ServerSpec) -> Result<Box<dyn Connection>, String> {
        Ok(Box::new(self.clone()))
    }
}

/// One call running, counted until it ends (answered, or dropped with its process).
struct Running(Arc<watch::Sender<usize>>);

impl Running {
    fn start(running: &Arc<watch::Sender<usize>>) -> Running {
        running.send_modify(|running| *running += 1);
        Running(Arc::clone(running))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.send_modify(|running| *running -= 1);
    }
}

fn text(value: &Value) -> Vec<ContentBlock> {
    vec![ContentBlock::text(value.to_string())]
}

impl Connection for ServerOf {
    fn list_tools(&self) -> BoxFuture<'_, Result<Vec<Tool>, CallError>> {
        Box::pin(async {
            let schema: JsonObject =
                serde_json::from_value(json!({ "type": "object" })).expect("an object schema");
            let schema = Arc::new(schema);
            Ok(vec![
                Tool::new("set", "Sets a key", Arc::clone(&schema)),
                Tool::new("undo", "Puts back what a set replaced", schema),
            ])
        })
    }

    fn call_tool(
        &self,
        step: StepRef<'_>,
        params: CallToolRequestParams,
    ) -> BoxFuture<'_, Result<CallToolResult, CallError>> {
        let saga = step.saga_id.to_owned();
        let step_seq = step.step_seq;
        Box::pin(async move {
            let _running = Running::start(&self.running);
            let args = Value::Object(params.arguments.unwrap_or_default());
            match params.name.as_ref() {
                "set" => self.set(saga, step_seq, &args).await,
                "undo" => self.undo(saga, step_seq, &args).await,
                other => Err(CallError::Refused(format!("no tool `{other}`"))),
            }
        })
    }

    fn is_closed(&self) -> bool {
        false
    }
}

impl ServerOf {
    /// Stops forever: the process died, and its server with it.
    async fn die(&self) -> Result<CallToolResult, CallError> {
        self.process.die();
        std::future::pending().await
    }

    /// A slow call: resumes after the kernel's timeout, unless its process died meanwhile.
    async fn slow(&self) {
        tokio::time::sleep(SLOW_CALL).await;
        self.process.gate().await;
    }

    /// A call's key and value, and its step as the history names it, once the schedule
    /// lets the server go on.
    async fn arrive(
        &self,
        saga: &str,
        step: u32,
        args: &Value,
    ) -> Result<(String, i64, String), CallError> {
        let (key, value) =
            key_and_value(args).map_err(|err| CallError::Refused(err.to_string()))?;
        self.process.gate().await;
        Ok((key, value, format!("{saga}/{step}")))
    }

    async fn set(
        &self,
        saga: String,
        step: u32,
        args: &Value,
    ) -> Result<CallToolResult, CallError> {
        let (key, value, label) = self.arrive(&saga, step, args).await?;
        if args.get("fail").and_then(Value::as_bool) == Some(true) {
            self.process.note(format!(
                "upstream {label} answers an error, {key} untouched"
            ));
            self.world.acted(&key, self.process.name());
            return Ok(CallToolResult::error(text(&json!("fails on purpose"))));
        }
        let act = self
            .process
            .point(&format!("upstream effect {label}: {key} = {value}"), false);
        self.world.acted(&key, self.process.name());
        match act {
            Act::CrashBefore => return self.die().await,
            Act::HangBefore => {
                self.process.note(format!(
                    "upstream {label} is slow: it acts after the kernel's timeout"
                ));
                self.slow().await;
            }
            _ => {}
        }
        self.world.remember_replaced(&key, value);
        self.world.set(
            &key,
            Some(value),
            Event::Effect {
                saga,
                step,
                key: key.clone(),
                value,
            },
        );
        match act {
            Act::CrashAfter => self.die().await,
            Act::Fail => Err(CallError::Lost(
                "the simulated connection was lost after the effect".to_owned(),
            )),
            Act::HangAfter => {
                self.process.note(format!(
                    "upstream {label} answers after the kernel's timeout"
                ));
                self.slow().await;
                Ok(CallToolResult::success(text(&json!({ "key": key }))))
            }
            Act::Go | Act::HangBefore | Act::CrashBefore => {
                Ok(CallToolResult::success(text(&json!({ "key": key }))))
            }
        }
    }

    async fn undo(
        &self,
        saga: String,
        step: u32,
        args: &Value,
    ) -> Result<CallToolResult, CallError> {
        let (key, value, label) = self.arrive(&saga, step, args).await?;
        let act = self.process.point(
            &format!("upstream compensation {label}: {key} back from {value}"),
            false,
        );
        self.world.acted(&key, self.process.name());
        let failed = || {
            self.world.note(Event::CompensationFailed {
                saga: saga.clone(),
                step,
            });
        };
        match act {
            Act::CrashBefore => return self.die().await,
            Act::HangBefore => {
                // Past the compensation's timeout: a cause for the saga's dead letter.
                failed();
                self.slow().await;
            }
            _ => {}
        }
        let found = self.world.get(&key);
        if found == Some(value) {
            let to = self.world.replaced(&key, value);
            self.world.set(
                &key,
                to,
                Event::Restored {
                    saga: saga.clone(),
                    step,
                    key: key.clone(),
                    to,
                },
            );
        } else {
            self.process.note(format!(
                "upstream {label}: {key} holds {}, not {value}: nothing to undo",
                shown(found)
            ));
            self.world.note(Event::Untouched {
                saga: saga.clone(),
                step,
                key: key.clone(),
            });
        }
        match act {
            Act::CrashAfter => self.die().await,
            Act::Fail => Err(CallError::Lost(
                "the simulated connection was lost after the compensation".to_owned(),
            )),
            Act::HangAfter => {
                failed();
                self.slow().await;
                Ok(CallToolResult::success(text(&json!({}))))
            }
            Act::Go | Act::HangBefore | Act::CrashBefore => {
                Ok(CallToolResult::success(text(&json!({}))))
            }
        }
    }
}
