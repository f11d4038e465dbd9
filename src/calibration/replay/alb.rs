//! AWS Application Load Balancer access logs: space-separated fields, quoted where they may hold
//! spaces. A replay reads the timestamp (field 2), the client `address:port` (field 4) and the
//! request (field 13, `"METHOD scheme://host:port/path?query PROTOCOL"`). ALB logs carry no
//! request headers: no `X-Agent-ID` and no `X-Forwarded-For` (the load balancer is the edge).

use super::line::{Fields, Malformed};
use super::time;

/// The fields of one line, quoted ones without their quotes; at most `max` of them.
fn split(line: &[u8], max: usize) -> Result<Vec<&[u8]>, Malformed> {
    let mut out = Vec::with_capacity(max);
    let mut rest = line;
    while out.len() < max {
        rest = trim_start(rest);
        if rest.is_empty() {
            break;
        }
        if rest[0] == b'"' {
            // ALB escapes a quote inside a quoted field as `\"`.
            let mut i = 1;
            loop {
                match rest.get(i) {
                    None => return Err(Malformed::Layout),
                    Some(b'\\') => i += 2,
                    Some(b'"') => break,
                    Some(_) => i += 1,
                }
            }
            out.push(&rest[1..i]);
            rest = &rest[i + 1..];
        } else {
            let end = rest.iter().position(|&c| c == b' ').unwrap_or(rest.len());
            out.push(&rest[..end]);
            rest = &rest[end..];
        }
    }
    Ok(out)
}

fn trim_start(b: &[u8]) -> &[u8] {
    let n = b.iter().take_while(|&&c| c == b' ').count();
    &b[n..]
}

/// `addr:port`, `[v6]:port` or `v6:port`: the address.
fn address(client: &[u8]) -> &[u8] {
    if let Some(rest) = client.strip_prefix(b"[") {
        return rest.split(|&c| c == b']').next().unwrap_or(rest);
    }
    match client.iter().rposition(|&c| c == b':') {
        Some(i) => &client[..i],
        None => client,
    }
}

/// The path and query of an absolute URL (`http://host:80/p?q` -> `/p?q`); a path as it is.
fn origin_form(target: &[u8]) -> &[u8] {
    let Some(i) = target.windows(3).position(|w| w == b"://") else {
        return target;
    };
    let after = &target[i + 3..];
    match after.iter().position(|&c| c == b'/' || c == b'?') {
        Some(j) if after[j] == b'/' => &after[j..],
        _ => b"/",
    }
}

/// Read one ALB line.
pub(crate) fn parse(line: &[u8]) -> Result<Fields<'_>, Malformed> {
    let f = split(line, 13)?;
    if f.len() < 13 {
        return Err(Malformed::Layout);
    }
    let mut out = Fields {
        addr: address(f[3]),
        time: Some(time::iso8601(f[1]).ok_or(Malformed::Time)?),
        ..Fields::default()
    };
    let request = f[12];
    let mut words = request.split(|&c| c == b' ').filter(|w| !w.is_empty());
    let (Some(method), Some(target)) = (words.next(), words.next()) else {
        return Err(Malformed::Request);
    };
    out.method = method;
    out.target = origin_form(target);
    out.check()?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &[u8] = br#"https 2026-11-24T10:00:01.186641Z app/fleet-api/50dc6c495c0c9188 203.0.113.7:2817 10.0.0.1:80 0.000 0.001 0.000 200 200 34 366 "POST https://api.example.com:443/api/agent/heartbeat?x=1 HTTP/1.1" "fleet-agent/2.1" ECDHE-RSA-AES128-GCM-SHA256 TLSv1.2 arn:aws:elasticloadbalancing:us-east-2:123456789012:targetgroup/t/73e2d6bc24d8a067 "Root=1-58337262-36d228ad5d99923122bbe354" "api.example.com" "-" 0 2026-11-24T10:00:01.180000Z "forward" "-" "-" "10.0.0.1:80" "200" "-" "-""#;

    #[test]
    fn reads_time_client_and_request() {
        let f = parse(LINE).unwrap();
        assert_eq!(f.addr, b"203.0.113.7");
        assert_eq!(f.method, b"POST");
        assert_eq!(f.target, b"/api/agent/heartbeat?x=1");
        assert_eq!(f.agent_id, None);
        assert!(f.time.is_some());
    }

    #[test]
    fn ipv6_clients_and_odd_targets() {
        assert_eq!(address(b"2001:db8::1:443"), b"2001:db8::1");
        assert_eq!(address(b"[2001:db8::1]:443"), b"2001:db8::1");
        assert_eq!(origin_form(b"http://h:80"), b"/");
        assert_eq!(origin_form(b"http://h:80?q"), b"/");
        assert_eq!(origin_form(b"/plain"), b"/plain");
    }

    #[test]
    fn hostile_lines_are_malformed_not_panics() {
        for bad in [
            &b""[..],
            b"https 2026-11-24T10:00:01Z",
            b"https not-a-time app/x 1.2.3.4:1 - 0 0 0 200 200 0 0 \"GET / HTTP/1.1\"",
            b"https 2026-11-24T10:00:01Z app/x 1.2.3.4:1 - 0 0 0 200 200 0 0 \"GET / HTTP/1.1",
            b"https 2026-11-24T10:00:01Z app/x 1.2.3.4:1 - 0 0 0 200 200 0 0 \"\"",
            b"https 2026-11-24T10:00:01Z app/x 1.2.3.4:1 - 0 0 0 200 200 0 0 \"GET\"",
            b"https 2026-11-24T10:00:01Z app/x 1.2.3.4:1 - 0 0 0 200 200 0 0 \"\\",
        ] {
            assert!(parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }
}
