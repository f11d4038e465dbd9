//! The admin listener and the process's life cycle.
//!
//! - A listener separate from traffic (default `127.0.0.1:7391`): `GET /metrics` (Prometheus
//!   text), `GET /healthz` (the process answers), `GET /readyz` (this instance can serve traffic
//!   as configured: a configuration is loaded, the listeners are bound, it is not draining; the
//!   store's health and verified identity's are reported beside it, never making it unready),
//!   `GET /healthz/store` (the store alone), `POST /reload`.
//! - `SIGHUP` and `POST /reload` re-read the configuration the way the process read it at
//!   start. A valid one takes effect for the next request; buckets are keyed by limiter name, so
//!   unchanged limiters keep their state. An invalid one is logged with its reason and the old
//!   one stays.
//! - `SIGTERM`: `/readyz` answers 503 at once; the listeners keep accepting for
//!   `ops.drain_delay` (so a load balancer stops sending first), then close, and in-flight
//!   requests finish within `ops.shutdown_grace`; then return so the process exits 0. `SIGINT`
//!   (and a second `SIGTERM` during the delay) closes the listeners at once.

use crate::config::Config;
use crate::error::Error;
use actix_web::dev::{Server, ServerHandle};
use actix_web::http::header::ContentType;
use actix_web::{web, App, HttpResponse, HttpServer};
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;

use super::control::{Control, ReloadReport};

#[derive(Serialize)]
struct ReloadAnswer<'a> {
    reloaded: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    report: Option<&'a ReloadReport>,
}

async fn metrics_page(control: web::Data<Control>) -> HttpResponse {
    let body = control.decider().metrics().render();
    HttpResponse::Ok()
        .insert_header((
            actix_web::http::header::CONTENT_TYPE,
            crate::metrics::CONTENT_TYPE,
        ))
        .body(body)
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok()
        .content_type(ContentType::plaintext())
        .body("ok\n")
}

/// How long `/readyz` and `/healthz/store` wait for the store: well inside the 1 s a
/// Kubernetes probe waits by default, so a store that hangs is reported, never a probe timeout.
const STORE_PING_TIMEOUT: Duration = Duration::from_millis(500);

/// Whether the store answers a ping now, and why not.
async fn store_health(control: &Control) -> Result<(), String> {
    let store = control.decider().store().clone();
    match tokio::time::timeout(STORE_PING_TIMEOUT, store.ping()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!(
            "the {} store did not answer within {STORE_PING_TIMEOUT:?}",
            store.kind()
        )),
    }
}

/// The limiters by what they answer while the store cannot decide.
#[derive(Serialize)]
struct StoreDownAnswers {
    allow: Vec<String>,
    deny: Vec<String>,
    /// Decided on this instance's own buckets meanwhile (each instance grants the whole budget).
    local: Vec<String>,
}

/// `/readyz`: whether this instance can serve traffic as configured, and beside it the health of
/// what it depends on.
#[derive(Serialize)]
struct Readiness {
    ready: bool,
    /// Why not, when not ready.
    error: Option<String>,
    draining: bool,
    enabled: bool,
    store: &'static str,
    store_up: bool,
    store_error: Option<String>,
    on_store_error: StoreDownAnswers,
    identity: &'static str,
    identity_error: Option<String>,
}

/// Ready unless draining. Answered by the admin listener, which is bound after the traffic
/// listeners (and the decision listener): that it answers at all means a configuration is
/// loaded and they are bound.
///
/// The store's health never makes the instance unready unless `store.require` asks for it:
/// every instance shares the store, so a store outage would take every instance out of rotation
/// at once, and every limiter has an answer for it (`on_store_error`): `allow` keeps serving
/// unmetered, `deny` refuses that limiter's routes on purpose, `local` meters them on the
/// instance's own buckets, and either is what the operator chose; an instance out of rotation
/// answers nothing at all, for every route. With `store.require = true` the operator chose
/// otherwise: no traffic while the store does not answer. Verified identity the same way: without its
/// key set, dashboard tokens do not verify and their requests are keyed on the client IP
/// (degraded, not down).
async fn readyz(control: web::Data<Control>) -> HttpResponse {
    let store = store_health(&control).await;
    let settings = control.decider().settings();
    let mut answers = StoreDownAnswers {
        allow: Vec::new(),
        deny: Vec::new(),
        local: Vec::new(),
    };
    for l in settings.policy.limiters() {
        let list = match l.on_store_error {
            crate::policy::OnStoreError::Allow => &mut answers.allow,
            crate::policy::OnStoreError::Deny => &mut answers.deny,
            crate::policy::OnStoreError::Local => &mut answers.local,
        };
        list.push(l.name.to_string());
    }
    let identity = control.decider().verifier().availability();
    let draining = control.draining();
    let store_missing = control.store_required && store.is_err();
    let error = if draining {
        Some("draining: a signal to stop arrived; the listeners close after ops.drain_delay and in-flight requests finish within ops.shutdown_grace".to_owned())
    } else if store_missing {
        Some("the store does not answer and store.require = true: no traffic until it does (store_error says why)".to_owned())
    } else {
        None
    };
    let ready = error.is_none();
    let body = Readiness {
        ready,
        error,
        draining,
        enabled: settings.enabled,
        store: control.decider().store().kind(),
        store_up: store.is_ok(),
        store_error: store.err(),
        on_store_error: answers,
        identity: identity.as_str(),
        identity_error: identity.error().map(str::to_owned),
    };
    let mut res = if ready {
        HttpResponse::Ok()
    } else {
        HttpResponse::ServiceUnavailable()
    };
    res.content_type(ContentType::json())
        .body(serde_json::to_string(&body).unwrap_or_default())
}

