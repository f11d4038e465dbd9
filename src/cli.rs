//! The command line's words: every command and its arguments, as clap parses them. The
//! binary's own module (`src/main.rs` parses with it and dispatches); the library never sees it.

use clap::{Parser, Subcommand};
use fleet_limiter::calibration::Format;
use fleet_limiter::{AllowUnsafeCalibration, ConfigFile, SettingFlags};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "fleet-limiter",
    version,
    about = "Principal-keyed rate limiter for agent-fleet HTTP APIs"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Run the gateway: rate-limit every request by its principal, forward the allowed ones.
    Serve(Box<ServeArgs>),
    /// Check the calibration against the fleet's declared cadences; exit 1 if it is unsafe (or,
    /// with --fail-on-risk, at risk).
    Check(CheckArgs),
    /// Which limiters meter each route, and each request of the declared fleet: the effective
    /// route map of the configuration (the built-in one without --config).
    Routes(RoutesArgs),
    /// Run scripted populations through the real limiter in virtual time and report what they met.
    Simulate(SimulateArgs),
    /// Replay access logs through the real limiter in the logs' own time and report what it would have refused.
    #[command(
        after_help = "Exit status: 0 when every file was read to its end and no more than --max-skipped of the lines went unreplayed; 1 when a file could not be read to its end or more lines than --max-skipped allows were late, outliers or malformed (the report and a summary of what was skipped, with the option that fixes each, are printed first); 2 when an option, a configuration or --log-format cannot be used."
    )]
    Replay(ReplayArgs),
    /// A stand-in API for trying the gateway without one: answers every request 200 with the
    /// method and path it served.
    DemoUpstream {
        /// Where it listens.
        #[arg(long, default_value = fleet_limiter::DEMO_UPSTREAM_LISTEN, value_name = "ADDR")]
        listen: String,
    },
    /// A running instance's overrides: list, add (at once, on every instance), remove.
    Override {
        #[command(flatten)]
        target: fleet_limiter::AdminTarget,
        #[command(subcommand)]
        command: fleet_limiter::OverrideCommand,
    },
    /// Forget one principal's bucket of one limiter on a running instance (unblock it).
    Reset {
        #[command(flatten)]
        target: fleet_limiter::AdminTarget,
        /// The limiter whose bucket to forget.
        #[arg(long)]
        limiter: String,
        #[command(flatten)]
        request: fleet_limiter::AskedRequest,
        /// Who asks, for the instance's log.
        #[arg(long)]
        by: Option<String>,
    },
    /// Who each limiter of a running instance refused and metered most in the last minutes
    /// (every instance on its Redis store together), refreshed like `top`.
    Top {
        #[command(flatten)]
        target: fleet_limiter::AdminTarget,
        #[command(flatten)]
        args: fleet_limiter::TopArgs,
    },
    /// What a request would meet on a running instance now, consuming nothing: the limiters,
    /// their keys described, their buckets, and whether it would be allowed.
    Explain {
        #[command(flatten)]
        target: fleet_limiter::AdminTarget,
        #[arg(long, default_value = "GET")]
        method: String,
        #[arg(long, default_value = "/")]
        path: String,
        #[command(flatten)]
        request: fleet_limiter::AskedRequest,
    },
}

#[derive(clap::Args)]
pub(crate) struct ReplayArgs {
    #[command(flatten)]
    pub(crate) cfg: ConfigArgs,
    /// A second configuration to replay the same logs through, shown beside the first.
    #[arg(long, value_name = "OTHER.toml")]
    pub(crate) against: Option<PathBuf>,
    /// `combined` (nginx, Express morgan), `alb` (AWS ALB), `json` or `json:key=field,...`
    /// (JSON lines), or an nginx `log_format` string.
    #[arg(long = "log-format", default_value = "combined", value_name = "FORMAT")]
    pub(crate) log_format: String,
    /// How many seconds out of order a timestamp may arrive and still be replayed in order. The
    /// default, 120, is twice the 60 s request timeout servers and proxies default to, for
    /// logs written as requests complete (Apache's own access log, say).
    #[arg(long, default_value_t = fleet_limiter::calibration::DEFAULT_REORDER_SECONDS, value_name = "SECONDS")]
    pub(crate) reorder_seconds: u64,
    /// The share of lines that may go unreplayed (late, outliers, malformed) before the exit
    /// status is 1: 0 to 100, with or without `%`. 100 never fails on skipped lines; the
    /// summary is printed either way.
    #[arg(long = "max-skipped", default_value = "1", value_name = "PERCENT", allow_hyphen_values = true, value_parser = fleet_limiter::calibration::parse_max_skipped)]
    pub(crate) max_skipped: f64,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    pub(crate) format: Format,
    /// Also draw each limiter's admitted and refused requests over the logs' time, as SVG.
    #[arg(long, value_name = "FILE.svg")]
    pub(crate) plot: Option<PathBuf>,
    /// Access logs, plain or gzip.
    #[arg(required = true, value_name = "LOG")]
    pub(crate) logs: Vec<PathBuf>,
}

#[derive(clap::Args)]
pub(crate) struct CheckArgs {
    #[command(flatten)]
    pub(crate) cfg: ConfigArgs,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    pub(crate) format: Format,
    /// Also exit 1 when a limiter is at risk: dashboards keyed on the IP for want of an
    /// `[identity]` token verifier, more than their shared bucket carries.
    #[arg(long)]
    pub(crate) fail_on_risk: bool,
}

#[derive(clap::Args)]
pub(crate) struct RoutesArgs {
    #[command(flatten)]
    pub(crate) cfg: ConfigArgs,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    pub(crate) format: Format,
}

#[derive(clap::Args)]
pub(crate) struct SimulateArgs {
    #[command(flatten)]
    pub(crate) cfg: ConfigArgs,
    /// fleet, rollout, analysts, abuse, rotation, failed-only, table-flood, auth-ceilings, herd,
    /// or all; also nat-rollout (2 000 endpoints behind one NAT, with and without an override), by name.
    #[arg(long, default_value = "all", value_name = "NAME")]
    pub(crate) scenario: String,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    pub(crate) format: Format,
    /// Seed of the scripted randomness: the same seed gives the same run.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub(crate) seed: u64,
    /// Also draw the runs over time to this SVG file (checked before the run; its path is printed on stderr).
    #[arg(long, value_name = "FILE.svg")]
    pub(crate) plot: Option<PathBuf>,
    /// Also write the scenario's requests as a JSON-lines access log, for `replay --log-format json`
    /// (one --scenario only).
    #[arg(long, value_name = "FILE")]
    pub(crate) emit_log: Option<PathBuf>,
}

/// Flags shared by every command that reads the configuration.
#[derive(clap::Args, Clone)]
pub(crate) struct ConfigArgs {
    #[command(flatten)]
    pub(crate) file: ConfigFile,
}

#[derive(clap::Args)]
pub(crate) struct ServeArgs {
    #[command(flatten)]
    pub(crate) cfg: ConfigArgs,
    /// Every setting's flag (`--listen`, `--upstream`, `--trust-proxy`, ...).
    #[command(flatten)]
    pub(crate) settings: SettingFlags,
    #[command(flatten)]
    pub(crate) allow_unsafe: AllowUnsafeCalibration,
}
