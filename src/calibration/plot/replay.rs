//! `replay --plot FILE.svg`: each limiter's admitted and refused requests over the logs' own time.
//!
//! Every number printed on the figure is the report's: each calibration's summary line
//! (`data-summary`) and each limiter's panel (`data-panel`) carry them as attributes too, and a
//! calibration that matched nothing, or a limiter one calibration has and the other never
//! matched, gets a panel that says so rather than no panel. Text is shortened to fit the width.

use super::*;
use crate::calibration::replay::{LimiterReport, ReplayReport};

/// A series merged to round bins: the bin's seconds, admitted and refused per bin.
type Binned = (u64, Vec<u64>, Vec<u64>);
/// The height of a panel that holds a statement instead of a chart.
const NOTE: f64 = 44.0;

/// `text`, shortened with an ellipsis in its middle where it would be wider than `width` px
/// (a name keeps its size and loses its middle; the simulation's sentences are set smaller
/// instead, by [`fit`]).
fn shorten(text: &str, width: f64, size: f64, bold: bool) -> String {
    if text_width(text, size, bold) <= width {
        return text.to_owned();
    }
    let per = text_width("m", size, bold);
    let keep = ((width / per).floor() as usize).saturating_sub(1);
    let chars: Vec<char> = text.chars().collect();
    let head = keep.div_ceil(2);
    let tail = keep - head;
    let mut out: String = chars[..head.min(chars.len())].iter().collect();
    out.push('…');
    out.extend(&chars[chars.len().saturating_sub(tail)..]);
    out
}

/// Which calibration a panel is of, when there are two.
fn which(reports: usize, i: usize) -> &'static str {
    match (reports, i) {
        (1, _) => "",
        (_, 0) => " (the calibration)",
        _ => " (--against)",
    }
}

fn source(r: &ReplayReport) -> String {
    r.config.as_ref().map_or_else(
        || "built-in calibration".to_owned(),
        |p| p.display().to_string(),
    )
}

/// The headline of a limiter's panel: the numbers of its row in the report.
pub(crate) fn headline(l: &LimiterReport) -> String {
    let lockout = match &l.longest_refusal_run_principal {
        Some(p) => format!(
            "longest lockout {} s ({})",
            l.longest_refusal_run_seconds,
            shorten(p, 180.0, 12.0, false)
        ),
        None => format!("longest lockout {} s", l.longest_refusal_run_seconds),
    };
    let u = &l.unfinished_refusal_runs;
    format!(
        "{} metered, {} refused, {} shadow-refused; {lockout}; unfinished refusal runs {}",
        l.metered,
        l.refused,
        l.shadow_refused,
        u.total()
    )
}

/// A framed statement where a chart would be.
fn note(o: &mut String, y: f64, attrs: &str, title: &str, statement: &str) -> f64 {
    let w = WIDTH - LEFT - RIGHT;
    let _ = writeln!(o, "<g {attrs}>");
    let _ = writeln!(
        o,
        r#"<text x="{LEFT}" y="{:.1}" font-size="14" font-weight="bold">{}</text>"#,
        y + 20.0,
        escape(&shorten(title, w, 14.0, true))
    );
    let _ = writeln!(
        o,
        r##"<rect x="{LEFT}" y="{:.1}" width="{w:.1}" height="{NOTE:.1}" fill="#f6f6f6" stroke="#999"/>"##,
        y + 30.0
    );
    let _ = writeln!(
        o,
        r#"<text x="{:.1}" y="{:.1}" data-statement="">{}</text>"#,
        LEFT + 10.0,
        y + 30.0 + NOTE / 2.0 + 4.0,
        escape(&shorten(statement, w - 20.0, 12.0, false))
    );
    let _ = writeln!(o, "</g>");
    y + 30.0 + NOTE + 24.0
}

