//! A client's malformed request is the client's fault, not the gateway's: against the real
//! binary, requests its HTTP parser refuses (a request line that is not one, a header without a
//! colon, a bad method, a URI with a space, a broken chunk) are answered 400 and logged at
//! DEBUG, and the log holds no ERROR line: an operator's ERROR means the gateway or its
//! upstream failed.

mod common;

use common::Launch;

#[tokio::test]
async fn malformed_requests_are_answered_400_and_logged_below_error() {
    let upstream = common::upstream().await;
    let gw = Launch::serve()
        .upstream(&upstream.uri())
        .log("debug")
        .spawn();
    let addr = gw
        .url("")
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .expect("address");
    for request in [
        &b"GARBAGE\r\n\r\n"[..],
        b"GET / HTTP/1.1\r\nhost: x\r\nbad header\r\n\r\n",
        b"G\x01T / HTTP/1.1\r\nhost: x\r\n\r\n",
        b"GET /a b HTTP/1.1\r\nhost: x\r\n\r\n",
        b"GET / HTTP/9.9\r\nhost: x\r\n\r\n",
        b"POST /api/x HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nab",
    ] {
        let r = common::raw_request(addr, request);
        assert_eq!(r.status, 400, "{:?}", String::from_utf8_lossy(request));
    }
    // The gateway still serves.
    let ok = common::client()
        .get(gw.url("/api/tasks"))
        .send()
        .await
        .expect("served");
    assert_eq!(ok.status(), 200);
    let log = gw.stderr();
    let errors: Vec<&str> = log.lines().filter(|l| l.contains(" ERROR ")).collect();
    assert!(errors.is_empty(), "{errors:#?}");
    assert!(
        log.contains("a client's request could not be served"),
        "said at DEBUG: {log}"
    );
}
