//! Agents a `meter = "new-agents"` limiter has already admitted, per client address: the memory
//! that lets a ceiling meter new agent ids instead of requests, and that others cannot fill.
//!
//! `agent-ip` exists because the agent id is a header the client chooses: a client rotating it
//! would otherwise mint a fresh `agent-device` bucket per request. Metering every request of the
//! IP stops that, but a flood of fresh ids then drains the one budget every healthy agent behind
//! the same NAT shares, and the whole site is refused: the disconnect cascade the calibration
//! exists to prevent. So the ceiling meters only requests from ids it does not know. An id it
//! admits becomes known at that address for `known_for`, renewed by each admitted request; a
//! known agent skips the ceiling and keeps only its own `agent-device` budget.
//!
//! # Who keeps a place when the table is full
//!
//! The table is bounded (`store.max_keys` ids in all), and an id it cannot keep is metered by
//! the ceiling on every request. So what matters is who gives way when it is full. A healthy
//! agent is seen again within its cadence (a heartbeat or task poll every 30 s); a client
//! rotating ids sees each id once. The table uses exactly that, and nothing a client can forge
//! more cheaply:
//!
//! - **Two segments.** An id enters *probation* when first admitted and is *promoted* to the
//!   *protected* segment when admitted again while known. Protected ids fill at most half the
//!   table ([`split`]), so the other half is always left for first sightings.
//! - **A first sighting evicts only first sightings.** A new id never displaces a protected one.
//!   When the table is full it takes the place of, in order: an expired id; the oldest
//!   probationary id past its *grace* (twice the fleet's longest gap between two requests of a
//!   healthy agent: an id not seen again by then is not one of its agents, [`grace`]); else the
//!   oldest probationary id of the *heaviest address*, the one holding the most first
//!   sightings, if it holds at least two more than the newcomer's address. Otherwise the new id
//!   is not remembered. So a flood from many addresses evicts its own ids first, and an address
//!   keeps its first sightings up to an equal share of probation. A new site of `s =
//!   fleet.max_site_endpoints` agents keeps all of them, until its second requests promote
//!   them, while the first sightings other addresses minted within the grace, each address
//!   counted up to `s`, number at most `probation - s`: any flood from fewer than
//!   `probation / s` addresses, whatever their rate (`check` states both figures). Past that
//!   bound every address minting within the grace keeps an equal share. A flood that filled the
//!   table and stopped, or slowed, is past its grace within two minutes and gives way to anyone.
//! - **A promotion evicts only protected ids**, in the same order: expired, not seen within the
//!   grace (least recently seen first), then the least recently seen id of the heaviest address
//!   if it holds at least two more protected ids than the promoted id's address. An id that
//!   cannot be promoted stays in probation, renewed there, and is still known. Holding a
//!   protected place therefore costs a flood what it costs a healthy agent: a request per id
//!   every grace, each metered by `agent-device`, and a share no larger than any other
//!   address's. Every agent of a declared fleet of `fleet.max_agents` keeps its place while
//!   others hold at most `protected - max_agents` places renewed within the grace, each address
//!   counted up to a site.
//! - **Per address**, at most `max_known` ids (per limiter), whatever segment they are in. An
//!   address is an IPv4 address or an IPv6 /56 ([`ADDRESS_V6_PREFIX`]), also when the limiters
//!   key on longer prefixes (`client_ip.ipv6_prefix` up to 64): the /64s of one subscriber's /56
//!   share one share.
//!
//! One table serves the whole process, under one lock held for a hash lookup and a few link
//! updates (a known agent's request: a lookup to ask, a lookup and two moves to the tail of two
//! lists to renew). There are no shards: an address's share of the table is never a shard's.
//! Finding the heaviest address is a lookup in an ordered set updated when an address's count
//! changes (a new id, a promotion, an eviction), not on renewals. Counts of ids not remembered
//! and evicted are kept for `/metrics` ([`KnownAgents::counts`]).
//!
//! Ids are kept as keyed 64-bit SipHash digests of `limiter NUL address NUL [key NUL] agent-id`
//! under a per-process random key: never the raw id or the raw address. The table is per
//! process. Behind several instances sharing Redis, an agent is known to each instance it has
//! reached; see `docs/redis.md`.

