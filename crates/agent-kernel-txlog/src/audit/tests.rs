//! The chain's hashing, MACs, canonical bodies and key handling.

use super::*;

#[test]
fn canonical_json_sorts_keys_at_every_depth() {
    let value = json!({"b": [{"z": 1, "a": null}], "a": "x\ny", "é": 1.5, "A": true});
    assert_eq!(
        canonical_json(&value),
        r#"{"A":true,"a":"x\ny","b":[{"a":null,"z":1}],"é":1.5}"#
    );
}

#[test]
fn the_object_writer_matches_canonical_json() {
    let tricky = "q\"b\\s\n\r\t\u{8}\u{c}\u{0}\u{1f}\u{7f}é日本";
    let written = CanonicalObject::new()
        .str("a", tricky)
        .opt_str("b", None)
        .int("c", -5_i64)
        .int("d", u64::MAX)
        .object("e", CanonicalObject::new().str("x", "y"))
        .opt_object("f", None)
        .finish();
    let value = json!({
        "f": null, "e": {"x": "y"}, "d": u64::MAX, "c": -5, "b": null, "a": tricky,
    });
    assert_eq!(written, canonical_json(&value));
    assert_eq!(written, serde_json::to_string(&value).expect("serializes"));
    assert_eq!(CanonicalObject::new().finish(), "{}");
}

#[test]
#[should_panic(expected = "canonical keys are added in order")]
fn the_object_writer_refuses_keys_out_of_order() {
    let _ = CanonicalObject::new().str("b", "").str("a", "");
}

#[test]
fn decimals_are_written_in_full() {
    let mut buffer = [0_u8; 24];
    assert_eq!(decimal(i64::MIN, &mut buffer), b"-9223372036854775808");
    assert_eq!(decimal(0, &mut buffer), b"0");
}

#[test]
fn hex_round_trips_and_refuses_junk() {
    assert_eq!(hex(&[0, 0xab, 0xff]), "00abff");
    assert_eq!(unhex("00ABff"), Some(vec![0, 0xab, 0xff]));
    assert_eq!(unhex("0"), None);
    assert_eq!(unhex("zz"), None);
    assert_eq!(unhex("é0"), None);
}

#[test]
fn keys_are_checked_and_never_shown() {
    assert!(AuditKey::from_hex("00ff").is_err(), "too short");
    assert!(AuditKey::from_hex("not hex at all!!").is_err());
    let key = AuditKey::from_hex(&"ab".repeat(32)).expect("32 bytes");
    assert!(!format!("{key:?}").contains("ab"));
    let mac = key.mac(ZERO_HASH);
    assert!(is_hex_digest(&mac));
    assert!(key.verifies(ZERO_HASH, &mac));
    assert!(!key.verifies(&"1".repeat(64), &mac));
    assert!(!key.verifies(ZERO_HASH, "xyz"));
}

#[test]
fn quote_cuts_at_a_character_boundary() {
    assert_eq!(quote("abc", 5), "abc");
    assert_eq!(quote("ééé", 3), "é…");
}

#[test]
fn the_hash_covers_every_field() {
    let base = record_hash(ZERO_HASH, 1, 2, "SetState", Some("s"), "{}");
    assert_ne!(
        base,
        record_hash(ZERO_HASH, 2, 2, "SetState", Some("s"), "{}")
    );
    assert_ne!(
        base,
        record_hash(ZERO_HASH, 1, 3, "SetState", Some("s"), "{}")
    );
    assert_ne!(
        base,
        record_hash(ZERO_HASH, 1, 2, "FailStep", Some("s"), "{}")
    );
    assert_ne!(base, record_hash(ZERO_HASH, 1, 2, "SetState", None, "{}"));
    assert_ne!(
        base,
        record_hash(ZERO_HASH, 1, 2, "SetState", Some("s"), "{ }")
    );
    assert_ne!(
        base,
        record_hash(&"1".repeat(64), 1, 2, "SetState", Some("s"), "{}")
    );
}
