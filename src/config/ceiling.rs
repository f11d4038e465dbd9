//! The `agent-ip` ceiling: the agent ids one IP may mint, sized from the fleet.
//!
//! `agent-device` keys on `<ip>:<agent-id>`, and the agent id is a header the client chooses, so
//! a client rotating it would get a fresh bucket per request. `agent-ip` meters the same routes
//! on the IP alone, in its own group so that both apply, and by default it meters only agent
//! ids it does not know at that IP (`meter = "new-agents"`, see [`crate::known_agents`]): a
//! known agent keeps its own `agent-device` budget however hard another client at its NAT
//! floods. Its budget is the largest site the fleet settings describe appearing at once:
//!
//! ```text
//! limit     = fleet.max_site_endpoints new ids          (250)
//! window    = agent-device.window                       (1m)
//! max_known = 2 x fleet.max_site_endpoints per address  (500)
//! known_for = 15m, renewed by each admitted request
//! ```
//!
//! So one address's agent traffic is at most `max_known` x agent-device's budget plus the new ids
//! (500 x 30 + 250 = 15 250 a minute). With `meter = "requests"` the ceiling meters every
//! request instead, and its derived budget is the whole site at full rate
//! (`max_site_endpoints x agent-device.limit`, 7 500 a minute).
//!
//! Every field not set explicitly under `[limiters.agent-ip]` follows `agent-device` and the
//! fleet settings, so raising either raises the ceiling with it. An explicit `window` keeps the
//! same rate (the limit scales with the window, rounded up); an explicit `limit` is taken as is.
//! Routes are `agent-device`'s routes, minus its exceptions and minus every route of the other
//! limiters in its group that are not keyed on the agent id: those limiters meter those requests
//! instead of `agent-device` (by default the lifecycle endpoints: enrollment, download, key
//! rotation, each with an IP budget of its own). A limiter of the group keyed on `ip+agent` (a
//! heartbeat bucket of its own) keys on the agent id as well, so the ceiling keeps its routes.

use super::{ConfigError, Ctx, FleetConfig, RawLimiter};
use crate::limiter::Quota;
use crate::policy::LimiterSpec;

pub(crate) const AGENT_IP: &str = "agent-ip";
pub(crate) const AGENT_DEVICE: &str = "agent-device";

/// Which `agent-ip` fields the operator set (file or environment).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Explicit {
    limit: bool,
    window: bool,
    routes: bool,
    except: bool,
    algorithm: bool,
    mode: bool,
}

impl Explicit {
    pub(super) fn of(given: Option<&RawLimiter>) -> Self {
        match given {
            None => Self::default(),
            Some(r) => Self {
                limit: r.limit.is_some(),
                window: r.window.is_some(),
                routes: r.routes.is_some(),
                except: r.except.is_some(),
                algorithm: r.algorithm.is_some(),
                mode: r.mode.is_some(),
            },
        }
    }
}

/// The ceiling's budget for a window of `window_ns`. Metering requests: the fleet's largest
/// site, every agent at its full `agent-device` budget. Metering new agent ids: the fleet's
/// largest site appearing at once (a rollout, or every agent after the store lost its memory)
/// within one `agent-device` window.
pub(crate) fn derived_limit(
    fleet: &FleetConfig,
    device: &Quota,
    window_ns: u64,
    new_agents: bool,
) -> Option<u64> {
    let site = fleet.max_site_endpoints.get();
    let per_device_window = if new_agents {
        site
    } else {
        site.checked_mul(u64::from(device.limit()))?
    };
    // Never zero: a quota's window is longer than zero.
    let device_ns = device.window().as_nanos();
    let scaled = (per_device_window as u128 * window_ns as u128).div_ceil(device_ns);
    u64::try_from(scaled).ok()
}

