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

/// The site's cadences, read once from the configuration.
#[derive(Clone, Copy)]
struct Cadence {
    hb: Nanos,
    poll: Nanos,
    timeout: Nanos,
}

/// A series in bins of [`super::BIN_SECONDS`], empty.
fn binned() -> Series {
    Series {
        bin_seconds: super::BIN_SECONDS,
        ..Series::default()
    }
}

/// An agent's id, made when it sends.
fn agent_id(i: usize) -> String {
    format!("agent-{:04}", i + 1)
}

/// A rotation run in progress: the site's agents, the rotating client, the tallies.
struct RotationRun {
    cadence: Cadence,
    nat: std::net::IpAddr,
    rng: Rng,
    sim: Sim,
    q: Queue<Ev>,
    site: Series,
    rotating: Series,
    last_heartbeat: Vec<Nanos>,
    offline: Vec<bool>,
    longest: Nanos,
    heartbeats: u64,
    heartbeats_refused: u64,
    polls_refused: u64,
    rot_requests: u64,
    rot_admitted: u64,
}

impl RotationRun {
    /// The site's agents idle, each loop's first request at a random phase, and the rotating
    /// client starts at `flood_start`.
    fn new(cfg: &Config, seed: u64, cadence: Cadence, n: usize, flood_start: Nanos) -> Self {
        let mut rng = Rng::new(seed);
        let mut q = Queue::default();
        for i in 0..n {
            q.push(rng.within(secs(cadence.hb)), Ev::Heartbeat(i));
            q.push(rng.within(secs(cadence.poll)), Ev::Poll(i));
        }
        q.push(flood_start, Ev::Rotate);
        Self {
            cadence,
            nat: ip(SITE_NAT),
            rng,
            sim: Sim::new(cfg),
            q,
            site: binned(),
            rotating: binned(),
            last_heartbeat: vec![0; n],
            offline: vec![false; n],
            longest: 0,
            heartbeats: 0,
            heartbeats_refused: 0,
            polls_refused: 0,
            rot_requests: 0,
            rot_admitted: 0,
        }
    }

    /// A poll or heartbeat from the NAT with `agent_id`, as the limiter answers it.
    async fn send(
        &mut self,
        t: Nanos,
        route: (&'static str, &'static str),
        agent_id: &str,
    ) -> Answer {
        let req = Req {
            peer: self.nat,
            route,
            agent_id: Some(agent_id),
            bearer: None,
        };
        self.sim.send(t, &req).await
    }

    /// Every event due before `end`, in order.
    async fn run_until(&mut self, end: Nanos) {
        while let Some((t, ev)) = self.q.pop_until(end) {
            match ev {
                Ev::Heartbeat(i) => self.heartbeat(t, i).await,
                Ev::Poll(i) => self.poll(t, i).await,
                Ev::Rotate => self.rotate(t).await,
            }
        }
    }

    /// Agent `i`'s heartbeat: its gap since the last admitted one, or a retry after a refusal.
    async fn heartbeat(&mut self, t: Nanos, i: usize) {
        self.heartbeats += 1;
        let answer = self.send(t, traffic::HEARTBEAT, &agent_id(i)).await;
        self.site.record(t, answer == Answer::Admitted);
        match answer {
            Answer::Admitted => {
                let g = t - self.last_heartbeat[i];
                self.longest = self.longest.max(g);
                self.offline[i] |= g >= self.cadence.timeout;
                self.last_heartbeat[i] = t;
                self.q.push(t + self.cadence.hb, Ev::Heartbeat(i));
            }
            Answer::Refused { retry_after_secs } => {
                self.heartbeats_refused += 1;
                let retry = t + self.rng.backoff(retry_after_secs);
                self.q.push(retry, Ev::Heartbeat(i));
            }
        }
    }

    /// Agent `i`'s task poll, retried after a refusal.
    async fn poll(&mut self, t: Nanos, i: usize) {
        match self.send(t, traffic::POLL, &agent_id(i)).await {
            Answer::Admitted => self.q.push(t + self.cadence.poll, Ev::Poll(i)),
            Answer::Refused { retry_after_secs } => {
                self.polls_refused += 1;
                let retry = t + self.rng.backoff(retry_after_secs);
                self.q.push(retry, Ev::Poll(i));
            }
        }
    }

