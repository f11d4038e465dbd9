//! `analysts`: a site's analysts behind one NAT, each with a dashboard open that polls the API
//! every `dashboard_poll_seconds`, each poll [`traffic::DASHBOARD_REQUESTS_PER_POLL`] requests
//! at once (the page's widgets and the notification bell: the dashboard load `check` uses,
//! [`traffic::dashboard_per_minute`]), run twice: with verified dashboard tokens (each analyst
//! is a `user:<id>` principal) and without (every dashboard falls back to the NAT's IP).
//!
//! Dashboards poll on a timer and do not read `Retry-After`: a refused request is a blank
//! widget until the next tick. Verified tokens are issued and checked by [`super::SimVerifier`], which
//! stands for a configured verifier.

use super::{ip, Answer, Queue, Req, Rng, Series, Sim, NS, SIM_TOKEN_PREFIX, SITE_NAT};
use crate::calibration::traffic;
use crate::config::Config;
use serde::Serialize;

/// Virtual length of each run.
pub(crate) const DURATION_SECONDS: u64 = 30 * 60;

/// One run's figures.
#[derive(Debug, Clone, Serialize)]
pub struct AnalystsRun {
    pub requests: u64,
    pub refused: u64,
    pub max_refused_per_analyst: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct AnalystsReport {
    pub scenario: &'static str,
    pub analysts: u64,
    pub poll_seconds: std::num::NonZeroU64,
    /// Requests each dashboard sends per poll: its widgets and the notification bell.
    pub requests_per_poll: u64,
    pub duration_seconds: u64,
    /// How the tokens were verified: a simulator verifier that accepts exactly the tokens the
    /// scenario issues, standing for a configured verifier and verified users.
    pub token_verification: &'static str,
    /// With verified dashboard tokens (the run these three figures describe).
    pub requests: u64,
    pub refused: u64,
    pub max_refused_per_analyst: u64,
    /// The same dashboards without verified tokens: all of them keyed on the NAT's IP.
    pub without_verified_tokens: AnalystsRun,
    /// The run with verified tokens, per bin.
    #[serde(skip)]
    pub series: Series,
    /// The run without verified tokens, per bin, on the same clock from zero.
    #[serde(skip)]
    pub series_without_verified_tokens: Series,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Ev(usize);

async fn one(cfg: &Config, seed: u64, verified: bool) -> (AnalystsRun, Series) {
    let m = cfg.fleet.analysts_per_nat.get() as usize;
    let every = super::ns(cfg.fleet.dashboard_poll_seconds.get());
    let nat = ip(SITE_NAT);
    let mut rng = Rng::new(seed);
    let mut sim = Sim::new(cfg);
    let mut q = Queue::default();
    let mut refused = vec![0u64; m];
    for i in 0..m {
        q.push(rng.within((every / NS) as f64), Ev(i));
    }
    while let Some((t, Ev(i))) = q.pop_until(DURATION_SECONDS * NS) {
        // The analyst's token is made when the dashboard sends it; the simulator keeps none.
        let token = verified.then(|| format!("{SIM_TOKEN_PREFIX}{}", i + 1));
        let req = Req {
            peer: nat,
            route: traffic::DASHBOARD,
            agent_id: None,
            bearer: token.as_deref(),
        };
        // One poll: every widget of the page and the bell, together.
        for _ in 0..traffic::DASHBOARD_REQUESTS_PER_POLL {
            if let Answer::Refused { .. } = sim.send(t, &req).await {
                refused[i] += 1;
            }
        }
        q.push(t + every, Ev(i));
    }
    sim.series.pad_to(DURATION_SECONDS);
    let run = AnalystsRun {
        requests: sim.requests,
        refused: sim.refused,
        max_refused_per_analyst: refused.iter().copied().max().unwrap_or(0),
    };
    (run, sim.series)
}

pub(crate) async fn run(cfg: &Config, seed: u64) -> AnalystsReport {
    let (with, series) = one(cfg, seed, true).await;
    let (without, series_without_verified_tokens) = one(cfg, seed, false).await;
    AnalystsReport {
        scenario: "analysts",
        analysts: cfg.fleet.analysts_per_nat.get(),
        poll_seconds: cfg.fleet.dashboard_poll_seconds,
        requests_per_poll: traffic::DASHBOARD_REQUESTS_PER_POLL,
        duration_seconds: DURATION_SECONDS,
        token_verification: "simulated: the tokens the scenario issues verify as their analyst",
        requests: with.requests,
        refused: with.refused,
        max_refused_per_analyst: with.max_refused_per_analyst,
        without_verified_tokens: without,
        series,
        series_without_verified_tokens,
    }
}
