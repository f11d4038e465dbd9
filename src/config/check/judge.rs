//! The judge: the arithmetic that decides how one limiter fares against the loads the workload
//! model puts on it. It yields [`Finding`]s, numbers with a class; `wording` writes them out.

use super::findings::Finding;
use super::types::{KnownTable, Load, Status, Workload};
use super::workload::{Demand, Model, Spec};
use super::MIN_IDLE_HEADROOM;
use crate::config::FleetConfig;
use crate::limiter::Algorithm;
use crate::policy::{LimiterSpec, Remember};
use std::collections::BTreeMap;

/// The budget as the judge sees it: a fixed cost of N leaves the bucket room for limit / N
/// requests; a cost read from a header is judged at 1 a request (what clients send is not
/// known here). 0 when a request costs more than the limit.
pub(super) fn effective_limit(l: &LimiterSpec) -> u32 {
    l.quota.limit() / fixed_cost(l)
}

fn fixed_cost(l: &LimiterSpec) -> u32 {
    match l.cost {
        crate::policy::Cost::Fixed(n) => n.get(),
        crate::policy::Cost::Header { .. } => 1,
    }
}

/// What a `new-agents` ceiling must also give the declared fleet: room to remember every agent
/// of the largest site, a memory longer than a healthy agent's longest gap, and a table that
/// keeps the whole declared fleet and a new site's first sightings however others fill it.
fn new_agent_rules(r: Remember, fleet: &FleetConfig, table: &KnownTable, found: &mut Vec<Finding>) {
    if table.protected < table.max_agents {
        found.push(Finding::TableProtected {
            protected: table.protected,
            capacity: table.capacity,
            max_agents: table.max_agents,
        });
    }
    if table.flooding_addresses < 1 {
        found.push(Finding::TableProbation {
            probation: table.probation,
            capacity: table.capacity,
            site: table.site,
        });
    }
    if u64::from(r.max_known) < fleet.max_site_endpoints.get() {
        found.push(Finding::MaxKnown {
            max_known: r.max_known,
            site: fleet.max_site_endpoints,
        });
    }
    let gap = fleet
        .heartbeat_interval_seconds
        .max(fleet.poll_interval_seconds)
        .get();
    if r.known_for.as_secs() <= gap {
        found.push(Finding::KnownFor {
            known_for: r.known_for,
            gap,
        });
    }
}

/// A limiter judged: its loads, and what was found, in the order found.
pub(super) struct Judged {
    pub(super) loads: Vec<Load>,
    /// `Unloaded` when no load reaches it, else `Ok` raised by the findings (mode aside).
    pub(super) status: Status,
    pub(super) findings: Vec<Finding>,
}

/// Judge `l` against the loads `model` puts on it, before its mode is taken into account.
pub(super) fn judge_loads(l: &LimiterSpec, model: &Model, table: &KnownTable) -> Judged {
    let loads = model.loads(l);
    judge_demand(l, model.fleet, table, &model.specs, loads)
}

/// Judge `l` against each workload's demand on it: every load priced, every finding in order.
fn judge_demand(
    l: &LimiterSpec,
    fleet: &FleetConfig,
    table: &KnownTable,
    specs: &[Spec],
    loads: BTreeMap<Workload, Demand>,
) -> Judged {
    let bucket = Bucket::new(l, fleet);
    let mut status = Status::Unloaded;
    let mut found = Vec::new();
    let mut out = Vec::new();
    for (workload, d) in loads {
        let Demand {
            amount,
            sharers,
            carries_heartbeat,
            ip_fallback,
        } = d;
        let Some(spec) = specs.iter().find(|s| s.workload == workload) else {
            continue;
        };
        status = status.max(Status::Ok);
        if bucket.limit == 0 {
            found.push(Finding::NothingFits {
                cost: fixed_cost(l),
                limit: l.quota.limit(),
            });
            continue;
        }
        let per_bucket = super::wording::per_bucket(sharers, spec.unit);
        // A ceiling that meters new agent ids sees each idle agent once, all at once at worst
        // (a rollout, or every agent after the store forgot them); known agents skip it.
        let (steady, amount) = match l.new_agents {
            Some(r) if workload == Workload::AgentIdle => {
                new_agent_rules(r, fleet, table, &mut found);
                (false, sharers as f64)
            }
            _ => (spec.steady, amount),
        };
        let share = Share {
            workload,
            unit: spec.unit,
            amount,
            sharers,
            carries_heartbeat,
            ip_fallback,
            per_bucket,
        };
        out.push(if steady {
            bucket.steady(share, &mut found)
        } else {
            bucket.burst(share, &mut found)
        });
    }
    for f in &found {
        status = status.max(f.status());
    }
    Judged {
        loads: out,
        status,
        findings: found,
    }
}

/// One workload's demand on a limiter, as the judge weighs it.
struct Share {
    workload: Workload,
    unit: &'static str,
    /// Requests a minute (steady) or at once (burst).
    amount: f64,
    sharers: u64,
    carries_heartbeat: bool,
    ip_fallback: bool,
    per_bucket: String,
}

