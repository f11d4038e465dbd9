//! Proving a calibration before any traffic: [`run_check`] compares each limiter with the cadences
//! a healthy fleet declares, and [`simulate()`] runs the real decision path (policy, keys, memory
//! store) in virtual time against scripted populations. [`simulate_table`] and [`json`] render
//! a report as a table or as JSON; [`svg`] draws the simulation; [`run_replay`] replays an
//! access log through a configuration.
//!
//! Both speak about the same requests, listed in `traffic`, so a limiter the check says
//! carries the heartbeat is the limiter the simulator's heartbeats meet.

/// The calibration check (it belongs to the configuration, whose admission it decides).
pub(crate) use crate::config::check;
pub(crate) mod plot;
pub(crate) mod replay;
pub(crate) mod report;
pub(crate) mod simulate;

pub use plot::svg;
pub use replay::nginx::Format as LogFormat;
pub use replay::summary::parse_max_skipped;
pub use replay::{run_replay, DEFAULT_REORDER_SECONDS};
pub use report::{json, simulate_table, Format};
pub use simulate::{run as simulate, FleetReport, Scenario, ScenarioReport, SimulationReport};

use crate::config::Loader;
use std::path::Path;
use std::process::ExitCode;

/// `fleet-limiter check`: print the report; exit 0 when safe (warnings and at-risk findings
/// included), 1 when a limiter is unsafe, 2 when the configuration cannot be loaded.
pub fn run_check(loader: Loader, format: Format) -> ExitCode {
    run_check_with(loader, format, false)
}

