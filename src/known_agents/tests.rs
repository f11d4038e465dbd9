use super::*;
use crate::config::FleetConfig;

const S: Nanos = 1_000_000_000;
/// The default fleet's grace: twice its 60 s heartbeat.
const GRACE: Nanos = 120 * S;
const KNOWN_FOR: Nanos = 900 * S;

fn table(capacity: usize) -> KnownAgents {
    KnownAgents::new(capacity, GRACE)
}

fn admit(t: &KnownAgents, address: &str, agent: &str, now: Nanos, max_known: usize) {
    t.admitted(t.at("l", address, None, agent), now, KNOWN_FOR, max_known);
    t.table.lock().assert_consistent();
}

fn known(t: &KnownAgents, address: &str, agent: &str, now: Nanos) -> bool {
    t.seen(t.at("l", address, None, agent), now) == Seen::Known
}

/// How many of `agents` ids of `site` at `address` are known at `now`.
fn known_of(t: &KnownAgents, address: &str, site: &str, agents: usize, now: Nanos) -> usize {
    (0..agents)
        .filter(|i| known(t, address, &format!("{site}-{i}"), now))
        .count()
}

/// Every id of a site seen once (`round` 0) or again, all at `now`.
fn site_round(t: &KnownAgents, address: &str, site: &str, agents: usize, now: Nanos) {
    for i in 0..agents {
        admit(t, address, &format!("{site}-{i}"), now, 500);
    }
}

impl Table {
    /// Every list, count and index agrees with every other, and the bounds hold.
    fn assert_consistent(&self) {
        assert!(self.index.len() <= self.capacity, "past its bound");
        assert!(self.lists[PROTECTED].len as usize <= self.protected_capacity);
        let mut seen = 0;
        for seg in [PROBATION, PROTECTED] {
            let mut n = 0;
            let mut prev = NIL;
            let mut at = self.lists[seg].head;
            let mut since = 0;
            while at != NIL {
                let e = &self.entries[at as usize];
                assert_eq!(e.segment(), seg);
                assert_eq!(e.in_segment.prev, prev);
                assert!(e.since >= since, "a segment's list is oldest first");
                since = e.since;
                assert_eq!(self.index.get(&e.agent), Some(&at));
                prev = at;
                at = e.in_segment.next;
                n += 1;
            }
            assert_eq!(self.lists[seg].tail, prev);
            assert_eq!(self.lists[seg].len, n);
            seen += n;
            let mut by_address = BTreeSet::new();
            for (&digest, &a) in &self.address_index {
                let address = &self.addresses[a as usize];
                assert_eq!(address.digest, digest);
                assert!(address.held() > 0, "an address with no id is dropped");
                let list = address.lists[seg];
                let (mut m, mut prev, mut at) = (0, NIL, list.head);
                while at != NIL {
                    let e = &self.entries[at as usize];
                    assert_eq!((e.address, e.segment()), (a, seg));
                    assert_eq!(e.in_address.prev, prev);
                    prev = at;
                    at = e.in_address.next;
                    m += 1;
                }
                assert_eq!((list.len, list.tail), (m, prev));
                if m > 0 {
                    by_address.insert((m, a));
                }
            }
            assert_eq!(by_address, self.heaviest[seg]);
        }
        assert_eq!(seen as usize, self.index.len());
    }
}

#[test]
fn an_admitted_id_is_known_until_it_expires_and_each_admission_renews_it() {
    let t = table(1000);
    let a = t.at("agent-ip", "198.51.100.7", None, "agent-1");
    assert_eq!(t.seen(a, S), Seen::New);
    t.admitted(a, S, 60 * S, 10);
    assert_eq!(t.seen(a, 30 * S), Seen::Known);
    t.admitted(a, 50 * S, 60 * S, 10);
    assert_eq!(t.seen(a, 100 * S), Seen::Known, "renewed at 50 s");
    assert_eq!(t.seen(a, 110 * S), Seen::New);
    // Expired, it is a new id again: a first sighting.
    t.admitted(a, 120 * S, 60 * S, 10);
    let c = t.counts();
    assert_eq!((c.probation, c.protected), (1, 0));
    t.table.lock().assert_consistent();
}

