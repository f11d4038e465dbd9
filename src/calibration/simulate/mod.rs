//! Scripted populations against the real limiter, in virtual time.
//!
//! Every request goes through [`Decider::decide`]: the configured policy picks the limiters,
//! the key functions name the buckets, a [`MemoryStore`] decides them on a [`ManualClock`]. No
//! socket is opened and nothing sleeps: the clock jumps from one scheduled request to the next,
//! so hours of traffic take well under a second in a release build. The same seed gives the
//! same run, request for request.
//!
//! The simulator always uses the memory store (the Redis store runs the same math). Dashboard
//! tokens are checked by [`SimVerifier`], which accepts exactly the tokens the `analysts`
//! scenario hands its analysts: it stands for a configured verifier and a verified user.

pub(crate) mod abuse;
pub(crate) mod analysts;
pub(crate) mod auth_ceilings;
pub(crate) mod failed_only;
pub(crate) mod fleet;
pub(crate) mod herd;
pub(crate) mod nat_rollout;
pub(crate) mod rollout;
pub(crate) mod rotation;
pub(crate) mod table_flood;

pub(crate) use abuse::AbuseReport;
pub(crate) use analysts::AnalystsReport;
pub(crate) use failed_only::FailedOnlyReport;
pub use fleet::FleetReport;
pub(crate) use herd::HerdReport;
pub(crate) use nat_rollout::NatRolloutReport;
pub(crate) use rollout::RolloutReport;
pub(crate) use rotation::RotationReport;
pub(crate) use table_flood::TableFloodReport;

use crate::clock::{ManualClock, Nanos};
use crate::config::Config;
use crate::decision::{Decider, RequestFacts};
use crate::identity::TokenVerifier;
use crate::path::CanonicalPath;
use crate::store::memory::MemoryStore;
use futures_util::future::BoxFuture;
use serde::Serialize;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::IpAddr;
use std::num::NonZeroU64;
use std::path::PathBuf;
use std::sync::Arc;

pub(crate) const NS: Nanos = 1_000_000_000;
/// Virtual time starts at [`SIM_EPOCH_UNIX`], on the Unix epoch's time line like the system
/// clock, so calendar windows fall on the calendar's days.
const ORIGIN: Nanos = SIM_EPOCH_UNIX * NS;
/// The wall-clock instant virtual time starts at (2026-12-01T12:00:00Z), for overrides that
/// expire.
pub(crate) const SIM_EPOCH_UNIX: u64 = 1_796_126_400;

/// The wall clock of virtual time: [`SIM_EPOCH_UNIX`] when the run starts.
struct VirtualWall(ManualClock);

impl crate::overrides::WallClock for VirtualWall {
    fn unix_now(&self) -> u64 {
        use crate::clock::Clock;
        SIM_EPOCH_UNIX + self.0.now().saturating_sub(ORIGIN) / NS
    }
}
/// Width of one bar of the admitted/refused time series.
pub(crate) const BIN_SECONDS: NonZeroU64 = NonZeroU64::new(10).unwrap();
/// The NAT every fleet, installer and analyst of a site sits behind.
pub(crate) const SITE_NAT: &str = "203.0.113.10";

/// The scenarios, in the order `all` runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    Fleet,
    Rollout,
    Analysts,
    Abuse,
    Rotation,
    FailedOnly,
    TableFlood,
    AuthCeilings,
    Herd,
    NatRollout,
}

impl Scenario {
    /// What `all` runs: the calibration's scenarios. `nat-rollout` (1.3 million requests on the
    /// built-in budget) runs only by name.
    pub const ALL: [Scenario; 9] = [
        Scenario::Fleet,
        Scenario::Rollout,
        Scenario::Analysts,
        Scenario::Abuse,
        Scenario::Rotation,
        Scenario::FailedOnly,
        Scenario::TableFlood,
        Scenario::AuthCeilings,
        Scenario::Herd,
    ];

