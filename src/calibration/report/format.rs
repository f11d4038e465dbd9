//! What every report shares: the [`Format`] it is printed in, JSON, the calibration's source
//! and a padded cell.

use std::path::PathBuf;

/// How a report is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Json,
}

pub(super) fn source(p: &Option<PathBuf>) -> String {
    match p {
        Some(p) => p.display().to_string(),
        None => "built-in calibration".to_owned(),
    }
}

/// JSON, pretty-printed, with a trailing newline.
pub fn json<T: serde::Serialize>(report: &T) -> String {
    match serde_json::to_string_pretty(report) {
        Ok(s) => s + "\n",
        Err(e) => format!("{{\"error\": \"{e}\"}}\n"),
    }
}

pub(super) fn pad(s: &str, w: usize) -> String {
    format!("{s:<w$}")
}
