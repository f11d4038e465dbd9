//! The `fleet-limiter` command line: `serve`, `check`, `simulate` and `replay` (and nothing else belongs here).

use clap::{Parser, Subcommand};
use fleet_limiter::calibration::check;
use fleet_limiter::calibration::report::Format;
use fleet_limiter::config::ops::LogFormat;
use fleet_limiter::config::{Config, Loader};
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
    /// fleet, rollout, analysts, abuse, or all.
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
    /// TOML configuration file (every key optional; defaults are the built-in calibration).
    #[arg(long, env = "FLEET_LIMITER_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
}

#[derive(clap::Args)]
struct ServeArgs {
    #[command(flatten)]
    cfg: ConfigArgs,
    /// Address to listen on [default: 127.0.0.1:8080].
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// The upstream API, e.g. http://127.0.0.1:3000 or https://api.internal.
    #[arg(long, value_name = "URL")]
    upstream: Option<String>,
    /// A proxy range whose forwarding headers are trusted (repeatable; none by default).
    #[arg(long = "trust-proxy", value_name = "CIDR")]
    trust_proxy: Vec<String>,
    /// The header trusted proxies write: x-forwarded-for or forwarded.
    #[arg(long, value_name = "NAME")]
    forwarded_header: Option<String>,
    /// IPv6 prefix length that counts as one client (32-64) [default: 56].
    #[arg(long, value_name = "BITS")]
    ipv6_prefix: Option<String>,
    /// Where buckets live: `memory`, or a redis:// or rediss:// (TLS) URL [default: memory].
    #[arg(long, value_name = "STORE")]
    store: Option<String>,
    /// Most buckets the memory store tracks [default: 100000].
    #[arg(long, value_name = "N")]
    max_keys: Option<String>,
    /// Upstream connect timeout [default: 2s].
    #[arg(long, value_name = "DURATION")]
    connect_timeout: Option<String>,
    /// Upstream response timeout [default: 30s].
    #[arg(long, value_name = "DURATION")]
    read_timeout: Option<String>,
    /// Longest wait for the next chunk of a client's request body [default: 30s].
    #[arg(long, value_name = "DURATION")]
    body_timeout: Option<String>,
    /// Least average bytes per second of a request body after 5 s; 0 for none [default: 240].
    #[arg(long, value_name = "RATE")]
    body_min_rate: Option<String>,
    /// Start even when `fleet-limiter check` finds the calibration unsafe.
    #[arg(long, env = "FLEET_LIMITER_ALLOW_UNSAFE_CALIBRATION", value_parser = clap::builder::BoolishValueParser::new())]
    allow_unsafe_calibration: bool,
    /// Address of the admin listener (/metrics, /healthz, /readyz, /reload) [default: 127.0.0.1:7391].
    #[arg(long, value_name = "ADDR")]
    admin_listen: Option<String>,
    /// Address of the forward-auth decision listener for nginx, Caddy, Traefik and Envoy
    /// (needs decision.allow_from) [default: off].
    #[arg(long, value_name = "ADDR")]
    decision_listen: Option<String>,
    /// How long in-flight requests may finish once the listeners close after SIGTERM/SIGINT [default: 30s].
    #[arg(long, value_name = "DURATION")]
    shutdown_grace: Option<String>,
    /// Log lines as `text` or `json` [default: text].
    #[arg(long, value_name = "FORMAT")]
    log_format: Option<String>,
    /// Most requests forwarded to the upstream at once; 0 for no cap [default: 0, off].
    #[arg(long, value_name = "N")]
    admission_max_in_flight: Option<String>,
    /// How many requests may wait for a slot when every one is taken [default: 16].
    #[arg(long, value_name = "N")]
    admission_queue: Option<String>,
    /// How long one request may wait for a slot before it gets 503 [default: 1s].
    #[arg(long, value_name = "DURATION")]
    admission_queue_timeout: Option<String>,
    /// A request naming another method (X-HTTP-Method-Override, `_method`): `meter` it as both,
    /// `strip` the override, or `refuse` it [default: meter].
    #[arg(long, value_name = "MODE")]
    method_override: Option<String>,
    /// The methods forwarded, comma-separated; any other is answered 501
    /// [default: GET,HEAD,POST,PUT,PATCH,DELETE,OPTIONS].
    #[arg(long, value_name = "METHODS")]
    allowed_methods: Option<String>,
    /// The most of a group's admission slots one client address may hold or wait for, in
    /// percent; past it, 429 [default: 25].
    #[arg(long, value_name = "PERCENT")]
    admission_client_share_percent: Option<String>,
    /// How long a request holding an admission slot may keep the gateway waiting for its body
    /// in all; past it, 408 and the slot given back [default: 60s].
    #[arg(long, value_name = "DURATION")]
    admission_body_hold: Option<String>,
    /// The most WebSockets open at once [default: an eighth of the open-file limit, at most 8192].
    #[arg(long, value_name = "N")]
    websocket_max_open: Option<String>,
    /// The most WebSockets one client address holds at once [default: an eighth of the cap].
    #[arg(long, value_name = "N")]
    websocket_max_per_client: Option<String>,
    /// A WebSocket with no byte either way for this long is closed on both sides [default: 5m].
    #[arg(long, value_name = "DURATION")]
    websocket_idle_timeout: Option<String>,
    /// After SIGTERM, how long the listeners keep accepting while /readyz answers 503, before
    /// in-flight requests get --shutdown-grace to finish [default: 5s].
    #[arg(long, value_name = "DURATION")]
    drain_delay: Option<String>,
    /// The IETF `RateLimit*` headers: draft-6, draft-7, draft-8, draft-10 or off
    /// [default: draft-6].
    #[arg(long, value_name = "STANDARD")]
    headers_standard: Option<String>,
    /// Send `X-RateLimit-Limit`, `-Remaining` and `-Reset` too: true or false [default: true].
    #[arg(long, value_name = "BOOL")]
    headers_legacy: Option<String>,
    /// `X-RateLimit-Reset` as `unix` (a Unix time) or `delta` (seconds) [default: unix].
    #[arg(long, value_name = "FORM")]
    headers_legacy_reset: Option<String>,
}

