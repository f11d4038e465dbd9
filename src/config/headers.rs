//! `[headers]`: which limit headers a metered answer carries, as express-rate-limit's users know
//! them: one of the IETF drafts' forms (`standard`), the `X-RateLimit-*` headers beside or
//! instead of it (`legacy`), and whether their reset is a Unix time or a number of seconds
//! (`legacy_reset`). What each one sends: `src/http/response.rs` and docs/configuration.md.

use super::{ConfigError, Ctx};
use serde::Deserialize;

/// Which draft of draft-ietf-httpapi-ratelimit-headers the `RateLimit*` headers follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Standard {
    /// `RateLimit-Policy` and `RateLimit` as lists of named items:
    /// `"agent-device";q=30;w=60` and `"agent-device";r=29;t=2;pk=:…:`, `t` the seconds until
    /// additional quota is made available.
    Draft10,
    /// The same fields and syntax as draft 10, `t` the seconds until the quota resets (is whole).
    Draft8,
    /// `RateLimit-Policy: 30;w=60` and one `RateLimit: limit=30, remaining=29, reset=60`.
    Draft7,
    /// `RateLimit-Policy: 30;w=60` and three fields, `RateLimit-Limit`, `RateLimit-Remaining`
    /// and `RateLimit-Reset`.
    #[default]
    Draft6,
    /// No `RateLimit*` header.
    Off,
}

impl Standard {
    pub const ALL: [Standard; 5] = [
        Standard::Draft10,
        Standard::Draft8,
        Standard::Draft7,
        Standard::Draft6,
        Standard::Off,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Standard::Draft10 => "draft-10",
            Standard::Draft8 => "draft-8",
            Standard::Draft7 => "draft-7",
            Standard::Draft6 => "draft-6",
            Standard::Off => "off",
        }
    }
}

/// What `X-RateLimit-Reset` counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LegacyReset {
    /// The Unix time (whole seconds, rounded up) when the reset comes, as express-rate-limit's
    /// legacy headers and GitHub's API send it.
    #[default]
    Unix,
    /// The seconds until the reset comes, rounded up.
    Delta,
}

impl LegacyReset {
    pub const ALL: [LegacyReset; 2] = [LegacyReset::Unix, LegacyReset::Delta];

    pub fn as_str(self) -> &'static str {
        match self {
            LegacyReset::Unix => "unix",
            LegacyReset::Delta => "delta",
        }
    }
}

/// The limit headers a metered answer carries. The default is the form both common client
/// libraries read correctly (docs/configuration.md#headers says why): draft 6, with the
/// `X-RateLimit-*` headers beside it, their reset a Unix time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderProfile {
    pub standard: Standard,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset` too.
    pub legacy: bool,
    pub legacy_reset: LegacyReset,
}

impl Default for HeaderProfile {
    fn default() -> Self {
        Self {
            standard: Standard::Draft6,
            legacy: true,
            legacy_reset: LegacyReset::Unix,
        }
    }
}

impl HeaderProfile {
    /// Whether the headers need the wall clock: only a Unix-time `X-RateLimit-Reset` does.
    pub fn reads_wall_clock(&self) -> bool {
        self.legacy && self.legacy_reset == LegacyReset::Unix
    }

    /// Whether any limit header is sent at all (`Retry-After` on a refusal always is).
    pub fn sends_any(&self) -> bool {
        self.legacy || self.standard != Standard::Off
    }

    /// `draft-6+legacy(unix)`, `draft-10`, `off+legacy(delta)`, `off`: how logs and benchmarks
    /// name a profile.
    pub fn describe(&self) -> String {
        if self.legacy {
            format!(
                "{}+legacy({})",
                self.standard.as_str(),
                self.legacy_reset.as_str()
            )
        } else {
            self.standard.as_str().to_owned()
        }
    }
}

/// `standard` as written: a string, or a boolean (express-rate-limit's older spelling), refused
/// naming the string to write instead. Any other type is a type error naming the choices.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum StandardValue {
    Text(String),
    Flag(bool),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHeaders {
    standard: Option<StandardValue>,
    legacy: Option<bool>,
    legacy_reset: Option<String>,
}

/// The most of an unknown value an error message repeats.
const SHOWN: usize = 40;

fn shown(v: &str) -> String {
    let s: String = v.chars().take(SHOWN).collect();
    let s = s.escape_debug().to_string();
    if v.chars().count() > SHOWN {
        format!("{s}…")
    } else {
        s
    }
}

pub(super) fn build_headers(raw: RawHeaders, ctx: &Ctx) -> Result<HeaderProfile, ConfigError> {
    let defaults = HeaderProfile::default();
    let standard = match raw.standard {
        None => defaults.standard,
        Some(StandardValue::Flag(b)) => return Err(standard_error(ctx, &b.to_string())),
        Some(StandardValue::Text(s)) => {
            let t = s.trim();
            Standard::ALL
                .into_iter()
                .find(|k| k.as_str() == t)
                .ok_or_else(|| standard_error(ctx, &s))?
        }
    };
    let legacy_reset = match raw.legacy_reset {
        None => defaults.legacy_reset,
        Some(s) => {
            let t = s.trim();
            LegacyReset::ALL
                .into_iter()
                .find(|k| k.as_str() == t)
                .ok_or_else(|| {
                    ctx.err(
                        "headers.legacy_reset",
                        format!(
                            "`{}` is not a reset form; use \"unix\" (the default: the Unix time of the reset, as express-rate-limit and GitHub send it) or \"delta\" (the seconds until it)",
                            shown(&s)
                        ),
                    )
                })?
        }
    };
    Ok(HeaderProfile {
        standard,
        legacy: raw.legacy.unwrap_or(defaults.legacy),
        legacy_reset,
    })
}

fn standard_error(ctx: &Ctx, value: &str) -> ConfigError {
    let hint = match value.trim() {
        "true" => " (express-rate-limit's `true` means \"draft-6\"; write that)",
        "false" => " (express-rate-limit's `false` means \"off\"; write that)",
        _ => "",
    };
    ctx.err(
        "headers.standard",
        format!(
            "`{}` is not a header standard{hint}; use \"draft-6\" (the default), \"draft-7\", \"draft-8\", \"draft-10\" or \"off\"",
            shown(value)
        ),
    )
}
