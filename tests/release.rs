//! `scripts/release.sh`: a dry run packs this build's binary with its licences and docs into a
//! reproducible archive whose checksum file verifies, and the script refuses a version that
//! Cargo.toml or CHANGELOG.md does not name.

mod common;

use std::path::Path;
use std::process::{Command, Output};

fn release(tree: &Path, args: &[&str], out: &Path) -> Output {
    Command::new("bash")
        .arg(tree.join("scripts/release.sh"))
        .args(args)
        .current_dir(tree)
        .env("OUT", out)
        .env(
            "FLEET_LIMITER_RELEASE_BIN",
            env!("CARGO_BIN_EXE_fleet-limiter"),
        )
        .output()
        .expect("bash")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn a_dry_run_packs_a_checksummed_archive_and_wrong_versions_are_refused() {
    let version = env!("CARGO_PKG_VERSION");
    let out = tempfile::tempdir().expect("temp dir");
    // CHANGELOG.md names no release of this version until one is cut: the script says so.
    let changelog =
        std::fs::read_to_string(common::manifest_dir().join("CHANGELOG.md")).expect("CHANGELOG.md");
    let released = changelog
        .lines()
        .any(|l| l.starts_with(&format!("## [{version}] - ")));
    let run = release(&common::manifest_dir(), &["--dry-run", version], out.path());
    if !released {
        assert!(!run.status.success());
        assert!(
            text(&run.stderr).contains(&format!(
                "CHANGELOG.md has no \"## [{version}] - YYYY-MM-DD\" section"
            )),
            "{}",
            text(&run.stderr)
        );
        // The rest of the script, on a copy of the tree whose changelog names the version.
        let copy = tempfile::tempdir().expect("temp dir");
        for f in [
            "Cargo.toml",
            "README.md",
            "LICENSE-MIT",
            "LICENSE-APACHE",
            "scripts/release.sh",
        ] {
            let to = copy.path().join(f);
            std::fs::create_dir_all(to.parent().expect("parent")).expect("mkdir");
            std::fs::copy(common::manifest_dir().join(f), &to).expect("copy");
        }
        for d in ["docs", "deploy"] {
            let status = Command::new("cp")
                .arg("-R")
                .arg(common::manifest_dir().join(d))
                .arg(copy.path())
                .status()
                .expect("cp");
            assert!(status.success());
        }
        std::fs::write(
            copy.path().join("CHANGELOG.md"),
            format!("# Changelog\n\n## [{version}] - 2026-12-01\n\n- A release.\n"),
        )
        .expect("write");
        let git = |args: &[&str]| {
            let s = Command::new("git")
                .args(args)
                .current_dir(copy.path())
                .env("GIT_AUTHOR_NAME", "t")
                .env("GIT_AUTHOR_EMAIL", "t@example.invalid")
                .env("GIT_COMMITTER_NAME", "t")
                .env("GIT_COMMITTER_EMAIL", "t@example.invalid")
                .output()
                .expect("git");
            assert!(s.status.success(), "git {args:?}: {}", text(&s.stderr));
        };
        git(&["init", "-q"]);
        git(&["add", "-A"]);
        git(&["commit", "-q", "-m", "tree"]);
        check_dry_run(copy.path(), version, out.path());
        return;
    }
    assert!(run.status.success(), "{}", text(&run.stderr));
    check_dry_run(&common::manifest_dir(), version, out.path());
}

fn check_dry_run(tree: &Path, version: &str, out: &Path) {
    let run = |args: &[&str]| release(tree, args, out);
    let ok = run(&["--dry-run", version]);
    assert!(ok.status.success(), "{}", text(&ok.stderr));
    assert!(text(&ok.stdout).contains("dry run, no tag made"));
    let sums = std::fs::read_to_string(out.join("SHA256SUMS")).expect("SHA256SUMS");
    let archive = sums
        .split_whitespace()
        .nth(1)
        .expect("a file named in SHA256SUMS")
        .to_owned();
    assert!(
        archive.starts_with(&format!("fleet-limiter-{version}-")) && archive.ends_with(".tar.gz"),
        "{archive}"
    );
    let verify = Command::new("sha256sum")
        .args(["-c", "SHA256SUMS"])
        .current_dir(out)
        .output()
        .expect("sha256sum");
    assert!(verify.status.success(), "{}", text(&verify.stdout));
    let listing = Command::new("tar")
        .args(["-tzf", &archive])
        .current_dir(out)
        .output()
        .expect("tar");
    let listing = text(&listing.stdout);
    let top = archive.trim_end_matches(".tar.gz");
    for f in [
        "fleet-limiter",
        "README.md",
        "CHANGELOG.md",
        "LICENSE-MIT",
        "LICENSE-APACHE",
        "docs/release.md",
        "deploy/systemd/fleet-limiter.service",
    ] {
        assert!(
            listing.lines().any(|l| l == format!("{top}/{f}")),
            "{f} in the archive:\n{listing}"
        );
    }
    // Reproducible: the same inputs give the same bytes.
    let first = std::fs::read(out.join(&archive)).expect("archive");
    assert!(run(&["--dry-run", version]).status.success());
    assert_eq!(first, std::fs::read(out.join(&archive)).expect("archive"));
    // A version Cargo.toml does not name, and no version at all, are refused.
    let wrong = run(&["--dry-run", "9.9.9"]);
    assert!(!wrong.status.success());
    assert!(
        text(&wrong.stderr).contains(&format!("Cargo.toml says version {version}, not 9.9.9")),
        "{}",
        text(&wrong.stderr)
    );
    let none = run(&["--dry-run"]);
    assert!(!none.status.success());
    assert!(text(&none.stderr).contains("usage: scripts/release.sh"));
    let junk = run(&["--dry-run", "1.2"]);
    assert!(text(&junk.stderr).contains("1.2 is not a version"));
}

/// What `cargo package` puts in the crate: the library and binary sources, the middleware
/// example, the licences, README and changelog; never the tests, benchmarks, fuzz targets,
/// snapshots, proptest regressions or deployment files (once half the package).
#[test]
fn the_crate_package_carries_the_sources_and_nothing_of_the_repository_s_tooling() {
    let out = Command::new(env!("CARGO"))
        .args(["package", "--list", "--allow-dirty", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo package --list");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listed = text(&out.stdout);
    let files: Vec<&str> = listed.lines().collect();
    for needed in [
        "src/lib.rs",
        "src/main.rs",
        "src/store/redis/decide.lua",
        "examples/embedded.rs",
        "LICENSE-MIT",
        "LICENSE-APACHE",
        "README.md",
        "CHANGELOG.md",
        "Cargo.lock",
    ] {
        assert!(files.contains(&needed), "{needed} missing from:\n{listed}");
    }
    for f in &files {
        for tooling in [
            "tests/",
            "bench/",
            "benches/",
            "fuzz/",
            "snapshots/",
            "proptest-regressions/",
            "deploy/",
            "clients/",
            ".ci/",
            "docs/",
            "scripts/",
        ] {
            assert!(
                !f.starts_with(tooling),
                "{f} is the repository's, not the crate's"
            );
        }
    }
}
