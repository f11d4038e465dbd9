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

use super::{Check, GiveBack, Store, StoreError};
use crate::clock::{Clock, Nanos};
use crate::limiter::{self, State, Verdict};
use futures_util::future::BoxFuture;
use parking_lot::Mutex;
use smallvec::SmallVec;
use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Fewest shards; the store picks between this and twice as many (see [`shard_count`]).
const SHARDS: usize = 64;
/// How many buckets an eviction looks at when the shard is full of active ones.
const EVICTION_SAMPLE: usize = 32;
/// A full shard sweeps out expired buckets at most this often.
const SWEEP_EVERY_NS: Nanos = 1_000_000_000;

struct Shard {
    map: HashMap<[u8; 16], State, DigestHashBuilder>,
    next_sweep: Nanos,
}

pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    /// `shards.len()`, as the divisor of the shard index.
    shard_count: usize,
    per_shard_cap: usize,
    clock: Arc<dyn Clock>,
    evicted: AtomicU64,
    /// Bucket names are private to this store: keyed SipHash, not SHA-256.
    digest: crate::keys::KeyDigest,
}

impl MemoryStore {
    pub fn new(max_keys: usize, clock: Arc<dyn Clock>) -> Self {
        let shard_count = shard_count(max_keys);
        let hasher = DigestHashBuilder::random();
        let per_shard_cap = max_keys.div_ceil(shard_count).max(1);
        // Tables start empty and grow with their shard (see `put`): a store tracking a few
        // thousand buckets keeps them in a few cache-resident tables rather than spread thinly
        // over tables sized for the cap.
        let shards = (0..shard_count)
            .map(|_| {
                Mutex::new(Shard {
                    map: HashMap::with_hasher(hasher),
                    next_sweep: 0,
                })
            })
            .collect();
        Self {
            shards,
            shard_count,
            per_shard_cap,
            clock,
            evicted: AtomicU64::new(0),
            digest: crate::keys::KeyDigest::local(),
        }
    }

    /// The same store naming its buckets with `digest` instead of a random key: for vectors
    /// that must read the same in every run (`KeyDigest::Shared` names them as Redis does).
    pub fn with_key_digest(mut self, digest: crate::keys::KeyDigest) -> Self {
        self.digest = digest;
        self
    }

    /// Take the buckets a state file restored (see [`super::state_file`]), and the digest key
    /// they are named under. The store must be new: its own buckets are replaced.
    pub(crate) fn restore(&mut self, key: (u64, u64), buckets: Vec<super::state_file::Entry>) {
        let (k0, k1) = key;
        self.digest = crate::keys::KeyDigest::Local { k0, k1 };
        let now = self.clock.now();
        for shard in self.shards.iter() {
            shard.lock().map.clear();
        }
        for e in buckets {
            let mut shard = self.shards[self.shard_of(&e.digest)].lock();
            self.put(&mut shard, e.digest, e.state, now);
        }
    }

    /// Every bucket held, as the state file writes them.
    fn entries(&self) -> Vec<super::state_file::Entry> {
        let mut all = Vec::new();
        for shard in self.shards.iter() {
            let shard = shard.lock();
            all.extend(
                shard
                    .map
                    .iter()
                    .map(|(digest, state)| super::state_file::Entry {
                        digest: *digest,
                        state: *state,
                    }),
            );
        }
        all
    }

    /// The cap actually enforced (`max_keys` rounded up to a multiple of the shard count).
    pub fn capacity(&self) -> usize {
        self.per_shard_cap * self.shard_count
    }

    fn shard_of(&self, digest: &[u8; 16]) -> usize {
        u16::from_le_bytes([digest[0], digest[1]]) as usize % self.shard_count
    }

    /// Decide synchronously: the memory store never needs to wait.
    pub fn decide_now(&self, checks: &[Check]) -> Vec<Verdict> {
        self.decide_at(checks, self.clock.now())
    }

    /// [`MemoryStore::decide_now`] at `now` on the store's clock, read by the caller.
    pub fn decide_at(&self, checks: &[Check], now: Nanos) -> Vec<Verdict> {
        match checks {
            [] => Vec::new(),
            [one] => {
                let mut shard = self.shards[self.shard_of(&one.key.digest)].lock();
                // One table probe for a bucket that exists (the common case).
                if let Some(slot) = shard.map.get_mut(&one.key.digest) {
                    let (v, new) = limiter::decide_units(&one.quota, Some(*slot), now, one.units);
                    if let Some(s) = new {
                        *slot = s;
                    }
                    return vec![v];
                }
                let (v, new) = limiter::decide_units(&one.quota, None, now, one.units);
                if let Some(s) = new {
                    self.put(&mut shard, one.key.digest, s, now);
                }
                vec![v]
            }
            many => self.decide_many(many, now),
        }
    }

