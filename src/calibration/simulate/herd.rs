//! `herd`: a fleet back from an outage. [`AGENTS`] agents, behind NATs of
//! `fleet.max_site_endpoints` each, all send their first heartbeat within the same second and
//! then heartbeat for fifteen minutes, twice through the real decider:
//!
//! - **own cadence**: each agent heartbeats every `heartbeat_interval_seconds` from the moment it
//!   came back; a refused heartbeat is retried after its `Retry-After` plus jitter
//!   ([`Rng::backoff`]), and the cadence carries on from the one that got through;
//! - **poll slots**: each agent waits the answer's `X-Poll-Interval` before its next heartbeat,
//!   worked out as the gateway does ([`Shaping::hint`]: the normalised address, the agent id,
//!   the decision's time and a refusal's `Retry-After`), under the configuration's `[shaping]`
//!   when it shapes the heartbeat, else the heartbeat shaped at the agents' own interval.
//!
//! Each run reports how evenly the heartbeats arrive (the busiest second over the mean second),
//! the heartbeats refused, the agents the backend would mark offline, and when the arrivals
//! settle.

use super::{ns, Answer, Queue, Req, Rng, Series, Sim, NS, ORIGIN};
use crate::calibration::traffic;
use crate::clock::Nanos;
use crate::config::shaping::{Priority, ShapedRoute, ShapingConfig, MAX_INTERVAL, MIN_INTERVAL};
use crate::config::Config;
use crate::policy::RoutePattern;
use crate::shaping::Shaping;
use serde::Serialize;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

/// Agents in the herd.
pub(crate) const AGENTS: usize = 10_000;
/// Virtual length of each run.
pub(crate) const DURATION_SECONDS: u64 = 15 * 60;
/// The agents come back within this first second.
const RETURN_SECONDS: f64 = 1.0;
/// The steady part of a run starts after this many seconds (the herd's first round is over).
pub(crate) const SETTLE_SECONDS: u64 = 60;
/// The early part of a run: the herd's return and the round after it.
pub(crate) const EARLY_SECONDS: u64 = 120;
/// The window steady state is judged over.
pub(crate) const WINDOW_SECONDS: u64 = 10;
/// How far from the mean a steady window may be, as a share of the mean.
pub(crate) const TOLERANCE: f64 = 0.2;
/// The first of the sites' NAT addresses (198.18.0.0/15, set aside for benchmarks).
const FIRST_NAT: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);

#[derive(Debug, Clone, Serialize)]
pub struct HerdReport {
    pub scenario: &'static str,
    pub agents: u64,
    /// NAT addresses the agents sit behind, `fleet.max_site_endpoints` each.
    pub sites: u64,
    pub duration_seconds: u64,
    /// The agents' own cadence, `fleet.heartbeat_interval_seconds`.
    pub heartbeat_interval_seconds: u64,
    /// The interval the poll slots shape the heartbeat at.
    pub slot_interval_seconds: u64,
    /// Whether the slots are the configuration's `[shaping]` (else the heartbeat shaped at the
    /// agents' own interval, for the comparison).
    pub slots_configured: bool,
    /// Each agent on its own cadence from the moment it came back.
    pub own_cadence: HerdRun,
    /// Each agent waiting the `X-Poll-Interval` of every answer.
    pub poll_slots: HerdRun,
}

/// One run of the herd.
#[derive(Debug, Clone, Serialize)]
pub struct HerdRun {
    pub heartbeats: u64,
    pub heartbeats_refused: u64,
    /// Agents that went `heartbeat_timeout_seconds` without an admitted heartbeat after coming
    /// back.
    pub agents_marked_offline: u64,
    /// Heartbeats in the busiest second after the first minute.
    pub busiest_second_after_first_minute: u64,
    /// Heartbeats per second on average after the first minute.
    pub mean_per_second_after_first_minute: f64,
    /// The busiest second over the mean second, after the first minute.
    pub peak_to_mean_after_first_minute: f64,
    /// The busiest second over the mean second, in the first two minutes.
    pub peak_to_mean_first_two_minutes: f64,
    /// The first second from which every 10-second window holds within ±20 % of the mean after
    /// the first minute; `null` when the arrivals never settle.
    pub steady_after_seconds: Option<u64>,
    #[serde(skip)]
    pub series: Series,
}

