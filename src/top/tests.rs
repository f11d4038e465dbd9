use super::*;

const MIN: u64 = MINUTE_NS;

fn key(limiter: &str, who: &str) -> BucketKey {
    BucketKey::new(Arc::from(limiter), who)
}

fn label(who: &str) -> Label {
    Label::new(who.to_owned(), Some(who.to_owned()))
}

fn hit(t: &TopTalkers, limiter: &str, who: &str, refused: bool, now: u64) {
    t.record(
        &Arc::from(limiter),
        &key(limiter, who),
        refused,
        now,
        || Seed::Text(Arc::from(who), Some(Arc::from(who))),
    );
}

#[test]
fn counts_are_exact_until_a_sketch_is_full() {
    let t = TopTalkers::default();
    let now = 1_000 * MIN + 5;
    for _ in 0..37 {
        hit(&t, "api-key", "203.0.113.7", true, now);
    }
    for _ in 0..5 {
        hit(&t, "api-key", "198.51.100.9", true, now);
    }
    for _ in 0..3 {
        hit(&t, "api-key", "192.0.2.1", false, now);
    }
    let top = t.top(now, 5, 10);
    assert_eq!(top.len(), 1);
    let r = &top[0].refused;
    assert_eq!(r.len(), 2);
    assert_eq!(
        (r[0].label.principal.as_str(), r[0].count, r[0].error),
        ("203.0.113.7", 37, 0)
    );
    assert_eq!(
        (r[1].label.principal.as_str(), r[1].count, r[1].error),
        ("198.51.100.9", 5, 0)
    );
    let q = &top[0].requests;
    assert_eq!(
        q.iter().map(|r| r.count).collect::<Vec<_>>(),
        vec![37, 5, 3]
    );
    assert_eq!(top[0].refused_absent_bound, 0);
}

#[test]
fn windows_take_only_their_minutes_and_old_minutes_are_dropped() {
    let t = TopTalkers::default();
    let start = 2_000 * MIN;
    for m in 0..20u64 {
        hit(&t, "ui", "a", true, start + m * MIN);
    }
    let now = start + 19 * MIN;
    let count = |w| t.top(now, w, 5)[0].refused[0].count;
    assert_eq!(count(1), 1);
    assert_eq!(count(5), 5);
    assert_eq!(count(15), 15, "the ring holds 15 minutes, not 20");
    // A quarter of an hour later nothing is left.
    assert!(t.top(now + 15 * MIN, 15, 5)[0].refused.is_empty());
}

#[test]
fn a_flood_of_fresh_buckets_keeps_memory_bounded_and_the_heavy_hitter_on_top() {
    let t = TopTalkers::default();
    let now = 3_000 * MIN;
    for i in 0..20_000u32 {
        hit(
            &t,
            "agent-ip",
            &format!("10.0.{}.{}", i / 256, i % 256),
            true,
            now,
        );
        if i % 10 == 0 {
            hit(&t, "agent-ip", "203.0.113.66", true, now);
        }
    }
    let top = t.top(now, 1, 3);
    let first = &top[0].refused[0];
    assert_eq!(first.label.principal, "203.0.113.66");
    // 2 000 true refusals; the sketch may overcount by its error, never undercount.
    assert!(
        first.count >= 2_000 && first.count - first.error <= 2_000,
        "{first:?}"
    );
    // Its error is at most its stripe's refusals in the minute over a stripe's capacity.
    let stripe_of = |who: &str| usize::from(key("agent-ip", who).digest[15]) % STRIPES;
    let heavy = stripe_of("203.0.113.66");
    let stripe_total = 2_000
        + (0..20_000u32)
            .filter(|i| stripe_of(&format!("10.0.{}.{}", i / 256, i % 256)) == heavy)
            .count() as u64;
    assert!(
        first.error <= stripe_total / STRIPE_CAPACITY as u64 + 1,
        "{first:?} {stripe_total}"
    );
    let ring = t.ring(&Arc::from("agent-ip"));
    for stripe in &ring.stripes {
        let slots = stripe.0.lock();
        assert!(slots
            .iter()
            .all(|s| s.refusals.rows.len() <= STRIPE_CAPACITY));
    }
    assert!(
        top[0].refused_absent_bound > 0,
        "the sketch says it overflowed"
    );
}

#[test]
fn labels_are_cut_to_their_cap_on_a_character_boundary() {
    let l = Label::new("é".repeat(200), None);
    assert!(l.principal.len() <= MAX_LABEL);
    assert!(l.principal.chars().all(|c| c == 'é'));
}

