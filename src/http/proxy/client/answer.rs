//! The answer read from the upstream: its head parsed by `httparse` into the client's response
//! head (status, end-to-end headers, the length declared), how its body is delimited, and the
//! pieces of that body (by length, chunked or to the close), each framing error refused.

use super::error::UpstreamError;
use super::framing::{chunk_size, crlf_only, passed_on, trailer_field, Chunk, Declared, Reading};
use super::pool::Io;
use actix_web::http::StatusCode;
use actix_web::HttpResponse;
use bytes::{Buf, Bytes, BytesMut};
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

/// The answer's head as the client gets it: the status and the end-to-end headers (in a
/// response from the server's own pool of heads), and the length it declares (the client's
/// framing).
pub(in crate::http::proxy) struct Head {
    pub(in crate::http::proxy) res: HttpResponse,
    /// The first `Content-Length` value, read as the client's framing reads it.
    pub(in crate::http::proxy) length: Option<u64>,
}

/// The most header lines an answer's head may carry (as hyper's client).
const MAX_HEADERS: usize = 100;
/// The most bytes an answer's head may take (as hyper's client: 8 KiB and 4 KiB a header).
const MAX_HEAD: usize = 8192 + 4096 * MAX_HEADERS;
/// The most bytes a chunk-size line (extensions included) or all the trailers may take.
const MAX_CHUNK_LINE: usize = 4096;
const MAX_TRAILERS: usize = 16 * 1024;
/// Bytes read at a time.
const READ_SIZE: usize = 8 * 1024;

/// The answer's side of an exchange: what was read of it, and where its body stands.
pub(super) struct Incoming {
    /// What was read and not yet used.
    read: BytesMut,
    method_is_head: bool,
    reading: Reading,
    /// The upstream keeps the connection open after this answer, and nothing about the
    /// answer leaves doubt where it ended: it is not a HEAD's, a 204 or a 304 (after which a
    /// buggy upstream may still send the body it thinks it owes), and it did not come before
    /// the request was written whole (an upstream that answers without reading the body may
    /// read that body as a request of its own and answer it too).
    keep_alive: bool,
}

impl Incoming {
    pub(super) fn new(method_is_head: bool) -> Self {
        Self {
            read: BytesMut::new(),
            method_is_head,
            reading: Reading::Done,
            keep_alive: false,
        }
    }

    /// Read more of the answer: `Ready(Ok(0))` at the end of the stream.
    fn poll_fill(
        &mut self,
        conn: &mut Option<Io>,
        cx: &mut Context<'_>,
        want: usize,
    ) -> Poll<Result<usize, UpstreamError>> {
        let Some(io) = conn.as_mut() else {
            return Poll::Ready(Err(UpstreamError::Closed));
        };
        if self.read.capacity() - self.read.len() < want.min(READ_SIZE) {
            self.read.reserve(want);
        }
        match tokio_util::io::poll_read_buf(Pin::new(io), cx, &mut self.read) {
            Poll::Ready(Ok(n)) => Poll::Ready(Ok(n)),
            Poll::Ready(Err(e)) => Poll::Ready(Err(UpstreamError::Io(e))),
            Poll::Pending => Poll::Pending,
        }
    }

