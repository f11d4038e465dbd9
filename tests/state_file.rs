//! `store.state_file` against the real binary: the memory store's buckets written on SIGTERM
//! and read back by the next process, time counted; files that cannot be used are reported and
//! the gateway starts anyway.

mod common;

use common::{client, upstream, Gateway, Launch, PATIENCE};
use std::path::Path;
use std::time::{Duration, Instant};

const ROTATE: &str = "/api/agent/rotate-key";

fn launch(up: &str, state: &Path) -> Launch {
    Launch::serve().upstream(up).admin().log("info").env(
        "FLEET_LIMITER_STORE_STATE_FILE",
        state.to_str().expect("utf-8"),
    )
}

/// POST the key-rotation route: its status and `Retry-After`.
async fn rotate(gw: &Gateway) -> (u16, Option<u64>) {
    let res = client()
        .post(gw.url(ROTATE))
        .header("X-Agent-ID", "agent-7")
        .send()
        .await
        .expect("POST rotate-key");
    let retry = res
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    (res.status().as_u16(), retry)
}

async fn stop(mut gw: Gateway) -> String {
    gw.signal("TERM");
    let status = gw.wait_exit().await;
    assert!(status.success(), "{status}: {}", gw.stderr());
    gw.stderr()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_refused_before_a_restart_is_still_refused_after_it() {
    let up = upstream().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("buckets.state");

    let first = launch(&up.uri(), &state).spawn();
    assert!(
        first.stderr().contains("does not exist yet"),
        "{}",
        first.stderr()
    );
    for _ in 0..3 {
        assert_eq!(rotate(&first).await.0, 200);
    }
    let (status, wait) = rotate(&first).await;
    assert_eq!(status, 429);
    let wait = wait.expect("Retry-After");
    let refused_at = Instant::now();
    assert!(wait > 60, "key rotation's wait is minutes: {wait}");
    let log = stop(first).await;
    assert!(log.contains("buckets written"), "{log}");
    assert!(state.exists());
    let bytes = std::fs::read(&state).expect("state file");
    assert!(
        !bytes.windows(7).any(|w| w == b"agent-7"),
        "no raw agent id in the file"
    );

    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let second = launch(&up.uri(), &state).spawn();
    assert!(
        second.stderr().contains("buckets restored"),
        "{}",
        second.stderr()
    );
    let (status, again) = rotate(&second).await;
    assert_eq!(status, 429, "the refusal outlived the restart");
    let again = again.expect("Retry-After");
    let left = wait as f64 - refused_at.elapsed().as_secs_f64();
    assert!(
        (again as f64 - left).abs() <= 1.5,
        "Retry-After {again} s after a restart, {left:.1} s were left of {wait} s"
    );
    let log = stop(second).await;
    assert!(log.contains("buckets written"), "{log}");

    // The control: the same restart without the file hands the budget back.
    let forgetful = Launch::serve().upstream(&up.uri()).spawn();
    assert_eq!(rotate(&forgetful).await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agents_a_ceiling_knew_are_known_after_a_restart() {
    let up = upstream().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("buckets.state");
    let heartbeat = |gw: &Gateway, agent: String| {
        client()
            .post(gw.url("/api/agent/heartbeat"))
            .header("X-Agent-ID", agent)
            .send()
    };
    let first = launch(&up.uri(), &state).spawn();
    // Twelve agents of one site, each seen twice: known, and protected.
    for round in 0..2 {
        for i in 0..12 {
            let res = heartbeat(&first, format!("site-agent-{i}"))
                .await
                .expect("heartbeat");
            assert_eq!(res.status(), 200, "round {round}, agent {i}");
        }
    }
    let held = r#"fleet_limiter_known_agents{segment="protected"}"#;
    assert_eq!(first.metric(held).await, Some(12.0));
    let log = stop(first).await;
    assert!(log.contains("known_agents=12"), "{log}");
    let bytes = std::fs::read(&state).expect("state file");
    assert!(
        !bytes.windows(10).any(|w| w == b"site-agent"),
        "no raw agent id in the file"
    );

    let second = launch(&up.uri(), &state).spawn();
    assert_eq!(
        second.metric(held).await,
        Some(12.0),
        "known before any request: {}",
        second.stderr()
    );
    stop(second).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_file_that_cannot_be_used_is_reported_and_the_gateway_starts() {
    let up = upstream().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("buckets.state");

    // A real file, then cut short: the checksum says so.
    let gw = launch(&up.uri(), &state).spawn();
    for _ in 0..4 {
        rotate(&gw).await;
    }
    stop(gw).await;
    let good = std::fs::read(&state).expect("state file");
    let cases: [(&str, Vec<u8>, &str); 4] = [
        (
            "truncated",
            good[..good.len() - 5].to_vec(),
            "truncated or corrupt",
        ),
        (
            "garbage",
            b"not a state file at all".to_vec(),
            "not a fleet-limiter state file",
        ),
        ("empty", Vec::new(), "not a fleet-limiter state file"),
        ("huge", vec![0u8; 64 << 20], "more than a store of"),
    ];
    for (what, bytes, why) in cases {
        std::fs::write(&state, &bytes).expect("write");
        let started = Instant::now();
        let gw = launch(&up.uri(), &state).spawn();
        assert!(started.elapsed() < PATIENCE);
        let log = gw.stderr();
        assert!(
            log.contains("is not used") && log.contains(why),
            "{what}: {log}"
        );
        assert_eq!(rotate(&gw).await.0, 200, "{what}: a fresh budget, served");
        stop(gw).await;
    }

    // A directory where the file should be: it cannot be written; the stop says so and exits 0.
    let not_a_file = dir.path().join("a-directory");
    std::fs::create_dir(&not_a_file).expect("mkdir");
    let gw = launch(&up.uri(), &not_a_file).spawn();
    let log = stop(gw).await;
    assert!(log.contains("cannot write"), "{log}");
}

#[test]
fn a_state_file_with_the_redis_store_is_a_configuration_error() {
    let out = Launch::serve()
        .upstream("http://127.0.0.1:9")
        .env("FLEET_LIMITER_STORE_URL", "redis://127.0.0.1:6379")
        .env("FLEET_LIMITER_STORE_STATE_FILE", "/tmp/fleet-limiter.state")
        .run(PATIENCE);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("store.state_file") && out.stderr.contains("remove store.state_file"),
        "{}",
        out.stderr
    );
}
