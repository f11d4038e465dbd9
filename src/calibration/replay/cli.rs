//! `fleet-limiter replay` itself: reading the files, running each calibration, printing the report.

use super::*;
use std::process::ExitCode;

/// Shows lines per second and how much of the file is left, on a terminal only.
struct Progress {
    on: bool,
    started: std::time::Instant,
}

impl Progress {
    fn show(&self, lines: u64, log: &input::Log, name: &str) {
        if !self.on {
            return;
        }
        let elapsed = self.started.elapsed().as_secs_f64().max(1e-3);
        let read = log.read.load(Ordering::Relaxed);
        let rate = read as f64 / elapsed;
        let left = if log.size > read && rate > 0.0 {
            format!(", about {:.0} s left", (log.size - read) as f64 / rate)
        } else {
            String::new()
        };
        eprint!(
            "\rfleet-limiter replay: {name}: {lines} lines, {:.0} lines/s{left}   ",
            lines as f64 / elapsed
        );
    }
}

/// Why a replay could not run at all.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReplayError {
    /// The runtime the replay runs on could not be built.
    #[error(transparent)]
    Runtime(#[from] std::io::Error),
}

/// Replay `logs` through `cfg`.
pub(crate) fn run(
    cfg: &Config,
    opts: &Options,
    logs: &[PathBuf],
) -> Result<ReplayReport, ReplayError> {
    let rt = tokio::runtime::Builder::new_current_thread().build()?;
    rt.block_on(async {
        let mut rp = Replayer::new(cfg, opts);
        let progress = Progress {
            on: std::io::stderr().is_terminal(),
            started: std::time::Instant::now(),
        };
        let mut buf = Vec::with_capacity(4096);
        for path in logs {
            let name = path.display().to_string();
            rp.report.files.push(name.clone());
            if let Err(e) = replay_file(&mut rp, opts, path, &name, &mut buf, &progress).await {
                rp.report.read_errors.push(format!("{name}: {e}"));
            }
        }
        if progress.on {
            eprintln!();
        }
        Ok(rp.finish().await)
    })
}

async fn replay_file(
    rp: &mut Replayer,
    opts: &Options,
    path: &Path,
    name: &str,
    buf: &mut Vec<u8>,
    progress: &Progress,
) -> std::io::Result<()> {
    let mut log = input::open(path)?;
    let file = rp.report.files.len().saturating_sub(1);
    let mut n = 0u64;
    let mut scratch = serde_json::Map::new();
    loop {
        let got = input::next_line(&mut *log.reader, buf).map_err(|e| {
            let what = if log.gzip { "gzip stream" } else { "file" };
            std::io::Error::new(e.kind(), format!("{what} unreadable after line {n}: {e}"))
        })?;
        n += 1;
        match got {
            input::Line::End => return Ok(()),
            input::Line::TooLong => {
                rp.report.lines += 1;
                rp.malformed(name, n, Malformed::TooLong);
            }
            input::Line::Text => {
                rp.report.lines += 1;
                let res = match opts.format.read(buf, &mut scratch) {
                    Ok(f) => rp.push(&f, file, n).await,
                    Err(e) => Err(e),
                };
                if let Err(why) = res {
                    rp.malformed_line(name, n, why, buf);
                }
            }
        }
        if n.is_multiple_of(1 << 18) {
            progress.show(rp.report.lines, &log, name);
        }
    }
}

/// `fleet-limiter replay`: replay the logs through one calibration, or two with `against`, and
/// print the report. Exit 0 when every file was read to its end and no more than
/// `max_skipped_percent` of the lines went unreplayed, 1 otherwise (after the report), 2 when a
/// configuration or the log format cannot be used.
#[allow(clippy::too_many_arguments)]
pub fn run_replay(
    loader: crate::config::Loader,
    against: Option<crate::config::Loader>,
    log_format: Option<&str>,
    reorder_seconds: u64,
    max_skipped_percent: f64,
    logs: &[PathBuf],
    format: crate::calibration::report::Format,
    plot: Option<&Path>,
) -> ExitCode {
    let opts = match LineFormat::parse(log_format.unwrap_or("combined")) {
        Ok(f) => Options {
            format: f,
            reorder_seconds,
        },
        Err(e) => return fail(format!("--log-format: {e}")),
    };
    // The plot's file is checked before the run, so a typo costs nothing.
    let created = match plot.map(crate::calibration::plot_target).transpose() {
        Ok(c) => c.unwrap_or(false),
        Err(e) => return fail(format!("--plot: {e}")),
    };
    let plot_file = PlotFile {
        path: plot,
        created,
    };
    let calibrations = std::iter::once(loader).chain(against);
    let reports = match run_calibrations(calibrations, &opts, logs, max_skipped_percent, &plot_file)
    {
        Ok(reports) => reports,
        Err(code) => return code,
    };
    crate::log_sink::print(&report_text(format, &reports));
    if let Some(path) = plot {
        if let Err(code) = write_plot(path, &reports) {
            return code;
        }
    }
    // Every calibration reads the same lines: what they were is said once.
    let Some(r) = reports.first() else {
        return ExitCode::SUCCESS;
    };
    say_outliers(r);
    for line in summary::describe(r) {
        crate::log_sink::eprint_line(format!("fleet-limiter: {line}"));
    }
    say_no_limiter_matched(&reports);
    exit_status(r)
}