    /// Every scenario, by name.
    const NAMED: [Scenario; 10] = [
        Scenario::Fleet,
        Scenario::Rollout,
        Scenario::Analysts,
        Scenario::Abuse,
        Scenario::Rotation,
        Scenario::FailedOnly,
        Scenario::TableFlood,
        Scenario::AuthCeilings,
        Scenario::Herd,
        Scenario::NatRollout,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Scenario::Fleet => "fleet",
            Scenario::Rollout => "rollout",
            Scenario::Analysts => "analysts",
            Scenario::Abuse => "abuse",
            Scenario::Rotation => "rotation",
            Scenario::FailedOnly => "failed-only",
            Scenario::TableFlood => "table-flood",
            Scenario::AuthCeilings => "auth-ceilings",
            Scenario::Herd => "herd",
            Scenario::NatRollout => "nat-rollout",
        }
    }

    /// `fleet`, `rollout`, `analysts`, `abuse`, `rotation`, `failed-only`, `table-flood`,
    /// `auth-ceilings`, `herd`, `nat-rollout`, or `all`.
    pub fn parse_list(s: &str) -> Result<Vec<Scenario>, String> {
        if s.eq_ignore_ascii_case("all") {
            return Ok(Self::ALL.to_vec());
        }
        Self::NAMED
            .iter()
            .find(|sc| sc.name().eq_ignore_ascii_case(s))
            .map(|sc| vec![*sc])
            .ok_or_else(|| {
                format!(
                    "unknown scenario `{s}`; use fleet, rollout, analysts, abuse, rotation, failed-only, table-flood, auth-ceilings, herd, nat-rollout or all"
                )
            })
    }
}

/// One scenario's outcome.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum ScenarioReport {
    Fleet(FleetReport),
    Rollout(RolloutReport),
    Analysts(AnalystsReport),
    Abuse(AbuseReport),
    Rotation(RotationReport),
    FailedOnly(FailedOnlyReport),
    TableFlood(TableFloodReport),
    AuthCeilings(auth_ceilings::AuthCeilingsReport),
    Herd(Box<HerdReport>),
    NatRollout(NatRolloutReport),
}

impl ScenarioReport {
    pub fn name(&self) -> &'static str {
        match self {
            ScenarioReport::Fleet(_) => "fleet",
            ScenarioReport::Rollout(_) => "rollout",
            ScenarioReport::Analysts(_) => "analysts",
            ScenarioReport::Abuse(_) => "abuse",
            ScenarioReport::Rotation(_) => "rotation",
            ScenarioReport::FailedOnly(_) => "failed-only",
            ScenarioReport::TableFlood(_) => "table-flood",
            ScenarioReport::AuthCeilings(_) => "auth-ceilings",
            ScenarioReport::Herd(_) => "herd",
            ScenarioReport::NatRollout(_) => "nat-rollout",
        }
    }

    /// Admitted and refused requests per `BIN_SECONDS` of virtual time.
    pub fn series(&self) -> &Series {
        match self {
            ScenarioReport::Fleet(r) => &r.series,
            ScenarioReport::Rollout(r) => &r.series,
            ScenarioReport::Analysts(r) => &r.series,
            ScenarioReport::Abuse(r) => &r.series,
            ScenarioReport::Rotation(r) => &r.series,
            ScenarioReport::FailedOnly(r) => &r.series,
            ScenarioReport::TableFlood(r) => &r.series,
            ScenarioReport::AuthCeilings(r) => &r.series,
            ScenarioReport::Herd(r) => &r.poll_slots.series,
            ScenarioReport::NatRollout(r) => &r.with_override.series,
        }
    }
}

/// Everything `simulate` reports.
#[derive(Debug, Clone, Serialize)]
pub struct SimulationReport {
    /// The configuration file, or `None` for the built-in calibration.
    pub config: Option<PathBuf>,
    pub seed: u64,
    pub scenarios: Vec<ScenarioReport>,
}

/// The largest population a scenario simulates (`max_site_endpoints`, `analysts_per_nat`).
pub(crate) const MAX_POPULATION: u64 = 10_000;

