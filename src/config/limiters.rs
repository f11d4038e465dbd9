//! The limiter tables read into [`LimiterSpec`]s: built-ins overlaid with what the operator
//! set, names and routes checked, route precedence proved unambiguous within a group.

use super::*;
use std::num::NonZeroU32;

mod checks;
mod key;
use checks::check_precedence;
pub(crate) use checks::unguarded_client_chosen_key;
pub(super) use checks::{check_client_chosen_keys, check_lockouts};
pub(crate) use key::parse_key;
use key::{MAX_KEY_HEADER_NAME, RESERVED_KEY_HEADERS};

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimiter {
    pub(super) limit: Option<i64>,
    pub(super) window: Option<DurationValue>,
    /// The IANA time zone a calendar window's boundaries are in (default UTC).
    pub(super) time_zone: Option<String>,
    pub(super) key: Option<String>,
    pub(super) routes: Option<Vec<String>>,
    pub(super) except: Option<Vec<String>>,
    pub(super) group: Option<String>,
    pub(super) credential: Option<CredentialMatch>,
    pub(super) algorithm: Option<Algorithm>,
    pub(super) mode: Option<Mode>,
    pub(super) on_store_error: Option<OnStoreError>,
    pub(super) meter: Option<Meter>,
    pub(super) known_for: Option<DurationValue>,
    pub(super) max_known: Option<i64>,
    pub(super) count: Option<Count>,
    pub(super) failed_statuses: Option<Vec<StatusItem>>,
    pub(super) cost: Option<i64>,
    pub(super) cost_header: Option<String>,
    pub(super) cost_max: Option<i64>,
    pub(super) lockout: Option<DurationValue>,
    pub(super) disclose: Option<bool>,
    pub(super) plan_claim: Option<String>,
    pub(super) plans: Option<BTreeMap<String, RawPlan>>,
}

/// One plan's budget (`[limiters.<name>.plans.<plan>]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPlan {
    pub(super) limit: Option<i64>,
    pub(super) window: Option<DurationValue>,
}

/// One entry of `failed_statuses`: a code (`503`) or a range as text (`"400-499"`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(super) enum StatusItem {
    Code(i64),
    Text(String),
}

pub(super) fn builtin_raw(b: &defaults::BuiltIn) -> RawLimiter {
    let owned = |xs: &[&str]| xs.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    RawLimiter {
        limit: Some(b.limit as i64),
        window: Some(DurationValue::Text(b.window.to_owned())),
        time_zone: None,
        key: Some(b.key.as_str().to_owned()),
        routes: Some(owned(b.routes)),
        except: Some(owned(b.except)),
        group: b.group.map(str::to_owned),
        credential: Some(b.credential),
        algorithm: None,
        mode: None,
        on_store_error: None,
        meter: Some(b.meter),
        known_for: None,
        max_known: None,
        count: None,
        failed_statuses: None,
        cost: None,
        cost_header: None,
        cost_max: None,
        lockout: None,
        disclose: None,
        plan_claim: None,
        plans: None,
    }
}

pub(super) fn overlay(base: RawLimiter, over: RawLimiter) -> RawLimiter {
    RawLimiter {
        limit: over.limit.or(base.limit),
        window: over.window.or(base.window),
        time_zone: over.time_zone.or(base.time_zone),
        key: over.key.or(base.key),
        routes: over.routes.or(base.routes),
        except: over.except.or(base.except),
        group: over.group.or(base.group),
        credential: over.credential.or(base.credential),
        algorithm: over.algorithm.or(base.algorithm),
        mode: over.mode.or(base.mode),
        on_store_error: over.on_store_error.or(base.on_store_error),
        meter: over.meter.or(base.meter),
        known_for: over.known_for.or(base.known_for),
        max_known: over.max_known.or(base.max_known),
        count: over.count.or(base.count),
        failed_statuses: over.failed_statuses.or(base.failed_statuses),
        cost: over.cost.or(base.cost),
        cost_header: over.cost_header.or(base.cost_header),
        cost_max: over.cost_max.or(base.cost_max),
        lockout: over.lockout.or(base.lockout),
        disclose: over.disclose.or(base.disclose),
        plan_claim: over.plan_claim.or(base.plan_claim),
        plans: over.plans.or(base.plans),
    }
}

