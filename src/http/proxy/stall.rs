//! A client that stops taking its answer holds nothing for long: once a piece of the answer
//! has waited `read_timeout` for the client's side to ask for the next (the server stops asking
//! while what it wrote has not been taken), the client's connection is ended. Its answer is
//! then dropped, and with it the upstream connection (closed, never pooled), the admission slot
//! and the shaping place the request held.
//!
//! The server keeps no per-write timeout of its own, and does not poll an answer's body while
//! its write buffer is full, so only the socket can end the exchange from outside: it is shut
//! down (with a zero linger, so what the client never took is reset rather than kept), and the
//! server's next write fails.

use std::any::Any;
use std::cell::Cell;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::rc::{Rc, Weak};
use std::time::Duration;

/// The socket of a client's connection (HTTP/1.1: one connection, one server task owning both
/// it and the answer being written on it).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClientSocket(RawFd);

/// For the traffic server's `on_connect`: remember each connection's socket.
pub(crate) fn remember_client_socket(conn: &dyn Any, ext: &mut actix_web::dev::Extensions) {
    type Tls = actix_tls::accept::rustls_0_23::TlsStream<actix_web::rt::net::TcpStream>;
    let fd = if let Some(s) = conn.downcast_ref::<actix_web::rt::net::TcpStream>() {
        s.as_raw_fd()
    } else if let Some(s) = conn.downcast_ref::<Tls>() {
        s.get_ref().0.as_raw_fd()
    } else {
        return;
    };
    ext.insert(ClientSocket(fd));
}

/// When the client's side last got a piece it has not asked past yet.
#[derive(Default)]
pub(super) struct Taken {
    waiting_since: Cell<Option<tokio::time::Instant>>,
}

impl Taken {
    /// The server asked for more: what it had is taken.
    pub(super) fn asked(&self) {
        self.waiting_since.set(None);
    }

    /// A piece of the answer went to the server's side.
    pub(super) fn given(&self) {
        if self.waiting_since.get().is_none() {
            self.waiting_since.set(Some(tokio::time::Instant::now()));
        }
    }
}

/// Watch `taken` (held by the answer's body) on the request's worker; end `socket`'s
/// connection when a piece has waited `limit` untaken. Ends with the answer (the body dropped).
pub(super) fn watch(socket: ClientSocket, limit: Duration) -> Rc<Taken> {
    let taken = Rc::new(Taken::default());
    let weak = Rc::downgrade(&taken);
    actix_web::rt::spawn(watch_until_taken(weak, socket, limit));
    taken
}

async fn watch_until_taken(taken: Weak<Taken>, socket: ClientSocket, limit: Duration) {
    loop {
        let due = {
            let Some(t) = taken.upgrade() else { return };
            let since = t
                .waiting_since
                .get()
                .unwrap_or_else(tokio::time::Instant::now);
            super::body::later(since, limit)
        };
        tokio::time::sleep_until(due).await;
        let Some(t) = taken.upgrade() else { return };
        let stalled = t
            .waiting_since
            .get()
            .is_some_and(|since| since.elapsed() >= limit);
        if stalled {
            tracing::warn!(
                waited_seconds = limit.as_secs_f64(),
                "the client did not take its answer within the read timeout; ending the exchange"
            );
            end(socket);
            return;
        }
    }
}

/// Shut the client's socket down, to be reset when the server closes it.
fn end(socket: ClientSocket) {
    // SAFETY: the answer's body is alive (its `Taken` was upgraded just now, on this thread),
    // so the server task that owns both the body and the connection has not dropped the
    // connection: the descriptor is still that connection's socket, open.
    let fd = unsafe { BorrowedFd::borrow_raw(socket.0) };
    let sock = socket2::SockRef::from(&fd);
    let _ = sock.set_linger(Some(Duration::ZERO));
    let _ = sock.shutdown(std::net::Shutdown::Both);
}