/// Why `simulate` could not run.
#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    /// A population setting is larger than the simulator runs.
    #[error("{name} = {n} is more than the simulator runs; simulate at most {MAX_POPULATION}")]
    TooLarge { name: &'static str, n: u64 },
    /// The runtime the scenarios run on could not be built.
    #[error(transparent)]
    Runtime(#[from] std::io::Error),
}

/// Run the scenarios against a configuration.
pub fn run(
    cfg: &Config,
    scenarios: &[Scenario],
    seed: u64,
) -> Result<SimulationReport, SimulateError> {
    for (name, n) in [
        (
            "fleet.max_site_endpoints",
            cfg.fleet.max_site_endpoints.get(),
        ),
        ("fleet.analysts_per_nat", cfg.fleet.analysts_per_nat.get()),
    ] {
        if n > MAX_POPULATION {
            return Err(SimulateError::TooLarge { name, n });
        }
    }
    let rt = tokio::runtime::Builder::new_current_thread().build()?;
    let reports = rt.block_on(async {
        let mut out = Vec::with_capacity(scenarios.len());
        for sc in scenarios {
            // Each scenario draws its own stream of numbers, so running one alone or within
            // `all` gives the same figures.
            let s = seed ^ sc.salt();
            out.push(match sc {
                Scenario::Fleet => ScenarioReport::Fleet(fleet::run(cfg, s).await),
                Scenario::Rollout => ScenarioReport::Rollout(rollout::run(cfg, s).await),
                Scenario::Analysts => ScenarioReport::Analysts(analysts::run(cfg, s).await),
                Scenario::Abuse => ScenarioReport::Abuse(abuse::run(cfg, s).await),
                Scenario::Rotation => ScenarioReport::Rotation(rotation::run(cfg, s).await),
                Scenario::FailedOnly => ScenarioReport::FailedOnly(failed_only::run(cfg, s).await),
                Scenario::TableFlood => ScenarioReport::TableFlood(table_flood::run(cfg, s).await),
                Scenario::AuthCeilings => {
                    ScenarioReport::AuthCeilings(auth_ceilings::run(cfg, s).await)
                }
                Scenario::Herd => ScenarioReport::Herd(Box::new(herd::run(cfg, s).await)),
                Scenario::NatRollout => ScenarioReport::NatRollout(nat_rollout::run(cfg, s).await),
            });
        }
        out
    });
    Ok(SimulationReport {
        config: cfg.source.clone(),
        seed,
        scenarios: reports,
    })
}

impl Scenario {
    fn salt(self) -> u64 {
        match self {
            Scenario::Fleet => 0x0f1e_e700,
            Scenario::Rollout => 0x0a0d_0001,
            Scenario::Analysts => 0x0a7a_1500,
            Scenario::Abuse => 0x0ab0_5e00,
            Scenario::Rotation => 0x0a9e_1d00,
            Scenario::FailedOnly => 0x0fa1_1ed0,
            Scenario::TableFlood => 0x07ab_1e00,
            Scenario::AuthCeilings => 0x0a07_ce11,
            Scenario::Herd => 0x04e2_d000,
            Scenario::NatRollout => 0x0a7a_2000,
        }
    }
}

/// A small, fully specified PRNG (SplitMix64): the same seed gives the same run on every
/// platform and every version of every dependency.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `[lo, hi]`.
    pub(crate) fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// Uniform duration in `[0, secs)` seconds, in nanoseconds.
    pub(crate) fn within(&mut self, secs: f64) -> Nanos {
        (self.unit() * secs * NS as f64) as Nanos
    }

    /// How a well-behaved client waits after a 429: the `Retry-After` it was given, plus up to
    /// a fifth of it and up to one second more of random jitter, so retries do not arrive together.
    pub(crate) fn backoff(&mut self, retry_after_secs: u64) -> Nanos {
        let ra = retry_after_secs.max(1) as f64;
        ((ra * (1.0 + 0.2 * self.unit()) + self.unit()) * NS as f64) as Nanos
    }
}

/// Stands for a configured token verifier: a dashboard token `sim-analyst-<n>` verifies as the
/// user `analyst-<n>`; every other token fails verification.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct SimVerifier;

/// The prefix of the tokens [`SimVerifier`] accepts.
pub(crate) const SIM_TOKEN_PREFIX: &str = "sim-analyst-";

impl TokenVerifier for SimVerifier {
    fn verify<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Option<String>> {
        let user = token
            .strip_prefix(SIM_TOKEN_PREFIX)
            .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            .map(|n| format!("analyst-{n}"));
        Box::pin(async move { user })
    }
}

/// Admitted and refused requests per [`BIN_SECONDS`] of virtual time.
#[derive(Debug, Clone, Serialize)]
pub struct Series {
    pub bin_seconds: NonZeroU64,
    pub admitted: Vec<u64>,
    pub refused: Vec<u64>,
}

impl Default for Series {
    /// Empty, in bins of [`BIN_SECONDS`].
    fn default() -> Self {
        Self {
            bin_seconds: BIN_SECONDS,
            admitted: Vec::new(),
            refused: Vec::new(),
        }
    }
}

impl Series {
    /// Extend with empty bins to cover `secs` of virtual time (a quiet end still shows).
    pub fn pad_to(&mut self, secs: u64) {
        let bins = secs.div_ceil(self.bin_seconds.get()) as usize;
        if self.admitted.len() < bins {
            self.admitted.resize(bins, 0);
            self.refused.resize(bins, 0);
        }
    }

