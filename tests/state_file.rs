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
}

/// What may stand at the state path or beside it and must be neither harmed nor waited for: a
/// symbolic link (to a file of someone else's), a FIFO, a device, a directory. Each stops the
/// start at once, naming the setting; the file a link points to is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_a_fifo_a_device_or_a_directory_at_the_path_harms_and_hangs_nothing() {
    let up = upstream().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let victim = dir.path().join("victim");
    std::fs::write(&victim, b"someone else's file").expect("victim");
    let link = dir.path().join("linked.state");
    std::os::unix::fs::symlink(&victim, &link).expect("symlink");
    let fifo = dir.path().join("fifo.state");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo");
    assert!(made.success());
    let directory = dir.path().join("a-directory");
    std::fs::create_dir(&directory).expect("mkdir");
    for (path, what) in [
        (link.as_path(), "a symbolic link"),
        (fifo.as_path(), "a FIFO"),
        (Path::new("/dev/zero"), "a device"),
        (directory.as_path(), "a directory"),
    ] {
        let started = Instant::now();
        let out = launch(&up.uri(), path).run(PATIENCE);
        assert!(started.elapsed() < PATIENCE, "{what}: it did not hang");
        assert_ne!(out.code, Some(0), "{what}: {}", out.stderr);
        assert!(
            out.stderr.contains("store.state_file") && out.stderr.contains(what),
            "{what}: {}",
            out.stderr
        );
    }
    assert_eq!(
        std::fs::read(&victim).expect("victim"),
        b"someone else's file",
        "the linked file is untouched"
    );
}

/// The file is written through a temporary file created exclusively under a name no one can
/// guess: a link planted at the name the gateway once used (`<state>.tmp.<pid>`) is never
/// followed, and the file it points to is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_planted_beside_the_file_is_never_written_through() {
    let up = upstream().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("buckets.state");
    let victim = dir.path().join("victim");
    std::fs::write(&victim, b"someone else's file").expect("victim");
    let gw = launch(&up.uri(), &state).spawn();
    rotate(&gw).await;
    let planted = dir.path().join(format!("buckets.state.tmp.{}", gw.pid()));
    std::os::unix::fs::symlink(&victim, &planted).expect("symlink");
    stop(gw).await;
    assert_eq!(
        std::fs::read(&victim).expect("victim"),
        b"someone else's file"
    );
    let state_bytes = std::fs::read(&state).expect("the state file was written");
    assert!(
        state_bytes.starts_with(b"FLSTATE"),
        "a state file of its own"
    );
    // No temporary file is left behind.
    let left: Vec<String> = std::fs::read_dir(dir.path())
        .expect("dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// Two instances on one state file would each write the buckets it alone saw, the last one
/// winning: the second is refused at start, and the first keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_instance_on_the_same_state_file_is_refused() {
    let up = upstream().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("buckets.state");
    let first = launch(&up.uri(), &state).spawn();
    let out = launch(&up.uri(), &state).run(PATIENCE);
    assert_ne!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stderr.contains("another running instance holds it"),
        "{}",
        out.stderr
    );
    assert_eq!(rotate(&first).await.0, 200, "the first keeps serving");
    stop(first).await;
    // Once it stopped, the file is free again.
    let again = launch(&up.uri(), &state).spawn();
    stop(again).await;
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