/// [`run_check`]; with `fail_on_risk` (`check --fail-on-risk`) an at-risk limiter exits 1 too.
pub fn run_check_with(loader: Loader, format: Format, fail_on_risk: bool) -> ExitCode {
    let cfg = match loader.load() {
        Ok(c) => c,
        Err(e) => {
            crate::log_sink::eprint_line(format!("fleet-limiter: configuration error: {e}"));
            return ExitCode::from(2);
        }
    };
    for w in cfg.count_warnings() {
        crate::log_sink::eprint_line(format!("fleet-limiter: warning: {w}"));
    }
    let r = check::check(&cfg).with_routes(&cfg);
    for w in &r.route_warnings {
        crate::log_sink::eprint_line(format!("fleet-limiter: warning: {w}"));
    }
    match format {
        Format::Table => crate::log_sink::print(&report::check_table(&r)),
        Format::Json => crate::log_sink::print(&report::json(&r)),
    }
    // The table already lists every finding; JSON on stdout is for programs, so a person
    // reading the terminal gets the reasons on stderr.
    if format == Format::Json {
        for p in r.problems() {
            crate::log_sink::eprint_line(format!("unsafe: {p}"));
        }
        for p in r.risk_lines() {
            crate::log_sink::eprint_line(format!("at risk: {p}"));
        }
    }
    if !r.is_safe() || (fail_on_risk && r.is_at_risk()) {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// `fleet-limiter routes`: print which limiters meter each route pattern, and each request of
/// the declared fleet; exit 0, or 2 when the configuration cannot be loaded.
pub fn run_routes(loader: Loader, format: Format) -> ExitCode {
    let cfg = match loader.load() {
        Ok(c) => c,
        Err(e) => {
            crate::log_sink::eprint_line(format!("fleet-limiter: configuration error: {e}"));
            return ExitCode::from(2);
        }
    };
    let map = check::routes::route_map(&cfg);
    match format {
        Format::Table => crate::log_sink::print(&report::routes_table(&cfg.source, &map)),
        Format::Json => crate::log_sink::print(&report::json(&map)),
    }
    ExitCode::SUCCESS
}

/// `fleet-limiter simulate`: run the scenarios, print the report, optionally draw it.
pub fn run_simulate(
    loader: Loader,
    scenario: &str,
    format: Format,
    seed: u64,
    plot: Option<&Path>,
    emit_log: Option<&Path>,
) -> ExitCode {
    let scenarios = match simulate::Scenario::parse_list(scenario) {
        Ok(s) => s,
        Err(e) => {
            crate::log_sink::eprint_line(format!("fleet-limiter: --scenario: {e}"));
            return ExitCode::from(2);
        }
    };
    if emit_log.is_some() && scenarios.len() != 1 {
        crate::log_sink::eprint_line(
            "fleet-limiter: --emit-log: name one --scenario (each starts at time 0 with its own clients, so their traffic would not replay as one log)",
        );
        return ExitCode::from(2);
    }
    let emitted = match emit_log.map(std::fs::File::create).transpose() {
        Ok(f) => f.map(std::io::BufWriter::new),
        Err(e) => {
            crate::log_sink::eprint_line(format!("fleet-limiter: --emit-log: {e}"));
            return ExitCode::from(2);
        }
    };
    let cfg = match loader.load() {
        Ok(c) => c,
        Err(e) => {
            crate::log_sink::eprint_line(format!("fleet-limiter: configuration error: {e}"));
            return ExitCode::from(2);
        }
    };
    // The plot's file is checked before the run, so a typo costs nothing.
    let created = match plot.map(plot_target).transpose() {
        Ok(c) => c.unwrap_or(false),
        Err(e) => {
            crate::log_sink::eprint_line(format!("fleet-limiter: --plot: {e}"));
            return ExitCode::from(2);
        }
    };
    let failed_write = std::rc::Rc::new(std::cell::Cell::new(false));
    let result = match emitted {
        Some(w) => {
            use std::io::Write;
            let w = std::rc::Rc::new(std::cell::RefCell::new(w));
            let (failed, sink) = (failed_write.clone(), w.clone());
            let r = simulate::run_emitting(
                &cfg,
                &scenarios,
                seed,
                Box::new(move |at, req| {
                    if writeln!(sink.borrow_mut(), "{}", replay::emit::line(at, req)).is_err() {
                        failed.set(true);
                    }
                }),
            );
            if w.borrow_mut().flush().is_err() {
                failed_write.set(true);
            }
            r
        }
        None => simulate::run(&cfg, &scenarios, seed),
    };
    if failed_write.get() {
        crate::log_sink::eprint_line(
            "fleet-limiter: --emit-log: the log could not be written in full",
        );
        return ExitCode::FAILURE;
    }
    let r = match result {
        Ok(r) => r,
        Err(e) => {
            crate::log_sink::eprint_line(format!("fleet-limiter: {e}"));
            if let (Some(path), true) = (plot, created) {
                let _ = std::fs::remove_file(path);
            }
            return ExitCode::FAILURE;
        }
    };
    match format {
        Format::Table => crate::log_sink::print(&report::simulate_table(&r)),
        Format::Json => crate::log_sink::print(&report::json(&r)),
    }
    if let Some(path) = plot {
        if let Err(e) = std::fs::write(path, plot::svg(&r)) {
            crate::log_sink::eprint_line(format!(
                "fleet-limiter: cannot write the plot to {}: {e}",
                path.display()
            ));
            return ExitCode::FAILURE;
        }
        crate::log_sink::eprint_line(format!("fleet-limiter: plot written to {}", path.display()));
    }
    ExitCode::SUCCESS
}

/// Whether the plot can be written to `path`: its directory exists, it is not a directory, and
/// it opens for writing (without losing what it holds yet). `Ok(true)` when it did not exist and
/// was created empty.
pub(crate) fn plot_target(path: &Path) -> Result<bool, String> {
    let shown = path.display();
    if path.is_dir() {
        return Err(format!(
            "{shown} is a directory; give a file name such as {shown}/simulate.svg"
        ));
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !parent.is_dir() {
        return Err(format!(
            "cannot write {shown}: the directory {} does not exist",
            parent.display()
        ));
    }
    let existed = path.exists();
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .map_err(|e| format!("cannot write {shown}: {e}"))?;
    Ok(!existed)
}

/// The requests of the modelled fleet (they live beside the check that models them).
pub(crate) use crate::config::check::traffic;

pub(crate) use crate::config::check::fmt_secs;

#[cfg(test)]
mod tests {
    use super::fmt_secs;

    #[test]
    fn durations_read_naturally() {
        assert_eq!(fmt_secs(0.5), "500ms");
        assert_eq!(fmt_secs(2.0), "2s");
        assert_eq!(fmt_secs(90.0), "1m30s");
        assert_eq!(fmt_secs(900.0), "15m");
        assert_eq!(fmt_secs(7500.0), "2h5m");
        assert_eq!(fmt_secs(f64::INFINITY), "unbounded");
    }

    #[test]
    fn plot_target_is_checked_before_the_run() {
        let dir = tempfile::tempdir().unwrap();
        let e = super::plot_target(dir.path()).unwrap_err();
        assert!(e.contains("is a directory"), "{e}");
        let missing = dir.path().join("nope").join("x.svg");
        let e = super::plot_target(&missing).unwrap_err();
        assert!(e.contains("does not exist"), "{e}");
        let fresh = dir.path().join("x.svg");
        assert_eq!(super::plot_target(&fresh), Ok(true));
        std::fs::write(&fresh, "kept").unwrap();
        assert_eq!(super::plot_target(&fresh), Ok(false));
        assert_eq!(std::fs::read_to_string(&fresh).unwrap(), "kept");
    }
}
