//! `table-flood`: the known-agents table filled from other addresses, and sites that must not
//! notice.
//!
//! A site of `max_site_endpoints` agents idles as in `fleet` from the start (heartbeat every
//! `heartbeat_interval_seconds`, task poll every `poll_interval_seconds`, a refused request
//! retried after its `Retry-After` plus jitter). Then, from other addresses:
//!
//! 1. **The fill** (from [`FILL_STARTS_SECONDS`]): [`FILL_ADDRESSES`] IPv6 /56s mint
//!    [`FILL_IDS_EACH`] fresh agent ids each, every id seen once, in [`FILL_SECONDS`]: more ids
//!    than the default table holds.
//! 2. **Keeping it full** (from the fill's end to the run's): [`KEEP_FULL_PER_SECOND`] fresh
//!    ids a second, from the same /56s in turn.
//! 3. **A sustained flood** (from [`SUSTAINED_STARTS_SECONDS`]): more /56s mint ids at their
//!    ceiling's full rate (its whole burst at once, then its refill), as many as the bound
//!    `check` states leaves room for beside the stream of step 2: the table holds a new site's
//!    first sightings while other addresses hold at most `others_first_sightings` minted within
//!    the grace, each address counted up to a site. So the stream's ids within one grace are
//!    taken off that bound, and each sustained address counts as a site (at most
//!    [`MAX_SUSTAINED_ADDRESSES`]).
//!
//! A second site appears at [`AFTER_FILL_SECONDS`], after the fill, and a third at
//! [`DURING_FLOOD_SECONDS`], while the sustained flood mints: all their agents at once, each
//! from its first heartbeat a new id. The run counts every site's refused heartbeats and polls,
//! and its agents marked offline, and reads the table's counts.

use super::abuse::Attacker;
use super::{secs, Answer, Queue, Req, Rng, Series, Sim, NS, SITE_NAT};
use crate::calibration::check::KnownTable;
use crate::calibration::traffic;
use crate::clock::Nanos;
use crate::config::Config;
use crate::known_agents::Counts;
use serde::Serialize;
use std::net::{IpAddr, Ipv6Addr};
use std::num::NonZeroU64;

/// Virtual length of the run.
pub(crate) const DURATION_SECONDS: u64 = 8 * 60;
pub(crate) const FILL_STARTS_SECONDS: u64 = 60;
pub(crate) const FILL_ADDRESSES: u64 = 456;
pub(crate) const FILL_IDS_EACH: u64 = 250;
pub(crate) const FILL_SECONDS: u64 = 11;
pub(crate) const KEEP_FULL_PER_SECOND: u64 = 127;
pub(crate) const SUSTAINED_STARTS_SECONDS: u64 = 5 * 60;
/// The sustained flood's addresses are `check`'s figure, but never more than this.
pub(crate) const MAX_SUSTAINED_ADDRESSES: u64 = 1_000;
pub(crate) const AFTER_FILL_SECONDS: u64 = 4 * 60;
pub(crate) const DURING_FLOOD_SECONDS: u64 = 6 * 60;
/// A new site's agents send their first heartbeat within this long of its arrival.
const ARRIVAL_SPREAD_SECONDS: f64 = 5.0;

#[derive(Debug, Clone, Serialize)]
pub struct TableFloodReport {
    pub scenario: &'static str,
    pub duration_seconds: u64,
    /// Whether a `new-agents` ceiling is on to remember agent ids (else the table is unused).
    pub ceiling_remembers: bool,
    /// The table as `check` states it.
    pub table: KnownTable,
    pub fill_addresses: u64,
    pub fill_ids_each: u64,
    pub fill_starts_seconds: u64,
    pub fill_seconds: u64,
    pub keep_full_per_second: u64,
    pub sustained_addresses: u64,
    pub sustained_starts_seconds: u64,
    /// What one site's agents send: their heartbeats a minute.
    pub site_heartbeats_per_minute: f64,
    /// When the table first held as many ids as it can (`None`: never).
    pub table_full_at_seconds: Option<f64>,
    pub flood_requests: u64,
    pub flood_admitted: u64,
    pub sites: Vec<SiteOutcome>,
    /// The table's counts at the end of the run.
    pub known: TableCounts,
    /// Each site's heartbeats, admitted per bin, for the plot.
    #[serde(skip)]
    pub clients: Vec<Attacker>,
    #[serde(skip)]
    pub series: Series,
}

