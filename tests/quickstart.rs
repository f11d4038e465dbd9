//! The README's quick start, run as written: the block between `<!-- quickstart -->` and
//! `<!-- /quickstart -->`, by bash, against the binary this test build made (the `cargo build`
//! line dropped, from a directory whose `target/release/fleet-limiter` is this build's binary,
//! and free ports in the `PORT`, `ADMIN_PORT` and `UPSTREAM_PORT` the block reads, so that the
//! test never meets another listener). It must print `200 200 200 429` and a `429` with
//! `Retry-After`, `RateLimit-Policy` and the problem document the README describes.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

fn quickstart_block() -> String {
    let readme = std::fs::read_to_string(common::manifest_dir().join("README.md")).expect("README");
    let start = readme
        .find("<!-- quickstart -->")
        .expect("README.md has a <!-- quickstart --> block");
    let end = readme[start..]
        .find("<!-- /quickstart -->")
        .map(|i| start + i)
        .expect("the block ends with <!-- /quickstart -->");
    let block = &readme[start..end];
    let body = block
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a ```sh fence inside the block");
    body.to_owned()
}

#[test]
fn the_readme_quick_start_reaches_a_429() {
    let (up, listen, admin) = (
        common::free_port(),
        common::free_port(),
        common::free_port(),
    );
    // The block runs as written but for its build line, from a directory whose
    // target/release/fleet-limiter is this build's binary, with its ports in PORT, ADMIN_PORT
    // and UPSTREAM_PORT.
    let script: String = quickstart_block()
        .lines()
        .filter(|l| !l.starts_with("cargo build"))
        .collect::<Vec<_>>()
        .join("\n");
    for port in ["$PORT", "$ADMIN_PORT", "$UPSTREAM_PORT"] {
        assert!(script.contains(port), "the block reads {port}:\n{script}");
    }
    for fixed in ["127.0.0.1:3000", "127.0.0.1:8080", "127.0.0.1:7391"] {
        assert!(
            !script.contains(fixed),
            "the block fixes {fixed} instead of reading its variable:\n{script}"
        );
    }
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir_all(dir.path().join("target/release")).expect("target/release");
    std::os::unix::fs::symlink(
        PathBuf::from(env!("CARGO_BIN_EXE_fleet-limiter")),
        dir.path().join("target/release/fleet-limiter"),
    )
    .expect("symlink");
    // Whatever happens, nothing the block started outlives the test.
    let wrapped = format!("trap 'kill $(jobs -p) 2>/dev/null' EXIT\n{script}\n");
    let started = Instant::now();
    let out = Command::new("bash")
        .arg("-c")
        .arg(&wrapped)
        .current_dir(dir.path())
        .env("PORT", listen.to_string())
        .env("ADMIN_PORT", admin.to_string())
        .env("UPSTREAM_PORT", up.to_string())
        .env("FLEET_LIMITER_LOG", "warn")
        .output()
        .expect("bash");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        started.elapsed() < Duration::from_secs(120),
        "the block finished"
    );
    assert!(
        out.status.success(),
        "the block failed ({:?}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(
        stdout.contains("200 200 200 429"),
        "the loop's statuses:\n{stdout}\n{stderr}"
    );
    let lower = stdout.to_ascii_lowercase();
    assert!(lower.contains("http/1.1 429"), "{stdout}");
    assert!(lower.contains("retry-after: "), "{stdout}");
    assert!(lower.contains("ratelimit-policy: 3;w=900"), "{stdout}");
    assert!(
        stdout.contains("\"type\":\"urn:fleet-limiter:problem:rate-limited\""),
        "{stdout}"
    );
}

/// `demo-upstream` on its own: every request answered 200 with what it served, a long path cut
/// at 256 bytes in the answer, and an address it cannot use refused with exit status 2.
#[tokio::test]
async fn the_demo_upstream_answers_everything_and_refuses_a_bad_address() {
    let port = common::free_port();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_fleet-limiter"))
        .args(["demo-upstream", "--listen", &format!("127.0.0.1:{port}")])
        .kill_on_drop(true)
        .spawn()
        .expect("demo-upstream starts");
    let base = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let first = loop {
        match common::client()
            .post(format!("{base}/api/agent/heartbeat?x=1"))
            .body("{}")
            .send()
            .await
        {
            Ok(r) => break r,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("demo-upstream never answered: {e}"),
        }
    };
    assert_eq!(first.status(), 200);
    let body: serde_json::Value = first.json().await.expect("json");
    assert_eq!(body["served"], "/api/agent/heartbeat?x=1");
    assert_eq!(body["method"], "POST");
    let long = format!("{base}/{}", "a".repeat(5000));
    let body: serde_json::Value = common::client()
        .get(long)
        .send()
        .await
        .expect("answered")
        .json()
        .await
        .expect("json");
    assert_eq!(body["served"].as_str().map(str::len), Some(256));
    let _ = child.kill().await;
    for bad in ["nowhere", "127.0.0.1:99999", "[::1"] {
        let out = Command::new(env!("CARGO_BIN_EXE_fleet-limiter"))
            .args(["demo-upstream", "--listen", bad])
            .output()
            .expect("runs");
        assert_eq!(out.status.code(), Some(2), "{bad}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("not an address"),
            "{bad}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
