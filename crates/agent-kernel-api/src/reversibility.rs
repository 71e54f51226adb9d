//! How far a tool's effect can be taken back, and for how long (reference §10).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The longest undo window that may be declared: 366 days, in milliseconds.
pub const MAX_UNDO_WINDOW_MS: u64 = 366 * DAY_MS;

/// The undo window of tools that declare none (`[limits] undo_window`): seven days.
pub const DEFAULT_UNDO_WINDOW_MS: u64 = 7 * DAY_MS;

const DAY_MS: u64 = 86_400_000;

/// How completely a tool's compensation restores what its effect changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Reversibility {
    /// Compensation restores the prior state exactly (every built-in file tool).
    Full,
    /// Compensation restores part of it (a refund that keeps a fee, say).
    Partial,
    /// The effect cannot be undone: every step of such a tool waits for an operator's
    /// approval.
    None,
}

impl Reversibility {
    /// The name used in `tools.toml`, listings and the log.
    pub fn as_str(self) -> &'static str {
        match self {
            Reversibility::Full => "full",
            Reversibility::Partial => "partial",
            Reversibility::None => "none",
        }
    }
}

impl fmt::Display for Reversibility {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How long after its saga ended a step may still be undone: digits and one unit of `s`,
/// `m`, `h` or `d` (`90s`, `15m`, `24h`, `7d`), at least one second and at most
/// [`MAX_UNDO_WINDOW_MS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
#[serde(try_from = "String")]
pub struct UndoWindow {
    ms: u64,
}

impl UndoWindow {
    /// A window of `ms` milliseconds; `None` when `ms` is zero or more than
    /// [`MAX_UNDO_WINDOW_MS`].
    pub fn from_ms(ms: u64) -> Option<UndoWindow> {
        (1..=MAX_UNDO_WINDOW_MS)
            .contains(&ms)
            .then_some(UndoWindow { ms })
    }

    /// The window in milliseconds.
    pub fn as_ms(self) -> u64 {
        self.ms
    }
}

impl Default for UndoWindow {
    fn default() -> Self {
        UndoWindow {
            ms: DEFAULT_UNDO_WINDOW_MS,
        }
    }
}

/// Reads a duration written as digits and one unit of `s`, `m`, `h` or `d` (`90s`, `15m`,
/// `24h`, `7d`) into milliseconds; zero is allowed, the caller bounds the range. `None`
/// when `text` is not such a duration ([`not_a_duration`] says so), or overflows.
pub fn parse_duration_ms(text: &str) -> Option<u64> {
    let unit_ms = match text.as_bytes().last() {
        Some(b's') => 1_000,
        Some(b'm') => 60_000,
        Some(b'h') => 3_600_000,
        Some(b'd') => DAY_MS,
        _ => return None,
    };
    let digits = &text[..text.len() - 1];
    if digits.is_empty() || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u64>().ok()?.checked_mul(unit_ms)
}

/// What is wrong with `text` that [`parse_duration_ms`] did not read.
pub fn not_a_duration(text: &str) -> String {
    format!("`{text}` is not a duration such as 90s, 15m, 24h or 7d")
}

impl FromStr for UndoWindow {
    type Err = String;

    fn from_str(text: &str) -> Result<UndoWindow, String> {
        let ms = parse_duration_ms(text).ok_or_else(|| not_a_duration(text))?;
        UndoWindow::from_ms(ms).ok_or_else(|| format!("`{text}` is out of range: 1s..=366d"))
    }
}

impl TryFrom<String> for UndoWindow {
    type Error = String;

    fn try_from(text: String) -> Result<UndoWindow, String> {
        text.parse()
    }
}

impl fmt::Display for UndoWindow {
    /// The window in its largest whole unit: `7d`, `36h`, `90s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (unit, unit_ms) in [('d', DAY_MS), ('h', 3_600_000), ('m', 60_000), ('s', 1_000)] {
            if self.ms.is_multiple_of(unit_ms) {
                return write!(f, "{}{unit}", self.ms / unit_ms);
            }
        }
        write!(f, "{}ms", self.ms)
    }
}

impl Serialize for UndoWindow {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_parse_and_print_in_the_contract_form() {
        for (text, ms) in [
            ("90s", 90_000),
            ("15m", 900_000),
            ("24h", 86_400_000),
            ("7d", 604_800_000),
            ("366d", MAX_UNDO_WINDOW_MS),
        ] {
            let window: UndoWindow = text.parse().expect("a window");
            assert_eq!(window.as_ms(), ms, "{text}");
        }
        assert_eq!(
            "24h".parse::<UndoWindow>().expect("a window").to_string(),
            "1d"
        );
        assert_eq!(
            "36h".parse::<UndoWindow>().expect("a window").to_string(),
            "36h"
        );
        assert_eq!(
            "90s".parse::<UndoWindow>().expect("a window").to_string(),
            "90s"
        );
        assert_eq!(UndoWindow::default().to_string(), "7d");
    }

    #[test]
    fn malformed_or_out_of_range_windows_are_refused() {
        for text in [
            "",
            "s",
            "7",
            "7w",
            "-1d",
            "+1d",
            "1.5h",
            " 7d",
            "7d ",
            "0s",
            "367d",
            "99999999999999999999d",
            "18446744073709551615d",
            "7D",
            "٣d",
        ] {
            let error = text.parse::<UndoWindow>().expect_err("refused");
            assert!(error.contains(&format!("`{text}`")), "{text}: {error}");
        }
        assert!(UndoWindow::from_ms(0).is_none());
        assert!(UndoWindow::from_ms(MAX_UNDO_WINDOW_MS + 1).is_none());
    }

    #[test]
    fn reversibility_names_round_trip() {
        for level in [
            Reversibility::Full,
            Reversibility::Partial,
            Reversibility::None,
        ] {
            let json = serde_json::to_string(&level).expect("serializes");
            assert_eq!(json, format!("\"{level}\""));
            assert_eq!(
                serde_json::from_str::<Reversibility>(&json).expect("parses"),
                level
            );
        }
    }
}
