//! The gateway as the binary runs it: the limiter in front of the streaming proxy, the
//! decision endpoint and the rate-limit service beside them, and the admin listener that runs
//! them all until it is stopped.

use crate::config::Config;
use crate::decision::Decider;
use crate::error::{Error, ListenError, TlsSetupError};
use crate::http::control::{file_reloader, Control, Reloader};
use crate::http::middleware::FleetLimiter;
use crate::http::proxy::{self, Upstream};
use crate::http::{admin, cors, forward_auth, listeners};
use crate::tls::CertStore;
use actix_web::{web, App, HttpServer};
use std::sync::Arc;

/// Run the gateway until it is stopped: limiter in front, streaming proxy behind.
///
/// A calibration that could lock healthy agents out of the declared fleet is refused before
/// anything listens ([`Error::UnsafeCalibration`]), as are reloads that bring one.
pub async fn serve_gateway(cfg: &Config, decider: Arc<Decider>) -> Result<(), Error> {
    let admitted = crate::config::admit::admit(cfg, false)?;
    if let Some(line) = admitted.risk_summary() {
        tracing::info!("{line}");
    }
    for w in &admitted.warnings {
        tracing::warn!("calibration: {w}");
    }
    serve_gateway_with(cfg, decider, file_reloader(cfg)).await
}

/// [`serve_gateway`], with the admin listener reloading through `reloader` (SIGHUP, POST /reload).
pub(crate) async fn serve_gateway_with(
    cfg: &Config,
    decider: Arc<Decider>,
    reloader: Reloader,
) -> Result<(), Error> {
    // The overrides other instances put in force at run time, read before any listener serves
    // (the admin listener's levers keep reading them every half second after).
    let levers = Arc::new(decider.levers());
    levers.first_sync().await;
    let plan = Plan::of(cfg).map_err(Error::serve)?;
    let decision = forward_auth::bind(cfg, decider.clone())?;
    let rls = crate::rls::start(cfg, decider.clone())?.map(|running| running.ended);
    let Some(base) = cfg.server.upstream.clone() else {
        let control = Arc::new(Control::new(
            cfg,
            decider,
            levers,
            cors::Cors::new(&cfg.cors),
            reloader,
        ));
        return answer_only(cfg, &plan, control, decision, rls).await;
    };
    let upstream = upstream_of(cfg, base, &decider).await?;
    let certs = listener_certificates(cfg)?;
    let cors = cors::Cors::new(&cfg.cors);
    let control = Arc::new(
        Control::new(cfg, decider.clone(), levers, cors.clone(), reloader)
            .with_certificates(certs.clone()),
    );
    let (server, listening) = traffic_server(cfg, &decider, &upstream, cors, certs.as_ref())?;
    let admin = admin::Admin::bind(control, cfg)?;
    if cfg.server.reuse_port {
        if let Some(w) = listeners::reuse_port_warning() {
            tracing::warn!("{w}");
        }
    }
    tracing::info!(
        listen = %listening,
        reuse_port = cfg.server.reuse_port,
        tls = certs.is_some(),
        admin_listen = %admin.addrs(),
        upstream = %crate::redact::url(upstream.base.as_str()),
        store = %cfg.store.describe(),
        limiters = cfg.limiters.len(),
        enabled = cfg.enabled,
        "fleet-limiter gateway started"
    );
    let mut servers = vec![server];
    servers.extend(decision);
    admin.run(servers, rls, cfg).await
}

/// No proxy: the decision endpoint, the rate-limit service, or both answer a proxy's questions.
/// The rate-limit service runs on its own threads, so with it alone the admin listener's run
/// waits for a signal with no traffic server of its own.
async fn answer_only(
    cfg: &Config,
    plan: &Plan,
    control: Arc<Control>,
    decision: Option<actix_web::dev::Server>,
    rls: Option<tokio::sync::oneshot::Receiver<String>>,
) -> Result<(), Error> {
    let decision: Vec<_> = decision.into_iter().collect();
    if listeners::handed(listeners::Role::Traffic) {
        tracing::warn!("a traffic socket was handed over but server.upstream is not set: it is not served (connections to it wait unanswered); set server.upstream or drop the socket from the .socket unit");
    }
    let admin = admin::Admin::bind(control, cfg)?;
    tracing::info!(
        admin_listen = %admin.addrs(),
        store = %cfg.store.describe(),
        limiters = cfg.limiters.len(),
        enabled = cfg.enabled,
        decision = plan.decision,
        rls = plan.rls,
        "fleet-limiter started without an upstream: answering a proxy's questions only"
    );
    admin.run(decision, rls, cfg).await
}

