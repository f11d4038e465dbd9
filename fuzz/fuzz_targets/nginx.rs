//! nginx `log_format` strings and access-log lines (src/calibration/replay/nginx.rs).
//!
//! Input, as text: the first line is a `log_format` string (a line starting with `=` stands
//! for `combined`), the rest one access-log line.
//!
//! Held: a compiled format alternates literals and variables (never two variables in a row);
//! reading a line is deterministic and its fields are slices of the line; and a line read,
//! printed back in the same format from the fields read (timestamps in UTC, the request as
//! `METHOD TARGET HTTP/1.1`, absent fields as `-`, variables a replay ignores as they were),
//! reads to the same fields, whenever each printed value leaves the literal after it to be
//! found where it stands.
#![no_main]

use fleet_limiter::calibration::LogFormat;
use fleet_limiter::fuzzing::{nginx, nginx_pieces, nginx_values, Line};
use fuzz_support::{clf, first_line, iso8601, msec};
use libfuzzer_sys::fuzz_target;

/// The parser's `find`: the first place `needle` occurs in `hay`, skipping `\"` escapes when it
/// starts with a quote.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    let first = *needle.first()?;
    (0..hay.len()).find(|&at| {
        hay[at] == first
            && !(first == b'"' && at > 0 && hay[at - 1] == b'\\')
            && hay[at..].starts_with(needle)
    })
}

/// The value printed for a variable, from the fields read (or as it was, when ignored).
fn render(name: &str, raw: &[u8], l: &Line) -> Vec<u8> {
    let or_dash = |v: &Option<Vec<u8>>| v.clone().unwrap_or_else(|| b"-".to_vec());
    match name {
        "remote_addr" => l.addr.clone(),
        "remote_user" => or_dash(&l.user),
        "time_local" => clf(l.time).into_bytes(),
        "time_iso8601" => iso8601(l.time).into_bytes(),
        "msec" => msec(l.time).into_bytes(),
        "request" => [&l.method[..], b" ", &l.target, b" HTTP/1.1"].concat(),
        "request_method" => l.method.clone(),
        "request_uri" => l.target.clone(),
        "http_x_forwarded_for" => or_dash(&l.forwarded),
        "http_x_agent_id" => or_dash(&l.agent_id),
        _ => raw.to_vec(),
    }
}

fuzz_target!(|data: &[u8]| {
    let (spec, line) = first_line(data);
    let Ok(spec) = std::str::from_utf8(spec) else {
        return;
    };
    let format = if spec.starts_with('=') {
        LogFormat::combined()
    } else {
        match LogFormat::compile(spec) {
            Ok(f) => f,
            Err(_) => return,
        }
    };
    let pieces = nginx_pieces(&format);
    for pair in pieces.windows(2) {
        assert!(
            !(pair[0].is_err() && pair[1].is_err()),
            "two variables in a row in {spec:?}"
        );
    }
    assert!(
        pieces
            .iter()
            .all(|p| p.is_err() || p.is_ok_and(|l| !l.is_empty())),
        "an empty literal"
    );

    let read = nginx(&format, line);
    assert_eq!(read, nginx(&format, line), "not deterministic");
    let Ok(fields) = read else { return };
    let values = nginx_values(&format, line).expect("a line read has each variable's value");

    // Print it back.
    let mut printed = Vec::with_capacity(line.len() + 64);
    let mut values = values.into_iter();
    for (i, piece) in pieces.iter().enumerate() {
        match piece {
            Ok(lit) => printed.extend_from_slice(lit),
            Err(name) => {
                let (n, raw) = values.next().expect("one value per variable");
                assert_eq!(n, *name);
                let v = render(name, raw, &fields);
                if let Some(Ok(next)) = pieces.get(i + 1) {
                    let hay = [&v[..], next].concat();
                    if find(&hay, next) != Some(v.len()) {
                        return; // this value would hide the literal after it
                    }
                }
                printed.extend_from_slice(&v);
            }
        }
    }
    assert_eq!(
        nginx(&format, &printed),
        Ok(fields),
        "printed back as {:?}",
        String::from_utf8_lossy(&printed)
    );
});
