//! Which limiters the limit headers speak of: those that disclose and decided, the one the
//! single-limit forms describe, and a limiter's reset.

use crate::decision::{LimitResult, Outcome};
use crate::limiter::ceil_secs;

/// What the limit headers may speak of: the outcome less its limiters with `disclose = false`,
/// or `None` when a non-disclosing limiter refused the request. Then no limit header is sent at
/// all: one naming the other limiters would tell, by what it leaves out (a budget with room
/// left on a refusal), that a hidden one refused. So a refusal a hidden limiter takes part in
/// looks the same whichever limiter refused: `Retry-After`, from the buckets, and the generic
/// problem document. The outcome itself, borrowed, when every limiter discloses.
pub(super) fn disclosed(outcome: &Outcome) -> Option<std::borrow::Cow<'_, Outcome>> {
    if outcome.results.iter().all(|r| r.spec.disclose) {
        return Some(std::borrow::Cow::Borrowed(outcome));
    }
    if outcome
        .results
        .iter()
        .any(|r| !r.spec.disclose && r.refuses())
    {
        return None;
    }
    Some(std::borrow::Cow::Owned(Outcome {
        client_ip: outcome.client_ip,
        results: outcome
            .results
            .iter()
            .filter(|r| r.spec.disclose)
            .cloned()
            .collect(),
        store_error: outcome.store_error.clone(),
        poll_after_secs: outcome.poll_after_secs,
    }))
}

/// The limiter the single-limit headers (draft 6 and 7, legacy) describe: on a refusal the
/// enforcing limiter that refused with the longest wait (the one `Retry-After` is from), else
/// the one closest to refusing; when only the store's failure refused, the limiter that refused
/// for it with the longest wait. `None` when no limiter decided and none refused (the store
/// failed for all, and they let the request through).
pub(super) fn expiring(outcome: &Outcome) -> Option<&LimitResult> {
    let shown = shown(outcome);
    outcome
        .results
        .iter()
        .filter(|r| shown(r) && r.refuses())
        .max_by_key(|r| {
            (
                r.verdict.retry_after_ns,
                std::cmp::Reverse((r.verdict.remaining, r.verdict.limit)),
            )
        })
        .or_else(|| outcome.tightest())
}

/// Which limiters the limit headers describe: those that decided (the store answered, or a
/// `local` bucket did); and, when the store's failure alone refused the request, the limiters
/// that refused for it (nothing left now, back when `Retry-After` says).
pub(super) fn shown(outcome: &Outcome) -> impl Fn(&LimitResult) -> bool {
    let store_down = outcome.store_unavailable();
    move |r: &LimitResult| !r.store_error || (store_down && r.refuses())
}

/// Seconds until a limiter's quota resets (is whole again), rounded up: the reset of draft 6,
/// 7 and 8 and of `X-RateLimit-Reset`. A verdict that said no (a shadow limiter's) resets, for
/// its client, when it would say yes: its wait, at least 1. `None` when the quota is whole.
pub(super) fn reset_secs(r: &LimitResult) -> Option<u64> {
    let v = &r.verdict;
    if !v.allowed {
        return Some(crate::limiter::wait_secs(v.retry_after_ns));
    }
    if v.reset_after_ns == 0 || v.remaining >= v.limit {
        return None;
    }
    Some(ceil_secs(v.reset_after_ns))
}
