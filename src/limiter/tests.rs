use super::*;

use proptest::prelude::*;

fn quota() -> impl Strategy<Value = Quota> {
    (
        1u32..=2_000,
        1u64..=7_200,
        prop_oneof![Just(Algorithm::Gcra), Just(Algorithm::FixedWindow)],
    )
        .prop_map(|(limit, secs, alg)| Quota::new(nonzero(limit), Duration::from_secs(secs), alg))
}

#[test]
fn an_answered_give_back_restores_the_budget_it_took() {
    for alg in [Algorithm::Gcra, Algorithm::FixedWindow] {
        let q = Quota::new(nonzero(3), Duration::from_secs(60), alg);
        let mut st = None;
        // Ten requests whose answers are all given back 100 ms later: all allowed.
        for i in 0..10 {
            let now = i * S;
            let (v, new) = decide(&q, st, now);
            assert!(v.allowed, "{alg:?} request {i}");
            let later = now + S / 10;
            st = new.and_then(|s| {
                give_back_answered(&q, s, NonZeroU32::MIN, v.reset_after_ns - S / 10, later)
                    .or(Some(s))
            });
        }
        // Three kept, then the fourth is refused.
        for i in 0..3 {
            let (v, new) = decide(&q, st, 20 * S + i);
            assert!(v.allowed, "{alg:?} kept {i}");
            st = new;
        }
        assert!(!decide(&q, st, 20 * S + 5).0.allowed, "{alg:?}");
    }
}

#[test]
fn a_charge_already_refilled_or_a_closed_window_gives_nothing_back() {
    let g = Quota::new(nonzero(3), Duration::from_secs(60), Algorithm::Gcra);
    // Admitted at 0 (reset 20 s); answered 30 s later: the charge has refilled.
    let (v, s) = decide(&g, None, 0);
    let s = s.unwrap();
    assert_eq!(
        give_back_answered(
            &g,
            s,
            NonZeroU32::MIN,
            v.reset_after_ns.saturating_sub(30 * S),
            30 * S
        ),
        None
    );
    // Others used the bucket meanwhile: only what is left of this charge comes back.
    let busy = State::Gcra { tat: 50 * S };
    assert_eq!(
        give_back_answered(&g, busy, NonZeroU32::MIN, 5 * S, 15 * S),
        Some(State::Gcra { tat: 45 * S })
    );
    let f = Quota::new(nonzero(3), Duration::from_secs(60), Algorithm::FixedWindow);
    // The window that counted the request closed; a new one (ends at 130 s) does not pay.
    let next = State::FixedWindow {
        ends_at: 130 * S,
        count: 2,
    };
    assert_eq!(
        give_back_answered(&f, next, NonZeroU32::MIN, 0, 70 * S),
        None
    );
    assert_eq!(
        give_back_answered(&f, next, NonZeroU32::MIN, 1, 70 * S),
        None,
        "a window away"
    );
    assert_eq!(
        give_back_answered(&f, next, NonZeroU32::MIN, 60 * S, 70 * S),
        Some(State::FixedWindow {
            ends_at: 130 * S,
            count: 1
        })
    );
    let empty = State::FixedWindow {
        ends_at: 130 * S,
        count: 0,
    };
    assert_eq!(
        give_back_answered(&f, empty, NonZeroU32::MIN, 60 * S, 70 * S),
        None
    );
}

/// A bucket after `hits` requests at the given offsets (in ms) from 0.
fn run(q: &Quota, hits: &[u64]) -> (Option<State>, Nanos) {
    let mut st = None;
    let mut now = 0;
    for dt in hits {
        now += dt * 1_000_000;
        if let (_, Some(s)) = decide(q, st, now) {
            st = Some(s);
        }
    }
    (st, now)
}