    pub(crate) fn record(&mut self, at: Nanos, admitted: bool) {
        let bin = (at / (self.bin_seconds.get() * NS)) as usize;
        if self.admitted.len() <= bin {
            self.admitted.resize(bin + 1, 0);
            self.refused.resize(bin + 1, 0);
        }
        if admitted {
            self.admitted[bin] += 1;
        } else {
            self.refused[bin] += 1;
        }
    }
}

/// One simulated request.
pub(crate) struct Req<'a> {
    pub peer: IpAddr,
    /// Method and path, written in the scenario (so already canonical).
    pub route: (&'static str, &'static str),
    pub agent_id: Option<&'a str>,
    /// The token of `Authorization: Bearer <token>`.
    pub bearer: Option<&'a str>,
}

/// What the limiter answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    Admitted,
    Refused { retry_after_secs: u64 },
}

/// Told of every request a scenario sends: virtual nanoseconds since the run's start, and the
/// request.
pub(crate) type Emitter = Box<dyn FnMut(Nanos, &Req<'_>)>;

thread_local! {
    /// The emitter of a [`run_emitting`] on this thread.
    static EMITTER: std::cell::RefCell<Option<Emitter>> = const { std::cell::RefCell::new(None) };
}

/// [`run`], telling `emit` of every request sent, in the order the limiter decides them (what
/// `simulate --emit-log` writes as an access log for `replay`).
pub(crate) fn run_emitting(
    cfg: &Config,
    scenarios: &[Scenario],
    seed: u64,
    emit: Emitter,
) -> Result<SimulationReport, SimulateError> {
    EMITTER.with_borrow_mut(|e| *e = Some(emit));
    let r = run(cfg, scenarios, seed);
    EMITTER.with_borrow_mut(|e| *e = None);
    r
}

/// The real decision path on a virtual clock, counting what it answers.
pub(crate) struct Sim {
    clock: ManualClock,
    decider: Decider,
    pub requests: u64,
    pub refused: u64,
    pub series: Series,
}

impl Sim {
    pub(crate) fn new(cfg: &Config) -> Self {
        let clock = ManualClock::new(ORIGIN);
        let store = MemoryStore::new(cfg.store.max_keys.max(100_000), Arc::new(clock.clone()));
        Self {
            decider: Decider::new(cfg, Arc::new(store), Arc::new(SimVerifier))
                .with_wall_clock(Arc::new(VirtualWall(clock.clone()))),
            clock,
            requests: 0,
            refused: 0,
            series: Series {
                bin_seconds: BIN_SECONDS,
                ..Series::default()
            },
        }
    }

    /// The known-agents table's counts now.
    pub(crate) fn known_agents(&self) -> crate::known_agents::Counts {
        self.decider.known_agents().counts()
    }

    /// Decide one request at `at` nanoseconds of virtual time.
    pub(crate) async fn send(&mut self, at: Nanos, req: &Req<'_>) -> Answer {
        self.send_inner(at, req, None, &[]).await
    }

    /// [`Sim::send`], and when admitted, answered with `status` at once: limiters that count only
    /// failed (or only succeeded) answers give it back as the gateway does.
    pub(crate) async fn send_answered(&mut self, at: Nanos, req: &Req<'_>, status: u16) -> Answer {
        self.send_inner(at, req, Some(status), &[]).await
    }

    /// [`Sim::send_answered`] for a request whose body names `body` (the normalised values of
    /// the fields `body:<field>` limiters read, as the middleware reads them).
    pub(crate) async fn send_with_body(
        &mut self,
        at: Nanos,
        req: &Req<'_>,
        status: u16,
        body: &[crate::decision::BodyValue],
    ) -> Answer {
        self.send_inner(at, req, Some(status), body).await
    }

    async fn send_inner(
        &mut self,
        at: Nanos,
        req: &Req<'_>,
        status: Option<u16>,
        body: &[crate::decision::BodyValue],
    ) -> Answer {
        EMITTER.with_borrow_mut(|e| {
            if let Some(emit) = e {
                emit(at, req);
            }
        });
        self.clock.set(ORIGIN + at);
        let authorization = req.bearer.map(|t| format!("Bearer {t}"));
        let facts = RequestFacts {
            peer: req.peer,
            method: req.route.0,
            path: CanonicalPath::of_static(req.route.1),
            forwarded: &[],
            agent_id: req.agent_id.map(str::as_bytes),
            authorization: authorization.as_deref().map(str::as_bytes),
            session_token: None,
            key_headers: crate::decision::KeyHeaders::default().with_body(body),
        };
        let settings = self.decider.settings();
        let outcome = self.decider.decide_with(&settings, &facts).await;
        if let Some(status) = status {
            if let Some(work) = self
                .decider
                .give_back(&settings, &outcome, status, || std::time::Duration::ZERO)
            {
                work.await;
            }
        }
        self.requests += 1;
        let refused = outcome.refused();
        self.series.record(at, !refused);
        if refused {
            self.refused += 1;
            Answer::Refused {
                retry_after_secs: outcome.retry_after_secs().unwrap_or(1),
            }
        } else {
            Answer::Admitted
        }
    }
}

/// Events due at instants of virtual time, first come first served.
pub(crate) struct Queue<E: Ord> {
    heap: BinaryHeap<Reverse<(Nanos, u64, E)>>,
    seq: u64,
}

impl<E: Ord> Default for Queue<E> {
    fn default() -> Self {
        Self {
            heap: BinaryHeap::new(),
            seq: 0,
        }
    }
}

impl<E: Ord> Queue<E> {
    pub(crate) fn push(&mut self, at: Nanos, e: E) {
        self.seq += 1;
        self.heap.push(Reverse((at, self.seq, e)));
    }

    /// The next event due before `until`: a run of `until` holds the instants `0..until`.
    pub(crate) fn pop_until(&mut self, until: Nanos) -> Option<(Nanos, E)> {
        match self.heap.peek() {
            Some(Reverse((at, _, _))) if *at < until => {
                self.heap.pop().map(|Reverse((at, _, e))| (at, e))
            }
            _ => None,
        }
    }
}

/// Parse a literal address used by the scenarios.
pub(crate) fn ip(s: &str) -> IpAddr {
    s.parse()
        .unwrap_or(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST))
}

