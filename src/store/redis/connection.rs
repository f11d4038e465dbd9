//! Connections: building one (standalone or Cluster, over TLS for `rediss://`), rebuilding it
//! in the background after failures, and the certificates it trusts.

use super::conn::{refuse_replica, Conn};
use super::{Inner, RedisTarget, StoreError, StoreErrorKind};
use redis::{ErrorKind, RedisError, RedisResult};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Consecutive failed decisions after which a fresh connection is built beside the current one.
pub(super) const FAILURES_BEFORE_REBUILD: u64 = 3;
/// At most one such rebuild this often (a Cluster with one master down keeps failing some slots).
pub(super) const REBUILD_EVERY: Duration = Duration::from_secs(2);

/// How a `rediss://` server's certificate is verified.
#[derive(Clone)]
pub struct RedisTls {
    /// The trusted CA certificates (system roots and `store.ca_file`), PEM.
    roots_pem: Vec<u8>,
    /// Accept any certificate (`store.insecure_skip_verify`).
    insecure: bool,
}

impl RedisTls {
    /// The verification `store.ca_file` and `store.insecure_skip_verify` describe; `service`
    /// names the setting in errors and in the insecure warning.
    pub fn new(
        service: &str,
        ca_file: Option<&std::path::Path>,
        insecure_skip_verify: bool,
    ) -> Result<Self, StoreError> {
        crate::tls::install_provider();
        if insecure_skip_verify {
            tracing::warn!(
                service,
                "{service}: TLS certificate verification is OFF (store.insecure_skip_verify): anyone on the network path can impersonate Redis; development only"
            );
            return Ok(Self {
                roots_pem: Vec::new(),
                insecure: true,
            });
        }
        let certs = crate::tls::trusted_certificates(service, ca_file)
            .map_err(|e| StoreError::new(StoreErrorKind::Config, e.to_string()))?;
        Ok(Self {
            roots_pem: to_pem(&certs),
            insecure: false,
        })
    }

    /// Whether any certificate is accepted (`store.insecure_skip_verify`).
    pub(super) fn insecure(&self) -> bool {
        self.insecure
    }

    pub(super) fn certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(self.roots_pem.clone()),
        }
    }
}

