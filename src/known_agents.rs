//! Agents a `meter = "new-agents"` limiter has already admitted, per client IP: the memory that
//! lets a ceiling meter new agent ids instead of requests.
//!
//! `agent-ip` exists because the agent id is a header the client chooses: a client rotating it
//! would otherwise mint a fresh `agent-device` bucket per request. Metering every request of the
//! IP stops that, but a flood of fresh ids then drains the one budget every healthy agent behind
//! the same NAT shares, and the whole site is refused: the disconnect cascade the calibration
//! exists to prevent. So the ceiling meters only requests from ids it does not know. An id it
//! admits becomes known at that IP for `known_for`, renewed by each admitted request; a known
//! agent skips the ceiling and keeps only its own `agent-device` budget.
//!
//! Bounded twice: at most `max_known` ids per IP and limiter (beyond it a new id is still
//! metered by the ceiling, it is just not remembered, so a client cannot build an unbounded set
//! of known ids), and at most `capacity` ids in all (the store's `max_keys`). Expired ids are
//! swept when a table is full. Ids are kept as keyed 64-bit SipHash digests of
//! `limiter NUL ip NUL agent-id` under a per-process random key: never the raw id.
//!
//! The table is per process. Behind several instances sharing Redis, an agent is known to each
//! instance it has reached; see `docs/redis.md`.

use crate::clock::Nanos;
use parking_lot::Mutex;
use siphasher::sip::SipHasher13;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

const SHARDS: usize = 64;

/// What the table says of one agent id at one IP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Admitted within `known_for`: the ceiling does not meter it.
    Known,
    /// Not known: the ceiling meters it, and remembers it if the request is admitted.
    New,
}

/// The ids one IP has, for one limiter: digest -> expiry.
struct Ip {
    agents: HashMap<u64, Nanos, BuildHasherDefault<Prehashed>>,
    /// No id expires before this (a lower bound: renewals only move expiries later). A full IP
    /// is swept only once it has passed, so a flood of new ids at a full IP costs a lookup
    /// each, not a pass over every id.
    earliest: Nanos,
}

impl Ip {
    /// Drop the expired ids; returns how many were dropped.
    fn sweep(&mut self, now: Nanos) -> usize {
        if now < self.earliest {
            return 0;
        }
        let before = self.agents.len();
        self.agents.retain(|_, u| *u > now);
        self.earliest = self.agents.values().copied().min().unwrap_or(Nanos::MAX);
        before - self.agents.len()
    }
}

/// Digests are already uniform: the table uses them as they are.
#[derive(Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

#[derive(Default)]
struct Shard {
    ips: HashMap<u64, Ip, BuildHasherDefault<Prehashed>>,
    /// Ids held in this shard.
    held: usize,
}

/// The known agents of every `new-agents` limiter of one decider.
pub struct KnownAgents {
    shards: Box<[Mutex<Shard>]>,
    per_shard: usize,
    k0: u64,
    k1: u64,
    /// Ids not remembered because their IP or the table was full.
    not_remembered: AtomicU64,
}

impl std::fmt::Debug for KnownAgents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KnownAgents")
            .field("capacity", &(self.per_shard * SHARDS))
            .finish_non_exhaustive()
    }
}

/// Where one id lives: its IP's digest and its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentAt {
    ip: u64,
    agent: u64,
}

