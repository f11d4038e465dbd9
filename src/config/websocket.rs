//! `[websocket]`: bounds on upgraded (WebSocket) connections. A cap on how many are open at once
//! (`max_open`), on how many one client address holds (`max_per_client`), and how long one may
//! stay silent both ways before both sides are closed (`idle_timeout`).
//!
//! Each open WebSocket holds two file descriptors (the client's connection and the upstream's)
//! for as long as it lasts, so the cap's default is derived from the process's descriptor limit
//! when the gateway starts ([`WebsocketConfig::caps`]), not here.

use super::{duration, ConfigError, Ctx, DurationValue};
use serde::Deserialize;
use std::time::Duration;

/// How long an upgraded connection may carry no byte either way when `idle_timeout` is not set.
pub(crate) const IDLE_TIMEOUT: &str = "5m";
/// The most a count setting may ask for.
const MAX_COUNT: i64 = 1_000_000;
/// The derived `max_open` is at most this many (each one also holds buffers: see
/// docs/operations.md#websockets).
pub(crate) const DERIVED_MAX_OPEN: usize = 8192;
/// The derived `max_open` is the descriptor limit divided by this: upgraded connections, two
/// descriptors each, may take a quarter of the descriptors, and ordinary traffic (also a client
/// and an upstream connection per request), listeners, the store and logs keep the rest.
pub(crate) const DESCRIPTORS_PER_UPGRADE: u64 = 8;
/// The derived `max_per_client` is `max_open` divided by this (at least 1).
pub(crate) const CLIENTS_SHARING: usize = 8;

/// `[websocket]`, validated. `None` for a cap means "derived at start".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebsocketConfig {
    /// The most upgraded connections open at once, in all.
    pub max_open: Option<usize>,
    /// The most upgraded connections one client address holds at once.
    pub max_per_client: Option<usize>,
    /// No byte either way for this long closes both sides.
    pub idle_timeout: Duration,
}

/// The caps in force, and how they were chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    pub max_open: usize,
    pub max_per_client: usize,
    /// `max_open` came from the descriptor limit (not set by the operator).
    pub max_open_derived: bool,
    /// `max_per_client` came from `max_open` (not set by the operator).
    pub max_per_client_derived: bool,
}