    #[inline(never)]
    fn decide_many(&self, checks: &[Check], now: Nanos) -> Vec<Verdict> {
        // On the stack for the usual handful of limiters per request.
        let mut idx: SmallVec<[usize; 4]> = checks
            .iter()
            .map(|c| self.shard_of(&c.key.digest))
            .collect();
        idx.sort_unstable();
        idx.dedup();
        let mut guards: SmallVec<[(usize, parking_lot::MutexGuard<'_, Shard>); 4]> =
            idx.iter().map(|&i| (i, self.shards[i].lock())).collect();
        let mut verdicts = Vec::with_capacity(checks.len());
        let mut updates: SmallVec<[Option<State>; 4]> = SmallVec::with_capacity(checks.len());
        for (n, c) in checks.iter().enumerate() {
            let shard_i = self.shard_of(&c.key.digest);
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
            let (v, new) = limiter::decide_units(&c.quota, stored, now, c.units);
            verdicts.push(v);
            updates.push(new);
        }
        // A refused request consumes nothing, but a lock its refusal started is kept.
        let passed = verdicts
            .iter()
            .zip(checks)
            .all(|(v, c)| v.allowed || c.shadow);
        for (c, u) in checks.iter().zip(updates) {
            if let Some(s) = u.filter(|s| passed || limiter::is_lock(s)) {
                let shard_i = self.shard_of(&c.key.digest);
                if let Some((_, g)) = guards.iter_mut().find(|(i, _)| *i == shard_i) {
                    self.put(g, c.key.digest, s, now);
                }
            }
        }
        verdicts
    }

    /// [`Store::peek`]: each check judged as [`MemoryStore::decide_now`] would judge it, the
    /// buckets untouched.
    pub fn peek_now(&self, checks: &[Check]) -> Vec<Verdict> {
        let now = self.clock.now();
        checks
            .iter()
            .map(|c| {
                let stored = self.shards[self.shard_of(&c.key.digest)]
                    .lock()
                    .map
                    .get(&c.key.digest)
                    .copied();
                limiter::decide_units(&c.quota, stored, now, c.units).0
            })
            .collect()
    }

    /// [`Store::reset`]: forget the buckets; how many were held.
    pub fn reset_now(&self, keys: &[crate::keys::BucketKey]) -> u64 {
        keys.iter()
            .filter(|k| {
                self.shards[self.shard_of(&k.digest)]
                    .lock()
                    .map
                    .remove(&k.digest)
                    .is_some()
            })
            .count() as u64
    }

    /// Give back answered requests under each bucket's shard lock (see [`Store::give_back`]).
    pub fn give_back_now(&self, items: &[GiveBack]) {
        let now = self.clock.now();
        for g in items {
            let mut shard = self.shards[self.shard_of(&g.key.digest)].lock();
            if let Some(slot) = shard.map.get_mut(&g.key.digest) {
                if let Some(s) =
                    limiter::give_back_answered(&g.quota, *slot, g.units, g.outstanding_ns, now)
                {
                    *slot = s;
                }
            }
        }
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
        if shard.map.len() >= shard.map.capacity() {
            // No free slot is left: live buckets, or the tombstones evictions leave. Rebuild
            // the table at twice its live size, but never past the size the cap needs, so a
            // full shard rebuilds at its own size (rare: once per many evictions) instead of
            // doubling.
            let hasher = *shard.map.hasher();
            let cap = (shard.map.len() * 2)
                .max(16)
                .min(table_capacity(self.per_shard_cap));
            let mut fresh = HashMap::with_capacity_and_hasher(cap, hasher);
            fresh.extend(shard.map.drain());
            shard.map = fresh;
        }
        shard.map.insert(key, state);
    }
}

/// Hashes a bucket's digest for its shard's table. The digest is a uniform 16-byte hash
/// already (SHA-256 or keyed SipHash), so SipHash over it again only costs time; instead each
/// store draws a random key and folds the digest's two halves with it in one 128-bit multiply.
/// Without the key, whoever picks principals (and can compute their digests) could aim many at
/// one probe sequence.
#[derive(Clone, Copy)]
struct DigestHashBuilder {
    k0: u64,
    k1: u64,
}

impl DigestHashBuilder {
    fn random() -> Self {
        let seed = RandomState::new();
        Self {
            k0: seed.hash_one(0x5eed_u64),
            k1: seed.hash_one(0xfeed_u64),
        }
    }
}

impl BuildHasher for DigestHashBuilder {
    type Hasher = DigestHasher;

    fn build_hasher(&self) -> DigestHasher {
        DigestHasher {
            k0: self.k0,
            k1: self.k1,
            h: 0,
        }
    }
}

struct DigestHasher {
    k0: u64,
    k1: u64,
    h: u64,
}

impl Hasher for DigestHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(16) {
            let mut block = [0u8; 16];
            block[..chunk.len()].copy_from_slice(chunk);
            let (lo, hi) = block.split_at(8);
            let lo = u64::from_le_bytes(lo.try_into().unwrap_or_default()) ^ self.k0 ^ self.h;
            let hi = u64::from_le_bytes(hi.try_into().unwrap_or_default()) ^ self.k1;
            let p = u128::from(lo) * u128::from(hi);
            self.h = (p as u64) ^ ((p >> 64) as u64);
        }
    }

