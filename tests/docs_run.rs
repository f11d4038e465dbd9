//! The docs run as written. Every ```toml snippet of README.md and docs/ (docs/identity/
//! included) goes through the real binary's `fleet-limiter check`, on its own, from the
//! repository root: it must pass (exit 0), or, when its fence says ```toml refused, be refused
//! as a configuration error (exit 2). Every `fleet-limiter` command the docs show that runs
//! without network or root (check, simulate, explain, override, reset, top, routes) runs
//! against the binary, the levers against a gateway this test starts, its admin address given
//! in `FLEET_LIMITER_ADMIN_URL`. Every `cargo` command the docs name must name a real target.
//! A failure names the file and line of each snippet or command at fault.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_fleet-limiter");

/// The marker of a snippet that shows a refusal: ```toml refused.
const REFUSED: &str = "refused";

/// The commands of `fleet-limiter` the docs' commands are run for; the others (`serve`,
/// `replay` of an operator's own logs, `demo-upstream`) listen or need files of their own.
const RUN: &[&str] = &[
    "check", "simulate", "explain", "override", "reset", "top", "routes",
];

/// Scenarios that take most of a minute in a debug build: a command naming one (or none: all
/// of them) runs `--scenario fleet` instead, its options otherwise as written, and the scenario
/// name is checked against the ones `simulate --help` lists.
const LONG_SCENARIOS: &[&str] = &["all", "herd", "table-flood", "nat-rollout"];

struct Fence {
    file: String,
    /// The line of the opening fence (1-based).
    line: usize,
    info: String,
    /// Each line of the body with its own line number.
    body: Vec<(usize, String)>,
}

/// README.md, docs/*.md and docs/identity/*.md, as paths from the repository root.
fn documents() -> Vec<(String, String)> {
    let root = common::manifest_dir();
    let mut paths = vec![PathBuf::from("README.md")];
    for dir in ["docs", "docs/identity"] {
        let mut md: Vec<PathBuf> = std::fs::read_dir(root.join(dir))
            .unwrap_or_else(|e| panic!("{dir}: {e}"))
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "md"))
            .map(|p| p.strip_prefix(&root).map(Path::to_path_buf).unwrap_or(p))
            .collect();
        md.sort();
        paths.extend(md);
    }
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(root.join(&p))
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p.display().to_string(), text)
        })
        .collect()
}

fn fences(file: &str, text: &str) -> Vec<Fence> {
    let mut out = Vec::new();
    let mut open: Option<Fence> = None;
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let trimmed = line.trim_start();
        match open.take() {
            None => {
                if let Some(info) = trimmed.strip_prefix("```") {
                    open = Some(Fence {
                        file: file.to_owned(),
                        line: n,
                        info: info.trim().to_owned(),
                        body: Vec::new(),
                    });
                }
            }
            Some(mut f) => {
                if trimmed.starts_with("```") {
                    out.push(f);
                } else {
                    f.body.push((n, line.to_owned()));
                    open = Some(f);
                }
            }
        }
    }
    assert!(open.is_none(), "{file}: a fence is never closed");
    out
}

fn all_fences() -> Vec<Fence> {
    documents()
        .iter()
        .flat_map(|(file, text)| fences(file, text))
        .collect()
}