/// The SVG document for a replay: each calibration's summary, then for each limiter any
/// calibration matched, the requests it admitted and refused per bin over the logs' own time,
/// one panel per calibration (`--against` adds the second) on the same y-scale so they read
/// side by side. A calibration that matched nothing has a panel that says so.
pub(crate) fn replay_svg(reports: &[&ReplayReport]) -> String {
    let mut body = String::new();
    let mut y = 64.0;
    let n = reports.len();
    for (i, r) in reports.iter().enumerate() {
        y = calibration_summary(&mut body, r, i, n, y);
    }
    y += 4.0;
    y = no_match_notes(&mut body, reports, y);
    let span = reports
        .iter()
        .map(|r| r.span_seconds)
        .fold(0.0f64, f64::max)
        .max(60.0);
    for name in metered_names(reports) {
        y = limiter_panels(&mut body, reports, name, span, y);
    }
    document(reports, &body, y)
}

/// One calibration's two summary lines (its source, then its figures); returns the next `y`.
fn calibration_summary(body: &mut String, r: &ReplayReport, i: usize, n: usize, y: f64) -> f64 {
    let mut y = y;
    let figures = format!(
        "replayed {} of {} lines, not replayed {} ({} %); refused {}; unmetered {} ({} % of replayed)",
        r.replayed,
        r.lines,
        r.not_replayed,
        r.not_replayed_percent,
        r.refused,
        r.unmetered,
        r.unmetered_percent
    );
    let _ = writeln!(
        body,
        r#"<text x="{LEFT}" y="{:.1}" font-weight="bold">{}</text>"#,
        y,
        escape(&shorten(
            &format!("{}{}", source(r), which(n, i)),
            WIDTH - LEFT - RIGHT,
            12.0,
            true
        ))
    );
    y += 16.0;
    // Counts in the billions still fit, a little smaller.
    let room = WIDTH - LEFT - RIGHT;
    let size = if text_width(&figures, 12.0, false) <= room {
        12.0
    } else {
        10.0
    };
    let _ = writeln!(
        body,
        r#"<text x="{LEFT}" y="{:.1}" font-size="{size}" data-summary="" data-calibration="{i}" data-lines="{}" data-replayed="{}" data-not-replayed="{}" data-refused="{}" data-matched="{}" data-unmetered="{}">{}</text>"#,
        y,
        r.lines,
        r.replayed,
        r.not_replayed,
        r.refused,
        r.matched,
        r.unmetered,
        escape(&shorten(&figures, room, size, false))
    );
    y + 20.0
}

/// A note for each calibration that matched no limiter; returns the next `y`.
fn no_match_notes(body: &mut String, reports: &[&ReplayReport], y: f64) -> f64 {
    let n = reports.len();
    let mut y = y;
    for (i, r) in reports.iter().enumerate() {
        if let Some(none) = &r.no_limiter_matched {
            y = note(
                body,
                y,
                &format!(r#"data-panel="replay-no-match" data-calibration="{i}" data-matched="0""#),
                &format!("{}{}: no limiter matched", source(r), which(n, i)),
                none,
            );
        }
    }
    y
}

/// The limiters any calibration metered a request for, in the order they first appear.
fn metered_names<'a>(reports: &[&'a ReplayReport]) -> Vec<&'a str> {
    let mut names: Vec<&str> = Vec::new();
    for r in reports {
        for l in &r.limiters {
            if l.metered > 0 && !names.contains(&l.name.as_str()) {
                names.push(&l.name);
            }
        }
    }
    names
}

/// What one limiter's panels share, so they read side by side: the time drawn and the top of
/// the y-scale.
#[derive(Clone, Copy)]
struct Extent {
    span: f64,
    top: f64,
}