/// `/healthz/store`: the store alone, 200 when it answers a ping and 503 when not. For
/// monitoring; not a readiness or liveness probe (see [`readyz`]).
async fn store_healthz(control: web::Data<Control>) -> HttpResponse {
    let health = store_health(&control).await;
    let body = serde_json::json!({
        "store": control.decider().store().kind(),
        "up": health.is_ok(),
        "error": health.as_ref().err(),
    });
    let mut res = if health.is_ok() {
        HttpResponse::Ok()
    } else {
        HttpResponse::ServiceUnavailable()
    };
    res.content_type(ContentType::json()).body(body.to_string())
}

async fn reload(control: web::Data<Control>, req: actix_web::HttpRequest) -> HttpResponse {
    if let Err(r) = crate::http::levers::authorized(&control, &req) {
        return *r;
    }
    // Reading and validating a file is short blocking work: keep it off the admin worker.
    let c = control.clone().into_inner();
    let result = web::block(move || c.reload("POST /reload")).await;
    let (status, body) = match &result {
        Ok(Ok(report)) => (
            actix_web::http::StatusCode::OK,
            serde_json::to_string(&ReloadAnswer {
                reloaded: true,
                error: None,
                report: Some(report),
            }),
        ),
        Ok(Err(e)) => (
            actix_web::http::StatusCode::UNPROCESSABLE_ENTITY,
            serde_json::to_string(&ReloadAnswer {
                reloaded: false,
                error: Some(e),
                report: None,
            }),
        ),
        Err(_) => (
            actix_web::http::StatusCode::SERVICE_UNAVAILABLE,
            serde_json::to_string(&ReloadAnswer {
                reloaded: false,
                error: Some("the reload could not run; try again"),
                report: None,
            }),
        ),
    };
    HttpResponse::build(status)
        .content_type(ContentType::json())
        .body(body.unwrap_or_default())
}

/// `/reload` with any method but POST: 405, `Allow: POST`, a problem document.
async fn reload_method_not_allowed() -> HttpResponse {
    let mut res = crate::http::response::Problem::method_not_allowed(
        "/reload reloads the configuration on POST only (curl -X POST http://<admin_listen>/reload)",
    )
    .into_response();
    res.headers_mut().insert(
        actix_web::http::header::ALLOW,
        actix_web::http::header::HeaderValue::from_static("POST"),
    );
    res
}

/// The admin listener, bound (and answering) with the signal handlers installed; the
/// gateway's own listener runs under it with [`Admin::run`].
pub(crate) struct Admin {
    server: Server,
    addrs: Vec<std::net::SocketAddr>,
    signals: Signals,
    control: Arc<Control>,
}

