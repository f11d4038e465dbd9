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
//! - **poll slots + backend-aware shaping**: the poll slots, with the real pressure controller
//!   ([`Pressure`]) watching the backend against a latency target: while it is missed, the
//!   heartbeat's interval stretches (never past its `max_interval`) and low-priority requests
//!   are shed.
//!
//! Every admitted request goes to a modelled backend ([`Backend`]) that serves
//! [`CAPACITY_PER_SECOND`] requests a second; what comes faster waits its turn, so its latency
//! grows with load. Each agent's next heartbeat is timed from when its answer came. Besides the
//! heartbeats, analysts' exports and dashboards arrive at [`LOW_PER_SECOND`], priority `low`.
//!
//! Each run reports how evenly the heartbeats arrive (the busiest second over the mean second),
//! the heartbeats refused, the agents the backend would mark offline (judged by when their
//! heartbeats were answered), the requests shed, the backend's worst latency and when it
//! settles, and the longest heartbeat hint said.

use super::{ns, Answer, Queue, Req, Rng, Series, Sim, NS, ORIGIN};
use crate::calibration::traffic;
use crate::clock::Nanos;
use crate::config::shaping::UpstreamTarget;
use crate::config::shaping::{Priority, ShapedRoute, ShapingConfig, MAX_INTERVAL, MIN_INTERVAL};
use crate::config::Config;
use crate::policy::RoutePattern;
use crate::shaping::{Pressure, Rules, Shaping};
use serde::Serialize;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
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
/// What the modelled backend serves a second. A fleet spread over its interval sends
/// `AGENTS / 60` ≈ 167 heartbeats a second, and with [`LOW_PER_SECOND`] other requests about
/// 207 a second: 41 % of it, comfortably inside. The herd's first second sends up to all
/// 10 000 at once: twenty seconds of its work.
pub(crate) const CAPACITY_PER_SECOND: f64 = 500.0;
/// The backend's latency when nothing waits (ns).
pub(crate) const BASE_LATENCY: Nanos = 30_000_000;
/// Low-priority requests (analysts' exports and dashboards) a second, evenly spaced.
pub(crate) const LOW_PER_SECOND: u64 = 40;
/// The latency target the backend is judged against, and the shaped run's
/// `[shaping.upstream]` when the configuration sets none (ns).
pub(crate) const LATENCY_TARGET: Nanos = 250_000_000;
/// The shaped run's `[shaping.upstream]` share of errors and recovery, when the configuration
/// sets none.
const ERRORS_PERCENT: u8 = 50;
const RECOVER: Duration = Duration::from_secs(5);
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
    /// The poll slots with the backend watched: intervals stretch and low priority is shed
    /// while it misses its target.
    pub backend_aware: HerdRun,
    /// The modelled backend: requests served a second, latency when idle (ms).
    pub backend_capacity_per_second: f64,
    pub backend_base_latency_ms: f64,
    /// The latency target the backend is judged against (ms).
    pub latency_target_ms: f64,
    /// Low-priority requests a second besides the heartbeats.
    pub low_per_second: u64,
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
    /// Low-priority requests sent, and those shed by the backend's pressure.
    pub low_requests: u64,
    pub low_shed: u64,
    /// Heartbeats (priority `critical`) shed by the backend's pressure.
    pub heartbeats_shed: u64,
    /// The backend's worst latency (ms), over the run and after the first minute.
    pub backend_worst_latency_ms: f64,
    pub backend_worst_latency_after_first_minute_ms: f64,
    /// The second after the last request the backend answered slower than the target; `null`
    /// when that was within the run's last minute (it never settled).
    pub backend_steady_after_seconds: Option<u64>,
    /// The longest heartbeat `X-Poll-Interval` said (s); `null` when none was.
    pub longest_heartbeat_hint_seconds: Option<u64>,
    /// The heartbeat's stretch at its largest.
    pub max_stretch: f64,
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
    #[cfg(test)]
    fn hint(&self, slots: &Shaping, i: usize, t: Nanos, retry_after: Option<u64>) -> Option<u64> {
        self.hint_stretched(slots, i, t, retry_after, 0, None)
    }

    /// [`Herd::hint`] at stretch step `step`.
    fn hint_stretched(
        &self,
        slots: &Shaping,
        i: usize,
        t: Nanos,
        retry_after: Option<u64>,
        step: u8,
        pressure: Option<&Pressure>,
    ) -> Option<u64> {
        let route = slots.route(traffic::HEARTBEAT.0, traffic::HEARTBEAT.1)?;
        slots
            .hint_followed(
                route,
                &self.addresses[i],
                Some(&self.ids[i]),
                ORIGIN + t,
                retry_after,
                step,
            )
            .map(|(secs, came)| {
                if let (Some(came), Some(p), None) = (came, pressure, retry_after) {
                    p.hinted(came);
                }
                secs
            })
    }
}

