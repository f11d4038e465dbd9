//! `--plot FILE.svg`: admitted and refused requests over virtual time, one panel per scenario.

use super::fmt_secs;
use super::simulate::{ScenarioReport, SimulationReport};
use std::fmt::Write;

const WIDTH: f64 = 900.0;
const PANEL: f64 = 200.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 40.0;
/// Most points drawn per line; longer series are merged into wider bins.
const MAX_POINTS: usize = 240;

/// The SVG document for a simulation report.
pub fn svg(r: &SimulationReport) -> String {
    let height = r.scenarios.len() as f64 * (PANEL + TOP + BOTTOM) + 30.0;
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(o, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let title = match &r.config {
        Some(p) => p.display().to_string(),
        None => "built-in calibration".to_owned(),
    };
    let _ = writeln!(
        o,
        r#"<text x="{LEFT}" y="20" font-size="14">fleet-limiter simulate: {}, seed {} (green admitted, red refused)</text>"#,
        escape(&title),
        r.seed
    );
    for (i, s) in r.scenarios.iter().enumerate() {
        panel(&mut o, s, 30.0 + i as f64 * (PANEL + TOP + BOTTOM));
    }
    o.push_str("</svg>\n");
    o
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A round step between time labels that gives at most eight of them.
fn tick_step(total: u64) -> u64 {
    const STEPS: [u64; 13] = [
        10, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10_800, 21_600, 43_200,
    ];
    STEPS
        .iter()
        .copied()
        .find(|s| total / s <= 8)
        .unwrap_or_else(|| total.div_ceil(8).max(1))
}

fn merge(xs: &[u64], k: usize) -> Vec<u64> {
    xs.chunks(k).map(|c| c.iter().sum()).collect()
}

fn panel(o: &mut String, s: &ScenarioReport, y0: f64) {
    let series = s.series();
    let n = series.admitted.len().max(1);
    let k = n.div_ceil(MAX_POINTS).max(1);
    let admitted = merge(&series.admitted, k);
    let refused = merge(&series.refused, k);
    let bin = series.bin_seconds * k as u64;
    let points = admitted.len().max(1);
    let ymax = admitted
        .iter()
        .chain(&refused)
        .copied()
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let top = y0 + TOP;
    let plot_w = WIDTH - LEFT - RIGHT;
    let x_of = |i: usize| LEFT + plot_w * i as f64 / points as f64;
    let y_of = |v: u64| top + PANEL - PANEL * v as f64 / ymax;
    let _ = writeln!(
        o,
        r#"<text x="{LEFT}" y="{}" font-size="13" font-weight="bold">{} (requests per {})</text>"#,
        top - 10.0,
        s.name(),
        fmt_secs(bin as f64)
    );
    let _ = writeln!(
        o,
        r##"<rect x="{LEFT}" y="{top}" width="{plot_w}" height="{PANEL}" fill="none" stroke="#999"/>"##
    );
    let _ = writeln!(
        o,
        r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
        LEFT - 6.0,
        top + 4.0,
        ymax
    );
    let _ = writeln!(
        o,
        r#"<text x="{}" y="{}" text-anchor="end">0</text>"#,
        LEFT - 6.0,
        top + PANEL + 4.0
    );
    let total = points as u64 * bin;
    let step = tick_step(total);
    let mut t = 0;
    while t <= total {
        let x = LEFT + plot_w * t as f64 / total.max(1) as f64;
        let _ = writeln!(
            o,
            r#"<text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"#,
            top + PANEL + 16.0,
            fmt_secs(t as f64)
        );
        t += step;
    }
    for (at, label) in s.marks() {
        let x = LEFT + plot_w * at as f64 / total.max(1) as f64;
        let _ = writeln!(
            o,
            r##"<line x1="{x:.1}" y1="{top}" x2="{x:.1}" y2="{}" stroke="#555" stroke-dasharray="4 3"/>"##,
            top + PANEL
        );
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{}">{}</text>"#,
            x + 4.0,
            top + 14.0,
            escape(label)
        );
    }
    for (vals, colour) in [(&admitted, "#2a9d3f"), (&refused, "#d62828")] {
        let mut pts = String::new();
        for (i, v) in vals.iter().enumerate() {
            // A step per bin: flat across the bin's width.
            let _ = write!(
                pts,
                "{:.1},{:.1} {:.1},{:.1} ",
                x_of(i),
                y_of(*v),
                x_of(i + 1),
                y_of(*v)
            );
        }
        let _ = writeln!(
            o,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{}"/>"#,
            pts.trim_end()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calibration::simulate::{AbuseReport, Series};
    use std::collections::BTreeMap;

    #[test]
    fn draws_one_panel_per_scenario_and_merges_long_series() {
        let series = Series {
            bin_seconds: 10,
            admitted: vec![5; 1000],
            refused: vec![1; 1000],
        };
        let r = SimulationReport {
            config: None,
            seed: 1,
            scenarios: vec![ScenarioReport::Abuse(AbuseReport {
                scenario: "abuse",
                duration_seconds: 10_000,
                rate_per_second: 20,
                requests: 6000,
                refused: 1000,
                admitted_per_minute: BTreeMap::new(),
                attackers: vec![],
                series,
            })],
        };
        let s = svg(&r);
        assert!(s.starts_with("<svg"));
        assert_eq!(s.matches("<polyline").count(), 2);
        assert!(
            s.contains("abuse (requests per 50s)"),
            "1000 bins merged 5 to 1"
        );
        assert!(s.contains(">25<"), "y axis tops at the merged maximum");
    }
}