/// One limiter's bucket arithmetic, the same for every load it is judged against.
struct Bucket<'a> {
    l: &'a LimiterSpec,
    fleet: &'a FleetConfig,
    limit: u32,
    window: f64,
    fixed: bool,
    emission: f64,
    refill_per_min: f64,
}

impl<'a> Bucket<'a> {
    /// The budget, window and refill of `l` in the judge's units.
    fn new(l: &'a LimiterSpec, fleet: &'a FleetConfig) -> Self {
        let limit = effective_limit(l);
        let window = l.quota.window().as_secs_f64();
        Bucket {
            l,
            fleet,
            limit,
            window,
            fixed: l.quota.algorithm == Algorithm::FixedWindow,
            emission: window / limit as f64,
            refill_per_min: limit as f64 * 60.0 / window,
        }
    }

    /// A refusal of a limiter with a lockout refuses the key for the whole lockout: any wait
    /// there is lasts at least that long.
    fn locked(&self, wait: f64) -> f64 {
        match self.l.quota.lockout() {
            Some(d) if wait > 0.0 => wait.max(d.as_secs_f64()),
            _ => wait,
        }
    }

    /// A steady load against the refill: too fast for it, shared only for want of a verifier,
    /// or (idle agents) a wait that would cost a heartbeat.
    fn steady(&self, s: Share, found: &mut Vec<Finding>) -> Load {
        let (amount, sharers, refill_per_min) = (s.amount, s.sharers, self.refill_per_min);
        let headroom = refill_per_min / amount;
        // Time for an emptied bucket to give each sharer one request.
        let worst = if amount > refill_per_min {
            None
        } else if self.fixed {
            Some(self.window * (sharers as f64 / self.limit as f64).ceil())
        } else {
            Some(self.emission * sharers as f64)
        };
        let worst = worst.map(|w| self.locked(w));
        // Each client on a bucket of its own would fit: only the missing verifier shares it.
        let fits_alone = amount / sharers as f64 <= refill_per_min;
        if amount > refill_per_min && s.ip_fallback && fits_alone {
            found.push(Finding::SharedIp {
                sharers,
                unit: s.unit,
                amount,
                refill: refill_per_min,
                workload: s.workload,
            });
        } else if amount > refill_per_min {
            found.push(Finding::RefillTooSlow {
                refill: refill_per_min,
                amount,
                workload: s.workload,
                per_bucket: s.per_bucket.clone(),
            });
        } else if s.workload == Workload::AgentIdle {
            self.idle_agent_wait(worst, headroom, s.carries_heartbeat, found);
        }
        Load {
            workload: s.workload,
            sharers,
            per_minute: Some(amount),
            burst: None,
            carries_heartbeat: s.carries_heartbeat,
            ip_fallback: s.ip_fallback,
            headroom,
            worst_refused_seconds: worst,
            describe: super::wording::steady(s.workload, amount, sharers, s.unit, s.ip_fallback),
        }
    }

    /// Idle agents that fit the refill: the longest wait must leave a heartbeat inside the
    /// timeout, and the headroom must not be thin.
    fn idle_agent_wait(
        &self,
        worst: Option<f64>,
        headroom: f64,
        carries_heartbeat: bool,
        found: &mut Vec<Finding>,
    ) {
        let w = worst.unwrap_or(f64::INFINITY);
        let timeout = self.fleet.heartbeat_timeout_seconds;
        let gap = if carries_heartbeat {
            w + self.fleet.heartbeat_interval_seconds.get() as f64
        } else {
            w
        };
        if gap >= timeout.get() as f64 {
            found.push(Finding::HeartbeatGap {
                wait: w,
                gap,
                carries_heartbeat,
                timeout,
            });
        } else if headroom < MIN_IDLE_HEADROOM {
            found.push(Finding::ThinHeadroom { headroom });
        }
    }

    /// A burst against the budget: what does not fit waits for the refill (or the lockout).
    fn burst(&self, s: Share, found: &mut Vec<Finding>) -> Load {
        let limit = self.limit;
        let burst = s.amount.round() as u64;
        let headroom = limit as f64 / s.amount;
        let over = burst.saturating_sub(limit as u64);
        let worst = self.locked(if over == 0 {
            0.0
        } else if self.fixed {
            self.window * (over as f64 / limit as f64).ceil()
        } else {
            self.emission * over as f64
        });
        if over > 0 {
            found.push(Finding::Burst {
                site: self.fleet.max_site_endpoints,
                limit,
                burst,
                worst,
            });
        }
        Load {
            workload: s.workload,
            sharers: s.sharers,
            per_minute: None,
            burst: Some(burst),
            carries_heartbeat: s.carries_heartbeat,
            ip_fallback: s.ip_fallback,
            headroom,
            worst_refused_seconds: Some(worst),
            describe: super::wording::burst(
                s.workload,
                burst,
                s.sharers,
                &s.per_bucket,
                self.l.new_agents.is_some(),
            ),
        }
    }
}