/// The modelled backend: one queue served at [`CAPACITY_PER_SECOND`]; a request waits for the
/// work ahead of it, then takes [`BASE_LATENCY`].
#[derive(Debug, Default)]
struct Backend {
    /// Requests' worth of work waiting, as of `at`.
    backlog: f64,
    at: Nanos,
    worst: Nanos,
    worst_after_first_minute: Nanos,
    /// When the last request that took longer than the target arrived.
    last_slow: Option<Nanos>,
}

impl Backend {
    /// A request arriving at `t`: how long until its answer.
    fn take(&mut self, t: Nanos) -> Nanos {
        let t = t.max(self.at);
        let drained = (t - self.at) as f64 / NS as f64 * CAPACITY_PER_SECOND;
        let ahead = (self.backlog - drained).max(0.0);
        self.backlog = ahead + 1.0;
        self.at = t;
        let latency = BASE_LATENCY + (ahead / CAPACITY_PER_SECOND * NS as f64) as Nanos;
        self.worst = self.worst.max(latency);
        if t >= SETTLE_SECONDS * NS {
            self.worst_after_first_minute = self.worst_after_first_minute.max(latency);
        }
        if latency > LATENCY_TARGET {
            self.last_slow = Some(t);
        }
        latency
    }
}

/// What happens next in a run.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// Agent `i` sends a heartbeat.
    Heartbeat(usize),
    /// The backend answers the request of this token.
    Answer(u64),
    /// A low-priority request arrives.
    Low,
}

/// A request at the backend: whose heartbeat it is (none: a low-priority one), and its place
/// in the pressure's waiting list.
struct Pending {
    agent: Option<usize>,
    waiting: Option<crate::shaping::pressure::Waiting>,
}

/// One run in progress: the queue of the agents' next heartbeats and the tallies.
struct HerdSim<'a> {
    herd: &'a Herd,
    slots: Option<&'a Shaping>,
    cadence: Nanos,
    timeout: Nanos,
    /// The controller watching the backend, and its rules (the backend-aware run only).
    aware: Option<(&'a Arc<Pressure>, Rules)>,
    sim: Sim,
    rng: Rng,
    q: Queue<Ev>,
    backend: Backend,
    pending: HashMap<u64, Pending>,
    next_token: u64,
    /// When each agent's last admitted heartbeat was answered (its return counts as one).
    last: Vec<Nanos>,
    offline: Vec<bool>,
    arrivals: Vec<u64>,
    refused: u64,
    low_requests: u64,
    low_shed: u64,
    heartbeats_shed: u64,
    longest_hint: Option<u64>,
    max_stretch: f64,
}

impl<'a> HerdSim<'a> {
    /// The stretch step now.
    fn step(&mut self) -> u8 {
        let (step, stretch) = self
            .aware
            .map_or((0, 1.0), |(p, _)| (p.step(), p.stretch()));
        self.max_stretch = self.max_stretch.max(stretch);
        step
    }