use crate::clock::Nanos;
use parking_lot::Mutex;
use siphasher::sip::SipHasher13;
use std::collections::{BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

/// An IPv6 client is one address to the table per /56, whatever prefix the limiters key on.
pub(crate) const ADDRESS_V6_PREFIX: u8 = 56;

const NS: Nanos = 1_000_000_000;

/// How long a first sighting is guaranteed a place, and how long a protected id may go unseen
/// before it is the first to give way: twice the longest gap between two requests of a healthy
/// agent, `longest_gap_seconds` (`max(heartbeat_interval_seconds, poll_interval_seconds)` of
/// `[fleet]`, at least one second).
pub(crate) fn grace(longest_gap_seconds: u64) -> Nanos {
    longest_gap_seconds
        .max(1)
        .saturating_mul(2)
        .saturating_mul(NS)
}

/// How a table of `capacity` ids is split: `(protected, probation)`. Protected ids (seen twice)
/// fill at most half; the rest is always left for first sightings.
pub(crate) fn split(capacity: u64) -> (u64, u64) {
    let protected = capacity / 2;
    (protected, capacity - protected)
}

/// What the table says of one agent id at one address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Admitted within `known_for`: the ceiling does not meter it.
    Known,
    /// Not known: the ceiling meters it, and remembers it if the request is admitted.
    New,
}

/// Where one id lives: its address's digest and its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentAt {
    address: u64,
    agent: u64,
}

/// The table's counts, as `/metrics` shows them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// The most ids held.
    pub capacity: u64,
    /// The most protected ids held.
    pub protected_capacity: u64,
    /// Ids held now, first sightings.
    pub probation: u64,
    /// Ids held now, seen again while known.
    pub protected: u64,
    /// Admitted ids not remembered because their address held `max_known` ids.
    pub not_remembered_address: u64,
    /// Admitted ids not remembered because the table was full and nobody had to give way.
    pub not_remembered_table: u64,
    /// Ids dropped before they expired to make room, by segment: past their grace ...
    pub evicted_stale: [u64; 2],
    /// ... or within it, from the address holding the most.
    pub evicted_share: [u64; 2],
    /// Ids seen again that stayed in probation because the protected segment was full.
    pub not_promoted: u64,
}

/// The known agents of every `new-agents` limiter of one decider.
pub struct KnownAgents {
    /// On a cache line of its own: every request's `at` reads the key and the grace beside it,
    /// and must not lose that line each time another worker takes the lock.
    table: Padded<Mutex<Table>>,
    /// See [`grace`]; follows the fleet settings on reload.
    grace: AtomicU64,
    /// The digest key; replaced only by [`KnownAgents::restore`], before any request.
    k0: AtomicU64,
    k1: AtomicU64,
}

/// A value alone on its cache lines (128 bytes: two lines, as adjacent lines are fetched in
/// pairs).
#[repr(align(128))]
struct Padded<T>(T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// One id as the state file keeps it (see `store::state_file`): its segment, digests, when it
/// was last admitted and until when it is known, as this process's times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Kept {
    pub(crate) protected: bool,
    pub(crate) agent: u64,
    pub(crate) address: u64,
    pub(crate) since: Nanos,
    pub(crate) until: Nanos,
}

impl std::fmt::Debug for KnownAgents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KnownAgents")
            .field("capacity", &self.table.lock().capacity)
            .finish_non_exhaustive()
    }
}

impl KnownAgents {
    /// A table of at most `capacity` ids in all, whose ids past `grace` give way first.
    pub fn new(capacity: usize, grace: Nanos) -> Self {
        use rand::RngCore;
        let mut rng = rand::rngs::OsRng;
        let (k0, k1) = (rng.next_u64(), rng.next_u64());
        Self {
            table: Padded(Mutex::new(Table::new(capacity))),
            grace: AtomicU64::new(grace),
            k0: AtomicU64::new(k0),
            k1: AtomicU64::new(k1),
        }
    }

    /// Take the grace of a reloaded fleet.
    pub fn set_grace(&self, grace: Nanos) {
        self.grace.store(grace, Ordering::Relaxed);
    }