    /// The key is always 16 bytes: its length prefix tells nothing.
    fn write_usize(&mut self, _: usize) {}

    fn finish(&self) -> u64 {
        self.h
    }
}

/// Slots a hash table allocates to hold `n` entries: a power of two kept at most 7/8 full
/// (the standard library's table; tables under 8 slots are 4 or 8).
fn table_slots(n: usize) -> usize {
    match n {
        0..=3 => 4,
        4..=7 => 8,
        _ => n.saturating_mul(8).div_ceil(7).next_power_of_two(),
    }
}

/// The table size a shard of `cap` buckets asks for: its cap plus spare slots for the
/// tombstones evictions leave, so a full shard rebuilds its table rarely and never doubles it.
fn table_capacity(cap: usize) -> usize {
    cap.saturating_add(cap / 6)
}

/// The shard count, between 64 and 127, whose tables hold `max_keys` in the fewest slots.
/// With a fixed count, a cap just past 7/8 of a power of two per shard would leave every table
/// nearly half empty: at 1 000 000 keys 64 shards allocate 2 097 152 slots, 82 allocate 1 343 488.
fn shard_count(max_keys: usize) -> usize {
    (SHARDS..2 * SHARDS)
        .min_by_key(|&s| s * table_slots(table_capacity(max_keys.div_ceil(s).max(1))))
        .unwrap_or(SHARDS)
}