    /// Agent `i`'s hint at `t`, tallied.
    fn hint(&mut self, i: usize, t: Nanos, retry_after: Option<u64>) -> Option<u64> {
        let step = self.step();
        let pressure = self.aware.map(|(p, _)| p.as_ref());
        let hint = self.slots.and_then(|s| {
            self.herd
                .hint_stretched(s, i, t, retry_after, step, pressure)
        });
        if let Some(h) = hint {
            self.longest_hint = Some(self.longest_hint.unwrap_or(0).max(h));
        }
        hint
    }

    /// A request admitted at `t` goes to the backend; its answer comes back later.
    fn forward(&mut self, t: Nanos, agent: Option<usize>) {
        let latency = self.backend.take(t);
        let token = self.next_token;
        // Each agent is a caller of its own; low-priority requests come from 64 dashboards.
        let caller = agent.map_or(u64::MAX - token % 64, |i| i as u64);
        let waiting = self.aware.map(|(p, rules)| p.sent(t, caller, &rules));
        self.next_token += 1;
        self.pending.insert(token, Pending { agent, waiting });
        self.q.push(t + latency, Ev::Answer(token));
    }

    /// Agent `i`'s heartbeat at `t`: refused at once, or forwarded to the backend.
    async fn heartbeat(&mut self, t: Nanos, i: usize) {
        if let Some((p, rules)) = self.aware {
            if let Some(secs) = p.shed(Priority::Critical, t, &rules) {
                self.heartbeats_shed += 1;
                self.q.push(t + ns(secs), Ev::Heartbeat(i));
                return;
            }
        }
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
        match answer {
            Answer::Admitted => self.forward(t, Some(i)),
            Answer::Refused { retry_after_secs } => {
                self.refused += 1;
                let wait = match self.hint(i, t, Some(retry_after_secs)) {
                    Some(secs) => ns(secs),
                    None => self.rng.backoff(retry_after_secs),
                };
                self.q.push(t + wait, Ev::Heartbeat(i));
            }
        }
    }

    /// The backend's answer to `token` at `t`: a heartbeat's agent counts it and waits for its
    /// next.
    fn answer(&mut self, t: Nanos, token: u64) {
        let Some(pending) = self.pending.remove(&token) else {
            return;
        };
        if let (Some(w), Some((p, rules))) = (pending.waiting, self.aware) {
            p.answered(w, t, 200, &rules);
        }
        let Some(i) = pending.agent else {
            return;
        };
        if t - self.last[i] >= self.timeout {
            self.offline[i] = true;
        }
        self.last[i] = t;
        let wait = self.hint(i, t, None).map_or(self.cadence, ns);
        self.q.push(t + wait, Ev::Heartbeat(i));
    }

    /// A low-priority request at `t`: shed while the backend is under pressure, else forwarded.
    fn low(&mut self, t: Nanos) {
        self.low_requests += 1;
        let shed = self
            .aware
            .is_some_and(|(p, rules)| p.shed(Priority::Low, t, &rules).is_some());
        if shed {
            self.low_shed += 1;
        } else {
            self.forward(t, None);
        }
        self.q.push(t + NS / LOW_PER_SECOND.max(1), Ev::Low);
    }

    /// Every request of the run, then its figures.
    async fn run(mut self) -> HerdRun {
        let end = DURATION_SECONDS * NS;
        while let Some((t, ev)) = self.q.pop_until(end) {
            match ev {
                Ev::Heartbeat(i) => self.heartbeat(t, i).await,
                Ev::Answer(token) => self.answer(t, token),
                Ev::Low => self.low(t),
            }
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
        let ms = |n: Nanos| round2(n as f64 / 1e6);
        let backend_steady = match self.backend.last_slow {
            None => Some(0),
            Some(t) => {
                let s = t / NS + 1;
                (s + SETTLE_SECONDS <= DURATION_SECONDS).then_some(s)
            }
        };
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
            low_requests: self.low_requests,
            low_shed: self.low_shed,
            heartbeats_shed: self.heartbeats_shed,
            backend_worst_latency_ms: ms(self.backend.worst),
            backend_worst_latency_after_first_minute_ms: ms(self.backend.worst_after_first_minute),
            backend_steady_after_seconds: backend_steady,
            longest_heartbeat_hint_seconds: self.longest_hint,
            max_stretch: round2(self.max_stretch),
            series: self.sim.series,
        }
    }
}

