//! JSON-lines access logs (src/calibration/replay/json.rs).
//!
//! Input, as text: when the first line starts with `json`, it is the mapping
//! (`json:key=field,...`) and the rest the line; otherwise the whole input is a line read with
//! the usual names.
//!
//! Held: reading is deterministic; and a line read, printed back as a JSON object under the
//! mapping's field names (each key under the first name the mapping tries; the time as a UTC
//! ISO 8601 string, absent fields as `"-"`), reads to the same fields, whenever the mapping
//! names no field twice.
#![no_main]

use fleet_limiter::fuzzing::json;
use fuzz_support::{first_line, iso8601};
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value};

/// The mapping's keys and the first field name each tries by default.
const FIRST: [(&str, &str); 8] = [
    ("addr", "remote_addr"),
    ("time", "time_iso8601"),
    ("request", "request"),
    ("method", "request_method"),
    ("uri", "request_uri"),
    ("forwarded", "http_x_forwarded_for"),
    ("agent_id", "http_x_agent_id"),
    ("user", "remote_user"),
];

/// The field each key is read from first, under `spec` (which the parser has accepted).
fn names(spec: &str) -> Vec<String> {
    let mut names: Vec<String> = FIRST.iter().map(|(_, n)| (*n).to_owned()).collect();
    if let Some(rest) = spec.strip_prefix("json:") {
        for pair in rest.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if let Some((k, field)) = pair.split_once('=') {
                if let Some(i) = FIRST.iter().position(|(key, _)| *key == k.trim()) {
                    names[i] = field.trim().to_owned();
                }
            }
        }
    }
    names
}

fuzz_target!(|data: &[u8]| {
    let (spec, line) = match first_line(data) {
        (head, rest) if head.starts_with(b"json") => match std::str::from_utf8(head) {
            Ok(s) => (s, rest),
            Err(_) => return,
        },
        _ => ("json", data),
    };
    let Ok(read) = json(spec, line) else { return };
    assert_eq!(Ok(read.clone()), json(spec, line), "not deterministic");
    let Ok(f) = read else { return };
    let text = |b: &[u8]| String::from_utf8(b.to_vec()).expect("a JSON string's bytes are UTF-8");
    let dash = |b: &Option<Vec<u8>>| b.as_deref().map_or("-".to_owned(), text);
    let names = names(spec);
    let mut unique = names.clone();
    unique.sort();
    unique.dedup();
    if unique.len() != names.len() {
        return; // two keys read from one field: nothing to print back
    }
    let values = [
        text(&f.addr),
        iso8601(f.time),
        "-".to_owned(),
        text(&f.method),
        text(&f.target),
        dash(&f.forwarded),
        dash(&f.agent_id),
        dash(&f.user),
    ];
    let obj: Map<String, Value> = names
        .into_iter()
        .zip(values)
        .map(|(n, v)| (n, Value::String(v)))
        .collect();
    let printed = serde_json::to_vec(&obj).expect("a map of strings serialises");
    assert_eq!(
        json(spec, &printed),
        Ok(Ok(f)),
        "printed back as {}",
        String::from_utf8_lossy(&printed)
    );
});