    /// Read the answer's head (informational answers skipped), to a request written whole
    /// or not (`sent`).
    pub(super) fn poll_head(
        &mut self,
        conn: &mut Option<Io>,
        cx: &mut Context<'_>,
        sent: bool,
    ) -> Poll<Result<Head, UpstreamError>> {
        loop {
            if !self.read.is_empty() {
                match self.parse_head(sent)? {
                    Parsed::Head(head) => return Poll::Ready(Ok(head)),
                    Parsed::Informational => continue,
                    Parsed::Partial => {}
                }
            }
            if self.read.len() >= MAX_HEAD {
                return Poll::Ready(Err(UpstreamError::Protocol(
                    "the answer's head is too large",
                )));
            }
            match self.poll_fill(conn, cx, READ_SIZE) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(UpstreamError::Closed)),
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// The answer's head, if the buffer holds all of it: its status and end-to-end headers,
    /// and how its body is delimited (RFC 9112 section 6.3, as hyper's client reads it); the
    /// connection is kept only for an answer to a request written whole (`sent`).
    fn parse_head(&mut self, sent: bool) -> Result<Parsed, UpstreamError> {
        let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
        let mut res = httparse::Response::new(&mut []);
        let used = match httparse::ParserConfig::default()
            .parse_response_with_uninit_headers(&mut res, &self.read, &mut slots)
        {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => return Ok(Parsed::Partial),
            Err(httparse::Error::TooManyHeaders) => {
                return Err(UpstreamError::Protocol("too many header lines"))
            }
            Err(_) => return Err(UpstreamError::Protocol("the answer's head does not parse")),
        };
        // Lines end in CRLF only: a bare LF that a lenient parser takes for a line break (and
        // so a header of the upstream's text: `X-L: a\nSet-Cookie: x`), or a bare CR, is refused.
        if !crlf_only(&self.read[..used]) {
            return Err(UpstreamError::Protocol(
                "a bare LF or CR in the answer's head",
            ));
        }
        let code = res.code.unwrap_or(0);
        let http10 = res.version == Some(0);
        match code {
            101 => {
                return Err(UpstreamError::Protocol(
                    "101 Switching Protocols to a request that asked for no upgrade",
                ))
            }
            100..=199 => {
                self.read.advance(used);
                return Ok(Parsed::Informational);
            }
            _ => {}
        }
        let status =
            StatusCode::from_u16(code).map_err(|_| UpstreamError::Protocol("invalid status"))?;
        let declared = Declared::of(res.headers)?;
        let bodiless = code == 204 || code == 304 || self.method_is_head;
        let reading = declared.reading(bodiless, http10)?;
        self.keep_alive =
            declared.keeps_open(http10) && reading != Reading::Close && !bodiless && sent;
        self.reading = match reading {
            Reading::Length(0) => Reading::Done,
            r => r,
        };
        let head = Head {
            res: passed_on(status, res.headers, declared.connection),
            length: declared.first_length.flatten(),
        };
        self.read.advance(used);
        Ok(Parsed::Head(head))
    }

    /// Whether the answer has been read to its end.
    pub(super) fn answered(&self) -> bool {
        self.reading == Reading::Done
    }

    /// Whether the answer leaves its connection fit for another request: read to its end with
    /// nothing after it, and the upstream keeping the connection open.
    pub(super) fn leaves_connection_clean(&self) -> bool {
        self.keep_alive && self.reading == Reading::Done && self.read.is_empty()
    }

    /// The next piece of the answer's body; `None` at its end.
    pub(super) fn poll_data(
        &mut self,
        conn: &mut Option<Io>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, UpstreamError>>> {
        loop {
            match self.reading {
                Reading::Done => return Poll::Ready(None),
                Reading::Length(left) => {
                    if !self.read.is_empty() {
                        let n = left.min(self.read.len() as u64);
                        let data = self.read.split_to(n as usize).freeze();
                        self.reading = match left - n {
                            0 => Reading::Done,
                            left => Reading::Length(left),
                        };
                        return Poll::Ready(Some(Ok(data)));
                    }
                    let want = usize::try_from(left).unwrap_or(usize::MAX).min(64 * 1024);
                    match ready!(self.poll_fill(conn, cx, want)) {
                        Ok(0) => return Poll::Ready(Some(Err(UpstreamError::Closed))),
                        Ok(_) => {}
                        Err(e) => return Poll::Ready(Some(Err(e))),
                    }
                }
                Reading::Close => {
                    if !self.read.is_empty() {
                        return Poll::Ready(Some(Ok(self.read.split().freeze())));
                    }
                    match ready!(self.poll_fill(conn, cx, 64 * 1024)) {
                        Ok(0) => {
                            self.reading = Reading::Done;
                            return Poll::Ready(None);
                        }
                        Ok(_) => {}
                        Err(e) => return Poll::Ready(Some(Err(e))),
                    }
                }
                Reading::Chunked(chunk) => match self.step_chunked(chunk) {
                    Err(e) => return Poll::Ready(Some(Err(e))),
                    Ok(Some(data)) => return Poll::Ready(Some(Ok(data))),
                    Ok(None) if self.reading != Reading::Chunked(chunk) => {}
                    Ok(None) => match ready!(self.poll_fill(conn, cx, READ_SIZE)) {
                        Ok(0) => return Poll::Ready(Some(Err(UpstreamError::Closed))),
                        Ok(_) => {}
                        Err(e) => return Poll::Ready(Some(Err(e))),
                    },
                },
            }
        }
    }

    /// One step of the chunked framing over what was read: data, or a move to the next
    /// state (`Ok(None)`, `self.reading` changed), or `Ok(None)` with nothing changed when more
    /// must be read.
    fn step_chunked(&mut self, chunk: Chunk) -> Result<Option<Bytes>, UpstreamError> {
        match chunk {
            Chunk::Size => {
                let Some(eol) = self.read.iter().position(|&b| b == b'\n') else {
                    return if self.read.len() > MAX_CHUNK_LINE {
                        Err(UpstreamError::Protocol("chunk-size line too long"))
                    } else {
                        Ok(None)
                    };
                };
                let size = chunk_size(&self.read[..eol])
                    .ok_or(UpstreamError::Protocol("invalid chunk-size line"))?;
                self.read.advance(eol + 1);
                self.reading = Reading::Chunked(match size {
                    0 => Chunk::Trailers(0),
                    n => Chunk::Data(n),
                });
                Ok(None)
            }
            Chunk::Data(left) => {
                if self.read.is_empty() {
                    return Ok(None);
                }
                let n = left.min(self.read.len() as u64);
                let data = self.read.split_to(n as usize).freeze();
                self.reading = Reading::Chunked(match left - n {
                    0 => Chunk::DataEnd,
                    left => Chunk::Data(left),
                });
                Ok(Some(data))
            }
            Chunk::DataEnd => {
                if self.read.len() < 2 {
                    return match self.read.first() {
                        Some(b'\r') | None => Ok(None),
                        Some(_) => Err(UpstreamError::Protocol("chunk data without its CRLF")),
                    };
                }
                if &self.read[..2] != b"\r\n" {
                    return Err(UpstreamError::Protocol("chunk data without its CRLF"));
                }
                self.read.advance(2);
                self.reading = Reading::Chunked(Chunk::Size);
                Ok(None)
            }
            Chunk::Trailers(seen) => {
                let Some(eol) = self.read.iter().position(|&b| b == b'\n') else {
                    return if seen + self.read.len() > MAX_TRAILERS {
                        Err(UpstreamError::Protocol("trailers too large"))
                    } else {
                        Ok(None)
                    };
                };
                let line = &self.read[..eol];
                if line.last() != Some(&b'\r') || line[..line.len() - 1].contains(&b'\r') {
                    return Err(UpstreamError::Protocol("trailer line without CRLF"));
                }
                let empty = eol == 1;
                if !empty && !trailer_field(&line[..line.len() - 1]) {
                    return Err(UpstreamError::Protocol(
                        "a trailer line that is not a field",
                    ));
                }
                self.read.advance(eol + 1);
                let seen = seen + eol + 1;
                if seen > MAX_TRAILERS {
                    return Err(UpstreamError::Protocol("trailers too large"));
                }
                self.reading = if empty {
                    Reading::Done
                } else {
                    Reading::Chunked(Chunk::Trailers(seen))
                };
                Ok(None)
            }
        }
    }
}

/// Status, the headers passed on (names lower case, in order), the declared length, the body.
#[cfg(any(test, feature = "fuzzing"))]
pub(in crate::http::proxy) type ReadAnswer = (u16, Vec<(String, Vec<u8>)>, Option<u64>, Vec<u8>);

/// An answer as this client reads it from `bytes` (everything the upstream sent, then the end
/// of the stream), to a request written whole: its status, the headers it passes on, the
/// length it declares to the client, its body; or why it is refused. For the differential
/// check against hyper's client (`proxy/differential.rs`).
#[cfg(any(test, feature = "fuzzing"))]
pub(in crate::http::proxy) fn read_answer(
    bytes: &[u8],
    method_is_head: bool,
) -> Result<ReadAnswer, String> {
    let mut x = Incoming::new(method_is_head);
    // No connection: what `bytes` holds is all there is.
    let mut conn = None;
    x.read.extend_from_slice(bytes);
    let head = loop {
        match x.parse_head(true).map_err(|e| e.to_string())? {
            Parsed::Head(head) => break head,
            Parsed::Informational => continue,
            Parsed::Partial => return Err("the head is incomplete".to_owned()),
        }
    };
    let status = head.res.status().as_u16();
    let headers = head
        .res
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), v.as_bytes().to_vec()))
        .collect();
    let mut body = Vec::new();
    if !matches!(status, 204 | 304) {
        let mut cx = Context::from_waker(futures_util::task::noop_waker_ref());
        loop {
            match x.poll_data(&mut conn, &mut cx) {
                Poll::Ready(Some(Ok(data))) => body.extend_from_slice(&data),
                Poll::Ready(None) => break,
                // The end of the stream ends an answer read until the connection closes.
                Poll::Ready(Some(Err(UpstreamError::Closed)))
                    if x.reading == Reading::Close && x.read.is_empty() =>
                {
                    break
                }
                Poll::Ready(Some(Err(e))) => return Err(e.to_string()),
                Poll::Pending => return Err("waits for more".to_owned()),
            }
        }
    }
    Ok((status, headers, head.length, body))
}

enum Parsed {
    Head(Head),
    Informational,
    Partial,
}
