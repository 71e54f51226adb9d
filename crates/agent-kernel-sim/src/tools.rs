//! The simulated tool: `sim.set {key, value, fail?}` sets a key of the world, as a file
//! write sets a file's bytes, and its compensation puts back what was there before, as a
//! file tool does: without looking, so a compensation run over someone else's later write
//! destroys it (the world notes that as a clobber, which the checks refuse).
//!
//! `sim.set.probed` is the same tool settled by its probe ([`Settlement::Probe`]): a step
//! whose outcome is unknown is compensated only when the probe finds its value in place.
//! `sim.set.approved` is the same tool again, whose steps wait for an operator's approval
//! (the simulated kernels' `[approval] require`).

use std::sync::Arc;

use agent_kernel_api::{
    Compensate, KeyTemplate, Probe, ProbeOutcome, Settlement, Tool, ToolContext, ToolError,
    ToolOutput, ToolSpec, Undo,
};
use serde_json::{Value, json};

use crate::process::{Act, Process};
use crate::world::{Event, World, shown};

/// The tool's id.
pub const SET_TOOL: &str = "sim.set";

/// The id of the same tool settled by its probe.
pub const PROBED_TOOL: &str = "sim.set.probed";

/// The id of the same tool whose steps wait for an operator's approval.
pub const APPROVED_TOOL: &str = "sim.set.approved";

/// `sim.set`, `sim.set.probed` or `sim.set.approved` in one simulated process.
pub(crate) struct SetTool {
    pub(crate) world: Arc<World>,
    pub(crate) process: Arc<Process>,
    /// Which of the three.
    pub(crate) id: &'static str,
}

/// A call's key and value.
pub(crate) fn key_and_value(args: &Value) -> Result<(String, i64), ToolError> {
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
        let spec = ToolSpec::mutating(self.id)
            .with_version("1.0.0")
            .with_resources([template]);
        if self.id == PROBED_TOOL {
            spec.with_settlement(Settlement::Probe)
        } else {
            spec
        }
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
            self.world.acted(&key, self.process.name());
            return Err(ToolError::failed("fails on purpose").not_applied());
        }
        let act = self
            .process
            .point(&format!("effect {step}: {key} = {value}"), false);
        self.world.acted(&key, self.process.name());
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
        self.world.acted(&key, self.process.name());
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
            self.world.checked(&key, self.process.name());
        }
        Ok(changed.then(|| format!("{key} holds {}", shown(found))))
    }

    /// Before the effect, the key must hold what `prepare` found: its old value (values
    /// repeat when an agent runs its sagas again, so holding the step's own value may be
    /// another writer's doing).
    async fn changed_since_prepared(
        &self,
        _ctx: &ToolContext,
        args: &Value,
        undo: &Undo,
    ) -> Result<Option<String>, ToolError> {
        let (key, _) = key_and_value(args)?;
        let found = self.world.get(&key);
        let changed = found != old_of(undo);
        if !changed {
            // The effect follows: nothing outside lands between.
            self.world.checked(&key, self.process.name());
        }
        Ok(changed.then(|| format!("{key} holds {}", shown(found))))
    }
}

impl Probe for SetTool {
    /// Whether the step's value is in place: values are unique among a scenario's sagas, so
    /// only this step writes it (a later writer may have replaced it since: then there is
    /// nothing of the step left to undo). An agent that runs its sagas again writes them
    /// again, though, and a power loss can leave the first run's value unlogged.
    async fn probe(
        &self,
        ctx: &ToolContext,
        args: &Value,
        _undo: &Undo,
    ) -> Result<ProbeOutcome, ToolError> {
        let (key, value) = key_and_value(args)?;
        self.process.gate().await;
        let step = format!("{}/{}", ctx.saga_id, ctx.step_seq);
        let act = self
            .process
            .point(&format!("probe {step}: is {key} = {value}?"), false);
        let failed = || {
            self.world.note(Event::ProbeFailed {
                saga: ctx.saga_id.to_string(),
                step: ctx.step_seq,
            });
            // No compensation follows.
            self.world.acted(&key, self.process.name());
        };
        match act {
            Act::CrashBefore | Act::CrashAfter => {
                // No compensation of this process follows.
                self.world.acted(&key, self.process.name());
                self.process.die();
                std::future::pending().await
            }
            Act::Fail => {
                failed();
                Err(ToolError::failed(
                    "simulated failure: the probe could not look",
                ))
            }
            // The dispatcher's timeout gives up on it.
            Act::HangBefore | Act::HangAfter => {
                failed();
                std::future::pending().await
            }
            Act::Go => {
                let happened = args.get("fail").and_then(Value::as_bool) != Some(true)
                    && self.world.get(&key) == Some(value);
                if happened {
                    Ok(ProbeOutcome::Happened(None))
                } else {
                    // No compensation follows.
                    self.world.acted(&key, self.process.name());
                    Ok(ProbeOutcome::NotHappened)
                }
            }
        }
    }
}
