//! Resource keys: what a mutating call touches, named so the kernel can keep sagas apart on
//! it (semantic locks) and catch a regenerated call of an irreversible tool (duplicate
//! keys).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json_path::JsonPath;

use crate::{Owner, SagaId, SagaState, StepStatus, ToolError};

/// The most resource keys one call may claim.
pub const MAX_RESOURCES_PER_STEP: usize = 64;

/// The most bytes of one resource key.
pub const MAX_RESOURCE_KEY_BYTES: usize = 1024;

/// The resource key of a file, as the sandbox resolved it: `file:` and its absolute path.
pub fn file_resource(resolved: &std::path::Path) -> String {
    format!("file:{}", resolved.display())
}

/// The resource key of a mutating tool that declares none: the tool itself, `tool:ID`.
pub fn tool_resource(tool_id: &str) -> String {
    format!("tool:{tool_id}")
}

/// `keys` sorted and without repeats, within [`MAX_RESOURCES_PER_STEP`] and
/// [`MAX_RESOURCE_KEY_BYTES`], none containing U+0000.
pub(crate) fn bounded_keys(mut keys: Vec<String>) -> Result<Vec<String>, ToolError> {
    keys.sort();
    keys.dedup();
    if keys.len() > MAX_RESOURCES_PER_STEP {
        return Err(ToolError::invalid_args(format!(
            "the call names {} resources, more than the maximum of {MAX_RESOURCES_PER_STEP}",
            keys.len()
        )));
    }
    if let Some(key) = keys.iter().find(|key| key.len() > MAX_RESOURCE_KEY_BYTES) {
        return Err(ToolError::invalid_args(format!(
            "a resource key of the call has {} bytes, more than the maximum of {MAX_RESOURCE_KEY_BYTES}",
            key.len()
        )));
    }
    if let Some(key) = keys.iter().find(|key| key.contains('\0')) {
        // PostgreSQL's text keeps no NUL, and its JSON functions refuse an escaped one.
        return Err(ToolError::invalid_args(format!(
            "a resource key of the call contains the character U+0000, which the log cannot keep: {}",
            key.escape_debug()
        )));
    }
    Ok(keys)
}

/// A key computed from a call's arguments: an optional literal prefix, then an RFC 9535
/// JSONPath query over `{"args": …}` (`ledger:$.args.id`); or a literal key alone, without
/// `$`. Each value the query selects is one key: a string as it is, anything else as its
/// compact JSON, after the prefix.
///
/// ```
/// use agent_kernel_api::KeyTemplate;
/// use serde_json::json;
///
/// let template: KeyTemplate = "ledger:$.args.id".parse().expect("a valid template");
/// assert_eq!(template.keys(&json!({"id": 17})), vec!["ledger:17".to_owned()]);
/// assert!("$.args[".parse::<KeyTemplate>().is_err());
/// ```
#[derive(Clone)]
pub struct KeyTemplate {
    text: String,
    prefix: String,
    path: Option<JsonPath>,
}

/// Why a text is not a [`KeyTemplate`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{text}` is not a resource key template: {reason}")]
pub struct KeyTemplateError {
    /// The text given.
    pub text: String,
    /// What is wrong with it.
    pub reason: String,
}

impl KeyTemplate {
    /// Parses `text`: everything before the first `$` is a literal prefix, the rest a
    /// JSONPath query; a text without `$` is a literal key.
    ///
    /// # Errors
    ///
    /// [`KeyTemplateError`] for an empty text, one longer than [`MAX_RESOURCE_KEY_BYTES`],
    /// or a query that is not RFC 9535 JSONPath.
    pub fn parse(text: &str) -> Result<KeyTemplate, KeyTemplateError> {
        let error = |reason: String| KeyTemplateError {
            text: text.to_owned(),
            reason,
        };
        if text.is_empty() {
            return Err(error("it is empty".to_owned()));
        }
        if text.len() > MAX_RESOURCE_KEY_BYTES {
            return Err(error(format!(
                "it has {} bytes, more than the maximum of {MAX_RESOURCE_KEY_BYTES}",
                text.len()
            )));
        }
        let (prefix, path) = match text.find('$') {
            None => (text, None),
            Some(at) => {
                let query = &text[at..];
                let path = JsonPath::parse(query).map_err(|err| error(err.to_string()))?;
                (&text[..at], Some(path))
            }
        };
        Ok(KeyTemplate {
            text: text.to_owned(),
            prefix: prefix.to_owned(),
            path,
        })
    }

    /// The text it was parsed from.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The keys it names for a call with `args`: none when its query selects nothing.
    pub fn keys(&self, args: &Value) -> Vec<String> {
        let Some(path) = &self.path else {
            return vec![self.prefix.clone()];
        };
        let document = serde_json::json!({ "args": args });
        path.query(&document)
            .all()
            .into_iter()
            .map(|value| match value {
                Value::String(text) => format!("{}{text}", self.prefix),
                other => format!("{}{other}", self.prefix),
            })
            .collect()
    }
}

impl FromStr for KeyTemplate {
    type Err = KeyTemplateError;

