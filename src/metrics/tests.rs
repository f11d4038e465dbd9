//! The exposition page, series by series: fates, near-limit, reloads, escaping.

use super::*;
use crate::policy::Policy;

fn line<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    text.lines().find(|l| l.starts_with(prefix))
}

fn two_limiters() -> Vec<Arc<LimiterSpec>> {
    let cfg = crate::config::Config::default();
    cfg.limiters.iter().take(2).cloned().map(Arc::new).collect()
}

#[test]
fn fates_near_limit_retry_after_and_requests_are_counted() {
    let m = Metrics::new();
    let specs = two_limiters();
    let (a, b) = (specs[0].name.to_string(), specs[1].name.to_string());
    let meters = m.configure(true, &specs, 20);
    let micros = Duration::from_micros(30);
    meters[0].record(LimiterFate::Allowed, 1, 10, 0);
    meters[1].record(LimiterFate::ShadowRefused, 0, 10, 7);
    m.request(RequestFate::Forwarded, micros);
    meters[0].record(LimiterFate::Refused, 0, 10, 0);
    m.request(RequestFate::Refused, micros);
    meters[0].record(LimiterFate::StoreErrorAllowed, 0, 10, 0);
    m.request(RequestFate::Forwarded, micros);
    m.request(RequestFate::Unmetered, Duration::ZERO);
    assert_eq!(m.decisions(&a, LimiterFate::Allowed), 1);
    assert_eq!(m.decisions(&a, LimiterFate::Refused), 1);
    assert_eq!(m.decisions(&a, LimiterFate::StoreErrorAllowed), 1);
    assert_eq!(m.decisions(&b, LimiterFate::ShadowRefused), 1);
    assert_eq!(m.near_limit(&a), 1);
    let text = m.render();
    assert_eq!(
        line(&text, "fleet_limiter_requests_total{outcome=\"forwarded\"}"),
        Some("fleet_limiter_requests_total{outcome=\"forwarded\"} 2")
    );
    assert_eq!(
        line(&text, "fleet_limiter_requests_total{outcome=\"unmetered\"}"),
        Some("fleet_limiter_requests_total{outcome=\"unmetered\"} 1")
    );
    assert_eq!(
        line(&text, "fleet_limiter_decision_duration_seconds_count"),
        Some("fleet_limiter_decision_duration_seconds_count 3")
    );
    assert_eq!(
        line(
            &text,
            "fleet_limiter_decision_duration_seconds_bucket{le=\"2.5e-05\"}"
        ),
        Some("fleet_limiter_decision_duration_seconds_bucket{le=\"2.5e-05\"} 0")
    );
    assert_eq!(
        line(
            &text,
            "fleet_limiter_decision_duration_seconds_bucket{le=\"5e-05\"}"
        ),
        Some("fleet_limiter_decision_duration_seconds_bucket{le=\"5e-05\"} 3")
    );
    // The refusal asked for no wait yet counts as 1 s; the shadow refusal asked for 7 s.
    let bucket = |limiter: &str, le: &str| {
        let p = format!(
            "fleet_limiter_retry_after_seconds_bucket{{limiter=\"{limiter}\",le=\"{le}\"}} "
        );
        line(&text, &p).map(|l| l[p.len()..].to_owned())
    };
    assert_eq!(bucket(&a, "1").as_deref(), Some("1"));
    assert_eq!(bucket(&b, "5").as_deref(), Some("0"));
    assert_eq!(bucket(&b, "10").as_deref(), Some("1"));
}

#[test]
fn counts_carry_over_a_reload_that_keeps_the_limiter() {
    let m = Metrics::new();
    let specs = two_limiters();
    let name = specs[0].name.to_string();
    m.configure(true, &specs, 20)[0].record(LimiterFate::Allowed, 5, 10, 0);
    m.configure(true, &specs[..1], 50)[0].record(LimiterFate::Allowed, 4, 10, 0);
    assert_eq!(m.decisions(&name, LimiterFate::Allowed), 2);
    assert_eq!(m.near_limit(&name), 1, "only the second is under 50%");
    assert!(m.render().contains("fleet_limiter_near_limit_ratio 0.5\n"));
}

