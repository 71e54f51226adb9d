//! One upstream tool as a kernel tool: `SERVER.TOOL`, its upstream input schema, the
//! classes its declaration (or trusted annotations) give it, and its compensation through
//! another tool of the same server.

use std::sync::Arc;

use agent_kernel_api::{
    Compensate, EffectClass, Reversibility, Settlement, Tool, ToolContext, ToolError, ToolOutput,
    ToolSpec, Undo, UndoWindow,
};
use rmcp::model::{CallToolResult, JsonObject, Tool as McpTool};
use serde_json::Value;

use crate::config::{ServerSpec, ToolDecl};
use crate::hub::{CallError, Hub, StepRef};

/// A tool of an upstream MCP server.
#[derive(Debug)]
pub struct UpstreamTool {
    id: String,
    server: String,
    name: String,
    description: String,
    schema: Value,
    effect: EffectClass,
    reversibility: Reversibility,
    idempotent: bool,
    settlement: Settlement,
    undo_window: Option<UndoWindow>,
    decl: Option<ToolDecl>,
    output_bytes_max: u64,
    hub: Arc<Hub>,
}

impl UpstreamTool {
    /// The kernel tool for `tool` of `spec`'s server, classed by its declaration, else by
    /// its annotations when they are trusted and say read-only, else as mutating and
    /// irreversible (every call waits for an approval).
    /// Its outputs are bounded by `output_bytes_max` (the policy's `max_io_bytes`).
    pub fn new(
        spec: &ServerSpec,
        tool: &McpTool,
        hub: Arc<Hub>,
        output_bytes_max: u64,
    ) -> UpstreamTool {
        let name = tool.name.to_string();
        let decl = spec.declared.get(&name).cloned();
        let annotations = tool.annotations.as_ref();
        let trusted = |hint: Option<bool>| spec.trust_annotations && hint == Some(true);
        let (effect, reversibility, idempotent, settlement) = match &decl {
            Some(decl) => {
                let blind = decl
                    .compensate
                    .as_ref()
                    .is_some_and(|compensation| !compensation.args.reads_output());
                let settlement =
                    decl.settlement
                        .unwrap_or(if blind || decl.effect == EffectClass::ReadOnly {
                            Settlement::Compensate
                        } else {
                            Settlement::Operator
                        });
                (decl.effect, decl.reversibility, decl.idempotent, settlement)
            }
            None if trusted(annotations.and_then(|a| a.read_only_hint)) => (
                EffectClass::ReadOnly,
                Reversibility::Full,
                trusted(annotations.and_then(|a| a.idempotent_hint)),
                Settlement::Compensate,
            ),
            None => (
                EffectClass::Mutating,
                Reversibility::None,
                false,
                Settlement::Operator,
            ),
        };
        UpstreamTool {
            id: format!("{}.{name}", spec.name),
            server: spec.name.clone(),
            description: tool.description.as_deref().unwrap_or_default().to_owned(),
            schema: Value::Object((*tool.input_schema).clone()),
            effect,
            reversibility,
            idempotent,
            settlement,
            undo_window: decl.as_ref().and_then(|decl| decl.undo_window),
            name,
            decl,
            output_bytes_max,
            hub,
        }
    }

    /// The timeout its declaration, else its server's declaration, sets.
    pub fn timeout_ms(&self, spec: &ServerSpec) -> Option<u64> {
        self.decl
            .as_ref()
            .and_then(|decl| decl.timeout_ms)
            .or(spec.timeout_ms)
    }
}

/// The output of an upstream result: its structuredContent, else its first text content
/// parsed as JSON, else that text.
fn output_of(result: &CallToolResult) -> Value {
    if let Some(structured) = &result.structured_content {
        return structured.clone();
    }
    let text = result
        .content
        .iter()
        .find_map(|content| content.as_text().map(|text| text.text.clone()));
    match text {
        Some(text) => serde_json::from_str(&text).unwrap_or(Value::String(text)),
        None => Value::Null,
    }
}

/// The text of an `isError` result, for the step's error.
fn error_text(result: &CallToolResult) -> String {
    let text: Vec<String> = result
        .content
        .iter()
        .filter_map(|content| content.as_text().map(|text| text.text.clone()))
        .collect();
    if text.is_empty() {
        "the upstream tool answered an error".to_owned()
    } else {
        text.join("\n")
    }
}

