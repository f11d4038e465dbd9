//! The local over-limit cache: a request refused until T is answered in-process until T when
//! it names exactly the same buckets.

use crate::clock::Nanos;
use crate::keys::BucketKey;
use crate::limiter::{Quota, Verdict};
use crate::store::Check;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Cache shards; a power of two.
const CACHE_SHARDS: usize = 16;

/// What a refused request looked like, so an identical one can be answered without Redis.
struct Snapshot {
    checks: Vec<(BucketKey, Quota, bool, NonZeroU32)>,
    verdicts: Vec<Verdict>,
    at: Nanos,
    /// The earliest instant one of its refusals ends.
    until: Nanos,
}

impl Snapshot {
    fn matches(&self, checks: &[Check]) -> bool {
        self.checks.len() == checks.len()
            && self.checks.iter().zip(checks).all(|((k, q, a, u), c)| {
                *k == c.key && *q == c.quota && *a == c.shadow && *u == c.units
            })
    }

    fn at_time(&self, now: Nanos) -> Vec<Verdict> {
        let elapsed = now.saturating_sub(self.at);
        self.verdicts
            .iter()
            .map(|v| Verdict {
                reset_after_ns: v.reset_after_ns.saturating_sub(elapsed),
                retry_after_ns: v.retry_after_ns.saturating_sub(elapsed),
                ..*v
            })
            .collect()
    }
}

#[derive(Default)]
struct CacheShard {
    map: HashMap<BucketKey, Arc<Snapshot>>,
    next_sweep: Nanos,
}

/// The local over-limit cache: refused buckets -> the refusal, until it ends. Bounded.
pub(super) struct OverLimitCache {
    shards: Box<[Mutex<CacheShard>]>,
    per_shard: usize,
    pub(super) hits: AtomicU64,
}

impl OverLimitCache {
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            shards: (0..CACHE_SHARDS)
                .map(|_| Mutex::new(CacheShard::default()))
                .collect(),
            per_shard: capacity.div_ceil(CACHE_SHARDS),
            hits: AtomicU64::new(0),
        }
    }

    fn shard(&self, key: &BucketKey) -> &Mutex<CacheShard> {
        &self.shards[key.digest[0] as usize % CACHE_SHARDS]
    }

    pub(super) fn answer(&self, checks: &[Check], now: Nanos) -> Option<Vec<Verdict>> {
        if self.per_shard == 0 {
            return None;
        }
        for c in checks.iter().filter(|c| !c.shadow) {
            let snap = self.shard(&c.key).lock().map.get(&c.key).cloned();
            if let Some(s) = snap {
                if now < s.until && s.matches(checks) {
                    self.hits.fetch_add(1, Ordering::Relaxed);
                    return Some(s.at_time(now));
                }
            }
        }
        None
    }

    pub(super) fn remember(&self, checks: &[Check], verdicts: &[Verdict], now: Nanos) {
        if self.per_shard == 0 {
            return;
        }
        let refusing = checks
            .iter()
            .zip(verdicts)
            .any(|(c, v)| !c.shadow && !v.allowed);
        if !refusing {
            return;
        }
        let wait = verdicts
            .iter()
            .filter(|v| !v.allowed)
            .map(|v| v.retry_after_ns)
            .min()
            .unwrap_or(0);
        if wait == 0 {
            return;
        }
        let snap = Arc::new(Snapshot {
            checks: checks
                .iter()
                .map(|c| (c.key.clone(), c.quota, c.shadow, c.units))
                .collect(),
            verdicts: verdicts.to_vec(),
            at: now,
            until: now.saturating_add(wait),
        });
        for (c, _) in checks
            .iter()
            .zip(verdicts)
            .filter(|(c, v)| !c.shadow && !v.allowed)
        {
            let mut shard = self.shard(&c.key).lock();
            if shard.map.len() >= self.per_shard && !shard.map.contains_key(&c.key) {
                if now >= shard.next_sweep {
                    shard.map.retain(|_, s| s.until > now);
                    shard.next_sweep = now.saturating_add(1_000_000_000);
                }
                if shard.map.len() >= self.per_shard {
                    continue;
                }
            }
            shard.map.insert(c.key.clone(), snap.clone());
        }
    }

    /// Drop the refusal held for `key` (a reset): the next request asks Redis.
    pub(super) fn forget(&self, key: &BucketKey) {
        self.shard(key).lock().map.remove(key);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().map.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock};
    use crate::limiter::nonzero;
    use std::time::Duration;

    fn check(limiter: &str, principal: &str, limit: u32, secs: u64, shadow: bool) -> Check {
        Check {
            key: BucketKey::new(Arc::from(limiter), principal),
            quota: Quota::gcra(nonzero(limit), Duration::from_secs(secs)),
            shadow,
            units: std::num::NonZeroU32::MIN,
        }
    }

    fn refused(retry_s: u64) -> Verdict {
        Verdict {
            allowed: false,
            limit: 1,
            remaining: 0,
            reset_after_ns: retry_s * 2_000_000_000,
            retry_after_ns: retry_s * 1_000_000_000,
        }
    }

    fn allowed() -> Verdict {
        Verdict {
            allowed: true,
            limit: 10,
            remaining: 5,
            reset_after_ns: 3_000_000_000,
            retry_after_ns: 0,
        }
    }

    #[test]
    fn cache_answers_identical_requests_until_the_refusal_ends() {
        let clock = ManualClock::new(0);
        let cache = OverLimitCache::new(100);
        let checks = [
            check("a", "k", 1, 60, false),
            check("b", "k", 10, 60, false),
        ];
        cache.remember(&checks, &[refused(10), allowed()], clock.now());
        let v = cache.answer(&checks, 4_000_000_000).expect("cached");
        assert!(!v[0].allowed);
        assert_eq!(v[0].retry_after_ns, 6_000_000_000);
        assert_eq!(
            v[1],
            Verdict {
                reset_after_ns: 0,
                ..allowed()
            }
        );
        assert!(
            cache.answer(&checks, 10_000_000_000).is_none(),
            "the refusal has ended"
        );
        assert!(
            cache.answer(&checks[..1], 1).is_none(),
            "different buckets ask Redis"
        );
        assert_eq!(cache.hits.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn cache_ignores_shadow_refusals_and_stays_bounded() {
        let cache = OverLimitCache::new(CACHE_SHARDS * 2);
        let shadow = [check("s", "k", 1, 60, true)];
        cache.remember(&shadow, &[refused(5)], 0);
        assert_eq!(cache.len(), 0);
        for i in 0..1000 {
            let c = [check("a", &format!("k{i}"), 1, 60, false)];
            cache.remember(&c, &[refused(5)], 0);
        }
        assert!(cache.len() <= CACHE_SHARDS * 2);
        // Once they expire, new refusals take their place.
        let c = [check("a", "late", 1, 60, false)];
        for i in 0..200 {
            let c = [check("z", &format!("late{i}"), 1, 60, false)];
            cache.remember(&c, &[refused(5)], 6_000_000_000);
        }
        cache.remember(&c, &[refused(5)], 6_000_000_000);
        assert!(cache.len() <= CACHE_SHARDS * 2);
        assert!(cache.len() > 0);
    }

    #[test]
    fn disabled_cache_never_answers() {
        let cache = OverLimitCache::new(0);
        let c = [check("a", "k", 1, 60, false)];
        cache.remember(&c, &[refused(5)], 0);
        assert!(cache.answer(&c, 1).is_none());
    }
}
