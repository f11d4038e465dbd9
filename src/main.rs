//! The `fleet-limiter` command line: `serve`, `check`, `simulate` and `replay` (and nothing else belongs here).

use clap::{Parser, Subcommand};
use fleet_limiter::calibration::report::Format;
use fleet_limiter::config::admit;
use fleet_limiter::config::ops::LogFormat;
use fleet_limiter::config::{AllowUnsafeCalibration, Config, ConfigFile, Loader, SettingFlags};
use fleet_limiter::http::admin::Reloader;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

/// The gateway allocates a few small buffers per request (headers, bodies, futures); mimalloc's
/// thread-local free lists serve them faster than the system allocator (docs/benchmarks.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "fleet-limiter",
    version,
    about = "Principal-keyed rate limiter for agent-fleet HTTP APIs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway: rate-limit every request by its principal, forward the allowed ones.
    Serve(Box<ServeArgs>),
    /// Check the calibration against the fleet's declared cadences; exit 1 if it is unsafe (or,
    /// with --fail-on-risk, at risk).
    Check(CheckArgs),
    /// Run scripted populations through the real limiter in virtual time and report what they met.
    Simulate(SimulateArgs),
    /// Replay access logs through the real limiter in the logs' own time and report what it would have refused.
    Replay(ReplayArgs),
}

#[derive(clap::Args)]
struct ReplayArgs {
    #[command(flatten)]
    cfg: ConfigArgs,
    /// A second configuration to replay the same logs through, shown beside the first.
    #[arg(long, value_name = "OTHER.toml")]
    against: Option<PathBuf>,
    /// `combined` (nginx, Express morgan), `alb` (AWS ALB), `json` or `json:key=field,...`
    /// (JSON lines), or an nginx `log_format` string.
    #[arg(long = "log-format", default_value = "combined", value_name = "FORMAT")]
    log_format: String,
    /// How many seconds out of order a timestamp may arrive and still be replayed in order.
    #[arg(long, default_value_t = 5, value_name = "SECONDS")]
    reorder_seconds: u64,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
    /// Also draw each limiter's admitted and refused requests over the logs' time, as SVG.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// Access logs, plain or gzip.
    #[arg(required = true, value_name = "LOG")]
    logs: Vec<PathBuf>,
}

#[derive(clap::Args)]
struct CheckArgs {
    #[command(flatten)]
    cfg: ConfigArgs,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
    /// Also exit 1 when a limiter is at risk: dashboards keyed on the IP for want of an
    /// `[identity]` token verifier, more than their shared bucket carries.
    #[arg(long)]
    fail_on_risk: bool,
}

#[derive(clap::Args)]
struct SimulateArgs {
    #[command(flatten)]
    cfg: ConfigArgs,
    /// fleet, rollout, analysts, abuse, rotation, failed-only, table-flood, or all.
    #[arg(long, default_value = "all", value_name = "NAME")]
    scenario: String,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
    /// Seed of the scripted randomness: the same seed gives the same run.
    #[arg(long, default_value_t = 1, value_name = "N")]
    seed: u64,
    /// Also draw the runs over time to this SVG file (checked before the run; its path is printed on stderr).
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// Also write the scenario's requests as a JSON-lines access log, for `replay --log-format json`
    /// (one --scenario only).
    #[arg(long, value_name = "FILE")]
    emit_log: Option<PathBuf>,
}

/// Flags shared by every command that reads the configuration.
#[derive(clap::Args, Clone)]
struct ConfigArgs {
    #[command(flatten)]
    file: ConfigFile,
}

#[derive(clap::Args)]
struct ServeArgs {
    #[command(flatten)]
    cfg: ConfigArgs,
    /// Every setting's flag (`--listen`, `--upstream`, `--trust-proxy`, ...).
    #[command(flatten)]
    settings: SettingFlags,
    #[command(flatten)]
    allow_unsafe: AllowUnsafeCalibration,
}

fn loader(args: &ConfigArgs) -> Loader {
    args.file.loader()
}

fn load_serve(args: &ServeArgs) -> Result<Config, String> {
    serve_loader(args).load().map_err(|e| e.to_string())
}

fn serve_loader(args: &ServeArgs) -> Loader {
    args.settings.apply(loader(&args.cfg))
}

