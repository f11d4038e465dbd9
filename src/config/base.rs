//! `calibration`: the limiters a configuration starts from. `"agent-fleet"` (the default) is
//! the built-in calibration (`defaults.rs`), which `[limiters.<name>]` tables overlay;
//! `"none"` starts from no limiter at all, so the file is the whole truth and a table named
//! like a built-in defines a new limiter from scratch.

use super::layers::edit_distance;
use super::{defaults, ConfigError, Ctx};

/// Which limiters the `[limiters]` tables start from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Calibration {
    /// The built-in limiters, each overlaid with its table if the file gives one.
    #[default]
    AgentFleet,
    /// No built-in limiter: only the limiters the tables define.
    None,
}

/// The names `calibration` takes, in the order errors list them.
pub(crate) const NAMES: &[&str] = &["agent-fleet", "none"];

impl Calibration {
    /// The built-in limiters this calibration starts from.
    pub(crate) fn builtins(self) -> &'static [defaults::BuiltIn] {
        match self {
            Calibration::AgentFleet => defaults::LIMITERS,
            Calibration::None => &[],
        }
    }
}

/// `calibration` read from the merged document: one of [`NAMES`], as written (a value a letter
/// or two away is named in the error; nothing is guessed).
pub(super) fn build_calibration(
    raw: Option<String>,
    ctx: &Ctx,
) -> Result<Calibration, ConfigError> {
    let Some(given) = raw else {
        return Ok(Calibration::AgentFleet);
    };
    match given.as_str() {
        "agent-fleet" => Ok(Calibration::AgentFleet),
        "none" => Ok(Calibration::None),
        other => {
            let lower = other.trim().to_ascii_lowercase();
            let near = NAMES
                .iter()
                .map(|n| (edit_distance(&lower, n), *n))
                .min_by_key(|(d, _)| *d)
                .filter(|(d, n)| *d <= 3 && *d * 3 <= n.len());
            let hint = match near {
                Some((_, n)) => format!("did you mean \"{n}\"? "),
                None => String::new(),
            };
            let shown: String = other.chars().take(64).collect();
            Err(ctx.err(
                "calibration",
                format!(
                    "`{shown}` is not a calibration; {hint}use \"agent-fleet\" (the built-in limiters, which [limiters.<name>] tables adjust) or \"none\" (no built-in limiter: only the limiters this file defines)"
                ),
            ))
        }
    }
}