/// Who the agents are and when each came back: the same in both runs.
struct Herd {
    peers: Vec<IpAddr>,
    /// Each agent's address as a poll slot reads it (normalised).
    addresses: Vec<String>,
    ids: Vec<String>,
    back: Vec<Nanos>,
}

impl Herd {
    /// `n` agents behind NATs of `site` each, back at random instants of the first second.
    fn new(cfg: &Config, seed: u64, n: usize, site: usize) -> Self {
        let mut rng = Rng::new(seed);
        let first = u32::from(FIRST_NAT);
        let peers: Vec<IpAddr> = (0..n)
            .map(|i| {
                let nat = u32::try_from(i / site.max(1)).unwrap_or(u32::MAX);
                IpAddr::V4(Ipv4Addr::from(first.saturating_add(nat)))
            })
            .collect();
        let prefix = cfg.client_ip.ipv6_prefix;
        Self {
            addresses: peers
                .iter()
                .map(|&p| crate::shaping::address_of(p, prefix))
                .collect(),
            ids: (0..n).map(|i| format!("agent-{:05}", i + 1)).collect(),
            back: (0..n).map(|_| rng.within(RETURN_SECONDS)).collect(),
            peers,
        }
    }

    /// Agent `i`'s `X-Poll-Interval` for a heartbeat decided at `t`, as the gateway answers it.
    fn hint(&self, slots: &Shaping, i: usize, t: Nanos, retry_after: Option<u64>) -> Option<u64> {
        let route = slots.route(traffic::HEARTBEAT.0, traffic::HEARTBEAT.1)?;
        slots.hint(
            route,
            &self.addresses[i],
            Some(&self.ids[i]),
            ORIGIN + t,
            retry_after,
            1.0,
        )
    }
}

/// One run in progress: the queue of the agents' next heartbeats and the tallies.
struct HerdSim<'a> {
    herd: &'a Herd,
    slots: Option<&'a Shaping>,
    cadence: Nanos,
    timeout: Nanos,
    sim: Sim,
    rng: Rng,
    q: Queue<usize>,
    /// Each agent's last admitted heartbeat (its return counts as one).
    last: Vec<Nanos>,
    offline: Vec<bool>,
    arrivals: Vec<u64>,
    refused: u64,
}

impl HerdSim<'_> {
    /// Agent `i`'s heartbeat at `t`, and when it sends the next.
    async fn heartbeat(&mut self, t: Nanos, i: usize) {
        let req = Req {
            peer: self.herd.peers[i],
            route: traffic::HEARTBEAT,
            agent_id: Some(&self.herd.ids[i]),
            bearer: None,
        };
        let answer = self.sim.send(t, &req).await;
        if let Some(n) = self.arrivals.get_mut((t / NS) as usize) {
            *n += 1;
        }
        let retry_after = match answer {
            Answer::Admitted => {
                if t - self.last[i] >= self.timeout {
                    self.offline[i] = true;
                }
                self.last[i] = t;
                None
            }
            Answer::Refused { retry_after_secs } => {
                self.refused += 1;
                Some(retry_after_secs)
            }
        };
        let hint = self
            .slots
            .and_then(|s| self.herd.hint(s, i, t, retry_after));
        let wait = match (hint, retry_after) {
            (Some(secs), _) => ns(secs),
            (None, None) => self.cadence,
            (None, Some(ra)) => self.rng.backoff(ra),
        };
        self.q.push(t + wait, i);
    }

    /// Every heartbeat of the run, then its figures.
    async fn run(mut self) -> HerdRun {
        let end = DURATION_SECONDS * NS;
        while let Some((t, i)) = self.q.pop_until(end) {
            self.heartbeat(t, i).await;
        }
        for (last, offline) in self.last.iter().zip(&mut self.offline) {
            if end - last >= self.timeout {
                *offline = true;
            }
        }
        self.sim.series.pad_to(DURATION_SECONDS);
        let settled = &self.arrivals[SETTLE_SECONDS as usize..];
        let busiest = settled.iter().copied().max().unwrap_or(0);
        let mean = settled.iter().sum::<u64>() as f64 / settled.len().max(1) as f64;
        HerdRun {
            heartbeats: self.sim.requests,
            heartbeats_refused: self.refused,
            agents_marked_offline: self.offline.iter().filter(|&&o| o).count() as u64,
            busiest_second_after_first_minute: busiest,
            mean_per_second_after_first_minute: round2(mean),
            peak_to_mean_after_first_minute: round2(peak_to_mean(settled)),
            peak_to_mean_first_two_minutes: round2(peak_to_mean(
                &self.arrivals[..EARLY_SECONDS as usize],
            )),
            steady_after_seconds: steady_after(&self.arrivals, mean),
            series: self.sim.series,
        }
    }
}

