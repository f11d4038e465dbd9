//! Opening logs (plain or gzip, by name or by magic bytes) and reading them a capped line at a time.

use flate2::read::MultiGzDecoder;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The longest line a replay reads; longer ones are counted as malformed and skipped.
pub(crate) const MAX_LINE: usize = 64 * 1024;

/// Counts the bytes read from the file itself (before decompression), for progress.
struct Counting<R> {
    inner: R,
    read: Arc<AtomicU64>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// An open log: its lines, its size on disk, and how much of it has been read.
pub(crate) struct Log {
    pub reader: Box<dyn BufRead>,
    pub size: u64,
    pub read: Arc<AtomicU64>,
    pub gzip: bool,
}

/// Open `path`, decompressing it when it is gzip (by its magic bytes, whatever its name).
pub(crate) fn open(path: &Path) -> io::Result<Log> {
    let file = File::open(path)?;
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    let read = Arc::new(AtomicU64::new(0));
    let mut raw = BufReader::with_capacity(
        256 * 1024,
        Counting {
            inner: file,
            read: read.clone(),
        },
    );
    let gzip = raw.fill_buf()?.starts_with(&[0x1f, 0x8b]);
    let reader: Box<dyn BufRead> = if gzip {
        Box::new(BufReader::with_capacity(
            256 * 1024,
            MultiGzDecoder::new(raw),
        ))
    } else {
        Box::new(raw)
    };
    Ok(Log {
        reader,
        size,
        read,
        gzip,
    })
}

/// One line read by [`next_line`].
pub(crate) enum Line {
    /// A whole line (without its `\n` or `\r\n`) is in the buffer.
    Text,
    /// The line was longer than [`MAX_LINE`]; what was read of it is dropped.
    TooLong,
    End,
}

/// Read the next line into `buf`, holding at most [`MAX_LINE`] bytes of it in memory.
pub(crate) fn next_line(r: &mut dyn BufRead, buf: &mut Vec<u8>) -> io::Result<Line> {
    buf.clear();
    let mut too_long = false;
    let mut any = false;
    loop {
        let chunk = match r.fill_buf() {
            Ok(c) => c,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if chunk.is_empty() {
            break;
        }
        any = true;
        let (take, done) = match chunk.iter().position(|&c| c == b'\n') {
            Some(p) => (p, true),
            None => (chunk.len(), false),
        };
        if !too_long {
            if buf.len() + take > MAX_LINE {
                too_long = true;
                buf.clear();
            } else {
                buf.extend_from_slice(&chunk[..take]);
            }
        }
        r.consume(take + usize::from(done));
        if done {
            break;
        }
    }
    if too_long {
        return Ok(Line::TooLong);
    }
    if !any {
        return Ok(Line::End);
    }
    if buf.last() == Some(&b'\r') {
        buf.pop();
    }
    Ok(Line::Text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_capped() {
        let mut data = b"short\r\n".to_vec();
        data.extend(std::iter::repeat_n(b'x', MAX_LINE + 10));
        data.extend_from_slice(b"\nlast");
        let mut r = io::Cursor::new(data);
        let mut buf = Vec::new();
        assert!(matches!(next_line(&mut r, &mut buf).unwrap(), Line::Text));
        assert_eq!(buf, b"short");
        assert!(matches!(
            next_line(&mut r, &mut buf).unwrap(),
            Line::TooLong
        ));
        assert!(matches!(next_line(&mut r, &mut buf).unwrap(), Line::Text));
        assert_eq!(buf, b"last");
        assert!(matches!(next_line(&mut r, &mut buf).unwrap(), Line::End));
    }
}