pub(super) fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 64
        && n.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// How long a `new-agents` limiter remembers an admitted agent id by default: several times
/// the longest gap between a healthy agent's requests (a heartbeat a minute), well past the
/// 180 s after which the backend marks an agent offline.
pub(super) const KNOWN_FOR: &str = "15m";

/// The shortest and the longest `lockout`: a lock shorter than a second says nothing a
/// `Retry-After` can, and one longer than a day is an account ban, not a rate limit.
const MIN_LOCKOUT: Duration = Duration::from_secs(1);
const MAX_LOCKOUT: Duration = Duration::from_secs(86_400);

/// Every limiter: the built-ins overlaid with what the operator set, then the tables that
/// define new ones, each built in turn; route precedence checked across them.
pub(super) fn build_limiters(
    given: BTreeMap<String, RawLimiter>,
    calibration: super::base::Calibration,
    fleet: &FleetConfig,
    ctx: &Ctx,
) -> Result<Vec<LimiterSpec>, ConfigError> {
    let builtin_names: Vec<&str> = defaults::LIMITERS.iter().map(|b| b.name).collect();
    let merged = merge_with_builtins(given, calibration.builtins());
    let mut out = Vec::with_capacity(merged.len());
    for (name, r, builtin) in merged {
        let table = Table {
            name: &name,
            builtin,
            builtin_names: &builtin_names,
            calibration,
        };
        out.push(build_limiter(&table, r, fleet, ctx)?);
    }
    check_precedence(&out, ctx)?;
    Ok(out)
}

/// The built-ins in their order, each overlaid with its table if given, then the tables that
/// define new limiters (by name); `true` marks a built-in.
fn merge_with_builtins(
    mut given: BTreeMap<String, RawLimiter>,
    builtins: &[defaults::BuiltIn],
) -> Vec<(String, RawLimiter, bool)> {
    let mut merged: Vec<(String, RawLimiter, bool)> = builtins
        .iter()
        .map(|b| {
            let base = builtin_raw(b);
            let r = match given.remove(b.name) {
                Some(over) => overlay(base, over),
                None => base,
            };
            (b.name.to_owned(), r, true)
        })
        .collect();
    merged.extend(given.into_iter().map(|(n, r)| (n, r, false)));
    merged
}

/// Which limiter table is being read: its name, whether it is a built-in, and the built-ins'
/// names (for the error that a new limiter lacks a field).
struct Table<'a> {
    name: &'a str,
    builtin: bool,
    builtin_names: &'a [&'a str],
    calibration: super::base::Calibration,
}

