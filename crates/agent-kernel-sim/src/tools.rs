//! The simulated tool: `sim.set {key, value, fail?}` sets a key of the world, as a file
//! write sets a file's bytes, and its compensation puts back what was there before, as a
//! file tool does: without looking, so a compensation run over someone else's later write
//! destroys it (the world notes that as a clobber, which the checks refuse).

use std::sync::Arc;

use agent_kernel_api::{
    Compensate, KeyTemplate, Tool, ToolContext, ToolError, ToolOutput, ToolSpec, Undo,
};
use serde_json::{Value, json};

use crate::process::{Act, Process};
use crate::world::{Event, World, shown};

/// The tool's id.
pub const SET_TOOL: &str = "sim.set";

/// `sim.set` in one simulated process.
pub(crate) struct SetTool {
    pub(crate) world: Arc<World>,
    pub(crate) process: Arc<Process>,
}

/// A call's key and value.
fn key_and_value(args: &Value) -> Result<(String, i64), ToolError> {
    let key = args
        .get("key")
        .and_then(Value::as_str)
        .ok_or_else(|| ToolError::invalid_args("missing string `key`"))?;
    let value = args
        .get("value")
        .and_then(Value::as_i64)
        .ok_or_else(|| ToolError::invalid_args("missing integer `value`"))?;
    Ok((key.to_owned(), value))
}

/// What `prepare` found: the key's value before the step, if any.
fn old_of(undo: &Undo) -> Option<i64> {
    undo.data.get("old").and_then(Value::as_i64)
}

impl Tool for SetTool {
    fn spec(&self) -> ToolSpec {
        let template: KeyTemplate = "key:$.args.key".parse().expect("a valid template");
        ToolSpec::mutating(SET_TOOL)
            .with_version("1.0.0")
            .with_resources([template])
    }

    fn check(&self, args: &Value) -> Result<(), ToolError> {
        key_and_value(args).map(|_| ())
    }

    async fn execute(&self, ctx: &ToolContext, args: &Value) -> Result<ToolOutput, ToolError> {
        let (key, value) = key_and_value(args)?;
        self.process.gate().await;
        let step = format!("{}/{}", ctx.saga_id, ctx.step_seq);
        if args.get("fail").and_then(Value::as_bool) == Some(true) {
            self.process
                .note(format!("{step} fails on purpose, {key} untouched"));
            self.world.acted(&key);
            return Err(ToolError::failed("fails on purpose").not_applied());
        }
        let act = self
            .process
            .point(&format!("effect {step}: {key} = {value}"), false);
        self.world.acted(&key);
        match act {
            Act::CrashBefore => {
                self.process.die();
                return std::future::pending().await;
            }
            // The dispatcher's timeout gives up on it.
            Act::HangBefore => return std::future::pending().await,
            _ => {}
        }
        self.world.set(
            &key,
            Some(value),
            Event::Effect {
                saga: ctx.saga_id.to_string(),
                step: ctx.step_seq,
                key: key.clone(),
                value,
            },
        );
        match act {
            Act::CrashAfter => {
                self.process.die();
                std::future::pending().await
            }
            Act::Fail => Err(ToolError::uncertain("the answer was lost")),
            Act::HangAfter => std::future::pending().await,
            Act::Go | Act::CrashBefore | Act::HangBefore => {
                Ok(ToolOutput::new(json!({ "key": key })))
            }
        }
    }
}

impl Compensate for SetTool {
    async fn prepare(&self, ctx: &ToolContext, args: &Value) -> Result<Undo, ToolError> {
        let (key, _) = key_and_value(args)?;
        self.world.note(Event::Prepared {
            saga: ctx.saga_id.to_string(),
            step: ctx.step_seq,
            key: key.clone(),
        });
        Ok(Undo {
            data: json!({ "old": self.world.get(&key) }),
            blob: None,
        })
    }

    async fn compensate(
        &self,
        ctx: &ToolContext,
        args: &Value,
        undo: &Undo,
        _output: Option<&ToolOutput>,
    ) -> Result<(), ToolError> {
        let (key, value) = key_and_value(args)?;
        let old = old_of(undo);
        self.process.gate().await;
        let step = format!("{}/{}", ctx.saga_id, ctx.step_seq);
        let act = self.process.point(
            &format!("compensation {step}: {key} = {}", shown(old)),
            false,
        );
        self.world.acted(&key);
        match act {
            Act::CrashBefore => {
                self.process.die();
                return std::future::pending().await;
            }
            Act::Fail => {
                self.world.note(Event::CompensationFailed {
                    saga: ctx.saga_id.to_string(),
                    step: ctx.step_seq,
                });
                return Err(ToolError::failed("simulated failure: nothing restored"));
            }
            Act::HangBefore => {
                // Its timeout fails it: a cause for the saga's dead letter.
                self.world.note(Event::CompensationFailed {
                    saga: ctx.saga_id.to_string(),
                    step: ctx.step_seq,
                });
                return std::future::pending().await;
            }
            Act::Go | Act::CrashAfter | Act::HangAfter => {}
        }
        let found = self.world.get(&key);
        if found != old && found != Some(value) {
            self.world.note(Event::Clobbered {
                saga: ctx.saga_id.to_string(),
                step: ctx.step_seq,
                key: key.clone(),
                found,
            });
        }
        // Noted even when nothing changes (the effect never happened): an effect of the
        // step arriving later is then seen.
        self.world.set(
            &key,
            old,
            Event::Restored {
                saga: ctx.saga_id.to_string(),
                step: ctx.step_seq,
                key: key.clone(),
                to: old,
            },
        );
        match act {
            Act::CrashAfter => {
                self.process.die();
                std::future::pending().await
            }
            Act::HangAfter => {
                self.world.note(Event::CompensationFailed {
                    saga: ctx.saga_id.to_string(),
                    step: ctx.step_seq,
                });
                std::future::pending().await
            }
            _ => Ok(()),
        }
    }

    async fn changed_since(
        &self,
        _ctx: &ToolContext,
        args: &Value,
        undo: &Undo,
        _output: Option<&ToolOutput>,
    ) -> Result<Option<String>, ToolError> {
        let (key, value) = key_and_value(args)?;
        let old = old_of(undo);
        let found = self.world.get(&key);
        let changed = found != Some(value) && found != old;
        if !changed {
            // The act follows (a compensation, an effect): nothing outside lands between.
            self.world.checked(&key);
        }
        Ok(changed.then(|| format!("{key} holds {}", shown(found))))
    }
}
