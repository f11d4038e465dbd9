//! `replay`, end to end: generated access logs (healthy fleet, agent-id rotator, hostile
//! lines, out-of-order timestamps, gzip) through the real binary, and the figures it reports.

#[macro_use]
#[path = "support/macros.rs"]
mod macros;

#[path = "support/replay_logs.rs"]
mod replay_logs;

use flate2::write::GzEncoder;
use fleet_limiter::calibration::{self, Scenario, ScenarioReport};
use fleet_limiter::Config;
use replay_logs::{agent_format, line, replay, write};
use serde_json::Value;
use std::io::Write;
use std::path::Path;
use std::process::Command;

/// `n` agents behind one NAT: a heartbeat every 60 s and a poll every 30 s, for `secs`.
fn healthy(n: u64, secs: u64) -> Vec<(u64, String)> {
    let mut out = Vec::new();
    for a in 0..n {
        let id = format!("agent-{a:03}");
        let mut t = a * 60 / n;
        while t < secs {
            out.push((
                t,
                line(t, "203.0.113.10", "POST /api/agent/heartbeat", Some(&id)),
            ));
            t += 60;
        }
        let mut t = a * 30 / n;
        while t < secs {
            out.push((
                t,
                line(t, "203.0.113.10", "GET /api/agent/tasks", Some(&id)),
            ));
            t += 30;
        }
    }
    out.sort();
    out
}

fn json(args: &[&str], logs: &[&Path]) -> Value {
    let fmt = agent_format();
    let mut all = vec!["--format", "json", "--log-format", &fmt];
    all.extend_from_slice(args);
    let out = replay(&all, logs);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("json report")
}

fn limiter<'a>(r: &'a Value, name: &str) -> &'a Value {
    r["limiters"]
        .as_array()
        .and_then(|ls| ls.iter().find(|l| l["name"] == name))
        .unwrap_or_else(|| panic!("no limiter {name} in {r}"))
}

fn simulated_fleet() -> calibration::FleetReport {
    let r = calibration::simulate(&Config::default(), &[Scenario::Fleet], 1).expect("simulate");
    match r.scenarios.into_iter().next() {
        Some(ScenarioReport::Fleet(f)) => f,
        _ => panic!("fleet report"),
    }
}

#[test]
fn a_healthy_site_is_never_refused_as_in_simulate() {
    let dir = tempfile::tempdir().unwrap();
    let lines: Vec<String> = healthy(250, 1_800).into_iter().map(|l| l.1).collect();
    let log = write(dir.path(), "healthy.log", &lines);
    let r = json(&[], &[&log]);
    assert_eq!(r["lines"], 22_500);
    assert_eq!(r["replayed"], 22_500);
    assert_eq!(r["refused"], 0);
    assert_eq!(r["malformed"], 0);
    assert_eq!(r["agents_seen"], 250);
    // simulate's fleet adds task bursts on top of the same cadences; neither loses an agent.
    let sim = simulated_fleet();
    assert_eq!(sim.agents, 250);
    assert_eq!(
        r["agents_offline"].as_array().map(Vec::len),
        Some(sim.agents_marked_offline as usize)
    );
}

