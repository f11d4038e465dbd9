//! Connecting to the upstream and keeping its connections: the address and TLS name from the
//! upstream URL, TCP then TLS within the connect timeout, and a pool of idle connections, each
//! peeked before it is reused or taken back.

use super::error::UpstreamError;
use crate::config::UpstreamUrl;
use rustls::pki_types::ServerName;
use std::cell::RefCell;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// TLS to an `https://` upstream.
#[derive(Debug, Clone)]
pub(crate) struct UpstreamTls {
    /// Certificate verification ([`crate::tls::client_config`]) and ALPN `http/1.1` only.
    pub(in crate::http::proxy) config: Arc<rustls::ClientConfig>,
    /// The name the certificate must hold: a DNS name, also sent as SNI; or an IP address,
    /// which is sent no SNI and must be one of the certificate's IP addresses.
    pub(in crate::http::proxy) name: ServerName<'static>,
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

/// HTTP/1.1 keep-alive connections to the upstream, for one worker thread. A request takes the
/// most recently used idle connection or opens a new one, writes its head and body and reads
/// the answer on it inside its own task (no task per connection, no channel between them), and
/// the connection goes back to the pool when the request has been written whole and the
/// answer read to its end, with nothing after it.
pub(crate) struct UpstreamClient {
    /// `host:port` to connect to.
    pub(in crate::http::proxy) addr: String,
    /// `Host` for requests that arrived without one.
    pub(in crate::http::proxy) host: String,
    /// The upstream's path prefix (may be empty).
    pub(in crate::http::proxy) prefix: String,
    pub(in crate::http::proxy) connect_timeout: Duration,
    pub(in crate::http::proxy) tls: Option<UpstreamTls>,
    pub(in crate::http::proxy) idle: Rc<Pool>,
}

/// A byte stream to the upstream: plain TCP, or TLS over it.
pub(super) enum Io {
    Plain(tokio::net::TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>),
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

impl Io {
    /// Whether an idle connection is still open with nothing unasked-for on it. The socket is
    /// asked itself (a peek that must find nothing to read yet), not the runtime's record of
    /// readiness, which lags behind what has arrived until the worker next polls its events:
    /// bytes that arrived an instant ago count. The end of the stream (the upstream closed it),
    /// an error, bytes nobody asked for, or for TLS any record or plaintext not yet read all
    /// mean it cannot carry a request.
    pub(super) fn idle_and_open(&mut self) -> bool {
        match self {
            Io::Plain(s) => nothing_to_read(s),
            Io::Tls(s) => {
                let (tcp, conn) = s.get_mut();
                let quiet = conn.process_new_packets().is_ok_and(|state| {
                    state.plaintext_bytes_to_read() == 0 && !state.peer_has_closed()
                });
                quiet && nothing_to_read(tcp)
            }
        }
    }
}

/// One non-blocking peek at the socket finds nothing: `WouldBlock`. A byte, the end of the
/// stream or an error all say the connection is not idle.
fn nothing_to_read(s: &tokio::net::TcpStream) -> bool {
    let mut probe = [MaybeUninit::<u8>::uninit(); 1];
    match socket2::SockRef::from(s).peek(&mut probe) {
        Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
        Ok(_) => false,
    }
}

/// Idle upstream connections, most recently used last.
#[derive(Default)]
pub(in crate::http::proxy) struct Pool(RefCell<Vec<Io>>);

/// How many idle connections a request looks at before it opens a new one.
const IDLE_PROBES: usize = 4;

impl Pool {
    /// An idle connection still open; closed ones are dropped on the way.
    pub(super) fn take(&self) -> Option<Io> {
        let mut idle = self.0.borrow_mut();
        for _ in 0..IDLE_PROBES {
            let mut conn = idle.pop()?;
            if conn.idle_and_open() {
                return Some(conn);
            }
        }
        None
    }

    /// Keep a connection whose exchange left it fit for another request, if it is still idle
    /// and open now (the socket peeked: nothing arrived after the answer).
    pub(super) fn give_back(&self, mut conn: Io) {
        if conn.idle_and_open() {
            self.put_back(conn);
        }
    }

    fn put_back(&self, conn: Io) {
        let mut idle = self.0.borrow_mut();
        if idle.len() < MAX_IDLE_CONNECTIONS {
            idle.push(conn);
        }
    }
}

impl UpstreamClient {
    pub(in crate::http::proxy) async fn tcp(&self) -> Result<tokio::net::TcpStream, UpstreamError> {
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
    pub(in crate::http::proxy) async fn tls(
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

    pub(super) async fn connect(&self) -> Result<Io, UpstreamError> {
        let stream = self.tcp().await?;
        match &self.tls {
            None => Ok(Io::Plain(stream)),
            Some(tls) => match self.tls(tls, stream).await {
                Ok(s) => Ok(Io::Tls(Box::new(s))),
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
