//! `replay` on logs shaped like real ones, end to end through the real binary: written in
//! completion order (timestamps up to a minute out of order, as Apache writes them), a few
//! truncated lines, routes no limiter meters, gzip; the summary of what was skipped and the
//! option that fixes it, `--max-skipped`, the statement that nothing matched, unfinished refusal
//! runs, the plot's numbers against the report's, and memory whatever the timestamps do.

#[path = "support/replay_logs.rs"]
mod replay_logs;
#[path = "support/svg.rs"]
mod svg;

use replay_logs::*;
use serde_json::Value;
use svg::{attr, texts};

/// A deterministic stream of numbers (a 64-bit LCG), so every run writes the same log.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n.max(1)
    }
}

/// A site's public pages, none under `/api/`: no limiter of the built-in calibration (nor of
/// the one it replaced) meters them.
const PAGES: [&str; 5] = [
    "/index.html",
    "/images/kibana-search.png",
    "/blog/tags/release",
    "/presentations/logstash/plugin/highlight.js",
    "/favicon.ico",
];

/// `n` requests, two arriving a second, each logged when it completes but stamped with its
/// arrival (Apache `%t`), so lines are out of order by up to `slowest` seconds; one request in
/// twenty takes between a tenth of `slowest` and all of it. Every thousandth line is cut short
/// (a line without its closing quote, as a crashed writer leaves it). Returns the lines and
/// how many are cut.
fn completion_order_log(n: u64, slowest: u64) -> (Vec<String>, u64) {
    let mut rng = Lcg(7);
    let mut done: Vec<(u64, u64, String)> = (0..n)
        .map(|i| {
            let arrival = T0 + i / 2;
            let took = match rng.below(20) {
                0 => slowest / 10 + rng.below(slowest - slowest / 10 + 1),
                1..=3 => rng.below(6),
                _ => rng.below(2),
            };
            let ip = format!("198.51.{}.{}", rng.below(4), 1 + rng.below(250));
            let page = PAGES[rng.below(PAGES.len() as u64) as usize];
            let line = format!(
                r#"{ip} - - [{}] "GET {page} HTTP/1.1" 200 5120 "-" "Mozilla/5.0 (X11; Linux x86_64)""#,
                clf(arrival)
            );
            (arrival + took, i, line)
        })
        .collect();
    done.sort();
    let mut cut = 0;
    let lines = done
        .into_iter()
        .enumerate()
        .map(|(k, (_, _, l))| {
            if k % 1000 == 999 {
                cut += 1;
                l[..l.len() - 12].to_owned()
            } else {
                l
            }
        })
        .collect();
    (lines, cut)
}

