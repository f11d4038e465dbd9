//! The gateway end to end: the real binary, over real HTTP, in front of a `wiremock` upstream.

mod common;

use common::{client, received, upstream, Gateway, Launch};
use std::time::Duration;

#[tokio::test]
async fn forwards_an_allowed_request_and_reports_its_limit() {
    let up = upstream().await;
    let gw = Gateway::serve().upstream(&up.uri()).spawn();
    let res = client()
        .get(gw.url("/api/agent/heartbeat"))
        .header("X-Agent-ID", "agent-1")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(
        res.headers()["ratelimit-policy"],
        "\"agent-device\";q=30;w=60"
    );
    assert_eq!(res.headers()["ratelimit"], "\"agent-device\";r=29;t=2");
    assert_eq!(res.headers()["x-ratelimit-limit"], "30");
    assert_eq!(res.headers()["x-ratelimit-remaining"], "29");
    assert_eq!(res.text().await.unwrap(), "ok");
    assert_eq!(received(&up).await, 1);
}

#[test]
fn a_bad_config_file_stops_start_up_with_exit_code_2() {
    let out = Launch::serve()
        .upstream("http://127.0.0.1:9")
        .config_toml("[limiters.agent-device]\nlimit = 0\n")
        .run(Duration::from_secs(30));
    assert_eq!(out.code, Some(2), "stderr: {}", out.stderr);
    assert!(
        out.stderr.contains("fleet-limiter-test-"),
        "names the file: {}",
        out.stderr
    );
    assert!(
        out.stderr.contains("limiters.agent-device.limit"),
        "names the field: {}",
        out.stderr
    );
}