/// One `[limiters.<name>]` table read into a [`LimiterSpec`], field by field in the order
/// their errors win.
fn build_limiter(
    t: &Table<'_>,
    r: RawLimiter,
    fleet: &FleetConfig,
    ctx: &Ctx,
) -> Result<LimiterSpec, ConfigError> {
    let name = t.name;
    let at = |f: &str| format!("limiters.{name}.{f}");
    check_name_and_fields(t, &r, ctx)?;
    let raw_limit = r.limit.unwrap_or(0);
    let Some(limit) = u32::try_from(raw_limit).ok().and_then(NonZeroU32::new) else {
        return Err(ctx.err(
            &at("limit"),
            format!("{raw_limit} is not a budget; use a whole number of requests, at least 1"),
        ));
    };
    let cost = build_cost(&r, limit, &at).map_err(|(f, e)| ctx.err(&at(f), e))?;
    let calendar = calendar_window(ctx, &at, r.window.as_ref(), r.time_zone.as_deref())?;
    if calendar.is_some() && r.algorithm == Some(Algorithm::Gcra) {
        return Err(ctx.err(
            &at("algorithm"),
            "is \"gcra\", which refills continuously, but the window is a calendar period, which comes back whole at its boundary; remove algorithm (a calendar window counts as a fixed window) or give the window as a duration (e.g. \"1d\")",
        ));
    }
    let window = match calendar {
        Some(c) => c.unit.longest(),
        None => duration(ctx, &at("window"), r.window.clone(), "1m")?,
    };
    let lockout = build_lockout(r.lockout.as_ref(), ctx, &at)?;
    if calendar.is_none() && window > Duration::from_secs(7 * 86_400) {
        return Err(ctx.err(
            &at("window"),
            "is longer than 7 days; use a window from 1s to 7d, or a calendar period: \"day\", \"week\" or \"month\"",
        ));
    }
    let routes = parse_routes("routes", r.routes.as_deref(), ctx, &at)?;
    if routes.is_empty() {
        return Err(ctx.err(
            &at("routes"),
            "is empty; name at least one route, e.g. [\"/api/agent/**\"]",
        ));
    }
    let except = parse_routes("except", r.except.as_deref(), ctx, &at)?;
    let group = r.group.as_deref().unwrap_or(name);
    let key = parse_key(r.key.as_deref().unwrap_or("ip")).map_err(|e| ctx.err(&at("key"), e))?;
    check_path_param(&key, &routes, ctx, &at)?;
    let failed_statuses = build_failed_statuses(r.failed_statuses.as_deref(), ctx, &at)?;
    let new_agents = build_new_agents(&r, &key, fleet, ctx, &at)?;
    let quota = match calendar {
        Some(c) => Quota::calendar(limit, c),
        None => Quota::new(limit, window, r.algorithm.unwrap_or_default()),
    }
    .with_lockout(lockout);
    let plans = build_plans(r.plan_claim, r.plans, &quota, &cost, ctx, &at)?;
    Ok(LimiterSpec {
        name: Arc::from(name),
        quota,
        plans,
        key,
        cost,
        routes,
        except,
        group: Arc::from(group),
        credential: r.credential.unwrap_or_default(),
        mode: r.mode.unwrap_or_default(),
        on_store_error: r.on_store_error.unwrap_or_default(),
        new_agents,
        count: r.count.unwrap_or_default(),
        failed_statuses,
        disclose: r.disclose.unwrap_or(true),
    })
}

/// The limiter's name is a valid one, and a table that is not a built-in defines every field
/// a new limiter needs.
fn check_name_and_fields(t: &Table<'_>, r: &RawLimiter, ctx: &Ctx) -> Result<(), ConfigError> {
    let name = t.name;
    if !valid_name(name) {
        return Err(ctx.err(
            &format!("limiters.{name}"),
            "a limiter name is 1-64 characters of a-z, 0-9, `-` and `_`",
        ));
    }
    if t.builtin {
        return Ok(());
    }
    let missing: Vec<&str> = [
        ("limit", r.limit.is_none()),
        ("window", r.window.is_none()),
        ("key", r.key.is_none()),
        ("routes", r.routes.is_none()),
    ]
    .iter()
    .filter(|(_, m)| *m)
    .map(|(f, _)| *f)
    .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let why = if t.calibration == super::base::Calibration::None {
        "calibration = \"none\" starts from no built-in limiter".to_owned()
    } else {
        format!(
            "`{name}` is not a built-in limiter ({})",
            t.builtin_names.join(", ")
        )
    };
    Err(ctx.err(
        &format!("limiters.{name}.{}", missing[0]),
        format!(
            "{why}, so [limiters.{name}] defines a new limiter, which needs limit, window, key and routes; add {}",
            missing.join(", ")
        ),
    ))
}

/// An `ip+path:<name>` key reads the segment where each route names `{name}`: a route without
/// it would key every request it matches on the address alone, which the operator did not ask
/// for, so it is refused.
fn check_path_param(
    key: &KeyKind,
    routes: &[RoutePattern],
    ctx: &Ctx,
    at: &dyn Fn(&str) -> String,
) -> Result<(), ConfigError> {
    let Some(name) = key.path_param() else {
        return Ok(());
    };
    match routes.iter().find(|r| !r.names_param(name)) {
        None => Ok(()),
        Some(r) => Err(ctx.err(
            &at("routes"),
            format!(
                "`{r}` names no `{{{name}}}` segment, and key = \"{key}\" reads the agent id from it; write the segment that carries the id as `{{{name}}}` (e.g. \"POST /api/fleet/agents/{{{name}}}/checkin\"), or meter this route with another limiter"
            ),
        )),
    }
}

