//! The `agent-ip` ceiling: one IP's total agent traffic, sized from the fleet.
//!
//! `agent-device` keys on `<ip>:<agent-id>`, and the agent id is a header the client chooses, so
//! a client rotating it would get a fresh bucket per request. `agent-ip` meters the same requests
//! on the IP alone, in its own group so that both apply. Its budget is what the largest site
//! the fleet settings describe can legitimately send from one NAT:
//!
//! ```text
//! limit  = fleet.max_site_endpoints x agent-device.limit   (250 x 30 = 7500)
//! window = agent-device.window                            (1m)
//! ```
//!
//! Every field not set explicitly under `[limiters.agent-ip]` follows `agent-device` and the
//! fleet settings, so raising either raises the ceiling with it. An explicit `window` keeps the
//! same rate (the limit scales with the window, rounded up); an explicit `limit` is taken as is.
//! Routes are `agent-device`'s routes, minus its exceptions and minus every route of the other
//! limiters in its group: those limiters meter those requests instead of `agent-device` (by
//! default the lifecycle endpoints: enrollment, download, key rotation, each with an IP budget
//! of its own), so the ceiling meters the requests `agent-device` meters.

use super::{ConfigError, Ctx, FleetConfig, RawLimiter};
use crate::limiter::Quota;
use crate::policy::LimiterSpec;

pub const AGENT_IP: &str = "agent-ip";
pub const AGENT_DEVICE: &str = "agent-device";

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

/// The ceiling's budget for a window of `window_ns`: the fleet's largest site, every agent at
/// its full `agent-device` budget.
pub fn derived_limit(fleet: &FleetConfig, device: &Quota, window_ns: u64) -> Option<u64> {
    let per_device_window = fleet
        .max_site_endpoints
        .checked_mul(u64::from(device.limit()))?;
    let device_ns = device.window.as_nanos();
    if device_ns == 0 {
        return None;
    }
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
    let lifecycle: Vec<_> = limiters
        .iter()
        .filter(|l| l.group == device.group && &*l.name != AGENT_DEVICE && &*l.name != AGENT_IP)
        .flat_map(|l| l.routes.iter().cloned())
        .collect();
    let Some(ceiling) = limiters.iter_mut().find(|l| &*l.name == AGENT_IP) else {
        return Ok(());
    };
    if fleet.max_site_endpoints < 1 {
        return Err(ctx.err(
            "fleet.max_site_endpoints",
            "must be at least 1: it sizes the agent-ip ceiling (default 250)",
        ));
    }
    let window = if explicit.window {
        ceiling.quota.window
    } else {
        device.quota.window
    };
    let algorithm = if explicit.algorithm {
        ceiling.quota.algorithm
    } else {
        device.quota.algorithm
    };
    let limit = if explicit.limit {
        ceiling.quota.limit()
    } else {
        let n = derived_limit(fleet, &device.quota, window.as_nanos() as u64)
            .filter(|n| *n <= u32::MAX as u64)
            .ok_or_else(|| {
                ctx.err(
                    "fleet.max_site_endpoints",
                    format!(
                        "{} x agent-device's {} per window is too large a budget for agent-ip; set limiters.agent-ip.limit explicitly",
                        fleet.max_site_endpoints, device.quota.limit()
                    ),
                )
            })?;
        n as u32
    };
    let Some(limit) = std::num::NonZeroU32::new(limit) else {
        return Err(ctx.err(
            "fleet.max_site_endpoints",
            "is 0, which leaves agent-ip no budget; use at least 1",
        ));
    };
    ceiling.quota = Quota::new(limit, window, algorithm);
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
        (l.quota.limit(), l.quota.window, s(&l.routes), s(&l.except))
    }

    #[test]
    fn default_ceiling_is_max_site_endpoints_times_the_agent_budget() {
        let cfg = load(&[]).unwrap();
        let (limit, window, routes, except) = agent_ip(&cfg);
        assert_eq!((limit, window), (250 * 30, Duration::from_secs(60)));
        assert_eq!(routes, ["/api/agent/**"]);
        assert_eq!(
            except,
            [
                "POST /api/agent/enroll",
                "GET /api/agent/download/**",
                "POST /api/agent/rotate-key"
            ]
        );
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
        assert_eq!(agent_ip(&cfg).0, 60_000);
        let cfg = load(&[("FLEET_LIMITER_LIMITER_AGENT_DEVICE_WINDOW", "2m")]).unwrap();
        assert_eq!(
            (agent_ip(&cfg).0, agent_ip(&cfg).1),
            (7500, Duration::from_secs(120))
        );
        // An explicit window keeps the rate: 7500 per minute is 125 per second.
        let cfg = load(&[("FLEET_LIMITER_LIMITER_AGENT_IP_WINDOW", "1s")]).unwrap();
        assert_eq!(
            (agent_ip(&cfg).0, agent_ip(&cfg).1),
            (125, Duration::from_secs(1))
        );
        // An explicit limit is taken as is, whatever the fleet says.
        let cfg = load(&[
            ("FLEET_LIMITER_LIMITER_AGENT_IP_LIMIT", "900"),
            ("FLEET_LIMITER_MAX_SITE_ENDPOINTS", "1000"),
        ])
        .unwrap();
        assert_eq!(agent_ip(&cfg).0, 900);
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
            e.contains("fleet.max_site_endpoints: must be at least 1"),
            "{e}"
        );
        let e = load(&[
            ("FLEET_LIMITER_MAX_SITE_ENDPOINTS", "4000000000"),
            ("FLEET_LIMITER_LIMITER_AGENT_DEVICE_LIMIT", "100"),
        ])
        .unwrap_err();
        assert!(e.contains("set limiters.agent-ip.limit explicitly"), "{e}");
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
    /// meets the ceiling; one more agent id from that IP does.
    #[actix_rt::test]
    async fn a_full_site_fits_and_a_rotating_client_is_capped() {
        let cfg = load(&[]).unwrap();
        let (d, clock) = decider(&cfg);
        for agent in 0..250 {
            let id = format!("agent-{agent}");
            for _ in 0..30 {
                let o = d.decide(&facts("/api/agent/heartbeat", "POST", &id)).await;
                assert!(!o.refused(), "agent {agent} refused inside its own budget");
                let names: Vec<&str> = o.results.iter().map(|r| &*r.spec.name).collect();
                assert_eq!(names, ["agent-device", "agent-ip"]);
            }
        }
        let o = d
            .decide(&facts("/api/agent/heartbeat", "POST", "agent-250"))
            .await;
        assert!(o.refused());
        let refusing: Vec<&str> = o
            .results
            .iter()
            .filter(|r| r.refuses())
            .map(|r| &*r.spec.name)
            .collect();
        assert_eq!(refusing, ["agent-ip"]);
        // The refusal consumed nothing from agent-250's own bucket: once the ceiling has
        // refilled one request (8 ms at 7500/min), agent-250 still has 29 left after its first.
        clock.advance(Duration::from_millis(8));
        let o = d
            .decide(&facts("/api/agent/heartbeat", "POST", "agent-250"))
            .await;
        assert!(!o.refused());
        let dev = o
            .results
            .iter()
            .find(|r| &*r.spec.name == "agent-device")
            .unwrap();
        assert_eq!(dev.verdict.remaining, 29);
    }

    #[actix_rt::test]
    async fn a_rotating_agent_id_gets_no_more_than_the_ceiling() {
        let cfg = load(&[]).unwrap();
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