#[derive(Debug, Clone, Serialize)]
pub struct SiteOutcome {
    pub name: &'static str,
    pub address: &'static str,
    pub agents: u64,
    pub arrives_seconds: u64,
    pub heartbeats: u64,
    pub heartbeats_refused: u64,
    pub polls_refused: u64,
    pub agents_marked_offline: u64,
    /// Heartbeats admitted per minute from the site's arrival to the end.
    pub admitted_per_minute: f64,
    /// The table when the site arrived.
    pub table_at_arrival: TableCounts,
}

/// What the known-agents table holds and did (the table's `Counts`, named for a report).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct TableCounts {
    pub probation: u64,
    pub protected: u64,
    pub not_remembered_address: u64,
    pub not_remembered_table: u64,
    pub evicted_stale_probation: u64,
    pub evicted_share_probation: u64,
    pub evicted_stale_protected: u64,
    pub evicted_share_protected: u64,
    pub not_promoted: u64,
}

impl From<Counts> for TableCounts {
    fn from(c: Counts) -> Self {
        Self {
            probation: c.probation,
            protected: c.protected,
            not_remembered_address: c.not_remembered_address,
            not_remembered_table: c.not_remembered_table,
            evicted_stale_probation: c.evicted_stale[0],
            evicted_share_probation: c.evicted_share[0],
            evicted_stale_protected: c.evicted_stale[1],
            evicted_share_protected: c.evicted_share[1],
            not_promoted: c.not_promoted,
        }
    }
}

/// The three sites: name, NAT, arrival.
/// A minute per bin: each site's rate, not its heartbeats' phase.
const MINUTE: NonZeroU64 = NonZeroU64::new(60).unwrap();

/// Every site arrives before the run ends (each one's rate is over its own time).
const _: () =
    assert!(AFTER_FILL_SECONDS < DURATION_SECONDS && DURING_FLOOD_SECONDS < DURATION_SECONDS);
const SITES: [(&str, &str, u64); 3] = [
    ("established", SITE_NAT, 0),
    ("new after the fill", "198.51.100.20", AFTER_FILL_SECONDS),
    (
        "new during the flood",
        "198.51.100.30",
        DURING_FLOOD_SECONDS,
    ),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Arrive(usize),
    Heartbeat(usize, usize),
    Poll(usize, usize),
    Fill(u64),
    KeepFull(u64),
    /// The `k`th request of the sustained flood's address `a`.
    Sustained(u64, u64),
}

/// The `n`th /56 of the fill (under 2001:db8::/32) or of the sustained flood (under
/// 2001:db8:8000::/33), with low bits varying with `host`.
fn v6(sustained: bool, n: u64, host: u64) -> IpAddr {
    let base: u128 = 0x2001_0db8 << 96;
    let net = u128::from(n) + if sustained { 0x80_0000 } else { 0 };
    IpAddr::V6(Ipv6Addr::from(base | net << 72 | u128::from(host)))
}

/// The ceiling's budget: `(limit, window)`; the fleet's largest site a minute without one.
fn ceiling(cfg: &Config) -> (NonZeroU64, Nanos) {
    cfg.limiters
        .iter()
        .find(|l| &*l.name == crate::config::AGENT_IP)
        .map(|l| {
            (
                NonZeroU64::from(l.quota.nonzero_limit()),
                l.quota.window_ns(),
            )
        })
        .unwrap_or((cfg.fleet.max_site_endpoints, 60 * NS))
}

/// The sites' cadences, read once from the configuration.
#[derive(Clone, Copy)]
struct Cadence {
    hb: Nanos,
    poll: Nanos,
    timeout: Nanos,
}

