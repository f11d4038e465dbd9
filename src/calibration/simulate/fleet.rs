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

pub(crate) async fn run(cfg: &Config, seed: u64) -> FleetReport {
    let f = &cfg.fleet;
    let n = f.max_site_endpoints.get() as usize;
    let hb = super::ns(f.heartbeat_interval_seconds.get());
    let poll = super::ns(f.poll_interval_seconds.get());
    let timeout = super::ns(f.heartbeat_timeout_seconds.get());
    let end = DURATION_SECONDS * NS;
    let nat = ip(SITE_NAT);
    let mut rng = Rng::new(seed);
    let mut sim = Sim::new(cfg);
    let mut q = Queue::default();
    let mut agents: Vec<Agent> = vec![Agent::default(); n];
    let mut admitted_heartbeats: Vec<Vec<Nanos>> = vec![Vec::new(); n];
    let mut heartbeat_series = Series {
        bin_seconds: super::BIN_SECONDS,
        ..Series::default()
    };
    // An agent's id is made when it sends, like any request header: the simulator keeps none.
    let id = |i: usize| format!("agent-{:04}", i + 1);
    for i in 0..n {
        q.push(rng.within(secs(hb)), Ev::Heartbeat(i));
        q.push(rng.within(secs(poll)), Ev::Poll(i));
    }
    for (k, w) in TASK_WAVES_SECONDS.iter().enumerate() {
        q.push(w * NS, Ev::Wave(k as u32 + 1));
    }
    let mut wave = 0u32;
    let (mut heartbeats, mut heartbeats_refused, mut posted, mut posts_refused) = (0, 0, 0, 0);
    let mut longest_gap: Nanos = 0;
    while let Some((t, ev)) = q.pop_until(end) {
        match ev {
            Ev::Wave(k) => wave = k,
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
                heartbeat_series.record(t, answer == Answer::Admitted);
                match answer {
                    Answer::Admitted => {
                        admitted_heartbeats[i].push(t);
                        let a = &mut agents[i];
                        let gap = t - a.last_heartbeat;
                        longest_gap = longest_gap.max(gap);
                        if gap >= timeout {
                            a.offline = true;
                            a.episodes += 1;
                        }
                        a.last_heartbeat = t;
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
                    Answer::Admitted => {
                        let a = &mut agents[i];
                        if a.wave_taken < wave {
                            a.wave_taken = wave;
                            a.pending += rng.range(RESULTS_PER_TASK.0, RESULTS_PER_TASK.1);
                            if !a.uploading {
                                a.uploading = true;
                                q.push(t + 5 * NS + rng.within(55.0), Ev::Upload(i));
                            }
                        }
                        q.push(t + poll, Ev::Poll(i));
                    }
                    Answer::Refused { retry_after_secs } => {
                        q.push(t + rng.backoff(retry_after_secs), Ev::Poll(i));
                    }
                }
            }
            Ev::Upload(i) => {
                let agent_id = id(i);
                let req = Req {
                    peer: nat,
                    route: traffic::RESULT,
                    agent_id: Some(&agent_id),
                    bearer: None,
                };
                match sim.send(t, &req).await {
                    Answer::Admitted => {
                        posted += 1;
                        let a = &mut agents[i];
                        a.pending -= 1;
                        if a.pending > 0 {
                            q.push(t + UPLOAD_GAP, Ev::Upload(i));
                        } else {
                            a.uploading = false;
                        }
                    }
                    Answer::Refused { retry_after_secs } => {
                        posts_refused += 1;
                        q.push(t + rng.backoff(retry_after_secs), Ev::Upload(i));
                    }
                }
            }
        }
    }
    for a in &mut agents {
        let gap = end - a.last_heartbeat;
        longest_gap = longest_gap.max(gap);
        if gap >= timeout {
            a.offline = true;
            a.episodes += 1;
        }
    }
    sim.series.pad_to(DURATION_SECONDS);
    heartbeat_series.pad_to(DURATION_SECONDS);
    let heartbeat_ages =
        HeartbeatAges::from_heartbeats(&admitted_heartbeats, end, super::BIN_SECONDS, timeout);
    FleetReport {
        scenario: "fleet",
        agents: n as u64,
        duration_seconds: DURATION_SECONDS,
        requests: sim.requests,
        refused: sim.refused,
        agents_marked_offline: agents.iter().filter(|a| a.offline).count() as u64,
        offline_episodes: agents.iter().map(|a| a.episodes).sum(),
        longest_heartbeat_gap_seconds: (secs(longest_gap) * 10.0).round() / 10.0,
        heartbeats,
        heartbeats_refused,
        results_posted: posted,
        result_posts_refused: posts_refused,
        results_backlog: agents.iter().map(|a| a.pending).sum(),
        series: sim.series,
        heartbeat_series,
        heartbeat_ages,
    }
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
