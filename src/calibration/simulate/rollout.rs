//! `rollout`: a mass deployment (Intune, SCCM, GPO) pushing the agent to every endpoint of a
//! site at once, all behind one NAT.
//!
//! `max_site_endpoints` installers start within the first five minutes. Each downloads the agent,
//! installs it for 5-30 s and enrolls. Installers have no agent id yet. A refused request is
//! retried after its `Retry-After` plus jitter, for as long as it takes (the run stops after two
//! days of virtual time).

use super::{ip, secs, Answer, Queue, Req, Rng, Series, Sim, NS, SITE_NAT};
use crate::calibration::traffic;
use crate::clock::Nanos;
use crate::config::Config;
use serde::Serialize;

/// Installers start within this many seconds.
pub(crate) const START_SPREAD_SECONDS: u64 = 300;
/// The run gives up after this much virtual time.
pub(crate) const CAP_SECONDS: u64 = 2 * 86_400;

#[derive(Debug, Clone, Serialize)]
pub struct RolloutReport {
    pub scenario: &'static str,
    pub endpoints: u64,
    pub requests: u64,
    pub refused: u64,
    pub enrolled: u64,
    /// Seconds from the start of the rollout until the last endpoint enrolled; `null` when some
    /// had not enrolled when the run gave up.
    pub last_enrolled_after_seconds: Option<f64>,
    pub last_downloaded_after_seconds: Option<f64>,
    #[serde(skip)]
    pub series: Series,
    /// Endpoints enrolled by the end of each bin of the series.
    #[serde(skip)]
    pub enrolled_by_bin: Vec<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Download(usize),
    Enroll(usize),
}

pub(crate) async fn run(cfg: &Config, seed: u64) -> RolloutReport {
    run_endpoints(cfg, seed, cfg.fleet.max_site_endpoints.get() as usize).await
}

/// [`run`] for `n` endpoints (whatever `fleet.max_site_endpoints` declares).
pub(crate) async fn run_endpoints(cfg: &Config, seed: u64, n: usize) -> RolloutReport {
    let nat = ip(SITE_NAT);
    let end = CAP_SECONDS * NS;
    let mut rng = Rng::new(seed);
    let mut sim = Sim::new(cfg);
    let mut q = Queue::default();
    for i in 0..n {
        q.push(rng.within(START_SPREAD_SECONDS as f64), Ev::Download(i));
    }
    let (mut enrolled, mut downloaded) = (0u64, 0u64);
    let mut enrolled_by_bin: Vec<u64> = Vec::new();
    let (mut last_enrolled, mut last_downloaded): (Nanos, Nanos) = (0, 0);
    while let Some((t, ev)) = q.pop_until(end) {
        let route = match ev {
            Ev::Download(_) => traffic::DOWNLOAD,
            Ev::Enroll(_) => traffic::ENROLL,
        };
        let req = Req {
            peer: nat,
            route,
            agent_id: None,
            bearer: None,
        };
        match (sim.send(t, &req).await, ev) {
            (Answer::Admitted, Ev::Download(i)) => {
                downloaded += 1;
                last_downloaded = t;
                q.push(t + 5 * NS + rng.within(25.0), Ev::Enroll(i));
            }
            (Answer::Admitted, Ev::Enroll(_)) => {
                let bin = (t / (super::BIN_SECONDS.get() * NS)) as usize;
                if enrolled_by_bin.len() <= bin {
                    enrolled_by_bin.resize(bin + 1, 0);
                }
                enrolled_by_bin[bin] += 1;
                enrolled += 1;
                last_enrolled = t;
            }
            (Answer::Refused { retry_after_secs }, ev) => {
                q.push(t + rng.backoff(retry_after_secs), ev)
            }
        }
    }
    let all = n as u64;
    // Counts per bin to running totals, over the whole series.
    enrolled_by_bin.resize(sim.series.admitted.len().max(enrolled_by_bin.len()), 0);
    let mut total = 0;
    for e in &mut enrolled_by_bin {
        total += *e;
        *e = total;
    }
    let round = |ns: Nanos| (secs(ns) * 10.0).round() / 10.0;
    RolloutReport {
        scenario: "rollout",
        endpoints: all,
        requests: sim.requests,
        refused: sim.refused,
        enrolled,
        last_enrolled_after_seconds: (enrolled == all).then(|| round(last_enrolled)),
        last_downloaded_after_seconds: (downloaded == all).then(|| round(last_downloaded)),
        series: sim.series,
        enrolled_by_bin,
    }
}