#[test]
fn an_agent_id_rotator_is_refused_by_address_and_its_neighbours_are_not_lost() {
    let dir = tempfile::tempdir().unwrap();
    let mut lines = healthy(20, 600);
    // From 60 s on, one host invents a new agent id for each of 250 requests a second: twice
    // what the address budget (7500 a minute) sustains.
    for i in 0..(250 * 300) {
        let at = 60 + i / 250;
        let id = format!("rot-{i}");
        lines.push((
            at,
            line(at, "198.51.100.66", "GET /api/agent/tasks", Some(&id)),
        ));
    }
    lines.sort();
    let lines: Vec<String> = lines.into_iter().map(|l| l.1).collect();
    let log = write(dir.path(), "rotator.log", &lines);
    let r = json(&[], &[&log]);
    let refused = r["refused"].as_u64().unwrap();
    assert!(refused > 0, "{r}");
    let by_ip = limiter(&r, "agent-ip");
    assert_eq!(by_ip["refused"], refused, "{r}");
    assert_eq!(by_ip["top_refused"][0][0], "198.51.100.66", "{r}");
    assert_eq!(
        by_ip["top_refused"].as_array().map(Vec::len),
        Some(1),
        "{r}"
    );
    // The address budget refills as it goes: the rotator is admitted again within a second,
    // each time, so no lockout is longer. It stops at 360 s while refused and never comes back:
    // that last run is no lockout (nothing shows how long it would have lasted) and is not
    // counted to the end of the log, as it once was (240 s more).
    assert!(
        by_ip["longest_refusal_run_seconds"].as_f64().unwrap() <= 1.0,
        "{r}"
    );
    let unfinished = &by_ip["unfinished_refusal_runs"];
    assert_eq!(unfinished["never_seen_again"], 1, "{r}");
    assert_eq!(unfinished["longest"]["principal"], "198.51.100.66", "{r}");
    assert_eq!(
        unfinished["longest"]["ends"], "last request refused, never seen again",
        "{r}"
    );
    assert!(
        unfinished["longest"]["refused_for_seconds"]
            .as_f64()
            .unwrap()
            <= 1.0,
        "{r}"
    );
    assert_eq!(r["agents_offline"].as_array().map(Vec::len), Some(0));
}

#[test]
fn a_rollout_that_refuses_heartbeats_marks_agents_offline() {
    let dir = tempfile::tempdir().unwrap();
    // A rollout far past `fleet.max_site_endpoints`: 6000 agents behind one NAT, each
    // polling every 30 s and heartbeating every 60 s, for 10 minutes: 18000 requests a
    // minute against an address budget of 7500.
    let lines: Vec<String> = healthy(6_000, 600).into_iter().map(|l| l.1).collect();
    let log = write(dir.path(), "rollout.log", &lines);
    let r = json(&[], &[&log]);
    assert!(r["refused"].as_u64().unwrap() > 0, "{r}");
    let offline = r["agents_offline"].as_array().unwrap();
    assert!(!offline.is_empty(), "{r}");
    assert!(offline[0]["longest_gap_seconds"].as_f64().unwrap() >= 180.0);
}

#[test]
fn hostile_lines_are_counted_with_their_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let good = |t| line(t, "192.0.2.1", "GET /api/tasks", None);
    let p = dir.path().join("hostile.log");
    let mut data: Vec<u8> = Vec::new();
    data.extend(good(0).bytes().chain(*b"\n"));
    data.extend(b"not a log line\n");
    data.extend(std::iter::repeat_n(b'x', 1 << 20));
    data.push(b'\n');
    data.extend(
        good(1)
            .replace("/api/tasks", "/api/ta\0sks")
            .bytes()
            .chain(*b"\n"),
    );
    data.extend(
        good(1)
            .replace("/api/tasks", "/api/\u{e9}")
            .bytes()
            .chain(*b"\n"),
    );
    let mut bad_utf8 = good(1).into_bytes();
    let at = bad_utf8.windows(4).position(|w| w == b"/api").unwrap_or(0) + 2;
    bad_utf8[at] = 0xff;
    data.extend(bad_utf8.into_iter().chain(*b"\n"));
    data.extend(good(2).replace("2026", "9999").bytes().chain(*b"\n"));
    data.extend(
        good(3)
            .replace("192.0.2.1", "not-an-ip")
            .bytes()
            .chain(*b"\n"),
    );
    // Within the reorder window: replayed. Hours back: late.
    data.extend(good(10).bytes().chain(*b"\n"));
    data.extend(good(7).bytes().chain(*b"\n"));
    let mut hours_back = good(0);
    hours_back = hours_back.replace(":12:00:00", ":09:00:00");
    data.extend(hours_back.bytes().chain(*b"\n"));
    std::fs::write(&p, &data).unwrap();
    let r = json(&["--max-skipped", "100"], &[&p]);
    assert_eq!(r["lines"], 11, "{r}");
    assert_eq!(r["malformed"], 6, "{r}");
    assert_eq!(r["late"], 1, "{r}");
    assert_eq!(r["replayed"], 4, "{r}");
    let reasons = &r["malformed_by_reason"];
    assert_eq!(reasons["line too long"], 1, "{r}");
    assert_eq!(reasons["NUL byte or invalid UTF-8"], 2, "{r}");
    assert_eq!(reasons["timestamp unreadable or absurd"], 1, "{r}");
    assert_eq!(reasons["client address is not an IP"], 1, "{r}");
    let shown: Vec<u64> = r["first_malformed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["line"].as_u64().unwrap())
        .collect();
    assert_eq!(shown, [2, 3, 4, 6, 7], "{r}");
}

