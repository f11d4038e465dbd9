//! One minimal actix-web app, three ways, for `bench/run.sh`:
//!
//! ```sh
//! bench-middleware fleet    CONFIG.toml 127.0.0.1:8090   # FleetLimiter from the config file
//! bench-middleware governor allowed|refused 127.0.0.1:8090  # actix-governor keyed on ip+agent
//! bench-middleware bare     - 127.0.0.1:8090             # no limiter at all
//! ```
//!
//! Every mode serves `POST /api/agent/heartbeat` with the same trivial handler.

use actix_governor::{Governor, GovernorConfigBuilder, KeyExtractor, SimpleKeyExtractionError};
use actix_web::dev::ServiceRequest;
use actix_web::{web, App, HttpServer};
use fleet_limiter::FleetLimiter;
use fleet_limiter::Loader;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// governor's key for the same principal fleet-limiter meters: client IP plus `X-Agent-ID`.
#[derive(Clone)]
struct IpAgent;

impl KeyExtractor for IpAgent {
    type Key = (IpAddr, String);
    type KeyExtractionError = SimpleKeyExtractionError<&'static str>;

    fn extract(&self, req: &ServiceRequest) -> Result<Self::Key, Self::KeyExtractionError> {
        let ip = req
            .peer_addr()
            .map(|a| a.ip())
            .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
        let agent = req
            .headers()
            .get("x-agent-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("none")
            .to_owned();
        Ok((ip, agent))
    }
}

/// The heartbeat handler: reads the body, as a real one parses it.
async fn heartbeat(_body: web::Bytes) -> &'static str {
    "ok"
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: bench-middleware fleet CONFIG|governor allowed|refused|bare - LISTEN";
    if args.len() != 4 {
        eprintln!("{usage}");
        std::process::exit(2);
    }
    let (mode, arg, listen) = (args[1].clone(), args[2].clone(), args[3].clone());
    actix_web::rt::System::new().block_on(async move {
        match mode.as_str() {
            "fleet" => {
                let cfg = Loader::new()
                    .file(&arg)
                    .process_env()
                    .load()
                    .map_err(std::io::Error::other)?;
                let limiter = FleetLimiter::from_config(&cfg).map_err(std::io::Error::other)?;
                HttpServer::new(move || {
                    App::new()
                        .wrap(limiter.clone())
                        .route("/api/agent/heartbeat", web::post().to(heartbeat))
                })
                .bind(&listen)?
                .run()
                .await
            }
            "governor" => {
                // Allowed: a burst nothing reaches, refilling every nanosecond.
                // Refused: one request per key per hour.
                let (period, burst) = match arg.as_str() {
                    "refused" => (Duration::from_secs(3600), 1),
                    _ => (Duration::from_nanos(1), 1_000_000_000),
                };
                let conf = GovernorConfigBuilder::default()
                    .period(period)
                    .burst_size(burst)
                    .key_extractor(IpAgent)
                    .use_headers()
                    .finish()
                    .ok_or_else(|| std::io::Error::other("invalid governor quota"))?;
                HttpServer::new(move || {
                    App::new()
                        .wrap(Governor::new(&conf))
                        .route("/api/agent/heartbeat", web::post().to(heartbeat))
                })
                .bind(&listen)?
                .run()
                .await
            }
            "bare" => {
                HttpServer::new(|| {
                    App::new().route("/api/agent/heartbeat", web::post().to(heartbeat))
                })
                .bind(&listen)?
                .run()
                .await
            }
            _ => {
                eprintln!("{usage}");
                std::process::exit(2);
            }
        }
    })
}
