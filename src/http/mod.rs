//! HTTP glue: the middleware, the responses it renders, and the streaming proxy.

pub mod admin;
pub mod cors;
#[cfg(feature = "actix-governor")]
pub mod governor;
pub mod middleware;
pub mod proxy;
pub mod response;

use crate::config::Config;
use crate::decision::Decider;
use actix_web::{web, App, HttpServer};
use middleware::FleetLimiter;
use proxy::Upstream;
use std::sync::Arc;

/// Run the gateway until it is stopped: limiter in front, streaming proxy behind.
pub async fn serve_gateway(cfg: &Config, decider: Arc<Decider>) -> anyhow::Result<()> {
    serve_gateway_with(cfg, decider, admin::file_reloader(cfg)).await
}

/// [`serve_gateway`], with the admin listener reloading through `reloader` (SIGHUP, POST /reload).
pub async fn serve_gateway_with(
    cfg: &Config,
    decider: Arc<Decider>,
    reloader: admin::Reloader,
) -> anyhow::Result<()> {
    let base = cfg.server.upstream.clone().ok_or_else(|| {
        anyhow::anyhow!(
            "no upstream: pass --upstream http://host:port, set FLEET_LIMITER_UPSTREAM, or set server.upstream in the config file"
        )
    })?;
    let upstream = Upstream {
        base,
        connect_timeout: cfg.server.connect_timeout,
        read_timeout: cfg.server.read_timeout,
        body: proxy::pace::BodyRules::new(cfg.server.body_timeout, cfg.server.body_min_rate),
    };
    // The proxy reads nothing from the outcome: no extension to allocate per request.
    let limiter = FleetLimiter::new(decider.clone())
        .with_session_cookie(cfg.identity.session_cookie.clone())
        .with_outcome_extension(false);
    let cors = cors::Cors::new(&cfg.cors);
    let control = Arc::new(admin::Control::new(cfg, decider, cors.clone(), reloader));
    let up = upstream.clone();
    let server = HttpServer::new(move || {
        App::new()
            .app_data(web::Data::new(up.client()))
            .app_data(web::Data::new(up.clone()))
            .app_data(web::PayloadConfig::new(usize::MAX))
            .wrap(limiter.clone())
            .wrap(cors.clone())
            .default_service(web::to(proxy::forward))
    })
    .disable_signals()
    .shutdown_timeout(cfg.ops.shutdown_grace.as_secs_f64().ceil() as u64)
    .bind(cfg.server.listen)
    .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", cfg.server.listen))?;
    tracing::info!(
        listen = %cfg.server.listen,
        upstream = %crate::redact::url(&upstream.base),
        limiters = cfg.limiters.len(),
        enabled = cfg.enabled,
        "fleet-limiter gateway started"
    );
    admin::run(server.run(), control, cfg).await
}