/// How the other addresses mint ids: the fill's pace, when keeping the table full starts, and
/// the sustained flood's addresses and ceiling.
#[derive(Clone, Copy)]
struct FloodPlan {
    fill_total: u64,
    fill_gap: Nanos,
    keep_starts: Nanos,
    sustained: u64,
    limit: NonZeroU64,
    window: Nanos,
}

impl FloodPlan {
    /// The plan against `table`: as many sustained addresses as the bound `check` states
    /// leaves room for beside the stream that keeps the table full.
    fn of(cfg: &Config, table: &KnownTable) -> Self {
        let site = table.site;
        let stream = (KEEP_FULL_PER_SECOND.saturating_mul(table.grace_seconds))
            .min(FILL_ADDRESSES.saturating_mul(site));
        let sustained = (table.others_first_sightings.saturating_sub(stream) / site)
            .min(MAX_SUSTAINED_ADDRESSES);
        let (limit, window) = ceiling(cfg);
        let fill_total = FILL_ADDRESSES * FILL_IDS_EACH;
        const _: () = assert!(FILL_ADDRESSES * FILL_IDS_EACH > 0);
        let fill_gap = FILL_SECONDS * NS / fill_total;
        Self {
            fill_total,
            fill_gap,
            keep_starts: FILL_STARTS_SECONDS * NS + fill_total * fill_gap,
            sustained,
            limit,
            window,
        }
    }
}

/// A site's agent `i`'s id.
fn agent_id(s: usize, i: usize) -> String {
    format!("site{s}-agent-{i:04}")
}

/// Each site's outcome before the run: its agents, its arrival, nothing counted yet.
fn site_outcomes(n: usize) -> Vec<SiteOutcome> {
    SITES
        .iter()
        .map(|&(name, address, at)| SiteOutcome {
            name,
            address,
            agents: n as u64,
            arrives_seconds: at,
            heartbeats: 0,
            heartbeats_refused: 0,
            polls_refused: 0,
            agents_marked_offline: 0,
            admitted_per_minute: 0.0,
            table_at_arrival: TableCounts::default(),
        })
        .collect()
}

/// A table-flood run in progress: the sites' agents, the flood, the tallies.
struct TableFloodRun {
    cadence: Cadence,
    plan: FloodPlan,
    table: KnownTable,
    rng: Rng,
    sim: Sim,
    q: Queue<Ev>,
    last_heartbeat: Vec<Vec<Nanos>>,
    offline: Vec<Vec<bool>>,
    outcomes: Vec<SiteOutcome>,
    site_series: Vec<Series>,
    flood_requests: u64,
    flood_admitted: u64,
    full_at: Option<f64>,
}

impl TableFloodRun {
    /// The sites' arrivals, the fill, keeping the table full and the sustained flood, all
    /// scheduled.
    fn new(cfg: &Config, seed: u64, cadence: Cadence, table: KnownTable, n: usize) -> Self {
        let plan = FloodPlan::of(cfg, &table);
        let mut q = Queue::default();
        for (s, (_, _, at)) in SITES.iter().enumerate() {
            q.push(at * NS, Ev::Arrive(s));
        }
        q.push(FILL_STARTS_SECONDS * NS, Ev::Fill(0));
        q.push(plan.keep_starts, Ev::KeepFull(0));
        for a in 0..plan.sustained {
            // Staggered over the first second.
            q.push(
                SUSTAINED_STARTS_SECONDS * NS + a * NS / plan.sustained,
                Ev::Sustained(a, 0),
            );
        }
        Self {
            cadence,
            plan,
            table,
            rng: Rng::new(seed),
            sim: Sim::new(cfg),
            q,
            last_heartbeat: vec![vec![0; n]; SITES.len()],
            offline: vec![vec![false; n]; SITES.len()],
            outcomes: site_outcomes(n),
            // A new site's agents arrive together and keep in step: a minute per bin shows
            // each site's rate, not its heartbeats' phase.
            site_series: SITES
                .iter()
                .map(|_| Series {
                    bin_seconds: MINUTE,
                    ..Series::default()
                })
                .collect(),
            flood_requests: 0,
            flood_admitted: 0,
            full_at: None,
        }
    }

