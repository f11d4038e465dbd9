//! `[roles]`: the operator's own routes mapped onto the roles of the built-in calibration.
//!
//! Each built-in limiter serves one role (the agents' heartbeat and poll, enrolment, the
//! dashboard, ...). A role's list replaces the routes of every built-in limiter of that role,
//! and the exceptions of the other built-ins that stand for that role's routes (the dashboard
//! limiter leaves the agents' routes to the agent limiters) follow it. A limiter's own
//! `routes` (or `except`) under `[limiters.<name>]` still win over its role's. The `agent-ip`
//! ceiling follows `agent-device` (see `ceiling.rs`), so the `agent` role moves both.

use super::{ConfigError, Ctx, RawLimiter};
use crate::policy::RoutePattern;
use std::collections::BTreeMap;

/// One role of the built-in calibration.
pub(crate) struct Role {
    pub(crate) name: &'static str,
    /// The built-in limiters whose routes the role's list replaces.
    pub(crate) limiters: &'static [&'static str],
    /// What the role's requests are, for errors and the docs.
    pub(crate) what: &'static str,
}

/// The roles, in the order of the built-in limiters. Limiters with different budgets on
/// different endpoints are different roles: a role's limiters all take its one list.
pub(crate) const ROLES: &[Role] = &[
    Role {
        name: "agent",
        limiters: &["agent-device"],
        what: "the agents' heartbeats, task polls and results (agent-device, and the agent-ip ceiling that follows it)",
    },
    Role {
        name: "enrollment",
        limiters: &["enrollment"],
        what: "an installer enrolling a new endpoint",
    },
    Role {
        name: "download",
        limiters: &["download"],
        what: "an installer downloading the agent",
    },
    Role {
        name: "key-rotation",
        limiters: &["key-rotation"],
        what: "an agent rotating its key",
    },
    Role {
        name: "dashboard",
        limiters: &["ui"],
        what: "the dashboard's API calls",
    },
    Role {
        name: "cli-token",
        limiters: &["cli-bearer"],
        what: "API calls carrying a CLI token",
    },
    Role {
        name: "api-key",
        limiters: &["api-key"],
        what: "API calls carrying an API key",
    },
    Role {
        name: "device-code",
        limiters: &["cli-device-code"],
        what: "a CLI starting the device login (RFC 8628's device authorization request)",
    },
    Role {
        name: "device-poll",
        limiters: &["cli-device-poll"],
        what: "a CLI polling for its token during the device login",
    },
    Role {
        name: "cli-refresh",
        limiters: &["cli-refresh"],
        what: "a CLI refreshing its token",
    },
];

/// The roles every agent-facing route belongs to: the exception `/api/agent/**` stands for them.
const AGENT_FAMILY: &[&str] = &["agent", "enrollment", "download", "key-rotation"];
/// The CLI login endpoints: the exception `/api/cli/auth/**` stands for them.
const CLI_AUTH: &[&str] = &["device-code", "device-poll", "cli-refresh"];

/// Which roles each exception of a built-in limiter stands for (an empty list: a route no role
/// names, kept as it is).
const EXCEPT_ROLES: &[(&str, &str, &[&str])] = &[
    ("ui", "/api/agent/**", AGENT_FAMILY),
    ("ui", "/api/cron/**", &[]),
    ("ui", "/api/cli/auth/**", CLI_AUTH),
    ("cli-bearer", "/api/agent/**", AGENT_FAMILY),
    ("cli-bearer", "/api/cron/**", &[]),
    ("api-key", "/api/agent/**", AGENT_FAMILY),
    ("api-key", "/api/cron/**", &[]),
];

/// Most routes one role lists, and the longest route.
pub(crate) const MAX_ROLE_ROUTES: usize = 64;
pub(crate) const MAX_ROUTE_LEN: usize = 1024;

/// The role a built-in limiter serves (`agent-ip` follows `agent-device`); `None` for a
/// limiter the operator defined.
pub(crate) fn role_of(limiter: &str) -> Option<&'static Role> {
    let limiter = if limiter == super::ceiling::AGENT_IP {
        super::ceiling::AGENT_DEVICE
    } else {
        limiter
    };
    ROLES.iter().find(|r| r.limiters.contains(&limiter))
}

/// The roles `[roles]` maps, each with its routes as written (validated).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct RoleMap {
    pub(crate) mapped: BTreeMap<&'static str, Vec<RoutePattern>>,
}

