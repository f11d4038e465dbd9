//! Bytes per tracked key in governor's keyed store (the one actix-governor uses), keyed as the
//! middleware app keys it — `(IpAddr, String)` — and on a 16-byte digest like fleet-limiter's.
//!
//! ```sh
//! cargo run --release --bin governor_memory -- 1000000
//! ```

use governor::{Quota, RateLimiter};
use std::hash::Hash;
use std::net::IpAddr;
use std::num::NonZeroU32;

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn measure<K: Hash + Eq + Clone>(what: &str, n: usize, key: impl Fn(usize) -> K) {
    let quota = Quota::per_minute(NonZeroU32::new(30).unwrap_or(NonZeroU32::MIN));
    let limiter = RateLimiter::keyed(quota);
    let before = rss_bytes();
    for i in 0..n {
        let _ = limiter.check_key(&key(i));
    }
    let after = rss_bytes();
    let tracked = limiter.len();
    let delta = after.saturating_sub(before);
    println!(
        "governor keyed store ({what}): {tracked} keys, RSS +{:.1} MiB, {:.1} bytes per key",
        delta as f64 / 1048576.0,
        delta as f64 / tracked.max(1) as f64
    );
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let which = std::env::args()
        .nth(2)
        .unwrap_or_else(|| "ip+agent".to_owned());
    if which == "digest" {
        measure("[u8; 16] digest", n, |i| {
            let mut d = [0u8; 16];
            d[..8].copy_from_slice(&(i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes());
            d
        });
    } else {
        measure("(IpAddr, String) ip+agent", n, |i| {
            let ip = IpAddr::from([10, (i >> 16) as u8, (i >> 8) as u8, i as u8]);
            (ip, format!("agent-{i}"))
        });
    }
}
