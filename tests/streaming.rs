//! Bodies stream through the gateway both ways: a 256 MiB download and a 256 MiB upload pass
//! while the gateway's resident memory stays flat. The upstream here is a few lines of plain
//! sockets that generate and discard bytes as they go, so nothing in the test buffers a body.

mod common;

use common::{client, Gateway};
use futures_util::StreamExt;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

const MIB: u64 = 1024 * 1024;
const SIZE: u64 = 256 * MIB;
/// The most the gateway's RSS may grow while a body of `SIZE` passes through it.
const MAX_GROWTH_KIB: u64 = 64 * 1024;
/// A buggy, buffering proxy gets this long to read ahead while the other side does not read.
const STALL: Duration = Duration::from_millis(500);
/// `/slow-upload` pauses this long after each MiB it reads.
const CRAWL_PAUSE: Duration = Duration::from_millis(150);

/// A tiny HTTP/1.1 upstream on its own threads.
///
/// - `GET /download/<n>`: `n` bytes of a repeating pattern, written as the socket accepts them
///   (the first 1 MiB, then a stall, then the rest).
/// - `POST /upload` (Content-Length or chunked): stalls, then reads and discards the body;
///   answers with the number of bytes it read.
fn spawn_upstream() -> String {
    serve_upstream(TcpListener::bind("127.0.0.1:0").expect("bind upstream"))
}

/// [`spawn_upstream`] with a small receive buffer on its connections, so that what the gateway
/// has written but the upstream has not read yet stays small. A slow reader behind the kernel's
/// default (auto-tuned, megabytes) buffers would still be draining them long after the gateway
/// sent its last byte, and the time that takes would count as the upstream's silence.
fn spawn_upstream_with_small_buffers() -> String {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
    socket
        .set_recv_buffer_size(64 * 1024)
        .expect("set SO_RCVBUF");
    let addr: std::net::SocketAddr = "127.0.0.1:0".parse().expect("addr");
    socket.bind(&addr.into()).expect("bind upstream");
    socket.listen(128).expect("listen");
    serve_upstream(socket.into())
}

fn serve_upstream(listener: TcpListener) -> String {
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let _ = serve_one(conn);
            });
        }
    });
    format!("http://{addr}")
}

