//! Denied names: glob patterns matched case-insensitively against single path components.

use std::path::{Component, Path};

use glob::{MatchOptions, Pattern};

/// The compiled `deny_names` of a policy.
///
/// Patterns and names are both lowercased before matching, so `.ENV` matches `.env` for every
/// alphabet, not only ASCII.
#[derive(Debug, Clone, Default)]
pub(crate) struct DenyNames {
    written: Vec<String>,
    compiled: Vec<Pattern>,
}

const MATCH_OPTIONS: MatchOptions = MatchOptions {
    case_sensitive: false,
    require_literal_separator: true,
    require_literal_leading_dot: false,
};

impl DenyNames {
    /// Compiles `patterns`.
    ///
    /// A pattern that is empty, is not a valid glob, or contains a path separator (it could
    /// never match a single component) is an error naming it.
    pub(crate) fn new(patterns: &[String]) -> Result<DenyNames, String> {
        let mut compiled = Vec::with_capacity(patterns.len());
        for pattern in patterns {
            if pattern.is_empty() {
                return Err("[fs] deny_names has an empty entry".to_owned());
            }
            if pattern.contains('/') || pattern.contains('\\') {
                return Err(format!(
                    "[fs] deny_names entry `{pattern}` contains a path separator; \
                     entries match single names"
                ));
            }
            let glob = Pattern::new(&pattern.to_lowercase()).map_err(|error| {
                format!("[fs] deny_names entry `{pattern}` is not a valid glob: {error}")
            })?;
            compiled.push(glob);
        }
        Ok(DenyNames {
            written: patterns.to_vec(),
            compiled,
        })
    }

    /// The patterns as written.
    pub(crate) fn patterns(&self) -> &[String] {
        &self.written
    }

    /// Whether no name is denied.
    pub(crate) fn is_empty(&self) -> bool {
        self.compiled.is_empty()
    }

    /// The pattern that denies `name`, if any.
    pub(crate) fn matching(&self, name: &str) -> Option<&str> {
        let lowered = name.to_lowercase();
        self.compiled
            .iter()
            .zip(&self.written)
            .find(|(glob, _)| glob.matches_with(&lowered, MATCH_OPTIONS))
            .map(|(_, written)| written.as_str())
    }

    /// The first component of `path` that a pattern denies, with that pattern.
    pub(crate) fn first_denied(&self, path: &Path) -> Option<(String, &str)> {
        if self.is_empty() {
            return None;
        }
        path.components().find_map(|component| match component {
            Component::Normal(name) => {
                let name = name.to_string_lossy();
                self.matching(&name)
                    .map(|pattern| (name.into_owned(), pattern))
            }
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(patterns: &[&str]) -> DenyNames {
        let owned: Vec<String> = patterns.iter().map(|p| (*p).to_owned()).collect();
        DenyNames::new(&owned).expect("valid patterns")
    }

    #[test]
    fn matches_case_insensitively_at_any_depth() {
        let deny = names(&[".env", "*.pem", "id_rsa"]);
        assert_eq!(
            deny.first_denied(Path::new("a/b/.ENV/c")),
            Some((".ENV".to_owned(), ".env"))
        );
        assert_eq!(
            deny.first_denied(Path::new("keys/Server.PEM")),
            Some(("Server.PEM".to_owned(), "*.pem"))
        );
        assert_eq!(deny.first_denied(Path::new("a/env/b.txt")), None);
        assert_eq!(deny.first_denied(Path::new("id_rsa.pub")), None);
    }

    #[test]
    fn unicode_case_folds() {
        let deny = names(&["ÉTÉ"]);
        assert!(deny.matching("été").is_some());
    }

    #[test]
    fn rejects_separators_and_bad_globs() {
        assert!(DenyNames::new(&["a/b".to_owned()]).is_err());
        assert!(DenyNames::new(&["[".to_owned()]).is_err());
        assert!(DenyNames::new(&[String::new()]).is_err());
    }
}
