//! The plan file of the contract, parsed strictly.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Largest number of steps in one plan.
pub const MAX_PLAN_STEPS: usize = 10_000;
/// Largest plan file, in bytes.
pub const MAX_PLAN_BYTES: usize = 16 * 1024 * 1024;
/// Longest idempotency key, in bytes.
pub const MAX_IDEMPOTENCY_KEY_BYTES: usize = 256;
/// Longest plan name or actor, in bytes.
pub const MAX_LABEL_BYTES: usize = 256;

/// A plan: the steps of one saga, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// An optional label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Who runs the plan; recorded in the log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
    /// The steps, run in order. Never empty.
    pub steps: Vec<PlanStep>,
}

/// One step of a plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanStep {
    /// The tool id, e.g. `fs.write`.
    pub tool: String,
    /// The tool's arguments: a JSON object. When parsed, a key twice in one object, at any
    /// depth, is refused (JSON would silently keep the last one).
    #[serde(deserialize_with = "strict_value")]
    pub args: Value,
    /// A key that makes the step run at most once across sagas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
}

/// Why a plan was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// The text is not a plan: bad JSON, a missing or unknown field, a wrong type.
    #[error("invalid plan: {0}")]
    Syntax(String),
    /// The plan has no steps.
    #[error("invalid plan: `steps` is empty; a plan needs at least one step")]
    Empty,
    /// A bound of the plan format is exceeded.
    #[error("invalid plan: {what} is {actual}, more than the maximum of {max}")]
    TooLarge {
        /// What is too large.
        what: String,
        /// Its size.
        actual: usize,
        /// The bound.
        max: usize,
    },
    /// A step is malformed in a way the JSON shape does not show.
    #[error("invalid plan: step {step_idx} (`{tool}`): {reason}")]
    Step {
        /// The step's index, from 0.
        step_idx: usize,
        /// The step's tool id.
        tool: String,
        /// What is wrong.
        reason: String,
    },
}

impl PlanStep {
    /// A step calling `tool` with `args`, without an idempotency key.
    pub fn new(tool: impl Into<String>, args: Value) -> PlanStep {
        PlanStep {
            tool: tool.into(),
            args,
            idempotency_key: None,
        }
    }

    /// The same step, run at most once across sagas by `key`.
    #[must_use]
    pub fn with_key(mut self, key: impl Into<String>) -> PlanStep {
        self.idempotency_key = Some(key.into());
        self
    }
}

impl Plan {
    /// A plan of `steps`, checked as a plan file is ([`Plan::validate`]).
    ///
    /// # Errors
    ///
    /// A [`PlanError`]: no step, too many, arguments that are not an object, a bound
    /// exceeded.
    pub fn new(steps: Vec<PlanStep>) -> Result<Plan, PlanError> {
        let plan = Plan {
            name: None,
            actor: None,
            steps,
        };
        plan.validate()?;
        Ok(plan)
    }

    /// The same plan with a label.
    ///
    /// # Errors
    ///
    /// [`PlanError::TooLarge`] for a label over [`MAX_LABEL_BYTES`].
    pub fn named(mut self, name: impl Into<String>) -> Result<Plan, PlanError> {
        self.name = Some(name.into());
        self.validate()?;
        Ok(self)
    }

    /// The same plan, run by `actor` (an actor runs one saga at a time).
    ///
    /// # Errors
    ///
    /// [`PlanError::TooLarge`] for an actor over [`MAX_LABEL_BYTES`].
    pub fn by_actor(mut self, actor: impl Into<String>) -> Result<Plan, PlanError> {
        self.actor = Some(actor.into());
        self.validate()?;
        Ok(self)
    }

    /// Parses and checks a plan document.
    ///
    /// # Errors
    ///
    /// A [`PlanError`] naming what is wrong: JSON syntax, unknown fields, an empty step list,
    /// arguments that are not an object, or a bound exceeded.
    pub fn from_json(text: &str) -> Result<Plan, PlanError> {
        if text.len() > MAX_PLAN_BYTES {
            return Err(PlanError::TooLarge {
                what: "the plan file, in bytes,".into(),
                actual: text.len(),
                max: MAX_PLAN_BYTES,
            });
        }
        let plan: Plan =
            serde_json::from_str(text).map_err(|err| PlanError::Syntax(err.to_string()))?;
        plan.validate()?;
        Ok(plan)
    }

