//! Suggestions: for a limiter the judge finds unsafe or at risk, the smallest change it would
//! accept. Nothing here does arithmetic of its own: each candidate is a copy of the limiter with
//! one setting changed, put to the judge ([`acceptable`]), and the search only asks the judge
//! yes or no. The limit is searched by bisection, which needs the judge's answer to be monotone
//! in it (a larger budget is never worse); the answer is checked where it matters, at the value
//! found and the one below it, so a suggestion is never given that the judge would not take or
//! that is not the smallest.

use super::findings::Finding;
use super::judge::judge_loads;
use super::types::{Fix, KnownTable, Status};
use super::workload::Model;
use crate::keys::KeyKind;
use crate::policy::{Cost, LimiterSpec};
use std::num::NonZeroU32;
use std::time::Duration;

/// The longest window a configuration accepts, in seconds (7 days).
pub(super) const MAX_WINDOW_SECONDS: u64 = 7 * 86_400;

/// What the judge says of `l`, enforced, against the declared fleet.
pub(super) fn verdict(l: &LimiterSpec, model: &Model, table: &KnownTable) -> Status {
    judge_loads(l, model, table).status
}

/// Whether the judge accepts `l` for the declared fleet: neither unsafe nor at risk (a warning
/// is accepted, as `check` and `serve` accept it).
pub(super) fn acceptable(l: &LimiterSpec, model: &Model, table: &KnownTable) -> bool {
    verdict(l, model, table) < Status::AtRisk
}

/// The smallest limit a configuration accepts for `l`: at least 1, and at least its fixed cost
/// or its `cost_max` (a cost above the limit could never pass).
pub(super) fn min_limit(l: &LimiterSpec) -> u32 {
    match l.cost {
        Cost::Fixed(n) => n.get(),
        Cost::Header { max, .. } => max.get(),
    }
}

fn with_limit(l: &LimiterSpec, limit: NonZeroU32) -> LimiterSpec {
    let mut c = l.clone();
    c.quota = c.quota.with_limit(limit);
    c
}

fn with_window(l: &LimiterSpec, seconds: u64) -> LimiterSpec {
    let mut c = l.clone();
    c.quota = c.quota.with_window(Duration::from_secs(seconds));
    c
}

fn with_key(l: &LimiterSpec, key: KeyKind) -> LimiterSpec {
    let mut c = l.clone();
    c.key = key;
    c
}