#[test]
fn instances_sum_by_bucket_and_a_missing_row_adds_the_absent_bound() {
    let row = |b: &str, c: u64| Row {
        bucket: format!("api-key:{b}"),
        label: label(b),
        count: c,
        error: 0,
    };
    let one = vec![LimiterTop {
        limiter: "api-key".into(),
        refused: vec![row("a", 30), row("b", 4)],
        requests: vec![],
        refused_absent_bound: 0,
        requests_absent_bound: 0,
    }];
    let two = vec![LimiterTop {
        limiter: "api-key".into(),
        refused: vec![row("a", 7), row("c", 3)],
        requests: vec![],
        refused_absent_bound: 2,
        requests_absent_bound: 0,
    }];
    let merged = merge_instances(&[one, two], 10);
    let r = &merged[0].refused;
    assert_eq!(
        (r[0].bucket.as_str(), r[0].count, r[0].error),
        ("api-key:a", 37, 0)
    );
    assert_eq!(
        (r[1].bucket.as_str(), r[1].count, r[1].error),
        ("api-key:b", 4, 2)
    );
    assert_eq!(
        (r[2].bucket.as_str(), r[2].count, r[2].error),
        ("api-key:c", 3, 0)
    );
}

#[test]
fn a_seed_names_a_secret_by_the_bucket_and_keeps_no_value() {
    use crate::keys::{KeyKind, Principal};
    let p = Principal {
        ip: "203.0.113.7",
        agent_id: Some("host-secret-17"),
        credential: Some("c0ffee"),
        ..Principal::default()
    };
    let ip: std::net::IpAddr = "203.0.113.7".parse().unwrap();
    let s = Seed::of(&KeyKind::IpAgent, &p, ip, 56);
    assert!(!format!("{s:?}").contains("host-secret"), "{s:?}");
    assert_eq!(
        s.label("1f2e3d4c5b6a"),
        ("agent #1f2e3d4c5b6a at 203.0.113.7".to_owned(), None)
    );
    let s = Seed::of(&KeyKind::Credential, &p, ip, 56);
    assert_eq!(s.label("ab").0, "credential #ab");
    // An address-keyed bucket names its address (an IPv6 client by its /56).
    let v6: std::net::IpAddr = "2001:db8:abcd:12ff::1".parse().unwrap();
    let s = Seed::of(&KeyKind::Ip, &Principal::default(), v6, 56);
    let (who, address) = s.label("00");
    assert_eq!(who, "2001:db8:abcd:1200::/56");
    assert_eq!(address.as_deref(), Some("2001:db8:abcd:1200::/56"));
    // A verified user is no secret: named as such.
    let u = Principal {
        user: Some("alice"),
        ..Principal::default()
    };
    assert_eq!(
        Seed::of(&KeyKind::UserOrIp, &u, ip, 56).label("00").0,
        "user alice"
    );
}

#[test]
fn workers_counting_at_once_lose_nothing_and_every_stripe_is_listed() {
    let t = TopTalkers::default();
    let now = 4_000 * MIN;
    // 64 buckets over 8 stripes: none holds 32, so every count is exact.
    let who: Vec<String> = (0..64).map(|i| format!("198.51.100.{i}")).collect();
    let stripes: std::collections::BTreeSet<usize> = who
        .iter()
        .map(|w| usize::from(key("api-key", w).digest[15]) % STRIPES)
        .collect();
    assert!(stripes.len() > 1, "the buckets fall in several stripes");
    std::thread::scope(|s| {
        for worker in 0..4 {
            let (t, who) = (&t, &who);
            s.spawn(move || {
                for i in 0..6_400usize {
                    hit(
                        t,
                        "api-key",
                        &who[(i + worker) % who.len()],
                        i % 2 == 0,
                        now,
                    );
                }
            });
        }
    });
    let top = t.top(now, 1, MAX_ROWS);
    let requests = &top[0].requests;
    assert_eq!(requests.len(), 64);
    assert!(
        requests.iter().all(|r| r.count == 400 && r.error == 0),
        "{requests:?}"
    );
    assert_eq!(top[0].requests_absent_bound, 0);
    assert_eq!(top[0].refused.iter().map(|r| r.count).sum::<u64>(), 12_800);
    assert_eq!(t.counts(), vec![(Arc::from("api-key"), 128, 0)]);
}

#[test]
fn labels_show_direction_controls_and_zero_width_characters_escaped() {
    let l = Label::new(
        "user \u{202e}nimda\u{200b}x\u{2066}\u{feff}\u{61c}\u{200f}\u{1b}[2J".to_owned(),
        None,
    );
    assert_eq!(
        l.principal,
        "user \\u{202e}nimda\\u{200b}x\\u{2066}\\u{feff}\\u{61c}\\u{200f}\\u{1b}[2J"
    );
    for c in ('\u{202a}'..='\u{202e}')
        .chain('\u{2066}'..='\u{2069}')
        .chain(['\u{200e}', '\u{200f}', '\u{61c}', '\u{2060}', '\u{feff}'])
        .chain('\u{200b}'..='\u{200d}')
    {
        assert!(
            !Label::new(format!("a{c}b"), None).principal.contains(c),
            "{c:?}"
        );
    }
    // Text that needs nothing is kept as it is.
    assert_eq!(
        Label::new("user élodie".into(), None).principal,
        "user élodie"
    );
}