/// One run of `herd` through a fresh decider: with `slots`, each agent waits its hints.
/// With `aware`, the controller watches the backend against its rules.
async fn run_once(
    cfg: &Config,
    seed: u64,
    herd: &Herd,
    slots: Option<&Shaping>,
    aware: Option<(&Arc<Pressure>, Rules)>,
) -> HerdRun {
    let n = herd.ids.len();
    let mut q = Queue::default();
    for (i, &t) in herd.back.iter().enumerate() {
        q.push(t, Ev::Heartbeat(i));
    }
    if LOW_PER_SECOND > 0 {
        q.push(0, Ev::Low);
    }
    HerdSim {
        herd,
        slots,
        aware,
        cadence: ns(cfg.fleet.heartbeat_interval_seconds.get()),
        timeout: ns(cfg.fleet.heartbeat_timeout_seconds.get()),
        sim: Sim::new(cfg),
        rng: Rng::new(seed),
        q,
        backend: Backend::default(),
        pending: HashMap::new(),
        next_token: 0,
        last: herd.back.clone(),
        offline: vec![false; n],
        arrivals: vec![0; DURATION_SECONDS as usize],
        refused: 0,
        low_requests: 0,
        low_shed: 0,
        heartbeats_shed: 0,
        longest_hint: None,
        max_stretch: 1.0,
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
        routes: vec![heartbeat_route(interval, None)],
        upstream: None,
    };
    (Shaping::of(&shaping), false)
}

/// The heartbeat shaped at `interval`, its hints at most `max_interval`, priority `critical`.
fn heartbeat_route(interval: Duration, max_interval: Option<Duration>) -> ShapedRoute {
    let (method, path) = traffic::HEARTBEAT;
    ShapedRoute {
        name: "heartbeat".to_owned(),
        routes: format!("{method} {path}")
            .parse::<RoutePattern>()
            .into_iter()
            .collect(),
        interval: Some(interval),
        max_interval,
        priority: Priority::Critical,
        max_in_flight: None,
        in_flight_per: Default::default(),
        watched: true,
    }
}

