//! HTTP glue: the middleware, the responses it renders, and the streaming proxy.

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
    let base = cfg.server.upstream.clone().ok_or_else(|| {
        anyhow::anyhow!(
            "no upstream: pass --upstream http://host:port, set FLEET_LIMITER_UPSTREAM, or set server.upstream in the config file"
        )
    })?;
    let upstream = Upstream {
        base,
        connect_timeout: cfg.server.connect_timeout,
        read_timeout: cfg.server.read_timeout,
    };
    let limiter =
        FleetLimiter::new(decider).with_session_cookie(cfg.identity.session_cookie.clone());
    let up = upstream.clone();
    let server = HttpServer::new(move || {
        App::new()
            .app_data(web::Data::new(up.client()))
            .app_data(web::Data::new(up.clone()))
            .app_data(web::PayloadConfig::new(usize::MAX))
            .wrap(limiter.clone())
            .default_service(web::to(proxy::forward))
    })
    .bind(cfg.server.listen)
    .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", cfg.server.listen))?;
    tracing::info!(
        listen = %cfg.server.listen,
        upstream = %upstream.base,
        limiters = cfg.limiters.len(),
        enabled = cfg.enabled,
        "fleet-limiter gateway started"
    );
    server.run().await?;
    Ok(())
}
