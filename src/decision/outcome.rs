//! What a decision comes to: each limiter's result and the request's outcome (refused, the
//! wait to report, the limiter closest to refusing).

use crate::keys::BucketKey;
use crate::limiter::{wait_secs, Verdict};
use crate::policy::{LimiterSpec, Mode};
use crate::store::StoreError;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Arc;

/// What one limiter said about the request.
#[derive(Debug, Clone)]
pub struct LimitResult {
    pub spec: Arc<LimiterSpec>,
    /// The budget the bucket was judged by: the limiter's own, its plan's, or an override's.
    pub quota: crate::limiter::Quota,
    /// The limiter's position in the policy that decided (its metric handles' index).
    pub slot: usize,
    /// The bucket. For a limiter that said no (the ones logs name), always its shared
    /// (SHA-256) name, which every instance computes alike, even when the store keeps it
    /// under a name private to this process.
    pub key: BucketKey,
    pub verdict: Verdict,
    /// The store failed; the verdict is the limiter's `on_store_error` answer, not a count.
    pub store_error: bool,
    /// The store failed and this limiter (`on_store_error = "local"`) counted the request on
    /// this instance's own bucket instead: the verdict is that bucket's.
    pub local: bool,
    /// What the request cost this limiter's bucket (charged only when the request was allowed).
    pub units: NonZeroU32,
    /// The first bytes of the bucket's name as the store keeps it (keyed SipHash in the memory
    /// store, SHA-256 in Redis), whatever the verdict: the partition key (`pk`) of the
    /// draft-8 and draft-10 `RateLimit` headers.
    pub partition: [u8; 8],
}

impl LimitResult {
    /// Whether this result refuses the request (an enforcing limiter that said no).
    pub fn refuses(&self) -> bool {
        !self.verdict.allowed && self.spec.mode == Mode::Enforce
    }

    /// Whether an answer with `status` gives back what this result took: the limiter allowed
    /// and counted the request (its store decided) and its `count` says such an answer should
    /// not have counted.
    pub(crate) fn gives_back(&self, status: u16) -> bool {
        self.verdict.allowed && !self.store_error && self.spec.gives_back(status)
    }
}

/// Everything decided about one request.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub client_ip: Option<IpAddr>,
    pub results: Vec<LimitResult>,
    pub store_error: Option<StoreError>,
    /// On a shaped route (`[shaping]`): the seconds until the caller's own slot, sent as
    /// `X-Poll-Interval`.
    pub poll_after_secs: Option<u64>,
}

impl Outcome {
    /// Refused when any enforcing limiter refused.
    pub fn refused(&self) -> bool {
        self.results.iter().any(LimitResult::refuses)
    }

    /// Refused only because the store could not answer: every enforcing limiter that refused
    /// is an `on_store_error = "deny"` answer, none a budget that was counted and found spent.
    /// The server's failure, not the caller's: answered `503`, where a spent budget is `429`.
    /// A request refused by both a spent budget and a store failure is a spent budget's.
    pub fn store_unavailable(&self) -> bool {
        let mut refusing = self.results.iter().filter(|r| r.refuses()).peekable();
        refusing.peek().is_some() && refusing.all(|r| r.store_error)
    }

    /// The longest wait among the refusing limiters, in whole seconds rounded up, at least 1.
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.results
            .iter()
            .filter(|r| r.refuses())
            .map(|r| wait_secs(r.verdict.retry_after_ns))
            .max()
    }

    /// The limiter closest to refusing: least remaining, then the smallest budget.
    pub fn tightest(&self) -> Option<&LimitResult> {
        self.results
            .iter()
            .filter(|r| !r.store_error)
            .min_by_key(|r| (r.verdict.remaining, r.verdict.limit))
    }
}
