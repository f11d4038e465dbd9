//! `fleet`: a whole site's agents behind one NAT, idling, then answering fleet-wide tasks with
//! bursts of result posts.
//!
//! Each agent runs three loops, as an agent process does: a heartbeat every
//! `heartbeat_interval_seconds`, a task poll every `poll_interval_seconds`, and an uploader that
//! posts the results of a task one after another (100 ms apart). Three times in the run an
//! operator launches a task on the whole fleet; each agent picks it up at its next poll, runs it
//! for 5-60 s and then posts 40-120 results: more than a 30-request bucket holds. A refused
//! request is retried after its `Retry-After` plus jitter ([`Rng::backoff`]); each loop carries on
//! only once its request got through.
//!
//! The backend marks an agent offline when `heartbeat_timeout_seconds` pass without an admitted
//! heartbeat; the run counts the agents that happens to.

use super::{ip, secs, Answer, Queue, Req, Rng, Series, Sim, NS, SITE_NAT};
use crate::calibration::traffic;
use crate::clock::Nanos;
use crate::config::Config;
use serde::Serialize;
use std::num::NonZeroU64;

/// Virtual length of the run.
pub(crate) const DURATION_SECONDS: u64 = 30 * 60;
/// When the fleet-wide tasks are launched.
pub(crate) const TASK_WAVES_SECONDS: [u64; 3] = [120, 720, 1320];
/// Results one agent posts for one task (inclusive range).
pub(crate) const RESULTS_PER_TASK: (u64, u64) = (40, 120);
const UPLOAD_GAP: Nanos = NS / 10;

#[derive(Debug, Clone, Serialize)]
pub struct FleetReport {
    pub scenario: &'static str,
    pub agents: u64,
    pub duration_seconds: u64,
    pub requests: u64,
    pub refused: u64,
    pub agents_marked_offline: u64,
    /// Times any agent went `heartbeat_timeout_seconds` without an admitted heartbeat.
    pub offline_episodes: u64,
    pub longest_heartbeat_gap_seconds: f64,
    pub heartbeats: u64,
    pub heartbeats_refused: u64,
    pub results_posted: u64,
    pub result_posts_refused: u64,
    /// Results still waiting to be posted when the run ended.
    pub results_backlog: u64,
    #[serde(skip)]
    pub series: Series,
    /// Heartbeats alone, admitted and refused, per bin.
    #[serde(skip)]
    pub heartbeat_series: Series,
    /// How long the agents went without an admitted heartbeat, per bin.
    #[serde(skip)]
    pub heartbeat_ages: HeartbeatAges,
}

/// The time since each agent's last admitted heartbeat, followed through the run in bins of
/// [`super::BIN_SECONDS`]. The start of the run counts as a heartbeat, as in the report.
#[derive(Debug, Clone)]
pub struct HeartbeatAges {
    pub bin_seconds: NonZeroU64,
    /// `heartbeat_timeout_seconds`: the backend marks an agent offline at this age.
    pub timeout_seconds: u64,
    /// Per bin, the oldest any agent's last admitted heartbeat was at some instant of the bin, in
    /// seconds: the worst agent. Its maximum is the run's longest heartbeat gap.
    pub worst: Vec<f64>,
    /// Per bin, the median over the agents of each agent's oldest age within the bin.
    pub median: Vec<f64>,
    /// Per bin, the agents offline at some instant of the bin (age at or past the timeout).
    pub offline: Vec<u64>,
}

impl Default for HeartbeatAges {
    /// No bins yet, of [`super::BIN_SECONDS`].
    fn default() -> Self {
        Self {
            bin_seconds: super::BIN_SECONDS,
            timeout_seconds: 0,
            worst: Vec::new(),
            median: Vec::new(),
            offline: Vec::new(),
        }
    }
}