fn serve_one(conn: TcpStream) -> std::io::Result<()> {
    let mut out = conn.try_clone()?;
    let mut r = BufReader::with_capacity(64 * 1024, conn);
    let mut head = Vec::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line)? == 0 {
            return Ok(());
        }
        if line == "\r\n" {
            break;
        }
        head.push(line.trim_end().to_owned());
    }
    let request_line = head.first().cloned().unwrap_or_default();
    let header = |name: &str| {
        head.iter().skip(1).find_map(|h| {
            let (k, v) = h.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
    };
    let path = request_line
        .split_whitespace()
        .nth(1)
        .unwrap_or("/")
        .to_owned();
    if let Some(n) = path.strip_prefix("/stall-after/") {
        // Promise twice as much as is sent, then go silent.
        let n: usize = n.parse().unwrap_or(0);
        write!(out, "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", 2 * n)?;
        out.write_all(&vec![1u8; n])?;
        out.flush()?;
        std::thread::sleep(Duration::from_secs(120));
        return Ok(());
    }
    if let Some(n) = path.strip_prefix("/download/") {
        let n: u64 = n.parse().unwrap_or(0);
        write!(out, "HTTP/1.1 200 OK\r\nContent-Length: {n}\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n")?;
        let block: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8).collect();
        let mut sent = 0u64;
        let mut stalled = false;
        while sent < n {
            if !stalled && sent >= MIB {
                std::thread::sleep(STALL);
                stalled = true;
            }
            let take = (n - sent).min(block.len() as u64) as usize;
            out.write_all(&block[..take])?;
            sent += take as u64;
        }
        return out.flush();
    }
    if path == "/black-hole" {
        // Never read the body, never answer.
        std::thread::sleep(Duration::from_secs(120));
        return Ok(());
    }
    // `/slow-upload` reads at a crawl: 1 MiB, then a pause, and so on.
    let crawl = path == "/slow-upload";
    if !crawl {
        std::thread::sleep(STALL);
    }
    let mut buf = vec![0u8; 64 * 1024];
    let mut read = 0u64;
    if let Some(len) = header("content-length").and_then(|v| v.parse::<u64>().ok()) {
        while read < len {
            let want = (len - read).min(buf.len() as u64) as usize;
            let got = r.read(&mut buf[..want])?;
            if got == 0 {
                break;
            }
            if crawl && (read + got as u64) / MIB > read / MIB {
                std::thread::sleep(CRAWL_PAUSE);
            }
            read += got as u64;
        }
    } else if header("transfer-encoding")
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
    {
        loop {
            let mut size_line = String::new();
            r.read_line(&mut size_line)?;
            let size = u64::from_str_radix(size_line.trim().split(';').next().unwrap_or("0"), 16)
                .unwrap_or(0);
            if size == 0 {
                let mut trailer = String::new();
                while r.read_line(&mut trailer)? > 2 {
                    trailer.clear();
                }
                break;
            }
            let mut left = size;
            while left > 0 {
                let want = left.min(buf.len() as u64) as usize;
                let got = r.read(&mut buf[..want])?;
                if got == 0 {
                    return Ok(());
                }
                left -= got as u64;
                read += got as u64;
            }
            let mut crlf = [0u8; 2];
            r.read_exact(&mut crlf)?;
        }
    }
    let body = read.to_string();
    write!(
        out,
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    out.flush()
}

/// The gateway, warmed up by one small download and one small upload, and its RSS after that.
async fn gateway() -> (Gateway, u64) {
    let upstream = spawn_upstream();
    let gw = Gateway::serve().upstream(&upstream).spawn();
    let small = client().get(gw.url("/download/4096")).send().await.unwrap();
    assert_eq!(small.bytes().await.unwrap().len(), 4096);
    let res = client()
        .post(gw.url("/upload"))
        .body(vec![7u8; 4096])
        .send()
        .await
        .unwrap();
    assert_eq!(res.text().await.unwrap(), "4096");
    let base = gw.rss_kib();
    (gw, base)
}

#[tokio::test]
async fn a_large_download_streams_with_flat_memory() {
    let (gw, base) = gateway().await;
    let res = client()
        .get(gw.url(&format!("/download/{SIZE}")))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["content-length"], SIZE.to_string());
    let mut stream = res.bytes_stream();
    let mut got = 0u64;
    let mut peak = base;
    let mut next_sample = 0u64;
    let mut paused = false;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.expect("body chunk");
        for (i, b) in chunk.iter().enumerate() {
            let pos = got + i as u64;
            if pos.is_multiple_of(4099) {
                assert_eq!(*b, ((pos % (64 * 1024)) % 251) as u8, "byte {pos}");
            }
        }
        got += chunk.len() as u64;
        if !paused && got >= 8 * MIB {
            // Stop reading: a proxy without back-pressure would now read the rest into memory.
            tokio::time::sleep(STALL).await;
            paused = true;
        }
        if got >= next_sample {
            peak = peak.max(gw.rss_kib());
            next_sample += 8 * MIB;
        }
    }
    peak = peak.max(gw.rss_kib());
    assert_eq!(got, SIZE);
    let growth = peak.saturating_sub(base);
    println!(
        "download of {} MiB: RSS {base} KiB -> peak {peak} KiB (+{growth} KiB)",
        SIZE / MIB
    );
    assert!(
        growth < MAX_GROWTH_KIB,
        "RSS grew by {growth} KiB while {} MiB passed",
        SIZE / MIB
    );
}

