//! Start-up and reload admission: the one rule `serve` and every reload apply to a calibration.

use super::check;
use crate::config::Config;

/// A calibration [`admit`] lets in, with what the operator should hear about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Admitted {
    /// `limiter: reason` for every warning (thin headroom, a key that discloses itself …):
    /// something in the operator's limiters to fix, said at WARN.
    pub warnings: Vec<String>,
    /// `limiter: reason` for every at-risk finding (dashboards keyed on the IP for want of
    /// `[identity]`, as the built-in calibration is): a calibration finding, which `check`
    /// reports in full and a start names in one INFO line.
    pub risks: Vec<String>,
    /// `limiter: reason` for every unsafe finding let in because the operator allowed it.
    pub overridden: Vec<String>,
}

/// A calibration [`admit`] keeps out: it could lock healthy agents out of the declared fleet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// `limiter: reason` for every unsafe finding.
    pub problems: Vec<String>,
    /// `limiter: reason` for every at-risk finding and every warning.
    pub warnings: Vec<String>,
}

impl std::fmt::Display for Refusal {
    /// One line, as a rejected reload reports it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the calibration is unsafe for the declared fleet: {}; run `fleet-limiter check`, or pass --allow-unsafe-calibration",
            self.problems.join("; ")
        )
    }
}

impl std::error::Error for Refusal {}

impl Admitted {
    /// The one INFO line a start says about at-risk findings, or `None` without any: each
    /// limiter with the first clause of its finding, and where the detail is.
    pub(crate) fn risk_summary(&self) -> Option<String> {
        if self.risks.is_empty() {
            return None;
        }
        let named: Vec<&str> = self
            .risks
            .iter()
            .map(|r| r.split(", ").next().unwrap_or(r))
            .collect();
        Some(format!(
            "calibration: at risk (not unsafe): {}; run `fleet-limiter check` for the detail and the fix",
            named.join("; ")
        ))
    }
}

/// The one admission rule, for start-up and every reload: a calibration with an unsafe finding
/// is refused unless `allow_unsafe` (`--allow-unsafe-calibration`,
/// `FLEET_LIMITER_ALLOW_UNSAFE_CALIBRATION=true`). At-risk findings are let in as warnings:
/// the built-in configuration, with no `[identity]`, keys dashboards on the IP and must still
/// start. With limiting switched off nothing is enforced, so nothing can lock a client out and
/// everything is admitted. Returns the findings; the caller says them.
pub(crate) fn admit(cfg: &Config, allow_unsafe: bool) -> Result<Admitted, Refusal> {
    if !cfg.enabled {
        return Ok(Admitted {
            warnings: Vec::new(),
            risks: Vec::new(),
            overridden: Vec::new(),
        });
    }
    let report = check(cfg);
    let risks = report.risk_lines();
    let warnings = report.warning_lines();
    let problems = report.problems();
    if problems.is_empty() || allow_unsafe {
        return Ok(Admitted {
            warnings,
            risks,
            overridden: problems,
        });
    }
    Err(Refusal {
        problems,
        warnings: risks.into_iter().chain(warnings).collect(),
    })
}
