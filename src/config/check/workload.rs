//! The workload model: the requests a healthy fleet declares, which limiters meter each (the
//! gateway's own routing), and how many clients share one bucket of a limiter given its key.

use super::routes::Routes;
use super::traffic;
use super::types::Workload;
use crate::config::{Config, FleetConfig};
use crate::identity::Credential;
use crate::keys::KeyKind;
use crate::path::CanonicalPath;
use crate::policy::{LimiterSpec, Policy};
use std::collections::BTreeMap;
use std::num::NonZeroU64;

/// One request of a workload: method, path, the credential it carries, whether it names an
/// agent or a verified user (its own bucket under `ip+agent` or `user-or-ip`), whether it
/// carries a dashboard token that would name a user if a verifier were configured, its rate.
pub(super) struct Req {
    method: String,
    path: String,
    /// The agents' heartbeat, whose loss marks an agent offline.
    heartbeat: bool,
    credential: Credential,
    agent_id: bool,
    user: bool,
    token: bool,
    /// Requests per minute per client (steady), or requests per client (burst).
    amount: f64,
}

pub(super) struct Spec {
    pub(super) workload: Workload,
    pub(super) clients: NonZeroU64,
    pub(super) steady: bool,
    pub(super) unit: &'static str,
    pub(super) reqs: Vec<Req>,
}

/// The declared workloads; `verified`: a token verifier is configured, so a dashboard's token
/// names its analyst (without one it verifies as nothing and the request is anonymous).
pub(super) fn workloads(f: &FleetConfig, verified: bool, at: &Routes) -> Vec<Spec> {
    let per_min = |secs: u64| 60.0 / secs as f64;
    let req = |route: &(String, String)| (route.0.clone(), route.1.clone());
    let agent = |(method, path): (String, String), amount| Req {
        method,
        path,
        heartbeat: false,
        credential: Credential::None,
        agent_id: true,
        user: false,
        token: false,
        amount,
    };
    let anon = |(method, path): (String, String), credential, amount| Req {
        method,
        path,
        heartbeat: false,
        credential,
        agent_id: false,
        user: false,
        token: false,
        amount,
    };
    vec![
        Spec {
            workload: Workload::AgentIdle,
            clients: f.max_site_endpoints,
            steady: true,
            unit: "agent",
            reqs: vec![
                Req {
                    heartbeat: true,
                    ..agent(
                        req(&at.heartbeat),
                        per_min(f.heartbeat_interval_seconds.get()),
                    )
                },
                agent(req(&at.poll), per_min(f.poll_interval_seconds.get())),
            ],
        },
        Spec {
            workload: Workload::Rollout,
            clients: f.max_site_endpoints,
            steady: false,
            unit: "endpoint",
            reqs: vec![
                anon(req(&at.download), Credential::None, 1.0),
                anon(req(&at.enroll), Credential::None, 1.0),
            ],
        },
        Spec {
            workload: Workload::Dashboards,
            clients: f.analysts_per_nat,
            steady: true,
            unit: if verified {
                "verified analyst"
            } else {
                "analyst"
            },
            reqs: vec![Req {
                method: at.dashboard.0.clone(),
                path: at.dashboard.1.clone(),
                heartbeat: false,
                credential: if verified {
                    Credential::VerifiedUser
                } else {
                    Credential::None
                },
                agent_id: false,
                user: verified,
                token: true,
                amount: traffic::dashboard_per_minute(f.dashboard_poll_seconds),
            }],
        },
        Spec {
            workload: Workload::CliLogin,
            clients: NonZeroU64::MIN,
            steady: true,
            unit: "CLI",
            reqs: vec![anon(
                req(&at.device_poll),
                Credential::None,
                per_min(traffic::DEVICE_POLL_SECONDS),
            )],
        },
    ]
}

/// Clients of a workload sharing one bucket of a limiter keyed `key`.
pub(super) fn sharers(key: &KeyKind, req: &Req, clients: NonZeroU64) -> u64 {
    let own = match key {
        KeyKind::IpAgent => req.agent_id,
        KeyKind::UserOrIp => req.user,
        _ => false,
    };
    if own {
        1
    } else {
        clients.get()
    }
}

/// What one workload asks of one limiter's bucket, before it is judged.
#[derive(Debug, Clone, Copy)]
pub(super) struct Demand {
    pub(super) amount: f64,
    pub(super) sharers: u64,
    pub(super) carries_heartbeat: bool,
    /// Shared only because no verifier names the users (see [`Load::ip_fallback`](super::Load::ip_fallback)).
    pub(super) ip_fallback: bool,
}

/// The declared fleet against one configuration: its workloads, and which of their requests
/// each limiter meters. What a limiter's key makes of those requests is [`Model::loads`], so a
/// limiter can be judged again with another key, budget or window without routing anew.
pub(super) struct Model<'a> {
    pub(super) fleet: &'a FleetConfig,
    /// Every configured limiter, as the configuration's own rules see them together.
    pub(super) limiters: &'a [LimiterSpec],
    pub(super) specs: Vec<Spec>,
    /// limiter name -> (workload index, request index) of every request it meters, in order.
    reaches: BTreeMap<String, Vec<(usize, usize)>>,
}

impl<'a> Model<'a> {
    pub(super) fn new(cfg: &'a Config) -> Self {
        let policy = Policy::new(cfg.limiters.clone());
        let specs = workloads(
            &cfg.fleet,
            cfg.identity.verifies(),
            &Routes::of(cfg, &policy),
        );
        let mut reaches: BTreeMap<String, Vec<(usize, usize)>> = BTreeMap::new();
        for (si, spec) in specs.iter().enumerate() {
            for (ri, req) in spec.reqs.iter().enumerate() {
                let Ok(path) = CanonicalPath::parse(&req.path, crate::path::PathRules::STRICT)
                else {
                    continue;
                };
                for l in policy.applicable(&req.method, &path, req.credential) {
                    reaches
                        .entry(l.name.to_string())
                        .or_default()
                        .push((si, ri));
                }
            }
        }
        Self {
            fleet: &cfg.fleet,
            limiters: &cfg.limiters,
            specs,
            reaches,
        }
    }

    /// What each declared workload asks of one bucket of `l`, keyed as `l` is.
    pub(super) fn loads(&self, l: &LimiterSpec) -> BTreeMap<Workload, Demand> {
        let mut demand: BTreeMap<Workload, Demand> = BTreeMap::new();
        for &(si, ri) in self.reaches.get(&*l.name).into_iter().flatten() {
            let (Some(spec), Some(req)) = (
                self.specs.get(si),
                self.specs.get(si).and_then(|s| s.reqs.get(ri)),
            ) else {
                continue;
            };
            let n = sharers(&l.key, req, spec.clients);
            let e = demand.entry(spec.workload).or_insert(Demand {
                amount: 0.0,
                sharers: n,
                carries_heartbeat: false,
                ip_fallback: false,
            });
            e.amount += req.amount * n as f64;
            e.sharers = e.sharers.max(n);
            e.carries_heartbeat |= req.heartbeat;
            e.ip_fallback |= l.key == KeyKind::UserOrIp && req.token && !req.user && n > 1;
        }
        demand
    }
}