#[test]
fn ids_are_per_address_and_per_limiter() {
    let t = table(1000);
    t.admitted(t.at("agent-ip", "198.51.100.7", None, "a"), 0, 60 * S, 10);
    let seen = |l, ip| t.seen(t.at(l, ip, None, "a"), S);
    assert_eq!(seen("agent-ip", "198.51.100.8"), Seen::New);
    assert_eq!(seen("other", "198.51.100.7"), Seen::New);
    assert_eq!(seen("agent-ip", "198.51.100.7"), Seen::Known);
}

#[test]
fn the_key_inside_an_address_tells_ids_apart_but_shares_the_address() {
    let t = table(1000);
    let v56 = "2001:db8:77:ab00::/56";
    let a = t.at("l", v56, Some("2001:db8:77:ab01::/64"), "x");
    let b = t.at("l", v56, Some("2001:db8:77:ab02::/64"), "x");
    assert_eq!(a.address, b.address, "one /56, one address");
    assert_ne!(a.agent, b.agent, "an id is known at its own /64");
    t.admitted(a, 0, KNOWN_FOR, 1);
    t.admitted(b, 0, KNOWN_FOR, 1);
    assert_eq!(t.seen(a, S), Seen::Known);
    assert_eq!(t.seen(b, S), Seen::New, "max_known = 1 for the whole /56");
    assert_eq!(t.counts().not_remembered_address, 1);
}

#[test]
fn a_second_admission_promotes_and_the_protected_half_is_bounded() {
    let t = table(10);
    for i in 0..8 {
        admit(&t, &format!("10.0.0.{i}"), "a", 0, 500);
    }
    let c = t.counts();
    assert_eq!((c.probation, c.protected), (8, 0));
    for i in 0..8 {
        admit(&t, &format!("10.0.0.{i}"), "a", S, 500);
    }
    let c = t.counts();
    assert_eq!((c.protected_capacity, c.protected, c.probation), (5, 5, 3));
    // Every address holds one protected id: none has two more than another, so the last three
    // stay first sightings, renewed there, and known.
    assert_eq!(c.not_promoted, 3);
    for i in 0..8 {
        assert!(known(&t, &format!("10.0.0.{i}"), "a", 2 * S));
    }
}

#[test]
fn first_sightings_never_evict_protected_ids() {
    let t = table(100);
    site_round(&t, "198.51.100.1", "site", 50, 0);
    site_round(&t, "198.51.100.1", "site", 50, 30 * S);
    assert_eq!(t.counts().protected, 50);
    // A flood of fresh ids from a thousand addresses, all within their grace.
    for n in 0..1000 {
        admit(&t, &format!("2001:db8:{n:x}::/56"), "flood", 31 * S, 500);
    }
    let c = t.counts();
    assert_eq!((c.protected, c.probation), (50, 50));
    assert_eq!(known_of(&t, "198.51.100.1", "site", 50, 32 * S), 50);
    assert_eq!(c.evicted_stale, [0, 0]);
    assert_eq!(c.evicted_share[PROTECTED], 0);
}

#[test]
fn a_flood_past_its_grace_gives_way_to_a_new_site() {
    // The table of 2 000 filled by 160 addresses minting 30 ids each, seen once.
    let t = table(2000);
    for n in 0..160 {
        for i in 0..30 {
            admit(
                &t,
                &format!("2001:db8:{n:x}::/56"),
                &format!("f{i}"),
                0,
                500,
            );
        }
    }
    let c = t.counts();
    assert_eq!(c.probation, 2000);
    assert_eq!(
        c.not_remembered_table + c.evicted_share[PROBATION] + c.evicted_stale[PROBATION],
        2800
    );
    // A new site of 250 arrives once the flood is past its grace, while the flood goes on
    // slowly; its second round promotes every agent.
    let later = GRACE + S;
    site_round(&t, "198.51.100.20", "new", 250, later);
    for n in 0..100 {
        admit(&t, &format!("2001:db8:{n:x}::/56"), "more", later + S, 500);
    }
    assert_eq!(
        known_of(&t, "198.51.100.20", "new", 250, later + 2 * S),
        250
    );
    site_round(&t, "198.51.100.20", "new", 250, later + 30 * S);
    let c = t.counts();
    assert_eq!(c.protected, 250);
    assert_eq!(c.not_promoted, 0);
    assert!(c.evicted_stale[PROBATION] >= 350, "{c:?}");
}

