//! Whether a configuration may be served: the one admission rule, asked at start-up and by
//! every reload, so the listeners ask the configuration and never the offline tools.
//!
//! The rule's body is the calibration check (`config::check`, which judges the configuration
//! against its `[fleet]`); `check`, `simulate` and `replay` use the same judge.

pub(crate) use super::check::{Admitted, Refusal};

use super::Config;

/// A configuration fit to serve, with the findings to log; or the [`Refusal`] naming every
/// unsafe finding. Unsafe findings are let in as `overridden` only when `allow_unsafe`
/// (`--allow-unsafe-calibration`, `FLEET_LIMITER_ALLOW_UNSAFE_CALIBRATION=true`); at-risk
/// findings are warnings; with limiting switched off everything is admitted.
pub(crate) fn admit(cfg: &Config, allow_unsafe: bool) -> Result<Admitted, Refusal> {
    super::check::admit(cfg, allow_unsafe)
}
