//! `body:<field>` keys (src/keys/body.rs): a JSON or form body's field, and the recipient's
//! normalisation.
//!
//! Input: the first byte chooses the format (even: JSON, odd: a form); the rest is the body.
//!
//! Held: reading is deterministic; a key read is its own normalisation (normalising twice
//! changes nothing), at most 256 bytes, without a control character, and with no list
//! separator when it is an address; and for JSON, a key read is exactly what a JSON parser that
//! keeps the last of duplicate names (serde_json's map) finds under `email`, normalised: the
//! limiter never keys on anything but what the upstream reads.
#![no_main]

use fleet_limiter::fuzzing::{body_email, body_normalize};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&first, body)) = data.split_first() else {
        return;
    };
    let json = first % 2 == 0;
    let read = body_email(json, body);
    assert_eq!(read, body_email(json, body), "not deterministic");
    let Ok(Some(key)) = read else { return };
    assert_eq!(body_normalize(&key).as_deref(), Some(key.as_str()), "not idempotent");
    assert!(key.len() <= 256, "{key:?}");
    assert!(!key.chars().any(char::is_control), "{key:?}");
    if key.contains('@') {
        assert!(!key.contains([',', ';', '<', '>', ' ']), "a list as one key: {key:?}");
        assert_eq!(key.matches('@').count(), 1, "{key:?}");
    }
    if json {
        let text = body.strip_prefix(b"\xef\xbb\xbf").unwrap_or(body);
        let value: serde_json::Value =
            serde_json::from_slice(text).expect("a body the limiter read parses");
        let email = match &value["email"] {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Number(n) => n.to_string(),
            other => panic!("read a key from {other:?}"),
        };
        assert_eq!(body_normalize(&email), Some(key), "the upstream reads another value");
    }
});
