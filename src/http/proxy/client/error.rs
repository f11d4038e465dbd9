//! Why a request did not reach the upstream, or its answer did not come back whole: the one
//! error of connecting, writing the request and reading the answer.

/// Why a request did not reach the upstream, or its answer did not come back whole.
#[derive(Debug)]
pub(in crate::http::proxy) enum UpstreamError {
    Connect(std::io::Error),
    ConnectTimeout,
    /// The TLS handshake failed (a certificate that does not verify, among others).
    Tls(std::io::Error),
    /// The WebSocket handshake's HTTP/1 client failed.
    Http(hyper::Error),
    /// Reading from or writing to the upstream failed.
    Io(std::io::Error),
    /// The upstream closed the connection before its answer was complete.
    Closed,
    /// The upstream's answer is not HTTP/1.1 that can be read safely.
    Protocol(&'static str),
    /// The client's body failed (the body's watch says how).
    Body,
    /// Nothing moved for the read timeout.
    Silent,
}

impl UpstreamError {
    pub(in crate::http::proxy) fn timed_out(&self) -> bool {
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
            UpstreamError::Io(e) => write!(f, "connection error: {e}"),
            UpstreamError::Closed => {
                f.write_str("connection closed before the answer was complete")
            }
            UpstreamError::Protocol(why) => write!(f, "invalid answer: {why}"),
            UpstreamError::Body => f.write_str("the request body failed"),
            UpstreamError::Silent => f.write_str("no answer within the read timeout"),
        }
    }
}

impl std::error::Error for UpstreamError {}
