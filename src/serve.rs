//! `fleet-limiter serve` as one library call: load the configuration, start logging, admit the
//! calibration, build the decider, run the gateway; the exit code says how it ended (0 stopped,
//! 1 failed while running, 2 a configuration that cannot be used).

use crate::config::admit;
use crate::config::ops::LogFormat;
use crate::config::{Config, Loader};
use crate::http::control::Reloader;
use crate::log_sink::eprint_line;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;

/// What a configuration error exits with, as every command's.
const CONFIG_ERROR: u8 = 2;

/// Run the gateway `loader` describes until it is stopped. `loader` is asked again on every
/// reload (SIGHUP, `POST /reload`), which is held to the same rules as the start: an unsafe
/// calibration is refused unless `allow_unsafe`.
pub fn run(loader: impl Fn() -> Loader + Send + Sync + 'static, allow_unsafe: bool) -> ExitCode {
    // Before any thread starts: the sockets a service manager handed over, if any.
    let handed = crate::http::listeners::adopt_from_env();
    let first = loader();
    let cfg = match first.load() {
        Ok(c) => c,
        Err(e) => {
            eprint_line(format!("fleet-limiter: configuration error: {e}"));
            return ExitCode::from(CONFIG_ERROR);
        }
    };
    init_logging(cfg.ops.log_format);
    match handed {
        Ok(said) => said.iter().for_each(|s| tracing::info!("{s}")),
        Err(e) => {
            eprint_line(format!("fleet-limiter: configuration error: {e}"));
            return ExitCode::from(CONFIG_ERROR);
        }
    }
    for w in first.warnings() {
        tracing::warn!("{w}");
    }
    if let Err(e) = crate::gateway::Plan::of(&cfg) {
        eprint_line(format!("fleet-limiter: configuration error: {e}"));
        return ExitCode::from(CONFIG_ERROR);
    }
    for w in cfg.count_warnings() {
        tracing::warn!("{w}");
    }
    for w in crate::config::check::routes::route_warnings(&cfg) {
        tracing::warn!("{w}");
    }
    if let Err(code) = admit_at_startup(&cfg, allow_unsafe) {
        return code;
    }
    let decider = match crate::wiring::build_decider(&cfg) {
        Ok(d) => Arc::new(d),
        Err(e) => {
            eprint_line(format!("fleet-limiter: {e}"));
            return ExitCode::from(e.exit_code());
        }
    };
    let reloader: Reloader = Arc::new(move || {
        let cfg = loader().load().map_err(|e| e.to_string())?;
        admit::admit(&cfg, allow_unsafe).map_err(|r| r.to_string())?;
        Ok(cfg)
    });
    let run = actix_web::rt::System::new().block_on(crate::gateway::serve_gateway_with(
        &cfg,
        decider.clone(),
        reloader,
    ));
    if let Some(path) = &cfg.store.state_file {
        save_state(&decider, path);
    }
    match run {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is_config() => {
            eprint_line(format!("fleet-limiter: configuration error: {e}"));
            ExitCode::from(e.exit_code())
        }
        Err(e) => {
            eprint_line(format!("fleet-limiter: {e}"));
            ExitCode::from(e.exit_code())
        }
    }
}

/// Log lines to stderr, as text or JSON, at the level `FLEET_LIMITER_LOG` asks (`info`
/// otherwise).
/// Write the buckets to `store.state_file` once the listeners have drained, so that the next
/// process starts where this one stopped.
fn save_state(decider: &crate::decision::Decider, path: &std::path::Path) {
    let started = std::time::Instant::now();
    match decider.save_state(path) {
        None => {}
        Some(Ok((buckets, known))) => tracing::info!(
            buckets,
            known_agents = known,
            milliseconds = started.elapsed().as_secs_f64() * 1e3,
            "store.state_file: buckets written to {}",
            path.display()
        ),
        Some(Err(e)) => tracing::error!(
            "store.state_file: cannot write {}: {e}; the next start begins with no bucket",
            path.display()
        ),
    }
}

fn init_logging(format: LogFormat) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = tracing_subscriber::EnvFilter::try_from_env("FLEET_LIMITER_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        // A log line that cannot be written (its reader is gone) is dropped and counted; it
        // never panics the thread that logged it.
        .with_writer(crate::log_sink::Stderr)
        .log_internal_errors(false);
    // A client's malformed request is the client's: DEBUG, never ERROR.
    let faults = crate::log_sink::ClientFaults;
    let _ = match format {
        LogFormat::Text => fmt.finish().with(faults).try_init(),
        LogFormat::Json => fmt
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .finish()
            .with(faults)
            .try_init(),
    };
}

/// The admission rule before `serve` listens: warnings are logged; an unsafe calibration stops
/// it (exit code 2) with each limiter and reason on stderr, unless the operator allowed it.
fn admit_at_startup(cfg: &Config, allow_unsafe: bool) -> Result<(), ExitCode> {
    match admit::admit(cfg, allow_unsafe) {
        Ok(admitted) => {
            // A calibration finding is check's to explain: one line names it. Warnings are
            // about the operator's own limiters.
            if let Some(line) = admitted.risk_summary() {
                tracing::info!("{line}");
            }
            for w in &admitted.warnings {
                tracing::warn!("calibration: {w}");
            }
            for p in &admitted.overridden {
                tracing::warn!(
                    "unsafe calibration, starting anyway (--allow-unsafe-calibration): {p}"
                );
            }
            Ok(())
        }
        Err(refusal) => {
            for w in &refusal.warnings {
                tracing::warn!("calibration: {w}");
            }
            eprint_line(
                "fleet-limiter: refusing to start: the calibration is unsafe for the declared fleet",
            );
            for p in &refusal.problems {
                eprint_line(format!("  unsafe: {p}"));
            }
            eprint_line("Run `fleet-limiter check` for the full report. Fix the limiters or the [fleet] settings, or pass --allow-unsafe-calibration (FLEET_LIMITER_ALLOW_UNSAFE_CALIBRATION=true) to start anyway.");
            Err(ExitCode::from(CONFIG_ERROR))
        }
    }
}
