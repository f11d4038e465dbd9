//! A client refused with 429 keeps its connection: the refused request's small body is read
//! and discarded, so the next request (an agent's next heartbeat) reuses the same socket.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};

mod common;
use common::Launch;
use std::time::Duration;

/// A one-line upstream that answers every request `200 ok` and keeps connections open.
fn upstream() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut conn = conn;
                while read_request(&mut conn).is_some() {
                    if conn
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    port
}

/// Read one request (head and content-length body); None at end of stream.
fn read_request(conn: &mut TcpStream) -> Option<()> {
    let mut reader = BufReader::new(conn.try_clone().ok()?);
    let mut len = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if line == "\r\n" {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().ok()?;
        }
    }
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body).ok()?;
    Some(())
}

/// Read one response; returns its status and whether the server said it will close.
fn read_response(reader: &mut BufReader<TcpStream>) -> Option<(u16, bool)> {
    let mut status_line = String::new();
    if reader.read_line(&mut status_line).ok()? == 0 {
        return None;
    }
    let status = status_line.split_whitespace().nth(1)?.parse().ok()?;
    let (mut len, mut close) = (0usize, false);
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        if line == "\r\n" || line.is_empty() {
            break;
        }
        let lower = line.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            len = v.trim().parse().ok()?;
        }
        if lower.starts_with("connection:") && lower.contains("close") {
            close = true;
        }
    }
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body).ok()?;
    Some((status, close))
}

#[test]
fn refused_post_keeps_the_connection_open() {
    let up = upstream();
    let gw = Launch::serve()
        .upstream(&format!("http://127.0.0.1:{up}"))
        .config_toml("[limiters.agent-device]\nlimit = 1\nwindow = \"1h\"\n")
        .spawn();
    let conn = TcpStream::connect(gw.addr).expect("connect to the gateway");
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut writer = conn.try_clone().unwrap();
    let mut reader = BufReader::new(conn);
    let body = r#"{"status":"healthy","uptime":3600}"#;
    let request = format!(
        "POST /api/agent/heartbeat HTTP/1.1\r\nhost: x\r\nx-agent-id: agent-1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut statuses = Vec::new();
    for _ in 0..3 {
        writer.write_all(request.as_bytes()).unwrap();
        let (status, close) = read_response(&mut reader).expect("the connection was closed");
        assert!(
            !close,
            "the server announced it closes after status {status}"
        );
        statuses.push(status);
    }
    assert_eq!(statuses, [200, 429, 429]);
}
