//! The run-time levers every instance on one store shares: overrides added at run time and
//! the buckets an operator reset. On the Redis store both live in small tables beside the
//! buckets (see `store/redis/levers.rs`), which each instance reads every [`SYNC_EVERY`] and
//! at start, so an override reaches every instance within a second and outlives restarts; on
//! the memory store they live in this process alone.

use super::{Override, Source, Wire};
use crate::clock::Clock;
use crate::keys::BucketKey;
use crate::store::StoreError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How often an instance reads the shared tables.
pub(crate) const SYNC_EVERY: Duration = Duration::from_millis(500);
/// The longest the start waits for the shared tables' first read.
const FIRST_SYNC_WAIT: Duration = Duration::from_secs(1);

/// The table of run-time overrides: id -> the override as JSON ([`Wire`]).
const OVERRIDES: &str = "overrides";
/// The table of resets: id -> `<unix seconds> <limiter> <hex digest>`, so every instance drops
/// what it caches of the bucket.
const RESETS: &str = "resets";
/// How long a reset stays in its table for instances to hear of it.
const RESET_KEPT_SECS: u64 = 3600;
/// How long an expired override stays in the shared table before a writer removes it.
const EXPIRED_KEPT_SECS: u64 = 3600;

/// Why a lever could not be pulled.
#[derive(Debug)]
pub(crate) enum LeverError {
    /// The store could not take or give the change.
    Store(StoreError),
    /// Too many overrides.
    Full(String),
}

impl std::fmt::Display for LeverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LeverError::Store(e) => write!(f, "the store did not take the change: {e}"),
            LeverError::Full(e) => f.write_str(e),
        }
    }
}

/// One decider's levers: its store, its overrides, its clock and its top-talker lists.
pub(crate) struct Levers {
    store: Arc<dyn crate::store::Store>,
    overrides: Arc<super::Overrides>,
    clock: Arc<dyn Clock>,
    top: Arc<crate::top::TopTalkers>,
    /// The versions of the shared tables last read (`u64::MAX`: never read).
    overrides_version: AtomicU64,
    resets_version: AtomicU64,
}

impl Levers {
    pub(crate) fn new(
        store: Arc<dyn crate::store::Store>,
        overrides: Arc<super::Overrides>,
        clock: Arc<dyn Clock>,
        top: Arc<crate::top::TopTalkers>,
    ) -> Self {
        Self {
            store,
            overrides,
            clock,
            top,
            overrides_version: AtomicU64::new(u64::MAX),
            resets_version: AtomicU64::new(u64::MAX),
        }
    }

    fn shared(&self) -> Option<&dyn crate::store::SharedTable> {
        self.store.shared_table()
    }

    /// Read the shared tables when they changed: take their overrides, and drop what this
    /// instance caches of buckets another reset. Nothing to do on a store private to this
    /// process.
    pub(crate) async fn sync(&self) -> Result<(), StoreError> {
        let Some(table) = self.shared() else {
            return Ok(());
        };
        let known = self.overrides_version.load(Ordering::Acquire);
        let (version, entries) = table.read(OVERRIDES, known).await?;
        if let Some(entries) = entries {
            let now = self.overrides.unix_now();
            let list: Vec<Override> = entries
                .iter()
                .filter_map(|(id, json)| {
                    let wire: Wire = serde_json::from_str(json).ok()?;
                    let wire = Wire {
                        id: Some(id.clone()),
                        ..wire
                    };
                    Override::from_wire(&wire, Source::Admin, now).ok()
                })
                .take(super::MAX_OVERRIDES)
                .collect();
            self.overrides.set_runtime(list);
            self.overrides_version.store(version, Ordering::Release);
        }
        let known = self.resets_version.load(Ordering::Acquire);
        let (version, entries) = table.read(RESETS, known).await?;
        if let Some(entries) = entries {
            // The first read after start finds only resets of buckets this instance never cached.
            if known != u64::MAX {
                for (_, value) in &entries {
                    if let Some(key) = parse_reset(value) {
                        self.store.forget_cached(&key);
                    }
                }
            }
            self.resets_version.store(version, Ordering::Release);
        }
        Ok(())
    }