fn object(args: &Value) -> Result<JsonObject, ToolError> {
    match args {
        Value::Object(map) => Ok(map.clone()),
        _ => Err(ToolError::invalid_args("the arguments are an object")),
    }
}

impl UpstreamTool {
    /// Calls `tool` of the server for the step of `ctx` (its calls reach the server one at
    /// a time, [`Hub::call`]).
    async fn call(
        &self,
        ctx: &ToolContext,
        tool: &str,
        args: &Value,
    ) -> Result<ToolOutput, ToolError> {
        let step = StepRef {
            saga_id: ctx.saga_id.as_str(),
            step_seq: ctx.step_seq,
        };
        match self.hub.call(step, &self.server, tool, object(args)?).await {
            Ok(result) if result.is_error == Some(true) => Err(ToolError::failed(format!(
                "`{}.{tool}` answered an error: {}",
                self.server,
                error_text(&result)
            ))),
            Ok(result) => {
                let output = output_of(&result);
                let size = serde_json::to_string(&output).map_or(0, |text| text.len() as u64);
                if size > self.output_bytes_max {
                    let message = format!(
                        "`{}.{tool}` answered {size} bytes, more than max_io_bytes ({})",
                        self.server, self.output_bytes_max
                    );
                    // The call ran: a mutating one may have acted.
                    return Err(if self.effect == EffectClass::ReadOnly {
                        ToolError::failed(message).not_applied()
                    } else {
                        ToolError::uncertain(message)
                    });
                }
                Ok(ToolOutput::new(output))
            }
            // A server that could not be started, or died during the call, is started
            // again by the next call: both are worth a retry where a retry is safe (an
            // idempotent tool's call, and every compensation, idempotent by contract).
            Err(CallError::NotSent(message)) => {
                Err(ToolError::failed(message).not_applied().retriable())
            }
            Err(CallError::Refused(message) | CallError::Unavailable(message)) => {
                Err(ToolError::failed(message).not_applied())
            }
            Err(CallError::Lost(message)) => Err(ToolError::uncertain(format!(
                "the connection to MCP server `{}` was lost during the call ({message}); its outcome is unknown",
                self.server
            ))
            .retriable()),
        }
    }
}

impl Tool for UpstreamTool {
    fn spec(&self) -> ToolSpec {
        ToolSpec::new(&self.id, self.effect)
            .with_version(agent_kernel_api::UPSTREAM_TOOL_VERSION)
            .with_idempotent(self.idempotent)
            .with_settlement(self.settlement)
            .with_description(&self.description)
            .with_reversibility(self.reversibility)
            .with_undo_window(self.undo_window)
            .with_schema(self.schema.clone())
            .with_resources(
                self.decl
                    .as_ref()
                    .map(|decl| decl.resources.clone())
                    .unwrap_or_default(),
            )
            .with_duplicate_keys(
                self.decl
                    .as_ref()
                    .map(|decl| decl.duplicate_keys.clone())
                    .unwrap_or_default(),
            )
    }

    async fn execute(&self, ctx: &ToolContext, args: &Value) -> Result<ToolOutput, ToolError> {
        self.call(ctx, &self.name, args).await
    }
}

impl Compensate for UpstreamTool {
    async fn compensate(
        &self,
        ctx: &ToolContext,
        args: &Value,
        _undo: &Undo,
        output: Option<&ToolOutput>,
    ) -> Result<(), ToolError> {
        if self.effect == EffectClass::ReadOnly {
            return Ok(());
        }
        let Some(compensation) = self.decl.as_ref().and_then(|decl| decl.compensate.as_ref())
        else {
            return Err(ToolError::failed(format!(
                "`{}` declares no compensation; an operator must undo it",
                self.id
            )));
        };
        let arguments = compensation
            .args
            .arguments(args, output.map(|output| &output.data))
            .map_err(|error| {
                ToolError::failed(format!(
                    "the compensation of `{}` cannot be built: {}",
                    self.id,
                    error.message()
                ))
            })?;
        // Sent once the step's own call was answered (after a timeout it may still run).
        self.call(ctx, &compensation.tool, &arguments)
            .await
            .map(|_| ())
    }
}
