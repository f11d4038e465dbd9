use super::*;

const ONE: Nanos = S;

fn rules() -> Rules {
    Rules {
        target: 250 * MS,
        errors: 0.5,
        recover: 5 * S,
        hold: 60 * S,
        max_step: MAX_STEP,
    }
}

/// `callers` callers each sending a request every `every`, from `from` to `to`, each answered
/// after `took(t)` with `status(t)`; returns what was shed by priority (low, normal, high,
/// critical) and the highest step seen.
fn run(
    p: &Arc<Pressure>,
    callers: u64,
    every: Nanos,
    from: Nanos,
    to: Nanos,
    took: impl Fn(Nanos) -> Nanos,
    status: impl Fn(Nanos) -> u16,
) -> ([u32; 4], u8) {
    let r = rules();
    let mut shed = [0u32; 4];
    let mut most = 0u8;
    let mut waiting: Vec<(Nanos, Waiting, u16)> = Vec::new();
    let mut t = from;
    let mut n = 0u64;
    while t < to {
        for prio in Priority::ALL {
            if p.shed(prio, t, &r).is_some() {
                shed[prio.rank() as usize] += 1;
            }
        }
        let caller = n % callers;
        n += 1;
        waiting.push((t + took(t), p.sent(t, caller, &r), status(t)));
        let (done, rest): (Vec<_>, Vec<_>) = waiting.into_iter().partition(|(at, _, _)| *at <= t);
        waiting = rest;
        for (at, w, st) in done {
            p.answered(w, at, st, &r);
        }
        most = most.max(p.step());
        t += every / callers.max(1);
    }
    for (at, w, st) in waiting {
        p.answered(w, at, st, &r);
    }
    (shed, most)
}

#[test]
fn a_healthy_upstream_stretches_nothing_and_sheds_nothing() {
    let p = Arc::new(Pressure::new());
    let (shed, most) = run(&p, 50, ONE, ONE, 60 * ONE, |_| 30 * MS, |_| 200);
    assert_eq!(shed, [0; 4]);
    assert_eq!(most, 0);
}

#[test]
fn one_callers_slow_requests_move_nothing_however_slow() {
    let p = Arc::new(Pressure::new());
    let r = rules();
    // One caller's request the upstream takes 20 s over, and one caller whose every request is
    // slow, among 30 healthy callers.
    let held = p.sent(ONE, 999, &r);
    let mut t = ONE;
    let mut k = 0u64;
    while t < 30 * ONE {
        let caller = k % 30;
        k += 1;
        let w = p.sent(t, caller, &r);
        p.answered(w, t + 20 * MS, 200, &r);
        let slow = p.sent(t, 1000, &r);
        p.answered(slow, t + 5 * ONE, 200, &r);
        for prio in Priority::ALL {
            assert!(p.shed(prio, t, &r).is_none(), "shed at {t}");
        }
        assert!(p.reading().signal <= r.target, "{:?}", p.reading());
        t += 50 * MS;
    }
    p.answered(held, 21 * ONE, 200, &r);
    assert_eq!(p.step(), 0);
    // Two slow callers alone are not enough either.
    let p = Arc::new(Pressure::new());
    let (shed, most) = run(&p, 2, 100 * MS, ONE, 20 * ONE, |_| 2 * ONE, |_| 200);
    assert_eq!((shed, most), ([0; 4], 0));
}

#[test]
fn a_stall_sheds_the_lowest_first_once_sustained_and_never_critical() {
    let p = Arc::new(Pressure::new());
    let r = rules();
    run(&p, 40, ONE, ONE, 10 * ONE, |_| 30 * MS, |_| 200);
    // From 10 s every answer takes a second.
    let stall = 10 * ONE;
    let mut t = stall;
    let mut waiting = Vec::new();
    let mut first = [None; 4];
    let mut k = 0u64;
    while t < 30 * ONE {
        for prio in Priority::ALL {
            if first[prio.rank() as usize].is_none() && p.shed(prio, t, &r).is_some() {
                first[prio.rank() as usize] = Some(t - stall);
            }
        }
        // No higher priority is shed while a lower one is served.
        let served: Vec<bool> = Priority::ALL
            .iter()
            .map(|&pr| p.shed(pr, t, &r).is_none())
            .collect();
        for w in served.windows(2) {
            assert!(!w[0] || w[1], "at {t}: {served:?}");
        }
        waiting.push((t + ONE, p.sent(t, k % 40, &r)));
        k += 1;
        let (done, rest): (Vec<_>, Vec<_>) = waiting.into_iter().partition(|(at, _)| *at <= t);
        waiting = rest;
        for (at, w) in done {
            p.answered(w, at, 200, &r);
        }
        t += 25 * MS;
    }
    let low = first[0].expect("low is shed during the stall");
    assert!(
        (ONE..=3 * ONE).contains(&low),
        "low shed {} ms in",
        low / MS
    );
    let high = first[2].expect("high is shed in a long stall");
    assert!(
        (6 * ONE..=9 * ONE).contains(&high),
        "high {} ms in",
        high / MS
    );
    assert!(first[3].is_none(), "critical is never shed");
    assert_eq!(p.step(), 1, "one step, held for the hold");
    // Recovery: answers in 30 ms again; every priority flows within 25 s and the step comes
    // back down after its hold.
    for (at, w) in waiting {
        p.answered(w, at, 200, &r);
    }
    let mut t = 30 * ONE;
    let mut flowing = None;
    while t < 120 * ONE {
        let w = p.sent(t, k % 40, &r);
        k += 1;
        p.answered(w, t + 30 * MS, 200, &r);
        if flowing.is_none() && p.shed(Priority::Low, t, &r).is_none() {
            flowing = Some(t - 30 * ONE);
        }
        t += 50 * MS;
    }
    let flowing = flowing.expect("low flows again");
    assert!(flowing <= 25 * ONE, "low flows {} s after", flowing / ONE);
    assert_eq!(p.step(), 0);
}