impl Admin {
    /// Install the signal handlers, then bind the admin listener (`ops.admin_listen`). An
    /// address that cannot be taken is a [`ListenError`](crate::error::ListenError).
    pub(crate) fn bind(control: Arc<Control>, cfg: &Config) -> Result<Self, Error> {
        // Handlers go in before either listener answers, so a SIGHUP sent once the process
        // looks ready reloads instead of ending it.
        let signals = Signals::install()?;
        let data = web::Data::from(control.clone());
        let server = HttpServer::new(move || {
            let guard = data.clone();
            App::new()
                .wrap_fn(move |req, srv| {
                    use actix_web::dev::Service;
                    use futures_util::future::{ready, Either};
                    let hosts = guard.current_config().ops.admin_hosts;
                    match super::admin_guard::judge(req.method(), req.headers(), &hosts) {
                        Ok(()) => Either::Right(srv.call(req)),
                        Err(why) => {
                            tracing::info!(
                                reason = why.as_str(),
                                peer = %req.peer_addr().map(|a| a.ip().to_string()).unwrap_or_default(),
                                "admin listener refused a request: {}",
                                why.as_str()
                            );
                            let res = req.into_response(super::admin_guard::answer(why));
                            Either::Left(ready(Ok(res)))
                        }
                    }
                })
                .app_data(data.clone())
                .route("/metrics", web::get().to(metrics_page))
                .route("/healthz", web::get().to(healthz))
                .route("/readyz", web::get().to(readyz))
                .route("/healthz/store", web::get().to(store_healthz))
                .service(
                    web::resource("/reload")
                        .route(web::post().to(reload))
                        .default_service(web::to(reload_method_not_allowed)),
                )
                .app_data(web::PayloadConfig::new(crate::http::levers::MAX_BODY))
                .service(
                    web::resource("/overrides")
                        .route(web::get().to(crate::http::levers::list))
                        .route(web::post().to(crate::http::levers::add)),
                )
                .route(
                    "/overrides/{id}",
                    web::delete().to(crate::http::levers::remove),
                )
                .route("/reset", web::post().to(crate::http::levers::reset))
                .route("/explain", web::post().to(crate::http::levers::explain))
                .route("/top", web::get().to(crate::http::top::top))
        })
        .workers(1)
        .disable_signals()
        .shutdown_timeout(1);
        let server = crate::http::listeners::listener(
            cfg,
            crate::http::listeners::Role::Admin,
            cfg.ops.admin_listen,
        )
        .and_then(|l| server.listen(l))
        .map_err(|e| {
            crate::error::ListenError::new(
                cfg,
                "ops.admin_listen",
                "--admin-listen",
                cfg.ops.admin_listen,
                &e,
            )
        })?;
        let addrs = server.addrs();
        Ok(Self {
            server: server.run(),
            addrs,
            signals,
            control,
        })
    }

    /// The addresses the admin listener took (port 0 resolved), for the start-up log line.
    pub(crate) fn addrs(&self) -> String {
        let shown: Vec<String> = self.addrs.iter().map(ToString::to_string).collect();
        shown.join(",")
    }

    /// Run the traffic servers (the gateway, the decision endpoint, or both) and the admin
    /// server until SIGTERM/SIGINT, reloading on SIGHUP. A signal to stop drains them all.
    pub(crate) async fn run(
        self,
        servers: Vec<Server>,
        rls_ended: Option<tokio::sync::oneshot::Receiver<String>>,
        cfg: &Config,
    ) -> Result<(), Error> {
        let Self {
            server: admin,
            addrs,
            signals,
            control,
        } = self;
        for addr in addrs {
            tracing::info!(admin_listen = %addr, "admin listener started: /metrics /healthz /readyz /healthz/store /reload /overrides /reset /explain /top");
        }
        let admin_handle = admin.handle();
        let mut admin_task = Some(actix_web::rt::spawn(admin));
        // Run-time overrides and resets other instances made: read now and every half second.
        let sync = actix_web::rt::spawn(control.levers().clone().run_sync());
        // A key set not fetched at start is fetched in the background until it is.
        let recovery = control
            .decider()
            .verifier()
            .recover()
            .map(actix_web::rt::spawn);
        let handles: Vec<ServerHandle> = servers.iter().map(Server::handle).collect();
        let grace = cfg.ops.shutdown_grace;
        let mut watcher = actix_web::rt::spawn(signals.watch(control, handles.clone(), grace));
        // Each server runs as its own task, so one can be told to stop while another is
        // awaited. The first to end (stopped by a signal, or failed) ends them all.
        let tasks: Vec<_> = servers.into_iter().map(actix_web::rt::spawn).collect();
        let result = if tasks.is_empty() {
            // Only the rate-limit service, which runs on its own threads: serve until a signal
            // (the watcher returns once it has drained), or until the rate-limit service stops
            // (it cannot serve, or fails) or the admin listener does.
            let rls_ended = async {
                match rls_ended {
                    Some(ended) => ended
                        .await
                        .unwrap_or_else(|_| "rls.listen: the gRPC server stopped".to_owned()),
                    None => std::future::pending().await,
                }
            };
            let ended = match admin_task.as_mut() {
                Some(task) => tokio::select! {
                    _ = &mut watcher => None,
                    why = rls_ended => Some(why),
                    ended = task => {
                        admin_task = None;
                        Some(match ended {
                            Ok(Ok(())) => "the admin listener stopped".to_owned(),
                            Ok(Err(e)) => format!("the admin listener failed: {e}"),
                            Err(e) => format!("the admin listener failed: {e}"),
                        })
                    }
                },
                None => None,
            };
            match ended {
                None => Ok(()),
                Some(why) => Err(std::io::Error::other(why)),
            }
        } else {
            let (first, _, rest) = futures_util::future::select_all(tasks).await;
            futures_util::future::join_all(handles.iter().map(|h| h.stop(true))).await;
            for t in rest {
                let _ = t.await;
            }
            first.unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())))
        };
        watcher.abort();
        sync.abort();
        if let Some(r) = recovery {
            r.abort();
        }
        admin_handle.stop(false).await;
        if let Some(task) = admin_task {
            let _ = task.await;
        }
        tracing::info!("fleet-limiter stopped");
        result.map_err(Error::serve)
    }
}

