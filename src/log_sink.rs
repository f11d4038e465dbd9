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
