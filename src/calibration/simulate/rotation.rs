//! `rotation`: one host behind a site's NAT rotating agent ids beside the site's healthy agents.
//!
//! The site's `max_site_endpoints` agents idle as in `fleet` (a heartbeat every
//! `heartbeat_interval_seconds`, a task poll every `poll_interval_seconds`, a refused request
//! retried after its `Retry-After` plus jitter). After [`FLOOD_STARTS_SECONDS`] one host at the
//! same NAT starts polling with a fresh `X-Agent-ID` on every request, [`FLOOD_RATE_PER_SECOND`]
//! a second until the end, ignoring `Retry-After`: the client the `agent-ip` ceiling exists to
//! stop. The run counts the healthy agents marked offline and their refused heartbeats, and what
//! the rotating client got through against what the ceiling allows it.

use super::abuse::Attacker;
use super::{ip, secs, Answer, Queue, Req, Rng, Series, Sim, NS, SITE_NAT};
use crate::calibration::traffic;
use crate::clock::Nanos;
use crate::config::Config;
use serde::Serialize;

/// Virtual length of the run.
pub(crate) const DURATION_SECONDS: u64 = 15 * 60;
/// When the rotating client starts: the site's agents have been admitted by then.
pub(crate) const FLOOD_STARTS_SECONDS: u64 = 3 * 60;
const _: () = assert!(FLOOD_STARTS_SECONDS < DURATION_SECONDS);
/// The rotating client's requests a second.
pub(crate) const FLOOD_RATE_PER_SECOND: u64 = 125;

#[derive(Debug, Clone, Serialize)]
pub struct RotationReport {
    pub scenario: &'static str,
    pub agents: u64,
    pub duration_seconds: u64,
    pub flood_starts_seconds: u64,
    pub flood_rate_per_second: u64,
    pub agents_marked_offline: u64,
    pub longest_heartbeat_gap_seconds: f64,
    pub heartbeats: u64,
    pub heartbeats_refused: u64,
    pub polls_refused: u64,
    pub rotating_requests: u64,
    pub rotating_admitted: u64,
    /// The site's heartbeats admitted per minute over the whole run (they beat from its start).
    pub heartbeats_admitted_per_minute: f64,
    /// The rotating client's requests admitted per minute over the flood (from its start).
    pub rotating_admitted_per_minute: f64,
    /// The most new agent ids the `agent-ip` ceiling lets one IP mint over the flood: its burst
    /// plus its refill over the flood's length (`None` when no `agent-ip` limiter is
    /// configured, it is off, or it meters requests).
    pub ceiling_allows: Option<u64>,
    /// The site's heartbeats and the rotating client, admitted per bin, for the plot.
    #[serde(skip)]
    pub clients: Vec<Attacker>,
    #[serde(skip)]
    pub series: Series,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Heartbeat(usize),
    Poll(usize),
    Rotate,
}

/// What the `agent-ip` ceiling allows over `flood_ns`: its burst and its refill, for a
/// `new-agents` ceiling; `None` otherwise.
fn ceiling_allows(cfg: &Config, flood_ns: Nanos) -> Option<u64> {
    let l = cfg
        .limiters
        .iter()
        .find(|l| &*l.name == crate::config::AGENT_IP)?;
    l.new_agents?;
    if l.mode == crate::policy::Mode::Off {
        return None;
    }
    let window = l.quota.window_ns();
    let limit = u64::from(l.quota.limit());
    Some(limit + (u128::from(limit) * u128::from(flood_ns) / u128::from(window)) as u64)
}

