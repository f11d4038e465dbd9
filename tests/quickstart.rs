//! The README's quick start, run as written: the block between `<!-- quickstart -->` and
//! `<!-- /quickstart -->`, by bash, against the binaries this test build made (the `cargo build`
//! line dropped, `target/release/` read as this build's directory, and the three ports moved to
//! free ones so that the test never meets another listener). It must print `200 200 200 429`
//! and a `429` with `Retry-After`.

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
    let gateway = PathBuf::from(env!("CARGO_BIN_EXE_fleet-limiter"));
    let dir = gateway.parent().expect("the build directory");
    let stand_in = dir.join("examples").join("stand_in_upstream");
    assert!(
        stand_in.is_file(),
        "{} is missing: `cargo test` builds it with the other examples (alone: `cargo build --example stand_in_upstream`)",
        stand_in.display()
    );
    let (up, listen, admin) = (
        common::free_port(),
        common::free_port(),
        common::free_port(),
    );
    let script: String = quickstart_block()
        .lines()
        .filter(|l| !l.starts_with("cargo build"))
        .map(|l| {
            l.replace(
                "target/release/examples/stand_in_upstream &",
                &format!("{} 127.0.0.1:{up} &", stand_in.display()),
            )
            .replace(
                "target/release/fleet-limiter",
                &gateway.display().to_string(),
            )
            .replace("127.0.0.1:3000", &format!("127.0.0.1:{up}"))
            .replace("127.0.0.1:8080", &format!("127.0.0.1:{listen}"))
            .replace("127.0.0.1:7391", &format!("127.0.0.1:{admin}"))
        })
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        !script.contains("target/release"),
        "every path of the block is one this test knows how to read:\n{script}"
    );
    // Whatever happens, nothing the block started outlives the test.
    let wrapped = format!("trap 'kill $(jobs -p) 2>/dev/null' EXIT\n{script}\n");
    let started = Instant::now();
    let out = Command::new("bash")
        .arg("-c")
        .arg(&wrapped)
        .env("FLEET_LIMITER_LISTEN", format!("127.0.0.1:{listen}"))
        .env("FLEET_LIMITER_ADMIN_LISTEN", format!("127.0.0.1:{admin}"))
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
}