/// One run of `herd` through a fresh decider: with `slots`, each agent waits its hints.
async fn run_once(cfg: &Config, seed: u64, herd: &Herd, slots: Option<&Shaping>) -> HerdRun {
    let n = herd.ids.len();
    let mut q = Queue::default();
    for (i, &t) in herd.back.iter().enumerate() {
        q.push(t, i);
    }
    HerdSim {
        herd,
        slots,
        cadence: ns(cfg.fleet.heartbeat_interval_seconds.get()),
        timeout: ns(cfg.fleet.heartbeat_timeout_seconds.get()),
        sim: Sim::new(cfg),
        rng: Rng::new(seed),
        q,
        last: herd.back.clone(),
        offline: vec![false; n],
        arrivals: vec![0; DURATION_SECONDS as usize],
        refused: 0,
    }
    .run()
    .await
}

/// The configuration's slots if they shape the heartbeat (`true`), else the heartbeat's alone.
fn heartbeat_slots(cfg: &Config, interval: u64) -> (Option<Shaping>, bool) {
    // Else the heartbeat alone at `interval` seconds, within `[shaping]`'s bounds.
    let (method, path) = traffic::HEARTBEAT;
    if let Some(slots) = Shaping::of(&cfg.shaping) {
        if slots.interval_of(method, path).is_some() {
            return (Some(slots), true);
        }
    }
    let interval = Duration::from_secs(interval).clamp(MIN_INTERVAL, MAX_INTERVAL);
    let shaping = ShapingConfig {
        routes: vec![ShapedRoute {
            name: "heartbeat".to_owned(),
            routes: format!("{method} {path}")
                .parse::<RoutePattern>()
                .into_iter()
                .collect(),
            interval: Some(interval),
            max_interval: None,
            priority: Priority::Critical,
            max_in_flight: None,
            in_flight_per: Default::default(),
        }],
        upstream: None,
    };
    (Shaping::of(&shaping), false)
}

/// Run the `herd` scenario: [`AGENTS`] agents.
pub(crate) async fn run(cfg: &Config, seed: u64) -> HerdReport {
    run_agents(cfg, seed, AGENTS).await
}

/// [`run`] for a herd of `n` agents.
pub(crate) async fn run_agents(cfg: &Config, seed: u64, n: usize) -> HerdReport {
    let site = usize::try_from(cfg.fleet.max_site_endpoints.get()).unwrap_or(usize::MAX);
    let herd = Herd::new(cfg, seed, n, site);
    let cadence = cfg.fleet.heartbeat_interval_seconds.get();
    let (slots, slots_configured) = heartbeat_slots(cfg, cadence);
    let slot_interval = slots
        .as_ref()
        .and_then(|s| s.interval_of(traffic::HEARTBEAT.0, traffic::HEARTBEAT.1))
        .map_or(0, |i| i / NS);
    let own_cadence = run_once(cfg, seed, &herd, None).await;
    let poll_slots = run_once(cfg, seed, &herd, slots.as_ref()).await;
    HerdReport {
        scenario: "herd",
        agents: n as u64,
        sites: n.div_ceil(site.max(1)) as u64,
        duration_seconds: DURATION_SECONDS,
        heartbeat_interval_seconds: cadence,
        slot_interval_seconds: slot_interval,
        slots_configured,
        own_cadence,
        poll_slots,
    }
}

/// The busiest of `per_second` over their mean (0 when nothing arrived).
fn peak_to_mean(per_second: &[u64]) -> f64 {
    let total: u64 = per_second.iter().sum();
    if total == 0 {
        return 0.0;
    }
    let peak = per_second.iter().copied().max().unwrap_or(0);
    peak as f64 * per_second.len() as f64 / total as f64
}