/// `check` and `simulate` log nothing: unknown variables are named on stderr.
fn warn_unknown(l: &Loader) {
    for w in l.warnings() {
        eprintln!("fleet-limiter: warning: {w}");
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("FLEET_LIMITER_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        // A log line that cannot be written (its reader is gone) is dropped and counted; it
        // never panics the thread that logged it.
        .with_writer(fleet_limiter::log_sink::Stderr)
        .log_internal_errors(false);
    match format {
        LogFormat::Text => fmt.init(),
        LogFormat::Json => fmt
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .init(),
    }
}

/// The admission rule before `serve` listens: warnings are logged; an unsafe calibration stops
/// it (exit code 2) with each limiter and reason on stderr, unless the operator allowed it.
fn admit_at_startup(cfg: &Config, allow_unsafe: bool) -> Result<(), ExitCode> {
    match admit::admit(cfg, allow_unsafe) {
        Ok(admitted) => {
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
            fleet_limiter::log_sink::eprint_line(
                "fleet-limiter: refusing to start: the calibration is unsafe for the declared fleet",
            );
            for p in &refusal.problems {
                fleet_limiter::log_sink::eprint_line(format!("  unsafe: {p}"));
            }
            fleet_limiter::log_sink::eprint_line("Run `fleet-limiter check` for the full report. Fix the limiters or the [fleet] settings, or pass --allow-unsafe-calibration (FLEET_LIMITER_ALLOW_UNSAFE_CALIBRATION=true) to start anyway.");
            Err(ExitCode::from(2))
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => {
            let args: Arc<ServeArgs> = Arc::from(args);
            let cfg = match load_serve(&args) {
                Ok(c) => c,
                Err(e) => {
                    fleet_limiter::log_sink::eprint_line(format!(
                        "fleet-limiter: configuration error: {e}"
                    ));
                    return ExitCode::from(2);
                }
            };
            init_logging(cfg.ops.log_format);
            for w in serve_loader(&args).warnings() {
                tracing::warn!("{w}");
            }
            if cfg.server.upstream.is_none() && cfg.decision.listen.is_none() {
                fleet_limiter::log_sink::eprint_line("fleet-limiter: configuration error: server.upstream: not set; pass --upstream http://host:port, set FLEET_LIMITER_UPSTREAM, or set server.upstream in the config file (or, to keep the proxy in front and only answer its questions, set decision.listen: --decision-listen, FLEET_LIMITER_DECISION_LISTEN)");
                return ExitCode::from(2);
            }
            for w in cfg.count_warnings() {
                tracing::warn!("{w}");
            }
            if let Err(code) = admit_at_startup(&cfg, args.allow_unsafe.0) {
                return code;
            }
            let decider = match fleet_limiter::build_decider(&cfg) {
                Ok(d) => Arc::new(d),
                Err(e) => {
                    fleet_limiter::log_sink::eprint_line(format!(
                        "fleet-limiter: {}",
                        fleet_limiter::redact::urls_in(&e.to_string())
                    ));
                    return ExitCode::from(2);
                }
            };
            // A reload is held to the same start-up rules: an unsafe calibration is rejected
            // (the old one stays) unless the operator allowed it.
            let reloader: Reloader = Arc::new(move || {
                let cfg = load_serve(&args)?;
                admit::admit(&cfg, args.allow_unsafe.0).map_err(|r| r.to_string())?;
                Ok(cfg)
            });
            let run = actix_web::rt::System::new().block_on(
                fleet_limiter::http::serve_gateway_with(&cfg, decider, reloader),
            );
            match run {
                Ok(()) => ExitCode::SUCCESS,
                Err(e)
                    if e.is::<fleet_limiter::http::ListenError>()
                        || e.is::<fleet_limiter::http::TlsSetupError>() =>
                {
                    fleet_limiter::log_sink::eprint_line(format!(
                        "fleet-limiter: configuration error: {e}"
                    ));
                    ExitCode::from(2)
                }
                Err(e) => {
                    fleet_limiter::log_sink::eprint_line(format!(
                        "fleet-limiter: {}",
                        fleet_limiter::redact::urls_in(&e.to_string())
                    ));
                    ExitCode::FAILURE
                }
            }
        }
        Command::Check(args) => {
            let l = loader(&args.cfg);
            warn_unknown(&l);
            fleet_limiter::calibration::run_check_with(l, args.format, args.fail_on_risk)
        }
        Command::Simulate(args) => fleet_limiter::calibration::run_simulate(
            {
                let l = loader(&args.cfg);
                warn_unknown(&l);
                l
            },
            &args.scenario,
            args.format,
            args.seed,
            args.plot.as_deref(),
            args.emit_log.as_deref(),
        ),
        Command::Replay(args) => {
            let l = loader(&args.cfg);
            warn_unknown(&l);
            let against = args.against.as_ref().map(|p| {
                let a = Loader::new().file(p).process_env();
                warn_unknown(&a);
                a
            });
            fleet_limiter::calibration::replay::run_replay(
                l,
                against,
                Some(&args.log_format),
                args.reorder_seconds,
                &args.logs,
                args.format,
                args.plot.as_deref(),
            )
        }
    }
}
