//! `fleet-limiter demo-upstream`: a stand-in for the API fleet-limiter fronts, for trying the
//! gateway without one. It answers every request `200` with a small JSON document naming the
//! method and path it served (the path cut at 256 bytes), reads no body beyond 64 KiB, and
//! listens on loopback unless told otherwise. Not for production: it is what README's first try
//! puts behind the gateway.

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use std::process::ExitCode;

/// The default address: the upstream README's quick start names.
pub const DEMO_UPSTREAM_LISTEN: &str = "127.0.0.1:3000";
/// The longest path echoed back.
const MAX_ECHO: usize = 256;

async fn serve(req: HttpRequest) -> HttpResponse {
    let served = req.uri().path_and_query().map_or("/", |pq| pq.as_str());
    let cut = served
        .char_indices()
        .take_while(|(i, _)| *i < MAX_ECHO)
        .map(|(_, c)| c)
        .collect::<String>();
    HttpResponse::Ok().json(serde_json::json!({
        "served": cut,
        "method": req.method().as_str(),
    }))
}

/// Serve until interrupted; 2 when the address cannot be used.
pub fn run_demo_upstream(listen: &str) -> ExitCode {
    let addr: std::net::SocketAddr = match listen.parse() {
        Ok(a) => a,
        Err(_) => {
            crate::log_sink::eprint_line(format!(
                "fleet-limiter: demo-upstream: `{}` is not an address:port (e.g. {DEMO_UPSTREAM_LISTEN})",
                crate::redact::printable(listen, 64)
            ));
            return ExitCode::from(2);
        }
    };
    let run = actix_web::rt::System::new().block_on(async move {
        let server = HttpServer::new(|| {
            App::new()
                .app_data(web::PayloadConfig::new(64 * 1024))
                .default_service(web::to(serve))
        })
        .workers(1)
        .bind(addr)?;
        for a in server.addrs() {
            crate::log_sink::eprint_line(format!(
                "fleet-limiter: demo-upstream listening on http://{a} (a stand-in API: every request answered 200)"
            ));
        }
        server.run().await
    });
    match run {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            crate::log_sink::eprint_line(format!(
                "fleet-limiter: demo-upstream: cannot listen on {addr}: {e}; choose another address with --listen"
            ));
            ExitCode::from(2)
        }
    }
}