/// The first second from which every window of `per_second` holds within [`TOLERANCE`] of `mean`.
fn steady_after(per_second: &[u64], mean: f64) -> Option<u64> {
    // Windows of WINDOW_SECONDS, one starting at each second; `None` when the last is not steady.
    let w = WINDOW_SECONDS as usize;
    let want = mean * w as f64;
    let windows = per_second.len().checked_sub(w)? + 1;
    let mut sum: u64 = per_second[..w].iter().sum();
    let mut first_steady = 0;
    for s in 0..windows {
        if s > 0 {
            sum = sum + per_second[s + w - 1] - per_second[s - 1];
        }
        if (sum as f64 - want).abs() > TOLERANCE * want {
            first_steady = s + 1;
        }
    }
    (first_steady < windows).then_some(first_steady as u64)
}

/// `x` to two decimals.
fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steadiness_is_judged_on_every_later_window() {
        // Quiet for 20 s, then 10 a second: steady from the first window with 8 of its 10
        // seconds busy (80 of the 100 wanted, within 20 %).
        let mut xs = vec![0u64; 20];
        xs.extend([10; 60]);
        assert_eq!(steady_after(&xs, 10.0), Some(18));
        // A burst at the end leaves no steady stretch.
        xs.push(500);
        assert_eq!(steady_after(&xs, 10.0), None);
        assert_eq!(peak_to_mean(&[1, 1, 4]), 2.0);
        assert_eq!(peak_to_mean(&[0, 0]), 0.0);
    }

    #[test]
    fn each_hint_is_the_one_the_decider_answers() {
        let mut cfg = Config::default();
        let (slots, _) = heartbeat_slots(&cfg, 60);
        let slots = slots.unwrap();
        cfg.shaping = ShapingConfig {
            routes: vec![ShapedRoute {
                name: "heartbeat".to_owned(),
                routes: vec!["POST /api/agent/heartbeat".parse().unwrap()],
                interval: Some(Duration::from_secs(60)),
                max_interval: None,
                priority: Priority::Critical,
                max_in_flight: None,
                in_flight_per: Default::default(),
            }],
            upstream: None,
        };
        let herd = Herd::new(&cfg, 3, 500, 250);
        let sim = Sim::new(&cfg);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut refused = 0;
        // Agent 0 sends 40 heartbeats in one second: its bucket of 30 refuses the last ones.
        for (k, i) in (0..40).map(|_| 0).chain([1, 250, 499]).enumerate() {
            let t = 7 * NS + k as Nanos * 20_000_000;
            sim.clock.set(ORIGIN + t);
            let facts = crate::decision::RequestFacts {
                peer: herd.peers[i],
                method: traffic::HEARTBEAT.0,
                path: crate::path::CanonicalPath::of_static(traffic::HEARTBEAT.1),
                forwarded: &[],
                agent_id: Some(herd.ids[i].as_bytes()),
                authorization: None,
                session_token: None,
                key_headers: crate::decision::KeyHeaders::default(),
            };
            let outcome = rt.block_on(sim.decider.decide(&facts));
            refused += u32::from(outcome.refused());
            let ours = herd.hint(&slots, i, t, outcome.retry_after_secs());
            assert!(ours.is_some());
            assert_eq!(ours, outcome.poll_after_secs, "agent {i} at {t}");
        }
        assert!(refused > 0, "a refusal's hint is compared too");
    }

    #[test]
    fn poll_slots_spread_the_herd_that_its_own_cadence_keeps_together() {
        // The whole herd in an optimised build; half of it in a debug one.
        let n = if cfg!(debug_assertions) {
            AGENTS / 2
        } else {
            AGENTS
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let r = rt.block_on(run_agents(&Config::default(), 1, n));
        assert_eq!((r.agents, r.sites), (n as u64, n.div_ceil(250) as u64));
        assert_eq!((r.slot_interval_seconds, r.slots_configured), (60, false));
        let (own, slots) = (&r.own_cadence, &r.poll_slots);
        assert!(
            slots.peak_to_mean_after_first_minute < 1.6,
            "{}",
            slots.peak_to_mean_after_first_minute
        );
        assert_eq!(slots.agents_marked_offline, 0);
        assert!(
            slots.steady_after_seconds.is_some_and(|s| s <= 60),
            "{slots:?}"
        );
        assert!(
            own.peak_to_mean_after_first_minute > 5.0,
            "{}",
            own.peak_to_mean_after_first_minute
        );
        assert_eq!(own.steady_after_seconds, None);
        // Both runs meet the same herd: the first second holds every agent.
        for run in [own, slots] {
            assert!(run.heartbeats >= n as u64 * 14, "{run:?}");
        }
    }
}