/// A command with no `FLEET_LIMITER_*` variable of the environment the tests run in.
fn bare(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new(program);
    for (k, _) in std::env::vars() {
        if k.starts_with("FLEET_LIMITER_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("FLEET_LIMITER_LOG", "warn")
        .stdin(Stdio::null())
        .current_dir(common::manifest_dir());
    cmd
}

#[test]
fn every_toml_snippet_passes_check_or_is_refused_as_its_fence_says() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut failures = Vec::new();
    let mut counted = (0, 0);
    for f in all_fences() {
        let mut words = f.info.split_whitespace();
        if words.next() != Some("toml") {
            continue;
        }
        let refused = match words.next() {
            None => false,
            Some(REFUSED) => true,
            Some(other) => {
                failures.push(format!(
                    "{}:{}: ```toml {other}: the only marker is `{REFUSED}`",
                    f.file, f.line
                ));
                continue;
            }
        };
        let toml: String = f.body.iter().map(|(_, l)| format!("{l}\n")).collect();
        let path = dir
            .path()
            .join(format!("{}-{}.toml", f.file.replace('/', "_"), f.line));
        std::fs::write(&path, &toml).expect("write the snippet");
        let out = bare(BIN)
            .args(["check", "--config"])
            .arg(&path)
            .output()
            .expect("run check");
        let code = out.status.code();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let tail: String = said
            .lines()
            .filter(|l| !l.trim().is_empty())
            .rev()
            .take(12)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n    ");
        if refused {
            counted.1 += 1;
            if code != Some(2) || !said.contains("configuration error") {
                failures.push(format!(
                    "{}:{}: marked `{REFUSED}`, and check exited {code:?} instead of 2 with a configuration error:\n    {tail}",
                    f.file, f.line
                ));
            }
        } else {
            counted.0 += 1;
            if code != Some(0) {
                failures.push(format!(
                    "{}:{}: check exited {code:?} (mark a snippet that shows a refusal ```toml {REFUSED}):\n    {tail}",
                    f.file, f.line
                ));
            }
        }
    }
    assert!(
        counted.0 >= 30 && counted.1 >= 1,
        "too few snippets found: {counted:?}"
    );
    assert!(failures.is_empty(), "\n{}", failures.join("\n\n"));
    eprintln!(
        "{} snippets pass check, {} refused as marked",
        counted.0, counted.1
    );
}

/// One command as the docs show it.
struct Shown {
    file: String,
    line: usize,
    text: String,
}

/// The `fleet-limiter` commands of the docs' shell fences (```sh, ```bash, and `$ ` lines of
/// bare fences), continuation lines joined, in the order they appear.
fn shown_commands() -> Vec<Shown> {
    let mut out = Vec::new();
    for f in all_fences() {
        let info = f.info.split_whitespace().next().unwrap_or("");
        let shell = matches!(info, "sh" | "bash" | "shell" | "console");
        if !(shell || info.is_empty()) {
            continue;
        }
        let mut pending: Option<Shown> = None;
        for (n, line) in &f.body {
            if let Some(mut p) = pending.take() {
                let more = line.trim();
                p.text = format!("{} {}", p.text, more.trim_end_matches('\\').trim());
                if more.ends_with('\\') {
                    pending = Some(p);
                } else {
                    out.push(p);
                }
                continue;
            }
            let t = line.trim();
            let t = match t.strip_prefix("$ ") {
                Some(t) => t,
                None if shell => t,
                None => continue,
            };
            let Some(rest) = t.strip_prefix("fleet-limiter ") else {
                continue;
            };
            if !RUN.contains(&rest.split_whitespace().next().unwrap_or("")) {
                continue;
            }
            let s = Shown {
                file: f.file.clone(),
                line: *n,
                text: t.trim_end_matches('\\').trim().to_owned(),
            };
            if t.ends_with('\\') {
                pending = Some(s);
            } else {
                out.push(s);
            }
        }
    }
    out
}

/// The scenarios `simulate --help` lists.
fn known_scenarios() -> String {
    let out = bare(BIN)
        .args(["simulate", "--help"])
        .output()
        .expect("simulate --help");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The command as run: `top` printed once, a long scenario narrowed to `fleet`. `Err` when a
/// scenario named is not one `simulate` knows.
fn as_run(text: &str, scenarios: &str) -> Result<String, String> {
    let mut words: Vec<String> = text.split(' ').map(str::to_owned).collect();
    match words.get(1).map(String::as_str) {
        Some("top") if !words.iter().any(|w| w == "--once") => {
            words.insert(2, "--once".to_owned());
        }
        Some("simulate") => {
            let at = words.iter().position(|w| w == "--scenario");
            let named = at.and_then(|i| words.get(i + 1)).cloned();
            let name = named.clone().unwrap_or_else(|| "all".to_owned());
            if !name.starts_with('$') && !scenarios.contains(&name) {
                return Err(format!(
                    "`{name}` is not a scenario `simulate --help` lists"
                ));
            }
            if LONG_SCENARIOS.contains(&name.as_str()) {
                match at {
                    Some(i) => words[i + 1] = "fleet".to_owned(),
                    None => words
                        .splice(2..2, ["--scenario".to_owned(), "fleet".to_owned()])
                        .for_each(drop),
                }
            }
        }
        _ => {}
    }
    Ok(words.join(" "))
}

/// The limiters the levers of the docs name beyond the built-ins: docs/configuration.md's
/// Lockout example.
const LEVERS_CONFIG: &str = r#"
[limiters.login-account]
limit = 5
window = "10m"
key = "body:email+ip"
routes = ["POST /auth/login"]
count = "failed"
lockout = "10m"

[limiters.login-account-ceiling]
limit = 50
window = "1h"
key = "body:email"
group = "login-account-ceiling"
routes = ["POST /auth/login"]
count = "failed"

[limiters.login-ip]
limit = 100
window = "1h"
key = "ip"
group = "login-ip"
routes = ["POST /auth/login"]
"#;

#[test]
fn the_fleet_limiter_commands_the_docs_show_run() {
    let shown = shown_commands();
    assert!(shown.len() >= 15, "too few commands found: {}", shown.len());
    // The levers' instance: the built-in calibration and the Lockout section's limiters
    // (docs/configuration.md), which the docs' levers name, a free port for each listener.
    let gw = common::Launch::serve()
        .upstream("http://127.0.0.1:9")
        .config_toml(LEVERS_CONFIG)
        .admin()
        .spawn();
    let admin = gw.admin("");
    let admin = admin.trim_end_matches('/');
    // `fleet-limiter` on PATH is this build's; `docs/` writable (plots land in docs/img/) with
    // the repository's examples and rate-limit YAML beside it.
    let work = tempfile::tempdir().expect("temp dir");
    let bin = work.path().join("bin");
    std::fs::create_dir_all(&bin).expect("bin");
    std::os::unix::fs::symlink(BIN, bin.join("fleet-limiter")).expect("symlink");
    let docs = work.path().join("docs");
    std::fs::create_dir_all(docs.join("img")).expect("docs/img");
    for d in ["examples", "envoy-rls"] {
        std::os::unix::fs::symlink(common::manifest_dir().join("docs").join(d), docs.join(d))
            .expect("symlink");
    }
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let scenarios = known_scenarios();
    let mut failures = Vec::new();
    let mut ran = 0;
    for s in &shown {
        let line = match as_run(&s.text, &scenarios) {
            Ok(l) => l,
            Err(e) => {
                failures.push(format!("{}:{}: {}: {e}", s.file, s.line, s.text));
                continue;
            }
        };
        ran += 1;
        let out = bare("bash")
            .args(["-o", "pipefail", "-c", &line])
            .current_dir(work.path())
            .env("PATH", &path)
            .env("FLEET_LIMITER_ADMIN_URL", admin)
            .env("s", "7")
            .output()
            .expect("bash");
        let code = out.status.code();
        // `check` exits 1 when the calibration it reports on is unsafe: the report is its answer.
        let ok = code == Some(0) || (code == Some(1) && s.text.starts_with("fleet-limiter check"));
        if !ok {
            failures.push(format!(
                "{}:{}: `{line}` exited {code:?}:\n    {}{}",
                s.file,
                s.line,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "\n{}\n\ngateway log:\n{}",
        failures.join("\n\n"),
        gw.stderr()
    );
    eprintln!("{ran} commands of the docs ran");
}

#[test]
fn every_cargo_command_of_the_docs_names_a_real_target() {
    let root = common::manifest_dir();
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
    let mut failures = Vec::new();
    let mut counted = 0;
    for (file, text) in documents() {
        for (i, line) in text.lines().enumerate() {
            let mut rest = line;
            while let Some(at) = rest.find("cargo ") {
                let words: Vec<&str> = rest[at..]
                    .split(|c: char| c.is_whitespace() || c == '`' || c == ')' || c == ',')
                    .filter(|w| !w.is_empty())
                    .collect();
                rest = &rest[at + "cargo ".len()..];
                if let Some(why) = unreal_target(&root, &manifest, &words) {
                    failures.push(format!("{file}:{}: `{}`: {why}", i + 1, words.join(" ")));
                }
                counted += 1;
            }
        }
    }
    assert!(counted >= 20, "too few cargo commands found: {counted}");
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
    eprintln!("{counted} cargo commands of the docs name real targets");
}

/// Why `cargo …` (its words) names no target of this repository, if it does not.
fn unreal_target(root: &Path, manifest: &str, words: &[&str]) -> Option<String> {
    let after = |flag: &str| {
        words
            .iter()
            .position(|w| *w == flag)
            .and_then(|i| words.get(i + 1))
            .copied()
    };
    let file = |dir: &str, name: &str| {
        root.join(dir).join(format!("{name}.rs")).is_file()
            || root.join(dir).join(name).join("main.rs").is_file()
    };
    if let Some(t) = after("--test") {
        if !file("tests", t) && !declared(manifest, "test", t) {
            return Some(format!("no test target `{t}` (tests/{t}.rs)"));
        }
    }
    if let Some(e) = after("--example") {
        if !file("examples", e) {
            return Some(format!("no example `{e}` (examples/{e}.rs)"));
        }
    }
    if let Some(b) = after("--bench") {
        if !file("benches", b) && !declared(manifest, "bench", b) {
            return Some(format!("no bench target `{b}` (benches/{b}.rs)"));
        }
    }
    if let Some(b) = after("--bin") {
        if b != "fleet-limiter" && !declared(manifest, "bin", b) {
            return Some(format!("no binary `{b}`"));
        }
    }
    if let Some(p) = after("--profile") {
        if !manifest.contains(&format!("[profile.{p}]")) {
            return Some(format!("no profile `{p}` in Cargo.toml"));
        }
    }
    if let Some(f) = after("--features") {
        for f in f.split(',') {
            if !manifest.contains(&format!("\n{f} = ")) {
                return Some(format!("no feature `{f}` in Cargo.toml"));
            }
        }
    }
    if words.contains(&"--lib") {
        if let Some(filter) = words
            .iter()
            .skip_while(|w| **w != "--lib")
            .nth(1)
            .filter(|w| !w.starts_with('-'))
        {
            if !lib_test_matches(root, filter) {
                return Some(format!("no library test's path holds `{filter}`"));
            }
        }
    }
    None
}

/// Whether Cargo.toml declares a `[[kind]]` target named `name`.
fn declared(manifest: &str, kind: &str, name: &str) -> bool {
    manifest.split(&format!("[[{kind}]]")).skip(1).any(|t| {
        t.lines()
            .take_while(|l| !l.starts_with('['))
            .any(|l| l.replace(' ', "") == format!("name=\"{name}\""))
    })
}

/// Whether some library test's path (`module::…::name`) holds `filter`: a `#[test]` function
/// whose name, or whose file's module path, holds it.
fn lib_test_matches(root: &Path, filter: &str) -> bool {
    let mut stack = vec![root.join("src")];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            let Ok(text) = std::fs::read_to_string(&p) else {
                continue;
            };
            // A module declared here (its file may live elsewhere, by `#[path]`).
            if text.lines().any(|l| {
                l.trim()
                    .strip_prefix("mod ")
                    .is_some_and(|m| m.trim_end_matches([';', '{', ' ']).contains(filter))
            }) {
                return true;
            }
            if !text.contains("#[test]") {
                continue;
            }
            let module = p
                .strip_prefix(root.join("src"))
                .map(|m| m.display().to_string());
            if module.is_ok_and(|m| m.contains(filter)) {
                return true;
            }
            if text
                .lines()
                .filter_map(|l| l.trim().strip_prefix("fn "))
                .any(|f| f.split('(').next().is_some_and(|n| n.contains(filter)))
            {
                return true;
            }
        }
    }
    false
}
