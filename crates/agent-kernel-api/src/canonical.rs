//! Canonical JSON: one spelling for one value, so that hashes over JSON (idempotency
//! bindings, approval digests, audit records) are reproducible by anyone.

use serde_json::Value;

/// `value` as canonical JSON: object keys sorted (by their UTF-8 bytes), no whitespace.
///
/// Written out rather than left to `serde_json`, whose maps keep insertion order when any
/// crate in the build turns on its `preserve_order` feature.
pub fn canonical_json(value: &Value) -> String {
    let mut text = String::new();
    write_canonical(value, &mut text);
    text
}

fn write_canonical(value: &Value, text: &mut String) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|(a, _), (b, _)| a.as_bytes().cmp(b.as_bytes()));
            text.push('{');
            for (entry_idx, (key, value)) in entries.into_iter().enumerate() {
                if entry_idx > 0 {
                    text.push(',');
                }
                write_json_string(text, key);
                text.push(':');
                write_canonical(value, text);
            }
            text.push('}');
        }
        Value::Array(items) => {
            text.push('[');
            for (item_idx, item) in items.iter().enumerate() {
                if item_idx > 0 {
                    text.push(',');
                }
                write_canonical(item, text);
            }
            text.push(']');
        }
        scalar => text.push_str(&scalar.to_string()),
    }
}

/// Appends `value` as a JSON string, escaped exactly as `serde_json` escapes it.
pub fn write_json_string(text: &mut String, value: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    text.push('"');
    let mut start = 0;
    for (idx, byte) in value.bytes().enumerate() {
        let escape = match byte {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            0x00..=0x1f => "",
            _ => continue,
        };
        text.push_str(&value[start..idx]);
        if escape.is_empty() {
            text.push_str("\\u00");
            text.push(char::from(HEX[usize::from(byte >> 4)]));
            text.push(char::from(HEX[usize::from(byte & 0xf)]));
        } else {
            text.push_str(escape);
        }
        start = idx + 1;
    }
    text.push_str(&value[start..]);
    text.push('"');
}
