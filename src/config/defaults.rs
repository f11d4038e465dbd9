//! The calibration fleet-limiter ships with, as data. `docs/calibration.md` explains each row.

use crate::keys::KeyKind;
use crate::policy::{CredentialMatch, Meter};

/// One built-in limiter: name, budget, window, key, routes, exceptions, group, credential.
/// The key and the credential are the types configuration parses into, so a typo here does
/// not compile.
pub(crate) struct BuiltIn {
    pub name: &'static str,
    pub limit: u32,
    pub window: &'static str,
    pub key: KeyKind,
    pub routes: &'static [&'static str],
    pub except: &'static [&'static str],
    pub group: Option<&'static str>,
    pub credential: CredentialMatch,
    /// What it meters: every request, or (the `agent-ip` ceiling) only unknown agent ids.
    pub meter: Meter,
}

/// The agent-fleet calibration. Within the `agent` group the most specific route wins, so the
/// four lifecycle endpoints are metered by their own limiter and not by `agent-device`.
pub(crate) const LIMITERS: &[BuiltIn] = &[
    BuiltIn {
        name: "agent-device",
        limit: 30,
        window: "1m",
        key: KeyKind::IpAgent,
        routes: &["/api/agent/**"],
        except: &[],
        group: Some("agent"),
        meter: Meter::Requests,
        credential: CredentialMatch::Any,
    },
    // The ceiling over agent ids: it meters new agent ids per IP (known agents skip it), and
    // `ceiling.rs` derives its budget and routes from agent-device and the fleet settings
    // (max_site_endpoints: 250 new ids per minute, 500 known per IP).
    BuiltIn {
        name: "agent-ip",
        limit: 250,
        window: "1m",
        key: KeyKind::Ip,
        routes: &["/api/agent/**"],
        except: &[
            "POST /api/agent/enroll",
            "GET /api/agent/download/**",
            "POST /api/agent/rotate-key",
        ],
        group: Some("agent-ip"),
        meter: Meter::NewAgents,
        credential: CredentialMatch::Any,
    },
    BuiltIn {
        name: "enrollment",
        limit: 300,
        window: "15m",
        key: KeyKind::Ip,
        routes: &["POST /api/agent/enroll"],
        except: &[],
        group: Some("agent"),
        meter: Meter::Requests,
        credential: CredentialMatch::Any,
    },
    BuiltIn {
        name: "download",
        limit: 300,
        window: "15m",
        key: KeyKind::Ip,
        routes: &["GET /api/agent/download/**"],
        except: &[],
        group: Some("agent"),
        meter: Meter::Requests,
        credential: CredentialMatch::Any,
    },
    BuiltIn {
        name: "key-rotation",
        limit: 3,
        window: "15m",
        key: KeyKind::Ip,
        routes: &["POST /api/agent/rotate-key"],
        except: &[],
        group: Some("agent"),
        meter: Meter::Requests,
        credential: CredentialMatch::Any,
    },
    BuiltIn {
        name: "ui",
        limit: 1000,
        window: "15m",
        key: KeyKind::UserOrIp,
        routes: &["/api/**"],
        except: &["/api/agent/**", "/api/cron/**", "/api/cli/auth/**"],
        group: None,
        meter: Meter::Requests,
        credential: CredentialMatch::Any,
    },
    BuiltIn {
        name: "cli-bearer",
        limit: 60,
        window: "1m",
        key: KeyKind::Ip,
        routes: &["/api/**"],
        except: &["/api/agent/**", "/api/cron/**"],
        group: None,
        meter: Meter::Requests,
        credential: CredentialMatch::CliToken,
    },
    BuiltIn {
        name: "api-key",
        limit: 60,
        window: "1m",
        key: KeyKind::Ip,
        routes: &["/api/**"],
        except: &["/api/agent/**", "/api/cron/**"],
        group: None,
        meter: Meter::Requests,
        credential: CredentialMatch::ApiKey,
    },
    BuiltIn {
        name: "cli-device-code",
        limit: 10,
        window: "1m",
        key: KeyKind::Ip,
        routes: &["POST /api/cli/auth/device/code"],
        except: &[],
        group: None,
        meter: Meter::Requests,
        credential: CredentialMatch::Any,
    },
    BuiltIn {
        name: "cli-device-poll",
        limit: 60,
        window: "1m",
        key: KeyKind::Ip,
        routes: &["POST /api/cli/auth/device/token"],
        except: &[],
        group: None,
        meter: Meter::Requests,
        credential: CredentialMatch::Any,
    },
    BuiltIn {
        name: "cli-refresh",
        limit: 10,
        window: "1m",
        key: KeyKind::Ip,
        routes: &["POST /api/cli/auth/refresh"],
        except: &[],
        group: None,
        meter: Meter::Requests,
        credential: CredentialMatch::Any,
    },
];

pub(crate) const LISTEN: &str = "127.0.0.1:8080";
pub(crate) const CONNECT_TIMEOUT: &str = "2s";
pub(crate) const READ_TIMEOUT: &str = "30s";
/// The read timeout's counterpart on the client's side (docs/configuration.md says why).
pub(crate) const BODY_TIMEOUT: &str = "30s";
/// Kestrel's minimum request body data rate, in bytes per second.
pub(crate) const BODY_MIN_RATE: &str = "240";
pub(crate) const IPV6_PREFIX: u8 = 56;
pub(crate) const MAX_KEYS: usize = 100_000;
/// `fleet.max_agents`: the enrolled agents one instance must remember at once. Half of
/// `MAX_KEYS` keeps them known (`known_agents::split`), with room to spare.
pub(crate) const MAX_AGENTS: u64 = 10_000;
pub(crate) const STORE_TIMEOUT: &str = "50ms";
pub(crate) const STORE_CALLS_IN_FLIGHT: usize = 1;
