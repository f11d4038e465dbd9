//! The upstream client's front: the exchange of one request and its answer on one pooled
//! connection, HTTP/1.1 on the request's own task, and the answer's body as the client gets it.
//! Connecting and the pool are `pool`, the request written `request`, the answer read `answer`
//! (its framing rules `framing`), the one error `error`.

mod answer;
mod error;
mod framing;
mod pool;
mod request;

use super::body::ProxyBody;
use super::headers::Framing;
use crate::admission::Slot;
#[cfg(any(test, feature = "fuzzing"))]
pub(super) use answer::read_answer;
pub(super) use answer::Head;
use answer::Incoming;
use bytes::{Bytes, BytesMut};
pub(super) use error::UpstreamError;
use futures_util::Stream;
use pool::Io;
pub(super) use pool::Pool;
pub(crate) use pool::{UpstreamClient, UpstreamTls};
use request::Outgoing;
pub(super) use request::{request_head, upstream_request};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

impl UpstreamClient {
    /// The exchange of `head` and `body`, ready for [`UpstreamClient::send`]; it hands its
    /// connection back to this client's pool at the end.
    pub(super) fn exchange(
        &self,
        head: BytesMut,
        body: ProxyBody,
        framing: Framing,
        method_is_head: bool,
    ) -> Exchange {
        Exchange::new(head, body, framing, method_is_head, self.idle.clone())
    }

    /// Send the exchange's request on a pooled connection (on another, or a new one, when one
    /// fails before it took a byte) and read the answer's head and the first piece of its body
    /// (`None`: it has none, or it ended). The rest of the answer's body is read by the
    /// [`Exchange`] itself, which also sends what is left of the request's body and hands the
    /// connection back to the pool at the end. The exchange stays where the caller keeps it:
    /// only the head and the first piece come back.
    pub(super) async fn send(
        &self,
        x: &mut Exchange,
        watch: &super::body::BodyWatch,
    ) -> Result<(Head, Option<Bytes>), UpstreamError> {
        for attempt in 0..3 {
            let pooled = if attempt < 2 { self.idle.take() } else { None };
            x.io = Some(match pooled {
                Some(io) => io,
                None => self.connect().await?,
            });
            match std::future::poll_fn(|cx| x.poll_head(cx)).await {
                Ok(head) => {
                    // The answer's head goes to the client with the first of its body (or its
                    // end): an answer whose framing breaks at once is a 502, not a status line
                    // the client never gets. The upstream's silence counts from the head.
                    watch.touch();
                    return match std::future::poll_fn(|cx| x.poll_first(cx)).await {
                        Ok(first) => Ok((head, first)),
                        Err(e) => {
                            x.abandon();
                            Err(e)
                        }
                    };
                }
                // A connection (pooled, or closed while the head waited for the body) that
                // failed before it took any of the request.
                Err(UpstreamError::Io(_) | UpstreamError::Closed) if x.request.written() == 0 => {
                    x.abandon();
                }
                Err(e) => {
                    x.abandon();
                    return Err(e);
                }
            }
        }
        Err(UpstreamError::Closed)
    }
}

/// One request on one upstream connection: the request's head and body written (the body as
/// the client sends it, framed by `Content-Length` or chunked), the answer read. Driven by the
/// request's own task: first by [`UpstreamClient::send`] until the answer's head, then by the
/// answer's body, which keeps sending what is left of the request while it reads.
pub(super) struct Exchange {
    /// The connection, until it goes back to the pool or is closed.
    io: Option<Io>,
    /// The request's head and body, written.
    request: Outgoing,
    /// The answer, read.
    answer: Incoming,
    /// Where the connection goes back.
    pool: Rc<Pool>,
}

impl Exchange {
    fn new(
        head: BytesMut,
        body: ProxyBody,
        framing: Framing,
        method_is_head: bool,
        pool: Rc<Pool>,
    ) -> Self {
        Self {
            io: None,
            request: Outgoing::new(head, body, framing),
            answer: Incoming::new(method_is_head),
            pool,
        }
    }

