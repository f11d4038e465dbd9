//! `[admission]`: admission control in front of the upstream. A cap on requests forwarded at
//! once (`max_in_flight`), a short bounded queue for the ones that find every slot taken
//! (`queue`, `queue_timeout`), and route groups with a share of the cap reserved for them
//! (`[admission.groups.<name>]`). Off unless `max_in_flight` is set above zero.
//!
//! So that no one client address can hold a group's slots, one address holds (or waits for) at
//! most `client_share_percent` of each group's slots, and a request still sending its body after
//! `body_hold` of waiting for it is cut off and gives its slot back.

use super::{duration, ConfigError, Ctx, DurationValue};
use crate::policy::RoutePattern;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// How many may wait for a slot when `queue` is not set.
pub(crate) const QUEUE: usize = 16;
/// How long one may wait when `queue_timeout` is not set.
pub(crate) const QUEUE_TIMEOUT: &str = "1s";
/// The longest `queue_timeout` allowed: the queue absorbs a burst, it is not a place to park.
pub(crate) const MAX_QUEUE_TIMEOUT: Duration = Duration::from_secs(60);
/// The most slots or queue places a setting may ask for.
const MAX_SLOTS: i64 = 1_000_000;
/// The label of the requests no group names: they share what the groups leave of the cap.
pub(crate) const DEFAULT_GROUP: &str = "default";
/// The share of a group's slots one client address may hold when `client_share_percent` is
/// not set.
pub(crate) const CLIENT_SHARE_PERCENT: u8 = 25;
/// How long a request holding a slot may keep the gateway waiting for its body when
/// `body_hold` is not set.
pub(crate) const BODY_HOLD: &str = "60s";

/// `[admission]`, validated; present only when admission control is on.
#[derive(Debug, Clone, PartialEq)]
pub struct AdmissionConfig {
    /// The cap on requests forwarded to the upstream at once, the groups' shares included.
    pub max_in_flight: usize,
    /// How many requests of the default group may wait for a slot.
    pub queue: usize,
    /// How long one request may wait for a slot, in any group.
    pub queue_timeout: Duration,
    /// Route groups, each with its own reserved share, in name order.
    pub groups: Vec<AdmissionGroup>,
    /// The most of one group's slots one client address may hold or wait for, in percent.
    pub client_share_percent: u8,
    /// How long a request holding a slot of the default group may keep the gateway waiting for
    /// its body, in all.
    pub body_hold: Duration,
}

impl AdmissionConfig {
    /// The slots left for requests no group names: the cap less every group's share.
    pub fn default_share(&self) -> usize {
        self.max_in_flight - self.groups.iter().map(|g| g.max_in_flight).sum::<usize>()
    }

    /// The most of a gate of `slots` slots one client address may hold or wait for: the
    /// client share of them, rounded down, and at least one.
    pub fn per_client(&self, slots: usize) -> usize {
        (slots.saturating_mul(usize::from(self.client_share_percent)) / 100).clamp(1, slots.max(1))
    }
}