    /// Read the shared tables once before the first request is served, so a restarted
    /// instance starts with the overrides other instances put in force; at most
    /// [`FIRST_SYNC_WAIT`] (the store's own timeout bounds each call): beyond it, or on an
    /// error, the instance starts with its configured overrides and [`Levers::run_sync`] reads
    /// the tables in the background.
    pub(crate) async fn first_sync(&self) {
        if self.shared().is_none() {
            return;
        }
        match tokio::time::timeout(FIRST_SYNC_WAIT, self.sync()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "overrides: cannot read the shared table at start; starting with the configured overrides, and reading it every half second until it answers"),
            Err(_) => tracing::warn!(wait_ms = FIRST_SYNC_WAIT.as_millis() as u64, "overrides: the shared table did not answer at start; starting with the configured overrides, and reading it every half second until it answers"),
        }
    }

    /// Read the shared tables now and every [`SYNC_EVERY`] after, until the process ends. A
    /// failed read is logged once per outage and retried.
    pub(crate) async fn run_sync(self: Arc<Self>) {
        if self.shared().is_none() {
            return;
        }
        let mut failing = false;
        let mut since_published = std::time::Duration::MAX;
        loop {
            if since_published >= crate::top::PUBLISH_EVERY {
                since_published = std::time::Duration::ZERO;
                if let Some(table) = self.shared() {
                    let (now, unix) = (self.clock.now(), self.overrides.unix_now());
                    if let Err(e) = self.top.publish(table, now, unix).await {
                        tracing::debug!(error = %e, "top talkers: cannot publish to the shared table");
                    }
                }
            }
            since_published = since_published.saturating_add(SYNC_EVERY);
            match self.sync().await {
                Ok(()) if failing => {
                    failing = false;
                    tracing::info!("overrides: the shared table answers again");
                }
                Ok(()) => {}
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(error = %e, "overrides: cannot read the shared table; the overrides last read stay in force");
                }
                Err(_) => {}
            }
            tokio::time::sleep(SYNC_EVERY).await;
        }
    }

    /// Put a run-time override in force: on the shared table (every instance takes it within a
    /// second), or in this process.
    pub(crate) async fn add(&self, o: Override) -> Result<(), LeverError> {
        let Some(table) = self.shared() else {
            return self.overrides.add(o).map_err(LeverError::Full);
        };
        let now = self.overrides.unix_now();
        // Expired overrides leave the shared table as new ones come.
        for old in self.overrides.list_all_runtime() {
            if old
                .expires
                .is_some_and(|e| e.saturating_add(EXPIRED_KEPT_SECS) < now)
            {
                table
                    .write(OVERRIDES, &old.id, None)
                    .await
                    .map_err(LeverError::Store)?;
            }
        }
        if self.overrides.list().len() >= super::MAX_OVERRIDES {
            return Err(LeverError::Full(format!(
                "{} overrides are in force already; remove some first",
                super::MAX_OVERRIDES
            )));
        }
        let json = serde_json::to_string(&o.to_wire())
            .map_err(|e| LeverError::Full(format!("cannot write the override: {e}")))?;
        table
            .write(OVERRIDES, &o.id, Some(&json))
            .await
            .map_err(LeverError::Store)?;
        self.sync().await.map_err(LeverError::Store)
    }

    /// Remove a run-time override: whether it was in force.
    pub(crate) async fn remove(&self, id: &str) -> Result<bool, LeverError> {
        let Some(table) = self.shared() else {
            return Ok(self.overrides.remove(id));
        };
        let held = self.overrides.list_all_runtime().iter().any(|o| o.id == id);
        table
            .write(OVERRIDES, id, None)
            .await
            .map_err(LeverError::Store)?;
        self.sync().await.map_err(LeverError::Store)?;
        Ok(held)
    }

    /// Forget `keys` in the store and tell the other instances to drop what they cache of them:
    /// how many buckets were held.
    pub(crate) async fn reset(&self, keys: &[BucketKey]) -> Result<u64, LeverError> {
        let held = self.store.reset(keys).await.map_err(LeverError::Store)?;
        if let Some(table) = self.shared() {
            let now = self.overrides.unix_now();
            let (_, entries) = table
                .read(RESETS, u64::MAX)
                .await
                .map_err(LeverError::Store)?;
            for (id, value) in entries.unwrap_or_default() {
                let old = value
                    .split(' ')
                    .next()
                    .and_then(|t| t.parse::<u64>().ok())
                    .is_none_or(|t| t.saturating_add(RESET_KEPT_SECS) < now);
                if old {
                    table
                        .write(RESETS, &id, None)
                        .await
                        .map_err(LeverError::Store)?;
                }
            }
            for k in keys {
                let value = format!("{now} {} {}", k.limiter, k.digest_hex());
                table
                    .write(RESETS, &super::new_id(), Some(&value))
                    .await
                    .map_err(LeverError::Store)?;
            }
        }
        Ok(held)
    }
}

/// A reset's bucket from its table entry (`<unix seconds> <limiter> <hex digest>`).
fn parse_reset(value: &str) -> Option<BucketKey> {
    let mut parts = value.split(' ');
    let _time = parts.next()?;
    let limiter = parts.next()?;
    let mut digest = [0u8; 16];
    hex::decode_to_slice(parts.next()?, &mut digest).ok()?;
    Some(BucketKey {
        limiter: Arc::from(limiter),
        digest,
    })
}