#[test]
fn upstream_statuses_out_of_range_are_ignored() {
    let m = Metrics::new();
    m.upstream_response(204, Duration::from_millis(3));
    m.upstream_response(42, Duration::from_millis(3));
    m.upstream_response(999, Duration::from_millis(3));
    let text = m.render();
    assert!(text.contains("fleet_limiter_upstream_responses_total{status=\"204\"} 1\n"));
    assert!(!text.contains("status=\"42\""));
    assert!(text.contains("fleet_limiter_upstream_duration_seconds_count 3\n"));
}

#[test]
fn exposition_page_of_the_default_calibration() {
    let cfg = crate::config::Config::default();
    let policy = Policy::new(cfg.limiters.clone());
    // The page does not depend on what other tests in this process logged.
    let m = Metrics::build(None, || 0);
    let meters = m.configure(cfg.enabled, policy.limiters(), cfg.ops.near_limit_percent);
    let agent = policy
        .limiters()
        .iter()
        .position(|l| &*l.name == "agent-device")
        .expect("built-in");
    meters[agent].record(LimiterFate::Refused, 0, 10, 3);
    m.request(RequestFate::Refused, Duration::from_micros(40));
    m.store_round_trip(Duration::from_micros(3), None);
    m.store_round_trip(Duration::from_micros(9), Some(StoreErrorKind::Timeout));
    m.upstream_response(200, Duration::from_millis(12));
    m.upstream_failed(true);
    m.client_body_timeout(BodyTimeout::Rate);
    m.upgrade(true);
    m.upgrade(false);
    m.upgraded_opened();
    m.upgraded_opened();
    m.upgraded_closed();
    m.upgrade_refused(UpgradeRefusal::MaxPerClient);
    m.upgraded_idle_closed();
    m.upgraded_connections_max(128);
    m.reloaded(false);
    snap!("metrics_page", sorted_series(&m.render()));
}

/// The page with each family's series in order of their labels (`prometheus-client` writes
/// a family's series in hash order, which Prometheus does not mind and a snapshot does); a
/// histogram's buckets keep their order.
fn sorted_series(page: &str) -> String {
    fn without_le(l: &str) -> String {
        match l.find("le=\"") {
            Some(i) => {
                let end = l[i + 4..].find('"').map_or(l.len(), |j| i + 5 + j);
                format!("{}{}", &l[..i], &l[end..])
            }
            None => l.to_owned(),
        }
    }
    let mut out = String::new();
    let mut block: Vec<&str> = Vec::new();
    let flush = |block: &mut Vec<&str>, out: &mut String| {
        block.sort_by_key(|l| without_le(l));
        block.drain(..).for_each(|b| out.extend([b, "\n"]));
    };
    for l in page.lines() {
        if l.starts_with('#') {
            flush(&mut block, &mut out);
            out.extend([l, "\n"]);
        } else {
            block.push(l);
        }
    }
    flush(&mut block, &mut out);
    out
}

#[test]
fn every_fate_has_a_stable_name() {
    let names: Vec<&str> = LimiterFate::ALL.iter().map(|o| o.as_str()).collect();
    assert_eq!(
        names,
        [
            "allowed",
            "refused",
            "shadow_refused",
            "store_error_allowed",
            "store_error_refused",
            "local_allowed",
            "local_refused"
        ]
    );
}

#[test]
fn label_values_are_escaped() {
    let m = Metrics::new();
    let mut spec = (*two_limiters()[0]).clone();
    spec.name = Arc::from("a\"b\\c\nd");
    m.configure(true, &[Arc::new(spec)], 20)[0].record(LimiterFate::Allowed, 9, 10, 0);
    let text = m.render();
    assert!(
        text.contains("fleet_limiter_near_limit_total{limiter=\"a\\\"b\\\\c\\nd\"} 0\n"),
        "{text}"
    );
}
