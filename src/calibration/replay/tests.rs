use super::decide::record_bounded;
use super::*;
use proptest::prelude::*;

const T0: UnixNanos = emit::START;

fn replayer(reorder_seconds: u64) -> Replayer {
    let opts = Options {
        format: LineFormat::Alb,
        reorder_seconds,
    };
    let mut rp = Replayer::new(&Config::default(), &opts);
    rp.report.files.push("t.log".into());
    rp
}

fn fields(at: UnixNanos, target: &str) -> Fields<'_> {
    Fields {
        addr: b"192.0.2.1",
        time: Some(at),
        method: b"GET",
        target: target.as_bytes(),
        ..Fields::default()
    }
}

/// Replay lines dated `at` (seconds after T0), with distinct targets unless `same`.
fn replay(reorder_seconds: u64, at: &[i64], same: bool) -> ReplayReport {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut rp = replayer(reorder_seconds);
        for (i, s) in at.iter().enumerate() {
            let target = if same {
                "/api/tasks".to_owned()
            } else {
                format!("/api/tasks?n={i}")
            };
            let f = fields(T0 + s * NS, &target);
            rp.push(&f, 0, i as u64 + 1).await.expect("a good line");
        }
        rp.finish().await
    })
}

#[test]
fn identical_lines_at_one_instant_take_one_entry() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut rp = replayer(5);
        for i in 0..20_000u64 {
            rp.push(&fields(T0, "/api/tasks"), 0, i + 1)
                .await
                .expect("a good line");
            assert!(rp.buffer.len() <= 1, "{} entries", rp.buffer.len());
        }
        assert!(rp.buffered_bytes < 1024, "{}", rp.buffered_bytes);
        let r = rp.finish().await;
        assert_eq!((r.replayed, r.late, r.decided_early), (20_000, 0, 0));
    });
}

#[test]
fn distinct_lines_at_one_instant_stay_within_the_budget() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut rp = replayer(5);
        let one = RUN_BYTES + 64;
        let n = (REORDER_BUDGET / RUN_BYTES) as u64 * 2;
        for i in 0..n {
            let target = format!("/api/tasks?n={i}");
            rp.push(&fields(T0, &target), 0, i + 1)
                .await
                .expect("a good line");
            assert!(rp.buffered_bytes <= REORDER_BUDGET + one);
        }
        let r = rp.finish().await;
        assert_eq!(r.replayed, n);
        assert_eq!(r.late, 0);
        assert!(r.decided_early > 0 && r.decided_early < n, "{r:?}");
    });
}

#[test]
fn a_line_far_ahead_is_set_aside_and_named() {
    let far = 74 * 365 * 86_400;
    let mut at = vec![far];
    at.extend(0..100);
    let r = replay(5, &at, false);
    assert_eq!((r.outliers, r.late, r.replayed), (1, 0, 100), "{r:?}");
    let o = &r.first_outliers[0];
    assert_eq!((o.file.as_str(), o.line), ("t.log", 1));
    assert!(o.dated.starts_with("2099-"), "{o:?}");
    assert!(o.ahead_seconds > (far - 100) as f64, "{o:?}");

    // In the middle, a minute ahead, and in a cluster.
    let mut at: Vec<i64> = (0..50).collect();
    at.push(50 + 60);
    at.extend(50..100);
    let r = replay(5, &at, false);
    assert_eq!((r.outliers, r.late, r.replayed), (1, 0, 100), "{r:?}");
    assert_eq!(r.first_outliers[0].line, 51);
    // Ahead by a little more than the window: only the line after it would be late, so it
    // is not set aside and that line is.
    let mut at: Vec<i64> = (0..50).collect();
    at.push(50 + 6);
    at.extend(50..100);
    let r = replay(5, &at, false);
    assert_eq!((r.outliers, r.late, r.replayed), (0, 1, 100), "{r:?}");
    let mut at: Vec<i64> = (0..50).collect();
    at.extend([far; 16]);
    at.extend(50..100);
    let r = replay(5, &at, false);
    assert_eq!((r.outliers, r.late, r.replayed), (16, 0, 100), "{r:?}");
    assert_eq!(r.first_outliers.len(), SHOWN_OUTLIERS);
    // Past half the look-ahead, a run of lines is the log's own time: the rest is late.
    let mut at: Vec<i64> = (0..50).collect();
    at.extend([far; LOOK_AHEAD / 2 + 1]);
    at.extend(50..100);
    let r = replay(5, &at, false);
    assert!(r.late > 0, "{r:?}");
}

