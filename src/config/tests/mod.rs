//! Configuration layers and the errors a bad configuration produces. Every error names where
//! the value came from (file, variable or flag), the field, and what is allowed; the messages
//! are kept as snapshots under `snapshots/`. This file holds the helpers; each topic has a file.

mod document;
mod layers;
mod limit_headers;
mod limiters;
mod server;
mod store;

use super::*;
use std::io::Write;

/// A config file with a stable name inside a temporary directory.
struct File {
    dir: tempfile::TempDir,
    path: PathBuf,
}

fn file(toml: &str) -> File {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("fleet-limiter.toml");
    let mut f = std::fs::File::create(&path).expect("create");
    f.write_all(toml.as_bytes()).expect("write");
    File { dir, path }
}

/// The error loading this file (with these variables), its directory shown as `<dir>`.
fn file_error(toml: &str, env: &[(&str, &str)]) -> String {
    let f = file(toml);
    let vars = env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned()));
    let err = Loader::new()
        .file(&f.path)
        .env(vars)
        .load()
        .expect_err("this configuration must be refused");
    err.to_string()
        .replace(&f.dir.path().display().to_string(), "<dir>")
}

fn env_error(env: &[(&str, &str)]) -> String {
    let vars = env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned()));
    Loader::new()
        .env(vars)
        .load()
        .expect_err("this configuration must be refused")
        .to_string()
}

fn limiter<'a>(cfg: &'a Config, name: &str) -> &'a LimiterSpec {
    cfg.limiters
        .iter()
        .find(|l| &*l.name == name)
        .expect("limiter")
}
