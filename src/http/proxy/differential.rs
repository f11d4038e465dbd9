//! The proxy's HTTP/1.1 client held against hyper's: one upstream byte stream read by both,
//! the same answer required of this client, or a refusal where hyper reads one (stricter is
//! allowed, laxer is not). Run by the fuzz target `proxy_answers` (docs/fuzzing.md) and by the
//! property test in this module's tests.

use super::client::read_answer;
use super::headers::{connection_named, skip_header};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What a client made of an answer: status, the end-to-end headers (names lower case, in
/// order), the body.
type Answer = (u16, Vec<(String, Vec<u8>)>, Vec<u8>);

/// `None` when this client reads `bytes` (the whole of what the upstream sent to a GET, or to a
/// HEAD with `head`) as hyper's client does or refuses it; else what differs.
pub(crate) fn differs(bytes: &[u8], head: bool) -> Option<String> {
    let ours = read_answer(bytes, head);
    if let Ok((status, _, Some(length), body)) = &ours {
        // The length the client is told is the length it gets.
        if !head && !matches!(status, 204 | 304) && *length != body.len() as u64 {
            return Some(format!(
                "declares {length} bytes to the client and reads {}",
                body.len()
            ));
        }
    }
    let Ok((status, headers, _, body)) = ours else {
        return None;
    };
    match hyper_reads(bytes, head) {
        Err(e) => Some(format!(
            "read as {status} with {} body bytes where hyper refuses it: {e}",
            body.len()
        )),
        Ok(mut theirs) => {
            // Header lines are compared by name (the values of one name in their order): the
            // server's header table keeps no order between names.
            let mut headers = headers;
            headers.sort_by(|a, b| a.0.cmp(&b.0));
            theirs.1.sort_by(|a, b| a.0.cmp(&b.0));
            let ours = (status, headers, body);
            (ours != theirs).then(|| format!("ours: {ours:?}\nhyper: {theirs:?}"))
        }
    }
}

/// The answer hyper's HTTP/1.1 client reads from `bytes`, its headers filtered as this
/// client filters them.
fn hyper_reads(bytes: &[u8], head: bool) -> Result<Answer, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let (client, mut server) = tokio::io::duplex(bytes.len() + 64 * 1024);
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(client))
            .await
            .map_err(|e| e.to_string())?;
        let upstream = async move {
            // The request's head, then the answer, then the end of the stream.
            let mut seen = Vec::new();
            let mut buf = [0u8; 1024];
            while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                match server.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => seen.extend_from_slice(&buf[..n]),
                }
            }
            let _ = server.write_all(bytes).await;
            let _ = server.shutdown().await;
        };
        let exchange = async move {
            let req = hyper::Request::builder()
                .method(if head { "HEAD" } else { "GET" })
                .uri("/")
                .header("host", "upstream")
                .body(http_body_util_empty())
                .map_err(|e| e.to_string())?;
            let res = sender.send_request(req).await.map_err(|e| e.to_string())?;
            let status = res.status().as_u16();
            let named = connection_named(
                res.headers()
                    .get_all(hyper::header::CONNECTION)
                    .iter()
                    .map(|v| v.as_bytes()),
            );
            let headers = res
                .headers()
                .iter()
                .filter(|(k, _)| !skip_header(k.as_str(), &named))
                .map(|(k, v)| (k.as_str().to_owned(), v.as_bytes().to_vec()))
                .collect();
            let mut body = Vec::new();
            let mut incoming = res.into_body();
            while let Some(frame) = std::future::poll_fn(|cx| {
                hyper::body::Body::poll_frame(std::pin::Pin::new(&mut incoming), cx)
            })
            .await
            {
                if let Ok(data) = frame.map_err(|e| e.to_string())?.into_data() {
                    body.extend_from_slice(&data);
                }
            }
            drop(sender);
            Ok::<Answer, String>((status, headers, body))
        };
        let conn = async move {
            let _ = conn.await;
        };
        let ((), (), answer) = tokio::join!(upstream, conn, exchange);
        answer
    })
}

/// An empty request body.
fn http_body_util_empty() -> super::body::ProxyBody {
    super::body::ProxyBody::Empty
}

