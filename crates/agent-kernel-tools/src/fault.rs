//! `fault.fail` and `fault.panic`: deliberate failures for drills and demos.

use agent_kernel_api::{Tool, ToolContext, ToolError, ToolOutput, ToolSpec};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::common::{TOOL_VERSION, object_schema, parse_args};

/// The longest `message` the fault tools accept, in bytes.
pub const FAULT_MESSAGE_BYTES_MAX: usize = 4096;

/// The message of `fault.fail` when none is given.
pub const FAULT_FAIL_DEFAULT_MESSAGE: &str = "fault.fail: deliberate failure";

/// The message of `fault.panic` when none is given.
pub const FAULT_PANIC_DEFAULT_MESSAGE: &str = "fault.panic: deliberate panic";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FaultArgs {
    #[serde(default)]
    message: Option<String>,
}

fn fault_args(args: &Value) -> Result<FaultArgs, ToolError> {
    let parsed: FaultArgs = parse_args(args)?;
    if let Some(message) = &parsed.message
        && message.len() > FAULT_MESSAGE_BYTES_MAX
    {
        return Err(ToolError::invalid_args(format!(
            "`message` is {} bytes long, more than the maximum of {FAULT_MESSAGE_BYTES_MAX}",
            message.len()
        )));
    }
    Ok(parsed)
}

fn fault_schema(title: &str) -> Value {
    object_schema(
        title,
        json!({
            "message": {
                "type": "string",
                "maxLength": FAULT_MESSAGE_BYTES_MAX,
                "description": "what the failure says",
            },
        }),
        &[],
    )
}

/// `fault.fail`: read-only; always fails with `message` (a definite failure: nothing happened).
#[derive(Debug, Clone, Copy, Default)]
pub struct FaultFail;

impl FaultFail {
    /// The tool id.
    pub const ID: &'static str = "fault.fail";
}

impl Tool for FaultFail {
    fn spec(&self) -> ToolSpec {
        ToolSpec::read_only(Self::ID)
            .with_version(TOOL_VERSION)
            .with_schema(fault_schema("fault.fail arguments"))
    }

    fn check(&self, args: &Value) -> Result<(), ToolError> {
        fault_args(args).map(|_| ())
    }

    async fn simulate(&self, ctx: &ToolContext, args: &Value) -> Result<ToolOutput, ToolError> {
        // It always fails, in a dry run too.
        self.execute(ctx, args).await
    }

    async fn execute(&self, _ctx: &ToolContext, args: &Value) -> Result<ToolOutput, ToolError> {
        let FaultArgs { message } = fault_args(args)?;
        Err(ToolError::failed(
            message.unwrap_or_else(|| FAULT_FAIL_DEFAULT_MESSAGE.to_owned()),
        ))
    }
}

/// `fault.panic`: read-only; panics inside `execute` with `message`, so the kernel's
/// containment of a misbehaving tool can be exercised.
#[derive(Debug, Clone, Copy, Default)]
pub struct FaultPanic;

impl FaultPanic {
    /// The tool id.
    pub const ID: &'static str = "fault.panic";
}

impl Tool for FaultPanic {
    fn spec(&self) -> ToolSpec {
        ToolSpec::read_only(Self::ID)
            .with_version(TOOL_VERSION)
            .with_schema(fault_schema("fault.panic arguments"))
    }

    fn check(&self, args: &Value) -> Result<(), ToolError> {
        fault_args(args).map(|_| ())
    }

    /// # Panics
    ///
    /// Always, on purpose (after checking the arguments).
    async fn simulate(&self, _ctx: &ToolContext, args: &Value) -> Result<ToolOutput, ToolError> {
        let FaultArgs { message } = fault_args(args)?;
        Err(ToolError::panicked(format!(
            "would panic: {}",
            message.unwrap_or_else(|| FAULT_PANIC_DEFAULT_MESSAGE.to_owned())
        )))
    }

    async fn execute(&self, _ctx: &ToolContext, args: &Value) -> Result<ToolOutput, ToolError> {
        let FaultArgs { message } = fault_args(args)?;
        let message = message.unwrap_or_else(|| FAULT_PANIC_DEFAULT_MESSAGE.to_owned());
        panic!("{message}");
    }
}
