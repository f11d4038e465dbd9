//! `check`'s suggestions, end to end through the binary: for an unsafe configuration, read the
//! suggested TOML from `check --format json`, write it into the configuration, run `check`
//! again, and see the limiter accepted; set the limit one below the suggestion and see it is not.

mod common;

use common::{Exited, Launch};
use serde_json::Value;
use std::time::Duration;

const REPLACED: &str = "docs/examples/replaced-calibration.toml";
/// How long a command may run before the test gives up on it (a deadline, not a measurement).
const LIMIT: Duration = Duration::from_secs(300);

fn check(toml: &str, format: &str) -> Exited {
    Launch::command(["check", "--format", format])
        .current_dir(common::manifest_dir())
        .unset("FLEET_LIMITER_ALLOW_UNSAFE_CALIBRATION")
        .config_toml(toml)
        .run(LIMIT)
}

fn json(toml: &str) -> (Option<i32>, Value) {
    let o = check(toml, "json");
    let v = serde_json::from_str(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", o.stdout));
    (o.code, v)
}

fn limiter<'a>(v: &'a Value, name: &str) -> &'a Value {
    v["limiters"]
        .as_array()
        .and_then(|ls| ls.iter().find(|l| l["name"] == name))
        .unwrap_or_else(|| panic!("no limiter {name}"))
}