/// The smallest limit from `from` up that the judge accepts, the window kept. `None` when
/// even the largest limit is refused, or when the judge's answer is not monotone there.
pub(super) fn smallest_limit(
    l: &LimiterSpec,
    from: u32,
    model: &Model,
    table: &KnownTable,
) -> Option<u32> {
    let ok =
        |n: u32| NonZeroU32::new(n).is_some_and(|n| acceptable(&with_limit(l, n), model, table));
    let from = from.max(min_limit(l));
    if !ok(u32::MAX) {
        return None;
    }
    if ok(from) {
        return Some(from);
    }
    // Invariant: `lo` refused, `hi` accepted.
    let (mut lo, mut hi) = (from, u32::MAX);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if ok(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    // Monotone where it matters: the answer is accepted and the one below it is not.
    (ok(hi) && !ok(hi - 1)).then_some(hi)
}

/// The longest whole-second window up to `below` (exclusive) that the judge accepts, the limit
/// kept. `None` when even a 1-second window is refused, or the answer is not monotone there.
pub(super) fn longest_window(
    l: &LimiterSpec,
    below: u64,
    model: &Model,
    table: &KnownTable,
) -> Option<u64> {
    let ok = |s: u64| acceptable(&with_window(l, s), model, table);
    let top = below.saturating_sub(1).min(MAX_WINDOW_SECONDS);
    if top == 0 || !ok(1) {
        return None;
    }
    if ok(top) {
        return Some(top);
    }
    // Invariant: `lo` accepted, `hi` refused.
    let (mut lo, mut hi) = (1, top);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if ok(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    (ok(lo) && !ok(lo + 1)).then_some(lo)
}

/// A window as configuration writes it: `7d`, `2h`, `15m`, `90s`.
pub(crate) fn window_text(seconds: u64) -> String {
    match seconds {
        0 => "0s".to_owned(),
        s if s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s % 3_600 == 0 => format!("{}h", s / 3_600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// A window as configuration writes it, from a [`Duration`] (milliseconds when not whole seconds).
fn duration_text(d: Duration) -> String {
    if d.subsec_millis() == 0 && d.subsec_nanos() == 0 {
        window_text(d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// `ip+agent`, `header:x-tenant-id`: a key as configuration writes it.
pub(super) fn key_text(l: &LimiterSpec) -> String {
    l.key.to_string()
}

fn fix(
    l: &LimiterSpec,
    changed: &LimiterSpec,
    change: &'static str,
    line: String,
    model: &Model,
    table: &KnownTable,
) -> Fix {
    Fix {
        change,
        limit: changed.quota.limit(),
        window: duration_text(changed.quota.window()),
        key: key_text(changed),
        toml: format!("[limiters.{}]\n{line}\n", l.name),
        status: verdict(changed, model, table),
    }
}

/// The key kinds a limiter could take instead of its own that give clients a bucket of their
/// own where the model knows who they are: the agent (`ip+agent`) or the verified user
/// (`user-or-ip`). A `new-agents` ceiling must stay on the IP.
const KEY_CANDIDATES: [KeyKind; 2] = [KeyKind::IpAgent, KeyKind::UserOrIp];

/// What `check` suggests for `l`: the preferred fix, the alternatives, or why there is none.
pub(super) struct Suggested {
    pub(super) suggestion: Option<Fix>,
    pub(super) alternatives: Vec<Fix>,
    pub(super) no_fix: Option<String>,
}

/// The fixes for `l` when the judge refuses it (unsafe or at risk); nothing when it accepts it.
pub(super) fn suggest(l: &LimiterSpec, model: &Model, table: &KnownTable) -> Suggested {
    let mut fixes = Vec::new();
    if !acceptable(l, model, table) {
        let limit = l.quota.limit();
        if let Some(n) =
            smallest_limit(l, limit.saturating_add(1), model, table).and_then(NonZeroU32::new)
        {
            let c = with_limit(l, n);
            fixes.push(fix(l, &c, "limit", format!("limit = {n}"), model, table));
        }
        let window = l.quota.window();
        let below = window.as_secs() + u64::from(window.subsec_nanos() > 0);
        if let Some(s) = longest_window(l, below, model, table) {
            let c = with_window(l, s);
            let line = format!("window = \"{}\"", window_text(s));
            fixes.push(fix(l, &c, "window", line, model, table));
        }
        if l.new_agents.is_none() {
            for k in KEY_CANDIDATES.into_iter().filter(|k| *k != l.key) {
                let c = with_key(l, k.clone());
                if acceptable(&c, model, table) && guarded(&c, model) {
                    let line = format!("key = \"{}\"", k.as_str());
                    fixes.push(fix(l, &c, "key", line, model, table));
                }
            }
        }
    } else {
        return Suggested {
            suggestion: None,
            alternatives: Vec::new(),
            no_fix: None,
        };
    }
    let mut fixes = fixes.into_iter();
    let suggestion = fixes.next();
    let no_fix = suggestion.is_none().then(|| why_none(l, model, table));
    Suggested {
        suggestion,
        alternatives: fixes.collect(),
        no_fix,
    }
}

/// Whether the configuration would load with `changed` in place of its limiter: a key the
/// client chooses needs an enforcing limiter keyed on the client's address beside it.
fn guarded(changed: &LimiterSpec, model: &Model) -> bool {
    let limiters: Vec<LimiterSpec> = model
        .limiters
        .iter()
        .map(|x| {
            if x.name == changed.name {
                changed.clone()
            } else {
                x.clone()
            }
        })
        .collect();
    crate::config::unguarded_client_chosen_key(&limiters).is_none()
}

/// Why no single change helps: what the judge still finds at the largest limit.
fn why_none(l: &LimiterSpec, model: &Model, table: &KnownTable) -> String {
    let most = with_limit(l, NonZeroU32::MAX);
    let left: Vec<String> = judge_loads(&most, model, table)
        .findings
        .iter()
        .filter(|f| f.status() >= Status::AtRisk)
        .map(Finding::sentence)
        .collect();
    let still = if left.is_empty() {
        "the judge's answer is not monotone in the limit here, so no smallest value can be named"
            .to_owned()
    } else {
        format!("even with limit = {}: {}", u32::MAX, left.join("; "))
    };
    format!(
        "no limit (from {} to {}), no window (from 1s to 7d) and no key ({}) makes it safe for the declared fleet: {still}",
        min_limit(l),
        u32::MAX,
        KEY_CANDIDATES.map(|k| k.as_str()).join(", ")
    )
}
