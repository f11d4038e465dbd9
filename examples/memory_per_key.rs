//! Bytes per tracked key in the memory store: resident memory before and after one decision
//! for each of N distinct principals (default 1 000 000), divided by the keys tracked.
//!
//! ```sh
//! cargo run --release --example memory_per_key -- 1000000
//! ```

use fleet_limiter::nonzero;
use fleet_limiter::BucketKey;
use fleet_limiter::MemoryStore;
use fleet_limiter::Quota;
use fleet_limiter::SystemClock;
use fleet_limiter::{Check, Store};
use std::sync::Arc;
use std::time::Duration;

/// Resident set size of this process in bytes (Linux `/proc/self/statm`).
fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let limiter: Arc<str> = Arc::from("agent-device");
    let quota = Quota::gcra(nonzero(30), Duration::from_secs(60));
    let store = MemoryStore::new(n, Arc::new(SystemClock::new()));
    let before = rss_bytes();
    let mut check = [Check {
        key: BucketKey::new(limiter.clone(), "seed"),
        quota,
        shadow: false,
        units: std::num::NonZeroU32::MIN,
    }];
    for i in 0..n {
        let principal = format!(
            "10.{}.{}.{}:agent-{i}",
            (i >> 16) & 255,
            (i >> 8) & 255,
            i & 255
        );
        check[0].key = BucketKey::new(limiter.clone(), &principal);
        store.decide_now(&check);
    }
    let after = rss_bytes();
    let tracked = store.tracked_keys();
    let per_key = (after.saturating_sub(before)) as f64 / tracked.max(1) as f64;
    println!(
        "memory store: {tracked} keys tracked (cap {}), evicted {}, RSS +{:.1} MiB, {per_key:.1} bytes per key",
        store.capacity(),
        store.evicted_keys(),
        (after.saturating_sub(before)) as f64 / 1048576.0
    );
}
