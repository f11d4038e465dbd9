//! Access logs for the `replay` tests: written line by line at a known time, plain or gzip, and
//! the binary run on them with none of the caller's `FLEET_LIMITER_*` variables.
#![allow(dead_code)]

use flate2::write::GzEncoder;
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// 2026-11-24T12:00:00Z as Unix seconds: second 0 of every generated log.
pub const T0: u64 = 1_795_521_600;

/// Unix seconds as `$time_local` in UTC.
pub fn clf(t: u64) -> String {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    // Days to a civil date (Howard Hinnant's algorithm).
    let z = (t / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let s = t % 86_400;
    format!(
        "{d:02}/{}/{y}:{:02}:{:02}:{:02} +0000",
        MONTHS[(m - 1) as usize],
        s / 3_600,
        s / 60 % 60,
        s % 60
    )
}

/// The format of the agent logs: `combined` plus the forwarding and agent headers.
pub fn agent_format() -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/replay/agent.format");
    std::fs::read_to_string(p)
        .expect("the fixture format")
        .trim_end()
        .to_owned()
}

/// One line of [`agent_format`], `at` seconds after [`T0`].
pub fn line(at: u64, ip: &str, req: &str, agent: Option<&str>) -> String {
    format!(
        "{ip} - - [{}] \"{req} HTTP/1.1\" 200 2 \"-\" \"fleet-agent\" \"-\" \"{}\"",
        clf(T0 + at),
        agent.unwrap_or("-")
    )
}

pub fn write(dir: &Path, name: &str, lines: &[String]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, lines.join("\n") + "\n").expect("write log");
    p
}

pub fn write_gz(dir: &Path, name: &str, lines: &[String]) -> PathBuf {
    let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all((lines.join("\n") + "\n").as_bytes())
        .expect("gzip");
    let p = dir.join(name);
    std::fs::write(&p, gz.finish().expect("gzip")).expect("write log");
    p
}

/// `program` run from the crate root without the caller's `FLEET_LIMITER_*` variables.
pub fn clean(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new(program);
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    for (k, _) in std::env::vars() {
        if k.starts_with("FLEET_LIMITER_") {
            c.env_remove(k);
        }
    }
    c
}

/// The binary, run [`clean`].
pub fn command() -> Command {
    clean(env!("CARGO_BIN_EXE_fleet-limiter"))
}

/// `fleet-limiter replay ARGS LOGS`.
pub fn replay(args: &[&str], logs: &[&Path]) -> Output {
    command()
        .arg("replay")
        .args(args)
        .args(logs)
        .output()
        .expect("run fleet-limiter")
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The JSON report on stdout.
pub fn report(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}\n{}", String::from_utf8_lossy(&o.stdout), stderr(o)))
}