/// Rewrite the `agent-ip` limiter from `agent-device` and the fleet settings, keeping what the
/// operator set explicitly.
pub(super) fn derive_agent_ip(
    limiters: &mut [LimiterSpec],
    explicit: Explicit,
    fleet: &FleetConfig,
    ctx: &Ctx,
) -> Result<(), ConfigError> {
    let Some(device) = limiters.iter().find(|l| &*l.name == AGENT_DEVICE).cloned() else {
        return Ok(());
    };
    // The routes another limiter of agent-device's group takes over. Those keyed on the agent
    // id too (a heartbeat bucket of its own, say) still need the ceiling, and so do the routes
    // of one turned off (agent-device meters them again); the others (the lifecycle endpoints,
    // with IP budgets of their own) do not.
    let lifecycle: Vec<_> = limiters
        .iter()
        .filter(|l| {
            l.group == device.group
                && &*l.name != AGENT_DEVICE
                && &*l.name != AGENT_IP
                && l.key != crate::keys::KeyKind::IpAgent
                && l.mode != crate::policy::Mode::Off
        })
        .flat_map(|l| l.routes.iter().cloned())
        .collect();
    let Some(ceiling) = limiters.iter_mut().find(|l| &*l.name == AGENT_IP) else {
        return Ok(());
    };
    let window = if explicit.window {
        ceiling.quota.window()
    } else {
        device.quota.window()
    };
    let algorithm = if explicit.algorithm {
        ceiling.quota.algorithm
    } else {
        device.quota.algorithm
    };
    // Positive: the site and agent-device's budget are at least 1, and so is the window.
    let derived = if explicit.limit {
        None
    } else {
        let new_agents = ceiling.new_agents.is_some();
        let n = derived_limit(fleet, &device.quota, window.as_nanos() as u64, new_agents)
            .and_then(|n| u32::try_from(n).ok())
            .and_then(std::num::NonZeroU32::new)
            .ok_or_else(|| {
                ctx.err(
                    "fleet.max_site_endpoints",
                    format!(
                        "{} is too large a site to size agent-ip from; set limiters.agent-ip.limit explicitly",
                        fleet.max_site_endpoints
                    ),
                )
            })?;
        Some(n)
    };
    ceiling.quota = match derived {
        Some(limit) => Quota::new(limit, window, algorithm),
        None => {
            let mut quota = ceiling.quota.with_window(window);
            quota.algorithm = algorithm;
            quota
        }
    };
    if !explicit.routes {
        ceiling.routes = device.routes.clone();
    }
    if !explicit.except {
        let mut except = device.except.clone();
        except.extend(lifecycle);
        ceiling.except = except;
    }
    if !explicit.mode {
        ceiling.mode = device.mode;
    }
    // Its own group, always distinct from agent-device's, so the two stack.
    if ceiling.group == device.group {
        return Err(ctx.err(
            "limiters.agent-ip.group",
            format!(
                "agent-ip must not share group `{}` with agent-device: in one group only one of them would apply; leave the group unset",
                device.group
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::clock::ManualClock;
    use crate::config::{Config, Loader};
    use crate::decision::{Decider, RequestFacts};
    use crate::identity::NoVerifier;
    use crate::store::memory::MemoryStore;
    use std::sync::Arc;
    use std::time::Duration;

    fn load(env: &[(&str, &str)]) -> Result<Config, String> {
        Loader::new()
            .env(env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())))
            .load()
            .map_err(|e| e.to_string())
    }

    fn agent_ip(cfg: &Config) -> (u32, Duration, Vec<String>, Vec<String>) {
        let l = cfg
            .limiters
            .iter()
            .find(|l| &*l.name == "agent-ip")
            .unwrap();
        let s = |v: &[crate::policy::RoutePattern]| v.iter().map(|r| r.to_string()).collect();
        (
            l.quota.limit(),
            l.quota.window(),
            s(&l.routes),
            s(&l.except),
        )
    }

    #[test]
    fn the_ceiling_keeps_the_routes_where_the_agent_id_still_keys_a_bucket() {
        // A heartbeat bucket of its own keys on the agent id too: the ceiling still meters it.
        let cfg = load(&[
            ("FLEET_LIMITER_LIMITER_AGENT_HEARTBEAT_LIMIT", "10"),
            ("FLEET_LIMITER_LIMITER_AGENT_HEARTBEAT_WINDOW", "1m"),
            ("FLEET_LIMITER_LIMITER_AGENT_HEARTBEAT_KEY", "ip+agent"),
            (
                "FLEET_LIMITER_LIMITER_AGENT_HEARTBEAT_ROUTES",
                "POST /api/agent/heartbeat",
            ),
            ("FLEET_LIMITER_LIMITER_AGENT_HEARTBEAT_GROUP", "agent"),
            // Key rotation turned off: agent-device meters it again, and so must the ceiling.
            ("FLEET_LIMITER_LIMITER_KEY_ROTATION_MODE", "off"),
        ])
        .unwrap();
        let (_, _, _, except) = agent_ip(&cfg);
        assert_eq!(
            except,
            ["POST /api/agent/enroll", "GET /api/agent/download/**"]
        );
    }

    #[test]
    fn default_ceiling_is_the_largest_site_in_new_agent_ids() {
        let cfg = load(&[]).unwrap();
        let (limit, window, routes, except) = agent_ip(&cfg);
        assert_eq!((limit, window), (250, Duration::from_secs(60)));
        assert_eq!(routes, ["/api/agent/**"]);
        assert_eq!(
            except,
            [
                "POST /api/agent/enroll",
                "GET /api/agent/download/**",
                "POST /api/agent/rotate-key"
            ]
        );
        let l = cfg
            .limiters
            .iter()
            .find(|l| &*l.name == "agent-ip")
            .unwrap();
        let r = l.new_agents.expect("agent-ip meters new agent ids");
        assert_eq!((r.known_for, r.max_known), (Duration::from_secs(900), 500));
        // The calibration table states the same numbers the derivation gives.
        let row = crate::config::defaults::LIMITERS
            .iter()
            .find(|b| b.name == "agent-ip")
            .unwrap();
        assert_eq!((row.limit, row.window), (limit, "1m"));
    }

    #[test]
    fn ceiling_follows_agent_device_and_fleet_unless_set() {
        let cfg = load(&[
            ("FLEET_LIMITER_LIMITER_AGENT_DEVICE_LIMIT", "60"),
            ("FLEET_LIMITER_MAX_SITE_ENDPOINTS", "1000"),
        ])
        .unwrap();
        assert_eq!(agent_ip(&cfg).0, 1000);
        let l = cfg
            .limiters
            .iter()
            .find(|l| &*l.name == "agent-ip")
            .unwrap();
        assert_eq!(l.new_agents.unwrap().max_known, 2000);
        let cfg = load(&[("FLEET_LIMITER_LIMITER_AGENT_DEVICE_WINDOW", "2m")]).unwrap();
        assert_eq!(
            (agent_ip(&cfg).0, agent_ip(&cfg).1),
            (250, Duration::from_secs(120))
        );
        // An explicit window keeps the rate: 250 new ids a minute is 25 per 6 s.
        let cfg = load(&[("FLEET_LIMITER_LIMITER_AGENT_IP_WINDOW", "6s")]).unwrap();
        assert_eq!(
            (agent_ip(&cfg).0, agent_ip(&cfg).1),
            (25, Duration::from_secs(6))
        );
        // An explicit limit is taken as is, whatever the fleet says.
        let cfg = load(&[
            ("FLEET_LIMITER_LIMITER_AGENT_IP_LIMIT", "900"),
            ("FLEET_LIMITER_MAX_SITE_ENDPOINTS", "1000"),
        ])
        .unwrap();
        assert_eq!(agent_ip(&cfg).0, 900);
        // Metering requests again: the whole site at full rate.
        let cfg = load(&[("FLEET_LIMITER_LIMITER_AGENT_IP_METER", "requests")]).unwrap();
        assert_eq!(agent_ip(&cfg).0, 7500);
        let cfg = load(&[("FLEET_LIMITER_LIMITER_AGENT_DEVICE_MODE", "shadow")]).unwrap();
        let l = cfg
            .limiters
            .iter()
            .find(|l| &*l.name == "agent-ip")
            .unwrap();
        assert_eq!(l.mode, crate::policy::Mode::Shadow);
    }

    #[test]
    fn ceiling_errors_name_the_fix() {
        let e = load(&[("FLEET_LIMITER_MAX_SITE_ENDPOINTS", "0")]).unwrap_err();
        assert!(
            e.contains("fleet.max_site_endpoints: 0 is out of range; use the most agents behind one NAT address (it sizes the agent-ip ceiling), 1 to"),
            "{e}"
        );
        let e = load(&[
            ("FLEET_LIMITER_MAX_SITE_ENDPOINTS", "1000000"),
            ("FLEET_LIMITER_MAX_AGENTS", "1000000"),
            ("FLEET_LIMITER_LIMITER_AGENT_DEVICE_LIMIT", "10000"),
            ("FLEET_LIMITER_LIMITER_AGENT_IP_METER", "requests"),
        ])
        .unwrap_err();
        assert!(e.contains("set limiters.agent-ip.limit explicitly"), "{e}");
        let e = load(&[("FLEET_LIMITER_LIMITER_AGENT_IP_KEY", "ip+agent")]).unwrap_err();
        assert!(
            e.contains("limiters.agent-ip.meter") && e.contains("needs key = \"ip\""),
            "{e}"
        );
        let e = load(&[("FLEET_LIMITER_LIMITER_AGENT_IP_KNOWN_FOR", "10s")]).unwrap_err();
        assert!(
            e.contains("limiters.agent-ip.known_for: must be from 1m to 1d"),
            "{e}"
        );
        let e = load(&[("FLEET_LIMITER_LIMITER_AGENT_IP_MAX_KNOWN", "0")]).unwrap_err();
        assert!(
            e.contains("limiters.agent-ip.max_known: 0 is not a number of agents"),
            "{e}"
        );
        let e = load(&[("FLEET_LIMITER_LIMITER_AGENT_DEVICE_KNOWN_FOR", "1h")]).unwrap_err();
        assert!(
            e.contains("applies only to a limiter with meter = \"new-agents\""),
            "{e}"
        );
        let e = load(&[
            ("FLEET_LIMITER_LIMITER_AGENT_IP_GROUP", "agent"),
            ("FLEET_LIMITER_LIMITER_AGENT_IP_ROUTES", "/api/agent/poll"),
        ])
        .unwrap_err();
        assert!(e.contains("must not share group"), "{e}");
    }

    fn facts<'a>(path: &'a str, method: &'a str, agent: &'a str) -> RequestFacts<'a> {
        RequestFacts {
            peer: "198.51.100.7".parse().unwrap(),
            method,
            path: crate::path::CanonicalPath::parse(path, crate::path::PathRules::STRICT).unwrap(),
            forwarded: &[],
            agent_id: Some(agent.as_bytes()),
            authorization: None,
            session_token: None,
            key_headers: crate::decision::KeyHeaders::default(),
        }
    }

    fn decider(cfg: &Config) -> (Decider, ManualClock) {
        let clock = ManualClock::new(1_000_000_000);
        let store = Arc::new(MemoryStore::new(100_000, Arc::new(clock.clone())));
        (Decider::new(cfg, store, Arc::new(NoVerifier)), clock)
    }

    /// A 250-endpoint site behind one NAT, every agent spending its whole budget at once, never
    /// meets the ceiling: each agent is new once, then known.
    #[actix_rt::test]
    async fn a_full_site_fits_and_known_agents_skip_the_ceiling() {
        let cfg = load(&[]).unwrap();
        let (d, _clock) = decider(&cfg);
        for agent in 0..250 {
            let id = format!("agent-{agent}");
            for n in 0..30 {
                let o = d.decide(&facts("/api/agent/heartbeat", "POST", &id)).await;
                assert!(!o.refused(), "agent {agent} refused inside its own budget");
                let names: Vec<&str> = o.results.iter().map(|r| &*r.spec.name).collect();
                let want: &[&str] = if n == 0 {
                    &["agent-device", "agent-ip"]
                } else {
                    &["agent-device"]
                };
                assert_eq!(names, want, "request {n} of agent {agent}");
            }
        }
        // The ceiling has given its 250 new ids: the 251st waits for its refill.
        let o = d
            .decide(&facts("/api/agent/heartbeat", "POST", "agent-250"))
            .await;
        let refusing: Vec<&str> = o
            .results
            .iter()
            .filter(|r| r.refuses())
            .map(|r| &*r.spec.name)
            .collect();
        assert_eq!(refusing, ["agent-ip"]);
    }

    /// The cascade the ceiling must not cause: a client at the site's NAT rotating agent ids
    /// drains the ceiling, and the site's known agents keep heartbeating through it.
    #[actix_rt::test]
    async fn a_rotating_client_drains_the_ceiling_without_refusing_known_agents() {
        let cfg = load(&[]).unwrap();
        let (d, clock) = decider(&cfg);
        for agent in 0..100 {
            let o = d
                .decide(&facts(
                    "/api/agent/heartbeat",
                    "POST",
                    &format!("healthy-{agent}"),
                ))
                .await;
            assert!(!o.refused());
        }
        let mut admitted = 0;
        let mut healthy_refused = 0;
        // Two minutes: 125 fresh ids a second beside 100 agents heartbeating every 60 s.
        for tick in 0..(120 * 125) {
            clock.advance(Duration::from_millis(8));
            let id = format!("rotating-{tick}");
            if !d
                .decide(&facts("/api/agent/poll", "GET", &id))
                .await
                .refused()
            {
                admitted += 1;
            }
            if tick % 75 == 0 {
                let agent = (tick / 75) % 100;
                let o = d
                    .decide(&facts(
                        "/api/agent/heartbeat",
                        "POST",
                        &format!("healthy-{agent}"),
                    ))
                    .await;
                healthy_refused += u32::from(o.refused());
            }
        }
        assert_eq!(healthy_refused, 0);
        // The ceiling's burst of 250, less the 100 healthy agents it admitted first, plus 250 a
        // minute for two minutes; and never more than 500 remembered at the IP.
        assert!(admitted <= 150 + 500 + 1, "{admitted}");
        assert!(admitted >= 500, "{admitted}");
    }

    #[actix_rt::test]
    async fn metering_requests_caps_a_rotating_client_at_the_whole_site_rate() {
        let cfg = load(&[("FLEET_LIMITER_LIMITER_AGENT_IP_METER", "requests")]).unwrap();
        let (d, _clock) = decider(&cfg);
        let mut allowed = 0;
        for i in 0..8000 {
            let id = format!("rotating-{i}");
            if !d
                .decide(&facts("/api/agent/poll", "GET", &id))
                .await
                .refused()
            {
                allowed += 1;
            }
        }
        assert_eq!(allowed, 7500);
    }

    #[actix_rt::test]
    async fn lifecycle_endpoints_are_outside_the_ceiling() {
        let cfg = load(&[]).unwrap();
        let (d, _clock) = decider(&cfg);
        for (m, p, limiter) in [
            ("POST", "/api/agent/enroll", "enrollment"),
            ("GET", "/api/agent/download/linux/amd64", "download"),
            ("POST", "/api/agent/rotate-key", "key-rotation"),
        ] {
            let o = d.decide(&facts(p, m, "a1")).await;
            let names: Vec<&str> = o.results.iter().map(|r| &*r.spec.name).collect();
            assert_eq!(names, [limiter], "{m} {p}");
        }
    }
}
