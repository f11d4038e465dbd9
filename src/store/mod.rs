//! Where buckets live. One trait, two implementations: [`memory::MemoryStore`] for one process,
//! and [`redis::RedisStore`] for many. Both run the same math from [`crate::limiter`].

pub(crate) mod memory;
pub(crate) mod redis;
pub(crate) mod state_file;

use crate::keys::{BucketKey, KeyDigest};
use crate::limiter::{Quota, Verdict};
use futures_util::future::BoxFuture;
use std::num::NonZeroU32;

/// One limiter's question about one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    pub key: BucketKey,
    pub quota: Quota,
    /// A shadow-mode limiter: its refusal never stops the others from consuming.
    pub shadow: bool,
    /// What the request costs in this bucket: all of it fits, or the request is refused and
    /// charges nothing.
    pub units: NonZeroU32,
}

/// An admitted check to give back because the request's answer says it should not have counted
/// (a limiter with `count = "failed"` or `"succeeded"`).
#[derive(Debug, Clone, PartialEq)]
pub struct GiveBack {
    pub key: BucketKey,
    pub quota: Quota,
    /// Units the request consumed.
    pub units: NonZeroU32,
    /// What was left of the decision's `reset_after_ns` when the answer came: the part of the
    /// charge the bucket still carries (see `crate::limiter::give_back_answered`).
    pub outstanding_ns: u64,
}

/// Why a store could not answer, coarse enough to label a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoreErrorKind {
    /// No answer within the store's timeout.
    Timeout,
    /// No connection, or the connection broke (refused, dropped, I/O error, a server or Cluster
    /// that cannot serve right now).
    Connection,
    /// Too many decisions already wait for the store; this one failed at once.
    Overload,
    /// The script failed, or answered something other than what it should.
    Script,
    /// The settings cannot work: an invalid URL, no Cluster node, a window too long, a CA file
    /// that does not load.
    Config,
    /// The store itself could not run: its runtime did not start, or it has stopped.
    Internal,
}

impl StoreErrorKind {
    /// Every kind, in the order [`Store::errors_by_kind`] lists them.
    pub const ALL: [StoreErrorKind; 6] = [
        StoreErrorKind::Timeout,
        StoreErrorKind::Connection,
        StoreErrorKind::Overload,
        StoreErrorKind::Script,
        StoreErrorKind::Config,
        StoreErrorKind::Internal,
    ];

    /// The metric label: `timeout`, `connection`, `overload`, `script`, `config`, `internal`.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreErrorKind::Timeout => "timeout",
            StoreErrorKind::Connection => "connection",
            StoreErrorKind::Overload => "overload",
            StoreErrorKind::Script => "script",
            StoreErrorKind::Config => "config",
            StoreErrorKind::Internal => "internal",
        }
    }

    /// Its position in [`StoreErrorKind::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

impl std::fmt::Display for StoreErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The store could not answer; each limiter's `on_store_error` decides what happens next.
/// A URL in the message prints without its password.
#[derive(Debug, Clone, thiserror::Error)]
#[error("store error: {}", crate::redact::urls_in(&self.message))]
pub struct StoreError {
    kind: StoreErrorKind,
    message: String,
}

impl StoreError {
    pub fn new(kind: StoreErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// Why the store could not answer.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }

    /// What went wrong, in words (URLs as the store wrote them: the Redis store hides their
    /// passwords; `Display` hides them whatever the source).
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// A shared table's version, and its entries when they changed (see [`SharedTable::read`]).
pub type TableRead = (u64, Option<Vec<(String, String)>>);

/// A small table kept beside the buckets and read by every instance on the same store: the
/// run-time overrides and the resets other instances must hear about.
pub trait SharedTable: Send + Sync {
    /// The table's version (0 when it was never written) and, when it differs from `known`,
    /// every entry.
    fn read<'a>(
        &'a self,
        name: &'a str,
        known: u64,
    ) -> BoxFuture<'a, Result<TableRead, StoreError>>;

    /// Set (`Some`) or remove (`None`) one entry, and bump the version.
    fn write<'a>(
        &'a self,
        name: &'a str,
        id: &'a str,
        value: Option<&'a str>,
    ) -> BoxFuture<'a, Result<(), StoreError>>;
}