#[test]
fn gzip_is_read_by_its_magic_bytes_and_a_truncated_one_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let lines: Vec<String> = healthy(10, 600).into_iter().map(|l| l.1).collect();
    let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all((lines.join("\n") + "\n").as_bytes()).unwrap();
    let bytes = gz.finish().unwrap();
    // No `.gz` in the name: the magic bytes decide.
    let p = dir.path().join("access.log.1");
    std::fs::write(&p, &bytes).unwrap();
    let r = json(&[], &[&p]);
    assert_eq!(r["lines"], lines.len() as u64);
    assert_eq!(r["replayed"], lines.len() as u64);

    let cut = dir.path().join("cut.log.gz");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let fmt = agent_format();
    let out = replay(&["--log-format", &fmt], &[&cut]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cut.log.gz: gzip stream unreadable after line"),
        "{err}"
    );
}

#[test]
fn bad_format_and_against_side_by_side() {
    let out = replay(&["--log-format", "$remote_addr"], &[Path::new("/dev/null")]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--log-format: the format has no"));

    let dir = tempfile::tempdir().unwrap();
    // 20 healthy agents for 10 minutes, through the built-in calibration and the one it
    // replaced (100 agent requests per address per 15 minutes).
    let lines: Vec<String> = healthy(20, 600).into_iter().map(|l| l.1).collect();
    let log = write(dir.path(), "site.log", &lines);
    let fmt = agent_format();
    let out = replay(
        &[
            "--log-format",
            &fmt,
            "--against",
            "docs/examples/replaced-calibration.toml",
        ],
        &[&log],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).replace(&*log.to_string_lossy(), "site.log");
    snap!("replay_against_table", text);
}

/// 2026-11-24T12:00:00Z, `secs` later (under 12 h), as ISO 8601.
fn iso(secs: u64) -> String {
    format!(
        "2026-11-24T{:02}:{:02}:{:02}.250000Z",
        12 + secs / 3_600,
        secs / 60 % 60,
        secs % 60
    )
}

/// A small healthy site, and from 60 s an agent-id rotator at 250 requests a second for 120 s:
/// `(at, client, method, path, agent id)`.
fn site_and_rotator() -> Vec<(u64, &'static str, &'static str, &'static str, String)> {
    let mut ev = Vec::new();
    for a in 0..20u64 {
        let id = format!("agent-{a:03}");
        let mut t = a * 3;
        while t < 600 {
            ev.push((
                t,
                "203.0.113.10",
                "POST",
                "/api/agent/heartbeat",
                id.clone(),
            ));
            t += 60;
        }
        let mut t = a;
        while t < 600 {
            ev.push((t, "203.0.113.10", "GET", "/api/agent/tasks", id.clone()));
            t += 30;
        }
    }
    for i in 0..(250 * 120) {
        ev.push((
            60 + i / 250,
            "198.51.100.66",
            "GET",
            "/api/agent/tasks",
            format!("rot-{i}"),
        ));
    }
    ev.sort();
    ev
}

fn replay_as(dir: &Path, name: &str, format: &str, lines: Vec<String>) -> Value {
    let log = write(dir, name, &lines);
    let out = replay(&["--format", "json", "--log-format", format], &[&log]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("json report")
}

#[test]
fn json_lines_give_the_figures_combined_gives_and_alb_says_what_it_cannot_see() {
    let dir = tempfile::tempdir().unwrap();
    let ev = site_and_rotator();
    let combined: Vec<String> = ev
        .iter()
        .map(|(t, ip, m, p, a)| line(*t, ip, &format!("{m} {p}"), Some(a)))
        .collect();
    let fmt = agent_format();
    let base = replay_as(dir.path(), "combined.log", &fmt, combined);
    assert!(base["refused"].as_u64().unwrap() > 0, "{base}");

    // nginx `escape=json` field names, with one line per request.
    let jsonl: Vec<String> = ev
        .iter()
        .map(|(t, ip, m, p, a)| {
            format!(
                r#"{{"remote_addr":"{ip}","time_iso8601":"{}","request":"{m} {p} HTTP/1.1","status":200,"http_x_agent_id":"{a}"}}"#,
                iso(*t)
            )
        })
        .collect();
    let j = replay_as(dir.path(), "access.jsonl", "json", jsonl);
    // A pipeline's own names, through a mapping, with epoch-second timestamps.
    let mapped: Vec<String> = ev
        .iter()
        .map(|(t, ip, m, p, a)| {
            format!(
                r#"{{"client":"{ip}","ts":{}.25,"verb":"{m}","route":"{p}","agent":"{a}"}}"#,
                1_795_521_600 + t
            )
        })
        .collect();
    let k = replay_as(
        dir.path(),
        "mapped.jsonl",
        "json:addr=client,time=ts,method=verb,uri=route,agent_id=agent",
        mapped,
    );
    for (name, r) in [("json", &j), ("mapped json", &k)] {
        for field in ["lines", "replayed", "refused", "malformed", "agents_seen"] {
            assert_eq!(r[field], base[field], "{name}: {field}");
        }
        for l in ["agent-device", "agent-ip"] {
            assert_eq!(
                limiter(r, l)["refused"],
                limiter(&base, l)["refused"],
                "{name}: {l}"
            );
        }
    }

    // ALB logs name no agent: agent-keyed limiters see the site's 20 agents as one, and the
    // report says so.
    let alb: Vec<String> = ev
        .iter()
        .map(|(t, ip, m, p, _)| {
            format!(
                r#"https {} app/fleet-api/50dc6c495c0c9188 {ip}:4242 10.0.0.1:80 0.000 0.001 0.000 200 200 34 366 "{m} https://api.example.com:443{p} HTTP/1.1" "fleet-agent/2.1" ECDHE-RSA-AES128-GCM-SHA256 TLSv1.2 arn:aws:elasticloadbalancing:us-east-2:1:targetgroup/t/1 "Root=1-1" "api.example.com" "-" 0 {} "forward" "-" "-" "10.0.0.1:80" "200" "-" "-""#,
                iso(*t),
                iso(*t)
            )
        })
        .collect();
    let a = replay_as(dir.path(), "alb.log", "alb", alb);
    assert_eq!(a["lines"], base["lines"]);
    assert_eq!(a["malformed"], 0);
    assert_eq!(a["agents_seen"], 0, "{a}");
    assert!(
        a["identity"].as_str().unwrap().contains("no X-Agent-Id"),
        "{a}"
    );
    let device = limiter(&a, "agent-device");
    assert!(device["refused"].as_u64().unwrap() > 0, "{a}");
    let site = device["top_refused"]
        .as_array()
        .and_then(|t| t.iter().find(|p| p[0] == "203.0.113.10 no agent id"))
        .unwrap_or_else(|| panic!("the healthy site's address is refused: {a}"));
    assert!(site[1].as_u64().unwrap() > 0, "{a}");
    // With agent ids logged the same site is never refused.
    let named = limiter(&base, "agent-device")["top_refused"].to_string();
    assert!(!named.contains("203.0.113.10"), "{named}");
}

/// The numbers a plotted series carries (`data-values`), summed.
fn plotted(svg: &str, panel: &str, calibration: usize, series: &str) -> u64 {
    let start = svg
        .find(&format!(
            r#"<g data-panel="{panel}" data-calibration="{calibration}" "#
        ))
        .unwrap_or_else(|| panic!("no panel {panel} #{calibration}"));
    let g = &svg[start..start + svg[start..].find("</g>").expect("panel end")];
    let at = g
        .find(&format!(r#"data-series="{series}""#))
        .unwrap_or_else(|| panic!("no series {series} in {panel}"));
    let values = &g[at..];
    let v = values.split("data-values=\"").nth(1).expect("values");
    v[..v.find('"').expect("end")]
        .split(' ')
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<f64>().expect("number") as u64)
        .sum()
}

#[test]
fn the_plot_carries_the_figures_of_both_calibrations() {
    let dir = tempfile::tempdir().unwrap();
    let ev = site_and_rotator();
    let lines: Vec<String> = ev
        .iter()
        .map(|(t, ip, m, p, a)| line(*t, ip, &format!("{m} {p}"), Some(a)))
        .collect();
    let log = write(dir.path(), "site.log", &lines);
    let svg_path = dir.path().join("replay.svg");
    let fmt = agent_format();
    let out = replay(
        &[
            "--format",
            "json",
            "--log-format",
            &fmt,
            "--against",
            "docs/examples/replaced-calibration.toml",
            "--plot",
            svg_path.to_str().unwrap(),
        ],
        &[&log],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reports: Value = serde_json::from_slice(&out.stdout).expect("json");
    let svg = std::fs::read_to_string(&svg_path).expect("the plot");
    assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(80)]);
    for (i, r) in reports.as_array().expect("two reports").iter().enumerate() {
        for l in r["limiters"].as_array().unwrap() {
            let name = l["name"].as_str().unwrap();
            let metered = l["metered"].as_u64().unwrap();
            if metered == 0 {
                continue;
            }
            let panel = format!("replay-{name}");
            let refused = l["refused"].as_u64().unwrap() + l["shadow_refused"].as_u64().unwrap();
            assert_eq!(plotted(&svg, &panel, i, "refused"), refused, "{name} #{i}");
            assert_eq!(
                plotted(&svg, &panel, i, "admitted"),
                metered - refused,
                "{name} #{i}"
            );
        }
    }
    // A plot that cannot be written is refused before the run.
    let out = replay(&["--plot", "/nonexistent/dir/x.svg"], &[&log]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--plot"));
}

/// `fleet-limiter simulate` with the given arguments, its JSON report.
fn simulate_emitting(args: &[&str]) -> Value {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fleet-limiter"));
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    for (k, _) in std::env::vars() {
        if k.starts_with("FLEET_LIMITER_") {
            c.env_remove(k);
        }
    }
    let out = c
        .arg("simulate")
        .args(["--format", "json"])
        .args(args)
        .output()
        .expect("run simulate");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("simulate json")
}

#[test]
fn the_traffic_simulate_sends_replays_to_the_figures_simulate_reports() {
    let dir = tempfile::tempdir().unwrap();
    for config in [None, Some("docs/examples/replaced-calibration.toml")] {
        for scenario in ["fleet", "rollout"] {
            let log = dir.path().join(format!("{scenario}.jsonl"));
            let mut args = vec!["--scenario", scenario, "--emit-log", log.to_str().unwrap()];
            let mut rargs = vec!["--format", "json", "--log-format", "json"];
            if let Some(c) = config {
                args.extend(["--config", c]);
                rargs.extend(["--config", c]);
            }
            let sim = simulate_emitting(&args);
            let s = &sim["scenarios"][0];
            let out = replay(&rargs, &[&log]);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let r: Value = serde_json::from_slice(&out.stdout).expect("replay json");
            let what = format!(
                "{scenario} on {}",
                config.unwrap_or("the built-in calibration")
            );
            assert_eq!(r["malformed"], 0, "{what}");
            assert_eq!(r["late"], 0, "{what}");
            assert_eq!(r["replayed"], s["requests"], "{what}");
            assert_eq!(r["refused"], s["refused"], "{what}");
            if scenario == "fleet" {
                assert_eq!(
                    r["agents_offline"].as_array().map(Vec::len).unwrap_or(0) as u64,
                    s["agents_marked_offline"].as_u64().unwrap(),
                    "{what}"
                );
            }
        }
    }
    // On the replaced calibration both scenarios lose: the comparison is not of zeros.
    let r = simulate_emitting(&[
        "--scenario",
        "fleet",
        "--config",
        "docs/examples/replaced-calibration.toml",
    ]);
    assert!(r["scenarios"][0]["agents_marked_offline"].as_u64().unwrap() > 0);
    // Traffic of several scenarios would overlap in time: one at a time.
    let mut c = Command::new(env!("CARGO_BIN_EXE_fleet-limiter"));
    let out = c
        .args([
            "simulate",
            "--emit-log",
            dir.path().join("all.jsonl").to_str().unwrap(),
        ])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
}

/// The healthy site's lines with `extra` inserted, each before the line at its index in the
/// healthy list (ascending).
fn with_inserted(extra: &[(usize, String)]) -> Vec<String> {
    let mut lines: Vec<String> = healthy(20, 600).into_iter().map(|l| l.1).collect();
    for (at, l) in extra.iter().rev() {
        lines.insert(*at, l.clone());
    }
    lines
}

fn dated_2099(secs: u64) -> String {
    line(
        secs,
        "203.0.113.10",
        "POST /api/agent/heartbeat",
        Some("agent-000"),
    )
    .replace("/2026:", "/2099:")
}

#[test]
fn a_line_dated_2099_is_set_aside_and_named_instead_of_voiding_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let healthy_lines = healthy(20, 600).len() as u64;
    // At the top of the log: before, every other line was late and the exit status was 0.
    let top = write(dir.path(), "top.log", &with_inserted(&[(0, dated_2099(0))]));
    let r = json(&[], &[&top]);
    assert_eq!(r["outliers"], 1, "{r}");
    assert_eq!(r["late"], 0, "{r}");
    assert_eq!(r["replayed"], healthy_lines, "{r}");
    assert_eq!(r["refused"], 0, "{r}");
    let o = &r["first_outliers"][0];
    assert_eq!(o["line"], 1, "{r}");
    assert!(o["file"].as_str().unwrap().ends_with("top.log"), "{r}");
    assert!(
        o["dated"]
            .as_str()
            .unwrap()
            .starts_with("2099-11-24T12:00:00"),
        "{r}"
    );
    assert!(
        o["ahead_seconds"].as_f64().unwrap() > 72.0 * 365.0 * 86_400.0,
        "{r}"
    );

    // The table and stderr say it too, once with --against.
    let fmt = agent_format();
    let out = replay(
        &[
            "--log-format",
            &fmt,
            "--against",
            "docs/examples/replaced-calibration.toml",
        ],
        &[&top],
    );
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stdout
            .matches("outliers: 1 set aside, not replayed")
            .count(),
        2,
        "{stdout}"
    );
    assert!(
        stdout.contains("top.log:1: dated 2099-11-24T12:00:00"),
        "{stdout}"
    );
    assert!(stdout.contains("late 0 "), "{stdout}");
    assert_eq!(
        stderr
            .matches("1 line set aside as an outlier, not replayed")
            .count(),
        1,
        "{stderr}"
    );
    assert_eq!(
        stderr.matches("top.log:1: dated 2099-").count(),
        1,
        "{stderr}"
    );

    // Three in the middle, each named by its line number.
    let middle = write(
        dir.path(),
        "middle.log",
        &with_inserted(&[
            (100, dated_2099(100)),
            (150, dated_2099(150)),
            (150, dated_2099(150)),
        ]),
    );
    let r = json(&[], &[&middle]);
    assert_eq!(r["outliers"], 3, "{r}");
    assert_eq!(r["late"], 0, "{r}");
    assert_eq!(r["replayed"], healthy_lines, "{r}");
    let lines: Vec<u64> = r["first_outliers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["line"].as_u64().unwrap())
        .collect();
    assert_eq!(lines, [101, 152, 153], "{r}");
}

#[test]
fn a_log_whose_lines_are_mostly_late_exits_1_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let good = |t| line(t, "192.0.2.1", "GET /api/tasks", None);
    // Twenty lines ten minutes on, then sixty from before them: the sixty are late.
    let mut lines: Vec<String> = (0..20).map(|i| good(600 + i)).collect();
    lines.extend((0..60).map(good));
    let log = write(dir.path(), "unsorted.log", &lines);
    let fmt = agent_format();
    let out = replay(&["--format", "json", "--log-format", &fmt], &[&log]);
    assert_eq!(out.status.code(), Some(1));
    let r: Value = serde_json::from_slice(&out.stdout).expect("json report");
    assert_eq!(
        (r["late"].as_u64(), r["replayed"].as_u64()),
        (Some(60), Some(20)),
        "{r}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("late: 60 lines (75 %) dated more than the reorder window (120 s)"),
        "{stderr}"
    );
    // The line at 0 s came 619 s after the newest: a second more, to the minute.
    assert!(
        stderr.contains(
            "fix: --reorder-seconds 660 (the late lines were out of order by up to 619 s)"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("exit status 1: 60 of 80 lines (75 %) were not replayed"),
        "{stderr}"
    );
    // With the window it names, every line is replayed and the exit status is 0.
    let out = replay(
        &[
            "--format",
            "json",
            "--log-format",
            &fmt,
            "--reorder-seconds",
            "660",
        ],
        &[&log],
    );
    assert_eq!(out.status.code(), Some(0));
    let r: Value = serde_json::from_slice(&out.stdout).expect("json report");
    assert_eq!(
        (r["late"].as_u64(), r["replayed"].as_u64()),
        (Some(0), Some(80)),
        "{r}"
    );
}

/// A calendar day counts by the log's own dates: two reports a day, the third at 23:59:50 UTC
/// refused, the fourth at 00:00:01 allowed (a new day); the same budget over `window = "1d"`
/// refuses both: a bucket of two a day has not refilled a minute later.
#[test]
fn a_calendar_day_turns_at_the_logs_midnight() {
    let dir = tempfile::tempdir().unwrap();
    // T0 is 12:00:00 UTC: 43 140 s later is 23:59:00.
    let lines: Vec<String> = [43_140, 43_170, 43_190, 43_201]
        .iter()
        .map(|t| line(*t, "203.0.113.9", "GET /api/reports/daily", None))
        .collect();
    let log = write(dir.path(), "reports.log", &lines);
    let refused = |window: &str| {
        let cfg = dir.path().join(format!("reports-{window}.toml"));
        std::fs::write(
            &cfg,
            format!("[limiters.reports]\nlimit = 2\nwindow = \"{window}\"\nkey = \"ip\"\nroutes = [\"GET /api/reports/**\"]\n"),
        )
        .unwrap();
        let r = json(&["--config", cfg.to_str().unwrap()], &[&log]);
        limiter(&r, "reports")["refused"].as_u64().unwrap()
    };
    assert_eq!(refused("day"), 1, "the fourth report is on a new day");
    assert_eq!(
        refused("1d"),
        2,
        "a day-long bucket does not turn at midnight"
    );
}