fn loader(args: &ConfigArgs) -> Loader {
    let mut l = Loader::new();
    if let Some(path) = &args.config {
        l = l.file(path);
    }
    l.process_env()
}

fn load_serve(args: &ServeArgs) -> Result<Config, String> {
    serve_loader(args).load().map_err(|e| e.to_string())
}

fn serve_loader(args: &ServeArgs) -> Loader {
    let mut l = loader(&args.cfg);
    let single = [
        ("server.listen", &args.listen, "--listen"),
        ("server.upstream", &args.upstream, "--upstream"),
        (
            "client_ip.header",
            &args.forwarded_header,
            "--forwarded-header",
        ),
        ("client_ip.ipv6_prefix", &args.ipv6_prefix, "--ipv6-prefix"),
        ("store", &args.store, "--store"),
        ("store.max_keys", &args.max_keys, "--max-keys"),
        (
            "server.connect_timeout",
            &args.connect_timeout,
            "--connect-timeout",
        ),
        ("server.read_timeout", &args.read_timeout, "--read-timeout"),
        ("server.body_timeout", &args.body_timeout, "--body-timeout"),
        (
            "server.body_min_rate",
            &args.body_min_rate,
            "--body-min-rate",
        ),
        ("ops.admin_listen", &args.admin_listen, "--admin-listen"),
        (
            "decision.listen",
            &args.decision_listen,
            "--decision-listen",
        ),
        (
            "ops.shutdown_grace",
            &args.shutdown_grace,
            "--shutdown-grace",
        ),
        ("ops.log_format", &args.log_format, "--log-format"),
        (
            "admission.max_in_flight",
            &args.admission_max_in_flight,
            "--admission-max-in-flight",
        ),
        (
            "admission.queue",
            &args.admission_queue,
            "--admission-queue",
        ),
        (
            "admission.queue_timeout",
            &args.admission_queue_timeout,
            "--admission-queue-timeout",
        ),
        (
            "methods.override",
            &args.method_override,
            "--method-override",
        ),
        (
            "methods.allowed",
            &args.allowed_methods,
            "--allowed-methods",
        ),
        (
            "admission.client_share_percent",
            &args.admission_client_share_percent,
            "--admission-client-share-percent",
        ),
        (
            "admission.body_hold",
            &args.admission_body_hold,
            "--admission-body-hold",
        ),
        (
            "websocket.max_open",
            &args.websocket_max_open,
            "--websocket-max-open",
        ),
        (
            "websocket.max_per_client",
            &args.websocket_max_per_client,
            "--websocket-max-per-client",
        ),
        (
            "websocket.idle_timeout",
            &args.websocket_idle_timeout,
            "--websocket-idle-timeout",
        ),
        ("ops.drain_delay", &args.drain_delay, "--drain-delay"),
        (
            "headers.standard",
            &args.headers_standard,
            "--headers-standard",
        ),
        ("headers.legacy", &args.headers_legacy, "--headers-legacy"),
        (
            "headers.legacy_reset",
            &args.headers_legacy_reset,
            "--headers-legacy-reset",
        ),
    ];
    for (path, value, flag) in single {
        if let Some(v) = value {
            l = l.flag(path, v.clone(), flag);
        }
    }
    for t in &args.trust_proxy {
        l = l.flag("client_ip.trust_proxy", t.clone(), "--trust-proxy");
    }
    l
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
    match check::admit(cfg, allow_unsafe) {
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
            if let Err(code) = admit_at_startup(&cfg, args.allow_unsafe_calibration) {
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
                check::admit(&cfg, args.allow_unsafe_calibration).map_err(|r| r.to_string())?;
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
