//! The bodies in flight: the client's body paced on its way to the upstream, and the silence
//! the upstream and the answer's body may keep before they are cut off.

use super::pace::{BodyPace, BodyRules, Trip};
use crate::metrics::{AdmissionMeter, Metrics, ShedReason};
use actix_web::{web, HttpRequest};
use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use http_body::{Body, Frame, SizeHint};
use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// What a request body tells the rest of its forwarding: what moved when, and how it failed.
pub(super) struct BodyWatch {
    /// The last moment the request moved: sent, or a body chunk taken from the client.
    moved: Cell<Instant>,
    /// Whether the body is waiting on the client now (the upstream is not the slow side).
    waiting_on_client: Cell<bool>,
    /// How the client's body failed, if it did.
    pub(super) failed: Cell<Option<ClientFault>>,
    /// Where a body cut off for its pace is counted.
    metrics: Arc<Metrics>,
}

impl BodyWatch {
    pub(super) fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            metrics,
            moved: Cell::new(Instant::now()),
            waiting_on_client: Cell::new(false),
            failed: Cell::new(None),
        }
    }
}

impl BodyWatch {
    /// The upstream moved: its answer's head came (the silence it may keep starts again).
    pub(super) fn touch(&self) {
        self.moved.set(Instant::now());
    }
}

/// Why the client's body did not make it to the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ClientFault {
    /// It broke a pace rule and was cut off.
    TooSlow(Trip),
    /// It ended early (the client went away) or was malformed.
    Broken,
}

/// A request body on its way to the upstream: none, or the client's, streamed as it arrives.
pub(super) enum ProxyBody {
    Empty,
    Stream(Box<StreamBody>),
}

/// The client's body, streamed as it arrives and held to its pace.
pub(super) struct StreamBody {
    payload: web::Payload,
    /// The declared length (`Content-Length`), or `None` for a chunked body.
    length: Option<u64>,
    watch: Rc<BodyWatch>,
    pace: BodyPace,
    /// The wait for the client under way: since when, until when, and which rule ends it.
    wait: Option<(tokio::time::Instant, tokio::time::Instant, Trip)>,
    /// Wakes the body at the end of a wait (made at the first wait).
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    /// For the log line when the body is cut off.
    peer: Option<std::net::IpAddr>,
    /// Where a body cut off at its admission slot's hold is counted (its slot's group).
    hold_meter: Option<AdmissionMeter>,
    done: bool,
}

impl ProxyBody {
    pub(super) fn stream(
        payload: web::Payload,
        length: Option<u64>,
        watch: &Rc<BodyWatch>,
        req: &HttpRequest,
        rules: BodyRules,
        hold_meter: Option<AdmissionMeter>,
    ) -> Self {
        ProxyBody::Stream(Box::new(StreamBody {
            payload,
            length,
            watch: watch.clone(),
            pace: BodyPace::new(rules),
            wait: None,
            timer: None,
            peer: req.peer_addr().map(|a| a.ip()),
            hold_meter,
            done: false,
        }))
    }
}

impl ProxyBody {
    /// [`Body::poll_frame`]'s data, with the payload asked as [`StreamBody::poll_chunk`]'s
    /// `peek` says.
    pub(super) fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
        peek: bool,
    ) -> Poll<Option<Result<Bytes, ClientBodyError>>> {
        match self {
            ProxyBody::Empty => Poll::Ready(None),
            ProxyBody::Stream(s) => s.poll_chunk(cx, peek),
        }
    }

    /// `None` for no body; else the declared length, `None` inside for a chunked body.
    pub(super) fn declared(&self) -> Option<Option<u64>> {
        match self {
            ProxyBody::Empty => None,
            ProxyBody::Stream(s) => Some(s.length),
        }
    }
}

/// The client's body failed: it went away, sent a malformed chunk, or was too slow.
#[derive(Debug)]
pub(super) enum ClientBodyError {
    Broken(String),
    TooSlow(Trip),
}

impl std::fmt::Display for ClientBodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientBodyError::Broken(e) => write!(f, "request body: {e}"),
            ClientBodyError::TooSlow(trip) => {
                write!(f, "request body too slow ({})", trip.as_str())
            }
        }
    }
}

impl std::error::Error for ClientBodyError {}

