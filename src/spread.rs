//! Waits spread across a fleet: a refusal that is not a principal's own budget (a shed
//! request, a full admission queue, a store that cannot answer) tells each caller a wait of its
//! own, so a fleet told to come back does not come back in one second.
//!
//! The wait `w` a refusal would say is spread over `[w, 2w]` by a phase derived from who the
//! caller is (SHA-256 of a domain tag and the caller's principal bytes): one caller is told the
//! same value every time (retrying sooner buys it nothing), and a fleet's values fall evenly
//! across the range. Nothing is shared, so every instance tells a caller the same wait. A caller
//! that chooses its principal (an agent id) can choose its phase, and so be told `w` rather than
//! more: never less than the wait itself.

use sha2::{Digest, Sha256};

/// `wait` (whole seconds, at least 1) spread over `[wait, 2 * wait]` by the phase of `who`.
pub(crate) fn spread_secs(wait: u64, who: &[u8]) -> u64 {
    let w = wait.max(1);
    let mut h = Sha256::new();
    h.update(b"fleet-limiter retry spread\0");
    h.update(who);
    let d = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&d[..8]);
    let extra = match w.checked_add(1) {
        Some(n) => u64::from_be_bytes(first) % n,
        None => 0,
    };
    w.saturating_add(extra)
}

/// Who a request from `peer` with `headers` is, as a spread reads it: its client address
/// (trusted proxies of `settings` applied, normalised as keys are) and its agent id when it
/// carries a valid one. Shared by every answer that spreads a wait: admission control's 503 and
/// a store that cannot answer (and shaping's shed 503, which reads the same two things of a
/// request itself).
pub(crate) fn who<'h>(
    peer: Option<std::net::SocketAddr>,
    headers: &'h actix_web::http::header::HeaderMap,
    settings: &crate::decision::Settings,
) -> (String, Option<&'h str>) {
    let ip = crate::client_share::request_address(
        peer,
        headers,
        &settings.trusted,
        settings.ipv6_prefix,
    );
    who_at(ip, settings.ipv6_prefix, headers)
}

/// [`who`] for a client address already read (`ip`, normalised to `ipv6_prefix`).
pub(crate) fn who_at(
    ip: std::net::IpAddr,
    ipv6_prefix: u8,
    headers: &actix_web::http::header::HeaderMap,
) -> (String, Option<&str>) {
    let address = crate::keys::normalize_ip(ip, ipv6_prefix);
    let agent = headers
        .get("x-agent-id")
        .and_then(|v| crate::keys::valid_agent_id(v.as_bytes()));
    (address, agent)
}

/// [`who`] as the bytes a spread is keyed on.
pub(crate) fn caller(
    peer: Option<std::net::SocketAddr>,
    headers: &actix_web::http::header::HeaderMap,
    settings: &crate::decision::Settings,
) -> Vec<u8> {
    let (address, agent) = who(peer, headers, settings);
    principal_bytes(&address, agent)
}

/// [`who_at`] as the bytes a spread is keyed on.
pub(crate) fn caller_at(
    ip: std::net::IpAddr,
    ipv6_prefix: u8,
    headers: &actix_web::http::header::HeaderMap,
) -> Vec<u8> {
    let (address, agent) = who_at(ip, ipv6_prefix, headers);
    principal_bytes(&address, agent)
}

/// A caller's principal bytes as a spread reads them: its normalised address, and its agent id
/// when it carries a valid one.
pub(crate) fn principal_bytes(address: &str, agent: Option<&str>) -> Vec<u8> {
    let mut v = Vec::with_capacity(address.len() + 1 + agent.map_or(0, str::len));
    v.extend_from_slice(address.as_bytes());
    if let Some(a) = agent {
        v.push(0);
        v.extend_from_slice(a.as_bytes());
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_caller_is_told_one_wait_and_a_fleet_is_spread_over_w_to_2w() {
        let w = 5;
        let mut seen = [0u32; 11];
        for i in 0..3000 {
            let who = principal_bytes("198.51.100.7", Some(&format!("agent-{i}")));
            let s = spread_secs(w, &who);
            assert!((w..=2 * w).contains(&s), "{s}");
            assert_eq!(s, spread_secs(w, &who), "stable for one caller");
            seen[s as usize] += 1;
        }
        // Six values, each about a sixth of the fleet.
        for (v, &n) in seen.iter().enumerate().skip(5) {
            assert!((350..=650).contains(&n), "{v}: {n} of 3000: {seen:?}");
        }
        // Never less than one second, never an overflow.
        assert!(spread_secs(0, b"x") >= 1);
        assert!(spread_secs(u64::MAX, b"x") >= u64::MAX / 2);
        // Another address, another phase.
        let a = (0..50)
            .filter(|i| {
                spread_secs(60, &principal_bytes(&format!("203.0.113.{i}"), None))
                    != spread_secs(60, &principal_bytes("203.0.113.250", None))
            })
            .count();
        assert!(a > 40, "{a}");
    }
}