    /// Every event due before `end`, in order: a flooding event sends its request once the
    /// next one is scheduled.
    async fn run_until(&mut self, end: Nanos) {
        while let Some((t, ev)) = self.q.pop_until(end) {
            let flood = match ev {
                Ev::Arrive(s) => {
                    self.arrive(t, s);
                    None
                }
                Ev::Heartbeat(s, i) => {
                    self.heartbeat(t, s, i).await;
                    None
                }
                Ev::Poll(s, i) => {
                    self.poll(t, s, i).await;
                    None
                }
                Ev::Fill(k) => Some(self.fill(t, k)),
                Ev::KeepFull(k) => Some(self.keep_full(t, k)),
                Ev::Sustained(a, k) => Some(self.sustained(t, a, k)),
            };
            if let Some((peer, id)) = flood {
                self.send_flood(t, peer, &id).await;
            }
        }
    }

    /// Site `s` arrives: the table as it finds it, and each agent's first heartbeat and poll.
    fn arrive(&mut self, t: Nanos, s: usize) {
        self.outcomes[s].table_at_arrival = self.sim.known_agents().into();
        let Cadence { hb, poll, .. } = self.cadence;
        for (i, last) in self.last_heartbeat[s].iter_mut().enumerate() {
            let first = if SITES[s].2 == 0 {
                self.rng.within(secs(hb))
            } else {
                self.rng.within(ARRIVAL_SPREAD_SECONDS)
            };
            *last = t;
            self.q.push(t + first, Ev::Heartbeat(s, i));
            self.q
                .push(t + first + self.rng.within(secs(poll)), Ev::Poll(s, i));
        }
    }

    /// Site `s`'s agent `i` on `route` at `t`, as the limiter answers it.
    async fn send_agent(
        &mut self,
        t: Nanos,
        s: usize,
        i: usize,
        route: (&'static str, &'static str),
    ) -> Answer {
        let id = agent_id(s, i);
        let req = Req {
            peer: super::ip(SITES[s].1),
            route,
            agent_id: Some(&id),
            bearer: None,
        };
        self.sim.send(t, &req).await
    }

    /// Site `s`'s agent `i`'s heartbeat: offline if it came too late, retried if refused.
    async fn heartbeat(&mut self, t: Nanos, s: usize, i: usize) {
        self.outcomes[s].heartbeats += 1;
        let answer = self.send_agent(t, s, i, traffic::HEARTBEAT).await;
        self.site_series[s].record(t, answer == Answer::Admitted);
        match answer {
            Answer::Admitted => {
                self.offline[s][i] |= t - self.last_heartbeat[s][i] >= self.cadence.timeout;
                self.last_heartbeat[s][i] = t;
                self.q.push(t + self.cadence.hb, Ev::Heartbeat(s, i));
            }
            Answer::Refused { retry_after_secs } => {
                self.outcomes[s].heartbeats_refused += 1;
                let retry = t + self.rng.backoff(retry_after_secs);
                self.q.push(retry, Ev::Heartbeat(s, i));
            }
        }
    }

    /// Site `s`'s agent `i`'s task poll, retried if refused.
    async fn poll(&mut self, t: Nanos, s: usize, i: usize) {
        match self.send_agent(t, s, i, traffic::POLL).await {
            Answer::Admitted => self.q.push(t + self.cadence.poll, Ev::Poll(s, i)),
            Answer::Refused { retry_after_secs } => {
                self.outcomes[s].polls_refused += 1;
                let retry = t + self.rng.backoff(retry_after_secs);
                self.q.push(retry, Ev::Poll(s, i));
            }
        }
    }