impl RoleMap {
    /// The routes `[roles]` gives `role`, if it maps it.
    pub(crate) fn get(&self, role: &str) -> Option<&[RoutePattern]> {
        self.mapped.get(role).map(Vec::as_slice)
    }
}

/// The closest role name to `given`, when it is close enough to be a slip.
fn nearest(given: &str) -> Option<&'static str> {
    let lower = given.trim().to_ascii_lowercase().replace('_', "-");
    if let Some(r) = role_of(&lower) {
        return Some(r.name);
    }
    let (d, best) = ROLES
        .iter()
        .map(|r| (super::layers::edit_distance(&lower, r.name), r.name))
        .min_by_key(|(d, _)| *d)?;
    (d <= 2 || (d <= 3 && d * 3 <= lower.len())).then_some(best)
}

/// `[roles]` read and validated: known role names, at least one route each, at most
/// [`MAX_ROLE_ROUTES`], each parsed as a limiter's route is, none listed twice.
pub(super) fn build_roles(
    raw: BTreeMap<String, Vec<String>>,
    ctx: &Ctx,
) -> Result<RoleMap, ConfigError> {
    let mut mapped = BTreeMap::new();
    let names: Vec<&str> = ROLES.iter().map(|r| r.name).collect();
    for (name, list) in raw {
        let Some(role) = ROLES.iter().find(|r| r.name == name) else {
            let hint = match nearest(&name) {
                Some(n) => format!(" (did you mean `{n}`?)"),
                None => String::new(),
            };
            return Err(ctx.err(
                &format!("roles.{name}"),
                format!(
                    "`{name}` is not a role{hint}; the roles are {} (docs/calibration.md lists the limiters of each)",
                    names.join(", ")
                ),
            ));
        };
        let at = format!("roles.{name}");
        mapped.insert(role.name, role_routes(role, &list, &at, ctx)?);
    }
    Ok(RoleMap { mapped })
}

/// One role's list: its routes parsed, each once.
fn role_routes(
    role: &Role,
    list: &[String],
    at: &str,
    ctx: &Ctx,
) -> Result<Vec<RoutePattern>, ConfigError> {
    if list.is_empty() {
        return Err(ctx.err(
            at,
            format!(
                "is empty; list the routes of {} (e.g. [\"/v1/agents/**\"]), or leave the role out to keep the built-in routes; to meter none of them, set mode = \"off\" on {}",
                role.what,
                role.limiters
                    .iter()
                    .map(|l| format!("[limiters.{l}]"))
                    .collect::<Vec<_>>()
                    .join(" and ")
            ),
        ));
    }
    if list.len() > MAX_ROLE_ROUTES {
        return Err(ctx.err(
            at,
            format!(
                "lists {} routes; list at most {MAX_ROLE_ROUTES} (a `**` pattern covers a whole subtree)",
                list.len()
            ),
        ));
    }
    let mut out: Vec<RoutePattern> = Vec::with_capacity(list.len());
    for s in list {
        if s.len() > MAX_ROUTE_LEN {
            return Err(ctx.err(
                at,
                format!("a route of {} bytes is longer than {MAX_ROUTE_LEN}; no request path the gateway forwards is that long", s.len()),
            ));
        }
        let p = s.parse::<RoutePattern>().map_err(|e| ctx.err(at, e))?;
        if let Some(same) = out.iter().find(|q| q.covers(&p) && p.covers(q)) {
            return Err(ctx.err(
                at,
                format!("lists `{p}` twice (as `{same}` too: routes match in canonical form and ignore case); remove one"),
            ));
        }
        out.push(p);
    }
    Ok(out)
}