/// `lockout`: how long a refused key stays refused, from 1s to 1d, or none.
fn build_lockout(
    v: Option<&DurationValue>,
    ctx: &Ctx,
    at: &dyn Fn(&str) -> String,
) -> Result<Option<Duration>, ConfigError> {
    let Some(v) = v else {
        return Ok(None);
    };
    let d = duration(ctx, &at("lockout"), Some(v.clone()), "0s")?;
    if d < MIN_LOCKOUT || d > MAX_LOCKOUT {
        return Err(ctx.err(
            &at("lockout"),
            "must be from 1s to 1d: how long a key stays refused after its first refusal (e.g. \"10m\"), or leave it out for none",
        ));
    }
    Ok(Some(d))
}

/// A list of route patterns (`routes` or `except`); an error names the list's field.
fn parse_routes(
    field: &str,
    list: Option<&[String]>,
    ctx: &Ctx,
    at: &dyn Fn(&str) -> String,
) -> Result<Vec<RoutePattern>, ConfigError> {
    list.unwrap_or_default()
        .iter()
        .map(|s| {
            s.parse::<RoutePattern>()
                .map_err(|e| ctx.err(&at(field), e))
        })
        .collect()
}

/// `failed_statuses`: the statuses `count = "failed"` counts (default 400 and above).
fn build_failed_statuses(
    items: Option<&[StatusItem]>,
    ctx: &Ctx,
    at: &dyn Fn(&str) -> String,
) -> Result<StatusRanges, ConfigError> {
    match items {
        None => Ok(StatusRanges::default()),
        Some([]) => Err(ctx.err(
            &at("failed_statuses"),
            "is empty; list the statuses that count as failed, e.g. [\"400-499\", 503], or leave it out for 400 and above",
        )),
        Some(items) => Ok(StatusRanges(
            items
                .iter()
                .map(|i| {
                    let text = match i {
                        StatusItem::Code(n) => n.to_string(),
                        StatusItem::Text(t) => t.clone(),
                    };
                    StatusRanges::parse_item(&text).map_err(|e| ctx.err(&at("failed_statuses"), e))
                })
                .collect::<Result<_, _>>()?,
        )),
    }
}

/// The meter: `requests` takes no memory of agents; `new-agents` (keyed on the address)
/// remembers admitted agent ids for `known_for`, at most `max_known` of them.
fn build_new_agents(
    r: &RawLimiter,
    key: &KeyKind,
    fleet: &FleetConfig,
    ctx: &Ctx,
    at: &dyn Fn(&str) -> String,
) -> Result<Option<Remember>, ConfigError> {
    match r.meter.unwrap_or_default() {
        Meter::Requests => {
            for (field, set) in [
                ("known_for", r.known_for.is_some()),
                ("max_known", r.max_known.is_some()),
            ] {
                if set {
                    return Err(ctx.err(
                        &at(field),
                        "applies only to a limiter with meter = \"new-agents\"; remove it or set the meter",
                    ));
                }
            }
            return Ok(None);
        }
        Meter::NewAgents => {}
    }
    if *key != KeyKind::Ip {
        return Err(ctx.err(
            &at("meter"),
            format!(
                "\"new-agents\" meters the agent ids seen at one IP, so it needs key = \"ip\" (this limiter's key is \"{}\")",
                key.as_str()
            ),
        ));
    }
    let known_for = duration(ctx, &at("known_for"), r.known_for.clone(), KNOWN_FOR)?;
    if known_for < Duration::from_secs(60) || known_for > Duration::from_secs(86_400) {
        return Err(ctx.err(
            &at("known_for"),
            "must be from 1m to 1d: long enough to cover a healthy agent's longest gap between requests",
        ));
    }
    let default_known = fleet.max_site_endpoints.get().saturating_mul(2);
    let raw_known = r
        .max_known
        .unwrap_or(default_known.min(i64::MAX as u64) as i64);
    let Some(max_known) = u32::try_from(raw_known).ok().filter(|n| *n >= 1) else {
        return Err(ctx.err(
            &at("max_known"),
            format!("{raw_known} is not a number of agents; use a whole number, at least 1 (default: twice fleet.max_site_endpoints)"),
        ));
    };
    Ok(Some(Remember {
        known_for,
        max_known,
    }))
}

