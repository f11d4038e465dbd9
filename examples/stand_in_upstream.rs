//! A stand-in for the API fleet-limiter fronts, for trying the gateway without one: it answers
//! every request `200` with a small JSON document naming what it served.
//!
//! ```sh
//! cargo run --release --example stand_in_upstream            # 127.0.0.1:3000
//! cargo run --release --example stand_in_upstream 127.0.0.1:3100
//! ```

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};

async fn serve(req: HttpRequest) -> HttpResponse {
    let body = serde_json::json!({
        "served": req.uri().path_and_query().map_or("/", |pq| pq.as_str()),
        "method": req.method().as_str(),
    });
    HttpResponse::Ok().json(body)
}

#[actix_web::main]
async fn main() -> std::io::Result<()> {
    let listen = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:3000".to_owned());
    let server = HttpServer::new(|| App::new().default_service(web::to(serve)))
        .workers(1)
        .bind(&listen)?;
    for addr in server.addrs() {
        eprintln!("stand-in upstream listening on http://{addr}");
    }
    server.run().await
}
