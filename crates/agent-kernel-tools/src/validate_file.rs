//! `validate.file`: checks that a file inside the sandbox exists and holds what the plan expects.

use std::path::PathBuf;
use std::sync::Arc;

use agent_kernel_api::{Tool, ToolContext, ToolError, ToolOutput, ToolSpec};
use agent_kernel_sandbox::FsSandbox;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::common::{
    FileAccess, TOOL_VERSION, blocking, byte_count, object_schema, parse_args, path_schema,
    sandbox_error,
};

/// The most characters of an expected text quoted in a failure message; longer texts are cut
/// so a large `equals` cannot flood the log.
const QUOTE_CHARS_MAX: usize = 64;

/// `validate.file`: read-only; checks that `path` exists and, when given, that its bytes
/// contain `contains` and are exactly `equals`.
/// Returns `{"path": <arg>, "bytes": n, "checks": ["exists", ...]}`, naming the checks that
/// ran.
///
/// A check that does not hold, a missing file included, is a
/// [`ToolError::validation`] failure, which rolls the saga back.
/// Comparisons are on bytes (the arguments' UTF-8 bytes), so the file need not be text.
/// The file must be no larger than the policy's `max_io_bytes` (a denial otherwise).
#[derive(Debug, Clone)]
pub struct ValidateFile {
    files: FileAccess,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ValidateArgs {
    path: String,
    #[serde(default)]
    contains: Option<String>,
    #[serde(default)]
    equals: Option<String>,
}

impl ValidateFile {
    /// The tool id.
    pub const ID: &'static str = "validate.file";

    /// A tool confined by `sandbox`; relative paths resolve against `cwd`.
    pub fn new(sandbox: Arc<FsSandbox>, cwd: PathBuf) -> ValidateFile {
        ValidateFile {
            files: FileAccess::new(sandbox, cwd),
        }
    }
}

impl Tool for ValidateFile {
    fn spec(&self) -> ToolSpec {
        ToolSpec::read_only(Self::ID)
            .with_version(TOOL_VERSION)
            .with_description("Check a file's content; a failed check rolls the saga back.")
            .with_schema(object_schema(
                "validate.file arguments",
                json!({
                    "path": path_schema(),
                    "contains": {
                        "type": "string",
                        "description": "text the file's bytes must contain",
                    },
                    "equals": {
                        "type": "string",
                        "description": "text the file's bytes must be exactly",
                    },
                }),
                &["path"],
            ))
    }

    fn check(&self, args: &Value) -> Result<(), ToolError> {
        let ValidateArgs { path, .. } = parse_args(args)?;
        self.files.resolve(&path).map(|_| ())
    }

    async fn execute(&self, _ctx: &ToolContext, args: &Value) -> Result<ToolOutput, ToolError> {
        let ValidateArgs {
            path,
            contains,
            equals,
        } = parse_args(args)?;
        let file = self.files.open(&path)?;
        let read = blocking(move || Ok(file.read_all())).await?;
        // Absence is the world differing from the plan, not a tool failure.
        let bytes = match read {
            Ok(bytes) => bytes,
            Err(error) if error.is_not_found() => {
                return Err(ToolError::validation(format!("`{path}` does not exist")));
            }
            Err(error) => return Err(sandbox_error(error)),
        };
        let count = bytes.len() as u64;
        let mut checks = vec!["exists"];
        if let Some(expected) = &contains {
            if !contains_bytes(&bytes, expected.as_bytes()) {
                return Err(ToolError::validation(format!(
                    "`{path}` does not contain {}",
                    quote(expected)
                )));
            }
            checks.push("contains");
        }
        if let Some(expected) = &equals {
            if let Some(difference) = difference(&bytes, expected.as_bytes()) {
                return Err(ToolError::validation(format!(
                    "`{path}` is not equal to the expected content ({difference})"
                )));
            }
            checks.push("equals");
        }
        let n_checks = checks.len();
        let noun = if n_checks == 1 { "check" } else { "checks" };
        Ok(
            ToolOutput::new(json!({ "path": path, "bytes": count, "checks": checks }))
                .with_effect(format!("validated {path} ({n_checks} {noun})")),
        )
    }
}

/// Whether `needle` occurs in `haystack`; the empty needle occurs everywhere.
fn contains_bytes(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty()
        || haystack
            .windows(needle.len())
            .any(|window| window == needle)
}

/// How `actual` differs from `expected`, or `None` when they are equal.
fn difference(actual: &[u8], expected: &[u8]) -> Option<String> {
    if actual.len() != expected.len() {
        return Some(format!(
            "{}, expected {}",
            byte_count(actual.len() as u64),
            expected.len()
        ));
    }
    let offset = actual
        .iter()
        .zip(expected)
        .position(|(actual_byte, expected_byte)| actual_byte != expected_byte)?;
    Some(format!(
        "{} as expected, but they differ from byte offset {offset}",
        byte_count(actual.len() as u64)
    ))
}

/// `text` in quotes with escapes, cut after [`QUOTE_CHARS_MAX`] characters.
fn quote(text: &str) -> String {
    match text.char_indices().nth(QUOTE_CHARS_MAX) {
        None => format!("{text:?}"),
        Some((cut, _)) => format!(
            "{:?}… ({} in all)",
            &text[..cut],
            byte_count(text.len() as u64)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contains_bytes_finds_a_needle_anywhere() {
        assert!(contains_bytes(b"alpha", b""));
        assert!(contains_bytes(b"alpha", b"alpha"));
        assert!(contains_bytes(b"alpha", b"pha"));
        assert!(!contains_bytes(b"alpha", b"alphas"));
        assert!(!contains_bytes(b"", b"a"));
    }

    #[test]
    fn difference_names_lengths_or_the_first_differing_byte() {
        assert_eq!(difference(b"alpha", b"alpha"), None);
        assert_eq!(
            difference(b"alpha", b"al").as_deref(),
            Some("5 bytes, expected 2")
        );
        assert_eq!(
            difference(b"alpha", b"alpho").as_deref(),
            Some("5 bytes as expected, but they differ from byte offset 4")
        );
    }

    #[test]
    fn quote_escapes_and_cuts_long_texts() {
        assert_eq!(quote("say \"hi\"\n"), r#""say \"hi\"\n""#);
        let long = "é".repeat(QUOTE_CHARS_MAX + 1);
        assert_eq!(
            quote(&long),
            format!("{:?}… (130 bytes in all)", "é".repeat(QUOTE_CHARS_MAX))
        );
    }
}
