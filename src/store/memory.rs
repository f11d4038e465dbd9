//! The in-process store: sharded hash maps of 16-byte digests to two-word states.
//!
//! - Never waits on I/O; each decision holds at most a few shard locks for a few hundred
//!   nanoseconds, taken in index order so two requests can never deadlock.
//! - Bounded: at most `max_keys` buckets (split evenly across shards). A shard that is full first
//!   drops every bucket that is full again (its state has expired, so dropping it changes no
//!   decision). If every bucket in it is still active, it evicts, from a sample, the bucket that
//!   would be full again soonest: the one whose loss forgives the least. That choice fails open
//!   for the evicted principal, never closed for a newcomer, and a flood of fresh keys mostly
//!   evicts its own young buckets while the deep debts of refused clients stay.

use super::{Check, Store, StoreError};
use crate::clock::{Clock, Nanos};
use crate::limiter::{self, State, Verdict};
use futures_util::future::BoxFuture;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Number of shards; a power of two.
const SHARDS: usize = 64;
/// How many buckets an eviction looks at when the shard is full of active ones.
const EVICTION_SAMPLE: usize = 32;
/// A full shard sweeps out expired buckets at most this often.
const SWEEP_EVERY_NS: Nanos = 1_000_000_000;

pub const DEFAULT_MAX_KEYS: usize = 100_000;

#[derive(Default)]
struct Shard {
    map: HashMap<[u8; 16], State>,
    next_sweep: Nanos,
}

pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    per_shard_cap: usize,
    clock: Arc<dyn Clock>,
    evicted: AtomicU64,
}

