//! The effective route map: which limiters meter each route pattern, and each request of the
//! declared fleet (`fleet-limiter routes`, and `routes` in `check --format json`); and the
//! warnings about routes that reach nothing (a role left with no route, a pattern that can
//! match no request). Every answer is the real route picker's, asked of sample requests
//! (`Policy::samples`): precedence, exceptions, credential kinds and the forwarded methods
//! count exactly as they do for requests.

use super::traffic;
use crate::config::roles::{role_of, ROLES};
use crate::config::Config;
use crate::policy::{CredentialMatch, LimiterSpec, Mode, Policy, RoutePattern};
use serde::Serialize;

/// The requests each workload sends, as `METHOD /path`: the built-in paths
/// ([`traffic`]), or where `[roles]` maps a role, a request on the routes of that role's
/// limiter that the limiter meters ([`crate::config::roles::role_request`]).
pub(crate) struct Routes {
    pub(crate) heartbeat: (String, String),
    pub(crate) poll: (String, String),
    pub(crate) download: (String, String),
    pub(crate) enroll: (String, String),
    pub(crate) dashboard: (String, String),
    pub(crate) device_poll: (String, String),
}

impl Routes {
    pub(crate) fn of(cfg: &Config, policy: &Policy) -> Self {
        let at =
            |role, default| crate::config::roles::role_request(&cfg.roles, policy, role, default);
        Self {
            heartbeat: at("agent", traffic::HEARTBEAT),
            poll: at("agent", traffic::POLL),
            download: at("download", traffic::DOWNLOAD),
            enroll: at("enrollment", traffic::ENROLL),
            dashboard: at("dashboard", traffic::DASHBOARD),
            device_poll: at("device-poll", traffic::DEVICE_POLL),
        }
    }

    /// The requests as the name the fleet gives them, `METHOD`, `/path`.
    pub(crate) fn named(&self) -> [(&'static str, &(String, String)); 6] {
        [
            ("heartbeat", &self.heartbeat),
            ("task poll", &self.poll),
            ("download", &self.download),
            ("enrollment", &self.enroll),
            ("dashboard", &self.dashboard),
            ("device-login poll", &self.device_poll),
        ]
    }
}

/// One limiter that meters a route: its name, key and what narrows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Metered {
    pub(crate) limiter: String,
    pub(crate) key: String,
    /// The built-in role it serves; `None` for a limiter the operator defined.
    pub(crate) role: Option<&'static str>,
    /// `api-key` or `cli-token` when it meters only requests carrying that credential.
    pub(crate) credential: Option<&'static str>,
    /// It meters only agent ids it does not know (`meter = "new-agents"`).
    pub(crate) new_agents: bool,
    /// `shadow` when it refuses nothing.
    pub(crate) shadow: bool,
}

/// One route pattern of an enabled limiter, and every limiter that meters the requests it
/// matches.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct RouteLine {
    pub(crate) route: String,
    pub(crate) method: Option<String>,
    /// The roles whose limiters list it.
    pub(crate) roles: Vec<&'static str>,
    pub(crate) limiters: Vec<Metered>,
}

/// One request of the declared fleet, as `check` models it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct RequestLine {
    pub(crate) request: &'static str,
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) limiters: Vec<Metered>,
}

/// The whole map.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(crate) struct RouteMap {
    pub(crate) routes: Vec<RouteLine>,
    pub(crate) requests: Vec<RequestLine>,
}

fn metered(l: &LimiterSpec) -> Metered {
    Metered {
        limiter: l.name.to_string(),
        key: l.key.to_string(),
        role: role_of(&l.name).map(|r| r.name),
        credential: match l.credential {
            CredentialMatch::Any => None,
            c => Some(c.as_str()),
        },
        new_agents: l.new_agents.is_some(),
        shadow: l.mode == Mode::Shadow,
    }
}