/// The raw answers the issue that asked for this check named, and a few more misframings: the
/// seeds of the fuzz target's corpus and the property test's cases.
pub(crate) const SEEDS: &[&[u8]] = &[
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello worldHTTP/1.1 200 OK\r\nContent-Length: 8\r\nX-Injected: 1\r\n\r\ninjected",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nX-L: a\nSet-Cookie: evil=1\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nX-L: a\rSet-Cookie: evil=1\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1ffffffffffffffff\r\nhello\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-T: 1\r\n\r\n",
    b"HTTP/1.1 204 No Content\r\n\r\nhelloHTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\ninjected",
    b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\nhello",
    b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
    b"HTTP/1.1 200 OK\r\nContent-Length: 3, 3\r\n\r\nabc",
    b"HTTP/1.1 200 OK\r\nContent-Length: +3\r\n\r\nabc",
    b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nX-Up: close\r\n\r\nuntil the connection closes",
    b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 3\r\n\r\nnew",
    b"HTTP/1.1 200 OK\r\nConnection: X-Named\r\nX-Named: 1\r\nKeep-Alive: timeout=5\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nX-Up: fold\r\n  ed\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\nraw",
    b"HTTP/1.1 20 OK\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
    // Found by the fuzz target: a trailer whose name is not a token (hyper refuses it).
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX\xd2T: 1\r\n\r\n200 OK",
    // Found by the fuzz target: a coding that is not text before `chunked` (hyper reads the
    // body until the connection closes; the last token said chunked).
    b"HTTP/1.1 200 OKb\r\nTransfer-Encoding: gzi\xa5, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
];

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_seeds_read_as_hyper_reads_them_or_stricter() {
        for seed in SEEDS {
            for head in [false, true] {
                assert_eq!(
                    differs(seed, head),
                    None,
                    "{} (HEAD: {head})",
                    seed.escape_ascii()
                );
            }
        }
    }

    /// The check is not empty: hyper reads a plain answer, its filtered headers as ours, and
    /// most seeds are read by both clients and compared.
    #[test]
    fn hyper_reads_what_it_is_given_and_most_seeds_are_compared() {
        assert_eq!(
            hyper_reads(
                b"HTTP/1.1 200 OK\r\nConnection: X-A\r\nX-A: 1\r\nX-B: 2\r\nContent-Length: 5\r\n\r\nhello",
                false
            ),
            Ok((200, vec![("x-b".to_owned(), b"2".to_vec())], b"hello".to_vec()))
        );
        assert!(hyper_reads(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", false).is_err());
        let compared = SEEDS
            .iter()
            .filter(|s| read_answer(s, false).is_ok() && hyper_reads(s, false).is_ok())
            .count();
        assert!(compared >= 10, "{compared} of {}", SEEDS.len());
    }

    #[test]
    fn the_cases_now_refused_are_refused() {
        for refused in [SEEDS[2], SEEDS[3], SEEDS[4], SEEDS[5], SEEDS[6], SEEDS[7]] {
            assert!(
                read_answer(refused, false).is_err(),
                "{}",
                refused.escape_ascii()
            );
        }
    }

    /// Answers made of the pieces misframing is made of: status lines, framing headers (one,
    /// both, twice, malformed), bare LFs and CRs, chunk lines of every shape, bytes after.
    fn answer() -> impl Strategy<Value = Vec<u8>> {
        let status = prop::sample::select(vec![
            "HTTP/1.1 200 OK\r\n",
            "HTTP/1.0 200 OK\r\n",
            "HTTP/1.1 204 No Content\r\n",
            "HTTP/1.1 304 Not Modified\r\n",
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n",
            "HTTP/1.1 404 Not Found\n",
        ]);
        let header = prop::sample::select(vec![
            "Content-Length: 5\r\n",
            "Content-Length: 3\r\n",
            "Content-Length: 0\r\n",
            "Content-Length: 5, 5\r\n",
            "Content-Length: -1\r\n",
            "Content-Length: 99999999999999999999999\r\n",
            "Transfer-Encoding: chunked\r\n",
            "Transfer-Encoding: gzip\r\n",
            "Transfer-Encoding: gzip, chunked\r\n",
            "Connection: close\r\n",
            "Connection: keep-alive, X-A\r\n",
            "X-A: 1\r\n",
            "X-L: a\nSet-Cookie: evil=1\r\n",
            "X-L: a\rb\r\n",
            "X-Fold: a\r\n b\r\n",
            "Set-Cookie: s=1\r\n",
        ]);
        let body = prop::sample::select(vec![
            "hello",
            "5\r\nhello\r\n0\r\n\r\n",
            "5\nhello\r\n0\r\n\r\n",
            "-5\r\nhello\r\n0\r\n\r\n",
            "1ffffffffffffffff\r\nhello\r\n0\r\n\r\n",
            "3;x=y\r\nabc\r\n0\r\nT: 1\r\n\r\n",
            "5\r\nhello\r\n",
            "",
            "hello worldHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx",
        ]);
        (
            status,
            prop::collection::vec(header, 0..4),
            body,
            prop::collection::vec(any::<u8>(), 0..3),
        )
            .prop_map(|(s, hs, b, noise)| {
                let mut out = s.as_bytes().to_vec();
                for h in hs {
                    out.extend_from_slice(h.as_bytes());
                }
                out.extend_from_slice(b"\r\n");
                out.extend_from_slice(b.as_bytes());
                out.extend_from_slice(&noise);
                out
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn every_answer_reads_as_hyper_reads_it_or_is_refused(bytes in answer(), head in any::<bool>()) {
            prop_assert_eq!(differs(&bytes, head), None, "{}", bytes.escape_ascii());
        }
    }
}
