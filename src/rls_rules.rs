//! envoyproxy/ratelimit's YAML configuration, read as it is, and the lookup of a descriptor in
//! it.
//!
//! A file holds one `domain` and a tree of `descriptors`, each with a `key`, an optional
//! `value` (exact, or a prefix ending in `*`), an optional `rate_limit` (`unit`,
//! `requests_per_unit`, `unlimited`, `name`, `replaces`), `shadow_mode` and nested
//! `descriptors`. A request's descriptor is limited by the node its last entry reaches, walking
//! the tree one entry per level: at each level the exact `key`+`value` first, then a wildcard
//! value, then the `key` alone (the reference's order). Each rule is a fleet-limiter limiter
//! (GCRA, a window of one unit) named `rls:<domain>:<path>`; or, with the `fleet_limiter`
//! extension key, an existing limiter of the calibration, so the gateway's requests and the
//! proxy's descriptors spend one budget.

use crate::keys::KeyKind;
use crate::limiter::Quota;
use crate::policy::{LimiterSpec, Mode};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::num::NonZeroU32;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Every domain, by name.
#[derive(Debug, Default)]
pub struct Domains {
    pub(crate) by_name: HashMap<String, Domain>,
    /// The files read, for `check`.
    pub(crate) files: Vec<String>,
}

/// One domain's tree.
#[derive(Debug, Default)]
pub struct Domain {
    pub(crate) name: Arc<str>,
    pub(crate) root: Level,
}

/// The children of one node.
#[derive(Debug, Default)]
pub(crate) struct Level {
    /// `key NUL value`.
    exact: HashMap<String, Node>,
    /// By key: `value` omitted, any value.
    any: HashMap<String, Node>,
    /// `(key, prefix)`: `value: "prefix*"`, in file order.
    wildcard: Vec<(String, String, Node)>,
}

#[derive(Debug, Default)]
pub(crate) struct Node {
    rule: Option<Arc<Rule>>,
    children: Level,
}

/// The time unit of a `rate_limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    /// A calendar month (UTC): always counted as a calendar window, having no fixed length.
    Month,
}

impl Unit {
    fn parse(s: &str) -> Option<Self> {
        Some(match s.to_ascii_lowercase().as_str() {
            "second" => Unit::Second,
            "minute" => Unit::Minute,
            "hour" => Unit::Hour,
            "day" => Unit::Day,
            "week" => Unit::Week,
            "month" => Unit::Month,
            _ => return None,
        })
    }

    /// From Envoy's `RateLimitUnit`/`RateLimit.Unit` number (year is not offered).
    pub fn from_proto(n: i32) -> Option<Self> {
        Some(match n {
            1 => Unit::Second,
            2 => Unit::Minute,
            3 => Unit::Hour,
            4 => Unit::Day,
            5 => Unit::Month,
            7 => Unit::Week,
            _ => return None,
        })
    }

    /// Envoy's `RateLimitResponse.RateLimit.Unit` number.
    pub fn proto(self) -> i32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 2,
            Unit::Hour => 3,
            Unit::Day => 4,
            Unit::Month => 5,
            Unit::Week => 7,
        }
    }

    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 31 * 86_400,
        }
    }

    /// The calendar period of the same name (a month is always one).
    pub fn calendar(self) -> Option<crate::limiter::calendar::CalendarUnit> {
        use crate::limiter::calendar::CalendarUnit;
        match self {
            Unit::Day => Some(CalendarUnit::Day),
            Unit::Week => Some(CalendarUnit::Week),
            Unit::Month => Some(CalendarUnit::Month),
            _ => None,
        }
    }

    /// The budget of `n` a unit: a continuous bucket over one unit, or, with `calendar` (and
    /// always for a month), a fixed window that ends at the UTC calendar's next boundary.
    pub fn quota(self, n: NonZeroU32, calendar: bool) -> Quota {
        match self.calendar() {
            Some(c) if calendar || self == Unit::Month => {
                Quota::calendar(n, crate::limiter::calendar::Calendar::utc(c))
            }
            _ => Quota::gcra(n, self.window()),
        }
    }

    /// The unit a calendar period is spoken of in.
    pub fn of_calendar(c: crate::limiter::calendar::CalendarUnit) -> Self {
        use crate::limiter::calendar::CalendarUnit;
        match c {
            CalendarUnit::Day => Unit::Day,
            CalendarUnit::Week => Unit::Week,
            CalendarUnit::Month => Unit::Month,
        }
    }

    /// A window of exactly one unit, as the reference's fixed windows are long.
    pub fn window(self) -> Duration {
        Duration::from_secs(self.seconds())
    }

    /// For `check` and logs: `minute`.
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
        }
    }
}

