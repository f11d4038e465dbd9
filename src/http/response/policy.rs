//! `RateLimit-Policy`: named (draft 8 and 10) or as numbers (draft 6 and 7), reused on a
//! thread while the same limiters decide.

use super::disclosed::shown;
use crate::decision::Outcome;
use crate::limiter::ceil_secs;
use crate::policy::LimiterSpec;
use actix_web::http::header::HeaderValue;
use bytes::BytesMut;
use smallvec::SmallVec;
use std::cell::RefCell;
use std::sync::Arc;

/// How a `RateLimit-Policy` value is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PolicyForm {
    /// Draft 8 and 10: `"agent-device";q=30;w=60, ...`, one named item per limiter.
    Named,
    /// Draft 6 and 7: `30;w=60, ...`, integer items, no two with the same quota (the drafts
    /// forbid it): the limiter the single-limit headers describe first, so that its window can
    /// be read beside them, then each other limiter whose budget differs from those before it.
    Numbers,
}

/// The form, the limiters a `RateLimit-Policy` value names, the one it puts first
/// (`usize::MAX` for none), and the value.
type PolicyValue = (
    PolicyForm,
    SmallVec<[(Arc<LimiterSpec>, crate::limiter::Quota); 4]>,
    usize,
    HeaderValue,
);

thread_local! {
    /// The last `RateLimit-Policy` rendered on this thread. The specs are held (not just their
    /// addresses), so a reloaded configuration never matches.
    static LAST_POLICY: RefCell<Option<PolicyValue>> = const { RefCell::new(None) };
}

/// A window in whole seconds, rounded up, at least 1 (the drafts' `w` is a positive integer).
fn window_secs(quota: &crate::limiter::Quota) -> u64 {
    ceil_secs(quota.window_ns()).max(1)
}

/// `RateLimit-Policy` in `form` for the limiters that decided, `first` (a policy slot, for
/// [`PolicyForm::Numbers`]) leading.
pub(super) fn policy_value(outcome: &Outcome, form: PolicyForm, first: usize) -> HeaderValue {
    let shown = shown(outcome);
    let decided = || outcome.results.iter().filter(|r| shown(r));
    // The limiters' budgets too: a plan or an override judges a bucket by another.
    let same = |f: PolicyForm, specs: &[(Arc<LimiterSpec>, crate::limiter::Quota)], at: usize| {
        f == form
            && at == first
            && specs.len() == decided().count()
            && specs
                .iter()
                .zip(decided())
                .all(|((a, q), r)| Arc::ptr_eq(a, &r.spec) && *q == r.quota)
    };
    let cached = LAST_POLICY.with_borrow(|last| match last {
        Some((f, specs, at, value)) if same(*f, specs, *at) => Some(value.clone()),
        _ => None,
    });
    if let Some(v) = cached {
        return v;
    }
    let mut buf = BytesMut::with_capacity(40 * outcome.results.len());
    let mut num = itoa::Buffer::new();
    match form {
        PolicyForm::Named => {
            for (i, r) in decided().enumerate() {
                if i > 0 {
                    buf.extend_from_slice(b", ");
                }
                buf.extend_from_slice(b"\"");
                buf.extend_from_slice(r.spec.name.as_bytes());
                buf.extend_from_slice(b"\";q=");
                buf.extend_from_slice(num.format(r.quota.limit()).as_bytes());
                buf.extend_from_slice(b";w=");
                buf.extend_from_slice(num.format(window_secs(&r.quota)).as_bytes());
            }
        }
        PolicyForm::Numbers => {
            let lead = decided().filter(|r| r.slot == first);
            let rest = decided().filter(|r| r.slot != first);
            let mut written: SmallVec<[u32; 4]> = SmallVec::new();
            for r in lead.chain(rest) {
                let q = r.quota.limit();
                if written.contains(&q) {
                    continue;
                }
                if !written.is_empty() {
                    buf.extend_from_slice(b", ");
                }
                written.push(q);
                buf.extend_from_slice(num.format(q).as_bytes());
                buf.extend_from_slice(b";w=");
                buf.extend_from_slice(num.format(window_secs(&r.quota)).as_bytes());
            }
        }
    }
    let value = HeaderValue::from_maybe_shared(buf.freeze())
        .unwrap_or_else(|_| HeaderValue::from_static(""));
    let specs = decided().map(|r| (r.spec.clone(), r.quota)).collect();
    LAST_POLICY.set(Some((form, specs, first, value.clone())));
    value
}