/// A calendar window (`window = "day"`, `"week"` or `"month"`, with `time_zone`), `None` for a
/// window given as a duration. A time zone without a calendar window is refused: a duration's
/// window has no boundary for it to place.
fn calendar_window(
    ctx: &Ctx,
    at: &dyn Fn(&str) -> String,
    window: Option<&DurationValue>,
    time_zone: Option<&str>,
) -> Result<Option<crate::limiter::calendar::Calendar>, ConfigError> {
    use crate::limiter::calendar::{Calendar, CalendarUnit, Zone};
    let unit = match window {
        Some(DurationValue::Text(t)) => CalendarUnit::parse(t),
        _ => None,
    };
    match (unit, time_zone) {
        (None, None) => Ok(None),
        (None, Some(_)) => Err(ctx.err(
            &at("time_zone"),
            "applies only to a calendar window; set window = \"day\", \"week\" or \"month\", or remove time_zone",
        )),
        (Some(unit), tz) => {
            let zone = match tz {
                None => Zone::utc(),
                Some(name) => Zone::named(name).map_err(|e| ctx.err(&at("time_zone"), e))?,
            };
            Ok(Some(Calendar::new(unit, zone)))
        }
    }
}

/// Most plans one limiter lists.
const MAX_PLANS: usize = 64;

/// `plan_claim` and `[limiters.<name>.plans]`: both or neither; each plan a budget of its own
/// (its window defaults to the limiter's), one a request's cost can always fit.
fn build_plans(
    claim: Option<String>,
    plans: Option<BTreeMap<String, RawPlan>>,
    base: &Quota,
    cost: &Cost,
    ctx: &Ctx,
    at: &dyn Fn(&str) -> String,
) -> Result<Option<Arc<Plans>>, ConfigError> {
    let (claim, plans) = match (claim, plans) {
        (None, None) => return Ok(None),
        (Some(_), None) => {
            return Err(ctx.err(
                &at("plan_claim"),
                format!("names the claim that chooses a plan, but no plan is listed; add [{}.<plan>] with its limit and window, or drop plan_claim", at("plans")),
            ))
        }
        (None, Some(_)) => {
            return Err(ctx.err(
                &at("plans"),
                format!("lists plans, but {} does not say which claim of the verified token names the plan; set it, e.g. plan_claim = \"plan\"", at("plan_claim")),
            ))
        }
        (Some(c), Some(p)) => (c, p),
    };
    let claim = claim.trim();
    if !crate::identity::valid_claim_name(claim)
        || crate::identity::REGISTERED_CLAIMS.contains(&claim)
    {
        return Err(ctx.err(
            &at("plan_claim"),
            format!("`{claim}` cannot name a plan; name a claim of 1-64 characters of A-Z, a-z, 0-9, `.`, `_`, `:` and `-` other than the registered ones, e.g. \"plan\""),
        ));
    }
    if plans.is_empty() || plans.len() > MAX_PLANS {
        return Err(ctx.err(
            &at("plans"),
            format!("lists {} plans; list 1 to {MAX_PLANS}", plans.len()),
        ));
    }
    let mut quotas = Vec::with_capacity(plans.len());
    for (plan, raw) in plans {
        let field = format!("plans.{plan}");
        if crate::keys::valid_key_header(plan.as_bytes()).is_none() {
            return Err(ctx.err(
                &at(&field),
                "a plan is named by the claim's value: 1-128 visible ASCII characters without spaces",
            ));
        }
        let raw_limit = raw.limit.unwrap_or(0);
        let Some(limit) = u32::try_from(raw_limit).ok().and_then(NonZeroU32::new) else {
            return Err(ctx.err(
                &at(&format!("{field}.limit")),
                format!("{raw_limit} is not a budget; use a whole number of requests, at least 1"),
            ));
        };
        let plan_calendar = calendar_window(
            ctx,
            &|f: &str| at(&format!("{field}.{f}")),
            raw.window.as_ref(),
            None,
        )?
        .map(|c| match base.calendar_window() {
            // A plan's calendar period is in the limiter's time zone.
            Some(b) => crate::limiter::calendar::Calendar::new(c.unit, b.zone),
            None => c,
        });
        let window = match (&raw.window, plan_calendar) {
            (_, Some(c)) => c.unit.longest(),
            (Some(w), None) => {
                duration(ctx, &at(&format!("{field}.window")), Some(w.clone()), "1m")?
            }
            (None, None) => base.window(),
        };
        if plan_calendar.is_none() && (window.is_zero() || window > Duration::from_secs(7 * 86_400))
        {
            return Err(ctx.err(
                &at(&format!("{field}.window")),
                "use a window from 1s to 7d",
            ));
        }
        let most = match cost {
            Cost::Fixed(n) => *n,
            Cost::Header { max, .. } => *max,
        };
        if most > limit {
            return Err(ctx.err(
                &at(&format!("{field}.limit")),
                format!("{limit} is less than one request's cost ({most}), so no request on this plan could pass; raise it to at least {most}"),
            ));
        }
        let quota = match (raw.window.is_some(), plan_calendar, base.calendar_window()) {
            (_, Some(c), _) | (false, None, Some(c)) => Quota::calendar(limit, c),
            _ => Quota::new(limit, window, base.algorithm),
        };
        quotas.push((plan.into_boxed_str(), quota.with_lockout(base.lockout())));
    }
    Ok(Some(Arc::new(Plans {
        claim: Arc::from(claim),
        quotas,
    })))
}