pub(crate) async fn run(cfg: &Config, seed: u64) -> RotationReport {
    let f = &cfg.fleet;
    let n = f.max_site_endpoints.get() as usize;
    let hb = super::ns(f.heartbeat_interval_seconds.get());
    let poll = super::ns(f.poll_interval_seconds.get());
    let timeout = super::ns(f.heartbeat_timeout_seconds.get());
    let end = DURATION_SECONDS * NS;
    let flood_start = FLOOD_STARTS_SECONDS * NS;
    let gap = NS / FLOOD_RATE_PER_SECOND;
    let nat = ip(SITE_NAT);
    let mut rng = Rng::new(seed);
    let mut sim = Sim::new(cfg);
    let mut q = Queue::default();
    let bin = |_: ()| Series {
        bin_seconds: super::BIN_SECONDS,
        ..Series::default()
    };
    let (mut site, mut rotating) = (bin(()), bin(()));
    let id = |i: usize| format!("agent-{:04}", i + 1);
    for i in 0..n {
        q.push(rng.within(secs(hb)), Ev::Heartbeat(i));
        q.push(rng.within(secs(poll)), Ev::Poll(i));
    }
    q.push(flood_start, Ev::Rotate);
    let mut last_heartbeat: Vec<Nanos> = vec![0; n];
    let mut offline = vec![false; n];
    let mut longest: Nanos = 0;
    let (mut heartbeats, mut heartbeats_refused, mut polls_refused) = (0u64, 0u64, 0u64);
    let (mut rot_requests, mut rot_admitted) = (0u64, 0u64);
    while let Some((t, ev)) = q.pop_until(end) {
        match ev {
            Ev::Heartbeat(i) => {
                let agent_id = id(i);
                let req = Req {
                    peer: nat,
                    route: traffic::HEARTBEAT,
                    agent_id: Some(&agent_id),
                    bearer: None,
                };
                heartbeats += 1;
                let answer = sim.send(t, &req).await;
                site.record(t, answer == Answer::Admitted);
                match answer {
                    Answer::Admitted => {
                        let g = t - last_heartbeat[i];
                        longest = longest.max(g);
                        offline[i] |= g >= timeout;
                        last_heartbeat[i] = t;
                        q.push(t + hb, Ev::Heartbeat(i));
                    }
                    Answer::Refused { retry_after_secs } => {
                        heartbeats_refused += 1;
                        q.push(t + rng.backoff(retry_after_secs), Ev::Heartbeat(i));
                    }
                }
            }
            Ev::Poll(i) => {
                let agent_id = id(i);
                let req = Req {
                    peer: nat,
                    route: traffic::POLL,
                    agent_id: Some(&agent_id),
                    bearer: None,
                };
                match sim.send(t, &req).await {
                    Answer::Admitted => q.push(t + poll, Ev::Poll(i)),
                    Answer::Refused { retry_after_secs } => {
                        polls_refused += 1;
                        q.push(t + rng.backoff(retry_after_secs), Ev::Poll(i));
                    }
                }
            }
            Ev::Rotate => {
                let fresh = format!("rotating-{:016x}", rng.next_u64());
                let req = Req {
                    peer: nat,
                    route: traffic::POLL,
                    agent_id: Some(&fresh),
                    bearer: None,
                };
                rot_requests += 1;
                let admitted = sim.send(t, &req).await == Answer::Admitted;
                rotating.record(t, admitted);
                rot_admitted += u64::from(admitted);
                q.push(t + gap, Ev::Rotate);
            }
        }
    }
    for (i, last) in last_heartbeat.iter().enumerate() {
        let g = end - last;
        longest = longest.max(g);
        offline[i] |= g >= timeout;
    }
    sim.series.pad_to(DURATION_SECONDS);
    site.pad_to(DURATION_SECONDS);
    rotating.pad_to(DURATION_SECONDS);
    // Each client over the time it was sending: the site from the start, the rotating client
    // from the flood's start.
    let per_min = |admitted: u64, from: u64| {
        let minutes = (DURATION_SECONDS - from) as f64 / 60.0;
        (admitted as f64 / minutes * 10.0).round() / 10.0
    };
    let heartbeats_admitted = heartbeats - heartbeats_refused;
    let heartbeats_admitted_per_minute = per_min(heartbeats_admitted, 0);
    let rotating_admitted_per_minute = per_min(rot_admitted, FLOOD_STARTS_SECONDS);
    let clients = vec![
        Attacker {
            name: "site heartbeats",
            route: format!("{} {}", traffic::HEARTBEAT.0, traffic::HEARTBEAT.1),
            requests: heartbeats,
            refused: heartbeats_refused,
            admitted_per_minute: heartbeats_admitted_per_minute,
            series: site,
        },
        Attacker {
            name: "rotating client",
            route: format!("{} {}", traffic::POLL.0, traffic::POLL.1),
            requests: rot_requests,
            refused: rot_requests - rot_admitted,
            admitted_per_minute: rotating_admitted_per_minute,
            series: rotating,
        },
    ];
    RotationReport {
        scenario: "rotation",
        agents: n as u64,
        duration_seconds: DURATION_SECONDS,
        flood_starts_seconds: FLOOD_STARTS_SECONDS,
        flood_rate_per_second: FLOOD_RATE_PER_SECOND,
        agents_marked_offline: offline.iter().filter(|o| **o).count() as u64,
        longest_heartbeat_gap_seconds: (secs(longest) * 10.0).round() / 10.0,
        heartbeats,
        heartbeats_refused,
        polls_refused,
        rotating_requests: rot_requests,
        rotating_admitted: rot_admitted,
        heartbeats_admitted_per_minute,
        rotating_admitted_per_minute,
        ceiling_allows: ceiling_allows(cfg, end - flood_start),
        clients,
        series: sim.series,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[actix_rt::test]
    async fn the_site_stays_online_while_one_host_rotates_ids_at_its_nat() {
        let cfg = Config::default();
        let r = run(&cfg, 7).await;
        assert_eq!(r.agents, 250);
        assert_eq!(r.agents_marked_offline, 0);
        assert_eq!(r.heartbeats_refused, 0);
        assert_eq!(r.polls_refused, 0);
        let allows = r.ceiling_allows.expect("agent-ip meters new ids");
        assert!(
            r.rotating_admitted <= allows,
            "{} > {allows}",
            r.rotating_admitted
        );
        // 125 a second over the 12 minutes of the flood: the run ends before its 15th minute does.
        let flood = FLOOD_RATE_PER_SECOND * (DURATION_SECONDS - FLOOD_STARTS_SECONDS);
        assert!(
            r.rotating_requests <= flood && r.rotating_requests + 1 >= flood,
            "{}",
            r.rotating_requests
        );
    }

    #[actix_rt::test]
    async fn metering_requests_takes_the_site_offline_under_the_same_flood() {
        let cfg = crate::config::Loader::new()
            .env([(
                "FLEET_LIMITER_LIMITER_AGENT_IP_METER".to_owned(),
                "requests".to_owned(),
            )])
            .load()
            .unwrap();
        let r = run(&cfg, 7).await;
        assert!(r.heartbeats_refused > 0, "{r:?}");
        assert_eq!(r.ceiling_allows, None);
    }
}