#[test]
fn a_flood_still_minting_gives_way_from_its_heaviest_addresses() {
    // Five addresses hold 400 first sightings each, within their grace: the table is full.
    let t = table(2000);
    for n in 0..5 {
        for i in 0..400 {
            admit(&t, &format!("203.0.113.{n}"), &format!("f{i}"), S, 500);
        }
    }
    assert_eq!(t.counts().probation, 2000);
    // The site arrives while they go on minting.
    for i in 0..250 {
        admit(&t, "198.51.100.30", &format!("site-{i}"), 2 * S, 500);
        admit(
            &t,
            &format!("203.0.113.{}", i % 5),
            &format!("g{i}"),
            2 * S,
            500,
        );
    }
    assert_eq!(known_of(&t, "198.51.100.30", "site", 250, 3 * S), 250);
    let c = t.counts();
    assert_eq!(c.evicted_share[PROBATION], 250);
    assert_eq!(
        c.not_remembered_table, 250,
        "the flood's own new ids find no place"
    );
    assert_eq!(c.evicted_stale, [0, 0]);
    // The heaviest gave way first: the five are level.
    let table = t.table.lock();
    let counts: Vec<u32> = table.heaviest[PROBATION].iter().map(|(n, _)| *n).collect();
    assert_eq!(counts, vec![250, 350, 350, 350, 350, 350]);
}

#[test]
fn beyond_its_bound_every_address_keeps_an_equal_share() {
    // 1 000 first sightings for 9 addresses minting within their grace: a site of 250 keeps
    // what an equal share gives it (`check` states the bound: 1000 / 250 - 1 = 3 others).
    let t = table(1000);
    for n in 0..8 {
        for i in 0..250 {
            admit(&t, &format!("203.0.113.{n}"), &format!("f{i}"), S, 500);
        }
    }
    site_round(&t, "198.51.100.30", "site", 250, 2 * S);
    let kept = known_of(&t, "198.51.100.30", "site", 250, 3 * S);
    assert_eq!(
        kept, 111,
        "an equal share of 1 000 among 9 addresses: 111, one of them 112"
    );
}

#[test]
fn a_promotion_takes_a_stale_place_first_then_the_heaviest_address_s() {
    let t = table(8);
    // Capacity 8: 4 protected places. Address A fills three, B one.
    for (ip, agent) in [("A", "a1"), ("A", "a2"), ("A", "a3"), ("B", "b1")] {
        admit(&t, ip, agent, 0, 500);
        admit(&t, ip, agent, S, 500);
    }
    assert_eq!(t.counts().protected, 4);
    // C's agent seen twice: A holds 3 > 0 + 1, so A's least recently seen gives way.
    admit(&t, "C", "c1", 2 * S, 500);
    admit(&t, "C", "c1", 3 * S, 500);
    assert!(!known(&t, "A", "a1", 4 * S));
    assert!(known(&t, "A", "a2", 4 * S) && known(&t, "C", "c1", 4 * S));
    assert_eq!(t.counts().evicted_share[PROTECTED], 1);
    // Later b1 alone is renewed; the others go unseen past the grace: the least recently
    // seen of them gives way, whoever holds the most.
    admit(&t, "B", "b1", GRACE, 500);
    admit(&t, "D", "d1", GRACE + S, 500);
    admit(&t, "D", "d1", GRACE + 2 * S, 500);
    assert!(!known(&t, "A", "a2", GRACE + 3 * S), "a2 was seen at 1 s");
    assert!(known(&t, "B", "b1", GRACE + 3 * S));
    assert_eq!(t.counts().evicted_stale[PROTECTED], 1);
    // With every address level (one protected id each) and seen within the grace, a
    // promotion waits in probation.
    let now = GRACE + 3 * S;
    for (ip, agent) in [("A", "a3"), ("B", "b1"), ("C", "c1"), ("D", "d1")] {
        admit(&t, ip, agent, now, 500);
    }
    let before = t.counts().not_promoted;
    admit(&t, "E", "e1", now + S, 500);
    admit(&t, "E", "e1", now + 2 * S, 500);
    assert_eq!(t.counts().not_promoted, before + 1);
    assert!(
        known(&t, "E", "e1", now + 3 * S),
        "still known, as a first sighting"
    );
    assert_eq!(t.counts().protected, 4);
}