/// One limiter's panels, one per calibration on one y-scale, a note where a calibration
/// metered nothing for it; returns the next `y`.
fn limiter_panels(
    body: &mut String,
    reports: &[&ReplayReport],
    name: &str,
    span: f64,
    y: f64,
) -> f64 {
    let n = reports.len();
    let mut y = y;
    let panels: Vec<(usize, Option<&LimiterReport>)> = reports
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let l = r.limiters.iter().find(|l| l.name == name && l.metered > 0);
            (i, l)
        })
        .collect();
    let merged: Vec<Option<Binned>> = panels
        .iter()
        .map(|(_, l)| l.map(|l| counts(&l.series)))
        .collect();
    let top = merged
        .iter()
        .flatten()
        .flat_map(|(_, a, r)| a.iter().chain(r))
        .copied()
        .max()
        .unwrap_or(0) as f64;
    // Whole bins: the last one drawn ends inside the frame.
    let span = merged
        .iter()
        .flatten()
        .map(|(bin, a, _)| (a.len() as u64 * bin) as f64)
        .fold(span, f64::max);
    let extent = Extent { span, top };
    for ((i, l), m) in panels.iter().zip(&merged) {
        y = match (l, m) {
            (Some(l), Some(binned)) => limiter_chart(body, y, extent, *i, n, l, binned),
            _ => note(
                body,
                y,
                &format!(
                    r#"data-panel="replay-{}" data-calibration="{i}" data-metered="0""#,
                    escape(name)
                ),
                &format!("{name}{}", which(n, *i)),
                &format!(
                    "No request matched {name} in {}: 0 metered.",
                    source(reports[*i])
                ),
            ),
        };
    }
    y
}

/// One calibration's chart of a limiter: its numbers as attributes, its title and headline,
/// admitted and refused per bin; returns the next `y`.
fn limiter_chart(
    body: &mut String,
    y: f64,
    extent: Extent,
    i: usize,
    n: usize,
    l: &LimiterReport,
    (bin, admitted, refused): &Binned,
) -> f64 {
    let (mut fr, next) = full_frame(y, SHORT, extent.span, Scale::fit(extent.top));
    fr.time_label = "the logs' own time since their first line";
    let u = &l.unfinished_refusal_runs;
    let _ = writeln!(
        body,
        r#"<g data-panel="replay-{}" data-calibration="{i}" data-metered="{}" data-refused="{}" data-shadow-refused="{}" data-longest-lockout-seconds="{}" data-unfinished-runs="{}">"#,
        escape(&l.name),
        l.metered,
        l.refused,
        l.shadow_refused,
        l.longest_refusal_run_seconds,
        u.total()
    );
    // The title stops short of the legend on its line.
    let title = format!(
        "{}: requests per {}{}",
        l.name,
        fmt_secs(*bin as f64),
        which(n, i)
    );
    fr.draw(
        body,
        &shorten(&title, fr.w - 200.0, 14.0, true),
        &shorten(&headline(l), fr.w, 12.0, false),
        "requests",
        &[("admitted", GREEN, false), ("refused", RED, false)],
    );
    fr.series(
        body,
        "admitted",
        None,
        *bin,
        &floats(admitted),
        GREEN,
        false,
    );
    fr.series(body, "refused", None, *bin, &floats(refused), RED, false);
    let _ = writeln!(body, "</g>");
    next
}

/// The whole document: the page, its title and subtitle, then `body`; `y` is where it ends.
fn document(reports: &[&ReplayReport], body: &str, y: f64) -> String {
    let height = y.ceil();
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(o, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let files = reports
        .first()
        .map(|r| r.files.join(", "))
        .unwrap_or_default();
    let title = format!("fleet-limiter replay: {files}");
    let _ = writeln!(
        o,
        r#"<text x="{LEFT}" y="24" font-size="16" font-weight="bold">{}</text>"#,
        escape(&shorten(&title, WIDTH - LEFT - RIGHT, 16.0, true))
    );
    let _ = writeln!(
        o,
        r##"<text x="{LEFT}" y="44" fill="{GREY}">The logs' own time since their first line. Panels of one limiter share their y-scale.</text>"##
    );
    o.push_str(body);
    o.push_str("</svg>\n");
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_text_is_shortened_to_its_width_and_short_text_kept() {
        assert_eq!(shorten("site.log", 500.0, 12.0, false), "site.log");
        let long = "x".repeat(500);
        for bold in [false, true] {
            let f = shorten(&long, 300.0, 14.0, bold);
            assert!(text_width(&f, 14.0, bold) <= 300.0, "{f}");
            assert!(f.contains('…'));
        }
        assert_eq!(shorten("abcdefghij", 6.0 * 7.2, 12.0, false), "abc…ij");
    }
}
