//! The upstream client: address and TLS name from the upstream URL, connecting (TCP, then TLS),
//! the HTTP/1 handshake, a pool of idle connections, and the lease that returns one to it.

use super::body::ProxyBody;
use crate::config::UpstreamUrl;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

/// TLS to an `https://` upstream.
#[derive(Debug, Clone)]
pub(crate) struct UpstreamTls {
    /// Certificate verification ([`crate::tls::client_config`]) and ALPN `http/1.1` only.
    pub(super) config: Arc<rustls::ClientConfig>,
    /// The name the certificate must hold: a DNS name, also sent as SNI; or an IP address,
    /// which is sent no SNI and must be one of the certificate's IP addresses.
    pub(super) name: ServerName<'static>,
}

impl UpstreamTls {
    /// TLS for the `https://` URL `base`, verified by `client` (whose ALPN is replaced by
    /// `http/1.1`: the connection speaks HTTP/1.1 only).
    pub(crate) fn new(base: &UpstreamUrl, client: &rustls::ClientConfig) -> Result<Self, String> {
        let host = base.host();
        let name = ServerName::try_from(host.to_owned())
            .map_err(|e| format!("`{host}` is not a host name TLS can verify: {e}"))?;
        let mut config = client.clone();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            config: Arc::new(config),
            name,
        })
    }
}

/// Idle connections a worker keeps for reuse; more are closed when they finish.
const MAX_IDLE_CONNECTIONS: usize = 1024;

/// HTTP/1.1 keep-alive connections to the upstream, for one worker thread. Each connection is
/// a task on the worker; a request takes the most recently used idle one or opens a new one,
/// and the connection goes back to the pool when the answer's body has been read to the end.
pub(crate) struct UpstreamClient {
    /// `host:port` to connect to.
    pub(super) addr: String,
    /// `Host` for requests that arrived without one.
    pub(super) host: String,
    /// The upstream's path prefix (may be empty).
    pub(super) prefix: String,
    pub(super) connect_timeout: Duration,
    pub(super) tls: Option<UpstreamTls>,
    pub(super) idle: Rc<Pool>,
}

/// Idle upstream connections, most recently used last.
#[derive(Default)]
pub(super) struct Pool(RefCell<VecDeque<SendRequest<ProxyBody>>>);

/// How many idle connections a request looks at before it opens a new one.
const IDLE_PROBES: usize = 4;

impl Pool {
    /// A ready idle connection. Closed ones are dropped on the way; one that is open but not
    /// ready yet (its previous answer's end not yet processed) goes to the front.
    fn take(&self) -> Option<SendRequest<ProxyBody>> {
        let mut idle = self.0.borrow_mut();
        for _ in 0..IDLE_PROBES {
            let conn = idle.pop_back()?;
            if conn.is_ready() {
                return Some(conn);
            }
            if !conn.is_closed() {
                idle.push_front(conn);
            }
        }
        None
    }

    fn put_back(&self, conn: SendRequest<ProxyBody>) {
        let mut idle = self.0.borrow_mut();
        if idle.len() < MAX_IDLE_CONNECTIONS && !conn.is_closed() {
            idle.push_back(conn);
        }
    }
}

/// Why a request did not reach the upstream.
#[derive(Debug)]
pub(super) enum UpstreamError {
    Connect(std::io::Error),
    ConnectTimeout,
    /// The TLS handshake failed (a certificate that does not verify, among others).
    Tls(std::io::Error),
    Http(hyper::Error),
    /// Nothing moved for the read timeout.
    Silent,
}

impl UpstreamError {
    pub(super) fn timed_out(&self) -> bool {
        matches!(self, UpstreamError::ConnectTimeout | UpstreamError::Silent)
    }
}

impl std::fmt::Display for UpstreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UpstreamError::Connect(e) => write!(f, "cannot connect: {e}"),
            UpstreamError::ConnectTimeout => f.write_str("connect timed out"),
            UpstreamError::Tls(e) => write!(f, "TLS handshake failed: {e}"),
            UpstreamError::Http(e) => match std::error::Error::source(e) {
                Some(cause) => write!(f, "{e}: {cause}"),
                None => write!(f, "{e}"),
            },
            UpstreamError::Silent => f.write_str("no answer within the read timeout"),
        }
    }
}

impl UpstreamClient {
    pub(super) async fn tcp(&self) -> Result<tokio::net::TcpStream, UpstreamError> {
        match tokio::time::timeout(
            self.connect_timeout,
            tokio::net::TcpStream::connect(&self.addr),
        )
        .await
        {
            Ok(Ok(s)) => {
                let _ = s.set_nodelay(true);
                Ok(s)
            }
            Ok(Err(e)) => Err(UpstreamError::Connect(e)),
            Err(_) => Err(UpstreamError::ConnectTimeout),
        }
    }

