//! The `fleet-limiter` command line: `serve`, `check`, `routes`, `simulate`, `replay`, and the levers of a
//! running instance (`override`, `reset`, `explain`) (and nothing else belongs here).

mod cli;

use clap::Parser;
use cli::{Cli, Command, ConfigArgs};
use fleet_limiter::Loader;
use std::process::ExitCode;
use std::sync::Arc;

/// The gateway allocates a few small buffers per request (headers, bodies, futures); mimalloc's
/// thread-local free lists serve them faster than the system allocator (docs/benchmarks.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn loader(args: &ConfigArgs) -> Loader {
    args.file.loader()
}

/// `check` and `simulate` log nothing: unknown variables are named on stderr.
fn warn_unknown(l: &Loader) {
    for w in l.warnings() {
        eprintln!("fleet-limiter: warning: {w}");
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => {
            let allow_unsafe = args.allow_unsafe.0;
            let args: Arc<cli::ServeArgs> = Arc::from(args);
            fleet_limiter::serve(move || args.settings.apply(loader(&args.cfg)), allow_unsafe)
        }
        Command::Check(args) => {
            let l = loader(&args.cfg);
            warn_unknown(&l);
            fleet_limiter::calibration::run_check_with(l, args.format, args.fail_on_risk)
        }
        Command::Routes(args) => {
            let l = loader(&args.cfg);
            warn_unknown(&l);
            fleet_limiter::calibration::run_routes(l, args.format)
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
        Command::Override { target, command } => fleet_limiter::run_override(&target, &command),
        Command::DemoUpstream { listen } => fleet_limiter::run_demo_upstream(&listen),
        Command::Reset {
            target,
            limiter,
            request,
            by,
        } => fleet_limiter::run_reset(&target, &limiter, &request, by.as_deref()),
        Command::Top { target, args } => fleet_limiter::run_top(&target, &args),
        Command::Explain {
            target,
            method,
            path,
            request,
        } => fleet_limiter::run_explain(&target, &method, &path, &request),
        Command::Replay(args) => {
            let l = loader(&args.cfg);
            warn_unknown(&l);
            let against = args.against.as_ref().map(|p| {
                let a = Loader::new().file(p).process_env();
                warn_unknown(&a);
                a
            });
            fleet_limiter::calibration::run_replay(
                l,
                against,
                Some(&args.log_format),
                args.reorder_seconds,
                args.max_skipped,
                &args.logs,
                args.format,
                args.plot.as_deref(),
            )
        }
    }
}