    /// The place of `agent` at `address` for `limiter`: one SipHash pass over
    /// `limiter NUL address NUL`, finished there for the address, and carried on over
    /// `key NUL` (when the limiters key on a longer prefix than the table's address) and
    /// `agent` for the id.
    pub fn at(&self, limiter: &str, address: &str, key: Option<&str>, agent: &str) -> AgentAt {
        let mut h = SipHasher13::new_with_keys(
            self.k0.load(Ordering::Relaxed),
            self.k1.load(Ordering::Relaxed),
        );
        h.write(limiter.as_bytes());
        h.write_u8(0);
        h.write(address.as_bytes());
        h.write_u8(0);
        let address = h.finish();
        if let Some(key) = key {
            h.write(key.as_bytes());
            h.write_u8(0);
        }
        h.write(agent.as_bytes());
        AgentAt {
            address,
            agent: h.finish(),
        }
    }

    /// Whether the id is known now.
    pub fn seen(&self, at: AgentAt, now: Nanos) -> Seen {
        if self.table.lock().live(at, now).is_some() {
            Seen::Known
        } else {
            Seen::New
        }
    }

    /// The id's request was admitted: it is known until `now + known_for`, renewed if it was
    /// known already (and promoted if it was a first sighting), unless its address already
    /// holds `max_known` ids or the table is full and nobody has to give way (see the module
    /// documentation).
    pub fn admitted(&self, at: AgentAt, now: Nanos, known_for: Nanos, max_known: usize) {
        let grace = self.grace.load(Ordering::Relaxed);
        self.table
            .lock()
            .admitted(at, now, now.saturating_add(known_for), max_known, grace);
    }

    /// Ids held now (expired ones included until they are dropped).
    pub fn held(&self) -> u64 {
        self.table.lock().index.len() as u64
    }

    /// Ids admitted but not remembered, whatever the reason.
    pub fn not_remembered(&self) -> u64 {
        let c = self.counts();
        c.not_remembered_address + c.not_remembered_table
    }

    /// The digest key and every id held and not expired at `now`, each segment oldest first:
    /// what [`KnownAgents::restore`] needs to rebuild the table in another process.
    pub(crate) fn export(&self, now: Nanos) -> ((u64, u64), Vec<Kept>) {
        let t = self.table.lock();
        let mut kept = Vec::with_capacity(t.index.len());
        for seg in [PROBATION, PROTECTED] {
            let mut slot = t.lists[seg].head;
            while slot != NIL {
                let e = &t.entries[slot as usize];
                if e.until > now {
                    kept.push(Kept {
                        protected: seg == PROTECTED,
                        agent: e.agent,
                        address: t.addresses[e.address as usize].digest,
                        since: e.since,
                        until: e.until,
                    });
                }
                slot = e.in_segment.next;
            }
        }
        let key = (
            self.k0.load(Ordering::Relaxed),
            self.k1.load(Ordering::Relaxed),
        );
        (key, kept)
    }

    /// Take the key and ids another process exported (their times already this process's),
    /// in the order it gave them; an empty table only, before any request. Ids the table has no
    /// room for are left out, as at run time.
    pub(crate) fn restore(&self, key: (u64, u64), kept: &[Kept], now: Nanos) {
        self.k0.store(key.0, Ordering::Relaxed);
        self.k1.store(key.1, Ordering::Relaxed);
        let grace = self.grace.load(Ordering::Relaxed);
        let mut t = self.table.lock();
        let capacity = t.capacity;
        *t = Table::new(capacity);
        for k in kept.iter().filter(|k| k.until > now) {
            let at = AgentAt {
                address: k.address,
                agent: k.agent,
            };
            if t.index.contains_key(&k.agent) {
                continue;
            }
            t.insert(at, k.since, k.until, usize::MAX, grace);
            if k.protected {
                if let Some(&slot) = t.index.get(&k.agent) {
                    t.promote(slot, k.since, k.until, grace);
                }
            }
        }
        // What the restore did is not what the traffic did: the counters start at zero.
        t.counts = Counts::default();
    }

