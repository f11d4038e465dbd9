//! Simulated traffic as an access log: `simulate --emit-log FILE` writes every request a
//! scenario sends as one JSON line (`replay --log-format json` reads it), stamped from
//! 2026-01-01T00:00:00Z plus its virtual time, so a scenario and its replay can be compared.

use super::time::UnixNanos;
use crate::calendar::civil_from_days;
use crate::calibration::simulate::Req;
use crate::clock::Nanos;

/// 2026-01-01T00:00:00Z, where an emitted log's time starts.
pub(crate) const START: UnixNanos = 1_767_225_600 * 1_000_000_000;

/// `t` as RFC 3339 with nanoseconds: `2026-01-01T00:00:01.500000000Z`.
pub(crate) fn rfc3339(t: UnixNanos) -> String {
    let secs = t.div_euclid(1_000_000_000);
    let ns = t.rem_euclid(1_000_000_000);
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    let s = secs.rem_euclid(86_400);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{ns:09}Z",
        s / 3_600,
        s / 60 % 60,
        s % 60
    )
}

/// One simulated request as a JSON access-log line (no trailing newline).
pub(crate) fn line(at: Nanos, req: &Req<'_>) -> String {
    let mut v = serde_json::json!({
        "remote_addr": req.peer.to_string(),
        "time_iso8601": rfc3339(START + at as UnixNanos),
        "request": format!("{} {} HTTP/1.1", req.route.0, req.route.1),
    });
    if let Some(a) = req.agent_id {
        v["http_x_agent_id"] = serde_json::Value::String(a.to_owned());
    }
    v.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_reads_back_as_written() {
        for t in [
            START,
            START + 1_500_000_000,
            START + 86_400 * 1_000_000_000 * 400 + 7,
        ] {
            assert_eq!(super::super::time::iso8601(rfc3339(t).as_bytes()), Some(t));
        }
        assert_eq!(rfc3339(START), "2026-01-01T00:00:00.000000000Z");
    }
}
