//! The `herd` scenario's figure: its three runs side by side on one y-scale.

use super::kit::*;
use crate::calibration::fmt_secs;
use crate::calibration::simulate::herd::{HerdReport, HerdRun};
use std::fmt::Write;

/// The herd on its own cadence beside the herd on poll slots; returns the next `y`.
pub(super) fn herd(o: &mut String, h: &HerdReport, y: f64) -> f64 {
    let runs: [(&str, &str, &HerdRun); 3] = [
        (
            "herd-own-cadence",
            "herd: each agent on its own cadence",
            &h.own_cadence,
        ),
        (
            "herd-poll-slots",
            "herd: each agent on its poll slot",
            &h.poll_slots,
        ),
        (
            "herd-backend-aware",
            "herd: poll slots + backend-aware shaping",
            &h.backend_aware,
        ),
    ];
    let merged: Vec<(u64, Vec<u64>, Vec<u64>)> = runs.iter().map(|r| counts(&r.2.series)).collect();
    // Both runs share one y-scale, so their heights compare.
    let top = merged
        .iter()
        .flat_map(|(_, ad, re)| ad.iter().chain(re))
        .copied()
        .max()
        .unwrap_or(0) as f64;
    let scale = Scale::fit(top);
    let gap = 84.0;
    let w = (WIDTH - LEFT - RIGHT - 2.0 * gap) / 3.0;
    for (i, ((name, title, run), (bin, admitted, refused))) in runs.iter().zip(&merged).enumerate()
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
            &format!(
                "Peak-to-mean {} after the first minute; {} marked offline.",
                run.peak_to_mean_after_first_minute, run.agents_marked_offline
            ),
            &format!("heartbeats per {}", fmt_secs(*bin as f64)),
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
        "{} agents behind {} NATs, all back from an outage in one second; three runs of {} on one y-scale. Green admitted, red refused.",
        h.agents,
        h.sites,
        fmt_secs(h.duration_seconds as f64)
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