impl StreamBody {
    /// The next chunk of the client's body. With `peek`, the payload is asked without leaving
    /// this task's waker with it (the pace rules' timer still wakes it): for the first look,
    /// made while the server is still reading the request, which polls the handler again once
    /// it has read more of the body.
    fn poll_chunk(
        &mut self,
        cx: &mut Context<'_>,
        peek: bool,
    ) -> Poll<Option<Result<Bytes, ClientBodyError>>> {
        if self.done {
            return Poll::Ready(None);
        }
        let next = if peek {
            let mut quiet = Context::from_waker(futures_util::task::noop_waker_ref());
            self.payload.poll_next_unpin(&mut quiet)
        } else {
            self.payload.poll_next_unpin(cx)
        };
        match next {
            Poll::Ready(Some(Ok(chunk))) => {
                let waited = self
                    .wait
                    .take()
                    .map_or(Duration::ZERO, |(since, _, _)| since.elapsed());
                self.pace.chunk(waited, chunk.len() as u64);
                self.watch.waiting_on_client.set(false);
                self.watch.moved.set(Instant::now());
                Poll::Ready(Some(Ok(chunk)))
            }
            Poll::Ready(Some(Err(e))) => {
                self.finish(ClientFault::Broken);
                Poll::Ready(Some(Err(ClientBodyError::Broken(e.to_string()))))
            }
            Poll::Ready(None) => {
                self.done = true;
                self.watch.waiting_on_client.set(false);
                Poll::Ready(None)
            }
            Poll::Pending => match self.poll_wait(cx) {
                Poll::Ready(trip) => Poll::Ready(Some(Err(ClientBodyError::TooSlow(trip)))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    /// The client has nothing for us: start or continue the wait, and end the body when a
    /// rule trips.
    fn poll_wait(&mut self, cx: &mut Context<'_>) -> Poll<Trip> {
        let (since, until, trip) = *self.wait.get_or_insert_with(|| {
            let now = tokio::time::Instant::now();
            let (allowed, trip) = self.pace.allowance();
            (now, later(now, allowed), trip)
        });
        self.watch.waiting_on_client.set(true);
        if tokio::time::Instant::now() < until {
            let timer = match &mut self.timer {
                Some(t) => {
                    if t.deadline() != until {
                        t.as_mut().reset(until);
                    }
                    t
                }
                None => self.timer.insert(Box::pin(tokio::time::sleep_until(until))),
            };
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
        self.finish(ClientFault::TooSlow(trip));
        let waited = self.pace.waited().saturating_add(since.elapsed());
        if trip == Trip::Hold {
            if let Some(meter) = &self.hold_meter {
                meter.shed(ShedReason::BodyHold);
            }
            tracing::warn!(
                rule = trip.as_str(),
                peer = self.peer.map(tracing::field::display),
                bytes_received = self.pace.bytes(),
                declared_length = self.length,
                waited_seconds = waited.as_secs_f64(),
                "request body still arriving after admission.body_hold while it holds an admission slot; cutting it off"
            );
        } else {
            if let Some(rule) = trip.body_timeout() {
                self.watch.metrics.client_body_timeout(rule);
            }
            tracing::warn!(
                rule = trip.as_str(),
                peer = self.peer.map(tracing::field::display),
                bytes_received = self.pace.bytes(),
                declared_length = self.length,
                waited_seconds = waited.as_secs_f64(),
                "request body too slow; cutting it off"
            );
        }
        Poll::Ready(trip)
    }

    fn finish(&mut self, fault: ClientFault) {
        self.done = true;
        self.wait = None;
        self.timer = None;
        self.watch.waiting_on_client.set(false);
        self.watch.failed.set(Some(fault));
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = ClientBodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ClientBodyError>>> {
        match self.get_mut() {
            ProxyBody::Empty => Poll::Ready(None),
            ProxyBody::Stream(s) => s
                .poll_chunk(cx, false)
                .map(|c| c.map(|r| r.map(Frame::data))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ProxyBody::Empty => true,
            ProxyBody::Stream(s) => s.done,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ProxyBody::Empty => SizeHint::with_exact(0),
            ProxyBody::Stream(s) => match s.length {
                Some(n) => SizeHint::with_exact(n),
                None => SizeHint::default(),
            },
        }
    }
}

/// `t + d`, or about thirty years on when that is past the clock's range: a deadline that
/// never comes, from a timeout too long to add.
pub(super) fn later(t: tokio::time::Instant, d: Duration) -> tokio::time::Instant {
    t.checked_add(d)
        .unwrap_or_else(|| t + Duration::from_secs(30 * 365 * 86_400))
}

/// Resolves once the upstream side has been silent for `limit`: nothing moved since the
/// instant in `watch.moved`, and the body is not waiting on the client (the client's silence
/// is the body timeout's business, never an upstream timeout).
pub(super) async fn silent_for(watch: Rc<BodyWatch>, limit: Duration) {
    loop {
        let now = tokio::time::Instant::now();
        let from = if watch.waiting_on_client.get() {
            now
        } else {
            tokio::time::Instant::from_std(watch.moved.get())
        };
        let due = later(from, limit);
        if now >= due {
            return;
        }
        tokio::time::sleep_until(due).await;
    }
}

/// An upstream answer's body that fails when the upstream goes silent for `limit`: counted
/// from the first time the answer had nothing for the gateway after it last moved (time the
/// client's side spends not asking for more is not the upstream's silence). The timer is made
/// only when the answer first keeps the gateway waiting.
pub(super) struct IdleTimeout<S> {
    inner: S,
    limit: Duration,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Something came since the timer was last set.
    moved: bool,
}

impl<S> IdleTimeout<S> {
    pub(super) fn new(inner: S, limit: Duration) -> Self {
        Self {
            inner,
            limit,
            timer: None,
            moved: false,
        }
    }
}

impl<S, E> Stream for IdleTimeout<S>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: Into<Box<dyn std::error::Error>>,
{
    type Item = Result<Bytes, Box<dyn std::error::Error>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        match this.inner.poll_next_unpin(cx) {
            Poll::Ready(Some(item)) => {
                this.moved = true;
                Poll::Ready(Some(item.map_err(Into::into)))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                let timer = match &mut this.timer {
                    Some(t) => {
                        if this.moved {
                            t.as_mut()
                                .reset(later(tokio::time::Instant::now(), this.limit));
                        }
                        t
                    }
                    None => this.timer.insert(Box::pin(tokio::time::sleep_until(later(
                        tokio::time::Instant::now(),
                        this.limit,
                    )))),
                };
                this.moved = false;
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        tracing::warn!(
                            "upstream went silent in the middle of an answer; cutting it off"
                        );
                        Poll::Ready(Some(Err("upstream answer timed out".into())))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}