impl MemoryStore {
    pub fn new(max_keys: usize, clock: Arc<dyn Clock>) -> Self {
        let per_shard_cap = max_keys.div_ceil(SHARDS).max(1);
        let shards = (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect();
        Self {
            shards,
            per_shard_cap,
            clock,
            evicted: AtomicU64::new(0),
        }
    }

    /// The cap actually enforced (`max_keys` rounded up to a multiple of the shard count).
    pub fn capacity(&self) -> usize {
        self.per_shard_cap * SHARDS
    }

    fn shard_of(digest: &[u8; 16]) -> usize {
        digest[0] as usize % SHARDS
    }

    /// Decide synchronously: the memory store never needs to wait.
    pub fn decide_now(&self, checks: &[Check]) -> Vec<Verdict> {
        let now = self.clock.now();
        match checks {
            [] => Vec::new(),
            [one] => {
                let mut shard = self.shards[Self::shard_of(&one.key.digest)].lock();
                let (v, new) =
                    limiter::decide(&one.quota, shard.map.get(&one.key.digest).copied(), now);
                if let Some(s) = new {
                    self.put(&mut shard, one.key.digest, s, now);
                }
                vec![v]
            }
            many => self.decide_many(many, now),
        }
    }

    fn decide_many(&self, checks: &[Check], now: Nanos) -> Vec<Verdict> {
        let mut idx: Vec<usize> = checks
            .iter()
            .map(|c| Self::shard_of(&c.key.digest))
            .collect();
        idx.sort_unstable();
        idx.dedup();
        let mut guards: Vec<(usize, parking_lot::MutexGuard<'_, Shard>)> =
            idx.iter().map(|&i| (i, self.shards[i].lock())).collect();
        let mut verdicts = Vec::with_capacity(checks.len());
        let mut updates: Vec<Option<State>> = Vec::with_capacity(checks.len());
        for (n, c) in checks.iter().enumerate() {
            let shard_i = Self::shard_of(&c.key.digest);
            // A request may name the same bucket twice: see the earlier update.
            let prior = checks[..n]
                .iter()
                .zip(&updates)
                .rev()
                .find(|(p, u)| p.key.digest == c.key.digest && u.is_some())
                .and_then(|(_, u)| *u);
            let stored = prior.or_else(|| {
                guards
                    .iter()
                    .find(|(i, _)| *i == shard_i)
                    .and_then(|(_, g)| g.map.get(&c.key.digest).copied())
            });
            let (v, new) = limiter::decide(&c.quota, stored, now);
            verdicts.push(v);
            updates.push(new);
        }
        if verdicts
            .iter()
            .zip(checks)
            .all(|(v, c)| v.allowed || c.advisory)
        {
            for (c, u) in checks.iter().zip(updates) {
                if let Some(s) = u {
                    let shard_i = Self::shard_of(&c.key.digest);
                    if let Some((_, g)) = guards.iter_mut().find(|(i, _)| *i == shard_i) {
                        self.put(g, c.key.digest, s, now);
                    }
                }
            }
        }
        verdicts
    }

    fn put(&self, shard: &mut Shard, key: [u8; 16], state: State, now: Nanos) {
        if let Some(slot) = shard.map.get_mut(&key) {
            *slot = state;
            return;
        }
        if shard.map.len() >= self.per_shard_cap {
            if now >= shard.next_sweep {
                shard.map.retain(|_, s| s.expires_at() > now);
                shard.next_sweep = now + SWEEP_EVERY_NS;
            }
            if shard.map.len() >= self.per_shard_cap {
                let victim = shard
                    .map
                    .iter()
                    .take(EVICTION_SAMPLE)
                    .min_by_key(|(_, s)| s.expires_at())
                    .map(|(k, s)| (*k, s.expires_at()));
                if let Some((k, exp)) = victim {
                    shard.map.remove(&k);
                    if exp > now {
                        self.evicted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        shard.map.insert(key, state);
    }
}

impl Store for MemoryStore {
    fn decide<'a>(
        &'a self,
        checks: &'a [Check],
    ) -> BoxFuture<'a, Result<Vec<Verdict>, StoreError>> {
        let out = self.decide_now(checks);
        Box::pin(async move { Ok(out) })
    }

    fn kind(&self) -> &'static str {
        "memory"
    }

    fn tracked_keys(&self) -> u64 {
        self.shards.iter().map(|s| s.lock().map.len() as u64).sum()
    }

    fn evicted_keys(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::keys::BucketKey;
    use crate::limiter::Quota;
    use std::time::Duration;

    fn check(limiter: &str, principal: &str, limit: u32, secs: u64) -> Check {
        Check {
            key: BucketKey::new(Arc::from(limiter), principal),
            quota: Quota::gcra(limit, Duration::from_secs(secs)),
            advisory: false,
        }
    }

    #[test]
    fn all_or_nothing_across_keys() {
        let clock = ManualClock::new(1_000);
        let store = MemoryStore::new(1000, Arc::new(clock.clone()));
        let tight = check("tight", "k", 1, 60);
        let loose = check("loose", "k", 10, 60);
        let both = [loose.clone(), tight.clone()];
        let v = store.decide_now(&both);
        assert!(v.iter().all(|v| v.allowed));
        assert_eq!(v[0].remaining, 9);
        // The tight one refuses: the loose one must not be charged.
        let v = store.decide_now(&both);
        assert!(!v[1].allowed);
        assert_eq!(
            v[0].remaining, 8,
            "reported as if allowed, but not consumed"
        );
        let v = store.decide_now(std::slice::from_ref(&loose));
        assert_eq!(v[0].remaining, 8, "the refused request consumed nothing");
    }

    #[test]
    fn advisory_refusal_does_not_block_consumption() {
        let store = MemoryStore::new(1000, Arc::new(ManualClock::new(0)));
        let mut shadow = check("shadow", "k", 1, 60);
        shadow.advisory = true;
        let real = check("real", "k", 10, 60);
        store.decide_now(&[shadow.clone(), real.clone()]);
        let v = store.decide_now(&[shadow, real]);
        assert!(!v[0].allowed);
        assert!(v[1].allowed);
        assert_eq!(v[1].remaining, 8, "the enforcing limiter was charged twice");
    }

    #[test]
    fn same_key_twice_in_one_request_counts_twice() {
        let store = MemoryStore::new(1000, Arc::new(ManualClock::new(0)));
        let c = check("x", "k", 2, 60);
        let v = store.decide_now(&[c.clone(), c.clone()]);
        assert!(v.iter().all(|v| v.allowed));
        assert_eq!(v[1].remaining, 0);
        assert!(!store.decide_now(&[c])[0].allowed);
    }

    #[test]
    fn capped_and_expired_keys_go_first() {
        let clock = ManualClock::new(1);
        let store = MemoryStore::new(SHARDS * 4, Arc::new(clock.clone()));
        for i in 0..10_000 {
            store.decide_now(&[check("x", &format!("k{i}"), 10, 1)]);
        }
        assert!(store.tracked_keys() as usize <= store.capacity());
        // Everything is full again after a second: a sweep drops expired keys, not active ones.
        let evicted_before = store.evicted_keys();
        assert!(evicted_before > 0, "active keys had to be evicted");
        clock.advance(Duration::from_secs(5));
        for i in 0..SHARDS * 8 {
            store.decide_now(&[check("y", &format!("k{i}"), 10, 1)]);
        }
        assert!(store.tracked_keys() as usize <= store.capacity());
    }

    #[test]
    fn refused_keys_survive_a_flood_of_fresh_ones() {
        let clock = ManualClock::new(1);
        let store = MemoryStore::new(SHARDS * 64, Arc::new(clock.clone()));
        let victim = check("x", "attacker", 3, 900);
        for _ in 0..3 {
            assert!(store.decide_now(std::slice::from_ref(&victim))[0].allowed);
        }
        assert!(!store.decide_now(std::slice::from_ref(&victim))[0].allowed);
        for i in 0..50_000 {
            store.decide_now(&[check("x", &format!("fresh{i}"), 30, 60)]);
        }
        assert!(
            !store.decide_now(std::slice::from_ref(&victim))[0].allowed,
            "a deep debt outlives young buckets"
        );
    }
}
