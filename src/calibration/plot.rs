//! `--plot FILE.svg`: what the simulation's headline figures are about, over virtual time.
//!
//! - `fleet`: how long each agent has gone without an admitted heartbeat, against the
//!   `heartbeat_timeout_seconds` line; how many agents are offline; the requests admitted and
//!   refused.
//! - `rollout`: endpoints enrolled; the requests admitted and refused.
//! - `analysts`: the run with verified tokens and the run without, side by side on the same
//!   30-minute axis and the same y-scale.
//! - `abuse`: each client's admitted requests per minute, against what it sent.
//!
//! Where a figure is meant to be compared between calibrations its y-scale is fixed by the fleet
//! settings, not by the data: heartbeat age (log scale, 10 s to the run's length), agents
//! offline and endpoints enrolled (0 to the site's endpoints), admitted per minute (0 to what the
//! clients send). Request counts are scaled to their data.
//!
//! Every drawn series carries its numbers: `data-series`, `data-bin-seconds` and `data-values`
//! (one value per bin), so the figure can be checked without reading pixels.

use super::fmt_secs;
use super::simulate::{
    abuse::Attacker, failed_only::FailedOnlyReport, AbuseReport, AnalystsReport, FleetReport,
    RolloutReport, RotationReport, ScenarioReport, Series, SimulationReport, TableFloodReport,
};
use std::fmt::Write;

mod replay;
pub use replay::replay_svg;

const WIDTH: f64 = 1000.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 30.0;
/// Title and headline above a panel's frame.
const HEADER: f64 = 50.0;
/// Time labels and axis title under a panel's frame, and the gap to the next panel.
const FOOTER: f64 = 58.0;
const TALL: f64 = 180.0;
/// A further line of a legend under a panel.
const LEGEND_LINE: f64 = 18.0;
const SHORT: f64 = 120.0;
/// Most bins drawn per line; longer series are merged into wider, round bins.
const MAX_POINTS: usize = 240;
/// The bin widths a plot may use, in seconds.
pub const ROUND_BINS: [u64; 13] = [
    10, 30, 60, 300, 600, 900, 1800, 3600, 7200, 10_800, 21_600, 43_200, 86_400,
];

const GREEN: &str = "#2a9d3f";
const RED: &str = "#d62828";
const DARK_RED: &str = "#7f1010";
const BLUE: &str = "#1d4e89";
const LIGHT_BLUE: &str = "#6fa8dc";
const GREY: &str = "#555";
const CLIENT_COLOURS: [&str; 4] = ["#7b2cbf", "#1d70b8", "#e07a00", "#2a9d3f"];
/// Each client's dash, so clients admitted alike still show one beside the other.
const CLIENT_DASHES: [Option<&str>; 4] = [None, None, Some("7 5"), Some("2 3")];