/// What a matched node does.
#[derive(Debug, Clone)]
pub enum Limit {
    /// `unlimited: true`: always OK, counted nowhere.
    Unlimited,
    /// `requests_per_unit: 0`: always OVER_LIMIT, as the reference answers.
    Nothing(Unit),
    /// A budget in a limiter: this YAML rule's own, or the calibration's (`fleet_limiter`).
    Limiter {
        spec: Arc<LimiterSpec>,
        unit: Unit,
        /// Names a calibration limiter: its bucket is keyed as the gateway keys it.
        mapped: bool,
    },
}

/// One `rate_limit` of the YAML, resolved.
#[derive(Debug)]
pub struct Rule {
    /// The descriptor path in the file (`rls:<domain>:<key>=<value>/<key>`), for metrics, logs
    /// and `check`.
    pub path: Arc<str>,
    pub limit: Limit,
    /// `shadow_mode: true`: an over-limit answer is OK (so is one of a mapped limiter in
    /// `mode = "shadow"`).
    pub shadow: bool,
    /// `rate_limit.name`, which another rule's `replaces` names.
    pub name: Option<String>,
    pub replaces: Vec<String>,
    /// `requests_per_unit` as written (for a mapped limiter, its limit).
    pub requests_per_unit: u32,
}

impl Domains {
    /// The domain named `name`, if configured.
    pub fn domain(&self, name: &str) -> Option<&Domain> {
        self.by_name.get(name)
    }