    /// Everything `/metrics` shows of the table.
    pub fn counts(&self) -> Counts {
        let t = self.table.lock();
        let mut c = t.counts;
        c.capacity = t.capacity as u64;
        c.protected_capacity = t.protected_capacity as u64;
        c.probation = u64::from(t.lists[PROBATION].len);
        c.protected = u64::from(t.lists[PROTECTED].len);
        c
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

type DigestMap = HashMap<u64, u32, BuildHasherDefault<Prehashed>>;

/// No slot: the end of a list.
const NIL: u32 = u32::MAX;
const PROBATION: usize = 0;
const PROTECTED: usize = 1;

/// An entry's neighbours in one list.
#[derive(Debug, Clone, Copy)]
struct Links {
    prev: u32,
    next: u32,
}

const UNLINKED: Links = Links {
    prev: NIL,
    next: NIL,
};

/// A doubly linked list of entry slots, oldest first.
#[derive(Debug, Clone, Copy)]
struct List {
    head: u32,
    tail: u32,
    len: u32,
}

const EMPTY: List = List {
    head: NIL,
    tail: NIL,
    len: 0,
};

/// Which of an entry's two lists: its segment's, or its address's within that segment.
#[derive(Debug, Clone, Copy)]
enum Chain {
    Segment,
    Address,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    agent: u64,
    /// Slot of its address.
    address: u32,
    /// When it was last admitted (probation: first seen, or last renewed there).
    since: Nanos,
    until: Nanos,
    /// [`PROBATION`] or [`PROTECTED`] (a byte: the entry packs into 48).
    segment: u8,
    in_segment: Links,
    in_address: Links,
}

impl Entry {
    fn segment(&self) -> usize {
        usize::from(self.segment)
    }

    fn links(&mut self, chain: Chain) -> &mut Links {
        match chain {
            Chain::Segment => &mut self.in_segment,
            Chain::Address => &mut self.in_address,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Address {
    digest: u64,
    /// Its ids in each segment, oldest first.
    lists: [List; 2],
}

impl Address {
    fn held(&self) -> u32 {
        self.lists[PROBATION].len + self.lists[PROTECTED].len
    }
}

/// Why an id gave way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    Expired,
    Stale,
    Share,
}

struct Table {
    capacity: usize,
    protected_capacity: usize,
    entries: Vec<Entry>,
    free_entries: Vec<u32>,
    index: DigestMap,
    addresses: Vec<Address>,
    free_addresses: Vec<u32>,
    address_index: DigestMap,
    /// Each segment's ids, oldest first: by first sighting in probation, by last admission in
    /// the protected segment.
    lists: [List; 2],
    /// Each segment's addresses by how many ids they hold there: `(count, address slot)`.
    heaviest: [BTreeSet<(u32, u32)>; 2],
    counts: Counts,
}

impl Table {
    fn new(capacity: usize) -> Self {
        // Slots are u32 and NIL is taken.
        let capacity = capacity.clamp(1, NIL as usize - 1);
        let (protected, _) = split(capacity as u64);
        Self {
            capacity,
            protected_capacity: protected as usize,
            entries: Vec::new(),
            free_entries: Vec::new(),
            index: DigestMap::default(),
            addresses: Vec::new(),
            free_addresses: Vec::new(),
            address_index: DigestMap::default(),
            lists: [EMPTY; 2],
            heaviest: [BTreeSet::new(), BTreeSet::new()],
            counts: Counts::default(),
        }
    }

    /// The slot of the id if it is held, unexpired, at this address.
    fn live(&self, at: AgentAt, now: Nanos) -> Option<u32> {
        let &slot = self.index.get(&at.agent)?;
        let e = &self.entries[slot as usize];
        (e.until > now && self.addresses[e.address as usize].digest == at.address).then_some(slot)
    }

    fn admitted(&mut self, at: AgentAt, now: Nanos, until: Nanos, max_known: usize, grace: Nanos) {
        if let Some(&slot) = self.index.get(&at.agent) {
            let e = &self.entries[slot as usize];
            if e.until > now && self.addresses[e.address as usize].digest == at.address {
                if e.segment() == PROTECTED {
                    self.renew(slot, now, until);
                } else {
                    self.promote(slot, now, until, grace);
                }
                return;
            }
            // Expired (or, against odds of 2^-64, another address's id): start again.
            self.remove(slot);
        }
        self.insert(at, now, until, max_known, grace);
    }

    /// A new id: a first sighting, if it has a place.
    fn insert(&mut self, at: AgentAt, now: Nanos, until: Nanos, max_known: usize, grace: Nanos) {
        if let Some(&a) = self.address_index.get(&at.address) {
            if self.addresses[a as usize].held() as usize >= max_known
                && !self.room_at(a, now, grace)
            {
                self.counts.not_remembered_address += 1;
                return;
            }
        }
        if self.index.len() >= self.capacity {
            // Ids it holds in probation now (its address may have given one way above).
            let (address, x) = match self.address_index.get(&at.address) {
                Some(&a) => (Some(a), self.addresses[a as usize].lists[PROBATION].len),
                None => (None, 0),
            };
            if !self.room_for_first_sighting(now, grace, address, x) {
                self.counts.not_remembered_table += 1;
                return;
            }
        }
        let a = match self.address_index.get(&at.address) {
            Some(&a) => a,
            None => self.new_address(at.address),
        };
        let entry = Entry {
            agent: at.agent,
            address: a,
            since: now,
            until,
            segment: PROBATION as u8,
            in_segment: UNLINKED,
            in_address: UNLINKED,
        };
        let slot = match self.free_entries.pop() {
            Some(s) => {
                self.entries[s as usize] = entry;
                s
            }
            None => {
                self.entries.push(entry);
                (self.entries.len() - 1) as u32
            }
        };
        self.index.insert(at.agent, slot);
        self.link(slot);
    }

    /// A known id admitted again, and kept in its segment: the most recently seen there. No
    /// count changes, so the ordered set of addresses is left alone.
    fn renew(&mut self, slot: u32, now: Nanos, until: Nanos) {
        let e = &mut self.entries[slot as usize];
        e.since = now;
        e.until = until;
        let (seg, a) = (e.segment(), e.address as usize);
        let address = &mut self.addresses[a].lists[seg];
        for (list, chain) in [
            (&mut self.lists[seg], Chain::Segment),
            (address, Chain::Address),
        ] {
            if list.tail != slot {
                take_out(&mut self.entries, list, slot, chain);
                push_back(&mut self.entries, list, slot, chain);
            }
        }
    }

    /// A first sighting admitted again: protected if there is room or someone gives way, else
    /// renewed in probation.
    fn promote(&mut self, slot: u32, now: Nanos, until: Nanos, grace: Nanos) {
        let a = self.entries[slot as usize].address;
        if self.lists[PROTECTED].len as usize >= self.protected_capacity {
            let x = self.addresses[a as usize].lists[PROTECTED].len;
            if !self.room_for_protected(now, grace, a, x) {
                self.counts.not_promoted += 1;
                self.renew(slot, now, until);
                return;
            }
        }
        self.unlink(slot);
        let e = &mut self.entries[slot as usize];
        e.segment = PROTECTED as u8;
        e.since = now;
        e.until = until;
        self.link(slot);
    }

    /// Make room for a first sighting of the address `address` (holding `x` of them): an
    /// expired id, a first sighting past its grace, or the heaviest address's oldest.
    fn room_for_first_sighting(
        &mut self,
        now: Nanos,
        grace: Nanos,
        address: Option<u32>,
        x: u32,
    ) -> bool {
        for seg in [PROTECTED, PROBATION] {
            let h = self.lists[seg].head;
            if h != NIL && self.entries[h as usize].until <= now {
                self.evict(h, Why::Expired);
                return true;
            }
        }
        let h = self.lists[PROBATION].head;
        if h != NIL && self.entries[h as usize].since.saturating_add(grace) <= now {
            self.evict(h, Why::Stale);
            return true;
        }
        self.give_way(PROBATION, address, x)
    }

    /// Make room for a promotion of an id of address `a` (holding `x` protected ids).
    fn room_for_protected(&mut self, now: Nanos, grace: Nanos, a: u32, x: u32) -> bool {
        let h = self.lists[PROTECTED].head;
        if h != NIL {
            let e = &self.entries[h as usize];
            if e.until <= now {
                self.evict(h, Why::Expired);
                return true;
            }
            if e.since.saturating_add(grace) <= now {
                self.evict(h, Why::Stale);
                return true;
            }
        }
        self.give_way(PROTECTED, Some(a), x)
    }

    /// The address holding the most ids of `seg` gives its oldest, if it holds at least two
    /// more than `x`, what the address `to` holds there.
    fn give_way(&mut self, seg: usize, to: Option<u32>, x: u32) -> bool {
        match self.heaviest[seg].last() {
            Some(&(count, y)) if Some(y) != to && count > x.saturating_add(1) => {
                let victim = self.addresses[y as usize].lists[seg].head;
                self.evict(victim, Why::Share);
                true
            }
            _ => false,
        }
    }

    /// Make room at a full address: its oldest first sighting past its grace, or an expired id.
    fn room_at(&mut self, a: u32, now: Nanos, grace: Nanos) -> bool {
        let lists = self.addresses[a as usize].lists;
        let h = lists[PROBATION].head;
        if h != NIL {
            let e = &self.entries[h as usize];
            if e.until <= now {
                self.evict(h, Why::Expired);
                return true;
            }
            if e.since.saturating_add(grace) <= now {
                self.evict(h, Why::Stale);
                return true;
            }
        }
        let h = lists[PROTECTED].head;
        if h != NIL && self.entries[h as usize].until <= now {
            self.evict(h, Why::Expired);
            return true;
        }
        false
    }

    fn evict(&mut self, slot: u32, why: Why) {
        let seg = self.entries[slot as usize].segment();
        match why {
            Why::Expired => {}
            Why::Stale => self.counts.evicted_stale[seg] += 1,
            Why::Share => self.counts.evicted_share[seg] += 1,
        }
        self.remove(slot);
    }

    /// Drop an id, and its address with its last id.
    fn remove(&mut self, slot: u32) {
        self.unlink(slot);
        let e = self.entries[slot as usize];
        self.index.remove(&e.agent);
        self.free_entries.push(slot);
        let address = self.addresses[e.address as usize];
        if address.held() == 0 {
            self.address_index.remove(&address.digest);
            self.free_addresses.push(e.address);
        }
    }

    fn new_address(&mut self, digest: u64) -> u32 {
        let address = Address {
            digest,
            lists: [EMPTY; 2],
        };
        let a = match self.free_addresses.pop() {
            Some(a) => {
                self.addresses[a as usize] = address;
                a
            }
            None => {
                self.addresses.push(address);
                (self.addresses.len() - 1) as u32
            }
        };
        self.address_index.insert(digest, a);
        a
    }

    /// Put an entry at the tail of its segment's list and of its address's.
    fn link(&mut self, slot: u32) {
        let e = self.entries[slot as usize];
        let (seg, a) = (e.segment(), e.address as usize);
        let before = self.addresses[a].lists[seg].len;
        push_back(
            &mut self.entries,
            &mut self.lists[seg],
            slot,
            Chain::Segment,
        );
        push_back(
            &mut self.entries,
            &mut self.addresses[a].lists[seg],
            slot,
            Chain::Address,
        );
        self.recount(seg, e.address, before);
    }

    /// Take an entry out of both its lists.
    fn unlink(&mut self, slot: u32) {
        let e = self.entries[slot as usize];
        let (seg, a) = (e.segment(), e.address as usize);
        let before = self.addresses[a].lists[seg].len;
        take_out(
            &mut self.entries,
            &mut self.lists[seg],
            slot,
            Chain::Segment,
        );
        take_out(
            &mut self.entries,
            &mut self.addresses[a].lists[seg],
            slot,
            Chain::Address,
        );
        self.recount(seg, e.address, before);
    }

    /// Keep the ordered set of address counts in step with one address's count.
    fn recount(&mut self, seg: usize, a: u32, before: u32) {
        let after = self.addresses[a as usize].lists[seg].len;
        if before == after {
            return;
        }
        if before > 0 {
            self.heaviest[seg].remove(&(before, a));
        }
        if after > 0 {
            self.heaviest[seg].insert((after, a));
        }
    }
}

fn push_back(entries: &mut [Entry], list: &mut List, slot: u32, chain: Chain) {
    let tail = list.tail;
    *entries[slot as usize].links(chain) = Links {
        prev: tail,
        next: NIL,
    };
    if tail == NIL {
        list.head = slot;
    } else {
        entries[tail as usize].links(chain).next = slot;
    }
    list.tail = slot;
    list.len += 1;
}

fn take_out(entries: &mut [Entry], list: &mut List, slot: u32, chain: Chain) {
    let Links { prev, next } = *entries[slot as usize].links(chain);
    if prev == NIL {
        list.head = next;
    } else {
        entries[prev as usize].links(chain).next = next;
    }
    if next == NIL {
        list.tail = prev;
    } else {
        entries[next as usize].links(chain).prev = prev;
    }
    *entries[slot as usize].links(chain) = UNLINKED;
    list.len -= 1;
}

#[cfg(test)]
mod tests;