proptest! {
    #[test]
    fn remaining_never_exceeds_the_limit_and_waits_are_honest(
        q in quota(),
        hits in proptest::collection::vec(0u64..5_000, 0..300),
        dt in 0u64..10_000,
    ) {
        let (st, now) = run(&q, &hits);
        let now = now + dt * 1_000_000;
        let (v, new) = decide(&q, st, now);
        prop_assert!(v.remaining <= v.limit);
        prop_assert_eq!(v.limit, q.limit());
        prop_assert!(v.reset_after_ns <= q.window_ns().max(q.emission_interval_ns()) * 2);
        if v.allowed {
            prop_assert_eq!(v.retry_after_ns, 0);
            prop_assert!(new.is_some(), "an allowed request consumes");
        } else {
            prop_assert!(v.retry_after_ns > 0, "a refusal always has a wait");
            prop_assert_eq!(v.remaining, 0);
            // Waiting exactly the refusal's wait is enough.
            let (later, _) = decide(&q, st, now + v.retry_after_ns);
            prop_assert!(later.allowed);
        }
    }

    #[test]
    fn a_refusal_leaves_the_state_unchanged(
        q in quota(),
        hits in proptest::collection::vec(0u64..50, 0..300),
    ) {
        let (st, now) = run(&q, &hits);
        let (v, new) = decide(&q, st, now);
        if !v.allowed {
            prop_assert_eq!(new, None);
        }
    }

    #[test]
    fn giving_back_undoes_an_allow(
        q in quota(),
        hits in proptest::collection::vec(0u64..2_000, 0..200),
        later in 0u64..20_000,
    ) {
        let (before, now) = run(&q, &hits);
        let (v, after) = decide(&q, before, now);
        prop_assume!(v.allowed);
        let after = after.expect("an allowed request writes a state");
        let back = give_back(&q, after, NonZeroU32::MIN);
        // From now on the given-back bucket decides exactly as if the request never came.
        let t = now + later * 1_000_000;
        let (a, _) = decide(&q, Some(back), t);
        let (b, _) = decide(&q, before, t);
        prop_assert_eq!((a.allowed, a.remaining), (b.allowed, b.remaining));
        if q.algorithm == Algorithm::Gcra {
            prop_assert_eq!(a, b);
        }
    }
}

/// A bucket after requests at the given offsets (in ms) from 0, each of the given cost.
fn run_costly(q: &Quota, hits: &[(u64, u32)]) -> (Option<State>, Nanos) {
    let mut st = None;
    let mut now = 0;
    for &(dt, units) in hits {
        now += dt * 1_000_000;
        let units = NonZeroU32::new(units.min(q.limit())).unwrap_or(NonZeroU32::MIN);
        if let (_, Some(s)) = decide_units(q, st, now, units) {
            st = Some(s);
        }
    }
    (st, now)
}

/// Units the bucket holds at `now`: what a one-unit request would leave, plus itself.
fn capacity(q: &Quota, st: Option<State>, now: Nanos) -> u32 {
    let (v, _) = decide(q, st, now);
    if v.allowed {
        v.remaining + 1
    } else {
        0
    }
}

/// An allowed request of a cost the bucket holds (`pick` of what it holds), after `hits`.
struct CostlyAllow {
    before: Option<State>,
    now: Nanos,
    units: NonZeroU32,
    verdict: Verdict,
    after: State,
}

fn costly_allow(q: &Quota, hits: &[(u64, u32)], pick: f64) -> Option<CostlyAllow> {
    let (before, now) = run_costly(q, hits);
    let held = capacity(q, before, now);
    let units = NonZeroU32::new(1 + (held.checked_sub(1)? as f64 * pick) as u32)?;
    let (verdict, after) = decide_units(q, before, now, units);
    Some(CostlyAllow {
        before,
        now,
        units,
        verdict,
        after: after?,
    })
}

/// A quota and a history of costly requests, each cost up to the quota's limit.
fn costly() -> impl Strategy<Value = (Quota, Vec<(u64, u32)>, u32)> {
    quota().prop_flat_map(|q| {
        let l = q.limit();
        (
            Just(q),
            proptest::collection::vec((0u64..3_000, 1..=l), 0..200),
            1..=l,
        )
    })
}

