//! fleet-limiter inside your own actix-web app, instead of as a gateway in front of it.
//!
//! ```sh
//! cargo run --example embedded
//! curl -i -X POST -H 'X-Agent-ID: agent-1' http://127.0.0.1:8080/api/agent/heartbeat
//! curl -s http://127.0.0.1:8080/metrics | grep fleet_limiter_decisions_total
//! ```
//!
//! The configuration is the gateway's: built-in calibration, then `FLEET_LIMITER_CONFIG` (a
//! TOML file) and `FLEET_LIMITER_*` variables. Handlers can read the decision through the
//! `Decided` request extension.

use actix_web::{web, App, HttpMessage, HttpRequest, HttpResponse, HttpServer};
use fleet_limiter::Cors;
use fleet_limiter::Loader;
use fleet_limiter::{Decided, FleetLimiter};

async fn heartbeat(req: HttpRequest) -> HttpResponse {
    // The limiter already decided; this request was allowed.
    let remaining = req
        .extensions()
        .get::<Decided>()
        .and_then(|o| o.0.tightest().map(|t| t.verdict.remaining));
    HttpResponse::Ok().json(serde_json::json!({ "ok": true, "remaining": remaining }))
}

#[actix_web::main]
async fn main() -> anyhow::Result<()> {
    let mut loader = Loader::new();
    if let Some(file) = std::env::var_os("FLEET_LIMITER_CONFIG") {
        loader = loader.file(file);
    }
    let cfg = loader.process_env().load()?;
    let limiter = FleetLimiter::from_config(&cfg)?;
    // Optional: CORS headers on the limiter's own 429s for the configured dashboard origins.
    let cors = Cors::new(&cfg.cors);
    let decider = limiter.decider().clone();
    let listen = cfg.server.listen;
    println!("listening on http://{listen}");
    HttpServer::new(move || {
        let decider = decider.clone();
        App::new()
            .wrap(limiter.clone())
            .wrap(cors.clone())
            .route("/api/agent/heartbeat", web::post().to(heartbeat))
            .route(
                "/metrics",
                web::get().to(move || {
                    let decider = decider.clone();
                    async move {
                        HttpResponse::Ok()
                            .content_type(fleet_limiter::METRICS_CONTENT_TYPE)
                            .body(decider.metrics().render())
                    }
                }),
            )
    })
    .bind(listen)?
    .run()
    .await?;
    Ok(())
}