/// Certificates as a PEM bundle (redis-rs takes its roots in that form).
fn to_pem(certs: &[rustls::pki_types::CertificateDer<'_>]) -> Vec<u8> {
    use base64::Engine;
    let mut out = String::new();
    for c in certs {
        out.push_str("-----BEGIN CERTIFICATE-----\n");
        let b64 = base64::engine::general_purpose::STANDARD.encode(c.as_ref());
        for line in b64.as_bytes().chunks(64) {
            out.push_str(&String::from_utf8_lossy(line));
            out.push('\n');
        }
        out.push_str("-----END CERTIFICATE-----\n");
    }
    out.into_bytes()
}

/// `url` with redis-rs's `#insecure` mark (no certificate verification).
fn insecure_url(url: &str) -> String {
    match url.split_once('#') {
        Some((base, _)) => format!("{base}#insecure"),
        None => format!("{url}#insecure"),
    }
}

impl Inner {
    /// The current connection answered `READONLY`: the server was demoted to a replica. Drop
    /// the connection (unless a fresh one already replaced it) and build another, which asks the
    /// name, the proxy or the Sentinels again for whoever is primary now. Said once per
    /// connection in the log.
    pub(super) fn demoted(self: &Arc<Self>, conn: &Arc<Conn>) {
        let mut slot = self.conn.write();
        let current = slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn));
        if current {
            *slot = None;
        }
        drop(slot);
        if current {
            tracing::warn!(
                target = %self.target,
                "redis store: the server answered READONLY (a primary demoted to a replica); reconnecting to the current primary, limiters answer with on_store_error meanwhile"
            );
        }
        self.reconnect();
    }

    /// Build a connection in the background (once at a time), retrying until it works.
    pub(super) fn reconnect(self: &Arc<Self>) {
        if self.reconnecting.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(self);
        self.handle.spawn(async move {
            let mut delay = Duration::from_millis(25);
            loop {
                let Some(inner) = weak.upgrade() else { return };
                let attempt = tokio::time::timeout(inner.attempt_timeout(), inner.connect()).await;
                match attempt {
                    Ok(Ok((conn, primary))) => {
                        *inner.conn.write() = Some(Arc::new(conn));
                        if let Some(primary) = primary {
                            super::sentinel::switched(&inner, &primary);
                        }
                        *inner.connect_error.lock() = None;
                        inner.failures_in_row.store(0, Ordering::Relaxed);
                        inner.reconnecting.store(false, Ordering::Release);
                        if let Some(tx) = inner.first_connect.lock().take() {
                            let _ = tx.send(());
                        }
                        tracing::debug!("redis store connected");
                        return;
                    }
                    Ok(Err(e)) => {
                        let e = crate::redact::urls_in(&e.to_string()).into_owned();
                        let service = inner.target.setting();
                        let why = match crate::tls::certificate_problem_in(&e) {
                            Some(why) => format!("{service}: TLS: {why}; trust the server's CA with store.ca_file (FLEET_LIMITER_STORE_CA_FILE)"),
                            None => format!("{service}: {e}"),
                        };
                        let mut last = inner.connect_error.lock();
                        // A certificate problem is a configuration error: say it once per
                        // distinct reason, at warning level (retrying will not fix it).
                        if why.contains(": TLS: ") && last.as_deref() != Some(why.as_str()) {
                            tracing::warn!(error = %why, "redis store: the TLS handshake failed");
                        } else {
                            tracing::debug!(error = %why, "redis store: connection attempt failed");
                        }
                        *last = Some(why);
                    }
                    Err(_) => {
                        tracing::debug!("redis store: connection attempt timed out");
                        *inner.connect_error.lock() = Some(format!(
                            "{}: connection attempt timed out",
                            inner.target.setting()
                        ));
                    }
                }
                drop(inner);
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(1));
            }
        });
    }

    /// A new connection, and for Sentinel the primary's `host:port` it reaches.
    pub(super) async fn connect(&self) -> RedisResult<(Conn, Option<String>)> {
        let ct = self.opts.connect_timeout;
        match &self.target {
            RedisTarget::Sentinel(url) => {
                let url = super::sentinel::parse(url).map_err(|e| {
                    RedisError::from((ErrorKind::InvalidClientConfig, "store.url", e))
                })?;
                let (conn, primary) = self.connect_sentinel(&url).await?;
                Ok((conn, Some(primary)))
            }
            RedisTarget::Standalone(url) => {
                let client = match &self.opts.tls {
                    Some(t) if url.starts_with("rediss://") && t.insecure => {
                        redis::Client::open(insecure_url(url).as_str())?
                    }
                    Some(t) if url.starts_with("rediss://") => {
                        redis::Client::build_with_tls(url.as_str(), t.certificates())?
                    }
                    _ => redis::Client::open(url.as_str())?,
                };
                let cfg = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(ct)
                    .set_response_timeout(ct);
                let conn = Conn::Single(
                    client
                        .get_multiplexed_async_connection_with_config(&cfg)
                        .await?,
                );
                refuse_replica(&conn, "store.url").await?;
                Ok((conn, None))
            }
            RedisTarget::Cluster(nodes) => {
                let tls = self
                    .opts
                    .tls
                    .as_ref()
                    .filter(|_| nodes.iter().all(|u| u.starts_with("rediss://")));
                let nodes: Vec<String> = match tls {
                    Some(t) if t.insecure => nodes.iter().map(|u| insecure_url(u)).collect(),
                    _ => nodes.clone(),
                };
                let mut builder = redis::cluster::ClusterClientBuilder::new(nodes)
                    .connection_timeout(ct)
                    .response_timeout(ct)
                    .retries(2);
                if let Some(t) = tls.filter(|t| !t.insecure) {
                    builder = builder.certs(t.certificates());
                }
                let client = builder.build()?;
                Ok((Conn::Cluster(client.get_async_connection().await?), None))
            }
        }
    }

    /// The longest one connection attempt takes: the connect timeout, and on Sentinel one more
    /// for each Sentinel that may have to be asked first.
    fn attempt_timeout(&self) -> Duration {
        match &self.target {
            RedisTarget::Sentinel(url) => {
                let asked = super::sentinel::parse(url).map_or(1, |u| u.sentinels.len());
                self.opts.connect_timeout * (asked as u32 + 1)
            }
            _ => self.opts.connect_timeout,
        }
    }

    /// Another failure in a row: after a few, build a fresh connection beside the current one
    /// (it replaces it once connected), at most once per [`REBUILD_EVERY`].
    pub(super) fn failed_in_row(self: &Arc<Self>) {
        let n = self.failures_in_row.fetch_add(1, Ordering::Relaxed) + 1;
        if n < FAILURES_BEFORE_REBUILD {
            return;
        }
        {
            let mut last = self.last_rebuild.lock();
            if last.is_some_and(|t| t.elapsed() < REBUILD_EVERY) {
                return;
            }
            *last = Some(std::time::Instant::now());
        }
        self.reconnect();
    }
}