/// `base` with the `[limiters.NAME]` lines of `fix` set in it, as an operator pasting them
/// into the limiter's table would (a key already there takes the new value).
fn apply(base: &str, fix: &str) -> String {
    let mut cfg: toml::Table = base.parse().expect("base TOML");
    let fix: toml::Table = fix.parse().expect("suggested TOML");
    let limiters = cfg
        .entry("limiters")
        .or_insert_with(|| toml::Value::Table(toml::Table::new()))
        .as_table_mut()
        .expect("[limiters] is a table");
    for (name, lines) in fix["limiters"].as_table().expect("[limiters.NAME]") {
        let table = limiters
            .entry(name.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()
            .expect("a limiter is a table");
        for (k, v) in lines.as_table().expect("lines") {
            table.insert(k.clone(), v.clone());
        }
    }
    toml::to_string(&cfg).expect("TOML")
}

fn refused(status: &Value) -> bool {
    status == "unsafe" || status == "at-risk"
}

/// Check `base`, expect `name` refused with a suggestion, apply it and every alternative in
/// turn, and see each accepted; one unit of limit below a limit suggestion is refused still.
/// Returns the preferred fix.
fn assert_fix_holds(base: &str, name: &str) -> Value {
    let (code, v) = json(base);
    let l = limiter(&v, name);
    assert!(refused(&l["status"]), "{l:#}");
    if l["status"] == "unsafe" {
        assert_eq!(code, Some(1));
    }
    let fix = l["suggestion"].clone();
    assert!(fix.is_object(), "no suggestion: {l:#}");
    let mut all = vec![fix.clone()];
    all.extend(l["alternatives"].as_array().cloned().unwrap_or_default());
    for f in &all {
        let toml = f["toml"].as_str().expect("toml");
        assert!(toml.starts_with(&format!("[limiters.{name}]\n")), "{toml}");
        let fixed = apply(base, toml);
        let (_, after) = json(&fixed);
        let now = limiter(&after, name);
        assert!(!refused(&now["status"]), "{f:#} applied:\n{fixed}\n{now:#}");
        assert_eq!(now["status"], f["status"], "{f:#}");
        assert!(now["suggestion"].is_null(), "{now:#}");
        if f["change"] == "limit" {
            let n = f["limit"].as_u64().expect("limit");
            assert_eq!(now["limit"], n);
            let below = apply(base, &format!("[limiters.{name}]\nlimit = {}\n", n - 1));
            let (_, v) = json(&below);
            assert!(
                refused(&limiter(&v, name)["status"]),
                "limit {} is accepted too",
                n - 1
            );
        }
    }
    fix
}

#[test]
fn a_too_small_agent_budget_gets_the_limit_it_needs() {
    let base = "[limiters.agent-device]\nlimit = 2\n";
    let fix = assert_fix_holds(base, "agent-device");
    assert_eq!(fix["change"], "limit");
    assert_eq!((&fix["limit"], &fix["window"]), (&3.into(), &"1m".into()));
    assert_eq!(fix["toml"], "[limiters.agent-device]\nlimit = 3\n");
    // Three a minute is the idle cadence itself: accepted, with a warning.
    assert_eq!(fix["status"], "warning");
    let table = check(base, "table");
    assert_eq!(table.code, Some(1));
    assert!(
        table.stdout.contains(
            "fix: agent-device: safe with limit = 3 (window 1m kept), with a warning; set:\n    [limiters.agent-device]\n    limit = 3\n"
        ),
        "{}",
        table.stdout
    );
}

#[test]
fn a_too_small_heartbeat_budget_gets_the_limit_it_needs() {
    let base = "[limiters.agent-heartbeat]\nlimit = 1\nwindow = \"2m\"\nkey = \"ip+agent\"\nroutes = [\"POST /api/agent/heartbeat\"]\ngroup = \"agent\"\n";
    let fix = assert_fix_holds(base, "agent-heartbeat");
    assert_eq!((&fix["limit"], &fix["window"]), (&2.into(), &"2m".into()));
}

#[test]
fn a_nat_on_one_ip_bucket_gets_a_budget_or_a_key_per_agent() {
    let base = "[limiters.agent-device]\nkey = \"ip\"\n";
    let fix = assert_fix_holds(base, "agent-device");
    assert_eq!(fix["limit"], 750);
    let (_, v) = json(base);
    let alts = limiter(&v, "agent-device")["alternatives"].clone();
    let key = alts
        .as_array()
        .and_then(|a| a.iter().find(|f| f["change"] == "key"))
        .unwrap_or_else(|| panic!("no key alternative: {alts:#}"));
    assert_eq!(key["key"], "ip+agent");
    assert_eq!(key["toml"], "[limiters.agent-device]\nkey = \"ip+agent\"\n");
    assert_eq!(key["status"], "ok");
}

#[test]
fn count_failed_and_cost_are_shown_and_the_fix_pays_the_cost() {
    // A fixed cost of 15 leaves a limit of 30 two requests a minute; 45 carries three.
    let base = "[limiters.agent-device]\ncount = \"failed\"\ncost = 15\n";
    let (_, v) = json(base);
    let l = limiter(&v, "agent-device");
    assert_eq!(l["count"], "failed");
    assert_eq!(l["failed_statuses"], "400-999");
    assert_eq!(l["cost"], serde_json::json!({"units": 15}));
    assert_eq!(
        (&l["limit"], &l["requests_per_window"]),
        (&30.into(), &2.into())
    );
    assert_eq!(l["meter"], "requests");
    let fix = assert_fix_holds(base, "agent-device");
    assert_eq!(fix["limit"], 45);

    // A cost read from a header is judged at 1 a request; the limit never drops below cost_max.
    let base = "[limiters.enrollment]\nlimit = 5\ncount = \"failed\"\nfailed_statuses = [\"400-499\"]\ncost_header = \"X-Batch-Size\"\ncost_max = 5\n";
    let (_, v) = json(base);
    let l = limiter(&v, "enrollment");
    assert_eq!(
        l["cost"],
        serde_json::json!({"header": "x-batch-size", "max": 5})
    );
    assert_eq!(l["failed_statuses"], "400-499");
    let fix = assert_fix_holds(base, "enrollment");
    assert_eq!(
        (&fix["limit"], &fix["window"]),
        (&250.into(), &"15m".into())
    );
    let table = check(base, "table").stdout;
    let row = table
        .lines()
        .find(|l| l.starts_with("enrollment "))
        .unwrap_or_else(|| panic!("{table}"));
    for cell in ["ip", "requests", "failed 400-499", "x-batch-size max 5"] {
        assert!(row.contains(cell), "{cell}: {row}");
    }
}

#[test]
fn the_replaced_calibration_passes_with_every_suggestion_applied() {
    let original = std::fs::read_to_string(common::manifest_dir().join(REPLACED)).expect("read");
    let (_, v) = json(&original);
    let mut fixed = original.clone();
    let mut applied = 0;
    for l in v["limiters"].as_array().expect("limiters") {
        if refused(&l["status"]) {
            let name = l["name"].as_str().expect("name");
            assert_fix_holds(&original, name);
            fixed = apply(&fixed, l["suggestion"]["toml"].as_str().expect("toml"));
            applied += 1;
        }
    }
    // agent-device (a window: no limit frees a 15-minute fixed window), enrollment, download, ui.
    assert_eq!(applied, 4);
    assert_eq!(
        limiter(&v, "agent-device")["suggestion"]["change"],
        "window"
    );
    let o = Launch::command(["check", "--fail-on-risk"])
        .current_dir(common::manifest_dir())
        .config_toml(fixed.as_str())
        .run(LIMIT);
    assert_eq!(o.code, Some(0), "{fixed}\n{}", o.stdout);
    assert!(
        o.stdout.contains("safe: 0 unsafe, 0 at risk"),
        "{}",
        o.stdout
    );
    assert!(!o.stdout.contains("fix: "), "{}", o.stdout);
}

#[test]
fn a_limiter_no_value_can_fix_says_so_and_why() {
    // The ceiling forgets an agent after 1m, no longer than the 60 s between its heartbeats.
    let base = "[limiters.agent-ip]\nknown_for = \"1m\"\n";
    let (code, v) = json(base);
    assert_eq!(code, Some(1));
    let l = limiter(&v, "agent-ip");
    assert_eq!(l["status"], "unsafe");
    assert!(l["suggestion"].is_null(), "{l:#}");
    let why = l["no_fix"].as_str().expect("no_fix");
    for needle in [
        "no limit (from 1 to 4294967295), no window (from 1s to 7d) and no key",
        "forgets an agent after known_for = 1m",
    ] {
        assert!(why.contains(needle), "{needle}: {why}");
    }
    let table = check(base, "table").stdout;
    assert!(
        table.contains("no fix: agent-ip: no limit (from 1 to 4294967295)"),
        "{table}"
    );
}