proptest! {
    #[test]
    fn a_costly_request_is_all_or_nothing((q, hits, units) in costly(), dt in 0u64..10_000) {
        let (st, now) = run_costly(&q, &hits);
        let now = now + dt * 1_000_000;
        let held = capacity(&q, st, now);
        let u = NonZeroU32::new(units).expect("a cost is at least 1");
        let (v, new) = decide_units(&q, st, now, u);
        // Allowed exactly when every unit fits, and then every unit is taken.
        prop_assert_eq!(v.allowed, units <= held, "held {}, cost {}", held, units);
        if v.allowed {
            prop_assert_eq!(v.remaining, held - units);
            prop_assert!(new.is_some());
            // Nothing consumed (another limiter refused): the bucket as it was.
            let unused = unconsumed_units(&q, v, u);
            prop_assert_eq!(unused.remaining, held);
        } else {
            prop_assert_eq!(new, None, "a refusal charges nothing");
            prop_assert!(v.retry_after_ns > 0);
            // Waiting the refusal's own wait is enough for the same cost.
            let (later, _) = decide_units(&q, st, now + v.retry_after_ns, u);
            prop_assert!(later.allowed, "still refused after Retry-After");
        }
    }

    #[test]
    fn giving_back_a_costly_allow_undoes_it(
        (q, hits, _) in costly(),
        pick in 0.0f64..1.0,
        later in 0u64..20_000,
    ) {
        let allowed = costly_allow(&q, &hits, pick);
        prop_assume!(allowed.is_some(), "the bucket is empty: nothing to give back");
        let CostlyAllow { before, now, units: u, verdict: v, after } =
            allowed.expect("assumed");
        let t = now + later * 1_000_000;
        let back = give_back(&q, after, u);
        prop_assert_eq!(capacity(&q, Some(back), t), capacity(&q, before, t));
        // Given back while the whole charge is outstanding: the same.
        if let Some(answered) = give_back_answered(&q, after, u, v.reset_after_ns, now) {
            prop_assert_eq!(capacity(&q, Some(answered), t), capacity(&q, before, t));
        } else {
            prop_assert_eq!(v.reset_after_ns, 0, "nothing outstanding, nothing to give");
        }
    }

    #[test]
    fn an_answered_give_back_never_gives_more_than_was_taken(
        (q, hits, _) in costly(),
        pick in 0.0f64..1.0,
        taken_ago in 0u64..20_000,
        later in 0u64..20_000,
    ) {
        let allowed = costly_allow(&q, &hits, pick);
        prop_assume!(allowed.is_some(), "the bucket is empty: nothing to give back");
        let CostlyAllow { before, now, units: u, verdict: v, after } =
            allowed.expect("assumed");
        // The answer comes `taken_ago` ms after the decision.
        let answered_at = now + taken_ago * 1_000_000;
        let outstanding = v.reset_after_ns.saturating_sub(taken_ago * 1_000_000);
        let t = answered_at + later * 1_000_000;
        let back = give_back_answered(&q, after, u, outstanding, answered_at).unwrap_or(after);
        // Never more room than if the request had not come at all, never less than if it
        // had stayed charged.
        prop_assert!(capacity(&q, Some(back), t) <= capacity(&q, before, t));
        prop_assert!(capacity(&q, Some(back), t) >= capacity(&q, Some(after), t));
    }
}

#[test]
#[should_panic(expected = "a window is longer than zero")]
fn a_zero_window_is_a_bug_not_a_budget() {
    let _ = Quota::gcra(nonzero(1), Duration::ZERO);
}

#[test]
fn a_quota_keeps_its_window_whatever_it_is_given_next() {
    let q = Quota::gcra(nonzero(30), Duration::from_secs(60));
    assert_eq!(q.window_ns(), 60_000_000_000);
    let wider = q.with_window(Duration::from_secs(120));
    assert_eq!(
        (wider.limit(), wider.window()),
        (30, Duration::from_secs(120))
    );
    assert_eq!(wider.emission_interval_ns(), 4_000_000_000);
}

#[test]
fn a_lockout_refuses_for_its_whole_length_then_starts_afresh() {
    for alg in [Algorithm::Gcra, Algorithm::FixedWindow] {
        let q = Quota::new(nonzero(5), Duration::from_secs(600), alg)
            .with_lockout(Some(Duration::from_secs(600)));
        let mut st = None;
        for i in 0..5 {
            let (v, new) = decide(&q, st, i * S);
            assert!(v.allowed, "{alg:?} {i}");
            st = new;
        }
        // The sixth is refused and locks the key: the wait is the whole lockout.
        let (sixth, locked) = decide(&q, st, 5 * S);
        assert!(!sixth.allowed);
        assert_eq!((sixth.retry_after_ns, sixth.remaining), (600 * S, 0));
        assert_eq!(locked, Some(State::Locked { until: 605 * S }));
        assert!(locked.as_ref().is_some_and(is_lock));
        // No trickle: a GCRA bucket would have a request back after 120 s; the lock
        // refuses, counting down, and a refusal while locked does not extend it.
        for t in [6, 130, 300, 604] {
            let (v, again) = decide(&q, locked, t * S + S / 2);
            assert!(!v.allowed, "{alg:?} at {t}");
            assert_eq!(v.retry_after_ns, (605 - t) * S - S / 2);
            assert_eq!(ceil_secs(v.retry_after_ns), 605 - t);
            assert_eq!(again, None, "{alg:?}: the lock is not renewed");
        }
        // From its end the key starts again with a full bucket.
        let (v, _) = decide(&q, locked, 605 * S);
        assert!(v.allowed);
        assert_eq!(v.remaining, 4);
        // A lock holds nothing to give back.
        let lock = State::Locked { until: 605 * S };
        assert_eq!(give_back(&q, lock, NonZeroU32::MIN), lock);
        assert_eq!(
            give_back_answered(&q, lock, NonZeroU32::MIN, 100 * S, 10 * S),
            None
        );
        assert_eq!(lock.expires_at(), 605 * S);
    }
    // A zero lockout is none.
    let q = Quota::gcra(nonzero(1), Duration::from_secs(60)).with_lockout(Some(Duration::ZERO));
    assert_eq!(q.lockout(), None);
    let (_, st) = decide(&q, None, 0);
    assert_eq!(decide(&q, st, 0).1, None, "no lock without a lockout");
}

