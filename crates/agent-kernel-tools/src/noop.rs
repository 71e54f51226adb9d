//! `noop`: does nothing, optionally after a pause.

use std::time::Duration;

use agent_kernel_api::{Tool, ToolContext, ToolError, ToolOutput, ToolSpec};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::common::{TOOL_VERSION, object_schema, parse_args};

/// The longest pause `noop` accepts, in milliseconds.
pub const NOOP_SLEEP_MS_MAX: u64 = 60_000;

/// `noop`: read-only; sleeps `sleep_ms` (default 0, at most [`NOOP_SLEEP_MS_MAX`]) and returns
/// `{"slept_ms": n}`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Noop;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoopArgs {
    #[serde(default)]
    sleep_ms: u64,
}

impl Noop {
    /// The tool id.
    pub const ID: &'static str = "noop";

    fn args(args: &Value) -> Result<NoopArgs, ToolError> {
        let parsed: NoopArgs = parse_args(args)?;
        if parsed.sleep_ms > NOOP_SLEEP_MS_MAX {
            return Err(ToolError::invalid_args(format!(
                "`sleep_ms` is {}, more than the maximum of {NOOP_SLEEP_MS_MAX}",
                parsed.sleep_ms
            )));
        }
        Ok(parsed)
    }
}

impl Tool for Noop {
    fn spec(&self) -> ToolSpec {
        ToolSpec::read_only(Self::ID)
            .with_version(TOOL_VERSION)
            .with_description("Do nothing, after sleeping up to sleep_ms; reads only.")
            .with_schema(object_schema(
                "noop arguments",
                json!({
                    "sleep_ms": {
                        "type": "integer",
                        "minimum": 0,
                        "maximum": NOOP_SLEEP_MS_MAX,
                        "default": 0,
                        "description": "how long to sleep before returning, in milliseconds",
                    },
                }),
                &[],
            ))
    }

    fn check(&self, args: &Value) -> Result<(), ToolError> {
        Self::args(args).map(|_| ())
    }

    async fn execute(&self, _ctx: &ToolContext, args: &Value) -> Result<ToolOutput, ToolError> {
        let NoopArgs { sleep_ms } = Self::args(args)?;
        if sleep_ms > 0 {
            tokio::time::sleep(Duration::from_millis(sleep_ms)).await;
        }
        Ok(ToolOutput::new(json!({ "slept_ms": sleep_ms })))
    }
}