/// The backend-aware run's shaping: the configuration's `[shaping]` when it shapes the
/// heartbeat and watches the upstream, else the heartbeat at `interval` seconds, stretching to
/// one and a half intervals, priority `critical`, with the upstream held to [`LATENCY_TARGET`].
fn aware_shaping(cfg: &Config, interval: u64) -> Option<(Shaping, Rules)> {
    let (method, path) = traffic::HEARTBEAT;
    if let Some(slots) = Shaping::of(&cfg.shaping) {
        if slots.interval_of(method, path).is_some() {
            if let Some(&rules) = slots.upstream() {
                return Some((slots, rules));
            }
        }
    }
    let interval = Duration::from_secs(interval).clamp(MIN_INTERVAL, MAX_INTERVAL);
    let upstream = UpstreamTarget {
        latency_target: Duration::from_nanos(LATENCY_TARGET),
        errors_percent: ERRORS_PERCENT,
        recover: RECOVER,
    };
    let shaping = ShapingConfig {
        routes: vec![heartbeat_route(
            interval,
            Some((interval + interval / 2).min(MAX_INTERVAL)),
        )],
        upstream: Some(upstream),
    };
    Shaping::of(&shaping).and_then(|s| {
        let rules = s.upstream().copied()?;
        Some((s, rules))
    })
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
    let own_cadence = run_once(cfg, seed, &herd, None, None).await;
    let poll_slots = run_once(cfg, seed, &herd, slots.as_ref(), None).await;
    let aware = aware_shaping(cfg, cadence);
    let pressure = Arc::new(Pressure::new());
    let backend_aware = run_once(
        cfg,
        seed,
        &herd,
        aware.as_ref().map(|(s, _)| s),
        aware.as_ref().map(|&(_, rules)| (&pressure, rules)),
    )
    .await;
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
        backend_aware,
        backend_capacity_per_second: CAPACITY_PER_SECOND,
        backend_base_latency_ms: BASE_LATENCY as f64 / 1e6,
        latency_target_ms: aware.as_ref().map_or(LATENCY_TARGET, |(_, r)| r.target) as f64 / 1e6,
        low_per_second: LOW_PER_SECOND,
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
                watched: true,
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

    /// The herd both tests below read, run once: the whole herd in an optimised build, half of
    /// it in a debug one.
    fn test_herd() -> (usize, &'static HerdReport) {
        static HERD: std::sync::OnceLock<HerdReport> = std::sync::OnceLock::new();
        let n = if cfg!(debug_assertions) {
            AGENTS / 2
        } else {
            AGENTS
        };
        let r = HERD.get_or_init(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            rt.block_on(run_agents(&Config::default(), 1, n))
        });
        (n, r)
    }

    #[test]
    fn poll_slots_spread_the_herd_that_its_own_cadence_keeps_together() {
        let (n, r) = test_herd();
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
        // The backend's queue spreads its own cadence somewhat, never evenly.
        assert!(
            own.peak_to_mean_after_first_minute > 2.0,
            "{}",
            own.peak_to_mean_after_first_minute
        );
        assert_eq!(own.steady_after_seconds, None);
        // Both runs meet the same herd: the first second holds every agent.
        for run in [own, slots] {
            assert!(run.heartbeats >= n as u64 * 14, "{run:?}");
        }
    }

    #[test]
    fn backend_aware_shaping_keeps_every_agent_and_sheds_only_low_priority() {
        let (_, r) = test_herd();
        let (own, aware) = (&r.own_cadence, &r.backend_aware);
        assert_eq!(aware.heartbeats_refused, 0, "{aware:?}");
        assert_eq!(aware.agents_marked_offline, 0, "{aware:?}");
        assert_eq!(aware.heartbeats_shed, 0, "{aware:?}");
        assert!(aware.low_shed > 0, "{aware:?}");
        assert!(
            aware
                .longest_heartbeat_hint_seconds
                .is_some_and(|h| h <= 90),
            "{aware:?}"
        );
        assert!(
            aware.backend_worst_latency_ms <= own.backend_worst_latency_ms,
            "{aware:?} {own:?}"
        );
        assert!(
            aware.backend_worst_latency_after_first_minute_ms
                < own.backend_worst_latency_after_first_minute_ms,
            "{aware:?} {own:?}"
        );
        // Without shaping nothing is shed and the backend goes far past its target.
        for run in [own, &r.poll_slots] {
            assert_eq!(run.low_shed + run.heartbeats_shed, 0, "{run:?}");
            assert!(
                run.backend_worst_latency_ms > 10.0 * r.latency_target_ms,
                "{run:?}"
            );
        }
        assert!(own.backend_worst_latency_after_first_minute_ms > r.latency_target_ms);
        // Watching the backend spreads the herd at least as evenly as the slots alone, and
        // keeps the backend within its target after the first minute.
        assert!(
            aware.peak_to_mean_after_first_minute <= r.poll_slots.peak_to_mean_after_first_minute,
            "{aware:?} {:?}",
            r.poll_slots
        );
        assert!(
            aware.backend_worst_latency_after_first_minute_ms <= r.latency_target_ms,
            "{aware:?}"
        );
    }
}