/// The value `--reorder-seconds` is given in `text`'s first fix naming it.
fn named_window(text: &str) -> u64 {
    let at = text
        .find("fix: --reorder-seconds ")
        .unwrap_or_else(|| panic!("no --reorder-seconds fix in:\n{text}"));
    text[at + "fix: --reorder-seconds ".len()..]
        .split(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no value after --reorder-seconds in:\n{text}"))
}

#[test]
fn a_log_written_in_completion_order_replays_whole_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let (lines, cut) = completion_order_log(3_000, 60);
    assert_eq!(cut, 3);
    let plain = write(dir.path(), "access.log", &lines);
    let gz = write_gz(dir.path(), "access.log.1", &lines);
    for log in [&plain, &gz] {
        let out = replay(&["--format", "json"], &[log]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(0), "{err}");
        let r = report(&out);
        assert_eq!(r["lines"], 3_000, "{r}");
        assert_eq!(
            (&r["replayed"], &r["late"], &r["outliers"], &r["malformed"]),
            (
                &Value::from(2_997),
                &Value::from(0),
                &Value::from(0),
                &Value::from(3)
            ),
            "{r}"
        );
        assert_eq!(r["reorder_seconds"], 120, "{r}");
        // The three cut lines are said even below --max-skipped, with their share.
        assert!(
            err.contains("3 of 3000 lines (0.1 %) not replayed"),
            "{err}"
        );
        assert_eq!(r["not_replayed"], 3, "{r}");
        assert_eq!(r["skipped"][0]["reason"], "malformed", "{r}");
        assert_eq!(r["skipped"][0]["lines"], 3, "{r}");
        assert_eq!(r["skipped"][0]["percent"], 0.1, "{r}");
    }
    // The generator is hostile: the old 5 s window loses most of the log, and names the window
    // that recovers it.
    let out = replay(&["--format", "json", "--reorder-seconds", "5"], &[&plain]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let r = report(&out);
    assert!(
        r["late"].as_u64().unwrap() + r["outliers"].as_u64().unwrap() > 100,
        "{r}"
    );
    let w = named_window(&stderr(&out));
    assert!((60..=70).contains(&w), "{w}");
}

#[test]
fn a_log_out_of_order_past_the_window_exits_1_naming_a_window_that_works() {
    let dir = tempfile::tempdir().unwrap();
    // Upstreams with a five-minute timeout: lines up to 300 s out of order.
    let (lines, cut) = completion_order_log(3_000, 300);
    let log = write_gz(dir.path(), "slow.log.gz", &lines);
    let out = replay(&["--format", "json"], &[&log]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let r = report(&out);
    assert!(r["late"].as_u64().unwrap() > 30, "{r}");
    assert!(err.contains("late: "), "{err}");
    assert!(
        err.contains("dated more than the reorder window (120 s)"),
        "{err}"
    );
    assert!(err.contains("exit status 1: "), "{err}");
    assert!(err.contains("more than --max-skipped 1 % allows"), "{err}");
    let w = named_window(&err);
    assert!((130..=310).contains(&w), "{w}\n{err}");
    // The table says the same.
    let table = replay(&[], &[&log]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains(&format!("fix: --reorder-seconds {w} ")),
        "{text}"
    );
    // With the window it named, every well-formed line is replayed and the exit status is 0.
    let w = w.to_string();
    let out = replay(&["--format", "json", "--reorder-seconds", &w], &[&log]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let r = report(&out);
    assert_eq!(
        (
            r["late"].as_u64(),
            r["outliers"].as_u64(),
            r["replayed"].as_u64()
        ),
        (Some(0), Some(0), Some(3_000 - cut)),
        "{r}"
    );
}

#[test]
fn alb_on_a_combined_log_exits_1_naming_combined_unless_max_skipped_lets_it() {
    let dir = tempfile::tempdir().unwrap();
    let (lines, _) = completion_order_log(500, 60);
    let log = write(dir.path(), "access.log", &lines);
    let out = replay(&["--log-format", "alb"], &[&log]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("500 of 500 lines (100 %) not replayed"),
        "{err}"
    );
    assert!(
        err.contains("fix: --log-format combined (it reads 64 of the first 64 malformed lines)"),
        "{err}"
    );
    let out = replay(
        &[
            "--log-format",
            "alb",
            "--max-skipped",
            "100%",
            "--format",
            "json",
        ],
        &[&log],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("500 of 500 lines (100 %) not replayed"),
        "{err}"
    );
    assert!(err.contains("--log-format combined"), "{err}");
    let r = report(&out);
    assert_eq!(r["max_skipped_percent"], 100.0, "{r}");
    assert!(
        r["skipped"][0]["fix"]
            .as_str()
            .unwrap()
            .starts_with("--log-format combined"),
        "{r}"
    );
    assert_eq!(
        r["no_limiter_matched"], "No request matched any limiter: no line was replayed",
        "{r}"
    );
}

#[test]
fn max_skipped_takes_a_share_from_0_to_100_and_refuses_anything_else() {
    let dir = tempfile::tempdir().unwrap();
    let (lines, _) = completion_order_log(3_000, 60);
    let log = write(dir.path(), "access.log", &lines);
    for bad in ["-1", "101", "abc", "5%%", "", "nan", "1e2", "100.5"] {
        let out = replay(&["--max-skipped", bad], &[&log]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert!(err.contains("--max-skipped"), "{bad}: {err}");
        assert!(err.contains("from 0 to 100"), "{bad}: {err}");
        assert!(out.stdout.is_empty(), "{bad}");
    }
    // Three lines of 3000 cut short: 0.1 %, more than 0 and not more than 0.1.
    for (share, code) in [("0", 1), ("0.05%", 1), ("0.1", 0), ("0.1%", 0), ("100", 0)] {
        let out = replay(&["--max-skipped", share], &[&log]);
        assert_eq!(out.status.code(), Some(code), "{share}: {}", stderr(&out));
        assert!(stderr(&out).contains("3 of 3000 lines (0.1 %) not replayed"));
    }
    // --help says what the exit status means.
    let help = command().args(["replay", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("--max-skipped <PERCENT>"), "{help}");
    assert!(help.contains("Exit status: 0 when"), "{help}");
}

#[test]
fn no_match_is_stated_in_the_table_the_json_and_the_plot_for_each_calibration() {
    let dir = tempfile::tempdir().unwrap();
    let (lines, _) = completion_order_log(1_000, 60);
    let log = write(dir.path(), "access.log", &lines);
    let svg = dir.path().join("replay.svg");
    let svg_arg = svg.to_str().unwrap();
    let against = ["--against", "docs/examples/replaced-calibration.toml"];
    for with_against in [false, true] {
        let extra: &[&str] = if with_against { &against } else { &[] };
        let mut args = vec!["--format", "json", "--plot", svg_arg];
        args.extend_from_slice(extra);
        let out = replay(&args, &[&log]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let json = report(&out);
        let reports: Vec<Value> = match json {
            Value::Array(a) => a,
            one => vec![one],
        };
        assert_eq!(reports.len(), 1 + usize::from(with_against));
        let plot = std::fs::read_to_string(&svg).unwrap();
        for (i, r) in reports.iter().enumerate() {
            assert_eq!(r["matched"], 0, "{r}");
            assert_eq!(r["unmetered"], 999, "{r}");
            assert_eq!(r["unmetered_percent"], 100.0, "{r}");
            assert_eq!(r["limiters"].as_array().map(Vec::len), Some(0), "{r}");
            let said = r["no_limiter_matched"].as_str().unwrap();
            assert!(said.starts_with("No request matched any limiter: none of the 999"));
            let panel = format!(r#"data-panel="replay-no-match" data-calibration="{i}""#);
            assert_eq!(plot.matches(&panel).count(), 1, "{plot}");
            assert!(plot.contains(&format!(">{said}</text>")), "{plot}");
        }
        let mut args = extra.to_vec();
        args.push("--max-skipped=100");
        let out = replay(&args, &[&log]);
        let table = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            table
                .matches("No request matched any limiter: none of the 999 replayed requests")
                .count(),
            reports.len(),
            "{table}"
        );
        assert_eq!(
            table
                .matches("unmetered 999 (100 % of the replayed requests matched no limiter)")
                .count(),
            reports.len(),
            "{table}"
        );
    }
}
/// Agents that run into `agent-device` (30 a minute per agent) in each way a refusal run can
/// end, with one agent heartbeating every minute so the log runs to 900 s.
fn refusal_runs_log() -> Vec<String> {
    let mut ev: Vec<(u64, String)> = Vec::new();
    let mut burst = |at: u64, ip: &str, req: &str, agent: &str| {
        for _ in 0..100 {
            ev.push((at, line(at, ip, req, Some(agent))));
        }
    };
    // Refused from 100 s, admitted again at 130 s, still asking within the limiter's minute:
    // a lockout of 30 s.
    burst(100, "10.0.0.3", "GET /api/agent/tasks", "locked");
    // Refused at 120 s and never seen again.
    burst(120, "10.0.0.1", "GET /api/agent/tasks", "gone");
    // Refused at 895 s, five seconds before the log ends: still refused at its end.
    burst(895, "10.0.0.2", "GET /api/agent/tasks", "stuck");
    // Heartbeats every minute to 300 s, then a burst whose last ones are refused, then silence.
    burst(310, "10.0.0.4", "POST /api/agent/heartbeat", "hb-gone");
    let mut ev2 = ev;
    ev2.push((
        130,
        line(130, "10.0.0.3", "GET /api/agent/tasks", Some("locked")),
    ));
    for t in (0..=300).step_by(60) {
        ev2.push((
            t,
            line(t, "10.0.0.4", "POST /api/agent/heartbeat", Some("hb-gone")),
        ));
    }
    for t in (0..=900).step_by(60) {
        ev2.push((
            t,
            line(t, "10.0.0.9", "POST /api/agent/heartbeat", Some("steady")),
        ));
    }
    ev2.sort_by_key(|(t, _)| *t);
    ev2.into_iter().map(|(_, l)| l).collect()
}

#[test]
fn refusal_runs_no_admitted_request_ended_are_not_lockouts() {
    let dir = tempfile::tempdir().unwrap();
    let log = write(dir.path(), "agents.log", &refusal_runs_log());
    let fmt = agent_format();
    let out = replay(&["--format", "json", "--log-format", &fmt], &[&log]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let r = report(&out);
    let device = r["limiters"]
        .as_array()
        .and_then(|ls| ls.iter().find(|l| l["name"] == "agent-device"))
        .unwrap_or_else(|| panic!("agent-device in {r}"));
    // The lockout is the one an admitted request ended, not a run counted to the log's end
    // (780 s for `gone`, which the report used to give).
    assert_eq!(device["longest_refusal_run_seconds"], 30.0, "{r}");
    assert_eq!(
        device["longest_refusal_run_principal"], "10.0.0.3 agent locked",
        "{r}"
    );
    let u = &device["unfinished_refusal_runs"];
    assert_eq!(u["still_refused_at_end"], 1, "{r}");
    // `gone` and `hb-gone`.
    assert_eq!(u["never_seen_again"], 2, "{r}");
    // The heartbeat agent's refused heartbeats spanned no time: not offline, though its last
    // heartbeat was refused 590 s before the log ends.
    assert_eq!(r["agents_offline"].as_array().map(Vec::len), Some(0), "{r}");
    assert_eq!(r["agents_last_heartbeat_refused"], 1, "{r}");
    let out = replay(&["--log-format", &fmt], &[&log]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("longest lockout 30 s (10.0.0.3 agent locked)"),
        "{table}"
    );
    assert!(
        table.contains("unfinished refusal runs (not lockouts): 1 still refused at the end of the log, 2 last request refused, never seen again, 0 left refused, admitted when it came back after the window"),
        "{table}"
    );
}

/// An agent refused in a burst that comes back the next day and is admitted: no lockout
/// happened (it stopped asking), so the longest lockout is 0 s and the run is reported as one
/// that ended on its return; with a second agent that keeps asking through its refusals and
/// is admitted within the limiter's minute, that one is the lockout.
#[test]
fn a_principal_that_returns_a_day_later_was_not_locked_out() {
    let dir = tempfile::tempdir().unwrap();
    let fmt = agent_format();
    let day = 86_400;
    let mut returns: Vec<(u64, String)> = (0..100)
        .map(|_| {
            (
                100,
                line(100, "10.0.0.5", "GET /api/agent/tasks", Some("returns")),
            )
        })
        .collect();
    returns.push((
        100 + day,
        line(
            100 + day,
            "10.0.0.5",
            "GET /api/agent/tasks",
            Some("returns"),
        ),
    ));
    let device = |lines: &[(u64, String)], name: &str| {
        let mut lines = lines.to_vec();
        lines.sort_by_key(|(t, _)| *t);
        let lines: Vec<String> = lines.into_iter().map(|(_, l)| l).collect();
        let log = write(dir.path(), name, &lines);
        let out = replay(&["--format", "json", "--log-format", &fmt], &[&log]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let r = report(&out);
        let device = r["limiters"]
            .as_array()
            .and_then(|ls| ls.iter().find(|l| l["name"] == "agent-device"))
            .cloned()
            .unwrap_or_else(|| panic!("agent-device in {r}"));
        let table =
            String::from_utf8_lossy(&replay(&["--log-format", &fmt], &[&log]).stdout).into_owned();
        (device, table)
    };

    // Without a lockout: 0 s, and the run ended on the return a day later.
    let (d, table) = device(&returns, "returns.log");
    assert!(d["refused"].as_u64() > Some(0), "{d}");
    assert_eq!(d["longest_refusal_run_seconds"], 0.0, "{d}");
    assert_eq!(d["longest_refusal_run_principal"], Value::Null, "{d}");
    let u = &d["unfinished_refusal_runs"];
    assert_eq!(u["returned_later"], 1, "{d}");
    assert_eq!(
        u["longest"]["ends"], "left refused, admitted when it came back after the window",
        "{d}"
    );
    assert_eq!(u["longest"]["principal"], "10.0.0.5 agent returns", "{d}");
    assert!(table.contains("longest lockout 0 s"), "{table}");

    // With one: an agent refused from 200 s that asks again at 230 s and is admitted.
    let mut both = returns.clone();
    both.extend((0..100).map(|_| {
        (
            200,
            line(200, "10.0.0.6", "GET /api/agent/tasks", Some("kept")),
        )
    }));
    both.push((
        230,
        line(230, "10.0.0.6", "GET /api/agent/tasks", Some("kept")),
    ));
    let (d, table) = device(&both, "both.log");
    assert_eq!(d["longest_refusal_run_seconds"], 30.0, "{d}");
    assert_eq!(
        d["longest_refusal_run_principal"], "10.0.0.6 agent kept",
        "{d}"
    );
    assert_eq!(d["unfinished_refusal_runs"]["returned_later"], 1, "{d}");
    assert!(
        table.contains("longest lockout 30 s (10.0.0.6 agent kept)"),
        "{table}"
    );
}

/// The numbers in `text`, in order.
fn numbers(text: &str) -> Vec<f64> {
    text.split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter_map(|w| w.trim_matches('.').parse().ok())
        .collect()
}

/// `replay` of the refusal runs' log, under a long path, against the replaced calibration too,
/// with a plot: the two reports and the plot.
fn replay_with_a_plot(dir: &std::path::Path) -> (Vec<Value>, String) {
    // A long name: the title must be shortened, not cut off by the page.
    let deep = dir.join("x".repeat(120)).join("y".repeat(120));
    std::fs::create_dir_all(&deep).unwrap();
    let log = write(
        &deep,
        &format!("{}.log", "z".repeat(150)),
        &refusal_runs_log(),
    );
    let svg_path = dir.join("replay.svg");
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
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let reports = report(&out);
    let reports = reports.as_array().expect("two reports").clone();
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    (reports, svg)
}

/// Each calibration's summary line.
fn assert_summaries_are_the_reports(all: &[(String, String)], reports: &[Value], svg: &str) {
    let summaries: Vec<&(String, String)> = all
        .iter()
        .filter(|(a, _)| a.contains("data-summary"))
        .collect();
    assert_eq!(summaries.len(), 2, "{svg}");
    for (i, (attrs, body)) in summaries.iter().enumerate() {
        let r = &reports[i];
        let n = |k: &str| r[k].as_f64().unwrap();
        assert!(body.starts_with("replayed "), "{body}");
        let shown = numbers(body);
        assert_eq!(
            shown,
            [
                n("replayed"),
                n("lines"),
                n("not_replayed"),
                n("not_replayed_percent"),
                n("refused"),
                n("unmetered"),
                n("unmetered_percent")
            ],
            "{body}"
        );
        for (a, k) in [("data-matched", "matched"), ("data-refused", "refused")] {
            assert_eq!(attr(attrs, a), Some(r[k].to_string().as_str()), "{attrs}");
        }
    }
}

/// A limiter's chart `g` (calibration `i`): its headline and its series are the limiter's
/// numbers `l`.
fn assert_chart_is_the_limiters(g: &str, l: &Value, name: &str, i: usize) {
    let panel = texts(g);
    let headline = &panel
        .iter()
        .find(|(_, b)| b.contains(" metered, "))
        .expect("headline")
        .1;
    let u = &l["unfinished_refusal_runs"];
    let parts: Vec<&str> = headline.split("; ").collect();
    assert_eq!(
        numbers(parts[0]),
        [
            l["metered"].as_f64().unwrap(),
            l["refused"].as_f64().unwrap(),
            l["shadow_refused"].as_f64().unwrap()
        ],
        "{headline}"
    );
    let lockout = parts[1].strip_prefix("longest lockout ").expect(headline);
    assert_eq!(
        lockout
            .split(" s")
            .next()
            .and_then(|v| v.parse::<f64>().ok()),
        l["longest_refusal_run_seconds"].as_f64(),
        "{headline}"
    );
    if let Some(p) = l["longest_refusal_run_principal"].as_str() {
        assert!(lockout.contains(&format!("({p})")), "{headline}");
    }
    assert_eq!(
        numbers(parts[2]),
        [(u["still_refused_at_end"].as_u64().unwrap()
            + u["never_seen_again"].as_u64().unwrap()
            + u["returned_later"].as_u64().unwrap()) as f64],
        "{headline}"
    );
    let sum = |series: &str| -> u64 {
        let at = g.find(&format!(r#"data-series="{series}""#)).expect(series);
        let v = g[at..].split("data-values=\"").nth(1).unwrap();
        v[..v.find('"').unwrap()]
            .split(' ')
            .map(|x| x.parse::<u64>().unwrap())
            .sum()
    };
    let refused = l["refused"].as_u64().unwrap() + l["shadow_refused"].as_u64().unwrap();
    assert_eq!(sum("refused"), refused, "{name} #{i}");
    assert_eq!(sum("admitted"), l["metered"].as_u64().unwrap() - refused);
}

/// Each limiter's panel, in each calibration: its headline and its series, or a note that it
/// metered nothing. How many charts and how many notes.
fn assert_panels_are_the_reports(svg: &str, reports: &[Value]) -> (usize, usize) {
    let mut charts = 0;
    let mut notes = 0;
    for (i, r) in reports.iter().enumerate() {
        for name in ["agent-device", "agent-ip"] {
            let l = r["limiters"]
                .as_array()
                .unwrap()
                .iter()
                .find(|l| l["name"] == name);
            let start = svg
                .find(&format!(
                    r#"<g data-panel="replay-{name}" data-calibration="{i}" "#
                ))
                .unwrap_or_else(|| panic!("no panel for {name} #{i}: every calibration has one"));
            let g = &svg[start..start + svg[start..].find("</g>").unwrap()];
            let Some(l) = l.filter(|l| l["metered"].as_u64() > Some(0)) else {
                assert!(g.contains(r#"data-metered="0""#), "{g}");
                assert!(g.contains(&format!("No request matched {name} in ")), "{g}");
                notes += 1;
                continue;
            };
            charts += 1;
            assert_chart_is_the_limiters(g, l, name, i);
        }
    }
    (charts, notes)
}

/// No text leaves the page: each one's estimated width (0.6 of its size per character, 0.66
/// bold) lies within the view box; the long file name is shortened.
fn assert_no_text_leaves_the_page(all: &[(String, String)], svg: &str) {
    let width: f64 = attr(&svg[4..], "width").unwrap().parse().unwrap();
    let mut shortened = 0;
    for (attrs, body) in all {
        if attrs.contains("transform=") {
            continue;
        }
        let x: f64 = attr(attrs, "x").unwrap().parse().unwrap();
        let size: f64 = attr(attrs, "font-size").map_or(12.0, |s| s.parse().unwrap());
        let em = if attrs.contains("font-weight=\"bold\"") {
            0.66
        } else {
            0.6
        };
        let w = body.chars().count() as f64 * size * em;
        let (from, to) = match attr(attrs, "text-anchor") {
            Some("end") => (x - w, x),
            Some("middle") => (x - w / 2.0, x + w / 2.0),
            _ => (x, x + w),
        };
        assert!(
            from >= 0.0 && to <= width,
            "{from:.0}..{to:.0} of {width}: {body}"
        );
        shortened += usize::from(body.contains('…'));
    }
    assert!(shortened >= 1, "the long file name is shortened: {svg}");
}

#[test]
fn every_number_on_the_plot_is_the_reports_and_no_text_leaves_the_page() {
    let dir = tempfile::tempdir().unwrap();
    let (reports, svg) = replay_with_a_plot(dir.path());
    let all = texts(&svg);

    // Each calibration's summary line.
    assert_summaries_are_the_reports(&all, &reports, &svg);

    // Each limiter's panel, in each calibration: its headline and its series.
    let (charts, notes) = assert_panels_are_the_reports(&svg, &reports);
    // The replaced calibration has no agent-ip: it gets a panel saying so.
    assert_eq!((charts, notes), (3, 1), "{svg}");

    // No text leaves the page: each one's estimated width (0.6 of its size per character,
    // 0.66 bold) lies within the view box.
    assert_no_text_leaves_the_page(&all, &svg);
}
