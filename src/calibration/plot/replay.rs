//! `replay --plot FILE.svg`: each limiter's admitted and refused requests over the logs' own time.

use super::*;

/// The SVG document for a replay: for each limiter that metered anything, the requests it
/// admitted and refused per bin over the logs' own time, one panel per calibration (`--against`
/// adds the second), both on the same y-scale so they read side by side.
pub fn replay_svg(reports: &[&crate::calibration::replay::ReplayReport]) -> String {
    let mut body = String::new();
    let mut y = 64.0;
    let mut names: Vec<&str> = Vec::new();
    for r in reports {
        for l in &r.limiters {
            if l.metered > 0 && !names.contains(&l.name.as_str()) {
                names.push(&l.name);
            }
        }
    }
    let span = reports
        .iter()
        .map(|r| r.span_seconds)
        .fold(0.0f64, f64::max)
        .max(60.0);
    for name in names {
        let panels: Vec<(usize, &crate::calibration::replay::LimiterReport)> = reports
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.limiters.iter().find(|l| l.name == name).map(|l| (i, l)))
            .collect();
        let merged: Vec<(u64, Vec<u64>, Vec<u64>)> =
            panels.iter().map(|(_, l)| counts(&l.series)).collect();
        let top = merged
            .iter()
            .flat_map(|(_, a, r)| a.iter().chain(r))
            .copied()
            .max()
            .unwrap_or(0) as f64;
        // Whole bins: the last one drawn ends inside the frame.
        let span = merged
            .iter()
            .map(|(bin, a, _)| (a.len() as u64 * bin) as f64)
            .fold(span, f64::max);
        for ((i, l), (bin, admitted, refused)) in panels.iter().zip(&merged) {
            let (fr, next) = full_frame(y, SHORT, span, Scale::fit(top));
            y = next;
            let which = if reports.len() > 1 {
                format!(
                    " ({})",
                    if *i == 0 {
                        "the calibration"
                    } else {
                        "--against"
                    }
                )
            } else {
                String::new()
            };
            let headline = format!(
                "{} metered, {} refused, {} shadow-refused; longest refusal run {}.",
                l.metered,
                l.refused,
                l.shadow_refused,
                fmt_secs(l.longest_refusal_run_seconds)
            );
            let _ = writeln!(
                body,
                r#"<g data-panel="replay-{}" data-calibration="{i}">"#,
                escape(&l.name)
            );
            fr.draw(
                &mut body,
                &format!("{}: requests per {}{which}", l.name, fmt_secs(*bin as f64)),
                &headline,
                "requests",
                &[("admitted", GREEN, false), ("refused", RED, false)],
            );
            fr.series(
                &mut body,
                "admitted",
                None,
                *bin,
                &floats(admitted),
                GREEN,
                false,
            );
            fr.series(
                &mut body,
                "refused",
                None,
                *bin,
                &floats(refused),
                RED,
                false,
            );
            let _ = writeln!(body, "</g>");
        }
    }
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
    let _ = writeln!(
        o,
        r#"<text x="{LEFT}" y="24" font-size="16" font-weight="bold">fleet-limiter replay: {}</text>"#,
        escape(&files)
    );
    let _ = writeln!(
        o,
        r##"<text x="{LEFT}" y="44" fill="{GREY}">The logs' own time since their first line. Panels of one limiter share their y-scale.</text>"##
    );
    o.push_str(&body);
    o.push_str("</svg>\n");
    o
}