#[test]
fn an_address_remembers_at_most_max_known_ids_and_makes_room_as_they_age() {
    let t = table(100_000);
    for i in 0..5 {
        admit(&t, "ip", &format!("a{i}"), 0, 5);
    }
    admit(&t, "ip", "a5", S, 5);
    assert!(!known(&t, "ip", "a5", 2 * S), "the address is full");
    assert_eq!(t.counts().not_remembered_address, 1);
    // A known id still renews (and is promoted) while the address is full.
    admit(&t, "ip", "a0", 30 * S, 5);
    assert_eq!(t.counts().protected, 1);
    // Past the grace its oldest first sighting gives way to a new one.
    admit(&t, "ip", "a5", GRACE + S, 5);
    assert!(known(&t, "ip", "a5", GRACE + 2 * S));
    assert!(!known(&t, "ip", "a1", GRACE + 2 * S));
    assert_eq!(t.held(), 5);
}

#[test]
fn an_address_is_not_held_to_a_shard_of_the_table() {
    // The table of 6 400 holds a site of 250 at one address: no shard of 100.
    let t = table(6400);
    site_round(&t, "198.51.100.40", "quiet", 250, 0);
    site_round(&t, "198.51.100.40", "quiet", 250, 30 * S);
    let c = t.counts();
    assert_eq!((c.protected, c.not_remembered_table), (250, 0));
}

#[test]
fn expired_ids_give_way_before_anything_else() {
    let t = table(4);
    for agent in ["a", "b"] {
        t.admitted(t.at("l", "A", None, agent), 0, 60 * S, 500);
        t.admitted(t.at("l", "A", None, agent), S, 60 * S, 500);
    }
    t.admitted(t.at("l", "B", None, "c"), S, 60 * S, 500);
    t.admitted(t.at("l", "B", None, "d"), S, 60 * S, 500);
    // Full: at 70 s every id has expired. The newcomers take expired places, uncounted as
    // evictions.
    for agent in ["e", "f", "g", "h"] {
        t.admitted(t.at("l", "C", None, agent), 70 * S, 60 * S, 500);
    }
    let c = t.counts();
    assert_eq!((c.probation, c.protected), (4, 0));
    assert_eq!(c.evicted_stale, [0, 0]);
    assert_eq!(c.evicted_share, [0, 0]);
    assert_eq!(c.not_remembered_table, 0);
    t.table.lock().assert_consistent();
}