/// The SVG document for a simulation report.
pub fn svg(r: &SimulationReport) -> String {
    let mut body = String::new();
    let mut y = 64.0;
    for s in &r.scenarios {
        y = match s {
            ScenarioReport::Fleet(f) => fleet(&mut body, f, y),
            ScenarioReport::Rollout(ro) => rollout(&mut body, ro, y),
            ScenarioReport::Analysts(a) => analysts(&mut body, a, y),
            ScenarioReport::Abuse(a) => abuse(&mut body, a, y),
            ScenarioReport::Rotation(r) => rotation(&mut body, r, y),
            ScenarioReport::TableFlood(r) => table_flood(&mut body, r, y),
            ScenarioReport::FailedOnly(f) => failed_only(&mut body, f, y),
        };
    }
    let height = y.ceil();
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
    let avail = WIDTH - LEFT - RIGHT;
    let heading = format!("fleet-limiter simulate: {title}, seed {}", r.seed);
    let _ = writeln!(
        o,
        r#"<text x="{LEFT}" y="24" font-weight="bold"{}>{}</text>"#,
        fit(&heading, 16.0, true, avail),
        escape(&heading),
    );
    let note = "Virtual time. Heartbeat age, agents offline, endpoints enrolled and admitted per minute keep the same scales for every calibration.";
    let _ = writeln!(
        o,
        r##"<text x="{LEFT}" y="44" fill="{GREY}"{}>{note}</text>"##,
        fit(note, 12.0, false, avail)
    );
    o.push_str(&body);
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
/// A line's estimated width in pixels, on the generous side of sans-serif's average glyph
/// (digits and lower case run narrower), so that an estimate that fits, fits.
pub(crate) fn text_width(s: &str, size: f64, bold: bool) -> f64 {
    s.chars().count() as f64 * size * if bold { 0.62 } else { 0.56 }
}

/// The `font-size` that fits a line into `avail` pixels: `size` when its estimated width fits,
/// smaller in proportion when it would pass them, so no text is ever clipped (nor stretched).
/// Empty at the document's own 12 px.
fn fit(s: &str, size: f64, bold: bool, avail: f64) -> String {
    let width = text_width(s, size, bold);
    let size = if width <= avail {
        size
    } else {
        (size * avail.max(1.0) / width * 10.0).floor() / 10.0
    };
    if size == 12.0 {
        String::new()
    } else {
        format!(r#" font-size="{size}""#)
    }
}

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

/// How many bins of `base` seconds to merge into one so that `n` of them draw as at most
/// [`MAX_POINTS`] bins of a round width.
fn merge_factor(base: u64, n: usize) -> usize {
    let base = base.max(1);
    ROUND_BINS
        .iter()
        .filter(|w| *w % base == 0)
        .map(|w| (w / base) as usize)
        .find(|k| n.div_ceil(*k) <= MAX_POINTS)
        .unwrap_or_else(|| n.div_ceil(MAX_POINTS).max(1))
}

fn sum(xs: &[u64], k: usize) -> Vec<u64> {
    xs.chunks(k).map(|c| c.iter().sum()).collect()
}

fn max_f(xs: &[f64], k: usize) -> Vec<f64> {
    xs.chunks(k)
        .map(|c| c.iter().copied().fold(0.0, f64::max))
        .collect()
}

fn max_u(xs: &[u64], k: usize) -> Vec<u64> {
    xs.chunks(k)
        .map(|c| c.iter().copied().max().unwrap_or(0))
        .collect()
}

fn last_u(xs: &[u64], k: usize) -> Vec<u64> {
    xs.chunks(k)
        .map(|c| c.last().copied().unwrap_or(0))
        .collect()
}

fn floats(xs: &[u64]) -> Vec<f64> {
    xs.iter().map(|&x| x as f64).collect()
}

/// A step of 1, 2, 2.5, 3 or 5 times a power of ten giving about four intervals up to `v`.
fn nice_step(v: f64) -> f64 {
    let raw = (v / 4.0).max(1e-9);
    let p = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 2.5, 3.0, 5.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * p)
        .max(1.0)
}

fn fmt_num(v: f64) -> String {
    let r = (v * 10.0).round() / 10.0;
    if r == r.trunc() {
        format!("{}", r as i64)
    } else {
        format!("{r:.1}")
    }
}

#[derive(Clone, Copy)]
enum Scale {
    /// From 0 to the maximum, with labels every step.
    Linear { max: f64, step: f64 },
    /// From `lo` to `hi`, logarithmic, labelled at round durations.
    LogSeconds { lo: f64, hi: f64 },
}

impl Scale {
    /// A linear scale from 0 that fits `v`, rounded up to a label.
    fn fit(v: f64) -> Self {
        let step = nice_step(v.max(1.0));
        let max = ((v.max(1.0) / step).ceil() * step).max(step);
        Scale::Linear { max, step }
    }

    /// A linear scale from 0 to exactly `max`, which is fixed by the scenario, not the data.
    fn fixed(max: f64) -> Self {
        let max = max.max(1.0);
        Scale::Linear {
            max,
            step: nice_step(max),
        }
    }

    fn fraction(&self, v: f64) -> f64 {
        match *self {
            Scale::Linear { max, .. } => (v / max).clamp(0.0, 1.0),
            Scale::LogSeconds { lo, hi } => {
                ((v.max(lo).ln() - lo.ln()) / (hi.ln() - lo.ln())).clamp(0.0, 1.0)
            }
        }
    }

    fn ticks(&self) -> Vec<(f64, String)> {
        match *self {
            Scale::Linear { max, step } => {
                let mut out = Vec::new();
                let mut v = 0.0;
                while v <= max + step * 1e-6 {
                    out.push((v, fmt_num(v)));
                    v += step;
                }
                if out.last().is_some_and(|(last, _)| max - last > step * 0.3) {
                    out.push((max, fmt_num(max)));
                }
                out
            }
            Scale::LogSeconds { lo, hi } => [
                10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21_600.0, 86_400.0,
            ]
            .iter()
            .copied()
            .filter(|t| *t >= lo && *t <= hi * 1.0001)
            .map(|t| (t, fmt_secs(t)))
            .collect(),
        }
    }
}

/// One frame: where it sits, its time axis and its y-scale.
struct Frame {
    x: f64,
    top: f64,
    w: f64,
    h: f64,
    /// Seconds the time axis spans.
    total: f64,
    scale: Scale,
    /// What the time axis counts.
    time_label: &'static str,
}

impl Frame {
    fn px(&self, t: f64) -> f64 {
        self.x + self.w * t / self.total.max(1.0)
    }

    fn py(&self, v: f64) -> f64 {
        self.top + self.h - self.h * self.scale.fraction(v)
    }

    /// Title, headline, legend, frame, grid, axes and their labels.
    fn draw(
        &self,
        o: &mut String,
        title: &str,
        headline: &str,
        y_label: &str,
        legend: &[(&str, &str, bool)],
    ) {
        // The title keeps clear of the legend on its line.
        let legend_w: f64 = legend
            .iter()
            .map(|(label, _, _)| text_width(label, 12.0, false) + 42.0)
            .sum();
        let title_avail = self.w - legend_w - 12.0;
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{:.1}" font-weight="bold"{}>{}</text>"#,
            self.x,
            self.top - 30.0,
            fit(title, 14.0, true, title_avail),
            escape(title)
        );
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{:.1}" fill="{GREY}"{}>{}</text>"#,
            self.x,
            self.top - 12.0,
            fit(headline, 12.0, false, self.w),
            escape(headline)
        );
        for (v, label) in self.scale.ticks() {
            let y = self.py(v);
            let _ = writeln!(
                o,
                r##"<line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e4e4e4"/>"##,
                self.x,
                self.x + self.w
            );
            let _ = writeln!(
                o,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{label}</text>"#,
                self.x - 6.0,
                y + 4.0
            );
        }
        let _ = writeln!(
            o,
            r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="none" stroke="#999"/>"##,
            self.x, self.top, self.w, self.h
        );
        let total = self.total.round() as u64;
        let step = tick_step(total);
        let mut t = 0;
        while t <= total {
            let _ = writeln!(
                o,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                self.px(t as f64),
                self.top + self.h + 16.0,
                fmt_secs(t as f64)
            );
            t += step;
        }
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="{GREY}">{}</text>"#,
            self.x + self.w / 2.0,
            self.top + self.h + 32.0,
            self.time_label
        );
        let cy = self.top + self.h / 2.0;
        let lx = self.x - 58.0;
        let _ = writeln!(
            o,
            r#"<text x="{lx:.1}" y="{cy:.1}" text-anchor="middle" transform="rotate(-90 {lx:.1} {cy:.1})" fill="{GREY}">{}</text>"#,
            escape(y_label)
        );
        // The legend, right-aligned on the title's line.
        let mut x = self.x + self.w;
        for (label, colour, dashed) in legend.iter().rev() {
            let text_w = text_width(label, 12.0, false);
            x -= text_w;
            let y = self.top - 30.0;
            let _ = writeln!(o, r#"<text x="{x:.1}" y="{y:.1}">{}</text>"#, escape(label));
            let dash = if *dashed {
                r#" stroke-dasharray="5 3""#
            } else {
                ""
            };
            let _ = writeln!(
                o,
                r#"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{colour}" stroke-width="2.5"{dash}/>"#,
                x - 26.0,
                y - 4.0,
                x - 4.0,
                y - 4.0
            );
            x -= 42.0;
        }
    }

    /// One value per bin of `bin` seconds, drawn as steps, carrying its numbers.
    #[allow(clippy::too_many_arguments)]
    fn series(
        &self,
        o: &mut String,
        name: &str,
        client: Option<&str>,
        bin: u64,
        values: &[f64],
        colour: &str,
        dashed: bool,
    ) {
        self.series_dashed(
            o,
            name,
            client,
            bin,
            values,
            colour,
            dashed.then_some("5 3"),
        );
    }

    /// As [`Frame::series`], with a dash pattern of its own.
    #[allow(clippy::too_many_arguments)]
    fn series_dashed(
        &self,
        o: &mut String,
        name: &str,
        client: Option<&str>,
        bin: u64,
        values: &[f64],
        colour: &str,
        dash: Option<&str>,
    ) {
        let mut pts = String::new();
        let mut vals = String::new();
        for (i, v) in values.iter().enumerate() {
            let (x0, x1) = (
                self.px((i as u64 * bin) as f64),
                self.px(((i as u64 + 1) * bin) as f64),
            );
            let y = self.py(*v);
            let _ = write!(pts, "{x0:.1},{y:.1} {x1:.1},{y:.1} ");
            let _ = write!(vals, "{} ", fmt_num(*v));
        }
        let client = client
            .map(|c| format!(r#" data-client="{}""#, escape(c)))
            .unwrap_or_default();
        let dash = dash
            .map(|d| format!(r#" stroke-dasharray="{d}""#))
            .unwrap_or_default();
        let _ = writeln!(
            o,
            r#"<polyline data-series="{name}"{client} data-bin-seconds="{bin}" data-values="{}" fill="none" stroke="{colour}" stroke-width="2"{dash} stroke-linejoin="round" points="{}"/>"#,
            vals.trim_end(),
            pts.trim_end()
        );
    }

    /// A labelled horizontal reference line at `v`.
    fn hline(&self, o: &mut String, v: f64, colour: &str, label: &str, attrs: &str) {
        let y = self.py(v);
        let _ = writeln!(
            o,
            r#"<line{attrs} x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{colour}" stroke-width="1.5" stroke-dasharray="8 4"/>"#,
            self.x,
            self.x + self.w
        );
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end" fill="{colour}" font-weight="bold">{}</text>"#,
            self.x + self.w - 6.0,
            y - 5.0,
            escape(label)
        );
    }
}

/// A frame across the whole width, starting below `y`; returns it and where the next begins.
fn full_frame(y: f64, h: f64, total: f64, scale: Scale) -> (Frame, f64) {
    let f = Frame {
        x: LEFT,
        top: y + HEADER,
        w: WIDTH - LEFT - RIGHT,
        h,
        total,
        scale,
        time_label: "virtual time since the start of the run",
    };
    (f, y + HEADER + h + FOOTER)
}

/// Admitted and refused counts merged to a round bin.
fn counts(s: &Series) -> (u64, Vec<u64>, Vec<u64>) {
    let k = merge_factor(s.bin_seconds, s.admitted.len());
    (
        s.bin_seconds.max(1) * k as u64,
        sum(&s.admitted, k),
        sum(&s.refused, k),
    )
}

fn fleet(o: &mut String, f: &FleetReport, y: f64) -> f64 {
    let a = &f.heartbeat_ages;
    let duration = f.duration_seconds as f64;
    let timeout = a.timeout_seconds as f64;
    let k = merge_factor(a.bin_seconds, a.worst.len());
    let bin = a.bin_seconds.max(1) * k as u64;
    let worst = max_f(&a.worst, k);
    let median = max_f(&a.median, k);
    let offline = max_u(&a.offline, k);
    let total = (worst.len() as u64 * bin) as f64;
    let n = f.agents;
    let most_offline = a.offline.iter().copied().max().unwrap_or(0);

    // Heartbeat age, log scale from 10 s to the run's length (or past the timeout).
    let hi = [1800.0, 3600.0, 7200.0, 21_600.0, 86_400.0]
        .into_iter()
        .find(|h| *h >= duration.max(timeout * 2.0))
        .unwrap_or(duration.max(timeout * 2.0));
    let (fr, y) = full_frame(y, TALL, total, Scale::LogSeconds { lo: 10.0, hi });
    let _ = writeln!(o, r#"<g data-panel="fleet-heartbeat-age">"#);
    let shade_top = fr.top;
    let shade_h = fr.py(timeout) - fr.top;
    if shade_h > 0.0 {
        let _ = writeln!(
            o,
            r##"<rect x="{:.1}" y="{shade_top:.1}" width="{:.1}" height="{shade_h:.1}" fill="#fde8e8"/>"##,
            fr.x, fr.w
        );
    }
    fr.draw(
        o,
        &format!(
            "fleet: time since each agent's last admitted heartbeat ({} agents)",
            n
        ),
        &format!(
            "{} of {} agents marked offline; longest heartbeat gap {}. The shaded band is offline.",
            f.agents_marked_offline,
            n,
            fmt_secs(f.longest_heartbeat_gap_seconds),
        ),
        "time without a heartbeat (log scale)",
        &[
            ("worst agent", BLUE, false),
            ("median agent", LIGHT_BLUE, true),
        ],
    );
    fr.hline(
        o,
        timeout,
        RED,
        &format!(
            "offline after {} without a heartbeat (heartbeat_timeout_seconds)",
            fmt_secs(timeout)
        ),
        &format!(r#" data-threshold-seconds="{}""#, a.timeout_seconds),
    );
    fr.series(
        o,
        "heartbeat-age-median",
        None,
        bin,
        &median,
        LIGHT_BLUE,
        false,
    );
    fr.series(o, "heartbeat-age-worst", None, bin, &worst, BLUE, false);
    let _ = writeln!(o, "</g>");

    // Agents offline, 0 to the whole site.
    let (fr, y) = full_frame(y, SHORT, total, Scale::fixed(n as f64));
    let _ = writeln!(o, r#"<g data-panel="fleet-offline">"#);
    fr.draw(
        o,
        "fleet: agents offline (no admitted heartbeat for the timeout)",
        &format!(
            "At most {most_offline} of {n} offline at once; {} offline episodes in the run.",
            f.offline_episodes
        ),
        "agents offline",
        &[(&format!("agents offline (of {n})"), DARK_RED, false)],
    );
    if most_offline == 0 {
        // A line on the frame's edge is easy to miss: say it.
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="14" fill="{DARK_RED}">no agent offline at any time</text>"#,
            fr.x + fr.w / 2.0,
            fr.top + fr.h - 12.0
        );
    }
    fr.series(
        o,
        "agents-offline",
        None,
        bin,
        &floats(&offline),
        DARK_RED,
        false,
    );
    let _ = writeln!(o, "</g>");

    // Requests.
    let (rbin, admitted, refused) = counts(&f.series);
    let (_, _, hb_refused) = counts(&f.heartbeat_series);
    let top = admitted.iter().chain(&refused).copied().max().unwrap_or(0) as f64;
    let (fr, y) = full_frame(y, SHORT, total, Scale::fit(top));
    let _ = writeln!(o, r#"<g data-panel="fleet-requests">"#);
    fr.draw(
        o,
        &format!("fleet: agent requests per {}", fmt_secs(rbin as f64)),
        &format!(
            "Refused requests wait for Retry-After and retry. {} of {} heartbeats refused; {} results posted, {} still queued at the end.",
            f.heartbeats_refused, f.heartbeats, f.results_posted, f.results_backlog
        ),
        &format!("requests per {}", fmt_secs(rbin as f64)),
        &[
            ("admitted", GREEN, false),
            ("refused", RED, false),
            ("heartbeats refused", DARK_RED, true),
        ],
    );
    fr.series(
        o,
        "fleet-admitted",
        None,
        rbin,
        &floats(&admitted),
        GREEN,
        false,
    );
    fr.series(
        o,
        "fleet-refused",
        None,
        rbin,
        &floats(&refused),
        RED,
        false,
    );
    fr.series(
        o,
        "fleet-heartbeats-refused",
        None,
        rbin,
        &floats(&hb_refused),
        DARK_RED,
        true,
    );
    let _ = writeln!(o, "</g>");
    y
}

fn rollout(o: &mut String, r: &RolloutReport, y: f64) -> f64 {
    let (bin, admitted, refused) = counts(&r.series);
    let k = (bin / r.series.bin_seconds.max(1)) as usize;
    let enrolled = last_u(&r.enrolled_by_bin, k.max(1));
    let total = (admitted.len().max(enrolled.len()) as u64 * bin) as f64;
    let n = r.endpoints;
    let (fr, y) = full_frame(y, SHORT, total, Scale::fixed(n as f64));
    let _ = writeln!(o, r#"<g data-panel="rollout-enrolled">"#);
    let headline = match r.last_enrolled_after_seconds {
        Some(s) => format!(
            "All {n} endpoints enrolled; the last after {}.",
            fmt_secs(s)
        ),
        None => format!(
            "{} of {n} endpoints enrolled when the run gave up.",
            r.enrolled
        ),
    };
    fr.draw(
        o,
        &format!("rollout: endpoints enrolled ({n} installers behind one NAT)"),
        &headline,
        "endpoints enrolled",
        &[(&format!("enrolled (of {n})"), BLUE, false)],
    );
    fr.series(
        o,
        "rollout-enrolled",
        None,
        bin,
        &floats(&enrolled),
        BLUE,
        false,
    );
    let _ = writeln!(o, "</g>");

    let top = admitted.iter().chain(&refused).copied().max().unwrap_or(0) as f64;
    let (fr, y) = full_frame(y, SHORT, total, Scale::fit(top));
    let _ = writeln!(o, r#"<g data-panel="rollout-requests">"#);
    fr.draw(
        o,
        &format!("rollout: requests per {}", fmt_secs(bin as f64)),
        &format!(
            "Downloads and enrollments: {} requests, {} refused.",
            r.requests, r.refused
        ),
        &format!("requests per {}", fmt_secs(bin as f64)),
        &[("admitted", GREEN, false), ("refused", RED, false)],
    );
    fr.series(
        o,
        "rollout-admitted",
        None,
        bin,
        &floats(&admitted),
        GREEN,
        false,
    );
    fr.series(
        o,
        "rollout-refused",
        None,
        bin,
        &floats(&refused),
        RED,
        false,
    );
    let _ = writeln!(o, "</g>");
    y
}

fn analysts(o: &mut String, a: &AnalystsReport, y: f64) -> f64 {
    let runs = [
        (
            "analysts-verified",
            "analysts, verified tokens (a budget per analyst)",
            &a.series,
            a.max_refused_per_analyst,
        ),
        (
            "analysts-unverified",
            "analysts, no verified tokens (one budget: the NAT's IP)",
            &a.series_without_verified_tokens,
            a.without_verified_tokens.max_refused_per_analyst,
        ),
    ];
    let merged: Vec<(u64, Vec<u64>, Vec<u64>)> = runs.iter().map(|r| counts(r.2)).collect();
    // Both runs share one y-scale, so their heights compare.
    let top = merged
        .iter()
        .flat_map(|(_, ad, re)| ad.iter().chain(re))
        .copied()
        .max()
        .unwrap_or(0) as f64;
    let scale = Scale::fit(top);
    let gap = 84.0;
    let w = (WIDTH - LEFT - RIGHT - gap) / 2.0;
    for (i, ((name, title, _, max_refused), (bin, admitted, refused))) in
        runs.iter().zip(&merged).enumerate()
    {
        let fr = Frame {
            x: LEFT + i as f64 * (w + gap),
            top: y + HEADER + 18.0,
            w,
            h: SHORT,
            total: (admitted.len() as u64 * bin) as f64,
            scale,
            time_label: "virtual time since the start of the run",
        };
        let _ = writeln!(o, r#"<g data-panel="{name}">"#);
        fr.draw(
            o,
            title,
            &format!("Max refused per analyst: {max_refused}."),
            &format!("polls per {}", fmt_secs(*bin as f64)),
            &[],
        );
        fr.series(
            o,
            &format!("{name}-admitted"),
            None,
            *bin,
            &floats(admitted),
            GREEN,
            false,
        );
        fr.series(
            o,
            &format!("{name}-refused"),
            None,
            *bin,
            &floats(refused),
            RED,
            false,
        );
        let _ = writeln!(o, "</g>");
    }
    let note = format!(
        "{} dashboards sending {} requests every {}s for {}, in two separate runs, each on its own axis from 0. Green admitted, red refused.",
        a.analysts,
        a.requests_per_poll,
        a.poll_seconds,
        fmt_secs(a.duration_seconds as f64)
    );
    let _ = writeln!(
        o,
        r##"<text x="{LEFT}" y="{:.1}" fill="{GREY}"{}>{}</text>"##,
        y + 18.0,
        fit(&note, 12.0, false, WIDTH - LEFT - RIGHT),
        escape(&note)
    );
    y + HEADER + 18.0 + SHORT + FOOTER
}

fn abuse(o: &mut String, a: &AbuseReport, y: f64) -> f64 {
    clients(
        o,
        ClientsPanel {
            panel: "abuse",
            title: "abuse: requests admitted per minute, per client",
            subtitle: format!(
                "{} clients on their own addresses, {}/s each, ignoring Retry-After.",
                a.attackers.len(),
                a.rate_per_second,
            ),
            sent: (a.rate_per_second * 60) as f64,
            sent_label: "per client".to_owned(),
        },
        &a.attackers,
        y,
    )
}

fn rotation(o: &mut String, r: &RotationReport, y: f64) -> f64 {
    clients(
        o,
        ClientsPanel {
            panel: "rotation",
            title: "rotation: the site's heartbeats and a rotating client at its NAT, admitted per minute",
            subtitle: format!(
                "{} agents; from {} one host sends {}/s with a fresh agent id each.",
                r.agents,
                fmt_secs(r.flood_starts_seconds as f64),
                r.flood_rate_per_second
            ),
            sent: (r.flood_rate_per_second * 60) as f64,
            sent_label: "by the rotating client".to_owned(),
        },
        &r.clients,
        y,
    )
}

fn table_flood(o: &mut String, r: &TableFloodReport, y: f64) -> f64 {
    let agents = r.sites.first().map_or(0, |s| s.agents);
    clients(
        o,
        ClientsPanel {
            panel: "table-flood",
            title: "table-flood: each site's heartbeats admitted per minute while others fill the known-agents table",
            subtitle: format!(
                "{agents} agents per site; from {} {} /56s mint {} ids each, then {}/s; from {} {} more /56s at their ceiling's rate.",
                fmt_secs(r.fill_starts_seconds as f64),
                r.fill_addresses,
                r.fill_ids_each,
                r.keep_full_per_second,
                fmt_secs(r.sustained_starts_seconds as f64),
                r.sustained_addresses
            ),
            sent: r.site_heartbeats_per_minute,
            sent_label: "by one site".to_owned(),
        },
        &r.clients,
        y,
    )
}

fn failed_only(o: &mut String, f: &FailedOnlyReport, y: f64) -> f64 {
    let busiest = f.clients.iter().max_by_key(|c| c.rate_per_second);
    let budget = match (f.api_key_count, f.api_key_budget) {
        (Some(count), Some(b)) => format!("api-key counts {count}, budget {b} over the run."),
        _ => "no api-key limiter.".to_owned(),
    };
    let rates: Vec<String> = f
        .clients
        .iter()
        .map(|c| format!("{} {}/s answered {}", c.name, c.rate_per_second, c.status))
        .collect();
    clients(
        o,
        ClientsPanel {
            panel: "failed-only",
            title: "failed-only: requests admitted per minute, per API client",
            subtitle: format!("{}; {budget}", rates.join(", ")),
            sent: busiest.map_or(0.0, |c| (c.rate_per_second * 60) as f64),
            sent_label: busiest.map_or(String::new(), |c| format!("by {}", c.name)),
        },
        &f.plot_clients,
        y,
    )
}

/// A panel of clients' admitted requests per minute against what the busiest one sends.
struct ClientsPanel {
    panel: &'static str,
    title: &'static str,
    subtitle: String,
    sent: f64,
    sent_label: String,
}

fn clients(o: &mut String, p: ClientsPanel, attackers: &[Attacker], y: f64) -> f64 {
    let sent = p.sent;
    let mut lines = Vec::new();
    for at in attackers {
        let (bin, admitted, _) = counts(&at.series);
        let per_minute: Vec<f64> = admitted
            .iter()
            .map(|&c| c as f64 * 60.0 / bin as f64)
            .collect();
        lines.push((at, bin, per_minute));
    }
    let bin = lines.first().map_or(10, |l| l.1);
    let points = lines.iter().map(|l| l.2.len()).max().unwrap_or(1);
    let total = (points as u64 * bin) as f64;
    // Fixed by what each client sends, so every calibration's figure reads the same; a little
    // above it, so a client admitted in full shows above the reference line's label.
    let (fr, y) = full_frame(y, TALL, total, Scale::fit(sent * 1.1));
    let legend: Vec<(String, &str, Option<&str>)> = lines
        .iter()
        .enumerate()
        .map(|(i, (at, _, _))| {
            (
                format!(
                    "{}: {}/min admitted",
                    at.name,
                    fmt_num(at.admitted_per_minute)
                ),
                CLIENT_COLOURS[i % CLIENT_COLOURS.len()],
                CLIENT_DASHES[i % CLIENT_DASHES.len()],
            )
        })
        .collect();
    let _ = writeln!(o, r#"<g data-panel="{}">"#, p.panel);
    fr.draw(
        o,
        p.title,
        &format!("{} Averaged per {}.", p.subtitle, fmt_secs(bin as f64)),
        "admitted per minute",
        &[],
    );
    fr.hline(
        o,
        sent,
        GREY,
        &format!("sent: {}/min {}", fmt_num(sent), p.sent_label),
        "",
    );
    for (i, (at, bin, per_minute)) in lines.iter().enumerate() {
        let colour = CLIENT_COLOURS[i % CLIENT_COLOURS.len()];
        fr.series_dashed(
            o,
            "admitted-per-minute",
            Some(at.name),
            *bin,
            per_minute,
            colour,
            CLIENT_DASHES[i % CLIENT_DASHES.len()],
        );
    }
    // The legend sits under the time axis, one client per entry, on as many lines as it needs.
    let mut x = fr.x;
    let mut ly = fr.top + fr.h + 52.0;
    for (label, colour, dash) in &legend {
        let entry = 28.0 + text_width(label, 12.0, false);
        if x > fr.x && x + entry > fr.x + fr.w {
            x = fr.x;
            ly += LEGEND_LINE;
        }
        let dash = dash
            .map(|d| format!(r#" stroke-dasharray="{d}""#))
            .unwrap_or_default();
        let _ = writeln!(
            o,
            r#"<line x1="{x:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{colour}" stroke-width="3"{dash}/>"#,
            ly - 4.0,
            x + 22.0,
            ly - 4.0
        );
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{ly:.1}"{}>{}</text>"#,
            x + 28.0,
            fit(label, 12.0, false, fr.x + fr.w - x - 28.0),
            escape(label)
        );
        x += entry + 24.0;
    }
    let _ = writeln!(o, "</g>");
    y + 24.0 + (ly - (fr.top + fr.h + 52.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calibration::simulate::abuse::Attacker;
    use std::collections::BTreeMap;

    fn attacker(name: &'static str, admitted: u64) -> Attacker {
        Attacker {
            name,
            route: "GET /api/tasks".into(),
            requests: 1000 * 20,
            refused: 1000 * (20 - admitted),
            admitted_per_minute: admitted as f64 * 6.0,
            series: Series {
                bin_seconds: 10,
                admitted: vec![admitted; 1000],
                refused: vec![20 - admitted; 1000],
            },
        }
    }

    #[test]
    fn abuse_draws_a_rate_per_client_in_round_bins() {
        let r = SimulationReport {
            config: None,
            seed: 1,
            scenarios: vec![ScenarioReport::Abuse(AbuseReport {
                scenario: "abuse",
                duration_seconds: 10_000,
                rate_per_second: 2,
                requests: 60_000,
                refused: 0,
                admitted_per_minute: BTreeMap::new(),
                attackers: vec![attacker("rotator", 20), attacker("spray", 1)],
                series: Series {
                    bin_seconds: 10,
                    admitted: vec![21; 1000],
                    refused: vec![19; 1000],
                },
            })],
        };
        let s = svg(&r);
        assert!(s.starts_with("<svg"));
        assert_eq!(s.matches(r#"data-series="admitted-per-minute""#).count(), 2);
        // 1000 bins of 10 s: 30 s bins would still be 334, so they merge to 1 minute.
        assert_eq!(s.matches(r#"data-bin-seconds="60""#).count(), 2);
        assert!(s.contains(r#"data-client="rotator" data-bin-seconds="60" data-values="120 120"#));
        assert!(s.contains(r#"data-client="spray" data-bin-seconds="60" data-values="6 6"#));
        assert!(s.contains("sent: 120/min per client"));
    }

    #[test]
    fn bins_merge_to_round_widths() {
        assert_eq!(merge_factor(10, 180), 1);
        assert_eq!(merge_factor(10, 241), 3);
        assert_eq!(merge_factor(10, 1000), 6);
        // Twelve hours of 10 s bins: 5 minutes, not 3m10s.
        assert_eq!(merge_factor(10, 4440), 30);
        for n in [1, 100, 240, 500, 4440, 17_280] {
            let w = 10 * merge_factor(10, n) as u64;
            assert!(ROUND_BINS.contains(&w), "{n} bins: {w} s");
        }
    }

    #[test]
    fn scales_label_round_values() {
        let Scale::Linear { max, step } = Scale::fit(2484.0) else {
            unreachable!()
        };
        assert_eq!((max, step), (3000.0, 1000.0));
        let ticks = Scale::fixed(250.0).ticks();
        assert_eq!(ticks.first().map(|t| t.0), Some(0.0));
        assert_eq!(ticks.last().map(|t| t.0), Some(250.0));
        let log = Scale::LogSeconds {
            lo: 10.0,
            hi: 1800.0,
        }
        .ticks();
        let labels: Vec<&str> = log.iter().map(|t| t.1.as_str()).collect();
        assert_eq!(labels, ["10s", "30s", "1m", "2m", "5m", "10m", "30m"]);
    }
}