proptest! {
    #[test]
    fn a_lock_refuses_until_it_ends(
        q in quota(),
        lockout_s in 1u64..86_400,
        hits in proptest::collection::vec(0u64..5_000, 0..100),
    ) {
        let q = q.with_lockout(Some(Duration::from_secs(lockout_s)));
        let (mut st, mut now) = (None, 0);
        let mut locked_at = None;
        for dt in hits {
            now += dt * 1_000_000;
            let (v, new) = decide(&q, st, now);
            if let Some(until) = locked_at {
                if now < until {
                    prop_assert!(!v.allowed);
                    prop_assert_eq!(v.retry_after_ns, until - now);
                }
            }
            if let Some(State::Locked { until }) = new {
                prop_assert!(!v.allowed);
                prop_assert_eq!(until, now + lockout_s * S);
                locked_at = Some(until);
            }
            if new.is_some() {
                st = new;
            }
        }
    }
}

#[test]
fn a_state_is_two_words() {
    assert_eq!(std::mem::size_of::<State>(), 16);
}

const S: u64 = 1_000_000_000;

#[test]
fn more_quota_comes_with_the_next_unit_not_the_whole_bucket() {
    // 30 a minute: one every 2 s.
    let q = Quota::gcra(nonzero(30), Duration::from_secs(60));
    let mut st = None;
    let mut last = None;
    for _ in 0..30 {
        let (v, s) = decide(&q, st, 100 * S);
        st = s;
        last = Some(v);
    }
    let spent = last.unwrap();
    assert_eq!((spent.remaining, spent.reset_after_ns), (0, 60 * S));
    assert_eq!(more_quota_after_ns(&q, &spent), Some(2 * S));
    // Refused half a unit later: t is the refusal's own wait.
    let (refused, _) = decide(&q, st, 100 * S + S / 2);
    assert!(!refused.allowed);
    assert_eq!(
        more_quota_after_ns(&q, &refused),
        Some(refused.retry_after_ns)
    );
    assert_eq!(more_quota_after_secs(&q, &refused), Some(2));
    // A partial unit pending: t is what is left of it.
    let (v, _) = decide(
        &q,
        Some(State::Gcra {
            tat: 100 * S + S / 2,
        }),
        100 * S,
    );
    assert_eq!(v.remaining, 28);
    assert_eq!(more_quota_after_ns(&q, &v), Some(S / 2));
    // A whole quota (an uncharged fresh bucket): nothing more can come.
    let (fresh, _) = decide(&q, None, 0);
    assert_eq!(more_quota_after_ns(&q, &unconsumed(&q, fresh)), None);
    // Fixed window: the window's end.
    let fw = Quota::new(nonzero(5), Duration::from_secs(900), Algorithm::FixedWindow);
    let (v, _) = decide(&fw, None, 0);
    assert_eq!(more_quota_after_ns(&fw, &v), Some(900 * S));
    assert_eq!(more_quota_after_ns(&fw, &unconsumed(&fw, v)), None);
    let (v, _) = decide(
        &fw,
        Some(State::FixedWindow {
            ends_at: 900 * S,
            count: 5,
        }),
        100 * S,
    );
    assert!(!v.allowed);
    assert_eq!(more_quota_after_secs(&fw, &v), Some(800));
}

#[test]
fn unconsumed_is_the_state_before_the_request() {
    let q = Quota::gcra(nonzero(30), Duration::from_secs(60));
    let before = State::Gcra {
        tat: 10_000_000_000,
    };
    let now = 5_000_000_000;
    let (consumed, _) = decide(&q, Some(before), now);
    let (peek_as_if_one_less, _) = decide(&q, None, now);
    let back = unconsumed(&q, consumed);
    assert_eq!(back.remaining, consumed.remaining + 1);
    assert_eq!(
        back.reset_after_ns, 5_000_000_000,
        "the stored TAT minus now"
    );
    // A fresh bucket that was not charged is simply full.
    let fresh = unconsumed(&q, peek_as_if_one_less);
    assert_eq!((fresh.remaining, fresh.reset_after_ns), (30, 0));
    let fw = Quota::new(nonzero(5), Duration::from_secs(60), Algorithm::FixedWindow);
    let (v, _) = decide(&fw, None, 0);
    assert_eq!(unconsumed(&fw, v).remaining, 5);
    assert_eq!(unconsumed(&fw, v).reset_after_ns, 0);
    let (v2, _) = decide(
        &fw,
        Some(State::FixedWindow {
            ends_at: 60_000_000_000,
            count: 1,
        }),
        0,
    );
    assert_eq!(
        (
            unconsumed(&fw, v2).remaining,
            unconsumed(&fw, v2).reset_after_ns
        ),
        (4, 60_000_000_000)
    );
}