/// A limiter's cost per request: `cost = N`, or `cost_header` with `cost_max` (default: the
/// limit). A cost above the limit could never pass, so it is refused. Errors name the field.
fn build_cost(
    r: &RawLimiter,
    limit: NonZeroU32,
    at: &dyn Fn(&str) -> String,
) -> Result<Cost, (&'static str, String)> {
    let units = |field: &'static str, n: i64| -> Result<NonZeroU32, (&'static str, String)> {
        let Ok(n) = u32::try_from(n) else {
            return Err((
                field,
                format!(
                    "{n} is not a cost; use a whole number of units from 1 to the limit ({limit})"
                ),
            ));
        };
        let Some(n) = NonZeroU32::new(n) else {
            return Err((
                field,
                format!("0 is not a cost; use a whole number of units from 1 to the limit ({limit}), or leave it out for 1"),
            ));
        };
        if n > limit {
            return Err((
                field,
                format!("{n} is more than limit = {limit}, so a request charged that much could never pass; lower {} to at most {limit}, or raise {}", at(field), at("limit")),
            ));
        }
        Ok(n)
    };
    match (r.cost, &r.cost_header, r.cost_max) {
        (Some(_), Some(_), _) => Err((
            "cost",
            format!(
                "is set together with {}; a fixed cost and a cost read from a header exclude each other, so keep one",
                at("cost_header")
            ),
        )),
        (_, None, Some(_)) => Err((
            "cost_max",
            format!(
                "caps a cost read from a header, and {} is not set; set it (e.g. \"X-Batch-Size\") or drop cost_max",
                at("cost_header")
            ),
        )),
        (Some(n), None, None) => units("cost", n).map(Cost::Fixed),
        (None, None, None) => Ok(Cost::Fixed(NonZeroU32::MIN)),
        (None, Some(name), max) => {
            let lower = name.trim().to_ascii_lowercase();
            let token = !lower.is_empty()
                && lower.len() <= MAX_KEY_HEADER_NAME
                && lower.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_'
                });
            if !token || RESERVED_KEY_HEADERS.contains(&lower.as_str()) {
                return Err((
                    "cost_header",
                    format!(
                        "`{name}` cannot carry a cost; name a request header of 1-{MAX_KEY_HEADER_NAME} characters of a-z, 0-9, `-` and `_` other than the ones the gateway reads, e.g. \"X-Batch-Size\""
                    ),
                ));
            }
            let max = match max {
                Some(m) => units("cost_max", m)?,
                None => limit,
            };
            Ok(Cost::Header {
                name: Arc::from(lower.as_str()),
                max,
            })
        }
    }
}