    /// Send the request: its head, then its body as the client sends it. `Ready(Ok)` once all
    /// of it is written and flushed.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), UpstreamError>> {
        self.request.poll_send(&mut self.io, cx)
    }

    /// Send the request and read the answer's head (informational answers skipped).
    fn poll_head(&mut self, cx: &mut Context<'_>) -> Poll<Result<Head, UpstreamError>> {
        match self.poll_send(cx) {
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            // Nothing asked yet: nothing to read.
            Poll::Pending if self.request.written() == 0 => return Poll::Pending,
            _ => {}
        }
        self.answer.poll_head(&mut self.io, cx, self.request.sent())
    }

    /// The first piece of the answer's body (`None` when it has none), sending what is left of
    /// the request meanwhile.
    fn poll_first(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, UpstreamError>> {
        if let Poll::Ready(Err(e)) = self.poll_send(cx) {
            return Poll::Ready(Err(e));
        }
        match ready!(self.poll_data(cx)) {
            Some(Ok(data)) => Poll::Ready(Ok(Some(data))),
            Some(Err(e)) => Poll::Ready(Err(e)),
            None => Poll::Ready(Ok(None)),
        }
    }

    /// Whether the answer has been read to its end.
    pub(super) fn answered(&self) -> bool {
        self.answer.answered()
    }

    /// The next piece of the answer's body; `None` at its end.
    fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, UpstreamError>>> {
        self.answer.poll_data(&mut self.io, cx)
    }

    /// Give the connection back to the pool if it can carry another request: the request
    /// written whole, the answer read to its end with nothing after it, and the upstream
    /// keeping it open (the socket peeked last: nothing came after the answer). Otherwise it
    /// is closed.
    pub(super) fn finish(&mut self) {
        if let Some(io) = self.io.take() {
            if self.answer.leaves_connection_clean() && self.request.sent() {
                self.pool.give_back(io);
            }
        }
    }

    /// Close the connection: it failed, or what is on it can no longer be trusted.
    fn abandon(&mut self) {
        self.io = None;
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        self.finish();
    }
}

/// The upstream's answer body, read on the request's own task, which also sends what is left
/// of the request's body; the admission slot is held until the body ends or is dropped.
pub(super) struct ExchangeBody {
    pub(super) x: Exchange,
    pub(super) slot: Option<Slot>,
    /// What was read of the body before the head went to the client.
    pub(super) first: Option<Bytes>,
    /// The client's socket and the read timeout: a client that does not take a piece within
    /// it has its connection ended ([`super::stall`]), watched from the first piece on.
    pub(super) stall: Option<(super::stall::ClientSocket, Duration)>,
    pub(super) taken: Option<Rc<super::stall::Taken>>,
}

impl ExchangeBody {
    /// A piece of the answer goes to the client's side: from now on it must be taken.
    fn give(&mut self, data: Bytes) -> Poll<Option<Result<Bytes, UpstreamError>>> {
        if self.taken.is_none() && !self.x.answered() {
            if let Some((socket, limit)) = self.stall {
                self.taken = Some(super::stall::watch(socket, limit));
            }
        }
        if let Some(t) = &self.taken {
            t.given();
        }
        Poll::Ready(Some(Ok(data)))
    }
}

impl Stream for ExchangeBody {
    type Item = Result<Bytes, UpstreamError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if let Some(t) = &this.taken {
            t.asked();
        }
        if let Some(first) = this.first.take() {
            return this.give(first);
        }
        if this.x.answered() {
            // Read to its end (the connection finished with) before the client took it all.
            this.x.finish();
            this.slot = None;
            this.taken = None;
            return Poll::Ready(None);
        }
        if let Poll::Ready(Err(e)) = this.x.poll_send(cx) {
            this.x.abandon();
            this.slot = None;
            return Poll::Ready(Some(Err(e)));
        }
        match this.x.poll_data(cx) {
            Poll::Ready(Some(Ok(data))) => this.give(data),
            Poll::Ready(Some(Err(e))) => {
                this.x.abandon();
                this.slot = None;
                this.taken = None;
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                this.x.finish();
                this.slot = None;
                this.taken = None;
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}