/// The methods the gateway forwards: a route naming another one matches no request.
fn forwarded(cfg: &Config) -> Vec<&str> {
    cfg.methods.allowed().collect()
}

/// The limiters (indices) that meter some request `route` matches.
fn metering_route(policy: &Policy, route: &RoutePattern, methods: &[&str]) -> Vec<usize> {
    let mut out: Vec<usize> = Vec::new();
    for s in policy.samples(route, methods) {
        for (i, _) in policy.metering(&s) {
            if !out.contains(&i) {
                out.push(i);
            }
        }
    }
    out.sort_unstable();
    out
}

/// The effective map of a configuration.
pub(crate) fn route_map(cfg: &Config) -> RouteMap {
    let policy = Policy::new(cfg.limiters.clone());
    let methods = forwarded(cfg);
    let mut routes: Vec<(RoutePattern, Vec<&'static str>)> = Vec::new();
    for l in cfg.limiters.iter().filter(|l| l.mode != Mode::Off) {
        let role = role_of(&l.name).map(|r| r.name);
        for r in &l.routes {
            match routes.iter_mut().find(|(q, _)| q.covers(r) && r.covers(q)) {
                Some((_, roles)) => roles.extend(role.filter(|n| !roles.contains(n))),
                None => routes.push((r.clone(), role.into_iter().collect())),
            }
        }
    }
    let lines = routes
        .into_iter()
        .map(|(r, roles)| RouteLine {
            route: r.to_string(),
            method: r.method().map(str::to_owned),
            roles,
            limiters: metering_route(&policy, &r, &methods)
                .into_iter()
                .map(|i| metered(&policy.limiters()[i]))
                .collect(),
        })
        .collect();
    let at = Routes::of(cfg, &policy);
    let requests = at
        .named()
        .into_iter()
        .map(|(name, (method, path))| {
            let sample = crate::policy::Sample {
                method: crate::policy::static_method(method),
                path: path.clone(),
            };
            RequestLine {
                request: name,
                method: method.clone(),
                path: path.clone(),
                limiters: policy
                    .metering(&sample)
                    .into_iter()
                    .filter(|(_, creds)| creds.contains(&crate::identity::Credential::None))
                    .map(|(i, _)| metered(&policy.limiters()[i]))
                    .collect(),
            }
        })
        .collect();
    RouteMap {
        routes: lines,
        requests,
    }
}

/// Where a limiter's routes were set: `roles.<role>` when `[roles]` gave them, else the
/// limiter's own field.
fn routes_field(cfg: &Config, l: &LimiterSpec) -> String {
    if let Some(role) = role_of(&l.name) {
        if let Some(given) = cfg.roles.get(role.name) {
            if given
                .iter()
                .map(|r| r.to_string())
                .eq(l.routes.iter().map(|r| r.to_string()))
            {
                return format!("roles.{}", role.name);
            }
        }
    }
    format!("limiters.{}.routes", l.name)
}

/// `check`'s warnings about routes: roles whose requests no limiter of theirs can meter, and
/// route patterns that can match no request. Each names where it was set, the field, and the
/// fix; none makes the configuration unusable.
pub(crate) fn route_warnings(cfg: &Config) -> Vec<String> {
    let policy = Policy::new(cfg.limiters.clone());
    let methods = forwarded(cfg);
    let mut out: Vec<String> = Vec::new();
    let mut push = |field: String, msg: String| {
        let line = format!("{}: {field}: {msg}", cfg.origin(&field));
        if !out.contains(&line) {
            out.push(line);
        }
    };
    for role in ROLES {
        let of_role: Vec<(usize, &std::sync::Arc<LimiterSpec>)> = policy
            .limiters()
            .iter()
            .enumerate()
            .filter(|(_, l)| role.limiters.contains(&&*l.name))
            .collect();
        if of_role.is_empty() {
            continue;
        }
        if of_role.iter().all(|(_, l)| l.mode == Mode::Off) {
            let (_, l) = of_role[0];
            push(
                format!("limiters.{}.mode", l.name),
                format!(
                    "is \"off\", so role `{}` ({}) is left with no route: nothing meters those requests; set mode = \"enforce\" (or \"shadow\" to watch first), or leave it off if the API has no such requests",
                    role.name, role.what
                ),
            );
            continue;
        }
        let reached = of_role.iter().any(|(i, l)| {
            l.mode != Mode::Off
                && l.routes
                    .iter()
                    .any(|r| policy.first_reached(*i, r, &methods).is_some())
        });
        if !reached {
            let (_, l) = of_role[0];
            push(
                routes_field(cfg, l),
                format!(
                    "role `{}` ({}) is left with no route: no request its routes match reaches `{}` (each is excepted, taken by a more specific route of another limiter in group `{}`, or names a method the gateway does not forward); list the routes those requests use under [roles] {} (built in: {})",
                    role.name, role.what, l.name, l.group, role.name, builtin_routes(&l.name)
                ),
            );
        }
    }
    for (i, l) in policy.limiters().iter().enumerate() {
        if l.mode == Mode::Off {
            continue;
        }
        for r in &l.routes {
            if let Some(msg) = dead_route(&policy, i, l, r, &methods) {
                push(routes_field(cfg, l), msg);
            }
        }
    }
    out
}

/// Why route `r` of limiter `i` can match no request it meters, or a shape of its path that
/// reads as a slip; `None` when it is fine.
fn dead_route(
    policy: &Policy,
    i: usize,
    l: &LimiterSpec,
    r: &RoutePattern,
    methods: &[&str],
) -> Option<String> {
    if let Some(why) = shape_slip(r) {
        return Some(why);
    }
    if let Some(m) = r.method() {
        if !methods.iter().any(|a| a.eq_ignore_ascii_case(m)) {
            return Some(format!(
                "route `{r}` can match no request: the gateway answers {m} with 501 before any limiter (methods.allowed is {}); name a forwarded method, or drop the method to match them all",
                methods.join(", ")
            ));
        }
    }
    if policy.first_reached(i, r, methods).is_some() {
        return None;
    }
    let why = match l.except.iter().find(|e| e.covers(r)) {
        Some(e) => format!("its own exception `{e}` covers it"),
        None => format!(
            "every request it matches is excepted or taken by a more specific route of another limiter in group `{}`",
            l.group
        ),
    };
    Some(format!(
        "route `{r}` of limiter `{}` can match no request it meters: {why}; remove the route, or narrow the exception",
        l.name
    ))
}

/// A route's path written in a shape requests never have: an empty segment (`//`), a dot
/// segment (`.`, `..`), or a query or fragment (routes match the path alone). The pattern
/// is read in canonical form, so it matches something other than what it says.
fn shape_slip(r: &RoutePattern) -> Option<String> {
    let path = r.path_str();
    let body = path.strip_suffix('/').unwrap_or(path);
    let what = if body.contains("//") {
        "an empty segment (`//`), which the canonical form of a request's path never has"
    } else if body.split('/').any(|s| s == "." || s == "..") {
        "a dot segment (`.` or `..`), which the canonical form of a request's path never has"
    } else if path.contains('?') || path.contains('#') {
        "a `?` or `#`: routes match the path alone, never the query or the fragment, so this is a literal segment no client sends"
    } else {
        return None;
    };
    Some(format!(
        "route `{r}` is written with {what}; write the path as requests reach it (e.g. \"/v1/agents/**\")"
    ))
}

/// A built-in limiter's own routes, as a TOML list.
fn builtin_routes(limiter: &str) -> String {
    let routes: Vec<String> = crate::config::defaults::LIMITERS
        .iter()
        .find(|b| b.name == limiter)
        .map(|b| b.routes.iter().map(|r| format!("\"{r}\"")).collect())
        .unwrap_or_default();
    format!("[{}]", routes.join(", "))
}