/// Two roles whose limiters share a group (the agent-facing ones) must not list routes of
/// equal specificity that one request could match: neither limiter would take precedence.
pub(super) fn check_role_precedence(roles: &RoleMap, ctx: &Ctx) -> Result<(), ConfigError> {
    let group_of = |role: &str| {
        ROLES
            .iter()
            .find(|r| r.name == role)
            .and_then(|r| r.limiters.first())
            .and_then(|l| super::defaults::LIMITERS.iter().find(|b| b.name == *l))
            .and_then(|b| b.group)
    };
    let listed: Vec<(&str, &Vec<RoutePattern>)> =
        roles.mapped.iter().map(|(n, v)| (*n, v)).collect();
    for (i, (a, ra)) in listed.iter().enumerate() {
        for (b, rb) in &listed[i + 1..] {
            if group_of(a).is_none() || group_of(a) != group_of(b) {
                continue;
            }
            for x in ra.iter() {
                for y in rb.iter() {
                    if x.overlaps(y) && x.specificity() == y.specificity() {
                        return Err(ctx.err(
                            &format!("roles.{b}"),
                            format!(
                                "route `{y}` overlaps `{x}` of role `{a}` with the same specificity, so neither role's limiter takes precedence on the requests both match; make one more specific (e.g. name the method: \"POST {}\")",
                                y.path_str()
                            ),
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

/// The limiter tables with the roles applied: each mapped role's list becomes the routes of its
/// limiters that set none of their own, and the built-ins' exceptions that stand for a mapped
/// role become that role's routes (unless the limiter sets its own `except`).
pub(super) fn apply(
    mut given: BTreeMap<String, RawLimiter>,
    roles: &RoleMap,
) -> BTreeMap<String, RawLimiter> {
    if roles.mapped.is_empty() {
        return given;
    }
    let text = |ps: &[RoutePattern]| ps.iter().map(|p| p.to_string()).collect::<Vec<_>>();
    for role in ROLES {
        let Some(routes) = roles.get(role.name) else {
            continue;
        };
        for l in role.limiters {
            let t = given.entry((*l).to_owned()).or_default();
            if t.routes.is_none() {
                t.routes = Some(text(routes));
            }
        }
    }
    for b in super::defaults::LIMITERS {
        let entries: Vec<&(&str, &str, &[&str])> = EXCEPT_ROLES
            .iter()
            .filter(|(l, _, _)| *l == b.name)
            .collect();
        if entries.is_empty() || given.get(b.name).is_some_and(|t| t.except.is_some()) {
            continue;
        }
        let mut except: Vec<String> = Vec::new();
        for (_, pattern, stands_for) in &entries {
            let all_mapped =
                !stands_for.is_empty() && stands_for.iter().all(|r| roles.get(r).is_some());
            if !all_mapped {
                except.push((*pattern).to_owned());
            }
            for r in stands_for.iter() {
                for p in roles.get(r).map(text).unwrap_or_default() {
                    if !except.contains(&p) {
                        except.push(p);
                    }
                }
            }
        }
        let builtin: Vec<String> = b.except.iter().map(|s| (*s).to_owned()).collect();
        if except != builtin {
            given.entry(b.name.to_owned()).or_default().except = Some(except);
        }
    }
    given
}

/// The request of `role` the calibration check models: the built-in `default` when `[roles]`
/// does not map the role; otherwise the first request on the routes of the role's limiter that
/// the limiter meters (`default`'s method first), or `default` when it meters none (`check`
/// warns about that role).
pub(crate) fn role_request(
    roles: &RoleMap,
    policy: &crate::policy::Policy,
    role: &str,
    default: (&str, &str),
) -> (String, String) {
    let fallback = (default.0.to_owned(), default.1.to_owned());
    if roles.get(role).is_none() {
        return fallback;
    }
    let Some(name) = ROLES
        .iter()
        .find(|r| r.name == role)
        .and_then(|r| r.limiters.first())
    else {
        return fallback;
    };
    let Some((i, l)) = policy
        .limiters()
        .iter()
        .enumerate()
        .find(|(_, l)| &*l.name == *name)
    else {
        return fallback;
    };
    l.routes
        .iter()
        .find_map(|r| policy.first_reached(i, r, &[default.0]))
        .map(|s| (s.method.to_owned(), s.path))
        .unwrap_or(fallback)
}

/// The agents' heartbeat as `check` and the shaping check model it: `POST /api/agent/heartbeat`,
/// or a request of the `agent` role's routes when `[roles]` maps them.
pub(crate) fn heartbeat(
    roles: &RoleMap,
    limiters: &[crate::policy::LimiterSpec],
) -> (String, String) {
    if roles.get("agent").is_none() {
        let (m, p) = super::check::traffic::HEARTBEAT;
        return (m.to_owned(), p.to_owned());
    }
    let policy = crate::policy::Policy::new(limiters.to_vec());
    role_request(roles, &policy, "agent", super::check::traffic::HEARTBEAT)
}

#[cfg(test)]
mod tests;
