//! A client that stops reading its answer holds nothing for long, against the real binary:
//! four clients each take the head of a 4 MiB answer and read no more; within five read
//! timeouts their upstream connections are closed and the places they held (a route's
//! `max_in_flight` per address, admission control's slots) are given back, so a fifth request
//! from the same address is served.

mod common;

use common::Gateway;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const READ_TIMEOUT: Duration = Duration::from_secs(2);
const BIG: usize = 4 * 1024 * 1024;

/// The upstream: `/api/export/big` is 4 MiB written as the socket takes it, anything else
/// `ok`. Counts the connections it has open.
fn spawn_upstream(open: Arc<AtomicUsize>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind upstream");
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let open = open.clone();
            open.fetch_add(1, Ordering::SeqCst);
            std::thread::spawn(move || {
                let _ = serve(conn);
                open.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    format!("http://{addr}")
}

fn serve(conn: TcpStream) -> std::io::Result<()> {
    let mut out = conn.try_clone()?;
    let mut r = BufReader::new(conn);
    loop {
        let mut target = String::new();
        let mut line = String::new();
        loop {
            line.clear();
            if r.read_line(&mut line)? == 0 {
                return Ok(());
            }
            if target.is_empty() {
                target = line
                    .split_whitespace()
                    .nth(1)
                    .unwrap_or_default()
                    .to_owned();
            }
            if line == "\r\n" {
                break;
            }
        }
        if target == "/api/export/big" {
            out.write_all(format!("HTTP/1.1 200 OK\r\nContent-Length: {BIG}\r\n\r\n").as_bytes())?;
            let chunk = vec![b'x'; 64 * 1024];
            for _ in 0..BIG / chunk.len() {
                out.write_all(&chunk)?;
            }
        } else {
            out.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")?;
        }
    }
}

/// A client that asks for the big answer, reads its head and stops reading.
fn stalled_client(addr: SocketAddr) -> TcpStream {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
    socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
    socket.connect(&addr.into()).expect("connect");
    let mut s: TcpStream = socket.into();
    s.write_all(b"GET /api/export/big HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("write");
    let mut head = [0u8; 12];
    s.read_exact(&mut head).expect("the answer's first bytes");
    assert_eq!(&head, b"HTTP/1.1 200");
    s
}

fn small(addr: SocketAddr) -> u16 {
    common::raw_request(
        addr,
        b"GET /api/export/small HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .status
}

/// Four stalled clients of one address, then how long a fifth request waits to be served; the
/// upstream connections left open by then.
fn run(config: &str, refused: u16) -> Duration {
    let open = Arc::new(AtomicUsize::new(0));
    let upstream = spawn_upstream(open.clone());
    let gw = Gateway::serve()
        .upstream(&upstream)
        .config_toml(config)
        .env("FLEET_LIMITER_READ_TIMEOUT", "2s")
        .spawn();
    let stalled: Vec<TcpStream> = (0..4).map(|_| stalled_client(gw.addr)).collect();
    let started = Instant::now();
    assert_eq!(small(gw.addr), refused, "the four places are taken");
    let deadline = started + READ_TIMEOUT * 5;
    let served = loop {
        if small(gw.addr) == 200 {
            break started.elapsed();
        }
        assert!(
            Instant::now() < deadline,
            "still refused after five read timeouts; the log:\n{}",
            gw.stderr()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    // The upstream connections of the stalled answers are closed.
    while open.load(Ordering::SeqCst) > 1 {
        assert!(
            Instant::now() < deadline,
            "{} upstream connections still open",
            open.load(Ordering::SeqCst)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("a fifth request served {served:?} after four answers stopped being read");
    assert!(
        gw.stderr()
            .contains("the client did not take its answer within the read timeout"),
        "said in the log"
    );
    drop(stalled);
    served
}

#[test]
fn unread_answers_give_back_their_in_flight_places() {
    run(
        "[shaping.routes.exports]\nroutes = [\"GET /api/export/**\"]\nmax_in_flight = 4\n",
        429,
    );
}

#[test]
fn unread_answers_give_back_their_admission_slots() {
    run(
        "enabled = false\n[admission]\nmax_in_flight = 4\nqueue = 0\nclient_share_percent = 100\n",
        503,
    );
}