/// `[admission.groups.<name>]`: routes with a share of the cap that only they use.
#[derive(Debug, Clone, PartialEq)]
pub struct AdmissionGroup {
    pub name: String,
    pub routes: Vec<RoutePattern>,
    /// Slots reserved for these routes (taken out of `admission.max_in_flight`).
    pub max_in_flight: usize,
    /// How many of these routes' requests may wait (defaults to `admission.queue`).
    pub queue: usize,
    /// How long one of these requests may keep the gateway waiting for its body while it holds
    /// a slot (defaults to `admission.body_hold`).
    pub body_hold: Duration,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAdmission {
    max_in_flight: Option<i64>,
    queue: Option<i64>,
    queue_timeout: Option<DurationValue>,
    #[serde(default)]
    groups: BTreeMap<String, RawAdmissionGroup>,
    client_share_percent: Option<i64>,
    body_hold: Option<DurationValue>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAdmissionGroup {
    routes: Option<Vec<String>>,
    max_in_flight: Option<i64>,
    queue: Option<i64>,
    body_hold: Option<DurationValue>,
}

fn count(ctx: &Ctx, path: &str, v: i64, least: i64, what: &str) -> Result<usize, ConfigError> {
    if !(least..=MAX_SLOTS).contains(&v) {
        return Err(ctx.err(
            path,
            format!("{v} is out of range; use {what} from {least} to {MAX_SLOTS}"),
        ));
    }
    Ok(v as usize)
}

pub(super) fn build_admission(
    raw: RawAdmission,
    ctx: &Ctx,
) -> Result<Option<AdmissionConfig>, ConfigError> {
    let max_in_flight = match raw.max_in_flight {
        None | Some(0) => {
            if let Some(name) = raw.groups.keys().next() {
                return Err(ctx.err(
                    &format!("admission.groups.{name}"),
                    "needs admission.max_in_flight: a group's share is reserved out of that cap; set admission.max_in_flight (FLEET_LIMITER_ADMISSION_MAX_IN_FLIGHT, --admission-max-in-flight) above the groups' shares, or drop the group",
                ));
            }
            return Ok(None);
        }
        Some(n) => count(
            ctx,
            "admission.max_in_flight",
            n,
            0,
            "a number of requests (0 turns admission control off)",
        )?,
    };
    let queue = count(
        ctx,
        "admission.queue",
        raw.queue.unwrap_or(QUEUE as i64),
        0,
        "a number of waiting requests (0: refuse at once when every slot is taken)",
    )?;
    let queue_timeout = duration(
        ctx,
        "admission.queue_timeout",
        raw.queue_timeout,
        QUEUE_TIMEOUT,
    )?;
    if queue_timeout > MAX_QUEUE_TIMEOUT {
        return Err(ctx.err(
            "admission.queue_timeout",
            "is longer than 60s; a queued request holds its client and a connection while it waits, so keep it short (default 1s, at most 60s)",
        ));
    }
    let client_share = raw
        .client_share_percent
        .unwrap_or(i64::from(CLIENT_SHARE_PERCENT));
    if !(1..=100).contains(&client_share) {
        return Err(ctx.err(
            "admission.client_share_percent",
            format!("{client_share} is not a share; use 1 to 100, the percent of a group's slots one client address may hold (default {CLIENT_SHARE_PERCENT}; 100 lets one address take them all)"),
        ));
    }
    let body_hold = duration(ctx, "admission.body_hold", raw.body_hold, BODY_HOLD)?;
    let mut groups = Vec::new();
    for (name, g) in raw.groups {
        let at = |field: &str| format!("admission.groups.{name}.{field}");
        if name == DEFAULT_GROUP {
            return Err(ctx.err(
                &format!("admission.groups.{name}"),
                format!("`{DEFAULT_GROUP}` names the requests no group names; give the group another name"),
            ));
        }
        let routes = g
            .routes
            .unwrap_or_default()
            .iter()
            .map(|s| {
                s.parse::<RoutePattern>()
                    .map_err(|e| ctx.err(&at("routes"), e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if routes.is_empty() {
            return Err(ctx.err(
                &at("routes"),
                "is empty; name the routes this share is for, e.g. [\"/api/agent/**\"]",
            ));
        }
        let Some(share) = g.max_in_flight else {
            return Err(ctx.err(
                &at("max_in_flight"),
                "is missing; set the number of slots reserved for these routes, e.g. max_in_flight = 8",
            ));
        };
        let share = count(ctx, &at("max_in_flight"), share, 1, "a number of requests")?;
        let queue = match g.queue {
            Some(q) => count(ctx, &at("queue"), q, 0, "a number of waiting requests")?,
            None => queue,
        };
        let body_hold = match g.body_hold {
            Some(d) => duration(ctx, &at("body_hold"), Some(d), BODY_HOLD)?,
            None => body_hold,
        };
        groups.push(AdmissionGroup {
            name,
            routes,
            max_in_flight: share,
            queue,
            body_hold,
        });
    }
    let reserved: usize = groups.iter().map(|g| g.max_in_flight).sum();
    if let Some(last) = groups.last() {
        if reserved >= max_in_flight {
            return Err(ctx.err(
                &format!("admission.groups.{}.max_in_flight", last.name),
                format!(
                    "the groups reserve {reserved} slots of admission.max_in_flight = {max_in_flight} ({}), leaving none for the other routes; raise admission.max_in_flight above {reserved} or lower the groups' shares",
                    ctx.origin("admission.max_in_flight")
                ),
            ));
        }
    }
    check_overlaps(&groups, ctx)?;
    Ok(Some(AdmissionConfig {
        max_in_flight,
        queue,
        queue_timeout,
        groups,
        client_share_percent: client_share as u8,
        body_hold,
    }))
}

/// A request belongs to the group with its most specific route; two groups whose routes of the
/// same specificity can match one request leave no winner, which is an error.
fn check_overlaps(groups: &[AdmissionGroup], ctx: &Ctx) -> Result<(), ConfigError> {
    let sets: Vec<(&str, &[RoutePattern])> = groups
        .iter()
        .map(|g| (g.name.as_str(), g.routes.as_slice()))
        .collect();
    match crate::policy::ambiguous_pair(&sets) {
        Some((b, rb, a, ra)) => Err(ctx.err(
            &format!("admission.groups.{b}.routes"),
            format!(
                "route `{rb}` overlaps `{ra}` of group `{a}` with the same specificity, so a request could belong to either; make one route more specific, or move it to one group"
            ),
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Loader;
    use std::time::Duration;

    fn load(toml: &str) -> Result<crate::config::Config, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let path = dir.path().join("c.toml");
        std::fs::write(&path, toml).map_err(|e| e.to_string())?;
        Loader::new()
            .file(&path)
            .load()
            .map_err(|e| e.to_string().replace(&*path.to_string_lossy(), "c.toml"))
    }

    #[test]
    fn off_by_default_and_at_zero() {
        assert_eq!(Loader::new().load().expect("defaults").admission, None);
        assert_eq!(
            load("[admission]\nmax_in_flight = 0\n")
                .expect("0 is off")
                .admission,
            None
        );
    }

    #[test]
    fn groups_reserve_their_share_of_the_cap() {
        let c = load(
            "[admission]\nmax_in_flight = 10\nqueue = 2\nqueue_timeout = \"500ms\"\n[admission.groups.agent]\nroutes = [\"/api/agent/**\"]\nmax_in_flight = 4\n[admission.groups.export]\nroutes = [\"POST /api/export\"]\nmax_in_flight = 1\nqueue = 0\n",
        )
        .expect("valid");
        let a = c.admission.expect("on");
        assert_eq!(a.max_in_flight, 10);
        assert_eq!(a.queue, 2);
        assert_eq!(a.queue_timeout, Duration::from_millis(500));
        assert_eq!(a.default_share(), 5);
        let names: Vec<_> = a
            .groups
            .iter()
            .map(|g| (g.name.as_str(), g.max_in_flight, g.queue))
            .collect();
        assert_eq!(names, [("agent", 4, 2), ("export", 1, 0)]);
    }

    #[test]
    fn defaults_when_only_the_cap_is_set() {
        let a = load("[admission]\nmax_in_flight = 3\n")
            .expect("valid")
            .admission
            .expect("on");
        assert_eq!(
            (a.queue, a.queue_timeout, a.groups.len()),
            (16, Duration::from_secs(1), 0)
        );
        assert_eq!(
            (a.client_share_percent, a.body_hold),
            (25, Duration::from_secs(60))
        );
    }

    #[test]
    fn one_client_address_gets_a_share_of_each_gate_rounded_down_and_at_least_one() {
        let a = load("[admission]\nmax_in_flight = 3\n")
            .expect("valid")
            .admission
            .expect("on");
        let shares: Vec<usize> = [1, 2, 3, 4, 7, 8, 64, 1000]
            .iter()
            .map(|&n| a.per_client(n))
            .collect();
        assert_eq!(shares, [1, 1, 1, 1, 1, 2, 16, 250]);
        let all = load("[admission]\nmax_in_flight = 3\nclient_share_percent = 100\n")
            .expect("valid")
            .admission
            .expect("on");
        assert_eq!((all.per_client(1), all.per_client(64)), (1, 64));
        let one = load("[admission]\nmax_in_flight = 3\nclient_share_percent = 1\n")
            .expect("valid")
            .admission
            .expect("on");
        assert_eq!((one.per_client(64), one.per_client(1000)), (1, 10));
    }

    #[test]
    fn a_group_may_hold_bodies_longer_or_shorter_than_the_rest() {
        let a = load(
            "[admission]\nmax_in_flight = 10\nbody_hold = \"20s\"\n[admission.groups.upload]\nroutes = [\"POST /api/upload\"]\nmax_in_flight = 2\nbody_hold = \"10m\"\n[admission.groups.agent]\nroutes = [\"/api/agent/**\"]\nmax_in_flight = 4\n",
        )
        .expect("valid")
        .admission
        .expect("on");
        assert_eq!(a.body_hold, Duration::from_secs(20));
        let holds: Vec<_> = a
            .groups
            .iter()
            .map(|g| (g.name.as_str(), g.body_hold))
            .collect();
        assert_eq!(
            holds,
            [
                ("agent", Duration::from_secs(20)),
                ("upload", Duration::from_secs(600))
            ]
        );
    }

    #[test]
    fn env_and_flag_layers() {
        let a = Loader::new()
            .env([
                (
                    "FLEET_LIMITER_ADMISSION_MAX_IN_FLIGHT".to_owned(),
                    "64".to_owned(),
                ),
                ("FLEET_LIMITER_ADMISSION_QUEUE".to_owned(), "8".to_owned()),
                (
                    "FLEET_LIMITER_ADMISSION_CLIENT_SHARE_PERCENT".to_owned(),
                    "50".to_owned(),
                ),
            ])
            .flag(
                "admission.queue_timeout",
                "250ms",
                "--admission-queue-timeout",
            )
            .flag("admission.body_hold", "2m", "--admission-body-hold")
            .load()
            .expect("valid")
            .admission
            .expect("on");
        assert_eq!(
            (a.max_in_flight, a.queue, a.queue_timeout),
            (64, 8, Duration::from_millis(250))
        );
        assert_eq!(
            (a.client_share_percent, a.body_hold),
            (50, Duration::from_secs(120))
        );
        let e = Loader::new()
            .flag("admission.max_in_flight", "-1", "--admission-max-in-flight")
            .load()
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(
                "flag --admission-max-in-flight: admission.max_in_flight: -1 is out of range"
            ),
            "{e}"
        );
    }

    #[test]
    fn errors_name_origin_field_and_fix() {
        let cases = [
            (
                "[admission]\nmax_in_flight = 4\nqueue_timeout = \"5m\"\n",
                "c.toml: admission.queue_timeout: is longer than 60s",
            ),
            (
                "[admission]\nmax_in_flight = 4\nqueue_timeout = \"0s\"\n",
                "c.toml: admission.queue_timeout: must be longer than zero",
            ),
            (
                "[admission]\nmax_in_flight = 4\nqueue = -2\n",
                "c.toml: admission.queue: -2 is out of range",
            ),
            (
                "[admission.groups.agent]\nroutes = [\"/api/agent/**\"]\nmax_in_flight = 2\n",
                "c.toml: admission.groups.agent: needs admission.max_in_flight",
            ),
            (
                "[admission]\nmax_in_flight = 4\n[admission.groups.agent]\nroutes = [\"/api/agent/**\"]\nmax_in_flight = 4\n",
                "c.toml: admission.groups.agent.max_in_flight: the groups reserve 4 slots of admission.max_in_flight = 4 (c.toml), leaving none for the other routes; raise admission.max_in_flight above 4",
            ),
            (
                "[admission]\nmax_in_flight = 4\n[admission.groups.agent]\nroutes = []\nmax_in_flight = 1\n",
                "c.toml: admission.groups.agent.routes: is empty",
            ),
            (
                "[admission]\nmax_in_flight = 4\n[admission.groups.agent]\nroutes = [\"api/agent\"]\nmax_in_flight = 1\n",
                "c.toml: admission.groups.agent.routes: `api/agent`",
            ),
            (
                "[admission]\nmax_in_flight = 4\n[admission.groups.agent]\nroutes = [\"/api/agent/**\"]\n",
                "c.toml: admission.groups.agent.max_in_flight: is missing",
            ),
            (
                "[admission]\nmax_in_flight = 4\n[admission.groups.default]\nroutes = [\"/x\"]\nmax_in_flight = 1\n",
                "c.toml: admission.groups.default: `default` names the requests no group names",
            ),
            (
                "[admission]\nmax_in_flight = 9\n[admission.groups.a]\nroutes = [\"/api/*/x\"]\nmax_in_flight = 1\n[admission.groups.b]\nroutes = [\"/api/y/*\"]\nmax_in_flight = 1\n",
                "c.toml: admission.groups.b.routes: route `/api/y/*` overlaps `/api/*/x` of group `a`",
            ),
            (
                "[admission]\nmax_in_flight = 4\nqueu = 1\n",
                "c.toml: admission.queu",
            ),
            (
                "[admission]\nmax_in_flight = 4\n[admission.groups.agent]\nroutes = [\"/api/agent/**\"]\nmax_in_flight = \"two\"\n",
                "c.toml: admission.groups.agent.max_in_flight",
            ),
            (
                "[admission]\nmax_in_flight = 4\n[admission.groups.agent]\nroutes = [\"/api/agent/**\"]\nmax_in_flight = 1\nshare = 1\n",
                "c.toml: admission.groups.agent.share",
            ),
            (
                "[admission]\nmax_in_flight = \"many\"\n",
                "c.toml: admission.max_in_flight",
            ),
            (
                "[admission]\nmax_in_flight = 4\nclient_share_percent = 0\n",
                "c.toml: admission.client_share_percent: 0 is not a share; use 1 to 100",
            ),
            (
                "[admission]\nmax_in_flight = 4\nclient_share_percent = 101\n",
                "c.toml: admission.client_share_percent: 101 is not a share",
            ),
            (
                "[admission]\nmax_in_flight = 4\nbody_hold = \"0s\"\n",
                "c.toml: admission.body_hold: must be longer than zero",
            ),
            (
                "[admission]\nmax_in_flight = 4\n[admission.groups.up]\nroutes = [\"/up\"]\nmax_in_flight = 1\nbody_hold = \"later\"\n",
                "c.toml: admission.groups.up.body_hold",
            ),
        ];
        for (toml, want) in cases {
            let e = load(toml).expect_err(toml);
            assert!(e.starts_with(want), "{toml}\n{e}");
        }
    }
}