    /// The rotating client's next poll, with a fresh agent id, whatever the last one got.
    async fn rotate(&mut self, t: Nanos) {
        let fresh = format!("rotating-{:016x}", self.rng.next_u64());
        self.rot_requests += 1;
        let admitted = self.send(t, traffic::POLL, &fresh).await == Answer::Admitted;
        self.rotating.record(t, admitted);
        self.rot_admitted += u64::from(admitted);
        self.q.push(t + NS / FLOOD_RATE_PER_SECOND, Ev::Rotate);
    }

    /// The report at `end`: each agent's gap since its last admitted heartbeat counts too.
    fn report(mut self, cfg: &Config, end: Nanos, flood_start: Nanos) -> RotationReport {
        for (i, last) in self.last_heartbeat.iter().enumerate() {
            let g = end - last;
            self.longest = self.longest.max(g);
            self.offline[i] |= g >= self.cadence.timeout;
        }
        self.sim.series.pad_to(DURATION_SECONDS);
        self.site.pad_to(DURATION_SECONDS);
        self.rotating.pad_to(DURATION_SECONDS);
        let heartbeats_admitted = self.heartbeats - self.heartbeats_refused;
        let heartbeats_admitted_per_minute = per_minute(heartbeats_admitted, 0);
        let rotating_admitted_per_minute = per_minute(self.rot_admitted, FLOOD_STARTS_SECONDS);
        let clients = vec![
            Attacker {
                name: "site heartbeats",
                route: format!("{} {}", traffic::HEARTBEAT.0, traffic::HEARTBEAT.1),
                requests: self.heartbeats,
                refused: self.heartbeats_refused,
                admitted_per_minute: heartbeats_admitted_per_minute,
                series: self.site,
            },
            Attacker {
                name: "rotating client",
                route: format!("{} {}", traffic::POLL.0, traffic::POLL.1),
                requests: self.rot_requests,
                refused: self.rot_requests - self.rot_admitted,
                admitted_per_minute: rotating_admitted_per_minute,
                series: self.rotating,
            },
        ];
        RotationReport {
            scenario: "rotation",
            agents: self.last_heartbeat.len() as u64,
            duration_seconds: DURATION_SECONDS,
            flood_starts_seconds: FLOOD_STARTS_SECONDS,
            flood_rate_per_second: FLOOD_RATE_PER_SECOND,
            agents_marked_offline: self.offline.iter().filter(|o| **o).count() as u64,
            longest_heartbeat_gap_seconds: (secs(self.longest) * 10.0).round() / 10.0,
            heartbeats: self.heartbeats,
            heartbeats_refused: self.heartbeats_refused,
            polls_refused: self.polls_refused,
            rotating_requests: self.rot_requests,
            rotating_admitted: self.rot_admitted,
            heartbeats_admitted_per_minute,
            rotating_admitted_per_minute,
            ceiling_allows: ceiling_allows(cfg, end - flood_start),
            clients,
            series: self.sim.series,
        }
    }
}

/// Admitted requests a minute, to a tenth, over the time a client was sending: from `from`
/// seconds to the run's end.
fn per_minute(admitted: u64, from: u64) -> f64 {
    let minutes = (DURATION_SECONDS - from) as f64 / 60.0;
    (admitted as f64 / minutes * 10.0).round() / 10.0
}

/// Run the `rotation` scenario.
pub(crate) async fn run(cfg: &Config, seed: u64) -> RotationReport {
    let f = &cfg.fleet;
    let n = f.max_site_endpoints.get() as usize;
    let cadence = Cadence {
        hb: super::ns(f.heartbeat_interval_seconds.get()),
        poll: super::ns(f.poll_interval_seconds.get()),
        timeout: super::ns(f.heartbeat_timeout_seconds.get()),
    };
    let end = DURATION_SECONDS * NS;
    let flood_start = FLOOD_STARTS_SECONDS * NS;
    let mut rotation = RotationRun::new(cfg, seed, cadence, n, flood_start);
    rotation.run_until(end).await;
    rotation.report(cfg, end, flood_start)
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