    /// The fill's `k`th id, and the next one scheduled until the fill is done.
    fn fill(&mut self, t: Nanos, k: u64) -> (IpAddr, String) {
        if k + 1 < self.plan.fill_total {
            self.q.push(t + self.plan.fill_gap, Ev::Fill(k + 1));
        }
        let a = k % FILL_ADDRESSES;
        (v6(false, a, k), format!("fill-{k}"))
    }

    /// The `k`th id that keeps the table full, and the next one scheduled.
    fn keep_full(&mut self, t: Nanos, k: u64) -> (IpAddr, String) {
        self.q
            .push(t + NS / KEEP_FULL_PER_SECOND, Ev::KeepFull(k + 1));
        let a = k % FILL_ADDRESSES;
        (v6(false, a, k), format!("keep-{k}"))
    }

    /// Sustained address `a`'s `k`th id: the ceiling's burst at once, then its refill.
    fn sustained(&mut self, t: Nanos, a: u64, k: u64) -> (IpAddr, String) {
        let limit = self.plan.limit.get();
        let gap = if k + 1 < limit {
            NS / 1000
        } else {
            self.plan.window / limit
        };
        self.q.push(t + gap, Ev::Sustained(a, k + 1));
        (v6(true, a, k), format!("flood-{a}-{k}"))
    }

    /// One flooding request, counted, and when the table first holds as many ids as it can.
    async fn send_flood(&mut self, t: Nanos, peer: IpAddr, id: &str) {
        let req = Req {
            peer,
            route: traffic::POLL,
            agent_id: Some(id),
            bearer: None,
        };
        self.flood_requests += 1;
        self.flood_admitted += u64::from(self.sim.send(t, &req).await == Answer::Admitted);
        if self.full_at.is_none() && {
            let c = self.sim.known_agents();
            c.probation + c.protected >= self.table.capacity
        } {
            self.full_at = Some(secs(t));
        }
    }

    /// Each site's agents marked offline (a last heartbeat too long before `end` counts) and
    /// its heartbeats admitted a minute since its arrival.
    fn finish_sites(&mut self, end: Nanos) {
        for (s, site) in self.outcomes.iter_mut().enumerate() {
            for (i, last) in self.last_heartbeat[s].iter().enumerate() {
                self.offline[s][i] |= end - last >= self.cadence.timeout;
            }
            site.agents_marked_offline = self.offline[s].iter().filter(|o| **o).count() as u64;
            let minutes = (DURATION_SECONDS - site.arrives_seconds) as f64 / 60.0;
            let admitted = site.heartbeats - site.heartbeats_refused;
            site.admitted_per_minute = (admitted as f64 / minutes * 10.0).round() / 10.0;
        }
    }

    /// The report at `end`.
    fn report(mut self, cfg: &Config, end: Nanos, n: usize) -> TableFloodReport {
        self.finish_sites(end);
        self.sim.series.pad_to(DURATION_SECONDS);
        let clients = site_clients(&self.outcomes, self.site_series);
        TableFloodReport {
            scenario: "table-flood",
            duration_seconds: DURATION_SECONDS,
            ceiling_remembers: cfg
                .limiters
                .iter()
                .any(|l| l.new_agents.is_some() && l.mode != crate::policy::Mode::Off),
            table: self.table,
            fill_addresses: FILL_ADDRESSES,
            fill_ids_each: FILL_IDS_EACH,
            fill_starts_seconds: FILL_STARTS_SECONDS,
            fill_seconds: FILL_SECONDS,
            keep_full_per_second: KEEP_FULL_PER_SECOND,
            sustained_addresses: self.plan.sustained,
            sustained_starts_seconds: SUSTAINED_STARTS_SECONDS,
            site_heartbeats_per_minute: n as f64 * 60.0 / secs(self.cadence.hb),
            table_full_at_seconds: self.full_at.map(|s: f64| (s * 10.0).round() / 10.0),
            flood_requests: self.flood_requests,
            flood_admitted: self.flood_admitted,
            known: self.sim.known_agents().into(),
            sites: self.outcomes,
            clients,
            series: self.sim.series,
        }
    }
}