    /// Checks the bounds and shapes that serde does not.
    ///
    /// # Errors
    ///
    /// As [`Plan::from_json`].
    pub fn validate(&self) -> Result<(), PlanError> {
        if self.steps.is_empty() {
            return Err(PlanError::Empty);
        }
        if self.steps.len() > MAX_PLAN_STEPS {
            return Err(PlanError::TooLarge {
                what: "the number of steps".into(),
                actual: self.steps.len(),
                max: MAX_PLAN_STEPS,
            });
        }
        for (label, value) in [("name", &self.name), ("actor", &self.actor)] {
            if let Some(value) = value
                && value.len() > MAX_LABEL_BYTES
            {
                return Err(PlanError::TooLarge {
                    what: format!("`{label}`, in bytes,"),
                    actual: value.len(),
                    max: MAX_LABEL_BYTES,
                });
            }
        }
        for (step_idx, step) in self.steps.iter().enumerate() {
            let fail = |reason: String| PlanError::Step {
                step_idx,
                tool: step.tool.clone(),
                reason,
            };
            if step.tool.is_empty() {
                return Err(fail("`tool` is empty".into()));
            }
            if !step.args.is_object() {
                return Err(fail(format!(
                    "`args` must be a JSON object, found {}",
                    json_kind(&step.args)
                )));
            }
            if let Some(key) = &step.idempotency_key {
                if key.is_empty() {
                    return Err(fail("`idempotency_key` is empty".into()));
                }
                if key.len() > MAX_IDEMPOTENCY_KEY_BYTES {
                    return Err(fail(format!(
                        "`idempotency_key` is {} bytes, more than the maximum of {MAX_IDEMPOTENCY_KEY_BYTES}",
                        key.len()
                    )));
                }
            }
        }
        Ok(())
    }
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Deserializes a JSON value as `serde_json::Value` does, but refuses an object that holds
/// the same key twice, at any depth: the plan's author meant one of the two, and which one
/// a reader keeps differs between parsers.
fn strict_value<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Value, D::Error> {
    deserializer.deserialize_any(StrictValue)
}

/// The visitor of [`strict_value`].
struct StrictValue;

impl<'de> serde::de::Visitor<'de> for StrictValue {
    type Value = Value;

    fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("any JSON value")
    }

    fn visit_bool<E>(self, value: bool) -> Result<Value, E> {
        Ok(Value::Bool(value))
    }

    fn visit_i64<E>(self, value: i64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_u64<E>(self, value: u64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_f64<E>(self, value: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(value).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, value: &str) -> Result<Value, E> {
        Ok(Value::String(value.to_owned()))
    }

    fn visit_string<E>(self, value: String) -> Result<Value, E> {
        Ok(Value::String(value))
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        strict_value(deserializer)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(StrictItem(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                return Err(serde::de::Error::custom(format_args!(
                    "duplicate key `{}` in the arguments",
                    key.escape_debug()
                )));
            }
            let StrictItem(value) = map.next_value()?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

/// One nested value, parsed by [`strict_value`].
struct StrictItem(Value);

impl<'de> Deserialize<'de> for StrictItem {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        strict_value(deserializer).map(StrictItem)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, expected: Result<usize, &str>) {
        let actual = Plan::from_json(text)
            .map(|plan| plan.steps.len())
            .map_err(|err| err.to_string());
        match (&actual, expected) {
            (Ok(n), Ok(want)) => assert_eq!(*n, want),
            (Err(message), Err(fragment)) => assert!(
                message.contains(fragment),
                "error `{message}` lacks `{fragment}`"
            ),
            _ => panic!("{text}: got {actual:?}, expected {expected:?}"),
        }
    }

    #[test]
    fn plans() {
        check(r#"{"steps":[{"tool":"noop","args":{}}]}"#, Ok(1));
        check(
            r#"{"name":"n","actor":"a","steps":[{"tool":"noop","args":{},"idempotency_key":"k"}]}"#,
            Ok(1),
        );
        check(r#"{"steps":[]}"#, Err("`steps` is empty"));
        check(
            r#"{"steps":[{"tool":"noop","tool":"fs.write","args":{}}]}"#,
            Err("duplicate field `tool`"),
        );
        check(
            r#"{"steps":[{"tool":"noop","args":{"a":1,"a":2}}]}"#,
            Err("duplicate key `a` in the arguments"),
        );
        check(
            r#"{"steps":[{"tool":"noop","args":{"a":[{"b":{"c":1,"c":1}}]}}]}"#,
            Err("duplicate key `c` in the arguments"),
        );
        // The same key in sibling objects is no duplicate; values parse as serde_json's do.
        let plan = Plan::from_json(
            r#"{"steps":[{"tool":"noop","args":{"a":{"k":1},"b":{"k":-2.5},"c":[null,true,"s",18446744073709551615]}}]}"#,
        )
        .expect("parses");
        assert_eq!(
            plan.steps[0].args,
            serde_json::json!({"a":{"k":1},"b":{"k":-2.5},"c":[null,true,"s",18446744073709551615_u64]})
        );
        check(r#"{}"#, Err("missing field `steps`"));
        check(
            r#"{"steps":[{"tool":"noop","args":{}}],"stepz":1}"#,
            Err("unknown field `stepz`"),
        );
        check(
            r#"{"steps":[{"tool":"noop","args":{},"idempotency":"k"}]}"#,
            Err("unknown field `idempotency`"),
        );
        check(
            r#"{"steps":[{"tool":"noop"}]}"#,
            Err("missing field `args`"),
        );
        check(
            r#"{"steps":[{"tool":"noop","args":[]}]}"#,
            Err("`args` must be a JSON object, found an array"),
        );
        check(
            r#"{"steps":[{"tool":"noop","args":{},"idempotency_key":""}]}"#,
            Err("`idempotency_key` is empty"),
        );
        check("", Err("EOF while parsing"));
        check("{not json", Err("invalid plan"));
    }
}
