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

pub(crate) async fn run(cfg: &Config, seed: u64) -> TableFloodReport {
    let f = &cfg.fleet;
    let n = f.max_site_endpoints.get() as usize;
    let hb = super::ns(f.heartbeat_interval_seconds.get());
    let poll = super::ns(f.poll_interval_seconds.get());
    let timeout = super::ns(f.heartbeat_timeout_seconds.get());
    let end = DURATION_SECONDS * NS;
    let table = KnownTable::of(cfg);
    let site = table.site;
    let stream = (KEEP_FULL_PER_SECOND.saturating_mul(table.grace_seconds))
        .min(FILL_ADDRESSES.saturating_mul(site));
    let sustained =
        (table.others_first_sightings.saturating_sub(stream) / site).min(MAX_SUSTAINED_ADDRESSES);
    let (limit, window) = ceiling(cfg);
    let fill_total = FILL_ADDRESSES * FILL_IDS_EACH;
    const _: () = assert!(FILL_ADDRESSES * FILL_IDS_EACH > 0);
    let fill_gap = FILL_SECONDS * NS / fill_total;
    let keep_starts = FILL_STARTS_SECONDS * NS + fill_total * fill_gap;
    let mut rng = Rng::new(seed);
    let mut sim = Sim::new(cfg);
    let mut q = Queue::default();
    for (s, (_, _, at)) in SITES.iter().enumerate() {
        q.push(at * NS, Ev::Arrive(s));
    }
    q.push(FILL_STARTS_SECONDS * NS, Ev::Fill(0));
    q.push(keep_starts, Ev::KeepFull(0));
    for a in 0..sustained {
        // Staggered over the first second.
        q.push(
            SUSTAINED_STARTS_SECONDS * NS + a * NS / sustained,
            Ev::Sustained(a, 0),
        );
    }
    let agent_id = |s: usize, i: usize| format!("site{s}-agent-{i:04}");
    let mut last_heartbeat = vec![vec![0; n]; SITES.len()];
    let mut offline = vec![vec![false; n]; SITES.len()];
    let mut outcomes: Vec<SiteOutcome> = SITES
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
        .collect();
    // A new site's agents arrive together and keep in step: a minute per bin shows each site's
    // rate, not its heartbeats' phase.
    let mut site_series: Vec<Series> = SITES
        .iter()
        .map(|_| Series {
            bin_seconds: MINUTE,
            ..Series::default()
        })
        .collect();
    let (mut flood_requests, mut flood_admitted) = (0u64, 0u64);
    let mut full_at = None;
    let capacity = table.capacity;
    while let Some((t, ev)) = q.pop_until(end) {
        let flood = match ev {
            Ev::Arrive(s) => {
                outcomes[s].table_at_arrival = sim.known_agents().into();
                for (i, last) in last_heartbeat[s].iter_mut().enumerate() {
                    let first = if SITES[s].2 == 0 {
                        rng.within(secs(hb))
                    } else {
                        rng.within(ARRIVAL_SPREAD_SECONDS)
                    };
                    *last = t;
                    q.push(t + first, Ev::Heartbeat(s, i));
                    q.push(t + first + rng.within(secs(poll)), Ev::Poll(s, i));
                }
                None
            }
            Ev::Heartbeat(s, i) => {
                let id = agent_id(s, i);
                let req = Req {
                    peer: super::ip(SITES[s].1),
                    route: traffic::HEARTBEAT,
                    agent_id: Some(&id),
                    bearer: None,
                };
                outcomes[s].heartbeats += 1;
                let answer = sim.send(t, &req).await;
                site_series[s].record(t, answer == Answer::Admitted);
                match answer {
                    Answer::Admitted => {
                        offline[s][i] |= t - last_heartbeat[s][i] >= timeout;
                        last_heartbeat[s][i] = t;
                        q.push(t + hb, Ev::Heartbeat(s, i));
                    }
                    Answer::Refused { retry_after_secs } => {
                        outcomes[s].heartbeats_refused += 1;
                        q.push(t + rng.backoff(retry_after_secs), Ev::Heartbeat(s, i));
                    }
                }
                None
            }
            Ev::Poll(s, i) => {
                let id = agent_id(s, i);
                let req = Req {
                    peer: super::ip(SITES[s].1),
                    route: traffic::POLL,
                    agent_id: Some(&id),
                    bearer: None,
                };
                match sim.send(t, &req).await {
                    Answer::Admitted => q.push(t + poll, Ev::Poll(s, i)),
                    Answer::Refused { retry_after_secs } => {
                        outcomes[s].polls_refused += 1;
                        q.push(t + rng.backoff(retry_after_secs), Ev::Poll(s, i));
                    }
                }
                None
            }
            Ev::Fill(k) => {
                if k + 1 < fill_total {
                    q.push(t + fill_gap, Ev::Fill(k + 1));
                }
                let a = k % FILL_ADDRESSES;
                Some((v6(false, a, k), format!("fill-{k}")))
            }
            Ev::KeepFull(k) => {
                q.push(t + NS / KEEP_FULL_PER_SECOND, Ev::KeepFull(k + 1));
                let a = k % FILL_ADDRESSES;
                Some((v6(false, a, k), format!("keep-{k}")))
            }
            Ev::Sustained(a, k) => {
                // The ceiling's burst at once, then its refill.
                let gap = if k + 1 < limit.get() {
                    NS / 1000
                } else {
                    window / limit.get()
                };
                q.push(t + gap, Ev::Sustained(a, k + 1));
                Some((v6(true, a, k), format!("flood-{a}-{k}")))
            }
        };
        if let Some((peer, id)) = flood {
            let req = Req {
                peer,
                route: traffic::POLL,
                agent_id: Some(&id),
                bearer: None,
            };
            flood_requests += 1;
            flood_admitted += u64::from(sim.send(t, &req).await == Answer::Admitted);
            if full_at.is_none() && {
                let c = sim.known_agents();
                c.probation + c.protected >= capacity
            } {
                full_at = Some(secs(t));
            }
        }
    }
    for (s, site) in outcomes.iter_mut().enumerate() {
        for (i, last) in last_heartbeat[s].iter().enumerate() {
            offline[s][i] |= end - last >= timeout;
        }
        site.agents_marked_offline = offline[s].iter().filter(|o| **o).count() as u64;
        let minutes = (DURATION_SECONDS - site.arrives_seconds) as f64 / 60.0;
        let admitted = site.heartbeats - site.heartbeats_refused;
        site.admitted_per_minute = (admitted as f64 / minutes * 10.0).round() / 10.0;
    }
    sim.series.pad_to(DURATION_SECONDS);
    let clients = outcomes
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
        .collect();
    TableFloodReport {
        scenario: "table-flood",
        duration_seconds: DURATION_SECONDS,
        ceiling_remembers: cfg
            .limiters
            .iter()
            .any(|l| l.new_agents.is_some() && l.mode != crate::policy::Mode::Off),
        table,
        fill_addresses: FILL_ADDRESSES,
        fill_ids_each: FILL_IDS_EACH,
        fill_starts_seconds: FILL_STARTS_SECONDS,
        fill_seconds: FILL_SECONDS,
        keep_full_per_second: KEEP_FULL_PER_SECOND,
        sustained_addresses: sustained,
        sustained_starts_seconds: SUSTAINED_STARTS_SECONDS,
        site_heartbeats_per_minute: n as f64 * 60.0 / secs(hb),
        table_full_at_seconds: full_at.map(|s: f64| (s * 10.0).round() / 10.0),
        flood_requests,
        flood_admitted,
        known: sim.known_agents().into(),
        sites: outcomes,
        clients,
        series: sim.series,
    }
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
