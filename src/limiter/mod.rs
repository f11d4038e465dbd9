//! The rate-limit math, as pure functions of (stored state, now, quota).
//!
//! Both stores call [`decide`]; the Redis Lua script mirrors it line for line.

pub mod fixed_window;
pub mod gcra;

use crate::clock::Nanos;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// How a limiter counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Algorithm {
    /// Token bucket (GCRA): a burst of `limit`, refilling continuously at `limit` per `window`.
    #[default]
    Gcra,
    /// express-rate-limit's fixed window: `limit` per window, the window starting at a key's first hit.
    FixedWindow,
}

impl Algorithm {
    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::Gcra => "gcra",
            Algorithm::FixedWindow => "fixed-window",
        }
    }
}

/// A budget: `limit` requests per `window`, counted by `algorithm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    pub limit: u32,
    pub window: Duration,
    pub algorithm: Algorithm,
}

impl Quota {
    pub fn new(limit: u32, window: Duration, algorithm: Algorithm) -> Self {
        Self {
            limit,
            window,
            algorithm,
        }
    }

    pub fn gcra(limit: u32, window: Duration) -> Self {
        Self::new(limit, window, Algorithm::Gcra)
    }

    pub fn window_ns(&self) -> Nanos {
        self.window.as_nanos().min(u64::MAX as u128) as Nanos
    }

    /// Time for one request's worth of budget to come back (GCRA's emission interval).
    pub fn emission_interval_ns(&self) -> Nanos {
        (self.window_ns() / self.limit.max(1) as u64).max(1)
    }
}

/// What a store keeps for one key: two words, whose meaning depends on the algorithm.
/// GCRA: `a` is the theoretical arrival time. Fixed window: `a` is the window's end, `b` the count.
/// Either way `a` is when the key stops mattering: from then on, a missing key decides the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct State {
    pub a: u64,
    pub b: u64,
}

/// The outcome of one limiter for one request, with everything the headers need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    pub allowed: bool,
    pub limit: u32,
    pub remaining: u32,
    /// Nanoseconds until the bucket is full again (the quota fully restored).
    pub reset_after_ns: Nanos,
    /// Nanoseconds until a refused request would be allowed; 0 when allowed.
    pub retry_after_ns: Nanos,
}

/// Decide one request. Returns the verdict and the state to store: `Some` when the
/// request was allowed (budget consumed), `None` when nothing changes.
pub fn decide(quota: &Quota, state: Option<State>, now: Nanos) -> (Verdict, Option<State>) {
    match quota.algorithm {
        Algorithm::Gcra => gcra::decide(quota, state, now),
        Algorithm::FixedWindow => fixed_window::decide(quota, state, now),
    }
}

impl State {
    /// When this state stops mattering: from this instant on, a missing key decides the same.
    pub fn expires_at(&self) -> Nanos {
        self.a
    }
}

/// Whole seconds, rounded up: how headers speak of a wait. Never 0 for a positive wait.
pub fn ceil_secs(ns: Nanos) -> u64 {
    ns.div_ceil(1_000_000_000)
}
