//! `replay`'s peak memory through the real binary, read by GNU time, whatever a log's timestamps
//! do: a million identical lines (gzip), 250 000 distinct lines in one second, and a log
//! spanning two centuries.

mod common;

#[path = "support/replay_logs.rs"]
mod replay_logs;

use flate2::write::GzEncoder;
use replay_logs::*;
use serde_json::Value;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Output};

/// The peak resident memory of `replay ARGS LOGS`, in KiB, read by GNU time; `None` (after
/// saying why) when GNU time is missing, a failure when `CI` is set.
fn replay_peak_kib(args: &[&str], logs: &[&Path]) -> Option<(Output, u64)> {
    let time = Path::new("/usr/bin/time");
    let works = time.exists()
        && Command::new(time)
            .args(["-v", "true"])
            .output()
            .is_ok_and(|o| o.status.success());
    if !works {
        common::unavailable(
            "GNU time (/usr/bin/time -v) is needed to read the peak memory of a replay",
        );
        return None;
    }
    let mut c = clean(time);
    c.arg("-v")
        .arg(env!("CARGO_BIN_EXE_fleet-limiter"))
        .arg("replay")
        .args(args)
        .args(logs);
    let out = c.output().expect("run fleet-limiter under GNU time");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let kib = stderr
        .lines()
        .find_map(|l| l.trim().strip_prefix("Maximum resident set size (kbytes):"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no peak memory in GNU time's report:\n{stderr}"));
    Some((out, kib))
}

/// What a replay may hold at its peak, whatever the timestamps do.
/// The reorder buffer's 64 MiB and the rest of the process (about 30 MiB in a debug build).
const REPLAY_PEAK_KIB: u64 = 128 * 1024;

#[test]
fn replay_memory_stays_bounded_whatever_the_timestamps_do() {
    let dir = tempfile::tempdir().unwrap();
    let fmt = agent_format();
    let args = ["--format", "json", "--log-format", fmt.as_str()];
    let report = |out: &Output| -> Value {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("json report")
    };

    // A million identical lines, gzip: 100 gzip members of 10 000 lines each, one file.
    let same = line(
        0,
        "203.0.113.10",
        "POST /api/agent/heartbeat",
        Some("agent-000"),
    ) + "\n";
    let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(same.repeat(10_000).as_bytes()).unwrap();
    let member = gz.finish().unwrap();
    let identical = dir.path().join("identical.log.gz");
    std::fs::write(&identical, member.repeat(100)).unwrap();
    let Some((out, kib)) = replay_peak_kib(&args, &[&identical]) else {
        return;
    };
    let r = report(&out);
    assert_eq!(r["lines"], 1_000_000, "{r}");
    assert_eq!(r["replayed"], 1_000_000, "{r}");
    assert_eq!(r["late"], 0, "{r}");
    assert_eq!(r["decided_early"], 0, "identical lines are one run: {r}");
    eprintln!("a million identical lines: peak {kib} KiB");
    assert!(
        kib < REPLAY_PEAK_KIB,
        "a million identical lines: peak {kib} KiB"
    );

    // 250 000 distinct requests in the same second: the buffer decides the earliest early.
    let distinct: Vec<String> = (0..250_000)
        .map(|i| {
            line(
                0,
                "203.0.113.10",
                &format!("GET /api/agent/tasks?n={i}"),
                None,
            )
        })
        .collect();
    let distinct = write(dir.path(), "distinct.log", &distinct);
    let (out, kib) = replay_peak_kib(&args, &[&distinct]).expect("GNU time worked above");
    let r = report(&out);
    assert_eq!(r["replayed"], 250_000, "{r}");
    assert!(r["decided_early"].as_u64().unwrap() > 0, "{r}");
    // Said in the summary, as replayed lines, with a window the log's disorder allows.
    let early = r["skipped"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["reason"] == "decided early"))
        .unwrap_or_else(|| panic!("decided early in the summary: {r}"));
    assert_eq!(early["lines"], r["decided_early"], "{r}");
    assert_eq!(early["replayed"], true, "{r}");
    assert!(
        early["fix"]
            .as_str()
            .unwrap()
            .starts_with("--reorder-seconds 10 holds fewer lines"),
        "{r}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("decided early: "),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("250 000 distinct lines in one second: peak {kib} KiB");
    assert!(
        kib < REPLAY_PEAK_KIB,
        "250 000 distinct lines: peak {kib} KiB"
    );

    // Three lines in order across two centuries: the plot's bins widen instead of growing.
    let decades: Vec<String> = [("1991", 0), ("2100", 1), ("2199", 2)]
        .iter()
        .map(|(year, s)| {
            line(
                *s,
                "203.0.113.10",
                "POST /api/agent/heartbeat",
                Some("agent-000"),
            )
            .replace("/2026:", &format!("/{year}:"))
        })
        .collect();
    let decades = write(dir.path(), "decades.log", &decades);
    let (out, kib) = replay_peak_kib(&args, &[&decades]).expect("GNU time worked above");
    let r = report(&out);
    assert_eq!(
        (r["replayed"].as_u64(), r["outliers"].as_u64()),
        (Some(3), Some(0)),
        "{r}"
    );
    assert!(
        r["span_seconds"].as_f64().unwrap() > 200.0 * 365.0 * 86_400.0,
        "{r}"
    );
    eprintln!("two centuries: peak {kib} KiB");
    assert!(kib < REPLAY_PEAK_KIB, "two centuries: peak {kib} KiB");
}
