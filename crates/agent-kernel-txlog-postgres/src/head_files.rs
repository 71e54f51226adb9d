//! This machine's head files of the logs at one URL: one per log identity, so that a log
//! recreated at the same URL (a new database, or the tables dropped and made again) is
//! told apart from the one a head file vouches for.
//!
//! The URL's file (`postgres-<digest>.audit-head`, [`default_head_file`](crate::default_head_file))
//! is the base: the head file of the log whose id is `ID` is
//! `postgres-<digest>.log-ID.audit-head` beside it. A base file itself is what a build
//! before log identities wrote; a writer renames it to its log's name.

use std::path::{Path, PathBuf};

use crate::verify::HEAD_FILE_SUFFIX;

/// What a log's head file name holds between the URL's base and the suffix.
const LOG_ID_INFIX: &str = ".log-";

/// The head file of the log `log_id` at the URL whose base head file is `base`.
pub(crate) fn keyed(base: &Path, log_id: &str) -> PathBuf {
    let text = base.to_string_lossy();
    let stem = text.strip_suffix(HEAD_FILE_SUFFIX).unwrap_or(&text);
    PathBuf::from(format!("{stem}{LOG_ID_INFIX}{log_id}{HEAD_FILE_SUFFIX}"))
}

/// Every head file this machine keeps for the URL whose base head file is `base`: the
/// base itself when it exists (an earlier build's), then each log's, sorted.
pub(crate) fn all_for_url(base: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    if base.symlink_metadata().is_ok() {
        found.push(base.to_owned());
    }
    let (Some(folder), Some(name)) = (base.parent(), base.file_name()) else {
        return found;
    };
    let name = name.to_string_lossy();
    let stem = name.strip_suffix(HEAD_FILE_SUFFIX).unwrap_or(&name);
    let prefix = format!("{stem}{LOG_ID_INFIX}");
    let folder = if folder.as_os_str().is_empty() {
        Path::new(".")
    } else {
        folder
    };
    let Ok(entries) = std::fs::read_dir(folder) else {
        return found;
    };
    let mut keyed: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter(|entry| {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            name.starts_with(&prefix) && name.ends_with(HEAD_FILE_SUFFIX)
        })
        .map(|entry| base.with_file_name(entry.file_name()))
        .collect();
    keyed.sort();
    found.extend(keyed);
    found
}

/// Which of `files` (from [`all_for_url`]) vouches for the log `log_id` (`None`: a log
/// from before identities): its own file, else the base an earlier build wrote, not yet
/// renamed by a writer.
pub(crate) fn anchor_of(base: &Path, log_id: Option<&str>, files: &[PathBuf]) -> Option<PathBuf> {
    let own = log_id.map(|id| keyed(base, id));
    own.filter(|own| files.contains(own))
        .or_else(|| files.iter().find(|file| file.as_path() == base).cloned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_log_at_a_url_has_its_own_file_beside_the_base() {
        let dir = tempfile::tempdir().expect("temp dir");
        let base = dir.path().join("postgres-abc.audit-head");
        let first = keyed(&base, "1111-aa");
        assert_eq!(
            first,
            dir.path().join("postgres-abc.log-1111-aa.audit-head")
        );
        assert!(all_for_url(&base).is_empty());
        std::fs::write(&first, "x").expect("writes");
        std::fs::write(dir.path().join("postgres-abd.log-9.audit-head"), "x").expect("writes");
        assert_eq!(all_for_url(&base), vec![first.clone()]);
        std::fs::write(&base, "x").expect("writes");
        let files = all_for_url(&base);
        assert_eq!(files, vec![base.clone(), first.clone()]);
        assert_eq!(anchor_of(&base, Some("1111-aa"), &files), Some(first));
        assert_eq!(anchor_of(&base, Some("2222"), &files), Some(base.clone()));
        assert_eq!(anchor_of(&base, None, &files), Some(base));
    }
}