    /// TLS over `stream`, the handshake bounded by the connect timeout.
    pub(super) async fn tls(
        &self,
        tls: &UpstreamTls,
        stream: tokio::net::TcpStream,
    ) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, UpstreamError> {
        let connector = tokio_rustls::TlsConnector::from(tls.config.clone());
        match tokio::time::timeout(
            self.connect_timeout,
            connector.connect(tls.name.clone(), stream),
        )
        .await
        {
            Ok(Ok(s)) => Ok(s),
            Ok(Err(e)) => Err(UpstreamError::Tls(e)),
            Err(_) => Err(UpstreamError::ConnectTimeout),
        }
    }

    async fn connect(&self) -> Result<SendRequest<ProxyBody>, UpstreamError> {
        let stream = self.tcp().await?;
        match &self.tls {
            None => handshake(TokioIo::new(stream)).await,
            Some(tls) => match self.tls(tls, stream).await {
                Ok(s) => handshake(TokioIo::new(s)).await,
                Err(e) => {
                    if let UpstreamError::Tls(why) = &e {
                        tracing::warn!(service = "upstream", reason = %why, "TLS handshake with the upstream failed");
                    }
                    Err(e)
                }
            },
        }
    }

    /// For an `https://` upstream: connect and shake hands once, nothing sent. `Ok` when the
    /// upstream was not reached (that is for requests to find out), `Err` with the reason when
    /// it was and its certificate does not verify.
    pub(crate) async fn check_certificate(&self) -> Result<(), String> {
        let Some(tls) = &self.tls else {
            return Ok(());
        };
        let stream = match self.tcp().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(upstream = %self.addr, error = %e, "the upstream cannot be reached at start; starting anyway (requests get 502 until it answers)");
                return Ok(());
            }
        };
        match self.tls(tls, stream).await {
            Ok(_) => Ok(()),
            Err(UpstreamError::Tls(e)) if certificate_refused(&e) => Err(e.to_string()),
            Err(e) => {
                tracing::warn!(error = %e, "the TLS handshake with the upstream failed at start; starting anyway");
                Ok(())
            }
        }
    }

    /// Send on a pooled connection; when it turns out closed before the request was written,
    /// once more on a new one.
    /// The answer comes with its connection, for the pool once the answer's body is read.
    pub(super) async fn send(
        &self,
        req: hyper::Request<ProxyBody>,
    ) -> Result<Answer, UpstreamError> {
        let mut req = req;
        for _ in 0..2 {
            let mut conn = match self.idle.take() {
                Some(c) => c,
                None => self.connect().await?,
            };
            match conn.try_send_request(req).await {
                Ok(res) => return Ok((res, Lease::new(&self.idle, conn))),
                Err(mut e) => match e.take_message() {
                    Some(unsent) => req = unsent,
                    None => return Err(UpstreamError::Http(e.into_error())),
                },
            }
        }
        // Two connections in a row closed under the request: open one and use it.
        let mut conn = self.connect().await?;
        let res = conn.send_request(req).await.map_err(UpstreamError::Http)?;
        Ok((res, Lease::new(&self.idle, conn)))
    }
}

/// Whether a failed TLS handshake failed on the peer's certificate.
fn certificate_refused(e: &std::io::Error) -> bool {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .is_some_and(|e| {
            matches!(
                e,
                rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented
            )
        })
}

/// HTTP/1.1 over a connected stream (plain or TLS); the connection runs as a task of this worker.
async fn handshake<T>(io: T) -> Result<SendRequest<ProxyBody>, UpstreamError>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + 'static,
{
    let (sender, conn) = http1::handshake(io).await.map_err(UpstreamError::Http)?;
    actix_web::rt::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "upstream connection ended");
        }
    });
    Ok(sender)
}

type Answer = (hyper::Response<hyper::body::Incoming>, Lease);

/// A connection whose answer is still being read; it returns to its pool when the answer's body
/// ends, or when the body is dropped (a connection left mid-answer is closed by hyper, and the
/// pool skips it).
pub(super) struct Lease(pub(super) Option<(Rc<Pool>, SendRequest<ProxyBody>)>);

impl Lease {
    pub(super) fn new(pool: &Rc<Pool>, conn: SendRequest<ProxyBody>) -> Self {
        Lease(Some((pool.clone(), conn)))
    }

    pub(super) fn release(&mut self) {
        if let Some((pool, conn)) = self.0.take() {
            pool.put_back(conn);
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.release();
    }
}
