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
//! limiters in its group (the lifecycle endpoints: enrollment, download, key rotation), which
//! have IP budgets of their own.

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
    let per_device_window = fleet.max_site_endpoints.checked_mul(device.limit as u64)?;
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
        ceiling.quota.limit
    } else {
        let n = derived_limit(fleet, &device.quota, window.as_nanos() as u64)
            .filter(|n| *n <= u32::MAX as u64)
            .ok_or_else(|| {
                ctx.err(
                    "fleet.max_site_endpoints",
                    format!(
                        "{} x agent-device's {} per window is too large a budget for agent-ip; set limiters.agent-ip.limit explicitly",
                        fleet.max_site_endpoints, device.quota.limit
                    ),
                )
            })?;
        n as u32
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