/// Seconds from the configuration as nanoseconds, capped at ten years (far past any run).
pub(crate) fn ns(secs: u64) -> Nanos {
    secs.min(10 * 365 * 86_400) * NS
}

pub(crate) fn secs(ns: Nanos) -> f64 {
    ns as f64 / NS as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_deterministic_and_spread() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        let xs: Vec<u64> = (0..5).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..5).map(|_| b.next_u64()).collect();
        assert_eq!(xs, ys);
        let mut r = Rng::new(1);
        let mean = (0..10_000).map(|_| r.unit()).sum::<f64>() / 10_000.0;
        assert!((mean - 0.5).abs() < 0.02, "{mean}");
        let w = r.backoff(10);
        assert!((10 * NS..13 * NS).contains(&w), "{w}");
    }

    #[test]
    fn sim_verifier_accepts_only_scenario_tokens() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            assert_eq!(
                SimVerifier.verify("sim-analyst-3").await.as_deref(),
                Some("analyst-3")
            );
            assert_eq!(SimVerifier.verify("sim-analyst-").await, None);
            assert_eq!(SimVerifier.verify("sim-analyst-x").await, None);
            assert_eq!(SimVerifier.verify("forged").await, None);
        });
    }

    #[test]
    fn extreme_fleet_settings_neither_panic_nor_run_forever() {
        let mut cfg = Config::default();
        let n = |n| std::num::NonZeroU64::new(n).expect("positive");
        cfg.fleet.heartbeat_interval_seconds = n(u64::MAX);
        cfg.fleet.poll_interval_seconds = n(1);
        cfg.fleet.heartbeat_timeout_seconds = n(u64::MAX);
        cfg.fleet.dashboard_poll_seconds = n(u64::MAX);
        cfg.fleet.max_site_endpoints = n(3);
        cfg.fleet.analysts_per_nat = n(1);
        let r = run(&cfg, &[Scenario::Fleet, Scenario::Analysts], 1).unwrap();
        assert_eq!(r.scenarios.len(), 2);
        cfg.fleet.max_site_endpoints = n(MAX_POPULATION + 1);
        let e = run(&cfg, &[Scenario::Rollout], 1).unwrap_err().to_string();
        assert!(e.contains("fleet.max_site_endpoints = 10001"), "{e}");
    }

    #[test]
    fn scenario_names() {
        assert_eq!(Scenario::parse_list("all").unwrap().len(), 9);
        assert_eq!(Scenario::parse_list("herd").unwrap(), vec![Scenario::Herd]);
        assert_eq!(
            Scenario::parse_list("nat-rollout").unwrap(),
            vec![Scenario::NatRollout]
        );
        assert_eq!(
            Scenario::parse_list("auth-ceilings").unwrap(),
            vec![Scenario::AuthCeilings]
        );
        assert_eq!(
            Scenario::parse_list("Fleet").unwrap(),
            vec![Scenario::Fleet]
        );
        assert!(Scenario::parse_list("nope")
            .unwrap_err()
            .contains("unknown scenario"));
    }
}
