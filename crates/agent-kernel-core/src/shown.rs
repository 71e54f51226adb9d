//! Arguments as a person sees them before deciding: the whole canonical JSON, never cut,
//! with every character that a terminal or a browser would not show as itself (invisible,
//! direction-changing, a control) escaped and named, so that what is shown cannot differ
//! from what runs.

use std::collections::BTreeMap;

use agent_kernel_api::canonical_json;
use serde::Serialize;
use serde_json::Value;
use unicode_general_category::{GeneralCategory, get_general_category};

/// A JSON value as shown to a person: `text` is its canonical JSON (keys sorted, no
/// spaces), in full, with each hidden character written as a JSON escape (`\u202e`), so it
/// still parses to the same value; `hidden` names each kind of hidden character it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Shown {
    /// The canonical JSON, hidden characters escaped.
    pub text: String,
    /// The hidden characters found, by code point, in code-point order.
    pub hidden: Vec<HiddenChar>,
}

/// One kind of hidden character in a [`Shown`] value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HiddenChar {
    /// `U+202E`.
    pub code_point: String,
    /// What it is: `RIGHT-TO-LEFT OVERRIDE`, or its kind (`a format character`).
    pub name: &'static str,
    /// How the text shows it: `\u202e`.
    pub escaped: String,
    /// How many times it occurs.
    pub count: usize,
}

impl HiddenChar {
    /// `contains U+202E RIGHT-TO-LEFT OVERRIDE (shown as \u202e)`, or with `2 times`.
    pub fn warning(&self) -> String {
        let times = if self.count == 1 {
            String::new()
        } else {
            format!(" {} times", self.count)
        };
        format!(
            "contains {} {}{times} (shown as {})",
            self.code_point, self.name, self.escaped
        )
    }
}

impl Shown {
    /// One [`HiddenChar::warning`] per kind of hidden character.
    pub fn warnings(&self) -> Vec<String> {
        self.hidden.iter().map(HiddenChar::warning).collect()
    }
}

/// `value` as a person should see it (see [`Shown`]).
pub fn shown_json(value: &Value) -> Shown {
    let canonical = canonical_json(value);
    let mut text = String::with_capacity(canonical.len());
    let mut found: BTreeMap<char, usize> = BTreeMap::new();
    for c in canonical.chars() {
        if is_hidden(c) {
            text.push_str(&json_escape(c));
            *found.entry(c).or_default() += 1;
        } else {
            text.push(c);
        }
    }
    Shown {
        text,
        hidden: found
            .into_iter()
            .map(|(c, count)| HiddenChar {
                code_point: format!("U+{:04X}", u32::from(c)),
                name: hidden_name(c),
                escaped: json_escape(c),
                count,
            })
            .collect(),
    }
}

/// Whether `c` would not show as itself: a control, a format character (direction
/// controls, zero-width characters, tags), a line or paragraph separator, a space other
/// than U+0020, a private-use or unassigned code point, or a default-ignorable character
/// of another category (variation selectors, fillers).
pub fn is_hidden(c: char) -> bool {
    if c == ' ' {
        return false;
    }
    matches!(
        get_general_category(c),
        GeneralCategory::Control
            | GeneralCategory::Format
            | GeneralCategory::LineSeparator
            | GeneralCategory::ParagraphSeparator
            | GeneralCategory::SpaceSeparator
            | GeneralCategory::PrivateUse
            | GeneralCategory::Surrogate
            | GeneralCategory::Unassigned
    ) || matches!(
        u32::from(c),
        0x034F | 0x115F | 0x1160 | 0x17B4 | 0x17B5 | 0x180B..=0x180F | 0x2800 | 0x3164
            | 0xFE00..=0xFE0F | 0xFFA0 | 0xE0100..=0xE01EF
    )
}

/// `c` as a JSON escape: `\u202e`, or a surrogate pair above U+FFFF.
fn json_escape(c: char) -> String {
    let mut units = [0_u16; 2];
    c.encode_utf16(&mut units)
        .iter()
        .map(|unit| format!("\\u{unit:04x}"))
        .collect()
}

