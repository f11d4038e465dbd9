//! AWS ALB access-log lines (src/calibration/replay/alb.rs).
//!
//! Held: reading a line is deterministic and its fields are slices of the line; and a line
//! read, printed back as an ALB line from the fields read (the time in UTC ISO 8601, the client
//! as `"addr:1"`, the request as `"METHOD https://h:443TARGET HTTP/1.1"`), reads to the same
//! fields whenever the address can be quoted (no `"` or `\`, not starting with `[`).
#![no_main]

use fleet_limiter::fuzzing::alb;
use fuzz_support::iso8601;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|line: &[u8]| {
    let read = alb(line);
    assert_eq!(read, alb(line), "not deterministic");
    let Ok(f) = read else { return };
    assert!(!f.method.is_empty() && f.method.iter().all(u8::is_ascii_uppercase));
    assert!(f.target.starts_with(b"/"));
    assert!(!f.target.contains(&b' '), "a target with a space");
    assert_eq!(f.agent_id, None, "ALB logs carry no X-Agent-ID");
    assert_eq!(f.forwarded, None, "ALB logs carry no X-Forwarded-For");
    if f.addr.iter().any(|&c| c == b'"' || c == b'\\') || f.addr.starts_with(b"[") {
        return;
    }
    let mut printed = format!("https {} app/fleet/1 \"", iso8601(f.time)).into_bytes();
    printed.extend_from_slice(&f.addr);
    printed.extend_from_slice(b":1\" 10.0.0.1:80 0.000 0.001 0.000 200 200 34 366 \"");
    printed.extend_from_slice(&f.method);
    printed.extend_from_slice(b" https://api.example.com:443");
    printed.extend_from_slice(&f.target);
    printed.extend_from_slice(b" HTTP/1.1\" \"curl/8\" - - arn:x \"Root=1\" \"-\" \"-\" 0");
    assert_eq!(
        alb(&printed),
        Ok(f),
        "printed back as {:?}",
        String::from_utf8_lossy(&printed)
    );
});
