//! `abuse`: three hostile clients, each from its own address, each sending 20 requests a second
//! for ten minutes and ignoring `Retry-After`:
//!
//! - `agent-id-rotation`: heartbeats with a fresh `X-Agent-ID` on every request;
//! - `api-key-spray`: `Authorization: Bearer pa_<random>` against the API;
//! - `cli-token-stuffing`: random CLI bearer tokens against the API.
//!
//! The scenario runs whatever policy the configuration gives and reports how many requests a
//! minute each one got through.

use super::{ip, secs, Answer, Queue, Req, Rng, Series, Sim, NS};
use crate::calibration::traffic;
use crate::config::Config;
use serde::Serialize;
use std::collections::BTreeMap;

pub(crate) const DURATION_SECONDS: u64 = 10 * 60;
pub(crate) const RATE_PER_SECOND: u64 = 20;

#[derive(Debug, Clone, Serialize)]
pub struct Attacker {
    pub name: &'static str,
    pub route: String,
    pub requests: u64,
    pub refused: u64,
    pub admitted_per_minute: f64,
    /// This client's requests alone, admitted and refused, per bin.
    #[serde(skip)]
    pub series: Series,
}

#[derive(Debug, Clone, Serialize)]
pub struct AbuseReport {
    pub scenario: &'static str,
    pub duration_seconds: u64,
    pub rate_per_second: u64,
    pub requests: u64,
    pub refused: u64,
    /// Requests a minute each attacker got through.
    pub admitted_per_minute: BTreeMap<&'static str, f64>,
    pub attackers: Vec<Attacker>,
    #[serde(skip)]
    pub series: Series,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Ev(usize);

const ATTACKERS: [(&str, &str, (&str, &str)); 3] = [
    ("agent-id-rotation", "198.51.100.7", traffic::HEARTBEAT),
    ("api-key-spray", "198.51.100.8", traffic::DASHBOARD),
    ("cli-token-stuffing", "198.51.100.9", traffic::DASHBOARD),
];

pub(crate) async fn run(cfg: &Config, seed: u64) -> AbuseReport {
    let mut rng = Rng::new(seed);
    let mut sim = Sim::new(cfg);
    let mut q = Queue::default();
    let gap = NS / RATE_PER_SECOND;
    let mut counts = [(0u64, 0u64); ATTACKERS.len()];
    let mut per_client: Vec<Series> = vec![
        Series {
            bin_seconds: super::BIN_SECONDS,
            ..Series::default()
        };
        ATTACKERS.len()
    ];
    for k in 0..ATTACKERS.len() {
        q.push(rng.within(secs(gap)), Ev(k));
    }
    while let Some((t, Ev(k))) = q.pop_until(DURATION_SECONDS * NS) {
        let (name, addr, route) = ATTACKERS[k];
        let fresh = format!("{:016x}{:016x}", rng.next_u64(), rng.next_u64());
        let (agent_id, bearer) = match name {
            "agent-id-rotation" => (Some(format!("agent-{fresh}")), None),
            "api-key-spray" => (None, Some(format!("pa_{fresh}"))),
            _ => (None, Some(fresh)),
        };
        let req = Req {
            peer: ip(addr),
            route,
            agent_id: agent_id.as_deref(),
            bearer: bearer.as_deref(),
        };
        counts[k].0 += 1;
        let answer = sim.send(t, &req).await;
        per_client[k].record(t, answer == Answer::Admitted);
        if let Answer::Refused { .. } = answer {
            counts[k].1 += 1;
        }
        q.push(t + gap, Ev(k));
    }
    let minutes = DURATION_SECONDS as f64 / 60.0;
    let attackers: Vec<Attacker> = ATTACKERS
        .iter()
        .zip(counts)
        .zip(per_client)
        .map(
            |(((name, _, route), (requests, refused)), mut series)| Attacker {
                name,
                route: format!("{} {}", route.0, route.1),
                requests,
                refused,
                admitted_per_minute: ((requests - refused) as f64 / minutes * 10.0).round() / 10.0,
                series: {
                    series.pad_to(DURATION_SECONDS);
                    series
                },
            },
        )
        .collect();
    sim.series.pad_to(DURATION_SECONDS);
    AbuseReport {
        scenario: "abuse",
        duration_seconds: DURATION_SECONDS,
        rate_per_second: RATE_PER_SECOND,
        requests: sim.requests,
        refused: sim.refused,
        admitted_per_minute: attackers
            .iter()
            .map(|a| (a.name, a.admitted_per_minute))
            .collect(),
        attackers,
        series: sim.series,
    }
}