/// Says `msg` on stderr as the command's error and gives exit status 2.
fn fail(msg: String) -> ExitCode {
    crate::log_sink::eprint_line(format!("fleet-limiter: {msg}"));
    ExitCode::from(2)
}

/// The `--plot` file, and whether the check before the run created it.
struct PlotFile<'a> {
    path: Option<&'a Path>,
    created: bool,
}

impl PlotFile<'_> {
    /// Removes the plot's file when the check before the run created it.
    fn drop_created(&self) {
        if let (Some(path), true) = (self.path, self.created) {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Loads each calibration and replays the logs through it, in order; on a configuration that
/// cannot be loaded or a replay that cannot run, says why and gives the exit status.
fn run_calibrations(
    calibrations: impl Iterator<Item = crate::config::Loader>,
    opts: &Options,
    logs: &[PathBuf],
    max_skipped_percent: f64,
    plot: &PlotFile<'_>,
) -> Result<Vec<ReplayReport>, ExitCode> {
    let mut reports = Vec::new();
    for l in calibrations {
        let cfg = match l.load() {
            Ok(c) => c,
            Err(e) => {
                plot.drop_created();
                return Err(fail(format!("configuration error: {e}")));
            }
        };
        match run(&cfg, opts, logs) {
            Ok(mut r) => {
                r.max_skipped_percent = max_skipped_percent;
                reports.push(r);
            }
            Err(e) => {
                plot.drop_created();
                crate::log_sink::eprint_line(format!("fleet-limiter: {e}"));
                return Err(ExitCode::FAILURE);
            }
        }
    }
    Ok(reports)
}

/// The report in the format asked for: JSON, one table, or two side by side.
fn report_text(format: crate::calibration::report::Format, reports: &[ReplayReport]) -> String {
    use crate::calibration::report::Format as Out;
    match (format, reports) {
        (Out::Json, [one]) => crate::calibration::report::json(one),
        (Out::Json, many) => crate::calibration::report::json(&many),
        (Out::Table, [a, b]) => report::side_by_side(a, b),
        (Out::Table, _) => reports
            .iter()
            .map(report::table)
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

/// Writes the figure to `path` and says so; exit status 1 when it cannot be written.
fn write_plot(path: &Path, reports: &[ReplayReport]) -> Result<(), ExitCode> {
    let refs: Vec<&ReplayReport> = reports.iter().collect();
    if let Err(e) = std::fs::write(path, crate::calibration::plot::replay_svg(&refs)) {
        crate::log_sink::eprint_line(format!(
            "fleet-limiter: cannot write the plot to {}: {e}",
            path.display()
        ));
        return Err(ExitCode::FAILURE);
    }
    crate::log_sink::eprint_line(format!("fleet-limiter: plot written to {}", path.display()));
    Ok(())
}

/// Names the lines set aside as outliers on stderr, the first few each on its line.
fn say_outliers(r: &ReplayReport) {
    if r.outliers == 0 {
        return;
    }
    crate::log_sink::eprint_line(format!(
        "fleet-limiter: {} {} set aside as {}, not replayed: dated more than the reorder window past most of the {LOOK_AHEAD} lines after {}",
        r.outliers,
        if r.outliers == 1 { "line" } else { "lines" },
        if r.outliers == 1 { "an outlier" } else { "outliers" },
        if r.outliers == 1 { "it" } else { "each" },
    ));
    for o in &r.first_outliers {
        crate::log_sink::eprint_line(format!("fleet-limiter: {}", report::outlier(o)));
    }
    let more = r.outliers.saturating_sub(r.first_outliers.len() as u64);
    if more > 0 {
        crate::log_sink::eprint_line(format!("fleet-limiter: and {more} more"));
    }
}

/// Says on stderr, for each calibration that matched no limiter, which one and why.
fn say_no_limiter_matched(reports: &[ReplayReport]) {
    for r in reports {
        if let Some(none) = &r.no_limiter_matched {
            let source = r.config.as_ref().map_or_else(
                || "the built-in calibration".to_owned(),
                |p| p.display().to_string(),
            );
            crate::log_sink::eprint_line(format!("fleet-limiter: {source}: {none}"));
        }
    }
}

/// The exit status once the report is out: 1, said why, when too many lines were skipped or a
/// file was not read to its end; 0 otherwise.
fn exit_status(r: &ReplayReport) -> ExitCode {
    let mut code = ExitCode::SUCCESS;
    if summary::too_many_skipped(r) {
        crate::log_sink::eprint_line(format!(
            "fleet-limiter: exit status 1: {} of {} lines ({} %) were not replayed, more than --max-skipped {} % allows; the figures may not describe these logs (apply the fixes above, or give --max-skipped 100 to accept them)",
            r.not_replayed, r.lines, r.not_replayed_percent, r.max_skipped_percent
        ));
        code = ExitCode::FAILURE;
    }
    if !r.read_errors.is_empty() {
        for e in &r.read_errors {
            crate::log_sink::eprint_line(format!("fleet-limiter: {e}"));
        }
        return ExitCode::FAILURE;
    }
    code
}