#[test]
fn lines_before_the_clock_are_late_not_outliers() {
    let mut at: Vec<i64> = (100..200).collect();
    at.insert(50, 0);
    let r = replay(5, &at, false);
    assert_eq!((r.outliers, r.late, r.replayed), (0, 1, 100), "{r:?}");
}

proptest! {
    /// A log in order, or out of order by less than the window, whatever its gaps, replays
    /// every line: no outlier, nothing late.
    #[test]
    fn a_log_within_its_window_loses_no_line(
        steps in prop::collection::vec(
            prop_oneof![Just(0i64), 0i64..3, 0i64..120, 3_600i64..200_000],
            1..200,
        ),
        jitter in prop::collection::vec(0i64..=5, 200),
    ) {
        let mut t = 0;
        let at: Vec<i64> = steps
            .iter()
            .zip(&jitter)
            .map(|(s, j)| {
                t += s;
                t - j
            })
            .collect();
        let n = at.len() as u64;
        for same in [false, true] {
            let r = replay(5, &at, same);
            prop_assert_eq!((r.outliers, r.late, r.replayed), (0, 0, n), "{:?}", at);
        }
    }
}

#[test]
fn a_series_over_decades_stays_bounded_and_keeps_its_counts() {
    let mut s = Series {
        bin_seconds: PLOT_BIN_SECONDS,
        admitted: Vec::new(),
        refused: Vec::new(),
    };
    let year = 365 * 86_400 * NS as Nanos;
    for (i, at) in [0, 59, 3_600, 86_400 * 30, 0].iter().enumerate() {
        record_bounded(&mut s, *at * NS as Nanos, i % 2 == 0);
    }
    record_bounded(&mut s, 200 * year, false);
    assert!(s.admitted.len() <= MAX_PLOT_BINS, "{}", s.admitted.len());
    assert_eq!(s.admitted.len(), s.refused.len());
    assert_eq!(s.admitted.iter().sum::<u64>(), 3);
    assert_eq!(s.refused.iter().sum::<u64>(), 3);
    assert_eq!(s.bin_seconds.get() % 86_400, 0, "{}", s.bin_seconds);
}

/// A log written as requests complete, stamped with their arrival: `(arrival, duration)` in
/// seconds, each line written at arrival + duration, arrivals `gap` apart.
fn completion_order(durations: &[i64], gap: i64) -> Vec<i64> {
    let mut lines: Vec<(i64, i64)> = durations
        .iter()
        .enumerate()
        .map(|(i, d)| (i as i64 * gap + d, i as i64 * gap))
        .collect();
    lines.sort();
    lines.into_iter().map(|(_, at)| at).collect()
}