impl Store for MemoryStore {
    fn decide<'a>(
        &'a self,
        checks: &'a [Check],
    ) -> BoxFuture<'a, Result<Vec<Verdict>, StoreError>> {
        let out = self.decide_now(checks);
        Box::pin(async move { Ok(out) })
    }

    fn decide_in_process(&self, checks: &[Check], now: Nanos) -> Option<Vec<Verdict>> {
        Some(self.decide_at(checks, now))
    }

    fn give_back<'a>(&'a self, items: &'a [GiveBack]) -> BoxFuture<'a, Result<(), StoreError>> {
        self.give_back_now(items);
        Box::pin(async { Ok(()) })
    }

    fn peek<'a>(&'a self, checks: &'a [Check]) -> BoxFuture<'a, Result<Vec<Verdict>, StoreError>> {
        let out = self.peek_now(checks);
        Box::pin(async move { Ok(out) })
    }

    fn reset<'a>(
        &'a self,
        keys: &'a [crate::keys::BucketKey],
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        let n = self.reset_now(keys);
        Box::pin(async move { Ok(n) })
    }

    fn key_digest(&self) -> crate::keys::KeyDigest {
        self.digest
    }

    fn kind(&self) -> &'static str {
        "memory"
    }

    fn clock(&self) -> Option<Arc<dyn Clock>> {
        Some(self.clock.clone())
    }

    fn tracked_keys(&self) -> u64 {
        self.shards.iter().map(|s| s.lock().map.len() as u64).sum()
    }

    fn evicted_keys(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    fn kept_buckets(&self) -> Option<((u64, u64), Vec<super::state_file::Entry>)> {
        match self.digest {
            crate::keys::KeyDigest::Local { k0, k1 } => Some(((k0, k1), self.entries())),
            // Names every instance computes: not this process's to keep.
            crate::keys::KeyDigest::Shared => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::keys::BucketKey;
    use crate::limiter::nonzero;
    use crate::limiter::Quota;
    use std::time::Duration;

    fn check(limiter: &str, principal: &str, limit: u32, secs: u64) -> Check {
        Check {
            key: BucketKey::new(Arc::from(limiter), principal),
            quota: Quota::gcra(nonzero(limit), Duration::from_secs(secs)),
            shadow: false,
            units: std::num::NonZeroU32::MIN,
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
    fn shadow_refusal_does_not_block_consumption() {
        let store = MemoryStore::new(1000, Arc::new(ManualClock::new(0)));
        let mut shadow = check("shadow", "k", 1, 60);
        shadow.shadow = true;
        let real = check("real", "k", 10, 60);
        store.decide_now(&[shadow.clone(), real.clone()]);
        let v = store.decide_now(&[shadow, real]);
        assert!(!v[0].allowed);
        assert!(v[1].allowed);
        assert_eq!(v[1].remaining, 8, "the enforcing limiter was charged twice");
    }

    #[test]
    fn a_lock_is_kept_though_the_request_it_refused_consumed_nothing() {
        let clock = ManualClock::new(1_000);
        let store = MemoryStore::new(1000, Arc::new(clock.clone()));
        let mut locking = check("attempts", "k", 2, 600);
        locking.quota = locking.quota.with_lockout(Some(Duration::from_secs(600)));
        let other = check("other", "k", 100, 60);
        let both = [other.clone(), locking.clone()];
        for _ in 0..2 {
            assert!(store.decide_now(&both).iter().all(|v| v.allowed));
        }
        // Refused: the lock starts, the other limiter is charged nothing.
        let v = store.decide_now(&both);
        assert!(!v[1].allowed);
        assert_eq!(v[1].retry_after_ns, 600 * S);
        assert_eq!(
            store.decide_now(std::slice::from_ref(&other))[0].remaining,
            97
        );
        // Alone or beside others, the key stays locked, counting down; then starts afresh.
        clock.advance(Duration::from_secs(300));
        let v = store.decide_now(std::slice::from_ref(&locking));
        assert_eq!((v[0].allowed, v[0].retry_after_ns), (false, 300 * S));
        let v = store.decide_now(&both);
        assert_eq!((v[1].allowed, v[1].retry_after_ns), (false, 300 * S));
        clock.advance(Duration::from_secs(300));
        let v = store.decide_now(&both);
        assert!(v[1].allowed);
        assert_eq!(v[1].remaining, 1);
    }

    const S: u64 = 1_000_000_000;

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
    fn shard_tables_stay_close_to_full_at_capacity() {
        for max_keys in [1_000, 100_000, 250_000, 1_000_000, 10_000_000] {
            let s = shard_count(max_keys);
            assert!((SHARDS..2 * SHARDS).contains(&s));
            let slots = s * table_slots(table_capacity(max_keys.div_ceil(s)));
            assert!(
                slots * 10 <= max_keys * 15,
                "{max_keys} keys in {s} shards take {slots} slots"
            );
            let store = MemoryStore::new(max_keys, Arc::new(ManualClock::new(0)));
            assert!(store.capacity() >= max_keys);
        }
        assert_eq!(table_slots(14_336), 16_384);
        assert_eq!(table_slots(14_337), 32_768);
    }

    #[test]
    fn digest_hash_is_keyed_and_spreads_low_and_high_bits() {
        let (a, b) = (DigestHashBuilder::random(), DigestHashBuilder::random());
        let digests: Vec<[u8; 16]> = (0..4096)
            .map(|i| crate::keys::digest("x", &format!("k{i}")))
            .collect();
        let same = digests
            .iter()
            .filter(|d| a.hash_one(d) == b.hash_one(d))
            .count();
        assert_eq!(same, 0, "two stores hash alike: the key is not used");
        // Table index (low bits) and tag (top 7 bits) both take every value.
        let mut low = [0u32; 256];
        let mut top = [0u32; 128];
        for d in &digests {
            let h = a.hash_one(d);
            low[(h & 255) as usize] += 1;
            top[(h >> 57) as usize] += 1;
        }
        assert!(low.iter().all(|&n| n > 0) && low.iter().all(|&n| n < 64));
        assert!(top.iter().all(|&n| n > 0) && top.iter().all(|&n| n < 96));
    }

    #[test]
    fn a_full_shard_under_churn_keeps_its_table_size() {
        let clock = ManualClock::new(1);
        let store = MemoryStore::new(10_000, Arc::new(clock.clone()));
        let sizes = |s: &MemoryStore| -> Vec<usize> {
            s.shards.iter().map(|m| m.lock().map.capacity()).collect()
        };
        // Tables start empty and grow with use ...
        assert!(sizes(&store).iter().all(|&c| c == 0));
        // ... to at most the size the cap needs.
        let cap_size =
            HashMap::<[u8; 16], u8>::with_capacity(table_capacity(store.per_shard_cap)).capacity();
        // Ten times the cap in fresh, still-active keys: every shard fills, then evicts.
        for i in 0..100_000 {
            store.decide_now(&[check("x", &format!("k{i}"), 10, 3600)]);
        }
        assert!(store.evicted_keys() > 50_000);
        assert!(store.tracked_keys() as usize <= store.capacity());
        // `capacity()` counts free slots too: tombstones lower it, only growth raises it.
        for now in sizes(&store) {
            assert!(
                now <= cap_size,
                "a table grew past the size its cap needs: {now} > {cap_size}"
            );
        }
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