    fn from_str(text: &str) -> Result<KeyTemplate, KeyTemplateError> {
        KeyTemplate::parse(text)
    }
}

impl PartialEq for KeyTemplate {
    fn eq(&self, other: &KeyTemplate) -> bool {
        self.text == other.text
    }
}

impl Eq for KeyTemplate {}

impl fmt::Debug for KeyTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("KeyTemplate").field(&self.text).finish()
    }
}

impl fmt::Display for KeyTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Parses the templates a tools file lists under `field` (`resources`, `duplicate_keys`).
///
/// # Errors
///
/// A message naming the field and the first template that is not valid, or more than
/// [`MAX_RESOURCES_PER_STEP`] of them.
pub fn parse_templates(field: &str, texts: &[String]) -> Result<Vec<KeyTemplate>, String> {
    if texts.len() > MAX_RESOURCES_PER_STEP {
        return Err(format!(
            "`{field}` lists {} templates, more than the maximum of {MAX_RESOURCES_PER_STEP}",
            texts.len()
        ));
    }
    texts
        .iter()
        .map(|text| KeyTemplate::parse(text).map_err(|error| format!("`{field}`: {error}")))
        .collect()
}

/// The keys of `templates` for `args`, sorted and without repeats.
pub fn template_keys(templates: &[KeyTemplate], args: &Value) -> Vec<String> {
    let mut keys: Vec<String> = templates
        .iter()
        .flat_map(|template| template.keys(args))
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

/// The saga that holds a resource another saga asked for: what a conflict names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LockHolder {
    /// The resource asked for.
    pub resource: String,
    /// The saga holding it.
    pub saga_id: SagaId,
    /// Its state when the claim was refused.
    pub state: SagaState,
    /// The process that owns it.
    pub owner: Owner,
}

impl fmt::Display for LockHolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` is held by saga {} ({}, process {} on {})",
            self.resource, self.saga_id, self.state, self.owner.pid, self.owner.host
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_template_is_a_prefix_and_a_query() {
        let account: KeyTemplate = "$.args.account".parse().expect("valid");
        assert_eq!(account.keys(&json!({"account": "alice"})), vec!["alice"]);
        assert!(account.keys(&json!({"other": 1})).is_empty());
        let all: KeyTemplate = "acct:$.args.to[*]".parse().expect("valid");
        assert_eq!(
            all.keys(&json!({"to": ["a", 2, {"x": true}]})),
            vec!["acct:a", "acct:2", "acct:{\"x\":true}"]
        );
        let literal: KeyTemplate = "ledger".parse().expect("valid");
        assert_eq!(literal.keys(&json!({})), vec!["ledger"]);
        let error = KeyTemplate::parse("x:$.args[").expect_err("invalid");
        assert_eq!(error.text, "x:$.args[");
        assert!(KeyTemplate::parse("").is_err());
        assert_eq!(
            template_keys(&[account.clone(), account], &json!({"account": "b"})),
            vec!["b"]
        );
    }

    #[test]
    fn resource_keys_are_sorted_once_and_refused_with_a_nul() {
        let keys = |texts: &[&str]| texts.iter().map(|text| (*text).to_owned()).collect();
        assert_eq!(
            bounded_keys(keys(&["b", "a", "b"])).expect("bounded"),
            ["a", "b"]
        );
        let error = bounded_keys(keys(&["acct:1\0"])).expect_err("refused");
        assert!(error.message().contains("U+0000"), "{error:?}");
        assert!(error.message().contains("acct:1\\0"), "{error:?}");
    }
}

/// A step an irreversible call duplicates ([`TxLog::duplicate_of`](crate::TxLog::duplicate_of)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DuplicateStep {
    /// Its saga.
    pub saga_id: SagaId,
    /// Its position.
    pub step_seq: u32,
    /// Its tool.
    pub tool_id: String,
    /// Its arguments, as they ran.
    pub args: Value,
    /// Its status.
    pub status: StepStatus,
    /// The key the two calls share.
    pub key: String,
    /// When it began, in ms since the Unix epoch.
    pub at_ms: i64,
}

/// A step of another saga that claimed a resource since a given instant, whose effect may
/// still be in place ([`TxLog::later_claim`](crate::TxLog::later_claim)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaterClaim {
    /// Its saga.
    pub saga_id: SagaId,
    /// Its position.
    pub step_seq: u32,
    /// Its saga's state now.
    pub state: SagaState,
    /// When it began, in ms since the Unix epoch.
    pub at_ms: i64,
}

/// What [`BeginStep::duplicate_check`](crate::BeginStep::duplicate_check) looks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DuplicateCheck {
    /// Steps begun at or after this instant count (ms since the Unix epoch): the start of
    /// `[limits] duplicate_window`, or, for a BEGIN that consumes an approval, when its
    /// request was asked, if later (what began before, the request was made knowing).
    pub since_ms: i64,
    /// The earlier step the approval this BEGIN consumes was given over (its saga and
    /// position), which a person saw beside this call: it never counts.
    pub approved_over: Option<(SagaId, u32)>,
}