proptest! {
    /// Whatever a log's disorder, the window the summary names replays it whole: no line
    /// late, no outlier.
    #[test]
    fn the_window_the_summary_names_replays_the_log_whole(
        durations in prop::collection::vec(prop_oneof![0i64..3, 0i64..60, 0i64..900], 1..300),
        gap in 0i64..20,
    ) {
        let at = completion_order(&durations, gap);
        let n = at.len() as u64;
        let r = replay(5, &at, false);
        prop_assert_eq!(r.late + r.outliers + r.replayed, n);
        let disorder = *durations.iter().max().unwrap_or(&0);
        prop_assert!(r.seen.disorder_max <= disorder * NS, "{:?}", r.seen);
        let w = summary::window_for(r.seen.disorder_max);
        if r.late + r.outliers > 0 {
            let fix = r.skipped.iter().map(|s| s.fix.clone()).collect::<Vec<_>>().join(" ");
            let named = format!("--reorder-seconds {w} ");
            prop_assert!(fix.contains(&named), "{fix}");
        }
        let again = replay(w, &at, false);
        prop_assert_eq!((again.late, again.outliers, again.replayed), (0, 0, n), "{:?}", at);
    }

    /// Any share from 0 to 100 is read back, with or without `%`; outside it, refused.
    #[test]
    fn max_skipped_reads_every_share_and_refuses_the_rest(v in -1_000.0f64..1_000.0) {
        let text = format!("{v}");
        let got = summary::parse_max_skipped(&text);
        let pct = summary::parse_max_skipped(&format!("{text}%"));
        if (0.0..=100.0).contains(&v) {
            prop_assert_eq!(got, Ok(v));
            prop_assert_eq!(pct, Ok(v));
        } else {
            prop_assert!(got.is_err() && pct.is_err());
        }
    }

    /// The share is the count's, to two decimals, and never past 100 %.
    #[test]
    fn percent_is_the_share_to_two_decimals(total in 1u64..10_000_000, k in 0u64..=10_000) {
        let n = total * k / 10_000;
        let p = summary::percent(n, total);
        prop_assert!((0.0..=100.0).contains(&p));
        prop_assert!((p - n as f64 * 100.0 / total as f64).abs() <= 0.005 + 1e-9);
    }
}

#[test]
fn max_skipped_refuses_what_is_not_a_share() {
    for bad in [
        "", " ", "-1", "101", "abc", "5%%", "%", "1e2", "nan", "inf", "0x10", "1,5",
    ] {
        let e = summary::parse_max_skipped(bad).expect_err(bad);
        assert!(e.contains("from 0 to 100"), "{bad}: {e}");
    }
    assert_eq!(summary::parse_max_skipped("0"), Ok(0.0));
    assert_eq!(summary::parse_max_skipped("100%"), Ok(100.0));
    assert_eq!(summary::parse_max_skipped("2.5 %"), Ok(2.5));
}

#[test]
fn the_window_named_is_a_second_more_rounded_up() {
    assert_eq!(summary::window_for(0), 10);
    assert_eq!(summary::window_for(59 * NS), 60);
    assert_eq!(summary::window_for(60 * NS), 70);
    assert_eq!(summary::window_for(59 * NS + 1), 70);
    assert_eq!(summary::window_for(619 * NS), 660);
    assert_eq!(summary::window_for(3_600 * NS), 3_660);
}

#[test]
fn a_line_from_a_clock_far_ahead_names_no_window() {
    let far = 74 * 365 * 86_400;
    let mut at: Vec<i64> = (0..50).collect();
    at.push(far);
    at.extend(50..100);
    let r = replay(5, &at, false);
    assert_eq!(
        (r.outliers, r.seen.outliers_far, r.late),
        (1, 1, 0),
        "{r:?}"
    );
    let fix = &r.skipped[0].fix;
    assert!(!fix.contains("--reorder-seconds"), "{fix}");
    assert!(fix.contains("clock set wrong"), "{fix}");
}

#[test]
fn a_line_from_a_clock_far_behind_names_no_window_and_one_near_does() {
    let mut at: Vec<i64> = (0..100).map(|s| 1_000_000 + s).collect();
    at.insert(50, 0);
    let r = replay(5, &at, false);
    assert_eq!((r.late, r.seen.late_far, r.outliers), (1, 1, 0), "{r:?}");
    let fix = &r.skipped[0].fix;
    assert!(!fix.contains("--reorder-seconds"), "{fix}");
    assert!(fix.contains("put the logs in time order"), "{fix}");
    // Twenty seconds behind is the log's disorder: the window that covers it is named.
    let mut at: Vec<i64> = (0..100).collect();
    at.insert(50, 29);
    let r = replay(5, &at, false);
    assert_eq!((r.late, r.seen.late_far), (1, 0), "{r:?}");
    assert!(
        r.skipped[0].fix.starts_with("--reorder-seconds 30 "),
        "{r:?}"
    );
}