impl KnownAgents {
    /// A table of at most `capacity` ids in all.
    pub fn new(capacity: usize) -> Self {
        use rand::RngCore;
        let mut rng = rand::rngs::OsRng;
        let (k0, k1) = (rng.next_u64(), rng.next_u64());
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            per_shard: capacity.div_ceil(SHARDS).max(1),
            k0,
            k1,
            not_remembered: AtomicU64::new(0),
        }
    }

    /// The place of `agent` at `ip` for `limiter`: one SipHash pass over `limiter NUL ip NUL`,
    /// finished there for the IP, and carried on over `agent` for the id.
    pub fn at(&self, limiter: &str, ip: &str, agent: &str) -> AgentAt {
        let mut h = SipHasher13::new_with_keys(self.k0, self.k1);
        h.write(limiter.as_bytes());
        h.write_u8(0);
        h.write(ip.as_bytes());
        h.write_u8(0);
        let ip = h.finish();
        h.write(agent.as_bytes());
        AgentAt {
            ip,
            agent: h.finish(),
        }
    }

    fn shard(&self, at: AgentAt) -> &Mutex<Shard> {
        &self.shards[(at.ip % SHARDS as u64) as usize]
    }

    /// Whether the id is known now.
    pub fn seen(&self, at: AgentAt, now: Nanos) -> Seen {
        let shard = self.shard(at).lock();
        match shard
            .ips
            .get(&at.ip)
            .and_then(|ip| ip.agents.get(&at.agent))
        {
            Some(&until) if until > now => Seen::Known,
            _ => Seen::New,
        }
    }

    /// The id's request was admitted: it is known until `now + known_for` (renewed if it was
    /// known already), unless its IP already holds `max_known` live ids or the table is full.
    pub fn admitted(&self, at: AgentAt, now: Nanos, known_for: Nanos, max_known: usize) {
        let until = now.saturating_add(known_for);
        let mut guard = self.shard(at).lock();
        let shard = &mut *guard;
        if let Some(ip) = shard.ips.get_mut(&at.ip) {
            if let Some(slot) = ip.agents.get_mut(&at.agent) {
                *slot = until;
                return;
            }
            if ip.agents.len() >= max_known {
                shard.held -= ip.sweep(now);
                if ip.agents.len() >= max_known {
                    self.not_remembered.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            }
        }
        if shard.held >= self.per_shard {
            sweep(shard, now);
            if shard.held >= self.per_shard {
                self.not_remembered.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        let ip = shard.ips.entry(at.ip).or_insert_with(|| Ip {
            agents: HashMap::default(),
            earliest: Nanos::MAX,
        });
        ip.earliest = ip.earliest.min(until);
        ip.agents.insert(at.agent, until);
        shard.held += 1;
    }

    /// Ids held now (expired ones included until a sweep drops them).
    pub fn held(&self) -> u64 {
        self.shards.iter().map(|s| s.lock().held as u64).sum()
    }

    /// Ids admitted but not remembered because their IP or the table was full.
    pub fn not_remembered(&self) -> u64 {
        self.not_remembered.load(Ordering::Relaxed)
    }
}

/// Drop every expired id of a shard, and every IP left with none.
fn sweep(shard: &mut Shard, now: Nanos) {
    let mut held = 0;
    shard.ips.retain(|_, ip| {
        ip.sweep(now);
        held += ip.agents.len();
        !ip.agents.is_empty()
    });
    shard.held = held;
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;

    #[test]
    fn an_admitted_id_is_known_until_it_expires_and_each_admission_renews_it() {
        let t = KnownAgents::new(1000);
        let a = t.at("agent-ip", "198.51.100.7", "agent-1");
        assert_eq!(t.seen(a, S), Seen::New);
        t.admitted(a, S, 60 * S, 10);
        assert_eq!(t.seen(a, 30 * S), Seen::Known);
        t.admitted(a, 50 * S, 60 * S, 10);
        assert_eq!(t.seen(a, 100 * S), Seen::Known, "renewed at 50 s");
        assert_eq!(t.seen(a, 110 * S), Seen::New);
    }

    #[test]
    fn ids_are_per_ip_and_per_limiter() {
        let t = KnownAgents::new(1000);
        t.admitted(t.at("agent-ip", "198.51.100.7", "a"), 0, 60 * S, 10);
        assert_eq!(t.seen(t.at("agent-ip", "198.51.100.8", "a"), S), Seen::New);
        assert_eq!(t.seen(t.at("other", "198.51.100.7", "a"), S), Seen::New);
        assert_eq!(
            t.seen(t.at("agent-ip", "198.51.100.7", "a"), S),
            Seen::Known
        );
    }

    #[test]
    fn an_ip_remembers_at_most_max_known_live_ids_and_makes_room_as_they_expire() {
        let t = KnownAgents::new(100_000);
        for i in 0..5 {
            t.admitted(t.at("l", "ip", &format!("a{i}")), 0, 60 * S, 5);
        }
        let sixth = t.at("l", "ip", "a5");
        t.admitted(sixth, S, 60 * S, 5);
        assert_eq!(t.seen(sixth, 2 * S), Seen::New, "the IP is full");
        assert_eq!(t.not_remembered(), 1);
        // A known id still renews while the IP is full.
        t.admitted(t.at("l", "ip", "a0"), 30 * S, 60 * S, 5);
        assert_eq!(t.seen(t.at("l", "ip", "a0"), 80 * S), Seen::Known);
        // At 61 s the other four have expired: room again.
        t.admitted(sixth, 61 * S, 60 * S, 5);
        assert_eq!(t.seen(sixth, 62 * S), Seen::Known);
        assert_eq!(t.held(), 2);
    }

    #[test]
    fn a_full_ip_is_not_swept_again_before_its_earliest_id_expires() {
        let t = KnownAgents::new(100_000);
        for i in 0..3 {
            t.admitted(t.at("l", "ip", &format!("a{i}")), i * S, 60 * S, 3);
        }
        let shard = |t: &KnownAgents| {
            let at = t.at("l", "ip", "x");
            let g = t.shard(at).lock();
            g.ips.get(&at.ip).map(|ip| ip.earliest)
        };
        assert_eq!(shard(&t), Some(60 * S));
        // Renewing the earliest id leaves the bound where it was (a lower bound).
        t.admitted(t.at("l", "ip", "a0"), 10 * S, 60 * S, 3);
        for n in 0..1000 {
            t.admitted(t.at("l", "ip", &format!("new{n}")), 20 * S, 60 * S, 3);
        }
        assert_eq!(t.not_remembered(), 1000);
        // At 61 s the bound has passed: one sweep finds a1 (expired at 61 s) and makes room.
        t.admitted(t.at("l", "ip", "late"), 61 * S, 60 * S, 3);
        assert_eq!(t.seen(t.at("l", "ip", "late"), 62 * S), Seen::Known);
        assert_eq!(shard(&t), Some(62 * S), "a2 expires next");
    }

    #[test]
    fn the_table_is_bounded_and_sweeps_expired_ids_when_full() {
        let t = KnownAgents::new(64);
        // One id per shard at most: fill every shard's single slot with many IPs.
        for i in 0..10_000 {
            t.admitted(t.at("l", &format!("ip{i}"), "a"), 0, 10 * S, 5);
        }
        assert!(t.held() <= 64, "{}", t.held());
        assert!(t.not_remembered() >= 10_000 - 64);
        // Later, everything has expired and new ids are remembered again.
        let late = t.at("l", "fresh-ip", "a");
        t.admitted(late, 20 * S, 10 * S, 5);
        assert_eq!(t.seen(late, 21 * S), Seen::Known);
    }

    #[test]
    fn a_raw_id_is_never_held() {
        let t = KnownAgents::new(10);
        let a = t.at("l", "198.51.100.7", "secret-agent-id");
        let dbg = format!("{a:?} {t:?}");
        assert!(!dbg.contains("secret-agent-id") && !dbg.contains("198.51.100.7"));
    }
}