impl HeartbeatAges {
    /// From each agent's admitted heartbeats (in order, nanoseconds) over a run of `end`.
    pub fn from_heartbeats(
        admitted: &[Vec<Nanos>],
        end: Nanos,
        bin_seconds: NonZeroU64,
        timeout: Nanos,
    ) -> Self {
        let bin = bin_seconds.get() * NS;
        let bins = end.div_ceil(bin) as usize;
        // ages[b][agent]: the agent's oldest age within bin b.
        let mut ages = vec![Vec::with_capacity(admitted.len()); bins];
        for hbs in admitted {
            let (mut j, mut last) = (0, 0);
            for (b, row) in ages.iter_mut().enumerate() {
                let t1 = ((b as Nanos + 1) * bin).min(end);
                let mut oldest = 0;
                while j < hbs.len() && hbs[j] <= t1 {
                    oldest = oldest.max(hbs[j] - last);
                    last = hbs[j];
                    j += 1;
                }
                row.push(oldest.max(t1 - last));
            }
        }
        let round = |ns: Nanos| (secs(ns) * 10.0).round() / 10.0;
        let mut out = Self {
            bin_seconds,
            timeout_seconds: timeout / NS,
            ..Self::default()
        };
        for mut row in ages {
            row.sort_unstable();
            out.worst.push(row.last().map_or(0.0, |&a| round(a)));
            out.median.push(if row.is_empty() {
                0.0
            } else {
                round(row[row.len() / 2])
            });
            out.offline
                .push(row.iter().filter(|&&a| a >= timeout).count() as u64);
        }
        out
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Heartbeat(usize),
    Poll(usize),
    Upload(usize),
    Wave(u32),
}

#[derive(Default, Clone)]
struct Agent {
    last_heartbeat: Nanos,
    offline: bool,
    episodes: u64,
    wave_taken: u32,
    pending: u64,
    uploading: bool,
}

/// The fleet's cadences, read once from the configuration.
#[derive(Clone, Copy)]
struct Cadence {
    hb: Nanos,
    poll: Nanos,
    timeout: Nanos,
}

/// A fleet run in progress: the site's agents, the queue of their next requests, the tallies.
struct FleetRun {
    cadence: Cadence,
    nat: std::net::IpAddr,
    rng: Rng,
    sim: Sim,
    q: Queue<Ev>,
    agents: Vec<Agent>,
    admitted_heartbeats: Vec<Vec<Nanos>>,
    heartbeat_series: Series,
    wave: u32,
    heartbeats: u64,
    heartbeats_refused: u64,
    posted: u64,
    posts_refused: u64,
    longest_gap: Nanos,
}

/// An agent's id, made when it sends, like any request header: the simulator keeps none.
fn agent_id(i: usize) -> String {
    format!("agent-{:04}", i + 1)
}

impl FleetRun {
    /// The site's agents idle, each loop's first request at a random phase, and the task waves
    /// are scheduled.
    fn new(cfg: &Config, seed: u64, cadence: Cadence, n: usize) -> Self {
        let mut rng = Rng::new(seed);
        let mut q = Queue::default();
        for i in 0..n {
            q.push(rng.within(secs(cadence.hb)), Ev::Heartbeat(i));
            q.push(rng.within(secs(cadence.poll)), Ev::Poll(i));
        }
        for (k, w) in TASK_WAVES_SECONDS.iter().enumerate() {
            q.push(w * NS, Ev::Wave(k as u32 + 1));
        }
        Self {
            cadence,
            nat: ip(SITE_NAT),
            rng,
            sim: Sim::new(cfg),
            q,
            agents: vec![Agent::default(); n],
            admitted_heartbeats: vec![Vec::new(); n],
            heartbeat_series: Series {
                bin_seconds: super::BIN_SECONDS,
                ..Series::default()
            },
            wave: 0,
            heartbeats: 0,
            heartbeats_refused: 0,
            posted: 0,
            posts_refused: 0,
            longest_gap: 0,
        }
    }

    /// Agent `i`'s request on `route` at `t`, as the limiter answers it.
    async fn send(&mut self, t: Nanos, i: usize, route: (&'static str, &'static str)) -> Answer {
        let agent_id = agent_id(i);
        let req = Req {
            peer: self.nat,
            route,
            agent_id: Some(&agent_id),
            bearer: None,
        };
        self.sim.send(t, &req).await
    }

    /// Every event due before `end`, in order.
    async fn run_until(&mut self, end: Nanos) {
        while let Some((t, ev)) = self.q.pop_until(end) {
            match ev {
                Ev::Wave(k) => self.wave = k,
                Ev::Heartbeat(i) => self.heartbeat(t, i).await,
                Ev::Poll(i) => self.poll(t, i).await,
                Ev::Upload(i) => self.upload(t, i).await,
            }
        }
    }

    /// Agent `i`'s heartbeat: its gap since the last admitted one, or a retry after a refusal.
    async fn heartbeat(&mut self, t: Nanos, i: usize) {
        self.heartbeats += 1;
        let answer = self.send(t, i, traffic::HEARTBEAT).await;
        self.heartbeat_series.record(t, answer == Answer::Admitted);
        match answer {
            Answer::Admitted => {
                self.admitted_heartbeats[i].push(t);
                let a = &mut self.agents[i];
                let gap = t - a.last_heartbeat;
                self.longest_gap = self.longest_gap.max(gap);
                if gap >= self.cadence.timeout {
                    a.offline = true;
                    a.episodes += 1;
                }
                a.last_heartbeat = t;
                self.q.push(t + self.cadence.hb, Ev::Heartbeat(i));
            }
            Answer::Refused { retry_after_secs } => {
                self.heartbeats_refused += 1;
                let retry = t + self.rng.backoff(retry_after_secs);
                self.q.push(retry, Ev::Heartbeat(i));
            }
        }
    }