#[cfg(unix)]
struct Signals {
    hup: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

#[cfg(unix)]
impl Signals {
    fn install() -> Result<Self, Error> {
        use tokio::signal::unix::{signal, SignalKind};
        let cannot =
            |e: std::io::Error| Error::serve(format!("cannot install signal handlers: {e}"));
        Ok(Self {
            hup: signal(SignalKind::hangup()).map_err(cannot)?,
            term: signal(SignalKind::terminate()).map_err(cannot)?,
            int: signal(SignalKind::interrupt()).map_err(cannot)?,
        })
    }

    async fn watch(mut self, control: Arc<Control>, servers: Vec<ServerHandle>, grace: Duration) {
        loop {
            let name = tokio::select! {
                _ = self.hup.recv() => {
                    let c = control.clone();
                    let _ = tokio::task::spawn_blocking(move || c.reload("SIGHUP")).await;
                    continue;
                }
                _ = self.term.recv() => "SIGTERM",
                _ = self.int.recv() => "SIGINT",
            };
            control.start_draining();
            // SIGTERM is how orchestrators and load balancers stop an instance: keep accepting
            // while they notice /readyz failing. SIGINT is someone at a terminal: stop now.
            let delay = if name == "SIGTERM" {
                control.drain_delay()
            } else {
                Duration::ZERO
            };
            if !delay.is_zero() {
                tracing::info!(
                    signal = name,
                    drain_delay_seconds = delay.as_secs_f64(),
                    grace_seconds = grace.as_secs(),
                    "stopping: /readyz answers 503; still accepting for ops.drain_delay so load balancers stop sending, then closing the listeners (a second SIGTERM or SIGINT closes them now)"
                );
                let cut_short = tokio::select! {
                    _ = tokio::time::sleep(delay) => None,
                    _ = self.term.recv() => Some("SIGTERM"),
                    _ = self.int.recv() => Some("SIGINT"),
                };
                if let Some(again) = cut_short {
                    tracing::info!(signal = again, "drain delay cut short");
                }
            }
            tracing::info!(
                signal = name,
                grace_seconds = grace.as_secs(),
                "stopping: no new connections; finishing in-flight requests"
            );
            // First no new connection: one already accepted but still on its way to a worker when
            // that worker stops would be closed unanswered, so the workers are told to stop only
            // once those have arrived. Connections not accepted meanwhile wait in the socket's
            // queue: a handed-over socket's for the next process, a reuse_port socket's to be
            // moved to the new process's socket when this one closes (tcp_migrate_req).
            futures_util::future::join_all(servers.iter().map(|s| s.pause())).await;
            tokio::time::sleep(IN_TRANSIT).await;
            // All at once: each drains its in-flight requests within the same grace period.
            futures_util::future::join_all(servers.iter().map(|s| s.stop(true))).await;
            return;
        }
    }
}

/// How long a stopping process waits, accepting nothing, for connections already accepted to
/// reach their worker before the workers stop.
#[cfg(unix)]
const IN_TRANSIT: Duration = Duration::from_millis(100);

#[cfg(not(unix))]
struct Signals;

#[cfg(not(unix))]
impl Signals {
    fn install() -> Result<Self, Error> {
        Ok(Self)
    }

    async fn watch(self, control: Arc<Control>, servers: Vec<ServerHandle>, _grace: Duration) {
        if tokio::signal::ctrl_c().await.is_ok() {
            control.start_draining();
            futures_util::future::join_all(servers.iter().map(|s| s.stop(true))).await;
        }
    }
}