impl WebsocketConfig {
    /// The caps for a process allowed `descriptors` open file descriptors (`None`: unknown,
    /// taken as the common soft limit of 1024). A `max_per_client` above `max_open` is lowered
    /// to it.
    pub fn caps(&self, descriptors: Option<u64>) -> Caps {
        let descriptors = descriptors.unwrap_or(1024);
        let derived = usize::try_from(descriptors / DESCRIPTORS_PER_UPGRADE)
            .unwrap_or(usize::MAX)
            .clamp(1, DERIVED_MAX_OPEN);
        let max_open = self.max_open.unwrap_or(derived);
        let per_client = self
            .max_per_client
            .unwrap_or((max_open / CLIENTS_SHARING).max(1));
        Caps {
            max_open,
            max_per_client: per_client.min(max_open),
            max_open_derived: self.max_open.is_none(),
            max_per_client_derived: self.max_per_client.is_none(),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWebsocket {
    max_open: Option<i64>,
    max_per_client: Option<i64>,
    idle_timeout: Option<DurationValue>,
}

fn count(ctx: &Ctx, path: &str, v: Option<i64>) -> Result<Option<usize>, ConfigError> {
    match v {
        None => Ok(None),
        Some(n) if (1..=MAX_COUNT).contains(&n) => Ok(Some(n as usize)),
        Some(n) => Err(ctx.err(
            path,
            format!("{n} is out of range; use a number of connections from 1 to {MAX_COUNT}, or leave it unset to derive it from the descriptor limit at start"),
        )),
    }
}

pub(super) fn build_websocket(
    raw: RawWebsocket,
    ctx: &Ctx,
) -> Result<WebsocketConfig, ConfigError> {
    let max_open = count(ctx, "websocket.max_open", raw.max_open)?;
    let max_per_client = count(ctx, "websocket.max_per_client", raw.max_per_client)?;
    if let (Some(all), Some(one)) = (max_open, max_per_client) {
        if one > all {
            return Err(ctx.err(
                "websocket.max_per_client",
                format!(
                    "{one} is more than websocket.max_open = {all} ({}); one client may hold at most every upgraded connection, and at that one client can keep every other one out: lower websocket.max_per_client (FLEET_LIMITER_WEBSOCKET_MAX_PER_CLIENT, --websocket-max-per-client) well below websocket.max_open",
                    ctx.origin("websocket.max_open")
                ),
            ));
        }
    }
    let idle_timeout = duration(
        ctx,
        "websocket.idle_timeout",
        raw.idle_timeout,
        IDLE_TIMEOUT,
    )?;
    Ok(WebsocketConfig {
        max_open,
        max_per_client,
        idle_timeout,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Loader;

    fn load(toml: &str) -> Result<crate::config::Config, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let path = dir.path().join("c.toml");
        std::fs::write(&path, toml).map_err(|e| e.to_string())?;
        Loader::new()
            .file(&path)
            .load()
            .map_err(|e| e.to_string().replace(&*path.to_string_lossy(), "c.toml"))
    }

    #[test]
    fn defaults_are_derived_from_the_descriptor_limit() {
        let w = Loader::new().load().expect("defaults").websocket;
        assert_eq!(
            w,
            WebsocketConfig {
                max_open: None,
                max_per_client: None,
                idle_timeout: Duration::from_secs(300),
            }
        );
        let caps = |n| {
            let c = w.caps(n);
            (c.max_open, c.max_per_client)
        };
        // A quarter of the descriptors in pairs; an eighth of that per client.
        assert_eq!(caps(Some(1024)), (128, 16));
        assert_eq!(caps(None), (128, 16), "unknown: the common soft limit");
        assert_eq!(caps(Some(256)), (32, 4));
        assert_eq!(caps(Some(20)), (2, 1));
        assert_eq!(caps(Some(0)), (1, 1), "never zero");
        assert_eq!(caps(Some(1 << 20)), (8192, 1024), "bounded for memory");
        assert_eq!(caps(Some(u64::MAX)), (8192, 1024));
        assert!(w.caps(Some(1024)).max_open_derived && w.caps(None).max_per_client_derived);
    }

    #[test]
    fn set_caps_are_kept_and_a_derived_max_open_lowers_a_larger_share() {
        let w = load("[websocket]\nmax_open = 100\nmax_per_client = 10\nidle_timeout = \"90s\"\n")
            .expect("valid")
            .websocket;
        let c = w.caps(Some(64));
        assert_eq!((c.max_open, c.max_per_client), (100, 10));
        assert!(!c.max_open_derived && !c.max_per_client_derived);
        assert_eq!(w.idle_timeout, Duration::from_secs(90));
        let w = load("[websocket]\nmax_per_client = 500\n")
            .expect("valid")
            .websocket;
        let c = w.caps(Some(1024));
        assert_eq!((c.max_open, c.max_per_client), (128, 128));
        let w = load("[websocket]\nmax_open = 40\n")
            .expect("valid")
            .websocket;
        assert_eq!(w.caps(Some(1 << 20)).max_per_client, 5);
    }

    #[test]
    fn env_and_flag_layers() {
        let w = Loader::new()
            .env([
                (
                    "FLEET_LIMITER_WEBSOCKET_MAX_OPEN".to_owned(),
                    "64".to_owned(),
                ),
                (
                    "FLEET_LIMITER_WEBSOCKET_IDLE_TIMEOUT".to_owned(),
                    "1m".to_owned(),
                ),
            ])
            .flag(
                "websocket.max_per_client",
                "4",
                "--websocket-max-per-client",
            )
            .load()
            .expect("valid")
            .websocket;
        assert_eq!(
            (w.max_open, w.max_per_client, w.idle_timeout),
            (Some(64), Some(4), Duration::from_secs(60))
        );
    }

    #[test]
    fn errors_name_origin_field_and_fix() {
        let cases = [
            (
                "[websocket]\nmax_open = 0\n",
                "c.toml: websocket.max_open: 0 is out of range; use a number of connections from 1 to 1000000",
            ),
            (
                "[websocket]\nmax_per_client = -3\n",
                "c.toml: websocket.max_per_client: -3 is out of range",
            ),
            (
                "[websocket]\nmax_open = 2000000\n",
                "c.toml: websocket.max_open: 2000000 is out of range",
            ),
            (
                "[websocket]\nmax_open = 10\nmax_per_client = 11\n",
                "c.toml: websocket.max_per_client: 11 is more than websocket.max_open = 10 (c.toml); one client may hold at most every upgraded connection",
            ),
            (
                "[websocket]\nidle_timeout = \"0s\"\n",
                "c.toml: websocket.idle_timeout: must be longer than zero",
            ),
            (
                "[websocket]\nidle_timeout = \"soon\"\n",
                "c.toml: websocket.idle_timeout:",
            ),
            (
                "[websocket]\nmax_open = \"many\"\n",
                "c.toml: websocket.max_open: got string \"many\"; expected a whole number",
            ),
            ("[websocket]\nmax_opn = 3\n", "c.toml: websocket.max_opn"),
        ];
        for (toml, want) in cases {
            let e = load(toml).expect_err(toml);
            assert!(e.starts_with(want), "{toml}\n{e}");
        }
    }
}