#[test]
fn a_one_second_herd_never_sheds_high() {
    let p = Arc::new(Pressure::new());
    let _ = rules();
    run(&p, 40, ONE, ONE, 10 * ONE, |_| 30 * MS, |_| 200);
    // A one-second herd: every answer in it takes 800 ms, then healthy again.
    let (shed, _) = run(
        &p,
        40,
        ONE / 4,
        10 * ONE,
        40 * ONE,
        |t| if t < 11 * ONE { 800 * MS } else { 30 * MS },
        |_| 200,
    );
    assert_eq!(shed[2], 0, "high shed after a one-second herd: {shed:?}");
    assert_eq!(shed[3], 0);
}

#[test]
fn a_pilots_failures_are_seen_within_seconds() {
    let p = Arc::new(Pressure::new());
    let r = rules();
    // 30 agents, one request a second in all, every answer a 500.
    let mut t = ONE;
    let mut reacted = None;
    let mut k = 0u64;
    while t < 40 * ONE {
        let w = p.sent(t, k % 30, &r);
        k += 1;
        p.answered(w, t + 10 * MS, 500, &r);
        if reacted.is_none() && p.shed(Priority::Low, t, &r).is_some() {
            reacted = Some(t - ONE);
        }
        t += ONE;
    }
    let at = reacted.expect("the failures are seen");
    assert!(at <= 20 * ONE, "seen after {} s", at / ONE);
    // One caller's failures alone are not enough.
    let p = Arc::new(Pressure::new());
    let (shed, most) = run(&p, 1, 100 * MS, ONE, 30 * ONE, |_| 10 * MS, |_| 500);
    assert_eq!((shed, most), ([0; 4], 0));
}

#[test]
fn quiet_is_recovery() {
    let p = Arc::new(Pressure::new());
    let r = rules();
    // A long stall, then nobody asks for 45 s.
    run(&p, 40, ONE, ONE, 20 * ONE, |_| 2 * ONE, |_| 200);
    assert_eq!(p.shed_level(), MAX_SHED);
    let back = 20 * ONE + 45 * ONE;
    for prio in Priority::ALL {
        assert!(
            p.shed(prio, back, &r).is_none(),
            "{prio:?} shed after 45 s of quiet"
        );
    }
    assert!(!p.reading().missed);
}

#[test]
fn a_client_that_goes_away_leaves_nothing_waiting() {
    let p = Arc::new(Pressure::new());
    let r = rules();
    for c in 0..5 {
        drop(p.sent(ONE, c, &r));
    }
    p.maybe_eval(5 * ONE, &r);
    assert_eq!(p.reading().signal, 0);
    assert!(p
        .state
        .lock()
        .map(|s| s.waiting.is_empty())
        .unwrap_or(false));
}

#[test]
fn the_wait_said_to_a_shed_request_counts_the_levels_above_it() {
    let p = Arc::new(Pressure::new());
    let r = rules();
    run(&p, 10, ONE / 10, ONE, 10 * ONE, |_| ONE, |_| 200);
    assert_eq!(p.shed_level(), MAX_SHED);
    let t = 10 * ONE;
    assert_eq!(p.shed(Priority::Low, t, &r), Some(15));
    assert_eq!(p.shed(Priority::High, t, &r), Some(5));
    assert_eq!(p.shed(Priority::Critical, t, &r), None);
}

#[test]
fn the_quorum_needs_three_callers_and_half() {
    assert_eq!(quorum(vec![9, 9]), 0);
    assert_eq!(quorum(vec![9, 9, 9]), 9);
    assert_eq!(quorum(vec![9, 9, 1, 1, 1, 1]), 1);
    assert_eq!(quorum(vec![9, 9, 9, 1, 1, 1]), 9);
    assert_eq!(quorum(vec![9, 9, 9, 1, 1, 1, 1]), 1);
}