#[test]
fn random_traffic_keeps_the_table_consistent_and_bounded() {
    // A seeded mix of sites, floods and returning agents over an hour of virtual time.
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let t = KnownAgents::new(500, 20 * S);
    let mut now = 0;
    for round in 0..40_000 {
        // Busy stretches, and now and then a quiet one longer than the grace.
        now += if round % 5_000 == 0 {
            30 * S
        } else {
            next() % (S / 50)
        };
        let n = next() % 40;
        let address = format!("a{n}");
        // Five addresses mint more ids than max_known.
        let agent = format!("id{}", next() % if n < 5 { 40 } else { 15 });
        let known_for = (60 + next() % 120) * S;
        t.admitted(t.at("l", &address, None, &agent), now, known_for, 20);
        let t = t.table.lock();
        assert!(t.index.len() <= 500);
        if next() % 64 == 0 {
            t.assert_consistent();
        }
    }
    t.table.lock().assert_consistent();
    let c = t.counts();
    assert!(c.protected > 0 && c.probation > 0, "{c:?}");
    for n in [
        c.evicted_share[PROBATION],
        c.evicted_stale[PROBATION],
        c.evicted_stale[PROTECTED],
        c.not_remembered_address,
        c.not_remembered_table,
    ] {
        assert!(n > 0, "every way out was taken: {c:?}");
    }
}

#[test]
fn a_raw_id_is_never_held() {
    let t = table(10);
    let a = t.at("l", "198.51.100.7", None, "secret-agent-id");
    t.admitted(a, 0, KNOWN_FOR, 5);
    let dbg = format!("{a:?} {t:?} {:?}", t.counts());
    assert!(!dbg.contains("secret-agent-id") && !dbg.contains("198.51.100.7"));
}

#[test]
fn the_grace_is_twice_the_longest_gap_and_the_split_leaves_half_for_first_sightings() {
    let mut f = FleetConfig::default();
    assert_eq!(grace(f.longest_gap_seconds()), 120 * S);
    let n = |n| std::num::NonZeroU64::new(n).expect("positive");
    f.poll_interval_seconds = n(300);
    assert_eq!(grace(f.longest_gap_seconds()), 600 * S);
    f.heartbeat_interval_seconds = n(u64::MAX);
    assert_eq!(grace(f.longest_gap_seconds()), Nanos::MAX);
    f.heartbeat_interval_seconds = n(1);
    f.poll_interval_seconds = n(1);
    assert_eq!(grace(f.longest_gap_seconds()), 2 * S);
    assert_eq!(grace(0), 2 * S, "at least one second");
    assert_eq!(split(100_000), (50_000, 50_000));
    assert_eq!(split(1), (0, 1));
    assert_eq!(split(7), (3, 4));
}

#[test]
fn an_id_costs_a_few_words() {
    assert_eq!(std::mem::size_of::<Entry>(), 48);
    assert_eq!(std::mem::size_of::<Address>(), 32);
}

#[test]
fn an_exported_table_is_rebuilt_in_another_process_with_its_segments_and_order() {
    let t = table(100);
    site_round(&t, "203.0.113.5", "site", 10, S);
    // Half the site seen again: promoted.
    site_round(&t, "203.0.113.5", "site", 5, 2 * S);
    admit(&t, "198.51.100.9", "lone", 3 * S, 500);
    let (key, kept) = t.export(4 * S);
    assert_eq!(kept.len(), 11);
    assert_eq!(kept.iter().filter(|k| k.protected).count(), 5);

    // Another process: another random key, an empty table, its own clock.
    let next = table(100);
    assert!(!known(&next, "203.0.113.5", "site-0", 4 * S));
    next.restore(key, &kept, 4 * S);
    next.table.lock().assert_consistent();
    assert_eq!(known_of(&next, "203.0.113.5", "site", 10, 4 * S), 10);
    assert!(known(&next, "198.51.100.9", "lone", 4 * S));
    assert!(
        !known(&next, "198.51.100.9", "site-0", 4 * S),
        "ids stay at their address"
    );
    let c = next.counts();
    assert_eq!((c.probation, c.protected), (6, 5));
    assert_eq!(
        next.export(4 * S).1,
        kept,
        "the same table, in the same order"
    );
    // Ids that expired before the restore are not taken.
    let later = table(100);
    later.restore(key, &kept, S + KNOWN_FOR + 1);
    assert_eq!(
        later.held(),
        6,
        "the ids seen again, and the lone one, are still known"
    );
    assert!(!known(&later, "203.0.113.5", "site-9", S + KNOWN_FOR + 1));
}