    /// Agent `i`'s task poll: an admitted one picks up the latest wave's task, if new to it.
    async fn poll(&mut self, t: Nanos, i: usize) {
        match self.send(t, i, traffic::POLL).await {
            Answer::Admitted => {
                let a = &mut self.agents[i];
                if a.wave_taken < self.wave {
                    a.wave_taken = self.wave;
                    a.pending += self.rng.range(RESULTS_PER_TASK.0, RESULTS_PER_TASK.1);
                    if !a.uploading {
                        a.uploading = true;
                        self.q
                            .push(t + 5 * NS + self.rng.within(55.0), Ev::Upload(i));
                    }
                }
                self.q.push(t + self.cadence.poll, Ev::Poll(i));
            }
            Answer::Refused { retry_after_secs } => {
                let retry = t + self.rng.backoff(retry_after_secs);
                self.q.push(retry, Ev::Poll(i));
            }
        }
    }

    /// Agent `i`'s next result post: the uploader carries on until nothing is pending.
    async fn upload(&mut self, t: Nanos, i: usize) {
        match self.send(t, i, traffic::RESULT).await {
            Answer::Admitted => {
                self.posted += 1;
                let a = &mut self.agents[i];
                a.pending -= 1;
                if a.pending > 0 {
                    self.q.push(t + UPLOAD_GAP, Ev::Upload(i));
                } else {
                    a.uploading = false;
                }
            }
            Answer::Refused { retry_after_secs } => {
                self.posts_refused += 1;
                let retry = t + self.rng.backoff(retry_after_secs);
                self.q.push(retry, Ev::Upload(i));
            }
        }
    }

    /// The report at `end`: each agent's gap since its last admitted heartbeat counts too.
    fn report(mut self, end: Nanos) -> FleetReport {
        let timeout = self.cadence.timeout;
        for a in &mut self.agents {
            let gap = end - a.last_heartbeat;
            self.longest_gap = self.longest_gap.max(gap);
            if gap >= timeout {
                a.offline = true;
                a.episodes += 1;
            }
        }
        self.sim.series.pad_to(DURATION_SECONDS);
        self.heartbeat_series.pad_to(DURATION_SECONDS);
        let heartbeat_ages = HeartbeatAges::from_heartbeats(
            &self.admitted_heartbeats,
            end,
            super::BIN_SECONDS,
            timeout,
        );
        let agents = &self.agents;
        FleetReport {
            scenario: "fleet",
            agents: agents.len() as u64,
            duration_seconds: DURATION_SECONDS,
            requests: self.sim.requests,
            refused: self.sim.refused,
            agents_marked_offline: agents.iter().filter(|a| a.offline).count() as u64,
            offline_episodes: agents.iter().map(|a| a.episodes).sum(),
            longest_heartbeat_gap_seconds: (secs(self.longest_gap) * 10.0).round() / 10.0,
            heartbeats: self.heartbeats,
            heartbeats_refused: self.heartbeats_refused,
            results_posted: self.posted,
            result_posts_refused: self.posts_refused,
            results_backlog: agents.iter().map(|a| a.pending).sum(),
            series: self.sim.series,
            heartbeat_series: self.heartbeat_series,
            heartbeat_ages,
        }
    }
}

/// Run the `fleet` scenario.
pub(crate) async fn run(cfg: &Config, seed: u64) -> FleetReport {
    let f = &cfg.fleet;
    let n = f.max_site_endpoints.get() as usize;
    let cadence = Cadence {
        hb: super::ns(f.heartbeat_interval_seconds.get()),
        poll: super::ns(f.poll_interval_seconds.get()),
        timeout: super::ns(f.heartbeat_timeout_seconds.get()),
    };
    let end = DURATION_SECONDS * NS;
    let mut fleet = FleetRun::new(cfg, seed, cadence, n);
    fleet.run_until(end).await;
    fleet.report(end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeat_ages_follow_each_agent_through_the_bins() {
        // Agent 0 beats at 5 s and 25 s; agent 1 never; a 30 s run in 10 s bins, offline at 20 s.
        let a = HeartbeatAges::from_heartbeats(
            &[vec![5 * NS, 25 * NS], vec![]],
            30 * NS,
            crate::calibration::simulate::BIN_SECONDS,
            20 * NS,
        );
        assert_eq!(a.worst, vec![10.0, 20.0, 30.0]);
        // Agent 0's oldest: 5 s, 15 s (at 20 s), 20 s (just before 25 s); agent 1's: 10, 20, 30 s.
        assert_eq!(a.offline, vec![0, 1, 2]);
        assert_eq!(a.median, vec![10.0, 20.0, 30.0]);
        assert_eq!(a.timeout_seconds, 20);
    }
}