/// A request body made on the fly: `SIZE` bytes in 64 KiB chunks, never held whole.
fn generated_body() -> reqwest::Body {
    let block = bytes::Bytes::from(vec![0x5au8; 64 * 1024]);
    let chunks = (SIZE / block.len() as u64) as usize;
    reqwest::Body::wrap_stream(futures_util::stream::iter(
        (0..chunks).map(move |_| Ok::<_, std::io::Error>(block.clone())),
    ))
}

async fn upload(gw: &Gateway, base: u64, sized: bool) -> u64 {
    let mut req = client().post(gw.url("/upload")).body(generated_body());
    if sized {
        req = req.header("content-length", SIZE.to_string());
    }
    let send = tokio::spawn(req.send());
    let mut peak = base;
    while !send.is_finished() {
        peak = peak.max(gw.rss_kib());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let res = send.await.unwrap().unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(
        res.text().await.unwrap(),
        SIZE.to_string(),
        "the upstream read every byte"
    );
    peak.max(gw.rss_kib()).saturating_sub(base)
}

#[tokio::test]
async fn a_large_upload_streams_with_flat_memory() {
    let (gw, base) = gateway().await;
    let growth = upload(&gw, base, true).await;
    println!(
        "sized upload of {} MiB: RSS {base} KiB, +{growth} KiB",
        SIZE / MIB
    );
    assert!(
        growth < MAX_GROWTH_KIB,
        "RSS grew by {growth} KiB while {} MiB went up",
        SIZE / MIB
    );
    let growth = upload(&gw, base, false).await;
    println!(
        "chunked upload of {} MiB: RSS {base} KiB, +{growth} KiB",
        SIZE / MIB
    );
    assert!(
        growth < MAX_GROWTH_KIB,
        "RSS grew by {growth} KiB while a chunked {} MiB went up",
        SIZE / MIB
    );
}

/// A body of `len` bytes made on the fly, with a Content-Length.
async fn post_generated(gw: &Gateway, path: &str, len: u64) -> reqwest::Response {
    let block = bytes::Bytes::from(vec![0x33u8; 64 * 1024]);
    let chunks = (len / block.len() as u64) as usize;
    let body = reqwest::Body::wrap_stream(futures_util::stream::iter(
        (0..chunks).map(move |_| Ok::<_, std::io::Error>(block.clone())),
    ));
    client()
        .post(gw.url(path))
        .header("content-length", len.to_string())
        .body(body)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn the_read_timeout_does_not_cut_off_a_slow_upload_that_keeps_moving() {
    let upstream = spawn_upstream_with_small_buffers();
    let gw = Gateway::serve()
        .upstream(&upstream)
        .args(["--read-timeout", "2s"])
        .spawn();
    // The upstream takes at least 24 x 150 ms = 3.6 s to read this, more than the timeout, but
    // bytes keep moving and it answers as soon as it has read them.
    let res = post_generated(&gw, "/slow-upload", 24 * MIB).await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.text().await.unwrap(), (24 * MIB).to_string());
}

#[tokio::test]
async fn an_upstream_that_stops_reading_an_upload_is_a_504_not_a_hang() {
    let upstream = spawn_upstream();
    let gw = Gateway::serve()
        .upstream(&upstream)
        .args(["--read-timeout", "1s"])
        .spawn();
    let res = post_generated(&gw, "/black-hole", 64 * MIB).await;
    assert_eq!(res.status(), 504);
    assert_eq!(res.headers()["content-type"], "application/problem+json");
}

#[tokio::test]
async fn an_upstream_that_goes_silent_mid_answer_is_cut_off_not_waited_for() {
    let upstream = spawn_upstream();
    let gw = Gateway::serve()
        .upstream(&upstream)
        .args(["--read-timeout", "1s"])
        .spawn();
    let res = client()
        .get(gw.url("/stall-after/100000"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200, "the head was already on its way");
    let err = res.bytes().await.expect_err("the answer is truncated");
    assert!(
        !err.is_timeout(),
        "the gateway held the client until the client gave up: {err}"
    );
}
