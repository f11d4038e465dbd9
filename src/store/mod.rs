//! Where buckets live. One trait, two implementations: [`memory::MemoryStore`] for one process,
//! and [`redis::RedisStore`] for many. Both run the same math from [`crate::limiter`].

pub mod memory;
pub mod redis;

use crate::keys::{BucketKey, KeyDigest};
use crate::limiter::{Quota, Verdict};
use futures_util::future::BoxFuture;

/// One limiter's question about one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    pub key: BucketKey,
    pub quota: Quota,
    /// A shadow-mode limiter: its refusal never stops the others from consuming.
    pub advisory: bool,
}

/// The store could not answer; each limiter's `on_store_error` decides what happens next.
/// A URL in the message prints without its password.
#[derive(Debug, Clone, thiserror::Error)]
#[error("store error: {}", crate::redact::urls_in(.0))]
pub struct StoreError(pub String);

/// A place that decides requests against buckets.
pub trait Store: Send + Sync + 'static {
    /// Decide all checks of one request together: when every enforcing check allows, each check
    /// that allows consumes one unit of its bucket; when an enforcing check refuses, none
    /// consume (a refused request costs its principal nothing). Verdicts come back in order.
    fn decide<'a>(&'a self, checks: &'a [Check])
        -> BoxFuture<'a, Result<Vec<Verdict>, StoreError>>;

    /// How this store wants bucket names digested: [`KeyDigest::Shared`] (the default) for a
    /// store other instances read, a [`KeyDigest::Local`] one for a store private to this
    /// process.
    fn key_digest(&self) -> KeyDigest {
        KeyDigest::Shared
    }

    /// A short name for logs and metrics: `memory`, `redis`.
    fn kind(&self) -> &'static str;

    /// Buckets currently held (approximate for remote stores).
    fn tracked_keys(&self) -> u64;

    /// Buckets dropped to stay within the cap while still active.
    fn evicted_keys(&self) -> u64 {
        0
    }

    /// Decisions the store failed to make (errors and timeouts) since start.
    fn errors(&self) -> u64 {
        0
    }

    /// Calls sent to a remote store since start (`None` for a store that makes none). On a
    /// standalone Redis concurrent requests share calls, so decisions / calls is the sharing.
    fn calls(&self) -> Option<u64> {
        None
    }

    /// Whether the store answers right now (readiness).
    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async { Ok(()) })
    }
}
