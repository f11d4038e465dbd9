//! The chart kit the figures are drawn with: the page's sizes and colours, scales and their
//! ticks, a frame with its title, legend, axes and series, bins merged to round widths, and
//! text that always fits its line.

use super::super::fmt_secs;
use super::super::simulate::Series;
use std::fmt::Write;

pub(super) const WIDTH: f64 = 1000.0;
pub(super) const LEFT: f64 = 90.0;
pub(super) const RIGHT: f64 = 30.0;
/// Title and headline above a panel's frame.
pub(super) const HEADER: f64 = 50.0;
/// Time labels and axis title under a panel's frame, and the gap to the next panel.
pub(super) const FOOTER: f64 = 58.0;
pub(super) const TALL: f64 = 180.0;
/// A further line of a legend under a panel.
pub(super) const LEGEND_LINE: f64 = 18.0;
pub(super) const SHORT: f64 = 120.0;
/// Most bins drawn per line; longer series are merged into wider, round bins.
pub(super) const MAX_POINTS: usize = 240;
/// The bin widths a plot may use, in seconds.
pub(crate) const ROUND_BINS: [u64; 13] = [
    10, 30, 60, 300, 600, 900, 1800, 3600, 7200, 10_800, 21_600, 43_200, 86_400,
];

pub(super) const GREEN: &str = "#2a9d3f";
pub(super) const RED: &str = "#d62828";
pub(super) const DARK_RED: &str = "#7f1010";
pub(super) const BLUE: &str = "#1d4e89";
pub(super) const LIGHT_BLUE: &str = "#6fa8dc";
pub(super) const GREY: &str = "#555";
pub(super) const CLIENT_COLOURS: [&str; 4] = ["#7b2cbf", "#1d70b8", "#e07a00", "#2a9d3f"];
/// Each client's dash, so clients admitted alike still show one beside the other.
pub(super) const CLIENT_DASHES: [Option<&str>; 4] = [None, None, Some("7 5"), Some("2 3")];

pub(super) fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A round step between time labels that gives at most eight of them.
/// A line's estimated width in pixels, on the generous side of sans-serif's average glyph
/// (digits and lower case run narrower), so that an estimate that fits, fits.
pub(crate) fn text_width(s: &str, size: f64, bold: bool) -> f64 {
    s.chars().count() as f64 * size * if bold { BOLD_CHAR_EM } else { CHAR_EM }
}

/// Estimated width of one character, as a share of the font size (bold a little wider): the
/// average advance of a sans-serif face over letters and digits is about half the size.
const CHAR_EM: f64 = 0.6;
const BOLD_CHAR_EM: f64 = 0.66;

/// The `font-size` that fits a line into `avail` pixels: `size` when its estimated width fits,
/// smaller in proportion when it would pass them, so no text is ever clipped (nor stretched).
/// Empty at the document's own 12 px.
pub(super) fn fit(s: &str, size: f64, bold: bool, avail: f64) -> String {
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

pub(super) fn tick_step(total: u64) -> u64 {
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
pub(super) fn merge_factor(base: u64, n: usize) -> usize {
    let base = base.max(1);
    ROUND_BINS
        .iter()
        .filter(|w| *w % base == 0)
        .map(|w| (w / base) as usize)
        .find(|k| n.div_ceil(*k) <= MAX_POINTS)
        .unwrap_or_else(|| n.div_ceil(MAX_POINTS).max(1))
}

pub(super) fn sum(xs: &[u64], k: usize) -> Vec<u64> {
    xs.chunks(k).map(|c| c.iter().sum()).collect()
}

pub(super) fn max_f(xs: &[f64], k: usize) -> Vec<f64> {
    xs.chunks(k)
        .map(|c| c.iter().copied().fold(0.0, f64::max))
        .collect()
}

pub(super) fn max_u(xs: &[u64], k: usize) -> Vec<u64> {
    xs.chunks(k)
        .map(|c| c.iter().copied().max().unwrap_or(0))
        .collect()
}

pub(super) fn last_u(xs: &[u64], k: usize) -> Vec<u64> {
    xs.chunks(k)
        .map(|c| c.last().copied().unwrap_or(0))
        .collect()
}

pub(super) fn floats(xs: &[u64]) -> Vec<f64> {
    xs.iter().map(|&x| x as f64).collect()
}

/// A step of 1, 2, 2.5, 3 or 5 times a power of ten giving about four intervals up to `v`.
pub(super) fn nice_step(v: f64) -> f64 {
    let raw = (v / 4.0).max(1e-9);
    let p = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 2.5, 3.0, 5.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * p)
        .max(1.0)
}

pub(super) fn fmt_num(v: f64) -> String {
    let r = (v * 10.0).round() / 10.0;
    if r == r.trunc() {
        format!("{}", r as i64)
    } else {
        format!("{r:.1}")
    }
}

#[derive(Clone, Copy)]
pub(super) enum Scale {
    /// From 0 to the maximum, with labels every step.
    Linear { max: f64, step: f64 },
    /// From `lo` to `hi`, logarithmic, labelled at round durations.
    LogSeconds { lo: f64, hi: f64 },
}

impl Scale {
    /// A linear scale from 0 that fits `v`, rounded up to a label.
    pub(super) fn fit(v: f64) -> Self {
        let step = nice_step(v.max(1.0));
        let max = ((v.max(1.0) / step).ceil() * step).max(step);
        Scale::Linear { max, step }
    }

    /// A linear scale from 0 to exactly `max`, which is fixed by the scenario, not the data.
    pub(super) fn fixed(max: f64) -> Self {
        let max = max.max(1.0);
        Scale::Linear {
            max,
            step: nice_step(max),
        }
    }

    pub(super) fn fraction(&self, v: f64) -> f64 {
        match *self {
            Scale::Linear { max, .. } => (v / max).clamp(0.0, 1.0),
            Scale::LogSeconds { lo, hi } => {
                ((v.max(lo).ln() - lo.ln()) / (hi.ln() - lo.ln())).clamp(0.0, 1.0)
            }
        }
    }

    pub(super) fn ticks(&self) -> Vec<(f64, String)> {
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
pub(super) struct Frame {
    pub(super) x: f64,
    pub(super) top: f64,
    pub(super) w: f64,
    pub(super) h: f64,
    /// Seconds the time axis spans.
    pub(super) total: f64,
    pub(super) scale: Scale,
    /// What the time axis counts.
    pub(super) time_label: &'static str,
}

impl Frame {
    pub(super) fn px(&self, t: f64) -> f64 {
        self.x + self.w * t / self.total.max(1.0)
    }

    pub(super) fn py(&self, v: f64) -> f64 {
        self.top + self.h - self.h * self.scale.fraction(v)
    }

    /// Title, headline, legend, frame, grid, axes and their labels.
    pub(super) fn draw(
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
    pub(super) fn series(
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
    pub(super) fn series_dashed(
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
    pub(super) fn hline(&self, o: &mut String, v: f64, colour: &str, label: &str, attrs: &str) {
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
pub(super) fn full_frame(y: f64, h: f64, total: f64, scale: Scale) -> (Frame, f64) {
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
pub(super) fn counts(s: &Series) -> (u64, Vec<u64>, Vec<u64>) {
    let k = merge_factor(s.bin_seconds.get(), s.admitted.len());
    (
        s.bin_seconds.get() * k as u64,
        sum(&s.admitted, k),
        sum(&s.refused, k),
    )
}
