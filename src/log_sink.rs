//! Where the process's own output goes, without ever panicking when nobody reads it.
//!
//! `eprintln!`/`println!` panic when a write fails, and tracing-subscriber's fmt layer reports
//! a failed write with `eprintln!`. Behind `2>&1 | head` or a log shipper that restarts, stderr
//! is a pipe whose reader may be gone (EPIPE): a panic there would take down whichever worker,
//! listener or signal watcher happened to log. Here a line that cannot be written is dropped
//! and counted (`fleet_limiter_log_lines_dropped_total`); serving and shutdown go on.

use std::fmt::Display;
use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};

/// Log lines dropped so far. Process-wide because the sink is: every limiter and gateway in the
/// process writes to the one stderr. Each metrics registry reads it when rendered.
static LINES_DROPPED: AtomicU64 = AtomicU64::new(0);

/// How many log lines this process has dropped because stderr could not be written.
pub(crate) fn lines_dropped() -> u64 {
    LINES_DROPPED.load(Ordering::Relaxed)
}

/// The log writer for tracing-subscriber: each event goes to stderr in one write; an event
/// that cannot be written is dropped and counted, never reported as an error.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Stderr;

/// One event's writer (see [`Stderr`]).
#[derive(Debug)]
pub(crate) struct Line;

impl Write for Line {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        write_or_count(&mut io::stderr().lock(), buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        let _ = io::stderr().flush();
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Stderr {
    type Writer = Line;

    fn make_writer(&'a self) -> Line {
        Line
    }
}

/// Write `buf` whole to `out`; when that fails, count one dropped line. Returns whether it was
/// written.
pub(crate) fn write_or_count(out: &mut impl Write, buf: &[u8]) -> bool {
    let written = out.write_all(buf).is_ok();
    if !written {
        LINES_DROPPED.fetch_add(1, Ordering::Relaxed);
    }
    written
}

/// `eprintln!` that never panics: one line to stderr, dropped (and counted) when it cannot be
/// written.
pub(crate) fn eprint_line(text: impl Display) {
    write_or_count(&mut io::stderr().lock(), format!("{text}\n").as_bytes());
}

/// `print!` that never panics: a report to stdout (`check`, `simulate`). A reader that went
/// away (`| head`) loses the rest of it, as from any command; the exit code stays the verdict.
pub(crate) fn print(text: &str) {
    let mut out = io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that has gone away: every write fails as a closed pipe does.
    struct ClosedPipe;

    impl Write for ClosedPipe {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> io::Result<()> {
            Err(io::ErrorKind::BrokenPipe.into())
        }
    }

    #[test]
    fn a_line_that_cannot_be_written_is_counted_not_raised() {
        let before = lines_dropped();
        assert!(!write_or_count(&mut ClosedPipe, b"lost\n"));
        assert!(lines_dropped() > before);
        let mut kept = Vec::new();
        assert!(write_or_count(&mut kept, b"kept\n"));
        assert_eq!(kept, b"kept\n");
    }
}

/// What actix-web's HTTP/1 dispatcher logs at ERROR when a *client* sent something it could not
/// serve: a request it could not parse, headers that never finished, a connection reset or
/// never closed, a body left unread after a refusal. None is a fault of the gateway or of its
/// upstream, and an operator's ERROR log must mean one: [`ClientFaults`] turns them into DEBUG
/// lines (target `fleet_limiter::client`). Everything else the dispatcher says (a handler or
/// body error, an upstream answer cut mid-stream) stays at ERROR.
const CLIENT_FAULTS: [&str; 5] = [
    "stream error: request parse error",
    "stream error: request did not complete within the specified timeout",
    "stream error: I/O error",
    "stream error: connection shutdown timeout",
    "stream error: handler dropped payload before reading EOF",
];

/// Whether an ERROR line of actix-web's dispatcher is about a client's request (see
/// [`CLIENT_FAULTS`]).
pub(crate) fn is_client_fault(target: &str, message: &str) -> bool {
    target.starts_with("actix_http::h1") && CLIENT_FAULTS.iter().any(|p| message.starts_with(p))
}

/// A tracing layer that logs a client's malformed request at DEBUG instead of ERROR (see
/// [`CLIENT_FAULTS`]).
pub(crate) struct ClientFaults;

/// An event's `message` field, as text.
struct Message(String);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "message" {
            value.clone_into(&mut self.0);
        }
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for ClientFaults {
    fn event_enabled(
        &self,
        event: &tracing::Event<'_>,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        let meta = event.metadata();
        if *meta.level() != tracing::Level::ERROR || !meta.target().starts_with("actix_http") {
            return true;
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        if !is_client_fault(meta.target(), &message.0) {
            return true;
        }
        tracing::debug!(target: "fleet_limiter::client", "a client's request could not be served: {}", message.0);
        false
    }
}

#[cfg(test)]
mod client_fault_tests {
    use super::is_client_fault;

    #[test]
    fn a_clients_malformed_request_is_its_own_and_an_upstream_cut_is_not() {
        let d = "actix_http::h1::dispatcher";
        for client in [
            "stream error: request parse error: invalid Header provided",
            "stream error: request parse error: URI error: invalid uri character",
            "stream error: request did not complete within the specified timeout",
            "stream error: I/O error: Connection reset by peer (os error 104)",
            "stream error: handler dropped payload before reading EOF",
        ] {
            assert!(is_client_fault(d, client), "{client}");
        }
        for ours in [
            "Response payload stream error: upstream answer timed out",
            "stream error: service error",
            "stream error: body error: x",
            "Internal server error: unexpected eof",
        ] {
            assert!(!is_client_fault(d, ours), "{ours}");
        }
        assert!(!is_client_fault(
            "fleet_limiter::http",
            "stream error: request parse error: x"
        ));
    }
}