    /// Every rule, by domain, for `check`.
    pub fn rules(&self) -> Vec<Arc<Rule>> {
        let mut out = Vec::new();
        let mut names: Vec<&String> = self.by_name.keys().collect();
        names.sort();
        for n in names {
            if let Some(d) = self.by_name.get(n) {
                d.root.collect(&mut out);
            }
        }
        out
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
}

impl Level {
    fn collect(&self, out: &mut Vec<Arc<Rule>>) {
        let mut nodes: Vec<(&String, &Node)> = self.exact.iter().chain(self.any.iter()).collect();
        nodes.sort_by(|a, b| a.0.cmp(b.0));
        for (_, n) in nodes
            .into_iter()
            .chain(self.wildcard.iter().map(|(k, _, n)| (k, n)))
        {
            if let Some(r) = &n.rule {
                out.push(r.clone());
            }
            n.children.collect(out);
        }
    }
}

impl Domain {
    /// The rule limiting a descriptor of these `(key, value)` entries, if any: the node its
    /// last entry reaches, one entry per level (see the module's documentation).
    pub fn lookup<'a, I>(&self, entries: I) -> Option<&Arc<Rule>>
    where
        I: ExactSizeIterator<Item = (&'a str, &'a str)>,
    {
        let mut level = &self.root;
        let last = entries.len().checked_sub(1)?;
        let mut buf = String::new();
        for (i, (key, value)) in entries.enumerate() {
            buf.clear();
            buf.push_str(key);
            buf.push('\0');
            buf.push_str(value);
            let node = level
                .exact
                .get(&buf)
                .or_else(|| {
                    level
                        .wildcard
                        .iter()
                        .find(|(k, p, _)| k == key && value.starts_with(p.as_str()))
                        .map(|(_, _, n)| n)
                })
                .or_else(|| level.any.get(key))?;
            if i == last {
                return node.rule.as_ref();
            }
            level = &node.children;
        }
        None
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    domain: String,
    #[serde(default)]
    descriptors: Vec<RawDescriptor>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDescriptor {
    key: String,
    value: Option<String>,
    rate_limit: Option<RawRateLimit>,
    #[serde(default)]
    shadow_mode: bool,
    /// The reference's per-value statistics switch; read and ignored (metrics here are per
    /// rule).
    #[serde(default)]
    #[allow(dead_code)]
    detailed_metric: bool,
    #[serde(default)]
    descriptors: Vec<RawDescriptor>,
    /// Extension: the name of a calibration limiter whose budget this descriptor spends.
    fleet_limiter: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRateLimit {
    unit: Option<String>,
    requests_per_unit: Option<i64>,
    #[serde(default)]
    unlimited: bool,
    /// `day` and `week` as calendar windows (UTC midnight, Monday's midnight), as the
    /// reference's fixed windows count them, rather than continuous buckets.
    #[serde(default)]
    calendar: bool,
    name: Option<String>,
    #[serde(default)]
    replaces: Vec<RawReplace>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReplace {
    name: String,
}

/// Read `path` (a YAML file, or a directory whose `*.yaml` and `*.yml` files are each one
/// domain), resolving `fleet_limiter` names against `limiters`. Errors name the file, the field
/// and the fix.
pub(crate) fn load(path: &Path, limiters: &[LimiterSpec]) -> Result<Domains, String> {
    let meta = std::fs::metadata(path).map_err(|e| {
        format!(
            "cannot read {}: {e}; name an envoyproxy/ratelimit YAML file or a directory of them",
            path.display()
        )
    })?;
    let files: Vec<std::path::PathBuf> = if meta.is_dir() {
        let mut v: Vec<_> = std::fs::read_dir(path)
            .map_err(|e| format!("cannot list {}: {e}", path.display()))?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                p.is_file()
                    && matches!(
                        p.extension().and_then(|e| e.to_str()),
                        Some("yaml") | Some("yml")
                    )
            })
            .collect();
        v.sort();
        if v.is_empty() {
            return Err(format!(
                "{} holds no *.yaml or *.yml file; put the envoyproxy/ratelimit configuration files there",
                path.display()
            ));
        }
        v
    } else {
        vec![path.to_path_buf()]
    };
    let mut out = Domains::default();
    for file in files {
        let shown = file.display().to_string();
        let text =
            std::fs::read_to_string(&file).map_err(|e| format!("cannot read {shown}: {e}"))?;
        let de = serde_norway::Deserializer::from_str(&text);
        let raw: RawFile = serde_path_to_error::deserialize(de).map_err(|e| {
            let at = e.path().to_string();
            format!(
                "{shown}: {}: {}; see docs/envoy-rls.md for the fields read",
                if at == "." {
                    "(document)".to_owned()
                } else {
                    at
                },
                e.inner()
            )
        })?;
        let domain = raw.domain.trim().to_owned();
        if domain.is_empty() {
            return Err(format!("{shown}: domain: is empty; name the domain Envoy's rate limit filter sends (`domain:` in envoy.filters.http.ratelimit)"));
        }
        if out.by_name.contains_key(&domain) {
            return Err(format!("{shown}: domain: `{domain}` is configured in another file too; keep each domain in one file"));
        }
        let mut root = Level::default();
        let mut names: BTreeMap<String, String> = BTreeMap::new();
        let ctx = FileCtx {
            file: &shown,
            limiters,
        };
        build_level(
            &ctx,
            &raw.descriptors,
            "descriptors",
            &format!("rls:{domain}:"),
            &mut root,
            &mut names,
        )?;
        out.files.push(shown);
        out.by_name.insert(
            domain.clone(),
            Domain {
                name: Arc::from(domain.as_str()),
                root,
            },
        );
    }
    Ok(out)
}

struct FileCtx<'a> {
    file: &'a str,
    limiters: &'a [LimiterSpec],
}

impl FileCtx<'_> {
    fn err(&self, at: &str, msg: impl std::fmt::Display) -> String {
        format!("{}: {at}: {msg}", self.file)
    }
}

/// Most nesting a file may have: deeper trees are refused rather than walked.
const MAX_DEPTH: usize = 32;

fn build_level(
    ctx: &FileCtx<'_>,
    raw: &[RawDescriptor],
    at: &str,
    prefix: &str,
    level: &mut Level,
    names: &mut BTreeMap<String, String>,
) -> Result<(), String> {
    if at.matches("descriptors[").count() > MAX_DEPTH {
        return Err(ctx.err(
            at,
            format!("is nested deeper than {MAX_DEPTH} levels; flatten the tree"),
        ));
    }
    for (i, d) in raw.iter().enumerate() {
        let here = format!("{at}[{i}]");
        if d.key.is_empty() {
            return Err(ctx.err(
                &format!("{here}.key"),
                "is empty; every descriptor names its key",
            ));
        }
        let path = match &d.value {
            Some(v) => format!("{prefix}{}={v}", d.key),
            None => format!("{prefix}{}", d.key),
        };
        let rule = build_rule(ctx, d, &here, &path, names)?;
        let node = Node {
            rule,
            children: Level::default(),
        };
        let slot = match d.value.as_deref() {
            Some(v) if v.ends_with('*') => {
                let p = v.trim_end_matches('*').to_owned();
                if level
                    .wildcard
                    .iter()
                    .any(|(k, q, _)| *k == d.key && *q == p)
                {
                    return Err(ctx.err(
                        &here,
                        format!(
                            "key `{}` with value `{v}` is configured twice at this level; keep one",
                            d.key
                        ),
                    ));
                }
                level.wildcard.push((d.key.clone(), p, node));
                level.wildcard.last_mut().map(|(_, _, n)| n)
            }
            Some(v) => {
                let k = format!("{}\0{v}", d.key);
                if level.exact.contains_key(&k) {
                    return Err(ctx.err(
                        &here,
                        format!(
                            "key `{}` with value `{v}` is configured twice at this level; keep one",
                            d.key
                        ),
                    ));
                }
                Some(level.exact.entry(k).or_insert(node))
            }
            None => {
                if level.any.contains_key(&d.key) {
                    return Err(ctx.err(
                        &here,
                        format!(
                            "key `{}` without a value is configured twice at this level; keep one",
                            d.key
                        ),
                    ));
                }
                Some(level.any.entry(d.key.clone()).or_insert(node))
            }
        };
        if let Some(node) = slot {
            build_level(
                ctx,
                &d.descriptors,
                &format!("{here}.descriptors"),
                &format!("{path}/"),
                &mut node.children,
                names,
            )?;
        }
    }
    Ok(())
}

fn build_rule(
    ctx: &FileCtx<'_>,
    d: &RawDescriptor,
    here: &str,
    path: &str,
    names: &mut BTreeMap<String, String>,
) -> Result<Option<Arc<Rule>>, String> {
    if let Some(name) = &d.fleet_limiter {
        if d.rate_limit.is_some() {
            return Err(ctx.err(&format!("{here}.rate_limit"), format!("is set beside fleet_limiter `{name}`, whose budget is the calibration's; drop one of them")));
        }
        let Some(spec) = ctx.limiters.iter().find(|l| *l.name == **name) else {
            let known: Vec<&str> = ctx.limiters.iter().map(|l| &*l.name).collect();
            return Err(ctx.err(
                &format!("{here}.fleet_limiter"),
                format!(
                    "`{name}` is not a limiter of the calibration; use one of: {}",
                    known.join(", ")
                ),
            ));
        };
        let needs_address = !matches!(spec.key, KeyKind::Global);
        if needs_address && !path_has_key(path, "remote_address") {
            return Err(ctx.err(&format!("{here}.fleet_limiter"), format!("limiter `{name}` is keyed on `{}`, which this descriptor cannot name: its path `{path}` has no `remote_address` entry; add a remote_address level above it (Envoy's remote_address action) or name a `global` limiter", spec.key)));
        }
        let unit = spec.quota.calendar_window().map_or_else(
            || unit_of_window(spec.quota.window()),
            |c| Unit::of_calendar(c.unit),
        );
        return Ok(Some(Arc::new(Rule {
            path: Arc::from(path),
            shadow: d.shadow_mode,
            name: None,
            replaces: Vec::new(),
            requests_per_unit: spec.quota.limit(),
            limit: Limit::Limiter {
                spec: Arc::new(spec.clone()),
                unit,
                mapped: true,
            },
        })));
    }
    let Some(rl) = &d.rate_limit else {
        return Ok(None);
    };
    let at = |f: &str| format!("{here}.rate_limit.{f}");
    let name = rl.name.clone().filter(|n| !n.is_empty());
    if let Some(n) = &name {
        if let Some(other) = names.insert(n.clone(), here.to_owned()) {
            return Err(ctx.err(&at("name"), format!("`{n}` is also the name of {other}; names that `replaces` refers to are unique in a domain")));
        }
    }
    let replaces = rl.replaces.iter().map(|r| r.name.clone()).collect();
    let rule = |limit: Limit, rpu: u32| Rule {
        path: Arc::from(path),
        limit,
        shadow: d.shadow_mode,
        name: name.clone(),
        replaces: Vec::new(),
        requests_per_unit: rpu,
    };
    if rl.unlimited {
        let mut r = rule(Limit::Unlimited, 0);
        r.replaces = replaces;
        return Ok(Some(Arc::new(r)));
    }
    let Some(unit_s) = rl.unit.as_deref() else {
        return Err(ctx.err(
            &at("unit"),
            "is missing; use second, minute, hour, day, week or month (or `unlimited: true`)",
        ));
    };
    let Some(unit) = Unit::parse(unit_s) else {
        return Err(ctx.err(&at("unit"), format!("`{unit_s}` is not a unit read here; use second, minute, hour, day, week or month (a year is longer than a bucket is kept)")));
    };
    let Some(rpu) = rl.requests_per_unit else {
        return Err(ctx.err(
            &at("requests_per_unit"),
            "is missing; give the number of requests allowed per unit",
        ));
    };
    let Ok(rpu) = u32::try_from(rpu) else {
        return Err(ctx.err(
            &at("requests_per_unit"),
            format!(
                "{rpu} is not a number of requests; use a whole number from 0 to {}",
                u32::MAX
            ),
        ));
    };
    let limit = match NonZeroU32::new(rpu) {
        None => Limit::Nothing(unit),
        Some(n) => Limit::Limiter {
            spec: Arc::new(rls_spec(path, unit.quota(n, rl.calendar), d.shadow_mode)),
            unit,
            mapped: false,
        },
    };
    let mut r = rule(limit, rpu);
    r.replaces = replaces;
    Ok(Some(Arc::new(r)))
}

/// Whether a descriptor path names `key` at some level.
fn path_has_key(path: &str, key: &str) -> bool {
    let body = path.splitn(3, ':').nth(2).unwrap_or("");
    body.split('/')
        .any(|seg| seg.split('=').next() == Some(key))
}

/// The longest unit whose multiple `window` is (seconds when none is).
pub(crate) fn unit_of_window(window: Duration) -> Unit {
    let s = window.as_secs();
    [Unit::Week, Unit::Day, Unit::Hour, Unit::Minute]
        .into_iter()
        .find(|u| s >= u.seconds() && s.is_multiple_of(u.seconds()))
        .unwrap_or(Unit::Second)
}

/// The key every YAML rule's buckets are named under: the descriptor's entries, digested like
/// every key.
pub(crate) fn rls_key() -> KeyKind {
    KeyKind::Header(Arc::from("rls-descriptor"))
}

/// A limiter for a YAML rule: GCRA, one unit's window, keyed on the descriptor's values.
pub(crate) fn rls_spec(name: &str, quota: Quota, shadow: bool) -> LimiterSpec {
    LimiterSpec {
        name: Arc::from(name),
        quota,
        key: rls_key(),
        routes: Vec::new(),
        except: Vec::new(),
        group: Arc::from("rls"),
        credential: Default::default(),
        mode: if shadow { Mode::Shadow } else { Mode::Enforce },
        on_store_error: Default::default(),
        new_agents: None,
        cost: Default::default(),
        count: Default::default(),
        failed_statuses: Default::default(),
        disclose: true,
        plans: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_text(text: &str) -> Result<Domains, String> {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("rl.yaml");
        std::fs::write(&p, text).unwrap();
        load(&p, &crate::config::Config::default().limiters)
    }

    const SAMPLE: &str = r#"
domain: api
descriptors:
  - key: remote_address
    rate_limit: { unit: minute, requests_per_unit: 5 }
  - key: path
    value: /slow
    rate_limit: { unit: second, requests_per_unit: 1 }
    descriptors:
      - key: user
        rate_limit: { unit: hour, requests_per_unit: 100 }
  - key: path
    value: "/v1/*"
    rate_limit: { unit: day, requests_per_unit: 0 }
  - key: path
    rate_limit: { unlimited: true }
  - key: tier
    value: free
    shadow_mode: true
    detailed_metric: true
    rate_limit: { unit: Minute, requests_per_unit: 2 }
"#;

    fn path_of(d: &Domain, e: &[(&str, &str)]) -> Option<String> {
        d.lookup(e.iter().copied()).map(|r| r.path.to_string())
    }

    #[test]
    fn lookup_follows_the_reference_order() {
        let ds = load_text(SAMPLE).unwrap();
        let d = ds.domain("api").unwrap();
        assert_eq!(
            path_of(d, &[("remote_address", "1.2.3.4")]).as_deref(),
            Some("rls:api:remote_address")
        );
        assert_eq!(
            path_of(d, &[("path", "/slow")]).as_deref(),
            Some("rls:api:path=/slow")
        );
        assert_eq!(
            path_of(d, &[("path", "/v1/x")]).as_deref(),
            Some("rls:api:path=/v1/*")
        );
        assert_eq!(
            path_of(d, &[("path", "/other")]).as_deref(),
            Some("rls:api:path")
        );
        assert_eq!(
            path_of(d, &[("path", "/slow"), ("user", "u")]).as_deref(),
            Some("rls:api:path=/slow/user")
        );
        // A deeper descriptor than the tree, or an unknown key: no rule.
        assert_eq!(path_of(d, &[("path", "/other"), ("user", "u")]), None);
        assert_eq!(path_of(d, &[("nope", "x")]), None);
        assert_eq!(path_of(d, &[]), None);
        assert!(ds.domain("other").is_none());
        let free = d.lookup([("tier", "free")].into_iter()).unwrap();
        assert!(free.shadow);
        assert_eq!(ds.rules().len(), 6);
    }

    #[test]
    fn errors_name_the_file_the_field_and_the_fix() {
        let e = load_text("domain: a\ndescriptors:\n  - key: k\n    rate_limit: { unit: fortnight, requests_per_unit: 1 }\n").unwrap_err();
        assert!(
            e.contains("rl.yaml: descriptors[0].rate_limit.unit: `fortnight`"),
            "{e}"
        );
        let e = load_text("domain: a\ndescriptors:\n  - key: k\n    rate_limt: {}\n").unwrap_err();
        assert!(
            e.contains("rl.yaml: descriptors[0]") && e.contains("rate_limt"),
            "{e}"
        );
        let e = load_text("domain: ''\n").unwrap_err();
        assert!(e.contains("domain: is empty"), "{e}");
        let e = load_text("domain: a\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: -1 }\n").unwrap_err();
        assert!(e.contains("requests_per_unit: -1 is not"), "{e}");
        let e = load_text("domain: a\ndescriptors:\n  - key: k\n    fleet_limiter: nope\n")
            .unwrap_err();
        assert!(e.contains("fleet_limiter: `nope` is not a limiter"), "{e}");
        let e = load_text("domain: a\ndescriptors:\n  - key: k\n  - key: k\n").unwrap_err();
        assert!(e.contains("configured twice"), "{e}");
        let e = load_text(": : :\n").unwrap_err();
        assert!(e.contains("rl.yaml"), "{e}");
    }

    #[test]
    fn a_mapped_descriptor_needs_an_address_to_key_on() {
        let cfg = crate::config::Config::default();
        let ip_keyed = cfg
            .limiters
            .iter()
            .find(|l| l.key == KeyKind::Ip)
            .map(|l| l.name.to_string())
            .unwrap();
        let e = load_text(&format!(
            "domain: a\ndescriptors:\n  - key: k\n    fleet_limiter: {ip_keyed}\n"
        ))
        .unwrap_err();
        assert!(e.contains("no `remote_address` entry"), "{e}");
        let ok = load_text(&format!(
            "domain: a\ndescriptors:\n  - key: remote_address\n    fleet_limiter: {ip_keyed}\n"
        ))
        .unwrap();
        let r = ok
            .domain("a")
            .unwrap()
            .lookup([("remote_address", "1.2.3.4")].into_iter())
            .unwrap();
        assert!(matches!(r.limit, Limit::Limiter { mapped: true, .. }));
    }

    #[test]
    fn hostile_trees_are_refused_not_walked() {
        let mut deep = String::from("domain: a\ndescriptors:\n");
        let mut indent = String::from("  ");
        for _ in 0..40 {
            deep.push_str(&format!("{indent}- key: k\n{indent}  descriptors:\n"));
            indent.push_str("    ");
        }
        deep.push_str(&format!("{indent}- key: k\n"));
        let e = load_text(&deep).unwrap_err();
        assert!(e.contains("nested deeper"), "{e}");
    }
}