/// A place that decides requests against buckets.
pub trait Store: Send + Sync + 'static {
    /// Decide all checks of one request together: when every enforcing check allows, each check
    /// that allows consumes one unit of its bucket; when an enforcing check refuses, none
    /// consume (a refused request costs its principal nothing). Verdicts come back in order.
    fn decide<'a>(&'a self, checks: &'a [Check])
        -> BoxFuture<'a, Result<Vec<Verdict>, StoreError>>;

    /// [`Store::decide`] on the caller's thread at `now`, read from [`Store::clock`], for a
    /// store that decides in the process without waiting (the memory store): no future to
    /// allocate and no second reading of the clock. `None` (the default) for a store that
    /// must be asked (Redis); the caller then awaits [`Store::decide`].
    fn decide_in_process(
        &self,
        _checks: &[Check],
        _now: crate::clock::Nanos,
    ) -> Option<Vec<Verdict>> {
        None
    }

    /// Give back admitted requests whose answers say they should not have counted, each bucket
    /// at most by what the request still weighs on it. Runs after the answer, never on a
    /// decision's path.
    fn give_back<'a>(&'a self, items: &'a [GiveBack]) -> BoxFuture<'a, Result<(), StoreError>>;

    /// How this store wants bucket names digested: `KeyDigest::Shared` (the default) for a
    /// store other instances read, a `KeyDigest::Local` one for a store private to this
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

    /// The buckets and the digest key that names them, for `store.state_file`, when this store
    /// keeps its buckets in the process; `None` for a store whose buckets outlive the process
    /// anyway (Redis). Times are on [`Store::clock`].
    #[doc(hidden)]
    fn kept_buckets(&self) -> Option<((u64, u64), Vec<state_file::Entry>)> {
        None
    }

    /// Decisions the store failed to make (errors and timeouts) since start.
    fn errors(&self) -> u64 {
        0
    }

    /// Failed decisions since start by kind, one entry per [`StoreErrorKind::ALL`] in that
    /// order; they add up to [`Store::errors`].
    fn errors_by_kind(&self) -> [(StoreErrorKind, u64); StoreErrorKind::ALL.len()] {
        StoreErrorKind::ALL.map(|k| (k, 0))
    }

    /// Calls sent to a remote store since start (`None` for a store that makes none). On a
    /// standalone Redis concurrent requests share calls, so decisions / calls is the sharing.
    fn calls(&self) -> Option<u64> {
        None
    }

    /// Switches from one primary to another since start, for a store that follows them (Redis
    /// behind Sentinel); `None` for any other.
    fn failovers(&self) -> Option<u64> {
        None
    }

    /// The clock the store decides by, when it keeps one in process (the memory store): what
    /// else the decider remembers between requests then runs on the same time, virtual or
    /// not. `None` for a store that reads its own time (Redis).
    fn clock(&self) -> Option<std::sync::Arc<dyn crate::clock::Clock>> {
        None
    }

    /// Whether the store answers right now (readiness).
    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async { Ok(()) })
    }

    /// Decide `checks` on buckets of this process alone, apart from the shared ones, with the
    /// same rules as [`Store::decide`]: the answer of limiters with `on_store_error = "local"`
    /// while [`Store::decide`] fails. `None` when the store keeps no such buckets (the memory
    /// store is local already and never fails); those limiters then answer like `allow`.
    fn decide_locally<'a>(
        &'a self,
        _checks: &'a [Check],
    ) -> Option<BoxFuture<'a, Result<Vec<Verdict>, StoreError>>> {
        None
    }

    /// What [`Store::decide`] would answer `checks` now, changing nothing (`explain`).
    fn peek<'a>(&'a self, _checks: &'a [Check]) -> BoxFuture<'a, Result<Vec<Verdict>, StoreError>> {
        Box::pin(async {
            Err(StoreError::new(
                StoreErrorKind::Internal,
                "this store cannot answer without counting",
            ))
        })
    }

    /// Forget the buckets `keys` name (an operator's reset): their principals start again
    /// with full buckets, and a lockout ends. Returns how many buckets were held.
    fn reset<'a>(&'a self, _keys: &'a [BucketKey]) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async {
            Err(StoreError::new(
                StoreErrorKind::Internal,
                "this store cannot forget a bucket",
            ))
        })
    }

    /// Forget what this instance holds of `key` beside the store (a refusal it caches): another
    /// instance reset the bucket.
    fn forget_cached(&self, _key: &BucketKey) {}

    /// A small table every instance on this store reads (`name` -> id -> value), with a
    /// version that changes on every write; `None` for a store private to this process.
    fn shared_table(&self) -> Option<&dyn SharedTable> {
        None
    }

    /// Give back, on the local buckets, requests [`Store::decide_locally`] admitted.
    fn give_back_locally<'a>(
        &'a self,
        _items: &'a [GiveBack],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async { Ok(()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_kinds_have_one_label_each_in_order() {
        let labels: Vec<&str> = StoreErrorKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(
            labels,
            [
                "timeout",
                "connection",
                "overload",
                "script",
                "config",
                "internal"
            ]
        );
        for (i, k) in StoreErrorKind::ALL.iter().enumerate() {
            assert_eq!(k.index(), i);
        }
    }

    #[test]
    fn an_error_keeps_its_kind_and_hides_url_passwords() {
        let e = StoreError::new(
            StoreErrorKind::Connection,
            "redis: redis://:hunter2@db:6379 refused",
        );
        assert_eq!(e.kind(), StoreErrorKind::Connection);
        assert!(!e.to_string().contains("hunter2"), "{e}");
        assert!(e.to_string().starts_with("store error: "), "{e}");
    }
}