/// Each site's heartbeats as a client of the plot, its series padded to the run's length.
fn site_clients(outcomes: &[SiteOutcome], site_series: Vec<Series>) -> Vec<Attacker> {
    outcomes
        .iter()
        .zip(site_series)
        .map(|(o, mut series)| {
            series.pad_to(DURATION_SECONDS);
            Attacker {
                name: o.name,
                route: format!("{} {}", traffic::HEARTBEAT.0, traffic::HEARTBEAT.1),
                requests: o.heartbeats,
                refused: o.heartbeats_refused,
                admitted_per_minute: o.admitted_per_minute,
                series,
            }
        })
        .collect()
}

/// Run the `table-flood` scenario.
pub(crate) async fn run(cfg: &Config, seed: u64) -> TableFloodReport {
    let f = &cfg.fleet;
    let n = f.max_site_endpoints.get() as usize;
    let cadence = Cadence {
        hb: super::ns(f.heartbeat_interval_seconds.get()),
        poll: super::ns(f.poll_interval_seconds.get()),
        timeout: super::ns(f.heartbeat_timeout_seconds.get()),
    };
    let end = DURATION_SECONDS * NS;
    let mut flood = TableFloodRun::new(cfg, seed, cadence, KnownTable::of(cfg), n);
    flood.run_until(end).await;
    flood.report(cfg, end, n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[actix_rt::test]
    async fn no_site_loses_a_heartbeat_however_the_table_is_flooded() {
        let r = run(&Config::default(), 7).await;
        assert_eq!(r.table.others_first_sightings, 49_750);
        // 127 ids a second for 2 minutes leave 34 510 of them: 138 sites' worth.
        assert_eq!(r.sustained_addresses, 138);
        let full = r.table_full_at_seconds.expect("the fill fills the table");
        assert!(full < (FILL_STARTS_SECONDS + FILL_SECONDS) as f64, "{full}");
        for s in &r.sites {
            assert_eq!(s.heartbeats_refused, 0, "{}: {s:?}", s.name);
            assert_eq!(s.polls_refused, 0, "{}: {s:?}", s.name);
            assert_eq!(s.agents_marked_offline, 0, "{}", s.name);
            assert!(s.heartbeats >= 250, "{}: {}", s.name, s.heartbeats);
        }
        // The new sites arrived at a full table.
        for s in &r.sites[1..] {
            let t = s.table_at_arrival;
            assert_eq!(t.probation + t.protected, 100_000, "{}: {t:?}", s.name);
        }
        let k = r.known;
        assert_eq!(k.protected, 750, "every site's agents, seen twice: {k:?}");
        // The new sites took the places of first sightings past their grace; the flood's own
        // ids found none once the table was full.
        assert!(
            k.evicted_stale_probation > 0 && k.not_remembered_table > 0,
            "{k:?}"
        );
        assert_eq!(k.evicted_share_protected + k.evicted_stale_protected, 0);
        assert!(r.flood_admitted > 100_000, "{}", r.flood_admitted);
    }

    #[actix_rt::test]
    async fn a_table_beyond_its_bound_fails_the_sites_that_arrive_later() {
        // 4 000 ids: 2 000 first sightings hold a new site's against 7 other addresses, and
        // the 456 /56s that keep the table full all mint within the grace: past the bound
        // `check` states (it finds this table unsafe), a new site keeps only an equal share.
        let mut cfg = Config::default();
        cfg.store.max_keys = 4_000;
        assert!(!crate::calibration::check::check(&cfg).is_safe());
        let r = run(&cfg, 7).await;
        assert_eq!(r.table.flooding_addresses, 7);
        assert_eq!(
            r.sites[0].heartbeats_refused, 0,
            "the established site is protected"
        );
        assert!(r.sites[1].heartbeats_refused > 0, "{:?}", r.sites[1]);
        assert!(r.known.evicted_share_probation > 0, "{:?}", r.known);
    }
}