/// TLS toward an `https://` upstream (`server.upstream_ca_file`,
/// `server.upstream_insecure_skip_verify`); `None` for a plain one.
fn upstream_tls(
    cfg: &Config,
    base: &crate::config::UpstreamUrl,
) -> Result<Option<proxy::UpstreamTls>, TlsSetupError> {
    if !base.is_https() {
        return Ok(None);
    }
    let client = crate::tls::client_config(
        "upstream",
        cfg.server.upstream_ca_file.as_deref(),
        cfg.server.upstream_insecure_skip_verify,
    )
    .map_err(|e| {
        TlsSetupError(format!(
            "{}: server.upstream_ca_file: {e:#}; point it (FLEET_LIMITER_UPSTREAM_CA_FILE) at a PEM file of the CA certificates that sign the upstream's certificate",
            cfg.origin("server.upstream_ca_file")
        ))
    })?;
    let tls = proxy::UpstreamTls::new(base, &client).map_err(|e| {
        TlsSetupError(format!(
            "{}: server.upstream: {e}",
            cfg.origin("server.upstream")
        ))
    })?;
    Ok(Some(tls))
}

/// The upstream the proxy streams to, counting into `decider`'s metrics. An `https://` upstream
/// whose certificate does not verify would fail every request: it refuses the start. One that
/// cannot be reached starts anyway, as a plain one does.
async fn upstream_of(
    cfg: &Config,
    base: crate::config::UpstreamUrl,
    decider: &Arc<Decider>,
) -> Result<Upstream, TlsSetupError> {
    let tls = upstream_tls(cfg, &base)?;
    let upgrades = proxy::upgrade::Upgrades::new(
        websocket_caps(cfg, &crate::descriptors::raise()),
        cfg.websocket.idle_timeout,
    );
    decider
        .metrics()
        .upgraded_connections_max(upgrades.max_open());
    let upstream = Upstream {
        base,
        connect_timeout: cfg.server.connect_timeout,
        read_timeout: cfg.server.read_timeout,
        body: proxy::pace::BodyRules::new(cfg.server.body_timeout, cfg.server.body_min_rate),
        tls,
        // One registry per gateway: the proxy counts into its decider's metrics.
        metrics: decider.metrics().clone(),
        admission: cfg
            .admission
            .as_ref()
            .map(|a| Arc::new(crate::admission::Admission::new(a, decider.metrics()))),
        upgrades,
        clients: proxy::ClientAddresses::new(decider.clone()),
    };
    if let Err(why) = upstream.client().check_certificate().await {
        return Err(TlsSetupError(format!(
            "{}: server.upstream: {}: the upstream's TLS certificate does not verify: {why}; trust the CA that signed it with server.upstream_ca_file (FLEET_LIMITER_UPSTREAM_CA_FILE), or give the upstream a certificate valid for this host name",
            cfg.origin("server.upstream"),
            crate::redact::url(upstream.base.as_str())
        )));
    }
    Ok(upstream)
}

/// TLS on the traffic listener (`server.tls_cert_file`, `server.tls_key_file`): the certificate
/// is read now, and again on every reload.
fn listener_certificates(cfg: &Config) -> Result<Option<Arc<CertStore>>, TlsSetupError> {
    let (Some(cert), Some(key)) = (&cfg.server.tls_cert_file, &cfg.server.tls_key_file) else {
        return Ok(None);
    };
    let certs = CertStore::load(cert, key).map_err(|e| {
        TlsSetupError(format!(
            "{}: server.tls_cert_file: {e:#}; fix the files, or point server.tls_cert_file (FLEET_LIMITER_TLS_CERT_FILE) and server.tls_key_file (FLEET_LIMITER_TLS_KEY_FILE) at a PEM certificate chain and its private key",
            cfg.origin("server.tls_cert_file")
        ))
    })?;
    Ok(Some(certs))
}

/// The traffic listener: the limiter in front of the streaming proxy, bound (on TLS when
/// `certs` is given). Bound before anything says the gateway started: an address that cannot
/// be taken is a configuration error (exit code 2), not a start followed by a stop.
fn traffic_server(
    cfg: &Config,
    decider: &Arc<Decider>,
    upstream: &Upstream,
    cors: cors::Cors,
    certs: Option<&Arc<CertStore>>,
) -> Result<(actix_web::dev::Server, String), Error> {
    // The proxy reads nothing from the outcome: no extension to allocate per request.
    let limiter = FleetLimiter::new(decider.clone())
        .with_session_cookie(cfg.identity.session_cookie.clone())
        .with_outcome_extension(false);
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
    .on_connect(proxy::remember_client_socket)
    .disable_signals()
    .shutdown_timeout(cfg.ops.shutdown_grace.as_secs_f64().ceil() as u64);
    let socket = listeners::listener(cfg, listeners::Role::Traffic, cfg.server.listen);
    let server = match certs {
        Some(store) => {
            let tls = crate::tls::server_config(store.clone())
                .map_err(|e| TlsSetupError(format!("server.tls_cert_file: {e:#}")))?;
            socket.and_then(|l| server.listen_rustls_0_23(l, tls))
        }
        None => socket.and_then(|l| server.listen(l)),
    }
    .map_err(|e| ListenError::new(cfg, "server.listen", "--listen", cfg.server.listen, &e))?;
    let listening = server
        .addrs()
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",");
    // A server runs once it is awaited: until then it only holds its bound sockets.
    Ok((server.run(), listening))
}