/// The name of a hidden character a person is most likely to meet, else its kind.
fn hidden_name(c: char) -> &'static str {
    match u32::from(c) {
        0x00A0 => "NO-BREAK SPACE",
        0x00AD => "SOFT HYPHEN",
        0x034F => "COMBINING GRAPHEME JOINER",
        0x061C => "ARABIC LETTER MARK",
        0x180E => "MONGOLIAN VOWEL SEPARATOR",
        0x200B => "ZERO WIDTH SPACE",
        0x200C => "ZERO WIDTH NON-JOINER",
        0x200D => "ZERO WIDTH JOINER",
        0x200E => "LEFT-TO-RIGHT MARK",
        0x200F => "RIGHT-TO-LEFT MARK",
        0x2028 => "LINE SEPARATOR",
        0x2029 => "PARAGRAPH SEPARATOR",
        0x202A => "LEFT-TO-RIGHT EMBEDDING",
        0x202B => "RIGHT-TO-LEFT EMBEDDING",
        0x202C => "POP DIRECTIONAL FORMATTING",
        0x202D => "LEFT-TO-RIGHT OVERRIDE",
        0x202E => "RIGHT-TO-LEFT OVERRIDE",
        0x2060 => "WORD JOINER",
        0x2066 => "LEFT-TO-RIGHT ISOLATE",
        0x2067 => "RIGHT-TO-LEFT ISOLATE",
        0x2068 => "FIRST STRONG ISOLATE",
        0x2069 => "POP DIRECTIONAL ISOLATE",
        0x115F | 0x1160 | 0x3164 | 0xFFA0 => "HANGUL FILLER",
        0x2800 => "BRAILLE PATTERN BLANK",
        0xFEFF => "ZERO WIDTH NO-BREAK SPACE",
        0xFE00..=0xFE0F | 0xE0100..=0xE01EF | 0x180B..=0x180D | 0x180F => "VARIATION SELECTOR",
        0xE0000..=0xE007F => "TAG CHARACTER",
        _ => match get_general_category(c) {
            GeneralCategory::Control => "a control character",
            GeneralCategory::Format => "a format character",
            GeneralCategory::SpaceSeparator => "a space other than U+0020",
            GeneralCategory::PrivateUse => "a private-use character",
            GeneralCategory::Unassigned => "an unassigned code point",
            _ => "an invisible character",
        },
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_long_path_is_shown_whole() {
        let path = format!(
            "workspace/tmp-cache-safe-to-delete-{}/../important.db",
            "a".repeat(200)
        );
        let shown = shown_json(&json!({ "path": path }));
        assert!(
            shown.text.ends_with("/../important.db\"}"),
            "{}",
            shown.text
        );
        assert!(shown.hidden.is_empty());
    }

    #[test]
    fn direction_and_zero_width_characters_are_escaped_and_named() {
        let shown = shown_json(&json!({ "path": "ws/\u{202e}txt.exe\u{200b}\u{200b}" }));
        assert_eq!(shown.text, r#"{"path":"ws/\u202etxt.exe\u200b\u200b"}"#);
        assert_eq!(
            shown.warnings(),
            [
                r"contains U+200B ZERO WIDTH SPACE 2 times (shown as \u200b)",
                r"contains U+202E RIGHT-TO-LEFT OVERRIDE (shown as \u202e)",
            ]
        );
        // Still the same value.
        let parsed: Value = serde_json::from_str(&shown.text).expect("parses");
        assert_eq!(parsed["path"], "ws/\u{202e}txt.exe\u{200b}\u{200b}");
    }

    #[test]
    fn characters_beyond_the_basic_plane_are_escaped_as_surrogate_pairs() {
        let shown = shown_json(&json!({ "k\u{e0041}": "\u{7f}" }));
        assert_eq!(shown.text, r#"{"k\udb40\udc41":"\u007f"}"#);
        let parsed: Value = serde_json::from_str(&shown.text).expect("parses");
        assert_eq!(parsed, json!({ "k\u{e0041}": "\u{7f}" }));
        assert_eq!(shown.hidden.len(), 2);
    }

    #[test]
    fn visible_text_in_any_script_is_left_as_it_is() {
        for text in ["ws/naïve.txt", "ws/日本.txt", "ws/שלום.txt", "a b"] {
            let shown = shown_json(&json!(text));
            assert!(shown.hidden.is_empty(), "{text}: {:?}", shown.hidden);
            assert_eq!(shown.text, serde_json::to_string(text).expect("encodes"));
        }
    }

    proptest::proptest! {
        #[test]
        fn what_is_shown_parses_to_what_runs(text in "\\PC*|[\u{0}-\u{3000}\u{fe00}-\u{feff}\u{e0000}-\u{e0080}]{0,40}") {
            let value = json!({ "path": text });
            let shown = shown_json(&value);
            let parsed: Value = serde_json::from_str(&shown.text).expect("parses");
            proptest::prop_assert_eq!(parsed, value);
            proptest::prop_assert!(!shown.text.chars().any(is_hidden));
        }
    }
}