/// The traffic listeners `serve` runs for a configuration, beside the admin listener: the
/// gateway (the limiter in front of `server.upstream`), the forward-auth decision endpoint
/// (`decision.listen`), Envoy's rate-limit service (`rls.listen`), in any combination but none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    pub(crate) proxy: bool,
    pub(crate) decision: bool,
    pub(crate) rls: bool,
}

impl Plan {
    /// What `cfg` asks to serve, or the configuration error that names what to set when it
    /// asks for nothing. Each listener's own settings (`decision.allow_from`,
    /// `rls.allow_from`, ...) are checked when the configuration is loaded.
    pub(crate) fn of(cfg: &Config) -> Result<Self, String> {
        let plan = Self {
            proxy: cfg.server.upstream.is_some(),
            decision: cfg.decision.listen.is_some(),
            rls: cfg.rls.listen.is_some(),
        };
        if plan.proxy || plan.decision || plan.rls {
            Ok(plan)
        } else {
            Err(NOTHING_TO_SERVE.to_owned())
        }
    }
}

/// The error of a configuration with nothing to serve.
pub(crate) const NOTHING_TO_SERVE: &str = "server.upstream: not set, and neither decision.listen nor rls.listen is: nothing to serve; pass --upstream http://host:port (FLEET_LIMITER_UPSTREAM, or server.upstream in the config file) to run the gateway, or, to keep a proxy in front and only answer its questions, --decision-listen (FLEET_LIMITER_DECISION_LISTEN) for forward auth or --rls-listen (FLEET_LIMITER_RLS_LISTEN) for Envoy's rate-limit service";

/// The caps on upgraded connections for this process, from `[websocket]` and the descriptor
/// limit (just raised), with a log line saying what was chosen and why, and a warning when the
/// caps set would let WebSockets take the descriptors ordinary requests need.
fn websocket_caps(
    cfg: &Config,
    limit: &crate::descriptors::Limit,
) -> crate::config::websocket::Caps {
    if let Some(why) = &limit.refused {
        tracing::warn!(
            soft = limit.soft,
            hard = limit.hard,
            error = %why,
            "could not raise the open-file-descriptor limit to the hard limit; keeping it"
        );
    }
    let caps = cfg.websocket.caps(limit.soft);
    let origin = |path: &str| {
        if cfg.origins.contains_key(path) {
            cfg.origin(path)
        } else {
            "derived".to_owned()
        }
    };
    tracing::info!(
        descriptors = limit.soft,
        descriptors_at_start = limit.before,
        descriptors_hard = limit.hard,
        max_open = caps.max_open,
        max_open_from = %origin("websocket.max_open"),
        max_per_client = caps.max_per_client,
        max_per_client_from = %origin("websocket.max_per_client"),
        idle_timeout_seconds = cfg.websocket.idle_timeout.as_secs_f64(),
        "WebSocket caps: each open WebSocket holds two descriptors; a derived websocket.max_open is an eighth of the descriptor limit (at most 8192), a derived websocket.max_per_client an eighth of websocket.max_open"
    );
    if let Some(soft) = limit.soft {
        let needed = (caps.max_open as u64).saturating_mul(2);
        if !caps.max_open_derived && needed > soft / 2 {
            tracing::warn!(
                max_open = caps.max_open,
                descriptors = soft,
                "websocket.max_open lets WebSockets take {needed} of the {soft} open-file descriptors this process may hold, more than half: ordinary requests could find none left (502 Too many open files); raise the limit (LimitNOFILE= in the systemd unit, ulimit -n, the container's nofile) or lower websocket.max_open"
            );
        }
    }
    if let Some(set) = cfg.websocket.max_per_client {
        if set > caps.max_per_client {
            tracing::warn!(
                max_per_client = set,
                max_open = caps.max_open,
                "websocket.max_per_client is more than the derived websocket.max_open; one client may hold every upgraded connection, so it is lowered to websocket.max_open"
            );
        }
    }
    caps
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every combination of the three listeners: each alone or together is served as asked,
    /// none is the error that names all three flags.
    #[test]
    fn the_plan_serves_any_listener_and_names_all_three_when_none() {
        let addr: std::net::SocketAddr = ([127, 0, 0, 1], 1).into();
        for bits in 0..8u8 {
            let (proxy, decision, rls) = (bits & 1 != 0, bits & 2 != 0, bits & 4 != 0);
            let mut cfg = Config::default();
            cfg.server.upstream = proxy.then(|| "http://127.0.0.1:3000".parse().unwrap());
            cfg.decision.listen = decision.then_some(addr);
            cfg.rls.listen = rls.then_some(addr);
            match Plan::of(&cfg) {
                Ok(plan) => assert_eq!(
                    plan,
                    Plan {
                        proxy,
                        decision,
                        rls
                    }
                ),
                Err(e) => {
                    assert_eq!(bits, 0, "{e}");
                    for flag in ["--upstream", "--decision-listen", "--rls-listen"] {
                        assert!(e.contains(flag), "{flag}: {e}");
                    }
                }
            }
        }
    }
}
